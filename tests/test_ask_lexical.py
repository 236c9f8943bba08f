"""The lexical term of embedding-only retrieval (engine.exec.ask: content_words, words_match, lexical_f1,
Asker.named_relations, AskSettings.lexical_weight): its pieces against hand-worked cases and brute force, and
its effect on the costs being exactly ``- lexical_weight * F1``."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from _llm_server import make_artifact  # noqa: F401  (tests/ is on sys.path)
from engine.exec.api import Engine
from engine.exec.ask import (FUNCTION_WORDS, MIN_WORD, Asker, AskSettings, content_words, lexical_f1,
                             question_text, words_match)
from kgreason.errors import UserError

RELS = ("directed_by", "starred_actors", "written_by", "has_genre")


@pytest.fixture(scope="module")
def kg(tmp_path_factory):
    art = make_artifact(tmp_path_factory.mktemp("lex") / "artifact", drop=0.0, relations=RELS, num_entities=120)
    eng = Engine.load(art)
    return eng, eng.retriever(encoder="hashing", encoder_kwargs={"dim": 64, "seed": 1})


@pytest.mark.parametrize("a, b, same", [
    ("writer", "written", True), ("written", "writer", True), ("director", "directed", True),
    ("stars", "starred", True), ("genre", "genre", True), ("genres", "genre", True),
    ("acted", "actors", False),
    # an irregular past form reads as its base form (IRREGULAR_VERBS): "wrote" -> "write"
    ("wrote", "written", True), ("wrote", "writer", True), ("wrote", "wrote", True), ("taken", "take", True),
    ("wrote", "wrath", False), ("rate", "rating", False),
    ("film", "films", True), ("directly", "director", True), ("dire", "directed", True),
    ("", "written", False), ("abc", "abc", False),
    # a closed compound's last part (6+ letters) is a word of its own: "screen|writer"
    ("screenwriter", "written", True), ("scriptwriters", "writer", True), ("screenwriter", "screen", True),
    ("costar", "starred", False), ("cowriter", "written", False), ("overwritten", "written", True),
])
def test_words_match(a, b, same):
    assert words_match(a, b) is same
    assert words_match(b, a) is same


def test_words_match_is_the_prefix_or_compound_rule_on_random_words():
    from engine.exec.ask import MIN_COMPOUND

    def prefix(a, b):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n >= MIN_WORD and n >= 0.6 * min(len(a), len(b))

    def compound(x, y):  # x = a first part of 3+ letters + a last part of MIN_COMPOUND+ letters matching y
        return any(prefix(x[k:], y) for k in range(MIN_WORD - 1, len(x)) if len(x) - k >= MIN_COMPOUND)

    rng = np.random.default_rng()
    for _ in range(2000):
        a = "".join(rng.choice(list("abc"), int(rng.integers(0, 13))))
        b = "".join(rng.choice(list("abc"), int(rng.integers(0, 13))))
        assert words_match(a, b) == (prefix(a, b) or compound(a, b) or compound(b, a)), (a, b)


def test_content_words_keep_only_words_that_can_name_a_relation():
    assert content_words("Who is the WRITER of the film [Misunderstood]?") == ["writer", "film", "misunderstood"]
    assert content_words("what which where about with") == []
    assert content_words("") == []
    assert all(len(w) >= MIN_WORD for w in FUNCTION_WORDS)  # shorter words are never read anyway


def test_lexical_f1_by_hand_and_against_brute_force():
    assert lexical_f1(["a"], {"a"}) == 1.0
    assert lexical_f1(["a", "a"], {"a"}) == 1.0  # repeats count once ("movies sharing a director")
    assert lexical_f1(["a", "b"], {"b"}) == pytest.approx(2 / 3)
    assert lexical_f1(["a"], {"a", "b"}) == pytest.approx(2 / 3)
    assert lexical_f1(["a"], set()) == 0.0 and lexical_f1([], {"a"}) == 0.0 and lexical_f1(["c"], {"a"}) == 0.0
    rng = np.random.default_rng()
    for _ in range(500):
        path = list(rng.choice(list("abcde"), int(rng.integers(1, 4))))
        named = set(rng.choice(list("abcde"), int(rng.integers(0, 4))))
        tp = len(set(path) & named)
        ref = 0.0 if not tp else 2 * tp / (len(set(path)) + len(named))  # F1 = 2TP / (|P| + |N|)
        assert lexical_f1(path, named) == pytest.approx(ref)


def test_named_relations_ignore_direction_and_words_common_to_many_names(kg):
    eng, ret = kg
    asker = Asker(eng, ret)
    words = dict(asker.relation_words())
    assert words["directed_by"] == ("directed",) and words["starred_actors"] == ("starred", "actors")
    names = ret.graph.relation_names
    assert len(asker.relation_words()) == len(names)
    for n, (base, _) in zip(names, asker.relation_words()):
        assert base == n.removesuffix("^-1")
    assert asker.named_relations("who is the writer of the film [X]") == {"written_by"}
    assert asker.named_relations("which director's films starred [X]") == {"directed_by", "starred_actors"}
    assert asker.named_relations("what genres are the movies by [X]") == {"has_genre"}
    assert asker.named_relations("who is [X]") == frozenset()


def test_a_word_in_many_relation_names_names_none_of_them(tmp_path):
    rels = ("film_directed_by", "film_written_by", "film_genre", "film_language", "person_born_in")
    art = make_artifact(tmp_path / "a", drop=0.0, relations=rels, num_entities=60)
    eng = Engine.load(art)
    asker = Asker(eng, eng.retriever(encoder="hashing", encoder_kwargs={"dim": 32, "seed": 0}))
    words = dict(asker.relation_words())
    assert "film" not in words["film_genre"] and words["film_genre"] == ("genre",)  # in 4 of 5 names
    assert words["person_born_in"] == ("person", "born")
    assert asker.named_relations("what film genre is [X]") == {"film_genre"}


@pytest.mark.parametrize("weight", [0.0, 0.4, 2.5])
def test_costs_move_by_exactly_the_weighted_f1(kg, weight):
    eng, ret = kg
    off = Asker(eng, ret, settings=AskSettings(lexical_weight=0.0, k=10_000))
    on = Asker(eng, ret, settings=AskSettings(lexical_weight=weight, k=10_000))
    rng = np.random.default_rng()
    texts = ["who directed the films written by", "what genres have the movies starred by", "who is"]
    for topic in rng.integers(0, len(eng.artifact.entities), 4).tolist():
        seqs, _ = on.reachable_sequences(topic, 3)
        if not seqs:
            continue
        for text in texts:
            a = off.score_sequences([seqs], [text])[0]
            b = on.score_sequences([seqs], [text])[0]
            named = on.named_relations(text)
            base = on.relation_words()
            f1 = np.array([lexical_f1([base[r][0] for r in x], named) for x in seqs])
            np.testing.assert_allclose(a - b, weight * f1, atol=1e-9)
    assert not on.named_relations("who is")  # nothing named: the costs are exactly the others'


def test_a_path_following_every_named_relation_wins_over_its_prefix(kg):
    eng, ret = kg
    asker = Asker(eng, ret, settings=AskSettings(lexical_weight=10.0, k=10_000))
    ids = {n: i for i, n in enumerate(ret.graph.relation_names)}
    seqs = [(ids["directed_by^-1"],), (ids["directed_by^-1"], ids["written_by"])]
    cost = asker.score_sequences([seqs], [question_text("who was the writer of the films directed by [X]")])[0]
    assert cost[1] < cost[0]


@pytest.mark.parametrize("bad", [-0.1, 10.5, True, "0.4", float("nan")])
def test_lexical_weight_is_checked(bad):
    with pytest.raises(UserError, match="--lexical-weight must be"):
        AskSettings(lexical_weight=bad)


def test_function_words_are_lower_case_letters():
    assert all(w.isalpha() and w.islower() for w in FUNCTION_WORDS)
    assert not set(itertools.chain.from_iterable(content_words(w) for w in FUNCTION_WORDS))


@pytest.mark.parametrize("bad", ["-1", "11", "nan"])
def test_cli_lexical_weight_out_of_range_is_one_error_line(bad, capsys):
    from engine.ask import main

    assert main(["who is [X]", "--lexical-weight", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --lexical-weight must be in [0, 10]") and "Traceback" not in err


def test_cli_lexical_weight_reaches_the_settings(kg, tmp_path, monkeypatch):
    """`--lexical-weight W` gives the same answers as AskSettings(lexical_weight=W) in Python."""
    import io
    import json

    from engine.ask import parse_args, run
    from llm_bridge.prompts import fallback_template

    eng, ret = kg
    art = eng.artifact.path
    q = f"who was the writer of the films directed by [{eng.artifact.entities[3]}]"
    assert parse_args([q, "--lexical-weight", "2.5"]).lexical_weight == 2.5
    assert parse_args([q]).lexical_weight == AskSettings().lexical_weight
    seen = []
    for w in (0.0, 2.5):
        out = io.StringIO()
        run(parse_args(["--artifact", str(art), "--encoder", "hashing", "--encoder-kwargs",
                        json.dumps({"dim": 64, "seed": 1}), "--json", "--lexical-weight", str(w), q]), out, io.StringIO())
        got = json.loads(out.getvalue())
        ref = eng.ask(q, retriever=ret, verbalizer=fallback_template, lexical_weight=w)
        assert [p["relations"] for p in got["paths"]] == [list(p.names) for p in ref.paths]
        seen.append([p["relations"] for p in got["paths"]])
    assert seen[0] != seen[1]  # the weight changes this question's ranking, so a dropped flag would show
