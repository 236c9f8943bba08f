"""Lazy matrices (kge.lazy): rows computed on demand equal the eager build's, end to end.

Eager and lazy artifacts are built from the same embeddings (random ones: the
calibration does not care whether they were trained), so every comparison is
lazy vs eager at the same threshold: all 14 BetaE structures, both t-norms,
both negation modes, scores within 1e-6 and the same ranking, explanations
included.  Then the row cache under tiny budgets, the frontier limit, the
folder round trip, the build options and their errors.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.exec.executor import Executor
from engine.lang.structures import NEGATION_MODES, STRUCTURES
from kge import Artifact
from kge.build import BuildConfig, main as build_main, summarize
from kge.calibrate import calibrate, calibrated_rows_reference
from kge.lazy import LazyMatrices, RowCache, take_rows
from kgreason.errors import UserError

TNORMS = ("product", "godel")


# ------------------------------------------------------------------------------ helpers
def random_embeddings(rng: np.random.Generator, n: int, r: int, d: int = 8, scale: float = 0.8):
    """Complex (N, d) / (R, d) embeddings; ``scale`` sets how peaked the softmax rows are."""
    ent = (rng.normal(size=(n, d)) + 1j * rng.normal(size=(n, d))) * scale
    rel = rng.normal(size=(r, d)) + 1j * rng.normal(size=(r, d))
    return ent.astype(np.complex64), rel.astype(np.complex64)


def random_observed(rng: np.random.Generator, n: int, r: int, e: int) -> np.ndarray:
    return np.stack([rng.integers(0, n, e), rng.integers(0, r, e), rng.integers(0, n, e)], axis=1).astype(np.int64)


def artifact_pair(ent, rel, observed, *, threshold: float = 2e-3, row_cache_gb: float = 1.0, device: str = "cpu",
                  names: tuple[list[str], list[str]] | None = None) -> tuple[Artifact, Artifact]:
    """(eager, lazy) artifacts over the same embeddings, observed edges and threshold."""
    n, r = ent.shape[0], rel.shape[0]
    ents, rels = names or ([f"e{i}" for i in range(n)], [f"r{k}" for k in range(r)])
    common = dict(entities=ents, relations=rels, observed=observed, missing=np.zeros((0, 3), dtype=np.int64))
    mat, _ = calibrate(ent, rel, observed, threshold=threshold, progress=False, device=device)
    eager = Artifact(matrices=mat, embeddings={"entity": ent, "relation": rel}, **common)
    lazy = Artifact(matrices=LazyMatrices(entity=ent, relation=rel, observed=observed, threshold=threshold,
                                          row_cache_gb=row_cache_gb, device=device), **common)
    return eager, lazy


def structure_queries(rng: np.random.Generator, n: int, r: int, negation: str, per_structure: int = 4) -> list:
    out = []
    for st in STRUCTURES.values():
        for _ in range(per_structure):
            out.append(st.build(rng.integers(0, n, st.num_anchors).tolist(), rng.integers(0, r, st.num_relations).tolist(),
                                negation=negation))
    return out


def assert_same_answers(eager: Artifact, lazy: Artifact, queries, *, device: str = "cpu", **kw) -> None:
    ye = Executor(eager, device=device, **kw).scores(queries)
    yl = Executor(lazy, device=device, **kw).scores(queries)
    assert float((ye - yl).abs().max()) <= 1e-6
    # the same ranking: the order the executor ranks answers in (score desc, ties by id)
    oe = torch.sort(ye, dim=1, descending=True, stable=True).indices
    ol = torch.sort(yl, dim=1, descending=True, stable=True).indices
    assert torch.equal(oe, ol)


def lazy_rows_as_csr(lazy: LazyMatrices, keys):
    import scipy.sparse as sp

    indptr, cols, vals = lazy.rows(keys)
    return sp.csr_matrix((vals, cols, indptr), shape=(len(keys), lazy.num_entities))


# ------------------------------------------------------------------------------ rows
def assert_same_rows(got, want, device: str, threshold: float = 2e-3) -> None:
    """Lazy rows vs eager rows: bit for bit on the CPU; on CUDA within 1e-6, the support the same except entries
    at the threshold.  cuBLAS picks its GEMM kernel by shape, so a row computed in a chunk of another height
    can differ in its last bits (seen on an H200, 2026-11-28: 17 of 30 entries of a relation block)."""
    assert got.shape == want.shape
    if device == "cpu":
        assert (got != want).nnz == 0  # same function, same floats
        assert got.nnz == want.nnz
        return
    d = abs(got - want).tocoo()
    near_cut = (np.abs(got.toarray()[d.row, d.col] - threshold) < 1e-5) | (
        np.abs(want.toarray()[d.row, d.col] - threshold) < 1e-5)
    assert float(d.data[~near_cut].max(initial=0.0)) <= 1e-6


def test_lazy_rows_equal_eager_rows_and_formula(seed, device):
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(5, 40)), int(rng.integers(1, 6))
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, int(rng.integers(0, 4 * n)))
    eager, lazy = artifact_pair(ent, rel, obs, device=device)
    keys = rng.permutation(n * r)  # any order, each row once
    got = lazy_rows_as_csr(lazy.matrices, keys)
    assert_same_rows(got, eager.matrices[keys], device)
    ref = calibrated_rows_reference(ent, rel, obs, keys[:20], threshold=2e-3, delta=1e-4)
    diff = np.abs(ref - got[:20].toarray())
    diff[np.abs(ref - 2e-3) < 1e-3 * 2e-3] = 0.0  # an entry at the cut may fall either way in float32
    assert diff.max() < 1e-5
    for lo in range(0, n * r, max(1, n)):  # whole relations too
        rr = lo // n
        assert_same_rows(lazy.relation_block(rr), eager.relation_block(rr), device)


# ------------------------------------------------------------------------------ answers
@pytest.mark.parametrize("negation", NEGATION_MODES)
@pytest.mark.parametrize("tnorm", TNORMS)
def test_lazy_equals_eager_every_structure_random_kg(seed, tnorm, negation):
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(20, 70)), int(rng.integers(2, 7))
    ent, rel = random_embeddings(rng, n, r, scale=float(rng.uniform(0.4, 1.2)))
    obs = random_observed(rng, n, r, 5 * n)
    eager, lazy = artifact_pair(ent, rel, obs, threshold=float(rng.choice([2e-4, 2e-3, 1e-2])))
    queries = structure_queries(rng, n, r, negation)
    assert_same_answers(eager, lazy, queries, tnorm=tnorm)


@pytest.fixture(scope="module")
def umls_pair():
    """Eager and lazy artifacts on pykeen's UMLS triples (135 entities, 92 relations) at QTO's threshold."""
    from kge.graph import load_kg

    kg = load_kg("umls")
    rng = np.random.default_rng(11)
    ent, rel = random_embeddings(rng, kg.num_entities, kg.num_relations, d=16, scale=0.6)
    return artifact_pair(ent, rel, kg.train, threshold=2e-4, names=(list(kg.entities), list(kg.relations)))


@pytest.mark.parametrize("negation", NEGATION_MODES)
@pytest.mark.parametrize("tnorm", TNORMS)
def test_lazy_equals_eager_every_structure_umls(umls_pair, seed, tnorm, negation):
    eager, lazy = umls_pair
    rng = np.random.default_rng(seed)
    queries = structure_queries(rng, eager.num_entities, eager.num_relations, negation, per_structure=3)
    assert_same_answers(eager, lazy, queries, tnorm=tnorm)
    # explanations read single weights: lazy rows through the cache, the same numbers
    ae = Executor(eager, tnorm=tnorm).answer(queries[:14 * 3 : 3], k=3)
    al = Executor(lazy, tnorm=tnorm).answer(queries[:14 * 3 : 3], k=3)
    for re_, rl in zip(ae, al):
        assert [(a.id, a.score) for a in re_.answers] == [(a.id, a.score) for a in rl.answers]
        assert [a.explanation.lines() for a in re_.answers] == [a.explanation.lines() for a in rl.answers]


@pytest.mark.parametrize("max_pairs", [1, 3, 7])
def test_lazy_projection_split_into_bounded_calls_same_answers(seed, monkeypatch, max_pairs):
    """Batches whose active entries exceed the per-call bound are split (the OOM fix): same answers, argmax too."""
    import kge.rows

    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(20, 50)), int(rng.integers(2, 5))
    ent, rel = random_embeddings(rng, n, r, scale=0.5)
    obs = random_observed(rng, n, r, 4 * n)
    eager, lazy = artifact_pair(ent, rel, obs, threshold=2e-4, row_cache_gb=1e-12)
    calls = []
    real = kge.rows.LazyRows.blocks

    def counting(self, x, rels):
        calls.append(int((x > 0).sum()))
        for block in real(self, x, rels):
            # a block's rows hold at most max_pairs active entries, unless it is a single row
            rows = x if block.rows is None else x[block.rows]
            assert int((rows > 0).sum()) <= max_pairs or rows.shape[0] == 1
            yield block

    monkeypatch.setattr(kge.rows, "LAZY_MAX_PAIRS", max_pairs)
    monkeypatch.setattr(kge.rows.LazyRows, "blocks", counting)
    for negation in NEGATION_MODES:
        queries = structure_queries(rng, n, r, negation, per_structure=3)
        assert_same_answers(eager, lazy, queries)
        ae = Executor(eager).answer(queries[::5], k=3)
        al = Executor(lazy).answer(queries[::5], k=3)
        for re_, rl in zip(ae, al):
            assert [a.explanation.lines() for a in re_.answers] == [a.explanation.lines() for a in rl.answers]
    assert calls and max(calls) > max_pairs  # some batch needed splitting


# ------------------------------------------------------------------------------ cache
@pytest.mark.parametrize("budget_gb", [1e-12, 2e-6, 1.0])
def test_cache_eviction_under_tiny_budget_same_answers(seed, budget_gb):
    rng = np.random.default_rng(seed)
    n, r = 40, 4
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 150)
    eager, lazy = artifact_pair(ent, rel, obs, row_cache_gb=budget_gb)
    for negation in NEGATION_MODES:
        queries = structure_queries(rng, n, r, negation, per_structure=3)
        assert_same_answers(eager, lazy, queries)
        assert_same_answers(eager, lazy, queries)  # again: now partly (or wholly) from the cache
    lz = lazy.matrices
    assert lz.cache.bytes <= lz.cache.max_bytes
    if budget_gb < 1e-6:
        assert lz.cache.evictions > 0
    if budget_gb == 1e-12:  # one byte: nothing stays, everything is recomputed
        assert len(lz.cache) == 0 and lz.stats.cache_hits == 0
    if budget_gb == 1.0:
        assert lz.cache.evictions == 0 and lz.stats.cache_hits > 0


def _one_row(h: int, width: int, tick: int):
    from kge.lazy import _RowSet

    return _RowSet(np.array([h], np.int64), np.array([0, width], np.int64), np.arange(width, dtype=np.int32),
                   np.full(width, 0.5, np.float32), np.array([tick], np.int64))


def test_row_cache_evicts_least_recently_used_relations_by_bytes():
    one = RowCache.row_bytes(np.zeros(2, np.int32), np.zeros(2, np.float32))
    c = RowCache(max_bytes=4 * one)
    c.insert(0, _one_row(0, 2, c.next_tick()))
    c.insert(0, _one_row(1, 2, c.next_tick()))
    c.insert(1, _one_row(2, 2, c.next_tick()))
    c.insert(2, _one_row(3, 2, c.next_tick()))
    assert len(c) == 4 and c.bytes == 4 * one and c.evictions == 0
    rows, missing = c.lookup(0, np.array([0], np.int64), c.next_tick())  # relation 0 is now the most recent
    assert list(rows.heads) == [0] and len(missing) == 0
    c.insert(3, _one_row(4, 2, c.next_tick()))  # over budget: whole relations, least recent first (1, then 2)
    assert (0, 0) in c and (0, 1) in c and (3, 4) in c and (1, 2) not in c and (2, 3) not in c
    assert c.evictions == 2 and c.bytes == 3 * one <= c.max_bytes
    c.insert(4, _one_row(0, 1000, c.next_tick()))  # bigger than the budget: evicts all, itself too
    assert len(c) == 0 and c.bytes == 0


def test_take_rows_matches_a_python_gather(seed):
    rng = np.random.default_rng(seed)
    for rows in (0, 1, 7, 50):
        lens = rng.integers(0, 5, rows)
        indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        cols = rng.integers(0, 100, int(indptr[-1])).astype(np.int32)
        vals = rng.random(int(indptr[-1]), dtype=np.float32)
        idx = rng.integers(0, max(rows, 1), 12) if rows else np.zeros(0, np.int64)
        ptr, c, v = take_rows(indptr, cols, vals, idx)
        want = [(cols[indptr[i]:indptr[i + 1]], vals[indptr[i]:indptr[i + 1]]) for i in idx]
        assert ptr[0] == 0 and len(ptr) == len(idx) + 1 and c.dtype == np.int32 and v.dtype == np.float32
        for k, (wc, wv) in enumerate(want):
            assert np.array_equal(c[ptr[k]:ptr[k + 1]], wc) and np.array_equal(v[ptr[k]:ptr[k + 1]], wv)


# ------------------------------------------------------------------------------ frontier
def test_frontier_k(seed):
    rng = np.random.default_rng(seed)
    n, r = 60, 4
    ent, rel = random_embeddings(rng, n, r, scale=0.3)  # flat softmax rows: dense intermediate sets
    obs = random_observed(rng, n, r, 200)
    eager, lazy = artifact_pair(ent, rel, obs, threshold=2e-4)
    queries = [q for q in structure_queries(rng, n, r, "qto") if "(p" in str(q) or True]
    # None is exact, and so is any k >= N
    for k in (None, n, 10 * n):
        assert torch.equal(Executor(eager, frontier_k=k).scores(queries), Executor(eager).scores(queries))
    exact_rows = _rows_computed(lazy, queries, None)
    small_rows = _rows_computed(lazy, queries, 3)
    assert small_rows < exact_rows
    # lazy and eager agree under the same limit
    assert_same_answers(eager, lazy, queries, frontier_k=3)
    # and the limit changes answers here (it is an approximation), only through multi-hop inputs
    one_hop = [STRUCTURES["1p"].build([int(a)], [int(b)]) for a, b in zip(rng.integers(0, n, 5), rng.integers(0, r, 5))]
    assert torch.equal(Executor(eager, frontier_k=1).scores(one_hop), Executor(eager).scores(one_hop))


def _rows_computed(lazy: Artifact, queries, k) -> int:
    lz = LazyMatrices(entity=lazy.matrices.entity, relation=lazy.matrices.relation, observed=lazy.observed,
                      threshold=lazy.matrices.threshold, row_cache_gb=1.0)
    fresh = Artifact(entities=lazy.entities, relations=lazy.relations, matrices=lz, observed=lazy.observed,
                     missing=lazy.missing)
    Executor(fresh, frontier_k=k).scores(queries)
    return lz.stats.rows_computed


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_frontier_k_errors(bad):
    eager, _ = artifact_pair(*random_embeddings(np.random.default_rng(0), 5, 1), np.zeros((0, 3), np.int64))
    with pytest.raises(UserError, match=r"^frontier_k must be an integer >= 1 \(or None for exact\), got "):
        Executor(eager, frontier_k=bad)


# ------------------------------------------------------------------------------ folder, build, errors
def test_lazy_folder_round_trip(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n, r = 30, 4
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 100)
    eager, lazy = artifact_pair(ent, rel, obs, row_cache_gb=0.25)
    lazy.meta = {"source": "test"}
    lazy.save(tmp_path / "lazy")
    names = sorted(p.name for p in (tmp_path / "lazy").iterdir())
    assert "matrices.npz" not in names and "embeddings.npz" in names
    meta = json.loads((tmp_path / "lazy" / "meta.json").read_text())
    assert meta["matrices"] == "lazy" and meta["calibration"]["threshold"] == 2e-3 and "nnz" not in meta
    back = Artifact.load(tmp_path / "lazy", load_embeddings=False)  # lazy: embeddings load anyway
    assert back.is_lazy and back.matrices.row_cache_gb == 0.25 and back.matrices.threshold == 2e-3
    assert Artifact.load(tmp_path / "lazy", row_cache_gb=0.5).matrices.row_cache_gb == 0.5
    assert_same_answers(eager, back, structure_queries(rng, n, r, "qto", per_structure=2))
    # an eager artifact from a lazy one: the same matrices as the eager build's
    mat = back.materialize(progress=False)
    assert not mat.is_lazy and (mat.matrices != eager.matrices).nnz == 0
    mat.save(tmp_path / "eager")
    assert not Artifact.load(tmp_path / "eager").is_lazy
    assert "matrices      lazy" in summarize(back)
    with pytest.raises(UserError, match="lazy matrices have no stored entries"):
        back.nnz_per_relation()
    # the engine's front doors and engine.paths take it as they take an eager one
    from engine.exec.api import Engine
    from engine.paths.graph import PathGraph

    assert Engine.load(tmp_path / "lazy").artifact.is_lazy
    assert PathGraph.from_artifact(back) is not None


def test_lazy_folder_missing_embeddings_is_one_line_error(tmp_path):
    _, lazy = artifact_pair(*random_embeddings(np.random.default_rng(0), 6, 2), np.zeros((0, 3), np.int64))
    lazy.save(tmp_path / "a")
    (tmp_path / "a" / "embeddings.npz").unlink()
    for verify in (True, False):
        with pytest.raises(UserError) as exc:
            Artifact.load(tmp_path / "a", verify=verify)
        msg = str(exc.value)
        assert "\n" not in msg and "lazy matrices need 'embeddings.npz'" in msg


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf")])
def test_bad_row_cache_budgets(bad, tmp_path, capsys):
    with pytest.raises(UserError, match=r"^--row-cache-gb must be a finite number of GiB > 0, got "):
        BuildConfig(kg="umls", out=str(tmp_path / "x"), row_cache_gb=bad)
    assert build_main(["--kg", "umls", "--out", str(tmp_path / "x"), "--row-cache-gb", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --row-cache-gb must be a finite number of GiB > 0, got {bad}") and err.count("\n") == 1
    ent, rel = random_embeddings(np.random.default_rng(0), 4, 1)
    with pytest.raises(UserError, match="--row-cache-gb"):
        LazyMatrices(entity=ent, relation=rel, observed=np.zeros((0, 3), np.int64), row_cache_gb=bad)
    with pytest.raises(UserError, match="^row_cache_gb must be"):
        Artifact.load(tmp_path / "nowhere", row_cache_gb=bad)
    from engine.evaluate import main as evaluate_main

    assert evaluate_main(["--artifact", str(tmp_path), "--queries", "q.jsonl", "--row-cache-gb", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: --row-cache-gb must be a finite number of GiB > 0")


def test_bad_matrices_option(tmp_path, capsys):
    assert build_main(["--kg", "umls", "--out", str(tmp_path / "x"), "--matrices", "sometimes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --matrices: invalid choice: 'sometimes'") and err.count("\n") == 1
    with pytest.raises(UserError, match=r"^--matrices must be one of eager, lazy, auto, got 'sometimes'"):
        BuildConfig(kg="umls", out=str(tmp_path / "x"), matrices="sometimes")


def test_build_cli_lazy_auto_and_eager_from_lazy_embeddings(tmp_path):
    """No training: random embeddings in an .npz stand in for a trained model (--embeddings)."""
    from kge.graph import load_kg

    kg = load_kg("umls")
    ent, rel = random_embeddings(np.random.default_rng(5), kg.num_entities, kg.num_relations, d=8, scale=0.05)
    npz = tmp_path / "emb.npz"
    np.savez(npz, entity=ent, relation=rel)
    common = ["--kg", "umls", "--eval-max-triples", "0", "--quiet"]
    assert build_main([*common, "--out", str(tmp_path / "lazy"), "--embeddings", str(npz), "--matrices", "lazy",
                       "--row-cache-gb", "0.125"]) == 0
    lazy = Artifact.load(tmp_path / "lazy")
    assert lazy.is_lazy and lazy.matrices.threshold == 2e-4 and lazy.matrices.row_cache_gb == 0.125
    assert "calibrate" not in lazy.meta["timings_s"]
    # nearly flat softmax rows: every entry survives 2e-4, ~13 MB eager > 1 MiB, so auto is lazy (threshold kept)
    # for a few expected queries (the default 14,000 would raise the threshold instead: tests/test_kge_build.py)
    assert build_main([*common, "--out", str(tmp_path / "auto"), "--embeddings", str(tmp_path / "lazy"),
                       "--matrices", "auto", "--max-matrix-gb", str(2.0**-10), "--expected-queries", "10"]) == 0
    auto = Artifact.load(tmp_path / "auto")
    assert auto.is_lazy and auto.matrices.threshold == 2e-4
    assert "lazy" in auto.meta["calibration"]["nnz_estimate"]["message"]
    assert build_main([*common, "--out", str(tmp_path / "auto-eager"), "--embeddings", str(tmp_path / "lazy"),
                       "--matrices", "auto"]) == 0
    assert not Artifact.load(tmp_path / "auto-eager").is_lazy
    # an eager artifact from the lazy one's embeddings equals its materialized rows
    assert build_main([*common, "--out", str(tmp_path / "eager"), "--embeddings", str(tmp_path / "lazy")]) == 0
    eager = Artifact.load(tmp_path / "eager")
    assert eager.meta["calibration"]["threshold"] == 2e-4
    assert (eager.matrices != lazy.materialize(progress=False).matrices).nnz == 0
    rng = np.random.default_rng(0)
    assert_same_answers(eager, lazy, structure_queries(rng, kg.num_entities, kg.num_relations, "qto", 1))


# ------------------------------------------------------------------------------ devices
def test_lazy_equals_eager_on_device(device, seed):
    """The row computation is one GEMM path with a device parameter: on CUDA too."""
    rng = np.random.default_rng(seed)
    n, r = 50, 4
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 120)
    eager, lazy = artifact_pair(ent, rel, obs, device=device)
    assert lazy.matrices.device.startswith(device)
    for negation in NEGATION_MODES:
        assert_same_answers(eager, lazy, structure_queries(rng, n, r, negation, per_structure=2), device=device)
    # a CPU-loaded lazy artifact computes on the executor's device (a twin sharing the cache)
    cpu_lazy = Artifact(entities=lazy.entities, relations=lazy.relations, observed=obs, missing=lazy.missing,
                        matrices=LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3))
    ex = Executor(cpu_lazy, device=device)
    assert ex.rows.matrices.device.startswith(device) and ex.rows.matrices.cache is cpu_lazy.matrices.cache


# ------------------------------------------------------------------------------ persisted rows
_SECOND_PROCESS = """
import json, sys
import numpy as np
from kge.lazy import LazyMatrices
d = np.load(sys.argv[1])
m = LazyMatrices(entity=d["ent"], relation=d["rel"], observed=d["obs"], threshold=2e-3, row_store_gb=1.0)
ptr, cols, vals = m.rows(d["keys"])
np.savez(sys.argv[2], ptr=ptr, cols=cols, vals=vals)
print(json.dumps(m.stats.as_dict()))
"""


def test_a_second_process_reads_the_persisted_rows(tmp_path, seed, monkeypatch):
    """Rows computed by one process are read, not computed, by the next (same bits); 0 GiB writes nothing."""
    import subprocess
    import sys

    from kgreason.files import user_cache_dir

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))  # no rows of other tests' embeddings

    rng = np.random.default_rng(seed)
    n, r = 30, 3
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 60)
    keys = rng.choice(n * r, 25, replace=False)
    off = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=0)
    off.rows(keys)
    assert not (user_cache_dir() / "rows").exists()  # 0: off, no folder
    first = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=1.0)
    want = first.rows(keys)
    assert first.stats.rows_computed == 25 and first.stats.disk_hits == 0
    first._store().flush()  # the background writes, as the interpreter's exit would
    np.savez(tmp_path / "in.npz", ent=ent, rel=rel, obs=obs, keys=keys)
    out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=120, check=True)
    stats = json.loads(out.stdout)
    assert stats["rows_computed"] == 0 and stats["disk_hits"] == 25
    got = np.load(tmp_path / "out.npz")
    for a, b in zip(want, (got["ptr"], got["cols"], got["vals"])):
        assert np.array_equal(a, b)
    # a third object: part from disk, part computed, in the order asked
    more = np.concatenate([keys[::2], np.setdiff1d(np.arange(n * r), keys)[:7]])[::-1]
    third = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=1.0)
    ptr, cols, vals = third.rows(more)
    assert third.stats.disk_hits == len(keys[::2]) and third.stats.rows_computed == 7
    ref = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=0).rows(more)
    for a, b in zip(ref, (ptr, cols, vals)):
        assert np.array_equal(a, b)
    # other rows (another threshold) never read these
    other = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=3e-3, row_store_gb=1.0)
    other.rows(keys)
    assert other.stats.disk_hits == 0 and other.stats.rows_computed == 25


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "x"])
def test_bad_row_store_budgets(bad, tmp_path, capsys):
    from engine.evaluate import main as evaluate_main

    ent, rel = random_embeddings(np.random.default_rng(0), 5, 1)
    with pytest.raises(UserError, match="^row_store_gb must be"):
        LazyMatrices(entity=ent, relation=rel, observed=np.zeros((0, 3), np.int64), row_store_gb=bad)
    with pytest.raises(UserError, match="^row_store_gb must be"):
        Artifact.load(tmp_path / "nowhere", row_store_gb=bad)
    if not isinstance(bad, (bool, str)):
        assert evaluate_main(["--artifact", str(tmp_path), "--queries", str(tmp_path / "q.jsonl"),
                              "--row-store-gb", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --row-store-gb must be") and "\n" not in err


# ------------------------------------------------------------------------------ per-relation row sets
@pytest.mark.parametrize("budget_gb", [1e-12, 3e-6, 1.0])
def test_stacks_hold_the_eager_rows_over_random_requests(seed, budget_gb):
    """Random request sequences (repeats, overlaps, several relations, tiny to ample budgets): every stack
    holds exactly the eager row of every head asked; a warm repeat is the prepared set itself."""
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(15, 40)), int(rng.integers(1, 4))
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 3 * n)
    eager, _ = calibrate(ent, rel, obs, threshold=2e-3, delta=1e-4, progress=False)
    m = LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_cache_gb=budget_gb, row_store_gb=0)
    for _ in range(12):
        wanted = [(int(rr), np.unique(rng.integers(0, n, int(rng.integers(0, n))))) for rr in
                  np.unique(rng.integers(0, r, int(rng.integers(1, r + 1))))]
        # heads as ids or as an (N,) bool mask (what LazyRows passes for a dense batch), at random
        asked = [(rr, _mask(heads, n) if rng.random() < 0.5 else heads) for rr, heads in wanted]
        for (rr, heads), st in zip(wanted, m.stacks(asked, "cpu")):
            assert st.num_relations == 1 and st.n == n
            for h in heads.tolist():
                lo, hi = int(st.crow[h]), int(st.crow[h + 1])
                g = rr * n + h
                assert st.col[lo:hi].tolist() == eager.indices[eager.indptr[g]:eager.indptr[g + 1]].tolist()
                assert np.array_equal(st.val[lo:hi].numpy(), eager.data[eager.indptr[g]:eager.indptr[g + 1]])
        assert m.cache.bytes <= m.cache.max_bytes
        sets = list(m.cache._main.values()) + list(m.cache._pending.values())
        assert m.cache.bytes == sum(s.nbytes for s in sets)  # the count follows every merge, eviction, stack
    if budget_gb == 1.0:
        # a prepared set's two row-pointer arrays, its membership mask and entity pointers count (25 MB per relation
        # at a million entities)
        before = m.cache.bytes
        m.stacks([(0, np.arange(n))], "cpu")
        m.stacks([(0, np.arange(n))], "cpu")
        main = m.cache.main(0)
        assert main is not None and main.ptr_bytes == 16 * (n + 1) + n + 8 * (n + 1) and m.cache.bytes >= before
        heads = np.arange(n)
        m.stacks([(0, heads)], "cpu")  # computes what is missing (the new rows may wait in the pending set)
        computed = m.stats.rows_computed
        first = m.stacks([(0, heads)], "cpu")[0]  # asked again: pending rows are merged, the set prepared
        assert m.stacks([(0, heads)], "cpu")[0] is first and m.stacks([(0, heads[::3])], "cpu")[0] is first
        assert m.stacks([(0, _mask(heads[::2], n))], "cpu")[0] is first
        assert m.stats.rows_computed == computed


def _mask(heads: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[heads] = True
    return out


# ------------------------------------------------------------------------------ one-hot (anchor) projections
def _records(ex: Executor, queries) -> dict:
    """Every node's (values, witnesses) of one batch, keyed by path (explaining keeps the argmax)."""
    from engine.lang.query import resolve

    roots = [resolve(q, ex.artifact) for q in queries]
    _, run = ex._run_batch(roots, list(range(len(roots))), want_arg=True, record=True, trace_values=False)
    return run.record


@pytest.mark.parametrize("negation", NEGATION_MODES)
@pytest.mark.parametrize("slice_rows", [0, 256])
def test_anchor_projections_from_cached_rows_equal_the_kernel(seed, monkeypatch, slice_rows, negation):
    """Lazy anchor projections are one gather of cached rows (LazyRows.one_hot_rows), not a kernel call per
    relation: values AND witnesses of every node equal the eager kernel's bit for bit, cold, warm, with rows
    still pending in the cache, and in sparse runs (both gather branches: per-row slices and per-relation)."""
    import kge.lazy as lazy_mod

    monkeypatch.setattr(lazy_mod, "_SLICE_ROWS", slice_rows)
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(20, 60)), int(rng.integers(2, 7))
    ent, rel = random_embeddings(rng, n, r, scale=float(rng.uniform(0.4, 1.2)))
    eager, lazy = artifact_pair(ent, rel, random_observed(rng, n, r, 4 * n), threshold=float(rng.choice([2e-3, 1e-2])))
    scale = float(rng.choice([0.5, 3.0, 40.0]))  # 40: many factors are exactly 0
    ee, el = Executor(eager, neg_scale=scale), Executor(lazy, neg_scale=scale)
    structures = [STRUCTURES[s] for s in ("1p", "2p", "2i", "pi", "up", "2in", "3in", "pni", "pin", "inp")]
    for round_ in range(4):  # cold, then warm, then new heads of cached relations (pending), then warm again
        batch = []
        for st in structures:
            same = [st.build(rng.integers(0, n, st.num_anchors).tolist(), rng.integers(0, r, st.num_relations).tolist(),
                             negation=negation) for _ in range(int(rng.integers(1, 6)))]
            batch += same
            got_all = _records(el, same)
            for path, want in _records(ee, same).items():
                got = got_all[path]
                assert torch.equal(got.values, want.values), (round_, path)
                assert (got.argmax is None) == (want.argmax is None)
                if want.argmax is not None:
                    assert torch.equal(got.argmax, want.argmax), (round_, path)
        assert torch.equal(Executor(lazy, sparse=True, neg_scale=scale).scores(batch), ee.scores(batch))
    assert lazy.matrices.stats.cache_hits > 0


def _twin_matrices(rng: np.random.Generator, n: int, r: int) -> tuple[LazyMatrices, LazyMatrices]:
    """Two LazyMatrices over the same random embeddings and edges (one to warm, one to compute cold)."""
    ent, rel = random_embeddings(rng, n, r)
    obs = random_observed(rng, n, r, 3 * n)
    return tuple(LazyMatrices(entity=ent, relation=rel, observed=obs, threshold=2e-3, row_store_gb=0)
                 for _ in range(2))  # type: ignore[return-value]


def test_warm_row_slices_build_no_index(seed):
    """A warm read of a few rows (an anchor hop) finds each by a binary search of its relation's cached heads:
    the set's O(N) index (member mask, entity pointers) is not built for it (on FB15k-237 that cost a single
    query's first reuse of its rows 60-160 us), and once a prepared stack has built it, the same rows come
    from it; both equal the computed rows."""
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(10, 40)), int(rng.integers(2, 6))
    m, cold = _twin_matrices(rng, n, r)
    heads = np.sort(rng.choice(n, size=int(rng.integers(2, n)), replace=False))
    m.rows(1 * n + heads)  # relation 1's first rows: its merged set
    main = m.cache.main(1)
    assert main is not None and main.member is None
    for size in (1, 3, len(heads)):
        keys = 1 * n + rng.choice(heads, size=size)
        computed = m.stats.rows_computed
        got = m.rows(keys)
        assert m.stats.rows_computed == computed and main.member is None and main.entity_ptr is None
        for a, b in zip(got, cold.rows(keys)):
            assert np.array_equal(a, b)
    m.stacks([(1, heads)], "cpu")  # a prepared stack builds the index; slices then read it
    assert main.member is not None
    keys = 1 * n + rng.choice(heads, size=3)
    for a, b in zip(m.rows(keys), cold.rows(keys)):
        assert np.array_equal(a, b)
    missing = np.setdiff1d(np.arange(n), heads)[:1]
    keys = np.concatenate([1 * n + heads[:2], 1 * n + missing])  # a head not cached: computed, not misread
    for a, b in zip(m.rows(keys), cold.rows(keys)):
        assert np.array_equal(a, b)


def test_rows_out_of_range_raise_cold_and_warm(seed):
    """Keys outside [0, R*N) raise IndexError whether or not the rows in range are cached (the warm path
    runs before the range check, and must never serve one)."""
    rng = np.random.default_rng(seed)
    n, r = 12, 3
    ent, rel = random_embeddings(rng, n, r)
    m = LazyMatrices(entity=ent, relation=rel, observed=random_observed(rng, n, r, 30), threshold=2e-3,
                     row_store_gb=0)
    m.rows(np.arange(n * r))
    m.rows(np.arange(n * r))  # every row merged and cached
    for bad in ([-1], [n * r], [0, -n], [5, n * r + 3], list(range(n * r)) * 8 + [n * r]):
        with pytest.raises(IndexError, match=r"row key out of range \[0, 36\)"):
            m.rows(bad)


def test_lazy_anchor_one_hot_built_only_when_read(seed, monkeypatch):
    """Lazy anchor hops are gathered from cached rows; the anchors' (B, N) one-hot is then built only where
    something reads it (the witness record of answer(), kept trace values, a projection hook's inputs): scores,
    traces and answers equal the eager executor's, which builds it for its kernel."""
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(20, 50)), int(rng.integers(2, 6))
    ent, rel = random_embeddings(rng, n, r)
    eager, lazy = artifact_pair(ent, rel, random_observed(rng, n, r, 3 * n))
    queries = structure_queries(rng, n, r, "qto", per_structure=2)
    built = []
    one_hot = Executor._one_hot
    monkeypatch.setattr(Executor, "_one_hot", lambda self, ents: built.append(len(ents)) or one_hot(self, ents))
    ee, el = Executor(eager), Executor(lazy)
    for sparse in (False, True):
        ye, te = Executor(eager, sparse=sparse).scores(queries, trace=True)
        del built[:]
        yl, tl = Executor(lazy, sparse=sparse).scores(queries, trace=True)
        assert not built
        assert torch.equal(ye, yl)
        assert [t.to_json() for t in te] == [t.to_json() for t in tl]
    ye, te = ee.scores(queries, trace=True, trace_values=True)
    yl, tl = el.scores(queries, trace=True, trace_values=True)
    assert built and torch.equal(ye, yl)
    for a, b in zip(te, tl):
        assert [(x.path, x.op, x.entity) for x in a.nodes] == [(x.path, x.op, x.entity) for x in b.nodes]
        assert all(torch.equal(x.values, y.values) for x, y in zip(a.nodes, b.nodes))
    assert [x.to_json() for x in ee.answer(queries, k=5)] == [x.to_json() for x in el.answer(queries, k=5)]
    seen = {}

    def hook(ctx, value):  # a projection hook reads its inputs: the anchors' one-hot, as the eager run builds it
        seen.setdefault(ctx.executor.artifact is lazy, []).append([v.values.clone() for v in ctx.inputs])

    for ex in (ee, el):
        ex.add_hook(hook, ops=["p"])
        ex.scores(queries)
    assert len(seen[True]) == len(seen[False])
    for a, b in zip(seen[True], seen[False]):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_warm_rows_gather_equals_the_rows_computed(seed):
    """LazyMatrices.rows served from the merged cached sets (the warm path) returns the rows asked, in the
    order asked, repeats included, equal to a cold computation; a row missing from them falls back."""
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(10, 40)), int(rng.integers(1, 6))
    warm, cold = _twin_matrices(rng, n, r)
    cached = rng.choice(n * r, size=int(rng.integers(1, n * r + 1)), replace=False)
    warm.rows(cached)
    warm.rows(cached)  # rows left pending by the first call are merged
    for size in (1, 2, 5, 40, 300):
        keys = rng.choice(cached, size=size)  # repeats included
        before = warm.stats.rows_computed
        slow = warm._row_sets
        warm._row_sets = None  # type: ignore[assignment]  # the warm path must not look rows up
        try:
            got = warm.rows(keys)
        finally:
            warm._row_sets = slow  # type: ignore[method-assign]
        assert warm.stats.rows_computed == before
        want = cold.rows(keys)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)
    outside = np.setdiff1d(np.arange(n * r), cached)
    if len(outside):
        keys = np.concatenate([cached[:3], outside[:1]])
        for a, b in zip(warm.rows(keys), cold.rows(keys)):
            assert np.array_equal(a, b)
