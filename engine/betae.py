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

from kgreason.cli import ArgumentParser as _Parser, Settings, add_settings_arguments, setting, settings_from_args
from kgreason.errors import cli_main
from kgreason.files import check_output_file, write_output

from engine.lang.structures import NEGATION_MODES

__all__ = ["BetaESettings", "parse_args", "main"]



@dataclass(frozen=True, kw_only=True)
class BetaESettings(Settings):
    """What ``python -m engine.betae`` was asked to do; each field's flag is declared with it."""

    queries: Path = setting(help="BetaE query pickle (e.g. test-queries.pkl)")
    folder: Path = setting(help="BetaE folder with train/valid/test.txt")
    negation: str = setting("qto", choices=NEGATION_MODES, help="how BetaE's negations become ASTs")
    json: Path | None = setting(None, help="write the summary as JSON here")
    progress: bool = setting(True, flag="--no-progress", negate=True, help="no progress bars")


def _parser() -> _Parser:
    p = _Parser(prog="python -m engine.betae", prefix_prog=True,
                description="Load a BetaE query pickle, recompute easy/hard answers, print counts and timings.")
    add_settings_arguments(p, BetaESettings)
    return p


def parse_args(argv: Sequence[str] | None) -> BetaESettings:
    a = _parser().parse_args(argv)
    if a.json is not None:
        check_output_file(a.json, what="--json", inputs=[("--queries", a.queries), ("--folder", a.folder)])
    return settings_from_args(BetaESettings, a)


def run(args: BetaESettings) -> int:
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
