"""Shared fixtures for the pytest-benchmark suites in this folder.

Run with ``python -m pytest benchmarks/<file>.py`` (the normal test run only
collects ``tests/``).  The FB15k-237 artifact is looked up at
``$KGREASON_FB15K237_ARTIFACT`` or ``artifacts/FB15k-237`` (built by
``python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237``);
suites fall back to synthetic data of the same size when it is absent.

Reports are written in a second step, by a script (benchmarks/report.py): the timed tests put
their numbers into a :class:`report.Measurements` (the ``measurements`` fixture, or
:func:`measurements_for`), in any order, and at the end of the session each one is saved as
``<--bench-out>/<name>.json`` (default ``artifacts/bench``, printed in the summary).  Then
``python -m benchmarks.report <name> --from <folder>`` writes ``results/<name>.md``, or fails naming
every missing cell and leaves the committed table alone.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import pytest

from report import BENCH_ENV, DEFAULT_SAVED, Measurements  # benchmarks/report.py (rootdir-relative import)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
FB15K237_BETAE = SHARED_DATA / "betae" / "FB15k-237-betae"


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


# ------------------------------------------------------------------ measurements saved for benchmarks/report.py
def pytest_addoption(parser):
    parser.addoption("--bench-out", metavar="DIR", default=None,
                     help=f"folder where the benchmark files save their measurements as <name>.json, for "
                          f"python -m benchmarks.report (default {DEFAULT_SAVED})")


#: This session's measurements, by table name (benchmarks/report.py's TABLES).
_SESSION: dict[str, Measurements] = {}
_SAVED: list[tuple[str, str]] = []


def measurements_for(table: str) -> Measurements:
    """The session's :class:`Measurements` of ``table`` (one per table; set ``.name`` for a variant)."""
    return _SESSION.setdefault(table, Measurements(table))


@pytest.fixture
def measurements(request) -> Measurements:
    """The :class:`Measurements` of the requesting test's file (its ``REPORT_TABLE``)."""
    return measurements_for(request.module.REPORT_TABLE)


def _argv() -> list[str]:
    """This run's pytest arguments, for the report's command line: ``-p <plugin>`` and ``--bench-out`` left out."""
    out, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("-p", "--bench-out"):
            skip = True
        elif not (arg.startswith("-p") or arg.startswith("--bench-out=")):
            out.append(arg)
    return out


def pytest_sessionfinish(session):
    """Save every table's measurements (those a test of this session put anything into)."""
    if not any(_SESSION.values()):
        return
    import torch

    folder = Path(session.config.getoption("--bench-out") or DEFAULT_SAVED)
    for m in _SESSION.values():
        if not m:
            continue
        m.info.update(machine=os.environ.get("KGREASON_BENCH_MACHINE") or machine_description(),
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load=list(os.getloadavg()),
                      argv=_argv(), threads=torch.get_num_threads(),
                      env={k: os.environ[k] for k in BENCH_ENV if os.environ.get(k)})
        path = m.save(folder)
        # (the fold table's run is saved as ops_single_relation_after: its report is ops_single_relation)
        report = m.table if m.table == "ops_single_relation" else m.name
        _SAVED.append((str(path), f"python -m benchmarks.report {report} --from {folder}"))
    _SESSION.clear()


def pytest_terminal_summary(terminalreporter):
    for path, command in _SAVED:
        terminalreporter.write_line(f"benchmark measurements saved to {path}; write the table: {command}")
