"""The trace of an execution: per query, per node, what was computed and what hooks did.

The executor always keeps a :class:`BatchTrace` per batch (cheap: per node its
op, path and per-row relations/anchors, the hooks that changed it, the notes
hooks wrote and the evidence they merged; the (B, N) values only when asked,
``trace_values=True``, because they are large).  :class:`Trace` is one query's
view of it, built lazily, so a trace nobody reads costs almost nothing.

``Trace.to_json()``::

    {"query": "(p treats (p affects A))",
     "nodes": [{"path": [0, 0], "op": "e", "entity": "A", "id": 3},
               {"path": [0], "op": "p", "relation": "affects", "relation_id": 1},
               {"path": [], "op": "p", "relation": "treats", "relation_id": 0,
                "hooks": ["llm"], "notes": {"prompt_inputs": ["B"]},
                "evidence": [{"entity": "C", "id": 7, "source": "llm", "score": 0.4, "merge": "max"}]}]}

Nodes are listed in evaluation order (children first, the root last); a path
is the child indices from the root.  Keys without content (no hooks, notes,
evidence or ``row_evidence``) are left out; ``"top"`` (the 10 best entities with value > 0) appears
when values were kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from engine.exec.hooks import Evidence

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact
    from engine.lang.query import Node

__all__ = ["Trace", "NodeTrace", "BatchTrace"]


@dataclass
class _NodeRecord:
    """One node of a batch: what the executor computed and what hooks did (all B rows)."""

    path: tuple[int, ...]
    op: str
    relations: tuple[int, ...] | None
    anchors: tuple[int, ...] | None
    hooks: list[str] = field(default_factory=list)
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    evidence: tuple[Mapping[int, Evidence], ...] = ()
    row_evidence: tuple[Evidence | None, ...] = ()
    annotations: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    values: torch.Tensor | None = None


class BatchTrace:
    """The trace of one executed batch (B rows = ``query_indices``), node by node in evaluation order."""

    def __init__(self, roots: list["Node"], query_indices: list[int], artifact: "Artifact", *,
                 keep_values: bool = False) -> None:
        self.roots = roots
        self.query_indices = list(query_indices)
        self.artifact = artifact
        self.keep_values = keep_values
        self.records: dict[tuple[int, ...], _NodeRecord] = {}
        self.order: list[tuple[int, ...]] = []  # paths as nodes finish: children first, the root last

    def add_node(self, path: tuple[int, ...], op: str, relations, anchors) -> None:
        self.records[path] = _NodeRecord(path=path, op=op, relations=relations, anchors=anchors)

    def add_note(self, path: tuple[int, ...], row: int, key: str, value: Any) -> None:
        self.records[path].notes.setdefault(row, {})[key] = value

    def add_hook(self, path: tuple[int, ...], name: str) -> None:
        self.records[path].hooks.append(name)

    def finish_node(self, path: tuple[int, ...], value) -> None:
        """Record the node's final value (after hooks): its evidence, and its values when kept.

        ``value`` is ``None`` for a node whose (B, N) tensor was never built (an
        anchor projected by gather, when nobody needs the one-hot).
        """
        self.order.append(path)
        if value is None:
            return
        rec = self.records[path]
        rec.evidence = value.evidence
        rec.row_evidence = value.row_evidence
        rec.annotations = value.annotations
        if self.keep_values:
            # A copy: callers may edit the scores they get back in place.
            rec.values = value.values.detach().to("cpu", copy=True)

    def __len__(self) -> int:
        return len(self.query_indices)

    def query(self, row: int) -> "Trace":
        """The trace of row ``row``."""
        return Trace(self, row)

    def traces(self) -> list["Trace"]:
        """One :class:`Trace` per row, in row order."""
        return [Trace(self, r) for r in range(len(self.query_indices))]


@dataclass(frozen=True)
class NodeTrace:
    """One node of one query's trace.

    ``relation``/``relation_name`` for ``p``/``np``; ``entity``/``entity_name``
    for anchors; ``hooks``: names of the hooks that replaced this node's value
    (for the batch); ``notes``: what hooks noted for this query; ``evidence``:
    entity id -> :class:`~engine.exec.hooks.Evidence` merged at this node;
    ``row_evidence``: when a hook replaced this query's row (its KG values
    discarded), the evidence of every entity it did not list, else ``None``; ``annotations``: this
    query's payload under each key hooks annotated the node's value with (see
    :meth:`~engine.exec.hooks.NodeValue.annotate`; Python objects of the hook's choosing, so
    :meth:`to_json` leaves them out: a hook notes what the JSON should show); ``values``: the
    (N,) float32 values (after hooks) when kept, else ``None``.
    """

    path: tuple[int, ...]
    op: str
    relation: int | None = None
    relation_name: str | None = None
    entity: int | None = None
    entity_name: str | None = None
    hooks: tuple[str, ...] = ()
    notes: Mapping[str, Any] = field(default_factory=dict)
    evidence: Mapping[int, Evidence] = field(default_factory=dict)
    row_evidence: Evidence | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)
    values: torch.Tensor | None = None

    def to_json(self, entity_names=None) -> dict[str, Any]:
        d: dict[str, Any] = {"path": list(self.path), "op": self.op}
        if self.relation is not None:
            d.update(relation=self.relation_name, relation_id=self.relation)
        if self.entity is not None:
            d.update(entity=self.entity_name, id=self.entity)
        if self.hooks:
            d["hooks"] = list(self.hooks)
        if self.notes:
            d["notes"] = dict(self.notes)
        if self.row_evidence is not None:
            d["row_evidence"] = self.row_evidence.to_json()
        if self.evidence:
            d["evidence"] = [
                {"entity": entity_names[e] if entity_names is not None else None, "id": int(e), **ev.to_json()}
                for e, ev in sorted(self.evidence.items())
            ]
        if self.values is not None:
            k = min(10, int(self.values.numel()))
            vals, ids = torch.sort(self.values, descending=True, stable=True)
            d["top"] = [{"entity": entity_names[int(i)] if entity_names is not None else None, "id": int(i),
                         "value": float(v)} for v, i in zip(vals[:k].tolist(), ids[:k].tolist()) if v > 0]
        return d


class Trace:
    """One query's trace: its nodes in evaluation order (children first, the root last).

    ``index`` is the query's position in the caller's list; ``query`` its
    S-expression with names.  Built lazily from the batch's :class:`BatchTrace`.
    """

    def __init__(self, batch: BatchTrace, row: int) -> None:
        self._batch = batch
        self.row = row
        self.index = batch.query_indices[row]
        self._nodes: tuple[NodeTrace, ...] | None = None

    @property
    def query(self) -> str:
        from engine.lang.query import named, to_sexpr

        return to_sexpr(named(self._batch.roots[self.row], self._batch.artifact))

    @property
    def nodes(self) -> tuple[NodeTrace, ...]:
        if self._nodes is None:
            art, r = self._batch.artifact, self.row
            out = []
            for path in self._batch.order:
                rec = self._batch.records[path]
                rel = None if rec.relations is None else int(rec.relations[r])
                ent = None if rec.anchors is None else int(rec.anchors[r])
                out.append(NodeTrace(
                    path=rec.path, op=rec.op, relation=rel,
                    relation_name=None if rel is None else art.relations[rel],
                    entity=ent, entity_name=None if ent is None else art.entities[ent],
                    hooks=tuple(rec.hooks), notes=dict(rec.notes.get(r, {})),
                    evidence=dict(rec.evidence[r]) if rec.evidence else {},
                    row_evidence=rec.row_evidence[r] if rec.row_evidence else None,
                    annotations={k: v[r] for k, v in rec.annotations.items()},
                    values=None if rec.values is None else rec.values[r],
                ))
            self._nodes = tuple(out)
        return self._nodes

    def __iter__(self) -> Iterator[NodeTrace]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, path: tuple[int, ...] = ()) -> NodeTrace:
        """The node at ``path`` (``()`` = the root)."""
        for nt in self.nodes:
            if nt.path == tuple(path):
                return nt
        raise KeyError(f"no node at path {tuple(path)}")

    @property
    def root(self) -> NodeTrace:
        return self.node(())

    def to_json(self) -> dict[str, Any]:
        names = self._batch.artifact.entities
        return {"query": self.query, "nodes": [nt.to_json(names) for nt in self.nodes]}

    def __repr__(self) -> str:
        return f"Trace(index={self.index}, query={self.query!r}, nodes={len(self.nodes)})"
