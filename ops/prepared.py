"""Input validation and :class:`PreparedMatrix`, the cached form of a relation matrix.

A relation matrix ``M`` (N x N) arrives as a torch sparse CSR tensor.  The
kernels need both its rows (CSR: push projection walks the rows of the active
entities) and its columns (CSC: pull projection and negated projection walk
the support of each output column).  :func:`prepare` validates ``M`` once and
builds both; the engine prepares each relation once and reuses it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kgreason.errors import UserError

from ._backend import has_kernel

__all__ = ["PreparedMatrix", "prepare", "check_fuzzy", "as_prepared", "check_out", "write_out"]

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True, eq=False)
class PreparedMatrix:
    """A validated N x N relation matrix in CSR and CSC form (same index dtype, same device).

    Attributes:
        n: number of entities N.
        crow, col, val: CSR, shapes (N+1,), (nnz,), (nnz,); row ``i`` holds M[i, :].
        ccol, row, tval: CSC, shapes (N+1,), (nnz,), (nnz,); column ``j`` holds M[:, j]
            with row indices ascending (the kernels' smallest-index tie rule relies on it).
    """

    n: int
    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    ccol: torch.Tensor
    row: torch.Tensor
    tval: torch.Tensor

    @property
    def nnz(self) -> int:
        return int(self.val.numel())

    @property
    def device(self) -> torch.device:
        return self.val.device

    @property
    def index_dtype(self) -> torch.dtype:
        return self.crow.dtype

    def to(self, device: torch.device | str) -> "PreparedMatrix":
        """The same matrix on ``device`` (``self`` when already there)."""
        if torch.device(device) == self.device:
            return self
        return PreparedMatrix(
            self.n, *(t.to(device) for t in (self.crow, self.col, self.val, self.ccol, self.row, self.tval))
        )

    def to_sparse_csr(self) -> torch.Tensor:
        """``M`` as a torch sparse CSR tensor."""
        # validated when prepared: skip torch's O(nnz) invariant check (and its warning)
        return torch.sparse_csr_tensor(self.crow, self.col, self.val, size=(self.n, self.n), check_invariants=False)

    def row_indices(self) -> torch.Tensor:
        """COO row index of every CSR entry (int64, (nnz,))."""
        return torch.repeat_interleave(
            torch.arange(self.n, device=self.device), (self.crow[1:] - self.crow[:-1]).long(), output_size=self.nnz
        )

    def col_indices_csc(self) -> torch.Tensor:
        """Column index of every CSC entry (int64, (nnz,))."""
        return torch.repeat_interleave(
            torch.arange(self.n, device=self.device), (self.ccol[1:] - self.ccol[:-1]).long(), output_size=self.nnz
        )

    def __repr__(self) -> str:
        return f"PreparedMatrix(n={self.n}, nnz={self.nnz}, index_dtype={self.index_dtype}, device={self.device})"


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
        raise UserError(f"{name}: expected a torch sparse CSR tensor or PreparedMatrix, got {type(m).__name__}")
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


def prepare(m: torch.Tensor | PreparedMatrix, *, name: str = "M") -> PreparedMatrix:
    """Validate a sparse CSR relation matrix (N x N, float32, values in [0, 1]) and cache its CSC form.

    Returns ``m`` unchanged when it already is a :class:`PreparedMatrix`.
    Raises :class:`ValueError` (``UserError``) naming ``name`` for a malformed matrix.
    """
    if isinstance(m, PreparedMatrix):
        return m
    crow, col, val = _check_csr(m, name)
    n = int(m.shape[0])
    if has_kernel("csr_transpose", val.device):
        ccol, row, tval = torch.ops.kgreason.csr_transpose(crow, col, val, n)
    else:
        ccol, row, tval = _transpose_reference(n, crow, col, val)
    return PreparedMatrix(n, crow, col, val, ccol, row, tval)


def as_prepared(m: torch.Tensor | PreparedMatrix, name: str = "M") -> PreparedMatrix:
    return m if isinstance(m, PreparedMatrix) else prepare(m, name=name)


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
