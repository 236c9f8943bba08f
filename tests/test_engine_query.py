"""The query language (parser, printer, resolution) and the BetaE structures."""
from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.sparse as sp

from engine.lang.query import (
    NODE_TYPES,
    Anchor,
    Complement,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    anchors_of,
    describe,
    named,
    parse,
    relations_of,
    resolve,
    shape_key,
    to_sexpr,
)
from engine.lang.structures import BETAE_NAMES, STRUCTURES, from_betae, get_structure, structure_of
from kge import Artifact, UserError

NASTY = [
    "Tom Hanks", "p", "np", "i", "u", "n", "(", ")", "a(b)c", '"', 'say "hi"', "back\\slash", "\\", "#", "#12",
    "#x", "12", "-3", "3.5", "", " ", "  lead", "trail  ", "tab\there", "new\nline", "cr\rhere", "^-1", "r^-1",
    "has part^-1", "Zoë", "東京", "🙂", "a;b", "'single'", "x\"y(z)", "\\n", "e\\\"",
]


def random_name(rng: random.Random):
    if rng.random() < 0.15:
        return rng.randrange(0, 10**6)
    if rng.random() < 0.6:
        return rng.choice(NASTY)
    alphabet = 'ab (")\\#\t\n^-1é '
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))


def random_ast(rng: random.Random, depth: int) -> Node:
    kind = rng.choice(["e"] if depth == 0 else ["e", "p", "np", "i", "u", "n"])
    if kind == "e":
        return Anchor(random_name(rng))
    if kind in ("p", "np"):
        return NODE_TYPES[kind](random_name(rng), random_ast(rng, depth - 1))
    if kind == "n":
        return Complement(random_ast(rng, depth - 1))
    return NODE_TYPES[kind](tuple(random_ast(rng, depth - 1) for _ in range(rng.randrange(2, 5))))


@pytest.mark.parametrize("seed", range(5))
def test_round_trip_random_asts(seed):
    rng = random.Random(seed)
    for _ in range(200):
        node = random_ast(rng, depth=rng.randrange(0, 5))
        text = to_sexpr(node)
        assert "\n" not in text and "\t" not in text  # one expression per line stays one line
        assert parse(text) == node
        # Extra whitespace anywhere between tokens does not matter.
        spaced = text.replace("(", " ( ").replace(")", " )\n")
        if '"' not in text:
            assert parse(spaced) == node


def test_ids_and_integer_looking_names():
    assert parse("#12") == Anchor(12)
    assert parse("12") == Anchor("12")
    assert parse('"#12"') == Anchor("#12")
    assert parse("(p #3 x)") == Projection(3, Anchor("x"))
    assert to_sexpr(Anchor("#12")) == '"#12"'
    assert to_sexpr(Anchor(12)) == "#12"
    assert to_sexpr(Anchor(np.int64(5))) == "#5"


def test_parse_examples():
    q = parse('(i (p directed_by (p "starred_actors^-1" "Tom Hanks")) (np genre "Drama film"))')
    assert q == Intersection((
        Projection("directed_by", Projection("starred_actors^-1", Anchor("Tom Hanks"))),
        NegatedProjection("genre", Anchor("Drama film")),
    ))
    assert parse("(u a b c)") == Union((Anchor("a"), Anchor("b"), Anchor("c")))
    assert parse("(n (u a b))") == Complement(Union((Anchor("a"), Anchor("b"))))
    assert anchors_of(q) == ["Tom Hanks", "Drama film"]
    assert relations_of(q) == ["directed_by", "starred_actors^-1", "genre"]


@pytest.mark.parametrize(
    "text, column, expected",
    [
        ("", 1, "expected a query, got end of input"),
        ("(p r)", 5, "expected a query (an entity name or '('), got ')'"),
        ("(x a b)", 2, "expected an operator 'p', 'np', 'i', 'u' or 'n', got x"),
        ("(i a)", 5, "expected a second sub-query for 'i'"),
        ("(i a b", 7, "expected a sub-query or ')' closing '(i', got end of input"),
        ("(p r a b)", 8, "expected ')' closing '(p', got b"),
        ("(n a b)", 6, "expected ')' closing '(n', got b"),
        ("(p r a) c", 9, "expected end of the query"),
        ('(p r "abc', 6, "unterminated quoted name"),
        ('(p r "a\\qb")', 8, "unknown escape '\\q'"),
        ('(p r "ab"c)', 10, "expected whitespace or a parenthesis after a quoted name"),
        ('(p r ab"c")', 8, "expected whitespace before a quoted name"),
        ("(p #x a)", 4, "expected an id like '#12'"),
        ("(p)", 3, "expected a relation name after 'p', got ')'"),
        ('("p" r a)', 2, "expected an operator"),
        (")", 1, "expected a query"),
        ("(p r a\\b)", 7, "unexpected character '\\\\'"),
    ],
)
def test_parse_error_columns(text, column, expected):
    with pytest.raises(UserError) as info:
        parse(text)
    msg = str(info.value)
    first, echoed, caret = msg.split("\n")
    assert first.startswith(f"column {column}: ")
    assert expected in first
    assert echoed == "  " + text
    assert caret == "  " + " " * (column - 1) + "^"


def test_parse_error_location_prefix_and_multiline():
    with pytest.raises(UserError, match=r"^queries\.txt:3:5: expected a query"):
        parse("(p r)", where="queries.txt:3")
    with pytest.raises(UserError, match=r"^line 2, column 3: "):
        parse("(p r\n  )")


def test_node_validation():
    with pytest.raises(UserError, match="at least 2"):
        Intersection((Anchor("a"),))
    with pytest.raises(TypeError):
        Projection("r", "a")
    with pytest.raises(TypeError):
        Anchor(1.5)
    with pytest.raises(UserError, match=">= 0"):
        Anchor(-1)
    assert Union([Anchor("a"), Anchor("b")]).args == (Anchor("a"), Anchor("b"))  # lists become tuples
    assert hash(parse("(i (p r a) (n b))")) == hash(parse("(i  (p r a)(n b))"))


def test_shape_key_abstracts_names():
    a = parse("(i (p r2 (p r1 e1)) (np r3 e2))")
    b = parse('(i (p #4 (p x "y z")) (np q #0))')
    c = parse("(i (p r3 e2) (p r2 (p r1 e1)))")
    assert shape_key(a) == shape_key(b) != shape_key(c)


def small_artifact() -> Artifact:
    ents = ["Tom Hanks", "Cast Away", "Robert Zemeckis", "12", "Drama"]
    rels = ["starred", "starred^-1", "directed_by", "directed_by^-1"]
    n = len(ents)
    m = sp.csr_matrix((len(rels) * n, n), dtype=np.float32)
    return Artifact(entities=ents, relations=rels, matrices=m, observed=np.zeros((0, 3)), missing=np.zeros((0, 3)))


def test_resolve_named_describe():
    art = small_artifact()
    q = parse('(i (p directed_by (p starred "Tom Hanks")) (np "directed_by^-1" #4))')
    r = resolve(q, art)
    assert r == parse("(i (p #2 (p #0 #0)) (np #3 #4))")
    assert named(r, art) == parse('(i (p directed_by (p starred "Tom Hanks")) (np "directed_by^-1" Drama))')
    words = describe(r, art)
    assert "Tom Hanks —starred→ ?x1 —directed_by→ ?y" in words
    assert "Drama not —directed_by^-1→ ?y" in words
    assert resolve(parse("12"), art) == Anchor(3)  # integer-looking names resolve by name


def test_resolve_errors_name_closest():
    art = small_artifact()
    with pytest.raises(UserError, match=r"unknown entity 'Tom Hank'; closest known: 'Tom Hanks'"):
        resolve(parse('(p starred "Tom Hank")'), art)
    with pytest.raises(UserError, match=r"unknown relation 'directed'; closest known: 'directed_by'"):
        resolve(parse("(p directed x)"), art)
    with pytest.raises(UserError, match=r"write #2 for the id"):
        resolve(parse("2"), art)
    with pytest.raises(UserError, match=r"relation id 9 out of range"):
        resolve(parse("(p #9 #0)"), art)


# ------------------------------------------------------------------------------ structures
BETAE_QUERY_NAME_DICT = {  # as in BetaE's main.py
    ("e", ("r",)): "1p",
    ("e", ("r", "r")): "2p",
    ("e", ("r", "r", "r")): "3p",
    (("e", ("r",)), ("e", ("r",))): "2i",
    (("e", ("r",)), ("e", ("r",)), ("e", ("r",))): "3i",
    ((("e", ("r",)), ("e", ("r",))), ("r",)): "ip",
    (("e", ("r", "r")), ("e", ("r",))): "pi",
    (("e", ("r",)), ("e", ("r", "n"))): "2in",
    (("e", ("r",)), ("e", ("r",)), ("e", ("r", "n"))): "3in",
    ((("e", ("r",)), ("e", ("r", "n"))), ("r",)): "inp",
    (("e", ("r", "r")), ("e", ("r", "n"))): "pin",
    (("e", ("r", "r", "n")), ("e", ("r",))): "pni",
    (("e", ("r",)), ("e", ("r",)), ("u",)): "2u-DNF",
    ((("e", ("r",)), ("e", ("r",)), ("u",)), ("r",)): "up-DNF",
    ((("e", ("r", "n")), ("e", ("r", "n"))), ("n",)): "2u-DM",
    ((("e", ("r", "n")), ("e", ("r", "n"))), ("n", "r")): "up-DM",
}

EXPECTED_QTO = {
    "1p": "(p r1 e1)",
    "2p": "(p r2 (p r1 e1))",
    "3p": "(p r3 (p r2 (p r1 e1)))",
    "2i": "(i (p r1 e1) (p r2 e2))",
    "3i": "(i (p r1 e1) (p r2 e2) (p r3 e3))",
    "ip": "(p r3 (i (p r1 e1) (p r2 e2)))",
    "pi": "(i (p r2 (p r1 e1)) (p r3 e2))",
    "2in": "(i (p r1 e1) (np r2 e2))",
    "3in": "(i (p r1 e1) (p r2 e2) (np r3 e3))",
    "inp": "(p r3 (i (p r1 e1) (np r2 e2)))",
    "pin": "(i (p r2 (p r1 e1)) (np r3 e2))",
    "pni": "(i (np r2 (p r1 e1)) (p r3 e2))",
    "2u": "(u (p r1 e1) (p r2 e2))",
    "up": "(p r3 (u (p r1 e1) (p r2 e2)))",
}


def test_structures_match_betae():
    assert list(STRUCTURES) == list(EXPECTED_QTO)
    for tup, name in BETAE_QUERY_NAME_DICT.items():
        short = name.replace("-DNF", "")
        if short in STRUCTURES:
            assert STRUCTURES[short].betae == tup
            assert structure_of(tup) == short
        else:
            assert structure_of(tup) == name
    for name, s in STRUCTURES.items():
        assert s.name == name
        assert s.sexpr == EXPECTED_QTO[name]
        assert s.template("complement") == EXPECTED_QTO[name].replace("(np r2 e2)", "(n (p r2 e2))") \
            .replace("(np r3 e3)", "(n (p r3 e3))").replace("(np r3 e2)", "(n (p r3 e2))") \
            .replace("(np r2 (p r1 e1))", "(n (p r2 (p r1 e1)))")
        assert s.num_anchors == sum(1 for t in s.sexpr.split() if t.strip("()").startswith("e"))
        assert s.num_relations == sum(1 for t in s.sexpr.split() if t.strip("()").startswith("r"))
    assert get_structure("2u-DNF") is STRUCTURES["2u"]


def test_build_binding_order_and_negation_modes():
    pin = STRUCTURES["pin"]
    assert to_sexpr(pin.build(["a", "b"], ["r1", "r2", "r3"])) == "(i (p r2 (p r1 a)) (np r3 b))"
    assert to_sexpr(pin.build(["a", "b"], ["r1", "r2", "r3"], negation="complement")) == "(i (p r2 (p r1 a)) (n (p r3 b)))"
    with pytest.raises(UserError, match=r"pin .* needs 2 anchor\(s\) and 3 relation\(s\), got 1 anchor\(s\) and 3"):
        pin.build(["a"], ["r1", "r2", "r3"])
    with pytest.raises(UserError, match="negation mode"):
        pin.build(["a", "b"], ["r1", "r2", "r3"], negation="nope")
    with pytest.raises(UserError, match=r"unknown query structure 'pni2'; closest known: 'pni'"):
        get_structure("pni2")


def test_from_betae_query_tuples():
    # Tuples as they appear in BetaE's pickles: ids, -2 for negation, -1 for the union marker.
    assert from_betae(STRUCTURES["pin"].betae, ((5, (1, 2)), (6, (3, -2)))) == parse("(i (p #2 (p #1 #5)) (np #3 #6))")
    assert from_betae(STRUCTURES["pni"].betae, ((5, (1, 2, -2)), (6, (3,))), negation="complement") == \
        parse("(i (n (p #2 (p #1 #5))) (p #3 #6))")
    assert from_betae(STRUCTURES["up"].betae, (((5, (1,)), (6, (2,)), (-1,)), (3,))) == \
        parse("(p #3 (u (p #1 #5) (p #2 #6)))")
    dm = next(t for t, n in BETAE_QUERY_NAME_DICT.items() if n == "up-DM")
    assert from_betae(dm, (((5, (1, -2)), (6, (2, -2))), (-2, 3))) == \
        parse("(p #3 (n (i (np #1 #5) (np #2 #6))))")
    for name, s in STRUCTURES.items():  # build() and from_betae() agree
        rng = random.Random(name)
        a = [rng.randrange(100) for _ in range(s.num_anchors)]
        r = [rng.randrange(100) for _ in range(s.num_relations)]
        for neg in ("qto", "complement"):
            node = s.build(a, r, negation=neg)
            assert anchors_of(node) == a
    with pytest.raises(UserError, match="does not match"):
        from_betae(STRUCTURES["2i"].betae, ((1, (2,)),))
    with pytest.raises(UserError, match="unknown BetaE structure"):
        structure_of(("e", ("x",)))
    assert set(BETAE_NAMES.values()) >= set(STRUCTURES)


@pytest.mark.parametrize("negation", ["qto", "complement"])
def test_describe_every_structure(negation):
    art = small_artifact()
    for name, s in STRUCTURES.items():
        node = resolve(s.build(list(range(s.num_anchors)), list(range(s.num_relations)), negation=negation), art)
        words = describe(node, art)
        assert words.startswith("?y such that ")
        for e in anchors_of(node):
            assert art.entities[e] in words
        for r in relations_of(node):
            assert art.relations[r] in words
        assert ("not" in words) == s.has_negation


def test_too_deep_nesting_is_a_user_error():
    with pytest.raises(UserError, match="nested too deeply"):
        parse("(n " * 5000 + "a" + ")" * 5000)
