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
:class:`~engine.query.NegatedProjection` (QTO's ``1 - min(1, s * M)`` edge);
``"complement"`` wraps the projection in a :class:`~engine.query.Complement`
(``1 - value``, as in BetaE/CQD).  A negation that follows a group rather than
a relation (BetaE's De Morgan forms) is always a complement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from kge.errors import UserError

from .query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union, to_sexpr

__all__ = ["Structure", "STRUCTURES", "NEGATION_MODES", "BETAE_NAMES", "structure_of", "from_betae", "get_structure"]

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


def _is_ops(t: Any) -> bool:
    """A tuple of operations (``('r', 'n')`` or ``(12, -2)``) rather than a branch or a group."""
    return isinstance(t, tuple) and len(t) > 0 and all(not isinstance(x, tuple) for x in t)


def _check_negation(negation: str) -> None:
    if negation not in NEGATION_MODES:
        raise UserError(f"unknown negation mode {negation!r}; expected one of {', '.join(NEGATION_MODES)}")


def _convert(s: Any, q: Any, negation: str) -> Node:
    """Walk a structure tuple ``s`` and the matching query tuple ``q`` in parallel."""
    if not isinstance(s, tuple) or not isinstance(q, tuple) or len(s) != len(q) or not s:
        raise UserError(f"BetaE query {q!r} does not match structure {s!r}")
    if s[0] == "e":  # a branch: (anchor, ops)
        if len(s) != 2 or not _is_ops(s[1]):
            raise UserError(f"malformed BetaE branch {s!r}")
        return _apply_ops(Anchor(q[0]), s[1], q[1], negation)
    if len(s) >= 2 and s[-1] == ("u",):
        if q[-1] not in (("u",), (-1,)):
            raise UserError(f"BetaE query {q!r} does not match structure {s!r} (expected a union marker)")
        return Union(tuple(_convert(a, b, negation) for a, b in zip(s[:-1], q[:-1])))
    if len(s) >= 2 and not _is_ops(s[0]) and all(_is_ops(t) for t in s[1:]):
        node = _convert(s[0], q[0], negation)
        for ops_s, ops_q in zip(s[1:], q[1:]):
            node = _apply_ops(node, ops_s, ops_q, negation)
        return node
    if any(_is_ops(t) for t in s):
        raise UserError(f"unsupported BetaE structure {s!r}")
    return Intersection(tuple(_convert(a, b, negation) for a, b in zip(s, q)))


def _apply_ops(node: Node, ops_s: tuple, ops_q: Any, negation: str) -> Node:
    if not isinstance(ops_q, tuple) or len(ops_q) != len(ops_s):
        raise UserError(f"BetaE relations {ops_q!r} do not match {ops_s!r}")
    for o, v in zip(ops_s, ops_q):
        if o == "r":
            if isinstance(v, str) and v in ("n", "u") or (isinstance(v, int) and v < 0):
                raise UserError(f"expected a relation in {ops_q!r}, got {v!r}")
            node = Projection(v, node)
        elif o == "n":
            if v not in ("n", -2):
                raise UserError(f"expected a negation marker (-2) in {ops_q!r}, got {v!r}")
            if negation == "qto" and isinstance(node, Projection):
                node = NegatedProjection(node.relation, node.arg)
            else:
                node = Complement(node)
        else:
            raise UserError(f"unexpected operation {o!r} in BetaE structure {ops_s!r}")
    return node


def from_betae(structure: tuple, query: tuple, *, negation: str = "qto") -> Node:
    """The AST of a BetaE query tuple ``query`` of structure tuple ``structure``.

    ``query`` holds integer ids (``-2`` = negation, ``-1`` = union marker), so the
    result is a resolved AST (anchors and relations are ids).
    """
    _check_negation(negation)
    return _convert(structure, query, negation)


def structure_of(betae: tuple) -> str:
    """BetaE's name of a structure tuple (``'2u'``/``'up'`` for the DNF forms, ``'2u-DM'``/``'up-DM'`` for De Morgan)."""
    try:
        return BETAE_NAMES[betae]
    except (KeyError, TypeError):
        raise UserError(f"unknown BetaE structure {betae!r}") from None


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
        _check_negation(negation)
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
        from kge.errors import unknown_name

        raise unknown_name("query structure", name, list(STRUCTURES)) from None
