"""The chunked calibration against the float64 formula, on random embeddings."""
from __future__ import annotations

import numpy as np
import pytest

from kge.calibrate import calibrate, calibrated_rows_reference, observed_row_counts


def _random_case(seed: int, n: int, r: int, d: int, n_obs: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))).astype(np.complex64) * scale
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64) * scale
    obs = np.stack([rng.integers(0, n, n_obs), rng.integers(0, r, n_obs), rng.integers(0, n, n_obs)], 1)
    obs = np.unique(obs, axis=0).astype(np.int64) if n_obs else np.zeros((0, 3), np.int64)
    return ent, rel, obs


def _assert_matches(mat, ent, rel, obs, rows, threshold, delta, atol=2e-5):
    ref = calibrated_rows_reference(ent, rel, obs, rows, threshold=threshold, delta=delta)
    got = mat[rows].toarray()
    # Entries within float32 rounding of the cut may land either side: compare elsewhere.
    n = ent.shape[0]
    border = np.zeros_like(ref, dtype=bool)
    for i, row in enumerate(rows):
        r, h = divmod(int(row), n)
        e = ent.astype(np.complex128)
        s = np.real((e[h] * rel[r].astype(np.complex128)) @ np.conj(e).T)
        p = np.exp(s - s.max())
        p = p / p.sum() * max(1, int(((obs[:, 0] == h) & (obs[:, 1] == r)).sum()))
        border[i] = np.abs(p - threshold) <= 1e-4 * threshold + 1e-9
    np.testing.assert_allclose(got[~border], ref[~border], atol=atol, rtol=1e-4)


@pytest.mark.parametrize(
    "seed,n,r,d,n_obs,chunk,scale",
    [
        (0, 50, 4, 8, 120, 7, 1.0),  # chunks that straddle relation boundaries
        (1, 37, 3, 5, 0, 1000, 1.0),  # no observed edges at all, one chunk
        (2, 64, 2, 16, 300, 64, 0.3),  # flat softmax: few entries survive
        (3, 20, 6, 4, 400, 1, 2.0),  # one row per chunk, very peaked rows, many observed
    ],
)
def test_calibrate_matches_reference(device, seed, n, r, d, n_obs, chunk, scale):
    ent, rel, obs = _random_case(seed, n, r, d, n_obs, scale)
    threshold, delta = 2e-3, 1e-3
    mat, stats = calibrate(ent, rel, obs, threshold=threshold, delta=delta, chunk_rows=chunk, device=device, progress=False)
    assert mat.shape == (r * n, n)
    assert mat.indices.dtype == np.int32 and mat.data.dtype == np.float32 and mat.indptr.dtype == np.int64
    assert stats.nnz == mat.nnz and stats.rows == r * n
    rows = np.random.default_rng(seed + 100).choice(r * n, size=min(r * n, 40), replace=False)
    _assert_matches(mat, ent, rel, obs, rows, threshold, delta)
    # indices sorted within each row, no duplicates
    for row in range(r * n):
        cols = mat.indices[mat.indptr[row] : mat.indptr[row + 1]]
        assert np.all(np.diff(cols) > 0)
    # observed edges are exactly 1, every other value is at most 1 - delta
    if len(obs):
        vals = np.asarray(mat[obs[:, 1] * n + obs[:, 0], obs[:, 2]]).ravel()
        assert np.all(vals == 1.0)
    mask = np.ones(mat.nnz, dtype=bool)
    obs_set = {(int(r_) * n + int(h), int(t)) for h, r_, t in obs}
    row_of = np.repeat(np.arange(r * n), np.diff(mat.indptr))
    mask = np.array([(int(a), int(b)) not in obs_set for a, b in zip(row_of, mat.indices)], dtype=bool)
    assert np.all(mat.data[mask] <= 1 - delta + 1e-7)
    assert np.all(mat.data[mask] >= threshold * (1 - 1e-4))


def test_calibrate_relation_subset_and_chunk_independence():
    ent, rel, obs = _random_case(5, 40, 5, 6, 100)
    full, _ = calibrate(ent, rel, obs, threshold=1e-3, chunk_rows=13, progress=False)
    full2, _ = calibrate(ent, rel, obs, threshold=1e-3, chunk_rows=4096, progress=False)
    # BLAS blocking differs with the chunk shape: values agree to float32 rounding
    assert np.array_equal(full.indptr, full2.indptr) and np.array_equal(full.indices, full2.indices)
    np.testing.assert_allclose(full.data, full2.data, rtol=1e-5)
    sub, stats = calibrate(ent, rel, obs, threshold=1e-3, relations=[3, 1], chunk_rows=9, progress=False)
    assert stats.rows == 2 * 40
    n = 40
    for r in range(5):
        block_full = full[r * n : (r + 1) * n]
        block_sub = sub[r * n : (r + 1) * n]
        if r in (1, 3):
            assert np.array_equal(block_full.indices, block_sub.indices)
            np.testing.assert_allclose(block_full.data, block_sub.data, rtol=1e-5)
        else:
            assert block_sub.nnz == 0
    with pytest.raises(IndexError):
        calibrate(ent, rel, obs, relations=[5], progress=False)


def test_calibrate_rejects_bad_parameters():
    ent, rel, obs = _random_case(6, 10, 2, 3, 5)
    with pytest.raises(ValueError, match="threshold"):
        calibrate(ent, rel, obs, threshold=0.0, progress=False)
    with pytest.raises(ValueError, match="delta"):
        calibrate(ent, rel, obs, delta=1.0, progress=False)


def test_observed_row_counts():
    obs = np.array([[0, 1, 2], [0, 1, 3], [2, 0, 1]])
    counts = observed_row_counts(obs, num_entities=4, num_relations=2)
    assert counts.shape == (8,)
    assert counts[1 * 4 + 0] == 2 and counts[0 * 4 + 2] == 1 and counts.sum() == 3


def test_max_one_factor_lets_multi_tail_rows_keep_more():
    # one head with many observed tails: the factor max(1, k) scales its probabilities up
    rng = np.random.default_rng(7)
    n, d = 30, 4
    ent = (rng.normal(size=(n, d)) * 0.1).astype(np.complex64)
    rel = np.ones((2, d), dtype=np.complex64)
    obs = np.array([[0, 0, t] for t in range(10)], dtype=np.int64)
    mat, _ = calibrate(ent, rel, obs, threshold=0.05, progress=False)
    # near-uniform softmax (1/30 < 0.05): row 0 of relation 0 keeps everything (k=10), relation 1's row 0 nothing
    assert mat[0].nnz == n
    assert np.allclose(mat[0].toarray()[0, 10:], 10 / n, rtol=0.05)
    assert mat[n].nnz == 0


def test_memory_bound_raises_threshold_exactly():
    # flat rows: many entries survive a small threshold; a tight max_nnz forces raises mid-way
    ent, rel, obs = _random_case(11, 300, 4, 4, 200, scale=0.2)
    loose, _ = calibrate(ent, rel, obs, threshold=1e-4, chunk_rows=50, progress=False)
    limit = loose.nnz // 4
    bounded, stats = calibrate(ent, rel, obs, threshold=1e-4, chunk_rows=50, progress=False, max_nnz=limit,
                               adapt_threshold=True)
    assert stats.threshold_raises and stats.threshold == stats.threshold_raises[-1] > 1e-4
    assert bounded.nnz <= limit
    # identical to a direct calibration at the final threshold
    direct, _ = calibrate(ent, rel, obs, threshold=stats.threshold, chunk_rows=50, progress=False)
    assert np.array_equal(bounded.indptr, direct.indptr) and np.array_equal(bounded.indices, direct.indices)
    np.testing.assert_allclose(bounded.data, direct.data, rtol=1e-6)
    vals = np.asarray(bounded[obs[:, 1] * 300 + obs[:, 0], obs[:, 2]]).ravel()
    assert np.all(vals == 1.0)  # observed edges survive any raise


def test_memory_bound_without_adaptation_is_an_error():
    from kgreason.errors import UserError

    ent, rel, obs = _random_case(12, 300, 2, 4, 0, scale=0.2)
    with pytest.raises(UserError, match=r"calibration at threshold 0.0001 keeps [\d,]+ entries after [\d,]+ of 600 rows"):
        calibrate(ent, rel, obs, threshold=1e-4, chunk_rows=50, progress=False, max_nnz=100)


def test_nnz_estimate_is_close():
    from kge.calibrate import estimate_nnz

    ent, rel, obs = _random_case(13, 200, 5, 6, 400, scale=0.3)
    mat, _ = calibrate(ent, rel, obs, threshold=1e-3, progress=False)
    est = estimate_nnz(ent, rel, obs, floor=1e-3, num_rows=2000)  # 1000 rows (the whole) of each stratum
    assert abs(est.nnz_at(1e-3) - mat.nnz) <= 0.05 * mat.nnz + len(obs)
    t = est.threshold_for(mat.nnz / 3)
    assert t > 1e-3 and est.nnz_at(t) <= mat.nnz / 3


@pytest.mark.parametrize("n", [7, 300])
def test_row_calibrator_small_chunks_equal_large_chunk_bitwise(seed, n):
    """A chunk of a few rows (BLAS's gemv / small-M paths sum in another order), or any chunk of a KG with
    very few entities (narrow-output paths), gives the same floats as the same rows inside a large
    chunk: lazy rows equal eager rows bit for bit."""
    import torch

    from kge.calibrate import RowCalibrator

    rng = np.random.default_rng(seed)
    r, d = 5, 24
    ent = ((rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))) * 0.8).astype(np.complex64)
    rel = (rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))).astype(np.complex64)
    obs = np.unique(np.stack([rng.integers(0, n, 900), rng.integers(0, r, 900), rng.integers(0, n, 900)], 1), axis=0)
    cal = RowCalibrator(ent, rel, obs, threshold=1e-3, device="cpu")
    keys = rng.permutation(n * r)[:512].astype(np.int64)  # n = 7: all 35 rows
    for threads in sorted({1, torch.get_num_threads()}):  # eager and lazy share a process: one setting each
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            big_nnz, big_cols, big_vals = cal.compute(keys)
            starts = np.concatenate([[0], np.cumsum(big_nnz)])
            for c in list(range(1, 20)) + [33]:
                lo = int(rng.integers(0, len(keys) - c))
                nnz, cols, vals = cal.compute(keys[lo:lo + c])
                assert np.array_equal(nnz, big_nnz[lo:lo + c]), (c, threads, seed)
                a, b = starts[lo], starts[lo + c]
                assert np.array_equal(cols, big_cols[a:b]) and np.array_equal(vals, big_vals[a:b]), (c, threads, seed)
        finally:
            torch.set_num_threads(old)
