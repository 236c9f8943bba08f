"""Artifact folder format: round trip, checksums, name lookup, relation blocks."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from kge.artifact import Artifact
from kgreason.errors import UserError, cli_main, closest_names, unknown_name


def random_artifact(rng: np.random.Generator, n: int = 7, r: int = 4, density: float = 0.3) -> Artifact:
    m = sp.random(r * n, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    m.data = rng.uniform(0.01, 1.0, size=m.nnz).astype(np.float32)
    observed = np.stack([rng.integers(0, n, 10), rng.integers(0, r, 10), rng.integers(0, n, 10)], axis=1)
    rels = []
    for i in range(r // 2):
        rels += [f"rel {i}", f"rel {i}^-1"]
    return Artifact(
        entities=[f"entity {i}" for i in range(n)],
        relations=rels,
        matrices=m,
        observed=observed,
        missing=observed[:3],
        meta={"source": "test"},
        embeddings={"entity": (rng.normal(size=(n, 3)) + 1j * rng.normal(size=(n, 3))).astype(np.complex64),
                    "relation": (rng.normal(size=(r, 3)) + 1j).astype(np.complex64)},
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip(tmp_path, seed):
    rng = np.random.default_rng(seed)
    art = random_artifact(rng)
    art.save(tmp_path / "a")
    back = Artifact.load(tmp_path / "a")
    assert back.entities == art.entities and back.relations == art.relations
    assert (back.matrices != art.matrices).nnz == 0
    assert back.matrices.indices.dtype == np.int32 and back.matrices.indptr.dtype == np.int64
    np.testing.assert_array_equal(back.observed, art.observed)
    np.testing.assert_array_equal(back.missing, art.missing)
    np.testing.assert_array_equal(back.embeddings["entity"], art.embeddings["entity"])
    assert back.meta["num_entities"] == 7 and back.meta["nnz"] == art.matrices.nnz


def test_relation_block_matches_stacked_rows():
    rng = np.random.default_rng(5)
    art = random_artifact(rng, n=9, r=6)
    dense = art.matrices.toarray()
    for r in range(6):
        np.testing.assert_array_equal(art.relation_block(r).toarray(), dense[r * 9 : (r + 1) * 9])
        t = art.relation_matrix(r)
        assert t.layout == torch.sparse_csr
        np.testing.assert_array_equal(t.to_dense().numpy(), dense[r * 9 : (r + 1) * 9])
    assert art.nnz_per_relation().tolist() == [art.relation_block(r).nnz for r in range(6)]
    with pytest.raises(IndexError):
        art.relation_block(6)


def test_names_and_inverses():
    art = random_artifact(np.random.default_rng(0))
    assert art.entity_id("entity 3") == 3 and art.entity_id(2) == 2
    assert art.relation_id("rel 1^-1") == 3
    assert art.inverse_relation(0) == 1 and art.inverse_relation(3) == 2
    with pytest.raises(UserError, match=r"unknown entity 'entity 33'.*closest known: 'entity 3'"):
        art.entity_id("entity 33")
    with pytest.raises(UserError, match="out of range"):
        art.relation_id(99)


def test_checksum_mismatch_names_the_file(tmp_path):
    art = random_artifact(np.random.default_rng(1))
    art.save(tmp_path)
    with open(tmp_path / "observed.tsv", "a") as f:
        f.write("0\t0\t0\n")
    with pytest.raises(UserError, match=r"checksum mismatch for 'observed.tsv'"):
        Artifact.load(tmp_path)
    Artifact.load(tmp_path, verify=False)  # explicitly unchecked load still works


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        Artifact.load(tmp_path / "nope")
    art = random_artifact(np.random.default_rng(2))
    art.save(tmp_path)
    (tmp_path / "missing.tsv").unlink()
    with pytest.raises(UserError, match="missing file 'missing.tsv'"):
        Artifact.load(tmp_path)
    art.save(tmp_path)
    (tmp_path / "entities.tsv").write_text("0\tentity 0\nx\tbad\n")
    meta = json.loads((tmp_path / "meta.json").read_text())
    del meta["files"]["entities.tsv"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"entities.tsv:2: expected 'id<TAB>name'"):
        Artifact.load(tmp_path)


def test_add_file_updates_checksums(tmp_path):
    art = random_artifact(np.random.default_rng(3))
    art.save(tmp_path)
    art.add_file("extra.npy", np.arange(5))
    back = Artifact.load(tmp_path)
    assert "extra.npy" in back.meta["files"]
    np.save(tmp_path / "extra.npy", np.arange(6))
    with pytest.raises(UserError, match="extra.npy"):
        Artifact.load(tmp_path)


def test_constructor_rejects_bad_shapes():
    with pytest.raises(ValueError, match="expected \\(R\\*N, N\\)"):
        Artifact(entities=["a", "b"], relations=["r"], matrices=sp.csr_matrix((3, 2), dtype=np.float32),
                 observed=np.zeros((0, 3)), missing=np.zeros((0, 3)))
    with pytest.raises(ValueError, match="unique"):
        Artifact(entities=["a", "a"], relations=["r"], matrices=sp.csr_matrix((2, 2), dtype=np.float32),
                 observed=np.zeros((0, 3)), missing=np.zeros((0, 3)))


def test_error_helpers(capsys):
    assert closest_names("Tom Hank", ["Tom Hanks", "Tim Hawkins", "zzz"], n=1) == ["Tom Hanks"]
    err = unknown_name("relation", "directed", ["directed_by", "written_by"], where="q.txt:3:7")
    assert str(err).startswith("q.txt:3:7: unknown relation 'directed'") and "'directed_by'" in str(err)

    @cli_main
    def main(argv=None):
        raise UserError("bad thing at x:1")

    assert main([]) == 2
    assert capsys.readouterr().err.strip() == "error: bad thing at x:1"
