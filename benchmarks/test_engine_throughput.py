"""Query throughput of the batched executor, per BetaE structure, against a batch-1 operator loop.

Run (measure, then write the table)::

    python -m pytest benchmarks/test_engine_throughput.py
    python -m benchmarks.report engine_throughput

For each of the 14 structures, on the FB15k-237 artifact (or a synthetic one
of the same size when it is absent), three measurements in the same run:

* ``loop``   the baseline: one query at a time, a recursive evaluator calling
             the same ``ops`` operators on a (1, N) vector, the way the
             reference QTO implementation runs queries (no batching);
* ``b1``     ``Executor.iter_scores`` with ``batch_size=1`` (the engine's overhead);
* ``b1024``  ``Executor.iter_scores`` with ``batch_size=1024`` (shape batching, one
             ``ops.project`` call per projection node, passes of ``Executor.pass_rows`` rows);
* ``sparse`` the same with sparse intermediate sets where they are small (``Executor(sparse=True)``);
* ``qto``    the QTO reference algorithm on a subsample (``ENGINE_BENCH_QTO_QUERIES``, default 4
             per structure): one query at a time, every projection a dense max-product
             ``max_i x_i * M_r[i, :]`` over the relation's dense (N, N) matrix, as QTO's research
             code computes it.  QTO holds every dense matrix (and its negated form) in memory
             before the first query; 474 dense FB15k-237 matrices would take 400 GB here, so each
             is densified from the artifact's CSR when used, *outside* the timer: ``qto`` counts
             only the max-products and the t-norm/t-conorm/complement steps (QTO's best case);
             ``qto+densify`` (reported beside it) also counts the densification.

Like the loop, the engine modes compute every query's (N,) scores and drop them
(``iter_scores``); ``Executor.scores`` additionally fills a (Q, N) result.

Queries are grounded in the observed graph (random answer, walking observed
edges backwards), as in ``engine.exec.examples``.  The run saves its numbers
(``artifacts/bench/engine_throughput.json``, or ``--bench-out DIR``); then
``python -m benchmarks.report engine_throughput`` writes the ratios to
``benchmarks/results/engine_throughput.md`` with the command and machine
(``engine_throughput_synthetic`` on the synthetic artifact, whose sets are
sparse: run with ``KGREASON_FB15K237_ARTIFACT=none`` to get it;
``engine_throughput_threads<n>`` with ``ENGINE_BENCH_THREADS=n``).
"""
from __future__ import annotations

import copy
import os
import random
import resource
import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import ops
from engine.exec.examples import _ground, _observed_index
from engine.exec.executor import Executor
from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union
from engine.lang.structures import STRUCTURES
from kge import Artifact
from kgreason.constants import INVERSE_SUFFIX, QTO_NEG_SCALE

from conftest import measurements_for  # benchmarks/conftest.py (rootdir-relative import)
from report import Measurements  # benchmarks/report.py

REPORT_TABLE = "engine_throughput"

B_LARGE = 1024
N_SMALL = B_LARGE  # queries timed one by one (loop and b1): the same queries as the batched mode
TNORM = "product"
#: Timed rounds per mode (the best counts): the machine is shared, and with 3 rounds of ~50 ms a single
#: disturbed round set whole rows of the table (2u measured 19k q/s in one run, 32-40k in the next).
ROUNDS = int(os.environ.get("ENGINE_BENCH_ROUNDS", "7"))
NEG_SCALE = QTO_NEG_SCALE

#: The report's columns (Measurements cells: row = structure), in the order the timed tests fill them.
COLUMNS = ("loop", "b1", "sparse", "b1024", "faults", "faults_1pass", "b1024_1pass", "qto", "qto_densify")


def synthetic_artifact(seed: int = 0, n: int = 14_505, base_relations: int = 237, edges: int = 272_115) -> Artifact:
    """FB15k-237-sized KG: observed edges (value 1) in both directions plus as many calibrated extra entries."""
    rng = np.random.default_rng(seed)
    # Power-law relation and entity frequencies, roughly as skewed as FB15k-237's.
    rel_p = 1.0 / np.arange(1, base_relations + 1) ** 0.7
    rel_p /= rel_p.sum()
    ent_p = rng.permutation(1.0 / np.arange(1, n + 1) ** 0.8)
    ent_p /= ent_p.sum()
    r = rng.choice(base_relations, size=edges, p=rel_p)
    h = rng.choice(n, size=edges, p=ent_p)
    t = rng.choice(n, size=edges, p=ent_p)
    obs = np.concatenate([np.stack([h, 2 * r, t], 1), np.stack([t, 2 * r + 1, h], 1)])
    extra = obs.copy()
    extra[:, 2] = rng.integers(0, n, size=len(extra))
    vals = np.concatenate([np.ones(len(obs)), rng.uniform(0.01, 0.9, len(extra))]).astype(np.float32)
    allt = np.concatenate([obs, extra])
    m = sp.csr_matrix((vals, (allt[:, 1] * n + allt[:, 0], allt[:, 2])), shape=(2 * base_relations * n, n))
    m.sum_duplicates()
    m.data = np.minimum(m.data, 1.0)
    rels = []
    for k in range(base_relations):
        rels += [f"r{k}", f"r{k}{INVERSE_SUFFIX}"]
    return Artifact(entities=[f"e{i}" for i in range(n)], relations=rels, matrices=m, observed=np.unique(obs, axis=0),
                    missing=np.zeros((0, 3), dtype=np.int64), meta={"source": "synthetic (FB15k-237 sized)"})


@pytest.fixture(scope="module")
def artifact(fb15k237_artifact):
    m = measurements_for(REPORT_TABLE)
    m.info.update(structures=list(STRUCTURES), columns=list(COLUMNS), tnorm=TNORM, neg_scale=NEG_SCALE,
                  n_small=N_SMALL, b_large=B_LARGE, rounds=ROUNDS, qto_queries=QTO_QUERIES)
    m.name = REPORT_TABLE + _threads_suffix()
    if fb15k237_artifact is not None:
        m.info["data"] = f"FB15k-237 artifact ({fb15k237_artifact.path})"
        return fb15k237_artifact
    m.info["data"] = "synthetic FB15k-237-sized artifact (artifacts/FB15k-237 absent)"
    m.name += "_synthetic"  # another KG: never the FB15k-237 table
    return synthetic_artifact()


def _threads_suffix() -> str:
    threads = os.environ.get("ENGINE_BENCH_THREADS")
    return f"_threads{int(threads)}" if threads else ""


#: M_r of every relation of the benchmark artifact, prepared by the ``executor`` fixture for the loop baseline.
_MATRICES: dict[int, "ops.StackedMatrices"] = {}


@pytest.fixture(scope="module")
def executor(artifact):
    threads = os.environ.get("ENGINE_BENCH_THREADS")
    if threads:  # e.g. ENGINE_BENCH_THREADS=1 to take thread scheduling out of the measurement
        torch.set_num_threads(int(threads))
    ex = Executor(artifact, tnorm=TNORM, neg_scale=NEG_SCALE)
    for r in range(artifact.num_relations):  # prepare every matrix up front: not part of any timing
        _MATRICES[r] = ex.rows.relation(r)
    info = measurements_for(REPORT_TABLE).info
    info["backend"] = "cpp" if ops.has_kernel("project", "cpu") else "reference"
    info["pass_rows"] = ex.pass_rows
    return ex


@pytest.fixture(scope="module")
def queries(artifact):
    g = _observed_index(artifact)
    targets = np.unique(artifact.observed[:, 2])
    out: dict[str, list[Node]] = {}
    for name, s in STRUCTURES.items():
        template = s.build(list(range(s.num_anchors)), list(range(s.num_relations)), negation="qto")
        rng = random.Random(name)
        qs: list[Node] = []
        while len(qs) < B_LARGE:
            q = _ground(template, int(targets[rng.randrange(len(targets))]), g, rng)
            if q is not None:
                qs.append(q)
        out[name] = qs
    return out


def eval_tree(node: Node, n: int, project) -> torch.Tensor:
    """One query on a (1, N) vector, node by node; ``project(x, node)`` computes (negated) projections."""
    if isinstance(node, Anchor):
        x = torch.zeros(1, n)
        x[0, node.entity] = 1.0
        return x
    if isinstance(node, (Projection, NegatedProjection)):
        return project(eval_tree(node.arg, n, project), node)
    if isinstance(node, Intersection):
        return ops.intersect(*[eval_tree(a, n, project) for a in node.args], tnorm=TNORM, validate=False)
    if isinstance(node, Union):
        return ops.union(*[eval_tree(a, n, project) for a in node.args], tnorm=TNORM, validate=False)
    if isinstance(node, Complement):
        return ops.negate(eval_tree(node.arg, n, project), validate=False)
    raise TypeError(node)


def loop_eval(ex: Executor, node: Node) -> torch.Tensor:
    """The baseline: evaluate one query on a (1, N) vector with the ops operators, node by node."""
    def project(x: torch.Tensor, p: Node) -> torch.Tensor:
        if isinstance(p, NegatedProjection):
            return ops.project(x, _MATRICES[p.relation], negate=True, neg_scale=NEG_SCALE, validate=False)
        return ops.project(x, _MATRICES[p.relation], validate=False)

    return eval_tree(node, ex.num_entities, project)


QTO_QUERIES = int(os.environ.get("ENGINE_BENCH_QTO_QUERIES", "4"))


class DenseQTO:
    """QTO's forward computation: one query, dense (N, N) relation matrices, (1, N) fuzzy vectors.

    ``densify_s`` accumulates the time spent densifying matrices (and forming negated ones), which
    QTO does once for all relations before answering: the ``qto`` column subtracts it.
    """

    def __init__(self, artifact: Artifact) -> None:
        m = artifact.matrices.tocsr()
        self.n = artifact.num_entities
        self.crow = torch.from_numpy(m.indptr.astype(np.int64))
        self.col = torch.from_numpy(m.indices.astype(np.int64))
        self.val = torch.from_numpy(m.data.astype(np.float32))
        self.densify_s = 0.0

    def dense(self, r: int) -> torch.Tensor:
        """M_r as a dense (N, N) tensor (torch's CSR -> dense scatter: the cheapest way to get one)."""
        lo, hi = int(self.crow[r * self.n]), int(self.crow[(r + 1) * self.n])
        crow = self.crow[r * self.n:(r + 1) * self.n + 1] - lo
        return torch.sparse_csr_tensor(crow, self.col[lo:hi], self.val[lo:hi], (self.n, self.n)).to_dense()

    def project(self, x: torch.Tensor, node: Node) -> torch.Tensor:
        t = time.perf_counter()
        m = self.dense(node.relation)
        if isinstance(node, NegatedProjection):  # 1 - min(1, s * M), 1 where M has no entry
            m.mul_(NEG_SCALE).clamp_(max=1.0).neg_().add_(1.0)
        self.densify_s += time.perf_counter() - t
        return (m * x.reshape(-1, 1)).amax(dim=0).reshape(1, -1)  # QTO's broadcast product, then the max

    def eval(self, node: Node) -> torch.Tensor:
        return eval_tree(node, self.n, self.project)


def _record(m: Measurements, structure: str, mode: str, benchmark, nq: int) -> None:
    # Best round: the machine is shared, and the minimum is the least disturbed measurement.
    m.put(structure, mode, nq / benchmark.stats.stats.min)


@pytest.mark.benchmark(group="engine-throughput")
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_loop_batch1_baseline(benchmark, executor, queries, structure, measurements):
    qs = queries[structure][:N_SMALL]
    ref = executor.scores(qs)
    with torch.inference_mode():
        got = torch.cat([loop_eval(executor, q) for q in qs])
    torch.testing.assert_close(got, ref)  # the baseline computes the same thing

    def run():
        with torch.inference_mode():
            for q in qs:
                loop_eval(executor, q)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _record(measurements, structure, "loop", benchmark, len(qs))


@pytest.mark.benchmark(group="engine-throughput")
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_engine_batch1(benchmark, executor, queries, structure, measurements):
    qs = queries[structure][:N_SMALL]

    def run():
        for q in qs:
            for _ in executor.iter_scores([q], batch_size=1):
                pass

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _record(measurements, structure, "b1", benchmark, len(qs))


@pytest.mark.benchmark(group="engine-throughput")
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_engine_batch1024_sparse_sets(benchmark, executor, queries, structure, measurements):
    qs = queries[structure]
    sparse = copy.copy(executor)  # shares the prepared matrices
    sparse.sparse = True

    def run():
        for _ in sparse.iter_scores(qs, batch_size=B_LARGE):
            pass

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _record(measurements, structure, "sparse", benchmark, len(qs))


@pytest.mark.benchmark(group="engine-throughput")
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_engine_batch1024(benchmark, executor, queries, structure, measurements):
    qs = queries[structure]
    def run():
        for _ in executor.iter_scores(qs, batch_size=B_LARGE):
            pass

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _record(measurements, structure, "b1024", benchmark, len(qs))
    # The allocation tax: minor page faults per query with the executor's passes of pass_rows rows
    # (outputs small enough for glibc to recycle from its heap) and with the whole batch in one pass
    # ((1024, N) outputs above the mmap threshold: fresh zeroed pages every call).
    measurements.put(structure, "faults", _minor_faults(run) / len(qs))
    saved, executor.pass_rows = executor.pass_rows, B_LARGE
    try:
        run()  # warm-up at the new size
        t = time.perf_counter()
        measurements.put(structure, "faults_1pass", _minor_faults(run) / len(qs))
        measurements.put(structure, "b1024_1pass", len(qs) / (time.perf_counter() - t))
    finally:
        executor.pass_rows = saved


def _minor_faults(fn) -> float:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.benchmark(group="engine-throughput")
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_qto_dense_reference(artifact, executor, queries, structure, measurements):
    qs = queries[structure][:QTO_QUERIES]
    qto = DenseQTO(artifact)
    with torch.inference_mode():
        got = torch.cat([qto.eval(q) for q in qs])
    torch.testing.assert_close(got, executor.scores(qs))  # the same answers as the engine

    # Timed by hand, one round: ``qto`` without the densification QTO does
    # up front (qto.densify_s), ``qto_densify`` with it.
    qto.densify_s = 0.0
    t = time.perf_counter()
    with torch.inference_mode():
        for q in qs:
            qto.eval(q)
    total = time.perf_counter() - t
    measurements.put(structure, "qto", len(qs) / (total - qto.densify_s))
    measurements.put(structure, "qto_densify", len(qs) / total)
