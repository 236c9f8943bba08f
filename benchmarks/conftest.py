"""Shared fixtures for the pytest-benchmark suites in this folder.

Run with ``python -m pytest benchmarks/<file>.py`` (the normal test run only
collects ``tests/``).  The FB15k-237 artifact is looked up at
``$KGREASON_FB15K237_ARTIFACT`` or ``artifacts/FB15k-237`` (built by
``python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237``);
suites fall back to synthetic data of the same size when it is absent.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

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
