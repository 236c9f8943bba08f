"""BetaE-style sampling of complex queries with easy/hard answers, for any artifact.

Procedure (as in BetaE's ``create_queries.py``, with the negation rule made
explicit):

1. pick the *answer* uniformly among entities with an incoming edge in the
   full graph (observed + missing);
2. ground the structure backwards from it: a projection picks a relation
   uniformly among the answer's incoming relations, then a head uniformly
   among that relation's heads, and recurses into the head; an anchor becomes
   the entity reached; every branch of an intersection or a union is grounded
   from the same entity;
3. a *negated* branch of an intersection is grounded from a different entity
   ``t'`` drawn from the answers (on the full graph) of the intersection's
   positive branches, ``t' != answer``: the negation then provably removes
   ``t'`` (it "actually removes something");
4. answers: *easy* = answers on the observed graph, *hard* = answers on
   observed + missing that are not easy (:mod:`engine.symbolic`);
5. reject when the walk reaches an entity without incoming edges, when the
   negation removed the answer itself, when ``|easy U hard| > max_answers``,
   when there is no hard answer and one is required, or when the query was
   already drawn.  Rejection counts are reported per reason.

Sampling is deterministic for a given seed: structure ``s`` draws from
``numpy.random.default_rng([seed, crc32(s)])``, so adding a structure does not
change the queries of the others.

For an artifact built from a BetaE folder (observed = train, missing =
valid + test) this is BetaE's protocol with valid+test as the hidden part.
"""
from __future__ import annotations

import json
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from kge.errors import UserError

from .query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union, named, to_sexpr
from .structures import NEGATION_MODES, get_structure
from .symbolic import Graph, answer_sets, answers

__all__ = ["SampledQuery", "SamplerStats", "QuerySampler", "sample_queries", "write_jsonl", "REJECT_REASONS"]

REJECT_REASONS = (
    "dead end",  # the backward walk met an entity without incoming edges
    "nothing to negate",  # the positive branches have no answer besides the target
    "answer negated",  # the negated branch also contains the target
    "too many answers",
    "no hard answer",
    "duplicate",
)


@dataclass(frozen=True)
class SampledQuery:
    """A sampled query: structure name, id-resolved AST, sorted easy and hard answer ids."""

    structure: str
    node: Node
    easy: np.ndarray
    hard: np.ndarray


@dataclass
class SamplerStats:
    """Per-structure counts of accepted queries and of rejections by reason."""

    accepted: Counter = field(default_factory=Counter)
    attempts: Counter = field(default_factory=Counter)
    rejected: dict[str, Counter] = field(default_factory=dict)

    def table(self) -> str:
        cols = ["structure", "accepted", "attempts", *REJECT_REASONS]
        lines = ["  ".join(f"{c:>17}" if i else f"{c:<9}" for i, c in enumerate(cols))]
        for s in self.attempts:
            rej = self.rejected.get(s, Counter())
            vals = [s, self.accepted[s], self.attempts[s], *(rej[r] for r in REJECT_REASONS)]
            lines.append("  ".join(f"{v:>17}" if i else f"{v:<9}" for i, v in enumerate(vals)))
        return "\n".join(lines)


class _Reject(Exception):
    def __init__(self, reason: str):
        self.reason = reason


def _is_negated(node: Node) -> bool:
    return isinstance(node, (NegatedProjection, Complement))


class QuerySampler:
    """Samples queries on ``observed`` (easy answers) and ``observed + missing`` (all answers).

    ``observed``/``missing`` are ``(E, 3)`` int64 id triples over ``num_entities``
    entities and ``num_relations`` relations.
    """

    def __init__(
        self,
        observed: np.ndarray,
        missing: np.ndarray,
        num_entities: int,
        num_relations: int,
        *,
        max_answers: int = 100,
        require_hard: bool = True,
        negation: str = "qto",
    ):
        if negation not in NEGATION_MODES:
            raise UserError(f"unknown negation mode {negation!r}; expected one of {', '.join(NEGATION_MODES)}")
        if max_answers < 1:
            raise UserError(f"max_answers must be >= 1, got {max_answers}")
        self.observed = Graph(observed, num_entities, num_relations)
        self.full = Graph.from_triples(observed, missing, num_entities=num_entities, num_relations=num_relations)
        self.max_answers = int(max_answers)
        self.require_hard = bool(require_hard)
        self.negation = negation
        self.stats = SamplerStats()
        self._targets = np.flatnonzero(np.diff(self.full.in_ptr) > 0)

    # ----------------------------------------------------------------- grounding
    def _step_back(self, target: int, rng: np.random.Generator) -> tuple[int, int]:
        """A random incoming edge ``(relation, head)`` of ``target``: relation uniform, then head uniform."""
        g = self.full
        lo, hi = int(g.in_ptr[target]), int(g.in_ptr[target + 1])
        if lo == hi:
            raise _Reject("dead end")
        rels = g.in_rel[lo:hi]  # sorted
        starts = np.flatnonzero(np.r_[True, rels[1:] != rels[:-1]])
        k = int(rng.integers(len(starts)))
        a = lo + int(starts[k])
        b = lo + (int(starts[k + 1]) if k + 1 < len(starts) else hi - lo)
        return int(g.in_rel[a]), int(g.in_head[a + int(rng.integers(b - a))])

    def _ground(self, node: Node, target: int, rng: np.random.Generator) -> Node:
        """``node`` (a structure template) with anchors/relations chosen so that ``target`` answers it."""
        if isinstance(node, Anchor):
            return Anchor(target)
        if isinstance(node, Projection):
            rel, head = self._step_back(target, rng)
            return Projection(rel, self._ground(node.arg, head, rng))
        if isinstance(node, Union):
            return Union(tuple(self._ground(a, target, rng) for a in node.args))
        if isinstance(node, Intersection):
            grounded: list[Node | None] = [None if _is_negated(a) else self._ground(a, target, rng) for a in node.args]
            positive = [g for g in grounded if g is not None]
            if len(positive) < len(grounded):
                if positive:
                    pos = positive[0] if len(positive) == 1 else Intersection(tuple(positive))
                    cand = answer_sets([pos], self.full).indices
                else:  # only negated branches: any other entity can be removed
                    cand = self._targets
                cand = cand[cand != target]
                if len(cand) == 0:
                    raise _Reject("nothing to negate")
                other = int(cand[int(rng.integers(len(cand)))])
                for i, a in enumerate(node.args):
                    if grounded[i] is None:
                        grounded[i] = self._ground_negated(a, other, rng)
            return Intersection(tuple(grounded))  # type: ignore[arg-type]
        if _is_negated(node):
            # A negation outside an intersection: ground its inner query from a random entity.
            return self._ground_negated(node, int(rng.choice(self._targets)), rng)
        raise TypeError(f"cannot ground {node!r}")

    def _ground_negated(self, node: Node, member: int, rng: np.random.Generator) -> Node:
        """A negated node whose *inner* (non-negated) set contains ``member``."""
        if isinstance(node, NegatedProjection):
            inner = self._ground(Projection(node.relation, node.arg), member, rng)
            return NegatedProjection(inner.relation, inner.arg)  # type: ignore[attr-defined]
        return Complement(self._ground(node.arg, member, rng))  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        structure: str,
        count: int,
        *,
        seed: int = 0,
        max_attempts: int | None = None,
        progress: bool = False,
        chunk: int = 256,
    ) -> list[SampledQuery]:
        """``count`` distinct queries of ``structure`` (fewer, with a warning, if ``max_attempts`` run out).

        ``max_attempts`` defaults to ``200 * count + 1000`` groundings.
        """
        st = get_structure(structure)
        name = st.name
        template = st.build(list(range(st.num_anchors)), list(range(st.num_relations)), negation=self.negation)
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        limit = 200 * count + 1000 if max_attempts is None else int(max_attempts)
        rejected = self.stats.rejected.setdefault(name, Counter())
        out: list[SampledQuery] = []
        seen: set[Node] = set()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=count, desc=f"sample {name}", unit="q", file=sys.stderr)
        drawn = 0  # groundings started (the limit)
        attempts = 0  # groundings whose outcome was looked at (dead ends + evaluated candidates)
        while len(out) < count and drawn < limit:
            batch: list[tuple[int, Node]] = []
            while len(batch) < chunk and drawn < limit:
                drawn += 1
                target = int(self._targets[int(rng.integers(len(self._targets)))])
                try:
                    batch.append((target, self._ground(template, target, rng)))
                except _Reject as r:
                    attempts += 1
                    rejected[r.reason] += 1
            if not batch:
                break
            nodes = [n for _, n in batch]
            every = answer_sets(nodes, self.full)
            easy = answer_sets(nodes, self.observed)
            for row, (target, node) in enumerate(batch):
                attempts += 1
                a = every.indices[every.indptr[row] : every.indptr[row + 1]].astype(np.int64)
                e = easy.indices[easy.indptr[row] : easy.indptr[row + 1]].astype(np.int64)
                hard = np.setdiff1d(a, e, assume_unique=True)
                if not np.isin(target, a):
                    reason = "answer negated"
                elif len(np.union1d(a, e)) > self.max_answers:
                    reason = "too many answers"
                elif self.require_hard and len(hard) == 0:
                    reason = "no hard answer"
                elif node in seen:
                    reason = "duplicate"
                else:
                    reason = None
                if reason is not None:
                    rejected[reason] += 1
                    continue
                seen.add(node)
                out.append(SampledQuery(name, node, e, hard))
                if bar is not None:
                    bar.update(1)
                if len(out) >= count:
                    break  # the rest of this batch is left unused
        if bar is not None:
            bar.close()
        self.stats.attempts[name] += attempts
        self.stats.accepted[name] += len(out)
        if len(out) < count:
            print(
                f"warning: structure {name}: only {len(out)} of {count} queries after {attempts} attempts "
                f"(rejections: {dict(rejected)})",
                file=sys.stderr,
            )
        return out


def sample_queries(
    artifact,
    structures: Sequence[str],
    per_structure: int,
    *,
    seed: int = 0,
    max_answers: int = 100,
    require_hard: bool = True,
    negation: str = "qto",
    progress: bool = True,
) -> tuple[list[SampledQuery], SamplerStats]:
    """Sample ``per_structure`` queries of each structure on an :class:`~kge.artifact.Artifact`.

    Easy answers come from ``artifact.observed``, hard ones from ``artifact.missing``.
    """
    sampler = QuerySampler(
        artifact.observed,
        artifact.missing,
        artifact.num_entities,
        artifact.num_relations,
        max_answers=max_answers,
        require_hard=require_hard,
        negation=negation,
    )
    out: list[SampledQuery] = []
    for s in structures:
        out.extend(sampler.sample(s, per_structure, seed=seed, progress=progress))
    return out, sampler.stats


def write_jsonl(queries: Iterable[SampledQuery], path: str | Path, artifact=None) -> int:
    """Write queries as JSON Lines ``{"structure", "expr", "easy", "hard"}``; returns the count.

    ``expr`` uses the artifact's names when ``artifact`` is given (ids ``#k`` otherwise).
    """
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for q in queries:
            node = named(q.node, artifact) if artifact is not None else q.node
            rec = {"structure": q.structure, "expr": to_sexpr(node), "easy": q.easy.tolist(), "hard": q.hard.tolist()}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n
