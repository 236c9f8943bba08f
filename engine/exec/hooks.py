"""Per-node hooks: the executor's one seam for code that changes what a sub-query holds.

The executor computes a query tree bottom-up; every node of a batch of B
same-shaped queries is one :class:`NodeValue` (a (B, N) fuzzy set, plus the
projection witness and the evidence hooks merged in).  After a node is
computed, every registered hook whose ``ops`` include the node's op is called,
in registration order, as ``hook(ctx, value)``:

* it returns ``None`` (nothing changes) or a :class:`NodeValue` that replaces
  the node's value for every node above it (parents see the replaced value);
* ``ctx`` (:class:`NodeContext`) says where it is: the node, its path from
  the root, its op and relations, its children's (already hooked) values, the
  executor (artifact, names, t-norm, ``neg_scale``, device), and
  :meth:`NodeContext.note` writes per-row notes into the query's trace.

One hook call per node per batch: all B rows of a node come together, so a
hook that asks an LLM can send the rows of a node at once.

Scores a hook adds are recorded as :class:`Evidence` so that answers keep
their provenance and explanations can recompute every score:
:func:`merge_scores` (or :meth:`NodeValue.edit` for many updates with one
copy) is the common merge and never needs to be hand-rolled::

    def add_fact(ctx, value):
        if ctx.op != "p":
            return None
        edit = value.edit()                                     # one copy for all rows
        for row in range(ctx.rows):
            if ctx.relation_name(row) == "treats":
                edit.merge(row, [7], [0.4], source="llm", merge="max", detail={"p": 0.8})
                ctx.note(row, "asked", "what does it treat?")
        return edit.done()

    ex = Executor(artifact, hooks=[add_fact])                   # or ex.add_hook(add_fact, ops=("p",))

(``merge_scores(value, row, ids, scores, source=...)`` is the one-row shortcut.)

A KG-only run has no hooks; an "LLM-only" run has a hook that replaces each
row (:meth:`ValueEdit.replace_row`); a merged run has a hook that merges
(``merge="max"`` or ``"add"``).  All three are the same executor path.

Annotations: a hook may also hand data to the hooks of the nodes above
without changing any score.  ``value.annotate(key, rows)`` returns the value with
``annotations[key]`` set to one payload per row (any Python objects; by
convention ``key`` is the hook's name); a parent's hook reads it from
``ctx.inputs[k].annotation(key)``.  Annotations travel with the value: they
survive :meth:`NodeValue.replace`, :meth:`NodeValue.edit` and later hooks (the
executor keeps a key a later hook's value lacks), are sliced and concatenated
with the rows (:meth:`NodeValue.select`, :meth:`NodeValue.concat`), and each
query's trace shows its row's payloads (:attr:`~engine.exec.trace.NodeTrace.annotations`).
A hook that returns its input with only annotations added is not listed as
having changed the node.  The LLM bridge passes its per-row LLM answer sets
this way (:mod:`llm_bridge.lgot`)::

    def count_inputs(ctx, value):
        below = [c.annotation("count") or (0,) * ctx.rows for c in ctx.inputs]
        return value.annotate("count", [1 + sum(b[row] for b in below) for row in range(ctx.rows)])

Merge rules (``Evidence.merge``), with ``kg`` the node's value before the merge:

* ``"max"``:     ``merged = max(kg, score)``
* ``"add"``:     ``merged = min(1, kg + score)``
* ``"replace"``: ``merged = score`` (the KG value is discarded)
* ``"scale"``:   ``merged = kg * score`` (a factor, e.g. a penalty; it adds no
  positive part, so its source does not count towards provenance)

Several merges into the same (node, row, entity) chain: each new
:class:`Evidence` keeps the one before it in ``prior`` and
:meth:`Evidence.merged` folds them in order.
"""
from __future__ import annotations

import json
import math
from types import MappingProxyType
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence

import torch

if TYPE_CHECKING:  # pragma: no cover
    from engine.exec.executor import Executor
    from engine.exec.trace import BatchTrace
    from engine.lang.query import Node

__all__ = [
    "OPS",
    "MERGES",
    "Evidence",
    "NodeValue",
    "NodeContext",
    "Hook",
    "HookHandle",
    "ValueEdit",
    "merge_scores",
    "provenance_label",
]

#: The built-in node ops, as in :class:`~engine.exec.explain.Explanation` (``"e"`` is an anchor); a node
#: type registered in :mod:`engine.lang.optable` adds its own (``optable.ops()`` lists them all).
OPS = ("e", "p", "np", "i", "u", "n")
#: Merge rules of :class:`Evidence`.
MERGES = ("max", "add", "replace", "scale")
_NO_EVIDENCE: Mapping[int, "Evidence"] = MappingProxyType({})
_NO_ANNOTATIONS: Mapping[str, tuple] = MappingProxyType({})


def _no_annotations() -> Mapping[str, tuple]:
    return _NO_ANNOTATIONS


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable ({exc})") from None


@dataclass(frozen=True)
class Evidence:
    """A score a hook merged into one entity of one node (one row).

    ``source`` names who gave it (``"llm"``, ``"kg"`` is reserved for the
    executor's own values); ``score`` in [0, 1] is the score merged in by rule
    ``merge`` (``"max"``, ``"add"``, ``"replace"`` or ``"scale"``, see the module doc);
    ``detail`` is JSON-serialisable data for the trace (the LLM's p(e), the
    string that was linked, ...); ``prior`` is the evidence this one was merged
    on top of, if any (several hooks, or one hook merging twice).
    """

    source: str
    score: float
    merge: str = "max"
    detail: Mapping[str, Any] = field(default_factory=dict)
    prior: Optional["Evidence"] = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"Evidence.source must be a non-empty string, got {self.source!r}")
        if self.merge not in MERGES:
            raise ValueError(f"Evidence.merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        if not (0.0 <= float(self.score) <= 1.0):
            raise ValueError(f"Evidence.score must be in [0, 1], got {self.score!r}")

    def merged(self, kg: float) -> float:
        """The node's value after this evidence (and its ``prior`` chain) is merged onto ``kg``."""
        base = self.prior.merged(kg) if self.prior is not None else kg
        s = float(self.score)
        if self.merge == "max":
            return max(base, s)
        if self.merge == "add":
            return min(1.0, base + s)
        if self.merge == "scale":
            return base * s
        return s  # replace

    def chain(self) -> list["Evidence"]:
        """This evidence and its priors, oldest first."""
        out = [] if self.prior is None else self.prior.chain()
        return out + [self]

    def discards_kg(self) -> bool:
        """True when a ``"replace"`` in the chain makes the KG value irrelevant."""
        return any(e.merge == "replace" for e in self.chain())

    def sources(self) -> frozenset[str]:
        """Sources that contribute to the merged value: those after the last replace, with a score > 0."""
        out: set[str] = set()
        for e in self.chain():
            if e.merge == "replace" or (e.merge == "scale" and e.score <= 0):
                out.clear()
            if e.score > 0 and e.merge != "scale":  # a factor adds no positive part
                out.add(e.source)
        return frozenset(out)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "score": float(self.score), "merge": self.merge}
        if self.detail:
            d["detail"] = dict(self.detail)
        if self.prior is not None:
            d["prior"] = self.prior.to_json()
        return d


_LABELS = {frozenset(): "kg", frozenset({"kg"}): "kg", frozenset({"llm"}): "llm", frozenset({"kg", "llm"}): "both"}


def provenance_label(sources: Iterable[str]) -> str:
    """The provenance string of a set of sources: ``"kg"``, ``"llm"``, ``"both"`` (kg and llm), else ``"a+b"``.

    An empty set (an anchor alone) is ``"kg"``: nothing but the query and the graph.
    """
    if isinstance(sources, frozenset):
        label = _LABELS.get(sources)
        if label is not None:
            return label
    s = set(sources)
    if not s or s == {"kg"}:
        return "kg"
    if s == {"kg", "llm"}:
        return "both"
    if len(s) == 1:
        return next(iter(s))
    return "+".join(sorted(s))


@dataclass(frozen=True)
class NodeValue:
    """The value of one node for a batch of B queries.

    ``values``: (B, N) float32 in [0, 1] on the executor's device.
    ``argmax``: (B, N) int32 or ``None``: for ``p``/``np`` nodes when witnesses are
    kept, the source entity reaching the KG part of ``values[b, j]`` (``-1``: none).
    ``evidence``: B dicts (one per row), entity id -> :class:`Evidence` merged into
    that entity at this node; empty dicts when no hook merged anything.
    ``row_evidence``: B entries, ``None`` or the :class:`Evidence` (a
    ``"replace"``) of every entity of the row without evidence of its own: set by
    :meth:`ValueEdit.replace_row`, which discards the row's KG values, listed
    entities or not.
    ``annotations``: read-only mapping, key (by convention a hook's name) -> a tuple of
    B payloads, one per row: what a hook hands to the hooks of the nodes above
    (see the module doc); empty when nobody annotated.

    Treat the tensors as read-only: the executor may keep them for explanations
    and traces.  Change a value through :meth:`edit` / :func:`merge_scores`,
    which copy first.
    """

    values: torch.Tensor
    argmax: torch.Tensor | None = None
    evidence: tuple[Mapping[int, Evidence], ...] = ()
    row_evidence: tuple[Evidence | None, ...] = ()
    annotations: Mapping[str, tuple[Any, ...]] = field(default_factory=_no_annotations)

    def __post_init__(self) -> None:
        if self.values.dim() != 2 or self.values.dtype != torch.float32:
            raise ValueError(f"NodeValue.values must be a (B, N) float32 tensor, got {self.values.dtype} "
                             f"{tuple(self.values.shape)}")
        if self.argmax is not None and self.argmax.shape != self.values.shape:
            raise ValueError(f"NodeValue.argmax shape {tuple(self.argmax.shape)} differs from values "
                             f"{tuple(self.values.shape)}")
        if not self.evidence:
            # One shared read-only empty row: no per-row dict for the usual case of no evidence.
            object.__setattr__(self, "evidence", (_NO_EVIDENCE,) * self.values.shape[0])
        elif len(self.evidence) != self.values.shape[0]:
            raise ValueError(f"NodeValue.evidence has {len(self.evidence)} rows, values {self.values.shape[0]}")
        else:
            object.__setattr__(self, "evidence", tuple(self.evidence))
        if not self.row_evidence:
            object.__setattr__(self, "row_evidence", (None,) * self.values.shape[0])
        elif len(self.row_evidence) != self.values.shape[0]:
            raise ValueError(f"NodeValue.row_evidence has {len(self.row_evidence)} rows, values {self.values.shape[0]}")
        else:
            object.__setattr__(self, "row_evidence", tuple(self.row_evidence))
        ann = self.annotations
        if ann is not _NO_ANNOTATIONS:
            object.__setattr__(self, "annotations", _check_annotations(ann, self.values.shape[0]))

    def evidence_at(self, row: int, entity: int) -> Evidence | None:
        """The evidence behind ``values[row, entity]``: its own, else the row's, else ``None`` (KG only)."""
        ev = self.evidence[row].get(entity)
        return self.row_evidence[row] if ev is None else ev

    @property
    def rows(self) -> int:
        return int(self.values.shape[0])

    def has_evidence(self) -> bool:
        return any(self.evidence)

    def edit(self) -> "ValueEdit":
        """A copy-on-first-write editor: several merges, one copy of the (B, N) tensors."""
        return ValueEdit(self)

    def replace(self, **changes: Any) -> "NodeValue":
        """A NodeValue with some fields replaced (``dataclasses.replace``; annotations carried unless replaced)."""
        return replace(self, **changes)

    def annotation(self, key: str, default: Any = None) -> tuple[Any, ...] | Any:
        """The B per-row payloads annotated under ``key``, else ``default``."""
        return self.annotations.get(key, default)

    def annotate(self, key: str, rows: Sequence[Any]) -> "NodeValue":
        """This value with ``annotations[key]`` set to ``rows`` (one payload per row); tensors shared, not copied."""
        return replace(self, annotations={**self.annotations, key: tuple(rows)})

    def same_scores(self, other: "NodeValue") -> bool:
        """True when ``other`` holds this value's very tensors and evidence (it may differ in annotations)."""
        return (other.values is self.values and other.argmax is self.argmax and other.evidence is self.evidence
                and other.row_evidence is self.row_evidence)

    def select(self, rows: Sequence[int]) -> "NodeValue":
        """The rows ``rows`` (in that order) of this value: tensors, evidence and every annotation."""
        idx = [int(r) for r in rows]
        b = self.rows
        for r in idx:
            if not -b <= r < b:
                raise IndexError(f"row {r} out of range for a batch of {b}")
        t = torch.tensor(idx, dtype=torch.int64, device=self.values.device)
        return NodeValue(values=self.values.index_select(0, t),
                         argmax=None if self.argmax is None else self.argmax.index_select(0, t),
                         evidence=tuple(self.evidence[r] for r in idx),
                         row_evidence=tuple(self.row_evidence[r] for r in idx),
                         annotations={k: tuple(v[r] for r in idx) for k, v in self.annotations.items()})

    @staticmethod
    def concat(parts: Sequence["NodeValue"]) -> "NodeValue":
        """The rows of ``parts`` one after the other (the inverse of splitting a batch with :meth:`select`).

        ``argmax`` is kept when some part has one (``-1``, no witness, in the rows of parts
        without); an annotation key some part lacks is ``None`` in that part's rows.
        """
        if not parts:
            raise ValueError("NodeValue.concat needs at least one part")
        values = torch.cat([p.values for p in parts], dim=0)
        argmax = None
        if any(p.argmax is not None for p in parts):
            argmax = torch.cat([p.argmax if p.argmax is not None else
                                torch.full(p.values.shape, -1, dtype=torch.int32, device=p.values.device)
                                for p in parts], dim=0)
        keys = list(dict.fromkeys(k for p in parts for k in p.annotations))
        ann = {k: tuple(x for p in parts for x in p.annotations.get(k, (None,) * p.rows)) for k in keys}
        return NodeValue(values=values, argmax=argmax, evidence=tuple(e for p in parts for e in p.evidence),
                         row_evidence=tuple(e for p in parts for e in p.row_evidence), annotations=ann)


def _check_annotations(ann: Any, rows: int) -> Mapping[str, tuple]:
    """``ann`` as a read-only mapping of str keys to tuples of ``rows`` payloads (or a clear error)."""
    if not isinstance(ann, Mapping):
        raise TypeError(f"NodeValue.annotations must be a mapping, got {type(ann).__name__}")
    if not ann:
        return _NO_ANNOTATIONS
    out: dict[str, tuple] = {}
    for k, v in ann.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"NodeValue.annotations keys must be non-empty strings, got {k!r}")
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
            raise TypeError(f"NodeValue.annotations[{k!r}] must be a sequence of per-row payloads, "
                            f"got {type(v).__name__}")
        v = tuple(v)
        if len(v) != rows:
            raise ValueError(f"NodeValue.annotations[{k!r}] has {len(v)} rows, values {rows}")
        out[k] = v
    return MappingProxyType(out)


class ValueEdit:
    """Accumulates merges into a :class:`NodeValue`; :meth:`done` returns the new value.

    The original value is never modified: the tensors are copied on the first
    write.  Scores are merged in float32 (the same arithmetic as the tensors)
    and recorded as :class:`Evidence`.
    """

    def __init__(self, value: NodeValue) -> None:
        self._base = value
        self._values: torch.Tensor | None = None
        self._argmax: torch.Tensor | None = None
        self._evidence: list[dict[int, Evidence]] | None = None
        self._row_evidence: list[Evidence | None] = list(value.row_evidence)

    def _write(self) -> None:
        if self._values is None:
            self._values = self._base.values.clone()
            self._argmax = None if self._base.argmax is None else self._base.argmax.clone()
            self._evidence = [dict(e) for e in self._base.evidence]

    def _check(self, row: int, entity_ids: Sequence[int], scores: Sequence[float], detail) -> tuple[list[int], list[float], list]:
        b, n = self._base.values.shape
        if not 0 <= row < b:
            raise IndexError(f"row {row} out of range for a batch of {b}")
        ids = [int(e) for e in entity_ids]
        vals = [float(s) for s in scores]
        if len(ids) != len(vals):
            raise ValueError(f"{len(ids)} entity ids but {len(vals)} scores")
        for e, s in zip(ids, vals):
            if not 0 <= e < n:
                raise IndexError(f"entity id {e} out of range (N = {n})")
            if not (0.0 <= s <= 1.0) or math.isnan(s):
                raise ValueError(f"score {s} for entity {e} is not in [0, 1]")
        if detail is None or isinstance(detail, Mapping):
            details = [detail or {}] * len(ids)
        else:
            details = list(detail)
            if len(details) != len(ids):
                raise ValueError(f"{len(ids)} entity ids but {len(details)} details")
        for d in details:
            _check_json(d, "Evidence detail")
        return ids, vals, details

    def merge(self, row: int, entity_ids: Sequence[int], scores: Sequence[float], *, source: str,
              merge: str = "max", detail: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> "ValueEdit":
        """Merge ``scores[k]`` into ``entity_ids[k]`` of ``row`` by rule ``merge`` (see the module doc).

        ``detail``: one mapping for every entity, or one per entity (JSON data for
        the trace).  An entity listed twice is merged twice, in order.  For
        ``"replace"`` the entity's KG witness (``argmax``) is dropped.
        """
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
        ids, vals, details = self._check(row, entity_ids, scores, detail)
        if not ids:
            return self
        self._write()
        assert self._values is not None and self._evidence is not None
        cur = self._values[row, ids].tolist()
        ev_row = self._evidence[row]
        out: dict[int, float] = {}
        row_ev = self._row_evidence[row]
        for e, s, d, c in zip(ids, vals, details, cur):
            c = out.get(e, c)
            prior = ev_row.get(e)
            if prior is None:  # a replaced row: the entity's value so far is the row's, not the KG's
                prior = row_ev
            ev_row[e] = Evidence(source=source, score=s, merge=merge, detail=d, prior=prior)
            if merge == "max":
                out[e] = max(c, s)
            elif merge == "add":
                out[e] = min(1.0, c + s)  # rounded to float32 when written below
            elif merge == "scale":
                out[e] = c * s
            else:
                out[e] = s
        keys = list(out)
        self._values[row, keys] = torch.tensor([out[k] for k in keys], dtype=torch.float32,
                                               device=self._values.device)
        if merge == "replace" and self._argmax is not None:
            self._argmax[row, keys] = -1
        return self

    def replace_row(self, row: int, entity_ids: Sequence[int], scores: Sequence[float], *, source: str,
                    detail: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                    base: float = 0.0) -> "ValueEdit":
        """Make ``row`` exactly ``{entity_ids[k]: scores[k]}``, ``base`` elsewhere: the "LLM-only" configuration.

        ``base`` is 0 for a set the source lists; 1 for a negated one (an LLM-only
        ``np`` row: 1 except ``1 - p(e)`` on the listed entities).  Earlier evidence of
        the row is dropped, every KG witness too; each listed entity gets a
        ``"replace"`` :class:`Evidence` of its own, every other entity the row's
        (``row_evidence``: ``base`` from ``source``), so later merges start from it.
        """
        ids, vals, details = self._check(row, entity_ids, scores, detail)
        base = float(base)
        if not 0.0 <= base <= 1.0:
            raise ValueError(f"base {base} is not in [0, 1]")
        self._write()
        assert self._values is not None and self._evidence is not None
        self._values[row].fill_(base)
        if self._argmax is not None:
            self._argmax[row].fill_(-1)
        self._evidence[row] = {}
        self._row_evidence[row] = None  # the listed entities' own "replace" evidence says it all
        self.merge(row, ids, vals, source=source, merge="replace", detail=details)
        self._row_evidence[row] = Evidence(source=source, score=base, merge="replace", detail={"row": "replaced"})
        return self

    def done(self) -> NodeValue:
        """The edited value (the original one when nothing was written)."""
        if self._values is None:
            return self._base
        assert self._evidence is not None
        return NodeValue(values=self._values, argmax=self._argmax, evidence=tuple(self._evidence),
                         row_evidence=tuple(self._row_evidence), annotations=self._base.annotations)


def merge_scores(value: NodeValue, row: int, entity_ids: Sequence[int], scores: Sequence[float], *,
                 source: str, merge: str = "max",
                 detail: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> NodeValue:
    """``value`` with ``scores`` merged into ``entity_ids`` of ``row`` (a new NodeValue; see :meth:`ValueEdit.merge`).

    Copies the (B, N) tensors; for many rows use ``value.edit()`` and one ``done()``.
    """
    return value.edit().merge(row, entity_ids, scores, source=source, merge=merge, detail=detail).done()


@dataclass(frozen=True)
class NodeContext:
    """Where a hook is: one node of a batch of B same-shaped queries.

    ``node``: the template node (resolved: ids) -- row 0's; ``nodes``: the B
    resolved nodes at this path, one per row (relations and anchors may differ
    by row); ``roots``: the B resolved queries; ``path``: child indices from the
    root (``()`` = the root); ``op``: ``"e"``, ``"p"``, ``"np"``, ``"i"``, ``"u"``,
    ``"n"`` or a registered type's op; ``relations``: per-row relation ids for ``p``/``np``, else
    ``None``; ``anchors``: per-row entity ids for ``"e"``, else ``None``;
    ``inputs``: the children's :class:`NodeValue` after their own hooks (read
    only); ``query_indices``: row -> index of the query in the caller's list;
    ``executor``: the :class:`~engine.exec.executor.Executor` (``artifact``,
    ``tnorm``, ``neg_scale``, ``device``).
    """

    node: "Node"
    nodes: tuple["Node", ...]
    roots: tuple["Node", ...]
    path: tuple[int, ...]
    op: str
    relations: tuple[int, ...] | None
    anchors: tuple[int, ...] | None
    inputs: tuple[NodeValue, ...]
    query_indices: tuple[int, ...]
    executor: "Executor"
    _trace: "BatchTrace" = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def rows(self) -> int:
        return len(self.nodes)

    @property
    def artifact(self):
        return self.executor.artifact

    @property
    def tnorm(self) -> str:
        return self.executor.tnorm

    @property
    def neg_scale(self) -> float:
        return self.executor.neg_scale

    @property
    def device(self) -> torch.device:
        return self.executor.device

    def entity_name(self, entity: int) -> str:
        return self.executor.artifact.entities[int(entity)]

    def relation_name(self, row: int) -> str | None:
        """The name of row ``row``'s relation (``p``/``np`` nodes), else ``None``."""
        if self.relations is None:
            return None
        return self.executor.artifact.relations[self.relations[row]]

    def note(self, row: int, key: str, value: Any) -> None:
        """Record ``key: value`` (JSON-serialisable) for ``row`` of this node in the query's trace.

        A key written twice keeps the last value.
        """
        if not 0 <= row < len(self.nodes):
            raise IndexError(f"row {row} out of range for a batch of {len(self.nodes)}")
        if not isinstance(key, str):
            raise TypeError(f"note key must be a string, got {type(key).__name__}")
        _check_json(value, f"note {key!r}")
        if self._trace is not None:
            self._trace.add_note(self.path, row, key, value)


#: A hook: ``hook(ctx, value) -> NodeValue | None`` (``None`` = unchanged).
Hook = Callable[[NodeContext, NodeValue], Optional[NodeValue]]


class HookHandle:
    """Returned by :meth:`Executor.add_hook`; :meth:`remove` unregisters the hook."""

    def __init__(self, registry: list, entry: Any) -> None:
        self._registry = registry
        self._entry = entry

    def remove(self) -> None:
        """Unregister the hook (no-op when already removed)."""
        try:
            self._registry.remove(self._entry)
        except ValueError:
            pass
