"""CLI: ``python -m engine.betae --queries PKL --folder DIR [--json OUT]``.

Loads a BetaE query pickle through the restricted unpickler, recomputes easy/hard
answers from the folder's triples and prints per-structure counts and timings.
The library functions live in :mod:`engine.eval.betae`.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import ArgumentParser as _Parser  # one-line UserError, user text escaped
from kgreason.errors import cli_main
from kgreason.files import check_output_file, write_output

__all__ = ["BetaEArgs", "parse_args", "main"]


@dataclass(frozen=True)
class BetaEArgs:
    queries: Path
    folder: Path
    negation: str = "qto"
    json: Path | None = None
    progress: bool = True


def parse_args(argv: Sequence[str] | None) -> BetaEArgs:
    from engine.lang.structures import NEGATION_MODES

    p = _Parser(prog="python -m engine.betae", prefix_prog=True,
                description="Load a BetaE query pickle, recompute easy/hard answers, print counts and timings.")
    p.add_argument("--queries", required=True, type=Path, help="BetaE query pickle (e.g. test-queries.pkl)")
    p.add_argument("--folder", required=True, type=Path, help="BetaE folder with train/valid/test.txt")
    p.add_argument("--negation", choices=NEGATION_MODES, default="qto")
    p.add_argument("--json", type=Path, help="write the summary as JSON here")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.json is not None:
        check_output_file(a.json, what="--json", inputs=[("--queries", a.queries), ("--folder", a.folder)])
    return BetaEArgs(queries=a.queries, folder=a.folder, negation=a.negation, json=a.json,
                     progress=not a.no_progress)


def run(args: BetaEArgs) -> int:
    from engine.eval.betae import load_betae_queries, read_betae_folder, summarize

    t0 = time.perf_counter()
    folder = read_betae_folder(args.folder)
    timings: dict = {"read_folder_s": time.perf_counter() - t0}
    qs = load_betae_queries(args.queries, folder, negation=args.negation, progress=args.progress, timings=timings)
    timings["total_s"] = time.perf_counter() - t0
    rows = summarize(qs)
    print("| structure | queries | mean easy | mean hard | max hard | without hard |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['structure']} | {r['queries']} | {r['mean_easy']:.1f} | {r['mean_hard']:.1f} | "
              f"{r['max_hard']} | {r['without_hard']} |")
    print(f"{len(qs)} queries; entities {folder.num_entities}, relations {folder.num_relations}; "
          + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
    if args.json is not None:
        write_output(args.json, json.dumps({"queries": str(args.queries), "folder": str(args.folder),
                                            "num_entities": folder.num_entities, "num_relations": folder.num_relations,
                                            "structures": rows, "timings_s": timings}, indent=2) + "\n", what="--json")
    return 0


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
