"""The LLM response cache opens only files it created, replays read-only, and lives under KGREASON_HOME (issue 22)."""
from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from _llm_server import simulator
from kgreason.errors import UserError
from llm_bridge import cache as cache_mod
from llm_bridge import prompts
from llm_bridge.cache import APPLICATION_ID, ResponseCache
from llm_bridge.client import LLMClient
from llm_bridge.config import LLMConfig


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def _user_db(path: Path, *, clash: bool) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE patients (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO patients (name) VALUES (?)", [("ada",), ("bob",)])
    if clash:  # a table named like the cache's, with another layout
        conn.execute("CREATE TABLE responses (id INTEGER, body BLOB)")
        conn.execute("CREATE TABLE meta (k TEXT)")
    conn.commit()
    conn.close()
    return path


def _cfg(base_url: str, cache_path: Path, **kw) -> LLMConfig:
    return LLMConfig(base_url=base_url, model="sim-model", n=2, timeout_s=5.0, max_retries=0, deadline_s=30.0,
                     cache_path=cache_path, **kw)


def _prompts(k: int) -> list[list[dict[str, str]]]:
    return [prompts.projection_messages(prompts.fallback_template("likes"), [f"Entity_{i:03d}"]) for i in range(k)]


def _assert_refused(path: Path, exc: pytest.ExceptionInfo) -> None:
    msg = str(exc.value)
    assert str(path) in msg and "is not a kgreason LLM cache and was not modified" in msg
    assert "--llm-cache" in msg and "--no-llm-cache" in msg and "delete" not in msg.lower()
    assert "\n" not in msg


@pytest.mark.parametrize("clash", [False, True], ids=["plain", "clashing-tables"])
def test_a_users_sqlite_database_is_refused_byte_identical(tmp_path, clash):
    """Regression: the old cache switched a user's database to WAL and added tables before refusing it."""
    db = _user_db(tmp_path / "userdb.sqlite", clash=clash)
    before, names = _sha(db), _siblings(db)
    with pytest.raises(UserError) as exc:
        ResponseCache(db)
    _assert_refused(db, exc)
    with pytest.raises(UserError):
        LLMClient(_cfg("http://127.0.0.1:9/v1", db))
    assert _sha(db) == before and _siblings(db) == names  # no -wal/-shm/-journal either
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_a_wal_mode_database_of_another_application_is_refused_untouched(tmp_path):
    db = tmp_path / "other.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA application_id = 1234")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before, names = _sha(db), _siblings(db)
    with pytest.raises(UserError, match="another application") as exc:
        ResponseCache(db)
    _assert_refused(db, exc)
    assert _sha(db) == before and _siblings(db) == names


@pytest.mark.parametrize("kind", ["folder", "tsv", "empty", "artifact-npz", "short"])
def test_files_that_are_not_caches_are_refused(tmp_path, kind):
    path = tmp_path / "thing"
    if kind == "folder":
        path.mkdir()
        (path / "keep.txt").write_text("x")
    elif kind == "tsv":
        path.write_text("Entity_000\tlikes\tEntity_001\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "artifact-npz":
        path.write_bytes(b"PK\x03\x04" + os.urandom(2000))
    else:
        path.write_bytes(b"SQLite format 3\x00")  # a header cut short
    before = sorted(p.name for p in tmp_path.rglob("*"))
    data = None if kind == "folder" else path.read_bytes()
    with pytest.raises(UserError) as exc:
        ResponseCache(path)
    _assert_refused(path, exc)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    if data is not None:
        assert path.read_bytes() == data  # an empty file stays empty: never turned into a database


def test_new_cache_has_the_marker_and_no_leftovers(tmp_path):
    path = tmp_path / "sub" / "c.sqlite"
    with ResponseCache(path) as c:
        assert c.put("k", {"v": 1}) and c.get("k") == {"v": 1} and not c.readonly
    header = path.read_bytes()[:100]
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # temp file gone
    with ResponseCache(path) as c:  # reopened: ours
        assert c.get("k") == {"v": 1} and len(c) == 1


def test_a_cache_written_before_the_marker_is_adopted(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)  # the layout of the previous release, no application_id
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,"
                 " response TEXT NOT NULL, created REAL NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', '1')")
    conn.execute("INSERT INTO responses VALUES ('k', 'm', '{}', '{\"a\": 1}', 0)")
    conn.commit()
    conn.close()
    with ResponseCache(path) as c:
        assert c.get("k") == {"a": 1}
    assert int.from_bytes(path.read_bytes()[68:72], "big") == APPLICATION_ID


def test_another_schema_version_is_refused_without_advice_to_delete(tmp_path):
    path = tmp_path / "c.sqlite"
    ResponseCache(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '9' WHERE name = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(UserError, match="schema version 9") as exc:
        ResponseCache(path)
    assert "was not modified" in str(exc.value) and "delete" not in str(exc.value).lower()


def _fill(llm_artifact, path: Path, batch) -> list:
    with simulator(llm_artifact, seed=4) as srv, LLMClient(_cfg(srv.base_url, path)) as client:
        live = client.complete_many_sync(batch)
    assert all(r.ok for r in live)
    return live


@pytest.mark.parametrize("how", ["explicit", "not-writable"])
def test_read_only_cache_replays_hits_and_reports_misses(llm_artifact, tmp_path, monkeypatch, caplog, how):
    """Regression: a valid cache in a read-only folder could not be replayed (WAL needs -shm)."""
    path = tmp_path / "ro" / "c.sqlite"
    batch = _prompts(4)
    live = _fill(llm_artifact, path, batch)
    folder = path.parent
    before, names = _sha(path), _siblings(path)
    assert names == ["c.sqlite"]  # the writer checkpointed and removed its -wal/-shm on close
    os.chmod(path, 0o444)
    os.chmod(folder, 0o555)
    try:
        if how == "explicit":
            cache = ResponseCache(path, readonly=True)
        else:
            # As root, chmod does not stop writes: make os.access say what it says for other users.
            real = os.access
            monkeypatch.setattr(cache_mod.os, "access",
                                lambda p, mode, **kw: False if mode & os.W_OK else real(p, mode, **kw))
            cache = ResponseCache(path)
        assert cache.readonly
        with simulator(llm_artifact, seed=4) as srv, LLMClient(_cfg(srv.base_url, path), cache=cache) as client:
            replay = client.complete_many_sync(batch)
            assert [r.texts for r in replay] == [r.texts for r in live] and all(r.cached for r in replay)
            assert srv.stats["requests"] == 0 and client.stats.cache_hits == 4
            miss = client.complete_sync(_prompts(6)[5])
            assert miss.ok and not miss.cached and srv.stats["requests"] == 1
            again = client.complete_many_sync(_prompts(7)[5:])
            assert srv.stats["requests"] == 2  # prompt 5 from the client's memory, prompt 6 asked
            assert all(r.ok for r in again)
            assert (client.stats.cache_misses, client.stats.unstored) == (3, 2)
        cache.close()
        warnings = [r.getMessage() for r in caplog.records if "read-only" in r.getMessage()
                    and r.levelname == "WARNING"]
        assert len(warnings) == 1 and "not stored" in warnings[0]
        assert _sha(path) == before and _siblings(path) == names  # nothing written, no -wal/-shm
    finally:
        os.chmod(folder, 0o755)
        os.chmod(path, 0o644)


def test_sqlite_refusing_writes_falls_back_to_read_only(tmp_path, monkeypatch):
    """The OperationalError-driven path: SQLite says the database is read-only while opening it."""
    path = tmp_path / "c.sqlite"
    with ResponseCache(path) as c:
        c.put("k", {"v": 1})
    real = ResponseCache._open_writable

    def refuse(self, legacy):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(ResponseCache, "_open_writable", refuse)
    with ResponseCache(path) as c:
        assert c.readonly and c.get("k") == {"v": 1}
        assert c.put("k2", {"v": 2}) is False and c.unstored == 1
    monkeypatch.setattr(ResponseCache, "_open_writable", real)


def test_a_missing_cache_cannot_be_opened_read_only(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        ResponseCache(tmp_path / "none.sqlite", readonly=True)
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.parametrize("below", ["", "a/b"], ids=["home-is-a-file", "deeper"])
def test_a_file_where_the_cache_folder_should_be_is_named(tmp_path, monkeypatch, below):
    """Regression: KGREASON_HOME pointing at a file said only 'cannot create it (File exists)'."""
    from llm_bridge.config import default_cache_path

    home = tmp_path / "home"
    home.write_text("notes\n")
    monkeypatch.setenv("KGREASON_HOME", str(home / below) if below else str(home))
    with pytest.raises(UserError, match=f"cannot create it \\({home} is a file, not a folder\\)"):
        ResponseCache(default_cache_path())
    assert home.read_text() == "notes\n" and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_full_disk_while_storing_is_an_enospc_os_error(tmp_path):
    """ENOSPC reaches kgreason.errors.cli_main as an OSError naming the cache (one line there)."""
    import errno

    from kgreason.errors import os_error_message

    path = tmp_path / "c.sqlite"
    with ResponseCache(path) as c:
        c._conn.execute(f"PRAGMA max_page_count = {c._conn.execute('PRAGMA page_count').fetchone()[0]}")
        with pytest.raises(OSError) as exc:
            for i in range(200):
                c.put(f"k{i}", {"text": "x" * 4000})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    msg = os_error_message(exc.value)
    assert msg is not None and str(path) in msg and "no space" in msg


def test_the_cache_folder_follows_kgreason_home(tmp_path, monkeypatch, llm_artifact):
    from llm_bridge.config import default_cache_path

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "kh"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "kh" / "llm-cache.sqlite"
    with simulator(llm_artifact) as srv, LLMClient(LLMConfig(base_url=srv.base_url, model="m", n=1)) as client:
        assert client.complete_sync(_prompts(1)[0]).ok
    assert (tmp_path / "kh" / "llm-cache.sqlite").is_file() and not (tmp_path / "xdg").exists()


def test_a_full_disk_during_a_run_is_one_line_from_the_cli(llm_artifact, tmp_path, monkeypatch, capsys):
    import errno

    from engine.answer import main

    def full(self, key, value, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(ResponseCache, "put", full)
    with simulator(llm_artifact) as srv:
        argv = ["--artifact", str(llm_artifact), "--expr", "(p likes Entity_003)", "--llm", "--llm-base-url",
                srv.base_url, "--llm-model", "m", "--llm-cache", str(tmp_path / "c.sqlite")]
        assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and not line.startswith("llm:")]
    assert lines == [f"error: {tmp_path / 'c.sqlite'}: no space left on the device (ENOSPC); free space there or "
                     "write the output elsewhere"]


# ------------------------------------------------------------------ damage (issue 32): verified on load
_DAMAGE = {
    "garbage": '{"texts": ["Ent',
    "not-an-object": '"just a string"',
    "wrong-schema": '{"texts": "Entity_001", "logprobs": [], "finish_reasons": []}',
    "nan-tokens": ('{"texts": ["x"], "logprobs": [null], "finish_reasons": ["stop"], "prompt_tokens": NaN, '
                   '"completion_tokens": 1, "model": "m", "n_requested": 1}'),
    "nan-logprob": ('{"texts": ["x"], "logprobs": [[["x", NaN]]], "finish_reasons": ["stop"], "prompt_tokens": 1, '
                    '"completion_tokens": 1, "model": "m", "n_requested": 1}'),
    "infinite-latency": ('{"texts": ["x"], "logprobs": [null], "finish_reasons": ["stop"], "prompt_tokens": 1, '
                         '"completion_tokens": 1, "model": "m", "n_requested": 1, "latency_s": Infinity}'),
    "deep": "[" * 200_000,
}


def _damage_rows(path: Path, texts: list[str]) -> None:
    conn = sqlite3.connect(path)
    keys = [k for (k,) in conn.execute("SELECT key FROM responses ORDER BY created")]
    for key, text in zip(keys, texts):
        conn.execute("UPDATE responses SET response = ? WHERE key = ?", (text, key))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("kind", sorted(_DAMAGE))
def test_a_damaged_entry_is_asked_again_with_one_warning(llm_artifact, tmp_path, caplog, kind):
    path = tmp_path / "c.sqlite"
    batch = _prompts(3)
    live = _fill(llm_artifact, path, batch)
    _damage_rows(path, [_DAMAGE[kind], _DAMAGE[kind]])  # two of the three entries
    with simulator(llm_artifact, seed=4) as srv, LLMClient(_cfg(srv.base_url, path)) as client:
        again = client.complete_many_sync(batch)
        assert [r.texts for r in again] == [r.texts for r in live]
        assert srv.stats["requests"] == 2 and client.stats.cache_hits == 1
        assert client.cache is not None and client.cache.damaged == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0] and "asked again" in warnings[0]
    with ResponseCache(path) as c:  # the fresh responses replaced the damaged entries
        assert c.damaged == 0 and len(c) == 3


def test_a_damaged_entry_without_a_server_is_a_failed_row_not_a_crash(llm_artifact, tmp_path):
    path = tmp_path / "c.sqlite"
    batch = _prompts(2)
    _fill(llm_artifact, path, batch)
    _damage_rows(path, [_DAMAGE["nan-tokens"]])
    with LLMClient(_cfg("http://127.0.0.1:9/v1", path)) as client:  # nothing listens there
        got = client.complete_many_sync(batch)
    # The two replies are stored concurrently, so "the first row by created" may be either prompt.
    failed = [r for r in got if not r.ok]
    hits = [r for r in got if r.ok]
    assert len(failed) == 1 and len(hits) == 1 and hits[0].cached
    assert client.stats.cache_hits == 1


def _big_cache(path: Path) -> None:
    with ResponseCache(path) as c:
        for i in range(60):
            c.put(f"k{i}", {"text": f"{i} " + "x" * 4000})
    assert path.stat().st_size > 200_000


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_cache_file_of_ours_is_moved_aside_and_rebuilt(tmp_path, caplog, damage):
    path = tmp_path / "c.sqlite"
    _big_cache(path)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    else:
        path.write_bytes(data[:100] + os.urandom(len(data) - 100))  # header (and our marker) kept
    with ResponseCache(path) as c:
        got = [c.get(f"k{i}") for i in range(60)]  # no exception
        assert all(g is None or g["text"].startswith(f"{i} ") for i, g in enumerate(got))
        assert c.put("new", {"v": 1}) and c.get("new") == {"v": 1}
    aside = [p.name for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("c.sqlite.damaged-")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "was damaged" in warnings[0] and aside[0] in warnings[0]
    with ResponseCache(path) as c:
        assert c.get("new") == {"v": 1} and len(c) == 1


def test_a_corrupt_read_only_cache_is_bypassed_with_one_warning(tmp_path, caplog):
    path = tmp_path / "c.sqlite"
    _big_cache(path)
    data = path.read_bytes()
    path.write_bytes(data[:100] + os.urandom(len(data) - 100))
    before = _sha(path)
    with ResponseCache(path, readonly=True) as c:
        assert c.bypassed and c.get("k1") is None and c.put("k", {"v": 1}) is False and len(c) == 0
    assert _sha(path) == before and _siblings(path) == ["c.sqlite"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "not used in this run" in warnings[0]
