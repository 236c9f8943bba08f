"""ComplEx training, exported as complex64 embeddings: :func:`train_complex` and its settings.

Which trainer runs is ``TrainConfig.training_loop``:

* ``"1n"`` (every size preset, so every ``python -m kge.build`` unless
  ``--training-loop`` says otherwise): the project's own 1-N ComplEx-N3 loop,
  :func:`kge.complex_n3.train_1n` (real GEMMs, bf16 where the hardware has it,
  Adagrad, early stopping on the validation MRR).  pykeen is not used for
  training there; after it, the held-out link-prediction metrics come from
  pykeen's filtered ``RankBasedEvaluator`` (:func:`pykeen_link_metrics`), or,
  from :data:`HUGE_FROM` entities on, from the GEMM ranker
  :func:`own_link_metrics` (the same tail-side numbers, tested).
* ``"lcwa"`` / ``"slcwa"``: pykeen's ``pipeline`` with pykeen's ``ComplEx``,
  its LCWA (1-N) or sLCWA (negative sampling) loop, an N3 regulariser
  (:func:`_n3_class`) and pykeen's evaluator (both sides).

Both paths score ``Re(<e_h, w_r, conj(e_t)>)`` and export the same complex
tensors, so ``score(h, r, t) = Re(sum(e_h * w_r * conj(e_t)))`` reproduces
pykeen's ``model.score_hrt`` (tested in ``tests/test_kge_train.py`` and
``tests/test_kge_complex_n3.py``).

Settings have one home: :class:`TrainConfig`, whose defaults are the
``small`` size preset; :data:`PRESET_OVERRIDES` states the ``large`` and
``huge`` presets as overrides of it, and :func:`default_train_config` picks
one by the graph's size.  :class:`kge.build.BuildConfig` holds only overrides
of it (``train=``), checked here by :func:`check_train_values`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import numbers
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from kgreason.cli import check_seed
from kgreason.errors import UserError, unknown_name
from kgreason.progress import is_terminal
from .complex_n3 import OPTIMIZERS as ONE_N_OPTIMIZERS, PRECISIONS as ONE_N_PRECISIONS  # numpy-only at import time
from .complex_n3 import TrainResult, resolve_device  # defined below kge.train: the 1-N loop returns one too
from .graph import KnowledgeGraph

__all__ = ["TrainConfig", "TrainResult", "train_complex", "default_train_config", "complex_scores", "check_loss",
           "check_optimizer", "own_link_metrics", "size_class", "LARGE_FROM", "HUGE_FROM",
           "check_trainable", "check_train_values", "PRESET_OVERRIDES", "SIZE_PRESETS", "MAX_LR", "TRAINING_LOOPS"]


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


#: ``1n``: this project's 1-N ComplEx-N3 loop (kge.complex_n3); ``lcwa``/``slcwa``: pykeen's own loops.
TRAINING_LOOPS = ("1n", "lcwa", "slcwa")
#: Largest learning rate accepted: far above any useful rate (the size presets use 0.1); larger values are typos.
MAX_LR = 10.0
#: Fields that must be whole numbers >= 1 when set (None: unset, where the field allows it).
_POSITIVE_INTS = ("rank", "epochs", "batch_size", "num_negatives", "eval_batch_size", "min_epochs", "eval_every",
                  "candidates", "max_rank", "num_threads", "valid_max_triples")


def check_train_values(values: Mapping[str, Any], *, name: Callable[[str], str] = str) -> None:
    """Every check on a training configuration, as one :class:`UserError` line (the first problem found).

    ``values`` maps every :class:`TrainConfig` field to its value.  ``name(field)`` is how a message names
    a field: the field itself from Python (``rank must be >= 1, got 0``), its flag from a command line
    (``kge.build``: ``--rank must be >= 1, got 0``); the check and its wording are the same for both.
    """
    v = values

    def whole(f: str) -> None:
        x = v[f]
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Integral)):
            raise UserError(f"{name(f)} must be a whole number, got {x!r}")

    def number(f: str) -> None:
        x = v[f]
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real)):
            raise UserError(f"{name(f)} must be a number, got {x!r}")

    for f in _POSITIVE_INTS:
        whole(f)
        if v[f] is not None and v[f] < 1:
            raise UserError(f"{name(f)} must be >= 1, got {v[f]}")
    for f in ("eval_max_triples", "patience", "seed"):
        whole(f)
    for f in ("lr", "regularizer_weight", "init_std", "train_minutes"):
        number(f)
    if v["eval_max_triples"] is not None and v["eval_max_triples"] < 0:
        raise UserError(f"{name('eval_max_triples')} must be >= 0, got {v['eval_max_triples']}")
    if v["patience"] < 0:
        raise UserError(f"{name('patience')} must be >= 0, got {v['patience']}")
    if not (math.isfinite(v["lr"]) and 0 < v["lr"] <= MAX_LR):
        raise UserError(f"{name('lr')} must be in (0, {MAX_LR:g}], got {v['lr']}")
    if not (math.isfinite(v["regularizer_weight"]) and v["regularizer_weight"] >= 0):
        raise UserError(f"{name('regularizer_weight')} must be a finite number >= 0, got {v['regularizer_weight']}")
    if not (math.isfinite(v["init_std"]) and v["init_std"] > 0):
        raise UserError(f"{name('init_std')} must be a finite number > 0, got {v['init_std']}")
    if v["train_minutes"] is not None and not (math.isfinite(v["train_minutes"]) and v["train_minutes"] > 0):
        raise UserError(f"{name('train_minutes')} must be a finite number > 0, got {v['train_minutes']}")
    check_seed(v["seed"], name("seed"))
    if v["precision"] not in ONE_N_PRECISIONS:
        raise UserError(f"{name('precision')} must be {_either(ONE_N_PRECISIONS)}, got {v['precision']!r}")
    loop = v["training_loop"]
    if loop not in TRAINING_LOOPS:
        raise UserError(f"{name('training_loop')} must be one of {', '.join(TRAINING_LOOPS)}, got {loop!r}")
    if v["rank"] is None and not (loop == "1n" and v["train_minutes"]):
        raise UserError(f"{name('rank')} may be left to the time budget only with the 1n loop and "
                        f"{name('train_minutes')}")
    if loop == "1n" and v["optimizer"] not in ONE_N_OPTIMIZERS:
        raise UserError(f"{name('optimizer')} of the 1n loop must be {_either(ONE_N_OPTIMIZERS)}, got {v['optimizer']!r}")
    if loop == "1n" and v["loss"] != "crossentropy":
        raise UserError(f"the 1n loop trains with the softmax cross-entropy only, got {name('loss')} {v['loss']!r}")
    if v["candidates"] is not None and loop != "1n":
        raise UserError(f"sampled candidates ({name('candidates')} {v['candidates']}) need the 1n training loop, "
                        f"got {name('training_loop')} {loop}")


def _either(choices: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``."""
    quoted = [repr(c) for c in choices]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyper-parameters of one ComplEx training run.

    The defaults ARE the ``small`` size preset, what ``python -m kge.build --kg umls`` trains with: the
    project's 1-N loop (:mod:`kge.complex_n3`) with Lacroix et al.'s recipe (Adagrad at lr 0.1, init std
    1e-3, N3 weight 5e-2, early stopping on the validation MRR every 5 epochs).  The other presets are
    overrides of these (:data:`PRESET_OVERRIDES`); :func:`default_train_config` picks one by size.

    ``rank`` is the complex dimension (``2*rank`` real numbers per vector); None leaves it to the
    ``train_minutes`` budget (1n loop only).  ``regularizer_weight`` weighs the N3 term (mean over the
    batch's vectors of ``sum |x_i|^3``).  ``eval_max_triples`` subsamples held-out edges for the MRR
    (0 = skip the evaluation, None = all of them).  ``num_negatives`` and ``loss`` other than
    ``crossentropy`` matter to pykeen's loops only; ``precision`` through ``max_rank`` to the 1n loop only.
    Every check is :func:`check_train_values`.

    ``train_minutes`` is a hard budget for the training phase: the rank probes (``rank=None``), the
    epochs and their validation, checked after every batch and every validation chunk
    (:func:`kge.complex_n3.train_1n`), so it is kept to within one batch and one chunk even when one
    epoch takes longer than the whole budget.  ``min_epochs`` only sizes the rank (the largest whose
    ``min_epochs`` epochs fit the budget at the speed measured at start): it is a plan, not a
    promise; the budget wins.  The held-out link metrics after training are not part of the budget
    (``eval_max_triples`` bounds them).
    """

    rank: int | None = 128
    epochs: int = 100
    lr: float = 0.1
    batch_size: int = 256
    num_negatives: int = 32
    regularizer_weight: float = 5e-2
    loss: str = "crossentropy"
    training_loop: str = "1n"
    optimizer: str = "adagrad"
    init_std: float = 1e-3
    seed: int = 0
    device: str = "auto"
    eval_max_triples: int | None = 5000
    eval_batch_size: int = 256
    num_threads: int | None = None
    # --- the 1n loop only (kge.complex_n3) ---
    precision: str = "auto"
    train_minutes: float | None = None
    min_epochs: int = 20
    eval_every: int = 5
    patience: int = 3
    valid_max_triples: int | None = 5000
    checkpoint: str | None = None
    #: score each batch against this many uniformly sampled entities (plus the batch's tails) instead of all N;
    #: None (or >= N) = the full 1-N loss
    candidates: int | None = None
    #: upper bound on the rank the time budget may choose (lazy query rows cost O(rank * N) each)
    max_rank: int | None = None

    def __post_init__(self) -> None:
        check_train_values(asdict(self))


#: The size presets as overrides of :class:`TrainConfig`'s defaults (which are ``small`` itself).
#: Measurements in benchmarks/results/kge_train.md; every preset is the 1n loop.
PRESET_OVERRIDES: dict[str, dict[str, Any]] = {
    # N < 2,000 entities (UMLS, Nations, Kinships, Countries): a fixed rank, a fixed epoch cap, seconds of
    # training: TrainConfig's defaults.
    "small": {},
    # larger graphs (FB15k-237: 14,505 entities, 544k training edges with
    # inverses): a time budget; the rank is the largest whose min_epochs fit the
    # budget at the GEMM rate measured at start (rank 256 for FB15k-237 in 30
    # minutes on 2 Sapphire Rapids cores with bf16 GEMMs).
    "large": dict(rank=None, train_minutes=30.0, min_epochs=15, epochs=1000, batch_size=1000, eval_every=1,
                  patience=2),
    # N >= 50,000 (NELL-995: 63k; 100k+-entity graphs): full 1-N scoring costs B x N per row of a
    # batch (NELL-995: ~1 s per 1,000-row step at rank 256, ~4 minutes per epoch on 2 cores), so each
    # batch is scored against 4,096 uniformly sampled entities plus its own tails (~0.1 s per step,
    # sparse Adagrad updates of the touched rows only); measured against the full loss in
    # benchmarks/results/kge_train.md.  The rank is capped at 256 because lazy query rows cost
    # O(rank x N) each; the 15-minute budget keeps a build of such a graph within half an hour.
    "huge": dict(rank=None, max_rank=256, train_minutes=15.0, min_epochs=10, epochs=1000, batch_size=1000,
                 eval_every=1, patience=2, candidates=4096),
}

#: Every preset resolved: each field's value (read-only reference; :data:`PRESET_OVERRIDES` is the source).
SIZE_PRESETS: dict[str, dict[str, Any]] = {k: asdict(TrainConfig(**o)) for k, o in PRESET_OVERRIDES.items()}

#: Entity counts where the size classes start (see :data:`PRESET_OVERRIDES`).
LARGE_FROM, HUGE_FROM = 2000, 50_000


def size_class(num_entities: int) -> str:
    """``small`` (< 2,000 entities), ``large`` (< 50,000) or ``huge``: the key of :data:`PRESET_OVERRIDES`."""
    if num_entities < LARGE_FROM:
        return "small"
    return "large" if num_entities < HUGE_FROM else "huge"


def default_train_config(kg: KnowledgeGraph, *, name: Callable[[str], str] = str, **overrides: Any) -> TrainConfig:
    """The size preset for ``kg`` with ``overrides`` (None values ignored) applied.

    ``name``: how an error names a field (see :func:`check_train_values`; ``kge.build`` passes its flags).
    """
    params = {**_DEFAULTS, **PRESET_OVERRIDES[size_class(kg.num_entities)]}
    params.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(params) - set(_DEFAULTS))
    if unknown:
        raise unknown_name("training setting", unknown[0], sorted(_DEFAULTS))
    check_train_values(params, name=name)
    return TrainConfig(**params)


#: TrainConfig's defaults by field (the ``small`` preset).
_DEFAULTS: dict[str, Any] = asdict(TrainConfig())


def complex_scores(entity: np.ndarray, relation: np.ndarray, triples: np.ndarray) -> np.ndarray:
    """``Re(sum(e_h * w_r * conj(e_t)))`` for (E, 3) triples (float64 reference)."""
    e = entity.astype(np.complex128)
    w = relation.astype(np.complex128)
    h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
    return np.real(np.sum(e[h] * w[r] * np.conj(e[t]), axis=1))


def _check_pykeen_name(resolver, kind: str, name: str, option: str) -> str:
    """``name`` if pykeen's ``resolver`` accepts it (any spelling), else a UserError naming the closest ones."""
    try:
        resolver.lookup(name)
    except (KeyError, ValueError, TypeError):
        known = sorted(k for k in resolver.options if k.isalnum() and k.islower())
        raise unknown_name(kind, str(name), known, option) from None
    return name


def check_loss(name: str) -> str:
    """``name`` if pykeen knows the loss (any spelling pykeen accepts), else a UserError naming the closest ones."""
    from pykeen.losses import loss_resolver

    return _check_pykeen_name(loss_resolver, "loss", name, "--loss")


def check_optimizer(name: str, loop: str) -> str:
    """``name`` if the training loop ``loop`` knows the optimizer, else a UserError naming the closest ones.

    The 1n loop takes adagrad or adam; pykeen's loops any name pykeen's optimizer resolver accepts.
    """
    if loop == "1n":
        if name not in ONE_N_OPTIMIZERS:
            raise unknown_name("optimizer", str(name), ONE_N_OPTIMIZERS, "--optimizer")
        return name
    from pykeen.optimizers import optimizer_resolver

    return _check_pykeen_name(optimizer_resolver, "optimizer", name, "--optimizer")


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
    """Train ComplEx on ``kg.train`` and evaluate filtered MRR on held-out edges.

    ``config.training_loop`` picks the trainer: ``"1n"`` (the presets) runs
    :func:`kge.complex_n3.train_1n`, then :func:`pykeen_link_metrics` (or
    :func:`own_link_metrics` from :data:`HUGE_FROM` entities); ``"lcwa"``/``"slcwa"``
    run pykeen's ``pipeline`` (its model, loop and evaluator).  Held-out edges are
    ``kg.missing`` (dropped + valid + test), subsampled to ``config.eval_max_triples``
    (recorded in ``metrics``); filtering removes every known edge (train, dropped, valid, test).
    """
    if config.training_loop == "1n":
        return _train_1n_and_evaluate(kg, config, progress=progress)
    import torch
    from pykeen.pipeline import pipeline
    from pykeen.triples import CoreTriplesFactory

    device = resolve_device(config.device)
    check_loss(config.loss)
    check_optimizer(config.optimizer, config.training_loop)
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
                use_tqdm=progress and is_terminal(sys.stderr),
                # the per-batch bar moves every few seconds even when one epoch takes minutes
                use_tqdm_batch=progress and is_terminal(sys.stderr),
            ),
            evaluator="rankbased",
            evaluator_kwargs=dict(filtered=True),
            evaluation_kwargs=dict(
                batch_size=config.eval_batch_size,
                additional_filter_triples=[torch.as_tensor(known, dtype=torch.long)],
                use_tqdm=progress and is_terminal(sys.stderr),
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


def resolve_rank(kg: KnowledgeGraph, config: TrainConfig, *, device: str) -> tuple[TrainConfig, dict[str, Any]]:
    """``config`` with a concrete rank: the largest whose ``min_epochs`` fit ``train_minutes``, timed on real steps."""
    from .complex_n3 import choose_rank, resolve_precision

    if config.rank is not None:
        return config, {}
    rank, info = choose_rank(kg, minutes=config.train_minutes, min_epochs=config.min_epochs,
                             batch_size=config.batch_size, precision=resolve_precision(config.precision, device),
                             device=device, optimizer=config.optimizer, candidates=config.candidates,
                             max_rank=config.max_rank)
    return replace(config, rank=rank), info


def _train_1n_and_evaluate(kg: KnowledgeGraph, config: TrainConfig, *, progress: bool) -> TrainResult:
    """The 1n loop (:mod:`kge.complex_n3`), then the filtered link metrics on held-out edges (pykeen's
    evaluator, or the GEMM ranker :func:`own_link_metrics` from :data:`HUGE_FROM` entities)."""
    from .complex_n3 import budget_deadline, train_1n

    device = resolve_device(config.device)
    check_trainable(kg)
    if config.num_threads:
        import torch

        torch.set_num_threads(config.num_threads)
    deadline = budget_deadline(config.train_minutes)  # the rank probes are paid from the budget too
    config, rank_info = resolve_rank(kg, config, device=device)
    if rank_info and progress:
        print(f"training: rank {config.rank} for a {config.train_minutes:g}-minute budget "
              f"(~{rank_info['predicted_seconds_per_epoch']:.0f} s per epoch, timed on real steps)", file=sys.stderr)
    result = train_1n(kg, config, progress=progress, deadline=deadline)
    result.config = config
    result.metrics.update(rank_info)
    held_out = kg.missing
    if config.eval_max_triples != 0 and len(held_out) > 0:
        eval_triples = _subsample(held_out, config.eval_max_triples, config.seed)
        t = time.perf_counter()
        known = np.concatenate([kg.train, held_out])
        if kg.num_entities >= HUGE_FROM:
            # pykeen's ComplEx broadcasts (batch, N, d) complex products: 6.5 minutes for 5,000 edges at 120k
            # entities; the GEMM ranker gives the same tail-side numbers (tests/test_kge_complex_n3.py)
            result.metrics.update(own_link_metrics(result.entity, result.relation, eval_triples, known,
                                                   num_relations=kg.num_relations, device=device))
        else:
            result.metrics.update(pykeen_link_metrics(result.entity, result.relation, eval_triples, known,
                                                      device=device, batch_size=config.eval_batch_size,
                                                      progress=progress))
        result.metrics["eval_triples_available"] = int(len(held_out))
        result.metrics["eval_seconds"] = round(time.perf_counter() - t, 3)
    result.metrics["train_seconds_incl_eval"] = round(result.seconds + result.metrics.get("eval_seconds", 0.0), 3)
    return result


def own_link_metrics(entity: np.ndarray, relation: np.ndarray, triples: np.ndarray, known: np.ndarray, *,
                     num_relations: int, device: str = "cpu") -> dict[str, Any]:
    """Filtered tail-side metrics of complex64 embeddings by :func:`kge.complex_n3.filtered_tail_ranks`.

    The same numbers as :func:`pykeen_link_metrics`' ``mrr``/``hits_at_k`` (pykeen's
    ``tail.realistic``; tested), at GEMM speed; ``mrr_both`` (head side) is not computed.
    """
    import torch

    from .complex_n3 import filtered_tail_ranks

    def real(x: np.ndarray):
        x = np.asarray(x, dtype=np.complex64)
        return torch.from_numpy(np.concatenate([x.real, x.imag], axis=1)).to(device)

    ranks = filtered_tail_ranks(real(entity), real(relation), np.asarray(triples, dtype=np.int64),
                                np.asarray(known, dtype=np.int64), num_relations=num_relations)
    out: dict[str, Any] = {"mrr": float(np.mean(1.0 / ranks)) if len(ranks) else float("nan")}
    for k in (1, 3, 10):
        out[f"hits_at_{k}"] = float(np.mean(ranks <= k)) if len(ranks) else float("nan")
    return {**out, "mrr_both": None, "eval_triples": int(len(triples)),
            "eval_protocol": "kge.complex_n3.filtered_tail_ranks (equal to pykeen's tail.realistic), filtered "
                             "(train+held-out), tail side over both directions (reciprocal protocol)"}


#: Triples per pykeen evaluate() call in :func:`pykeen_link_metrics` (bounds the evaluator's memory).
EVAL_CHUNK = 4000


def pykeen_link_metrics(entity: np.ndarray, relation: np.ndarray, triples: np.ndarray, known: np.ndarray, *,
                        device: str = "cpu", batch_size: int = 256, progress: bool = False) -> dict[str, Any]:
    """Filtered link-prediction metrics of complex64 embeddings with pykeen's ``RankBasedEvaluator``.

    ``triples`` (E, 3) hold both directions of each edge (relation ``2k+1`` is
    the inverse of ``2k``), so the ``tail`` side over them is the standard
    reciprocal protocol (Lacroix et al. 2018): ``mrr``/``hits_at_k`` report it.
    pykeen's ``both`` side (head predictions through the non-reciprocal
    relation too) is kept as ``mrr_both`` for comparison with earlier builds.
    """
    import torch
    from pykeen.evaluation import RankBasedEvaluator

    from .complex_n3 import to_pykeen_model

    model = to_pykeen_model(entity, relation, device=device)
    # pykeen's ComplEx scores all tails by broadcasting (batch, N, d) complex products: cap that buffer at
    # ~1 GiB (a batch of 256 at FB15k-237 size and rank 256 is 7.6 GB, and the process was OOM-killed)
    n, d = entity.shape
    batch_size = max(1, min(batch_size, (1 << 30) // max(1, n * d * 16)))
    triples = np.array(triples, dtype=np.int64)  # a copy: torch refuses read-only arrays
    filter_triples = [torch.as_tensor(np.array(known, dtype=np.int64))]
    # pykeen's evaluator holds on to memory in proportion to the triples of one evaluate() call (FB15k-237's
    # 40,876 test edges were OOM-killed at 24 GB after 31k): evaluate chunks and average.  Every metric here
    # is a mean over (triple, side) of a per-rank value, so the count-weighted mean of the chunks is exact.
    sums: dict[str, float] = {}
    keys = {"mrr": "tail.realistic.inverse_harmonic_mean_rank", "hits_at_1": "tail.realistic.hits_at_1",
            "hits_at_3": "tail.realistic.hits_at_3", "hits_at_10": "tail.realistic.hits_at_10",
            "mrr_both": "both.realistic.inverse_harmonic_mean_rank"}
    for start in range(0, len(triples), EVAL_CHUNK):
        part = triples[start:start + EVAL_CHUNK]
        with _known_pykeen_noise():
            res = RankBasedEvaluator(filtered=True).evaluate(
                model, torch.as_tensor(part), batch_size=batch_size, additional_filter_triples=filter_triples,
                use_tqdm=progress and is_terminal(sys.stderr), device=torch.device(device),
            )
        for name, key in keys.items():
            sums[name] = sums.get(name, 0.0) + float(res.get_metric(key)) * len(part)
        del res
    out: dict[str, Any] = {name: v / max(1, len(triples)) for name, v in sums.items()}
    return {
        **out,
        "eval_triples": int(len(triples)),
        "eval_protocol": "pykeen RankBasedEvaluator, filtered (train+held-out), tail side over both directions "
                         "(reciprocal protocol), realistic ranks; mrr_both: both sides",
    }
