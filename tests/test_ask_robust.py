"""The ask loop held to the bad-input rules (issue 32): verified embedding caches (damaged ones rebuilt, or
bypassed when read-only, with one warning; atomic writes), one LLM deadline per command, a progress bar per
chunk of questions, ``--skip-artifact-checksums``, and ``--questions`` read by the shared JSON-lines reader."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from _llm_server import HANG, scripted_server
from engine.exec.ask import Asker, question_text
from engine.paths import PathRetriever
from llm_bridge.prompts import fallback_template
import test_ask
from test_ask import ENC, write_questions

kg, questions = test_ask.kg, test_ask.questions  # the same module-scoped fixtures (a KG of their own here)

DAMAGE = ("empty", "truncated", "not-an-archive", "wrong-width", "nan", "missing-entry", "texts-not-strings")


def _damage(path: Path, kind: str) -> None:
    """Damage an embedding cache file (``.npz`` of texts + emb, or a bare ``.npy`` array) the way ``kind`` says."""
    data = path.read_bytes()
    npz = path.suffix == ".npz"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "not-an-archive":
        path.write_bytes(b"\x93NUMPY garbage" * 10)
    else:
        if npz:
            with np.load(path) as z:
                texts, emb = z["texts"], z["emb"]
        else:
            texts, emb = None, np.load(path)
        if kind == "wrong-width":
            emb = np.ascontiguousarray(emb[:, : emb.shape[1] // 2])
        elif kind == "nan":
            emb = emb.copy()
            emb[::2] = np.nan
        elif kind == "missing-entry":
            texts = None
        elif kind == "texts-not-strings":
            texts = np.arange(len(emb))
        buf = io.BytesIO()
        if npz:
            np.savez(buf, emb=emb, **({} if texts is None else {"texts": texts}))
        else:
            np.save(buf, emb if kind != "missing-entry" else emb.astype(np.float64))
        path.write_bytes(buf.getvalue())


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _costs(found) -> list:
    return [[(round(c, 9), x) for c, x in f] for f in found]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def topics_texts(kg, questions):
    _, eng, ret = kg
    qs = questions[:4]
    return [eng.ask(q, retriever=ret).topic_id for q, _, _ in qs], [question_text(q) for q, _, _ in qs]


def _asker(kg, **kw) -> Asker:
    """An Asker over a fresh retriever: nothing in memory, everything from the caches under $KGREASON_HOME."""
    _, eng, _ = kg
    return Asker(eng, PathRetriever.from_artifact(eng.artifact, encoder="hashing", encoder_kwargs=ENC), **kw)


# ------------------------------------------------------------------------------ the path-embedding cache
@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_path_embedding_cache_is_rebuilt_with_one_warning(kg, topics_texts, home, caplog, kind):
    """Regression: an empty cache was an EOFError in every later ask on the KG, a truncated one a BadZipFile,
    a narrower one a ValueError, and NaN rows silently reordered (or emptied) the rankings."""
    topics, texts = topics_texts
    first = _asker(kg)
    ref = first.embedding_retrieve(topics, texts)
    path = first._sequence_cache_path()
    assert path.is_file()
    _damage(path, kind)
    caplog.set_level(logging.WARNING)
    got = _asker(kg).embedding_retrieve(topics, texts)
    assert _costs(got) == _costs(ref)
    (warning,) = _warnings(caplog)
    assert "path-embedding cache" in warning and str(path) in warning and "damaged" in warning
    assert "rebuilt" in warning
    caplog.clear()
    third = _asker(kg)
    assert _costs(third.embedding_retrieve(topics, texts)) == _costs(ref)  # from the rewritten cache
    assert _warnings(caplog) == [] and not set(third._seq_emb) & set(third.retriever.encoder._cache)  # none encoded
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporaries left


@pytest.mark.parametrize("kind", ["empty", "wrong-width", "nan"])
def test_engine_ask_after_a_damaged_cache_answers_as_before(kg, questions, home, caplog, kind):
    """The issue's reproduction: after the cache was damaged, every engine.ask on the KG failed (or, NaN,
    answered nothing); now the answers are those of the first run, with one warning."""
    argv = ["--artifact", str(kg[0]), *_enc(), questions[0][0]]
    rc, first, _ = _main(argv)
    assert rc == 0
    (path,) = (home / "ask_sequences").iterdir()
    _damage(path, kind)
    caplog.set_level(logging.WARNING)
    rc, again, err = _main(argv)
    assert rc == 0 and again == first, err
    assert len([w for w in _warnings(caplog) if "path-embedding cache" in w]) == 1


def _not_writable(monkeypatch, folder: Path) -> None:
    """Make ``folder`` read-only, for root too (chmod does not stop root: os.access says what it says for others)."""
    os.chmod(folder, 0o555)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode & os.W_OK else real(p, mode, **kw))


@pytest.mark.parametrize("kind", ["empty", "nan"])
def test_a_damaged_cache_in_a_read_only_folder_is_bypassed_with_one_warning(kg, topics_texts, home, caplog,
                                                                              monkeypatch, kind):
    topics, texts = topics_texts
    first = _asker(kg)
    ref = first.embedding_retrieve(topics, texts)
    path = first._sequence_cache_path()
    _damage(path, kind)
    before = path.read_bytes()
    _not_writable(monkeypatch, path.parent)
    try:
        caplog.set_level(logging.WARNING)
        asker = _asker(kg)
        assert _costs(asker.embedding_retrieve(topics, texts)) == _costs(ref)
        asker.verbalizer = fallback_template  # other path texts to embed: no second warning
        asker._path_text.clear()
        asker.embedding_retrieve(topics, texts)
        (warning,) = _warnings(caplog)
        assert str(path) in warning and "not rewritten" in warning and "not writable" in warning
        assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]
    finally:
        os.chmod(path.parent, 0o755)


def test_an_interrupted_cache_write_leaves_the_old_cache_and_no_temporary(kg, topics_texts, home, monkeypatch):
    """Regression: a write interrupted before its rename left ``<key>.<pid>.tmp.npz`` behind for good."""
    topics, texts = topics_texts
    first = _asker(kg)
    ref = first.embedding_retrieve(topics, texts)
    path = first._sequence_cache_path()
    before = path.read_bytes()

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            _asker(kg, verbalizer=fallback_template).embedding_retrieve(topics, texts)  # new path texts
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert _costs(_asker(kg).embedding_retrieve(topics, texts)) == _costs(ref)


def test_many_chunks_rewrite_the_cache_a_few_times_not_once_per_chunk(kg, home, monkeypatch):
    """The first call with new path texts writes the cache; later ones of the same Asker only when the cache
    would grow by 1/8 (a --questions run of 1,000 questions is 63 chunks); the next Asker writes the rest."""
    import engine.paths.embeddings as embeddings
    from engine.exec.ask_score import _CACHE_GROWTH, _read_sequence_cache

    _, eng, _ = kg
    written: list[int] = []
    real = embeddings.write_cache

    def counting(path, data, what):
        written.append(len(data))
        return real(path, data, what)

    monkeypatch.setattr(embeddings, "write_cache", counting)
    asker = _asker(kg, verbalizer=fallback_template)
    topics = list(range(40))
    for t in topics:  # one question per call: new path texts at almost every call
        asker.embedding_retrieve([t], ["which films"])
    calls = len(written)
    assert 1 <= calls < 10, written
    path = asker._sequence_cache_path()
    on_disk = _read_sequence_cache(path, asker._rel_unit.shape[1])
    assert len(asker._seq_emb) - len(on_disk) < len(on_disk) / _CACHE_GROWTH
    again = _asker(kg, verbalizer=fallback_template)
    again.embedding_retrieve(topics, ["which films"] * len(topics))
    assert len(_read_sequence_cache(path, asker._rel_unit.shape[1])) == len(asker._seq_emb)  # the rest written


def test_a_killed_writers_leftover_is_removed_by_the_next_write(tmp_path):
    """SIGKILL leaves the temporary sibling of a cache being written; the next write removes it once it is
    older than STALE_PART_S, and leaves a younger one (a writer at work) alone."""
    from engine.paths.embeddings import STALE_PART_S, write_cache

    path = tmp_path / "c.npy"
    old, young = tmp_path / ".c.npy.part-dead", tmp_path / ".c.npy.part-live"
    for p in (old, young):
        p.write_bytes(b"x" * 100)
    t = time.time() - STALE_PART_S - 60
    os.utime(old, (t, t))
    assert write_cache(path, b"data", "test cache") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [young.name, path.name]


def test_readers_never_see_part_of_a_cache_being_rewritten(tmp_path):
    """Atomic replacement: a reader loads the old or the new file while a writer rewrites it, never a mix."""
    from engine.exec.ask_score import _read_sequence_cache
    from engine.paths.embeddings import read_cache, write_cache

    path = tmp_path / "c.npz"
    blobs = []
    for n in (50, 3000):
        buf = io.BytesIO()
        np.savez(buf, texts=np.array([f"t{i}" for i in range(n)]), emb=np.ones((n, 8), np.float32))
        blobs.append(buf.getvalue())
    assert write_cache(path, blobs[0], "test cache") is None
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            write_cache(path, blobs[i % 2], "test cache")

    t = threading.Thread(target=writer)
    t.start()
    try:
        seen = set()
        for _ in range(200):
            got, why = read_cache(path, lambda p: _read_sequence_cache(p, 8))
            assert why is None and got is not None
            seen.add(len(got))
    finally:
        stop.set()
        t.join()
    assert seen <= {50, 3000}


# ------------------------------------------------------------------------------ the relation-embedding cache
@pytest.mark.parametrize("kind", ["empty", "truncated", "wrong-width", "nan", "missing-entry"])
def test_a_damaged_relation_embedding_cache_is_rebuilt_with_one_warning(kg, home, caplog, kind):
    """Regression: an empty ``relation_embeddings/<key>.npy`` was an EOFError for every retriever of the KG;
    a narrower or NaN array was used as it was (``missing-entry`` here: float64 instead of float32)."""
    from engine.paths.embeddings import relation_embeddings_cache_path

    _, eng, _ = kg
    ref = PathRetriever.from_artifact(eng.artifact, encoder="hashing", encoder_kwargs=ENC)
    (path,) = (home / "relation_embeddings").iterdir()
    assert path == relation_embeddings_cache_path(eng.artifact.relations, ref.encoder.encoder, eng.artifact)
    _damage(path, kind)
    caplog.set_level(logging.WARNING)
    again = PathRetriever.from_artifact(eng.artifact, encoder="hashing", encoder_kwargs=ENC)
    np.testing.assert_array_equal(again.relation_emb, ref.relation_emb)
    (warning,) = _warnings(caplog)
    assert "relation-embedding cache" in warning and str(path) in warning and "rebuilt" in warning
    np.testing.assert_array_equal(np.load(path), ref.relation_emb)


class _NoDim:
    """The hashing encoder without its ``dim`` attribute: an encoder that does not say its width (MiniLM)."""

    def __init__(self) -> None:
        from engine.paths.embeddings import HashingEncoder

        self._enc = HashingEncoder(**ENC)
        self.name = self._enc.name

    def encode(self, texts):
        return self._enc.encode(texts)


@pytest.mark.parametrize("kind", ["wrong-width", "nan", "other-model"])
def test_a_relation_embedding_cache_of_another_width_or_model_is_rebuilt(kg, home, caplog, kind):
    """Without ``dim`` the width (and the first row's direction) is checked against one embedding."""
    from engine.paths.embeddings import HashingEncoder

    _, eng, _ = kg
    ref = PathRetriever.from_artifact(eng.artifact, encoder=_NoDim())
    (path,) = (home / "relation_embeddings").iterdir()
    if kind == "other-model":  # same name, same shape, another model's vectors
        other = HashingEncoder(dim=ENC["dim"], seed=ENC["seed"] + 1)
        np.save(path, other.encode([f"r{i}" for i in range(len(eng.artifact.relations))]))
    else:
        _damage(path, kind)
    caplog.set_level(logging.WARNING)
    again = PathRetriever.from_artifact(eng.artifact, encoder=_NoDim())
    np.testing.assert_array_equal(again.relation_emb, ref.relation_emb)
    (warning,) = _warnings(caplog)
    assert str(path) in warning and "rebuilt" in warning
    caplog.clear()
    PathRetriever.from_artifact(eng.artifact, encoder=_NoDim())
    assert _warnings(caplog) == []


# ------------------------------------------------------------------------------ the relation-questions sidecar
def test_a_deeply_nested_relation_questions_sidecar_is_ignored_with_one_warning(kg, home, caplog):
    """Regression: a sidecar of ``[[[[...`` was a RecursionError for every LGOT run on the artifact."""
    from llm_bridge.relations import RelationQuestions, sidecar_path

    _, eng, _ = kg
    path = sidecar_path(eng.artifact, "m")
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    caplog.set_level(logging.WARNING)
    rq = RelationQuestions.for_artifact(eng.artifact, model="m")
    assert all(rq.source(r) == "fallback" for r in eng.artifact.relations)
    (warning,) = _warnings(caplog)
    assert str(path) in warning and "nested too deeply" in warning


# ------------------------------------------------------------------------------ the CLI
def _main(argv, monkeypatch=None) -> tuple[int, str, str]:
    from engine.ask import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _enc() -> list[str]:
    return ["--encoder", "hashing", "--encoder-kwargs", json.dumps(ENC)]


def test_a_dead_llm_server_costs_one_deadline_per_command(kg, questions, tmp_path, caplog):
    """Regression: a server that accepts connections and never answers cost two --llm-deadline per batch
    (the planner's, then the reasoner's); now the first deadline ends the LLM's part of the command."""
    n = 20  # two chunks of engine.ask.CHUNK
    qs = (questions * (n // len(questions) + 1))[:n]
    qfile = write_questions(tmp_path / "q.jsonl", qs)
    deadline = 1.5
    import openai  # noqa: F401  (the SDK's first import takes a second or more on a busy machine: not timed)

    argv = ["--artifact", str(kg[0]), *_enc(), "--questions", str(qfile), "--json"]
    t0 = time.perf_counter()
    assert _main(argv)[0] == 0
    base = time.perf_counter() - t0  # the same run without an LLM (on a loaded machine: seconds)
    caplog.set_level(logging.WARNING)
    with scripted_server(lambda body, headers: HANG) as srv:
        t0 = time.perf_counter()
        rc, out, err = _main([*argv, "--llm", "--llm-base-url", srv.base_url, "--llm-model", "dead", "--no-llm-cache",
                              "--llm-deadline", str(deadline), "--llm-max-retries", "0", "--llm-concurrency", "4"])
        wall = time.perf_counter() - t0
        requests = srv.requests
    assert rc == 0, err
    print(f"wall {wall:.2f} s, without the LLM {base:.2f} s, deadline {deadline} s, {requests} requests")
    # before: two deadlines or more (the planner's, the reasoner's)
    assert deadline <= wall < 1.5 * deadline + 2 * base, (wall, base)
    assert requests == 4  # the first plan prompts in flight (--llm-concurrency 4), none after; before: 8
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == n and all(r["error"] is None and r["answers"] for r in rows)  # KG-only answers
    assert all(any("timeout" in w for w in r["warnings"]) for r in rows)
    dead = [w for w in _warnings(caplog) if "did not respond" in w]
    assert len(dead) == 1


def test_the_progress_bar_moves_per_chunk_and_chunks_change_no_answer(kg, questions, tmp_path, monkeypatch):
    """Regression: a --questions run drew a bar only while enumerating paths (the first second of 1,000
    questions); now it counts answered questions, one update per chunk of engine.ask.CHUNK."""
    from engine.ask import CHUNK
    from kgreason.progress import LineProgress

    updates: list[int] = []
    real = LineProgress.update

    def recording(self, n=1):
        updates.append(n)
        return real(self, n)

    monkeypatch.setattr(LineProgress, "update", recording)  # stderr is no terminal here: the plain-lines bar
    n = 2 * CHUNK + 3
    qs = (questions * (n // len(questions) + 1))[:n]
    qfile = write_questions(tmp_path / "q.jsonl", qs)
    rc, out, err = _main(["--artifact", str(kg[0]), *_enc(), "--questions", str(qfile), "--json"])
    assert rc == 0 and updates == [CHUNK, CHUNK, 3]
    assert f"questions: {n}/{n} question" in err and "ask: {" in err
    # one batch of every question (no bar: not more than CHUNK questions) gives the same answers
    monkeypatch.setattr("engine.ask.CHUNK", n)
    updates.clear()
    rc, one, err = _main(["--artifact", str(kg[0]), *_enc(), "--questions", str(qfile), "--json"])
    assert rc == 0 and updates == [] and f"{n}/{n}" not in err
    rows, ref = ([json.loads(line) for line in x.splitlines()] for x in (out, one))
    for x in rows + ref:
        x.pop("seconds")
    assert rows == ref


def test_a_mixed_questions_file_reads_both_kinds_of_line(kg, questions, tmp_path):
    q0, _, gold0 = questions[0]
    qfile = tmp_path / "q.txt"
    qfile.write_text(f"{questions[1][0]}\n\n" + json.dumps({"question": q0, "answers": gold0}) + "\n", encoding="utf-8")
    rc, out, err = _main(["--artifact", str(kg[0]), *_enc(), "--questions", str(qfile), "--json"])
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [r["question"] for r in rows] == [questions[1][0], q0] and rows[1]["gold"] == gold0
    assert "hits@1" in err


def test_skip_artifact_checksums(kg, questions, tmp_path):
    """Regression: engine.ask lacked --skip-artifact-checksums (the README says every artifact reader has it)."""
    art = tmp_path / "art"
    shutil.copytree(kg[0], art)
    meta = json.loads((art / "meta.json").read_text())
    meta["files"]["missing.tsv"] = "0" * 64
    (art / "meta.json").write_text(json.dumps(meta))
    argv = ["--artifact", str(art), *_enc(), questions[0][0]]
    rc, _, err = _main(argv)
    assert rc == 2 and "checksum mismatch for 'missing.tsv'" in err and "--skip-artifact-checksums" in err
    rc, out, err = _main(argv + ["--skip-artifact-checksums"])
    assert rc == 0 and out.startswith(f"question: {questions[0][0]}"), err


@pytest.mark.parametrize("text, message", [
    ('{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ":1: not JSON (nested too deeply)"),
    ("[" * 100_000 + "]" * 100_000 + "\n", None),  # plain text: one question (no topic)
    ('{"question": "a [Entity_001]"}\n{"question": "b", "answers": "x"}\n', ':2: "answers" must be a list'),
    ("who [Entity_001]\n" + '{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ":2: not JSON (nested too deeply)"),
    ("who [Entity_001]\n[1]\n{\"question\": \"b\"}\n{\"q\": 1}\n", ":4: missing key 'question'"),
    ("who [Entity_001]\n{\"a\": 1\n", ":2: not JSON"),
    ("\n\n  \n", "has no questions"),
])
def test_questions_file_errors_are_one_line(kg, tmp_path, text, message):
    """Regression: a --questions line of deeply nested JSON was a RecursionError traceback (a file of JSON
    lines goes through kgreason.files.read_json_objects, a mixed file parses its '{' lines alone)."""
    qfile = tmp_path / "q.txt"
    qfile.write_text(text, encoding="utf-8")
    rc, out, err = _main(["--artifact", str(kg[0]), *_enc(), "--questions", str(qfile)])
    assert "Traceback" not in err
    if message is None:
        assert rc == 0 and "error: no entity name in the question" in out
    else:
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
