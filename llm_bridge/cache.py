"""On-disk response cache of the LLM client: one SQLite file, safe across threads and processes.

Keys are the sha256 of a canonical JSON of everything that determines a
response *except where the server is*: model, messages and sampling
parameters (:func:`request_key`).  So the same run against a different
host, or with the server stopped, replays from the cache.

**It only ever writes to files it created.**  A cache file carries a marker,
SQLite's ``PRAGMA application_id`` = :data:`APPLICATION_ID` (bytes 68-71 of the
file header), which is checked by reading the header *before* SQLite opens
the file for writing.  Anything else given as ``--llm-cache`` -- a folder, an
empty file, a TSV, an artifact file, the user's own SQLite database -- is a
:class:`~kgreason.errors.UserError` that names the file and says it was not
modified; its bytes, its journal mode and its folder stay as they were (no
``-wal``/``-shm`` file is created next to it).  Caches written before the marker
existed (tables ``meta`` and ``responses``, schema 1, no application id) are
recognised by a read-only look (``immutable=1``) and get the marker on their
first writable open.

A new cache is built in a temporary file in the same folder and linked into
place, so a half-made cache never exists under the real name.

The database is in WAL mode (readers never block the writer; several
processes may share one file) with a busy timeout so concurrent writers wait
instead of failing.

**Damage is survived, never fatal.**  Every entry is verified when it is read: JSON
(:func:`kgreason.files.loads_json`: bounded depth, no ``NaN``/``Infinity``), an object, and for an
entry stored for a chat request (its ``request`` has ``messages``) the layout of a client completion
(:func:`check_completion`: texts, finite log-probabilities, non-negative token counts).  A damaged entry
is a miss (asked again and overwritten); the first one logs a warning naming the cache, the later ones
are counted in ``damaged``.  A cache file of ours (it carries the marker) that SQLite finds corrupt --
truncated, overwritten with garbage -- is moved aside to ``NAME.damaged-TIME`` (with its ``-wal``) and
a new empty cache is made in its place, with one warning; when that cannot be done (a read-only
folder) the cache is bypassed for the run (nothing read or stored), also with one warning.  A file
without the marker is still refused untouched (it may be someone else's).

**Read-only caches replay.**  When the file or its folder is not writable
(checked with :func:`os.access`), when ``readonly=True`` is asked for, or when
SQLite refuses a write while opening, the file is opened read-only
(``immutable=1``, which needs no ``-shm`` file; ``mode=ro`` first when a
non-empty ``-wal`` file holds entries not yet merged).  Hits are served;
:meth:`ResponseCache.put` then stores nothing and returns False (the client
counts those misses and warns once).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

from kgreason.errors import UserError
from kgreason.files import loads_json

__all__ = ["ResponseCache", "request_key", "check_completion", "SCHEMA_VERSION", "APPLICATION_ID"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: ``PRAGMA application_id`` of a kgreason LLM cache: "KGLC" as a big-endian 32-bit integer.
APPLICATION_ID = int.from_bytes(b"KGLC", "big")
_BUSY_TIMEOUT_S = 30.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
_TABLES = {"meta", "responses"}


def request_key(request: Mapping[str, Any]) -> str:
    """sha256 hex of ``request`` as canonical JSON (sorted keys, no whitespace, UTF-8).

    ``request`` must hold only JSON values; callers leave the base URL and the
    API key out of it.
    """
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_completion(value: Any) -> str | None:
    """What is wrong with ``value`` as a stored client completion (``Completion.to_json``), or None.

    Texts are strings; ``logprobs`` and ``finish_reasons`` have one entry per text (None, or
    ``[token, finite number]`` pairs; None or a string); token counts are integers >= 0,
    ``n_requested`` >= 1, ``model`` a string, ``latency_s`` (when present) a finite number.
    """
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    texts, lps, reasons = value.get("texts"), value.get("logprobs"), value.get("finish_reasons")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return "'texts' is not a list of strings"
    if not isinstance(lps, list) or len(lps) != len(texts):
        return "'logprobs' is not a list with one entry per text"
    for lp in lps:
        if lp is not None and not (isinstance(lp, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _number(p[1]) for p in lp)):
            return "'logprobs' holds an entry that is not a list of [token, finite number]"
    if not isinstance(reasons, list) or len(reasons) != len(texts) or \
            not all(r is None or isinstance(r, str) for r in reasons):
        return "'finish_reasons' is not a list of strings (or null) with one entry per text"
    for key, low in (("prompt_tokens", 0), ("completion_tokens", 0), ("n_requested", 1)):
        if not _count(value.get(key), low):
            return f"{key!r} is not an integer >= {low}"
    if not isinstance(value.get("model"), str):
        return "'model' is not a string"
    if "latency_s" in value and not _number(value["latency_s"]):
        return "'latency_s' is not a finite number"
    return None


#: SQLite's result codes for a corrupt file (SQLITE_CORRUPT, SQLITE_NOTADB).
_CORRUPT_CODES = (11, 26)


def _corrupt(exc: sqlite3.Error) -> bool:
    """True when SQLite says the file is damaged (not locked, not read-only, not full)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _CORRUPT_CODES
    msg = str(exc)
    return "malformed" in msg or "not a database" in msg


class _Corrupt(Exception):
    """Raised by the schema check when SQLite finds the file corrupt (handled by replacing it)."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _uri(path: Path, query: str) -> str:
    return "file:" + quote(str(path.resolve())) + "?" + query


def _hint() -> str:
    return "pass --llm-cache with another path, or --no-llm-cache"


class ResponseCache:
    """A key -> JSON value store in the SQLite file ``path`` (created with its folder when missing).

    Args:
        path: the cache file.
        readonly: open an existing cache read-only (nothing is written, not even
            SQLite's ``-wal``/``-shm`` files); also chosen by itself when the file or
            its folder is not writable.

    Thread-safe (one connection guarded by a lock; every statement is short).
    ``readonly`` tells how it was opened; ``unstored`` counts :meth:`put` calls that
    stored nothing because of it; ``damaged`` counts damaged entries read (misses);
    ``bypassed`` is True when a corrupt file could not be replaced (see the module doc).
    """

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.readonly = bool(readonly)
        self.unstored = 0
        self.damaged = 0
        self.bypassed = False
        if not (self.path.exists() or self.path.is_symlink()):
            if self.readonly:
                raise UserError(f"LLM cache {self.path} does not exist, so it cannot be opened read-only; {_hint()}")
            self._create()
        legacy = self._probe()
        if not self.readonly and not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
            self.readonly = True
            log.info("LLM cache %s is not writable: opened read-only", self.path)
        try:
            if not self.readonly:
                try:
                    self._conn = self._open_writable(legacy)
                except sqlite3.OperationalError as exc:
                    if _corrupt(exc):
                        raise _Corrupt(exc) from None
                    # Read-only media, a folder where -wal/-shm cannot be made: replay what is there.
                    log.warning("LLM cache %s cannot be written (%s): replaying it read-only", self.path, exc)
                    self.readonly = True
                except sqlite3.DatabaseError as exc:
                    if not _corrupt(exc):
                        raise UserError(f"LLM cache {self.path} cannot be opened ({exc}); {_hint()}") from None
                    raise _Corrupt(exc) from None
            if self.readonly:
                self._conn = self._open_readonly()
            self._check_schema()
        except _Corrupt as exc:  # only ever for a file with our marker (_probe refused any other)
            self._replace_corrupt(exc.error)

    # ------------------------------------------------------------------ opening
    def _refuse(self, why: str) -> UserError:
        return UserError(f"LLM cache {self.path} {why}: it is not a kgreason LLM cache and was not modified; "
                         f"{_hint()}")

    def _probe(self) -> bool:
        """Check that the file is ours without writing anything; True for a cache made before the marker."""
        p = self.path
        if p.is_dir():
            raise self._refuse("is a folder")
        if not p.is_file():
            raise self._refuse("is not a regular file" if p.exists() else "is a broken symbolic link")
        try:
            with open(p, "rb") as f:
                header = f.read(100)
        except OSError as exc:
            raise UserError(f"LLM cache {p} cannot be read ({exc.strerror}); {_hint()}") from None
        if not header:
            raise self._refuse("is an empty file")
        if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
            raise self._refuse("is not a SQLite database")
        app_id = int.from_bytes(header[68:72], "big")
        if app_id == APPLICATION_ID:
            return False
        if app_id != 0:
            raise self._refuse(f"is the SQLite database of another application (application_id {app_id:#010x})")
        # No marker: a cache from before the marker, or somebody's database. Look without any lock or write.
        try:
            conn = sqlite3.connect(_uri(p, "mode=ro&immutable=1"), uri=True)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                schema = None
                if tables == _TABLES:
                    row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
                    schema = row[0] if row else None
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise self._refuse(f"is not a readable SQLite database ({exc})") from None
        if tables == _TABLES and schema == str(SCHEMA_VERSION):
            return True
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise self._refuse(f"is a SQLite database with other tables ({shown or 'none'})")

    def _create(self) -> None:
        """Make a new cache: built in a temporary sibling, then linked into place (never half-made)."""
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{self.path.name}.new-", dir=parent)
            os.close(fd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # kgreason.errors.cli_main names the disk-full condition and the path
            # mkdir's "File exists" / "Not a directory" mean a file stands where a folder is needed: name it.
            blocker = next((a for a in [*reversed(parent.parents), parent] if a.exists() and not a.is_dir()), None)
            why = f"{blocker} is a file, not a folder" if blocker is not None else exc.strerror
            raise UserError(f"LLM cache {self.path}: cannot create it ({why}); "
                            "pass --llm-cache with a writable path, or --no-llm-cache") from None
        tmp = Path(tmp_name)
        try:
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("PRAGMA journal_mode=WAL")  # recorded in the file header
                self._make_tables(conn)
            finally:
                conn.close()
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass  # another process made it first: use theirs
            except OSError:  # a file system without hard links
                if not self.path.exists():
                    os.replace(tmp, self.path)
        except sqlite3.DatabaseError as exc:
            if "full" in str(exc):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from None
            raise UserError(f"LLM cache {self.path}: cannot create it ({exc}); {_hint()}") from None
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
                try:
                    leftover.unlink()
                except FileNotFoundError:
                    pass

    @staticmethod
    def _make_tables(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS responses ("
            " key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,"
            " response TEXT NOT NULL, created REAL NOT NULL)"
        )
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    def _open_writable(self, legacy: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=_BUSY_TIMEOUT_S, check_same_thread=False,
                               isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # the file is ours (checked above)
            conn.execute("PRAGMA synchronous=NORMAL")
            if legacy:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_readonly(self) -> sqlite3.Connection:
        wal = Path(f"{self.path}-wal")
        try:
            pending = wal.is_file() and wal.stat().st_size > 0
        except OSError:
            pending = False
        if pending:
            # Entries may still sit in the -wal file; mode=ro reads them where SQLite can (needs -shm).
            try:
                conn = sqlite3.connect(_uri(self.path, "mode=ro"), uri=True, check_same_thread=False)
                conn.execute("SELECT COUNT(*) FROM responses").fetchone()
                return conn
            except sqlite3.OperationalError as exc:
                log.warning("LLM cache %s: entries in %s cannot be read here (%s); replaying the rest",
                            self.path, wal.name, exc)
                conn.close()
        try:
            return sqlite3.connect(_uri(self.path, "mode=ro&immutable=1"), uri=True, check_same_thread=False)
        except sqlite3.Error as exc:
            raise UserError(f"LLM cache {self.path} cannot be opened read-only ({exc}); {_hint()}") from None

    def _check_schema(self) -> None:
        conn = self._connection()
        try:
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            if row is not None and row[0] == str(SCHEMA_VERSION):
                conn.execute("SELECT key, response FROM responses LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            if _corrupt(exc):
                raise _Corrupt(exc) from None
            self.close()
            raise UserError(f"LLM cache {self.path} cannot be read ({exc}); {_hint()}") from None
        if row is None or row[0] != str(SCHEMA_VERSION):
            self.close()
            raise UserError(f"LLM cache {self.path} has schema version {row[0] if row else '?'}, this kgreason "
                            f"reads version {SCHEMA_VERSION}; it was not modified; {_hint()}")

    def _replace_corrupt(self, error: sqlite3.Error) -> None:
        """A corrupt cache file of ours: move it aside and start an empty one, or bypass it (one warning)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            if self.readonly:
                raise PermissionError("the cache is read-only")
            os.replace(self.path, aside)
            for ext in ("-wal", "-shm"):
                side = Path(f"{self.path}{ext}")
                if side.exists():
                    os.replace(side, Path(f"{aside}{ext}"))
            self._create()
            self._conn = self._open_writable(False)
            self._check_schema()
        except (OSError, UserError, sqlite3.Error, _Corrupt) as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self.bypassed = True
            self.readonly = True
            log.warning("LLM cache %s is damaged (%s) and cannot be replaced (%s): it is not used in this run; "
                        "%s", self.path, error, exc, _hint())
            return
        log.warning("LLM cache %s was damaged (%s): moved to %s, continuing with a new empty cache",
                    self.path, error, aside.name)

    def _damaged_entry(self, key: str, why: str) -> None:
        self.damaged += 1
        if self.damaged == 1:
            log.warning("LLM cache %s: entry %s is damaged (%s); it is asked again and replaced "
                        "(further damaged entries are counted, not reported)", self.path, key[:12], why)

    # ------------------------------------------------------------------ access
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"LLM cache {self.path} is closed")
        return self._conn

    def get(self, key: str) -> Any | None:
        """The value stored under ``key``, or None (also for a damaged entry: see the module doc)."""
        with self._lock:
            if self.bypassed:
                return None
            try:
                row = self._connection().execute("SELECT response, request FROM responses WHERE key = ?",
                                                 (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                if not _corrupt(exc):
                    raise UserError(f"LLM cache {self.path} cannot be read ({exc}); {_hint()}") from None
                self._replace_corrupt(exc)
                return None
        if row is None:
            return None
        # A damaged row is a miss: the response is fetched again and overwritten.
        try:
            value = loads_json(row[0], allow_nan=False) if isinstance(row[0], str) else None
        except ValueError as exc:
            self._damaged_entry(key, f"not JSON: {getattr(exc, 'msg', exc)}")
            return None
        if value is None:
            self._damaged_entry(key, "no response text")
            return None
        problem = None
        try:
            request = loads_json(row[1]) if isinstance(row[1], str) else None
        except ValueError:
            request = None
        if isinstance(request, dict) and "messages" in request:
            problem = check_completion(value)
        elif not isinstance(value, (dict, list)):
            problem = f"a JSON {type(value).__name__}, not an object"
        if problem is not None:
            self._damaged_entry(key, problem)
            return None
        return value

    def put(self, key: str, value: Any, *, model: str = "", request: Mapping[str, Any] | None = None) -> bool:
        """Store ``value`` (JSON-serialisable) under ``key``; ``request`` is kept for inspection.

        Returns False, storing nothing, when the cache is read-only (counted in ``unstored``).
        A full disk raises :class:`OSError` ``ENOSPC`` naming the file.
        """
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
        req = json.dumps(request or {}, sort_keys=True, ensure_ascii=False)
        with self._lock:
            if self.readonly:
                self.unstored += 1
                return False
            try:
                return self._put(key, model, req, text)
            except sqlite3.DatabaseError as exc:
                self._replace_corrupt(exc)
            if self.readonly:
                self.unstored += 1
                return False
            return self._put(key, model, req, text)

    def _put(self, key: str, model: str, req: str, text: str) -> bool:
        """The INSERT of :meth:`put` (lock held): True when stored; a corrupt file's error is raised as is."""
        try:
            self._connection().execute(
                "INSERT OR REPLACE INTO responses (key, model, request, response, created) VALUES (?, ?, ?, ?, ?)",
                (key, model, req, text, time.time()),
            )
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            if "full" in msg:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from None
            if "readonly" in msg or "read-only" in msg:
                log.warning("LLM cache %s became read-only (%s): new answers are not stored", self.path, msg)
                self.readonly = True
                self.unstored += 1
                return False
            raise UserError(f"LLM cache {self.path} cannot be written ({exc}); {_hint()}") from None
        except sqlite3.DatabaseError as exc:
            if _corrupt(exc):
                raise
            raise UserError(f"LLM cache {self.path} cannot be written ({exc}); {_hint()}") from None
        return True

    def __len__(self) -> int:
        with self._lock:
            if self.bypassed:
                return 0
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
