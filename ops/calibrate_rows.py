"""QTO calibration of score rows (``kgreason::calibrate_rows``): what follows the GEMM in a calibration.

For every row of a GEMM score matrix ``s`` (c, N) (row ``i`` = the scores of
all N tails for one ``(relation, head)`` pair) and the row's observed tails::

    p_j = softmax(s)_j * max(1, #observed tails)
    p_j is dropped     if p_j < threshold
    p_j = min(p_j, 1 - delta)
    p_j = 1 (kept)     at the observed tails

and the kept entries come back as CSR pieces.  :class:`kge.calibrate.RowCalibrator`
(eager builds and lazy artifacts) calls it on each chunk of rows.

Backends as for every op (:mod:`ops._backend`): ``"cpp"`` (the fused CPU
kernel, ``csrc/cpu/calibrate_rows_cpu.cpp``: one pass over each row's scores
instead of torch's eight; CUDA: ``csrc/cuda/calibrate_rows_cuda.cu``) or
``"reference"`` (:mod:`ops.calibrate_rows_reference`, the torch code the
calibration used before, any device).  The two agree to float32 rounding, not
bit for bit (their exp and row sums differ in the last bits); each is
deterministic and a row's result does not depend on which other rows are in
the call, so lazy rows equal eager rows whichever backend computes both.

>>> import torch, ops
>>> s = torch.tensor([[0.0, 0.0, 5.0], [1.0, 1.0, 1.0]])
>>> nnz, cols, vals = ops.calibrate_rows(s, torch.tensor([0, 1, 1]), torch.tensor([0]), threshold=0.01)
>>> nnz.tolist(), cols.tolist(), [round(v, 4) for v in vals.tolist()]
([2, 3], [0, 2, 0, 1, 2], [1.0, 0.9867, 0.3333, 0.3333, 0.3333])
"""
from __future__ import annotations

import math

import torch

from kgreason.errors import UserError

from . import calibrate_rows_reference
from ._backend import resolve_backend

__all__ = ["calibrate_rows", "calibrate_row_stats", "calibrate_rows_normalised"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_scores(scores, *, min_cols: int) -> tuple[int, int]:
    if not isinstance(scores, torch.Tensor):
        raise UserError(f"scores: expected a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise UserError(f"scores: expected a 2-D float32 tensor (c, N), got {scores.dtype} of shape "
                        f"{tuple(scores.shape)}")
    c, n = scores.shape
    if n < min_cols:
        raise UserError(f"scores: expected N >= {min_cols} columns, got shape {tuple(scores.shape)}")
    if n > 2**31 - 1:
        raise UserError(f"scores: N = {n} columns do not fit the int32 output columns")
    return c, n


def _check_tensor(name: str, t, dtypes: tuple[torch.dtype, ...], want: str, scores: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise UserError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.dtype not in dtypes:
        raise UserError(f"{name}: expected a 1-D {want} tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if t.device != scores.device:
        raise UserError(f"{name}: is on {t.device} but scores is on {scores.device}; move one of them")


def _check_obs(scores, obs_ptr, obs_cols, threshold, delta) -> tuple[float, float]:
    """The observed tails (a CSR over the rows of ``scores``), threshold and delta."""
    c, n = scores.shape
    _check_tensor("obs_ptr", obs_ptr, (torch.int64,), "int64", scores)
    _check_tensor("obs_cols", obs_cols, _INDEX_DTYPES, "int32 or int64", scores)
    if obs_ptr.numel() != c + 1:
        raise UserError(f"obs_ptr: expected c+1 = {c + 1} entries (one more than the rows of scores), "
                        f"got {obs_ptr.numel()}")
    e = obs_cols.numel()
    ptr = obs_ptr.cpu()
    if int(ptr[0]) != 0 or int(ptr[-1]) != e:
        raise UserError(f"obs_ptr: must start at 0 and end at len(obs_cols) = {e}, got {int(ptr[0])}..{int(ptr[-1])}")
    if c and bool((ptr[1:] < ptr[:-1]).any()):
        raise UserError("obs_ptr: must be non-decreasing")
    if e:
        lo, hi = int(obs_cols.min()), int(obs_cols.max())
        if lo < 0 or hi >= n:
            raise UserError(f"obs_cols: columns must lie in [0, {n}), got {lo}..{hi}")
    try:
        threshold, delta = float(threshold), float(delta)
    except (TypeError, ValueError):
        raise UserError(f"threshold/delta: expected numbers, got {threshold!r} and {delta!r}") from None
    if not (math.isfinite(threshold) and threshold > 0.0):
        raise UserError(f"threshold: expected a finite number > 0, got {threshold}")
    if not 0.0 <= delta < 1.0:
        raise UserError(f"delta: expected a number in [0, 1), got {delta}")
    return threshold, delta


def _check_inputs(scores, obs_ptr, obs_cols, threshold, delta) -> tuple[float, float]:
    _check_scores(scores, min_cols=1)
    return _check_obs(scores, obs_ptr, obs_cols, threshold, delta)


def calibrate_rows(
    scores: torch.Tensor,
    obs_ptr: torch.Tensor,
    obs_cols: torch.Tensor,
    *,
    threshold: float,
    delta: float = 1e-4,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibrated, thresholded rows of a score matrix, as CSR pieces.

    Args:
        scores: (c, N) float32, finite (GEMM scores; one row per (relation, head)).  Its contents
            are unspecified after the call: the reference backend uses it as its workspace.
        obs_ptr: (c+1,) int64, starting at 0 and ending at ``len(obs_cols)``: row ``i``'s observed
            tails are ``obs_cols[obs_ptr[i]:obs_ptr[i+1]]``.
        obs_cols: (E,) int32 or int64 in [0, N) (any order; duplicates allowed).
        threshold: entries with ``p < threshold`` are dropped (finite, > 0).
        delta: computed entries are capped at ``1 - delta`` (in [0, 1)); observed ones are exactly 1.
        backend: ``"cpp"``, ``"reference"`` or None (module default, see :func:`ops.set_backend`).

    All tensors on one device.

    Returns:
        ``(row_nnz, cols, vals)`` on that device: ``row_nnz`` (c,) int64 entries per row, then
        the rows' entries one row after the other, ``cols`` (nnz,) int32 ascending within a row,
        ``vals`` (nnz,) float32, in ``[threshold, 1 - delta]`` or exactly 1.0 (the ``cpp`` kernels
        test ``p >= threshold`` on the float32 ``p``; the reference compares the softmax numerator
        with ``threshold / scale``, so it may keep an entry an ulp below the threshold or drop
        one an ulp above).
    """
    threshold, delta = _check_inputs(scores, obs_ptr, obs_cols, threshold, delta)
    if resolve_backend(backend, "calibrate_rows", scores.device) == "reference":
        return calibrate_rows_reference.calibrate_rows(scores, obs_ptr, obs_cols, threshold, delta)
    return torch.ops.kgreason.calibrate_rows(scores, obs_ptr, obs_cols, threshold, delta)


def calibrate_row_stats(scores: torch.Tensor, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first half of :func:`calibrate_rows` for one column block of each row: per row of ``scores`` (c, N)
    float32 (finite; read only; N = 0 allowed) its maximum ``m`` and ``sum_j exp(s_j - m)``.

    Returns ``(row_max (c,) float32, row_sumexp (c,) float64)`` on scores' device (N = 0: ``-inf`` and 0).  The
    ``cpp`` kernels sum as :func:`calibrate_rows` sums a whole row's ``Z`` (float32 lanes per 1,024 entries,
    added in float64), so blocks merged as a log-sum-exp (``M = max m_k``, ``Z = sum z_k exp(m_k - M)``) give one
    process's normaliser up to the order of the sums (:mod:`engine.exec.sharded_lazy`).

    >>> import torch, ops
    >>> m, z = ops.calibrate_row_stats(torch.tensor([[0.0, 0.0, 5.0]]))
    >>> m.tolist(), round(float(z), 4)
    ([5.0], 1.0135)
    """
    _check_scores(scores, min_cols=0)
    if resolve_backend(backend, "calibrate_row_stats", scores.device) == "reference":
        return calibrate_rows_reference.calibrate_row_stats(scores)
    return torch.ops.kgreason.calibrate_row_stats(scores)


def calibrate_rows_normalised(
    scores: torch.Tensor,
    row_max: torch.Tensor,
    row_scale: torch.Tensor,
    obs_ptr: torch.Tensor,
    obs_cols: torch.Tensor,
    *,
    threshold: float,
    delta: float = 1e-4,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The second half of :func:`calibrate_rows` for one column block of each row, the normaliser given from outside:
    ``p_j = exp(s_j - row_max) * row_scale``, dropped below ``threshold``, capped at ``1 - delta``, exactly 1 at the
    observed tails.

    Args:
        scores: (c, N) float32, finite (N = 0 allowed: nothing kept).  Its contents are unspecified after the
            call (the reference backend's workspace).
        row_max: (c,) float32, finite: the maximum of the whole row (every block), so ``>= scores[i]``'s entries;
            a smaller one is an error (``p`` could exceed the row's count, or overflow).
        row_scale: (c,) float32, finite, > 0: ``max(1, #observed tails of the whole row) / Z``, ``Z`` the whole
            row's ``sum exp(s - row_max)`` (:func:`calibrate_row_stats` merged over the blocks).
        obs_ptr, obs_cols, threshold, delta, backend: as for :func:`calibrate_rows` (the observed tails of this
            block, columns local to it).

    Returns:
        ``(row_nnz, cols, vals)`` as :func:`calibrate_rows` (both backends test ``p >= threshold`` on the float32
        ``p``).  With ``row_max``/``row_scale`` those :func:`calibrate_rows` computes for a whole row, the same
        entries as it gives, to float32 rounding.

    >>> import torch, ops
    >>> s = torch.tensor([[0.0, 0.0, 5.0]])
    >>> nnz, cols, vals = ops.calibrate_rows_normalised(s[:, 1:].clone(), torch.tensor([5.0]),
    ...     torch.tensor([1 / 1.0135]), torch.tensor([0, 0]), torch.tensor([], dtype=torch.int64), threshold=0.001)
    >>> nnz.tolist(), cols.tolist(), [round(v, 4) for v in vals.tolist()]
    ([2], [0, 1], [0.0066, 0.9867])
    """
    c, _ = _check_scores(scores, min_cols=0)
    for name, t in (("row_max", row_max), ("row_scale", row_scale)):
        _check_tensor(name, t, (torch.float32,), "float32", scores)
        if t.numel() != c:
            raise UserError(f"{name}: expected c = {c} entries (one per row of scores), got {t.numel()}")
    threshold, delta = _check_obs(scores, obs_ptr, obs_cols, threshold, delta)
    if c:
        if not bool(torch.isfinite(row_max).all()):
            raise UserError(f"row_max: expected finite values, got {row_max[~torch.isfinite(row_max)][:3].tolist()}")
        bad = ~(torch.isfinite(row_scale) & (row_scale > 0))
        if bool(bad.any()):
            raise UserError(f"row_scale: expected finite values > 0, got {row_scale[bad][:3].tolist()}")
    if resolve_backend(backend, "calibrate_rows_normalised", scores.device) == "reference":
        return calibrate_rows_reference.calibrate_rows_normalised(scores, row_max, row_scale, obs_ptr, obs_cols,
                                                                  threshold, delta)
    return torch.ops.kgreason.calibrate_rows_normalised(scores, row_max, row_scale, obs_ptr, obs_cols, threshold,
                                                        delta)
