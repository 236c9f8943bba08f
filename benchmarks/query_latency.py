"""Query latency and throughput per structure on one artifact, the load timed apart; one process or under torchrun.

    python benchmarks/query_latency.py --artifact /tmp/kg1m/art --queries /tmp/kg1m/q.jsonl \\
        --per-structure 8 --timeout 30 --fallback-k 32 --json /tmp/kg1m/p1.json
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/query_latency.py --artifact /tmp/kg1m/art \\
        --queries /tmp/kg1m/q.jsonl --per-structure 8 --plan /tmp/kg1m/p1.json --json /tmp/kg1m/p2.json

Loads the artifact once (``Engine.load``: the load time, and the peak RSS after it), answers one
query to warm up (timed apart: the first query prepares what later ones reuse), then answers the
first ``--per-structure`` queries of each structure of ``--queries`` (``engine.sample``'s JSON Lines),
one query per ``Engine.answer`` call (top 10, explanations on: what ``engine.answer`` does), and
reports per structure the median and the largest latency, the queries per second over the
structure, and the peak RSS at the end.  A query past ``--timeout`` seconds is stopped (SIGALRM) and
counted as timed out; with ``--fallback-k K`` it is then answered again with ``--frontier-k K`` (each
query is tried exactly first), else its structure's remaining queries are skipped (they would time
out too), so a runaway 3p costs minutes, not hours.  ``--json`` keeps every query's
mode (``exact`` or ``k=K``), seconds and top-10 answers (ids and scores).

Under torchrun (several ranks, ``WORLD_SIZE`` > 1) the ranks answer together (``Engine.load(...,
process_group=)``, :mod:`engine.exec.sharded`).  A rank cannot stop a query alone (the others would wait in
its collectives), so there ``--timeout`` is refused and ``--plan FILE`` (a one-process run's ``--json``)
gives each query's mode; rank 0 writes ``--json``, with every rank's peak RSS.  ``--compare FILE`` counts
the queries whose answers (ids, and scores within 1e-6) equal FILE's.  ``--table A.json B.json ...`` prints
runs side by side (markdown).  Used for benchmarks/results/large_kg_1m.md.
"""
from __future__ import annotations

import argparse
import collections
import json
import resource
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001 - the signal handler's signature
    raise _Timeout


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def _modes(path: str) -> dict[str, int | None]:
    """Each query's frontier k (``None``: exact) in an earlier run's ``--json``."""
    return {q["expr"]: q["frontier_k"] for q in json.loads(Path(path).read_text(encoding="utf-8"))["queries"]}


def same_answers(a: list, b: list, tol: float = 1e-6) -> bool:
    """Whether two top-k lists ``[[id, score], ...]`` have the same ids in the same order and scores within ``tol``."""
    return [i for i, _ in a] == [i for i, _ in b] and all(abs(x - y) <= tol for (_, x), (_, y) in zip(a, b))


def table(paths: list[str]) -> str:
    """A markdown table of runs' ``--json`` files side by side: per structure and run, the median / largest seconds
    per mode (a ``*`` marks a structure answered partly with a frontier k), then load, peak RSS and the comparison."""
    runs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    names = [f"P = {r['ranks']}, " + ("exact" if r["frontier_k"] is None else f"k = {r['frontier_k']}") for r in runs]
    lines = ["| structure | " + " | ".join(f"{n}: median / max s" for n in names) + " |",
             "|---|" + "---|" * len(runs)]
    for structure in runs[0]["structures"]:
        cells = []
        for r in runs:
            rec = r["structures"].get(structure, {})
            parts = [f"{m['median_s']:.2f} / {m['max_s']:.2f}" + ("" if mode == "exact" or r["frontier_k"] else
                                                                      f" ({m['queries']} at {mode})")
                     for mode, m in rec.items() if isinstance(m, dict)]
            cells.append("; ".join(parts) or "-")
        lines.append(f"| {structure} | " + " | ".join(cells) + " |")
    lines.append("| load s | " + " | ".join(f"{r['load_s']:.1f}" for r in runs) + " |")
    lines.append("| peak RSS GiB (per rank) | " + " | ".join(
        " / ".join(f"{x:.2f}" for x in r.get("peak_rss_gib_per_rank", [max(
            v["peak_rss_gib"] for v in r["structures"].values())])) for r in runs) + " |")
    lines.append("| same answers as | " + " | ".join(
        f"{r['compare']['same']} / {r['compare']['compared']} (scores within {r['compare']['max_score_diff']:.1e})"
        if "compare" in r else "-" for r in runs) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--table":  # python benchmarks/query_latency.py --table A.json B.json ...
        print(table(list(argv[1:])))
        return 0
    ap = argparse.ArgumentParser(prog="python benchmarks/query_latency.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--per-structure", type=int, default=4)
    ap.add_argument("--frontier-k", type=int, default=None, help="as engine.answer's (default: exact)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one query may take (default 120; one process)")
    ap.add_argument("--fallback-k", type=int, default=None, help="answer a timed-out query again with this frontier k")
    ap.add_argument("--plan", help="an earlier run's --json: each query's frontier k (under torchrun: instead of "
                                   "--timeout)")
    ap.add_argument("--compare", help="an earlier run's --json: count the queries with the same answers")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from engine.exec.sharded_load import in_torchrun, rank_zero_output, torchrun_group

    if in_torchrun() and args.timeout is not None:  # before joining: every rank stops here alike
        ap.error("--timeout: a rank cannot stop a query alone under torchrun; give --plan (a one-process run's --json)")
    group = torchrun_group()  # None in one process
    timeout = 120.0 if args.timeout is None else args.timeout
    plan = _modes(args.plan) if args.plan else {}
    log = rank_zero_output(group, sys.stderr)
    from engine.exec.api import Engine

    picked: dict[str, list[str]] = collections.defaultdict(list)
    with open(args.queries, encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if len(picked[q["structure"]]) < args.per_structure:
                picked[q["structure"]].append(q["expr"])
    t = time.perf_counter()
    engine = Engine.load(args.artifact, verify=False, frontier_k=args.frontier_k, process_group=group)
    load_s = time.perf_counter() - t
    out = {"artifact": args.artifact, "frontier_k": args.frontier_k, "ranks": 1 if group is None else group.size(),
           "load_s": round(load_s, 2), "rss_after_load_gib": round(_rss_gib(), 2), "structures": {}, "queries": []}
    print(f"load {load_s:.1f} s, peak RSS {_rss_gib():.2f} GiB", file=log, flush=True)
    if group is None:
        signal.signal(signal.SIGALRM, _alarm)
    # The first query prepares what every later one reuses (an eager stack's transpose, a lazy artifact's
    # row machinery): timed apart, as the rest of the load.
    first = next(iter(picked.values()))[0]
    t = time.perf_counter()
    engine.answer(first, k=10)
    out["first_query_s"] = round(time.perf_counter() - t, 2)
    print(f"first query (warm-up, answered again below) {out['first_query_s']} s", file=log, flush=True)
    for structure, exprs in picked.items():
        times: dict[str, list[float]] = collections.defaultdict(list)
        timed_out = 0
        for expr in exprs:
            modes = [plan[expr]] if expr in plan else [args.frontier_k]
            while modes:
                k = modes.pop(0)
                engine.executor.frontier_k = k  # the executor reads it at every projection
                t = time.perf_counter()
                if group is None:
                    signal.setitimer(signal.ITIMER_REAL, timeout)
                try:
                    res = engine.answer(expr, k=10)
                except _Timeout:
                    timed_out += 1
                    res = None
                finally:
                    if group is None:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                s = time.perf_counter() - t
                mode = "exact" if k is None else f"k={k}"
                if res is None:
                    print(f"{structure:<4} {mode} timed out after {s:.1f} s: {expr}", file=log, flush=True)
                    if args.fallback_k is not None and k != args.fallback_k:
                        modes = [args.fallback_k]
                    continue
                times[mode].append(s)
                out["queries"].append({"structure": structure, "expr": expr, "frontier_k": k, "s": round(s, 3),
                                       "answers": [[a.id, a.score] for a in res[0].answers]})
            if timed_out and args.fallback_k is None:
                break
        rec: dict = {"timed_out": timed_out, "peak_rss_gib": round(_rss_gib(), 2)}
        for mode, ts in times.items():
            rec[mode] = {"queries": len(ts), "median_s": round(statistics.median(ts), 3), "max_s": round(max(ts), 3),
                         "qps": round(len(ts) / sum(ts), 3)}
        out["structures"][structure] = rec
        print(f"{structure:<4} {rec}", file=log, flush=True)
    if group is not None:
        import torch.distributed as dist

        rss: list = [None] * group.size()
        dist.all_gather_object(rss, _rss_gib(), group=group)
        out["peak_rss_gib_per_rank"] = [round(r, 2) for r in rss]
    if args.compare:
        theirs = {q["expr"]: q for q in json.loads(Path(args.compare).read_text(encoding="utf-8"))["queries"]}
        pairs = [(q, theirs.get(q["expr"])) for q in out["queries"]]
        pairs = [(q, p) for q, p in pairs if p is not None and p["frontier_k"] == q["frontier_k"]]
        out["compare"] = {"file": args.compare, "compared": len(pairs),
                          "same": sum(same_answers(q["answers"], p["answers"]) for q, p in pairs),
                          "max_score_diff": max((abs(x - y) for q, p in pairs if [i for i, _ in q["answers"]] ==
                                                 [i for i, _ in p["answers"]]
                                                 for (_, x), (_, y) in zip(q["answers"], p["answers"])), default=0.0)}
        print(f"compare: {out['compare']}", file=log, flush=True)
    if args.json and (group is None or group.rank() == 0):
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
