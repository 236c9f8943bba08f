"""ComplEx training through pykeen's pipeline, exported as complex64 embeddings.

The model is pykeen's own ``ComplEx`` trained with pykeen's LCWA loop (1-N
scoring, the default: measured cheaper per epoch than sLCWA negative sampling
with pykeen on 2 CPU cores) or its sLCWA loop, and an N3
regulariser (pykeen's ``LpRegularizer`` with ``p=3``).  Link prediction is
evaluated with pykeen's filtered rank-based evaluator on held-out edges.

pykeen's ComplEx stores complex ``cfloat`` embeddings and scores
``Re(<e_h, w_r, conj(e_t)>)``; :func:`train_complex` exports exactly those
tensors, so ``score(h, r, t) = Re(sum(e_h * w_r * conj(e_t)))`` reproduces
``model.score_hrt`` (tested in ``tests/test_kge_train.py``).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator

import numpy as np

from kgreason.cli import check_device, check_seed
from kgreason.errors import UserError, unknown_name
from .graph import KnowledgeGraph

__all__ = ["TrainConfig", "TrainResult", "train_complex", "default_train_config", "complex_scores", "check_loss",
           "check_trainable"]


def _n3_class():
    """pykeen regulariser class for N3 (Lacroix et al. 2018), built lazily to keep pykeen imports out of module load."""
    global _N3
    if _N3 is not None:
        return _N3
    from pykeen.regularizers import Regularizer

    class N3Regularizer(Regularizer):
        """N3: mean over the batch's vectors of ``sum_i |x_i|^3`` (complex modulus).

        pykeen's ``LpRegularizer(p=3)`` computes the same cubes through
        ``linalg.vector_norm`` on complex tensors, whose backward is ~50x
        slower on CPU than these real-valued ops (measured: 3.9 s vs 0.08 s per
        UMLS epoch).
        """

        def forward(self, x):  # noqa: D102
            if x.is_complex():
                sq = x.real.square() + x.imag.square()
            else:
                sq = x.square()
            return sq.pow(1.5).sum(dim=-1).mean()

    _N3 = N3Regularizer
    return _N3


_N3 = None


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyper-parameters of one ComplEx training run (defaults: see :func:`default_train_config`).

    ``rank`` is the complex dimension (``2*rank`` real numbers per vector).
    ``regularizer_weight`` weighs the N3 term (mean over the batch's vectors of ``sum |x_i|^3``).
    ``eval_max_triples`` subsamples held-out edges for the MRR (0 = skip the
    evaluation, None = all of them).
    """

    rank: int = 128
    epochs: int = 100
    lr: float = 0.01
    batch_size: int = 1024
    num_negatives: int = 32
    regularizer_weight: float = 1e-3
    loss: str = "crossentropy"
    training_loop: str = "slcwa"
    optimizer: str = "adam"
    init_std: float = 0.1
    seed: int = 0
    device: str = "auto"
    eval_max_triples: int | None = 5000
    eval_batch_size: int = 256
    num_threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("rank", "epochs", "batch_size", "num_negatives", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.init_std > 0:
            raise UserError(f"init_std must be > 0, got {self.init_std}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"lr must be a finite number > 0, got {self.lr}")
        check_seed(self.seed, "seed")
        if self.training_loop not in ("slcwa", "lcwa"):
            raise UserError(f"training loop must be 'slcwa' or 'lcwa', got {self.training_loop!r}")
        if self.regularizer_weight < 0:
            raise UserError(f"regularizer weight must be >= 0, got {self.regularizer_weight}")


#: Per-size presets (chosen so UMLS builds in well under a minute and FB15k-237
#: trains in ~10 minutes on 2 CPU cores; measurements in benchmarks/results/artifact_builds.md).
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    # N < 2,000 entities (UMLS, Nations, Kinships, Countries)
    # (UMLS: 12 LCWA epochs give filtered MRR 0.803 and a 39 s build at load average 6
    # on 2 cores; 20 epochs give 0.829 but 66 s)
    "small": dict(rank=128, epochs=12, lr=0.01, batch_size=256, training_loop="lcwa", regularizer_weight=1e-3),
    # larger graphs (FB15k-237: 14,505 entities, 544k training edges with inverses).
    # 1-N scoring (LCWA) here: with pykeen on 2 CPU cores one LCWA epoch (147
    # batches of 1024 (h, r) pairs) took ~250 s against ~300 s for one sLCWA epoch
    # (4096 x 16 negatives), and its softmax cross-entropy over all tails is the
    # very softmax the calibration applies.
    "large": dict(rank=64, epochs=2, lr=0.01, batch_size=1024, training_loop="lcwa", regularizer_weight=1e-3),
}


def size_class(num_entities: int) -> str:
    return "small" if num_entities < 2000 else "large"


def default_train_config(kg: KnowledgeGraph, **overrides: Any) -> TrainConfig:
    """The size preset for ``kg`` with ``overrides`` (None values ignored) applied."""
    params = dict(SIZE_PRESETS[size_class(kg.num_entities)])
    params.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**params)


@dataclass
class TrainResult:
    """Trained embeddings (complex64, ``entity`` (N, d), ``relation`` (R, d)) and run statistics."""

    entity: np.ndarray
    relation: np.ndarray
    config: TrainConfig
    losses: list[float]
    metrics: dict[str, Any]
    seconds: float
    device: str
    model: Any = field(default=None, repr=False)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return check_device(device, "--device", allow_auto=True)  # cpu, cuda, cuda:N (usable), else UserError


def complex_scores(entity: np.ndarray, relation: np.ndarray, triples: np.ndarray) -> np.ndarray:
    """``Re(sum(e_h * w_r * conj(e_t)))`` for (E, 3) triples (float64 reference)."""
    e = entity.astype(np.complex128)
    w = relation.astype(np.complex128)
    h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
    return np.real(np.sum(e[h] * w[r] * np.conj(e[t]), axis=1))


def check_loss(name: str) -> str:
    """``name`` if pykeen knows the loss (any spelling pykeen accepts), else a UserError naming the closest ones."""
    from pykeen.losses import loss_resolver

    try:
        loss_resolver.lookup(name)
    except (KeyError, ValueError, TypeError):
        known = sorted(k for k in loss_resolver.options if k.isalnum() and k.islower())
        raise unknown_name("loss", str(name), known, "--loss") from None
    return name


def check_trainable(kg: KnowledgeGraph, *, what: str = "") -> None:
    """Refuse, before pykeen sees it, a graph that leaves nothing to train on (pykeen fails with num_samples=0)."""
    if len(kg.train) == 0:
        dropped = f" after --drop-edges {kg.stats['drop_fraction']:g} held out {len(kg.dropped):,} of them" \
            if kg.stats.get("drop_fraction") else ""
        hint = "; use a smaller --drop-edges" if kg.stats.get("drop_fraction") else ""
        raise UserError(f"{what or kg.source}: no training edges left{dropped}{hint}")


class _DropLogMessages(logging.Filter):
    """Drops log records whose message matches ``pattern`` (one known, harmless third-party warning)."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def _known_pykeen_noise():
    """Silence, around pykeen's pipeline only, two warnings that say nothing actionable on CPU.

    * torch's DataLoader: pykeen asks for ``pin_memory=True``, which is moot without an accelerator;
    * ``torch_max_mem``: its batch-size search is only "considered safe" on CUDA; pykeen uses it on CPU too.

    Matched by message and module, so any other warning still shows.
    """
    drop = _DropLogMessages(r"are considered safe for automatic memory utilization maximization")
    logger = logging.getLogger("torch_max_mem.api")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*'pin_memory' argument is set as true but no accelerator",
                                category=UserWarning, module=r"torch\.utils\.data")
        logger.addFilter(drop)
        try:
            yield
        finally:
            logger.removeFilter(drop)


def _subsample(triples: np.ndarray, k: int | None, seed: int) -> np.ndarray:
    if k is None or len(triples) <= k:
        return triples
    idx = np.random.default_rng(seed).choice(len(triples), size=k, replace=False)
    return triples[np.sort(idx)]


@contextlib.contextmanager
def _diverged_is_user_error(config: TrainConfig) -> Iterator[None]:
    """pykeen's ``NonFiniteLossError`` (the loss became NaN/inf: training diverged) as a one-line UserError."""
    from pykeen.training.training_loop import NonFiniteLossError

    try:
        yield
    except NonFiniteLossError:
        raise UserError(f"training diverged (the loss became NaN or infinite) at --lr {config.lr:g}; "
                        f"try a smaller --lr (e.g. {config.lr / 10:g})") from None


def train_complex(kg: KnowledgeGraph, config: TrainConfig, *, progress: bool = True) -> TrainResult:
    """Train pykeen's ComplEx on ``kg.train`` and evaluate filtered MRR on held-out edges.

    Held-out edges are ``kg.missing`` (dropped + valid + test), subsampled to
    ``config.eval_max_triples`` (recorded in ``metrics``); filtering removes every
    known edge (train, dropped, valid, test).
    """
    import torch
    from pykeen.pipeline import pipeline
    from pykeen.triples import CoreTriplesFactory

    device = resolve_device(config.device)
    check_loss(config.loss)
    check_trainable(kg)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    logging.getLogger("pykeen").setLevel(logging.ERROR)
    n, r = kg.num_entities, kg.num_relations

    def factory(triples: np.ndarray) -> CoreTriplesFactory:
        # A copy: KnowledgeGraph arrays are read-only, and torch warns about (and may write into) those.
        return CoreTriplesFactory.create(torch.from_numpy(np.array(triples, dtype=np.int64)),
                                         num_entities=n, num_relations=r)

    held_out = kg.missing
    do_eval = config.eval_max_triples != 0 and len(held_out) > 0
    eval_triples = _subsample(held_out, config.eval_max_triples, config.seed) if do_eval else kg.train[:1]
    known = np.concatenate([kg.train, held_out])
    loss_kwargs: dict[str, Any] = {}
    if config.training_loop == "slcwa":
        loop_kwargs: dict[str, Any] = dict(training_loop="sLCWA", negative_sampler="basic",
                                           negative_sampler_kwargs=dict(num_negs_per_pos=config.num_negatives))
    else:
        loop_kwargs = dict(training_loop="LCWA")
    t0 = time.perf_counter()
    with _known_pykeen_noise(), _diverged_is_user_error(config):
        result = pipeline(
            training=factory(kg.train),
            testing=factory(eval_triples),
            model="ComplEx",
            model_kwargs=dict(
                embedding_dim=config.rank,
                # pykeen's default N(0, 1) init gives scores of size ~sqrt(rank): the softmax
                # saturates and training crawls (UMLS MRR 0.06 after 20 epochs vs 0.83 with std 0.1).
                entity_initializer=functools.partial(torch.nn.init.normal_, std=config.init_std),
                relation_initializer=functools.partial(torch.nn.init.normal_, std=config.init_std),
                regularizer=_n3_class(),
                regularizer_kwargs=dict(weight=config.regularizer_weight),
            ),
            loss=config.loss,
            loss_kwargs=loss_kwargs,
            optimizer=config.optimizer,
            optimizer_kwargs=dict(lr=config.lr),
            **loop_kwargs,
            training_kwargs=dict(
                num_epochs=config.epochs,
                batch_size=config.batch_size,
                use_tqdm=progress,
                # the per-batch bar moves every few seconds even when one epoch takes minutes
                use_tqdm_batch=progress,
            ),
            evaluator="rankbased",
            evaluator_kwargs=dict(filtered=True),
            evaluation_kwargs=dict(
                batch_size=config.eval_batch_size,
                additional_filter_triples=[torch.as_tensor(known, dtype=torch.long)],
                use_tqdm=progress,
            ) if do_eval else dict(batch_size=config.eval_batch_size, use_tqdm=False),
            random_seed=config.seed,
            device=device,
            use_testing_data=True,
        )
    seconds = time.perf_counter() - t0
    return _export(result, config, eval_triples, held_out, do_eval, seconds, device)


def _export(result, config: TrainConfig, eval_triples: np.ndarray, held_out: np.ndarray, do_eval: bool, seconds: float,
            device: str) -> TrainResult:
    """The trained model's embeddings as complex64 arrays, with the evaluation metrics."""
    import torch

    model = result.model
    ent = model.entity_representations[0](indices=None).detach().to("cpu")
    rel = model.relation_representations[0](indices=None).detach().to("cpu")
    if not torch.is_complex(ent):  # older pykeen: real tensors with a trailing (re, im) axis
        ent, rel = torch.view_as_complex(ent.contiguous()), torch.view_as_complex(rel.contiguous())
    metrics: dict[str, Any] = {"train_seconds_incl_eval": round(seconds, 3)}
    if do_eval:
        mr = result.metric_results
        metrics.update(
            mrr=float(mr.get_metric("both.realistic.inverse_harmonic_mean_rank")),
            hits_at_1=float(mr.get_metric("both.realistic.hits_at_1")),
            hits_at_3=float(mr.get_metric("both.realistic.hits_at_3")),
            hits_at_10=float(mr.get_metric("both.realistic.hits_at_10")),
            eval_triples=int(len(eval_triples)),
            eval_triples_available=int(len(held_out)),
            eval_protocol="pykeen RankBasedEvaluator, filtered (train+held-out), both sides, realistic ranks",
        )
    losses = [float(x) for x in result.losses]
    if losses and not all(math.isfinite(x) for x in losses):
        raise UserError(f"training diverged (loss {losses[-1]}); lower the learning rate (--lr, now {config.lr:g})")
    return TrainResult(
        entity=ent.numpy().astype(np.complex64),
        relation=rel.numpy().astype(np.complex64),
        config=config,
        losses=losses,
        metrics=metrics,
        seconds=seconds,
        device=device,
        model=model,
    )


def config_dict(config: TrainConfig) -> dict[str, Any]:
    return asdict(config)


def with_overrides(config: TrainConfig, **kw: Any) -> TrainConfig:
    return replace(config, **{k: v for k, v in kw.items() if v is not None})
