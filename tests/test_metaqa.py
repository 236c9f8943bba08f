"""MetaQA: the kb.txt loader (kge.graph) and the question converter (engine.eval.metaqa).

The CI tests write a tiny MetaQA-format folder; the slow one reads the real
release from ../shared/data/metaqa and is skipped when it is absent.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from engine.eval.metaqa import (STEP_RELATIONS, gold_agreement, load_metaqa_questions, question_node)
from engine.eval.symbolic import answers as symbolic_answers
from engine.lang.query import parse, to_sexpr
from kge.graph import load_kg
from kge.index import TripleIndex
from kgreason.errors import UserError

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "metaqa"

KB = [
    ("Heat", "directed_by", "Michael Mann"),
    ("Heat", "starred_actors", "Al Pacino"),
    ("Heat", "starred_actors", "Robert De Niro"),
    ("Heat", "release_year", "1995"),
    ("Heat", "has_genre", "Crime"),
    ("The Godfather", "directed_by", "Francis Ford Coppola"),
    ("The Godfather", "starred_actors", "Al Pacino"),
    ("The Godfather", "release_year", "1972"),
    ("The Godfather", "has_genre", "Crime"),
    ("Taxi Driver", "directed_by", "Martin Scorsese"),
    ("Taxi Driver", "starred_actors", "Robert De Niro"),
    ("Taxi Driver", "written_by", "Paul Schrader"),
    ("Taxi Driver", "has_genre", "Drama"),
    ("Collateral", "directed_by", "Michael Mann"),
    ("Collateral", "starred_actors", "Tom Cruise"),
    ("Collateral", "has_tags", "los angeles"),
    ("Heat", "has_tags", "los angeles"),
    ("Heat", "directed_by", "Michael Mann"),  # a repeated line (same-title movies in the release)
]


def _brute(kb, topic: str, rels: list[str], exclude: bool) -> set[str]:
    """Reference: follow the path over Python sets of name triples (MetaQA's rule when ``exclude``)."""
    fwd = {}
    for h, r, t in kb:
        fwd.setdefault((h, r), set()).add(t)
        fwd.setdefault((t, r + "^-1"), set()).add(h)
    cur = {topic}
    for k, r in enumerate(rels):
        cur = set().union(*[fwd.get((x, r), set()) for x in cur]) if cur else set()
        if exclude and k >= 1:
            cur.discard(topic)
    return cur


def _write(folder: Path, kb, questions: dict[int, list[tuple[str, str, list[str]]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kb.txt").write_text("".join(f"{h}|{r}|{t}\n" for h, r, t in kb), encoding="utf-8")
    for hops, qs in questions.items():
        d = folder / f"{hops}-hop"
        d.mkdir(exist_ok=True)
        (d / "test.txt").write_text("".join(f"{q}\t{'|'.join(a)}\n" for q, _, a in qs), encoding="utf-8")
        (d / "qa_test_qtype.txt").write_text("".join(f"{t}\n" for _, t, _ in qs), encoding="utf-8")


def _questions(kb):
    """Gold answers computed by the reference, for every topic and qtype the tiny KB supports."""
    out = {1: [], 2: [], 3: []}
    types = {"actor": "starred_actors", "director": "directed_by", "writer": "written_by", "genre": "has_genre",
             "year": "release_year", "tags": "has_tags"}
    movies = sorted({h for h, _, _ in kb})
    for hops in (1, 2, 3):
        for path in itertools.product(types, repeat=(hops + 1) // 2):
            for start_movie in (True, False):
                seq, rels = [], []
                # alternate movie / other types: movie_to_X_to_movie... or X_to_movie_to_Y...
                cur = "movie" if start_movie else path[0]
                seq.append(cur)
                pi = 0 if start_movie else 1
                for _ in range(hops):
                    if cur == "movie":
                        nxt = path[min(pi, len(path) - 1)]
                        pi += 1
                        rels.append(types[nxt])
                    else:
                        nxt = "movie"
                        rels.append(types[cur] + "^-1")
                    seq.append(nxt)
                    cur = nxt
                qtype = "_to_".join(seq)
                topics = movies if start_movie else sorted({t for h, r, t in kb if r == types[seq[0]]})
                for topic in topics:
                    gold = _brute(kb, topic, rels, exclude=True)
                    if gold:
                        out[hops].append((f"what about [{topic}] here", qtype, sorted(gold)))
    return out


def test_metaqa_folder_is_detected_and_loaded(tmp_path):
    _write(tmp_path / "mqa", KB, {})
    kg = load_kg(tmp_path / "mqa")
    assert kg.stats["format"] == "metaqa"
    base = sorted({r for _, r, _ in KB})
    assert list(kg.relations) == [x for r in base for x in (r, r + "^-1")]
    assert set(kg.entities) == {x for h, _, t in KB for x in (h, t)}
    assert len(kg.train) == 2 * len(set(KB))  # the repeated line is removed, inverses added
    assert kg.stats["duplicates_removed_train"] == 2
    assert load_kg(tmp_path / "mqa" / "kb.txt").num_entities == kg.num_entities  # the file itself: tsv with '|'


def test_metaqa_folder_errors_name_the_file_and_line(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "kb.txt").write_text("A|r|B\nA|r\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"kb\.txt:2: expected 3 '\|'-separated fields"):
        load_kg(d)
    (d / "kb.txt").unlink()
    with pytest.raises(UserError, match=r"no train\.txt .*MetaQA kb\.txt"):
        load_kg(d)


def test_every_step_maps_to_a_relation_or_its_inverse():
    for step, rel in STEP_RELATIONS.items():
        a, b = step.split("_to_")
        assert (a == "movie") != (b == "movie")
        assert rel.endswith("^-1") == (b == "movie")


def test_converted_questions_match_gold_on_the_tiny_kb(tmp_path):
    qs = _questions(KB)
    assert all(qs[h] for h in qs)
    _write(tmp_path / "mqa", KB, qs)
    loaded = load_metaqa_questions(tmp_path / "mqa")
    assert [q.hops for q in loaded] == [h for h in (1, 2, 3) for _ in qs[h]]
    q = loaded[0]
    assert q.text == q.question.replace("[", "").replace("]", "") and f"[{q.topic}]" in q.question
    for q in loaded:
        assert parse(q.expression) == q.node and len(q.relations) == q.hops
    kg = load_kg(tmp_path / "mqa")
    stats = gold_agreement(loaded, kg)
    assert stats["equal"] == stats["total"] == len(loaded)
    # The bare chain misses MetaQA's exclusions: it differs from gold somewhere on this KB (so the
    # exclusion is what the equality above measured).
    assert gold_agreement(loaded, kg, exact=False)["equal"] < len(loaded)


def test_question_node_shapes():
    assert to_sexpr(question_node("T", ["a"])) == "(p a T)"
    assert to_sexpr(question_node("T", ["a", "b"])) == "(i (p b (p a T)) (n T))"
    assert to_sexpr(question_node("T", ["a", "b", "c"])) == "(i (p c (i (p b (p a T)) (n T))) (n T))"
    assert to_sexpr(question_node("T", ["a", "b", "c"], exclude_topic=False)) == "(p c (p b (p a T)))"


def test_expression_answers_equal_the_reference_on_random_kbs():
    rng = np.random.default_rng(0)
    rels = ["starred_actors", "directed_by", "has_genre"]
    for trial in range(5):
        movies = [f"m{i}" for i in range(8)]
        people = [f"p{i}" for i in range(6)] + ["m0"]  # a name that is both a movie and a tail
        kb = sorted({(str(rng.choice(movies)), str(rng.choice(rels)), str(rng.choice(people))) for _ in range(30)})
        ents = sorted({x for h, _, t in kb for x in (h, t)})
        rel_names = [x for r in sorted({r for _, r, _ in kb}) for x in (r, r + "^-1")]
        e_ix, r_ix = {e: i for i, e in enumerate(ents)}, {r: i for i, r in enumerate(rel_names)}
        trip = np.array([(e_ix[h], r_ix[r], e_ix[t]) for h, r, t in kb]
                        + [(e_ix[t], r_ix[r + "^-1"], e_ix[h]) for h, r, t in kb])
        graph = TripleIndex(trip, len(ents), len(rel_names))
        for _ in range(20):
            hops = int(rng.integers(1, 4))
            path = [str(rng.choice(rel_names)) for _ in range(hops)]
            topic = str(rng.choice(ents))
            for exclude in (True, False):
                node = question_node(e_ix[topic], [r_ix[r] for r in path], exclude_topic=exclude)
                got = {ents[i] for i in symbolic_answers([node], graph)[0]}
                assert got == _brute(kb, topic, path, exclude), (trial, topic, path, exclude)


def test_sampling_is_seeded_per_hop_and_keeps_file_order(tmp_path):
    qs = _questions(KB)
    _write(tmp_path / "mqa", KB, qs)
    a = load_metaqa_questions(tmp_path / "mqa", hops=[2], limit=3, seed=1)
    b = load_metaqa_questions(tmp_path / "mqa", hops=2, limit=3, seed=1)
    assert [q.line for q in a] == [q.line for q in b] and len(a) == 3
    assert [q.line for q in a] == sorted(q.line for q in a)
    many = [tuple(q.line for q in load_metaqa_questions(tmp_path / "mqa", hops=2, limit=3, seed=s)) for s in range(6)]
    assert len(set(many)) > 1
    assert len(load_metaqa_questions(tmp_path / "mqa", hops=1, limit=10**6)) == len(qs[1])


@pytest.mark.parametrize("edit, message", [
    (lambda d: (d / "2-hop" / "qa_test_qtype.txt").write_text("actor_to_movie_to_directr\n"), "unknown step 'movie_to_directr'.*closest first.*movie_to_director"),
    (lambda d: (d / "2-hop" / "test.txt").write_text("no brackets here\tX\n"), r"test\.txt:1: expected exactly one \[topic entity\]"),
    (lambda d: (d / "2-hop" / "test.txt").write_text("a [b] c\n"), r"test\.txt:1: expected 'question<TAB>answers'"),
    (lambda d: (d / "2-hop" / "qa_test_qtype.txt").write_text("movie_to_actor_to_movie\n" * 2), "2 types but .* questions"),
    (lambda d: (d / "2-hop" / "test.txt").unlink(), r"2-hop/test\.txt: file not found"),
])
def test_question_file_errors(tmp_path, edit, message):
    qs = _questions(KB)
    qs[2] = qs[2][:1]
    _write(tmp_path / "mqa", KB, qs)
    edit(tmp_path / "mqa")
    with pytest.raises(UserError, match=message):
        load_metaqa_questions(tmp_path / "mqa", hops=2)


def test_hop_count_must_match_the_type(tmp_path):
    qs = {1: [("who directed [Heat]", "movie_to_actor_to_movie", ["Michael Mann"])]}
    _write(tmp_path / "mqa", KB, qs)
    with pytest.raises(UserError, match="has 2 hops, expected 1 in 1-hop"):
        load_metaqa_questions(tmp_path / "mqa", hops=1)
    with pytest.raises(UserError, match="hops must be among 1, 2, 3"):
        load_metaqa_questions(tmp_path / "mqa", hops=4)


@pytest.mark.slow
@pytest.mark.skipif(not (REAL / "kb.txt").is_file(), reason="MetaQA data not present (../shared/data/metaqa)")
def test_real_metaqa_expressions_reproduce_gold():
    """On a seeded sample of 1,000 questions per hop: 2-/3-hop all equal gold; overall >= 99% equal,
    and every gold set is contained in the KB's answers but for a handful (comma-split titles)."""
    kg = load_kg(REAL)
    qs = load_metaqa_questions(REAL, limit=1000, seed=0)
    stats = gold_agreement(qs, kg)
    assert stats["missing_names"] == 0
    by = stats["by_hops"]
    assert by[2]["equal"] == by[2]["total"] and by[3]["equal"] == by[3]["total"]
    assert by[1]["gold_subset"] >= 0.995 * by[1]["total"]
    assert stats["equal"] >= 0.97 * stats["total"]  # full test set: 38,553 of 39,093 (98.62%)
