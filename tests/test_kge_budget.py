"""--train-minutes is kept to the batch: rank probes, epochs and validation all paid from it (issue 32, item 9).

A virtual clock replaces ``time`` in :mod:`kge.complex_n3`: every training step (probe steps included) costs
one virtual second and validation costs 0.05 s per triple ranked, so an epoch of nations (3,184 rows, batch
32: 100 steps) takes 100 s and a full validation (398 triples) 20 s, against a 30-second budget.  Nothing
sleeps: the test takes the CPU time of ~30 real nations steps and a build.
"""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from kge import Artifact
from kge import complex_n3
from kge.build import BuildConfig, build_artifact

STEP_S = 1.0
VALID_S_PER_TRIPLE = 0.05
BUDGET_MIN = 0.5


class _VirtualTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.steps = 0
        self.ranked = 0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    vt = _VirtualTime()
    train_step, tail_scores = complex_n3._train_step, complex_n3.tail_scores

    def slow_step(*args, **kwargs):
        vt.now += STEP_S
        vt.steps += 1
        return train_step(*args, **kwargs)

    def slow_scores(entity, relation, h, r, **kwargs):
        vt.now += VALID_S_PER_TRIPLE * len(h)
        vt.ranked += len(h)
        return tail_scores(entity, relation, h, r, **kwargs)

    monkeypatch.setattr(complex_n3, "time", types.SimpleNamespace(perf_counter=vt.perf_counter))
    monkeypatch.setattr(complex_n3, "_train_step", slow_step)
    monkeypatch.setattr(complex_n3, "tail_scores", slow_scores)
    monkeypatch.setattr(complex_n3, "VALID_CHUNK", 16, raising=False)
    return vt


def test_budget_cuts_the_first_epoch_and_the_validation_and_the_artifact_works(clock, tmp_path, capsys):
    """Regression: a validation ran whole past the budget (MetaQA's 6-minute build: its first epoch took
    17 minutes on a loaded machine)."""
    out = tmp_path / "nations"
    start = clock.now
    build_artifact(BuildConfig(kg="nations", out=str(out), seed=0, device="cpu",
                               train=dict(rank=8, train_minutes=BUDGET_MIN, batch_size=32, eval_max_triples=0)),
                   progress=False)
    spent = clock.now - start
    # kept to within one step and one validation chunk (16 triples)
    assert BUDGET_MIN * 60 < spent <= BUDGET_MIN * 60 + STEP_S + 16 * VALID_S_PER_TRIPLE + 1e-9, spent
    art = Artifact.load(out)  # checksums, shapes, finite values
    train = art.meta["train"]
    assert train["stop_reason"] == "time budget"
    assert train["curve"]["epoch"] == [1] and clock.steps == 31  # stopped mid-epoch: 31 of its 100 steps
    assert train["valid_cut"] == {"epoch": 1, "ranked": 16} and train["valid_triples"] == 398
    assert math.isfinite(train["best_valid_mrr"]) and 0 < train["best_valid_mrr"] <= 1
    assert np.isfinite(art.embeddings["entity"]).all()
    from engine.answer import main

    capsys.readouterr()
    assert main(["--artifact", str(out), "--query", "2p", "--top-k", "3", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(answer["answers"]) == 3


def test_the_rank_probes_are_paid_from_the_budget(clock):
    """Regression: the budget started after choose_rank's probes (7 steps at rank 32 and 7 at rank 1000)."""
    from kge.graph import load_kg
    from kge.train import TrainConfig, train_complex

    kg = load_kg("nations")
    cfg = TrainConfig(rank=None, train_minutes=BUDGET_MIN, batch_size=32, eval_max_triples=0, device="cpu")
    res = train_complex(kg, cfg, progress=False)
    spent = clock.now - 1000.0
    assert BUDGET_MIN * 60 < spent <= BUDGET_MIN * 60 + STEP_S + 16 * VALID_S_PER_TRIPLE + 1e-9, spent
    # rank 32 cannot do min_epochs (20) epochs of 100 s in 30 s, so rank 1000 is not timed at all
    assert res.metrics["probe_step_seconds"] == {"32": STEP_S} and res.config.rank == 32
    probe_steps = 5 + 2
    assert clock.steps - probe_steps == 24  # 7 s of probes, then training until the 30 s are spent
    assert res.metrics["stop_reason"] == "time budget" and res.metrics["valid_cut"] == {"epoch": 1, "ranked": 16}


def test_an_epoch_that_fits_still_stops_at_a_validation_past_the_budget(clock):
    """Budget left at an epoch's end, spent in its validation: training stops there, the epoch scored."""
    from kge.graph import load_kg
    from kge.train import default_train_config

    kg = load_kg("nations")
    # 10 steps per epoch (batch 320); a validation of 398 triples costs 19.9 s: epoch 1 ends at 10 s, its
    # validation runs past the 25-second budget after 15 s of it
    cfg = default_train_config(kg, rank=8, batch_size=320, train_minutes=25 / 60, eval_every=1, device="cpu")
    res = complex_n3.train_1n(kg, cfg, progress=False)
    assert res.metrics["stop_reason"] == "time budget"
    assert res.metrics["curve"]["epoch"] == [1] and clock.steps == 10
    assert res.metrics["valid_cut"] == {"epoch": 1, "ranked": 304}  # 19 chunks of 16: 15.2 s > 15 s left
    assert res.seconds == pytest.approx(10 + 304 * VALID_S_PER_TRIPLE)


@pytest.mark.parametrize("minutes, probed, rank", [
    (1.0, ["32"], 384),  # probing even rank 64 could cost 14 s > 6 s: step time taken as proportional to rank
    (10.0, ["32", "256"], 1000),  # 60 s pay for probing up to rank 274: 256 is timed (as fast: the line is flat)
])
def test_the_second_probe_costs_at_most_a_tenth_of_the_budget(clock, minutes, probed, rank):
    """Regression: rank 1000 was always timed (27 s a step on MetaQA on a busy box, 7 steps) however small the budget."""
    from kge.graph import load_kg

    kg = load_kg("nations")
    got, info = complex_n3.choose_rank(kg, minutes=minutes, min_epochs=5, batch_size=len(kg.train),
                                       precision="fp32", device="cpu")
    assert sorted(info["probe_step_seconds"], key=int) == probed and got == rank
    assert clock.now - 1000.0 == 7 * len(probed) * STEP_S


def _random_kge(rng, n: int, num_rel: int, edges: int, d: int = 2):
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64)
    rel = (rng.normal(size=(num_rel, d)) + 1j * rng.normal(size=(num_rel, d))).astype(np.complex64)
    obs = np.stack([rng.integers(n, size=edges), rng.integers(num_rel, size=edges), rng.integers(n, size=edges)], 1)
    return ent, rel, obs


def test_nnz_estimate_memory_is_linear_in_edges_not_relations_times_entities():
    """Issue 30: a 1M-entity, 2,000-relation build was killed at 18 GiB right after training: --matrices auto's
    nnz estimate counted observed tails for all R*N rows (16 GB of int64) and listed the rows with fewer than
    two (as large).  Here R*N = 40M (>= 640 MB that way): the estimate's numpy allocations stay within a few MB."""
    import tracemalloc

    from kge.calibrate import estimate_nnz

    ent, rel, obs = _random_kge(np.random.default_rng(0), 200_000, 200, 5_000)
    tracemalloc.start()
    try:
        est = estimate_nnz(ent, rel, obs, seed=0, num_rows=256)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert est.sampled_rows >= 128  # 128 rows without two observed tails, and the few with
    assert peak < 24 << 20, f"estimate_nnz traced peak {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("n, num_rel, edges", [(300, 7, 3_000), (50, 3, 2_000), (1_000, 40, 500), (64, 5, 10)])
def test_nnz_estimate_draws_the_rows_the_dense_counts_drew(n, num_rel, edges):
    """The O(edges) strata draw exactly the rows (and so give exactly the estimate) of the R*N counts they replace."""
    from kge.calibrate import estimate_nnz, observed_row_counts

    ent, rel, obs = _random_kge(np.random.default_rng(n), n, num_rel, edges)
    counts = observed_row_counts(obs, n, num_rel)
    rng = np.random.default_rng(0)
    expected = []
    for stratum in (np.flatnonzero(counts >= 2), np.flatnonzero(counts < 2)):
        if len(stratum):
            expected.append(np.sort(rng.choice(stratum, size=min(128, len(stratum)), replace=False)))
    rows = np.concatenate(expected)
    ref = estimate_nnz(ent, rel, obs, seed=0, num_rows=256)
    assert ref.sampled_rows == len(rows)
    # the kept probabilities of exactly those rows (softmax over all tails, times max(1, #observed tails))
    e, r = ent[rows % n], rel[rows // n]
    s = ((e * r) @ ent.conj().T).real.astype(np.float64)
    p = np.exp(s - s.max(1, keepdims=True))
    p = p / p.sum(1, keepdims=True) * np.maximum(counts[rows], 1)[:, None]
    kept = p[p >= ref.floor]
    np.testing.assert_allclose(np.sort(ref.sample_p), np.sort(kept), rtol=1e-4)
