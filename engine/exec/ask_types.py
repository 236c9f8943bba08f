"""The ask loop's values: what a planner and a reasoner are asked and answer (:class:`PlanRequest`,
:class:`PlanReply`, :class:`ReasonRequest`, :class:`ReasonReply`, and their :class:`Planner` /
:class:`Reasoner` protocols), and what the loop returns (:class:`AskResult` of :class:`AskAnswer` and
:class:`AskPath`); :func:`path_query`, the logical query of a relation path.

The LLM bridge (``llm_bridge.karpa_loop``) imports the request and reply classes from
:mod:`engine.exec.ask`, which re-exports them from here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from engine.exec.context import ContextPath
from engine.lang.query import Node, path_query  # noqa: F401  (path_query: re-exported, engine.exec.ask's users import it)

__all__ = ["PlanRequest", "PlanReply", "ReasonRequest", "ReasonReply", "Planner", "Reasoner", "AskPath",
           "AskAnswer", "AskResult", "path_query"]


# ------------------------------------------------------------------------------ planner / reasoner
@dataclass(frozen=True)
class PlanRequest:
    """What a planner is asked: ``relations`` are candidate relation names, nearest first;
    ``previous`` the plans of the first round (``None`` in the first round); ``continuations`` the
    relations that continue each relation path that exists from the topic in the KG (``()``: those leaving
    the topic), up to ``max_hops`` steps (:meth:`~engine.exec.ask_score.PathScorer.continuations`); empty
    when not known."""

    question: str
    topic: str
    relations: tuple[str, ...]
    previous: tuple[tuple[str, ...], ...] | None = None
    continuations: Mapping[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class PlanReply:
    """A planner's answer: plans (each a sequence of relation names or phrases), or ``ok=False`` with
    ``warnings`` saying why (timeout, malformed reply ...); ``calls``/``tokens``: LLM use."""

    plans: tuple[tuple[str, ...], ...] = ()
    ok: bool = True
    warnings: tuple[str, ...] = ()
    calls: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class ReasonRequest:
    """What a reasoner is asked: the candidate paths (numbered from 1) and their context text."""

    question: str
    topic: str
    paths: tuple[ContextPath, ...]
    context: str
    style: str


@dataclass(frozen=True)
class ReasonReply:
    """A reasoner's pick: path numbers (1-based) and/or answer names, or ``ok=False`` with warnings."""

    paths: tuple[int, ...] = ()
    answers: tuple[str, ...] = ()
    ok: bool = True
    warnings: tuple[str, ...] = ()
    calls: int = 0
    tokens: int = 0


class Planner(Protocol):
    """Proposes relation paths for a batch of questions (one reply per request, in order)."""

    def plan(self, requests: Sequence[PlanRequest]) -> list[PlanReply]: ...


class Reasoner(Protocol):
    """Picks paths/answers for a batch of questions (one reply per request, in order)."""

    def reason(self, requests: Sequence[ReasonRequest]) -> list[ReasonReply]: ...


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class AskPath:
    """One candidate relation path: its relations, costs, the executor's query and answers.

    Two costs, lower is better: ``cost`` orders the candidates (the retriever's cost for a planned path,
    :class:`~engine.paths.PathRetriever`; the embedding-only cost for the others), ``embedding_cost`` is the
    embedding-only cost of every candidate whatever its source (:mod:`engine.exec.ask_score`: one scale for
    all of a question's paths), the one the vote weighs them by (:func:`engine.exec.ask.vote_ranking`).
    Without a plan both are the same number.
    """

    relations: tuple[int, ...]
    names: tuple[str, ...]
    cost: float
    query: str
    answers: tuple[Any, ...]  # engine.exec.explain.Answer, best first (topic excluded when asked); no explanation
    # (the executor ran the path once, for scores; AskAnswer.explanation explains what is returned)
    num_tails: int  # entities the path reaches in the KG graph (topic excluded when asked)
    source: str  # "plan", "plan-variant" or "embedding"
    entity_paths: tuple = field(default=(), compare=False)  # a few (head, relation, tail) id paths (evidence)
    embedding_cost: float | None = None  # None: not scored (an AskPath built by hand): the vote reads `cost`
    plan_bonus: float = 0.0  # a planned path's AskSettings.plan_bonus (0 for the others, and with llm_decides)

    @property
    def vote_cost(self) -> float:
        """The cost the vote weighs this path by: ``embedding_cost`` (``cost`` where it was not scored) less
        ``plan_bonus``: a plan weighs in on the embedding-only scale (docs/ask.md, "Weighing the LLM")."""
        return (self.cost if self.embedding_cost is None else self.embedding_cost) - self.plan_bonus

    def to_json(self) -> dict[str, Any]:
        return {"relations": list(self.names), "cost": round(self.cost, 6),
                "embedding_cost": None if self.embedding_cost is None else round(self.embedding_cost, 6),
                "plan_bonus": self.plan_bonus,
                "query": self.query,
                "source": self.source, "num_tails": self.num_tails,
                "answers": [{"entity": a.entity, "id": a.id, "score": a.score} for a in self.answers]}


@dataclass(frozen=True)
class AskAnswer:
    """One answer: the entity, its score on the path that produced it, that path, and provenance."""

    entity: str
    id: int
    score: float
    path: tuple[str, ...]
    path_rank: int  # 1-based position of the path among the candidates
    query: str
    provenance: str  # the executor's: "kg" (or "llm"/"both" when executor hooks merged evidence)
    selected_by: str  # "llm" (the reasoner picked it), "vote" (the candidate paths' vote) or "best-path"
    explanation: Any = None

    def to_json(self) -> dict[str, Any]:
        d = {"entity": self.entity, "id": self.id, "score": self.score, "path": list(self.path),
             "path_rank": self.path_rank, "query": self.query, "provenance": self.provenance,
             "selected_by": self.selected_by}
        if self.explanation is not None:
            d["explanation"] = self.explanation.lines()
        return d


@dataclass
class AskResult:
    """The loop's outcome for one question (``error`` set, no answers, when no topic was found)."""

    question: str
    topic: str | None
    topic_id: int | None
    answers: list[AskAnswer] = field(default_factory=list)
    paths: list[AskPath] = field(default_factory=list)
    plans: list[tuple[str, ...]] = field(default_factory=list)
    retrieval: str = "embedding"  # "plan" or "embedding"
    trace: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    llm_calls: int = 0
    llm_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None

    def warn(self, step: str, message: str) -> None:
        self.warnings.append(f"{step}: {message}")

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "topic": self.topic, "topic_id": self.topic_id, "error": self.error,
                "retrieval": self.retrieval, "plans": [list(p) for p in self.plans],
                "answers": [a.to_json() for a in self.answers], "paths": [p.to_json() for p in self.paths],
                "warnings": list(self.warnings), "trace": self.trace,
                "llm": {"calls": self.llm_calls, "tokens": self.llm_tokens}, "seconds": round(self.seconds, 6)}
