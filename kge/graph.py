"""Knowledge graphs as id triples with names, and the loaders that read them.

Every loader returns a :class:`KnowledgeGraph` whose relations come in pairs:
relation ``2k`` is a source relation ``X`` and ``2k + 1`` its inverse, named
``X^-1``; every train/valid/test edge ``(h, 2k, t)`` is accompanied by
``(t, 2k+1, h)``.  Text sources get the inverses added here; BetaE folders
already carry them in this layout and get none added.  So ``r ^ 1`` is always
the inverse of ``r``.

Loaders never change a name: ``" a"``, ``"a "`` and ``"a"`` are three entities
(only names from pickles or pykeen that contain a tab or line break, which the
artifact's one-name-a-line files cannot hold, get those characters replaced by
a space).  Text files are read with :func:`kgreason.files.read_lines` (UTF-8;
errors name ``file:line``); truly blank lines are skipped.

Sources are resolved by :func:`load_kg` through the :data:`LOADERS` registry:

========  =================================================================
``tsv``     one file of ``head<TAB>relation<TAB>tail`` names (or
            ``head|relation|tail``, MetaQA style); every triple is training
``folder``  a folder with ``train.txt``, ``valid.txt``, ``test.txt`` name triples
``betae``   a BetaE folder: id triples plus ``id2ent.tsv``/``id2rel.tsv``,
            ``entities.txt``/``relations.txt`` or ``id2ent.pkl``/``ent2id.pkl``
``pykeen``  a pykeen dataset by name (``umls``, ``nations``, ``kinships`` offline)
``metaqa``  a MetaQA folder: ``kb.txt`` of ``head|relation|tail`` names, all training
            (its questions are read by :mod:`engine.eval.metaqa`)
========  =================================================================
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from kgreason.constants import INVERSE_SUFFIX
from kgreason.errors import UserError
from kgreason.files import read_lines
from .safe_pickle import safe_load

__all__ = [
    "KnowledgeGraph",
    "LOADERS",
    "load_kg",
    "load_tsv",
    "load_folder",
    "load_betae",
    "load_pykeen",
    "load_metaqa",
    "drop_edges",
    "inverse_of",
    "PYKEEN_OFFLINE",
]

#: pykeen datasets shipped inside the pykeen wheel (usable without network).
PYKEEN_OFFLINE = ("umls", "nations", "kinships")
SPLITS = ("train", "valid", "test")


def _empty() -> np.ndarray:
    return np.zeros((0, 3), dtype=np.int64)


@dataclass(frozen=True, eq=False)
class KnowledgeGraph:
    """A knowledge graph: names plus (E, 3) int64 ``(head, relation, tail)`` id arrays.

    ``relations`` come in pairs (``2k`` = ``X``, ``2k+1`` = ``X^-1``) and each
    split holds both directions of every edge.  ``dropped`` holds training
    edges removed by :func:`drop_edges` (simulated incompleteness).  ``stats``
    records what loading did (duplicates removed per split, inverses added...).
    """

    entities: tuple[str, ...]
    relations: tuple[str, ...]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str
    stats: Mapping[str, Any] = field(default_factory=dict)
    dropped: np.ndarray = field(default_factory=_empty)

    def __post_init__(self) -> None:
        n, r = len(self.entities), len(self.relations)
        if len(set(self.entities)) != n:
            raise ValueError("entity names must be unique")
        if len(set(self.relations)) != r:
            raise ValueError("relation names must be unique")
        for name in ("train", "valid", "test", "dropped"):
            arr = np.ascontiguousarray(np.asarray(getattr(self, name), dtype=np.int64).reshape(-1, 3))
            if len(arr) and (arr[:, [0, 2]].min() < 0 or arr[:, [0, 2]].max() >= n or arr[:, 1].min() < 0 or arr[:, 1].max() >= r):
                raise ValueError(f"{name} has ids out of range (N={n}, R={r})")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    @property
    def missing(self) -> np.ndarray:
        """Held-out edges: ``dropped`` + ``valid`` + ``test`` (E, 3)."""
        return np.concatenate([self.dropped, self.valid, self.test])

    def summary(self) -> str:
        return (
            f"{self.source}: {self.num_entities} entities, {self.num_relations} relations, "
            f"train {len(self.train)}, valid {len(self.valid)}, test {len(self.test)}, dropped {len(self.dropped)}"
        )


def inverse_of(r: np.ndarray | int) -> np.ndarray | int:
    """Inverse relation id(s) under the paired layout (``2k`` <-> ``2k+1``)."""
    return r ^ 1


# ---------------------------------------------------------------- helpers
def _dedup(triples: np.ndarray) -> tuple[np.ndarray, int]:
    """Unique rows in first-seen order, and how many duplicates were removed."""
    if len(triples) == 0:
        return _empty(), 0
    _, first = np.unique(triples, axis=0, return_index=True)
    first.sort()
    return triples[first], int(len(triples) - len(first))


def _with_inverses(triples: np.ndarray) -> np.ndarray:
    """Map source relation ``k`` to ``2k`` and append ``(t, 2k+1, h)`` for each edge."""
    if len(triples) == 0:
        return _empty()
    fwd = np.stack([triples[:, 0], 2 * triples[:, 1], triples[:, 2]], axis=1)
    inv = np.stack([triples[:, 2], 2 * triples[:, 1] + 1, triples[:, 0]], axis=1)
    return np.concatenate([fwd, inv])


def _paired_relation_names(base: Sequence[str], where: str, lines: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``(X, X^-1)`` for each base name; a name that equals another's inverse is an error naming both.

    ``lines`` maps a base name to the ``file:line`` where it first appears (text sources).
    """
    names: list[str] = []
    for b in base:
        names += [b, b + INVERSE_SUFFIX]
    if len(set(names)) != len(names):
        owner: dict[str, str] = {}
        for b in base:
            for n in (b, b + INVERSE_SUFFIX):
                if n in owner:
                    other = owner[n]
                    loc = (lines or {}).get(b) or (lines or {}).get(other) or where
                    if n == b and other != b:
                        what = f"relation {b!r} is also the name of the inverse of relation {other!r}"
                    elif n != b and other != b:
                        what = f"the inverse of relation {b!r} is also relation {n!r}"
                    else:
                        what = f"relation name {b!r} appears twice"
                    a = (lines or {}).get(other)
                    also = f" (relation {other!r} first at {a})" if a and a != loc else ""
                    raise UserError(f"{loc}: {what}{also}; the artifact names inverses X{INVERSE_SUFFIX}, "
                                    "so rename one of them")
                owner[n] = b
    return tuple(names)


def _clean_name(name: str) -> str:
    """A name from a pickle or pykeen, storable in the artifact's one-name-a-line files.

    Only tabs and line breaks are replaced (by one space each run); nothing is stripped.
    """
    return re.sub(r"[\t\r\n]+", " ", name)


def _finish(
    entities: Sequence[str],
    relations: Sequence[str],
    splits: Mapping[str, np.ndarray],
    source: str,
    stats: dict[str, Any],
) -> KnowledgeGraph:
    out: dict[str, np.ndarray] = {}
    for name in SPLITS:
        arr, dups = _dedup(np.asarray(splits.get(name, _empty()), dtype=np.int64).reshape(-1, 3))
        out[name] = arr
        stats[f"duplicates_removed_{name}"] = dups
        stats[f"num_{name}"] = int(len(arr))
    if len(out["train"]) == 0:
        raise UserError(f"{source}: empty knowledge graph (no training triples)")
    return KnowledgeGraph(
        entities=tuple(entities), relations=tuple(relations), train=out["train"], valid=out["valid"],
        test=out["test"], source=source, stats=stats,
    )


def _read_name_triples(path: Path, delimiter: str | None,
                       rel_lines: dict[str, str] | None = None) -> tuple[list[tuple[str, str, str]], str]:
    """Name triples of a text file; ``delimiter`` None = tab, or ``|`` when the first line has no tab.

    Names are kept exactly as written (no stripping).  Blank lines (nothing but
    whitespace) are skipped; a blank *field* is an error.  ``rel_lines`` receives
    the ``file:line`` where each relation first appears.
    """
    triples: list[tuple[str, str, str]] = []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        if delimiter is None:
            delimiter = "\t" if "\t" in line else ("|" if "|" in line else "\t")
        parts = line.split(delimiter)
        if len(parts) != 3:
            kind = "tab" if delimiter == "\t" else f"{delimiter!r}"
            raise UserError(f"{path}:{lineno}: expected 3 {kind}-separated fields, got {len(parts)}: {line!r}")
        for k, p in enumerate(parts):
            if not p.strip():
                raise UserError(f"{path}:{lineno}: empty field {k + 1} in {line!r}")
            if "\t" in p:  # only possible with the '|' delimiter; artifacts store one tab-free name a line
                raise UserError(f"{path}:{lineno}: field {k + 1} {p!r} contains a tab, which an artifact "
                                "cannot store in a name; remove it or use tab-separated fields")
        h, r, t = parts
        if rel_lines is not None and r not in rel_lines:
            rel_lines[r] = f"{path}:{lineno}"
        triples.append((h, r, t))
    return triples, delimiter or "\t"


def _from_name_triples(split_triples: Mapping[str, list[tuple[str, str, str]]], source: str, stats: dict[str, Any],
                       rel_lines: Mapping[str, str] | None = None) -> KnowledgeGraph:
    ents = sorted({x for tr in split_triples.values() for h, _, t in tr for x in (h, t)})
    rels = sorted({r for tr in split_triples.values() for _, r, _ in tr})
    e_index = {e: i for i, e in enumerate(ents)}
    r_index = {r: i for i, r in enumerate(rels)}
    relations = _paired_relation_names(rels, source, rel_lines)
    splits = {}
    for name, tr in split_triples.items():
        ids = np.array([(e_index[h], r_index[r], e_index[t]) for h, r, t in tr], dtype=np.int64).reshape(-1, 3)
        splits[name] = _with_inverses(ids)
    stats.update(inverses_added=True, source_relations=len(rels))
    return _finish(ents, relations, splits, source, stats)


# ---------------------------------------------------------------- loaders
def load_tsv(source: str | os.PathLike, *, delimiter: str | None = None) -> KnowledgeGraph:
    """One file of name triples (tab- or ``|``-separated); all of it is training data."""
    path = Path(source)
    rel_lines: dict[str, str] = {}
    triples, delim = _read_name_triples(path, delimiter, rel_lines)
    return _from_name_triples({"train": triples}, str(path), {"format": "tsv", "delimiter": delim}, rel_lines)


def load_metaqa(source: str | os.PathLike) -> KnowledgeGraph:
    """A MetaQA folder (or its ``kb.txt``): ``head|relation|tail`` name triples, all training.

    Same-title movies share one name in MetaQA, so its 1,159 repeated lines are
    duplicates removed here (``stats['duplicates_removed_train']`` counts them
    both directions).
    """
    path = Path(source)
    kb = path / "kb.txt" if path.is_dir() else path
    if not kb.is_file():
        raise UserError(f"{path}: MetaQA folder has no kb.txt (expected kb.txt with head|relation|tail lines)")
    rel_lines: dict[str, str] = {}
    triples, _ = _read_name_triples(kb, "|", rel_lines)
    return _from_name_triples({"train": triples}, str(path), {"format": "metaqa", "delimiter": "|"}, rel_lines)


def load_folder(source: str | os.PathLike, *, delimiter: str | None = None) -> KnowledgeGraph:
    """A folder with ``train.txt``, ``valid.txt`` and ``test.txt`` name triples."""
    path = Path(source)
    splits = {}
    rel_lines: dict[str, str] = {}
    for name in SPLITS:
        splits[name], _ = _read_name_triples(path / f"{name}.txt", delimiter, rel_lines)
    return _from_name_triples(splits, str(path), {"format": "folder"}, rel_lines)


_ID = re.compile(r"\s*(-?[0-9]{1,18})\s*")  # ASCII digits only (int() would take any Unicode digit or "1_000")


def _read_id_triples(path: Path) -> np.ndarray:
    rows: list[tuple[int, int, int]] = []
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise UserError(f"{path}:{lineno}: expected 3 tab-separated fields, got {len(parts)}: {line!r}")
        matches = [_ID.fullmatch(p) for p in parts]
        if not all(matches):
            raise UserError(f"{path}:{lineno}: expected integer ids, got {line!r}")
        h, r, t = (int(m.group(1)) for m in matches)  # type: ignore[union-attr]
        if min(h, r, t) < 0:
            raise UserError(f"{path}:{lineno}: negative id in {line!r}")
        rows.append((h, r, t))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _check_dense(path: Path, what: str, largest: int, used: int, declared: int) -> None:
    """Ids number ``0..N-1``: a count far above the ids in use is an error (instead of allocating N names)."""
    bound = 4 * used + 100_000
    if declared > bound:
        raise UserError(f"{path / 'stats.txt'}: declares {declared:,} {what}s but the triples use only {used:,} "
                        f"distinct {what} ids")
    if largest >= max(declared, bound):
        raise UserError(f"{path}: {what} id {largest:,} but only {used:,} distinct {what} ids are used: BetaE "
                        f"folders number {what}s 0..N-1")


def _read_tsv_table(path: Path) -> tuple[list[str], list[list[str]]]:
    lines = [ln for _, ln in read_lines(path) if ln.strip()]
    if not lines:
        raise UserError(f"{path}: empty file")
    header = lines[0].split("\t")
    return header, [ln.split("\t") for ln in lines[1:]]


def _ids_to_names(mapping: Mapping[Any, Any], count: int, path: Path, id_to_name: bool) -> list[str]:
    names = [""] * count
    for k, v in mapping.items():
        i, name = (k, v) if id_to_name else (v, k)
        if not isinstance(i, (int, np.integer)) or not 0 <= int(i) < count:
            raise UserError(f"{path}: id {i!r} out of range [0, {count})")
        names[int(i)] = str(name)
    return names


def _unique_names(names: list[str], keys: Sequence[str]) -> list[str]:
    """Make names unique by appending ``(key)`` to every name that collides."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    out = [f"{n} ({k})" if counts[n] > 1 or not n else n for n, k in zip(names, keys)]
    seen: dict[str, int] = {}
    for i, n in enumerate(out):  # last resort (keys themselves collide): append the id
        if n in seen:
            out[i] = f"{n} #{i}"
        seen[out[i]] = i
    return out


def _betae_entity_names(path: Path, n: int) -> tuple[list[str], str]:
    if (path / "id2ent.tsv").is_file():
        header, rows = _read_tsv_table(path / "id2ent.tsv")
        col = {c: i for i, c in enumerate(header)}
        if "id" not in col:
            raise UserError(f"{path / 'id2ent.tsv'}:1: expected a header with an 'id' column, got {header}")
        key_col = col.get("mid", col["id"])
        name_cols = [col[c] for c in ("name_kgbert", "wikidata_label", "name", "label") if c in col] or [key_col]
        names, keys = [""] * n, [""] * n
        for lineno, row in enumerate(rows, 2):
            try:
                i = int(row[col["id"]])
            except (ValueError, IndexError):
                raise UserError(f"{path / 'id2ent.tsv'}:{lineno}: expected an integer id, got {row!r}") from None
            if not 0 <= i < n:
                raise UserError(f"{path / 'id2ent.tsv'}:{lineno}: id {i} out of range [0, {n})")
            keys[i] = row[key_col] if key_col < len(row) else str(i)
            label = next((row[c] for c in name_cols if c < len(row) and row[c].strip()), keys[i])
            names[i] = _clean_name(label)
        keys = [k or str(i) for i, k in enumerate(keys)]
        return _unique_names(names, keys), "id2ent.tsv"
    if (path / "entities.txt").is_file():
        names = [ln for _, ln in read_lines(path / "entities.txt") if ln]
        if len(names) < n:
            raise UserError(f"{path / 'entities.txt'}: {len(names)} names but triples use {n} entity ids")
        return _unique_names(names, [str(i) for i in range(len(names))]), "entities.txt"
    for fname, id_to_name in (("id2ent.pkl", True), ("ent2id.pkl", False)):
        if (path / fname).is_file():
            mapping = safe_load(path / fname)
            if not isinstance(mapping, dict):
                raise UserError(f"{path / fname}: expected a dict, got {type(mapping).__name__}")
            count = max(n, len(mapping))
            names = _ids_to_names(mapping, count, path / fname, id_to_name)
            return _unique_names([_clean_name(x) for x in names], [str(i) for i in range(count)]), fname
    return [str(i) for i in range(n)], "ids"


def _betae_relation_base_names(path: Path, r: int) -> tuple[list[str], str]:
    """Names for the forward relations 0, 2, 4, ... (length r // 2)."""
    if (path / "id2rel.tsv").is_file():
        header, rows = _read_tsv_table(path / "id2rel.tsv")
        col = {c: i for i, c in enumerate(header)}
        name_col = col.get("relation", col.get("name", 1 if len(header) > 1 else 0))
        names = [""] * r
        for lineno, row in enumerate(rows, 2):
            try:
                i = int(row[col.get("id", 0)])
            except (ValueError, IndexError):
                raise UserError(f"{path / 'id2rel.tsv'}:{lineno}: expected an integer id, got {row!r}") from None
            if 0 <= i < r and name_col < len(row):
                names[i] = _clean_name(row[name_col])
        return [names[k] or str(k) for k in range(0, r, 2)], "id2rel.tsv"
    if (path / "relations.txt").is_file():
        names = [ln for _, ln in read_lines(path / "relations.txt") if ln]
        if len(names) < r:
            raise UserError(f"{path / 'relations.txt'}: {len(names)} names but triples use {r} relation ids")
        return [names[k] for k in range(0, r, 2)], "relations.txt"
    for fname, id_to_name in (("id2rel.pkl", True), ("rel2id.pkl", False)):
        if (path / fname).is_file():
            mapping = safe_load(path / fname)
            if not isinstance(mapping, dict):
                raise UserError(f"{path / fname}: expected a dict, got {type(mapping).__name__}")
            names = _ids_to_names(mapping, max(r, len(mapping)), path / fname, id_to_name)
            return [_clean_name(names[k]) or str(k) for k in range(0, r, 2)], fname
    return [str(k) for k in range(0, r, 2)], "ids"


def _count_from_stats(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    if (path / "stats.txt").is_file():
        for _, ln in read_lines(path / "stats.txt"):
            m = re.match(r"\s*num(entity|relations)\s*:\s*([0-9]{1,18})\s*$", ln)
            if m:
                out[m.group(1)] = int(m.group(2))
    return out


def load_betae(source: str | os.PathLike) -> KnowledgeGraph:
    """A BetaE folder: id triples already holding both directions (relation ``2k+1`` = inverse of ``2k``)."""
    path = Path(source)
    if not path.is_dir():
        raise UserError(f"{path}: folder not found")
    splits = {name: _read_id_triples(path / f"{name}.txt") for name in SPLITS}
    allt = np.concatenate(list(splits.values()))
    if len(splits["train"]) == 0:
        raise UserError(f"{path}: empty knowledge graph (no training triples)")
    counts = _count_from_stats(path)
    _check_dense(path, "entity", int(allt[:, [0, 2]].max()), len(np.unique(allt[:, [0, 2]])), counts.get("entity", 0))
    _check_dense(path, "relation", int(allt[:, 1].max()), len(np.unique(allt[:, 1])), counts.get("relations", 0))
    n = max(int(allt[:, [0, 2]].max()) + 1, counts.get("entity", 0))
    r = max(int(allt[:, 1].max()) + 1, counts.get("relations", 0))
    r += r % 2  # pairs
    entities, ent_from = _betae_entity_names(path, n)
    n = len(entities)
    base, rel_from = _betae_relation_base_names(path, r)
    relations = _paired_relation_names(base, str(path))
    stats: dict[str, Any] = {"format": "betae", "inverses_added": False, "entity_names_from": ent_from,
                             "relation_names_from": rel_from}
    kg = _finish(entities, relations, splits, str(path), stats)
    # BetaE promises both directions of every edge (relation 2k+1 = inverse of 2k).  Id triples without
    # them are some other layout: naming relation 1 "0^-1" would silently be wrong.
    for split in SPLITS:
        arr = getattr(kg, split)
        unpaired = _unpaired_mask(arr, n)
        stats[f"edges_without_inverse_{split}"] = int(unpaired.sum())
        if unpaired.any():
            h, rel, t = (int(x) for x in arr[np.flatnonzero(unpaired)[0]])
            raise UserError(
                f"{path / (split + '.txt')}: {int(unpaired.sum()):,} of {len(arr):,} edges have no inverse edge "
                f"(e.g. {h} {rel} {t} without {t} {rel ^ 1} {h}): a BetaE folder holds both directions, relation "
                f"2k+1 being the inverse of 2k; for one-direction id triples use --kg-format folder "
                f"(the ids become names and inverses are added)"
            )
    return kg


def _edge_keys(triples: np.ndarray, n: int, num_rel: int) -> np.ndarray:
    return (triples[:, 0] * num_rel + triples[:, 1]) * n + triples[:, 2]


def _unpaired_mask(triples: np.ndarray, n: int) -> np.ndarray:
    """(E,) bool: edges ``(h, r, t)`` whose partner ``(t, r ^ 1, h)`` is not in ``triples``."""
    if len(triples) == 0:
        return np.zeros(0, dtype=bool)
    num_rel = int(triples[:, 1].max()) + 2
    keys = _edge_keys(triples, n, num_rel)
    inv = np.stack([triples[:, 2], triples[:, 1] ^ 1, triples[:, 0]], axis=1)
    return ~np.isin(_edge_keys(inv, n, num_rel), keys)


def _pykeen_names() -> list[str]:
    from pykeen.datasets import dataset_resolver

    return sorted(dataset_resolver.options)


def _normalize_dataset(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _ranked_names(name: str, known: Iterable[str]) -> list[str]:
    key = _normalize_dataset(name)
    return sorted(known, key=lambda k: (-difflib.SequenceMatcher(None, key, k).ratio(), k))


def load_pykeen(source: str) -> KnowledgeGraph:
    """A pykeen dataset by name, split as pykeen splits it; inverses added here."""
    name = source.split(":", 1)[1] if source.startswith("pykeen:") else source
    known = _pykeen_names()
    key = _normalize_dataset(name)
    if key not in known:
        raise UserError(f"unknown dataset {name!r}; known pykeen datasets (closest first): {', '.join(_ranked_names(name, known))}")
    from pykeen.datasets import get_dataset

    try:
        ds = get_dataset(dataset=key)
        factories = {"train": ds.training, "valid": ds.validation, "test": ds.testing}
        _ = [f.mapped_triples for f in factories.values()]
    except Exception as exc:  # download failures, missing optional deps
        offline = ", ".join(PYKEEN_OFFLINE)
        raise UserError(f"pykeen dataset {key!r} could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                        f"offline datasets: {offline}") from None
    tf = ds.training
    id_to_ent = {i: e for e, i in tf.entity_to_id.items()}
    id_to_rel = {i: r for r, i in tf.relation_to_id.items()}
    entities = _unique_names([_clean_name(id_to_ent[i]) for i in range(tf.num_entities)], [str(i) for i in range(tf.num_entities)])
    relations = _paired_relation_names([_clean_name(id_to_rel[i]) for i in range(tf.num_relations)], f"pykeen:{key}")
    splits = {s: _with_inverses(f.mapped_triples.numpy().astype(np.int64)) for s, f in factories.items() if f is not None}
    stats = {"format": "pykeen", "dataset": key, "inverses_added": True, "source_relations": tf.num_relations}
    return _finish(entities, relations, splits, f"pykeen:{key}", stats)


#: Loader registry: name -> callable(source, **kwargs) -> KnowledgeGraph.
LOADERS: dict[str, Callable[..., KnowledgeGraph]] = {
    "tsv": load_tsv,
    "folder": load_folder,
    "betae": load_betae,
    "pykeen": load_pykeen,
    "metaqa": load_metaqa,
}


def _first_line(path: Path) -> str:
    for _, ln in read_lines(path):
        if ln.strip():
            return ln
    return ""


def _detect(source: str) -> str:
    if source.startswith("pykeen:"):
        return "pykeen"
    path = Path(source)
    if path.is_file():
        return "tsv"
    if path.is_dir():
        train = path / "train.txt"
        if not train.is_file() and (path / "kb.txt").is_file():
            return "metaqa"
        if not train.is_file():
            raise UserError(f"{path}: folder has no train.txt (expected train.txt, valid.txt, test.txt, "
                            "or a MetaQA kb.txt)")
        parts = _first_line(train).split("\t")
        if len(parts) == 3 and all(p.strip().lstrip("-").isdigit() for p in parts):
            return "betae"
        return "folder"
    looks_like_path = os.sep in source or "/" in source or bool(Path(source).suffix) or source.startswith(".")
    if looks_like_path:
        raise UserError(f"{source}: file or folder not found")
    return "pykeen"


def load_kg(source: str | os.PathLike, *, format: str | None = None, **kwargs: Any) -> KnowledgeGraph:
    """Load a knowledge graph; ``format`` (a :data:`LOADERS` key) is detected when None.

    A path to a file is ``tsv``; a folder whose ``train.txt`` holds integer
    triples is ``betae``, otherwise ``folder``; anything else is a pykeen
    dataset name (``umls``, or ``pykeen:umls``).
    """
    source = str(source)
    if format is None:
        format = _detect(source)
    try:
        loader = LOADERS[format]
    except KeyError:
        raise UserError(f"unknown KG format {format!r}; known: {', '.join(sorted(LOADERS))}") from None
    return loader(source, **kwargs)


def drop_edges(kg: KnowledgeGraph, fraction: float, seed: int) -> KnowledgeGraph:
    """Remove ``fraction`` of the training edges (an edge with its inverse), into ``dropped``.

    Edges are grouped with their inverse partner ``(t, r^1, h)``; ``round(fraction
    * groups)`` groups are removed, chosen with ``numpy.random.default_rng(seed)``
    over the groups in sorted order, so the result depends only on the KG's
    content, ``fraction`` and ``seed``.  The LGOT protocol uses ``fraction=0.5``.
    """
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"drop_edges: fraction must be in [0, 1], got {fraction}")
    train = kg.train
    if fraction == 0.0 or len(train) == 0:
        return kg
    n, num_rel = kg.num_entities, kg.num_relations
    # Canonical representative of each pair: the even-relation direction.
    canon = np.where((train[:, 1] % 2 == 0)[:, None], train, np.stack([train[:, 2], train[:, 1] ^ 1, train[:, 0]], 1))
    keys = _edge_keys(canon, n, num_rel)
    groups, group_of = np.unique(keys, return_inverse=True)  # sorted group keys
    rng = np.random.default_rng(seed)
    k = int(round(fraction * len(groups)))
    chosen = np.zeros(len(groups), dtype=bool)
    chosen[rng.permutation(len(groups))[:k]] = True
    removed = chosen[group_of.reshape(-1)]
    stats = dict(kg.stats)
    stats.update(drop_fraction=float(fraction), drop_seed=int(seed), dropped_edges=int(removed.sum()), dropped_pairs=k)
    return replace(kg, train=train[~removed], dropped=np.concatenate([kg.dropped, train[removed]]), stats=stats)
