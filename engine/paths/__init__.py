"""Relation-path search over a knowledge graph.

* :func:`dijkstra` / :func:`shortest_paths` / :class:`PathGraph`: batched Dijkstra and A*
  (optionally hop-bounded) with per-relation costs, through :func:`ops.dijkstra`
  (the C++ op ``torch.ops.kgreason.dijkstra`` or its pure-Python reference).
* :class:`PathRetriever`: KARPA retrieval (pathfinding / heuristic / beam) of relation paths that
  match a planned relation path, with semantic costs from a sentence encoder.
* CLI: ``python -m engine.paths --artifact DIR --from ENTITY --plan "r1, r2" --mode pathfinding``.
"""
from .embeddings import (
    ENCODERS,
    CachedEncoder,
    HashingEncoder,
    SentenceTransformerEncoder,
    make_encoder,
    register_encoder,
    relation_embeddings,
    relation_text,
    sequence_text,
)
from .graph import PathGraph, ShortestPaths, check_relation_costs, dijkstra, shortest_paths
from .karpa import MODES, PathRetriever, Plan, PlanStep, RelationPath, RetrievalResult, parse_plan_text

__all__ = [
    "ENCODERS",
    "MODES",
    "CachedEncoder",
    "HashingEncoder",
    "PathGraph",
    "PathRetriever",
    "Plan",
    "PlanStep",
    "RelationPath",
    "RetrievalResult",
    "SentenceTransformerEncoder",
    "ShortestPaths",
    "check_relation_costs",
    "dijkstra",
    "make_encoder",
    "parse_plan_text",
    "register_encoder",
    "relation_embeddings",
    "relation_text",
    "sequence_text",
    "shortest_paths",
]
