"""ops.project with ``rel`` (every row through its own relation of a stacked matrix; the former
ops.project_multi) against brute force, the pure-torch reference, and a per-relation loop of ops.project."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import ops
from _ops_helpers import (
    BACKENDS, dense_negation_factor, dense_project, lane_grid, random_batch, random_matrix, require_backend,
)
from kgreason.constants import QTO_NEG_SCALE
from ops import SWEEP, StackedMatrices

# torch warns once per process that sparse CSR tensors are "beta" when a test builds one; only a note
pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")

CPP = ops.has_kernel("project", "cpu")
needs_cpp = pytest.mark.skipif(not CPP, reason="compiled extension ops._C (with project) not built")
STRATS = ["push", "pull", "auto"]
NEG_SCALE = QTO_NEG_SCALE
# (pointer dtype, column dtype): the artifact's stack is int64 / int32
INDEX_DTYPES = [(torch.int32, torch.int32), (torch.int64, torch.int32), (torch.int64, torch.int64),
                (torch.int32, torch.int64)]


def _backends(device: str) -> list[str]:
    return ["reference"] + (["cpp"] if ops.has_kernel("project", device) else [])


def _check_equal(got, want, what: str, seed: int):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)} (seed={seed})"
    if not torch.equal(got.cpu(), want.cpu()):
        diff = (got.cpu() != want.cpu()).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: differs at {diff} (seed={seed})")


def random_stack(r: int, n: int, density: float, gen: torch.Generator, *, ptr_dtype=torch.int64,
                 idx_dtype=torch.int32, ties: bool = False, empty_relations: int = 0):
    """(StackedMatrices, [dense M_0 .. M_{R-1}]) with empty rows and columns in every relation."""
    dense = []
    for k in range(r):
        _, d = random_matrix(n, density, gen, ties=ties, empty_rows=n // 5, empty_cols=n // 5)
        dense.append(torch.zeros(n, n) if k < empty_relations else d)
    perm = torch.randperm(r, generator=gen).tolist()  # the empty relations anywhere in the stack
    dense = [dense[p] for p in perm]
    m = torch.cat(dense).to_sparse_csr()
    parts = (m.crow_indices().to(ptr_dtype).clone(), m.col_indices().to(idx_dtype).clone(), m.values().clone())
    stack = ops.prepare_matrices(parts, num_entities=n)
    return stack, dense


def mixed_batch(b: int, n: int, gen: torch.Generator, *, ties: bool = False) -> torch.Tensor:
    """Rows of every kind in one batch (one-hot, ~2% active, dense, all-zero), shuffled."""
    kinds = ["onehot", "sparse", "dense", "zeros"]
    rows = [random_batch(1, n, kinds[k % 4], gen, ties=ties) for k in range(b)]
    x = torch.cat(rows) if rows else torch.zeros(0, n)
    return x[torch.randperm(b, generator=gen)] if b else x


def brute_force(x, rel, dense, negated: bool, neg_scale: float = NEG_SCALE):
    ys, as_ = [], []
    factors = {}  # per relation, computed once
    for b in range(x.shape[0]):
        r = int(rel[b])
        if r not in factors:
            factors[r] = dense_negation_factor(dense[r], neg_scale) if negated else dense[r]
        y, a = dense_project(x[b : b + 1], factors[r])
        ys.append(y)
        as_.append(a)
    n = x.shape[1]
    if not ys:
        return torch.zeros(0, n), torch.full((0, n), -1, dtype=torch.int32)
    return torch.cat(ys), torch.cat(as_)


def _rels(b: int, r: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    if mode == "equal":
        return torch.full((b,), int(torch.randint(0, r, (1,), generator=gen)), dtype=torch.int64)
    return torch.randint(0, r, (b,), generator=gen)


# 576 cases in the full run; the fast lane keeps the 6 in which every value of every axis occurs
# (tests/_ops_helpers.lane_grid), beside test_ops_project.py::test_project_matches_brute_force, the fold's
# own grid over the same kernel (sizes, strategies, negate, index dtypes, mixed relations: all in the fast lane).
@pytest.mark.parametrize("backend,strategy,ptr_dtype,idx_dtype,negated,rel_mode,n,b,r,density", lane_grid(
    BACKENDS, STRATS, INDEX_DTYPES, [False, True], ["mixed", "equal"],
    [(1, 1, 1, 1.0), (1, 4, 3, 1.0), (7, 5, 3, 0.3), (64, 0, 2, 0.05), (50, 40, 5, 0.1), (130, 70, 4, 0.03)]))
def test_matches_brute_force(device, seed, backend, strategy, ptr_dtype, idx_dtype, negated, rel_mode, n, b, r,
                             density):
    require_backend(backend, "project", device)
    gen = torch.Generator().manual_seed(seed)
    stack, dense = random_stack(r, n, density, gen, ptr_dtype=ptr_dtype, idx_dtype=idx_dtype,
                                empty_relations=1 if r > 2 else 0)
    x = mixed_batch(b, n, gen)
    rel = _rels(b, r, rel_mode, gen)
    y_ref, a_ref = brute_force(x, rel, dense, negated)
    s = stack.to(device)
    y, a = ops.project(x.to(device), s, rel.to(device), negate=negated, neg_scale=NEG_SCALE, return_argmax=True,
                       strategy=strategy, backend=backend)
    _check_equal(y, y_ref, "Y", seed)
    _check_equal(a, a_ref, "argmax", seed)
    y2 = ops.project(x.to(device), s, rel.to(torch.int32).to(device), negate=negated, neg_scale=NEG_SCALE,
                     strategy=strategy, backend=backend)  # int32 ids, no argmax
    _check_equal(y2, y_ref, "Y (int32 ids, no argmax)", seed)


@needs_cpp
@pytest.mark.parametrize("negated,rel_mode,b", lane_grid([False, True], ["mixed", "equal", "few"], [1, 17, 40, 130]))
def test_kernel_equals_reference_larger(seed, negated, rel_mode, b):
    """Bigger inputs, where tiles of 16 and 32 rows and ragged last tiles occur, against the reference."""
    gen = torch.Generator().manual_seed(seed)
    n, r = 1200, 6
    stack, _ = random_stack(r, n, 0.01, gen, empty_relations=1)
    x = mixed_batch(b, n, gen)
    if rel_mode == "few":
        rel = torch.randint(0, 2, (b,), generator=gen)
    else:
        rel = _rels(b, r, rel_mode, gen)
    y_ref, a_ref = ops.project(x, stack, rel, negate=negated, neg_scale=NEG_SCALE, return_argmax=True,
                               backend="reference")
    for strategy in STRATS:
        y, a = ops.project(x, stack, rel, negate=negated, neg_scale=NEG_SCALE, return_argmax=True,
                           strategy=strategy, backend="cpp")
        _check_equal(y, y_ref, f"Y {strategy}", seed)
        _check_equal(a, a_ref, f"argmax {strategy}", seed)
        y2 = ops.project(x, stack, rel, negate=negated, neg_scale=NEG_SCALE, strategy=strategy, backend="cpp")
        _check_equal(y2, y_ref, f"Y (no argmax) {strategy}", seed)


def per_relation_loop(x, rel, stack: StackedMatrices, negated: bool, backend: str, neg_scale: float = NEG_SCALE):
    """The executor's semantics before the multi-relation kernel: one single-matrix ops.project call per distinct
    relation."""
    y = torch.empty_like(x)
    a = torch.empty(x.shape, dtype=torch.int32)
    for r in rel.unique().tolist():
        rows = (rel == r).nonzero().squeeze(1)
        m = stack.relation(r)
        if negated:
            yr, ar = ops.project(x[rows], m, negate=True, neg_scale=neg_scale, return_argmax=True, backend=backend)
        else:
            yr, ar = ops.project(x[rows], m, return_argmax=True, backend=backend)
        y[rows], a[rows] = yr, ar
    return y, a


@pytest.mark.parametrize("negated", [False, True], ids=["plain", "negated"])
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_equals_per_relation_loop(seed, negated, ties):
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 300, 7, 90
    stack, _ = random_stack(r, n, 0.04, gen, ties=ties, empty_relations=1)
    x = mixed_batch(b, n, gen, ties=ties)
    rel = torch.randint(0, r, (b,), generator=gen)
    # s = 0.5: in-support factors {0.875, 0.75, 0.5} for the tie values, so in-support products
    # tie with out-of-support values (1 * 0.5 = 0.5) instead of always losing to them
    s = 0.5 if ties else NEG_SCALE
    backend = "cpp" if CPP else "reference"
    y_loop, a_loop = per_relation_loop(x, rel, stack, negated, backend, neg_scale=s)
    for be in _backends("cpu"):
        for strategy in STRATS:
            y, a = ops.project(x, stack, rel, negate=negated, neg_scale=s, return_argmax=True,
                               strategy=strategy, backend=be)
            _check_equal(y, y_loop, f"Y {be}/{strategy}", seed)
            _check_equal(a, a_loop, f"argmax {be}/{strategy}", seed)


@pytest.mark.parametrize("negated", [False, True], ids=["plain", "negated"])
def test_argmax_ties_deterministic(device, seed, negated):
    """Values from {0.25, 0.5, 1} and X from {0, 0.5, 1}: many exact ties, the smallest i wins everywhere.

    Negated with s = 0.5: in-support factors {0.875, 0.75, 0.5}, so in-support products tie with each other
    and with out-of-support values (1 * 0.5 = 0.5); sparse rows make in-support maxima win often."""
    gen = torch.Generator().manual_seed(seed)
    n, b, r = 90, 37, 3
    stack, dense = random_stack(r, n, 0.2, gen, ties=True)
    x = torch.cat([random_batch(b - b // 2, n, "dense", gen, ties=True),
                   random_batch(b // 2, n, "sparse", gen, ties=True)])
    rel = torch.randint(0, r, (b,), generator=gen)
    neg_scale = 0.5
    y_ref, a_ref = brute_force(x, rel, dense, negated, neg_scale)
    s = stack.to(device)
    for backend in _backends(device):
        for strategy in STRATS:
            for _ in range(2):  # the same answer on repeated calls (no thread-order dependence)
                y, a = ops.project(x.to(device), s, rel.to(device), negate=negated, neg_scale=neg_scale,
                                   return_argmax=True, strategy=strategy, backend=backend)
                _check_equal(y, y_ref, f"Y {backend}/{strategy}", seed)
                _check_equal(a, a_ref, f"argmax {backend}/{strategy}", seed)


@needs_cpp
@pytest.mark.parametrize("negated", [False, True], ids=["plain", "negated"])
def test_pull_in_waves(monkeypatch, seed, negated):
    """A tile budget smaller than one tile puts every tile in its own wave (the path of huge batches)."""
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 400, 3, 150
    stack, _ = random_stack(r, n, 0.05, gen)
    x = random_batch(b, n, "dense", gen)
    rel = torch.randint(0, r, (b,), generator=gen)
    y_ref, a_ref = ops.project(x, stack, rel, negate=negated, return_argmax=True, backend="reference")
    monkeypatch.setenv("KGREASON_PROJECT_SPLIT_TILES", "1")  # only tiles split over threads share a wave buffer
    for floats in ("1", str(40 * n)):  # one tile per wave; two 16-row tiles or one 32-row tile per wave
        monkeypatch.setenv("KGREASON_PROJECT_WAVE_FLOATS", floats)
        y, a = ops.project(x, stack, rel, negate=negated, return_argmax=True, strategy="pull", backend="cpp")
        _check_equal(y, y_ref, f"Y waves={floats}", seed)
        _check_equal(a, a_ref, f"argmax waves={floats}", seed)


@needs_cpp
def test_threads_agree(seed):
    """Two threads (balanced task split, column ranges) give the single-thread result."""
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 3000, 4, 200
    stack, _ = random_stack(r, n, 0.02, gen)
    x = mixed_batch(b, n, gen)
    rel = torch.randint(0, r, (b,), generator=gen)
    old = torch.get_num_threads()
    try:
        out = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            for negated in (False, True):
                out[(t, negated)] = ops.project(x, stack, rel, negate=negated, return_argmax=True, backend="cpp")
    finally:
        torch.set_num_threads(old)
    for negated in (False, True):
        _check_equal(out[(2, negated)][0], out[(1, negated)][0], f"Y negated={negated}", seed)
        _check_equal(out[(2, negated)][1], out[(1, negated)][1], f"argmax negated={negated}", seed)


@needs_cpp
def test_auto_picks_push_for_sparse_rows_and_pull_for_dense(seed):
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 2000, 3, 96
    stack, _ = random_stack(r, n, 0.05, gen)
    onehot = random_batch(b // 2, n, "onehot", gen)
    dense = random_batch(b // 2, n, "dense", gen)
    x = torch.cat([onehot, dense])
    rel = torch.randint(0, r, (b,), generator=gen)
    codes = ops.project_strategies(x, stack, rel)
    assert codes.dtype == torch.int32 and codes.shape == (b,)
    assert codes[: b // 2].eq(ops.STRATEGIES["push"]).all(), codes
    assert codes[b // 2 :].eq(ops.STRATEGIES["pull"]).all(), codes
    zeros = torch.zeros(3, n)  # an all-zero row only costs its zero fill: push
    assert ops.project_strategies(zeros, stack, [0, 1, 2]).eq(ops.STRATEGIES["push"]).all()


@needs_cpp
@pytest.mark.parametrize("negated", [False, True], ids=["plain", "negated"])
def test_sweep_rows(seed, negated):
    """Dense rows through tiny relations are swept (walked through the relation's own entries); same result."""
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 3000, 4, 24
    rows, cols = [], []
    for k in range(r):  # relation k: 2 * (k + 1) rows of M_k (may repeat) with 2 entries each
        heads = torch.randint(0, n, (2 * (k + 1),), generator=gen).repeat_interleave(2)
        rows.append(k * n + heads)
        cols.append(torch.randint(0, n, (heads.numel(),), generator=gen))
    rows, cols = torch.cat(rows), torch.cat(cols)
    key = torch.unique(rows * n + cols)  # sorted: CSR order
    crow = torch.zeros(r * n + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(key // n, minlength=r * n), 0)
    val = torch.rand(key.numel(), generator=gen).clamp_min(1e-3)
    stack = ops.prepare_matrices((crow, (key % n).to(torch.int32), val), num_entities=n)
    x = torch.cat([random_batch(b - 4, n, "dense", gen), random_batch(4, n, "onehot", gen)])
    rel = torch.randint(0, r, (b,), generator=gen)
    codes = ops.project_strategies(x, stack, rel)
    assert codes[: b - 4].eq(SWEEP).all(), codes
    assert codes[b - 4 :].ne(ops.STRATEGIES["pull"]).all(), codes  # one-hot: push, or sweep for a 4-entry relation
    y_ref, a_ref = ops.project(x, stack, rel, negate=negated, neg_scale=0.5, return_argmax=True,
                               backend="reference")
    y_loop, a_loop = per_relation_loop(x, rel, stack, negated, "cpp", neg_scale=0.5)
    _check_equal(y_loop, y_ref, "Y loop vs reference", seed)
    _check_equal(a_loop, a_ref, "argmax loop vs reference", seed)
    y, a = ops.project(x, stack, rel, negate=negated, neg_scale=0.5, return_argmax=True, backend="cpp")
    _check_equal(y, y_ref, "Y", seed)
    _check_equal(a, a_ref, "argmax", seed)
    y2 = ops.project(x, stack, rel, negate=negated, neg_scale=0.5, backend="cpp")
    _check_equal(y2, y_ref, "Y (no argmax)", seed)


def test_empty_relation_and_zero_rows(device):
    """A relation without entries: Y = 0 (plain) or the row's max everywhere (negated: every factor is 1)."""
    n = 5
    m = torch.zeros(2 * n, n)
    m[n + 1, 3] = 0.5  # relation 1: one entry 1 -> 3
    stack = ops.prepare_matrices(m.to_sparse_csr(), device=device)
    x = torch.tensor([[0.2, 0.9, 0.0, 0.9, 0.1], [0.0] * 5, [0.0, 1.0, 0.0, 0.0, 0.0]], device=device)
    rel = torch.tensor([0, 0, 1], device=device)
    for backend in _backends(device):
        for strategy in STRATS:
            y, a = ops.project(x, stack, rel, return_argmax=True, strategy=strategy, backend=backend)
            want_y = torch.zeros(3, n)
            want_y[2, 3] = 0.5
            want_a = torch.full((3, n), -1, dtype=torch.int32)
            want_a[2, 3] = 1
            _check_equal(y, want_y, f"Y {backend}/{strategy}", 0)
            _check_equal(a, want_a, f"argmax {backend}/{strategy}", 0)
            y, a = ops.project(x, stack, rel, negate=True, neg_scale=1.0, return_argmax=True, strategy=strategy,
                               backend=backend)
            want_y = torch.tensor([[0.9] * 5, [0.0] * 5, [1.0, 1.0, 1.0, 0.5, 1.0]])
            want_a = torch.tensor([[1] * 5, [-1] * 5, [1] * 5], dtype=torch.int32)
            _check_equal(y, want_y, f"negated Y {backend}/{strategy}", 0)
            _check_equal(a, want_a, f"negated argmax {backend}/{strategy}", 0)


def test_stack_from_scipy_shares_memory_and_relation_views(seed):
    """An artifact-like scipy stack (int64 indptr, int32 indices) is used without a copy; relation(r) is M_r."""
    sp = pytest.importorskip("scipy.sparse")
    gen = torch.Generator().manual_seed(seed)
    n, r = 40, 3
    dense = [random_matrix(n, 0.1, gen)[1] for _ in range(r)]
    m = sp.csr_matrix(torch.cat(dense).numpy())
    m.indptr = m.indptr.astype(np.int64)
    m.indices = m.indices.astype(np.int32)
    stack = ops.prepare_matrices(m)
    assert stack.num_relations == r and stack.n == n
    assert stack.crow.dtype == torch.int64 and stack.col.dtype == torch.int32
    assert stack.val.data_ptr() == m.data.ctypes.data  # no copy of the entries
    assert stack.nnz_per_relation().tolist() == [int((d > 0).sum()) for d in dense]
    for k in range(r):
        assert torch.equal(stack.relation(k).to_sparse_csr().to_dense(), dense[k])
        # the transpose's slice is M_r's CSC: preparing the one matrix computes the same
        p = ops.prepare_matrices(stack.relation(k).to_sparse_csr())
        rel_k = stack.relation(k)
        assert torch.equal(rel_k.ccol, p.ccol) and torch.equal(rel_k.row, p.row) and torch.equal(rel_k.tval, p.tval)


# ----------------------------------------------------------------------------------------- validation
def _small():
    m = torch.zeros(6, 3)
    m[0, 1] = 0.5
    m[4, 2] = 1.0
    return ops.prepare_matrices(m.to_sparse_csr()), torch.rand(2, 3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(X=torch.rand(2, 3, dtype=torch.float64)), r"X: expected dtype torch\.float32"),
        (dict(X=torch.rand(2, 4)), r"X: expected shape \(B, N\) with N = 3"),
        (dict(X=torch.rand(3)), r"X: expected a 2-D tensor"),
        (dict(X=torch.full((2, 3), 1.5)), r"X: values must lie in \[0, 1\]"),
        (dict(rel=torch.tensor([0.0, 1.0])), r"rel: expected dtype int32 or int64, got torch\.float32"),
        (dict(rel=torch.tensor([0, 1, 1])), r"rel: expected shape \(2,\)"),
        (dict(rel=torch.tensor([0, 2])), r"rel: rel\[1\] = 2 is out of range \[0, 2\)"),
        (dict(rel=torch.tensor([-1, 0])), r"rel: rel\[0\] = -1 is out of range"),
        (dict(rel=[0, 7]), r"rel: rel\[1\] = 7 is out of range"),
        (dict(rel="01"), r"rel: expected a 1-D int32/int64 tensor"),
        (dict(neg_scale=-1.0), r"neg_scale: expected a finite number >= 0, got -1\.0"),
        (dict(neg_scale=float("inf")), r"neg_scale: expected a finite number >= 0"),
        (dict(neg_scale="x"), r"neg_scale: expected a number"),
        (dict(strategy="fast"), r"strategy: expected one of \('auto', 'push', 'pull'\), got 'fast'"),
        (dict(M=torch.rand(6, 3)), r"M: expected a torch sparse CSR tensor of shape \(R\*N, N\)"),
        (dict(M=(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0.5]))), r"num_entities: required"),
        (dict(M=object()), r"M: expected a sparse CSR \(N, N\) matrix or \(R\*N, N\) stack, .*got object"),
        (dict(backend="gpu"), r"backend: expected one of"),
    ],
)
def test_validation_errors(kwargs, match):
    stack, x = _small()
    args = dict(X=x, rel=torch.tensor([0, 1]), M=stack)
    args.update({k: kwargs.pop(k) for k in list(kwargs) if k in args})
    with pytest.raises(ValueError, match=match):
        ops.project(args["X"], args["M"], args["rel"], **kwargs)


@pytest.mark.parametrize(
    "parts,n,match",
    [
        ((torch.tensor([0, 1, 1, 1, 1]), torch.tensor([0]), torch.tensor([0.5])), 3,
         r"matrices: crow has 5 entries, expected R\*N\+1 for N = 3"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([3]), torch.tensor([0.5])), 3,
         r"matrices: column indices must lie in \[0, 3\), got 3\.\.3"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([0]), torch.tensor([1.5])), 3,
         r"matrices: values must lie in \[0, 1\]"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([0]), torch.tensor([float("nan")])), 3,
         r"matrices: values must lie in \[0, 1\]"),
        ((torch.tensor([0.0, 1, 1, 1]), torch.tensor([0]), torch.tensor([0.5])), 3,
         r"matrices: crow \(row pointers\) must be int32 or int64, got torch\.float32"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([0], dtype=torch.int16), torch.tensor([0.5])), 3,
         r"matrices: col \(column indices\) must be int32 or int64, got torch\.int16"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64)), 3,
         r"matrices: values must be float32, got torch\.float64"),
        ((torch.tensor([0, 1, 1, 2]), torch.tensor([0]), torch.tensor([0.5])), 3,
         r"matrices: crow must start at 0 and end at nnz = 1, got 0\.\.2"),
        ((torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]), torch.tensor([0.5, 0.5])), 3,
         r"matrices: crow must be non-decreasing"),
        ((torch.tensor([0, 1, 1, 1]), torch.tensor([0, 1]), torch.tensor([0.5])), 3,
         r"matrices: 2 column indices but 1 values"),
        ((torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0.5])), 0,
         r"num_entities: expected an integer >= 1, got 0"),
    ],
)
def test_prepare_matrices_stack_errors(parts, n, match):
    with pytest.raises(ValueError, match=match):
        ops.prepare_matrices(parts, num_entities=n, name="matrices")  # messages name the argument as given


def test_prepare_matrices_stack_shape_mismatch():
    with pytest.raises(ValueError, match=r"num_entities: 4 differs from matrices's 3 columns"):
        ops.prepare_matrices(torch.zeros(6, 3).to_sparse_csr(), num_entities=4, name="matrices")
    # (prepare_stacked said "crow has 6 entries"; prepare_matrices names the shape; a triple's crow count: above)
    with pytest.raises(ValueError, match=r"matrices: expected a square N x N matrix, got shape \(5, 3\) \(or a stack"):
        ops.prepare_matrices(torch.zeros(5, 3).to_sparse_csr(), name="matrices")
    stack, _ = _small()
    with pytest.raises(ValueError, match=r"relation: id 2 is out of range \[0, 2\)"):
        stack.relation(2)


@needs_cpp
def test_raw_op_checks():
    """The compiled op checks what the Python wrapper checks (a direct torch.ops call must not read out of bounds)."""
    stack, x = _small()
    args = [stack.crow, stack.col, stack.val, stack.tcrow, stack.trow, stack.tval, stack.n, 0, False, 3.0, True]
    with pytest.raises(RuntimeError, match=r"rel\[1\] = 5 is out of range \[0, 2\)"):
        torch.ops.kgreason.project(x, torch.tensor([0, 5]), *args)
    with pytest.raises(RuntimeError, match=r"X must have N = 3 columns"):
        torch.ops.kgreason.project(torch.rand(2, 4), torch.tensor([0, 1]), *args)
    with pytest.raises(RuntimeError, match=r"trow dtype"):
        bad = list(args)
        bad[4] = stack.trow.to(torch.int32) if stack.trow.dtype == torch.int64 else stack.trow.long()
        torch.ops.kgreason.project(x, torch.tensor([0, 1]), *bad)
    with pytest.raises(RuntimeError, match=r"strategy must be 0 \(auto\), 1 \(push\) or 2 \(pull\)"):
        bad = list(args)
        bad[7] = 5
        torch.ops.kgreason.project(x, torch.tensor([0, 1]), *bad)


@needs_cpp
@pytest.mark.parametrize("negated,want_argmax", [(False, True), (False, False), (True, True)])
def test_opcheck(seed, negated, want_argmax):
    gen = torch.Generator().manual_seed(seed)
    stack, _ = random_stack(3, 30, 0.1, gen)
    x = mixed_batch(9, 30, gen)
    rel = torch.randint(0, 3, (9,), generator=gen)
    torch.library.opcheck(
        torch.ops.kgreason.project.default,
        (x, rel, stack.crow, stack.col, stack.val, stack.tcrow, stack.trow, stack.tval, stack.n, 0, negated, 2.0,
         want_argmax),
    )
    torch.library.opcheck(torch.ops.kgreason.project_strategy.default, (x, rel, stack.crow, stack.n))


def test_exported_from_ops():
    for name in ("project", "prepare_matrices", "StackedMatrices", "project_strategies", "SWEEP"):
        assert hasattr(ops, name) and name in ops.__all__, name


@pytest.mark.skipif(os.environ.get("KGREASON_SKIP_DOCTEST") == "1", reason="doctest disabled")
def test_module_docstring_example():
    import doctest
    import warnings

    pm = sys.modules["ops.projection"]  # ops.project's module

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "sparse CSR is beta" note
        res = doctest.testmod(pm, verbose=False)
    assert res.failed == 0 and res.attempted > 0
