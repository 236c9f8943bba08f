"""Sparse fuzzy sets: a batch of B fuzzy vectors over N entities kept as (indices, values) rows.

Sets one hop from an anchor can be small: a calibrated FB15k-237 row holds a
mean of 32 entries (median 15) out of 14,505, and a raw KG's rows fewer.  The
anchors of real queries are popular entities, though: on the FB15k-237 artifact
(threshold 0.00097) a grounded 1p answer set holds a median of 861 entries
(mean 4,266, tenth percentile 46), and after two hops a median of 7,935.  As a
dense (B, N) tensor a batch costs B*N writes and reads per operator; as
:class:`SparseRows` it costs what its non-zeros cost, which pays only while
they are few: the executor decides per node (``Executor(sparse=True)``).  The operators here compute, on the support, exactly
the float32 values of the dense operators (``ops.project``,
``ops.intersect``, ``ops.union``), so densifying a sparse result gives the dense
result bit for bit:

* ``ops.project`` with a sparse ``X`` (kernel ``kgreason::project_multi_sparse``):
  ``Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]`` (push: the rows of M of each row's active
  entities), sparse out;
* :func:`sparse_align`: the support intersection or union of k sparse batches with
  each input's value on it (0 where absent), from which :func:`intersect_sparse`
  and :func:`union_sparse` fold the t-norm / t-conorm in argument order, as the
  dense kernels do (a dense argument of an intersection is gathered on the support).

A negation, a negated projection or a union with a dense argument has full
support: those stay dense (:meth:`SparseRows.to_dense`).

Backends: ``cpp`` (CPU kernels ``kgreason::project_multi_sparse`` and
``kgreason::sparse_align``) and ``reference`` (pure torch, any device; the CUDA
path, as no CUDA kernel is built for these two ops).

>>> import torch, ops
>>> from ops.sparse_rows import SparseRows
>>> M0 = torch.tensor([[0.0, 0.9], [0.5, 0.0]])
>>> M1 = torch.tensor([[0.2, 0.0], [0.0, 1.0]])
>>> S = ops.prepare_matrices(torch.cat([M0, M1]).to_sparse_csr())
>>> y = ops.project(SparseRows.one_hot(torch.tensor([0, 1]), 2), S, torch.tensor([0, 1]))
>>> y.to_dense()
tensor([[0.0000, 0.9000],
        [0.0000, 1.0000]])
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from kgreason.errors import UserError

from ._backend import resolve_backend
from .fuzzy import check_tnorm
from .prepared import StackedMatrices, as_stack
from .prepared import check_rel as _check_rel

__all__ = ["SparseRows", "push_sizes", "sparse_align", "intersect_sparse", "union_sparse",
           "reference_project_multi_sparse", "reference_sparse_align"]


@dataclass(frozen=True, eq=False)
class SparseRows:
    """A (B, N) fuzzy batch in compressed-row form.

    Attributes:
        crow: int64 (B+1,), row pointers (``crow[0] == 0``, non-decreasing, ``crow[B] == nnz``).
        col: int64 (nnz,), entity ids, strictly ascending inside each row.
        val: float32 (nnz,), the values in [0, 1] (entries may be 0: a stored zero
            means the same as an absent entry).
        n: N, the number of entities.
    """

    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    n: int

    @property
    def batch_size(self) -> int:
        return int(self.crow.numel()) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return (self.batch_size, self.n)

    @property
    def nnz(self) -> int:
        return int(self.val.numel())

    @property
    def device(self) -> torch.device:
        return self.val.device

    def row_ids(self) -> torch.Tensor:
        """(nnz,) int64: the row of every stored entry."""
        counts = self.crow[1:] - self.crow[:-1]
        return torch.repeat_interleave(torch.arange(self.batch_size, device=self.device), counts,
                                       output_size=self.nnz)

    def to_dense(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The (B, N) float32 tensor (``out``, zero-filled first, when given: contiguous (B, N) float32)."""
        b, n = self.shape
        if out is None:
            y = torch.zeros(b, n, dtype=torch.float32, device=self.device)
        else:
            if out.shape != (b, n) or out.dtype != torch.float32 or not out.is_contiguous():
                raise UserError(f"out: expected a contiguous ({b}, {n}) float32 tensor, got {out.dtype} "
                                f"{tuple(out.shape)}")
            y = out.zero_()
        if self.nnz:
            y.view(-1).index_copy_(0, self.row_ids() * n + self.col, self.val)
        return y

    @staticmethod
    def from_dense(x: torch.Tensor) -> "SparseRows":
        """The non-zeros of a (B, N) float32 tensor."""
        if x.dim() != 2 or x.dtype != torch.float32:
            raise UserError(f"X: expected a (B, N) float32 tensor, got {x.dtype} {tuple(x.shape)}")
        b, n = x.shape
        rows, cols = (x > 0).nonzero(as_tuple=True)
        crow = torch.zeros(b + 1, dtype=torch.int64, device=x.device)
        crow[1:] = torch.cumsum(torch.bincount(rows, minlength=b), 0)
        return SparseRows(crow, cols, x[rows, cols].contiguous(), int(n))

    @staticmethod
    def one_hot(entities: torch.Tensor, n: int) -> "SparseRows":
        """Row b is the one-hot set of ``entities[b]`` ((B,) int64 ids in [0, N))."""
        b = int(entities.numel())
        dev = entities.device
        return SparseRows(torch.arange(b + 1, dtype=torch.int64, device=dev), entities.to(torch.int64).reshape(-1),
                          torch.ones(b, dtype=torch.float32, device=dev), int(n))

    def check(self, name: str = "X") -> None:
        """Validate the layout (dtypes, shapes, devices, pointers, index range); raises ``UserError``."""
        crow, col, val = self.crow, self.col, self.val
        if not all(isinstance(t, torch.Tensor) for t in (crow, col, val)):
            raise UserError(f"{name}: crow, col and val must be tensors")
        if crow.dtype != torch.int64 or col.dtype != torch.int64 or val.dtype != torch.float32:
            raise UserError(f"{name}: expected int64 crow/col and float32 val, got {crow.dtype}/{col.dtype}/"
                            f"{val.dtype}")
        if crow.dim() != 1 or col.dim() != 1 or val.dim() != 1 or crow.numel() < 1:
            raise UserError(f"{name}: crow, col, val must be 1-D (crow non-empty)")
        if not (crow.device == col.device == val.device):
            raise UserError(f"{name}: crow, col and val are on different devices")
        if col.numel() != val.numel():
            raise UserError(f"{name}: {col.numel()} indices but {val.numel()} values")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise UserError(f"{name}: n must be an integer >= 1, got {self.n!r}")
        if int(crow[0]) != 0 or int(crow[-1]) != val.numel() or bool((crow[1:] < crow[:-1]).any()):
            raise UserError(f"{name}: crow must start at 0, be non-decreasing and end at nnz = {val.numel()}")
        if val.numel():
            if int(col.min()) < 0 or int(col.max()) >= self.n:
                raise UserError(f"{name}: entity ids must lie in [0, {self.n})")
            same_row = self.row_ids()[1:] == self.row_ids()[:-1]
            if bool((same_row & (col[1:] <= col[:-1])).any()):
                raise UserError(f"{name}: entity ids must be strictly ascending inside each row")
            lo, hi = torch.aminmax(val)
            if not (float(lo) >= 0.0 and float(hi) <= 1.0):
                raise UserError(f"{name}: values must lie in [0, 1], got {float(lo)}..{float(hi)}")


def _check_sparse(x: object, name: str, validate: bool) -> SparseRows:
    if not isinstance(x, SparseRows):
        raise UserError(f"{name}: expected ops.sparse_rows.SparseRows, got {type(x).__name__}")
    if validate:
        x.check(name)
    return x


# ------------------------------------------------------------------------------- projection
def push_sizes(x: SparseRows, rel: torch.Tensor, M: StackedMatrices) -> torch.Tensor:
    """(B,) int64: per row, the number of M entries a push reads (an upper bound on the output's nnz)."""
    n = x.n
    if x.nnz == 0:
        return torch.zeros(x.batch_size, dtype=torch.int64, device=x.device)
    rows = rel.to(torch.int64)[x.row_ids()] * n + x.col
    lens = (M.crow[rows + 1] - M.crow[rows]).to(torch.int64) * (x.val > 0)
    return torch.zeros(x.batch_size, dtype=torch.int64, device=x.device).index_add_(0, x.row_ids(), lens)


def reference_project_multi_sparse(x: SparseRows, rel: torch.Tensor, M: StackedMatrices) -> SparseRows:
    """Pure-torch ``ops.project`` of a :class:`SparseRows` batch (one pass of gathers; memory O(entries pushed))."""
    n, b, dev = x.n, x.batch_size, x.device
    keep = x.val > 0
    src_row = x.row_ids()[keep]
    stack_row = rel.to(torch.int64)[src_row] * n + x.col[keep]
    xv = x.val[keep]
    starts = M.crow[stack_row].to(torch.int64)
    lens = M.crow[stack_row + 1].to(torch.int64) - starts
    total = int(lens.sum()) if lens.numel() else 0
    crow = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    if total == 0:
        return SparseRows(crow, torch.zeros(0, dtype=torch.int64, device=dev),
                          torch.zeros(0, dtype=torch.float32, device=dev), n)
    which = torch.repeat_interleave(torch.arange(len(lens), device=dev), lens, output_size=total)
    offs = torch.arange(total, device=dev) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens,
                                                                     output_size=total)
    pos = starts[which] + offs
    prod = xv[which] * M.val[pos]  # the float32 product the dense kernels form
    key = src_row[which] * n + M.col[pos].to(torch.int64)
    uniq, inv = torch.unique(key, sorted=True, return_inverse=True)
    val = torch.zeros(len(uniq), dtype=torch.float32, device=dev).scatter_reduce_(0, inv, prod, "amax",
                                                                                 include_self=False)
    out_row = torch.div(uniq, n, rounding_mode="floor")
    crow[1:] = torch.cumsum(torch.bincount(out_row, minlength=b), 0)
    return SparseRows(crow, uniq - out_row * n, val, n)


def _project_sparse(x: SparseRows, M: StackedMatrices, rel=None, *, backend: str | None = None,
                    validate: bool = True) -> SparseRows:
    """Project sparse row ``b`` through relation ``rel[b]``: ``Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]``
    (``ops.project``'s path for a :class:`SparseRows` X; rel None: every row through relation 0).

    The result's row ``b`` holds every ``j`` in a row of ``M_{rel[b]}`` of an active
    entity (``X[b, i] > 0``), ascending; its values equal ``ops.project`` on the
    dense batch bit for bit (entries that ``ops.project`` leaves 0 are absent or stored
    as 0).  Its size is bounded by :func:`push_sizes`: callers choose this or the dense
    path by it.

    Args:
        x: a :class:`SparseRows` batch (B, N).
        rel: (B,) int32/int64 relation ids in [0, R) (or a list of ints), on x's device.
        M: :class:`ops.StackedMatrices` with ``M.n == x.n``, on x's device.
        backend: ``"cpp"``, ``"reference"`` or None (automatic).
        validate: check x's layout (one pass over it); rel and M are always checked.
    """
    x = _check_sparse(x, "X", validate)
    M = as_stack(M)
    if M.n != x.n:
        raise UserError(f"M: has N = {M.n} entities, X has {x.n}")
    if M.device != x.device:
        raise UserError(f"M: on {M.device}, X on {x.device}")
    if rel is None:
        rel = torch.zeros(x.batch_size, dtype=torch.int64, device=x.device)
    rel = _check_rel(rel, x.batch_size, M.num_relations, x.device).to(torch.int64)
    if resolve_backend(backend, "project_multi_sparse", x.device) == "reference":
        return reference_project_multi_sparse(x, rel, M)
    crow, col, val = torch.ops.kgreason.project_multi_sparse(x.crow, x.col, x.val, rel, M.crow, M.col, M.val, M.n)
    return SparseRows(crow, col, val, x.n)


# ---------------------------------------------------------------------------- alignment
def reference_sparse_align(xs: Sequence[SparseRows], intersect: bool):
    """Pure-torch :func:`sparse_align`."""
    n, b, dev, k = xs[0].n, xs[0].batch_size, xs[0].device, len(xs)
    keys = [x.row_ids() * n + x.col for x in xs]
    allk = torch.cat(keys)
    uniq, counts = torch.unique(allk, sorted=True, return_counts=True)
    if intersect:
        uniq = uniq[counts == k]
    vals = torch.zeros(k, len(uniq), dtype=torch.float32, device=dev)
    for m, (key, x) in enumerate(zip(keys, xs)):
        if len(uniq) == 0 or len(key) == 0:
            continue
        pos = torch.searchsorted(uniq, key).clamp_(max=len(uniq) - 1)
        hit = uniq[pos] == key
        vals[m, pos[hit]] = x.val[hit]
    out_row = torch.div(uniq, n, rounding_mode="floor")
    crow = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    crow[1:] = torch.cumsum(torch.bincount(out_row, minlength=b), 0)
    return crow, uniq - out_row * n, vals


def sparse_align(xs: Sequence[SparseRows], *, intersect: bool, backend: str | None = None, validate: bool = True):
    """The support of k sparse batches and each one's values on it.

    Returns ``(crow (B+1,) int64, col (nnz,) int64, vals (k, nnz) float32)``: row ``b``'s
    columns are those present in every input's row ``b`` (``intersect=True``) or in any
    (``intersect=False``), ascending; ``vals[m, e]`` is input m's stored value at that
    entry, 0 where it has none.
    """
    if not xs:
        raise UserError("sparse_align: needs at least one sparse batch")
    xs = [_check_sparse(x, f"argument {m}", validate) for m, x in enumerate(xs)]
    for m, x in enumerate(xs):
        if x.shape != xs[0].shape or x.device != xs[0].device:
            raise UserError(f"argument {m}: {x.shape} on {x.device} differs from argument 0's {xs[0].shape} on "
                            f"{xs[0].device}")
    if resolve_backend(backend, "sparse_align", xs[0].device) == "reference":
        return reference_sparse_align(xs, intersect)
    return torch.ops.kgreason.sparse_align([x.crow for x in xs], [x.col for x in xs], [x.val for x in xs],
                                           bool(intersect))


def intersect_sparse(xs: Sequence[SparseRows | torch.Tensor], *, tnorm: str = "product", backend: str | None = None,
                     validate: bool = True) -> SparseRows:
    """The t-norm of k fuzzy batches, at least one sparse; dense (B, N) arguments are gathered on the support.

    Equal, once densified, to ``ops.intersect`` of the dense arguments bit for bit: the
    support is the intersection of the sparse arguments' (a t-norm is 0 where any
    argument is), and the values fold in argument order as the dense kernel does.
    """
    check_tnorm(tnorm)
    sparse = [x for x in xs if isinstance(x, SparseRows)]
    if not sparse:
        raise UserError("intersect_sparse: needs at least one SparseRows argument")
    crow, col, vals = sparse_align(sparse, intersect=True, backend=backend, validate=validate)
    n = sparse[0].n
    out = SparseRows(crow, col, vals[0], n)
    rows = out.row_ids() if len(sparse) < len(xs) else None
    parts, k = [], 0
    for m, x in enumerate(xs):
        if isinstance(x, SparseRows):
            parts.append(vals[k])
            k += 1
        else:
            if not isinstance(x, torch.Tensor) or x.shape != sparse[0].shape or x.dtype != torch.float32:
                raise UserError(f"intersect_sparse argument {m}: expected SparseRows or a float32 "
                                f"{sparse[0].shape} tensor")
            parts.append(x[rows, col])
    op = torch.mul if tnorm == "product" else torch.minimum
    return SparseRows(crow, col, functools.reduce(op, parts) if len(parts) > 1 else parts[0].clone(), n)


def union_sparse(xs: Sequence[SparseRows], *, tnorm: str = "product", backend: str | None = None,
                 validate: bool = True) -> SparseRows:
    """The t-conorm of k sparse batches (support: the union), equal to ``ops.union`` once densified.

    The probabilistic sum folds ``1 - prod(1 - x)`` in argument order; an argument's
    absent entry contributes the factor ``1 - 0 = 1`` exactly, as in the dense kernel.
    """
    check_tnorm(tnorm)
    crow, col, vals = sparse_align(xs, intersect=False, backend=backend, validate=validate)
    n = xs[0].n
    if len(xs) == 1:
        return SparseRows(crow, col, vals[0].clone(), n)
    if tnorm == "godel":
        return SparseRows(crow, col, functools.reduce(torch.maximum, list(vals)), n)
    comp = functools.reduce(torch.mul, [1.0 - v for v in vals])
    return SparseRows(crow, col, 1.0 - comp, n)
