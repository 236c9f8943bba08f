"""What the machine has to spare, for the up-front size checks of builds and generators (stdlib only)."""
from __future__ import annotations

__all__ = ["available_memory_bytes"]


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is no such file, e.g. not Linux).

    MemAvailable, not MemFree: it counts the page cache the kernel can drop, which is what a new
    allocation can really get before swapping or the OOM killer.
    """
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
