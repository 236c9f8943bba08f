"""Pure-torch reference of ``kgreason::calibrate_rows`` (any device).

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

__all__ = ["calibrate_rows"]


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
