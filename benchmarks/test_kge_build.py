"""Calibrated-matrix build throughput vs the same machine's plain float32 matmul rate.

Run: ``python -m pytest benchmarks/test_kge_build.py -q`` then ``python -m benchmarks.report kge_build``
(from the repo root).

The calibration is FLOP-bound: per (relation, head) row it multiplies a
``2d`` vector with the ``(2d, N)`` tail matrix.  We time it on a subset of
relations at FB15k-237 size (embeddings of ``artifacts/FB15k-237`` when built,
else random ones with the same N, R and rank), count its useful matmul FLOPs
(``2 * rows * 2d * N``) and divide by the rate of a bare ``torch.mm`` of the
same shape measured in the same run.  The ratio says how much of the machine's
matmul rate the whole pipeline (softmax, threshold, gather included) keeps;
the target is >= 0.5.  Results go to ``benchmarks/results/kge_build.md`` (the report's second step).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from kge.calibrate import DEFAULT_THRESHOLD, calibrate, default_chunk_rows

from conftest import measurements_for  # benchmarks/conftest.py (rootdir-relative import)

REPORT_TABLE = "kge_build"

N_ENT, N_REL, RANK = 14505, 474, 100
SUBSET = int(os.environ.get("KGE_BENCH_RELATIONS", "6"))

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def embeddings(fb15k237_artifact):
    info = measurements_for(REPORT_TABLE).info
    info["qto_threshold"] = DEFAULT_THRESHOLD
    if fb15k237_artifact is not None and fb15k237_artifact.embeddings is not None:
        e = fb15k237_artifact.embeddings
        info["embeddings"] = f"trained, from {fb15k237_artifact.path}"
        info["threshold"] = float(fb15k237_artifact.meta.get("calibration", {}).get("threshold", DEFAULT_THRESHOLD))
        return e["entity"], e["relation"], fb15k237_artifact.observed
    rng = np.random.default_rng(0)
    ent = ((rng.normal(size=(N_ENT, RANK)) + 1j * rng.normal(size=(N_ENT, RANK))) * 0.3).astype(np.complex64)
    rel = ((rng.normal(size=(N_REL, RANK)) + 1j * rng.normal(size=(N_REL, RANK))) * 0.3).astype(np.complex64)
    obs = np.stack([rng.integers(0, N_ENT, 272115), rng.integers(0, N_REL, 272115), rng.integers(0, N_ENT, 272115)], 1)
    info["embeddings"] = "random (no FB15k-237 artifact built)"
    info["threshold"] = DEFAULT_THRESHOLD
    return ent, rel, obs.astype(np.int64)


def _relations(num_rel: int) -> list[int]:
    return list(np.linspace(0, num_rel - 1, SUBSET).round().astype(int))


def test_plain_matmul_rate(benchmark, embeddings, measurements):
    ent, rel, _ = embeddings
    n, d = ent.shape
    chunk = default_chunk_rows(n, "cpu")
    a = torch.randn(chunk, 2 * d)
    b = torch.randn(2 * d, n)
    out = torch.empty(chunk, n)
    reps = 20

    def run():
        for _ in range(reps):
            torch.mm(a, b, out=out)

    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    flops = 2.0 * chunk * 2 * d * n * reps
    measurements.put("build", "mm_gflops", flops / benchmark.stats.stats.min / 1e9)
    measurements.info["mm_shape"] = f"({chunk}, {2 * d}) @ ({2 * d}, {n})"


def test_calibration_rate(benchmark, embeddings, measurements):
    ent, rel, obs = embeddings
    n, d = ent.shape
    rels = _relations(rel.shape[0])
    holder = {}

    def run():
        holder["mat"], holder["stats"] = calibrate(ent, rel, obs, relations=rels, device="cpu", progress=False,
                                                   threshold=measurements.info["threshold"])

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=0)
    # The same rows at QTO's 2e-4, once: with a weakly trained model far more entries
    # survive and the gather of the survivors, not the matmul, dominates.
    t = time.perf_counter()
    low, _ = calibrate(ent, rel, obs, relations=rels, device="cpu", progress=False, threshold=DEFAULT_THRESHOLD)
    measurements.put("build", "low_seconds", time.perf_counter() - t)
    measurements.put("build", "low_nnz", low.nnz)
    del low
    seconds = benchmark.stats.stats.min
    rows = len(rels) * n
    flops = 2.0 * rows * 2 * d * n
    for key, value in dict(
        cal_gflops=flops / seconds / 1e9,
        cal_seconds=seconds,
        rows=rows,
        relations=len(rels),
        full_seconds=seconds * rel.shape[0] / len(rels),
        nnz_subset=holder["mat"].nnz,
        nnz_full_estimate=holder["mat"].nnz * rel.shape[0] / len(rels),
        chunk=holder["stats"].chunk_rows,
        n=n,
        r=rel.shape[0],
        d=d,
    ).items():
        measurements.put("build", key, value)
