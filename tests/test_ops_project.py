"""``ops.project``, the one projection (issue 23's fold), against brute force and the reference on random inputs.

Brute force: dense ``max_i X[b, i] * D_{rel[b]}[i, j]`` (tests/_ops_helpers.dense_project), the same float32
products, so every backend must equal it bit for bit, argmax included.  Covers one matrix (CSR or prepared:
the one-relation stack, ``rel=None``) and stacks with mixed relations, negate, argmax, ``out=``, forced
strategies, N = 1, empty rows and columns, B = 0, int32 / int64 pointers and columns, sparse X; the
removed aliases' errors; and bad input naming the argument.
"""
from __future__ import annotations

import importlib.machinery
import re
from pathlib import Path

import pytest
import torch

import ops
from _ops_helpers import BACKENDS, dense_negation_factor, dense_project, random_batch, random_matrix, require_backend
from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError
from ops.sparse_rows import SparseRows


def _stack(r: int, n: int, density: float, gen: torch.Generator, *, ptr_dtype=torch.int64, col_dtype=torch.int32,
           empty: bool = False):
    """(StackedMatrices of r random relations, list of their dense (n, n) matrices)."""
    ds = []
    for _ in range(r):
        _, d = random_matrix(n, density, gen, empty_rows=n // 5 if empty else 0, empty_cols=n // 5 if empty else 0)
        ds.append(d)
    m = torch.cat(ds).to_sparse_csr()
    parts = (m.crow_indices().to(ptr_dtype), m.col_indices().to(col_dtype), m.values())
    return ops.prepare_matrices(parts, num_entities=n), ds


def _brute(x: torch.Tensor, ds: list[torch.Tensor], rel: torch.Tensor, negate: bool, s: float = QTO_NEG_SCALE):
    b, n = x.shape
    y = torch.zeros(b, n)
    a = torch.full((b, n), -1, dtype=torch.int32)
    for k in range(b):
        d = ds[int(rel[k])]
        f = dense_negation_factor(d, s) if negate else d
        y[k : k + 1], a[k : k + 1] = dense_project(x[k : k + 1], f)
    return y, a


def _same(got, want, what: str, seed: int):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {got.shape} vs {want.dtype} " \
                                                                f"{want.shape} (seed={seed})"
    assert torch.equal(got, want), f"{what} differs at {(got != want).nonzero()[:5].tolist()} (seed={seed})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,r,b", [(1, 1, 3), (1, 2, 4), (7, 1, 5), (23, 3, 17), (40, 4, 40)])
@pytest.mark.parametrize("ptr_dtype,col_dtype", [(torch.int64, torch.int32), (torch.int32, torch.int32),
                                                 (torch.int64, torch.int64), (torch.int32, torch.int64)])
def test_project_matches_brute_force(seed, backend, n, r, b, ptr_dtype, col_dtype):
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    stack, ds = _stack(r, n, 0.3, gen, ptr_dtype=ptr_dtype, col_dtype=col_dtype, empty=n >= 5)
    kinds = ("onehot", "sparse", "dense", "zeros")
    x = torch.cat([random_batch(b, n, kinds[k % 4], gen, ties=k % 2 == 1)[:1] for k in range(b)])
    rel = torch.randint(0, r, (b,), generator=gen)
    for negate in (False, True):
        want_y, want_a = _brute(x, ds, rel, negate)
        for strategy in ("auto", "push", "pull"):
            y, a = ops.project(x, stack, rel, negate=negate, return_argmax=True, strategy=strategy, backend=backend)
            _same(y, want_y, f"Y negate={negate} {strategy}", seed)
            _same(a, want_a, f"argmax negate={negate} {strategy}", seed)
            y_only = ops.project(x, stack, rel, negate=negate, strategy=strategy, backend=backend)
            _same(y_only, want_y, f"Y (values only) negate={negate} {strategy}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,b", [(37, 16), (45, 3)])
@pytest.mark.parametrize("neg_scale", [QTO_NEG_SCALE, 1.0, 0.7, 0.0])
def test_negation_factor_at_the_clamp(seed, backend, n, b, neg_scale):
    """The negated pull's factor pass (whole vectors, then a scalar tail: the relation's entry count is not a
    multiple of the vector width) gives the brute force's 1 - min(1, s v) bits, with values on both sides of
    s v = 1 and at it, every row of X dense (so every row is pulled, B = 16 in one tile)."""
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    edge = 1.0 / neg_scale if neg_scale > 0 else 0.5
    near = torch.tensor([edge, edge * (1 - 2 ** -23), edge * (1 + 2 ** -23), 2 * edge, edge / 2, 1.0, 1e-3],
                        dtype=torch.float32).clamp(1e-3, 1.0)
    mask = torch.rand(2 * n, n, generator=gen) < 0.6
    vals = torch.where(torch.rand(2 * n, n, generator=gen) < 0.5, near[torch.randint(0, len(near), (2 * n, n),
                                                                                        generator=gen)],
                       torch.rand(2 * n, n, generator=gen).clamp_min(1e-3))
    d = torch.where(mask, vals, torch.zeros(()))
    ds = [d[:n], d[n:]]
    m = d.to_sparse_csr()
    stack = ops.prepare_matrices((m.crow_indices(), m.col_indices(), m.values()), num_entities=n)
    x = random_batch(b, n, "dense", gen)
    rel = torch.randint(0, 2, (b,), generator=gen)
    want_y, want_a = _brute(x, ds, rel, True, neg_scale)
    for strategy in ("auto", "pull", "push"):
        y, a = ops.project(x, stack, rel, negate=True, neg_scale=neg_scale, return_argmax=True, strategy=strategy,
                           backend=backend)
        _same(y, want_y, f"Y neg_scale={neg_scale} {strategy}", seed)
        _same(a, want_a, f"argmax neg_scale={neg_scale} {strategy}", seed)
        y = ops.project(x, stack, rel, negate=True, neg_scale=neg_scale, strategy=strategy, backend=backend)
        _same(y, want_y, f"Y (values only) neg_scale={neg_scale} {strategy}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_single_matrix_is_the_one_relation_stack(seed, backend, index_dtype):
    """A CSR matrix, its prepared form and rel=None / rel=zeros all give the brute-force result."""
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, b = 31, 19
    m, d = random_matrix(n, 0.2, gen, index_dtype=index_dtype, empty_rows=4, empty_cols=4, ties=True)
    p = ops.prepare_matrices(m)
    assert isinstance(p, ops.StackedMatrices) and p.num_relations == 1 and p.n == n
    x = torch.cat([random_batch(b, n, "onehot", gen)[:9], random_batch(b, n, "dense", gen, ties=True)[:10]])
    for negate in (False, True):
        want_y, want_a = _brute(x, [d], torch.zeros(b, dtype=torch.int64), negate)
        for matrix in (m, p):
            for rel in (None, torch.zeros(b, dtype=torch.int32), [0] * b):
                y, a = ops.project(x, matrix, rel, negate=negate, return_argmax=True, backend=backend)
                _same(y, want_y, f"Y negate={negate}", seed)
                _same(a, want_a, f"argmax negate={negate}", seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_all_zero_rows(backend):
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(0)
    stack, ds = _stack(2, 9, 0.3, gen)
    for negate in (False, True):
        y, a = ops.project(torch.zeros(0, 9), stack, torch.zeros(0, dtype=torch.int64), negate=negate,
                           return_argmax=True, backend=backend)
        assert y.shape == (0, 9) and a.shape == (0, 9) and a.dtype == torch.int32
        y, a = ops.project(torch.zeros(3, 9), stack, [0, 1, 1], negate=negate, return_argmax=True, backend=backend)
        assert torch.equal(y, torch.zeros(3, 9)) and torch.equal(a, torch.full((3, 9), -1, dtype=torch.int32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("negate", [False, True])
def test_out_is_filled_and_returned(seed, backend, negate):
    require_backend(backend, "project_out", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 25, 3, 12
    stack, ds = _stack(r, n, 0.2, gen)
    x = random_batch(b, n, "dense", gen)
    rel = torch.randint(0, r, (b,), generator=gen)
    want_y, want_a = _brute(x, ds, rel, negate)
    y, a = torch.full((b, n), 7.0), torch.full((b, n), 7, dtype=torch.int32)  # stale contents are overwritten
    got = ops.project(x, stack, rel, negate=negate, return_argmax=True, out=(y, a), backend=backend)
    assert got[0] is y and got[1] is a
    _same(y, want_y, "out Y", seed)
    _same(a, want_a, "out argmax", seed)
    y2 = torch.full((b, n), 7.0)
    assert ops.project(x, stack, rel, negate=negate, out=y2, backend=backend) is y2
    _same(y2, want_y, "out Y (values only)", seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_x_goes_to_the_sparse_kernel(seed, backend):
    """A SparseRows X gives a SparseRows equal, densified, to the dense projection."""
    require_backend(backend, "project_multi_sparse", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 30, 3, 14
    stack, ds = _stack(r, n, 0.15, gen)
    x = torch.cat([random_batch(7, n, "onehot", gen), random_batch(7, n, "sparse", gen)])
    x[3] = 0  # an empty row
    rel = torch.randint(0, r, (b,), generator=gen)
    got = ops.project(SparseRows.from_dense(x), stack, rel, backend=backend)
    assert isinstance(got, SparseRows)
    _same(got.to_dense(), _brute(x, ds, rel, False)[0], "sparse Y", seed)
    got0 = ops.project(SparseRows.from_dense(x), stack, backend=backend)  # rel None: relation 0
    _same(got0.to_dense(), _brute(x, ds, torch.zeros(b, dtype=torch.int64), False)[0], "sparse Y rel=None", seed)


def test_positional_order_of_the_former_single_relation_call():
    """``ops.project(x, P, return_argmax=..., strategy=...)`` (the engine's call before the fold) still works."""
    gen = torch.Generator().manual_seed(3)
    m, d = random_matrix(12, 0.3, gen)
    x = random_batch(5, 12, "dense", gen)
    p = ops.prepare_matrices(m)
    y, a = ops.project(x, p, return_argmax=True, strategy="pull", validate=False)
    want_y, want_a = dense_project(x, d)
    assert torch.equal(y, want_y) and torch.equal(a, want_a)


def test_one_op_serves_the_former_entry_points():
    """What the removed aliases did (project_multi, project_negated, prepare, prepare_stacked, PreparedMatrix,
    project_multi_strategies, project_multi_sparse), through the one op: the same answers as the stack's."""
    gen = torch.Generator().manual_seed(4)
    stack, ds = _stack(2, 10, 0.3, gen)
    m, d = random_matrix(10, 0.3, gen)
    x = random_batch(4, 10, "dense", gen)
    rel = torch.tensor([0, 1, 1, 0])
    got = ops.project(x, stack, rel, negate=True, return_argmax=True)
    want = ops.reference.project_stacked(x, rel, stack, negated=True, return_argmax=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    got = ops.project(x, m, negate=True, neg_scale=2.0)
    assert torch.equal(got, ops.project(x, ops.prepare_matrices(m), negate=True, neg_scale=2.0))
    p = ops.prepare_matrices(m)
    assert isinstance(p, ops.StackedMatrices) and p.num_relations == 1
    s2 = ops.prepare_matrices(torch.cat(ds).to_sparse_csr())
    assert s2.num_relations == 2 and torch.equal(s2.tval, stack.tval)
    pm = ops.StackedMatrices(p.n, 1, p.crow, p.col, p.val, p.ccol, p.row, p.tval)  # the former field order, R = 1
    assert torch.equal(ops.project(x, pm), ops.project(x, p))
    if ops.has_kernel("project_strategy", "cpu"):
        codes = ops.project_strategies(x, stack, rel)
        assert codes.shape == (4,) and set(codes.tolist()) <= {1, 2, ops.SWEEP}
    sp = ops.project(SparseRows.from_dense(x), stack, rel)
    assert torch.equal(sp.to_dense(), ops.project(x, stack, rel))


@pytest.mark.parametrize("old,new", [("project_negated", "ops.project(X, M, negate=True)"),
                                     ("project_multi", "ops.project(X, M, rel"),
                                     ("project_multi_strategies", "ops.project_strategies(X, M, rel)"),
                                     ("prepare", "ops.prepare_matrices(M)"),
                                     ("prepare_stacked", "ops.prepare_matrices(M)"),
                                     ("PreparedMatrix", "ops.StackedMatrices")])
def test_removed_aliases_name_their_replacement(old, new):
    """The deprecated aliases of issue 23's fold are gone after their release; reading one says what replaces it."""
    assert old not in ops.__all__
    with pytest.raises(AttributeError, match=rf"^ops\.{old} was removed .*; use {re.escape(new)}"):
        getattr(ops, old)
    assert not hasattr(ops.sparse_rows, "project_multi_sparse")
    # the module is gone from the package (looked up in ops' own folder: an editable install's finder may
    # also list the main checkout)
    assert importlib.machinery.PathFinder.find_spec("ops.project_multi", [str(Path(ops.__file__).parent)]) is None
    with pytest.raises(AttributeError, match="has no attribute 'no_such_op'"):
        ops.no_such_op  # noqa: B018  (any other missing name: Python's usual error)


def test_has_kernel_knows_only_the_current_op_names():
    """The former op names (served by kgreason::project for one release) are no longer kernels."""
    if not ops.extension_available():
        pytest.skip("compiled extension ops._C not built")
    assert ops.has_kernel("project", "cpu") and ops.has_kernel("project_out", "cpu")
    for old in ("project_negated", "project_multi", "project_multi_out", "project_multi_strategy"):
        assert not ops.has_kernel(old, "cpu")


def test_bad_input_names_the_argument():
    gen = torch.Generator().manual_seed(5)
    stack, _ = _stack(2, 6, 0.3, gen)
    x = torch.rand(3, 6)
    with pytest.raises(UserError, match=r"rel: rel\[1\] = 2 is out of range \[0, 2\)"):
        ops.project(x, stack, [0, 2, 1])
    with pytest.raises(UserError, match=r"rel: expected shape \(3,\)"):
        ops.project(x, stack, [0, 1])
    with pytest.raises(UserError, match=r"rel: expected dtype int32 or int64"):
        ops.project(x, stack, torch.zeros(3))
    with pytest.raises(UserError, match=r"X: expected shape \(B, N\) with N = 6"):
        ops.project(torch.rand(3, 5), stack)
    with pytest.raises(UserError, match=r"neg_scale: expected a finite number >= 0, got inf"):
        ops.project(x, stack, negate=True, neg_scale=float("inf"))
    with pytest.raises(UserError, match=r"strategy: expected one of"):
        ops.project(x, stack, strategy="sweep")
    sx = SparseRows.from_dense(x)
    for kw, name in ((dict(negate=True), "negate"), (dict(return_argmax=True), "return_argmax"),
                     (dict(out=torch.empty(3, 6)), "out")):
        with pytest.raises(UserError, match=rf"{name}: not available for a SparseRows X"):
            ops.project(sx, stack, **kw)
    with pytest.raises(UserError, match=r"M: expected a square N x N matrix, got shape \(4, 6\)"):
        ops.project(x, torch.rand(4, 6).to_sparse_csr())
    with pytest.raises(UserError, match=r"out: expected shape \(3, 6\)"):
        ops.project(x, stack, out=torch.empty(2, 6))


def test_strategies_report_push_for_one_hot_and_pull_for_dense():
    if not ops.has_kernel("project_strategy", "cpu"):
        pytest.skip("compiled extension ops._C not built")
    gen = torch.Generator().manual_seed(6)
    n = 3000
    m, _ = random_matrix(n, 0.05, gen)
    x = torch.cat([random_batch(8, n, "onehot", gen), random_batch(8, n, "dense", gen)])
    codes = ops.project_strategies(x, m)
    assert codes.dtype == torch.int32 and codes.shape == (16,)
    assert codes[:8].eq(ops.STRATEGIES["push"]).all() and codes[8:].eq(ops.STRATEGIES["pull"]).all()
    assert ops.choose_strategy(x[:8], m) == "push" and ops.choose_strategy(x[8:], m) == "pull"


# ----------------------------------------------------------------------------- the stacked transpose
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int64), (torch.int64, torch.int32)])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 40)])
def test_stacked_transpose_kernel_path_equals_argsort_path(seed, dtypes, shape, monkeypatch):
    """prepare_matrices transposes a stack relation by relation with the csr_transpose kernel (bounded
    memory); the argsort path (devices without the kernel) must give the same bits."""
    import ops.prepared as prepared

    if not ops.has_kernel("csr_transpose", torch.device("cpu")):
        pytest.skip("no csr_transpose kernel")
    r, n = shape
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(r * n, n, generator=g)
    dense[dense < 0.7] = 0
    if r > 1:
        dense[n:2 * n] = 0  # an empty relation
    m = dense.to_sparse_csr()
    crow, col, val = m.crow_indices().to(dtypes[0]), m.col_indices().to(dtypes[1]), m.values().contiguous()
    fast = prepared._stacked_transpose(crow, col, val, n, r)
    monkeypatch.setattr(prepared, "has_kernel", lambda *a, **k: False)
    slow = prepared._stacked_transpose(crow, col, val, n, r)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


@pytest.mark.parametrize("case, message", [
    ("col", r"column indices must lie in \[0, 4\)"),
    ("crow", "crow must be non-decreasing"),
    ("shape", "crow must have R\\*N\\+1 entries for N = 4, got 8"),
    ("end", "crow must start at 0 and end at nnz = 3"),
])
def test_stacked_transpose_kernel_refuses_a_malformed_stack(case, message):
    """The kernel runs on whatever it is given (torch.ops is public): a bad index is an error, never a write
    outside the outputs."""
    if not ops.has_kernel("csr_transpose", torch.device("cpu")):
        pytest.skip("no csr_transpose kernel")
    crow = torch.tensor([0, 1, 1, 2, 2, 3, 3, 3, 3], dtype=torch.int64)  # R = 2 relations, N = 4
    col = torch.tensor([0, 3, 1], dtype=torch.int32)
    val = torch.tensor([0.5, 0.25, 1.0])
    if case == "col":
        col[1] = 4
    elif case == "crow":
        crow[2] = 0
    elif case == "shape":
        crow = crow[:8]
    else:
        crow[-1] = 2
    with pytest.raises(RuntimeError, match=message):
        torch.ops.kgreason.csr_transpose(crow, col, val, 4)
