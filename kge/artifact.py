"""The compiled knowledge graph: an artifact folder and its in-memory view.

Folder layout (readable without this package)::

    entities.tsv      id<TAB>name, ids from 0 (names unique)
    relations.tsv     id<TAB>name, ids from 0; the inverse of relation ``X`` is named ``X^-1``
    matrices.npz      stacked CSR of shape (R*N, N): indptr int64 (R*N+1,), indices int32
                      (sorted within each row), data float32; row r*N + h holds M_r[h, :]
    embeddings.npz    entity (N, d) and relation (R, d) complex64 with
                      score(h, r, t) = Re(sum(e_h * w_r * conj(e_t)))   [optional]
    observed.tsv      h<TAB>r<TAB>t id triples the matrices treat as known (value 1.0)
    missing.tsv       h<TAB>r<TAB>t id triples held out (dropped edges, valid/test splits)
    meta.json         source, counts, parameters, package versions and
                      {"files": {name: sha256}} for every other file in the folder

Any file listed in ``meta.json["files"]`` is verified on load; a mismatch names
the file.  Later stages add files (e.g. ``relation_embeddings.npy``) with
:meth:`Artifact.add_file`, which keeps the checksums current.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from .errors import UserError, unknown_name

__all__ = ["Artifact", "sha256_file", "INVERSE_SUFFIX"]

INVERSE_SUFFIX = "^-1"
REQUIRED_FILES = ("entities.tsv", "relations.tsv", "matrices.npz", "observed.tsv", "missing.tsv", "meta.json")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _write_vocab(path: Path, names: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for i, name in enumerate(names):
            if "\t" in name or "\n" in name:
                raise ValueError(f"name {name!r} (id {i}) contains a tab or newline")
            f.write(f"{i}\t{name}\n")


def _read_vocab(path: Path) -> list[str]:
    names: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].isdigit():
                raise UserError(f"{path}:{lineno}: expected 'id<TAB>name', got {line!r}")
            if int(parts[0]) != len(names):
                raise UserError(f"{path}:{lineno}: expected id {len(names)}, got {parts[0]}")
            names.append(parts[1])
    return names


def _write_triples(path: Path, triples: np.ndarray) -> None:
    triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        if len(triples):
            np.savetxt(f, triples, fmt="%d", delimiter="\t")


def _read_triples(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    try:
        arr = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2)
    except ValueError as exc:
        raise UserError(f"{path}: malformed id triples ({exc})") from None
    if arr.shape[1] != 3:
        raise UserError(f"{path}: expected 3 columns, got {arr.shape[1]}")
    return arr


@dataclass
class Artifact:
    """A knowledge graph compiled into calibrated sparse relation matrices.

    Shapes: ``N = num_entities``, ``R = num_relations``; ``matrices`` is a scipy
    CSR of shape ``(R*N, N)``; ``observed``/``missing`` are ``(E, 3)`` int64
    ``(head, relation, tail)`` arrays.
    """

    entities: list[str]
    relations: list[str]
    matrices: sp.csr_matrix
    observed: np.ndarray
    missing: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    embeddings: dict[str, np.ndarray] | None = None
    path: Path | None = None

    def __post_init__(self) -> None:
        n, r = len(self.entities), len(self.relations)
        m = self.matrices
        if not sp.isspmatrix_csr(m) and not isinstance(m, sp.csr_array):
            raise ValueError(f"matrices must be scipy CSR, got {type(m).__name__}")
        if m.shape != (r * n, n):
            raise ValueError(f"matrices has shape {m.shape}, expected (R*N, N) = ({r * n}, {n})")
        m.indptr = m.indptr.astype(np.int64, copy=False)
        m.indices = m.indices.astype(np.int32, copy=False)
        m.data = m.data.astype(np.float32, copy=False)
        self.observed = np.asarray(self.observed, dtype=np.int64).reshape(-1, 3)
        self.missing = np.asarray(self.missing, dtype=np.int64).reshape(-1, 3)
        self._entity_index = {name: i for i, name in enumerate(self.entities)}
        self._relation_index = {name: i for i, name in enumerate(self.relations)}
        if len(self._entity_index) != n:
            raise ValueError("entity names must be unique")
        if len(self._relation_index) != r:
            raise ValueError("relation names must be unique")
        self._torch_cache: dict[tuple[int, str], Any] = {}

    # ------------------------------------------------------------------ sizes
    @property
    def num_entities(self) -> int:
        return len(self.entities)

    @property
    def num_relations(self) -> int:
        return len(self.relations)

    # ------------------------------------------------------------------ names
    def entity_id(self, name: str | int, where: str = "") -> int:
        """Id of an entity given by name (or by an id, checked for range)."""
        if isinstance(name, (int, np.integer)):
            if not 0 <= int(name) < self.num_entities:
                raise UserError(f"{where + ': ' if where else ''}entity id {name} out of range [0, {self.num_entities})")
            return int(name)
        try:
            return self._entity_index[name]
        except KeyError:
            raise unknown_name("entity", name, self.entities, where) from None

    def relation_id(self, name: str | int, where: str = "") -> int:
        """Id of a relation given by name (``X^-1`` for an inverse) or id."""
        if isinstance(name, (int, np.integer)):
            if not 0 <= int(name) < self.num_relations:
                raise UserError(f"{where + ': ' if where else ''}relation id {name} out of range [0, {self.num_relations})")
            return int(name)
        try:
            return self._relation_index[name]
        except KeyError:
            raise unknown_name("relation", name, self.relations, where) from None

    def inverse_relation(self, r: int) -> int:
        """Id of the inverse of relation ``r`` (-1 if the artifact has none)."""
        name = self.relations[r]
        inv = name[: -len(INVERSE_SUFFIX)] if name.endswith(INVERSE_SUFFIX) else name + INVERSE_SUFFIX
        return self._relation_index.get(inv, -1)

    # --------------------------------------------------------------- matrices
    def relation_block(self, r: int) -> sp.csr_matrix:
        """M_r as a scipy CSR (N, N) sharing memory with the stacked matrix."""
        n = self.num_entities
        if not 0 <= r < self.num_relations:
            raise IndexError(f"relation id {r} out of range [0, {self.num_relations})")
        ip = self.matrices.indptr
        lo, hi = int(ip[r * n]), int(ip[(r + 1) * n])
        indptr = ip[r * n : (r + 1) * n + 1] - lo
        return sp.csr_matrix((self.matrices.data[lo:hi], self.matrices.indices[lo:hi], indptr), shape=(n, n), copy=False)

    def relation_matrix(self, r: int, device: str = "cpu"):
        """M_r as a torch sparse CSR tensor (N, N), float32, int32 indices; cached per device."""
        import torch

        key = (r, str(device))
        hit = self._torch_cache.get(key)
        if hit is not None:
            return hit
        block = self.relation_block(r)
        with warnings.catch_warnings():
            # torch flags all CSR tensors as "beta"; we only use them as containers.
            warnings.simplefilter("ignore", UserWarning)
            t = torch.sparse_csr_tensor(
                torch.from_numpy(block.indptr.astype(np.int32)),
                torch.from_numpy(block.indices),
                torch.from_numpy(block.data),
                size=block.shape,
                dtype=torch.float32,
            ).to(device)
        self._torch_cache[key] = t
        return t

    def nnz_per_relation(self) -> np.ndarray:
        n = self.num_entities
        ip = self.matrices.indptr
        return ip[n :: n][: self.num_relations] - ip[0 : self.num_relations * n : n]

    # -------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike) -> Path:
        """Write the folder (overwriting its files) and return its path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_vocab(path / "entities.tsv", self.entities)
        _write_vocab(path / "relations.tsv", self.relations)
        m = self.matrices
        m.sort_indices()
        # copy=False: __post_init__ already fixed the dtypes, and a copy of a
        # 100M-entry matrix would add ~8 bytes per entry to the build's peak memory.
        np.savez(path / "matrices.npz", indptr=m.indptr.astype(np.int64, copy=False),
                 indices=m.indices.astype(np.int32, copy=False), data=m.data.astype(np.float32, copy=False),
                 shape=np.array(m.shape, dtype=np.int64))
        if self.embeddings is not None:
            np.savez(path / "embeddings.npz", **self.embeddings)
        _write_triples(path / "observed.tsv", self.observed)
        _write_triples(path / "missing.tsv", self.missing)
        meta = dict(self.meta)
        meta["num_entities"] = self.num_entities
        meta["num_relations"] = self.num_relations
        meta["nnz"] = int(self.matrices.nnz)
        meta["num_observed"] = int(len(self.observed))
        meta["num_missing"] = int(len(self.missing))
        files = dict(meta.get("files", {}))
        for name in ("entities.tsv", "relations.tsv", "matrices.npz", "embeddings.npz", "observed.tsv", "missing.tsv"):
            if (path / name).exists():
                files[name] = sha256_file(path / name)
        meta["files"] = files
        self.meta = meta
        with open(path / "meta.json", "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
        self.path = path
        return path

    def add_file(self, name: str, data: bytes | np.ndarray) -> Path:
        """Add (or replace) a file in the saved folder and record its sha256 in meta.json."""
        if self.path is None:
            raise ValueError("artifact has no folder yet: save() it first")
        target = self.path / name
        if isinstance(data, np.ndarray):
            buf = io.BytesIO()
            np.save(buf, data)
            data = buf.getvalue()
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        self.meta.setdefault("files", {})[name] = sha256_file(target)
        with open(self.path / "meta.json", "w", encoding="utf-8") as f:
            json.dump(self.meta, f, indent=2, sort_keys=True)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True, load_embeddings: bool = True) -> "Artifact":
        """Read an artifact folder; with ``verify`` every file's sha256 is checked against meta.json."""
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"artifact folder {str(path)!r} does not exist")
        for name in REQUIRED_FILES:
            if not (path / name).is_file():
                raise UserError(f"artifact {path}: missing file {name!r}")
        try:
            meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path / 'meta.json'}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if verify:
            for name, digest in sorted(meta.get("files", {}).items()):
                f = path / name
                if not f.is_file():
                    raise UserError(f"artifact {path}: file {name!r} listed in meta.json is missing")
                actual = sha256_file(f)
                if actual != digest:
                    raise UserError(
                        f"artifact {path}: checksum mismatch for {name!r} "
                        f"(meta.json says {digest[:12]}…, file has {actual[:12]}…); rebuild the artifact"
                    )
        entities = _read_vocab(path / "entities.tsv")
        relations = _read_vocab(path / "relations.tsv")
        with np.load(path / "matrices.npz", allow_pickle=False) as z:
            n, r = len(entities), len(relations)
            matrices = sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=(r * n, n), copy=False)
        embeddings = None
        if load_embeddings and (path / "embeddings.npz").is_file():
            with np.load(path / "embeddings.npz", allow_pickle=False) as z:
                embeddings = {k: z[k] for k in z.files}
        return cls(
            entities=entities,
            relations=relations,
            matrices=matrices,
            observed=_read_triples(path / "observed.tsv"),
            missing=_read_triples(path / "missing.tsv"),
            meta=meta,
            embeddings=embeddings,
            path=path,
        )
