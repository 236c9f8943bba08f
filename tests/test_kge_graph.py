"""Loaders, inverse relations, deduplication, drop_edges and their error messages."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from kgreason.errors import UserError
from kge.graph import KnowledgeGraph, LOADERS, drop_edges, load_kg
from kge.safe_pickle import safe_load


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _name_triples(kg: KnowledgeGraph, split: str = "train") -> set[tuple[str, str, str]]:
    arr = getattr(kg, split)
    return {(kg.entities[h], kg.relations[r], kg.entities[t]) for h, r, t in arr}


def _check_paired(kg: KnowledgeGraph) -> None:
    """Relation 2k+1 is named X^-1 for 2k = X and every edge has its inverse in the same split."""
    for k in range(0, kg.num_relations, 2):
        assert kg.relations[k + 1] == kg.relations[k] + "^-1"
    for split in ("train", "valid", "test"):
        arr = getattr(kg, split)
        fwd = {tuple(x) for x in arr.tolist()}
        inv = {(t, r ^ 1, h) for h, r, t in arr.tolist()}
        assert fwd == inv


TSV = ["a\tlikes\tb", "b\tlikes\tc", "a\tknows\tc", "a\tlikes\tb", "c\tknows\ta"]


def test_tsv_loader_adds_inverses_and_counts_duplicates(tmp_path):
    kg = load_kg(_write(tmp_path / "kg.tsv", TSV))
    assert kg.entities == ("a", "b", "c")
    assert kg.relations == ("knows", "knows^-1", "likes", "likes^-1")
    assert kg.stats["duplicates_removed_train"] == 2  # the repeated edge and its inverse
    assert kg.stats["inverses_added"] is True
    assert len(kg.train) == 8 and len(kg.valid) == 0 and len(kg.test) == 0
    assert ("b", "likes^-1", "a") in _name_triples(kg)
    _check_paired(kg)


def test_pipe_separated_metaqa_style(tmp_path):
    kg = load_kg(_write(tmp_path / "kb.txt", [x.replace("\t", "|") for x in TSV]))
    kg_tab = load_kg(_write(tmp_path / "kb.tsv", TSV))
    assert _name_triples(kg) == _name_triples(kg_tab)
    assert kg.stats["delimiter"] == "|"


def test_folder_loader_names(tmp_path):
    folder = tmp_path / "kg"
    folder.mkdir()
    _write(folder / "train.txt", TSV)
    _write(folder / "valid.txt", ["b\tknows\ta"])
    _write(folder / "test.txt", ["c\tlikes\ta", "c\tlikes\ta"])
    kg = load_kg(folder)
    assert kg.stats["format"] == "folder"
    assert _name_triples(kg, "valid") == {("b", "knows", "a"), ("a", "knows^-1", "b")}
    assert kg.stats["duplicates_removed_test"] == 2
    assert len(kg.missing) == 4
    _check_paired(kg)


def _betae_folder(tmp_path: Path, names: str) -> Path:
    folder = tmp_path / f"betae_{names}"
    folder.mkdir()
    n = 6
    fwd = [(0, 0, 1), (1, 2, 2), (3, 0, 4), (4, 2, 0), (2, 2, 3)]
    lines = [f"{h}\t{r}\t{t}" for h, r, t in fwd] + [f"{t}\t{r + 1}\t{h}" for h, r, t in fwd]
    _write(folder / "train.txt", lines + ["0\t0\t1"])  # one duplicate
    _write(folder / "valid.txt", ["2\t2\t3", "3\t3\t2"])
    _write(folder / "test.txt", ["4\t0\t5", "5\t1\t4"])
    mids = [f"/m/0{i}" for i in range(n)]
    labels = ["Paris", "Republic", "Republic", "Berlin", "", "Rome"]
    if names == "tsv":
        _write(folder / "id2ent.tsv", ["id\tmid\tname_kgbert\twikidata_label"]
               + [f"{i}\t{mids[i]}\t{labels[i]}\t{labels[i].lower()}" for i in range(n)])
        _write(folder / "id2rel.tsv", ["id\trelation\tdirection", "0\t/r/capital\tforward", "1\t/r/capital\tinverse",
                                       "2\t/r/near\tforward", "3\t/r/near\tinverse"])
    elif names == "txt":
        _write(folder / "entities.txt", [f"e{i}" for i in range(n)])
        _write(folder / "relations.txt", ["capital", "capital_rev", "near", "near_rev"])
    elif names == "pkl":
        with open(folder / "id2ent.pkl", "wb") as f:
            pickle.dump({i: f"ent{i}" for i in range(n)}, f)
        with open(folder / "rel2id.pkl", "wb") as f:
            pickle.dump({"capital": 0, "capital_inv": 1, "near": 2, "near_inv": 3}, f)
    return folder


@pytest.mark.parametrize("names", ["tsv", "txt", "pkl", "none"])
def test_betae_loader(tmp_path, names):
    kg = load_kg(_betae_folder(tmp_path, names))
    assert kg.stats["format"] == "betae" and kg.stats["inverses_added"] is False
    assert kg.num_relations == 4  # BetaE already carries inverses: none added
    assert kg.stats["duplicates_removed_train"] == 1
    assert kg.stats["edges_without_inverse_train"] == 0
    _check_paired(kg)
    expected = {
        "tsv": (("Paris", "Republic (/m/01)", "Republic (/m/02)", "Berlin", "/m/04"), ("/r/capital", "/r/capital^-1")),
        "txt": (("e0", "e1", "e2", "e3", "e4"), ("capital", "capital^-1")),
        "pkl": (("ent0", "ent1", "ent2", "ent3", "ent4"), ("capital", "capital^-1")),
        "none": (("0", "1", "2", "3", "4"), ("0", "0^-1")),
    }[names]
    assert kg.entities[:5] == expected[0]
    assert kg.relations[:2] == expected[1]


def test_restricted_unpickler_refuses_classes(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(UserError, match=r"evil\.pkl: refused or unreadable pickle \(global builtins\.print is not allowed\)"):
        safe_load(tmp_path / "evil.pkl")
    folder = _betae_folder(tmp_path, "pkl")
    with open(folder / "id2ent.pkl", "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(UserError, match="id2ent.pkl: refused"):
        load_kg(folder)


@pytest.mark.parametrize("name,n_ent,n_rel", [("umls", 135, 92), ("nations", 14, 110)])
def test_pykeen_loader(name, n_ent, n_rel):
    from pykeen.datasets import get_dataset

    kg = load_kg(name)
    ds = get_dataset(dataset=name)
    assert kg.num_entities == n_ent and kg.num_relations == n_rel
    assert kg.source == f"pykeen:{name}"
    for split, tf in (("train", ds.training), ("valid", ds.validation), ("test", ds.testing)):
        assert len(getattr(kg, split)) == 2 * tf.num_triples  # pykeen's own split, with inverses
        labeled = {tuple(x) for x in tf.triples.tolist()}
        assert {t for t in _name_triples(kg, split) if not t[1].endswith("^-1")} == labeled
    _check_paired(kg)


def test_drop_edges_is_deterministic_and_pairs_inverses():
    kg = load_kg("nations")
    a = drop_edges(kg, 0.5, seed=3)
    b = drop_edges(kg, 0.5, seed=3)
    c = drop_edges(kg, 0.5, seed=4)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.dropped, b.dropped)
    assert not np.array_equal(a.dropped, c.dropped)
    assert len(a.train) + len(a.dropped) == len(kg.train)
    assert abs(len(a.dropped) - len(kg.train) / 2) <= 2
    kept = {tuple(x) for x in a.train.tolist()}
    dropped = {tuple(x) for x in a.dropped.tolist()}
    assert not kept & dropped
    for h, r, t in dropped:  # an edge and its inverse leave together
        assert (t, r ^ 1, h) in dropped
    # order of the input does not matter
    perm = np.random.default_rng(0).permutation(len(kg.train))
    shuffled = KnowledgeGraph(entities=kg.entities, relations=kg.relations, train=kg.train[perm], valid=kg.valid,
                              test=kg.test, source=kg.source)
    d = drop_edges(shuffled, 0.5, seed=3)
    assert {tuple(x) for x in d.dropped.tolist()} == dropped
    assert a.stats["dropped_edges"] == len(a.dropped)
    assert np.array_equal(a.missing[: len(a.dropped)], a.dropped)
    assert drop_edges(kg, 0.0, 1) is kg


def test_drop_edges_rejects_bad_fraction():
    kg = load_kg("nations")
    with pytest.raises(UserError, match=r"fraction must be in \[0, 1\], got 1.5"):
        drop_edges(kg, 1.5, 0)


# ------------------------------------------------------------------ errors
def test_error_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.tsv: file or folder not found"):
        load_kg(tmp_path / "nope.tsv")
    folder = tmp_path / "f"
    folder.mkdir()
    _write(folder / "train.txt", TSV)
    _write(folder / "valid.txt", TSV)
    with pytest.raises(UserError, match=r"test\.txt: file not found"):
        load_kg(folder)
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    with pytest.raises(UserError, match=r"folder has no train\.txt"):
        load_kg(empty)


def test_error_malformed_line(tmp_path):
    path = _write(tmp_path / "bad.tsv", ["a\tr\tb", "a\tr", "c\tr\td"])
    with pytest.raises(UserError) as exc:
        load_kg(path)
    assert str(exc.value) == f"{path}:2: expected 3 tab-separated fields, got 2: 'a\\tr'"
    path = _write(tmp_path / "bad_pipe.txt", ["a|r|b", "a|r|b|c"])
    with pytest.raises(UserError, match=r"bad_pipe\.txt:2: expected 3 '\|'-separated fields, got 4: 'a\|r\|b\|c'"):
        load_kg(path)
    folder = _betae_folder(tmp_path, "none")
    _write(folder / "valid.txt", ["1\t0\t2", "1\tx\t2"])
    with pytest.raises(UserError, match=r"valid\.txt:2: expected integer ids, got '1\\tx\\t2'"):
        load_kg(folder)


def test_error_unknown_dataset_lists_closest_first():
    with pytest.raises(UserError) as exc:
        load_kg("umsl")
    msg = str(exc.value)
    assert msg.startswith("unknown dataset 'umsl'; known pykeen datasets (closest first): umls, ")
    assert "nations" in msg and "kinships" in msg and "\n" not in msg


def test_error_empty_kg(tmp_path):
    path = _write(tmp_path / "empty.tsv", ["", "  "])
    with pytest.raises(UserError, match=r"empty\.tsv: empty knowledge graph \(no training triples\)"):
        load_kg(path)


def test_error_unknown_format(tmp_path):
    with pytest.raises(UserError, match=r"unknown KG format 'csv'; known: betae, folder, metaqa, pykeen, tsv"):
        load_kg(tmp_path, format="csv")
    assert set(LOADERS) == {"tsv", "folder", "betae", "pykeen", "metaqa"}
