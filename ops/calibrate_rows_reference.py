"""Pure-torch references of ``kgreason::calibrate_rows``, ``calibrate_row_stats`` and ``calibrate_rows_normalised``
(any device).

This is the code :meth:`kge.calibrate.RowCalibrator.compute` ran after its GEMM
before the fused kernel existed, factored out unchanged: with
``backend="reference"`` a calibration gives exactly the floats it gave then.
The compiled kernels follow the same formula with their own exp and row sums,
so they agree with this reference to float32 rounding (values within 1e-6),
not bit for bit; entries within an ulp of the threshold may be kept by one and
dropped by the other (see ``tests/test_ops_calibrate_rows.py``).
"""
from __future__ import annotations

import math

import torch

from kgreason.errors import UserError

__all__ = ["calibrate_rows", "calibrate_row_stats", "calibrate_rows_normalised"]


def calibrate_rows(scores: torch.Tensor, obs_ptr: torch.Tensor, obs_cols: torch.Tensor, threshold: float,
                   delta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibrated rows of ``scores`` (c, N) float32; **overwrites scores** (its softmax numerators).

    Returns ``(row_nnz (c,) int64, cols int32, vals float32)`` on ``scores``' device; see
    :func:`ops.calibrate_rows`.
    """
    c = scores.shape[0]
    dev = scores.device
    s = scores
    # softmax in place: s <- exp(s - max), then Z = row sums
    s.sub_(s.amax(dim=1, keepdim=True)).exp_()
    z = s.sum(dim=1, keepdim=True)
    counts = (obs_ptr[1:] - obs_ptr[:-1]).to(dev)
    k = counts.clamp(min=1).to(torch.float32)
    scale = k.unsqueeze(1) / z  # p = s * scale
    if obs_cols.numel():
        o_rows = torch.repeat_interleave(torch.arange(c, device=dev), counts)
        s[o_rows, obs_cols.to(dev, torch.int64)] = math.inf  # -> exactly 1.0
    # p >= threshold  <=>  s >= threshold / scale (one compare pass, no p matrix)
    keep = s >= (threshold / scale)
    idx = keep.nonzero()  # row-major: columns sorted within each row
    rr, cc = idx[:, 0], idx[:, 1]
    p = s[rr, cc] * scale[rr, 0]
    p = torch.where(torch.isinf(p), torch.ones_like(p), p.clamp_(max=1.0 - delta))
    row_nnz = torch.bincount(rr, minlength=c)
    return row_nnz.to(torch.int64), cc.to(torch.int32), p.to(torch.float32)


def calibrate_row_stats(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``scores`` (c, N) float32: ``(max (c,) float32, sum exp(s - max) (c,) float64)``; N = 0 gives
    ``(-inf, 0)``.  See :func:`ops.calibrate_row_stats`."""
    c, n = scores.shape
    if n == 0:
        return (torch.full((c,), -math.inf, dtype=torch.float32, device=scores.device),
                torch.zeros(c, dtype=torch.float64, device=scores.device))
    m = scores.amax(dim=1)
    return m, torch.exp(scores - m.unsqueeze(1)).to(torch.float64).sum(dim=1)


def calibrate_rows_normalised(scores: torch.Tensor, row_max: torch.Tensor, row_scale: torch.Tensor,
                              obs_ptr: torch.Tensor, obs_cols: torch.Tensor, threshold: float,
                              delta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Calibrated rows of ``scores`` (c, N) float32 with the normaliser given per row (``p = exp(s - row_max) *
    row_scale``); **overwrites scores**.  The threshold is tested on the float32 ``p``, as the kernels test it.
    See :func:`ops.calibrate_rows_normalised`."""
    c, n = scores.shape
    dev = scores.device
    if c and n:
        # the kernels' slack: float32 rounding of a block recomputed in another GEMM shape
        over = scores.amax(dim=1) > row_max + 1e-4 * row_max.abs().clamp(min=1.0)
        if bool(over.any()):
            r = int(over.nonzero()[0, 0])
            raise UserError(f"row_max: row {r}: {float(row_max[r])} is below the row's largest score "
                            f"{float(scores[r].max())}; it must be the maximum over every block of the row (1e-4 relative slack)")
    p = scores.sub_(row_max.unsqueeze(1)).exp_().mul_(row_scale.unsqueeze(1))
    counts = (obs_ptr[1:] - obs_ptr[:-1]).to(dev)
    if obs_cols.numel():
        p[torch.repeat_interleave(torch.arange(c, device=dev), counts), obs_cols.to(dev, torch.int64)] = math.inf
    thr = torch.tensor(threshold, dtype=torch.float32)
    if float(thr) < threshold:  # the smallest float32 >= threshold
        thr = torch.nextafter(thr, torch.tensor(math.inf))
    rr, cc = (p >= thr.to(dev)).nonzero(as_tuple=True)  # row-major: columns ascending within a row
    v = p[rr, cc]
    v = torch.where(torch.isinf(v), torch.ones_like(v), v.clamp(max=float(torch.tensor(1.0 - delta, dtype=torch.float32))))
    return torch.bincount(rr, minlength=c).to(torch.int64), cc.to(torch.int32), v.to(torch.float32)
