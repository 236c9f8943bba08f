"""CLI: KARPA relation-path retrieval over an artifact.

Example::

    python -m engine.paths --artifact artifacts/FB15k-237 --from "Tom Hanks" \\
        --plan "actor/film./film/performance/film, director/film^-1" --mode pathfinding --k 16

Plan phrases are separated by ``,`` ``;`` ``->`` ``→`` or ``=>``.  Each phrase is
a full relation name, or the trailing ``/``-segments of exactly one relation
name (``director/film^-1``), or free text if it contains a space.

The artifact is only read: relation embeddings are cached in the user cache
folder (:func:`engine.paths.embeddings.relation_embeddings_cache_path`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from kgreason.cli import ArgumentParser as _Parser, Settings, add_settings_arguments, setting, settings_from_args, verify_setting
from kgreason.errors import cli_main
from kgreason.files import json_object
from kgreason.text import json_line, printable

from .karpa import MODES

__all__ = ["PathsSettings", "parse_args", "run", "main"]


@dataclass(frozen=True, kw_only=True)
class PathsSettings(Settings):
    """What ``python -m engine.paths`` was asked to do; each field's flag is declared with it.

    ``encoder_kwargs`` may be given as the flag's JSON text (an object); it is parsed on construction."""

    artifact: str = setting(help="artifact folder (python -m kge.build ...)")
    topics: tuple[str, ...] = setting(flag="--from", repeat=True, help="topic entity name (or id); repeat for several topics")
    plan: str = setting(help='planned relation path, e.g. "r1, r2" (names or free text)')
    mode: str = setting("pathfinding", choices=MODES, help="KARPA-P, KARPA-H or KARPA-B")
    k: int = setting(16, low=1, integer=True, help="relation paths per topic")
    json: bool = setting(False, help="print JSON instead of text")
    max_hops: int | None = setting(None, low=1, integer=True, shown_default="the plan's length",
                                   help="heuristic mode: longest path enumerated")
    beam_width: int = setting(16, low=1, integer=True, metavar="W", help="beam mode's width W")
    encoder: str = setting("minilm", help="encoder registry name (minilm, sentence-transformers, hashing)")
    encoder_kwargs: dict[str, Any] = setting(default_factory=dict, type=str, shown_default="{}",
                                             help='encoder kwargs as JSON, e.g. \'{"model": "path"}\'')
    max_sequences: int = setting(20_000, low=1, integer=True, help="heuristic mode's enumeration cap per topic")
    max_entity_paths: int = setting(3, low=0, integer=True, help="entity-level paths shown per relation path")
    verify: bool = verify_setting()

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.encoder_kwargs, str):
            object.__setattr__(self, "encoder_kwargs", json_object(self.encoder_kwargs, "--encoder-kwargs"))


def _parser() -> _Parser:
    p = _Parser(prog="python -m engine.paths", description="KARPA relation-path retrieval.")
    add_settings_arguments(p, PathsSettings)
    return p


def parse_args(argv: Sequence[str] | None) -> PathsSettings:
    """Parse ``argv`` into :class:`PathsSettings` (usage errors are :class:`UserError`)."""
    return settings_from_args(PathsSettings, _parser().parse_args(argv))


def run(args: PathsSettings):
    """Load the artifact and retrieve; returns ``(retriever, [RetrievalResult, ...])``."""
    from kge.artifact import Artifact

    from .karpa import PathRetriever

    artifact = Artifact.load(args.artifact, verify=args.verify)
    retriever = PathRetriever.from_artifact(
        artifact,
        encoder=args.encoder,
        encoder_kwargs=args.encoder_kwargs,
        max_sequences=args.max_sequences,
        max_entity_paths=args.max_entity_paths,
    )
    results = retriever.retrieve(
        list(args.topics), args.plan, mode=args.mode, k=args.k, max_hops=args.max_hops, beam_width=args.beam_width
    )
    return retriever, results


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    retriever, results = run(args)
    if args.json:
        # KG names, escaped where printed (kgreason.text): no raw control, bidi or separator character
        print(json_line([r.to_dict(retriever.graph) for r in results], indent=2))
    else:
        print("\n\n".join("\n".join(printable(line) for line in r.format(retriever.graph).split("\n"))
                           for r in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
