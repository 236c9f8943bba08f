"""The sharded executor: one rank's part of a query batch, bit-identical to the single-process executor.

Layout: the N entities are cut into P contiguous blocks (:func:`kge.sharding.block_bounds`, about
equal entries each); rank
k holds the entries of every relation whose *tail* lies in its block ``[lo, hi)``
(:class:`kge.sharding.ColumnShard`, a hypersparse CSR) and every node value of a batch as its
``(B, N_k)`` block of columns.

* Anchors: the one-hot's column on the rank owning the anchor.  A projection of anchors needs no
  exchange (every rank knows them): each rank reads its block of ``M_r[anchor, :]`` from its shard.
* Intersection, union, complement (``1 - x``): pointwise, local (the executor's own code).
* Projection ``p`` / negated projection ``np`` (:meth:`ShardedExecutor._project_rows`): every
  rank gathers the active input entries of all ranks, sparse ``(row, entity, value)`` triples
  (12 bytes each) or, when that is more bytes, the dense ``(B, N_k)`` blocks (4 bytes a cell):
  the rule is the byte count, ``12 * max_k nnz_k`` against ``4 * B * max_k N_k`` (gloo pads
  each rank's part to the largest).  Each relation of the batch is one kernel call
  (``ops.project``) on the relation's prepared block (:meth:`ShardRows.relation`): its rows are
  the relation's heads with an entry here (ascending ids, so the kernel's smallest-index tie rule
  picks the same witness as over all N), its columns its tails here; the CSR is a slice of the shard
  and the transpose is built once, on first use, so a hop copies nothing of the matrices.  The
  output goes to the tails' columns of ``Y[:, lo:hi]``: the same float32 products and maxima as the
  single-process kernel, so the same bits.
* Top-k: a local top-k per rank, one all-gather, and a stable merge (ties by smaller id, as
  :func:`engine.exec.executor._topk_stable`).
* Explanations: the backward pass needs, per node and answer, the value, the witness (argmax)
  and the atom's weight ``M_r[src, ent]``; the rank owning ``ent`` knows all three (its tail
  is local).  They are fetched node by node (one all-gather per query-tree node and batch),
  then :meth:`Executor._explain <engine.exec.executor.Executor._explain>` builds the same
  :class:`~engine.exec.explain.Explanation` trees as one process.

Lazy artifacts: :class:`engine.exec.sharded_lazy.LazyShardRows` stands in for :class:`ShardRows`,
computing a hop's rows (this block's columns, the softmax normaliser from one exchange) before the
same kernel calls.

Hooks (the LLM bridge): :meth:`ShardedExecutor._apply_hooks` runs them once, on rank 0, over the
node's gathered values, and broadcasts what they changed (entries, evidence, annotations); each
rank writes its own columns.

* Frontier cut (``frontier_k``, :meth:`ShardedExecutor._frontier_cut`): before a projection, each
  rank's ``k`` best positive entries of its block, one all-gather, the same stable merge as top-k; each
  rank keeps its own survivors: the entries one process's ``ops.topk_prune`` keeps (ties: smaller ids).

Not sharded yet (one clear error each): CUDA devices (NCCL), sparse sets, kept trace values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence, cast

import numpy as np
import torch

import ops
from kge.rows import RowBlock
from kge.sharding import ColumnShard, LazyShard
from kgreason.errors import UserError

from engine.exec.executor import Executor, QueryResult, _topk_stable, _Witness, dense_one_hot_projection
from engine.exec.hooks import _NO_EVIDENCE, NodeValue
from engine.lang import optable
from engine.lang.query import Node

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

    from engine.exec.sharded_comm import Comm

__all__ = ["ShardedExecutor", "ShardRows"]


class _RelBlock(NamedTuple):
    """Relation r's entries in this shard as the kernel reads them: a one-relation stack over compact ids.

    Row ``a`` is head ``heads[a]`` (global id), column ``c`` is tail ``tails[c]`` (local id); the stack is
    ``n x n`` with ``n = max(len(heads), len(tails))`` (padding rows and columns empty).  Its CSR shares
    the shard's ``col`` and ``val`` slices; the transpose is its own.
    """

    stack: "ops.StackedMatrices"
    #: -1, then the heads (int32): ``heads_or_none[a + 1]`` maps a kernel witness ``a`` (-1: none) to an entity id
    heads_or_none: torch.Tensor
    tails: torch.Tensor


def relation_block(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, heads: torch.Tensor, tails: torch.Tensor,
                   r: int, device: torch.device) -> _RelBlock:
    """A relation's entries here as a prepared :class:`_RelBlock`: rows ``heads`` (ascending global ids) with CSR
    pointers ``crow`` (from 0), columns ``col`` (indices into ``tails``, local ids ascending) and values ``val``."""
    rows, e = int(heads.numel()), int(val.numel())
    n = max(rows, int(tails.numel()))
    small = e < 2**31  # int32 pointers when they fit: half the bytes of the two pointer arrays
    ptr = torch.full((n + 1,), e, dtype=torch.int32 if small else torch.int64, device=device)
    ptr[: rows + 1] = crow
    stack = ops.prepare_matrices((ptr, col, val), num_entities=n, name=f"shard relation {r}")
    return _RelBlock(stack, torch.cat([torch.full((1,), -1, dtype=torch.int32, device=device), heads.to(torch.int32)]),
                     tails)


class ShardRows:
    """This rank's :class:`~kge.sharding.ColumnShard` on a device, as the sharded projection reads it.

    :meth:`relation` gives relation r's entries as a prepared one-relation stack (:class:`_RelBlock`),
    built on first use and kept: a relation's rows are contiguous in the shard and its ``col`` are
    already indices into its tails, so the CSR is a view and only the transpose is computed (once).
    :meth:`weight` answers for tails of the block from the shard, and for other tails from
    :attr:`fetched` (what the owners sent for the answers being explained).
    """

    def __init__(self, shard: ColumnShard, device: torch.device) -> None:
        self.shard = shard
        self.num_entities = shard.num_entities
        self.num_relations = shard.num_relations
        self.device = device
        self.keys = torch.from_numpy(shard.keys).to(device)
        self.ptr = torch.from_numpy(shard.ptr).to(device)
        self.col = torch.from_numpy(shard.col).to(device)
        self.val = torch.from_numpy(shard.val).to(device)
        self.tails = torch.from_numpy(shard.tails).to(device)
        self.tail_ptr = shard.tail_ptr.tolist()
        n = self.num_entities
        #: relation r's rows are keys[rel_start[r]:rel_start[r+1]]
        self.rel_start = torch.searchsorted(self.keys, torch.arange(self.num_relations + 1, device=device) * n)
        self._starts = self.rel_start.tolist()
        self._blocks: dict[int, _RelBlock | None] = {}
        self.fetched: dict[tuple[int, int, int], float] = {}

    def weight(self, r: int, i: int, j: int) -> float:
        if self.shard.lo <= j < self.shard.hi:
            return self.shard.weight(r, i, j)
        return self.fetched[(int(r), int(i), int(j))]

    def relation(self, r: int) -> _RelBlock | None:
        """Relation ``r``'s block (``None``: no entry of r has its tail here); prepared once, then cached."""
        if r in self._blocks:
            return self._blocks[r]
        k0, k1 = self._starts[r], self._starts[r + 1]
        block = None
        if k1 > k0:
            e0, e1 = int(self.ptr[k0]), int(self.ptr[k1])
            block = relation_block(self.ptr[k0:k1 + 1] - e0, self.col[e0:e1], self.val[e0:e1],
                                   self.keys[k0:k1] - r * self.num_entities,
                                   self.tails[self.tail_ptr[r]:self.tail_ptr[r + 1]].long(), r, self.device)
        self._blocks[r] = block
        return block

    def relations(self, rels: list[int], heads: list[torch.Tensor] | None) -> list[_RelBlock | None]:
        """The blocks of relations ``rels`` (all their rows here: ``heads``, the hop's active heads, is not needed)."""
        return [self.relation(r) for r in rels]

    def anchor_entries(self, rels: np.ndarray, ents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The entries here of rows ``M_{rels[b]}[ents[b], :]``: ``(counts (b,), local columns, values)`` in batch order."""
        shard = self.shard
        b = len(rels)
        keys = shard.keys
        key = rels * self.num_entities + ents
        t = np.searchsorted(keys, key)
        tc = np.minimum(t, max(keys.size - 1, 0))
        found = (t < keys.size) & (keys[tc] == key) if keys.size else np.zeros(b, dtype=bool)
        ptr = shard.ptr
        start = np.where(found, ptr[tc], 0)
        cnt = np.where(found, ptr[np.minimum(tc + 1, ptr.size - 1)] - start, 0)
        total = int(cnt.sum())
        rep = np.repeat(np.arange(b, dtype=np.int64), cnt)
        pos = np.repeat(start - (np.cumsum(cnt) - cnt), cnt) + np.arange(total, dtype=np.int64)
        return cnt, shard.tails[shard.tail_ptr[rels[rep]] + shard.col[pos]], shard.val[pos]

    def prepare_all(self) -> None:
        """Prepare every relation's block now (what a benchmark does before timing, as one process prepares its stack)."""
        for r in range(self.num_relations):
            self.relation(r)

    @property
    def nbytes(self) -> int:
        """Bytes of the shard plus the prepared blocks' own arrays (pointers and transposes)."""
        own = sum(int(b.stack.crow.nbytes + b.stack.tcrow.nbytes + b.stack.trow.nbytes + b.stack.tval.nbytes
                      + b.heads_or_none.nbytes) for b in self._blocks.values() if b is not None)
        return self.shard.nbytes + own


class _Cells:
    """``cells[(row, entity)]``: the few values of a node the backward pass reads (fetched from their owners)."""

    def __init__(self, cells: dict[tuple[int, int], Any]) -> None:
        self.cells = cells

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.cells[key]


class _Hop(NamedTuple):
    """What one projection moved: bytes this rank received, and whether the frontier went dense."""

    nbytes: int
    dense: bool
    active: int


def _node_at(root: Node, path: tuple[int, ...]) -> Node:
    node = root
    for k in path:
        node = node.children()[k]
    return node


class ShardedExecutor(Executor):
    """An :class:`~engine.exec.executor.Executor` over one rank's column shard (see the module doc).

    Args:
        artifact: the KG's names (an :class:`~kge.artifact.Artifact`; its matrices are not read).
        shard: this rank's :class:`~kge.sharding.ColumnShard` (rank and shard count = the group's).
        comm: the group (:class:`engine.exec.sharded_comm.Comm`).
        executor_kwargs: as :class:`Executor` (``tnorm``, ``neg_scale``, ``device``, ``backend``,
            ``pass_rows``, ``hooks``, ``frontier_k``); ``sparse`` and ``rows`` are refused.

    Every public method is collective: all ranks call it with the same queries and arguments.
    ``answer`` returns the same results on every rank; ``scores`` the full (Q, N) scores on every
    rank (all blocks gathered).  :attr:`hops` lists, per projection, what this rank received.
    """

    def __init__(self, artifact: "Artifact", shard: "ColumnShard | LazyShard", comm: "Comm", *,
                 row_cache_gb: float | None = None, **executor_kwargs: Any) -> None:
        for key, what in (("sparse", "sparse sets"), ("rows", "rows")):
            if executor_kwargs.get(key):
                raise UserError(f"{what}: not available in a sharded run yet; run one process")
        executor_kwargs = {k: v for k, v in executor_kwargs.items() if k not in ("sparse", "rows")}
        if (comm.rank, comm.size) != (shard.rank, shard.shards):
            raise UserError(f"shard {shard.rank} of {shard.shards} given to rank {comm.rank} of {comm.size}")
        if (shard.num_entities, shard.num_relations) != (artifact.num_entities, artifact.num_relations):
            raise UserError(f"the shard has {shard.num_entities} entities and {shard.num_relations} relations; "
                            f"the KG's names {artifact.num_entities} and {artifact.num_relations}")
        device = torch.device(executor_kwargs.get("device", "cpu"))
        if device.type != "cpu":
            # The exchanges stage small host tensors (sizes, status, explained cells), which NCCL does not
            # take, and no multi-GPU machine has run this yet: refused rather than untested.
            raise UserError(f"device {device}: sharded runs are CPU-only (gloo) in this version; use --device cpu")
        rows: Any
        if isinstance(shard, LazyShard):
            from engine.exec.sharded_lazy import LazyShardRows

            rows = LazyShardRows(shard, comm, device, relation_block, **({} if row_cache_gb is None else {"row_cache_gb": row_cache_gb}))
        else:
            rows = ShardRows(shard, device)
        super().__init__(artifact, rows=cast(Any, rows), **executor_kwargs)
        self.shard = shard
        self.comm = comm
        self.lo, self.hi = shard.lo, shard.hi
        self.width = shard.hi - shard.lo
        self.bounds = list(shard.bounds)
        self._widths = [b - a for a, b in zip(self.bounds, self.bounds[1:])]
        self._bounds_t = torch.tensor(self.bounds[1:], dtype=torch.int64)
        self.hops: list[_Hop] = []

    # ------------------------------------------------------------------------------------ hooks
    def _full_value(self, value: NodeValue) -> NodeValue:
        """``value`` with every rank's columns (collective): values and witnesses gathered, evidence and annotations
        as they are (the same on every rank: :meth:`_apply_hooks` broadcasts them)."""
        arg = None
        if value.argmax is not None:
            arg = self.gather_columns(value.argmax.view(torch.float32)).view(torch.int32)  # the bits travel as they are
        return NodeValue(self.gather_columns(value.values), arg, value.evidence, value.row_evidence, value.annotations)

    def _apply_hooks(self, hooks: list, nodes: list[Node], path: tuple[int, ...], op: str, rels, ents, inputs: Any,
                     value: NodeValue, run: Any) -> NodeValue:
        """The hooks run once, on rank 0, over the node's full values (every rank's block gathered, the children's
        too): an LLM hook makes its prompts and calls the LLM once.  What they changed, the (row, entity, value)
        entries, the witnesses changed, and the evidence and annotations, is broadcast; every rank writes the
        entries of its own columns into its block.  A hook's error ends the run on every rank with its message."""
        kids = inputs() if callable(inputs) else tuple(inputs)
        full_kids = tuple(self._full_value(k) for k in kids)
        full = self._full_value(value)
        msg: Any = None
        if self.comm.rank == 0:
            try:
                out = Executor._apply_hooks(self, hooks, nodes, path, op, rels, ents, full_kids, full, run)
                rows, cols = (out.values != full.values).nonzero(as_tuple=True)
                arg = None
                if out.argmax is not None:
                    ar, ac = (out.argmax != full.argmax).nonzero(as_tuple=True) if full.argmax is not None else \
                        torch.ones_like(out.argmax, dtype=torch.bool).nonzero(as_tuple=True)
                    arg = (ar, ac, out.argmax[ar, ac])
                msg = ("ok", rows, cols, out.values[rows, cols], arg, out.argmax is None,
                       tuple(dict(e) if e else None for e in out.evidence),  # read-only mappings do not pickle
                       out.row_evidence, dict(out.annotations))
            except Exception as exc:  # noqa: BLE001 (sent to the other ranks, then raised here as it was)
                self.comm.broadcast_object(("error", f"{type(exc).__name__}: {exc}" if not isinstance(exc, UserError)
                                            else str(exc)), "hook results")
                raise
        got = self.comm.broadcast_object(msg, "hook results")
        if got[0] == "error":
            raise UserError(f"rank 0: {got[1]}")
        _, rows, cols, vals, arg, no_arg, evidence, row_evidence, annotations = got
        mine = (cols >= self.lo) & (cols < self.hi)
        y = value.values.clone()
        y[rows[mine], cols[mine] - self.lo] = vals[mine]
        a = None if no_arg else value.argmax.clone() if value.argmax is not None else \
            torch.full_like(y, -1, dtype=torch.int32)
        if a is not None and arg is not None:
            ar, ac, av = arg
            m = (ac >= self.lo) & (ac < self.hi)
            a[ar[m], ac[m] - self.lo] = av[m]
        return NodeValue(y, a, tuple(_NO_EVIDENCE if e is None else e for e in evidence), row_evidence, annotations)

    # ----------------------------------------------------------------------------- forward pass
    def _one_hot(self, ents: Sequence[int]) -> torch.Tensor:
        """The anchors' one-hot rows, this block's columns only."""
        b = len(ents)
        y = torch.zeros(b, self.width, dtype=torch.float32, device=self.device)
        e = torch.tensor(list(ents), dtype=torch.int64, device=self.device)
        mine = (e >= self.lo) & (e < self.hi)
        y[torch.arange(b, device=self.device)[mine], e[mine] - self.lo] = 1.0
        return y

    def _gather_frontier(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every rank's active entries of ``x`` (B, N_k): ``(rows, entities (global), values)``, entities ascending per row... in rank order."""
        b = x.shape[0]
        rows, cols = (x > 0).nonzero(as_tuple=True)
        vals = x[rows, cols]
        comm = self.comm
        before = sum(comm.received.values())
        counts = comm.sizes(int(vals.numel()), "frontier sizes")
        dense = 12 * max(counts) > 4 * b * max(self._widths)
        if not dense:
            pack = torch.stack([rows.to(torch.int32), (cols + self.lo).to(torch.int32), vals.view(torch.int32)], 1)
            got = torch.cat(comm.all_gather_rows(pack, "frontier", sizes=counts))
            g_rows, g_ents, g_vals = got[:, 0].long(), got[:, 1].long(), got[:, 2].contiguous().view(torch.float32)
        else:
            pad = x.new_zeros(b, max(self._widths))
            pad[:, : self.width] = x
            full = torch.cat([p[:, :w] for p, w in zip(comm.all_gather(pad, "frontier dense"), self._widths)], 1)
            g_rows, g_ents = (full > 0).nonzero(as_tuple=True)
            g_vals = full[g_rows, g_ents]
        self.hops.append(_Hop(sum(comm.received.values()) - before, dense, 0))
        return g_rows, g_ents, g_vals

    def _frontier_cut(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """``ops.topk_prune`` over all ranks' blocks (collective): each row keeps its ``k`` largest entries of all N
        (ties at the cut: smaller ids), each rank its own of them.

        A kept positive entry is among its rank's ``k`` largest positive entries, so every rank sends
        only those (``ops.topk_prune`` on its block, O(N_k)): one all-gather of (B, 2k) int64, and the stable
        merge of :meth:`_top_k` picks the same ``k`` as one process's cut.  Zeros need no choosing (kept or
        not, they stay 0).  The values are copied, not recomputed: the same bits.
        """
        b = x.shape[0]
        kl = min(k, self.width)
        local = self.ops.topk_prune(x, kl)
        rows, cols = (local > 0).nonzero(as_tuple=True)  # row-major: ids ascending within a row
        vals = local[rows, cols]
        per_row = torch.bincount(rows, minlength=b)
        slot = torch.arange(rows.numel(), device=x.device) - (torch.cumsum(per_row, 0) - per_row)[rows]  # place in row
        cand_v = torch.full((b, k), -1.0, dtype=torch.float32, device=x.device)
        cand_i = torch.full((b, k), self.num_entities, dtype=torch.int64, device=x.device)
        cand_v[rows, slot], cand_i[rows, slot] = vals, cols + self.lo
        # a stable sort by value keeps equal values in id order (the merge's tie rule)
        cand_v, order = torch.sort(cand_v, dim=1, descending=True, stable=True)
        top_v, top_i = self._merge_top(cand_v, torch.gather(cand_i, 1, order), k, "frontier top-k")
        mine = (top_v > 0) & (top_i >= self.lo) & (top_i < self.hi)
        r, c = mine.nonzero(as_tuple=True)
        keep = top_i[r, c] - self.lo
        out = torch.zeros_like(x)
        out[r, keep] = x[r, keep]
        return out

    def _project_one_hot(self, ents: Sequence[int], rels: Sequence[int], want_arg: bool, negated: bool, *,
                         keep_sparse: bool):
        """One-hot rows (anchors, value 1): every rank knows the anchors, so its block of ``M_r[anchor, :]`` comes
        from its own shard, with no exchange and no kernel call (:meth:`Executor._project_one_hot
        <engine.exec.executor.Executor._project_one_hot>`'s float32 formulas: the kernel's bits).  Always dense."""
        rows_obj = cast(ShardRows, self.rows)
        b, w = len(rels), self.width
        cnt, local, vals = rows_obj.anchor_entries(np.asarray(rels, dtype=np.int64), np.asarray(ents, dtype=np.int64))
        rep = np.repeat(np.arange(b, dtype=np.int64), cnt)
        return dense_one_hot_projection(rep * w + local, vals, cnt, ents, b, w, negated=negated, want_arg=want_arg,
                                        neg_scale=self.neg_scale, device=self.device)

    def _project_rows(self, x: Any, rels: list[int], negated: bool, want_arg: bool,
                      strategy: str = "auto", *, keep_sparse: bool = False):
        """Row ``b`` of the block ``x`` (B, N_k) through relation ``rels[b]``: this block of ``(y, argmax)``.

        Gathers the frontier (:meth:`_gather_frontier`).  The rows are grouped by relation; a group's
        frontier entries on the relation's heads here become the compact input ``(rows, heads)`` of the
        relation's prepared block (:meth:`ShardRows.relation`: heads ascending, so the kernel's
        smallest-index tie rule picks the same witness as over all N), one kernel call per group, and
        its ``(rows, tails)`` output is written to the tails' columns.  Nothing of the matrices is
        copied per hop.  Negated (``1 - min(1, s M)``, factor 1 off the support): active entities
        without an entry here and columns without one are out of every support, so the row's largest
        such value (smallest id on ties) is merged in, as the single-process kernel's maximum over all i.
        """
        b = x.shape[0]
        dev = self.device
        big_n = self.num_entities
        rows_obj = cast(ShardRows, self.rows)
        if self.frontier_k is not None and self.frontier_k < big_n:
            x = self._frontier_cut(x, self.frontier_k)
        g_rows, g_ents, g_vals = self._gather_frontier(x)
        self.hops[-1] = self.hops[-1]._replace(active=int(g_vals.numel()))
        rel_t = torch.tensor(rels, dtype=torch.int64, device=dev)
        uniq, inv = torch.unique(rel_t, return_inverse=True)
        e_group = inv[g_rows]
        heads_of = None
        if getattr(rows_obj, "lazy", False):  # lazy rows are computed for the hop's active heads (collective)
            hk = torch.unique(e_group * big_n + g_ents)
            heads_of = list(torch.split(hk % big_n, torch.bincount(hk // big_n, minlength=len(uniq)).tolist()))
        blocks = rows_obj.relations(uniq.tolist(), heads_of)
        order = torch.argsort(inv, stable=True)  # batch rows by group
        counts = torch.bincount(inv, minlength=len(blocks))
        pos = torch.empty_like(order)
        pos[order] = torch.arange(b, device=dev) - (torch.cumsum(counts, 0) - counts)[inv[order]]  # row within group
        e_order = torch.argsort(e_group, stable=True)  # the gathered entries by group, then row, then entity
        e_counts = torch.bincount(e_group, minlength=len(blocks))
        if negated:
            # a column without an entry here is out of every support, and so is an active head without entries
            all_val, all_id = self._row_max(b, g_rows, g_ents, g_vals)
            y = all_val.unsqueeze(1).repeat(1, self.width)
            arg = torch.where(all_val > 0, all_id, -1).to(torch.int32).unsqueeze(1).repeat(1, self.width) \
                if want_arg else None
        else:
            y = torch.zeros(b, self.width, dtype=torch.float32, device=dev)
            arg = torch.full((b, self.width), -1, dtype=torch.int32, device=dev) if want_arg else None
        rel0 = torch.zeros(b, dtype=torch.int64, device=dev)
        counts_l, e_counts_l = counts.tolist(), e_counts.tolist()
        first = e_first = 0
        for g, blk in enumerate(blocks):  # one kernel call per relation, its output written to its tails' columns
            c_g, rows_g = counts_l[g], order[first:first + counts_l[g]]
            sel = e_order[e_first:e_first + e_counts_l[g]]
            first, e_first = first + c_g, e_first + e_counts_l[g]
            if blk is None:
                continue
            # the group's frontier on the relation's heads here: compact rows (heads ascending, as ids)
            heads = blk.heads_or_none[1:]
            ents, e_rows, vals = g_ents[sel], g_rows[sel], g_vals[sel]
            at = torch.searchsorted(heads, ents)
            found = heads[at.clamp(max=heads.numel() - 1)] == ents
            if not bool(found.any()):
                # no active head with an entry here: the kernel would add nothing (plain: zeros; negated: every
                # active entity is out of every support, which the row maximum already holds)
                continue
            n_g = blk.stack.n
            xc = torch.zeros(c_g, n_g, dtype=torch.float32, device=dev)
            xc[pos[e_rows[found]], at[found]] = vals[found]
            yk, ak = self.ops.project(xc, RowBlock(blk.stack, rel0[:c_g]), negated, self.neg_scale, want_arg,
                                      strategy, None)
            nt = blk.tails.numel()
            yk = yk[:, :nt]
            akg = None if ak is None else blk.heads_or_none[ak[:, :nt].long() + 1]  # compact row -> entity id
            if negated:
                off_val, off_id = self._row_max(b, e_rows[~found], ents[~found], vals[~found])
                c = off_val[rows_g].unsqueeze(1)
                v = torch.maximum(yk, c)
                if akg is not None:
                    ic = off_id[rows_g].unsqueeze(1)
                    ka = torch.where(akg >= 0, akg, big_n)
                    w = torch.where(yk > c, ka, torch.where(c > yk, ic, torch.minimum(ka, ic)))
                    akg = torch.where(v > 0, w, -1).to(torch.int32)
                yk = v
            idx = (rows_g.unsqueeze(1), blk.tails)
            y[idx] = yk
            if arg is not None:
                arg[idx] = akg
        return y, arg

    @staticmethod
    def _row_max(b: int, rows: torch.Tensor, ents: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the largest of the given values (0 without any) and the smallest entity id reaching it
        (2**62 where there is none)."""
        best = torch.zeros(b, dtype=torch.float32, device=vals.device)
        best.scatter_reduce_(0, rows, vals, "amax")
        ids = torch.full((b,), 2**62, dtype=torch.int64, device=vals.device)
        hit = vals == best[rows]
        ids.scatter_reduce_(0, rows[hit], ents[hit], "amin")
        return best, ids

    def gather_columns(self, y: torch.Tensor) -> torch.Tensor:
        """The full (B, N) tensor from every rank's (B, N_k) block (collective)."""
        pad = y.new_zeros(y.shape[0], max(self._widths))
        pad[:, : self.width] = y
        return torch.cat([p[:, :w] for p, w in zip(self.comm.all_gather(pad, "scores"), self._widths)], 1)

    # ------------------------------------------------------------------------------ public API
    def iter_scores(self, queries: Sequence[Node], *, batch_size: int = 1024, progress: bool = False,
                    trace: bool = False, trace_values: bool = False) -> Iterator[tuple]:
        """As :meth:`Executor.iter_scores`, the scores of all N entities on every rank (collective)."""
        if trace_values:
            raise UserError("trace_values: not available in a sharded run yet (node values are split across ranks)")
        for item in super().iter_scores(queries, batch_size=batch_size, progress=progress, trace=trace):
            yield (item[0], self.gather_columns(item[1]), *item[2:])

    def block_scores(self, queries: Sequence[Node], *, batch_size: int = 1024) -> torch.Tensor:
        """This rank's columns ``[lo, hi)`` of :meth:`scores`: (len(queries), N_k) float32 in input order (collective;
        nothing is gathered)."""
        out = torch.zeros(len(queries), self.width, dtype=torch.float32, device=self.device)
        for idx, y in Executor.iter_scores(self, queries, batch_size=batch_size):
            out[torch.tensor(idx, device=self.device)] = y
        return out

    def _top_k(self, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` of every row over all ranks' blocks (ties: smaller id): local top-k, one gather, a stable merge."""
        b = y.shape[0]
        kl = min(k, self.width)
        vals, ids = _topk_stable(y, kl)
        pad_v = torch.full((b, k), -1.0, dtype=torch.float32, device=y.device)
        pad_i = torch.full((b, k), self.num_entities, dtype=torch.int64, device=y.device)
        pad_v[:, :kl] = vals
        pad_i[:, :kl] = ids + self.lo
        return self._merge_top(pad_v, pad_i, k, "top-k")

    def _merge_top(self, vals: torch.Tensor, ids: torch.Tensor, k: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The global top-``k`` (B, k) from every rank's ``(vals, ids)`` (B, k): sorted descending, equal values in
        id order, global ids (padding: -1 and N).  One all-gather and a stable merge (collective)."""
        pack = torch.cat([vals.view(torch.int32).to(torch.int64), ids], 1)  # one exchange for both
        got = self.comm.all_gather(pack, kind)
        all_v = torch.cat([g[:, :k].to(torch.int32).view(torch.float32) for g in got], 1)
        all_i = torch.cat([g[:, k:] for g in got], 1)
        # Rank order is id order: a stable sort of the concatenation keeps ties by smaller id.
        v, pos = torch.sort(all_v, dim=1, descending=True, stable=True)
        return v[:, :k], torch.gather(all_i, 1, pos[:, :k])

    def _witness_record(self, batch: list[Node], record: dict, top_vals: np.ndarray, top_ids: np.ndarray) -> dict:
        """The backward pass's inputs, fetched from the owners: per node, the (row, entity) cells it will read.

        Walks the query tree from the root: the answers at the root; a projection's source
        (its witness, where its value is positive) at its child; the same entity at the children of
        ``i``/``u``/``n``.  One all-gather per node; every rank ends with the same cells.
        """
        rows_obj = cast(ShardRows, self.rows)
        rows_obj.fetched = {}
        need: dict[tuple[int, ...], list[tuple[int, int]]] = {
            (): [(r, int(e)) for r in range(len(batch)) for v, e in zip(top_vals[r], top_ids[r]) if v > 0]}
        out: dict[tuple[int, ...], _Witness] = {}
        queue: list[tuple[int, ...]] = [()]
        while queue:
            path = queue.pop(0)
            items = sorted(set(need.get(path, [])))
            nodes = [_node_at(root, path) for root in batch]
            entry = optable.lookup(type(nodes[0]))
            value = record[path]
            relational = entry.shape == "relation"
            n_items = len(items)
            buf = torch.zeros(n_items, 3, dtype=torch.int32)
            ents = torch.tensor([e for _, e in items], dtype=torch.int64)
            if n_items:
                rws = torch.tensor([r for r, _ in items], dtype=torch.int64)
                own = ((ents >= self.lo) & (ents < self.hi)).nonzero(as_tuple=True)[0]
                lr, le = rws[own], ents[own] - self.lo
                buf[own, 0] = value.values.cpu()[lr, le].view(torch.int32)
                if relational and value.argmax is not None:
                    src = value.argmax.cpu()[lr, le]
                    buf[own, 1] = src
                    w = [rows_obj.weight(int(nodes[int(r)].relation), int(s), int(e) + self.lo) if s >= 0 else 0.0
                         for r, s, e in zip(lr.tolist(), src.tolist(), le.tolist())]
                    buf[own, 2] = torch.tensor(w, dtype=torch.float32).view(torch.int32)
            got = torch.stack(self.comm.all_gather(buf, "explain"))
            owner = torch.searchsorted(self._bounds_t, ents, right=True)
            merged = got[owner, torch.arange(n_items)] if n_items else buf
            vals = merged[:, 0].contiguous().view(torch.float32).numpy()
            srcs = merged[:, 1].numpy()
            wts = merged[:, 2].contiguous().view(torch.float32).numpy()
            cells = {it: vals[k] for k, it in enumerate(items)}
            argcells = None
            if relational and value.argmax is not None:
                argcells = {it: srcs[k] for k, it in enumerate(items)}
                for k, (r, e) in enumerate(items):
                    if srcs[k] >= 0:
                        rows_obj.fetched[(int(nodes[r].relation), int(srcs[k]), e)] = float(wts[k])
            out[path] = _Witness(cast(Any, _Cells(cells)), cast(Any, None if argcells is None else _Cells(argcells)),
                                 value.evidence, value.row_evidence)
            kids = nodes[0].children()
            if not kids:
                continue
            if relational:
                need[path + (0,)] = [(r, int(srcs[k])) for k, (r, _) in enumerate(items)
                                     if srcs[k] >= 0 and vals[k] > 0]
                queue.append(path + (0,))
            else:
                for c in range(len(kids)):
                    need[path + (c,)] = list(items)
                    queue.append(path + (c,))
        return out

    def _run_batch(self, roots: list[Node], idx: list[int], **kwargs: Any) -> tuple[NodeValue, Any]:
        begin = getattr(self.rows, "begin_batch", None)
        if begin is not None:  # lazy rows: the bounded normaliser table is trimmed between batches (sharded_lazy)
            begin()
        return super()._run_batch(roots, idx, **kwargs)

    def answer(self, queries: Sequence[Node], *, k: int = 10, explain: bool = True,
               batch_size: int = 256, trace_values: bool = False) -> list[QueryResult]:
        """As :meth:`Executor.answer` (collective; the same results on every rank)."""
        if trace_values:
            raise UserError("trace_values: not available in a sharded run yet (node values are split across ranks)")
        return super().answer(queries, k=k, explain=explain, batch_size=batch_size)
