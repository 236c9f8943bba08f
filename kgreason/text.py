"""Text that leaves the process: made safe for a terminal when printed, for JSON lines when written.

One rule for every CLI, applied where text is *printed or written*, not where it
is received: a string that came from an LLM, a KG file or a user file may hold
characters that act on the reader's terminal or split a line:

* C0 and C1 control characters (ESC and with it every ANSI sequence, ``\\r``,
  BEL, NUL, ``\\n``, ``\\t``), DEL;
* bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E/U+200F,
  U+061C), which reorder what is shown;
* line and paragraph separators (U+2028, U+2029), which some readers treat as
  line breaks, lone surrogates (which cannot even be encoded as UTF-8), and every
  other character Python does not call printable (format characters, unassigned
  code points, ...).

:func:`printable` writes each of them *visibly* as its Python escape (``\\x1b``,
``\\r``, ``\\u202e``), so the output is one printable line
(``str.isprintable()``) whatever the input.  Text that is already printable is
returned unchanged.  In text that needs escaping, backslashes are doubled too,
so the escaped form is exactly reversible: two distinct strings print
differently, unless one of them is printable and spells out the other's escaped
form (a KG would need both ``a\\x1b`` with a real ESC and the literal
characters ``a\\x1b``).

:func:`json_line` is :func:`json.dumps` for JSON lines: readable UTF-8
(``ensure_ascii=False``) except that the same characters are written as
``\\uXXXX`` escapes, so the line holds no raw control, bidi or separator
character (JSON already escapes C0; U+2028/U+2029 would end the line for a
JavaScript reader) and ``json.loads`` gives back exactly the original strings.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["printable", "json_line", "drop_unprintable"]

# Candidates for escaping: everything outside printable ASCII, and the backslash (doubled when escaping).
_CANDIDATE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
# In JSON text: every character at or above DEL (below it, json.dumps escapes all controls already).
_JSON_CANDIDATE = re.compile(r"[^\x00-\x7e]")


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    if c == "\\":
        return "\\\\"
    if c.isprintable():
        return c
    return repr(c)[1:-1]  # \n, \r, \t, \x1b, \u202e, \ud800, \U000e0041: Python's own escapes


def printable(text: str) -> str:
    """``text`` safe to print on a terminal, as one line: every character that is not printable
    (``str.isprintable``: controls, ANSI escapes, ``\\r``, ``\\n``, bidi controls, U+2028/U+2029, lone
    surrogates, ...) written as its Python escape (``\\x1b``, ``\\u202e``), and then backslashes doubled so
    that the escaping is reversible.  Printable text (ASCII or not: ``"Zoë"``) is returned unchanged.

    Apply it to each field of an output line that holds untrusted text (an entity or relation name, an
    LLM's answer, a line of a user's file), or to a whole line built from them, once: applying it again to
    its own output returns that output unchanged.
    """
    if text.isprintable():
        return text
    return _CANDIDATE.sub(_escape, text)


def drop_unprintable(text: str, keep: str = "") -> str:
    """``text`` without the characters :func:`printable` would escape, except those in ``keep`` (for
    text taken in rather than shown: :func:`llm_bridge.text.clean_text` keeps ``"\\t\\n"``)."""
    if text.isprintable():
        return text
    return _CANDIDATE.sub(lambda m: m.group() if m.group() in keep or m.group().isprintable() else "", text)


def _json_escape(match: re.Match[str]) -> str:
    c = match.group()
    if c != "\x7f" and c.isprintable():
        return c
    code = ord(c)
    if code > 0xFFFF:  # a JSON \u escape holds 16 bits: write the surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def json_line(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` with every character that is not printable (DEL,
    C1 controls, bidi controls, U+2028/U+2029, lone surrogates, ...) written as a ``\\uXXXX`` escape:
    the text never holds a raw control, bidi or separator character, and ``json.loads`` of it equals
    ``json.loads(json.dumps(obj))``.  Without ``indent`` it is one line (no trailing newline)."""
    import json

    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    # Fast paths at C speed: nothing to escape (the layout's newlines with ``indent`` are no concern).
    if (text.isascii() and "\x7f" not in text) or text.replace("\n", "").isprintable():
        return text
    # Outside strings JSON text is ASCII (numbers, punctuation, whitespace), so every match is inside
    # a string, where a \u escape means the same character.
    return _JSON_CANDIDATE.sub(_json_escape, text)
