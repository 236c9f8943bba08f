"""Pure-torch reference implementations (any device); the kernels must match them exactly.

:func:`project_stacked` is the reference of ``ops.project`` (every row through its own
relation of a stack, plain or negated); :func:`project` and :func:`project_negated` compute
the one-relation case another way (one matrix, a dense scatter per chunk of rows), a
second, independent check of the same numbers.

Every product is a single float32 multiplication and every reduction a max, so
the compiled kernels reproduce these results bit for bit, argmax included
(ties go to the smallest source index; ``-1`` where the result is 0).
Work is chunked over the batch so that the (chunk x nnz) temporaries stay
around 2^24 elements.
"""
from __future__ import annotations

import torch

from kgreason.constants import QTO_NEG_SCALE

from .prepared import StackedMatrices

__all__ = ["project_stacked", "project", "project_negated", "negation_factor"]

_CHUNK_ELEMS = 1 << 24
_STACK_CHUNK_ELEMS = 1 << 22  # entries gathered per chunk by project_stacked (a few (chunk,) temporaries)


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

def project(x: torch.Tensor, m: StackedMatrices, return_argmax: bool = False):
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


def project_negated(x: torch.Tensor, m: StackedMatrices, neg_scale: float, return_argmax: bool = False):
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


# ------------------------------------------------------------------------ stacked (the one reference)
def _row_chunks(counts: list[int], budget: int = _STACK_CHUNK_ELEMS):
    """Consecutive row ranges whose gathered entries stay around ``budget`` (at least one row each)."""
    lo, acc = 0, 0
    for b, c in enumerate(counts):
        if b > lo and acc + c > budget:
            yield lo, b
            lo, acc = b, 0
        acc += c
    if lo < len(counts):
        yield lo, len(counts)


def project_stacked(x: torch.Tensor, rel: torch.Tensor, M: StackedMatrices, *, negated: bool = False,
                    neg_scale: float = QTO_NEG_SCALE, return_argmax: bool = False):
    """Pure-torch :func:`ops.project` (any device; inputs assumed valid): row b through ``M_{rel[b]}``.

    For a chunk of rows, gathers every entry of each row's relation from the stacked
    transpose (column-major: the entries of output cell (b, j) are contiguous, rows i
    ascending), forms the float32 products and scatter-maxes them into the cells; argmax
    is the smallest i whose product equals the max.  Negated: the in-support products use
    the factor of :func:`negation_factor`; the out-of-support maximum of
    cell (b, j) is X[b]'s value at the first rank (X[b] sorted by value desc, index asc)
    not taken by an entry of column j's support, found with one sort of the chunk's
    (cell, rank) keys, as :func:`project_negated` does per matrix.
    """
    b, n = x.shape
    dev = x.device
    rel64 = rel.long()
    y = torch.zeros(b, n, dtype=torch.float32, device=dev)
    a = torch.full((b, n), -1, dtype=torch.int32, device=dev) if return_argmax else None
    if b == 0:
        return (y, a) if return_argmax else y
    tc = M.tcrow.long()
    start = tc[rel64 * n]  # (B,) first transposed entry of each row's relation
    count = tc[(rel64 + 1) * n] - start
    # column j of every transposed entry
    tcol = torch.remainder(
        torch.repeat_interleave(torch.arange(M.num_relations * n, device=dev), tc[1:] - tc[:-1], output_size=M.nnz), n)
    f_all = negation_factor(M.tval, neg_scale) if negated else M.tval
    for lo, hi in _row_chunks([int(c) + n for c in count.tolist()]):  # entries + the chunk's (c, n) cells
        c = hi - lo
        cnt = count[lo:hi]
        total = int(cnt.sum())
        which = torch.repeat_interleave(torch.arange(c, device=dev), cnt, output_size=total)  # chunk row of each entry
        first = torch.cumsum(cnt, 0) - cnt
        k = torch.arange(total, device=dev) - first[which] + start[lo:hi][which]  # transposed entry ids
        i = M.trow[k].long()
        cell = which * n + tcol[k]  # flat (chunk row, column j); non-decreasing over the entries
        prod = x[lo + which, i] * f_all[k]
        yc = torch.zeros(c * n, dtype=torch.float32, device=dev)
        yc.scatter_reduce_(0, cell, prod, reduce="amax", include_self=True)
        ac = None
        if return_argmax or negated:
            hit = (prod == yc[cell]) & (prod > 0)
            cand = torch.where(hit, i, torch.full_like(i, n))
            ac = torch.full((c * n,), n, dtype=torch.int64, device=dev)
            ac.scatter_reduce_(0, cell, cand, reduce="amin", include_self=True)
            ac[ac == n] = -1
        if negated:
            yc, ac = _merge_out_of_support(x[lo:hi], cell, i, which, yc, ac)
        y[lo:hi] = yc.view(c, n)
        if return_argmax:
            a[lo:hi] = ac.view(c, n).to(torch.int32)
    return (y, a) if return_argmax else y


def _merge_out_of_support(xc, cell, i, which, y_in, a_in):
    """max(in-support (y_in, a_in), out-of-support) per flat cell of the chunk xc (c, n)."""
    c, n = xc.shape
    dev = xc.device
    sv, si = torch.sort(xc, dim=1, descending=True, stable=True)  # value desc, index asc
    rank = torch.empty_like(si)
    rank.scatter_(1, si, torch.arange(n, device=dev).expand(c, -1))
    deg = torch.bincount(cell, minlength=c * n)
    seg_start = torch.cumsum(deg, 0) - deg
    pos = torch.arange(cell.numel(), device=dev) - seg_start[cell]  # position inside the cell's entries
    key, _ = torch.sort(cell * n + rank[which, i])  # cells stay in place (cell is non-decreasing)
    srank = key - cell * n
    cand = torch.where(srank != pos, pos, deg[cell])
    mex = deg.clone()  # first rank not taken by the support (the support's size when it is 0..deg-1)
    mex.scatter_reduce_(0, cell, cand, reduce="amin", include_self=True)
    has_out = mex < n
    safe = torch.where(has_out, mex, torch.zeros_like(mex))
    rows = torch.arange(c * n, device=dev) // n
    y_out = torch.where(has_out, sv[rows, safe], torch.zeros((), device=dev))
    a_out = torch.where(has_out & (y_out > 0), si[rows, safe], torch.full_like(mex, -1))
    y = torch.maximum(y_in, y_out)
    big = n + 1
    a_in_m = torch.where((y_in == y) & (a_in >= 0), a_in, torch.full_like(a_in, big))
    a_out_m = torch.where((y_out == y) & (a_out >= 0), a_out, torch.full_like(a_out, big))
    a = torch.minimum(a_in_m, a_out_m)
    a = torch.where((y > 0) & (a != big), a, torch.full_like(a, -1))
    return y, a
