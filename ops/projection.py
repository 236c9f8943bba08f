"""Relation projection of fuzzy sets over the max-times semiring (plain and QTO-negated)."""
from __future__ import annotations

import torch

from kgreason.errors import UserError

from . import reference
from ._backend import has_kernel, resolve_backend
from .prepared import PreparedMatrix, as_prepared, check_fuzzy, check_out, write_out

__all__ = ["project", "project_negated", "choose_strategy", "STRATEGIES"]

STRATEGIES = {"auto": 0, "push": 1, "pull": 2}


def _check_pair(x: torch.Tensor, m: PreparedMatrix, validate: bool) -> torch.Tensor:
    check_fuzzy(x, "X", check_values=validate)
    if x.shape[1] != m.n:
        raise UserError(f"X: expected shape (B, N) with N = {m.n} (the matrix size), got {tuple(x.shape)}")
    if x.device != m.device:
        raise UserError(f"X: is on {x.device} but the matrix M is on {m.device}; move one of them")
    return x.contiguous()


def _strategy_code(strategy: str) -> int:
    try:
        return STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise UserError(f"strategy: expected one of {tuple(STRATEGIES)}, got {strategy!r}") from None


def project(
    X: torch.Tensor,
    M: torch.Tensor | PreparedMatrix,
    *,
    return_argmax: bool = False,
    strategy: str = "auto",
    backend: str | None = None,
    validate: bool = True,
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Project a fuzzy batch through a relation: ``Y[b, j] = max_i X[b, i] * M[i, j]``.

    Args:
        X: (B, N) float32 in [0, 1]; any strides.
        M: (N, N) sparse CSR float32 in [0, 1] (int32 or int64 indices), or a
            :class:`PreparedMatrix` from :func:`ops.prepare` (pass one when projecting
            through the same relation repeatedly: a raw CSR is validated and
            transposed on every call).
        return_argmax: also return ``argmax`` (B, N) int32: the ``i`` reaching the
            max (smallest ``i`` on ties), ``-1`` where ``Y`` is 0.
        strategy: ``"push"`` (scatter from the active rows; best for sparse X),
            ``"pull"`` (gather over columns; best for dense X) or ``"auto"`` (by the
            estimated work).  Results are identical; only speed differs.
        backend: ``"cpp"``, ``"reference"`` or None (module default, see :func:`ops.set_backend`).
        validate: check that X's values lie in [0, 1] (one pass over X); shapes,
            dtypes and devices are always checked.
        out: preallocated outputs to write into: ``Y`` (B, N) float32, or with
            ``return_argmax`` a pair ``(Y, argmax)`` (argmax (B, N) int32); contiguous,
            on X's device, not sharing memory with X.  They are returned.  Reusing them
            across calls of one shape spares the allocation: a fresh (1024, 14505) Y is
            59 MB, above glibc's mmap threshold, so every call would page-fault it in
            (~30 ms on the project's machines).  Every entry is overwritten.

    Returns:
        ``Y`` (B, N) float32, or ``(Y, argmax)`` (the ``out`` tensors when given).
    """
    code = _strategy_code(strategy)
    m = as_prepared(M)
    x = _check_pair(X, m, validate)
    outs = check_out(out, X, return_argmax) if out is not None else None
    if resolve_backend(backend, "project", x.device) == "reference":
        res = reference.project(x, m, return_argmax)
        return res if outs is None else write_out(res, *outs)
    if outs is not None:
        if not has_kernel("project_out", x.device):  # e.g. a CUDA build without the out kernel
            res = torch.ops.kgreason.project(x, m.crow, m.col, m.val, m.ccol, m.row, m.tval, code, return_argmax)
            return write_out(res if return_argmax else res[0], *outs)
        y, a = outs
        empty = x.new_empty((0,), dtype=torch.int32)
        torch.ops.kgreason.project_out(x, m.crow, m.col, m.val, m.ccol, m.row, m.tval, code, y,
                                       a if a is not None else empty)
        return (y, a) if return_argmax else y
    y, a = torch.ops.kgreason.project(x, m.crow, m.col, m.val, m.ccol, m.row, m.tval, code, return_argmax)
    return (y, a) if return_argmax else y


def project_negated(
    X: torch.Tensor,
    M: torch.Tensor | PreparedMatrix,
    *,
    neg_scale: float = 3.0,
    return_argmax: bool = False,
    strategy: str = "auto",
    backend: str | None = None,
    validate: bool = True,
):
    """Project through QTO's negated relation without materialising it.

    ``Y[b, j] = max_i X[b, i] * (1 - min(1, neg_scale * M[i, j]))``: the factor is 1
    for every ``i`` outside column ``j``'s support, so each column needs only its
    support plus the few largest entries of each row of X.  Arguments and
    returns as :func:`project`; ``strategy`` is accepted for symmetry, but the
    kernel always combines a per-query pass (out-of-support maxima, from the
    rows of X's largest entries) with a column pull (in-support products),
    because ``Y`` is dense whatever X is.
    """
    _strategy_code(strategy)
    try:
        neg_scale = float(neg_scale)
    except (TypeError, ValueError):
        raise UserError(f"neg_scale: expected a number, got {neg_scale!r}") from None
    if not neg_scale >= 0.0 or neg_scale == float("inf"):
        raise UserError(f"neg_scale: expected a finite number >= 0, got {neg_scale}")
    m = as_prepared(M)
    x = _check_pair(X, m, validate)
    if resolve_backend(backend, "project_negated", x.device) == "reference":
        return reference.project_negated(x, m, neg_scale, return_argmax)
    y, a = torch.ops.kgreason.project_negated(x, m.crow, m.col, m.ccol, m.row, m.tval, neg_scale, return_argmax)
    return (y, a) if return_argmax else y


def choose_strategy(X: torch.Tensor, M: torch.Tensor | PreparedMatrix) -> str:
    """The strategy ``strategy="auto"`` picks for this input on the compiled CPU backend ("push"/"pull")."""
    m = as_prepared(M)
    x = _check_pair(X, m, False)
    if resolve_backend(None, "project_strategy", x.device) == "reference":
        return "pull"
    code = int(torch.ops.kgreason.project_strategy(x, m.crow, m.nnz))
    return {1: "push", 2: "pull"}[code]
