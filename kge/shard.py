"""``python -m kge.shard``: write an artifact (eager or lazy) as P column shards for a sharded run (see :mod:`kge.sharding`).

::

    python -m kge.shard --artifact artifacts/FB15k-237 --shards 2 --out artifacts/FB15k-237.shards2
    torchrun --nproc-per-node 2 -m engine.answer --artifact artifacts/FB15k-237.shards2 --query 2p
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kgreason.cli import (ArgumentParser, QuietSettings, Settings, add_settings_arguments, setting, settings_from_args,
                          verify_setting)
from kgreason.errors import cli_main

__all__ = ["ShardSettings", "parse_args", "run", "main"]


@dataclass(frozen=True, kw_only=True)
class ShardSettings(Settings):
    """What ``kge.shard`` was asked to do; each field's flag is declared with it (see ``--help``)."""

    artifact: str = setting(metavar="DIR", help="the artifact folder to shard, eager or lazy (left as it is)")
    shards: int = setting(low=1, integer=True, metavar="P", help="number of shards = ranks of the sharded run")
    out: str = setting(metavar="DIR", help="the new shard folder (missing parent folders are created)")
    overwrite: bool = setting(False, help="replace a shard folder already there")
    verify: bool = verify_setting()


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m kge.shard",
                       description="Split an artifact (eager or lazy) into P column shards for a sharded run "
                                   "(torchrun --nproc-per-node P -m engine.answer --artifact OUT ...).")
    add_settings_arguments(p, ShardSettings)
    add_settings_arguments(p, QuietSettings)
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[ShardSettings, bool]:
    ns = _parser().parse_args(argv)
    return settings_from_args(ShardSettings, ns), settings_from_args(QuietSettings, ns).progress


def run(cfg: ShardSettings, progress: bool = True) -> int:
    from kge.artifact import Artifact
    from kge.sharding import write_shards

    art = Artifact.load(cfg.artifact, verify=cfg.verify, load_embeddings=False)
    out = write_shards(art, cfg.shards, cfg.out, overwrite=cfg.overwrite, progress=progress)
    if progress:
        print(f"wrote {cfg.shards} shards to {out}")
    return 0


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg, progress = parse_args(argv)
    return run(cfg, progress)


if __name__ == "__main__":
    raise SystemExit(main())
