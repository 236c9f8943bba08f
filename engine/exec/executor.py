"""Batched execution of query ASTs over an artifact's relation matrices, with explanations.

Semantics (QTO's forward pass, exact on tree-shaped queries): every sub-query
is a fuzzy set, a float32 vector over the N entities with values in [0, 1]:

* ``Anchor(e)``               one-hot at ``e``;
* ``(p r q)``                 ``Y[j] = max_i q[i] * M_r[i, j]``            (``ops.project``);
* ``(np r q)``                ``Y[j] = max_i q[i] * (1 - min(1, s * M_r[i, j]))`` (``ops.project(..., negate=True)``);
* ``(i q1 q2 ...)``           t-norm of the values (product or Gödel/min) (``ops.intersect``);
* ``(u q1 q2 ...)``           the dual t-conorm                          (``ops.union``);
* ``(n q)``                   ``1 - q``                                    (``ops.negate``).

Batching: queries with the same :func:`~engine.lang.query.shape_key` run together
as the B rows of one ``(B, N)`` tensor per node.

Projection, one route: the executor reads the relation matrices through a
:class:`kge.rows.RelationRows` (``artifact.relation_rows(device=...)``, or the
``rows=`` argument), which hands out, for a batch and its rows' relations,
:class:`kge.rows.RowBlock` s (a stacked CSR with its transpose, each row's relation in
it, which batch rows); each block is one ``ops.project`` call (dense sets, or sparse sets
as ``SparseRows``), each row through its own
relation; one relation for all rows is the degenerate case.  Eager artifacts: one
block, the whole KG prepared once per artifact and device (one stacked transpose,
shared by every executor).  Lazy artifacts (:mod:`kge.lazy`): compact blocks of
only the calibrated rows ``(r, h)`` of the input's active entities ``h``
(``X[b, h] > 0``), computed or taken from the row cache; rows of inactive heads
meet a zero input in plain and negated projection alike, so scores and witnesses
equal the eager artifact's.  ``frontier_k`` (default off: exact) keeps only the ``k``
largest entries of each projection's input (``ops.topk_prune``, as CQD-beam does),
which bounds the rows a lazy projection computes; it applies to eager artifacts the
same way, so the two stay comparable.

Sparse sets (``Executor(sparse=True)``): where nobody needs a node's (B, N) tensor (scores without
explanations, hooks or kept trace values), sets with few non-zeros travel as
:class:`ops.sparse_rows.SparseRows`: anchors, projections of sparse sets whose
push stays small (``ops.project`` on a ``SparseRows``), intersections with a
sparse argument and unions of sparse arguments.  A node with full support
(negation, negated projection, union with a dense argument) and the query's
result are dense, and so is a projection whose rows come in several blocks.
The values are the dense operators' bit for bit; only the cost changes: a small
set costs its entries, not N.

Per-node functions, one op table: each node type's ``forward`` (its fuzzy value) and
``explain`` (its backward step) are facets of its entry in :mod:`engine.lang.optable`,
found by one dict lookup per node per pass (``e``, ``p``, ``np``, ``i``, ``u``, ``n``
register theirs at the bottom of this module; a new node type registers its own, see
docs/executor.md, "Adding a node type").  ``forward(executor, nodes, path, run)``
evaluates the node's children (:meth:`_Run.children`, or ``executor._eval`` for
control over sparse sets) and returns ``(value, inputs)``: a
:class:`~engine.exec.hooks.NodeValue` (values, the projection witness, evidence) or,
in sparse runs, a :class:`SparseRows`, and the children's values for the hooks (a
tuple, or a zero-argument function building it: only called when hooks run).
Projections have one function whatever the branch (one-hot anchors included): one
``ops`` call per node, no per-relation loop.

Hooks (:mod:`engine.exec.hooks`): after a node is computed, the registered
hooks for its op see it with its context and may replace its value; parents
see the replaced value.  KG-only, LLM-only and merged runs are three hook
configurations of this one path.

Trace (:mod:`engine.exec.trace`): every batch keeps a trace (per node: op,
relation, path, hook notes, evidence; values only with ``trace_values=True``),
returned by :meth:`Executor.answer` as ``QueryResult.trace`` and by
:meth:`Executor.iter_scores` / :meth:`Executor.scores` with ``trace=True``.

Explanations (QTO's backward pass): with ``explain=True`` every projection
keeps its argmax, so each returned answer is traced back to one assignment of
every variable that attains the answer's score; :class:`Explanation` holds the
per-atom truth values (``M_r[i, j]``, or the negated factor for ``np``) and the
evidence hooks merged in, and recomputes the score from them
(:meth:`Explanation.recompute`), answers carry their provenance.
"""
from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch

import ops
from kgreason.constants import QTO_NEG_SCALE
from kgreason.errors import UserError
from ops.fuzzy import TNORMS
from ops.sparse_rows import SparseRows, intersect_sparse, push_sizes, union_sparse

from engine.exec.explain import Answer, Explanation, QueryResult, combine_scores
from engine.exec.hooks import Hook, HookHandle, NodeContext, NodeValue
from engine.exec.trace import BatchTrace, Trace
from engine.lang import optable
from engine.lang.query import (
    Anchor,
    Complement,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    named,
    relations_of,
    resolve,
    shape_key,
    to_sexpr,
)

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact
    from kge.rows import RelationRows, RowBlock

__all__ = ["Executor", "ExplainSite", "QueryResult", "Answer", "Explanation", "TNORMS", "combine_scores",
           "explain_pointwise"]


# ----------------------------------------------------------------------------- operator access
class _Ops:
    """The one adapter between the executor and ``ops``' public functions (with its backend selection)."""

    def __init__(self, backend: str | None) -> None:
        self.backend = backend
        # Every tensor the executor passes was produced by these operators from one-hot
        # anchors, or checked when a hook returned it, so the per-call [0, 1] value scan is skipped.
        self._kw_dict: dict[str, Any] = {"validate": False} if backend is None else {"validate": False,
                                                                                      "backend": backend}

    def _kw(self) -> dict[str, Any]:
        return self._kw_dict

    def sparse_kw(self, device: torch.device) -> dict[str, Any]:
        """Keywords of the sparse-set ops: the executor's backend, except ``cpp`` where they have no kernel
        (CUDA: the pure-torch path; see ops.sparse_rows)."""
        b = self.backend
        if b == "cpp" and not ops.has_kernel("project_multi_sparse", device):
            b = "reference"
        return {"backend": b, "validate": False}

    def project(self, x: "torch.Tensor | SparseRows", block: "RowBlock", negated: bool, neg_scale: float,
                want_arg: bool, strategy: str, sparse_ratio: float | None, out: Any = None):
        """Row ``k`` of ``x`` (B', N) through stack relation ``block.rel[k]``: ``(y, argmax (B', N) | None)``.

        ``y`` is a :class:`SparseRows` when ``x`` is one, ``sparse_ratio`` is given and the push reads
        at most ``B' * N / sparse_ratio`` entries (a bound on its non-zeros: past that the dense
        kernel's contiguous writes win); else a (B', N) tensor.  ``strategy``: the dense op's.
        """
        if isinstance(x, SparseRows):
            if sparse_ratio is not None and not negated and \
                    int(push_sizes(x, block.rel, block.stack).sum()) * sparse_ratio <= x.batch_size * x.n:
                return ops.project(x, block.stack, block.rel, **self.sparse_kw(x.device)), None
            x = x.to_dense()
        res = ops.project(x, block.stack, block.rel, negate=negated, neg_scale=neg_scale, strategy=strategy,
                          return_argmax=want_arg, out=out, **self._kw())
        return res if want_arg else (res, None)

    def topk_prune(self, x, k: int):
        return ops.topk_prune(x, k, validate=False)

    def intersect(self, xs, tnorm: str):
        return ops.intersect(*xs, tnorm=tnorm, **self._kw())

    def union(self, xs, tnorm: str):
        return ops.union(*xs, tnorm=tnorm, **self._kw())

    def negate(self, x):
        return ops.negate(x, validate=False)


# ------------------------------------------------------------------------------------ executor
#: The op table (node class -> entry), held once: the forward pass reads it once per node.
_TABLE = optable.entries()


def _scan(node: Node, n_ent: int, n_rel: int, rels: list[int]) -> tuple | None:
    """``node``'s shape key, appending its relations in pre-order to ``rels``; ``None`` when a name or an
    out-of-range id is found (the query then needs :func:`resolve`, which also reports errors).

    Runs once per query (per row, unlike the per-node table lookups of the forward pass), so the
    built-in types are recognised by identity and read their fields directly: walks through the
    op table measured 1.06-1.3x this one's time on 3,000 queries per structure.  Other
    registered types go by their table shape (:func:`_scan_shape`).
    """
    t = type(node)
    if t is Anchor:
        e = node.entity
        return _ANCHOR_KEY if type(e) is int and 0 <= e < n_ent else None
    if t is Projection or t is NegatedProjection:
        r = node.relation
        if not (type(r) is int and 0 <= r < n_rel):
            return None
        rels.append(r)
        child = _scan(node.arg, n_ent, n_rel, rels)
        return None if child is None else (node.head, child)
    if t is Intersection or t is Union:
        kids = []
        for a in node.args:
            child = _scan(a, n_ent, n_rel, rels)
            if child is None:
                return None
            kids.append(child)
        return (node.head, *kids)
    if t is Complement:
        child = _scan(node.arg, n_ent, n_rel, rels)
        return None if child is None else (node.head, child)
    return _scan_shape(node, n_ent, n_rel, rels)


def _scan_children(node: Node, n_ent: int, n_rel: int, rels: list[int]) -> tuple | None:
    kids = []
    for a in node.children():
        child = _scan(a, n_ent, n_rel, rels)
        if child is None:
            return None
        kids.append(child)
    return (node.head, *kids)


def _scan_shape(node: Node, n_ent: int, n_rel: int, rels: list[int]) -> tuple | None:
    """:func:`_scan` of a node type registered beyond the built-ins, by its op-table shape."""
    entry = _TABLE.get(type(node))
    if entry is None:
        return None  # a subclass or foreign node: the general path decides
    if entry.shape == "anchor":
        e = node.entity  # type: ignore[attr-defined]
        return _ANCHOR_KEY if type(e) is int and 0 <= e < n_ent else None
    if entry.shape == "relation":
        r = node.relation  # type: ignore[attr-defined]
        if not (type(r) is int and 0 <= r < n_rel):
            return None
        rels.append(r)
    return _scan_children(node, n_ent, n_rel, rels)


_ANCHOR_KEY = ("e",)


@dataclass(frozen=True)
class _HookEntry:
    hook: Hook
    ops: frozenset[str]
    name: str


class _Witness(NamedTuple):
    """A node's final value on the CPU as numpy, for the backward pass (see :class:`NodeValue`)."""

    values: np.ndarray
    argmax: np.ndarray | None
    evidence: tuple
    row_evidence: tuple


class _Run:
    """The state of one batch's forward pass.

    ``want_arg``: keep projection witnesses; ``record``: path -> final NodeValue
    (for explanations; ``None`` when not explaining); ``trace``: always kept.
    """

    def __init__(self, executor: "Executor", roots: list[Node], query_indices: list[int], trace: BatchTrace, *,
                 want_arg: bool, record: bool, sparse: bool = False) -> None:
        self.executor = executor
        self.roots = roots
        self.query_indices = query_indices
        self.trace = trace
        self.want_arg = want_arg
        self.record: dict[tuple[int, ...], NodeValue] | None = {} if record else None
        #: nodes may return :class:`ops.sparse_rows.SparseRows` (nobody needs their (B, N) tensors)
        self.sparse = sparse

    def children(self, nodes: list[Node], path: tuple[int, ...]) -> tuple[NodeValue, ...]:
        """The values of the children of ``nodes`` (one node per row, same shape), dense, in order.

        What a ``forward`` facet that has no use for sparse sets calls first; child ``k`` is
        evaluated at ``path + (k,)`` (hooks, trace and record included).
        """
        out = []
        for k in range(len(nodes[0].children())):
            x = self.executor._eval([q.children()[k] for q in nodes], path + (k,), self)
            out.append(NodeValue(x.to_dense()) if isinstance(x, SparseRows) else x)
        return tuple(out)



def dense_one_hot_projection(flat: np.ndarray, vals: np.ndarray, counts: np.ndarray, ents: Any, b: int, w: int, *,
                             negated: bool, want_arg: bool, neg_scale: float,
                             device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (b, w) projection of b one-hot rows from their matrix rows' entries, without the kernel.

    ``flat`` (E,) int64: each entry's position ``row * w + column`` in the output; ``vals`` (E,) float32 its
    value; ``counts`` (b,) the entries of each row (in order); ``ents`` the b anchors (each row's witness).
    Plain: y = the entry, 0 elsewhere.  Negated (QTO): the kernels' float32 ``1 - min(1, s * v)`` on the
    entries, 1 elsewhere.  Argmax: the anchor where y > 0, else -1.  Returns ``(y, argmax or None)`` on
    ``device``.
    """
    if negated:
        # the kernels' float32 formula, 1.f - std::min(1.f, s * v), elementwise in float32
        one = np.float32(1.0)
        vals = one - np.minimum(one, vals * np.float32(neg_scale))
        y = np.ones(b * w, dtype=np.float32)
    else:
        y = np.zeros(b * w, dtype=np.float32)
    y[flat] = vals
    arg = None
    if want_arg:
        heads = np.asarray(ents, dtype=np.int32)
        if negated:
            a = np.repeat(heads, w)
            a[flat[vals <= 0]] = -1
        else:
            a = np.full(b * w, -1, dtype=np.int32)
            hit = vals > 0
            a[flat[hit]] = np.repeat(heads, counts)[hit]
        arg = torch.from_numpy(a).view(b, w).to(device)
    return torch.from_numpy(y).view(b, w).to(device), arg


class Executor:
    """Runs batches of queries over ``artifact``'s relation matrices.

    Args:
        artifact: the compiled KG (:class:`kge.artifact.Artifact`).
        tnorm: ``"product"`` (default) or ``"godel"``: the intersection t-norm
            (union uses its dual t-conorm); projections are always max-product.
        neg_scale: ``s`` in QTO's negated edge ``1 - min(1, s * M)`` (default 3.0).
        device: where the matrices and the (B, N) batches live (default ``"cpu"``).
        backend: ``ops`` backend (``None`` = automatic, ``"cpp"``, ``"reference"``).
        pass_rows: most rows one forward pass holds (``None`` = automatic: on CPU,
            enough rows for a 4 MiB (rows, N) float32 tensor, at least 16; on CUDA,
            no limit).  A batch larger than this runs as several passes: small
            intermediates stay in cache and in the allocator's reuse range, which on
            CPU is faster than one huge pass (see benchmarks/results/engine_notes.md, "Bounded passes").
        hooks: per-node hooks, called on every node (any op) in this order; see
            :mod:`engine.exec.hooks` and :meth:`add_hook`.
        frontier_k: keep only the ``k`` largest entries (ties: smaller ids) of every
            projection's input before projecting (``None``, the default: all, exact).
            With a lazy artifact it bounds the rows computed per query and hop to ``k``.
        sparse: carry sparse intermediate sets as :class:`ops.sparse_rows.SparseRows`
            (default ``False``: always dense (B, N) tensors).  Worth it on KGs whose
            sets stay small; on FB15k-237 one hop from a grounded anchor already holds a
            mean 4,266 (median 861) of 14,505 entities, and the dense passes measured faster
            (benchmarks/results/engine_throughput.md, column ``sparse``).  Used
            where no (B, N) tensor is needed (scores without explanations, hooks or kept
            trace values): anchors, projections whose push touches at most
            ``1 / sparse_dense_ratio`` of the B x N cells (and whose rows come in one
            block: always for eager rows), intersections with a sparse argument and unions
            of sparse arguments stay sparse; negations, negated projections, projections
            after a ``frontier_k`` cut and the query's result are dense.  Results are equal, bit
            for bit, to the dense path's.
        rows: where projections read the relation matrices (a :class:`kge.rows.RelationRows` on
            ``device``; default ``artifact.relation_rows(device=device)``: eager rows prepared once
            per artifact and device, or a lazy artifact's on-demand rows).  Any implementation of
            the interface works (e.g. rows sharded across devices); it must describe the
            artifact's matrices.
    """

    #: A sparse projection result is kept while its push reads at most B*N / sparse_dense_ratio
    #: matrix entries (an upper bound on its non-zeros); see the ``sparse`` argument.
    sparse_dense_ratio: float = 8.0

    def __init__(self, artifact: "Artifact", *, tnorm: str = "product", neg_scale: float = QTO_NEG_SCALE,
                 device: str | torch.device = "cpu", backend: str | None = None,
                 pass_rows: int | None = None, hooks: Sequence[Hook] = (), frontier_k: int | None = None,
                 sparse: bool = False, rows: "RelationRows | None" = None) -> None:
        if tnorm not in TNORMS:
            raise UserError(f"unknown t-norm {tnorm!r}; expected one of {', '.join(TNORMS)}")
        if not (neg_scale > 0 and np.isfinite(neg_scale)):
            raise UserError(f"neg_scale must be a positive number, got {neg_scale}")
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise UserError(f"invalid device {device!r} ({exc})") from None
        if self.device.type not in ("cpu", "cuda"):  # meta, mps, ...: the ops kernels run on CPU and CUDA only
            raise UserError(f"device {device!r}: the executor runs on cpu or cuda (cuda:N) only")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"device {device!r} requested but CUDA is not available")
        self.artifact = artifact
        self.tnorm = tnorm
        self.neg_scale = float(neg_scale)
        self.ops = _Ops(backend)
        if pass_rows is not None and pass_rows < 1:
            raise UserError(f"pass_rows must be >= 1, got {pass_rows}")
        if frontier_k is not None and (isinstance(frontier_k, bool) or not isinstance(frontier_k, (int, np.integer))
                                       or frontier_k < 1):
            raise UserError(f"frontier_k must be an integer >= 1 (or None for exact), got {frontier_k!r}")
        self.frontier_k = None if frontier_k is None else int(frontier_k)
        if not isinstance(sparse, bool):
            raise UserError(f"sparse must be True or False, got {sparse!r}")
        self.sparse = sparse
        if rows is None:
            rows = artifact.relation_rows(device=str(self.device))
        elif (rows.num_entities, rows.num_relations) != (artifact.num_entities, artifact.num_relations):
            raise UserError(f"rows: {type(rows).__name__} has {rows.num_entities} entities and {rows.num_relations} "
                            f"relations; the artifact has {artifact.num_entities} and {artifact.num_relations}")
        #: the relation matrices as projections read them (:class:`kge.rows.RelationRows`)
        self.rows = rows
        if pass_rows is None and self.device.type == "cpu":
            pass_rows = max(16, (1 << 20) // max(1, artifact.num_entities))
        self.pass_rows = pass_rows
        self._hooks: list[_HookEntry] = []
        for h in hooks:
            self.add_hook(h)

    @property
    def num_entities(self) -> int:
        return self.artifact.num_entities

    # -------------------------------------------------------------------------------- hooks
    def add_hook(self, hook: Hook, *, ops: Sequence[str] | None = None, name: str | None = None) -> HookHandle:
        """Register ``hook(ctx, value) -> NodeValue | None`` for nodes whose op is in ``ops`` (default: all).

        Hooks run after the node is computed, children first, in registration
        order; ``name`` (default: the hook's ``name`` attribute or its function
        name) is how the trace lists it.  Returns a handle whose ``remove()``
        unregisters it.
        """
        if not callable(hook):
            raise UserError(f"hook must be callable, got {type(hook).__name__}")
        known = optable.ops()
        ops_set = frozenset(known if ops is None else ([ops] if isinstance(ops, str) else ops))
        bad = sorted(ops_set - set(known))
        if bad:
            raise UserError(f"hook ops: unknown {', '.join(map(repr, bad))}; expected some of {', '.join(known)}")
        if name is None:
            name = getattr(hook, "name", None)
        if not isinstance(name, str) or not name:
            name = getattr(hook, "__name__", None) or type(hook).__name__
        entry = _HookEntry(hook=hook, ops=ops_set, name=name)
        self._hooks.append(entry)
        return HookHandle(self._hooks, entry)

    def without_hooks(self) -> "Executor":
        """This executor with no hooks (a KG-only twin sharing the prepared matrices)."""
        twin = copy.copy(self)
        twin._hooks = []
        return twin

    @property
    def hooks(self) -> tuple[tuple[str, frozenset[str]], ...]:
        """The registered hooks as ``(name, ops)``, in call order."""
        return tuple((e.name, e.ops) for e in self._hooks)

    def _hooks_for(self, op: str) -> list[_HookEntry]:
        return [e for e in self._hooks if op in e.ops]

    # ------------------------------------------------------------------------------ helpers
    def _prepare(self, queries: Sequence[Node]) -> tuple[list[Node], list[tuple]]:
        """The resolved queries and, per query, ``(shape key, relations in pre-order)`` for grouping.

        One recursive pass per query (:func:`_scan`) both checks that it holds only in-range ids
        and computes its key; only queries with names (or bad ids) go through :func:`resolve`.
        At batch 1024 the separate resolve / ``shape_key`` / ``relations_of`` traversals cost
        as much as a one-hop projection per query.
        """
        n_ent, n_rel = self.num_entities, self.artifact.num_relations
        out, keys = [], []
        many = len(queries) > 1
        for k, q in enumerate(queries):
            if not isinstance(q, Node):
                raise TypeError(f"query {k}: expected a query Node, got {type(q).__name__} (parse strings first)")
            rels: list[int] = []
            shape = _scan(q, n_ent, n_rel, rels)
            if shape is None:
                q = resolve(q, self.artifact, where=f"query {k + 1}" if many else "")
                rels = [int(r) for r in relations_of(q)]
                shape = shape_key(q)
            out.append(q)
            keys.append((shape, tuple(rels)))
        return out, keys

    def _groups(self, keys: Sequence[tuple], batch_size: int) -> list[list[int]]:
        """Indices of queries grouped by shape, in chunks of at most ``batch_size`` (and ``pass_rows``).

        ``keys``: per query, ``(shape key, relations)`` from :meth:`_prepare`.
        """
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if self.pass_rows is not None:
            batch_size = min(batch_size, self.pass_rows)
        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for k, (shape, _) in enumerate(keys):
            by_shape[shape].append(k)
        chunks = []
        for idx in by_shape.values():
            # Sorting a shape's queries by their relations (outermost first) makes the rows that
            # share the outermost relation adjacent, so that projection needs no row gather/scatter
            # (first hops from anchors are a single gather whatever the order).
            idx = sorted(idx, key=lambda k: keys[k][1])
            for lo in range(0, len(idx), batch_size):
                chunks.append(idx[lo : lo + batch_size])
        return chunks

    def _project_rows(self, x: "torch.Tensor | SparseRows", rels: list[int], negated: bool, want_arg: bool,
                      strategy: str = "auto", *, keep_sparse: bool = False):
        """Project each row of ``x`` (B, N) by its own relation ``rels[b]``: ``(y (B, N), argmax (B, N) | None)``.

        The one projection route: :attr:`rows` hands out the blocks of rows the batch reads
        and each block is one ``ops`` call (:meth:`_Ops.project`).  ``x``: a tensor, or a
        :class:`SparseRows` (then ``y`` may stay sparse with ``keep_sparse``, when the rows
        come in one block).  ``strategy``: the dense op's (``"push"`` for one-hot rows, see
        :meth:`_compute_projection`).
        """
        if self.frontier_k is not None and self.frontier_k < self.num_entities:
            x = self.ops.topk_prune(x.to_dense() if isinstance(x, SparseRows) else x, self.frontier_k)
        blocks = self.rows.blocks(x, rels)
        first = next(blocks, None)
        if first is not None and first.rows is None:  # one block, the whole batch in order
            return self.ops.project(x, first, negated, self.neg_scale, want_arg, strategy,
                                    self.sparse_dense_ratio if keep_sparse else None)
        # Several blocks (lazy rows split by size, shards, ...): each projects its rows into the batch.
        xd = x.to_dense() if isinstance(x, SparseRows) else x
        y = torch.zeros_like(xd)
        arg = torch.full(xd.shape, -1, dtype=torch.int32, device=xd.device) if want_arg else None
        for block in itertools.chain(() if first is None else (first,), blocks):
            rows = block.rows
            if not len(rows):
                continue
            lo, hi = int(rows[0]), int(rows[-1]) + 1  # rows are ascending and distinct
            if hi - lo == len(rows):
                # a range of the batch (rows sorted by their outermost relation, see _groups): read and write
                # it in place, without the gather and scatter of (B', N) copies
                outs = y[lo:hi] if arg is None else (y[lo:hi], arg[lo:hi])
                self.ops.project(xd[lo:hi], block, negated, self.neg_scale, want_arg, strategy, None, outs)
                continue
            ys, args = self.ops.project(xd[rows], block, negated, self.neg_scale, want_arg, strategy, None)
            y[rows] = ys
            if arg is not None:
                arg[rows] = args
        return y, arg

    def _project_one_hot(self, ents: Sequence[int], rels: Sequence[int], want_arg: bool, negated: bool, *,
                         keep_sparse: bool):
        """``ops.project`` of the one-hot rows ``ents`` (value 1) through ``rels`` from the rows'
        :meth:`~kge.rows.RelationRows.one_hot_rows` (``None`` when they give none): ``(y, argmax | None)``,
        equal bit for bit to the kernel's: ``y[b] = M_{rels[b]}[ents[b], :]``, or negated (QTO) the factor
        ``1 - min(1, s * M)`` on the row's entries and 1 elsewhere (the one active input times the factor of
        an absent entry); the witness ``ents[b]`` wherever ``y[b, j] > 0``, else -1.  ``y`` is a
        :class:`SparseRows` when ``keep_sparse`` and as sparse as :meth:`_Ops.project` keeps a push (then
        no argmax).
        """
        pieces = self.rows.one_hot_rows(np.asarray(rels, dtype=np.int64), np.asarray(ents, dtype=np.int64))
        if pieces is None:
            return None
        indptr, cols, vals = pieces
        b, n = len(rels), self.num_entities
        if keep_sparse and self.sparse_dense_ratio is not None and len(vals) * self.sparse_dense_ratio <= b * n:
            return SparseRows(torch.from_numpy(np.ascontiguousarray(indptr, dtype=np.int64)).to(self.device),
                              torch.from_numpy(cols.astype(np.int64)).to(self.device),
                              torch.from_numpy(np.ascontiguousarray(vals, dtype=np.float32)).to(self.device), n), None
        # numpy on the host: for a batch of 16 rows, 1.5-2x fewer microseconds than the same steps in torch
        lens = np.diff(indptr)
        flat = np.repeat(np.arange(b, dtype=np.int64) * n, lens) + cols
        return dense_one_hot_projection(flat, vals, lens, ents, b, n, negated=negated, want_arg=want_arg,
                                        neg_scale=self.neg_scale, device=self.device)

    # ------------------------------------------------------------------------ forward pass
    def _eval(self, nodes: list[Node], path: tuple[int, ...], run: _Run) -> NodeValue:
        """Evaluate the same-shaped resolved sub-queries ``nodes`` (one per row) as one (B, N) batch.

        The node type's ``forward`` facet (the op table) computes it, then the hooks for
        its op run; the final value goes to the trace (and the record when explaining).
        """
        t = nodes[0]
        entry = _TABLE.get(type(t)) or optable.lookup(type(t))
        op = entry.op
        shape = entry.shape
        rels = tuple([q.relation for q in nodes]) if shape == "relation" else None  # resolved: ids
        ents = tuple([q.entity for q in nodes]) if shape == "anchor" else None
        run.trace.add_node(path, op, rels, ents)
        forward = entry.forward
        if forward is None:
            forward = entry.need("forward", "run it in the executor")
        value, inputs = forward(self, nodes, path, run)
        if isinstance(value, SparseRows):  # run.sparse: no hooks, witnesses, record or kept values
            run.trace.finish_node(path, None)
            return value
        hooks = self._hooks_for(op)
        if hooks:
            value = self._apply_hooks(hooks, nodes, path, op, rels, ents, inputs, value, run)
        run.trace.finish_node(path, value)
        if run.record is not None:
            run.record[path] = value
        return value

    def _apply_hooks(self, hooks: list[_HookEntry], nodes: list[Node], path: tuple[int, ...], op: str,
                     rels, ents, inputs: "Callable[[], tuple[NodeValue, ...]] | tuple[NodeValue, ...]",
                     value: NodeValue, run: _Run) -> NodeValue:
        ctx = NodeContext(node=nodes[0], nodes=tuple(nodes), roots=tuple(run.roots), path=path, op=op,
                          relations=rels, anchors=ents, inputs=inputs() if callable(inputs) else tuple(inputs),
                          query_indices=tuple(run.query_indices),
                          executor=self, _trace=run.trace)
        for entry in hooks:
            out = entry.hook(ctx, value)
            if out is None or out is value:
                continue
            if not isinstance(out, NodeValue):
                raise TypeError(f"hook {entry.name!r} at node {list(path)} returned {type(out).__name__}; "
                                "expected a NodeValue or None")
            if value.annotations and not value.annotations.keys() <= out.annotations.keys():
                # Another hook's annotations travel on even when this hook built its value afresh.
                out = out.replace(annotations={**value.annotations, **out.annotations})
            if out.same_scores(value):  # annotations only: the node's value did not change
                value = out
                continue
            self._check_hook_value(out, value, entry.name, path)
            run.trace.add_hook(path, entry.name)
            value = out
        return value

    def _check_hook_value(self, out: Any, before: NodeValue, name: str, path: tuple[int, ...]) -> None:
        """A hook's result must be a NodeValue of the same shape, dtype and device, with values in [0, 1]."""
        where = f"hook {name!r} at node {list(path)}"
        if not isinstance(out, NodeValue):
            raise TypeError(f"{where} returned {type(out).__name__}; expected a NodeValue or None")
        v = out.values
        if v.shape != before.values.shape or v.device != before.values.device:
            raise ValueError(f"{where} returned values {tuple(v.shape)} on {v.device}; expected "
                             f"{tuple(before.values.shape)} on {before.values.device}")
        if v.numel() and not bool(((v >= 0) & (v <= 1)).all()):  # also rejects NaN
            raise ValueError(f"{where} returned values outside [0, 1]")
        if out.argmax is not None and (out.argmax.dtype != torch.int32 or out.argmax.device != v.device):
            raise ValueError(f"{where} returned argmax {out.argmax.dtype} on {out.argmax.device}; expected int32 "
                             f"on {v.device}")

    def _one_hot(self, ents: Sequence[int]) -> torch.Tensor:
        b = len(ents)
        y = torch.zeros(b, self.num_entities, dtype=torch.float32, device=self.device)
        y[torch.arange(b, device=self.device), torch.tensor(list(ents), dtype=torch.int64, device=self.device)] = 1.0
        return y

    def _compute_anchor(self, nodes: list[Node], path: tuple[int, ...], run: _Run):
        if run.sparse:
            ents = torch.tensor([q.entity for q in nodes], dtype=torch.int64, device=self.device)
            return SparseRows.one_hot(ents, self.num_entities), lambda: ()
        return NodeValue(self._one_hot([q.entity for q in nodes])), lambda: ()

    def _compute_projection(self, nodes: list[Node], path: tuple[int, ...], run: _Run):
        """``p``/``np`` for every row, each by its own relation: the child, then :meth:`_project_rows`.

        One-hot anchors go through the same call (``ops.project`` on a one-hot
        batch measured faster than a vectorised gather of CSR rows, the former anchor
        fast path), with the push strategy; sparse children may stay sparse (``run.sparse``).
        """
        negated = isinstance(nodes[0], NegatedProjection)
        rels = [q.relation for q in nodes]
        # One-hot rows (anchors) push: the push reads exactly one CSR row per row, which no pull
        # can beat; "auto" sent FB15k-237 anchors with long rows (popular entities) to pull, which
        # reads the whole matrix (benchmarks/results/engine_notes.md, "Anchors push").
        strategy = "push" if isinstance(nodes[0].arg, Anchor) else "auto"
        x: Any = None
        if strategy == "push" and not self._hooks_for("e"):
            # one-hot rows of value 1 (no hook changed them): rows that hand out their one-hot projection
            # directly (lazy rows: one gather from the row cache) skip the kernel calls, and then the anchors'
            # (B, N) one-hot is only built when something reads it: the witness record, the trace's kept
            # values, or a hook of this node (its inputs).  Building it was ~55 us of a single FB15k-237
            # query's anchor hop, a third of the eager query.
            ents = [q.arg.entity for q in nodes]
            if run.record is not None or run.trace.keep_values:
                x = self._eval([q.arg for q in nodes], path + (0,), run)
            got = self._project_one_hot(ents, rels, run.want_arg, negated,
                                        keep_sparse=run.sparse and not negated and bool(path))
            if got is not None:
                if x is None:  # the anchor node, traced without its tensor (see BatchTrace.finish_node)
                    run.trace.add_node(path + (0,), "e", None, tuple(ents))
                    run.trace.finish_node(path + (0,), None)
                y, arg = got
                if isinstance(y, SparseRows):
                    return y, lambda: ()
                if x is None:
                    return NodeValue(y, arg), lambda: (NodeValue(self._one_hot(ents)),)
                return NodeValue(y, arg), lambda: (NodeValue(x.to_dense()) if isinstance(x, SparseRows) else x,)
        if x is None:
            x = self._eval([q.arg for q in nodes], path + (0,), run)
        sparse_in = isinstance(x, SparseRows)
        # A negated projection has full support, and the query's result is dense anyway: a root
        # projection writes it directly (a sparse result would be written twice).
        y, arg = self._project_rows(x if sparse_in else x.values, rels, negated, run.want_arg, strategy,
                                    keep_sparse=sparse_in and not negated and bool(path))
        if isinstance(y, SparseRows):
            return y, lambda: ()
        # sparse runs have no hooks, so the dense input is only built if asked for
        return NodeValue(y, arg), lambda: (NodeValue(x.to_dense()) if sparse_in else x,)

    def _compute_combination(self, nodes: list[Node], path: tuple[int, ...], run: _Run):
        """``i``/``u``: the t-norm / t-conorm of the children (``ops.intersect`` / ``ops.union``)."""
        t = nodes[0]
        xs = tuple(self._eval([q.args[k] for q in nodes], path + (k,), run) for k in range(len(t.args)))
        is_sparse = [isinstance(x, SparseRows) for x in xs]
        if any(is_sparse):
            # A t-norm is 0 wherever one argument is: sparse whenever one argument is.  A t-conorm
            # is sparse only when every argument is.
            kw = dict(tnorm=self.tnorm, **self.ops.sparse_kw(self.device))
            if isinstance(t, Intersection):
                return intersect_sparse([x if s else x.values for x, s in zip(xs, is_sparse)], **kw), lambda: ()
            if all(is_sparse):
                return union_sparse(list(xs), **kw), lambda: ()
            xs = tuple(NodeValue(x.to_dense()) if s else x for x, s in zip(xs, is_sparse))
        vals = [x.values for x in xs]
        y = self.ops.intersect(vals, self.tnorm) if isinstance(t, Intersection) else self.ops.union(vals, self.tnorm)
        return NodeValue(y), lambda: xs

    def _compute_complement(self, nodes: list[Node], path: tuple[int, ...], run: _Run):
        """``n``: ``1 - x`` (``ops.negate``)."""
        x = self._eval([q.arg for q in nodes], path + (0,), run)
        if isinstance(x, SparseRows):
            x = NodeValue(x.to_dense())
        return NodeValue(self.ops.negate(x.values)), lambda: (x,)

    def _run_batch(self, roots: list[Node], idx: list[int], *, want_arg: bool, record: bool,
                   trace_values: bool) -> tuple[NodeValue, _Run]:
        trace = BatchTrace(roots, idx, self.artifact, keep_values=trace_values)
        sparse = self.sparse and not (want_arg or record or trace_values or self._hooks)
        run = _Run(self, roots, idx, trace, want_arg=want_arg, record=record, sparse=sparse)
        with torch.no_grad():
            value = self._eval(roots, (), run)
        if isinstance(value, SparseRows):
            value = NodeValue(value.to_dense())
        return value, run

    # ---------------------------------------------------------------------------- public API
    def iter_scores(self, queries: Sequence[Node], *, batch_size: int = 1024, progress: bool = False,
                    trace: bool = False, trace_values: bool = False) -> Iterator[tuple]:
        """Yield ``(indices, scores)`` per executed batch: ``scores[k]`` (float32, N) belongs to ``queries[indices[k]]``.

        The memory-friendly form of :meth:`scores`: rank or reduce each batch and
        drop it, without holding a (len(queries), N) tensor.  With ``trace=True``
        yields ``(indices, scores, traces)``, ``traces[k]`` the
        :class:`~engine.exec.trace.Trace` of ``queries[indices[k]]`` (per-node values
        in it only with ``trace_values=True``).  Hooks run in either case.
        """
        resolved, keys = self._prepare(queries)
        chunks = self._groups(keys, batch_size)
        it = chunks
        if progress:
            from kgreason.progress import progress_bar

            it = progress_bar(chunks, desc="query batches", unit="batch")
        for idx in it:
            value, run = self._run_batch([resolved[k] for k in idx], idx, want_arg=False, record=False,
                                         trace_values=trace_values)
            if trace:
                yield idx, value.values, run.trace.traces()
            else:
                yield idx, value.values

    def scores(self, queries: Sequence[Node], *, batch_size: int = 1024, progress: bool = False,
               trace: bool = False, trace_values: bool = False):
        """Scores of every entity for every query: float32 (len(queries), N) on this device, in input order.

        Queries may use names or ids (they are resolved here); same-shaped
        queries run in batches of up to ``batch_size`` rows.  With ``trace=True``
        returns ``(scores, traces)``, one :class:`~engine.exec.trace.Trace` per
        query in input order.
        """
        n_q = len(queries)
        out = None
        traces: list[Trace | None] = [None] * n_q
        for item in self.iter_scores(queries, batch_size=batch_size, progress=progress, trace=trace,
                                     trace_values=trace_values):
            idx, y = item[0], item[1]
            if trace:
                for k, tr in zip(idx, item[2]):
                    traces[k] = tr
            if out is None and len(idx) == n_q and idx == list(range(n_q)):
                out = y  # one batch in input order: its result is the answer
                break
            if out is None:
                out = torch.zeros(n_q, self.num_entities, dtype=torch.float32, device=self.device)
            out[torch.tensor(idx, device=self.device)] = y
        if out is None:
            out = torch.zeros(n_q, self.num_entities, dtype=torch.float32, device=self.device)
        return (out, traces) if trace else out

    def answer(self, queries: Sequence[Node], *, k: int = 10, explain: bool = True,
               batch_size: int = 256, trace_values: bool = False) -> list[QueryResult]:
        """The top-``k`` answers of each query (entities with score > 0, best first; ties by smaller id).

        With ``explain`` every answer carries an :class:`Explanation`.  Every
        answer carries its provenance and every result its
        :class:`~engine.exec.trace.Trace` (per-node values only with
        ``trace_values``).  One :class:`QueryResult` per query, in input order.
        """
        if k < 1:
            raise UserError(f"k (top-k) must be >= 1, got {k}")
        resolved, keys = self._prepare(queries)
        results: list[QueryResult | None] = [None] * len(resolved)
        names = self.artifact.entities
        # Provenance needs the witnesses whenever a hook may have merged evidence somewhere.
        walk = explain or bool(self._hooks)
        for idx in self._groups(keys, batch_size):
            batch = [resolved[j] for j in idx]
            value, run = self._run_batch(batch, idx, want_arg=walk, record=walk, trace_values=trace_values)
            top_vals_t, top_ids_t = self._top_k(value.values, min(k, self.num_entities))
            top_vals, top_ids = top_vals_t.cpu().numpy(), top_ids_t.cpu().numpy()
            cpu_record = None
            if walk:
                assert run.record is not None
                cpu_record = self._witness_record(batch, run.record, top_vals, top_ids)
            traces = run.trace.traces()
            for row, qi in enumerate(idx):
                answers = []
                for val, ent in zip(top_vals[row], top_ids[row]):
                    if not val > 0:
                        break
                    ent = int(ent)
                    expl = self._explain(batch[row], (), row, ent, cpu_record) if walk else None
                    answers.append(Answer(entity=names[ent], id=ent, score=float(val),
                                          explanation=expl if explain else None,
                                          provenance=expl.source if expl is not None else "kg"))
                results[qi] = QueryResult(query=to_sexpr(named(batch[row], self.artifact)), answers=answers,
                                          trace=traces[row])
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------------- backward pass
    # Two steps of answer() a subclass may replace (engine.exec.sharded: values split across ranks).
    def _top_k(self, values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-``k`` (values, entity ids) of every row of the batch's result (ties: smaller id)."""
        return _topk_stable(values, k)

    def _witness_record(self, batch: list[Node], record: dict, top_vals: np.ndarray,
                        top_ids: np.ndarray) -> dict[tuple[int, ...], "_Witness"]:
        """What the backward pass reads for the answers ``top_ids`` of ``batch``: per node path, its values,
        witnesses and evidence (here all of them, as numpy views on the CPU: the backward pass reads
        single elements, which numpy does in well under a microsecond and torch indexing does not)."""
        return {p: _Witness(v.values.cpu().numpy(), None if v.argmax is None else v.argmax.cpu().numpy(),
                            v.evidence, v.row_evidence)
                for p, v in record.items()}

    def _explain(self, node: Node, path: tuple[int, ...], row: int, ent: int,
                 record: dict[tuple[int, ...], "_Witness"]) -> Explanation:
        """The explanation of ``node`` (at ``path``) for entity ``ent`` of batch row ``row``: its type's
        ``explain`` facet (the op table) at an :class:`ExplainSite`."""
        value = record[path]
        score = float(value.values[row, ent])
        ev_row = value.evidence[row]
        ev = ev_row.get(ent) if ev_row else None
        if ev is None:
            ev = value.row_evidence[row]  # a replaced row: the row's evidence stands for every other entity
        kg_dropped = ev is not None and ev.discards_kg()  # a replace: the KG part is not explained
        entry = _TABLE.get(type(node)) or optable.lookup(type(node))
        site = ExplainSite(self, record, node, path, row, ent, self.artifact.entities[ent], score, ev, kg_dropped)
        return entry.need("explain", "explain answers")(site)


class ExplainSite(NamedTuple):
    """Where the backward pass is: ``node`` (at ``path``) for entity ``entity`` of batch row ``row``.

    What an ``explain`` facet gets: ``score`` is the node's final value there, ``evidence``
    what hooks merged in (the entity's, else the row's), ``kg_dropped`` whether that evidence
    replaced the KG value (then the KG part has no witness to explain);
    :meth:`child` explains a child, :meth:`witness` is a projection's source entity.
    """

    executor: "Executor"
    record: dict
    node: Node
    path: tuple[int, ...]
    row: int
    entity: int
    name: str
    score: float
    evidence: Any
    kg_dropped: bool

    def child(self, k: int, entity: int | None = None) -> Explanation:
        """Child ``k`` explained at ``entity`` (default: this site's entity)."""
        return self.executor._explain(self.node.children()[k], self.path + (k,), self.row,
                                      self.entity if entity is None else entity, self.record)

    def witness(self) -> int:
        """The source entity the node's KG value came from (its argmax), ``-1`` when none was kept."""
        arg = self.record[self.path].argmax
        return -1 if arg is None else int(arg[self.row, self.entity])


def _explain_anchor(site: ExplainSite) -> Explanation:
    return Explanation("e", site.entity, site.name, site.score, truth=1.0 if site.entity == site.node.entity else 0.0,
                       evidence=site.evidence)


def _explain_projection(site: ExplainSite) -> Explanation:
    """``p``/``np``: the witness source ``i`` (the argmax), the atom ``M_r[i, entity]`` and ``i`` explained."""
    node, ent, ex = site.node, site.entity, site.executor
    op = node.head
    r = int(node.relation)
    common = dict(relation=r, relation_name=ex.artifact.relations[r],
                  neg_scale=ex.neg_scale if op == "np" else None, evidence=site.evidence)
    src = -1 if site.kg_dropped else site.witness()
    if src < 0 or site.score <= 0:
        return Explanation(op, ent, site.name, site.score, **common)
    w = ex.rows.weight(r, src, ent)
    if op == "p":
        truth = w
    else:  # the same float32 formula as the kernels
        truth = float(1.0 - np.minimum(np.float32(1.0), np.float32(w) * np.float32(ex.neg_scale)))
    child = site.child(0, src)
    return Explanation(op, ent, site.name, site.score, weight=w, truth=truth, children=(child,), **common)


def explain_pointwise(site: ExplainSite) -> Explanation:
    """A node whose value at an entity combines its children's values at that entity (``i``, ``u``, ``n``,
    and any such registered type): every child explained at the same entity (none when a hook's
    evidence replaced the KG value)."""
    kids = () if site.kg_dropped else tuple(site.child(k) for k in range(len(site.node.children())))
    return Explanation(optable.lookup(type(site.node)).op, site.entity, site.name, site.score, children=kids,
                       evidence=site.evidence)


def _topk_stable(y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per row, ties broken by the smaller entity id (deterministic across backends)."""
    # A stable descending sort keeps equal scores in id order; topk alone does not promise that.
    vals, ids = torch.sort(y, dim=1, descending=True, stable=True)
    return vals[:, :k], ids[:, :k]


# ------------------------------------------------------------------------------- the op table
# This layer's facets of the built-in node types (the language registered them in engine.lang.query).
optable.register(Anchor, forward=Executor._compute_anchor, explain=_explain_anchor)
optable.register(Projection, forward=Executor._compute_projection, explain=_explain_projection)
optable.register(NegatedProjection, forward=Executor._compute_projection, explain=_explain_projection)
optable.register(Intersection, forward=Executor._compute_combination, explain=explain_pointwise)
optable.register(Union, forward=Executor._compute_combination, explain=explain_pointwise)
optable.register(Complement, forward=Executor._compute_complement, explain=explain_pointwise)
