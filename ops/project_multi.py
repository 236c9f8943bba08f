"""Multi-relation projection: every row of a batch through its own relation, in one call.

A knowledge graph's R relation matrices (N x N each) are stacked into one
(R*N, N) CSR, row ``r*N + i`` holding ``M_r[i, :]`` (the layout of
:attr:`kge.artifact.Artifact.matrices`).  :func:`prepare_stacked` validates it
once and adds its stacked transpose (row ``r*N + j`` holds ``M_r[:, j]``, rows
ascending); :func:`project_multi` then projects a (B, N) batch whose row ``b``
carries its own relation id ``rel[b]``::

    Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]                            (negated=False)
    Y[b, j] = max_i X[b, i] * (1 - min(1, neg_scale * M_{rel[b]}[i, j]))  (negated=True; factor 1
                                                                            where M has no entry)

with exactly the float32 products of :func:`ops.project` / :func:`ops.project_negated`
(the results equal a loop of those over the rows' relations, bit for bit, argmax
included).  The compiled CPU kernel picks, per row, push (scatter the rows of
M of the row's active entities: sparse rows), pull (gather over the transpose
in tiles of rows sharing a relation: dense rows) or sweep (scatter from the
relation's own entries: dense rows through small relations); see
``csrc/cpu/project_multi_cpu.cpp``.

>>> import torch, ops
>>> M0 = torch.tensor([[0.0, 0.9], [0.5, 0.0]])
>>> M1 = torch.tensor([[0.2, 0.0], [0.0, 1.0]])
>>> S = ops.prepare_stacked(torch.cat([M0, M1]).to_sparse_csr())
>>> ops.project_multi(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1]), S)
tensor([[0.0000, 0.9000],
        [0.2000, 0.0000]])
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kgreason.errors import UserError

from . import reference
from ._backend import extension_available, has_kernel, resolve_backend
from .prepared import PreparedMatrix, check_fuzzy, check_out, write_out

__all__ = ["StackedMatrices", "prepare_stacked", "project_multi", "project_multi_strategies", "reference_project_multi",
           "SWEEP"]

_INDEX_DTYPES = (torch.int32, torch.int64)
_STRATEGIES = {"auto": 0, "push": 1, "pull": 2}
#: The code :func:`project_multi_strategies` reports for a row swept through its relation's entries.
SWEEP = 3
_CHUNK_ELEMS = 1 << 22  # entries gathered per chunk by the reference (a few (chunk,) temporaries of this size)


@dataclass(frozen=True, eq=False)
class StackedMatrices:
    """R relation matrices (N x N) stacked as one (R*N, N) CSR, plus the stacked transpose.

    Attributes:
        n: number of entities N (>= 1).
        num_relations: R.
        crow, col, val: the stack, shapes (R*N+1,), (nnz,), (nnz,); row ``r*N + i`` is ``M_r[i, :]``.
            ``crow`` int32 or int64, ``col`` int32 or int64 (they may differ: the artifact's
            stack has int64 pointers and int32 columns), ``val`` float32 in [0, 1].
        tcrow, trow, tval: the stacked transpose, same shapes and dtypes (``tcrow`` like ``crow``,
            ``trow`` like ``col``); row ``r*N + j`` is ``M_r[:, j]`` with row indices ``i``
            ascending (the kernels' smallest-index tie rule relies on it).
    """

    n: int
    num_relations: int
    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    tcrow: torch.Tensor
    trow: torch.Tensor
    tval: torch.Tensor

    @property
    def nnz(self) -> int:
        return int(self.val.numel())

    @property
    def device(self) -> torch.device:
        return self.val.device

    def nnz_per_relation(self) -> torch.Tensor:
        """Entries of each ``M_r``: (R,) int64."""
        ends = self.crow[:: self.n].long()
        return ends[1:] - ends[:-1]

    def to(self, device: torch.device | str) -> "StackedMatrices":
        """The same stack on ``device`` (``self`` when already there)."""
        if torch.device(device) == self.device:
            return self
        parts = (self.crow, self.col, self.val, self.tcrow, self.trow, self.tval)
        return StackedMatrices(self.n, self.num_relations, *(t.to(device) for t in parts))

    def relation(self, r: int) -> PreparedMatrix:
        """``M_r`` as an :class:`ops.PreparedMatrix` (values and indices are views of the stack;
        pointers rebased to 0 and cast to the column dtype, as ``ops.project`` wants one dtype)."""
        if not 0 <= int(r) < self.num_relations:
            raise UserError(f"relation: id {r} is out of range [0, {self.num_relations})")
        n, r = self.n, int(r)
        lo, hi = int(self.crow[r * n]), int(self.crow[(r + 1) * n])
        tlo, thi = int(self.tcrow[r * n]), int(self.tcrow[(r + 1) * n])
        idx = self.col.dtype
        return PreparedMatrix(
            n,
            (self.crow[r * n : (r + 1) * n + 1] - lo).to(idx), self.col[lo:hi], self.val[lo:hi],
            (self.tcrow[r * n : (r + 1) * n + 1] - tlo).to(idx), self.trow[tlo:thi], self.tval[tlo:thi],
        )

    def __repr__(self) -> str:
        return (f"StackedMatrices(n={self.n}, num_relations={self.num_relations}, nnz={self.nnz}, "
                f"index_dtypes={self.crow.dtype}/{self.col.dtype}, device={self.device})")


def _as_tensor(a, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    try:
        import numpy as np

        if isinstance(a, np.ndarray):
            return torch.from_numpy(a)  # shares memory (the artifact's arrays are not copied)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise UserError(f"{name}: expected a torch.Tensor or numpy array, got {type(a).__name__}")


def _stack_parts(matrices, num_entities: int | None, name: str):
    """(crow, col, val, N) from a torch sparse CSR, a scipy CSR or a (crow, col, val) triple."""
    if isinstance(matrices, torch.Tensor):
        if matrices.layout != torch.sparse_csr:
            raise UserError(
                f"{name}: expected a torch sparse CSR tensor of shape (R*N, N), got layout {matrices.layout}")
        if matrices.dim() != 2:
            raise UserError(f"{name}: expected a 2-D (R*N, N) matrix, got shape {tuple(matrices.shape)}")
        n = int(matrices.shape[1])
        if num_entities is not None and int(num_entities) != n:
            raise UserError(f"num_entities: {num_entities} differs from {name}'s {n} columns")
        # copies, not views: a view of a sparse tensor's members is rejected by FakeTensor tracing
        return (matrices.crow_indices().clone(), matrices.col_indices().clone(), matrices.values().clone(), n,
                int(matrices.shape[0]))
    if hasattr(matrices, "indptr") and hasattr(matrices, "indices") and hasattr(matrices, "data"):  # scipy CSR
        if getattr(matrices, "format", "csr") != "csr":
            raise UserError(f"{name}: expected a scipy CSR matrix, got format {matrices.format!r}")
        n = int(matrices.shape[1])
        if num_entities is not None and int(num_entities) != n:
            raise UserError(f"num_entities: {num_entities} differs from {name}'s {n} columns")
        return (_as_tensor(matrices.indptr, f"{name}.indptr"), _as_tensor(matrices.indices, f"{name}.indices"),
                _as_tensor(matrices.data, f"{name}.data"), n, int(matrices.shape[0]))
    if isinstance(matrices, (tuple, list)) and len(matrices) == 3:
        if num_entities is None:
            raise UserError(f"num_entities: required when {name} is a (crow, col, val) triple")
        crow, col, val = (_as_tensor(t, f"{name}[{k}]") for k, t in enumerate(matrices))
        return crow, col, val, int(num_entities), None
    raise UserError(f"{name}: expected a sparse CSR (R*N, N) matrix or a (crow, col, val) triple, "
                    f"got {type(matrices).__name__}")


def prepare_stacked(matrices, *, num_entities: int | None = None, device: torch.device | str | None = None,
                    name: str = "matrices") -> StackedMatrices:
    """Validate a stacked (R*N, N) relation matrix once and build its stacked transpose.

    Args:
        matrices: a torch sparse CSR or scipy CSR of shape (R*N, N) (an artifact's
            ``matrices``: its numpy arrays are shared, not copied, on CPU), or a
            ``(crow, col, val)`` triple of 1-D tensors / arrays with ``num_entities`` given.
            Pointers and columns may be int32 or int64 (independently); values float32 in [0, 1].
        num_entities: N (required for a triple; checked against the matrix otherwise).
        device: move the stack there (default: where it is).
        name: what error messages call the argument.

    Returns a :class:`StackedMatrices` (returned unchanged when ``matrices`` already is one).
    Raises :class:`kgreason.errors.UserError` (a ``ValueError``) naming the problem.
    """
    if isinstance(matrices, StackedMatrices):
        return matrices if device is None else matrices.to(device)
    crow, col, val, n, rows = _stack_parts(matrices, num_entities, name)
    if isinstance(n, bool) or n < 1:
        raise UserError(f"num_entities: expected an integer >= 1, got {n}")
    if device is not None:
        crow, col, val = crow.to(device), col.to(device), val.to(device)
    for t, what in ((crow, "crow"), (col, "col"), (val, "val")):
        if t.dim() != 1:
            raise UserError(f"{name}: {what} must be 1-D, got shape {tuple(t.shape)}")
    if crow.dtype not in _INDEX_DTYPES:
        raise UserError(f"{name}: crow (row pointers) must be int32 or int64, got {crow.dtype}")
    if col.dtype not in _INDEX_DTYPES:
        raise UserError(f"{name}: col (column indices) must be int32 or int64, got {col.dtype}")
    if val.dtype != torch.float32:
        raise UserError(f"{name}: values must be float32, got {val.dtype}")
    if not (crow.device == col.device == val.device):
        raise UserError(
            f"{name}: crow, col and val are on different devices ({crow.device}, {col.device}, {val.device})")
    if (crow.numel() - 1) % n != 0 or crow.numel() < 1:
        raise UserError(f"{name}: crow has {crow.numel()} entries, expected R*N+1 for N = {n}")
    r = (crow.numel() - 1) // n
    if rows is not None and rows != r * n:
        raise UserError(f"{name}: shape ({rows}, {n}) is not (R*N, N)")
    nnz = val.numel()
    if col.numel() != nnz:
        raise UserError(f"{name}: {col.numel()} column indices but {nnz} values")
    if int(crow[0]) != 0 or int(crow[-1]) != nnz:
        raise UserError(f"{name}: crow must start at 0 and end at nnz = {nnz}, got {int(crow[0])}..{int(crow[-1])}")
    if crow.numel() > 1 and bool((crow[1:] < crow[:-1]).any()):
        raise UserError(f"{name}: crow must be non-decreasing")
    if nnz:
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= n:
            raise UserError(f"{name}: column indices must lie in [0, {n}), got {lo}..{hi}")
        vlo, vhi = torch.aminmax(val)
        if not (float(vlo) >= 0.0 and float(vhi) <= 1.0):  # also catches NaN
            raise UserError(f"{name}: values must lie in [0, 1], got min {float(vlo)}, max {float(vhi)}")
    crow, col, val = crow.contiguous(), col.contiguous(), val.contiguous()
    tcrow, trow, tval = _stacked_transpose(crow, col, val, n, r)
    return StackedMatrices(n, r, crow, col, val, tcrow, trow, tval)


def _stacked_transpose(crow, col, val, n: int, r: int):
    """Row ``r*N + j`` of the result is column j of M_r: a stable sort of the entries by (r, j) keeps
    the rows i ascending inside each (the stack lists them in (r, i) order)."""
    dev = val.device
    nnz = val.numel()
    stack_row = torch.repeat_interleave(torch.arange(r * n, device=dev), (crow[1:] - crow[:-1]).long(),
                                        output_size=nnz)
    key = torch.div(stack_row, n, rounding_mode="floor") * n + col.long()  # r*N + j
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=r * n)
    tcrow = torch.zeros(r * n + 1, dtype=crow.dtype, device=dev)
    tcrow[1:] = torch.cumsum(counts, 0).to(crow.dtype)
    trow = torch.remainder(stack_row[order], n).to(col.dtype)
    return tcrow, trow.contiguous(), val[order].contiguous()


def _check_rel(rel, b: int, r: int, device: torch.device) -> torch.Tensor:
    if not isinstance(rel, torch.Tensor):
        if isinstance(rel, Sequence) and not isinstance(rel, (str, bytes)):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in rel):
                raise UserError("rel: expected a sequence of integer relation ids")
            rel = torch.tensor(list(rel), dtype=torch.int64, device=device)
        else:
            raise UserError(f"rel: expected a 1-D int32/int64 tensor or a list of ints, got {type(rel).__name__}")
    if rel.dtype not in _INDEX_DTYPES:
        raise UserError(f"rel: expected dtype int32 or int64, got {rel.dtype}")
    if rel.dim() != 1 or rel.numel() != b:
        raise UserError(f"rel: expected shape ({b},) (one relation id per row of X), got {tuple(rel.shape)}")
    if rel.device != device:
        raise UserError(f"rel: is on {rel.device} but X is on {device}; move one of them")
    if b:
        lo, hi = (int(v) for v in torch.aminmax(rel))  # one pass, one sync
        if lo < 0 or hi >= r:
            bad = int(((rel < 0) | (rel >= r)).nonzero()[0, 0])
            raise UserError(f"rel: rel[{bad}] = {int(rel[bad])} is out of range [0, {r}) (R = {r} relations)")
    return rel.contiguous()


def _check_call(X, rel, M, validate: bool, strategy: str):
    if strategy not in _STRATEGIES:
        raise UserError(f"strategy: expected one of {tuple(_STRATEGIES)}, got {strategy!r}")
    if not isinstance(M, StackedMatrices):
        M = prepare_stacked(M, name="M")
    check_fuzzy(X, "X", check_values=validate)
    if X.shape[1] != M.n:
        raise UserError(f"X: expected shape (B, N) with N = {M.n} (the stack's entities), got {tuple(X.shape)}")
    if X.device != M.device:
        raise UserError(f"X: is on {X.device} but the matrices M are on {M.device}; move one of them")
    rel = _check_rel(rel, X.shape[0], M.num_relations, X.device)
    return X.contiguous(), rel, M


def project_multi(
    X: torch.Tensor,
    rel,
    M,
    *,
    negated: bool = False,
    neg_scale: float = 3.0,
    return_argmax: bool = False,
    strategy: str = "auto",
    backend: str | None = None,
    validate: bool = True,
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Project row ``b`` of a fuzzy batch through relation ``rel[b]``, all rows in one call.

    ``Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]``; with ``negated=True`` the factor is
    ``1 - min(1, neg_scale * M_{rel[b]}[i, j])`` (1 where M has no entry), QTO's negated edge.
    Equal, bit for bit, to ``ops.project`` / ``ops.project_negated`` of each row through
    ``M.relation(rel[b])``.

    Args:
        X: (B, N) float32 in [0, 1]; any strides.
        rel: (B,) int32/int64 tensor (or a list of ints) of relation ids in [0, R), on X's device.
        M: a :class:`StackedMatrices` from :func:`prepare_stacked` (pass one when projecting
            repeatedly: anything else is validated and transposed on every call), or what
            :func:`prepare_stacked` accepts.
        negated: QTO's negated projection.
        neg_scale: ``s`` of the negated factor (finite, >= 0).
        return_argmax: also return ``argmax`` (B, N) int32: the ``i`` reaching the max (smallest
            ``i`` on ties), ``-1`` where ``Y`` is 0.
        strategy: ``"auto"`` (per row, by its push cost against its share of the pull cost of its
            relation group and the cost of sweeping the relation's entries), ``"push"`` or ``"pull"``.
            Results are identical; only speed differs.
        backend: ``"cpp"``, ``"reference"`` or None (module default, see :func:`ops.set_backend`).
        validate: check X's values lie in [0, 1] (one pass); shapes, dtypes, devices and the range
            of ``rel`` are always checked.
        out: preallocated outputs to write into, as for :func:`ops.project`: ``Y`` (B, N) float32,
            or with ``return_argmax`` a pair ``(Y, argmax)``; contiguous, on X's device, not sharing
            memory with X.  They are returned; every entry is overwritten.

    Returns:
        ``Y`` (B, N) float32, or ``(Y, argmax)`` (the ``out`` tensors when given).
    """
    x, rel, M = _check_call(X, rel, M, validate, strategy)
    try:
        neg_scale = float(neg_scale)
    except (TypeError, ValueError):
        raise UserError(f"neg_scale: expected a number, got {neg_scale!r}") from None
    if not (neg_scale >= 0.0 and math.isfinite(neg_scale)):
        raise UserError(f"neg_scale: expected a finite number >= 0, got {neg_scale}")
    outs = check_out(out, X, return_argmax) if out is not None else None
    if resolve_backend(backend, "project_multi", x.device) == "reference":
        res = reference_project_multi(x, rel, M, negated=bool(negated), neg_scale=neg_scale,
                                      return_argmax=return_argmax)
        return res if outs is None else write_out(res, *outs)
    if outs is not None:
        y, a = outs
        if not has_kernel("project_multi_out", x.device):  # e.g. a CUDA build without the out kernel
            res = torch.ops.kgreason.project_multi(x, rel, M.crow, M.col, M.val, M.tcrow, M.trow, M.tval, M.n,
                                                   _STRATEGIES[strategy], bool(negated), neg_scale, return_argmax)
            return write_out(res if return_argmax else res[0], y, a)
        torch.ops.kgreason.project_multi_out(x, rel, M.crow, M.col, M.val, M.tcrow, M.trow, M.tval, M.n,
                                             _STRATEGIES[strategy], bool(negated), neg_scale, y,
                                             a if a is not None else x.new_empty((0,), dtype=torch.int32))
        return (y, a) if return_argmax else y
    y, a = torch.ops.kgreason.project_multi(x, rel, M.crow, M.col, M.val, M.tcrow, M.trow, M.tval, M.n,
                                            _STRATEGIES[strategy], bool(negated), neg_scale, return_argmax)
    return (y, a) if return_argmax else y


def project_multi_strategies(X: torch.Tensor, rel, M) -> torch.Tensor:
    """The plan ``strategy="auto"`` picks for each row on the compiled CPU kernel: (B,) int32,
    1 = push, 2 = pull (the ``ops.STRATEGIES`` codes), 3 = sweep (push through the relation's
    own entries).  For diagnostics and benchmarks."""
    x, rel, M = _check_call(X, rel, M, False, "auto")
    if not has_kernel("project_multi_strategy", x.device):
        raise UserError(f"project_multi_strategies: needs the compiled kernel for {x.device}")
    return torch.ops.kgreason.project_multi_strategy(x, rel, M.crow, M.n)


# ---------------------------------------------------------------------------------------- reference
def _row_chunks(counts: list[int], budget: int = _CHUNK_ELEMS):
    """Consecutive row ranges whose gathered entries stay around ``budget`` (at least one row each)."""
    lo, acc = 0, 0
    for b, c in enumerate(counts):
        if b > lo and acc + c > budget:
            yield lo, b
            lo, acc = b, 0
        acc += c
    if lo < len(counts):
        yield lo, len(counts)


def reference_project_multi(x: torch.Tensor, rel: torch.Tensor, M: StackedMatrices, *, negated: bool = False,
                            neg_scale: float = 3.0, return_argmax: bool = False):
    """Pure-torch :func:`project_multi` (any device; inputs assumed valid).

    For a chunk of rows, gathers every entry of each row's relation from the stacked
    transpose (column-major: the entries of output cell (b, j) are contiguous, rows i
    ascending), forms the float32 products and scatter-maxes them into the cells; argmax
    is the smallest i whose product equals the max.  Negated: the in-support products use
    the factor of :func:`ops.reference.negation_factor`; the out-of-support maximum of
    cell (b, j) is X[b]'s value at the first rank (X[b] sorted by value desc, index asc)
    not taken by an entry of column j's support, found with one sort of the chunk's
    (cell, rank) keys, as :func:`ops.reference.project_negated` does per matrix.
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
    f_all = reference.negation_factor(M.tval, neg_scale) if negated else M.tval
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


# ------------------------------------------------------------------------------------ fake tensors
def _register_fakes() -> None:
    """Shapes for FakeTensor / torch.compile tracing (outputs depend only on X's shape and want_argmax)."""
    if not extension_available() or getattr(_register_fakes, "done", False):
        return

    @torch.library.register_fake("kgreason::project_multi")
    def _project_multi_fake(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale,
                            want_argmax):
        a_shape = x.shape if want_argmax else (0,)
        return x.new_empty(x.shape), x.new_empty(a_shape, dtype=torch.int32)

    @torch.library.register_fake("kgreason::project_multi_out")
    def _project_multi_out_fake(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated,
                                neg_scale, y, argmax):
        torch._check(y.shape == x.shape, lambda: "kgreason::project_multi_out: y must have X's shape")
        return None

    @torch.library.register_fake("kgreason::project_multi_strategy")
    def _project_multi_strategy_fake(x, rel, crow, num_entities):
        return x.new_empty((x.shape[0],), dtype=torch.int32)

    _register_fakes.done = True


_register_fakes()
