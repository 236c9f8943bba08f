"""Text that came from an LLM server, made safe to print and to store: :func:`clean_text`.

A server's reply (or error message) is untrusted text: ANSI escape sequences
would recolour or clear the user's terminal, a carriage return overwrites what
was printed before it, BEL rings, bidirectional overrides reorder what is
shown.  The client passes every completion text, model name, finish reason
and failure message through :func:`clean_text` before it returns, prints,
caches or stores it (relation-question files included), so nothing downstream
sees such characters.
"""
from __future__ import annotations

import re

__all__ = ["clean_text"]

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte escapes, and the 8-bit CSI.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]?")
_NEWLINES = re.compile(r"\r\n?|[\u2028\u2029\x85]")
# C0 and C1 controls except \t and \n, DEL, and the bidirectional embedding/override/isolate marks.
_DROP = {c: None for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0xA0),
                           *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def clean_text(text: str) -> str:
    """``text`` with ANSI escape sequences removed, line breaks (CR, CRLF, U+2028, U+2029, NEL) made
    ``\\n``, and every other control character (C0, C1, DEL, bidi overrides) removed; tabs and
    newlines stay, so JSON and multi-line answers still parse."""
    if text.isprintable():
        return text
    return _NEWLINES.sub("\n", _ANSI.sub("", text)).translate(_DROP)
