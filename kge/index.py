"""One index of a graph's ``(head, relation, tail)`` id triples, shared by every consumer.

:class:`TripleIndex` deduplicates the triples once and serves the three access
patterns the project needs, each built lazily on first use:

* out-edges, CSR by head with each head's edges sorted by (relation, tail): a
  ``(head, relation)`` pair is a contiguous run (found by binary search), so the
  index is also CSR by ``(head, relation)`` (KARPA's expansion, example grounding,
  edge membership);
* CSR by ``(relation, head)``: row ``r * N + h`` holds the sorted tails of
  ``(h, r)`` -- the stacked ``(R*N, N)`` boolean adjacency (:meth:`relation_adjacency`),
  and its hypersparse form over only the pairs that have edges, which the symbolic
  evaluator multiplies frontiers with (:meth:`pair_adjacency`: O(edges), where the
  stacked row pointer alone is ``R*N`` integers, 8 GB at 1M entities and 2,000 relations);
* in-edges, CSR by tail with each tail's edges sorted by (relation, head)
  (backward walks: query sampling, KARPA's entity paths, example grounding).

Users: :mod:`engine.eval.symbolic` (``Graph`` is this class),
:class:`engine.paths.PathGraph` (adds names and the Dijkstra kernel's edge
order) and :mod:`engine.exec.examples`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kgreason.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import scipy.sparse as sp

__all__ = ["TripleIndex"]


def _csr_ptr(keys: np.ndarray, rows: int, dtype=np.int64) -> np.ndarray:
    """Row pointer (rows+1,) of ``keys`` (row ids, sorted ascending)."""
    ptr = np.zeros(rows + 1, dtype=dtype)
    np.cumsum(np.bincount(keys, minlength=rows), out=ptr[1:], dtype=dtype)
    return ptr


class TripleIndex:
    """Deduplicated ``(head, relation, tail)`` id triples with out-, in- and (relation, head) indexes.

    Args:
        triples: (E, 3) integer ``(head, relation, tail)`` (any order, duplicates allowed).
        num_entities: ``N``; entity ids must lie in ``[0, N)``.
        num_relations: ``R``; relation ids must lie in ``[0, R)``.
        what: how error messages name ``triples``.

    Attributes:
        triples: (E', 3) int64, unique, sorted by (head, relation, tail); read-only.
        input_rows: (E',) int64, the row of ``triples`` (as given) each unique triple first came from.
        out_ptr: (N+1,) int64; the out-edges of head ``h`` are ``triples[out_ptr[h]:out_ptr[h+1]]``.
        in_ptr / in_rel / in_head (lazy): (N+1,) int64 and (E',) int64; the in-edges of
            tail ``t`` are ``(in_head[k], in_rel[k], t)`` for ``k`` in ``in_ptr[t]:in_ptr[t+1]``,
            sorted by (relation, head).
        rh_ptr / rh_tail (lazy): CSR by ``(relation, head)``: the tails of ``(h, r)`` are
            ``rh_tail[rh_ptr[r*N + h]:rh_ptr[r*N + h + 1]]``, ascending; ``rh_ptr`` is (R*N+1,);
            both int32 when E < 2^31, else int64.
    """

    def __init__(self, triples, num_entities: int, num_relations: int, *, what: str = "triples") -> None:
        t = np.asarray(triples)
        if t.size == 0:
            t = np.zeros((0, 3), dtype=np.int64)
        if t.ndim != 2 or t.shape[1] != 3:
            raise UserError(f"{what}: expected shape (E, 3) (head, relation, tail), got {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise UserError(f"{what}: expected integer ids, got dtype {t.dtype}")
        t = t.astype(np.int64, copy=False)
        n, r = int(num_entities), int(num_relations)
        if n < 0 or r < 0:
            raise UserError(f"{what}: num_entities and num_relations must be >= 0, got {n} and {r}")
        if len(t):
            bad = np.flatnonzero((t[:, 0] < 0) | (t[:, 0] >= n) | (t[:, 2] < 0) | (t[:, 2] >= n))
            if len(bad):
                i = int(bad[0])
                raise UserError(f"{what} row {i} {t[i].tolist()}: entity id out of range [0, {n})")
            bad = np.flatnonzero((t[:, 1] < 0) | (t[:, 1] >= r))
            if len(bad):
                i = int(bad[0])
                raise UserError(f"{what} row {i} {t[i].tolist()}: relation id {int(t[i, 1])} out of range [0, {r})")
        self.num_entities, self.num_relations = n, r
        # A stable sort keeps the first of equal rows first: that row survives deduplication.
        order = np.lexsort((t[:, 2], t[:, 1], t[:, 0]))
        s = t[order]
        keep = np.ones(len(s), dtype=bool)
        if len(s) > 1:
            keep[1:] = (s[1:] != s[:-1]).any(axis=1)
        self.triples = np.ascontiguousarray(s[keep])
        self.triples.setflags(write=False)
        self.input_rows = order[keep]
        self.input_rows.setflags(write=False)
        self.out_ptr = _csr_ptr(self.triples[:, 0], n)
        self._in: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._rh: tuple[np.ndarray, np.ndarray] | None = None
        self._adjacency = None
        self._pair_rows = None

    @classmethod
    def from_triples(cls, *triple_sets, num_entities: int, num_relations: int) -> "TripleIndex":
        """The index of the union of several ``(E, 3)`` triple arrays."""
        parts = [np.asarray(t, dtype=np.int64).reshape(-1, 3) for t in triple_sets]
        return cls(np.concatenate(parts) if parts else np.zeros((0, 3), np.int64), num_entities, num_relations)

    @property
    def num_edges(self) -> int:
        return int(len(self.triples))

    def __len__(self) -> int:
        return self.num_edges

    def __repr__(self) -> str:
        return f"{type(self).__name__}(N={self.num_entities}, R={self.num_relations}, edges={self.num_edges})"

    # ------------------------------------------------------------------ out-edges (by head)
    def out_edges(self, head: int, *, input_order: bool = False) -> np.ndarray:
        """(k, 3) triples with this head, sorted by (relation, tail) or, with ``input_order``,
        in the order their first occurrences had in the constructor's input (seeded consumers
        whose random picks must not depend on the index's order)."""
        lo, hi = int(self.out_ptr[head]), int(self.out_ptr[head + 1])
        if not input_order:
            return self.triples[lo:hi]
        return self.triples[lo + np.argsort(self.input_rows[lo:hi], kind="stable")]

    def tails(self, head: int, relation: int) -> np.ndarray:
        """Sorted tails of ``(head, relation)`` (a view, int64)."""
        lo, hi = int(self.out_ptr[head]), int(self.out_ptr[head + 1])
        rels = self.triples[lo:hi, 1]
        a, b = np.searchsorted(rels, relation, "left"), np.searchsorted(rels, relation, "right")
        return self.triples[lo + a : lo + b, 2]

    def has_edge(self, head: int, relation: int, tail: int) -> bool:
        """Whether ``(head, relation, tail)`` is one of the triples."""
        ts = self.tails(head, relation)
        i = int(np.searchsorted(ts, tail))
        return i < len(ts) and int(ts[i]) == tail

    # ------------------------------------------------------------------ in-edges (by tail)
    def _in_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._in is None:
            t = self.triples
            order = np.lexsort((t[:, 0], t[:, 1], t[:, 2]))
            self._in = (_csr_ptr(t[order, 2], self.num_entities), t[order, 1], t[order, 0], order)
        return self._in

    @property
    def in_ptr(self) -> np.ndarray:
        return self._in_index()[0]

    @property
    def in_rel(self) -> np.ndarray:
        return self._in_index()[1]

    @property
    def in_head(self) -> np.ndarray:
        return self._in_index()[2]

    def in_edges(self, tail: int, *, input_order: bool = False) -> np.ndarray:
        """(k, 3) triples with this tail, sorted by (relation, head) or in input order (see :meth:`out_edges`)."""
        ptr, _, _, order = self._in_index()
        rows = order[int(ptr[tail]) : int(ptr[tail + 1])]
        if input_order:
            rows = rows[np.argsort(self.input_rows[rows], kind="stable")]
        return self.triples[rows]

    def heads(self, tail: int, relation: int) -> np.ndarray:
        """Sorted heads of the triples ``(h, relation, tail)`` (a view, int64)."""
        ptr, rel, head, _ = self._in_index()
        lo, hi = int(ptr[tail]), int(ptr[tail + 1])
        a, b = np.searchsorted(rel[lo:hi], relation, "left"), np.searchsorted(rel[lo:hi], relation, "right")
        return head[lo + a : lo + b]

    # ------------------------------------------------------------------ CSR by (relation, head)
    def _rh_index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._rh is None:
            t = self.triples
            n = self.num_entities
            key = t[:, 1] * n + t[:, 0]
            order = np.argsort(key, kind="stable")  # stable: tails stay ascending inside a row
            # R*N+1 entries: int32 when the edge count allows (half the memory, and what scipy keeps).
            dtype = np.int32 if len(t) < 2**31 and n < 2**31 else np.int64
            self._rh = (_csr_ptr(key[order], self.num_relations * n, dtype), t[order, 2].astype(dtype))
        return self._rh

    @property
    def rh_ptr(self) -> np.ndarray:
        return self._rh_index()[0]

    @property
    def rh_tail(self) -> np.ndarray:
        return self._rh_index()[1]

    def relation_adjacency(self) -> "sp.csr_matrix":
        """The stacked boolean adjacency, scipy CSR ``(R*N, N)`` float32 of ones: row ``r*N + h``
        holds the tails of ``(h, r)`` (cached; built from :attr:`rh_ptr` / :attr:`rh_tail`)."""
        if self._adjacency is None:
            import scipy.sparse as sp  # only the symbolic evaluator needs scipy

            ptr, tail = self._rh_index()
            n = self.num_entities
            self._adjacency = sp.csr_matrix(
                (np.ones(len(tail), dtype=np.float32), tail, ptr), shape=(self.num_relations * n, n)
            )
        return self._adjacency

    def pair_adjacency(self) -> "tuple[np.ndarray, sp.csr_matrix]":
        """``(keys, adj)``: the rows of :meth:`relation_adjacency` that hold an edge, and only those.

        ``keys`` (K,) int64 ascending are the pairs ``r * N + h`` with at least one edge; row ``k`` of the
        scipy CSR ``adj`` (K, N) float32 holds the sorted tails of pair ``keys[k]`` (ones).  Memory is
        O(edges) whatever ``R * N`` is (cached).
        """
        if self._pair_rows is None:
            import scipy.sparse as sp

            t, n = self.triples, self.num_entities
            key = t[:, 1] * n + t[:, 0]
            order = np.argsort(key, kind="stable")  # stable: tails stay ascending inside a pair
            key = key[order]
            first = np.ones(len(key), dtype=bool)
            first[1:] = key[1:] != key[:-1]
            starts = np.flatnonzero(first)
            idx = np.int32 if len(t) < 2**31 and n < 2**31 else np.int64  # what scipy keeps
            ptr = np.append(starts, len(key)).astype(idx)
            adj = sp.csr_matrix((np.ones(len(key), dtype=np.float32), t[order, 2].astype(idx), ptr),
                                shape=(len(starts), n))
            self._pair_rows = (key[starts], adj)
        return self._pair_rows
