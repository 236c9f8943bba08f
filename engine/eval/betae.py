"""BetaE query pickles: safe loading, conversion to ASTs, answer recomputation.

A BetaE query file (e.g. ``NELL-betae/test-queries.pkl``) is a pickled
``collections.defaultdict(set)`` mapping a *structure tuple* such as
``(('e', ('r',)), ('e', ('r', 'n')))`` to a set of *query tuples* of the same
nesting with entity / relation ids (``-2`` marks a negation, ``(-1,)`` a union).

Pickles can run arbitrary code when loaded, so they are read only through the
project's restricted unpickler (:mod:`kge.safe_pickle`), which resolves nothing
but builtin containers and ``collections.defaultdict``; any other global
(``os.system``, ...) raises a :class:`~kgreason.errors.UserError` naming it.

BetaE's answer pickles are recomputed from the folder's triples with the
symbolic evaluator (BetaE's definition for test queries): *easy* answers are the
answers on train+valid, *hard* answers those on train+valid+test that are not
easy.  BetaE folders already contain both directions of every edge.
"""
from __future__ import annotations

import reprlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from kge.graph import load_betae
from kge.safe_pickle import safe_load
from kgreason.errors import UserError

from engine.eval.metrics import EvalQuery

__all__ = [
    "safe_load_pickle",
    "BetaEFolder",
    "read_betae_folder",
    "load_betae_queries",
    "check_betae_ids",
]


def _short_repr(obj: object) -> str:
    """A bounded repr of something read from a pickle (a few levels and items, never recursing deeply).

    An exception shows as its message, bounded the same way (its args may hold the pickled object).
    """
    r = reprlib.Repr()
    r.maxlevel, r.maxtuple, r.maxlist, r.maxset, r.maxfrozenset, r.maxdict = 6, 8, 8, 8, 8, 8
    r.maxstring, r.maxother = 60, 60
    if isinstance(obj, BaseException):  # its message (a str argument kept up to 300 characters)
        parts = [(a if len(a) <= 300 else a[:297] + "...") if isinstance(a, str) else r.repr(a) for a in obj.args]
        return "; ".join(parts) or type(obj).__name__
    return r.repr(obj)


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


def read_betae_folder(path: str | Path) -> BetaEFolder:
    """Read a BetaE folder's ``train.txt``/``valid.txt``/``test.txt`` id triples and its counts.

    The reading is :func:`kge.graph.load_betae`'s, the project's one BetaE reader
    (format checks, ``stats.txt``, relation pairs), so the counts here are the
    counts an artifact built from the same folder has.
    """
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"BetaE folder {str(path)!r} does not exist")
    kg = load_betae(path)
    return BetaEFolder(path, kg.train, kg.valid, kg.test, kg.num_entities, kg.num_relations)


def _betae_to_node(structure: tuple, query: tuple, negation: str):
    from engine.lang.structures import from_betae

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
    from engine.lang.structures import structure_of
    from engine.eval.symbolic import Graph, answers

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
            raise UserError(f"{pickle_path}: unknown query structure {_short_repr(structure)} ({_short_repr(exc)})") from None
        names_seen.append(name)
        if keep is not None and name not in keep:
            continue
        try:
            ordered = sorted(qs)
        except (TypeError, RecursionError):
            raise UserError(f"{pickle_path}: structure {name}: expected a set of query tuples, "
                            f"got {_short_repr(qs)}") from None
        for q in ordered:
            try:
                nodes.append(_betae_to_node(structure, q, negation))
            except (TypeError, ValueError, IndexError) as exc:
                raise UserError(f"{pickle_path}: structure {name}: malformed query {_short_repr(q)} ({_short_repr(exc)})") from None
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


def check_betae_ids(artifact, folder) -> float:
    """Check that the artifact's ids are the BetaE folder's ids; returns the fraction of observed triples found.

    Counts must match and (since a permutation of ids would keep the counts) at
    least 99% of the artifact's observed triples must be triples of the folder.
    """
    if artifact.num_entities != folder.num_entities or artifact.num_relations != folder.num_relations:
        raise UserError(
            f"artifact {artifact.path} has {artifact.num_entities} entities / {artifact.num_relations} relations but "
            f"BetaE folder {folder.path} has {folder.num_entities} / {folder.num_relations}: the query ids would not "
            "refer to the same entities (build the artifact from that folder)"
        )
    n, r = folder.num_entities, folder.num_relations

    def keys(t: np.ndarray) -> np.ndarray:
        return (t[:, 0] * r + t[:, 1]) * n + t[:, 2]

    obs = artifact.observed
    if len(obs) == 0:
        return 1.0
    sample = obs[np.random.default_rng(0).choice(len(obs), size=min(len(obs), 20000), replace=False)]
    known = keys(np.concatenate([folder.train, folder.valid, folder.test]))
    frac = float(np.isin(keys(sample), known).mean())
    if frac < 0.99:
        raise UserError(
            f"artifact {artifact.path}: only {100 * frac:.1f}% of its observed triples are triples of BetaE folder "
            f"{folder.path}: its entity/relation ids are not the folder's ids"
        )
    return frac
