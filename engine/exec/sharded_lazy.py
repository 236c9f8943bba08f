"""Lazy calibrated rows, sharded: each rank computes only its columns of a row (docs/distributed.md).

A lazy artifact's row ``M_r[h, :]`` is ``softmax(s) * max(1, #known tails)`` thresholded and
capped, known edges exactly 1 (:mod:`kge.calibrate`), with scores ``s_t = Re(e_h w_r conj(e_t))``
over ALL N tails.  Rank k holds the tail embeddings of its block ``[lo, hi)`` and the known edges
whose tail is there (:class:`kge.sharding.LazyShard`), so it computes the scores of its columns
only, a ``(c, 2d) @ (2d, N_k)`` GEMM.  What the row's other columns contribute is its softmax
normaliser and its count of known tails: per row, each rank's ``(max m_k, sum_t exp(s_t - m_k),
known tails here)``, one all-gather for every row a hop needs (batched), merged as a log-sum-exp
(``M = max m_k``, ``Z = sum z_k exp(m_k - M)`` in float64).  Then the row's entries on this rank are
``exp(s - M) * (k / Z)`` in float32, known edges 1.0, kept where ``>= threshold``, capped at
``1 - delta``: the single-process formula (:func:`ops.calibrate_rows`), so a sharded row equals the
single-process row to float32 rounding (the sums run in another order).

The per-block statistics and the entries are the two halves of the single-process kernel
(:func:`ops.calibrate_row_stats`, :func:`ops.calibrate_rows_normalised`: one fused pass each over a chunk's scores,
summed as :func:`ops.calibrate_rows` sums); a chunk's scores are computed once and kept from the statistics to the
entries while the exchange's kept chunks fit ``_KEEP_SCORES_BYTES`` (the chunks beyond are recomputed).

Every rank keeps the normalisers of the rows it has seen (:class:`LazyShardRows`: 24 bytes a row with its last
use, the same table on every rank, since all ranks ask for the same rows in the same order: that is what
decides, identically everywhere, which rows need the exchange).  The table is bounded
(``max_normalisers``, default :data:`DEFAULT_MAX_NORMALISERS` or ``KGREASON_LAZY_MAX_NORMALISERS``): at the
start of each batch (:meth:`LazyShardRows.begin_batch`, every rank at the same point) it keeps the rows used
most recently and forgets the rest, which a later request normalises again (one more exchange, the same
values); rows of the running batch are never forgotten (the backward pass reads them without an exchange), so
the table holds at most ``max_normalisers`` + one batch's rows.  The rows' entries go to a per-rank
byte-budgeted :class:`kge.lazy.RowCache`; a row it evicted is recomputed from its normaliser by its own rank
alone, with no exchange (so the ranks' caches may differ).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

import ops
from kge.calibrate import _MIN_GEMM_COLS, _MIN_GEMM_ROWS, rows_observed_tails
from kge.lazy import DEFAULT_ROW_CACHE_GB, RowCache, _RowSet, check_row_cache_gb, take_rows
from kge.sharding import LazyShard
from kgreason.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from engine.exec.sharded import _RelBlock
    from engine.exec.sharded_comm import Comm

__all__ = ["LazyShardRows", "DEFAULT_MAX_NORMALISERS", "MAX_NORMALISERS_ENV", "max_normalisers_from_env"]

#: Scores of one exchange's chunks held at once (kept from the statistics to the entries); the chunks beyond are
#: computed again.
_KEEP_SCORES_BYTES = 256 << 20
#: Rows whose normaliser a rank keeps between batches (24 bytes each: ~96 MiB); see :meth:`LazyShardRows.begin_batch`.
DEFAULT_MAX_NORMALISERS = 1 << 22
#: The environment setting that overrides it (torchrun runs: every rank reads the same environment).
MAX_NORMALISERS_ENV = "KGREASON_LAZY_MAX_NORMALISERS"


def max_normalisers_from_env() -> int:
    """``KGREASON_LAZY_MAX_NORMALISERS`` (an integer >= 0) when set, else :data:`DEFAULT_MAX_NORMALISERS`."""
    raw = os.environ.get(MAX_NORMALISERS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_NORMALISERS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(f"{MAX_NORMALISERS_ENV}: expected an integer >= 0 (rows whose normaliser is kept), got {raw!r}")
    return value


class LazyShardRows:
    """This rank's columns of a lazy artifact's calibrated rows, computed on demand (see the module doc).

    The interface :class:`engine.exec.sharded.ShardedExecutor` reads (as :class:`~engine.exec.sharded.ShardRows`):
    :meth:`relations` (prepared blocks of the active heads of a hop, collective), :meth:`anchor_entries`
    (collective) and :meth:`weight` (local: the row's normaliser is known by then).
    """

    lazy = True

    def __init__(self, shard: LazyShard, comm: "Comm", device: torch.device, make_block: Callable[..., "_RelBlock"], *,
                 row_cache_gb: float = DEFAULT_ROW_CACHE_GB, chunk_rows: int | None = None,
                 max_normalisers: int | None = None) -> None:
        from kge.calibrate import default_chunk_rows

        self.shard = shard
        self.comm = comm
        self.num_entities = shard.num_entities
        self.num_relations = shard.num_relations
        self.device = device
        #: :func:`engine.exec.sharded.relation_block` (passed in: that module imports this one)
        self._make_block = make_block
        # copies (np.array): the embeddings may be a read-only memory map
        block = torch.from_numpy(np.array(shard.entity[shard.lo:shard.hi], dtype=np.complex64))
        tails = torch.cat([block.real, block.imag], dim=1).t()  # (2d, N_k)
        # as RowCalibrator: at least _MIN_GEMM_COLS columns (zeros, dropped after the GEMM), for the same sums
        self._tails_t = torch.nn.functional.pad(tails, (0, max(0, _MIN_GEMM_COLS - shard.width))).contiguous()
        rel = torch.from_numpy(np.array(shard.relation, dtype=np.complex64))
        self._w_re, self._w_im = rel.real.contiguous(), rel.imag.contiguous()
        self.cache = RowCache(max_bytes=max(1, int(check_row_cache_gb(row_cache_gb) * (1 << 30))))
        self.chunk_rows = int(chunk_rows or default_chunk_rows(max(1, shard.width), "cpu"))
        if max_normalisers is None:
            max_normalisers = max_normalisers_from_env()
        if int(max_normalisers) < 0:
            raise UserError(f"max_normalisers: expected an integer >= 0, got {max_normalisers}")
        #: rows whose normaliser is kept from one batch to the next (see :meth:`begin_batch`)
        self.max_normalisers = int(max_normalisers)
        #: the rows normalised (sorted keys r*N + h) with (max M, scale k / Z) and the request that last used each:
        #: the same on every rank
        self._norm_keys = np.zeros(0, dtype=np.int64)
        self._norm = np.zeros((0, 2), dtype=np.float32)
        self._norm_used = np.zeros(0, dtype=np.int64)
        #: collective requests so far (:meth:`row_sets`): the table's clock
        self._requests = 0
        #: counters: rows normalised (exchanged), rows whose entries were computed here, exchanges, normalisers
        #: forgotten, score chunks computed again for the entries (they did not fit _KEEP_SCORES_BYTES)
        self.rows_normalised = 0
        self.rows_computed = 0
        self.exchanges = 0
        self.normalisers_evicted = 0
        self.chunks_recomputed = 0
        self.fetched: dict[tuple[int, int, int], float] = {}

    @property
    def nbytes(self) -> int:
        """Bytes held: the shard's own arrays, the tail block, the normalisers and the cached rows."""
        return int(self.shard.nbytes + self._norm_keys.nbytes + self._norm.nbytes + self._norm_used.nbytes
                   + self.cache.bytes)

    # ------------------------------------------------------------------------------- computing rows
    def _scores(self, keys: np.ndarray) -> torch.Tensor:
        """Scores of rows ``keys`` over this block's tails: (c, N_k) float32, the calibrator's float32 formula and GEMM
        shape rules (:meth:`kge.calibrate.RowCalibrator.compute`), so the same bits as one process's scores."""
        c = len(keys)
        if 0 < c < _MIN_GEMM_ROWS:  # BLAS sums a few rows otherwise than a chunk: padded, as the calibrator does
            return self._scores(np.tile(keys, -(-_MIN_GEMM_ROWS // c))[:_MIN_GEMM_ROWS])[:c]
        n = self.num_entities
        r, h = keys // n, keys % n
        e = torch.from_numpy(np.ascontiguousarray(self.shard.entity[h], dtype=np.complex64))
        hr, hi_ = e.real, e.imag
        rt = torch.from_numpy(r)
        wr, wi = self._w_re[rt], self._w_im[rt]
        q = torch.cat([hr * wr - hi_ * wi, hr * wi + hi_ * wr], dim=1)  # (c, 2d) = [Re, Im] of e_h*w_r
        s = q @ self._tails_t
        return s if s.shape[1] == self.shard.width else s[:, :self.shard.width].contiguous()

    def _known(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows' known tails here: ``(ptr (c+1,), local tails)``."""
        return rows_observed_tails(self.shard.obs_key, self.shard.obs_tail, keys)

    def _entries(self, s: torch.Tensor, keys: np.ndarray, norm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This block's entries of rows ``keys`` from their scores ``s`` (used as a workspace) and normalisers ``norm``
        ((c, 2): the row's maximum M over all N, scale k / Z): ``(indptr, local cols int32, vals float32)``, by
        :func:`ops.calibrate_rows_normalised` (the single-process kernel's floats)."""
        c = len(keys)
        ptr, tails = self._known(keys)
        nnz, cols, vals = ops.calibrate_rows_normalised(
            s, torch.from_numpy(np.ascontiguousarray(norm[:, 0])), torch.from_numpy(np.ascontiguousarray(norm[:, 1])),
            torch.from_numpy(ptr), torch.from_numpy(np.ascontiguousarray(tails)), threshold=self.shard.threshold,
            delta=self.shard.delta)
        indptr = np.zeros(c + 1, dtype=np.int64)
        np.cumsum(nnz.numpy(), out=indptr[1:])
        self.rows_computed += c
        return indptr, cols.numpy(), vals.numpy()

    def _normalise(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Collective: the normalisers of rows ``keys`` (sorted, none known yet; the same keys on every rank) from one
        exchange of every rank's ``(max, sum exp, known tails)``; stored, and the rows' entries here returned."""
        stats = np.zeros((len(keys), 3), dtype=np.float64)
        kept: list[torch.Tensor | None] = []
        step = self.chunk_rows
        # The first chunks' scores wait for the entries pass, the later ones are computed again: at most
        # _KEEP_SCORES_BYTES of scores at once (the kept chunks and, when not all fit, the one being computed)
        row_bytes = 4 * max(self.shard.width, 1)
        room = _KEEP_SCORES_BYTES if len(keys) * row_bytes <= _KEEP_SCORES_BYTES \
            else _KEEP_SCORES_BYTES - min(step, len(keys)) * row_bytes
        ptr, _ = self._known(keys)
        stats[:, 2] = np.diff(ptr)
        for a in range(0, len(keys), step):
            s = self._scores(keys[a:a + step])
            # the calibration kernel's max and sum (float32 lanes per 1,024 entries, added in float64); merged
            # across ranks in float64
            m, z = ops.calibrate_row_stats(s)
            stats[a:a + len(s), 0] = m.numpy()
            stats[a:a + len(s), 1] = z.numpy()
            size = s.numel() * s.element_size()
            kept.append(s if size <= room else None)
            room -= size if size <= room else 0
        got = torch.stack(self.comm.all_gather(torch.from_numpy(stats), "row normalisers")).numpy()  # (P, c, 3)
        self.exchanges += 1
        big_m = got[:, :, 0].max(axis=0)
        with np.errstate(invalid="ignore"):
            z = np.where(got[:, :, 1] > 0, got[:, :, 1] * np.exp(got[:, :, 0] - big_m), 0.0).sum(axis=0)
        count = np.maximum(1.0, got[:, :, 2].sum(axis=0)).astype(np.float32)
        norm = np.stack([big_m.astype(np.float32), count / z.astype(np.float32)], axis=1)  # float32 k / Z, as the kernel
        self._remember(keys, norm)
        self.rows_normalised += len(keys)
        pieces = []
        for i, a in enumerate(range(0, len(keys), step)):
            s = kept[i]
            k = keys[a:a + step]
            if s is None:
                self.chunks_recomputed += 1
                s = self._scores(k)
            kept[i] = None  # the chunk's scores are not needed after its entries
            pieces.append(self._entries(s, k, norm[a:a + step]))
        return _concat(pieces)

    def _remember(self, keys: np.ndarray, norm: np.ndarray) -> None:
        """Into the table (sorted by key): rows ``keys`` (sorted, not in it) with normalisers ``norm``, used now."""
        at = np.searchsorted(self._norm_keys, keys)
        self._norm_keys = np.insert(self._norm_keys, at, keys)
        self._norm = np.insert(self._norm, at, norm, axis=0)
        self._norm_used = np.insert(self._norm_used, at, self._requests)

    def begin_batch(self) -> None:
        """Collective point (every rank, the start of each query batch: :class:`engine.exec.sharded.ShardedExecutor`):
        keep the ``max_normalisers`` most recently used normalisers, forget the others.  Deterministic from the
        table alone (last use, then key), so every rank forgets the same rows; rows of the batch that ended are
        forgotten only now, after its backward pass (:meth:`weight` reads their normalisers)."""
        n = len(self._norm_keys)
        if n <= self.max_normalisers:
            return
        keep = np.zeros(n, dtype=bool)
        # most recent first; a stable sort keeps ties in key order
        keep[np.argsort(-self._norm_used, kind="stable")[:self.max_normalisers]] = True
        self._norm_keys, self._norm, self._norm_used = self._norm_keys[keep], self._norm[keep], self._norm_used[keep]
        self.normalisers_evicted += n - int(keep.sum())

    def _norm_of(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(known, pos)``: which rows ``keys`` have a normaliser, and where in the table."""
        return np.isin(keys, self._norm_keys), np.searchsorted(self._norm_keys, keys)

    def _local(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Entries here of rows ``keys`` whose normalisers are known: no exchange."""
        known, pos = self._norm_of(keys)
        if not bool(known.all()):  # a row is asked here only after every rank asked for it (the forward pass)
            raise RuntimeError(f"lazy shard rows: no normaliser for rows {keys[~known][:3].tolist()}")
        pieces = [self._entries(self._scores(keys[a:a + self.chunk_rows]), keys[a:a + self.chunk_rows],
                                self._norm[pos[a:a + self.chunk_rows]]) for a in range(0, len(keys), self.chunk_rows)]
        return _concat(pieces)

    def row_sets(self, wanted: Sequence[tuple[int, np.ndarray]]) -> list[_RowSet]:
        """Collective: per ``(r, heads)`` (relations distinct; heads sorted unique global ids), the rows ``M_r[heads, lo:hi]``
        as one :class:`~kge.lazy._RowSet` (columns local ids).  Rows no rank has normalised yet take one exchange
        for all of ``wanted``; the rest come from the cache or are recomputed here."""
        n = self.num_entities
        keys = np.concatenate([int(r) * n + np.asarray(h, dtype=np.int64) for r, h in wanted]) if wanted \
            else np.zeros(0, dtype=np.int64)
        self._requests += 1
        known, pos = self._norm_of(keys)
        self._norm_used[pos[known]] = self._requests  # the same rows on every rank: the tables stay equal
        new = np.unique(keys[~known])
        if new.size:  # the table is the same on every rank: all of them take this exchange, or none
            ptr, cols, vals = self._normalise(new)
            self._insert(new, ptr, cols, vals)
        tick = self.cache.next_tick()
        out = []
        for r, heads in wanted:
            rows, miss = self.cache.lookup(int(r), np.asarray(heads, dtype=np.int64), tick)
            if len(miss):  # evicted (or never cached here): recomputed from the stored normalisers
                ptr, cols, vals = self._local(int(r) * n + miss)
                fresh = _RowSet(miss.copy(), ptr, cols, vals, np.full(len(miss), tick, dtype=np.int64))
                self.cache.insert(int(r), fresh)
                rows = _RowSet.merge(rows, fresh)
            out.append(rows)
        return out

    def _insert(self, keys: np.ndarray, ptr: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        """Cache the rows ``keys`` (sorted) with their entries, by relation."""
        n = self.num_entities
        rels = keys // n
        tick = self.cache.next_tick()
        for r in np.unique(rels).tolist():
            sel = np.flatnonzero(rels == r)
            p, c, v = take_rows(ptr, cols, vals, sel)
            self.cache.insert(int(r), _RowSet(keys[sel] - r * n, p, c, v, np.full(len(sel), tick, dtype=np.int64)))

    # ------------------------------------------------------------------------------- the executor's interface
    def relations(self, rels: list[int], heads: list[torch.Tensor]) -> "list[_RelBlock | None]":
        """Collective: per relation ``rels[g]`` (distinct), a prepared block holding (at least) the rows of ``heads[g]``
        (sorted unique global ids, the active heads of the hop), as :meth:`ShardRows.relation
        <engine.exec.sharded.ShardRows.relation>` gives them."""
        sets = self.row_sets([(r, h.cpu().numpy().astype(np.int64)) for r, h in zip(rels, heads)])
        out: list[_RelBlock | None] = []
        for r, rows in zip(rels, sets):
            if not len(rows.cols):
                out.append(None)
                continue
            tails = np.unique(rows.cols)
            col = np.searchsorted(tails, rows.cols).astype(np.int32)
            out.append(self._make_block(torch.from_numpy(rows.indptr), torch.from_numpy(col), torch.from_numpy(rows.vals),
                                      torch.from_numpy(rows.heads), torch.from_numpy(tails.astype(np.int64)), r,
                                      self.device))
        return out

    def anchor_entries(self, rels: np.ndarray, ents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Collective: the entries here of rows ``M_{rels[b]}[ents[b], :]``: ``(counts (b,), local columns, values)`` in
        batch order."""
        n = self.num_entities
        keys = rels.astype(np.int64) * n + ents.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        groups = [g for g in np.split(uniq, np.flatnonzero(np.diff(uniq // n)) + 1) if len(g)]
        sets = self.row_sets([(int(g[0] // n), g % n) for g in groups])
        ptr, cols, vals = take_rows(*_concat([(s.indptr, s.cols, s.vals) for s in sets]), inv.reshape(-1))
        return np.diff(ptr), cols.astype(np.int64), vals

    def weight(self, r: int, i: int, j: int) -> float:
        """``M_r[i, j]`` (0.0 without an entry): for a tail of this block from the row (its normaliser is known: the
        forward pass computed it; no exchange), for another from :attr:`fetched`."""
        lo, hi = self.shard.lo, self.shard.hi
        if not lo <= j < hi:
            return self.fetched[(int(r), int(i), int(j))]
        key = np.array([int(r) * self.num_entities + int(i)], dtype=np.int64)
        rows, miss = self.cache.lookup(int(r), key - int(r) * self.num_entities, self.cache.next_tick())
        ptr, cols, vals = self._local(key) if len(miss) else (rows.indptr, rows.cols, rows.vals)
        at = int(np.searchsorted(cols[: int(ptr[1])], j - lo))
        return float(vals[at]) if at < int(ptr[1]) and int(cols[at]) == j - lo else 0.0


def _concat(pieces: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from kge.lazy import concat_rows

    if not pieces:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    return concat_rows(pieces)
