"""Build an artifact folder: load a KG, drop edges, train ComplEx, calibrate, save.

Command line::

    python -m kge.build --kg umls --out artifacts/umls
    python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237
    python -m kge.build --kg umls --out /tmp/umls-lgot --drop-edges 0.5 --seed 0 --rank 64 --epochs 50

Library::

    from kge.build import BuildConfig, build_artifact
    artifact = build_artifact(BuildConfig(kg="umls", out="artifacts/umls"))
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .artifact import Artifact
from .calibrate import DEFAULT_DELTA, DEFAULT_THRESHOLD, calibrate
from .errors import UserError, cli_main
from .graph import drop_edges, load_kg
from .train import default_train_config, size_class, train_complex

__all__ = ["BuildConfig", "build_artifact", "summarize", "main"]


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything a build depends on.  Training fields left as None take the size preset
    of :data:`kge.train.SIZE_PRESETS` ("small": N < 2,000 entities, else "large").

    ``out`` is written atomically: the artifact is built in a temporary sibling
    folder and moved into place only when complete, so a failed build leaves a
    previous artifact intact.
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
    loss: str | None = None
    eval_max_triples: int | None = 5000
    threshold: float = DEFAULT_THRESHOLD
    delta: float = DEFAULT_DELTA
    chunk_rows: int | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop_edges < 1.0:
            raise UserError(f"--drop-edges must be in [0, 1), got {self.drop_edges}")
        if not 0.0 < self.threshold < 1.0:
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
    """Load -> drop edges -> train ComplEx -> calibrate -> save ``config.out``; returns the saved Artifact."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    kg = load_kg(config.kg, format=config.kg_format)
    timings["load"] = time.perf_counter() - t
    t = time.perf_counter()
    kg = drop_edges(kg, config.drop_edges, config.seed)
    timings["drop_edges"] = time.perf_counter() - t
    if progress:
        print(kg.summary(), file=sys.stderr)

    train_cfg = default_train_config(
        kg, rank=config.rank, epochs=config.epochs, lr=config.lr, batch_size=config.batch_size,
        num_negatives=config.num_negatives, regularizer_weight=config.regularizer_weight,
        training_loop=config.training_loop, loss=config.loss, seed=config.seed, device=config.device,
    )
    train_cfg = type(train_cfg)(**{**asdict(train_cfg), "eval_max_triples": config.eval_max_triples})
    t = time.perf_counter()
    trained = train_complex(kg, train_cfg, progress=progress)
    timings["train"] = time.perf_counter() - t
    trained.model = None  # free the pykeen model before the memory-heavy calibration

    t = time.perf_counter()
    matrices, cstats = calibrate(
        trained.entity, trained.relation, kg.train, threshold=config.threshold, delta=config.delta,
        chunk_rows=config.chunk_rows, device=trained.device, progress=progress,
    )
    timings["calibrate"] = time.perf_counter() - t

    meta: dict[str, Any] = {
        "source": kg.source,
        "kg_stats": dict(kg.stats),
        "build_config": asdict(config),
        "train_config": asdict(train_cfg),
        "size_preset": size_class(kg.num_entities),
        "inverse_relations": "relation 2k+1 is the inverse of 2k (named X^-1)",
        "train": {
            "losses": trained.losses,
            "final_loss": trained.losses[-1] if trained.losses else None,
            "device": trained.device,
            **trained.metrics,
        },
        "calibration": {
            "threshold": config.threshold,
            "delta": config.delta,
            "rows": cstats.rows,
            "chunk_rows": cstats.chunk_rows,
            "matmul_gflops_per_s": cstats.flop_rate / 1e9,
            "formula": "p = softmax_t(score) * max(1, #observed tails); p < threshold -> 0; min(p, 1-delta); observed -> 1",
        },
        "versions": _versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
    }
    artifact = Artifact(
        entities=list(kg.entities), relations=list(kg.relations), matrices=matrices,
        observed=kg.train, missing=kg.missing, meta=meta,
        embeddings={"entity": trained.entity, "relation": trained.relation},
    )
    t = time.perf_counter()
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        # Timings and peak memory go in before the save so that meta.json is final.
        timings["save"] = 0.0
        artifact.meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
        artifact.meta["peak_rss_bytes"] = peak_rss_bytes()
        artifact.save(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    artifact.path = out
    timings["save"] = time.perf_counter() - t
    artifact.meta["timings_s"]["save"] = round(timings["save"], 3)
    return artifact


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def summarize(artifact: Artifact) -> str:
    """Human-readable summary: sizes, nnz per relation, MRR, time per stage, peak memory."""
    m = artifact.meta
    nnz = artifact.nnz_per_relation()
    lines = [
        f"artifact      {artifact.path}",
        f"source        {m.get('source', '?')}",
        f"entities      {artifact.num_entities:,}",
        f"relations     {artifact.num_relations:,} (inverses included)",
        f"observed      {len(artifact.observed):,} edges",
        f"missing       {len(artifact.missing):,} edges (dropped + valid + test)",
        f"nnz           total {int(nnz.sum()):,}; per relation min {int(nnz.min()):,} / median {int(np.median(nnz)):,} / max {int(nnz.max()):,}"
        f" ({nnz.sum() / max(1, artifact.num_entities * artifact.num_relations):.1f} per row)",
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
        lines.append(f"calibration   {cal['matmul_gflops_per_s']:.1f} GFLOP/s useful matmul rate (chunk {cal['chunk_rows']} rows)")
    if "peak_rss_bytes" in m:
        lines.append(f"peak memory   {_fmt_bytes(m['peak_rss_bytes'])} (RSS)")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kge.build", description="Build a calibrated-matrix artifact from a knowledge graph.")
    p.add_argument("--kg", required=True, help="TSV file, train/valid/test folder, BetaE folder, or pykeen dataset name (umls)")
    p.add_argument("--out", required=True, help="artifact folder to write")
    p.add_argument("--kg-format", choices=["tsv", "folder", "betae", "pykeen"], default=None, help="loader (default: detected)")
    p.add_argument("--drop-edges", type=float, default=0.0, help="fraction of training edges to hold out (LGOT: 0.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=None, help="complex embedding dimension (default: size preset)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--num-negatives", type=int, default=None, help="negatives per positive (sLCWA)")
    p.add_argument("--regularizer-weight", type=float, default=None, help="N3 weight")
    p.add_argument("--training-loop", choices=["slcwa", "lcwa"], default=None)
    p.add_argument("--loss", default=None, help="pykeen loss name (default crossentropy)")
    p.add_argument("--eval-max-triples", type=int, default=5000, help="held-out edges used for the MRR (0 = skip)")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    p.add_argument("--delta", type=float, default=DEFAULT_DELTA)
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per calibration chunk (default: ~16 MB buffers on CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[BuildConfig, bool]:
    parser = _parser()

    def fail(message: str) -> None:
        raise UserError(message)

    parser.error = fail  # type: ignore[method-assign]  # one-line UserError instead of usage + exit
    ns = parser.parse_args(argv)
    names = {f.name for f in fields(BuildConfig)}
    cfg = BuildConfig(**{k: v for k, v in vars(ns).items() if k in names})
    return cfg, not ns.quiet


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    config, progress = parse_args(argv)
    artifact = build_artifact(config, progress=progress)
    print(summarize(artifact))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
