"""CLI: turn a lazy artifact into the eager one, computing and storing every calibrated row.

    python -m kge.materialize --artifact artifacts/FB15k-237 --out artifacts/FB15k-237-eager --max-matrix-gb 40

The new folder holds the lazy artifact's files unchanged (entities, relations, embeddings, observed and
missing edges) and ``matrices.npz``: all ``R*N`` rows at the lazy artifact's threshold and delta, computed by
the eager build's own calibration (:func:`kge.calibrate.calibrate`, on ``--device``).  Every file but
meta.json is therefore byte-identical to what ``python -m kge.build --kg KG --embeddings LAZY --matrices eager
--threshold T`` writes for the same graph on the same device (tests/test_kge_materialize.py); the answers
are the lazy artifact's (lazy rows are the eager rows, kge/lazy.py).

The threshold is never raised: when the matrices at it would exceed ``--max-matrix-gb`` (estimated from
sampled rows before computing, and checked again while computing) the command stops with one line naming
the size and the flag.  ``--out`` follows the build's rules (a new or empty folder, or an artifact replaced
only with ``--overwrite``; never the input).  meta.json records the build's settings with ``matrices:
eager`` and the threshold (so its rebuild command makes the eager artifact), the calibration as an eager
build records it, and ``materialized_from``: the lazy folder, its files' checksums, the time taken.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from kgreason.cli import (ArgumentParser, QuietSettings, Settings, add_settings_arguments, same_setting, setting,
                          settings_from_args, verify_setting)
from kgreason.errors import UserError, cli_main
from kgreason.files import OutputFolder
from kgreason.resources import available_memory_bytes

from .artifact import Artifact
from .autorule import EAGER_PEAK_FACTOR, fmt_bytes
from .build_config import BuildConfig
from .builder import (BASE_BYTES, StagingLock, peak_rss_bytes, remove_killed_builds,
                    summarize)

__all__ = ["MaterializeConfig", "materialize_artifact", "parse_args", "main"]


@dataclass(frozen=True, kw_only=True)
class MaterializeConfig(Settings):
    """``artifact``: the lazy artifact folder; ``out``: the eager artifact to write; ``max_matrix_gb``: the
    matrices' budget (8 bytes per entry); ``device``: where rows are computed (auto: cuda if available, as
    kge.build); ``chunk_rows``: rows per matmul (default as kge.build); ``memory_check``: refuse when
    :data:`~kge.autorule.EAGER_PEAK_FACTOR` x the estimated matrices exceed MemAvailable; ``verify``: check
    the input's checksums.  Each field declares its ``python -m kge.materialize`` flag; those it shares with
    ``kge.build`` are :class:`~kge.build_config.BuildConfig`'s (:func:`~kgreason.cli.same_setting`)."""

    artifact: str = setting(help="the lazy artifact folder (left as it is)")
    out: str = setting(help="the eager artifact folder to write (missing parent folders are created)")
    max_matrix_gb: float = same_setting(BuildConfig, "max_matrix_gb",
                                        help="the matrices' budget in GiB (8 bytes per entry): over it, an error "
                                             "names the size needed (the lazy artifact's threshold is kept, never "
                                             "raised)")
    device: str = same_setting(BuildConfig, "device")
    chunk_rows: int | None = same_setting(BuildConfig, "chunk_rows", shown_default="as kge.build")
    memory_check: bool = same_setting(BuildConfig, "memory_check",
                                      help=f"compute even when {EAGER_PEAK_FACTOR:g} x the estimated matrices exceed "
                                           "MemAvailable")
    overwrite: bool = same_setting(BuildConfig, "overwrite")
    verify: bool = verify_setting()


def materialize_artifact(config: MaterializeConfig, *, progress: bool = True) -> Artifact:
    """Write the eager artifact of the lazy ``config.artifact`` to ``config.out`` (atomically); returns it."""
    from .calibrate import calibrate, estimate_nnz
    from .train import resolve_device

    output = OutputFolder(config.out, overwrite=config.overwrite, what="--out", create_parents=True,
                          inputs=[("--artifact", config.artifact)])
    lazy = Artifact.load(config.artifact, verify=config.verify)
    where = f"--artifact {config.artifact}"
    if not lazy.is_lazy:
        raise UserError(f"{where}: already eager (its matrices.npz holds every row); nothing to materialize")
    lm = lazy.matrices
    threshold, delta = lm.threshold, lm.delta
    device = resolve_device(config.device)
    embeddings = lazy.embeddings or {}  # a lazy artifact always loads them (they are its matrices)
    ent, rel = embeddings["entity"], embeddings["relation"]
    build = lazy.meta.get("build_config") if isinstance(lazy.meta.get("build_config"), dict) else {}
    seed = build.get("seed") if isinstance(build.get("seed"), int) else 0

    # Up front, from sampled rows (the build's estimate): the size at the kept threshold, and the peak memory.
    est = estimate_nnz(ent, rel, lazy.observed, floor=threshold, seed=seed, device=device)
    nnz = est.nnz_at(threshold)
    size = f"~{nnz:,.0f} entries ({fmt_bytes(8 * nnz)}) at its threshold {threshold:g}"
    budget = config.max_matrix_gb * (1 << 30)
    if 8 * nnz > budget:
        raise UserError(f"{where}: the eager matrices would hold {size}, over --max-matrix-gb "
                        f"{config.max_matrix_gb:g}; pass --max-matrix-gb {_round_up(8 * nnz * 1.1 / (1 << 30)):g} "
                        f"or more (the threshold is kept, never raised)")
    available = available_memory_bytes()
    need = BASE_BYTES + EAGER_PEAK_FACTOR * 8 * nnz
    if config.memory_check and available is not None and need > available:
        raise UserError(f"{where}: the eager matrices ({size}) need about {fmt_bytes(need)} at peak "
                        f"(x{EAGER_PEAK_FACTOR:g} plus the interpreter) but only {fmt_bytes(available)} is "
                        f"available (MemAvailable); use a machine with more memory, or --no-memory-check to try anyway")
    message = f"materialize: {size} (estimated from {est.sampled_rows} sampled rows) <= --max-matrix-gb {config.max_matrix_gb:g}"
    if progress:
        print(message, file=sys.stderr)

    remove_killed_builds(output.path, progress=progress)
    with output as tmp, StagingLock() as lock:
        lock.hold(tmp)
        t0 = time.perf_counter()
        try:  # the eager build's call at an explicit threshold: same rows, same bytes
            matrices, stats = calibrate(ent, rel, lazy.observed, threshold=threshold, delta=delta,
                                        chunk_rows=config.chunk_rows, device=device, progress=progress,
                                        max_nnz=int(budget / 8), adapt_threshold=False)
        except UserError as exc:  # the sampled estimate missed: calibrate's count, without its advice
            found = str(exc).split("; raise the threshold")[0]
            raise UserError(f"{where}: the eager matrices outgrow --max-matrix-gb {config.max_matrix_gb:g} "
                            f"({found}); pass a larger --max-matrix-gb (the threshold is kept)") from None
        seconds = time.perf_counter() - t0
        meta = _eager_meta(lazy, config, device, stats, seconds,
                           {"sampled_rows": est.sampled_rows, "max_matrix_gb": config.max_matrix_gb,
                            f"nnz_at_{threshold:g}": round(nnz), "message": message})
        eager = Artifact(entities=list(lazy.entities), relations=list(lazy.relations), matrices=matrices,
                         observed=lazy.observed, missing=lazy.missing, meta=meta, embeddings=embeddings)
        eager.save(tmp)
        output.commit()  # before the lock file goes (kge.build's order)
    eager.path = output.path
    return eager


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits (a budget to suggest: 0.0138 -> 0.014, 29.4 -> 30)."""
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step) * step


def _eager_meta(lazy: Artifact, config: MaterializeConfig, device: str, stats, seconds: float,
                estimate: dict[str, Any]) -> dict[str, Any]:
    """The lazy artifact's meta.json as its eager build would have written it, and where it came from."""
    old = lazy.meta
    meta = {k: v for k, v in old.items() if k not in ("files", "matrices", "nnz")}
    build = dict(old["build_config"]) if isinstance(old.get("build_config"), dict) else {}
    if build:  # its rebuild command (kge.artifact.rebuild_command) makes this eager artifact
        build.update(out=str(config.out), matrices="eager", threshold=stats.threshold, delta=lazy.matrices.delta,
                     max_matrix_gb=config.max_matrix_gb, overwrite=False)
        meta["build_config"] = build
    calib = old.get("calibration") if isinstance(old.get("calibration"), dict) else {}
    meta["calibration"] = {
        "threshold": stats.threshold, "nnz_estimate": estimate, "delta": lazy.matrices.delta, "rows": stats.rows,
        "chunk_rows": stats.chunk_rows, "matmul_gflops_per_s": stats.flop_rate / 1e9,
        **({"formula": calib["formula"]} if "formula" in calib else {}),
        "matrices_choice": {"mode": "eager", "forced_by": "python -m kge.materialize",
                            "lazy_build": calib.get("matrices_choice")},
    }
    timings = dict(old["timings_s"]) if isinstance(old.get("timings_s"), dict) else {}
    timings["calibrate"] = round(seconds, 3)
    meta["timings_s"] = timings
    meta["materialized_from"] = {"artifact": os.path.abspath(lazy.path or config.artifact),
                                 "files": old.get("files"), "device": device, "seconds": round(seconds, 3),
                                 "peak_rss_bytes": peak_rss_bytes()}
    return meta


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m kge.materialize", description=__doc__.split("\n\n")[0],
                       epilog="example: python -m kge.materialize --artifact artifacts/FB15k-237 --out "
                              "artifacts/FB15k-237-eager --max-matrix-gb 40 (every file but meta.json as "
                              "kge.build --embeddings LAZY --matrices eager at the same threshold writes)")
    add_settings_arguments(p, MaterializeConfig)
    add_settings_arguments(p, QuietSettings)
    return p


def parse_args(argv: Sequence[str] | None) -> tuple[MaterializeConfig, bool]:
    ns = _parser().parse_args(argv)
    return settings_from_args(MaterializeConfig, ns), settings_from_args(QuietSettings, ns).progress


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    config, progress = parse_args(argv)
    artifact = materialize_artifact(config, progress=progress)
    if progress:
        print(summarize(artifact))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
