"""LGOT: the likelihood-ratio filter, the merge, LLM answer sets through i/u/n, the executor hook, the CLI.

Unit tests drive the hook with a scripted in-process client (exact values);
the end-to-end tests run the whole bridge over real HTTP against the
simulated server (tests/_llm_server.py), including failures and cache replay.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import scipy.sparse as sp

from _llm_server import simulator  # llm_artifact: tests/conftest.py
from engine.exec.executor import Executor
from engine.lang.query import Anchor, parse
from kge.artifact import Artifact
from kgreason.errors import UserError
from llm_bridge import prompts
from llm_bridge.client import Completion, LLMFailure
from llm_bridge.lgot import (
    LGOTHook,
    LGOTSettings,
    LLMSet,
    combine_sets,
    likelihood_filter,
)
from llm_bridge.parse import Confidence
from llm_bridge.relations import RelationQuestions


# ------------------------------------------------------------------------------ pure functions
def _conf(counts: dict[str, int], n: int) -> list[Confidence]:
    return [Confidence(text=k, p=c / n, count=c, n=n, key=k.lower()) for k, c in counts.items()]


def test_filter_theta_boundary_equal_ratio_kept():
    kept, rejected = likelihood_filter(_conf({"a": 6, "b": 3, "c": 2, "z": 0}, 6), 0.5)
    assert [c.text for c in kept] == ["a", "b"]  # 3/6 = 0.5 exactly: kept
    assert [c.text for c in rejected] == ["c", "z"]
    kept, _ = likelihood_filter(_conf({"a": 6, "b": 3}, 6), 0.5 + 1e-6)
    assert [c.text for c in kept] == ["a"]
    assert likelihood_filter([], 0.3) == ([], [])
    kept, _ = likelihood_filter(_conf({"a": 1, "b": 1}, 6), 1.0)
    assert len(kept) == 2


@pytest.mark.parametrize("n", [3, 6, 7, 10])
def test_filter_every_count_ratio_at_its_boundary(n):
    # p = c/n and p_max = m/n: with theta = c/m the answer is kept, just above it is not (float rounding aside)
    for m in range(1, n + 1):
        for c in range(1, m + 1):
            conf = _conf({"top": m, "x": c}, n) if c < m else _conf({"top": m}, n)
            kept, _ = likelihood_filter(conf, c / m)
            assert conf[-1] in kept
            if c < m:
                kept, _ = likelihood_filter(conf, c / m + 1e-6)
                assert conf[-1] not in kept


def test_merge_rules_of_the_hook_path():
    """The hook merges ``alpha * p`` into a node's value by ``ValueEdit.merge`` (max, or add capped at 1):
    the scalar rule of the module doc on the real path (``lgot.merge_value``, a test-only copy, is gone)."""
    import torch

    from engine.exec.hooks import NodeValue, merge_scores

    alpha, p = 0.1, 0.8
    kg = NodeValue(torch.tensor([[0.5, 0.02, 0.97]]))
    got = {rule: merge_scores(kg, 0, [0, 1, 2], [alpha * p] * 3, source="llm", merge=rule).values[0].tolist()
           for rule in ("max", "add")}
    assert got["max"] == pytest.approx([0.5, 0.08, 0.97])
    assert got["add"] == pytest.approx([0.58, 0.1, 1.0])
    with pytest.raises(ValueError):
        merge_scores(kg, 0, [0], [alpha * p], source="llm", merge="min")


def test_combine_sets():
    a, b = LLMSet({1: 0.9, 2: 0.5, 3: 0.4}), LLMSet({2: 0.7, 3: 0.2, 4: 1.0})
    neg = LLMSet({3: 0.6}, negated=True)
    assert combine_sets("i", [a, b]) == (LLMSet({2: 0.5, 3: 0.2}), None)
    assert combine_sets("u", [a, b])[0].scores == {1: 0.9, 2: 0.7, 3: 0.4, 4: 1.0}
    assert combine_sets("i", [a, b, neg]) == (LLMSet({2: 0.5}), None)  # difference
    assert combine_sets("u", [a, neg])[0] is None
    assert combine_sets("i", [neg, neg])[0] is None
    assert combine_sets("i", [a, None]) == (None, "a sub-query has no LLM answer set")
    assert combine_sets("n", [a]) == (LLMSet(a.scores, negated=True), None)
    assert combine_sets("n", [neg]) == (LLMSet(neg.scores, negated=False), None)


def test_settings_validation():
    with pytest.raises(UserError, match="mode"):
        LGOTSettings(mode="kg")
    with pytest.raises(UserError, match="theta"):
        LGOTSettings(theta=1.5)
    with pytest.raises(UserError, match="alpha"):
        LGOTSettings(alpha=-0.1)
    with pytest.raises(UserError, match="inputs"):
        LGOTSettings(inputs=11)
    with pytest.raises(UserError, match="merge"):
        LGOTSettings(merge="min")


# --------------------------------------------------------------------- the hook, scripted client
ENTS = ["A", "B", "C", "D", "E", "F"]
RELS = ["r", "r^-1", "s", "s^-1"]
# r: A->B 1.0, A->C 0.6; s: B->D 1.0, C->E 0.5 (and the inverses)
EDGES = [(0, 0, 1, 1.0), (0, 0, 2, 0.6), (1, 2, 3, 1.0), (2, 2, 4, 0.5)]


def tiny_artifact() -> Artifact:
    rows, cols, vals = [], [], []
    n = len(ENTS)
    for h, r, t, v in EDGES:
        rows += [r * n + h, (r + 1) * n + t]
        cols += [t, h]
        vals += [v, v]
    m = sp.csr_matrix((np.array(vals, np.float32), (rows, cols)), shape=(len(RELS) * n, n))
    m.sort_indices()
    obs = np.array([[h, r, t] for h, r, t, _ in EDGES], dtype=np.int64)
    return Artifact(entities=ENTS, relations=RELS, matrices=m, observed=obs, missing=np.zeros((0, 3), np.int64))


class ScriptedClient:
    """Answers projection prompts with ``script[(relation, inputs)]`` (reply texts; None = a failure)."""

    def __init__(self, script, *, n=4):
        self.script = script
        self.n = n
        self.rq = RelationQuestions(relations=RELS)
        self.batches: list[list] = []

    def complete_many_sync(self, batch, **kw):
        self.batches.append(batch)
        out = []
        for msgs in batch:
            req = prompts.parse_projection_request(msgs)
            assert req is not None, msgs
            key = (self.rq.lookup(req.question), tuple(req.entities))
            texts = self.script.get(key, ["[]"] * self.n)
            if texts is None:
                out.append(LLMFailure("server_error", "HTTP 500: scripted", 500, 3))
                continue
            out.append(Completion(texts=tuple(texts), logprobs=(None,) * len(texts),
                                  finish_reasons=("stop",) * len(texts), prompt_tokens=10, completion_tokens=5,
                                  model="scripted", n_requested=self.n))
        return out


SCRIPT = {
    ("r", ("A",)): ['["B", "D"]', '["B", "D"]', '["B"]', '["F"]'],  # p: B 0.75, D 0.5, F 0.25
    ("s", ("B",)): ['["D"]', '["D", "E"]', "I don't know", '["D"]'],  # D 0.75, E 0.25
}


def run(queries, settings=None, script=SCRIPT, explain=True):
    art = tiny_artifact()
    client = ScriptedClient(script)
    hook = LGOTHook(client=client, artifact=art,
                    settings=settings or LGOTSettings(relation_questions="fallback"))
    ex = Executor(art, hooks=[hook], backend="reference")
    res = ex.answer([parse(q) for q in queries], k=6, explain=explain)
    return res, client, hook


def kg_only(queries):
    return Executor(tiny_artifact(), backend="reference").answer([parse(q) for q in queries], k=6)


def scores(result) -> dict[str, float]:
    return {a.entity: a.score for a in result.answers}


def test_lgot_max_merge_exact_values_and_provenance():
    (res,), client, _ = run(["(p r A)"])
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert scores(res) == {"B": 1.0, "C": f32(0.6), "D": f32(0.1 * 0.5), "F": f32(0.1 * 0.25)}
    prov = {a.entity: a.provenance for a in res.answers}
    assert prov == {"B": "both", "C": "kg", "D": "llm", "F": "llm"}
    notes = res.trace.root.notes
    llm = notes["llm"]
    assert llm["inputs"] == ["A"]
    assert llm["question"] == prompts.fill_question(prompts.fallback_template("r"), ["A"])
    assert {a["text"]: a["p"] for a in llm["answers"]} == {"B": 0.75, "D": 0.5, "F": 0.25}
    assert llm["kept"] == ["B", "D", "F"]  # F: 0.25/0.75 = 1/3 >= 0.3
    assert [l["entity"] for l in llm["linked"]] == ["B", "D", "F"] and llm["unlinked"] == []
    assert {m["entity"]: (m["kg"], m["value"]) for m in notes["merged"]} == {
        "B": (1.0, 1.0), "D": (0.0, round(f32(0.05), 6)), "F": (0.0, round(f32(0.025), 6))}
    assert len(client.batches) == 1


def test_theta_filters_before_merging():
    (res,), _, _ = run(["(p r A)"], LGOTSettings(relation_questions="fallback", theta=0.5))
    assert "F" not in scores(res)  # 0.25/0.75 < 0.5
    assert res.trace.root.notes["llm"]["kept"] == ["B", "D"]


def test_additive_merge():
    (res,), _, _ = run(["(p r A)"], LGOTSettings(relation_questions="fallback", merge="add", alpha=0.5))
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert scores(res) == {"B": 1.0, "C": f32(0.6), "D": f32(0.25), "F": f32(0.125)}


def test_llm_only_replaces_values():
    (res,), _, _ = run(["(p r A)"], LGOTSettings(relation_questions="fallback", mode="llm-only"))
    assert scores(res) == {"B": 0.75, "D": 0.5, "F": 0.25}  # C (KG only) is gone
    assert {a.provenance for a in res.answers} == {"llm"}


def test_next_prompt_uses_the_merged_top_entities():
    settings = LGOTSettings(relation_questions="fallback", inputs=3, input_ratio=0.0)
    (res,), client, _ = run(["(p s (p r A))"], settings)
    # the r node after merging: B 1.0, C 0.6, D 0.05, F 0.025 -> the top 3 feed the s question
    assert res.trace.node((0,)).notes["llm"]["inputs"] == ["A"]
    assert res.trace.root.notes["llm"]["inputs"] == ["B", "C", "D"]
    assert len(client.batches) == 2  # one call per projection node


@pytest.mark.parametrize("ratio, expected", [(0.0, ["B", "C", "D"]), (0.3, ["B", "C"]), (0.6, ["B", "C"]),
                                             (0.6 + 1e-6, ["B"]), (1.0, ["B"])])
def test_input_ratio_drops_inputs_far_below_the_best(ratio, expected):
    # the r node: B 1.0, C 0.6 (float32), D 0.05, F 0.025; C at exactly 0.6 of the best is kept at ratio 0.6
    settings = LGOTSettings(relation_questions="fallback", inputs=3, input_ratio=ratio)
    (res,), _, _ = run(["(p s (p r A))"], settings)
    assert res.trace.root.notes["llm"]["inputs"] == expected
    assert res.trace.root.notes["llm"].get("inputs_below_ratio", 0) == 3 - len(expected)  # of the top 3: B, C, D


def test_input_ratio_default_and_validation():
    assert LGOTSettings().input_ratio == 0.3
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(UserError, match="input_ratio"):
            LGOTSettings(input_ratio=bad)


# Regression (benchmarks/results/lgot/metaqa.md, "Diagnosis"): the calibrated matrices give near-zero
# predictions (J at 0.02) next to the LLM's answer B (0.25 after the merge).  Padding the next prompt with J
# made the LLM answer about J (W, every sample) as confidently as about B (G), and W outranked the gold G.
PAD_ENTS = ["A", "B", "J", "G", "W"]
PAD_RELS = ["r", "r^-1", "s", "s^-1"]


def _padded_artifact() -> Artifact:
    n = len(PAD_ENTS)
    # r: A -> J 0.02 (a weak predicted edge; the true A -> B was dropped); s: no edge
    m = sp.csr_matrix((np.array([0.02, 0.02], np.float32), ([0 * n + 0, 1 * n + 2], [2, 0])), shape=(4 * n, n))
    m.sort_indices()
    return Artifact(entities=PAD_ENTS, relations=PAD_RELS, matrices=m, observed=np.zeros((0, 3), np.int64),
                    missing=np.array([[0, 0, 1]], np.int64))


class _KnowsFacts(ScriptedClient):
    """An LLM that knows r(A) = B (half the samples) and s(B) = G, s(J) = W, answering about every input."""

    FACTS = {("r", "A"): [["B"], ["B"], [], []], ("s", "B"): [["G"], ["G"], [], ["G"]], ("s", "J"): [["W"]] * 4}

    def complete_many_sync(self, batch, **kw):
        out = []
        for msgs in batch:
            req = prompts.parse_projection_request(msgs)
            rel = RelationQuestions(relations=PAD_RELS).lookup(req.question)
            texts = [json.dumps(sorted({a for e in req.entities for a in self.FACTS.get((rel, e), [[]] * 4)[k]}))
                     for k in range(4)]
            out.append(Completion(texts=tuple(texts), logprobs=(None,) * 4, finish_reasons=("stop",) * 4,
                                  prompt_tokens=10, completion_tokens=5, model="scripted", n_requested=4))
        return out


@pytest.mark.parametrize("ratio, top, inputs", [(0.0, "W", ["B", "J"]), (0.3, "G", ["B"])])
def test_padding_the_prompt_with_near_zero_kg_predictions_lets_their_answers_win(ratio, top, inputs):
    art = _padded_artifact()
    hook = LGOTHook(client=_KnowsFacts({}), artifact=art,
                    settings=LGOTSettings(relation_questions="fallback", alpha=0.5, merge="add", input_ratio=ratio))
    (res,) = Executor(art, hooks=[hook], backend="reference").answer([parse("(p s (p r A))")], k=5, explain=True)
    assert res.trace.root.notes["llm"]["inputs"] == inputs
    assert res.answers[0].entity == top
    if ratio:
        assert [a.entity for a in res.answers] == ["G"]  # W (the answer about J) never asked for


def test_failed_row_falls_back_to_kg_only_with_a_warning():
    script = dict(SCRIPT)
    script[("r", ("C",))] = None  # the second row's call fails
    queries = ["(p r A)", "(p r C)"]
    res, client, hook = run(queries, script=script)
    assert len(client.batches) == 1 and len(client.batches[0]) == 2  # both rows in one complete_many
    assert "D" in scores(res[0])  # the other row still merged
    kg = kg_only(queries)
    assert scores(res[1]) == scores(kg[1])
    notes = res[1].trace.root.notes
    assert notes["warning"] == "LLM call failed (server_error); this row is KG-only"
    assert notes["llm"]["failed"]["reason"] == "server_error"
    assert hook.stats.failed_rows == 1


def test_identical_prompts_are_sent_once(llm_artifact, tmp_path):
    """Rows sharing a sub-question cost one request.  The hook used to collapse identical prompts itself, a
    second layer over the client's; now it passes every row's prompt and the client asks them once."""
    res, client, hook = run(["(p r A)", "(p r A)"])
    assert len(client.batches[0]) == 2 and hook.stats.prompts == 2 and hook.stats.unique_prompts == 1
    assert scores(res[0]) == scores(res[1])
    art = Artifact.load(llm_artifact)
    queries = [parse("(p likes Entity_003)")] * 2
    with simulator(llm_artifact) as srv, _client(srv.base_url, tmp_path, use_cache=False) as c:
        hook = LGOTHook(client=c, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
        res = Executor(art, hooks=[hook]).answer(queries, k=20)
        assert srv.stats["requests"] == 1 and c.stats.deduplicated == 1
        assert (hook.stats.prompts, hook.stats.unique_prompts) == (2, 1)
    assert scores(res[0]) == scores(res[1]) and res[0].answers


def test_unlinked_answers_are_reported():
    script = {("r", ("A",)): ['["B", "Nobody Known"]'] * 4}
    (res,), _, _ = run(["(p r A)"], script=script)
    llm = res.trace.root.notes["llm"]
    assert llm["kept"] == ["B", "Nobody Known"]
    assert [u["text"] for u in llm["unlinked"]] == ["Nobody Known"]


def test_intersection_and_negation_combine_llm_sets():
    script = {
        ("r", ("A",)): ['["B", "D"]'] * 4,          # {B, D}
        ("r^-1", ("B",)): ['["A", "D"]'] * 2 + ['["A"]'] * 2,  # {A: 1, D: 0.5}
        ("s", ("B",)): ['["D"]'] * 4,               # negated below: minus {D}
    }
    q = "(i (p r A) (p r^-1 B) (np s B))"
    (res,), _, _ = run([q], script=script)
    root = res.trace.root.notes["llm_set"]
    assert root["op"] == "i" and [e["entity"] for e in root["entities"]] == []  # {B,D} & {A,D} - {D}
    q2 = "(i (p r A) (np s B))"
    (res2,), _, _ = run([q2], script=script)
    assert [e["entity"] for e in res2.trace.root.notes["llm_set"]["entities"]] == ["B"]
    # LLM-only: the intersection is the LLM's set difference exactly
    (res3,), _, _ = run([q2], LGOTSettings(relation_questions="fallback", mode="llm-only"), script=script)
    assert scores(res3) == {"B": 1.0}
    # union: the LLM sets' union, merged by max where it raises the value
    (res4,), _, _ = run(["(u (p r A) (p s B))"], script=script)
    assert {e["entity"] for e in res4.trace.root.notes["llm_set"]["entities"]} == {"B", "D"}


def test_set_op_merge_raises_values_only():
    script = {("r", ("A",)): ['["D"]'] * 4, ("s", ("B",)): ['["D"]'] * 4}
    (res,), _, _ = run(["(i (p r A) (p s B))"], script=script)
    # branches: r -> D = 0.1 (LLM), s -> D = 1.0 (KG): product 0.1; the combined set {D: 1} merges 0.1: no raise
    assert scores(res)["D"] == pytest.approx(0.1)
    assert res.trace.root.evidence == {} and "merged" not in res.trace.root.notes
    script = {("r", ("A",)): ['["E"]'] * 4, ("s", ("B",)): ['["E"]'] * 4}
    (res,), _, _ = run(["(i (p r A) (p s B))"], script=script)
    # both branches only know E from the LLM: 0.1 * 0.1 = 0.01, raised to alpha * min(p) = 0.1
    assert scores(res)["E"] == pytest.approx(0.1)
    assert res.answers[0].provenance == "llm"


def test_kg_only_is_the_executor_without_the_hook():
    queries = ["(p r A)", "(p s (p r A))", "(i (p r A) (np s B))"]
    kg = kg_only(queries)
    # an LLM that never answers changes nothing
    res, _, _ = run(queries, script={})
    for a, b in zip(kg, res):
        assert [(x.entity, x.score) for x in a.answers] == [(x.entity, x.score) for x in b.answers]


# ---------------------------------------------------------------------- over HTTP (simulator)
def _client(base_url, tmp_path, **kw):
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig

    cfg = dict(base_url=base_url, cache_path=tmp_path / "cache.sqlite", n=6, timeout_s=10, backoff_s=0.01)
    cfg.update(kw)
    return LLMClient(LLMConfig(**cfg))


def _queries(art: Artifact, count: int = 12) -> list:
    """2p queries over the first anchors with at least one observed edge (deterministic)."""
    out = []
    likes = art.relation_id("likes")
    heads = sorted({int(h) for h, r, _ in art.observed if r == likes})[:count]
    for h in heads:
        out.append(parse(f"(p parent_of (p likes {art.entities[h]}))"))
        out.append(parse(f"(p likes {art.entities[h]})"))
    return out


def test_end_to_end_over_http(llm_artifact, tmp_path):
    art = Artifact.load(llm_artifact)
    queries = _queries(art)
    kg = Executor(art).answer(queries, k=20)
    with simulator(llm_artifact, recall=0.9, hallucination=0.1, seed=1) as srv, _client(srv.base_url, tmp_path) as c:
        hook = LGOTHook(client=c, artifact=art, questions_dir=str(tmp_path / "rq"))
        res = Executor(art, hooks=[hook]).answer(queries, k=20)
    missing = {(int(h), int(r), int(t)) for h, r, t in art.missing}
    provs = [a.provenance for r in res for a in r.answers]
    assert "llm" in provs and "both" in provs
    # the LLM recovered edges the KG lost: an "llm" answer of a 1p query that is a missing edge
    likes = art.relation_id("likes")
    recovered = [(q, a) for q, r in zip(queries, res) if isinstance(q.arg, Anchor)
                 for a in r.answers if a.provenance == "llm"
                 and (art.entity_id(q.arg.entity), likes, a.id) in missing]
    assert recovered
    # max-merge never lowers a KG score, and leaves every score >= alpha unchanged
    for k, r in zip(kg, res):
        got = scores(r)
        for a in k.answers:
            if a.score >= 0.1:
                assert got[a.entity] == a.score
    # each query's trace holds the parsed answers with p(e), the filter, the links and the merge
    t = res[0].to_json()["trace"]
    proj = [n for n in t["nodes"] if n["op"] == "p"]
    assert all("llm" in n["notes"] for n in proj)
    note = proj[0]["notes"]["llm"]
    assert {"question", "inputs", "answers", "kept", "linked", "unlinked", "summary"} <= set(note)
    assert hook.stats.failed_rows == 0 and hook.stats.linked > 0
    assert hook.stats.relation_questions == {"likes": "llm", "parent_of": "llm"}  # asked once each
    assert hook.questions.source("likes") == "llm"


@pytest.mark.parametrize("mode", ["status", "hang"])
def test_server_failures_fall_back_to_kg_only(llm_artifact, tmp_path, mode):
    art = Artifact.load(llm_artifact)
    queries = _queries(art, 3)
    kg = Executor(art).answer(queries, k=10)
    sim = dict(fail_rate=1.0, fail_mode=mode, fail_status=503, hang_s=1.5)
    cli = dict(max_retries=1, timeout_s=0.15, use_cache=False)  # every request fails: no reply is cut short
    with simulator(llm_artifact, **sim) as srv, _client(srv.base_url, tmp_path, **cli) as c:
        hook = LGOTHook(client=c, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
        res = Executor(art, hooks=[hook]).answer(queries, k=10)
        assert c.stats.retries > 0
    for a, b in zip(kg, res):
        assert [(x.entity, x.score) for x in a.answers] == [(x.entity, x.score) for x in b.answers]
        for node in b.trace.nodes:
            if node.op == "p" and "llm" in node.notes and "failed" in node.notes["llm"]:
                want = "timeout" if mode == "hang" else "server_error"
                assert node.notes["warning"] == f"LLM call failed ({want}); this row is KG-only"
    assert hook.stats.failed_rows > 0


def test_cli_cache_replay_with_the_server_stopped(llm_artifact, tmp_path, monkeypatch, capsys):
    from engine.answer import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with simulator(llm_artifact, recall=0.8, hallucination=0.2, seed=3) as srv:
        argv = ["--artifact", str(llm_artifact), "--expr", "(i (p likes Entity_003) (np likes Entity_004))",
                "--top-k", "5", "--json", "--llm", "--llm-base-url", srv.base_url, "--llm-model", "sim",
                "--llm-cache", str(tmp_path / "c.sqlite"), "--llm-max-retries", "0", "--llm-timeout", "5"]
        assert main(argv) == 0
        first = capsys.readouterr()
    assert main(argv) == 0  # the server is gone: everything from the cache
    second = capsys.readouterr()
    assert second.out == first.out
    out = json.loads(first.out)
    assert {a["provenance"] for a in out["answers"]} <= {"kg", "llm", "both"}
    assert any("llm" in n.get("notes", {}) for n in out["trace"]["nodes"])
    assert '"requests": 0' in second.err and '"failed_rows": 0' in second.err


def test_cli_llm_only_and_flag_errors(llm_artifact, tmp_path, capsys):
    from engine.answer import main

    base = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)"]
    assert main(base + ["--llm-theta", "0.5"]) == 2
    assert "--llm-theta needs --llm" in capsys.readouterr().err
    assert main(base + ["--llm", "--llm-theta", "2"]) == 2
    assert "--llm-theta must be in [0, 1]" in capsys.readouterr().err
    assert main(base + ["--llm", "--llm-confidence", "logprobs-first"]) == 2
    assert "needs --llm-logprobs" in capsys.readouterr().err
    with simulator(llm_artifact, recall=1.0, hallucination=0.0) as srv:
        assert main(base + ["--json", "--llm", "--llm-mode", "llm-only", "--llm-base-url", srv.base_url, "--llm-model", "sim",
                            "--llm-cache", str(tmp_path / "c.sqlite"), "--llm-relation-questions", "fallback"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answers"] and {a["provenance"] for a in out["answers"]} == {"llm"}


def test_logprob_confidence_and_budget_over_http(llm_artifact, tmp_path):
    art = Artifact.load(llm_artifact)
    queries = _queries(art, 4)
    with simulator(llm_artifact, recall=0.9, hallucination=0.1) as srv:
        with _client(srv.base_url, tmp_path, n=2, logprobs=True) as c:
            hook = LGOTHook(client=c, artifact=art,
                            settings=LGOTSettings(confidence="logprobs-first", relation_questions="fallback"))
            res = Executor(art, hooks=[hook]).answer(queries, k=10)
        ps = [a["p"] for r in res for n in r.trace.nodes if "llm" in n.notes for a in n.notes["llm"]["answers"]]
        assert ps and all(0 < p <= 1 for p in ps)
        assert any(p not in (0.5, 1.0) for p in ps)  # not count/n: the tokens' probabilities
        # a budget of 1 request: the first prompt is answered, the rest fall back (the batch still completes)
        with _client(srv.base_url, tmp_path, use_cache=False, budget_calls=1) as c:
            hook = LGOTHook(client=c, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
            res = Executor(art, hooks=[hook]).answer(queries, k=10)
    warnings = [n.notes["warning"] for r in res for n in r.trace.nodes if "warning" in n.notes]
    assert warnings and set(warnings) == {"LLM call failed (budget); this row is KG-only"}
    assert hook.stats.failed_rows == len(warnings) < hook.stats.prompts


def test_cli_text_output_is_compact(llm_artifact, tmp_path, capsys):
    from engine.answer import main

    with simulator(llm_artifact, recall=1.0, hallucination=0.0) as srv:
        assert main(["--artifact", str(llm_artifact), "--expr", "(p parent_of (p likes Entity_003))", "--top-k", "3",
                     "--llm", "--llm-base-url", srv.base_url, "--llm-model", "sim", "--llm-cache", str(tmp_path / "c.sqlite"),
                     "--llm-relation-questions", "fallback"]) == 0
    out = capsys.readouterr().out
    trace = [line for line in out[out.index("trace:"):].splitlines()[1:] if line.strip()]
    assert len(trace) == 2 and all(len(line) < 400 for line in trace)
    assert "llm: 1 input(s); " in trace[0] and "; merged " in trace[0]
    assert any(t in out for t in ("[llm]", "[both]"))


# ------------------------------------------------------------------------------ answer check (LGOT §3.3.1)
def test_answer_check_settings_validation():
    assert LGOTSettings().answer_check == 0 and LGOTSettings().check_penalty == 0.5
    for bad in (-1, 11, 2.5, True):
        with pytest.raises(UserError, match="^LGOT settings: answer_check must be (in \\[0, 10\\]|an integer), got "):
            LGOTSettings(answer_check=bad)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(UserError, match="check_penalty must be in \\[0, 1\\]"):
            LGOTSettings(check_penalty=bad)


def _with_wrong_edge(art: Artifact) -> tuple[Artifact, str, int, int]:
    """``art`` with one false ``likes`` edge (value 0.9, not in the full KG) from a head with observed likes tails."""
    likes = art.relation_id("likes")
    n = art.num_entities
    truth = {(int(h), int(t)) for h, r, t in np.concatenate([art.observed, art.missing]) if r == likes}
    head = min(h for h, _ in truth)
    wrong = next(t for t in range(n) if t != head and (head, t) not in truth)
    m = art.matrices.tolil(copy=True)
    m[likes * n + head, wrong] = 0.9
    m[(likes + 1) * n + wrong, head] = 0.9
    m = m.tocsr()
    m.sort_indices()
    bad = Artifact(entities=art.entities, relations=art.relations, matrices=m, observed=art.observed,
                   missing=art.missing)
    return bad, art.entities[head], head, wrong


def _answer(art, hook, queries):
    return Executor(art, hooks=[hook]).answer(queries, k=20, explain=True)


def test_answer_check_penalises_a_wrong_kg_answer_and_keeps_right_ones(llm_artifact, tmp_path):
    art, head_name, head, wrong = _with_wrong_edge(Artifact.load(llm_artifact))
    queries = [parse(f"(p likes {head_name})"), parse(f"(p parent_of (p likes {head_name}))")]
    with simulator(llm_artifact, recall=1.0, hallucination=0.0, noise=0.0) as srv:
        with _client(srv.base_url, tmp_path, use_cache=False) as c:
            off = LGOTHook(client=c, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
            base = _answer(art, off, queries)
            assert c.stats.calls == off.stats.prompts  # answer_check=0: no check prompt is asked
        assert off.stats.checks == 0
        assert all("check" not in n.notes for r in base for n in r.trace.nodes)
        with _client(srv.base_url, tmp_path, use_cache=False) as c:
            on = LGOTHook(client=c, artifact=art, settings=LGOTSettings(relation_questions="fallback", answer_check=10))
            res = _answer(art, on, queries)
            assert c.stats.calls == on.stats.prompts + on.stats.unique_checks
            assert c.stats.failures == 0
    assert 0 < on.stats.unique_checks <= on.stats.checks <= 10 * 3  # at most K per projection row
    before, after = scores(base[0]), scores(res[0])
    w = art.entities[wrong]
    assert before[w] == pytest.approx(0.9)
    assert after[w] == float(np.float32(np.float32(0.9) * 0.5))  # the wrong KG answer: penalised
    for e, v in before.items():  # every right answer is kept as it was
        if e != w:
            assert after[e] == v
    assert on.stats.penalised >= 1
    # provenance and explanation: the penalised answer is still a KG answer and recomputes its score
    ans = next(a for a in res[0].answers if a.entity == w)
    assert ans.provenance == "kg"
    assert ans.explanation.evidence.merge == "scale" and ans.explanation.children
    assert ans.explanation.recompute("product") == pytest.approx(ans.score, abs=1e-6)
    for r in res:
        for a in r.answers:
            assert a.explanation.recompute("product") == pytest.approx(a.score, abs=1e-6)
    # the trace: the checked entities with p_yes, which were penalised; the JSON output carries it
    node = next(n for n in res[0].trace.nodes if n.op == "p")
    note = node.notes["check"]
    assert note["question"] == node.notes["llm"]["question"]
    rec = {x["entity"]: x for x in note["entities"]}
    assert rec[w]["p_yes"] == 0.0 and rec[w]["penalised"] and rec[w]["votes"] == 6
    assert note["penalised"] == [w]
    assert all(x["p_yes"] == 1.0 and not x["penalised"] for e, x in rec.items() if e != w)
    assert len(note["entities"]) == min(10, sum(v > 0 for v in before.values()))  # the top K
    js = res[0].to_json()["trace"]
    assert any("check" in n.get("notes", {}) for n in js["nodes"])


def test_answer_check_failures_leave_scores_unchanged(llm_artifact, tmp_path):
    art, head_name, _, _ = _with_wrong_edge(Artifact.load(llm_artifact))
    queries = [parse(f"(p likes {head_name})")]
    settings = LGOTSettings(relation_questions="fallback")
    with simulator(llm_artifact, recall=1.0, hallucination=0.0) as srv:
        with _client(srv.base_url, tmp_path, model="sim") as c:  # fills the cache with the projections
            base = _answer(art, LGOTHook(client=c, artifact=art, settings=settings), queries)
    # every request now fails (503): the projections come from the cache, the checks fail
    sim = dict(fail_rate=1.0, fail_status=503)
    with simulator(llm_artifact, **sim) as srv:
        with _client(srv.base_url, tmp_path, model="sim", max_retries=1) as c:
            hook = LGOTHook(client=c, artifact=art,
                            settings=LGOTSettings(relation_questions="fallback", answer_check=3))
            res = _answer(art, hook, queries)
            assert c.stats.cache_hits == hook.stats.prompts and c.stats.failures == hook.stats.unique_checks > 0
    assert [(a.entity, a.score) for a in res[0].answers] == [(a.entity, a.score) for a in base[0].answers]
    node = next(n for n in res[0].trace.nodes if n.op == "p")
    assert node.notes["warning"] == "answer check failed (server_error) for 3 of 3 entities; their scores are unchanged"
    assert node.notes["check"]["failed"]["reasons"] == ["server_error"]
    assert node.notes["check"]["penalised"] == [] and hook.stats.failed_checks == 3 and hook.stats.penalised == 0
    assert hook.stats.failed_rows == 0


def test_cli_flags_take_lgot_settings_defaults():
    """Unset --llm-* flags give exactly LGOTSettings' defaults (one home for the bridge's defaults)."""
    from kgreason.cli import ArgumentParser
    from llm_bridge.cli import add_arguments, options_from_args
    from llm_bridge.lgot import LGOTSettings

    parser = ArgumentParser(prog="t")
    add_arguments(parser)
    opts = options_from_args(parser.parse_args(["--llm", "--llm-base-url", "http://127.0.0.1:1/v1",
                                                "--llm-model", "m"]), top_k=10)
    assert opts.settings == LGOTSettings(inputs=10)
    opts = options_from_args(parser.parse_args(["--llm", "--llm-base-url", "http://127.0.0.1:1/v1", "--llm-model",
                                                "m", "--llm-input-ratio", "0", "--llm-alpha", "0.5"]), top_k=3)
    assert opts.settings == LGOTSettings(inputs=3, input_ratio=0.0, alpha=0.5)


def test_cli_answer_check_flags(llm_artifact, tmp_path, capsys):
    from engine.answer import main

    base = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)"]
    assert main(base + ["--llm-answer-check", "3"]) == 2
    assert "--llm-answer-check needs --llm" in capsys.readouterr().err
    assert main(base + ["--llm", "--llm-answer-check", "11"]) == 2
    assert "--llm-answer-check must be in [0, 10], got 11" in capsys.readouterr().err
    assert main(base + ["--llm", "--llm-check-penalty", "1.5"]) == 2
    assert "--llm-check-penalty must be in [0, 1], got 1.5" in capsys.readouterr().err
    for bad in ("-0.1", "nan", "inf"):
        assert main(base + ["--llm", "--llm-input-ratio", bad]) == 2
        assert "--llm-input-ratio must be in [0, 1]" in capsys.readouterr().err
    assert main(base + ["--llm-input-ratio", "0.5"]) == 2
    assert "--llm-input-ratio needs --llm" in capsys.readouterr().err
    with simulator(llm_artifact, recall=1.0, hallucination=0.0) as srv:
        assert main(base + ["--json", "--llm", "--llm-base-url", srv.base_url, "--llm-model", "sim",
                            "--llm-cache", str(tmp_path / "c.sqlite"), "--llm-relation-questions", "fallback",
                            "--llm-answer-check", "2", "--llm-check-penalty", "0.25"]) == 0
    got = capsys.readouterr()
    out = json.loads(got.out)
    checks = [n["notes"]["check"] for n in out["trace"]["nodes"] if "check" in n.get("notes", {})]
    assert checks and len(checks[0]["entities"]) == 2
    assert '"checks": 2' in got.err


# ------------------------------------------------------------- empty input: the nested sub-question
CHAIN_ENTS = ["Anchor Actor", "Casablanca Nights", "Final Director", "Second Feature", "Zebra Crossing",
              "Mountain Road", "Harbor Lights"]
CHAIN_RELS = ["acted_in", "acted_in^-1", "directed_by", "directed_by^-1"]
# Full KG: Anchor Actor -acted_in-> Casablanca Nights -directed_by-> Final Director -directed_by^-1->
# {Casablanca Nights, Second Feature}.  The engine's KG only keeps Zebra Crossing's edges.
CHAIN_MISSING = [(0, 0, 1), (1, 2, 2), (3, 2, 2)]
CHAIN_OBSERVED = [(4, 2, 5), (6, 0, 4)]


def _chain_artifact(path) -> Path:
    def both(rows):
        a = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return np.concatenate([a, np.stack([a[:, 2], a[:, 1] + 1, a[:, 0]], axis=1)])

    observed, missing = both(CHAIN_OBSERVED), both(CHAIN_MISSING)
    n = len(CHAIN_ENTS)
    m = sp.csr_matrix((np.ones(len(observed), np.float32), (observed[:, 1] * n + observed[:, 0], observed[:, 2])),
                      shape=(len(CHAIN_RELS) * n, n))
    Artifact(entities=CHAIN_ENTS, relations=CHAIN_RELS, matrices=m, observed=observed, missing=missing,
             meta={"source": "tests/test_llm_lgot.py chain"}).save(path)
    return path


class _Recording:
    """An LLM client wrapper that keeps every batch of prompts it sends."""

    def __init__(self, client):
        self.client, self.config, self.sent = client, client.config, []

    def complete_many_sync(self, batch, **kw):
        self.sent += [prompts.parse_projection_request(m) for m in batch]
        return self.client.complete_many_sync(batch, **kw)


def _hidden_linker(hidden: Sequence[str]):
    """A linker that cannot link ``hidden`` names (their entities carry unrelated names): the LLM's
    answer for them does not link, as a surface form the KG does not know."""
    from llm_bridge.linking import EntityLinker

    return EntityLinker(names=[f"Qx{i} Unrelated Placeholder" if e in hidden else e for i, e in enumerate(CHAIN_ENTS)])


@pytest.mark.parametrize("mode", ["lgot", "llm-only"])
def test_empty_input_hop_is_asked_about_the_previous_question(tmp_path, mode):
    from llm_bridge.nested import unnest

    path = _chain_artifact(tmp_path / "chain")
    art = Artifact.load(path)
    q = parse('(p directed_by (p acted_in "Anchor Actor"))')
    kg = Executor(art).answer([q], k=5)[0]
    assert kg.answers == []  # the KG lost both edges: KG-only has nothing
    with simulator(path, recall=1.0, hallucination=0.0, noise=0.0) as srv, _client(srv.base_url, tmp_path) as c:
        rec = _Recording(c)
        hook = LGOTHook(client=rec, artifact=art, settings=LGOTSettings(relation_questions="fallback", mode=mode),
                        linker=_hidden_linker({"Casablanca Nights"}))
        (res,) = Executor(art, hooks=[hook]).answer([q], k=5)
    hop1 = res.trace.node((0,)).notes["llm"]
    assert hop1["kept"] == ["Casablanca Nights"] and hop1["linked"] == []
    # the unlinked answer is in the trace with its closest KG names and scores, and in the summary
    (lost,) = hop1["unlinked"]
    assert lost["text"] == "Casablanca Nights" and lost["id"] is None and lost["closest"] in CHAIN_ENTS + [
        n for n in _hidden_linker({"Casablanca Nights"}).names]
    assert '"Casablanca Nights" (closest ' in hop1["summary"] and "1 unlinked" in hop1["summary"]
    # hop 2 had an empty input and was asked anyway, about hop 1's question (which names the anchor)
    assert len(rec.sent) == 2
    second = rec.sent[1]
    assert second.entities == ["Anchor Actor"]
    assert unnest(second.question) == [prompts.fallback_template("acted_in"), prompts.fallback_template("directed_by")]
    root = res.trace.root.notes["llm"]
    assert root["inputs"] == [] and root["nested"]["previous"] == hop1["question"]
    assert hop1["question"] in root["question"] and '"Anchor Actor"' in root["question"]
    assert "no input (nested question)" in root["summary"]
    assert hook.stats.nested == 1 and hook.stats.skipped == 0
    # its linked answer is the result, from the LLM
    assert [(a.entity, a.provenance) for a in res.answers] == [("Final Director", "llm")]
    assert res.answers[0].score == pytest.approx(0.1 if mode == "lgot" else 1.0)


def test_nesting_goes_through_intersections_and_twice(tmp_path):
    """MetaQA's 3-hop shape: (i (p r3 (i (p r2 (p r1 T)) (n T))) (n T)); hops 1 and 2 find nothing that links."""
    from llm_bridge.nested import unnest

    path = _chain_artifact(tmp_path / "chain")
    art = Artifact.load(path)
    t = '"Anchor Actor"'
    q = parse(f"(i (p directed_by^-1 (i (p directed_by (p acted_in {t})) (n {t}))) (n {t}))")
    with simulator(path, recall=1.0, hallucination=0.0, noise=0.0) as srv, _client(srv.base_url, tmp_path) as c:
        rec = _Recording(c)
        hook = LGOTHook(client=rec, artifact=art, settings=LGOTSettings(relation_questions="fallback"),
                        linker=_hidden_linker({"Casablanca Nights", "Final Director"}))
        (res,) = Executor(art, hooks=[hook]).answer([q], k=5)
    assert len(rec.sent) == 3 and [r.entities for r in rec.sent] == [["Anchor Actor"]] * 3
    assert unnest(rec.sent[2].question) == [prompts.fallback_template(r)
                                            for r in ("acted_in", "directed_by", "directed_by^-1")]
    assert hook.stats.nested == 2
    # the simulator's truth of the double-nested question is {Casablanca Nights, Second Feature}; only the
    # second links (provenance "both": the (n T) exclusion is the executor's own value, counted as "kg")
    assert [(a.entity, a.provenance) for a in res.answers] == [("Second Feature", "both")]
    assert res.trace.node((0,)).notes["merged"][0]["entity"] == "Second Feature"


def test_a_row_with_nothing_to_nest_is_skipped_and_counted():
    # D has no r edge, F no s edge and the LLM knows nothing: the union is empty, and a union stands
    # for no single sub-question, so the outer hop has nothing to ask
    (res,), client, hook = run(["(p s (u (p r D) (p s F)))"], script={})
    notes = res.trace.root.notes["llm"]
    assert "no sub-question to nest" in notes["skipped"] and hook.stats.skipped == 1
    assert len(client.batches) == 2 and hook.stats.nested == 0 and res.answers == []  # the two inner hops


# ------------------------------------------------------------------ unusable replies (issue 32)
@pytest.mark.parametrize("mode", ["lgot", "llm-only"])
def test_an_unusable_reply_degrades_the_row_to_kg_only_with_a_warning(mode):
    """``[[[[...`` (1 KB) was a RecursionError out of the hook; now the row keeps its KG value."""
    script = dict(SCRIPT)
    script[("r", ("C",))] = ["[" * 1000, "[" * 1000 + "x", '{"a":' * 300, "[" * 1000]
    queries = ["(p r A)", "(p r C)"]
    res, _, hook = run(queries, script=script, settings=LGOTSettings(relation_questions="fallback", mode=mode))
    assert scores(res[1]) == scores(kg_only(queries)[1])
    notes = res[1].trace.root.notes
    assert notes["warning"] == "LLM reply unusable (no sample could be read as entity names); this row is KG-only"
    assert notes["llm"]["unusable"]["samples"] == 4 and notes["llm"]["unusable"]["first"] == "[" * 120
    assert hook.stats.unusable_rows == 1 and hook.stats.failed_rows == 0
    if mode == "lgot":
        assert "D" in scores(res[0])  # the other row still merged


def test_a_reply_with_some_usable_samples_is_used():
    script = dict(SCRIPT)
    script[("r", ("A",))] = ["[" * 1000, '["B"]', "I don't know", '["B"]']
    (res,), _, hook = run(["(p r A)"], script=script)
    assert "warning" not in res.trace.root.notes and hook.stats.unusable_rows == 0
    assert res.trace.root.notes["llm"]["answers"] == [{"text": "B", "p": 0.5, "count": 2, "n": 4}]


def test_a_parser_exception_degrades_the_row(monkeypatch):
    import llm_bridge.lgot as lgot

    def broken(text, limit=None):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(lgot, "extract_entities", broken)
    (res,), _, hook = run(["(p r A)"])
    assert scores(res) == scores(kg_only(["(p r A)"])[0])
    assert res.trace.root.notes["warning"] == \
        "LLM reply unusable (RecursionError while reading it); this row is KG-only"
    assert hook.stats.unusable_rows == 1


def test_cli_an_unusable_cached_reply_replays_without_the_server(llm_artifact, tmp_path, monkeypatch, capsys):
    """issue 32 (a): the 1 KB ``[[[[`` reply was cached, so every replay ended in the same traceback."""
    from _llm_server import chat_reply, scripted_server
    from engine.answer import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    art = Artifact.load(llm_artifact)
    query = _queries(art, 1)[1]  # (p likes X) with an observed edge: the KG has answers
    expr = f"(p likes {query.arg.entity})"
    kg = Executor(art).answer([parse(expr)], k=5)[0]
    assert kg.answers
    with scripted_server(lambda body, headers: (200, chat_reply("[" * 1000), None)) as srv:
        argv = ["--artifact", str(llm_artifact), "--expr", expr, "--top-k", "5", "--json", "--llm",
                "--llm-base-url", srv.base_url, "--llm-model", "m", "--llm-cache", str(tmp_path / "c.sqlite"),
                "--llm-max-retries", "0", "--llm-timeout", "5", "--llm-relation-questions", "fallback"]
        assert main(argv) == 0
        first = capsys.readouterr()
        assert srv.requests > 0
    assert main(argv) == 0  # the server is gone: the unusable reply replays from the cache, the same way
    second = capsys.readouterr()
    assert second.out == first.out
    out = json.loads(first.out)
    assert [(a["entity"], a["score"]) for a in out["answers"]] == [(a.entity, a.score) for a in kg.answers]
    warnings = [n["notes"].get("warning", "") for n in out["trace"]["nodes"] if "notes" in n]
    assert "LLM reply unusable (no sample could be read as entity names); this row is KG-only" in warnings
    assert '"requests": 0' in second.err and "Traceback" not in first.err + second.err
