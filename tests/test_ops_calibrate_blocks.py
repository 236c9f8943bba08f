"""ops.calibrate_row_stats and ops.calibrate_rows_normalised: calibrate_rows split by column blocks.

A row split into blocks (a sharded lazy artifact's ranks, engine.exec.sharded_lazy): each block's (max, sum exp)
from calibrate_row_stats, merged as a log-sum-exp into the row's normaliser (M, k / Z), then each block's entries
from calibrate_rows_normalised.  The kernels against their torch references (values within 1e-6, kept sets equal
but for entries within 1e-6 of the threshold), the blocks together against calibrate_rows on the whole row, and
one block (the whole row) bit for bit against calibrate_rows.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_ops_calibrate_rows import _assert_close_sets, _case, _dense

import ops
from _ops_helpers import BACKENDS, lane_grid, require_backend
from kgreason.errors import UserError

CPP = ops.extension_available() and ops.has_kernel("calibrate_rows_normalised", "cpu")
needs_cpp = pytest.mark.skipif(not CPP, reason="compiled extension ops._C (calibrate_rows_normalised) not built")

SIZES = [(1, 1), (2, 17), (5, 33), (17, 100), (40, 300), (7, 5003), (3, 0), (0, 9)]


def _stats_f64(s: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    x = s.double().numpy()
    if x.shape[1] == 0:
        return np.full(len(x), -np.inf), np.zeros(len(x))
    m = x.max(axis=1)
    return m, np.exp(x - m[:, None]).sum(axis=1)


@pytest.mark.parametrize("backend,c,n,scores", lane_grid(BACKENDS, SIZES, ["normal", "equal", "mixed"]))
def test_row_stats_match_the_float64_formula(device, seed, backend, c, n, scores):
    require_backend(backend, "calibrate_row_stats", device)
    gen = torch.Generator().manual_seed(seed)
    s, _, _ = _case(gen, c, n, obs="none", scores=scores)
    before = s.clone()
    m, z = ops.calibrate_row_stats(s.to(device), backend=backend)
    assert m.dtype == torch.float32 and z.dtype == torch.float64 and m.shape == z.shape == (c,)
    assert torch.equal(s, before)  # read only
    want_m, want_z = _stats_f64(s)
    assert np.array_equal(m.cpu().numpy().astype(np.float64), want_m)  # a max is exact
    np.testing.assert_allclose(z.cpu().numpy(), want_z, rtol=1e-6, err_msg=f"seed={seed}")


def _blocks(n: int, parts: int, gen: torch.Generator) -> list[int]:
    """Column bounds of ``parts`` blocks of [0, n), random cuts (empty blocks allowed)."""
    cuts = sorted(torch.randint(0, n + 1, (parts - 1,), generator=gen).tolist())
    return [0, *cuts, n]


def _split(s, ptr, ocol, threshold: float, delta: float, bounds: list[int], backend: str, device: str):
    """calibrate_rows of the whole rows, by blocks: stats per block, merged (float64 log-sum-exp, float32 k / Z, as
    engine.exec.sharded_lazy merges them), then each block's entries; returned as the whole rows' CSR pieces."""
    c = s.shape[0]
    counts = np.diff(ptr.numpy())
    rows = np.repeat(np.arange(c), counts)
    cols = ocol.long().numpy()
    stats = [ops.calibrate_row_stats(s[:, a:b].contiguous().to(device), backend=backend)
             for a, b in zip(bounds, bounds[1:])]
    ms = np.stack([m.cpu().numpy().astype(np.float64) for m, _ in stats])
    zs = np.stack([z.cpu().numpy() for _, z in stats])
    big_m = ms.max(axis=0)
    with np.errstate(invalid="ignore"):
        z = np.where(zs > 0, zs * np.exp(ms - big_m), 0.0).sum(axis=0)
    k = np.maximum(1, counts).astype(np.float32)
    row_max = torch.from_numpy(big_m.astype(np.float32))
    row_scale = torch.from_numpy(k / z.astype(np.float32))
    per_row: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(c)]
    for a, b in zip(bounds, bounds[1:]):
        here = (cols >= a) & (cols < b)
        bptr = torch.zeros(c + 1, dtype=torch.int64)
        torch.cumsum(torch.from_numpy(np.bincount(rows[here], minlength=c)), 0, out=bptr[1:])
        bcols = torch.from_numpy(cols[here] - a).to(ocol.dtype)
        nnz, cc, vv = ops.calibrate_rows_normalised(
            s[:, a:b].clone().to(device), row_max.to(device), row_scale.to(device), bptr.to(device), bcols.to(device),
            threshold=threshold, delta=delta, backend=backend)
        off = np.concatenate([[0], np.cumsum(nnz.cpu().numpy())])
        for i in range(c):
            per_row[i].append((cc.cpu().numpy()[off[i]:off[i + 1]] + a, vv.cpu().numpy()[off[i]:off[i + 1]]))
    nnz = torch.tensor([sum(len(x) for x, _ in r) for r in per_row], dtype=torch.int64)
    out_c = [x for r in per_row for x, _ in r]
    out_v = [v for r in per_row for _, v in r]
    return (nnz, torch.from_numpy(np.concatenate(out_c).astype(np.int32) if out_c else np.zeros(0, np.int32)),
            torch.from_numpy(np.concatenate(out_v).astype(np.float32) if out_v else np.zeros(0, np.float32)))


@pytest.mark.parametrize("backend,c,n,obs,parts", lane_grid(
    BACKENDS, [(1, 17), (5, 33), (17, 100), (40, 300), (7, 5003)], ["none", "random", "all", "mixed"], [2, 3, 5]))
def test_blocks_give_the_whole_rows(device, seed, backend, c, n, obs, parts):
    """Blocks at random cuts (some empty), normalised from outside: calibrate_rows' rows within 1e-6."""
    require_backend(backend, "calibrate_rows_normalised", device)
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, c, n, obs=obs, scores="mixed")
    bounds = _blocks(n, parts, gen)
    for threshold in (1e-4, 2e-3, 0.3):
        whole = _dense(c, n, *ops.calibrate_rows(s.clone().to(device), ptr.to(device), ocol.to(device),
                                                  threshold=threshold, delta=1e-4, backend=backend))
        split = _dense(c, n, *_split(s, ptr, ocol, threshold, 1e-4, bounds, backend, device))
        _assert_close_sets(split, whole, threshold, f"{parts} blocks {bounds} vs whole rows (thr={threshold})", seed)


@needs_cpp
def test_one_block_is_calibrate_rows_bit_for_bit(seed):
    """The whole row as one block: the same bits as calibrate_rows (the same max, sums, exp and threshold test)."""
    gen = torch.Generator().manual_seed(seed)
    for c, n in ((9, 1031), (40, 300), (3, 14505)):
        s, ptr, ocol = _case(gen, c, n, obs="mixed", scale=3.0)
        for threshold in (2e-4, 1e-2):
            want = ops.calibrate_rows(s, ptr, ocol, threshold=threshold, backend="cpp")
            got = _split(s, ptr, ocol, threshold, 1e-4, [0, n], "cpp", "cpu")
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"c={c}, n={n}, thr={threshold}, seed={seed}"


@needs_cpp
@pytest.mark.parametrize("c,n,obs,threshold", lane_grid(
    SIZES, ["none", "random", "all", "mixed"], [1e-4, 2e-3, 0.3, 5.5]))
def test_normalised_kernel_matches_reference(seed, c, n, obs, threshold):
    """Random outside normalisers (a row max above the block's: other blocks' scores), scales from k / Z."""
    gen = torch.Generator().manual_seed(seed)
    s, ptr, ocol = _case(gen, c, max(n, 1), obs=obs)
    s = s[:, :n].contiguous()
    if n == 0:
        ptr, ocol = torch.zeros(c + 1, dtype=torch.int64), ocol[:0]
    own = s.amax(dim=1) if n else torch.zeros(c)
    row_max = own + torch.rand(c, generator=gen) * 3 * (torch.rand(c, generator=gen) < 0.5)
    row_scale = torch.rand(c, generator=gen) * 2 + 1e-3
    got, want = (_dense(c, n, *ops.calibrate_rows_normalised(s.clone(), row_max, row_scale, ptr, ocol,
                                                             threshold=threshold, backend=b)) for b in BACKENDS)
    _assert_close_sets(got, want, threshold, f"cpp vs reference (c={c}, n={n}, thr={threshold})", seed)
    o_rows = np.repeat(np.arange(c), np.diff(ptr.numpy()))
    mask = np.zeros((c, n), dtype=bool)
    mask[o_rows, ocol.long().numpy()] = True
    assert np.all(got[0][mask] == 1.0) and np.all(got[1][mask])  # observed: always kept, exactly 1
    if threshold > 1.0:
        assert np.array_equal(got[1], mask)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalised_edge_cases(device, backend):
    require_backend(backend, "calibrate_rows_normalised", device)
    t = lambda *a, **k: torch.tensor(*a, **k).to(device)  # noqa: E731
    f = lambda s, m, k, p, o, **kw: ops.calibrate_rows_normalised(  # noqa: E731
        t(s, dtype=torch.float32), t(m, dtype=torch.float32), t(k, dtype=torch.float32), t(p), t(o, dtype=torch.int64),
        backend=backend, **kw)
    # no rows; a zero-width block (its rows keep nothing)
    nnz, cols, vals = ops.calibrate_rows_normalised(torch.zeros(0, 4, device=device), t([]), t([]), t([0]),
                                                    t([], dtype=torch.int64), threshold=0.1, backend=backend)
    assert nnz.shape == cols.shape == vals.shape == (0,)
    nnz, cols, vals = ops.calibrate_rows_normalised(
        torch.zeros(3, 0, device=device), t([1.0, 2.0, 3.0]), t([0.5, 0.5, 0.5]), t([0, 0, 0, 0]),
        t([], dtype=torch.int64), threshold=0.1, backend=backend)
    assert nnz.tolist() == [0, 0, 0] and cols.numel() == vals.numel() == 0
    # ties at the threshold: equal scores at the row max, scale 1/8: p = 0.125 exactly, kept at threshold 0.125
    nnz, cols, vals = f([[0.5] * 8], [0.5], [0.125], [0, 0], [], threshold=0.125)
    assert nnz.tolist() == [8] and vals.tolist() == [0.125] * 8
    nnz, _, _ = f([[0.5] * 8], [0.5], [0.125], [0, 0], [], threshold=float(np.nextafter(np.float32(0.125), 1)))
    assert nnz.tolist() == [0]
    # every column observed: all exactly 1; the cap applies to the rest; row max above the block's
    nnz, cols, vals = f([[1.0, 2.0, 3.0], [9.0, 0.0, 0.0]], [3.0, 10.0], [1.0, 2.0], [0, 3, 3], [2, 0, 1],
                        threshold=1e-5, delta=0.25)
    assert nnz.tolist() == [3, 3] and cols.tolist() == [0, 1, 2, 0, 1, 2]
    e = math.exp
    np.testing.assert_allclose(vals.cpu().numpy(), [1.0, 1.0, 1.0, 2 * e(-1.0), 2 * e(-10.0), 2 * e(-10.0)], rtol=1e-6)
    nnz, _, vals = f([[9.0, 0.0]], [9.0], [2.0], [0, 0], [], threshold=1e-5, delta=0.25)
    assert vals.tolist()[0] == 0.75  # capped


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scores=torch.zeros(2, 3, dtype=torch.float64)), "scores: expected a 2-D float32"),
        (dict(row_max=[0.0, 0.0]), "row_max: expected a torch.Tensor"),
        (dict(row_max=torch.zeros(2, dtype=torch.float64)), "row_max: expected a 1-D float32"),
        (dict(row_max=torch.zeros(3)), "row_max: expected c = 2 entries"),
        (dict(row_max=torch.tensor([0.0, math.inf])), "row_max: expected finite values"),
        (dict(row_scale=torch.zeros(1, 2)), "row_scale: expected a 1-D float32"),
        (dict(row_scale=torch.tensor([1.0, 0.0])), "row_scale: expected finite values > 0"),
        (dict(row_scale=torch.tensor([math.nan, 1.0])), "row_scale: expected finite values > 0"),
        (dict(obs_ptr=torch.tensor([0, 2])), "obs_ptr: expected c\\+1 = 3"),
        (dict(obs_cols=torch.tensor([0, 3])), "obs_cols: columns must lie in \\[0, 3\\)"),
        (dict(threshold=0.0), "threshold: expected a finite number > 0"),
        (dict(delta=1.0), "delta: expected a number in \\[0, 1\\)"),
        (dict(backend="fast"), "backend: expected one of"),
    ],
)
def test_normalised_validation(kwargs, match):
    args = dict(scores=torch.zeros(2, 3), row_max=torch.zeros(2), row_scale=torch.ones(2),
                obs_ptr=torch.tensor([0, 1, 2]), obs_cols=torch.tensor([0, 2]), threshold=0.1, delta=1e-4)
    args.update(kwargs)
    pos = [args.pop(k) for k in ("scores", "row_max", "row_scale", "obs_ptr", "obs_cols")]
    with pytest.raises(UserError, match=match):
        ops.calibrate_rows_normalised(*pos, **args)


def test_stats_validation():
    with pytest.raises(UserError, match="scores: expected a 2-D float32"):
        ops.calibrate_row_stats(torch.zeros(4))
    with pytest.raises(UserError, match="scores: expected a torch.Tensor"):
        ops.calibrate_row_stats([[1.0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_max_below_the_scores_is_an_error(backend):
    """The outside max must be the row's (every block's) max: one far below it is refused, naming the row; float32
    rounding of a recomputed block (1e-4 relative) is not."""
    require_backend(backend, "calibrate_rows_normalised", "cpu")
    s = torch.tensor([[0.0, 1.0], [5.0, 2.0]])
    ptr, ocol = torch.tensor([0, 0, 0]), torch.zeros(0, dtype=torch.int64)
    err = UserError if backend == "reference" else RuntimeError
    with pytest.raises(err, match="row 1: .*below the row's largest score"):
        ops.calibrate_rows_normalised(s.clone(), torch.tensor([1.0, 4.0]), torch.ones(2), ptr, ocol, threshold=0.1,
                                      backend=backend)
    nnz, _, vals = ops.calibrate_rows_normalised(s.clone(), torch.tensor([1.0, 5.0 * (1 - 1e-6)]), torch.ones(2), ptr,
                                                 ocol, threshold=0.01, delta=0.25, backend=backend)
    assert nnz.tolist() == [2, 2] and vals.max() == 0.75
