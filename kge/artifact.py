"""The compiled knowledge graph: an artifact folder and its in-memory view.

Folder layout (readable without this package)::

    entities.tsv      id<TAB>name, ids from 0 (names unique)
    relations.tsv     id<TAB>name, ids from 0; the inverse of relation ``X`` is named ``X^-1``
    matrices.npz      stacked CSR of shape (R*N, N): indptr int64 (R*N+1,), indices int32
                      (sorted within each row), data float32; row r*N + h holds M_r[h, :]
                      [absent in a lazy artifact]
    embeddings.npz    entity (N, d) and relation (R, d) complex64 with
                      score(h, r, t) = Re(sum(e_h * w_r * conj(e_t)))   [optional; required when lazy]
    observed.tsv      h<TAB>r<TAB>t id triples the matrices treat as known (value 1.0)
    missing.tsv       h<TAB>r<TAB>t id triples held out (dropped edges, valid/test splits)
    meta.json         {"format_version": 1}, source, counts, parameters, package versions and
                      {"files": {name: sha256}} for every other file in the folder

A *lazy* artifact (``meta.json["matrices"] == "lazy"``, threshold and delta in
``meta.json["calibration"]``) has no ``matrices.npz``: its ``matrices`` is a
:class:`kge.lazy.LazyMatrices` that computes calibrated rows from the
embeddings when a query needs them.  :meth:`Artifact.load` reads either kind.

``format_version`` (:data:`FORMAT_VERSION`) names this layout; loading an
artifact of another (or no) version is an :class:`ArtifactVersionError` that
says to rebuild it with ``python -m kge.build``.  :meth:`Artifact.load` is the
one loading path of every tool (each CLI's ``--skip-artifact-checksums``,
:func:`add_checksum_argument`, maps to ``verify=False``): any file listed in
``meta.json["files"]`` is verified on load (a mismatch names the file), a
meta.json without checksums is refused unless ``verify=False`` is explicit, and
the arrays are checked whatever ``verify`` says (finite embeddings, calibrated
values in [0, 1], CSR structure in range: cheap next to reading them).  Every
problem is one :class:`UserError` line naming the file and the exact rebuild
command (:func:`rebuild_command`, from meta.json's ``build_config``).
:meth:`Artifact.add_file` adds a file and keeps the checksums current (the
engine's own caches live outside the artifact: it only reads artifacts).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import scipy.sparse as sp

from kgreason.cli import SKIP_CHECKSUMS_FLAG, SKIP_CHECKSUMS_HELP  # re-exported: the one flag that skips the checksums
from kgreason.constants import INVERSE_SUFFIX  # re-exported: kge.artifact.INVERSE_SUFFIX is public
from kgreason.errors import UserError, unknown_name
from kgreason.files import is_plain_name, read_lines, write_output

if TYPE_CHECKING:  # pragma: no cover
    from .lazy import LazyMatrices
    from .rows import RelationRows

__all__ = ["Artifact", "ArtifactVersionError", "read_meta", "read_vocab", "read_triples", "read_embeddings", "sha256_file",
           "rebuild_command", "add_checksum_argument", "SKIP_CHECKSUMS_FLAG", "INVERSE_SUFFIX", "FORMAT_VERSION",
           "LAZY_REQUIRED_FILES"]

#: Version of the folder layout written by :meth:`Artifact.save` (1: the layout above).
FORMAT_VERSION = 1
REQUIRED_FILES = ("entities.tsv", "relations.tsv", "matrices.npz", "observed.tsv", "missing.tsv", "meta.json")
#: The files of a lazy artifact: the embeddings stand in for the matrices.
LAZY_REQUIRED_FILES = ("entities.tsv", "relations.tsv", "embeddings.npz", "observed.tsv", "missing.tsv", "meta.json")


def add_checksum_argument(parser) -> None:
    """Add :data:`SKIP_CHECKSUMS_FLAG` (dest ``skip_artifact_checksums``) to an argparse parser."""
    parser.add_argument(SKIP_CHECKSUMS_FLAG, action="store_true", help=SKIP_CHECKSUMS_HELP)


def rebuild_command(path: str | os.PathLike, meta: Any) -> str:
    """The ``python -m kge.build ...`` line that rebuilds the artifact at ``path``, from meta.json's
    ``build_config`` (every option that differs from its default, then ``--overwrite``); from
    ``source`` alone when meta.json records no build configuration."""
    meta = meta if isinstance(meta, dict) else {}
    config = meta.get("build_config")
    source = meta.get("source") if isinstance(meta.get("source"), str) else "SOURCE"
    args = ["--kg", source, "--out", str(path)]
    if isinstance(config, dict) and isinstance(config.get("kg"), str):
        args[1] = config["kg"]
        try:
            from .build_config import flat_defaults

            defaults = flat_defaults()
        except Exception:  # noqa: BLE001 - a broken build module must not hide the load error being reported
            defaults = {}
        for name, default in defaults.items():
            value = config.get(name, default)
            if name in ("kg", "out", "overwrite") or value == default or value is None or isinstance(value, (dict, list)):
                continue
            args += [f"--{name.replace('_', '-')}", str(value)]
    args.append("--overwrite")
    return "python -m kge.build " + " ".join(shlex.quote(a) for a in args)


def _rebuild(path: Path, meta: Any) -> str:
    return f"rebuild it with {rebuild_command(path, meta)}"


def _matrices_kind(path: Path, meta: dict[str, Any]) -> str:
    """``meta.json["matrices"]``: "eager" (the default, as written before lazy artifacts) or "lazy"."""
    kind = meta.get("matrices", "eager")
    if kind not in ("eager", "lazy"):
        raise UserError(f"{path / 'meta.json'}: 'matrices' must be \"eager\" or \"lazy\", got {kind!r}; "
                        f"{_rebuild(path, meta)}")
    return kind


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


class ArtifactVersionError(UserError):
    """The artifact's ``format_version`` is missing or not :data:`FORMAT_VERSION` (rebuild it)."""


def _read_vocab(path: Path) -> list[str]:
    names: list[str] = []
    for lineno, line in read_lines(path):
        parts = line.split("\t")
        if len(parts) != 2 or not (parts[0].isascii() and parts[0].isdigit()):
            raise UserError(f"{path}:{lineno}: expected 'id<TAB>name', got {line!r}")
        if int(parts[0]) != len(names):
            raise UserError(f"{path}:{lineno}: expected id {len(names)}, got {parts[0]}")
        names.append(parts[1])
    return names


def _write_meta(path: Path, meta: dict[str, Any]) -> None:
    write_output(path, json.dumps(meta, indent=2, sort_keys=True), what="meta.json")


def _check_meta(path: Path, meta: Any, verify: bool) -> dict[str, Any]:
    """``meta.json``'s content checked for type, format version and (with ``verify``) checksums."""
    where = path / "meta.json"
    if not isinstance(meta, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(meta).__name__}; rebuild the artifact")
    rebuild = _rebuild(path, meta)
    version = meta.get("format_version")
    if version is None:
        raise ArtifactVersionError(f"artifact {path}: meta.json has no format_version (an artifact from an older "
                                   f"kgreason; this one reads version {FORMAT_VERSION}); {rebuild}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ArtifactVersionError(f"{where}: format_version must be an integer, got {version!r}; {rebuild}")
    if version < FORMAT_VERSION:
        raise ArtifactVersionError(f"artifact {path}: format version {version} is older than the version "
                                   f"{FORMAT_VERSION} this kgreason reads; {rebuild}")
    if version > FORMAT_VERSION:
        raise ArtifactVersionError(f"artifact {path}: format version {version} is newer than the version "
                                   f"{FORMAT_VERSION} this kgreason reads; upgrade kgreason, or {rebuild}")
    files = meta.get("files", {})
    if not isinstance(files, dict) or not all(is_plain_name(k) and isinstance(v, str) for k, v in files.items()):
        raise UserError(f"{where}: 'files' must map file names to sha256 digests; {rebuild}")
    if verify and not any(name in files for name in REQUIRED_FILES + LAZY_REQUIRED_FILES):
        raise UserError(f"artifact {path}: meta.json lists no checksums, so its files cannot be verified; "
                        f"{rebuild}, or load it with verify=False ({SKIP_CHECKSUMS_FLAG} on the command line) to skip the check")
    return meta


def _savez_reproducible(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez`` (same layout: uncompressed ``NAME.npy`` members, zip64) with every member dated 1980-01-01,
    so equal arrays give equal bytes: np.savez stamps the wall-clock time, and a seeded rebuild then differed
    from the first in its checksums (issue 22 item 5)."""
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)


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


def read_meta(path: str | os.PathLike, *, verify: bool = True, required: Sequence[str] | None = None,
              files: Sequence[str] | None = None) -> dict[str, Any]:
    """An artifact folder's ``meta.json``, checked as :meth:`Artifact.load` checks it: a folder, valid
    UTF-8 JSON holding an object, the format version, the ``required`` files present (default: those of
    the artifact's kind, :data:`REQUIRED_FILES` or, lazy, :data:`LAZY_REQUIRED_FILES`) and (with ``verify``)
    the sha256 of each file meta.json lists (only those in ``files`` when given).  Every problem is a
    one-line :class:`UserError` naming the folder or ``meta.json``.
    """
    path = Path(path)
    if not path.is_dir():
        if path.exists():
            raise UserError(f"artifact {str(path)!r} is a file; expected an artifact folder")
        raise UserError(f"artifact folder {str(path)!r} does not exist")
    # meta.json first: an artifact of another format version may have other files.
    if not (path / "meta.json").is_file():
        raise UserError(f"artifact {path}: missing file 'meta.json' (not an artifact folder?)")
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path / 'meta.json'}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path / 'meta.json'}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    except (OSError, RecursionError) as exc:
        raise UserError(f"{path / 'meta.json'}: cannot read ({type(exc).__name__})") from None
    meta = _check_meta(path, meta, verify)
    lazy = _matrices_kind(path, meta) == "lazy"
    if required is None:
        required = LAZY_REQUIRED_FILES if lazy else REQUIRED_FILES
    for name in required:
        if not (path / name).is_file():
            if lazy and name == "embeddings.npz":
                raise UserError(f"artifact {path}: lazy matrices need 'embeddings.npz', which is missing; "
                                f"{_rebuild(path, meta)}")
            raise UserError(f"artifact {path}: missing file {name!r}; {_rebuild(path, meta)}")
    if verify:
        for name, digest in sorted(meta.get("files", {}).items()):
            if files is not None and name not in files:
                continue
            f = path / name
            if not f.is_file():
                raise UserError(f"artifact {path}: file {name!r} listed in meta.json is missing; {_rebuild(path, meta)}")
            actual = sha256_file(f)
            if actual != digest:
                raise UserError(
                    f"artifact {path}: checksum mismatch for {name!r} (meta.json says {digest[:12]}…, the file has "
                    f"{actual[:12]}…: it changed since the build); {_rebuild(path, meta)} (or pass "
                    f"{SKIP_CHECKSUMS_FLAG} to load it unverified)"
                )
    return meta


#: Public names of the folder's readers (UTF-8, errors as ``file:line`` UserErrors).
read_vocab = _read_vocab
read_triples = _read_triples


@dataclass
class Artifact:
    """A knowledge graph compiled into calibrated sparse relation matrices.

    Shapes: ``N = num_entities``, ``R = num_relations``; ``matrices`` is a scipy
    CSR of shape ``(R*N, N)``, or, in a lazy artifact, a :class:`kge.lazy.LazyMatrices`
    of that shape that computes rows on demand (:attr:`is_lazy`); ``observed``/``missing``
    are ``(E, 3)`` int64 ``(head, relation, tail)`` arrays.
    """

    entities: list[str]
    relations: list[str]
    matrices: sp.csr_matrix | LazyMatrices
    observed: np.ndarray
    missing: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    embeddings: dict[str, np.ndarray] | None = None
    path: Path | None = None

    def __post_init__(self) -> None:
        from .lazy import LazyMatrices

        n, r = len(self.entities), len(self.relations)
        m = self.matrices
        lazy = isinstance(m, LazyMatrices)
        if not lazy and not sp.isspmatrix_csr(m) and not isinstance(m, sp.csr_array):
            raise ValueError(f"matrices must be scipy CSR or kge.lazy.LazyMatrices, got {type(m).__name__}")
        if m.shape != (r * n, n):
            raise ValueError(f"matrices has shape {m.shape}, expected (R*N, N) = ({r * n}, {n})")
        if lazy:
            # The lazy matrices compute from these arrays: the artifact saves the same ones.
            self.embeddings = {"entity": m.entity, "relation": m.relation}
        else:
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
        self._rows_cache: dict[str, Any] = {}  # device -> kge.rows.RelationRows (relation_rows)

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
    @property
    def is_lazy(self) -> bool:
        """True when the matrices are computed on demand (:class:`kge.lazy.LazyMatrices`)."""
        from .lazy import LazyMatrices

        return isinstance(self.matrices, LazyMatrices)

    def relation_block(self, r: int) -> sp.csr_matrix:
        """M_r as a scipy CSR (N, N) sharing memory with the stacked matrix.

        Lazy artifacts compute all N rows of M_r now (N rows of the calibration's
        cost; see :meth:`kge.lazy.LazyMatrices.estimate_seconds`).
        """
        n = self.num_entities
        if not 0 <= r < self.num_relations:
            raise IndexError(f"relation id {r} out of range [0, {self.num_relations})")
        if self.is_lazy:
            return self.matrices.relation_block(r)
        ip = self.matrices.indptr
        lo, hi = int(ip[r * n]), int(ip[(r + 1) * n])
        indptr = ip[r * n : (r + 1) * n + 1] - lo
        return sp.csr_matrix((self.matrices.data[lo:hi], self.matrices.indices[lo:hi], indptr), shape=(n, n), copy=False)

    def relation_matrix(self, r: int, device: str = "cpu"):
        """M_r as a torch sparse CSR tensor (N, N), float32, int32 indices; cached per device."""
        key = (r, str(device))
        hit = self._torch_cache.get(key)
        if hit is not None:
            return hit
        from .rows import csr_tensor

        t = csr_tensor(self.relation_block(r), device)
        self._torch_cache[key] = t
        return t

    def relation_rows(self, *, device: str = "cpu") -> "RelationRows":
        """The relation matrices as a projection reads them (:class:`kge.rows.RelationRows`), on ``device``.

        Eager artifacts: :class:`kge.rows.EagerRows`, the stacked CSR prepared once (one
        transpose) on first use; lazy ones: :class:`kge.rows.LazyRows` (rows computed on
        ``device``, the row cache shared).  Cached per device: every executor of this
        artifact shares one prepared copy of the KG.
        """
        import torch

        from .rows import EagerRows, LazyRows

        key = str(torch.device(device))
        hit = self._rows_cache.get(key)
        if hit is None:
            hit = (LazyRows(matrices=self.matrices, device=key) if self.is_lazy
                   else EagerRows(matrices=self.matrices, num_entities=self.num_entities, device=key))
            self._rows_cache[key] = hit
        return hit

    def nnz_per_relation(self) -> np.ndarray:
        """Entries of each M_r: int64 (R,).  Unknown for lazy matrices (a :class:`UserError`)."""
        if self.is_lazy:
            raise UserError(f"artifact {self.path or ''}: lazy matrices have no stored entries to count "
                            "(materialize them with Artifact.materialize() or build with --matrices eager)")
        n = self.num_entities
        ip = self.matrices.indptr
        return ip[n :: n][: self.num_relations] - ip[0 : self.num_relations * n : n]

    def materialize(self, *, max_matrix_gb: float | None = None, progress: bool = True) -> "Artifact":
        """This artifact with eager matrices: ``self`` when already eager, else a new Artifact whose
        stacked CSR is computed now (all R*N rows, as ``python -m kge.build --matrices eager`` would;
        ``max_matrix_gb`` bounds it, see :meth:`kge.lazy.LazyMatrices.materialize`)."""
        if not self.is_lazy:
            return self
        lazy = self.matrices
        meta = {k: v for k, v in self.meta.items() if k not in ("files", "matrices")}
        return Artifact(entities=list(self.entities), relations=list(self.relations),
                        matrices=lazy.materialize(max_matrix_gb=max_matrix_gb, progress=progress),
                        observed=self.observed, missing=self.missing, meta=meta,
                        embeddings={"entity": lazy.entity, "relation": lazy.relation})

    # -------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike) -> Path:
        """Write the folder (overwriting its files) and return its path.

        A lazy artifact writes no ``matrices.npz`` (its embeddings are the matrices)
        and records ``"matrices": "lazy"`` with the threshold and delta in meta.json.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_vocab(path / "entities.tsv", self.entities)
        _write_vocab(path / "relations.tsv", self.relations)
        m = self.matrices
        lazy = self.is_lazy
        if not lazy:
            m.sort_indices()
            # copy=False: __post_init__ already fixed the dtypes, and a copy of a
            # 100M-entry matrix would add ~8 bytes per entry to the build's peak memory.
            _savez_reproducible(path / "matrices.npz", indptr=m.indptr.astype(np.int64, copy=False),
                     indices=m.indices.astype(np.int32, copy=False), data=m.data.astype(np.float32, copy=False),
                     shape=np.array(m.shape, dtype=np.int64))
        if self.embeddings is not None:
            _savez_reproducible(path / "embeddings.npz", **self.embeddings)
        _write_triples(path / "observed.tsv", self.observed)
        _write_triples(path / "missing.tsv", self.missing)
        meta = dict(self.meta)
        meta["num_entities"] = self.num_entities
        meta["num_relations"] = self.num_relations
        meta["num_observed"] = int(len(self.observed))
        meta["num_missing"] = int(len(self.missing))
        meta["format_version"] = FORMAT_VERSION
        files = dict(meta.get("files", {}))
        if lazy:
            meta["matrices"] = "lazy"
            meta.pop("nnz", None)
            calib = dict(meta.get("calibration", {}))
            calib.update(threshold=m.threshold, delta=m.delta)
            calib.setdefault("row_cache_gb", m.row_cache_gb)
            meta["calibration"] = calib
            files.pop("matrices.npz", None)  # a lazy artifact's meta never vouches for a stale matrix file
        else:
            meta["matrices"] = "eager"
            meta["nnz"] = int(self.matrices.nnz)
        for name in ("entities.tsv", "relations.tsv", "embeddings.npz", "observed.tsv", "missing.tsv") + \
                (() if lazy else ("matrices.npz",)):
            if (path / name).exists():
                files[name] = sha256_file(path / name)
        meta["files"] = files
        self.meta = meta
        _write_meta(path / "meta.json", meta)
        self.path = path
        return path

    def add_file(self, name: str, data: bytes | np.ndarray) -> Path:
        """Add (or replace) a file in the saved folder and record its sha256 in meta.json."""
        if self.path is None:
            raise ValueError("artifact has no folder yet: save() it first")
        if not is_plain_name(name) or name == "meta.json":
            raise ValueError(f"add_file: {name!r} is not a plain file name other than meta.json")
        target = self.path / name
        if isinstance(data, np.ndarray):
            buf = io.BytesIO()
            np.save(buf, data)
            data = buf.getvalue()
        write_output(target, data, what="add_file")
        self.meta.setdefault("files", {})[name] = sha256_file(target)
        _write_meta(self.path / "meta.json", self.meta)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike, *, verify: bool = True, load_embeddings: bool = True,
             row_cache_gb: float | None = None, row_store_gb: float | None = None) -> "Artifact":
        """Read an artifact folder; with ``verify`` every file's sha256 is checked against meta.json.

        This is the one loading path of every tool.  The format version is always
        checked (:class:`ArtifactVersionError`); ``verify=False`` (the CLIs'
        ``--skip-artifact-checksums``) skips the checksums, and is needed to load a
        folder whose meta.json lists none.  The arrays are checked whatever ``verify``
        says: the CSR's structure and calibrated values in [0, 1], and finite
        embeddings of the right shapes (``embeddings.npz`` is read for this even with
        ``load_embeddings=False``).  Every problem is a one-line :class:`UserError`
        naming the file and the rebuild command (:func:`rebuild_command`).  A lazy artifact always loads its embeddings (they
        are its matrices), whatever ``load_embeddings`` says; ``row_cache_gb``
        overrides the row-cache budget its build recorded (default 4 GiB), ``row_store_gb``
        the disk budget of its persisted rows (:mod:`kge.rowstore`; default
        :data:`kge.lazy.DEFAULT_ROW_STORE_GB`, 0 = off).
        """
        from .lazy import check_row_cache_gb, check_row_store_gb

        path = Path(path)
        if row_cache_gb is not None:
            check_row_cache_gb(row_cache_gb, "row_cache_gb")
        if row_store_gb is not None:
            check_row_store_gb(row_store_gb, "row_store_gb")
        meta = read_meta(path, verify=verify)
        lazy = _matrices_kind(path, meta) == "lazy"
        try:
            entities = _read_vocab(path / "entities.tsv")
            relations = _read_vocab(path / "relations.tsv")
        except ArtifactVersionError:
            raise
        except UserError as exc:  # a hand-edited (or unverified, damaged) vocabulary
            raise UserError(f"{exc}; {_rebuild(path, meta)}") from None
        n, r = len(entities), len(relations)
        matrices = None
        if not lazy:
            with _npz(path, "matrices.npz", meta, ("indptr", "indices", "data")) as z:
                indptr, indices, data = z["indptr"], z["indices"], z["data"]
            _check_csr(path / "matrices.npz", meta, indptr, indices, data, r * n, n)
            try:
                matrices = sp.csr_matrix((data, indices, indptr), shape=(r * n, n), copy=False)
            except ValueError as exc:
                raise UserError(f"{path / 'matrices.npz'}: not a valid CSR matrix ({exc}); "
                                f"{_rebuild(path, meta)}") from None
        embeddings = None
        if (path / "embeddings.npz").is_file():
            # Checked even when not kept (about as cheap as its checksum): no tool accepts an artifact
            # that another one, reading the embeddings, refuses.
            loaded = read_embeddings(path, verify=False, meta=meta)
            embeddings = loaded if (load_embeddings or lazy) else None
        try:
            observed = _read_triples(path / "observed.tsv")
            missing = _read_triples(path / "missing.tsv")
        except UserError as exc:
            raise UserError(f"{exc}; {_rebuild(path, meta)}") from None
        for name, arr in (("observed.tsv", observed), ("missing.tsv", missing)):
            _check_triples(path / name, meta, arr, n, r)
        try:
            if lazy:
                matrices = _lazy_matrices(path, meta, embeddings, observed, n, r, row_cache_gb, row_store_gb)
            return cls(
                entities=entities,
                relations=relations,
                matrices=matrices,
                observed=observed,
                missing=missing,
                meta=meta,
                embeddings=embeddings,
                path=path,
            )
        except UserError:
            raise
        except ValueError as exc:
            raise UserError(f"artifact {path}: {exc}; {_rebuild(path, meta)}") from None


class _npz:
    """``np.load`` of an artifact's .npz as a context manager whose read errors (an empty, truncated or
    foreign file: only possible unverified, checksums catch changed files) are one UserError line
    naming the file and the rebuild command; ``keys`` must all be present."""

    def __init__(self, path: Path, name: str, meta: Any, keys: Sequence[str]) -> None:
        self.file, self.path, self.meta, self.keys = path / name, path, meta, keys
        self.z = None

    def _fail(self, why: str) -> UserError:
        return UserError(f"{self.file}: {why}; {_rebuild(self.path, self.meta)}")

    def __enter__(self):
        try:
            self.z = np.load(self.file, allow_pickle=False)
        except (EOFError, ValueError, OSError, zipfile.BadZipFile) as exc:
            why = "empty file" if isinstance(exc, EOFError) or self.file.stat().st_size == 0 else \
                f"not a readable .npz file ({type(exc).__name__})"
            raise self._fail(why) from None
        if not hasattr(self.z, "files"):
            raise self._fail("not a .npz archive (a single .npy array)")
        missing = [k for k in self.keys if k not in self.z.files]
        if missing:
            self.z.close()
            raise self._fail(f"arrays {missing} missing (it holds {self.z.files})")
        return self

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.z[key]
        except (EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError) as exc:
            raise self._fail(f"array {key!r} is unreadable ({type(exc).__name__})") from None

    def files(self) -> list[str]:
        return list(self.z.files)

    def __exit__(self, *exc) -> None:
        self.z.close()


def _all_within(a: np.ndarray, lo: float, hi: float) -> bool:
    """Every element of ``a`` in ``[lo, hi]``; NaN is not (``min``/``max`` propagate it).

    Two reductions and no temporary array (28 ms for 48M float32 values; docs/artifacts.md).
    """
    if a.size == 0:
        return True
    low, high = a.min(), a.max()
    return bool(low >= lo) and bool(high <= hi)


def _all_finite(a: np.ndarray) -> bool:
    """No NaN or infinity in ``a`` (complex arrays: in either part), by ``min``/``max`` over its real view."""
    if a.size == 0:
        return True
    v = a.view(a.real.dtype) if np.iscomplexobj(a) else a
    return bool(np.isfinite(v.min())) and bool(np.isfinite(v.max()))


def _check_csr(file: Path, meta: Any, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
               rows: int, cols: int) -> None:
    """The stacked CSR's structure (row pointers, column range) and values (calibrated: in [0, 1])."""
    path = file.parent

    def fail(why: str) -> UserError:
        return UserError(f"{file}: {why}; {_rebuild(path, meta)}")

    for name, arr, kinds in (("indptr", indptr, "iu"), ("indices", indices, "iu"), ("data", data, "f")):
        if arr.ndim != 1 or arr.dtype.kind not in kinds:
            raise fail(f"array {name!r} has dtype {arr.dtype} and {arr.ndim} dimensions, expected a 1-D "
                       f"{'integer' if kinds == 'iu' else 'float'} array")
    if len(indptr) != rows + 1:
        raise fail(f"indptr has {len(indptr):,} entries, expected R*N+1 = {rows + 1:,} for the vocabularies' sizes")
    if len(indices) != len(data) or int(indptr[0]) != 0 or int(indptr[-1]) != len(data):
        raise fail(f"indptr [{int(indptr[0])} .. {int(indptr[-1])}] does not span the {len(data):,} entries "
                   f"({len(indices):,} column indices)")
    if rows and not bool((indptr[1:] >= indptr[:-1]).all()):
        raise fail("indptr is not non-decreasing")
    if len(indices) and not _all_within(indices, 0, cols - 1):
        raise fail(f"column indices outside [0, {cols})")
    if not _all_within(data, 0.0, 1.0):
        what = "NaN or infinite" if not _all_finite(data) else "outside [0, 1]"
        raise fail(f"calibrated probabilities {what}")


def _check_triples(file: Path, meta: Any, triples: np.ndarray, n: int, r: int) -> None:
    """Entity ids in [0, N) and relation ids in [0, R) (the samplers and the executor index with them)."""
    if len(triples) == 0:
        return
    for col, hi, what in ((0, n, "head"), (1, r, "relation"), (2, n, "tail")):
        if not _all_within(triples[:, col], 0, hi - 1):
            k = int(np.flatnonzero((triples[:, col] < 0) | (triples[:, col] >= hi))[0])
            raise UserError(f"{file}: row {k + 1}: {what} id {int(triples[k, col])} out of range [0, {hi}); "
                            f"{_rebuild(file.parent, meta)}")


def read_embeddings(path: str | os.PathLike, *, verify: bool = True, meta: Any = None) -> dict[str, np.ndarray]:
    """An artifact's ``embeddings.npz`` as ``{"entity": (N, d), "relation": (R, d)}`` complex arrays, checked:
    both present, 2-D, ``N``/``R`` the artifact's counts (meta.json's ``num_entities``/``num_relations``),
    one width ``d``, every value finite.  With ``verify`` meta.json is read and checked first
    (:func:`read_meta`, the checksums of embeddings.npz and meta.json only).  Problems are one-line
    UserErrors naming the file and the rebuild command; tools that need only the
    embeddings (``kge.linkpred``) load them through here.
    """
    path = Path(path)
    if meta is None or verify:
        meta = read_meta(path, verify=verify, required=("embeddings.npz",), files=("embeddings.npz",))
    file = path / "embeddings.npz"
    with _npz(path, "embeddings.npz", meta, ("entity", "relation")) as z:
        out = {k: z[k] for k in z.files()}
    ent, rel = out["entity"], out["relation"]

    def fail(why: str) -> UserError:
        return UserError(f"{file}: {why}; {_rebuild(path, meta)}")

    if ent.ndim != 2 or rel.ndim != 2 or ent.shape[1] != rel.shape[1]:
        raise fail(f"embeddings of shape {ent.shape}/{rel.shape}: expected (N, d) and (R, d)")
    if ent.dtype.kind not in "fc" or rel.dtype.kind not in "fc":
        raise fail(f"embeddings of dtype {ent.dtype}/{rel.dtype}: expected complex (or float) arrays")
    for key, arr in (("num_entities", ent), ("num_relations", rel)):
        want = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(want, int) and arr.shape[0] != want:
            raise fail(f"{arr.shape[0]:,} {key[4:]} embeddings, but meta.json counts {want:,}")
    for key, arr in (("entity", ent), ("relation", rel)):
        if not _all_finite(arr):
            bad = int(arr.shape[0] - np.isfinite(arr).all(axis=1).sum())
            raise fail(f"{bad:,} of the {arr.shape[0]:,} {key} embeddings hold NaN or infinite values "
                       f"(a diverged training run?)")
    return out


def _lazy_matrices(path: Path, meta: dict[str, Any], embeddings: dict[str, np.ndarray] | None, observed: np.ndarray,
                   n: int, r: int, row_cache_gb: float | None, row_store_gb: float | None) -> "LazyMatrices":
    """The :class:`~kge.lazy.LazyMatrices` a lazy artifact's meta.json and embeddings describe."""
    from .lazy import DEFAULT_ROW_CACHE_GB, DEFAULT_ROW_STORE_GB, LazyMatrices, check_row_cache_gb

    rebuild = _rebuild(path, meta)
    if embeddings is None or "entity" not in embeddings or "relation" not in embeddings:
        raise UserError(f"artifact {path}: lazy matrices need 'embeddings.npz' with arrays 'entity' and "
                        f"'relation'; {rebuild}")
    ent, rel = embeddings["entity"], embeddings["relation"]
    if ent.ndim != 2 or rel.ndim != 2 or ent.shape[0] != n or rel.shape[0] != r or ent.shape[1] != rel.shape[1]:
        raise UserError(f"artifact {path}: embeddings of shape {ent.shape}/{rel.shape} do not fit {n} entities and "
                        f"{r} relations; {rebuild}")
    calib = meta.get("calibration")
    calib = calib if isinstance(calib, dict) else {}
    threshold, delta = calib.get("threshold"), calib.get("delta")
    if not (isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0):
        raise UserError(f"{path / 'meta.json'}: lazy matrices need calibration.threshold in (0, 1), got {threshold!r}; "
                        f"{rebuild}")
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise UserError(f"{path / 'meta.json'}: lazy matrices need calibration.delta in [0, 1), got {delta!r}; "
                        f"{rebuild}")
    if row_cache_gb is None:
        recorded = calib.get("row_cache_gb", DEFAULT_ROW_CACHE_GB)
        row_cache_gb = check_row_cache_gb(recorded, f"{path / 'meta.json'}: calibration.row_cache_gb")
    return LazyMatrices(entity=ent, relation=rel, observed=observed, threshold=float(threshold), delta=float(delta),
                        row_cache_gb=row_cache_gb,
                        row_store_gb=DEFAULT_ROW_STORE_GB if row_store_gb is None else row_store_gb)
