"""``--matrices auto``: whether a build stores its calibrated matrices (eager) or computes rows on demand (lazy).

The rule weighs the work, at this machine's measured rate (docs/artifacts.md, "Lazy matrices")::

    row cost      c = 2 x 2d x N FLOPs / G        G: measured rate of the fused calibration (GFLOP/s)
    eager build   E = R*N rows x c                every row once, now
    lazy queries  L = Q x (1 + k) rows x c        Q expected queries (--expected-queries, default 14,000:
                                                  a BetaE evaluation, 14 structures x 1,000), k the mean
                                                  entries of a calibrated row at the threshold (the
                                                  frontier after one hop, from the sampled rows)
    eager  iff    E <= L + --max-calibrate-minutes              (time: the queries would pay for it)
           and    8 bytes x nnz <= --max-matrix-gb              (size)
           and    2.5 x 8 bytes x nnz <= MemAvailable           (memory: EAGER_PEAK_FACTOR)
    else, eager at a raised threshold t' (the one whose entries fit --max-matrix-gb, as an eager build
    raises it) iff no --threshold was given, the time test holds, the size and memory tests hold at t',
    and L >= RAISE_SHARE x E (the expected queries would compute at least half of the stack lazily);
    else lazy.

Why the raise.  At QTO's threshold FB15k-237's matrices hold ~3.6 B entries (22-27 GiB), so the size test
fails, yet a BetaE evaluation (14,000 queries) computes ~6 M of its 6.9 M rows lazily, each at about a
third of the eager calibration's rate (smaller GEMMs; 3-4 k vs 10.7 k rows/s measured,
benchmarks/results/evaluation_fb15k237.md), and the rows fit neither the row cache nor the default row
store: lazy, that evaluation costs about an hour of rows where eager at the raised threshold answers it
in ~21 s.  What the raise costs: QTO's lower threshold scored higher MRR on intersections (+0.5 on 2i,
+2.9 on 3i; about +0.4 on the mean of the 14 structures, benchmarks/results/lazy_batched.md).
``--matrices lazy`` keeps QTO's threshold, and fewer ``--expected-queries`` keep auto lazy.

So eager wherever it fits memory and its one-time calibration costs no more than the rows the expected
queries would compute lazily plus the ``--max-calibrate-minutes`` bound.  ``L`` is a lower bound of the
lazy cost (lazy rows come in smaller GEMMs, plus the compact stacks built per projection), which leans the
rule towards lazy, never eager, beyond what is measured.

Reproducibility.  The files an eager (or a lazy) build writes do not depend on the rate: it decides the
mode only, and is recorded in ``meta.json["calibration"]["matrices_choice"]`` as a measurement
(``measured_gflops``, beside the timings), which the bit-reproducibility checks (they compare the
``.npz`` files, tests/test_kge_determinism.py) do not read.  The mode itself could differ between two
machines (or loads) only when the time test decides and lies within a factor :data:`NEAR_FACTOR` of its
bound: ``matrices_choice["machine_dependent"]`` is then true and the line says so and names the flag that
pins the mode (``--matrices eager`` or ``lazy``).  Everywhere else a rate between half and twice the
measured one picks the same mode (tests/test_kge_autorule.py).

:func:`decide` is the rule (pure: sizes and rates in, mode and line out); :func:`measure_calibrate_gflops`
times the real fused op (:class:`kge.calibrate.RowCalibrator`) on a sample of this KG's rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_EXPECTED_QUERIES", "EAGER_PEAK_FACTOR", "NEAR_FACTOR", "RAISE_SHARE", "AutoInputs", "decide",
           "measure_calibrate_gflops", "fmt_bytes", "fmt_minutes"]

#: Default of ``--expected-queries``: a BetaE evaluation, 14 query structures x 1,000 queries.
DEFAULT_EXPECTED_QUERIES = 14_000
#: Peak RSS of an eager calibration is about a baseline plus this many times the matrices (measured, see docs).
EAGER_PEAK_FACTOR = 2.5
#: A time verdict within this factor of its bound could flip with the machine's rate: the line says so.
NEAR_FACTOR = 2.0
#: Auto raises the threshold to build eager only when the expected queries' lazy rows are at least this share of
#: the whole stack (they would calibrate most of it anyway, ~3x slower per row than the eager build).
RAISE_SHARE = 0.5
#: Longest the rate measurement may run, in seconds (a warm-up call and up to three timed ones).
MEASURE_SECONDS = 1.5
#: Most useful FLOPs of one measured call (0.04 s at 100 GFLOP/s); GEMMs of a few hundred rows reach the rate
#: of a full chunk (measured: 17.2 GFLOP/s at 615 rows vs 18.1 at 673 under load; torch.mm 21.7 vs 21.0 at 615
#: and 1,156 rows of FB15k-237's shape).
MEASURE_FLOPS = 4e9


@dataclass(frozen=True)
class AutoInputs:
    """What :func:`decide` weighs.

    ``gflops``: useful calibration rate (``2 x 2d x N`` FLOPs per row, the fused op's time included);
    ``nnz``: estimated entries of the eager matrices at ``threshold``; ``rows_per_query``: rows a typical
    multi-hop query computes lazily (``1 + k``, see the module docstring); ``available_bytes``: MemAvailable
    (None: unknown, not checked); ``rate_source``: how ``gflops`` was obtained, for the line.
    """

    num_entities: int
    num_relations: int
    rank: int
    gflops: float
    nnz: float
    rows_per_query: float
    threshold: float
    max_matrix_gb: float
    available_bytes: int | None
    max_calibrate_minutes: float
    expected_queries: int
    rate_source: str = "measured"
    #: the threshold an eager build would raise ``threshold`` to so that its entries fit ``max_matrix_gb``, and
    #: the entries it keeps (None: no raise possible, e.g. ``--threshold`` given, or not needed)
    raised_threshold: float | None = None
    raised_nnz: float | None = None

    @property
    def row_seconds(self) -> float:
        return 2.0 * 2 * self.rank * self.num_entities / (self.gflops * 1e9)

    @property
    def eager_minutes(self) -> float:
        return self.num_relations * self.num_entities * self.row_seconds / 60.0

    @property
    def query_rows(self) -> float:
        return self.expected_queries * self.rows_per_query

    @property
    def query_minutes(self) -> float:
        return self.query_rows * self.row_seconds / 60.0


def decide(w: AutoInputs) -> tuple[str, dict[str, Any], str]:
    """``(mode, record, line)``: "eager" or "lazy", what meta.json's ``matrices_choice`` records, and the
    one line saying which and why, with every number the rule compared."""
    rows = w.num_relations * w.num_entities
    budget = w.max_calibrate_minutes + w.query_minutes
    time_ok = w.eager_minutes <= budget
    nnz = round(w.nnz)
    nbytes = 8.0 * nnz

    def fits(entries: float) -> tuple[bool, bool]:
        """(size, memory) tests of eager matrices holding ``entries``."""
        b = 8.0 * round(entries)
        return b <= w.max_matrix_gb * (1 << 30), w.available_bytes is None or EAGER_PEAK_FACTOR * b <= w.available_bytes

    size_ok, memory_ok = fits(w.nnz)
    mode = "eager" if time_ok and size_ok and memory_ok else "lazy"
    # a raise: not needed (fits as it is), or allowed (no --threshold), fitting, and paid for by the queries
    raisable = not (size_ok and memory_ok) and w.raised_threshold is not None and w.raised_nnz is not None \
        and w.query_rows >= RAISE_SHARE * rows and all(fits(w.raised_nnz))
    raise_to = w.raised_threshold if raisable and time_ok else None
    if raise_to is not None:
        mode = "eager"
    # The rate decides only through the time test: eager iff the excess E - L (both scale with 1/rate) fits the
    # bound, i.e. margin = bound / excess >= 1.  A rate NEAR_FACTOR times lower or higher flips that verdict
    # iff 1/NEAR_FACTOR <= margin < NEAR_FACTOR: only then may another machine (or load) decide otherwise.
    excess = w.eager_minutes - w.query_minutes
    margin = w.max_calibrate_minutes / excess if excess > 0 else None
    machine_dependent = bool((size_ok and memory_ok or raisable) and margin is not None
                             and 1.0 / NEAR_FACTOR <= margin < NEAR_FACTOR)
    record: dict[str, Any] = {
        "mode": mode, "rule": "eager iff calibration <= expected queries' lazy rows + max_calibrate_minutes, "
                              "matrices <= max_matrix_gb and x2.5 <= MemAvailable; else eager at the threshold "
                              "raised to fit iff allowed and the queries' rows >= raise_share of the stack",
        "rows": rows, "rank": w.rank, "measured_gflops": round(w.gflops, 3), "rate_source": w.rate_source,
        "estimated_minutes": round(w.eager_minutes, 4), "expected_queries": w.expected_queries,
        "rows_per_query": round(w.rows_per_query, 1), "query_minutes": round(w.query_minutes, 4),
        "max_calibrate_minutes": w.max_calibrate_minutes,
        "time_margin": None if margin is None else round(margin, 4),
        "machine_dependent": machine_dependent, "threshold": w.threshold, "nnz_estimate": nnz,
        "matrices_bytes": int(nbytes), "max_matrix_gb": w.max_matrix_gb, "available_bytes": w.available_bytes,
        "raised_threshold": raise_to, "raise_share": RAISE_SHARE,
    }

    def cmp(ok: bool) -> str:
        return "<=" if ok else ">"

    work = (f"calibrating {rows:,} rows x {w.num_entities:,} entities at rank {w.rank}: "
            f"~{fmt_minutes(w.eager_minutes)} at {w.gflops:.3g} GFLOP/s {w.rate_source} {cmp(time_ok)} "
            f"~{fmt_minutes(w.query_minutes)} of lazy rows for {w.expected_queries:,} expected queries "
            f"(~{w.rows_per_query:,.0f} rows each) + --max-calibrate-minutes {w.max_calibrate_minutes:g}")
    size = (f"~{nnz:,} entries ({fmt_bytes(nbytes)}) at threshold {w.threshold:g} {cmp(size_ok)} "
            f"--max-matrix-gb {w.max_matrix_gb:g}")
    if w.available_bytes is not None:
        size += f", x{EAGER_PEAK_FACTOR:g} at peak {cmp(memory_ok)} {fmt_bytes(w.available_bytes)} available"
    line = f"--matrices auto: {mode} ({work}; {size})"
    if raise_to is not None:
        line = (f"--matrices auto: eager at threshold {raise_to:.3g}, raised from {w.threshold:g} to fit "
                f"(~{round(w.raised_nnz or 0):,} entries): {w.expected_queries:,} expected queries would compute "
                f"~{w.query_rows / rows:.0%} of the {rows:,} rows lazily (>= {RAISE_SHARE:.0%}: store them); "
                f"--matrices lazy keeps threshold {w.threshold:g} ({work}; {size})")
    if machine_dependent:
        line += f"; near the time bound (margin x{margin:.2f}): --matrices {mode} pins this choice"
    return mode, record, line


def measure_calibrate_gflops(entity: np.ndarray, relation: np.ndarray, observed: np.ndarray, *, threshold: float,
                             delta: float, device: str = "cpu", seconds: float = MEASURE_SECONDS,
                             seed: int = 0) -> dict[str, Any]:
    """The useful rate (GFLOP/s) of the real calibration on this KG: :meth:`RowCalibrator.compute` on one
    chunk of sampled rows, best of up to three timed calls after a warm-up (whose first call also loads the
    compiled ops), the timed calls stopping after ``seconds`` or 5% of the whole calibration's time as the
    warm-up projects it, whichever is less (at least one timed call).

    A chunk is what the eager build computes per call (``default_chunk_rows``), on a CPU cut to
    :data:`MEASURE_FLOPS` (CUDA: not measured here, no GPU); when the warm-up took over a quarter of
    ``seconds``, fewer rows again (at least 16, the padded minimum).  Returns ``gflops``,
    ``rows`` (per call), ``runs`` and ``seconds`` (all calls, the warm-up included).
    """
    from .calibrate import _MIN_GEMM_ROWS, RowCalibrator

    t_start = time.perf_counter()
    calib = RowCalibrator(entity, relation, observed, threshold=threshold, delta=delta, device=device)
    total = calib.total_rows
    rng = np.random.default_rng(seed)
    # one build chunk, on a CPU at most MEASURE_FLOPS (FB15k-237 at rank 192: 359 of its 1,156 rows); a GPU's
    # chunk (~1 GB of scores) takes milliseconds and fewer rows would time the launch overheads
    cap = total if calib.device.startswith("cuda") else max(_MIN_GEMM_ROWS, int(MEASURE_FLOPS / calib.matmul_flops(1)))
    rows = min(calib.chunk_rows, total, cap)

    def sample(k: int) -> np.ndarray:
        return np.sort(rng.choice(total, size=k, replace=False)).astype(np.int64)

    keys = sample(rows)
    t = time.perf_counter()
    calib.compute(keys)  # warm-up: buffers, oneDNN primitives, the kernel's first touch of the tails
    first = time.perf_counter() - t
    projected = first * total / rows  # the whole calibration at the warm-up's pace
    if first > seconds / 4 and rows > _MIN_GEMM_ROWS:
        rows = max(_MIN_GEMM_ROWS, min(total, int(rows * (seconds / 4) / first)))
        keys = sample(rows)
    # never spend much more than the calibration would itself: a small KG's whole stack is one such call
    # (UMLS: 12,420 rows in ~0.07 s), so one timed call after the warm-up then
    budget = min(seconds, 0.05 * projected)
    best, runs, t_runs = float("inf"), 0, time.perf_counter()
    while runs < 3 and (runs == 0 or time.perf_counter() - t_runs < budget):
        t = time.perf_counter()
        calib.compute(keys)
        best = min(best, time.perf_counter() - t)
        runs += 1
    calib.release()
    return {"gflops": calib.matmul_flops(rows) / max(best, 1e-9) / 1e9, "rows": rows, "runs": runs,
            "seconds": round(time.perf_counter() - t_start, 3)}


def fmt_minutes(minutes: float) -> str:
    if minutes < 1:
        return f"{minutes * 60:.2g} s" if minutes * 60 < 1 else f"{minutes * 60:.1f} s"
    if minutes < 120:
        return f"{minutes:.1f} min"
    return f"{minutes / 60:,.1f} h"


def fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"
