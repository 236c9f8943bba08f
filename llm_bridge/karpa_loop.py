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

**JSON-constrained replies** (``json_output="schema"``; default ``"off"``): each
request carries a ``response_format`` in llama.cpp's form
``{"type": "json_object", "schema": ...}``, which its server compiles into a
grammar, so even a 135M model can only write the asked-for JSON: the planner's
schema (:func:`plan_response_format`) is ``{"plans": [[relation, ...], ...]}``
with 1..``max_plans`` plans, each **one of the relation paths that exist from
the topic in the KG** (:func:`plan_paths`: the request's ``continuations``
walked step by step, step 1 a relation leaving the topic, step k one that
continues from step k-1's tails, any step may be the last, 1..``max_hops``
steps, only the candidate relations shown in the prompt when any path is made
of them), so no plan can be reversed or lead nowhere; plans outside that set
(a server that ignored the grammar) are dropped with a warning.  A request
without ``continuations`` gets the flat schema: 1..``max_hops`` steps, each an
enum of the shown candidate relations.  The reasoner's
(:func:`reason_response_format`) is ``{"paths": [...], "answers": [...]}`` with
the path numbers an integer enum 1..K of the shown paths and the answers an
enum of the shown paths' tail names (the first :data:`MAX_ENUM_ANSWERS`, best
paths first; none at all when no path reaches a nameable entity): the reply
names nothing it was not shown.  ``"object"`` sends plain
``{"type": "json_object"}``; ``"off"`` sends none (and keeps the free-text
prompt asking for a JSON list).  A server that rejects ``response_format``
(HTTP 400/422) is asked again without it (:class:`~llm_bridge.client.LLMClient`),
so every OpenAI-compatible server still works; the parsers accept the
unconstrained replies as before.  Off by default because it did not help the
one real model measured: SmolLM2-135M's schema-constrained plans were all
usable and all wrong, so its Hits@1 on MetaQA fell to the wrong plans' answers
instead of the embedding-only fallback's (benchmarks/results/ask/metaqa_smollm2.md).

Every prompt is one request with ``n=1``; server trouble (timeouts, errors,
budget) comes back as an :class:`~llm_bridge.client.LLMFailure` and becomes a
failed reply, so the loop falls back (embedding-only retrieval, the candidate
paths' vote) and says so in its trace.  The prompts are the module constants
:data:`PLAN_SYSTEM`, :data:`PLAN_USER`, :data:`REASON_SYSTEM`, :data:`REASON_USER`;
the simulated planner/reasoner (:mod:`experiments.simulate_ask`) reads them back,
so tests go through the real prompt text.
"""
from __future__ import annotations

import bisect
import json
import re
from typing import Any, Iterable, Sequence

from engine.exec.ask import PlanReply, PlanRequest, ReasonReply, ReasonRequest
from engine.exec.context import estimate_tokens

from kgreason.files import _JSON_STRING, loads_json

from .client import LLMClient
from .parse import _roots, extract_entities, scan_json

__all__ = ["LLMPlanner", "LLMReasoner", "plan_messages", "reason_messages", "parse_plan_reply",
           "parse_reason_reply", "plan_paths",
           "plan_response_format", "reason_response_format", "JSON_OUTPUT_MODES", "MAX_ENUM_ANSWERS",
           "MAX_ENUM_PLANS", "SCHEMA_MAX_PATHS", "SCHEMA_MAX_ANSWERS"]

#: ``json_output`` of :class:`LLMPlanner` / :class:`LLMReasoner` (see the module doc).
JSON_OUTPUT_MODES = ("schema", "object", "off")
#: Most distinct tail names the reasoner's schema lists as an enum (those of the best-ranked paths first).
MAX_ENUM_ANSWERS = 200
#: Most relation paths the planner's narrowed schema lists (:func:`plan_paths`); MetaQA's question topics
#: have at most a few hundred paths of 1..3 hops, a KG with hundreds of relations can have thousands.
MAX_ENUM_PLANS = 512
#: Most path numbers the reasoner's schema lets the model write (a choice, not a recital of 1..K).
SCHEMA_MAX_PATHS = 3
#: Most answer names the reasoner's schema lets the model write (the first one decides Hits@1; a short
#: list keeps a small model inside its completion budget instead of cutting the JSON off).
SCHEMA_MAX_ANSWERS = 3

PLAN_SYSTEM = ("You plan relation paths over a knowledge graph. A relation path is the sequence of relations "
               "to follow from the topic entity to the answers.")
PLAN_USER = """Task: plan relation paths.
Question: {question}
Topic entity: {topic}
Candidate relations:
{relations}
{previous}Reply with a JSON list of at most {max_plans} relation paths, best first, each a list of relation names \
from the topic entity to the answer, e.g. [["relation_1", "relation_2"]]. Prefer the candidate relations."""
#: The planner's last line when the reply is JSON-constrained (``json_output`` "schema"/"object"): the object
#: the schema allows, and no placeholder example (SmolLM2 copied ``relation_1`` verbatim).
PLAN_REPLY_JSON = ("Reply with JSON {{\"plans\": [relation paths]}}: at most {max_plans} relation paths, best first, "
                   "each a list of 1 to {max_hops} candidate relation names from the topic entity to the answer.")
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

_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f]')
# No "\s*" before the lazy body: with one, a fence followed by a long run of spaces was tried once per
# split of the run (quadratic); json.loads skips the spaces anyway.
_FENCE = re.compile(r"```(?:json)?(.*?)```", re.DOTALL)
#: Values open at the end of a reply (cut off by max_tokens) that :func:`_cut_off_json` tries to close.
_MAX_CUT_OFF_TRIES = 4


def plan_messages(req: PlanRequest, *, max_plans: int = 3, max_hops: int = 3,
                  json_output: str = "off") -> list[dict[str, str]]:
    """The planner's chat messages for one request; ``json_output`` other than ``"off"`` ends the prompt
    with :data:`PLAN_REPLY_JSON` (the reply :func:`plan_response_format` allows)."""
    _check_mode(json_output)
    prev = ""
    if req.previous:
        prev = PLAN_PREVIOUS.format(plans="\n".join("- " + json.dumps(list(p), ensure_ascii=False)
                                                    for p in req.previous))
    user = PLAN_USER.format(question=req.question, topic=req.topic, max_plans=max_plans, previous=prev,
                            relations="\n".join(f"- {r}" for r in req.relations))
    if json_output != "off":
        user = user[: user.rindex("\nReply with ") + 1] + PLAN_REPLY_JSON.format(max_plans=max_plans,
                                                                                  max_hops=max_hops)
    return [{"role": "system", "content": PLAN_SYSTEM}, {"role": "user", "content": user}]


def _check_mode(mode: str) -> None:
    if mode not in JSON_OUTPUT_MODES:
        raise ValueError(f"json_output must be one of {', '.join(JSON_OUTPUT_MODES)}, got {mode!r}")


def _enum_names(names: Iterable[str]) -> list[str]:
    """Distinct names, first seen first, that a grammar enum can hold: llama-cpp-python 0.3.36's schema
    converter does not escape a backslash inside a quoted constant, so a name with a quote, backslash or
    control character would break the whole grammar (its server then falls back to any JSON)."""
    return [x for x in dict.fromkeys(str(n) for n in names) if not _UNSAFE.search(x)]


def plan_paths(req: PlanRequest, *, max_hops: int = 3) -> list[tuple[str, ...]]:
    """The relation paths a narrowed plan may be: ``req.continuations`` walked from the topic (``()``),
    every path of 1..``max_hops`` steps in it (a prefix of a path is a path: the plan may stop after any
    step), breadth first; [] when the request has no continuations.

    Only paths made of the candidates shown in the prompt (``req.relations``) when there is any such path,
    else all of them; names the grammar cannot quote (:func:`_enum_names`) end the walk there.  At most
    :data:`MAX_ENUM_PLANS`: beyond it the paths whose latest-shown relation comes first in the prompt's
    nearest-first order, shorter first, so the kept set stays prefix-closed.
    """
    paths: list[tuple[str, ...]] = []
    frontier: list[tuple[str, ...]] = [()]
    for _ in range(int(max_hops)):
        nxt = [prefix + (r,) for prefix in frontier for r in _enum_names(req.continuations.get(prefix, ()))]
        paths.extend(nxt)
        frontier = nxt
    pos: dict[str, int] = {}
    for i, r in enumerate(req.relations):
        pos.setdefault(r, i)
    shown = [p for p in paths if all(r in pos for r in p)]
    paths = shown or paths
    if len(paths) > MAX_ENUM_PLANS:
        late = len(pos)
        paths = sorted(paths, key=lambda p: (max(pos.get(r, late) for r in p), len(p)))[:MAX_ENUM_PLANS]
    return paths


def plan_response_format(req: PlanRequest, *, max_plans: int = 3, max_hops: int = 3,
                         json_output: str = "schema") -> dict[str, Any] | None:
    """The planner request's ``response_format`` (see the module doc); None for ``"off"``.

    ``"schema"``: ``{"plans": [...]}`` of 1..``max_plans`` plans; with ``req.continuations`` each plan is
    one of :func:`plan_paths` (an enum of whole relation paths: what exists from the topic, nothing else),
    else 1..``max_hops`` steps from the enum of ``req.relations`` (the candidates shown in the prompt, in
    order, duplicates once; names with a quote, backslash or control character left out, see
    :func:`_enum_names`); with neither it is plain ``{"type": "json_object"}`` (an empty enum admits no
    reply).
    """
    _check_mode(json_output)
    if json_output == "off":
        return None
    rels = _enum_names(req.relations)
    paths = plan_paths(req, max_hops=max_hops) if json_output == "schema" else []
    if json_output == "object" or not (rels or paths):
        return {"type": "json_object"}
    plan: dict[str, Any] = {"enum": [list(p) for p in paths]}
    if not paths:
        plan = {"type": "array", "minItems": 1, "maxItems": int(max_hops), "items": {"type": "string", "enum": rels}}
    return {"type": "json_object",
            "schema": {"type": "object", "properties": {"plans": {"type": "array", "minItems": 1,
                                                                  "maxItems": int(max_plans), "items": plan}},
                       "required": ["plans"], "additionalProperties": False}}


def reason_response_format(req: ReasonRequest, *, json_output: str = "schema",
                           max_answers: int = SCHEMA_MAX_ANSWERS) -> dict[str, Any] | None:
    """The reasoner request's ``response_format`` (see the module doc); None for ``"off"``.

    ``"schema"``: ``{"paths": [...], "answers": [...]}``; ``paths``: 1..min(K, :data:`SCHEMA_MAX_PATHS`)
    numbers from the enum 1..K of the ``K = len(req.paths)`` shown paths (at least one, so the reply
    always picks something);
    ``answers``: 0..``max_answers`` names from the enum of the paths' tail names (``ContextPath.answers``,
    first seen first, the first :data:`MAX_ENUM_ANSWERS`; names a grammar cannot quote left out, they stay
    reachable by path number); none (``[]``) when no path has a nameable tail: the reply can name no
    entity it was not shown.  With no candidate paths it is plain ``{"type": "json_object"}``.
    """
    _check_mode(json_output)
    if json_output == "off":
        return None
    if json_output == "object" or not req.paths:
        return {"type": "json_object"}
    names = _enum_names(a for p in req.paths for a in p.answers)[:MAX_ENUM_ANSWERS]
    answers = {"type": "array", "maxItems": int(max_answers) if names else 0,
               "items": {"type": "string", "enum": names} if names else {"type": "string"}}
    k = len(req.paths)
    return {"type": "json_object",
            "schema": {"type": "object",
                       "properties": {"paths": {"type": "array", "minItems": 1,
                                                "maxItems": min(k, SCHEMA_MAX_PATHS),
                                                "items": {"type": "integer", "enum": list(range(1, k + 1))}},
                                      "answers": answers},
                       "required": ["paths", "answers"], "additionalProperties": False}}


def reason_messages(req: ReasonRequest) -> list[dict[str, str]]:
    """The reasoner's chat messages for one request."""
    paths = "\n".join(f"{i}. {' -> '.join(p.relations)}" for i, p in enumerate(req.paths, 1))
    user = REASON_USER.format(question=req.question, topic=req.topic, paths=paths, style=req.style,
                              context=req.context)
    return [{"role": "system", "content": REASON_SYSTEM}, {"role": "user", "content": user}]


def _json_value(text: str) -> Any:
    """The first JSON value in ``text`` (code fences and prose around it allowed); raises ValueError.

    As if ``raw_decode`` were tried at every ``[``/``{`` in order, and a value cut off by the end of the
    reply closed by :func:`_cut_off_json`, but in time linear in the reply's length
    (:func:`llm_bridge.parse.scan_json`; values nested deeper than :data:`~kgreason.files.MAX_JSON_DEPTH`
    levels are not JSON).
    """
    for m in _FENCE.finditer(text):
        try:
            return loads_json(m.group(1))
        except ValueError:
            pass
    closed, open_at_end = scan_json(text)
    roots = _roots(text, closed)
    cut_offs = open_at_end[:_MAX_CUT_OFF_TRIES]
    for start, value in roots:
        # a value open at the end that starts earlier holds this one: its cut-off reading comes first
        while cut_offs and cut_offs[0] < start:
            cut = _cut_off_json(text[cut_offs.pop(0):])
            if cut is not None:
                return cut
        return value
    for i in cut_offs:
        cut = _cut_off_json(text[i:])
        if cut is not None:
            return cut
    raise ValueError("no JSON list or object in the reply")


_CUT_TOKEN = re.compile(rf'{_JSON_STRING.pattern}|[\[\]{{}}]', re.DOTALL)


def _open_brackets(text: str, stop: int) -> tuple[list[str], list[int]] | None:
    """The closers ``text[:stop]`` still needs and the positions of its list-closing ``]``; None when a
    bracket closes the wrong kind or the outer value completes (then it is no cut-off value)."""
    stack: list[str] = []
    closes: list[int] = []
    for m in _CUT_TOKEN.finditer(text, 0, stop):
        ch = m.group()
        if ch in "[{":
            stack.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if not stack or stack.pop() != ch or not stack:
                return None
            if ch == "]":
                closes.append(m.start())
    return stack, closes


def _cut_off_json(text: str) -> Any:
    """A JSON object or list cut off by the completion limit, closed after its last complete list, or None.

    A schema-constrained reply stopped by ``max_tokens`` is valid JSON up to where it stops
    (``{"plans": [["a", "b"], ["c", "d`` → ``{"plans": [["a", "b"]]}``): its complete lists are kept,
    the unfinished rest dropped.  At most three parses (two suffice): when the text closed after its last complete list
    fails at a position, the text before that position parsed, so the last list closing before it is
    the answer (or there is none).
    """
    if not text.startswith(("{", "[")):
        return None
    scanned = _open_brackets(text, len(text))
    if scanned is None or not scanned[1]:
        return None
    limit = len(text)
    closes = scanned[1]
    for _ in range(3):
        k = bisect.bisect_left(closes, limit) - 1
        if k < 0:
            return None
        end = closes[k]
        stack = _open_brackets(text, end + 1)
        if stack is None:
            return None
        try:
            return loads_json(text[:end + 1] + "".join(reversed(stack[0])))
        except json.JSONDecodeError as exc:
            limit = min(exc.pos, end)
        except ValueError:
            return None
    return None


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
        max_hops: most steps per plan the schema allows (default 3, ``AskSettings.max_hops``'s default).
        temperature: sampling temperature (default 0: the plan is deterministic and cacheable).
        json_output: ``"off"`` (default: free text, the prompt asks for JSON in words), ``"schema"``
            (each plan one of the relation paths that exist from the topic, :func:`plan_paths`, when the
            request has ``continuations``; else relation names from the prompt's candidates) or
            ``"object"``; see the module doc.
    """

    def __init__(self, client: LLMClient, *, max_plans: int = 3, max_hops: int = 3, temperature: float = 0.0,
                 json_output: str = "off") -> None:
        _check_mode(json_output)
        if int(max_plans) < 1 or int(max_hops) < 1:
            raise ValueError(f"max_plans and max_hops must be >= 1, got {max_plans} and {max_hops}")
        self.client = client
        self.max_plans = int(max_plans)
        self.max_hops = int(max_hops)
        self.temperature = float(temperature)
        self.json_output = json_output

    def plan(self, requests: Sequence[PlanRequest]) -> list[PlanReply]:
        kw = {"max_plans": self.max_plans, "max_hops": self.max_hops, "json_output": self.json_output}
        batch = [plan_messages(r, **kw) for r in requests]
        formats = [plan_response_format(r, **kw) for r in requests]
        # Under the narrowed schema only the paths it lists are plans: a server that ignored the grammar
        # (or fell back without it) must not get a reversed or impossible path into the loop.
        allowed = [set(plan_paths(r, max_hops=self.max_hops)) if self.json_output == "schema" else set()
                   for r in requests]
        out = []
        for res, ok_paths in zip(self.client.complete_many_sync(batch, n=1, temperature=self.temperature,
                                                                response_format=formats), allowed):
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
            warnings = [] if plans else ["the planner proposed no plan"]
            if ok_paths:
                bad = [p for p in plans if p not in ok_paths]
                warnings += [f"plan {json.dumps(list(p), ensure_ascii=False)} is not a relation path from the "
                             "topic in the KG: dropped" for p in bad]
                plans = tuple(p for p in plans if p in ok_paths)
            out.append(PlanReply(plans=plans[: self.max_plans], calls=calls, tokens=tokens, warnings=tuple(warnings)))
        return out


class LLMReasoner:
    """Picks paths/answers from the candidates over an :class:`~llm_bridge.client.LLMClient` (n=1).

    ``count_tokens`` (used to bound the KG context): the client has no tokenizer of its own, so
    it is :func:`engine.exec.context.estimate_tokens` unless a tokenizer function is given.
    ``json_output``: ``"off"`` (default), ``"schema"`` (path numbers and answer names constrained to
    the candidates, :func:`reason_response_format`) or ``"object"``.
    """

    def __init__(self, client: LLMClient, *, temperature: float = 0.0, count_tokens=None,
                 json_output: str = "off") -> None:
        _check_mode(json_output)
        self.client = client
        self.temperature = float(temperature)
        self.count_tokens = count_tokens or estimate_tokens
        self.json_output = json_output

    def reason(self, requests: Sequence[ReasonRequest]) -> list[ReasonReply]:
        batch = [reason_messages(r) for r in requests]
        formats = [reason_response_format(r, json_output=self.json_output) for r in requests]
        out = []
        for res in self.client.complete_many_sync(batch, n=1, temperature=self.temperature,
                                                  response_format=formats):
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
