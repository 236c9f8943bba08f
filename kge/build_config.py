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

from kgreason.cli import check_device
from kgreason.errors import UserError, unknown_name

from .autorule import DEFAULT_EXPECTED_QUERIES
from .calibrate import DEFAULT_DELTA
from .lazy import DEFAULT_ROW_CACHE_GB, MATRIX_MODES, check_row_cache_gb
from .train import TrainConfig, check_loss, check_optimizer, check_train_values

__all__ = ["BuildConfig", "TRAIN_FLAGS", "MIN_MATRIX_GB", "MAX_MATRIX_GB", "DEFAULT_MAX_CALIBRATE_MINUTES",
           "flat_defaults"]

#: The :class:`kge.train.TrainConfig` fields ``kge.build`` has a flag for (``--rank`` ...): what
#: ``BuildConfig.train`` may override, and the training keys of meta.json's ``build_config``.
#: ``seed`` and ``device`` are :class:`BuildConfig` fields: they serve the whole build, training included.
TRAIN_FLAGS = ("rank", "epochs", "lr", "batch_size", "num_negatives", "regularizer_weight", "training_loop",
               "optimizer", "train_minutes", "precision", "candidates", "loss", "eval_max_triples")
#: Range of --max-matrix-gb: 1 MiB (the tiniest KG's matrices) to 1 PiB (no machine has more).
MIN_MATRIX_GB = 2.0**-10
MAX_MATRIX_GB = 2.0**20
#: ``--matrices auto`` is lazy when calibrating every row is estimated to take longer than this many minutes
#: more than the rows of the expected queries (:mod:`kge.autorule`).
DEFAULT_MAX_CALIBRATE_MINUTES = 30.0

def _flag(name: str) -> str:
    """The kge.build flag of a config field: ``--max-matrix-gb`` for ``max_matrix_gb``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
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

    kg: str
    out: str
    kg_format: str | None = None
    drop_edges: float = 0.0
    seed: int = 0
    train: Mapping[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    max_matrix_gb: float = 1.25
    matrices: str = "auto"
    max_calibrate_minutes: float = DEFAULT_MAX_CALIBRATE_MINUTES
    expected_queries: int = DEFAULT_EXPECTED_QUERIES
    memory_check: bool = True
    row_cache_gb: float = DEFAULT_ROW_CACHE_GB
    delta: float = DEFAULT_DELTA
    chunk_rows: int | None = None
    device: str = "auto"
    embeddings: str | None = None
    overwrite: bool = False

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
        if self.chunk_rows is not None and self.chunk_rows < 1:
            raise UserError(f"--chunk-rows must be >= 1, got {self.chunk_rows}")
        if not 0.0 <= self.drop_edges < 1.0:
            raise UserError(f"--drop-edges must be in [0, 1), got {self.drop_edges}")
        if not (math.isfinite(self.max_matrix_gb) and MIN_MATRIX_GB <= self.max_matrix_gb <= MAX_MATRIX_GB):
            raise UserError(f"--max-matrix-gb must be in [{MIN_MATRIX_GB:g}, {MAX_MATRIX_GB:g}], got {self.max_matrix_gb}")
        if self.matrices not in MATRIX_MODES:
            raise UserError(f"--matrices must be one of {', '.join(MATRIX_MODES)}, got {self.matrices!r}")
        check_row_cache_gb(self.row_cache_gb, "--row-cache-gb")
        if not (math.isfinite(self.max_calibrate_minutes) and 0 < self.max_calibrate_minutes <= 1e9):
            raise UserError(f"--max-calibrate-minutes must be in (0, 1e9], got {self.max_calibrate_minutes}")
        if isinstance(self.expected_queries, bool) or not isinstance(self.expected_queries, int) \
                or not 0 <= self.expected_queries <= 10**12:
            raise UserError(f"--expected-queries must be an integer in [0, 1e12], got {self.expected_queries!r}")
        check_device(self.device, allow_auto=True)
        if self.threshold is not None and not 0.0 < self.threshold < 1.0:
            raise UserError(f"--threshold must be in (0, 1), got {self.threshold}")
        if not 0.0 <= self.delta < 1.0:
            raise UserError(f"--delta must be in [0, 1), got {self.delta}")

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
