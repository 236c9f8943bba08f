"""ops.dijkstra's batched label-correcting sweeps (``heap="auto"`` / ``"sweep"``) against Dijkstra.

The sweeps (csrc/cpu/dijkstra_cpu.cpp) search 16 sources at a time; their
distances must equal Dijkstra's bit for bit (both are the minimum over walks of
the float32 sum folded along the walk), and their predecessors must form real
paths of exactly the reported cost, with the documented tie-breaking.  Random
graphs with fresh seeds and several sizes and lane counts (1 to 2 batches, a
partial batch), zero costs, self loops, parallel edges, unusable (inf) costs,
unreachable entities, heavy ties (integer costs) and float absorption.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ops
from _ops_helpers import random_csr_multigraph, require_backend


def _graph(gen: torch.Generator, n: int, r: int, e: int, kind: str):
    indptr, tails, rels, costs = random_csr_multigraph(gen, n, r, e)
    if kind == "ties":  # small integer costs: many equal-cost paths
        costs = torch.randint(0, 3, (r,), generator=gen).to(torch.float32)
    elif kind == "zero":  # every edge free: every reachable entity at distance 0
        costs = torch.zeros(r)
    elif kind == "mixed":  # one free relation, one unusable, the rest random
        costs[0] = 0.0
        if r > 1:
            costs[1] = math.inf
    return indptr, tails, rels, costs


def _same(a, b) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b))


def _check_paths(res, indptr, tails, rels, costs, sources) -> None:
    """Every finite entry's predecessor chain is made of real edges, each adding exactly its cost in float32
    (so the path's cost, folded from the source as the kernel adds it, is exactly the reported distance),
    and reaches the source (no cycle); unreachable entries and the sources have none."""
    n, num_rel = len(indptr) - 1, len(costs)
    costs = torch.as_tensor(costs, dtype=torch.float32)
    heads = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    edge_keys = (heads * num_rel + rels.long()) * n + tails.long()
    d, pe, pr = res.dist, res.pred_entity.long(), res.pred_relation.long()
    rows = torch.arange(len(sources))
    src = sources.long()
    fin = torch.isfinite(d)
    assert bool((pe[~fin] == -1).all() and (pr[~fin] == -1).all())
    assert bool((pe[rows, src] == -1).all() and (pr[rows, src] == -1).all())
    need = fin.clone()
    need[rows, src] = False
    row, v = torch.nonzero(need, as_tuple=True)
    u, r = pe[row, v], pr[row, v]
    assert bool((u >= 0).all()), "an entity with a distance has no predecessor"
    assert bool(torch.isin((u * num_rel + r) * n + v, edge_keys).all()), "a predecessor edge is not an edge"
    assert torch.equal(d[row, u] + costs[r], d[row, v]), "a predecessor edge does not attain the distance"
    ptr = torch.where(pe >= 0, pe, torch.arange(n).expand_as(pe))  # roots point to themselves
    for _ in range(max(1, n).bit_length() + 1):  # pointer doubling: 2^k-th ancestors
        ptr = torch.gather(ptr, 1, ptr)
    assert torch.equal(ptr[fin], src[:, None].expand_as(ptr)[fin]), "a predecessor chain misses the source"


@pytest.mark.parametrize("kind", ["random", "ties", "zero", "mixed"])
@pytest.mark.parametrize("n,r,e,num_sources", [(1, 1, 0, 1), (2, 1, 3, 5), (9, 2, 6, 4), (40, 3, 120, 17),
                                               (150, 6, 700, 33), (400, 8, 2400, 40)])
def test_sweeps_equal_dijkstra(seed, kind, n, r, e, num_sources):
    require_backend("cpp", "dijkstra", "cpu")
    gen = torch.Generator().manual_seed(seed)
    indptr, tails, rels, costs = _graph(gen, n, r, e, kind)
    sources = torch.randint(0, n, (num_sources,), generator=gen)
    sources[-1] = sources[0]  # a duplicate source
    want = ops.dijkstra(indptr, tails, rels, costs, sources, heap="radix", backend="cpp")
    for heap in ("auto", "sweep"):
        got = ops.dijkstra(indptr, tails, rels, costs, sources, heap=heap, backend="cpp")
        assert torch.equal(got.dist, want.dist), f"heap={heap} seed={seed}"  # bit for bit, inf included
        _check_paths(got, indptr, tails, rels, costs, sources)
        nodist = ops.dijkstra(indptr, tails, rels, costs, sources, heap=heap, backend="cpp", return_predecessors=False)
        assert torch.equal(nodist.dist, want.dist) and nodist.pred_entity is None


def test_sweeps_equal_reference_and_scipy(seed):
    """A larger graph, 30 sources (2 batches): the pure-Python reference and scipy agree to float32 rounding."""
    require_backend("cpp", "dijkstra", "cpu")
    sp = pytest.importorskip("scipy.sparse")
    from scipy.sparse.csgraph import dijkstra as scipy_dijkstra

    gen = torch.Generator().manual_seed(seed)
    n = 300
    indptr, tails, rels, costs = _graph(gen, n, 10, 1800, "mixed")
    sources = torch.randint(0, n, (30,), generator=gen)
    got = ops.dijkstra(indptr, tails, rels, costs, sources, backend="cpp")  # default: auto = sweeps here
    ref = ops.dijkstra(indptr, tails, rels, costs, sources, backend="reference")
    assert torch.equal(torch.isinf(got.dist), torch.isinf(ref.dist))
    fin = torch.isfinite(ref.dist)
    torch.testing.assert_close(got.dist[fin], ref.dist[fin], rtol=1e-5, atol=1e-5)
    heads = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1]).numpy()
    w = costs[rels.long()].double().numpy()
    ok = np.isfinite(w)
    best: dict[tuple[int, int], float] = {}  # scipy's CSR sums duplicates: keep the cheapest parallel edge
    for h, t, c in zip(heads[ok].tolist(), tails.numpy()[ok].tolist(), w[ok].tolist()):
        best[(h, t)] = min(c, best.get((h, t), math.inf))
    keys = list(best)
    m = sp.csr_matrix(([best[k] + 1e-300 for k in keys], ([k[0] for k in keys], [k[1] for k in keys])), shape=(n, n))
    expected = scipy_dijkstra(m, directed=True, indices=sources.numpy())  # (zero costs kept as explicit 1e-300)
    np.testing.assert_array_equal(np.isinf(got.dist.numpy()), np.isinf(expected))
    np.testing.assert_allclose(got.dist.numpy()[fin.numpy()], expected[fin.numpy()], rtol=1e-5, atol=1e-5)
    _check_paths(got, indptr, tails, rels, costs, sources)


def test_sweep_tie_breaking_by_hand():
    """0 -a(1.0)-> 1 and 0 -b(0.5)-> 2 -b(0.5)-> 1: both paths to 1 cost 1.0; the sweeps take the predecessor
    with the smallest distance (0), Dijkstra the path it settles first; a free edge 1 -c(0)-> 3 -c(0)-> 1
    makes 3 "flat" (its only tight in-edge comes from the same distance)."""
    require_backend("cpp", "dijkstra", "cpu")
    # edges sorted by (head, tail, relation): 0->1 a, 0->2 b, 1->3 c, 2->1 b, 3->1 c
    indptr = torch.tensor([0, 2, 3, 4, 5])
    tails = torch.tensor([1, 2, 3, 1, 1], dtype=torch.int32)
    rels = torch.tensor([0, 1, 2, 1, 2], dtype=torch.int32)
    costs = [1.0, 0.5, 0.0]
    res = ops.dijkstra(indptr, tails, rels, costs, torch.tensor([0, 2, 3, 1]), heap="sweep")
    assert res.dist.tolist() == [[0.0, 1.0, 0.5, 1.0], [math.inf, 0.5, 0.0, 0.5],
                                 [math.inf, 0.0, math.inf, 0.0], [math.inf, 0.0, math.inf, 0.0]]
    assert res.pred_entity[0].tolist() == [-1, 0, 0, 1] and res.pred_relation[0].tolist() == [-1, 0, 1, 2]
    assert res.pred_entity[2].tolist() == [-1, 3, -1, -1]  # source 3: 1 via the free edge
    assert res.pred_entity[3].tolist() == [-1, -1, -1, 1]  # source 1: 3 is flat, linked from 1


def test_float_absorption_is_flat_not_a_cycle():
    """A cost below half an ulp of the distance adds nothing in float32: 1 <-> 2 with cost 1e-9 at distance
    1e4 are "flat" to each other, and each must still get a predecessor chain that reaches the source."""
    require_backend("cpp", "dijkstra", "cpu")
    # 0 -big-> 1, 1 -tiny-> 2, 2 -tiny-> 1
    indptr = torch.tensor([0, 1, 2, 3])
    tails = torch.tensor([1, 2, 1], dtype=torch.int32)
    rels = torch.tensor([0, 1, 1], dtype=torch.int32)
    for heap in ("sweep", "radix"):
        res = ops.dijkstra(indptr, tails, rels, [1e4, 1e-9], torch.tensor([0]), heap=heap)
        assert res.dist.tolist() == [[0.0, 1e4, 1e4]]
        assert res.pred_entity[0].tolist() == [-1, 0, 1]


@pytest.mark.parametrize("heap", ["auto", "sweep"])
def test_sweeps_degenerate_inputs(heap):
    require_backend("cpp", "dijkstra", "cpu")
    empty_i = torch.empty(0, dtype=torch.int32)
    # no edges: every source reaches only itself
    res = ops.dijkstra(torch.zeros(6, dtype=torch.int64), empty_i, empty_i, [1.0], torch.arange(5), heap=heap)
    assert torch.equal(res.dist, torch.where(torch.eye(5, dtype=torch.bool), 0.0, math.inf))
    assert (res.pred_entity == -1).all()
    # no sources
    res = ops.dijkstra(torch.zeros(4, dtype=torch.int64), empty_i, empty_i, [1.0], torch.empty(0, dtype=torch.int64),
                       heap=heap)
    assert res.dist.shape == (0, 3) and res.pred_entity.shape == (0, 3)
    # self loops only, one of them free
    indptr = torch.tensor([0, 1, 2])
    loops = ops.dijkstra(indptr, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
                         [0.0, 2.0], torch.tensor([0, 1, 1, 0]), heap=heap)
    assert loops.dist.tolist() == [[0.0, math.inf], [math.inf, 0.0], [math.inf, 0.0], [0.0, math.inf]]
    assert (loops.pred_entity == -1).all()


def test_sweep_with_targets_heuristic_and_hops():
    """``heap="sweep"`` computes every distance even with targets or a heuristic (exact, a superset of the
    contract); hop-bounded searches fall back to Dijkstra; ``"auto"`` keeps Dijkstra's early exit."""
    require_backend("cpp", "dijkstra", "cpu")
    gen = torch.Generator().manual_seed(5)
    indptr, tails, rels, costs = random_csr_multigraph(gen, 60, 4, 300)
    sources = torch.randint(0, 60, (20,), generator=gen)
    full = ops.dijkstra(indptr, tails, rels, costs, sources, heap="radix")
    tgt = torch.tensor([3, 7])
    swept = ops.dijkstra(indptr, tails, rels, costs, sources, targets=tgt, heuristic=torch.zeros(60), heap="sweep")
    assert torch.equal(swept.dist, full.dist)
    for heap in ("auto", "sweep"):
        hop = ops.dijkstra(indptr, tails, rels, costs, sources, max_hops=2, heap=heap)
        want = ops.dijkstra(indptr, tails, rels, costs, sources, max_hops=2, heap="radix")
        assert _same(hop, want)
    auto = ops.dijkstra(indptr, tails, rels, costs, sources, targets=tgt, heap="auto")
    radix = ops.dijkstra(indptr, tails, rels, costs, sources, targets=tgt, heap="radix")
    assert _same(auto, radix)  # same Dijkstra, same early exit


def test_unknown_heap_is_one_line_error():
    from kgreason.errors import UserError

    indptr = torch.tensor([0, 0])
    empty_i = torch.empty(0, dtype=torch.int32)
    with pytest.raises(UserError, match="heap.*'sweeep'"):
        ops.dijkstra(indptr, empty_i, empty_i, [1.0], torch.tensor([0]), heap="sweeep")


def test_sweep_work_budget_on_a_backward_chain():
    """A chain numbered against the sweep order (n-1 -> n-2 -> ... -> 0) needs one Gauss-Seidel sweep per edge:
    O(n) sweeps of an O(n) scan.  The sweeps give up at their work budget and the batch is searched with
    Dijkstra instead: same answers, and fast (without the budget this took minutes)."""
    require_backend("cpp", "dijkstra", "cpu")
    import time

    n = 200_000
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(n, dtype=torch.int64)])  # node v>0: 1 edge
    tails = torch.arange(n - 1, dtype=torch.int32)  # v -> v-1
    rels = torch.zeros(n - 1, dtype=torch.int32)
    sources = torch.tensor([n - 1, n - 2, n // 2, 5])
    t0 = time.perf_counter()
    got = ops.dijkstra(indptr, tails, rels, [0.5], sources, heap="sweep")
    elapsed = time.perf_counter() - t0
    want = ops.dijkstra(indptr, tails, rels, [0.5], sources, heap="radix")
    assert _same(got, want)
    assert float(got.dist[0, 0]) == 0.5 * (n - 1)
    assert elapsed < 5.0, f"{elapsed:.1f} s"
