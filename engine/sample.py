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

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import ArgumentParser as _Parser, check_seed  # _Parser: one-line UserError, user text escaped
from kgreason.errors import Terminated, UserError, cli_main, unknown_name
from kgreason.files import check_output_file, interrupts_deferred, open_output

__all__ = ["SampleArgs", "parse_args", "main"]


@dataclass(frozen=True)
class SampleArgs:
    artifact: Path
    structures: tuple[str, ...]
    per_structure: int
    seed: int
    out: Path
    max_answers: int
    require_hard: bool
    negation: str
    progress: bool
    verify: bool = True  # False: --skip-artifact-checksums


def parse_args(argv: Sequence[str] | None = None) -> SampleArgs:
    from engine.lang.structures import NEGATION_MODES, STRUCTURES
    from kge.artifact import add_checksum_argument

    p = _Parser(prog="python -m engine.sample", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", required=True, type=Path, help="artifact folder (observed + missing triples)")
    p.add_argument("--structures", nargs="+", default=list(STRUCTURES), metavar="NAME",
                   help=f"structures to sample (default: all 14: {' '.join(STRUCTURES)})")
    p.add_argument("--per-structure", type=int, default=1000,
                   help="queries per structure (default 1000); a structure with fewer distinct queries stops "
                        "once exhausted, with what it has")
    p.add_argument("--seed", type=int, default=0, help="random seed, 0 to 2**32-1 (default 0)")
    p.add_argument("--out", required=True, type=Path, help="output JSON Lines file")
    p.add_argument("--max-answers", type=int, default=100, help="reject queries with more answers (default 100)")
    p.add_argument("--require-hard", action=argparse.BooleanOptionalAction, default=True,
                   help="require at least one hard answer (default: yes)")
    p.add_argument("--negation", choices=NEGATION_MODES, default="qto",
                   help="negation written as QTO's negated projection (np) or a complement (n) (default qto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_checksum_argument(p)
    a = p.parse_args(argv)
    for s in a.structures:
        if s not in STRUCTURES:
            raise unknown_name("query structure", s, list(STRUCTURES), "--structures")
    check_seed(a.seed)
    if a.per_structure < 1:
        raise UserError(f"--per-structure must be >= 1, got {a.per_structure}")
    if a.max_answers < 1:
        raise UserError(f"--max-answers must be >= 1, got {a.max_answers}")
    check_output_file(a.out, what="--out", inputs=[("--artifact", a.artifact)])
    return SampleArgs(a.artifact, tuple(dict.fromkeys(a.structures)), a.per_structure, a.seed, a.out,
                      a.max_answers, a.require_hard, a.negation, not a.no_progress, not a.skip_artifact_checksums)


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
    sampler = QuerySampler(artifact.observed, artifact.missing, artifact.num_entities, artifact.num_relations,
                           max_answers=args.max_answers, require_hard=args.require_hard, negation=args.negation)
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
