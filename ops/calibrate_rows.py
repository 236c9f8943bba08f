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

__all__ = ["calibrate_rows"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_inputs(scores, obs_ptr, obs_cols, threshold, delta) -> tuple[float, float]:
    if not isinstance(scores, torch.Tensor):
        raise UserError(f"scores: expected a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise UserError(f"scores: expected a 2-D float32 tensor (c, N), got {scores.dtype} of shape "
                        f"{tuple(scores.shape)}")
    c, n = scores.shape
    if n < 1:
        raise UserError(f"scores: expected N >= 1 columns, got shape {tuple(scores.shape)}")
    if n > 2**31 - 1:
        raise UserError(f"scores: N = {n} columns do not fit the int32 output columns")
    for name, t, dtypes in (("obs_ptr", obs_ptr, (torch.int64,)), ("obs_cols", obs_cols, _INDEX_DTYPES)):
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1 or t.dtype not in dtypes:
            want = "int64" if len(dtypes) == 1 else "int32 or int64"
            raise UserError(f"{name}: expected a 1-D {want} tensor, got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != scores.device:
            raise UserError(f"{name}: is on {t.device} but scores is on {scores.device}; move one of them")
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
