"""CLI: filtered link-prediction metrics of an artifact's embeddings with pykeen's evaluator.

    python -m kge.linkpred --artifact artifacts/FB15k-237 --kg ../shared/data/betae/FB15k-237-betae --split test

The edges of ``--split`` (both directions: relation ``2k+1`` is the inverse of
``2k``) are ranked against all entities with pykeen's ``RankBasedEvaluator``,
filtering every edge the KG knows (train, valid, test); ``mrr`` and ``hits@k``
are the tail side over both directions (the reciprocal protocol of Lacroix et
al. 2018), ``mrr_both`` adds pykeen's head-side predictions.

The embeddings are loaded verified (:func:`kge.artifact.read_embeddings`:
checksums unless ``--skip-artifact-checksums``, finite values, shapes), and must
fit ``--kg``; every error names only this command's flags.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from kgreason.cli import (ArgumentParser, Settings, add_settings_arguments, check_device, setting, settings_from_args,
                          verify_setting)
from kgreason.errors import UserError, cli_main
from kgreason.files import check_output_file, write_output

from .artifact import read_embeddings, read_meta

__all__ = ["LinkPredSettings", "parse_args", "link_prediction", "main"]

SPLITS = ("test", "valid", "missing")


@dataclass(frozen=True, kw_only=True)
class LinkPredSettings(Settings):
    """What ``python -m kge.linkpred`` was asked to do; each field's flag is declared with it."""

    artifact: Path = setting(help="artifact folder (its embeddings.npz is ranked)")
    kg: str = setting(help="the KG the artifact was built from (its splits and filter)")
    split: str = setting("test", choices=SPLITS, help="edges to rank (missing = dropped + valid + test)")
    limit: int | None = setting(None, low=1, integer=True, shown_default="all",
                                help="rank a seeded sample of this many edges")
    json: Path | None = setting(None, help="also write the metrics as JSON here")
    device: str = setting("cpu", check=check_device, help="cpu, cuda or cuda:N")
    progress: bool = setting(True, flag="--quiet", negate=True, help="no progress bar")
    verify: bool = verify_setting()


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m kge.linkpred", description=__doc__.split("\n\n")[0])
    add_settings_arguments(p, LinkPredSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> LinkPredSettings:
    settings = settings_from_args(LinkPredSettings, _parser().parse_args(argv))
    if settings.json is not None:
        check_output_file(settings.json, what="--json", inputs=[("--artifact", settings.artifact), ("--kg", settings.kg)])
    return settings


def link_prediction(args: LinkPredSettings) -> dict:
    """Metrics dict (see :func:`kge.train.pykeen_link_metrics`) of ``args.artifact`` on ``args.split``."""
    from .graph import load_kg
    from .train import pykeen_link_metrics

    # Every listed file is verified, as every tool does, although only the embeddings are read.
    meta = read_meta(args.artifact, verify=args.verify, required=("embeddings.npz",))
    emb = read_embeddings(args.artifact, verify=False, meta=meta)
    kg = load_kg(args.kg)
    n, r = emb["entity"].shape[0], emb["relation"].shape[0]
    if (n, r) != (kg.num_entities, kg.num_relations):
        built = meta.get("build_config", {}).get("kg") if isinstance(meta.get("build_config"), dict) else None
        hint = f" (it was built from --kg {built})" if isinstance(built, str) else ""
        raise UserError(f"--artifact {args.artifact}: its embeddings cover {n:,} entities and {r:,} relations, "
                        f"--kg {args.kg} has {kg.num_entities:,} and {kg.num_relations:,}; give the KG the "
                        f"artifact was built from{hint}")
    entity = emb["entity"].astype(np.complex64, copy=False)
    relation = emb["relation"].astype(np.complex64, copy=False)
    edges = {"test": kg.test, "valid": kg.valid, "missing": kg.missing}[args.split]
    if len(edges) == 0:
        raise UserError(f"--split {args.split}: {args.kg} has no such edges")
    if args.limit is not None and args.limit < len(edges):
        edges = edges[np.sort(np.random.default_rng(0).choice(len(edges), args.limit, replace=False))]
    known = np.concatenate([kg.train, kg.missing])
    t = time.perf_counter()
    out = pykeen_link_metrics(entity, relation, edges, known, device=args.device,
                              progress=args.progress)
    out.update(split=args.split, seconds=round(time.perf_counter() - t, 2), artifact=str(args.artifact))
    return out


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    m = link_prediction(args)
    print(f"{args.artifact} on {m['eval_triples']:,} {args.split} edges: MRR {m['mrr']:.4f}, "
          f"hits@1 {m['hits_at_1']:.4f}, hits@3 {m['hits_at_3']:.4f}, hits@10 {m['hits_at_10']:.4f} "
          f"(both sides: MRR {m['mrr_both']:.4f}); {m['seconds']:.0f} s")
    if args.json is not None:
        write_output(args.json, json.dumps(m, indent=2) + "\n", what="--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
