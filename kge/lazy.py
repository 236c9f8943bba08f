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
* kept in a byte-budget LRU cache (:class:`RowCache`, ``--row-cache-gb``).
  Rows a request needs are copied out before anything is evicted, so a
  budget smaller than one request's rows only costs recomputation, never
  correctness.

Projections read them through :class:`kge.rows.LazyRows` (``artifact.relation_rows()``):
per block of a batch, the rows ``(r, h)`` of the active entities ``h`` (nonzero
inputs), as the compact stack :meth:`LazyMatrices.stacked` builds; rows of
inactive heads are multiplied by 0 in both plain and negated projection, so
leaving them out changes no score and no argmax.  Whole relations
(:meth:`LazyMatrices.relation_block`) and the whole stack
(:meth:`LazyMatrices.materialize`) can be computed explicitly, with a size
check (they cost ``N`` resp. ``R*N`` rows).
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from kgreason.errors import UserError

from .calibrate import DEFAULT_DELTA, DEFAULT_THRESHOLD, RowCalibrator

__all__ = ["LazyMatrices", "RowCache", "LazyStats", "check_row_cache_gb", "DEFAULT_ROW_CACHE_GB", "MATRIX_MODES"]

#: Default byte budget of the row cache, in GiB.
DEFAULT_ROW_CACHE_GB = 1.0
#: Values of ``--matrices`` (``meta.json["matrices"]`` holds "eager" or "lazy").
MATRIX_MODES = ("eager", "lazy", "auto")
#: Bytes a cached row costs besides its entries (two numpy headers, a tuple, the dict slot), measured
#: with sys.getsizeof on CPython 3.11; counted so that a cache of many short rows stays in budget.
_ROW_OVERHEAD = 400


def check_row_cache_gb(value: Any, option: str = "--row-cache-gb") -> float:
    """``value`` as a cache budget in GiB (a finite number > 0); else a one-line :class:`UserError` naming ``option``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{option} must be a number of GiB > 0, got {value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise UserError(f"{option} must be a finite number of GiB > 0, got {value}")
    return v


class RowCache:
    """LRU cache of calibrated rows by flattened key ``r*N + h``, bounded in bytes.

    Values are ``(cols int32, vals float32)`` numpy arrays.  :meth:`put` evicts
    least recently used rows until the total is within ``max_bytes``, which may
    evict everything, the row just added included.
    """

    def __init__(self, *, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise UserError(f"row cache budget must be > 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._rows: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: int) -> bool:
        return key in self._rows

    @staticmethod
    def row_bytes(cols: np.ndarray, vals: np.ndarray) -> int:
        return int(cols.nbytes + vals.nbytes + _ROW_OVERHEAD)

    def get(self, key: int) -> tuple[np.ndarray, np.ndarray] | None:
        hit = self._rows.get(key)
        if hit is not None:
            self._rows.move_to_end(key)
        return hit

    def put(self, key: int, cols: np.ndarray, vals: np.ndarray) -> None:
        old = self._rows.pop(key, None)
        if old is not None:
            self.bytes -= self.row_bytes(*old)
        self._rows[key] = (cols, vals)
        self.bytes += self.row_bytes(cols, vals)
        while self.bytes > self.max_bytes and self._rows:
            _, (c, v) = self._rows.popitem(last=False)
            self.bytes -= self.row_bytes(c, v)
            self.evictions += 1

    def clear(self) -> None:
        self._rows.clear()
        self.bytes = 0


@dataclass
class LazyStats:
    """Counters of a :class:`LazyMatrices` (shared by its device twins): rows served from the cache,
    rows computed (and the matmul passes and seconds that took), rows evicted."""

    requests: int = 0
    rows_requested: int = 0
    cache_hits: int = 0
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
                 chunk_rows: int | None = None) -> None:
        entity = np.asarray(entity)
        relation = np.asarray(relation)
        if entity.ndim != 2 or relation.ndim != 2 or entity.shape[1] != relation.shape[1]:
            raise UserError(f"lazy matrices: embeddings of shape {entity.shape}/{relation.shape} do not fit "
                            "(expected entity (N, d) and relation (R, d))")
        self.row_cache_gb = check_row_cache_gb(row_cache_gb)
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
        self._check_keys(keys)
        st = self.stats
        st.requests += 1
        st.rows_requested += len(keys)
        got: list[tuple[np.ndarray, np.ndarray] | None] = [self.cache.get(int(k)) for k in keys.tolist()]
        missing_pos = [i for i, g in enumerate(got) if g is None]
        st.cache_hits += len(keys) - len(missing_pos)
        if missing_pos:
            miss_keys = np.unique(keys[missing_pos])  # a key asked twice is computed once
            fresh = self._compute(miss_keys)
            for i in missing_pos:
                got[i] = fresh[int(keys[i])]
            # Into the cache only after every needed row is in hand: eviction cannot lose one.
            for k in miss_keys.tolist():
                self.cache.put(k, *fresh[k])
        lens = np.fromiter((len(g[0]) for g in got), dtype=np.int64, count=len(got))  # type: ignore[index]
        indptr = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        if len(got):
            cols = np.concatenate([g[0] for g in got])  # type: ignore[index]
            vals = np.concatenate([g[1] for g in got])  # type: ignore[index]
        else:
            cols, vals = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        return indptr, cols, vals

    def _compute(self, keys: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Calibrated rows ``keys`` (sorted, unique) by chunked matmuls: key -> (cols, vals)."""
        t0 = time.perf_counter()
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        step = self._calib.chunk_rows
        for a in range(0, len(keys), step):
            part = keys[a : a + step]
            row_nnz, cols, vals = self._calib.compute(part)
            bounds = np.zeros(len(part) + 1, dtype=np.int64)
            np.cumsum(row_nnz, out=bounds[1:])
            for j, k in enumerate(part.tolist()):
                lo, hi = int(bounds[j]), int(bounds[j + 1])
                # copies: a view would keep the whole chunk's arrays alive in the cache
                out[k] = (cols[lo:hi].copy(), vals[lo:hi].copy())
            self.stats.passes += 1
        self.stats.rows_computed += len(keys)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def row(self, r: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        """``M_r[h, :]`` as ``(cols int32, vals float32)`` (through the cache)."""
        _, cols, vals = self.rows([int(r) * self.num_entities + int(h)])
        return cols, vals

    def stacked(self, relations: Sequence[int], heads: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A compact stack ``(len(relations)*N, N)`` holding only the rows ``heads[k]`` of ``relations[k]``.

        Row ``k*N + h`` is ``M_{relations[k]}[h, :]`` for ``h`` in ``heads[k]`` (sorted,
        unique) and empty otherwise.  Returns ``(crow int64, col int32, val float32)``,
        what ``ops.prepare_matrices`` takes with ``num_entities=N``: project rows with
        local relation ids ``k`` whose nonzero inputs all lie in ``heads[k]``.
        """
        n = self.num_entities
        keys = np.concatenate([int(r) * n + np.asarray(h, dtype=np.int64) for r, h in zip(relations, heads)]) \
            if len(relations) else np.zeros(0, dtype=np.int64)
        local = np.concatenate([k * n + np.asarray(h, dtype=np.int64) for k, h in enumerate(heads)]) \
            if len(relations) else np.zeros(0, dtype=np.int64)
        indptr, cols, vals = self.rows(keys)
        counts = np.zeros(len(relations) * n, dtype=np.int64)
        counts[local] = np.diff(indptr)
        crow = np.zeros(len(relations) * n + 1, dtype=np.int64)
        np.cumsum(counts, out=crow[1:])
        return crow, cols, vals  # rows come in `local` order, which is ascending: the stack's own order

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
