"""``python -m kge.shard``: write an eager artifact as P column shards for a sharded run (see :mod:`kge.sharding`).

::

    python -m kge.shard --artifact artifacts/FB15k-237 --shards 2 --out artifacts/FB15k-237.shards2
    torchrun --nproc-per-node 2 -m engine.answer --artifact artifacts/FB15k-237.shards2 --query 2p
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

from kgreason.cli import ArgumentParser
from kgreason.errors import UserError, cli_main

__all__ = ["ShardConfig", "parse_args", "run", "main"]


# ------------------------------------------------------------------------------------ the CLI
@dataclass(frozen=True)
class ShardConfig:
    """What ``kge.shard`` was asked to do (see ``--help``)."""

    artifact: str
    shards: int
    out: str
    overwrite: bool = False
    verify: bool = True
    quiet: bool = False


def _parser() -> argparse.ArgumentParser:
    from kge.artifact import add_checksum_argument

    p = ArgumentParser(prog="python -m kge.shard",
                       description="Split an eager artifact into P column shards for a sharded run "
                                   "(torchrun --nproc-per-node P -m engine.answer --artifact OUT ...).")
    p.add_argument("--artifact", required=True, metavar="DIR", help="the eager artifact folder to shard")
    p.add_argument("--shards", required=True, type=int, metavar="P", help="number of shards = ranks of the run")
    p.add_argument("--out", required=True, metavar="DIR", help="the new shard folder")
    p.add_argument("--overwrite", action="store_true", help="replace a shard folder already there")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_checksum_argument(p)
    return p


def parse_args(argv: Sequence[str] | None) -> ShardConfig:
    ns = _parser().parse_args(argv)
    if ns.shards < 1:
        raise UserError(f"--shards must be >= 1, got {ns.shards}")
    return ShardConfig(artifact=ns.artifact, shards=ns.shards, out=ns.out, overwrite=ns.overwrite,
                       verify=not ns.skip_artifact_checksums, quiet=ns.quiet)


def run(cfg: ShardConfig) -> int:
    from kge.artifact import Artifact

    from kge.sharding import write_shards

    art = Artifact.load(cfg.artifact, verify=cfg.verify, load_embeddings=False)
    out = write_shards(art, cfg.shards, cfg.out, overwrite=cfg.overwrite, progress=not cfg.quiet)
    if not cfg.quiet:
        print(f"wrote {cfg.shards} shards to {out}")
    return 0


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
