"""Batched shortest paths over a knowledge graph's relation multigraph with per-relation costs.

The graph is a set of ``(head, relation, tail)`` id triples; a path's cost is
the sum of its relations' costs.  :class:`PathGraph` indexes the triples once
(a :class:`kge.index.TripleIndex`, plus the CSR edge order the kernel wants;
sorting dominates a single search, so reuse it) and :func:`shortest_paths`
runs one search per source through :func:`ops.dijkstra` (the ``kgreason::dijkstra``
op; ``backend="cpp"`` or ``"reference"`` as for every op).  Semantics
(``max_hops``, ``targets``, A* ``heuristic``, parallel edges): :mod:`ops.paths`.
Duplicate triples are one edge.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

import ops
from kge.index import TripleIndex
from ops import check_relation_costs
from ops.paths_reference import adjacency_lists

__all__ = ["PathGraph", "ShortestPaths", "shortest_paths", "dijkstra", "check_relation_costs"]


class PathGraph:
    """A KG multigraph for path search: the triple index, names, and the kernel's CSR arrays.

    Args:
        triples: (E, 3) int ``(head, relation, tail)``.
        num_entities: ``N``; ids must be in ``[0, N)``.
        num_relations: ``R`` (default: ``max(relation) + 1``, at least ``len(relation_names)``).
        relation_names / entity_names: optional names used in error messages and paths.

    Attributes:
        index: the :class:`~kge.index.TripleIndex` (deduplicated triples, out/in/(relation, head) lookups).
        indptr (N+1,) int64 and tails / rels (E,) int32 (numpy): out-edges of each head sorted
            by (tail, relation), the layout :func:`ops.dijkstra` wants; :meth:`by_relation`
            gives the same edges sorted by (relation, tail).
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
        r = num_relations
        if r is None:
            t = np.asarray(triples)
            well_formed = t.ndim == 2 and t.shape[1:] == (3,) and len(t) and np.issubdtype(t.dtype, np.integer)
            r = int(t[:, 1].max()) + 1 if well_formed else 0
            if relation_names is not None:
                r = max(r, len(relation_names))
        self.index = TripleIndex(triples, num_entities, r)
        self.num_entities = self.index.num_entities
        self.num_relations = self.index.num_relations
        self.relation_names = list(relation_names) if relation_names is not None else None
        self.entity_names = list(entity_names) if entity_names is not None else None
        tr = self.index.triples  # sorted by (head, relation, tail)
        order = np.lexsort((tr[:, 1], tr[:, 2], tr[:, 0]))  # the kernel wants (head, tail, relation)
        self.indptr = self.index.out_ptr
        self.tails = tr[order, 2].astype(np.int32)
        self.rels = tr[order, 1].astype(np.int32)
        self._torch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
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
        return self.index.num_edges

    def by_relation(self) -> tuple[np.ndarray, np.ndarray]:
        """(rels, tails) int64 of each head's out-edges sorted by (relation, tail), sharing ``indptr``."""
        return self.index.triples[:, 1], self.index.triples[:, 2]

    def torch_csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indptr int64, tails int32, rels int32) torch tensors sharing memory with the numpy arrays."""
        if self._torch is None:
            self._torch = (torch.from_numpy(self.indptr), torch.from_numpy(self.tails), torch.from_numpy(self.rels))
        return self._torch

    def python_adjacency(self) -> list[list[tuple[int, int]]]:
        """Out-edges as Python lists of (tail, relation) (the plain-Python benchmark baseline's input)."""
        if self._py_adj is None:
            self._py_adj = adjacency_lists(*self.torch_csr())
        return self._py_adj

    def relation_name(self, r: int) -> str:
        return self.relation_names[r] if self.relation_names is not None else f"relation {r}"

    def entity_name(self, e: int) -> str:
        return self.entity_names[e] if self.entity_names is not None else str(e)


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


def _ids(x) -> torch.Tensor:
    """Entity ids as a tensor (numbers are checked by :func:`ops.dijkstra`; an empty list is int64)."""
    a = np.asarray(x)
    return torch.from_numpy(np.ascontiguousarray(a.astype(np.int64) if a.size == 0 else a))


def shortest_paths(
    graph: PathGraph,
    sources,
    relation_costs,
    *,
    max_hops: int | None = None,
    targets=None,
    heuristic=None,
    return_predecessors: bool = True,
    backend: str | None = None,
    heap: str = "auto",
) -> ShortestPaths:
    """Shortest paths from every source (semantics: :mod:`ops.paths`).

    Args:
        graph: the multigraph (build once, reuse).
        sources: (S,) entity ids (duplicates allowed).
        relation_costs: (R,) non-negative costs (``inf`` = relation unusable).
        max_hops: ``None`` or ``H >= 0``.
        targets: ``None``, (T,) shared or (S, T) per source entity ids, ``-1`` = padding.
        heuristic: ``None``, (N,) shared or (S, N) per source, non-negative admissible bound.
        return_predecessors: also return the predecessor arrays.
        backend: ``"cpp"`` (the compiled op), ``"reference"`` (pure-Python heapq) or None
            (the ops default: ``cpp`` when the extension is built).
        heap: the cpp backend's strategy (:data:`ops.HEAPS`): ``"auto"`` (default: batched
            sweeps over 16 sources at a time for searches without targets, heuristic or
            ``max_hops``, else Dijkstra with the radix heap), ``"sweep"``, or Dijkstra with
            ``"radix"``, ``"binary"`` or ``"4-ary"`` (A* searches use ``"4-ary"`` for
            ``"radix"``).  Distances are identical; tie-breaking: :mod:`ops.paths`.
    """
    costs = check_relation_costs(relation_costs, graph.num_relations, graph.relation_names)
    indptr, tails, rels = graph.torch_csr()
    src = _ids(sources).reshape(-1)
    out = ops.dijkstra(
        indptr,
        tails,
        rels,
        costs,
        src,
        targets=_ids(targets) if targets is not None else None,
        heuristic=torch.from_numpy(np.asarray(heuristic, dtype=np.float32)) if heuristic is not None else None,
        max_hops=max_hops,
        return_predecessors=return_predecessors,
        heap=heap,
        backend=backend,
        validate=False,  # the TripleIndex validated the graph when it was built
    )
    return ShortestPaths(
        sources=src.numpy().astype(np.int64),
        dist=out.dist.cpu().numpy(),
        pred_entity=out.pred_entity.cpu().numpy() if out.pred_entity is not None else None,
        pred_relation=out.pred_relation.cpu().numpy() if out.pred_relation is not None else None,
        hops=out.hops.cpu().numpy() if out.hops is not None else None,
        max_hops=None if max_hops is None else int(max_hops),
    )


def dijkstra(triples, num_entities: int, sources, relation_costs, max_hops: int | None = None) -> np.ndarray:
    """Distances (S, N) float32 (``inf`` unreachable) from each source over ``triples`` (E, 3).

    A one-shot convenience: it builds the CSR each call; build a :class:`PathGraph`
    and call :func:`shortest_paths` for repeated searches.
    """
    costs = np.asarray(relation_costs)
    graph = PathGraph(triples, num_entities, num_relations=len(costs.reshape(-1)))
    return shortest_paths(graph, sources, costs, max_hops=max_hops, return_predecessors=False).dist
