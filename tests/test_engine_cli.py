"""``python -m engine.answer`` (via ``main(argv)``), the Python API and the default-KG cache."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import engine
from engine.exec import defaults
from engine.answer import AnswerConfig, main, parse_args
from engine.exec.api import Engine
from engine.exec.examples import example_query
from engine.lang.query import Node, parse, to_sexpr
from engine.lang.structures import STRUCTURES
from kge import Artifact, UserError

ROOT = Path(__file__).resolve().parent.parent


def make_artifact(seed: int = 0, n: int = 12) -> Artifact:
    """A small KG with readable names (spaces included), relations and their inverses, observed edges."""
    rng = np.random.default_rng(seed)
    names = [f"ent {i}" for i in range(n)]
    base = ["likes", "works with", "part of"]
    rels, blocks, obs = [], [], []
    for k, rname in enumerate(base):
        m = (rng.random((n, n)) < 0.25) * rng.uniform(0.3, 1.0, (n, n))
        weak = (rng.random((n, n)) < 0.15) * rng.uniform(0.0, 0.3, (n, n))  # calibrated "missing" edges
        rels += [rname, rname + "^-1"]
        full = np.maximum(m, weak)
        blocks += [full, full.T]
        for h, t in zip(*np.nonzero(m)):
            obs += [(h, 2 * k, t), (t, 2 * k + 1, h)]
    mat = sp.csr_matrix(np.concatenate(blocks).astype(np.float32))
    mat.sort_indices()
    return Artifact(entities=names, relations=rels, matrices=mat, observed=np.array(obs, dtype=np.int64),
                    missing=np.zeros((0, 3), dtype=np.int64))


@pytest.fixture(scope="module")
def art_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("kg") / "small"
    make_artifact().save(d)
    return str(d)


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_example_query_per_structure(art_dir, structure, capsys):
    assert main(["--artifact", art_dir, "--query", structure, "--top-k", "3", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["answers"], "example queries must have answers"
    assert parse(obj["query"])  # the printed query is valid syntax
    for a in obj["answers"]:
        assert set(a) == {"entity", "id", "score", "provenance", "explanation"}
        assert a["provenance"] == "kg"  # no hooks: every answer comes from the KG
        assert isinstance(a["id"], int) and isinstance(a["entity"], str) and 0 < a["score"] <= 1
        assert set(a["explanation"]) == {"text", "tree"}
        assert a["explanation"]["tree"]["id"] == a["id"]


def test_example_is_seeded(art_dir):
    art = Artifact.load(art_dir)
    a = example_query(art, "pin", seed=3)
    assert a == example_query(art, "pin", seed=3)
    assert len({to_sexpr(example_query(art, "pin", seed=s)) for s in range(6)}) > 1


def test_text_output_with_explanations(art_dir, capsys):
    assert main(["--artifact", art_dir, "--expr", '(i (p likes "ent 1") (p "works with" "ent 2"))', "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('query: (i (p likes "ent 1") (p "works with" "ent 2"))\n')
    assert "in words: ?y such that (ent 1 —likes→ ?y) and (ent 2 —works with→ ?y)" in out
    assert "satisfies all of:" in out and "—likes (" in out


def test_structure_with_bindings_and_ids(art_dir, capsys):
    args = ["--artifact", art_dir, "--query", "2p", "--anchors", "ent 3", "--relations", "likes", "#1", "--json"]
    assert main(args) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["query"] == '(p likes^-1 (p likes "ent 3"))'


def test_queries_file_json_in_order(art_dir, tmp_path, capsys):
    exprs = ['(p likes "ent 0")', "", '(n (p "part of" "ent 4"))', '(u (p likes "ent 1") (p likes^-1 "ent 1"))']
    f = tmp_path / "q.txt"
    f.write_text("\n".join(exprs) + "\n", encoding="utf-8")
    assert main(["--artifact", art_dir, "--queries", str(f), "--json", "--no-explain", "--top-k", "4",
                 "--tnorm", "godel"]) == 0
    objs = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert [o["query"] for o in objs] == [e for e in exprs if e]
    assert all(a["explanation"] is None for o in objs for a in o["answers"])
    assert all(len(o["answers"]) <= 4 for o in objs)
    # Scores agree with the API.
    eng = Engine.load(art_dir, tnorm="godel")
    s = eng.scores([e for e in exprs if e])
    for row, o in enumerate(objs):
        for a in o["answers"]:
            assert a["score"] == pytest.approx(float(s[row, a["id"]]))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--expr", '(p likes "ent 99")'], "error: --expr: unknown entity 'ent 99'; closest known: "),
        (["--expr", "(p likez x)"], "error: --expr: unknown relation 'likez'; closest known: 'likes'"),
        (["--expr", "(p likes"], "error: --expr:9: expected a query (an entity name or '('), got end of input"),
        (["--query", "pin", "--anchors", "ent 1", "--relations", "likes"],
         "error: structure pin (i (p r2 (p r1 e1)) (np r3 e2)) needs 2 anchor(s) and 3 relation(s), got 1"),
        (["--query", "pni2"], "error: unknown query structure 'pni2'; closest known: 'pni'"),
        (["--query", "pin", "--anchors", "ent 1"], "error: --query pin: give both --anchors and --relations"),
        ([], "error: give exactly one of --query, --expr, --queries"),
        (["--expr", "x", "--query", "1p"], "error: give exactly one of --query, --expr, --queries (got --query, --expr)"),
        (["--expr", "x", "--top-k", "0"], "error: --top-k must be >= 1, got 0"),
        (["--expr", "x", "--tnorm", "luk"], "error: argument --tnorm: invalid choice: 'luk'"),
        (["--expr", "x", "--neg-scale", "abc"], "error: argument --neg-scale: invalid float value: 'abc'"),
        (["--expr", "x", "--neg-scale", "-1"], "error: --neg-scale must be in (0, inf), got -1.0"),  # before loading the artifact
        (["--queries", "/nonexistent/q.txt"], "error: --queries: file '/nonexistent/q.txt' does not exist"),
        (["--expr", "x", "--bogus"], "error: unrecognized arguments: --bogus"),
        (["--expr", "x", "--frontier-k", "0"], "error: --frontier-k must be >= 1, got 0"),
        (["--expr", "x", "--row-cache-gb", "-1"], "error: --row-cache-gb must be a finite number of GiB > 0, got -1"),
    ],
)
def test_bad_input_exit_2_one_message(art_dir, args, message, capsys):
    assert main(["--artifact", art_dir] + args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message), captured.err
    assert "Traceback" not in captured.err


def test_queries_file_errors_name_file_line_column(art_dir, tmp_path, capsys):
    f = tmp_path / "q.txt"
    f.write_text('(p likes "ent 0")\n\n(i (p likes "ent 0") (p likes))\n', encoding="utf-8")
    assert main(["--artifact", art_dir, "--queries", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {f}:3:30: expected a query (an entity name or '('), got ')'")
    f.write_text('(p likes "ent 0")\n(p likes "ent 77")\n', encoding="utf-8")
    assert main(["--artifact", art_dir, "--queries", str(f)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {f}:2: unknown entity 'ent 77'")


def test_missing_artifact(tmp_path, capsys):
    assert main(["--artifact", str(tmp_path / "nope"), "--expr", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_parse_args_is_frozen_config():
    cfg = parse_args(["--expr", "x", "--no-explain", "--neg-scale", "2", "--negation", "complement"])
    assert cfg == AnswerConfig(expr="x", explain=False, neg_scale=2.0, negation="complement")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.top_k = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------- API
def test_engine_api_accepts_every_query_form(art_dir):
    eng = engine.Engine.load(art_dir)
    expr = '(i (p likes^-1 (p likes "ent 1")) (np "works with" "ent 2"))'
    as_tuple = ("pin", ["ent 1", "ent 2"], ["likes", "likes^-1", "works with"])
    ast = parse(expr)
    res = eng.answer([expr, as_tuple, ast], k=5)
    assert res[0] == res[1] == res[2]
    assert eng.answer(expr, k=5) == res[:1]  # a single query
    assert eng.answer(as_tuple, k=5) == res[:1]
    s = eng.scores([expr, as_tuple])
    assert s.shape == (2, 12) and bool((s[0] == s[1]).all())
    comp = engine.Engine.load(Artifact.load(art_dir), negation="complement").answer(as_tuple, k=5)[0]
    assert comp.query == '(i (p likes^-1 (p likes "ent 1")) (n (p "works with" "ent 2")))'
    with pytest.raises(UserError, match="query 2: unknown entity"):
        eng.answer([expr, "(p likes nobody)"])
    with pytest.raises(UserError, match="expected a query expression"):
        eng.answer([3.5])
    assert isinstance(eng.example("3in"), Node)
    assert "?y such that" in eng.describe(expr)


# ------------------------------------------------------------------------ default KG cache
def test_default_artifact_builds_once_into_place(tmp_path, monkeypatch):
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    calls = []

    def builder(out: Path):
        calls.append(out)
        assert out.parent == tmp_path / "home" / "artifacts" and out.name != "umls"  # a temporary sibling
        make_artifact(1).save(out)

    art = defaults.default_artifact(builder=builder)
    assert art.path == tmp_path / "home" / "artifacts" / "umls" and len(calls) == 1
    assert defaults.default_artifact(builder=builder).entities == art.entities and len(calls) == 1
    assert [p.name for p in (tmp_path / "home" / "artifacts").iterdir()] == ["umls"]


def test_default_artifact_interrupted_build_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))

    def failing(out: Path):
        (out / "entities.tsv").write_text("0\tx\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        defaults.default_artifact(builder=failing)
    assert list((tmp_path / "home" / "artifacts").iterdir()) == []


def test_cli_module_runs_without_heavy_imports(art_dir):
    """The cached path never imports pykeen or sentence-transformers (keeps `--query pin` fast)."""
    code = (
        "import sys; from engine.answer import main; rc = main(['--artifact', sys.argv[1], '--query', 'pin']);"
        "bad = [m for m in ('pykeen', 'sentence_transformers', 'transformers') if m in sys.modules];"
        "print('HEAVY', bad); sys.exit(rc)"
    )
    p = subprocess.run([sys.executable, "-c", code, art_dir], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stdout


def test_example_negation_is_visible(art_dir):
    """Examples of negated structures prefer a negation that lowers an answer of the positive part."""
    from engine.exec.examples import _without_negation
    from engine.exec.executor import Executor

    art = Artifact.load(art_dir)
    ex = Executor(art)
    for structure in ("2in", "pin", "inp"):
        effects = 0
        for seed in range(3):
            q = example_query(art, structure, seed=seed, executor=ex)
            full, pos = ex.scores([q])[0], ex.scores([_without_negation(q)])[0]
            assert bool((full <= pos + 1e-7).all())  # negation only ever lowers scores
            effects += bool((full < pos).any())
        assert effects >= 1, structure


def test_frontier_k_answers(art_dir, capsys):
    """--frontier-k k >= N is exact; k = 1 keeps only each intermediate set's best entity."""
    expr = '(p likes (p "works with" "ent 1"))'
    eng = Engine.load(art_dir)
    exact = eng.scores([expr])
    assert main(["--artifact", art_dir, "--expr", expr, "--frontier-k", "100", "--json", "--top-k", "3"]) == 0
    objs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    for a in objs[0]["answers"]:
        assert a["score"] == pytest.approx(float(exact[0, a["id"]]))
    narrow = Engine.load(art_dir, frontier_k=1).scores([expr])
    assert main(["--artifact", art_dir, "--expr", expr, "--frontier-k", "1", "--json", "--top-k", "3"]) == 0
    objs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    for a in objs[0]["answers"]:
        assert a["score"] == pytest.approx(float(narrow[0, a["id"]]))
