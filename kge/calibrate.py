"""Calibrated neural adjacency matrices from ComplEx embeddings (QTO, appendix E).

For every relation ``r`` and head ``h`` the tails are scored with
``s_t = Re(sum(e_h * w_r * conj(e_t)))`` and turned into probabilities::

    p_t = softmax(s)_t * max(1, #observed tails of (h, r))
    p_t = 0            if p_t < threshold          (default 2e-4)
    p_t = min(p_t, 1 - delta)                      (default delta 1e-4)
    p_t = 1            if (h, r, t) is observed

The result is one stacked CSR of shape ``(R*N, N)`` (row ``r*N + h`` holds
``M_r[h, :]``), as :class:`~kge.artifact.Artifact` stores it.

How it is computed: rows are processed in chunks of ``chunk_rows`` flattened
``(r, h)`` rows (in a fixed shuffled order, so that the entries kept so far
project the total without bias).  For a chunk, ``q = e_h * w_r`` is formed and the scores of
all tails are one real matmul ``[Re q, Im q] (c, 2d) @ [Re E; Im E] (2d, N)``
in float32.  Everything after the GEMM -- softmax, the ``max(1, #tails)``
factor, observed edges, threshold, cap, and the gather of the few survivors
into CSR pieces -- is one op, :func:`ops.calibrate_rows`: the fused kernel
(``csrc/cpu/calibrate_rows_cpu.cpp``) reads each score row from memory once,
where the torch formulation it replaced (``ops/calibrate_rows_reference.py``,
still the ``"reference"`` backend) made eight passes over the ``(c, N)``
buffer.  Nothing of size ``N x N`` per relation, let alone ``R x N x N``, is
ever allocated.

The per-chunk formula is :meth:`RowCalibrator.compute`, for any list of rows:
:func:`calibrate` calls it on contiguous chunks, lazy artifacts
(:mod:`kge.lazy`) on the rows a query needs, so both get the same floats.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from kgreason.errors import UserError

__all__ = ["calibrate", "RowCalibrator", "estimate_nnz", "NnzEstimate", "CalibrationStats", "calibrated_rows_reference", "observed_row_counts", "DEFAULT_THRESHOLD", "DEFAULT_DELTA"]

DEFAULT_THRESHOLD = 2e-4
DEFAULT_DELTA = 1e-4


@dataclass
class CalibrationStats:
    """What :func:`calibrate` did: rows computed, entries kept, time, achieved matmul FLOP rate."""

    rows: int
    nnz: int
    seconds: float
    matmul_flops: float
    chunk_rows: int
    device: str
    threshold: float = DEFAULT_THRESHOLD
    threshold_raises: list[float] | None = None

    @property
    def flop_rate(self) -> float:
        """Useful matmul FLOPs per second of the whole calibration (softmax etc. included in the time)."""
        return self.matmul_flops / self.seconds if self.seconds > 0 else float("nan")


def observed_row_counts(observed: np.ndarray, num_entities: int, num_relations: int) -> np.ndarray:
    """#observed tails of each flattened row ``r*N + h``: int64 (R*N,)."""
    keys = observed[:, 1].astype(np.int64) * num_entities + observed[:, 0]
    return np.bincount(keys, minlength=num_relations * num_entities)


def calibrated_rows_reference(
    entity: np.ndarray,
    relation: np.ndarray,
    observed: np.ndarray,
    rows: Sequence[int],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    delta: float = DEFAULT_DELTA,
) -> np.ndarray:
    """Dense float64 reference of the calibrated rows ``r*N + h``: (len(rows), N).

    Straight from the formula (numpy, complex128), for tests.
    """
    n = entity.shape[0]
    e = entity.astype(np.complex128)
    w = relation.astype(np.complex128)
    out = np.zeros((len(rows), n))
    obs_keys = observed[:, 1].astype(np.int64) * n + observed[:, 0]
    for i, row in enumerate(rows):
        r, h = divmod(int(row), n)
        s = np.real((e[h] * w[r]) @ np.conj(e).T)
        p = np.exp(s - s.max())
        p /= p.sum()
        tails = observed[obs_keys == row, 2]
        p *= max(1, len(tails))
        p[p < threshold] = 0.0
        p = np.minimum(p, 1.0 - delta)
        p[tails] = 1.0
        out[i] = p
    return out


def _row_ranges(num_entities: int, num_relations: int, relations: Sequence[int] | None) -> list[tuple[int, int]]:
    if relations is None:
        return [(0, num_relations * num_entities)]
    ranges: list[tuple[int, int]] = []
    for r in sorted(set(int(x) for x in relations)):
        if not 0 <= r < num_relations:
            raise IndexError(f"relation id {r} out of range [0, {num_relations})")
        lo, hi = r * num_entities, (r + 1) * num_entities
        if ranges and ranges[-1][1] == lo:
            ranges[-1] = (ranges[-1][0], hi)
        else:
            ranges.append((lo, hi))
    return ranges


def _chunks(ranges: list[tuple[int, int]], size: int) -> Iterator[tuple[int, int]]:
    for lo, hi in ranges:
        for a in range(lo, hi, size):
            yield a, min(a + size, hi)


class RowCalibrator:
    """Computes calibrated rows ``M_r[h, :]`` for any flattened row keys ``r*N + h``.

    The one implementation of the formula: :func:`calibrate` (the eager build)
    and :class:`kge.lazy.LazyMatrices` (rows computed on demand) both call
    :meth:`compute`, so lazy rows equal eager rows by construction.

    ``entity`` (N, d) and ``relation`` (R, d) complex; ``observed`` (E, 3) int
    ``(h, r, t)``.  The embeddings are moved to ``device`` once; the observed
    edges stay on the host, sorted by flattened row (nothing of size R*N is
    allocated, so the same object serves KGs whose R*N rows could never be
    stored).
    """

    def __init__(self, entity: np.ndarray, relation: np.ndarray, observed: np.ndarray, *,
                 threshold: float = DEFAULT_THRESHOLD, delta: float = DEFAULT_DELTA, device: str = "cpu",
                 chunk_rows: int | None = None) -> None:
        import torch

        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {delta}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.num_entities, self.dim = (int(x) for x in entity.shape)
        self.num_relations = int(relation.shape[0])
        self.threshold = float(threshold)
        self.delta = float(delta)
        self.device = str(device)
        self.chunk_rows = int(chunk_rows or default_chunk_rows(self.num_entities, self.device))
        dev = torch.device(device)
        ent = torch.from_numpy(np.ascontiguousarray(entity, dtype=np.complex64))
        rel = torch.from_numpy(np.ascontiguousarray(relation, dtype=np.complex64))
        self._e_re, self._e_im = ent.real.contiguous().to(dev), ent.imag.contiguous().to(dev)
        self._w_re, self._w_im = rel.real.contiguous().to(dev), rel.imag.contiguous().to(dev)
        tails = torch.cat([self._e_re, self._e_im], dim=1).t()  # (2d, N)
        # Fewer than _MIN_GEMM_COLS entities: zero columns up to that width (dropped after the GEMM), as
        # for short chunks below; for so narrow an output MKL's sums differed with the chunk's size and
        # position for nearly every row count (measured for N = 7 on an AMD EPYC).
        width = max(self.num_entities, _MIN_GEMM_COLS)
        self._tails_t = torch.nn.functional.pad(tails, (0, width - self.num_entities)).contiguous()  # (2d, W)
        observed = np.asarray(observed, dtype=np.int64).reshape(-1, 3)
        # Observed edges sorted by flattened row (then tail), for per-row lookups by binary search.
        obs_key = observed[:, 1] * self.num_entities + observed[:, 0]
        order = np.lexsort((observed[:, 2], obs_key))
        self._obs_key = np.ascontiguousarray(obs_key[order])
        self._obs_tail = np.ascontiguousarray(observed[order, 2])
        self._buf = None

    @property
    def total_rows(self) -> int:
        return self.num_relations * self.num_entities

    def matmul_flops(self, rows: int) -> float:
        """Useful FLOPs of the score matmul for ``rows`` rows."""
        return 2.0 * rows * 2 * self.dim * self.num_entities

    def _buffer(self, c: int):
        import torch

        if self._buf is None or self._buf.shape[0] < c:
            self._buf = torch.empty((max(c, self.chunk_rows), self._tails_t.shape[1]),
                                    dtype=torch.float32, device=self._tails_t.device)
        return self._buf[:c]

    def release(self) -> None:
        """Drop the score buffer (it is reallocated on the next call)."""
        self._buf = None

    def compute(self, keys: np.ndarray, *, threshold: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Calibrated rows ``keys`` (int64 (c,), any order, c <= ``chunk_rows`` for bounded memory) in one matmul.

        Returns ``(row_nnz, cols, vals)`` on the host: int64 (c,) entries per row,
        then the rows' entries in the order of ``keys``, columns int32 ascending
        within each row, values float32 in [threshold, 1 - delta] or exactly 1.0
        (observed edges).  ``threshold`` overrides the object's (the eager build
        raises it while calibrating).
        """
        import torch

        thr = self.threshold if threshold is None else float(threshold)
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        c = len(keys)
        n = self.num_entities
        if c == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        if c < _MIN_GEMM_ROWS:
            # BLAS takes other paths for a few rows (gemv for one; small-M kernels and another thread
            # split for a handful), whose sums differ from a large chunk's in the last bit: MKL on an
            # AMD EPYC differed for M in {1, 2, 3, 5, 6, 7, 9, 10, 11} with 2 threads, on an Intel
            # Xeon for M = 1.  Padded to _MIN_GEMM_ROWS rows (the keys repeated), a row gets the same
            # floats as in any chunk, so a lazy row is the eager row bit for bit.
            reps = -(-_MIN_GEMM_ROWS // c)
            nnz2, cols2, vals2 = self.compute(np.tile(keys, reps)[:_MIN_GEMM_ROWS], threshold=threshold)
            k0 = int(nnz2[:c].sum())
            return nnz2[:c], cols2[:k0], vals2[:k0]
        import ops  # the post-GEMM op; imported here: importing kge loads no compiled extension

        dev = self._tails_t.device
        with torch.inference_mode():
            rows = torch.from_numpy(keys).to(dev)
            r_ids, h_ids = torch.div(rows, n, rounding_mode="floor"), rows % n
            hr, hi_ = self._e_re[h_ids], self._e_im[h_ids]
            wr, wi = self._w_re[r_ids], self._w_im[r_ids]
            q = torch.cat([hr * wr - hi_ * wi, hr * wi + hi_ * wr], dim=1)  # (c, 2d) = [Re, Im] of e_h*w_r
            s = self._buffer(c)
            torch.mm(q, self._tails_t, out=s)  # scores (c, W)
            if s.shape[1] != n:
                s = s[:, :n].contiguous()  # the padding columns of a tiny KG
            ptr, o_cols = rows_observed_tails(self._obs_key, self._obs_tail, keys)
            # softmax, * max(1, #tails), observed -> 1, threshold, cap, CSR: one fused op (backend: the
            # ops module default, ops.set_backend); it may overwrite s, a workspace
            row_nnz, cols, vals = ops.calibrate_rows(s, torch.from_numpy(ptr).to(dev), torch.from_numpy(o_cols).to(dev),
                                                     threshold=thr, delta=self.delta)
            return row_nnz.cpu().numpy(), cols.cpu().numpy(), vals.cpu().numpy()


def rows_observed_tails(obs_key: np.ndarray, obs_tail: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The observed tails of rows ``keys`` (flattened ``r*N + h``) as a CSR: ``(ptr (c+1,) int64, tails)``.

    ``obs_key`` (E,) ascending holds each observed edge's row key and ``obs_tail`` (E,) its tail, in the
    same order (edges sorted by row key); row ``i``'s tails are ``tails[ptr[i]:ptr[i+1]]``, in that order.
    """
    a = np.searchsorted(obs_key, keys, side="left")
    b = np.searchsorted(obs_key, keys, side="right")
    counts = b - a
    ptr = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    pos = np.repeat(a - ptr[:-1], counts) + np.arange(int(ptr[-1]), dtype=np.int64)
    return ptr, obs_tail[pos]


#: Chunks of fewer rows are padded to this many before the score GEMM (see RowCalibrator.compute).
_MIN_GEMM_ROWS = 16
#: Score GEMMs are at least this many columns wide (zero columns for tiny KGs; see RowCalibrator).
_MIN_GEMM_COLS = 32


def default_chunk_rows(num_entities: int, device: str) -> int:
    """Rows per chunk: ~64 MB score buffers on CPU, ~1 GB on GPU.

    Measured at FB15k-237 size on 2 busy cores: 289-row chunks (16 MB) took
    14.2 s per relation, 1024-row chunks 6.5 s (per-op threading overhead).
    """
    budget = (1 << 30) if device.startswith("cuda") else (64 << 20)
    return int(max(16, min(65536, budget // (4 * max(1, num_entities)))))


def calibrate(
    entity: np.ndarray,
    relation: np.ndarray,
    observed: np.ndarray,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    delta: float = DEFAULT_DELTA,
    relations: Sequence[int] | None = None,
    chunk_rows: int | None = None,
    device: str = "auto",
    progress: bool = True,
    max_nnz: int | None = None,
    adapt_threshold: bool = False,
) -> tuple[sp.csr_matrix, CalibrationStats]:
    """Calibrated stacked adjacency CSR ``(R*N, N)`` from complex embeddings.

    ``entity`` (N, d) and ``relation`` (R, d) complex; ``observed`` (E, 3) int
    ``(h, r, t)`` edges known to hold (set to exactly 1.0, and counted for the
    ``max(1, #tails)`` factor).  ``relations`` restricts the work to those
    relations (other rows stay empty).  Returns the CSR (float32 data, int32
    indices sorted per row, int64 indptr) and :class:`CalibrationStats`.
    """
    from kgreason.progress import progress_bar

    calib = RowCalibrator(entity, relation, observed, threshold=threshold, delta=delta, device=device,
                          chunk_rows=chunk_rows)
    device, chunk = calib.device, calib.chunk_rows
    n, num_rel = calib.num_entities, calib.num_relations

    _fixed_mmap_threshold()
    ranges = _row_ranges(n, num_rel, relations)
    total_rows = sum(hi - lo for lo, hi in ranges)
    row_nnz = np.zeros(num_rel * n, dtype=np.int64)
    pieces_idx: list[np.ndarray] = []
    pieces_val: list[np.ndarray] = []
    piece_rows: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    kept_total = 0
    done_rows = 0
    raised: list[float] = []
    bar = progress_bar(total=total_rows, unit="row", unit_scale=True, desc="calibrating", disable=not progress, mininterval=1.0)
    # Chunks in a fixed shuffled order: the running nnz then projects the total
    # without bias (relations differ a lot in density), which the memory bound uses.
    chunk_list = list(_chunks(ranges, chunk))
    for ci in np.random.default_rng(0).permutation(len(chunk_list)):
        lo, hi = chunk_list[ci]
        c = hi - lo
        # The row formula lives in RowCalibrator.compute, shared with lazy artifacts (kge.lazy).
        nnz_c, cols_c, vals_c = calib.compute(np.arange(lo, hi, dtype=np.int64), threshold=threshold)
        row_nnz[lo:hi] = nnz_c
        pieces_idx.append(cols_c)
        pieces_val.append(vals_c)
        piece_rows.append((lo, hi))
        kept_total += len(vals_c)
        done_rows += c
        bar.update(c)
        if max_nnz is not None:
            projected = kept_total * total_rows / done_rows
            over = kept_total > max_nnz or (done_rows >= 0.02 * total_rows and projected > max_nnz)
            if over and not adapt_threshold:
                raise UserError(
                    f"calibration at threshold {threshold:g} keeps {kept_total:,} entries after "
                    f"{done_rows:,} of {total_rows:,} rows (projected {projected:,.0f} > limit {max_nnz:,}); "
                    f"raise the threshold or the memory budget"
                )
            if over:
                threshold = _raise_threshold(pieces_val, threshold, target=0.8 * max_nnz * done_rows / total_rows)
                kept_total = _refilter(pieces_idx, pieces_val, piece_rows, row_nnz, threshold)
                raised.append(threshold)
                bar.set_postfix(threshold=f"{threshold:.3g}")
    calib.release()
    bar.close()
    seconds = time.perf_counter() - t0
    nnz = int(row_nnz.sum())
    indptr = np.zeros(num_rel * n + 1, dtype=np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    indices = np.empty(nnz, dtype=np.int32)
    data = np.empty(nnz, dtype=np.float32)
    # Copy piece by piece into place, dropping each as it is copied, so peak memory stays ~1x nnz.
    for i in range(len(piece_rows)):
        lo, _ = piece_rows[i]
        pi, pv = pieces_idx[i], pieces_val[i]
        pieces_idx[i] = pieces_val[i] = None  # type: ignore[call-overload]
        pos = int(indptr[lo])
        indices[pos : pos + len(pi)] = pi
        data[pos : pos + len(pv)] = pv
        del pi, pv
    mat = sp.csr_matrix((num_rel * n, n), dtype=np.float32)
    mat.data, mat.indices, mat.indptr = data, indices, indptr
    mat.has_sorted_indices = True
    stats = CalibrationStats(
        rows=total_rows, nnz=nnz, seconds=seconds, matmul_flops=calib.matmul_flops(total_rows),
        chunk_rows=chunk, device=device, threshold=threshold, threshold_raises=raised,
    )
    return mat, stats


def _fixed_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """Serve allocations >= ``nbytes`` by mmap, always (glibc only; no-op elsewhere).

    glibc raises its mmap threshold after each freed large block, so the
    per-chunk temporaries (16-60 MB) move into the heap, where the small
    long-lived result pieces allocated between them keep it from shrinking:
    on FB15k-237 RSS grew to 3x the kept entries.  A fixed threshold returns
    every temporary to the OS when freed.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _raise_threshold(values: list[np.ndarray], threshold: float, target: float) -> float:
    """Smallest threshold (> current) keeping at most ``target`` of the stored values (log-spaced histogram)."""
    edges = np.geomspace(threshold, 1.0, 2001)
    hist = np.zeros(len(edges) - 1, dtype=np.int64)
    for v in values:
        hist += np.histogram(v, bins=edges)[0]
    hist[-1] += sum(int(np.count_nonzero(v >= 1.0)) for v in values)
    kept_from = np.cumsum(hist[::-1])[::-1]  # kept_from[i] = #values >= edges[i]
    ok = np.nonzero(kept_from <= target)[0]
    i = int(ok[0]) if len(ok) else len(edges) - 2
    return float(max(edges[max(i, 1)], np.nextafter(threshold, 1.0)))


def _refilter(pieces_idx: list[np.ndarray], pieces_val: list[np.ndarray], piece_rows: list[tuple[int, int]],
              row_nnz: np.ndarray, threshold: float) -> int:
    """Drop stored entries below ``threshold`` (observed edges are 1.0 and stay); returns the new total."""
    total = 0
    for i, (lo, hi) in enumerate(piece_rows):
        keep = pieces_val[i] >= threshold
        local = np.repeat(np.arange(hi - lo), row_nnz[lo:hi])
        row_nnz[lo:hi] = np.bincount(local[keep], minlength=hi - lo)
        pieces_idx[i] = pieces_idx[i][keep]
        pieces_val[i] = pieces_val[i][keep]
        total += int(keep.sum())
    return total


@dataclass
class NnzEstimate:
    """Expected nnz of the full calibration, from a uniform sample of rows.

    ``sample_p`` holds the calibrated probabilities (before the cut and the cap)
    of the sampled rows' entries that are >= ``floor`` and ``sample_w`` how many
    rows each stands for (stratified sample), so that the nnz for any larger
    threshold can be read off with :meth:`nnz_at`.
    """

    total_rows: int
    sampled_rows: int
    sample_p: np.ndarray
    sample_w: np.ndarray
    observed: int
    floor: float

    def nnz_at(self, threshold: float) -> float:
        """Estimated total nnz at ``threshold`` (>= floor); observed edges included (an upper bound)."""
        return float(self.sample_w[self.sample_p >= threshold].sum()) + self.observed

    def threshold_for(self, max_nnz: float) -> float:
        """Smallest threshold (>= floor) whose estimated nnz is at most ``max_nnz``."""
        budget = max_nnz - self.observed
        if budget <= 0:
            return 1.0
        order = np.argsort(-self.sample_p, kind="stable")
        cum = np.cumsum(self.sample_w[order])
        i = int(np.searchsorted(cum, budget, side="right"))
        if i >= len(order):
            return self.floor
        return float(max(self.floor, np.nextafter(self.sample_p[order[i]], np.float32(1.0))))


def estimate_nnz(
    entity: np.ndarray,
    relation: np.ndarray,
    observed: np.ndarray,
    *,
    floor: float = DEFAULT_THRESHOLD,
    num_rows: int = 2048,
    seed: int = 0,
    device: str = "cpu",
) -> NnzEstimate:
    """Sample ``num_rows`` flattened rows uniformly and record their calibrated probabilities >= ``floor``.

    Cheap (one ``(num_rows, 2d) @ (2d, N)`` matmul) and run before the full
    calibration so that a build can refuse a threshold whose matrices would not
    fit in memory.
    """
    import torch

    n, d = entity.shape
    num_rel = relation.shape[0]
    total = n * num_rel
    rng = np.random.default_rng(seed)
    obs = np.asarray(observed, dtype=np.int64).reshape(-1, 3)
    # Only the rows with observed tails are counted (O(edges)): observed_row_counts' R*N counts are 16 GB
    # at 1M entities and 2,000 relations, and the list of the rows with fewer than 2 as large (issue 30).
    keys, key_counts = np.unique(obs[:, 1] * n + obs[:, 0], return_counts=True)
    dense = keys[key_counts >= 2]
    # Stratified: rows with >= 2 observed tails are few but dense (p is scaled by their
    # count), so a uniform sample misses them; sample each stratum separately and weight.  The sparse
    # stratum (every other row) is drawn by position: the i-th row without >= 2 tails is i plus the number
    # of dense rows before it, the draw np.random's choice makes from that list written out.
    picks, weights = [], []
    for size, is_dense in ((len(dense), True), (total - len(dense), False)):
        if size == 0:
            continue
        k = min(num_rows // 2, size)
        at = rng.choice(size, size=k, replace=False)
        if is_dense:
            chosen = dense[at]
        else:
            chosen = at + np.searchsorted(dense - np.arange(len(dense)), at, side="right")
        picks.append(np.sort(chosen))
        weights.append(np.full(k, size / k))
    rows = np.concatenate(picks)
    row_weight = np.concatenate(weights)
    where = np.minimum(np.searchsorted(keys, rows), max(len(keys) - 1, 0))
    row_counts = np.where(keys[where] == rows, key_counts[where], 0) if len(keys) else np.zeros(len(rows), np.int64)
    ent = torch.from_numpy(np.ascontiguousarray(entity, dtype=np.complex64)).to(device)
    rel = torch.from_numpy(np.ascontiguousarray(relation, dtype=np.complex64)).to(device)
    r_ids = torch.from_numpy(rows // n).to(device)
    h_ids = torch.from_numpy(rows % n).to(device)
    kept: list[np.ndarray] = []
    kept_w: list[np.ndarray] = []
    # 512 rows at a time, fewer above 32,768 entities: the (step, N) complex scores stay within 256 MiB
    # (kge.build's auto mode samples every KG, a million-entity one too)
    step = int(max(16, min(512, (256 << 20) // (16 * n))))
    with torch.inference_mode():
        for a in range(0, len(rows), step):
            q = ent[h_ids[a : a + step]] * rel[r_ids[a : a + step]]
            s = (q @ ent.conj().t()).real
            p = torch.softmax(s, dim=1) * torch.from_numpy(np.maximum(row_counts[a : a + step], 1)).to(device).float()[:, None]
            mask = p >= floor
            kept.append(p[mask].cpu().numpy())
            kept_w.append(np.repeat(row_weight[a : a + step], mask.sum(dim=1).cpu().numpy()))
    return NnzEstimate(total_rows=total, sampled_rows=len(rows), sample_p=np.concatenate(kept),
                       sample_w=np.concatenate(kept_w), observed=len(observed), floor=floor)
