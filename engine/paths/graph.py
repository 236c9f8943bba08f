"""Batched shortest paths over a relation multigraph with per-relation costs.

The graph is a set of ``(head, relation, tail)`` id triples; a path's cost is
the sum of its relations' costs.  :class:`PathGraph` builds the CSR adjacency
once (sorting the triples dominates a single search, so reuse it), and
:func:`shortest_paths` runs one search per source in the C++ op
``torch.ops.kgreason.dijkstra`` (sources in parallel) or in the pure-Python
reference (``backend="python"``).

Semantics
---------
* ``max_hops=None``: ordinary shortest paths.  ``max_hops=H``: the cheapest
  path among paths with **at most** ``H`` edges (``inf`` when every path is
  longer); the search state is ``(entity, edges used)``.
* ``targets``: the search of a source stops once all of its targets are
  settled.  Target entries of ``dist`` are then exact; other entries are upper
  bounds (or ``inf``).
* ``heuristic``: A*, a lower bound ``h(v)`` of the remaining cost from ``v`` to
  the nearest target (admissible; consistency is not required: improved nodes
  are re-opened).  Meant for use with ``targets``.
* Parallel edges: the cheapest one is used (lowest relation id on ties).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kge.errors import UserError, unknown_name

__all__ = ["PathGraph", "ShortestPaths", "shortest_paths", "dijkstra", "check_relation_costs"]


class PathGraph:
    """CSR adjacency of a KG multigraph: out-edges of each head as (tail, relation).

    Args:
        triples: (E, 3) int ``(head, relation, tail)``.
        num_entities: ``N``; ids must be in ``[0, N)``.
        num_relations: ``R`` (default: ``max(relation) + 1``).
        relation_names / entity_names: optional names used in error messages and paths.

    Attributes (numpy): ``indptr`` (N+1,) int64 and ``tails``/``rels`` (E,) int32,
    out-edges of a head sorted by (tail, relation); :meth:`by_relation` gives the
    same edges sorted by (relation, tail).
    """

    def __init__(
        self,
        triples: np.ndarray,
        num_entities: int,
        *,
        num_relations: int | None = None,
        relation_names: Sequence[str] | None = None,
        entity_names: Sequence[str] | None = None,
    ) -> None:
        t = np.asarray(triples)
        if t.size == 0:
            t = np.zeros((0, 3), dtype=np.int64)
        if t.ndim != 2 or t.shape[1] != 3:
            raise UserError(f"triples must have shape (E, 3), got {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise UserError(f"triples must be integer ids, got dtype {t.dtype}")
        t = t.astype(np.int64, copy=False)
        n = int(num_entities)
        if n < 0:
            raise UserError(f"num_entities must be >= 0, got {n}")
        if len(t):
            bad = np.flatnonzero((t[:, 0] < 0) | (t[:, 0] >= n) | (t[:, 2] < 0) | (t[:, 2] >= n))
            if len(bad):
                raise UserError(f"triple {int(bad[0])} {t[bad[0]].tolist()}: entity id out of range [0, {n})")
            if t[:, 1].min() < 0:
                raise UserError(f"triple {int(np.argmin(t[:, 1]))}: negative relation id")
        r = int(num_relations) if num_relations is not None else (int(t[:, 1].max()) + 1 if len(t) else 0)
        if relation_names is not None and num_relations is None:
            r = max(r, len(relation_names))
        if len(t) and t[:, 1].max() >= r:
            raise UserError(f"relation id {int(t[:, 1].max())} out of range [0, {r})")
        self.num_entities = n
        self.num_relations = r
        self.relation_names = list(relation_names) if relation_names is not None else None
        self.entity_names = list(entity_names) if entity_names is not None else None
        order = np.lexsort((t[:, 1], t[:, 2], t[:, 0]))
        s = t[order]
        self.indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(s[:, 0], minlength=n), out=self.indptr[1:])
        self.tails = s[:, 2].astype(np.int32)
        self.rels = s[:, 1].astype(np.int32)
        self._by_rel: tuple[np.ndarray, np.ndarray] | None = None
        self._torch: tuple | None = None
        self._py_adj: list | None = None

    @classmethod
    def from_artifact(cls, artifact) -> "PathGraph":
        """The graph of an artifact's observed triples, with its names."""
        return cls(
            artifact.observed,
            artifact.num_entities,
            num_relations=artifact.num_relations,
            relation_names=artifact.relations,
            entity_names=artifact.entities,
        )

    @property
    def num_edges(self) -> int:
        return int(len(self.tails))

    def by_relation(self) -> tuple[np.ndarray, np.ndarray]:
        """(rels, tails) of each head's out-edges sorted by (relation, tail), sharing ``indptr``."""
        if self._by_rel is None:
            heads = np.repeat(np.arange(self.num_entities, dtype=np.int64), np.diff(self.indptr))
            order = np.lexsort((self.tails, self.rels, heads))
            self._by_rel = (self.rels[order], self.tails[order])
        return self._by_rel

    def torch_csr(self):
        """(indptr int64, tails int32, rels int32) torch tensors sharing memory with the numpy arrays."""
        if self._torch is None:
            import torch

            self._torch = (torch.from_numpy(self.indptr), torch.from_numpy(self.tails), torch.from_numpy(self.rels))
        return self._torch

    def python_adjacency(self) -> list[list[tuple[int, int]]]:
        """Out-edges as Python lists of (tail, relation), for the pure-Python reference."""
        if self._py_adj is None:
            tails, rels, ip = self.tails.tolist(), self.rels.tolist(), self.indptr.tolist()
            self._py_adj = [list(zip(tails[ip[u] : ip[u + 1]], rels[ip[u] : ip[u + 1]])) for u in range(self.num_entities)]
        return self._py_adj

    def relation_name(self, r: int) -> str:
        return self.relation_names[r] if self.relation_names is not None else f"relation {r}"

    def entity_name(self, e: int) -> str:
        return self.entity_names[e] if self.entity_names is not None else str(e)


def check_relation_costs(costs, num_relations: int, names: Sequence[str] | None = None) -> np.ndarray:
    """Validated (R,) float32 costs: one per relation, non-negative, not NaN (``inf`` = unusable)."""
    c = np.asarray(costs, dtype=np.float64)
    if c.shape != (num_relations,):
        raise UserError(f"relation_costs must have shape ({num_relations},) (one per relation), got {c.shape}")
    bad = np.flatnonzero(~(c >= 0))
    if len(bad):
        r = int(bad[0])
        name = f"{names[r]!r} (id {r})" if names is not None else f"id {r}"
        kind = "NaN" if np.isnan(c[r]) else "negative"
        raise UserError(f"cost of relation {name} is {kind} ({c[r]}); costs must be non-negative")
    return c.astype(np.float32)


@dataclass(frozen=True)
class ShortestPaths:
    """Result of :func:`shortest_paths` for ``S`` sources over ``N`` entities.

    Attributes:
        sources: (S,) int64.
        dist: (S, N) float32, ``inf`` where unreachable (within ``max_hops``).
        pred_entity / pred_relation: int32 predecessors, -1 for none (``None`` when
            not requested). Unbounded: (S, N), the last edge (pred_entity[s, v],
            pred_relation[s, v], v). Hop-bounded: (S, H+1, N) indexed by the state
            (v, k) = v reached with k edges; its predecessor state is (pred, k-1).
        hops: (S, N) int32 edges of the reported path (-1 unreachable); hop-bounded only.
        max_hops: ``None`` or ``H``.
    """

    sources: np.ndarray
    dist: np.ndarray
    pred_entity: np.ndarray | None
    pred_relation: np.ndarray | None
    hops: np.ndarray | None
    max_hops: int | None

    def path(self, i: int, target: int) -> list[tuple[int, int, int]] | None:
        """Edges ``(head, relation, tail)`` of the path from source ``i`` to ``target``; None if unreachable."""
        if self.pred_entity is None:
            raise ValueError("predecessors were not requested (return_predecessors=False)")
        if not np.isfinite(self.dist[i, target]):
            return None
        edges: list[tuple[int, int, int]] = []
        v = int(target)
        if self.max_hops is None:
            pe, pr = self.pred_entity[i], self.pred_relation[i]
            src = int(self.sources[i])
            while v != src:
                u = int(pe[v])
                edges.append((u, int(pr[v]), v))
                v = u
                if len(edges) > len(pe):
                    raise RuntimeError("predecessor cycle")
        else:
            k = int(self.hops[i, target])
            while k > 0:
                u = int(self.pred_entity[i, k, v])
                edges.append((u, int(self.pred_relation[i, k, v]), v))
                v, k = u, k - 1
        edges.reverse()
        return edges


def _as_index_array(x, name: str, n: int, allow_pad: bool = False) -> np.ndarray:
    a = np.asarray(x)
    if a.size == 0:
        return a.astype(np.int64).reshape(a.shape)
    if not np.issubdtype(a.dtype, np.integer):
        raise UserError(f"{name} must be integer entity ids, got dtype {a.dtype}")
    a = a.astype(np.int64)
    lo = -1 if allow_pad else 0
    bad = np.flatnonzero((a.reshape(-1) < lo) | (a.reshape(-1) >= n))
    if len(bad):
        raise UserError(f"{name}: entity id {int(a.reshape(-1)[bad[0]])} out of range [0, {n})")
    return a


def shortest_paths(
    graph: PathGraph,
    sources,
    relation_costs,
    *,
    max_hops: int | None = None,
    targets=None,
    heuristic=None,
    return_predecessors: bool = True,
    backend: str = "cpp",
    heap: str = "radix",
) -> ShortestPaths:
    """Shortest paths from every source (see the module docstring for semantics).

    Args:
        graph: the multigraph (build once, reuse).
        sources: (S,) entity ids (duplicates allowed).
        relation_costs: (R,) non-negative costs (``inf`` = relation unusable).
        max_hops: ``None`` or ``H >= 0``.
        targets: ``None``, (T,) shared or (S, T) per source entity ids, ``-1`` = padding.
        heuristic: ``None``, (N,) shared or (S, N) per source, non-negative admissible bound.
        return_predecessors: also return the predecessor arrays.
        backend: ``"cpp"`` (the torch op) or ``"python"`` (pure-Python heapq reference).
        heap: cpp backend's priority queue: ``"radix"`` (default; monotone keys, so A*
            searches fall back to ``"4-ary"``), ``"binary"`` or ``"4-ary"``.
    """
    n = graph.num_entities
    src = _as_index_array(sources, "sources", n).reshape(-1)
    costs = check_relation_costs(relation_costs, graph.num_relations, graph.relation_names)
    if max_hops is not None:
        max_hops = int(max_hops)
        if max_hops < 0:
            raise UserError(f"max_hops must be >= 0, got {max_hops}")
    tgt = None
    if targets is not None:
        tgt = _as_index_array(targets, "targets", n, allow_pad=True)
        if tgt.ndim not in (1, 2) or (tgt.ndim == 2 and tgt.shape[0] != len(src)):
            raise UserError(f"targets must have shape (T,) or (S={len(src)}, T), got {tgt.shape}")
    heur = None
    if heuristic is not None:
        heur = np.asarray(heuristic, dtype=np.float32)
        if heur.shape not in ((n,), (len(src), n)):
            raise UserError(f"heuristic must have shape (N={n},) or (S={len(src)}, N), got {heur.shape}")
        if not np.all(heur >= 0):
            raise UserError("heuristic must be non-negative and not NaN")
    heaps = {"radix": 0, "binary": 2, "4-ary": 4}
    if heap not in heaps:
        raise unknown_name("heap", heap, list(heaps))
    if backend == "python":
        from .reference import shortest_paths_python

        return shortest_paths_python(graph, src, costs, max_hops=max_hops, targets=tgt, heuristic=heur,
                                     return_predecessors=return_predecessors)
    if backend != "cpp":
        raise UserError(f"unknown backend {backend!r}; known: 'cpp', 'python'")
    import torch

    import ops._C  # noqa: F401  (registers torch.ops.kgreason.*)

    indptr, tails, rels = graph.torch_csr()
    empty_i = torch.empty(0, dtype=torch.int64)
    dist, pe, pr, hops = torch.ops.kgreason.dijkstra(
        indptr,
        tails,
        rels,
        torch.from_numpy(costs),
        torch.from_numpy(src),
        torch.from_numpy(tgt) if tgt is not None and tgt.size else empty_i,
        torch.from_numpy(heur) if heur is not None else torch.empty(0, dtype=torch.float32),
        -1 if max_hops is None else max_hops,
        bool(return_predecessors),
        heaps[heap],
    )
    return ShortestPaths(
        sources=src,
        dist=dist.numpy(),
        pred_entity=pe.numpy() if return_predecessors else None,
        pred_relation=pr.numpy() if return_predecessors else None,
        hops=hops.numpy() if max_hops is not None else None,
        max_hops=max_hops,
    )


def dijkstra(triples, num_entities: int, sources, relation_costs, max_hops: int | None = None) -> np.ndarray:
    """Distances (S, N) float32 (``inf`` unreachable) from each source over ``triples`` (E, 3).

    A one-shot convenience: it builds the CSR each call; build a :class:`PathGraph`
    and call :func:`shortest_paths` for repeated searches.
    """
    costs = np.asarray(relation_costs)
    graph = PathGraph(triples, num_entities, num_relations=len(costs.reshape(-1)))
    return shortest_paths(graph, sources, costs, max_hops=max_hops, return_predecessors=False).dist
