"""The 1-N ComplEx-N3 trainer (kge.complex_n3) against pykeen: loss, gradients, ranks, export, seeding, resume."""
from __future__ import annotations

import datetime

import numpy as np
import pytest
import torch

from kgreason.errors import UserError
from kge.complex_n3 import (
    batch_loss, choose_rank, filtered_tail_ranks, n3_penalty, resolve_precision, to_pykeen_model, train_1n,
)
from kge.graph import load_kg
from kge.train import SIZE_PRESETS, TrainConfig, complex_scores, default_train_config, train_complex


@pytest.fixture(scope="module")
def nations():
    return load_kg("nations")


def _cfg(**kw):
    base = dict(rank=8, epochs=3, lr=0.1, batch_size=128, training_loop="1n", optimizer="adagrad",
                regularizer_weight=5e-2, init_std=1e-3, eval_max_triples=0, device="cpu", precision="fp32",
                patience=0)
    base.update(kw)
    return TrainConfig(**base)


def _interleave(x: torch.Tensor) -> torch.Tensor:
    """Our ``[re | im]`` rows as pykeen's interleaved ``(re0, im0, re1, im1, ...)`` storage."""
    d = x.shape[1] // 2
    return torch.stack([x[:, :d], x[:, d:]], dim=-1).reshape(x.shape[0], 2 * d)


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[1] // 2
    y = x.reshape(x.shape[0], d, 2)
    return torch.cat([y[..., 0], y[..., 1]], dim=1)


@pytest.mark.parametrize("n,r,d,b", [(14, 110, 8, 64), (50, 6, 3, 1), (200, 20, 16, 300)])
def test_loss_and_gradients_equal_pykeen_complex_n3(seed, n, r, d, b):
    """Our real-valued loss = pykeen ComplEx ``score_t`` + pykeen's CrossEntropyLoss + N3 on complex factors."""
    from pykeen.losses import CrossEntropyLoss

    g = torch.Generator().manual_seed(seed)
    ent = (torch.randn(n, 2 * d, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    rel = (torch.randn(r, 2 * d, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    h, rr, t = torch.randint(0, n, (b,), generator=g), torch.randint(0, r, (b,), generator=g), \
        torch.randint(0, n, (b,), generator=g)
    weight = 0.05
    ours, ce, _ = batch_loss(ent, rel, h, rr, t, weight=weight, precision="fp32")
    ours.backward()

    model = to_pykeen_model(np.zeros((n, d), np.complex64), np.zeros((r, d), np.complex64)).double()
    pe = model.entity_representations[0]._embeddings.weight
    pr = model.relation_representations[0]._embeddings.weight
    with torch.no_grad():
        pe.copy_(_interleave(ent.detach()))
        pr.copy_(_interleave(rel.detach()))
    scores = model.score_t(torch.stack([h, rr], 1))  # (B, N) pykeen's own ComplEx interaction
    labels = torch.zeros_like(scores)
    labels[torch.arange(b), t] = 1.0
    theirs_ce = CrossEntropyLoss().process_lcwa_scores(predictions=scores, labels=labels)
    # N3 on the batch's complex factors (Lacroix et al. 2018): sum_k |x_k|^3, averaged over the batch
    cplx = lambda w, i: torch.view_as_complex(w[i].reshape(len(i), d, 2))  # noqa: E731
    n3 = sum(cplx(w, i).abs().pow(3).sum(-1).mean() for w, i in ((pe, h), (pr, rr), (pe, t)))
    theirs = theirs_ce + weight * n3
    theirs.backward()
    torch.testing.assert_close(ce.detach(), theirs_ce.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent.grad, _deinterleave(pe.grad), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(rel.grad, _deinterleave(pr.grad), rtol=1e-8, atol=1e-10)


def test_n3_penalty_is_complex_modulus_cubed():
    x = torch.tensor([[3.0, 0.0, 4.0, 1.0]])  # [re | im]: (3+4i, 0+1i)
    assert float(n3_penalty(x)) == pytest.approx(125.0 + 1.0)
    assert float(n3_penalty(x, x)) == pytest.approx(252.0)


def test_bf16_loss_close_to_fp32(seed):
    if resolve_precision("auto", "cpu") != "bf16":
        pytest.skip("no bf16 GEMM on this CPU")
    g = torch.Generator().manual_seed(seed)
    ent, rel = torch.randn(300, 32, generator=g) * 0.3, torch.randn(10, 32, generator=g) * 0.3
    idx = torch.randint(0, 300, (64,), generator=g), torch.randint(0, 10, (64,), generator=g), \
        torch.randint(0, 300, (64,), generator=g)
    a = batch_loss(ent, rel, *idx, weight=0.05, precision="fp32")[0]
    b = batch_loss(ent, rel, *idx, weight=0.05, precision="bf16")[0]
    assert float(b) == pytest.approx(float(a), rel=1e-2)


def test_filtered_tail_ranks_equal_pykeen_evaluator(nations, seed):
    """Our validation ranks (used for early stopping) = pykeen's filtered tail-side realistic ranks."""
    from kge.train import pykeen_link_metrics

    rng = np.random.default_rng(seed)
    n, r, d = nations.num_entities, nations.num_relations, 6
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64)
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64)
    ent[3] = ent[4]  # exact ties: realistic ranks count them half
    triples = np.asarray(nations.test)
    known = np.concatenate([nations.train, nations.valid, nations.test])
    as_real = lambda z: torch.as_tensor(np.concatenate([z.real, z.imag], 1))  # noqa: E731
    ranks = filtered_tail_ranks(as_real(ent), as_real(rel), triples, known, num_relations=r)
    theirs = pykeen_link_metrics(ent, rel, triples, known)
    assert np.mean(1 / ranks) == pytest.approx(theirs["mrr"], rel=1e-5)
    assert np.mean(ranks <= 1) == pytest.approx(theirs["hits_at_1"], abs=1e-9)
    assert np.mean(ranks <= 3) == pytest.approx(theirs["hits_at_3"], abs=1e-9)
    assert len(filtered_tail_ranks(as_real(ent), as_real(rel), triples[:0], known, num_relations=r)) == 0


def test_trained_embeddings_reproduce_pykeen_scores_and_learn(nations):
    res = train_complex(nations, _cfg(epochs=30, eval_max_triples=None, eval_every=10), progress=False)
    assert res.entity.shape == (14, 8) and res.entity.dtype == np.complex64
    model = to_pykeen_model(res.entity, res.relation)
    rng = np.random.default_rng(0)
    triples = np.stack([rng.integers(0, 14, 64), rng.integers(0, 110, 64), rng.integers(0, 14, 64)], 1)
    with torch.inference_mode():
        theirs = model.score_hrt(torch.as_tensor(triples)).numpy().ravel()
    np.testing.assert_allclose(complex_scores(res.entity, res.relation, triples), theirs, rtol=1e-4, atol=1e-5)
    # better than chance (filtered MRR of a random ranker over 14 entities is ~0.3)
    assert res.metrics["mrr"] > 0.5, res.metrics
    assert res.metrics["eval_triples"] == len(nations.missing)
    curve = res.metrics["curve"]
    assert curve["epoch"] == list(range(1, 31)) and len(curve["valid_mrr"]) == 30
    assert [x is not None for x in curve["valid_mrr"]] == [(e % 10 == 0) for e in range(1, 31)]
    assert curve["loss"][-1] < curve["loss"][0]


def test_seeded_runs_are_reproducible(nations):
    a = train_1n(nations, _cfg(seed=5), progress=False)
    b = train_1n(nations, _cfg(seed=5), progress=False)
    c = train_1n(nations, _cfg(seed=6), progress=False)
    np.testing.assert_array_equal(a.entity, b.entity)
    np.testing.assert_array_equal(a.relation, b.relation)
    assert not np.array_equal(a.entity, c.entity)


def test_resume_from_checkpoint_equals_uninterrupted_run(nations, tmp_path):
    ck = tmp_path / "run.ckpt"
    straight = train_1n(nations, _cfg(epochs=4), progress=False)
    train_1n(nations, _cfg(epochs=2, checkpoint=str(ck)), progress=False)
    assert ck.is_file()
    resumed = train_1n(nations, _cfg(epochs=4, checkpoint=str(ck)), progress=False)
    np.testing.assert_array_equal(straight.entity, resumed.entity)
    assert resumed.metrics["curve"]["epoch"] == [1, 2, 3, 4]
    assert resumed.metrics["curve"]["loss"] == straight.metrics["curve"]["loss"]


def test_bad_checkpoints_are_one_line_errors(nations, tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=r"--checkpoint .*bad.ckpt: not a readable checkpoint"):
        train_1n(nations, _cfg(checkpoint=str(bad)), progress=False)
    ck = tmp_path / "r8.ckpt"
    train_1n(nations, _cfg(epochs=1, checkpoint=str(ck)), progress=False)
    with pytest.raises(UserError, match=r"do not fit this KG at --rank 4"):
        train_1n(nations, _cfg(rank=4, checkpoint=str(ck)), progress=False)
    pickled = tmp_path / "evil.ckpt"
    torch.save({"format": 1, "x": datetime.date(2020, 1, 1)}, pickled)
    with pytest.raises(UserError, match="not a readable checkpoint"):  # weights_only refuses arbitrary objects
        train_1n(nations, _cfg(checkpoint=str(pickled)), progress=False)


def test_early_stopping_keeps_the_best_epoch(nations):
    # a huge learning rate makes the validation MRR fall after the first evaluations
    res = train_1n(nations, _cfg(epochs=40, lr=5.0, patience=2, optimizer="adam"), progress=False)
    m = res.metrics
    curve = [x for x in m["curve"]["valid_mrr"] if x is not None]
    assert m["best_valid_mrr"] == max(curve)
    if m["stop_reason"].startswith("early stop"):
        assert len(curve) < 40 and curve.index(max(curve)) == len(curve) - 3


def test_time_budget_stops_training(nations):
    res = train_1n(nations, _cfg(epochs=100000, train_minutes=0.02), progress=False)
    assert res.metrics["stop_reason"] == "time budget"
    assert res.seconds < 30


def test_choose_rank_by_timed_steps(nations):
    rank, info = choose_rank(nations, minutes=10, min_epochs=5, batch_size=64, precision="fp32", device="cpu",
                             ranks=(4, 8, 16))
    assert rank == 16 and info["rank_chosen"] == 16  # nations: milliseconds per epoch
    rank, _ = choose_rank(nations, minutes=1e-9, min_epochs=5, batch_size=64, precision="fp32", device="cpu",
                          ranks=(4, 8, 16))
    assert rank == 4  # nothing fits: the smallest


def test_presets_use_the_1n_loop(nations):
    small = default_train_config(nations)
    assert small.training_loop == "1n" and small.rank == SIZE_PRESETS["small"]["rank"]
    assert SIZE_PRESETS["large"]["rank"] is None and SIZE_PRESETS["large"]["train_minutes"] > 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(optimizer="sgd"), "optimizer of the 1n loop must be 'adagrad' or 'adam', got 'sgd'"),
        (dict(loss="softplus"), "the 1n loop trains with the softmax cross-entropy only, got loss 'softplus'"),
        (dict(precision="fp8"), "precision must be 'auto', 'bf16' or 'fp32', got 'fp8'"),
        (dict(train_minutes=0.0), "train_minutes must be a finite number > 0, got 0.0"),
        (dict(train_minutes=float("nan")), "train_minutes must be a finite number > 0, got nan"),
        (dict(rank=None), "rank may be left to the time budget only with the 1n loop and train_minutes"),
        (dict(patience=-1), "patience must be >= 0, got -1"),
        (dict(eval_every=0), "eval_every must be >= 1, got 0"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(UserError) as exc:
        _cfg(**kwargs)
    assert str(exc.value) == message


def test_build_records_the_1n_loop_and_its_curve(umls_tiny_artifact):
    """Fast twin of the slow budget build below, on the session's kge.build artifact (UMLS, rank 8, 2 epochs):
    the CLI trains with the 1n loop and records one curve point per epoch.  The time budget itself is
    test_time_budget_stops_training's, learning test_trained_embeddings_reproduce_pykeen_scores_and_learn's."""
    import json

    meta = json.loads((umls_tiny_artifact / "meta.json").read_text())
    assert meta["train_config"]["training_loop"] == "1n"
    assert meta["train"]["curve"]["epoch"] == [1, 2] and len(meta["train"]["losses"]) == 2


@pytest.mark.slow  # ~15 s of CPU (a 1-minute budget); fast twin: test_build_records_the_1n_loop_and_its_curve
def test_build_with_the_1n_loop_and_a_budget(tmp_path):
    """kge.build end to end with the default (1n) loop on UMLS: link MRR far above the old LCWA preset's 0.80."""
    from kge.build import main

    out = tmp_path / "umls"
    assert main(["--kg", "umls", "--out", str(out), "--quiet", "--train-minutes", "1"]) == 0
    import json

    meta = json.loads((out / "meta.json").read_text())
    assert meta["train_config"]["training_loop"] == "1n"
    assert meta["train"]["mrr"] > 0.85, meta["train"]
    assert meta["train"]["curve"]["epoch"][-1] == len(meta["train"]["losses"])


def test_linkpred_and_plots_clis(tmp_path, capsys):
    import json

    from kge.build import main as build_main
    from kge.linkpred import main as linkpred_main
    from experiments.train_curve import main as plots_main

    art = tmp_path / "nations"
    assert build_main(["--kg", "nations", "--out", str(art), "--quiet", "--rank", "8", "--epochs", "10"]) == 0
    capsys.readouterr()
    out = tmp_path / "lp.json"
    assert linkpred_main(["--artifact", str(art), "--kg", "nations", "--split", "test", "--json", str(out),
                          "--quiet"]) == 0
    line = capsys.readouterr().out
    m = json.loads(out.read_text())
    assert f"MRR {m['mrr']:.4f}" in line and m["eval_triples"] == len(load_kg("nations").test)
    meta = json.loads((art / "meta.json").read_text())
    assert 0 < m["mrr"] <= 1 and 0 < meta["train"]["mrr"] <= 1
    png = tmp_path / "curve.png"
    assert plots_main(["--artifact", str(art), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one-line errors: a KG the embeddings do not fit, a bad --limit
    assert linkpred_main(["--artifact", str(art), "--kg", "umls", "--quiet"]) == 2
    assert "its embeddings cover 14 entities and 110 relations, --kg umls has 135 and 92" in capsys.readouterr().err
    assert linkpred_main(["--artifact", str(art), "--kg", "nations", "--limit", "0"]) == 2
    assert "--limit must be >= 1, got 0" in capsys.readouterr().err


def test_pykeen_metrics_in_chunks_equal_one_call(nations, monkeypatch, seed):
    """pykeen_link_metrics evaluates chunks (bounded memory) and averages: the same numbers as one call.

    30 of the test triples, in chunks of 7 (five calls of pykeen's evaluator; all 402 in 58 chunks took
    ~3.3 s more CPU for the same check)."""
    import kge.train
    from kge.train import pykeen_link_metrics

    rng = np.random.default_rng(seed)
    n, r, d = nations.num_entities, nations.num_relations, 4
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64)
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64)
    known = np.concatenate([nations.train, nations.valid, nations.test])
    test = np.asarray(nations.test)[rng.permutation(len(nations.test))[:30]]
    whole = pykeen_link_metrics(ent, rel, test, known)
    monkeypatch.setattr(kge.train, "EVAL_CHUNK", 7)  # 7 does not divide 30: a short last chunk
    assert len(test) % 7
    chunked = pykeen_link_metrics(ent, rel, test, known)
    for key in ("mrr", "hits_at_1", "hits_at_3", "hits_at_10", "mrr_both"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-6), key


# --- 1-N over sampled candidates (issue 11: training that scales with N) ---------------------------------


@pytest.mark.parametrize("n,r,d,b,k", [(40, 6, 4, 16, 8), (300, 10, 8, 64, 50), (25, 3, 2, 1, 1000)])
def test_sampled_loss_is_the_softmax_over_the_candidate_set(seed, n, r, d, b, k):
    """The sampled loss = cross-entropy over {batch tails} U {k uniform draws}, deduplicated, recomputed by hand."""
    from kge.complex_n3 import sampled_batch_loss

    g = torch.Generator().manual_seed(seed)
    ent = torch.randn(n, 2 * d, generator=g, dtype=torch.float64).requires_grad_()
    rel = torch.randn(r, 2 * d, generator=g, dtype=torch.float64)
    h, rr, t = (torch.randint(0, m, (b,), generator=g) for m in (n, r, n))
    gen = torch.Generator().manual_seed(seed + 1)
    loss, ce, n3 = sampled_batch_loss(ent, rel, h, rr, t, candidates=k, weight=0.05, generator=gen, sparse=True)
    neg = torch.randint(n, (k,), generator=torch.Generator().manual_seed(seed + 1))
    cand = sorted(set(t.tolist()) | set(neg.tolist()))
    e, w = _to_c(ent.detach()), _to_c(rel)
    full = np.real((e[h.numpy()] * w[rr.numpy()]) @ np.conj(e).T)  # (b, n): every tail's score
    sub = full[:, cand]
    target = np.array([cand.index(x) for x in t.tolist()])
    logz = np.log(np.exp(sub - sub.max(1, keepdims=True)).sum(1)) + sub.max(1)
    expect = float(np.mean(logz - sub[np.arange(b), target]))
    assert float(ce.detach()) == pytest.approx(expect, rel=1e-9, abs=1e-9)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()) + 0.05 * float(n3.detach()), rel=1e-12)
    loss.backward()
    grad = ent.grad
    assert grad.is_sparse
    touched = set(grad.coalesce().indices()[0].tolist())
    assert touched == set(h.tolist()) | set(cand)  # only the rows the step read


def _to_c(x: torch.Tensor) -> np.ndarray:
    d = x.shape[1] // 2
    a = x.numpy()
    return a[:, :d] + 1j * a[:, d:]


def test_sampled_adagrad_updates_only_touched_rows(nations):
    from kge.complex_n3 import _make_optimizer, _train_step

    g = torch.Generator().manual_seed(0)
    n = nations.num_entities
    ent = (torch.randn(n, 8, generator=g) * 1e-3).requires_grad_()
    rel = (torch.randn(nations.num_relations, 8, generator=g) * 1e-3).requires_grad_()
    before = ent.detach().clone()
    opt = _make_optimizer("adagrad", [ent, rel], 0.1)
    rows = torch.as_tensor(np.array(nations.train[:3], dtype=np.int64))
    gen = torch.Generator().manual_seed(3)
    _train_step(ent, rel, opt, rows, weight=0.05, precision="fp32", candidates=2, generator=gen,
                optimizer_name="adagrad")
    changed = set(np.nonzero((ent.detach() != before).any(1).numpy())[0].tolist())
    neg = torch.randint(n, (2,), generator=torch.Generator().manual_seed(3)).tolist()
    allowed = set(rows[:, 0].tolist()) | set(rows[:, 2].tolist()) | set(neg)
    assert changed and changed <= allowed


def test_sampled_training_learns(nations):
    samp = train_1n(nations, _cfg(rank=16, epochs=20, eval_every=10, candidates=4), progress=False)
    assert samp.metrics["candidates"] == 4 and "sampled" in samp.metrics["training_loop"]
    assert samp.metrics["best_valid_mrr"] > 0.5, samp.metrics  # nations (14 entities): random ~0.25


def test_sampled_training_with_adam_uses_dense_gradients(nations):
    res = train_1n(nations, _cfg(epochs=3, candidates=4, optimizer="adam", lr=0.01), progress=False)
    assert res.metrics["curve"]["loss"][-1] < res.metrics["curve"]["loss"][0]


def test_candidates_at_least_n_is_the_full_loss(nations):
    a = train_1n(nations, _cfg(seed=2), progress=False)
    b = train_1n(nations, _cfg(seed=2, candidates=nations.num_entities), progress=False)
    np.testing.assert_array_equal(a.entity, b.entity)
    assert b.metrics["candidates"] is None


def test_sampled_resume_equals_uninterrupted_run(nations, tmp_path):
    ck = tmp_path / "s.ckpt"
    straight = train_1n(nations, _cfg(epochs=4, candidates=5), progress=False)
    train_1n(nations, _cfg(epochs=2, candidates=5, checkpoint=str(ck)), progress=False)
    resumed = train_1n(nations, _cfg(epochs=4, candidates=5, checkpoint=str(ck)), progress=False)
    np.testing.assert_array_equal(straight.entity, resumed.entity)


def test_size_classes_and_the_huge_preset():
    from kge.train import HUGE_FROM, LARGE_FROM, size_class

    assert [size_class(x) for x in (LARGE_FROM - 1, LARGE_FROM, HUGE_FROM - 1, HUGE_FROM)] == \
        ["small", "large", "large", "huge"]
    huge = SIZE_PRESETS["huge"]
    assert huge["candidates"] and huge["training_loop"] == "1n" and huge["max_rank"] and huge["rank"] is None


def test_choose_rank_respects_max_rank(nations):
    rank, _ = choose_rank(nations, minutes=10, min_epochs=5, batch_size=64, precision="fp32", device="cpu",
                          ranks=(4, 8, 16), max_rank=8, candidates=3)
    assert rank == 8


def test_own_link_metrics_equal_pykeen_tail_side(nations):
    from kge.train import own_link_metrics, pykeen_link_metrics

    res = train_1n(nations, _cfg(epochs=5), progress=False)
    held = np.asarray(nations.valid)[:200]
    known = np.concatenate([nations.train, nations.missing])
    ours = own_link_metrics(res.entity, res.relation, held, known, num_relations=nations.num_relations)
    ref = pykeen_link_metrics(res.entity, res.relation, held, known)
    for key in ("mrr", "hits_at_1", "hits_at_3", "hits_at_10"):
        assert ours[key] == pytest.approx(ref[key], abs=1e-5), key


@pytest.mark.parametrize("kwargs,message", [
    (dict(candidates=0), "candidates must be >= 1, got 0"),
    (dict(max_rank=0), "max_rank must be >= 1, got 0"),
    (dict(candidates=5, training_loop="lcwa", optimizer="adam"),
     "sampled candidates (candidates 5) need the 1n training loop, got training_loop lcwa"),
])
def test_candidate_config_errors(kwargs, message):
    with pytest.raises(UserError) as exc:
        _cfg(**kwargs)
    assert str(exc.value) == message


@pytest.mark.parametrize("candidates", [None, 48], ids=["full", "sampled"])
def test_seeded_runs_bit_identical_at_1_and_2_threads(candidates):
    """Twice at 2 threads and once at 1: the same bits (in-process twin of tests/test_kge_determinism.py).

    Rank 64 and 512-row batches make each gathered gradient 65,536 floats, where torch's CPU ``index_put_``
    (the backward of ``entity[h]``, which batch_loss used before) adds with parallel atomics.
    """
    from kge.graph import drop_edges

    kg = drop_edges(load_kg("umls"), 0.5, 0)
    cfg = _cfg(rank=64, batch_size=512, epochs=3, candidates=candidates, eval_every=3)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (2, 2, 1):
            torch.set_num_threads(threads)
            res = train_1n(kg, cfg, progress=False)
            runs.append((res.entity.tobytes(), res.relation.tobytes()))
    finally:
        torch.set_num_threads(before)
    assert runs[0] == runs[1], "two 2-thread runs differ"
    assert runs[0] == runs[2], "1-thread and 2-thread runs differ"
