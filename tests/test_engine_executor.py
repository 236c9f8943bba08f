"""The batched executor against a brute-force reference that enumerates variable assignments.

The reference is plain Python/numpy (float64) and shares nothing with ``ops``:
for every conjunctive block of the query (anchors, projections, negated
projections, intersections) it enumerates every assignment of the block's
variables and takes the max of the block's formula; unions and complements
are evaluated recursively as atoms of the enclosing block.
"""
from __future__ import annotations

import itertools
import math
import random
import zlib

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import ops
from engine.exec.executor import Executor, combine_scores
from engine.lang.query import (
    Anchor,
    Complement,
    Intersection,
    NegatedProjection,
    Node,
    Projection,
    Union,
    iter_nodes,
    named,
    parse,
    to_sexpr,
)
from engine.lang.structures import STRUCTURES
from kge import Artifact, UserError
from kgreason.constants import QTO_NEG_SCALE

# The compiled backend joins once its kernels are built (ops.has_kernel).
BACKENDS = ["reference"] + (["cpp"] if ops.has_kernel("project", "cpu") else [])


# ------------------------------------------------------------------------------ random KG
def random_artifact(seed: int, n: int = 6, r: int = 3, density: float = 0.35) -> tuple[Artifact, list[np.ndarray]]:
    """An artifact with random [0, 1] sparse relation matrices; returns it and the dense matrices."""
    rng = np.random.default_rng(seed)
    dense = []
    for _ in range(r):
        mask = rng.random((n, n)) < density
        vals = rng.random((n, n)).astype(np.float32)
        # Ties and exact ones exercise the argmax tie rule and the min(1, s*M) clamp.
        vals[rng.random((n, n)) < 0.15] = 0.5
        vals[rng.random((n, n)) < 0.05] = 1.0
        dense.append(np.where(mask, vals, 0).astype(np.float32))
    stacked = sp.csr_matrix(np.concatenate(dense, axis=0))
    stacked.sort_indices()
    art = Artifact(
        entities=[f"e{i}" for i in range(n)],
        relations=[f"r{k}" for k in range(r)],
        matrices=stacked,
        observed=np.zeros((0, 3), dtype=np.int64),
        missing=np.zeros((0, 3), dtype=np.int64),
    )
    return art, [d.astype(np.float64) for d in dense]


# -------------------------------------------------------------------------- brute force
class BruteForce:
    """score(y) = max over assignments of the block variables of the block formula (see module doc)."""

    def __init__(self, dense: list[np.ndarray], tnorm: str, neg_scale: float) -> None:
        self.m = dense
        self.n = dense[0].shape[0]
        self.tnorm = tnorm
        self.s = neg_scale
        self._memo: dict[tuple[int, int], float] = {}

    def _vars(self, node: Node, out: list[Node]) -> None:
        """Block variables: the source entity of every projection inside the block."""
        if isinstance(node, (Projection, NegatedProjection)):
            out.append(node)
            if not isinstance(node.arg, (Union, Complement)):
                self._vars(node.arg, out)
        elif isinstance(node, Intersection):
            for a in node.args:
                if not isinstance(a, (Union, Complement)):
                    self._vars(a, out)

    def _formula(self, node: Node, y: int, asg: dict[int, int]) -> float:
        if isinstance(node, Anchor):
            return 1.0 if node.entity == y else 0.0
        if isinstance(node, (Projection, NegatedProjection)):
            x = asg[id(node)]
            w = self.m[node.relation][x, y]
            if isinstance(node, NegatedProjection):
                w = 1.0 - min(1.0, self.s * w)
            return self._formula(node.arg, x, asg) * w
        if isinstance(node, Intersection):
            vals = [self._formula(a, y, asg) for a in node.args]
            return math.prod(vals) if self.tnorm == "product" else min(vals)
        return self.value(node, y)  # union / complement: an atom of this block

    def value(self, node: Node, y: int) -> float:
        key = (id(node), y)
        if key in self._memo:
            return self._memo[key]
        if isinstance(node, Union):
            vals = [self.value(a, y) for a in node.args]
            v = max(vals) if self.tnorm == "godel" else 1.0 - math.prod(1.0 - x for x in vals)
        elif isinstance(node, Complement):
            v = 1.0 - self.value(node.arg, y)
        else:
            variables: list[Node] = []
            self._vars(node, variables)
            v = 0.0
            for combo in itertools.product(range(self.n), repeat=len(variables)):
                asg = {id(var): x for var, x in zip(variables, combo)}
                v = max(v, self._formula(node, y, asg))
        self._memo[key] = v
        return v

    def scores(self, node: Node) -> np.ndarray:
        return np.array([self.value(node, y) for y in range(self.n)])


# -------------------------------------------------------------------------- random queries
def random_structure_query(rng: random.Random, name: str, n: int, r: int, negation: str) -> Node:
    s = STRUCTURES[name]
    return s.build([rng.randrange(n) for _ in range(s.num_anchors)],
                   [rng.randrange(r) for _ in range(s.num_relations)], negation=negation)


def random_nested(rng: random.Random, n: int, r: int, depth: int, budget: list[int]) -> Node:
    """Random expression; ``budget`` caps the projections per query (keeps the brute force small)."""
    choices = ["e"] if depth == 0 else ["e", "p", "p", "np", "i", "u", "n"]
    kind = rng.choice(choices)
    if kind in ("p", "np") and budget[0] <= 0:
        kind = "e"
    if kind == "e":
        return Anchor(rng.randrange(n))
    if kind in ("p", "np"):
        budget[0] -= 1
        cls = Projection if kind == "p" else NegatedProjection
        return cls(rng.randrange(r), random_nested(rng, n, r, depth - 1, budget))
    if kind == "n":
        return Complement(random_nested(rng, n, r, depth - 1, budget))
    k = rng.choice([2, 2, 3])
    args = tuple(random_nested(rng, n, r, depth - 1, budget) for _ in range(k))
    return (Intersection if kind == "i" else Union)(args)


def check_explanations(ex: Executor, queries: list[Node], dense: list[np.ndarray], brute: BruteForce, k: int) -> None:
    results = ex.answer(queries, k=k, explain=True, batch_size=4)
    for q, res in zip(queries, results):
        assert res.query == to_sexpr(named(q, ex.artifact))
        expected = brute.scores(q)
        prev = math.inf
        for a in res.answers:
            assert a.score > 0
            assert a.score <= prev + 1e-7
            prev = a.score
            assert a.score == pytest.approx(expected[a.id], abs=1e-5)
            e = a.explanation
            assert e.entity == a.id and e.score == pytest.approx(a.score, abs=1e-7)
            # The atoms' truth values alone give back the score.
            assert e.recompute(ex.tnorm) == pytest.approx(a.score, abs=1e-5, rel=1e-5)
            check_atoms(e, dense, ex.neg_scale)
            assert e.text()  # renders
            assert a.to_json()["explanation"]["tree"]["id"] == a.id
            # No hooks: every score comes from KG atoms, with no evidence anywhere.
            assert a.provenance == e.source == "kg" and not e.evidences()
        # The trace is always kept: one node per sub-query, children first, the root last.
        assert [nt.op for nt in res.trace.nodes][-1] == (q.head or "e")
        assert len(res.trace.nodes) == sum(1 for _ in iter_nodes(q))
        # The answers are a top-k of the positive-score entities: none left out scores higher.
        assert len(res.answers) >= min(k, int((expected > 1e-5).sum()))
        returned = {a.id for a in res.answers}
        floor = res.answers[-1].score if len(res.answers) == k else 0.0
        assert all(expected[i] <= floor + 1e-5 for i in range(len(expected)) if i not in returned)


def check_atoms(e, dense: list[np.ndarray], s: float) -> None:
    if e.op in ("p", "np") and e.children:
        child = e.children[0]
        w = dense[e.relation][child.entity, e.entity]
        assert e.weight == pytest.approx(w, abs=1e-7)
        truth = w if e.op == "p" else 1.0 - min(1.0, s * w)
        assert e.truth == pytest.approx(truth, abs=1e-6)
        assert e.score == pytest.approx(child.score * e.truth, abs=1e-5)
    if e.op in ("i", "u", "n"):
        assert all(c.entity == e.entity for c in e.children)
    for c in e.children:
        check_atoms(c, dense, s)


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tnorm", ["product", "godel"])
@pytest.mark.parametrize("negation", ["qto", "complement"])
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_structures_match_brute_force(structure, negation, tnorm, backend):
    seed = zlib.crc32(f"{structure}/{negation}/{tnorm}".encode()) % 10_000
    art, dense = random_artifact(seed, n=5, r=3)
    rng = random.Random(seed)
    queries = [random_structure_query(rng, structure, art.num_entities, art.num_relations, negation) for _ in range(6)]
    ex = Executor(art, tnorm=tnorm, neg_scale=2.5, backend=backend)
    brute = BruteForce(dense, tnorm, 2.5)
    expected = np.stack([brute.scores(q) for q in queries])
    for bs in (1, 4, 1024):
        got = ex.scores(queries, batch_size=bs).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    check_explanations(ex, queries, dense, brute, k=3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tnorm", ["product", "godel"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nested_expressions_match_brute_force(seed, tnorm, backend):
    art, dense = random_artifact(100 + seed, n=5, r=2)
    rng = random.Random(seed)
    queries = []
    while len(queries) < 25:
        q = random_nested(rng, art.num_entities, art.num_relations, depth=4, budget=[4])
        queries.append(q)
    # Same shapes as well: re-instantiate a few shapes with new anchors/relations.
    queries += [parse(to_sexpr(q)) for q in queries[:5]]
    ex = Executor(art, tnorm=tnorm, neg_scale=QTO_NEG_SCALE, backend=backend)
    brute = BruteForce(dense, tnorm, 3.0)
    expected = np.stack([brute.scores(q) for q in queries])
    got = ex.scores(queries, batch_size=7).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    check_explanations(ex, queries, dense, brute, k=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_relations_in_one_batch_are_grouped_correctly(backend):
    """Rows with different relations at the same node (gather/scatter) equal one-by-one execution."""
    art, dense = random_artifact(7, n=12, r=5, density=0.3)
    rng = random.Random(7)
    queries = [random_structure_query(rng, name, 12, 5, "qto") for name in ("pin", "up", "3p") for _ in range(20)]
    ex = Executor(art, backend=backend)
    batched = ex.scores(queries, batch_size=1024)
    single = torch.cat([ex.scores([q], batch_size=1) for q in queries])
    assert torch.equal(batched, single)
    # Passes of at most 7 rows give the same bits; iter_scores covers every query once.
    small = Executor(art, backend=backend, pass_rows=7)
    assert torch.equal(small.scores(queries), batched)
    seen = []
    for idx, y in small.iter_scores(queries, batch_size=1024):
        assert y.shape == (len(idx), 12) and len(idx) <= 7
        assert torch.equal(y, batched[idx])
        seen += idx
    assert sorted(seen) == list(range(len(queries)))


def test_names_and_ids_give_the_same_scores():
    art, _ = random_artifact(3)
    ex = Executor(art)
    a = ex.scores([parse("(i (p r1 (p r0 e2)) (np r2 e4))")])
    b = ex.scores([parse("(i (p #1 (p #0 #2)) (np #2 #4))")])
    assert torch.equal(a, b)


def test_empty_query_list_and_no_answers():
    art, _ = random_artifact(4)
    ex = Executor(art)
    assert ex.scores([]).shape == (0, art.num_entities)
    assert ex.answer([]) == []
    # An isolated anchor projected through an empty relation has no answers.
    art2 = Artifact(entities=["a", "b"], relations=["r"], matrices=sp.csr_matrix((2, 2), dtype=np.float32),
                    observed=np.zeros((0, 3)), missing=np.zeros((0, 3)))
    res = Executor(art2).answer([parse("(p r a)")])
    assert res[0].answers == []


def test_bad_input_messages():
    art, _ = random_artifact(5)
    ex = Executor(art)
    with pytest.raises(UserError, match=r"unknown entity 'e77'.*closest known"):
        ex.scores([parse("(p r0 e77)")])
    with pytest.raises(UserError, match=r"unknown relation 'r9'"):
        ex.answer([parse("(p r9 e1)")])
    with pytest.raises(UserError, match=r"entity id 99 out of range"):
        ex.scores([parse("(p r0 #99)")])
    with pytest.raises(UserError, match=r"t-norm"):
        Executor(art, tnorm="lukasiewicz")
    with pytest.raises(UserError, match=r"neg_scale"):
        Executor(art, neg_scale=-1)
    with pytest.raises(UserError, match=r"top-k"):
        ex.answer([parse("e1")], k=0)


def test_combine_scores_matches_ops():
    xs = [torch.rand(1, 7) for _ in range(3)]
    for tnorm in ("product", "godel"):
        for op, fn in (("i", ops.intersect), ("u", ops.union)):
            got = fn(*xs, tnorm=tnorm)[0]
            for j in range(7):
                assert combine_scores(op, [float(x[0, j]) for x in xs], tnorm) == pytest.approx(float(got[j]), abs=1e-6)


def loop_eval(ex: Executor, node: Node) -> torch.Tensor:
    """One query at a time, straight through the ops operators on a (1, N) vector."""
    if isinstance(node, Anchor):
        x = torch.zeros(1, ex.num_entities, device=ex.device)
        x[0, node.entity] = 1.0
        return x
    if isinstance(node, Projection):
        return ops.project(loop_eval(ex, node.arg), ex.rows.relation(node.relation))
    if isinstance(node, NegatedProjection):
        return ops.project(loop_eval(ex, node.arg), ex.rows.relation(node.relation), negate=True, neg_scale=ex.neg_scale)
    if isinstance(node, Intersection):
        return ops.intersect(*[loop_eval(ex, a) for a in node.args], tnorm=ex.tnorm)
    if isinstance(node, Union):
        return ops.union(*[loop_eval(ex, a) for a in node.args], tnorm=ex.tnorm)
    return ops.negate(loop_eval(ex, node.arg))


@pytest.mark.parametrize("tnorm", ["product", "godel"])
def test_batched_equals_operator_loop_bitwise(tnorm, device):
    """Batching (row grouping, the one-hot gather of first hops, sorting) changes no bit of the result."""
    art, _ = random_artifact(11, n=40, r=6, density=0.1)
    rng = random.Random(11)
    queries = [random_structure_query(rng, name, 40, 6, neg) for name in STRUCTURES for neg in ("qto", "complement")
               for _ in range(5)]
    ex = Executor(art, tnorm=tnorm, neg_scale=2.0, device=device)
    expected = torch.cat([loop_eval(ex, q) for q in queries])
    got = ex.scores(queries, batch_size=1024)
    assert got.device.type == device
    assert torch.equal(got, expected)
    res = ex.answer(queries[:10], k=3)  # explanations work on the device too
    assert all(a.explanation.recompute(tnorm) == pytest.approx(a.score, abs=1e-5) for r in res for a in r.answers)
    got[0, 0] = 0.5  # a normal tensor: callers may edit scores in place (e.g. to filter known answers)


def test_tnorms_are_the_ops_list():
    """One list of t-norms: the executor (and the CLIs that take their choices from it) use ops'."""
    from engine.exec import executor

    assert executor.TNORMS is ops.TNORMS


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_with_trace_equal_scores(backend):
    """trace=True changes no bit of the scores; the traces cover every query in input order."""
    art, _ = random_artifact(21, n=15, r=4, density=0.25)
    rng = random.Random(21)
    queries = [random_structure_query(rng, name, 15, 4, neg) for name in STRUCTURES for neg in ("qto", "complement")
               for _ in range(3)]
    ex = Executor(art, backend=backend, pass_rows=5)
    plain = ex.scores(queries)
    traced, traces = ex.scores(queries, trace=True, trace_values=True)
    assert torch.equal(plain, traced)
    assert [t.index for t in traces] == list(range(len(queries)))
    for q, t in zip(queries, traces):
        assert t.query == to_sexpr(named(q, art))
        assert torch.equal(t.root.values, plain[t.index])
        assert [nt.path for nt in t.nodes][-1] == ()
    # One batch returns the root tensor itself: editing it in place leaves the trace's copy alone.
    one, one_traces = Executor(art, backend=backend).scores(queries[:1], trace=True, trace_values=True)
    one[0, :] = 0.5
    assert torch.equal(one_traces[0].root.values, plain[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("negated", [False, True])
def test_mixed_relation_projection_matches_batch_of_one(backend, negated):
    """A mixed-relation, non-one-hot batch (the multi-relation path of ops.project): scores and argmax equal each row alone."""
    art, _ = random_artifact(11, n=12, r=5, density=0.3)
    ex = Executor(art, backend=backend)
    g = torch.Generator().manual_seed(11)
    x = torch.rand(40, 12, generator=g) * (torch.rand(40, 12, generator=g) < 0.5)
    x[3] = 0.0  # an empty row
    rels = [int(r) for r in torch.randint(0, 5, (40,), generator=g)]
    y, arg = ex._project_rows(x, rels, negated, True)
    for b, r in enumerate(rels):
        y1, a1 = ex._project_rows(x[b : b + 1], [r], negated, True)
        assert torch.equal(y[b : b + 1], y1) and torch.equal(arg[b : b + 1], a1)
    # End to end: mixed-relation 2p/ip/pin batches equal batch-1 answers, witnesses included.
    rng = random.Random(11)
    queries = [random_structure_query(rng, name, 12, 5, "qto") for name in ("2p", "ip", "pin") for _ in range(10)]
    batched = ex.answer(queries, k=4)
    for q, a in zip(queries, batched):
        assert ex.answer([q], k=4)[0] == a  # answers, scores and explanations (the trace is not compared)
        assert a.answers or not ex.scores([q]).any()


# The fast lane runs three of the 24 cases (~3 s of CPU of ~46): every ratio, both t-norms and both
# backends once; the full run (CI) runs the whole grid, the same test at more (density, t-norm, backend).
_SPARSE_FAST = {(0.3, 8.0, "product", "reference"), (0.02, 0.0, "godel", "cpp"), (0.3, math.inf, "product", "cpp")}


@pytest.mark.parametrize("density,ratio,tnorm,backend", [
    pytest.param(*case, marks=() if case in _SPARSE_FAST else pytest.mark.slow)
    for case in itertools.product([0.02, 0.3], [0.0, 8.0, math.inf], ["product", "godel"], BACKENDS)])
def test_sparse_sets_equal_dense_bitwise(density, ratio, tnorm, backend):
    """Sparse intermediate sets (ops.sparse_rows) change no bit of any result, whichever nodes stay sparse.

    ``ratio`` 0 keeps every projection sparse, inf every projection dense (anchors and
    intersections/unions of sparse arguments stay sparse), 8 decides per node by size.
    """
    seed = random.randrange(1 << 30)
    art, _ = random_artifact(seed, n=50, r=4, density=density)
    rng = random.Random(seed)
    queries = [random_structure_query(rng, name, 50, 4, neg) for name in STRUCTURES for neg in ("qto", "complement")
               for _ in range(2)]
    queries += [random_nested(rng, 50, 4, depth=4, budget=[5]) for _ in range(10)]
    dense = Executor(art, tnorm=tnorm, backend=backend, sparse=False)
    sparse = Executor(art, tnorm=tnorm, backend=backend, sparse=True, pass_rows=9)
    sparse.sparse_dense_ratio = ratio
    expected = dense.scores(queries)
    assert torch.equal(sparse.scores(queries), expected), f"seed {seed}"
    assert torch.equal(sparse.scores(queries, batch_size=1), expected), f"seed {seed}"
    if ratio != 8.0:
        return
    # Explanations, traces with values and hooks take the dense path: same scores.
    got, traces = sparse.scores(queries[:12], trace=True, trace_values=True)
    assert torch.equal(got, expected[:12])
    res = sparse.answer(queries[:6], k=3)
    assert [[a.id for a in r.answers] for r in res] == [[a.id for a in r.answers] for r in dense.answer(queries[:6], k=3)]


def test_sparse_flag_checked_and_defaults():
    art, _ = random_artifact(5)
    assert Executor(art).sparse is False  # dense unless asked (see the sparse argument)
    assert Executor(art, sparse=True).sparse is True
    with pytest.raises(UserError, match="sparse"):
        Executor(art, sparse="yes")


def test_one_pass_scan_agrees_with_shape_key_and_relations_of():
    """Executor._prepare groups id-only queries by ``_scan`` and named ones by ``shape_key`` /
    ``relations_of``: the two must give the same keys, or one shape would split into two batches."""
    from engine.exec.executor import _scan
    from engine.lang.query import relations_of, shape_key

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    n, r = 30, 5
    queries = [random_structure_query(rng, name, n, r, neg) for name in STRUCTURES for neg in ("qto", "complement")]
    queries += [random_nested(rng, n, r, depth=4, budget=[6]) for _ in range(20)]
    for q in queries:
        rels: list[int] = []
        assert _scan(q, n, r, rels) == shape_key(q), f"seed {seed}: {q}"
        assert rels == relations_of(q), f"seed {seed}: {q}"
    out_of_range = Projection(r, Anchor(0))
    assert _scan(out_of_range, n, r, []) is None  # left to resolve(), which reports it
