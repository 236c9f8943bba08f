"""Shared pieces of the fuzzing suite (tests/test_fuzz_*.py).

* :func:`tiny_world`: one small, really built artifact per test session (a
  generated 16-entity KG through :func:`kge.build.build_artifact`, rank 4, 2
  epochs), with the files the CLIs read: the KG as TSV, a JSONL query file, a
  BetaE folder and a BetaE query pickle.  Built once (about 5 s, mostly the
  pykeen import) and shared by every fuzz module.
* :func:`check_user_error`: the one property of every error message.
* :func:`run_cli`: one ``main(argv)`` call in an isolated scratch folder (cwd,
  HOME, XDG_CACHE_HOME, KGREASON_HOME and TMPDIR inside it), with its return
  code, stdout, stderr and every exception it let through.
* :func:`snapshot`: file bytes under a folder, to prove inputs were not touched.

Budgets: the hypothesis profiles live in tests/conftest.py ("ci" by default,
"slow" with ``HYPOTHESIS_PROFILE=slow``); the CLI tests take a share of the
active profile's ``max_examples`` by their cost per example.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import signal
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


# Every name is a legal TSV name; together they exercise leading/trailing spaces,
# non-ASCII, '|' inside a tab-separated name, '#' and number-like names, quotes,
# parentheses (quoted in S-expressions) and an inverse-looking entity name.
TINY_ENTITIES = ["e0", "e1", "e2", "e3", "e4", "e5", " lead", "trail ", "Zoë", "a b", "x|y", "#7", "42",
                 'say "hi"', "f(x)", "e1^-1"]
TINY_RELATIONS = ["r0", "r1", "likes", "part of"]


def tiny_rows() -> list[tuple[str, str, str]]:
    """The tiny KG: a ring through every entity plus fixed random extra edges (deterministic)."""
    import random

    rng = random.Random(1234)
    ents, rels = TINY_ENTITIES, TINY_RELATIONS
    rows = {(ents[k], rels[k % len(rels)], ents[(k + 1) % len(ents)]) for k in range(len(ents))}
    while len(rows) < 64:
        rows.add((rng.choice(ents), rng.choice(rels), rng.choice(ents)))
    return sorted(rows)


class TinyWorld:
    """Paths (all inside one session temp folder, treated read-only by the tests) and the loaded artifact.

    A plain class, not a dataclass: hypothesis prints the fixtures of a failing
    example, and would print a dataclass field by field (the whole artifact).
    """

    def __init__(self, *, root: Path, kg: Path, artifact_dir: Path, queries: Path, betae_folder: Path,
                 betae_queries: Path, artifact, metaqa: Path, mqa_art: Path, mqa_questions: Path,
                 mqa_exemplars: Path, mqa_results: Path, identity_queries: Path, identity_record: Path) -> None:
        self.root = root
        self.metaqa = metaqa  # a tiny MetaQA-format folder (kb.txt, {1,2,3}-hop/{test,dev}.txt, qtypes)
        self.mqa_art = mqa_art  # its KG-only artifact (experiments.metaqa_ask --build-kg-only)
        self.mqa_questions = mqa_questions  # its questions as JSON lines (experiments.metaqa_ask --export)
        self.mqa_exemplars = mqa_exemplars  # weakly labelled dev exemplars (experiments.metaqa_ask --make-exemplars)
        self.mqa_results = mqa_results  # a results JSON of experiments.metaqa_ask's method rows
        self.identity_queries = identity_queries  # benchmarks/executor_identity.py sample's queries of art/
        self.identity_record = identity_record  # and a record of its run (--save)
        self.kg = kg  # tiny.tsv
        self.artifact_dir = artifact_dir  # a built artifact folder
        self.queries = queries  # JSONL queries of the artifact (engine.sample's format)
        self.betae_folder = betae_folder  # BetaE id folder of the same KG
        self.betae_queries = betae_queries  # BetaE query pickle for that folder
        self.artifact = artifact  # kge.artifact.Artifact loaded from artifact_dir

    def __repr__(self) -> str:
        return f"TinyWorld({str(self.root)!r})"


_WORLD: TinyWorld | None = None


def quiet_third_party():
    """A context that silences third-party warnings and logging of a library build (not under test here)."""
    import logging

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    logger = logging.getLogger("torch_max_mem")
    old = logger.level
    logger.setLevel(logging.ERROR)
    stack.callback(logger.setLevel, old)
    return stack


def tiny_world(tmp_path_factory) -> TinyWorld:
    """Build (once per session) the tiny artifact and its companion files."""
    global _WORLD
    if _WORLD is not None and _WORLD.root.exists():
        return _WORLD
    import numpy as np

    from kge.artifact import Artifact
    from kge.build import BuildConfig, build_artifact

    root = tmp_path_factory.mktemp("fuzz-world")
    kg = root / "tiny.tsv"
    kg.write_text("".join("\t".join(r) + "\n" for r in tiny_rows()), encoding="utf-8")
    art_dir = root / "art"
    with quiet_third_party(), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        art = build_artifact(BuildConfig(kg=str(kg), out=str(art_dir), train=dict(rank=4, epochs=2), seed=0,
                                         device="cpu", drop_edges=0.25),
                             progress=False)

    # JSONL queries as engine.sample writes them (the sampler's own writer: real format, real labels).
    from engine.eval.sampling import QuerySampler

    queries = root / "queries.jsonl"
    sampler_lines = _sample_lines(art, QuerySampler)
    queries.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in sampler_lines), encoding="utf-8")

    # A BetaE folder of the same KG (ids; relation 2k+1 is the inverse of 2k) and a query pickle.
    betae = root / "betae"
    betae.mkdir()
    obs = np.asarray(art.observed, dtype=np.int64)
    for name in ("train", "valid", "test"):
        np.savetxt(betae / f"{name}.txt", obs, fmt="%d", delimiter="\t")
    (betae / "stats.txt").write_text(f"numentity: {art.num_entities}\nnumrelations: {art.num_relations}\n")
    from engine.lang.structures import STRUCTURES

    rng = np.random.default_rng(5)
    data: dict = collections.defaultdict(set)
    for st in STRUCTURES.values():
        for _ in range(3):
            data[st.betae].add(_fill(st.betae, rng, art.num_entities, art.num_relations))
    pkl = root / "test-queries.pkl"
    pkl.write_bytes(pickle.dumps(dict(data)))
    _WORLD = TinyWorld(root=root, kg=kg, artifact_dir=art_dir, queries=queries, betae_folder=betae,
                       betae_queries=pkl, artifact=Artifact.load(art_dir), **_metaqa_files(root),
                       **_identity_files(root, art_dir))
    return _WORLD


def _identity_files(root: Path, art_dir: Path) -> dict[str, Path]:
    """Queries and one record of benchmarks/executor_identity.py on the tiny artifact (its own writers)."""
    main = load_script("benchmarks/executor_identity.py").main
    q, rec = root / "identity_queries.jsonl", root / "identity_record.json"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for argv in (["sample", "--artifact", str(art_dir), "--out", str(q), "--per-structure", "1", "--no-progress"],
                     ["run", "--queries", str(q), "--artifact", f"a={art_dir}", "--save", str(rec), "--no-progress",
                      "--limit", "3"]):
            if main(argv) != 0:  # pragma: no cover - tested in test_executor_identity.py
                raise RuntimeError(f"executor_identity.py {argv} failed on the tiny artifact")
    return {"identity_queries": q, "identity_record": rec}


def _metaqa_files(root: Path) -> dict[str, Path]:
    """The tiny MetaQA world of the MetaQA tools, made by experiments.metaqa_ask itself (the real writers)."""
    from test_metaqa import KB, _questions, _write

    data = root / "metaqa"
    _write(data, KB, _questions(KB))
    for hops in (1, 2, 3):  # the dev split (the weak labels' source): the same questions
        shutil.copy(data / f"{hops}-hop" / "test.txt", data / f"{hops}-hop" / "dev.txt")
    from experiments.metaqa_ask import main as rmq

    paths = {"metaqa": data, "mqa_art": root / "mqa_art", "mqa_questions": root / "mqa_questions.jsonl",
             "mqa_exemplars": root / "mqa_exemplars.jsonl", "mqa_results": root / "mqa_results.json"}
    common = ["--data", str(data), "--quiet"]
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for argv in (["--build-kg-only", str(paths["mqa_art"])], ["--export", str(paths["mqa_questions"])],
                     ["--artifact", str(paths["mqa_art"]), "--make-exemplars", str(paths["mqa_exemplars"])]):
            if rmq([*common, *argv]) != 0:  # pragma: no cover - tested in test_bad_input_scripts.py
                raise RuntimeError(f"experiments.metaqa_ask {argv} failed on the tiny MetaQA folder")
    paths["mqa_results"].write_text(json.dumps({"label": "tiny", "artifact": str(paths["mqa_art"]), "per_hop": 3,
                                                "runs": [{"hops": h, "method": m, "hits@1": 0.5, "llm_calls": 1.0,
                                                          "tokens": 10.0, "seconds": 0.01, "fallbacks": 0.0}
                                                         for h in (1, 2) for m in ("embedding", "gold-lf")]}))
    return paths


def _sample_lines(art, QuerySampler) -> list[dict]:
    """A few sampled queries per structure in engine.sample's JSONL record format."""
    # engine.sample's writer is the reference for the format; run it into a temp file.
    from engine import sample

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "q.jsonl"
        argv = ["--artifact", str(art.path), "--per-structure", "3", "--out", str(out), "--no-progress",
                "--structures", "1p", "2p", "2i", "2in", "pin", "2u", "up"]
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            rc = sample.main(argv)
        if rc != 0 or not out.is_file():  # pragma: no cover - the sampler is tested elsewhere
            raise RuntimeError(f"engine.sample failed on the tiny artifact (rc {rc})")
        return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()]


def _fill(s, rng, n, r):
    if s == "e":
        return int(rng.integers(n))
    if s == "r":
        return int(rng.integers(r))
    if s == "n":
        return -2
    if s == "u":
        return -1
    return tuple(_fill(x, rng, n, r) for x in s)


# ----------------------------------------------------------------------------- scripts
REPO = Path(__file__).resolve().parents[1]
_SCRIPTS: dict[str, object] = {}


def load_script(relpath: str):
    """The module of a user-facing script that is not in a package (``benchmarks/...py``), loaded once
    from the repository (its ``main(argv)`` is then called in process, like the packages' CLIs)."""
    import importlib.util
    import sys

    if relpath not in _SCRIPTS:
        name = "script_" + re.sub(r"\W", "_", relpath.removesuffix(".py"))
        spec = importlib.util.spec_from_file_location(name, REPO / relpath)
        assert spec is not None and spec.loader is not None, relpath
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up while a class is built
        spec.loader.exec_module(mod)
        _SCRIPTS[relpath] = mod
    return _SCRIPTS[relpath]


# ----------------------------------------------------------------------------- properties
_CARET = re.compile(r" *\^")


def check_user_error(message: str, *, caret_ok: bool = False) -> None:
    """Assert the UserError property: one printable line, or (``caret_ok``: a parse error) that line
    followed by the echoed input line and a caret line."""
    assert message, "empty error message"
    lines = message.split("\n")
    if caret_ok and len(lines) == 3:
        assert lines[1].startswith("  "), f"echo line not indented: {message!r}"
        assert _CARET.fullmatch(lines[2][2:]) and lines[2].startswith("  "), f"bad caret line: {message!r}"
        body = lines[:2]
    else:
        assert len(lines) == 1, f"error message is not one line: {message!r}"
        body = lines
    for line in body:
        # str.splitlines also breaks on \r, \v, \f, \x1c-\x1e, \x85, U+2028/9: none may appear raw.
        assert len(line.splitlines()) <= 1, f"line break inside an error line: {message!r}"
        bad = [c for c in line if not c.isprintable()]
        assert not bad, f"unprintable characters {bad!r} in error message: {message!r}"


def check_cli_stderr(stderr: str, *, only_error: bool) -> None:
    """rc 2: exactly one ``error: ...`` message (with its caret lines for a parse error), at the end.

    ``only_error``: nothing else may be printed (quiet flags given).
    """
    lines = stderr.rstrip("\n").split("\n")
    starts = [k for k, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, f"expected one 'error: ' line on stderr, got:\n{stderr}"
    k = starts[0]
    tail = lines[k:]
    assert len(tail) in (1, 3), f"text after the error line:\n{stderr}"
    check_user_error("\n".join(tail)[len("error: "):], caret_ok=True)
    assert "Traceback" not in stderr, stderr
    if only_error:
        assert k == 0, f"stderr has more than the error:\n{stderr}"


def snapshot(root: Path) -> dict[str, bytes]:
    """``relative path -> sha256`` of every file under ``root`` (folders as empty entries)."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = b""
        for f in filenames:
            p = Path(dirpath) / f
            out[os.path.join(rel, f)] = hashlib.sha256(p.read_bytes()).digest() if p.is_file() else b"?"
    return out


@dataclass
class CliRun:
    rc: int | None
    stdout: str
    stderr: str
    exception: BaseException | None


class _Timeout(Exception):
    pass


def run_cli(main: Callable[[Sequence[str]], int], argv: Sequence[str], cwd: Path, *,
            time_limit: int = 60) -> CliRun:
    """Call ``main(argv)`` with cwd and every per-user folder inside ``cwd``; capture everything.

    ``SystemExit`` counts as its code (argparse's ``--help`` exits 0); any other
    exception is returned in ``exception``.  A call running past ``time_limit``
    seconds is stopped (SIGALRM) and reported as an exception: a hang is a bug too.
    """
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "KGREASON_HOME": str(home / "kgreason"),
           "TMPDIR": str(home / "tmp"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    (home / "tmp").mkdir(exist_ok=True)
    old_env = {k: os.environ.get(k) for k in env}
    old_cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    rc: int | None = None
    exc: BaseException | None = None

    def on_alarm(signum, frame):
        raise _Timeout(f"main({list(argv)!r}) ran longer than {time_limit} s")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_tempdir = tempfile.tempdir
    try:
        os.environ.update(env)
        tempfile.tempdir = None  # re-read TMPDIR
        os.chdir(cwd)
        signal.alarm(time_limit)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as e:  # argparse --help / --version
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if rc != 0:
                    exc = e
            except BaseException as e:  # noqa: BLE001 - anything else is what we look for
                exc = e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        os.chdir(old_cwd)
        tempfile.tempdir = old_tempdir
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliRun(rc, out.getvalue(), err.getvalue(), exc)


def fresh_dir(parent: Path, prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def copy_inputs(world: TinyWorld, dest: Path) -> dict[str, Path]:
    """A private copy of the world's input files in ``dest`` (a CLI that damages them harms no other example)."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in ("kg", "artifact_dir", "queries", "betae_folder", "betae_queries", "metaqa", "mqa_art",
                 "mqa_questions", "mqa_exemplars", "mqa_results", "identity_queries", "identity_record"):
        src = getattr(world, name)
        dst = dest / src.name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
            scores = src.with_name(src.name + ".scores.npz")  # an executor_identity record's scores
            if scores.is_file():
                shutil.copy2(scores, dst.with_name(scores.name))
        paths[name] = dst
    return paths
