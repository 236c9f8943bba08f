"""Filtered ranking and metrics on hand-made scores; the evaluate CLI end to end."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from engine.lang.structures import convert_negation
from engine.evaluate import main as evaluate_main
from engine.eval.metrics import EvalQuery, evaluate_queries, filtered_ranks, format_table, query_metrics, rank_batch
from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Projection


def ranks_of(scores, easy, hard):
    q = EvalQuery("1p", None, np.array(easy, dtype=np.int64), np.array(hard, dtype=np.int64))
    return rank_batch(torch.tensor([scores], dtype=torch.float32), [q])


def test_known_ranks_and_filtering():
    #          e0   e1   e2   e3   e4   e5
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    # hard answer e2: e0, e1 outrank it -> rank 3 ...
    m = ranks_of(scores, easy=[], hard=[2])["average"]
    assert m["mrr"].item() == pytest.approx(1 / 3)
    # ... unless e0 is an (easy) answer: filtered out -> rank 2
    m = ranks_of(scores, easy=[0], hard=[2])["average"]
    assert m["mrr"].item() == pytest.approx(1 / 2)
    # two hard answers e1, e3 with easy e0: e1 -> rank 1; e3 -> outranked by e2 only -> rank 2
    m = ranks_of(scores, easy=[0], hard=[1, 3])["average"]
    assert m["mrr"].item() == pytest.approx((1 + 1 / 2) / 2)
    assert m["hits@1"].item() == pytest.approx(0.5)
    assert m["hits@3"].item() == pytest.approx(1.0)
    # a worst-scored hard answer among 6 entities, nothing filtered: rank 6
    m = ranks_of(scores, easy=[], hard=[5])["optimistic"]
    assert m["mrr"].item() == pytest.approx(1 / 6) and m["hits@3"].item() == 0.0


def test_ties_rules():
    scores = [0.5, 0.0, 0.0, 0.0, 0.0, 0.9]  # hard answer e1 ties with e2, e3, e4; e5 above; e0 above
    per = ranks_of(scores, easy=[], hard=[1])
    assert per["optimistic"]["mrr"].item() == pytest.approx(1 / 3)  # 1 + 2 greater
    assert per["pessimistic"]["mrr"].item() == pytest.approx(1 / 6)  # 1 + 2 greater + 3 tied
    assert per["average"]["mrr"].item() == pytest.approx(1 / 4.5)
    # tied answers (easy or hard) are filtered, not counted as ties
    per = ranks_of(scores, easy=[2], hard=[1, 3])
    assert per["pessimistic"]["mrr"].item() == pytest.approx(1 / 4)  # e0, e5 greater + e4 tied
    # -inf scores: masked answers must not count as ties
    per = ranks_of([-math.inf, -math.inf, 1.0, -math.inf], easy=[0], hard=[1])
    assert per["optimistic"]["mrr"].item() == pytest.approx(1 / 2)
    assert per["pessimistic"]["mrr"].item() == pytest.approx(1 / 3)


def test_vectorised_matches_loop():
    rng = np.random.default_rng(0)
    b, n = 7, 50
    scores = torch.from_numpy(rng.integers(0, 6, size=(b, n)).astype(np.float32) / 5)  # many ties
    queries = []
    for _ in range(b):
        ids = rng.permutation(n)[: rng.integers(1, 12)]
        k = int(rng.integers(0, len(ids)))
        queries.append(EvalQuery("x", None, np.sort(ids[:k]), np.sort(ids[k:])))
    per = rank_batch(scores, queries)
    for i, q in enumerate(queries):
        s = scores[i].numpy()
        answers = set(q.easy.tolist()) | set(q.hard.tolist())
        non = np.array([s[e] for e in range(n) if e not in answers])
        rr = {"optimistic": [], "average": [], "pessimistic": []}
        for h in q.hard:
            gt, eq = int((non > s[h]).sum()), int((non == s[h]).sum())
            rr["optimistic"].append(1 + gt)
            rr["pessimistic"].append(1 + gt + eq)
            rr["average"].append(1 + gt + eq / 2)
        for tie, ranks in rr.items():
            ranks = np.array(ranks, dtype=float)
            assert per[tie]["mrr"][i].item() == pytest.approx(np.mean(1 / ranks))
            for k in (1, 3, 10):
                assert per[tie][f"hits@{k}"][i].item() == pytest.approx(np.mean(ranks <= k))


def test_query_metrics_padding_and_errors():
    ranks = torch.tensor([[1.0, 4.0, math.nan], [math.nan, math.nan, math.nan]], dtype=torch.float64)
    m = query_metrics(ranks)
    assert m["mrr"][0].item() == pytest.approx((1 + 0.25) / 2)
    assert math.isnan(m["mrr"][1].item())
    with pytest.raises(ValueError, match="NaN"):
        filtered_ranks(torch.tensor([[math.nan, 1.0]]), torch.zeros(1, 2, dtype=torch.bool), torch.tensor([[0]]))
    with pytest.raises(ValueError, match="shapes"):
        filtered_ranks(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 1, dtype=torch.long))


class FixedExecutor:
    """Scores each query by a fixed vector keyed by its anchor id."""

    def __init__(self, table):
        self.table = table

    def scores(self, queries, *, batch_size=1024, progress=False):
        return torch.stack([torch.tensor(self.table[q.arg.entity], dtype=torch.float32) for q in queries])


def test_evaluate_queries_averages_per_query_then_structure():
    ex = FixedExecutor({0: [0.9, 0.8, 0.7, 0.1], 1: [0.1, 0.2, 0.3, 0.4]})
    qs = [
        EvalQuery("1p", Projection(0, Anchor(0)), np.array([], np.int64), np.array([1, 3])),  # ranks 2, 3 -> filtered: 2, 2
        EvalQuery("1p", Projection(0, Anchor(1)), np.array([0], np.int64), np.array([3])),  # rank 1
        EvalQuery("2p", Projection(0, Anchor(1)), np.array([], np.int64), np.array([0])),  # rank 4
        EvalQuery("2p", Projection(0, Anchor(1)), np.array([1], np.int64), np.array([], np.int64)),  # no hard: skipped
    ]
    res = evaluate_queries(ex, qs, batch_size=1, progress=False)
    assert [r.structure for r in res] == ["1p", "2p"]
    # query 1: hard {1,3}, e1 outranked by e0 -> 2; e3 outranked by e0, e2 (e1 filtered) -> 3
    assert res[0].metrics["average"]["mrr"] == pytest.approx(((1 / 2 + 1 / 3) / 2 + 1) / 2)
    assert res[1].num_queries == 1 and res[1].metrics["optimistic"]["mrr"] == pytest.approx(1 / 4)
    table = format_table(res)
    assert "| 1p | 2 |" in table and "| mean |" in table


def test_convert_negation():
    q = Intersection((Projection(0, Anchor(1)), NegatedProjection(2, Anchor(3))))
    c = convert_negation(q, "complement")
    assert c == Intersection((Projection(0, Anchor(1)), Complement(Projection(2, Anchor(3)))))
    assert convert_negation(c, "qto") == q
    assert convert_negation(q, None) is q


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    from test_engine_eval_sampling import kg_artifact

    from engine.eval.sampling import sample_queries, write_jsonl

    d = tmp_path_factory.mktemp("eval")
    art = kg_artifact(seed=1)
    art.save(d / "a")
    qs, _ = sample_queries(art, ["1p", "2p", "2in", "up"], 8, seed=0, progress=False)
    write_jsonl(qs, d / "q.jsonl", art)
    return d


def test_cli_evaluate(sampled, capsys):
    d = sampled
    rc = evaluate_main(["--artifact", str(d / "a"), "--queries", str(d / "q.jsonl"), "--json", str(d / "r.json"),
                        "--no-progress", "--batch-size", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| 2in | 8 |" in out
    rec = json.loads((d / "r.json").read_text())
    assert [r["structure"] for r in rec["results"]] == ["1p", "2p", "2in", "up"]
    for r in rec["results"]:
        for tie in ("optimistic", "average", "pessimistic"):
            assert 0 <= r["metrics"][tie]["mrr"] <= 1
        assert r["metrics"]["optimistic"]["mrr"] >= r["metrics"]["pessimistic"]["mrr"]
    # both negation modes and a structure filter
    rc = evaluate_main(["--artifact", str(d / "a"), "--queries", str(d / "q.jsonl"), "--negation", "complement",
                        "--structures", "2in", "--limit", "5", "--no-progress"])
    assert rc == 0 and "| 2in | 5 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "give exactly one of --queries"),
        (["--queries", "Q", "--betae-queries", "x.pkl"], "give exactly one of"),
        (["--betae-queries", "x.pkl"], "needs --betae-folder"),
        (["--queries", "Q", "--structures", "2z"], "unknown query structure '2z'"),
        (["--queries", "Q", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["--queries", "/nonexistent.jsonl"], "does not exist"),
        (["--queries", "BAD"], "q_bad.jsonl:2: missing key 'hard'"),
        (["--queries", "BADNAME"], "q_badname.jsonl:1: "),
    ],
)
def test_cli_evaluate_errors(sampled, capsys, extra, message):
    d = sampled
    (d / "q_bad.jsonl").write_text((d / "q.jsonl").read_text().splitlines()[0] + "\n" + '{"structure": "1p", "expr": "x", "easy": []}\n')
    (d / "q_badname.jsonl").write_text('{"structure": "1p", "expr": "(p \\"no such rel\\" e1)", "easy": [], "hard": [1]}\n')
    subst = {"Q": str(d / "q.jsonl"), "BAD": str(d / "q_bad.jsonl"), "BADNAME": str(d / "q_badname.jsonl")}
    argv = ["--artifact", str(d / "a"), "--no-progress"] + [subst.get(x, x) for x in extra]
    rc = evaluate_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
