"""Shard folders (kge.shard) read by sharded runs of engine.answer, and the faults of a sharded run.

Ranks are processes with torchrun's environment (see test_dist_exec.py), bounded by a timeout.  The CLI
cases share one spawned group of 2 ranks (:func:`cli_runs`: each case is the CLI's ``main`` in the ranks'
processes): the answers, engine.evaluate's metrics, and a shard set that does not fit the run (one error
line on every rank).  A rank that dies or hangs ends the others with one error line within
``--dist-timeout`` (separate processes: ``python -m engine.answer`` and this file's rank).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_dist_exec import ROOT, free_port, rank_env, run_ranks

EXPR = "(i (p location_of acquired_abnormality) (np interacts_with bacterium))"


@pytest.fixture(scope="module")
def shards(umls_tiny_artifact, tmp_path_factory):
    """The tiny UMLS artifact as 2 and as 3 shards."""
    from kge.shard import main

    root = tmp_path_factory.mktemp("shards")
    out = {}
    for p in (2, 3):
        out[p] = root / f"umls.{p}"
        assert main(["--artifact", str(umls_tiny_artifact), "--shards", str(p), "--out", str(out[p]), "--quiet"]) == 0
    return out


def error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.strip()]


def test_shard_files_hold_only_their_block(umls_tiny_artifact, shards):
    from kge.artifact import Artifact
    from kge.sharding import block_bounds, column_counts, load_shard

    art = Artifact.load(umls_tiny_artifact, load_embeddings=False)
    n, r = art.num_entities, art.num_relations
    m = art.matrices
    coo_row = np.repeat(np.arange(r * n, dtype=np.int64), np.diff(m.indptr))
    coo_col, coo_val = m.indices, m.data
    for p, folder in shards.items():
        meta = json.loads((folder / "meta.json").read_text())
        counts = column_counts(m, n)
        assert meta["shards"] == p and meta["bounds"] == block_bounds(n, p, counts)
        total = 0
        for k in range(p):
            s = load_shard(folder, k, p)
            lo, hi = s.lo, s.hi
            keep = (coo_col >= lo) & (coo_col < hi)
            assert s.nnz == int(keep.sum())
            # every entry of the block, with its value: the rows decoded from the hypersparse keys, the columns
            # from each relation's tails in the block
            rows = np.repeat(s.keys, np.diff(s.ptr))
            cols = np.concatenate([s.relation_tails(int(k // n))[s.col[a:b]] for k, a, b in
                                   zip(s.keys, s.ptr[:-1], s.ptr[1:])] or [np.zeros(0, np.int32)]) + lo
            got = sorted(zip(rows.tolist(), cols.tolist(), s.val.tolist()))
            want = sorted(zip(coo_row[keep].tolist(), coo_col[keep].tolist(), coo_val[keep].tolist()))
            assert got == want
            # hypersparse: one key per row that has an entry in the block, none for the others
            assert np.array_equal(s.keys, np.unique(coo_row[keep])) and np.all(np.diff(s.ptr) > 0)
            # and per relation only the tails it has here
            for rel in range(r):
                in_rel = keep & (coo_row // n == rel)
                assert np.array_equal(s.relation_tails(rel) + lo, np.unique(coo_col[in_rel]))
            total += s.nnz
            # balanced by entries: a block is off 1/P of them by less than one column's entries
            assert abs(s.nnz - m.nnz / p) <= counts.max()
        assert total == art.matrices.nnz


def _cli_cases(out: str, cases_json: str) -> int:
    """A rank of :func:`test_sharded_cli_runs`: every case (``[module, argv]``) through the CLI's ``main`` in
    this one process group; each case's exit code, stdout and stderr go to ``out`` (JSON)."""
    import contextlib
    import importlib
    import io

    from engine.exec.sharded_load import torchrun_group

    torchrun_group("cpu", 60.0)  # the group every case's torchrun_group then finds
    got = []
    for module, argv in json.loads(Path(cases_json).read_text()):
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = importlib.import_module(module).main(argv)
        got.append([rc, so.getvalue(), se.getvalue()])
    Path(out).write_text(json.dumps(got))
    return 0


@pytest.fixture(scope="module")
def cli_runs(umls_tiny_artifact, shards, tmp_path_factory):
    """One group of 2 ranks running every sharded CLI case in turn (one spawn instead of one per case): the
    answers, a shard count that is not the world size, an incomplete and a mixed shard set, and
    engine.evaluate.  Returns ``{case: [(rc, stdout, stderr) per rank]}`` and the folder."""
    from engine.eval.sampling import sample_queries, write_jsonl
    from kge.artifact import Artifact
    from kge.sharding import shard_file_name, write_shards
    from test_dist_exec import tiny_artifact

    d = tmp_path_factory.mktemp("cli")
    incomplete = d / "incomplete"
    shutil.copytree(shards[2], incomplete)
    (incomplete / shard_file_name(1, 2)).unlink()
    # shard 1 of another build (the 7-entity KG's, also 2 shards)
    other = d / "other"
    write_shards(tiny_artifact(), 2, other)
    mixed = d / "mixed"
    shutil.copytree(shards[2], mixed)
    shutil.copy(other / shard_file_name(1, 2), mixed / shard_file_name(1, 2))
    art = Artifact.load(umls_tiny_artifact, load_embeddings=False)
    structures = ["1p", "2p", "3p", "2i", "3i", "ip", "pi", "2in", "3in", "inp", "pin", "pni", "2u", "up"]
    qs, _ = sample_queries(art, structures, 3, seed=0, progress=False)
    write_jsonl(qs, d / "q.jsonl", art)
    answer = ["--expr", EXPR, "--top-k", "5"]
    cases = {
        "answer": ["engine.answer", ["--artifact", str(shards[2]), *answer]],
        "count": ["engine.answer", ["--artifact", str(shards[3]), *answer]],
        "incomplete": ["engine.answer", ["--artifact", str(incomplete), *answer]],
        "mixed": ["engine.answer", ["--artifact", str(mixed), *answer]],
        "mixed unverified": ["engine.answer", ["--artifact", str(mixed), *answer, "--skip-artifact-checksums"]],
        "evaluate": ["engine.evaluate", ["--artifact", str(shards[2]), "--queries", str(d / "q.jsonl"), "--no-progress",
                                         "--batch-size", "5", "--json", str(d / "eval.json")]],
    }
    (d / "cases.json").write_text(json.dumps(list(cases.values())))
    got = run_ranks(lambda k: ["cases", str(d / f"rank{k}.json"), str(d / "cases.json")], 2,
                    script=Path(__file__))
    for k, (rc, _, err) in enumerate(got):
        assert rc == 0, f"rank {k}: {err[-3000:]}"
    per_rank = [json.loads((d / f"rank{k}.json").read_text()) for k in range(2)]
    return {name: [tuple(r[i]) for r in per_rank] for i, name in enumerate(cases)}, d


def test_sharded_cli_prints_what_one_process_prints(umls_tiny_artifact, cli_runs):
    from engine.answer import main

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--artifact", str(umls_tiny_artifact), "--expr", EXPR, "--top-k", "5"]) == 0
    got = cli_runs[0]["answer"]
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    assert got[0][1] == buf.getvalue() and "—" in got[0][1]  # rank 0 prints, explanations included
    assert got[1][1] == ""  # the other ranks print nothing


def test_sharded_evaluate_gives_one_process_metrics(umls_tiny_artifact, cli_runs):
    """torchrun -m engine.evaluate: every rank ranks on its column block (one all-reduce of counts); the
    metrics are those of one process, exactly, and only rank 0 prints and writes them."""
    from engine.evaluate import main

    import contextlib
    import io

    runs, d = cli_runs
    sharded = json.loads((d / "eval.json").read_text())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--artifact", str(umls_tiny_artifact), "--queries", str(d / "q.jsonl"), "--no-progress",
                     "--batch-size", "5", "--json", str(d / "one.json")]) == 0
    one = json.loads((d / "one.json").read_text())
    assert sharded["results"] == one["results"]  # floats compared exactly
    assert len(one["results"]) == 14 and any(r["metrics"]["average"]["mrr"] > 0 for r in one["results"])
    got = runs["evaluate"]
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    table = [l for l in got[0][1].splitlines() if l.startswith("|")]
    assert table == [l for l in buf.getvalue().splitlines() if l.startswith("|")] and "2 ranks" in got[0][1]
    assert got[1][1] == ""


def test_a_shard_folder_in_one_process_says_what_it_is(shards, capsys):
    """It was: '... meta.json has no format_version ...; rebuild it with python -m kge.build ... --overwrite'."""
    from engine.answer import main

    assert main(["--artifact", str(shards[2]), "--expr", EXPR]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a shard folder for 2 ranks" in err[0] and "torchrun --nproc-per-node 2" in err[0], err


def test_shard_count_not_the_world_size(cli_runs):
    for rc, out, err in cli_runs[0]["count"]:
        assert rc == 2 and out == ""
        lines = error_lines(err)
        assert len(lines) == 1 and "holds 3 shards but the run has 2 ranks" in lines[0], err


def test_incomplete_and_mixed_shard_sets(cli_runs):
    from kge.sharding import shard_file_name

    runs = cli_runs[0]
    for rc, _, err in runs["incomplete"]:
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "incomplete" in lines[0] and shard_file_name(1, 2) in lines[0], err
    # shard 1 of another build: every rank stops, naming rank 1's problem
    for k, (rc, _, err) in enumerate(runs["mixed"]):
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "changed since it was written" in lines[0], err
        assert ("rank 1: " in lines[0]) == (k == 0)
    # unverified, the build id still tells
    for rc, _, err in runs["mixed unverified"]:
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "comes from another build" in lines[0], err


def _fault_rank(mode: str, artifact: str) -> int:
    """Rank 1 of a fault test: joins the group and loads like engine.answer, then dies or hangs."""
    from engine.exec.api import Engine
    from engine.exec.sharded_load import torchrun_group

    group = torchrun_group("cpu", 5.0)
    Engine.load(artifact, process_group=group)
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)  # hang: never reaches the next collective
    return 0


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_a_rank_that_dies_or_hangs_ends_the_others(shards, mode):
    port = free_port()
    rank0 = subprocess.Popen([sys.executable, "-m", "engine.answer", "--artifact", str(shards[2]), "--expr", EXPR,
                              "--dist-timeout", "5"], env=rank_env(0, 2, port), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = subprocess.Popen([sys.executable, str(Path(__file__)), mode, str(shards[2])], env=rank_env(1, 2, port),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        out, err = rank0.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        for p in (rank0, rank1):
            if p.poll() is None:
                p.kill()
            p.communicate()
    lines = error_lines(err)
    assert rank0.returncode == 2 and out == "", err
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: ") and "another rank died" in lines[0] \
        and "within 5 s (--dist-timeout)" in lines[0], err
    assert took < 60


if __name__ == "__main__":
    if sys.argv[1] == "cases":
        raise SystemExit(_cli_cases(sys.argv[2], sys.argv[3]))
    raise SystemExit(_fault_rank(sys.argv[1], sys.argv[2]))
