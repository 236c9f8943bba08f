"""The kind term of embedding-only retrieval (engine.exec.ask: kind_phrase, Asker.kind_texts, Asker.kind_scores,
AskSettings.kind_weight / kind_words / kind_coverage): what kind of entity a path ends in, read from the KG, against
what kind of thing the question asks for."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from engine.exec.api import Engine
from engine.exec.ask import Asker, AskSettings, kind_phrase
from kgreason.errors import UserError

ENC = {"dim": 64, "seed": 1}


@pytest.fixture(scope="module")
def films(tmp_path_factory):
    """6 films, each directed by one of 3 people and released in one of 2 years (and the inverses); one
    director also wrote 2 films; a film without a year."""
    from kge.artifact import Artifact

    films = [f"film{i}" for i in range(6)]
    people = ["Ann", "Bob", "Cy"]
    years = ["1999", "2000"]
    ents = films + people + years
    rels = ["directed_by", "directed_by^-1", "release_year", "release_year^-1", "written_by", "written_by^-1"]
    e = {n: i for i, n in enumerate(ents)}
    fwd = [(f"film{i}", 0, people[i % 3]) for i in range(6)] + [(f"film{i}", 2, years[i % 2]) for i in range(5)]
    fwd += [("film0", 4, "Ann"), ("film3", 4, "Ann")]
    obs = np.array([[e[h], r, e[t]] for h, r, t in fwd] + [[e[t], r + 1, e[h]] for h, r, t in fwd])
    n = len(ents)
    m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(len(rels) * n, n))
    path = tmp_path_factory.mktemp("kind") / "films"
    Artifact(entities=ents, relations=rels, matrices=m, observed=obs, missing=np.zeros((0, 3), np.int64),
             meta={"source": "generated:test_ask_kind"}).save(path)
    eng = Engine.load(path)
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
    texts = ["which films share the director of", "who directed", "what year"]
    seqs = [off.reachable_sequences(0, 3)[0]] * len(texts)
    base = off.score_sequences(seqs, texts)
    for w in (0.5, 2.0):
        on = Asker(eng, ret, settings=AskSettings(kind_weight=w))
        kinds = on.kind_scores(texts)
        assert kinds.shape == (len(texts), len(ret.graph.relation_names))
        assert not kinds[1].any()  # "who" alone names no kind of thing
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
