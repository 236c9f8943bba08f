"""ops.calibrate_rows: the fused kernel against the torch reference and the float64 formula.

The kernel and the reference agree to float32 rounding, not bit for bit (different exp and row sums):
values within 1e-6, kept sets equal except for entries within 1e-6 (relative) of the threshold.
Each backend on its own is deterministic and row-local (a row's result does not depend on the other
rows of the call, nor on the thread count), which is what keeps lazy rows equal to eager rows.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ops
from _ops_helpers import BACKENDS, lane_grid, require_backend
from kgreason.errors import UserError

CPP = ops.extension_available() and ops.has_kernel("calibrate_rows", "cpu")
needs_cpp = pytest.mark.skipif(not CPP, reason="compiled extension ops._C (calibrate_rows) not built")


def _case(gen: torch.Generator, c: int, n: int, *, obs: str = "random", scores: str = "normal", scale: float = 4.0,
          index_dtype=torch.int64):
    """(scores (c, n), obs_ptr, obs_cols): 'normal' scores (peaked rows at scale 4), 'equal' rows, or 'mixed'
    (every third row all equal); observed 'none', 'random' (0-5 per row, duplicates possible), 'all'
    (every column of every third row), 'mixed' (random plus one fully observed row)."""
    s = torch.randn(c, n, generator=gen) * scale
    if scores == "equal":
        s[:] = 1.25
    elif scores == "mixed":
        s[::3] = -3.0
    counts = torch.zeros(c, dtype=torch.int64)
    cols: list[torch.Tensor] = []
    for i in range(c):
        if obs == "none":
            row = torch.zeros(0, dtype=torch.int64)
        elif obs == "all" and i % 3 == 0 or obs == "mixed" and i == c // 2:
            row = torch.randperm(n, generator=gen)  # every column, in no particular order
        elif obs in ("random", "all", "mixed"):
            row = torch.randint(0, n, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen)
        else:
            raise ValueError(obs)
        counts[i] = len(row)
        cols.append(row)
    ptr = torch.zeros(c + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=ptr[1:])
    ocol = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)
    return s, ptr, ocol.to(index_dtype)


def _dense(c: int, n: int, row_nnz, cols, vals) -> tuple[np.ndarray, np.ndarray]:
    """(values (c, n) float64, kept mask (c, n)) from CSR pieces, checking their structure."""
    row_nnz, cols, vals = (t.cpu().numpy() for t in (row_nnz, cols, vals))
    assert row_nnz.dtype == np.int64 and cols.dtype == np.int32 and vals.dtype == np.float32
    assert row_nnz.shape == (c,) and int(row_nnz.sum()) == len(cols) == len(vals)
    ptr = np.concatenate([[0], np.cumsum(row_nnz)])
    out = np.zeros((c, n))
    kept = np.zeros((c, n), dtype=bool)
    for i in range(c):
        cc = cols[ptr[i]:ptr[i + 1]]
        assert np.all(np.diff(cc) > 0), f"row {i}: columns not strictly ascending"
        assert cc.size == 0 or (cc.min() >= 0 and cc.max() < n)
        out[i, cc] = vals[ptr[i]:ptr[i + 1]]
        kept[i, cc] = True
    return out, kept


def _formula(s: torch.Tensor, ptr: torch.Tensor, ocol: torch.Tensor, threshold: float, delta: float):
    """float64 (values, kept, unrounded p) straight from the formula."""
    s64 = s.double().numpy()
    e = np.exp(s64 - s64.max(axis=1, keepdims=True))
    counts = np.diff(ptr.numpy())
    p = e / e.sum(axis=1, keepdims=True) * np.maximum(counts, 1)[:, None]
    kept = p >= threshold
    val = np.where(kept, np.minimum(p, 1.0 - delta), 0.0)
    o_rows = np.repeat(np.arange(len(counts)), counts)
    o_cols = ocol.long().numpy()
    val[o_rows, o_cols] = 1.0
    kept[o_rows, o_cols] = True
    return val, kept, p


def _assert_close_sets(got, want, threshold: float, what: str, seed: int, *, vtol: float = 1e-6):
    """Equal kept sets except entries within 1e-6 (relative) of the threshold; values within vtol."""
    (gv, gk), (wv, wk) = got, want
    only = gk ^ wk
    if only.any():
        v = np.where(gk, gv, wv)[only]  # the value on the side that kept it
        far = np.abs(v - threshold) > 1e-6 * threshold
        assert not far.any(), (f"{what}: kept sets differ away from the threshold at "
                               f"{np.argwhere(only)[far][:5].tolist()} (values {v[far][:5]}; seed={seed})")
    both = gk & wk
    diff = np.abs(gv[both] - wv[both])
    assert diff.size == 0 or diff.max() <= vtol, f"{what}: values differ by {diff.max():.3g} (seed={seed})"


def _run(backend: str, device: str, s, ptr, ocol, threshold: float, delta: float):
    # clone: the reference uses scores as its workspace
    return ops.calibrate_rows(s.clone().to(device), ptr.to(device), ocol.to(device), threshold=threshold,
                              delta=delta, backend=backend)


SIZES = [(1, 1), (1, 17), (2, 1), (3, 16), (5, 33), (17, 100), (64, 1000), (7, 5003), (40, 300)]


# Both grids run whole in the full run (CI); the fast lane keeps the cases in which every value of every
# axis occurs (tests/_ops_helpers.lane_grid).
@pytest.mark.parametrize("backend,c,n,obs,index_dtype", lane_grid(
    BACKENDS, SIZES, ["none", "random", "all", "mixed"], [torch.int32, torch.int64]))
def test_matches_float64_formula(device, seed, backend, c, n, obs, index_dtype):
    require_backend(backend, "calibrate_rows", device)
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, c, n, obs=obs, scores="mixed", index_dtype=index_dtype)
    threshold, delta = 2e-3, 1e-3
    got = _dense(c, n, *_run(backend, device, s, ptr, ocol, threshold, delta))
    val, kept, p = _formula(s, ptr, ocol, threshold, delta)
    # float32 vs float64 (scores up to ~16 apart: exp of a rounded difference): 1e-5 relative near the cut
    border = np.abs(p - threshold) <= 1e-5 * threshold
    gv, gk = got
    assert np.array_equal(gk & ~border, kept & ~border), f"{backend}: kept set differs (seed={seed})"
    both = gk & kept
    np.testing.assert_allclose(gv[both], val[both], rtol=1e-5, atol=1e-7, err_msg=f"seed={seed}")
    # observed edges exactly 1; every other value in [threshold, 1 - delta] (float32 rounding of both)
    o_rows = np.repeat(np.arange(c), np.diff(ptr.numpy()))
    assert np.all(gv[o_rows, ocol.long().numpy()] == 1.0)
    obs_mask = np.zeros((c, n), dtype=bool)
    obs_mask[o_rows, ocol.long().numpy()] = True
    other = gv[gk & ~obs_mask]
    assert np.all(other <= np.float32(1.0 - delta)) and np.all(other >= threshold * (1 - 1e-6))


@needs_cpp
@pytest.mark.parametrize("c,n,scores,obs,threshold", lane_grid(
    SIZES + [(300, 2000), (3, 63000)], ["normal", "equal", "mixed"], ["none", "random", "all", "mixed"],
    [1e-4, 2e-3, 0.3, 0.999, 5.5]))
def test_kernel_matches_reference(device, seed, c, n, scores, obs, threshold):
    """Random inputs, thresholds from keeping much to dropping everything but the observed edges."""
    require_backend("cpp", "calibrate_rows", device)
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, c, n, obs=obs, scores=scores)
    delta = 1e-4
    got = _dense(c, n, *_run("cpp", device, s, ptr, ocol, threshold, delta))
    want = _dense(c, n, *_run("reference", device, s, ptr, ocol, threshold, delta))
    _assert_close_sets(got, want, threshold, f"cpp vs reference (c={c}, n={n}, thr={threshold})", seed)
    if threshold > 1.0:  # nothing but the observed edges survives
        o_rows = np.repeat(np.arange(c), np.diff(ptr.numpy()))
        mask = np.zeros((c, n), dtype=bool)
        mask[o_rows, ocol.numpy()] = True
        assert np.array_equal(got[1], mask)


@needs_cpp
@pytest.mark.parametrize("n", [14505, 63361])
def test_kernel_matches_reference_realistic_rows(seed, n):
    """FB15k-237 / NELL-995 widths, scores spread as a trained ComplEx model's (kept ~1-5% at 2e-4)."""
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, 24, n, obs="random", scale=2.5)
    for threshold in (2e-4, 9.32e-4):
        got = _dense(24, n, *_run("cpp", "cpu", s, ptr, ocol, threshold, 1e-4))
        want = _dense(24, n, *_run("reference", "cpu", s, ptr, ocol, threshold, 1e-4))
        assert got[1].sum() > 24 * 10  # the case keeps something
        _assert_close_sets(got, want, threshold, f"n={n}, thr={threshold}", seed)


@needs_cpp
def test_kernel_row_results_do_not_depend_on_the_batch_or_threads(seed):
    """A row gets the same bits alone, in any batch and order, and with 1 or 2 threads (lazy = eager)."""
    gen = torch.Generator().manual_seed(seed)
    c, n = 37, 2049
    s, ptr, ocol = _case(gen, c, n, obs="mixed", scale=3.0)
    full = ops.calibrate_rows(s, ptr, ocol, threshold=1e-3, backend="cpp")
    bounds = np.concatenate([[0], np.cumsum(full[0].numpy())])

    def row(i: int):
        lo, hi = bounds[i], bounds[i + 1]
        return full[1][lo:hi], full[2][lo:hi]

    order = torch.randperm(c, generator=gen)[:9].tolist()
    sub_ptr = torch.tensor([0] + list(np.cumsum([int(ptr[i + 1] - ptr[i]) for i in order])), dtype=torch.int64)
    sub_cols = torch.cat([ocol[ptr[i]:ptr[i + 1]] for i in order])
    part = ops.calibrate_rows(s[order], sub_ptr, sub_cols, threshold=1e-3, backend="cpp")
    pb = np.concatenate([[0], np.cumsum(part[0].numpy())])
    for k, i in enumerate(order):
        c_i, v_i = row(i)
        assert torch.equal(part[1][pb[k]:pb[k + 1]], c_i) and torch.equal(part[2][pb[k]:pb[k + 1]], v_i)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.calibrate_rows(s, ptr, ocol, threshold=1e-3, backend="cpp")
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, full))


@needs_cpp
def test_kernel_leaves_scores_alone_and_takes_any_strides(seed):
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, 6, 50)
    before = s.clone()
    a = ops.calibrate_rows(s, ptr, ocol, threshold=1e-3, backend="cpp")
    assert torch.equal(s, before)
    big = torch.empty(50, 12)
    big[:, ::2] = s.t()
    strided = big[:, ::2].t()  # (6, 50), non-contiguous
    assert not strided.is_contiguous()
    b = ops.calibrate_rows(strided, ptr, ocol.to(torch.int32), threshold=1e-3, backend="cpp")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_cases(device, backend):
    require_backend(backend, "calibrate_rows", device)
    z64 = torch.zeros(1, dtype=torch.int64)
    # no rows
    nnz, cols, vals = ops.calibrate_rows(torch.zeros(0, 5, device=device), z64.to(device),
                                         torch.zeros(0, dtype=torch.int64, device=device), threshold=0.1,
                                         backend=backend)
    assert nnz.shape == (0,) and cols.shape == (0,) and vals.shape == (0,)
    # N = 1: softmax is 1, times k, capped at 1 - delta (or 1.0 when observed)
    s = torch.tensor([[3.0], [-2.0]], device=device)
    ptr = torch.tensor([0, 0, 2], device=device)
    nnz, cols, vals = ops.calibrate_rows(s.clone(), ptr, torch.tensor([0, 0], device=device), threshold=0.5,
                                         delta=0.25, backend=backend)
    assert nnz.tolist() == [1, 1] and cols.tolist() == [0, 0] and vals.tolist() == [0.75, 1.0]
    # equal scores: p = k / N everywhere
    s = torch.full((2, 8), 0.5, device=device)
    nnz, cols, vals = ops.calibrate_rows(s.clone(), torch.tensor([0, 0, 2], device=device),
                                         torch.tensor([1, 6], device=device), threshold=0.125, backend=backend)
    assert nnz.tolist() == [8, 8]
    assert vals[:8].tolist() == [0.125] * 8
    assert vals[8:].tolist() == [0.25, 1.0, 0.25, 0.25, 0.25, 0.25, 1.0, 0.25]
    nnz, _, vals = ops.calibrate_rows(s.clone(), torch.tensor([0, 0, 2], device=device),
                                      torch.tensor([1, 6], device=device), threshold=0.2, backend=backend)
    assert nnz.tolist() == [0, 8]  # 1/8 < 0.2 drops all of row 0
    # the module docstring's example
    nnz, cols, vals = ops.calibrate_rows(torch.tensor([[0.0, 0.0, 5.0], [1.0, 1.0, 1.0]], device=device),
                                         torch.tensor([0, 1, 1], device=device), torch.tensor([0], device=device),
                                         threshold=0.01, backend=backend)
    assert (nnz.tolist(), cols.tolist(), [round(v, 4) for v in vals.tolist()]) == \
        ([2, 3], [0, 2, 0, 1, 2], [1.0, 0.9867, 0.3333, 0.3333, 0.3333])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scores=[[1.0]]), "scores: expected a torch.Tensor"),
        (dict(scores=torch.zeros(2, 3, dtype=torch.float64)), "scores: expected a 2-D float32"),
        (dict(scores=torch.zeros(6)), "scores: expected a 2-D float32"),
        (dict(scores=torch.zeros(2, 0)), "scores: expected N >= 1"),
        (dict(obs_ptr=torch.tensor([0, 1, 2], dtype=torch.int32)), "obs_ptr: expected a 1-D int64"),
        (dict(obs_ptr=torch.tensor([0, 2])), "obs_ptr: expected c\\+1 = 3"),
        (dict(obs_ptr=torch.tensor([1, 1, 2])), "obs_ptr: must start at 0 and end at len\\(obs_cols\\) = 2"),
        (dict(obs_ptr=torch.tensor([0, 1, 3])), "obs_ptr: must start at 0"),
        (dict(obs_ptr=torch.tensor([0, 2, 1, 2]), scores=torch.zeros(3, 3)), "obs_ptr: must be non-decreasing"),
        (dict(obs_cols=torch.tensor([0.0, 1.0])), "obs_cols: expected a 1-D int32 or int64"),
        (dict(obs_cols=torch.tensor([0, 3])), "obs_cols: columns must lie in \\[0, 3\\), got 0..3"),
        (dict(obs_cols=torch.tensor([-1, 2])), "obs_cols: columns must lie in"),
        (dict(obs_cols="x"), "obs_cols: expected a torch.Tensor"),
        (dict(threshold=0.0), "threshold: expected a finite number > 0"),
        (dict(threshold=float("nan")), "threshold: expected a finite number > 0"),
        (dict(threshold="a"), "threshold/delta: expected numbers"),
        (dict(delta=1.0), "delta: expected a number in \\[0, 1\\)"),
        (dict(delta=-0.1), "delta: expected a number in \\[0, 1\\)"),
        (dict(backend="fast"), "backend: expected one of"),
    ],
)
def test_validation(kwargs, match):
    args = dict(scores=torch.zeros(2, 3), obs_ptr=torch.tensor([0, 1, 2]), obs_cols=torch.tensor([0, 2]),
                threshold=0.1, delta=1e-4)
    args.update(kwargs)
    with pytest.raises(UserError, match=match):
        ops.calibrate_rows(args.pop("scores"), args.pop("obs_ptr"), args.pop("obs_cols"), **args)


def test_validation_device_mismatch():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with pytest.raises(UserError, match="obs_ptr: is on cuda"):
        ops.calibrate_rows(torch.zeros(1, 3), torch.tensor([0, 0], device="cuda"), torch.zeros(0, dtype=torch.int64),
                           threshold=0.1)


@needs_cpp
def test_kernel_checks_what_it_relies_on():
    """The op itself (no wrapper) refuses pointers and columns that would write out of bounds."""
    f = torch.ops.kgreason.calibrate_rows
    s = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="obs_cols must lie in"):
        f(s, torch.tensor([0, 1, 1]), torch.tensor([3]), 0.1, 0.0)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        f(s, torch.tensor([0, 2, 1]), torch.tensor([0]), 0.1, 0.0)
    with pytest.raises(RuntimeError, match="obs_ptr must start at 0"):
        f(s, torch.tensor([0, 1, 1]), torch.tensor([0, 1]), 0.1, 0.0)
    with pytest.raises(RuntimeError, match="threshold must be finite"):
        f(s, torch.tensor([0, 0, 0]), torch.tensor([], dtype=torch.int64), float("inf"), 0.0)


@needs_cpp
def test_row_calibrator_backends_agree(seed):
    """kge's RowCalibrator through either backend (the reference is its former torch code)."""
    from kge.calibrate import RowCalibrator

    rng = np.random.default_rng(seed)
    n, r, d = 300, 5, 12
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64)
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64)
    obs = np.stack([rng.integers(0, n, 900), rng.integers(0, r, 900), rng.integers(0, n, 900)], 1)
    cal = RowCalibrator(ent, rel, np.unique(obs, axis=0), threshold=2e-3, device="cpu", chunk_rows=64)
    keys = np.sort(rng.choice(n * r, size=150, replace=False))
    before = ops.get_backend()
    try:
        out = {}
        for b in ("cpp", "reference"):
            ops.set_backend(b)
            out[b] = [cal.compute(keys[a:a + 64]) for a in range(0, len(keys), 64)]
    finally:
        ops.set_backend(before)
    for got, want in zip(out["cpp"], out["reference"]):
        c = len(got[0])
        g = _dense(c, n, *(torch.from_numpy(x) for x in got))
        w = _dense(c, n, *(torch.from_numpy(x) for x in want))
        _assert_close_sets(g, w, 2e-3, "RowCalibrator cpp vs reference", seed)
