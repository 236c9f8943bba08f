"""What the load-time verification of an artifact costs (docs/artifacts.md, "Verification on load").

    OMP_NUM_THREADS=1 python benchmarks/artifact_load_checks.py /tmp/bigart

Writes (once) a random eager artifact with 48M stored entries (20,000 entities, 200 relations, rank 500;
475 MB) to the folder given, then times ``Artifact.load`` with the value and structure checks, without
them (the functions replaced by no-ops, embeddings not read: the load before the checks existed), and
with the sha256 checksums; best of 7 (1 for the checksums).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import kge.artifact as A
from kge.artifact import Artifact


def make(path: Path, n: int = 20_000, r: int = 200, per_row: int = 12, rank: int = 500) -> None:
    rng = np.random.default_rng(0)
    rows = r * n
    indptr = np.arange(rows + 1, dtype=np.int64) * per_row
    indices = np.sort(rng.integers(0, n, size=(rows, per_row), dtype=np.int32), axis=1).ravel()
    data = rng.random(rows * per_row, dtype=np.float32)
    emb = {"entity": (rng.standard_normal((n, rank)) + 1j).astype(np.complex64),
           "relation": (rng.standard_normal((r, rank)) + 1j).astype(np.complex64)}
    Artifact(entities=[f"e{i}" for i in range(n)], relations=[f"r{i}" for i in range(r)],
             matrices=sp.csr_matrix((data, indices, indptr), shape=(rows, n)), observed=np.zeros((0, 3)),
             missing=np.zeros((0, 3)), meta={"source": "bench"}, embeddings=emb).save(path)


def best(f, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main(path: Path) -> None:
    if not (path / "meta.json").is_file():
        make(path)
    unverified = lambda: Artifact.load(path, verify=False, load_embeddings=False)  # noqa: E731
    print(f"load, checks on: {best(unverified, 7):.2f} s")
    saved = A._check_csr, A._all_finite, A.read_embeddings
    A._check_csr, A._all_finite, A.read_embeddings = (lambda *a, **k: None), (lambda a: True), (lambda *a, **k: None)
    try:
        print(f"load, no checks (as before): {best(unverified, 7):.2f} s")
    finally:
        A._check_csr, A._all_finite, A.read_embeddings = saved
    print(f"load with sha256 checksums: {best(lambda: Artifact.load(path, load_embeddings=False), 1):.2f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bigart"))
