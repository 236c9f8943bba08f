"""An artifact split into P column shards, one per rank of a sharded run (docs/distributed.md).

The library; ``python -m kge.shard`` is its command line.

::

    python -m kge.shard --artifact artifacts/FB15k-237 --shards 2 --out artifacts/FB15k-237.shards2
    torchrun --nproc-per-node 2 -m engine.answer --artifact artifacts/FB15k-237.shards2 --query 2p

The N entities are cut into P contiguous blocks of about equal entries (:func:`block_bounds`: block k
is ``[bounds[k], bounds[k+1])``, the bounds where the running count of entries per tail column
crosses ``k/P`` of the total; P need not divide N, and a block may hold no entries or no entities).
Equal entries, not equal widths: a KG's popular entities often have the small ids (FB15k-237's
first half of the ids holds 73% of the entries), and a rank's memory is its entries.  Shard k holds,
for every relation, only the entries ``M_r[i, j]`` whose tail ``j`` lies in block k, as a
*hypersparse* CSR (:class:`ColumnShard`): the sorted keys ``r*N + i`` of the rows that have
an entry there, one pointer per such row, and per relation its tails in the block (``tails``)
with each entry's column an index into them, plus the values.  So relation r's entries, as the
projection kernel reads them, are a contiguous slice of the shard: rows = its heads here, columns =
its tails here (nothing is copied or re-indexed per query).  No array of a shard grows as
relations x entities: a row or column without entries in the block costs nothing.

The folder: ``meta.json`` (what was built from what, the block bounds, the build id, and every
file's sha256 under ``files``), the vocabulary (``entities.tsv``, ``relations.tsv``, copied from
the artifact: every rank names its answers) and ``shard-K-of-P.npz`` per rank.  A rank reads
``meta.json``, the vocabulary and its own shard file only (:func:`load_shard`); a folder whose
shard count is not the world size, that lacks a shard, whose shard file changed or comes from
another build is one :class:`~kgreason.errors.UserError` line.

What the LLM bridge reads on rank 0 comes with the folder too, so that ``--llm`` under torchrun
asks the prompts one process asks: ``observed.npy`` (the artifact's observed triples, (E, 3) int64
in the artifact's order: the examples of a relation question, the relation ranges of entity
linking) and under ``meta.json["artifact_meta"]`` the artifact's own meta (its file checksums key
the relation-question sidecar and the relation-embedding cache; its ``source`` finds the names
file), and the artifact's ``relation_questions.json`` when it has one.  The other ranks memory-map ``observed.npy`` and never read it.

A *lazy* artifact (rows computed from the embeddings on demand) is sharded the same way
(:class:`LazyShard`, ``meta.json["matrices"] == "lazy"``): the folder holds the embeddings once,
``entity.npy`` (N, d) and ``relation.npy`` (R, d) complex64, which a rank memory-maps (it reads
its block's tail embeddings and the head embeddings of the rows it computes, nothing else), and
``shard-K-of-P.npz`` holds the known edges whose tail lies in block k (the rows' "known tails"
counts are summed across ranks with the softmax normaliser, :mod:`engine.exec.sharded_lazy`).
The blocks are of equal width (a lazy rank's work is its score GEMM, ``rows x 2d x N_k``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kgreason.errors import UserError

__all__ = ["ColumnShard", "LazyShard", "lazy_shard", "block_bounds", "column_counts", "shard_matrices", "write_shards", "load_shard", "read_shard_meta",
           "read_shard_vocab", "read_shard_observed", "shard_file_name", "is_shard_folder", "check_not_shard_folder", "SHARD_FORMAT"]

#: An artifact's own relation-question templates (``llm_bridge.relations.ARTIFACT_FILE``), copied into its shards.
RELATION_QUESTIONS_FILE = "relation_questions.json"

#: The layout version of a shard folder (``meta.json``'s ``shard_format``).
SHARD_FORMAT = 3  # 3: observed.npy and artifact_meta (what the LLM bridge reads on rank 0)
_KIND = "kgreason-shards"


def block_bounds(n: int, shards: int, column_counts: np.ndarray | None = None) -> list[int]:
    """The P+1 bounds of the contiguous entity blocks: block k is ``[bounds[k], bounds[k+1])``.

    With ``column_counts`` (entries per tail entity, (N,)), each block holds about 1/P of the
    entries: ``bounds[k]`` is one past the first column where the running count reaches
    ``k/P`` of the total.  Without them (or with no entries), blocks of ``N/P`` entities.
    """
    if shards < 1:
        raise UserError(f"shards must be >= 1, got {shards}")
    total = 0 if column_counts is None else int(column_counts.sum())
    if total == 0:
        return [(k * n) // shards for k in range(shards + 1)]
    cum = np.cumsum(column_counts, dtype=np.int64)
    bounds = [0] + [int(np.searchsorted(cum, -(-k * total // shards), side="left")) + 1
                    for k in range(1, shards)] + [n]
    if n >= shards:  # every block at least one entity: k <= bounds[k] <= n - (P - k)
        for k in range(1, shards):
            bounds[k] = min(max(bounds[k], bounds[k - 1] + 1), n - (shards - k))
    return bounds


def column_counts(matrices: Any, n: int) -> np.ndarray:
    """Entries per tail entity of a stacked CSR (what :func:`block_bounds` balances)."""
    return np.bincount(matrices.indices, minlength=n).astype(np.int64)


def shard_file_name(rank: int, shards: int) -> str:
    return f"shard-{rank:05d}-of-{shards:05d}.npz"


@dataclass(frozen=True, eq=False)
class _Block:
    """Which block a shard is: rank ``rank`` of ``shards`` holds the tails ``[lo, hi)`` of N entities."""

    num_entities: int
    num_relations: int
    rank: int
    shards: int
    lo: int
    hi: int
    #: every rank's block bounds (P+1 entity ids): who owns which entity
    bounds: tuple[int, ...]

    @property
    def width(self) -> int:
        """N_k: the entities of this block."""
        return self.hi - self.lo


@dataclass(frozen=True, eq=False)
class ColumnShard(_Block):
    """Rank ``rank``'s part of the R relation matrices: every entry ``M_r[i, j]`` with ``lo <= j < hi``.

    ``keys`` int64 (rows,), sorted, unique: ``r*N + i`` of each row with an entry in the block;
    ``ptr`` int64 (rows+1,): row ``keys[t]``'s entries are ``ptr[t]:ptr[t+1]``; ``tails`` int32:
    relation r's tails in the block, local ids ``j - lo`` ascending, at
    ``tails[tail_ptr[r]:tail_ptr[r+1]]`` (``tail_ptr`` int64 (R+1,)); ``col`` int32: an entry's
    column as an index into its relation's tails (ascending within a row, as ``j``); ``val``
    float32 in [0, 1].  Memory: ``16 * rows + 8 * entries + 4 * (relation, tail) pairs + 8 * R``
    bytes, nothing per (relation, entity) pair without entries.
    """

    keys: np.ndarray
    ptr: np.ndarray
    col: np.ndarray
    val: np.ndarray
    tails: np.ndarray
    tail_ptr: np.ndarray
    build_id: str = ""

    @property
    def nnz(self) -> int:
        return int(self.val.size)

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.ptr.nbytes + self.col.nbytes + self.val.nbytes + self.tails.nbytes
                   + self.tail_ptr.nbytes)

    def relation_tails(self, r: int) -> np.ndarray:
        """Relation ``r``'s tails in the block (local ids ``j - lo``, ascending): what its entries' ``col`` index."""
        return self.tails[int(self.tail_ptr[r]):int(self.tail_ptr[r + 1])]

    def weight(self, r: int, i: int, j: int) -> float:
        """``M_r[i, j]`` for a tail ``j`` of this block (0.0 where there is no entry), as a Python float."""
        if not self.lo <= j < self.hi:
            raise ValueError(f"entity {j} is not in shard {self.rank}'s block [{self.lo}, {self.hi})")
        key = int(r) * self.num_entities + int(i)
        t = int(self.keys.searchsorted(key))
        if t >= self.keys.size or int(self.keys[t]) != key:
            return 0.0
        tails = self.relation_tails(r)
        c = int(tails.searchsorted(j - self.lo))
        if c >= tails.size or int(tails[c]) != j - self.lo:
            return 0.0
        lo, hi = int(self.ptr[t]), int(self.ptr[t + 1])
        cols = self.col[lo:hi]
        pos = int(cols.searchsorted(c))
        return float(self.val[lo + pos]) if pos < cols.size and int(cols[pos]) == c else 0.0


def shard_matrices(matrices: Any, num_entities: int, rank: int, shards: int, *, bounds: list[int] | None = None,
                   build_id: str = "") -> ColumnShard:
    """Shard ``rank`` of ``shards`` of an eager artifact's stacked CSR ``matrices`` ((R*N, N) scipy CSR).

    ``bounds``: the blocks (default: :func:`block_bounds` balanced by the matrices' entries).
    One relation at a time, so the transient memory is one relation's block, not the stack's.
    """
    n = int(num_entities)
    if not 0 <= rank < shards:
        raise UserError(f"rank {rank} is not in [0, {shards})")
    r_count = int(matrices.shape[0]) // max(1, n)
    if bounds is None:
        bounds = block_bounds(n, shards, column_counts(matrices, n))
    lo, hi = bounds[rank], bounds[rank + 1]
    indptr, indices, data = matrices.indptr, matrices.indices, matrices.data
    keys, counts, cols, vals, tails = [], [], [], [], []
    tail_ptr = np.zeros(r_count + 1, dtype=np.int64)
    for r in range(r_count):
        a, b = int(indptr[r * n]), int(indptr[(r + 1) * n])
        c = indices[a:b]
        keep = (c >= lo) & (c < hi)
        if not keep.any():
            tail_ptr[r + 1] = tail_ptr[r]
            continue
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr[r * n:(r + 1) * n + 1]).astype(np.int64))
        rows = rows[keep]
        cnt = np.bincount(rows, minlength=n)
        has = np.flatnonzero(cnt)
        keys.append(has + r * n)
        counts.append(cnt[has])
        local = (c[keep] - lo).astype(np.int32)
        t_r = np.unique(local)
        tails.append(t_r)
        tail_ptr[r + 1] = tail_ptr[r] + t_r.size
        cols.append(np.searchsorted(t_r, local).astype(np.int32))
        vals.append(data[a:b][keep].astype(np.float32, copy=False))
    k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    cnt_all = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    ptr = np.zeros(k.size + 1, dtype=np.int64)
    np.cumsum(cnt_all, out=ptr[1:])
    return ColumnShard(n, r_count, rank, shards, lo, hi, tuple(bounds), k.astype(np.int64), ptr,
                       np.concatenate(cols) if cols else np.zeros(0, np.int32),
                       np.concatenate(vals) if vals else np.zeros(0, np.float32),
                       np.concatenate(tails) if tails else np.zeros(0, np.int32), tail_ptr, build_id)


@dataclass(frozen=True, eq=False)
class LazyShard(_Block):
    """Rank ``rank``'s part of a lazy artifact: what computing its columns ``[lo, hi)`` of calibrated rows needs.

    ``entity`` (N, d) complex64, every entity's embedding (a memory map when loaded from a shard
    folder: the rank touches the rows of its block, its tails, and of the heads whose rows it
    computes); ``relation`` (R, d) complex64; ``obs_key`` int64 sorted ``r*N + h`` and ``obs_tail``
    int32 (local ``t - lo``, ascending within a key) of the known edges ``(h, r, t)`` with ``t`` in
    the block; ``threshold`` and ``delta`` the artifact's calibration.  No array grows as relations x
    entities: the known edges of the block cost 12 bytes each.
    """

    entity: np.ndarray
    relation: np.ndarray
    obs_key: np.ndarray
    obs_tail: np.ndarray
    threshold: float
    delta: float
    build_id: str = ""

    @property
    def nnz(self) -> int:
        """Stored entries: none (rows are computed on demand); the known edges of the block are :attr:`obs_key`."""
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes this rank holds besides the memory-mapped head embeddings: its block's tail embeddings,
        the relations' and its known edges."""
        d = int(self.entity.shape[1]) if self.entity.ndim == 2 else 0
        return int(8 * d * self.width + self.relation.nbytes + self.obs_key.nbytes + self.obs_tail.nbytes)


def lazy_shard(entity: np.ndarray, relation: np.ndarray, observed: np.ndarray, rank: int, shards: int, *,
               threshold: float, delta: float, bounds: list[int] | None = None, build_id: str = "") -> LazyShard:
    """Shard ``rank`` of ``shards`` of a lazy artifact's embeddings and known edges ``observed`` ((E, 3) ``h, r, t``).

    ``bounds``: the blocks (default: :func:`block_bounds` of equal width).
    """
    n, r_count = int(entity.shape[0]), int(relation.shape[0])
    if not 0 <= rank < shards:
        raise UserError(f"rank {rank} is not in [0, {shards})")
    if bounds is None:
        bounds = block_bounds(n, shards)
    lo, hi = bounds[rank], bounds[rank + 1]
    obs = np.asarray(observed, dtype=np.int64).reshape(-1, 3)
    obs = obs[(obs[:, 2] >= lo) & (obs[:, 2] < hi)]
    key = obs[:, 1] * n + obs[:, 0]
    order = np.lexsort((obs[:, 2], key))
    return LazyShard(n, r_count, rank, shards, lo, hi, tuple(bounds), entity, relation,
                     np.ascontiguousarray(key[order]), np.ascontiguousarray(obs[order, 2] - lo, dtype=np.int32),
                     float(threshold), float(delta), build_id)


# ------------------------------------------------------------------------------------ on disk
def is_shard_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by :func:`write_shards` (its meta.json says so)."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("kind") == _KIND


def check_not_shard_folder(path: str | os.PathLike) -> None:
    """A :class:`UserError` when ``path`` is a shard folder opened as a whole artifact (by one process)."""
    if not is_shard_folder(path):
        return
    try:
        meta = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
        p, src = int(meta.get("shards")), (meta.get("source") or {}).get("artifact") or "the artifact it was written from"
    except (OSError, ValueError, TypeError):
        p, src = 0, "the artifact it was written from"
    raise UserError(f"{path} is a shard folder for {p or 'several'} ranks (python -m kge.shard), not an artifact: "
                    f"run it with torchrun --nproc-per-node {p or 'P'} -m engine.answer ..., or give {src}")


def _build_id(source_sha: str, n: int, r: int, shards: int) -> str:
    """Deterministic: the same artifact sharded the same way gives the same id (and the same bytes)."""
    return hashlib.sha256(f"{_KIND}/{SHARD_FORMAT}/{source_sha}/{n}/{r}/{shards}".encode()).hexdigest()[:32]


def write_shards(artifact: Any, shards: int, out: str | os.PathLike, *, overwrite: bool = False,
                 progress: bool = False) -> Path:
    """Write ``artifact`` (a :class:`kge.artifact.Artifact` loaded from its folder; eager, or lazy: see the module doc)
    as ``shards`` shards in ``out``."""
    from kge.artifact import _savez_reproducible, sha256_file
    from kgreason.files import OutputFolder, write_output

    n, r = artifact.num_entities, artifact.num_relations
    if shards > n:
        raise UserError(f"--shards {shards}: more shards than the artifact's {n} entities")
    if artifact.is_lazy:
        return _write_lazy_shards(artifact, shards, out, overwrite=overwrite, progress=progress)
    source_sha = _source_sha(artifact, "matrices.npz")
    build_id = _build_id(source_sha, n, r, shards)
    with OutputFolder(out, overwrite=overwrite, what="--out", create_parents=True,
                      inputs=[("--artifact", artifact.path)] if artifact.path else ()) as tmp:
        files = _write_vocabulary(tmp, artifact)
        bounds = block_bounds(n, shards, column_counts(artifact.matrices, n))
        for k in range(shards):
            s = shard_matrices(artifact.matrices, n, k, shards, bounds=bounds, build_id=build_id)
            name = shard_file_name(k, shards)
            _savez_reproducible(tmp / name, keys=s.keys, ptr=s.ptr, col=s.col, val=s.val, tails=s.tails,
                                tail_ptr=s.tail_ptr,
                                block=np.array([s.lo, s.hi, n, r, k, shards], dtype=np.int64),
                                build_id=np.frombuffer(build_id.encode(), dtype=np.uint8))
            files[name] = sha256_file(tmp / name)
            if progress:
                print(f"shard {k + 1}/{shards}: entities [{s.lo}, {s.hi}), {s.nnz} entries, "
                      f"{s.keys.size} rows, {s.nbytes / 2**20:.1f} MiB", flush=True)
        meta = {"kind": _KIND, "shard_format": SHARD_FORMAT, "build_id": build_id, "shards": shards,
                "num_entities": n, "num_relations": r, "bounds": bounds,
                "source": {"artifact": str(artifact.path) if artifact.path else None, "matrices_sha256": source_sha},
                "artifact_meta": _artifact_meta(artifact), "files": files}
        write_output(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=True), what="meta.json")
    return Path(out)


def _source_sha(artifact: Any, file: str) -> str:
    """The sha256 of the artifact's ``file`` (what the build id is made of): from its meta.json, else computed."""
    from kge.artifact import sha256_file

    sha = str(artifact.meta.get("files", {}).get(file, "")) if artifact.meta else ""
    if not sha and artifact.path is not None:
        sha = sha256_file(Path(artifact.path) / file)
    return sha


def _write_vocabulary(tmp: Path, artifact: Any) -> dict[str, str]:
    """The files every shard folder holds beside its shards, into ``tmp``: ``entities.tsv`` and ``relations.tsv``,
    ``observed.npy`` and the artifact's ``relation_questions.json`` if it has one (see the module doc); their
    sha256 by name."""
    from kge.artifact import _write_vocab, sha256_file

    files: dict[str, str] = {}
    for name, names in (("entities.tsv", artifact.entities), ("relations.tsv", artifact.relations)):
        _write_vocab(tmp / name, names)
        files[name] = sha256_file(tmp / name)
    # the observed triples as the artifact holds them (the order matters: a relation question's examples
    # are a seeded choice among them), for the LLM bridge on rank 0 (see the module doc)
    np.save(tmp / "observed.npy", np.ascontiguousarray(np.asarray(artifact.observed, dtype=np.int64).reshape(-1, 3)))
    files["observed.npy"] = sha256_file(tmp / "observed.npy")
    own = Path(artifact.path) / RELATION_QUESTIONS_FILE if artifact.path is not None else None
    if own is not None and own.is_file():  # the artifact's own relation questions come first for the LLM bridge
        shutil.copyfile(own, tmp / RELATION_QUESTIONS_FILE)
        files[RELATION_QUESTIONS_FILE] = sha256_file(tmp / RELATION_QUESTIONS_FILE)
    return files


def _artifact_meta(artifact: Any) -> dict[str, Any]:
    """The artifact's own meta, as it goes into a shard folder's ``meta.json`` (JSON values only)."""
    return json.loads(json.dumps(artifact.meta or {}, default=str))


def _write_lazy_shards(artifact: Any, shards: int, out: str | os.PathLike, *, overwrite: bool,
                       progress: bool) -> Path:
    """:func:`write_shards` of a lazy artifact: the embeddings once (``entity.npy``, ``relation.npy``) and per
    rank the known edges whose tail is in its block (see the module doc)."""
    from kge.artifact import _savez_reproducible, sha256_file
    from kgreason.files import OutputFolder, write_output

    lazy = artifact.matrices
    n, r = artifact.num_entities, artifact.num_relations
    source_sha = _source_sha(artifact, "embeddings.npz")
    build_id = _build_id(f"lazy/{source_sha}/{lazy.threshold!r}/{lazy.delta!r}", n, r, shards)
    bounds = block_bounds(n, shards)
    with OutputFolder(out, overwrite=overwrite, what="--out", create_parents=True,
                      inputs=[("--artifact", artifact.path)] if artifact.path else ()) as tmp:
        files = _write_vocabulary(tmp, artifact)
        for name, arr in (("entity.npy", lazy.entity), ("relation.npy", lazy.relation)):
            np.save(tmp / name, np.ascontiguousarray(arr, dtype=np.complex64))  # the folder is moved in whole
            files[name] = sha256_file(tmp / name)
        for k in range(shards):
            s = lazy_shard(lazy.entity, lazy.relation, lazy.observed, k, shards, threshold=lazy.threshold,
                           delta=lazy.delta, bounds=bounds, build_id=build_id)
            name = shard_file_name(k, shards)
            _savez_reproducible(tmp / name, obs_key=s.obs_key, obs_tail=s.obs_tail,
                                block=np.array([s.lo, s.hi, n, r, k, shards], dtype=np.int64),
                                build_id=np.frombuffer(build_id.encode(), dtype=np.uint8))
            files[name] = sha256_file(tmp / name)
            if progress:
                print(f"shard {k + 1}/{shards}: entities [{s.lo}, {s.hi}), {s.obs_key.size} known edges (lazy rows)",
                      flush=True)
        meta = {"kind": _KIND, "shard_format": SHARD_FORMAT, "matrices": "lazy", "build_id": build_id,
                "shards": shards, "num_entities": n, "num_relations": r, "bounds": bounds,
                "threshold": lazy.threshold, "delta": lazy.delta,
                "source": {"artifact": str(artifact.path) if artifact.path else None, "embeddings_sha256": source_sha},
                "artifact_meta": _artifact_meta(artifact), "files": files}
        write_output(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=True), what="meta.json")
    return Path(out)


def _fail(folder: Path, why: str) -> UserError:
    return UserError(f"shard folder {folder}: {why}")


def read_shard_meta(folder: str | os.PathLike, world_size: int) -> dict[str, Any]:
    """``meta.json`` of a shard folder, checked against the run: P shards for P ranks, every shard file present.

    These checks read only ``meta.json`` and the folder's listing, so every rank finds the same problem.
    """
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(folder, f"cannot read meta.json ({exc.strerror})") from None
    except ValueError as exc:
        raise _fail(folder, f"meta.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("kind") != _KIND:
        raise _fail(folder, "meta.json does not describe a shard folder (write one with python -m kge.shard)")
    if meta.get("shard_format") != SHARD_FORMAT:
        raise _fail(folder, f"shard format {meta.get('shard_format')!r}, this version reads {SHARD_FORMAT}; "
                            "write it again with python -m kge.shard")
    p = meta.get("shards")
    if p != world_size:
        src = (meta.get("source") or {}).get("artifact") or "ARTIFACT"
        raise _fail(folder, f"holds {p} shards but the run has {world_size} ranks; start {p} ranks "
                            f"(torchrun --nproc-per-node {p}) or write {world_size} shards: "
                            f"python -m kge.shard --artifact {src} --shards {world_size} --out NEW_FOLDER")
    files = meta.get("files")
    if not isinstance(files, dict):
        raise _fail(folder, "meta.json lists no files")
    missing = [shard_file_name(k, world_size) for k in range(world_size)
               if not (folder / shard_file_name(k, world_size)).is_file()
               or shard_file_name(k, world_size) not in files]
    shared = _SHARED_FILES + (_LAZY_FILES if meta.get("matrices") == "lazy" else ())
    missing += [v for v in shared if not (folder / v).is_file() or v not in files]
    if missing:
        raise _fail(folder, f"incomplete: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                            f"missing ({len(missing)} of {world_size} shards + {len(shared)} shared files)")
    return meta


#: The files every rank reads: the vocabulary (and maps the observed triples, which rank 0's LLM bridge
#: reads), and in a lazy shard folder the embeddings.
_SHARED_FILES = ("entities.tsv", "relations.tsv", "observed.npy")
_LAZY_FILES = ("entity.npy", "relation.npy")


def load_shard(folder: str | os.PathLike, rank: int, world_size: int, *,
               verify: bool = True) -> "ColumnShard | LazyShard":
    """Rank ``rank``'s shard of ``folder`` (only that file's entries are read), checked against the folder's build.

    With ``verify`` the shard file's sha256 must match ``meta.json`` (in a lazy folder, the embeddings'
    too); its embedded build id and block must match the folder's whatever ``verify`` says (a shard
    copied in from another build).  A lazy folder gives a :class:`LazyShard` (embeddings memory-mapped).
    """
    from kge.artifact import sha256_file

    folder = Path(folder)
    meta = read_shard_meta(folder, world_size)
    lazy = meta.get("matrices") == "lazy"
    name = shard_file_name(rank, world_size)
    path = folder / name
    for file in (name,) + (_LAZY_FILES if lazy else ()):
        if verify and sha256_file(folder / file) != meta["files"][file]:
            raise _fail(folder, f"{file} changed since it was written (sha256 differs from meta.json); "
                                "write the shards again with python -m kge.shard")
    fields = ("obs_key", "obs_tail") if lazy else ("keys", "ptr", "col", "val", "tails", "tail_ptr")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in fields + ("block", "build_id")}
    except (OSError, ValueError, KeyError) as exc:
        raise _fail(folder, f"{name} is not a readable shard file ({exc})") from None
    bid = arrays["build_id"].tobytes().decode("ascii", "replace")
    if bid != meta.get("build_id"):
        raise _fail(folder, f"{name} comes from another build (build id {bid[:12]}, meta.json says "
                            f"{str(meta.get('build_id'))[:12]}): the folder mixes two shard sets")
    lo, hi, n, r, k, p = (int(v) for v in arrays["block"])
    bounds = meta.get("bounds")
    if not (isinstance(bounds, list) and len(bounds) == world_size + 1 and all(type(b) is int for b in bounds)
            and bounds[0] == 0 and bounds[-1] == n and all(a <= b for a, b in zip(bounds, bounds[1:]))):
        raise _fail(folder, f"meta.json: bounds must be {world_size + 1} ascending entity ids from 0 to {n}")
    if (k, p, n, r) != (rank, world_size, meta.get("num_entities"), meta.get("num_relations")) \
            or [lo, hi] != bounds[rank:rank + 2]:
        raise _fail(folder, f"{name} holds block {k} of {p} ([{lo}, {hi}) of {n} entities), "
                            f"not block {rank} of {world_size} as meta.json says")
    if lazy:
        return _lazy_shard_of(folder, meta, arrays, (lo, hi, n, r), rank, world_size, tuple(bounds), bid)
    keys, ptr, col, val = arrays["keys"], arrays["ptr"], arrays["col"], arrays["val"]
    tails, tail_ptr = arrays["tails"], arrays["tail_ptr"]
    if (keys.dtype, ptr.dtype, col.dtype, val.dtype, tails.dtype, tail_ptr.dtype) \
            != (np.int64, np.int64, np.int32, np.float32, np.int32, np.int64) \
            or ptr.size != keys.size + 1 or col.size != val.size or int(ptr[-1]) != val.size \
            or tail_ptr.size != r + 1 or int(tail_ptr[0]) != 0 or int(tail_ptr[-1]) != tails.size:
        raise _fail(folder, f"{name}: arrays of the wrong types or sizes; write the shards again")
    return ColumnShard(n, r, rank, world_size, lo, hi, tuple(bounds), keys, ptr, col, val, tails, tail_ptr, bid)


def _lazy_shard_of(folder: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray], block: tuple[int, int, int, int],
                   rank: int, world_size: int, bounds: tuple[int, ...], bid: str) -> LazyShard:
    """The :class:`LazyShard` of a lazy folder's shard file ``arrays`` (checked), the embeddings memory-mapped."""
    lo, hi, n, r = block
    name = shard_file_name(rank, world_size)
    key, tail = arrays["obs_key"], arrays["obs_tail"]
    if (key.dtype, tail.dtype) != (np.int64, np.int32) or key.shape != tail.shape or key.ndim != 1 \
            or (key.size and (int(key[0]) < 0 or int(key[-1]) >= r * n or bool((np.diff(key) < 0).any())
                              or int(tail.min()) < 0 or int(tail.max()) >= hi - lo)):
        raise _fail(folder, f"{name}: arrays of the wrong types, sizes or ranges; write the shards again")
    emb = {}
    for file, rows in (("entity.npy", n), ("relation.npy", r)):
        try:
            emb[file] = np.load(folder / file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise _fail(folder, f"{file} is not a readable array ({exc})") from None
        a = emb[file]
        if a.dtype != np.complex64 or a.ndim != 2 or a.shape[0] != rows:
            raise _fail(folder, f"{file}: {a.dtype} {a.shape}, expected complex64 ({rows}, d); write the shards again")
    ent, rel = emb["entity.npy"], emb["relation.npy"]
    if ent.shape[1] != rel.shape[1]:
        raise _fail(folder, f"entity.npy and relation.npy have widths {ent.shape[1]} and {rel.shape[1]}")
    try:
        threshold, delta = float(meta["threshold"]), float(meta["delta"])
    except (KeyError, TypeError, ValueError):
        raise _fail(folder, "meta.json: a lazy shard folder needs numbers 'threshold' and 'delta'") from None
    return LazyShard(n, r, rank, world_size, lo, hi, bounds, ent, rel, key, tail, threshold, delta, bid)


def read_shard_observed(folder: str | os.PathLike, meta: dict[str, Any], *, verify: bool = True) -> np.ndarray:
    """The folder's ``observed.npy`` memory-mapped ((E, 3) int64; nothing is read until used), checked
    against ``meta.json``'s sha256 with ``verify``."""
    from kge.artifact import sha256_file

    folder = Path(folder)
    if verify and sha256_file(folder / "observed.npy") != meta["files"]["observed.npy"]:
        raise _fail(folder, "observed.npy changed since it was written (sha256 differs from meta.json); "
                            "write the shards again with python -m kge.shard")
    try:
        obs = np.load(folder / "observed.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise _fail(folder, f"observed.npy is not a readable array ({exc})") from None
    if obs.dtype != np.int64 or obs.ndim != 2 or obs.shape[1] != 3:
        raise _fail(folder, f"observed.npy: {obs.dtype} {obs.shape}, expected int64 (E, 3); write the shards again")
    return obs


def read_shard_vocab(folder: str | os.PathLike) -> tuple[list[str], list[str]]:
    from kge.artifact import read_vocab

    folder = Path(folder)
    return read_vocab(folder / "entities.tsv"), read_vocab(folder / "relations.tsv")
