"""On-disk response cache of the LLM client: one SQLite file, safe across threads and processes.

Keys are the sha256 of a canonical JSON of everything that determines a
response *except where the server is*: model, messages and sampling
parameters (:func:`request_key`).  So the same run against a different
host, or with the server stopped, replays from the cache.

The database is in WAL mode (readers never block the writer; several
processes may share one file) with a busy timeout so concurrent writers wait
instead of failing.  A file that is not a readable cache is a
:class:`~kgreason.errors.UserError` naming the file and what to do.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from kgreason.errors import UserError

__all__ = ["ResponseCache", "request_key", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0


def request_key(request: Mapping[str, Any]) -> str:
    """sha256 hex of ``request`` as canonical JSON (sorted keys, no whitespace, UTF-8).

    ``request`` must hold only JSON values; callers leave the base URL and the
    API key out of it.
    """
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ResponseCache:
    """A key -> JSON value store in the SQLite file ``path`` (created with its folder when missing).

    Thread-safe (one connection guarded by a lock; every statement is short).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"LLM cache {self.path}: cannot create its folder ({exc.strerror}); "
                            "pass --llm-cache with a writable path or --no-llm-cache") from None
        try:
            conn = sqlite3.connect(str(self.path), timeout=_BUSY_TIMEOUT_S, check_same_thread=False,
                                   isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,"
                " response TEXT NOT NULL, created REAL NOT NULL)"
            )
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._error(exc) from None
        if row is None or row[0] != str(SCHEMA_VERSION):
            conn.close()
            raise UserError(f"LLM cache {self.path}: schema version {row[0] if row else '?'} is not "
                            f"{SCHEMA_VERSION}; delete the file or pass --llm-cache with another path")
        self._conn = conn

    def _error(self, exc: Exception) -> UserError:
        return UserError(f"LLM cache {self.path} is not a usable SQLite database ({exc}); "
                         "delete it (it only holds cached responses) or pass --llm-cache with another path, "
                         "or --no-llm-cache")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"LLM cache {self.path} is closed")
        return self._conn

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or None."""
        with self._lock:
            try:
                row = self._connection().execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._error(exc) from None
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except json.JSONDecodeError:
            # A damaged row is a miss: the response is fetched again and overwritten.
            return None

    def put(self, key: str, value: Any, *, model: str = "", request: Mapping[str, Any] | None = None) -> None:
        """Store ``value`` (JSON-serialisable) under ``key``; ``request`` is kept for inspection."""
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
        req = json.dumps(request or {}, sort_keys=True, ensure_ascii=False)
        with self._lock:
            try:
                self._connection().execute(
                    "INSERT OR REPLACE INTO responses (key, model, request, response, created) VALUES (?, ?, ?, ?, ?)",
                    (key, model, req, text, time.time()),
                )
            except sqlite3.DatabaseError as exc:
                raise self._error(exc) from None

    def __len__(self) -> int:
        with self._lock:
            return int(self._connection().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "ResponseCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
