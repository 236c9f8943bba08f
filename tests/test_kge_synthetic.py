"""``experiments.synthetic_kg``: the synthetic Freebase-like KG generator and its CLI (small sizes: seconds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kge.graph import load_kg
from experiments.synthetic_kg import KINDS, SyntheticConfig, generate, main
from kgreason.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SMALL = SyntheticConfig(num_entities=3000, num_relations=60, num_edges=30_000, seed=0)


@pytest.fixture(scope="module")
def small():
    return generate(SMALL)


def keys(tr: np.ndarray, n: int) -> np.ndarray:
    return (tr[:, 1] * n + tr[:, 0]) * n + tr[:, 2]


# ------------------------------------------------------------------ determinism and counts
def test_same_seed_same_graph_other_seed_differs(small):
    again = generate(SMALL)
    assert np.array_equal(again.triples, small.triples)
    assert again.entities == small.entities and again.relations == small.relations
    other = generate(SyntheticConfig(num_entities=3000, num_relations=60, num_edges=30_000, seed=1))
    assert other.triples.shape == small.triples.shape
    assert not np.array_equal(other.triples, small.triples)


@pytest.mark.parametrize("n, r, e", [(3000, 60, 30_000), (500, 3, 2_000), (50, 25, 400), (3, 1, 6), (4, 2, 20)])
def test_exact_counts_no_duplicates_no_self_loops(n, r, e):
    kg = generate(SyntheticConfig(num_entities=n, num_relations=r, num_edges=e, seed=3))
    tr = kg.triples
    assert tr.shape == (e, 3) and tr.dtype == np.int64
    assert len(np.unique(keys(tr, n))) == e, "duplicate triples"
    assert not (tr[:, 0] == tr[:, 2]).any(), "self loops"
    assert len(kg.entities) == len(set(kg.entities)) == n
    assert len(kg.relations) == len(set(kg.relations)) == r
    assert len(np.unique(tr[:, [0, 2]])) == n, "every entity occurs"
    assert len(np.unique(tr[:, 1])) == r, "every relation occurs"
    assert kg.stats["edges"] == e and kg.stats["relations_with_inverses"] == 2 * r


def test_tiny_dense_request_gets_every_triple():
    kg = generate(SyntheticConfig(num_entities=3, num_relations=1, num_edges=6, seed=0))  # every possible triple
    assert sorted(map(tuple, kg.triples[:, [0, 2]].tolist())) == [(a, b) for a in range(3) for b in range(3) if a != b]
    # an N-1 relation holds at most 3 of them: the rest come from the fallback, which the stats count
    kg = generate(SyntheticConfig(num_entities=3, num_relations=1, num_edges=6, seed=0, kind_shares=(0, 0, 1, 0)))
    assert len(kg.triples) == 6 and kg.stats["fallback_edges"] == 3
    assert kg.stats["kinds_designed"] == {"1-1": 0, "1-N": 0, "N-1": 1, "N-N": 0}


# ------------------------------------------------------------------ structure
def test_relations_respect_domain_range_and_names(small):
    tr = small.triples
    assert small.stats["fallback_edges"] == 0
    assert np.array_equal(small.entity_type[tr[:, 0]], small.relation_domain[tr[:, 1]])
    assert np.array_equal(small.entity_type[tr[:, 2]], small.relation_range[tr[:, 1]])
    for e in range(0, small.num_entities, 97):
        assert small.entities[e].rsplit("_", 1)[0] == small.types[small.entity_type[e]]
    for r, name in enumerate(small.relations):
        assert name == f"{small.types[small.relation_domain[r]]}_r{r:04d}_{small.types[small.relation_range[r]]}"
        assert not name.endswith("^-1") and "\t" not in name and "|" not in name


def test_cardinality_classes_are_enforced(small):
    tr, n = small.triples, small.num_entities
    kind = small.relation_kind[tr[:, 1]]
    head_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("N-1")])
    tail_fun = np.isin(kind, [KINDS.index("1-1"), KINDS.index("1-N")])
    assert head_fun.any() and tail_fun.any()
    rh = tr[head_fun, 1] * n + tr[head_fun, 0]
    rt = tr[tail_fun, 1] * n + tr[tail_fun, 2]
    assert len(np.unique(rh)) == len(rh), "an N-1 / 1-1 head with two tails"
    assert len(np.unique(rt)) == len(rt), "a 1-N / 1-1 tail with two heads"
    designed = small.stats["kinds_designed"]
    assert designed["N-N"] > designed["1-1"] and designed["N-1"] > designed["1-1"]


def top3_share(tr: np.ndarray, cluster: np.ndarray) -> float:
    """Share of the edges that go to one of the 3 most used tail clusters of their (relation, head cluster)."""
    big = int(cluster.max()) + 1
    pair = (tr[:, 1] * big + cluster[tr[:, 0]]) * big + cluster[tr[:, 2]]
    pairs, counts = np.unique(pair, return_counts=True)
    group = pairs // big
    order = np.lexsort((-counts, group))
    g, c = group[order], counts[order]
    rank = np.arange(len(order)) - np.searchsorted(g, g)
    return float(c[rank < 3].sum() / len(tr))


def test_tail_cluster_is_predictable_from_head_cluster(small):
    """The learnable signal: in rule relations a head cluster's edges go to a few tail clusters, far
    more than when the heads are shuffled within each relation (same relation sizes and popularity)."""
    tr = small.triples[small.relation_role[small.triples[:, 1]] == 0]
    signal = top3_share(tr, small.entity_cluster)
    shuffled = tr.copy()
    rng = np.random.default_rng(0)
    for r in np.unique(tr[:, 1]).tolist():
        rows = np.flatnonzero(tr[:, 1] == r)
        shuffled[rows, 0] = tr[rng.permutation(rows), 0]
    baseline = top3_share(shuffled, small.entity_cluster)
    assert signal > 0.9 and signal > baseline + 0.2, (signal, baseline)


def test_compositions_and_aliases_follow_their_sources(small):
    tr, n = small.triples, small.num_entities
    have = set(keys(tr, n).tolist())
    comp = np.flatnonzero(small.relation_role == 1)
    alias = np.flatnonzero(small.relation_role == 2)
    assert len(comp) and len(alias)
    for r in comp.tolist():
        r1, r2 = small.relation_sources[r]
        e1, e2 = tr[tr[:, 1] == r1], tr[tr[:, 1] == r2]
        mids: dict[int, set] = {}
        for h, _, t in e1.tolist():
            mids.setdefault(h, set()).add(t)
        out2: dict[int, set] = {}
        for h, _, t in e2.tolist():
            out2.setdefault(h, set()).add(t)
        mine = tr[tr[:, 1] == r]
        paths = sum(any(t in out2.get(m, ()) for m in mids.get(h, ())) for h, _, t in mine.tolist())
        assert paths >= 0.9 * len(mine), (r, paths, len(mine))
    for r in alias.tolist():
        src = int(small.relation_sources[r, 0])
        mine = tr[tr[:, 1] == r]
        copied = sum(((src * n + h) * n + t) in have for h, _, t in mine.tolist())
        assert copied >= 0.9 * len(mine), (r, copied, len(mine))


def test_degrees_are_heavy_tailed():
    kg = generate(SyntheticConfig(num_entities=20_000, num_relations=100, num_edges=200_000, seed=0))
    d = kg.stats["degree"]
    assert d["max"] >= 50 * d["median"], d
    assert d["p99"] >= 5 * d["median"], d
    assert d["min"] >= 1
    assert 1.8 <= d["powerlaw"]["alpha"] <= 3.2, d["powerlaw"]
    deg = np.bincount(kg.triples[:, 0], minlength=20_000) + np.bincount(kg.triples[:, 2], minlength=20_000)
    assert deg.max() == d["max"] and float(np.median(deg)) == d["median"]


# ------------------------------------------------------------------ CLI and loading
def test_cli_file_loads_with_the_tsv_loader(tmp_path, capsys):
    out, stats = tmp_path / "syn.tsv", tmp_path / "syn.json"
    argv = ["--entities", "800", "--relations", "30", "--edges", "6000", "--seed", "5", "--out", str(out),
            "--stats-json", str(stats)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "800 entities" in printed and "30 relations (60 with inverses)" in printed and "6,000 edges" in printed
    kg = load_kg(out)
    assert kg.num_entities == 800 and kg.num_relations == 60 and len(kg.train) == 12_000
    assert kg.stats["duplicates_removed_train"] == 0
    s = json.loads(stats.read_text())
    assert (s["entities"], s["relations"], s["edges"], s["seed"]) == (800, 30, 6000, 5)
    assert len(s["relation_list"]) == 30 and s["degree"]["max"] >= s["degree"]["median"]
    lines = out.read_text().splitlines()
    assert len(lines) == 6000 and all(len(ln.split("\t")) == 3 for ln in lines[:100])
    assert not [p for p in tmp_path.iterdir() if ".part-" in p.name]
    # same arguments, same bytes
    first = out.read_bytes()
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().out == "" and out.read_bytes() == first


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, expected", [
    (["--entities", "1", "--relations", "1", "--edges", "5"], "--entities must be >= 2, got 1"),
    (["--entities", "10", "--relations", "0", "--edges", "50"], "--relations must be >= 1, got 0"),
    (["--entities", "10", "--relations", "2", "--edges", "0"], "--edges must be >= 1, got 0"),
    (["--entities", "10", "--relations", "2", "--edges", "11"], "--edges 11 is too small"),
    (["--entities", "3", "--relations", "1", "--edges", "7"], "--edges 7 exceeds the 6 possible triples"),
    (["--entities", "10000", "--relations", "1", "--edges", "60000000"], "more than half"),
    (["--entities", "100", "--relations", "5", "--edges", "500", "--types", "6"], "--types must be an integer in [1, 5]"),
    (["--entities", "100", "--relations", "5", "--edges", "500", "--types", "0"], "--types must be"),
    (["--entities", "100", "--relations", "5", "--edges", "500", "--seed", "-1"], "--seed must be in"),
    (["--entities", "ten", "--relations", "5", "--edges", "500"], "argument --entities: invalid int value: 'ten'"),
    (["--relations", "5", "--edges", "500"], "--entities"),
])
def test_cli_bad_arguments_are_one_line(tmp_path, capsys, args, expected):
    out = tmp_path / "o.tsv"
    assert main([*args, "--out", str(out)]) == 2
    assert expected in _one_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_outputs_are_one_line(tmp_path, capsys):
    ok = ["--entities", "20", "--relations", "2", "--edges", "60"]
    assert main([*ok, "--out", str(tmp_path / "missing" / "o.tsv")]) == 2
    assert "--out: folder" in _one_error(capsys)
    assert main([*ok, "--out", str(tmp_path)]) == 2
    assert "is a folder" in _one_error(capsys)
    same = tmp_path / "o.tsv"
    assert main([*ok, "--out", str(same), "--stats-json", str(same)]) == 2
    assert "--stats-json" in _one_error(capsys) and not same.exists()


def test_library_errors_name_the_field():
    with pytest.raises(UserError, match="num_entities must be an integer >= 2"):
        generate(SyntheticConfig(num_entities=1, num_relations=1, num_edges=1))
    with pytest.raises(UserError, match="num_edges 12 is too small"):
        generate(SyntheticConfig(num_entities=10, num_relations=3, num_edges=12))
    with pytest.raises(UserError, match=r"noise must be in \[0, 0.5\]"):
        generate(SyntheticConfig(num_entities=10, num_relations=3, num_edges=20, noise=2.0))


def test_module_entry_point_reports_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "experiments.synthetic_kg", "--entities", "5", "--relations", "1", "--edges",
                          "2", "--out", str(tmp_path / "o.tsv")], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--edges 2 is too small" in res.stderr
