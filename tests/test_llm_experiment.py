"""``python -m experiments.lgot_eval``: KG-only vs LLM-only vs LGOT on a generated artifact (simulator on 127.0.0.1)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _llm_server import simulator
from experiments.lgot_eval import main, output_paths, parse_args

GRID = ["--structures", "1p", "2p", "pin", "--per-structure", "5", "--recall", "1.0", "0.5",
        "--hallucination", "0", "0.3", "--batch-size", "8", "--quiet"]


def _metrics(record: dict):
    """Every (structure or mean) metric value of every method in a record."""
    blocks = [record["kg_only"]] + record["runs"]
    for b in blocks:
        for tie in b["mean"].values():
            yield from tie.values()
        for per in b["structures"].values():
            for tie in per.values():
                yield from tie.values()


@pytest.fixture(scope="module")
def sim_run(llm_artifact, tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "results"  # created by the experiment
    argv = ["--artifact", str(llm_artifact), "--out", str(out), "--name", "tiny", *GRID]
    assert main(argv) == 0
    return argv, out, json.loads((out / "tiny_sim.json").read_text(encoding="utf-8"))


def test_outputs_and_metric_ranges(sim_run):
    argv, out, rec = sim_run
    for ext in ("md", "json", "png"):
        assert (out / f"tiny_sim.{ext}").stat().st_size > 0
    assert (out / "tiny_sim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rec["queries"]["counts"] == {"1p": 5, "2p": 5, "pin": 5}
    values = list(_metrics(rec))
    assert values and all(0.0 <= v <= 1.0 for v in values)
    # 2 recall x 2 hallucination x (LLM-only, LGOT)
    assert len(rec["runs"]) == 8 and {r["method"] for r in rec["runs"]} == {"llm-only", "lgot"}
    for r in rec["runs"]:
        c = r["cost"]
        assert c["prompts"] > 0 and c["requests"] > 0 and c["prompt_tokens"] > 0 and c["completion_tokens"] > 0
        assert c["failed_rows"] == 0 and r["wall_ms_per_query"] > 0
    md = (out / "tiny_sim.md").read_text(encoding="utf-8")
    assert "| KG-only |" in md and "Where LGOT does not win" in md and "Cache replay" in md


def test_oracle_llm_and_lgot_not_below_kg(sim_run):
    _, _, rec = sim_run
    oracle = {r["method"]: r for r in rec["runs"] if r["recall"] == 1.0 and r["hallucination"] == 0.0}
    llm = oracle["llm-only"]["mean"]["average"]
    lgot = oracle["lgot"]["mean"]["average"]
    kg = rec["kg_only"]["mean"]["average"]
    assert oracle["llm-only"]["structures"]["1p"]["average"]["hits@1"] == pytest.approx(1.0)
    assert llm["hits@1"] >= 0.8
    for k in ("hits@1", "hits@3", "hits@10", "mrr"):
        assert lgot[k] >= kg[k] - 1e-12


def test_cache_replay_is_free_and_identical(sim_run):
    _, _, rec = sim_run
    rp = rec["replay"]
    assert rp["identical_metrics"] is True
    assert rp["warm"]["requests"] == 0 and rp["warm"]["cache_hits"] == rp["warm"]["prompts"] > 0
    assert rp["cold"]["requests"] > 0


def test_existing_outputs_need_overwrite(sim_run, capsys):
    argv, out, _ = sim_run
    before = (out / "tiny_sim.json").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err and "Traceback" not in err
    assert (out / "tiny_sim.json").read_bytes() == before  # untouched


@pytest.mark.parametrize("bad, needle", [
    (["--recall", "1.5"], "--recall"),
    (["--per-structure", "0"], "--per-structure"),
    (["--structures", "9p"], "9p"),
    (["--no-such-flag"], "unrecognized"),
    (["--answer-check", "11"], "--answer-check"),
    (["--recall", "0.5", "--llm-base-url", "http://127.0.0.1:1/v1"], "--recall"),
    # Regression: values past the simulator's own range passed the flags and failed mid-run.
    (["--noise", "11"], "--noise must be in [0, 10], got 11.0"),
    (["--sim-latency-ms", "1e9"], "--sim-latency-ms must be in [0, 600000], got 1000000000.0"),
])
def test_bad_flags_are_one_line_errors(llm_artifact, tmp_path, capsys, bad, needle):
    assert main(["--artifact", str(llm_artifact), "--out", str(tmp_path / "o"), *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_output_names_do_not_collide(llm_artifact, tmp_path):
    sim = parse_args(["--artifact", str(llm_artifact), "--out", str(tmp_path)])
    srv = parse_args(["--artifact", str(llm_artifact), "--out", str(tmp_path), "--llm-base-url",
                      "http://127.0.0.1:8080/v1", "--llm-model", "SmolLM2 135M/q4"])
    assert output_paths(sim)["md"].name == f"{Path(llm_artifact).name}_sim.md"
    assert output_paths(srv)["json"].name == f"{Path(llm_artifact).name}_server_SmolLM2-135M-q4.json"


def test_server_mode_against_any_openai_compatible_server(llm_artifact, tmp_path):
    """``--llm-base-url``: no simulator grid, one run per (θ, method), with its own cache file."""
    cache = tmp_path / "cache.sqlite"
    with simulator(llm_artifact, recall=0.9, hallucination=0.1, seed=3) as srv:
        argv = ["--artifact", str(llm_artifact), "--out", str(tmp_path), "--name", "tiny", "--structures", "1p", "2p",
                "--per-structure", "4", "--theta", "0", "0.3", "--quiet", "--llm-base-url", srv.base_url,
                "--llm-model", "some-model", "--llm-cache", str(cache), "--questions-dir", str(tmp_path / "rq")]
        assert main(argv) == 0
    rec = json.loads((tmp_path / "tiny_server_some-model.json").read_text(encoding="utf-8"))
    assert [(r["method"], r["theta"]) for r in rec["runs"]] == [("llm-only", 0.0), ("lgot", 0.0),
                                                                ("llm-only", 0.3), ("lgot", 0.3)]
    assert all(0.0 <= v <= 1.0 for v in _metrics(rec))
    assert rec["setup"]["mode"] == "llm" and rec["setup"]["prompts"] > 0
    assert rec["replay"]["warm"]["requests"] == 0 and cache.is_file()
    assert (tmp_path / "tiny_server_some-model.png").is_file() and (tmp_path / "tiny_server_some-model.md").is_file()


def test_answer_check_is_passed_through(llm_artifact, tmp_path):
    out = tmp_path / "o"
    argv = ["--artifact", str(llm_artifact), "--out", str(out), "--name", "chk", "--structures", "1p",
            "--per-structure", "3", "--recall", "1.0", "--hallucination", "0", "--no-replay", "--quiet",
            "--answer-check", "2"]
    assert main(argv) == 0
    record = json.loads((out / "chk_sim.json").read_text(encoding="utf-8"))
    assert record["answer_check"] == 2
    for run in record["runs"]:
        assert 0 < run["cost"]["checks"] <= 2 * 3 and run["cost"]["failed_checks"] == 0
        assert run["model"].endswith("-c2")
