"""Relation names of every naming style -> readable words and natural fallback sub-questions.

CI runs the hand-written names of each style and pykeen's bundled UMLS/Nations/Kinships relations;
the FB15k-237 and MetaQA tests run every relation name of the shared data and skip without it
(NELL-995's BetaE split has relation ids only: its style is covered by the hand-written list).
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_bridge import prompts
from llm_bridge.prompts import fallback_template, fallback_templates

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
# What must never reach a question: path/dotted/snake separators, the inverse suffix, camelCase humps.
LEFTOVERS = re.compile(r"[./_^\\:]|\^-1|[a-z][A-Z]")
WORD = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")  # humps are caught by LEFTOVERS


def check_question(relation: str, question: str) -> None:
    """One ``{entity}`` slot, a capital first letter and a "?", words only (no leftovers of the name)."""
    assert question.count(prompts.ENTITY_SLOT) == 1, (relation, question)
    assert prompts.clean_question_template(question) == question, (relation, question)
    body = question.replace(prompts.ENTITY_SLOT, "")
    assert not LEFTOVERS.search(body), (relation, question)
    assert question[0].isupper() and question.endswith("?"), (relation, question)
    words = body.rstrip("?").split()
    assert words and all(WORD.match(w) for w in words), (relation, question)
    assert "  " not in question


def check_relation(relation: str) -> tuple[str, str]:
    forward, inverse = prompts.fallback_templates(relation)
    check_question(relation, forward)
    check_question(relation, inverse)
    assert forward != inverse, relation
    words = prompts.relation_words(relation)
    assert words and not LEFTOVERS.search(words), (relation, words)
    # an inverse name asks the inverse question of its base name
    assert prompts.fallback_template(relation) == forward
    assert prompts.fallback_template(relation + "^-1") == inverse
    assert prompts.relation_words(relation + "^-1") == words
    return forward, inverse


# ---------------------------------------------------------------------- one list per naming style
FREEBASE = {
    "/film/film/directed_by": ("directed by", "Who or what is the film {entity} directed by?",
                               "Which film is directed by {entity}?"),
    "/location/country/form_of_government": (
        "form of government", "Who or what is the form of government of the country {entity}?",
        "Which country has {entity} as its form of government?"),
    "/film/actor/film./film/performance/film": ("film", "Who or what is the film of the actor {entity}?",
                                                "Which actor has {entity} as its film?"),
    "/location/location/contains": ("contains", "Who or what does the location {entity} contain?",
                                    "Which location contains {entity}?"),
    "/award/award_nominee/award_nominations./award/award_nomination/nominated_for": (
        "nominated for", "Who or what is the award nominee {entity} nominated for?",
        "Which award nominee is nominated for {entity}?"),
    "/olympics/olympic_games/sports": ("sports", "Who or what are the sports of the olympic games {entity}?",
                                       "Which olympic games has {entity} among its sports?"),
}
DOTTED = {
    "royalty.chivalric_office.position_holders": (
        "position holders", "Who or what are the position holders of the chivalric office {entity}?",
        "Which chivalric office has {entity} among its position holders?"),
    "people.person.place_of_birth": ("place of birth", "Who or what is the place of birth of the person {entity}?",
                                     "Which person has {entity} as its place of birth?"),
    "film.film.written_by": ("written by", "Who or what is the film {entity} written by?",
                             "Which film is written by {entity}?"),
}
METAQA = {
    "directed_by": ("directed by", "Who or what is {entity} directed by?", "Who or what is directed by {entity}?"),
    "written_by": ("written by", "Who or what is {entity} written by?", "Who or what is written by {entity}?"),
    "starred_actors": ("starred actors", "Who or what are the starred actors of {entity}?",
                       "Which entities have {entity} among their starred actors?"),
    "has_tags": ("has tags", "What tags does {entity} have?", "Who or what has {entity} among its tags?"),
    "has_genre": ("has genre", "What genre does {entity} have?", "Who or what has {entity} as its genre?"),
    "in_language": ("in language", "In which language is {entity}?", "Who or what is in the language {entity}?"),
    "release_year": ("release year", "Who or what is the release year of {entity}?",
                     "Which entities have {entity} as their release year?"),
}
CAMEL = {
    "bornIn": ("born in", "Who or what was {entity} born in?", "Who or what was born in {entity}?"),
    "isPartOf": ("is part of", "Who or what is {entity} part of?", "Who or what is part of {entity}?"),
    "hasChild": ("has child", "What child does {entity} have?", "Who or what has {entity} as its child?"),
    "actedIn": ("acted in", "Who or what did {entity} act in?", "Who or what acted in {entity}?"),
    "hasWonPrize": ("has won prize", "What prize has {entity} won?", "Who or what has won {entity}?"),
    "dealsWith": ("deals with", "Who or what does {entity} deal with?", "Who or what deals with {entity}?"),
    "worksAtURL": ("works at URL", "What URL does {entity} work at?", "Who or what works at {entity}?"),
}
SNAKE = {
    "interacts_with": ("interacts with", "Who or what does {entity} interact with?",
                       "Who or what interacts with {entity}?"),
    "part_of": ("part of", "Who or what is {entity} the part of?", "Who or what is the part of {entity}?"),
    "co-occurs_with": ("co-occurs with", "Who or what does {entity} co-occur with?",
                       "Who or what co-occurs with {entity}?"),
    "_member_meronym": ("member meronym", "Who or what is the member meronym of {entity}?",
                        "Which entities have {entity} as their member meronym?"),
}
NELL = {
    "concept:athleteplaysforteam": ("athlete plays for team", "Which team does {entity} play for?",
                                    "Which athlete plays for {entity}?"),
    "concept:athleteplayssport": ("athlete plays sport", "Which sport does {entity} play?",
                                  "Which athlete plays {entity}?"),
    "concept:personborninlocation": ("person born in location", "Which location was {entity} born in?",
                                     "Which person was born in {entity}?"),
    "concept:citycapitalofcountry": ("city capital of country", "Which country is {entity} the capital of?",
                                     "Which city is the capital of {entity}?"),
    "concept:organizationhiredperson": ("organization hired person", "Which person did {entity} hire?",
                                        "Which organization hired {entity}?"),
    "concept:agentcollaborateswithagent": ("agent collaborates with agent",
                                           "Which agent does {entity} collaborate with?",
                                           "Which agent collaborates with {entity}?"),
    "concept:teamplaysinleague": ("team plays in league", "Which league does {entity} play in?",
                                  "Which team plays in {entity}?"),
    "concept:worksfor": ("works for", "Who or what does {entity} work for?", "Who or what works for {entity}?"),
    "concept:agentcontrols": ("agent controls", "Who or what does {entity} control?", "Which agent controls {entity}?"),
    "concept:istallerthan": ("is taller than", "Who or what is {entity} taller than?",
                             "Who or what is taller than {entity}?"),
    "concept:teamhomestadium": ("team home stadium", "Who or what is the home stadium of {entity}?",
                                "Which team has {entity} as its home stadium?"),
}
STYLES = {"freebase": FREEBASE, "dotted": DOTTED, "metaqa": METAQA, "camel": CAMEL, "snake": SNAKE, "nell": NELL}


@pytest.mark.parametrize("relation,expected", [(r, e) for style in STYLES.values() for r, e in style.items()])
def test_each_style(relation, expected):
    words, forward, inverse = expected
    assert prompts.relation_words(relation) == words
    assert check_relation(relation) == (forward, inverse)


@pytest.mark.parametrize("suffix", ["^-1", "_inv"])
def test_inverse_suffixes_ask_the_reverse_question(suffix):
    assert prompts.fallback_template("concept:athleteplaysforteam" + suffix) == "Which athlete plays for {entity}?"
    assert prompts.fallback_template("directed_by" + suffix) == "Who or what is directed by {entity}?"


def test_unsplittable_concatenation_stays_whole():
    # no full split over the lexicon: the token is kept rather than cut into nonsense
    assert prompts.relation_words("concept:zqxwvutsrp") == "zqxwvutsrp"
    check_relation("concept:zqxwvutsrp")


@pytest.mark.parametrize("relation", ["", "^-1", "_", "/", ".", "a", "X", "concept:", "/m/", "__x__", "ÉtéÀ_Paris"])
def test_odd_names_still_give_one_slot(relation):
    forward, inverse = prompts.fallback_templates(relation)
    for q in (forward, inverse):
        assert q.count(prompts.ENTITY_SLOT) == 1 and "\n" not in q and '"' not in q


@pytest.mark.parametrize("dataset", ["UMLS", "Nations", "Kinships"])
def test_every_pykeen_bundled_relation(dataset):
    import pykeen.datasets

    relations = list(getattr(pykeen.datasets, dataset)().training.relation_to_id)
    assert relations
    for r in relations:
        check_relation(r)


# ------------------------------------------------------------------------------ shared data
def _need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"{path} is not here (shared benchmark data)")
    return path


def test_every_fb15k237_relation():
    path = _need(DATA / "betae" / "FB15k-237-betae" / "id2rel.tsv")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 474
    for row in rows:
        name = row["relation"] + ("^-1" if row["direction"] == "inverse" else "")
        forward, inverse = check_relation(row["relation"])
        assert prompts.fallback_template(name) == (inverse if row["direction"] == "inverse" else forward)


def test_every_metaqa_relation():
    path = _need(DATA / "metaqa" / "kb.txt")
    relations = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("|")
            if len(parts) == 3:
                relations.add(parts[1])
    assert len(relations) == 9
    for r in sorted(relations):
        check_relation(r)
    assert prompts.fallback_template("has_tags") == "What tags does {entity} have?"


def test_sidecar_names_of_long_model_names_stay_distinct():
    """Regression: the sidecar name was cut at 120 characters after the hash was appended, so two model
    names sharing their first 120 characters shared one sidecar (one model's templates replayed for the other)."""
    from llm_bridge.relations import _slug

    a, b = "org/" + "m" * 150 + "-v1", "org/" + "m" * 150 + "-v2"
    c, d = "x" * 130 + "1", "x" * 130 + "2"  # allowed characters only: no substitution
    slugs = {_slug(m) for m in (a, b, c, d)}
    assert len(slugs) == 4 and all(len(s) <= 120 for s in slugs)
    assert _slug("sim") == "sim" and _slug("gpt-4o-mini") == "gpt-4o-mini"
    assert _slug("sim/model:1") == _slug("sim/model:1") != _slug("sim/model:2")


@pytest.mark.parametrize("name", [
    "x" * 5000,                                          # over clean_question_template's 300 characters
    "has_" + "very_" * 200 + "long_part",
    "/" + "a" * 300 + "/" + "b" * 300 + "/" + "c" * 400 + "^-1",
    "a/._", ". .", "a:. .", "_/._",                      # a part of punctuation alone (IndexError)
])
def test_every_relation_name_gets_a_fallback_question(name):
    """Regression: relation names over ~270 characters (ValueError) or with a '.'/'/' part of punctuation
    alone (IndexError) crashed RelationQuestions, so engine.answer --llm on such an artifact was a traceback."""
    from llm_bridge.relations import RelationQuestions

    for t in fallback_templates(name) + (fallback_template(name),):
        assert t.count("{entity}") == 1 and len(t) <= 300, t
    names = [name, name + "2", name + "^-1"]
    rq = RelationQuestions(relations=names)  # long names that clash get distinct qualified questions
    templates = [rq.template(r) for r in names]
    assert len({" ".join(t.split()).casefold() for t in templates}) == 3
    assert all(rq.lookup(t) == r for r, t in zip(names, templates))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet="ab_/.:^-1 xyz{}C\u00e9", max_size=400))
def test_fallback_questions_of_random_relation_names(name):
    for t in fallback_templates(name):
        assert t.count("{entity}") == 1 and len(t) <= 300
