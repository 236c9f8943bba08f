"""The op table: everything the engine does with a query node, keyed by node type.

One :class:`NodeOp` per node class says

* **language** (from the class itself): its S-expression ``head`` and its
  ``shape``, which fix how it is printed, parsed, mapped (names <-> ids) and
  scanned: ``"anchor"`` (an entity), ``"relation"`` (``cls(relation, arg)``:
  ``(head REL q)``), ``"unary"`` (``cls(arg)``: ``(head q)``) or ``"nary"``
  (``cls(args)``: ``(head q1 q2 ...)``); the constructor's parameters are also the
  node's fields (``entity``; ``relation``, ``arg``; ``arg``; ``args``, a tuple);
* ``forward``: how the executor computes the node on fuzzy (B, N) sets
  (:mod:`engine.exec.executor`: ``forward(executor, nodes, path, run) -> (value, inputs)``);
* ``explain``: how the backward pass explains the node at one entity
  (``explain(site) -> Explanation``, :class:`engine.exec.executor.ExplainSite`), and
  ``recompute``: the KG part of an explanation's score from its children
  (``recompute(explanation, tnorm) -> float``, :mod:`engine.exec.explain`);
* ``exact``: its exact-set semantics on a triple set
  (``exact(nodes, graph, evaluate) -> Frontier``, :mod:`engine.eval.symbolic`);
* ``describe`` (optional): its words in :func:`~engine.lang.query.describe`
  (``describe(node, var, about) -> str``, ``about(child, var)`` the child's words).

**Adding a node type is one registration**: a frozen dataclass subclass of
:class:`~engine.lang.query.Node` with a ``head`` and a ``shape``, then one
``register(cls, forward=..., explain=..., recompute=..., exact=...)``; the parser,
printer, resolver, executor (scores, answers, hooks, traces), explanations and the
symbolic evaluator then all take it (tests/test_engine_optable.py registers a
``Difference`` this way, in the test only).  The built-in types register their facets
from the layer that implements them (the layering forbids :mod:`engine.lang`
importing torch or scipy): the language here, ``forward``/``explain`` in
:mod:`engine.exec.executor`, ``recompute`` in :mod:`engine.exec.explain`,
``exact`` in :mod:`engine.eval.symbolic`; each fills its own slot of the one entry.

Lookups are one dict access per node (per batch in the executor), never per row.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

__all__ = ["NodeOp", "SHAPES", "FACETS", "NODE_TYPES", "register", "unregister", "lookup", "entries", "by_op", "ops"]

#: The node shapes (see the module doc).
SHAPES = ("anchor", "relation", "unary", "nary")
#: The facets a registration may set (besides the class's own language bits).
FACETS = ("forward", "explain", "recompute", "exact", "describe")


@dataclass(frozen=True)
class NodeOp:
    """The op table's entry for node class ``cls`` (see the module doc); ``op`` is its trace/hook/explanation
    name (``"e"`` for an anchor, else ``cls.head``).  A facet is ``None`` until its layer registers it."""

    cls: type
    op: str
    shape: str
    forward: Callable[..., Any] | None = None
    explain: Callable[..., Any] | None = None
    recompute: Callable[..., Any] | None = None
    exact: Callable[..., Any] | None = None
    describe: Callable[..., Any] | None = None

    def need(self, facet: str, what: str) -> Callable[..., Any]:
        """The facet, or a TypeError naming the node type and what it lacks."""
        fn = getattr(self, facet)
        if fn is None:
            raise TypeError(f"node type {self.cls.__name__} ({self.op!r}) has no {facet!r} in the op table: "
                            f"register one to {what}")
        return fn


_TABLE: dict[type, NodeOp] = {}
_BY_OP: dict[str, NodeOp] = {}
#: S-expression head -> node class, for the parser (every registered type with a head).
NODE_TYPES: dict[str, type] = {}


def register(cls: type, **facets: Callable[..., Any] | None) -> NodeOp:
    """Register node class ``cls`` (or add facets to its entry); returns the entry.

    ``cls`` needs a class attribute ``shape`` (one of :data:`SHAPES`) and, unless it
    is an anchor, a ``head`` (its S-expression operator, also its op name), unique
    across node types.  ``facets``: any of ``forward``, ``explain``, ``recompute``,
    ``exact``, ``describe`` (see the module doc).  Registering a facet the entry
    already holds with a different function is an error: one node type, one meaning.
    """
    bad = sorted(set(facets) - set(FACETS))
    if bad:
        raise TypeError(f"register(): unknown facet(s) {', '.join(bad)}; expected some of {', '.join(FACETS)}")
    shape = getattr(cls, "shape", None)
    if shape not in SHAPES:
        raise TypeError(f"register(): {getattr(cls, '__name__', cls)!r} needs a class attribute shape, one of "
                        f"{', '.join(SHAPES)}; got {shape!r}")
    head = getattr(cls, "head", None)
    op = "e" if shape == "anchor" else head
    if not isinstance(op, str) or not op or any(c.isspace() or c in '()"#\\' for c in op):
        raise TypeError(f"register(): {cls.__name__} needs a head (a bare S-expression token), got {head!r}")
    entry = _TABLE.get(cls)
    if entry is None:
        other = _BY_OP.get(op)
        if other is not None:
            raise TypeError(f"register(): op {op!r} already belongs to {other.cls.__name__}")
        entry = NodeOp(cls=cls, op=op, shape=shape)
    for name, fn in facets.items():
        if fn is None:
            continue
        if not callable(fn):
            raise TypeError(f"register(): facet {name!r} of {cls.__name__} must be callable")
        old = getattr(entry, name)
        if old is not None and old is not fn:
            raise TypeError(f"register(): {cls.__name__} already has a {name!r} facet")
        entry = replace(entry, **{name: fn})  # type: ignore[arg-type]  # name is one of FACETS
    _TABLE[cls] = entry
    _BY_OP[op] = entry
    if shape != "anchor":
        NODE_TYPES[op] = cls
    return entry


def unregister(cls: type) -> None:
    """Remove node class ``cls`` from the table (a test's or plugin's own type; no-op when absent)."""
    entry = _TABLE.pop(cls, None)
    if entry is not None:
        _BY_OP.pop(entry.op, None)
        if NODE_TYPES.get(entry.op) is cls:
            del NODE_TYPES[entry.op]


def lookup(cls: type) -> NodeOp:
    """The entry of node class ``cls``; a TypeError for a class that is not a registered node type."""
    entry = _TABLE.get(cls)
    if entry is None:
        # A subclass of a registered type (not registered itself) is that type.
        for base in getattr(cls, "__mro__", ())[1:]:
            entry = _TABLE.get(base)
            if entry is not None:
                return entry
        raise TypeError(f"not a query node type: {getattr(cls, '__name__', cls)!r} (register it in "
                        "engine.lang.optable)")
    return entry


def entries() -> dict[type, NodeOp]:
    """The live table (class -> entry): hot loops hold it and call ``.get`` once per node."""
    return _TABLE


def by_op(op: str) -> NodeOp:
    """The entry whose op is ``op`` (``"e"``, ``"p"``, ...); a ValueError when there is none."""
    entry = _BY_OP.get(op)
    if entry is None:
        raise ValueError(f"unknown node op {op!r}; expected one of {', '.join(_BY_OP)}")
    return entry


def ops() -> tuple[str, ...]:
    """Every registered op, in registration order (the built-ins first: e, p, np, i, u, n)."""
    return tuple(_BY_OP)
