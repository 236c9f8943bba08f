"""Memory of a loaded artifact plus an executor: peak RSS and the bytes its relation matrices hold.

Loads ``--artifact``, builds an :class:`engine.exec.executor.Executor` and measures at three points:

1. ``loaded``: after ``Artifact.load``;
2. ``one query``: after one 1p query (relation 0, answered with explanations);
3. ``every relation``: after one 1p query per relation in one mixed-relation batch, then the same
   queries one at a time (single-relation batches: what an evaluation's relation-sorted chunks do).

At each point it prints the peak RSS (``ru_maxrss``), the current RSS and the bytes held by the
matrices: every numpy array and torch tensor reachable from the executor (its prepared matrices and
row source) and from the artifact's matrices and matrix caches, each buffer counted once (views and
``torch.from_numpy`` sharing memory are merged by address range; embeddings, edges and vocabularies
are not counted unless a lazy row source reaches them).

Run it from a tree's root with ``PYTHONPATH=.`` to measure that tree's code, e.g. the session-start
code in a worktree beside the repository::

    PYTHONPATH=. python benchmarks/executor_memory.py --artifact ~/.cache/kgreason/artifacts/umls
    (cd ../wt-base && PYTHONPATH=. python ../main/benchmarks/executor_memory.py --artifact ARTIFACT)

``--json FILE`` also writes the numbers.  Not a pytest benchmark: one process per measurement, so that
peak RSS means this artifact and executor only.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Options:
    artifact: Path
    device: str
    json: Path | None
    overwrite: bool = False


def parse_args(argv: list[str] | None) -> Options:
    """The command line as :class:`Options`; mistakes (an unknown device, a ``--json`` that is a folder, inside
    the artifact, or exists without ``--overwrite``) are one-line UserErrors before the artifact is loaded."""
    from kgreason.cli import ArgumentParser, check_device
    from kgreason.errors import UserError
    from kgreason.files import check_output_file

    p = ArgumentParser(prog="python benchmarks/executor_memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path, required=True, help="artifact folder")
    p.add_argument("--device", default="cpu", help="executor device (default cpu)")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    a = p.parse_args(argv)
    check_device(a.device)
    if a.json is not None:
        check_output_file(a.json, what="--json", inputs=[("--artifact", a.artifact)])
        if a.json.exists() and not a.overwrite:
            raise UserError(f"--json {a.json}: already exists; pass --overwrite to replace it")
    return Options(artifact=a.artifact, device=a.device, json=a.json, overwrite=a.overwrite)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _buffers(obj, out: list[tuple[str, int, int]], seen: set[int], depth: int = 0) -> None:
    """Append ``(device, start address, nbytes)`` of every array/tensor buffer reachable from ``obj``."""
    import torch

    if id(obj) in seen or depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.sparse_csr:
            for t in (obj.crow_indices(), obj.col_indices(), obj.values()):
                _buffers(t, out, seen, depth + 1)
            return
        st = obj.untyped_storage()
        out.append((str(obj.device), st.data_ptr(), st.nbytes()))
        return
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        out.append(("cpu", base.__array_interface__["data"][0], base.nbytes))
        return
    if isinstance(obj, (str, bytes, int, float, bool, type(None), type)) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if isinstance(obj, dict):
        for v in obj.values():
            _buffers(v, out, seen, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _buffers(v, out, seen, depth + 1)
        return
    if is_dataclass(obj):
        for f in fields(obj):
            _buffers(getattr(obj, f.name, None), out, seen, depth + 1)
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        for v in d.values():
            _buffers(v, out, seen, depth + 1)


def _union_bytes(bufs: list[tuple[str, int, int]]) -> dict[str, int]:
    """Bytes covered by the buffers, per device, overlapping ranges counted once."""
    total: dict[str, int] = {}
    for dev in sorted({b[0] for b in bufs}):
        spans = sorted((s, s + n) for d, s, n in bufs if d == dev and n > 0)
        covered, end = 0, -1
        for lo, hi in spans:
            if hi <= end:
                continue
            covered += hi - max(lo, end)
            end = max(end, hi)
        total[dev] = covered
    return total


def matrix_bytes(ex) -> dict[str, int]:
    art = ex.artifact
    roots = [v for k, v in ex.__dict__.items() if k != "artifact"]
    roots += [art.matrices, getattr(art, "_torch_cache", None), getattr(art, "_rows_cache", None)]
    bufs: list[tuple[str, int, int]] = []
    seen: set[int] = {id(art)}
    for r in roots:
        _buffers(r, bufs, seen)
    return _union_bytes(bufs)


def main(argv: list[str] | None = None) -> int:
    """The CLI (one-line errors, status 2: :func:`kgreason.errors.cli_main`)."""
    from kgreason.errors import cli_main

    return cli_main(_main)(argv)


def _main(argv: list[str] | None = None) -> int:
    from kgreason.files import write_output

    opt = parse_args(argv)
    import torch

    from engine.exec.executor import Executor
    from engine.lang.query import Anchor, Projection
    from kge import Artifact

    torch.set_num_threads(1)
    rows = []

    def point(name: str, ex=None) -> None:
        mb = matrix_bytes(ex) if ex is not None else {}
        row = dict(point=name, peak_rss_mib=round(_peak_mib(), 1), rss_mib=round(_rss_mib(), 1),
                   matrix_bytes=mb, matrix_mib=round(sum(mb.values()) / 2**20, 2))
        rows.append(row)
        print(f"{name:>15}: peak RSS {row['peak_rss_mib']:8.1f} MiB, RSS {row['rss_mib']:8.1f} MiB, "
              f"matrices {row['matrix_mib']:8.2f} MiB {mb}", flush=True)

    t0 = time.perf_counter()
    art = Artifact.load(opt.artifact, verify=False)
    print(f"artifact {opt.artifact}: {art.num_entities} entities, {art.num_relations} relations, "
          f"{'lazy' if art.is_lazy else f'{art.matrices.nnz:,} entries'}; code from "
          f"{Path(sys.modules['engine'].__file__).resolve().parents[1]}", flush=True)
    ex = Executor(art, device=opt.device)
    point("loaded", ex)
    anchor = int(art.observed[0, 0]) if len(art.observed) else 0
    ex.answer([Projection(0, Anchor(anchor))], k=10)
    point("one query", ex)
    qs = [Projection(r, Anchor(anchor)) for r in range(art.num_relations)]
    ex.scores(qs)
    for q in qs:
        ex.scores([q])
    point("every relation", ex)
    print(f"({time.perf_counter() - t0:.1f} s)", flush=True)
    if opt.json is not None:
        write_output(opt.json, json.dumps(dict(artifact=str(opt.artifact), device=opt.device, points=rows), indent=2),
                     what="--json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
