"""Batched Dijkstra / A* (engine.paths.shortest_paths over ops.dijkstra): C++ op vs scipy, brute force and the
pure-Python reference backend."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra as scipy_dijkstra

from engine.paths import PathGraph, dijkstra, shortest_paths
from kgreason.errors import UserError

BACKENDS = ["cpp-radix", "cpp-binary", "cpp-4-ary", "reference"]


def kw(backend: str) -> dict:
    """shortest_paths keyword arguments of a backend/heap combination."""
    return {"backend": "reference"} if backend == "reference" else {"backend": "cpp", "heap": backend[4:]}


def random_multigraph(seed: int, n: int, r: int, e: int, *, isolated: int = 0, zero_costs: int = 0):
    """Triples over entities [0, n - isolated) (the last `isolated` ids have no edges) plus costs."""
    rng = np.random.default_rng(seed)
    live = max(n - isolated, 1)
    triples = np.stack([rng.integers(0, live, e), rng.integers(0, r, e), rng.integers(0, live, e)], axis=1)
    # Force parallel edges: duplicate some (head, tail) pairs with other relations.
    if e >= 4:
        k = e // 4
        dup = triples[rng.integers(0, e, k)].copy()
        dup[:, 1] = rng.integers(0, r, k)
        triples = np.concatenate([triples, dup])
    costs = rng.random(r).astype(np.float32) * 3
    costs[rng.permutation(r)[:zero_costs]] = 0.0
    return triples, costs


def scipy_reference(triples, costs, n, sources):
    """scipy's dijkstra on the (head, tail) matrix holding the cheapest parallel edge (self loops dropped)."""
    w = costs[triples[:, 1]].astype(np.float64)
    keep = triples[:, 0] != triples[:, 2]
    h, t, w = triples[keep, 0], triples[keep, 2], w[keep]
    best: dict[tuple[int, int], float] = {}
    for a, b, c in zip(h.tolist(), t.tolist(), w.tolist()):
        best[(a, b)] = min(best.get((a, b), math.inf), c)
    if best:
        keys = np.array(list(best.keys()))
        vals = np.array(list(best.values()))
        m = sp.csr_matrix((vals, (keys[:, 0], keys[:, 1])), shape=(n, n))
    else:
        m = sp.csr_matrix((n, n))
    return scipy_dijkstra(m, directed=True, indices=np.asarray(sources))


def path_cost(path, costs):
    return float(sum(costs[r] for _, r, _ in path))


def check_paths(res, triples, costs, check_hops=False):
    """Every reachable target's predecessor path is a real path of the reported cost."""
    edges = {(int(a), int(b), int(c)) for a, b, c in triples}
    for i, s in enumerate(res.sources):
        for v in np.flatnonzero(np.isfinite(res.dist[i])):
            p = res.path(i, int(v))
            assert p is not None
            if p:
                assert p[0][0] == s and p[-1][2] == v
                for a, b in zip(p, p[1:]):
                    assert a[2] == b[0]
            else:
                assert v == s
            assert all(edge in edges for edge in p)
            assert path_cost(p, costs) == pytest.approx(float(res.dist[i, v]), rel=1e-5, abs=1e-5)
            if check_hops:
                assert len(p) == res.hops[i, v] <= res.max_hops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "seed,n,r,e,isolated,zero",
    [(0, 1, 1, 0, 0, 0), (1, 5, 2, 8, 1, 0), (2, 30, 4, 80, 3, 1), (3, 120, 6, 500, 10, 2), (4, 300, 12, 2500, 0, 3)],
)
def test_distances_equal_scipy(backend, seed, n, r, e, isolated, zero):
    triples, costs = random_multigraph(seed, n, r, e, isolated=isolated, zero_costs=zero)
    rng = np.random.default_rng(seed + 100)
    sources = rng.integers(0, n, size=min(n, 25))
    sources = np.concatenate([sources, sources[:3]])  # duplicate sources
    if isolated:
        sources[0] = n - 1  # an isolated source
    g = PathGraph(triples, n, num_relations=r)
    res = shortest_paths(g, sources, costs, **kw(backend))
    expected = scipy_reference(triples, costs, n, sources)
    assert res.dist.shape == (len(sources), n) and res.dist.dtype == np.float32
    np.testing.assert_array_equal(np.isinf(res.dist), np.isinf(expected))
    fin = np.isfinite(expected)
    np.testing.assert_allclose(res.dist[fin], expected[fin], rtol=1e-5, atol=1e-5)
    check_paths(res, triples, costs)


@pytest.mark.parametrize("heap", ["radix", "binary", "4-ary"])
def test_functional_api_and_heaps(heap):
    triples, costs = random_multigraph(7, 200, 5, 900)
    sources = np.arange(0, 200, 7)
    d = dijkstra(triples, 200, sources, costs)
    expected = scipy_reference(triples, costs, 200, sources)
    np.testing.assert_allclose(d, expected, rtol=1e-5, atol=1e-5)
    g = PathGraph(triples, 200, num_relations=5)
    np.testing.assert_array_equal(shortest_paths(g, sources, costs, heap=heap, return_predecessors=False).dist, d)


def hop_bounded_brute_force(triples, costs, n, source, max_hops):
    """dist_k(v) = cheapest walk with <= k edges, by k rounds of relaxing every edge from the previous round."""
    d = np.full(n, np.inf)
    d[source] = 0.0
    for _ in range(max_hops):
        nd = d.copy()
        for h, r, t in triples.tolist():
            c = d[h] + costs[r]
            if c < nd[t]:
                nd[t] = c
        d = nd
    return d


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_hops", [0, 1, 2, 3, 6])
@pytest.mark.parametrize("seed", [11, 12])
def test_max_hops_equal_brute_force(backend, max_hops, seed):
    n = 60
    triples, costs = random_multigraph(seed, n, 5, 150, isolated=4, zero_costs=1)
    sources = np.random.default_rng(seed).integers(0, n, 8)
    g = PathGraph(triples, n, num_relations=5)
    res = shortest_paths(g, sources, costs, max_hops=max_hops, **kw(backend))
    assert res.pred_entity.shape == (len(sources), max_hops + 1, n)
    for i, s in enumerate(sources):
        expected = hop_bounded_brute_force(triples, costs.astype(np.float64), n, int(s), max_hops)
        np.testing.assert_array_equal(np.isinf(res.dist[i]), np.isinf(expected))
        fin = np.isfinite(expected)
        np.testing.assert_allclose(res.dist[i][fin], expected[fin], rtol=1e-5, atol=1e-5)
    check_paths(res, triples, costs, check_hops=True)


def test_max_hops_large_equals_unbounded():
    triples, costs = random_multigraph(5, 80, 4, 300)
    g = PathGraph(triples, 80, num_relations=4)
    a = shortest_paths(g, np.arange(80), costs)
    b = shortest_paths(g, np.arange(80), costs, max_hops=80)
    np.testing.assert_allclose(a.dist, b.dist, rtol=1e-6)


def test_hop_bound_prefers_cheaper_longer_path_only_within_bound():
    # 0 -a-> 1 -a-> 2 (cost 1 + 1) versus 0 -b-> 2 (cost 5).
    triples = np.array([[0, 0, 1], [1, 0, 2], [0, 1, 2]])
    g = PathGraph(triples, 3, num_relations=2)
    costs = np.array([1.0, 5.0])
    assert shortest_paths(g, [0], costs).dist[0, 2] == 2.0
    res = shortest_paths(g, [0], costs, max_hops=1)
    assert res.dist[0, 2] == 5.0 and res.hops[0, 2] == 1 and res.path(0, 2) == [(0, 1, 2)]
    res = shortest_paths(g, [0], costs, max_hops=2)
    assert res.dist[0, 2] == 2.0 and res.path(0, 2) == [(0, 0, 1), (1, 0, 2)]
    assert np.isinf(shortest_paths(g, [2], costs, max_hops=3).dist[0, :2]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_hops", [None, 3])
@pytest.mark.parametrize("shared", [True, False])
def test_astar_with_admissible_heuristic_equals_dijkstra(backend, max_hops, shared):
    n = 150
    triples, costs = random_multigraph(21, n, 6, 700, zero_costs=1)
    rng = np.random.default_rng(21)
    sources = rng.integers(0, n, 12)
    targets = rng.integers(0, n, 12)
    g = PathGraph(triples, n, num_relations=6)
    full = shortest_paths(g, sources, costs, max_hops=max_hops)
    # Exact distance to the target (a perfect heuristic) scaled by random factors in [0, 1]:
    # admissible and in general inconsistent.
    rev = np.stack([triples[:, 2], triples[:, 1], triples[:, 0]], axis=1)
    to_target = shortest_paths(PathGraph(rev, n, num_relations=6), targets, costs).dist
    h = np.where(np.isfinite(to_target), to_target * rng.random(to_target.shape), np.inf).astype(np.float32)
    if shared:
        res = [shortest_paths(g, [s], costs, max_hops=max_hops, targets=[t], heuristic=h[i], **kw(backend))
               for i, (s, t) in enumerate(zip(sources, targets))]
        got = np.array([r.dist[0, t] for r, t in zip(res, targets)])
    else:
        r = shortest_paths(g, sources, costs, max_hops=max_hops, targets=targets[:, None], heuristic=h, **kw(backend))
        got = r.dist[np.arange(len(targets)), targets]
        for i, t in enumerate(targets):
            if np.isfinite(got[i]):
                p = r.path(i, int(t))
                assert path_cost(p, costs) == pytest.approx(float(got[i]), rel=1e-5, abs=1e-5)
    expected = full.dist[np.arange(len(targets)), targets]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_targets_early_exit_exact_on_targets(backend):
    n = 200
    triples, costs = random_multigraph(31, n, 5, 900)
    g = PathGraph(triples, n, num_relations=5)
    sources = np.arange(0, n, 10)
    targets = np.random.default_rng(3).integers(-1, n, (len(sources), 4))  # -1 = padding
    full = shortest_paths(g, sources, costs).dist
    res = shortest_paths(g, sources, costs, targets=targets, **kw(backend))
    for i in range(len(sources)):
        for t in targets[i]:
            if t >= 0:
                assert res.dist[i, t] == pytest.approx(full[i, t], rel=1e-6) or (
                    np.isinf(res.dist[i, t]) and np.isinf(full[i, t]))
        # Every other entry is an upper bound.
        assert np.all(res.dist[i] >= full[i] - 1e-5)
    shared = shortest_paths(g, sources, costs, targets=np.array([5, 17]), **kw(backend))
    np.testing.assert_allclose(shared.dist[:, [5, 17]], full[:, [5, 17]], rtol=1e-6)


def test_cpp_matches_reference_predecessor_costs():
    triples, costs = random_multigraph(41, 90, 7, 400, zero_costs=2)
    g = PathGraph(triples, 90, num_relations=7)
    a = shortest_paths(g, np.arange(90), costs, max_hops=4)
    b = shortest_paths(g, np.arange(90), costs, max_hops=4, backend="reference")
    np.testing.assert_allclose(a.dist, b.dist, rtol=1e-5)
    # Hop counts may differ only between paths whose costs tie up to float rounding
    # (float32 in the kernel, float64 in the reference); both must be real paths.
    np.testing.assert_array_equal(a.hops >= 0, b.hops >= 0)
    assert (a.hops == b.hops).mean() > 0.95
    check_paths(a, triples, costs, check_hops=True)
    check_paths(b, triples, costs, check_hops=True)


def test_infinite_cost_means_unusable():
    triples = np.array([[0, 0, 1], [1, 1, 2]])
    g = PathGraph(triples, 3, num_relations=2)
    d = shortest_paths(g, [0], [1.0, np.inf]).dist
    assert d[0, 1] == 1.0 and np.isinf(d[0, 2])


def test_empty_inputs():
    g = PathGraph(np.zeros((0, 3), dtype=np.int64), 4, num_relations=2)
    res = shortest_paths(g, [2], [1.0, 2.0])
    assert res.dist[0, 2] == 0 and np.isinf(res.dist[0, [0, 1, 3]]).all()
    assert res.path(0, 1) is None and res.path(0, 2) == []
    assert shortest_paths(g, np.zeros(0, dtype=np.int64), [1.0, 2.0]).dist.shape == (0, 4)


@pytest.mark.parametrize("bad,word", [(-1.0, "negative"), (float("nan"), "NaN")])
def test_bad_costs_name_the_relation(bad, word):
    g = PathGraph(np.array([[0, 0, 1], [1, 1, 0]]), 2, relation_names=["likes", "hates"])
    with pytest.raises(UserError, match=rf"'hates' \(id 1\) is {word}"):
        shortest_paths(g, [0], [1.0, bad])
    with pytest.raises(ValueError, match="negative"):
        dijkstra(np.array([[0, 0, 1]]), 2, [0], [-0.5])


def test_bad_shapes_and_ids():
    g = PathGraph(np.array([[0, 0, 1]]), 2, num_relations=1)
    with pytest.raises(UserError, match="one per relation"):
        shortest_paths(g, [0], [1.0, 2.0])
    with pytest.raises(UserError, match="out of range"):
        shortest_paths(g, [5], [1.0])
    with pytest.raises(UserError, match="max_hops"):
        shortest_paths(g, [0], [1.0], max_hops=-2)
    with pytest.raises(UserError, match="heuristic"):
        shortest_paths(g, [0], [1.0], heuristic=np.ones(3))
    with pytest.raises(UserError, match="backend"):  # one backend vocabulary: "cpp" | "reference"
        shortest_paths(g, [0], [1.0], backend="python")
    with pytest.raises(UserError, match="entity id out of range"):
        PathGraph(np.array([[0, 0, 9]]), 2)
    with pytest.raises(UserError, match="out of range"):
        dijkstra(np.array([[0, 3, 1]]), 2, [0], [1.0])
