"""CLI: evaluate an artifact on complex queries with the BetaE protocol (filtered MRR, Hits@1/3/10).

    python -m engine.evaluate --artifact artifacts/FB15k-237 --queries queries.jsonl --json results.json
    python -m engine.evaluate --artifact artifacts/NELL --betae-queries ../shared/data/betae/NELL-betae/test-queries.pkl \\
        --betae-folder ../shared/data/betae/NELL-betae

Prints a per-structure table (percent, 1 decimal) and optionally writes JSON.

Sharded (docs/distributed.md): ``torchrun --nproc-per-node P -m engine.evaluate --artifact SHARDS ...``;
each rank scores its column block, the ranks come from one all-reduce of counts, and rank 0 prints
and writes the same metrics as one process.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import ArgumentParser as _Parser, Settings, add_settings_arguments, setting, settings_from_args, verify_setting
from kgreason.errors import UserError, cli_main, unknown_name
from kgreason.files import check_output_file, write_output

from engine.cli_fields import (device_setting, frontier_k_setting, neg_scale_setting, row_cache_gb_setting,
                               row_store_gb_setting, tnorm_setting)
from engine.lang.structures import NEGATION_MODES

__all__ = ["EvaluateSettings", "parse_args", "main"]


def _ties() -> tuple[str, ...]:
    from engine.eval.metrics import TIES  # loads torch

    return tuple(TIES)


@dataclass(frozen=True, kw_only=True)
class EvaluateSettings(Settings):
    """What ``python -m engine.evaluate`` was asked to do; each field's flag is declared with it."""

    artifact: Path = setting(help="artifact folder")
    queries: Path | None = setting(None, help="JSON Lines file written by `python -m engine.sample`")
    betae_queries: Path | None = setting(None, help="BetaE query pickle (e.g. test-queries.pkl)")
    betae_folder: Path | None = setting(None, help="BetaE folder whose triples define easy/hard answers")
    structures: tuple[str, ...] | None = setting(None, metavar="NAME", help="evaluate only these structures")
    negation: str | None = setting(None, choices=NEGATION_MODES,
                                   help="write negations as QTO's negated projection (qto) or a complement "
                                        "(complement); default: as in the JSONL file, qto for BetaE pickles")
    tnorm: str = tnorm_setting("t-norm")
    neg_scale: float = neg_scale_setting()
    batch_size: int = setting(1024, low=1, integer=True, help="queries per batch")
    limit: int | None = setting(None, low=1, integer=True,
                                help="evaluate at most N queries per structure (the first N)")
    ties: str = setting("average", choices=_ties,
                        help="tie rule of the printed table (all three go to the JSON)")
    json: Path | None = setting(None, help="write the results as JSON here")
    device: str = device_setting()
    progress: bool = setting(True, flag="--no-progress", negate=True, help="no progress bars")
    frontier_k: int | None = frontier_k_setting()
    row_cache_gb: float | None = row_cache_gb_setting()
    row_store_gb: float | None = row_store_gb_setting()
    verify: bool = verify_setting()
    # -- sharded runs: torchrun --nproc-per-node P -m engine.evaluate ... (engine.exec.sharded, docs/distributed.md)
    dist_timeout: float | None = setting(None, low=0, low_open=True, high=1e7, metavar="S", shown_default="120",
                                         help="under torchrun: seconds a rank waits for the others in an exchange "
                                              "before it stops with an error (joining waits at least 60 s)")

    def __post_init__(self) -> None:
        if (self.queries is None) == (self.betae_queries is None):
            raise UserError("give exactly one of --queries FILE.jsonl or --betae-queries PKL (with --betae-folder DIR)")
        if self.betae_queries is not None and self.betae_folder is None:
            raise UserError("--betae-queries needs --betae-folder DIR (the triples that define easy/hard answers)")
        if self.betae_folder is not None and self.betae_queries is None:
            raise UserError("--betae-folder is only used with --betae-queries")
        super().__post_init__()
        if self.structures:
            object.__setattr__(self, "structures", tuple(dict.fromkeys(self.structures)))


def _parser() -> _Parser:
    p = _Parser(prog="python -m engine.evaluate", description=__doc__.split("\n\n")[0])
    add_settings_arguments(p, EvaluateSettings)
    return p


def parse_args(argv: Sequence[str] | None = None) -> EvaluateSettings:
    a = _parser().parse_args(argv)
    settings = settings_from_args(EvaluateSettings, a)
    if a.json is not None:
        check_output_file(a.json, what="--json", inputs=[("--artifact", a.artifact), ("--queries", a.queries),
                                                         ("--betae-queries", a.betae_queries),
                                                         ("--betae-folder", a.betae_folder)])
    return settings


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from kge.artifact import Artifact

    from engine.eval.metrics import evaluate_queries, format_table, load_jsonl_queries, results_to_json
    from engine.exec.executor import Executor
    from engine.lang.structures import BETAE_NAMES, STRUCTURES, convert_negation

    args = parse_args(argv)
    known = list(STRUCTURES) + sorted(set(BETAE_NAMES.values()) - set(STRUCTURES))
    for s in args.structures or ():
        if s not in known:
            raise unknown_name("query structure", s, known, "--structures")
    t0 = time.perf_counter()
    from engine.exec.sharded_load import torchrun_group

    group = torchrun_group(args.device, args.dist_timeout)  # None unless torchrun started several ranks
    executor = None
    if group is not None:
        import torch.distributed as dist

        from engine.exec.api import Engine

        from engine.exec.sharded_load import sharded_row_options

        engine = Engine.load(args.artifact, verify=args.verify, process_group=group, tnorm=args.tnorm,
                             neg_scale=args.neg_scale, device=args.device, frontier_k=args.frontier_k,
                             **sharded_row_options(args.row_cache_gb, args.row_store_gb))
        artifact, executor = engine.artifact, engine.executor
        lead = dist.get_rank(group) == 0  # the ranks compute the same metrics: one prints and writes them
    else:
        artifact = Artifact.load(args.artifact, verify=args.verify, load_embeddings=False,
                                 row_cache_gb=args.row_cache_gb, row_store_gb=args.row_store_gb)
        lead = True
    info: dict = {}
    if args.queries is not None:
        queries = load_jsonl_queries(args.queries, artifact, structures=args.structures)
        source = str(args.queries)
    else:
        from engine.eval.betae import check_betae_ids, load_betae_queries, read_betae_folder

        folder = read_betae_folder(args.betae_folder)
        info["observed_triples_in_folder"] = check_betae_ids(artifact, folder)
        timings: dict = {}
        queries = load_betae_queries(
            args.betae_queries, folder, structures=args.structures, negation=args.negation or "qto",
            progress=args.progress and lead, timings=timings,
        )
        info["betae_timings_s"] = timings
        source = str(args.betae_queries)
    if args.negation is not None:
        from engine.eval.metrics import EvalQuery

        queries = [EvalQuery(q.structure, convert_negation(q.node, args.negation), q.easy, q.hard) for q in queries]
    if args.limit is not None:
        kept, per = [], {}
        for q in queries:
            if per.get(q.structure, 0) < args.limit:
                per[q.structure] = per.get(q.structure, 0) + 1
                kept.append(q)
        queries = kept
    if not queries:
        raise UserError(f"{source}: no queries to evaluate")
    no_hard = sum(1 for q in queries if len(q.hard) == 0)
    if no_hard and lead:
        print(f"note: {no_hard} of {len(queries)} queries have no hard answer and are not ranked", file=sys.stderr)
    t1 = time.perf_counter()
    if executor is None:
        executor = Executor(artifact, tnorm=args.tnorm, neg_scale=args.neg_scale, device=args.device,
                            frontier_k=args.frontier_k)
    results = evaluate_queries(executor, queries, batch_size=args.batch_size, progress=args.progress and lead)
    t2 = time.perf_counter()
    if not results:
        raise UserError(f"{source}: no query has a hard answer: nothing to rank")
    if not lead:
        return 0
    print(format_table(results, ties=args.ties))
    print(f"({sum(r.num_queries for r in results)} queries, ties={args.ties}, tnorm={args.tnorm}, "
          f"negation={args.negation or 'as written'}"
          + (f", frontier_k={args.frontier_k}" if args.frontier_k is not None else "")
          + (", lazy rows" if artifact.is_lazy else "")
          + (f", {executor.comm.size} ranks" if group is not None else "") + f"; load {t1 - t0:.1f} s, evaluate {t2 - t1:.1f} s)")
    if args.json is not None:
        record = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
            "command": "python -m engine.evaluate " + " ".join(sys.argv[1:] if argv is None else argv),
            "ties_headline": args.ties,
            "results": results_to_json(results),
            "load_s": t1 - t0,
            "evaluate_s": t2 - t1,
            **({"lazy_rows": artifact.matrices.stats.as_dict()} if artifact.is_lazy else {}),
            **info,
        }
        write_output(args.json, json.dumps(record, indent=2) + "\n", what="--json")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
