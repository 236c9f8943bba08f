"""``python -m kge.build``: build an artifact folder (load a KG, drop edges, train ComplEx, calibrate, save).

Command line::

    python -m kge.build --kg umls --out artifacts/umls
    python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237
    python -m kge.build --kg umls --out /tmp/umls-lgot --drop-edges 0.5 --seed 0 --rank 64 --epochs 50
    python -m kge.build --kg umls --out artifacts/umls --overwrite      # replace an earlier artifact

The flags are those of :class:`~kge.build_config.BuildConfig` and
:class:`~kge.build_config.BuildTrainSettings` (declared with their fields), and ``--quiet``.  The build itself
is library code in :mod:`kge.builder`; its names are re-exported here, where users have imported them from::

    from kge.build import BuildConfig, build_artifact      # = kge.builder's
"""
from __future__ import annotations

from typing import Sequence

from kgreason.cli import ArgumentParser, QuietSettings, add_settings_arguments, settings_from_args, settings_values
from kgreason.errors import cli_main

from .build_config import BuildTrainSettings
from .builder import *  # noqa: F403  (the library names, for `from kge.build import build_artifact`)
from .builder import __all__ as _library_names
from .builder import BuildConfig, build_artifact, summarize

__all__ = [*_library_names, "parse_args", "main"]


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m kge.build", description="Build a calibrated-matrix artifact from a knowledge graph.")
    add_settings_arguments(p, BuildConfig)
    add_settings_arguments(p, BuildTrainSettings)
    add_settings_arguments(p, QuietSettings)
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[BuildConfig, bool]:
    """The build's :class:`BuildConfig` and whether to show progress (not ``--quiet``)."""
    ns = _parser().parse_args(argv)  # mistakes: one-line UserError (kgreason.cli.ArgumentParser)
    cfg = settings_from_args(BuildConfig, ns, train=settings_values(BuildTrainSettings, ns))
    return cfg, settings_from_args(QuietSettings, ns).progress


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    config, progress = parse_args(argv)
    artifact = build_artifact(config, progress=progress)
    if progress:
        print(summarize(artifact))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
