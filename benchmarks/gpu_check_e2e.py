"""The end-to-end rows of ``benchmarks/gpu_check.sh``: one ``engine.evaluate`` run per device, compared.

    python benchmarks/gpu_check_e2e.py WORK cuda cpu

reads ``WORK/eval-<dev>.json`` (``engine.evaluate --json``) and ``WORK/eval-<dev>.time`` (two wall-clock
stamps around the run) for each device named, prints the queries per second of each run (the whole process:
loading the artifact, moving it to the device, every batch), the per-structure MRR table, and the largest
difference of any metric between the first device and each other one.  The scores of the two devices come
from different kernels (max-product is exact, but the t-norms' float32 products may round differently), so
the line says "identical" only when every metric is equal and otherwise gives the largest difference.
Exit status 1 when a difference exceeds 1e-4 (a ranking changed beyond float32 rounding).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TOLERANCE = 1e-4


def _load(work: Path, dev: str) -> tuple[dict, float]:
    data = json.loads((work / f"eval-{dev}.json").read_text())
    start, end = (float(v) for v in (work / f"eval-{dev}.time").read_text().split())
    return data, end - start


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
        print("usage: python benchmarks/gpu_check_e2e.py WORK DEVICE [DEVICE ...]", file=sys.stderr)
        return 2
    work, devs = Path(argv[0]), argv[1:]
    runs = {dev: _load(work, dev) for dev in devs}
    first = runs[devs[0]][0]
    n = sum(int(r["num_queries"]) for r in first["results"])
    for dev, (_, secs) in runs.items():
        print(f"engine.evaluate on {dev}: {n} queries in {secs:.2f} s ({n / secs:.1f} queries/s, whole process)")
    if len(devs) > 1:
        base = runs[devs[-1]][1]
        for dev in devs[:-1]:
            print(f"wall ratio {devs[-1]} / {dev}: {base / runs[dev][1]:.2f}x")
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
