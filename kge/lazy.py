"""Lazy relation matrices: calibrated rows computed from the embeddings when a query needs them.

A lazy artifact (``meta.json["matrices"] == "lazy"``) stores no ``matrices.npz``;
its :attr:`~kge.artifact.Artifact.matrices` is a :class:`LazyMatrices`, which
stands for the same stacked ``(R*N, N)`` CSR an eager build would have written
(row ``r*N + h`` = ``M_r[h, :]``) and computes any set of its rows on demand:

* with :class:`kge.calibrate.RowCalibrator` -- the very function the eager
  build calls, at the artifact's threshold and delta, so a lazy row equals the
  eager row (same float32 operations; tests/test_kge_lazy.py checks the
  answers agree within 1e-6);
* all missing rows of a request in one chunked matmul pass
  (``(c, 2d) @ (2d, N)`` per chunk of ``chunk_rows`` rows);
* kept per relation in a byte-budget cache (:class:`RowCache`, ``--row-cache-gb``),
  each relation's rows prepared once as the stack a projection reads, and
  persisted for later processes (:mod:`kge.rowstore`, ``--row-store-gb``).
  Rows a request needs are in hand before anything is evicted, so a
  budget smaller than one request's rows only costs recomputation, never
  correctness.

Projections read them through :class:`kge.rows.LazyRows` (``artifact.relation_rows()``):
per relation of a batch, the rows ``(r, h)`` of the active entities ``h`` (nonzero
inputs), as :meth:`LazyMatrices.stacks` hands them out; rows of inactive heads
are multiplied by 0 in both plain and negated projection, so leaving them out
changes no score and no argmax.  Whole relations
(:meth:`LazyMatrices.relation_block`) and the whole stack
(:meth:`LazyMatrices.materialize`) can be computed explicitly, with a size
check (they cost ``N`` resp. ``R*N`` rows).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from kgreason.errors import UserError

from .calibrate import DEFAULT_DELTA, DEFAULT_THRESHOLD, RowCalibrator

__all__ = ["LazyMatrices", "RowCache", "LazyStats", "check_row_cache_gb", "check_row_store_gb", "take_rows",
           "DEFAULT_ROW_CACHE_GB", "DEFAULT_ROW_STORE_GB", "MATRIX_MODES"]

#: Default byte budget of the row cache, in GiB (rows at QTO's 2e-4 on FB15k-237 hold ~440 entries, 7 KB each
#: with the prepared transpose: 4 GiB keeps the rows of a batch of 16 "up" queries, 1 GiB thrashed).
DEFAULT_ROW_CACHE_GB = 4.0
#: Default disk budget of the persisted row store (:mod:`kge.rowstore`), in GiB; 0 turns it off.
DEFAULT_ROW_STORE_GB = 4.0
#: Values of ``--matrices`` (``meta.json["matrices"]`` holds "eager" or "lazy").
MATRIX_MODES = ("eager", "lazy", "auto")
#: Bytes a cached row costs besides its entries: its head, its row pointer and its last-use tick
#: (8 bytes each) in the relation's row set, and the same pointer once more in the prepared stack.
_ROW_OVERHEAD = 32
#: Bytes a cached entry costs: column + value (8 bytes) in the row set, and again in the prepared
#: stack's transpose (the stack's own column/value arrays are the row set's, shared).
_ENTRY_BYTES = 16
#: Up to this many rows over several relations, :meth:`LazyMatrices.rows`' warm path slices row by row.
_SLICE_ROWS = 256
#: After an eviction the cache holds at most this share of its budget: evicting a little below the
#: budget makes the (sort of every cached row's tick) eviction pass rare instead of once per insert.
_EVICT_TO = 0.9
#: A relation's newly computed rows wait in a pending set until it holds this share of the rows
#: already merged (or the main set is empty): merging rewrites the whole set, so merging on every
#: miss would cost O(set) per 1p query; merging at a fixed ratio makes it O(1) amortized per entry.
_MERGE_RATIO = 0.25


def check_row_cache_gb(value: Any, option: str = "--row-cache-gb") -> float:
    """``value`` as a cache budget in GiB (a finite number > 0); else a one-line :class:`UserError` naming ``option``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{option} must be a number of GiB > 0, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise UserError(f"{option} must be a finite number of GiB > 0, got {value}")
    return v


def check_row_store_gb(value: Any, option: str = "--row-store-gb") -> float:
    """``value`` as a disk budget in GiB (a finite number >= 0; 0 = no persisted rows); else a one-line
    :class:`UserError` naming ``option``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{option} must be a number of GiB >= 0 (0: off), got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v >= 0):
        raise UserError(f"{option} must be a finite number of GiB >= 0 (0: off), got {value}")
    return v


def take_rows(indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray,
              idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``idx`` of a CSR ``(indptr, cols, vals)``, in that order: ``(indptr int64, cols, vals)``.

    One vectorised gather (O(rows + entries), no Python loop per row): a lazy projection
    gathers thousands of rows per call.
    """
    idx = np.asarray(idx, dtype=np.int64)
    starts = indptr[idx]
    lens = indptr[idx + 1] - starts
    out_ptr = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens, out=out_ptr[1:])
    total = int(out_ptr[-1])
    if total == 0:
        return out_ptr, cols[:0].copy(), vals[:0].copy()
    # entry k of output row j sits at starts[j] + (k - out_ptr[j]) in the input
    src = np.repeat(starts - out_ptr[:-1], lens) + np.arange(total, dtype=np.int64)
    return out_ptr, cols[src], vals[src]


def concat_rows(pieces: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """CSR pieces ``(indptr, cols, vals)`` one after another, as one CSR (the rows of the first, then the second's...)."""
    ptrs, off = [np.zeros(1, np.int64)], 0
    for indptr, cols, _ in pieces:
        ptrs.append(indptr[1:] + off)
        off += len(cols)
    return (np.concatenate(ptrs), np.concatenate([c for _, c, _ in pieces]) if pieces else np.zeros(0, np.int32),
            np.concatenate([v for _, _, v in pieces]) if pieces else np.zeros(0, np.float32))


class _RowSet:
    """Cached rows of one relation ``M_r``: heads ascending with their rows as CSR pieces.

    ``ticks[k]`` is the request that last used row ``k`` (LRU eviction); ``stacks`` holds the
    set prepared as a one-relation ``ops.StackedMatrices`` per device (built on first use,
    dropped when the set changes): a warm projection reads it as it is.
    """

    __slots__ = ("heads", "indptr", "cols", "vals", "ticks", "stacks", "ptr_bytes", "member", "entity_ptr", "touched")

    def __init__(self, heads: np.ndarray, indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                 ticks: np.ndarray) -> None:
        self.heads, self.indptr, self.cols, self.vals, self.ticks = heads, indptr, cols, vals, ticks
        self.stacks: dict[str, Any] = {}
        #: bytes of the prepared stacks' row pointers (crow and tcrow: 2 x 8 x (N+1) per device) and of member
        self.ptr_bytes = 0
        #: (N,) bool, ``member[h]`` iff ``h`` in heads: built with the first prepared stack, it answers "does
        #: the set hold every active head of this batch" as one vectorised pass over a mask, without the
        #: ``searchsorted`` of up to N heads per relation (a quarter of a warm multi-hop batch)
        self.member: np.ndarray | None = None
        #: (N+1,) int64, built with ``member``: row ``h`` (a member) is ``cols[entity_ptr[h]:entity_ptr[h+1]]``,
        #: so a warm one-row read is two array reads instead of a ``searchsorted``
        self.entity_ptr: np.ndarray | None = None
        #: the last request that used the whole set (a warm hit sets this instead of every row's tick)
        self.touched = 0

    @classmethod
    def empty(cls) -> "_RowSet":
        return cls(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32),
                   np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.heads)

    @property
    def nbytes(self) -> int:
        return _ENTRY_BYTES * len(self.cols) + _ROW_OVERHEAD * len(self.heads) + self.ptr_bytes

    def find(self, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pos, found)`` of sorted unique ``heads``: ``self.heads[pos[found]] == heads[found]``."""
        pos = np.searchsorted(self.heads, heads)
        found = np.zeros(len(heads), dtype=bool)
        inside = pos < len(self.heads)
        found[inside] = self.heads[pos[inside]] == heads[inside]
        return pos, found

    def subset(self, pos: np.ndarray) -> "_RowSet":
        ptr, cols, vals = take_rows(self.indptr, self.cols, self.vals, pos)
        return _RowSet(self.heads[pos], ptr, cols, vals, self.ticks[pos])

    @staticmethod
    def merge(a: "_RowSet", b: "_RowSet") -> "_RowSet":
        """The rows of ``a`` and ``b`` (disjoint heads) in one set, heads ascending."""
        if not len(a):
            return b
        if not len(b):
            return a
        heads = np.concatenate([a.heads, b.heads])
        order = np.argsort(heads, kind="stable")
        ptr, cols, vals = take_rows(*concat_rows([(a.indptr, a.cols, a.vals), (b.indptr, b.cols, b.vals)]), order)
        return _RowSet(heads[order], ptr, cols, vals, np.concatenate([a.ticks, b.ticks])[order])

    def stack(self, n: int, device: Any) -> tuple[Any, int]:
        """The set as a one-relation ``ops.StackedMatrices`` (N, N) on ``device`` (rows of other heads empty),
        and the bytes preparing it added now (its row pointers; 0 when it was prepared before)."""
        key = str(device)
        hit = self.stacks.get(key)
        if hit is not None:
            return hit, 0
        hit = self.stacks[key] = compact_stack(n, [self.heads], self.indptr, self.cols, self.vals, device)
        added = 2 * 8 * (n + 1)
        self.ptr_bytes += added
        return hit, added + self.index(n)

    def index(self, n: int) -> int:
        """Build :attr:`member` and :attr:`entity_ptr` (once); the bytes that added (0 when built before)."""
        if self.member is not None:
            return 0
        self.member = np.zeros(n, dtype=bool)
        self.member[self.heads] = True
        counts = np.zeros(n, dtype=np.int64)
        counts[self.heads] = np.diff(self.indptr)
        self.entity_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=self.entity_ptr[1:])
        added = n + 8 * (n + 1)
        self.ptr_bytes += added
        return added


def compact_stack(n: int, heads: list[np.ndarray], indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                  device: Any) -> Any:
    """An ``ops.StackedMatrices`` of ``len(heads)`` relations (``(len(heads)*N, N)``) on ``device``.

    Relation ``k`` holds the rows ``heads[k]`` (ascending), whose entries are the CSR pieces
    ``(indptr, cols, vals)`` in order (all of relation 0's rows, then relation 1's, ...);
    every other row is empty.  Built with one vectorised pass and the stack's transpose.
    """
    import torch

    import ops

    r = len(heads)
    counts = np.zeros(r * n, dtype=np.int64)
    if r:
        local = np.concatenate([k * n + h for k, h in enumerate(heads)])
        counts[local] = np.diff(indptr)
    crow = np.zeros(r * n + 1, dtype=np.int64)
    np.cumsum(counts, out=crow[1:])
    return ops.prepare_matrices((torch.from_numpy(crow), torch.from_numpy(cols), torch.from_numpy(vals)),
                                num_entities=n, device=device, name="lazy rows")


class RowCache:
    """Calibrated rows by relation, bounded in bytes, least recently used rows evicted first.

    Per relation, one merged :class:`_RowSet` (heads ascending; prepared once as the
    stack a projection reads) and one pending set of rows computed since the last merge
    (see :data:`_MERGE_RATIO`).  A row costs ``16 x entries + 32`` bytes (:meth:`row_bytes`:
    the entries twice, as rows and in the prepared transpose), a prepared set ``16 x (N+1)`` more
    (its two row-pointer arrays, per device).  Every lookup is vectorised
    over the heads asked (``np.searchsorted``), so a request of thousands of rows costs no
    Python loop per row.  When an insert takes the total past ``max_bytes``, whole relation
    sets go, least recently used first, until at most 90% of the budget is used, which may
    evict everything, the rows just added included: callers take what they need out of the
    cache first.
    """

    def __init__(self, *, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise UserError(f"row cache budget must be > 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._main: dict[int, _RowSet] = {}
        self._pending: dict[int, _RowSet] = {}
        self.bytes = 0
        self.evictions = 0
        self._tick = 0

    def __len__(self) -> int:
        return sum(len(s) for s in self._main.values()) + sum(len(s) for s in self._pending.values())

    def __contains__(self, key: tuple[int, int]) -> bool:
        r, h = key
        heads = np.array([h], dtype=np.int64)
        return any(s.find(heads)[1][0] for s in (self._main.get(r), self._pending.get(r)) if s is not None)

    @staticmethod
    def row_bytes(cols: np.ndarray, vals: np.ndarray) -> int:
        """Bytes one cached row of ``len(cols)`` entries is counted as."""
        return _ENTRY_BYTES * len(cols) + _ROW_OVERHEAD

    def next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def main(self, r: int) -> _RowSet | None:
        return self._main.get(r)

    @property
    def merged(self) -> dict[int, _RowSet]:
        """Relation -> its merged set (read-only use: a warm read goes through it without a call per row)."""
        return self._main

    def lookup(self, r: int, heads: np.ndarray, tick: int) -> tuple[_RowSet, np.ndarray]:
        """The cached rows of sorted unique ``heads`` of relation ``r``: ``(rows, missing heads)``.

        ``rows`` holds the found heads in order (a subset of the cache's sets: copies); their
        tick becomes ``tick``.
        """
        parts, missing, hit_pending = [], heads, False
        for s in (self._main.get(r), self._pending.get(r)):
            if s is None or not len(missing):
                continue
            pos, found = s.find(missing)
            if found.any():
                s.ticks[pos[found]] = tick
                parts.append(s.subset(pos[found]))
                hit_pending = s is self._pending.get(r)
            missing = missing[~found]
        if hit_pending:
            # pending rows asked again: merge them now, so that the next request is warm
            self._set(r, _RowSet.merge(self._main.get(r, _RowSet.empty()), self._pending[r]), None)
        rows = _RowSet.empty()
        for p in parts:
            rows = _RowSet.merge(rows, p)
        return rows, missing

    def insert(self, r: int, rows: _RowSet) -> None:
        """Add fresh rows of relation ``r`` (heads not cached), then evict if over budget."""
        if not len(rows):
            return
        pend = _RowSet.merge(self._pending.get(r, _RowSet.empty()), rows)
        main = self._main.get(r)
        if main is None or len(pend.cols) >= _MERGE_RATIO * len(main.cols):
            self._set(r, pend if main is None else _RowSet.merge(main, pend), None)
        else:
            self._set(r, main, pend)
        if self.bytes > self.max_bytes:
            self._evict()

    def _set(self, r: int, main: _RowSet | None, pending: _RowSet | None) -> None:
        """Relation ``r``'s sets become ``main`` and ``pending`` (None: none), the byte count following (a merged
        set is new: its former sets' prepared stacks go with them)."""
        for d, new in ((self._main, main), (self._pending, pending)):
            old = d.pop(r, None)
            if old is not None:
                self.bytes -= old.nbytes
            if new is not None:
                d[r] = new
                self.bytes += new.nbytes

    def indexed(self, r: int, rows: _RowSet, n: int) -> _RowSet:
        """``rows`` with its :meth:`_RowSet.index` built, counted in the budget when it is relation ``r``'s merged
        set (evicting if that passes it: the caller holds ``rows``)."""
        self._charge(r, rows, rows.index(n))
        return rows

    def prepared(self, r: int, rows: _RowSet, n: int, device: Any) -> Any:
        """``rows.stack(n, device)``; when ``rows`` is relation ``r``'s cached merged set, the row pointers that
        preparing it allocated count in the budget (2 x 8 x (N+1) bytes per device: 16 MB per relation set at a
        million entities), evicting if that passes it."""
        stack, added = rows.stack(n, device)
        self._charge(r, rows, added)
        return stack

    def _charge(self, r: int, rows: _RowSet, added: int) -> None:
        """Count ``added`` bytes that ``rows`` grew by when it is relation ``r``'s merged set; evict if over budget."""
        if added and self._main.get(r) is rows:
            self.bytes += added
            if self.bytes > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        # Whole relation sets go, least recently used first: a batch reads a relation's rows together,
        # and dropping a few rows of a set would force its prepared stack (and transpose) to be rebuilt
        # on its next use -- row-level LRU rebuilt every set of a batch larger than the budget per call.
        sets = [(max(s.touched, int(s.ticks.max()) if len(s) else 0), d is self._pending, r, s)
                for d in (self._main, self._pending) for r, s in d.items()]
        sets.sort(key=lambda t: (t[0], t[1], t[2]))
        target = _EVICT_TO * self.max_bytes
        for _, pending, r, s in sets:
            if self.bytes <= target:
                break
            d = self._pending if pending else self._main
            del d[r]
            self.bytes -= s.nbytes
            self.evictions += len(s)

    def clear(self) -> None:
        self._main.clear()
        self._pending.clear()
        self.bytes = 0


def _heads(heads: np.ndarray) -> np.ndarray:
    """Sorted unique head ids from ids or an (N,) bool mask."""
    return np.flatnonzero(heads) if heads.dtype == bool else heads


@dataclass
class LazyStats:
    """Counters of a :class:`LazyMatrices` (shared by its device twins): rows served from the cache, read
    from the persisted store, computed (and the matmul passes and seconds that took)."""

    requests: int = 0
    rows_requested: int = 0
    cache_hits: int = 0
    #: rows read from the persisted row store (:mod:`kge.rowstore`) instead of computed
    disk_hits: int = 0
    rows_computed: int = 0
    passes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class LazyMatrices:
    """The stacked ``(R*N, N)`` calibrated matrix of a lazy artifact, computed row by row on demand.

    Args:
        entity: (N, d) complex entity embeddings.
        relation: (R, d) complex relation embeddings.
        observed: (E, 3) int ``(h, r, t)`` edges (exactly 1.0, and counted in ``max(1, #tails)``).
        threshold, delta: the calibration's (as in :func:`kge.calibrate.calibrate`).
        row_cache_gb: byte budget of the row cache in GiB (finite, > 0).
        device: where rows are computed (``"cpu"``, ``"cuda"``, ``"cuda:N"``); the cache and the
            returned rows live on the host.
        chunk_rows: rows per matmul (default: :func:`kge.calibrate.default_chunk_rows`).
    """

    def __init__(self, *, entity: np.ndarray, relation: np.ndarray, observed: np.ndarray,
                 threshold: float = DEFAULT_THRESHOLD, delta: float = DEFAULT_DELTA,
                 row_cache_gb: float = DEFAULT_ROW_CACHE_GB, device: str = "cpu",
                 chunk_rows: int | None = None, row_store_gb: float = DEFAULT_ROW_STORE_GB) -> None:
        entity = np.asarray(entity)
        relation = np.asarray(relation)
        if entity.ndim != 2 or relation.ndim != 2 or entity.shape[1] != relation.shape[1]:
            raise UserError(f"lazy matrices: embeddings of shape {entity.shape}/{relation.shape} do not fit "
                            "(expected entity (N, d) and relation (R, d))")
        self.row_cache_gb = check_row_cache_gb(row_cache_gb)
        self.row_store_gb = check_row_store_gb(row_store_gb, "row_store_gb")
        self.entity = entity
        self.relation = relation
        self.observed = np.asarray(observed, dtype=np.int64).reshape(-1, 3)
        self.threshold = float(threshold)
        self.delta = float(delta)
        self.chunk_rows = chunk_rows
        self._calib = RowCalibrator(entity, relation, self.observed, threshold=threshold, delta=delta,
                                    device=device, chunk_rows=chunk_rows)
        self.device = self._calib.device
        self.cache = RowCache(max_bytes=max(1, int(self.row_cache_gb * (1 << 30))))
        self.stats = LazyStats()
        #: the persisted row store per device kind, opened on the first miss (shared by device twins)
        self._stores: dict[str, Any] = {}

    # ------------------------------------------------------------------ shape
    @property
    def num_entities(self) -> int:
        return self._calib.num_entities

    @property
    def num_relations(self) -> int:
        return self._calib.num_relations

    @property
    def shape(self) -> tuple[int, int]:
        """``(R*N, N)``, the shape of the eager stack this object stands for."""
        return (self.num_relations * self.num_entities, self.num_entities)

    def on(self, device: str) -> "LazyMatrices":
        """A twin computing on ``device`` that shares this one's cache and counters (``self`` if already there)."""
        import torch

        if torch.device(device) == torch.device(self.device):
            return self
        twin = object.__new__(LazyMatrices)
        twin.__dict__.update(self.__dict__)
        twin._calib = RowCalibrator(self.entity, self.relation, self.observed, threshold=self.threshold,
                                    delta=self.delta, device=str(device), chunk_rows=self.chunk_rows)
        twin.device = twin._calib.device
        return twin

    def __repr__(self) -> str:
        return (f"LazyMatrices(n={self.num_entities}, num_relations={self.num_relations}, threshold={self.threshold:g}, "
                f"delta={self.delta:g}, device={self.device}, cached_rows={len(self.cache)}, "
                f"cache_bytes={self.cache.bytes}/{self.cache.max_bytes})")

    # ------------------------------------------------------------------ rows
    def _check_keys(self, keys: np.ndarray) -> None:
        if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= self.shape[0]):
            raise IndexError(f"row key out of range [0, {self.shape[0]})")

    def rows(self, keys: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``keys`` (flattened ``r*N + h``) as CSR pieces, in the order given.

        Returns ``(indptr int64 (len(keys)+1,), cols int32 (nnz,), vals float32 (nnz,))``.
        Cached rows are reused; the missing ones are computed in one pass of
        chunked matmuls and then cached (evicting least recently used rows).
        """
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        # the warm path first: a key it serves is in range (only relations [0, R) are cached, and the head is
        # key mod N), so the range check (two passes over the keys) is only paid by requests that compute
        warm = self._warm_rows(keys)
        if warm is not None:
            return warm
        self._check_keys(keys)
        n = self.num_entities
        uniq, inv = np.unique(keys, return_inverse=True)
        groups = [g for g in np.split(uniq, np.flatnonzero(np.diff(uniq // n)) + 1) if len(g)]
        sets = self._row_sets([(int(g[0] // n), g % n) for g in groups], warm=False)
        self.stats.rows_requested += len(keys) - len(uniq)  # _row_sets counted the distinct keys
        return take_rows(*concat_rows([(rows.indptr, rows.cols, rows.vals) for rows, _ in sets]), inv.reshape(-1))

    def _warm_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`rows` when every key's row is in its relation's merged cached set, prepared (else ``None``):
        no lookup, subset copy or merge per relation, no sort of the keys.

        An anchor projection asks for one row per query (``ops.project`` of a one-hot batch reads
        nothing else); through :meth:`_row_sets` a warm batch of 16 such rows over 16 relations
        cost 5x the eager kernel call it stands for.  Up to :data:`_SLICE_ROWS` keys, each row is
        one slice of its set, found by two reads of the set's ``entity_ptr`` where that index is
        built, else by a binary search of its heads (the O(N) index is not built for a few rows: on
        the first reuse of a query's rows it cost a single FB15k-237 query 60-160 us, a third of
        the eager query); beyond, one gather per relation.
        """
        if not len(keys):
            return None
        n = self.num_entities
        merged = self.cache.merged
        if len(keys) <= _SLICE_ROWS:
            pieces = []
            for key in keys.tolist():
                r, h = divmod(key, n)
                main = merged.get(r)
                if main is None:
                    return None
                ptr = main.entity_ptr
                if ptr is not None:
                    if not main.member[h]:  # type: ignore[index]  # built with entity_ptr
                        return None
                    pieces.append((main, int(ptr[h]), int(ptr[h + 1])))
                    continue
                heads = main.heads
                pos = int(heads.searchsorted(h))
                if pos == len(heads) or heads[pos] != h:
                    return None
                pieces.append((main, int(main.indptr[pos]), int(main.indptr[pos + 1])))
            tick = self._count_warm(len(keys))
            for main, _, _ in pieces:
                main.touched = tick
            if len(pieces) == 1:  # one query's anchor: its row as it is cached (copies: callers own the arrays)
                main, b, e = pieces[0]
                return np.array([0, e - b], dtype=np.int64), main.cols[b:e].copy(), main.vals[b:e].copy()
            indptr = np.zeros(len(keys) + 1, dtype=np.int64)
            np.cumsum([e - b for _, b, e in pieces], out=indptr[1:])
            return (indptr, np.concatenate([m.cols[b:e] for m, b, e in pieces]),
                    np.concatenate([m.vals[b:e] for m, b, e in pieces]))
        rels = keys // n
        heads = keys - rels * n
        found = []
        for r in np.unique(rels).tolist():
            main = merged.get(int(r))
            if main is None:
                return None
            sel = np.flatnonzero(rels == r)
            member, ptr = self._index_of(int(r), main)
            if not bool(member[heads[sel]].all()):
                return None
            found.append((sel, main, ptr))
        tick = self._count_warm(len(keys))
        for _, main, _ in found:
            main.touched = tick
        # each relation's rows, then back into the order of keys
        order = np.empty(len(keys), dtype=np.int64)
        order[np.concatenate([sel for sel, _, _ in found])] = np.arange(len(keys))
        parts = [take_rows(ptr, main.cols, main.vals, heads[sel]) for sel, main, ptr in found]
        return take_rows(*concat_rows(parts), order)

    def _index_of(self, r: int, main: _RowSet) -> tuple[np.ndarray, np.ndarray]:
        """``(member, entity_ptr)`` of relation ``r``'s merged set ``main`` (built on first use, counted)."""
        if main.member is None:
            self.cache.indexed(r, main, self.num_entities)
        assert main.member is not None and main.entity_ptr is not None
        return main.member, main.entity_ptr

    def _count_warm(self, rows: int) -> int:
        """Count a request of ``rows`` rows all served from the merged sets; its tick."""
        st = self.stats
        st.requests += 1
        st.rows_requested += rows
        st.cache_hits += rows
        return self.cache.next_tick()

    def stacks(self, wanted: Sequence[tuple[int, np.ndarray]], device: Any) -> list[Any]:
        """Per ``(r, heads)`` of ``wanted``, a one-relation ``ops.StackedMatrices`` (N, N) on ``device`` holding
        (at least) the rows ``heads`` of ``M_r``: sorted, unique entity ids, or an (N,) bool mask of them.

        Rows of other heads are empty or other cached rows of ``M_r`` (a projection multiplies
        them by a zero input).  Warm path: when the relation's merged cached set holds every
        head, its prepared stack is returned as it is (no copy, no transpose).  Otherwise the
        missing rows of all of ``wanted`` are computed in one chunked pass, cached, and the
        rows gathered into a compact stack (or, when the new rows were merged into the
        relation's set, that set's stack).
        """
        n = self.num_entities
        out = []
        sets = self._row_sets(wanted, warm=True)
        for (r, heads), (rows, how) in zip(wanted, sets):
            main = self.cache.main(int(r)) if how != "warm" else None
            if how == "warm":  # the relation's merged set (held here even if an insert evicted it since)
                out.append(self.cache.prepared(int(r), rows, n, device))
            elif main is not None and main.find(_heads(heads))[1].all():  # new or pending rows were merged into it
                out.append(self.cache.prepared(int(r), main, n, device))
            else:
                out.append(compact_stack(n, [rows.heads], rows.indptr, rows.cols, rows.vals, device))
        return out

    def _row_sets(self, wanted: Sequence[tuple[int, np.ndarray]], *, warm: bool) -> list[tuple[_RowSet, str]]:
        """Per ``(r, heads)``: ``(rows, how)``: the rows ``heads`` (sorted, unique; or an (N,) bool mask) of
        ``M_r`` as one :class:`_RowSet` (exactly those rows, heads ascending) and ``how`` = ``"cached"`` or
        ``"computed"`` (some computed now); with ``warm``, ``(set, "warm")`` where the relation's merged cached
        set holds every head: that set itself, with its other rows.

        Every missing row of ``wanted`` is computed in one chunked pass, then cached; rows are
        handed out before the insert, so an eviction it triggers cannot take a needed row.
        """
        st, cache = self.stats, self.cache
        tick = cache.next_tick()
        st.requests += 1
        found: list[tuple[_RowSet, str]] = []
        missing: list[np.ndarray] = []
        for r, heads in wanted:
            main = cache.main(int(r)) if warm else None
            if heads.dtype == bool:
                count = int(np.count_nonzero(heads))
                if main is not None and main.member is not None and not bool((heads > main.member).any()):
                    st.rows_requested += count
                    st.cache_hits += count
                    main.touched = tick
                    found.append((main, "warm"))
                    missing.append(np.zeros(0, np.int64))
                    continue
                heads = np.flatnonzero(heads)
            st.rows_requested += len(heads)
            if main is not None:
                pos, hit = main.find(heads)
                if hit.all():
                    main.ticks[pos] = tick
                    st.cache_hits += len(heads)
                    found.append((main, "warm"))
                    missing.append(heads[:0])
                    continue
            rows, miss = cache.lookup(int(r), heads, tick)
            st.cache_hits += len(heads) - len(miss)
            found.append((rows, "cached"))
            missing.append(miss)
        n = self.num_entities
        keys = np.concatenate([int(r) * n + m for (r, _), m in zip(wanted, missing)]) if wanted else np.zeros(0, np.int64)
        if not len(keys):
            return found
        indptr, cols, vals = self._fetch(keys)
        out: list[tuple[_RowSet, str]] = []
        fresh_sets = []
        lo = 0
        for (r, _), (rows, how), miss in zip(wanted, found, missing):
            if not len(miss):
                out.append((rows, how))
                continue
            a, b = int(indptr[lo]), int(indptr[lo + len(miss)])
            # copies: views would keep the whole pass's arrays alive in the cache
            fresh = _RowSet(miss.copy(), indptr[lo : lo + len(miss) + 1] - a, cols[a:b].copy(), vals[a:b].copy(),
                            np.full(len(miss), tick, dtype=np.int64))
            lo += len(miss)
            fresh_sets.append((int(r), fresh))
            out.append((_RowSet.merge(rows, fresh), "computed"))
        for r, fresh in fresh_sets:
            cache.insert(r, fresh)
        return out

    def _store(self) -> Any:
        """The persisted row store of this device kind (opened on first use), or ``None`` when off."""
        if self.row_store_gb <= 0:
            return None
        import torch

        kind = torch.device(self.device).type
        if kind not in self._stores:
            from .rowstore import RowStore, default_store_folder, row_fingerprint

            # GPU GEMMs sum in another order than the CPU's: their rows are kept apart
            fp = row_fingerprint(self.entity, self.relation, self.observed, threshold=self.threshold, delta=self.delta,
                                 variant="" if kind == "cpu" else kind)
            self._stores[kind] = RowStore.open(default_store_folder(fp), fingerprint=fp,
                                               num_entities=self.num_entities, num_relations=self.num_relations,
                                               max_bytes=int(self.row_store_gb * (1 << 30)))
        return self._stores[kind]

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``keys`` (distinct; in order) as CSR pieces: read from the persisted store where it holds them,
        computed (and handed to the store, written in the background) otherwise."""
        store = self._store()
        if store is None:
            return self._compute(keys)
        found, ptr, cols, vals = store.lookup(keys)
        hits = int(found.sum())
        self.stats.disk_hits += hits
        if hits == len(keys):
            return ptr, cols, vals
        miss = keys[~found]
        cptr, ccols, cvals = self._compute(miss)
        store.append(miss, cptr, ccols, cvals, wait=False)
        if not hits:
            return cptr, ccols, cvals
        # stored rows first, then computed ones: put them back in the order of keys
        order = np.argsort(np.concatenate([np.flatnonzero(found), np.flatnonzero(~found)]), kind="stable")
        return take_rows(*concat_rows([(ptr, cols, vals), (cptr, ccols, cvals)]), order)

    def _compute(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Calibrated rows ``keys`` (in order) by chunked matmuls, as CSR pieces ``(indptr, cols, vals)``."""
        t0 = time.perf_counter()
        step = self._calib.chunk_rows
        nnz, cols, vals = [], [], []
        for a in range(0, len(keys), step):
            row_nnz, c, v = self._calib.compute(keys[a : a + step])
            nnz.append(np.asarray(row_nnz, dtype=np.int64))
            cols.append(c)
            vals.append(v)
            self.stats.passes += 1
        indptr = np.zeros(len(keys) + 1, dtype=np.int64)
        if nnz:
            np.cumsum(np.concatenate(nnz), out=indptr[1:])
        self.stats.rows_computed += len(keys)
        self.stats.seconds += time.perf_counter() - t0
        if len(cols) == 1:  # one chunk: its arrays as they are (the calibrator returns fresh ones)
            return indptr, cols[0], vals[0]
        return (indptr, np.concatenate(cols) if cols else np.zeros(0, np.int32),
                np.concatenate(vals) if vals else np.zeros(0, np.float32))

    def row(self, r: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        """``M_r[h, :]`` as ``(cols int32, vals float32)`` (through the cache)."""
        _, cols, vals = self.rows([int(r) * self.num_entities + int(h)])
        return cols, vals

    # ------------------------------------------------------------------ whole relations
    def estimate_seconds(self, rows: int, gflops: float = 20.0) -> float:
        """Rough time to compute ``rows`` rows at ``gflops`` GFLOP/s of useful matmul."""
        return self._calib.matmul_flops(rows) / (gflops * 1e9)

    def relation_block(self, r: int, *, progress: bool = False) -> sp.csr_matrix:
        """All of ``M_r`` (N, N) as a scipy CSR, computed now (``N`` rows; not put in the row cache).

        For whole-relation consumers.  Costs ``N`` rows (see :meth:`estimate_seconds`).
        """
        if not 0 <= int(r) < self.num_relations:
            raise IndexError(f"relation id {r} out of range [0, {self.num_relations})")
        n = self.num_entities
        keys = np.arange(int(r) * n, (int(r) + 1) * n, dtype=np.int64)
        row_nnz, cols, vals = self._compute_uncached(keys, progress=progress, desc=f"relation {r}")
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(row_nnz, out=indptr[1:])
        m = sp.csr_matrix((vals, cols, indptr), shape=(n, n), copy=False)
        m.has_sorted_indices = True
        return m

    def _compute_uncached(self, keys: np.ndarray, *, progress: bool, desc: str):
        from kgreason.progress import progress_bar

        t0 = time.perf_counter()
        step = self._calib.chunk_rows
        parts = []
        with progress_bar(total=len(keys), unit="row", unit_scale=True, desc=desc, disable=not progress,
                  mininterval=1.0) as bar:
            for a in range(0, len(keys), step):
                parts.append(self._calib.compute(keys[a : a + step]))
                bar.update(len(keys[a : a + step]))
                self.stats.passes += 1
        self.stats.rows_computed += len(keys)
        self.stats.seconds += time.perf_counter() - t0
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts]))

    def materialize(self, *, max_matrix_gb: float | None = None, progress: bool = True) -> sp.csr_matrix:
        """The whole stack ``(R*N, N)`` as the eager build computes it (:func:`kge.calibrate.calibrate`).

        ``max_matrix_gb`` (8 bytes per entry) stops the computation with a
        :class:`UserError` as soon as the entries kept so far project past it.
        """
        from .calibrate import calibrate

        max_nnz = None if max_matrix_gb is None else int(max_matrix_gb * (1 << 30) / 8)
        try:
            mat, _ = calibrate(self.entity, self.relation, self.observed, threshold=self.threshold, delta=self.delta,
                               chunk_rows=self.chunk_rows, device=self.device, progress=progress, max_nnz=max_nnz)
        except UserError as exc:
            raise UserError(f"materializing lazy matrices: {exc}") from None
        return mat
