"""Multi-relation projection: one ``ops.project(X, M, rel)`` call vs a per-relation loop of ``ops.project``, in one run.

Run (one pytest-benchmark run saving its numbers, then the report writing
benchmarks/results/ops_project_multi.md)::

    python -m pytest benchmarks/test_ops_project_multi.py -q
    python -m benchmarks.report ops_project_multi

``KGREASON_BENCH_THREADS=n`` sets torch's thread count (the saved name and the
table get a ``_<n>thread`` suffix: ``python -m benchmarks.report ops_project_multi_<n>thread``).  Data: the FB15k-237 artifact's stacked matrices when
``$KGREASON_FB15K237_ARTIFACT`` (or ``artifacts/FB15k-237``) holds one, else a
generated graph of FB15k-237's size (14,505 entities, 474 relations = 237 and
their inverses, ~310k edges, relation sizes and entity degrees power-law).

Batches (relations drawn like a query sampler draws them: a random edge
(h, r, t) gives anchor h and relation r, so relations appear in proportion to
their size):

- ``onehot`` B = 1,024: one-hot anchors, each with its own relation (a 1p batch);
- ``dense``  B = 256: uniform dense rows (a later hop), each with its own relation;

each plain and negated (``negate=True``, QTO's negated projection).  Methods, both on the
compiled CPU kernels, values only, ``validate=False``:

- ``multi``: one ``ops.project(X, stack, rel)`` call over the prepared stack;
- ``loop``: what the executor did before: sort the rows by relation, one
  ``ops.project`` call (``negate=`` as the case) per distinct relation on its
  contiguous slice (relations prepared once, outside the timing), scatter back.

Both must return the same Y (checked before timing).  The table reports
``loop / multi`` (> 1: the new op is faster).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

import ops
from conftest import measurements_for
from kgreason.constants import QTO_NEG_SCALE
from ops import SWEEP

N_SYNTH, R_SYNTH, EDGES_SYNTH = 14_505, 474, 310_000
CASES = [("onehot", 1024, False), ("dense", 256, False), ("onehot", 1024, True), ("dense", 256, True)]
METHODS = ("multi", "loop")
THREADS = int(os.environ.get("KGREASON_BENCH_THREADS", "0"))
if THREADS > 0:
    torch.set_num_threads(THREADS)
REPORT_TABLE = "ops_project_multi"


def synthetic_stack(n: int = N_SYNTH, r: int = R_SYNTH, edges: int = EDGES_SYNTH, seed: int = 0):
    """A scipy (R*N, N) CSR: relation sizes ~ rank^-1, entity degrees ~ rank^-0.8, values in (0, 1]."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    rw = 1.0 / np.arange(1, r + 1)
    rel = rng.choice(r, size=edges, p=rw / rw.sum())
    ew = 1.0 / np.arange(1, n + 1) ** 0.8
    ew /= ew.sum()
    perm = rng.permutation(n)
    h = perm[rng.choice(n, size=edges, p=ew)]
    t = perm[rng.choice(n, size=edges, p=ew)]
    keys = np.unique((rel.astype(np.int64) * n + h) * n + t)
    rows, cols = keys // n, keys % n
    vals = (rng.random(len(keys)) * 0.999 + 0.001).astype(np.float32)
    m = sp.csr_matrix((vals, (rows, cols)), shape=(r * n, n))
    m.sort_indices()
    m.indptr = m.indptr.astype(np.int64)
    m.indices = m.indices.astype(np.int32)
    return m


class Data:
    def __init__(self, matrices, name: str):
        self.name = name
        self.stack = ops.prepare_matrices(matrices)
        self.n, self.r = self.stack.n, self.stack.num_relations
        self.prepared = [self.stack.relation(k) for k in range(self.r)]  # the loop's per-relation matrices
        crow = self.stack.crow.numpy()
        self.edge_rows = np.repeat(np.arange(self.r * self.n), np.diff(crow))  # stack row (r*N + h) of every edge


@pytest.fixture(scope="module")
def data(fb15k237_artifact):
    info = measurements_for(REPORT_TABLE).info
    measurements_for(REPORT_TABLE).name = REPORT_TABLE if THREADS <= 0 else f"{REPORT_TABLE}_{THREADS}thread"
    info["cases"] = [list(c) for c in CASES]
    if fb15k237_artifact is not None:
        a = fb15k237_artifact
        info["data"] = (f"FB15k-237 artifact: N = {a.num_entities}, R = {a.num_relations}, "
                        f"{a.matrices.nnz} entries")
        return Data(a.matrices, "FB15k-237")
    m = synthetic_stack()
    info["data"] = (f"generated graph of FB15k-237's size (no artifact found): N = {N_SYNTH}, R = {R_SYNTH}, "
                    f"{m.nnz} edges; relation sizes ~ rank^-1, degrees ~ rank^-0.8")
    return Data(m, "synthetic")


def make_batch(d: Data, b: int, kind: str, seed: int = 0):
    """(X, rel): anchors and relations from random edges (relations weighted by their size)."""
    rng = np.random.default_rng(seed)
    rows = d.edge_rows[rng.integers(0, len(d.edge_rows), size=b)]
    rel = torch.from_numpy(rows // d.n)
    if kind == "onehot":
        x = torch.zeros(b, d.n)
        x[torch.arange(b), torch.from_numpy(rows % d.n)] = 1.0
    else:
        x = torch.rand(b, d.n, generator=torch.Generator().manual_seed(seed))
    return x, rel


def loop_project(d: Data, x: torch.Tensor, rel: torch.Tensor, negated: bool) -> torch.Tensor:
    """The executor's former path: group rows by relation, one ops call per relation, scatter back."""
    order = torch.argsort(rel, stable=True)
    uniq, counts = torch.unique_consecutive(rel[order], return_counts=True)
    xs = x.index_select(0, order)
    y = torch.empty_like(x)
    lo = 0
    for r, c in zip(uniq.tolist(), counts.tolist()):
        m = d.prepared[r]
        if negated:
            out = ops.project(xs[lo:lo + c], m, negate=True, neg_scale=QTO_NEG_SCALE, backend="cpp", validate=False)
        else:
            out = ops.project(xs[lo:lo + c], m, backend="cpp", validate=False)
        y.index_copy_(0, order[lo:lo + c], out)
        lo += c
    return y


def _method(d: Data, name: str, negated: bool):
    if name == "multi":
        return lambda x, rel: ops.project(x, d.stack, rel, negate=negated, backend="cpp", validate=False)
    return lambda x, rel: loop_project(d, x, rel, negated)


@pytest.mark.benchmark
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind,b,negated", CASES, ids=[f"{k}-{b}-{'neg' if g else 'plain'}" for k, b, g in CASES])
def test_project_multi(benchmark, data, kind, b, negated, method, measurements):
    row = f"{kind}|{b}|{'neg' if negated else 'plain'}"
    if not ops.has_kernel("project", "cpu"):
        for column in (method,) + (("distinct", "push", "sweep", "pull", "zeros_ms") if method == "multi" else ()):
            measurements.not_applicable(row, column, "no compiled project kernel")
        pytest.skip("compiled extension (project) not available")
    x, rel = make_batch(data, b, kind)
    fn = _method(data, method, negated)
    if method == "multi":  # both methods compute the same Y (exact float32 products and maxima)
        assert torch.equal(fn(x, rel), loop_project(data, x, rel, negated)), "ops.project differs from the loop"
    t0 = time.perf_counter()
    fn(x, rel)
    once = time.perf_counter() - t0
    rounds = int(max(3, min(20, 2.0 / max(once, 1e-6))))
    benchmark.extra_info.update(kind=kind, B=b, negated=negated, distinct_relations=int(rel.unique().numel()))
    benchmark.pedantic(fn, args=(x, rel), rounds=rounds, iterations=1, warmup_rounds=1)
    measurements.put(row, method, benchmark.stats.stats.median)
    if method == "multi":  # the rows' plans, and the floor of a fresh output, in the same run
        codes = ops.project_strategies(x, data.stack, rel)
        for column, code in (("push", ops.STRATEGIES["push"]), ("sweep", SWEEP), ("pull", ops.STRATEGIES["pull"])):
            measurements.put(row, column, int(codes.eq(code).sum()))
        measurements.put(row, "distinct", int(rel.unique().numel()))
        measurements.put(row, "zeros_ms", zeros_ms(b, data.n))


def zeros_ms(b: int, n: int, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        torch.zeros(b, n)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3
