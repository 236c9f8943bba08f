"""benchmarks/query_latency.py in one process on UMLS: every query's answers kept, a --plan run repeats each query's
mode, --compare counts equal answers, --table prints the runs side by side.  (Under torchrun: the 1M run of
benchmarks/results/large_kg_1m.md and benchmarks/large_kg_1m.sh's small run; its --timeout refusal there is
checked before the group is joined.)"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("query_latency", Path(__file__).resolve().parent.parent
                                               / "benchmarks" / "query_latency.py")
assert _spec is not None and _spec.loader is not None
ql = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("query_latency", ql)
_spec.loader.exec_module(ql)


def test_runs_plan_compare_and_table(umls_tiny_artifact, tmp_path, capsys):
    from engine.eval.sampling import sample_queries, write_jsonl
    from engine.exec.api import Engine

    art = Engine.load(umls_tiny_artifact).artifact
    qs, _ = sample_queries(art, ["1p", "2p", "pin", "up"], 2, seed=0, progress=False)
    write_jsonl(qs, tmp_path / "q.jsonl", art)
    base = ["--artifact", str(umls_tiny_artifact), "--queries", str(tmp_path / "q.jsonl"), "--per-structure", "2"]
    assert ql.main(base + ["--timeout", "60", "--json", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    assert len(a["queries"]) == 8 and all(q["frontier_k"] is None and q["answers"] for q in a["queries"])
    assert set(a["structures"]) == {"1p", "2p", "pin", "up"} and a["ranks"] == 1
    # the plan says k = 2 for one query: only that one is answered with the cut, and only it may differ
    plan = json.loads((tmp_path / "a.json").read_text())
    plan["queries"][2]["frontier_k"] = 2
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert ql.main(base + ["--plan", str(tmp_path / "plan.json"), "--compare", str(tmp_path / "a.json"),
                           "--json", str(tmp_path / "b.json")]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert [q["frontier_k"] for q in b["queries"]] == [None, None, 2] + [None] * 5
    assert b["compare"]["compared"] == 7 and b["compare"]["same"] == 7  # the k = 2 query is not compared with exact
    assert "k=2" in b["structures"][b["queries"][2]["structure"]]
    capsys.readouterr()
    assert ql.main(["--table", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| structure | P = 1, exact: median / max s |") and len(out) == 2 + 4 + 3
    assert out[-1] == "| same answers as | - | 7 / 7 (scores within 0.0e+00) |"


@pytest.mark.parametrize("a, b, same", [([[1, 0.5], [2, 0.25]], [[1, 0.5], [2, 0.25 + 1e-7]], True),
                                        ([[1, 0.5], [2, 0.25]], [[2, 0.25], [1, 0.5]], False),
                                        ([[1, 0.5]], [[1, 0.6]], False), ([[1, 0.5]], [[1, 0.5], [2, 0.1]], False)])
def test_same_answers(a, b, same):
    assert ql.same_answers(a, b) is same
