"""Reading LLM replies: a tolerant entity-list extractor and the confidence p(e) of each answer.

:func:`extract_entities` accepts what models actually write, tried in this order:

1. a JSON list (``["a", "b"]``), anywhere in the reply, inside a code fence or
   followed by prose; items that are objects give their ``name``/``entity``/
   ``answer``/``label``/``title`` value;
2. a JSON object holding a list (``{"answers": ["a"]}``) or a single string;
3. a bracketed list with single or mixed quotes (``['a', "b's"]``; an apostrophe
   inside a single-quoted item is kept: an item ends only at a quote followed by
   ``,`` or ``]``); never ``eval``;
4. numbered or bulleted lines (``1. a``, ``2) b``, ``- c``, ``* d``, ``• e``);
5. a bare comma/semicolon list on the first line with content (after an
   ``Answer:``-style prefix).

Refusals mean *no answer*, never an entity: a reply that is empty, ``[]``, or
says it does not know (``I don't know``, ``I'm not sure``, ``cannot answer``,
``as an AI``, ``unknown``, ``none``, ``N/A``, ...) gives an empty list with
``refused=True``, and such phrases are dropped when they appear as list items.

Confidence (LGOT §3.2): with ``n`` samples of the same prompt,
``p(e) = (number of samples that name e) / n`` (:func:`sample_confidence`;
names are compared after :func:`~llm_bridge.linking.normalize`, a sample that
failed or refused counts as a sample naming nothing).  When the server returns
token log-probabilities, :func:`logprob_confidence` gives, per sample, the
probability of the tokens that spell the entity in the reply: ``"first"`` =
the first token's probability (how likely the model was to *start* this
answer; the default, since later tokens of a name are near-certain once it
has begun), ``"mean"`` = the geometric mean of the span's token probabilities
(``exp`` of the mean log-probability); ``p(e)`` is the mean of that over the
``n`` samples (0 for a sample that does not name ``e``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from llm_bridge.linking import normalize

__all__ = [
    "ParsedReply",
    "extract_entities",
    "is_refusal",
    "parse_yes_no",
    "Confidence",
    "sample_confidence",
    "logprob_confidence",
    "LOGPROB_MODES",
]

#: How :func:`logprob_confidence` turns an entity's token log-probabilities into p(e).
LOGPROB_MODES = ("first", "mean")

_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_ITEM_KEYS = ("name", "entity", "answer", "label", "title", "value", "text")
_LIST_KEYS = ("answers", "answer", "entities", "entity", "results", "result", "names", "items", "list")
_BULLET = re.compile(r"^\s*(?:\(?\d{1,3}[.):]|[-*\u2022\u2023\u25e6\u2043\u2219])\s+(.+?)\s*$")
_PREFIX = re.compile(r"^\s*(?:(?:the\s+)?(?:final\s+|correct\s+|possible\s+)?(?:answers?|entities|results?|response)"
                     r"(?:\s*[:\-]|\s+(?:is|are|would\s+be|include)\b\s*:?)|here\s+(?:is|are)\b[^:\n]*:)\s*",
                     re.IGNORECASE)
# Whole-reply refusals (matched against the normalised reply).
_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don\s?t|dont)\s+know|i\s+am\s+not\s+(?:sure|certain|aware)|i\s?m\s+not\s+(?:sure|certain|aware)"
    r"|(?:cannot|can\s?not|can\s?t|unable\s+to|not\s+able\s+to)\s+(?:answer|determine|provide|find|help|say|identify)"
    r"|as\s+an\s+ai\b|no\s+(?:known\s+)?(?:answers?|information|data|results?|entities)\b|not\s+enough\s+information"
    r"|there\s+(?:is|are)\s+no\s+(?:known\s+)?(?:answers?|such)|i\s+(?:have|ve)\s+no\s+(?:idea|information)"
    r"|sorry\b|i\s+apologi[sz]e)"
)
# List items that are not entities.
_NON_ENTITY = {"", "none", "null", "nil", "unknown", "n a", "na", "not applicable", "no answer", "no answers",
               "i don t know", "i dont know", "idk", "not sure", "unsure", "nothing", "no one", "nobody",
               "no entity", "no entities", "not known", "unclear", "undefined", "answer", "answers", "etc", "and so on",
               "entity", "entities", "first answer", "second answer", "none of the above", "no idea", "n"}
_MAX_ITEM_CHARS = 200  # longer "items" are prose, not names


@dataclass(frozen=True)
class ParsedReply:
    """What one reply says: ``entities`` (surface strings, in order, deduplicated by normalised form).

    ``refused``: the reply gives no answer (empty, ``[]``, or a refusal);
    ``how``: which rule read it (``json``, ``json-object``, ``quoted-list``,
    ``lines``, ``comma-list``, ``empty``, ``refusal``); ``dropped``: list items
    that were not entities (refusal phrases, placeholders, prose).
    """

    entities: list[str]
    refused: bool
    how: str
    dropped: list[str] = field(default_factory=list)


def is_refusal(text: str) -> bool:
    """True when ``text`` (a reply or an item) says the model does not know / will not answer."""
    norm = normalize(text, strip_articles=False)
    return norm in _NON_ENTITY or bool(_REFUSAL.search(norm))


def _item_string(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, (int, float)):
        return str(item) if math.isfinite(item) else None
    if isinstance(item, Mapping):
        for k in _ITEM_KEYS:
            for key in (k, k.capitalize(), k.upper()):
                if isinstance(item.get(key), (str, int, float)) and not isinstance(item.get(key), bool):
                    return str(item[key])
        if len(item) == 1:
            return _item_string(next(iter(item.values())))
    return None


def _flatten(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for it in items:
        if isinstance(it, list):
            out.extend(_flatten(it))
        else:
            out.append(it)
    return out


def _json_candidates(text: str) -> tuple[list[Any] | None, str]:
    """The first JSON list (or object holding one) in ``text``: (items, rule) or (None, "")."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            return _flatten(value), "json"
        if isinstance(value, dict):
            lower = {str(k).lower(): v for k, v in value.items()}
            for key in _LIST_KEYS:
                v = lower.get(key)
                if isinstance(v, list):
                    return _flatten(v), "json-object"
                if isinstance(v, str):
                    return [v], "json-object"
            lists = [v for v in value.values() if isinstance(v, list)]
            if lists:
                return _flatten(lists[0]), "json-object"
            s = _item_string(value)
            if s is not None:
                return [s], "json-object"
    return None, ""


def _quoted_list(text: str) -> list[str] | None:
    """Items of the first ``[...]`` whose items are single- or double-quoted strings (mixed quotes allowed)."""
    for start in (m.start() for m in re.finditer(r"\[", text)):
        pos, items = start + 1, []
        n = len(text)

        def skip_ws(p: int) -> int:
            while p < n and text[p].isspace():
                p += 1
            return p

        pos = skip_ws(pos)
        ok = False
        while pos < n:
            q = text[pos]
            if q == "]" and not items:
                ok = True
                pos += 1
                break
            if q not in "'\"":
                break
            end = pos + 1
            buf = []
            closed = False
            while end < n:
                c = text[end]
                if c == "\\" and end + 1 < n:
                    buf.append(text[end + 1])
                    end += 2
                    continue
                if c == q:
                    after = skip_ws(end + 1)
                    # A quote closes the item only when followed by "," or "]": apostrophes survive.
                    if after < n and text[after] in ",]":
                        closed = True
                        break
                    if q == '"':
                        break  # a stray double quote: not a list of this kind
                buf.append(c)
                end += 1
            if not closed:
                break
            items.append("".join(buf))
            pos = skip_ws(end + 1)
            if pos >= n:
                break
            if text[pos] == "]":
                ok = True
                pos += 1
                break
            pos = skip_ws(pos + 1)  # past the comma
        if ok:
            return items
    return None


def _clean_item(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^(?:\*\*|__)(.+?)(?:\*\*|__)", r"\1", s)  # markdown bold around the name
    s = s.strip().strip("`").strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1].strip()
    s = s.rstrip(".;,").strip()
    return s


def _bullet_lines(text: str) -> list[str] | None:
    items = []
    for line in text.splitlines():
        m = _BULLET.match(line)
        if m:
            item = m.group(1)
            # "Paris - the capital" / "**Paris**: capital": keep the name before a dash or colon explanation
            item = re.split(r"\s+[\u2013\u2014-]\s+|\*\*\s*:|:\s+(?=\S)", item, maxsplit=1)[0]
            items.append(item)
    return items or None


def _comma_list(text: str) -> list[str] | None:
    for line in text.splitlines():
        line = _PREFIX.sub("", line).strip()
        if not line:
            continue
        line = re.sub(r"[.!]\s+\S.*$", "", line)  # a second sentence is prose
        parts = re.split(r"\s*[,;]\s*|\s+and\s+|\s+or\s+", line.rstrip("."))
        return [p for p in parts if p.strip()]
    return None


def extract_entities(text: str | None, *, limit: int | None = None) -> ParsedReply:
    """The entity names in an LLM reply (see the module doc for the accepted forms).

    ``limit``: keep at most this many (the prompt asked for at most that many).
    Never raises on any string.
    """
    if text is None or not str(text).strip():
        return ParsedReply([], True, "empty")
    text = str(text)
    fence = _FENCE.search(text)
    body = fence.group(1) if fence else text
    items, how = _json_candidates(body)
    if items is None and fence:
        items, how = _json_candidates(text)
    if items is None:
        q = _quoted_list(body)
        if q is not None:
            items, how = q, "quoted-list"
    if items is None:
        first = next((ln for ln in body.splitlines() if ln.strip()), "")
        first = re.split(r"(?<=[.!?])\s+", first.strip(), maxsplit=1)[0]  # the first sentence decides
        if is_refusal(first) and not any(_BULLET.match(ln) for ln in body.splitlines()):
            return ParsedReply([], True, "refusal")
        b = _bullet_lines(body)
        if b is not None:
            items, how = b, "lines"
        else:
            c = _comma_list(body)
            items, how = (c, "comma-list") if c is not None else ([], "empty")
    out: list[str] = []
    dropped: list[str] = []
    seen: set[str] = set()
    for raw in items:
        s = _item_string(raw)
        if s is None:
            dropped.append(json.dumps(raw, ensure_ascii=False, default=str))
            continue
        s = _clean_item(s)
        key = normalize(s)
        if not key or len(s) > _MAX_ITEM_CHARS or is_refusal(s):
            dropped.append(s)
            continue
        if key in seen:
            continue
        seen.add(key)
        out.append(s)
    if limit is not None:
        out = out[: max(0, int(limit))]
    if not out:  # nothing usable is no answer, whatever the form
        return ParsedReply([], True, how if items else "empty", dropped)
    return ParsedReply(out, False, how, dropped)


_YES = re.compile(r"^\W*(yes|yeah|yep|correct|true|right)\b", re.IGNORECASE)
_NO = re.compile(r"^\W*(no|nope|incorrect|false|wrong)\b", re.IGNORECASE)


def parse_yes_no(text: str | None) -> bool | None:
    """The answer-check reply: True (yes), False (no), or None (neither, or both)."""
    if not text:
        return None
    t = str(text).strip()
    y, n = bool(_YES.search(t)), bool(_NO.search(t))
    if y != n:
        return y
    return None


# ----------------------------------------------------------------------------------- confidence
@dataclass(frozen=True)
class Confidence:
    """One answer and its confidence: ``text`` (the most frequent surface form), ``p`` in [0, 1],
    ``count`` (samples naming it) of ``n`` samples, ``key`` (normalised form)."""

    text: str
    p: float
    count: int
    n: int
    key: str

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "p": self.p, "count": self.count, "n": self.n}


def _surface_forms(samples: Sequence[Sequence[str]]) -> tuple[dict[str, int], dict[str, str], list[str]]:
    counts: dict[str, int] = {}
    forms: dict[str, dict[str, int]] = {}
    order: list[str] = []
    for sample in samples:
        seen: set[str] = set()
        for s in sample:
            key = normalize(s)
            if not key or key in seen:
                continue
            seen.add(key)
            if key not in counts:
                order.append(key)
                counts[key] = 0
                forms[key] = {}
            counts[key] += 1
            forms[key][s] = forms[key].get(s, 0) + 1
    best = {k: max(f.items(), key=lambda kv: kv[1])[0] for k, f in forms.items()}  # ties: first seen
    return counts, best, order


def sample_confidence(samples: Sequence[Sequence[str]], n: int | None = None) -> list[Confidence]:
    """p(e) = count/n over ``samples`` (one entity list per sample); best first, ties in first-seen order.

    ``n`` defaults to ``len(samples)``; pass the number of samples *requested*
    when some failed, so a failed sample counts as naming nothing.
    """
    n = len(samples) if n is None else int(n)
    if n < 1:
        return []
    counts, best, order = _surface_forms(samples)
    out = [Confidence(text=best[k], p=counts[k] / n, count=counts[k], n=n, key=k) for k in order]
    rank = {k: i for i, k in enumerate(order)}
    out.sort(key=lambda c: (-c.count, rank[c.key]))
    return out


def _span_logprobs(text: str, tokens: Sequence[tuple[str, float]], entity: str) -> list[float] | None:
    """Log-probabilities of the tokens overlapping the first occurrence of ``entity`` in ``text``."""
    joined = "".join(t for t, _ in tokens)
    if joined != text:  # tokens must spell the reply; otherwise offsets are meaningless
        text = joined
    # Prefer the quoted occurrence (the list item) over a mention in prose.
    for needle in (json.dumps(entity, ensure_ascii=False), f"'{entity}'", entity):
        pos = text.find(needle)
        if pos >= 0:
            if needle[0] in "\"'" and needle != entity:
                pos, length = pos + 1, len(needle) - 2
            else:
                length = len(needle)
            break
    else:
        return None
    lo, hi = pos, pos + max(1, length)
    out, offset = [], 0
    for tok, lp in tokens:
        start, end = offset, offset + len(tok)
        offset = end
        if end > lo and start < hi:
            out.append(float(lp))
    return out or None


def logprob_confidence(samples: Sequence[tuple[str, Sequence[tuple[str, float]], Sequence[str]]], *,
                       mode: str = "first", n: int | None = None) -> list[Confidence]:
    """p(e) from token log-probabilities (see the module doc); best first.

    ``samples``: per sample ``(reply text, [(token, logprob), ...], [entities parsed from it])``.
    ``mode``: ``"first"`` or ``"mean"``.  ``n`` defaults to ``len(samples)``.
    An entity whose span cannot be found in a sample's tokens gets that
    sample's count share instead (1 for naming it), so nothing named is lost.
    """
    if mode not in LOGPROB_MODES:
        raise ValueError(f"mode must be one of {', '.join(LOGPROB_MODES)}, got {mode!r}")
    n = len(samples) if n is None else int(n)
    if n < 1:
        return []
    counts, best, order = _surface_forms([s[2] for s in samples])
    total: dict[str, float] = {k: 0.0 for k in order}
    for text, tokens, ents in samples:
        seen: set[str] = set()
        for e in ents:
            key = normalize(e)
            if not key or key in seen:
                continue
            seen.add(key)
            lps = _span_logprobs(text, tokens, e) if tokens else None
            if lps is None:
                total[key] += 1.0
            elif mode == "first":
                total[key] += math.exp(min(0.0, lps[0]))
            else:
                total[key] += math.exp(min(0.0, sum(lps) / len(lps)))
    out = [Confidence(text=best[k], p=min(1.0, total[k] / n), count=counts[k], n=n, key=k) for k in order]
    rank = {k: i for i, k in enumerate(order)}
    out.sort(key=lambda c: (-c.p, rank[c.key]))
    return out
