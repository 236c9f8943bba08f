"""Exact (set) semantics of a query AST on a triple set: the ground truth.

A query is answered on a graph given as ``(E, 3)`` int64 ``(head, relation,
tail)`` id triples.  Semantics (those of BetaE's answer sets):

* ``Anchor(e)`` is ``{e}``;
* ``Projection(r, q)`` is ``{t : (h, r, t) in G, h in q}``;
* ``NegatedProjection(r, q)`` and ``Complement(Projection(r, q))`` are both the
  set complement (w.r.t. all ``N`` entities) of the projection;
* ``Intersection`` / ``Union`` are set intersection / union.

Queries are evaluated in batches: every query in a batch has the same AST
shape, so each AST position is one vectorised operation on a scipy CSR
boolean "frontier" of shape ``(B, N)``.  A projection of a frontier ``F``
with per-row relations ``r_b`` is a single sparse product ``G @ A`` where
``A`` holds the tails of every ``(relation, head)`` pair that has edges (row ``k``
those of pair ``keys[k] = r*N + h``, :meth:`~kge.index.TripleIndex.pair_adjacency`:
O(edges), never ``R*N`` rows) and ``G[b, k] = F[b, h]`` for ``keys[k] = r_b*N + h``.  A complement is kept
lazily (``neg`` flag: the set is "everything except the stored rows") and
only materialised when it is projected or returned, so ``a AND NOT b`` never
builds an ``N``-wide row.

Each node type's step is its ``exact`` facet in the op table
(:mod:`engine.lang.optable`): ``exact(nodes, graph, evaluate) -> Frontier``, where
``evaluate(column)`` answers a column of same-shaped sub-queries (the built-ins
register theirs at the bottom of this module).  A registered type composes
:func:`project`, :func:`conjoin`, :func:`disjoin` and :func:`complement`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from kge.index import TripleIndex

from engine.lang import optable
from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union, shape_key

__all__ = ["Graph", "Frontier", "answers", "answer_sets", "skeleton", "project", "conjoin", "disjoin", "complement"]


#: The graph queries are answered on: the project's one triple index.  Its
#: :meth:`~kge.index.TripleIndex.pair_adjacency` holds the tails of each
#: ``(relation, head)`` pair with edges; ``in_ptr`` /
#: ``in_rel`` / ``in_head`` list every entity's in-edges for backward walks.
#: Duplicate triples collapse to one edge.
Graph = TripleIndex


@dataclass
class Frontier:
    """Rows of entity sets: ``mat`` (B, N) CSR of ones; the set is its complement when ``neg``."""

    mat: sp.csr_matrix
    neg: bool = False


def _ones_like_pattern(m: sp.csr_matrix) -> sp.csr_matrix:
    m = sp.csr_matrix(m)
    m.eliminate_zeros()
    m.data = np.ones_like(m.data, dtype=np.float32)
    return m


def _materialise(f: Frontier) -> sp.csr_matrix:
    if not f.neg:
        return f.mat
    b, n = f.mat.shape
    step = max(1, (1 << 26) // max(n, 1))  # bound the dense mask to ~64 MB
    parts = []
    for lo in range(0, b, step):
        block = f.mat[lo : lo + step].tocoo()
        keep = np.ones((block.shape[0], n), dtype=bool)
        keep[block.row, block.col] = False
        parts.append(sp.csr_matrix(keep, dtype=np.float32))
    return sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, n), dtype=np.float32)


def project(f: Frontier, rels: np.ndarray, graph: Graph) -> Frontier:
    """Row ``b`` of ``f`` through relation ``rels[b]``: ``{t : (h, rels[b], t) in graph, h in f[b]}``."""
    m = _materialise(f)
    n, r = graph.num_entities, graph.num_relations
    if len(rels) and (rels.min() < 0 or rels.max() >= r):
        raise ValueError(f"relation id out of range [0, {r})")
    # Only the (relation, head) pairs that have edges are rows of the adjacency (graph.pair_adjacency): the
    # stacked (R*N, N) one needs R*N row pointers, 8 GB at 1M entities and 2,000 relations (issue 30).
    keys, adj = graph.pair_adjacency()
    counts = np.diff(m.indptr)
    want = m.indices.astype(np.int64) + np.repeat(rels.astype(np.int64) * n, counts)
    pos = np.searchsorted(keys, want)
    hit = pos < len(keys)
    hit[hit] = keys[pos[hit]] == want[hit]  # a frontier entity without an edge of its relation drops out
    rows = np.repeat(np.arange(m.shape[0]), counts)[hit]
    ptr = np.zeros(m.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m.shape[0]), out=ptr[1:])
    g = sp.csr_matrix((np.ones(len(rows), np.float32), pos[hit], ptr), shape=(m.shape[0], adj.shape[0]))
    return Frontier(_ones_like_pattern(g @ adj), False)


def conjoin(a: Frontier, b: Frontier) -> Frontier:
    """Row-wise ``a AND b``."""
    if not a.neg and not b.neg:
        return Frontier(_ones_like_pattern(a.mat.multiply(b.mat)), False)
    if a.neg and b.neg:  # not x and not y = not (x or y)
        return Frontier(_ones_like_pattern(a.mat + b.mat), True)
    pos, neg = (b, a) if a.neg else (a, b)  # x and not y = x - (x * y)
    return Frontier(_ones_like_pattern(pos.mat - pos.mat.multiply(neg.mat)), False)


def disjoin(a: Frontier, b: Frontier) -> Frontier:
    """Row-wise ``a OR b``."""
    if not a.neg and not b.neg:
        return Frontier(_ones_like_pattern(a.mat + b.mat), False)
    if a.neg and b.neg:  # not x or not y = not (x and y)
        return Frontier(_ones_like_pattern(a.mat.multiply(b.mat)), True)
    pos, neg = (b, a) if a.neg else (a, b)  # x or not y = not (y - x)
    return Frontier(_ones_like_pattern(neg.mat - neg.mat.multiply(pos.mat)), True)


def skeleton(node: Node) -> tuple:
    """The AST shape without anchors and relations (queries with equal skeletons batch together)."""
    return shape_key(node)


def _int_id(value, kind: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{kind} {value!r} is not an id: resolve() the query against an artifact first")


def complement(f: Frontier) -> Frontier:
    """Row-wise ``NOT f`` (kept lazily: nothing ``N``-wide is built)."""
    return Frontier(f.mat, not f.neg)


def _eval(nodes: Sequence[Node], graph: Graph) -> Frontier:
    """One column of same-shaped sub-queries: its node type's ``exact`` facet (the op table)."""
    entry = optable.lookup(type(nodes[0]))
    return entry.need("exact", "answer it on exact sets")(nodes, graph, lambda column: _eval(column, graph))


def _exact_anchor(nodes: Sequence[Node], graph: Graph, evaluate) -> Frontier:
    b, n = len(nodes), graph.num_entities
    ids = np.fromiter((_int_id(x.entity, "entity") for x in nodes), dtype=np.int64, count=b)  # type: ignore[attr-defined]
    if b and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"entity id out of range [0, {n})")
    return Frontier(sp.csr_matrix((np.ones(b, np.float32), ids, np.arange(b + 1)), shape=(b, n)))


def _exact_projection(nodes: Sequence[Node], graph: Graph, evaluate) -> Frontier:
    rels = np.fromiter((_int_id(x.relation, "relation") for x in nodes), dtype=np.int64,  # type: ignore[attr-defined]
                       count=len(nodes))
    return project(evaluate([x.arg for x in nodes]), rels, graph)  # type: ignore[attr-defined]


def _exact_negated_projection(nodes: Sequence[Node], graph: Graph, evaluate) -> Frontier:
    return complement(_exact_projection(nodes, graph, evaluate))


def _exact_complement(nodes: Sequence[Node], graph: Graph, evaluate) -> Frontier:
    return complement(evaluate([x.arg for x in nodes]))  # type: ignore[attr-defined]


def _fold(op):
    def exact(nodes: Sequence[Node], graph: Graph, evaluate) -> Frontier:
        acc = None
        for column in zip(*(x.children() for x in nodes)):
            f = evaluate(column)
            acc = f if acc is None else op(acc, f)
        return acc

    return exact


def answer_sets(nodes: Sequence[Node], graph: Graph) -> sp.csr_matrix:
    """Answers of queries that all share one :func:`skeleton`, as a ``(B, N)`` CSR of ones."""
    if not nodes:
        return sp.csr_matrix((0, graph.num_entities), dtype=np.float32)
    m = _materialise(_eval(list(nodes), graph))
    m.sort_indices()
    return m


def answers(
    nodes: Iterable[Node],
    graph: Graph,
    *,
    batch_size: int = 4096,
    progress: bool = False,
    desc: str = "answers",
) -> list[np.ndarray]:
    """Sorted int64 answer ids of each query (id-resolved ASTs), in input order.

    Queries are grouped by :func:`skeleton` and evaluated ``batch_size`` at a time.
    """
    nodes = list(nodes)
    out: list[np.ndarray | None] = [None] * len(nodes)
    groups: dict[tuple, list[int]] = {}
    for i, q in enumerate(nodes):
        groups.setdefault(skeleton(q), []).append(i)
    bar = None
    if progress:
        from kgreason.progress import progress_bar

        bar = progress_bar(total=len(nodes), desc=desc, unit="q")
    for idx in groups.values():
        for lo in range(0, len(idx), batch_size):
            chunk = idx[lo : lo + batch_size]
            m = answer_sets([nodes[i] for i in chunk], graph)
            for row, i in enumerate(chunk):
                out[i] = m.indices[m.indptr[row] : m.indptr[row + 1]].astype(np.int64)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return out  # type: ignore[return-value]


# This layer's facets of the built-in node types (the language registered them in engine.lang.query).
optable.register(Anchor, exact=_exact_anchor)
optable.register(Projection, exact=_exact_projection)
optable.register(NegatedProjection, exact=_exact_negated_projection)
optable.register(Complement, exact=_exact_complement)
optable.register(Intersection, exact=_fold(conjoin))
optable.register(Union, exact=_fold(disjoin))
