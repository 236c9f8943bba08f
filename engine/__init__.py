"""Query engine: query language, batched executor with explanations, evaluation, sampling, path search.

Public API (imported lazily, so ``import engine.query`` stays light)::

    from engine import Engine, parse, to_sexpr, STRUCTURES
    eng = Engine.load("artifacts/umls")
    for res in eng.answer("(p affects #3)", k=5):
        print(res.query, [(a.entity, a.score) for a in res.answers])
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "api",
    "to_node": "api",
    "Executor": "executor",
    "QueryResult": "executor",
    "Answer": "executor",
    "Explanation": "executor",
    "Node": "query",
    "Anchor": "query",
    "Projection": "query",
    "NegatedProjection": "query",
    "Intersection": "query",
    "Union": "query",
    "Complement": "query",
    "parse": "query",
    "to_sexpr": "query",
    "resolve": "query",
    "describe": "query",
    "shape_key": "query",
    "STRUCTURES": "structures",
    "Structure": "structures",
    "from_betae": "structures",
    "structure_of": "structures",
    "default_artifact": "defaults",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
