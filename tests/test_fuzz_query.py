"""Fuzzing the query language: random texts and random ASTs through parse -> resolve -> execute.

Property (issue 9): every input gives a result or one :class:`UserError` whose
message is one printable line (a parse error: that line, the echoed input line
and a caret), never another exception; ``to_sexpr`` round-trips every AST
(``parse(to_sexpr(q)) == q``); results are internally consistent (explanations
recompute their scores, ``scores`` agrees with ``answer``).

Budget: the "ci" hypothesis profile (tests/conftest.py) in the normal run; the
``slow``-marked twins run the "slow" profile's budget.
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.exec.executor import Executor
from engine.lang.query import (
    MAX_QUERY_DEPTH,
    Anchor,
    Complement,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    anchors_of,
    describe,
    format_name,
    iter_nodes,
    named,
    parse,
    relations_of,
    resolve,
    shape_key,
    to_sexpr,
)
from engine.lang.structures import convert_negation
from fuzz_support import TINY_ENTITIES, TINY_RELATIONS, check_user_error, tiny_world
from kgreason.errors import UserError

SLOW = settings(settings.get_profile("slow"))

_RELATION_NAMES = [r for base in TINY_RELATIONS for r in (base, base + "^-1")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world(tmp_path_factory)


@pytest.fixture(scope="module")
def executor(world):
    return Executor(world.artifact)


# ------------------------------------------------------------------------------------ strategies
_WHITESPACE = st.sampled_from([" ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\xa0", "\u2028",
                               "\u3000", "\x1c", "\x85", ""])
_SPECIAL_TOKENS = st.sampled_from([
    "(", "(", "(", ")", ")", ")", "p", "np", "i", "u", "n", "P", "not", '"', "\\", "#", "#0", "#1", "#15", "#16",
    "#99", "#0007", "#99999999999999999999", "#" + "9" * 30, "#" + "1" * 5000, "#" + "0" * 5000 + "1", "#x", "#-1", "#\u0661", "#1.5",
    "^-1", '""', '"\\q"', '"\\', '"a"b', 'a"b"', "\\n", "'", "(p", "p)", "()", ")(", "\x00", "\ud7ff", "\U0001f600",
    "\u200b", "\u0301", "e\u0301",
])
_QUOTED = st.text(max_size=8).map(lambda s: format_name(s) if s else '""')
_RAW_QUOTED = st.text(max_size=8).map(lambda s: '"' + s + '"')  # unescaped: quotes/backslashes inside
_TOKEN = st.one_of(
    _SPECIAL_TOKENS,
    st.sampled_from([format_name(e) for e in TINY_ENTITIES]),
    st.sampled_from([format_name(r) for r in _RELATION_NAMES]),
    _QUOTED,
    _RAW_QUOTED,
    st.text(max_size=4),
)
near_valid_texts = st.lists(st.tuples(_TOKEN, _WHITESPACE), max_size=30).map(
    lambda parts: "".join(t + w for t, w in parts))

_ENTITY_VALUES = st.one_of(st.sampled_from(TINY_ENTITIES), st.integers(0, 20), st.text(max_size=6))
_RELATION_VALUES = st.one_of(st.sampled_from(_RELATION_NAMES), st.integers(0, 10), st.text(max_size=6))


def _extend(children):
    args = st.lists(children, min_size=2, max_size=3).map(tuple)
    return st.one_of(
        st.builds(Projection, _RELATION_VALUES, children),
        st.builds(NegatedProjection, _RELATION_VALUES, children),
        st.builds(Complement, children),
        st.builds(Intersection, args),
        st.builds(Union, args),
    )


asts = st.recursive(st.builds(Anchor, _ENTITY_VALUES), _extend, max_leaves=10)
# Names that resolve, so that execution (not only resolution) is reached most of the time.
_KNOWN_ENTITY = st.one_of(st.sampled_from(TINY_ENTITIES), st.integers(0, len(TINY_ENTITIES) - 1))
_KNOWN_RELATION = st.one_of(st.sampled_from(_RELATION_NAMES), st.integers(0, len(_RELATION_NAMES) - 1))


def _extend_known(children):
    args = st.lists(children, min_size=2, max_size=3).map(tuple)
    return st.one_of(
        st.builds(Projection, _KNOWN_RELATION, children),
        st.builds(NegatedProjection, _KNOWN_RELATION, children),
        st.builds(Complement, children),
        st.builds(Intersection, args),
        st.builds(Union, args),
    )


known_asts = st.recursive(st.builds(Anchor, _KNOWN_ENTITY), _extend_known, max_leaves=10)


@st.composite
def mutated_texts(draw):
    """A valid expression with a few random character edits (deletions, insertions, duplicated spans)."""
    text = to_sexpr(draw(known_asts))
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "duplicate"]))
        if kind == "delete":
            text = text[:k] + text[k + 1:]
        elif kind == "insert":
            text = text[:k] + draw(st.one_of(_SPECIAL_TOKENS, st.text(max_size=2))) + text[k:]
        else:
            j = draw(st.integers(k, min(len(text), k + 12)))
            text = text[:j] + text[k:j] + text[j:]
    return text


@st.composite
def deep_texts(draw):
    """Chains of operators around the depth limit (and far beyond it), optionally unbalanced."""
    depth = draw(st.one_of(st.integers(MAX_QUERY_DEPTH - 3, MAX_QUERY_DEPTH + 3), st.sampled_from([330, 500, 989, 5000])))
    ops = draw(st.lists(st.sampled_from(["(n ", "(p r0 ", "(np likes ", "(i e1 ", "(u #2 "]), min_size=1, max_size=5))
    opens = "".join(ops[k % len(ops)] for k in range(depth))
    closes = ")" * (depth - draw(st.sampled_from([0, 0, 0, 1, depth])))
    return opens + draw(st.sampled_from(["e0", '"a b"', "#3", ""])) + closes


_HEADS = st.sampled_from(["p", "np", "i", "u", "n"] * 6 + ["", "q", '"p"', "(", "#1", "P"])
_NAME_TOKEN = st.one_of(st.sampled_from([format_name(e) for e in TINY_ENTITIES]),
                        st.sampled_from([format_name(r) for r in _RELATION_NAMES]), _TOKEN)


def _expr_text(children):
    """``(HEAD ARG...)`` with a plausible or wrong head, 0-3 arguments, random spacing, maybe unclosed."""
    return st.tuples(_HEADS, st.lists(st.tuples(_WHITESPACE, children), max_size=3), _WHITESPACE,
                     st.sampled_from([")", ")", ")", "", "))"])).map(
        lambda t: "(" + t[0] + "".join(w + c for w, c in t[1]) + t[2] + t[3])


grammar_texts = st.recursive(_NAME_TOKEN, _expr_text, max_leaves=12)
any_text = st.one_of(st.text(), near_valid_texts, grammar_texts, mutated_texts(), deep_texts())


# ------------------------------------------------------------------------------------ properties
def check_text(text: str, world, executor) -> None:
    try:
        q = parse(text, where="fuzz")
    except UserError as exc:
        msg = str(exc)
        check_user_error(msg, caret_ok=True)
        assert msg.startswith("fuzz:"), msg
        return
    # The round trip of a parsed text: its canonical S-expression parses back to the same AST.
    assert parse(to_sexpr(q)) == q
    check_ast(q, world, executor)


def check_ast(q: Node, world, executor) -> None:
    art = world.artifact
    text = to_sexpr(q)
    assert parse(text) == q, text
    assert str(q) == text
    assert 0 <= q.depth <= MAX_QUERY_DEPTH
    nodes = list(iter_nodes(q))
    assert nodes[0] is q and len(anchors_of(q)) == sum(isinstance(n, Anchor) for n in nodes)
    assert len(relations_of(q)) == sum(isinstance(n, (Projection, NegatedProjection)) for n in nodes)
    hash(shape_key(q))
    assert describe(q).startswith("?y such that ")
    try:
        r = resolve(q, art, where="fuzz")
    except UserError as exc:
        check_user_error(str(exc))
        return
    assert shape_key(r) == shape_key(q)
    assert all(isinstance(n.entity, int) for n in iter_nodes(r) if isinstance(n, Anchor))
    nm = named(r, art)
    assert resolve(nm, art) == r and parse(to_sexpr(nm)) == nm
    assert describe(r, art).startswith("?y such that ")
    for mode in ("qto", "complement"):
        try:
            converted = convert_negation(r, mode)
        except UserError as exc:  # complement form of a query at the depth limit is one level deeper
            check_user_error(str(exc))
            assert "nested too deeply" in str(exc)
            continue
        assert parse(to_sexpr(converted)) == converted

    (result,) = executor.answer([r], k=3, explain=True)
    assert result.query == to_sexpr(nm)
    scores = executor.scores([r])[0]
    assert scores.shape == (art.num_entities,)
    assert bool(((scores >= 0) & (scores <= 1)).all())
    previous = math.inf
    for a in result.answers:
        assert 0 < a.score <= 1 and a.score <= previous
        previous = a.score
        assert a.entity == art.entities[a.id]
        assert a.score == pytest.approx(float(scores[a.id]), abs=1e-6)
        e = a.explanation
        assert e.recompute(executor.tnorm) == pytest.approx(a.score, rel=1e-4, abs=1e-6)
        json.dumps(a.to_json())
        assert e.text()


# ------------------------------------------------------------------------------------ the tests
@given(any_text)
def test_fuzz_query_text(world, executor, text):
    check_text(text, world, executor)


@given(known_asts)
def test_fuzz_known_ast_executes(world, executor, q):
    check_ast(q, world, executor)


@given(asts)
def test_fuzz_random_ast(world, executor, q):
    check_ast(q, world, executor)


@given(st.lists(st.sampled_from(["p", "np", "n", "i", "u"]), min_size=1, max_size=6),
       st.integers(MAX_QUERY_DEPTH - 2, MAX_QUERY_DEPTH + 2))
def test_fuzz_deep_ast_by_constructors(world, executor, ops, depth):
    """Building an AST past MAX_QUERY_DEPTH is one UserError; up to it, everything works, executor included."""
    q: Node = Anchor("e0")
    expected = 0  # the depth the constructors must record
    try:
        for k in range(depth):
            op = ops[k % len(ops)]
            expected = 1 + max(expected, 1 if op == "u" else 0)  # u's sibling (p #2 e2) has depth 1
            q = {"p": lambda x: Projection("r0", x), "np": lambda x: NegatedProjection("likes", x),
                 "n": Complement, "i": lambda x: Intersection((x, Anchor(1))),
                 "u": lambda x: Union((Projection(2, Anchor("e2")), x))}[op](q)
    except UserError as exc:
        check_user_error(str(exc))
        assert expected == MAX_QUERY_DEPTH + 1
        assert f"{expected} levels" in str(exc) and f"maximum query depth is {MAX_QUERY_DEPTH}" in str(exc)
        return
    assert expected <= MAX_QUERY_DEPTH and q.depth == expected
    check_ast(q, world, executor)


@pytest.mark.parametrize("op", ["(n ", "(p r0 ", "(np likes ", "(i e1 ", "(u #2 "])
@pytest.mark.parametrize("depth", [MAX_QUERY_DEPTH, MAX_QUERY_DEPTH + 1, 330, 989, 5000])
def test_issue9_deep_queries_give_a_result_or_one_error(world, executor, op, depth):
    """Issue 9 item 3: 330-989 nested (n ...) or ~500 nested (p ...) raised RecursionError."""
    text = op * depth + "e0" + ")" * depth
    if depth > MAX_QUERY_DEPTH:
        with pytest.raises(UserError) as info:
            parse(text)
        msg = str(info.value)
        check_user_error(msg, caret_ok=True)
        assert f"query nested too deeply: {depth} levels, the maximum query depth is {MAX_QUERY_DEPTH}" in msg
        assert len(msg.split("\n")[1]) < 100  # a window of the long line, not all of it
    else:
        q = parse(text)
        assert q.depth == depth
        check_ast(q, world, executor)


def test_error_echo_is_one_printable_line():
    """Line separators and control characters in the input (or the location) do not break the caret echo."""
    with pytest.raises(UserError) as info:
        parse("(x", where="queries\n.txt:3")
    check_user_error(str(info.value), caret_ok=True)
    for text in ['("a\x0bb" c)', "a\rb c", "x\u2028y z", "(p r\x00 a) b", "(p r #\u0661)", "a\x85b c"]:
        with pytest.raises(UserError) as info:
            parse(text)
        check_user_error(str(info.value), caret_ok=True)


def test_ids_are_ascii_and_bounded():
    assert parse("#0007") == Anchor(7)
    assert parse("#" + "0" * 6000 + "7") == Anchor(7)  # int() alone refuses more than 4300 digits
    for text in ["#\u0661\u0662", "#" + "9" * 20, "#" + "1" * 5000]:
        with pytest.raises(UserError):
            parse(text)


# ------------------------------------------------------------------- slow twins (large budget)
@pytest.mark.slow
@SLOW
@given(any_text)
def test_fuzz_query_text_slow(world, executor, text):
    check_text(text, world, executor)


@pytest.mark.slow
@SLOW
@given(st.one_of(known_asts, asts))
def test_fuzz_ast_slow(world, executor, q):
    check_ast(q, world, executor)


# ------------------------------------------------------------------- BetaE structures (structures.py)
from engine.lang.structures import BETAE_NAMES, STRUCTURES, from_betae, structure_of  # noqa: E402

_ATOMS = st.one_of(st.integers(-3, 20), st.sampled_from(["e", "r", "n", "u", "x", "", True, None, 1.5]),
                   st.text(max_size=3))
_betae_tuples = st.recursive(_ATOMS, lambda c: st.lists(c, max_size=4).map(tuple), max_leaves=16)


@st.composite
def betae_pairs(draw):
    """(structure tuple, query tuple): a known structure with a well-formed, mutated or random query; or junk."""
    kind = draw(st.sampled_from(["known", "known", "mutated", "junk", "deep"]))
    structure = draw(st.sampled_from(sorted(BETAE_NAMES, key=str)))
    if kind == "junk":
        return draw(_betae_tuples), draw(_betae_tuples)
    if kind == "deep":  # nesting far past any structure, as a crafted pickle could hold
        t: object = ("e",)
        for _ in range(draw(st.sampled_from([6, 9, 50, 3000]))):
            t = (t, ("r",))
        return (t, t) if draw(st.booleans()) else (structure, t)

    def fill(s):
        if s == "e":
            return draw(st.integers(0, 15))
        if s == "r":
            return draw(st.integers(0, 7))
        if s == "n":
            return -2
        if s == "u":
            return -1
        return tuple(fill(x) for x in s)

    q = fill(structure)
    if kind == "mutated":  # replace one leaf or sub-tuple by something else
        path = []
        node = q
        while isinstance(node, tuple) and node and draw(st.booleans()):
            k = draw(st.integers(0, len(node) - 1))
            path.append(k)
            node = node[k]
        repl = draw(_betae_tuples)

        def put(t, p):
            if not p:
                return repl
            return tuple(put(x, p[1:]) if i == p[0] else x for i, x in enumerate(t))

        q = put(q, path)
    return structure, q


def check_betae(structure, query, world, executor) -> None:
    try:
        name = structure_of(structure)
    except UserError as exc:
        check_user_error(str(exc))
        name = None
    for negation in ("qto", "complement"):
        try:
            node = from_betae(structure, query, negation=negation)
        except UserError as exc:
            check_user_error(str(exc))
            continue
        assert name is not None, "from_betae accepted a structure that structure_of does not know"
        check_ast(node, world, executor)


@given(betae_pairs())
def test_fuzz_betae_tuples(world, executor, pair):
    check_betae(*pair, world, executor)


@given(st.sampled_from(sorted(STRUCTURES)), st.lists(_ENTITY_VALUES, max_size=4), st.lists(_RELATION_VALUES, max_size=4),
       st.sampled_from(["qto", "complement", "QTO", ""]))
def test_fuzz_structure_build(world, executor, name, anchors, relations, negation):
    try:
        node = STRUCTURES[name].build(anchors, relations, negation=negation)
    except UserError as exc:
        check_user_error(str(exc))
        return
    check_ast(node, world, executor)


@pytest.mark.slow
@SLOW
@given(betae_pairs())
def test_fuzz_betae_tuples_slow(world, executor, pair):
    check_betae(*pair, world, executor)
