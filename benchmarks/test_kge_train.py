"""KGE training throughput: the 1-N ComplEx-N3 loop (kge.complex_n3) vs pykeen's LCWA loop, same model and batch.

Run: ``python -m pytest benchmarks/test_kge_train.py -q`` (from the repo root; ~5 minutes on 2 cores), then
``python -m benchmarks.report kge_train``.

Both loops train ComplEx with N3 and a softmax cross-entropy over all N tails
on FB15k-237's training edges (``../shared/data/betae/FB15k-237-betae``; a
random graph of the same size when absent), one score row per batch row, so a
row costs the same GEMM FLOPs in both: ``3 * 2 * 2d * N`` (scores, gradient
w.r.t. the query, gradient w.r.t. the entity table).  Each loop runs
``STEPS`` optimizer steps of ``BATCH`` rows; we report seconds per step, the
useful GEMM FLOP rate, its fraction of the plain float32 matmul rate measured
in the same run (target >= 0.5), and the speed-up over pykeen.  Results go to
``benchmarks/results/kge_train.md``.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from conftest import FB15K237_BETAE, measurements_for  # benchmarks/conftest.py

REPORT_TABLE = "kge_train"

BATCH = 1000
STEPS = int(os.environ.get("KGE_TRAIN_BENCH_STEPS", "12"))
RANKS = (64, 256)
PRECISIONS = ("fp32", "bf16")
#: The report's rows: one per (rank, loop); Measurements columns "step_s" and "gflops".
LOOPS = (("pykeen", "pykeen LCWA (float32)"), ("1n_fp32", "1-N ComplEx-N3, float32"),
         ("1n_bf16", "1-N ComplEx-N3, bf16 GEMMs"))

pytestmark = pytest.mark.benchmark


@pytest.fixture(scope="module")
def kg():
    from kge.graph import KnowledgeGraph, load_kg

    if FB15K237_BETAE.is_dir():
        g = load_kg(str(FB15K237_BETAE))
    else:
        rng = np.random.default_rng(0)
        n, r, e = 14505, 474, 544230
        tr = np.stack([rng.integers(0, n, e), rng.integers(0, r, e), rng.integers(0, n, e)], 1)
        g = KnowledgeGraph(entities=tuple(f"e{i}" for i in range(n)), relations=tuple(f"r{i}" for i in range(r)),
                           train=tr, valid=tr[:0], test=tr[:0], source="random, FB15k-237 size")
    measurements_for(REPORT_TABLE).info.update(
        graph=f"{g.source} (N = {g.num_entities:,}, R = {g.num_relations})", batch=BATCH, steps=STEPS,
        ranks=list(RANKS), precisions=list(PRECISIONS), loops=[list(x) for x in LOOPS])
    return g


def _flops(steps: int, n: int, rank: int) -> float:
    from kge.complex_n3 import flops_per_epoch

    return flops_per_epoch(BATCH * steps, n, rank)  # the GEMM FLOPs of BATCH * steps score rows


def _has_bf16() -> bool:
    from kge.complex_n3 import resolve_precision

    return resolve_precision("auto", "cpu") == "bf16"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_plain_matmul_rate(benchmark, kg, precision, measurements):
    from kge.complex_n3 import matmul_rate

    rate = benchmark.pedantic(lambda: matmul_rate(BATCH, 2 * RANKS[-1], kg.num_entities, precision=precision,
                                                  device="cpu", seconds=1.0), rounds=1, iterations=1)
    measurements.put("matmul", precision, rate / 1e9)
    measurements.info["mm_shape"] = f"({BATCH}, {2 * RANKS[-1]}) @ ({2 * RANKS[-1]}, {kg.num_entities})"


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_1n_loop(benchmark, kg, rank, precision, measurements):
    from kge.complex_n3 import _make_optimizer, batch_loss

    if precision == "bf16" and not _has_bf16():
        for column in ("step_s", "gflops"):
            measurements.not_applicable(f"{rank}/1n_bf16", column, "no bf16 GEMM on this CPU")
        pytest.skip("no bf16 GEMM on this CPU")
    g = torch.Generator().manual_seed(0)
    ent = (torch.randn(kg.num_entities, 2 * rank, generator=g) * 1e-3).requires_grad_()
    rel = (torch.randn(kg.num_relations, 2 * rank, generator=g) * 1e-3).requires_grad_()
    opt = _make_optimizer("adagrad", [ent, rel], 0.1)
    train = torch.as_tensor(np.array(kg.train[: BATCH * STEPS], dtype=np.int64))

    def run():
        for s in range(0, len(train), BATCH):
            idx = train[s:s + BATCH]
            loss = batch_loss(ent, rel, idx[:, 0], idx[:, 1], idx[:, 2], weight=5e-2, precision=precision)[0]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    benchmark.pedantic(run, rounds=2, iterations=1, warmup_rounds=1)
    sec = benchmark.stats.stats.min
    measurements.put(f"{rank}/1n_{precision}", "step_s", sec / STEPS)
    measurements.put(f"{rank}/1n_{precision}", "gflops", _flops(STEPS, kg.num_entities, rank) / sec / 1e9)


@pytest.mark.parametrize("rank", RANKS)
def test_pykeen_lcwa_loop(benchmark, kg, rank, measurements):
    """pykeen's own LCWA training loop: ComplEx, N3 (LpRegularizer p=3), cross-entropy, Adagrad, BATCH rows."""
    import functools

    from pykeen.losses import CrossEntropyLoss
    from pykeen.models import ComplEx
    from pykeen.regularizers import LpRegularizer
    from pykeen.training import LCWATrainingLoop
    from pykeen.triples import CoreTriplesFactory

    from kge.train import _known_pykeen_noise

    # BATCH * STEPS training edges with distinct (h, r) pairs, so LCWA's batches hold BATCH score rows each
    tr = np.array(kg.train, dtype=np.int64)
    _, first = np.unique(tr[:, 0] * kg.num_relations + tr[:, 1], return_index=True)
    sub = tr[np.sort(first)[: BATCH * STEPS]]
    factory = CoreTriplesFactory.create(torch.as_tensor(sub), num_entities=kg.num_entities,
                                        num_relations=kg.num_relations)
    model = ComplEx(triples_factory=factory, embedding_dim=rank, loss=CrossEntropyLoss(), random_seed=0,
                    entity_initializer=functools.partial(torch.nn.init.normal_, std=1e-3),
                    relation_initializer=functools.partial(torch.nn.init.normal_, std=1e-3),
                    regularizer=LpRegularizer, regularizer_kwargs=dict(p=3.0, weight=5e-2, normalize=False))
    loop = LCWATrainingLoop(model=model, triples_factory=factory, optimizer="adagrad", optimizer_kwargs=dict(lr=0.1))

    def run():
        with _known_pykeen_noise():
            loop.train(triples_factory=factory, num_epochs=1, batch_size=BATCH, use_tqdm=False, use_tqdm_batch=False,
                       sub_batch_size=BATCH)

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    sec = benchmark.stats.stats.min
    steps = int(np.ceil(len(sub) / BATCH))
    measurements.put(f"{rank}/pykeen", "step_s", sec / steps)
    measurements.put(f"{rank}/pykeen", "gflops", _flops(steps, kg.num_entities, rank) / sec / 1e9)
