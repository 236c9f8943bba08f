"""Batched query latency on a lazy artifact, per BetaE structure: cold, warm, a fresh process, and eager.

Run (each a separate process; ``--json`` collects one run's numbers, ``--report`` writes the table)::

    python benchmarks/lazy_batched.py --lazy /tmp/fb-lazy --queries /tmp/fbq.jsonl --json /tmp/after.json
    python benchmarks/lazy_batched.py --lazy /tmp/fb-lazy --queries /tmp/fbq.jsonl --json /tmp/second.json \\
        --row-store-gb 8              # run twice: the second run's cold pass is "a second process"
    python benchmarks/lazy_batched.py --report benchmarks/results/lazy_batched.md \\
        --runs before=/tmp/before.json after=/tmp/after.json second=/tmp/second.json

Per structure, the first ``--per-structure`` queries of the JSONL file (``engine.sample``'s) are
answered in one batch by ``Executor.scores`` over the lazy artifact: *cold* with an empty row cache
(and, unless ``--row-store-gb`` > 0, no persisted rows: every row computed), then *warm* (the same batch
again, its rows cached; best of ``--repeats`` passes).  With ``--eager DIR`` the same batch runs over an eager artifact too,
prepared and run once untimed first, and the largest score difference lazy vs eager is recorded
(pass ``--lazy`` an artifact built at the eager one's threshold for that to be 0).  The script uses
only the public API that every version since the lazy artifact has (``Artifact.load``,
``Executor.scores``, ``matrices.cache.clear()``, ``matrices.stats``), so the same file times an older
checkout (``git archive`` of it with ``ops/_C`` copied in, run with ``PYTHONPATH`` at that copy).

``--single`` (with ``--eager``) times queries one at a time instead (``Executor.scores([q])``, as the
latency table of benchmarks/results/lazy_rows.md does, here for every structure): per query *cold* (row
cache emptied), then *first reuse* (the same query right after: lazy_rows.md's "warm"); then, every
query's rows cached, ``--repeats`` rounds alternating eager and lazy query by query (*warm*; the machine
is shared, so the two sides see the same load).  Medians; ``--report ... --single`` writes the table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Iterator

STRUCTURES = ("1p", "2p", "3p", "2i", "3i", "ip", "pi", "2in", "3in", "inp", "pin", "pni", "2u", "up")


def _load(path: str, row_store_gb: float, row_cache_gb: float | None = None):
    from kge import Artifact

    kw = {}
    if "row_store_gb" in Artifact.load.__code__.co_varnames:  # versions before the store have none
        kw["row_store_gb"] = row_store_gb
    return Artifact.load(path, verify=False, row_cache_gb=row_cache_gb, **kw)


def _best(fn, repeats: int, n: int):
    """``(result, best milliseconds per query)`` of ``repeats`` calls of ``fn`` (one batch of ``n`` queries)."""
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best * 1000 / n


def run(args: argparse.Namespace) -> dict:
    import torch

    from engine.eval.metrics import load_jsonl_queries
    from engine.exec.executor import Executor

    lazy = _load(args.lazy, args.row_store_gb, args.row_cache_gb)
    eager = _load(args.eager, 0) if args.eager else None
    batches: dict[str, list] = {}
    for q in load_jsonl_queries(args.queries, lazy, structures=args.structures):
        lst = batches.setdefault(q.structure, [])
        if len(lst) < args.per_structure:
            lst.append(q.node)
    ex = Executor(lazy)
    ex_e = Executor(eager) if eager is not None else None
    out: dict = {"argv": sys.argv, "cwd": os.getcwd(), "torch_threads": torch.get_num_threads(),
                 "machine": platform.processor() or platform.machine(), "structures": {}}
    for s in args.structures:
        qs = batches.get(s)
        if not qs:
            continue
        lazy.matrices.cache.clear()
        row: dict = {"queries": len(qs)}
        before = dict(lazy.matrices.stats.as_dict())
        t = time.perf_counter()
        y_cold = ex.scores(qs, batch_size=len(qs))
        row["cold_ms"] = (time.perf_counter() - t) * 1000 / len(qs)
        after = lazy.matrices.stats.as_dict()
        row["rows_computed"] = after["rows_computed"] - before["rows_computed"]
        row["disk_hits"] = after.get("disk_hits", 0) - before.get("disk_hits", 0)
        y_warm, row["warm_ms"] = _best(lambda: ex.scores(qs, batch_size=len(qs)), args.repeats, len(qs))
        row["rows_recomputed_warm"] = lazy.matrices.stats.as_dict()["rows_computed"] - after["rows_computed"]
        row["warm_equals_cold"] = bool(torch.equal(y_cold, y_warm))
        if ex_e is not None:
            ex_e.scores(qs, batch_size=len(qs))  # prepares the eager stack, untimed
            y_e, row["eager_ms"] = _best(lambda: ex_e.scores(qs, batch_size=len(qs)), args.repeats, len(qs))
            row["max_abs_diff"] = float((y_e - y_warm).abs().max())
        out["structures"][s] = row
        print(s, json.dumps(row), flush=True)
    return out


def _ms(ts: list[float]) -> float:
    import statistics

    return statistics.median(ts) * 1000


def run_single(args: argparse.Namespace) -> dict:
    """Per structure, one query at a time: cold, first reuse, then warm alternating with eager (medians, ms)."""
    import torch

    from engine.eval.metrics import load_jsonl_queries
    from engine.exec.executor import Executor

    lazy = _load(args.lazy, args.row_store_gb, args.row_cache_gb)
    eager = _load(args.eager, 0)
    per: dict[str, list] = {}
    for q in load_jsonl_queries(args.queries, lazy, structures=args.structures):
        lst = per.setdefault(q.structure, [])
        if len(lst) < args.per_structure:
            lst.append(q.node)
    ex, ex_e = Executor(lazy), Executor(eager)
    for qs in per.values():  # prepares the eager stack and warms both sides' allocators, untimed
        for q in qs[:2]:
            ex_e.scores([q])
            ex.scores([q])
    out: dict = {"argv": sys.argv, "cwd": os.getcwd(), "torch_threads": torch.get_num_threads(), "mode": "single",
                 "machine": platform.processor() or platform.machine(), "structures": {}}
    stats = lazy.matrices.stats

    def timed(e, q):
        t = time.perf_counter()
        y = e.scores([q])
        return y, time.perf_counter() - t

    for s in args.structures:
        qs = per.get(s)
        if not qs:
            continue
        cold, first, warm, eag = [], [], [], []
        diff = 0.0
        rows0 = stats.rows_computed
        for q in qs:
            lazy.matrices.cache.clear()
            y_c, t_c = timed(ex, q)
            y_f, t_f = timed(ex, q)
            cold.append(t_c)
            first.append(t_f)
            if not torch.equal(y_c, y_f):
                raise SystemExit(f"{s}: a query's scores changed on reuse")
        computed = stats.rows_computed - rows0
        for q in qs:  # every query's rows in the cache together
            ex.scores([q])
        rows1 = stats.rows_computed
        for _ in range(max(1, args.repeats)):
            for q in qs:
                y_e, t_e = timed(ex_e, q)
                y_l, t_l = timed(ex, q)
                eag.append(t_e)
                warm.append(t_l)
                diff = max(diff, float((y_e - y_l).abs().max()))
        row = {"queries": len(qs), "cold_ms": _ms(cold), "first_ms": _ms(first), "warm_ms": _ms(warm),
               "eager_ms": _ms(eag), "rows_computed": computed / len(qs),
               "rows_recomputed_warm": stats.rows_computed - rows1, "max_abs_diff": diff,
               "load": os.getloadavg()[0]}
        out["structures"][s] = row
        print(s, json.dumps(row), flush=True)
    return out


def report_single(path: Path, runs: list[tuple[str, Path]]) -> None:
    """The one-at-a-time table of ``runs`` (each a ``--single --json`` file)."""
    data, names, lines = _runs_header(runs, "one query at a time: warm lazy / eager per structure",
                                      "one process each, in this order")
    lines += ["", "Milliseconds per query (medians). *first reuse*: the query again right after its cold run "
              "(lazy_rows.md's \"warm\"); *warm*: every query's rows cached, alternating with eager query by "
              "query. Ratios to the eager median of the same run.", ""]
    head = ["structure", "queries"]
    for n in names:
        head += [f"{n} eager", f"{n} first reuse / eager", f"{n} warm / eager"]
    head += ["max abs diff", "load (1 min)"]
    for cells, per_run in _table(data, names, lines, head):
        for r in per_run:
            cells += [f"{r['eager_ms']:.2f}", f"{r['first_ms'] / r['eager_ms']:.2f}x",
                      f"{r['warm_ms'] / r['eager_ms']:.2f}x"]
        cells += [" / ".join(f"{r['max_abs_diff']:.1g}" for r in per_run),
                  " / ".join(f"{r['load']:.1f}" for r in per_run)]
        lines.append("| " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def _runs_header(runs: list[tuple[str, Path]], title: str, how: str) -> tuple[dict, list[str], list[str]]:
    """``(data by run name, run names, the report's first lines)``: its title and each run's command."""
    data = {name: json.loads(p.read_text()) for name, p in runs}
    names = [n for n, _ in runs]
    lines = [f"# Lazy rows, {title} (issue 34)", "", f"Commands ({how}):", ""]
    for n in names:
        lines.append(f"- `{n}`: `{' '.join(data[n]['argv'])}` (in `{data[n]['cwd']}`, "
                     f"{data[n]['torch_threads']} torch threads)")
    return data, names, lines


def _table(data: dict, names: list[str], lines: list[str], head: list[str]) -> Iterator[tuple[list[str], list[dict]]]:
    """Append the table's head to ``lines``; then per structure that every run has, ``(its first cells: name and
    query count, its numbers in each run)``."""
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in STRUCTURES:
        if all(s in data[n]["structures"] for n in names):
            yield [s, str(data[names[-1]]["structures"][s]["queries"])], [data[n]["structures"][s] for n in names]


def report(path: Path, runs: list[tuple[str, Path]]) -> None:
    data, names, lines = _runs_header(runs, "batched: per-structure latency before/after", "one process each")
    lines += ["", "Milliseconds per query, each structure's batch answered by one `Executor.scores` call.", ""]
    head = ["structure", "queries"]
    for n in names:
        head += [f"{n} cold", f"{n} warm"]
    if any("eager_ms" in r for d in data.values() for r in d["structures"].values()):
        head += ["eager", "warm / eager (last run)", "max abs diff"]
    last = data[names[-1]]["structures"]
    for cells, per_run in _table(data, names, lines, head):
        s = cells[0]
        for r in per_run:
            cells += [f"{r['cold_ms']:,.1f}", f"{r['warm_ms']:,.1f}"]
        if "eager_ms" in last[s]:
            cells += [f"{last[s]['eager_ms']:,.2f}", f"{last[s]['warm_ms'] / last[s]['eager_ms']:,.1f}x",
                      f"{last[s]['max_abs_diff']:.1e}"]
        elif len(head) > len(cells):
            cells += ["-"] * (len(head) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Rows computed in the cold pass (rows read from the persisted store):", ""]
    lines += ["| structure | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for s in STRUCTURES:
        if all(s in data[n]["structures"] for n in names):
            lines.append(f"| {s} | " + " | ".join(
                f"{data[n]['structures'][s]['rows_computed']:,} ({data[n]['structures'][s]['disk_hits']:,})"
                for n in names) + " |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lazy", help="lazy artifact folder")
    p.add_argument("--eager", help="eager artifact folder (same embeddings; same threshold for a 0 difference)")
    p.add_argument("--queries", help="sampler JSONL (python -m engine.sample)")
    p.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    p.add_argument("--per-structure", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5, help="warm and eager: best of this many passes (default 5)")
    p.add_argument("--row-store-gb", type=float, default=0.0,
                   help="disk budget of persisted rows read and written (default 0: off, every cold row computed)")
    p.add_argument("--row-cache-gb", type=float, default=None, help="row cache budget (default: as built)")
    p.add_argument("--json", type=Path, help="write this run's numbers here")
    p.add_argument("--report", type=Path, help="write the markdown table of --runs here")
    p.add_argument("--runs", nargs="+", default=[], metavar="NAME=JSON")
    p.add_argument("--single", action="store_true",
                   help="one query at a time, lazy vs eager (needs --eager); with --report: that table")
    a = p.parse_args(argv)
    if a.report:
        (report_single if a.single else report)(a.report, [(r.split("=", 1)[0], Path(r.split("=", 1)[1]))
                                                           for r in a.runs])
        return 0
    if not (a.lazy and a.queries):
        p.error("--lazy and --queries are needed (or --report with --runs)")
    if a.single and not a.eager:
        p.error("--single needs --eager")
    out = run_single(a) if a.single else run(a)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
