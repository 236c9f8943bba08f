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

import contextlib
import dataclasses
import io
import json
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
def answers_and_scores(artifact: str, queries: str, out: str, max_normalisers: int | None = None,
                       frontier_k: int | None = None) -> None:
    """This rank's answers and scores of the queries (one per line of the file ``queries``) into ``out``
    (collective: every rank of the group calls it); lazy rows with ``max_normalisers`` kept between batches when
    given (and the normalisers forgotten, the exchanges in the pickle); ``frontier_k``: the executor's."""
    from engine.exec.api import Engine
    from engine.exec.sharded_load import init_from_env

    group = init_from_env(timeout_s=60)  # the group already joined
    eng = Engine.load(tiny_artifact() if artifact == "tiny:" else artifact, process_group=group, frontier_k=frontier_k)
    ex = eng.executor
    if max_normalisers is not None:
        ex.rows.max_normalisers = max_normalisers
    lines = [l for l in Path(queries).read_text().splitlines() if l.strip()]
    nodes = eng.queries(lines)
    res = eng.answer(nodes, k=10)
    scores = eng.scores(nodes)
    lazy = {"evicted": ex.rows.normalisers_evicted, "exchanges": ex.rows.exchanges,
            "table": len(ex.rows._norm_keys)} if hasattr(ex.rows, "normalisers_evicted") else {}
    with open(out.replace(".pkl", f".rank{ex.comm.rank}.pkl"), "wb") as f:
        pickle.dump({"answers": strip(res), "scores": scores, "width": ex.width, "nnz": ex.shard.nnz,
                     "hops": [tuple(h) for h in ex.hops], **lazy}, f)


def lazy_rows(artifact: str, out: str) -> None:
    """This rank's columns of every calibrated row of a lazy KG (sharded: :class:`engine.exec.sharded_lazy.LazyShardRows`)
    into ``out`` (collective), asked in two requests (the second half's rows first, then all: some rows normalised,
    some not)."""
    from engine.exec.api import Engine
    from engine.exec.sharded_lazy import LazyShardRows
    from engine.exec.sharded_load import init_from_env

    eng = Engine.load(artifact, process_group=init_from_env(timeout_s=60))
    rows = eng.executor.rows
    assert isinstance(rows, LazyShardRows)
    n, r = rows.num_entities, rows.num_relations
    rows.row_sets([(k, np.arange(n // 2, n)) for k in range(r)])
    sets = rows.row_sets([(k, np.arange(n)) for k in range(r)])
    with open(out.replace(".pkl", f".rank{rows.comm.rank}.pkl"), "wb") as f:
        pickle.dump({"lo": rows.shard.lo, "hi": rows.shard.hi, "exchanges": rows.exchanges,
                     "normalised": rows.rows_normalised,
                     "rows": [(s.heads, s.indptr, s.cols.astype(np.int64) + rows.shard.lo, s.vals) for s in sets]}, f)


LGOT_QUERIES = ["(p r A)", "(p s (p r A))", "(u (p r A) (p s B))", "(i (p r A) (p s B))", "(np s (p r A))",
                "(i (p r A) (n (p s B)))"]
LGOT_SCRIPT = {("r", ("A",)): ['["B", "D"]', '["B", "D"]', '["B"]', '["F"]'],
               ("s", ("B",)): ['["D"]', '["D", "E"]', "I don't know", '["D"]'],
               ("s", ("B", "C", "D", "F")): ['["E"]', '["E", "A"]', '["E"]', '["F"]'],
               ("s", ("B", "C")): ['["E"]', '["E"]', '["D"]', '["A"]']}


def lgot_results(out: str) -> None:
    """The LLM bridge (LGOT hook, a scripted LLM client) over test_llm_lgot.py's 6-entity KG on this rank, and how
    many prompt batches this rank's client was sent, into ``out`` (collective)."""
    from test_llm_lgot import ScriptedClient, tiny_artifact as lgot_artifact

    from engine.exec.api import Engine
    from engine.exec.sharded_load import init_from_env
    from engine.lang.query import parse
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    art = lgot_artifact()
    client = ScriptedClient(LGOT_SCRIPT)
    hook = LGOTHook(client=client, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
    eng = Engine.load(art, process_group=init_from_env(timeout_s=60), hooks=[hook], backend="reference")
    res = eng.executor.answer([parse(q) for q in LGOT_QUERIES], k=6)
    with open(out.replace(".pkl", f".rank{eng.executor.comm.rank}.pkl"), "wb") as f:
        pickle.dump({"answers": strip(res), "batches": len(client.batches),
                     "notes": [r.trace.root.notes if r.trace is not None else None for r in res]}, f)


def llm_answer(argv: list[str], out: str) -> int:
    """``engine.answer.main(argv)`` on this rank, counting the LLM clients built and the response caches opened in
    this process (written to ``out`` with the rank's number)."""
    import json

    import torch.distributed as dist

    from engine.answer import main
    from llm_bridge import cache, client

    opened = {"clients": 0, "caches": 0}
    inits = (client.LLMClient.__init__, cache.ResponseCache.__init__)

    def counted(kind, init):
        def wrapped(self, *a, **kw):
            opened[kind] += 1
            init(self, *a, **kw)
        return wrapped

    client.LLMClient.__init__ = counted("clients", inits[0])  # type: ignore[method-assign]
    cache.ResponseCache.__init__ = counted("caches", inits[1])  # type: ignore[method-assign]
    try:
        rc = main(argv)
    finally:
        client.LLMClient.__init__, cache.ResponseCache.__init__ = inits  # type: ignore[method-assign]
    Path(out.replace(".json", f".rank{dist.get_rank()}.json")).write_text(json.dumps(opened))
    return rc


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
            if module in ("answers", "lazy_rows", "lgot"):
                {"answers": answers_and_scores, "lazy_rows": lazy_rows, "lgot": lgot_results}[module](*args)
                rc = 0
            elif module == "llm_answer":
                rc = llm_answer(*args)
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


def random_lazy_artifact(folder: Path, seed: int = 0, n: int = 41, r: int = 3) -> Path:
    """A random lazy artifact (rows computed from the embeddings) saved in ``folder``: 41 entities (P = 2, 3 do not
    divide N), 3 relations, 90 known edges (and up to 30 held out), threshold 2e-3 (rows of a few to a few dozen
    entries)."""
    from test_kge_lazy import random_embeddings, random_observed

    from kge.artifact import Artifact
    from kge.lazy import LazyMatrices

    rng = np.random.default_rng(seed)
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 90)
    missing = random_observed(rng, n, r, 30)  # held-out edges: the hard answers engine.evaluate ranks
    Artifact(entities=[f"e{i}" for i in range(n)], relations=[f"r{k}" for k in range(r)], observed=obs,
             missing=missing[~(missing[:, None, :] == obs[None]).all(2).any(1)],
             matrices=LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=0)).save(folder)
    return folder


def assert_close(got, want, tol: float = 1e-6, where: str = "") -> None:
    """JSON-like ``got`` equals ``want``, floats within ``tol``."""
    if isinstance(want, float) or isinstance(got, float):
        assert abs(got - want) <= tol, f"{where}: {got} != {want}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            assert_close(got[key], want[key], tol, f"{where}/{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            assert_close(a, b, tol, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def check_lazy_ranks(single, lines: list[str], outs: list[Path]) -> list[dict]:
    """Every rank's answers, explanations and scores (pickles ``outs``) within 1e-6 of one lazy process's, the same
    entities in the same order."""
    nodes = single.queries(lines)
    def trees(results):  # the explanations' trees (their text rounds the numbers: compared through the trees)
        return [[{**a.to_json(), "explanation": a.explanation and a.explanation.to_json()} for a in q.answers]
                for q in results]

    want = trees(single.answer(nodes, k=10))
    want_scores = single.scores(nodes)
    ranks = [pickle.loads(o.read_bytes()) for o in outs]
    for k, r in enumerate(ranks):
        assert float((r["scores"] - want_scores).abs().max()) <= 1e-6, f"rank {k}: scores differ"
        assert_close(trees(r["answers"]), want, where=f"rank {k}")
    assert any(a["explanation"] and a["explanation"].get("children") for q in want for a in q)
    return ranks


# ------------------------------------------------------------------------------ the tests
def sampled_queries(engine, per_structure: int) -> list[str]:
    from engine.lang.query import named, to_sexpr

    out = []
    for s in STRUCTURES:
        for seed in range(per_structure):
            out.append(to_sexpr(named(engine.example(s, seed=seed), engine.artifact)))
    return out


def check_ranks(tmp_path, artifact_arg: str, single, lines: list[str], world: int, runs=None, name: str = "answers"):
    """Every rank's answers and scores (a pickle per rank) against one process's; spawns a group unless ``runs``
    (the outputs' folder of a group that ran the ``answers`` case already, its pickles ``{name}-of-{world}``) is
    given."""
    if runs is None:
        qfile = tmp_path / "queries.txt"
        qfile.write_text("\n".join(lines) + "\n")
        cases = {"answers": ["answers", [artifact_arg, str(qfile), str(tmp_path / f"answers-of-{world}.pkl")]]}
        got = run_cases(tmp_path, cases, world)
        assert [g[0] for g in got["answers"]] == [0] * world
        runs = tmp_path
    outs = [runs / f"{name}-of-{world}.rank{k}.pkl" for k in range(world)]
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
LLM_EXPR = "(u (p likes (p parent_of Entity_003)) (p located_in Entity_007))"


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
    lazy = random_lazy_artifact(d / "lazy")
    lazy_art = Engine.load(lazy).artifact
    for p in (2, 3):
        write_shards(lazy_art, p, d / f"lazy.{p}")
    lazy_mixed = d / "lazy-mixed"  # shard 1 of another lazy build (other embeddings)
    shutil.copytree(d / "lazy.2", lazy_mixed)
    write_shards(Engine.load(random_lazy_artifact(d / "lazy-other", seed=1)).artifact, 2, d / "lazy-other.2")
    shutil.copy(d / "lazy-other.2" / shard_file_name(1, 2), lazy_mixed / shard_file_name(1, 2))
    (d / "lazy-queries.txt").write_text("\n".join(sampled_queries(Engine.load(lazy_art), 1)) + "\n")
    lazy_qs, _ = sample_queries(lazy_art, list(STRUCTURES), 1, seed=0, progress=False)
    write_jsonl(lazy_qs, d / "lazy-q.jsonl", lazy_art)
    single = Engine.load(umls_tiny_artifact)
    (d / "queries.txt").write_text("\n".join(sampled_queries(single, 2)) + "\n")
    qs, _ = sample_queries(single.artifact, list(STRUCTURES), 3, seed=0, progress=False)
    write_jsonl(qs, d / "q.jsonl", single.artifact)
    answer = ["--expr", EXPR, "--top-k", "5"]
    # engine.answer --llm on 2 ranks against one process, on the simulated LLM server (tests/_llm_server.py)
    from _llm_server import make_artifact, simulator

    llm_art = make_artifact(d / "llm-artifact")
    llm = ["--artifact", str(llm_art), "--expr", LLM_EXPR, "--json", "--llm", "--llm-model", "m",
           "--llm-relation-questions", "fallback"]  # no relation-question requests: the projections' only
    stack = contextlib.ExitStack()
    srv = stack.enter_context(simulator(llm_art))
    llm += ["--llm-base-url", srv.base_url]
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        from engine.answer import main as answer_main

        assert answer_main(llm + ["--llm-cache", str(d / "llm-one.sqlite")]) == 0, se.getvalue()
    llm_single = {"stdout": so.getvalue(), "requests": srv.stats["requests"]}
    cases = {
        "answers": ["answers", [str(umls_tiny_artifact), str(d / "queries.txt"), str(d / "answers-of-2.pkl")]],
        "answer": ["engine.answer", ["--artifact", str(shards[2]), *answer]],
        "count": ["engine.answer", ["--artifact", str(shards[3]), *answer]],
        "incomplete": ["engine.answer", ["--artifact", str(incomplete), *answer]],
        "mixed": ["engine.answer", ["--artifact", str(mixed), *answer]],
        "mixed unverified": ["engine.answer", ["--artifact", str(mixed), *answer, "--skip-artifact-checksums"]],
        "evaluate": ["engine.evaluate", ["--artifact", str(shards[2]), "--queries", str(d / "q.jsonl"), "--no-progress",
                                         "--batch-size", "5", "--json", str(d / "eval.json")]],
        # lazy rows sharded: from its shard folder (from the whole lazy artifact: the 3-rank group), every row, the
        # CLIs; errors of a lazy folder
        "lazy shard answers": ["answers", [str(d / "lazy.2"), str(d / "lazy-queries.txt"),
                                           str(d / "lazy-shards-answers-of-2.pkl")]],
        "lazy rows": ["lazy_rows", [str(d / "lazy.2"), str(d / "lazy-rows.pkl")]],
        # the normaliser table bounded to 2 rows between batches: rows forgotten and exchanged again
        "lazy tiny table": ["answers", [str(d / "lazy.2"), str(d / "lazy-queries.txt"),
                                        str(d / "lazy-tiny-table.pkl"), 2]],
        "lgot": ["lgot", [str(d / "lgot.pkl")]],
        "lazy answer": ["engine.answer", ["--artifact", str(d / "lazy.2"), "--expr", "(p r0 (p r1 e3))", "--top-k", "3"]],
        "lazy count": ["engine.answer", ["--artifact", str(d / "lazy.3"), "--expr", "(p r0 e3)"]],
        "lazy mixed": ["engine.answer", ["--artifact", str(lazy_mixed), "--expr", "(p r0 e3)"]],
        "lazy evaluate": ["engine.evaluate", ["--artifact", str(d / "lazy.2"), "--queries", str(d / "lazy-q.jsonl"),
                                              "--no-progress", "--batch-size", "5", "--json", str(d / "lazy-eval.json")]],
        # frontier cuts: the UMLS queries (cuts at ties of calibrated values), the lazy KG's, the CLI
        "answers k": ["answers", [str(umls_tiny_artifact), str(d / "queries.txt"), str(d / "answers-k3-of-2.pkl"), None, 3]],
        "lazy k": ["answers", [str(d / "lazy.2"), str(d / "lazy-queries.txt"), str(d / "lazy-k2-of-2.pkl"), None, 2]],
        "answer k": ["engine.answer", ["--artifact", str(shards[2]), *answer, "--frontier-k", "2", "--json"]],
        "evaluate k": ["engine.evaluate", ["--artifact", str(shards[2]), "--queries", str(d / "q.jsonl"), "--no-progress",
                                           "--batch-size", "5", "--frontier-k", "3", "--json", str(d / "eval-k3.json")]],
        "llm answer": ["llm_answer", [llm + ["--llm-cache", str(d / "llm-two.sqlite")], str(d / "llm-opened.json")]],
        "llm bad cache": ["engine.answer", llm + ["--llm-cache", str(d)]],  # a folder: rank 0's client refuses it
        # the lazy rows' flags: each rank's cache budget; the persisted store refused
        "row cache": ["engine.answer", ["--artifact", str(d / "lazy.2"), "--expr", "(p r0 (p r1 e3))", "--top-k", "3",
                                        "--row-cache-gb", "0.001"]],
        "row store": ["engine.answer", ["--artifact", str(d / "lazy.2"), "--expr", "(p r0 e3)", "--row-store-gb", "1"]],
        "evaluate row cache": ["engine.evaluate", ["--artifact", str(d / "lazy.2"), "--queries", str(d / "lazy-q.jsonl"),
                                                   "--no-progress", "--batch-size", "5", "--row-cache-gb", "0.001",
                                                   "--json", str(d / "lazy-eval-cache.json")]],
    }
    with stack:
        requests0 = srv.stats["requests"]
        got = run_cases(d, cases, 2)
        llm_single["group_requests"] = srv.stats["requests"] - requests0
    (d / "llm-single.json").write_text(json.dumps(llm_single))
    _TWO_RANKS[str(umls_tiny_artifact)] = got, d, shards
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


def test_lazy_sharded_rows_equal_single_process_rows(two_ranks):
    """Every calibrated row of a random lazy KG, its columns computed on 2 ranks (the softmax normaliser and the count of
    known tails from one exchange per request), equals the single-process lazy row within 1e-6: the same entries."""
    from engine.exec.api import Engine

    runs, d, _ = two_ranks
    assert [g[0] for g in runs["lazy rows"]] == [0, 0], [g[2][-2000:] for g in runs["lazy rows"]]
    lazy = Engine.load(d / "lazy").artifact.matrices
    n, r = lazy.num_entities, lazy.num_relations
    ranks = [pickle.loads((d / f"lazy-rows.rank{k}.pkl").read_bytes()) for k in range(2)]
    assert [(x["lo"], x["hi"]) for x in ranks] == [(0, 20), (20, 41)]
    # the first request normalised half the rows, the second the other half: one exchange each
    assert [(x["exchanges"], x["normalised"]) for x in ranks] == [(2, r * n)] * 2
    for rel in range(r):
        ptr, cols, vals = lazy.rows(np.arange(rel * n, (rel + 1) * n))
        for h in range(n):
            want_c, want_v = cols[ptr[h]:ptr[h + 1]], vals[ptr[h]:ptr[h + 1]]
            got_c, got_v = [], []
            for x in ranks:
                heads, p, c, v = x["rows"][rel]
                assert heads[h] == h
                got_c.append(c[p[h]:p[h + 1]])
                got_v.append(v[p[h]:p[h + 1]])
            assert np.array_equal(np.concatenate(got_c), want_c), (rel, h)
            assert float(np.abs(np.concatenate(got_v) - want_v).max(initial=0)) <= 1e-6, (rel, h)
    assert sum(len(x["rows"][r - 1][2]) for x in ranks) == int(ptr[-1])  # the last relation: every entry


def test_lazy_sharded_answers_within_1e6_of_one_process(two_ranks):
    """The 14 structures on a random lazy KG with 2 ranks from its shard folder (kge.shard): answers in the same order,
    scores and explanations within 1e-6 of one process.  (From the lazy artifact itself, every rank cutting its shard:
    :func:`test_rank_with_an_empty_block`'s group of 3.)"""
    from engine.exec.api import Engine

    runs, d, _ = two_ranks
    assert [g[0] for g in runs["lazy shard answers"]] == [0, 0], [g[2][-2000:] for g in runs["lazy shard answers"]]
    lines = (d / "lazy-queries.txt").read_text().splitlines()
    check_lazy_ranks(Engine.load(d / "lazy"), lines, [d / f"lazy-shards-answers-of-2.rank{k}.pkl" for k in range(2)])


def test_lazy_sharded_answers_with_a_tiny_normaliser_table(two_ranks):
    """The normaliser table bounded to 2 rows between batches (engine.exec.sharded_lazy.LazyShardRows.begin_batch):
    rows forgotten on both ranks alike and exchanged again, the answers, scores and explanations still within 1e-6 of
    one process; the table ends at most 2 rows + the last batch's."""
    from engine.exec.api import Engine

    runs, d, _ = two_ranks
    assert [g[0] for g in runs["lazy tiny table"]] == [0, 0], [g[2][-2000:] for g in runs["lazy tiny table"]]
    lines = (d / "lazy-queries.txt").read_text().splitlines()
    ranks = check_lazy_ranks(Engine.load(d / "lazy"), lines, [d / f"lazy-tiny-table.rank{k}.pkl" for k in range(2)])
    unbounded = pickle.loads((d / "lazy-shards-answers-of-2.rank0.pkl").read_bytes())
    assert unbounded["evicted"] == 0
    assert ranks[0]["evicted"] > 0 and ranks[0]["evicted"] == ranks[1]["evicted"]
    # forgotten rows asked again took more exchanges (every rank the same)
    assert ranks[0]["exchanges"] == ranks[1]["exchanges"] > unbounded["exchanges"]
    assert ranks[0]["table"] == ranks[1]["table"] < unbounded["table"]


def test_llm_bridge_sharded_same_answers_one_llm_call(two_ranks):
    """The LGOT hook on 2 ranks with a scripted LLM: prompts made and the LLM asked on rank 0 only, once per node as in
    one process; the linked answers merged into the owners' blocks: answers, scores, provenance and explanations
    equal one process's (==), on projections, chains, i/u/n and a negated projection."""
    from test_llm_lgot import ScriptedClient, tiny_artifact as lgot_artifact

    from engine.exec.executor import Executor
    from engine.lang.query import parse
    from llm_bridge.lgot import LGOTHook, LGOTSettings

    runs, d, _ = two_ranks
    assert [g[0] for g in runs["lgot"]] == [0, 0], [g[2][-2000:] for g in runs["lgot"]]
    art = lgot_artifact()
    client = ScriptedClient(LGOT_SCRIPT)
    hook = LGOTHook(client=client, artifact=art, settings=LGOTSettings(relation_questions="fallback"))
    want = Executor(art, hooks=[hook], backend="reference").answer([parse(q) for q in LGOT_QUERIES], k=6)
    ranks = [pickle.loads((d / f"lgot.rank{k}.pkl").read_bytes()) for k in range(2)]
    assert [r["batches"] for r in ranks] == [len(client.batches), 0] and len(client.batches) > 0
    for k, r in enumerate(ranks):
        assert r["answers"] == strip(want), f"rank {k}"
    assert ranks[0]["notes"] == [r.trace.root.notes for r in want]  # rank 0's trace holds the hook's notes
    provenance = {a.provenance for q in want for a in q.answers}
    assert {"llm", "both", "kg"} <= provenance  # the LLM's answers were merged, some only from the LLM


def _cut_at_ties(single, lines: list[str]) -> int:
    """How many projection inputs of one process's run of ``lines`` the frontier cut split inside a tie (entries equal
    to the k-th value both kept and dropped): where the tie rule (smaller ids) decides."""
    import ops

    ex = single.executor
    k, seen, cut = ex.frontier_k, [], ops.topk_prune
    def spy(x, kk, **kw):
        out = cut(x, kk, **kw)
        thr = torch.topk(x, kk, dim=1).values[:, -1:]
        at = (x == thr) & (thr > 0)
        seen.append(int(((at & (out > 0)).any(1) & (at & (out == 0)).any(1)).sum()))
        return out
    ops.topk_prune = spy
    try:
        single.answer(lines, k=10)
    finally:
        ops.topk_prune = cut
    assert k is not None
    return sum(seen)


def test_sharded_frontier_k_equals_one_process(umls_tiny_artifact, two_ranks, tmp_path):
    """``frontier_k`` sharded (each rank's best entries, one gather, the same stable merge as top-k): the 14 structures on
    UMLS with k = 3 give one process's answers, scores and explanations bit for bit (==, torch.equal), cuts splitting
    ties of calibrated values included; the random lazy KG with k = 2 within 1e-6; ``engine.answer --frontier-k``
    on 2 shards prints one process's JSON and ``engine.evaluate --frontier-k`` gives its metrics exactly.  The cut
    changes results (it is not the exact run)."""
    from engine.answer import main
    from engine.exec.api import Engine

    runs, d, _ = two_ranks
    for case in ("answers k", "lazy k", "answer k"):
        assert [g[0] for g in runs[case]] == [0, 0], (case, [g[2][-2000:] for g in runs[case]])
    lines = (d / "queries.txt").read_text().splitlines()
    single = Engine.load(umls_tiny_artifact, frontier_k=3)
    check_ranks(tmp_path, str(umls_tiny_artifact), single, lines, 2, runs=d, name="answers-k3")
    assert _cut_at_ties(single, lines) > 0  # the tie rule was exercised
    exact = Engine.load(umls_tiny_artifact)
    assert strip(exact.answer(lines, k=10)) != strip(single.answer(lines, k=10))
    lazy_lines = (d / "lazy-queries.txt").read_text().splitlines()
    check_lazy_ranks(Engine.load(d / "lazy", frontier_k=2), lazy_lines, [d / f"lazy-k2-of-2.rank{k}.pkl" for k in range(2)])
    so = io.StringIO()
    with contextlib.redirect_stdout(so):
        assert main(["--artifact", str(umls_tiny_artifact), "--expr", EXPR, "--top-k", "5", "--frontier-k", "2",
                     "--json"]) == 0
    assert runs["answer k"][0][1] == so.getvalue() and runs["answer k"][1][1] == ""
    # engine.evaluate --frontier-k: one process's metrics exactly (and not the exact run's)
    assert [g[0] for g in runs["evaluate k"]] == [0, 0], [g[2][-2000:] for g in runs["evaluate k"]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from engine.evaluate import main as evaluate_main

        assert evaluate_main(["--artifact", str(umls_tiny_artifact), "--queries", str(d / "q.jsonl"), "--no-progress",
                              "--batch-size", "5", "--frontier-k", "3", "--json", str(tmp_path / "one-k3.json")]) == 0
    one = json.loads((tmp_path / "one-k3.json").read_text())["results"]
    assert json.loads((d / "eval-k3.json").read_text())["results"] == one
    assert one != json.loads((d / "eval.json").read_text())["results"]


def test_llm_answer_under_torchrun_rank_zero_only(two_ranks):
    """``engine.answer --llm`` on 2 ranks against the simulated LLM server: rank 0 alone builds the client and opens
    ``--llm-cache`` (rank 1: none of either, and no summary line); the server gets the requests one process sends, the
    cache is written once (as many entries as one process's) and the JSON output is one process's.  A client rank 0
    cannot build (a folder as --llm-cache) ends both ranks with its line."""
    import sqlite3

    runs, d, _ = two_ranks
    assert [g[0] for g in runs["llm answer"]] == [0, 0], [g[2][-2000:] for g in runs["llm answer"]]
    single = json.loads((d / "llm-single.json").read_text())
    opened = [json.loads((d / f"llm-opened.rank{k}.json").read_text()) for k in range(2)]
    assert opened == [{"clients": 1, "caches": 1}, {"clients": 0, "caches": 0}]
    assert single["requests"] > 0 and single["group_requests"] == single["requests"]
    assert runs["llm answer"][0][1] == single["stdout"] and runs["llm answer"][1][1] == ""
    assert "llm: " in runs["llm answer"][0][2] and "llm: " not in runs["llm answer"][1][2]
    counts = []
    for name in ("llm-one.sqlite", "llm-two.sqlite"):
        with contextlib.closing(sqlite3.connect(d / name)) as conn:
            counts.append(conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
    assert counts[0] == counts[1] > 0
    assert any(a["provenance"] != "kg" for a in json.loads(single["stdout"])["answers"])  # the LLM's answers merged
    # rank 0 cannot build its client: one line on every rank, at once (not the others waiting for the timeout)
    want = f"LLM cache {d} is a folder: it is not a kgreason LLM cache and was not modified"
    for k, (rc, out, err) in enumerate(runs["llm bad cache"]):
        lines = [l for l in err.splitlines() if l.strip()]
        assert rc == 2 and out == "" and len(lines) == 1, err
        assert lines[0].startswith("error: " + ("rank 0: " if k else "") + want), lines


def test_row_flags_under_torchrun(two_ranks):
    """Under torchrun ``--row-cache-gb`` is each rank's lazy-row cache budget (engine.answer used to load the shard
    folder as an artifact and fail, engine.evaluate refused it): the answers and metrics of the run without it; a
    ``--row-store-gb`` above 0 (a persisted store the sharded rows do not use) is one error line on every rank."""
    runs, d, _ = two_ranks
    for case in ("row cache", "evaluate row cache"):
        assert [g[0] for g in runs[case]] == [0, 0], (case, [g[2][-2000:] for g in runs[case]])
    assert runs["row cache"][0][1] == runs["lazy answer"][0][1] and runs["row cache"][1][1] == ""
    assert (json.loads((d / "lazy-eval-cache.json").read_text())["results"]
            == json.loads((d / "lazy-eval.json").read_text())["results"])
    for rc, out, err in runs["row store"]:
        lines = [l for l in err.splitlines() if l.strip()]
        assert rc == 2 and out == "" and lines == ["error: --row-store-gb 1: the persisted row store is not used in a "
                                                   "sharded run (each rank computes its own columns of a row and keeps "
                                                   "them in its --row-cache-gb cache); leave it out, or run one process"]


def test_rank_with_an_empty_block(tmp_path):
    """3 ranks, 7 entities (P does not divide N): rank 2's block [2, 7) has no entries at all.  The same group of 3
    runs the random lazy KG's 14 structures (41 entities in blocks of 13, 14, 14): within 1e-6 of one process; and the
    7-entity queries with ``frontier_k=1`` (cuts inside ties spanning the 3 blocks): one process's, bit for bit."""
    from engine.exec.api import Engine

    single = Engine.load(tiny_artifact())
    lazy = random_lazy_artifact(tmp_path / "lazy")
    lazy_single = Engine.load(lazy)
    lazy_lines = sampled_queries(lazy_single, 1)
    (tmp_path / "queries.txt").write_text("\n".join(TINY_QUERIES) + "\n")
    (tmp_path / "lazy-queries.txt").write_text("\n".join(lazy_lines) + "\n")
    got = run_cases(tmp_path, {
        "answers": ["answers", ["tiny:", str(tmp_path / "queries.txt"), str(tmp_path / "answers-of-3.pkl")]],
        "lazy": ["answers", [str(lazy), str(tmp_path / "lazy-queries.txt"), str(tmp_path / "lazy-of-3.pkl")]],
        "k1": ["answers", ["tiny:", str(tmp_path / "queries.txt"), str(tmp_path / "tiny-k1-of-3.pkl"), None, 1]]}, 3)
    assert all(g[0] == 0 for case in got.values() for g in case)
    ranks = check_ranks(tmp_path, "tiny:", single, TINY_QUERIES, 3, runs=tmp_path)
    assert [r["width"] for r in ranks] == [1, 1, 5]
    assert ranks[2]["nnz"] == 0 and ranks[0]["nnz"] > 0
    # frontier_k = 1 on 3 ranks: complements tie at 1 on entities of every block; the smallest id survives
    k1 = Engine.load(tiny_artifact(), frontier_k=1)
    check_ranks(tmp_path, "tiny:", k1, TINY_QUERIES, 3, runs=tmp_path, name="tiny-k1")
    assert _cut_at_ties(k1, TINY_QUERIES) > 0
    lazy_ranks = check_lazy_ranks(lazy_single, lazy_lines, [tmp_path / f"lazy-of-3.rank{k}.pkl" for k in range(3)])
    assert [r["width"] for r in lazy_ranks] == [13, 14, 14]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "ranks":
        raise SystemExit(fork_ranks(sys.argv[2], sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "worker":  # one rank by hand, with torchrun's environment
        raise SystemExit(worker(sys.argv[2:]))
    raise SystemExit("usage: python tests/test_dist_exec.py ranks SPEC OUT_DIR | worker OUT CASES")


def test_max_normalisers_setting(monkeypatch):
    """KGREASON_LAZY_MAX_NORMALISERS: the lazy ranks' normaliser bound; a bad value is one error naming the setting."""
    from engine.exec.sharded_lazy import DEFAULT_MAX_NORMALISERS, MAX_NORMALISERS_ENV, max_normalisers_from_env
    from kgreason.errors import UserError

    monkeypatch.delenv(MAX_NORMALISERS_ENV, raising=False)
    assert max_normalisers_from_env() == DEFAULT_MAX_NORMALISERS
    for raw, want in (("12", 12), (" 0 ", 0), ("", DEFAULT_MAX_NORMALISERS)):
        monkeypatch.setenv(MAX_NORMALISERS_ENV, raw)
        assert max_normalisers_from_env() == want
    for raw in ("-1", "lots", "1e6"):
        monkeypatch.setenv(MAX_NORMALISERS_ENV, raw)
        with pytest.raises(UserError, match=f"{MAX_NORMALISERS_ENV}: expected an integer >= 0 .*got '{raw}'"):
            max_normalisers_from_env()
