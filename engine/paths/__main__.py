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

import argparse
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from kgreason.cli import ArgumentParser as _Parser  # one-line UserError, user text escaped
from kgreason.errors import UserError, cli_main
from kgreason.text import json_line, printable

from .karpa import MODES

__all__ = ["PathsArgs", "parse_args", "run", "main"]


@dataclass(frozen=True)
class PathsArgs:
    """Parsed command line of ``python -m engine.paths``."""

    artifact: str
    topics: tuple[str, ...]
    plan: str
    mode: str = "pathfinding"
    k: int = 16
    json: bool = False
    max_hops: int | None = None
    beam_width: int = 16
    encoder: str = "minilm"
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    max_sequences: int = 20_000
    max_entity_paths: int = 3
    verify: bool = True  # False: --skip-artifact-checksums


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine.paths", description="KARPA relation-path retrieval.")
    p.add_argument("--artifact", required=True, help="artifact folder (python -m kge.build ...)")
    p.add_argument("--from", dest="topics", action="append", required=True,
                   help="topic entity name (or id); repeat for several topics")
    p.add_argument("--plan", required=True, help='planned relation path, e.g. "r1, r2" (names or free text)')
    p.add_argument("--mode", default="pathfinding", choices=MODES)
    p.add_argument("--k", type=int, default=16, help="relation paths per topic (default 16)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--max-hops", type=int, default=None,
                   help="heuristic mode: longest path enumerated (default: the plan's length)")
    p.add_argument("--beam-width", type=int, default=16, help="beam mode's width W (default 16)")
    p.add_argument("--encoder", default="minilm", help="encoder registry name (minilm, sentence-transformers, hashing)")
    p.add_argument("--encoder-kwargs", default="{}", help='encoder kwargs as JSON, e.g. \'{"model": "path"}\'')
    p.add_argument("--max-sequences", type=int, default=20_000, help="heuristic mode's enumeration cap per topic")
    p.add_argument("--max-entity-paths", type=int, default=3, help="entity-level paths shown per relation path")
    from kge.artifact import add_checksum_argument

    add_checksum_argument(p)
    return p


def parse_args(argv: Sequence[str] | None) -> PathsArgs:
    """Parse ``argv`` into :class:`PathsArgs` (usage errors are :class:`UserError`)."""
    ns = _parser().parse_args(argv)
    try:
        kwargs = json.loads(ns.encoder_kwargs)
    except json.JSONDecodeError as exc:
        raise UserError(f"--encoder-kwargs: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise UserError("--encoder-kwargs: JSON nested too deeply") from None
    if not isinstance(kwargs, dict):
        raise UserError("--encoder-kwargs must be a JSON object")
    return PathsArgs(
        artifact=ns.artifact,
        topics=tuple(ns.topics),
        plan=ns.plan,
        mode=ns.mode,
        k=ns.k,
        json=ns.json,
        max_hops=ns.max_hops,
        beam_width=ns.beam_width,
        encoder=ns.encoder,
        encoder_kwargs=kwargs,
        max_sequences=ns.max_sequences,
        max_entity_paths=ns.max_entity_paths,
        verify=not ns.skip_artifact_checksums,
    )


def run(args: PathsArgs):
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
