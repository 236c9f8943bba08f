"""Build an artifact folder: load a KG, drop edges, train ComplEx, calibrate, save.

Command line::

    python -m kge.build --kg umls --out artifacts/umls
    python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237
    python -m kge.build --kg umls --out /tmp/umls-lgot --drop-edges 0.5 --seed 0 --rank 64 --epochs 50
    python -m kge.build --kg umls --out artifacts/umls --overwrite      # replace an earlier artifact

``--out`` must be a new folder (missing parent folders are created), an empty
one, or (with ``--overwrite``) an artifact folder holding nothing but its own
files; anything else is refused before the build starts (:mod:`kgreason.files`),
so a build never deletes a file it did not write.

Library::

    from kge.build import BuildConfig, build_artifact
    artifact = build_artifact(BuildConfig(kg="umls", out="artifacts/umls"))
"""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import resource
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .artifact import Artifact
from .calibrate import DEFAULT_DELTA, DEFAULT_THRESHOLD, calibrate, estimate_nnz
from kgreason.cli import ArgumentParser, check_device, check_seed
from kgreason.errors import UserError, cli_main
from kgreason.files import OutputFolder, open_output
from .graph import LOADERS, drop_edges, load_kg
from .lazy import DEFAULT_ROW_CACHE_GB, MATRIX_MODES, LazyMatrices, check_row_cache_gb
from .train import TRAINING_LOOPS, TrainResult, check_loss, check_optimizer, check_trainable, default_train_config, size_class, train_complex

__all__ = ["BuildConfig", "build_artifact", "summarize", "main", "MAX_LR", "MIN_MATRIX_GB", "MAX_MATRIX_GB"]

#: Largest --lr accepted: far above any useful rate (the size presets use 0.01); larger values are typos.
MAX_LR = 10.0
#: Range of --max-matrix-gb: 1 MiB (the tiniest KG's matrices) to 1 PiB (no machine has more).
MIN_MATRIX_GB = 2.0**-10
MAX_MATRIX_GB = 2.0**20


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything a build depends on.  Training fields left as None take the size preset
    of :data:`kge.train.SIZE_PRESETS` ("small": N < 2,000 entities, "large": < 50,000, else "huge").

    ``threshold`` None means QTO's 2e-4, raised automatically (and recorded in
    meta.json) when the matrices would exceed ``max_matrix_gb`` (8 bytes per
    stored entry, estimated from a sample of rows before the full calibration);
    an explicit threshold over the budget is an error that names the threshold
    that would fit.

    ``matrices``: ``"eager"`` computes and stores every calibrated row;
    ``"lazy"`` stores none (the engine computes rows from the embeddings on
    demand, :mod:`kge.lazy`, caching up to ``row_cache_gb`` GiB), so the
    threshold is never raised; ``"auto"`` is lazy when the eager matrices
    would exceed ``max_matrix_gb`` at the threshold (estimated from a sample).

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
    rank: int | None = None
    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    num_negatives: int | None = None
    regularizer_weight: float | None = None
    training_loop: str | None = None
    optimizer: str | None = None
    train_minutes: float | None = None
    precision: str | None = None
    candidates: int | None = None
    loss: str | None = None
    eval_max_triples: int | None = 5000
    threshold: float | None = None
    max_matrix_gb: float = 1.25
    matrices: str = "eager"
    row_cache_gb: float = DEFAULT_ROW_CACHE_GB
    delta: float = DEFAULT_DELTA
    chunk_rows: int | None = None
    device: str = "auto"
    embeddings: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        for name in ("rank", "epochs", "batch_size", "num_negatives", "chunk_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.lr is not None and not (math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            raise UserError(f"--lr must be in (0, {MAX_LR:g}], got {self.lr}")
        if self.eval_max_triples is not None and self.eval_max_triples < 0:
            raise UserError(f"--eval-max-triples must be >= 0, got {self.eval_max_triples}")
        if not 0.0 <= self.drop_edges < 1.0:
            raise UserError(f"--drop-edges must be in [0, 1), got {self.drop_edges}")
        if not (math.isfinite(self.max_matrix_gb) and MIN_MATRIX_GB <= self.max_matrix_gb <= MAX_MATRIX_GB):
            raise UserError(f"--max-matrix-gb must be in [{MIN_MATRIX_GB:g}, {MAX_MATRIX_GB:g}], got {self.max_matrix_gb}")
        if self.matrices not in MATRIX_MODES:
            raise UserError(f"--matrices must be one of {', '.join(MATRIX_MODES)}, got {self.matrices!r}")
        check_row_cache_gb(self.row_cache_gb, "--row-cache-gb")
        check_seed(self.seed)
        check_device(self.device, allow_auto=True)
        if self.threshold is not None and not 0.0 < self.threshold < 1.0:
            raise UserError(f"--threshold must be in (0, 1), got {self.threshold}")
        if not 0.0 <= self.delta < 1.0:
            raise UserError(f"--delta must be in [0, 1), got {self.delta}")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "pykeen", "numpy", "scipy", "kgreason"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def build_artifact(config: BuildConfig, *, progress: bool = True) -> Artifact:
    """Load -> drop edges -> train ComplEx -> calibrate -> save ``config.out``; returns the saved Artifact.

    Every check on the user's input (the output folder, the loss name, a
    training set left empty by ``drop_edges``) runs before training.
    """
    output = OutputFolder(config.out, overwrite=config.overwrite, what="--out", create_parents=True,
                          inputs=[("--kg", config.kg)])  # never the KG's own folder (or inside it)
    if config.loss is not None and config.embeddings is None:
        check_loss(config.loss)
    if config.optimizer is not None and config.embeddings is None:
        check_optimizer(config.optimizer, config.training_loop or "1n")
    with output as tmp:  # SIGTERM, Ctrl-C or an error from here on removes the temporary folder
        return _build(config, progress, output, tmp)


def _build(config: BuildConfig, progress: bool, output: OutputFolder, tmp: Path) -> Artifact:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    kg = load_kg(config.kg, format=config.kg_format)
    timings["load"] = time.perf_counter() - t
    t = time.perf_counter()
    kg = drop_edges(kg, config.drop_edges, config.seed)
    timings["drop_edges"] = time.perf_counter() - t
    if config.embeddings is None:
        check_trainable(kg, what=f"--kg {config.kg}")
    if progress:
        print(kg.summary(), file=sys.stderr)

    train_cfg = default_train_config(
        kg, rank=config.rank, epochs=config.epochs, lr=config.lr, batch_size=config.batch_size,
        num_negatives=config.num_negatives, regularizer_weight=config.regularizer_weight,
        training_loop=config.training_loop, loss=config.loss, seed=config.seed, device=config.device,
        optimizer=config.optimizer, train_minutes=config.train_minutes, precision=config.precision,
        candidates=config.candidates,
    )
    train_cfg = type(train_cfg)(**{**asdict(train_cfg), "eval_max_triples": config.eval_max_triples})
    t = time.perf_counter()
    if config.embeddings is not None:
        trained = _reuse_embeddings(config.embeddings, kg, train_cfg)
    else:
        trained = train_complex(kg, train_cfg, progress=progress)
    timings["train"] = time.perf_counter() - t
    trained.model = None  # free the pykeen model before the memory-heavy calibration
    _release_memory()
    out = output.path
    # Checkpoint: a failed calibration can be redone with --embeddings without retraining.
    checkpoint = out.parent / f".{out.name}.embeddings.npz"
    if config.embeddings is None:
        with open_output(checkpoint, what="embeddings checkpoint", binary=True) as f:
            np.savez(f, entity=trained.entity, relation=trained.relation)
    try:
        artifact = _calibrate_and_save(config, progress, kg, train_cfg, trained, timings, tmp)
    except UserError as exc:
        if not checkpoint.is_file():
            raise
        raise UserError(f"{exc}; embeddings kept in {checkpoint} (rerun with --embeddings {checkpoint})") from None
    except BaseException:
        if checkpoint.is_file():
            print(f"note: trained embeddings kept in {checkpoint} (rerun with --embeddings {checkpoint})",
                  file=sys.stderr)
        raise
    t = time.perf_counter()
    output.commit()
    artifact.path = out
    checkpoint.unlink(missing_ok=True)
    timings["save"] += time.perf_counter() - t
    artifact.meta["timings_s"]["save"] = round(timings["save"], 3)
    return artifact


def _calibrate_and_save(config: BuildConfig, progress: bool, kg, train_cfg, trained, timings: dict[str, float],
                        tmp: Path) -> Artifact:
    formula = "p = softmax_t(score) * max(1, #observed tails); p < threshold -> 0; min(p, 1-delta); observed -> 1"
    mode, estimated = config.matrices, None
    if mode == "auto":
        t = time.perf_counter()
        mode, estimated = _auto_matrices(config, trained, kg)
        timings["estimate_nnz"] = time.perf_counter() - t
        if progress:
            print(estimated[1]["message"], file=sys.stderr)
    if mode == "lazy":
        # Nothing is stored, so QTO's threshold (or --threshold) is never raised for memory.
        threshold = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
        matrices = LazyMatrices(entity=trained.entity, relation=trained.relation, observed=kg.train,
                                threshold=threshold, delta=config.delta, row_cache_gb=config.row_cache_gb,
                                chunk_rows=config.chunk_rows)
        calibration: dict[str, Any] = {"threshold": threshold, "delta": config.delta, "row_cache_gb": config.row_cache_gb,
                                       "formula": formula}
        if estimated is not None:
            calibration["nnz_estimate"] = estimated[1]
    else:
        if estimated is None:
            t = time.perf_counter()
            estimated = choose_threshold(config, trained.entity, trained.relation, kg.train, trained.device)
            timings["estimate_nnz"] = time.perf_counter() - t
            if progress:
                print(estimated[1]["message"], file=sys.stderr)
        threshold, estimate_info = estimated

        t = time.perf_counter()
        budget_nnz = int(config.max_matrix_gb * (1 << 30) / 8)
        matrices, cstats = calibrate(
            trained.entity, trained.relation, kg.train, threshold=threshold, delta=config.delta,
            chunk_rows=config.chunk_rows, device=trained.device, progress=progress,
            max_nnz=budget_nnz, adapt_threshold=config.threshold is None,
        )
        threshold = cstats.threshold
        if cstats.threshold_raises:
            estimate_info["raised_during_calibration"] = cstats.threshold_raises
        timings["calibrate"] = time.perf_counter() - t
        calibration = {
            "threshold": threshold,
            "nnz_estimate": estimate_info,
            "delta": config.delta,
            "rows": cstats.rows,
            "chunk_rows": cstats.chunk_rows,
            "matmul_gflops_per_s": cstats.flop_rate / 1e9,
            "formula": formula,
        }

    meta: dict[str, Any] = {
        "source": kg.source,
        "kg_stats": dict(kg.stats),
        "build_config": asdict(config),
        "train_config": asdict(trained.config),  # the rank a time budget chose, not None
        "size_preset": size_class(kg.num_entities),
        "inverse_relations": "relation 2k+1 is the inverse of 2k (named X^-1)",
        "train": {
            "losses": trained.losses,
            "final_loss": trained.losses[-1] if trained.losses else None,
            "device": trained.device,
            **trained.metrics,
        },
        "matrices": mode,
        "calibration": calibration,
        "versions": _versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
    }
    artifact = Artifact(
        entities=list(kg.entities), relations=list(kg.relations), matrices=matrices,
        observed=kg.train, missing=kg.missing, meta=meta,
        embeddings={"entity": trained.entity, "relation": trained.relation},
    )
    t = time.perf_counter()
    # Timings and peak memory go in before the save so that meta.json is final.
    timings["save"] = 0.0
    artifact.meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    artifact.meta["peak_rss_bytes"] = peak_rss_bytes()
    artifact.save(tmp)
    timings["save"] = time.perf_counter() - t
    return artifact


def _reuse_embeddings(source: str, kg, train_cfg) -> TrainResult:
    """Embeddings of an earlier build (artifact folder or embeddings.npz) instead of training."""
    from .train import resolve_device

    path = Path(source)
    npz = path / "embeddings.npz" if path.is_dir() else path
    if not npz.is_file():
        raise UserError(f"--embeddings {source}: no embeddings.npz there")
    try:
        with np.load(npz, allow_pickle=False) as z:
            if "entity" not in z.files or "relation" not in z.files:
                raise UserError(f"{npz}: expected arrays 'entity' and 'relation', got {z.files}")
            ent, rel = z["entity"].astype(np.complex64), z["relation"].astype(np.complex64)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, TypeError) as exc:
        if isinstance(exc, UserError):
            raise
        raise UserError(f"--embeddings {npz}: not an embeddings .npz file ({type(exc).__name__})") from None
    if ent.ndim != 2 or rel.ndim != 2 or ent.shape[0] != kg.num_entities or rel.shape[0] != kg.num_relations or ent.shape[1] != rel.shape[1]:
        raise UserError(f"{npz}: embeddings of shape {ent.shape}/{rel.shape} do not fit this KG "
                        f"({kg.num_entities} entities, {kg.num_relations} relations)")
    metrics: dict[str, Any] = {"embeddings_from": str(npz)}
    losses: list[float] = []
    meta_path = npz.parent / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    except (ValueError, OSError):  # a damaged meta.json only costs the loss history
        meta = {}
    old = meta.get("train") if isinstance(meta, dict) else None
    if isinstance(old, dict):
        losses = [float(x) for x in old.get("losses", []) if isinstance(x, (int, float))] \
            if isinstance(old.get("losses"), list) else []
        metrics.update({k: v for k, v in old.items() if k not in ("losses", "final_loss")})
        metrics["embeddings_from"] = str(npz)
    return TrainResult(entity=ent, relation=rel, config=train_cfg, losses=losses, metrics=metrics, seconds=0.0,
                       device=resolve_device(train_cfg.device))


def _release_memory() -> None:
    """Give freed heap pages back to the OS (training leaves ~1 GB in glibc's free lists)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _auto_matrices(config: BuildConfig, trained, kg) -> tuple[str, tuple[float, dict[str, Any]]]:
    """``--matrices auto``: ``("eager", choose_threshold's result)`` when the matrices fit
    ``--max-matrix-gb`` at QTO's threshold (or ``--threshold``), else ``("lazy", (threshold, info))``:
    a lazy artifact never needs the threshold raised."""
    floor = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
    try:
        threshold, info = choose_threshold(config, trained.entity, trained.relation, kg.train, trained.device)
    except UserError as exc:  # an explicit --threshold whose matrices would not fit
        info = {"message": f"--matrices auto: lazy ({exc})"}
        return "lazy", (floor, info)
    if "raised_threshold" not in info:
        info["message"] += "; --matrices auto: eager"
        return "eager", (threshold, info)
    info["message"] = (f"--matrices auto: lazy (the eager matrices at threshold {floor:g} would exceed "
                       f"--max-matrix-gb {config.max_matrix_gb:g}: {info[f'nnz_at_{floor:g}']:,} estimated entries)")
    del info["raised_threshold"]
    return "lazy", (floor, info)


def choose_threshold(config: BuildConfig, entity: np.ndarray, relation: np.ndarray, observed: np.ndarray,
                     device: str) -> tuple[float, dict[str, Any]]:
    """The calibration threshold for ``config`` and a record of the nnz estimate behind it."""
    budget_nnz = config.max_matrix_gb * (1 << 30) / 8
    floor = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
    est = estimate_nnz(entity, relation, observed, floor=floor, seed=config.seed, device=device)
    nnz_floor = est.nnz_at(floor)
    info: dict[str, Any] = {"sampled_rows": est.sampled_rows, "max_matrix_gb": config.max_matrix_gb,
                            f"nnz_at_{floor:g}": round(nnz_floor)}
    if nnz_floor <= budget_nnz:
        info["message"] = (f"calibration: threshold {floor:g}, estimated nnz {nnz_floor:,.0f} "
                           f"({nnz_floor * 8 / (1 << 30):.2f} GiB) from {est.sampled_rows} sampled rows")
        return floor, info
    fit = est.threshold_for(budget_nnz)
    if config.threshold is not None:
        raise UserError(
            f"--threshold {floor:g} keeps an estimated {nnz_floor:,.0f} entries ({nnz_floor * 8 / (1 << 30):.1f} GiB), "
            f"over --max-matrix-gb {config.max_matrix_gb:g}; use --threshold {fit:.3g} or a larger --max-matrix-gb"
        )
    info["message"] = (f"calibration: QTO's threshold {floor:g} would keep ~{nnz_floor:,.0f} entries "
                       f"({nnz_floor * 8 / (1 << 30):.1f} GiB > --max-matrix-gb {config.max_matrix_gb:g}); "
                       f"using threshold {fit:.3g} (estimated nnz {est.nnz_at(fit):,.0f})")
    info["raised_threshold"] = fit
    return fit, info


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def summarize(artifact: Artifact) -> str:
    """Human-readable summary: sizes, nnz per relation, MRR, time per stage, peak memory."""
    m = artifact.meta
    if artifact.is_lazy:
        lz = artifact.matrices
        nnz_line = (f"matrices      lazy: rows computed on demand at threshold {lz.threshold:.3g} "
                    f"(row cache {lz.row_cache_gb:g} GiB)")
    else:
        nnz = artifact.nnz_per_relation()
        nnz_line = (f"nnz           total {int(nnz.sum()):,}; per relation min {int(nnz.min()):,} / median "
                    f"{int(np.median(nnz)):,} / max {int(nnz.max()):,}"
                    f" ({nnz.sum() / max(1, artifact.num_entities * artifact.num_relations):.1f} per row)")
    lines = [
        f"artifact      {artifact.path}",
        f"source        {m.get('source', '?')}",
        f"entities      {artifact.num_entities:,}",
        f"relations     {artifact.num_relations:,} (inverses included)",
        f"observed      {len(artifact.observed):,} edges",
        f"missing       {len(artifact.missing):,} edges (dropped + valid + test)",
        nnz_line,
    ]
    tr = m.get("train", {})
    if "mrr" in tr:
        lines.append(
            f"link pred.    MRR {tr['mrr']:.3f}, hits@1 {tr['hits_at_1']:.3f}, hits@10 {tr['hits_at_10']:.3f} "
            f"(filtered, {tr['eval_triples']:,} of {tr['eval_triples_available']:,} held-out edges)"
        )
    if tr.get("final_loss") is not None:
        lines.append(f"train loss    {tr['final_loss']:.4f} after {len(tr['losses'])} epochs")
    timings = m.get("timings_s", {})
    if timings:
        lines.append("time          " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
                     + f"; total {sum(timings.values()):.1f} s")
    cal = m.get("calibration", {})
    if "matmul_gflops_per_s" in cal:
        lines.append(f"calibration   threshold {cal['threshold']:.3g}, delta {cal['delta']:g}; "
                     f"{cal['matmul_gflops_per_s']:.1f} GFLOP/s useful matmul rate (chunk {cal['chunk_rows']} rows)")
    if "peak_rss_bytes" in m:
        lines.append(f"peak memory   {_fmt_bytes(m['peak_rss_bytes'])} (RSS)")
    return "\n".join(lines)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m kge.build", description="Build a calibrated-matrix artifact from a knowledge graph.")
    p.add_argument("--kg", required=True, help="TSV file, train/valid/test folder, BetaE folder, or pykeen dataset name (umls)")
    p.add_argument("--out", required=True, help="artifact folder to write (missing parent folders are created)")
    p.add_argument("--kg-format", choices=list(LOADERS), default=None, help="loader (default: detected)")
    p.add_argument("--drop-edges", type=float, default=0.0, help="fraction of training edges to hold out (LGOT: 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of edge dropping, training and sampling (default 0)")
    p.add_argument("--rank", type=int, default=None, help="complex embedding dimension (default: size preset)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help=f"learning rate in (0, {MAX_LR:g}] (default: size preset)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--num-negatives", type=int, default=None, help="negatives per positive (sLCWA)")
    p.add_argument("--regularizer-weight", type=float, default=None, help="N3 weight")
    p.add_argument("--training-loop", choices=list(TRAINING_LOOPS), default=None,
                   help="1n: the project's fast 1-N ComplEx-N3 loop (default); lcwa/slcwa: pykeen's own loops")
    p.add_argument("--optimizer", default=None, help="adagrad (1n default), adam, or a pykeen optimizer name for lcwa/slcwa")
    p.add_argument("--train-minutes", type=float, default=None,
                   help="training time budget in minutes (1n loop; large KGs: picks the rank, default 30)")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                   help="1n loop GEMMs: bf16 where the CPU/GPU has it (auto, default) or fp32")
    p.add_argument("--candidates", type=int, default=None,
                   help="1n loop: score each batch against this many sampled entities (plus the batch's tails) "
                        "instead of all of them (default: all below 50,000 entities, 4096 above)")
    p.add_argument("--loss", default=None, help="pykeen loss name (default crossentropy)")
    p.add_argument("--eval-max-triples", type=int, default=5000, help="held-out edges used for the MRR (0 = skip)")
    p.add_argument("--threshold", type=float, default=None,
                   help=f"drop calibrated probabilities below this (default {DEFAULT_THRESHOLD:g}, raised if over --max-matrix-gb)")
    p.add_argument("--max-matrix-gb", type=float, default=1.25,
                   help=f"memory budget of the matrices in GiB, {MIN_MATRIX_GB:g} to {MAX_MATRIX_GB:g} (8 bytes per entry); "
                        "peak RSS is about baseline + 2.5x this")
    p.add_argument("--matrices", choices=list(MATRIX_MODES), default="eager",
                   help="eager: compute and store every calibrated row; lazy: store none, the engine computes the "
                        "rows a query needs from the embeddings (threshold never raised); auto: lazy when the eager "
                        "matrices would exceed --max-matrix-gb (default eager)")
    p.add_argument("--row-cache-gb", type=float, default=DEFAULT_ROW_CACHE_GB,
                   help=f"lazy matrices: byte budget of the engine's calibrated-row cache in GiB, > 0 "
                        f"(default {DEFAULT_ROW_CACHE_GB:g}; recorded in meta.json)")
    p.add_argument("--delta", type=float, default=DEFAULT_DELTA)
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per calibration chunk (default: ~16 MB buffers on CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto: cuda if available)")
    p.add_argument("--embeddings", default=None,
                   help="reuse the embeddings of an earlier artifact folder (or embeddings.npz) instead of training")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing artifact at --out (never a folder that is not an artifact)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[BuildConfig, bool]:
    ns = _parser().parse_args(argv)  # mistakes: one-line UserError (kgreason.cli.ArgumentParser)
    names = {f.name for f in fields(BuildConfig)}
    cfg = BuildConfig(**{k: v for k, v in vars(ns).items() if k in names})
    return cfg, not ns.quiet


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    config, progress = parse_args(argv)
    artifact = build_artifact(config, progress=progress)
    if progress:
        print(summarize(artifact))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
