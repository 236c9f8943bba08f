"""The bridge's prompts, rendered from package-data templates (``llm_bridge/templates/*.txt``).

Templates are :class:`string.Template` texts (``$field``), never f-strings in code,
so a prompt can be read and changed without reading Python.  Three prompts:

* **relation question** (LGOT §3.1): from a few sample ``(head, tail)`` pairs of a
  relation the LLM rewrites it as a question about entity1 whose answer is
  entity2, with the literal slot ``{entity}`` where entity1 goes.  The result is a
  *question template* (one line, exactly one ``{entity}``, no double quotes);
  :func:`fallback_template` gives a readable one from the relation's name alone.
* **projection**: the question template with ``{entity}`` replaced by the input
  entities, each JSON-quoted and joined with ``" or "`` (LGOT's format), and the
  request to answer with at most ``max_answers`` entities as a JSON list.
  :func:`parse_projection_request` inverts it (the simulated server uses it):
  because question templates never hold a double quote and names are
  JSON-escaped, the quoted group is unambiguous.
* **answer check** (LGOT §3.3.1, optional): "is X a correct answer to Q?", yes/no.

Messages are lists of ``{"role": ..., "content": ...}`` dicts (Chat Completions).
"""
from __future__ import annotations

import json
import re
import string
from functools import lru_cache
from importlib import resources
from typing import NamedTuple, Sequence

__all__ = [
    "ENTITY_SLOT",
    "MAX_ANSWERS",
    "load_template",
    "render",
    "clean_question_template",
    "relation_words",
    "fallback_template",
    "quote_entities",
    "fill_question",
    "projection_messages",
    "projection_response_format",
    "relation_question_messages",
    "answer_check_messages",
    "ProjectionRequest",
    "parse_projection_request",
    "parse_projection_prompt",
    "parse_relation_question_prompt",
]

#: Where entity1 goes in a question template.
ENTITY_SLOT = "{entity}"
#: LGOT asks for at most 10 answers per sub-question.
MAX_ANSWERS = 10

INVERSE_SUFFIX = "^-1"  # the artifact's inverse-relation naming (kge.artifact.INVERSE_SUFFIX)
_PLACEHOLDER = re.compile(r"\$(?:(\w+)|\{(\w+)\})")
# Ways an LLM writes the slot when asked for "{entity}" (normalised to ENTITY_SLOT).
_SLOT_VARIANTS = re.compile(r"[\[{<(]\s*(?:entity|entity1|entity_1|entity 1|e1|x|subject|head)\s*[\]}>)]", re.IGNORECASE)
_QUOTED_GROUP = re.compile(r'"(?:[^"\\]|\\.)*"(?: or "(?:[^"\\]|\\.)*")*')
_QUOTED_ONE = re.compile(r'"(?:[^"\\]|\\.)*"')


# ------------------------------------------------------------------------------ templates
@lru_cache(maxsize=None)
def _template_text(name: str) -> str:
    try:
        text = resources.files("llm_bridge").joinpath("templates", f"{name}.txt").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"llm_bridge template {name!r} is missing: the package data was not installed "
                                f"(reinstall kgreason)") from None
    return text.rstrip("\n")


def load_template(name: str) -> string.Template:
    """The template ``llm_bridge/templates/<name>.txt`` (trailing newlines removed)."""
    return string.Template(_template_text(name))


def render(name: str, **fields: object) -> str:
    """``load_template(name).substitute(fields)``: a missing field raises ``KeyError`` naming it."""
    return load_template(name).substitute({k: str(v) for k, v in fields.items()})


# ----------------------------------------------------------------------- question templates
def clean_question_template(text: str | None) -> str | None:
    """A usable question template from ``text`` (an LLM reply or a stored one), or ``None``.

    Usable: one line, exactly one ``{entity}`` slot (common variants such as
    ``[entity1]`` or ``{ENTITY}`` are normalised), no double quotes (replaced by
    single quotes: the projection prompt's quoted entities must stay unambiguous).
    Of a multi-line reply the first line with a slot is taken; a leading
    ``Question:`` and surrounding quotes are removed.
    """
    if not text:
        return None
    for line in str(text).splitlines():
        line = _SLOT_VARIANTS.sub(ENTITY_SLOT, line.strip())
        if ENTITY_SLOT not in line:
            continue
        line = re.sub(r"^(?:\*\*)?(?:question|q)\s*[:\-]\s*(?:\*\*)?\s*", "", line, flags=re.IGNORECASE)
        line = line.strip().strip("`").strip()
        if len(line) >= 2 and line[0] == line[-1] and line[0] in "\"'":
            line = line[1:-1].strip()
        line = line.replace('"', "'")
        if line.count(ENTITY_SLOT) != 1 or len(line) > 300:
            return None
        return line
    return None


def relation_words(relation: str) -> str:
    """Readable words of a relation name: ``/film/film/directed_by`` -> ``directed by``.

    Freebase paths keep the last segment of each ``.``-joined part (CVT relations
    such as ``/film/actor/film./film/performance/film`` -> ``film``), repeated
    words collapse; underscores and hyphens become spaces.  The inverse suffix
    ``^-1`` is not part of the words (see :func:`fallback_template`).
    """
    base = relation[: -len(INVERSE_SUFFIX)] if relation.endswith(INVERSE_SUFFIX) else relation
    parts = [p for p in base.split(".") if p.strip("/")] if "/" in base else [base]
    words: list[str] = []
    for part in parts:
        seg = [s for s in part.split("/") if s][-1] if "/" in part else part
        for w in re.sub(r"[_\-\s]+", " ", seg).split():
            if not words or words[-1].lower() != w.lower():
                words.append(w)
    return " ".join(words) or base.strip() or relation


def fallback_template(relation: str) -> str:
    """The question template of ``relation`` without an LLM.

    ``directed_by`` -> ``Who or what is the directed by of {entity}?``;
    ``directed_by^-1`` -> ``Which entities have {entity} as their directed by?``.
    """
    name = "fallback_inverse" if relation.endswith(INVERSE_SUFFIX) else "fallback_forward"
    out = clean_question_template(render(name, words=relation_words(relation)))
    if out is None:  # pragma: no cover - the packaged templates hold one slot
        raise ValueError(f"template {name!r} must hold exactly one {ENTITY_SLOT}")
    return out


# ------------------------------------------------------------------------------- projection
def quote_entities(names: Sequence[str]) -> str:
    """``"A" or "B" or "C"``: each name JSON-quoted (``"`` and ``\\`` escaped), LGOT's "or" join."""
    if not names:
        raise ValueError("a projection prompt needs at least one input entity")
    return " or ".join(json.dumps(str(n), ensure_ascii=False) for n in names)


def fill_question(template: str, names: Sequence[str]) -> str:
    """The question: ``template`` with ``{entity}`` replaced by :func:`quote_entities` of ``names``."""
    if template.count(ENTITY_SLOT) != 1 or '"' in template or "\n" in template:
        raise ValueError(f"not a question template (one line, one {ENTITY_SLOT}, no double quotes): {template!r}")
    return template.replace(ENTITY_SLOT, quote_entities(names))


def _messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def projection_messages(template: str, names: Sequence[str], *, max_answers: int = MAX_ANSWERS) -> list[dict[str, str]]:
    """Chat messages asking the question ``template`` about ``names`` (at most ``max_answers`` answers, JSON list)."""
    if max_answers < 1:
        raise ValueError(f"max_answers must be >= 1, got {max_answers}")
    return _messages(render("projection.system"),
                     render("projection.user", question=fill_question(template, names), max_answers=max_answers))


#: Longest entity name the "schema" output mode lets the model write (bounds a rambling small model).
SCHEMA_MAX_NAME_CHARS = 60
# One answer in "schema" mode: a single line without quotes, backslashes, brackets or braces, so a
# small model cannot hide prose or a second JSON document inside one string.
_SCHEMA_NAME_PATTERN = '^[^"\\\\\\n\\[\\]{}]{1,%d}$' % SCHEMA_MAX_NAME_CHARS


def projection_response_format(mode: str, *, max_answers: int = MAX_ANSWERS) -> dict | None:
    """The ``response_format`` of a projection prompt for ``LLMConfig.json_output`` ``mode``.

    ``"off"``: None (free text); ``"object"``: ``{"type": "json_object"}``; ``"schema"``:
    llama.cpp's JSON-schema form, a list of at most ``max_answers`` strings (the reply
    the prompt asks for), which its server compiles into a grammar.
    """
    if mode == "off":
        return None
    if mode == "object":
        return {"type": "json_object"}
    if mode == "schema":
        return {"type": "json_object",
                "schema": {"type": "array", "maxItems": int(max_answers),
                           "items": {"type": "string", "pattern": _SCHEMA_NAME_PATTERN}}}
    raise ValueError(f"json output mode must be off, object or schema, got {mode!r}")


def relation_question_messages(relation: str, pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """Chat messages asking the LLM to rewrite ``relation`` as a question template (LGOT §3.1)."""
    if not pairs:
        raise ValueError(f"relation {relation!r}: at least one (head, tail) example is needed")
    examples = "\n".join(f"{json.dumps(h, ensure_ascii=False)} -> {json.dumps(t, ensure_ascii=False)}" for h, t in pairs)
    return _messages(render("relation_question.system"), render("relation_question.user", relation=relation,
                                                                  examples=examples))


def answer_check_messages(question: str, answer: str) -> list[dict[str, str]]:
    """Chat messages asking whether ``answer`` answers ``question`` (LGOT §3.3.1; reply parsed by ``parse.parse_yes_no``)."""
    return _messages(render("answer_check.system"),
                     render("answer_check.user", question=question, answer=json.dumps(answer, ensure_ascii=False)))


# ----------------------------------------------------------------------- inverting the prompt
class ProjectionRequest(NamedTuple):
    """A parsed projection prompt: the question template, its input entity names, the answer limit."""

    question: str
    entities: list[str]
    max_answers: int


@lru_cache(maxsize=None)
def _projection_user_regex() -> re.Pattern:
    """The projection user template as a regex: ``$question`` and ``$max_answers`` become groups."""
    raw = _template_text("projection.user")
    out, pos = [], 0
    for m in _PLACEHOLDER.finditer(raw):
        out.append(re.escape(raw[pos : m.start()]))
        field = m.group(1) or m.group(2)
        if field == "question":
            out.append(r"(?P<question>[^\n]*)")
        elif field == "max_answers":
            out.append(r"(?P<max_answers>\d+)")
        else:  # pragma: no cover - the template only uses these two
            out.append(r"[^\n]*")
        pos = m.end()
    out.append(re.escape(raw[pos:]))
    return re.compile("".join(out))


def _user_text(prompt: str | Sequence[dict]) -> str | None:
    if isinstance(prompt, str):
        return prompt
    for msg in reversed(list(prompt)):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):  # content parts: join the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else None
    return None


def parse_projection_request(prompt: str | Sequence[dict]) -> ProjectionRequest | None:
    """Invert :func:`projection_messages`: the user message (or the message list) -> request, or ``None``.

    ``None`` when ``prompt`` is not a projection prompt of this package's
    template (e.g. a relation-question or answer-check prompt).
    """
    text = _user_text(prompt)
    if not text:
        return None
    m = _projection_user_regex().fullmatch(text.strip())
    if m is None:
        return None
    split = split_filled_question(m.group("question"))
    if split is None:
        return None
    template, names = split
    return ProjectionRequest(question=template, entities=names, max_answers=int(m.group("max_answers")))


def split_filled_question(question: str) -> tuple[str, list[str]] | None:
    """A filled sub-question -> (its template with ``{entity}``, the entity names joined by "or"), or ``None``.

    The inverse of filling :data:`ENTITY_SLOT` with ``"a" or "b"`` (JSON-quoted names).
    """
    first, last = question.find('"'), question.rfind('"')
    if first < 0 or last <= first:
        return None
    g = _QUOTED_GROUP.match(question, first)
    if g is None or g.end() != last + 1:
        return None
    try:
        names = [json.loads(q) for q in _QUOTED_ONE.findall(g.group(0))]
    except json.JSONDecodeError:
        return None
    return question[:first] + ENTITY_SLOT + question[last + 1:], names


def parse_projection_prompt(prompt: str | Sequence[dict]) -> tuple[str, list[str]] | None:
    """``(question template, [input entity names])`` of a projection prompt, or ``None`` (see :func:`parse_projection_request`)."""
    req = parse_projection_request(prompt)
    return None if req is None else (req.question, req.entities)


@lru_cache(maxsize=None)
def _relation_user_regex() -> re.Pattern:
    raw = _template_text("relation_question.user")
    out, pos = [], 0
    for m in _PLACEHOLDER.finditer(raw):
        out.append(re.escape(raw[pos : m.start()]))
        field = m.group(1) or m.group(2)
        out.append(r"(?P<relation>[^\n]*)" if field == "relation" else r"(?P<examples>.*?)" if field == "examples"
                   else r"[^\n]*")
        pos = m.end()
    out.append(re.escape(raw[pos:]))
    return re.compile("".join(out), re.DOTALL)


def parse_relation_question_prompt(prompt: str | Sequence[dict]) -> tuple[str, list[tuple[str, str]]] | None:
    """Invert :func:`relation_question_messages`: ``(relation, [(head, tail), ...])``, or ``None``."""
    text = _user_text(prompt)
    if not text:
        return None
    m = _relation_user_regex().fullmatch(text.strip())
    if m is None:
        return None
    pairs = []
    for line in m.group("examples").splitlines():
        q = _QUOTED_ONE.findall(line)
        if len(q) == 2:
            try:
                pairs.append((json.loads(q[0]), json.loads(q[1])))
            except json.JSONDecodeError:
                return None
    return m.group("relation"), pairs
