"""The op table: a node type added by ONE registration, in this test only, runs everywhere.

``Difference`` (``(d a b)`` = a AND NOT b) and ``Min`` (``(min a b ...)``, a Gödel
intersection whatever the executor's t-norm) are defined and registered here, never in
engine code, and go through parsing, printing, resolving, the executor's forward pass
(scores, sparse runs, passes, hooks, traces), explanations (recomputed scores) and the
exact-set evaluator.  Each is checked against the built-in query that means the same
(``(i a (n b))``; ``(i a b ...)`` under the Gödel t-norm): bit for bit on random KGs
and queries.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from engine.eval.symbolic import Graph, answers, complement, conjoin
from engine.exec.executor import Executor, explain_pointwise
from engine.exec.explain import combine_scores
from engine.exec.hooks import NodeValue
from engine.lang import optable
from engine.lang.query import (
    Anchor,
    Complement,
    Intersection,
    Node,
    Projection,
    describe,
    named,
    parse,
    relations_of,
    resolve,
    set_depth,
    shape_key,
    to_sexpr,
)
from kge.artifact import Artifact
from kgreason.errors import UserError


# ------------------------------------------------------------------------------ the new node types
@dataclass(frozen=True)
class Difference(Node):
    """``(d a b)``: a AND NOT b (t-norm of ``a`` and ``1 - b``)."""

    head: ClassVar[str] = "d"
    shape: ClassVar[str] = "nary"
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        if len(self.args) != 2:
            raise UserError(f"d takes 2 sub-queries, got {len(self.args)}")
        set_depth(self)

    def children(self) -> tuple[Node, ...]:
        return self.args


@dataclass(frozen=True)
class Min(Node):
    """``(min a b ...)``: the Gödel intersection (elementwise minimum)."""

    head: ClassVar[str] = "min"
    shape: ClassVar[str] = "nary"
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        set_depth(self)

    def children(self) -> tuple[Node, ...]:
        return self.args


def _forward_difference(ex, nodes, path, run):
    a, b = run.children(nodes, path)
    return NodeValue(ex.ops.intersect([a.values, ex.ops.negate(b.values)], ex.tnorm)), (a, b)


def _recompute_difference(e, tnorm):
    if not e.children:
        return 0.0
    a, b = e.children
    return combine_scores("i", [a.recompute(tnorm), 1.0 - b.recompute(tnorm)], tnorm)


def _exact_difference(nodes, graph, evaluate):
    return conjoin(evaluate([q.args[0] for q in nodes]), complement(evaluate([q.args[1] for q in nodes])))


def _forward_min(ex, nodes, path, run):
    kids = run.children(nodes, path)
    return NodeValue(ex.ops.intersect([k.values for k in kids], "godel")), kids


def _recompute_min(e, tnorm):
    return min(c.recompute(tnorm) for c in e.children) if e.children else 0.0


def _exact_min(nodes, graph, evaluate):
    acc = None
    for column in zip(*(q.args for q in nodes)):
        f = evaluate(column)
        acc = f if acc is None else conjoin(acc, f)
    return acc


REGISTRATIONS = {
    Difference: dict(forward=_forward_difference, explain=explain_pointwise, recompute=_recompute_difference,
                     exact=_exact_difference, describe=lambda n, var, about: f"({about(n.args[0], var)}) but not "
                                                                              f"({about(n.args[1], var)})"),
    Min: dict(forward=_forward_min, explain=explain_pointwise, recompute=_recompute_min, exact=_exact_min),
}


@pytest.fixture
def registered():
    """Both types registered (one call each) for the test, removed afterwards."""
    for cls, facets in REGISTRATIONS.items():
        optable.register(cls, **facets)
    yield
    for cls in REGISTRATIONS:
        optable.unregister(cls)


# ------------------------------------------------------------------------------ random KGs and queries
def _artifact(seed: int, n: int = 24, r: int = 3) -> Artifact:
    rng = np.random.default_rng(seed)
    dense = rng.random((r * n, n)).astype(np.float32)
    dense[rng.random(dense.shape) > 0.2] = 0
    m = sp.csr_matrix(dense)
    m.sort_indices()
    rows, cols = m.nonzero()
    obs = np.stack([rows % n, rows // n, cols], axis=1).astype(np.int64)
    return Artifact(entities=[f"e{k}" for k in range(n)], relations=[f"r{k}" for k in range(r)], matrices=m,
                    observed=obs, missing=np.zeros((0, 3), np.int64))


def _branch(rng: random.Random, n: int, r: int, hops: int) -> Node:
    q: Node = Anchor(rng.randrange(n))
    for _ in range(hops):
        q = Projection(rng.randrange(r), q)
    return q


def _pairs(rng: random.Random, n: int, r: int, count: int, hops: tuple[int, int]):
    """``count`` (new query, built-in twin) pairs of one shape (so they batch together)."""
    out = []
    for _ in range(count):
        a, b = _branch(rng, n, r, hops[0]), _branch(rng, n, r, hops[1])
        out.append((Difference((a, b)), Intersection((a, Complement(b)))))
    return out


# ------------------------------------------------------------------------------ language
def test_one_registration_makes_the_language_take_it(registered):
    art = _artifact(0)
    q = parse("(d (p r0 e1) (min (p r1 e2) (p r2 e3)))")
    assert isinstance(q, Difference) and isinstance(q.args[1], Min)
    assert to_sexpr(q) == "(d (p r0 e1) (min (p r1 e2) (p r2 e3)))" and parse(to_sexpr(q)) == q
    assert q.depth == 3
    ids = resolve(q, art)
    assert to_sexpr(ids) == "(d (p #0 #1) (min (p #1 #2) (p #2 #3)))"
    assert named(ids, art) == q
    assert relations_of(q) == ["r0", "r1", "r2"]
    assert shape_key(ids) == ("d", ("p", ("e",)), ("min", ("p", ("e",)), ("p", ("e",))))
    words = describe(q)
    assert "but not" in words and words.count("min(") == 1
    with pytest.raises(UserError, match="d takes 2 sub-queries"):
        parse("(d a b c)")
    with pytest.raises(UserError, match="expected an operator 'p', 'np', 'i', 'u', 'n', 'd' or 'min'"):
        parse("(x a b)")


def test_unregistered_the_types_are_gone():
    assert "d" not in optable.NODE_TYPES and "d" not in optable.ops()
    with pytest.raises(UserError, match="expected an operator 'p', 'np', 'i', 'u' or 'n'"):
        parse("(d a b)")
    with pytest.raises(TypeError, match="not a query node type"):
        to_sexpr(Difference((Anchor(0), Anchor(1))))


def test_registration_errors():
    with pytest.raises(TypeError, match="already belongs to Intersection"):
        @dataclass(frozen=True)
        class Other(Min):
            head: ClassVar[str] = "i"

        optable.register(Other)
    with pytest.raises(TypeError, match="unknown facet"):
        optable.register(Min, backward=explain_pointwise)
    with pytest.raises(TypeError, match="already has a 'forward' facet"):
        optable.register(Projection, forward=_forward_min)


# ------------------------------------------------------------------------------ forward pass
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tnorm", ["product", "godel"])
@pytest.mark.parametrize("mode", ["dense", "sparse", "passes"])
def test_difference_scores_equal_the_builtin_twin_bitwise(registered, seed, tnorm, mode):
    art = _artifact(seed)
    rng = random.Random(seed)
    pairs = _pairs(rng, art.num_entities, art.num_relations, 9, (rng.randint(1, 2), rng.randint(0, 2)))
    kw = dict(tnorm=tnorm, sparse=mode == "sparse", pass_rows=2 if mode == "passes" else None)
    got = Executor(art, **kw).scores([p[0] for p in pairs])
    want = Executor(art, **kw).scores([p[1] for p in pairs])
    assert torch.equal(got, want)


@pytest.mark.parametrize("seed", range(3))
def test_min_is_the_godel_intersection_under_any_tnorm(registered, seed):
    art = _artifact(seed)
    rng = random.Random(seed)
    n, r = art.num_entities, art.num_relations
    branches = [[_branch(rng, n, r, h) for h in (1, 2, 1)] for _ in range(7)]
    got = Executor(art, tnorm="product").scores([Min(tuple(b)) for b in branches])
    want = Executor(art, tnorm="godel").scores([Intersection(tuple(b)) for b in branches])
    assert torch.equal(got, want)


def test_hooks_and_traces_see_the_new_op(registered):
    art = _artifact(1)
    seen = []

    def hook(ctx, value):
        seen.append((ctx.op, len(ctx.inputs), ctx.rows))
        return value.edit().merge(0, [5], [0.5], source="llm").done()

    ex = Executor(art)
    ex.add_hook(hook, ops=("d",))
    q = parse("(d (p #0 #1) (p #1 #2))")
    (res,) = ex.answer([q], k=art.num_entities)
    assert seen == [("d", 2, 1)]
    assert res.trace.root.op == "d" and res.trace.root.hooks == ("hook",)
    assert [nt.op for nt in res.trace.nodes] == ["e", "p", "e", "p", "d"]
    with pytest.raises(UserError, match="expected some of e, p, np, i, u, n, d, min"):
        ex.add_hook(hook, ops=("zz",))


# ------------------------------------------------------------------------------ explanations
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("tnorm", ["product", "godel"])
def test_explanations_recompute_and_match_the_twin(registered, seed, tnorm):
    art = _artifact(seed)
    rng = random.Random(100 + seed)
    pairs = _pairs(rng, art.num_entities, art.num_relations, 6, (2, 1))
    ex = Executor(art, tnorm=tnorm)
    got = ex.answer([p[0] for p in pairs], k=5)
    want = ex.answer([p[1] for p in pairs], k=5)
    checked = 0
    for g, w in zip(got, want):
        assert [(a.id, a.score, a.provenance) for a in g.answers] == [(a.id, a.score, a.provenance) for a in w.answers]
        for a, b in zip(g.answers, w.answers):
            e = a.explanation
            assert e.op == "d" and len(e.children) == 2
            assert e.recompute(tnorm) == pytest.approx(a.score, abs=1e-6)
            assert e.recompute(tnorm) == pytest.approx(b.explanation.recompute(tnorm), abs=1e-12)
            # the positive branch is the twin's, witness for witness
            assert e.children[0].to_json() == b.explanation.children[0].to_json()
            assert e.lines()[0].startswith(f"{a.entity} ({a.score:.4f}) satisfies d of:")
            assert e.to_json()["op"] == "d"
            checked += 1
    assert checked > 0


def test_a_missing_facet_is_named(registered):
    @dataclass(frozen=True)
    class Bare(Min):
        head: ClassVar[str] = "bare"

    optable.register(Bare)  # the language only
    try:
        q = parse("(bare (p #0 #1) (p #1 #1))")
        with pytest.raises(TypeError, match="Bare .'bare'. has no 'forward' in the op table"):
            Executor(_artifact(0)).scores([q])
        with pytest.raises(TypeError, match="has no 'exact' in the op table"):
            answers([q], Graph(_artifact(0).observed, 24, 3))
    finally:
        optable.unregister(Bare)


# ------------------------------------------------------------------------------ exact sets
@pytest.mark.parametrize("seed", range(4))
def test_exact_sets_equal_the_twin(registered, seed):
    art = _artifact(seed)
    g = Graph(art.observed, art.num_entities, art.num_relations)
    rng = random.Random(200 + seed)
    pairs = _pairs(rng, art.num_entities, art.num_relations, 12, (rng.randint(0, 2), rng.randint(1, 2)))
    pairs += [(Min((a, b)), Intersection((a, b))) for a, b in
              ((_branch(rng, 24, 3, 1), _branch(rng, 24, 3, 2)) for _ in range(5))]
    got = answers([p[0] for p in pairs], g, batch_size=4)
    want = answers([p[1] for p in pairs], g)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert any(len(x) for x in got)


# ------------------------------------------------------------------------------ the documented recipe
def test_docs_recipe_registers_a_working_type(tmp_path):
    """docs/executor.md's "Adding a node type" block, run as a script, then used.  In this process (runpy: the
    script's own fresh namespace, so a missing import still fails) rather than a fresh interpreter (~2.7 s of CPU
    importing torch again); the node types it registers are unregistered afterwards, as the tests above do."""
    import contextlib
    import io
    import re
    import runpy
    from pathlib import Path

    from engine.lang import optable

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "executor.md").read_text(encoding="utf-8")
    section = page.split("## Adding a node type", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    use = '''
import numpy as np
import scipy.sparse as sp
from engine import Engine
from kge import Artifact

m = np.zeros((6, 3), np.float32)
m[0, 1], m[0, 2], m[3 + 0, 2] = 0.9, 0.5, 0.4  # r: a->b 0.9, a->c 0.5; s: a->c 0.4
art = Artifact(entities=["a", "b", "c"], relations=["r", "s"], matrices=sp.csr_matrix(m),
               observed=np.array([[0, 0, 1], [0, 0, 2], [0, 1, 2]]), missing=np.zeros((0, 3), np.int64))
res = Engine.load(art).answer("(d (p r a) (p s a))")[0]
print(res.query)
for x in res.answers:
    print(x.entity, round(x.score, 4), round(x.explanation.recompute("product"), 4), x.explanation.op)
'''
    script = tmp_path / "recipe.py"
    script.write_text(code + use, encoding="utf-8")
    before = dict(optable.NODE_TYPES)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        for op, cls in list(optable.NODE_TYPES.items()):
            if before.get(op) is not cls:
                optable.unregister(cls)
    assert out.getvalue() == "(d (p r a) (p s a))\nb 0.9 0.9 d\nc 0.3 0.3 d\n"
