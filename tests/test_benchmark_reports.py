"""The benchmark report writers' checks (benchmarks/conftest.py): complete tables only, writers run last."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    """benchmarks/conftest.py as a module of its own (tests/conftest.py holds the name ``conftest``)."""
    spec = importlib.util.spec_from_file_location("kgreason_bench_conftest", ROOT / "benchmarks" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_a_complete_table_passes(bench):
    m = bench.Measurements("benchmarks/x.py")
    m.put("1p", "b1", 10.0)
    m.put("1p", "faults", 0.0)
    m.put("2p", "b1", 3)
    m.not_applicable("2p", "faults", "not measured on this machine")
    m.info["data"] = "synthetic"
    m.require((["1p", "2p"], ["b1", "faults"]), info=("data",), may_be_zero=("faults",))
    assert m.get("1p", "b1") == 10.0 and m.get("2p", "faults") is None and ("2p", "b1") in m


def test_every_hole_is_named(bench):
    m = bench.Measurements("benchmarks/x.py")
    m.put("1p", "b1", 1.0)
    m.put("1p", "loop", 2.0)
    m.put("2p", "loop", 2.0)
    with pytest.raises(pytest.fail.Exception) as exc:
        m.require((["1p", "2p", "3p"], ["b1", "loop"]), (["matmul"], ["gflops"]), info=("data", "backend"))
    msg = str(exc.value)
    assert msg.startswith("benchmarks/x.py: the report was not written; missing measurements")
    assert "b1: 2p, 3p; loop: 3p; rows matmul x columns gflops: none" in msg
    assert "missing run details: data, backend" in msg
    assert msg.endswith("Run the whole file: python -m pytest benchmarks/x.py")


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_values_must_be_finite_and_positive(bench, value):
    m = bench.Measurements("benchmarks/x.py")
    m.put("1p", "b1", value)
    with pytest.raises(pytest.fail.Exception, match=r"not finite and positive: 1p/b1 = "):
        m.require((["1p"], ["b1"]))
    if value == 0.0:
        m.require((["1p"], ["b1"]), may_be_zero=("b1",))  # a count may be 0, never negative or nan
    else:
        with pytest.raises(pytest.fail.Exception):
            m.require((["1p"], ["b1"]), may_be_zero=("b1",))


class _Item:
    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name

    def __repr__(self) -> str:
        return f"{self.path.name}::{self.name}"


def test_writers_move_after_the_rest_of_their_file(bench):
    here = ROOT / "benchmarks"
    a, b = here / "test_a.py", here / "test_b.py"
    items = [_Item(a, "test_write_report"), _Item(a, "test_x[1p]"), _Item(a, "test_y"), _Item(b, "test_write_results"),
             _Item(b, "test_z"), _Item(ROOT / "tests" / "test_c.py", "test_write_not_a_benchmark")]
    bench.pytest_collection_modifyitems(None, items)
    assert [repr(i) for i in items] == ["test_a.py::test_x[1p]", "test_a.py::test_y", "test_a.py::test_write_report",
                                        "test_b.py::test_z", "test_b.py::test_write_results",
                                        "test_c.py::test_write_not_a_benchmark"]
    alone = [_Item(a, "test_write_report")]  # run alone (-k write): stays, and fails naming what is missing
    bench.pytest_collection_modifyitems(None, alone)
    assert [i.name for i in alone] == ["test_write_report"]
