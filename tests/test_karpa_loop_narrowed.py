"""The planner's schema narrowed to the relation paths that exist from the topic (issue 31, item 3).

``PlanRequest.continuations`` (filled by ``Asker.continuations`` from the KG) → ``plan_paths`` → one enum of
whole relation paths in the planner's ``response_format``; plans outside it are dropped.  No model needed:
the paths are checked against a brute-force walk of the artifact's observed triples, and a recording
Chat Completions server plays a model that picks from the schema (and one that ignores it).
"""
from __future__ import annotations

import json
import random

import pytest

from _llm_server import make_artifact  # tests/ is on sys.path
from test_karpa_loop_schema import _client, _Recorder, _valid

from engine.exec.api import Engine
from engine.exec.ask import Asker, PlanRequest
from experiments.simulate_ask import parse_plan_prompt
from llm_bridge import karpa_loop
from llm_bridge.karpa_loop import LLMPlanner, parse_plan_reply, plan_paths, plan_response_format

TREE = {(): ("directed_by^-1", "has_genre^-1"),
        ("directed_by^-1",): ("starred_actors", "release_year"),
        ("has_genre^-1",): ("directed_by",),
        ("directed_by^-1", "starred_actors"): ("starred_actors^-1",),
        ("has_genre^-1", "directed_by"): ("directed_by^-1",)}


def _enum(req: PlanRequest, **kw) -> list[tuple[str, ...]]:
    return [tuple(p) for p in plan_response_format(req, **kw)["schema"]["properties"]["plans"]["items"]["enum"]]


def _next_steps(paths, prefix: tuple[str, ...]) -> set[str]:
    return {p[len(prefix)] for p in paths if len(p) == len(prefix) + 1 and p[: len(prefix)] == prefix}


def test_each_step_of_the_schema_lists_exactly_the_continuations():
    req = PlanRequest("which films share a director with [X]", "X", (), continuations=TREE)
    paths = _enum(req, max_hops=3)
    assert paths == plan_paths(req, max_hops=3) and len(paths) == len(set(paths)) == 7
    for prefix, nxt in TREE.items():  # step k: exactly the relations continuing from step k-1's tails
        assert _next_steps(paths, prefix) == set(nxt), prefix
    assert _next_steps(paths, ("directed_by^-1", "release_year")) == set()  # a leaf: the path stops there
    # a reversed first step (the film's relation read from the person) is not a path: the schema refuses it
    assert ("directed_by",) not in paths and ("starred_actors",) not in paths
    # max_hops cuts the walk
    assert {len(p) for p in _enum(req, max_hops=2)} == {1, 2} and len(_enum(req, max_hops=1)) == 2
    # only paths of the shown candidates when some are, else all of them
    shown = PlanRequest("q", "X", ("has_genre^-1", "directed_by"), continuations=TREE)
    assert _enum(shown) == [("has_genre^-1",), ("has_genre^-1", "directed_by")]
    assert _enum(PlanRequest("q", "X", ("written_by",), continuations=TREE)) == paths
    # a name the grammar cannot quote ends the walk there instead of breaking the grammar
    odd = {(): ("ok", 'say "hi"'), ("ok",): ("back\\slash",), ('say "hi"',): ("ok",)}
    assert plan_paths(PlanRequest("q", "X", (), continuations=odd)) == [("ok",)]
    # no continuations: the flat schema of the shown relations, as before
    flat = plan_response_format(PlanRequest("q", "X", ("r1", "r2")))["schema"]["properties"]["plans"]["items"]
    assert flat["items"]["enum"] == ["r1", "r2"]


def test_the_enum_is_capped_nearest_first_and_stays_prefix_closed(monkeypatch):
    rels = tuple(f"r{i}" for i in range(6))
    tree = {(): rels, **{(a,): rels for a in rels}, **{(a, b): rels for a in rels for b in rels}}
    req = PlanRequest("q", "X", rels, continuations=tree)
    assert len(plan_paths(req)) == 6 + 36 + 216
    monkeypatch.setattr(karpa_loop, "MAX_ENUM_PLANS", 20)
    kept = plan_paths(req)
    assert len(kept) == 20
    assert all(p[:k] in kept for p in kept for k in range(1, len(p)))  # every kept path's prefixes kept
    assert kept[:3] == [("r0",), ("r0", "r0"), ("r0", "r0", "r0")]  # the nearest candidates first
    assert max(max(rels.index(r) for r in p) for p in kept) == 2


def test_every_schema_valid_reply_is_a_listed_path():
    req = PlanRequest("q", "X", (), continuations=TREE)
    schema = plan_response_format(req, max_plans=2)["schema"]
    rng = random.Random(0)
    paths = plan_paths(req)
    for _ in range(30):
        reply = {"plans": [list(rng.choice(paths)) for _ in range(rng.randint(1, 2))]}
        assert _valid(reply, schema) and set(parse_plan_reply(json.dumps(reply))) <= set(paths)
    for bad in (["directed_by"], ["has_genre^-1", "directed_by^-1"], ["directed_by^-1", "release_year", "x"], []):
        assert not _valid({"plans": [bad]}, schema), bad


def test_the_schema_compiles_to_a_llama_cpp_grammar_of_whole_paths():
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    fmt = plan_response_format(PlanRequest("q", "X", (), continuations=TREE), max_plans=2)
    gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(fmt["schema"]))
    assert '"[\\"directed_by^-1\\", \\"starred_actors\\"]"' in gbnf
    assert 'root ::= "{" space plans-kv "}" space' in gbnf


# ------------------------------------------------------------------------ against a KG
@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    return make_artifact(tmp_path_factory.mktemp("narrowed") / "artifact", drop=0.0, num_entities=60,
                         relations=("directed_by", "starred_actors", "has_genre"))


def _walk(art, topic: int, max_hops: int) -> set[tuple[str, ...]]:
    """Every relation path of 1..max_hops steps with at least one edge chain from ``topic`` (brute force)."""
    out: dict[int, dict[int, set[int]]] = {}
    for h, r, t in art.observed.tolist():
        out.setdefault(h, {}).setdefault(r, set()).add(t)
    found: set[tuple[str, ...]] = set()
    level = {(): {topic}}
    for _ in range(max_hops):
        nxt: dict[tuple[str, ...], set[int]] = {}
        for prefix, ents in level.items():
            for e in ents:
                for r, tails in out.get(e, {}).items():
                    nxt.setdefault(prefix + (art.relations[r],), set()).update(tails)
        found.update(nxt)
        level = nxt
    return found


def test_the_askers_continuations_are_the_kgs_paths(kg):
    eng = Engine.load(kg)
    asker = Asker(eng, eng.retriever(encoder="hashing"))
    for topic in range(0, len(eng.artifact.entities), 7):
        req = PlanRequest("q", eng.artifact.entities[topic], (), continuations=asker.continuations(topic, 3))
        assert set(plan_paths(req, max_hops=3)) == _walk(eng.artifact, topic, 3), topic


def _topic_with_a_dead_inverse(art) -> tuple[int, str]:
    """An entity with edges out along some relation but none along its inverse, and that inverse's name."""
    out: dict[int, set[str]] = {}
    for h, r, _ in art.observed.tolist():
        out.setdefault(h, set()).add(art.relations[r])
    for e, rels in sorted(out.items()):
        for r in sorted(rels):
            inv = r[: -len("^-1")] if r.endswith("^-1") else r + "^-1"
            if inv in art.relations and inv not in rels:
                return e, inv
    raise AssertionError("the generated KG has no such entity")


def test_the_narrowed_planner_returns_only_paths_from_the_topic(kg):
    """A model picking from the schema gets only existing paths; one ignoring it (a reversed relation, an
    invented path) has those plans dropped with a warning, never passed to the loop."""
    eng = Engine.load(kg)
    art = eng.artifact
    topic, reversed_rel = _topic_with_a_dead_inverse(art)
    name = art.entities[topic]
    exist = _walk(art, topic, 2)
    rng = random.Random(1)

    def reply(body):
        pp = parse_plan_prompt(body["messages"])
        if pp is None:
            return 200, '{"paths": [1], "answers": []}'
        enum = body["response_format"]["schema"]["properties"]["plans"]["items"]["enum"]
        return 200, json.dumps({"plans": [rng.choice(enum), [reversed_rel], ["no_such_relation"]]})

    with _Recorder(reply) as srv, _client(srv.base_url) as client:
        planner = LLMPlanner(client, json_output="schema", max_hops=2)
        asker = Asker(eng, eng.retriever(encoder="hashing"))
        [rep] = planner.plan([PlanRequest("q", name, tuple(art.relations), continuations=asker.continuations(topic, 2))])
        assert rep.ok and len(rep.plans) == 1 and rep.plans[0] in exist
        assert [w for w in rep.warnings if "not a relation path from the topic" in w] == [
            f'plan ["{reversed_rel}"] is not a relation path from the topic in the KG: dropped',
            'plan ["no_such_relation"] is not a relation path from the topic in the KG: dropped']
        # the whole loop: every plan it keeps, over both planning rounds, is a path from the topic
        [res] = eng.ask([f"what is related to [{name}]"], planner=planner, encoder="hashing", max_hops=2)
        assert res.plans and all(tuple(p) in exist for p in res.plans)
        sent = [b["response_format"]["schema"]["properties"]["plans"]["items"]["enum"]
                for b in srv.bodies if parse_plan_prompt(b["messages"]) is not None]
        assert len(sent) >= 3 and all({tuple(p) for p in e} <= exist for e in sent)
        assert all([reversed_rel] not in e for e in sent)
