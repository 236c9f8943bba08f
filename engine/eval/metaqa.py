"""MetaQA questions as engine queries: read, sample and convert ``{1,2,3}-hop/test.txt``.

A MetaQA folder (see ``kge.graph.load_metaqa`` for its ``kb.txt``) holds, per hop
count, ``test.txt`` lines ``question with [topic entity]<TAB>answer1|answer2|...``
and ``qa_test_qtype.txt``, one relation-path type a line (aligned with
``test.txt``), e.g. ``actor_to_movie_to_director``.  A type names entity
*types*; every step ``a_to_b`` is one KB relation, forward when ``a`` is the
movie (every KB head is a movie) and inverse when ``b`` is:
:data:`STEP_RELATIONS` is that table (``actor_to_movie`` = ``starred_actors^-1``).

The engine expression of a question follows its steps from the topic entity and
encodes MetaQA's answer rule (measured on the release: it reproduces the gold
answers of all 2- and 3-hop test questions): from the second hop on, the
topic entity is removed from every intermediate and final set -- a 2-hop
answer is never the topic itself, and a 3-hop path never goes back through the
topic movie.  So::

    1-hop  (p r1 T)
    2-hop  (i (p r2 (p r1 T)) (n T))
    3-hop  (i (p r3 (i (p r2 (p r1 T)) (n T))) (n T))

:attr:`MetaQAQuestion.chain` is the same path without the exclusions
(``(p r2 (p r1 T))``), for code that wants the bare 1p/2p/3p shape.

Known limits of the data (not of the conversion): same-title movies share one
name in ``kb.txt``, so for 537 of the 9,947 1-hop test questions the gold
answers are a strict subset of the KB's (the gold lists one of the movies),
and 3 gold answer lists split a title containing a comma.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from kgreason.constants import INVERSE_SUFFIX
from kgreason.errors import UserError
from kgreason.files import read_lines

from engine.lang.query import Node, path_query, to_sexpr

if TYPE_CHECKING:  # pragma: no cover
    from kge.graph import KnowledgeGraph

__all__ = [
    "MetaQAQuestion",
    "STEP_RELATIONS",
    "HOPS",
    "load_metaqa_questions",
    "question_node",
    "gold_agreement",
]

#: Hop counts and their folders.
HOPS = {1: "1-hop", 2: "2-hop", 3: "3-hop"}

#: Entity type of a MetaQA qtype -> the KB relation from a movie to it.  Every KB
#: head is a movie (README of the release), so ``movie_to_X`` is the relation and
#: ``X_to_movie`` its inverse.  ``tags`` and ``tag`` both occur in the qtypes.
TYPE_RELATION = {
    "actor": "starred_actors",
    "director": "directed_by",
    "writer": "written_by",
    "genre": "has_genre",
    "language": "in_language",
    "tags": "has_tags",
    "tag": "has_tags",
    "year": "release_year",
    "imdbrating": "has_imdb_rating",
    "imdbvotes": "has_imdb_votes",
}


def _step_relation(a: str, b: str) -> str | None:
    if a == "movie" and b in TYPE_RELATION:
        return TYPE_RELATION[b]
    if b == "movie" and a in TYPE_RELATION:
        return TYPE_RELATION[a] + INVERSE_SUFFIX
    return None


#: Every step ``a_to_b`` a qtype may hold -> its KB relation name (``X^-1`` = inverse).
STEP_RELATIONS = {f"{a}_to_{b}": _step_relation(a, b)
                  for t in TYPE_RELATION for a, b in (("movie", t), (t, "movie"))}


@dataclass(frozen=True)
class MetaQAQuestion:
    """One MetaQA test question.

    ``question`` is the text as released (the topic in ``[...]``); ``text`` the
    same without the brackets.  ``answers`` are the gold names (as released,
    order kept); ``relations`` the KB relation names of the path, one per hop
    (``X^-1`` for an inverse step); ``expression`` the exact engine query
    (module docstring) and ``chain`` the bare path.  ``line`` is the 1-based
    line in ``test.txt``.
    """

    hops: int
    line: int
    question: str
    text: str
    topic: str
    answers: tuple[str, ...]
    qtype: str
    types: tuple[str, ...]
    relations: tuple[str, ...]

    @property
    def node(self) -> Node:
        """The exact query as a name AST (see :func:`question_node`)."""
        return question_node(self.topic, self.relations, exclude_topic=True)

    @property
    def expression(self) -> str:
        return to_sexpr(self.node)

    @property
    def chain_node(self) -> Node:
        return question_node(self.topic, self.relations, exclude_topic=False)

    @property
    def chain(self) -> str:
        return to_sexpr(self.chain_node)


def question_node(topic: str | int, relations: Sequence[str | int], *, exclude_topic: bool = True) -> Node:
    """``(p rk ... (p r1 topic))``; with ``exclude_topic``, every set from hop 2 on is ANDed with ``(n topic)``.

    ``topic`` and ``relations`` may be names or ids (the AST keeps what it is given).
    """
    if not relations:
        raise ValueError("a MetaQA question has at least one hop")
    return path_query(topic, relations, exclude_topic=exclude_topic)


def _closest(name: str, known: Iterable[str], n: int = 3) -> str:
    import difflib

    return ", ".join(difflib.get_close_matches(name, list(known), n=n, cutoff=0.0))


def _parse_qtype(qtype: str, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    types = qtype.split("_to_")
    if len(types) < 2 or not all(types):
        raise UserError(f"{where}: relation-path type {qtype!r} is not of the form a_to_b[_to_c...]")
    rels = []
    for a, b in zip(types, types[1:]):
        step = f"{a}_to_{b}"
        rel = STEP_RELATIONS.get(step)
        if rel is None:
            raise UserError(f"{where}: unknown step {step!r} in {qtype!r}; known steps (closest first): "
                            f"{_closest(step, STEP_RELATIONS)}")
        rels.append(rel)
    return tuple(types), tuple(rels)


def _read_hop(folder: Path, hops: int, split: str) -> list[MetaQAQuestion]:
    qfile = folder / HOPS[hops] / f"{split}.txt"
    tfile = folder / HOPS[hops] / f"qa_{split}_qtype.txt"
    for f in (qfile, tfile):
        if not f.is_file():
            raise UserError(f"{f}: file not found (a MetaQA folder holds {HOPS[hops]}/{split}.txt and "
                            f"{HOPS[hops]}/qa_{split}_qtype.txt)")
    qlines = [(n, ln) for n, ln in read_lines(qfile)]
    tlines = [(n, ln) for n, ln in read_lines(tfile)]
    # Blank trailing lines are tolerated; anything else must align line by line.
    while qlines and not qlines[-1][1].strip():
        qlines.pop()
    while tlines and not tlines[-1][1].strip():
        tlines.pop()
    if len(qlines) != len(tlines):
        raise UserError(f"{tfile}: {len(tlines)} types but {qfile} has {len(qlines)} questions (they align line "
                        "by line)")
    out = []
    for (lineno, line), (tline, qtype) in zip(qlines, tlines):
        where = f"{qfile}:{lineno}"
        parts = line.split("\t")
        if len(parts) != 2:
            raise UserError(f"{where}: expected 'question<TAB>answers', got {len(parts)} tab-separated fields")
        question, answers = parts
        lo, hi = question.find("["), question.find("]")
        if lo < 0 or hi < lo or question.count("[") != 1 or question.count("]") != 1:
            raise UserError(f"{where}: expected exactly one [topic entity] in {question!r}")
        topic = question[lo + 1 : hi]
        if not topic.strip():
            raise UserError(f"{where}: empty [topic entity] in {question!r}")
        gold = tuple(answers.split("|"))
        if not all(a.strip() for a in gold):
            raise UserError(f"{where}: empty answer in {answers!r}")
        types, rels = _parse_qtype(qtype.strip(), f"{tfile}:{tline}")
        if len(rels) != hops:
            raise UserError(f"{tfile}:{tline}: {qtype!r} has {len(rels)} hops, expected {hops} in {HOPS[hops]}")
        out.append(MetaQAQuestion(
            hops=hops, line=lineno, question=question, text=question[:lo] + topic + question[hi + 1 :],
            topic=topic, answers=gold, qtype=qtype.strip(), types=types, relations=rels,
        ))
    return out


def load_metaqa_questions(
    folder: str | os.PathLike,
    hops: int | Sequence[int] = (1, 2, 3),
    limit: int | None = None,
    seed: int = 0,
    *,
    split: str = "test",
) -> list[MetaQAQuestion]:
    """MetaQA questions of the given hop counts, hop by hop.

    ``limit``: at most this many questions *per hop*, a uniform sample without
    replacement drawn with ``numpy.random.default_rng(seed + hops)`` and kept in
    file order (``None``: all).  Only ``test`` has type files in the release.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: MetaQA folder not found")
    hop_list = [hops] if isinstance(hops, int) else list(hops)
    for h in hop_list:
        if h not in HOPS:
            raise UserError(f"MetaQA hops must be among 1, 2, 3, got {h!r}")
    if limit is not None and limit < 1:
        raise UserError(f"MetaQA question limit must be >= 1, got {limit}")
    out: list[MetaQAQuestion] = []
    for h in hop_list:
        qs = _read_hop(folder, h, split)
        if limit is not None and limit < len(qs):
            keep = np.sort(np.random.default_rng(seed + h).choice(len(qs), size=limit, replace=False))
            qs = [qs[i] for i in keep]
        out += qs
    return out


def gold_agreement(questions: Sequence[MetaQAQuestion], kg: "KnowledgeGraph", *, exact: bool = True) -> dict:
    """How often each question's expression, answered exactly on ``kg``'s train edges, equals its gold.

    Returns ``{"total", "equal", "gold_subset", "missing_names", "by_hops": {h: {...}}}``:
    ``equal`` counts answer sets equal to the gold set, ``gold_subset`` those
    containing every gold answer, ``missing_names`` questions whose topic or a
    gold answer is not a KG entity (those count as unequal).  ``exact=False``
    uses :attr:`MetaQAQuestion.chain` instead.
    """
    from engine.eval.symbolic import answers as symbolic_answers
    from kge.index import TripleIndex

    ent = {e: i for i, e in enumerate(kg.entities)}
    rel = {r: i for i, r in enumerate(kg.relations)}
    graph = TripleIndex(kg.train, kg.num_entities, kg.num_relations)
    nodes, keep = [], []
    stats = {"total": len(questions), "equal": 0, "gold_subset": 0, "missing_names": 0, "by_hops": {}}
    for k, q in enumerate(questions):
        by = stats["by_hops"].setdefault(q.hops, {"total": 0, "equal": 0, "gold_subset": 0, "missing_names": 0})
        by["total"] += 1
        if q.topic not in ent or any(a not in ent for a in q.answers):
            stats["missing_names"] += 1
            by["missing_names"] += 1
            continue
        try:
            rels = [rel[r] for r in q.relations]
        except KeyError as exc:
            raise UserError(f"relation {exc.args[0]!r} of {q.qtype!r} is not in the KG; known: "
                            f"{', '.join(kg.relations)}") from None
        nodes.append(question_node(ent[q.topic], rels, exclude_topic=exact))
        keep.append(k)
    for k, found in zip(keep, symbolic_answers(nodes, graph)):
        q = questions[k]
        gold = {ent[a] for a in q.answers}
        got = set(found.tolist())
        by = stats["by_hops"][q.hops]
        if got == gold:
            stats["equal"] += 1
            by["equal"] += 1
        if gold <= got:
            stats["gold_subset"] += 1
            by["gold_subset"] += 1
    return stats
