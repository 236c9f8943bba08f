"""JSON-constrained planner/reasoner replies (llm_bridge.karpa_loop ``json_output``): the schema each request
carries, its grammar, the fallback on servers that reject it, and the simulator that ignores it.

No model needed: a recording Chat Completions server stands in for llama.cpp's.
"""
from __future__ import annotations

import contextlib
import json
import random

import pytest

from _llm_server import chat_reply, scripted_server  # tests/ is on sys.path

from engine.exec.api import Engine
from engine.exec.ask import Asker, PlanRequest, ReasonRequest
from engine.exec.context import ContextPath
from experiments.simulate_ask import parse_plan_prompt
from llm_bridge.client import LLMClient
from llm_bridge.config import LLMConfig
from llm_bridge.karpa_loop import (MAX_ENUM_ANSWERS, SCHEMA_MAX_ANSWERS, SCHEMA_MAX_PATHS, LLMPlanner, LLMReasoner,
                                   parse_plan_reply, parse_reason_reply, plan_messages, plan_paths,
                                   plan_response_format,
                                   reason_response_format)

RELS_A = ("starred_actors^-1", "directed_by", "has_genre", "directed_by")  # a duplicate, shown twice
RELS_B = ("written_by", "release_year")


def _reason_request(tails: list[tuple[str, ...]]) -> ReasonRequest:
    paths = tuple(ContextPath("Topic", (f"r{i}",), answers=t) for i, t in enumerate(tails))
    return ReasonRequest("which films?", "Topic", paths, "context", "yaml")


@contextlib.contextmanager
def _Recorder(reply):
    """A Chat Completions server (tests/_llm_server.scripted_server) recording request bodies in ``.bodies``;
    ``reply(body) -> (status, content)``: 200 gives ``content`` as the one choice, else an error body."""

    def handler(body, headers):
        status, content = reply(body)
        if status == 200:
            usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
            return 200, chat_reply(content, model="rec", usage=usage), None
        return status, json.dumps({"error": {"message": content}}).encode(), None

    with scripted_server(handler) as srv:
        yield srv


def _client(url: str) -> LLMClient:
    return LLMClient(LLMConfig(base_url=url, model="rec", n=1, temperature=0.0, use_cache=False, max_retries=0,
                               timeout_s=10, concurrency=4))


def _first_candidate(body: dict) -> str:
    """A schema-valid plan reply: the first candidate relation of the prompt (read back from its text)."""
    pp = parse_plan_prompt(body["messages"])
    return json.dumps({"plans": [[pp.relations[0]]]})


# ------------------------------------------------------------------------ the schemas
def test_plan_schema_is_an_enum_of_the_prompt_candidates():
    req = PlanRequest("who directed [X]'s films", "X", RELS_A)
    fmt = plan_response_format(req, max_plans=2, max_hops=4)
    assert fmt["type"] == "json_object"
    schema = fmt["schema"]
    assert schema["required"] == ["plans"] and schema["additionalProperties"] is False
    plans = schema["properties"]["plans"]
    assert (plans["minItems"], plans["maxItems"]) == (1, 2)
    steps = plans["items"]
    assert (steps["minItems"], steps["maxItems"]) == (1, 4)
    assert steps["items"] == {"type": "string", "enum": ["starred_actors^-1", "directed_by", "has_genre"]}
    assert plan_response_format(req, json_output="off") is None
    assert plan_response_format(req, json_output="object") == {"type": "json_object"}
    # no candidates: an empty enum would admit no reply at all
    assert plan_response_format(PlanRequest("q", "X", ()), json_output="schema") == {"type": "json_object"}
    # a name the grammar converter cannot quote is left out, not allowed to break the grammar
    odd = plan_response_format(PlanRequest("q", "X", ('say "hi"', "back\\slash", "ok")))
    assert odd["schema"]["properties"]["plans"]["items"]["items"]["enum"] == ["ok"]
    with pytest.raises(ValueError, match="json_output must be one of schema, object, off"):
        plan_response_format(req, json_output="grammar")


def test_reason_schema_bounds_path_numbers_and_names_the_shown_tails():
    req = _reason_request([("Alien", "Heat"), ("Heat", "Ran"), ()])
    schema = reason_response_format(req)["schema"]
    assert schema["required"] == ["paths", "answers"] and schema["additionalProperties"] is False
    paths, answers = schema["properties"]["paths"], schema["properties"]["answers"]
    assert paths["items"] == {"type": "integer", "enum": [1, 2, 3]} and paths["minItems"] == 1
    assert paths["maxItems"] == 3 == SCHEMA_MAX_PATHS
    assert reason_response_format(_reason_request([("A",)] * 9))["schema"]["properties"]["paths"]["maxItems"] == 3
    assert reason_response_format(_reason_request([("A",)] * 2))["schema"]["properties"]["paths"]["maxItems"] == 2
    assert answers["items"] == {"type": "string", "enum": ["Alien", "Heat", "Ran"]}
    assert answers["maxItems"] == SCHEMA_MAX_ANSWERS
    # more names than an enum holds: still only shown names, the first MAX_ENUM_ANSWERS (best paths first)
    many = _reason_request([("Best",), tuple(f"Film {i}" for i in range(MAX_ENUM_ANSWERS + 1))])
    capped = reason_response_format(many)["schema"]["properties"]["answers"]["items"]
    assert capped["enum"] == ["Best"] + [f"Film {i}" for i in range(MAX_ENUM_ANSWERS - 1)]
    # no tails at all: no answer names (an empty enum would admit no reply; free strings would admit any)
    none = reason_response_format(_reason_request([()]))["schema"]["properties"]["answers"]
    assert none["maxItems"] == 0 and "enum" not in none["items"]
    assert reason_response_format(_reason_request([])) == {"type": "json_object"}
    assert reason_response_format(req, json_output="off") is None


def _valid(value, schema) -> bool:
    """A reference check of the JSON-schema subset the loop's schemas use (type, enum, items, min/maxItems,
    properties, required, additionalProperties, pattern)."""
    import re

    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict) or not set(schema.get("required", ())) <= set(value):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(_valid(v, props[k]) for k, v in value.items() if k in props)
    if t == "array":
        return (isinstance(value, list) and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1 << 30)
                and all(_valid(v, schema["items"]) for v in value))
    if t == "string" and not isinstance(value, str):
        return False
    if t == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
        return False
    if "pattern" in schema and not re.search(schema["pattern"], value):
        return False
    return "enum" not in schema or value in schema["enum"]


def _random_plan_reply(rng: random.Random, schema: dict) -> dict:
    plans = schema["properties"]["plans"]
    steps = plans["items"]
    return {"plans": [[rng.choice(steps["items"]["enum"]) for _ in range(rng.randint(1, steps["maxItems"]))]
                      for _ in range(rng.randint(1, plans["maxItems"]))]}


@pytest.mark.parametrize("seed", range(5))
def test_every_schema_valid_reply_parses_to_candidate_relations(seed):
    """Replies the schema admits (random, with and without llama.cpp's optional spaces) parse to candidate
    plans; the reference check agrees they are valid and that non-candidates are not."""
    rng = random.Random(seed)
    rels = tuple(f"rel_{i}" + ("^-1" if i % 3 else "") for i in rng.sample(range(50), rng.randint(1, 30)))
    max_plans, max_hops = rng.randint(1, 4), rng.randint(1, 4)
    schema = plan_response_format(PlanRequest("q", "T", rels), max_plans=max_plans, max_hops=max_hops)["schema"]
    for _ in range(20):
        reply = _random_plan_reply(rng, schema)
        text = json.dumps(reply, separators=(",", ": ") if rng.random() < 0.5 else (",", ":"))
        plans = parse_plan_reply(text)
        assert plans == tuple(tuple(p) for p in reply["plans"])
        assert all(r in rels for p in plans for r in p) and 1 <= len(plans) <= max_plans
        assert _valid(reply, schema)
    assert not _valid({"plans": [["not_a_candidate"]]}, schema) and not _valid({"plans": []}, schema)
    assert not _valid({"plans": [[rels[0]] * (max_hops + 1)]}, schema)
    assert not _valid({"plans": [[rels[0]]], "extra": 1}, schema)
    req = _reason_request([("A", "B"), ("C",)])
    rschema = reason_response_format(req)["schema"]
    for reply in ({"paths": [2], "answers": []}, {"paths": [1, 2], "answers": ["C", "A"]}):
        assert parse_reason_reply(json.dumps(reply)) == (tuple(reply["paths"]), tuple(reply["answers"]))
        assert _valid(reply, rschema)
    for bad in ({"paths": [3], "answers": []}, {"paths": [], "answers": ["A"]}, {"paths": [True], "answers": []},
                {"paths": [1, 2, 1], "answers": []},
                {"paths": [1], "answers": ["Z"]}, {"paths": [1]}, {"paths": [1], "answers": ["A", "B", "C", "A"]}):
        assert not _valid(bad, rschema), bad
    nothing = reason_response_format(_reason_request([()]))["schema"]
    assert _valid({"paths": [1], "answers": []}, nothing)
    for name in ("Any Name (1999)", 'a "quoted" name', ""):
        assert not _valid({"paths": [1], "answers": [name]}, nothing), name


def test_the_schemas_compile_to_llama_cpp_grammars_with_the_enums():
    """llama-cpp-python's own converter (its server falls back to any JSON, silently, when it fails)."""
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    fmt = plan_response_format(PlanRequest("q", "X", RELS_A), max_plans=3, max_hops=2)
    gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(fmt["schema"]))
    enum_rule = next(l for l in gbnf.splitlines() if l.startswith("plans-item-item ::="))
    assert enum_rule == 'plans-item-item ::= "\\"starred_actors^-1\\"" | "\\"directed_by\\"" | "\\"has_genre\\""'
    assert 'root ::= "{" space plans-kv "}" space' in gbnf
    rfmt = reason_response_format(_reason_request([("Alien", "Heat"), ("Ran",)]))
    rg = llama_grammar.json_schema_to_gbnf(json.dumps(rfmt["schema"]))
    assert 'paths-item ::= "1" | "2"' in rg
    assert 'answers-item ::= "\\"Alien\\"" | "\\"Heat\\"" | "\\"Ran\\""' in rg
    assert 'root ::= "{" space paths-kv "," space answers-kv "}" space' in rg


def test_the_json_prompt_asks_for_the_schema_object_and_reads_back():
    req = PlanRequest("who directed [X]'s films", "X", RELS_A, previous=(("directed_by",),))
    off = plan_messages(req)[1]["content"]
    on = plan_messages(req, max_plans=2, max_hops=4, json_output="schema")[1]["content"]
    assert 'e.g. [["relation_1", "relation_2"]]' in off and "relation_1" not in on
    assert on.endswith('Reply with JSON {"plans": [relation paths]}: at most 2 relation paths, best first, each a '
                       "list of 1 to 4 candidate relation names from the topic entity to the answer.")
    assert on.split("\nReply with")[0] == off.split("\nReply with")[0]
    for text in (off, on):  # the simulator reads both
        pp = parse_plan_prompt([{"role": "user", "content": text}])
        assert pp.relations == RELS_A and pp.previous == (("directed_by",),) and pp.topic == "X"


# ------------------------------------------------------------------------ over HTTP
def test_each_request_carries_its_own_schema():
    reqs = [PlanRequest("q one", "A", RELS_A), PlanRequest("q two", "B", RELS_B)]
    with _Recorder(lambda body: (200, _first_candidate(body))) as srv, _client(srv.base_url) as client:
        replies = LLMPlanner(client, max_plans=2, max_hops=3, json_output="schema").plan(reqs)
        assert [r.plans for r in replies] == [(("starred_actors^-1",),), (("written_by",),)]
        assert all(r.ok and not r.warnings and r.calls == 1 and r.tokens == 12 for r in replies)
        by_q = {parse_plan_prompt(b["messages"]).question: b for b in srv.bodies}
        for req in reqs:
            fmt = by_q[req.question]["response_format"]
            enum = fmt["schema"]["properties"]["plans"]["items"]["items"]["enum"]
            assert enum == list(dict.fromkeys(req.relations))
            assert fmt == plan_response_format(req, max_plans=2, max_hops=3)
        # off (the default): no response_format, the free-text prompt
        srv.bodies.clear()
        LLMPlanner(client).plan(reqs[:1])
        assert "response_format" not in srv.bodies[0]
        assert "relation_1" in srv.bodies[0]["messages"][-1]["content"]


def test_the_reasoner_request_carries_its_schema():
    req = _reason_request([("Alien", "Heat"), ("Ran",)])
    with _Recorder(lambda body: (200, '{"paths": [2], "answers": ["Ran"]}')) as srv, _client(srv.base_url) as c:
        [reply] = LLMReasoner(c, json_output="schema").reason([req])
        assert reply.ok and reply.paths == (2,) and reply.answers == ("Ran",)
        assert srv.bodies[0]["response_format"] == reason_response_format(req)
        LLMReasoner(c, json_output="object").reason([_reason_request([("Other",)])])
        assert srv.bodies[-1]["response_format"] == {"type": "json_object"}


def test_a_server_rejecting_the_schema_gets_the_prompts_without_it():
    """HTTP 400 on response_format: asked again without it, remembered; replies still parse (prose around JSON)."""
    def reply(body):
        if "response_format" in body:
            return 400, "response_format: unknown field 'schema'"
        pp = parse_plan_prompt(body["messages"])
        return 200, f"Sure! Here are the plans:\n```json\n[[\"{pp.relations[-1]}\"]]\n```"

    reqs = [PlanRequest("q one", "A", RELS_A), PlanRequest("q two", "B", RELS_B)]
    with _Recorder(reply) as srv, _client(srv.base_url) as client:
        first = LLMPlanner(client, json_output="schema").plan(reqs[:1])
        assert first[0].plans == (("directed_by",),) and first[0].ok
        assert ["response_format" in b for b in srv.bodies] == [True, False]
        assert client.server_rejects_response_format and client.stats.failures == 0
        second = LLMPlanner(client, json_output="schema").plan(reqs[1:])
        assert second[0].plans == (("release_year",),)
        assert "response_format" not in srv.bodies[-1] and len(srv.bodies) == 3
        assert client.stats.response_format_fallbacks == 2


def test_client_per_prompt_formats_are_checked():
    with _Recorder(lambda body: (200, "[]")) as srv, _client(srv.base_url) as client:
        fmts = [{"type": "json_object"}, None]
        out = client.complete_many_sync([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                                        response_format=fmts)
        assert all(r.ok for r in out)
        sent = {b["messages"][0]["content"]: b.get("response_format") for b in srv.bodies}
        assert sent == {"a": {"type": "json_object"}, "b": None}
        with pytest.raises(ValueError, match="response_format has 1 entries for a batch of 2 prompts"):
            client.complete_many_sync([[{"role": "user", "content": "a"}]] * 2, response_format=fmts[:1])
        with pytest.raises(ValueError, match=r"response_format\[0\] must be a mapping or None"):
            client.complete_many_sync([[{"role": "user", "content": "a"}]], response_format=["json"])
        with pytest.raises(ValueError, match="response_format must be a mapping, a list of them or None"):
            client.complete_many_sync([[{"role": "user", "content": "a"}]], response_format="json_object")


def test_constructor_settings_are_checked():
    with pytest.raises(ValueError, match="json_output must be one of"):
        LLMPlanner(None, json_output="yes")
    with pytest.raises(ValueError, match="json_output must be one of"):
        LLMReasoner(None, json_output="grammar")
    with pytest.raises(ValueError, match="max_plans and max_hops must be >= 1"):
        LLMPlanner(None, max_hops=0)


# ------------------------------------------------------------------------ the simulator and the CLI
@pytest.fixture(scope="module")
def small_kg(tmp_path_factory):
    from _llm_server import make_artifact  # tests/ is on sys.path

    return make_artifact(tmp_path_factory.mktemp("schema") / "artifact", drop=0.0, num_entities=60,
                         relations=("directed_by", "starred_actors"))


def test_the_simulator_ignores_response_format(small_kg):
    """The simulated planner answers the schema-carrying prompts as before (it emulates a model that writes
    what it likes, paraphrases included, so the loop's handling of unconstrained replies stays tested)."""
    from engine.exec.api import Engine
    from experiments.simulate_ask import AskSimConfig, start_ask_server

    eng = Engine.load(small_kg)
    topic = eng.artifact.entities[0]
    question = f"what movies did [{topic}] act in"
    server = start_ask_server(small_kg, {question: ("starred_actors^-1",)}, AskSimConfig(synonym_rate=0.0))
    try:
        with _client(server.base_url) as client:
            req = PlanRequest(question, topic, ("directed_by", "starred_actors^-1"))
            [reply] = LLMPlanner(client, json_output="schema").plan([req])
            assert reply.ok and reply.plans and client.stats.failures == 0
            assert not client.server_rejects_response_format
    finally:
        server.stop()


@pytest.mark.parametrize("mode", [None, "object", "schema"])
def test_engine_ask_sends_the_mode_asked_for(small_kg, mode, capsys):
    from engine.ask import main

    def reply(body):
        pp = parse_plan_prompt(body["messages"])
        return 200, (json.dumps({"plans": [[pp.relations[0]]]}) if pp is not None
                     else '{"paths": [1], "answers": []}')

    with _Recorder(reply) as srv:
        topic = _entities(small_kg)[1]
        argv = [f"who directed the movies of [{topic}]", "--artifact", str(small_kg), "--encoder", "hashing",
                "--llm", "--llm-base-url", srv.base_url, "--llm-model", "rec", "--no-llm-cache", "--max-hops", "2"]
        assert main(argv + ([] if mode is None else ["--llm-ask-json", mode])) == 0
    capsys.readouterr()
    fmts = [b.get("response_format") for b in srv.bodies]
    assert len(fmts) >= 2  # plan (+ re-plan) and reason
    if mode is None:  # off by default
        assert fmts == [None] * len(fmts)
    elif mode == "object":
        assert fmts == [{"type": "json_object"}] * len(fmts)
    else:
        # each plan one of the relation paths of 1..2 steps (--max-hops) that leave the topic in the KG
        paths = [tuple(p) for p in fmts[0]["schema"]["properties"]["plans"]["items"]["enum"]]
        eng = Engine.load(small_kg)
        asker = Asker(eng, eng.retriever(encoder="hashing"))
        assert set(paths) == set(plan_paths(PlanRequest("q", topic, (), continuations=asker.continuations(1, 2)),
                                        max_hops=2))
        assert {len(p) for p in paths} == {1, 2}
        assert set(x for p in paths for x in p) <= set(parse_plan_prompt(srv.bodies[0]["messages"]).relations)
        assert "paths" in fmts[-1]["schema"]["properties"]


def _entities(art):
    return Engine.load(art).artifact.entities


def test_engine_ask_mode_flag_needs_llm(capsys):
    from engine.ask import main, parse_args

    assert main(["q", "--llm-ask-json", "schema"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --llm-ask-json needs --llm") and "Traceback" not in err
    assert parse_args(["q", "--llm"]).llm_ask_json == "off"
    assert parse_args(["q", "--llm", "--llm-ask-json", "schema"]).llm_ask_json == "schema"
    assert LLMPlanner(None).json_output == "off" and LLMReasoner(None).json_output == "off"


def test_a_reply_cut_off_by_max_tokens_keeps_its_complete_lists():
    """A schema-constrained reply stopped by the completion limit is valid JSON up to the cut."""
    assert parse_plan_reply('{"plans": [["a", "b"], ["c"], ["d", "e') == (("a", "b"), ("c",))
    assert parse_plan_reply('Plans: {"plans": [["a]", "b"], ["c') == (("a]", "b"),)
    assert parse_plan_reply('[["a", "b"], ["c"') == (("a", "b"),)
    assert parse_reason_reply('{"paths": [2, 1], "answers": ["A", "B') == ((2, 1), ())
    for text in ('{"plans": [["a', '{"plans": [', "[John Krasinski] directed it"):
        with pytest.raises(ValueError, match="no JSON"):
            parse_plan_reply(text)
    # complete JSON is read as before (the first value), prose and fences around it
    assert parse_plan_reply('x ```json\n{"plans": [["a"]]}\n``` y') == (("a",),)
    assert parse_plan_reply('{"plans": [["a"]]} and {"plans": [["b"]]}') == (("a",),)
