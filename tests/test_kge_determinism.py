"""Seeded builds are bit-reproducible: the same arrays (and file bytes) at 2 threads twice and at 1 vs 2 threads.

Every build runs in its own process with ``OMP_NUM_THREADS`` set (torch reads
it at start-up).  The settings are the ones where the trainer used to differ:
rank 64 and 512-row batches make each indexed gradient 65,536 floats, above
the size where torch's CPU ``index_put_`` (the backward of ``entity[h]``) adds
with parallel atomics, whose order varies from run to run; the trainer now
gathers with ``index_select`` (whose backward ``index_add_`` adds in index
order).  Checked to fail on the previous code (two 2-thread builds gave
different embeddings).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# the full 1-N loss (UMLS: 135 entities), and the sampled-candidate loss of the huge preset (sparse Adagrad)
VARIANTS = {
    "full": ["--rank", "64", "--batch-size", "512", "--epochs", "3"],
    "sampled": ["--rank", "64", "--batch-size", "512", "--epochs", "3", "--candidates", "48"],
}


def _build(out: Path, threads: int, extra: list[str]) -> Path:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "kge.build", "--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--seed", "0",
           "--eval-max-triples", "300", "--device", "cpu", "--quiet", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _arrays(path: Path) -> dict[str, str]:
    with np.load(path, allow_pickle=False) as z:
        return {k: hashlib.sha256(np.ascontiguousarray(z[k]).tobytes()).hexdigest() for k in z.files}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_seeded_builds_are_bit_identical_across_runs_and_thread_counts(tmp_path, variant):
    extra = VARIANTS[variant]
    a = _build(tmp_path / "a2", 2, extra)
    b = _build(tmp_path / "b2", 2, extra)
    c = _build(tmp_path / "c1", 1, extra)
    for name in ("embeddings.npz", "matrices.npz"):
        ref = _arrays(a / name)
        assert _arrays(b / name) == ref, f"{name}: two 2-thread builds differ"
        assert _arrays(c / name) == ref, f"{name}: 1-thread and 2-thread builds differ"
        # and the files themselves (kge.artifact writes fixed zip timestamps), so meta.json's checksums agree
        assert (b / name).read_bytes() == (a / name).read_bytes()
        assert (c / name).read_bytes() == (a / name).read_bytes()
    # the sampled variant really sampled (fewer candidates than UMLS's 135 entities)
    import json

    meta = json.loads((a / "meta.json").read_text())
    assert meta["train"]["candidates"] == (48 if variant == "sampled" else None)
    assert meta["matrices"] == "eager" and meta["calibration"]["matrices_choice"]["mode"] == "eager"
