"""CLI: sample BetaE-style queries with easy/hard answers from an artifact.

    python -m engine.sample --artifact artifacts/FB15k-237 --structures 1p 2p 2in \\
        --per-structure 1000 --seed 0 --out queries.jsonl

Writes JSON Lines ``{"structure": "2in", "expr": "(i (p r1 e1) (np r2 e2))", "easy": [ids], "hard": [ids]}``
(names in ``expr``; easy = answers on the observed graph, hard = the extra answers once
the artifact's missing triples are added) and prints the rejection counts.

Queries are written as they are accepted (into a temporary sibling of ``--out``,
renamed into place at the end, or on Ctrl-C with what was written so far).  A
structure with fewer distinct queries than asked stops early with what it has
and a note "K of N queries (exhausted: ...)".
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import (SEED_MAX, ArgumentParser as _Parser, Settings, add_settings_arguments, setting, settings_from_args,
                          verify_setting)
from kgreason.errors import Terminated, UserError, cli_main, unknown_name
from kgreason.files import check_output_file, interrupts_deferred, open_output

from engine.lang.structures import NEGATION_MODES, STRUCTURES

__all__ = ["SampleSettings", "parse_args", "main"]


@dataclass(frozen=True, kw_only=True)
class SampleSettings(Settings):
    """What ``python -m engine.sample`` was asked to do; each field's flag is declared with it."""

    artifact: Path = setting(help="artifact folder (observed + missing triples)")
    structures: tuple[str, ...] = setting(tuple(STRUCTURES), metavar="NAME", shown_default="all 14",
                                          help=f"structures to sample ({' '.join(STRUCTURES)})")
    per_structure: int = setting(1000, low=1, integer=True,
                                 help="queries per structure; a structure with fewer distinct queries stops once "
                                      "exhausted, with what it has")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="random seed, 0 to 2**32-1")
    out: Path = setting(help="output JSON Lines file")
    max_answers: int = setting(100, low=1, integer=True, help="reject queries with more answers")
    require_hard: bool = setting(True, boolean_optional=True, help="require at least one hard answer (default: yes)")
    negation: str = setting("qto", choices=NEGATION_MODES,
                            help="negation written as QTO's negated projection (np) or a complement (n)")
    progress: bool = setting(True, flag="--no-progress", negate=True, help="no progress bars")
    verify: bool = verify_setting()

    def __post_init__(self) -> None:
        for s in self.structures:
            if s not in STRUCTURES:
                raise unknown_name("query structure", s, list(STRUCTURES), "--structures")
        super().__post_init__()
        object.__setattr__(self, "structures", tuple(dict.fromkeys(self.structures)))


def _parser() -> _Parser:
    p = _Parser(prog="python -m engine.sample", description=__doc__.split("\n\n")[0])
    add_settings_arguments(p, SampleSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> SampleSettings:
    settings = settings_from_args(SampleSettings, _parser().parse_args(argv))
    check_output_file(settings.out, what="--out", inputs=[("--artifact", settings.artifact)])
    return settings


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from kge.artifact import Artifact

    from engine.eval.sampling import QuerySampler, query_record

    args = parse_args(argv)
    artifact = Artifact.load(args.artifact, verify=args.verify, load_embeddings=False)
    if len(artifact.missing) == 0 and args.require_hard:
        raise UserError(f"artifact {args.artifact} has no missing triples, so no query has a hard answer "
                        "(use --no-require-hard)")
    t0 = time.perf_counter()
    if args.progress:  # indexing a 10M-edge KG takes a minute: say what runs before the first bar
        print(f"sample: indexing {len(artifact.observed):,} observed + {len(artifact.missing):,} missing triples "
              f"({artifact.num_entities:,} entities, {artifact.num_relations:,} relations)", file=sys.stderr, flush=True)
    sampler = QuerySampler(artifact.observed, artifact.missing, artifact.num_entities, artifact.num_relations,
                           max_answers=args.max_answers, require_hard=args.require_hard, negation=args.negation)
    if args.progress:
        print(f"sample: indexed in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    n = 0
    try:
        with open_output(args.out, what="--out", keep_partial=True) as f:
            for q in sampler.iter_many(args.structures, args.per_structure, seed=args.seed, progress=args.progress):
                line = query_record(q, artifact)
                with interrupts_deferred():  # a Ctrl-C lands before or after a whole line and its count
                    f.write(line)
                    f.flush()  # a killed run leaves whole lines in the temporary file
                    n += 1
    except (KeyboardInterrupt, Terminated):
        print(f"interrupted: kept the {n:,} queries written so far in {args.out}", file=sys.stderr)
        raise
    stats = sampler.stats
    print(stats.table(), file=sys.stderr)
    for note in stats.notes():
        print(note, file=sys.stderr)
    asked = args.per_structure * len(args.structures)
    short = f" of {asked:,} asked" if n < asked else ""
    print(f"wrote {n:,} queries{short} to {args.out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
