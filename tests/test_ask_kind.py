"""The kind term of embedding-only retrieval (engine.exec.ask: kind_phrase, Asker.kind_texts, Asker.kind_scores,
AskSettings.kind_weight / kind_words / kind_coverage): what kind of entity a path ends in, read from the KG, against
what kind of thing the question asks for."""
from __future__ import annotations

import numpy as np
import pytest
from _kg import save_named_kg

from engine.exec.api import Engine
from engine.exec.ask import Asker, AskSettings, kind_phrase
from kgreason.errors import UserError

ENC = {"dim": 64, "seed": 1}


@pytest.fixture(scope="module")
def films(tmp_path_factory):
    """6 films, each directed by one of 3 people and released in one of 2 years (and the inverses); one
    director also wrote 2 films; a film without a year."""

    films = [f"film{i}" for i in range(6)]
    people = ["Ann", "Bob", "Cy"]
    years = ["1999", "2000"]
    ents = films + people + years
    rels = ["directed_by", "directed_by^-1", "release_year", "release_year^-1", "written_by", "written_by^-1"]
    fwd = [(f"film{i}", 0, people[i % 3]) for i in range(6)] + [(f"film{i}", 2, years[i % 2]) for i in range(5)]
    fwd += [("film0", 4, "Ann"), ("film3", 4, "Ann")]
    eng = Engine.load(save_named_kg(tmp_path_factory.mktemp("kind") / "films", ents, rels, fwd,
                                    source="generated:test_ask_kind"))
    return eng, eng.retriever(encoder="hashing", encoder_kwargs=ENC)


@pytest.mark.parametrize("text, words, phrase", [
    ("what are the movies that share the same director", 2, "what movies that"),
    ("what are the movies that share the same director", 1, "what movies"),
    ("which films share the same director of", 1, "which films"),
    ("the films acted by were released in which years", 1, "which years"),
    ("when were the movies starred by released", 1, "when"),  # a time, not movies
    ("who acted in the films directed by", 2, "who"),
    ("how many films did direct", 1, "how many"),
    ("What is the genre of", 1, "What genre"),
    ("films directed by", 1, "films directed"),  # no question word: the first words
    ("which", 2, "which"),
])
def test_kind_phrase(text, words, phrase):
    assert kind_phrase(text, words) == phrase


def test_kind_texts_say_what_the_entities_a_relation_reaches_are(films):
    eng, ret = films
    texts = dict(zip(ret.graph.relation_names, Asker(eng, ret).kind_texts()))
    # Films: the attributes most of them have (5 of the 6 have a year; 2 a writer), in name order; every
    # relation reaching a subset of the films (release_year^-1, written_by^-1) reads as the one reaching
    # them all (KIND_CONTAINMENT).  People and years: the roles they play.  Ann, the one writer, is also a
    # director: written_by reads as directed_by, whose tails hold its own; 1 of the 3 directors writes
    # (< kind_coverage), so directors are "the directed by" only.
    film = "thing with directed by, release year"
    assert texts["directed_by^-1"] == texts["release_year^-1"] == texts["written_by^-1"] == film
    assert texts["directed_by"] == texts["written_by"] == "the directed by"
    assert texts["release_year"] == "the release year"
    low = dict(zip(ret.graph.relation_names, Asker(eng, ret, settings=AskSettings(kind_coverage=0.3)).kind_texts()))
    assert low["directed_by"] == "the directed by or written by"  # 1 of 3 directors writes: >= 0.3
    assert low["directed_by^-1"] == "thing with directed by, release year, written by"


def test_costs_move_by_exactly_the_weighted_kind_score(films):
    eng, ret = films
    off = Asker(eng, ret, settings=AskSettings(kind_weight=0.0))
    texts = ["which films share the director of", "who was there", "what year", "who directed"]
    seqs = [off.reachable_sequences(0, 3)[0]] * len(texts)
    base = off.score_sequences(seqs, texts)
    for w in (0.5, 2.0):
        on = Asker(eng, ret, settings=AskSettings(kind_weight=w, kind_who=False))
        kinds = on.kind_scores(texts)
        assert kinds.shape == (len(texts), len(ret.graph.relation_names))
        assert not kinds[1].any()  # "who" alone (naming no relation, without kind_who) names no kind of thing
        assert kinds[3].any()  # "who directed": the kind of what directed_by reaches
        assert kinds[0].any() and kinds[2].any()
        for i, got in enumerate(on.score_sequences(seqs, texts)):
            want = base[i] - w * kinds[i][[x[-1] for x in seqs[i]]]
            np.testing.assert_allclose(got, want, atol=1e-9)


@pytest.mark.parametrize("field, bad", [("kind_weight", -0.1), ("kind_weight", 11.0), ("kind_weight", True),
                                        ("kind_coverage", 0.0), ("kind_coverage", 1.5), ("kind_words", -1),
                                        ("kind_words", 1.5)])
def test_kind_settings_are_checked(field, bad):
    with pytest.raises(UserError, match="^--" + field.replace("_", "-") + " must be"):  # the flag's words
        AskSettings(**{field: bad})


def test_cli_defaults_are_the_settings_defaults():
    import engine.ask as cli

    assert issubclass(cli.AskConfig, AskSettings)  # the CLI's config is the settings plus its own fields: one default
    cfg = cli.parse_args(["who is [X]", "--artifact", "a"])
    assert (cfg.lexical_weight, cfg.kind_weight) == (AskSettings().lexical_weight, AskSettings().kind_weight)
    assert cli.parse_args(["who is [X]", "--artifact", "a", "--kind-weight", "0.25"]).kind_weight == 0.25


@pytest.mark.parametrize("bad", ["-1", "11", "nan"])
def test_cli_kind_weight_out_of_range_is_one_error_line(bad, capsys):
    from engine.ask import main

    assert main(["who is [X]", "--kind-weight", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --kind-weight must be in [0, 10]") and "Traceback" not in err


def _names(word):
    """A stand-in for PathScorer.names_relation: the words of a KG with directors, writers, genres, languages."""
    from engine.exec.ask import words_match

    return any(words_match(word, w) for w in ("directed", "written", "starred", "actors", "genre", "language"))


@pytest.mark.parametrize("text, word", [
    ("what film genre is", "genre"),  # the noun of the phrase, not the topic's kind before it
    ("what is the primary language in", "language"),
    ("what are the main languages in starred movies", "languages"),
    ("which films share the same director of", None),  # "films" names no relation: the phrase as before
    ("what is a movie written by", None),  # a passive verb says what the movie underwent
    ("what does star in", None),  # "does": no noun follows
    ("which person wrote the films acted by", "wrote"),  # an irregular past form names written_by
    ("who are the writers of the films", "writers"),
    ("who is listed as director of written films", "director"),
    ("who acted in the movies directed by", None),  # "directed by": passive, not the agent asked for
    ("the movies that share actors with the movie are directed by who", "directed"),  # before a final "who"
    ("the screenwriter co-wrote movies with who", "wrote"),
    ("when were the movies directed by released", None),  # only which / what / who / whom
])
def test_kind_word(text, word):
    from engine.exec.ask_text import kind_word

    assert kind_word(text, _names, 3) == word
    assert kind_word(text, _names, 0) is None  # window 0: off


@pytest.mark.parametrize("text, phrase", [
    ("what film genre is", "what genre"),
    ("who are the writers of", "who writers"),
    ("the actor is a co-star of who", "who star"),
    ("who was born there", "which person"),  # a "who" naming no relation: kind_who's phrase
    ("which films share the same director of", "which films"),
])
def test_kind_phrase_with_a_word_naming_a_relation(text, phrase):
    assert kind_phrase(text, 1, names=_names, window=3, person="which person") == phrase


def test_named_kind_word_reads_as_the_kind_of_the_relation_it_names(films):
    """kind_named: a kind word naming a relation is compared kind text with kind text, so the question asks for
    what the named relation reaches (its tails) and a round trip back to the topic's kind loses."""
    eng, ret = films
    names = ret.graph.relation_names
    on = Asker(eng, ret, settings=AskSettings(kind_window=3, kind_named=True))
    texts = ["what film year is", "the films are directed by who"]
    kinds = on.kind_scores(texts)
    K = on._kind_embeddings()
    for i, rel in enumerate(("release_year", "directed_by")):
        r = names.index(rel)
        np.testing.assert_allclose(kinds[i], K @ K[r], atol=1e-9)  # the named relation's own kind text
        assert kinds[i][r] == pytest.approx(1.0)
        assert kinds[i][r] > kinds[i][names.index(rel + "^-1")] + 0.5  # films are not what it asks for
    # Off (the stop-38 settings): the same questions embed "what film" and "who" (no kind term).
    off = Asker(eng, ret, settings=AskSettings(kind_window=0, kind_who=False, kind_named=False)).kind_scores(texts)
    assert not off[1].any()
    # The round trip year -> films ("what film year": the word "film" pulled it) loses to the year itself.
    seqs = [(names.index("release_year"),), (names.index("release_year"), names.index("release_year^-1"))]
    only_kind = dict(length_penalty=0.0, length_prior=0.0, answer_type_weight=0.0, lexical_weight=0.0)
    got = Asker(eng, ret, settings=AskSettings(kind_window=3, kind_named=True, **only_kind)).score_sequences(
        [seqs], ["what film year is"])[0]
    base = Asker(eng, ret, settings=AskSettings(kind_weight=0.0, **only_kind)).score_sequences(
        [seqs], ["what film year is"])[0]
    w = AskSettings().kind_weight
    np.testing.assert_allclose(got, base - w * kinds[0][[s[-1] for s in seqs]], atol=1e-9)
    assert got[0] - base[0] < got[1] - base[1] - 0.5 * w


def test_who_reads_as_a_person_only_with_kind_who(films):
    eng, ret = films
    texts = ["who was born there"]
    assert not Asker(eng, ret, settings=AskSettings(kind_who=False)).kind_scores(texts).any()
    on = Asker(eng, ret, settings=AskSettings(kind_who=True)).kind_scores(texts)
    np.testing.assert_allclose(on[0], _kind_row(eng, ret, "which person"), atol=1e-9)


def _kind_row(eng, ret, phrase):
    a = Asker(eng, ret)
    return (a.phrase_embeddings([phrase]) @ a._kind_embeddings().T)[0]
