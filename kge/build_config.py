"""The settings of a build (:class:`BuildConfig`) and the defaults of its flags, below the build itself.

:mod:`kge.build` (the build, and its ``python -m kge.build`` CLI) re-exports every name here, which is where
users import them from.  They live in this module so that :mod:`kge.artifact` can print the command that
rebuilds an artifact (:func:`kge.artifact.rebuild_command`, from :func:`flat_defaults`) without importing
the build CLI: the loader sits below the build (issue 33: ``kge.artifact`` importing ``kge.build`` put five
kge modules in one import circle).
"""
from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Mapping

from kgreason.cli import SEED_MAX, Settings, check_device, setting
from kgreason.errors import UserError, unknown_name

from .autorule import DEFAULT_EXPECTED_QUERIES
from .calibrate import DEFAULT_DELTA, DEFAULT_THRESHOLD
from .graph import LOADERS
from .lazy import DEFAULT_ROW_CACHE_GB, MATRIX_MODES, check_row_cache_gb
from .train import (HUGE_FROM, MAX_LR, ONE_N_PRECISIONS, PRESET_OVERRIDES, TRAINING_LOOPS, TrainConfig, check_loss,
                    check_optimizer, check_train_values)

__all__ = ["BuildConfig", "BuildTrainSettings", "TRAIN_FLAGS", "MIN_MATRIX_GB", "MAX_MATRIX_GB",
           "DEFAULT_MAX_CALIBRATE_MINUTES", "flat_defaults"]

#: Range of --max-matrix-gb: 1 MiB (the tiniest KG's matrices) to 1 PiB (no machine has more).
MIN_MATRIX_GB = 2.0**-10
MAX_MATRIX_GB = 2.0**20
#: ``--matrices auto`` is lazy when calibrating every row is estimated to take longer than this many minutes
#: more than the rows of the expected queries (:mod:`kge.autorule`).
DEFAULT_MAX_CALIBRATE_MINUTES = 30.0


@dataclass(frozen=True, kw_only=True)
class BuildTrainSettings:
    """The training flags of ``python -m kge.build`` (``--rank`` ...): overrides of the size preset's
    :class:`kge.train.TrainConfig` fields of the same names, None = the preset's value.  Their ranges are
    :func:`kge.train.check_train_values`' (run by :class:`BuildConfig`); a build holds them as
    ``BuildConfig.train``."""

    rank: int | None = setting(None, shown_default="size preset", help="complex embedding dimension")
    epochs: int | None = setting(None, shown_default="size preset", help="training epochs")
    lr: float | None = setting(None, shown_default="size preset", help=f"learning rate in (0, {MAX_LR:g}]")
    batch_size: int | None = setting(None, shown_default="size preset", help="training batch size")
    num_negatives: int | None = setting(None, shown_default="size preset", help="negatives per positive (sLCWA)")
    regularizer_weight: float | None = setting(None, shown_default="size preset", help="N3 weight")
    training_loop: str | None = setting(None, choices=tuple(TRAINING_LOOPS), shown_default="1n",
                                        help="1n: the project's fast 1-N ComplEx-N3 loop; lcwa/slcwa: pykeen's own loops")
    optimizer: str | None = setting(None, help="adagrad (1n default), adam, or a pykeen optimizer name for lcwa/slcwa")
    train_minutes: float | None = setting(
        None, shown_default=f"{PRESET_OVERRIDES['large']['train_minutes']:g} on large KGs",
        help="training time budget in minutes, rank probes and validation included, kept to the batch (1n loop; "
             "large KGs: picks the rank)")
    precision: str | None = setting(None, choices=ONE_N_PRECISIONS, shown_default="auto",
                                    help="1n loop GEMMs: bf16 where the CPU/GPU has it (auto) or fp32")
    candidates: int | None = setting(
        None, shown_default=f"all below {HUGE_FROM:,} entities, {PRESET_OVERRIDES['huge']['candidates']} above",
        help="1n loop: score each batch against this many sampled entities (plus the batch's tails) instead of "
             "all of them")
    loss: str | None = setting(None, shown_default=TrainConfig.loss, help="pykeen loss name")
    # default None = the preset's (TrainConfig.eval_max_triples), so that meta.json records only what was given
    eval_max_triples: int | None = setting(None, shown_default=str(TrainConfig.eval_max_triples),
                                           help="held-out edges used for the MRR (0 = skip)")


#: The :class:`kge.train.TrainConfig` fields ``kge.build`` has a flag for (``--rank`` ...,
#: :class:`BuildTrainSettings`): what ``BuildConfig.train`` may override, and the training keys of meta.json's
#: ``build_config``.  ``seed`` and ``device`` are :class:`BuildConfig` fields: they serve the whole build,
#: training included.
TRAIN_FLAGS = tuple(f.name for f in fields(BuildTrainSettings))


def _check_expected_queries(value: object, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**12:
        raise UserError(f"{flag} must be an integer in [0, 1e12], got {value!r}")


def _check_calibrate_minutes(value: float, flag: str) -> None:
    if not (math.isfinite(value) and 0 < value <= 1e9):
        raise UserError(f"{flag} must be in (0, 1e9], got {value}")


def _check_row_cache_gb(value: float, flag: str) -> None:
    check_row_cache_gb(value, flag)

def _flag(name: str) -> str:
    """The kge.build flag of a config field: ``--max-matrix-gb`` for ``max_matrix_gb``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class BuildConfig(Settings):
    """Everything a build depends on.

    ``train``: overrides of the size preset, by :class:`kge.train.TrainConfig` field name
    (only those of :data:`TRAIN_FLAGS`; None values are dropped, i.e. take the preset).  The preset is
    picked by the loaded graph's size (:func:`kge.train.default_train_config`: "small" below 2,000
    entities, which is TrainConfig's defaults, "large" below 50,000, else "huge").  The values are
    checked up front by :func:`kge.train.check_train_values`, errors naming the flags (``--rank``).
    ``seed`` and ``device`` serve the whole build (edge dropping, training, calibration).

    ``threshold`` None means QTO's 2e-4, raised automatically (and recorded in
    meta.json) when the matrices would exceed ``max_matrix_gb`` (8 bytes per
    stored entry, estimated from a sample of rows before the full calibration);
    an explicit threshold over the budget is an error that names the threshold
    that would fit.

    ``matrices``: ``"eager"`` computes and stores every calibrated row;
    ``"lazy"`` stores none (the engine computes rows from the embeddings on
    demand, :mod:`kge.lazy`, caching up to ``row_cache_gb`` GiB), so the
    threshold is never raised; ``"auto"`` (the default) is lazy when the eager
    matrices at the threshold (estimated from a sample) would exceed
    ``max_matrix_gb`` or, at :data:`EAGER_PEAK_FACTOR` times their size, the
    available memory, or when computing every row at the rate measured on this
    KG would take longer than the rows ``expected_queries`` lazy queries compute
    plus ``max_calibrate_minutes``; else eager (:mod:`kge.autorule`).
    The build log and ``meta.json["calibration"]["matrices_choice"]`` say which and why.

    ``memory_check``: before training, the build's peak memory is estimated
    (:func:`estimate_build_memory`) and a build that would not fit in
    MemAvailable (``/proc/meminfo``) is refused; False (``--no-memory-check``) skips that.

    ``out`` is written atomically: the artifact is built in a temporary sibling
    folder and moved into place only when complete, so a failed build leaves a
    previous artifact intact.  An existing artifact at ``out`` is replaced only
    with ``overwrite``; an existing folder that is not an artifact is an error
    (checked before loading or training anything).
    """

    kg: str = setting(help="TSV file, train/valid/test folder, BetaE folder, or pykeen dataset name (umls)")
    out: str = setting(help="artifact folder to write (missing parent folders are created)")
    kg_format: str | None = setting(None, choices=tuple(LOADERS), shown_default="detected", help="loader")
    drop_edges: float = setting(0.0, low=0.0, high=1.0, high_open=True,
                                help="fraction of training edges to hold out (LGOT: 0.5)")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="seed of edge dropping, training and sampling")
    train: Mapping[str, Any] = field(default_factory=dict)  # the flags of BuildTrainSettings
    threshold: float | None = setting(None, low=0.0, high=1.0, low_open=True, high_open=True,
                                      shown_default=f"{DEFAULT_THRESHOLD:g}",
                                      help="drop calibrated probabilities below this (eager: raised if over "
                                           "--max-matrix-gb)")
    max_matrix_gb: float = setting(1.25, low=MIN_MATRIX_GB, high=MAX_MATRIX_GB,
                                   help=f"memory budget of the matrices in GiB, {MIN_MATRIX_GB:g} to {MAX_MATRIX_GB:g} "
                                        "(8 bytes per entry); peak RSS is about baseline + 2.5x this")
    matrices: str = setting("auto", choices=tuple(MATRIX_MODES),
                            help="eager: compute and store every calibrated row; lazy: store none, the engine computes "
                                 "the rows a query needs from the embeddings (threshold never raised); auto: eager "
                                 "unless the eager matrices would exceed --max-matrix-gb or the available memory, or "
                                 "calibrating every row (at the rate measured on this KG's rows) would take longer "
                                 "than the rows --expected-queries lazy queries compute plus --max-calibrate-minutes; "
                                 "the log says which and why in one line.  A lazy artifact is made eager later with "
                                 "python -m kge.materialize")
    max_calibrate_minutes: float = setting(DEFAULT_MAX_CALIBRATE_MINUTES, check=_check_calibrate_minutes,
                                           help="--matrices auto: how much longer than the expected queries' lazy "
                                                "rows the eager calibration may take, in minutes")
    expected_queries: int = setting(DEFAULT_EXPECTED_QUERIES, check=_check_expected_queries,
                                    help="--matrices auto: queries the artifact is expected to answer, each computing "
                                         "about one first-hop frontier of rows when lazy (a BetaE evaluation: 14 "
                                         "structures x 1,000)")
    memory_check: bool = setting(True, flag="--no-memory-check", negate=True,
                                 help="build even when the up-front memory estimate exceeds MemAvailable "
                                      "(default: refuse)")
    row_cache_gb: float = setting(DEFAULT_ROW_CACHE_GB, check=_check_row_cache_gb,
                                  help="lazy matrices: byte budget of the engine's calibrated-row cache in GiB, > 0 "
                                       "(recorded in meta.json)")
    delta: float = setting(DEFAULT_DELTA, low=0.0, high=1.0, high_open=True,
                           help="cap non-observed entries at 1 - delta")
    chunk_rows: int | None = setting(None, low=1, integer=True, shown_default="~16 MB buffers on CPU",
                                     help="rows per calibration chunk")
    device: str = setting("auto", check=lambda value, flag: check_device(value, flag, allow_auto=True),
                          help="auto, cpu, cuda or cuda:N (auto: cuda if available)")
    embeddings: str | None = setting(None, help="reuse the embeddings of an earlier artifact folder (or "
                                                "embeddings.npz) instead of training")
    overwrite: bool = setting(False, help="replace an existing artifact at --out (never a folder that is not an "
                                          "artifact)")

    def __post_init__(self) -> None:
        if not isinstance(self.train, Mapping):
            raise UserError(f"BuildConfig.train must be a mapping of training settings, got {type(self.train).__name__}")
        for name in self.train:
            if name in ("seed", "device"):
                raise UserError(f"BuildConfig.train: {name} is a BuildConfig field (it serves the whole build)")
            if name not in TRAIN_FLAGS:
                raise unknown_name("training setting", str(name), TRAIN_FLAGS, "BuildConfig.train")
        object.__setattr__(self, "train", {k: v for k, v in self.train.items() if v is not None})
        if self.embeddings is None:  # a misspelt name first, with the closest known ones
            if "loss" in self.train:
                check_loss(self.train["loss"])  # imports pykeen: only when a loss is named
            if "optimizer" in self.train:
                check_optimizer(self.train["optimizer"], self.train.get("training_loop", TrainConfig.training_loop))
        # the default (small) preset's values stand in for the ones not given; the real preset is checked
        # again once the graph's size is known (default_train_config)
        check_train_values({**_TRAIN_DEFAULTS, **self.train, "seed": self.seed}, name=_flag)
        super().__post_init__()  # every flagged field's range, choices and check (kgreason.cli.check_settings)

    def to_json(self) -> dict[str, Any]:
        """The flat record meta.json keeps as ``build_config``: every field, the training overrides under
        their own names (every one of :data:`TRAIN_FLAGS`, None where the preset's value was used)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "train":
                out.update({k: self.train.get(k) for k in TRAIN_FLAGS})
            else:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> "BuildConfig":
        """The config of a flat mapping with :meth:`to_json`'s keys (parsed flags, meta.json's ``build_config``)."""
        train = {k: values[k] for k in TRAIN_FLAGS if values.get(k) is not None}
        return cls(**{k: v for k, v in values.items() if k not in TRAIN_FLAGS}, train=train)


#: TrainConfig's defaults (the small preset): what BuildConfig checks its overrides against.
_TRAIN_DEFAULTS = asdict(TrainConfig())


def flat_defaults() -> dict[str, Any]:
    """The default of every key of :meth:`BuildConfig.to_json` (training keys: None, the size preset)."""
    out: dict[str, Any] = {}
    for f in fields(BuildConfig):
        if f.name == "train":
            out.update(dict.fromkeys(TRAIN_FLAGS))
        elif f.default is not MISSING:
            out[f.name] = f.default
    return out
