"""The benchmark report script (benchmarks/report.py): saved measurements -> benchmarks/results/<name>.md.

A complete saved run writes its table (in the committed table's format: the same header row); a missing
cell fails with one error line naming it, and nothing is written (the committed table is left alone).
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
COMMON = {"machine": "test machine, 2 cores", "date": "2026-11-28 12:00 UTC", "load": [1.0, 1.0, 1.0],
          "argv": ["benchmarks/test_x.py", "-q"], "threads": 2, "env": {}}


@pytest.fixture(scope="module")
def report():
    """benchmarks/report.py as a module (benchmarks/ is no package on the test path)."""
    spec = importlib.util.spec_from_file_location("kgreason_bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _fill(m, rows, columns, value=2.0):
    for r in rows:
        for c in columns:
            m.put(r, c, value)


def complete_run(report, table: str):
    """A saved run of ``table`` with every cell and run detail its table needs (small layouts)."""
    m = report.Measurements(table)
    m.info.update(COMMON)
    if table == "engine_throughput":
        cols = ["loop", "b1", "sparse", "b1024", "faults", "faults_1pass", "b1024_1pass", "qto", "qto_densify"]
        m.info.update(structures=["1p", "2in"], columns=cols, data="synthetic", backend="cpp", pass_rows=64,
                      tnorm="product", neg_scale=QTO_NEG_SCALE, n_small=1024, b_large=1024, rounds=7, qto_queries=4)
        _fill(m, ["1p", "2in"], cols)
        m.put("2in", "faults", 0.0)  # page faults may be 0
    elif table == "kge_build":
        m.info.update(embeddings="random", threshold=0.001, mm_shape="(8, 200) @ (200, 10)", qto_threshold=2e-4)
        _fill(m, ["build"], ["mm_gflops", "cal_gflops", "cal_seconds", "rows", "relations", "full_seconds",
                             "nnz_subset", "nnz_full_estimate", "chunk", "n", "r", "d", "low_seconds", "low_nnz"])
    elif table == "kge_train":
        loops = [["pykeen", "pykeen LCWA (float32)"], ["1n_fp32", "1-N ComplEx-N3, float32"],
                 ["1n_bf16", "1-N ComplEx-N3, bf16 GEMMs"]]
        m.info.update(graph="random", mm_shape="(1000, 512) @ (512, 14505)", batch=1000, steps=12, ranks=[64],
                      precisions=["fp32", "bf16"], loops=loops)
        _fill(m, ["matmul"], ["fp32", "bf16"])
        _fill(m, ["64/pykeen", "64/1n_fp32"], ["step_s", "gflops"])
        for c in ("step_s", "gflops"):
            m.not_applicable("64/1n_bf16", c, "no bf16 GEMM on this CPU")
    elif table == "lazy_rows":
        rc = ["rows_s", "gflops", "seconds", "nnz_row"]
        lc = ["eager", "cold", "warm", "eager_mean", "cold_mean", "warm_mean", "n", "rows", "maxdiff"]
        m.info.update(row_columns=rc, latency_columns=lc, structs=["1p"], queries=20, rows_data="synthetic",
                      mm_shape="(8, 512) @ (512, 10)", rows=32, n=10, r=4, d=256, chunk=8, threshold=2e-4,
                      q_eager="e", q_lazy="l", q_file="q.jsonl", thr_eager=1e-3, thr_lazy=1e-3, eager_load_s=1.0,
                      eager_prepare_s=1.0, latency_backend="cpp")
        _fill(m, ["matmul"], ["gflops"])
        _fill(m, ["cpp", "reference"], rc)
        _fill(m, ["1p"], lc)
        m.put("1p", "maxdiff", 0.0)
    elif table == "ops_projection":
        methods = ["ours", "ours+argmax", "ours+out", "sparse.mm", "reference", "qto_loop", "torch_sparse", "graphblas"]
        m.info.update(data="synthetic", cases=[dict(name="synthetic", n=10, nnz=20)], batches=[1, 16],
                      kinds=["onehot"], methods=methods, slice={"reference": 16, "qto_loop": 2},
                      strategies={"synthetic|1|onehot": "push", "synthetic|16|onehot": "push"})
        rows = ["synthetic|1|onehot", "synthetic|16|onehot"]
        _fill(m, rows, methods[:6] + ["matrix_bytes"])
        for r in rows:
            for method in ("torch_sparse", "graphblas"):
                m.not_applicable(r, method, "not installed")
        m.put("copy", "gb_s", 10.0)
    elif table == "ops_single_relation":
        m.name = "ops_single_relation_after"
        m.info.update(data="synthetic", batches=[1], kinds=["onehot"], variants=["values"],
                      strategies={"1|onehot|values": "push"})
        _fill(m, ["1|onehot|values"], ["single_ms", "multi_ms", "rounds"])
    elif table == "ops_project_multi":
        m.info.update(data="synthetic", cases=[["onehot", 1024, False], ["dense", 256, True]])
        _fill(m, ["onehot|1024|plain", "dense|256|neg"], ["multi", "loop", "distinct", "push", "sweep", "pull",
                                                          "zeros_ms"])
        m.put("onehot|1024|plain", "pull", 0)
    elif table == "paths":
        dijkstra = [["ours-auto", "kgreason C++ op, default"], ["ours-radix", "radix"], ["scipy", "scipy"],
                    ["heapq", "plain Python heapq"]]
        m.info.update(graph="FB15k-237", dijkstra_rounds=5, dijkstra=dijkstra, karpa_modes=["pathfinding"],
                      num_sources=1000, dijkstra_sources=300, heapq_sources=10,
                      **{f"load/{k}": "1.0-1.5" for k, _ in dijkstra})
        _fill(m, [f"dijkstra/{k}" for k, _ in dijkstra], ["seconds", "cpu", "sources"])
        _fill(m, [f"dijkstra/{k}" for k, _ in dijkstra if k != "heapq"], ["ratio_wall", "ratio_cpu"])
        _fill(m, ["karpa/pathfinding"], ["per_topic_1", "per_topic_1000", "planned_path_ranked_first"])
        _fill(m, ["karpa-setup"], ["seconds"])
        _fill(m, ["karpa-heuristic-cold"], ["seconds", "new_texts"])
    else:
        raise AssertionError(f"no complete run for {table}")
    return m


def _header_row(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| "))


@pytest.mark.parametrize("table", ["engine_throughput", "kge_build", "kge_train", "lazy_rows", "ops_projection",
                                   "ops_single_relation", "ops_project_multi", "paths"])
def test_a_complete_run_writes_the_table_in_its_committed_format(report, table, tmp_path, capsys):
    assert table in report.TABLES
    saved, results = tmp_path / "saved", tmp_path / "results"
    results.mkdir()
    complete_run(report, table).save(saved)
    if table == "ops_single_relation":  # the before phase, as the checkout before the fold wrote it
        before = dict(results={"1|onehot|values": dict(single_ms=2.0, multi_ms=1.0, strategy="push", rounds=5)},
                      date="2026-11-25 19:08 UTC", machine="m", load="1.0 / 1.0 / 1.0", data="synthetic",
                      command="python -m pytest benchmarks/test_ops_bench.py -k fold")
        (saved / "ops_single_relation_before.json").write_text(json.dumps(before))
    assert report.main([table, "--from", str(saved), "--results", str(results)]) == 0
    text = (results / f"{table}.md").read_text(encoding="utf-8")
    assert "test machine, 2 cores" in text or table == "ops_single_relation" and "Machine: m" in text
    committed = sorted((ROOT / "benchmarks" / "results").glob(f"{table}*.md"))[0].read_text(encoding="utf-8")
    assert _header_row(text) == _header_row(committed)  # the table's columns as committed
    assert f"wrote {results / f'{table}.md'}" in capsys.readouterr().err


def test_a_variant_name_uses_its_table(report, tmp_path):
    m = complete_run(report, "ops_projection")
    m.name = "ops_projection_1thread"
    m.info["env"] = {"KGREASON_BENCH_THREADS": "1"}
    m.save(tmp_path)
    assert report.main(["ops_projection_1thread", "--from", str(tmp_path), "--results", str(tmp_path)]) == 0
    text = (tmp_path / "ops_projection_1thread.md").read_text(encoding="utf-8")
    assert "Command: `KGREASON_BENCH_THREADS=1 python -m pytest benchmarks/test_x.py -q`" in text


def test_a_missing_cell_fails_naming_it_and_writes_nothing(report, tmp_path, capsys):
    saved, results = tmp_path / "saved", tmp_path / "results"
    results.mkdir()
    committed = results / "engine_throughput.md"
    committed.write_text("the committed table\n")
    m = complete_run(report, "engine_throughput")
    del m.values[("2in", "b1024")], m.values[("1p", "qto")], m.values[("2in", "qto")]
    del m.info["pass_rows"]
    m.save(saved)
    assert report.main(["engine_throughput", "--from", str(saved), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "the report engine_throughput.md was not written; missing measurements" in err
    assert "b1024: 2in; qto: 1p, 2in" in err and "missing run details: pass_rows" in err
    assert "python -m pytest benchmarks/test_engine_throughput.py" in err
    assert committed.read_text() == "the committed table\n"  # left alone
    assert sorted(p.name for p in results.iterdir()) == ["engine_throughput.md"]  # no temporary left behind


def test_one_bad_name_writes_no_table(report, tmp_path, capsys):
    complete_run(report, "kge_build").save(tmp_path)
    (tmp_path / "r").mkdir()
    assert report.main(["kge_build", "kge_train", "--from", str(tmp_path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "kge_train.json: no saved measurements for the report kge_train; measure first: " \
           f"python -m pytest benchmarks/test_kge_train.py --bench-out {tmp_path}" in err
    assert not any((tmp_path / "r").iterdir())


def test_outputs_are_checked_before_any_work(report, tmp_path, capsys):
    complete_run(report, "kge_build").save(tmp_path)
    assert report.main(["kge_build", "--from", str(tmp_path), "--results", str(tmp_path / "missing")]) == 2
    assert "--results" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    (tmp_path / "kge_build.md").mkdir()  # the table's path is a folder
    assert report.main(["kge_build", "--from", str(tmp_path), "--results", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("name,says", [("kge_buld", "unknown report 'kge_buld'; closest known: 'kge_build'"),
                                       ("nothing", "unknown report 'nothing'")])
def test_unknown_name(report, tmp_path, capsys, name, says):
    assert report.main([name, "--from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


@pytest.mark.parametrize("text,says", [("{", "not JSON"), ("[]", "not a saved benchmark run"),
                                       ('{"table": "kge_build", "name": "kge_build", "values": [["a", "b"]]}',
                                        "'values' holds ['a', 'b']")])
def test_a_damaged_file_is_one_error(report, tmp_path, capsys, text, says):
    (tmp_path / "kge_build.json").write_text(text)
    assert report.main(["kge_build", "--from", str(tmp_path), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and not (tmp_path / "kge_build.md").exists()


def test_saved_runs_round_trip(report, tmp_path):
    m = complete_run(report, "kge_train")
    path = m.save(tmp_path / "new" / "folder")
    back = report.load(tmp_path / "new" / "folder", "kge_train")
    assert path.name == "kge_train.json" and back.values == m.values and back.absent == m.absent
    assert back.info == m.info and back.source == str(path)


# ------------------------------------------------------------------ the cell checks (Measurements.require)
def test_a_complete_table_passes(report):
    m = report.Measurements("x")
    m.put("1p", "b1", 10.0)
    m.put("1p", "faults", 0.0)
    m.put("2p", "b1", 3)
    m.not_applicable("2p", "faults", "not measured on this machine")
    m.info["data"] = "synthetic"
    m.require((["1p", "2p"], ["b1", "faults"]), info=("data",), may_be_zero=("faults",))
    assert m.get("1p", "b1") == 10.0 and m.get("2p", "faults") is None and ("2p", "b1") in m


def test_every_hole_is_named(report):
    m = report.Measurements("kge_build")
    m.source = "saved/kge_build.json"
    m.put("1p", "b1", 1.0)
    m.put("1p", "loop", 2.0)
    m.put("2p", "loop", 2.0)
    with pytest.raises(UserError) as exc:
        m.require((["1p", "2p", "3p"], ["b1", "loop"]), (["matmul"], ["gflops"]), info=("data", "backend"))
    msg = str(exc.value)
    assert msg.startswith("saved/kge_build.json: the report kge_build.md was not written; missing measurements")
    assert "b1: 2p, 3p; loop: 3p; rows matmul x columns gflops: none" in msg
    assert "missing run details: data, backend" in msg
    assert msg.endswith("Run the whole file again: python -m pytest benchmarks/test_kge_build.py --bench-out <folder>")


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_values_must_be_finite_and_positive(report, value):
    m = report.Measurements("x")
    m.put("1p", "b1", value)
    with pytest.raises(UserError, match=r"not finite and positive: 1p/b1 = "):
        m.require((["1p"], ["b1"]))
    if value == 0.0:
        m.require((["1p"], ["b1"]), may_be_zero=("b1",))  # a count may be 0, never negative or nan
    else:
        with pytest.raises(UserError):
            m.require((["1p"], ["b1"]), may_be_zero=("b1",))


def test_no_benchmark_file_writes_a_table_itself():
    """The timed benchmark files save numbers; only benchmarks/report.py writes results/*.md (the crossover test
    and the side-by-side before/after run excepted: each writes its one table from what it measured itself)."""
    for path in sorted((ROOT / "benchmarks").glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        assert "def test_write_" not in text, path.name
        writes = text.count(".write_text(")
        assert writes == (2 if path.name == "test_ops_bench.py" else 0), path.name
