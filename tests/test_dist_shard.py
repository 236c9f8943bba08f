"""Shard folders (kge.shard) read by sharded runs of engine.answer, and the faults of a sharded run.

Ranks are processes with torchrun's environment (see test_dist_exec.py), bounded by a timeout.  The CLI
cases share one spawned group of 2 ranks (:func:`two_ranks`: each case is the CLI's ``main`` in the ranks'
processes): the answers, engine.evaluate's metrics, and a shard set that does not fit the run (one error
line on every rank).  A rank that dies or hangs ends the others with one error line within
``--dist-timeout`` (separate processes: ``python -m engine.answer`` and this file's rank).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_dist_exec import EXPR, ROOT, free_port, rank_env, two_rank_runs


@pytest.fixture(scope="session")
def two_ranks(umls_tiny_artifact, tmp_path_factory):
    """The group of 2 ranks test_dist_exec.py's 2-rank check shares (spawned once per test process)."""
    return two_rank_runs(umls_tiny_artifact, tmp_path_factory)


@pytest.fixture(scope="module")
def shards(two_ranks):
    """The tiny UMLS artifact as 2 and as 3 shards (written by the shared group's fixture)."""
    return two_ranks[2]


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
            cols = s.tails[s.tail_ptr[rows // n] + s.col] + lo
            got = np.lexsort((cols, rows))
            want = np.flatnonzero(keep)[np.lexsort((coo_col[keep], coo_row[keep]))]
            assert np.array_equal(rows[got], coo_row[want]) and np.array_equal(cols[got], coo_col[want])
            assert np.array_equal(s.val[got], coo_val[want])
            # hypersparse: one key per row that has an entry in the block, none for the others
            assert np.array_equal(s.keys, np.unique(coo_row[keep])) and np.all(np.diff(s.ptr) > 0)
            # and per relation exactly the tails it has here, ascending
            pairs = np.repeat(np.arange(r, dtype=np.int64), np.diff(s.tail_ptr)) * n + s.tails + lo
            assert np.array_equal(pairs, np.unique(coo_row[keep] // n * n + coo_col[keep]))
            total += s.nnz
            # balanced by entries: a block is off 1/P of them by less than one column's entries
            assert abs(s.nnz - m.nnz / p) <= counts.max()
        assert total == art.matrices.nnz


def test_a_first_slice_shard_folder_is_refused_with_the_rewrite_command(shards, tmp_path):
    """Shard format 1 (local columns, no per-relation tails) cannot be read as today's format: one error line that
    says how to write it again, not a KeyError from the shard file."""
    import shutil

    from kge.sharding import SHARD_FORMAT, load_shard
    from kgreason.errors import UserError

    old = tmp_path / "format1"
    shutil.copytree(shards[2], old)
    meta = json.loads((old / "meta.json").read_text())
    meta["shard_format"] = 1
    (old / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=rf"shard format 1, this version reads {SHARD_FORMAT}; write it again with python -m kge.shard"):
        load_shard(old, 0, 2)


def test_sharded_cli_prints_what_one_process_prints(umls_tiny_artifact, two_ranks):
    from engine.answer import main

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--artifact", str(umls_tiny_artifact), "--expr", EXPR, "--top-k", "5"]) == 0
    got = two_ranks[0]["answer"]
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    assert got[0][1] == buf.getvalue() and "—" in got[0][1]  # rank 0 prints, explanations included
    assert got[1][1] == ""  # the other ranks print nothing


def test_sharded_evaluate_gives_one_process_metrics(umls_tiny_artifact, two_ranks):
    """torchrun -m engine.evaluate: every rank ranks on its column block (one all-reduce of counts); the
    metrics are those of one process, exactly, and only rank 0 prints and writes them."""
    from engine.evaluate import main

    import contextlib
    import io

    runs, d, _ = two_ranks
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


def test_shard_count_not_the_world_size(two_ranks):
    for rc, out, err in two_ranks[0]["count"]:
        assert rc == 2 and out == ""
        lines = error_lines(err)
        assert len(lines) == 1 and "holds 3 shards but the run has 2 ranks" in lines[0], err


def test_incomplete_and_mixed_shard_sets(two_ranks):
    from kge.sharding import shard_file_name

    runs = two_ranks[0]
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


def test_lazy_shard_folder_holds_each_rank_its_known_edges_and_checks_its_files(two_ranks, tmp_path):
    """A lazy artifact's shard folder (kge.shard): the embeddings once, per rank the known edges whose tail is in its
    block (nothing else); a changed embedding file or a shard file of another build is one error line."""
    import shutil

    from engine.exec.api import Engine
    from kge.sharding import LazyShard, block_bounds, load_shard, shard_file_name
    from kgreason.errors import UserError

    _, d, _ = two_ranks
    art = Engine.load(d / "lazy").artifact
    n, m = art.num_entities, art.matrices
    obs = np.asarray(m.observed)
    for p in (2, 3):
        meta = json.loads((d / f"lazy.{p}" / "meta.json").read_text())
        assert meta["matrices"] == "lazy" and meta["bounds"] == block_bounds(n, p)
        assert (meta["threshold"], meta["delta"]) == (m.threshold, m.delta)
        seen = 0
        for k in range(p):
            s = load_shard(d / f"lazy.{p}", k, p)
            assert isinstance(s, LazyShard) and (s.lo, s.hi) == tuple(meta["bounds"][k:k + 2])
            assert np.array_equal(np.asarray(s.entity), m.entity) and np.array_equal(np.asarray(s.relation), m.relation)
            mine = obs[(obs[:, 2] >= s.lo) & (obs[:, 2] < s.hi)]
            want = sorted(zip((mine[:, 1] * n + mine[:, 0]).tolist(), (mine[:, 2] - s.lo).tolist()))
            assert list(zip(s.obs_key.tolist(), s.obs_tail.tolist())) == want
            seen += s.obs_key.size
        assert seen == len(obs)
    changed = tmp_path / "changed"
    shutil.copytree(d / "lazy.2", changed)
    ent = np.load(changed / "entity.npy")
    ent[0, 0] += 1
    np.save(changed / "entity.npy", ent)
    with pytest.raises(UserError, match=r"entity.npy changed since it was written"):
        load_shard(changed, 1, 2)
    with pytest.raises(UserError, match=r"comes from another build"):  # unverified, the build id still tells
        load_shard(d / "lazy-mixed", 1, 2, verify=False)
    incomplete = tmp_path / "incomplete"
    shutil.copytree(d / "lazy.2", incomplete)
    (incomplete / "relation.npy").unlink()
    with pytest.raises(UserError, match=r"incomplete: relation.npy missing \(1 of 2 shards \+ 5 shared files\)"):
        load_shard(incomplete, 0, 2)
    assert shard_file_name(1, 2) in {f.name for f in (d / "lazy-mixed").iterdir()}


def test_lazy_shard_sets_run_and_fail_like_eager_ones(two_ranks, capsys):
    """torchrun -m engine.answer on a lazy shard folder prints what one lazy process prints (rank 0 only); a lazy
    shard set of 3 for 2 ranks, or mixed from two builds, is one error line on every rank."""
    from engine.answer import main

    runs, d, _ = two_ranks
    assert main(["--artifact", str(d / "lazy"), "--expr", "(p r0 (p r1 e3))", "--top-k", "3"]) == 0
    want = capsys.readouterr().out
    got = runs["lazy answer"]
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    assert got[0][1] == want and "—" in want and got[1][1] == ""
    for rc, out, err in runs["lazy count"]:
        lines = error_lines(err)
        assert rc == 2 and out == "" and len(lines) == 1 and "holds 3 shards but the run has 2 ranks" in lines[0], err
    for k, (rc, _, err) in enumerate(runs["lazy mixed"]):
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "changed since it was written" in lines[0], err
        assert ("rank 1: " in lines[0]) == (k == 0)


def test_sharded_evaluate_on_lazy_shards_gives_one_process_metrics(two_ranks):
    """torchrun -m engine.evaluate on a lazy shard set: the metrics of one lazy process (rows within 1e-6 rank alike)."""
    from test_dist_exec import assert_close

    from engine.evaluate import main

    import contextlib
    import io

    runs, d, _ = two_ranks
    got = runs["lazy evaluate"]
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--artifact", str(d / "lazy"), "--queries", str(d / "lazy-q.jsonl"), "--no-progress",
                     "--batch-size", "5", "--json", str(d / "lazy-one.json")]) == 0
    one = json.loads((d / "lazy-one.json").read_text())["results"]
    assert_close(json.loads((d / "lazy-eval.json").read_text())["results"], one)
    assert len(one) == 14 and any(r["metrics"]["average"]["mrr"] > 0 for r in one)
    assert "2 ranks" in got[0][1] and got[1][1] == ""


def _fault_rank(mode: str, artifact: str) -> int:
    """Rank 1 of a fault test: joins the group and loads like engine.answer, then dies or hangs."""
    from engine.exec.api import Engine
    from engine.exec.sharded_load import torchrun_group

    group = torchrun_group("cpu", 2.0)
    Engine.load(artifact, process_group=group)
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)  # hang: never reaches the next collective
    return 0


@pytest.mark.parametrize("mode", ["die", "hang"])
def test_a_rank_that_dies_or_hangs_ends_the_others(shards, mode):
    port = free_port()
    rank0 = subprocess.Popen([sys.executable, "-m", "engine.answer", "--artifact", str(shards[2]), "--expr", EXPR,
                              "--dist-timeout", "2"], env=rank_env(0, 2, port), cwd=ROOT,
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
        and "within 2 s (--dist-timeout)" in lines[0], err
    assert took < 60  # the join's timeout (sharded_comm.JOIN_TIMEOUT_S): the collectives must not wait that long


def test_joining_waits_longer_than_a_short_dist_timeout(monkeypatch):
    """--dist-timeout bounds the collectives (the test above: 2 s), the rendezvous waits at least JOIN_TIMEOUT_S:
    ranks join seconds apart (each imports torch and the engine first), which a short --dist-timeout failed."""
    import torch.distributed as dist

    from engine.exec import sharded_comm

    calls: list[tuple[str, float]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda **kw: calls.append(("join", kw["timeout"].total_seconds())))
    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout",
                        lambda timeout, group=None: calls.append(("collectives", timeout.total_seconds())))
    monkeypatch.setattr(sharded_comm, "_GROUP_TIMEOUT_S", [])
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    sharded_comm.init_from_env(timeout_s=2.0)
    assert calls == [("join", sharded_comm.JOIN_TIMEOUT_S), ("collectives", 2.0)]
    assert sharded_comm._GROUP_TIMEOUT_S == [2.0]  # what the collectives' error lines name
    calls.clear()
    sharded_comm.init_from_env(timeout_s=sharded_comm.JOIN_TIMEOUT_S + 30)  # longer than the join's: both
    assert calls == [("join", sharded_comm.JOIN_TIMEOUT_S + 30)]


if __name__ == "__main__":
    raise SystemExit(_fault_rank(sys.argv[1], sys.argv[2]))
