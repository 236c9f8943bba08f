"""Single-process query latency and throughput per structure on one artifact, the load timed apart.

    python benchmarks/query_latency.py --artifact /tmp/kg1m/art --queries /tmp/kg1m/q.jsonl \\
        --per-structure 4 --frontier-k 32 --timeout 120 --json /tmp/kg1m/latency_k32.json

Loads the artifact once (``Engine.load``: the load time, and the peak RSS after it), answers one
query to warm up (timed apart: the first query prepares what later ones reuse), then answers the
first ``--per-structure`` queries of each structure of ``--queries`` (``engine.sample``'s JSON Lines),
one query per ``Engine.answer`` call (top 10, explanations on: what ``engine.answer`` does), and
reports per structure the median and the largest latency, the queries per second over the
structure, and the peak RSS at the end.  A query past ``--timeout`` seconds is stopped (SIGALRM) and
counted as timed out (its structure's remaining queries are skipped: they would time out too), so a
runaway 3p costs minutes, not hours.  Used for benchmarks/results/large_kg_1m.md.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/query_latency.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--per-structure", type=int, default=4)
    ap.add_argument("--frontier-k", type=int, default=None, help="as engine.answer's (default: exact)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one query may take")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from engine.exec.api import Engine

    picked: dict[str, list[str]] = collections.defaultdict(list)
    with open(args.queries, encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if len(picked[q["structure"]]) < args.per_structure:
                picked[q["structure"]].append(q["expr"])
    t = time.perf_counter()
    engine = Engine.load(args.artifact, verify=False, frontier_k=args.frontier_k)
    load_s = time.perf_counter() - t
    out = {"artifact": args.artifact, "frontier_k": args.frontier_k, "load_s": round(load_s, 2),
           "rss_after_load_gib": round(_rss_gib(), 2), "structures": {}}
    print(f"load {load_s:.1f} s, peak RSS {_rss_gib():.2f} GiB", file=sys.stderr, flush=True)
    signal.signal(signal.SIGALRM, _alarm)
    # The first query prepares what every later one reuses (an eager stack's transpose, a lazy artifact's
    # row machinery): timed apart, as the rest of the load.
    first = next(iter(picked.values()))[0]
    t = time.perf_counter()
    engine.answer(first, k=10)
    out["first_query_s"] = round(time.perf_counter() - t, 2)
    print(f"first query (warm-up, answered again below) {out['first_query_s']} s", file=sys.stderr, flush=True)
    for structure, exprs in picked.items():
        times, timed_out = [], 0
        for expr in exprs:
            t = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, args.timeout)
            try:
                engine.answer(expr, k=10)
            except _Timeout:
                timed_out += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            times.append(time.perf_counter() - t)
            if timed_out:
                break
        rec = {"queries": len(times), "timed_out": timed_out, "median_s": round(statistics.median(times), 3),
               "max_s": round(max(times), 3), "qps": round(len(times) / sum(times), 3),
               "peak_rss_gib": round(_rss_gib(), 2)}
        out["structures"][structure] = rec
        print(f"{structure:<4} {rec}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
