"""kge.rows: the RelationRows interface the executor projects through.

Eager rows are the artifact's CSR prepared once (one transpose, the CSR's arrays shared);
lazy rows hand out compact blocks of exactly the rows a batch's active heads need; a tiny
custom implementation (rows split into two shards by relation) is enough for the executor,
whose every output (scores, answers, explanations, sparse sets) it leaves unchanged bit for bit.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import ops
from engine.exec.executor import Executor
from engine.lang.query import parse
from engine.lang.structures import NEGATION_MODES, STRUCTURES
from kge import Artifact, UserError
from kge.calibrate import calibrate
from kge.lazy import LazyMatrices
from kge.rows import EagerRows, LazyRows, RelationRows, RowBlock, active_pairs
from ops.sparse_rows import SparseRows

BACKENDS = ["reference"] + (["cpp"] if ops.has_kernel("project", "cpu") else [])


# ------------------------------------------------------------------------------ helpers
def random_artifact(seed: int, n: int = 30, r: int = 4, density: float = 0.15) -> Artifact:
    rng = np.random.default_rng(seed)
    dense = []
    for _ in range(r):
        vals = rng.random((n, n)).astype(np.float32)
        vals[rng.random((n, n)) < 0.15] = 0.5  # ties exercise the argmax rule
        dense.append(np.where(rng.random((n, n)) < density, vals, 0).astype(np.float32))
    m = sp.csr_matrix(np.concatenate(dense, axis=0))
    m.sort_indices()
    z = np.zeros((0, 3), dtype=np.int64)
    return Artifact(entities=[f"e{i}" for i in range(n)], relations=[f"r{k}" for k in range(r)], matrices=m,
                    observed=z, missing=z)


def lazy_pair(seed: int, n: int = 30, r: int = 3) -> tuple[Artifact, Artifact]:
    """(eager, lazy) artifacts over the same random embeddings at one threshold."""
    rng = np.random.default_rng(seed)
    ent = ((rng.normal(size=(n, 8)) + 1j * rng.normal(size=(n, 8))) * 0.5).astype(np.complex64)
    rel = (rng.normal(size=(r, 8)) + 1j * rng.normal(size=(r, 8))).astype(np.complex64)
    obs = np.stack([rng.integers(0, n, 3 * n), rng.integers(0, r, 3 * n), rng.integers(0, n, 3 * n)], 1).astype(np.int64)
    common = dict(entities=[f"e{i}" for i in range(n)], relations=[f"r{k}" for k in range(r)], observed=obs,
                  missing=np.zeros((0, 3), dtype=np.int64))
    mat, _ = calibrate(ent, rel, obs, threshold=2e-4, progress=False)
    return (Artifact(matrices=mat, **common),
            Artifact(matrices=LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-4), **common))


def random_batch(seed: int, b: int, n: int, r: int, keep: float = 0.3) -> tuple[torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, n, generator=g) * (torch.rand(b, n, generator=g) < keep)
    x[0] = 0.0  # an empty row
    return x, [int(v) for v in torch.randint(0, r, (b,), generator=g)]


def structure_queries(seed: int, n: int, r: int, per: int = 3) -> list:
    rng = np.random.default_rng(seed)
    return [st.build(rng.integers(0, n, st.num_anchors).tolist(), rng.integers(0, r, st.num_relations).tolist(),
                     negation=neg)
            for neg in NEGATION_MODES for st in STRUCTURES.values() for _ in range(per)]


def project_through(rows: RelationRows, x: torch.Tensor, rels: list[int], negated: bool = False):
    """The executor's route, spelled out: one ops.project call per block, rows scattered back."""
    y = torch.zeros_like(x)
    a = torch.full(x.shape, -1, dtype=torch.int32)
    seen = torch.zeros(x.shape[0], dtype=torch.int64)
    for block in rows.blocks(x, rels):
        idx = torch.arange(x.shape[0]) if block.rows is None else block.rows
        seen[idx] += 1
        yb, ab = ops.project(x[idx], block.stack, block.rel, negate=negated, return_argmax=True)
        y[idx], a[idx] = yb, ab
    assert torch.equal(seen, torch.ones_like(seen)), "every batch row in exactly one block"
    return y, a


class ShardedRows(RelationRows):
    """Rows split in two shards by relation parity, each its own prepared stack: only the interface."""

    def __init__(self, *, artifact: Artifact) -> None:
        n, r = artifact.num_entities, artifact.num_relations
        self.num_entities, self.num_relations, self.device = n, r, torch.device("cpu")
        self.full = artifact.matrices
        self.shards = []
        for parity in (0, 1):
            rels = list(range(parity, r, 2))
            part = sp.vstack([artifact.relation_block(k) for k in rels], format="csr") if rels else None
            self.shards.append((np.asarray(rels, dtype=np.int64),
                                None if part is None else ops.prepare_matrices(part, num_entities=n)))
        self.blocks_drawn = 0

    def blocks(self, x, relations):
        rels = np.asarray(relations, dtype=np.int64)
        for ids, stack in self.shards:
            mine = np.flatnonzero(np.isin(rels, ids))
            if len(mine):
                self.blocks_drawn += 1
                yield RowBlock(stack, torch.from_numpy(np.searchsorted(ids, rels[mine])), torch.from_numpy(mine))

    def weight(self, r, i, j):
        return float(self.full[r * self.num_entities + i, j])


# ------------------------------------------------------------------------------ eager rows
def test_eager_rows_hold_the_kg_once():
    """One prepared stack per artifact and device: the CSR's arrays shared, one transpose, shared by executors."""
    art = random_artifact(1)
    rows = art.relation_rows(device="cpu")
    assert isinstance(rows, EagerRows) and art.relation_rows(device="cpu") is rows
    ex1, ex2 = Executor(art), Executor(art, sparse=True)
    assert ex1.rows is rows and ex2.rows is rows and ex1.without_hooks().rows is rows
    stack = rows.full_stack()
    assert rows.full_stack() is stack  # prepared once
    m = art.matrices
    for t, a in ((stack.crow, m.indptr), (stack.col, m.indices), (stack.val, m.data)):
        assert t.data_ptr() == a.__array_interface__["data"][0]  # shared, not copied
    ref = ops.prepare_matrices(m)
    for f in ("tcrow", "trow", "tval"):
        assert torch.equal(getattr(stack, f), getattr(ref, f))
    # per-relation matrices are views of the stack: no second transposed copy
    p = ex1.rows.relation(2)

    def inside(view, base):
        return base.data_ptr() <= view.data_ptr() <= base.data_ptr() + base.numel() * base.element_size()

    assert inside(p.val, stack.val) and inside(p.col, stack.col)
    assert inside(p.tval, stack.tval) and inside(p.row, stack.trow)
    assert torch.equal(p.to_sparse_csr().to_dense(), torch.from_numpy(art.relation_block(2).toarray()))
    with pytest.raises(IndexError, match=r"relation id 4 out of range \[0, 4\)"):  # as before the refactor
        ex1.rows.relation(4)


def test_eager_rows_one_block_and_weights():
    art = random_artifact(2)
    rows = art.relation_rows()
    x, rels = random_batch(2, 20, art.num_entities, art.num_relations)
    blocks = list(rows.blocks(x, rels))
    assert len(blocks) == 1 and blocks[0].rows is None and blocks[0].rel.tolist() == rels
    dense = art.matrices.toarray()
    rng = np.random.default_rng(2)
    for _ in range(300):
        r, i, j = (int(v) for v in rng.integers(0, [art.num_relations, art.num_entities, art.num_entities]))
        assert rows.weight(r, i, j) == float(dense[r * art.num_entities + i, j])


def test_relation_rows_devices(device):
    art = random_artifact(3)
    rows = art.relation_rows(device=device)
    assert rows.device.type == device and rows.full_stack().device.type == device
    assert art.relation_rows(device=device) is rows
    if device != "cpu":
        assert art.relation_rows(device="cpu") is not rows


# ------------------------------------------------------------------------------ lazy rows
@pytest.mark.parametrize("one_relation", [False, True])
@pytest.mark.parametrize("max_pairs", [None, 5, 1, 40])
def test_lazy_blocks_cover_rows_and_equal_eager(seed, max_pairs, one_relation):
    """Blocks (split by pairs, one relation each) cover each row once; their rows are the eager rows.  With
    ``one_relation`` every row goes through one relation (a single query's hop, a batch sorted by relation):
    the one-mask path, whole or split by pairs."""
    eager, lazy = lazy_pair(seed)
    rows = LazyRows(matrices=lazy.matrices, max_pairs=max_pairs)
    assert isinstance(lazy.relation_rows(), LazyRows)
    x, rels = random_batch(seed, 25, eager.num_entities, eager.num_relations)
    if one_relation:
        rels = [rels[1]] * len(rels)
    n = eager.num_entities
    for block in rows.blocks(x, rels):
        idx = torch.arange(x.shape[0]) if block.rows is None else block.rows
        xb = x[idx]
        if max_pairs is not None and len(idx) > 1:
            assert int((xb > 0).sum()) <= max_pairs
        full = eager.matrices
        for k, b in enumerate(idx.tolist()):  # every active head's row is the eager row, entry for entry
            for h in (xb[k] > 0).nonzero().flatten().tolist():
                loc = int(block.rel[k]) * n + h
                lo, hi = int(block.stack.crow[loc]), int(block.stack.crow[loc + 1])
                glob = rels[b] * n + h
                assert block.stack.col[lo:hi].tolist() == full.indices[full.indptr[glob]:full.indptr[glob + 1]].tolist()
                assert np.array_equal(block.stack.val[lo:hi].numpy(), full.data[full.indptr[glob]:full.indptr[glob + 1]])
    for negated in (False, True):
        ye, ae = project_through(eager.relation_rows(), x, rels, negated)
        yl, al = project_through(rows, x, rels, negated)
        assert torch.equal(ye, yl) and torch.equal(ae, al)
    rng = np.random.default_rng(seed)
    for _ in range(100):
        r, i, j = (int(v) for v in rng.integers(0, [eager.num_relations, n, n]))
        assert rows.weight(r, i, j) == float(eager.matrices[r * n + i, j])
    assert torch.equal(rows.relation(1).to_sparse_csr().to_dense(),
                       torch.from_numpy(eager.relation_block(1).toarray()))


def test_active_pairs_dense_and_sparse():
    x, _ = random_batch(4, 9, 12, 1, keep=0.4)
    s = SparseRows.from_dense(x)
    s = SparseRows(s.crow, s.col, torch.where(torch.arange(s.nnz) % 3 == 0, 0.0, s.val), s.n)  # stored zeros
    b, h = active_pairs(s.to_dense())
    bs, hs = active_pairs(s)
    assert np.array_equal(b, bs) and np.array_equal(h, hs)
    assert len(b) == int((s.to_dense() > 0).sum())


# ------------------------------------------------------------------------------ the executor over the interface
@pytest.mark.parametrize("backend", BACKENDS)
def test_executor_needs_only_the_interface(seed, backend):
    """Rows in two shards (several blocks per projection): scores, answers and explanations unchanged."""
    art = random_artifact(seed, n=25, r=5)
    sharded = ShardedRows(artifact=art)
    qs = structure_queries(seed, art.num_entities, art.num_relations)
    for kw in ({}, {"sparse": True}, {"frontier_k": 4}, {"pass_rows": 7}):
        ref = Executor(art, backend=backend, **kw)
        ex = Executor(art, backend=backend, rows=sharded, **kw)
        assert torch.equal(ex.scores(qs), ref.scores(qs))
        assert ex.answer(qs[::4], k=4) == ref.answer(qs[::4], k=4)  # answers, scores, explanations, traces
    assert sharded.blocks_drawn > 0
    x, rels = random_batch(seed, 16, art.num_entities, art.num_relations)
    for negated in (False, True):
        y1, a1 = Executor(art, backend=backend, rows=sharded)._project_rows(x, rels, negated, True)
        y2, a2 = Executor(art, backend=backend)._project_rows(x, rels, negated, True)
        assert torch.equal(y1, y2) and torch.equal(a1, a2)


@pytest.mark.parametrize("kw", [{}, {"frontier_k": 3}, {"pass_rows": 5}])
def test_lazy_sparse_sets_equal_dense_bitwise(seed, kw, monkeypatch):
    """Sparse sets over lazy rows (one block, and split into several blocks) change no bit."""
    import kge.rows

    _, lazy = lazy_pair(seed)
    qs = structure_queries(seed, lazy.num_entities, lazy.num_relations)
    dense = Executor(lazy, **kw).scores(qs)
    sparse = Executor(lazy, sparse=True, **kw)
    sparse.sparse_dense_ratio = 0.0  # every projection that may stay sparse does
    assert torch.equal(sparse.scores(qs), dense)
    monkeypatch.setattr(kge.rows, "LAZY_MAX_PAIRS", 2)
    assert torch.equal(Executor(lazy, sparse=True, **kw).scores(qs), dense)


def test_one_route_one_op_call_per_block(monkeypatch):
    """Single-relation batches go through the one op (ops.project with a per-row rel) like mixed ones (the
    former names are gone: tests/test_ops_project.py::test_removed_aliases_name_their_replacement)."""
    art = random_artifact(5)
    calls = []
    real = ops.project

    def counting(*a, **k):
        calls.append(a[2].tolist())
        return real(*a, **k)

    monkeypatch.setattr(ops, "project", counting)
    ex = Executor(art)
    y = ex.scores([parse("(p r1 e3)"), parse("(p r1 e4)")])  # one relation: the degenerate case
    assert calls == [[1, 1]]
    y_ref = Executor(art).scores([parse("(p r1 e3)")])
    assert torch.equal(y[:1], y_ref)
    calls.clear()
    Executor(art, rows=ShardedRows(artifact=art)).scores([parse("(p r1 e3)"), parse("(p r2 e4)")])
    assert sorted(calls) == [[0], [1]]  # one call per shard, local relation ids (r1 in [1, 3], r2 in [0, 2, 4])


def test_executor_uses_public_ops_only():
    """No bypass of the ops wrapper (``ops._ops`` / private ops modules) in the executor."""
    from engine.exec import executor

    src = inspect.getsource(executor)
    assert "._ops." not in src and "from ops._" not in src and "import ops._" not in src


def test_rows_that_do_not_fit_the_artifact():
    art, other = random_artifact(6, n=10), random_artifact(6, n=11)
    with pytest.raises(UserError, match=r"rows: EagerRows has 11 entities and 4 relations; the artifact has 10"):
        Executor(art, rows=other.relation_rows())
