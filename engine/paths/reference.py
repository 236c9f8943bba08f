"""Pure-Python (heapq) reference of :func:`engine.paths.shortest_paths`.

Same semantics as the C++ kernel (see :mod:`engine.paths.graph`), written for
clarity: tests compare the two, and the benchmark uses :func:`dijkstra_heapq`
as the plain-Python baseline.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

__all__ = ["dijkstra_heapq", "shortest_paths_python"]


def dijkstra_heapq(adjacency: list[list[tuple[int, int]]], costs: list[float], source: int) -> list[float]:
    """Textbook lazy-deletion Dijkstra from one source; ``adjacency[u]`` = [(tail, relation), ...]."""
    dist = [math.inf] * len(adjacency)
    dist[source] = 0.0
    heap = [(0.0, source)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, r in adjacency[u]:
            nd = d + costs[r]
            if nd < dist[v]:
                dist[v] = nd
                heapq.heappush(heap, (nd, v))
    return dist


def _search(adj, costs, n, source, max_hops, targets, h):
    """One source. Returns (dist list, pred dict state->(u, r), best hops list)."""
    layers = 1 if max_hops is None else max_hops + 1
    g: dict[tuple[int, int], float] = {(source, 0): 0.0}
    pred: dict[tuple[int, int], tuple[int, int]] = {}
    settled_best = [[math.inf] * n for _ in range(layers)]  # min settled g over hop counts <= k
    dist = [math.inf] * n
    hops = [-1] * n
    remaining = set(int(t) for t in targets) if targets is not None else set()
    use_targets = bool(remaining)
    heap = [(h[source], 0, source, 0.0)]  # ties: fewer hops first, like the kernel
    while heap:
        key, k, v, gs = heapq.heappop(heap)
        if gs > g[(v, k)]:
            continue
        kk = 0 if max_hops is None else k
        if settled_best[kk][v] <= gs:
            continue
        for j in range(kk, layers):
            settled_best[j][v] = min(settled_best[j][v], gs)
        if gs < dist[v]:
            dist[v], hops[v] = gs, k
        if use_targets and v in remaining:
            remaining.discard(v)
            if not remaining:
                break
        if max_hops is not None and k == max_hops:
            continue
        nk = 0 if max_hops is None else k + 1
        for w, r in adj[v]:
            ng = gs + costs[r]
            if math.isinf(ng):
                continue
            if ng < g.get((w, nk), math.inf) and ng < settled_best[0 if max_hops is None else nk][w]:
                g[(w, nk)] = ng
                pred[(w, nk)] = (v, r)
                if not math.isinf(h[w]):
                    heapq.heappush(heap, (ng + h[w], nk, w, ng))
    if max_hops is None:
        # Unbounded: no re-expansion of settled nodes happens without a heuristic;
        # with one, report the best label found, as the kernel does.
        for (w, _), val in g.items():
            dist[w] = min(dist[w], val)
    return dist, pred, hops


def shortest_paths_python(graph, sources, costs, *, max_hops=None, targets=None, heuristic=None,
                          return_predecessors=True):
    """Reference of :func:`engine.paths.shortest_paths` (arguments already validated)."""
    from .graph import ShortestPaths

    n = graph.num_entities
    adj = graph.python_adjacency()
    cost_list = [float(c) for c in np.asarray(costs, dtype=np.float32)]
    s_count = len(sources)
    layers = 1 if max_hops is None else max_hops + 1
    dist = np.full((s_count, n), np.inf, dtype=np.float32)
    shape = (s_count, n) if max_hops is None else (s_count, layers, n)
    pe = np.full(shape, -1, dtype=np.int32)
    pr = np.full(shape, -1, dtype=np.int32)
    hop_arr = np.full((s_count, n), -1, dtype=np.int32)
    for i, s in enumerate(np.asarray(sources).tolist()):
        if heuristic is None:
            h = [0.0] * n
        else:
            h = np.asarray(heuristic[i] if heuristic.ndim == 2 else heuristic, dtype=np.float64).tolist()
        t = None
        if targets is not None:
            row = targets[i] if targets.ndim == 2 else targets
            t = [x for x in np.asarray(row).tolist() if x >= 0]
        d, pred, hops = _search(adj, cost_list, n, s, max_hops, t, h)
        dist[i] = d
        hop_arr[i] = hops
        for (w, k), (u, r) in pred.items():
            if max_hops is None:
                pe[i, w], pr[i, w] = u, r
            else:
                pe[i, k, w], pr[i, k, w] = u, r
    return ShortestPaths(
        sources=np.asarray(sources, dtype=np.int64),
        dist=dist,
        pred_entity=pe if return_predecessors else None,
        pred_relation=pr if return_predecessors else None,
        hops=hop_arr if max_hops is not None else None,
        max_hops=max_hops,
    )
