"""tests/_ops_helpers.lane_grid: the whole product in the full run, every axis value in the fast lane."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from _ops_helpers import lane_grid


def _is_slow(param) -> bool:
    return any(m.name == "slow" for m in param.marks)


@pytest.mark.parametrize("trial", range(20))
def test_lane_grid_is_the_product_and_the_fast_cases_cover_every_value(trial):
    rng = random.Random(trial)
    axes = []
    for _ in range(rng.randint(1, 5)):
        k = rng.randint(1, 6)
        if rng.random() < 0.3:  # a tuple-valued axis fills two argnames
            axes.append([(rng.randint(0, 9), i) for i in range(k)])
        else:
            axes.append(rng.sample([0, 1, 2.5, "a", "b", torch.int32, torch.int64, None, True], k))
    params = lane_grid(*axes)
    flat = [tuple(x for v in case for x in (v if isinstance(v, tuple) else (v,))) for case in itertools.product(*axes)]
    assert [p.values for p in params] == flat  # every case, in product order
    assert len({p.id for p in params}) == len(params)
    fast = [p for p in params if not _is_slow(p)]
    assert len(fast) <= sum(len(a) for a in axes)  # each fast case adds a value not yet covered
    for i, axis in enumerate(axes):
        start = sum(len(a[0]) if isinstance(a[0], tuple) else 1 for a in axes[:i])
        width = len(axis[0]) if isinstance(axis[0], tuple) else 1
        seen = {p.values[start:start + width] for p in fast}
        want = {v if isinstance(v, tuple) else (v,) for v in axis}
        assert seen == want, f"axis {i}: the fast cases miss {want - seen}"


def test_lane_grid_ids_name_dtypes_plainly():
    params = lane_grid([torch.int32], [(3, 0.5)])
    assert [p.id for p in params] == ["int32-3-0.5"]
    assert not _is_slow(params[0])


def test_the_xdist_order_names_existing_files_and_keeps_each_files_order():
    """tests/conftest.py's LONGEST_FILES (the order -n 2 --dist loadfile hands files out in): every entry a test
    file here, once; the sort moves whole files and keeps the order of the tests inside one and of the rest."""
    from pathlib import Path
    from types import SimpleNamespace

    from conftest import LONGEST_FILES, _longest_files_first

    here = Path(__file__).resolve().parent
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    assert [f for f in LONGEST_FILES if not (here / f).is_file()] == []
    first, second = LONGEST_FILES[:2]
    items = [SimpleNamespace(path=here / name, k=k) for k, name in
             enumerate(["test_a.py", second, "test_b.py", first, second, "test_a.py", first])]
    _longest_files_first(items)
    assert [(i.path.name, i.k) for i in items] == [(first, 3), (first, 6), (second, 1), (second, 4),
                                                   ("test_a.py", 0), ("test_b.py", 2), ("test_a.py", 5)]


def test_loading_conftest_imports_no_torch():
    """Under pytest-xdist the controller loads tests/conftest.py but runs no test: importing torch there (~2-4 s)
    delayed the workers' start on every `-n 2` run.  conftest imports torch only where a test process needs it."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = "import sys; import conftest; print(sorted(m for m in ('torch', 'kge', 'engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_old_basetemps_are_removed_while_the_session_runs(tmp_path, monkeypatch):
    """tests/conftest.py starts pytest's own removal of the session folders it would remove at the end (number <=
    newest - tmp_path_retention_count) in a thread at the session's start, and the end waits for it: a lane's
    folder took ~12 s of wall to remove after the last test.  Off in an xdist worker (its basetemp is given)."""
    from types import SimpleNamespace

    import conftest

    root = tmp_path / "pytest-of-someone"
    for k in range(1, 7):
        (root / f"pytest-{k}" / "t").mkdir(parents=True)
        (root / f"pytest-{k}" / "t" / "f").write_text("x")
    factory = SimpleNamespace(_given_basetemp=None, _retention_policy="all", _retention_count=3,
                              getbasetemp=lambda: root / "pytest-6")
    config = SimpleNamespace(_tmp_path_factory=factory)
    monkeypatch.setattr(conftest, "_basetemp_removal", [])  # not this session's own removal thread
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest._start_removing_old_basetemps(config)
    assert conftest._basetemp_removal == [] and len(list(root.iterdir())) == 6
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    conftest._start_removing_old_basetemps(config)
    assert len(conftest._basetemp_removal) == 1
    conftest._join_basetemp_removal()
    assert conftest._basetemp_removal == []
    assert sorted(p.name for p in root.iterdir()) == ["pytest-4", "pytest-5", "pytest-6"]
