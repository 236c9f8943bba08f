"""Executor hooks, evidence/provenance and the trace, against a float64 numpy reference.

The reference evaluates one query at a time with dense matrices and applies
the same merges at the same nodes (``max``: max(kg, s), ``add``: min(1, kg + s),
``replace``: s; a replaced row is 0 except the listed entities), so every hooked
score is checked against an independent computation, and every answer's
explanation must recompute its score from atoms and evidence alone.
"""
from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import ops
from engine.answer import AnswerConfig, run
from engine.exec.executor import Executor
from engine.exec.hooks import (
    Evidence,
    NodeContext,
    NodeValue,
    merge_scores,
    provenance_label,
)
from engine.lang.query import (
    Anchor,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    parse,
    resolve,
)
from engine.lang.structures import STRUCTURES
from kge import Artifact, UserError

BACKENDS = ["reference"] + (["cpp"] if ops.has_kernel("project", "cpu") else [])


# ------------------------------------------------------------------------------ fixtures
def chain_artifact() -> tuple[Artifact, dict[str, np.ndarray]]:
    """a —r 0.9→ b —s 0.8→ c;  d —s 0.6→ e;  b —t 0.5→ e;  f and g isolated."""
    names = ["a", "b", "c", "d", "e", "f", "g"]
    ix = {n: k for k, n in enumerate(names)}
    rels = ["r", "s", "t"]
    dense = {r: np.zeros((7, 7), dtype=np.float32) for r in rels}
    dense["r"][ix["a"], ix["b"]] = 0.9
    dense["s"][ix["b"], ix["c"]] = 0.8
    dense["s"][ix["d"], ix["e"]] = 0.6
    dense["t"][ix["b"], ix["e"]] = 0.5
    mat = sp.csr_matrix(np.concatenate([dense[r] for r in rels]))
    mat.sort_indices()
    observed = np.array([(h, k, t) for k, r in enumerate(rels) for h, t in zip(*np.nonzero(dense[r]))],
                        dtype=np.int64)
    art = Artifact(entities=names, relations=rels, matrices=mat, observed=observed,
                   missing=np.zeros((0, 3), dtype=np.int64))
    return art, dense


def random_artifact(seed: int, n: int = 8, r: int = 3, density: float = 0.3) -> Artifact:
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(r):
        m = (rng.random((n, n)) < density) * rng.random((n, n))
        blocks.append(m.astype(np.float32))
    mat = sp.csr_matrix(np.concatenate(blocks))
    mat.sort_indices()
    return Artifact(entities=[f"e{i}" for i in range(n)], relations=[f"r{k}" for k in range(r)], matrices=mat,
                    observed=np.zeros((0, 3), dtype=np.int64), missing=np.zeros((0, 3), dtype=np.int64))


def dense_of(art: Artifact) -> list[np.ndarray]:
    n = art.num_entities
    full = art.matrices.toarray().astype(np.float64)
    return [full[k * n:(k + 1) * n] for k in range(art.num_relations)]


# ------------------------------------------------------------------------------ reference
def ref_eval(node: Node, dense: list[np.ndarray], tnorm: str, s: float, merges: dict, path=()) -> np.ndarray:
    """float64 value of one resolved query; ``merges[path]`` = list of (kind, payload) applied in order.

    kind "merge": payload (entity, score, rule); kind "replace_row": payload ({entity: score}, base).
    """
    if isinstance(node, Anchor):
        y = np.zeros(dense[0].shape[0])
        y[node.entity] = 1.0
    elif isinstance(node, (Projection, NegatedProjection)):
        x = ref_eval(node.arg, dense, tnorm, s, merges, path + (0,))
        m = dense[node.relation]
        if isinstance(node, NegatedProjection):
            m = 1.0 - np.minimum(1.0, s * m)
        y = (x[:, None] * m).max(axis=0)
    elif isinstance(node, (Intersection, Union)):
        xs = [ref_eval(a, dense, tnorm, s, merges, path + (k,)) for k, a in enumerate(node.args)]
        if isinstance(node, Intersection):
            y = np.prod(xs, axis=0) if tnorm == "product" else np.min(xs, axis=0)
        else:
            y = 1.0 - np.prod([1.0 - x for x in xs], axis=0) if tnorm == "product" else np.max(xs, axis=0)
    else:
        y = 1.0 - ref_eval(node.arg, dense, tnorm, s, merges, path + (0,))
    for kind, payload in merges.get(path, []):
        if kind == "replace_row":
            scores, base = payload
            y = np.full_like(y, base)
            for e, v in scores.items():
                y[e] = v
        else:
            e, v, rule = payload
            y[e] = max(y[e], v) if rule == "max" else min(1.0, y[e] + v) if rule == "add" else v
    return y


class PlannedHook:
    """Applies planned merges: ``plan[(query index, path)]`` = list of (kind, payload), as in :func:`ref_eval`."""

    def __init__(self, plan: dict, source: str = "llm", name: str = "planned") -> None:
        self.plan = plan
        self.source = source
        self.name = name
        self.calls: list[tuple[tuple[int, ...], str, int]] = []

    def __call__(self, ctx: NodeContext, value: NodeValue):
        self.calls.append((ctx.path, ctx.op, ctx.rows))
        edit = value.edit()
        for row, qi in enumerate(ctx.query_indices):
            for kind, payload in self.plan.get((qi, ctx.path), []):
                if kind == "replace_row":
                    scores, base = payload
                    edit.replace_row(row, list(scores), list(scores.values()), source=self.source,
                                     detail={"why": "replace"}, base=base)
                else:
                    e, v, rule = payload
                    edit.merge(row, [e], [v], source=self.source, merge=rule, detail={"p": v})
                ctx.note(row, "merged", True)
        return edit.done()


def check_against_reference(ex: Executor, queries: list[Node], plan: dict, k: int = 10) -> list:
    dense = dense_of(ex.artifact)
    resolved = [resolve(q, ex.artifact) for q in queries]
    expected = np.stack([
        ref_eval(q, dense, ex.tnorm, ex.neg_scale, {p: v for (qi, p), v in plan.items() if qi == i})
        for i, q in enumerate(resolved)])
    got = ex.scores(queries, batch_size=5).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    results = ex.answer(queries, k=k, batch_size=5)
    for i, res in enumerate(results):
        for a in res.answers:
            assert a.score == pytest.approx(expected[i, a.id], abs=1e-6)
            # Atoms and evidence alone give back the score, whatever merges produced it.
            assert a.explanation.recompute(ex.tnorm) == pytest.approx(a.score, abs=1e-6)
            assert a.provenance == a.explanation.source
            assert a.explanation.text()
            json.dumps(a.to_json())
        json.dumps(res.to_json())
    return results


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("backend", BACKENDS)
def test_hook_adds_entity_to_projection_and_downstream_sees_it(backend):
    art, _ = chain_artifact()
    q = parse("(p s (p r a))")
    plain = Executor(art, backend=backend).answer([q])[0]
    assert [(a.entity, round(a.score, 6), a.provenance) for a in plain.answers] == [("c", 0.72, "kg")]

    def add_d(ctx, value):
        if ctx.path == (0,):  # the inner (p r a): the LLM says d too
            return merge_scores(value, 0, [art.entities.index("d")], [0.5], source="llm", detail={"p": 0.5})
        return None

    ex = Executor(art, hooks=[add_d], backend=backend)
    res = ex.answer([q])[0]
    got = [(a.entity, round(a.score, 6), a.provenance) for a in res.answers]
    # d reaches e through the KG edge s (0.6): 0.5 * 0.6, a KG atom over an LLM entity = "both".
    assert got == [("c", 0.72, "kg"), ("e", 0.3, "both")]
    e_ans = res.answers[1]
    expl = e_ans.explanation
    assert expl.recompute("product") == pytest.approx(0.3, abs=1e-7)
    child = expl.children[0]
    assert child.entity_name == "d" and child.children == () and child.source == "llm"
    assert child.evidence == Evidence(source="llm", score=0.5, merge="max", detail={"p": 0.5})
    assert "⟨llm 0.5000 max⟩ —r→ d" in expl.text()
    tree = e_ans.to_json()["explanation"]["tree"]
    assert tree["source"] == "both" and tree["children"][0]["evidence"]["source"] == "llm"
    # The trace records the evidence at the inner node and nowhere else.
    nodes = {nt.path: nt for nt in res.trace.nodes}
    assert set(nodes) == {(), (0,), (0, 0)}
    assert nodes[(0,)].hooks == ("add_d",) and set(nodes[(0,)].evidence) == {art.entities.index("d")}
    assert nodes[()].evidence == {} and nodes[()].hooks == ()


def test_entity_added_only_by_hook_has_evidence_and_no_witness():
    art, _ = chain_artifact()
    g = art.entities.index("g")
    hook = PlannedHook({(0, ()): [("merge", (g, 0.25, "max"))]})
    res = check_against_reference(Executor(art, hooks=[hook]), [parse("(p s (p r a))")],
                                  hook.plan)[0]
    ans = {a.entity: a for a in res.answers}
    assert ans["g"].provenance == "llm" and ans["g"].score == pytest.approx(0.25)
    expl = ans["g"].explanation
    assert expl.children == () and expl.evidence.score == 0.25 and expl.kg_score("product") == 0.0
    assert expl.recompute("product") == pytest.approx(0.25)
    assert ans["c"].provenance == "kg"


def test_hook_returning_none_changes_nothing():
    art = random_artifact(3)
    rng = random.Random(3)
    queries = [STRUCTURES[name].build([rng.randrange(8) for _ in range(STRUCTURES[name].num_anchors)],
                                      [rng.randrange(3) for _ in range(STRUCTURES[name].num_relations)],
                                      negation=negation)
               for name in STRUCTURES for negation in ("qto", "complement") for _ in range(2)]
    calls = []
    ex0 = Executor(art)
    ex1 = Executor(art, hooks=[lambda ctx, v: calls.append(ctx.op)])
    assert torch.equal(ex0.scores(queries), ex1.scores(queries))
    assert set(calls) == {"e", "p", "np", "i", "u", "n"}
    r0, r1 = ex0.answer(queries, k=5), ex1.answer(queries, k=5)
    assert r0 == r1
    for res in r1:
        assert all(a.provenance == "kg" for a in res.answers)
        assert all(not nt.hooks and not nt.evidence and not nt.notes for nt in res.trace.nodes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_hook_on_anchors_keeps_every_bit(backend):
    """A hook returning a copy of the anchors forces the general projection strategy: same bits as the gather."""
    art = random_artifact(5, n=20, r=4, density=0.2)
    rng = random.Random(5)
    queries = [STRUCTURES[name].build([rng.randrange(20) for _ in range(STRUCTURES[name].num_anchors)],
                                      [rng.randrange(4) for _ in range(STRUCTURES[name].num_relations)])
               for name in ("1p", "2p", "pin", "up", "2i") for _ in range(8)]
    copy_hook = lambda ctx, v: NodeValue(v.values.clone(), v.argmax, v.evidence)  # noqa: E731
    plain = Executor(art, backend=backend)
    hooked = Executor(art, backend=backend)
    hooked.add_hook(copy_hook, ops=("e",), name="copy")
    assert torch.equal(plain.scores(queries), hooked.scores(queries))
    assert plain.answer(queries, k=4) == hooked.answer(queries, k=4)
    res = hooked.answer(queries[:1])[0]
    assert all(nt.hooks == ("copy",) for nt in res.trace.nodes if nt.op == "e")


@pytest.mark.parametrize("rule", ["max", "add"])
def test_add_versus_max_merge(rule):
    art, _ = chain_artifact()
    c, e = art.entities.index("c"), art.entities.index("e")
    # c has KG value 0.72: max(0.72, 0.2) keeps 0.72, add gives 0.92; e is new either way.
    plan = {(0, ()): [("merge", (c, 0.2, rule)), ("merge", (e, 0.3, rule))]}
    res = check_against_reference(Executor(art, hooks=[PlannedHook(plan)]), [parse("(p s (p r a))")], plan)[0]
    ans = {a.entity: a for a in res.answers}
    assert ans["c"].score == pytest.approx(0.72 if rule == "max" else 0.92, abs=1e-6)
    assert ans["c"].provenance == "both" and ans["e"].provenance == "llm"
    assert ans["c"].explanation.evidence.merge == rule


def test_hook_order_and_evidence_chain():
    art, _ = chain_artifact()
    c = art.entities.index("c")
    first = PlannedHook({(0, ()): [("merge", (c, 0.1, "add"))]}, name="first")
    second = PlannedHook({(0, ()): [("merge", (c, 0.95, "max"))]}, source="sim", name="second")
    q = [parse("(p s (p r a))")]
    ab = Executor(art, hooks=[first, second]).answer(q)[0]
    ba = Executor(art, hooks=[second, first]).answer(q)[0]
    # add then max: max(0.72 + 0.1, 0.95) = 0.95;  max then add: min(1, max(0.72, 0.95) + 0.1) = 1.0
    assert ab.answers[0].score == pytest.approx(0.95, abs=1e-6)
    assert ba.answers[0].score == pytest.approx(1.0, abs=1e-6)
    for res in (ab, ba):
        expl = res.answers[0].explanation
        assert expl.recompute("product") == pytest.approx(res.answers[0].score, abs=1e-6)
        assert expl.sources() == {"kg", "llm", "sim"} and res.answers[0].provenance == "kg+llm+sim"
    assert [e.source for e in ab.answers[0].explanation.evidence.chain()] == ["llm", "sim"]
    assert ab.trace.root.hooks == ("first", "second") and ba.trace.root.hooks == ("second", "first")
    # Both merged plans also match the reference.
    plan = {(0, ()): first.plan[(0, ())] + second.plan[(0, ())]}
    check_against_reference(Executor(art, hooks=[PlannedHook(plan)]), q, plan)


@pytest.mark.parametrize("tnorm", ["product", "godel"])
@pytest.mark.parametrize("expr, path", [
    ("(i (p s (p r a)) (p t b))", ()),                # intersection root
    ("(u (p s (p r a)) (p t b))", ()),                # union root
    ("(i (p s (p r a)) (n (p t b)))", (1,)),          # complement node
    ("(i (p s (p r a)) (n (p t b)))", (1, 0)),        # under a complement: lowers its complement
    ("(p s (u (p r a) (p t b)))", (0,)),              # union feeding a projection
    ("(i (p s (p r a)) (np t b))", (1,)),             # a negated projection
])
def test_hooks_on_set_operator_nodes(expr, path, tnorm):
    art, _ = chain_artifact()
    ents = [art.entities.index(x) for x in ("c", "e", "g", "d")]
    plan = {(0, path): [("merge", (ents[0], 0.3, "max")), ("merge", (ents[1], 0.2, "add")),
                        ("merge", (ents[2], 0.6, "max")), ("merge", (ents[3], 0.4, "replace"))]}
    check_against_reference(Executor(art, tnorm=tnorm, hooks=[PlannedHook(plan)]), [parse(expr)], plan)


@pytest.mark.parametrize("tnorm", ["product", "godel"])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_hooked_random_queries_match_reference(seed, tnorm):
    """Random merges at random nodes of random BetaE queries, batched, against the reference."""
    art = random_artifact(seed, n=9, r=3, density=0.3)
    rng = random.Random(seed)
    queries, plan = [], {}
    for name in STRUCTURES:
        s = STRUCTURES[name]
        for _ in range(3):
            q = s.build([rng.randrange(9) for _ in range(s.num_anchors)],
                        [rng.randrange(3) for _ in range(s.num_relations)],
                        negation=rng.choice(["qto", "complement"]))
            paths = _paths(q)
            for _ in range(3):
                p = rng.choice(paths)
                kind = rng.choice(["max", "add", "replace", "row"])
                row = ({rng.randrange(9): rng.random() for _ in range(2)}, rng.choice([0.0, 1.0, 0.5]))
                entry = ("replace_row", row) if kind == "row" else ("merge", (rng.randrange(9), rng.random(), kind))
                plan.setdefault((len(queries), p), []).append(entry)
            queries.append(q)
    check_against_reference(Executor(art, tnorm=tnorm, hooks=[PlannedHook(plan)]), queries, plan, k=9)


def _paths(node: Node, path=()) -> list[tuple[int, ...]]:
    out = [path]
    for k, c in enumerate(node.children()):
        out += _paths(c, path + (k,))
    return out


def test_three_configurations_one_path():
    """KG-only (no hook), LLM-only (rows replaced) and merged (max) runs of the same queries."""
    art, _ = chain_artifact()
    ix = art.entities.index
    llm_answers = {"r": {ix("b"): 0.7, ix("d"): 0.9}, "s": {ix("e"): 0.8}, "t": {ix("f"): 0.6}}

    def llm(ctx, value, *, replace: bool):
        edit = value.edit()
        for row in range(ctx.rows):
            got = llm_answers.get(ctx.relation_name(row), {})
            if replace:
                edit.replace_row(row, list(got), list(got.values()), source="llm")
            else:
                edit.merge(row, list(got), list(got.values()), source="llm", merge="max")
            ctx.note(row, "llm_answers", {ctx.entity_name(e): p for e, p in got.items()})
        return edit.done()

    queries = [parse("(p s (p r a))"), parse("(p t (p r a))")]
    kg = Executor(art)
    only = Executor(art)
    only.add_hook(lambda c, v: llm(c, v, replace=True), ops=("p", "np"), name="llm-only")
    both = Executor(art)
    both.add_hook(lambda c, v: llm(c, v, replace=False), ops=("p", "np"), name="lgot")
    r_kg, r_only, r_both = (ex.answer(queries) for ex in (kg, only, both))
    assert {(a.entity, a.provenance) for a in r_kg[0].answers} == {("c", "kg")}
    # LLM-only: (p r a) = {b: .7, d: .9}; (p s .) = {e: .8}: the KG edges play no part.
    assert [(a.entity, round(a.score, 6), a.provenance) for a in r_only[0].answers] == [("e", 0.8, "llm")]
    assert [(a.entity, round(a.score, 6), a.provenance) for a in r_only[1].answers] == [("f", 0.6, "llm")]
    # Merged: max(kg, llm) at every projection.
    got = {a.entity: (round(a.score, 6), a.provenance) for a in r_both[0].answers}
    assert got == {"e": (0.8, "both"), "c": (0.72, "both")}
    assert r_both[0].trace.node((0,)).notes == {"llm_answers": {"b": 0.7, "d": 0.9}}
    for res in r_only + r_both:
        for a in res.answers:
            assert a.explanation.recompute("product") == pytest.approx(a.score, abs=1e-6)
    # The same three configurations through scores(): the root values equal answer()'s.
    for ex, res in ((kg, r_kg), (only, r_only), (both, r_both)):
        y = ex.scores(queries)
        for i, r in enumerate(res):
            for a in r.answers:
                assert float(y[i, a.id]) == pytest.approx(a.score, abs=0)


def test_trace_from_answer_scores_and_iter_scores():
    art = random_artifact(2, n=10, r=3)
    queries = [parse("(i (p r0 e1) (np r1 e2))"), parse("(p r2 (p r0 e3))"), parse("(i (p r1 e0) (np r2 e5))")]

    def noter(ctx, value):
        for row, qi in enumerate(ctx.query_indices):
            ctx.note(row, "qi", qi)
            ctx.note(row, "relation", ctx.relation_name(row))
        return None

    ex = Executor(art)
    ex.add_hook(noter, ops=("p", "np"))
    res = ex.answer(queries, k=3)
    for i, r in enumerate(res):
        tr = r.trace
        assert tr.index == i and tr.query == r.query
        assert tr.nodes[-1].path == () and tr.root.op == queries[i].head
        for nt in tr.nodes:
            if nt.op in ("p", "np"):
                assert nt.notes == {"qi": i, "relation": nt.relation_name} and nt.relation_name.startswith("r")
                assert nt.hooks == ()  # a hook returning None does not count as changing the node
            if nt.op == "e":
                assert nt.entity_name == art.entities[nt.entity]
            assert nt.values is None
        js = r.to_json()["trace"]
        assert js["query"] == r.query and [n["path"] for n in js["nodes"]] == [list(nt.path) for nt in tr.nodes]
    # scores(trace=True): one trace per query, in input order; iter_scores yields them per batch.
    y, traces = ex.scores(queries, trace=True, trace_values=True, batch_size=1)
    assert [t.index for t in traces] == [0, 1, 2]
    for i, t in enumerate(traces):
        assert torch.equal(t.root.values, y[i])
        assert t.to_json()["nodes"][-1]["top"]  # top entities when values were kept
        assert t.node((0,)).notes["qi"] == i
    seen = {}
    for idx, yy, trs in ex.iter_scores(queries, trace=True):
        assert len(trs) == len(idx) == yy.shape[0]
        for k, t in zip(idx, trs):
            seen[k] = t
            assert t.index == k and t.root.values is None
    assert sorted(seen) == [0, 1, 2]
    assert torch.equal(ex.scores(queries), y)
    # Without hooks the trace is still kept (structure only).
    plain = Executor(art).answer(queries[:1])[0].trace
    assert [nt.op for nt in plain.nodes] == ["e", "p", "e", "np", "i"]


def test_one_hook_call_per_node_per_batch_and_context():
    art = random_artifact(4, n=10, r=3)
    rng = random.Random(4)
    queries = [STRUCTURES["pi"].build([rng.randrange(10) for _ in range(2)], [rng.randrange(3) for _ in range(3)])
               for _ in range(12)]
    seen = []

    def spy(ctx, value):
        seen.append(ctx)
        assert value.values.shape == (ctx.rows, 10)
        assert len(ctx.nodes) == len(ctx.query_indices) == ctx.rows
        for row, qi in enumerate(ctx.query_indices):
            sub = resolve(queries[qi], art)
            for k in ctx.path:
                sub = sub.children()[k]
            assert ctx.nodes[row] == sub  # rows map to the caller's queries
            if ctx.op in ("p", "np"):
                assert ctx.relations[row] == sub.relation
            if ctx.op == "e":
                assert ctx.anchors[row] == sub.entity
        assert len(ctx.inputs) == len(ctx.node.children())
        return None

    ex = Executor(art, hooks=[spy])
    ex.scores(queries, batch_size=1024)
    n_nodes = len(_paths(queries[0]))
    assert len(seen) == n_nodes  # one batch: one call per node with all 12 rows
    assert all(c.rows == 12 for c in seen)
    assert [c.path for c in seen][-1] == ()  # children first, the root last
    ex.scores(queries, batch_size=5)  # three batches
    assert len(seen) == 4 * n_nodes


def test_downstream_inputs_are_hooked_values_and_op_filter():
    art, _ = chain_artifact()
    d = art.entities.index("d")
    got_inputs = []
    ex = Executor(art)
    h1 = ex.add_hook(lambda c, v: merge_scores(v, 0, [d], [0.5], source="llm") if c.path == (0,) else None,
                     ops=("p",), name="add-d")
    ex.add_hook(lambda c, v: got_inputs.append((c.path, c.inputs[0].values.clone(), dict(c.inputs[0].evidence[0]))),
                ops="p", name="spy")
    ex.answer([parse("(p s (p r a))")])
    root_input = dict((p, (x, ev)) for p, x, ev in got_inputs)[()]
    assert float(root_input[0][0, d]) == 0.5 and d in root_input[1]
    assert ex.hooks == (("add-d", frozenset({"p"})), ("spy", frozenset({"p"})))
    h1.remove()
    h1.remove()  # idempotent
    assert [n for n, _ in ex.hooks] == ["spy"]
    got_inputs.clear()
    ex.answer([parse("(p s (p r a))")])
    assert float(dict((p, x) for p, x, _ in got_inputs)[()][0, d]) == 0.0
    with pytest.raises(UserError, match="unknown 'x'"):
        ex.add_hook(lambda c, v: None, ops=("p", "x"))
    with pytest.raises(UserError, match="callable"):
        ex.add_hook(3)


def test_bad_hook_results_are_reported():
    art, _ = chain_artifact()
    q = [parse("(p s (p r a))")]
    cases = [
        (lambda c, v: v.values, TypeError, "returned Tensor"),
        (lambda c, v: NodeValue(torch.zeros(1, 3)), ValueError, r"returned values \(1, 3\)"),
        (lambda c, v: NodeValue(v.values * 2 + 0.1), ValueError, r"outside \[0, 1\]"),
        (lambda c, v: NodeValue(v.values * float("nan")), ValueError, r"outside \[0, 1\]"),
    ]
    for hook, exc, msg in cases:
        ex = Executor(art)
        ex.add_hook(hook, name="bad")
        with pytest.raises(exc, match=f"hook 'bad' at node .*{msg}"):
            ex.scores(q)


def test_merge_helpers_validate_and_never_modify_their_input():
    v = NodeValue(torch.tensor([[0.2, 0.0, 0.5]]), torch.tensor([[3, -1, 4]], dtype=torch.int32))
    before = v.values.clone()
    out = merge_scores(v, 0, [0, 1, 2], [0.4, 0.3, 0.1], source="llm")
    assert torch.equal(v.values, before) and v.evidence == ({},)
    assert torch.allclose(out.values, torch.tensor([[0.4, 0.3, 0.5]]))
    assert out.argmax is not None and out.argmax.tolist() == [[3, -1, 4]]
    rep = merge_scores(v, 0, [2], [0.1], source="llm", merge="replace")
    assert rep.argmax.tolist() == [[3, -1, -1]] and float(rep.values[0, 2]) == pytest.approx(0.1)
    row = v.edit().replace_row(0, [1], [0.6], source="llm").done()
    assert row.values.tolist() == [[0.0, pytest.approx(0.6), 0.0]] and row.argmax.tolist() == [[-1, -1, -1]]
    assert row.row_evidence[0] == Evidence("llm", 0.0, merge="replace", detail={"row": "replaced"})
    neg = v.edit().replace_row(0, [1], [0.4], source="llm", base=1.0).merge(0, [2], [0.3], source="x", merge="add")
    neg = neg.done()  # a negated LLM-only row: 1 except 1 - p; a later add starts from the row's 1
    assert neg.values.tolist() == [[1.0, pytest.approx(0.4), 1.0]]
    assert neg.evidence_at(0, 0).score == 1.0 and neg.evidence_at(0, 2).merged(0.0) == 1.0
    assert neg.evidence_at(0, 2).prior == neg.row_evidence[0]
    with pytest.raises(ValueError, match="base"):
        v.edit().replace_row(0, [], [], source="llm", base=2.0)
    assert v.edit().done() is v  # nothing written, nothing copied
    for bad, exc in [(dict(row=1), IndexError), (dict(entity_ids=[7]), IndexError), (dict(scores=[1.5]), ValueError),
                     (dict(scores=[float("nan")]), ValueError), (dict(merge="min"), ValueError),
                     (dict(detail={"x": object()}), TypeError), (dict(scores=[0.1, 0.2]), ValueError)]:
        kw = dict(row=0, entity_ids=[0], scores=[0.1], source="llm", merge="max", detail=None) | bad
        with pytest.raises(exc):
            merge_scores(v, kw.pop("row"), kw.pop("entity_ids"), kw.pop("scores"), **kw)


def test_evidence_rules_and_provenance_labels():
    assert Evidence("llm", 0.3).merged(0.5) == 0.5
    assert Evidence("llm", 0.3, merge="add").merged(0.5) == pytest.approx(0.8)
    assert Evidence("llm", 0.7, merge="add").merged(0.5) == 1.0
    assert Evidence("llm", 0.3, merge="replace").merged(0.9) == 0.3
    chained = Evidence("sim", 0.2, merge="add", prior=Evidence("llm", 0.6))
    assert chained.merged(0.1) == pytest.approx(0.8) and chained.sources() == {"llm", "sim"}
    assert Evidence("b", 0.2, prior=Evidence("a", 0.5, merge="replace")).discards_kg()
    assert Evidence("llm", 0.0).sources() == frozenset()  # a zero score contributes nothing
    # "scale": a factor (the answer check's penalty); it adds no positive part, so no source of its own
    scaled = Evidence("llm", 0.5, merge="scale", prior=Evidence("sim", 0.6))
    assert scaled.merged(0.2) == pytest.approx(0.3) and scaled.sources() == {"sim"} and not scaled.discards_kg()
    assert Evidence("llm", 0.5, merge="scale").merged(0.8) == pytest.approx(0.4)
    assert Evidence("llm", 0.5, merge="scale").sources() == frozenset()
    for bad in (dict(source=""), dict(merge="min"), dict(score=1.2)):
        with pytest.raises(ValueError):
            Evidence(**({"source": "llm", "score": 0.1} | bad))
    assert provenance_label([]) == "kg" and provenance_label(["kg"]) == "kg"
    assert provenance_label(["llm"]) == "llm" and provenance_label(["llm", "kg"]) == "both"
    assert provenance_label(["kg", "sim"]) == "kg+sim"


def test_answer_cli_json_and_text_show_provenance(tmp_path):
    art, _ = chain_artifact()
    d = tmp_path / "chain"
    art.save(d)
    g = art.entities.index("g")

    def add_g(ctx, value):
        if ctx.path != ():
            return None
        for row in range(ctx.rows):
            ctx.note(row, "asked", "llm")
        return merge_scores(value, 0, [g], [0.25], source="llm", detail={"p": 0.5})

    cfg = AnswerConfig(artifact=str(d), expr="(p s (p r a))", json=True)
    out = io.StringIO()
    assert run(cfg, out, hooks=[add_g]) == 0
    obj = json.loads(out.getvalue())
    prov = {a["entity"]: a["provenance"] for a in obj["answers"]}
    assert prov == {"c": "kg", "g": "llm"}
    g_ans = [a for a in obj["answers"] if a["entity"] == "g"][0]
    assert g_ans["explanation"]["tree"]["evidence"] == {"source": "llm", "score": 0.25, "merge": "max",
                                                       "detail": {"p": 0.5}}
    root = obj["trace"]["nodes"][-1]
    assert root["path"] == [] and root["hooks"] == ["add_g"] and root["notes"] == {"asked": "llm"}
    assert root["evidence"] == [{"entity": "g", "id": g, "source": "llm", "score": 0.25, "merge": "max",
                                 "detail": {"p": 0.5}}]
    # Text: provenance tags appear because not every answer is from the KG, and the touched node is listed.
    out = io.StringIO()
    run(AnswerConfig(artifact=str(d), expr="(p s (p r a))"), out, hooks=[add_g])
    text = out.getvalue()
    assert "(id 2)  [kg]" in text and "(id 6)  [llm]" in text
    assert "⟨llm 0.2500 max⟩ —s→ g (0.2500)" in text
    assert 'node [] (p s): hooks add_g; evidence llm 1; notes {"asked": "llm"}' in text
    # No hooks: no tags and no trace lines.
    out = io.StringIO()
    run(AnswerConfig(artifact=str(d), expr="(p s (p r a))"), out)
    assert "[kg]" not in out.getvalue() and "trace:" not in out.getvalue()


def test_engine_api_passes_hooks_and_traces():
    from engine import Engine

    art, _ = chain_artifact()
    eng = Engine.load(art)
    h = eng.add_hook(lambda c, v: merge_scores(v, 0, [5], [0.1], source="llm"), ops=("p",), name="f")
    res = eng.answer("(p s (p r a))")[0]
    assert {a.entity: a.provenance for a in res.answers} == {"c": "kg", "f": "llm"}
    y, traces = eng.scores(["(p s (p r a))"], trace=True)
    assert float(y[0, 5]) == pytest.approx(0.1) and traces[0].root.hooks == ("f",)
    # Example queries are picked by the KG alone: the hook is not called while searching.
    calls = []
    h.remove()
    eng.add_hook(lambda c, v: calls.append(1))
    eng.example("1p", seed=0)
    assert calls == []


def test_provenance_without_explanations():
    """explain=False still gives each answer its provenance (the witnesses are walked, not returned)."""
    art, _ = chain_artifact()
    g = art.entities.index("g")
    ex = Executor(art, hooks=[lambda c, v: merge_scores(v, 0, [g], [0.3], source="llm") if c.path == (0,) else None])
    full = ex.answer([parse("(p t (p r a))")])[0]
    bare = ex.answer([parse("(p t (p r a))")], explain=False)[0]
    assert [(a.entity, a.provenance) for a in bare.answers] == [(a.entity, a.provenance) for a in full.answers]
    assert all(a.explanation is None for a in bare.answers)
    assert {a.entity: a.provenance for a in full.answers} == {"e": "kg"}  # g has no t edge: not an answer


def test_docs_example_runs_and_prints_what_the_docs_say(tmp_path):
    """docs/executor.md's example, run as a script: its output is the one the page shows.  In this process
    (runpy: the script's own fresh namespace, so a missing import still fails), not a fresh interpreter: that
    one imported torch again for ~2.6 s of CPU, and the example sets no process state."""
    import contextlib
    import re
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "executor.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    shown = re.findall(r"prints\n\n```\n(.*?)```", page, re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    assert out.getvalue() == shown


def test_provenance_through_complement_and_union():
    art, _ = chain_artifact()
    ix = art.entities.index
    plan = {(0, (0,)): [("merge", (ix("g"), 0.4, "max"))], (1, (0,)): [("merge", (ix("e"), 0.5, "max"))]}
    queries = [parse("(n (p r a))"), parse("(u (p r a) (p t b))")]
    neg, union = check_against_reference(Executor(art, hooks=[PlannedHook(plan)]), queries, plan)
    prov = {a.entity: (round(a.score, 6), a.provenance) for a in neg.answers}
    # 1 - 0.9 from the KG edge, 1 - 0.4 from the LLM's answer, 1 - 0 (closed world) from the KG.
    assert prov["b"] == (0.1, "kg") and prov["g"] == (0.6, "llm") and prov["c"] == (1.0, "kg")
    prov = {a.entity: (round(a.score, 6), a.provenance) for a in union.answers}
    # e: 0.5 from the LLM (left) or 0.5 from the KG edge b —t→ e (right): both contribute.
    assert prov == {"b": (0.9, "kg"), "e": (0.75, "both")}


def test_llm_only_negated_row_provenance_and_recompute():
    """An LLM-only np row (base 1, 1 - p on the LLM's set): every entity is explained by the row's evidence."""
    art, _ = chain_artifact()
    ix = art.entities.index
    plan = {(0, (1,)): [("replace_row", ({ix("c"): 0.25}, 1.0))]}
    res = check_against_reference(Executor(art, hooks=[PlannedHook(plan)]), [parse("(i (p s (p r a)) (np t b))")],
                                  plan)[0]
    (c,) = res.answers
    assert c.entity == "c" and c.score == pytest.approx(0.72 * 0.25) and c.provenance == "both"
    np_expl = c.explanation.children[1]
    assert np_expl.children == () and np_expl.evidence.merge == "replace"
    res2 = check_against_reference(Executor(art, hooks=[PlannedHook({(0, (1,)): [("replace_row", ({}, 1.0))]})]),
                                   [parse("(i (p s (p r a)) (np t b))")], {(0, (1,)): [("replace_row", ({}, 1.0))]})[0]
    assert res2.answers[0].explanation.children[1].evidence == Evidence("llm", 1.0, merge="replace",
                                                                       detail={"row": "replaced"})
    assert res2.trace.node((1,)).row_evidence.score == 1.0
    assert res2.trace.to_json()["nodes"][-2]["row_evidence"]["score"] == 1.0
    from engine.answer import _trace_lines

    assert any("row replaced by llm (others 1)" in line for line in _trace_lines(res2.trace))


@pytest.mark.parametrize("backend", BACKENDS)
def test_projection_with_an_empty_input_still_reaches_its_hooks(backend):
    """Issue 21: a hop whose input is all zero is hooked (an LLM may still answer it), in every entry point,
    and a hook that adds an entity there reaches the result."""
    art, _ = chain_artifact()
    seen = []

    def hook(ctx, value):
        for row in range(ctx.rows):
            seen.append((ctx.path, bool(torch.all(ctx.inputs[0].values[row] == 0))))
        if ctx.path == ():
            return merge_scores(value, 0, [art.entity_id("g")], [0.3], source="llm")
        return None

    # f has no r edge: the inner hop is empty, so the outer hop's input is all zero
    q = resolve(parse("(p s (p r f))"), art)
    kg = Executor(art, backend=backend).scores([q])
    assert float(kg.sum()) == 0.0
    ex = Executor(art, backend=backend)
    ex.add_hook(hook, ops=("p",))
    for call in (lambda: ex.scores([q]), lambda: ex.answer([q], k=3), lambda: list(ex.iter_scores([q]))):
        seen.clear()
        call()
        assert seen == [((0,), False), ((), True)]
    (res,) = ex.answer([q], k=3)
    assert [(a.entity, a.provenance) for a in res.answers] == [("g", "llm")]
    # no hook: bit-identical to the plain executor
    assert torch.equal(Executor(art, backend=backend).scores([q]), kg)
