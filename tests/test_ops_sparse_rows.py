"""ops.sparse_rows: the compiled project_multi_sparse / sparse_align against their pure-torch references
bit for bit (crow, col and values), and the densified results against the dense ops
(ops.project, ops.intersect, ops.union)."""
from __future__ import annotations

import pytest
import torch

import ops
from _ops_helpers import BACKENDS, require_backend
from kgreason.errors import UserError
from ops import StackedMatrices
from ops.sparse_rows import (SparseRows, intersect_sparse, push_sizes,
                             reference_project_multi_sparse, reference_sparse_align, sparse_align, union_sparse)

# (pointer dtype, column dtype) of the stack: the artifact's is int64 / int32
INDEX_DTYPES = [(torch.int32, torch.int32), (torch.int64, torch.int32), (torch.int64, torch.int64),
                (torch.int32, torch.int64)]
TNORMS = ["product", "godel"]


def _equal(got, want, what: str, seed: int) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype} (seed={seed})"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)} (seed={seed})"
    if not torch.equal(got, want):
        diff = (got != want).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: differs at {diff} (seed={seed})")


def _equal_rows(got: SparseRows, want: SparseRows, what: str, seed: int) -> None:
    assert got.n == want.n
    for name in ("crow", "col", "val"):
        _equal(getattr(got, name), getattr(want, name), f"{what} {name}", seed)


# ---------------------------------------------------------------------------------- random inputs
def random_stack(r: int, n: int, gen: torch.Generator, *, ptr_dtype=torch.int64, idx_dtype=torch.int32,
                 avg_degree: float = 4.0, shuffle_rows: bool = False) -> StackedMatrices:
    """A stacked (R*N, N) CSR with power-law rows (most rows of a relation empty, a few long ones), one
    empty relation when R > 2, values in [0, 1] with ties and stored zeros.  ``shuffle_rows``: the columns
    of each row in random order with duplicates (prepare_matrices accepts that; the kernel must too)."""
    keys = []
    empty = int(torch.randint(0, r, (1,), generator=gen)) if r > 2 else -1
    for k in range(r):
        if k == empty:
            continue
        m = int(avg_degree * n)
        rows = (n * torch.rand(m, generator=gen) ** 3).long().clamp_(max=n - 1)  # skewed: low ids hold most
        rows = torch.randperm(n, generator=gen)[rows]
        cols = torch.randint(0, n, (m,), generator=gen)
        keys.append((k * n + rows) * n + cols)
    key = torch.cat(keys) if keys else torch.zeros(0, dtype=torch.int64)
    key = torch.unique(key) if not shuffle_rows else key[torch.argsort(torch.div(key, n, rounding_mode="floor"),
                                                                        stable=True)]
    stack_row = torch.div(key, n, rounding_mode="floor")
    col = key - stack_row * n
    val = torch.rand(len(key), generator=gen)
    pick = torch.rand(len(key), generator=gen)
    val = torch.where(pick < 0.15, torch.tensor([0.25, 0.5, 1.0])[torch.randint(0, 3, (len(key),), generator=gen)], val)
    val = torch.where(pick > 0.97, torch.zeros(()), val)  # stored zeros: reached columns of value 0
    if shuffle_rows and len(key):  # random order inside each row (stable sort by row of a random permutation)
        perm = torch.randperm(len(key), generator=gen)
        order = torch.argsort(stack_row[perm], stable=True)
        col, val = col[perm][order], val[perm][order]
    crow = torch.zeros(r * n + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(stack_row, minlength=r * n), 0)
    return ops.prepare_matrices((crow.to(ptr_dtype), col.to(idx_dtype), val), num_entities=n)


ROW_KINDS = ("empty", "onehot", "one", "one_plus_zeros", "zeros", "few", "many")


def random_rows(b: int, n: int, gen: torch.Generator, kinds=ROW_KINDS) -> SparseRows:
    """Rows of every kind: empty, one-hot (value 1), one entry of another value, one active entry among
    stored zeros, only stored zeros, a few entries, up to a third of N; values with stored zeros."""
    kind = [kinds[k] for k in torch.randint(0, len(kinds), (b,), generator=gen).tolist()]
    few = torch.randint(2, 10, (b,), generator=gen).tolist()
    many = torch.randint(1, n // 3 + 2, (b,), generator=gen).tolist()
    sizes = {"empty": 0, "onehot": 1, "one": 1, "one_plus_zeros": 5, "zeros": 3}
    count = torch.tensor([min(n, sizes[k] if k in sizes else few[r] if k == "few" else many[r])
                          for r, k in enumerate(kind)], dtype=torch.int64).reshape(b, 1)
    keys = torch.rand(b, n, generator=gen)
    ordered = keys.sort(dim=1).values if n else keys
    mask = (keys <= ordered.gather(1, (count - 1).clamp(min=0))) & (count > 0)  # count random columns a row
    first = keys == ordered[:, :1]  # one of them

    def rows_of(*names):
        return torch.tensor([k in names for k in kind], dtype=torch.bool).reshape(b, 1)

    vals = torch.rand(b, n, generator=gen)
    vals = torch.where(torch.rand(b, n, generator=gen) < 0.2, torch.zeros(()), vals)
    vals = torch.where(rows_of("onehot"), torch.ones(()), vals)
    vals = torch.where(rows_of("one"), 0.5 + 0.5 * vals.clamp_min(0.1), vals)
    vals = torch.where(rows_of("zeros") | (rows_of("one_plus_zeros") & ~first), torch.zeros(()), vals)
    vals = torch.where(rows_of("one_plus_zeros") & first, vals.clamp_min(1e-3), vals)
    rows, cols = mask.nonzero(as_tuple=True)
    crow = torch.zeros(b + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=b), 0)
    return SparseRows(crow, cols, vals[rows, cols].contiguous(), n)


def _rels(b: int, r: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    if mode == "equal":
        return torch.full((b,), int(torch.randint(0, r, (1,), generator=gen)), dtype=torch.int64)
    return torch.randint(0, r, (b,), generator=gen)


# ----------------------------------------------------------------------------------- projection
def _check_projection(x: SparseRows, rel, stack: StackedMatrices, backend: str, seed: int) -> SparseRows:
    y = ops.project(x, stack, rel, backend=backend)
    y.check("Y")  # layout: pointers, strictly ascending columns, values in [0, 1]
    _equal_rows(y, reference_project_multi_sparse(x, torch.as_tensor(rel).long(), stack), f"{backend} vs reference",
                seed)
    dense = ops.project(x.to_dense(), stack, rel)
    _equal(y.to_dense(), dense, f"{backend} densified vs dense ops.project", seed)
    sizes = y.crow[1:] - y.crow[:-1]
    assert bool((sizes <= push_sizes(x, torch.as_tensor(rel).long(), stack)).all()), f"push_sizes (seed={seed})"
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ptr_dtype,idx_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("n,b,r", [(1, 1, 1), (1, 6, 3), (7, 12, 2), (64, 0, 2), (300, 50, 4), (3000, 200, 5)])
def test_project_matches_reference_and_dense(seed, backend, ptr_dtype, idx_dtype, n, b, r):
    """Mixed relations, then every row on one relation."""
    require_backend(backend, "project_multi_sparse", "cpu")
    gen = torch.Generator().manual_seed(seed)
    stack = random_stack(r, n, gen, ptr_dtype=ptr_dtype, idx_dtype=idx_dtype)
    x = random_rows(b, n, gen)
    for rel_mode in ("mixed", "equal"):
        _check_projection(x, _rels(b, r, rel_mode, gen), stack, backend, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ptr_dtype,idx_dtype", INDEX_DTYPES)
def test_project_one_hot_and_two_hops(seed, backend, ptr_dtype, idx_dtype):
    """One-hot anchors (some on empty rows of M), then the sparse result projected again (a 2-hop chain)."""
    require_backend(backend, "project_multi_sparse", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 1500, 4, 120
    stack = random_stack(r, n, gen, ptr_dtype=ptr_dtype, idx_dtype=idx_dtype, avg_degree=8.0)
    x = SparseRows.one_hot(torch.randint(0, n, (b,), generator=gen), n)
    y1 = _check_projection(x, _rels(b, r, "mixed", gen), stack, backend, seed)
    y2 = _check_projection(y1, _rels(b, r, "mixed", gen), stack, backend, seed)
    _check_projection(y2, torch.zeros(b, dtype=torch.int32), stack, backend, seed)  # int32 ids, one relation


@pytest.mark.parametrize("backend", BACKENDS)
def test_project_unsorted_stack_rows(seed, backend):
    """Rows of M with columns out of order and repeated: a one-entity row is no longer a sorted copy."""
    require_backend(backend, "project_multi_sparse", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 200, 3, 60
    stack = random_stack(r, n, gen, avg_degree=6.0, shuffle_rows=True)
    x = random_rows(b, n, gen)
    _check_projection(x, _rels(b, r, "mixed", gen), stack, backend, seed)
    _check_projection(SparseRows.one_hot(torch.randint(0, n, (b,), generator=gen), n), _rels(b, r, "mixed", gen),
                      stack, backend, seed)


@pytest.mark.skipif(not ops.has_kernel("project_multi_sparse", "cpu"), reason="compiled kernel not built")
def test_project_kernel_large_rows(seed):
    """Rows reaching most of N (the bitmap scan) and a handful of columns in a large N (the sort), and enough
    work for the parallel phases; against the reference."""
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 20000, 2, 24
    stack = random_stack(r, n, gen, avg_degree=3.0)
    x = random_rows(b, n, gen, kinds=("many", "few", "one"))
    rel = torch.randint(0, r, (b,), generator=gen)
    y = ops.project(x, stack, rel, backend="cpp")
    _equal_rows(y, reference_project_multi_sparse(x, rel, stack), "cpp vs reference", seed)


def test_project_errors():
    gen = torch.Generator().manual_seed(0)
    n, r = 10, 3
    stack = random_stack(r, n, gen)
    x = SparseRows.one_hot(torch.tensor([1, 2]), n)
    rel = torch.tensor([0, 2])
    for backend in ("reference",) + (("cpp",) if ops.has_kernel("project_multi_sparse", "cpu") else ()):
        with pytest.raises(UserError, match="int64 crow/col"):
            ops.project(SparseRows(x.crow, x.col.int(), x.val, n), stack, rel, backend=backend)
        with pytest.raises(UserError, match="float32 val"):
            ops.project(SparseRows(x.crow, x.col, x.val.double(), n), stack, rel, backend=backend)
        with pytest.raises(UserError, match="shape"):  # B mismatch between X and rel
            ops.project(x, stack, torch.tensor([0, 1, 2]), backend=backend)
        with pytest.raises(UserError, match="out of range"):
            ops.project(x, stack, torch.tensor([0, r]), backend=backend)
        with pytest.raises(UserError, match="N = 10"):
            ops.project(SparseRows.one_hot(torch.tensor([1, 2]), n + 1), stack, rel, backend=backend)
        with pytest.raises(UserError, match="StackedMatrices"):
            ops.project(x, "M", rel, backend=backend)
        with pytest.raises(UserError, match=r"\[0, 10\)"):
            ops.project(SparseRows(x.crow, torch.tensor([1, 10]), x.val, n), stack, rel, backend=backend)


@pytest.mark.skipif(not ops.has_kernel("project_multi_sparse", "cpu"), reason="compiled kernel not built")
def test_project_kernel_checks():
    """The kernel's own checks (a call with validate=False, or torch.ops directly)."""
    gen = torch.Generator().manual_seed(0)
    n = 10
    stack = random_stack(3, n, gen)
    x = SparseRows(torch.tensor([0, 1, 2]), torch.tensor([1, 10]), torch.ones(2), n)
    with pytest.raises(RuntimeError, match=r"entity id 10, outside \[0, 10\)"):
        ops.project(x, stack, torch.tensor([0, 1]), backend="cpp", validate=False)
    f = torch.ops.kgreason.project_multi_sparse
    m = (stack.crow, stack.col, stack.val)
    ok = SparseRows.one_hot(torch.tensor([1, 2]), n)
    with pytest.raises(RuntimeError, match=r"rel\[1\] = 3 is out of range \[0, 3\)"):
        f(ok.crow, ok.col, ok.val, torch.tensor([0, 3]), *m, n)
    with pytest.raises(RuntimeError, match="rel must have shape"):
        f(ok.crow, ok.col, ok.val, torch.tensor([0]), *m, n)
    with pytest.raises(RuntimeError, match="must be int64"):
        f(ok.crow.int(), ok.col, ok.val, torch.tensor([0, 1]), *m, n)
    with pytest.raises(RuntimeError, match="R\\*N\\+1"):
        f(ok.crow, ok.col, ok.val, torch.tensor([0, 1]), *m, n + 1)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        f(torch.tensor([0, 2, 1, 2]), torch.tensor([1, 2]), torch.ones(2), torch.tensor([0, 1, 1]), *m, n)


# ------------------------------------------------------------------------------------ alignment
def _related(base: SparseRows, mode: str, gen: torch.Generator) -> SparseRows:
    """A batch whose support is, row by row, `mode` relative to base's: identical, nested (a random subset),
    disjoint (the complement's random subset) or independent (random)."""
    b, n = base.shape
    if mode == "random":
        return random_rows(b, n, gen)
    d = torch.zeros(b, n, dtype=torch.bool)
    if base.nnz:
        d.view(-1)[base.row_ids() * n + base.col] = True
    if mode == "nested":
        d &= torch.rand(b, n, generator=gen) < 0.6
    elif mode == "disjoint":
        d = ~d & (torch.rand(b, n, generator=gen) < 0.1)
    rows, cols = d.nonzero(as_tuple=True)
    crow = torch.zeros(b + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=b), 0)
    vals = torch.rand(len(rows), generator=gen)
    vals = torch.where(torch.rand(len(rows), generator=gen) < 0.1, torch.zeros(()), vals)
    return SparseRows(crow, cols, vals, n)


def _batches(k: int, b: int, n: int, mode: str, gen: torch.Generator) -> list[SparseRows]:
    base = random_rows(b, n, gen)
    return [base] + [_related(base, mode, gen) for _ in range(k - 1)]


@pytest.mark.parametrize("mode", ["random", "identical", "nested", "disjoint"])
@pytest.mark.parametrize("n,b", [(1, 3), (40, 0), (50, 30), (1500, 80)])
def test_align_matches_reference(seed, mode, n, b):
    """k = 1..4 inputs whose supports are random, identical, nested or disjoint; intersection and union;
    every backend against the reference."""
    gen = torch.Generator().manual_seed(seed)
    xs = _batches(4, b, n, mode, gen)
    for backend in [be for be in BACKENDS if be != "cpp" or ops.has_kernel("sparse_align", "cpu")]:
        for k in (1, 2, 3, 4):
            for intersect in (True, False):
                what = f"{backend} k={k} {'intersect' if intersect else 'union'}"
                crow, col, vals = sparse_align(xs[:k], intersect=intersect, backend=backend)
                want = reference_sparse_align(xs[:k], intersect)
                for got, w, name in zip((crow, col, vals), want, ("crow", "col", "vals")):
                    _equal(got, w, f"{what} {name}", seed)
                SparseRows(crow, col, vals[0].contiguous(), n).check("aligned")  # ascending columns per row
                if mode == "identical" or k == 1:
                    _equal(col, xs[0].col, f"{what}: identical supports keep every column", seed)
                if mode == "disjoint" and intersect and k > 1:
                    assert col.numel() == 0, what


@pytest.mark.skipif(not ops.has_kernel("sparse_align", "cpu"), reason="compiled kernel not built")
@pytest.mark.parametrize("intersect", [True, False], ids=["intersect", "union"])
def test_align_kernel_skewed_lengths(seed, intersect):
    """A short row against rows hundreds of times longer (the galloping cursor), against the reference."""
    gen = torch.Generator().manual_seed(seed)
    n, b = 20000, 6
    short = random_rows(b, n, gen, kinds=("one", "few"))
    long = random_rows(b, n, gen, kinds=("many",))
    full = SparseRows(torch.arange(b + 1) * n, torch.arange(n).repeat(b), torch.rand(b * n, generator=gen), n)
    for xs in ([short, long], [long, short, full], [full, short]):
        got = sparse_align(xs, intersect=intersect, backend="cpp")
        for g, w, name in zip(got, reference_sparse_align(xs, intersect), ("crow", "col", "vals")):
            _equal(g, w, name, seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tnorm", TNORMS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("mode", ["random", "nested"])
def test_intersect_union_equal_dense_ops(seed, backend, tnorm, k, mode):
    require_backend(backend, "sparse_align", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, b = 700, 40
    xs = _batches(k, b, n, mode, gen)
    dense = [x.to_dense() for x in xs]
    got = intersect_sparse(xs, tnorm=tnorm, backend=backend)
    got.check("intersection")
    _equal(got.to_dense(), ops.intersect(*dense, tnorm=tnorm), "intersect_sparse vs ops.intersect", seed)
    got = union_sparse(xs, tnorm=tnorm, backend=backend)
    got.check("union")
    _equal(got.to_dense(), ops.union(*dense, tnorm=tnorm), "union_sparse vs ops.union", seed)
    # a dense argument (full support) mixed in: gathered on the sparse arguments' support, in argument order
    full = torch.rand(b, n, generator=gen)
    args = [xs[0], full] + xs[1:]
    got = intersect_sparse(args, tnorm=tnorm, backend=backend)
    _equal(got.to_dense(), ops.intersect(dense[0], full, *dense[1:], tnorm=tnorm),
           "intersect_sparse (dense argument) vs ops.intersect", seed)


def test_align_errors():
    gen = torch.Generator().manual_seed(0)
    x = random_rows(4, 20, gen)
    for backend in ("reference",) + (("cpp",) if ops.has_kernel("sparse_align", "cpu") else ()):
        with pytest.raises(UserError, match="at least one"):
            sparse_align([], intersect=True, backend=backend)
        with pytest.raises(UserError, match="differs from argument 0"):  # B mismatch
            sparse_align([x, random_rows(5, 20, gen)], intersect=True, backend=backend)
        with pytest.raises(UserError, match="differs from argument 0"):  # N mismatch
            union_sparse([x, random_rows(4, 21, gen)], backend=backend)
        with pytest.raises(UserError, match="int64 crow/col"):
            sparse_align([x, SparseRows(x.crow.int(), x.col, x.val, 20)], intersect=False, backend=backend)
        with pytest.raises(UserError, match="strictly ascending"):
            bad = SparseRows(torch.tensor([0, 2]), torch.tensor([3, 1]), torch.ones(2), 20)
            sparse_align([bad], intersect=True, backend=backend)
        with pytest.raises(UserError, match="at least one SparseRows"):
            intersect_sparse([x.to_dense()], backend=backend)
        with pytest.raises(UserError, match="argument 1"):
            intersect_sparse([x, torch.rand(4, 19)], backend=backend)
        with pytest.raises(UserError, match="tnorm"):
            union_sparse([x], tnorm="lukasiewicz", backend=backend)


@pytest.mark.skipif(not ops.has_kernel("sparse_align", "cpu"), reason="compiled kernel not built")
def test_align_kernel_checks():
    f = torch.ops.kgreason.sparse_align
    c, i, v = torch.tensor([0, 1, 2]), torch.tensor([1, 2]), torch.ones(2)
    with pytest.raises(RuntimeError, match="one tensor per input"):
        f([c, c], [i], [v], True)
    with pytest.raises(RuntimeError, match="has 1 rows, input 0 has 2"):
        f([c, torch.tensor([0, 2])], [i, i], [v, v], False)
    with pytest.raises(RuntimeError, match="must be int64"):
        f([c.int()], [i], [v], True)
    with pytest.raises(RuntimeError, match="end at nnz"):
        f([torch.tensor([0, 1, 3])], [i], [v], True)


def test_module_docstring_example():
    import doctest
    import sys
    import warnings

    import ops.sparse_rows  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "sparse CSR is beta" note
        res = doctest.testmod(sys.modules["ops.sparse_rows"], verbose=False)
    assert res.failed == 0 and res.attempted > 0


