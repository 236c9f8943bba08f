"""The batch-minor pull kernel of ``ops.project`` (tiles of 16/32 queries, accumulator chains,
register transposes) and the ``out=`` outputs of ``ops.project`` (one matrix or a stack with ``rel``).

Every result is compared, bit for bit and argmax included, with the pure-torch reference
(``backend="reference"``) or the brute-force dense product.
"""
from __future__ import annotations

import resource

import pytest
import torch

import ops
from _ops_helpers import dense_project, lane_grid, random_batch, random_matrix, require_backend, sparse_project


CPP = ops.extension_available()
needs_cpp = pytest.mark.skipif(not CPP, reason="compiled extension ops._C not built")


def _check_equal(got, want, what: str, seed: int):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)} (seed={seed})"
    if not torch.equal(got.cpu(), want.cpu()):
        diff = (got.cpu() != want.cpu()).nonzero()[:5].tolist()
        raise AssertionError(f"{what}: differs at {diff} (seed={seed})")


class _threads:
    """torch.set_num_threads for a block (the kernel splits work by the thread count)."""

    def __init__(self, n: int):
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


# ------------------------------------------------------------------------------------ pull kernel
@needs_cpp
@pytest.mark.parametrize("index_dtype,b,n,kind", lane_grid(  # full grid (330) in CI; the fast lane: each value once
    [torch.int32, torch.int64], [1, 2, 15, 16, 17, 31, 32, 33, 50, 64, 65], [1, 13, 16, 47, 160],
    ["dense", "sparse", "zeros"]))
def test_pull_matches_brute_force(seed, index_dtype, b, n, kind):
    """Every tile width (B = 1: scalar gather; <= 16; > 16), ragged last tiles, N below, at and above a
    multiple of the 16-float vector (transpose and write-back tails), empty rows and columns."""
    gen = torch.Generator().manual_seed(seed)
    m, d = random_matrix(n, 0.3, gen, index_dtype=index_dtype, empty_rows=n // 4, empty_cols=n // 4)
    x = random_batch(b, n, kind, gen)
    y_ref, a_ref = dense_project(x, d)
    prep = ops.prepare_matrices(m)
    y, a = ops.project(x, prep, return_argmax=True, strategy="pull", backend="cpp")
    _check_equal(y, y_ref, f"Y b={b} n={n} {kind}", seed)
    _check_equal(a, a_ref, f"argmax b={b} n={n} {kind}", seed)
    y2 = ops.project(x, prep, strategy="pull", backend="cpp")
    _check_equal(y2, y_ref, f"Y (values only) b={b} n={n} {kind}", seed)


@needs_cpp
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("b", [1, 7, 16, 33, 96])
def test_pull_argmax_ties(seed, index_dtype, b):
    """Values from {0.25, 0.5, 1} and X from {0, 0.5, 1}: most maxima are reached by several rows, and
    the accumulator chains of a column each hold their own first maximiser before they are merged."""
    gen = torch.Generator().manual_seed(seed)
    n = 70
    m, d = random_matrix(n, 0.5, gen, index_dtype=index_dtype, ties=True)
    d[:, 5] = 0.5  # a full column: every chain sees many equal products
    m = d.to_sparse_csr()
    m = torch.sparse_csr_tensor(m.crow_indices().to(index_dtype), m.col_indices().to(index_dtype), m.values(),
                                size=(n, n), check_invariants=True)
    x = random_batch(b, n, "dense", gen, ties=True)
    x[0] = 1.0  # one row of all-equal inputs (when b > 1 it shares a tile with the others)
    y_ref, a_ref = dense_project(x, d)
    y, a = ops.project(x, ops.prepare_matrices(m), return_argmax=True, strategy="pull", backend="cpp")
    _check_equal(y, y_ref, f"Y ties b={b}", seed)
    _check_equal(a, a_ref, f"argmax ties b={b}", seed)


@needs_cpp
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("b", [17, 32, 33, 50, 96])
@pytest.mark.parametrize("ties", [False, True])
def test_pull_long_columns_use_32_wide_tiles(seed, index_dtype, b, ties):
    """Non-empty columns holding >= 128 entries on average select 32-query tiles (with the tile-row
    prefetch) for B > 16: a few long columns, the rest empty, against brute force."""
    gen = torch.Generator().manual_seed(seed)
    n = 200
    _, d = random_matrix(n, 0.8, gen, ties=ties, empty_rows=20)
    keep = torch.zeros(n, dtype=torch.bool)
    keep[torch.randperm(n, generator=gen)[:12]] = True
    d[:, ~keep] = 0
    m = d.to_sparse_csr()
    m = torch.sparse_csr_tensor(m.crow_indices().to(index_dtype), m.col_indices().to(index_dtype), m.values(),
                                size=(n, n), check_invariants=True)
    assert m.values().numel() >= 128 * 12
    x = random_batch(b, n, "dense", gen, ties=ties)
    y_ref, a_ref = dense_project(x, d)
    prep = ops.prepare_matrices(m)
    y, a = ops.project(x, prep, return_argmax=True, strategy="pull", backend="cpp")
    _check_equal(y, y_ref, f"Y b={b}", seed)
    _check_equal(a, a_ref, f"argmax b={b}", seed)
    _check_equal(ops.project(x, prep, strategy="pull", backend="cpp"), y_ref, f"Y values only b={b}", seed)


@needs_cpp
@pytest.mark.parametrize("threads,b", lane_grid([1, 2, 3], [1, 16, 40, 45, 96, 97, 130]))  # fast lane: 7 of 21
def test_pull_parallel_split_equals_reference(seed, threads, b):
    """A matrix big enough (~1 ms of work) for the kernel to go parallel: tiles dealt to threads
    (a private transposed copy each), tiles split into column ranges (tile count not a multiple
    of the thread count), or one shared copy when there are fewer tiles than threads.  Against brute force
    over the nonzeros (sparse_project: ~3x faster here than the reference backend, which the fast lane's cases
    spent ~5 s of CPU in; test_sparse_project_is_dense_project checks it)."""
    gen = torch.Generator().manual_seed(seed)
    n = 1500
    m, d = random_matrix(n, 0.12, gen, empty_rows=40, empty_cols=200)
    if b % 2 == 0:  # long columns (>= 128 entries each on average): 32-wide tiles
        d[:, torch.randperm(n, generator=gen)[: n // 2]] = 0
        d[:, :40] = 0.5
        m = d.to_sparse_csr()
    prep = ops.prepare_matrices(m)
    x = random_batch(b, n, "dense", gen)
    x[b // 2] = 0.0  # an all-zero row inside a tile
    y_ref, a_ref = sparse_project(x, d)
    with _threads(threads):
        y, a = ops.project(x, prep, return_argmax=True, strategy="pull", backend="cpp")
        y2 = ops.project(x, prep, strategy="pull", backend="cpp")
    _check_equal(y, y_ref, f"Y threads={threads} b={b}", seed)
    _check_equal(a, a_ref, f"argmax threads={threads} b={b}", seed)
    _check_equal(y2, y_ref, f"Y values only threads={threads} b={b}", seed)


@pytest.mark.parametrize("ties", [False, True])
def test_sparse_project_is_dense_project(seed, ties):
    """The parallel-split test's oracle (tests/_ops_helpers.sparse_project) equals brute force, ties, empty rows
    and columns and an all-zero query included."""
    gen = torch.Generator().manual_seed(seed)
    _, d = random_matrix(60, 0.3, gen, ties=ties, empty_rows=5, empty_cols=7)
    x = random_batch(9, 60, "dense", gen, ties=ties)
    x[4] = 0.0
    y, a = sparse_project(x, d)
    y_ref, a_ref = dense_project(x, d)
    assert torch.equal(y, y_ref) and torch.equal(a, a_ref)


@needs_cpp
@pytest.mark.parametrize("b", [1, 20, 70])
def test_pull_empty_matrix_and_all_zero_x(seed, b):
    n = 37
    gen = torch.Generator().manual_seed(seed)
    empty = torch.sparse_csr_tensor(torch.zeros(n + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                                    torch.zeros(0), size=(n, n), check_invariants=True)
    x = torch.rand(b, n, generator=gen)
    y, a = ops.project(x, empty, return_argmax=True, strategy="pull", backend="cpp")
    assert torch.equal(y, torch.zeros(b, n)) and torch.equal(a, torch.full((b, n), -1, dtype=torch.int32))
    m, _ = random_matrix(n, 0.4, gen)
    y, a = ops.project(torch.zeros(b, n), m, return_argmax=True, strategy="pull", backend="cpp")
    assert torch.equal(y, torch.zeros(b, n)) and torch.equal(a, torch.full((b, n), -1, dtype=torch.int32))


@needs_cpp
@pytest.mark.parametrize("b", [3, 40])
def test_negated_and_multi_share_the_chained_gather(seed, b):
    """The negated and the multi-relation (``rel``) pulls use the same column gather (accumulator chains):
    ties and a full column through both, against the references."""
    gen = torch.Generator().manual_seed(seed)
    n, r = 60, 3
    mats = [random_matrix(n, 0.4, gen, ties=True)[1] for _ in range(r)]
    for d in mats:
        d[:, 7] = 0.25
    x = random_batch(b, n, "dense", gen, ties=True)
    prep = ops.prepare_matrices(mats[0].to_sparse_csr())
    want = ops.project(x, prep, negate=True, return_argmax=True, backend="reference")
    got = ops.project(x, prep, negate=True, return_argmax=True, backend="cpp")
    _check_equal(got[0], want[0], "negated Y", seed)
    _check_equal(got[1], want[1], "negated argmax", seed)
    stack = ops.prepare_matrices(torch.cat(mats).to_sparse_csr())
    rel = torch.randint(0, r, (b,), generator=gen)
    for negated in (False, True):
        want = ops.project(x, stack, rel, negate=negated, return_argmax=True, backend="reference")
        got = ops.project(x, stack, rel, negate=negated, return_argmax=True, strategy="pull", backend="cpp")
        _check_equal(got[0], want[0], f"multi Y negated={negated}", seed)
        _check_equal(got[1], want[1], f"multi argmax negated={negated}", seed)


# ------------------------------------------------------------------------------------------ out=
def _garbage(shape, dtype):
    return torch.full(shape, float("nan")) if dtype == torch.float32 else torch.full(shape, -7, dtype=dtype)


@pytest.mark.parametrize("backend", ["cpp", "reference"])
@pytest.mark.parametrize("strategy", ["push", "pull", "auto"])
@pytest.mark.parametrize("kind", ["onehot", "dense"])
def test_project_out_reused(seed, backend, strategy, kind):
    """Repeated calls into the same (garbage-filled) outputs give the fresh call's answers and return them."""
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, b = 90, 37
    m, _ = random_matrix(n, 0.1, gen, empty_rows=9, empty_cols=9)
    prep = ops.prepare_matrices(m)
    y_out, a_out = _garbage((b, n), torch.float32), _garbage((b, n), torch.int32)
    for _ in range(3):
        x = random_batch(b, n, kind, gen)
        want_y, want_a = ops.project(x, prep, return_argmax=True, strategy=strategy, backend=backend)
        y, a = ops.project(x, prep, return_argmax=True, strategy=strategy, backend=backend, out=(y_out, a_out))
        assert y is y_out and a is a_out
        _check_equal(y_out, want_y, f"out Y {backend}/{strategy}", seed)
        _check_equal(a_out, want_a, f"out argmax {backend}/{strategy}", seed)
        y_out.fill_(float("nan"))
        y = ops.project(x, prep, strategy=strategy, backend=backend, out=y_out)
        assert y is y_out
        _check_equal(y_out, want_y, f"out Y values only {backend}/{strategy}", seed)
        a_out.fill_(-7)


@pytest.mark.parametrize("backend", ["cpp", "reference"])
@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize("strategy", ["push", "pull", "auto"])
def test_project_multi_out_reused(seed, backend, negated, strategy):
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, r, b = 40, 4, 29
    mats = [random_matrix(n, 0.15, gen)[1] for _ in range(r)]
    stack = ops.prepare_matrices(torch.cat(mats).to_sparse_csr())
    y_out, a_out = _garbage((b, n), torch.float32), _garbage((b, n), torch.int32)
    for kind in ("onehot", "dense", "sparse"):
        x = random_batch(b, n, kind, gen)
        rel = torch.randint(0, r, (b,), generator=gen)
        want_y, want_a = ops.project(x, stack, rel, negate=negated, return_argmax=True, strategy=strategy,
                                     backend=backend)
        y, a = ops.project(x, stack, rel, negate=negated, return_argmax=True, strategy=strategy,
                           backend=backend, out=(y_out, a_out))
        assert y is y_out and a is a_out
        _check_equal(y_out, want_y, f"multi out Y {kind}", seed)
        _check_equal(a_out, want_a, f"multi out argmax {kind}", seed)
        y_out.fill_(float("nan"))
        assert ops.project(x, stack, rel, negate=negated, strategy=strategy, backend=backend,
                           out=y_out) is y_out
        _check_equal(y_out, want_y, f"multi out Y values only {kind}", seed)


def _bad_outs(b: int, n: int, x: torch.Tensor):
    """(out, return_argmax, expected name in the message, expected words)."""
    y, a = torch.empty(b, n), torch.empty(b, n, dtype=torch.int32)
    return [
        (torch.empty(b, n + 1), False, "out:", "shape"),
        (torch.empty(b + 1, n), False, "out:", "shape"),
        (torch.empty(b, n, dtype=torch.float64), False, "out:", "dtype"),
        (torch.empty(b, n, device="meta"), False, "out:", "meta"),
        (torch.empty(n, b).t(), False, "out:", "contiguous"),
        (x, False, "out:", "shares memory"),
        ("y", False, "out:", "torch.Tensor"),
        ((y, a), False, "out:", "return_argmax"),
        (y, True, "out:", "pair"),
        ((y, torch.empty(b, n)), True, "out[1]:", "dtype"),
        ((y, torch.empty(b, n - 1, dtype=torch.int32)), True, "out[1]:", "shape"),
        ((torch.empty(b, n, dtype=torch.int32), a), True, "out[0]:", "dtype"),
        ((y, y.view(torch.int32)), True, "out[1]:", "shares memory"),
    ]


@pytest.mark.parametrize("backend", ["cpp", "reference"])
def test_out_errors_name_the_argument(seed, backend):
    require_backend(backend, "project", "cpu")
    gen = torch.Generator().manual_seed(seed)
    n, b, r = 20, 5, 2
    m, d = random_matrix(n, 0.2, gen)
    stack = ops.prepare_matrices(torch.cat([d, d]).to_sparse_csr())
    x = torch.rand(b, n, generator=gen)
    rel = torch.randint(0, r, (b,), generator=gen)
    for out, want_arg, name, words in _bad_outs(b, n, x):
        with pytest.raises(ValueError, match=".*".join([name.replace("[", r"\[").replace("]", r"\]"), words])):
            ops.project(x, m, return_argmax=want_arg, backend=backend, out=out)
        with pytest.raises(ValueError, match=".*".join([name.replace("[", r"\[").replace("]", r"\]"), words])):
            ops.project(x, stack, rel, return_argmax=want_arg, backend=backend, out=out)


@needs_cpp
def test_out_kernels_check_their_outputs():
    """The out ops themselves reject wrong outputs (callers that skip the Python wrapper)."""
    gen = torch.Generator().manual_seed(0)
    n, b = 20, 4
    p = ops.prepare_matrices(random_matrix(n, 0.2, gen)[0])
    x = torch.rand(b, n, generator=gen)
    empty = torch.empty(0, dtype=torch.int32)
    args = (x, torch.zeros(b, dtype=torch.int64), p.crow, p.col, p.val, p.ccol, p.row, p.tval, n, 0, False, 3.0)
    with pytest.raises(RuntimeError, match="shape"):
        torch.ops.kgreason.project_out(*args, torch.empty(b, n + 1), empty)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.kgreason.project_out(*args, torch.empty(b, n, dtype=torch.float64), empty)
    with pytest.raises(RuntimeError, match="int32"):
        torch.ops.kgreason.project_out(*args, torch.empty(b, n), torch.empty(b, n))
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.kgreason.project_out(*args, torch.empty(n, b).t(), empty)
    with pytest.raises(RuntimeError, match="memory location"):
        torch.ops.kgreason.project_out(*args, x, empty)


@needs_cpp
def test_out_spares_the_page_faults():
    """A 33.5 MB output (above glibc's 32 MB mmap ceiling) page-faults in on every fresh call;
    written into a reused out= buffer it does not (counts: resource.getrusage ru_minflt)."""
    gen = torch.Generator().manual_seed(0)
    n, b = 8192, 1024
    m, _ = random_matrix(64, 0.2, gen)  # a small matrix, embedded in an n x n one: push work is tiny
    crow = torch.cat([m.crow_indices().long(), torch.full((n - 64,), int(m.crow_indices()[-1]))])
    big = torch.sparse_csr_tensor(crow, m.col_indices().long(), m.values(), size=(n, n), check_invariants=True)
    prep = ops.prepare_matrices(big)
    x = torch.zeros(b, n)
    x[torch.arange(b), torch.randint(0, 64, (b,), generator=gen)] = 1.0
    pages = b * n * 4 // resource.getpagesize()

    def faults(fn):
        fn()  # warm-up (thread scratch, allocator)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    fresh = faults(lambda: ops.project(x, prep, strategy="push", validate=False))
    y = torch.empty(b, n)
    reused = faults(lambda: ops.project(x, prep, strategy="push", validate=False, out=y))
    assert reused < pages // 10, f"out= call page-faulted {reused} times (Y is {pages} pages; fresh: {fresh})"


# One interpreter imports torch and ops once, then forks a child per KGREASON_OUTPUT_CACHE_MB value ("-": unset):
# the extension reads the variable at its first output, so each child sets it before any call.  A fresh
# interpreter per value cost ~2 s of CPU each (torch's import).  Each child prints its page faults.
_FAULTS_SCRIPT = r"""
import os, resource, sys, torch, ops


def faults():
    torch.manual_seed(0)
    n, b = 8192, 1024
    m = torch.eye(64).to_sparse_csr()
    crow = torch.cat([m.crow_indices().long(), torch.full((n - 64,), 64)])
    prep = ops.prepare_matrices(torch.sparse_csr_tensor(crow, m.col_indices().long(), m.values(), size=(n, n),
                                                       check_invariants=True))
    x = torch.zeros(b, n)
    x[torch.arange(b), torch.randint(0, 64, (b,))] = 1.0
    y = ops.project(x, prep, strategy="push", validate=False)
    del y
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = ops.project(x, prep, strategy="push", validate=False)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


for value in sys.argv[1:]:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if value == "-":
                os.environ.pop("KGREASON_OUTPUT_CACHE_MB", None)
            else:
                os.environ["KGREASON_OUTPUT_CACHE_MB"] = value
            print(value, faults(), flush=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"the child for KGREASON_OUTPUT_CACHE_MB={value} failed (status {status})")
"""


def _big_case(seed: int, b: int = 1030, n: int = 8192):
    """A one-hot batch whose (b, n) float32 output is above the 32 MiB output-cache threshold."""
    gen = torch.Generator().manual_seed(seed)
    m, _ = random_matrix(64, 0.2, gen)
    crow = torch.cat([m.crow_indices().long(), torch.full((n - 64,), int(m.crow_indices()[-1]))])
    csr = torch.sparse_csr_tensor(crow, m.col_indices().long(), m.values(), size=(n, n), check_invariants=True)
    x = torch.zeros(b, n)
    x[torch.arange(b), torch.randint(0, 64, (b,), generator=gen)] = 1.0
    return csr, x, gen


@needs_cpp
@pytest.mark.parametrize("op", ["project", "project_rel", "project_negate", "intersect", "union"])
def test_large_outputs_from_the_cache_equal_and_usable(op):
    """Outputs of >= 32 MiB come from the output cache (csrc/cpu/fuzzy_common.h, empty_output): equal to
    the reference, and the tensor behaves as any other (written, cloned, freed, its block reused)."""
    csr, x, gen = _big_case(1)
    prep = ops.prepare_matrices(csr)
    b, n = x.shape
    if op == "project":
        run, want = (lambda: ops.project(x, prep)), ops.project(x, prep, backend="reference")
    elif op == "project_negate":
        run, want = (lambda: ops.project(x, prep, negate=True)), ops.project(x, prep, negate=True, backend="reference")
    elif op == "project_rel":
        st = ops.prepare_matrices(csr)
        rel = torch.zeros(b, dtype=torch.int64)
        run, want = (lambda: ops.project(x, st, rel)), ops.project(x, prep, backend="reference")
    else:
        z = torch.rand(b, n, generator=gen)
        fn = getattr(ops, op)
        run, want = (lambda: fn(x, z)), fn(x, z, backend="reference")
    got = run()
    _check_equal(got, want, op, 1)
    assert got.is_contiguous() and got.shape == (b, n)
    got.fill_(0.25)  # writable; then freed: its block goes back to the cache
    del got
    first = run()  # the recycled block: every entry overwritten
    _check_equal(first, want, op + " (recycled block)", 1)
    second = run()  # first is alive: a different block
    assert second.data_ptr() != first.data_ptr()
    _check_equal(first, want, op + " (after another call)", 1)
    _check_equal(second, want, op + " (second live output)", 1)


@needs_cpp
def test_fresh_large_output_spares_the_page_faults_and_cache_can_be_turned_off():
    """After the first call, a fresh 33.5 MB output reuses a cached block (no page faults instead of
    ~8,200); KGREASON_OUTPUT_CACHE_MB=0 restores the default allocator (a process each, forked before the first
    output: the setting is read once)."""
    import os
    import subprocess
    import sys

    pages = 1024 * 8192 * 4 // resource.getpagesize()

    env = dict(os.environ)
    env.pop("KGREASON_OUTPUT_CACHE_MB", None)
    out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, "-", "0", "16"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = dict(line.split() for line in out.stdout.strip().splitlines())
    cached, off, tiny = int(got["-"]), int(got["0"]), int(got["16"])
    assert cached < pages // 10, f"fresh output faulted {cached} times with the cache (Y is {pages} pages)"
    assert off > pages // 2, f"KGREASON_OUTPUT_CACHE_MB=0: {off} faults; expected about {pages}"
    assert tiny > pages // 2, f"a 16 MB cap cannot keep a 33.5 MB block, yet only {tiny} faults"
