"""Projection throughput: our kernels vs baselines, measured side by side in one run.

Run (one pytest-benchmark run saving its numbers, then the reports writing
benchmarks/results/ops_projection.md and ops_single_relation.md)::

    python -m pytest benchmarks/test_ops_bench.py -q
    python -m benchmarks.report ops_projection ops_single_relation

``KGREASON_FB15K237_ARTIFACT=<folder>`` points at the FB15k-237 artifact (default
``artifacts/FB15k-237``); ``KGREASON_BENCH_MACHINE`` overrides the machine line of the
table (e.g. to name the CPU generation a VM's /proc/cpuinfo hides).

``KGREASON_BENCH_THREADS=1`` runs every method on one thread (torch.set_num_threads)
and saves ``ops_projection_1thread`` instead (``python -m benchmarks.report
ops_projection_1thread``): on a machine shared with other jobs the single-threaded
ratios are the stable ones, because a parallel region waits for descheduled workers.

Matrices: relations of the FB15k-237 artifact (the one with the most entries
and the one at the median) when ``fb15k237_artifact`` is available, else a
synthetic power-law matrix of the same size (N = 14,505, ~1.4M entries).
Batches: B in {1, 16, 256, 1024}; X one-hot anchors (a 1p query's first hop)
or dense uniform X (a later hop).  Methods:

- ``ours``: ``ops.project`` (cpp backend, strategy auto, values only,
  ``validate=False`` because no baseline validates its input); ``ours+argmax``
  with the argmax the engine needs for explanations; ``ours+out`` writing into
  a (B, N) output preallocated once and reused (``out=``), as a caller that
  projects batches of one shape repeatedly does: no page faults for a fresh
  output (a (1024, 14505) float32 Y is 59 MB, above glibc's mmap threshold).
- ``reference``: ``ops.project(..., backend="reference")`` (pure torch scatter).
- ``sparse.mm``: ``torch.sparse.mm(Mt, X.T, reduce="amax").T``.  For a CSR
  ``A`` it computes ``out[r, :] = max_k A[r, k] * D[k, :]`` over the stored
  entries of row r (0 for an empty row), so with ``A = M^T`` (our CSC read as
  CSR) and ``D = X^T`` it is exactly ``Y^T``; values are in [0, 1] so
  "max over stored entries" and "max over all i" agree.
- ``qto_loop``: QTO-style, one query at a time: densify the rows of M of the
  query's active entities (chunks of 512 rows, scipy slicing) and take the max
  of ``x_i * M[i, :]``.
- ``torch_sparse`` / ``graphblas``: only when installed (skipped otherwise).

Slow baselines are timed on the first ``SLICE`` queries of a batch and scaled
by ``B / SLICE`` (marked ``*`` in the table); every other number is the median
of several rounds of the whole batch.  The table reports each baseline's time
divided by ours (> 1: ours is faster), and our effective memory bandwidth
(X read + Y written + the matrix entries the chosen strategy must read)
next to a plain-copy bandwidth measured in the same run.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ops
from conftest import fb15k237_artifact_path, machine_description, measurements_for
from report import RESULTS  # benchmarks/report.py (rootdir-relative import)
from kgreason.constants import QTO_NEG_SCALE

BATCHES = (1, 16, 256, 1024)
KINDS = ("onehot", "dense")
N_SYNTH = 14_505
NNZ_SYNTH = 1_400_000
SLICE = {"reference": 16, "qto_loop": 2}
THREADS = int(os.environ.get("KGREASON_BENCH_THREADS", "0"))
if THREADS > 0:
    torch.set_num_threads(THREADS)  # queries actually timed for the slow baselines
_INFO: dict[str, str] = {}

try:
    import torch_sparse  # noqa: F401

    HAVE_TORCH_SPARSE = True
except ImportError:
    HAVE_TORCH_SPARSE = False
try:
    import graphblas  # noqa: F401

    HAVE_GRAPHBLAS = True
except ImportError:
    HAVE_GRAPHBLAS = False


def powerlaw_matrix(n: int = N_SYNTH, nnz: int = NNZ_SYNTH, alpha: float = 0.8, seed: int = 0):
    """A random (n, n) scipy CSR with power-law row and column degrees, values in (0, 1]."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** alpha
    w /= w.sum()
    prow, pcol = rng.permutation(n), rng.permutation(n)
    keys = np.zeros(0, dtype=np.int64)
    while len(keys) < nnz:
        r = prow[rng.choice(n, size=nnz, p=w)]
        c = pcol[rng.choice(n, size=nnz, p=w)]
        keys = np.unique(np.concatenate([keys, r.astype(np.int64) * n + c]))
    keys = rng.permutation(keys)[:nnz]
    vals = (rng.random(nnz) * 0.999 + 0.001).astype(np.float32)
    m = sp.csr_matrix((vals, (keys // n, keys % n)), shape=(n, n))
    m.sort_indices()
    return m


def _torch_csr(m):
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int32)), torch.from_numpy(m.indices.astype(np.int32)),
                                   torch.from_numpy(m.data.astype(np.float32)), size=m.shape)


class Case:
    """One matrix with everything each method needs, built once."""

    def __init__(self, name: str, scipy_csr):
        self.name = name
        self.sp = scipy_csr.tocsr()
        self.n = self.sp.shape[0]
        self.M = _torch_csr(self.sp)
        self.P = ops.prepare_matrices(self.M)
        self.Mt = torch.sparse_csr_tensor(self.P.ccol.long(), self.P.row.long(), self.P.tval, size=(self.n, self.n))
        self.nnz = self.P.nnz
        self.anchors = torch.from_numpy(np.flatnonzero(np.diff(self.sp.indptr) > 0))


def _cases(artifact) -> list[Case]:
    if artifact is None:
        _INFO["data"] = (f"synthetic power-law matrix (no FB15k-237 artifact found): N = {N_SYNTH}, "
                         f"{NNZ_SYNTH} entries, degrees ~ rank^-0.8")
        return [Case("synthetic", powerlaw_matrix())]
    nnz = artifact.nnz_per_relation()
    order = np.argsort(nnz)
    picks = {"largest": int(order[-1]), "median": int(order[len(order) // 2])}
    _INFO["data"] = f"FB15k-237 artifact ({fb15k237_artifact_path()}) relations: " + ", ".join(
        f"{k} = {artifact.relations[r]!r} ({int(nnz[r])} entries)" for k, r in picks.items())
    return [Case(f"{k}: {artifact.relations[r]}", artifact.relation_block(r)) for k, r in picks.items()]


@pytest.fixture(scope="module")
def cases(fb15k237_artifact):
    out = _cases(fb15k237_artifact)
    m = _projection_measurements()
    m.info.update(data=_INFO["data"], cases=[dict(name=c.name, n=c.n, nnz=int(c.nnz)) for c in out],
                  batches=list(BATCHES), kinds=list(KINDS), methods=list(METHODS), slice=dict(SLICE))
    measurements_for("ops_single_relation").info.update(data=_INFO["data"], batches=list(BATCHES), kinds=list(KINDS),
                                                        variants=list(FOLD_VARIANTS))
    return out


def _projection_measurements():
    """The projection table's measurements (saved as ops_projection, or ops_projection_<n>thread)."""
    m = measurements_for("ops_projection")
    m.name = "ops_projection" if THREADS <= 0 else f"ops_projection_{THREADS}thread"
    return m


def make_x(case: Case, b: int, kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "onehot":
        x = torch.zeros(b, case.n)
        pick = case.anchors[torch.randint(0, len(case.anchors), (b,), generator=g)]
        x[torch.arange(b), pick] = 1.0
        return x
    return torch.rand(b, case.n, generator=g)


def qto_loop(case: Case, x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        active = torch.nonzero(x[b]).squeeze(1).numpy()
        y = out[b]
        for lo in range(0, len(active), 512):
            rows = active[lo:lo + 512]
            dense = torch.from_numpy(case.sp[rows].toarray())
            torch.maximum(y, (x[b, torch.from_numpy(rows)][:, None] * dense).amax(dim=0), out=y)
    return out


def _method(case: Case, name: str):
    if name == "ours":
        return lambda x: ops.project(x, case.P, backend="cpp", validate=False)
    if name == "ours+argmax":
        return lambda x: ops.project(x, case.P, backend="cpp", validate=False, return_argmax=True)
    if name == "ours+out":
        bufs: dict[tuple, torch.Tensor] = {}

        def run_out(x):
            y = bufs.get(tuple(x.shape))
            if y is None:
                y = bufs[tuple(x.shape)] = torch.empty(x.shape)
            return ops.project(x, case.P, backend="cpp", validate=False, out=y)

        return run_out
    if name == "reference":
        return lambda x: ops.project(x, case.P, backend="reference", validate=False)
    if name == "sparse.mm":
        return lambda x: torch.sparse.mm(case.Mt, x.t().contiguous(), reduce="amax").t()
    if name == "qto_loop":
        return lambda x: qto_loop(case, x)
    if name == "torch_sparse":
        from torch_sparse import SparseTensor, matmul

        st = SparseTensor(rowptr=case.P.ccol.long(), col=case.P.row.long(), value=case.P.tval,
                          sparse_sizes=(case.n, case.n))
        return lambda x: matmul(st, x.t().contiguous(), reduce="max").t()
    if name == "graphblas":
        import graphblas as gb

        A = gb.Matrix.from_csr(case.sp.indptr, case.sp.indices, case.sp.data, ncols=case.n)

        def run(x):
            X = gb.Matrix.from_dense(x.numpy(), missing_value=0.0)
            return X.mxm(A, gb.semiring.max_times).new().to_dense(fill_value=0.0)

        return run
    raise KeyError(name)


METHODS = ["ours", "ours+argmax", "ours+out", "sparse.mm", "reference", "qto_loop", "torch_sparse", "graphblas"]


@pytest.mark.benchmark
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("case_index", [0, 1])  # one benchmark fixture per test: one matrix each
def test_projection(benchmark, cases, case_index, b, kind, method):
    if case_index >= len(cases):
        pytest.skip("only one matrix (synthetic data)")
    m = _projection_measurements()
    row = f"{cases[case_index].name}|{b}|{kind}"
    why = ("torch_sparse not installed (optional; ~18 min to compile)" if method == "torch_sparse" and not HAVE_TORCH_SPARSE
           else "python-graphblas not installed (optional)" if method == "graphblas" and not HAVE_GRAPHBLAS
           else "compiled extension not available" if method.startswith("ours") and not ops.has_kernel("project", "cpu")
           else None)
    if why:
        for column in (method,) + (("matrix_bytes",) if method == "ours" else ()):
            m.not_applicable(row, column, why)
        pytest.skip(why)
    for case in cases[case_index:case_index + 1]:
        x = make_x(case, b, kind)
        fn = _method(case, method)
        timed = min(b, SLICE.get(method, b))
        xs = x[:timed].contiguous()
        if method != "ours" and timed <= 16:  # every method must compute the same Y (exact products and maxima)
            want = ops.project(xs, case.P, backend="cpp" if ops.extension_available() else "reference")
            got = fn(xs)
            got = got[0] if isinstance(got, tuple) else torch.as_tensor(got)
            assert torch.equal(got, want), f"{method} disagrees with ours on {case.name}"
        t0 = time.perf_counter()
        fn(xs)
        once = time.perf_counter() - t0
        rounds = int(max(2, min(15, 1.5 / max(once, 1e-6))))
        benchmark.extra_info.update(matrix=case.name, B=b, kind=kind, timed_queries=timed)
        benchmark.pedantic(fn, args=(xs,), rounds=rounds, iterations=1, warmup_rounds=0)
        m.put(row, method, benchmark.stats.stats.median * b / timed)  # scaled to B when timed < B (SLICE)
        if method == "ours":  # the plan auto picks, and the matrix bytes it reads (the bandwidth column)
            strategy = ops.choose_strategy(x, case.P)
            m.info.setdefault("strategies", {})[row] = strategy
            if strategy == "push":  # the rows of the active entities only
                deg = (case.P.crow[1:] - case.P.crow[:-1]).double()
                matrix_bytes = 8 * float(((x > 0).double() @ deg).sum()) + 4 * (case.n + 1)
            else:
                matrix_bytes = case.nnz * 8 + (case.n + 1) * 4
            m.put(row, "matrix_bytes", matrix_bytes)


def copy_bandwidth() -> float:
    """GB/s of a plain 256 MB tensor copy (read + write), best of 5."""
    src = torch.rand(64 * 1024 * 1024)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def test_copy_bandwidth():
    """The plain-copy bandwidth the projection table compares ours with, in the same run."""
    _projection_measurements().put("copy", "gb_s", copy_bandwidth())


# ----------------------------------------------------------------------------------------------------
# The single-relation case through the multi-relation kernel (issue 23: "the fold is measured, not assumed")
#
# ``single``: ``ops.project(x, P, negate=...)`` on the prepared matrix; ``multi``: the same matrix as a
# one-relation stack, every row relation 0 (``ops.project(x, S, rel)``).  Both are timed interleaved in one
# test (round k times single then multi), so a load spike hits both; medians.  The run saves its numbers as
# ``<--bench-out>/ops_single_relation_after.json``; ``python -m benchmarks.report ops_single_relation`` writes
# benchmarks/results/ops_single_relation.md from it and, when it lies beside it, the
# ``ops_single_relation_before.json`` that this file wrote in the checkout before issue 23's fold (the
# single-relation kernels it compared are gone).

FOLD_VARIANTS = ("values", "argmax", "negated", "negated+argmax")


def _fold_calls(case: Case, variant: str, b: int):
    """(single, multi) callables of one variant on the compiled kernels (values only or with argmax)."""
    neg, arg = variant.startswith("negated"), variant.endswith("argmax")
    if not hasattr(case, "S"):
        # the degenerate one-relation stack (R = 1), built by the stacked path (a (crow, col, val) triple)
        parts = (case.M.crow_indices(), case.M.col_indices(), case.M.values())
        case.S = ops.prepare_matrices(parts, num_entities=case.n)
    rel = torch.zeros(b, dtype=torch.int64)
    kw = dict(backend="cpp", validate=False, return_argmax=arg)
    # one entry point: the prepared matrix is the degenerate stack, rel None = relation 0
    single = lambda x: ops.project(x, case.P, negate=neg, neg_scale=QTO_NEG_SCALE, **kw)  # noqa: E731
    multi = lambda x: ops.project(x, case.S, rel, negate=neg, neg_scale=QTO_NEG_SCALE, **kw)  # noqa: E731
    return single, multi


@pytest.mark.benchmark
@pytest.mark.parametrize("variant", FOLD_VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b", BATCHES)
def test_fold_single_relation(cases, b, kind, variant):
    fold = measurements_for("ops_single_relation")
    fold.name = "ops_single_relation_after"  # this checkout is after issue 23's fold
    key = f"{b}|{kind}|{variant}"
    if not ops.has_kernel("project", "cpu"):
        for column in ("single_ms", "multi_ms", "rounds"):
            fold.not_applicable(key, column, "compiled extension not available")
        pytest.skip("compiled extension not available")
    case = cases[0]
    x = make_x(case, b, kind)
    single, multi = _fold_calls(case, variant, b)
    want, got = single(x), multi(x)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(want, got):  # the same Y (and argmax) bit for bit
        assert torch.equal(w, g), f"multi differs from single ({variant}, B={b}, {kind})"
    t0 = time.perf_counter()
    single(x)
    once = time.perf_counter() - t0
    rounds = int(max(5, min(21, 2.0 / max(once, 1e-6))))
    ts, tm = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        single(x)
        t1 = time.perf_counter()
        multi(x)
        t2 = time.perf_counter()
        ts.append(t1 - t0)
        tm.append(t2 - t1)
    strategy = "negated" if variant.startswith("negated") else ops.choose_strategy(x, case.P)
    fold.put(key, "single_ms", float(np.median(ts)) * 1e3)
    fold.put(key, "multi_ms", float(np.median(tm)) * 1e3)
    fold.put(key, "rounds", rounds)
    fold.info.setdefault("strategies", {})[key] = strategy


# ----------------------------------------------------------------------------------------------------
# Before / after the fold, side by side in one run: KGREASON_BENCH_BEFORE_TREE=<a checkout of the code before
# (its ops/_C built)> times every fold case on that tree and on this one, in two worker processes driven
# alternately (case by case, two passes), so that a load change on a shared machine hits both; both must
# return the same bits.  Writes benchmarks/results/ops_fold_before_after.md.  The worker runs on either tree,
# so it keeps the before tree's names (ops.prepare, ops.project_negated: removed from this one) where
# ops.prepare_matrices is missing.

_WORKER = r'''
import json, sys, time
import numpy as np, torch
torch.set_num_threads(int(sys.argv[2]))
import ops
new_api = hasattr(ops, "prepare_matrices")
z = np.load(sys.argv[1])
n = int(z["n"])
M = torch.sparse_csr_tensor(torch.from_numpy(z["indptr"]), torch.from_numpy(z["indices"]),
                            torch.from_numpy(z["data"]), size=(n, n), check_invariants=False)
P = ops.prepare_matrices(M) if new_api else ops.prepare(M)
anchors = torch.from_numpy(np.flatnonzero(np.diff(z["indptr"]) > 0))
for line in sys.stdin:
    job = json.loads(line)
    b, kind, variant, rounds = job["b"], job["kind"], job["variant"], job["rounds"]
    g = torch.Generator().manual_seed(0)
    if kind == "onehot":
        x = torch.zeros(b, n)
        x[torch.arange(b), anchors[torch.randint(0, len(anchors), (b,), generator=g)]] = 1.0
    else:
        x = torch.rand(b, n, generator=g)
    neg, arg = variant.startswith("negated"), variant.endswith("argmax")
    kw = dict(backend="cpp", validate=False, return_argmax=arg)
    # 3.0: QTO's scale (kgreason.constants.QTO_NEG_SCALE), a literal here: the before tree predates that module
    if new_api:
        fn = lambda: ops.project(x, P, negate=neg, neg_scale=3.0, **kw)
    elif neg:
        fn = lambda: ops.project_negated(x, P, neg_scale=3.0, **kw)
    else:
        fn = lambda: ops.project(x, P, **kw)
    out = fn()
    out = out if isinstance(out, tuple) else (out,)
    digest = [float(t.double().sum()) for t in out]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"times": times, "digest": digest, "file": ops.__file__}), flush=True)
'''


@pytest.mark.benchmark
def test_fold_before_after(cases, tmp_path):
    import json
    import subprocess

    before_tree = os.environ.get("KGREASON_BENCH_BEFORE_TREE")
    if not before_tree:
        pytest.skip("set KGREASON_BENCH_BEFORE_TREE to a checkout of the code before the fold (ops/_C built)")
    extra = os.environ.get("KGREASON_BENCH_FOLD_EXTRA", "")
    try:
        extra_b, extra_passes = ([int(v) for v in extra.split(":")[0].split(",")], int(extra.split(":")[1])) \
            if extra else ([], 0)
    except (ValueError, IndexError):
        pytest.fail(f"KGREASON_BENCH_FOLD_EXTRA={extra!r}: expected BATCHES:PASSES, e.g. 16:4 or 1,16:3")
    if not set(extra_b) <= set(BATCHES):
        pytest.fail(f"KGREASON_BENCH_FOLD_EXTRA={extra!r}: batch sizes must be among {BATCHES}")
    case = cases[0]
    m = case.sp
    npz = tmp_path / "matrix.npz"
    np.savez(npz, n=case.n, indptr=m.indptr.astype(np.int32), indices=m.indices.astype(np.int32),
             data=m.data.astype(np.float32))
    threads = str(THREADS if THREADS > 0 else torch.get_num_threads())
    trees = {"before": Path(before_tree).resolve(), "after": Path(__file__).resolve().parent.parent}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    workers = {k: subprocess.Popen([sys.executable, "-c", _WORKER, str(npz), threads], cwd=str(t), env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for k, t in trees.items()}
    times: dict[tuple, dict[str, list[float]]] = {}
    try:
        # two passes over every case, then KGREASON_BENCH_FOLD_EXTRA more over the batch sizes it names
        # ("16:4": four more passes over the B = 16 cases), each case timed on both trees back to back
        for batches in [BATCHES, BATCHES] + [tuple(extra_b)] * extra_passes:
            for b in batches:
                for kind in KINDS:
                    for variant in FOLD_VARIANTS:
                        rounds = 3 if b >= 256 and kind == "dense" else 101 if kind == "onehot" and b <= 16 else 9
                        digests = {}
                        for name, w in workers.items():
                            w.stdin.write(json.dumps(dict(b=b, kind=kind, variant=variant, rounds=rounds)) + "\n")
                            w.stdin.flush()
                            line = w.stdout.readline()
                            assert line, f"the {name} worker died"
                            res = json.loads(line)
                            times.setdefault((b, kind, variant), {}).setdefault(name, []).extend(res["times"])
                            digests[name] = res["digest"]
                            assert res["file"].startswith(str(trees[name])), f"{name} imported {res['file']}"
                        assert digests["before"] == digests["after"], f"results differ: {b} {kind} {variant}"
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait(timeout=60)
    load = os.getloadavg()
    lines = ["# `ops.project` before / after the fold (issue 23), side by side",
             "",
             f"Command: `KGREASON_BENCH_BEFORE_TREE={before_tree} "
             + (f"KGREASON_BENCH_THREADS={THREADS} " if THREADS > 0 else "")
             + (f"KGREASON_BENCH_FOLD_EXTRA={extra} " if extra else "")
             + " ".join(["python -m pytest"] + _without_plugin_flags(sys.argv[1:])) + "`  ",
             f"Machine: {os.environ.get('KGREASON_BENCH_MACHINE') or machine_description()}  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average at the end (1/5/15 min): "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (shared machine)  ",
             f"Data: {_INFO.get('data', '?')}",
             "",
             "One worker process per tree (`before`: the former `ops.project` / `ops.project_negated` kernels; "
             "`after`: `ops.project(x, P, negate=...)`, the folded kernel, P the one-relation stack), driven "
             "alternately case by case in two passes"
             + (f" (B = {', '.join(map(str, extra_b))}: {2 + extra_passes} passes)" if extra_passes else "")
             + "; medians and minima in ms over all passes; both trees "
             "returned the same Y and argmax (checksums) on every case.  `after / before` < 1: the fold is faster.  "
             "On a loaded machine the minimum (the run least disturbed by other jobs) is the stable estimate of "
             "a kernel's own cost; the medians show how much the load moved.",
             "",
             "| B | X | variant | before median ms | after median ms | after / before (medians) | before min ms "
             "| after min ms | after / before (minima) |",
             "|---|---|---|---|---|---|---|---|---|"]
    worst_med = worst_min = 0.0
    for (b, kind, variant), t in times.items():
        bf, af = float(np.median(t["before"])) * 1e3, float(np.median(t["after"])) * 1e3
        bm, am = min(t["before"]) * 1e3, min(t["after"]) * 1e3
        worst_med, worst_min = max(worst_med, af / bf), max(worst_min, am / bm)
        lines.append(f"| {b} | {kind} | {variant} | {bf:.3f} | {af:.3f} | {af / bf:.2f}x | {bm:.3f} | {am:.3f} "
                     f"| **{am / bm:.2f}x** |")
    lines += ["", f"Largest after / before: {worst_min:.2f}x (minima), {worst_med:.2f}x (medians)", ""]
    (Path(RESULTS) / "ops_fold_before_after.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ----------------------------------------------------------------------------------------------------
# Push / pull crossover on one device: the data behind the CUDA kernel's auto rule (push for every row: on an
# H200 push won at every share, 2026-11-28, csrc/cuda/project_cuda.cu) and, on the CPU, a check of auto's
# choice between the two ends.  The sweep runs up to every entity active, where push's steps equal pull's.  KGREASON_BENCH_DEVICE=cuda (the default when a GPU is present;
# without one the test skips unless KGREASON_BENCH_DEVICE=cpu).  Writes
# benchmarks/results/ops_push_pull_crossover_<device type>.md.

def _without_plugin_flags(args: list[str]) -> list[str]:
    """The command line without ``-p NAME`` / ``-pNAME`` (this run's plugin switches, not the benchmark's)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-p":
            skip = True
        elif not a.startswith("-p"):
            out.append(a)
    return out


CROSS_FRACTIONS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.5, 1.0)
CROSS_B = 64


def _crossover_batch(case: Case, b: int, active: int, gen: torch.Generator) -> torch.Tensor:
    """(b, N) rows of `active` distinct entities chosen uniformly, values uniform in (0, 1]."""
    x = torch.zeros(b, case.n)
    for k in range(b):
        x[k, torch.randperm(case.n, generator=gen)[:active]] = torch.rand(active, generator=gen).clamp_min(1e-3)
    return x


def _ms_per_call(fn, device: torch.device, min_seconds: float = 0.3) -> float:
    """Median ms per call of fn over repeated runs (CUDA: event-timed batches of calls after a warm-up)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        runs, reps = [], 1
        while True:
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            ms = start.elapsed_time(end)
            if ms * 1e-3 >= min_seconds / 5 or reps >= 4096:
                break
            reps *= 2
        runs.append(ms / reps)
        for _ in range(4):
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            runs.append(start.elapsed_time(end) / reps)
        return float(np.median(runs))
    runs, t_end = [], time.perf_counter() + min_seconds
    while len(runs) < 5 or (time.perf_counter() < t_end and len(runs) < 101):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return float(np.median(runs)) * 1e3


@pytest.mark.benchmark
def test_push_pull_crossover(cases):
    name = os.environ.get("KGREASON_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
    if not name:
        pytest.skip("no GPU: KGREASON_BENCH_DEVICE=cpu runs the sweep on the CPU")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("KGREASON_BENCH_DEVICE=cuda but torch sees no GPU")
    if not (ops.has_kernel("project", device) and ops.has_kernel("project_strategy", device)):
        pytest.skip(f"no compiled project kernel for {device}")
    case = cases[0]
    P = ops.prepare_matrices(case.M).to(device)
    crow = case.M.crow_indices().long()
    row_len = (crow[1:] - crow[:-1]).double()
    n, nnz = case.n, int(case.nnz)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for frac in CROSS_FRACTIONS:
        active = max(1, round(frac * n))
        x_cpu = _crossover_batch(case, CROSS_B, active, gen)
        work = float(((x_cpu > 0).double() * row_len).sum(1).mean()) + active  # push steps per row
        x = x_cpu.to(device)
        outs, ms = {}, {}
        for strategy in ("push", "pull", "auto"):
            fn = lambda s=strategy: ops.project(x, P, strategy=s, backend="cpp", validate=False)  # noqa: E731
            outs[strategy] = fn()
            ms[strategy] = _ms_per_call(fn, device)
        assert torch.equal(outs["push"], outs["pull"]) and torch.equal(outs["auto"], outs["pull"]), \
            f"strategies disagree at {frac:.4%} active"
        codes = ops.project_strategies(x, P).cpu()
        picked = ", ".join(f"{k} {int((codes == c).sum())}" for c, k in ((1, "push"), (3, "sweep"), (2, "pull"))
                           if int((codes == c).sum()))
        assert all(np.isfinite(v) and v > 0 for v in ms.values()), ms
        rows.append(dict(frac=frac, active=active, work=work, picked=picked, **ms))
    # the crossover: between the last fraction where push is faster and the next one, interpolated in
    # log(work) on log(pull / push), which is roughly linear there
    implied, cross_at = None, None
    for lo, hi in zip(rows, rows[1:]):
        if lo["push"] < lo["pull"] and hi["push"] >= hi["pull"]:
            r_lo, r_hi = np.log(lo["pull"] / lo["push"]), np.log(hi["pull"] / hi["push"])
            w = np.exp(np.log(lo["work"]) + (np.log(hi["work"]) - np.log(lo["work"])) * r_lo / (r_lo - r_hi))
            implied, cross_at = (n + nnz) / w, float(w)
    load = os.getloadavg()
    dev_desc = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        os.environ.get("KGREASON_BENCH_MACHINE") or machine_description())
    lines = [f"# Push / pull crossover of `ops.project` on {device.type}",
             "",
             "Command: `" + (f"KGREASON_BENCH_DEVICE={name} " if os.environ.get("KGREASON_BENCH_DEVICE") else "")
             + " ".join(["python -m pytest"] + _without_plugin_flags(sys.argv[1:])) + "`  ",
             f"Device: {dev_desc}" + (f", torch {torch.__version__}" if device.type == "cuda" else "") + "  ",
             f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average (1/5/15 min): "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}  ",
             f"Data: {_INFO.get('data', '?')}; B = {CROSS_B} rows, each with the given share of entities active "
             "(uniform), values uniform in (0, 1]",
             "",
             "`push steps / row` is a row's push work, active entities + the entries of their rows of M (mean "
             "over the batch); a pull costs N + nnz steps per row.  The three "
             "strategies returned the same Y bit for bit at every share.",
             "",
             "| active share | active / row | push steps / row | push ms | pull ms | auto ms | auto picked "
             "(rows) | pull / push |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['frac']:.2%} | {r['active']} | {r['work']:.0f} | {r['push']:.3f} | {r['pull']:.3f} | "
                     f"{r['auto']:.3f} | {r['picked']} | {r['pull'] / r['push']:.2f} |")
    lines.append("")
    if implied is None:
        lines.append("No crossover inside the sweep (one strategy was faster at every share).")
    else:
        lines.append(f"Pull starts to win at ~{cross_at:.0f} push steps per row: push costs as much as a pull of "
                     f"N + nnz = {n + nnz} steps when (N + nnz) / (active + entries) = **{implied:.1f}**"
                     + ("; the CUDA kernel's auto pushes every row (csrc/cuda/project_cuda.cu), so a crossover "
                        "here says that rule is wrong for this GPU." if device.type == "cuda" else "."))
    lines.append("")
    (Path(RESULTS) / f"ops_push_pull_crossover_{device.type}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
