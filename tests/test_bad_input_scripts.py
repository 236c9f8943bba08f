"""Issue 32's data-loss, write-outside-output and injection bugs of the research scripts, each reproduced.

``experiments.metaqa_ask`` (``--export`` truncating its input, ``--build-kg-only`` writing into
any folder, tracebacks on user mistakes), ``experiments.metaqa_lgot --name`` (files outside ``--out``),
``experiments.linkeval --baseline`` (was ``--baseline-rev``: an option smuggled into ``git show``), and the simulators'
``--skip-artifact-checksums``.  Everything runs in process on a tiny MetaQA-format folder (< 1 s each).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from fuzz_support import check_cli_stderr, load_script, snapshot
from test_metaqa import KB, _questions, _write


@pytest.fixture(scope="module")
def rmq():
    import experiments.metaqa_ask

    return experiments.metaqa_ask


@pytest.fixture(scope="module")
def mqa(tmp_path_factory):
    """A tiny MetaQA folder, an artifact of it (half the edges dropped) and its questions as JSON lines
    (what ``experiments.metaqa_ask --export`` writes; made here without it, so that the other scripts' tests stand alone)."""
    from engine.eval.metaqa import load_metaqa_questions
    from test_metaqa_experiment import _tiny_artifact

    root = tmp_path_factory.mktemp("mqa")
    _write(root / "metaqa", KB, _questions(KB))
    _tiny_artifact(root / "metaqa", root / "art")
    (root / "questions.jsonl").write_text("".join(
        json.dumps({"question": q.question, "path": list(q.relations), "answers": list(q.answers)}) + "\n"
        for q in load_metaqa_questions(root / "metaqa", limit=4)), encoding="utf-8")
    return root


def test_build_kg_only_and_export_write_what_they_did(tmp_path, rmq, mqa):
    data = mqa / "metaqa"
    assert rmq.main(["--data", str(data), "--build-kg-only", str(tmp_path / "a" / "art"), "--quiet"]) == 0
    from kge.artifact import Artifact

    art = Artifact.load(tmp_path / "a" / "art")
    assert art.num_entities == len({x for h, _, t in KB for x in (h, t)}) and len(art.missing) == 0
    assert rmq.main(["--data", str(data), "--export", str(tmp_path / "q.jsonl"), "--per-hop", "4"]) == 0
    assert (tmp_path / "q.jsonl").read_text(encoding="utf-8") == (mqa / "questions.jsonl").read_text(encoding="utf-8")


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    check_cli_stderr(err, only_error=False)
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------ experiments.metaqa_ask --export
def test_export_never_replaces_its_own_input(tmp_path, rmq, capsys):
    """Issue 32: ``--export 1-hop/test.txt`` truncated the questions file it was about to read (9,947 lines -> 0)."""
    data = tmp_path / "metaqa"
    _write(data, KB, _questions(KB))
    test = data / "1-hop" / "test.txt"
    before = test.read_bytes()
    for extra in ([], ["--overwrite"]):
        assert rmq.main(["--data", str(data), "--hops", "1", "--export", str(test), *extra]) == 2
        assert "inside the --data folder" in _one_error(capsys)
        assert test.read_bytes() == before


def test_export_replaces_only_with_overwrite_and_never_truncates_before_reading(tmp_path, rmq, capsys):
    data = tmp_path / "metaqa"
    _write(data, KB, _questions(KB))
    out = tmp_path / "questions.jsonl"
    out.write_text("keep me\n")
    assert rmq.main(["--data", str(data), "--export", str(out)]) == 2
    assert "--overwrite" in _one_error(capsys) and out.read_text() == "keep me\n"
    # A read error part way (the 2-hop file is damaged) with --overwrite: the old file is still whole.
    (data / "2-hop" / "test.txt").write_bytes(b"\xff\xfe not UTF-8\tx\n")
    assert rmq.main(["--data", str(data), "--export", str(out), "--overwrite"]) == 2
    _one_error(capsys)
    assert out.read_text() == "keep me\n"
    assert rmq.main(["--data", str(data), "--export", str(out), "--overwrite", "--hops", "1", "--per-hop", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(set(r) == {"question", "path", "answers"} for r in rows)
    assert not [p for p in tmp_path.iterdir() if ".part-" in p.name]


# ------------------------------------------------------------------------------ experiments.metaqa_ask --build-kg-only
@pytest.mark.parametrize("target", ["user", "data", "artifact"])
def test_build_kg_only_writes_no_folder_it_did_not_make(tmp_path, rmq, mqa, capsys, target):
    """Issue 32: ``--build-kg-only DIR`` wrote artifact files into a user folder, the MetaQA folder itself or an
    existing artifact, without ``--overwrite``."""
    data = tmp_path / "metaqa"
    shutil.copytree(mqa / "metaqa", data)
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("keep me\n")
    art = tmp_path / "art"
    shutil.copytree(mqa / "art", art)
    dest = {"user": user, "data": data, "artifact": art}[target]
    before = snapshot(tmp_path)
    assert rmq.main(["--data", str(data), "--build-kg-only", str(dest)]) == 2
    err = _one_error(capsys)
    assert snapshot(tmp_path) == before, err
    if target == "artifact":  # asked for: replaced, and only then
        assert "--overwrite" in err
        (art / "meta.json").write_text((art / "meta.json").read_text())
        assert rmq.main(["--data", str(data), "--build-kg-only", str(dest), "--overwrite"]) == 0
        assert sorted(os.listdir(art)) == sorted(os.listdir(mqa / "art"))


# ------------------------------------------------------------------------------ experiments.metaqa_ask user mistakes
@pytest.mark.parametrize("argv, says", [
    (["--export", "{tmp}"], "is a folder"),
    (["--export", "{tmp}/q.jsonl", "--hops", "7"], "invalid choice: 7"),
    (["--export", "{tmp}/q.jsonl", "--per-hop", "-1"], "--per-hop"),
    (["--export", "{tmp}/q.jsonl", "--seed", "-1"], "--seed"),
    (["--out", "{tmp}/r.json"], "need --artifact"),
    (["--artifact", "{art}"], "need --out"),
    (["--artifact", "{art}", "--out", "{art}/r.json"], "inside the --artifact folder"),
    (["--artifact", "{art}", "--out", "{tmp}/r.json", "--errors", "nan"], "--errors"),
    (["--artifact", "{art}", "--out", "{tmp}/r.json", "--settings", "[1]"], "JSON object"),
    (["--artifact", "{art}", "--out", "{tmp}/r.json", "--settings", '{"bogus": 1}'], "bogus"),
    (["--artifact", "{art}", "--out", "{tmp}/r.json", "--settings", "[" * 100_000], "--settings"),
    (["--artifact", "{art}", "--out", "{tmp}/r.json", "--split", "train"], "--split test or dev"),
    (["--artifact", "{art}", "--make-exemplars", "{tmp}/x.jsonl", "--split", "test"], "never reads the test"),
    (["--artifact", "{art}", "--make-exemplars", "{data}/x.jsonl"], "inside the --data folder"),
    (["--report", "{data}/kb.txt", "--md", "{tmp}/t.md", "--png", "{tmp}/t.png"], "--report"),
    (["--report", "{tmp}", "--md", "{tmp}/t.md", "--png", "{tmp}/t.png"], "--report"),
    (["--artifact", "{tmp}/missing", "--tune-exemplars", "{data}/kb.txt"], "missing"),
    (["--export", "{tmp}/q.jsonl", "--build-kg-only", "{tmp}/a"], "not allowed with"),
])
def test_user_mistakes_are_one_error_line(tmp_path, rmq, mqa, capsys, argv, says):
    """Issue 32: experiments.metaqa_ask had no error wrapper (``--export`` to a folder, ``--hops 7``: tracebacks)."""
    names = {"tmp": str(tmp_path), "art": str(mqa / "art"), "data": str(mqa / "metaqa")}
    argv = [a.format(**names) if a.startswith("{") and not a.startswith('{"') else a for a in argv]
    before = snapshot(mqa)
    assert rmq.main(["--data", str(mqa / "metaqa"), *argv]) == 2
    assert says in _one_error(capsys)
    assert snapshot(mqa) == before


def test_report_writes_md_and_png_replacing_only_with_overwrite(tmp_path, rmq, capsys):
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"label": "x", "artifact": "a", "per_hop": 3, "runs": [
        {"hops": 1, "method": "embedding", "hits@1": 0.5, "llm_calls": 0, "tokens": 0, "seconds": 0.01,
         "fallbacks": 1.0}]}))
    md, png = tmp_path / "t.md", tmp_path / "t.png"
    md.write_text("old\n")
    argv = ["--report", str(res), "--md", str(md), "--png", str(png)]
    assert rmq.main(argv) == 2
    assert "--overwrite" in _one_error(capsys) and md.read_text() == "old\n" and not png.exists()
    assert rmq.main([*argv, "--overwrite"]) == 0
    assert "| embedding | 1 | 50.0 |" in md.read_text() and png.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------- experiments.metaqa_lgot --name
@pytest.mark.parametrize("name", ["../userdoc", "{abs}/userdoc", "sub/x", "..", ""])
def test_metaqa_experiment_name_never_leaves_out(tmp_path, mqa, capsys, name):
    """Issue 32: ``--name ../userdoc --overwrite`` replaced ``userdoc.md`` beside ``--out`` (``/abs/path`` too)."""
    from experiments.metaqa_lgot import main

    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "userdoc.md").write_text("my notes\n")
    before = snapshot(tmp_path)
    argv = ["--artifact", str(mqa / "art"), "--metaqa", str(mqa / "metaqa"), "--out", str(out), "--per-hop", "2",
            "--hops", "1", "--quality", "1/0", "--cache", str(tmp_path / "c.sqlite"), "--quiet", "--overwrite",
            "--name", name.format(abs=tmp_path)]
    assert main(argv) == 2
    assert "--name must be a plain name" in _one_error(capsys)
    assert snapshot(tmp_path) == before


def test_metaqa_experiment_cache_never_inside_an_input(tmp_path, mqa, capsys):
    from experiments.metaqa_lgot import main

    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(mqa)
    assert main(["--artifact", str(mqa / "art"), "--metaqa", str(mqa / "metaqa"), "--out", str(out), "--quiet",
                 "--cache", str(mqa / "art" / "c.sqlite")]) == 2
    assert "--cache" in _one_error(capsys) and snapshot(mqa) == before


# ------------------------------------------------------------------------ experiments.linkeval --baseline
# Issue 33: --baseline-rev ran `git show REV:llm_bridge/linking.py` and imported the text (only inside a git
# checkout, and an option smuggled into git wrote files: issue 32); the baseline is now an earlier run's
# --save-results file, read as data.
def _kb(tmp_path: Path) -> Path:
    kb = tmp_path / "kb.txt"
    kb.write_text("".join(f"Film {i}|directed_by|Person {i % 7}\n" for i in range(30)), encoding="utf-8")
    return kb


def test_linkeval_baseline_round_trip_without_git(tmp_path, capsys, monkeypatch):
    """A run saves its results; a later run, outside any git checkout and with no git on PATH, shows them side by
    side: the baseline's row equals the saving run's `new` row (same threshold, same links)."""
    from experiments.linkeval import main

    kb = _kb(tmp_path)
    saved = tmp_path / "runs" / "base.json"  # a new folder, made as --out's is
    argv = ["--kb", str(kb), "--per-kind", "3"]
    assert main([*argv, "--out", str(tmp_path / "a.md"), "--save-results", str(saved)]) == 0
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert doc["format"] == "kgreason linkeval results" and len(doc["outcomes"]) == doc["set"]["strings"] > 0
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no git at all
    monkeypatch.chdir(tmp_path)  # not a checkout
    assert main([*argv, "--out", str(tmp_path / "b.md"), "--baseline", str(saved)]) == 0
    assert "Traceback" not in capsys.readouterr().err

    def side_by_side(md: str) -> dict[str, str]:
        text = (tmp_path / md).read_text(encoding="utf-8").split("## Side by side")[1].split("##")[0]
        return {row.split(" | ")[0].lstrip("| "): row.split(" | ", 1)[1].rsplit(" | ", 1)[0]
                for row in text.splitlines() if row.startswith("| new |") or row.startswith("| baseline")}

    rows = side_by_side("b.md")
    assert rows["baseline (base.json)"] == side_by_side("a.md")["new"] == rows["new"]
    assert "--baseline " + str(saved) in (tmp_path / "b.md").read_text(encoding="utf-8")


def _saved(tmp_path: Path) -> Path:
    from experiments.linkeval import main

    saved = tmp_path / "base.json"
    assert main(["--kb", str(_kb(tmp_path)), "--per-kind", "3", "--out", str(tmp_path / "a.md"),
                 "--save-results", str(saved)]) == 0
    return saved


def _edit(doc: dict, case: str) -> str:
    if case == "not json":
        return "{not json"
    if case == "a list":
        return "[1, 2]"
    if case == "another file":
        return json.dumps({"label": "x", "runs": []})
    if case == "newer version":
        doc["version"] = 99
    elif case == "short outcomes":
        doc["outcomes"] = doc["outcomes"][:-1]
    elif case == "bad outcome":
        doc["outcomes_at_0"][0] = ["x", "fuzzy", "high"]
    elif case == "no fingerprint":
        del doc["set"]["sha256"]
    elif case == "bad threshold":
        doc["threshold"] = "80"
    return json.dumps(doc)


@pytest.mark.parametrize("case,message", [
    ("missing", "--baseline '{f}': no such file (an earlier run's --save-results)"),
    ("not json", "--baseline '{f}': not JSON"),
    ("a list", "--baseline '{f}': expected a JSON object"),
    ("another file", "--baseline '{f}': not a results file of --save-results"),
    ("newer version", "--baseline '{f}': results file version 99; this linkeval reads version 1"),
    ("short outcomes", "--baseline '{f}': damaged: "),
    ("bad outcome", "--baseline '{f}': outcomes_at_0[0] is not [name, method, score]"),
    ("no fingerprint", "--baseline '{f}': damaged: 'set' lacks its string count and fingerprint"),
    ("bad threshold", "--baseline '{f}': damaged: 'threshold' is not a number"),
    ("another set", "--baseline '{f}': measured on another linking set ("),
    ("as --out", "--out {f}: is the --baseline input"),
    ("as --save-results", "--save-results {f}: is the --baseline input"),
])
def test_linkeval_bad_baseline_is_one_line_and_writes_nothing(tmp_path, capsys, case, message):
    from experiments.linkeval import main

    saved = _saved(tmp_path)
    bad = tmp_path / "bad.json"
    if case != "missing":
        bad.write_text(_edit(json.loads(saved.read_text(encoding="utf-8")), case), encoding="utf-8")
    out = tmp_path / "r.md"
    argv = ["--kb", str(tmp_path / "kb.txt"), "--per-kind", "4" if case == "another set" else "3",
            "--out", str(out), "--baseline", str(bad)]
    if case == "as --out":
        argv[argv.index("--out") + 1] = str(bad)
    if case == "as --save-results":
        argv += ["--save-results", str(bad)]
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = _one_error(capsys)
    assert err.count("\n") == 1 and message.format(f=bad) in err, err
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------- the simulators' --skip-artifact-checksums
@pytest.mark.parametrize("module", ["experiments.simulate_ask", "experiments.simulate"])
def test_simulators_skip_artifact_checksums(tmp_path, mqa, capsys, monkeypatch, module):
    """Issue 32: ``simulate_ask`` lacked ``--skip-artifact-checksums`` (the README: every artifact reader has it).
    The serving loop is not entered (``serve_forever`` returns at once): what is tested is what happens before."""
    import importlib

    from experiments.simulate import SimulatorServer

    monkeypatch.setattr(SimulatorServer, "serve_forever", lambda self, *a, **k: None)
    main = importlib.import_module(module).main
    art = tmp_path / "art"
    shutil.copytree(mqa / "art", art)
    with open(art / "observed.tsv", "a", encoding="utf-8") as f:  # valid rows, so only the checksum is wrong
        f.write((art / "observed.tsv").read_text(encoding="utf-8").splitlines()[0] + "\n")
    argv = ["--artifact", str(art), "--port", "0"]
    if module.endswith("simulate_ask"):
        argv += ["--questions", str(mqa / "questions.jsonl")]
    assert main(argv) == 2
    assert "checksum mismatch" in _one_error(capsys)
    assert main([*argv, "--skip-artifact-checksums"]) == 0
    assert "127.0.0.1" in capsys.readouterr().out


# --------------------------------------------------------------------- the other benchmark scripts users run
@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """A KG folder with train/valid/test name triples (what betae_1p_queries.py reads)."""
    d = tmp_path_factory.mktemp("splits") / "kg"
    d.mkdir()
    rows = [(f"e{i}", f"r{i % 2}", f"e{(i * 7 + 3) % 12}") for i in range(36)]
    for name, part in (("train", rows[:24]), ("valid", rows[24:30]), ("test", rows[30:])):
        (d / f"{name}.txt").write_text("".join("\t".join(r) + "\n" for r in part), encoding="utf-8")
    return d


@pytest.mark.parametrize("script, argv, says", [
    ("benchmarks/betae_1p_queries.py", ["--kg", "{kg}", "--out", "{kg}/train.txt"], "inside the --kg folder"),
    ("benchmarks/betae_1p_queries.py", ["--kg", "{kg}", "--out", "{kg}/new.jsonl"], "inside the --kg folder"),
    ("benchmarks/betae_1p_queries.py", ["--kg", "{kg}", "--out", "{tmp}/old.txt"], "--overwrite"),
    ("benchmarks/betae_1p_queries.py", ["--kg", "{kg}", "--out", "{tmp}"], "is a folder"),
    ("benchmarks/betae_1p_queries.py", ["--kg", "{kg}"], "--out"),
    ("benchmarks/executor_memory.py", ["--artifact", "{art}", "--json", "{art}/meta.json"], "inside the --artifact folder"),
    ("benchmarks/executor_memory.py", ["--artifact", "{art}", "--json", "{tmp}/old.txt"], "--overwrite"),
    ("benchmarks/executor_memory.py", ["--artifact", "{art}", "--device", "bogus"], "--device"),
    ("benchmarks/executor_memory.py", ["--artifact", "{tmp}/missing"], "does not exist"),
    ("benchmarks/ops_cuda_bench.py", ["--device", "cpu", "--quick", "--out", "{tmp}/old.txt"], "--overwrite"),
    ("benchmarks/ops_cuda_bench.py", ["--device", "bogus"], "--device"),
    ("benchmarks/ops_cuda_bench.py", ["--device", "cpu", "--seed", "-1"], "--seed"),
    ("benchmarks/executor_identity.py", ["report", "--before", "{tmp}/old.txt", "--after", "{tmp}/old.txt",
                                         "--out", "{tmp}/old.txt", "--overwrite"], "is the --before input"),
    ("benchmarks/executor_identity.py", ["memory", "--artifact", "{art}", "--queries", "{tmp}/old.txt",
                                         "--save", "{tmp}/old.txt"], "is the --queries input"),
])
def test_benchmark_scripts_check_their_outputs_first(tmp_path, mqa, splits, capsys, script, argv, says):
    """Every benchmark script the docs tell users to run: one error line (cli_main), nothing written, an output
    never one of the inputs nor inside one, an existing file replaced only with --overwrite."""
    (tmp_path / "old.txt").write_text("keep me\n")
    names = {"tmp": str(tmp_path), "art": str(mqa / "art"), "kg": str(splits)}
    argv = [a.format(**names) for a in argv]
    before = snapshot(tmp_path), snapshot(mqa), snapshot(splits)
    assert load_script(script).main(argv) == 2
    assert says in _one_error(capsys)
    assert (snapshot(tmp_path), snapshot(mqa), snapshot(splits)) == before


def test_betae_1p_queries_writes_and_replaces_with_overwrite(tmp_path, splits, capsys):
    main = load_script("benchmarks/betae_1p_queries.py").main
    out = tmp_path / "q.jsonl"
    assert main(["--kg", str(splits), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["structure"] == "1p" and r["hard"] for r in rows)
    assert main(["--kg", str(splits), "--out", str(out)]) == 2
    assert main(["--kg", str(splits), "--out", str(out), "--overwrite"]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows


@pytest.mark.parametrize("case", ["user", "file", "earlier-run", "relative"])
def test_large_kg_sh_never_writes_into_a_folder_it_did_not_make(tmp_path, case):
    """``bash benchmarks/large_kg.sh DIR`` (README) wrote its logs and steps into any DIR, resolved a relative DIR
    against the repository (it cds there first), and replaced an earlier run without asking."""
    import subprocess

    from fuzz_support import REPO

    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("keep me\n")
    target = {"user": str(user), "file": str(user / "notes.txt"), "earlier-run": str(tmp_path / "run"),
              "relative": "user"}[case]
    if case == "earlier-run":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / ".kgreason-large-kg").touch()
        (tmp_path / "run" / "build.log").write_text("an earlier run\n")
    before = snapshot(tmp_path)
    env = {**os.environ, "ENTITIES": "50", "RELATIONS": "2", "EDGES": "100", "TRAIN_MINUTES": "1"}
    res = subprocess.run(["bash", str(REPO / "benchmarks" / "large_kg.sh"), target], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: OUT_DIR") and res.stderr.count("\n") == 1, res.stderr
    assert ("--overwrite" in res.stderr) == (case == "earlier-run")
    assert snapshot(tmp_path) == before
    assert not (REPO / "user").exists()


def test_export_escapes_separators_and_bidi_in_json_lines(tmp_path, rmq):
    """Issue 32 item 1 for the script's JSON lines: a KG name holding U+2028 / U+202E is written escaped
    (kgreason.text.json_line), so a line reader sees one line per question and no raw bidi control."""
    kb = [(h.replace("Heat", "He\u2028at\u202e"), r, t) for h, r, t in KB]
    data = tmp_path / "metaqa"
    _write(data, kb, _questions(kb))
    out = tmp_path / "q.jsonl"
    assert rmq.main(["--data", str(data), "--export", str(out), "--hops", "1"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "\u2028" not in text and "\u202e" not in text and "\\u2028" in text
    rows = [json.loads(line) for line in text.split("\n") if line]
    assert len(rows) == len(_questions(kb)[1])
    assert any("He\u2028at\u202e" in r["question"] for r in rows)
