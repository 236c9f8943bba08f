"""Random inputs for the ops tests (seeded by the ``seed`` fixture of conftest.py) and backend parameters."""
from __future__ import annotations

import pytest
import torch

import ops

#: Every backend an op test runs on (a pytest parameter; see :func:`require_backend`).
BACKENDS = list(ops.BACKENDS)


def _param_id(v) -> str:
    return str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else str(v)


def lane_grid(*axes: list) -> list:
    """Every case of the product of ``axes`` as a ``pytest.param``; all but a covering subset marked ``slow``.

    The fast lane (``-m "not slow"``) keeps a few cases in which every value of every axis occurs at least
    once (picked greedily from a fixed shuffle of the product, so values are not always paired alike); the
    full run (CI) runs the whole product.  An axis whose values are tuples fills several argnames, so
    ``lane_grid(BACKENDS, [(1, 3), (7, 5)])`` goes with ``parametrize("backend,n,b", ...)``.
    """
    import itertools
    import random

    cases = list(itertools.product(*axes))
    order = list(range(len(cases)))
    random.Random(0).shuffle(order)
    fast: set[int] = set()
    todo = {(i, repr(v)) for i, axis in enumerate(axes) for v in axis}
    for k in order:
        new = {(i, repr(v)) for i, v in enumerate(cases[k])} & todo
        if new:
            fast.add(k)
            todo -= new
    params = []
    for k, case in enumerate(cases):
        flat = [x for v in case for x in (v if isinstance(v, tuple) else (v,))]
        params.append(pytest.param(*flat, marks=() if k in fast else pytest.mark.slow,
                                   id="-".join(_param_id(x) for x in flat)))
    return params


def require_backend(backend: str, op: str, device: str) -> None:
    """Skip the calling test when ``backend`` cannot run ``kgreason::<op>`` on ``device``."""
    if backend == "cpp" and not ops.has_kernel(op, device):
        why = "the extension ops._C is not built" if not ops.extension_available() else f"no {device} kernel"
        pytest.skip(f"cpp backend of kgreason::{op}: {why}")


def random_matrix(n: int, density: float, gen: torch.Generator, *, index_dtype=torch.int32, ties: bool = False,
                  empty_rows: int = 0, empty_cols: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(sparse CSR M, dense D) with values in (0, 1]; ``ties`` draws values from {0.25, 0.5, 1}."""
    mask = torch.rand(n, n, generator=gen) < density
    if ties:
        vals = torch.tensor([0.25, 0.5, 1.0])[torch.randint(0, 3, (n, n), generator=gen)]
    else:
        vals = torch.rand(n, n, generator=gen).clamp_min(1e-3)
    d = torch.where(mask, vals, torch.zeros(()))
    if empty_rows:
        d[torch.randperm(n, generator=gen)[:empty_rows]] = 0
    if empty_cols:
        d[:, torch.randperm(n, generator=gen)[:empty_cols]] = 0
    m = d.to_sparse_csr()
    m = torch.sparse_csr_tensor(m.crow_indices().to(index_dtype), m.col_indices().to(index_dtype), m.values(),
                                size=(n, n), check_invariants=True)
    return m, d


def random_batch(b: int, n: int, kind: str, gen: torch.Generator, *, ties: bool = False) -> torch.Tensor:
    """A (b, n) fuzzy batch: 'onehot', 'sparse' (~2% active), 'dense', 'zeros' or 'ones'."""
    if kind == "zeros":
        return torch.zeros(b, n)
    if kind == "ones":
        return torch.ones(b, n)
    if kind == "onehot":
        x = torch.zeros(b, n)
        if n:
            x[torch.arange(b), torch.randint(0, n, (b,), generator=gen)] = 1.0
        return x
    if ties:
        vals = torch.tensor([0.0, 0.5, 1.0])[torch.randint(0, 3, (b, n), generator=gen)]
    else:
        vals = torch.rand(b, n, generator=gen)
    if kind == "sparse":
        vals = vals * (torch.rand(b, n, generator=gen) < 0.02)
    return vals


def dense_project(x: torch.Tensor, d: torch.Tensor):
    """Brute force max-times product with argmax (smallest index on ties, -1 where 0)."""
    prod = x[:, :, None] * d[None]  # (B, N, N)
    y = prod.amax(dim=1) if x.shape[1] else torch.zeros(x.shape[0], 0)
    n = x.shape[1]
    hit = (prod == y[:, None, :]) & (prod > 0)
    idx = torch.where(hit, torch.arange(n)[None, :, None], torch.full((), n))
    a = idx.amin(dim=1) if n else torch.zeros(x.shape[0], 0, dtype=torch.long)
    a = torch.where(y > 0, a, torch.full((), -1)).to(torch.int32)
    return y, a


def sparse_project(x: torch.Tensor, d: torch.Tensor):
    """:func:`dense_project` over the nonzeros of ``d`` only: the same products (float32), maxima and argmax
    (smallest index on ties, -1 where 0), in B x nnz(d) work instead of B x N x N.  For the large matrices the
    kernels' parallel paths need (N = 1500 at 12%: ~3x faster than ops.project's reference backend there)."""
    t = d.t().contiguous().to_sparse_csr()  # row j of t: column j of d, its rows i ascending
    ptr, rows, vals = t.crow_indices(), t.col_indices(), t.values()
    b, n = x.shape
    col = torch.repeat_interleave(torch.arange(n), ptr[1:] - ptr[:-1]).expand(b, -1)
    prod = x[:, rows] * vals  # (B, nnz)
    y = torch.zeros(b, n).scatter_reduce_(1, col, prod, "amax", include_self=True)
    hit = (prod == y.gather(1, col)) & (prod > 0)
    cand = torch.where(hit, rows.expand(b, -1), torch.full((), n))
    a = torch.full((b, n), n, dtype=torch.int64).scatter_reduce_(1, col, cand, "amin", include_self=True)
    return y, torch.where(y > 0, a, torch.full((), -1)).to(torch.int32)


def dense_negation_factor(d: torch.Tensor, neg_scale: float) -> torch.Tensor:
    """1 - min(1, s * M) on the support, 1 elsewhere (float32, as the kernels compute it)."""
    s = torch.tensor(neg_scale, dtype=torch.float32)
    return torch.where(d > 0, 1.0 - torch.clamp(d * s, max=1.0), torch.ones(()))


def random_csr_multigraph(gen: torch.Generator, n: int, r: int, e: int):
    """(indptr int64, tails int32, rels int32, costs float32 (r,)) of a random multigraph (self loops and
    parallel edges included) in ops.dijkstra's layout: each head's edges sorted by (tail, relation)."""
    h = torch.randint(0, n, (e,), generator=gen)
    rel = torch.randint(0, r, (e,), generator=gen)
    t = torch.randint(0, n, (e,), generator=gen)
    key = (h * n + t) * r + rel  # sort by (head, tail, relation)
    order = torch.argsort(key, stable=True)
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(h, minlength=n), 0)
    costs = torch.rand(r, generator=gen) * 2
    return indptr, t[order].to(torch.int32), rel[order].to(torch.int32), costs
