"""Benchmark reports: the numbers a benchmark run saved, written as a table in ``benchmarks/results/``.

Two steps (docs/testing.md, "Benchmarks")::

    python -m pytest benchmarks/test_kge_build.py --bench-out artifacts/bench   # measure: artifacts/bench/kge_build.json
    python -m benchmarks.report kge_build --from artifacts/bench                 # write benchmarks/results/kge_build.md

The timed tests of a benchmark file put their numbers into a :class:`Measurements` (cells by
``(row, column)``, and run details in ``info``); at the end of the pytest session
benchmarks/conftest.py saves each one as ``<--bench-out>/<name>.json`` (default folder
``artifacts/bench``), the name saying which table and variant it is (``ops_projection_1thread``,
``engine_throughput_synthetic``, ...).  This script turns one saved run into its table.  A table
with a hole is never written: a cell whose test was deselected, failed or skipped without saying
why (a test that cannot measure here marks its cells :meth:`Measurements.not_applicable`, shown
as a dash or left out) fails the report with one error naming every missing cell, and the
committed table is left alone.  The table is written atomically, only once every check passed.

Standard library only: it reads JSON and writes Markdown.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from kgreason.cli import ArgumentParser
from kgreason.errors import UserError, cli_main, unknown_name
from kgreason.files import check_output_file, loads_json, write_output

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where a run saves its measurements unless told (``--bench-out``) and where this script reads them.
DEFAULT_SAVED = ROOT / "artifacts" / "bench"
RESULTS = HERE / "results"
#: The variables that tune a benchmark run (sizes, threads, data paths): saved with its measurements, and
#: shown in a table's command line where they were set.
BENCH_ENV = ("ENGINE_BENCH_THREADS", "ENGINE_BENCH_ROUNDS", "ENGINE_BENCH_QTO_QUERIES", "KGE_BENCH_RELATIONS",
             "KGE_TRAIN_BENCH_STEPS", "KGREASON_BENCH_THREADS", "KGREASON_FB15K237_ARTIFACT", "KGREASON_LAZY_ARTIFACT",
             "KGREASON_LAZY_QUERY_ARTIFACT", "KGREASON_EAGER_QUERY_ARTIFACT", "KGREASON_LAZY_QUERIES",
             "LAZY_BENCH_ROWS", "LAZY_BENCH_QUERIES")


class Measurements:
    """One benchmark run's numbers by ``(row, column)`` (e.g. ``("2p", "b1024")``), and free-form ``info``.

    Timed tests :meth:`put` their values; a test that cannot measure on this machine or data
    (no bf16 GEMM, no kernel, no query of a structure) calls :meth:`not_applicable` before skipping,
    so the table prints a dash there instead of reporting a hole.  ``table`` names the renderer
    (:data:`TABLES`), ``name`` the saved file and the written table (``table`` plus a variant suffix).
    ``info`` holds JSON values only (it is saved).
    """

    def __init__(self, table: str, name: str | None = None) -> None:
        self.table = table
        self.name = name or table
        self.values: dict[tuple[str, str], float] = {}
        self.absent: dict[tuple[str, str], str] = {}
        self.info: dict[str, Any] = {}
        self.source = ""  # the file it was loaded from (error messages)

    def put(self, row: str, column: str, value: float) -> None:
        self.values[(row, column)] = float(value)

    def not_applicable(self, row: str, column: str, reason: str) -> None:
        self.absent[(row, column)] = reason

    def get(self, row: str, column: str) -> float | None:
        """The value, or None for a cell marked not applicable."""
        return self.values.get((row, column))

    def __contains__(self, cell: tuple[str, str]) -> bool:
        return cell in self.values

    def __bool__(self) -> bool:  # anything measured (an empty run saves nothing)
        return bool(self.values or self.absent)

    # ------------------------------------------------------------------ saved form
    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "name": self.name,
                "values": [[r, c, v] for (r, c), v in self.values.items()],
                "absent": [[r, c, why] for (r, c), why in self.absent.items()], "info": self.info}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Measurements":
        def bad(what: str) -> Exception:
            return UserError(f"{where}: not a saved benchmark run ({what})")

        if not isinstance(obj, dict) or not isinstance(obj.get("table"), str) or not isinstance(obj.get("name"), str):
            raise bad("expected an object with 'table' and 'name'")
        m = cls(obj["table"], obj["name"])
        m.source = where
        for key, width, kinds in (("values", 3, (int, float)), ("absent", 3, (str,))):
            cells = obj.get(key, [])
            if not isinstance(cells, list):
                raise bad(f"'{key}' is not a list")
            for cell in cells:
                if not (isinstance(cell, list) and len(cell) == width and isinstance(cell[0], str)
                        and isinstance(cell[1], str) and isinstance(cell[2], kinds) and not isinstance(cell[2], bool)):
                    raise bad(f"'{key}' holds {cell!r}, expected [row, column, value]")
                if key == "values":
                    m.put(cell[0], cell[1], cell[2])
                else:
                    m.not_applicable(cell[0], cell[1], cell[2])
        if not isinstance(obj.get("info", {}), dict):
            raise bad("'info' is not an object")
        m.info = dict(obj.get("info", {}))
        return m

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``<folder>/<name>.json`` atomically (the folder is created)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        return write_output(Path(folder) / f"{self.name}.json", json.dumps(self.to_json(), indent=1) + "\n",
                            what="--bench-out")

    # ------------------------------------------------------------------ the check before a table is written
    def require(self, *blocks: tuple[Iterable[str], Iterable[str]], info: Iterable[str] = (),
                may_be_zero: Iterable[str] = ()) -> None:
        """Raise a ``UserError`` unless, for every ``(rows, columns)`` block, each cell holds a finite number
        > 0 (>= 0 in the columns ``may_be_zero``) or was marked not applicable, and every ``info`` key is set.
        The message names every missing or bad cell of every block."""
        zero_ok = set(may_be_zero)
        missing: list[str] = []
        bad: list[str] = []
        for rows_, columns_ in blocks:
            rows, columns = list(rows_), list(columns_)
            lost = {c: [r for r in rows if (r, c) not in self.values and (r, c) not in self.absent] for c in columns}
            if not any(lost.values()):
                pass
            elif all(len(lost[c]) == len(rows) for c in columns):
                missing.append(f"rows {', '.join(rows)} x columns {', '.join(columns)}: none")
            elif len(rows) == 1:
                missing.append(f"{rows[0]}: " + ", ".join(c for c in columns if lost[c]))
            else:
                missing += [f"{c}: " + ", ".join(lost[c]) for c in columns if lost[c]]
            for c in columns:
                for r in rows:
                    v = self.values.get((r, c))
                    if v is not None and (not math.isfinite(v) or v < 0 or (v == 0 and c not in zero_ok)):
                        bad.append(f"{r}/{c} = {v!r}")
        lost_info = [k for k in info if k not in self.info]
        if not (missing or bad or lost_info):
            return
        parts = []
        if missing:
            parts.append("missing measurements (their tests did not run, or failed, in the run that saved them): "
                         + "; ".join(missing))
        if bad:
            parts.append("not finite and positive: " + ", ".join(bad))
        if lost_info:
            parts.append("missing run details: " + ", ".join(lost_info))
        bench = TABLES[self.table].bench if self.table in TABLES else "benchmarks/<file>.py"
        raise UserError(f"{self.source or self.name}: the report {self.name}.md was not written; " + "; ".join(parts)
                          + f". Run the whole file again: python -m pytest {bench} --bench-out <folder>")


# ------------------------------------------------------------------ shared pieces of the tables
def _load(m: Measurements) -> str:
    load = m.info.get("load") or [math.nan] * 3
    return f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"


def _argv(m: Measurements) -> str:
    """The pytest command of the run (its arguments, ``-p <plugin>`` pairs and ``--bench-out`` left out)."""
    return shlex.join(["python", "-m", "pytest"] + list(m.info.get("argv", [])))


def _env(m: Measurements, *names: str) -> str:
    """``NAME=value `` for each of ``names`` the run had set (saved in ``info["env"]``)."""
    env = m.info.get("env", {})
    return "".join(f"{k}={env[k]} " for k in names if env.get(k))


# ------------------------------------------------------------------ the tables
def engine_throughput(m: Measurements) -> str:
    i = m.info
    structures, columns = i.get("structures", []), i.get("columns", [])
    # page faults per query may be 0 (a pass whose outputs glibc recycles entirely)
    m.require((structures, columns), info=("data", "backend", "pass_rows", "structures", "columns", "tnorm",
                                           "neg_scale", "n_small", "b_large", "rounds", "qto_queries"),
              may_be_zero=("faults", "faults_1pass"))
    lines = [
        "# Engine throughput (queries per second)",
        "",
        "Command: `" + _env(m, "ENGINE_BENCH_THREADS") + "python -m pytest benchmarks/test_engine_throughput.py`",
        f"Machine: {i['machine']}",
        f"Data: {i['data']}; ops backend: {i['backend']}; t-norm {i['tnorm']}, neg_scale {i['neg_scale']}, "
        f"QTO negation; {i['n_small']} queries one by one (loop, b1), {i['b_large']} per batch (b1024), best of "
        f"{i['rounds']} rounds; the first {i['qto_queries']} of them through the dense QTO reference (qto), one round.",
        f"Date: {i['date']}",
        "",
        "`loop` = one query at a time through the same `ops` operators (the reference QTO way);"
        " `b1`/`b1024` = `Executor.iter_scores` with batch size 1/1024"
        f" (executed in passes of at most {i['pass_rows']} rows);"
        " `sparse` = b1024 with sparse intermediate sets where they are small (`Executor(sparse=True)`);"
        " `qto` = QTO's dense per-query algorithm"
        " (each projection a max-product over the relation's dense N x N matrix; the matrices, which QTO"
        " builds once up front, are densified when used but that time is not counted);"
        " `qto+densify` counts it too."
        " All compute every query's scores and drop them.",
        "",
        "| structure | qto q/s | qto+densify q/s | loop q/s | b1 q/s | sparse q/s | b1024 q/s | b1 / loop "
        "| sparse / loop | b1024 / loop | b1024 / qto | page faults / query (one pass → passes) "
        "| b1024 q/s in one pass |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(v: float) -> str:
        return f"{v:,.0f}" if v >= 10 else f"{v:.2f}"

    def ratio(a: float, b: float) -> str:
        return f"{a / b:,.2f}×"

    for name in structures:
        r = {col: m.get(name, col) for col in columns}
        qto, loop, b1, b1024, sparse = r["qto"], r["loop"], r["b1"], r["b1024"], r["sparse"]
        lines.append(f"| {name} | {fmt(qto)} | {fmt(r['qto_densify'])} | {fmt(loop)} | {fmt(b1)} | {fmt(sparse)} | "
                     f"{fmt(b1024)} | {ratio(b1, loop)} | {ratio(sparse, loop)} | {ratio(b1024, loop)} | "
                     f"{ratio(b1024, qto)} | {r['faults_1pass']:.1f} → {r['faults']:.1f} | {fmt(r['b1024_1pass'])} |")
    return "\n".join(lines) + "\n"


def kge_build(m: Measurements) -> str:
    numbers = ("mm_gflops", "cal_gflops", "cal_seconds", "rows", "relations", "full_seconds", "nnz_subset",
               "nnz_full_estimate", "chunk", "n", "r", "d", "low_seconds", "low_nnz")
    m.require((["build"], numbers), info=("embeddings", "threshold", "mm_shape", "qto_threshold"))
    r = {**m.info, **{k: m.get("build", k) for k in numbers}}
    for k in ("rows", "relations", "nnz_subset", "chunk", "n", "r", "d", "low_nnz"):
        r[k] = int(r[k])
    ratio = r["cal_gflops"] / r["mm_gflops"]
    qto = r["qto_threshold"]
    low_rate = 2.0 * r["rows"] * 2 * r["d"] * r["n"] / r["low_seconds"] / 1e9
    return f"""# Calibrated matrix build: FLOP rate vs plain matmul

Command: `python -m pytest benchmarks/test_kge_build.py -q` (KGE_BENCH_RELATIONS={r['relations']})
Date: {r['date']}
Machine: {r['machine']}; load average at the end {_load(m)}
(the machine is shared with other jobs: absolute numbers are noisy, the ratio less so)

Embeddings: {r['embeddings']}; N = {r['n']:,}, R = {r['r']}, complex rank d = {r['d']} (real matmul width 2d = {2 * r['d']}),
threshold {r['threshold']:.3g} (the artifact's; QTO's {qto:g} in the last rows).

| measurement | value |
|---|---|
| plain float32 `torch.mm` {r['mm_shape']} | {r['mm_gflops']:.1f} GFLOP/s |
| calibration of {r['relations']} relations ({r['rows']:,} rows, chunk {r['chunk']} rows) | {r['cal_seconds']:.2f} s |
| calibration useful matmul rate (2 * rows * 2d * N / time) | {r['cal_gflops']:.1f} GFLOP/s |
| **ratio calibration / plain matmul** | **{ratio:.2f}** (target >= 0.5) |
| extrapolated time for all {r['r']} relations | {r['full_seconds'] / 60:.1f} min |
| nnz in the subset / extrapolated to all relations | {r['nnz_subset']:,} / {r['nnz_full_estimate']:,.0f} |
| same rows at threshold {qto:g}: time, useful rate, ratio | {r['low_seconds']:.2f} s, {low_rate:.1f} GFLOP/s, {low_rate / r['mm_gflops']:.2f} |
| nnz at {qto:g} in the subset / extrapolated | {r['low_nnz']:,} / {r['low_nnz'] * r['r'] / r['relations']:,.0f} |
"""


def kge_train(m: Measurements) -> str:
    i = m.info
    ranks, precisions, loops = i.get("ranks", []), i.get("precisions", []), i.get("loops", [])
    m.require((["matmul"], precisions), ([f"{rank}/{key}" for rank in ranks for key, _ in loops], ("step_s", "gflops")),
              info=("graph", "mm_shape", "batch", "steps", "ranks", "precisions", "loops"))
    mm32, mm16 = m.get("matmul", "fp32") or math.nan, m.get("matmul", "bf16") or math.nan
    lines = [
        "# KGE training throughput: 1-N ComplEx-N3 loop vs pykeen's LCWA loop",
        "",
        "Command: `python -m pytest benchmarks/test_kge_train.py -q`",
        f"Date: {i['date']}",
        f"Machine: {i['machine']}; load average at the end {_load(m)}",
        f"Graph: {i['graph']}; batch {i['batch']} score rows, "
        f"{i['steps']} steps per measurement; Adagrad lr 0.1, N3 weight 5e-2, init std 1e-3 in both loops.",
        "",
        f"Plain GEMM {i['mm_shape']}: float32 {mm32:.0f} GFLOP/s" + f", bfloat16 {mm16:.0f} GFLOP/s ({mm16 / mm32:.1f}x).",
        "Useful FLOPs per step: 3 GEMMs x 2 x batch x 2d x N (the same for both loops).",
        "",
        "| rank d | loop | s per step | useful GFLOP/s | fraction of fp32 matmul rate | speed-up vs pykeen LCWA |",
        "|---|---|---|---|---|---|",
    ]
    for rank in ranks:
        base = m.get(f"{rank}/pykeen", "step_s")
        for key, label in loops:
            step, gflops = m.get(f"{rank}/{key}", "step_s"), m.get(f"{rank}/{key}", "gflops")
            if step is None or gflops is None or base is None:  # not applicable here (no bf16)
                continue
            lines.append(f"| {rank} | {label} | {step:.3f} | {gflops:.0f} | {gflops / mm32:.2f} | {base / step:.1f}x |")
    return "\n".join(lines) + "\n"


_LAZY_ENV = ("KGREASON_LAZY_ARTIFACT", "KGREASON_LAZY_QUERY_ARTIFACT", "KGREASON_EAGER_QUERY_ARTIFACT",
             "KGREASON_LAZY_QUERIES", "LAZY_BENCH_ROWS", "LAZY_BENCH_QUERIES")


def lazy_rows(m: Measurements) -> str:
    i = m.info
    row_columns, latency_columns, structs = i.get("row_columns", []), i.get("latency_columns", []), i.get("structs", [])
    m.require((["matmul"], ["gflops"]), (["cpp", "reference"], row_columns), (structs, latency_columns),
              info=("rows_data", "mm_shape", "rows", "n", "r", "d", "chunk", "threshold", "queries"),
              may_be_zero=("maxdiff",))
    r = {b: {c: m.get(b, c) for c in row_columns} for b in ("cpp", "reference") if m.get(b, "rows_s") is not None}
    lat = {s: {c: m.get(s, c) for c in latency_columns} for s in structs if m.get(s, "eager") is not None}
    if lat:
        m.require(info=("q_eager", "q_lazy", "q_file", "thr_eager", "thr_lazy", "eager_load_s", "eager_prepare_s",
                        "latency_backend"))
    mm = m.get("matmul", "gflops") or math.nan
    lines = [
        "# Lazy calibrated rows: rows/s vs matmul rate, and query latency lazy vs eager",
        "",
        "Command: `" + _env(m, *_LAZY_ENV).rstrip() + " python -m pytest benchmarks/test_lazy_rows.py -q`",
        f"Date: {i['date']}",
        f"Machine: {i['machine']}; load average at the end {_load(m)}",
        "(the machine is shared with other jobs: absolute numbers are noisy, ratios less so)",
        "",
        "## (a) Rows per second",
        "",
        f"Data: {i['rows_data']}; N = {i['n']:,}, R = {i['r']}, complex rank d = {i['d']}, threshold {i['threshold']:g}; "
        f"{i['rows']:,} random rows in chunks of {i['chunk']} through `LazyMatrices.rows` with an empty cache "
        "(GEMM + calibration + CSR pieces + cache fill), best of 3 rounds.",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| plain fp32 `torch.mm` {i['mm_shape']} (`kge.complex_n3.matmul_rate`, best of 3) | {mm:.1f} GFLOP/s |",
    ]
    for b, name in (("cpp", "fused kernel (`ops` backend cpp)"),
                    ("reference", "torch reference (`ops` backend reference, the former code)")):
        if b in r:
            x = r[b]
            lines.append(f"| {name}: rows/s, useful GEMM GFLOP/s, **ratio to torch.mm** | {x['rows_s']:,.0f} rows/s, "
                         f"{x['gflops']:.1f} GFLOP/s, **{x['gflops'] / mm:.2f}** (target >= 0.5) |")
    if "cpp" in r and "reference" in r:
        lines.append(f"| fused kernel / torch reference (rows/s) | **{r['cpp']['rows_s'] / r['reference']['rows_s']:.2f}x** |")
        lines.append(f"| kept entries per row | {r['cpp']['nnz_row']:.0f} |")
    if lat:
        lines += [
            "",
            "## (b) Query latency, lazy vs eager",
            "",
            f"Eager: {i['q_eager']} (threshold {i['thr_eager']:.6g}; loaded in {i['eager_load_s']:.1f} s, "
            f"the queries' relations prepared in {i['eager_prepare_s']:.1f} s, both untimed); "
            f"lazy: {i['q_lazy']} (its threshold {i['thr_lazy']:.6g}"
            + (f", computed at the eager one, {i['thr_eager']:.6g}" if i['thr_lazy'] != i['thr_eager'] else "")
            + f"); queries: the first {i['queries']} per structure of "
            f"{i['q_file']}, one at a time (`Executor.scores([q])`), ops backend "
            f"{i['latency_backend']}.  Cold: row cache emptied before "
            "every query; warm: every row the query needs cached.  Milliseconds per query, median (mean); "
            "ratios of the medians (means).  Rows computed: mean per query (a few queries need most of them).",
            "",
            "| structure | queries | eager ms | lazy cold ms | lazy warm ms | cold / eager | warm / eager | "
            "rows computed / query (cold) | max abs score diff |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in structs:
            if s in lat:
                x = lat[s]
                lines.append(
                    f"| {s} | {int(x['n'])} | {x['eager']:.2f} ({x['eager_mean']:.2f}) | {x['cold']:.2f} ({x['cold_mean']:.2f}) "
                    f"| {x['warm']:.2f} ({x['warm_mean']:.2f}) | {x['cold'] / x['eager']:.1f}x "
                    f"({x['cold_mean'] / x['eager_mean']:.1f}x) | {x['warm'] / x['eager']:.1f}x "
                    f"({x['warm_mean'] / x['eager_mean']:.1f}x) | {x['rows']:,.0f} | {x['maxdiff']:.2g} |")
        lines += [
            "",
            "Reading the latency table: a cold lazy query pays for its rows (GEMM + `calibrate_rows`, at the rate of "
            "part (a); the persisted row store is off here) and for gathering them into a compact stack with its "
            "transpose; a warm one reads each relation's cached rows as a one-relation stack prepared once "
            "(`kge.lazy.RowCache`), so what it adds to eager is one `ops.project` call and its Python per "
            "relation of the query.  On a loaded machine every thread-pool region of those small steps can also "
            "wait for a descheduled worker.",
        ]
    return "\n".join(lines) + "\n"


def ops_projection(m: Measurements) -> str:
    i = m.info
    cases, batches, kinds, methods = i.get("cases", []), i.get("batches", []), i.get("kinds", []), i.get("methods", [])
    rows = [f"{c['name']}|{b}|{k}" for c in cases for b in batches for k in kinds]
    m.require((rows, list(methods) + ["matrix_bytes"]), (["copy"], ["gb_s"]),
              info=("data", "cases", "batches", "kinds", "methods", "slice", "strategies"))
    missing = [r for r in rows if r not in i["strategies"]]
    if missing:
        m.require(info=[f"strategies[{r}]" for r in missing])
    bw = m.get("copy", "gb_s") or math.nan
    present = [x for x in methods if any(m.get(r, x) is not None for r in rows)]
    baselines = [x for x in present if not x.startswith("ours")]
    lines = [
        "# Projection throughput: `ops.project` vs baselines",
        "",
        "Command: `" + _env(m, "KGREASON_BENCH_THREADS") + _argv(m) + "`  ",
        f"Machine: {i['machine']}  ",
        f"Date: {i['date']}  ",
        f"Load average at the end of the run (1/5/15 min): {_load(m)} "
        "(the machine is shared with other jobs; numbers taken under load are noisy)  ",
        f"Data: {i['data']}  ",
        f"Plain copy bandwidth (torch copy_, 256 MB, read + write): {bw:.1f} GB/s",
        "",
        "Times are medians in ms.  Ratio columns: baseline time / our time (> 1 means ours is faster); "
        "`ours+out` writes into a preallocated, reused output (`out=`).",
        "`*` = timed on the first queries of the batch and scaled linearly to B.  ",
        "Effective bandwidth = (X read + Y written + the matrix entries the strategy must read: all of them "
        "for pull, the active rows for push) / our time.",
        "",
    ]
    skipped = [x for x in methods if x not in present]
    if skipped:
        lines += [f"Not measured (not installed): {', '.join(skipped)}", ""]
    for case in cases:
        lines += [f"## {case['name']} (N = {case['n']}, nnz = {case['nnz']})", ""]
        head = ["B", "X", "strategy", "ours ms", "ours+argmax ms", "ours+out ms"] + [f"{x} ms" for x in baselines] + \
               [f"{x} / ours" for x in baselines] + ["sparse.mm / ours+out", "eff. GB/s", "% of copy"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for b in batches:
            for kind in kinds:
                row_key = f"{case['name']}|{b}|{kind}"
                ours = m.get(row_key, "ours")
                if ours is None:  # not applicable (no compiled kernel)
                    continue
                row = [str(b), kind, i["strategies"][row_key], f"{ours * 1e3:.3f}"]
                oa, oo = m.get(row_key, "ours+argmax"), m.get(row_key, "ours+out")
                row.append(f"{oa * 1e3:.3f}" if oa else "-")
                row.append(f"{oo * 1e3:.3f}" if oo else "-")
                cells_t, cells_r = [], []
                for x in baselines:
                    t = m.get(row_key, x)
                    if t is None:
                        cells_t.append("-")
                        cells_r.append("-")
                        continue
                    star = "*" if i["slice"].get(x, b) < b else ""
                    cells_t.append(f"{t * 1e3:.2f}{star}")
                    cells_r.append(f"**{t / ours:.1f}x**" if x == "sparse.mm" else f"{t / ours:.1f}x")
                bytes_moved = 2 * b * case["n"] * 4 + (m.get(row_key, "matrix_bytes") or 0.0)
                eff = bytes_moved / ours / 1e9
                sp_mm = m.get(row_key, "sparse.mm")
                out_ratio = f"**{sp_mm / oo:.1f}x**" if (sp_mm and oo) else "-"
                row += cells_t + cells_r + [out_ratio, f"{eff:.1f}", f"{100 * eff / bw:.0f}%"]
                lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _fold_run(path: Path) -> dict | None:
    """One phase's run of the fold table: a saved :class:`Measurements` (this checkout: the ``after`` phase),
    or the JSON the pre-fold checkout's ``test_write_fold_table`` wrote (the ``before`` phase), or None."""
    if not path.is_file():
        return None
    obj = _read_json(path)
    if isinstance(obj, dict) and "results" in obj:  # written by the checkout before the fold
        return obj
    m = Measurements.from_json(obj, str(path))
    i = m.info
    keys = [f"{b}|{k}|{v}" for b in i.get("batches", []) for k in i.get("kinds", []) for v in i.get("variants", [])]
    m.require((keys, ("single_ms", "multi_ms", "rounds")), info=("data", "batches", "kinds", "variants", "strategies"))
    results = {}
    for key in keys:
        if m.get(key, "single_ms") is not None:
            results[key] = dict(single_ms=m.get(key, "single_ms"), multi_ms=m.get(key, "multi_ms"),
                                strategy=i["strategies"].get(key, "?"), rounds=m.get(key, "rounds"))
    return dict(results=results, date=i["date"], machine=i["machine"], load=_load(m), data=i["data"],
                command=_env(m, "KGREASON_BENCH_THREADS") + _argv(m), batches=i["batches"], kinds=i["kinds"],
                variants=i["variants"])


def ops_single_relation(m: Measurements) -> str:
    """The ``after`` run is ``m`` (saved as ``ops_single_relation_after.json``); the ``before`` run, when its file
    lies beside it (``ops_single_relation_before.json``, from the checkout before issue 23's fold), adds its
    columns."""
    folder = Path(m.source).parent if m.source else DEFAULT_SAVED
    runs = {phase: r for phase in ("before", "after")
            if (r := _fold_run(folder / f"ops_single_relation_{phase}.json")) is not None}
    before, after = runs.get("before"), runs.get("after")
    base = before or after or {"results": {}}  # (m itself is one of them)
    batches = (after or {}).get("batches") or [1, 16, 256, 1024]
    kinds = (after or {}).get("kinds") or ["onehot", "dense"]
    variants = (after or {}).get("variants") or ["values", "argmax", "negated", "negated+argmax"]
    lines = ["# The single-relation case: one-relation stack through the multi-relation kernel vs the single op",
             "",
             "Issue 23 folds `ops.project`, `ops.project_negated` and `ops.project_multi` into one kernel; this "
             "table is the evidence that a single relation (a one-relation stack, every row relation 0) loses "
             "nothing.  `single`: `ops.project(x, P)` / `ops.project_negated(x, P)` on the prepared matrix; "
             "`multi`: the same matrix as a stack of one relation (`ops.project_multi(x, zeros(B), S)` before the "
             "fold).  Both timed interleaved in one test (medians in ms), compiled CPU kernels, "
             "`validate=False`, strategy auto.  Ratio `multi / single` < 1: the multi kernel is faster.  The "
             "after columns compare runs made at different times (on a shared machine, at different loads); the "
             "before / after comparison made side by side in one run is "
             "[ops_fold_before_after.md](ops_fold_before_after.md).",
             ""]
    for phase, r in runs.items():
        lines += [f"**{phase}** run: `{r['command']}`  ", f"Machine: {r['machine']}  ",
                  f"Date: {r['date']}, load average at the end (1/5/15 min): {r['load']}  ", f"Data: {r['data']}", ""]
    first = "before" if before is not None else "after"  # the phase of the first columns
    head = ["B", "X", "variant", "strategy", f"{first}: single ms", f"{first}: multi ms", f"{first}: multi / single"]
    if before is not None and after is not None:
        head += ["after: `ops.project(x, P)` ms", "after: `ops.project(x, S, rel)` ms", "after P / before single"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in batches:
        for kind in kinds:
            for variant in variants:
                key = f"{b}|{kind}|{variant}"
                r = base["results"].get(key)
                if r is None:
                    continue
                row = [str(b), kind, variant, r["strategy"], f"{r['single_ms']:.3f}", f"{r['multi_ms']:.3f}",
                       f"**{r['multi_ms'] / r['single_ms']:.2f}x**"]
                if before is not None and after is not None:
                    a = after["results"].get(key)
                    row += ([f"{a['single_ms']:.3f}", f"{a['multi_ms']:.3f}",
                             f"**{a['single_ms'] / r['single_ms']:.2f}x**"] if a else ["-", "-", "-"])
                lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return "\n".join(lines) + "\n"


def ops_project_multi(m: Measurements) -> str:
    i = m.info
    cases = i.get("cases", [])
    rows = [f"{kind}|{b}|{'neg' if neg else 'plain'}" for kind, b, neg in cases]
    m.require((rows, ("multi", "loop", "distinct", "push", "sweep", "pull", "zeros_ms")), info=("data", "cases"),
              may_be_zero=("push", "sweep", "pull"))
    lines = [
        "# Multi-relation projection: one `ops.project(X, M, rel)` call vs a per-relation loop of `ops.project`",
        "",
        "Command: `" + _env(m, "KGREASON_BENCH_THREADS") + _argv(m) + "`  ",
        f"Machine: {i['machine']}  ",
        f"Load average at the end of the run (1/5/15 min): {_load(m)} "
        "(the machine is shared with other jobs; numbers taken under load are noisy)  ",
        f"Data: {i['data']}",
        "",
        "Medians in ms (values only, `validate=False`).  `loop / multi` > 1: the single call is faster.  "
        "`push / sweep / pull rows`: how `strategy=\"auto\"` handled the rows (push: scatter from the row's "
        "active entities; sweep: scatter from the relation's own entries; pull: gather per column, rows of a "
        "relation in tiles).  "
        "`zeros ms`: `torch.zeros(B, N)` alone, a fresh (B, N) float32 output with its page faults, in the same "
        "run (the floor of any op that allocates its output).",
        "",
        "| X | B | negated | distinct relations | push / sweep / pull rows | multi ms | loop ms | loop / multi "
        "| zeros ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (kind, b, negated), key in zip(cases, rows):
        multi, loop = m.get(key, "multi"), m.get(key, "loop")
        if multi is None or loop is None:  # not applicable (no compiled kernel)
            continue
        plans = " / ".join(str(int(m.get(key, c) or 0)) for c in ("push", "sweep", "pull"))
        lines.append(f"| {kind} | {b} | {'yes' if negated else 'no'} | {int(m.get(key, 'distinct') or 0)} | {plans} | "
                     f"{multi * 1e3:.2f} | {loop * 1e3:.2f} | **{loop / multi:.1f}x** | "
                     f"{m.get(key, 'zeros_ms') or 0:.2f} |")
    return "\n".join(lines) + "\n"


def paths(m: Measurements) -> str:
    i = m.info
    dijkstra = i.get("dijkstra", [])
    modes, num_sources = i.get("karpa_modes", []), i.get("num_sources", 0)
    timed = [f"dijkstra/{key}" for key, _ in dijkstra if key != "heapq"]
    m.require(([f"dijkstra/{key}" for key, _ in dijkstra], ("seconds", "cpu", "sources")),
              (timed, ("ratio_wall", "ratio_cpu")),
              ([f"karpa/{mode}" for mode in modes], ("per_topic_1", f"per_topic_{num_sources}", "planned_path_ranked_first")),
              (["karpa-setup"], ("seconds",)), (["karpa-heuristic-cold"], ("seconds", "new_texts")),
              info=("graph", "dijkstra_rounds", "dijkstra", "karpa_modes", "num_sources", "dijkstra_sources",
                    "heapq_sources", "threads", *(f"load/{key}" for key, _ in dijkstra)),
              # a count and a fraction that a poor run may leave at 0 (the table then shows it)
              may_be_zero=("planned_path_ranked_first", "new_texts"))
    n_src, n_heapq = i["dijkstra_sources"], i["heapq_sources"]
    stat: dict[str, dict[str, float]] = {
        key: {c: m.get(f"dijkstra/{key}", c) or math.nan for c in ("seconds", "cpu", "sources")} for key, _ in dijkstra}
    ours = stat["ours-auto"]["seconds"] / n_src
    heapq_s = stat["heapq"]["seconds"] / n_heapq
    ours_cpu = stat["ours-auto"]["cpu"] / n_src
    lines = [
        "# Relation-path search benchmarks (engine.paths)",
        "",
        "Command: `python -m pytest benchmarks/test_paths_bench.py --benchmark-columns=mean,stddev,rounds -q`",
        f"Machine: {i['machine']}",
        f"Load average at the end of the run (1/5/15 min): {_load(m)}. The machine was shared with other helpers' "
        "jobs: absolute times are noisy; the ratios were measured side by side in the same run.",
        f"Graph: {i['graph']}; {n_src} random sources (all targets), random relation costs U[0, 1).",
        "",
        "## Batched single-source shortest paths (all targets)",
        "",
        f"{i['dijkstra_rounds']} interleaved rounds (every implementation once per round, after an untimed warm-up "
        "round); wall and CPU times are medians over the rounds, \"scipy / this\" is the median over the rounds of "
        "the ratio within a round. CPU time is the process CPU time of the call summed over threads (the per-core "
        "cost; scipy uses one thread). Same answers: the op's strategies are identical bit for bit, scipy "
        "(float64) agrees to float32 rounding (checked in the run).",
        "",
        "| implementation | sources | wall ms / source | CPU ms / source | scipy / this (wall) "
        "| scipy / this (CPU) | load avg during the rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in dijkstra:
        st = stat[key]
        per = st["seconds"] / st["sources"]
        cpu_per = st["cpu"] / st["sources"]
        if key == "heapq":
            ratio_w = f"{stat['scipy']['seconds'] / n_src / per:.3f}x (1 run)"
            ratio_c = f"{stat['scipy']['cpu'] / n_src / cpu_per:.3f}x"
        else:
            ratio_w = f"**{m.get(f'dijkstra/{key}', 'ratio_wall'):.2f}x**"
            ratio_c = f"**{m.get(f'dijkstra/{key}', 'ratio_cpu'):.2f}x**"
        lines.append(f"| {label} | {int(st['sources'])} | {per * 1e3:.3f} | {cpu_per * 1e3:.3f} | {ratio_w} "
                     f"| {ratio_c} | {i[f'load/{key}']} |")
    before = stat["ours-radix"]["seconds"] / n_src
    lines += ["", f"Default vs scipy (wall clock, {i['threads']} threads): "
              f"**{m.get('dijkstra/ours-auto', 'ratio_wall'):.1f}x**; per core (CPU time): "
              f"**{m.get('dijkstra/ours-auto', 'ratio_cpu'):.1f}x**. Before/after (the previous default, "
              f"Dijkstra with the radix heap, in the same rounds): {before * 1e3:.3f} -> {ours * 1e3:.3f} wall ms "
              f"/ source ({before / ours:.1f}x). Plain-Python heapq is {heapq_s / ours:.0f}x slower per source "
              f"than the default (CPU: {stat['heapq']['cpu'] / n_heapq / ours_cpu:.0f}x).", ""]
    lines += [
        "## KARPA retrieval latency per topic entity (all-MiniLM-L6-v2, K = 16, 2-hop plans)",
        "",
        "| mode | batch 1 (ms / topic) | batch 1,000 (ms / topic) |",
        "|---|---|---|",
    ]
    for mode in modes:
        b1 = m.get(f"karpa/{mode}", "per_topic_1") or math.nan
        bn = m.get(f"karpa/{mode}", f"per_topic_{num_sources}") or math.nan
        lines.append(f"| {mode} | {b1 * 1e3:.2f} | {bn * 1e3:.2f} |")
    lines.append("")
    lines.append(f"Retriever setup (model load + 474 relation embeddings, or the artifact cache): "
                 f"{m.get('karpa-setup', 'seconds'):.1f} s.")
    lines.append(f"Heuristic mode, first batch of 1,000 (cold sequence cache): "
                 f"{m.get('karpa-heuristic-cold', 'seconds'):.1f} s, "
                 f"{int(m.get('karpa-heuristic-cold', 'new_texts') or 0)} new sequence texts embedded; "
                 "the table shows the warm cache.")
    for mode in modes:
        lines.append(f"{mode}: the planned relation path is ranked first for "
                     f"{100 * (m.get(f'karpa/{mode}', 'planned_path_ranked_first') or 0):.1f}% of the 1,000 topics.")
    lines.append("")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Table:
    """A table's renderer (checks the cells it needs, returns the Markdown) and the benchmark file measuring it."""

    render: Callable[[Measurements], str]
    bench: str


#: Every table, by the ``table`` name a saved run carries.
TABLES: dict[str, Table] = {
    "engine_throughput": Table(engine_throughput, "benchmarks/test_engine_throughput.py"),
    "kge_build": Table(kge_build, "benchmarks/test_kge_build.py"),
    "kge_train": Table(kge_train, "benchmarks/test_kge_train.py"),
    "lazy_rows": Table(lazy_rows, "benchmarks/test_lazy_rows.py"),
    "ops_projection": Table(ops_projection, "benchmarks/test_ops_bench.py"),
    "ops_single_relation": Table(ops_single_relation, "benchmarks/test_ops_bench.py"),
    "ops_project_multi": Table(ops_project_multi, "benchmarks/test_ops_project_multi.py"),
    "paths": Table(paths, "benchmarks/test_paths_bench.py"),
}


def table_of(name: str) -> str:
    """The table a saved name belongs to: the longest table name it starts with (``ops_projection_1thread``:
    ``ops_projection``)."""
    found = [t for t in TABLES if name == t or name.startswith(t + "_")]
    if not found:
        raise unknown_name("report", name, sorted(TABLES))
    return max(found, key=len)


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        return loads_json(text)
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None


def saved_file(folder: str | os.PathLike, name: str) -> Path:
    """Where the run of the report ``name`` is saved (the fold table's: its ``after`` phase)."""
    return Path(folder) / (f"{name}_after.json" if name == "ops_single_relation" else f"{name}.json")


def load(folder: str | os.PathLike, name: str) -> Measurements:
    """The run saved as ``<folder>/<name>.json``; a missing file says which command saves it."""
    table = table_of(name)
    path = saved_file(folder, name)
    if not path.is_file():
        raise UserError(f"{path}: no saved measurements for the report {name}; measure first: "
                          f"python -m pytest {TABLES[table].bench} --bench-out {folder}")
    m = Measurements.from_json(_read_json(path), str(path))
    if m.table != table:
        raise UserError(f"{path}: holds a run of the table {m.table!r}, not {table!r}")
    return m


def render(m: Measurements) -> str:
    """The table's Markdown; raises the one-line ``UserError`` naming every missing cell first."""
    m.require(info=("machine", "date", "load"))
    return TABLES[m.table].render(m)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="tables: " + ", ".join(TABLES) + " (a name may add a variant suffix, e.g. "
                       "ops_projection_1thread, as the run saved it)")
    p.add_argument("names", nargs="+", metavar="NAME", help="the saved runs to write (<NAME>.json in --from)")
    p.add_argument("--from", dest="saved", default=str(DEFAULT_SAVED),
                   help=f"the folder the benchmark run saved into (its --bench-out; default {DEFAULT_SAVED})")
    p.add_argument("--results", default=str(RESULTS),
                   help=f"an existing folder where the tables go, each replacing its namesake (default {RESULTS})")
    args = p.parse_args(argv)
    outs = {name: check_output_file(Path(args.results) / f"{name}.md", what="--results",
                                    inputs=[("--from", saved_file(args.saved, name))]) for name in args.names}
    # every name checked before any table is written: one bad name leaves all tables alone
    texts = {name: render(load(args.saved, name)) for name in args.names}
    for name, text in texts.items():
        out = write_output(outs[name], text, what="--results")
        print(text, end="")
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
