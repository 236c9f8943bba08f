"""End-to-end build: CLI on UMLS (tiny training), artifact contents, round trip, CLI errors."""
from __future__ import annotations

import dataclasses
import json

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
    cfg = BuildConfig(kg="nations", out=str(out), rank=4, epochs=1, eval_max_triples=0)
    a = build_artifact(cfg, progress=False)
    assert a.path == out and (out / "meta.json").is_file()
    with pytest.raises(UserError, match="already holds an artifact; pass --overwrite"):
        build_artifact(cfg, progress=False)  # never replaced silently
    b = build_artifact(dataclasses.replace(cfg, overwrite=True), progress=False)  # rebuilding over it
    assert Artifact.load(out).meta["files"] == b.meta["files"]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "nations"]
    assert leftovers == []
    assert json.loads((out / "meta.json").read_text())["num_entities"] == 14


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
