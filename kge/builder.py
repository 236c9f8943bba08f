"""Build an artifact folder: load a KG, drop edges, train ComplEx, calibrate, save (the library code of
``python -m kge.build``, whose thin CLI is :mod:`kge.build`; ``kge.build`` re-exports these names).

Command line::

    python -m kge.build --kg umls --out artifacts/umls
    python -m kge.build --kg ../shared/data/betae/FB15k-237-betae --out artifacts/FB15k-237
    python -m kge.build --kg umls --out /tmp/umls-lgot --drop-edges 0.5 --seed 0 --rank 64 --epochs 50
    python -m kge.build --kg umls --out artifacts/umls --overwrite      # replace an earlier artifact

``--out`` must be a new folder (missing parent folders are created), an empty
one, or (with ``--overwrite``) an artifact folder holding nothing but its own
files; anything else is refused before the build starts (:mod:`kgreason.files`),
so a build never deletes a file it did not write.

``--matrices auto`` (the default) stores the calibrated matrices (eager) unless
they would not fit ``--max-matrix-gb`` or the memory, or computing them, at the
rate measured on this KG, would take longer than the rows ``--expected-queries``
lazy queries compute plus ``--max-calibrate-minutes`` (lazy; :mod:`kge.autorule`);
the log says which and why in one line.  ``python -m kge.materialize`` turns a
lazy artifact into the eager one later.  A build whose estimated peak memory
exceeds MemAvailable is refused before training (``--no-memory-check`` overrides).  A seeded build bounded by epochs is
bit-reproducible at any thread count (docs/artifacts.md, "Reproducibility").

Library::

    from kge.builder import BuildConfig, build_artifact
    artifact = build_artifact(BuildConfig(kg="umls", out="artifacts/umls"))
    artifact = build_artifact(BuildConfig(kg="umls", out="/tmp/umls-small", train=dict(rank=16, epochs=5)))

Training settings live in :class:`kge.train.TrainConfig` (its defaults are the
``small`` size preset); a ``BuildConfig`` holds only what overrides the size
preset of the graph (``train=``, the fields of :data:`TRAIN_FLAGS`).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import sys
import time
import zipfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from .artifact import Artifact
from .autorule import DEFAULT_EXPECTED_QUERIES, EAGER_PEAK_FACTOR, AutoInputs, decide, measure_calibrate_gflops
from .autorule import fmt_bytes as _fmt_bytes
from .calibrate import DEFAULT_THRESHOLD, NnzEstimate, calibrate, estimate_nnz
from kgreason.errors import UserError
from kgreason.files import OutputFolder, open_output
from kgreason.resources import available_memory_bytes
from .graph import drop_edges, load_kg
from .lazy import LazyMatrices
from .train import (HUGE_FROM, MAX_LR, TrainResult,
                    check_trainable, default_train_config, size_class, train_complex)

__all__ = ["BuildConfig", "build_artifact", "summarize", "remove_killed_builds", "StagingLock", "LOCK_SUFFIX",
           "MAX_LR", "MIN_MATRIX_GB", "MAX_MATRIX_GB",
           "DEFAULT_MAX_CALIBRATE_MINUTES", "DEFAULT_EXPECTED_QUERIES", "available_memory_bytes",
           "estimate_build_memory", "EAGER_PEAK_FACTOR", "TRAIN_FLAGS", "flat_defaults"]

# BuildConfig and the defaults of its flags live in kge.build_config (below kge.artifact, which prints the
# rebuild command from them); kge.build is where users import them.
from .build_config import (DEFAULT_MAX_CALIBRATE_MINUTES, MAX_MATRIX_GB, MIN_MATRIX_GB, TRAIN_FLAGS,  # noqa: E402
                           BuildConfig, _flag, flat_defaults)

#: RSS of a build process before it holds any data: python, torch, pykeen, scipy (measured 0.35 GiB after the
#: imports, 0.5 GiB peak for a UMLS build with pykeen's evaluator).
BASE_BYTES = 512 << 20



def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "pykeen", "numpy", "scipy", "kgreason"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (ru_maxrss is KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def build_artifact(config: BuildConfig, *, progress: bool = True) -> Artifact:
    """Load -> drop edges -> train ComplEx -> calibrate -> save ``config.out``; returns the saved Artifact.

    Every check on the user's input (the output folder, the loss name, a
    training set left empty by ``drop_edges``) runs before training.
    """
    output = OutputFolder(config.out, overwrite=config.overwrite, what="--out", create_parents=True,
                          inputs=[("--kg", config.kg)])  # never the KG's own folder (or inside it)
    remove_killed_builds(output.path, progress=progress)
    # SIGTERM, Ctrl-C or an error from here on removes the temporary folder; SIGKILL leaves it behind, with
    # the lock file that lets the next build of this output see that no process owns it any more.  The lock
    # file goes first on the way out (after the commit, or before the failed folder is removed), so that the
    # parent folders a failed build created are empty again and removed.
    with output as tmp, StagingLock() as lock:
        lock.hold(tmp)
        return _build(config, progress, output, tmp)


# ------------------------------------------------------------------ leftovers of killed builds
#: A build's staging folder is ``.NAME.building-XXXX`` beside its output (:class:`kgreason.files.OutputFolder`);
#: its lock file is the folder's name plus this suffix, beside it (never inside: it would end up in the artifact).
LOCK_SUFFIX = ".lock"


class StagingLock:
    """Marks a staging folder as owned by this live process, for :func:`remove_killed_builds`.

    ``hold(folder)`` creates ``folder`` + :data:`LOCK_SUFFIX`, takes an exclusive ``flock`` on it and
    writes this process's id into it.  The kernel releases a ``flock`` when its holder dies, SIGKILL
    included, so a lock file that can be locked again has no living owner, whatever its pid has
    become since.  Leaving the ``with`` block deletes the file, then releases the lock.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self._fd: int | None = None

    def hold(self, folder: Path) -> None:
        import fcntl

        path = folder.with_name(folder.name + LOCK_SUFFIX)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.path, self._fd = path, fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without flock: the pid is what remove_killed_builds goes by there
            pass
        os.write(fd, f"{os.getpid()}\n".encode())

    def __enter__(self) -> "StagingLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)
        self.path = self._fd = None


def _owner_alive(lock: Path) -> bool | None:
    """Whether a process may still own the staging folder of ``lock``: True, False, or None (the file is gone).

    False only for a file that holds a pid (its build writes it while holding the lock) and that nobody
    holds a lock on; an empty file may belong to a build between creating and locking it.
    """
    import errno
    import fcntl

    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locks = True
        except BlockingIOError:
            return True  # its build holds it
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            locks = False  # no flock on this file system: the recorded pid decides
        try:
            pid = int(os.read(fd, 64).split()[0])
        except (ValueError, IndexError):
            return True  # no pid yet: a build that is just starting; never delete what may be in use
        if locks:
            return False  # nobody holds it: its build died (the pid may belong to another process by now)
        if pid <= 0:
            return True  # not a pid kge.build writes (0 and negatives would signal process groups)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's live process
        return True
    finally:
        os.close(fd)


def remove_killed_builds(out: str | os.PathLike, *, progress: bool = True) -> list[Path]:
    """Remove the staging folders (and lock files) that killed builds of ``out`` left beside it; returns them.

    A staging folder ``.NAME.building-XXXX`` is removed when its lock file (:class:`StagingLock`)
    has no living owner.  A staging folder of a build still running is never touched, and neither is
    one without a lock file (written by a version of kge.build before the lock files, or by a build
    that is just starting or finishing): those are reported on stderr (with ``progress``), to be
    removed by hand when no build of ``out`` runs.
    """
    import shutil

    out = Path(os.path.abspath(out))
    prefix = f".{out.name}.building-"
    try:
        entries = sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix))
    except OSError:  # no parent folder yet: nothing left behind
        return []
    names = {p.name for p in entries}
    removed, unowned = [], []
    for entry in entries:
        if entry.name.endswith(LOCK_SUFFIX):
            if entry.name[:-len(LOCK_SUFFIX)] not in names and _owner_alive(entry) is False:
                entry.unlink(missing_ok=True)  # killed after its folder went, before the lock file did
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        lock = entry.with_name(entry.name + LOCK_SUFFIX)
        if entry.name + LOCK_SUFFIX not in names:
            unowned.append(entry)
        elif _owner_alive(lock) is False:
            shutil.rmtree(entry, ignore_errors=True)
            lock.unlink(missing_ok=True)
            if not entry.exists():
                removed.append(entry)
    if progress:
        for entry in removed:
            print(f"note: removed {entry}, left by a build of {out} that was killed", file=sys.stderr)
        for entry in unowned:
            print(f"note: {entry} has no lock file (left by an older kge.build, or a build starting or ending); "
                  f"remove it by hand if no build of {out} is running", file=sys.stderr)
    return removed


def _build(config: BuildConfig, progress: bool, output: OutputFolder, tmp: Path) -> Artifact:
    timings: dict[str, float] = {}
    t = time.perf_counter()
    kg = load_kg(config.kg, format=config.kg_format)
    timings["load"] = time.perf_counter() - t
    t = time.perf_counter()
    kg = drop_edges(kg, config.drop_edges, config.seed)
    timings["drop_edges"] = time.perf_counter() - t
    if config.embeddings is None:
        check_trainable(kg, what=f"--kg {config.kg}")
    if progress:
        print(kg.summary(), file=sys.stderr)

    train_cfg = default_train_config(kg, name=_flag, **config.train, seed=config.seed, device=config.device)
    memory, train_cfg = _check_memory(config, kg, train_cfg, progress)
    t = time.perf_counter()
    if config.embeddings is not None:
        trained = _reuse_embeddings(config.embeddings, kg, train_cfg)
    else:
        trained = train_complex(kg, train_cfg, progress=progress)
    timings["train"] = time.perf_counter() - t
    trained.model = None  # free the pykeen model before the memory-heavy calibration
    _release_memory()
    out = output.path
    # Checkpoint: a failed calibration can be redone with --embeddings without retraining.
    checkpoint = out.parent / f".{out.name}.embeddings.npz"
    if config.embeddings is None:
        with open_output(checkpoint, what="embeddings checkpoint", binary=True) as f:
            np.savez(f, entity=trained.entity, relation=trained.relation)
    try:
        artifact = _calibrate_and_save(config, progress, kg, train_cfg, trained, timings, tmp, memory)
    except UserError as exc:
        if not checkpoint.is_file():
            raise
        raise UserError(f"{exc}; embeddings kept in {checkpoint} (rerun with --embeddings {checkpoint})") from None
    except BaseException:
        if checkpoint.is_file():
            print(f"note: trained embeddings kept in {checkpoint} (rerun with --embeddings {checkpoint})",
                  file=sys.stderr)
        raise
    t = time.perf_counter()
    output.commit()
    artifact.path = out
    checkpoint.unlink(missing_ok=True)
    timings["save"] += time.perf_counter() - t
    artifact.meta["timings_s"]["save"] = round(timings["save"], 3)
    return artifact


def _calibrate_and_save(config: BuildConfig, progress: bool, kg, train_cfg, trained, timings: dict[str, float],
                        tmp: Path, memory: dict[str, Any]) -> Artifact:
    formula = "p = softmax_t(score) * max(1, #observed tails); p < threshold -> 0; min(p, 1-delta); observed -> 1"
    mode, estimated = config.matrices, None
    choice: dict[str, Any] = {"mode": mode, "forced_by": f"--matrices {mode}"}
    if mode == "auto":
        t = time.perf_counter()
        mode, estimated = _auto_matrices(config, trained, kg)
        choice = estimated[1].pop("matrices_choice")
        timings["estimate_nnz"] = time.perf_counter() - t
        if progress:
            print(estimated[1]["message"], file=sys.stderr)
    if mode == "lazy":
        # Nothing is stored, so QTO's threshold (or --threshold) is never raised for memory.
        threshold = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
        matrices = LazyMatrices(entity=trained.entity, relation=trained.relation, observed=kg.train,
                                threshold=threshold, delta=config.delta, row_cache_gb=config.row_cache_gb,
                                chunk_rows=config.chunk_rows)
        calibration: dict[str, Any] = {"threshold": threshold, "delta": config.delta, "row_cache_gb": config.row_cache_gb,
                                       "formula": formula}
        if estimated is not None:
            calibration["nnz_estimate"] = estimated[1]
        calibration["matrices_choice"] = choice
    else:
        if estimated is None:
            t = time.perf_counter()
            estimated = choose_threshold(config, trained.entity, trained.relation, kg.train, trained.device)
            timings["estimate_nnz"] = time.perf_counter() - t
            if progress:
                print(estimated[1]["message"], file=sys.stderr)
        threshold, estimate_info = estimated

        t = time.perf_counter()
        budget_nnz = int(_budget_nnz(config))
        matrices, cstats = calibrate(
            trained.entity, trained.relation, kg.train, threshold=threshold, delta=config.delta,
            chunk_rows=config.chunk_rows, device=trained.device, progress=progress,
            max_nnz=budget_nnz, adapt_threshold=config.threshold is None,
        )
        threshold = cstats.threshold
        if cstats.threshold_raises:
            estimate_info["raised_during_calibration"] = cstats.threshold_raises
        timings["calibrate"] = time.perf_counter() - t
        calibration = {
            "threshold": threshold,
            "nnz_estimate": estimate_info,
            "delta": config.delta,
            "rows": cstats.rows,
            "chunk_rows": cstats.chunk_rows,
            "matmul_gflops_per_s": cstats.flop_rate / 1e9,
            "formula": formula,
            "matrices_choice": choice,
        }

    meta: dict[str, Any] = {
        "source": kg.source,
        "kg_stats": dict(kg.stats),
        "build_config": config.to_json(),
        "train_config": asdict(trained.config),  # the rank a time budget chose, not None
        "size_preset": size_class(kg.num_entities),
        "inverse_relations": "relation 2k+1 is the inverse of 2k (named X^-1)",
        "train": {
            "losses": trained.losses,
            "final_loss": trained.losses[-1] if trained.losses else None,
            "device": trained.device,
            **trained.metrics,
        },
        "matrices": mode,
        "calibration": calibration,
        "memory_estimate": memory,
        "versions": _versions(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
    }
    artifact = Artifact(
        entities=list(kg.entities), relations=list(kg.relations), matrices=matrices,
        observed=kg.train, missing=kg.missing, meta=meta,
        embeddings={"entity": trained.entity, "relation": trained.relation},
    )
    t = time.perf_counter()
    # Timings and peak memory go in before the save so that meta.json is final.
    timings["save"] = 0.0
    artifact.meta["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    artifact.meta["peak_rss_bytes"] = peak_rss_bytes()
    if progress:
        print(f"memory: peak RSS {_fmt_bytes(artifact.meta['peak_rss_bytes'])} before saving "
              f"(estimated up front: {_fmt_bytes(memory['total_bytes'])})", file=sys.stderr)
    artifact.save(tmp)
    timings["save"] = time.perf_counter() - t
    return artifact


def _reuse_embeddings(source: str, kg, train_cfg) -> TrainResult:
    """Embeddings of an earlier build (artifact folder or embeddings.npz) instead of training."""
    from .train import resolve_device

    path = Path(source)
    npz = path / "embeddings.npz" if path.is_dir() else path
    if not npz.is_file():
        raise UserError(f"--embeddings {source}: no embeddings.npz there")
    try:
        with np.load(npz, allow_pickle=False) as z:
            if "entity" not in z.files or "relation" not in z.files:
                raise UserError(f"{npz}: expected arrays 'entity' and 'relation', got {z.files}")
            ent, rel = z["entity"].astype(np.complex64), z["relation"].astype(np.complex64)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, TypeError) as exc:
        if isinstance(exc, UserError):
            raise
        raise UserError(f"--embeddings {npz}: not an embeddings .npz file ({type(exc).__name__})") from None
    if ent.ndim != 2 or rel.ndim != 2 or ent.shape[0] != kg.num_entities or rel.shape[0] != kg.num_relations or ent.shape[1] != rel.shape[1]:
        raise UserError(f"{npz}: embeddings of shape {ent.shape}/{rel.shape} do not fit this KG "
                        f"({kg.num_entities} entities, {kg.num_relations} relations)")
    metrics: dict[str, Any] = {"embeddings_from": str(npz)}
    losses: list[float] = []
    meta_path = npz.parent / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    except (ValueError, OSError):  # a damaged meta.json only costs the loss history
        meta = {}
    old = meta.get("train") if isinstance(meta, dict) else None
    if isinstance(old, dict):
        losses = [float(x) for x in old.get("losses", []) if isinstance(x, (int, float))] \
            if isinstance(old.get("losses"), list) else []
        metrics.update({k: v for k, v in old.items() if k not in ("losses", "final_loss")})
        metrics["embeddings_from"] = str(npz)
    return TrainResult(entity=ent, relation=rel, config=train_cfg, losses=losses, metrics=metrics, seconds=0.0,
                       device=resolve_device(train_cfg.device))


def estimate_build_memory(*, num_entities: int, num_relations: int, num_triples: int, rank: int, batch_size: int,
                          candidates: int | None, matrices: str, max_matrix_gb: float,
                          train: bool = True) -> dict[str, int]:
    """Estimated peak memory of a build in bytes, by component, and ``total_bytes`` (their sum).

    * ``base``: the interpreter with torch, pykeen and scipy (:data:`BASE_BYTES`);
    * ``graph``: the triples (int64, ~6 copies: the KG's splits, the trainer's tensor, the filter
      sets, the artifact's observed edges) and ~200 bytes of names per entity;
    * ``embeddings``: ``(N + R) x 2 rank`` float32 tables, 6 of them when training (weights, gradient,
      Adagrad state, the best epoch's copy, the complex64 export, the artifact's), 2 when reusing embeddings;
    * ``training_buffers``: the largest of a step's ``(B, C)`` score buffers (scores, softmax, gradient,
      a bf16 copy; ``C`` = N, or ``B + candidates`` when sampling), the validation ranker's
      ``(rows, N)`` chunk (:func:`kge.complex_n3.rank_chunk_rows`: 1,024 rows, fewer past 262k entities),
      and pykeen's evaluator (capped at 1 GiB by ``kge.train.pykeen_link_metrics``);
    * ``matrices``: an eager build's peak, :data:`EAGER_PEAK_FACTOR` x the matrices (at most
      ``max_matrix_gb``, at most 8 bytes x every entry) plus two 64 MB chunk buffers; 0 for lazy
      and auto (auto picks lazy when the eager matrices would not fit, see :func:`_auto_matrices`).
    """
    from .complex_n3 import rank_chunk_rows

    n, r, d = num_entities, num_relations, rank
    parts = {"base": BASE_BYTES, "graph": num_triples * 3 * 8 * 6 + n * 200}
    parts["embeddings"] = (n + r) * 2 * d * 4 * (6 if train else 2)
    buffers = 0
    if train:
        cols = n if candidates is None or candidates >= n else min(n, batch_size + candidates)
        buffers = max(batch_size * cols * 4 * 4, rank_chunk_rows(n) * n * 4 * 3)
        if n < HUGE_FROM:  # pykeen's evaluator broadcasts (batch, N, d) complex products, capped at 1 GiB
            buffers = max(buffers, min(1 << 30, 256 * n * d * 16))
    parts["training_buffers"] = buffers
    parts["matrices"] = 0
    if matrices == "eager":
        stored = min(max_matrix_gb * (1 << 30), 8.0 * r * n * n)
        parts["matrices"] = int(EAGER_PEAK_FACTOR * stored) + (128 << 20)
    parts = {k: int(v) for k, v in parts.items()}
    return {**parts, "total_bytes": sum(parts.values())}


def _check_memory(config: BuildConfig, kg, train_cfg, progress: bool) -> tuple[dict[str, Any], Any]:
    """The up-front estimate (:func:`estimate_build_memory`) of this build and the training config it allows.

    A rank left to the time budget counts as the largest it may pick; when that would not fit MemAvailable,
    the largest candidate rank that fits becomes the budget's upper bound (``max_rank``, said in one line)
    instead of refusing.  A UserError when even the smallest rank, or a rank the user gave, does not fit.
    """
    from .complex_n3 import CANDIDATE_RANKS

    def estimate(rank: int) -> dict[str, int]:
        return estimate_build_memory(num_entities=kg.num_entities, num_relations=kg.num_relations,
                                     num_triples=len(kg.train) + len(kg.missing), rank=rank,
                                     batch_size=train_cfg.batch_size,
                                     candidates=train_cfg.candidates if train_cfg.training_loop == "1n" else None,
                                     matrices=config.matrices, max_matrix_gb=config.max_matrix_gb,
                                     train=config.embeddings is None)

    available = available_memory_bytes()
    rank, chosen = train_cfg.rank, train_cfg.rank is not None
    est: dict[str, int] = {}
    if chosen:
        est = estimate(rank)
    else:
        ranks = sorted((x for x in CANDIDATE_RANKS if train_cfg.max_rank is None or x <= train_cfg.max_rank),
                       reverse=True) or [min(CANDIDATE_RANKS)]
        tried = [(x, estimate(x)) for x in ranks]  # largest first
        fitting = [(x, e) for x, e in tried
                   if not config.memory_check or available is None or e["total_bytes"] <= available]
        rank, est = fitting[0] if fitting else tried[-1]  # none fits: the smallest, refused below
        if fitting and rank != ranks[0]:
            train_cfg = replace(train_cfg, max_rank=rank)
            if progress:
                print(f"memory: rank {ranks[0]} would need an estimated {_fmt_bytes(tried[0][1]['total_bytes'])} "
                      f"but {_fmt_bytes(available)} is available (MemAvailable): the time budget picks a rank up to "
                      f"{rank}", file=sys.stderr)
    info: dict[str, Any] = {**est, "rank_assumed": rank, "available_bytes": available}
    parts = ", ".join(f"{k.replace('_', ' ')} {_fmt_bytes(v)}" for k, v in est.items()
                      if k != "total_bytes" and v)
    if progress:
        avail = f", {_fmt_bytes(available)} available" if available is not None else ""
        print(f"memory: estimated peak {_fmt_bytes(est['total_bytes'])} ({parts}){avail}", file=sys.stderr)
    if config.memory_check and available is not None and est["total_bytes"] > available:
        hints = ["a smaller --rank" if chosen else f"--rank N with N < {rank} (the smallest rank the time budget picks)"]
        if config.matrices == "eager":
            hints += ["--matrices auto (or lazy)", "a smaller --max-matrix-gb"]
        raise UserError(f"--kg {config.kg}: the build needs an estimated {_fmt_bytes(est['total_bytes'])} "
                        f"({parts}) but only {_fmt_bytes(available)} is available (MemAvailable); "
                        f"use {', '.join(hints)}, or --no-memory-check to try anyway")
    return info, train_cfg


def _release_memory() -> None:
    """Give freed heap pages back to the OS (training leaves ~1 GB in glibc's free lists)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _budget_nnz(config: BuildConfig) -> float:
    """The most matrix entries ``--max-matrix-gb`` holds (8 bytes each: int32 column + float32 value)."""
    return config.max_matrix_gb * (1 << 30) / 8


def _auto_matrices(config: BuildConfig, trained, kg) -> tuple[str, tuple[float, dict[str, Any]]]:
    """``--matrices auto``: ``("eager", choose_threshold's result)`` or ``("lazy", (threshold, info))``.

    The rule is :func:`kge.autorule.decide`: eager when the eager matrices at QTO's threshold (or
    ``--threshold``; estimated from sampled rows) fit ``--max-matrix-gb`` and, at :data:`EAGER_PEAK_FACTOR`
    times their size, MemAvailable, and their calibration, at the rate measured on this KG's rows
    (:func:`kge.autorule.measure_calibrate_gflops`), takes no longer than the rows ``--expected-queries``
    lazy queries would compute plus ``--max-calibrate-minutes``; else eager at the threshold raised to fit when
    no ``--threshold`` was given and the expected queries would compute at least half of the stack lazily
    (:data:`kge.autorule.RAISE_SHARE`); else lazy (which never needs the threshold raised).  ``info["message"]`` is the one log line that says which and why, with the numbers.
    """
    floor = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
    n, num_rel, rank = kg.num_entities, kg.num_relations, int(trained.entity.shape[1])
    est = estimate_nnz(trained.entity, trained.relation, kg.train, floor=floor, seed=config.seed,
                       device=trained.device)
    nnz = est.nnz_at(floor)
    budget_nnz = _budget_nnz(config)
    raised = est.threshold_for(budget_nnz) if config.threshold is None and nnz > budget_nnz else None
    rate = measure_calibrate_gflops(trained.entity, trained.relation, kg.train, threshold=floor, delta=config.delta,
                                    device=trained.device, seed=config.seed)
    inputs = AutoInputs(num_entities=n, num_relations=num_rel, rank=rank, gflops=rate["gflops"], nnz=nnz,
                        rows_per_query=1.0 + min(float(n), nnz / (n * num_rel)), threshold=floor,
                        max_matrix_gb=config.max_matrix_gb, available_bytes=available_memory_bytes(),
                        max_calibrate_minutes=config.max_calibrate_minutes, expected_queries=config.expected_queries,
                        raised_threshold=raised, raised_nnz=None if raised is None else est.nnz_at(raised))
    mode, choice, line = decide(inputs)
    choice["rate_measurement"] = rate
    if mode == "eager":
        threshold, info = choose_threshold(config, trained.entity, trained.relation, kg.train, trained.device, est=est)
    else:
        threshold, info = floor, {"sampled_rows": est.sampled_rows, "max_matrix_gb": config.max_matrix_gb,
                                  f"nnz_at_{floor:g}": round(nnz)}
    info["message"] = line
    return mode, (threshold, {**info, "matrices_choice": choice})


def choose_threshold(config: BuildConfig, entity: np.ndarray, relation: np.ndarray, observed: np.ndarray,
                     device: str, *, est: NnzEstimate | None = None) -> tuple[float, dict[str, Any]]:
    """The calibration threshold for ``config`` and a record of the nnz estimate behind it (``est``: the
    sample :func:`kge.calibrate.estimate_nnz` already drew at the floor threshold, else drawn here)."""
    budget_nnz = _budget_nnz(config)
    floor = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
    if est is None:
        est = estimate_nnz(entity, relation, observed, floor=floor, seed=config.seed, device=device)
    nnz_floor = est.nnz_at(floor)
    info: dict[str, Any] = {"sampled_rows": est.sampled_rows, "max_matrix_gb": config.max_matrix_gb,
                            f"nnz_at_{floor:g}": round(nnz_floor)}
    if nnz_floor <= budget_nnz:
        info["message"] = (f"calibration: threshold {floor:g}, estimated nnz {nnz_floor:,.0f} "
                           f"({nnz_floor * 8 / (1 << 30):.2f} GiB) from {est.sampled_rows} sampled rows")
        return floor, info
    fit = est.threshold_for(budget_nnz)
    if config.threshold is not None:
        raise UserError(
            f"--threshold {floor:g} keeps an estimated {nnz_floor:,.0f} entries ({nnz_floor * 8 / (1 << 30):.1f} GiB), "
            f"over --max-matrix-gb {config.max_matrix_gb:g}; use --threshold {fit:.3g} or a larger --max-matrix-gb"
        )
    info["message"] = (f"calibration: QTO's threshold {floor:g} would keep ~{nnz_floor:,.0f} entries "
                       f"({nnz_floor * 8 / (1 << 30):.1f} GiB > --max-matrix-gb {config.max_matrix_gb:g}); "
                       f"using threshold {fit:.3g} (estimated nnz {est.nnz_at(fit):,.0f})")
    info["raised_threshold"] = fit
    return fit, info


def summarize(artifact: Artifact) -> str:
    """Human-readable summary: sizes, nnz per relation, MRR, time per stage, peak memory."""
    m = artifact.meta
    if artifact.is_lazy:
        lz = artifact.matrices
        nnz_line = (f"matrices      lazy: rows computed on demand at threshold {lz.threshold:.3g} "
                    f"(row cache {lz.row_cache_gb:g} GiB)")
    else:
        nnz = artifact.nnz_per_relation()
        nnz_line = (f"nnz           total {int(nnz.sum()):,}; per relation min {int(nnz.min()):,} / median "
                    f"{int(np.median(nnz)):,} / max {int(nnz.max()):,}"
                    f" ({nnz.sum() / max(1, artifact.num_entities * artifact.num_relations):.1f} per row)")
    lines = [
        f"artifact      {artifact.path}",
        f"source        {m.get('source', '?')}",
        f"entities      {artifact.num_entities:,}",
        f"relations     {artifact.num_relations:,} (inverses included)",
        f"observed      {len(artifact.observed):,} edges",
        f"missing       {len(artifact.missing):,} edges (dropped + valid + test)",
        nnz_line,
    ]
    tr = m.get("train", {})
    if "mrr" in tr:
        lines.append(
            f"link pred.    MRR {tr['mrr']:.3f}, hits@1 {tr['hits_at_1']:.3f}, hits@10 {tr['hits_at_10']:.3f} "
            f"(filtered, {tr['eval_triples']:,} of {tr['eval_triples_available']:,} held-out edges)"
        )
    if tr.get("final_loss") is not None:
        lines.append(f"train loss    {tr['final_loss']:.4f} after {len(tr['losses'])} epochs")
    timings = m.get("timings_s", {})
    if timings:
        lines.append("time          " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
                     + f"; total {sum(timings.values()):.1f} s")
    cal = m.get("calibration", {})
    if "matmul_gflops_per_s" in cal:
        lines.append(f"calibration   threshold {cal['threshold']:.3g}, delta {cal['delta']:g}; "
                     f"{cal['matmul_gflops_per_s']:.1f} GFLOP/s useful matmul rate (chunk {cal['chunk_rows']} rows)")
    if "peak_rss_bytes" in m:
        lines.append(f"peak memory   {_fmt_bytes(m['peak_rss_bytes'])} (RSS)")
    return "\n".join(lines)
