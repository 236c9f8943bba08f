"""The topic's kind word (engine.exec.ask_text.word_before_topic, PathScorer.scoring_text,
AskSettings.topic_kind_cos): a word right before the topic mention that names the topic's kind ("describe the
*film* [X]") is left out of the question text paths are scored against, so a question naming no relation
("which words describe film [X]") is not pulled towards the relations whose text sits near "film"."""
from __future__ import annotations

import numpy as np
import pytest
from _kg import save_named_kg

from engine.exec.api import Engine
from engine.exec.ask import Asker, AskSettings
from engine.exec.ask_text import question_text, word_before_topic
from engine.paths.embeddings import HashingEncoder


class BiasedEncoder(HashingEncoder):
    """Bag of words in which "film" reads as 2 x "directed" and "words" as 0.4 x "tags": MiniLM's pulls on
    MetaQA ("film" sits nearest the directors' question, "words" somewhat near "tags"), in a deterministic
    encoder."""

    ALIAS = {"film": ("directed", 2.0), "words": ("tags", 0.4)}

    def __init__(self) -> None:
        super().__init__(dim=256, seed=3)
        self.name = "biased-hashing"

    def _word(self, w: str) -> np.ndarray:
        if w in self.ALIAS:
            base, scale = self.ALIAS[w]
            return scale * super()._word(base)
        return super()._word(w)


@pytest.fixture(scope="module")
def films(tmp_path_factory):
    """4 films, each directed by one of 2 people, released in one of 2 years and tagged with 2 of 3 tags
    (and the inverses)."""

    films = [f"film{i}" for i in range(4)]
    people, years, tags = ["Ann", "Bob"], ["1999", "2000"], ["heist", "snow", "robots"]
    ents = films + people + years + tags
    rels = ["directed_by", "directed_by^-1", "has_tags", "has_tags^-1", "release_year", "release_year^-1"]
    fwd = [(f, 0, people[i % 2]) for i, f in enumerate(films)] + [(f, 4, years[i % 2]) for i, f in enumerate(films)]
    fwd += [(f, 2, tags[(i + j) % 3]) for i, f in enumerate(films) for j in range(2)]
    eng = Engine.load(save_named_kg(tmp_path_factory.mktemp("topic_kind") / "films", ents, rels, fwd,
                                    source="generated:test_ask_topic_kind"))
    return eng, eng.retriever(encoder=BiasedEncoder())


@pytest.mark.parametrize("question, topic, word", [
    ("which words describe film [X]", None, "film"),
    ("describe the movie [X] in a few words", None, "movie"),
    ("describe [X]", None, "describe"),  # a verb: scoring_text keeps it (its cosine with the kind text decides)
    ("the actor Tom Hanks starred with who", "Tom Hanks", "actor"),  # no brackets: the topic's name
    ("who directed [X]", None, "directed"),  # scoring_text keeps a word naming a relation
    ("what is [X] about", None, None),  # "is": a short word
    ("films directed by [X]", None, None),  # "by": a function word
    ("the co-star of [X]", None, None),
    ("[X] was directed by who", None, None),  # nothing before the mention
    ("which films", None, None),  # no mention
])
def test_word_before_topic(question, topic, word):
    assert word_before_topic(question, topic) == word


def test_question_text_drops_the_word_before_the_topic():
    assert question_text("which words describe film [X]", drop_before=True) == "which words describe"
    assert question_text("the actor Tom Hanks starred with who", "Tom Hanks", drop_before=True) == "the starred with who"
    assert question_text("[X] was directed by who", drop_before=True) == "was directed by who"


def test_the_topics_kind_word_no_longer_picks_the_relation(films):
    """The question names no relation; "film" (the topic's kind) pulled it to directed_by, "words" asks for
    tags.  With the default topic_kind_cos, "film" is left out and has_tags answers; at 1 (off) the
    stop-40 behaviour comes back: the round trip through the director answers another film."""
    eng, ret = films
    q = "which words describe film [film0]"
    on = Asker(eng, ret)
    assert on.scoring_text(q, "film0", 0) == "which words describe"
    got = on.ask([q])[0]
    assert got.paths[0].names == ("has_tags",)
    assert {a.entity for a in got.answers[:2]} == {"heist", "snow"}
    off = Asker(eng, ret, settings=AskSettings(topic_kind_cos=1.0))
    assert off.scoring_text(q, "film0", 0) == "which words describe film"
    old = off.ask([q])[0]
    assert old.paths[0].names == ("directed_by", "directed_by^-1")
    assert old.answers[0].entity == "film2"


def test_a_word_naming_a_relation_or_far_from_the_topics_kind_is_kept(films):
    eng, ret = films
    a = Asker(eng, ret)
    # "directed" names directed_by: kept for the lexical term, whatever its cosine with the kind text.
    assert a.scoring_text("which films were directed [film0]", "film0", 0) == "which films were directed"
    # "heist" names no relation and shares no word with a film's kind text: not the topic's kind.
    assert a.scoring_text("what year is heist [film0]", "film0", 0) == "what year is heist"
    # A word left alone keeps the question ("film [film0]" would leave nothing to score).
    assert a.scoring_text("film [film0]", "film0", 0) == "film"
    # No topic id (not found): the plain text.
    assert a.scoring_text("which words describe film [film0]", "film0", None) == "which words describe film"
