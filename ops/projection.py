"""Relation projection over the max-times semiring: one entry point, :func:`project`.

Row ``b`` of a fuzzy batch goes through relation ``rel[b]`` of a stack of relation
matrices (:class:`ops.StackedMatrices`; a single matrix is the one-relation stack and
``rel=None`` puts every row on relation 0)::

    Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]                            (negate=False)
    Y[b, j] = max_i X[b, i] * (1 - min(1, neg_scale * M_{rel[b]}[i, j]))  (negate=True; QTO's negated
                                                                            edge, factor 1 where M has
                                                                            no entry)

One C++ op family does it (``kgreason::project`` / ``project_out`` / ``project_strategy``,
csrc/project.cpp): per row push, sweep or pull from one cost model
(csrc/cpu/project_cost.h).  A sparse batch (:class:`ops.sparse_rows.SparseRows`) goes to
the sparse-in, sparse-out kernel ``kgreason::project_multi_sparse`` from the same call.

>>> import torch, ops
>>> M = torch.tensor([[0.0, 0.9], [0.5, 0.0]]).to_sparse_csr()
>>> ops.project(torch.tensor([[1.0, 0.2]]), M)
tensor([[0.1000, 0.9000]])
"""
from __future__ import annotations

import math

import torch

from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError

from . import reference
from ._backend import has_kernel, resolve_backend
from .prepared import StackedMatrices, as_stack, check_fuzzy, check_out, check_rel, write_out
from .sparse_rows import SparseRows, _project_sparse

__all__ = ["project", "project_strategies", "choose_strategy", "STRATEGIES", "SWEEP"]

#: Codes of ``strategy=`` (the kernel's ``int strategy``).
STRATEGIES = {"auto": 0, "push": 1, "pull": 2}
#: The code :func:`project_strategies` reports for a row swept through its relation's entries.
SWEEP = 3
_PLAN_NAMES = {1: "push", 2: "pull", SWEEP: "sweep"}

# rel=None: every row on relation 0.  A zeros (B,) tensor per (device, B), made once: allocating one per
# call costs about a microsecond, 5% of a one-hot B = 1 projection.  Read only (the kernel never writes rel).
_ZEROS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _zeros(b: int, device: torch.device) -> torch.Tensor:
    z = _ZEROS.get((device, b))
    if z is None:
        if len(_ZEROS) >= 64:
            _ZEROS.clear()
        z = _ZEROS[(device, b)] = torch.zeros(b, dtype=torch.int64, device=device)
    return z


def _strategy_code(strategy: str) -> int:
    try:
        return STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise UserError(f"strategy: expected one of {tuple(STRATEGIES)}, got {strategy!r}") from None


def _check_neg_scale(neg_scale) -> float:
    try:
        neg_scale = float(neg_scale)
    except (TypeError, ValueError):
        raise UserError(f"neg_scale: expected a number, got {neg_scale!r}") from None
    if not (neg_scale >= 0.0 and math.isfinite(neg_scale)):
        raise UserError(f"neg_scale: expected a finite number >= 0, got {neg_scale}")
    return neg_scale


def _check_x(X, M: StackedMatrices, validate: bool) -> torch.Tensor:
    check_fuzzy(X, "X", check_values=validate)
    if X.shape[1] != M.n:
        raise UserError(f"X: expected shape (B, N) with N = {M.n} (the matrix size), got {tuple(X.shape)}")
    if X.device != M.device:
        raise UserError(f"X: is on {X.device} but the matrix M is on {M.device}; move one of them")
    return X.contiguous()


def _rows_relation(rel, b: int, M: StackedMatrices, device: torch.device, *, check_range: bool = True) -> torch.Tensor:
    return _zeros(b, device) if rel is None else check_rel(rel, b, M.num_relations, device, check_range=check_range)


def project(
    X,
    M,
    rel=None,
    *,
    negate: bool = False,
    neg_scale: float = QTO_NEG_SCALE,
    return_argmax: bool = False,
    strategy: str = "auto",
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str | None = None,
    validate: bool = True,
):
    """Project row ``b`` of a fuzzy batch through relation ``rel[b]``: ``Y[b, j] = max_i X[b, i] * M_{rel[b]}[i, j]``.

    Args:
        X: (B, N) float32 in [0, 1] (any strides), or an :class:`ops.sparse_rows.SparseRows`
            batch (then the result is a ``SparseRows`` too: row ``b`` holds every ``j`` reached
            from an active entity, ascending, with the dense result's values bit for bit).
        M: a :class:`ops.StackedMatrices` from :func:`ops.prepare_matrices` (pass one when
            projecting repeatedly: anything else is validated and transposed on every call),
            or what :func:`ops.prepare_matrices` accepts: an (N, N) sparse CSR (the
            one-relation stack), an (R*N, N) stack, ...
        rel: (B,) int32/int64 tensor (or a list of ints) of relation ids in [0, R), on X's
            device; None: every row through relation 0 (a single matrix).
        negate: QTO's negated projection, factor ``1 - min(1, neg_scale * M)`` (1 where M has
            no entry); computed without forming the dense factor.  Dense X only.
        neg_scale: ``s`` of the negated factor (finite, >= 0; default 3.0, QTO's).
        return_argmax: also return ``argmax`` (B, N) int32: the ``i`` reaching the max
            (smallest ``i`` on ties), ``-1`` where ``Y`` is 0.  Dense X only.
        strategy: ``"auto"`` (per row, from the kernel's cost model: push from the row's
            active entities, sweep through the relation's entries, or pull over the columns
            in tiles of rows sharing a relation), ``"push"`` or ``"pull"``.  Results are
            identical; only speed differs.  :func:`project_strategies` tells what auto picks.
        out: preallocated outputs to write into: ``Y`` (B, N) float32, or with
            ``return_argmax`` a pair ``(Y, argmax)`` (argmax int32); contiguous, on X's device,
            not sharing memory with X.  They are returned; every entry is overwritten.
            Reusing them across calls of one shape spares the allocation: a fresh
            (1024, 14505) Y is 59 MB, above glibc's mmap threshold.  Dense X only.
        backend: ``"cpp"``, ``"reference"`` or None (module default, see :func:`ops.set_backend`).
        validate: check X's values lie in [0, 1] (one pass; for a ``SparseRows``, its layout);
            shapes, dtypes, devices and the range of ``rel`` are always checked.

    Returns:
        ``Y`` (B, N) float32, or ``(Y, argmax)`` (the ``out`` tensors when given); a
        ``SparseRows`` for a sparse X.

    Raises :class:`kgreason.errors.UserError` (a ``ValueError``) naming the bad argument.
    """
    code = _strategy_code(strategy)
    neg_scale = _check_neg_scale(neg_scale)
    M = as_stack(M)
    if isinstance(X, SparseRows):
        for flag, what in ((negate, "negate"), (return_argmax, "return_argmax"), (out is not None, "out")):
            if flag:
                raise UserError(f"{what}: not available for a SparseRows X (a negated projection has full support; "
                                "argmax and out= are dense outputs); pass X.to_dense()")
        return _project_sparse(X, M, rel, backend=backend, validate=validate)
    x = _check_x(X, M, validate)
    negate = bool(negate)
    outs = check_out(out, X, return_argmax) if out is not None else None
    if resolve_backend(backend, "project", x.device) == "reference":
        rel_t = _rows_relation(rel, x.shape[0], M, x.device)
        res = reference.project_stacked(x, rel_t, M, negated=negate, neg_scale=neg_scale, return_argmax=return_argmax)
        return res if outs is None else write_out(res, *outs)
    # The kernel checks that every id is in range as it groups the rows; a second pass here (an
    # aminmax and a sync) cost 9 us of a 25 us one-row projection.  The error's words come from
    # check_rel, run again with the check when the kernel refuses.
    rel_t = _rows_relation(rel, x.shape[0], M, x.device, check_range=False)
    try:
        return _project_kernel(x, rel_t, M, code, negate, neg_scale, return_argmax, outs)
    except RuntimeError:
        if rel is not None:
            check_rel(rel_t, x.shape[0], M.num_relations, x.device)
        raise


def _project_kernel(x, rel_t, M: StackedMatrices, code: int, negate: bool, neg_scale: float, return_argmax: bool,
                    outs):
    args = (x, rel_t, M.crow, M.col, M.val, M.tcrow, M.trow, M.tval, M.n, code, negate, neg_scale)
    if outs is not None:
        y, a = outs
        if not has_kernel("project_out", x.device):  # e.g. a CUDA build without the out kernel
            res = torch.ops.kgreason.project(*args, return_argmax)
            return write_out(res if return_argmax else res[0], y, a)
        torch.ops.kgreason.project_out(*args, y, a if a is not None else x.new_empty((0,), dtype=torch.int32))
        return (y, a) if return_argmax else y
    y, a = torch.ops.kgreason.project(*args, return_argmax)
    return (y, a) if return_argmax else y


def project_strategies(X: torch.Tensor, M, rel=None) -> torch.Tensor:
    """The plan ``strategy="auto"`` picks for each row on the compiled CPU kernel: (B,) int32,
    1 = push, 2 = pull (the :data:`STRATEGIES` codes), 3 = sweep (:data:`SWEEP`: push through
    the relation's own entries).  For diagnostics and benchmarks."""
    M = as_stack(M)
    x = _check_x(X, M, False)
    rel_t = _rows_relation(rel, x.shape[0], M, x.device)
    if not has_kernel("project_strategy", x.device):
        raise UserError(f"project_strategies: needs the compiled kernel for {x.device}")
    return torch.ops.kgreason.project_strategy(x, rel_t, M.crow, M.n)


def choose_strategy(X: torch.Tensor, M, rel=None) -> str:
    """The plan ``strategy="auto"`` picks for most rows of X ("push", "pull" or "sweep"); "pull"
    where only the pure-torch reference runs (it has no strategies)."""
    M = as_stack(M)
    x = _check_x(X, M, False)
    if x.shape[0] == 0 or not has_kernel("project_strategy", x.device):
        return "pull"
    codes = project_strategies(x, M, rel)
    return _PLAN_NAMES[int(torch.bincount(codes.long(), minlength=4).argmax())]

