"""The symbolic (set) evaluator against a brute-force reference, on tiny random graphs."""
from __future__ import annotations

import numpy as np
import pytest

from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Projection, Union
from engine.lang.structures import STRUCTURES
from engine.eval.symbolic import Graph, answers


def brute_force(node, triples, n: int) -> set[int]:
    """Reference semantics: plain Python sets, one triple at a time."""
    if isinstance(node, Anchor):
        return {int(node.entity)}
    if isinstance(node, (Projection, NegatedProjection)):
        src = brute_force(node.arg, triples, n)
        out = {int(t) for h, r, t in triples if r == node.relation and h in src}
        return set(range(n)) - out if isinstance(node, NegatedProjection) else out
    if isinstance(node, Complement):
        return set(range(n)) - brute_force(node.arg, triples, n)
    if isinstance(node, Intersection):
        return set.intersection(*(brute_force(a, triples, n) for a in node.args))
    if isinstance(node, Union):
        return set.union(*(brute_force(a, triples, n) for a in node.args))
    raise TypeError(node)


def random_graph(rng, n: int, r: int, e: int) -> np.ndarray:
    if e == 0:
        return np.zeros((0, 3), np.int64)
    return np.stack([rng.integers(n, size=e), rng.integers(r, size=e), rng.integers(n, size=e)], 1)


def random_queries(rng, n: int, r: int, count: int, negation: str):
    out = []
    for _ in range(count):
        for st in STRUCTURES.values():
            out.append(st.build(rng.integers(n, size=st.num_anchors).tolist(),
                                rng.integers(r, size=st.num_relations).tolist(), negation=negation))
    rng.shuffle(out)  # mixed structures: the evaluator must keep input order
    return out


@pytest.mark.parametrize("negation", ["qto", "complement"])
@pytest.mark.parametrize("n,r,e,seed", [(1, 1, 1, 0), (6, 2, 12, 1), (15, 3, 40, 2), (40, 4, 200, 3), (25, 3, 0, 4)])
def test_matches_brute_force_all_structures(n, r, e, seed, negation):
    rng = np.random.default_rng(seed)
    triples = random_graph(rng, n, r, e)
    g = Graph(triples, n, r)
    queries = random_queries(rng, n, r, 6, negation)
    tl = [tuple(map(int, t)) for t in triples]
    got = answers(queries, g, batch_size=5)  # small batches: several per structure
    for q, a in zip(queries, got):
        assert a.dtype == np.int64
        assert list(a) == sorted(brute_force(q, tl, n)), str(q)


def test_negation_modes_agree_and_extra_forms():
    rng = np.random.default_rng(7)
    n, r = 20, 3
    triples = random_graph(rng, n, r, 60)
    g = Graph(triples, n, r)
    tl = [tuple(map(int, t)) for t in triples]
    a, b = random_queries(np.random.default_rng(1), n, r, 3, "qto"), random_queries(np.random.default_rng(1), n, r, 3, "complement")
    assert [x.tolist() for x in answers(a, g)] == [x.tolist() for x in answers(b, g)]
    # Forms outside the 14 structures: negations of groups, projection of a complement, nested unions.
    e = [Anchor(i) for i in range(4)]
    extra = [
        Complement(Intersection((Complement(Projection(0, e[0])), Complement(Projection(1, e[1]))))),  # 2u-DM
        Projection(2, Complement(Projection(0, e[0]))),
        Union((NegatedProjection(0, e[0]), Projection(1, e[1]))),
        Union((NegatedProjection(0, e[0]), NegatedProjection(1, e[2]))),
        Intersection((NegatedProjection(0, e[0]), NegatedProjection(1, e[2]))),
        Complement(e[3]),
        e[3],
    ]
    for q, got in zip(extra, answers(extra, g)):
        assert got.tolist() == sorted(brute_force(q, tl, n)), str(q)


def test_duplicate_triples_and_unresolved_names():
    g = Graph(np.array([[0, 0, 1], [0, 0, 1], [1, 0, 2]]), 3, 1)
    assert answers([Projection(0, Projection(0, Anchor(0)))], g)[0].tolist() == [2]
    with pytest.raises(TypeError, match="resolve"):
        answers([Projection("likes", Anchor(0))], g)
    with pytest.raises(ValueError, match=r"relation id 5 out of range \[0, 1\)"):
        Graph(np.array([[0, 5, 1]]), 3, 1)
    assert answers([], g) == []


@pytest.mark.parametrize("n,r,e", [(1, 1, 0), (5, 2, 30), (30, 4, 300)])
def test_triple_index_lookups_match_brute_force(seed, n, r, e):
    """Graph is the shared kge.index.TripleIndex: every lookup against Python sets and lists."""
    rng = np.random.default_rng(seed)
    triples = random_graph(rng, n, r, e)
    if e:
        triples = np.concatenate([triples, triples[rng.integers(0, e, e // 3)]])  # duplicates
    g = Graph(triples, n, r)
    rows = [tuple(map(int, t)) for t in triples]
    unique = sorted(set(rows))
    assert [tuple(t) for t in g.triples.tolist()] == unique and g.num_edges == len(unique)
    first = {}
    for i, t in enumerate(rows):
        first.setdefault(t, i)
    assert g.input_rows.tolist() == [first[t] for t in unique]
    adj = g.relation_adjacency().toarray()
    for x in range(n):
        out = [t for t in unique if t[0] == x]
        assert [tuple(t) for t in g.out_edges(x).tolist()] == out  # sorted by (relation, tail)
        assert [tuple(t) for t in g.out_edges(x, input_order=True).tolist()] == sorted(out, key=first.get)
        inn = sorted((t for t in unique if t[2] == x), key=lambda t: (t[1], t[0]))
        assert [tuple(t) for t in g.in_edges(x).tolist()] == inn
        assert [tuple(t) for t in g.in_edges(x, input_order=True).tolist()] == sorted(inn, key=first.get)
        lo, hi = g.in_ptr[x], g.in_ptr[x + 1]
        assert list(zip(g.in_head[lo:hi].tolist(), g.in_rel[lo:hi].tolist())) == [(h, rr) for h, rr, _ in inn]
        for rel in range(r):
            tails = sorted(t for h, rr, t in unique if h == x and rr == rel)
            assert g.tails(x, rel).tolist() == tails
            assert g.rh_tail[g.rh_ptr[rel * n + x]: g.rh_ptr[rel * n + x + 1]].tolist() == tails
            assert np.flatnonzero(adj[rel * n + x]).tolist() == tails
            assert g.heads(x, rel).tolist() == sorted(h for h, rr, t in unique if t == x and rr == rel)
            for y in range(n):
                assert g.has_edge(x, rel, y) == ((x, rel, y) in first)


def test_triple_index_bad_input():
    with pytest.raises(ValueError, match=r"triples row 1 \[0, 0, 3\]: entity id out of range \[0, 3\)"):
        Graph(np.array([[0, 0, 1], [0, 0, 3]]), 3, 1)
    with pytest.raises(ValueError, match=r"expected shape \(E, 3\)"):
        Graph(np.zeros((2, 2), dtype=np.int64), 3, 1)
    with pytest.raises(ValueError, match="expected integer ids"):
        Graph(np.array([[0.0, 0.0, 1.0]]), 3, 1)
