"""The 14 BetaE query structures and conversion from BetaE's nested tuples to query ASTs.

BetaE (Ren & Leskovec, 2020) names query structures by nested tuples over
``'e'`` (an anchor entity), ``'r'`` (a relation), ``'n'`` (negate the branch)
and ``'u'`` (union of the sibling branches); its pickled queries use the same
nesting with integer ids, ``-2`` for ``'n'`` and ``-1`` for ``'u'``.  Unions
(``2u``, ``up``) are stored in disjunctive normal form (``2u-DNF``, ``up-DNF``).

Binding order: :meth:`Structure.build` binds anchors and relations left to right
in the order their ``'e'``/``'r'`` appear in the BetaE tuple, e.g. ``pin`` =
``(('e', ('r', 'r')), ('e', ('r', 'n')))`` with anchors ``(e1, e2)`` and
relations ``(r1, r2, r3)`` is ``(i (p r2 (p r1 e1)) (np r3 e2))``.

Negation modes: ``"qto"`` turns a negated relation edge into a
:class:`~engine.lang.query.NegatedProjection` (QTO's ``1 - min(1, s * M)`` edge);
``"complement"`` wraps the projection in a :class:`~engine.lang.query.Complement`
(``1 - value``, as in BetaE/CQD).  A negation that follows a group rather than
a relation (BetaE's De Morgan forms) is always a complement.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from kgreason.errors import UserError

from engine.lang.query import (
    Anchor,
    Complement,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    rebuild,
    to_sexpr,
)

__all__ = ["Structure", "STRUCTURES", "NEGATION_MODES", "BETAE_NAMES", "structure_of", "from_betae", "get_structure",
           "convert_negation", "check_negation"]

NEGATION_MODES = ("qto", "complement")

_BETAE: dict[str, tuple] = {
    "1p": ("e", ("r",)),
    "2p": ("e", ("r", "r")),
    "3p": ("e", ("r", "r", "r")),
    "2i": (("e", ("r",)), ("e", ("r",))),
    "3i": (("e", ("r",)), ("e", ("r",)), ("e", ("r",))),
    "ip": ((("e", ("r",)), ("e", ("r",))), ("r",)),
    "pi": (("e", ("r", "r")), ("e", ("r",))),
    "2in": (("e", ("r",)), ("e", ("r", "n"))),
    "3in": (("e", ("r",)), ("e", ("r",)), ("e", ("r", "n"))),
    "inp": ((("e", ("r",)), ("e", ("r", "n"))), ("r",)),
    "pin": (("e", ("r", "r")), ("e", ("r", "n"))),
    "pni": (("e", ("r", "r", "n")), ("e", ("r",))),
    "2u": (("e", ("r",)), ("e", ("r",)), ("u",)),
    "up": ((("e", ("r",)), ("e", ("r",)), ("u",)), ("r",)),
}

#: Every BetaE structure tuple we know, by BetaE's own name (incl. the De Morgan union forms).
BETAE_NAMES: dict[tuple, str] = {v: k for k, v in _BETAE.items()}
BETAE_NAMES[((("e", ("r", "n")), ("e", ("r", "n"))), ("n",))] = "2u-DM"
# BetaE writes up-DM with the negation and the projection in one operator tuple.
BETAE_NAMES[((("e", ("r", "n")), ("e", ("r", "n"))), ("n", "r"))] = "up-DM"

# BetaE's own names for the DNF union tuples map to our 14 names.
_ALIASES = {"2u-DNF": "2u", "up-DNF": "up"}

_QUERY_CODES = {-1: "u", -2: "n"}


# Messages show user data (pickled tuples can be huge or thousands of levels deep) through a
# bounded repr: reprlib stops at ``maxlevel`` instead of recursing to the bottom.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxtuple, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 4, 6, 6, 60, 60


def _show(x: Any) -> str:
    return _REPR.repr(x)


#: Deepest tuple nesting a BetaE structure tuple has (the 14 structures and the De Morgan forms have 4).
_MAX_STRUCTURE_NESTING = 8


def _nesting_exceeds(t: Any, limit: int) -> bool:
    """True when tuples nest deeper than ``limit`` in ``t`` (iterative: no recursion, no hashing)."""
    stack = [(t, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, tuple):
            if d >= limit:
                return True
            stack.extend((y, d + 1) for y in x)
    return False


def _name_or_id(value: Any, what: str, q: Any) -> Any:
    """An anchor/relation value of a BetaE query: an id (int, numpy integer) or a name (str)."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return int(value)
    raise UserError(f"BetaE query {_show(q)}: expected {what} id, got {_show(value)}")


def _is_ops(t: Any) -> bool:
    """A tuple of operations (``('r', 'n')`` or ``(12, -2)``) rather than a branch or a group."""
    return isinstance(t, tuple) and len(t) > 0 and all(not isinstance(x, tuple) for x in t)


def check_negation(negation: str) -> None:
    """The one check of a negation mode (:data:`NEGATION_MODES`); raises :class:`UserError` naming the choices."""
    if negation not in NEGATION_MODES:
        raise UserError(f"unknown negation mode {_show(negation)}; expected one of {', '.join(NEGATION_MODES)}")


def _convert(s: Any, q: Any, negation: str) -> Node:
    """Walk a structure tuple ``s`` and the matching query tuple ``q`` in parallel."""
    if not isinstance(s, tuple) or not isinstance(q, tuple) or len(s) != len(q) or not s:
        raise UserError(f"BetaE query {_show(q)} does not match structure {_show(s)}")
    if s[0] == "e":  # a branch: (anchor, ops)
        if len(s) != 2 or not _is_ops(s[1]):
            raise UserError(f"malformed BetaE branch {_show(s)}")
        return _apply_ops(Anchor(_name_or_id(q[0], "an anchor", q)), s[1], q[1], negation)
    if len(s) >= 2 and s[-1] == ("u",):
        if q[-1] not in (("u",), (-1,)):
            raise UserError(f"BetaE query {_show(q)} does not match structure {_show(s)} (expected a union marker)")
        return Union(tuple(_convert(a, b, negation) for a, b in zip(s[:-1], q[:-1])))
    if len(s) >= 2 and not _is_ops(s[0]) and all(_is_ops(t) for t in s[1:]):
        node = _convert(s[0], q[0], negation)
        for ops_s, ops_q in zip(s[1:], q[1:]):
            node = _apply_ops(node, ops_s, ops_q, negation)
        return node
    if any(_is_ops(t) for t in s):
        raise UserError(f"unsupported BetaE structure {_show(s)}")
    return Intersection(tuple(_convert(a, b, negation) for a, b in zip(s, q)))


def _apply_ops(node: Node, ops_s: tuple, ops_q: Any, negation: str) -> Node:
    if not isinstance(ops_q, tuple) or len(ops_q) != len(ops_s):
        raise UserError(f"BetaE relations {_show(ops_q)} do not match {_show(ops_s)}")
    for o, v in zip(ops_s, ops_q):
        if o == "r":
            if isinstance(v, str) and v in ("n", "u") or (isinstance(v, int) and v < 0):
                raise UserError(f"expected a relation in {_show(ops_q)}, got {_show(v)}")
            node = Projection(_name_or_id(v, "a relation", ops_q), node)
        elif o == "n":
            if v not in ("n", -2):
                raise UserError(f"expected a negation marker (-2) in {_show(ops_q)}, got {_show(v)}")
            if negation == "qto" and isinstance(node, Projection):
                node = NegatedProjection(node.relation, node.arg)
            else:
                node = Complement(node)
        else:
            raise UserError(f"unexpected operation {_show(o)} in BetaE structure {_show(ops_s)}")
    return node


def from_betae(structure: tuple, query: tuple, *, negation: str = "qto") -> Node:
    """The AST of a BetaE query tuple ``query`` of structure tuple ``structure``.

    ``query`` holds integer ids (``-2`` = negation, ``-1`` = union marker), so the
    result is a resolved AST (anchors and relations are ids).
    """
    check_negation(negation)
    if _nesting_exceeds(structure, _MAX_STRUCTURE_NESTING):  # _convert recurses along the structure
        raise UserError(f"unsupported BetaE structure {_show(structure)} (nested deeper than any structure)")
    return _convert(structure, query, negation)


def structure_of(betae: tuple) -> str:
    """BetaE's name of a structure tuple (``'2u'``/``'up'`` for the DNF forms, ``'2u-DM'``/``'up-DM'`` for De Morgan)."""
    if _nesting_exceeds(betae, _MAX_STRUCTURE_NESTING):  # never hash (C recursion) a pathological tuple
        raise UserError(f"unknown BetaE structure {_show(betae)} (nested deeper than any structure)")
    try:
        return BETAE_NAMES[betae]
    except (KeyError, TypeError):
        raise UserError(f"unknown BetaE structure {_show(betae)}") from None


def _fill(s: Any, anchors: Iterator, relations: Iterator) -> Any:
    """A query tuple with the structure's 'e'/'r' replaced left to right."""
    if s == "e":
        return next(anchors)
    if s == "r":
        return next(relations)
    if s == "n":
        return -2
    if s == "u":
        return -1
    return tuple(_fill(x, anchors, relations) for x in s)


@dataclass(frozen=True)
class Structure:
    """One BetaE query structure.

    ``betae`` is BetaE's structure tuple; ``num_anchors``/``num_relations`` the
    number of ``'e'``/``'r'`` in it; ``sexpr`` the QTO-negation form with
    placeholders ``e1.. r1..`` in binding order.
    """

    name: str
    betae: tuple

    @property
    def num_anchors(self) -> int:
        return _count(self.betae, "e")

    @property
    def num_relations(self) -> int:
        return _count(self.betae, "r")

    @property
    def has_negation(self) -> bool:
        return _count(self.betae, "n") > 0

    @property
    def sexpr(self) -> str:
        return self.template("qto")

    def template(self, negation: str = "qto") -> str:
        """The S-expression with placeholder anchors ``e1..`` and relations ``r1..``."""
        a = [f"e{k + 1}" for k in range(self.num_anchors)]
        r = [f"r{k + 1}" for k in range(self.num_relations)]
        return to_sexpr(self.build(a, r, negation=negation))

    def build(self, anchors: Sequence[str | int], relations: Sequence[str | int], *, negation: str = "qto") -> Node:
        """The AST binding ``anchors`` and ``relations`` left to right as they appear in :attr:`betae`."""
        check_negation(negation)
        anchors, relations = list(anchors), list(relations)
        if len(anchors) != self.num_anchors or len(relations) != self.num_relations:
            raise UserError(
                f"structure {self.name} {self.sexpr} needs {self.num_anchors} anchor(s) and "
                f"{self.num_relations} relation(s), got {len(anchors)} anchor(s) and {len(relations)} relation(s)"
            )
        q = _fill(self.betae, iter(anchors), iter(relations))
        return _convert(self.betae, q, negation)


def _count(s: Any, sym: str) -> int:
    if isinstance(s, tuple):
        return sum(_count(x, sym) for x in s)
    return int(s == sym)


#: The 14 structures by name, in BetaE's usual order.
STRUCTURES: dict[str, Structure] = {name: Structure(name, t) for name, t in _BETAE.items()}


def get_structure(name: str) -> Structure:
    """The structure called ``name`` (BetaE's ``2u-DNF``/``up-DNF`` accepted); unknown names raise :class:`UserError`."""
    key = _ALIASES.get(name, name)
    try:
        return STRUCTURES[key]
    except KeyError:
        from kgreason.errors import unknown_name

        raise unknown_name("query structure", name, list(STRUCTURES)) from None


def convert_negation(node, mode: str | None):
    """``node`` with every negated projection written in ``mode``.

    ``"qto"``: ``(n (p r q))`` -> ``(np r q)``; ``"complement"``: ``(np r q)`` -> ``(n (p r q))``;
    ``None``: unchanged.  Other complements are kept.
    """
    if mode is None:
        return node
    check_negation(mode)

    def walk(n):
        if isinstance(n, Anchor):
            return n
        if isinstance(n, NegatedProjection):
            arg = walk(n.arg)
            return Complement(Projection(n.relation, arg)) if mode == "complement" else NegatedProjection(n.relation, arg)
        if isinstance(n, Complement):
            if mode == "qto" and isinstance(n.arg, Projection):
                return NegatedProjection(n.arg.relation, walk(n.arg.arg))
            return Complement(walk(n.arg))
        if isinstance(n, Projection):
            return Projection(n.relation, walk(n.arg))
        if isinstance(n, (Intersection, Union)):
            return type(n)(tuple(walk(a) for a in n.args))
        if not isinstance(n, Node):
            raise TypeError(f"not a query node: {_show(n)}")
        # A node type registered in the op table: the same node over converted children.
        return rebuild(n, tuple(walk(c) for c in n.children()), getattr(n, "relation", None))

    return walk(node)
