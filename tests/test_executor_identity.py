"""The executor-identity referee (benchmarks/executor_identity.py) on the tiny UMLS artifact, in process.

Records every mode on an eager artifact and its lazy twin (same embeddings), saves, reloads
and compares (all identical), then checks that a one-ulp change in one stored score vector is
found with its structure, mode, query and size.  Within the run it asserts only what the
executor documents: sparse sets give the dense scores bit for bit; lazy rows are the eager
build's formula (tests/test_kge_lazy.py: equal within 1e-6).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ident():
    spec = importlib.util.spec_from_file_location("executor_identity", ROOT / "benchmarks" / "executor_identity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def lazy_twin(umls_tiny_artifact, tmp_path_factory):
    """The tiny artifact's KG and embeddings with lazy matrices (no training)."""
    from kge.build import main as build_main

    out = tmp_path_factory.mktemp("umls-tiny-lazy") / "umls"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = build_main(["--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--seed", "0", "--embeddings",
                         str(umls_tiny_artifact), "--matrices", "lazy", "--eval-max-triples", "0", "--device", "cpu",
                         "--quiet"])
    assert rc == 0, err.getvalue()
    return out


@pytest.fixture(scope="module")
def recorded(ident, umls_tiny_artifact, lazy_twin, tmp_path_factory):
    d = tmp_path_factory.mktemp("identity")
    queries = d / "queries.jsonl"
    n = ident.sample(umls_tiny_artifact, queries, per_structure=3, seed=0, progress=False)
    assert n > 0
    rec, scores = ident.record_run({"eager": umls_tiny_artifact, "lazy": lazy_twin}, queries, progress=False)
    return d, queries, rec, scores


def test_every_mode_recorded(ident, recorded):
    _, queries, rec, scores = recorded
    structures, exprs = ident.load_queries(queries)
    assert len(set(structures)) == 14  # every BetaE structure sampled on UMLS
    assert set(rec["runs"]) == {f"{a}/{m}" for a in ("eager", "lazy") for m in ident.MODE_NAMES}
    for key, run in rec["runs"].items():
        sub = key.endswith(("b1-dense", "b1-sparse", "b1-explain"))
        assert run["indices"] == (rec["queries"]["subset"] if sub else list(range(len(exprs))))
        assert scores[key].shape == (len(run["indices"]), rec["artifacts"]["eager"]["entities"])
        for q, row in zip(run["queries"], scores[key]):
            assert q["s"] == ident._vector_sha(row)
            assert q["top"] == ident._top(row)
            assert ("x" in q and "v" in q) == ("explain" in key)
    assert rec["artifacts"]["lazy"]["lazy"] and not rec["artifacts"]["eager"]["lazy"]


def test_save_load_compare_identical(ident, recorded):
    d, _, rec, scores = recorded
    ident.save_record(d / "rec.json", rec, scores)
    base, base_scores = ident.load_record(d / "rec.json")
    cells = ident.compare_records(base, base_scores, rec, scores)
    assert len(cells) == 2 * len(ident.MODE_NAMES) * 14
    assert all(c.differing == 0 and c.first is None for c in cells)
    assert sum(c.queries for c in cells) == sum(len(r["indices"]) for r in rec["runs"].values())
    assert "differ" in ident.format_comparison(cells)


def test_compare_finds_one_changed_query(ident, recorded):
    _, _, rec, scores = recorded
    now, now_scores = copy.deepcopy(rec), {k: v.copy() for k, v in scores.items()}
    key = "lazy/explain"
    row = 5
    qi = now["runs"][key]["indices"][row]
    v = now_scores[key][row]
    j = int(np.argmax(v))
    v[j] = np.nextafter(v[j], np.float32(0))  # one ulp
    now["runs"][key]["queries"][row]["s"] = ident._vector_sha(v)
    now["runs"][key]["queries"][row]["x"] = "0" * 64
    cells = ident.compare_records(rec, scores, now, now_scores)
    bad = [c for c in cells if c.differing]
    assert len(bad) == 1
    c = bad[0]
    assert (c.artifact, c.mode, c.structure) == ("lazy", "explain", rec["queries"]["structures"][qi])
    assert c.differing == 1 and c.first == qi and c.what == "scores+explanation"
    assert c.max_abs == pytest.approx(float(scores[key][row][j] - v[j]), rel=0, abs=0)
    assert c.max_abs > 0
    # Without the score matrices the difference comes from the top-10 lists.
    now["runs"][key]["queries"][row]["top"] = ident._top(v)
    cells = ident.compare_records(rec, None, now, None)
    assert [x.max_abs for x in cells if x.differing] == [c.max_abs]


def test_documented_equivalences(ident, recorded):
    _, _, rec, scores = recorded
    rows = {(r["a"], r["b"]): r for r in ident.within_run_agreement(rec, scores)}
    for art in ("eager", "lazy"):
        for a, b in ((f"{art}/sparse", f"{art}/dense"), (f"{art}/b1-sparse", f"{art}/b1-dense")):
            r = rows[(a, b)]  # Executor(sparse=True): "equal, bit for bit, to the dense path's"
            assert r["scores_identical"] == r["queries"] > 0 and r["max_abs"] == 0.0
    for m in ident.MODE_NAMES:
        r = rows[(f"lazy/{m}", f"eager/{m}")]
        assert r["queries"] > 0 and r["max_abs"] <= 1e-6


def test_report_and_cli(ident, recorded, umls_tiny_artifact, tmp_path):
    d, queries, rec, scores = recorded
    ident.save_record(tmp_path / "base.json", rec, scores)
    cells = ident.compare_records(rec, scores, rec, scores)
    mem = {"format": "m", "created": "t", "machine": "m", "tree": {"root": "/x", "commit": "c"}, "artifact": "a",
           "queries": "q", "threads": 1, "load_seconds": 0.1,
           "steps": [{"step": "imports", "rss": 2**20, "maxrss": 2**21},
                     {"step": "Engine.load", "rss": 2**22, "maxrss": 2**22, "held_artifact": 2**20,
                      "held_executor": 0}]}
    text = ident.write_report(tmp_path / "r.md", base=rec, now=rec, cells=cells,
                              agreement=ident.within_run_agreement(rec, scores), determinism=cells,
                              memory={"before": mem, "after": mem})
    assert (tmp_path / "r.md").read_text() == text
    n = sum(c.queries for c in cells)
    assert f"**Result: {n:,} of {n:,} (query, artifact, mode) outputs identical; 0 differ.**" in text
    assert sum(line.startswith("| 2p | ") for line in text.splitlines()) == 2  # one pivot row per artifact
    assert "| Engine.load | 4 | 4 | 1 | 0 | 4 | 4 | 1 | 0 |" in text
    # Records made per artifact merge into one; the report CLI reads saved records only.
    parts = []
    for art in ("eager", "lazy"):
        r = copy.deepcopy(rec)
        r["runs"] = {k: v for k, v in rec["runs"].items() if k.startswith(art + "/")}
        r["artifacts"] = {art: rec["artifacts"][art]}
        parts.append((r, {k: v for k, v in scores.items() if k.startswith(art + "/")}))
        ident.save_record(tmp_path / f"{art}.json", *parts[-1])
    merged, merged_scores = ident.merge_records(parts)
    assert merged["runs"] == rec["runs"] and set(merged_scores) == set(scores)
    # One run recorded over two overlapping subsets merges into the union; a disagreement is an error.
    key = "eager/dense"
    run = rec["runs"][key]
    halves = []
    for lo, hi in ((0, 30), (20, len(run["indices"]))):
        r = copy.deepcopy(rec)
        r["runs"] = {key: copy.deepcopy(dict(run, indices=run["indices"][lo:hi], queries=run["queries"][lo:hi]))}
        halves.append((r, {key: scores[key][lo:hi]}))
    u, u_scores = ident.merge_records(halves[::-1])
    assert u["runs"][key]["indices"] == run["indices"] and u["runs"][key]["queries"] == run["queries"]
    assert np.array_equal(u_scores[key], scores[key])
    halves[1][0]["runs"][key]["queries"][5]["s"] = "0" * 64  # query 25, in both halves
    with pytest.raises(Exception, match="disagree on query #25"):
        ident.merge_records(halves)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = ident.main(["report", "--before", str(tmp_path / "base.json"), "--after", str(tmp_path / "eager.json"),
                         str(tmp_path / "lazy.json"), "--out", str(tmp_path / "r2.md")])
    assert rc == 0 and f"total: {n:,} of {n:,}" in out.getvalue()
    # CLI: bad input is one line and status 2, nothing run.
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ident.main(["run", "--queries", str(queries), "--artifact", f"eager={d}"])
    assert rc == 2 and err.getvalue().count("\n") == 1 and "not an artifact folder" in err.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ident.main(["run", "--queries", str(queries), "--artifact", f"eager={umls_tiny_artifact}", "--modes",
                       "denes", "--save", str(tmp_path / "x.json")])
    assert rc == 2 and "closest known: 'dense'" in err.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ident.main(["sample", "--artifact", str(d), "--out", str(queries)])
    assert rc == 2 and "never overwritten" in err.getvalue()
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(Exception, match="not a record written by --save"):
        ident.load_record(tmp_path / "bad.json")


def test_held_bytes_counts_each_storage_once(ident):
    import types

    import torch

    a = np.zeros(1000, np.float32)
    t = torch.zeros(500, dtype=torch.float64)
    art = types.SimpleNamespace(m=a, view=a[10:], again={"x": [a]})
    ex = types.SimpleNamespace(shared=torch.from_numpy(a), own=t, csr=torch.zeros(3, 3).to_sparse_csr(), mod=np)
    held = ident.held_bytes({"artifact": art, "executor": ex})
    csr = 4 * 8 + 0 + 0  # crow int64 (4,); no entries
    assert held == {"artifact": 4000, "executor": 4000 + csr}


def test_limit_runs_a_round_robin_subset(ident, recorded, umls_tiny_artifact):
    _, queries, rec, scores = recorded
    small, small_scores = ident.record_run({"eager": umls_tiny_artifact}, queries, modes=["dense", "eager/b1-dense"],
                                           progress=False, limit=20)
    assert set(small["runs"]) == {"eager/dense", "eager/b1-dense"}
    idx = small["runs"]["eager/dense"]["indices"]
    structures = rec["queries"]["structures"]
    # at least the b1 modes' subset (all of UMLS's 42 queries here), every structure in it
    assert idx == ident.subset_indices(structures, max(20, len(rec["queries"]["subset"])))
    assert set(rec["queries"]["subset"]) <= set(idx) and len({structures[k] for k in idx}) == 14
    full = dict(zip(rec["runs"]["eager/dense"]["indices"], rec["runs"]["eager/dense"]["queries"]))
    assert [full[k] for k in idx] == small["runs"]["eager/dense"]["queries"]


@pytest.mark.parametrize("argv", [["memory", "--artifact", "a", "--tree"], ["run", "--tree"]])
def test_tree_without_a_value_is_one_error_line(ident, argv, capsys):
    """Found by test_fuzz_cli: the stdlib pre-parser of --tree printed its own 'usage: -c ... -c: error:' pair."""
    assert ident.main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: argument --tree: expected one argument\n", err
