"""Pure-Python (heapq) reference of the ``kgreason::dijkstra`` op (:func:`ops.dijkstra`).

Same semantics and output layout as the C++ kernel (csrc/dijkstra.cpp), written
for clarity rather than speed: the tests compare the two, and the benchmark uses
:func:`dijkstra_heapq` as the plain-Python baseline.  Costs are summed in
float64 here and in float32 in the kernel, so distances agree to float32
rounding and, where two paths tie up to that rounding, the reported path may
differ (both are real paths of the reported cost).
"""
from __future__ import annotations

import heapq
import math

import torch

__all__ = ["adjacency_lists", "dijkstra_heapq", "dijkstra"]


def adjacency_lists(indptr: torch.Tensor, tails: torch.Tensor, rels: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Out-edges of every head as Python lists ``[(tail, relation), ...]`` from the CSR arrays."""
    ip, tl, rl = indptr.tolist(), tails.tolist(), rels.tolist()
    return [list(zip(tl[ip[u] : ip[u + 1]], rl[ip[u] : ip[u + 1]])) for u in range(len(ip) - 1)]


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
    """One source. Returns (dist list, pred dict (v, k) -> (u, r), hops list)."""
    layers = 1 if max_hops is None else max_hops + 1
    g: dict[tuple[int, int], float] = {(source, 0): 0.0}
    pred: dict[tuple[int, int], tuple[int, int]] = {}
    settled_best = [[math.inf] * n for _ in range(layers)]  # min settled g over hop counts <= k
    dist = [math.inf] * n
    hops = [-1] * n
    remaining = set(targets) if targets is not None else set()
    use_targets = bool(remaining)
    heap = [(h[source], 0, source, 0.0)]  # ties: fewer hops first, like the kernel
    while heap:
        _, k, v, gs = heapq.heappop(heap)
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
        # Unbounded: without a heuristic no settled node is re-expanded; with one,
        # report the best label found, as the kernel does.
        for (w, _), val in g.items():
            dist[w] = min(dist[w], val)
    return dist, pred, hops


def dijkstra(
    indptr: torch.Tensor,
    tails: torch.Tensor,
    rels: torch.Tensor,
    relation_costs: torch.Tensor,
    sources: torch.Tensor,
    targets: torch.Tensor | None,
    heuristic: torch.Tensor | None,
    max_hops: int | None,
    return_predecessors: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's outputs ``(dist, pred_entity, pred_relation, hops)`` for already validated inputs.

    ``targets``: None, (T,) or (S, T) int64 (-1 = padding); ``heuristic``: None,
    (N,) or (S, N) float32.  Outputs as csrc/dijkstra.cpp documents: ``dist``
    (S, N) float32; predecessors (S, N) or (S, H+1, N) int32, shape (0,) when not
    requested; ``hops`` (S, N) int32 when ``max_hops`` is set, else shape (0,).
    """
    n = indptr.numel() - 1
    adj = adjacency_lists(indptr, tails, rels)
    cost_list = [float(c) for c in relation_costs.tolist()]
    src = sources.tolist()
    s_count = len(src)
    layers = 1 if max_hops is None else max_hops + 1
    dist = torch.full((s_count, n), math.inf, dtype=torch.float32)
    shape = (s_count, n) if max_hops is None else (s_count, layers, n)
    pe = torch.full(shape, -1, dtype=torch.int32)
    pr = torch.full(shape, -1, dtype=torch.int32)
    hop_arr = torch.full((s_count, n), -1, dtype=torch.int32)
    tgt = targets.tolist() if targets is not None else None
    heur = heuristic.double().tolist() if heuristic is not None else None
    for i, s in enumerate(src):
        if heur is None:
            h = [0.0] * n
        else:
            h = heur[i] if heuristic.dim() == 2 else heur
        t = None
        if tgt is not None:
            row = tgt[i] if targets.dim() == 2 else tgt
            t = [x for x in row if x >= 0]
        d, pred, hops = _search(adj, cost_list, n, s, max_hops, t, h)
        dist[i] = torch.tensor(d, dtype=torch.float64).to(torch.float32)
        hop_arr[i] = torch.tensor(hops, dtype=torch.int32)
        if return_predecessors and pred:
            states = list(pred)
            us = torch.tensor([pred[x][0] for x in states], dtype=torch.int32)
            rs = torch.tensor([pred[x][1] for x in states], dtype=torch.int32)
            ws = torch.tensor([w for w, _ in states], dtype=torch.long)
            if max_hops is None:
                pe[i, ws], pr[i, ws] = us, rs
            else:
                ks = torch.tensor([k for _, k in states], dtype=torch.long)
                pe[i, ks, ws], pr[i, ks, ws] = us, rs
    empty = torch.empty(0, dtype=torch.int32)
    device = sources.device
    return (
        dist.to(device),
        (pe if return_predecessors else empty).to(device),
        (pr if return_predecessors else empty).to(device),
        (hop_arr if max_hops is not None else empty).to(device),
    )
