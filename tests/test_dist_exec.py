"""Sharded execution (engine.exec.sharded): P ranks over gloo on 127.0.0.1, bit-identical to one process.

A group is P worker processes of this file with the environment torchrun would set (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT on a free port), bounded by a timeout, running several cases in turn
(:func:`worker`; the 2-rank checks of this file and test_dist_shard.py share one group, :func:`two_ranks`).
The P ranks are forks of one interpreter that imported torch and the engine once (:func:`fork_ranks`,
``python tests/test_dist_exec.py ranks ...``): importing them is most of a rank's cost (~2.7 s of CPU), so a
group of P costs one import, not P.  Every rank writes what it computed, and the
test compares it with the single-process executor in this process: answers, scores and explanations
with ``==`` and ``torch.equal``.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
STRUCTURES = ("1p", "2p", "3p", "2i", "3i", "ip", "pi", "2in", "3in", "inp", "pin", "pni", "2u", "up")
RUN_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def run_ranks(args_of_rank, world: int, *, timeout: float = RUN_TIMEOUT_S, module: str | None = None,
              script: Path | None = None):
    """Start ``world`` ranks (this file's worker, ``python -m module`` or ``python script``); wait at most
    ``timeout`` s for all.

    Returns ``[(returncode, stdout, stderr)]`` in rank order; a rank still running at the timeout is killed
    and the test fails showing every rank's stderr.
    """
    port = free_port()
    if module is None and script is None and hasattr(os, "fork"):  # this file's worker: P forks of one interpreter
        return run_forked_ranks(args_of_rank, world, port, timeout)
    procs = []
    for rank in range(world):
        cmd = [sys.executable, "-m", module] if module else [sys.executable, str(script)] if script else \
            [sys.executable, str(Path(__file__)), "worker"]
        procs.append(subprocess.Popen(cmd + list(args_of_rank(rank)), env=rank_env(rank, world, port), cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for p in procs:
            so, se = p.communicate(timeout=timeout)
            out.append((p.returncode, so, se))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        errs = [p.communicate()[1][-2000:] for p in procs]
        pytest.fail(f"ranks did not finish within {timeout} s; stderr: {errs}")
    return out


def run_forked_ranks(args_of_rank, world: int, port: int, timeout: float):
    """:func:`run_ranks` for this file's worker: one interpreter (``ranks``, :func:`fork_ranks`) forks the
    ``world`` ranks; their output goes to files (a pipe per forked rank would need a reader per pipe here).
    The interpreter runs in a session of its own, so a timeout kills its ranks too."""
    import json
    import signal
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        spec = Path(tmp) / "ranks.json"
        spec.write_text(json.dumps([list(args_of_rank(k)) for k in range(world)]))
        proc = subprocess.Popen([sys.executable, str(Path(__file__)), "ranks", str(spec), tmp],
                                env=rank_env(0, world, port), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            so, se = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            errs = [(Path(tmp) / f"rank{k}.err").read_text()[-2000:] for k in range(world)
                    if (Path(tmp) / f"rank{k}.err").exists()]
            pytest.fail(f"ranks did not finish within {timeout} s; stderr: {errs}")
        assert proc.returncode == 0, f"the forking interpreter failed: {se[-3000:]}"
        codes = json.loads(so)
        return [(codes[k], (Path(tmp) / f"rank{k}.out").read_text(), (Path(tmp) / f"rank{k}.err").read_text())
                for k in range(world)]


def fork_ranks(spec: str, out_dir: str) -> int:
    """``ranks SPEC OUT_DIR``: import torch and the engine once, fork one rank per entry of the JSON list SPEC
    (that rank's :func:`worker` arguments), RANK and LOCAL_RANK set in each; rank k's stdout and stderr go to
    OUT_DIR/rank{k}.out and .err.  Prints the ranks' exit codes (JSON, -N for a signal) when all have ended.

    Nothing here starts a thread before the forks (torch's OpenMP pool starts at its first parallel op), and
    each rank joins the gloo group after its fork."""
    import json

    import engine.exec.api  # noqa: F401  (imported once, before the forks: what the ranks share)
    import engine.exec.sharded_load  # noqa: F401

    pids = []
    for k, args in enumerate(json.loads(Path(spec).read_text())):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(k)
                for fd, suffix in ((1, "out"), (2, "err")):
                    f = os.open(os.path.join(out_dir, f"rank{k}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(f, fd)
                    os.close(f)
                rc = worker(args)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        pids.append(pid)
    print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]))
    return 0


def strip(results):
    """Results without traces (they hold the batch; equality ignores them anyway)."""
    return [dataclasses.replace(r, trace=None) for r in results]


# ------------------------------------------------------------------------------ the worker
def answers_and_scores(artifact: str, queries: str, out: str) -> None:
    """This rank's answers and scores of the queries (one per line of the file ``queries``) into ``out``
    (collective: every rank of the group calls it)."""
    from engine.exec.api import Engine
    from engine.exec.sharded_load import init_from_env

    group = init_from_env(timeout_s=60)  # the group already joined
    eng = Engine.load(tiny_artifact() if artifact == "tiny:" else artifact, process_group=group)
    lines = [l for l in Path(queries).read_text().splitlines() if l.strip()]
    nodes = eng.queries(lines)
    res = eng.answer(nodes, k=10)
    scores = eng.scores(nodes)
    ex = eng.executor
    with open(out.replace(".pkl", f".rank{ex.comm.rank}.pkl"), "wb") as f:
        pickle.dump({"answers": strip(res), "scores": scores, "width": ex.width, "nnz": ex.shard.nnz,
                     "hops": [tuple(h) for h in ex.hops]}, f)


def worker(argv: list[str]) -> int:
    """``worker OUT CASES``: run every case of the JSON file CASES in one group, in order, and write each case's
    exit code, stdout and stderr to OUT (JSON).  A case is ``[module, argv]``, the CLI's ``main(argv)`` (in
    this process: no spawn per case), or ``["answers", [ARTIFACT, QUERIES, OUT]]``: :func:`answers_and_scores`.
    """
    import contextlib
    import importlib
    import io
    import json

    import torch.distributed as dist

    from engine.exec.sharded_load import init_from_env

    out, cases = argv
    init_from_env(timeout_s=60)  # every case's torchrun_group then finds this group
    got = []
    for module, args in json.loads(Path(cases).read_text()):
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            if module == "answers":
                answers_and_scores(*args)
                rc = 0
            else:
                rc = importlib.import_module(module).main(args)
        got.append([rc, so.getvalue(), se.getvalue()])
    Path(out).write_text(json.dumps(got))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_cases(tmp: Path, cases: dict[str, list], world: int) -> dict[str, list[tuple[int, str, str]]]:
    """Spawn one group of ``world`` ranks running every case (see :func:`worker`): ``{name: [(rc, stdout,
    stderr) per rank]}``."""
    import json

    (tmp / "cases.json").write_text(json.dumps(list(cases.values())))
    got = run_ranks(lambda k: [str(tmp / f"rank{k}.json"), str(tmp / "cases.json")], world)
    for k, (rc, _, err) in enumerate(got):
        assert rc == 0, f"rank {k}: {err[-3000:]}"
    per_rank = [json.loads((tmp / f"rank{k}.json").read_text()) for k in range(world)]
    return {name: [tuple(r[i]) for r in per_rank] for i, name in enumerate(cases)}


def tiny_artifact():
    """7 entities, 2 relations, every tail 0 or 1: with 3 ranks (bounds [0, 1, 2, 7], balanced by entries) the
    last block [2, 7) holds no entry, and 3 does not divide 7."""
    import scipy.sparse as sp

    from kge.artifact import Artifact

    n, r = 7, 2
    trip = [(0, 0, 1, 0.9), (1, 0, 0, 0.5), (2, 0, 1, 1.0), (4, 0, 0, 0.7), (5, 1, 0, 0.6), (6, 1, 1, 0.25),
            (3, 1, 0, 0.8), (0, 1, 1, 0.4), (2, 0, 0, 0.5)]
    rows = [rel * n + h for h, rel, _, _ in trip]
    m = sp.csr_matrix(([v for *_, v in trip], ([*rows], [t for _, _, t, _ in trip])), shape=(r * n, n),
                      dtype=np.float32)
    m.sort_indices()
    obs = np.array([(h, rel, t) for h, rel, t, _ in trip], dtype=np.int64)
    return Artifact(entities=[f"e{k}" for k in range(n)], relations=["r0", "r1"], matrices=m, observed=obs,
                    missing=np.zeros((0, 3), dtype=np.int64))


TINY_QUERIES = ["(p r0 e0)", "(p r0 (p r0 e2))", "(np r1 e6)", "(i (p r0 e2) (np r1 e3))", "(u (p r0 e4) (p r1 e5))",
                "(n (p r0 e0))", "(p r1 (n (p r0 e2)))", "(np r0 (np r1 e0))", "(i (n (p r1 e3)) (np r0 e1))"]


# ------------------------------------------------------------------------------ the tests
def sampled_queries(engine, per_structure: int) -> list[str]:
    from engine.lang.query import named, to_sexpr

    out = []
    for s in STRUCTURES:
        for seed in range(per_structure):
            out.append(to_sexpr(named(engine.example(s, seed=seed), engine.artifact)))
    return out


def check_ranks(tmp_path, artifact_arg: str, single, lines: list[str], world: int, runs=None):
    """Every rank's answers and scores (a pickle per rank) against one process's; spawns a group unless ``runs``
    (the outputs' folder of a group that ran the ``answers`` case already) is given."""
    if runs is None:
        qfile = tmp_path / "queries.txt"
        qfile.write_text("\n".join(lines) + "\n")
        cases = {"answers": ["answers", [artifact_arg, str(qfile), str(tmp_path / f"answers-of-{world}.pkl")]]}
        got = run_cases(tmp_path, cases, world)
        assert [g[0] for g in got["answers"]] == [0] * world
        runs = tmp_path
    outs = [runs / f"answers-of-{world}.rank{k}.pkl" for k in range(world)]
    nodes = single.queries(lines)
    want = strip(single.answer(nodes, k=10))
    want_scores = single.scores(nodes)
    ranks = [pickle.loads(o.read_bytes()) for o in outs]
    for k, r in enumerate(ranks):
        assert torch.equal(r["scores"], want_scores), f"rank {k}: scores differ"
        assert r["answers"] == want, f"rank {k}: answers or explanations differ"
    # the explanations carry their witnesses: the same trees, atoms and truth values
    assert any(a.explanation is not None and a.explanation.children for q in want for a in q.answers)
    return ranks


EXPR = "(i (p location_of acquired_abnormality) (np interacts_with bacterium))"


_TWO_RANKS: dict[str, tuple] = {}


@pytest.fixture(scope="session")
def two_ranks(umls_tiny_artifact, tmp_path_factory):
    """The 2-rank group's runs (:func:`two_rank_runs`)."""
    return two_rank_runs(umls_tiny_artifact, tmp_path_factory)


def two_rank_runs(umls_tiny_artifact, tmp_path_factory):
    """One spawned group of 2 ranks for every 2-rank check of this file and test_dist_shard.py (one spawn,
    not one per check): the UMLS answers and scores against one process, and the sharded CLI cases
    (engine.answer on 2 shards, on 3 shards, on an incomplete and on a mixed shard set, verified and not;
    engine.evaluate).  Returns ``(runs, folder, shards)``: ``runs[case]`` is ``[(rc, stdout, stderr) per
    rank]``, ``shards[p]`` the UMLS artifact as p shards.  Run once per test process (test_dist_shard.py's
    fixture calls it too: a fixture imported into another module would be a second one)."""
    import shutil

    if str(umls_tiny_artifact) in _TWO_RANKS:
        return _TWO_RANKS[str(umls_tiny_artifact)]

    from engine.eval.sampling import sample_queries, write_jsonl
    from engine.exec.api import Engine
    from kge.shard import main as shard_main
    from kge.sharding import shard_file_name, write_shards

    d = tmp_path_factory.mktemp("two-ranks")
    shards = {}
    for p in (2, 3):
        shards[p] = d / f"umls.{p}"
        assert shard_main(["--artifact", str(umls_tiny_artifact), "--shards", str(p), "--out", str(shards[p]),
                           "--quiet"]) == 0
    incomplete = d / "incomplete"
    shutil.copytree(shards[2], incomplete)
    (incomplete / shard_file_name(1, 2)).unlink()
    other = d / "other"  # shard 1 of another build: the 7-entity KG's, also 2 shards
    write_shards(tiny_artifact(), 2, other)
    mixed = d / "mixed"
    shutil.copytree(shards[2], mixed)
    shutil.copy(other / shard_file_name(1, 2), mixed / shard_file_name(1, 2))
    single = Engine.load(umls_tiny_artifact)
    (d / "queries.txt").write_text("\n".join(sampled_queries(single, 2)) + "\n")
    qs, _ = sample_queries(single.artifact, list(STRUCTURES), 3, seed=0, progress=False)
    write_jsonl(qs, d / "q.jsonl", single.artifact)
    answer = ["--expr", EXPR, "--top-k", "5"]
    cases = {
        "answers": ["answers", [str(umls_tiny_artifact), str(d / "queries.txt"), str(d / "answers-of-2.pkl")]],
        "answer": ["engine.answer", ["--artifact", str(shards[2]), *answer]],
        "count": ["engine.answer", ["--artifact", str(shards[3]), *answer]],
        "incomplete": ["engine.answer", ["--artifact", str(incomplete), *answer]],
        "mixed": ["engine.answer", ["--artifact", str(mixed), *answer]],
        "mixed unverified": ["engine.answer", ["--artifact", str(mixed), *answer, "--skip-artifact-checksums"]],
        "evaluate": ["engine.evaluate", ["--artifact", str(shards[2]), "--queries", str(d / "q.jsonl"), "--no-progress",
                                         "--batch-size", "5", "--json", str(d / "eval.json")]],
    }
    _TWO_RANKS[str(umls_tiny_artifact)] = run_cases(d, cases, 2), d, shards
    return _TWO_RANKS[str(umls_tiny_artifact)]


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_sharded_answers_scores_explanations_bit_identical(umls_tiny_artifact, two_ranks, tmp_path, world):
    """All 14 BetaE structures (2 sampled queries each) on UMLS (135 entities: P = 2 does not divide N).

    3 ranks is slow (a group of its own, ~10 s of CPU); its fast twins: 2 ranks here (in the shared group),
    and 3 ranks on the 7-entity KG (:func:`test_rank_with_an_empty_block`)."""
    from engine.exec.api import Engine

    runs, d, _ = two_ranks
    single = Engine.load(umls_tiny_artifact)
    lines = (d / "queries.txt").read_text().splitlines()
    if world == 2:
        assert [g[0] for g in runs["answers"]] == [0, 0], [g[2][-2000:] for g in runs["answers"]]
    ranks = check_ranks(tmp_path, str(umls_tiny_artifact), single, lines, world, runs=d if world == 2 else None)
    widths = [r["width"] for r in ranks]
    assert sum(widths) == single.artifact.num_entities and min(widths) > 0
    assert all(r["hops"] for r in ranks)  # projections moved data


def test_rank_with_an_empty_block(tmp_path):
    """3 ranks, 7 entities (P does not divide N): rank 2's block [2, 7) has no entries at all."""
    from engine.exec.api import Engine

    single = Engine.load(tiny_artifact())
    ranks = check_ranks(tmp_path, "tiny:", single, TINY_QUERIES, 3)
    assert [r["width"] for r in ranks] == [1, 1, 5]
    assert ranks[2]["nnz"] == 0 and ranks[0]["nnz"] > 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "ranks":
        raise SystemExit(fork_ranks(sys.argv[2], sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "worker":  # one rank by hand, with torchrun's environment
        raise SystemExit(worker(sys.argv[2:]))
    raise SystemExit("usage: python tests/test_dist_exec.py ranks SPEC OUT_DIR | worker OUT CASES")
