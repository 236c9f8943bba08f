"""Lazy calibrated rows: rows per second against the machine's matmul rate, and query latency lazy vs eager.

Run (FB15k-237; every variable optional, see below)::

    KGREASON_LAZY_ARTIFACT=/tmp/fb-lazy \\
    KGREASON_LAZY_QUERY_ARTIFACT=/tmp/fb-lazy-same KGREASON_EAGER_QUERY_ARTIFACT=/tmp/fb-n3 \\
    KGREASON_LAZY_QUERIES=/tmp/r13/fb237_q1000.jsonl \\
    python -m pytest benchmarks/test_lazy_rows.py -q

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

The table goes to ``benchmarks/results/lazy_rows.md`` (command, machine, load).
Runtime ~1-3 minutes on 2 cores (most of it loading the 1.1 GB eager FB15k-237 matrices).
"""
from __future__ import annotations

import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch

import ops
from kge.calibrate import DEFAULT_THRESHOLD
from kge.complex_n3 import matmul_rate
from kge.lazy import LazyMatrices

from conftest import RESULTS, Measurements, machine_description, measurements_for  # benchmarks/conftest.py

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
def lazy_matrices(_measurements_by_file) -> LazyMatrices:
    info = measurements_for(_measurements_by_file, __file__).info
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
    """Mark the latency cells of ``structures`` not applicable (so the writer prints no part (b) rows), then skip."""
    for s in structures:
        for column in LATENCY_COLUMNS:
            m.not_applicable(s, column, reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def query_setup(_measurements_by_file):
    m = measurements_for(_measurements_by_file, __file__)
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
    info.update(q_lazy=str(lazy_path), q_eager=str(eager_path), q_file=str(q_path), thr_eager=thr_e, thr_lazy=thr_l)
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


def test_write_report(measurements):
    m = measurements
    m.require((["matmul"], ["gflops"]), (["cpp", "reference"], ROW_COLUMNS), (STRUCTS, LATENCY_COLUMNS),
              info=("rows_data", "mm_shape", "rows", "n", "r", "d", "chunk", "threshold"), may_be_zero=("maxdiff",))
    i = m.info
    r = {b: {c: m.get(b, c) for c in ROW_COLUMNS} for b in ("cpp", "reference") if m.get(b, "rows_s") is not None}
    lat = {s: {c: m.get(s, c) for c in LATENCY_COLUMNS} for s in STRUCTS if m.get(s, "eager") is not None}
    mm = m.get("matmul", "gflops")
    load = os.getloadavg()
    lines = [
        "# Lazy calibrated rows: rows/s vs matmul rate, and query latency lazy vs eager",
        "",
        "Command: `" + " ".join(f"{k}={os.environ[k]}" for k in (
            "KGREASON_LAZY_ARTIFACT", "KGREASON_LAZY_QUERY_ARTIFACT", "KGREASON_EAGER_QUERY_ARTIFACT",
            "KGREASON_LAZY_QUERIES", "LAZY_BENCH_ROWS", "LAZY_BENCH_QUERIES") if os.environ.get(k))
        + " python -m pytest benchmarks/test_lazy_rows.py -q`",
        f"Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"Machine: {machine_description()}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}",
        "(the machine is shared with other jobs: absolute numbers are noisy, ratios less so)",
        "",
        "## (a) Rows per second",
        "",
        f"Data: {i['rows_data']}; N = {i['n']:,}, R = {i['r']}, complex rank d = {i['d']}, threshold {i['threshold']:g}; "
        f"{i['rows']:,} random rows in chunks of {i['chunk']} through `LazyMatrices.rows` with an empty cache "
        "(GEMM + calibration + CSR pieces + cache fill), best of 3 rounds.",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| plain fp32 `torch.mm` {i['mm_shape']} (`kge.complex_n3.matmul_rate`, best of 3) | {mm:.1f} GFLOP/s |",
    ]
    for b, name in (("cpp", "fused kernel (`ops` backend cpp)"), ("reference", "torch reference (`ops` backend reference, the former code)")):
        if b in r:
            x = r[b]
            lines.append(f"| {name}: rows/s, useful GEMM GFLOP/s, **ratio to torch.mm** | {x['rows_s']:,.0f} rows/s, "
                         f"{x['gflops']:.1f} GFLOP/s, **{x['gflops'] / mm:.2f}** (target >= 0.5) |")
    if "cpp" in r and "reference" in r:
        lines.append(f"| fused kernel / torch reference (rows/s) | **{r['cpp']['rows_s'] / r['reference']['rows_s']:.2f}x** |")
        lines.append(f"| kept entries per row | {r['cpp']['nnz_row']:.0f} |")
    if lat:
        lines += [
            "",
            "## (b) Query latency, lazy vs eager",
            "",
            f"Eager: {i['q_eager']} (threshold {i['thr_eager']:.6g}; loaded in {i['eager_load_s']:.1f} s, "
            f"the queries' relations prepared in {i['eager_prepare_s']:.1f} s, both untimed); "
            f"lazy: {i['q_lazy']} (its threshold {i['thr_lazy']:.6g}"
            + (f", computed at the eager one, {i['thr_eager']:.6g}" if i['thr_lazy'] != i['thr_eager'] else "")
            + f"); queries: the first {QUERIES} per structure of "
            f"{i['q_file']}, one at a time (`Executor.scores([q])`), ops backend "
            f"{'cpp' if ops.has_kernel('calibrate_rows', 'cpu') else 'reference'}.  Cold: row cache emptied before "
            "every query; warm: every row the query needs cached.  Milliseconds per query, median (mean); "
            "ratios of the medians (means).  Rows computed: mean per query (a few queries need most of them).",
            "",
            "| structure | queries | eager ms | lazy cold ms | lazy warm ms | cold / eager | warm / eager | "
            "rows computed / query (cold) | max abs score diff |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in STRUCTS:
            if s in lat:
                x = lat[s]
                lines.append(
                    f"| {s} | {int(x['n'])} | {x['eager']:.2f} ({x['eager_mean']:.2f}) | {x['cold']:.2f} ({x['cold_mean']:.2f}) "
                    f"| {x['warm']:.2f} ({x['warm_mean']:.2f}) | {x['cold'] / x['eager']:.1f}x "
                    f"({x['cold_mean'] / x['eager_mean']:.1f}x) | {x['warm'] / x['eager']:.1f}x "
                    f"({x['warm_mean'] / x['eager_mean']:.1f}x) | {x['rows']:,.0f} | {x['maxdiff']:.2g} |")
        lines += [
            "",
            "Reading the latency table: a cold lazy query pays for its rows (GEMM + `calibrate_rows`, at the rate of "
            "part (a); the persisted row store is off here) and for gathering them into a compact stack with its "
            "transpose; a warm one reads each relation's cached rows as a one-relation stack prepared once "
            "(`kge.lazy.RowCache`), so what it adds to eager is one `ops.project` call and its Python per "
            "relation of the query.  On a loaded machine every thread-pool region of those small steps can also "
            "wait for a descheduled worker.",
        ]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lazy_rows.md").write_text(text, encoding="utf-8")
    print(text)
