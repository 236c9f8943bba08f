"""The end-to-end rows of ``benchmarks/gpu_check.sh``: one ``engine.evaluate`` run per label, compared.

    python benchmarks/gpu_check_e2e.py WORK cuda-lazy cuda cpu

reads, for each run label, ``WORK/eval-<label>.json`` (``engine.evaluate --json``), ``WORK/eval-<label>.time``
(two wall-clock stamps around the process) and ``WORK/eval-<label>.txt`` (its printed table, whose last line
gives the load and evaluate seconds), prints the queries per second of each run (the whole process, and the
evaluation alone), the ratio of the last run's times to each other's, the per-structure MRR table, and the
largest difference of any metric between the first run and each other one.  The scores of the two devices come
from different kernels (max-product is exact, but the t-norms' float32 products may round differently), so
the line says "identical" only when every metric is equal and otherwise gives the largest difference.
Exit status 1 when a difference exceeds 1e-4 (a ranking changed beyond float32 rounding).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TOLERANCE = 1e-4


def _load(work: Path, label: str) -> tuple[dict, float, float | None]:
    """(the JSON, the process's wall seconds, the evaluation's own seconds or None when not printed)."""
    data = json.loads((work / f"eval-{label}.json").read_text())
    start, end = (float(v) for v in (work / f"eval-{label}.time").read_text().split())
    txt = work / f"eval-{label}.txt"
    found = re.search(r"evaluate ([0-9.]+) s\)", txt.read_text()) if txt.is_file() else None
    return data, end - start, float(found.group(1)) if found else None


def _metrics(data: dict) -> dict[tuple[str, str, str], float]:
    """(structure, tie rule, metric) -> value."""
    out = {}
    for row in data["results"]:
        for ties, vals in row["metrics"].items():
            for name, v in vals.items():
                out[(row["structure"], ties, name)] = float(v)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python benchmarks/gpu_check_e2e.py WORK LABEL [LABEL ...]", file=sys.stderr)
        return 2
    work, devs = Path(argv[0]), argv[1:]
    runs = {dev: _load(work, dev) for dev in devs}
    first = runs[devs[0]][0]
    n = sum(int(r["num_queries"]) for r in first["results"])
    for dev, (_, secs, ev) in runs.items():
        own = f"; evaluation alone {ev:.2f} s, {n / ev:.1f} queries/s" if ev else ""
        print(f"engine.evaluate, {dev}: {n} queries in {secs:.2f} s ({n / secs:.1f} queries/s, whole process{own})")
    if len(devs) > 1:
        _, base, base_ev = runs[devs[-1]]
        for dev in devs[:-1]:
            _, secs, ev = runs[dev]
            alone = f", evaluation alone {base_ev / ev:.2f}x" if ev and base_ev else ""
            print(f"ratio {devs[-1]} / {dev}: whole process {base / secs:.2f}x{alone}")
    print()
    print("| structure | queries | " + " | ".join(f"MRR {d}" for d in devs) + " |")
    print("|---|---:|" + "---:|" * len(devs))
    per_dev = {d: _metrics(runs[d][0]) for d in devs}
    for row in first["results"]:
        s = row["structure"]
        vals = " | ".join(f"{100 * per_dev[d][(s, 'average', 'mrr')]:.2f}" for d in devs)
        print(f"| {s} | {row['num_queries']} | {vals} |")
    print()
    worst = 0.0
    for dev in devs[1:]:
        a, b = per_dev[devs[0]], per_dev[dev]
        if a.keys() != b.keys():
            print(f"metrics differ: {devs[0]} and {dev} report different structures or metrics")
            return 1
        diff = max((abs(a[k] - b[k]) for k in a), default=0.0)
        worst = max(worst, diff)
        print(f"{devs[0]} vs {dev}: " + ("identical metrics" if diff == 0 else
                                         f"metrics differ by at most {diff:.2e} (tolerance {TOLERANCE:g})"))
    return 1 if worst > TOLERANCE else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
