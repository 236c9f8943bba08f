"""The ``--matrices auto`` rule (:mod:`kge.autorule`): eager or lazy at both sides of each bound, with injected
rates and sizes (no build), its one line, and the rate measurement.  A real build: tests/test_kge_build.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kge.autorule import EAGER_PEAK_FACTOR, NEAR_FACTOR, RAISE_SHARE, AutoInputs, decide, measure_calibrate_gflops

GIB = 1 << 30

#: FB15k-237's sizes (N, R with inverses, the large preset's rank 192), QTO's threshold, ~520 entries per row.
FB = AutoInputs(num_entities=14_505, num_relations=474, rank=192, gflops=100.0, nnz=3.58e9,
                rows_per_query=1 + 3.58e9 / (14_505 * 474), threshold=2e-4, max_matrix_gb=40.0,
                available_bytes=200 * GIB, max_calibrate_minutes=30.0, expected_queries=14_000)


def _rate_at_time_bound(w: AutoInputs) -> float:
    """The rate at which the eager calibration takes exactly the queries' lazy rows + --max-calibrate-minutes."""
    excess_rows = w.num_relations * w.num_entities - w.query_rows
    row_seconds = 60.0 * w.max_calibrate_minutes / excess_rows
    return 2.0 * 2 * w.rank * w.num_entities / row_seconds / 1e9


def test_time_bound_both_sides():
    w = dataclasses.replace(FB, expected_queries=1_000)  # 0.5 M of 6.9 M rows: the rate decides
    g = _rate_at_time_bound(w)
    assert decide(dataclasses.replace(w, gflops=g * (1 + 1e-9)))[0] == "eager"
    assert decide(dataclasses.replace(w, gflops=g * (1 - 1e-6)))[0] == "lazy"
    at = decide(dataclasses.replace(w, gflops=g * (1 - 1e-6)))[1]
    assert at["estimated_minutes"] == pytest.approx(at["query_minutes"] + 30.0, rel=1e-5)


def test_the_expected_queries_weigh_against_the_calibration():
    slow = dataclasses.replace(FB, gflops=1.0)  # eager would take ~1 day at 1 GFLOP/s
    assert decide(dataclasses.replace(slow, expected_queries=0))[0] == "lazy"
    # as many lazy rows as the whole stack: eager costs no more, whatever the rate
    rows = FB.num_relations * FB.num_entities
    enough = int(np.ceil(rows / FB.rows_per_query))
    assert decide(dataclasses.replace(slow, expected_queries=enough))[0] == "eager"
    assert decide(dataclasses.replace(slow, expected_queries=enough, gflops=1e-3))[0] == "eager"
    assert decide(dataclasses.replace(slow, expected_queries=enough - 1000, gflops=1e-3))[0] == "lazy"


def test_size_bound_both_sides():
    budget_entries = FB.max_matrix_gb * GIB / 8
    assert decide(dataclasses.replace(FB, nnz=budget_entries))[0] == "eager"
    mode, record, line = decide(dataclasses.replace(FB, nnz=budget_entries + 1))
    assert mode == "lazy" and record["matrices_bytes"] == 8 * (int(budget_entries) + 1)
    assert "> --max-matrix-gb 40," in line


def test_memory_bound_both_sides():
    peak = int(EAGER_PEAK_FACTOR * 8 * FB.nnz)
    assert decide(dataclasses.replace(FB, available_bytes=peak))[0] == "eager"
    mode, _, line = decide(dataclasses.replace(FB, available_bytes=peak - 1))
    assert mode == "lazy" and line.endswith(", x2.5 at peak > 66.7 GiB available)")
    mode, record, line = decide(dataclasses.replace(FB, available_bytes=None))  # unknown: not checked
    assert mode == "eager" and "available" not in line and record["available_bytes"] is None


def test_the_line_says_what_and_why_with_the_numbers():
    mode, record, line = decide(FB)
    assert mode == "eager" and "\n" not in line
    assert line == ("--matrices auto: eager (calibrating 6,875,370 rows x 14,505 entities at rank 192: ~12.8 min at "
                    "100 GFLOP/s measured <= ~13.6 min of lazy rows for 14,000 expected queries (~522 rows each) + "
                    "--max-calibrate-minutes 30; ~3,580,000,000 entries (26.7 GiB) at threshold 0.0002 <= "
                    "--max-matrix-gb 40, x2.5 at peak <= 200.0 GiB available)")
    assert record["mode"] == "eager" and record["rows"] == 6_875_370 and record["measured_gflops"] == 100.0
    assert record["expected_queries"] == 14_000 and record["rows_per_query"] == pytest.approx(521.7, abs=0.1)
    assert not record["machine_dependent"] and record["time_margin"] is None  # the queries cost more than eager
    # the defaults' FB15k-237: the eager matrices are 26.7 GiB, over the default --max-matrix-gb 1.25
    mode, _, line = decide(dataclasses.replace(FB, max_matrix_gb=1.25))
    assert mode == "lazy" and "(26.7 GiB) at threshold 0.0002 > --max-matrix-gb 1.25," in line


def test_only_a_decision_near_the_time_bound_depends_on_the_rate():
    """Far from the bound a rate half or twice the measured one picks the same mode; near it the record and
    the line say so, naming the flag that pins the mode."""
    w = dataclasses.replace(FB, expected_queries=1_000)
    g = _rate_at_time_bound(w)
    for rate in (g / 10, g / NEAR_FACTOR / 1.01, g * NEAR_FACTOR * 1.01, g * 10):
        mode, record, line = decide(dataclasses.replace(w, gflops=rate))
        assert not record["machine_dependent"] and "near the time bound" not in line
        assert {decide(dataclasses.replace(w, gflops=rate * f))[0] for f in (0.5, 1.0, 2.0)} == {mode}
    for rate, mode in ((g * 1.5, "eager"), (g / 1.5, "lazy")):
        got, record, line = decide(dataclasses.replace(w, gflops=rate))
        assert got == mode and record["machine_dependent"]
        assert record["time_margin"] == pytest.approx(rate / g, abs=1e-4)  # bound / (calibration - queries)
        assert line.endswith(f"; near the time bound (margin x{rate / g:.2f}): --matrices {mode} pins this choice")
    # a size or memory verdict does not depend on the machine's rate, however near the time bound
    _, record, _ = decide(dataclasses.replace(w, gflops=g * 1.5, max_matrix_gb=1.0))
    assert not record["machine_dependent"]


def test_measure_calibrate_gflops_times_the_real_op():
    rng = np.random.default_rng(0)
    n, r, d = 300, 6, 16
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64)
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64)
    obs = np.stack([rng.integers(0, n, 500), rng.integers(0, r, 500), rng.integers(0, n, 500)], axis=1)
    got = measure_calibrate_gflops(ent, rel, obs, threshold=2e-4, delta=1e-4, seconds=0.2)
    assert got["gflops"] > 0 and 1 <= got["runs"] <= 3
    assert 16 <= got["rows"] <= n * r  # fewer rows than one chunk: all of them, fewer if the warm-up was slow
    assert got["seconds"] < 30
    # a tiny budget still times one call
    assert measure_calibrate_gflops(ent, rel, obs, threshold=2e-4, delta=1e-4, seconds=1e-9)["runs"] == 1


#: FB15k-237 with the default --max-matrix-gb 1.25: QTO's 2e-4 keeps ~3.58 B entries (26.7 GiB), an eager build
#: raises the threshold to ~0.00125 (~168 M entries, 1.25 GiB).
FB_DEFAULT = dataclasses.replace(FB, max_matrix_gb=1.25, available_bytes=20 * GIB, raised_threshold=0.00125,
                                 raised_nnz=1.25 * GIB / 8)


def test_auto_raises_the_threshold_when_the_expected_queries_would_compute_most_rows():
    """A BetaE evaluation's 14,000 queries would compute ~90% of FB15k-237's rows lazily: eager at the raised
    threshold; a few queries: lazy at QTO's; each condition of the raise at both sides."""
    mode, record, line = decide(FB_DEFAULT)
    assert mode == "eager" and record["raised_threshold"] == 0.00125
    assert line.startswith("--matrices auto: eager at threshold 0.00125, raised from 0.0002 to fit")
    assert "--matrices lazy keeps threshold 0.0002" in line and "14,000 expected queries" in line
    rows = FB.num_relations * FB.num_entities
    share = int(np.ceil(RAISE_SHARE * rows / FB.rows_per_query))  # the fewest queries that pay for the raise
    assert decide(dataclasses.replace(FB_DEFAULT, expected_queries=share))[0] == "eager"
    mode, record, line = decide(dataclasses.replace(FB_DEFAULT, expected_queries=share - 1))
    assert mode == "lazy" and record["raised_threshold"] is None and "raised" not in line
    # no raise without a raised threshold to go to (--threshold given), or when even that does not fit
    assert decide(dataclasses.replace(FB_DEFAULT, raised_threshold=None, raised_nnz=None))[0] == "lazy"
    assert decide(dataclasses.replace(FB_DEFAULT, raised_nnz=1.25 * GIB / 8 + 1))[0] == "lazy"
    peak = int(EAGER_PEAK_FACTOR * 1.25 * GIB)
    assert decide(dataclasses.replace(FB_DEFAULT, available_bytes=peak))[0] == "eager"
    assert decide(dataclasses.replace(FB_DEFAULT, available_bytes=peak - 1))[0] == "lazy"
    # nor when the calibration takes longer than the queries and the bound: with just enough queries (half the
    # rows), eager iff E <= E/2 + 30 min, i.e. E <= 60 min
    def at_minutes(minutes: float) -> AutoInputs:
        g = 2.0 * 2 * FB.rank * FB.num_entities * rows / (60.0 * minutes * 1e9)
        return dataclasses.replace(FB_DEFAULT, expected_queries=share, gflops=g)

    assert decide(at_minutes(59.9))[0] == "eager" and decide(at_minutes(60.1))[0] == "lazy"
    assert decide(at_minutes(59.9))[1]["machine_dependent"]  # a raise decided by the rate says so too
    # matrices that fit as they are need no raise
    fits = dataclasses.replace(FB_DEFAULT, nnz=1e8)
    mode, record, _ = decide(fits)
    assert mode == "eager" and record["raised_threshold"] is None
