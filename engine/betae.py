"""BetaE query pickles: safe loading, conversion to ASTs, answer recomputation.

A BetaE query file (e.g. ``NELL-betae/test-queries.pkl``) is a pickled
``collections.defaultdict(set)`` mapping a *structure tuple* such as
``(('e', ('r',)), ('e', ('r', 'n')))`` to a set of *query tuples* of the same
nesting with entity / relation ids (``-2`` marks a negation, ``(-1,)`` a union).

Pickles can run arbitrary code when loaded, so they are read only through the
project's restricted unpickler (:mod:`kge.safe_pickle`), which resolves nothing
but builtin containers and ``collections.defaultdict``; any other global
(``os.system``, ...) raises a :class:`~kge.errors.UserError` naming it.

BetaE's answer pickles are recomputed from the folder's triples with the
symbolic evaluator (BetaE's definition for test queries): *easy* answers are the
answers on train+valid, *hard* answers those on train+valid+test that are not
easy.  BetaE folders already contain both directions of every edge.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from kge.errors import UserError
from kge.safe_pickle import safe_load

from .evaluation import EvalQuery

__all__ = [
    "safe_load_pickle",
    "BetaEFolder",
    "read_betae_folder",
    "load_betae_queries",
]


def safe_load_pickle(path: str | Path) -> object:
    """Load a pickle allowing only builtin containers/scalars and ``collections.defaultdict``.

    Delegates to :func:`kge.safe_pickle.safe_load` (the project's one restricted
    unpickler); anything else in the file raises :class:`UserError` naming the global.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"pickle file {str(p)!r} does not exist")
    return safe_load(p)


@dataclass
class BetaEFolder:
    """Triples of a BetaE dataset folder (``(E, 3)`` int64 each) and its sizes."""

    path: Path
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    num_entities: int
    num_relations: int


def _read_ids(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"BetaE folder: missing file {str(path)!r}")
    if path.stat().st_size == 0:
        return np.zeros((0, 3), np.int64)
    try:
        arr = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise UserError(f"{path}: malformed id triples ({exc})") from None
    if arr.shape[1] != 3:
        raise UserError(f"{path}: expected 3 columns, got {arr.shape[1]}")
    return arr


def read_betae_folder(path: str | Path) -> BetaEFolder:
    """Read ``train.txt``/``valid.txt``/``test.txt`` and the counts (``stats.txt`` when present)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"BetaE folder {str(path)!r} does not exist")
    train, valid, test = (_read_ids(path / f"{s}.txt") for s in ("train", "valid", "test"))
    allt = np.concatenate([train, valid, test])
    n = int(max(allt[:, [0, 2]].max(), -1)) + 1 if len(allt) else 0
    r = int(max(allt[:, 1].max(), -1)) + 1 if len(allt) else 0
    stats = path / "stats.txt"
    if stats.is_file():
        for lineno, line in enumerate(stats.read_text().splitlines(), 1):
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("numentity", "numrelations"):
                try:
                    v = int(value.strip())
                except ValueError:
                    raise UserError(f"{stats}:{lineno}: expected an integer after {key!r}") from None
                if key == "numentity":
                    n = max(n, v)
                else:
                    r = max(r, v)
    return BetaEFolder(path, train, valid, test, n, r)


def _betae_to_node(structure: tuple, query: tuple, negation: str):
    from .structures import from_betae

    return from_betae(structure, query, negation=negation)


def load_betae_queries(
    pickle_path: str | Path,
    folder: str | Path | BetaEFolder,
    *,
    structures: Iterable[str] | None = None,
    negation: str = "qto",
    batch_size: int = 2048,
    progress: bool = True,
    timings: dict | None = None,
) -> list[EvalQuery]:
    """Queries of a BetaE pickle as :class:`EvalQuery` with easy/hard answers recomputed.

    ``structures`` keeps only those structure names (all by default); a
    structure tuple this package has no name for raises :class:`UserError`.
    ``timings`` (when given) receives ``load_s``, ``convert_s``, ``answers_s``.
    Queries keep the pickle's structure order, each structure sorted by its query tuple.
    """
    from .structures import structure_of
    from .symbolic import Graph, answers

    t0 = time.perf_counter()
    data = safe_load_pickle(pickle_path)
    if not isinstance(data, dict):
        raise UserError(f"{pickle_path}: expected a dict from structure tuples to query sets, got {type(data).__name__}")
    t1 = time.perf_counter()
    fold = folder if isinstance(folder, BetaEFolder) else read_betae_folder(folder)
    keep = set(structures) if structures else None
    names_seen = []
    nodes, names = [], []
    for structure, qs in data.items():
        try:
            name = structure_of(structure)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{pickle_path}: unknown query structure {structure!r} ({exc})") from None
        names_seen.append(name)
        if keep is not None and name not in keep:
            continue
        for q in sorted(qs):
            try:
                nodes.append(_betae_to_node(structure, q, negation))
            except (TypeError, ValueError, IndexError) as exc:
                raise UserError(f"{pickle_path}: structure {name}: malformed query {q!r} ({exc})") from None
            names.append(name)
    if keep is not None:
        unknown = sorted(keep - set(names_seen))
        if unknown:
            raise UserError(f"{pickle_path}: no queries of structure(s) {', '.join(unknown)}; it has {', '.join(names_seen)}")
    t2 = time.perf_counter()
    observed = Graph.from_triples(fold.train, fold.valid, num_entities=fold.num_entities, num_relations=fold.num_relations)
    full = Graph.from_triples(fold.train, fold.valid, fold.test, num_entities=fold.num_entities, num_relations=fold.num_relations)
    try:
        easy = answers(nodes, observed, batch_size=batch_size, progress=progress, desc="easy answers")
        every = answers(nodes, full, batch_size=batch_size, progress=progress, desc="all answers")
    except ValueError as exc:
        raise UserError(f"{pickle_path}: query ids do not fit folder {fold.path} ({exc})") from None
    t3 = time.perf_counter()
    if timings is not None:
        timings.update(load_s=t1 - t0, convert_s=t2 - t1, answers_s=t3 - t2)
    return [
        EvalQuery(name, node, e, np.setdiff1d(a, e, assume_unique=True))
        for name, node, e, a in zip(names, nodes, easy, every)
    ]


def summarize(queries: list[EvalQuery]) -> list[dict]:
    """Per structure: number of queries and mean/max numbers of easy and hard answers."""
    by: dict[str, list[EvalQuery]] = {}
    for q in queries:
        by.setdefault(q.structure, []).append(q)
    rows = []
    for name, group in by.items():
        easy = np.array([len(q.easy) for q in group])
        hard = np.array([len(q.hard) for q in group])
        rows.append({
            "structure": name, "queries": len(group),
            "mean_easy": float(easy.mean()), "mean_hard": float(hard.mean()), "max_hard": int(hard.max()),
            "without_hard": int((hard == 0).sum()),
        })
    return rows


def main(argv=None) -> int:
    """CLI: ``python -m engine.betae --queries PKL --folder DIR [--json OUT]``: load, recompute answers, summarise."""
    import argparse
    import json

    from kge.errors import cli_main

    @cli_main
    def run(argv):
        p = argparse.ArgumentParser(prog="python -m engine.betae",
                                    description="Load a BetaE query pickle, recompute easy/hard answers, print counts and timings.")
        p.add_argument("--queries", required=True, type=Path, help="BetaE query pickle (e.g. test-queries.pkl)")
        p.add_argument("--folder", required=True, type=Path, help="BetaE folder with train/valid/test.txt")
        p.add_argument("--negation", choices=("qto", "complement"), default="qto")
        p.add_argument("--json", type=Path, help="write the summary as JSON here")
        p.add_argument("--no-progress", action="store_true")
        a = p.parse_args(argv)
        t0 = time.perf_counter()
        folder = read_betae_folder(a.folder)
        t_folder = time.perf_counter() - t0
        timings: dict = {"read_folder_s": t_folder}
        qs = load_betae_queries(a.queries, folder, negation=a.negation, progress=not a.no_progress, timings=timings)
        timings["total_s"] = time.perf_counter() - t0
        rows = summarize(qs)
        print("| structure | queries | mean easy | mean hard | max hard | without hard |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['structure']} | {r['queries']} | {r['mean_easy']:.1f} | {r['mean_hard']:.1f} | "
                  f"{r['max_hard']} | {r['without_hard']} |")
        print(f"{len(qs)} queries; entities {folder.num_entities}, relations {folder.num_relations}; " +
              ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
        if a.json is not None:
            a.json.write_text(json.dumps({"queries": str(a.queries), "folder": str(a.folder),
                                          "num_entities": folder.num_entities, "num_relations": folder.num_relations,
                                          "structures": rows, "timings_s": timings}, indent=2) + "\n")
        return 0

    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
