"""Shared pytest configuration: device parametrisation and the cuda marker."""
from __future__ import annotations

import os

# OpenMP threads waiting for work sleep instead of spinning.  On a busy machine a spinning thread burns
# its core while the thread it waits for is descheduled: the 2-thread determinism runs of
# test_kge_complex_n3.py took ~10 s of CPU and 19-29 s wall at load 5-7, ~1.8 s and 4-5 s passive.
# libgomp reads it when torch loads, hence before the import (and subprocesses inherit it); a value
# the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Under pytest-xdist (-n N) the workers share the cores: each gets cores / N threads (at least one) unless the
# user set OMP_NUM_THREADS, so two workers on two cores do not each run torch's two threads against the other's.
# Tests that need a thread count set it themselves (torch.set_num_threads).  xdist sets the variable before a
# worker loads this file.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit():
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // max(1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))))

import pytest  # noqa: E402

# torch is imported where a test process needs it (collection, fixtures), never when this file loads: under
# pytest-xdist the controller loads it too, and importing torch there (~2-4 s, before any worker starts) was
# wall time of every `-n 2` run during which neither worker existed yet.  The controller never collects.


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def devices() -> list:
    """The `device` fixture's parameters: cpu, and cuda where a GPU is visible.  The cuda parameter carries the
    `cuda` marker from collection on, so `pytest -m cuda` selects every test that runs on the GPU
    (benchmarks/gpu_check.sh runs exactly that); a marker added when the fixture runs would come after the
    selection."""
    return ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if _has_cuda() else [])


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    # what `@pytest.fixture(params=devices())` did (same ids, same place in them), computed at collection; a test
    # that parametrizes `device` itself keeps its own values (as with fixture params)
    if "device" in metafunc.fixturenames and not any(
            "device" in _argnames(mark) for mark in metafunc.definition.iter_markers("parametrize")):
        metafunc.parametrize("device", devices(), indirect=True)


def _argnames(mark) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_files_first(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


# ------------------------------------------------------------------ pytest-xdist: the longest files first
# Under `-n 2 --dist loadfile` each file goes whole to the next free worker, in the order of the workers'
# collection.  xdist's own order (--loadscope-reorder, its default) is by number of tests, largest first, which
# puts the files with few but long tests (the distributed groups, nvcc, the CLI fuzzing) last, where one of them
# keeps one worker busy while the other has nothing left.  Longest first (LPT scheduling) leaves only short
# files for the end.  The fast lane's files over ~4 s of wall time in a worker, longest first (wall, not CPU: a
# test waiting on a deadline holds its worker too): each file's CPU from the per-test report (KGREASON_TEST_CPU,
# docs/testing.md) of the `-n 2 --dist loadfile` lane at 48bc461, plus its waiting (wall - CPU) in the quiet
# run of 2026-11-28 less the waits cut since (stop 41: less the CPU cut from test_fuzz_cli.py, test_ops_project_pull.py,
# test_progress.py, test_engine_hooks.py; test_ask_weigh.py added, ~9 s of CPU); the others follow in collection order.  Except test_dist_exec.py, right after test_dist_shard.py: the worker that ran test_dist_shard.py asks
# for work first (test_fuzz_cli.py takes longer) and gets it, so both files read the one 2-rank group that
# worker spawned (test_dist_exec.two_rank_runs, once per process) instead of each worker spawning its own.
# A file missing here or a stale entry costs only balance, never a test.
LONGEST_FILES = (
    "test_fuzz_cli.py", "test_dist_shard.py", "test_dist_exec.py", "test_ask.py", "test_llm_client.py",
    "test_cuda_compile.py", "test_ops_project_pull.py", "test_kge_build.py", "test_kge_complex_n3.py",
    "test_bad_input.py", "test_kge_lazy.py", "test_ask_weigh.py", "test_ops_opcheck.py", "test_untrusted_parsers.py",
    "test_ask_robust.py", "test_metaqa_experiment.py", "test_imports.py", "test_kge_train.py",
    "test_engine_executor.py", "test_llm_experiment.py", "test_engine_eval_sampling.py", "test_ops_project_multi.py",
    "test_progress.py", "test_llm_lgot.py", "test_llm_simulate.py", "test_bad_input_scripts.py",
    "test_artifact_verify.py", "test_fuzz_query.py", "test_engine_cli.py", "test_kge_budget.py",
)


def pytest_configure(config):
    # the order LONGEST_FILES gives is the order the files are handed out in (see above)
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def _longest_files_first(items) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FILES)}
    # a stable sort: the tests of a file keep their order, the files not listed theirs
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# ------------------------------------------------------------------ caches out of the user's home
# Code that caches (the default UMLS artifact, relation embeddings, the LLM response cache and
# relation-question files: all under $KGREASON_HOME) writes into one folder per test session, never
# into ~/.cache; XDG_CACHE_HOME is set too, for libraries that follow it. A test that sets these
# variables itself (monkeypatch.setenv) still wins.
CACHE_ENV = ("KGREASON_HOME", "XDG_CACHE_HOME")


@pytest.fixture(scope="session", autouse=True)
def _session_caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KGREASON_HOME", str(root / "kgreason"))
        mp.setenv("XDG_CACHE_HOME", str(root / "xdg-cache"))
        yield root


# ------------------------------------------------------------------ one tiny UMLS artifact per session
# pykeen's bundled UMLS (no download), rank 8, 2 epochs, half the training edges dropped (missing.tsv
# holds them, so the samplers find hard answers): about 5 s.  Read-only: copy it before damaging it.
@pytest.fixture(scope="session")
def umls_tiny_artifact(tmp_path_factory):
    import contextlib
    import io

    from kge.build import main as build_main

    out = tmp_path_factory.mktemp("umls-tiny") / "umls"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = build_main(["--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--seed", "0", "--rank", "8",
                         "--epochs", "2", "--eval-max-triples", "0", "--device", "cpu", "--quiet"])
    assert rc == 0, err.getvalue()
    return out


# ------------------------------------------------------------------ the LLM bridge's generated KG and local server
# tests/_llm_server.py's session fixtures, registered once here for every module: `llm_artifact` (a generated
# 150-entity KG, no training, half its edges in missing.tsv; <1 s) and `local_llm` (opt-in: pytest -m llm).  A
# fixture imported into each test module instead is a separate fixture per module (built once per module) and
# reads as a redefined name to pyflakes (ruff F811).
from _llm_server import llm_artifact, local_llm  # noqa: E402,F401


@pytest.fixture
def device(request):
    """"cpu" or "cuda": one test per device (parametrized by pytest_generate_tests above)."""
    return request.param


# ------------------------------------------------------------------ reproducible random seeds
# A test that takes the `seed` fixture gets $KGREASON_TEST_SEED, or a fresh random seed when
# it is unset; torch, numpy and random are seeded with it, and a failing test's report shows
# it in a "seed" section with the command line that reruns it with the same inputs.
SEED_ENV = "KGREASON_TEST_SEED"


@pytest.fixture
def seed(request) -> int:
    """This test's seed (also stored in ``request.node.user_properties``); global RNGs seeded with it."""
    import os
    import random

    import numpy as np
    import torch

    raw = os.environ.get(SEED_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise pytest.UsageError(f"{SEED_ENV}: expected an integer seed, got {raw!r}") from None
    else:
        value = random.SystemRandom().randrange(2**31)
    request.node.user_properties.append(("seed", value))
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(
                    ("seed", f"seed={value}; rerun with: {SEED_ENV}={value} python -m pytest '{item.nodeid}'"))
    return report


# ------------------------------------------------------------------ per-test CPU time (KGREASON_TEST_CPU=FILE)
# The fast lane's budget is counted in CPU seconds: wall time on a shared machine mostly measures the
# neighbours.  With KGREASON_TEST_CPU set, each test's CPU seconds (this process's threads plus the
# subprocesses it waited for: nvcc, fresh interpreters) and wall seconds over setup, call and teardown
# (a session fixture counts for the first test that uses it) go to that file as a TSV, largest first,
# then per-file totals and the whole session's (collection included).  docs/testing.md has the command.
CPU_ENV = "KGREASON_TEST_CPU"
_cpu_rows: dict[str, tuple[float, float]] = {}
_cpu_start: list[tuple[float, float, float]] = []
# Under pytest-xdist (-n N) each worker measures its own tests and its session's CPU and hands them to the
# controller (workeroutput), which writes the one report: the session's CPU is then the workers' plus its own.
_worker_cpu: list[float] = []


def _cpu_now(children: bool = True) -> float:
    import os

    t = os.times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


def pytest_sessionstart(session):
    import time

    _cpu_start.append((_cpu_now(), time.perf_counter(), _cpu_now(children=False)))
    _start_removing_old_basetemps(session.config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import os
    import time

    if not os.environ.get(CPU_ENV):
        return (yield)
    c0, w0 = _cpu_now(), time.perf_counter()
    try:
        return (yield)
    finally:
        _cpu_rows[item.nodeid] = (_cpu_now() - c0, time.perf_counter() - w0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist, on the controller: a worker finished
    out = getattr(node, "workeroutput", None) or {}
    if "kgreason_cpu_rows" in out:
        _cpu_rows.update({k: (c, w) for k, (c, w) in out["kgreason_cpu_rows"].items()})
        _worker_cpu.append(out["kgreason_cpu_session"])


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    import os
    import time

    _join_basetemp_removal()
    path = os.environ.get(CPU_ENV)
    if not path or not _cpu_start:
        return
    cpu0, wall0, own0 = _cpu_start[0]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the report
        workeroutput["kgreason_cpu_rows"] = {k: list(v) for k, v in _cpu_rows.items()}
        workeroutput["kgreason_cpu_session"] = _cpu_now() - cpu0
        return
    files: dict[str, list[float]] = {}
    for nodeid, (cpu, wall) in _cpu_rows.items():
        acc = files.setdefault(nodeid.split("::")[0], [0.0, 0.0, 0])
        acc[0] += cpu
        acc[1] += wall
        acc[2] += 1
    lines = ["cpu_s\twall_s\ttest"]
    lines += [f"{c:.3f}\t{w:.3f}\t{n}" for n, (c, w) in sorted(_cpu_rows.items(), key=lambda kv: -kv[1][0])]
    lines += ["", "cpu_s\twall_s\ttests\tfile"]
    lines += [f"{c:.2f}\t{w:.2f}\t{k}\t{f}" for f, (c, w, k) in sorted(files.items(), key=lambda kv: -kv[1][0])]
    workers = f"; {len(_worker_cpu)} xdist workers" if _worker_cpu else ""
    # the controller's own CPU plus its workers' (they may have been reaped already: not their children times)
    session_cpu = _cpu_now(children=False) - own0 + sum(_worker_cpu) if _worker_cpu else _cpu_now() - cpu0
    lines += ["", f"# {len(_cpu_rows)} tests: {sum(c for c, _ in _cpu_rows.values()):.1f} s of CPU in tests; session "
                  f"(collection included{workers}) {session_cpu:.1f} s of CPU, "
                  f"{time.perf_counter() - wall0:.1f} s wall"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------ old basetemps removed while the tests run
# pytest keeps the last tmp_path_retention_count (3) session folders under /tmp/pytest-of-USER and removes the
# older ones when the session ends, after the last test (the tmpdir plugin's pytest_sessionfinish).  A fast lane
# leaves ~4,800 files and folders (~380 MB); removing one such folder took 11.8 s of wall for 0.5 s of CPU on
# the project's machine (its disk, at load 6), so a lane run after lane runs ended with ~12 s in which neither
# core worked.  The same removal (pytest's own function, the same folders: those it would remove at the end)
# now runs in a thread of the process that owns the basetemp (the xdist controller, which idles while its
# workers run; or the one pytest process) from the session's start, and the session end waits for it.  pytest's
# own end-of-session cleanup then finds nothing left to do.  Off where pytest does no such cleanup (a given
# --basetemp, retention count or policy 0/"none", an xdist worker).
_basetemp_removal: list = []


def _start_removing_old_basetemps(config) -> None:
    import os
    import threading

    factory = getattr(config, "_tmp_path_factory", None)
    try:
        from _pytest.pathlib import LOCK_TIMEOUT, cleanup_numbered_dir

        if (factory is None or os.environ.get("PYTEST_XDIST_WORKER") or factory._given_basetemp is not None
                or factory._retention_policy == "none" or factory._retention_count <= 0):
            return
    except (ImportError, AttributeError):  # pytest's private helpers changed: its own cleanup at the end still runs
        return
    basetemp = factory.getbasetemp()  # this session's numbered folder (created now, not later)
    thread = threading.Thread(target=cleanup_numbered_dir, name="remove-old-basetemps", daemon=True, kwargs=dict(
        root=basetemp.parent, prefix="pytest-", keep=factory._retention_count,
        consider_lock_dead_if_created_before=basetemp.stat().st_mtime - LOCK_TIMEOUT))
    thread.start()
    _basetemp_removal.append(thread)


def _join_basetemp_removal() -> None:
    while _basetemp_removal:
        _basetemp_removal.pop().join()


# ------------------------------------------------------------------ hypothesis (tests/test_fuzz_*.py)
# "ci" (the default) keeps the fuzzing suite a bounded part of the normal run; "slow"
# (HYPOTHESIS_PROFILE=slow, or the slow-marked twins of the fuzz tests) searches far longer.
# No example database: runs leave nothing in the working tree, and a failure prints its
# reproduction (@reproduce_failure blob, and the argv for CLI tests) instead.
import os as _os  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402

_FUZZ_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# "ci" is derandomized: the normal run checks the same examples every time (no flaky reds);
# "slow" draws new ones on every run.
settings.register_profile("ci", max_examples=40, deadline=None, database=None, print_blob=True, derandomize=True,
                          suppress_health_check=_FUZZ_HEALTH)
settings.register_profile("slow", max_examples=2000, deadline=None, database=None, print_blob=True,
                          suppress_health_check=_FUZZ_HEALTH)
settings.load_profile(_os.environ.get("HYPOTHESIS_PROFILE", "ci"))
