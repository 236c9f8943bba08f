"""ops.dijkstra: the cpp kernel against the pure-Python reference backend, and input validation.

engine.paths' tests (tests/test_paths_dijkstra.py) check both backends against
scipy and brute force through PathGraph; these check the op layer itself.
"""
from __future__ import annotations

import math

import pytest
import torch

import ops
from _ops_helpers import random_csr_multigraph, require_backend
from kgreason.errors import UserError


def _walk(res, i: int, v: int, source: int, max_hops):
    """Edges (u, r, v) of the reported path from row i's source to v, from the predecessor tensors."""
    edges = []
    if max_hops is None:
        while v != source:
            u, r = int(res.pred_entity[i, v]), int(res.pred_relation[i, v])
            edges.append((u, r, v))
            v = u
            assert len(edges) <= res.dist.shape[1], "predecessor cycle"
    else:
        k = int(res.hops[i, v])
        while k > 0:
            u, r = int(res.pred_entity[i, k, v]), int(res.pred_relation[i, k, v])
            edges.append((u, r, v))
            v, k = u, k - 1
    return edges[::-1]


@pytest.mark.parametrize("max_hops", [None, 0, 3])
@pytest.mark.parametrize("heap", list(ops.HEAPS))
@pytest.mark.parametrize("targets", ["none", "shared", "per-source"])
def test_cpp_equals_reference(seed, max_hops, heap, targets):
    require_backend("cpp", "dijkstra", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n = 70
    indptr, tails, rels, costs = random_csr_multigraph(gen, n, 5, 260)
    costs[0] = 0.0  # zero-cost edges
    sources = torch.randint(0, n, (12,), generator=gen)
    tgt = {"none": None, "shared": torch.tensor([3, -1, 40]),
           "per-source": torch.randint(-1, n, (12, 3), generator=gen)}[targets]
    a = ops.dijkstra(indptr, tails, rels, costs, sources, targets=tgt, max_hops=max_hops, heap=heap, backend="cpp")
    b = ops.dijkstra(indptr, tails, rels, costs, sources, targets=tgt, max_hops=max_hops, backend="reference")
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.shape == y.shape and x.dtype == y.dtype, f"{name}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
    if tgt is None:
        compare = torch.ones_like(a.dist, dtype=torch.bool)
    else:  # with targets only the targets' entries are exact (the rest are upper bounds)
        rows = tgt.expand(len(sources), -1) if tgt.dim() == 1 else tgt
        compare = torch.zeros_like(a.dist, dtype=torch.bool)
        for i, row in enumerate(rows.tolist()):
            compare[i, [t for t in row if t >= 0]] = True
    assert torch.equal(torch.isinf(a.dist)[compare], torch.isinf(b.dist)[compare]), f"reachability (seed={seed})"
    fin = compare & torch.isfinite(a.dist)
    torch.testing.assert_close(a.dist[fin], b.dist[fin], rtol=1e-5, atol=1e-5, msg=f"dist (seed={seed})")
    heads = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    edges = set(zip(heads.tolist(), rels.tolist(), tails.tolist()))
    for res in (a, b):  # every reported path is a real path of the reported cost
        for i, s in enumerate(sources.tolist()):
            for v in torch.nonzero(fin[i]).flatten().tolist():
                p = _walk(res, i, v, s, max_hops)
                assert all(e in edges for e in p)
                assert sum(float(costs[r]) for _, r, _ in p) == pytest.approx(float(res.dist[i, v]), abs=1e-4)


def test_small_graph_by_hand():
    """0 -r0-> 1 -r1-> 2: the reference backend, then the default backend (cpp when built)."""
    indptr = torch.tensor([0, 1, 2, 2])
    tails, rels = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    res = ops.dijkstra(indptr, tails, rels, [1.0, 2.5], torch.tensor([0]), backend="reference")
    assert res.dist.tolist() == [[0.0, 1.0, 3.5]]
    assert res.pred_entity.tolist() == [[-1, 0, 1]] and res.pred_relation.tolist() == [[-1, 0, 1]]
    assert res.hops is None
    res = ops.dijkstra(indptr, tails, rels, [1.0, math.inf], torch.tensor([0, 2]), return_predecessors=False)
    assert res.pred_entity is None and res.dist[0, 2] == math.inf and res.dist[1].tolist() == [math.inf] * 2 + [0]


def _args():
    return torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"backend": "python"}, r"backend: expected one of"),
        ({"heap": "fibonacci"}, r"unknown heap 'fibonacci'"),
        ({"indptr": torch.tensor([0, 1, 2, 2], dtype=torch.int32)}, r"indptr: expected a 1-D torch.int64 tensor"),
        ({"indptr": torch.tensor([0, 1, 2, 3])}, r"indptr: must start at 0 and end at E=2"),
        ({"indptr": torch.tensor([0, 2, 1, 2])}, r"indptr: must be non-decreasing"),
        ({"tails": torch.tensor([1, 7], dtype=torch.int32)}, r"tails: entity ids must lie in \[0, 3\), got 1..7"),
        ({"rels": torch.tensor([0, 2], dtype=torch.int32)}, r"rels: relation ids must lie in \[0, 2\)"),
        ({"tails": torch.tensor([1], dtype=torch.int32)}, r"tails/rels: expected one entry per edge each"),
        ({"costs": [1.0, -2.0]}, r"relation_costs: cost of relation id 1 is negative \(-2.0\)"),
        ({"costs": [1.0, math.nan]}, r"relation_costs: cost of relation id 1 is NaN"),
        ({"costs": [[1.0, 2.0]]}, r"relation_costs: expected shape \(R,\) \(one per relation\)"),
        ({"sources": torch.tensor([0.0])}, r"sources: expected integer entity ids, got dtype torch.float32"),
        ({"sources": torch.tensor([3])}, r"sources: entity id 3 out of range \[0, 3\)"),
        ({"sources": [0]}, r"sources: expected a torch.Tensor of entity ids, got list"),
        ({"targets": torch.tensor([-2])}, r"targets: entity id -2 out of range \[0, 3\) \(-1 = padding\)"),
        ({"targets": torch.zeros(1, 1, 1, dtype=torch.int64)}, r"targets: expected shape \(T,\) or \(S=1, T\)"),
        ({"heuristic": torch.tensor([0.0, math.nan, 0.0])}, r"heuristic: entries must be non-negative"),
        ({"heuristic": torch.zeros(4)}, r"heuristic: expected shape \(N=3,\) or \(S=1, N\), got \(4,\)"),
        ({"max_hops": -1}, r"max_hops: expected None or an integer >= 0, got -1"),
        ({"max_hops": 1.5}, r"max_hops: expected None or an integer >= 0, got 1.5"),
    ],
)
def test_bad_input(change, match):
    indptr, tails, rels = _args()
    kw = {"indptr": indptr, "tails": tails, "rels": rels, "costs": [1.0, 2.0], "sources": torch.tensor([0])}
    kw.update(change)
    pos = [kw.pop(k) for k in ("indptr", "tails", "rels", "costs", "sources")]
    with pytest.raises(UserError, match=match):
        ops.dijkstra(*pos, **kw)


def test_validate_false_skips_only_the_graph_value_scan():
    indptr, tails, rels = _args()
    ops.dijkstra(indptr, tails, rels, [1.0, 2.0], torch.tensor([0]), validate=False)
    with pytest.raises(UserError, match="indptr: expected a 1-D torch.int64"):
        ops.dijkstra(indptr.int(), tails, rels, [1.0, 2.0], torch.tensor([0]), validate=False)
    with pytest.raises(UserError, match="sources: entity id 9"):
        ops.dijkstra(indptr, tails, rels, [1.0, 2.0], torch.tensor([9]), validate=False)
