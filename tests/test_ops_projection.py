"""Projection kernels (push / pull / auto, plain and negated) against the reference and brute force."""
from __future__ import annotations

import pytest
import torch

import ops
from _ops_helpers import (
    BACKENDS, dense_negation_factor, dense_project, lane_grid, random_batch, random_matrix, require_backend,
)
from kgreason.constants import QTO_NEG_SCALE

CPP = ops.extension_available()
needs_cpp = pytest.mark.skipif(not CPP, reason="compiled extension ops._C not built")
STRATS = ["push", "pull", "auto"]


def _check_equal(got, want, what: str, seed: int):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)} (seed={seed})"
    if not torch.equal(got.cpu(), want.cpu()):
        diff = (got.cpu() != want.cpu()).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: differs at {diff} (seed={seed})")


# The grids below run whole in the full run (CI); the fast lane keeps the cases in which every value of
# every axis occurs (tests/_ops_helpers.lane_grid), beside test_ops_project.py's grid over the same kernel.
@pytest.mark.parametrize("backend,strategy,index_dtype,n,b,density,kind", lane_grid(
    BACKENDS, STRATS, [torch.int32, torch.int64],
    [(1, 1, 1.0), (7, 3, 0.3), (64, 1, 0.05), (150, 17, 0.02), (257, 40, 0.1)], ["onehot", "sparse", "dense", "zeros"]))
def test_project_matches_brute_force(device, seed, backend, strategy, index_dtype, n, b, density, kind):
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    m, d = random_matrix(n, density, gen, index_dtype=index_dtype, empty_rows=n // 5, empty_cols=n // 5)
    x = random_batch(b, n, kind, gen)
    y_ref, a_ref = dense_project(x, d)
    prep = ops.prepare_matrices(m.to(device))
    y, a = ops.project(x.to(device), prep, return_argmax=True, strategy=strategy, backend=backend)
    _check_equal(y, y_ref, f"Y {backend}/{strategy}", seed)
    _check_equal(a, a_ref, f"argmax {backend}/{strategy}", seed)
    y2 = ops.project(x.to(device), m.to(device), strategy=strategy, backend=backend)  # raw CSR, no argmax
    _check_equal(y2, y_ref, f"Y (raw CSR, no argmax) {backend}/{strategy}", seed)


@needs_cpp
@pytest.mark.parametrize("strategy,b,kind", lane_grid(STRATS, [1, 2, 5, 9, 16, 33], ["onehot", "sparse", "dense"]))
def test_kernels_equal_reference_larger(device, seed, strategy, b, kind):
    """Bigger random inputs (every tile width, ragged last tile) where brute force would be slow."""
    require_backend("cpp", "project", device)
    gen = torch.Generator().manual_seed(seed)
    n = 1200
    m, _ = random_matrix(n, 0.01, gen, empty_rows=50, empty_cols=50)
    x = random_batch(b, n, kind, gen).to(device)
    prep = ops.prepare_matrices(m.to(device))
    y_ref, a_ref = ops.project(x, prep, return_argmax=True, backend="reference")
    y, a = ops.project(x, prep, return_argmax=True, strategy=strategy, backend="cpp")
    _check_equal(y, y_ref, f"Y {strategy}", seed)
    _check_equal(a, a_ref, f"argmax {strategy}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_argmax_ties_deterministic(device, seed, backend, strategy, index_dtype):
    """Values from {0.25, 0.5, 1} and X from {0, 0.5, 1} make many exact ties: smallest i wins everywhere."""
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    n, b = 90, 21
    m, d = random_matrix(n, 0.2, gen, index_dtype=index_dtype, ties=True)
    x = random_batch(b, n, "dense", gen, ties=True)
    y_ref, a_ref = dense_project(x, d)
    prep = ops.prepare_matrices(m.to(device))
    for _ in range(2):  # same answer on repeated calls (no thread-order dependence)
        y, a = ops.project(x.to(device), prep, return_argmax=True, strategy=strategy, backend=backend)
        _check_equal(y, y_ref, f"Y {backend}/{strategy}", seed)
        _check_equal(a, a_ref, f"argmax {backend}/{strategy}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("strategy", STRATS)
def test_non_contiguous_and_empty_batch(device, seed, backend, strategy):
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    n = 40
    m, d = random_matrix(n, 0.1, gen)
    big = torch.rand(2 * n, 12, generator=gen)
    x = big[::2].t()  # (12, n), non-contiguous
    assert not x.is_contiguous()
    y_ref, a_ref = dense_project(x.contiguous(), d)
    prep = ops.prepare_matrices(m.to(device))
    y, a = ops.project(x.to(device), prep, return_argmax=True, strategy=strategy, backend=backend)
    _check_equal(y, y_ref, f"Y {backend}/{strategy}", seed)
    _check_equal(a, a_ref, f"argmax {backend}/{strategy}", seed)
    y0, a0 = ops.project(torch.zeros(0, n, device=device), prep, return_argmax=True, strategy=strategy,
                         backend=backend)
    assert y0.shape == (0, n) and a0.shape == (0, n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_matrix(device, backend):
    require_backend(backend, "project", device)
    require_backend(backend, "project", device)
    n = 10
    m = torch.sparse_csr_tensor(torch.zeros(n + 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                                torch.zeros(0), size=(n, n), check_invariants=True).to(device)
    x = torch.rand(3, n, device=device)
    y, a = ops.project(x, m, return_argmax=True, backend=backend)
    assert torch.equal(y.cpu(), torch.zeros(3, n)) and torch.equal(a.cpu(), torch.full((3, n), -1, dtype=torch.int32))
    y, a = ops.project(x, m, negate=True, return_argmax=True, backend=backend)  # factor 1 everywhere
    best = x.cpu().max(dim=1)
    assert torch.equal(y.cpu(), best.values[:, None].expand(3, n))


@needs_cpp
def test_auto_strategy_choice():
    gen = torch.Generator().manual_seed(0)
    n = 2000
    m, _ = random_matrix(n, 0.01, gen)
    prep = ops.prepare_matrices(m)
    assert ops.choose_strategy(random_batch(64, n, "onehot", gen), prep) == "push"
    assert ops.choose_strategy(random_batch(64, n, "dense", gen), prep) == "pull"


@pytest.mark.parametrize("backend,index_dtype,n,b,density,kind,neg_scale", lane_grid(
    BACKENDS, [torch.int32, torch.int64], [(1, 1, 1.0), (30, 4, 0.2), (120, 19, 0.05), (200, 1, 0.5)],
    ["onehot", "sparse", "dense", "zeros", "ones"], [3.0, 0.7]))
def test_project_negated_matches_dense_formula(device, seed, backend, index_dtype, n, b, density, kind, neg_scale):
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    m, d = random_matrix(n, density, gen, index_dtype=index_dtype, empty_rows=n // 6, empty_cols=n // 6)
    x = random_batch(b, n, kind, gen)
    y_ref, a_ref = dense_project(x, dense_negation_factor(d, neg_scale))
    prep = ops.prepare_matrices(m.to(device))
    y, a = ops.project(x.to(device), prep, negate=True, neg_scale=neg_scale, return_argmax=True, backend=backend)
    _check_equal(y, y_ref, f"negated Y {backend}", seed)
    _check_equal(a, a_ref, f"negated argmax {backend}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("neg_scale", [QTO_NEG_SCALE, 1.0])
def test_project_negated_ties_and_full_support(device, seed, backend, neg_scale):
    """Ties, a column whose support is every row, and columns holding the 40 largest X entries
    (more than the kernels' 32-entry top list, forcing their full-row fallback)."""
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    n, b = 100, 6
    _, d = random_matrix(n, 0.1, gen, ties=True)
    d[:, 3] = 0.25  # full support
    d[:40, 5] = 1.0  # 40 rows, factor 0 with neg_scale >= 1
    d[:40, 6] = 0.1
    x = random_batch(b, n, "dense", gen, ties=True)
    x[:, :40] = 0.9 + 0.002 * torch.arange(40)  # the 40 largest entries: entities 0..39
    x[2, :40] = 1.0  # ties among the largest
    x[4] = 0.0
    x[4, :40] = 0.5  # every positive entry inside column 5's support
    m = d.to_sparse_csr()
    y_ref, a_ref = dense_project(x, dense_negation_factor(d, neg_scale))
    prep = ops.prepare_matrices(m.to(device))
    y, a = ops.project(x.to(device), prep, negate=True, neg_scale=neg_scale, return_argmax=True, backend=backend)
    _check_equal(y, y_ref, f"negated Y {backend} s={neg_scale}", seed)
    _check_equal(a, a_ref, f"negated argmax {backend} s={neg_scale}", seed)


@needs_cpp
@pytest.mark.parametrize("b,kind", lane_grid([1, 3, 8, 20], ["onehot", "sparse", "dense"]))
def test_project_negated_kernel_equals_reference_larger(device, seed, b, kind):
    require_backend("cpp", "project", device)
    gen = torch.Generator().manual_seed(seed)
    n = 900
    m, _ = random_matrix(n, 0.02, gen, empty_rows=30, empty_cols=30)
    prep = ops.prepare_matrices(m.to(device))
    x = random_batch(b, n, kind, gen).to(device)
    y_ref, a_ref = ops.project(x, prep, negate=True, return_argmax=True, backend="reference")
    y, a = ops.project(x, prep, negate=True, return_argmax=True, backend="cpp")
    _check_equal(y, y_ref, f"negated Y {kind}", seed)
    _check_equal(a, a_ref, f"negated argmax {kind}", seed)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_prepare_transpose(seed, index_dtype):
    gen = torch.Generator().manual_seed(seed)
    m, d = random_matrix(77, 0.1, gen, index_dtype=index_dtype, empty_rows=5, empty_cols=5)
    p = ops.prepare_matrices(m)
    assert p.index_dtype == index_dtype and p.ccol.dtype == index_dtype and p.row.dtype == index_dtype
    assert ops.prepare_matrices(p) is p
    dense_t = torch.sparse_csr_tensor(p.ccol, p.row, p.tval, size=(77, 77), check_invariants=True).to_dense()
    assert torch.equal(dense_t, d.t()), f"CSC is not the transpose (seed={seed})"
    cols = p.col_indices_csc()
    key = cols * 77 + p.row.long()
    assert bool((key[1:] > key[:-1]).all()), "rows must ascend inside each column"
    assert torch.equal(p.to_sparse_csr().to_dense(), d)


