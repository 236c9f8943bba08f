"""BetaE query pickles: restricted unpickling, conversion, recomputed easy/hard answers, id checks."""
from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest

from engine.eval.betae import load_betae_queries, read_betae_folder, safe_load_pickle
from engine.eval.betae import check_betae_ids
from engine.lang.structures import STRUCTURES
from engine.eval.symbolic import Graph, answers
from kgreason.errors import UserError


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_refuses_malicious_pickle(tmp_path):
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps({("e", ("r",)): {_Evil()}}))
    with pytest.raises(UserError) as info:
        safe_load_pickle(p)
    msg = str(info.value)
    assert "system" in msg and "not allowed" in msg and "\n" not in msg
    p.write_bytes(pickle.dumps(collections.OrderedDict, protocol=2)[:5])  # truncated
    with pytest.raises(UserError):
        safe_load_pickle(p)
    with pytest.raises(UserError, match="does not exist"):
        safe_load_pickle(tmp_path / "missing.pkl")


def write_folder(path, rng, n=40, r=6, edges=160):
    """A BetaE-style folder: id triples with inverses (relation 2k+1 inverts 2k), split train/valid/test."""
    path.mkdir()
    h, b, t = rng.integers(n, size=edges), rng.integers(r // 2, size=edges), rng.integers(n, size=edges)
    fwd = np.unique(np.stack([h, 2 * b, t], 1), axis=0)
    split = rng.choice(3, size=len(fwd), p=[0.7, 0.15, 0.15])
    parts = {}
    for k, name in enumerate(("train", "valid", "test")):
        x = fwd[split == k]
        parts[name] = np.concatenate([x, np.stack([x[:, 2], x[:, 1] + 1, x[:, 0]], 1)])
        np.savetxt(path / f"{name}.txt", parts[name], fmt="%d", delimiter="\t")
    (path / "stats.txt").write_text(f"numentity: {n}\nnumrelations: {r}\n")
    return parts, n, r


def fill(s, rng, n, r):
    """A random BetaE query tuple of structure tuple ``s``."""
    if s == "e":
        return int(rng.integers(n))
    if s == "r":
        return int(rng.integers(r))
    if s == "n":
        return -2
    if s == "u":
        return -1
    return tuple(fill(x, rng, n, r) for x in s)


@pytest.mark.parametrize("negation", ["qto", "complement"])
def test_pickle_round_trip_and_answers(tmp_path, negation):
    rng = np.random.default_rng(11)
    parts, n, r = write_folder(tmp_path / "kg", rng)
    data = collections.defaultdict(set)
    for st in STRUCTURES.values():
        for _ in range(8):
            data[st.betae].add(fill(st.betae, rng, n, r))
    # BetaE's De Morgan forms of 2u/up, as its generator writes them
    dm_2u = ((("e", ("r", "n")), ("e", ("r", "n"))), ("n",))
    dm_up = ((("e", ("r", "n")), ("e", ("r", "n"))), ("n", "r"))
    for s in (dm_2u, dm_up):
        data[s].add(fill(s, rng, n, r))
    pkl = tmp_path / "test-queries.pkl"
    pkl.write_bytes(pickle.dumps(data))
    timings = {}
    qs = load_betae_queries(pkl, tmp_path / "kg", negation=negation, progress=False, timings=timings)
    assert set(timings) == {"load_s", "convert_s", "answers_s"}
    counts = collections.Counter(q.structure for q in qs)
    assert counts == {**{s: len(data[st.betae]) for s, st in STRUCTURES.items()}, "2u-DM": 1, "up-DM": 1}
    tv = Graph.from_triples(parts["train"], parts["valid"], num_entities=n, num_relations=r)
    full = Graph.from_triples(parts["train"], parts["valid"], parts["test"], num_entities=n, num_relations=r)
    nodes = [q.node for q in qs]
    for q, e, a in zip(qs, answers(nodes, tv), answers(nodes, full)):
        assert q.easy.tolist() == e.tolist()
        assert q.hard.tolist() == sorted(set(a.tolist()) - set(e.tolist()))
    # the converted AST is the structure's own build with the tuple's ids
    q2u = [q for q in qs if q.structure == "2u"]
    assert all(type(q.node).__name__ == "Union" for q in q2u)
    # DM forms have the same answers as the DNF ones with the same ids
    (dm,) = [q for q in qs if q.structure == "2u-DM"]
    (t,) = data[dm_2u]
    dnf = STRUCTURES["2u"].build([t[0][0][0], t[0][1][0]], [t[0][0][1][0], t[0][1][1][0]])
    assert answers([dnf], full)[0].tolist() == sorted(set(dm.easy.tolist()) | set(dm.hard.tolist()))
    only = load_betae_queries(pkl, tmp_path / "kg", structures=["2in"], progress=False)
    assert {q.structure for q in only} == {"2in"}
    with pytest.raises(UserError, match="no queries of structure"):
        load_betae_queries(pkl, tmp_path / "kg", structures=["3x"], progress=False)


def test_bad_pickles_and_folders(tmp_path):
    rng = np.random.default_rng(0)
    write_folder(tmp_path / "kg", rng, n=10)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({("e", ("r", "x")): {(1, (2, 3))}}))
    with pytest.raises(UserError, match="unknown"):
        load_betae_queries(bad, tmp_path / "kg", progress=False)
    bad.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(UserError, match="expected a dict"):
        load_betae_queries(bad, tmp_path / "kg", progress=False)
    bad.write_bytes(pickle.dumps({("e", ("r",)): {(999, (0,))}}))
    with pytest.raises(UserError, match="do not fit"):
        load_betae_queries(bad, tmp_path / "kg", progress=False)
    with pytest.raises(UserError, match="does not exist"):
        read_betae_folder(tmp_path / "nope")


def test_check_betae_ids(tmp_path):
    from test_engine_eval_sampling import kg_artifact

    rng = np.random.default_rng(1)
    art = kg_artifact(seed=2, n=40)
    folder_path = tmp_path / "kg"
    folder_path.mkdir()
    for name, x in (("train", art.observed), ("valid", art.missing[:0]), ("test", art.missing)):
        np.savetxt(folder_path / f"{name}.txt", x, fmt="%d", delimiter="\t")
    (folder_path / "stats.txt").write_text(f"numentity: {art.num_entities}\nnumrelations: {art.num_relations}\n")
    folder = read_betae_folder(folder_path)
    assert check_betae_ids(art, folder) == 1.0
    perm = rng.permutation(art.num_entities)
    art.observed = np.stack([perm[art.observed[:, 0]], art.observed[:, 1], perm[art.observed[:, 2]]], 1)
    with pytest.raises(UserError, match="not the folder's ids"):
        check_betae_ids(art, folder)
    (folder_path / "stats.txt").write_text(f"numentity: {art.num_entities + 5}\nnumrelations: {art.num_relations}\n")
    with pytest.raises(UserError, match="entities"):
        check_betae_ids(art, read_betae_folder(folder_path))
