"""KG context formats (engine.exec.context): content, nesting, YAML round trip, token bounds on random inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.exec.context import CONTEXT_STYLES, ContextPath, estimate_tokens, format_context
from kgreason.errors import UserError


def random_paths(rng: np.random.Generator, n_paths: int) -> list[ContextPath]:
    ents = [f"Ent {i}" for i in range(30)] + ['Quote "q" name', "colon: name", "- dash", "#hash", "ünï"]
    rels = ["directed_by", "starred_actors^-1", "has_genre", "written_by^-1"]
    out = []
    for _ in range(n_paths):
        L = int(rng.integers(1, 4))
        path_rels = tuple(rels[int(i)] for i in rng.integers(0, len(rels), L))
        topic = ents[int(rng.integers(len(ents)))]
        evidence = []
        for _ in range(int(rng.integers(0, 4))):
            h, edges = topic, []
            for r in path_rels:
                t = ents[int(rng.integers(len(ents)))]
                edges.append((h, r, t))
                h = t
            evidence.append(tuple(edges))
        answers = tuple(dict.fromkeys(ents[int(i)] for i in rng.integers(0, len(ents), int(rng.integers(0, 25)))))
        out.append(ContextPath(topic=topic, relations=path_rels, answers=answers, evidence=tuple(evidence),
                               num_answers=len(answers) + int(rng.integers(0, 5))))
    return out


def test_formats_hold_every_path_edge_and_answer_without_a_bound():
    p = ContextPath(topic="John Krasinski", relations=("starred_actors^-1", "directed_by"),
                    answers=("George Clooney", "Sam Mendes"),
                    evidence=((("John Krasinski", "starred_actors^-1", "Leatherheads"),
                               ("Leatherheads", "directed_by", "George Clooney")),
                              (("John Krasinski", "starred_actors^-1", "Away We Go"),
                               ("Away We Go", "directed_by", "Sam Mendes"))),
                    num_answers=5)
    tri = format_context([p], style="triples")
    assert tri.splitlines()[0] == "path 1: starred_actors^-1 -> directed_by (5 answers)"
    assert "  (Leatherheads, directed_by, George Clooney)" in tri
    assert "answers: George Clooney; Sam Mendes (+3 more)" in tri
    lists = format_context([p], style="lists").splitlines()
    # One nesting level per hop under the topic.
    assert lists[1] == "  - John Krasinski"
    assert lists[2] == "    - starred_actors^-1: Leatherheads"
    assert lists[3] == "      - directed_by: George Clooney"
    assert lists[4] == "    - starred_actors^-1: Away We Go"
    y = format_context([p], style="yaml")
    assert "more_answers: 3" in y
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(y)
    assert doc[0]["relations"] == ["starred_actors^-1", "directed_by"]
    assert doc[0]["subgraph"][1] == ["Leatherheads", "directed_by", "George Clooney"]
    assert doc[0]["answers"] == ["George Clooney", "Sam Mendes"]


def test_lists_merge_shared_prefixes():
    ev = ((("A", "r", "B"), ("B", "s", "C")), (("A", "r", "B"), ("B", "s", "D")))
    text = format_context([ContextPath("A", ("r", "s"), ("C", "D"), ev)], style="lists")
    assert text.count("- r: B") == 1 and "- s: C" in text and "- s: D" in text


@pytest.mark.parametrize("style", CONTEXT_STYLES)
def test_random_paths_stay_within_the_token_bound(style, seed):
    rng = np.random.default_rng(seed)
    yaml = None
    try:
        import yaml
    except ImportError:
        pass
    for trial in range(30):
        paths = random_paths(rng, int(rng.integers(1, 12)))
        full = format_context(paths, style=style)
        budget = int(rng.integers(0, estimate_tokens(full) + 10))
        words = lambda t: len(t.split())  # noqa: E731 - a second tokenizer
        for count in (None, words):
            text = format_context(paths, style=style, max_tokens=budget, count_tokens=count)
            assert (count or estimate_tokens)(text) <= budget, (trial, budget)
            if (count or estimate_tokens)(full) <= budget:
                assert text == full
            if text and style == "yaml" and yaml is not None:
                doc = yaml.safe_load(text)
                assert isinstance(doc, list) and all(d["path"] == i for i, d in enumerate(doc, 1))
                for d, p in zip(doc, paths):
                    assert d["relations"] == list(p.relations) and d["topic"] == p.topic
                    assert d["answers"] == list(p.answers[: len(d["answers"])])
                    assert len(d["answers"]) + d.get("more_answers", 0) == p.total
            if text:
                assert text.splitlines()[0].lstrip("- ").startswith("path")


def test_bound_shrinks_answers_before_dropping_paths():
    paths = [ContextPath("T", ("r",), tuple(f"answer {i}" for i in range(50))) for _ in range(3)]
    full = format_context(paths, style="triples")
    text = format_context(paths, style="triples", max_tokens=estimate_tokens(full) // 2)
    assert text.count("path ") == 3 and "more)" in text
    tiny = format_context(paths, style="triples", max_tokens=30)
    assert estimate_tokens(tiny) <= 30 and "more path" in tiny
    assert format_context(paths, style="triples", max_tokens=1) == ""


def test_bad_style_names_the_known_ones():
    with pytest.raises(UserError, match="triples"):
        format_context([], style="xml")
    assert json.loads(json.dumps(format_context([], style="yaml"))) == ""
