"""Shard folders (kge.shard) read by sharded runs of engine.answer, and the faults of a sharded run.

Ranks are ``python -m engine.answer`` processes with torchrun's environment (see test_dist_exec.py),
bounded by a timeout: a shard set that does not fit the run is one error line on every rank, and a
rank that dies or hangs ends the others with one error line within ``--dist-timeout``.
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


def answer_ranks(artifact, world: int, *extra: str, timeout: float = 120):
    return run_ranks(lambda k: ["--artifact", str(artifact), "--expr", EXPR, "--top-k", "5", *extra], world,
                     module="engine.answer", timeout=timeout)


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
            # every entry of the block, with its value: the rows decoded from the hypersparse keys
            rows = np.repeat(s.keys, np.diff(s.ptr))
            got = sorted(zip(rows.tolist(), (s.col + lo).tolist(), s.val.tolist()))
            want = sorted(zip(coo_row[keep].tolist(), coo_col[keep].tolist(), coo_val[keep].tolist()))
            assert got == want
            # hypersparse: one key per row that has an entry in the block, none for the others
            assert np.array_equal(s.keys, np.unique(coo_row[keep])) and np.all(np.diff(s.ptr) > 0)
            total += s.nnz
            # balanced by entries: a block is off 1/P of them by less than one column's entries
            assert abs(s.nnz - m.nnz / p) <= counts.max()
        assert total == art.matrices.nnz


def test_sharded_cli_prints_what_one_process_prints(umls_tiny_artifact, shards):
    from engine.answer import main

    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--artifact", str(umls_tiny_artifact), "--expr", EXPR, "--top-k", "5"]) == 0
    got = answer_ranks(shards[2], 2)
    assert [g[0] for g in got] == [0, 0], [g[2][-2000:] for g in got]
    assert got[0][1] == buf.getvalue() and "—" in got[0][1]  # rank 0 prints, explanations included
    assert got[1][1] == ""  # the other ranks print nothing


def test_a_shard_folder_in_one_process_says_what_it_is(shards, capsys):
    """It was: '... meta.json has no format_version ...; rebuild it with python -m kge.build ... --overwrite'."""
    from engine.answer import main

    assert main(["--artifact", str(shards[2]), "--expr", EXPR]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a shard folder for 2 ranks" in err[0] and "torchrun --nproc-per-node 2" in err[0], err


def test_shard_count_not_the_world_size(shards):
    got = answer_ranks(shards[3], 2)
    for rc, out, err in got:
        assert rc == 2 and out == ""
        lines = error_lines(err)
        assert len(lines) == 1 and "holds 3 shards but the run has 2 ranks" in lines[0], err


def test_incomplete_and_mixed_shard_sets(shards, tmp_path):
    from kge.sharding import shard_file_name

    incomplete = tmp_path / "incomplete"
    shutil.copytree(shards[2], incomplete)
    (incomplete / shard_file_name(1, 2)).unlink()
    for rc, _, err in answer_ranks(incomplete, 2):
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "incomplete" in lines[0] and shard_file_name(1, 2) in lines[0], err

    # shard 1 of another build (the 7-entity KG's, also 2 shards): every rank stops, naming rank 1's problem
    from kge.sharding import write_shards
    from test_dist_exec import tiny_artifact

    other = tmp_path / "other"
    write_shards(tiny_artifact(), 2, other)
    mixed = tmp_path / "mixed"
    shutil.copytree(shards[2], mixed)
    shutil.copy(other / shard_file_name(1, 2), mixed / shard_file_name(1, 2))
    got = answer_ranks(mixed, 2)
    for k, (rc, _, err) in enumerate(got):
        lines = error_lines(err)
        assert rc == 2 and len(lines) == 1 and "changed since it was written" in lines[0], err
        assert ("rank 1: " in lines[0]) == (k == 0)
    # unverified, the build id still tells
    got = answer_ranks(mixed, 2, "--skip-artifact-checksums")
    for rc, _, err in got:
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
    raise SystemExit(_fault_rank(sys.argv[1], sys.argv[2]))
