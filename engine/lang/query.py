"""The query language: a typed AST of first-order logical queries and its S-expression syntax.

Grammar (whitespace separates tokens; ``;`` has no special meaning)::

    query := ENTITY
           | (p  REL query)          projection:          {y : exists x in query, r(x, y)}
           | (np REL query)          negated projection:  QTO's "not r" edge, 1 - min(1, s * M_r[x, y])
           | (i  query query ...)    intersection (2 or more)
           | (u  query query ...)    union (2 or more)
           | (n  query)              complement (1 - value)

``ENTITY`` and ``REL`` are names.  A name is either a *bare* token (any run of
characters other than whitespace, ``(``, ``)`` and ``"``) or a *quoted* string
``"..."`` in which ``\\"``, ``\\\\``, ``\\n``, ``\\t`` and ``\\r`` are escapes.  The
inverse of relation ``X`` is the relation named ``X^-1`` (``"has part^-1"`` when
quoted: the suffix belongs to the name).

Ids: a bare token ``#123`` means the entity (or relation) with id 123; every
other token, including integer-looking ones such as ``42``, is a *name*
(resolved by name only; quote ``"#123"`` for a name that starts with ``#``).
This keeps names that look like numbers (FB15k-237 has some) unambiguous.
Ids are ASCII digits below ``2**63``.

Depth: a query nests at most :data:`MAX_QUERY_DEPTH` (100) operators on any
root-to-leaf path (``(n (n a))`` has depth 2, an entity depth 0).  The parser
reports a deeper expression as a :class:`~kgreason.errors.UserError` naming its
depth and the limit, and the node constructors refuse to build a deeper AST, so
every recursive walk downstream (resolution, printing, execution, explanations)
stays far inside Python's recursion limit.  Real queries are shallow (the
deepest BetaE structure has depth 3).

The AST nodes are frozen dataclasses; :data:`NODE_TYPES` maps each
S-expression head (``p``, ``np``, ``i``, ``u``, ``n``) to its class.  Printing,
parsing and the walks here go by each class's ``shape`` through the op table
(:mod:`engine.lang.optable`), so a node type registered there is parsed, printed
and resolved like the built-in ones.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterator, Sequence

from kgreason.errors import UserError
from kgreason.text import printable

from engine.lang.optable import NODE_TYPES, lookup, register

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

__all__ = [
    "Node",
    "Anchor",
    "Projection",
    "NegatedProjection",
    "Intersection",
    "Union",
    "Complement",
    "NODE_TYPES",
    "MAX_QUERY_DEPTH",
    "parse",
    "to_sexpr",
    "resolve",
    "named",
    "shape_key",
    "describe",
    "rebuild",
    "set_depth",
    "iter_nodes",
    "anchors_of",
    "relations_of",
    "path_query",
]

#: The deepest query (operators on one root-to-leaf path) that the parser and the node
#: constructors accept.  Every walk over an AST recurses once (a few Python frames)
#: per level, executor and explanations included; 100 levels keep them all well
#: inside the default recursion limit of 1000 even when called from a deep stack.
MAX_QUERY_DEPTH = 100


class Node:
    """Base class of query AST nodes (all frozen dataclasses).

    ``head`` is the S-expression head (``None`` for an anchor); ``shape`` how the
    node is built and written (:data:`engine.lang.optable.SHAPES`: ``"anchor"``,
    ``"relation"``, ``"unary"``, ``"nary"``); ``children()`` the sub-queries in
    order; ``depth`` the number of operators on the longest root-to-leaf path (0
    for an anchor, at most :data:`MAX_QUERY_DEPTH`).
    """

    head: ClassVar[str | None] = None
    shape: ClassVar[str] = ""

    def children(self) -> tuple["Node", ...]:
        return ()

    @property
    def depth(self) -> int:
        # Set once by the operator constructors (set_depth); anchors have none.
        return self.__dict__.get("_depth", 0)

    def __str__(self) -> str:
        return to_sexpr(self)


def set_depth(node: Node) -> None:
    """Record ``node.depth`` (children are built first, so this is O(#children)); refuse too deep a query.

    Every operator node's ``__post_init__`` calls it (a registered node type's too).
    """
    depth = 1 + max(c.depth for c in node.children())
    if depth > MAX_QUERY_DEPTH:
        raise UserError(f"query nested too deeply: {depth} levels, the maximum query depth is {MAX_QUERY_DEPTH}")
    object.__setattr__(node, "_depth", depth)


def _register(cls):
    register(cls)  # the language entry; engine.exec and engine.eval add their facets
    return cls


def _shape(node: Node) -> str:
    return lookup(type(node)).shape


def _check_name(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        # numpy integers are accepted and normalised by the caller
        raise TypeError(f"{what} must be a str (name) or int (id), got {type(value).__name__}")
    if isinstance(value, int) and value < 0:
        raise UserError(f"{what} id must be >= 0, got {value}")


def _norm_name(value):
    """numpy integers -> int; everything else unchanged."""
    if not isinstance(value, (str, int)) and hasattr(value, "__index__"):
        return int(value)
    return value


@_register
@dataclass(frozen=True)
class Anchor(Node):
    """A constant: one entity, by name (``str``) or id (``int``)."""

    shape: ClassVar[str] = "anchor"
    entity: str | int

    def __post_init__(self) -> None:
        object.__setattr__(self, "entity", _norm_name(self.entity))
        _check_name(self.entity, "anchor entity")


@_register
@dataclass(frozen=True)
class Projection(Node):
    """``(p REL arg)``: entities ``y`` with ``r(x, y)`` for some ``x`` in ``arg`` (max-product)."""

    head: ClassVar[str] = "p"
    shape: ClassVar[str] = "relation"
    relation: str | int
    arg: Node

    def __post_init__(self) -> None:
        object.__setattr__(self, "relation", _norm_name(self.relation))
        _check_name(self.relation, "relation")
        if not isinstance(self.arg, Node):
            raise TypeError(f"projection argument must be a Node, got {type(self.arg).__name__}")
        set_depth(self)

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


@_register
@dataclass(frozen=True)
class NegatedProjection(Node):
    """``(np REL arg)``: QTO's negated edge, value ``max_x arg(x) * (1 - min(1, s * M_r[x, y]))``."""

    head: ClassVar[str] = "np"
    shape: ClassVar[str] = "relation"
    relation: str | int
    arg: Node

    def __post_init__(self) -> None:
        object.__setattr__(self, "relation", _norm_name(self.relation))
        _check_name(self.relation, "relation")
        if not isinstance(self.arg, Node):
            raise TypeError(f"projection argument must be a Node, got {type(self.arg).__name__}")
        set_depth(self)

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


def _check_args(self, what: str) -> None:
    args = tuple(self.args)
    object.__setattr__(self, "args", args)
    if len(args) < 2:
        raise UserError(f"{what} needs at least 2 sub-queries, got {len(args)}")
    for a in args:
        if not isinstance(a, Node):
            raise TypeError(f"{what} arguments must be Nodes, got {type(a).__name__}")
    set_depth(self)


@_register
@dataclass(frozen=True)
class Intersection(Node):
    """``(i q1 q2 ...)``: conjunction of the sub-queries (t-norm of their values)."""

    head: ClassVar[str] = "i"
    shape: ClassVar[str] = "nary"
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        _check_args(self, "intersection")

    def children(self) -> tuple[Node, ...]:
        return self.args


@_register
@dataclass(frozen=True)
class Union(Node):
    """``(u q1 q2 ...)``: disjunction of the sub-queries (t-conorm of their values)."""

    head: ClassVar[str] = "u"
    shape: ClassVar[str] = "nary"
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        _check_args(self, "union")

    def children(self) -> tuple[Node, ...]:
        return self.args


@_register
@dataclass(frozen=True)
class Complement(Node):
    """``(n arg)``: ``1 - arg`` (every entity not in the sub-query)."""

    head: ClassVar[str] = "n"
    shape: ClassVar[str] = "unary"
    arg: Node

    def __post_init__(self) -> None:
        if not isinstance(self.arg, Node):
            raise TypeError(f"complement argument must be a Node, got {type(self.arg).__name__}")
        set_depth(self)

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


# ---------------------------------------------------------------------------------------- printing
_BARE_OK = re.compile(r'[^\s()"\\]+')
_ID_TOKEN = re.compile(r"#([0-9]+)")  # ASCII digits only (\d would take any Unicode digit)
_MAX_ID_DIGITS = 19  # ids are < 2**63; longer digit runs are refused before int() sees them
_ESCAPES_OUT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_ESCAPES_IN = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


def format_name(value: str | int) -> str:
    """The token for a name (bare when safe, quoted otherwise) or an id (``#123``)."""
    if isinstance(value, int):
        return f"#{value}"
    if _BARE_OK.fullmatch(value) and not value.startswith("#"):
        return value
    return '"' + "".join(_ESCAPES_OUT.get(c, c) for c in value) + '"'


def to_sexpr(node: Node) -> str:
    """The S-expression of ``node``; ``parse(to_sexpr(node)) == node``."""
    shape = _shape(node)
    if shape == "anchor":
        return format_name(node.entity)  # type: ignore[attr-defined]
    if shape == "relation":
        return f"({node.head} {format_name(node.relation)} {to_sexpr(node.children()[0])})"  # type: ignore[attr-defined]
    return f"({node.head} " + " ".join(to_sexpr(a) for a in node.children()) + ")"


# ----------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class _Tok:
    kind: str  # "(", ")", "name", "id", "end"
    value: str | int | None
    pos: int  # 0-based offset in the text
    quoted: bool = False


_ECHO_HALF_WIDTH = 40  # characters echoed on each side of the caret when a line is long


def _error(text: str, pos: int, message: str, where: str) -> UserError:
    """A parse error with ``where:line:column`` (1-based), the offending line and a caret."""
    line_start = text.rfind("\n", 0, pos) + 1
    line_end = text.find("\n", pos)
    if line_end < 0:
        line_end = len(text)
    line_no = text.count("\n", 0, pos) + 1
    col = pos - line_start + 1
    line = text[line_start:line_end]
    where = _printable(where)  # a file name may hold anything; the location stays one line
    if where:
        loc = f"{where}:{col}" if "\n" not in text else f"{where}:{line_no}:{col}"
    else:
        loc = f"column {col}" if "\n" not in text else f"line {line_no}, column {col}"
    # The echo is exactly one printable line with one character per column: tabs would
    # misalign the caret, and \r, \v, \f, \x1c-\x1e, \x85, U+2028/9 would break the
    # line (str.splitlines) or the terminal; they are shown as a space / U+FFFD.
    shown = "".join(c if c.isprintable() else " " if c == "\t" else "\ufffd" for c in line)
    caret = col - 1
    if len(shown) > 2 * _ECHO_HALF_WIDTH:
        # A long line (a query generated by a program) is echoed as a window around the caret.
        lo = max(0, caret - _ECHO_HALF_WIDTH)
        hi = min(len(shown), caret + _ECHO_HALF_WIDTH)
        shown = ("..." if lo > 0 else "") + shown[lo:hi] + ("..." if hi < len(shown) else "")
        caret = caret - lo + (3 if lo > 0 else 0)
    return UserError(f"{loc}: {message}\n  {shown}\n  {' ' * caret}^")


# Tokens and file names in messages: the one rule for untrusted text on a terminal (kgreason.text).
_printable = printable


def _describe_tok(tok: _Tok) -> str:
    if tok.kind == "end":
        return "end of input"
    if tok.kind in "()":
        return repr(tok.kind)
    return _printable(format_name(str(tok.value))) if tok.kind == "name" else f"#{tok.value}"


def _tokenize(text: str, where: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "()":
            toks.append(_Tok(c, None, i))
            i += 1
        elif c == '"':
            start = i
            i += 1
            buf: list[str] = []
            while True:
                if i >= n:
                    raise _error(text, start, "unterminated quoted name (expected a closing '\"')", where)
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\":
                    if i + 1 >= n:
                        raise _error(text, i, "unterminated escape at end of input", where)
                    esc = text[i + 1]
                    if esc not in _ESCAPES_IN:
                        raise _error(text, i, f"unknown escape '\\{_printable(esc)}' (expected one of \\\" \\\\ \\n \\t \\r)", where)
                    buf.append(_ESCAPES_IN[esc])
                    i += 2
                else:
                    buf.append(c)
                    i += 1
            if i < n and not (text[i].isspace() or text[i] in "()"):
                raise _error(text, i, "expected whitespace or a parenthesis after a quoted name", where)
            toks.append(_Tok("name", "".join(buf), start, quoted=True))
        else:
            m = _BARE_OK.match(text, i)
            if m is None:  # a backslash outside quotes
                raise _error(text, i, f"unexpected character {_printable(repr(c))} (quote names containing it)", where)
            word = m.group(0)
            idm = _ID_TOKEN.fullmatch(word)
            if idm:
                digits = idm.group(1).lstrip("0") or "0"  # int() refuses over 4300 digits, zeros included
                if len(digits) > _MAX_ID_DIGITS or int(digits) >= 2**63:
                    raise _error(text, i, f"id {_printable(word[:24])}{'...' if len(word) > 24 else ''} is too large", where)
                toks.append(_Tok("id", int(digits), i))
            else:
                if word.startswith("#"):
                    raise _error(text, i, f"expected an id like '#12' after '#', got {_printable(repr(word))} "
                                          "(quote names starting with '#')", where)
                toks.append(_Tok("name", word, i))
            i = m.end()
            if i < n and text[i] == '"':
                raise _error(text, i, "expected whitespace before a quoted name", where)
    toks.append(_Tok("end", None, n))
    return toks


class _Parser:
    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = where
        self.toks = _tokenize(text, where)
        self.k = 0

    def peek(self) -> _Tok:
        return self.toks[self.k]

    def take(self) -> _Tok:
        tok = self.toks[self.k]
        self.k += 1
        return tok

    def fail(self, tok: _Tok, expected: str) -> UserError:
        return _error(self.text, tok.pos, f"expected {expected}, got {_describe_tok(tok)}", self.where)

    def too_deep(self, tok: _Tok) -> UserError:
        """The error for the first '(' beyond :data:`MAX_QUERY_DEPTH`, naming the expression's full depth."""
        depth = deepest = 0
        for t in self.toks:  # the deepest nesting anywhere in the text (unbalanced text counts its opens)
            depth += (t.kind == "(") - (t.kind == ")")
            deepest = max(deepest, depth)
        return _error(self.text, tok.pos,
                      f"query nested too deeply: {deepest} levels, the maximum query depth is {MAX_QUERY_DEPTH}", self.where)

    def query(self, depth: int = 0) -> Node:
        """One query whose enclosing operators number ``depth`` (recursion is bounded by MAX_QUERY_DEPTH)."""
        tok = self.take()
        if tok.kind in ("name", "id"):
            assert tok.value is not None  # name and id tokens always carry one (for the type checker)
            return Anchor(tok.value)
        if tok.kind != "(":
            raise self.fail(tok, "a query (an entity name or '(')")
        depth += 1
        if depth > MAX_QUERY_DEPTH:
            raise self.too_deep(tok)
        head = self.take()
        if head.kind != "name" or head.quoted or head.value not in NODE_TYPES:
            known = [f"'{h}'" for h in NODE_TYPES]
            raise self.fail(head, f"an operator {', '.join(known[:-1])} or {known[-1]}")
        op = head.value
        cls = NODE_TYPES[op]
        shape = lookup(cls).shape
        if shape == "relation":
            rel = self.take()
            if rel.kind not in ("name", "id"):
                raise self.fail(rel, f"a relation name after '{op}'")
            assert rel.value is not None
            arg = self.query(depth)
            node: Node = cls(rel.value, arg)
        elif shape == "unary":
            node = cls(self.query(depth))
        else:
            args = [self.query(depth)]
            while self.peek().kind != ")":
                if self.peek().kind == "end":
                    break
                args.append(self.query(depth))
            if len(args) < 2:
                raise self.fail(self.peek(), f"a second sub-query for '{op}' (it takes 2 or more)")
            node = cls(tuple(args))
        close = self.take()
        if close.kind != ")":
            if shape != "nary":
                expected = f"')' closing '({op}'"
            else:
                expected = f"a sub-query or ')' closing '({op}'"
            raise self.fail(close, expected)
        return node


def parse(text: str, *, where: str = "") -> Node:
    """Parse one query expression.

    ``where`` (e.g. ``"queries.txt:3"``) prefixes error locations, which end in
    the 1-based column.  Raises :class:`UserError` with the column, the line and
    a caret under the offending token, and what was expected there; an
    expression nested deeper than :data:`MAX_QUERY_DEPTH` is such an error too.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse() expects a str, got {type(text).__name__}")
    p = _Parser(text, where)
    if p.peek().kind == "end":
        raise p.fail(p.peek(), "a query")
    node = p.query()
    if p.peek().kind != "end":
        raise p.fail(p.peek(), "end of the query (one query per expression)")
    return node


# ------------------------------------------------------------------------------------- traversals
def iter_nodes(node: Node) -> Iterator[Node]:
    """Pre-order traversal (an explicit stack: no generator chain as deep as the query)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children()))


def anchors_of(node: Node) -> list[str | int]:
    """Anchor entities in left-to-right order."""
    return [n.entity for n in iter_nodes(node) if _shape(n) == "anchor"]  # type: ignore[attr-defined]


def relations_of(node: Node) -> list[str | int]:
    """Relations in pre-order (outermost first)."""
    return [n.relation for n in iter_nodes(node) if _shape(n) == "relation"]  # type: ignore[attr-defined]


def shape_key(node: Node) -> tuple:
    """The query's structure with anchors and relations abstracted (hashable; equal keys batch together).

    E.g. ``(i (p r2 (p r1 e1)) (np r3 e2))`` -> ``("i", ("p", ("p", "e")), ("np", ("e",)))``-like nested tuples.
    """
    if isinstance(node, Anchor):
        return ("e",)
    return (node.head,) + tuple(shape_key(c) for c in node.children())


def rebuild(node: Node, children: tuple[Node, ...], relation: str | int | None = None) -> Node:
    """A node of ``node``'s type with these ``children`` (and ``relation``, for the ``"relation"`` shape)."""
    shape = _shape(node)
    if shape == "relation":
        return type(node)(relation, children[0])  # type: ignore[call-arg]
    if shape == "unary":
        return type(node)(children[0])  # type: ignore[call-arg]
    if shape == "nary":
        return type(node)(tuple(children))  # type: ignore[call-arg]
    raise TypeError(f"an anchor has no children to rebuild with: {node!r}")


def _map(node: Node, entity_fn, relation_fn) -> Node:
    shape = _shape(node)
    if shape == "anchor":
        return type(node)(entity_fn(node.entity))  # type: ignore[attr-defined,call-arg]
    # The relation before the children (outermost first): the first unknown name is the one reported.
    rel = relation_fn(node.relation) if shape == "relation" else None  # type: ignore[attr-defined]
    return rebuild(node, tuple(_map(a, entity_fn, relation_fn) for a in node.children()), rel)


def resolve(node: Node, artifact: "Artifact", *, where: str = "") -> Node:
    """The same query with every name replaced by its id in ``artifact``.

    Names are looked up exactly; an unknown one raises :class:`UserError`
    naming it and the closest known names.  Ids are range-checked.
    """

    n_ent, n_rel = artifact.num_entities, artifact.num_relations

    def fast() -> bool:
        """True when ``node`` already holds only in-range ids (then it is returned as is, no copy)."""
        for n in iter_nodes(node):
            shape = _shape(n)
            if shape == "anchor":
                if not (type(n.entity) is int and n.entity < n_ent):  # type: ignore[attr-defined]
                    return False
            elif shape == "relation":
                if not (type(n.relation) is int and n.relation < n_rel):  # type: ignore[attr-defined]
                    return False
        return True

    if fast():
        return node

    def ent(x):
        if isinstance(x, str) and x not in artifact._entity_index and _ID_TOKEN.fullmatch("#" + x) and len(x) < 10:
            close = artifact.entities[int(x)] if int(x) < artifact.num_entities else None
            hint = f" (bare numbers are names; write #{x} for the id{': ' + repr(close) if close else ''})"
            try:
                return artifact.entity_id(x, where)
            except UserError as exc:
                raise UserError(f"{exc}{hint}") from None
        return artifact.entity_id(x, where)

    def rel(x):
        return artifact.relation_id(x, where)

    return _map(node, ent, rel)


def named(node: Node, artifact: "Artifact") -> Node:
    """The same query with ids replaced by names (the inverse of :func:`resolve`)."""
    return _map(
        node,
        lambda e: artifact.entities[e] if isinstance(e, int) else e,
        lambda r: artifact.relations[r] if isinstance(r, int) else r,
    )


def describe(node: Node, artifact: "Artifact | None" = None) -> str:
    """The query in words, with variables: e.g. ``?y such that Tom Hanks -starred_actors^-1-> ?x1 and ?x1 -directed_by-> ?y``.

    Names come from ``artifact`` when given (ids are then shown as names).
    """
    counter = [0]

    def ename(e) -> str:
        if isinstance(e, int) and artifact is not None:
            return artifact.entities[e]
        return e if isinstance(e, str) else f"#{e}"

    def rname(r) -> str:
        if isinstance(r, int) and artifact is not None:
            return artifact.relations[r]
        return str(r) if isinstance(r, str) else f"#{r}"

    def fresh() -> str:
        counter[0] += 1
        return f"?x{counter[0]}"

    def about(n: Node, var: str) -> str:
        """A sentence saying that ``var`` satisfies ``n``."""
        if isinstance(n, Anchor):
            return f"{var} is {ename(n.entity)}"
        if isinstance(n, Projection) and _is_chain(n):
            return _chain(n, var)
        if isinstance(n, (Projection, NegatedProjection)):
            arrow = f"—{rname(n.relation)}→" if isinstance(n, Projection) else f"not —{rname(n.relation)}→"
            if isinstance(n.arg, Anchor):
                return f"{ename(n.arg.entity)} {arrow} {var}"
            x = fresh()
            return f"some {x} with [{about(n.arg, x)}] has {x} {arrow} {var}"
        if isinstance(n, Intersection):
            return " and ".join(f"({about(a, var)})" for a in n.args)
        if isinstance(n, Union):
            return " or ".join(f"({about(a, var)})" for a in n.args)
        if isinstance(n, Complement):
            return f"not ({about(n.arg, var)})"
        # A registered node type: its own words, else its op over its children's.
        entry = lookup(type(n))
        if entry.describe is not None:
            return entry.describe(n, var, about)
        return f"{n.head}(" + ", ".join(f"[{about(c, var)}]" for c in n.children()) + ")"

    def _is_chain(n: Node) -> bool:
        while isinstance(n, Projection):
            n = n.arg
        return isinstance(n, Anchor)

    def _chain(n: Node, var: str) -> str:
        rels = []
        while isinstance(n, Projection):
            rels.append(rname(n.relation))
            n = n.arg
        assert isinstance(n, Anchor)  # callers check _is_chain first
        parts = [ename(n.entity)]
        for k, r in enumerate(reversed(rels)):
            target = var if k == len(rels) - 1 else fresh()
            parts.append(f"—{r}→ {target}")
        return " ".join(parts)

    return f"?y such that {about(node, '?y')}"


def path_query(topic: str | int, relations: Sequence[str | int], *, exclude_topic: bool = True) -> Node:
    """The query of a relation path from ``topic``: ``(p r_L ... (p r_1 topic))``.

    With ``exclude_topic`` every set from the second hop on is ANDed with ``(n topic)``,
    ``(i (p r_s ...) (n topic))``: a path that comes back through the topic is no evidence
    (MetaQA's answer rule, :mod:`engine.eval.metaqa`; the ask loop's candidate paths).
    ``topic`` and ``relations`` may be names or ids (the AST keeps what it is given).
    """
    node: Node = Anchor(topic)
    for step, r in enumerate(relations):
        node = Projection(r, node)
        if exclude_topic and step >= 1:
            node = Intersection((node, Complement(Anchor(topic))))
    return node
