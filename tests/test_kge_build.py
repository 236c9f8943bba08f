"""End-to-end build: CLI on UMLS (tiny training), artifact contents, round trip, CLI errors."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from kge import Artifact
from kge.build import BuildConfig, build_artifact, main, summarize
from kge.calibrate import calibrated_rows_reference
from kgreason.errors import UserError

TINY = ["--rank", "8", "--epochs", "2", "--batch-size", "512", "--eval-max-triples", "200", "--quiet"]


@pytest.fixture(scope="module")
def umls_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "umls"
    rc = main(["--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--seed", "3", *TINY])
    assert rc == 0
    return out


def test_cli_end_to_end(umls_artifact, capsys):
    art = Artifact.load(umls_artifact)  # verifies every checksum
    assert art.num_entities == 135 and art.num_relations == 92
    assert art.relations[1] == art.relations[0] + "^-1"
    meta = art.meta
    assert meta["source"] == "pykeen:umls"
    assert meta["build_config"]["drop_edges"] == 0.5 and meta["train_config"]["rank"] == 8
    assert meta["train_config"]["epochs"] == 2 and len(meta["train"]["losses"]) == 2
    assert 0 < meta["train"]["mrr"] <= 1 and meta["train"]["eval_triples"] == 200
    assert set(meta["timings_s"]) == {"load", "drop_edges", "train", "estimate_nnz", "calibrate", "save"}
    assert meta["versions"]["pykeen"] and meta["peak_rss_bytes"] > 0
    # LGOT protocol: half of the 10,432 training edges (pairs kept together) are missing
    assert len(art.observed) == 10432 // 2
    assert len(art.missing) == 10432 // 2 + 1304 + 1322
    for name in ("entities.tsv", "relations.tsv", "matrices.npz", "embeddings.npz", "observed.tsv", "missing.tsv"):
        assert name in meta["files"]
    text = summarize(art)
    for word in ("entities      135", "relations     92", "observed      5,216", "nnz", "MRR", "peak memory", "calibrate"):
        assert word in text


def test_matrices_equal_formula_from_embeddings(umls_artifact):
    art = Artifact.load(umls_artifact)
    ent, rel = art.embeddings["entity"], art.embeddings["relation"]
    assert ent.dtype == np.complex64 and ent.shape == (135, 8) and rel.shape == (92, 8)
    threshold, delta = art.meta["calibration"]["threshold"], art.meta["calibration"]["delta"]
    n = art.num_entities
    rng = np.random.default_rng()
    rows = rng.choice(n * art.num_relations, size=60, replace=False)
    rows = np.concatenate([rows, art.observed[:5, 1] * n + art.observed[:5, 0]])  # rows with observed edges too
    ref = calibrated_rows_reference(ent, rel, art.observed, rows, threshold=threshold, delta=delta)
    got = art.matrices[rows].toarray()
    near_cut = np.abs(ref - threshold) < 1e-3 * threshold
    diff = np.abs(ref - got)
    diff[near_cut & ((ref == 0) | (got == 0))] = 0.0
    assert diff.max() < 1e-5
    o = art.observed
    assert np.all(np.asarray(art.matrices[o[:, 1] * n + o[:, 0], o[:, 2]]).ravel() == 1.0)
    assert art.matrices.data.max() <= 1.0 and art.matrices.data.min() >= threshold * (1 - 1e-4)


def test_round_trip_and_checksum_mismatch(umls_artifact, tmp_path):
    art = Artifact.load(umls_artifact)
    copy = tmp_path / "copy"
    art.save(copy)
    back = Artifact.load(copy)
    assert back.entities == art.entities and back.relations == art.relations
    assert (back.matrices != art.matrices).nnz == 0
    np.testing.assert_array_equal(back.embeddings["entity"], art.embeddings["entity"])
    np.testing.assert_array_equal(back.observed, art.observed)
    with open(copy / "observed.tsv", "a") as f:
        f.write("0\t0\t0\n")
    with pytest.raises(UserError, match=r"checksum mismatch for 'observed\.tsv'"):
        Artifact.load(copy)


def test_build_artifact_library_call_replaces_atomically(tmp_path):
    out = tmp_path / "nations"
    cfg = BuildConfig(kg="nations", out=str(out), train=dict(rank=4, epochs=1, eval_max_triples=0))
    a = build_artifact(cfg, progress=False)
    assert a.path == out and (out / "meta.json").is_file()
    # the overrides reach training; everything else is the (small) preset, i.e. TrainConfig's defaults
    from kge.train import TrainConfig

    expected = dataclasses.asdict(TrainConfig(rank=4, epochs=1, eval_max_triples=0, device="auto"))
    assert a.meta["train_config"] == expected and a.meta["size_preset"] == "small"
    with pytest.raises(UserError, match="already holds an artifact; pass --overwrite"):
        build_artifact(cfg, progress=False)  # never replaced silently
    b = build_artifact(dataclasses.replace(cfg, overwrite=True), progress=False)  # rebuilding over it
    assert Artifact.load(out).meta["files"] == b.meta["files"]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "nations"]
    assert leftovers == []
    assert json.loads((out / "meta.json").read_text())["num_entities"] == 14


#: meta.json's ``build_config`` keys as every earlier build wrote them (BuildConfig's flat fields before the
#: training settings moved to kge.train.TrainConfig): old artifacts and rebuild commands depend on them.
BUILD_CONFIG_KEYS = ["kg", "out", "kg_format", "drop_edges", "seed", "rank", "epochs", "lr", "batch_size",
                     "num_negatives", "regularizer_weight", "training_loop", "optimizer", "train_minutes", "precision",
                     "candidates", "loss", "eval_max_triples", "threshold", "max_matrix_gb", "matrices",
                     "max_calibrate_minutes", "memory_check", "row_cache_gb", "delta", "chunk_rows", "device",
                     "embeddings", "overwrite"]
#: Keys added since (an older meta.json lacks them: its rebuild command takes their defaults).
ADDED_KEYS = {"expected_queries": "max_calibrate_minutes"}  # key: the key it follows


def _current_keys() -> list[str]:
    keys = list(BUILD_CONFIG_KEYS)
    for key, after in ADDED_KEYS.items():
        keys.insert(keys.index(after) + 1, key)
    return keys


def test_build_config_composes_the_training_config(umls_artifact):
    """BuildConfig declares no training field of its own (seed and device serve the whole build)."""
    from kge.build import TRAIN_FLAGS, flat_defaults, parse_args
    from kge.train import TrainConfig

    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {f.name for f in dataclasses.fields(BuildConfig)} & train_fields == {"seed", "device"}
    assert set(TRAIN_FLAGS) <= train_fields
    assert list(flat_defaults()) == _current_keys()[2:]  # all but the required kg and out
    meta = Artifact.load(umls_artifact).meta
    assert sorted(meta["build_config"]) == sorted(_current_keys())  # meta.json sorts its keys
    assert meta["build_config"]["rank"] == 8 and meta["build_config"]["lr"] is None
    cfg, _ = parse_args(["--kg", "umls", "--out", "o", "--rank", "8", "--loss", "crossentropy", "--lr", "0.05"])
    assert cfg.train == {"rank": 8, "loss": "crossentropy", "lr": 0.05}
    assert BuildConfig.from_flat(cfg.to_json()) == cfg
    assert BuildConfig(kg="k", out="o", train=dict(rank=None, lr=0.2)).train == {"lr": 0.2}  # None: the preset's
    with pytest.raises(UserError, match=r"^BuildConfig.train: unknown training setting 'init_sdt'"):
        BuildConfig(kg="k", out="o", train=dict(init_sdt=1.0))
    with pytest.raises(UserError, match=r"^BuildConfig.train: device is a BuildConfig field"):
        BuildConfig(kg="k", out="o", train=dict(device="cpu"))


def test_old_meta_json_rebuild_command_still_parses():
    """A build_config written before the move (eval_max_triples 5000 recorded, flat training keys) rebuilds."""
    import shlex

    from kge.artifact import rebuild_command
    from kge.build import parse_args

    old = dict.fromkeys(BUILD_CONFIG_KEYS)
    old.update(kg="umls", out="artifacts/umls", drop_edges=0.5, seed=3, rank=8, epochs=2, batch_size=512,
               eval_max_triples=5000, max_matrix_gb=1.25, matrices="auto", max_calibrate_minutes=30.0,
               memory_check=True, row_cache_gb=1.0, delta=1e-4, device="auto", overwrite=False)
    cmd = rebuild_command("/x/umls", {"build_config": old})
    for part in ("--rank 8", "--epochs 2", "--batch-size 512", "--drop-edges 0.5", "--seed 3",
                 "--eval-max-triples 5000"):
        assert part in cmd, cmd
    cfg, _ = parse_args(shlex.split(cmd)[3:])
    assert cfg.train == {"rank": 8, "epochs": 2, "batch_size": 512, "eval_max_triples": 5000}
    assert cfg.seed == 3 and cfg.drop_edges == 0.5 and cfg.overwrite


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--kg", "no/such/file.tsv", "--out", "x"], "error: no/such/file.tsv: file or folder not found"),
        (["--kg", "umsl", "--out", "x"], "error: unknown dataset 'umsl'; known pykeen datasets (closest first): umls, "),
        (["--kg", "umls", "--out", "x", "--drop-edges", "1.5"], "error: --drop-edges must be in [0, 1), got 1.5"),
        (["--kg", "umls", "--out", "x", "--threshold", "0"], "error: --threshold must be in (0, 1), got 0.0"),
        (["--kg", "umls"], "error: the following arguments are required: --out"),
        (["--kg", "umls", "--out", "x", "--rank", "many"], "error: argument --rank: invalid int value: 'many'"),
        (["--kg", "umls", "--out", "x", "--rank", "0"], "error: --rank must be >= 1, got 0"),
        (["--kg", "umls", "--out", "x", "--max-calibrate-minutes", "0"],
         "error: --max-calibrate-minutes must be in (0, 1e9], got 0.0"),
        (["--kg", "umls", "--out", "x", "--max-calibrate-minutes", "nan"],
         "error: --max-calibrate-minutes must be in (0, 1e9], got nan"),
        (["--kg", "umls", "--out", "x", "--matrices", "sometimes"], "error: argument --matrices: invalid choice: 'sometimes'"),
        (["--kg", "umls", "--out", "x", "--expected-queries", "-1"],
         "error: --expected-queries must be an integer in [0, 1e12], got -1"),
        (["--kg", "umls", "--out", "x", "--expected-queries", "1e3"],
         "error: argument --expected-queries: invalid int value: '1e3'"),
    ],
)
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path):
    argv = [a if a != "x" else str(tmp_path / "x") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_malformed_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tr\tb\nc\tr d\n")
    assert main(["--kg", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == f"error: {bad}:2: expected 3 tab-separated fields, got 2: 'c\\tr d'\n"


# ------------------------------------------------------------------ --matrices auto (the default) and memory


def _reuse(umls_artifact, tmp_path, *extra):
    """kge.build over UMLS reusing the fixture's embeddings (no training): fast, and the same KG."""
    return ["--kg", "umls", "--out", str(tmp_path / "o"), "--drop-edges", "0.5", "--seed", "3",
            "--embeddings", str(umls_artifact), *extra]


def test_auto_is_the_default_and_picks_eager_for_a_small_kg(umls_artifact):
    meta = Artifact.load(umls_artifact).meta
    assert meta["build_config"]["matrices"] == "auto" and meta["matrices"] == "eager"
    choice = meta["calibration"]["matrices_choice"]
    assert choice["mode"] == "eager" and choice["rows"] == 135 * 92 and choice["rank"] == 8
    # the rate was measured on this KG's rows (the real fused op) and the estimate follows from it
    rate = choice["rate_measurement"]
    assert choice["rate_source"] == "measured" and rate["runs"] >= 1 and 16 <= rate["rows"] <= 135 * 92
    assert choice["measured_gflops"] == pytest.approx(rate["gflops"], rel=1e-3) and rate["gflops"] > 0
    assert choice["estimated_minutes"] == pytest.approx(2.0 * 12420 * 16 * 135 / (rate["gflops"] * 1e9) / 60,
                                                        rel=1e-2, abs=1e-4)
    # UMLS decides far from every bound: no rate within a factor 2 of the measured one could flip it
    assert choice["expected_queries"] == 14000 and not choice["machine_dependent"]
    assert choice["time_margin"] is None  # 14,000 queries x ~136 rows cost more than the 12,420 rows
    assert 0 < choice["nnz_estimate"] and choice["matrices_bytes"] == 8 * choice["nnz_estimate"]
    line = meta["calibration"]["nnz_estimate"]["message"]
    assert line.startswith("--matrices auto: eager (calibrating 12,420 rows x 135 entities at rank 8: ~") and \
        " GFLOP/s measured <= ~" in line and " of lazy rows for 14,000 expected queries (~" in line
    assert meta["memory_estimate"]["total_bytes"] > meta["memory_estimate"]["base"] > 0


def test_auto_picks_lazy_when_the_calibration_would_take_too_long(umls_artifact, tmp_path, capsys):
    # no queries expected and a bound of 60 microseconds: the measured calibration (~0.05 s) is longer
    assert main(_reuse(umls_artifact, tmp_path, "--max-calibrate-minutes", "1e-6", "--expected-queries", "0")) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("--matrices auto:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("--matrices auto: lazy (calibrating 12,420 rows x 135 entities at rank 8: ~")
    assert " GFLOP/s measured > ~0 s of lazy rows for 0 expected queries (~" in lines[0]
    assert "+ --max-calibrate-minutes 1e-06; ~" in lines[0] and "<= --max-matrix-gb 1.25" in lines[0]
    art = Artifact.load(tmp_path / "o")
    assert art.is_lazy and not (tmp_path / "o" / "matrices.npz").exists()
    choice = art.meta["calibration"]["matrices_choice"]
    assert choice["mode"] == "lazy" and choice["expected_queries"] == 0 and choice["query_minutes"] == 0
    assert art.meta["build_config"]["expected_queries"] == 0
    assert art.meta["calibration"]["threshold"] == 2e-4  # a lazy build never raises it


def test_auto_picks_lazy_when_the_matrices_exceed_the_budget_or_the_memory(umls_artifact, tmp_path, capsys,
                                                                           monkeypatch):
    import kge.builder

    # UMLS's eager matrices at 2e-4 hold ~1.7 M entries (13 MiB): over a 1 MiB budget; one expected query
    # computes ~140 of its 12,420 rows lazily: not worth raising the threshold
    assert main(_reuse(umls_artifact, tmp_path, "--max-matrix-gb", str(2.0**-10), "--expected-queries", "1")) == 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("--matrices auto:"))
    assert line.startswith("--matrices auto: lazy (calibrating") and "> --max-matrix-gb 0.000976562, x2.5" in line
    assert Artifact.load(tmp_path / "o").is_lazy
    # the default 14,000 expected queries would compute every row many times over: eager, the threshold raised to
    # fit (as an eager build raises it), said in the line and recorded
    assert main(_reuse(umls_artifact, tmp_path, "--max-matrix-gb", str(2.0**-10), "--overwrite")) == 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("--matrices auto:"))
    assert line.startswith("--matrices auto: eager at threshold ") and "raised from 0.0002 to fit" in line, line
    art = Artifact.load(tmp_path / "o")
    assert not art.is_lazy and art.meta["calibration"]["threshold"] > 2e-4
    assert art.meta["calibration"]["matrices_choice"]["raised_threshold"] is not None
    assert art.matrices.nnz * 8 <= 2.0**-10 * (1 << 30)
    # within the budget, but 2.5 x 13 MiB is more than the (injected) 20 MiB available
    monkeypatch.setattr(kge.builder, "available_memory_bytes", lambda: 20 << 20)
    assert main(_reuse(umls_artifact, tmp_path, "--overwrite", "--no-memory-check")) == 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("--matrices auto:"))
    assert line.endswith(", x2.5 at peak > 20.0 MiB available)"), line
    assert Artifact.load(tmp_path / "o").is_lazy
    # --matrices eager forces it whatever the estimates say
    assert main(_reuse(umls_artifact, tmp_path, "--overwrite", "--no-memory-check", "--matrices", "eager",
                       "--max-calibrate-minutes", "1e-6", "--quiet")) == 0
    art = Artifact.load(tmp_path / "o")
    assert not art.is_lazy and art.meta["calibration"]["matrices_choice"] == {"mode": "eager",
                                                                              "forced_by": "--matrices eager"}


def test_memory_estimate_over_available_is_one_line_refusal(tmp_path, capsys, monkeypatch):
    import kge.builder

    monkeypatch.setattr(kge.builder, "available_memory_bytes", lambda: 300 << 20)
    out = tmp_path / "o"
    assert main(["--kg", "umls", "--out", str(out), "--rank", "8", "--epochs", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: --kg umls: the build needs an estimated ")
    assert "but only 300.0 MiB is available (MemAvailable); use a smaller --rank" in err
    assert err.rstrip().endswith("or --no-memory-check to try anyway")
    assert not out.exists() and list(tmp_path.iterdir()) == []  # refused before training, nothing left behind
    # an eager build adds 2.5 x --max-matrix-gb (or every entry, if fewer) to the estimate and names the way out
    assert main(["--kg", "umls", "--out", str(out), "--rank", "8", "--epochs", "1", "--quiet", "--matrices", "eager",
                 "--max-matrix-gb", "0.5"]) == 2
    # UMLS: 2.5 x (8 x 92 x 135 x 135 bytes) + two 64 MB chunk buffers
    err = capsys.readouterr().err
    assert "matrices 160.0 MiB" in err and "use a smaller --rank, --matrices auto (or lazy), a smaller --max-matrix-gb, or --no-memory-check" in err


def test_memory_estimate_components():
    from kge.builder import BASE_BYTES, EAGER_PEAK_FACTOR, estimate_build_memory

    kw = dict(num_entities=1000, num_relations=20, num_triples=10_000, rank=32, batch_size=100, candidates=None,
              matrices="lazy", max_matrix_gb=1.0)
    lazy = estimate_build_memory(**kw)
    assert lazy["base"] == BASE_BYTES and lazy["matrices"] == 0
    assert lazy["embeddings"] == 1020 * 64 * 4 * 6 and lazy["graph"] == 10_000 * 24 * 6 + 1000 * 200
    assert lazy["total_bytes"] == sum(v for k, v in lazy.items() if k != "total_bytes")
    # eager: bounded by every entry (8 bytes x R x N x N = 160 MB) below the 1 GiB budget
    eager = estimate_build_memory(**{**kw, "matrices": "eager"})
    assert eager["matrices"] == int(EAGER_PEAK_FACTOR * 8 * 20 * 1000 * 1000) + (128 << 20)
    assert estimate_build_memory(**{**kw, "rank": 64})["embeddings"] == 2 * lazy["embeddings"]
    reuse = estimate_build_memory(**{**kw, "train": False})
    assert reuse["training_buffers"] == 0 and reuse["embeddings"] == lazy["embeddings"] // 3


# ------------------------------------------------------------------ leftovers of killed builds (issue 32, item 7)
def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_a_build_removes_leftovers_of_killed_builds_and_keeps_live_ones(tmp_path, capsys):
    """Regression: a SIGKILLed build's hidden staging folder stayed beside the output for good."""
    from kge.build import StagingLock

    out = tmp_path / "nations"
    dead = tmp_path / ".nations.building-dead01"  # what a killed build leaves: its folder, its lock file
    dead.mkdir()
    (dead / "entities.tsv").write_text("half written\n")
    (tmp_path / ".nations.building-dead01.lock").write_text(f"{_dead_pid()}\n")
    orphan_lock = tmp_path / ".nations.building-gone02.lock"  # killed after its folder went
    orphan_lock.write_text(f"{_dead_pid()}\n")
    legacy = tmp_path / ".nations.building-old003"  # no lock file: an older kge.build's, or one just starting
    legacy.mkdir()
    other = tmp_path / ".other.building-dead04"  # another output's: not this build's business
    other.mkdir()
    (tmp_path / ".other.building-dead04.lock").write_text(f"{_dead_pid()}\n")
    live = tmp_path / ".nations.building-live05"
    live.mkdir()
    cfg = BuildConfig(kg="nations", out=str(out), train=dict(rank=4, epochs=1, eval_max_triples=0))
    with StagingLock() as running:  # a build of the same output still running: this process holds its lock
        running.hold(live)
        build_artifact(cfg, progress=True)
        Artifact.load(out)
        assert not dead.exists() and not (tmp_path / ".nations.building-dead01.lock").exists()
        assert not orphan_lock.exists()
        assert live.is_dir() and (tmp_path / ".nations.building-live05.lock").read_text() == f"{os.getpid()}\n"
        assert legacy.is_dir() and other.is_dir() and (tmp_path / ".other.building-dead04.lock").is_file()
    assert not (tmp_path / ".nations.building-live05.lock").exists()  # a build's lock goes with it
    err = capsys.readouterr().err
    assert f"note: removed {dead}, left by a build of {out} that was killed" in err
    assert f"note: {legacy} has no lock file" in err and str(live) not in err
    # this build's own staging folder and lock file are gone too
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".nations.building-live05", ".nations.building-old003", ".other.building-dead04",
         ".other.building-dead04.lock", "nations"])


def test_without_flock_the_pid_decides(tmp_path, monkeypatch):
    """On a file system without flock a lock file's pid decides; an empty or odd one keeps the folder."""
    import errno
    import fcntl

    from kge.builder import _owner_alive

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = tmp_path / "x.lock"
    assert _owner_alive(lock) is None
    for text, alive in [(f"{_dead_pid()}\n", False), (f"{os.getpid()}\n", True), ("", True), ("0\n", True),
                        ("-1\n", True), ("junk\n", True)]:
        lock.write_text(text)
        assert _owner_alive(lock) is alive, text


def test_a_sigkilled_build_is_cleaned_up_by_the_next(tmp_path):
    """kge.build killed with SIGKILL mid-training; the next build of the same output removes what it left."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "nations"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "kge.build", "--kg", "nations", "--out", str(out), "--rank", "4",
                             "--epochs", "1000000", "--eval-max-triples", "0", "--device", "cpu", "--quiet"],
                            cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".nations.building-*")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no staging folder after 120 s"
            time.sleep(0.1)
        time.sleep(1.0)  # well into loading and training
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not out.exists() and any(name.startswith(".nations.building-") for name in left), left
    cfg = BuildConfig(kg="nations", out=str(out), train=dict(rank=4, epochs=1, eval_max_triples=0))
    build_artifact(cfg, progress=False)
    assert Artifact.load(out).num_entities == 14
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nations"]


# ------------------------------------------------------------------ python -m kge.materialize: lazy -> eager
ARTIFACT_FILES = ("matrices.npz", "embeddings.npz", "entities.tsv", "relations.tsv", "observed.tsv", "missing.tsv")


@pytest.mark.parametrize("threshold", [None, "0.001"], ids=["qto", "explicit"])
def test_materialize_writes_the_eager_build_byte_for_byte(umls_artifact, tmp_path, threshold):
    """lazy build -> kge.materialize == eager build of the same embeddings at the same threshold: every file
    but meta.json byte for byte, and the lazy artifact's answers."""
    import shlex

    import torch

    from engine.exec.executor import Executor
    from engine.lang.structures import STRUCTURES
    from kge.artifact import rebuild_command
    from kge.materialize import main as materialize_main

    def build(out, *extra):
        return main(["--kg", "umls", "--out", str(out), "--drop-edges", "0.5", "--seed", "3",
                     "--embeddings", str(umls_artifact), "--quiet", *extra,
                     *(["--threshold", threshold] if threshold else [])])

    lazy, conv, direct = tmp_path / "lazy", tmp_path / "conv", tmp_path / "direct"
    assert build(lazy, "--matrices", "lazy") == 0
    assert materialize_main(["--artifact", str(lazy), "--out", str(conv), "--quiet"]) == 0
    assert build(direct, "--matrices", "eager") == 0
    for name in ARTIFACT_FILES:
        assert (conv / name).read_bytes() == (direct / name).read_bytes(), name
    a_lazy, a_conv, a_direct = Artifact.load(lazy), Artifact.load(conv), Artifact.load(direct)
    assert a_lazy.is_lazy and not a_conv.is_lazy and a_conv.meta["files"] == a_direct.meta["files"]
    assert a_conv.meta["calibration"]["threshold"] == a_direct.meta["calibration"]["threshold"] \
        == a_lazy.matrices.threshold == float(threshold or 2e-4)  # kept, never raised
    rng = np.random.default_rng(0)
    queries = [st.build(rng.integers(0, 135, st.num_anchors).tolist(), rng.integers(0, 92, st.num_relations).tolist())
               for st in STRUCTURES.values() for _ in range(2)]
    y_lazy, y_conv = Executor(a_lazy).scores(queries), Executor(a_conv).scores(queries)
    assert float((y_lazy - y_conv).abs().max()) <= 1e-6 and float(y_conv.max()) > 0
    assert torch.equal(Executor(a_direct).scores(queries), y_conv)
    # meta.json: an eager artifact whose rebuild command builds it eagerly at that threshold
    meta = a_conv.meta
    assert meta["matrices"] == "eager" and meta["calibration"]["matrices_choice"]["forced_by"] == "python -m kge.materialize"
    assert meta["materialized_from"]["artifact"] == str(lazy) and meta["materialized_from"]["files"] == a_lazy.meta["files"]
    cfg, _ = __import__("kge.build", fromlist=["parse_args"]).parse_args(shlex.split(rebuild_command(conv, meta))[3:])
    assert cfg.matrices == "eager" and cfg.threshold == float(threshold or 2e-4) and cfg.out == str(conv)


def test_materialize_refusals_are_one_line(umls_artifact, tmp_path, capsys, monkeypatch):
    from kge.materialize import main as materialize_main

    lazy, out = tmp_path / "lazy", tmp_path / "eager"
    assert main(_reuse(umls_artifact, tmp_path, "--matrices", "lazy", "--quiet")) == 0
    (tmp_path / "o").rename(lazy)

    def refused(argv, start, contains=""):
        assert materialize_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(start) and contains in err and err.count("\n") == 1 and "Traceback" not in err, err

    # over the budget: the size needed and the flag, nothing written (the threshold is never raised)
    refused(["--artifact", str(lazy), "--out", str(out), "--max-matrix-gb", str(2.0**-10)],
            f"error: --artifact {lazy}: the eager matrices would hold ~",
            " entries (12.8 MiB) at its threshold 0.0002, over --max-matrix-gb 0.000976562; pass --max-matrix-gb 0.014 "
            "or more (the threshold is kept, never raised)")
    assert not out.exists()
    # an estimate that missed (injected): the calibration itself stops at the budget, same kind of line
    import kge.calibrate

    real = kge.calibrate.estimate_nnz
    with monkeypatch.context() as m:
        m.setattr(kge.calibrate, "estimate_nnz", lambda *a, **k: dataclasses.replace(real(*a, **k), observed=0,
                                                                                    sample_w=np.zeros(0), sample_p=np.zeros(0)))
        refused(["--artifact", str(lazy), "--out", str(out), "--max-matrix-gb", str(2.0**-10), "--quiet"],
                f"error: --artifact {lazy}: the eager matrices outgrow --max-matrix-gb 0.000976562 (calibration at "
                "threshold 0.0002 keeps ", " > limit 131,072)); pass a larger --max-matrix-gb (the threshold is kept)")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["lazy"]
    refused(["--artifact", str(umls_artifact), "--out", str(out)],
            f"error: --artifact {umls_artifact}: already eager (its matrices.npz holds every row); nothing to materialize")
    refused(["--artifact", str(lazy), "--out", str(lazy)], "error: --out ")
    refused(["--artifact", str(lazy), "--out", str(out), "--max-matrix-gb", "0"], "error: --max-matrix-gb must be in [")
    refused(["--artifact", str(tmp_path / "nope"), "--out", str(out)], "error: ")
    assert materialize_main(["--artifact", str(lazy), "--out", str(out), "--quiet"]) == 0
    refused(["--artifact", str(lazy), "--out", str(out)], "error: --out ", "already holds an artifact; pass --overwrite")
    assert materialize_main(["--artifact", str(lazy), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eager", "lazy"]  # no staging folder or lock file left


def test_a_rank_left_to_the_budget_is_capped_to_fit_memory(monkeypatch, capsys):
    """Regression (issue 30): a 1M-entity, 10M-edge KG refused to build with the defaults ("use a --rank below
    256") although rank 64 fits; the time budget's rank is now capped to the largest that fits MemAvailable."""
    from types import SimpleNamespace

    from kge import builder
    from kge.complex_n3 import CANDIDATE_RANKS
    from kge.train import default_train_config

    kg = SimpleNamespace(num_entities=1_000_000, num_relations=1000, train=range(10_000_000), missing=range(0))
    cfg = BuildConfig(kg="big.tsv", out="unused")
    train_cfg = default_train_config(kg)
    assert train_cfg.rank is None and train_cfg.max_rank == 256  # the huge preset: the budget picks <= 256

    def est(rank):
        return builder.estimate_build_memory(num_entities=kg.num_entities, num_relations=kg.num_relations,
                                             num_triples=10_000_000, rank=rank, batch_size=train_cfg.batch_size,
                                             candidates=train_cfg.candidates, matrices="auto", max_matrix_gb=1.25)
    # between rank 64's and rank 128's estimates
    available = (est(64)["total_bytes"] + est(128)["total_bytes"]) // 2
    monkeypatch.setattr(builder, "available_memory_bytes", lambda: available)
    info, capped = builder._check_memory(cfg, kg, train_cfg, progress=True)
    assert capped.max_rank == 64 and capped.rank is None and info["rank_assumed"] == 64
    err = capsys.readouterr().err
    assert "memory: rank 256 would need an estimated" in err and "picks a rank up to 64" in err
    # the ranking chunk stays within 1 GiB of scores at a million entities
    assert est(64)["training_buffers"] <= 3 * (1 << 30) + (1 << 20)
    # everything fits: nothing changes, nothing said
    monkeypatch.setattr(builder, "available_memory_bytes", lambda: 1 << 50)
    info, same = builder._check_memory(cfg, kg, train_cfg, progress=False)
    assert same is train_cfg and info["rank_assumed"] == 256
    # not even the smallest rank fits: one error naming the way out
    monkeypatch.setattr(builder, "available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(UserError, match=rf"--rank N with N < {min(CANDIDATE_RANKS)} .*or --no-memory-check"):
        builder._check_memory(cfg, kg, train_cfg, progress=False)
    # a rank the user gave is never changed
    given = dataclasses.replace(train_cfg, rank=128)
    monkeypatch.setattr(builder, "available_memory_bytes", lambda: available)
    with pytest.raises(UserError, match="use a smaller --rank"):
        builder._check_memory(cfg, kg, given, progress=False)
