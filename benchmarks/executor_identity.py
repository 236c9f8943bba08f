"""Referee for issue 23: the executor's outputs recorded on one source tree and compared, bit for bit, on another.

Three steps (commands as run for benchmarks/results/executor_identity.md)::

    # 1. the queries, once: 72 per BetaE structure (14 structures, 1,008 queries), seed 0, written as ids
    python benchmarks/executor_identity.py sample --artifact artifacts/fb-quick-eager \\
        --out /work/bench/identity/queries.jsonl
    # 2. record on the session-start tree (its own engine/kge/ops, imported from --tree)
    python benchmarks/executor_identity.py run --tree /work/wt-base --queries /work/bench/identity/queries.jsonl \\
        --artifact eager=artifacts/fb-quick-eager --artifact lazy=artifacts/fb-quick-lazy \\
        --save /work/bench/identity/base-1.json
    # 3. the current tree against that record; --report writes the markdown table
    python benchmarks/executor_identity.py run --queries /work/bench/identity/queries.jsonl \\
        --artifact eager=artifacts/fb-quick-eager --artifact lazy=artifacts/fb-quick-lazy \\
        --compare /work/bench/identity/base-1.json --save /work/bench/identity/now.json \\
        --report benchmarks/results/executor_identity.md --memory before=M0.json --memory after=M1.json
    # memory of a loaded eager artifact (run once per tree, each in a fresh process)
    python benchmarks/executor_identity.py memory --tree /work/wt-base --artifact artifacts/fb-quick-eager \\
        --queries /work/bench/identity/queries.jsonl --save /work/bench/identity/memory-before.json

What ``run`` records, per artifact, per mode (:data:`MODES`), per query: the sha256 of the
root's float32 score vector (N,), the top-10 entities with their scores, and for the ``answer``
modes the sha256 of the answers' JSON (explanation trees: every witness, i.e. the projection
argmax, every atom's weight and truth, provenance) and of every node's (N,) values (the trace,
``trace_values=True``).  ``--save FILE`` writes those to ``FILE`` (JSON) and the full score
matrices to ``FILE.scores.npz`` (so a comparison can give the largest difference over all N
entities, not only the top 10).  ``--compare FILE`` reruns and prints, per structure x mode x
artifact: queries identical (every hash equal), differing, the largest absolute score
difference among the differing ones, and the first differing query.

Only public API that exists at the session's start commit (ff626b3) is used:
``Executor(artifact, tnorm=, sparse=, frontier_k=)``, ``Executor.scores``/``Executor.answer``
with their default batch sizes (``b1-*`` modes: ``batch_size=1`` on a 100-query subset, since
batch composition picks the projection route), ``Engine.load``, ``kge.Artifact.load``,
``engine.eval.sampling.sample_queries``.  Each structure is one ``scores``/``answer`` call (the
executor batches by query shape, and every structure is one shape, so the batches are the ones
a single call over all queries makes); the progress bar moves per structure.

``--tree DIR`` puts ``DIR`` first on ``sys.path`` before anything of the project is imported,
so the same script runs the code of a git worktree; the record names the files it imported and
the tree's commit.  Threads: ``--threads`` (default 1) for every run, recorded and checked.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Mode", "MODES", "main", "sample", "load_queries", "subset_indices", "record_run", "save_record",
           "load_record", "compare_records", "format_comparison", "within_run_agreement", "measure_memory",
           "write_report", "held_bytes"]

#: Queries per structure in the b1-* subset: round-robin over the structures until this many.
SUBSET_SIZE = 100
#: Entities listed per query (the answers' k).
TOP_K = 10
#: frontier_k of the "frontier" mode (CQD-beam style pruning of every projection's input).
FRONTIER_K = 64
FORMAT = "executor-identity/1"


@dataclass(frozen=True)
class Mode:
    """One way of running the executor.

    ``kind``: ``"scores"`` (``Executor.scores``) or ``"answer"`` (``Executor.answer`` with
    explanations and kept trace values); ``executor``: keyword arguments of ``Executor``;
    ``batch_size``: ``None`` = the method's own default (1024 for scores, 256 for answer);
    ``subset``: run on the 100-query subset only.
    """

    name: str
    kind: str
    executor: tuple[tuple[str, Any], ...] = ()
    batch_size: int | None = None
    subset: bool = False
    doc: str = ""


MODES: tuple[Mode, ...] = (
    Mode("dense", "scores", doc="Executor(art).scores: dense (B, N) batches"),
    Mode("sparse", "scores", (("sparse", True),), doc="Executor(art, sparse=True).scores: sparse sets where small"),
    Mode("explain", "answer", doc="Executor(art).answer(k=10, explain=True, trace_values=True): argmax witnesses"),
    Mode("frontier", "scores", (("frontier_k", FRONTIER_K),), doc=f"Executor(art, frontier_k={FRONTIER_K}).scores"),
    Mode("godel", "scores", (("tnorm", "godel"),), doc="Executor(art, tnorm='godel').scores"),
    Mode("b1-dense", "scores", (), 1, True, "dense at batch_size=1 (100-query subset)"),
    Mode("b1-sparse", "scores", (("sparse", True),), 1, True, "sparse at batch_size=1 (100-query subset)"),
    Mode("b1-explain", "answer", (), 1, True, "explain at batch_size=1 (100-query subset)"),
)
MODE_NAMES = tuple(m.name for m in MODES)


# --------------------------------------------------------------------------------------------- helpers
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _vector_sha(v) -> str:
    """sha256 of a float32 (N,) vector's little-endian bytes."""
    import numpy as np

    a = np.ascontiguousarray(np.asarray(v, dtype="<f4"))
    return _sha(a.tobytes())


def _top(v, k: int = TOP_K) -> list[list]:
    """The k best entities with score > 0 as ``[id, score]``, ties by smaller id (as ``Executor.answer``)."""
    import numpy as np

    v = np.asarray(v, dtype=np.float32)
    order = np.lexsort((np.arange(v.shape[0]), -v.astype(np.float64)))[:k]
    return [[int(i), float(v[i])] for i in order if v[i] > 0]


def _tree_info(tree: Path | None) -> dict[str, Any]:
    """Where the project's packages were imported from, and the git commit of that tree."""
    import engine
    import kge
    import ops

    root = Path(engine.__file__).resolve().parent.parent
    info: dict[str, Any] = {"root": str(root), "engine": engine.__file__, "kge": kge.__file__, "ops": ops.__file__}
    try:
        info["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "engine", "kge", "ops",
                                "csrc", "kgreason"], capture_output=True, text=True, check=True).stdout.strip()
        info["dirty"] = [line for line in dirty.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout: a `git archive` snapshot may name its commit in .source-commit
        # (`git get-tar-commit-id`), so a record of a snapshot still says which code ran.
        src = root / ".source-commit"
        info["commit"] = src.read_text().strip() if src.is_file() else None
    return info


def _machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads)"


# --------------------------------------------------------------------------------------------- queries
def sample(artifact_dir: Path, out: Path, *, per_structure: int = 72, seed: int = 0, progress: bool = True) -> int:
    """Sample ``per_structure`` queries of every BetaE structure on the artifact; write them as JSON Lines.

    One line per query ``{"structure", "expr", "easy", "hard"}`` with ids (``#k``) in ``expr``, so
    the file reads the same on any artifact of the same KG.  Returns the number written.
    """
    from engine.eval.sampling import query_record, sample_queries
    from engine.lang.structures import STRUCTURES
    from kge.artifact import Artifact
    from kgreason.files import write_output

    art = Artifact.load(artifact_dir, verify=True, load_embeddings=False)
    queries, stats = sample_queries(art, list(STRUCTURES), per_structure, seed=seed, progress=progress)
    for note in stats.notes():
        print(note, file=sys.stderr)
    write_output(out, "".join(query_record(q) for q in queries), what="--out")
    return len(queries)


def load_queries(path: Path) -> tuple[list[str], list[str]]:
    """``(structures, expressions)`` of a query file written by :func:`sample` (one-line errors)."""
    from kgreason.errors import UserError
    from kgreason.files import read_lines

    structures, exprs = [], []
    for lineno, line in read_lines(path, what="--queries"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            s, e = rec["structure"], rec["expr"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{path}:{lineno}: expected a JSON object with \"structure\" and \"expr\" "
                            "(a file written by `executor_identity.py sample`)") from None
        if not isinstance(s, str) or not isinstance(e, str):
            raise UserError(f"{path}:{lineno}: \"structure\" and \"expr\" must be strings")
        structures.append(s)
        exprs.append(e)
    if not exprs:
        raise UserError(f"{path}: no queries")
    return structures, exprs


def subset_indices(structures: Sequence[str], size: int = SUBSET_SIZE) -> list[int]:
    """Round-robin over the structures (in file order) until ``size`` queries: every structure is in it."""
    by: dict[str, list[int]] = {}
    for k, s in enumerate(structures):
        by.setdefault(s, []).append(k)
    out: list[int] = []
    depth = 0
    while len(out) < min(size, len(structures)):
        for idx in by.values():
            if depth < len(idx) and len(out) < size:
                out.append(idx[depth])
        depth += 1
    return sorted(out)


# --------------------------------------------------------------------------------------------- recording
def _answers_json(result) -> str:
    return json.dumps([a.to_json() for a in result.answers], sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))


def _nodes_sha(trace) -> str:
    """sha256 over every node's path and (N,) float32 values, nodes in path order (evaluation order aside)."""
    h = hashlib.sha256()
    for nt in sorted(trace.nodes, key=lambda n: n.path):
        h.update(repr(tuple(nt.path)).encode())
        h.update(b"-" if nt.values is None else nt.values.detach().cpu().numpy().astype("<f4").tobytes())
    return h.hexdigest()


def _run_mode(executor, mode: Mode, nodes: list, groups: dict[str, list[int]], bar) -> tuple[Any, list[dict]]:
    """Run ``nodes`` through ``executor`` as ``mode`` says, one call per structure; ``(scores (Q, N), records)``."""
    import numpy as np

    n_ent = executor.artifact.num_entities
    scores = np.zeros((len(nodes), n_ent), dtype=np.float32)
    recs: list[dict | None] = [None] * len(nodes)
    kw = {} if mode.batch_size is None else {"batch_size": mode.batch_size}
    for structure, idx in groups.items():
        batch = [nodes[k] for k in idx]
        if mode.kind == "scores":
            y = executor.scores(batch, **kw).cpu().numpy()
            for row, k in enumerate(idx):
                scores[k] = y[row]
                recs[k] = {"s": _vector_sha(y[row]), "top": _top(y[row])}
        else:
            results = executor.answer(batch, k=TOP_K, explain=True, trace_values=True, **kw)
            for res, k in zip(results, idx):
                v = res.trace.root.values.detach().cpu().numpy()
                scores[k] = v
                recs[k] = {"s": _vector_sha(v), "top": _top(v), "x": _sha(_answers_json(res).encode()),
                           "v": _nodes_sha(res.trace)}
        bar.update(1)
    return scores, recs  # type: ignore[return-value]


def _wanted(art_name: str, modes: Sequence[str]) -> list[Mode]:
    """The modes to run on ``art_name``: ``MODE`` (every artifact) or ``ARTIFACT/MODE`` entries."""
    names = {m for m in modes if "/" not in m} | {m.split("/", 1)[1] for m in modes if m.startswith(art_name + "/")}
    return [m for m in MODES if m.name in names]


def record_run(artifacts: dict[str, Path], queries: Path, *, modes: Sequence[str] = MODE_NAMES,
               threads: int = 1, progress: bool = True, tree: Path | None = None,
               row_cache_gb: float | None = None, limit: int | None = None) -> tuple[dict, dict]:
    """Run every ``(artifact, mode)``; returns ``(record, scores)``.

    ``modes``: names (every artifact) or ``artifact/mode``; ``row_cache_gb``: lazy artifacts'
    row-cache budget (``None``: what the build recorded; the cache changes only the time);
    ``limit``: run every mode on the round-robin subset of that many queries (:func:`subset_indices`;
    the ``b1-*`` modes keep their 100, which it contains) instead of all of them.

    ``record``: JSON-ready dict (provenance, per artifact and mode the per-query hashes and
    top-10s); ``scores``: ``"artifact/mode"`` -> float32 (Q_mode, N) matrix (Q_mode = the
    subset's size for ``b1-*`` modes, rows in subset order).
    """
    import torch
    from kgreason.progress import progress_bar

    from engine.exec.executor import Executor
    from engine.lang.query import parse
    from kge.artifact import Artifact

    torch.set_num_threads(threads)
    structures, exprs = load_queries(queries)
    sub = subset_indices(structures)
    every = list(range(len(exprs))) if limit is None else subset_indices(structures, max(limit, len(sub)))
    rec: dict[str, Any] = {
        "format": FORMAT, "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
        "threads": threads, "tree": _tree_info(tree), "argv": sys.argv, "row_cache_gb": row_cache_gb,
        "limit": limit,
        "queries": {"path": str(queries), "sha256": _file_sha(queries), "structures": structures, "exprs": exprs,
                    "subset": sub},
        "artifacts": {}, "runs": {},
    }
    scores: dict[str, Any] = {}
    nodes = [parse(e, where=f"{queries}:{k + 1}") for k, e in enumerate(exprs)]
    total = sum(len(_wanted(a, modes)) for a in artifacts)  # calls per (artifact, mode): one per structure
    with progress_bar(total=total * len(set(structures)), desc="artifact x mode x structure", unit="call",
              disable=not progress, file=sys.stderr) as bar:
        for art_name, art_dir in artifacts.items():
            art = Artifact.load(art_dir, verify=True, load_embeddings=False, row_cache_gb=row_cache_gb)
            meta = json.loads((Path(art_dir) / "meta.json").read_text())
            rec["artifacts"][art_name] = {"path": str(art_dir), "lazy": bool(art.is_lazy),
                                          "meta_sha256": _file_sha(Path(art_dir) / "meta.json"),
                                          "entities": art.num_entities, "relations": art.num_relations,
                                          "matrices": meta.get("matrices"),
                                          "threshold": meta.get("calibration", {}).get("threshold")}
            for mode in _wanted(art_name, modes):
                idx = sub if mode.subset else every
                groups: dict[str, list[int]] = {}
                for j, k in enumerate(idx):
                    groups.setdefault(structures[k], []).append(j)
                bar.set_postfix_str(f"{art_name}/{mode.name}")
                ex = Executor(art, **dict(mode.executor))
                t0 = time.perf_counter()
                sc, recs = _run_mode(ex, mode, [nodes[k] for k in idx], groups, bar)
                if mode.subset:  # the subset's structures have fewer calls: keep the bar's total honest
                    bar.update(len(set(structures)) - len(groups))
                rec["runs"][f"{art_name}/{mode.name}"] = {"artifact": art_name, "mode": mode.name, "indices": idx,
                                                          "seconds": round(time.perf_counter() - t0, 3),
                                                          "queries": recs}
                scores[f"{art_name}/{mode.name}"] = sc
            del art
    return rec, scores


def _scores_path(path: Path) -> Path:
    return path.with_name(path.name + ".scores.npz")


def save_record(path: Path, rec: dict, scores: dict) -> None:
    """``path`` (JSON) and ``path.scores.npz`` (uncompressed float32 matrices), each written atomically."""
    import io

    import numpy as np

    from kgreason.files import write_output

    buf = io.BytesIO()
    np.savez(buf, **{k.replace("/", "__"): v for k, v in scores.items()})
    write_output(_scores_path(path), buf.getvalue(), what="--save scores")
    write_output(path, json.dumps(rec, separators=(",", ":")) + "\n", what="--save")


def load_record(path: Path) -> tuple[dict, dict | None]:
    """A saved record and its score matrices (``None`` when the .scores.npz is absent)."""
    import numpy as np

    from kgreason.errors import UserError

    try:
        rec = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"--compare {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--compare {path}: not a record written by --save ({type(exc).__name__})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise UserError(f"--compare {path}: not a record written by --save (format {FORMAT})")
    sp = _scores_path(Path(path))
    scores = None
    if sp.is_file():
        with np.load(sp) as z:
            scores = {k.replace("__", "/"): z[k] for k in z.files}
    return rec, scores


def _union_run(key: str, a: dict, a_scores, b: dict, b_scores):
    """One run from two records of it over different query subsets; the queries both ran must agree."""
    import numpy as np

    from kgreason.errors import UserError

    pos_a = {qi: k for k, qi in enumerate(a["indices"])}
    for k, qi in enumerate(b["indices"]):
        if qi in pos_a and a["queries"][pos_a[qi]] != b["queries"][k]:
            raise UserError(f"two records of {key} disagree on query #{qi}; compare them instead of merging")
    indices = sorted(set(a["indices"]) | set(b["indices"]))
    src = {qi: (a, a_scores, k) for k, qi in enumerate(a["indices"])}
    src.update({qi: (b, b_scores, k) for k, qi in enumerate(b["indices"]) if qi not in src})
    run = dict(a, indices=indices, queries=[src[qi][0]["queries"][src[qi][2]] for qi in indices])
    scores = None
    if a_scores is not None and b_scores is not None:
        scores = np.stack([src[qi][1][src[qi][2]] for qi in indices])
    return run, scores


def merge_records(items: Sequence[tuple[dict, dict | None]]) -> tuple[dict, dict | None]:
    """Records of the same query file made by separate ``run`` calls (e.g. one per artifact) as one.

    A run (artifact/mode) held by several records, over different ``--limit`` subsets, becomes
    one over the union of their queries; the queries they share must have equal hashes.
    """
    from kgreason.errors import UserError

    rec = copy.deepcopy(items[0][0])
    scores = None if items[0][1] is None else dict(items[0][1])
    if len(items) > 1:
        rec["parts"] = [{"tree": rec["tree"], "created": rec["created"], "runs": sorted(rec["runs"])}]
    for other, other_scores in items[1:]:
        if other["queries"]["sha256"] != rec["queries"]["sha256"]:
            raise UserError(f"records on different query files: {rec['queries']['path']} vs {other['queries']['path']}")
        other_runs = dict(other["runs"])
        for key in sorted(set(rec["runs"]) & set(other_runs)):
            run, sc = _union_run(key, rec["runs"][key], None if scores is None else scores.get(key),
                                 other_runs.pop(key), None if other_scores is None else other_scores.get(key))
            rec["runs"][key] = run
            if scores is not None:
                scores[key] = sc
        rec["runs"].update(other_runs)
        rec["artifacts"].update(other["artifacts"])
        rec.setdefault("parts", []).append({"tree": other["tree"], "created": other["created"],
                                            "runs": sorted(other["runs"])})
        if scores is not None and other_scores is not None:
            scores.update({k: v for k, v in other_scores.items() if k in other_runs})
        else:
            scores = None
    return rec, scores


# --------------------------------------------------------------------------------------------- comparing
@dataclass
class Cell:
    """One structure x mode x artifact cell of a comparison."""

    artifact: str
    mode: str
    structure: str
    queries: int = 0
    identical: int = 0
    max_abs: float = 0.0
    first: int | None = None  # query number (0-based line of the queries file)
    what: str = ""  # which hashes differ for the first differing query
    differs: list[int] = field(default_factory=list)

    @property
    def differing(self) -> int:
        return self.queries - self.identical


_HASHES = (("s", "scores"), ("x", "explanation"), ("v", "node values"))


def compare_records(base: dict, base_scores: dict | None, now: dict, now_scores: dict | None) -> list[Cell]:
    """Per artifact x mode x structure, how many queries are identical (every recorded hash equal).

    The largest absolute difference of the differing queries comes from the full score matrices
    when both sides have them, else from the top-10 lists.  Runs present on one side only are
    skipped (the caller reports them); runs over different query subsets (``--limit``) are
    compared on the queries both ran.
    """
    from kgreason.errors import UserError

    if base["queries"]["sha256"] != now["queries"]["sha256"]:
        raise UserError("the two records were made on different query files "
                        f"({base['queries']['path']} vs {now['queries']['path']})")
    structures = base["queries"]["structures"]
    cells: list[Cell] = []
    for key, b in base["runs"].items():
        n = now["runs"].get(key)
        if n is None:
            continue
        # Records of different --limit: the queries both ran.
        n_row = {qi: k for k, qi in enumerate(n["indices"])}
        common = [(row, qi, n_row[qi]) for row, qi in enumerate(b["indices"]) if qi in n_row]
        by: dict[str, Cell] = {}
        for row, qi, nrow in common:
            bq, nq = b["queries"][row], n["queries"][nrow]
            s = structures[qi]
            cell = by.setdefault(s, Cell(b["artifact"], b["mode"], s))
            cell.queries += 1
            diff = [name for h, name in _HASHES if bq.get(h) != nq.get(h)]
            if not diff:
                cell.identical += 1
                continue
            cell.differs.append(qi)
            if cell.first is None:
                cell.first, cell.what = qi, "+".join(diff)
            if base_scores is not None and now_scores is not None and key in base_scores and key in now_scores:
                d = float(abs(base_scores[key][row].astype("float64") - now_scores[key][nrow].astype("float64")).max())
            else:
                bt, nt = dict(map(tuple, bq["top"])), dict(map(tuple, nq["top"]))
                d = max((abs(bt.get(e, 0.0) - nt.get(e, 0.0)) for e in set(bt) | set(nt)), default=0.0)
            cell.max_abs = max(cell.max_abs, d)
        cells.extend(by.values())
    return cells


def format_comparison(cells: Sequence[Cell], *, exprs: Sequence[str] | None = None, markdown: bool = False) -> str:
    """The long table: one line per artifact x mode x structure, then the differing queries listed."""
    head = ["artifact", "mode", "structure", "queries", "identical", "differing", "max abs diff", "first differing"]
    rows = []
    for c in cells:
        first = "" if c.first is None else f"#{c.first} ({c.what})"
        rows.append([c.artifact, c.mode, c.structure, str(c.queries), str(c.identical), str(c.differing),
                     f"{c.max_abs:.3g}" if c.differing else "", first])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
        lines = ["  ".join(h.ljust(w[i]) for i, h in enumerate(head))]
        lines += ["  ".join(v.ljust(w[i]) for i, v in enumerate(r)) for r in rows]
    tot_q = sum(c.queries for c in cells)
    tot_i = sum(c.identical for c in cells)
    lines.append("")
    lines.append(f"total: {tot_i:,} of {tot_q:,} (query, artifact, mode) outputs identical, {tot_q - tot_i:,} differ")
    if exprs is not None:
        for c in cells:
            for qi in c.differs[:5]:
                lines.append(f"differs: {c.artifact}/{c.mode} {c.structure} query #{qi}: {exprs[qi]}")
    return "\n".join(lines)


def _pivot(cells: Sequence[Cell], artifact: str, modes: Sequence[str], structures: Sequence[str]) -> str:
    """Markdown: structure rows x mode columns of one artifact; a cell is ``identical/queries`` (+ details)."""
    at = {(c.mode, c.structure): c for c in cells if c.artifact == artifact}
    lines = ["| structure | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    for s in structures:
        row = []
        for m in modes:
            c = at.get((m, s))
            if c is None:
                row.append("–")
            elif c.differing:
                row.append(f"**{c.identical}/{c.queries}** (max {c.max_abs:.2g}, #{c.first} {c.what})")
            else:
                row.append(f"{c.identical}/{c.queries}")
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def within_run_agreement(rec: dict, scores: dict | None) -> list[dict]:
    """Agreement between modes of one run (not before/after): what the executor claims and what it does.

    ``sparse`` vs ``dense`` is documented bit-identical (``Executor(sparse=...)``); the others are
    informational: ``explain`` vs ``dense`` (argmax kernels), ``b1-*`` vs the default batches,
    ``lazy`` vs ``eager`` (lazy rows are the eager build's formula, documented equal within 1e-6).
    """
    import numpy as np

    pairs = []
    arts = list(rec["artifacts"])
    for a in arts:
        pairs += [(f"{a}/sparse", f"{a}/dense", "documented bit-identical"),
                  (f"{a}/explain", f"{a}/dense", "informational"),
                  (f"{a}/b1-dense", f"{a}/dense", "informational (batch 1 vs default)"),
                  (f"{a}/b1-sparse", f"{a}/b1-dense", "documented bit-identical"),
                  (f"{a}/b1-explain", f"{a}/explain", "informational (batch 1 vs default)")]
    if "eager" in arts:
        th_e = rec["artifacts"]["eager"].get("threshold")
        for a in arts:
            if a != "eager":
                th = rec["artifacts"][a].get("threshold")
                claim = ("informational (lazy rows = eager rows within 1e-6)" if th == th_e else
                         f"informational: thresholds differ ({th} vs {th_e})")
                pairs += [(f"{a}/{m}", f"eager/{m}", claim) for m in MODE_NAMES]
    out = []
    for x, y, claim in pairs:
        rx, ry = rec["runs"].get(x), rec["runs"].get(y)
        if rx is None or ry is None:
            continue
        pos_y = {qi: k for k, qi in enumerate(ry["indices"])}
        same = top_same = n = 0
        max_abs = 0.0
        for k, qi in enumerate(rx["indices"]):
            if qi not in pos_y:
                continue
            j = pos_y[qi]
            n += 1
            same += rx["queries"][k]["s"] == ry["queries"][j]["s"]
            top_same += [e for e, _ in rx["queries"][k]["top"]] == [e for e, _ in ry["queries"][j]["top"]]
            if scores is not None and x in scores and y in scores:
                max_abs = max(max_abs, float(np.abs(scores[x][k].astype(np.float64) - scores[y][j]).max()))
        out.append({"a": x, "b": y, "claim": claim, "queries": n, "scores_identical": same,
                    "top10_ids_identical": top_same, "max_abs": max_abs})
    return out


# --------------------------------------------------------------------------------------------- memory
def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


_SKIP = (str, bytes, int, float, bool, type(None), type, types.ModuleType, types.FunctionType, types.MethodType,
         types.BuiltinFunctionType, types.BuiltinMethodType)


def held_bytes(roots: dict[str, Any]) -> dict[str, int]:
    """Bytes of the distinct array storages (numpy, torch) reachable from each root, first root first.

    Walks attributes, dicts, lists and tuples; a storage reachable from two roots counts for the
    first one only (so ``{"artifact": a, "executor": e}`` gives the executor's *extra* copies).
    """
    import numpy as np
    import torch

    seen_obj: set[int] = set()
    seen_mem: set[int] = set()
    out: dict[str, int] = {}

    def visit(obj: Any, depth: int) -> int:
        if depth > 12 or id(obj) in seen_obj:
            return 0
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided:  # sparse tensors: their index/value tensors
                parts = []
                if obj.layout == torch.sparse_csr:
                    parts = [obj.crow_indices(), obj.col_indices(), obj.values()]
                elif obj.layout == torch.sparse_coo:
                    parts = [obj._indices(), obj._values()]
                return sum(visit(p, depth + 1) for p in parts)
            st = obj.untyped_storage()
            if st.data_ptr() in seen_mem or st.nbytes() == 0:
                return 0
            seen_mem.add(st.data_ptr())
            return st.nbytes()
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            ptr = base.__array_interface__["data"][0]
            if ptr in seen_mem or base.nbytes == 0:
                return 0
            seen_mem.add(ptr)
            return int(base.nbytes)
        if isinstance(obj, _SKIP):  # modules (the executor holds the ops module), code, scalars
            return 0
        if isinstance(obj, dict):
            return sum(visit(v, depth + 1) for v in list(obj.values()))
        if isinstance(obj, (list, tuple, set, frozenset)):
            if len(obj) > 100_000:  # vocabularies: strings, no arrays
                return 0
            return sum(visit(v, depth + 1) for v in obj)
        total = 0
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            total += visit(d, depth + 1)
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                total += visit(getattr(obj, slot), depth + 1)
        return total

    for name, root in roots.items():
        out[name] = visit(root, 0)
    return out


def measure_memory(artifact_dir: Path, queries: Path, *, threads: int = 1, tree: Path | None = None) -> dict:
    """RSS of loading ``artifact_dir`` with ``Engine.load`` and running queries, in this (fresh) process.

    Steps: after imports; after ``Engine.load`` (artifact + executor); after one ``scores`` batch
    (the 2p queries: rows of mixed relations, the stacked route); after ``scores`` over all queries
    (every structure: single- and mixed-relation routes); after ``answer`` over all queries
    (argmax routes).  Per step: current RSS, peak RSS so far (``ru_maxrss``) and the array bytes
    held by the artifact and, beyond those, by the executor (:func:`held_bytes`).
    """
    import torch

    import engine.exec.api as api
    from engine.lang.query import parse

    torch.set_num_threads(threads)
    structures, exprs = load_queries(queries)
    nodes = [parse(e) for e in exprs]
    steps = []

    def step(name: str, eng=None) -> None:
        held = held_bytes({"artifact": eng.artifact, "executor": eng.executor}) if eng is not None else {}
        steps.append({"step": name, "rss": _rss_bytes(), "maxrss": _maxrss_bytes(), **{f"held_{k}": v
                                                                                       for k, v in held.items()}})

    step("imports")
    t0 = time.perf_counter()
    eng = api.Engine.load(str(artifact_dir), verify=False)
    load_s = time.perf_counter() - t0
    step("Engine.load", eng)
    first = [n for n, s in zip(nodes, structures) if s == "2p"] or nodes[:72]
    eng.executor.scores(first)
    step("scores, one batch (2p)", eng)
    eng.executor.scores(nodes)
    step("scores, all queries", eng)
    eng.executor.answer(nodes, k=TOP_K, explain=True)
    step("answer (explain), all queries", eng)
    return {"format": FORMAT + "/memory", "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
            "tree": _tree_info(tree), "artifact": str(artifact_dir), "queries": str(queries), "threads": threads,
            "load_seconds": round(load_s, 3), "steps": steps}


# --------------------------------------------------------------------------------------------- report
def _mib(b: int) -> str:
    return f"{b / 2**20:,.0f}"


def _memory_table(mem: dict[str, dict]) -> str:
    names = list(mem)
    step_names = [s["step"] for s in next(iter(mem.values()))["steps"]]
    head = ["step"] + [f"{n}: {col}" for n in names for col in ("RSS", "peak RSS", "held artifact", "held executor")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for k, sname in enumerate(step_names):
        row = [sname]
        for n in names:
            st = mem[n]["steps"][k] if k < len(mem[n]["steps"]) else {}
            row += [_mib(st.get("rss", 0)), _mib(st.get("maxrss", 0)),
                    _mib(st["held_artifact"]) if "held_artifact" in st else "",
                    _mib(st["held_executor"]) if "held_executor" in st else ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _provenance(rec: dict) -> str:
    """Which tree, commit and time made each part of a (merged) record."""
    parts = rec.get("parts") or [{"tree": rec["tree"], "created": rec["created"], "runs": sorted(rec["runs"])}]
    out = []
    for p in parts:
        t = p["tree"]
        dirty = f" + {len(t['dirty'])} uncommitted files" if t.get("dirty") else ""
        arts = sorted({k.split("/")[0] for k in p["runs"]})
        modes = sorted({k.split("/", 1)[1] for k in p["runs"]}, key=MODE_NAMES.index)
        out.append(f"`{t.get('root')}` at {str(t.get('commit'))[:10]}{dirty} ({'+'.join(arts)}: {' '.join(modes)}; "
                   f"{p['created']})")
    return "; ".join(out)


def write_report(path: Path, *, base: dict, now: dict, cells: Sequence[Cell], agreement: Sequence[dict],
                 determinism: Sequence[Cell] | None = None, memory: dict[str, dict] | None = None,
                 command: str = "", notes: str = "") -> str:
    """The markdown report (returned, and written to ``path``): provenance, pivots, long table, memory."""
    from kgreason.files import write_output

    structures = list(dict.fromkeys(base["queries"]["structures"]))
    modes = [m for m in MODE_NAMES if any(c.mode == m for c in cells)]
    tot_q = sum(c.queries for c in cells)
    tot_i = sum(c.identical for c in cells)
    counts = {s: base["queries"]["structures"].count(s) for s in structures}
    lines = [
        "# Executor outputs before vs after (issue 23 must-show)",
        "",
        "Written by `benchmarks/executor_identity.py` (see its docstring for every step). " + (
            f"Command: `{command}`" if command else ""),
        "",
        f"- **Result: {tot_i:,} of {tot_q:,} (query, artifact, mode) outputs identical; {tot_q - tot_i:,} differ.** "
        "Identical = the sha256 of the root's float32 score vector (N,) equal, and for the explain modes also "
        "the sha256 of the answers' JSON (explanation trees: every argmax witness, atom weight/truth, provenance) "
        "and of every node's (N,) values.",
        f"- Before: {_provenance(base)}.",
        f"- After: {_provenance(now)}.",
        f"- Machine: {now['machine']}; {now['threads']} thread(s) for every run"
        + (f"; lazy row cache {now.get('row_cache_gb')} GiB" if now.get("row_cache_gb") else "") + ".",
        f"- Queries: `{base['queries']['path']}` (sha256 {base['queries']['sha256'][:16]}…), "
        f"{len(base['queries']['exprs']):,} queries: "
        + ", ".join(f"{s} {n}" for s, n in counts.items())
        + f"; `b1-*` modes on a {len(base['queries']['subset'])}-query round-robin subset.",
    ]
    for name, a in base["artifacts"].items():
        lines.append(f"- Artifact `{name}`: `{a['path']}`, {a['entities']:,} entities, {a['relations']} relations, "
                     f"matrices {a['matrices']}, threshold {a['threshold']}.")
    lines += ["", "Modes:", ""]
    lines += [f"- `{m.name}`: {m.doc}" for m in MODES if m.name in modes]
    if notes:
        lines += ["", notes.strip()]
    for name in base["artifacts"]:
        lines += ["", f"## Artifact `{name}`: identical / queries per structure and mode", "",
                  _pivot(cells, name, modes, structures)]
    if determinism is not None:
        d_q = sum(c.queries for c in determinism)
        d_i = sum(c.identical for c in determinism)
        lines += ["", "## Determinism: before-records of separate runs against each other", "",
                  f"{d_i:,} of {d_q:,} outputs identical (the queries and modes both ran): "
                  + ", ".join(sorted({f"{c.artifact}/{c.mode}" for c in determinism})) + "."]
        bad = [c for c in determinism if c.differing]
        if bad:
            lines += ["", format_comparison(bad, markdown=True)]
    lines += ["", "## Agreement between modes within the after-run", "",
              "| a | b | claim | queries | score vectors identical | top-10 ids identical | max abs diff |",
              "|---|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['a']} | {r['b']} | {r['claim']} | {r['queries']} | {r['scores_identical']} | "
              f"{r['top10_ids_identical']} | {r['max_abs']:.3g} |" for r in agreement]
    if memory:
        lines += ["", "## Memory of the loaded eager artifact (MiB)", "",
                  "Each column set is one fresh process (`executor_identity.py memory`): `Engine.load` of the "
                  "eager artifact, then the queries. Peak RSS = `ru_maxrss`; held = bytes of the distinct "
                  "numpy/torch storages reachable from the artifact and, beyond those, from the executor.", "",
                  _memory_table(memory), ""]
        for n, m in memory.items():
            lines.append(f"- {n}: `{m['tree'].get('root')}` at {m['tree'].get('commit')}, {m['threads']} thread(s), "
                         f"load {m['load_seconds']} s, {m['created']}.")
    lines += ["", "## Long table", "", format_comparison(cells, markdown=True), ""]
    text = "\n".join(lines)
    write_output(path, text, what="--report")
    return text


# --------------------------------------------------------------------------------------------- CLI
@dataclass(frozen=True)
class SampleArgs:
    artifact: Path
    out: Path
    per_structure: int
    seed: int
    progress: bool


@dataclass(frozen=True)
class RunArgs:
    queries: Path
    artifacts: tuple[tuple[str, Path], ...]
    modes: tuple[str, ...]
    threads: int
    row_cache_gb: float | None
    limit: int | None
    save: Path | None
    compare: tuple[Path, ...]
    progress: bool
    tree: Path | None


@dataclass(frozen=True)
class ReportArgs:
    before: tuple[Path, ...]
    after: tuple[Path, ...]
    determinism: tuple[Path, ...]
    determinism_with: tuple[Path, ...]
    memory: tuple[tuple[str, Path], ...]
    notes: Path | None
    out: Path


@dataclass(frozen=True)
class MemoryArgs:
    artifact: Path
    queries: Path
    threads: int
    save: Path | None
    tree: Path | None


def _use_tree(argv: Sequence[str]) -> Path | None:
    """Honour ``--tree DIR`` before the project is imported (stdlib only here)."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--tree", type=Path, default=None)
    try:
        ns, _ = pre.parse_known_args(list(argv))
    except argparse.ArgumentError:  # e.g. --tree with no value: the full parser reports it in the CLIs' one-line form
        return None
    if ns.tree is None:
        return None
    tree = ns.tree.resolve()
    if not (tree / "engine" / "__init__.py").is_file():
        print(f"error: --tree {ns.tree}: not a kgreason source tree (no engine/__init__.py there)", file=sys.stderr)
        raise SystemExit(2)
    sys.path.insert(0, str(tree))
    return tree


def _named_path(value: str, flag: str) -> tuple[str, Path]:
    from kgreason.errors import UserError

    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise UserError(f"{flag} {value!r}: expected NAME=PATH")
    return name, Path(path)


def _files(paths: Sequence[Path], flag: str) -> tuple[Path, ...]:
    from kgreason.errors import UserError

    for f in paths:
        if not f.is_file():
            raise UserError(f"{flag} {f}: no such file")
    return tuple(paths)


def parse_args(argv: Sequence[str]) -> SampleArgs | RunArgs | ReportArgs | MemoryArgs:
    from kgreason.cli import ArgumentParser, check_seed
    from kgreason.errors import UserError, unknown_name

    p = ArgumentParser(prog="benchmarks/executor_identity.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="sample the queries file once")
    s.add_argument("--artifact", type=Path, required=True, help="artifact folder (with missing triples)")
    s.add_argument("--out", type=Path, required=True, help="queries file to write (JSON Lines)")
    s.add_argument("--per-structure", type=int, default=72, help="queries per structure (default 72: 1,008)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    s.add_argument("--no-progress", action="store_true")
    r = sub.add_parser("run", help="run the executor in every mode; --save and/or --compare")
    r.add_argument("--queries", type=Path, required=True, help="queries file written by `sample`")
    r.add_argument("--artifact", action="append", required=True, metavar="NAME=DIR",
                   help="artifact to run on (repeatable), e.g. eager=artifacts/fb-quick-eager")
    r.add_argument("--modes", nargs="+", default=list(MODE_NAMES), metavar="MODE",
                   help=f"modes, MODE for every artifact or NAME/MODE for one (default all: {' '.join(MODE_NAMES)})")
    r.add_argument("--row-cache-gb", type=float, default=None,
                   help="lazy artifacts' row-cache budget in GiB (default: what the build recorded; time only)")
    r.add_argument("--limit", type=int, default=None, metavar="N",
                   help="every mode on a round-robin subset of N queries (at least the b1 modes' 100) instead of all")
    r.add_argument("--save", type=Path, help="write the record here (and FILE.scores.npz)")
    r.add_argument("--compare", type=Path, nargs="+", default=(),
                   help="compare with these saved records (merged: e.g. one per artifact) and print the table")
    r.add_argument("--no-progress", action="store_true")
    rp = sub.add_parser("report", help="markdown report from saved records (no executor run)")
    rp.add_argument("--before", type=Path, nargs="+", required=True, help="records of the before tree (merged)")
    rp.add_argument("--after", type=Path, nargs="+", required=True, help="records of the after tree (merged)")
    rp.add_argument("--determinism", type=Path, nargs="+", default=(),
                    help="before-records of separate runs, compared with --determinism-with (run-to-run determinism)")
    rp.add_argument("--determinism-with", type=Path, nargs="+", default=(),
                    help="the records --determinism is compared with (default: --before)")
    rp.add_argument("--memory", action="append", default=[], metavar="NAME=FILE",
                    help="a `memory` result to include (repeatable), e.g. before=mem0.json")
    rp.add_argument("--notes", type=Path, default=None, help="markdown to include after the header (how it was run)")
    rp.add_argument("--out", type=Path, required=True, help="markdown file to write")
    m = sub.add_parser("memory", help="RSS of loading the eager artifact and running queries (fresh process)")
    m.add_argument("--artifact", type=Path, required=True, help="eager artifact folder")
    m.add_argument("--queries", type=Path, required=True, help="queries file written by `sample`")
    m.add_argument("--save", type=Path, help="write the result (JSON) here")
    for q in (r, m):
        q.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    for q in (s, r, m):
        q.add_argument("--tree", type=Path, default=None,
                       help="import engine/kge/ops from this source tree (default: as installed)")
    for q in (r, rp, m):
        q.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    a = p.parse_args(list(argv))

    def output(path: Path | None, flag: str, inputs: list[tuple[str, Path | None]]) -> None:
        """Before any work: not an input nor inside one, not a folder, replaced only with --overwrite."""
        from kgreason.files import check_output_file

        if path is None:
            return
        check_output_file(path, what=flag, inputs=inputs)
        if path.exists() and not a.overwrite:
            raise UserError(f"{flag} {path}: already exists; pass --overwrite to replace it")

    if a.cmd == "sample":
        check_seed(a.seed)
        if a.per_structure < 1:
            raise UserError(f"--per-structure must be >= 1, got {a.per_structure}")
        if a.out.exists():
            raise UserError(f"--out {a.out}: exists; every run must reuse the same queries file, so it is never "
                            "overwritten (remove it first to sample anew)")
        return SampleArgs(a.artifact, a.out, a.per_structure, a.seed, not a.no_progress)
    if a.cmd == "report":
        mem = tuple(_named_path(v, "--memory") for v in a.memory)
        _files([f for _, f in mem], "--memory")
        output(a.out, "--out", [(f, x) for f, xs in (("--before", a.before), ("--after", a.after),
                                                     ("--determinism", a.determinism),
                                                     ("--determinism-with", a.determinism_with),
                                                     ("--memory", [x for _, x in mem]), ("--notes", [a.notes]))
                                for x in xs])
        return ReportArgs(_files(a.before, "--before"), _files(a.after, "--after"),
                          _files(a.determinism, "--determinism"), _files(a.determinism_with, "--determinism-with"), mem,
                          None if a.notes is None else _files([a.notes], "--notes")[0], a.out)
    if a.threads < 1:
        raise UserError(f"--threads must be >= 1, got {a.threads}")
    if not a.queries.is_file():
        raise UserError(f"--queries {a.queries}: no such file")
    if a.cmd == "memory":
        output(a.save, "--save", [("--artifact", a.artifact), ("--queries", a.queries)])
        return MemoryArgs(a.artifact, a.queries, a.threads, a.save, a.tree)
    arts = tuple(_named_path(v, "--artifact") for v in a.artifact)
    if len({n for n, _ in arts}) != len(arts):
        raise UserError("--artifact: each NAME once")
    for n, d in arts:
        if not (d / "meta.json").is_file():
            raise UserError(f"--artifact {n}={d}: not an artifact folder (no meta.json)")
    for mode in a.modes:
        art, _, name = mode.rpartition("/")
        if name not in MODE_NAMES:
            raise unknown_name("mode", name, MODE_NAMES, "--modes")
        if art and art not in {n for n, _ in arts}:
            raise unknown_name("artifact", art, [n for n, _ in arts], "--modes")
    if a.row_cache_gb is not None and not (0 < a.row_cache_gb < float("inf")):
        raise UserError(f"--row-cache-gb must be a number of GiB > 0, got {a.row_cache_gb}")
    if a.save is None and not a.compare:
        raise UserError("run: give --save FILE, --compare FILE or both")
    if a.save is not None and any(a.save.resolve() == c.resolve() for c in a.compare):
        raise UserError(f"--save {a.save} is a --compare record")
    if a.limit is not None and a.limit < 1:
        raise UserError(f"--limit must be >= 1, got {a.limit}")
    output(a.save, "--save", [("--queries", a.queries), *((f"--artifact {n}", d) for n, d in arts),
                              *(("--compare", c) for c in a.compare)])
    if a.save is not None:  # the scores file written beside it
        output(_scores_path(a.save), "--save scores", [("--queries", a.queries), *((f"--artifact {n}", d) for n, d in arts)])
    return RunArgs(a.queries, arts, tuple(dict.fromkeys(a.modes)), a.threads, a.row_cache_gb, a.limit, a.save,
                   _files(a.compare, "--compare"), not a.no_progress, a.tree)


def _load_merged(paths: Sequence[Path]) -> tuple[dict, dict | None]:
    return merge_records([load_record(p) for p in paths])


def _report(args: ReportArgs) -> int:
    from kgreason.errors import UserError

    base, base_scores = _load_merged(args.before)
    now, now_scores = _load_merged(args.after)
    cells = compare_records(base, base_scores, now, now_scores)
    det = None
    if args.determinism:
        other, other_scores = _load_merged(args.determinism)
        ref, ref_scores = (base, base_scores) if not args.determinism_with else _load_merged(args.determinism_with)
        det = compare_records(ref, ref_scores, other, other_scores)
    mem = {}
    for name, path in args.memory:
        try:
            mem[name] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"--memory {name}={path}: cannot read it ({type(exc).__name__})") from None
    write_report(args.out, base=base, now=now, cells=cells, agreement=within_run_agreement(now, now_scores),
                 determinism=det, memory=mem or None, notes="" if args.notes is None else args.notes.read_text(),
                 command=" ".join(["python", "benchmarks/executor_identity.py", *sys.argv[1:]]))
    print(format_comparison(cells, exprs=now["queries"]["exprs"]))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(c.differing == 0 for c in cells) else 1


def _main(argv: Sequence[str], tree: Path | None) -> int:
    args = parse_args(argv)
    if isinstance(args, SampleArgs):
        n = sample(args.artifact, args.out, per_structure=args.per_structure, seed=args.seed, progress=args.progress)
        print(f"wrote {n:,} queries to {args.out}", file=sys.stderr)
        return 0
    if isinstance(args, ReportArgs):
        return _report(args)
    if isinstance(args, MemoryArgs):
        res = measure_memory(args.artifact, args.queries, threads=args.threads, tree=tree)
        text = json.dumps(res, indent=1)
        if args.save is not None:
            from kgreason.files import write_output

            write_output(args.save, text + "\n", what="--save")
        print(text)
        return 0
    base = base_scores = None
    if args.compare:  # read first: a bad record is an error before minutes of running
        base, base_scores = _load_merged(args.compare)
    rec, scores = record_run(dict(args.artifacts), args.queries, modes=args.modes, threads=args.threads,
                             progress=args.progress, tree=tree, row_cache_gb=args.row_cache_gb,
                             limit=args.limit)
    if args.save is not None:
        save_record(args.save, rec, scores)
        print(f"saved {args.save} and {_scores_path(args.save)}", file=sys.stderr)
    if base is None:
        return 0
    if base.get("threads") != rec["threads"]:
        print(f"warning: the saved record ran with {base.get('threads')} thread(s), this run with "
              f"{rec['threads']}", file=sys.stderr)
    missing = sorted(set(base["runs"]) ^ set(rec["runs"]))
    if missing:
        print(f"note: runs on one side only (not compared): {', '.join(missing)}", file=sys.stderr)
    cells = compare_records(base, base_scores, rec, scores)
    print(format_comparison(cells, exprs=rec["queries"]["exprs"]))
    return 0 if all(c.differing == 0 for c in cells) else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        tree = _use_tree(argv)
    except SystemExit as exc:  # a bad --tree: its one error line is printed; a status, not an exception
        return int(exc.code or 0)
    from kgreason.errors import cli_main

    return cli_main(lambda a: _main(a, tree))(argv)


if __name__ == "__main__":
    raise SystemExit(main())
