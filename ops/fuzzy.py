"""Element-wise fuzzy-set logic: intersection (t-norm), union (t-conorm), negation, top-k pruning.

All operators map [0, 1] to [0, 1] and never produce NaN on valid input.
``tnorm="product"``: intersection ``prod x``, union ``1 - prod (1 - x)``
(probabilistic sum).  ``tnorm="godel"``: intersection ``min``, union ``max``.

The k-ary operators have a fused kernel (``kgreason::fuzzy_reduce``: one pass
reading each input once) that the ``cpp`` backend uses for the probabilistic
sum and for k >= 3 inputs; chained torch ops make up to 2k+1 passes over
memory.  For two inputs of product / min / max a single torch op is already
one pass and is used on every backend (the fused kernel measured 0.8-1.0x
of it).  Numbers in benchmarks/results/ops_notes.md (section "Fused k-ary union / intersection").
"""
from __future__ import annotations

import functools

import torch

from kgreason.errors import UserError

from ._backend import resolve_backend
from .prepared import check_fuzzy

__all__ = ["intersect", "union", "negate", "topk_prune", "TNORMS", "check_tnorm"]

TNORMS = ("product", "godel")
# op codes of kgreason::fuzzy_reduce
_CODES = {("intersect", "product"): 0, ("intersect", "godel"): 1, ("union", "product"): 2, ("union", "godel"): 3}


def _check_many(xs, what: str, validate: bool) -> list[torch.Tensor]:
    if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
        xs = tuple(xs[0])
    if not xs:
        raise UserError(f"{what}: needs at least one fuzzy set, got none")
    out = []
    for k, x in enumerate(xs):
        check_fuzzy(x, f"{what} argument {k}", ndim=x.dim() if isinstance(x, torch.Tensor) and x.dim() else 1,
                    check_values=validate)
        if x.shape != xs[0].shape:
            raise UserError(f"{what} argument {k}: shape {tuple(x.shape)} differs from argument 0's {tuple(xs[0].shape)}")
        if x.device != xs[0].device:
            raise UserError(f"{what} argument {k}: on {x.device}, argument 0 on {xs[0].device}")
        out.append(x)
    return out


def check_tnorm(tnorm: str) -> None:
    """The one check of a t-norm name (:data:`TNORMS`); raises :class:`UserError` naming the choices."""
    if tnorm not in TNORMS:
        raise UserError(f"tnorm: expected one of {TNORMS}, got {tnorm!r}")


def _reduce(kind: str, xs, tnorm: str, backend: str | None, validate: bool) -> torch.Tensor:
    check_tnorm(tnorm)
    xs = _check_many(xs, kind, validate)
    if len(xs) == 1:
        return xs[0].clone()
    # Two inputs of a product/min/max are one torch op already (one pass); the fused
    # kernel wins for the probabilistic sum (1 op instead of 4: 3.4-4.5x) and for k >= 3.
    single_op = len(xs) == 2 and not (kind == "union" and tnorm == "product")
    if not single_op and resolve_backend(backend, "fuzzy_reduce", xs[0].device) == "cpp":
        return torch.ops.kgreason.fuzzy_reduce(xs, _CODES[(kind, tnorm)])
    if kind == "intersect":
        op = torch.mul if tnorm == "product" else torch.minimum
        return functools.reduce(op, xs)
    if tnorm == "godel":
        return functools.reduce(torch.maximum, xs)
    comp = functools.reduce(torch.mul, [1.0 - x for x in xs])
    return 1.0 - comp


def intersect(*Xs: torch.Tensor, tnorm: str = "product", backend: str | None = None, validate: bool = True):
    """Fuzzy intersection of k same-shaped sets: product or min (Gödel) t-norm. Returns a new tensor."""
    return _reduce("intersect", Xs, tnorm, backend, validate)


def union(*Xs: torch.Tensor, tnorm: str = "product", backend: str | None = None, validate: bool = True):
    """Fuzzy union of k same-shaped sets: ``1 - prod(1 - x)`` or max (Gödel). Returns a new tensor."""
    return _reduce("union", Xs, tnorm, backend, validate)


def negate(X: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """Fuzzy complement ``1 - x`` (a single torch op; nothing to fuse)."""
    check_fuzzy(X, "X", ndim=X.dim() if isinstance(X, torch.Tensor) and X.dim() else 1, check_values=validate)
    return 1.0 - X


def topk_prune(X: torch.Tensor, k: int, *, validate: bool = True) -> torch.Tensor:
    """Keep the ``k`` largest entries of each row of X (B, N), zero the rest.

    Ties at the cut keep the smallest indices (deterministic).  Used for
    approximate multi-hop queries: a pruned set makes the next projection's
    push strategy touch only ``k`` rows per query.  ``k >= N`` returns a copy.
    """
    check_fuzzy(X, "X", check_values=validate)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise UserError(f"k: expected an integer >= 0, got {k!r}")
    n = X.shape[1]
    if k >= n:
        return X.clone()
    if k == 0:
        return torch.zeros_like(X)
    # O(B N) and deterministic (torch.topk's choice among ties is not): keep everything above
    # the k-th largest value, then the first (by index) entries equal to it until k are kept.
    thr = torch.topk(X, k, dim=1, sorted=True).values[:, -1:]
    above = X > thr
    at = X == thr
    need = k - above.sum(dim=1, keepdim=True)
    keep = above | (at & (torch.cumsum(at, dim=1) <= need))
    return torch.where(keep, X, torch.zeros((), dtype=X.dtype, device=X.device))
