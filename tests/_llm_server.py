"""Shared test helpers for the LLM bridge: a generated KG artifact and the simulated LLM server on 127.0.0.1.

Use from a test module (tests/ is on sys.path, as for ``_ops_helpers``)::

    from _llm_server import llm_artifact, make_artifact, simulator, simulator_process  # noqa: F401

* :func:`make_artifact` writes a real artifact folder for a generated KG with
  half of its edge pairs moved to ``missing.tsv``.  By default its matrices hold
  the observed edges only (value 1.0; no training: fast, no pykeen); with
  ``train=True`` it is built by :func:`kge.build.build_artifact` (ComplEx rank 4,
  1 epoch: calibrated predictions too, about 5 s).
* ``llm_artifact``: a session-scoped fixture with the default generated artifact.
* :func:`simulator`: a context manager running the simulator in a thread of
  this process on a free port; yields the :class:`~llm_bridge.simulate.SimulatorServer`
  (``.base_url``, ``.stats``); stops it on exit.
* :func:`simulator_process`: the same as a separate ``python -m llm_bridge.simulate``
  process (the CLI path); yields the base URL.
* ``local_llm``: a session-scoped fixture for ``pytest -m llm`` tests: llama.cpp's
  server with SmolLM2 (:mod:`llm_bridge.local`) on 127.0.0.1; yields its
  :class:`~llm_bridge.local.LocalServer` (``.base_url``).  Skipped unless ``-m``
  selects ``llm``, and skipped (with what to install) when llama-cpp-python or
  the GGUF is missing.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pytest
import scipy.sparse as sp

if TYPE_CHECKING:
    from llm_bridge.simulate import SimulatorServer

ROOT = Path(__file__).resolve().parents[1]
RELATIONS = ("parent_of", "likes", "located_in", "works_with")


def generate_kg(*, num_entities: int = 150, relations: Sequence[str] = RELATIONS, max_fanout: int = 4,
                seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """(entity names, relation names in X, X^-1 pairs, (E, 3) id triples with both directions of every edge).

    Every head gets 0..max_fanout tails per relation (uniform), so projections
    have small true answer sets the simulator returns in full.
    """
    rng = np.random.default_rng(seed)
    entities = [f"Entity_{i:03d}" for i in range(num_entities)]
    names: list[str] = []
    for r in relations:
        names += [r, r + "^-1"]
    edges = set()
    for h in range(num_entities):
        for k in range(len(relations)):
            for t in rng.choice(num_entities, size=int(rng.integers(0, max_fanout + 1)), replace=False):
                if int(t) != h:
                    edges.add((h, 2 * k, int(t)))
    fwd = np.array(sorted(edges), dtype=np.int64).reshape(-1, 3)
    inv = np.stack([fwd[:, 2], fwd[:, 1] + 1, fwd[:, 0]], axis=1)
    return entities, names, np.concatenate([fwd, inv])


def make_artifact(path: str | os.PathLike, *, drop: float = 0.5, seed: int = 0, train: bool = False,
                  **kg_options) -> Path:
    """Write an artifact folder for :func:`generate_kg` with ``drop`` of its edge pairs missing."""
    path = Path(path)
    entities, relations, triples = generate_kg(seed=seed, **kg_options)
    if train:
        from kge.build import BuildConfig, build_artifact

        path.parent.mkdir(parents=True, exist_ok=True)
        tsv = path.parent / f"{path.name}-kg.tsv"
        fwd = triples[triples[:, 1] % 2 == 0]
        tsv.write_text("".join(f"{entities[h]}\t{relations[r]}\t{entities[t]}\n" for h, r, t in fwd), encoding="utf-8")
        build_artifact(BuildConfig(kg=str(tsv), out=str(path), drop_edges=drop, seed=seed, rank=4, epochs=1,
                                   eval_max_triples=50, device="cpu"), progress=False)
        return path
    from kge.artifact import Artifact

    fwd = triples[triples[:, 1] % 2 == 0]
    rng = np.random.default_rng(seed + 1)
    dropped = np.zeros(len(fwd), dtype=bool)
    dropped[rng.permutation(len(fwd))[: int(round(drop * len(fwd)))]] = True

    def both(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.stack([x[:, 2], x[:, 1] + 1, x[:, 0]], axis=1)])

    observed, missing = both(fwd[~dropped]), both(fwd[dropped])
    n, r = len(entities), len(relations)
    rows = observed[:, 1] * n + observed[:, 0]
    matrices = sp.csr_matrix((np.ones(len(observed), dtype=np.float32), (rows, observed[:, 2])), shape=(r * n, n))
    art = Artifact(entities=entities, relations=relations, matrices=matrices, observed=observed, missing=missing,
                   meta={"source": "generated:tests/_llm_server.py", "generator_seed": seed})
    art.save(path)
    return path


@pytest.fixture(scope="session")
def llm_artifact(tmp_path_factory) -> Path:
    """The default generated artifact (150 entities, 4 relations + inverses, half the edges missing)."""
    return make_artifact(tmp_path_factory.mktemp("llm") / "artifact")


@contextlib.contextmanager
def simulator(artifact, **config) -> Iterator["SimulatorServer"]:
    """Run the simulator in a background thread on 127.0.0.1:<free port>; ``config``: SimulatorConfig fields."""
    from llm_bridge.simulate import SimulatorConfig, start_server

    server = start_server(artifact, SimulatorConfig(**config), host="127.0.0.1", port=0)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def simulator_process(artifact, *args: str, startup_s: float = 60.0) -> Iterator[str]:
    """Run ``python -m llm_bridge.simulate --artifact ARTIFACT --port 0 ARGS`` and yield its base URL."""
    cmd = [sys.executable, "-m", "llm_bridge.simulate", "--artifact", str(artifact), "--port", "0", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + startup_s
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line or proc.poll() is not None:
                break
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        if m is None:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"simulator did not start: {line!r} {err[-2000:]!r}")
        yield m.group(1)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="session")
def local_llm(request):
    """llama.cpp's server with SmolLM2 on 127.0.0.1 (opt-in: ``pytest -m llm``)."""
    if "llm" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in: run with pytest -m llm")
    from kgreason.errors import UserError
    from llm_bridge.local import check_llama_cpp, find_gguf, start_local_server

    try:
        find_gguf()
        check_llama_cpp()
    except UserError as exc:
        pytest.skip(str(exc))
    server = start_local_server(n_threads=2)
    try:
        yield server
    finally:
        server.stop()
