"""experiments.metaqa_lgot: tie-aware Hits@k, and the whole run on a tiny MetaQA-format folder."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

from kge.artifact import Artifact
from kge.graph import drop_edges, load_kg
from experiments.metaqa_lgot import hits_at_k, main
from test_metaqa import KB, _questions, _write


def _hits_by_permutations(scores, gold, k) -> float:
    """Reference: the fraction of tie orders (every permutation of equal scores) with a gold id in the top k."""
    n = len(scores)
    groups = sorted({float(s) for s in scores}, reverse=True)
    blocks = [[i for i in range(n) if scores[i] == v] for v in groups]
    total = hit = 0
    for perm in itertools.product(*[list(itertools.permutations(b)) for b in blocks]):
        order = [i for block in perm for i in block]
        total += 1
        hit += any(i in gold for i in order[:k])
    return hit / total


def test_hits_at_k_equals_the_average_over_tie_orders():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(1, 7))
        scores = rng.choice([0.0, 0.25, 0.5, 1.0], size=n).astype(np.float32)
        gold = sorted(set(rng.integers(0, n, size=int(rng.integers(1, 3))).tolist()))
        for k in (1, 2, 3, 10):
            assert hits_at_k(scores, gold, k) == pytest.approx(_hits_by_permutations(scores, gold, k)), (scores, gold, k)


def test_hits_at_k_large_ties_match_the_binomial_formula():
    scores = np.zeros(1000, np.float32)
    scores[:3] = 1.0
    gold = [10, 11]
    # top 10 = the 3 ones + 7 of 997 zeros; P(no gold drawn) = C(995, 7) / C(997, 7)
    assert hits_at_k(scores, gold, 10) == pytest.approx(1 - math.comb(995, 7) / math.comb(997, 7))
    assert hits_at_k(scores, [1], 1) == pytest.approx(1 / 3)
    assert hits_at_k(scores, [], 1) == 0.0


def _tiny_artifact(folder, out):
    kg = drop_edges(load_kg(folder), 0.5, seed=0)
    n, r = kg.num_entities, kg.num_relations
    obs = kg.train
    m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(r * n, n))
    m.sum_duplicates()
    m.sort_indices()
    Artifact(entities=list(kg.entities), relations=list(kg.relations), matrices=m, observed=obs, missing=kg.dropped,
             meta={"source": str(folder), "build_config": {"drop_edges": 0.5}}).save(out)
    return out


def test_experiment_end_to_end_on_a_tiny_metaqa(tmp_path, capsys):
    _write(tmp_path / "mqa", KB, _questions(KB))
    art = _tiny_artifact(tmp_path / "mqa", tmp_path / "art")
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--artifact", str(art), "--metaqa", str(tmp_path / "mqa"), "--out", str(out), "--per-hop", "15",
            "--quality", "1/0", "0.5/0.2", "--cache", str(tmp_path / "cache.sqlite"), "--quiet"]
    assert main(argv) == 0
    rec = json.loads((out / "metaqa.json").read_text())
    assert (out / "metaqa.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "metaqa.md").read_text()
    assert "LGOT − KG-only" in md and "QTO (paper)" in md
    kg = rec["kg_only"]["hops"]
    perfect = next(r for r in rec["runs"] if r["method"] == "lgot" and r["recall"] == 1)
    for h in ("1p", "2p", "3p"):
        # a perfect LLM knows the whole KB: LGOT can only add what the KG lost
        assert perfect["hops"][h]["hits@10"] >= kg[h]["hits@10"]
        assert perfect["minus_kg_only"][h]["hits@1"] == pytest.approx(perfect["hops"][h]["hits@1"] - kg[h]["hits@1"])
    assert sum(r["hook"]["nested"] for r in rec["runs"]) > 0  # empty hops were asked
    ei = rec["kg_only"]["empty_inputs"]
    assert ei["1p"]["empty_input_hops"] == 0  # an anchor is never empty
    assert ei["3p"]["projection_hops"] == 3 * rec["questions"]["counts"]["3p"]
    assert 0 < ei["3p"]["empty_input_hops"] and "Projection hops whose input the KG alone leaves empty" in md
    # a rerun replays every answer from the cache and gives the same numbers
    assert main(argv + ["--overwrite"]) == 0
    again = json.loads((out / "metaqa.json").read_text())
    assert [r["hops"] for r in again["runs"]] == [r["hops"] for r in rec["runs"]]
    assert all(r["client"]["requests"] == 0 for r in again["runs"])
    # outputs are not replaced without --overwrite; flags are checked before any work
    assert main(argv) == 2
    assert "exists (pass --overwrite" in capsys.readouterr().err
    assert main(argv[:-1] + ["--quality", "0.5/1"]) == 2
    assert main(argv + ["--noise", "inf", "--overwrite"]) == 2
    assert main(argv + ["--input-ratio", "1.5", "--overwrite"]) == 2
    assert "--input-ratio" in capsys.readouterr().err
    assert rec["settings"]["input_ratio"] == 0.3 and "input ratio 0.3" in md
