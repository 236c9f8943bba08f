"""Backend selection: the compiled ``ops._C`` kernels or the pure-torch reference.

As in PyG's ``typing.py``, whether the extension loaded is probed once at import
time and exposed as a flag; every public op also takes ``backend=``.  Resolution
order: the call's ``backend=`` argument, then the module default set with
:func:`set_backend`, then automatic (``"cpp"`` when the extension has a kernel
for the tensor's device, else ``"reference"``).
"""
from __future__ import annotations

import warnings

import torch

from kgreason.errors import UserError

__all__ = ["extension_available", "set_backend", "get_backend", "has_kernel", "resolve_backend", "BACKENDS"]

BACKENDS = ("cpp", "reference")

try:  # importing the shared library registers torch.ops.kgreason.*
    from . import _C  # noqa: F401

    _EXTENSION_AVAILABLE = True
    _EXTENSION_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - depends on the build
    _EXTENSION_AVAILABLE = False
    _EXTENSION_ERROR = str(exc)
    warnings.warn(f"kgreason: compiled kernels unavailable ({exc}); using the pure-torch reference", stacklevel=2)

if _EXTENSION_AVAILABLE:  # fake (meta) kernels for tracing; the ops must be registered first
    from . import _fake  # noqa: F401

_default_backend: str | None = None  # None = automatic


def extension_available() -> bool:
    """True when the compiled extension ``ops._C`` was loaded."""
    return _EXTENSION_AVAILABLE


def has_kernel(op: str, device: torch.device | str) -> bool:
    """True when ``torch.ops.kgreason.<op>`` has a kernel for ``device``'s type (``cpu``/``cuda``)."""
    if not _EXTENSION_AVAILABLE:
        return False
    dev = device.type if isinstance(device, torch.device) else torch.device(device).type
    found = _HAS_KERNEL.get((op, dev))
    if found is None:
        key = "CUDA" if dev == "cuda" else "CPU"
        try:
            found = bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"kgreason::{op}", key))
        except RuntimeError:  # op not registered at all
            found = False
        _HAS_KERNEL[(op, dev)] = found
    return found


# Answers of has_kernel per (op, device type): the extension registers every kernel when it loads, so they
# do not change; the dispatcher query costs several microseconds, a third of a one-hot B = 1 projection.
_HAS_KERNEL: dict[tuple[str, str], bool] = {}


def set_backend(name: str | None) -> None:
    """Set the default backend: ``"cpp"``, ``"reference"`` or ``None``/``"auto"`` (automatic)."""
    global _default_backend
    if name in (None, "auto"):
        _default_backend = None
        return
    if name not in BACKENDS:
        raise UserError(f"backend: expected one of {BACKENDS + ('auto',)}, got {name!r}")
    if name == "cpp" and not _EXTENSION_AVAILABLE:
        raise UserError(f"backend: 'cpp' requested but the extension ops._C failed to load ({_EXTENSION_ERROR})")
    _default_backend = name


def get_backend() -> str | None:
    """The module default backend (``None`` = automatic)."""
    return _default_backend


def resolve_backend(backend: str | None, op: str, device: torch.device | str) -> str:
    """The backend a call runs on (``"cpp"`` or ``"reference"``); see the module docstring."""
    name = backend if backend is not None else _default_backend
    if name in (None, "auto"):
        return "cpp" if has_kernel(op, device) else "reference"
    if name not in BACKENDS:
        raise UserError(f"backend: expected one of {BACKENDS + ('auto', None)}, got {name!r}")
    if name == "cpp" and not has_kernel(op, device):
        why = _EXTENSION_ERROR if not _EXTENSION_AVAILABLE else f"no {torch.device(device).type} kernel was built"
        raise UserError(f"backend: 'cpp' requested for kgreason::{op} on {device}, but {why}")
    return name
