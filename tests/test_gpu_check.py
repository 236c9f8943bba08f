"""benchmarks/gpu_check.sh, the one command for a lent GPU machine, as far as a CPU machine can run it.

The fast tests check its argument errors, the budget rule (every step skipped, the report still written)
and the end-to-end comparer; the slow one runs the whole --dry-run on a tiny artifact: every step's CPU
variant, the report with one row per step and the tables the steps wrote.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ("env", "build", "tests", "ops-bench", "crossover", "e2e", "sanitize")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def _rows(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in STEPS:
            rows[cells[0]] = cells
    return rows


@pytest.mark.parametrize("args, message", [
    ([], "--out DIR is required"),
    (["--out", "{tmp}/r", "--budget", "ten"], "--budget 'ten' is not a whole number"),
    (["--out", "{tmp}/r", "--frobnicate"], "unknown argument '--frobnicate'"),
    (["--out", "{tmp}/r", "--artifact", "{tmp}"], "--artifact {tmp}: no meta.json there"),
    (["--out", "{tmp}/r", "--queries", "{tmp}/none.jsonl"], "--queries {tmp}/none.jsonl: no such file"),
    (["--out", "{tmp}/r", "--queries", "{tmp}/q.jsonl"], "--artifact and --queries go together"),
    (["--out", "{tmp}/r", "--steps", "env,bogus"], "--steps: unknown step 'bogus' (choose from env,build,"),
])
def test_bad_arguments_are_one_error_line(tmp_path, args, message):
    (tmp_path / "q.jsonl").write_text("")
    proc = _run(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gpu_check.sh: "), proc.stderr
    assert message.format(tmp=tmp_path) in lines[0]
    assert not (tmp_path / "r").exists()


def test_no_budget_skips_every_step_and_still_reports(tmp_path):
    proc = _run("--dry-run", "--out", str(tmp_path / "r"), "--budget", "0")
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "r" / "report.md").read_text()
    rows = _rows(report)
    assert set(rows) == set(STEPS)
    for name in STEPS:
        assert rows[name][2] == "skipped", rows[name]
    assert rows["sanitize"][3] == "dry run"
    assert "no --artifact/--queries given" in rows["e2e"][3]
    assert "0 s of the budget left" in rows["env"][3]
    # the report folder holds what a device call returns: a few plain files, no scratch left behind
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["gpu_check.log", "report.md"]


def test_steps_runs_only_the_named_steps(tmp_path):
    proc = _run("--dry-run", "--out", str(tmp_path / "r"), "--steps", "env", "--budget", "100")
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "r" / "report.md").read_text()
    rows = _rows(report)
    assert rows["env"][2] == "ok" and "torch" in rows["env"][3]
    for name in STEPS[1:]:
        assert rows[name][2:] == ["skipped", "not in --steps"], rows[name]
    assert "--budget 100 --steps env`" in report


def _eval_json(path: Path, mrr: float) -> None:
    metrics = {"mrr": mrr, "hits@1": 0.5}
    path.write_text(json.dumps({"results": [
        {"structure": "1p", "num_queries": 3, "metrics": {"average": metrics, "optimistic": metrics}},
        {"structure": "2p", "num_queries": 2, "metrics": {"average": metrics, "optimistic": metrics}}]}))


@pytest.mark.parametrize("cpu_mrr, rc, verdict", [
    (0.25, 0, "identical metrics"),
    (0.25 + 5e-6, 0, "metrics differ by at most 5.00e-06"),
    (0.26, 1, "metrics differ by at most 1.00e-02"),
])
def test_e2e_comparer(tmp_path, cpu_mrr, rc, verdict):
    _eval_json(tmp_path / "eval-cuda.json", 0.25)
    _eval_json(tmp_path / "eval-cpu.json", cpu_mrr)
    (tmp_path / "eval-cuda.time").write_text("100.0 101.0")
    (tmp_path / "eval-cpu.time").write_text("200.0 204.0")
    (tmp_path / "eval-cuda.txt").write_text("| mean | 5 |\n(5 queries, ties=average; load 0.5 s, evaluate 0.25 s)\n")
    (tmp_path / "eval-cpu.txt").write_text("(5 queries, ties=average; load 1.0 s, evaluate 2.5 s)\n")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check_e2e.py"), str(tmp_path), "cuda", "cpu"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert ("engine.evaluate, cuda: 5 queries in 1.00 s (5.0 queries/s, whole process; evaluation alone 0.25 s, "
            "20.0 queries/s)") in proc.stdout
    assert "ratio cpu / cuda: whole process 4.00x, evaluation alone 10.00x" in proc.stdout
    assert "| 1p | 3 | 25.00 |" in proc.stdout
    assert f"cuda vs cpu: {verdict}" in proc.stdout


@pytest.mark.slow
def test_dry_run_runs_every_step(tmp_path, umls_tiny_artifact):
    queries = tmp_path / "q.jsonl"
    from engine.sample import main as sample_main

    assert sample_main(["--artifact", str(umls_tiny_artifact), "--per-structure", "2", "--seed", "0",
                        "--out", str(queries), "--no-require-hard"]) == 0
    proc = _run("--dry-run", "--out", str(tmp_path / "r"), "--artifact", str(umls_tiny_artifact),
                "--queries", str(queries), timeout=300)
    report = (tmp_path / "r" / "report.md").read_text()
    assert proc.returncode == 0, report
    rows = _rows(report)
    assert set(rows) == set(STEPS)
    for name in STEPS[:-1]:
        assert rows[name][2] == "ok", rows[name]
    assert rows["sanitize"][2:] == ["skipped", "dry run"]
    assert "torch" in report and "cores:" in report
    assert "# ops.project on CPU" in report  # the ops benchmark's table, quick, on the CPU
    assert "engine.evaluate, cpu:" in report and "| 1p |" in report
    assert (tmp_path / "r" / "ops_cuda_bench.md").is_file()
