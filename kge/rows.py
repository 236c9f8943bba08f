"""Relation rows: what a projection reads from the KG, behind one interface.

A projection of a fuzzy batch ``X`` (B, N) sends row ``b`` through its own relation
``relations[b]``: ``Y[b, j] = max_i X[b, i] * M_{relations[b]}[i, j]``.  The only
rows of the stacked ``(R*N, N)`` matrix it reads are ``relations[b]*N + h`` for the
active heads ``h`` of row ``b`` (``X[b, h] > 0``): every other row meets a zero
input, in QTO's negated projection too (the factor is multiplied by ``X[b, i]``).

:class:`RelationRows` is the interface the executor (:mod:`engine.exec.executor`)
projects through.  For a batch it hands out :class:`RowBlock` s: an
``ops.StackedMatrices`` (stacked CSR plus its transpose, what ``ops.prepare_matrices``
returns) holding at least the rows the block's batch rows need, the local relation
id of each of those batch rows in that stack, and which batch rows they are.  The
executor makes one ``ops.project`` call per block and nothing else, so:

* :class:`EagerRows`: an eager artifact's CSR prepared ONCE into one stack and one
  transpose (the arrays of the artifact's scipy CSR are shared on CPU, not copied);
  one block covering the whole batch.  This is the only prepared copy of the KG:
  per-relation matrices (:meth:`EagerRows.relation`) are views of it.
* :class:`LazyRows`: a lazy artifact's on-demand rows (:class:`kge.lazy.LazyMatrices`):
  one block per relation of the batch, its stack the relation's cached rows as prepared
  once (warm) or a compact stack of the rows the block's active heads need, computed
  (or taken from the row cache) when the block is drawn.
* anything future (rows sharded across hosts or devices, memory-mapped rows, ...):
  implement :meth:`RelationRows.blocks` and :meth:`RelationRows.weight` (and, when
  the whole stack is at hand, :meth:`RelationRows.full_stack`); the executor needs
  nothing else (``tests/test_kge_rows.py`` runs it over rows split in two shards).

``Artifact.relation_rows(device=...)`` returns the right implementation, cached per
device, so every executor of an artifact shares one prepared copy.

``torch`` and ``ops`` are imported inside functions: importing ``kge`` loads no
compiled extension (tests/test_imports.py).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ops import StackedMatrices

    from .lazy import LazyMatrices

__all__ = ["RelationRows", "RowBlock", "EagerRows", "LazyRows", "active_pairs", "csr_tensor"]

#: Most (batch row, active entity) pairs one lazy block turns into calibrated rows at once.  Without a
#: bound, a batch of 300 FB15k-237 2p queries at threshold 2e-4 asked for ~1M rows in one call, and their
#: entries plus the stack built from them were OOM-killed at 23 GB on a 24 GB machine; batch rows beyond
#: this many pairs go to further blocks (rows they share are then served by the row cache).
LAZY_MAX_PAIRS = 1 << 16


class RowBlock(NamedTuple):
    """The rows one projection call reads, and the batch rows it projects (a NamedTuple: one is made per
    projection call, batch-1 calls included).

    Attributes:
        stack: an ``ops.StackedMatrices`` (R' stacked relation matrices, (R'*N, N), plus the
            transpose) on the rows' device; R' may be the artifact's R or a compact subset.
        rel: (B',) int64 tensor on the rows' device: batch row ``rows[k]`` goes through stack
            relation ``rel[k]`` (a local id in [0, R')).
        rows: (B',) int64 tensor on the rows' device, the batch rows this block covers,
            ascending; ``None``: all B rows, in order (then B' = B).
    """

    stack: "StackedMatrices"
    rel: "torch.Tensor"
    rows: "torch.Tensor | None" = None


def active_pairs(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ``(b, h)`` with ``x[b, h] > 0`` of a (B, N) tensor or an ``ops.sparse_rows.SparseRows``, as two
    int64 numpy arrays ordered by (b, h)."""
    import torch

    if isinstance(x, torch.Tensor):
        b, h = (x > 0).nonzero(as_tuple=True)
    else:  # SparseRows: stored entries may be 0, which is no active head
        keep = x.val > 0
        b, h = x.row_ids()[keep], x.col[keep]
    return b.cpu().numpy(), h.cpu().numpy()


def csr_tensor(block: Any, device: "str | torch.device" = "cpu") -> "torch.Tensor":
    """A scipy CSR (N, N) (float32 data, int32 indices) as a torch sparse CSR tensor on ``device``, int32
    pointers; on CPU, indices and values share the scipy arrays' memory."""
    import warnings

    import torch

    with warnings.catch_warnings():
        # torch flags all CSR tensors as "beta"; they are only containers here.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.sparse_csr_tensor(torch.from_numpy(block.indptr.astype(np.int32)), torch.from_numpy(block.indices),
                                    torch.from_numpy(block.data), size=block.shape, dtype=torch.float32)
    return t.to(device)


class RelationRows(ABC):
    """The relation matrices of a KG as a projection reads them (see the module docstring).

    Shapes: ``N = num_entities``, ``R = num_relations``; relation ``r``'s matrix ``M_r`` is
    (N, N) with values in [0, 1].  An implementation promises, for every batch, blocks whose
    stacks hold ``M_{relations[b]}[h, :]`` exactly for every active head ``h`` of every
    batch row ``b`` they cover (other rows may be absent or anything: they meet a zero input),
    and covering each batch row exactly once.  That is all the executor relies on; a sharded
    implementation must only implement this interface.
    """

    num_entities: int
    num_relations: int
    device: "torch.device"

    @abstractmethod
    def blocks(self, x: Any, relations: Sequence[int] | np.ndarray) -> Iterator[RowBlock]:
        """Blocks covering a batch's rows, each batch row in exactly one block.

        Args:
            x: the projection's input, a (B, N) float32 tensor or an ``ops.sparse_rows.SparseRows``
                of B rows, on :attr:`device`; only its support (``x[b, h] > 0``) matters.
            relations: (B,) relation ids in [0, R), one per batch row.

        A generator may compute each block's rows when it is drawn (and free them after):
        consume the blocks one at a time.  An empty batch may yield no block.
        """

    @abstractmethod
    def weight(self, r: int, i: int, j: int) -> float:
        """``M_r[i, j]`` (0.0 where M_r has no entry), as a Python float (read on the host)."""

    def full_stack(self) -> "StackedMatrices | None":
        """The whole ``(R*N, N)`` stack when it is held (eager rows), else ``None``."""
        return None

    def one_hot_rows(self, relations: np.ndarray, heads: np.ndarray) -> "tuple[np.ndarray, np.ndarray, np.ndarray] | None":
        """The rows ``M_{relations[b]}[heads[b], :]`` as host CSR pieces ``(indptr int64 (B+1,), cols int32,
        vals float32)``, in batch order, for projecting one-hot rows without a kernel call; ``None`` (the
        default): project them through :meth:`blocks` like any other batch.

        Args: ``relations``, ``heads``: (B,) int64 arrays (ids in range).
        """
        return None

    def relation(self, r: int) -> "StackedMatrices":
        """``M_r`` as a one-relation ``ops.StackedMatrices`` (N, N) on :attr:`device` (whole-relation consumers, e.g. a
        reference loop of ``ops.project``).  Default: a view of :meth:`full_stack`; implementations without
        a full stack override it."""
        if not 0 <= int(r) < self.num_relations:
            raise IndexError(f"relation id {r} out of range [0, {self.num_relations})")  # as Artifact.relation_block
        stack = self.full_stack()
        if stack is None:
            raise NotImplementedError(f"{type(self).__name__} holds no full stack: override relation()")
        return stack.relation(r)


class EagerRows(RelationRows):
    """An eager artifact's stacked CSR, prepared once (validated, transposed) on ``device``.

    Args:
        matrices: scipy CSR (R*N, N): int64 ``indptr``, int32 ``indices``, float32 ``data`` (the
            artifact's ``matrices``); shared, not copied, on CPU.
        num_entities: N.
        device: where the prepared stack lives (default ``"cpu"``).

    The stack (the CSR plus one stacked transpose) is built on the first :meth:`blocks` /
    :meth:`full_stack` call and then shared by every projection.
    """

    def __init__(self, *, matrices: Any, num_entities: int, device: "str | torch.device" = "cpu") -> None:
        import torch

        self.matrices = matrices
        self.num_entities = int(num_entities)
        self.num_relations = int(matrices.shape[0]) // max(1, self.num_entities)
        self.device = torch.device(device)
        self._stack: StackedMatrices | None = None
        self._singles: list | None = None  # [tensor([r]) for each r]: batch-1 projections reuse them

    def full_stack(self) -> "StackedMatrices":
        if self._stack is None:
            import ops

            self._stack = ops.prepare_matrices(self.matrices, num_entities=self.num_entities, device=self.device)
        return self._stack

    def blocks(self, x: Any, relations: Sequence[int] | np.ndarray) -> Iterator[RowBlock]:
        import torch

        if isinstance(relations, np.ndarray):
            rel = torch.from_numpy(relations.astype(np.int64, copy=False)).to(self.device)
        elif len(relations) == 1 and 0 <= relations[0] < self.num_relations:
            # batch 1: making a tensor costs about as much as the one-hot push it feeds
            if self._singles is None:
                self._singles = list(torch.arange(self.num_relations, dtype=torch.int64, device=self.device).split(1))
            rel = self._singles[int(relations[0])]
        else:
            rel = torch.tensor(relations, dtype=torch.int64, device=self.device)
        yield RowBlock(self.full_stack(), rel)

    def weight(self, r: int, i: int, j: int) -> float:
        # Binary search in row i of M_r on the host arrays: explanations read single entries.
        m = self.matrices
        row = int(r) * self.num_entities + int(i)
        lo, hi = int(m.indptr[row]), int(m.indptr[row + 1])
        cols = m.indices[lo:hi]
        pos = int(cols.searchsorted(j))
        return float(m.data[lo + pos]) if pos < len(cols) and cols[pos] == j else 0.0

    def __repr__(self) -> str:
        return (f"EagerRows(n={self.num_entities}, num_relations={self.num_relations}, device={self.device}, "
                f"prepared={self._stack is not None})")


class LazyRows(RelationRows):
    """A lazy artifact's rows (:class:`kge.lazy.LazyMatrices`), computed on ``device`` when a block needs them.

    Args:
        matrices: the artifact's :class:`~kge.lazy.LazyMatrices`; rows are computed by its twin on
            ``device`` (:meth:`~kge.lazy.LazyMatrices.on`), sharing its row cache and counters.
        device: where rows are computed and the compact stacks live (default ``"cpu"``).
        max_pairs: most (batch row, active head) pairs per block (default :data:`LAZY_MAX_PAIRS`;
            a single row with more is a block of its own).

    A block covers the batch rows of one relation (ascending relation id) and its stack is
    that relation's: when the row cache's merged set of the relation holds every active head,
    the set itself, prepared once (warm: no gather, no transpose per call); otherwise a compact
    stack of exactly the rows of the active heads.  Rows of inactive heads are empty or other
    cached rows of the relation, which changes no score and no argmax (they meet a zero input).
    """

    def __init__(self, *, matrices: "LazyMatrices", device: "str | torch.device" = "cpu",
                 max_pairs: int | None = None) -> None:
        import torch

        self.device = torch.device(device)
        self.matrices = matrices.on(str(self.device))
        self.num_entities = self.matrices.num_entities
        self.num_relations = self.matrices.num_relations
        self.max_pairs = max_pairs
        self._zero_rel: "torch.Tensor | None" = None

    def blocks(self, x: Any, relations: Sequence[int] | np.ndarray) -> Iterator[RowBlock]:
        import torch

        rels = np.asarray(relations, dtype=np.int64).reshape(-1)
        max_pairs = LAZY_MAX_PAIRS if self.max_pairs is None else self.max_pairs
        if isinstance(x, torch.Tensor):
            # a dense batch: its (B, N) support mask, not its (b, h) pairs: a row's heads reach the row cache as
            # an (N,) mask, which a warm relation set checks in one pass (a second hop on FB15k-237 has ~60k
            # active pairs per batch of 16; listing, sorting and searching them was half of the hop).  On the
            # host the comparison runs in numpy on the tensor's memory: torch's ``x > 0`` and its copy out
            # cost a single FB15k-237 query ~19 us, numpy's ~4.
            active: Any = x.detach().numpy() > 0 if x.device.type == "cpu" else (x > 0).cpu().numpy()
            if len(rels) <= 1 or np.count_nonzero(active) <= max_pairs:
                yield from self._blocks(np.arange(len(rels)), rels, active, whole=True)
                return
            counts = np.count_nonzero(active, axis=1)
        else:
            b_np, h_np = active_pairs(x)
            counts = np.bincount(b_np, minlength=len(rels))
            active = (b_np, h_np)
            if int(counts.sum()) <= max_pairs or len(rels) <= 1:
                yield from self._blocks(np.arange(len(rels)), rels, active, whole=True)
                return
        # Consecutive row ranges of at most max_pairs active entries (a row with more is a range of its
        # own); pairs are ordered by row, so each range's pairs are one slice.
        starts = np.concatenate([[0], np.cumsum(counts)])
        lo, total = 0, 0
        for b, cnt in enumerate(counts.tolist() + [None]):
            if cnt is None or (b > lo and total + cnt > max_pairs):
                if isinstance(active, tuple):
                    p0, p1 = starts[lo], starts[b]
                    part: Any = (active[0][p0:p1] - lo, active[1][p0:p1])
                else:
                    part = active[lo:b]
                yield from self._blocks(np.arange(lo, b), rels[lo:b], part, whole=False)
                lo, total = b, 0
            total += cnt or 0

    def _blocks(self, rows: np.ndarray, rels: np.ndarray, active: Any, *, whole: bool) -> Iterator[RowBlock]:
        """One block per distinct relation of batch rows ``rows`` (relations ``rels``), its stack a one-relation
        stack of :meth:`kge.lazy.LazyMatrices.stacks` (warm: the relation's cached set as prepared once).
        ``active``: the rows' (B', N) bool support, or their active pairs ``(b, h)`` (``b`` local to ``rows``)."""
        import torch

        n = self.num_entities
        if not isinstance(active, tuple) and len(rels) and (len(rels) == 1 or bool((rels == rels[0]).all())):
            # one relation (a single query's hop, or a batch sorted by relation): its rows' support as one mask,
            # without the grouping below (np.unique of one relation alone cost ~14 us)
            mask = active[0] if len(rels) == 1 else active.any(axis=0)
            stack = self.matrices.stacks([(int(rels[0]), mask)], self.device)[0]
            yield RowBlock(stack, self._zeros(len(rows)), None if whole else torch.from_numpy(rows).to(self.device))
            return
        uniq, inv = np.unique(rels, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        cuts = np.searchsorted(inv[order], np.arange(len(uniq) + 1), side="left")
        wanted: list[tuple[int, np.ndarray]]
        if not isinstance(active, tuple):
            # per relation, the union of its rows' supports
            masks = active[order] if len(uniq) == len(rels) else np.logical_or.reduceat(active[order], cuts[:-1], axis=0)
            wanted = [(int(r), masks[k]) for k, r in enumerate(uniq.tolist())]
        else:
            b_np, h_np = active
            flat = inv[b_np].astype(np.int64) * n + h_np
            if len(uniq) * n <= 64 * len(flat) + (1 << 20):
                # marks: O(pairs + R'N) without a sort (np.unique's sort of ~100k pairs was a quarter of a warm 2p batch)
                mark = np.zeros(len(uniq) * n, dtype=bool)
                mark[flat] = True
                keys = np.flatnonzero(mark)
            else:
                keys = np.unique(flat)  # sorted by (local relation, head)
            bounds = np.searchsorted(keys // n, np.arange(len(uniq) + 1), side="left")
            wanted = [(int(r), keys[bounds[k] : bounds[k + 1]] % n) for k, r in enumerate(uniq.tolist())]
        stacks = self.matrices.stacks(wanted, self.device)
        if len(uniq) == 1 and whole:
            yield RowBlock(stacks[0], self._zeros(len(rows)), None)
            return
        for k, stack in enumerate(stacks):
            covered = rows[order[cuts[k] : cuts[k + 1]]]
            yield RowBlock(stack, self._zeros(len(covered)), torch.from_numpy(covered).to(self.device))

    def one_hot_rows(self, relations: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # One gather of the B rows from the row cache (computed first when missing).  Through blocks(), a one-hot
        # batch of 16 anchors over 16 relations was 16 kernel calls and their Python: 5x the eager projection
        # of the same batch (one call), where the gather is one pass over the B rows' entries.
        return self.matrices.rows(relations * self.num_entities + heads)

    def _zeros(self, b: int) -> "torch.Tensor":
        """(b,) int64 zeros on the device: every row of a block goes through its one relation."""
        import torch

        z = self._zero_rel
        if z is None or z.numel() < b:
            z = self._zero_rel = torch.zeros(max(b, 64), dtype=torch.int64, device=self.device)
        return z[:b]

    def weight(self, r: int, i: int, j: int) -> float:
        cols, vals = self.matrices.row(r, i)
        pos = int(cols.searchsorted(j))
        return float(vals[pos]) if pos < len(cols) and cols[pos] == j else 0.0

    def relation(self, r: int) -> "StackedMatrices":
        """All N rows of ``M_r``, computed now (not through the row cache) and prepared on :attr:`device`."""
        import ops

        return ops.prepare_matrices(csr_tensor(self.matrices.relation_block(r), self.device))

    def __repr__(self) -> str:
        return f"LazyRows({self.matrices!r})"
