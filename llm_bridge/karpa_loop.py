"""The LLM half of the KARPA loop: a planner and a reasoner over an OpenAI-compatible server.

::

    from engine import Engine
    from llm_bridge.client import LLMClient
    from llm_bridge.config import LLMConfig
    from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner

    eng = Engine.load("artifacts/metaqa")
    with LLMClient(LLMConfig(base_url="http://127.0.0.1:8099/v1", n=1, temperature=0.0)) as client:
        res = eng.ask("which person directed the movies starred by [John Krasinski]",
                      planner=LLMPlanner(client), reasoner=LLMReasoner(client))

* :class:`LLMPlanner` (KARPA's pre-planning): one prompt per question with the
  question, the topic entity and the candidate relations (nearest to the
  question first); the second round also shows the first plans.  The reply is a
  JSON list of relation paths (``[["r1", "r2"], ...]``); a single path
  (``["r1", "r2"]``), ``{"plans": [...]}``, code fences and prose around the
  JSON are accepted.  Anything else is a failed reply with a warning.
* :class:`LLMReasoner`: the candidate paths numbered from 1 and their KG
  context (:mod:`engine.exec.context`); the reply is
  ``{"paths": [numbers], "answers": [names]}`` (either may be empty).

Every prompt is one request with ``n=1``; server trouble (timeouts, errors,
budget) comes back as an :class:`~llm_bridge.client.LLMFailure` and becomes a
failed reply, so the loop falls back (embedding-only retrieval, the candidate
paths' vote) and says so in its trace.  The prompts are the module constants
:data:`PLAN_SYSTEM`, :data:`PLAN_USER`, :data:`REASON_SYSTEM`, :data:`REASON_USER`;
:func:`parse_plan_prompt` / :func:`parse_reason_prompt` read them back (the
simulator uses them, so tests go through the real prompt text).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from engine.exec.ask import PlanReply, PlanRequest, ReasonReply, ReasonRequest
from engine.exec.context import estimate_tokens

from .client import LLMClient
from .parse import extract_entities

__all__ = ["LLMPlanner", "LLMReasoner", "plan_messages", "reason_messages", "parse_plan_reply",
           "parse_reason_reply", "parse_plan_prompt", "parse_reason_prompt", "PlanPrompt", "ReasonPrompt"]

PLAN_SYSTEM = ("You plan relation paths over a knowledge graph. A relation path is the sequence of relations "
               "to follow from the topic entity to the answers.")
PLAN_USER = """Task: plan relation paths.
Question: {question}
Topic entity: {topic}
Candidate relations:
{relations}
{previous}Reply with a JSON list of at most {max_plans} relation paths, best first, each a list of relation names \
from the topic entity to the answer, e.g. [["relation_1", "relation_2"]]. Prefer the candidate relations."""
PLAN_PREVIOUS = "Your previous plans:\n{plans}\nRevise them using the candidate relations above.\n"
REASON_SYSTEM = ("You answer questions from a knowledge graph. You are given candidate relation paths from the "
                 "topic entity and the entities they reach.")
REASON_USER = """Task: choose reasoning paths.
Question: {question}
Topic entity: {topic}
Candidate paths:
{paths}
Knowledge ({style}):
{context}
Reply with JSON {{"paths": [numbers of the paths that answer the question], "answers": [the answer entities]}}."""

_Q = re.compile(r"^Question: (.*)$", re.MULTILINE)
_T = re.compile(r"^Topic entity: (.*)$", re.MULTILINE)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def plan_messages(req: PlanRequest, *, max_plans: int = 3) -> list[dict[str, str]]:
    """The planner's chat messages for one request."""
    prev = ""
    if req.previous:
        prev = PLAN_PREVIOUS.format(plans="\n".join("- " + json.dumps(list(p), ensure_ascii=False)
                                                    for p in req.previous))
    user = PLAN_USER.format(question=req.question, topic=req.topic, max_plans=max_plans, previous=prev,
                            relations="\n".join(f"- {r}" for r in req.relations))
    return [{"role": "system", "content": PLAN_SYSTEM}, {"role": "user", "content": user}]


def reason_messages(req: ReasonRequest) -> list[dict[str, str]]:
    """The reasoner's chat messages for one request."""
    paths = "\n".join(f"{i}. {' -> '.join(p.relations)}" for i, p in enumerate(req.paths, 1))
    user = REASON_USER.format(question=req.question, topic=req.topic, paths=paths, style=req.style,
                              context=req.context)
    return [{"role": "system", "content": REASON_SYSTEM}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class PlanPrompt:
    """A planner prompt read back: question, topic, candidate relations, previous plans (None in round 1)."""

    question: str
    topic: str
    relations: tuple[str, ...]
    previous: tuple[tuple[str, ...], ...] | None


@dataclass(frozen=True)
class ReasonPrompt:
    """A reasoner prompt read back: question, topic, candidate paths (relation names)."""

    question: str
    topic: str
    paths: tuple[tuple[str, ...], ...]


def _user(messages: Sequence[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    return ""


def _block(text: str, start: str, stop: str) -> list[str]:
    i = text.find(start)
    if i < 0:
        return []
    body = text[i + len(start):]
    j = body.find(stop)
    return [l for l in (body if j < 0 else body[:j]).splitlines() if l.strip()]


def parse_plan_prompt(messages: Sequence[dict[str, Any]]) -> PlanPrompt | None:
    """The fields of a :func:`plan_messages` prompt, or None for any other prompt."""
    text = _user(messages)
    if not text.startswith("Task: plan relation paths."):
        return None
    q, t = _Q.search(text), _T.search(text)
    if q is None or t is None:
        return None
    rels = tuple(l[2:].strip() for l in _block(text, "Candidate relations:\n", "\nReply with") if l.startswith("- "))
    previous = None
    if "Your previous plans:\n" in text:
        prev = []
        for l in _block(text, "Your previous plans:\n", "\nRevise them"):
            try:
                p = json.loads(l[2:])
            except ValueError:
                continue
            if isinstance(p, list):
                prev.append(tuple(str(x) for x in p))
        previous = tuple(prev)
        rels = tuple(r for r in rels if not r.startswith("["))
    return PlanPrompt(q.group(1), t.group(1), rels, previous)


def parse_reason_prompt(messages: Sequence[dict[str, Any]]) -> ReasonPrompt | None:
    """The fields of a :func:`reason_messages` prompt, or None for any other prompt."""
    text = _user(messages)
    if not text.startswith("Task: choose reasoning paths."):
        return None
    q, t = _Q.search(text), _T.search(text)
    if q is None or t is None:
        return None
    paths = []
    for l in _block(text, "Candidate paths:\n", "\nKnowledge ("):
        m = re.match(r"(\d+)\. (.*)$", l)
        if m:
            paths.append(tuple(x.strip() for x in m.group(2).split(" -> ")))
    return ReasonPrompt(q.group(1), t.group(1), tuple(paths))


def _json_value(text: str) -> Any:
    """The first JSON value in ``text`` (code fences and prose around it allowed); raises ValueError."""
    for m in _FENCE.finditer(text):
        try:
            return json.loads(m.group(1))
        except ValueError:
            pass
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "[{":
            try:
                return dec.raw_decode(text[i:])[0]
            except ValueError:
                continue
    raise ValueError("no JSON list or object in the reply")


def parse_plan_reply(text: str) -> tuple[tuple[str, ...], ...]:
    """Relation paths of a planner reply (see the module doc); raises ValueError saying what is wrong."""
    v = _json_value(text)
    if isinstance(v, dict):
        if "plans" not in v:
            raise ValueError("a JSON object without 'plans'")
        v = v["plans"]
    if not isinstance(v, list):
        raise ValueError(f"expected a JSON list of relation paths, got {type(v).__name__}")
    if v and all(isinstance(x, str) for x in v):
        v = [v]  # one path
    plans = []
    for k, p in enumerate(v, 1):
        if not isinstance(p, list) or not all(isinstance(x, str) for x in p):
            raise ValueError(f"plan {k} is not a list of relation names")
        plans.append(tuple(x.strip() for x in p))
    return tuple(plans)


def parse_reason_reply(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(path numbers, answer names) of a reasoner reply; raises ValueError saying what is wrong.

    A reply with no JSON at all is read as a list of answer names (bullets, quoted or numbered lines,
    :func:`llm_bridge.parse.extract_entities`; not prose): SmolLM2-135M answers that way, e.g.
    ``'The answer entities are:\\n- "John Sayles"\\n- "Amigo"'``; names not among the candidates' answers
    are dropped later with a warning.
    """
    try:
        v = _json_value(text)
    except ValueError:
        got = extract_entities(text)
        if got.how not in ("lines", "quoted-list") or not got.entities:
            raise  # prose (a bare comma list would read any sentence as a name)
        return (), tuple(got.entities)
    if isinstance(v, list):  # bare list: path numbers or answer names
        v = {"paths": [x for x in v if isinstance(x, int)], "answers": [x for x in v if isinstance(x, str)]}
    if not isinstance(v, dict):
        raise ValueError(f"expected a JSON object, got {type(v).__name__}")
    paths, answers = v.get("paths", []), v.get("answers", [])
    if not isinstance(paths, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in paths):
        raise ValueError("'paths' must be a list of path numbers")
    if not isinstance(answers, list) or not all(isinstance(x, str) for x in answers):
        raise ValueError("'answers' must be a list of entity names")
    if not paths and not answers:
        raise ValueError("neither paths nor answers")
    return tuple(paths), tuple(answers)


def _failure(res: Any) -> str:
    return f"LLM {res.reason}: {res.message}"[:300]


def _used(res: Any) -> tuple[int, int]:
    """(prompts, tokens) one result cost: one LLM call per prompt (cache hits included; HTTP retries are
    the client's ``stats.requests``)."""
    if getattr(res, "ok", False):
        return 1, int(res.prompt_tokens + res.completion_tokens)
    return 1, 0


class LLMPlanner:
    """KARPA's planner over an :class:`~llm_bridge.client.LLMClient` (one prompt per question, n=1).

    Args:
        client: an open client.
        max_plans: paths asked for per question (default 3).
        temperature: sampling temperature (default 0: the plan is deterministic and cacheable).
    """

    def __init__(self, client: LLMClient, *, max_plans: int = 3, temperature: float = 0.0) -> None:
        self.client = client
        self.max_plans = int(max_plans)
        self.temperature = float(temperature)

    def plan(self, requests: Sequence[PlanRequest]) -> list[PlanReply]:
        batch = [plan_messages(r, max_plans=self.max_plans) for r in requests]
        out = []
        for res in self.client.complete_many_sync(batch, n=1, temperature=self.temperature):
            calls, tokens = _used(res)
            if not res.ok:
                out.append(PlanReply(ok=False, warnings=(_failure(res),), calls=calls, tokens=tokens))
                continue
            text = res.texts[0] if res.texts else ""
            try:
                plans = parse_plan_reply(text)
            except ValueError as exc:
                out.append(PlanReply(ok=False, warnings=(f"malformed planner reply ({exc}): {text[:120]!r}",),
                                     calls=calls, tokens=tokens))
                continue
            out.append(PlanReply(plans=plans[: self.max_plans], calls=calls, tokens=tokens,
                                 warnings=() if plans else ("the planner proposed no plan",)))
        return out


class LLMReasoner:
    """Picks paths/answers from the candidates over an :class:`~llm_bridge.client.LLMClient` (n=1).

    ``count_tokens`` (used to bound the KG context): the client has no tokenizer of its own, so
    it is :func:`engine.exec.context.estimate_tokens` unless a tokenizer function is given.
    """

    def __init__(self, client: LLMClient, *, temperature: float = 0.0, count_tokens=None) -> None:
        self.client = client
        self.temperature = float(temperature)
        self.count_tokens = count_tokens or estimate_tokens

    def reason(self, requests: Sequence[ReasonRequest]) -> list[ReasonReply]:
        batch = [reason_messages(r) for r in requests]
        out = []
        for res in self.client.complete_many_sync(batch, n=1, temperature=self.temperature):
            calls, tokens = _used(res)
            if not res.ok:
                out.append(ReasonReply(ok=False, warnings=(_failure(res),), calls=calls, tokens=tokens))
                continue
            text = res.texts[0] if res.texts else ""
            try:
                paths, answers = parse_reason_reply(text)
            except ValueError as exc:
                out.append(ReasonReply(ok=False, warnings=(f"malformed reasoner reply ({exc}): {text[:120]!r}",),
                                       calls=calls, tokens=tokens))
                continue
            out.append(ReasonReply(paths=paths, answers=answers, calls=calls, tokens=tokens))
        return out
