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
   observed + missing that are not easy (:mod:`engine.eval.symbolic`);
5. reject when the walk reaches an entity without incoming edges, when the
   negation removed the answer itself, when ``|easy U hard| > max_answers``,
   when there is no hard answer and one is required, or when the query was
   already drawn.  Rejection counts are reported per reason.

Sampling is deterministic for a given seed: structure ``s`` draws from
``numpy.random.default_rng([seed, crc32(s)])``, so adding a structure does not
change the queries of the others.

When to stop: a structure has only so many distinct queries that pass the
rules (on UMLS, a few thousand 1p queries).  A draw that repeats an accepted
query (or one already rejected: its verdict is cached, not recomputed) is a
failure like any rejection.  The sampler stops a structure early, with what it
has, once ``patience`` consecutive draws produced no new query, where
``patience = max(min_patience, 20 x the draws per accepted query so far)``
(``min_patience`` alone before the first acceptance): with the acceptance rate
seen so far, 20 times its mean wait passes without success with probability
about e^-20, so stopping means the remaining queries are (nearly) exhausted.
``max_attempts`` (default ``200 * count + 1000``) bounds the draws regardless.
Cost: a request larger than a structure's supply samples the whole supply, and
the draws grow with it (coupon collecting: near exhaustion most draws repeat a
known query).  On the 16-entity fuzzing KG ``--per-structure 100000`` finds
~28,000 distinct queries over the 14 structures in ~800,000 draws: 70-140 s on
2 cores (~0.15 ms a draw, ~5 ms an accepted query), which is work, not a hang.
:attr:`SamplerStats.stopped` says why a structure got fewer than asked.

For an artifact built from a BetaE folder (observed = train, missing =
valid + test) this is BetaE's protocol with valid+test as the hidden part.
"""
from __future__ import annotations

import math
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from kgreason.errors import UserError
from kgreason.files import open_output
from kgreason.text import json_line

from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Node, Projection, Union, named, to_sexpr
from engine.lang.structures import check_negation, get_structure
from engine.eval.symbolic import Graph, answer_sets

__all__ = ["SampledQuery", "SamplerStats", "QuerySampler", "sample_queries", "write_jsonl", "query_record",
           "REJECT_REASONS", "DEFAULT_MIN_PATIENCE"]

#: Consecutive draws without a new query after which a structure counts as exhausted (at least).
DEFAULT_MIN_PATIENCE = 2000
#: Patience in units of the mean number of draws per accepted query.
PATIENCE_FACTOR = 20

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
    """Per-structure counts of accepted queries and of rejections by reason.

    ``requested[s]`` is how many queries of ``s`` were asked for; ``stopped[s]``
    (only for a structure that got fewer) says why it stopped early.
    """

    accepted: Counter = field(default_factory=Counter)
    attempts: Counter = field(default_factory=Counter)
    rejected: dict[str, Counter] = field(default_factory=dict)
    requested: Counter = field(default_factory=Counter)
    stopped: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        cols = ["structure", "accepted", "attempts", *REJECT_REASONS]
        lines = ["  ".join(f"{c:>17}" if i else f"{c:<9}" for i, c in enumerate(cols))]
        for s in self.attempts:
            rej = self.rejected.get(s, Counter())
            vals = [s, self.accepted[s], self.attempts[s], *(rej[r] for r in REJECT_REASONS)]
            lines.append("  ".join(f"{v:>17}" if i else f"{v:<9}" for i, v in enumerate(vals)))
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """One line per structure that stopped short: how many it got of how many asked, and why."""
        return [f"note: structure {s}: {self.accepted[s]:,} of {self.requested[s]:,} queries ({why})"
                for s, why in self.stopped.items()]


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
        check_negation(negation)
        if max_answers < 1:
            raise UserError(f"max_answers must be >= 1, got {max_answers}")
        self.observed = Graph(observed, num_entities, num_relations)
        self.full = Graph.from_triples(observed, missing, num_entities=num_entities, num_relations=num_relations)
        self.max_answers = int(max_answers)
        self.require_hard = bool(require_hard)
        self.negation = negation
        self.stats = SamplerStats()
        self._targets = np.flatnonzero(np.diff(self.full.in_ptr) > 0)
        # Answers (full graph) of the positive branches met while grounding negations: the same
        # branches recur across draws, and evaluating one alone costs ~1 ms (most of a draw's time).
        self._positive_answers: dict[Node, np.ndarray] = {}
        self._groups: tuple[np.ndarray, np.ndarray] | None = None

    # ----------------------------------------------------------------- grounding
    def _relation_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Runs of equal relation within each entity's in-edges, computed once per sampler.

        Returns ``(group_ptr, group_start)``: the in-edge groups of entity ``t`` are
        ``group_ptr[t]:group_ptr[t+1]`` and group ``g`` spans in-edges
        ``group_start[g]:group_start[g+1]`` (one relation each).
        """
        g = self.full
        in_ptr, in_rel = np.asarray(g.in_ptr), np.asarray(g.in_rel)
        m = len(in_rel)
        first = np.ones(m, dtype=bool)
        first[1:] = in_rel[1:] != in_rel[:-1]
        first[in_ptr[:-1][np.diff(in_ptr) > 0]] = True  # a new entity starts a new group
        starts = np.flatnonzero(first)
        return np.searchsorted(starts, in_ptr), np.append(starts, m)

    def _step_back(self, target: int, rng: np.random.Generator) -> tuple[int, int]:
        """A random incoming edge ``(relation, head)`` of ``target``: relation uniform, then head uniform."""
        if self._groups is None:
            self._groups = self._relation_groups()
        group_ptr, group_start = self._groups
        g0, g1 = int(group_ptr[target]), int(group_ptr[target + 1])
        if g0 == g1:
            raise _Reject("dead end")
        k = g0 + int(rng.integers(g1 - g0))
        a, b = int(group_start[k]), int(group_start[k + 1])
        return int(self.full.in_rel[a]), int(self.full.in_head[a + int(rng.integers(b - a))])

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
                    cand = self._positive_answers.get(pos)
                    if cand is None:
                        if len(self._positive_answers) >= 200_000:  # bound the memory of long runs
                            self._positive_answers.clear()
                        cand = self._positive_answers[pos] = answer_sets([pos], self.full).indices
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
        min_patience: int = DEFAULT_MIN_PATIENCE,
        progress: bool = False,
        chunk: int = 256,
    ) -> list[SampledQuery]:
        """``count`` distinct queries of ``structure``, or fewer when it is exhausted (see the module docstring)."""
        return list(self.iter_sample(structure, count, seed=seed, max_attempts=max_attempts,
                                     min_patience=min_patience, progress=progress, chunk=chunk))

    def iter_sample(
        self,
        structure: str,
        count: int,
        *,
        seed: int = 0,
        max_attempts: int | None = None,
        min_patience: int = DEFAULT_MIN_PATIENCE,
        progress: bool = False,
        chunk: int = 256,
    ) -> Iterator[SampledQuery]:
        """Yield up to ``count`` distinct queries of ``structure`` as they are accepted.

        Stops early when ``min_patience``/the adaptive patience or
        ``max_attempts`` (default ``200 * count + 1000`` draws) runs out, and
        records why in ``self.stats.stopped``.  New candidates are evaluated in
        batches of at most ``chunk``; a candidate drawn again reuses its verdict.
        """
        if count < 1:
            raise UserError(f"count must be >= 1, got {count}")
        if min_patience < 1:
            raise UserError(f"min_patience must be >= 1, got {min_patience}")
        st = get_structure(structure)
        name = st.name
        template = st.build(list(range(st.num_anchors)), list(range(st.num_relations)), negation=self.negation)
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        limit = 200 * count + 1000 if max_attempts is None else int(max_attempts)
        rejected = self.stats.rejected.setdefault(name, Counter())
        self.stats.requested[name] += count
        seen: set[Node] = set()  # accepted
        verdict: dict[Node, str] = {}  # rejected candidates and why (answers are deterministic)
        pending: list[tuple[int, int, Node]] = []  # (draw index, target, node) awaiting evaluation
        pending_nodes: set[Node] = set()
        repeats: Counter = Counter()  # extra draws of a pending node before it was evaluated
        bar = None
        if progress:
            from kgreason.progress import progress_bar

            bar = progress_bar(total=count, desc=f"sample {name}", unit="q", file=sys.stderr)
        accepted = 0
        drawn = 0
        last_new = 0  # draw index of the latest accepted query
        evaluated = 0  # distinct candidates evaluated

        def batch_size() -> int:
            # About 1.5x the candidates still needed at the acceptance rate seen so far: evaluating a
            # full chunk for the last few queries of a small request would mostly be wasted work.
            rate = accepted / evaluated if evaluated else 0.5
            need = (count - accepted) / max(rate, 1.0 / chunk)
            return max(1, min(chunk, math.ceil(1.5 * need) + 8))

        def patience() -> int:
            if accepted == 0:
                return min_patience
            return max(min_patience, math.ceil(PATIENCE_FACTOR * last_new / accepted))

        try:
            while accepted < count:
                out_of_draws = drawn >= limit
                stalled = drawn - last_new >= patience()
                if not (out_of_draws or stalled) and len(pending) < batch_size():
                    drawn += 1
                    target = int(self._targets[int(rng.integers(len(self._targets)))])
                    try:
                        node = self._ground(template, target, rng)
                    except _Reject as r:
                        rejected[r.reason] += 1
                        continue
                    if node in seen:
                        rejected["duplicate"] += 1
                    elif node in verdict:
                        rejected[verdict[node]] += 1
                    elif node in pending_nodes:
                        repeats[node] += 1
                    else:
                        pending.append((drawn, target, node))
                        pending_nodes.add(node)
                    continue
                if not pending:
                    if out_of_draws:
                        self.stats.stopped[name] = f"attempt limit: {drawn:,} draws (max_attempts)"
                    else:
                        self.stats.stopped[name] = (f"exhausted: no new query in the last {drawn - last_new:,} "
                                                    f"draws, {drawn:,} draws in all")
                    break
                batch, pending = pending, []
                pending_nodes.clear()
                evaluated += len(batch)
                for index, node, reason, easy, hard in self._evaluate(batch):
                    if reason is not None:
                        if len(verdict) >= 1_000_000:  # bound memory on huge KGs (a verdict is only a shortcut)
                            verdict.clear()
                        verdict[node] = reason
                        rejected[reason] += 1 + repeats.pop(node, 0)
                        continue
                    if accepted >= count:
                        continue  # drawn but not needed: the request is complete
                    seen.add(node)
                    rejected["duplicate"] += repeats.pop(node, 0)
                    accepted += 1
                    last_new = max(last_new, index)
                    if bar is not None:
                        bar.update(1)
                    yield SampledQuery(name, node, easy, hard)
        finally:
            if bar is not None:
                bar.close()
            self.stats.attempts[name] += drawn
            self.stats.accepted[name] += accepted

    def _evaluate(self, batch: list[tuple[int, int, Node]]):
        """``(draw index, node, reject reason or None, easy, hard)`` for each candidate of ``batch``, in order."""
        nodes = [n for _, _, n in batch]
        every = answer_sets(nodes, self.full)
        easy_sets = answer_sets(nodes, self.observed)
        for row, (index, target, node) in enumerate(batch):
            a = every.indices[every.indptr[row] : every.indptr[row + 1]].astype(np.int64)
            e = easy_sets.indices[easy_sets.indptr[row] : easy_sets.indptr[row + 1]].astype(np.int64)
            hard = np.setdiff1d(a, e, assume_unique=True)
            if not np.isin(target, a):
                reason = "answer negated"
            elif len(np.union1d(a, e)) > self.max_answers:
                reason = "too many answers"
            elif self.require_hard and len(hard) == 0:
                reason = "no hard answer"
            else:
                reason = None
            yield index, node, reason, e, hard

    def iter_many(self, structures: Sequence[str], per_structure: int, *, seed: int = 0, progress: bool = False,
                  min_patience: int = DEFAULT_MIN_PATIENCE) -> Iterator[SampledQuery]:
        """:meth:`iter_sample` over several structures, one after the other."""
        for s in structures:
            yield from self.iter_sample(s, per_structure, seed=seed, progress=progress, min_patience=min_patience)


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
    out = list(sampler.iter_many(structures, per_structure, seed=seed, progress=progress))
    return out, sampler.stats


def query_record(q: SampledQuery, artifact=None) -> str:
    """One JSON line (with its newline) ``{"structure", "expr", "easy", "hard"}`` for a sampled query.

    ``expr`` uses the artifact's names when ``artifact`` is given (ids ``#k`` otherwise).
    """
    node = named(q.node, artifact) if artifact is not None else q.node
    rec = {"structure": q.structure, "expr": to_sexpr(node), "easy": q.easy.tolist(), "hard": q.hard.tolist()}
    return json_line(rec) + "\n"  # KG names: no raw control, bidi or separator character (kgreason.text)


def write_jsonl(queries: Iterable[SampledQuery], path: str | Path, artifact=None) -> int:
    """Write queries as JSON Lines (see :func:`query_record`), atomically; returns the count."""
    n = 0
    with open_output(path, what="jsonl output") as f:
        for q in queries:
            f.write(query_record(q, artifact))
            n += 1
    return n
