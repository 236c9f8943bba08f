"""The matrix container of the projection, :class:`StackedMatrices`, and input validation.

R relation matrices M_r (N x N each) are kept stacked as one (R*N, N) CSR (row
``r*N + i`` holds ``M_r[i, :]``, the layout of :attr:`kge.artifact.Artifact.matrices`)
plus its stacked transpose (row ``r*N + j`` holds ``M_r[:, j]``): the kernels need
both the rows (push walks the rows of the active entities) and the columns (pull and
the negated projection walk each output column's support).  A single relation is the
one-relation stack.  :func:`prepare_matrices` validates a matrix or a stack once and
builds the transpose; the engine prepares once and reuses it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kgreason.errors import UserError

from ._backend import has_kernel

__all__ = ["StackedMatrices", "prepare_matrices", "as_stack", "check_fuzzy", "check_rel", "check_out", "write_out"]

_INDEX_DTYPES = (torch.int32, torch.int64)


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

    # The one-relation view: CSC = the transpose of the only relation.
    @property
    def ccol(self) -> torch.Tensor:
        """The transpose's row pointers (one relation: the CSC column pointers of M)."""
        return self.tcrow

    @property
    def row(self) -> torch.Tensor:
        """The transpose's column indices (one relation: the CSC row indices of M)."""
        return self.trow

    @property
    def index_dtype(self) -> torch.dtype:
        return self.crow.dtype

    def row_indices(self) -> torch.Tensor:
        """Row index ``i`` (within its relation) of every CSR entry (int64, (nnz,))."""
        rows = torch.arange(self.num_relations * self.n, device=self.device) % self.n
        return torch.repeat_interleave(rows, (self.crow[1:] - self.crow[:-1]).long(), output_size=self.nnz)

    def col_indices_csc(self) -> torch.Tensor:
        """Column index ``j`` (within its relation) of every transposed entry (int64, (nnz,))."""
        cols = torch.arange(self.num_relations * self.n, device=self.device) % self.n
        return torch.repeat_interleave(cols, (self.tcrow[1:] - self.tcrow[:-1]).long(), output_size=self.nnz)

    def to_sparse_csr(self) -> torch.Tensor:
        """The stack as a torch sparse CSR tensor, (R*N, N) (one relation: M itself)."""
        # validated when prepared: skip torch's O(nnz) invariant check (and its warning)
        return torch.sparse_csr_tensor(self.crow, self.col, self.val, size=(self.num_relations * self.n, self.n),
                                       check_invariants=False)

    def relation(self, r: int) -> "StackedMatrices":
        """``M_r`` as a one-relation stack (values and indices are views of the stack;
        pointers rebased to 0 and cast to the column dtype)."""
        if not 0 <= int(r) < self.num_relations:
            raise UserError(f"relation: id {r} is out of range [0, {self.num_relations})")
        n, r = self.n, int(r)
        lo, hi = int(self.crow[r * n]), int(self.crow[(r + 1) * n])
        tlo, thi = int(self.tcrow[r * n]), int(self.tcrow[(r + 1) * n])
        idx = self.col.dtype
        return StackedMatrices(
            n, 1,
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


def _prepare_stack(matrices, *, num_entities: int | None = None, device: torch.device | str | None = None,
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
    """Row ``r*N + j`` of the result is column j of M_r, its rows i ascending (the pull kernels'
    smallest-index tie rule relies on that order).

    Where the ``csr_transpose`` kernel exists (CPU), one call transposes every relation by its counting
    sort, relations in parallel, straight into the outputs (no per-relation copies; the transient memory
    is one N-entry counter per thread).  The argsort of all (r, j) keys below needs several int64 copies
    of the whole stack (peak RSS 7.6 GiB for a 137M-entry FB15k-237 stack, where the outputs are 1.1 GB);
    it stays for devices without the kernel.  Both give the same bits (a stable sort by (r, j) keeps each
    column's rows in the stack's (r, i) order, as the counting sort does).
    """
    dev = val.device
    nnz = val.numel()
    if r * n and has_kernel("csr_transpose", dev):
        return torch.ops.kgreason.csr_transpose(crow, col, val, n)
    stack_row = torch.repeat_interleave(torch.arange(r * n, device=dev), (crow[1:] - crow[:-1]).long(),
                                        output_size=nnz)
    key = torch.div(stack_row, n, rounding_mode="floor") * n + col.long()  # r*N + j
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=r * n)
    tcrow = torch.zeros(r * n + 1, dtype=crow.dtype, device=dev)
    tcrow[1:] = torch.cumsum(counts, 0).to(crow.dtype)
    trow = torch.remainder(stack_row[order], n).to(col.dtype)
    return tcrow, trow.contiguous(), val[order].contiguous()


def check_rel(rel, b: int, r: int, device: torch.device, *, check_range: bool = True) -> torch.Tensor:
    """Validate ``rel`` (one relation id in [0, r) per row of a batch of b rows); contiguous tensor.

    ``check_range=False`` skips the pass over the ids for a caller whose kernel checks them
    itself (and calls this again, with the check, to word the error when the kernel refuses).
    """
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
    if b and check_range:
        lo, hi = (int(v) for v in torch.aminmax(rel))  # one pass, one sync
        if lo < 0 or hi >= r:
            bad = int(((rel < 0) | (rel >= r)).nonzero()[0, 0])
            raise UserError(f"rel: rel[{bad}] = {int(rel[bad])} is out of range [0, {r}) (R = {r} relations)")
    return rel.contiguous()


def check_fuzzy(x: object, name: str = "X", *, ndim: int = 2, check_values: bool = True) -> torch.Tensor:
    """Validate a fuzzy batch: a float32 tensor of ``ndim`` dims with values in [0, 1]."""
    if not isinstance(x, torch.Tensor):
        raise UserError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise UserError(f"{name}: expected a dense (strided) tensor, got layout {x.layout}")
    if x.dtype != torch.float32:
        raise UserError(f"{name}: expected dtype torch.float32, got {x.dtype}")
    if x.dim() != ndim:
        hint = " (use X.unsqueeze(0) for a single query)" if ndim == 2 and x.dim() == 1 else ""
        raise UserError(f"{name}: expected a {ndim}-D tensor (B, N), got shape {tuple(x.shape)}{hint}")
    if check_values and x.numel():
        lo, hi = torch.aminmax(x)
        lo, hi = float(lo), float(hi)
        if not (lo >= 0.0 and hi <= 1.0):  # also catches NaN
            raise UserError(f"{name}: values must lie in [0, 1], got min {lo}, max {hi}")
    return x


def _check_csr(m: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not isinstance(m, torch.Tensor):
        raise UserError(f"{name}: expected a torch sparse CSR tensor or StackedMatrices, got {type(m).__name__}")
    if m.layout != torch.sparse_csr:
        raise UserError(f"{name}: expected layout torch.sparse_csr, got {m.layout} (use M.to_sparse_csr())")
    if m.dim() != 2 or m.shape[0] != m.shape[1]:
        raise UserError(f"{name}: expected a square N x N matrix, got shape {tuple(m.shape)}")
    if m.dtype != torch.float32:
        raise UserError(f"{name}: expected dtype torch.float32, got {m.dtype}")
    crow, col, val = m.crow_indices(), m.col_indices(), m.values()
    n = m.shape[0]
    if crow.dtype not in _INDEX_DTYPES or col.dtype != crow.dtype:
        raise UserError(f"{name}: expected int32 or int64 crow/col indices of one dtype, got {crow.dtype}/{col.dtype}")
    nnz = val.numel()
    if crow.numel() != n + 1:
        raise UserError(f"{name}: crow_indices has {crow.numel()} entries, expected N+1 = {n + 1}")
    if int(crow[0]) != 0 or int(crow[-1]) != nnz:
        raise UserError(f"{name}: crow_indices must start at 0 and end at nnz={nnz}, got {int(crow[0])}..{int(crow[-1])}")
    if n and bool((crow[1:] < crow[:-1]).any()):
        raise UserError(f"{name}: crow_indices must be non-decreasing")
    if nnz:
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= n:
            raise UserError(f"{name}: column indices must lie in [0, {n}), got {lo}..{hi}")
        vlo, vhi = torch.aminmax(val)
        vlo, vhi = float(vlo), float(vhi)
        if not (vlo >= 0.0 and vhi <= 1.0):
            raise UserError(f"{name}: values must lie in [0, 1], got min {vlo}, max {vhi}")
    return crow.contiguous(), col.contiguous(), val.contiguous()


def _transpose_reference(n: int, crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor):
    """CSR -> CSC with torch ops (a stable sort by column keeps rows ascending inside each column)."""
    nnz = val.numel()
    perm = torch.argsort(col, stable=True)
    rows = torch.repeat_interleave(
        torch.arange(n, device=col.device, dtype=crow.dtype), (crow[1:] - crow[:-1]).long(), output_size=nnz
    )
    counts = torch.bincount(col.long(), minlength=n)
    ccol = torch.zeros(n + 1, dtype=crow.dtype, device=col.device)
    ccol[1:] = torch.cumsum(counts, 0).to(crow.dtype)
    return ccol, rows[perm].contiguous(), val[perm].contiguous()


def _single(m: torch.Tensor, name: str) -> StackedMatrices:
    """A square N x N CSR as a one-relation stack (validated; transpose by the csr_transpose kernel)."""
    crow, col, val = _check_csr(m, name)
    n = int(m.shape[0])
    if has_kernel("csr_transpose", val.device):
        ccol, row, tval = torch.ops.kgreason.csr_transpose(crow, col, val, n)
    else:
        ccol, row, tval = _transpose_reference(n, crow, col, val)
    return StackedMatrices(n, 1, crow, col, val, ccol, row, tval)


def prepare_matrices(matrices, *, num_entities: int | None = None, device: torch.device | str | None = None,
                     name: str = "M") -> StackedMatrices:
    """Validate relation matrices once and build their transpose: the argument ``ops.project`` wants.

    Args:
        matrices: one relation, an (N, N) torch sparse CSR (int32 or int64 indices; the
            one-relation stack); a stack of R relations, a torch or scipy CSR of shape
            (R*N, N) (an artifact's ``matrices``: its numpy arrays are shared, not copied,
            on CPU) or a ``(crow, col, val)`` triple of 1-D tensors / arrays with
            ``num_entities`` given; or a :class:`StackedMatrices` (returned as it is, moved
            to ``device`` when given).  Values float32 in [0, 1].
        num_entities: N (required for a triple; checked against the matrix otherwise).
        device: move the stack there (default: where it is).
        name: what error messages call the argument.

    Raises :class:`kgreason.errors.UserError` (a ``ValueError``) naming the problem.
    """
    if isinstance(matrices, StackedMatrices):
        return matrices if device is None else matrices.to(device)
    if isinstance(matrices, torch.Tensor) and matrices.dim() == 2 and matrices.shape[0] == matrices.shape[1] \
            and num_entities in (None, int(matrices.shape[1])):
        s = _single(matrices, name)  # one relation: a square CSR's own checks and error messages
        return s if device is None else s.to(device)
    if isinstance(matrices, torch.Tensor) and matrices.dim() == 2 and matrices.shape[1] \
            and matrices.shape[0] % matrices.shape[1] != 0 and matrices.layout == torch.sparse_csr:
        raise UserError(f"{name}: expected a square N x N matrix, got shape {tuple(matrices.shape)} "
                        "(or a stack of R relations, shape (R*N, N))")
    if not isinstance(matrices, torch.Tensor) and not (isinstance(matrices, (tuple, list)) or hasattr(matrices, "indptr")):
        raise UserError(f"{name}: expected a sparse CSR (N, N) matrix or (R*N, N) stack, a StackedMatrices or a "
                        f"(crow, col, val) triple, got {type(matrices).__name__}")
    return _prepare_stack(matrices, num_entities=num_entities, device=device, name=name)


def as_stack(m, name: str = "M") -> StackedMatrices:
    """``m`` as :class:`StackedMatrices` (prepared here unless it already is one)."""
    return m if isinstance(m, StackedMatrices) else prepare_matrices(m, name=name)


def _check_out_tensor(t: object, name: str, shape: tuple[int, int], dtype: torch.dtype, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise UserError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise UserError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    if t.device != x.device:
        raise UserError(f"{name}: is on {t.device} but X is on {x.device}")
    if t.dtype != dtype:
        raise UserError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise UserError(f"{name}: expected shape {shape} (that of X), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise UserError(f"{name}: must be contiguous")
    if t.requires_grad:
        raise UserError(f"{name}: must not require grad")
    if t.numel() and x.numel() and t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise UserError(f"{name}: shares memory with X (the kernel reads X while writing {name})")


def check_out(out: object, x: torch.Tensor, return_argmax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate the ``out=`` argument of a projection: ``Y`` (B, N) float32, or with
    ``return_argmax`` a pair ``(Y, argmax)`` with argmax (B, N) int32; contiguous, on X's
    device, not sharing memory with X.  Returns ``(y, argmax or None)``.
    Raises :class:`ValueError` (``UserError``) naming ``out`` / ``out[0]`` / ``out[1]``."""
    shape = (int(x.shape[0]), int(x.shape[1]))
    if return_argmax:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise UserError(f"out: with return_argmax=True expected a pair (Y, argmax) of tensors, "
                            f"got {type(out).__name__}")
        y, a = out
        _check_out_tensor(y, "out[0]", shape, torch.float32, x)
        _check_out_tensor(a, "out[1]", shape, torch.int32, x)
        if a.numel() and a.untyped_storage().data_ptr() == y.untyped_storage().data_ptr():
            raise UserError("out[1]: shares memory with out[0]")
        return y, a
    if isinstance(out, (tuple, list)):
        raise UserError("out: with return_argmax=False expected one tensor Y, got a "
                        f"{type(out).__name__} (pass return_argmax=True to fill (Y, argmax))")
    _check_out_tensor(out, "out", shape, torch.float32, x)
    return out, None


def write_out(result, y: torch.Tensor, a: torch.Tensor | None):
    """Copy a computed ``Y`` or ``(Y, argmax)`` into validated outputs (backends without an out kernel)."""
    if a is None:
        y.copy_(result)
        return y
    y.copy_(result[0])
    a.copy_(result[1])
    return y, a
