"""KARPA relation-path retrieval: pathfinding (P), heuristic (H) and beam (B) modes.

Given topic entities and a planned relation path ``r̂_1 … r̂_L`` (relation names
of the KG or free-text phrases), each mode returns the top-K distinct relation
paths that exist in the KG from a topic entity, with their cost, their tail
entities and a few entity-level reasoning paths behind them.

Step cost (P and B): ``c_s(r) = 1 − cos(e_r, e_{r̂_s})`` over the encoder's
embeddings of readable relation names; a path of exactly ``L`` hops costs the
mean of its step costs.

* **pathfinding** (KARPA-P): Dijkstra on the layered graph whose states are
  (entity, step).  The step cost depends only on the relation, so every
  entity-level path that follows the same relation prefix has the same cost:
  the search runs on states (relation prefix, step) carrying the *set* of
  entities the prefix reaches — the layered graph with entities that share a
  prefix merged.  States are popped in cost order (A* with the admissible bound
  ``Σ_{s' > step} min_r c_{s'}(r)``); the first K complete states popped are the
  K cheapest distinct relation paths, exactly.
* **heuristic** (KARPA-H): enumerate every distinct relation sequence of 1..L_max
  hops reachable from the topic (breadth first, capped at ``max_sequences``;
  ``truncated`` reports a hit cap), embed each sequence's text once (cached
  across queries) and rank by ``1 − cos(embed(path text), embed(plan text))``.
* **beam** (KARPA-B): beam search of width W over relation prefixes by summed
  step cost; the K best of the final beam.

Ties are ordered by cost, then by relation ids lexicographically.  Costs of the
heuristic mode are rounded to 12 decimals so that equal texts tie exactly.
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kge.artifact import INVERSE_SUFFIX
from kgreason.errors import UserError, unknown_name

from .embeddings import CachedEncoder, Encoder, make_encoder, relation_text
from .embeddings import relation_embeddings as compute_relation_embeddings
from .graph import PathGraph

__all__ = ["MODES", "PlanStep", "Plan", "RelationPath", "RetrievalResult", "PathRetriever", "parse_plan_text"]

MODES = ("pathfinding", "heuristic", "beam")
_PLAN_SEPARATORS = re.compile(r"\s*(?:,|;|->|→|=>)\s*")
_ROUND = 12


@dataclass(frozen=True)
class PlanStep:
    """One planned hop: the user's phrase, the text that is embedded, and the resolved relation id (or None)."""

    raw: str
    text: str
    relation: int | None


@dataclass(frozen=True)
class Plan:
    """A planned relation path; ``text`` (the steps' texts joined by ``", "``) is what heuristic mode embeds."""

    steps: tuple[PlanStep, ...]

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def text(self) -> str:
        return ", ".join(s.text for s in self.steps)


@dataclass(frozen=True)
class RelationPath:
    """A retrieved relation path.

    Attributes:
        relations: relation ids r_1 … r_l.
        names: their names.
        cost: mode-specific cost (lower is better).
        tails: (T,) int64 sorted ids of every entity the path reaches from the topic.
        entity_paths: up to ``max_entity_paths`` entity-level paths, each a tuple of
            ``(head, relation, tail)`` edges (for the smallest tail ids).
    """

    relations: tuple[int, ...]
    names: tuple[str, ...]
    cost: float
    tails: np.ndarray
    entity_paths: tuple[tuple[tuple[int, int, int], ...], ...]


@dataclass(frozen=True)
class RetrievalResult:
    """Top-K relation paths for one topic entity (empty ``paths`` when nothing is reachable)."""

    topic: int
    mode: str
    plan: Plan
    paths: tuple[RelationPath, ...]
    candidates: int  # relation prefixes/sequences examined
    truncated: bool  # heuristic mode: the enumeration cap was hit

    def to_dict(self, graph: PathGraph, max_tails: int = 20) -> dict[str, Any]:
        return {
            "topic": graph.entity_name(self.topic),
            "topic_id": self.topic,
            "mode": self.mode,
            "plan": [s.raw for s in self.plan.steps],
            "candidates": self.candidates,
            "truncated": self.truncated,
            "paths": [
                {
                    "relations": list(p.names),
                    "relation_ids": list(p.relations),
                    "cost": p.cost,
                    "num_tails": int(len(p.tails)),
                    "tails": [graph.entity_name(int(t)) for t in p.tails[:max_tails]],
                    "entity_paths": [format_entity_path(graph, ep) for ep in p.entity_paths],
                }
                for p in self.paths
            ],
        }

    def format(self, graph: PathGraph) -> str:
        lines = [f"topic: {graph.entity_name(self.topic)}   plan: {self.plan.text}   mode: {self.mode}"]
        if self.truncated:
            lines.append(f"  (enumeration capped at {self.candidates} relation sequences)")
        if not self.paths:
            lines.append("  no relation path found")
        for i, p in enumerate(self.paths, 1):
            lines.append(f"{i:3d}. cost {p.cost:.4f}  {' -> '.join(p.names)}   ({len(p.tails)} tails)")
            for ep in p.entity_paths:
                lines.append(f"       {format_entity_path(graph, ep)}")
        return "\n".join(lines)


def format_entity_path(graph: PathGraph, edges: Sequence[tuple[int, int, int]]) -> str:
    """``Tom Hanks —r1→ Cast Away —r2→ Robert Zemeckis``."""
    if not edges:
        return ""
    parts = [graph.entity_name(edges[0][0])]
    for _, r, t in edges:
        parts.append(f"—{graph.relation_name(r)}→ {graph.entity_name(t)}")
    return " ".join(parts)


def parse_plan_text(plan: str) -> list[str]:
    """Split a plan string on ``,`` ``;`` ``->`` ``→`` ``=>`` into step phrases."""
    return [p.strip() for p in _PLAN_SEPARATORS.split(plan) if p.strip()]


def _segments(name: str) -> tuple[str, bool]:
    inverse = name.endswith(INVERSE_SUFFIX)
    base = name[: -len(INVERSE_SUFFIX)] if inverse else name
    return "/".join(s for s in re.split(r"[/.]", base.strip()) if s), inverse


class PathRetriever:
    """KARPA retrieval over one KG (see the module docstring).

    Args:
        graph: the KG multigraph with relation and entity names.
        encoder: registry name (:func:`engine.paths.embeddings.make_encoder`) or an encoder.
        encoder_kwargs: keyword arguments of the encoder factory.
        artifact: a saved artifact to cache the relation embeddings in.
        relation_embeddings: (R, d) precomputed unit-norm relation embeddings (skips the encoder).
        max_sequences: heuristic mode's cap on enumerated relation sequences per topic (default 20,000).
        max_entity_paths: entity-level paths kept per relation path (default 3).
    """

    def __init__(
        self,
        graph: PathGraph,
        *,
        encoder: "str | Encoder | None" = "minilm",
        encoder_kwargs: Mapping[str, Any] | None = None,
        artifact=None,
        relation_embeddings: np.ndarray | None = None,
        max_sequences: int = 20_000,
        max_entity_paths: int = 3,
    ) -> None:
        if graph.relation_names is None:
            raise ValueError("PathRetriever needs a graph with relation names")
        if max_sequences < 1:
            raise UserError(f"max_sequences must be >= 1, got {max_sequences}")
        self.graph = graph
        self.encoder = CachedEncoder(make_encoder(encoder, encoder_kwargs))
        self.max_sequences = int(max_sequences)
        self.max_entity_paths = int(max_entity_paths)
        if relation_embeddings is None:
            relation_embeddings = compute_relation_embeddings(graph.relation_names, self.encoder.encoder, artifact)
        emb = np.asarray(relation_embeddings, dtype=np.float64)
        if emb.ndim != 2 or emb.shape[0] != graph.num_relations:
            raise ValueError(f"relation_embeddings must be (R={graph.num_relations}, d), got {emb.shape}")
        self.relation_emb = emb
        self._relation_index = {n: i for i, n in enumerate(graph.relation_names)}
        self._entity_index = (
            {n: i for i, n in enumerate(graph.entity_names)} if graph.entity_names is not None else None
        )
        suffix: dict[str, set[int]] = {}
        for i, name in enumerate(graph.relation_names):
            segs, inv = _segments(name)
            parts = segs.split("/")
            for j in range(len(parts)):
                suffix.setdefault("/".join(parts[j:]) + (INVERSE_SUFFIX if inv else ""), set()).add(i)
        self._suffix = suffix
        self._seq_text: dict[tuple[int, ...], str] = {}

    @classmethod
    def from_artifact(cls, artifact, **kwargs: Any) -> "PathRetriever":
        """Retriever over an artifact's observed triples; relation embeddings cached in its folder."""
        return cls(PathGraph.from_artifact(artifact), artifact=artifact, **kwargs)

    # ------------------------------------------------------------------ names
    def entity_id(self, name: "str | int", where: str = "") -> int:
        """Entity id from a name (or an id)."""
        n = self.graph.num_entities
        if isinstance(name, (int, np.integer)):
            if not 0 <= int(name) < n:
                raise UserError(f"{where + ': ' if where else ''}entity id {name} out of range [0, {n})")
            return int(name)
        if self._entity_index is None:
            if str(name).isdigit() and int(name) < n:
                return int(name)
            raise UserError(f"{where + ': ' if where else ''}unknown entity {name!r} (graph has no entity names)")
        try:
            return self._entity_index[name]
        except KeyError:
            raise unknown_name("entity", name, self.graph.entity_names, where) from None

    def resolve_relation(self, phrase: "str | int", where: str = "") -> int | None:
        """Relation id of a plan phrase, or None for free text.

        Rules: (0) an integer (or a string of digits) is a relation id; (1) an exact relation name; (2) otherwise the trailing ``/``- (or
        ``.``-) separated segments of exactly one relation name, with ``^-1`` for
        the inverse (``directed_by``, ``film/directed_by^-1``); several matches are
        an error listing them; (3) otherwise a phrase containing whitespace is free
        text; a single token is an unknown relation (error with the closest names).
        """
        names = self.graph.relation_names
        if isinstance(phrase, str) and phrase.strip().isdigit() and phrase.strip() not in self._relation_index:
            phrase = int(phrase.strip())
        if isinstance(phrase, (int, np.integer)):
            if not 0 <= int(phrase) < len(names):
                raise UserError(f"{where + ': ' if where else ''}relation id {phrase} out of range [0, {len(names)})")
            return int(phrase)
        if phrase in self._relation_index:
            return self._relation_index[phrase]
        segs, inv = _segments(phrase)
        hits = self._suffix.get(segs + (INVERSE_SUFFIX if inv else ""), set()) if segs else set()
        if len(hits) == 1:
            return next(iter(hits))
        loc = f"{where}: " if where else ""
        if len(hits) > 1:
            listed = sorted(names[i] for i in hits)
            more = f" and {len(listed) - 6} more" if len(listed) > 6 else ""
            raise UserError(f"{loc}relation {phrase!r} is ambiguous: it ends "
                            f"{', '.join(repr(x) for x in listed[:6])}{more}; give more of the name")
        if re.search(r"\s", phrase.strip()):
            return None
        known = list(names) + [k for k, v in self._suffix.items() if len(v) == 1 and "/" not in k]
        raise unknown_name("relation", phrase, known, loc.rstrip(": ") if loc else "")

    def plan(self, plan: "str | Sequence[str | int] | Plan", where: str = "plan") -> Plan:
        """Resolve a plan: a string of phrases separated by , ; -> → => or a list of phrases/relation ids."""
        if isinstance(plan, Plan):
            return plan
        phrases = parse_plan_text(plan) if isinstance(plan, str) else list(plan)
        if not phrases:
            raise UserError(f"{where}: empty plan")
        steps = []
        for i, ph in enumerate(phrases, 1):
            if isinstance(ph, str):
                ph = ph.strip()
                if not ph:
                    raise UserError(f"{where}: step {i} is empty")
            r = self.resolve_relation(ph, where=f"{where} step {i}")
            if r is None:
                steps.append(PlanStep(raw=str(ph), text=str(ph), relation=None))
            else:
                steps.append(PlanStep(raw=str(ph), text=relation_text(self.graph.relation_names[r]), relation=r))
        return Plan(tuple(steps))

    # ------------------------------------------------------------------ costs
    def _step_embeddings(self, plan: Plan) -> np.ndarray:
        rows = []
        free = [s.text for s in plan.steps if s.relation is None]
        free_emb = dict(zip(free, self.encoder.encode(free))) if free else {}
        for s in plan.steps:
            rows.append(self.relation_emb[s.relation] if s.relation is not None else np.asarray(free_emb[s.text], np.float64))
        return np.stack(rows).astype(np.float64)

    def step_costs(self, plan: "str | Sequence[str | int] | Plan") -> np.ndarray:
        """(L, R) float64 step costs ``1 − cos(e_r, e_{r̂_s})``, clipped to [0, 2]."""
        p = self.plan(plan)
        return np.clip(1.0 - self._step_embeddings(p) @ self.relation_emb.T, 0.0, 2.0)

    def sequence_text(self, relations: Sequence[int]) -> str:
        key = tuple(relations)
        t = self._seq_text.get(key)
        if t is None:
            t = ", ".join(relation_text(self.graph.relation_names[r]) for r in key)
            self._seq_text[key] = t
        return t

    def sequence_costs(self, sequences: Sequence[Sequence[int]], plan: "str | Sequence[str | int] | Plan") -> np.ndarray:
        """Heuristic-mode costs ``1 − cos(embed(path text), embed(plan text))`` (rounded to 12 decimals)."""
        p = self.plan(plan)
        plan_emb = self.encoder.encode([p.text])[0].astype(np.float64)
        if not sequences:
            return np.zeros(0)
        emb = self.encoder.encode([self.sequence_text(s) for s in sequences]).astype(np.float64)
        return np.round(np.clip(1.0 - emb @ plan_emb, 0.0, 2.0), _ROUND)

    # ------------------------------------------------------------- expansion
    def expand(self, frontier: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Out-edges of an entity set grouped by relation: [(relation, sorted unique tails)], by relation id."""
        g = self.graph
        ip = g.indptr
        rels_r, tails_r = g.by_relation()
        if len(frontier) == 1:
            u = int(frontier[0])
            rr, tt = rels_r[ip[u] : ip[u + 1]], tails_r[ip[u] : ip[u + 1]]
        else:
            starts, ends = ip[frontier], ip[frontier + 1]
            lens = ends - starts
            total = int(lens.sum())
            if total == 0:
                return []
            offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
            idx = offs + np.arange(total)
            rr, tt = rels_r[idx], tails_r[idx]
        if len(rr) == 0:
            return []
        key = np.unique(rr.astype(np.int64) * g.num_entities + tt)
        r = key // g.num_entities
        t = key - r * g.num_entities
        cut = np.flatnonzero(np.diff(r)) + 1
        starts = np.concatenate(([0], cut))
        ends = np.concatenate((cut, [len(key)]))
        return [(int(r[a]), t[a:b]) for a, b in zip(starts, ends)]

    def follow(self, topic: int, relations: Sequence[int]) -> list[np.ndarray]:
        """Entity sets reached after each step of ``relations`` from ``topic``: [F_0 = {topic}, F_1, …]."""
        index = self.graph.index
        frontiers = [np.array([topic], dtype=np.int64)]
        for r in relations:
            out = [index.tails(u, r) for u in frontiers[-1].tolist()]
            frontiers.append(np.unique(np.concatenate(out)).astype(np.int64) if out else np.zeros(0, np.int64))
        return frontiers

    def _entity_paths(self, topic: int, relations: Sequence[int], frontiers: list[np.ndarray]):
        """Entity-level paths for the smallest tails: each step back picks the smallest valid head."""
        index = self.graph.index
        paths = []
        for t in frontiers[-1][: self.max_entity_paths].tolist():
            edges = []
            v = t
            for s in range(len(relations), 0, -1):
                r = relations[s - 1]
                heads = np.intersect1d(index.heads(v, r), frontiers[s - 1], assume_unique=False)
                u = int(heads[0])
                edges.append((u, int(r), v))
                v = u
            edges.reverse()
            paths.append(tuple(edges))
        return tuple(paths)

    def _result_path(self, topic: int, relations: tuple[int, ...], cost: float) -> RelationPath:
        frontiers = self.follow(topic, relations)
        return RelationPath(
            relations=relations,
            names=tuple(self.graph.relation_names[r] for r in relations),
            cost=float(cost),
            tails=frontiers[-1],
            entity_paths=self._entity_paths(topic, relations, frontiers),
        )

    # ------------------------------------------------------------------ modes
    def _pathfinding(self, topic: int, C: np.ndarray, k: int) -> tuple[list[tuple[float, tuple[int, ...]]], int]:
        L = C.shape[0]
        mins = C.min(axis=1) if C.shape[1] else np.zeros(L)
        rest = np.concatenate([np.cumsum(mins[::-1])[::-1], [0.0]])
        # Slightly shrunk so that float rounding can never make the bound inadmissible.
        rest = np.maximum(rest * (1 - 1e-9) - 1e-12, 0.0).tolist()
        rest[L] = 0.0
        Cl = C.tolist()
        frontiers: dict[tuple[int, ...], np.ndarray] = {(): np.array([topic], dtype=np.int64)}
        heap: list[tuple[float, tuple[int, ...], float]] = [(rest[0], (), 0.0)]
        found: list[tuple[float, tuple[int, ...]]] = []
        examined = 0
        while heap and len(found) < k:
            _, prefix, g = heapq.heappop(heap)
            s = len(prefix)
            if s == L:
                found.append((g, prefix))
                continue
            examined += 1
            row = Cl[s]
            for r, tails in self.expand(frontiers.pop(prefix)):
                ng = g + row[r]
                p2 = prefix + (r,)
                if s + 1 < L:
                    frontiers[p2] = tails
                heapq.heappush(heap, (ng + rest[s + 1], p2, ng))
        return found, examined

    def _beam(self, topic: int, C: np.ndarray, k: int, width: int) -> tuple[list[tuple[float, tuple[int, ...]]], int]:
        beams: list[tuple[float, tuple[int, ...], np.ndarray]] = [(0.0, (), np.array([topic], dtype=np.int64))]
        examined = 0
        Cl = C.tolist()
        for s in range(C.shape[0]):
            cand = []
            for g, prefix, F in beams:
                examined += 1
                row = Cl[s]
                for r, tails in self.expand(F):
                    cand.append((g + row[r], prefix + (r,), tails))
            cand.sort(key=lambda c: (c[0], c[1]))
            beams = cand[:width]
        return [(g, p) for g, p, _ in beams[:k]], examined

    def _enumerate(self, topic: int, max_hops: int) -> tuple[list[tuple[int, ...]], bool]:
        """Distinct relation sequences of 1..max_hops hops from ``topic`` (breadth first, by relation ids)."""
        level = [((), np.array([topic], dtype=np.int64))]
        seqs: list[tuple[int, ...]] = []
        for s in range(max_hops):
            nxt = []
            for prefix, F in level:
                for r, tails in self.expand(F):
                    if len(seqs) >= self.max_sequences:
                        return seqs, True
                    p2 = prefix + (r,)
                    seqs.append(p2)
                    if s + 1 < max_hops:
                        nxt.append((p2, tails))
            level = nxt
        return seqs, False

    # ------------------------------------------------------------------- API
    def retrieve(
        self,
        topics: Sequence["str | int"],
        plan: "str | Sequence[str | int] | Plan | None" = None,
        *,
        plans: Sequence["str | Sequence[str | int] | Plan"] | None = None,
        mode: str = "pathfinding",
        k: int = 16,
        max_hops: int | None = None,
        beam_width: int = 16,
        progress: bool = False,
    ) -> list[RetrievalResult]:
        """Top-``k`` relation paths for each topic entity.

        Args:
            topics: entity names or ids.
            plan: one plan shared by every topic, or ``plans``: one per topic.
            mode: ``"pathfinding"``, ``"heuristic"`` or ``"beam"``.
            k: paths per topic (default 16).
            max_hops: heuristic mode only: longest path enumerated (default: the plan's length).
            beam_width: beam mode's W (default 16).
            progress: show a tqdm bar.
        """
        if mode not in MODES:
            raise unknown_name("mode", mode, MODES)
        if k < 1:
            raise UserError(f"k must be >= 1, got {k}")
        if (plan is None) == (plans is None):
            raise UserError("give exactly one of plan (shared) or plans (one per topic)")
        if plans is not None and len(plans) != len(topics):
            raise UserError(f"plans has {len(plans)} entries for {len(topics)} topics")
        if mode != "heuristic" and max_hops is not None:
            raise UserError(f"max_hops applies to heuristic mode; {mode} follows the plan's steps")
        if mode == "beam" and beam_width < 1:
            raise UserError(f"beam_width must be >= 1, got {beam_width}")
        topic_ids = [self.entity_id(t, where=f"topic {i + 1}") for i, t in enumerate(topics)]
        plan_objs = [self.plan(plan)] * len(topic_ids) if plans is None else [
            self.plan(p, where=f"plan {i + 1}") for i, p in enumerate(plans)]
        if max_hops is not None and max_hops < 1:
            raise UserError(f"max_hops must be >= 1, got {max_hops}")
        iterator = range(len(topic_ids))
        if progress:
            from kgreason.progress import progress_bar

            iterator = progress_bar(iterator, desc=f"KARPA-{mode}", unit="topic")
        if mode == "heuristic":
            return self._heuristic_batch(topic_ids, plan_objs, k, max_hops, iterator)
        costs_cache: dict[int, np.ndarray] = {}
        results = []
        for i in iterator:
            p = plan_objs[i]
            C = costs_cache.get(id(p))
            if C is None:
                C = costs_cache[id(p)] = self.step_costs(p)
            if mode == "pathfinding":
                found, examined = self._pathfinding(topic_ids[i], C, k)
            else:
                found, examined = self._beam(topic_ids[i], C, k, beam_width)
            L = p.length
            paths = tuple(self._result_path(topic_ids[i], rel, g / L) for g, rel in found)
            results.append(RetrievalResult(topic_ids[i], mode, p, paths, examined, False))
        return results

    def _heuristic_batch(self, topic_ids, plan_objs, k, max_hops, iterator) -> list[RetrievalResult]:
        enumerated = []
        for i in iterator:
            L = max_hops if max_hops is not None else plan_objs[i].length
            enumerated.append(self._enumerate(topic_ids[i], L))
        # One encoder call for every uncached sequence text of the batch.
        self.encoder.encode([self.sequence_text(s) for seqs, _ in enumerated for s in seqs])
        results = []
        for i, (seqs, truncated) in enumerate(enumerated):
            costs = self.sequence_costs(seqs, plan_objs[i]).tolist()
            order = sorted(range(len(seqs)), key=lambda j: (costs[j], seqs[j]))[:k]
            paths = tuple(self._result_path(topic_ids[i], seqs[j], costs[j]) for j in order)
            results.append(RetrievalResult(topic_ids[i], "heuristic", plan_objs[i], paths, len(seqs), truncated))
        return results
