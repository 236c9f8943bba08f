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

from kgreason.cli import ArgumentParser, check_device
from kgreason.errors import UserError, cli_main
from kgreason.files import check_output_file, write_output

from .artifact import add_checksum_argument, read_embeddings, read_meta

__all__ = ["LinkPredArgs", "parse_args", "link_prediction", "main"]

SPLITS = ("test", "valid", "missing")


@dataclass(frozen=True)
class LinkPredArgs:
    artifact: Path
    kg: str
    split: str
    limit: int | None
    json: Path | None
    device: str
    progress: bool
    verify: bool = True


def parse_args(argv: Sequence[str] | None = None) -> LinkPredArgs:
    p = ArgumentParser(prog="python -m kge.linkpred", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", required=True, type=Path, help="artifact folder (its embeddings.npz is ranked)")
    p.add_argument("--kg", required=True, help="the KG the artifact was built from (its splits and filter)")
    p.add_argument("--split", choices=SPLITS, default="test", help="edges to rank (missing = dropped + valid + test)")
    p.add_argument("--limit", type=int, default=None, help="rank a seeded sample of this many edges (default: all)")
    p.add_argument("--json", type=Path, default=None, help="also write the metrics as JSON here")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_checksum_argument(p)
    ns = p.parse_args(argv)
    if ns.limit is not None and ns.limit < 1:
        raise UserError(f"--limit must be >= 1, got {ns.limit}")
    check_device(ns.device, "--device")
    if ns.json is not None:
        check_output_file(ns.json, what="--json", inputs=[("--artifact", ns.artifact), ("--kg", ns.kg)])
    return LinkPredArgs(artifact=ns.artifact, kg=ns.kg, split=ns.split, limit=ns.limit, json=ns.json,
                        device=ns.device, progress=not ns.quiet, verify=not ns.skip_artifact_checksums)


def link_prediction(args: LinkPredArgs) -> dict:
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
