"""Query engine: query language, batched executor with explanations, evaluation, sampling, path search.

Public API (imported lazily, so ``import engine.lang.query`` stays light)::

    from engine import Engine, parse, to_sexpr, STRUCTURES
    eng = Engine.load("artifacts/umls")
    for res in eng.answer("(p affects #3)", k=5):
        print(res.query, [(a.entity, a.score, a.provenance) for a in res.answers], res.trace)

Per-node hooks (``Executor(..., hooks=[...])``, ``eng.add_hook``), the trace and
provenance: ``engine.exec.hooks``, ``engine.exec.trace``, docs/executor.md.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "engine.exec.api",
    "to_node": "engine.exec.api",
    "Executor": "engine.exec.executor",
    "QueryResult": "engine.exec.executor",
    "Answer": "engine.exec.executor",
    "Explanation": "engine.exec.executor",
    "NodeContext": "engine.exec.hooks",
    "NodeValue": "engine.exec.hooks",
    "Evidence": "engine.exec.hooks",
    "merge_scores": "engine.exec.hooks",
    "Trace": "engine.exec.trace",
    "NodeTrace": "engine.exec.trace",
    "Node": "engine.lang.query",
    "Anchor": "engine.lang.query",
    "Projection": "engine.lang.query",
    "NegatedProjection": "engine.lang.query",
    "Intersection": "engine.lang.query",
    "Union": "engine.lang.query",
    "Complement": "engine.lang.query",
    "parse": "engine.lang.query",
    "to_sexpr": "engine.lang.query",
    "resolve": "engine.lang.query",
    "describe": "engine.lang.query",
    "shape_key": "engine.lang.query",
    "STRUCTURES": "engine.lang.structures",
    "Structure": "engine.lang.structures",
    "from_betae": "engine.lang.structures",
    "structure_of": "engine.lang.structures",
    "default_artifact": "engine.exec.defaults",
    "AskSettings": "engine.exec.ask",
    "AskResult": "engine.exec.ask",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
