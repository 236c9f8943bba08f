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

**Bounded on any reply** (up to the client's 1 MiB cap and beyond): every rule runs in time linear in
the reply's length and never recurses per nesting level.  JSON is found by one scan of the brackets
(:func:`iter_json_values`: the values ``json.JSONDecoder.raw_decode`` would find trying every ``[`` and
``{`` in order, each position parsed about once; a value nested deeper than
:data:`~kgreason.files.MAX_JSON_DEPTH` levels is not JSON here), the quoted-list rule remembers where
each item ends, and the regular expressions never try a run of spaces from each of its characters.

At most the first 1,000 items of a list are read (``dropped`` says how many were not), and a refusal
is looked for in the first 1,000 characters of the first sentence.

Refusals mean *no answer*, never an entity: a reply that is empty, ``[]``, or
says in words that it does not know (``I don't know``, ``I'm not sure``, ``cannot answer``,
``as an AI``, ``unknown``, ``none``, ``N/A``, ...) gives an empty list with
``refused=True``, and such phrases are dropped when they appear as list items.  A reply
with nothing that reads as a name and no refusal in words (``[[[[...``, a first line of
only punctuation, a 1 MB "item") is *unusable* (:attr:`ParsedReply.unusable`): the
LGOT hook keeps such a row KG-only with a warning.

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

import bisect
import itertools
import json
import math
import os
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from kgreason.files import _JSON_STRING, MAX_JSON_DEPTH
from llm_bridge.linking import normalize

__all__ = [
    "ParsedReply",
    "extract_entities",
    "scan_json",
    "iter_json_values",
    "is_refusal",
    "parse_yes_no",
    "Confidence",
    "sample_confidence",
    "logprob_confidence",
    "LOGPROB_MODES",
]

#: How :func:`logprob_confidence` turns an entity's token log-probabilities into p(e).
LOGPROB_MODES = ("first", "mean")

# Each run before the body is matched once ((?=(X))\N: an atomic group Python 3.10 can write):
# "```" followed by 100 K spaces and no closing fence took minutes when every split of the spaces
# between the two [ \t]* was tried against the rest of the reply.
_FENCE = re.compile(r"```(?=([ \t]*))\1(?=([\w+-]*))\2(?=([ \t]*))\3\r?\n?(?P<body>.*?)```", re.DOTALL)
_ITEM_KEYS = ("name", "entity", "answer", "label", "title", "value", "text")
_LIST_KEYS = ("answers", "answer", "entities", "entity", "results", "result", "names", "items", "list")
# The item is the rest of the line without its trailing spaces (see _bullet_item): a lazy item before
# "\s*$" retried the trailing run from each of its characters (quadratic on a line of spaces).
_BULLET = re.compile(r"^\s*(?:\(?\d{1,3}[.):]|[-*\u2022\u2023\u25e6\u2043\u2219])(\s+)(.*)$")
# "Paris - the capital" / "**Paris**: capital": the name ends before a dash or a colon explanation.  A match
# starts only where a run of spaces starts ((?<!\s)), so a long run is not retried from each of its spaces.
_EXPLANATION = re.compile(r"(?<!\s)\s+[\u2013\u2014-]\s+|\*\*(?!\*)\s*:|:\s+(?=\S)")
# The comma-list separators; a match never starts inside a run of spaces (only where one starts, or at a
# non-space: after a match that ended at the run's end), which gives the same splits in linear time.
_SEPARATOR = re.compile(r"(?:(?<!\s)|(?!\s))(?:\s*[,;]\s*|\s+(?:and|or)\s+)")
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
_MAX_ITEMS = 1000  # items of one reply read (a prompt asks for a few names; each costs a normalisation)
_MAX_REFUSAL_CHARS = 1000  # of the first sentence, where a refusal is looked for


@dataclass(frozen=True)
class ParsedReply:
    """What one reply says: ``entities`` (surface strings, in order, deduplicated by normalised form).

    ``refused``: the reply gives no answer (empty, ``[]``, or a refusal);
    ``how``: which rule read it (``json``, ``json-object``, ``quoted-list``,
    ``lines``, ``comma-list``, ``empty``, ``refusal``); ``dropped``: list items
    that were not entities (refusal phrases, placeholders, prose); ``unusable``: see the property.
    """

    entities: list[str]
    refused: bool
    how: str
    dropped: list[str] = field(default_factory=list)

    @property
    def unusable(self) -> bool:
        """No entity, and not because the model said it does not know: what the reply holds could not be
        read as names (``[[[[...``, a 1 MB line, objects without a name); a refusal or an empty list is
        an answer (nothing), not an unusable reply."""
        return not self.entities and self.how not in ("refusal", "empty") and \
            any(d.strip() and not _says_no(d[:_MAX_REFUSAL_CHARS]) for d in self.dropped)


def is_refusal(text: str) -> bool:
    """True when ``text`` (a reply or an item) says the model does not know / will not answer."""
    norm = normalize(text, strip_articles=False)
    return norm in _NON_ENTITY or bool(_REFUSAL.search(norm))


def _says_no(text: str) -> bool:
    """A refusal in words (``is_refusal`` also holds for text without a letter or digit, e.g. ``[[[[``)."""
    norm = normalize(text, strip_articles=False)
    return bool(norm) and (norm in _NON_ENTITY or bool(_REFUSAL.search(norm)))


def _item_string(item: Any) -> str | None:
    while isinstance(item, Mapping):  # a loop, not a recursion: {"a": {"a": ...}} may be deep
        for k in _ITEM_KEYS:
            for key in (k, k.capitalize(), k.upper()):
                if isinstance(item.get(key), (str, int, float)) and not isinstance(item.get(key), bool):
                    return str(item[key])
        if len(item) != 1:
            return None
        item = next(iter(item.values()))
    if isinstance(item, str):
        return item
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, (int, float)):
        return str(item) if math.isfinite(item) else None
    return None


def _flatten(items: Iterable[Any]) -> list[Any]:
    """The non-list items of nested lists, in order (iterative: no recursion per level)."""
    out: list[Any] = []
    stack = [iter(items)]
    while stack:
        for it in stack[-1]:
            if isinstance(it, list):
                stack.append(iter(it))
                break
            out.append(it)
        else:
            stack.pop()
    return out


# ------------------------------------------------------------------------------------ JSON in prose
_PROSE_OPEN = re.compile(r"[\[{]")
_STR = r'"[^"\\]*(?:\\.[^"\\]*)*"'  # a closed JSON string, "unrolled" (linear even when it fails)
# Inside brackets: a quote (a string that never closes), or a stretch of openers with anything but closers
# between them (closed strings included), or such a stretch of closers: "[[[[", "[x[x[x" or '{"a":{"a":'
# is one step of the scan, not one per bracket.
_JSON_STRETCH = re.compile(rf'"|[\[{{](?:[^"\]}}]+|{_STR})*|[\]}}](?:[^"\[{{]+|{_STR})*', re.DOTALL)
_STRETCH_OPENER = re.compile(rf"{_STR}|([\[{{])", re.DOTALL)
_STRETCH_CLOSER = re.compile(rf"{_STR}|([\]}}])", re.DOTALL)
_EXPECTED = str.maketrans("[{", "]}")


def _bracket_positions(pattern: re.Pattern[str], stretch: str, at: int, tokens: Sequence[str],
                       wanted: Sequence[int]) -> list[int]:
    """Positions (``at`` = the stretch's start) of the brackets number ``wanted`` (ascending, 0-based,
    strings not counted) of a stretch whose tokens (``pattern.findall``: ``""`` for a string) are ``tokens``.
    Only the tokens from the first wanted one on are visited in Python (a run of a million brackets
    needs the positions of a hundred of them)."""
    if not wanted:
        return []
    if '"' in stretch:  # token numbers of the wanted brackets
        where, count = [], 0
        want = iter(wanted)
        nxt = next(want)
        for k, t in enumerate(tokens):
            if t:
                if count == nxt:
                    where.append(k)
                    nxt = next(want, -1)
                    if nxt < 0:
                        break
                count += 1
    else:
        where = list(wanted)
    first = where[0]
    matches = itertools.islice(pattern.finditer(stretch), first, where[-1] + 1)
    keep = set(where)
    return [at + m.start() for k, m in enumerate(matches, first) if k in keep]


def scan_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> tuple[list[tuple[int, int]], list[int]]:
    """Where JSON values may be in ``text``: ``(closed, open_at_end)``, one linear pass, no recursion.

    ``closed``: ``(start, end)`` of every ``[``/``{`` whose bracket closes at ``end`` (sorted by start),
    ``open_at_end``: the positions of those still open when the text ends (outermost first), in both
    cases only values nested at most ``max_depth`` levels.  Outside brackets the text is prose (quotes
    there mean nothing); inside, a ``"`` starts a JSON string (to its closing quote, or to the end of
    the text), so ``[`` and ``]`` in strings do not count, as for a JSON parser starting at the bracket.
    A closing bracket of the wrong kind ends every open value (none of them is JSON).
    """
    closed: list[tuple[int, int]] = []
    expect: list[str] = []  # the closing bracket each open level needs, outermost first
    depth_cap = max(1, max_depth)
    # (level, start) of the innermost open values; one pushed past max_depth drops the outermost (it nests deeper)
    live: deque[tuple[int, int]] = deque(maxlen=depth_cap)
    pos = 0
    while True:
        if not expect:
            m = _PROSE_OPEN.search(text, pos)
            if m is None:
                break
            pos = m.start()
        m = _JSON_STRETCH.search(text, pos)
        if m is None:
            break
        i, stretch = m.start(), m.group()
        if stretch == '"':
            pos = _JSON_STRING.match(text, i).end()  # type: ignore[union-attr]  # always matches at a quote
            continue
        pos = m.end()
        if stretch[0] in "[{":
            tokens = _STRETCH_OPENER.findall(stretch)
            opened = "".join(tokens)
            level = len(expect)
            expect.extend(opened.translate(_EXPECTED))
            k = min(len(opened), depth_cap)  # only the innermost max_depth can be live
            starts = [i] if len(opened) == 1 else \
                _bracket_positions(_STRETCH_OPENER, stretch, i, tokens, range(len(opened) - k, len(opened)))
            live.extend(zip(range(level + len(opened) - k + 1, level + len(opened) + 1), starts))
            continue
        tokens = _STRETCH_CLOSER.findall(stretch)
        top = len(expect)
        got = "".join(tokens)[:top]  # past depth 0 the rest is prose (where quotes mean nothing): scanned again
        want = "".join(reversed(expect[top - len(got):]))
        ok = len(got) if got == want else len(os.path.commonprefix([got, want]))
        del expect[top - ok:]
        closing = min(len(live), ok)  # live is empty or the levels up to the top: these close
        stop = ok if ok < len(got) else ok - 1 if not expect else -1  # the closer after which prose resumes
        wanted = sorted({*range(closing), *([stop] if stop >= 0 else [])})
        ends = {0: i} if wanted == [0] else \
            dict(zip(wanted, _bracket_positions(_STRETCH_CLOSER, stretch, i, tokens, wanted)))
        while live and live[-1][0] > top - ok:
            level, start = live.pop()
            closed.append((start, ends[top - level]))
        if ok < len(got):  # a closing bracket of the wrong kind: no open value is JSON
            expect.clear()
            live.clear()
        if stop >= 0:
            pos = ends[stop] + 1
    closed.sort()
    return closed, [start for _, start in live]


def _roots(text: str, closed: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Any]]:
    """``(start, value)`` of the values ``raw_decode`` reads at the ``closed`` spans, in order, skipping
    those inside a value already read; each character is parsed about once.

    When the value at ``s`` fails at ``e``, a value starting between ``s`` and ``e`` was parsed on the way
    (the same characters, the same tokens): it is JSON iff it ends before ``e``, so those that do not are
    skipped unparsed.
    """
    dec = json.JSONDecoder()
    failed_at = -1
    after = 0
    for start, end in closed:
        if start < after or start < failed_at <= end:
            continue
        try:
            value, length = dec.raw_decode(text[start:end + 1])
        except json.JSONDecodeError as exc:
            failed_at = start + exc.pos
            continue
        yield start, value
        after = start + length


def _nested_values(value: Any) -> Iterator[Any]:
    """The lists and objects inside ``value`` in the order their brackets appear (iterative)."""
    stack = [value]
    while stack:
        v = stack.pop()
        kids = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
        for k in reversed(kids):
            if isinstance(k, (list, dict)):
                stack.append(k)
        if v is not value:
            yield v


def iter_json_values(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Iterator[Any]:
    """The JSON lists and objects in ``text``, as ``raw_decode`` tried at every ``[``/``{`` in order finds them
    (a value, then the lists and objects inside it, then the next value after it); linear time in ``len(text)``.

    Unlike that loop, brackets inside the strings of a JSON value are not tried on their own, and a value
    nested deeper than ``max_depth`` is not JSON (``json`` would recurse once per level).
    """
    closed, _ = scan_json(text, max_depth=max_depth)
    for _, value in _roots(text, closed):
        yield value
        yield from _nested_values(value)


def _json_candidates(text: str) -> tuple[list[Any] | None, str]:
    """The first JSON list (or object holding one) in ``text``: (items, rule) or (None, "")."""
    for value in iter_json_values(text):
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


# ---------------------------------------------------------------------------------- quoted lists
_SPACES = re.compile(r"\s*")
_LIST_START = re.compile(r"\[\s*(['\"\]])")


class _QuotedLists:
    """The quoted-list rule over one text, linear: where each item ends is found by bisection in the
    positions of the closing quotes, and whether a list goes on to its ``]`` from an item is decided
    once per item position (lists tried from different ``[`` share their tails)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        # Unescaped quotes (after an even run of backslashes, matched from the run's start), and those of
        # them that are followed by "," or "]" (where a single-quoted item may close).
        self.quotes = {q: [m.end() - 1 for m in re.finditer(rf"(?<!\\)(?:\\\\)*{q}", text)] for q in "'\""}
        self.closing = {q: [m.end() - 1 for m in re.finditer(rf"(?<!\\)(?:\\\\)*{q}(?=\s*[,\]])", text)]
                        for q in "'\""}
        self.memo: dict[int, int] = {}  # item start -> position of the list's "]" (or -1: not a list)

    def skip_ws(self, p: int) -> int:
        return _SPACES.match(self.text, p).end()  # type: ignore[union-attr]

    def item_end(self, p: int) -> int:
        """Where the item opened by the quote at ``p`` closes, or -1: a ``'`` closes at the next unescaped
        ``'`` followed by ``,`` or ``]`` (apostrophes stay in the item); a ``"`` at the next unescaped
        ``"``, which must be followed by ``,`` or ``]``."""
        q = self.text[p]
        if q == "'":
            ends = self.closing[q]
            k = bisect.bisect_right(ends, p)
            return ends[k] if k < len(ends) else -1
        quotes = self.quotes[q]
        k = bisect.bisect_right(quotes, p)
        if k == len(quotes):
            return -1
        end = quotes[k]
        after = self.skip_ws(end + 1)
        return end if after < self.n and self.text[after] in ",]" else -1

    def list_end(self, p: int) -> int:
        """The ``]`` of the list whose item opens at ``p`` (a quote), or -1."""
        chain = []
        result = -1
        while True:
            if p in self.memo:
                result = self.memo[p]
                break
            chain.append(p)
            end = self.item_end(p)
            if end < 0:
                break
            after = self.skip_ws(end + 1)  # a "," or "]" (item_end checked)
            if self.text[after] == "]":
                result = after
                break
            p = self.skip_ws(after + 1)
            if p >= self.n or self.text[p] not in "'\"":
                break
        for c in chain:
            self.memo[c] = result
        return result

    def items(self, p: int) -> list[str]:
        """The items of the list whose first item opens at ``p`` (known to end with ``]``)."""
        out = []
        text = self.text
        while True:
            end = self.item_end(p)
            out.append(re.sub(r"\\(.)", r"\1", text[p + 1:end], flags=re.DOTALL))
            after = self.skip_ws(end + 1)
            if text[after] == "]":
                return out
            p = self.skip_ws(after + 1)

    def first(self) -> list[str] | None:
        # Only a "[" followed by a quote or "]" can start such a list (the others are skipped at C speed),
        # and only one whose first item closes is followed further (a cheap test first: most fail it).
        closing_single, double, closing_double = self.closing["'"], self.quotes['"'], set(self.closing['"'])
        for m in _LIST_START.finditer(self.text):
            p = m.start(1)
            q = self.text[p]
            if q == "]":
                return []
            if q == "'":
                if not closing_single or closing_single[-1] <= p:
                    continue
            else:
                k = bisect.bisect_right(double, p)
                if k == len(double) or double[k] not in closing_double:
                    continue
            if self.list_end(p) >= 0:
                return self.items(p)
        return None


def _quoted_list(text: str) -> list[str] | None:
    """Items of the first ``[...]`` whose items are single- or double-quoted strings (mixed quotes allowed)."""
    if "[" not in text:
        return None
    return _QuotedLists(text).first()


def _clean_item(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^(?:\*\*|__)(.+?)(?:\*\*|__)", r"\1", s)  # markdown bold around the name
    s = s.strip().strip("`").strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1].strip()
    s = s.rstrip(".;,").strip()
    return s


def _bullet_item(line: str) -> str | None:
    """The item of a numbered or bulleted line, or None: what ``\\s+(.+?)\\s*$`` after the marker captured
    (the rest of the line without trailing spaces; on a line of only spaces its last one)."""
    m = _BULLET.match(line)
    if m is None:
        return None
    rest = m.group(2).rstrip()
    if rest:
        return rest
    spaces = m.group(1) + m.group(2)
    return spaces[-1] if len(spaces) >= 2 else None


def _bullet_lines(text: str) -> list[str] | None:
    items = []
    for line in text.splitlines():
        item = _bullet_item(line)
        if item is not None:
            # "Paris - the capital" / "**Paris**: capital": keep the name before a dash or colon explanation
            item = _EXPLANATION.split(item, maxsplit=1)[0]
            items.append(item)
    return items or None


def _comma_list(text: str) -> list[str] | None:
    for line in text.splitlines():
        line = _PREFIX.sub("", line).strip()
        if not line:
            continue
        line = re.sub(r"[.!]\s+\S.*$", "", line)  # a second sentence is prose
        parts = _SEPARATOR.split(line.rstrip("."))
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
    body = fence.group("body") if fence else text
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
        # A refusal says so in its first words: a 1 MB "sentence" is not normalised whole to find out.
        if _says_no(first[:_MAX_REFUSAL_CHARS]) and not any(_bullet_item(ln) is not None for ln in body.splitlines()):
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
    if len(items) > _MAX_ITEMS:
        dropped.append(f"... {len(items) - _MAX_ITEMS} more items not read (at most {_MAX_ITEMS} are)")
        items = items[:_MAX_ITEMS]
    for raw in items:
        s = _item_string(raw)
        if s is None:
            dropped.append(json.dumps(raw, ensure_ascii=False, default=str))
            continue
        s = _clean_item(s)
        if len(s) > _MAX_ITEM_CHARS:  # checked first: normalising a 1 MB "item" only to drop it is wasted
            dropped.append(s)
            continue
        key = normalize(s)
        if not key or is_refusal(s):
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
