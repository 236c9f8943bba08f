"""The sharded executor: one rank's part of a query batch, bit-identical to the single-process executor.

Layout: the N entities are cut into P contiguous blocks (:func:`kge.sharding.block_bounds`, about
equal entries each); rank
k holds the entries of every relation whose *tail* lies in its block ``[lo, hi)``
(:class:`kge.sharding.ColumnShard`, a hypersparse CSR) and every node value of a batch as its
``(B, N_k)`` block of columns.

* Anchors: the one-hot's column on the rank owning the anchor.
* Intersection, union, complement (``1 - x``): pointwise, local (the executor's own code).
* Projection ``p`` / negated projection ``np`` (:meth:`ShardedExecutor._project_rows`): every
  rank gathers the active input entries of all ranks, sparse ``(row, entity, value)`` triples
  (12 bytes each) or, when that is more bytes, the dense ``(B, N_k)`` blocks (4 bytes a cell):
  the rule is the byte count, ``12 * max_k nnz_k`` against ``4 * B * max_k N_k`` (gloo pads
  each rank's part to the largest).  The A active entities (sorted, so the kernel's
  smallest-index tie rule picks the same witness as over all N) become the rows of a compact
  stack of this rank's entries of the batch's relations, and the existing kernel
  (``ops.project``) computes the block's ``Y[:, lo:hi]`` and argmax: the same float32 products
  and maxima as the single-process kernel, so the same bits.
* Top-k: a local top-k per rank, one all-gather, and a stable merge (ties by smaller id, as
  :func:`engine.exec.executor._topk_stable`).
* Explanations: the backward pass needs, per node and answer, the value, the witness (argmax)
  and the atom's weight ``M_r[src, ent]``; the rank owning ``ent`` knows all three (its tail
  is local).  They are fetched node by node (one all-gather per query-tree node and batch),
  then :meth:`Executor._explain <engine.exec.executor.Executor._explain>` builds the same
  :class:`~engine.exec.explain.Explanation` trees as one process.

Not sharded yet (one clear error each): CUDA devices (NCCL), hooks (the LLM bridge), ``frontier_k``,
sparse sets, kept trace values, lazy artifacts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Sequence, cast

import numpy as np
import torch

import ops
from kge.rows import RowBlock
from kge.sharding import ColumnShard
from kgreason.errors import UserError

from engine.exec.executor import Executor, QueryResult, _topk_stable, _Witness
from engine.lang import optable
from engine.lang.query import Node

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

    from engine.exec.sharded_comm import Comm

__all__ = ["ShardedExecutor", "ShardRows"]


class ShardRows:
    """This rank's :class:`~kge.sharding.ColumnShard` on a device, as the sharded projection reads it.

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
        self.fetched: dict[tuple[int, int, int], float] = {}

    def weight(self, r: int, i: int, j: int) -> float:
        if self.shard.lo <= j < self.shard.hi:
            return self.shard.weight(r, i, j)
        return self.fetched[(int(r), int(i), int(j))]

    def compact_stack(self, keys: torch.Tensor, slots: torch.Tensor, relations: int, n: int) -> "ops.StackedMatrices":
        """A (relations * n, n) stack whose row ``slots[t]`` is this shard's row ``keys[t]`` (``r*N + i``; local columns).

        Rows not in ``slots`` are empty.  Cost: a binary search per key plus the entries read;
        nothing per entity of the KG.
        """
        dev = self.device
        lens = torch.zeros(relations * n, dtype=torch.int64, device=dev)
        if self.keys.numel() and keys.numel():
            t = torch.searchsorted(self.keys, keys)
            tc = t.clamp(max=self.keys.numel() - 1)
            found = (t < self.keys.numel()) & (self.keys[tc] == keys)
            start = self.ptr[tc]
            cnt = torch.where(found, self.ptr[tc + 1] - start, torch.zeros_like(start))
            lens[slots] = cnt
        else:
            start = cnt = torch.zeros(0, dtype=torch.int64, device=dev)
        crow = torch.zeros(relations * n + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lens, 0, out=crow[1:])
        total = int(crow[-1])
        if total:
            # slots ascend with t (pairs sorted by group, then entity), so the entries follow crow's order
            first = torch.cumsum(cnt, 0) - cnt
            pos = torch.repeat_interleave(start - first, cnt, output_size=total) + torch.arange(total, device=dev)
            col, val = self.col[pos], self.val[pos]
        else:
            col = torch.zeros(0, dtype=torch.int32, device=dev)
            val = torch.zeros(0, dtype=torch.float32, device=dev)
        return ops.prepare_matrices((crow, col, val), num_entities=n)


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
            ``pass_rows``); ``hooks``, ``frontier_k``, ``sparse`` and ``rows`` are refused.

    Every public method is collective: all ranks call it with the same queries and arguments.
    ``answer`` returns the same results on every rank; ``scores`` the full (Q, N) scores on every
    rank (all blocks gathered).  :attr:`hops` lists, per projection, what this rank received.
    """

    def __init__(self, artifact: "Artifact", shard: ColumnShard, comm: "Comm", **executor_kwargs: Any) -> None:
        for key, what in (("hooks", "hooks (the LLM bridge)"), ("frontier_k", "frontier_k"), ("sparse", "sparse sets"),
                          ("rows", "rows")):
            if executor_kwargs.get(key):
                raise UserError(f"{what}: not available in a sharded run yet; run one process")
        executor_kwargs = {k: v for k, v in executor_kwargs.items() if k not in ("hooks", "frontier_k", "sparse", "rows")}
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

    def without_hooks(self) -> "ShardedExecutor":
        return self  # never has hooks

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

    def _project_one_hot(self, ents: Any, rels: Any, want_arg: bool, negated: bool, *, keep_sparse: bool) -> None:
        """No gather fast path: an anchor's row lives on every rank that owns one of its tails, so one-hot rows
        go through the exchange of :meth:`_project_rows` like any other."""
        return None

    def _project_rows(self, x: Any, rels: list[int], negated: bool, want_arg: bool,
                      strategy: str = "auto", *, keep_sparse: bool = False):
        """Row ``b`` of the block ``x`` (B, N_k) through relation ``rels[b]``: this block of ``(y, argmax)``.

        Gathers the frontier (:meth:`_gather_frontier`).  The rows are grouped by relation; group
        g's active entities (the union of its rows' frontiers, sorted: compact order = id order,
        which keeps the kernel's smallest-index tie rule) are the rows of stack relation g
        (:meth:`ShardRows.compact_stack`), so a hop reads each relation's entries of its own
        rows' frontier only, as one process does.  The executor's kernel projects; the witnesses
        (compact indices) are mapped back to entity ids.
        """
        b = x.shape[0]
        dev = self.device
        big_n = self.num_entities
        g_rows, g_ents, g_vals = self._gather_frontier(x)
        rel_t = torch.tensor(rels, dtype=torch.int64, device=dev)
        uniq, inv = torch.unique(rel_t, return_inverse=True)
        n_groups = int(uniq.numel())
        entry_key = inv[g_rows] * big_n + g_ents
        pairs = torch.unique(entry_key)  # (group, entity) pairs, by group then entity
        p_group = torch.div(pairs, big_n, rounding_mode="floor")
        p_ent = pairs - p_group * big_n
        g_start = torch.searchsorted(p_group, torch.arange(n_groups + 1, device=dev))
        per_group = g_start[1:] - g_start[:-1]
        a = torch.arange(pairs.numel(), device=dev) - g_start[p_group]
        n_c = max(int(per_group.max()) if n_groups else 0, self.width, 1)
        xc = torch.zeros(b, n_c, dtype=torch.float32, device=dev)
        xc[g_rows, a[torch.searchsorted(pairs, entry_key)]] = g_vals
        stack = cast(ShardRows, self.rows).compact_stack(uniq[p_group] * big_n + p_ent, p_group * n_c + a,
                                                         n_groups, n_c)
        y, arg = self.ops.project(xc, RowBlock(stack, inv), negated, self.neg_scale, want_arg, strategy, None)
        hop = self.hops[-1]
        self.hops[-1] = hop._replace(active=int(pairs.numel()))
        y = y[:, : self.width].contiguous()
        if arg is not None:
            loc = arg[:, : self.width].long()
            at = (g_start[inv].view(-1, 1) + loc.clamp(min=0)).clamp(max=max(int(pairs.numel()) - 1, 0))
            arg = torch.where(loc >= 0, p_ent[at] if pairs.numel() else loc, loc).to(torch.int32)
        return y, arg

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

    def _top_k(self, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` of every row over all ranks' blocks (ties: smaller id): local top-k, one gather, a stable merge."""
        b = y.shape[0]
        kl = min(k, self.width)
        vals, ids = _topk_stable(y, kl)
        pad_v = torch.full((b, k), -1.0, dtype=torch.float32, device=y.device)
        pad_i = torch.full((b, k), self.num_entities, dtype=torch.int64, device=y.device)
        pad_v[:, :kl] = vals
        pad_i[:, :kl] = ids + self.lo
        pack = torch.cat([pad_v.view(torch.int32).to(torch.int64), pad_i], 1)  # one exchange for both
        got = self.comm.all_gather(pack, "top-k")
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
                    w = [self.shard.weight(int(nodes[int(r)].relation), int(s), int(e) + self.lo) if s >= 0 else 0.0
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

    def answer(self, queries: Sequence[Node], *, k: int = 10, explain: bool = True,
               batch_size: int = 256, trace_values: bool = False) -> list[QueryResult]:
        """As :meth:`Executor.answer` (collective; the same results on every rank)."""
        if trace_values:
            raise UserError("trace_values: not available in a sharded run yet (node values are split across ranks)")
        return super().answer(queries, k=k, explain=explain, batch_size=batch_size)
