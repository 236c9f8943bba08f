"""CLI: evaluate an artifact on complex queries with the BetaE protocol (filtered MRR, Hits@1/3/10).

    python -m engine.evaluate --artifact artifacts/FB15k-237 --queries queries.jsonl --json results.json
    python -m engine.evaluate --artifact artifacts/NELL --betae-queries ../shared/data/betae/NELL-betae/test-queries.pkl \\
        --betae-folder ../shared/data/betae/NELL-betae

Prints a per-structure table (percent, 1 decimal) and optionally writes JSON.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import ArgumentParser as _Parser, check_device  # _Parser: one-line UserError, user text escaped
from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError, cli_main, unknown_name
from kgreason.files import check_output_file, write_output

__all__ = ["EvaluateArgs", "parse_args", "main"]


@dataclass(frozen=True)
class EvaluateArgs:
    artifact: Path
    queries: Path | None
    betae_queries: Path | None
    betae_folder: Path | None
    structures: tuple[str, ...] | None
    negation: str | None
    tnorm: str
    neg_scale: float
    batch_size: int
    limit: int | None
    ties: str
    json: Path | None
    device: str
    progress: bool
    frontier_k: int | None = None
    row_cache_gb: float | None = None
    row_store_gb: float | None = None
    verify: bool = True  # False: --skip-artifact-checksums


def parse_args(argv: Sequence[str] | None = None) -> EvaluateArgs:
    from engine.eval.metrics import TIES
    from engine.exec.executor import TNORMS
    from engine.lang.structures import NEGATION_MODES
    from kge.artifact import add_checksum_argument

    p = _Parser(prog="python -m engine.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", required=True, type=Path, help="artifact folder")
    p.add_argument("--queries", type=Path, help="JSON Lines file written by `python -m engine.sample`")
    p.add_argument("--betae-queries", type=Path, help="BetaE query pickle (e.g. test-queries.pkl)")
    p.add_argument("--betae-folder", type=Path, help="BetaE folder whose triples define easy/hard answers")
    p.add_argument("--structures", nargs="+", metavar="NAME", help="evaluate only these structures")
    p.add_argument("--negation", choices=NEGATION_MODES,
                   help="write negations as QTO's negated projection (qto) or a complement (complement); "
                        "default: as in the JSONL file, qto for BetaE pickles")
    p.add_argument("--tnorm", choices=TNORMS, default="product", help="t-norm (default product)")
    p.add_argument("--neg-scale", type=float, default=QTO_NEG_SCALE,
                   help=f"QTO negation scale s (default {QTO_NEG_SCALE})")
    p.add_argument("--batch-size", type=int, default=1024, help="queries per batch (default 1024)")
    p.add_argument("--limit", type=int, help="evaluate at most N queries per structure (the first N)")
    p.add_argument("--ties", choices=TIES, default="average",
                   help="tie rule of the printed table (all three go to the JSON; default average)")
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--frontier-k", type=int, default=None, metavar="K",
                   help="keep the K best entities of every projection's input (as CQD-beam; default: all, exact)")
    p.add_argument("--row-cache-gb", type=float, default=None, metavar="G",
                   help="lazy artifacts: calibrated-row cache budget in GiB (default: as built)")
    p.add_argument("--row-store-gb", type=float, default=None, metavar="G",
                   help="lazy artifacts: disk budget of the rows persisted for later runs, in GiB under "
                        "$KGREASON_HOME/rows (default 4; 0: off)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_checksum_argument(p)
    a = p.parse_args(argv)
    if (a.queries is None) == (a.betae_queries is None):
        raise UserError("give exactly one of --queries FILE.jsonl or --betae-queries PKL (with --betae-folder DIR)")
    if a.betae_queries is not None and a.betae_folder is None:
        raise UserError("--betae-queries needs --betae-folder DIR (the triples that define easy/hard answers)")
    if a.betae_folder is not None and a.betae_queries is None:
        raise UserError("--betae-folder is only used with --betae-queries")
    check_device(a.device)
    if a.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {a.batch_size}")
    if a.limit is not None and a.limit < 1:
        raise UserError(f"--limit must be >= 1, got {a.limit}")
    if a.frontier_k is not None and a.frontier_k < 1:
        raise UserError(f"--frontier-k must be >= 1, got {a.frontier_k}")
    if a.row_cache_gb is not None:
        from kge.lazy import check_row_cache_gb

        check_row_cache_gb(a.row_cache_gb, "--row-cache-gb")
    if a.row_store_gb is not None:
        from kge.lazy import check_row_store_gb

        check_row_store_gb(a.row_store_gb, "--row-store-gb")
    if a.neg_scale <= 0:
        raise UserError(f"--neg-scale must be > 0, got {a.neg_scale}")
    if a.json is not None:
        check_output_file(a.json, what="--json", inputs=[("--artifact", a.artifact), ("--queries", a.queries),
                                                         ("--betae-queries", a.betae_queries),
                                                         ("--betae-folder", a.betae_folder)])
    return EvaluateArgs(
        a.artifact, a.queries, a.betae_queries, a.betae_folder,
        tuple(dict.fromkeys(a.structures)) if a.structures else None,
        a.negation, a.tnorm, a.neg_scale, a.batch_size, a.limit, a.ties, a.json, a.device, not a.no_progress,
        a.frontier_k, a.row_cache_gb, verify=not a.skip_artifact_checksums, row_store_gb=a.row_store_gb,
    )


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
    artifact = Artifact.load(args.artifact, verify=args.verify, load_embeddings=False, row_cache_gb=args.row_cache_gb,
                             row_store_gb=args.row_store_gb)
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
            progress=args.progress, timings=timings,
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
    if no_hard:
        print(f"note: {no_hard} of {len(queries)} queries have no hard answer and are not ranked", file=sys.stderr)
    t1 = time.perf_counter()
    executor = Executor(artifact, tnorm=args.tnorm, neg_scale=args.neg_scale, device=args.device,
                        frontier_k=args.frontier_k)
    results = evaluate_queries(executor, queries, batch_size=args.batch_size, progress=args.progress)
    t2 = time.perf_counter()
    if not results:
        raise UserError(f"{source}: no query has a hard answer: nothing to rank")
    print(format_table(results, ties=args.ties))
    print(f"({sum(r.num_queries for r in results)} queries, ties={args.ties}, tnorm={args.tnorm}, "
          f"negation={args.negation or 'as written'}"
          + (f", frontier_k={args.frontier_k}" if args.frontier_k is not None else "")
          + (", lazy rows" if artifact.is_lazy else "") + f"; load {t1 - t0:.1f} s, evaluate {t2 - t1:.1f} s)")
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
