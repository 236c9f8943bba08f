"""Batched execution of query ASTs over an artifact's relation matrices, with explanations.

Semantics (QTO's forward pass, exact on tree-shaped queries): every sub-query
is a fuzzy set, a float32 vector over the N entities with values in [0, 1]:

* ``Anchor(e)``               one-hot at ``e``;
* ``(p r q)``                 ``Y[j] = max_i q[i] * M_r[i, j]``            (``ops.project``);
* ``(np r q)``                ``Y[j] = max_i q[i] * (1 - min(1, s * M_r[i, j]))`` (``ops.project_negated``);
* ``(i q1 q2 ...)``           t-norm of the values (product or Gödel/min) (``ops.intersect``);
* ``(u q1 q2 ...)``           the dual t-conorm                          (``ops.union``);
* ``(n q)``                   ``1 - q``                                    (``ops.negate``).

Batching: queries with the same :func:`~engine.query.shape_key` run together
as the B rows of one ``(B, N)`` tensor per node.  At a projection node the rows
are sorted by relation so that every distinct relation is one ``ops.project``
call on a contiguous slice of rows.

Explanations (QTO's backward pass): with ``explain=True`` every projection
keeps its argmax, so each returned answer is traced back to one assignment of
every variable that attains the answer's score; :class:`Explanation` holds the
per-atom truth values (``M_r[i, j]``, or the negated factor for ``np``) and
recomputes the score from them (:meth:`Explanation.recompute`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from kge.errors import UserError

from .query import (
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

__all__ = ["Executor", "QueryResult", "Answer", "Explanation", "TNORMS"]

#: The t-norms an executor accepts (intersection) and their dual t-conorms (union).
TNORMS = ("product", "godel")


# ----------------------------------------------------------------------------- operator access
class _Ops:
    """The fuzzy-set operators, taken from the ``ops`` package (with its backend selection)."""

    def __init__(self, backend: str | None) -> None:
        import ops

        self.backend = backend
        self._ops = ops
        missing = [f for f in ("project", "project_negated", "intersect", "union", "negate", "prepare") if not hasattr(ops, f)]
        if missing:  # pragma: no cover - only while ops is being written
            raise ImportError(f"ops does not export {', '.join(missing)} yet")

    def _kw(self) -> dict[str, Any]:
        # Every tensor the executor passes was produced by these operators from one-hot
        # anchors, so the per-call [0, 1] value scan is skipped.
        kw: dict[str, Any] = {"validate": False}
        if self.backend is not None:
            kw["backend"] = self.backend
        return kw

    def prepare(self, m):
        return self._ops.prepare(m)

    def project(self, x, m, want_arg: bool):
        return self._ops.project(x, m, return_argmax=want_arg, **self._kw())

    def project_negated(self, x, m, neg_scale: float, want_arg: bool):
        return self._ops.project_negated(x, m, neg_scale=neg_scale, return_argmax=want_arg, **self._kw())

    def intersect(self, xs, tnorm: str):
        return self._ops.intersect(*xs, tnorm=tnorm, **self._kw())

    def union(self, xs, tnorm: str):
        return self._ops.union(*xs, tnorm=tnorm, **self._kw())

    def negate(self, x):
        return self._ops.negate(x, validate=False)


def combine_scores(op: str, values: Sequence[float], tnorm: str) -> float:
    """The scalar version of ``intersect``/``union`` (used to recompute explained scores)."""
    if op == "i":
        if tnorm == "godel":
            return float(min(values))
        out = 1.0
        for v in values:
            out *= v
        return out
    if op == "u":
        if tnorm == "godel":
            return float(max(values))
        out = 0.0
        for v in values:  # probabilistic sum a + b - ab, folded left to right
            out = out + v - out * v
        return out
    raise ValueError(op)


# ------------------------------------------------------------------------------- result types
@dataclass(frozen=True)
class Explanation:
    """Why a sub-query holds for ``entity``: a tree mirroring the query.

    ``op`` is ``"e"`` (anchor), ``"p"``, ``"np"``, ``"i"``, ``"u"`` or ``"n"``;
    ``score`` the sub-query's value at ``entity`` (as computed by the executor).
    For ``p``/``np``: ``children[0]`` explains the source entity ``i`` (the
    argmax), ``weight = M_r[i, entity]`` and ``truth`` is the atom's truth value
    (``weight`` for ``p``, ``1 - min(1, neg_scale * weight)`` for ``np``).  A
    sub-query with score 0 has no witness (no children).
    """

    op: str
    entity: int
    entity_name: str
    score: float
    relation: int | None = None
    relation_name: str | None = None
    weight: float | None = None
    truth: float | None = None
    neg_scale: float | None = None
    children: tuple["Explanation", ...] = ()

    def recompute(self, tnorm: str) -> float:
        """The score recomputed from the atoms' truth values alone (float64)."""
        if self.op == "e":  # the anchor atom: 1 at the anchor entity, 0 elsewhere
            return self.score
        if self.op in ("p", "np"):
            if not self.children:
                return 0.0
            return self.children[0].recompute(tnorm) * float(self.truth)
        if self.op in ("i", "u"):
            return combine_scores(self.op, [c.recompute(tnorm) for c in self.children], tnorm)
        if self.op == "n":
            return 1.0 - self.children[0].recompute(tnorm)
        raise ValueError(self.op)

    def atoms(self) -> list["Explanation"]:
        """The relation atoms (``p``/``np`` nodes with a witness), in pre-order."""
        out = [self] if self.op in ("p", "np") and self.children else []
        for c in self.children:
            out.extend(c.atoms())
        return out

    # -------------------------------------------------------------------------- rendering
    def _arrow(self) -> str:
        if self.op == "p":
            return f"—{self.relation_name} ({self.truth:.3f})→"
        if self.weight == 0:
            return f"—not {self.relation_name} (no edge: {self.truth:.3f})→"
        return f"—not {self.relation_name} (1−min(1, {self.neg_scale:g}×{self.weight:.3f}) = {self.truth:.3f})→"

    def _chain(self) -> tuple[list[str], str]:
        """(lines explaining the chain's start, the chain text ending at this entity)."""
        if self.op == "e":
            return [], self.entity_name
        if self.op in ("p", "np"):
            if not self.children:
                kind = "path" if self.op == "p" else "source"
                return [f"(no {kind} reaches {self.entity_name} via {self.relation_name})"], ""
            pre, chain = self.children[0]._chain()
            return pre, f"{chain} {self._arrow()} {self.entity_name}"
        return self._block(), self.entity_name

    def _block(self) -> list[str]:
        if self.op in ("i", "u"):
            word = "all of" if self.op == "i" else "any of"
            lines = [f"{self.entity_name} ({self.score:.4f}) satisfies {word}:"]
            for c in self.children:
                lines.extend("  " + ("∧ " if self.op == "i" else "∨ ") + l if k == 0 else "    " + l
                             for k, l in enumerate(c.lines()))
            return lines
        if self.op == "n":
            inner = self.children[0]
            lines = [f"{self.entity_name} ({self.score:.4f}) = 1 − {inner.score:.4f}, not in:"]
            if inner.score > 0:
                lines.extend("    " + l for l in inner.lines())
            else:
                lines.append(f"    (nothing: {self.entity_name} has value 0 there)")
            return lines
        raise ValueError(self.op)

    def lines(self) -> list[str]:
        """Readable chains, e.g. ``Tom Hanks —starred_actors^-1 (0.98)→ Cast Away —directed_by (0.95)→ Robert Zemeckis (0.931)``."""
        if self.op in ("i", "u", "n"):
            return self._block()
        pre, chain = self._chain()
        if not chain:
            return pre
        return pre + [f"{chain} ({self.score:.4f})"]

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "entity": self.entity_name, "id": self.entity, "score": self.score}
        if self.op in ("p", "np"):
            d.update(relation=self.relation_name, relation_id=self.relation, weight=self.weight, truth=self.truth)
            if self.op == "np":
                d["neg_scale"] = self.neg_scale
        if self.children:
            d["children"] = [c.to_json() for c in self.children]
        return d


@dataclass(frozen=True)
class Answer:
    """One ranked answer: entity name and id, its score, and (optionally) its explanation."""

    entity: str
    id: int
    score: float
    explanation: Explanation | None = None

    def to_json(self) -> dict[str, Any]:
        expl = None
        if self.explanation is not None:
            expl = {"text": self.explanation.lines(), "tree": self.explanation.to_json()}
        return {"entity": self.entity, "id": self.id, "score": self.score, "explanation": expl}


@dataclass(frozen=True)
class QueryResult:
    """The answers of one query (``query`` is its S-expression with names), best first."""

    query: str
    answers: list[Answer] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query, "answers": [a.to_json() for a in self.answers]}


# ------------------------------------------------------------------------------------ executor
_Record = dict[tuple[int, ...], tuple[torch.Tensor, "torch.Tensor | None"]]


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
            CPU is faster than one huge pass (see the README, section "Query engine").
    """

    def __init__(self, artifact: "Artifact", *, tnorm: str = "product", neg_scale: float = 3.0,
                 device: str | torch.device = "cpu", backend: str | None = None,
                 pass_rows: int | None = None) -> None:
        if tnorm not in TNORMS:
            raise UserError(f"unknown t-norm {tnorm!r}; expected one of {', '.join(TNORMS)}")
        if not (neg_scale > 0 and np.isfinite(neg_scale)):
            raise UserError(f"neg_scale must be a positive number, got {neg_scale}")
        try:
            self.device = torch.device(device)
        except RuntimeError as exc:
            raise UserError(f"invalid device {device!r} ({exc})") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"device {device!r} requested but CUDA is not available")
        self.artifact = artifact
        self.tnorm = tnorm
        self.neg_scale = float(neg_scale)
        self.ops = _Ops(backend)
        if pass_rows is not None and pass_rows < 1:
            raise UserError(f"pass_rows must be >= 1, got {pass_rows}")
        if pass_rows is None and self.device.type == "cpu":
            pass_rows = max(16, (1 << 20) // max(1, artifact.num_entities))
        self.pass_rows = pass_rows
        self._prepared: dict[int, Any] = {}
        self._stacked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def num_entities(self) -> int:
        return self.artifact.num_entities

    # ------------------------------------------------------------------------------ helpers
    def matrix(self, r: int):
        """The prepared relation matrix M_r on this executor's device (cached)."""
        m = self._prepared.get(r)
        if m is None:
            m = self.ops.prepare(self.artifact.relation_matrix(r, str(self.device)))
            self._prepared[r] = m
        return m

    def _resolve_all(self, queries: Sequence[Node]) -> list[Node]:
        out = []
        for k, q in enumerate(queries):
            if not isinstance(q, Node):
                raise TypeError(f"query {k}: expected a query Node, got {type(q).__name__} (parse strings first)")
            out.append(resolve(q, self.artifact, where=f"query {k + 1}" if len(queries) > 1 else ""))
        return out

    def _groups(self, resolved: Sequence[Node], batch_size: int) -> list[list[int]]:
        """Indices of queries grouped by shape, in chunks of at most ``batch_size`` (and ``pass_rows``)."""
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if self.pass_rows is not None:
            batch_size = min(batch_size, self.pass_rows)
        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for k, q in enumerate(resolved):
            by_shape[shape_key(q)].append(k)
        chunks = []
        for idx in by_shape.values():
            # Sorting a shape's queries by their relations (outermost first) makes the rows that
            # share the outermost relation adjacent, so that projection needs no row gather/scatter
            # (first hops from anchors are a single gather whatever the order).
            idx = sorted(idx, key=lambda k: tuple(relations_of(resolved[k])))
            for lo in range(0, len(idx), batch_size):
                chunks.append(idx[lo : lo + batch_size])
        return chunks

    def _project_rows(self, x: torch.Tensor, rels: list[int], negated: bool, want_arg: bool):
        """Project each row of ``x`` (B, N) by its own relation, one ops call per distinct relation."""
        def call(xs, r):
            m = self.matrix(r)
            if negated:
                return self.ops.project_negated(xs, m, self.neg_scale, want_arg)
            return self.ops.project(xs, m, want_arg)

        first = rels[0]
        if all(r == first for r in rels):
            return call(x, first) if want_arg else (call(x, first), None)
        if all(a <= b for a, b in zip(rels, rels[1:])):
            # Already grouped (the batch is sorted by relations): contiguous slices, no row gather.
            ys, args = [], []
            lo = 0
            for hi in [k for k in range(1, len(rels)) if rels[k] != rels[k - 1]] + [len(rels)]:
                out = call(x[lo:hi], rels[lo])
                ys.append(out[0] if want_arg else out)
                if want_arg:
                    args.append(out[1])
                lo = hi
            return torch.cat(ys), (torch.cat(args) if want_arg else None)
        rel_t = torch.tensor(rels, dtype=torch.int64)
        order = torch.argsort(rel_t, stable=True)
        uniq, counts = torch.unique_consecutive(rel_t[order], return_counts=True)
        order_dev = order.to(x.device)
        xs = x.index_select(0, order_dev)  # rows sharing a relation become one contiguous slice
        y = torch.empty_like(x)
        a = torch.empty(x.shape, dtype=torch.int32, device=x.device) if want_arg else None
        lo = 0
        for r, c in zip(uniq.tolist(), counts.tolist()):
            rows = order_dev[lo : lo + c]
            out = call(xs[lo : lo + c], r)
            if want_arg:
                y.index_copy_(0, rows, out[0])
                a.index_copy_(0, rows, out[1])
            else:
                y.index_copy_(0, rows, out)
            lo += c
        return y, a

    def _stacked_csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The artifact's stacked (R*N, N) CSR on this device: crow int64, col int32, val float32.

        On CPU these share memory with the artifact's scipy arrays (no copy).
        """
        if self._stacked is None:
            m = self.artifact.matrices
            self._stacked = (
                torch.from_numpy(np.asarray(m.indptr, dtype=np.int64)).to(self.device),
                torch.from_numpy(np.asarray(m.indices, dtype=np.int32)).to(self.device),
                torch.from_numpy(np.asarray(m.data, dtype=np.float32)).to(self.device),
            )
        return self._stacked

    def _project_anchors(self, ents: list[int], rels: list[int], negated: bool, want_arg: bool):
        """Projection of one-hot anchors: row ``e`` of ``M_r`` for each row, for any mix of relations.

        ``max_i onehot_e[i] * M[i, j] = M[e, j]`` exactly (and ``1 - min(1, s * M[e, j])``
        for a negated edge, the same float32 formula as ``ops``), so the first hop of
        every chain is one vectorised gather of CSR rows instead of one call per relation.
        """
        crow, col, val = self._stacked_csr()
        b, n = len(ents), self.num_entities
        dev = self.device
        e = torch.tensor(ents, dtype=torch.int64, device=dev)
        rows = torch.tensor(rels, dtype=torch.int64, device=dev) * n + e
        starts = crow[rows]
        counts = crow[rows + 1] - starts
        total = int(counts.sum())
        which = torch.repeat_interleave(torch.arange(b, device=dev), counts, output_size=total)
        first = torch.cumsum(counts, 0) - counts
        offs = torch.arange(total, device=dev) - first[which] + starts[which]
        cols, vals = col[offs].long(), val[offs]
        if negated:
            s = torch.tensor(self.neg_scale, dtype=torch.float32, device=dev)
            y = torch.ones(b, n, dtype=torch.float32, device=dev)
            y[which, cols] = 1.0 - torch.clamp(vals * s, max=1.0)
        else:
            y = torch.zeros(b, n, dtype=torch.float32, device=dev)
            y[which, cols] = vals
        if not want_arg:
            return y, None
        arg = torch.where(y > 0, e[:, None].to(torch.int32), torch.full((), -1, dtype=torch.int32, device=dev))
        return y, arg

    def _forward(self, nodes: list[Node], record: _Record | None, path: tuple[int, ...] = ()) -> torch.Tensor:
        """Evaluate same-shaped resolved queries ``nodes`` as one (B, N) batch."""
        t = nodes[0]
        b, n = len(nodes), self.num_entities
        arg = None
        if isinstance(t, Anchor):
            y = torch.zeros(b, n, dtype=torch.float32, device=self.device)
            ids = torch.tensor([q.entity for q in nodes], dtype=torch.int64, device=self.device)
            y[torch.arange(b, device=self.device), ids] = 1.0
        elif (isinstance(t, (Projection, NegatedProjection)) and isinstance(t.arg, Anchor)
              and any(q.relation != t.relation for q in nodes)):
            # First hop with several relations: one gather instead of a call per relation.
            ents = [q.arg.entity for q in nodes]
            y, arg = self._project_anchors(ents, [q.relation for q in nodes], isinstance(t, NegatedProjection),
                                           record is not None)
            if record is not None:
                x = torch.zeros(b, n, dtype=torch.float32, device=self.device)
                x[torch.arange(b, device=self.device), torch.tensor(ents, device=self.device)] = 1.0
                record[path + (0,)] = (x, None)
        elif isinstance(t, (Projection, NegatedProjection)):
            x = self._forward([q.arg for q in nodes], record, path + (0,))
            y, arg = self._project_rows(x, [q.relation for q in nodes], isinstance(t, NegatedProjection),
                                        record is not None)
        elif isinstance(t, (Intersection, Union)):
            xs = [self._forward([q.args[k] for q in nodes], record, path + (k,)) for k in range(len(t.args))]
            y = self.ops.intersect(xs, self.tnorm) if isinstance(t, Intersection) else self.ops.union(xs, self.tnorm)
        elif isinstance(t, Complement):
            y = self.ops.negate(self._forward([q.arg for q in nodes], record, path + (0,)))
        else:
            raise TypeError(f"not a query node: {t!r}")
        if record is not None:
            record[path] = (y, arg)
        return y

    # ---------------------------------------------------------------------------- public API
    def iter_scores(self, queries: Sequence[Node], *, batch_size: int = 1024,
                    progress: bool = False) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Yield ``(indices, scores)`` per executed batch: ``scores[k]`` (float32, N) belongs to ``queries[indices[k]]``.

        The memory-friendly form of :meth:`scores`: rank or reduce each batch and
        drop it, without holding a (len(queries), N) tensor.
        """
        resolved = self._resolve_all(queries)
        chunks = self._groups(resolved, batch_size)
        it = chunks
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(chunks, desc="query batches", unit="batch")
        for idx in it:
            with torch.no_grad():
                y = self._forward([resolved[k] for k in idx], None)
            yield idx, y

    def scores(self, queries: Sequence[Node], *, batch_size: int = 1024, progress: bool = False) -> torch.Tensor:
        """Scores of every entity for every query: float32 (len(queries), N) on this device, in input order.

        Queries may use names or ids (they are resolved here); same-shaped
        queries run in batches of up to ``batch_size`` rows.
        """
        n_q = len(queries)
        out = None
        for idx, y in self.iter_scores(queries, batch_size=batch_size, progress=progress):
            if out is None and len(idx) == n_q and idx == list(range(n_q)):
                return y  # one batch in input order: its result is the answer
            if out is None:
                out = torch.zeros(n_q, self.num_entities, dtype=torch.float32, device=self.device)
            out[torch.tensor(idx, device=self.device)] = y
        if out is None:
            out = torch.zeros(n_q, self.num_entities, dtype=torch.float32, device=self.device)
        return out

    def answer(self, queries: Sequence[Node], *, k: int = 10, explain: bool = True,
               batch_size: int = 256) -> list[QueryResult]:
        """The top-``k`` answers of each query (entities with score > 0, best first; ties by smaller id).

        With ``explain`` every answer carries an :class:`Explanation`.  One
        :class:`QueryResult` per query, in input order.
        """
        if k < 1:
            raise UserError(f"k (top-k) must be >= 1, got {k}")
        resolved = self._resolve_all(queries)
        results: list[QueryResult | None] = [None] * len(resolved)
        names = self.artifact.entities
        with torch.no_grad():
            for idx in self._groups(resolved, batch_size):
                batch = [resolved[j] for j in idx]
                record: _Record | None = {} if explain else None
                y = self._forward(batch, record)
                top_vals, top_ids = _topk_stable(y, min(k, self.num_entities))
                top_vals, top_ids = top_vals.cpu().numpy(), top_ids.cpu().numpy()
                cpu_record = {p: (v.cpu(), None if a is None else a.cpu()) for p, (v, a) in record.items()} if explain else None
                for row, qi in enumerate(idx):
                    answers = []
                    for val, ent in zip(top_vals[row], top_ids[row]):
                        if not val > 0:
                            break
                        ent = int(ent)
                        expl = self._explain(batch[row], (), row, ent, cpu_record) if explain else None
                        answers.append(Answer(entity=names[ent], id=ent, score=float(val), explanation=expl))
                    results[qi] = QueryResult(query=to_sexpr(named(batch[row], self.artifact)), answers=answers)
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------------- backward pass
    def _weight(self, r: int, i: int, j: int) -> float:
        """M_r[i, j] from the artifact's CSR (binary search in row i)."""
        m = self.artifact.matrices
        row = r * self.num_entities + i
        lo, hi = int(m.indptr[row]), int(m.indptr[row + 1])
        cols = m.indices[lo:hi]
        pos = int(np.searchsorted(cols, j))
        if pos < len(cols) and cols[pos] == j:
            return float(m.data[lo + pos])
        return 0.0

    def _explain(self, node: Node, path: tuple[int, ...], row: int, ent: int, record: _Record) -> Explanation:
        values, argmax = record[path]
        score = float(values[row, ent])
        name = self.artifact.entities[ent]
        if isinstance(node, Anchor):
            return Explanation("e", ent, name, score)
        if isinstance(node, (Projection, NegatedProjection)):
            op = "p" if isinstance(node, Projection) else "np"
            r = int(node.relation)
            common = dict(relation=r, relation_name=self.artifact.relations[r],
                          neg_scale=self.neg_scale if op == "np" else None)
            src = int(argmax[row, ent])
            if src < 0 or score <= 0:
                return Explanation(op, ent, name, score, **common)
            w = self._weight(r, src, ent)
            if op == "p":
                truth = w
            else:  # the same float32 formula as the kernels
                truth = float(1.0 - np.minimum(np.float32(1.0), np.float32(w) * np.float32(self.neg_scale)))
            child = self._explain(node.arg, path + (0,), row, src, record)
            return Explanation(op, ent, name, score, weight=w, truth=truth,
                               children=(child,), **common)
        if isinstance(node, (Intersection, Union)):
            kids = tuple(self._explain(c, path + (k,), row, ent, record) for k, c in enumerate(node.args))
            return Explanation(node.head, ent, name, score, children=kids)
        if isinstance(node, Complement):
            return Explanation("n", ent, name, score, children=(self._explain(node.arg, path + (0,), row, ent, record),))
        raise TypeError(f"not a query node: {node!r}")


def _topk_stable(y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per row, ties broken by the smaller entity id (deterministic across backends)."""
    # A stable descending sort keeps equal scores in id order; topk alone does not promise that.
    vals, ids = torch.sort(y, dim=1, descending=True, stable=True)
    return vals[:, :k], ids[:, :k]
