"""Calibrated-matrix build throughput vs the same machine's plain float32 matmul rate.

Run: ``python -m pytest benchmarks/test_kge_build.py -q`` (from the repo root).

The calibration is FLOP-bound: per (relation, head) row it multiplies a
``2d`` vector with the ``(2d, N)`` tail matrix.  We time it on a subset of
relations at FB15k-237 size (embeddings of ``artifacts/FB15k-237`` when built,
else random ones with the same N, R and rank), count its useful matmul FLOPs
(``2 * rows * 2d * N``) and divide by the rate of a bare ``torch.mm`` of the
same shape measured in the same run.  The ratio says how much of the machine's
matmul rate the whole pipeline (softmax, threshold, gather included) keeps;
the target is >= 0.5.  Results go to ``benchmarks/results/kge_build.md``.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import numpy as np
import pytest
import torch

from kge.calibrate import DEFAULT_THRESHOLD, calibrate, default_chunk_rows

from conftest import RESULTS, machine_description, measurements_for  # benchmarks/conftest.py (rootdir-relative import)

N_ENT, N_REL, RANK = 14505, 474, 100
SUBSET = int(os.environ.get("KGE_BENCH_RELATIONS", "6"))
#: Measurements cells (row "build"): what the report needs from the two timed tests.
NUMBERS = ("mm_gflops", "cal_gflops", "cal_seconds", "rows", "relations", "full_seconds", "nnz_subset",
           "nnz_full_estimate", "chunk", "n", "r", "d", "low_seconds", "low_nnz")

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def embeddings(fb15k237_artifact, _measurements_by_file):
    info = measurements_for(_measurements_by_file, __file__).info
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


def test_write_report(measurements):
    measurements.require((["build"], NUMBERS), info=("embeddings", "threshold", "mm_shape"))
    r = {**measurements.info, **{k: measurements.get("build", k) for k in NUMBERS}}
    for k in ("rows", "relations", "nnz_subset", "chunk", "n", "r", "d", "low_nnz"):
        r[k] = int(r[k])
    ratio = r["cal_gflops"] / r["mm_gflops"]
    load = os.getloadavg()
    text = f"""# Calibrated matrix build: FLOP rate vs plain matmul

Command: `python -m pytest benchmarks/test_kge_build.py -q` (KGE_BENCH_RELATIONS={r['relations']})
Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}
Machine: {machine_description()}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}
(the machine is shared with other jobs: absolute numbers are noisy, the ratio less so)

Embeddings: {r['embeddings']}; N = {r['n']:,}, R = {r['r']}, complex rank d = {r['d']} (real matmul width 2d = {2 * r['d']}),
threshold {r['threshold']:.3g} (the artifact's; QTO's {DEFAULT_THRESHOLD:g} in the last rows).

| measurement | value |
|---|---|
| plain float32 `torch.mm` {r['mm_shape']} | {r['mm_gflops']:.1f} GFLOP/s |
| calibration of {r['relations']} relations ({r['rows']:,} rows, chunk {r['chunk']} rows) | {r['cal_seconds']:.2f} s |
| calibration useful matmul rate (2 * rows * 2d * N / time) | {r['cal_gflops']:.1f} GFLOP/s |
| **ratio calibration / plain matmul** | **{ratio:.2f}** (target >= 0.5) |
| extrapolated time for all {r['r']} relations | {r['full_seconds'] / 60:.1f} min |
| nnz in the subset / extrapolated to all relations | {r['nnz_subset']:,} / {r['nnz_full_estimate']:,.0f} |
| same rows at threshold {DEFAULT_THRESHOLD:g}: time, useful rate, ratio | {r['low_seconds']:.2f} s, {2.0 * r['rows'] * 2 * r['d'] * r['n'] / r['low_seconds'] / 1e9:.1f} GFLOP/s, {2.0 * r['rows'] * 2 * r['d'] * r['n'] / r['low_seconds'] / 1e9 / r['mm_gflops']:.2f} |
| nnz at {DEFAULT_THRESHOLD:g} in the subset / extrapolated | {r['low_nnz']:,} / {r['low_nnz'] * r['r'] / r['relations']:,.0f} |
"""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kge_build.md").write_text(text, encoding="utf-8")
    print(text)
    assert ratio > 0
