"""Text that came from an LLM server, cleaned as it is received: :func:`clean_text`.

A server's reply (or error message) is untrusted text: ANSI escape sequences
would recolour or clear the user's terminal, a carriage return overwrites what
was printed before it, BEL rings, bidirectional overrides reorder what is
shown.  The client passes every completion text, model name, finish reason
and failure message through :func:`clean_text` before it returns, caches or
stores it (relation-question files included), so that parsers and caches see
plain lines.

That is not what keeps the terminal safe: a reply can still *spell* a control
character (``"\\u001b[2J"`` inside a JSON answer list, decoded after cleaning), and
KG names and user files hold anything.  Every CLI makes text safe where it prints
or writes it, with the one rule of :mod:`kgreason.text` (:func:`~kgreason.text.printable`,
:func:`~kgreason.text.json_line`); :func:`clean_text` removes the characters that rule
would escape, so the two agree on what is unsafe.
"""
from __future__ import annotations

import re

from kgreason.text import drop_unprintable

__all__ = ["clean_text"]

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte escapes, and the 8-bit CSI.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]?")
_NEWLINES = re.compile(r"\r\n?|[\u2028\u2029\x85]")


def clean_text(text: str) -> str:
    """``text`` with ANSI escape sequences removed, line breaks (CR, CRLF, U+2028, U+2029, NEL) made
    ``\\n``, and every other character that :func:`kgreason.text.printable` would escape (C0, C1, DEL,
    bidi controls, lone surrogates, ...) removed; tabs and newlines stay, so JSON and multi-line answers
    still parse."""
    if text.isprintable():
        return text
    return drop_unprintable(_NEWLINES.sub("\n", _ANSI.sub("", text)), keep="\t\n")
