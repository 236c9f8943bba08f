"""Lazy calibrated rows: rows per second against the machine's matmul rate, and query latency lazy vs eager.

Run (FB15k-237; every variable optional, see below)::

    KGREASON_LAZY_ARTIFACT=/tmp/fb-lazy \\
    KGREASON_LAZY_QUERY_ARTIFACT=/tmp/fb-lazy-same KGREASON_EAGER_QUERY_ARTIFACT=/tmp/fb-n3 \\
    KGREASON_LAZY_QUERIES=/tmp/r13/fb237_q1000.jsonl \\
    python -m pytest benchmarks/test_lazy_rows.py -q
    python -m benchmarks.report lazy_rows

(a) Rows per second.  ``LAZY_BENCH_ROWS`` (default 4 chunks) random rows of the
lazy artifact at ``$KGREASON_LAZY_ARTIFACT`` (else of a synthetic
FB15k-237-sized model: random rank-256 embeddings, threshold 2e-4) are
computed through :meth:`kge.lazy.LazyMatrices.rows` with an empty cache
(GEMM, calibration, CSR pieces, cache fill), with the fused kernel (``ops``
backend ``cpp``) and with the torch reference (``reference``, the code the
calibration ran before the kernel), best of 3 rounds.  Their useful GEMM rate
``2 * rows * 2d * N / time`` is divided by the rate of a bare fp32 ``torch.mm``
of the same chunk shape measured in the same run
(:func:`kge.complex_n3.matmul_rate`).  Target: >= 0.5.

(b) Query latency.  ``LAZY_BENCH_QUERIES`` (default 20) queries per structure
(1p, 2p, 2i, 3i, pi) from ``$KGREASON_LAZY_QUERIES`` (a sampler JSONL, e.g.
``python -m engine.sample``'s), answered one at a time by
:class:`engine.exec.executor.Executor` over the eager artifact
``$KGREASON_EAGER_QUERY_ARTIFACT`` and over the lazy artifact
``$KGREASON_LAZY_QUERY_ARTIFACT`` built at the same threshold (its rows are
computed at exactly the eager artifact's recorded threshold when the two
differ by rounding): lazy with an empty row cache before every query (cold)
and again with every row cached (warm).  Eager matrices are prepared before
timing (as in benchmarks/test_engine_throughput.py).  Median and mean
milliseconds per query and the ratios lazy / eager; the largest score
difference lazy vs eager is recorded.  Skipped unless all three are set and
exist.

The table goes to ``benchmarks/results/lazy_rows.md`` (command, machine, load), written from the
run's saved numbers by the second command.
Runtime ~1-3 minutes on 2 cores (most of it loading the 1.1 GB eager FB15k-237 matrices).
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ops
from kge.calibrate import DEFAULT_THRESHOLD
from kge.complex_n3 import matmul_rate
from kge.lazy import LazyMatrices

from conftest import measurements_for  # benchmarks/conftest.py
from report import Measurements  # benchmarks/report.py

REPORT_TABLE = "lazy_rows"

pytestmark = pytest.mark.benchmark

N_ENT, N_REL, RANK = 14505, 474, 256
STRUCTS = ("1p", "2p", "2i", "3i", "pi")
CHUNKS = 4
ROWS = int(os.environ.get("LAZY_BENCH_ROWS", "0")) or None  # None: CHUNKS chunks
QUERIES = int(os.environ.get("LAZY_BENCH_QUERIES", "20"))

#: Measurements cells.  Part (a): row = ops backend, these columns (plus row "matmul", column "gflops").
ROW_COLUMNS = ("rows_s", "gflops", "seconds", "nnz_row")
#: Part (b): row = structure, these columns ("maxdiff", the lazy vs eager score difference, may be 0).
LATENCY_COLUMNS = ("eager", "cold", "warm", "eager_mean", "cold_mean", "warm_mean", "n", "rows", "maxdiff")


def _env_path(name: str) -> Path | None:
    v = os.environ.get(name)
    return Path(v) if v and Path(v).exists() else None


@pytest.fixture(scope="module")
def lazy_matrices() -> LazyMatrices:
    info = measurements_for(REPORT_TABLE).info
    info.update(row_columns=list(ROW_COLUMNS), latency_columns=list(LATENCY_COLUMNS), structs=list(STRUCTS),
                queries=QUERIES)
    path = _env_path("KGREASON_LAZY_ARTIFACT")
    if path is not None:
        from kge import Artifact

        art = Artifact.load(path, verify=False, row_store_gb=0)  # rows computed, never read from disk
        if not isinstance(art.matrices, LazyMatrices):
            pytest.skip(f"KGREASON_LAZY_ARTIFACT={path} is not a lazy artifact")
        info["rows_data"] = f"lazy artifact {path}"
        return art.matrices
    rng = np.random.default_rng(0)
    # scale 0.43: scores of std ~2.5 per row, ~5% of a row above 2e-4 (a trained FB15k-237 model keeps ~3%)
    ent = ((rng.normal(size=(N_ENT, RANK)) + 1j * rng.normal(size=(N_ENT, RANK))) * 0.43).astype(np.complex64)
    rel = ((rng.normal(size=(N_REL, RANK)) + 1j * rng.normal(size=(N_REL, RANK))) * 0.43).astype(np.complex64)
    obs = np.stack([rng.integers(0, N_ENT, 544230), rng.integers(0, N_REL, 544230), rng.integers(0, N_ENT, 544230)], 1)
    info["rows_data"] = "synthetic FB15k-237-sized model (random embeddings; KGREASON_LAZY_ARTIFACT unset)"
    return LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=DEFAULT_THRESHOLD, device="cpu",
                        row_store_gb=0)


def _keys(m: LazyMatrices) -> np.ndarray:
    cal = m._calib
    count = ROWS or CHUNKS * cal.chunk_rows
    return np.sort(np.random.default_rng(0).choice(cal.total_rows, size=count, replace=False))


def _time_rows(benchmark, m: LazyMatrices, backend: str, out: Measurements) -> None:
    keys = _keys(m)
    before = ops.get_backend()
    holder = {}

    def setup():
        m.cache.clear()

    def run():
        _, cols, _ = m.rows(keys)
        holder["nnz"] = len(cols)

    ops.set_backend(backend)
    try:
        benchmark.pedantic(run, setup=setup, rounds=3, iterations=1, warmup_rounds=1)
    finally:
        ops.set_backend(before)
        m.cache.clear()
    best = benchmark.stats.stats.min
    cal = m._calib
    for column, value in dict(rows_s=len(keys) / best, gflops=cal.matmul_flops(len(keys)) / best / 1e9,
                              seconds=best, nnz_row=holder["nnz"] / len(keys)).items():
        out.put(backend, column, value)
    out.info.update(rows=len(keys), n=cal.num_entities, r=cal.num_relations, d=cal.dim, chunk=cal.chunk_rows,
                 threshold=cal.threshold)


def test_matmul_rate(lazy_matrices, measurements):
    cal = lazy_matrices._calib
    # best of three 0.3 s measurements (the machine is shared)
    rates = [matmul_rate(cal.chunk_rows, 2 * cal.dim, cal.num_entities, precision="fp32", device="cpu")
             for _ in range(3)]
    measurements.put("matmul", "gflops", max(rates) / 1e9)
    measurements.info["mm_shape"] = f"({cal.chunk_rows}, {2 * cal.dim}) @ ({2 * cal.dim}, {cal.num_entities})"


@pytest.mark.benchmark(group="lazy-rows")
def test_lazy_rows_fused_kernel(benchmark, lazy_matrices, measurements):
    if not ops.has_kernel("calibrate_rows", "cpu"):
        for column in ROW_COLUMNS:
            measurements.not_applicable("cpp", column, "the extension has no calibrate_rows kernel")
        pytest.skip("the extension has no calibrate_rows kernel")
    _time_rows(benchmark, lazy_matrices, "cpp", measurements)


@pytest.mark.benchmark(group="lazy-rows")
def test_lazy_rows_torch_reference(benchmark, lazy_matrices, measurements):
    _time_rows(benchmark, lazy_matrices, "reference", measurements)


# ------------------------------------------------------------------ (b) query latency
def _no_latency(m: Measurements, reason: str, structures=STRUCTS) -> None:
    """Mark the latency cells of ``structures`` not applicable (so the report prints no part (b) rows), then skip."""
    for s in structures:
        for column in LATENCY_COLUMNS:
            m.not_applicable(s, column, reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def query_setup():
    m = measurements_for(REPORT_TABLE)
    m.info.update(row_columns=list(ROW_COLUMNS), latency_columns=list(LATENCY_COLUMNS), structs=list(STRUCTS),
                  queries=QUERIES)
    lazy_path = _env_path("KGREASON_LAZY_QUERY_ARTIFACT")
    eager_path = _env_path("KGREASON_EAGER_QUERY_ARTIFACT")
    q_path = _env_path("KGREASON_LAZY_QUERIES")
    if lazy_path is None or eager_path is None or q_path is None:
        _no_latency(m, "set KGREASON_LAZY_QUERY_ARTIFACT, KGREASON_EAGER_QUERY_ARTIFACT and KGREASON_LAZY_QUERIES "
                    "(a lazy and an eager artifact at one threshold, and a query JSONL) to time queries")
    from engine.eval.metrics import load_jsonl_queries
    from engine.exec.executor import Executor
    from engine.lang.query import relations_of
    from kge import Artifact

    info = m.info
    t = time.perf_counter()
    eager = Artifact.load(eager_path, verify=False, load_embeddings=False)
    info["eager_load_s"] = time.perf_counter() - t
    lazy = Artifact.load(lazy_path, verify=False, row_store_gb=0)  # cold = computed, not read from persisted rows
    if not isinstance(lazy.matrices, LazyMatrices) or isinstance(eager.matrices, LazyMatrices):
        _no_latency(m, "KGREASON_LAZY_QUERY_ARTIFACT must be lazy and KGREASON_EAGER_QUERY_ARTIFACT eager")
    thr_e = float(eager.meta.get("calibration", {}).get("threshold", float("nan")))
    thr_l = lazy.matrices.threshold
    info.update(q_lazy=str(lazy_path), q_eager=str(eager_path), q_file=str(q_path), thr_eager=thr_e, thr_lazy=thr_l,
                latency_backend="cpp" if ops.has_kernel("calibrate_rows", "cpu") else "reference")
    if thr_l != thr_e and thr_e == thr_e:
        # A build that raised its threshold records it unrounded (e.g. 0.000931693...), a lazy build
        # given "the same" threshold on the command line its rounded value: compute the lazy rows at
        # exactly the eager one, so that both sides stand for the same matrices.
        import dataclasses

        lm = lazy.matrices
        lazy = dataclasses.replace(lazy, matrices=LazyMatrices(
            entity=lm.entity, relation=lm.relation, observed=lm.observed, threshold=thr_e, delta=lm.delta,
            row_cache_gb=lm.row_cache_gb, device=lm.device, chunk_rows=lm.chunk_rows, row_store_gb=0))
    queries = {}
    for q in load_jsonl_queries(q_path, eager, structures=STRUCTS):
        lst = queries.setdefault(q.structure, [])
        if len(lst) < QUERIES:
            lst.append(q.node)
    ex_e = Executor(eager)
    ex_l = Executor(lazy)
    t = time.perf_counter()
    for r in sorted({int(r) for qs in queries.values() for q in qs for r in relations_of(q)}):
        ex_e.rows.relation(r)  # prepared before timing, as in test_engine_throughput.py
    info["eager_prepare_s"] = time.perf_counter() - t
    return ex_e, ex_l, lazy.matrices, queries


def _latencies(ex, qs) -> tuple[list[float], list[torch.Tensor]]:
    times, outs = [], []
    for q in qs:
        t = time.perf_counter()
        outs.append(ex.scores([q]))
        times.append(time.perf_counter() - t)
    return times, outs


def _cold_warm(ex, qs, lazy_m: LazyMatrices) -> tuple[list[float], list[float], list[torch.Tensor]]:
    """Each query twice in a row: with an emptied row cache (cold), then with its rows cached (warm)."""
    cold, warm, outs = [], [], []
    for q in qs:
        lazy_m.cache.clear()
        t = time.perf_counter()
        outs.append(ex.scores([q]))
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        ex.scores([q])
        warm.append(time.perf_counter() - t)
    return cold, warm, outs


@pytest.mark.benchmark(group="lazy-latency")
@pytest.mark.parametrize("structure", STRUCTS)
def test_query_latency(benchmark, query_setup, structure, measurements):
    ex_e, ex_l, lazy_m, queries = query_setup
    qs = queries.get(structure, [])
    if not qs:
        _no_latency(measurements, f"no {structure} queries in the file", structures=(structure,))
    _latencies(ex_e, qs[:2])  # warm-up (allocator, thread pool)
    res = {}

    def run():  # one timed pass: eager, lazy cold, lazy warm, all on the same queries
        st = lazy_m.stats
        res["eager"], out_e = _latencies(ex_e, qs)
        rows0 = st.rows_computed
        res["cold"], res["warm"], out_l = _cold_warm(ex_l, qs, lazy_m)
        res["rows"] = (st.rows_computed - rows0) / len(qs)  # mean: a few queries need most of the rows
        res["maxdiff"] = max(float((a - b).abs().max()) for a, b in zip(out_e, out_l))

    benchmark.pedantic(run, rounds=1, iterations=1)
    lazy_m.cache.clear()
    out = {k: statistics.median(res[k]) * 1e3 for k in ("eager", "cold", "warm")}
    out.update({f"{k}_mean": statistics.fmean(res[k]) * 1e3 for k in ("eager", "cold", "warm")})
    for column, value in dict(out, n=len(qs), rows=res["rows"], maxdiff=res["maxdiff"]).items():
        measurements.put(structure, column, value)
