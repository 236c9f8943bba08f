"""Calibrated rows of a lazy artifact persisted on disk, so that a second process starts warm.

A :class:`RowStore` is one folder of immutable *segment* files, each holding some calibrated rows
(key ``r*N + h``; a row = sorted int32 columns + float32 values in [0, 1]) of ONE lazy artifact:

* **Keyed to the rows.** The folder is named by :func:`row_fingerprint`, a sha256 of everything a row
  depends on (entity and relation embeddings, observed edges, threshold, delta, :data:`ROWS_VERSION`), and
  every segment's header repeats it: rows of other embeddings, another threshold or another KG are never
  read (a segment whose header names another fingerprint is treated as damaged).
* **Checksummed.** A segment carries two CRC-32s (``zlib.crc32``, ~45 ms per 100 MiB here, sha256 ~100 ms:
  accidental damage is what it guards against, and CRC-32 detects every burst of up to 32 bits): one of its
  header and key index, checked when the segment is opened, one of its entries, checked the first time a
  lookup needs a row of it (once per process).  The size, header fields and index (keys strictly
  increasing and in range, row pointers non-decreasing and ending at the entry count) are checked on
  opening too; the entries' ranges (columns in [0, N) and sorted within a row, values finite in [0, 1])
  are checked by :meth:`RowStore.append` before anything is written, so the checksum then vouches for
  them.  A damaged segment (truncated, a flipped byte, another fingerprint) is moved aside to
  ``NAME.damaged-TIME`` with one warning and its rows are reported as not found, i.e. recomputed:
  never a wrong row, never a traceback.
* **Atomic, and safe with a killed writer.** A segment is written to a temporary sibling
  (:func:`kgreason.files.open_output`: ``.NAME.part-*``) and renamed into place when complete, so a
  reader sees a whole segment or none.  Writers write only while holding an ``flock`` on the folder's
  ``lock`` file, which the kernel releases when a writer dies (SIGKILL included); so a temporary found
  while holding that lock is a killed writer's leftover, removed by the next writer or writable open.
* **Concurrent readers and writers.** Segments are immutable and uniquely named
  (``<time_ns hex>-<pid>-<random>.rows``); readers take no lock and memory-map them.  A store picks up
  segments written by other processes on a later lookup (a directory listing at most every
  ``refresh_s`` seconds) and forgets those removed.  Two processes computing the same row both store it;
  the index serves one copy.
* **Bounded.** Segments (and damaged files moved aside) never take more than ``max_bytes``: under the lock,
  an append first removes damaged files, then the oldest segments (first in, first out), until the new
  segment fits; a batch is written in segments of at most ``min(64 MiB, max_bytes / 4)`` (a longer row
  gets a segment of its own); a segment larger than ``max_bytes`` is not stored.  A temporary being
  written (one segment per live writer) is not counted.
* **Vectorised.** :meth:`RowStore.lookup` of thousands of keys is a ``searchsorted`` on the merged key
  index and whole-row copies in C++ (scipy's ``csr_row_index``), one call per segment touched (plus one to
  restore the order asked when several were): O(keys + entries), no Python loop per row.
* **Off the query path if wanted.** ``append(..., wait=False)`` checks the rows in the caller and writes
  them in a background thread of the store.

A folder or segment that cannot be written (read-only, disk full) costs only the recomputation: one
warning, and the store is read-only for the rest of the process.  Segments of another format version
(a newer kgreason's) are left alone and not served.  kgreason never changes a segment in place; one
truncated by hand while a process has it mapped would end that process with SIGBUS, as any mapped file.

Segment layout (little endian): a 96-byte header (:data:`_HEADER`: magic, version, header size,
N, R, rows k, entries nnz, the fingerprint's 32 bytes, index CRC, entries CRC, header CRC), then
``keys int64 (k,)`` ascending, ``indptr int64 (k+1,)``, ``cols int32 (nnz,)``, ``vals float32 (nnz,)``;
the file is exactly ``96 + 16k + 8 + 8 nnz`` bytes.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import logging
import os
import queue
import secrets
import struct
import threading
import time
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from kgreason.errors import UserError
from kgreason.files import open_output, user_cache_dir

__all__ = ["RowStore", "row_fingerprint", "default_store_folder", "ROWS_VERSION", "SEGMENT_SUFFIX"]

log = logging.getLogger(__name__)

try:  # scipy's CSR row gather (see _copy_rows)
    from scipy.sparse._sparsetools import csr_row_index as _csr_row_index
except ImportError:  # pragma: no cover - another scipy layout: the public indexing is used
    _csr_row_index = None

#: Version of the row formula (:class:`kge.calibrate.RowCalibrator`) the fingerprint covers: bump it when
#: a change there changes any row, so that stores of older rows are never read again.
ROWS_VERSION = 1
#: A committed segment's file name ends with this; temporaries start with "." (``open_output``).
SEGMENT_SUFFIX = ".rows"
#: The file writers lock (created once, empty, never removed).
LOCK_NAME = "lock"
#: Largest segment an append writes (a larger batch is split), so that eviction frees space in steps.
SEGMENT_BYTES = 64 << 20
#: Longest wait for another writer's lock before an append is skipped (a writer holds it for one write).
LOCK_WAIT_S = 10.0
#: Without ``flock`` (some network file systems) a temporary this old is a killed writer's leftover.
STALE_PART_S = 3600.0

_MAGIC = b"KGROWS\x00\x01"
_VERSION = 1
# magic, version, header size, N, R, rows, entries, fingerprint (32 bytes), index crc, entries crc, header crc
_HEADER = struct.Struct("<8sIIQQQQ32sIII4x")
_HEADER_CRC_AT = _HEADER.size - 8  # the header CRC covers the bytes before it


def row_fingerprint(entity: np.ndarray, relation: np.ndarray, observed: np.ndarray, *, threshold: float,
                    delta: float, variant: str = "") -> str:
    """sha256 (hex) of everything a calibrated row depends on: the arrays as the calibration reads them
    (complex64 embeddings, int64 ``(h, r, t)`` edges), their shapes, ``threshold``, ``delta``,
    :data:`ROWS_VERSION`, and ``variant``: anything else the rows must match (e.g. ``"cuda"`` to keep rows
    computed on a GPU, whose GEMM sums differ from the CPU's in the last bits, apart from CPU rows).
    ~40 ms for FB15k-237 at rank 192."""
    h = hashlib.sha256(f"kgreason rows v{ROWS_VERSION}\nvariant {variant!r}\n".encode())
    for name, arr, dtype in (("entity", entity, np.complex64), ("relation", relation, np.complex64),
                             ("observed", observed, np.int64)):
        a = np.ascontiguousarray(arr, dtype=dtype)
        h.update(f"{name} {a.shape}\n".encode())
        h.update(_bytes_of(a))
    h.update(f"threshold {float(threshold)!r} delta {float(delta)!r}\n".encode())
    return h.hexdigest()


def default_store_folder(fingerprint: str) -> Path:
    """``$KGREASON_HOME/rows/<fingerprint>`` (``~/.cache/kgreason`` by default, as the other caches)."""
    return user_cache_dir() / "rows" / fingerprint


@dataclass
class _Segment:
    """One committed segment file, memory-mapped (arrays are views of the map)."""

    name: str
    size: int
    keys: np.ndarray
    indptr: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    entries_crc: int
    payload: Any  # the mapped bytes the entries CRC covers
    verified: bool = False
    _indptr32: np.ndarray | None = None

    def csr_indptr(self) -> np.ndarray:
        """``indptr`` as :func:`_copy_rows` wants it (int32, the dtype of ``cols``, when it fits)."""
        if self._indptr32 is None:
            self._indptr32 = self.indptr.astype(np.int32) if len(self.cols) < 2**31 else self.indptr
        return self._indptr32


class _Damaged(Exception):
    """A segment that must not be served (why in the message)."""


class _Foreign(Exception):
    """A segment of another format version (a newer kgreason sharing the folder): left alone, not served."""


def _ragged(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] + j`` for ``j < lens[i]``, concatenated over ``i`` (int64, no Python loop).

    A running sum of steps of 1 that jump to each next start: two passes over the result.
    """
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    step = np.ones(total, dtype=np.int64)
    step[0] = starts[0]
    step[np.cumsum(lens[:-1])] = starts[1:] - (starts[:-1] + lens[:-1]) + 1
    return np.cumsum(step, out=step)


def _copy_rows(indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, rows: np.ndarray, out_cols: np.ndarray,
               out_vals: np.ndarray, width: int) -> None:
    """Rows ``rows`` of the CSR ``(indptr, cols, vals)`` (``width`` columns), concatenated into ``out_cols`` and
    ``out_vals`` (sized to fit): whole-row copies in a C++ loop.

    scipy's own CSR row indexing does this through ``csr_row_index``; called directly it skips ~0.35 ms of
    checks per call (one call per segment a lookup touches).  Without it (another scipy), the public
    indexing does the same copy.
    """
    if _csr_row_index is not None and indptr.dtype == cols.dtype == np.int32:
        _csr_row_index(len(rows), rows.astype(np.int32), indptr, cols, vals, out_cols, out_vals)
        return
    m = sp.csr_matrix((vals, cols, indptr), shape=(len(indptr) - 1, width), copy=False)[rows]
    out_cols[:] = m.indices
    out_vals[:] = m.data


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` as a flat uint8 array (a buffer zlib, hashlib and files take; empty arrays too)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _crc(*parts: np.ndarray | bytes) -> int:
    crc = 0
    for p in parts:
        crc = zlib.crc32(p if isinstance(p, bytes) else _bytes_of(p), crc)
    return crc


def _int_array(value: Any, what: str, *, widen: bool = True) -> np.ndarray:
    """``value`` as a 1-D integer array (int64 with ``widen``, else its own integer type); else a ValueError."""
    a = np.asarray(value)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or (a.dtype.kind in "fb" and a.size == 0)):
        raise ValueError(f"row store: {what} must be a 1-D integer array, got {a.dtype} of shape {a.shape}")
    return a if not widen and a.dtype.kind in "iu" else a.astype(np.int64, copy=False)


class RowStore:
    """Calibrated rows of one lazy artifact persisted in ``folder`` (see the module doc for the guarantees).

    Make one with :meth:`open`.  Thread-safe (one lock per instance).  Counters: ``hits`` / ``misses``
    (keys found / not found by :meth:`lookup`), ``rows_written``, ``damaged`` (segments moved aside or,
    read-only, ignored), ``evicted`` (segments this instance removed for the budget).
    """

    def __init__(self, folder: Path, *, fingerprint: str, num_entities: int, num_relations: int, max_bytes: int,
                 readonly: bool, refresh_s: float) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self._digest = bytes.fromhex(fingerprint)
        self.num_entities = num_entities
        self.num_relations = num_relations
        self.num_rows = num_entities * num_relations
        self.max_bytes = max_bytes
        self.readonly = readonly
        self.refresh_s = refresh_s
        self.segment_bytes = max(1, min(SEGMENT_BYTES, max_bytes // 4))
        self.hits = self.misses = self.rows_written = self.damaged = self.evicted = 0
        self._segments: dict[str, _Segment] = {}
        self._ignored: set[str] = set()  # damaged names left in place (read-only)
        self._order: list[_Segment] = []  # the index's segment numbers
        self._keys = np.zeros(0, dtype=np.int64)  # merged index: sorted unique keys,
        self._seg = np.zeros(0, dtype=np.int32)  # ... the segment holding each,
        self._row = np.zeros(0, dtype=np.int64)  # ... and its row there
        self._next_scan = 0.0
        self._mutex = threading.RLock()
        self._warned_write = False
        self._closed = False
        self._queue: queue.Queue[Any] | None = None  # appends with wait=False, for ...
        self._thread: threading.Thread | None = None  # ... this writer thread

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, folder: str | os.PathLike, *, fingerprint: str, num_entities: int, num_relations: int,
             max_bytes: int, readonly: bool = False, refresh_s: float = 1.0) -> "RowStore":
        """The store in ``folder`` (created unless ``readonly``), its segments indexed.

        ``fingerprint``: :func:`row_fingerprint` of the rows (64 hex digits; :func:`default_store_folder`
        names the folder by it); ``num_entities`` N and ``num_relations`` R give the key range
        ``[0, R*N)`` and the column range ``[0, N)``; ``max_bytes`` the disk budget (> 0);
        ``readonly``: never write, remove or move anything; ``refresh_s``: how often (at most) a lookup
        lists the folder for other processes' segments.  A folder that cannot be created or written is not
        an error: one warning, then the store is read-only (or empty).  Leftovers of killed writers are
        removed (writable stores).  Wrong arguments are a ``ValueError``.
        """
        if not isinstance(fingerprint, str) or len(fingerprint) != 64 or \
                any(c not in "0123456789abcdef" for c in fingerprint):
            raise ValueError(f"row store: fingerprint must be 64 lower-case hex digits (row_fingerprint), "
                             f"got {fingerprint!r}")
        for what, v in (("num_entities", num_entities), ("num_relations", num_relations), ("max_bytes", max_bytes)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"row store: {what} must be an integer > 0, got {v!r}")
        if not (isinstance(refresh_s, (int, float)) and refresh_s >= 0):
            raise ValueError(f"row store: refresh_s must be a number >= 0, got {refresh_s!r}")
        store = cls(Path(folder), fingerprint=fingerprint, num_entities=int(num_entities),
                    num_relations=int(num_relations), max_bytes=int(max_bytes), readonly=bool(readonly),
                    refresh_s=float(refresh_s))
        if not store.readonly:
            try:
                store.folder.mkdir(parents=True, exist_ok=True)
                (store.folder / LOCK_NAME).touch(exist_ok=True)
            except OSError as exc:
                store._cannot_write(exc)
        if not store.readonly:
            with store._writer_lock(wait=0.0) as held:
                if held:
                    store._remove_leftovers(held)
        with store._mutex:
            store._scan()
        return store

    def close(self) -> None:
        """Write what is queued, then forget every segment (unmaps the files); the store answers nothing
        afterwards."""
        self.flush()
        if self._queue is not None and self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        with self._mutex:
            self._segments.clear()
            self._order = []
            self._keys = np.zeros(0, dtype=np.int64)
            self._closed = True

    def __enter__(self) -> "RowStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Rows the index serves (distinct keys)."""
        return len(self._keys)

    def __repr__(self) -> str:
        return (f"RowStore({str(self.folder)!r}, rows={len(self)}, segments={len(self._segments)}, "
                f"max_bytes={self.max_bytes}, readonly={self.readonly})")

    # ------------------------------------------------------------------ reading
    def lookup(self, keys: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stored rows among ``keys`` (flattened ``r*N + h``).

        Returns ``(found bool (k,), indptr int64 (f+1,), cols int32, vals float32)``, ``f = found.sum()``:
        the rows of the found keys, in the order of ``keys`` (a key given twice is returned twice).
        Keys outside ``[0, R*N)`` are an ``IndexError``.  A segment whose entries fail their checksum is
        moved aside (one warning) and its keys are reported as not found.
        """
        keys = _int_array(keys, "keys")
        if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= self.num_rows):
            bad = keys[(keys < 0) | (keys >= self.num_rows)]
            raise IndexError(f"row store: row key {int(bad[0])} out of range [0, {self.num_rows}) "
                             f"(R*N = {self.num_relations}*{self.num_entities}; {len(bad)} such keys)")
        with self._mutex:
            self._maybe_scan()
            while True:
                pos = np.searchsorted(self._keys, keys)
                np.minimum(pos, max(len(self._keys) - 1, 0), out=pos)
                found = (self._keys[pos] == keys) if len(self._keys) else np.zeros(len(keys), dtype=bool)
                pos = pos[found]
                seg, row = self._seg[pos], self._row[pos]
                if self._verify(np.unique(seg)):
                    break  # else a damaged segment left the index: look again
            self.hits += int(found.sum())
            self.misses += len(keys) - int(found.sum())
            return (found, *self._gather(seg, row))

    def _gather(self, seg: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``row[i]`` of segments ``seg[i]`` as one CSR (indptr, cols, vals), in the order given.

        Whole rows are copied (:func:`_copy_rows`) once per segment touched, into a buffer grouped by
        segment, then, when more than one segment was touched, once more into the order given.
        """
        n = len(seg)
        order = np.argsort(seg, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(seg[order])) + 1) if n else []
        lens = np.zeros(n, dtype=np.int64)
        for g in groups:
            ip = self._order[int(seg[g[0]])].indptr
            lens[g] = ip[row[g] + 1] - ip[row[g]]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        cols = np.empty(int(indptr[-1]), dtype=np.int32)
        vals = np.empty(int(indptr[-1]), dtype=np.float32)
        if len(groups) == 1:  # one segment: the stable sort kept the order given
            s = self._order[int(seg[0])]
            _copy_rows(s.csr_indptr(), s.cols, s.vals, row, cols, vals, self.num_entities)
            return indptr, cols, vals
        grouped_c, grouped_v = np.empty_like(cols), np.empty_like(vals)
        grouped_ip = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens[order], out=grouped_ip[1:])
        for g, a, b in zip(groups, np.cumsum([0] + [len(g) for g in groups[:-1]]), np.cumsum([len(g) for g in groups])):
            s = self._order[int(seg[g[0]])]
            lo, hi = grouped_ip[a], grouped_ip[b]
            _copy_rows(s.csr_indptr(), s.cols, s.vals, row[g], grouped_c[lo:hi], grouped_v[lo:hi], self.num_entities)
        back = np.empty(n, dtype=np.int64)
        back[order] = np.arange(n)  # row i of the answer is row back[i] of the grouped buffer
        small = grouped_ip.astype(np.int32) if len(cols) < 2**31 else grouped_ip
        _copy_rows(small, grouped_c, grouped_v, back, cols, vals, self.num_entities)
        return indptr, cols, vals

    def _verify(self, seg_ids: np.ndarray) -> bool:
        """Check the entries CRC of the segments not checked yet; False if one was damaged (index rebuilt)."""
        ok = True
        for i in seg_ids.tolist():
            s = self._order[i]
            if s.verified:
                continue
            if _crc(s.payload) != s.entries_crc:
                self._damage(s.name, "its entries do not match their checksum")
                ok = False
            else:
                s.verified = True
        if not ok:
            self._reindex()
        return ok

    def _maybe_scan(self) -> None:
        if time.monotonic() >= self._next_scan:
            self._scan()

    def _scan(self) -> None:
        """Index the segments now in the folder: open new ones, forget removed ones (mutex held)."""
        self._next_scan = time.monotonic() + self.refresh_s
        if self._closed:
            return
        try:
            names = {e.name for e in os.scandir(self.folder) if e.name.endswith(SEGMENT_SUFFIX)
                     and not e.name.startswith(".")}
        except OSError:  # no folder (yet): read-only store of nothing, or removed meanwhile
            names = set()
        changed = False
        for name in set(self._segments) - names:
            del self._segments[name]
            changed = True
        for name in sorted(names - set(self._segments) - self._ignored):
            seg = self._open_segment(name)
            if seg is not None:
                self._segments[name] = seg
                changed = True
        if changed:
            self._reindex()

    def _open_segment(self, name: str) -> _Segment | None:
        """Map segment ``name`` and check its size, header and index; None if it is gone or damaged."""
        path = self.folder / name
        try:
            size = path.stat().st_size
            if size < _HEADER.size:
                raise _Damaged(f"truncated: {size} bytes, shorter than its header")
            mm = np.memmap(path, dtype=np.uint8, mode="r")
        except FileNotFoundError:
            return None  # removed by another process since the listing
        except _Damaged as exc:
            self._damage(name, str(exc))
            return None
        except (OSError, ValueError) as exc:
            self._damage(name, f"cannot be mapped ({exc})")
            return None
        try:
            return self._parse(name, mm)
        except _Foreign as exc:
            del mm
            self._ignored.add(name)
            log.debug("row store %s: segment %s ignored (%s)", self.folder, name, exc)
            return None
        except _Damaged as exc:
            del mm
            self._damage(name, str(exc))
            return None

    def _parse(self, name: str, mm: np.ndarray) -> _Segment:
        size = len(mm)
        head = bytes(mm[:_HEADER.size])
        magic, version, hsize, n, r, k, nnz, digest, index_crc, entries_crc, head_crc = _HEADER.unpack(head)
        if magic != _MAGIC:
            raise _Damaged("not a row-store segment (wrong magic bytes)")
        if version != _VERSION:  # the magic and the version open every version's header; the rest may differ
            raise _Foreign(f"segment format version {version}, this kgreason reads {_VERSION}")
        if zlib.crc32(head[:_HEADER_CRC_AT]) != head_crc or hsize != _HEADER.size:
            raise _Damaged("its header does not match its checksum")
        if digest != self._digest:
            raise _Damaged(f"written for other rows (fingerprint {digest.hex()[:12]}…, "
                           f"this store's {self.fingerprint[:12]}…)")
        if (n, r) != (self.num_entities, self.num_relations):
            raise _Damaged(f"written for N={n}, R={r}, this store has N={self.num_entities}, R={self.num_relations}")
        expected = _HEADER.size + 16 * k + 8 + 8 * nnz
        if size != expected:
            raise _Damaged(f"{'truncated' if size < expected else 'too long'}: {size} bytes, its header says {expected}")
        a = _HEADER.size
        keys = mm[a : a + 8 * k].view(np.int64)
        indptr = mm[a + 8 * k : a + 16 * k + 8].view(np.int64)
        if _crc(mm[a : a + 16 * k + 8]) != index_crc:
            raise _Damaged("its key index does not match its checksum")
        if k and (keys[0] < 0 or keys[-1] >= self.num_rows or not bool(np.all(keys[1:] > keys[:-1]))):
            raise _Damaged("its keys are not ascending within [0, R*N)")
        if indptr[0] != 0 or indptr[-1] != nnz or not bool(np.all(indptr[1:] >= indptr[:-1])):
            raise _Damaged("its row pointers are not ascending from 0 to its entry count")
        c = a + 16 * k + 8
        # Plain ndarray views of the map (a memmap subclass costs per operation); they keep the map alive.
        return _Segment(name=name, size=size, keys=np.asarray(keys), indptr=np.asarray(indptr),
                        cols=np.asarray(mm[c : c + 4 * nnz].view(np.int32)),
                        vals=np.asarray(mm[c + 4 * nnz :].view(np.float32)), entries_crc=entries_crc,
                        payload=np.asarray(mm[c:]))

    def _reindex(self) -> None:
        """Merge the segments' keys into the index (oldest segment's copy of a key first)."""
        self._order = [self._segments[n] for n in sorted(self._segments)]
        if not self._order:
            self._keys = np.zeros(0, dtype=np.int64)
            self._seg = np.zeros(0, dtype=np.int32)
            self._row = np.zeros(0, dtype=np.int64)
            return
        keys = np.concatenate([s.keys for s in self._order])
        seg = np.repeat(np.arange(len(self._order), dtype=np.int32), [len(s.keys) for s in self._order])
        row = np.concatenate([np.arange(len(s.keys), dtype=np.int64) for s in self._order])
        order = np.argsort(keys, kind="stable")  # timsort: merges the sorted runs in O(n log segments)
        keys = keys[order]
        first = np.ones(len(keys), dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        self._keys, self._seg, self._row = keys[first], seg[order][first], row[order][first]

    def _damage(self, name: str, why: str) -> None:
        """Stop serving segment ``name``: moved aside to ``NAME.damaged-TIME`` (ignored when read-only)."""
        self.damaged += 1
        self._segments.pop(name, None)
        path = self.folder / name
        if not self.readonly:
            aside = path.with_name(f"{name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                os.replace(path, aside)
            except FileNotFoundError:
                return  # another process moved it first (and warned)
            except OSError as exc:
                self._ignored.add(name)
                log.warning("row store %s: segment %s is damaged (%s) and cannot be moved aside (%s): "
                            "its rows are recomputed", self.folder, name, why, exc.strerror)
                return
            log.warning("row store %s: segment %s was damaged (%s): moved to %s; its rows are recomputed",
                        self.folder, name, why, aside.name)
            return
        self._ignored.add(name)
        log.warning("row store %s: segment %s is damaged (%s): ignored (read-only store); its rows are "
                    "recomputed", self.folder, name, why)

    # ------------------------------------------------------------------ writing
    def append(self, keys: Any, indptr: Any, cols: Any, vals: Any, *, wait: bool = True) -> int:
        """Store rows ``keys[i]`` = ``cols/vals[indptr[i]:indptr[i+1]]``; returns how many rows were written
        (with ``wait=False``: queued).

        Keys already stored (or given twice: the first is kept) are skipped.  The rows are checked first
        (``ValueError``: keys in ``[0, R*N)``, ``indptr`` from 0 to ``len(cols) == len(vals)``, columns in
        ``[0, N)`` strictly ascending within a row, values float32, finite, in [0, 1]); then written as
        segments of at most ``min(64 MiB, max_bytes / 4)``, each after removing the oldest segments its
        size needs under the budget.  A read-only store, an unwritable folder or a full disk write nothing
        (one warning for the latter two).

        ``wait=False``: the checks run now (errors are raised here), the writing (CRCs, write, fsync: ~60 ms
        per 10 MB) in one background thread of this store, in order; at most 4 segments wait (further
        appends block until one is written); :meth:`flush`, :meth:`close` and the interpreter's exit wait
        for them.  Rows queued but not yet written are not served by :meth:`lookup` (nor deduplicated).
        """
        keys, indptr, cols, vals = self._check_rows(keys, indptr, cols, vals)
        if self.readonly or self._closed or not len(keys):
            return 0
        with self._mutex:
            self._maybe_scan()
            # New keys only, each once, ascending (a segment's keys are).
            uniq, first = np.unique(keys, return_index=True)
            pos = np.minimum(np.searchsorted(self._keys, uniq), max(len(self._keys) - 1, 0))
            new = ~(self._keys[pos] == uniq) if len(self._keys) else np.ones(len(uniq), dtype=bool)
        take = first[new]
        if not len(take):
            return 0
        if len(take) == len(keys) and bool(np.all(take == np.arange(len(keys)))):
            bounds = indptr  # already new, unique and ascending (e.g. np.unique'd misses): no copy
            if not wait:  # the caller may reuse its arrays once this returns
                keys, bounds, cols, vals = keys.copy(), indptr.copy(), cols.copy(), vals.copy()
        else:
            lens = (indptr[1:] - indptr[:-1])[take]
            bounds = np.zeros(len(take) + 1, dtype=np.int64)
            np.cumsum(lens, out=bounds[1:])
            src = _ragged(indptr[take], lens)
            keys, cols, vals = keys[take], cols[src], vals[src]
        # Segments of at most segment_bytes: cut where the running size passes each multiple.
        row_end_bytes = 16 * np.arange(1, len(keys) + 1) + 8 * bounds[1:]
        cut = np.flatnonzero(np.diff(row_end_bytes // self.segment_bytes)) + 1
        pieces = [(keys[a:b], bounds[a : b + 1] - bounds[a], cols[bounds[a] : bounds[b]], vals[bounds[a] : bounds[b]])
                  for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(keys)])]
        if wait:
            return self._write_pieces(pieces)
        queue = self._background()
        for piece in pieces:
            queue.put(piece)
        return len(keys)

    def _write_pieces(self, pieces: list[tuple[np.ndarray, ...]]) -> int:
        written = 0
        for piece in pieces:
            done = self._write_segment(*piece)
            if done is None:
                break
            written += done
        with self._mutex:
            self.rows_written += written
        return written

    def _background(self) -> "queue.Queue[Any]":
        """The queue of this store's writer thread, started on first use (again in a forked child)."""
        with self._mutex:
            if self._thread is None or not self._thread.is_alive():
                self._queue = queue.Queue(maxsize=4)
                self._thread = threading.Thread(target=self._write_queued, args=(self._queue,),
                                                name=f"kge.rowstore {self.folder.name[:12]}", daemon=True)
                self._thread.start()
                atexit.register(_flush_at_exit, weakref.ref(self))
            assert self._queue is not None
            return self._queue

    def _write_queued(self, jobs: "queue.Queue[Any]") -> None:
        while True:
            piece = jobs.get()
            try:
                if piece is None:
                    return
                if not self.readonly:
                    self._write_pieces([piece])
            except Exception as exc:  # noqa: BLE001 - a cache never ends the run: one warning, then read-only
                self._cannot_write(exc)
            finally:
                jobs.task_done()

    def flush(self) -> None:
        """Wait until every row appended with ``wait=False`` is written (or given up)."""
        jobs = self._queue
        if jobs is not None and self._thread is not None and self._thread.is_alive():
            jobs.join()

    def _check_rows(self, keys: Any, indptr: Any, cols: Any, vals: Any) -> tuple[np.ndarray, ...]:
        keys, indptr = _int_array(keys, "keys"), _int_array(indptr, "indptr")
        cols = _int_array(cols, "cols", widen=False)  # int32 columns are neither copied nor converted
        vals = np.asarray(vals)
        if vals.ndim != 1 or vals.dtype != np.float32:
            raise ValueError(f"row store: vals must be a 1-D float32 array, got {vals.dtype} of shape {vals.shape}")
        if len(indptr) != len(keys) + 1:
            raise ValueError(f"row store: indptr has {len(indptr)} entries, expected len(keys) + 1 = {len(keys) + 1}")
        if len(cols) != len(vals) or indptr[0] != 0 or indptr[-1] != len(cols) or np.any(indptr[1:] < indptr[:-1]):
            raise ValueError(f"row store: indptr must ascend from 0 to len(cols) = len(vals); got indptr "
                             f"{indptr[0]}..{indptr[-1]}, {len(cols)} cols, {len(vals)} vals")
        if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= self.num_rows):
            raise ValueError(f"row store: row keys must lie in [0, {self.num_rows}), got {int(keys.min())}.."
                             f"{int(keys.max())}")
        if len(cols):
            if int(cols.min()) < 0 or int(cols.max()) >= self.num_entities:
                raise ValueError(f"row store: columns must lie in [0, {self.num_entities}), got "
                                 f"{int(cols.min())}..{int(cols.max())}")
            ascending = cols[1:] > cols[:-1]
            row_starts = indptr[1:-1]
            ascending[row_starts[(row_starts > 0) & (row_starts < len(cols))] - 1] = True  # across rows: free
            if not ascending.all():
                raise ValueError("row store: columns must be strictly ascending within each row")
            if not (float(vals.min()) >= 0.0 and float(vals.max()) <= 1.0):  # false for NaN and infinities too
                raise ValueError("row store: values must be finite and in [0, 1]")
        return keys, indptr, cols.astype(np.int32, copy=False), vals

    def _write_segment(self, keys: np.ndarray, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> int | None:
        """Write one segment (under the writers' lock, after eviction): the rows written (0: over the budget),
        or None when this append stops (the lock stayed busy, or the store cannot be written)."""
        size = _HEADER.size + 16 * len(keys) + 8 + 8 * len(cols)
        if size > self.max_bytes:
            log.debug("row store %s: a row of %d bytes exceeds the budget of %d: not stored",
                      self.folder, size, self.max_bytes)
            return 0  # other segments may fit
        head = _HEADER.pack(_MAGIC, _VERSION, _HEADER.size, self.num_entities, self.num_relations, len(keys),
                            len(cols), self._digest, _crc(keys, indptr), _crc(cols, vals), 0)
        head = head[:_HEADER_CRC_AT] + struct.pack("<I", zlib.crc32(head[:_HEADER_CRC_AT])) + head[_HEADER_CRC_AT + 4:]
        name = f"{time.time_ns():016x}-{os.getpid()}-{secrets.token_hex(4)}{SEGMENT_SUFFIX}"
        try:
            with self._writer_lock(wait=LOCK_WAIT_S) as held:
                if not held:
                    log.debug("row store %s: another writer held the lock for %g s: %d rows not stored",
                              self.folder, LOCK_WAIT_S, len(keys))
                    return None
                self._remove_leftovers(held)
                self._evict(size)
                with open_output(self.folder / name, what="row store segment", binary=True) as f:
                    _write_arrays(f, head, keys, indptr, cols, vals)
        except (OSError, UserError) as exc:
            self._cannot_write(exc)
            return None
        with self._mutex:
            seg = self._open_segment(name)
            if seg is not None:
                seg.verified = True  # these entries were just checked and written by this process
                self._segments[name] = seg
                self._reindex()
        return len(keys)

    def _evict(self, incoming: int) -> None:
        """Remove damaged files, then the oldest segments, until ``incoming`` more bytes fit (lock held)."""
        entries = []
        for e in os.scandir(self.folder):
            if e.name.startswith(".") or not (e.name.endswith(SEGMENT_SUFFIX) or SEGMENT_SUFFIX + ".damaged-" in e.name):
                continue  # temporaries are not counted (see the module doc); foreign files are never ours to remove
            with contextlib.suppress(OSError):
                # damaged files first (they serve nothing), then segments oldest first (names start with the time)
                entries.append((SEGMENT_SUFFIX + ".damaged-" not in e.name, e.name, e.stat().st_size))
        used = sum(size for _, _, size in entries)
        removed = []
        for _, name, size in sorted(entries):
            if used + incoming <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.folder / name)
            used -= size
            removed.append(name)
        with self._mutex:
            self.evicted += sum(name.endswith(SEGMENT_SUFFIX) for name in removed)
            dropped = [name for name in removed if self._segments.pop(name, None) is not None]
            if dropped:
                self._reindex()

    @contextlib.contextmanager
    def _writer_lock(self, *, wait: float) -> Iterator[str | None]:
        """Hold the folder's writers' lock: yields ``"flock"``, ``"none"`` (no flock on this file system:
        writers are not excluded) or None (another writer held it for ``wait`` seconds)."""
        import fcntl

        try:
            fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._cannot_write(exc)
            yield None
            return
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = "flock"
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        held = None
                        break
                    time.sleep(0.005)
                except OSError as exc:
                    if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    held = "none"
                    break
            yield held
        finally:
            os.close(fd)  # releases the flock

    def _remove_leftovers(self, held: str) -> None:
        """Remove killed writers' temporaries (``.NAME.part-*``): all of them when ``held`` is ``"flock"``
        (a live writer holds the lock while its temporary exists), else those older than :data:`STALE_PART_S`."""
        now = time.time()
        try:
            entries = [e for e in os.scandir(self.folder) if e.name.startswith(".") and ".part-" in e.name
                       and SEGMENT_SUFFIX in e.name]
        except OSError:
            return
        for e in entries:
            with contextlib.suppress(OSError):
                if held == "flock" or now - e.stat().st_mtime > STALE_PART_S:
                    os.unlink(e.path)
                    log.debug("row store %s: removed %s, left by a killed writer", self.folder, e.name)

    def _cannot_write(self, exc: BaseException) -> None:
        """Writing failed (read-only folder, full disk): one warning, then read-only for this process."""
        self.readonly = True
        if not self._warned_write:
            self._warned_write = True
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            log.warning("row store %s cannot be written (%s): rows computed in this run are not kept on disk",
                        self.folder, why)


def _flush_at_exit(ref: "weakref.ReferenceType[RowStore]") -> None:
    """At the interpreter's exit: write what a store still has queued (a killed process loses it)."""
    store = ref()
    if store is not None:
        store.flush()


def _write_arrays(f: Any, head: bytes, *arrays: np.ndarray) -> None:
    """The segment's bytes: header, then each array's (no concatenated copy)."""
    f.write(head)
    for a in arrays:
        f.write(_bytes_of(a))
