"""Pure-torch reference implementations (any device); the kernels must match them exactly.

Every product is a single float32 multiplication and every reduction a max, so
the compiled kernels reproduce these results bit for bit, argmax included
(ties go to the smallest source index; ``-1`` where the result is 0).
Work is chunked over the batch so that the (chunk x nnz) temporaries stay
around 2^24 elements.
"""
from __future__ import annotations

import torch

from .prepared import PreparedMatrix

__all__ = ["project", "project_negated", "negation_factor"]

_CHUNK_ELEMS = 1 << 24


def _chunks(b: int, per_row: int, budget: int = _CHUNK_ELEMS):
    step = max(1, budget // max(per_row, 1))
    for lo in range(0, b, step):
        yield lo, min(b, lo + step)


def negation_factor(values: torch.Tensor, neg_scale: float) -> torch.Tensor:
    """``1 - min(1, neg_scale * v)`` in float32 (the kernels use the same float32 formula)."""
    s = torch.tensor(neg_scale, dtype=torch.float32, device=values.device)
    return 1.0 - torch.clamp(values * s, max=1.0)


def _max_and_argmax(products: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n: int, want_arg: bool):
    """Scatter-max ``products`` (c, nnz) into (c, n) by ``dst``; argmax = smallest ``src`` reaching the max."""
    c = products.shape[0]
    dst_e = dst.expand(c, -1)
    y = torch.zeros(c, n, dtype=products.dtype, device=products.device)
    y.scatter_reduce_(1, dst_e, products, reduce="amax", include_self=True)
    if not want_arg:
        return y, None
    hit = (products == torch.gather(y, 1, dst_e)) & (products > 0)
    cand = torch.where(hit, src.expand(c, -1), torch.full_like(dst_e, n))
    a = torch.full((c, n), n, dtype=torch.int64, device=products.device)
    a.scatter_reduce_(1, dst_e, cand, reduce="amin", include_self=True)
    a[a == n] = -1
    return y, a.to(torch.int32)



def _join_chunks(ys: list, as_: list, x: torch.Tensor, n: int, return_argmax: bool):
    """Concatenate per-chunk results into ``Y`` (B, N) and, if asked, ``argmax`` (B, N) int32."""
    y = torch.cat(ys) if ys else x.new_zeros(0, n)
    if not return_argmax:
        return y
    a = torch.cat(as_) if as_ else torch.full((0, n), -1, dtype=torch.int32, device=x.device)
    return y, a

def project(x: torch.Tensor, m: PreparedMatrix, return_argmax: bool = False):
    """``Y[b, j] = max_i X[b, i] * M[i, j]`` (B, N); with argmax (B, N) int32."""
    b, n = x.shape
    rows = m.row_indices()
    cols = m.col.long()
    ys, as_ = [], []
    for lo, hi in _chunks(b, m.nnz):
        prod = x[lo:hi][:, rows] * m.val
        y, a = _max_and_argmax(prod, rows, cols, n, return_argmax)
        ys.append(y)
        as_.append(a)
    return _join_chunks(ys, as_, x, n, return_argmax)


def project_negated(x: torch.Tensor, m: PreparedMatrix, neg_scale: float, return_argmax: bool = False):
    """``Y[b, j] = max_i X[b, i] * (1 - min(1, neg_scale * M[i, j]))`` without forming the dense factor.

    Outside column j's support the factor is 1, so the best there is the
    largest ``X[b, i]`` with ``i`` not in the support.  With the row's entries
    sorted by (value desc, index asc), that is the entry at the first rank not
    taken by a support entry (the "mex" of the support's ranks), found with a
    segmented sort per column.
    """
    b, n = x.shape
    cols = m.col_indices_csc()  # (nnz,), ascending
    rows = m.row.long()
    f = negation_factor(m.tval, neg_scale)
    deg = (m.ccol[1:] - m.ccol[:-1]).long()
    start = m.ccol[:-1].long()
    pos = torch.arange(m.nnz, device=x.device) - start[cols]  # position inside the column segment
    ys, as_ = [], []
    for lo, hi in _chunks(b, 4 * m.nnz + n):
        xc = x[lo:hi]
        c = xc.shape[0]
        y_in, a_in = _max_and_argmax(xc[:, rows] * f, rows, cols, n, True)
        sv, si = torch.sort(xc, dim=1, descending=True, stable=True)
        rank = torch.empty_like(si)
        rank.scatter_(1, si, torch.arange(n, device=x.device).expand(c, -1))
        key = cols * n + rank[:, rows]  # (c, nnz): column-major, rank inside
        key, _ = torch.sort(key, dim=1)
        srank = key - cols * n
        cand = torch.where(srank != pos, pos, deg[cols])
        mex = deg.expand(c, -1).clone()
        mex.scatter_reduce_(1, cols.expand(c, -1), cand, reduce="amin", include_self=True)
        has_out = mex < n
        safe = torch.where(has_out, mex, torch.zeros_like(mex))
        y_out = torch.where(has_out, torch.gather(sv, 1, safe), torch.zeros_like(y_in))
        a_out = torch.where(has_out & (y_out > 0), torch.gather(si, 1, safe), torch.full_like(mex, -1)).to(torch.int32)
        y = torch.maximum(y_in, y_out)
        big = torch.iinfo(torch.int32).max
        a_in_m = torch.where((y_in == y) & (a_in >= 0), a_in, torch.full_like(a_in, big))
        a_out_m = torch.where((y_out == y) & (a_out >= 0), a_out, torch.full_like(a_out, big))
        a = torch.minimum(a_in_m, a_out_m)
        a = torch.where((y > 0) & (a != big), a, torch.full_like(a, -1))
        ys.append(y)
        as_.append(a)
    return _join_chunks(ys, as_, x, n, return_argmax)
