"""Issue 9: every reproduction of the bad-input probe gives a right result or one `error: ...` line (exit 2).

One test (or a small group) per item of the issue, in its order; each fails on the code before the fix.
Tiny KGs are written into tmp_path; pykeen's bundled UMLS is used only for the sampler and the quiet build.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from kge.artifact import FORMAT_VERSION, Artifact, ArtifactVersionError
from kge.build import main as build_main
from kge.graph import load_kg
from kgreason.errors import Terminated, UserError
from kgreason.files import OutputFolder, check_output_folder, open_output, read_lines

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--rank", "4", "--epochs", "1", "--eval-max-triples", "0", "--quiet"]
MINI = "a\tr\tb\nb\tr\tc\nc\ts\ta\na\ts\td\n"


def one_error_line(capsys, starts: str = "error: ") -> str:
    err = capsys.readouterr().err
    assert err.startswith(starts) and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def small_artifact(path: Path, n: int = 6) -> Path:
    """A saved artifact without training (identity-like matrices), for load/format/paths tests."""
    names = [f"e{i}" for i in range(n)]
    rels = ["r", "r^-1"]
    obs = np.array([[i, 0, (i + 1) % n] for i in range(n)] + [[(i + 1) % n, 1, i] for i in range(n)])
    m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])), shape=(2 * n, n))
    Artifact(entities=names, relations=rels, matrices=m, observed=obs, missing=obs[:2],
             meta={"source": "test"}).save(path)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def env_with_root(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


# ----------------------------------------------------------------- 1. data loss
def test_build_out_existing_folder_is_refused_and_untouched(tmp_path, capsys):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "x").write_text("keep\n")
    (d / "mini.tsv").write_text(MINI)
    before = snapshot(d)
    assert build_main(["--kg", str(d / "mini.tsv"), "--out", str(d), *TINY]) == 2
    err = one_error_line(capsys)
    assert f"--out {d}: folder exists and is not an artifact" in err and "'mini.tsv'" in err
    assert snapshot(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporary folder or checkpoint left
    # --overwrite does not change that: only artifacts are ever replaced
    assert build_main(["--kg", str(d / "mini.tsv"), "--out", str(d), "--overwrite", *TINY]) == 2
    assert "is not an artifact" in one_error_line(capsys) and snapshot(d) == before


def test_build_replaces_an_artifact_only_with_overwrite(tmp_path, capsys):
    kg = tmp_path / "mini.tsv"
    kg.write_text(MINI)
    out = small_artifact(tmp_path / "art")
    before = snapshot(out)
    assert build_main(["--kg", str(kg), "--out", str(out), *TINY]) == 2
    assert "already holds an artifact; pass --overwrite to replace it" in one_error_line(capsys)
    assert snapshot(out) == before
    (out / "notes.txt").write_text("mine\n")  # a user file inside an artifact folder
    assert build_main(["--kg", str(kg), "--out", str(out), "--overwrite", *TINY]) == 2
    assert "also holds 'notes.txt'" in one_error_line(capsys)
    (out / "notes.txt").unlink()
    assert build_main(["--kg", str(kg), "--out", str(out), "--overwrite", *TINY]) == 0
    assert Artifact.load(out).meta["source"] == str(kg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "mini.tsv"]


def test_manifest_naming_outside_files_is_not_an_artifact(tmp_path):
    out = small_artifact(tmp_path / "art")
    meta = json.loads((out / "meta.json").read_text())
    meta["files"]["../victim"] = "0" * 64
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="is not an artifact"):
        check_output_folder(out, overwrite=True)


# ----------------------------------------------------------------- 2. names are never changed
def test_tsv_loader_keeps_spaces_in_names(tmp_path):
    f = tmp_path / "kg.tsv"
    f.write_text("a\tr\tb\n a\tr\tc\na \tr\td\nb\t r\tc\n\n")
    kg = load_kg(f)
    assert sorted(kg.entities) == [" a", "a", "a ", "b", "c", "d"]
    assert kg.relations == (" r", " r^-1", "r", "r^-1")
    pipe = tmp_path / "kg.txt"
    pipe.write_text("a|r|b\n a|r|c\n")
    assert sorted(load_kg(pipe).entities) == [" a", "a", "b", "c"]


# ----------------------------------------------------------------- 3. tracebacks
@pytest.mark.parametrize("head", ["n", "p r"])
def test_deeply_nested_query_is_one_error_line(tmp_path, capsys, head):
    from engine.answer import main as answer_main

    art = small_artifact(tmp_path / "art")
    depth = 1000
    expr = f"({head} " * depth + "e0" + ")" * depth
    rc = answer_main(["--artifact", str(art), "--expr", expr])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err[:300]


def test_non_utf8_tsv_names_file_and_line(tmp_path, capsys):
    f = tmp_path / "latin1.tsv"
    f.write_bytes("a\tr\tb\nZo\xeb\tr\tc\n".encode("latin-1"))
    assert build_main(["--kg", str(f), "--out", str(tmp_path / "o"), *TINY]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"error: {f}:2: not UTF-8 text (byte 0xeb at column 3)") and "iconv" in err
    assert not (tmp_path / "o").exists()


def test_read_lines_universal_newlines_bom_and_folder(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"\xef\xbb\xbfone\r\ntwo\rthree\n\nfour")
    assert list(read_lines(f)) == [(1, "one"), (2, "two"), (3, "three"), (4, ""), (5, "four")]
    with pytest.raises(UserError, match=r"--queries: .* is a folder, expected a file"):
        read_lines(tmp_path, what="--queries")


def test_unknown_loss_names_closest_before_training(tmp_path, capsys):
    kg = tmp_path / "mini.tsv"
    kg.write_text(MINI)
    t = time.perf_counter()
    assert build_main(["--kg", str(kg), "--out", str(tmp_path / "o"), "--loss", "crossentropi", *TINY]) == 2
    err = one_error_line(capsys)
    assert err.startswith("error: --loss: unknown loss 'crossentropi'; closest known: 'crossentropy'")
    assert build_main(["--kg", str(kg), "--out", str(tmp_path / "o"), "--loss", "bogus", *TINY]) == 2
    assert "unknown loss 'bogus'" in one_error_line(capsys)
    assert time.perf_counter() - t < 30 and sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


def test_drop_edges_that_empties_training_is_refused(tmp_path, capsys):
    kg = tmp_path / "mini.tsv"
    kg.write_text(MINI)
    assert build_main(["--kg", str(kg), "--out", str(tmp_path / "o"), "--drop-edges", "0.99", *TINY]) == 2
    err = one_error_line(capsys)
    assert "no training edges left after --drop-edges 0.99 held out 8 of them; use a smaller --drop-edges" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


@pytest.mark.parametrize("out", [".", "..", "mini.tsv", "mini.tsv/sub/o"])
def test_bad_out_paths_are_refused_before_training(tmp_path, capsys, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", "mini.tsv", "--out", out, *TINY]) == 2
    err = one_error_line(capsys)
    expected = {".": "is the current folder or holds it", "..": "is the current folder or holds it",
                "mini.tsv": "is a file, not a folder", "mini.tsv/sub/o": "mini.tsv' is not a folder"}[out]
    assert expected in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]  # no ..embeddings.npz, no temp folder


@pytest.mark.parametrize("content,message", [
    ("[1, 2]", "meta.json: expected a JSON object, got list"),
    ('{"files": {}}', "has no format_version"),
])
def test_meta_json_of_the_wrong_type(tmp_path, content, message):
    art = small_artifact(tmp_path / "art")
    (art / "meta.json").write_text(content)
    with pytest.raises(UserError, match=message):
        Artifact.load(art, verify=False)


def test_folders_given_as_files(tmp_path, capsys):
    from engine.answer import main as answer_main
    from engine.evaluate import main as evaluate_main
    from engine.sample import main as sample_main

    art = small_artifact(tmp_path / "art")
    assert answer_main(["--artifact", str(art), "--queries", str(tmp_path)]) == 2
    assert one_error_line(capsys).startswith(f"error: --queries: {tmp_path} is a folder, expected a file")
    assert evaluate_main(["--artifact", str(art), "--queries", str(tmp_path), "--no-progress"]) == 2
    assert "is a folder, expected a file" in one_error_line(capsys)
    assert sample_main(["--artifact", str(art), "--out", str(tmp_path), "--no-progress"]) == 2
    assert one_error_line(capsys).startswith(f"error: --out {tmp_path}: is a folder; give a file name")
    assert evaluate_main(["--artifact", str(art), "--queries", "q", "--json", str(tmp_path)]) == 2
    assert "--json" in one_error_line(capsys)


def test_paths_only_reads_a_read_only_artifact(tmp_path, capsys, monkeypatch):
    from engine.paths.__main__ import main as paths_main

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    art = small_artifact(tmp_path / "art")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in art.iterdir()}
    for p in [*art.iterdir(), art]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        argv = ["--artifact", str(art), "--from", "e0", "--plan", "r", "--encoder", "hashing"]
        assert paths_main(argv) == 0
        assert paths_main(argv) == 0  # second run: from the cache
        assert "e1" in capsys.readouterr().out
    finally:
        for p in [art, *art.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in art.iterdir()} == before
    assert len(list((tmp_path / "home" / "relation_embeddings").glob("*.npy"))) == 1


def test_broken_pipe_is_quiet(tmp_path):
    art = small_artifact(tmp_path / "art")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written, as after `| head` exits
    try:
        p = subprocess.run([sys.executable, "-m", "engine.answer", "--artifact", str(art), "--expr", "(p r e0)"],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, env=env_with_root(), timeout=120)
    finally:
        os.close(write_end)
    assert p.returncode == 1 and p.stderr == "", p.stderr


def test_pipe_format_collisions_name_file_and_line(tmp_path):
    f = tmp_path / "kb.txt"
    f.write_text("a|r|b\nx\ty|r|c\n")
    with pytest.raises(UserError, match=rf"^{f}:2: field 1 'x\\ty' contains a tab"):
        load_kg(f)
    f.write_text("a|r|b\nb|q|c\nc|r^-1|a\n")
    with pytest.raises(UserError, match=rf"^{f}:3: relation 'r\^-1' is also the name of the inverse of relation 'r' "
                                        rf"\(relation 'r' first at {f}:1\)"):
        load_kg(f)


@pytest.mark.parametrize("kwargs,message", [
    ('{"bogus": 1}', "encoder 'hashing': got an unexpected keyword argument 'bogus' (it takes dim, seed)"),
    ('{"dim": "x"}', "hashing encoder: dim must be an integer in [1, 65536], got 'x'"),
])
def test_bad_encoder_kwargs(tmp_path, capsys, monkeypatch, kwargs, message):
    from engine.paths.__main__ import main as paths_main

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    art = small_artifact(tmp_path / "art")
    argv = ["--artifact", str(art), "--from", "e0", "--plan", "r", "--encoder", "hashing", "--encoder-kwargs", kwargs]
    assert paths_main(argv) == 2
    assert one_error_line(capsys) == f"error: {message}\n"


# ----------------------------------------------------------------- 4. the sampler hang
@pytest.fixture(scope="module")
def umls_sampling_artifact(umls_tiny_artifact):
    """UMLS's real triples, half the training edges held out (the session's tiny UMLS: the sampler reads triples only)."""
    return umls_tiny_artifact


def test_sampler_stops_when_a_structure_is_exhausted(umls_sampling_artifact, tmp_path, capsys):
    from engine.sample import main as sample_main

    out = tmp_path / "q.jsonl"
    t = time.perf_counter()
    assert sample_main(["--artifact", str(umls_sampling_artifact), "--per-structure", "100000", "--structures", "1p",
                        "--out", str(out), "--no-progress"]) == 0
    seconds = time.perf_counter() - t
    err = capsys.readouterr().err
    lines = out.read_text().splitlines()
    assert 1000 < len(lines) < 100000 and len({json.loads(x)["expr"] for x in lines}) == len(lines)
    assert f"note: structure 1p: {len(lines):,} of 100,000 queries (exhausted: no new query in the last" in err
    assert f"wrote {len(lines):,} queries of 100,000 asked" in err
    assert seconds < 60, seconds  # 4-5 hours before the fix


def test_sampler_verdict_cache_keeps_the_queries(umls_sampling_artifact):
    """Caching verdicts and sizing batches changes the work done, never which queries are drawn."""
    from engine.eval.sampling import QuerySampler

    art = Artifact.load(umls_sampling_artifact, load_embeddings=False)
    s = QuerySampler(art.observed, art.missing, art.num_entities, art.num_relations)
    a = s.sample("2in", 30, seed=4, chunk=256)
    b = QuerySampler(art.observed, art.missing, art.num_entities, art.num_relations).sample("2in", 30, seed=4, chunk=7)
    assert [q.node for q in a] == [q.node for q in b] and len(a) == 30


@pytest.mark.slow
def test_sampler_ctrl_c_keeps_what_was_written(umls_sampling_artifact, tmp_path):
    out = tmp_path / "q.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "engine.sample", "--artifact", str(umls_sampling_artifact),
                          "--per-structure", "100000", "--out", str(out), "--no-progress"],
                         stderr=subprocess.PIPE, text=True, env=env_with_root(),
                         # a shell's background job starts with SIGINT ignored, and children inherit that
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not any(x.stat().st_size > 10_000 for x in tmp_path.glob(".q.jsonl.part-*")):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(x)["structure"] for x in lines)
    assert f"interrupted: kept the {len(lines):,} queries written so far in {out}" in err
    assert [x.name for x in tmp_path.iterdir()] == ["q.jsonl"]


# ----------------------------------------------------------------- 5. quieter wrongs
def test_betae_ids_without_inverse_edges_are_reported(tmp_path):
    d = tmp_path / "betae"
    d.mkdir()
    (d / "train.txt").write_text("0\t0\t1\n1\t1\t2\n2\t0\t3\n")  # relation 1 is not the inverse of 0
    (d / "valid.txt").write_text("")
    (d / "test.txt").write_text("")
    with pytest.raises(UserError, match=r"train\.txt: 3 of 3 edges have no inverse edge \(e\.g\. 0 0 1 without 1 1 0\).*"
                                        r"--kg-format folder"):
        load_kg(d)
    kg = load_kg(d, format="folder")  # the suggested way: ids become names, inverses are added
    assert kg.relations == ("0", "0^-1", "1", "1^-1")


@pytest.mark.parametrize("version,message", [
    (None, "has no format_version .*rebuild it with python -m kge.build --kg test --out"),
    (0, "format version 0 is older than the version 1 .*rebuild it"),
    (FORMAT_VERSION + 1, "is newer than the version 1 this kgreason reads; upgrade kgreason, or rebuild it"),
    ("1", "format_version must be an integer"),
])
def test_format_version_is_checked(tmp_path, version, message):
    art = small_artifact(tmp_path / "art")
    meta = json.loads((art / "meta.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION
    if version is None:
        del meta["format_version"]
    else:
        meta["format_version"] = version
    (art / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactVersionError, match=message):
        Artifact.load(art, verify=False)


def test_meta_without_checksums_needs_verify_false(tmp_path):
    art = small_artifact(tmp_path / "art")
    meta = json.loads((art / "meta.json").read_text())
    del meta["files"]
    (art / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="lists no checksums.*load it with verify=False"):
        Artifact.load(art)
    assert Artifact.load(art, verify=False).num_entities == 6


def test_sigterm_during_default_build_leaves_nothing(tmp_path, monkeypatch):
    from engine.exec import defaults

    monkeypatch.setenv("KGREASON_HOME", str(tmp_path / "home"))
    previous = signal.getsignal(signal.SIGTERM)

    def killed(out: Path):
        (out / "entities.tsv").write_text("0\tx\n")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGTERM did not interrupt the build")

    with pytest.raises(Terminated):
        defaults.default_artifact(builder=killed)
    assert list((tmp_path / "home" / "artifacts").iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigterm_in_a_cli_build_exits_143_and_cleans_up(tmp_path):
    code = ("import os, signal, sys\n"
            "from kgreason.files import OutputFolder\n"
            "from kgreason.errors import cli_main\n"
            "@cli_main\n"
            "def main(argv):\n"
            "    with OutputFolder(argv[0]) as tmp:\n"
            "        (tmp / 'x').write_text('x')\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        signal.pause()\n"
            "sys.exit(main([sys.argv[1]]))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True,
                       env=env_with_root(), timeout=60)
    assert p.returncode == 143 and p.stderr == "terminated\n", p.stderr
    assert list(tmp_path.iterdir()) == []


def test_evaluate_rejects_a_label_that_contradicts_the_expression(tmp_path, capsys):
    from engine.evaluate import main as evaluate_main

    art = small_artifact(tmp_path / "art")
    q = tmp_path / "q.jsonl"
    good = {"structure": "2p", "expr": "(p r (p r e0))", "easy": [], "hard": [2]}
    swapped = {"structure": "2i", "expr": "(i (p r e1) (p r^-1 e3))", "easy": [], "hard": [2]}
    bad = {"structure": "2i", "expr": "(p r (p r e0))", "easy": [], "hard": [2]}
    q.write_text("".join(json.dumps(x) + "\n" for x in (good, swapped, bad)))
    assert evaluate_main(["--artifact", str(art), "--queries", str(q), "--no-progress"]) == 2
    assert one_error_line(capsys) == f"error: {q}:3: structure label '2i' contradicts expr (its shape is 2p)\n"
    q.write_text(json.dumps({**good, "structure": "2q"}) + "\n")
    assert evaluate_main(["--artifact", str(art), "--queries", str(q), "--no-progress"]) == 2
    assert one_error_line(capsys).startswith(f"error: {q}:1: unknown query structure '2q'; closest known:")


# ----------------------------------------------------------------- 6. noise
@pytest.mark.slow
def test_quiet_build_prints_nothing(tmp_path):
    kg = tmp_path / "mini.tsv"
    kg.write_text(MINI)
    p = subprocess.run([sys.executable, "-m", "kge.build", "--kg", str(kg), "--out", str(tmp_path / "o"),
                        "--rank", "4", "--epochs", "1", "--quiet"],
                       capture_output=True, text=True, env=env_with_root(PYTHONWARNINGS="default"), timeout=300)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stderr


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: progress bars are drawn only on one (kgreason.progress)."""

    def isatty(self) -> bool:
        return True


def test_training_progress_moves_per_batch(tmp_path, monkeypatch):
    from kge.train import TrainConfig, train_complex

    f = tmp_path / "kg.tsv"
    f.write_text("".join(f"e{i}\tr{i % 3}\te{(i * 7 + 1) % 40}\n" for i in range(120)))
    monkeypatch.setattr(sys, "stderr", _Terminal())
    train_complex(load_kg(f), TrainConfig(rank=2, epochs=1, batch_size=16, eval_max_triples=0, device="cpu",
                                          training_loop="slcwa"), progress=True)
    err = sys.stderr.getvalue()
    assert "Training batches on cpu:   0%|          | 0.00/15.0" in err  # a bar over 240 edges / 16 per batch
    assert "Warning" not in err and "WARNING" not in err


def test_1n_training_progress_moves_per_batch(tmp_path, monkeypatch):
    from kge.train import TrainConfig, train_complex

    f = tmp_path / "kg.tsv"
    f.write_text("".join(f"e{i}\tr{i % 3}\te{(i * 7 + 1) % 40}\n" for i in range(120)))
    monkeypatch.setattr(sys, "stderr", _Terminal())
    train_complex(load_kg(f), TrainConfig(rank=2, epochs=2, batch_size=16, eval_max_triples=0, device="cpu",
                                          training_loop="1n", optimizer="adagrad"), progress=True)
    err = sys.stderr.getvalue()
    assert "epoch 1/2:   0%|          | 0/15" in err  # a bar per epoch over 240 edges / 16 per batch
    assert "epoch 2/2: 100%|##########| 15/15" in err or "epoch 2/2: 100%|██████████| 15/15" in err
    assert "Warning" not in err and "WARNING" not in err


def test_training_progress_in_a_log_is_plain_lines(tmp_path, capsys):
    """Regression: with stderr in a file the epoch bars filled it with carriage returns (319 in the log of a
    first `engine.answer --query pin`, which builds UMLS)."""
    from kge.train import TrainConfig, train_complex

    f = tmp_path / "kg.tsv"
    f.write_text("".join(f"e{i}\tr{i % 3}\te{(i * 7 + 1) % 40}\n" for i in range(120)))
    train_complex(load_kg(f), TrainConfig(rank=2, epochs=2, batch_size=16, eval_max_triples=0, device="cpu"),
                  progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err, err
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 1", "epoch 2", "epoch 2/2"], err
    assert lines[2].startswith("epoch 2/2: 15/15 batch (100%), done in "), err
    train_complex(load_kg(f), TrainConfig(rank=2, epochs=1, batch_size=16, eval_max_triples=0, device="cpu",
                                          training_loop="slcwa"), progress=True)
    assert "\r" not in capsys.readouterr().err  # pykeen's own bars: on a terminal only


# ----------------------------------------------------------------- the shared helpers
def test_open_output_is_atomic_and_keeps_partial_streams(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with open_output(target) as f:
            f.write("new\n")
            raise RuntimeError("boom")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(KeyboardInterrupt):
        with open_output(target, keep_partial=True) as f:
            f.write("line 1\n")
            raise KeyboardInterrupt
    assert target.read_text() == "line 1\n" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_output_folder_commit_refuses_a_folder_that_appeared(tmp_path):
    from kgreason.files import OutputExists

    out = tmp_path / "o"
    with pytest.raises(OutputExists):
        with OutputFolder(out) as tmp:
            (tmp / "meta.json").write_text('{"files": {}}')
            out.mkdir()
            (out / "theirs").write_text("x")  # someone else's file, written during the build
    assert [p.name for p in out.iterdir()] == ["theirs"] and sorted(p.name for p in tmp_path.iterdir()) == ["o"]


# ----------------------------------------------------------------- fuzz findings F3-F10 (tests/test_fuzz_cli.py)
def _cli_mains():
    from engine.answer import main as answer_main
    from engine.betae import main as betae_main
    from engine.evaluate import main as evaluate_main
    from engine.paths.__main__ import main as paths_main
    from engine.sample import main as sample_main
    from experiments.simulate import main as simulate_main

    return {"engine.answer": answer_main, "engine.evaluate": evaluate_main, "engine.sample": sample_main,
            "engine.betae": betae_main, "engine.paths": paths_main, "kge.build": build_main,
            "experiments.simulate": simulate_main}


def test_build_creates_missing_parents_of_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mini.tsv").write_text(MINI)
    # a failing build removes the parents it created
    assert build_main(["--kg", "mini.tsv", "--out", "missing/parent/o", "--drop-edges", "0.99", *TINY]) == 2
    assert "no training edges left" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]
    assert build_main(["--kg", "mini.tsv", "--out", "missing/parent/o", *TINY]) == 0
    assert (tmp_path / "missing" / "parent" / "o" / "meta.json").is_file()
    assert sorted(p.name for p in (tmp_path / "missing" / "parent").iterdir()) == ["o"]  # no checkpoint left
    # the refusal to replace an artifact without --overwrite stays
    assert build_main(["--kg", "mini.tsv", "--out", "missing/parent/o", *TINY]) == 2
    assert "already holds an artifact; pass --overwrite" in one_error_line(capsys)


@pytest.mark.parametrize("lr", ["1e30", "7e16", "inf", "nan", "0", "-1"])
def test_f3_absurd_lr_is_refused_before_training(tmp_path, capsys, lr):
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), "--lr", lr, *TINY]) == 2
    assert "--lr must be in (0, 10]" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


def test_f3_diverging_training_is_one_error_line(tmp_path, capsys, monkeypatch):
    import pykeen.pipeline
    from pykeen.training.training_loop import NonFiniteLossError

    def diverge(**kwargs):
        raise NonFiniteLossError("Loss is nan.")

    monkeypatch.setattr(pykeen.pipeline, "pipeline", diverge)
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), "--lr", "5", *TINY,
                       "--training-loop", "lcwa"]) == 2
    err = one_error_line(capsys)
    assert "training diverged" in err and "try a smaller --lr (e.g. 0.5)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


def test_f3_diverging_1n_training_is_one_error_line(tmp_path, capsys, monkeypatch):
    import torch

    import kge.complex_n3

    real = kge.complex_n3.batch_loss

    def diverge(*args, **kwargs):
        loss, ce, n3 = real(*args, **kwargs)
        return loss * torch.tensor(float("nan")), ce, n3

    monkeypatch.setattr(kge.complex_n3, "batch_loss", diverge)
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), "--lr", "5", *TINY]) == 2
    err = one_error_line(capsys)
    assert "training diverged (the loss became nan) at --lr 5; try a smaller --lr (e.g. 0.5)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


def test_f4_printable_escapes_control_characters():
    from kgreason.cli import printable

    assert printable("plain é text") == "plain é text"
    assert printable("a\rb\u2028c\x00\x1b[2J\n") == "a\\rb\\u2028c\\x00\\x1b[2J\\n"


@pytest.mark.parametrize("cli", ["engine.answer", "engine.evaluate", "engine.sample", "engine.betae", "engine.paths",
                                 "kge.build", "experiments.simulate"])
def test_f4_unrecognized_arguments_are_escaped(capsys, cli):
    required = {"engine.answer": [], "engine.evaluate": ["--artifact", "a"], "engine.sample": ["--artifact", "a", "--out", "o"],
                "engine.betae": ["--queries", "q", "--folder", "f"], "engine.paths": ["--artifact", "a", "--from", "e", "--plan", "r"],
                "kge.build": ["--kg", "k", "--out", "o"], "experiments.simulate": ["--artifact", "a"]}[cli]
    assert _cli_mains()[cli]([*required, "--bogus\x1b[2J", "a\rb\u2028c"]) == 2
    err = one_error_line(capsys)
    message = err.partition("error: ")[2].rstrip("\n")
    assert message.isprintable(), err
    assert "unrecognized arguments: --bogus\\x1b[2J a\\rb\\u2028c" in message, err


@pytest.mark.parametrize("value", ["\x1e", "\x1f", "a\nb", "\u2028", "\t"])
def test_f4_every_user_error_is_printed_escaped(capsys, value):
    from engine.answer import main as answer_main

    # found by the slow fuzz profile: engine.answer's own check quoted --query raw
    assert answer_main(["--query", value, "--anchors", "a"]) == 2
    err = one_error_line(capsys)
    assert err.rstrip("\n").isprintable() and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --query {repr(value)[1:-1]}: give both --anchors and --relations"), err


def test_f4_parse_error_caret_lines_survive_escaping():
    from kgreason.errors import _error_lines

    assert _error_lines("q:1:3: bad\n  (p r e)\n    ^") == "q:1:3: bad\n  (p r e)\n    ^"
    assert _error_lines("x\ny\x1b") == "x\\ny\\x1b"


def test_outputs_inside_inputs_are_refused(tmp_path, capsys):
    from engine.evaluate import main as evaluate_main
    from engine.sample import main as sample_main

    art = small_artifact(tmp_path / "art")
    before = snapshot(art)
    assert sample_main(["--artifact", str(art), "--out", str(art / "meta.json"), "--no-progress"]) == 2
    assert f"--out {art / 'meta.json'}: is inside the --artifact folder {str(art)!r}" in one_error_line(capsys)
    assert sample_main(["--artifact", str(art), "--out", str(art / "new.jsonl"), "--no-progress"]) == 2
    assert "is inside the --artifact folder" in one_error_line(capsys)
    q = tmp_path / "q.jsonl"
    q.write_text("")
    assert evaluate_main(["--artifact", str(art), "--queries", str(q), "--json", str(q)]) == 2
    assert f"--json {q}: is the --queries input {str(q)!r}" in one_error_line(capsys)
    assert snapshot(art) == before and q.read_text() == ""


def _deep_pickle(levels: int) -> bytes:
    """A BetaE-style pickle whose structure key nests ``levels`` tuples deep."""
    return (b"\x80\x04}X\x01\x00\x00\x00e\x85" + b"X\x01\x00\x00\x00r\x85\x86" * levels
            + b"\x8f(J\x01\x00\x00\x00\x90s.")


def test_f5_deep_pickle_is_refused_without_crashing(tmp_path):
    # 200,000 levels crashed the interpreter (hashing the key recursed in C): run it in a child process.
    p = tmp_path / "deep.pkl"
    p.write_bytes(_deep_pickle(200_000))
    code = ("import sys\nfrom kge.safe_pickle import safe_load\nfrom kgreason.errors import UserError\n"
            f"try:\n    safe_load({str(p)!r})\nexcept UserError as e:\n    print(e)\n    sys.exit(3)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_with_root(), timeout=120)
    assert res.returncode == 3, (res.returncode, res.stderr[-2000:])
    assert res.stdout.strip() == f"{p}: refused pickle: containers nest deeper than 100 levels"


def test_f5_nesting_depth_limit_and_ordinary_pickles(tmp_path):
    import pickle

    from kge.safe_pickle import MAX_DEPTH, nesting_depth, safe_load

    for obj, depth in [(1, 0), ([], 1), ({"a": [1, [2]]}, 3), ({frozenset({(1, (2,))})}, 4),
                       ({("e", ("r",)): {(5, (3,))}}, 3)]:
        for proto in (2, 4, 5):
            assert nesting_depth(pickle.dumps(obj, protocol=proto)) >= depth
    nested: object = "x"
    for _ in range(MAX_DEPTH - 1):
        nested = (nested,)
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps([nested]))  # exactly MAX_DEPTH levels
    assert safe_load(tmp_path / "ok.pkl") == [nested]
    (tmp_path / "deep.pkl").write_bytes(pickle.dumps([[nested]]))
    with pytest.raises(UserError, match=f"deep.pkl: refused pickle: containers nest deeper than {MAX_DEPTH} levels"):
        safe_load(tmp_path / "deep.pkl")
    # A MARK that POP discards (valid: protocol 0 writes it for recursive tuples) does not end the scan early.
    (tmp_path / "popmark.pkl").write_bytes(b"\x80\x04(0" + _deep_pickle(300)[2:])
    with pytest.raises(UserError, match="nest deeper than"):
        safe_load(tmp_path / "popmark.pkl")
    t: tuple = ([],)
    t[0].append(t)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / "rec.pkl").write_bytes(pickle.dumps({"t": t}, protocol=proto))
        assert safe_load(tmp_path / "rec.pkl")["t"][0][0][0] is not None
    (tmp_path / "trunc.pkl").write_bytes(pickle.dumps({"a": [1, 2]})[:-3])
    with pytest.raises(UserError, match="trunc.pkl: refused or unreadable pickle"):
        safe_load(tmp_path / "trunc.pkl")


def test_f6_deep_betae_pickle_is_one_error_line(tmp_path, capsys):
    from engine.betae import main as betae_main

    (tmp_path / "deep.pkl").write_bytes(_deep_pickle(2000))
    folder = tmp_path / "betae"
    folder.mkdir()
    for name in ("train", "valid", "test"):
        (folder / f"{name}.txt").write_text("0\t0\t1\n1\t1\t0\n")
    assert betae_main(["--queries", str(tmp_path / "deep.pkl"), "--folder", str(folder), "--no-progress"]) == 2
    assert "nest deeper than" in one_error_line(capsys)


def test_f6_messages_show_pickled_objects_bounded():
    from engine.eval.betae import _short_repr

    deep: object = 1
    for _ in range(50_000):
        deep = (deep,)
    text = _short_repr(deep)
    assert len(text) < 100 and "..." in text
    assert len(_short_repr(KeyError(deep))) < 100
    assert _short_repr(ValueError("bad id 7")) == "bad id 7"


@pytest.mark.parametrize("device", ["meta", "mps", "bogus", "cpu:0", "", "CUDA"])
def test_f7_unknown_devices_are_refused_at_parse_time(tmp_path, capsys, device):
    from engine.answer import main as answer_main
    from engine.evaluate import main as evaluate_main

    art = small_artifact(tmp_path / "art")
    assert answer_main(["--artifact", str(art), "--expr", "e0", "--device", device]) == 2
    assert f"error: --device: unknown device {device!r}; choose from cpu, cuda, cuda:N" in one_error_line(capsys)
    (tmp_path / "q.jsonl").write_text("")
    assert evaluate_main(["--artifact", str(art), "--queries", str(tmp_path / "q.jsonl"), "--device", device]) == 2
    assert "choose from cpu, cuda, cuda:N" in one_error_line(capsys)
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), "--device", device, *TINY]) == 2
    assert "choose from auto, cpu, cuda, cuda:N" in one_error_line(capsys)


def test_f7_cuda_devices_need_cuda(tmp_path, capsys):
    import torch

    from engine.answer import main as answer_main
    from kgreason.cli import check_device

    art = small_artifact(tmp_path / "art")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert answer_main(["--artifact", str(art), "--expr", "e0", "--device", f"cuda:{n}"]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"error: --device cuda:{n}: ")
    assert ("CUDA is not available" in err) if n == 0 else ("no such CUDA device" in err)
    assert check_device("cpu") == "cpu" and check_device("auto", allow_auto=True) == "auto"
    from engine.exec.executor import Executor

    with pytest.raises(UserError, match="runs on cpu or cuda"):
        Executor(Artifact.load(art), device="meta")


@pytest.mark.parametrize("seed", ["-1", "-5", str(2**32), "99999999999999999999999"])
def test_f8_bad_seeds_are_one_error_line(tmp_path, capsys, seed):
    from engine.answer import main as answer_main
    from engine.sample import main as sample_main
    from experiments.simulate import main as simulate_main

    art = small_artifact(tmp_path / "art")
    expected = f"error: --seed must be in [0, 4294967295], got {int(seed)}\n"
    (tmp_path / "mini.tsv").write_text(MINI)
    for main, argv in [
        (answer_main, ["--artifact", str(art), "--query", "1p"]),
        (sample_main, ["--artifact", str(art), "--out", str(tmp_path / "q.jsonl"), "--no-progress"]),
        (build_main, ["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), *TINY]),
        (simulate_main, ["--artifact", str(art)]),
    ]:
        assert main([*argv, "--seed", seed]) == 2
        assert one_error_line(capsys) == expected, main
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "mini.tsv"]


@pytest.mark.parametrize("gb", ["inf", "nan", "1e-163", "1e300", "0", "-1"])
def test_f10_max_matrix_gb_out_of_range(tmp_path, capsys, gb):
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), "--max-matrix-gb", gb,
                       *TINY]) == 2
    assert "--max-matrix-gb must be in [0.000976562, 1.04858e+06]" in one_error_line(capsys)


def test_simulator_reads_artifacts_through_kge_artifact(tmp_path, capsys):
    from experiments.simulate import KnowledgeBase, main as simulate_main

    art = small_artifact(tmp_path / "art")
    assert len(KnowledgeBase.from_artifact(art).entities) == 6
    (art / "meta.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="meta.json: expected a JSON object, got list"):
        KnowledgeBase.from_artifact(art)
    assert simulate_main(["--artifact", str(art), "--port", "0"]) == 2
    assert "meta.json: expected a JSON object, got list" in one_error_line(capsys)
    with pytest.raises(UserError, match="does not exist"):
        KnowledgeBase.from_artifact(tmp_path / "nope")


def test_sampler_checks_negation_with_the_shared_check():
    from engine.eval.sampling import QuerySampler

    obs = np.array([[0, 0, 1], [1, 1, 0]])
    with pytest.raises(UserError, match="unknown negation mode 'bogus'; expected one of qto, complement"):
        QuerySampler(obs, obs[:1], 2, 2, negation="bogus")


def test_kg_format_choices_come_from_the_loader_registry():
    from kge.build import _parser
    from kge.graph import LOADERS

    action = next(a for a in _parser()._actions if a.dest == "kg_format")
    assert list(action.choices) == list(LOADERS)


def test_caches_point_into_the_test_session(tmp_path):
    home = Path.home()
    for var in ("KGREASON_HOME", "XDG_CACHE_HOME"):
        value = Path(os.environ[var])
        assert home / ".cache" not in [value, *value.parents], (var, value)
    from llm_bridge.config import default_cache_path

    assert Path(os.environ["KGREASON_HOME"]) in default_cache_path().parents  # every cache under KGREASON_HOME


def test_interrupts_deferred_delivers_ctrl_c_after_the_block(request):
    """A Ctrl-C inside the block lands as KeyboardInterrupt after it: the block's work is never cut in half."""
    import os as _os

    from kgreason.files import interrupts_deferred

    done = []
    # pytest started as a shell's background job inherits SIGINT ignored: test from Python's default handler
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, saved))
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            _os.kill(_os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run (deferred) by now
            done.append("whole")
    assert done == ["whole"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts_deferred():  # no signal: nothing raised
        done.append("again")
    assert done == ["whole", "again"]


@pytest.mark.parametrize("loop,optimizer,message", [
    ("lcwa", "0", "--optimizer: unknown optimizer '0'"),
    ("slcwa", "adamm", "--optimizer: unknown optimizer 'adamm'; closest known: 'adam'"),
    ("1n", "sgd", "--optimizer: unknown optimizer 'sgd'"),
])
def test_f11_unknown_optimizer_is_refused_before_training(tmp_path, capsys, loop, optimizer, message):
    """Fuzz finding F11: pykeen's KeyError for an unknown optimizer name escaped as a traceback."""
    (tmp_path / "mini.tsv").write_text(MINI)
    assert build_main(["--kg", str(tmp_path / "mini.tsv"), "--out", str(tmp_path / "o"), *TINY,
                       "--training-loop", loop, "--optimizer", optimizer]) == 2
    assert message in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mini.tsv"]


@pytest.mark.parametrize("flag", ["--artifact", "--json"])
def test_nul_byte_in_a_path_is_one_error_line(tmp_path, capsys, monkeypatch, flag):
    """A NUL byte in an input or output path (fuzz finding: os.path.realpath raised a bare ValueError)."""
    from engine.evaluate import main as evaluate_main

    monkeypatch.chdir(tmp_path)
    argv = {"--artifact": ["--artifact", "\x00", "--json", "out.json"],
            "--json": ["--artifact", "a", "--json", "o\x00.json"]}[flag]
    assert evaluate_main(["--queries", "q.jsonl", *argv]) == 2
    err = one_error_line(capsys)
    assert flag in err and "NUL byte" in err
    assert list(tmp_path.iterdir()) == []


def test_output_path_through_a_missing_folder_is_one_error(tmp_path, monkeypatch):
    """F12: ``x/../o.json`` with ``x`` missing passed the (lexical) parent check and then failed at the
    final rename, a FileNotFoundError traceback after all the work.  Now refused before any work."""
    monkeypatch.chdir(tmp_path)
    for path in ["x/../o.json", "x/y/../../o.json", "x/../../" + tmp_path.name + "/o.json"]:
        with pytest.raises(UserError, match="goes through 'x', which is not an existing folder"):
            with open_output(path, what="--json") as f:
                f.write("never")
        with pytest.raises(UserError, match="not an existing folder"):
            check_output_folder(path, what="--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "x").mkdir()
    with open_output("x/../o.json") as f:  # through a folder that exists: fine, as the OS resolves it
        f.write("ok")
    assert (tmp_path / "o.json").read_text() == "ok"
