"""Shared fixtures for the pytest-benchmark suites in this folder.

Run with ``python -m pytest benchmarks/<file>.py`` (the normal test run only
collects ``tests/``).  The FB15k-237 artifact is looked up at
``$KGREASON_FB15K237_ARTIFACT`` or ``artifacts/FB15k-237`` (built by
``python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237``);
suites fall back to synthetic data of the same size when it is absent.

Report writers (the ``test_write_*`` function of a file, writing ``results/<name>.md``) take
the ``measurements`` fixture: the timed tests of the file put their numbers into it, in any
order, and the writer calls :meth:`Measurements.require` before writing.  A writer whose table
would have a hole (a test deselected with ``-k``, failed or skipped without saying why) fails,
naming every missing cell, and leaves the committed table alone.  Writers run after every
other test of their file whatever the collection order (``pytest_collection_modifyitems``).
"""
from __future__ import annotations

import math
import os
import platform
from pathlib import Path
from typing import Iterable

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
FB15K237_BETAE = SHARED_DATA / "betae" / "FB15k-237-betae"
RESULTS = Path(__file__).resolve().parent / "results"


def fb15k237_artifact_path() -> Path | None:
    """Folder of a built FB15k-237 artifact, or None when there is none."""
    p = Path(os.environ.get("KGREASON_FB15K237_ARTIFACT", ROOT / "artifacts" / "FB15k-237"))
    return p if (p / "meta.json").is_file() else None


def machine_description() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), {gpu}"


@pytest.fixture(scope="session")
def fb15k237_artifact():
    """The FB15k-237 Artifact, or None (suites then use synthetic data)."""
    path = fb15k237_artifact_path()
    if path is None:
        return None
    from kge import Artifact

    return Artifact.load(path, verify=False)


# ------------------------------------------------------------------ report writers that check their tables
WRITER_PREFIX = "test_write_"


class Measurements:
    """One benchmark file's numbers by ``(row, column)`` (e.g. ``("2p", "b1024")``), and free-form ``info``.

    Timed tests :meth:`put` their values; a test that cannot measure on this machine or data
    (no bf16 GEMM, no kernel, no query of a structure) calls :meth:`not_applicable` before skipping,
    so the writer prints a dash there instead of reporting a hole.
    """

    def __init__(self, file: str) -> None:
        self.file = file
        self.values: dict[tuple[str, str], float] = {}
        self.absent: dict[tuple[str, str], str] = {}
        self.info: dict[str, object] = {}

    def put(self, row: str, column: str, value: float) -> None:
        self.values[(row, column)] = float(value)

    def not_applicable(self, row: str, column: str, reason: str) -> None:
        self.absent[(row, column)] = reason

    def get(self, row: str, column: str) -> float | None:
        """The value, or None for a cell marked not applicable."""
        return self.values.get((row, column))

    def __contains__(self, cell: tuple[str, str]) -> bool:
        return cell in self.values

    def require(self, *blocks: tuple[Iterable[str], Iterable[str]], info: Iterable[str] = (),
                may_be_zero: Iterable[str] = ()) -> None:
        """Fail (pytest.fail, no traceback) unless, for every ``(rows, columns)`` block, each cell holds a finite
        number > 0 (>= 0 in the columns ``may_be_zero``) or was marked not applicable, and every ``info`` key is
        set.  The message names every missing or bad cell of every block."""
        zero_ok = set(may_be_zero)
        missing: list[str] = []
        bad: list[str] = []
        for rows_, columns_ in blocks:
            rows, columns = list(rows_), list(columns_)
            lost = {c: [r for r in rows if (r, c) not in self.values and (r, c) not in self.absent] for c in columns}
            if not any(lost.values()):
                pass
            elif all(len(lost[c]) == len(rows) for c in columns):
                missing.append(f"rows {', '.join(rows)} x columns {', '.join(columns)}: none")
            elif len(rows) == 1:
                missing.append(f"{rows[0]}: " + ", ".join(c for c in columns if lost[c]))
            else:
                missing += [f"{c}: " + ", ".join(lost[c]) for c in columns if lost[c]]
            for c in columns:
                for r in rows:
                    v = self.values.get((r, c))
                    if v is not None and (not math.isfinite(v) or v < 0 or (v == 0 and c not in zero_ok)):
                        bad.append(f"{r}/{c} = {v!r}")
        lost_info = [k for k in info if k not in self.info]
        if not (missing or bad or lost_info):
            return
        parts = []
        if missing:
            parts.append("missing measurements (their tests did not run, or failed, in this session): "
                         + "; ".join(missing))
        if bad:
            parts.append("not finite and positive: " + ", ".join(bad))
        if lost_info:
            parts.append("missing run details: " + ", ".join(lost_info))
        pytest.fail(f"{self.file}: the report was not written; " + "; ".join(parts)
                    + f". Run the whole file: python -m pytest {self.file}", pytrace=False)


@pytest.fixture(scope="session")
def _measurements_by_file() -> dict[str, Measurements]:
    return {}


def measurements_for(by_file: dict[str, Measurements], path: str | os.PathLike) -> Measurements:
    """The :class:`Measurements` of the benchmark file at ``path`` (for module-scoped fixtures, with
    ``_measurements_by_file``; tests take the ``measurements`` fixture)."""
    p = Path(path).resolve()
    name = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
    return by_file.setdefault(name, Measurements(name))


@pytest.fixture
def measurements(request, _measurements_by_file) -> Measurements:
    """The :class:`Measurements` of the requesting test's file (one per file per session)."""
    return measurements_for(_measurements_by_file, request.node.path)


def pytest_collection_modifyitems(config, items):
    """Each benchmark file's ``test_write_*`` items move after that file's last other item (stable otherwise)."""
    here = Path(__file__).resolve().parent

    def is_writer(item) -> bool:
        return Path(str(item.path)).resolve().parent == here and item.name.startswith(WRITER_PREFIX)

    last: dict[str, int] = {}
    for i, item in enumerate(items):
        if not is_writer(item):
            last[str(item.path)] = i
    writers: dict[str, list] = {}
    ordered = []
    for i, item in enumerate(items):
        key = str(item.path)
        if is_writer(item) and key in last and i < last[key]:
            writers.setdefault(key, []).append(item)
            continue
        ordered.append(item)
        if last.get(key) == i:
            ordered.extend(writers.pop(key, []))
    items[:] = ordered
