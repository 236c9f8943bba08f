"""LLM replies -> entity lists and confidences; prompts and their inversion; relation question templates."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_bridge import prompts
from llm_bridge.linking import normalize
from llm_bridge.parse import (
    extract_entities,
    is_refusal,
    logprob_confidence,
    parse_yes_no,
    sample_confidence,
)
from llm_bridge.relations import RelationQuestions, artifact_key, sidecar_path

# ----------------------------------------------------------------------------------- the parser
MESSY = [
    ('["Paris", "London"]', ["Paris", "London"], "json"),
    ('```json\n["Paris", "Lyon"]\n```\nThese are the cities I know.', ["Paris", "Lyon"], "json"),
    ("```\n[\"a b\", \"c\"]\n```", ["a b", "c"], "json"),
    ('Sure! The answers are: ["x", "y"]. Hope it helps.', ["x", "y"], "json"),
    ('{"answers": ["Rome", "Milan"]}', ["Rome", "Milan"], "json-object"),
    ('{"result": "Oslo"}', ["Oslo"], "json-object"),
    ('{"whatever": ["Bern"]}', ["Bern"], "json-object"),
    ('[{"name": "A"}, {"entity": "B"}, {"answer": "C"}]', ["A", "B", "C"], "json"),
    ('[["nested", "list"], "flat"]', ["nested", "list", "flat"], "json"),
    ("['Dune', \"Ender's Game\"]", ["Dune", "Ender's Game"], "quoted-list"),
    ("['Ender's Game', 'Dune']", ["Ender's Game", "Dune"], "quoted-list"),
    ("1. Paris\n2. Lyon - a city in France\n3) **Nice**", ["Paris", "Lyon", "Nice"], "lines"),
    ("Here they are:\n- Alpha\n- Beta\n* Gamma\n\u2022 Delta", ["Alpha", "Beta", "Gamma", "Delta"], "lines"),
    ("Paris, London and Rome", ["Paris", "London", "Rome"], "comma-list"),
    ("Answer: Paris; Lyon", ["Paris", "Lyon"], "comma-list"),
    ("The answer is Paris.", ["Paris"], "comma-list"),
    ("The answers are Paris and Lyon. Both are large.", ["Paris", "Lyon"], "comma-list"),
    ('["Paris", "paris", "PARIS "]', ["Paris"], "json"),  # duplicates by normalised form
    ('["Paris", null, true, 42]', ["Paris", "42"], "json"),
]


@pytest.mark.parametrize("text,entities,how", MESSY)
def test_extract_messy_replies(text, entities, how):
    r = extract_entities(text)
    assert r.entities == entities
    assert r.how == how
    assert not r.refused


REFUSALS = [
    None, "", "   ", "[]", "{}", "I don't know.", "I do not know the answer.", "I'm not sure.",
    "Sorry, I cannot answer that.", "As an AI, I can't determine this.", "none", "None.", "Unknown", "N/A",
    '["I don\'t know"]', '["unknown", "none"]', '{"answers": []}', "There is no such entity.",
    "No answer.", "I am not sure. Maybe Paris?",
]


@pytest.mark.parametrize("text", REFUSALS)
def test_refusals_are_no_answer(text):
    r = extract_entities(text)
    assert r.entities == []
    assert r.refused


def test_refusal_items_dropped_from_a_list():
    r = extract_entities('["Paris", "I don\'t know", "unknown", "Lyon"]')
    assert r.entities == ["Paris", "Lyon"]
    assert "unknown" in r.dropped and not r.refused


def test_prose_after_a_list_is_not_a_refusal():
    assert extract_entities("Paris, London. Sorry if incomplete").entities == ["Paris", "London"]


def test_limit_and_long_items():
    assert extract_entities('["a", "b", "c"]', limit=2).entities == ["a", "b"]
    assert extract_entities(json.dumps(["x" * 500, "ok"])).entities == ["ok"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_extract_never_raises(text):
    r = extract_entities(text)
    assert isinstance(r.entities, list) and all(isinstance(e, str) and e for e in r.entities)
    assert r.refused == (not r.entities)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z\u00c0-\u00ff][A-Za-z0-9\u00c0-\u00ff ,'-]{0,20}[A-Za-z0-9]", fullmatch=True)
                .filter(lambda s: not is_refusal(s)), min_size=1, max_size=6, unique_by=normalize))
def test_json_list_round_trip(names):
    assert extract_entities(json.dumps(names, ensure_ascii=False)).entities == names


def test_yes_no():
    assert parse_yes_no("Yes.") is True
    assert parse_yes_no("no, it is not") is False
    assert parse_yes_no("Correct") is True
    assert parse_yes_no("maybe") is None
    assert parse_yes_no("") is None


# ------------------------------------------------------------------------------- confidence
def test_sample_confidence_counts_over_n():
    conf = sample_confidence([["Paris", "London"], ["paris"], [], ["London", "Rome", "Rome"]], n=6)
    got = {c.text: (c.count, c.p) for c in conf}
    assert got == {"Paris": (2, 2 / 6), "London": (2, 2 / 6), "Rome": (1, 1 / 6)}
    assert [c.text for c in conf] == ["Paris", "London", "Rome"]  # ties in first-seen order
    assert sample_confidence([["a"]] * 3)[0].p == 1.0
    assert sample_confidence([], n=0) == []


def test_sample_confidence_most_frequent_surface_form():
    conf = sample_confidence([["the Beatles"], ["The Beatles"], ["The Beatles"]])
    assert conf[0].text == "The Beatles" and conf[0].count == 3


def _tokens(text: str, first_lp: dict[str, float]):
    """Tokenise ``text`` as characters; the first character of each entity gets its logprob."""
    out = []
    for i, ch in enumerate(text):
        lp = -0.01
        for ent, v in first_lp.items():
            if text.find(ent) == i:
                lp = v
        out.append((ch, lp))
    return out


def test_logprob_confidence_first_and_mean():
    text = '["Paris", "Lyon"]'
    toks = _tokens(text, {"Paris": math.log(0.8), "Lyon": math.log(0.4)})
    first = {c.text: c.p for c in logprob_confidence([(text, toks, ["Paris", "Lyon"])], mode="first")}
    assert first["Paris"] == pytest.approx(0.8) and first["Lyon"] == pytest.approx(0.4)
    mean = {c.text: c.p for c in logprob_confidence([(text, toks, ["Paris", "Lyon"])], mode="mean")}
    want = math.exp((math.log(0.8) + 4 * -0.01) / 5)
    assert mean["Paris"] == pytest.approx(want)
    # two samples, one of which does not name Lyon: averaged over n
    two = {c.text: c.p for c in logprob_confidence([(text, toks, ["Paris", "Lyon"]),
                                                    ('["Paris"]', _tokens('["Paris"]', {"Paris": math.log(0.6)}),
                                                     ["Paris"])])}
    assert two["Paris"] == pytest.approx(0.7) and two["Lyon"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        logprob_confidence([], mode="bogus")


def test_logprob_confidence_without_span_counts_the_sample():
    conf = logprob_confidence([("Paris", [], ["Paris"])])
    assert conf[0].p == 1.0


# --------------------------------------------------------------------------------- prompts
def test_templates_are_package_data():
    for name in ("projection.system", "projection.user", "relation_question.system", "relation_question.user",
                 "answer_check.system", "answer_check.user", "fallback_forward", "fallback_inverse",
                 "fallback_qualified"):
        assert prompts.load_template(name).template.strip()


@pytest.mark.parametrize("relation,words", [
    ("film/directed_by", "directed by"),
    ("/film/film/directed_by", "directed by"),
    ("directed_by^-1", "directed by"),
    ("/film/actor/film./film/performance/film", "film"),
    ("/award/award_nominee/award_nominations./award/award_nomination/award", "award nominations award"),
    ("interacts_with", "interacts with"),
])
def test_relation_words(relation, words):
    assert prompts.relation_words(relation) == words


def test_fallback_templates():
    assert prompts.fallback_template("/film/film/directed_by") == "Who or what is the film {entity} directed by?"
    assert prompts.fallback_template("directed_by^-1") == "Who or what is directed by {entity}?"


def test_projection_prompt_round_trip():
    t = prompts.fallback_template("directed_by^-1")
    names = ['Tom "T" Hanks', "Zemeckis, Robert", "a or b", "back\\slash", "Zoë"]
    msgs = prompts.projection_messages(t, names, max_answers=7)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert '"Tom \\"T\\" Hanks" or "Zemeckis, Robert"' in msgs[1]["content"]
    req = prompts.parse_projection_request(msgs)
    assert req == prompts.ProjectionRequest(question=t, entities=names, max_answers=7)
    assert prompts.parse_projection_prompt(msgs[1]["content"]) == (t, names)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
                        min_size=1, max_size=20), min_size=1, max_size=5))
def test_projection_prompt_round_trip_any_names(names):
    t = "What is the capital of {entity}?"
    assert prompts.parse_projection_prompt(prompts.projection_messages(t, names)) == (t, names)


def test_other_prompts_are_not_projection_prompts():
    assert prompts.parse_projection_prompt(prompts.answer_check_messages('Who directed "X"?', "Y")) is None
    rq = prompts.relation_question_messages("directed_by", [("Cast Away", "Robert Zemeckis")])
    assert prompts.parse_projection_prompt(rq) is None
    assert prompts.parse_relation_question_prompt(rq) == ("directed_by", [("Cast Away", "Robert Zemeckis")])
    assert prompts.parse_projection_prompt("Question: what?") is None


def test_question_template_cleaning():
    assert prompts.clean_question_template('Question: "Who directed [entity1]?"') == "Who directed {entity}?"
    assert prompts.clean_question_template("Sure.\nWho wrote {ENTITY}?") == "Who wrote {entity}?"
    assert prompts.clean_question_template('Is {entity} "famous"?') == "Is {entity} 'famous'?"
    assert prompts.clean_question_template("No slot here") is None
    assert prompts.clean_question_template("{entity} and {entity}?") is None
    with pytest.raises(ValueError):
        prompts.fill_question('Bad "template" {entity}', ["x"])
    with pytest.raises(ValueError):
        prompts.projection_messages("Who is {entity}?", [])


# ------------------------------------------------------------------------ relation questions
# the two "genre" relations of one head type ask the same fallback question
RELS = ["/film/film/genre", "/user/x/film/genre", "/film/film/genre^-1", "directed_by", "directed_by^-1"]


def test_relation_questions_unique_and_invertible():
    rq = RelationQuestions(relations=RELS)
    templates = [rq.template(r) for r in RELS]
    assert len({t.casefold() for t in templates}) == len(RELS)  # the two "genre" relations were qualified
    assert "(relation: /user/x/film/genre)" in rq.template("/user/x/film/genre")
    for r in RELS:
        assert rq.lookup(rq.template(r)) == r
        assert rq.lookup("  " + rq.template(r).upper()) == r
        assert rq.source(r) == "fallback"
    assert rq.template(3) == rq.template("directed_by")


def test_relation_questions_set_keeps_uniqueness():
    rq = RelationQuestions(relations=RELS)
    assert rq.set("directed_by", "Who directed [entity]?")
    assert rq.template("directed_by") == "Who directed {entity}?" and rq.source("directed_by") == "llm"
    assert rq.set("/film/film/genre", "Who directed {entity}?")  # collides: qualified, still unique
    assert rq.lookup("Who directed {entity}?") == "directed_by"
    assert rq.lookup(rq.template("/film/film/genre")) == "/film/film/genre"
    assert not rq.set("directed_by^-1", "no slot")
    assert rq.generated() == {"directed_by": "Who directed {entity}?",
                              "/film/film/genre": rq.template("/film/film/genre")}


class _FakeClient:
    def __init__(self, reply):
        self.reply = reply
        self.batches = []

    def complete_many_sync(self, batch, **kw):
        from llm_bridge.client import Completion, LLMFailure

        self.batches.append(batch)
        out = []
        for msgs in batch:
            rel, pairs = prompts.parse_relation_question_prompt(msgs)
            if self.reply is None:
                out.append(LLMFailure("server_error", "HTTP 500", 500, 1))
            else:
                out.append(Completion(texts=(self.reply(rel),), logprobs=(None,), finish_reasons=("stop",),
                                      prompt_tokens=1, completion_tokens=1, model="m", n_requested=1))
        return out


def _tiny_artifact(tmp_path):
    import scipy.sparse as sp

    from kge.artifact import Artifact

    ents = ["A", "B", "C"]
    rels = ["directed_by", "directed_by^-1"]
    obs = np.array([[0, 0, 1], [1, 1, 0]], dtype=np.int64)
    m = sp.csr_matrix((np.ones(2, np.float32), (obs[:, 1] * 3 + obs[:, 0], obs[:, 2])), shape=(6, 3))
    art = Artifact(entities=ents, relations=rels, matrices=m, observed=obs, missing=np.zeros((0, 3), np.int64))
    art.save(tmp_path / "art")
    return Artifact.load(tmp_path / "art")


def test_relation_questions_generated_once_and_stored_in_a_sidecar(tmp_path):
    art = _tiny_artifact(tmp_path)
    before = {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()}
    rq = RelationQuestions.for_artifact(art, model="sim/model:1", cache_dir=tmp_path / "rq")
    client = _FakeClient(lambda rel: "Who is the director of [entity]?" if rel == "directed_by" else "meh")
    got = rq.ensure(["directed_by", "directed_by^-1"], artifact=art, client=client, model="sim/model:1",
                    cache_dir=tmp_path / "rq")
    assert got == {"directed_by": "llm", "directed_by^-1": "unusable reply"}
    assert rq.template("directed_by") == "Who is the director of {entity}?"
    # the sidecar is keyed by the artifact's checksums and the model; the artifact is untouched
    path = sidecar_path(art, "sim/model:1", tmp_path / "rq")
    assert path.is_file() and artifact_key(art) in str(path)
    assert json.loads(path.read_text())["templates"] == {"directed_by": "Who is the director of {entity}?"}
    assert {p.name: p.read_bytes() for p in (tmp_path / "art").iterdir()} == before
    # asked once: a second ensure sends nothing; a fresh object reads the sidecar
    assert rq.ensure(["directed_by", "directed_by^-1"], artifact=art, client=client) == {}
    assert len(client.batches) == 1
    rq2 = RelationQuestions.for_artifact(art, model="sim/model:1", cache_dir=tmp_path / "rq")
    assert rq2.template("directed_by") == "Who is the director of {entity}?" and rq2.source("directed_by") == "llm"
    # another model has no sidecar yet
    assert RelationQuestions.for_artifact(art, model="other", cache_dir=tmp_path / "rq").source("directed_by") == "fallback"


def test_relation_questions_server_failure_keeps_fallback_and_asks_again(tmp_path):
    art = _tiny_artifact(tmp_path)
    rq = RelationQuestions.for_artifact(art, model="m", cache_dir=tmp_path / "rq")
    client = _FakeClient(None)
    assert rq.ensure(["directed_by"], artifact=art, client=client, model="m") == {"directed_by": "failed: server_error"}
    assert rq.source("directed_by") == "fallback"
    rq.ensure(["directed_by"], artifact=art, client=client, model="m")
    assert len(client.batches) == 2
    assert sidecar_path(art, "m", tmp_path / "rq").exists() is False


def test_unreadable_sidecar_is_ignored(tmp_path):
    art = _tiny_artifact(tmp_path)
    path = sidecar_path(art, "m", tmp_path / "rq")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert RelationQuestions.for_artifact(art, model="m", cache_dir=tmp_path / "rq").source("directed_by") == "fallback"
