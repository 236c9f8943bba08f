"""Seeded example queries that have answers, grounded in an artifact's observed graph.

Used by ``python -m engine.answer --query STRUCTURE`` when no anchors or
relations are given.  Grounding walks the structure from a random answer
entity ``y`` backwards along observed edges: a projection ``(p r q)`` at ``y``
picks an observed edge ``(x, r, y)`` and grounds ``q`` at ``x``; a negated
projection picks an anchor and relation whose edge to ``y`` is *not* observed.
Each candidate is executed and kept only if it has at least one answer.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from kge.index import TripleIndex
from kgreason.errors import UserError

from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union
from engine.lang.structures import get_structure

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

    from engine.exec.executor import Executor

__all__ = ["example_query"]


def _observed_index(artifact: "Artifact") -> TripleIndex:
    """The artifact's observed edges, indexed (grounding walks them backwards and forwards)."""
    obs = artifact.observed
    if len(obs) == 0:
        raise UserError("the artifact has no observed edges to ground an example query in; give --anchors/--relations or --expr")
    return TripleIndex(obs, artifact.num_entities, artifact.num_relations, what="observed triples")


def _ground(node: Node, y: int, g: TripleIndex, rng: random.Random) -> Node | None:
    # Edges are listed in the artifact's row order (input_order): the seeded picks, and so
    # the examples `python -m engine.answer --query S` shows, do not depend on the index layout.
    if isinstance(node, Anchor):
        return Anchor(y)
    if isinstance(node, Projection):
        cands = g.in_edges(y, input_order=True)
        if len(cands) == 0:
            return None
        h, r, _ = cands[rng.randrange(len(cands))].tolist()
        arg = _ground(node.arg, h, g, rng)
        return None if arg is None else Projection(r, arg)
    if isinstance(node, NegatedProjection):
        for _ in range(20):
            x = rng.randrange(g.num_entities)
            out = g.out_edges(x, input_order=True)
            if len(out) == 0:
                continue
            r = int(out[rng.randrange(len(out)), 1])
            if g.has_edge(x, r, y):
                continue
            arg = _ground(node.arg, x, g, rng)
            if arg is not None:
                return NegatedProjection(r, arg)
        return None
    if isinstance(node, (Intersection, Union)):
        args = []
        for a in node.args:
            ga = _ground(a, y, g, rng)
            if ga is None:
                return None
            args.append(ga)
        return type(node)(tuple(args))
    if isinstance(node, Complement):
        arg = _ground(node.arg, rng.randrange(g.num_entities), g, rng)
        return None if arg is None else Complement(arg)
    raise TypeError(f"not a query node: {node!r}")


def _without_negation(node: Node) -> Node | None:
    """The query's positive part: negated branches of intersections dropped (None if nothing is left)."""
    if isinstance(node, (NegatedProjection, Complement)):
        return None
    if isinstance(node, Anchor):
        return node
    if isinstance(node, Projection):
        arg = _without_negation(node.arg)
        return None if arg is None else Projection(node.relation, arg)
    args = [a for a in (_without_negation(c) for c in node.args) if a is not None]
    if not args:
        return None
    if len(args) == 1:
        return args[0]
    return type(node)(tuple(args))


def example_query(artifact: "Artifact", structure: str, *, seed: int = 0, negation: str = "qto",
                  executor: "Executor | None" = None, tries: int = 200, k: int = 10) -> Node:
    """A query of ``structure`` (with entity/relation ids) that has at least one answer on ``artifact``.

    For structures with a negation, a query whose negation changes the top-``k``
    (it lowers an entity the positive part alone would return) is preferred, so
    the example shows the negation at work; otherwise the first query with answers.
    """
    s = get_structure(structure)
    template = s.build(list(range(s.num_anchors)), list(range(s.num_relations)), negation=negation)
    g = _observed_index(artifact)
    rng = random.Random(f"{structure}/{negation}/{seed}")
    if executor is None:
        from engine.exec.executor import Executor

        executor = Executor(artifact)
    # Answer entities with in-edges are the only ones a grounding can end at.
    targets = np.unique(g.triples[:, 2])
    fallback: Node | None = None
    for _ in range(tries):
        y = int(targets[rng.randrange(len(targets))])
        q = _ground(template, y, g, rng)
        if q is None:
            continue
        full = executor.scores([q])[0]
        if not bool((full > 0).any()):
            continue
        if not s.has_negation:
            return q
        fallback = fallback or q
        pos = _without_negation(q)
        if pos is None:
            continue
        pos_scores = executor.scores([pos])[0]
        top = torch.sort(pos_scores, descending=True, stable=True).indices[:k]
        top = top[pos_scores[top] > 0]
        if bool((full[top] < pos_scores[top]).any()):
            return q
        if _ >= tries // 4 and fallback is not None:
            break
    if fallback is not None:
        return fallback
    raise UserError(f"found no {structure} query with answers on this knowledge graph after {tries} tries (seed {seed})")
