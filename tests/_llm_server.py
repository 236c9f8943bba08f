"""Shared test helpers for the LLM bridge: a generated KG artifact and the simulated LLM server on 127.0.0.1.

Use from a test module (tests/ is on sys.path, as for ``_ops_helpers``); the two fixtures are
registered for every module by tests/conftest.py, so a module imports only the helpers::

    from _llm_server import make_artifact, simulator, simulator_process

* :func:`make_artifact` writes a real artifact folder for a generated KG with
  half of its edge pairs moved to ``missing.tsv``.  By default its matrices hold
  the observed edges only (value 1.0; no training: fast, no pykeen); with
  ``train=True`` it is built by :func:`kge.build.build_artifact` (ComplEx rank 4,
  1 epoch: calibrated predictions too, about 5 s).
* ``llm_artifact``: a session-scoped fixture with the default generated artifact.
* :func:`simulator`: a context manager running the simulator in a thread of
  this process on a free port; yields the :class:`~experiments.simulate.SimulatorServer`
  (``.base_url``, ``.stats``); stops it on exit.
* :func:`simulator_process`: the same as a separate ``python -m experiments.simulate``
  process (the CLI path); yields the base URL.
* :func:`scripted_server`: a bare HTTP server on 127.0.0.1 whose every reply to
  ``POST /v1/chat/completions`` a test function decides (any status, headers and
  bytes, or a hang), for replies no real server should send; yields a
  :class:`ScriptedServer` (``.base_url``, ``.requests``, ``.bodies``).
* ``local_llm``: a session-scoped fixture for ``pytest -m llm`` tests: llama.cpp's
  server with SmolLM2 (:mod:`llm_bridge.local`) on 127.0.0.1; yields its
  :class:`~llm_bridge.local.LocalServer` (``.base_url``).  Skipped unless ``-m``
  selects ``llm``, and skipped (with what to install) when llama-cpp-python or
  the GGUF is missing.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import pytest
import scipy.sparse as sp

if TYPE_CHECKING:
    from experiments.simulate import SimulatorServer

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
        build_artifact(BuildConfig(kg=str(tsv), out=str(path), drop_edges=drop, seed=seed, device="cpu",
                                   train=dict(rank=4, epochs=1, eval_max_triples=50)), progress=False)
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
    from experiments.simulate import SimulatorConfig, start_server

    server = start_server(artifact, SimulatorConfig(**config), host="127.0.0.1", port=0)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def simulator_process(artifact, *args: str, startup_s: float = 60.0) -> Iterator[str]:
    """Run ``python -m experiments.simulate --artifact ARTIFACT --port 0 ARGS`` and yield its base URL."""
    cmd = [sys.executable, "-m", "experiments.simulate", "--artifact", str(artifact), "--port", "0", *args]
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


#: What a scripted handler returns: (status, body, headers), or HANG to never answer.
HANG = "hang"


def chat_reply(*contents: Any, model: str = "scripted", usage: Any = None) -> bytes:
    """A well-formed Chat Completions body with one choice per content (``usage`` omitted when None)."""
    body: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"}
                    for i, c in enumerate(contents)],
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode("utf-8")


class ScriptedServer(http.server.ThreadingHTTPServer):
    """See :func:`scripted_server`; ``requests`` counts POSTs, ``bodies`` holds their JSON."""

    daemon_threads = True

    def __init__(self, handler: Callable[[dict, dict], Any]) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.handler = handler
        self.requests = 0
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _ScriptedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # bodies may end at the connection's close (no Content-Length)

    def log_message(self, *args: Any) -> None:  # keep the test output clean
        pass

    def do_POST(self) -> None:  # noqa: N802
        srv: ScriptedServer = self.server  # type: ignore[assignment]
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        with srv.lock:
            srv.requests += 1
            srv.bodies.append(body)
        out = srv.handler(body, {k.lower(): v for k, v in self.headers.items()})
        if out == HANG:
            srv.stopping.wait(60)
            return
        status, data, headers = out
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        for k, v in headers.items():
            if v is not None:
                self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass  # the client stopped reading (a reply over its size cap)


@contextlib.contextmanager
def scripted_server(handler: Callable[[dict, dict], Any]) -> Iterator[ScriptedServer]:
    """Serve ``handler(request_json, headers) -> (status, body bytes, headers) | HANG`` on a free port.

    The request's header names reach ``handler`` in lower case.
    A header set to None is left out (``{"Content-Length": None}``: the body ends at the close).
    Hanging handlers are released when the server stops.
    """
    srv = ScriptedServer(handler)
    # serve_forever checks for shutdown() every poll_interval: socketserver's 0.5 s would add up to half a
    # second of idle waiting to every test that uses this server
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, name="scripted-llm",
                              daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.stopping.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


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
