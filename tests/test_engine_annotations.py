"""NodeValue annotations: per-hook, per-row payloads that travel with a node's value.

Unit tests of the slot (carried through replace/edit, sliced and concatenated with the rows,
checked), the executor's handling (annotation-only hooks change nothing and are not listed,
another hook's annotations survive a value built afresh, traces show them), and the LGOT hook,
whose LLM answer sets travel this way: a batch split into passes of any size gives the same
answers, traces and annotations.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.exec.executor import Executor
from engine.exec.hooks import NodeValue
from engine.lang.query import parse
from llm_bridge.lgot import LGOTHook, LGOTRow, LGOTSettings, LLMSet
from test_llm_lgot import ScriptedClient, tiny_artifact


# ------------------------------------------------------------------------------ the slot
def _random_value(rng: random.Random, b: int, n: int, *, argmax: bool, keys=("a", "b")) -> NodeValue:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    v = NodeValue(torch.rand(b, n, generator=g),
                  argmax=torch.randint(-1, n, (b, n), generator=g, dtype=torch.int32) if argmax else None)
    edit = v.edit()
    for row in range(b):
        if rng.random() < 0.5:
            edit.merge(row, [rng.randrange(n)], [rng.random()], source="llm")
    v = edit.done()
    for k in keys:
        v = v.annotate(k, [(k, rng.random()) for _ in range(b)])
    return v


def _rows_equal(a: NodeValue, b: NodeValue) -> None:
    assert torch.equal(a.values, b.values)
    assert (a.argmax is None) == (b.argmax is None)
    if a.argmax is not None:
        assert torch.equal(a.argmax, b.argmax)
    assert [dict(e) for e in a.evidence] == [dict(e) for e in b.evidence]
    assert a.row_evidence == b.row_evidence
    assert dict(a.annotations) == dict(b.annotations)


def test_annotate_is_read_only_and_shares_the_tensors():
    v = NodeValue(torch.zeros(3, 4))
    assert dict(v.annotations) == {} and v.annotation("x") is None and v.annotation("x", 5) == 5
    w = v.annotate("x", [1, 2, 3])
    assert w.values is v.values and w.same_scores(v) and not v.annotations
    assert w.annotation("x") == (1, 2, 3)
    with pytest.raises(TypeError):
        w.annotations["y"] = (0, 0, 0)  # type: ignore[index]
    w2 = w.annotate("y", "abc")  # any sequence of per-row payloads
    assert w2.annotation("y") == ("a", "b", "c") and w2.annotation("x") == (1, 2, 3)


def test_annotations_survive_replace_and_edit():
    v = NodeValue(torch.zeros(2, 5)).annotate("x", ["r0", "r1"])
    assert v.replace(values=torch.ones(2, 5)).annotation("x") == ("r0", "r1")
    edited = v.edit().merge(1, [3], [0.5], source="llm").done()
    assert edited.annotation("x") == ("r0", "r1") and float(edited.values[1, 3]) == 0.5
    replaced = v.edit().replace_row(0, [2], [0.7], source="llm").done()
    assert replaced.annotation("x") == ("r0", "r1")
    assert not edited.same_scores(v)


@pytest.mark.parametrize("bad, err, words", [
    ({"x": [1]}, ValueError, "has 1 rows, values 2"),
    ({"": [1, 2]}, TypeError, "non-empty strings"),
    ({3: [1, 2]}, TypeError, "non-empty strings"),
    ({"x": 7}, TypeError, "sequence of per-row payloads"),
    ({"x": "ab"}, TypeError, "sequence of per-row payloads"),
    ([("x", [1, 2])], TypeError, "must be a mapping"),
])
def test_bad_annotations_are_refused(bad, err, words):
    with pytest.raises(err, match=words):
        NodeValue(torch.zeros(2, 3), annotations=bad)


@pytest.mark.parametrize("seed", range(6))
def test_select_and_concat_split_and_rejoin_every_field(seed):
    rng = random.Random(seed)
    b, n = rng.randint(1, 9), rng.randint(1, 7)
    v = _random_value(rng, b, n, argmax=seed % 2 == 0)
    # a batch split into passes of at most `size` rows and joined again is the batch
    size = rng.randint(1, b)
    parts = [v.select(range(lo, min(b, lo + size))) for lo in range(0, b, size)]
    assert sum(p.rows for p in parts) == b
    for p, lo in zip(parts, range(0, b, size)):
        for r in range(p.rows):
            assert p.annotation("a")[r] == v.annotation("a")[lo + r]
            assert torch.equal(p.values[r], v.values[lo + r])
    _rows_equal(NodeValue.concat(parts), v)
    # any order, repeats included
    order = [rng.randrange(b) for _ in range(rng.randint(1, 2 * b))]
    s = v.select(order)
    for k, r in enumerate(order):
        assert s.annotation("b")[k] == v.annotation("b")[r]
        assert dict(s.evidence[k]) == dict(v.evidence[r]) and s.row_evidence[k] == v.row_evidence[r]
        assert torch.equal(s.values[k], v.values[r])
    with pytest.raises(IndexError):
        v.select([b])


def test_concat_fills_missing_argmax_and_annotations():
    a = NodeValue(torch.rand(2, 3), argmax=torch.zeros(2, 3, dtype=torch.int32)).annotate("x", [1, 2])
    b = NodeValue(torch.rand(1, 3)).annotate("y", ["q"])
    c = NodeValue.concat([a, b])
    assert c.rows == 3
    assert c.annotation("x") == (1, 2, None) and c.annotation("y") == (None, None, "q")
    assert c.argmax is not None and c.argmax[2].tolist() == [-1, -1, -1] and c.argmax[:2].eq(0).all()
    with pytest.raises(ValueError):
        NodeValue.concat([])


# ------------------------------------------------------------------------------ in the executor
def _count_below(ctx, value):
    """Annotation only: per row, how many nodes the sub-query has (children's counts + 1)."""
    below = [c.annotation("count") or (0,) * ctx.rows for c in ctx.inputs]
    return value.annotate("count", [1 + sum(b[row] for b in below) for row in range(ctx.rows)])


def _afresh(ctx, value):
    """Builds a new value from scratch (no annotations of its own) that changes nothing."""
    return NodeValue(value.values.clone(), value.argmax)


def test_annotation_only_hook_changes_nothing_and_is_not_listed():
    art = tiny_artifact()
    queries = [parse(q) for q in ["(p r A)", "(i (p r A) (n (p s B)))", "(u (p s (p r A)) B)"]]
    plain = Executor(art, backend="reference").answer(queries, k=6)
    got = Executor(art, backend="reference", hooks=[_count_below]).answer(queries, k=6)
    assert [r.to_json() for r in got] == [r.to_json() for r in plain]
    expected_counts = {"(p r A)": 2, "(i (p r A) (n (p s B)))": 6, "(u (p s (p r A)) B)": 5}
    for q, res in zip(queries, got):
        assert res.trace.root.annotations == {"count": expected_counts[str(q)]}
        assert all(nt.hooks == () for nt in res.trace.nodes)
        assert "annotations" not in str(res.trace.to_json())  # Python payloads stay out of the JSON


def test_a_value_built_afresh_keeps_earlier_annotations():
    art = tiny_artifact()
    ex = Executor(art, backend="reference", hooks=[_count_below, _afresh])
    (res,) = ex.answer([parse("(p s (p r A))")], k=6)
    assert res.trace.root.annotations == {"count": 3}  # the child's count reached the root
    assert res.trace.root.hooks == ("_afresh",)  # the afresh value is a new tensor: listed


# ------------------------------------------------------------------------------ LGOT across passes
SCRIPT = {
    ("r", ("A",)): ['["B", "D"]'] * 3 + ['["E"]'],
    ("r^-1", ("B",)): ['["A", "D"]'] * 2 + ['["A"]'] * 2,
    ("s", ("B",)): ['["D"]'] * 4,
    ("s", ("B", "C")): ['["D", "E"]'] * 4,
    ("r", ("B",)): ['["C"]'] * 4,
}
QUERIES = ["(i (p r A) (p r^-1 B) (np s B))", "(i (p r A) (np s B) (p r^-1 D))", "(i (p s B) (np r A) (p r C))",
           "(i (p r B) (np s C) (p s A))", "(i (p r A) (np s A) (p r^-1 B))"]


def _lgot_run(pass_rows, mode):
    art = tiny_artifact()
    hook = LGOTHook(client=ScriptedClient(SCRIPT), artifact=art,
                    settings=LGOTSettings(relation_questions="fallback", mode=mode))
    ex = Executor(art, hooks=[hook], backend="reference", pass_rows=pass_rows)
    return ex.answer([parse(q) for q in QUERIES], k=6), hook


def _per_query(result) -> dict:
    """The result's JSON without the trace's ``hooks`` lists: those name the hooks that changed the node
    for the whole batch (any row), so they depend on which queries share a pass; everything else is
    the query's own."""
    d = result.to_json()
    for node in d["trace"]["nodes"]:
        node.pop("hooks", None)
    return d


@pytest.mark.parametrize("mode", ["lgot", "llm-only"])
def test_lgot_sets_travel_with_the_values_across_pass_sizes(mode):
    whole, hook = _lgot_run(None, mode)
    assert not hasattr(hook, "_sets") and not hasattr(hook, "_asked")  # nothing kept between calls
    assert any(r.trace.root.notes.get("llm_set", {}).get("entities") for r in whole)
    for rows in (1, 2, 3):
        split, hook_split = _lgot_run(rows, mode)
        assert [_per_query(r) for r in split] == [_per_query(r) for r in whole], f"pass_rows={rows}"
        assert hook_split.stats.prompts == hook.stats.prompts
        for a, b in zip(split, whole):
            for na, nb in zip(a.trace.nodes, b.trace.nodes):
                assert na.annotations == nb.annotations
                assert isinstance(na.annotations["llm"], LGOTRow)


def test_lgot_annotations_hold_the_sets_and_questions():
    res = _lgot_run(None, "lgot")[0][0]
    root = res.trace.root.annotations["llm"]
    first = res.trace.node((0,)).annotations["llm"]
    assert first.asked is not None and first.asked[1] == ["A"]
    assert first.llm_set == LLMSet({1: 0.75, 3: 0.75, 4: 0.25})  # B, D 3/4; E 1/4 (theta keeps all)
    negated = res.trace.node((2,)).annotations["llm"].llm_set
    assert negated is not None and negated.negated and set(negated.scores) == {3}
    assert root.llm_set is not None and set(root.llm_set.scores) == set()  # {B,D,E} & {A,D} - {D}
    anchor = res.trace.node((0, 0)).annotations["llm"]
    assert anchor == LGOTRow(LLMSet({0: 1.0}), None)
