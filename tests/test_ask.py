"""The KARPA ask loop (engine.exec.ask, Engine.ask, python -m engine.ask) end to end over HTTP with the
simulated planner/reasoner (experiments.simulate_ask) on a generated KG, its fallbacks, and the CLI."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from _llm_server import generate_kg, make_artifact  # noqa: F401  (tests/ is on sys.path)
from engine.exec.api import Engine
from engine.exec.ask import AskSettings, PlanReply, find_topic, path_query, question_text
from kgreason.errors import UserError

RELS = ("directed_by", "starred_actors", "written_by", "has_genre")
ENC = {"dim": 64, "seed": 1}
TEMPLATES = {
    ("starred_actors^-1", "directed_by"): "which person directed the movies starred by [{}]",
    ("directed_by^-1", "written_by"): "who wrote the films directed by [{}]",
    ("starred_actors^-1",): "what movies did [{}] act in",
    ("directed_by^-1", "has_genre"): "what genres are the movies directed by [{}]",
    ("starred_actors^-1", "starred_actors", "starred_actors^-1"): "what films star the co-actors of [{}]",
}


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    art = make_artifact(tmp_path_factory.mktemp("ask") / "artifact", drop=0.0, relations=RELS, num_entities=120)
    eng = Engine.load(art)
    return art, eng, eng.retriever(encoder="hashing", encoder_kwargs=ENC)


def gold_answers(triples, names, topic, path, exclude=True):
    rel_ids = {n: i for i, n in enumerate(names)}
    frontier = {topic}
    for s, r in enumerate(path):
        rid = rel_ids[r]
        frontier = {int(t) for h, rr, t in triples.tolist() if rr == rid and h in frontier}
        if exclude and s >= 1:
            frontier.discard(topic)
    return frontier


@pytest.fixture(scope="module")
def questions(kg):
    """(question, gold path, gold answer names): 4 topics per template with a non-empty answer set."""
    art, eng, _ = kg
    ents, rels = eng.artifact.entities, eng.artifact.relations
    obs = np.asarray(eng.artifact.observed)
    rng = np.random.default_rng(0)
    out = []
    for path, tmpl in TEMPLATES.items():
        got = 0
        for topic in rng.permutation(len(ents)).tolist():
            ans = gold_answers(obs, rels, topic, path)
            if ans and len(ans) < 40:
                out.append((tmpl.format(ents[topic]), path, sorted(ents[a] for a in ans)))
                got += 1
                if got == 4:
                    break
    return out


def write_questions(path: Path, questions) -> Path:
    path.write_text("".join(json.dumps({"question": q, "path": list(p), "answers": a}) + "\n"
                            for q, p, a in questions), encoding="utf-8")
    return path


def client_config(server, **kw):
    from llm_bridge.config import LLMConfig

    base = dict(base_url=server.base_url, model="sim", n=1, temperature=0.0, use_cache=False, max_retries=0,
                timeout_s=10.0)
    base.update(kw)
    return LLMConfig(**base)


def sim(art, questions, **ask):
    from experiments.simulate_ask import AskSimConfig, start_ask_server

    cfg = {"synonym_rate": 0.0, **ask}
    return start_ask_server(art, {q: p for q, p, _ in questions}, AskSimConfig(**cfg))


def run_loop(kg, questions, server, *, reasoner=True, **settings):
    from llm_bridge.client import LLMClient
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner

    _, eng, ret = kg
    with LLMClient(client_config(server)) as client:
        return eng.ask([q for q, _, _ in questions], planner=LLMPlanner(client),
                       reasoner=LLMReasoner(client) if reasoner else None, retriever=ret, **settings)


# ------------------------------------------------------------------------------ pieces
def test_topic_from_brackets_words_and_linker():
    names = ["Tom Hanks", "Cast Away", "The Terminal", "Big"]
    assert find_topic("what did [Tom Hanks] star in", names) == (0, "brackets")
    assert find_topic("what did [tom  hanks] star in", names) == (0, "brackets")
    assert find_topic("who directed the terminal?", names) == (2, "words")
    i, why = find_topic("what did [Tom Hank] star in", names)
    assert i is None and "no entity name" in why
    assert find_topic("what did [Tom Hank] star in", names, linker=lambda s: 0) == (0, "linked")
    assert find_topic("nothing here", names)[0] is None
    assert question_text("what did [Tom Hanks] star in") == "what did star in"


def test_path_query_matches_the_metaqa_converter():
    from engine.eval.metaqa import question_node
    from engine.lang.query import to_sexpr

    for rels in (["a"], ["a", "b"], ["a", "b", "c"]):
        assert to_sexpr(path_query("T", rels)) == to_sexpr(question_node("T", rels, exclude_topic=True))
        assert to_sexpr(path_query("T", rels, exclude_topic=False)) == to_sexpr(question_node("T", rels, exclude_topic=False))


def test_settings_are_checked():
    with pytest.raises(UserError, match=r"^--k must be >= 1, got 0$"):  # the flag's words, from code too
        AskSettings(k=0)
    with pytest.raises(UserError, match="pathfinding"):
        AskSettings(mode="dfs")
    with pytest.raises(UserError, match="yaml"):
        AskSettings(context="xml")


def test_engine_ask_keeps_one_asker_per_settings(kg, questions, monkeypatch):
    """Issue 31: Engine.ask built a new Asker (enumeration, path embeddings, kind texts) per call; now one per
    (retriever, settings, verbalizer, exemplars), and the answers are the same as a fresh one's."""
    import engine.exec.ask as ask_mod

    art, _, ret = kg
    eng = Engine.load(art)  # an engine of its own: the module's fixture engine may hold Askers already
    built = []

    class Counting(ask_mod.Asker):
        def __init__(self, *a, **kw):
            built.append(kw.get("settings"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(ask_mod, "Asker", Counting)
    texts = [q for q, _, _ in questions[:4]]
    first = [r.to_json() for r in eng.ask(texts, retriever=ret, vote_paths=4)]
    again = [r.to_json() for r in eng.ask(texts, retriever=ret, vote_paths=4)]
    assert len(built) == 1
    for d in first + again:
        d.pop("seconds")
    assert first == again
    eng.ask(texts[:1], retriever=ret, vote_paths=2)  # other settings: another Asker, the first one kept
    eng.ask(texts[:1], retriever=ret, vote_paths=4)
    assert [s.vote_paths for s in built] == [4, 2]


# ------------------------------------------------------------------------------ embedding-only
def test_embedding_only_answers_are_the_best_paths_executor_answers(kg, questions):
    _, eng, ret = kg
    res = eng.ask([q for q, _, _ in questions], retriever=ret, vote_paths=1)
    for r, (q, _, _) in zip(res, questions):
        assert r.error is None and r.retrieval == "embedding" and r.llm_calls == 0
        assert 1 <= len(r.paths) <= 16
        assert [p.cost for p in r.paths] == sorted(p.cost for p in r.paths)
        best = next(p for p in r.paths if p.answers)
        # The answers are the executor's on that path's query (topic excluded), with path and provenance.
        ref = eng.answer(path_query(r.topic_id, best.relations), k=10)[0]
        assert [(a.id, a.score) for a in r.answers] == [(a.id, a.score) for a in ref.answers if a.id != r.topic_id][:10]
        for a in r.answers:
            assert a.path == best.names and a.selected_by == "best-path" and a.provenance == "kg"
            assert a.explanation is not None and abs(a.explanation.recompute("product") - a.score) < 1e-5
        assert json.loads(json.dumps(r.to_json()))["answers"][0]["path"] == list(best.names)


def reference_vote(eng, r, paths, temperature, n=10):
    """The vote of engine.exec.ask.vote_ranking written out over the executor's full answer lists."""
    used = [i for i, p in enumerate(r.paths) if p.answers][:paths]
    c0 = min(r.paths[i].cost for i in used)
    vote, first = {}, {}
    for k, i in enumerate(used):
        w = float(np.exp(-(r.paths[i].cost - c0) / temperature))
        got = eng.answer(path_query(r.topic_id, r.paths[i].relations), k=eng.artifact.num_entities, explain=False)
        for a in got[0].answers:
            if a.id != r.topic_id:
                vote[a.id] = vote.get(a.id, 0.0) + w * a.score
                first.setdefault(a.id, (i, a.score))
    order = sorted(vote, key=lambda e: (-round(vote[e], 9), first[e][0], -first[e][1], e))[:n]
    return order, first


@pytest.mark.parametrize("paths, temperature", [(16, 0.05), (4, 0.5), (2, 10.0)])
def test_embedding_only_answers_are_the_candidate_paths_vote(kg, questions, paths, temperature):
    _, eng, ret = kg
    res = eng.ask([q for q, _, _ in questions], retriever=ret, vote_paths=paths, vote_temperature=temperature)
    for r in res:
        order, first = reference_vote(eng, r, paths, temperature)
        assert [a.id for a in r.answers] == order
        for a in r.answers:
            i, score = first[a.id]  # the best-ranked voting path that reaches it, its score there
            assert a.selected_by == "vote" and a.path == r.paths[i].names and a.path_rank == i + 1
            assert a.score == pytest.approx(score, abs=1e-6) and a.provenance == "kg"
            assert a.explanation is not None and abs(a.explanation.recompute("product") - a.score) < 1e-5
        assert any(t["step"] == "vote" for t in r.trace)


def test_vote_ranking_matches_brute_force_on_random_scores(seed):
    from engine.exec.ask import vote_ranking

    rng = np.random.default_rng(seed)
    for _ in range(50):
        P, N = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        S = rng.choice([0.0, 0.25, 0.5, 1.0], size=(P, N), p=[0.6, 0.1, 0.1, 0.2]).astype(np.float32)
        costs = np.sort(rng.choice([0.1, 0.2, 0.35], size=P))
        t, n = float(rng.choice([0.05, 0.3, 2.0])), int(rng.integers(1, 12))
        w = [np.exp(-(c - costs.min()) / t) for c in costs]
        vote = {e: sum(w[i] * float(S[i, e]) for i in range(P)) for e in range(N)}
        first = {e: next((i for i in range(P) if S[i, e] > 0), P) for e in range(N)}
        ref = sorted((e for e in range(N) if vote[e] > 0),
                     key=lambda e: (-round(vote[e], 9), first[e], -float(S[first[e], e]), e))[:n]
        ents, f = vote_ranking(S, costs, t, n)
        assert ents.tolist() == ref and f.tolist() == [first[e] for e in ref]
    ents, f = vote_ranking(np.zeros((2, 5), np.float32), [0.1, 0.2], 0.05, 3)
    assert ents.tolist() == [] and f.tolist() == []


def test_vote_settings_are_checked():
    for bad in (0, 0.0, -1.0, True, 1000.0):
        with pytest.raises(UserError, match="--vote-temperature must be"):
            AskSettings(vote_temperature=bad)
    with pytest.raises(UserError, match="--vote-paths must be"):
        AskSettings(vote_paths=0)
    for name in ("pick_vote", "empty_variants"):
        with pytest.raises(UserError, match="must be true or false, got 'yes'"):
            AskSettings(**{name: "yes"})


# ------------------------------------------------------------------------------ over HTTP
def test_paraphrased_plans_retrieve_the_gold_path_and_answer_right(kg, questions):
    server = sim(kg[0], questions, exact_replan=False)
    try:
        res = run_loop(kg, questions, server, replan=False, llm_decides=True)
        stats = dict(server.llm.counts)
    finally:
        server.stop()
    assert stats == {"plan": len(questions), "reason": len(questions)}
    for r, (q, path, gold) in zip(res, questions):
        assert r.retrieval == "plan" and not r.warnings, (q, r.warnings)
        # The plan was paraphrased (not the relation names), yet the gold path is retrieved first.
        assert all(step not in kg[1].artifact.relations for step in r.plans[0]), r.plans
        assert r.paths[0].names == path, (q, r.plans, [p.names for p in r.paths[:3]])
        assert r.answers and all(a.entity in gold for a in r.answers)
        assert all(a.selected_by == "llm" and a.path == path for a in r.answers)
        assert r.llm_calls == 2 and r.llm_tokens > 0


def test_replanning_names_candidate_relations(kg, questions):
    server = sim(kg[0], questions)
    try:
        res = run_loop(kg, questions, server, llm_decides=True)
    finally:
        server.stop()
    for r, (q, path, gold) in zip(res, questions):
        rounds = [t for t in r.trace if t["step"] == "plan"]
        assert [t["round"] for t in rounds] == [1, 2]
        assert r.plans == [path]  # round 2 named the relations exactly
        assert r.paths[0].names == path and r.answers[0].entity in gold
        assert r.llm_calls == 3


def test_wrong_reasoning_picks_another_path(kg, questions):
    server = sim(kg[0], questions, reason_error=1.0)
    try:  # plan variants off: some of them have no answers on this KG, and a pick of one falls back
        res = run_loop(kg, questions, server, plan_variants=0, llm_decides=True)
    finally:
        server.stop()
    for r, (_, path, _) in zip(res, questions):
        assert r.paths[0].names == path
        assert r.answers and r.answers[0].path != path and r.answers[0].selected_by == "llm"


@pytest.mark.parametrize("failure, warning", [
    ("unknown", "names no relation of the KG"),
    ("empty", "no usable plan"),
    ("malformed", "malformed planner reply"),
])
def test_bad_plans_degrade_to_embedding_only_with_a_warning(kg, questions, failure, warning):
    server = sim(kg[0], questions, **{failure: 1.0})
    try:
        res = run_loop(kg, questions, server, reasoner=False)
    finally:
        server.stop()
    _, eng, ret = kg
    base = eng.ask([q for q, _, _ in questions], retriever=ret)
    for r, b in zip(res, base):
        assert r.retrieval == "embedding"
        assert any(warning in w for w in r.warnings), r.warnings
        assert [p.names for p in r.paths] == [p.names for p in b.paths]
        assert [a.id for a in r.answers] == [a.id for a in b.answers]


def test_timeouts_degrade_to_embedding_only(kg, questions):
    from llm_bridge.client import LLMClient
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner
    from experiments.simulate import SimulatorConfig
    from experiments.simulate_ask import AskSimConfig, start_ask_server

    few = questions[:3]
    server = start_ask_server(kg[0], {q: p for q, p, _ in few}, AskSimConfig(),
                              SimulatorConfig(fail_rate=1.0, fail_mode="hang", hang_s=5.0))
    try:
        with LLMClient(client_config(server, timeout_s=0.3)) as client:
            res = kg[1].ask([q for q, _, _ in few], planner=LLMPlanner(client), reasoner=LLMReasoner(client),
                            retriever=kg[2])
    finally:
        server.stop()
    for r in res:
        assert r.retrieval == "embedding" and r.answers
        assert any("timeout" in w for w in r.warnings), r.warnings
        assert any(w.startswith("reason") for w in r.warnings)
        assert all(a.selected_by == "vote" for a in r.answers)


def test_a_raising_or_misbehaving_planner_degrades(kg, questions):
    _, eng, ret = kg

    class Broken:
        def plan(self, requests):
            raise ConnectionError("boom")

    class Odd:
        def plan(self, requests):
            return [PlanReply(plans=((), ("a", "b", "c", "d"), (3,), ("",))) for _ in requests]

    qs = [q for q, _, _ in questions[:2]]
    for planner, warning in ((Broken(), "planner failed: ConnectionError: boom"), (Odd(), "empty plan")):
        res = eng.ask(qs, planner=planner, retriever=ret)
        for r in res:
            assert r.retrieval == "embedding" and any(warning in w for w in r.warnings), r.warnings
    res = eng.ask(qs, planner=Odd(), retriever=ret)
    assert any("more than max_hops=3" in w for w in res[0].warnings)


@pytest.mark.parametrize("n", [0, 2, 5])
def test_embedding_candidates_follow_the_planned_paths(kg, questions, n):
    """A planner that names a wrong relation: the reasoner sees the planned candidates first, then, when the
    best embedding-only path of the plan's length is not among them, exactly the ``n`` best embedding-only
    paths of that length not among them, in embedding-only order (``n = 0``: plans only)."""
    from engine.exec.ask import Asker

    _, eng, ret = kg
    q, gold, _ = questions[0]
    seen = []

    class Wrong:
        def plan(self, requests):
            return [PlanReply(plans=(("has_genre",) * len(gold),)) for _ in requests]

    class Spy:
        def reason(self, requests):
            seen.extend(requests)
            return [ReasonReply(paths=(len(r.paths),)) for r in requests]

    from engine.exec.ask import ReasonReply

    asker = Asker(eng, ret, settings=AskSettings(embedding_candidates=n, explain=False, llm_decides=True))
    res = asker.ask([q], planner=Wrong(), reasoner=Spy())[0]
    assert res.retrieval == "plan"
    planned = [p for p in res.paths if p.source == "plan"]
    extra = [p.relations for p in res.paths if p.source == "embedding"]
    assert planned and res.paths[: len(planned)] == planned  # planned candidates first
    same = [x for _, x in asker.embedding_retrieve([res.topic_id], [question_text(q)])[0] if len(x) == len(gold)]
    planned_set = {p.relations for p in planned}
    ref = [] if not same or same[0] in planned_set else [x for x in same if x not in planned_set][:n]
    assert extra == ref
    if n:
        assert ref, "the wrong plan should disagree with the wording here"
    assert [p.relations for p in seen[0].paths] == [p.names for p in res.paths]
    if n:  # the reasoner's pick of the last (an embedding) path gives its answers
        assert res.answers[0].path == res.paths[-1].names and res.answers[0].selected_by == "llm"


def has_answers(eng, topic, rels):
    got = eng.answer(path_query(topic, rels), k=2, explain=False)[0]
    return any(a.id != topic for a in got.answers)


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("n", [0, 3, 1000])
def test_plan_variants_replace_one_step_and_follow_the_planned_paths(kg, questions, n, empty):
    """A 2- or 3-step plan with one wrong step: after the planned candidates come its one-step variants
    (every other relation at one position), the ``n`` cheapest by the embedding-only cost, which with
    ``n`` large includes the gold path; those without answers only with ``empty_variants`` (else listed in
    the trace); 1-step plans get none (their retrieval holds every relation of the topic already)."""
    from engine.exec.ask import Asker, ReasonReply

    _, eng, ret = kg
    names = list(eng.artifact.relations)
    for q, gold, _ in questions:
        wrong = list(gold)
        wrong[-1] = next(x for x in names if x != gold[-1])

        class Wrong:
            def plan(self, requests):
                return [PlanReply(plans=(tuple(wrong),)) for _ in requests]

        class First:
            def reason(self, requests):
                return [ReasonReply(paths=(1,)) for _ in requests]

        asker = Asker(eng, ret, settings=AskSettings(plan_variants=n, empty_variants=empty, explain=False,
                                                     llm_decides=True))
        res = asker.ask([q], planner=Wrong(), reasoner=First())[0]
        var = [p for p in res.paths if p.source == "plan-variant"]
        dropped = [t["dropped_without_answers"] for t in res.trace if t["step"] == "variants"]
        if len(gold) < 2 or n == 0:
            assert not var and not dropped
            continue
        planned = {p.relations for p in res.paths if p.source != "plan-variant"}
        ids = [names.index(x) for x in wrong]
        ref = [tuple(ids[:j] + [x] + ids[j + 1:]) for j in range(len(ids)) for x in range(len(names)) if x != ids[j]]
        ref = [v for v in dict.fromkeys(ref) if v not in planned]
        cost = asker.score_sequences([ref], [question_text(q)])[0]
        want = [ref[j] for j in sorted(range(len(ref)), key=lambda j: (cost[j], ref[j]))[:n]]
        shown = [v for v in want if empty or has_answers(eng, res.topic_id, v)]
        assert [p.relations for p in var] == shown
        assert all(p.answers for p in var) or empty
        assert dropped == ([[[names[x] for x in v] for v in want if v not in shown]] if len(shown) < len(want) else [])
        if var:
            assert res.paths[-len(var):] == var  # after the planned candidates
        if n >= len(ref):  # the gold path (it has answers) is shown
            assert tuple(names.index(x) for x in gold) in {p.relations for p in res.paths}


def reference_pick_vote(eng, r, chosen, paths, temperature, n=10):
    """AskSettings.pick_vote written out: the entities the chosen paths (0-based) reach, by the vote of the
    chosen paths (each weighing as the cheapest candidate) and the first ``paths`` candidates with answers."""
    used = list(dict.fromkeys(chosen + [i for i, p in enumerate(r.paths) if p.answers][:paths]))
    costs = [r.paths[i].cost for i in used]
    costs = [min(costs)] * len(chosen) + costs[len(chosen):]
    vote, first = {}, {}
    for k, i in enumerate(used):
        w = float(np.exp(-(costs[k] - min(costs)) / temperature))
        got = eng.answer(path_query(r.topic_id, r.paths[i].relations), k=eng.artifact.num_entities, explain=False)
        for a in got[0].answers:
            if a.id != r.topic_id and a.score > 0:
                vote[a.id] = vote.get(a.id, 0.0) + w * a.score
                first.setdefault(a.id, (i, a.score))
    reach = [e for e in vote if first[e][0] in chosen]
    order = sorted(reach, key=lambda e: (-round(vote[e], 9), used.index(first[e][0]), -first[e][1], e))[:n]
    return order, first


@pytest.mark.parametrize("paths, temperature", [(16, 0.1), (3, 0.5)])
def test_a_picked_paths_answers_are_ordered_by_the_candidates_vote(kg, questions, paths, temperature, seed):
    """A reasoner's pick of paths alone: the answers are the entities those paths reach, ordered by the vote
    of the candidate paths (pick_vote), each carrying the first chosen path that reaches it; pick_vote off:
    the chosen paths' answers by their own scores (the behaviour before)."""
    from engine.exec.ask import ReasonReply

    _, eng, ret = kg
    rng = np.random.default_rng(seed)
    picks: dict[str, tuple[int, ...]] = {}

    class Random:
        def reason(self, requests):
            out = []
            for req in requests:
                k = int(rng.integers(1, 3))
                picks[req.question] = tuple(int(x) + 1 for x in rng.choice(len(req.paths), min(k, len(req.paths)),
                                                                            replace=False))
                out.append(ReasonReply(paths=picks[req.question]))
            return out

    texts = [q for q, _, _ in questions]
    settings = dict(retriever=ret, vote_paths=paths, vote_temperature=temperature, explain=True, llm_decides=True)
    res = eng.ask(texts, reasoner=Random(), **settings)
    for r in res:
        chosen = list(dict.fromkeys(i - 1 for i in picks[r.question]))
        if not any(r.paths[i].answers for i in chosen):  # nothing usable picked: the plain vote, with a warning
            assert [a.id for a in r.answers] == reference_vote(eng, r, paths, temperature)[0]
            assert any("picked nothing usable" in w for w in r.warnings)
            continue
        order, first = reference_pick_vote(eng, r, chosen, paths, temperature)
        assert [a.id for a in r.answers] == order and order
        for a in r.answers:
            i, score = first[a.id]
            assert a.selected_by == "llm" and a.path == r.paths[i].names and a.path_rank == i + 1
            assert a.score == pytest.approx(score, abs=1e-6)
            assert a.explanation is not None and abs(a.explanation.recompute("product") - a.score) < 1e-5
        assert any(t["step"] == "vote" and t.get("chosen") == [i + 1 for i in chosen] for t in r.trace)
    picks_before = dict(picks)

    class Same:
        def reason(self, requests):
            return [ReasonReply(paths=picks_before[req.question]) for req in requests]

    for r in eng.ask(texts, reasoner=Same(), pick_vote=False, **settings):
        chosen = list(dict.fromkeys(picks_before[r.question]))
        if not any(r.paths[i - 1].answers for i in chosen):
            continue
        merged = sorted(((a.score, i, a.id) for i in chosen for a in r.paths[i - 1].answers),
                        key=lambda t: (-t[0], t[1], t[2]))
        ref = list(dict.fromkeys(e for _, _, e in merged))[:10]
        assert [a.id for a in r.answers] == ref and all(a.selected_by == "llm" for a in r.answers)


def test_unknown_topic_is_an_error_in_the_result_not_a_traceback(kg):
    _, eng, ret = kg
    r = eng.ask("who directed [No Such Movie]", retriever=ret)
    assert r.error is not None and "No Such Movie" in r.error and not r.answers


# ------------------------------------------------------------------------------ CLI
def cli(argv):
    from engine.ask import parse_args, run

    out, err = io.StringIO(), io.StringIO()
    run(parse_args(argv), out, err)
    return out.getvalue(), err.getvalue()


def test_cli_single_question_and_batch_with_hits(kg, questions, tmp_path):
    art = str(kg[0])
    q, path, gold = questions[0]
    out, _ = cli(["--artifact", art, "--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC), q])
    assert out.startswith(f"question: {q}\n") and "retrieval: embedding" in out and "candidate paths:" in out
    qfile = write_questions(tmp_path / "q.jsonl", questions)
    out, err = cli(["--artifact", art, "--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC),
                    "--questions", str(qfile), "--json"])
    rows = [json.loads(l) for l in out.splitlines()]
    assert len(rows) == len(questions) and rows[0]["gold"] == gold
    summary = json.loads(err.split("ask: ", 1)[1])
    hits = np.mean([bool(r["answers"]) and r["answers"][0]["entity"] in r["gold"] for r in rows])
    assert summary["hits@1"] == round(float(hits), 4) and summary["questions"] == len(questions)


def test_cli_with_the_simulated_llm_over_http(kg, questions, tmp_path):
    server = sim(kg[0], questions)
    try:
        qfile = write_questions(tmp_path / "q.jsonl", questions)
        from engine.ask import main

        import contextlib

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["--artifact", str(kg[0]), "--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC),
                       "--questions", str(qfile), "--llm", "--llm-base-url", server.base_url, "--llm-model", "sim",
                       "--no-llm-cache", "--context", "lists", "--show-context", "--llm-decides"])
    finally:
        server.stop()
    assert rc == 0
    summary = json.loads(err.getvalue().split("ask: ", 1)[1])
    assert summary["hits@1"] == 1.0 and summary["llm_calls_per_question"] == 3.0
    assert "context:" in out.getvalue() and "retrieval: plan" in out.getvalue()


@pytest.mark.parametrize("argv, message", [
    ([], "give a question or --questions"),
    (["q", "--questions", "f"], "exactly one"),
    (["   "], "the question is empty"),
    (["q", "--k", "0"], "--k must be >= 1"),
    (["q", "--max-hops", "9"], "--max-hops must be in [1, 6], got 9"),
    (["q", "--encoder-kwargs", "{"], "--encoder-kwargs: not JSON"),
    (["q", "--llm-base-url", "http://x/v1"], "--llm-base-url needs --llm"),
    (["q", "--no-llm-reasoner"], "--no-llm-reasoner needs --llm"),
    (["q", "--context", "xml"], "invalid choice"),
])
def test_cli_bad_input_is_one_error_line(argv, message, capsys):
    from engine.ask import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--llm-temperature", "0.5"], ["--llm-n", "3"], ["--llm-json", "schema"],
                                   ["--llm-logprobs"]])
def test_cli_llm_flags_the_loop_does_not_use_are_refused(flags, capsys, monkeypatch):
    """Issue 31: engine.ask took --llm-temperature, --llm-n, --llm-json (and --llm-logprobs) and ignored them
    (its planner and reasoner ask for one reply at temperature 0, with their own --llm-ask-json): now one
    error line naming the flag and why, before anything is loaded."""
    from engine.ask import main, parse_args

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["q", "--llm", *flags]) == 2
    err = capsys.readouterr().err
    from engine.ask import UNUSED_LLM_FLAGS

    assert err == f"error: {flags[0]} is not used by engine.ask: {UNUSED_LLM_FLAGS[flags[0]]}\n", err
    assert main(["q", *flags]) == 2  # without --llm: the rule of every --llm CLI comes first
    assert capsys.readouterr().err == f"error: {flags[0]} needs --llm\n"
    # the flags the loop does use still parse into the client's config
    cfg = parse_args(["q", "--llm", "--llm-max-tokens", "96", "--llm-timeout", "5", "--no-llm-cache"])
    assert (cfg.llm.max_tokens, cfg.llm.timeout_s, cfg.llm.use_cache) == (96, 5.0, False)


def test_cli_bad_questions_file_and_unknown_topic(kg, tmp_path, capsys):
    from engine.ask import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok [Entity_001]"}\n{"question": 3}\n', encoding="utf-8")
    enc = ["--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC)]
    assert main(["--artifact", str(kg[0]), *enc, "--questions", str(bad)]) == 2
    assert f"{bad}:2: 'question' must be non-empty text, got 3" in capsys.readouterr().err
    assert main(["--artifact", str(kg[0]), *enc, "who is [Nobody Here]"]) == 2
    assert "error: question: [Nobody Here] is no entity name" in capsys.readouterr().err


def test_simulator_questions_file_errors(kg, tmp_path):
    from experiments.simulate_ask import load_gold

    p = tmp_path / "g.jsonl"
    p.write_text('{"question": "a", "path": ["directed_by", "direcVted_by"]}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"g.jsonl:1.*direcVted_by"):
        load_gold(p, kg[1].artifact.relations)
    p.write_text('{"question": "a"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"g.jsonl:1: missing key 'path'"):
        load_gold(p)
    # one reader with engine.ask --exemplars (kgreason.files.read_json_objects): the same words
    from engine.exec.ask import read_exemplars

    for line, message in [('["a"]', "expected a JSON object"), ("{", "not JSON"), ('{"path": ["x"]}', "missing key 'question'"),
                          ("[" * 100_000 + "]" * 100_000, "not JSON (nested too deeply)"),
                          ('{"question": "a", "path": []}', "'path' must be a non-empty list of relation names")]:
        p.write_text("\n" + line + "\n", encoding="utf-8")
        for load in (load_gold, read_exemplars):
            with pytest.raises(UserError, match=f"g.jsonl:2: {re.escape(message)}"):
                load(p)


def test_reachable_sequences_equal_karpa_h_enumeration(kg, seed):
    from engine.exec.ask import Asker

    _, eng, ret = kg
    asker = Asker(eng, ret)
    rng = np.random.default_rng(seed)
    for topic in rng.integers(0, len(eng.artifact.entities), 10).tolist():
        for hops in (1, 2, 3):
            got, cut = asker.reachable_sequences(topic, hops)
            ref, ref_cut = ret._enumerate(topic, hops)
            assert got == ref and cut == ref_cut == False  # noqa: E712


def test_embedding_costs_are_karpa_h_costs_plus_the_length_penalty(kg, questions):
    from engine.exec.ask import Asker, AskSettings

    _, eng, ret = kg
    q, _, _ = questions[0]
    topic = eng.ask(q, retriever=ret).topic_id
    for lam in (0.0, 0.1):
        asker = Asker(eng, ret, settings=AskSettings(length_penalty=lam, k=1000, length_prior=0.0,
                                                     answer_type_weight=0.0, lexical_weight=0.0))
        text = question_text(q)
        got = asker.embedding_retrieve([topic], [text])[0]
        seqs, _ = ret._enumerate(topic, 3)
        ref = {x: float(c) + lam * (len(x) - 1) for x, c in zip(seqs, ret.sequence_costs(seqs, text))}
        assert {x for _, x in got} == set(ref)
        for c, x in got:
            assert abs(c - ref[x]) < 1e-9


def test_reasoner_named_answers_and_bad_path_numbers(kg, questions):
    from engine.exec.ask import ReasonReply

    _, eng, ret = kg
    q, _, _ = questions[0]
    base = eng.ask(q, retriever=ret)
    second = next(p for p in base.paths[1:] if p.answers)
    rank = base.paths.index(second) + 1
    pick = second.answers[-1].entity
    seen = []

    class Named:
        count_tokens = staticmethod(lambda text: len(text.split()))

        def reason(self, requests):
            seen.extend(requests)
            return [ReasonReply(paths=(rank, 99), answers=(pick.upper(), "Not An Entity"), calls=1, tokens=7)
                    for _ in requests]

    r = eng.ask(q, reasoner=Named(), retriever=ret, max_context_tokens=60, llm_decides=True)
    assert len(seen[0].context.split()) <= 60 and seen[0].style == "yaml"
    assert [a.entity for a in r.answers] == [pick] and r.answers[0].path_rank == rank
    assert r.answers[0].selected_by == "llm" and r.llm_calls == 1 and r.llm_tokens == 7
    assert any("[99] out of range" in w for w in r.warnings)
    assert any("not among the candidates' tails, e.g. 'Not An Entity'" in w for w in r.warnings)


def test_plan_and_reason_replies_parse_leniently_and_fail_clearly():
    from llm_bridge.karpa_loop import parse_plan_reply, parse_reason_reply

    assert parse_plan_reply('```json\n[["a", "b"], ["c"]]\n```') == (("a", "b"), ("c",))
    assert parse_plan_reply('Sure! ["a", "b"] is the path.') == (("a", "b"),)
    assert parse_plan_reply('{"plans": [["a"]]}') == (("a",),)
    assert parse_reason_reply('{"paths": [2], "answers": ["X"]}') == ((2,), ("X",))
    assert parse_reason_reply("[1, 3]") == ((1, 3), ())
    for bad, msg in (("no json here", "no JSON"), ('{"p": 1}', "without 'plans'"), ('[["a", 3]]', "plan 1")):
        with pytest.raises(ValueError, match=msg):
            parse_plan_reply(bad)
    with pytest.raises(ValueError, match="neither paths nor answers"):
        parse_reason_reply('{"paths": []}')


def test_an_exact_plan_is_a_candidate_even_without_kg_edges(kg):
    _, eng, ret = kg
    art = eng.artifact
    obs = np.asarray(art.observed)
    rid = art.relations.index("has_genre^-1")
    topic = next(e for e in range(len(art.entities)) if not np.any((obs[:, 0] == e) & (obs[:, 1] == rid)))

    class Exact:
        def plan(self, requests):
            return [PlanReply(plans=(("has_genre^-1",),)) for _ in requests]

    r = eng.ask(f"which movies have the genre [{art.entities[topic]}]", planner=Exact(), retriever=ret,
                replan=False, llm_decides=True)
    assert r.retrieval == "plan"
    hit = [p for p in r.paths if p.names == ("has_genre^-1",)]
    assert hit and hit[0].cost == 0.0 and hit[0].num_tails == 0 and not hit[0].answers


def test_simulate_ask_cli_process_serves_engine_ask(kg, questions, tmp_path):
    import re
    import subprocess
    import sys
    import time

    from _llm_server import ROOT

    qfile = write_questions(tmp_path / "q.jsonl", questions[:4])
    cmd = [sys.executable, "-m", "experiments.simulate_ask", "--artifact", str(kg[0]), "--questions", str(qfile),
           "--port", "0", "--synonym-rate", "0"]
    import os

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, line = time.monotonic() + 60, ""
        while time.monotonic() < deadline and not line and proc.poll() is None:
            line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        assert m is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
        from engine.ask import parse_args, run
        from llm_bridge.client import LLMClient
        from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner

        cfg = parse_args(["--artifact", str(kg[0]), "--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC),
                          "--questions", str(qfile), "--json", "--llm", "--llm-base-url", m.group(1),
                          "--llm-model", "sim", "--no-llm-cache", "--llm-decides"])
        buf, ebuf = io.StringIO(), io.StringIO()
        with LLMClient(cfg.llm) as client:
            run(cfg, buf, ebuf, planner=LLMPlanner(client), reasoner=LLMReasoner(client))
        rows = [json.loads(l) for l in buf.getvalue().splitlines()]
        assert [r["paths"][0]["relations"] for r in rows] == [list(p) for _, p, _ in questions[:4]]
        assert json.loads(ebuf.getvalue().split("ask: ", 1)[1])["hits@1"] == 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("argv, message", [
    (["--questions", "q.jsonl"], "--artifact"),
    (["--artifact", "{art}", "--questions", "{q}", "--plan-error", "2"], "--plan-error must be in [0, 1]"),
    (["--artifact", "{art}", "--questions", "{missing}"], "missing.jsonl"),
])
def test_simulate_ask_cli_bad_input(kg, questions, tmp_path, capsys, argv, message):
    from experiments.simulate_ask import main

    q = write_questions(tmp_path / "q.jsonl", questions[:2])
    argv = [a.format(art=kg[0], q=q, missing=tmp_path / "missing.jsonl") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_sequence_embeddings_are_cached_on_disk(kg, questions):
    from engine.exec.ask import Asker
    from engine.paths import PathRetriever

    _, eng, ret = kg
    texts = [question_text(q) for q, _, _ in questions[:3]]
    topics = [eng.ask(q, retriever=ret).topic_id for q, _, _ in questions[:3]]
    first = Asker(eng, ret).embedding_retrieve(topics, texts)
    fresh = PathRetriever.from_artifact(eng.artifact, encoder="hashing", encoder_kwargs=ENC)
    asker = Asker(eng, fresh)
    assert asker._sequence_cache_path().is_file()
    again = asker.embedding_retrieve(topics, texts)
    # Only the questions were encoded, and the answer-type and kind terms' short texts (answer phrases, the
    # fixed question-word centre, one range text and one kind text per relation); no path text.
    from engine.exec.ask import WH_CENTRE, answer_phrase, kind_phrase

    short = ({answer_phrase(t) for t in texts} | {kind_phrase(t, asker.settings.kind_words) for t in texts}
             | set(WH_CENTRE) | set(asker.kind_texts())
             | {asker.range_text(r) for r in range(len(fresh.graph.relation_names))}) - {""}
    assert fresh.encoder.misses == len(set(texts) | short)
    assert [[(round(c, 9), x) for c, x in f] for f in first] == [[(round(c, 9), x) for c, x in f] for f in again]


def _follows_engine(tmp_path):
    """A 6-person KG with one relation, ``follows``, and its inverse: every person has both directions."""
    import scipy.sparse as sp

    from kge.artifact import Artifact

    people = [f"p{i}" for i in range(6)]
    relations = ["follows", "follows^-1"]
    fwd = np.array([[i, 0, (i + 1) % 6] for i in range(6)] + [[i, 0, (i + 3) % 6] for i in range(3)])
    observed = np.concatenate([fwd, fwd[:, [2, 1, 0]] + [0, 1, 0]])
    n = len(people)
    m = sp.csr_matrix((np.ones(len(observed), np.float32), (observed[:, 1] * n + observed[:, 0], observed[:, 2])),
                      shape=(len(relations) * n, n))
    Artifact(entities=people, relations=relations, matrices=m, observed=observed,
             missing=np.zeros((0, 3), np.int64), meta={"source": "generated:test_ask"}).save(tmp_path / "follows")
    return Engine.load(tmp_path / "follows")


def test_verbalized_paths_pick_the_inverse_relation_asked_in_words(tmp_path):
    """"Who follows [p1]?" asks ``follows^-1``.  Read as names, ``follows`` is nearer to the question than
    ``inverse of follows`` and wins (wrong answers); read as relation questions (the fallback templates,
    "Who or what follows {entity}?" for the inverse) the inverse wins and the answers are p1's followers."""
    from llm_bridge.prompts import fallback_template

    eng = _follows_engine(tmp_path)
    ret = eng.retriever(encoder="hashing", encoder_kwargs=ENC)
    question = "Who or what follows [p1]?"
    # the best path's answers (vote_paths=1): the vote would add other paths' answers after p0
    old = eng.ask(question, retriever=ret, max_hops=2, explain=False, vote_paths=1)
    new = eng.ask(question, retriever=ret, max_hops=2, explain=False, verbalizer=fallback_template, vote_paths=1)
    assert new.answers[0].entity == eng.ask(question, retriever=ret, max_hops=2, explain=False,
                                            verbalizer=fallback_template).answers[0].entity
    assert old.paths[0].names == ("follows",)
    assert new.paths[0].names == ("follows^-1",)
    followers = {"p0"}  # p0 -> p1 is the only edge into p1
    assert {a.entity for a in new.answers} == followers
    assert not {a.entity for a in old.answers} & followers

    from engine.exec.ask import Asker

    asker = Asker(eng, ret, settings=AskSettings(max_hops=2), verbalizer=fallback_template)
    rel = {n: i for i, n in enumerate(eng.artifact.relations)}
    assert asker.path_text((rel["follows^-1"], rel["follows"])) == \
        "Who or what follows ? Who or what does them follow?"
    with pytest.raises(UserError, match="no \\{entity\\} slot"):
        Asker(eng, ret, verbalizer=lambda name: name).path_text((0,))


def test_verbalized_costs_are_centred_cosines_plus_the_length_penalty(kg, questions):
    """Reference: each path's text from the verbalizer, both embeddings minus the mean of the relations'
    1-hop texts, then 1 − cos + penalty, recomputed here with the encoder alone."""
    from engine.exec.ask import Asker
    from llm_bridge.prompts import fallback_template

    _, eng, ret = kg
    q, _, _ = questions[1]
    topic = eng.ask(q, retriever=ret).topic_id
    asker = Asker(eng, ret, settings=AskSettings(length_penalty=0.05, k=1000, length_prior=0.0, answer_type_weight=0.0,
                                                 lexical_weight=0.0),
                  verbalizer=fallback_template)
    text = question_text(q)
    got = asker.embedding_retrieve([topic], [text])[0]
    names = eng.artifact.relations

    def verbal(seq):
        return " ".join(" ".join(fallback_template(names[x]).replace("{entity}", "them" if i else "")
                                 for i, x in enumerate(seq)).split())

    def unit(v):
        return v / np.linalg.norm(v)

    enc = ret.encoder
    mu = np.mean(enc.encode([verbal((r,)) for r in range(len(names))]).astype(np.float64), axis=0)
    qv = unit(enc.encode([text])[0].astype(np.float64) - mu)
    seqs, _ = ret._enumerate(topic, 3)
    assert {x for _, x in got} == set(seqs)
    for c, x in got:
        pv = unit(enc.encode([verbal(x)])[0].astype(np.float64) - mu)
        assert abs(c - (1.0 - float(pv @ qv) + 0.05 * (len(x) - 1))) < 1e-9


@pytest.mark.parametrize("qi", [0, 2, 4])
def test_answer_type_and_length_prior_terms_match_a_reference(kg, questions, qi):
    """Reference, recomputed from the triples and the encoder alone: cost = the zero-shot cost
    + (length_penalty + length_prior * (pivot - question words)) * (hops - 1)
    - weight * cos(answer phrase - mean(WH_CENTRE), range text of the last relation, centred over relations)."""
    from collections import Counter

    from engine.exec.ask import WH_CENTRE, Asker, answer_phrase

    _, eng, ret = kg
    q, _, _ = questions[qi]
    topic = eng.ask(q, retriever=ret).topic_id
    text = question_text(q)
    base = Asker(eng, ret, settings=AskSettings(k=1000, length_prior=0.0, answer_type_weight=0.0, length_penalty=0.0))
    new = Asker(eng, ret, settings=AskSettings(k=1000, length_prior=0.03, length_pivot=5, answer_type_weight=0.6,
                                               length_penalty=0.02, range_examples=3))
    zero = {x: c for c, x in base.embedding_retrieve([topic], [text])[0]}
    got = {x: c for c, x in new.embedding_retrieve([topic], [text])[0]}
    assert set(got) == set(zero)

    def unit(v):
        return v / np.linalg.norm(v, axis=-1, keepdims=True)

    obs = np.unique(np.asarray(eng.artifact.observed), axis=0)  # duplicate triples are one edge
    ents = eng.artifact.entities
    n_rel = len(ret.graph.relation_names)
    assert list(ret.graph.relation_names) == list(eng.artifact.relations)  # inverses are relations of their own
    ranges = []
    for r in range(n_rel):
        counts = Counter(obs[obs[:, 1] == r][:, 2].tolist())
        top = sorted(counts, key=lambda t: (-counts[t], t))[:3]
        ranges.append(", ".join(ents[t] for t in top))
    enc = ret.encoder
    have = [i for i, t in enumerate(ranges) if t]
    R = np.zeros((n_rel, enc.encode(["x"]).shape[1]))
    X = enc.encode([ranges[i] for i in have]).astype(np.float64)
    R[have] = unit(X - X.mean(axis=0))
    wh = unit(enc.encode(list(WH_CENTRE)).astype(np.float64)).mean(axis=0)
    a = unit(enc.encode([answer_phrase(text)])[0].astype(np.float64) - wh)
    words = len(text.split())
    for x, c in got.items():
        ref = zero[x] + (0.02 + 0.03 * (5 - words)) * (len(x) - 1) - 0.6 * float(R[x[-1]] @ a)
        assert abs(c - ref) < 1e-9, (x, c, ref)


def test_answer_phrase_and_new_settings_validation():
    from engine.exec.ask import answer_phrase

    assert answer_phrase("[X] appears in which movies") == "which movies"
    assert answer_phrase("What year was released") == "What year was"
    assert answer_phrase("what sort of movie is") == "what sort of"
    assert answer_phrase("the film was directed by who") == "who"
    assert answer_phrase("describe in a few words") == "describe in a"
    assert answer_phrase("") == ""
    for bad in (dict(length_prior=-0.1), dict(length_prior=2.0), dict(answer_type_weight=-1.0),
                dict(answer_type_weight=True), dict(length_pivot=-1), dict(range_examples=0)):
        with pytest.raises(UserError, match="^--" + next(iter(bad)).replace("_", "-") + " must be"):
            AskSettings(**bad)


# ------------------------------------------------------------------------------ exemplars (kNN path vote)
def test_exemplars_pick_the_path_zero_shot_scoring_misses(tmp_path):
    """Read as relation names, "Who or what follows [p1]?" is nearer to ``follows`` than to ``inverse of
    follows`` (wrong answers, see the verbalizer test above); two labelled questions of the same wording
    about other people with the path ``follows^-1`` make the exemplar vote pick p1's followers."""
    from engine.exec.ask import Asker

    eng = _follows_engine(tmp_path)
    ret = eng.retriever(encoder="hashing", encoder_kwargs=ENC)
    question = "Who or what follows [p1]?"
    zero = eng.ask(question, retriever=ret, max_hops=2, explain=False)
    exemplars = [("Who or what follows [p4]?", ["follows^-1"]), ("who or what follows [p2]", ["follows^-1"]),
                 ("whom does [p3] follow", ["follows"])]
    sup = eng.ask(question, retriever=ret, max_hops=2, explain=False, exemplars=exemplars)
    assert zero.paths[0].names == ("follows",)
    assert sup.paths[0].names == ("follows^-1",)
    assert {a.entity for a in sup.answers} == {"p0"}  # p0 -> p1 is the only edge into p1

    # Reference: cost = zero-shot cost - weight * mean of the k best exemplar cosines of the path.
    topic = zero.topic_id
    text = question_text(question)
    settings = AskSettings(max_hops=2, k=1000, exemplar_weight=0.7, exemplar_k=2)
    base = dict((x, c) for c, x in Asker(eng, ret, settings=settings).embedding_retrieve([topic], [text])[0])
    got = Asker(eng, ret, settings=settings, exemplars=exemplars).embedding_retrieve([topic], [text])[0]
    enc = ret.encoder

    def unit(v):
        return v / np.linalg.norm(v)

    qv = unit(enc.encode([text])[0].astype(np.float64))
    rel = {n: i for i, n in enumerate(eng.artifact.relations)}
    for c, x in got:
        cos = sorted((float(unit(enc.encode([question_text(q)])[0].astype(np.float64)) @ qv)
                      for q, p in exemplars if tuple(rel[n] for n in p) == x), reverse=True)[:2]
        vote = float(np.mean(cos)) if cos else 0.0
        assert abs(c - (base[x] - 0.7 * vote)) < 1e-9


@pytest.mark.parametrize("verbal", [False, True])
def test_no_exemplars_leaves_costs_bit_identical(kg, questions, verbal):
    from engine.exec.ask import Asker
    from llm_bridge.prompts import fallback_template

    _, eng, ret = kg
    v = fallback_template if verbal else None
    texts = [question_text(q) for q, _, _ in questions[:4]]
    topics = [eng.ask(q, retriever=ret).topic_id for q, _, _ in questions[:4]]
    s = AskSettings(k=1000)
    ref = Asker(eng, ret, settings=s, verbalizer=v).embedding_retrieve(topics, texts)
    assert Asker(eng, ret, settings=s, verbalizer=v, exemplars=[]).embedding_retrieve(topics, texts) == ref
    ex = [(q, list(p)) for q, p, _ in questions]
    off = AskSettings(k=1000, exemplar_weight=0.0)
    assert Asker(eng, ret, settings=off, verbalizer=v, exemplars=ex).embedding_retrieve(topics, texts) == ref
    assert Asker(eng, ret, settings=s, verbalizer=v, exemplars=ex).embedding_retrieve(topics, texts) != ref


@pytest.mark.parametrize("line, message", [
    ('{"question": "who directed [x]"}', ":2: missing key 'path'"),
    ('{"question": "who directed [x]", "path": ["directed_byy"]}', ":2: unknown relation 'directed_byy'"),
    ('{"question": "who", "path": ["directed_by"]', ":2: not JSON"),
    ('["who", ["directed_by"]]', ":2: expected a JSON object"),
    ('{"question": "who", "path": []}', ":2: 'path' must be a non-empty list"),
])
def test_cli_bad_exemplars_file_is_one_error_line(kg, questions, tmp_path, capsys, line, message):
    from engine.ask import main

    bad = tmp_path / "ex.jsonl"
    bad.write_text('{"question": "what films did [x] direct", "path": ["directed_by^-1"]}\n' + line + "\n",
                   encoding="utf-8")
    enc = ["--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC)]
    assert main(["--artifact", str(kg[0]), *enc, "--exemplars", str(bad), questions[0][0]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}{message}") and err.count("\n") == 1 and "Traceback" not in err


def test_cli_exemplars_and_settings(kg, questions, tmp_path):
    from engine.exec.ask import Asker

    art = str(kg[0])
    ex = tmp_path / "ex.jsonl"
    ex.write_text("".join(json.dumps({"question": q, "path": list(p)}) + "\n" for q, p, _ in questions),
                  encoding="utf-8")
    q, path, gold = questions[0]
    out, _ = cli(["--artifact", art, "--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC),
                  "--exemplars", str(ex), "--json", q])
    row = json.loads(out)
    assert tuple(row["paths"][0]["relations"]) == path
    with pytest.raises(UserError, match="--exemplar-weight must be"):
        AskSettings(exemplar_weight=-1.0)
    with pytest.raises(UserError, match="--exemplar-k must be"):
        AskSettings(exemplar_k=0)
    _, eng, ret = kg
    with pytest.raises(UserError, match="exemplar 1: unknown relation 'nope'"):
        Asker(eng, ret, exemplars=[("q", ["nope"])])


def test_metaqa_runner_dev_questions_use_the_weak_labels(tmp_path):
    """experiments.metaqa_ask --split dev: labelled dev questions (dev.txt only) of the hop count, a seeded
    sample kept in file order, errors naming the file; candidate_stats counts what the reasoner was shown."""
    from types import SimpleNamespace

    import experiments.metaqa_ask as mod
    (tmp_path / "2-hop").mkdir()
    lines = [f"who directed the films of [E{i}]\tA{i}|B{i}" for i in range(30)]
    (tmp_path / "2-hop" / "dev.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    labels = tmp_path / "labels.jsonl"
    labelled = {i: ["starred_actors^-1", "directed_by"] for i in range(0, 30, 3)}
    labelled[1] = ["directed_by"]  # a 1-step label on a 2-hop question: left out
    labels.write_text("".join(json.dumps({"question": lines[i].split("\t")[0], "path": p, "hops": len(p)}) + "\n"
                              for i, p in labelled.items()), encoding="utf-8")
    every = mod.dev_questions(tmp_path, labels, 2, 0, seed=100)
    assert [q.question for q in every] == [lines[i].split("\t")[0] for i in range(0, 30, 3)]
    assert every[0].relations == ("starred_actors^-1", "directed_by") and every[0].answers == ("A0", "B0")
    some = mod.dev_questions(tmp_path, labels, 2, 4, seed=100)
    keep = np.sort(np.random.default_rng(102).choice(10, 4, replace=False))
    assert some == [every[i] for i in keep]
    with pytest.raises(UserError, match="no 3-hop dev question"):
        (tmp_path / "3-hop").mkdir()
        (tmp_path / "3-hop" / "dev.txt").write_text(lines[0] + "\n", encoding="utf-8")
        mod.dev_questions(tmp_path, labels, 3, 0, seed=100)
    labels.write_text('{"question": "x"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"labels.jsonl:1: missing key 'path'"):
        mod.dev_questions(tmp_path, labels, 2, 0, seed=100)

    def path(names, answers):
        return SimpleNamespace(names=names, answers=[SimpleNamespace(entity=a) for a in answers])

    res = [SimpleNamespace(paths=[path(("a",), ["x"]), path(("b",), ["y"])], answers=[SimpleNamespace(selected_by="llm")]),
           SimpleNamespace(paths=[path(("c",), [])], answers=[SimpleNamespace(selected_by="vote")])]
    st = mod.candidate_stats(res, [("b",), ("c",)], [{"y"}, {"z"}])
    assert st == {"gold_shown": 1.0, "gold_first": 0.5, "first_path_hits": 0.0, "by_llm": 0.5, "candidates": 1.5}


def test_metaqa_report_keeps_history_rows_in_the_tables_not_the_plot(tmp_path, monkeypatch):
    """experiments.metaqa_ask --report: rows marked "history" are listed (and marked) in the tables, left out of the plot."""
    import matplotlib.axes

    import experiments.metaqa_ask as mod
    row = {"llm_calls": 0.0, "tokens": 0.0, "seconds": 0.01, "fallbacks": 1.0}
    runs = [{"hops": h, "method": m, "hits@1": 0.5, **row, **({"history": True} if m == "old" else {})}
            for h in (1, 2) for m in ("new", "old")]
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"label": "L", "artifact": "a", "per_hop": 2, "runs": runs}), encoding="utf-8")
    labels = []
    real_bar = matplotlib.axes.Axes.bar

    def bar(self, *args, **kw):
        labels.append(kw.get("label"))
        return real_bar(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", bar)
    mod.report([str(f)], tmp_path / "t.md", tmp_path / "p.png")
    md = (tmp_path / "t.md").read_text(encoding="utf-8")
    assert "| new | 1 | 50.0 |" in md and "| old (history) | 2 | 50.0 |" in md
    assert labels == ["new"] and (tmp_path / "p.png").stat().st_size > 0


class _CountingExecutor:
    """Wraps an executor: counts how often each query (by its S-expression with names) is run, through any of
    the executor's entry points (``answer``, ``scores``, ``iter_scores``)."""

    def __init__(self, inner, artifact):
        from collections import Counter

        self.inner, self.artifact, self.runs = inner, artifact, Counter()

    def _count(self, queries):
        from engine.lang.query import named, to_sexpr

        for q in queries:
            self.runs[to_sexpr(named(q, self.artifact))] += 1

    def answer(self, queries, **kw):
        self._count(queries)
        return self.inner.answer(queries, **kw)

    def scores(self, queries, **kw):
        self._count(queries)
        return self.inner.scores(queries, **kw)

    def iter_scores(self, queries, **kw):
        self._count(queries)
        return self.inner.iter_scores(queries, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_vote_weighs_every_candidate_on_one_scale(kg, questions):
    """Issue 31: with a plan the vote mixed the retriever's plan costs (>= 0) with the plan variants' and
    embedding paths' embedding-only costs (below 0 where the kind and lexical terms weigh in), so a variant
    could outweigh the plan by exp(cost gap / 0.1).  Every candidate now carries its embedding-only cost
    (one scale, whatever its source) and the vote weighs by it; without a plan it is the cost itself."""
    from engine.exec.ask import Asker, vote_ranking

    _, eng, ret = kg
    q, gold, _ = questions[0]

    class Gold:
        def plan(self, requests):
            return [PlanReply(plans=(tuple(gold),)) for _ in requests]

    asker = Asker(eng, ret, settings=AskSettings(explain=False, embedding_candidates=2))
    res = asker.ask([q], planner=Gold())[0]
    assert res.retrieval == "plan" and len({p.source for p in res.paths}) > 1
    want = asker.score_sequences([[p.relations for p in res.paths]], [question_text(q)])[0]
    assert [p.embedding_cost for p in res.paths] == pytest.approx(want.tolist())
    # the answers are the vote of the first vote_paths paths with answers, weighted by those costs
    idx = [i for i, p in enumerate(res.paths) if p.answers][:AskSettings().vote_paths]
    cols = sorted({a.id for i in idx for a in res.paths[i].answers})
    S = np.array([[next((a.score for a in res.paths[i].answers if a.id == e), 0.0) for e in cols] for i in idx])
    # (less plan_bonus for a planned path: docs/ask.md, "Weighing the LLM")
    assert all(p.vote_cost == p.embedding_cost - (AskSettings().plan_bonus if p.source == "plan" else 0.0)
               for p in res.paths)
    ents, _ = vote_ranking(S, [res.paths[i].vote_cost for i in idx], AskSettings().vote_temperature, 10)
    assert [a.id for a in res.answers] == [cols[c] for c in ents.tolist()]
    plain = asker.ask([q])[0]  # no plan: the embedding-only cost is the cost
    assert all(p.embedding_cost == p.cost for p in plain.paths)


@pytest.mark.parametrize("pick", [False, True])
@pytest.mark.parametrize("explain", [False, True])
def test_each_candidate_path_runs_once_per_question(kg, questions, pick, explain):
    """Every candidate path's query is executed once per batch of questions (two questions about one topic
    share theirs): its scores serve the answers, the reasoner's context, the vote (and a reasoner's pick of
    paths) and the explanations; the explanations run only the answers' restricted queries
    ``(i path (e answer))``, never a candidate path itself."""
    from engine.exec.ask import Asker, AskSettings, ReasonReply

    _, eng, ret = kg

    class PickFirstTwo:
        def reason(self, requests):
            return [ReasonReply(paths=(1, 2)) for _ in requests]

    class Counted:  # the engine with the counting executor (Asker reads .executor and .artifact)
        artifact = eng.artifact
        executor = _CountingExecutor(eng.executor, eng.artifact)

    texts = [q for q, _, _ in questions]
    asker = Asker(Counted, ret, settings=AskSettings(explain=explain))
    res = asker.ask(texts, reasoner=PickFirstTwo() if pick else None)
    runs = Counted.executor.runs
    paths = {p.query for r in res for p in r.paths}
    assert paths and all(len(r.paths) > 2 for r in res)
    assert len({r.topic_id for r in res}) < len(res)  # some questions share a topic (and candidate paths)
    assert {q: runs[q] for q in paths} == {q: 1 for q in paths}
    extra = {q: n for q, n in runs.items() if q not in paths}
    if explain:  # one restricted query per answer
        assert sum(extra.values()) == sum(len(r.answers) for r in res)
        assert all(q.startswith("(i ") for q in extra)
        assert all(a.explanation is not None for r in res for a in r.answers)
    else:
        assert not extra
    assert any(t["step"] == "vote" for r in res for t in r.trace)


def test_scoring_no_question_gives_no_costs(kg):
    """Found by test_fuzz_cli_metaqa_ask_slow (`--per-hop 0 --tune-exemplars`): with a verbalizer, scoring an
    empty batch subtracted the (d,) verbalized mean from the encoder's (0, 0) array and raised ValueError."""
    from llm_bridge.prompts import fallback_template

    from engine.exec.ask import Asker

    _, eng, ret = kg
    asker = Asker(eng, ret, settings=AskSettings(max_hops=2), verbalizer=fallback_template)
    assert asker.score_sequences([], []) == []
    assert [len(c) for c in asker.score_sequences([[(0,)], []], ["who follows them", "x"])] == [1, 0]
