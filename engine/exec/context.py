"""KG context for LLM prompts: candidate relation paths written as triples, multi-level lists or YAML.

Three formats of the same content (one :class:`ContextPath` per candidate
relation path: its topic, relations, entity-level evidence and answers):

``triples``
    one ``(head, relation, tail)`` line per evidence edge, then the answers::

        path 1: starred_actors^-1 -> directed_by (5 answers)
          (John Krasinski, starred_actors^-1, Leatherheads)
          (Leatherheads, directed_by, George Clooney)
          answers: George Clooney; Sam Mendes; ... (+3 more)

``lists``
    Language Message Passing's multi-level lists: the evidence paths merged into
    a tree rooted at the topic, one nesting level per hop::

        - path 1: starred_actors^-1 -> directed_by (5 answers)
          - John Krasinski
            - starred_actors^-1: Leatherheads
              - directed_by: George Clooney
          - answers: George Clooney; Sam Mendes (+3 more)

``yaml``
    a YAML list (as "Bridging the Gap" writes retrieved subgraphs), every string
    a double-quoted scalar so any name parses back::

        - path: 1
          relations: ["starred_actors^-1", "directed_by"]
          topic: "John Krasinski"
          subgraph:
            - ["John Krasinski", "starred_actors^-1", "Leatherheads"]
          answers: ["George Clooney", "Sam Mendes"]
          more_answers: 3

Size bound: :func:`format_context` with ``max_tokens`` keeps the text within
that many tokens as counted by ``count_tokens`` (a client's tokenizer), or by
:func:`estimate_tokens` (one token per 4 characters, rounded up: the estimate
the LLM client uses when a server reports no usage).  It first shows every path
with fewer answers and evidence paths (the same cap for all paths, the largest
that fits), then drops paths from the end (the worst-ranked); what was left
out is said in the text (``+N more``, a final ``(N more paths)`` line).  A budget
too small for even one path header gives ``""``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from kgreason.errors import unknown_name

__all__ = ["CONTEXT_STYLES", "ContextPath", "estimate_tokens", "format_context"]

CONTEXT_STYLES = ("triples", "lists", "yaml")

Edge = tuple[str, str, str]


@dataclass(frozen=True)
class ContextPath:
    """One candidate relation path, by names.

    Attributes:
        topic: the topic entity the path starts from.
        relations: relation names r_1 … r_L.
        answers: tail entity names, best first (may be a prefix of all tails).
        evidence: entity-level paths, each a tuple of L ``(head, relation, tail)`` edges.
        num_answers: how many tails the path has in all (default ``len(answers)``).
    """

    topic: str
    relations: tuple[str, ...]
    answers: tuple[str, ...] = ()
    evidence: tuple[tuple[Edge, ...], ...] = ()
    num_answers: int | None = None

    @property
    def total(self) -> int:
        return len(self.answers) if self.num_answers is None else max(int(self.num_answers), len(self.answers))


def estimate_tokens(text: str) -> int:
    """The documented token estimate: ``ceil(len(text) / 4)`` (4 characters a token)."""
    return math.ceil(len(text) / 4)


def _q(s: str) -> str:
    return json.dumps(str(s), ensure_ascii=False)


def _more(n: int) -> str:
    return f" (+{n} more)" if n > 0 else ""


def _header(i: int, p: ContextPath) -> str:
    n = p.total
    return f"path {i}: {' -> '.join(p.relations)} ({n} answer{'s' if n != 1 else ''})"


def _render_triples(i: int, p: ContextPath, n_ans: int, n_ev: int) -> list[str]:
    lines = [_header(i, p)]
    seen: set[Edge] = set()
    for ep in p.evidence[:n_ev]:
        for e in ep:
            if e not in seen:
                seen.add(e)
                lines.append(f"  ({e[0]}, {e[1]}, {e[2]})")
    shown = p.answers[:n_ans]
    lines.append("  answers: " + ("; ".join(shown) if shown else "(not shown)") + _more(p.total - len(shown)))
    return lines


def _render_lists(i: int, p: ContextPath, n_ans: int, n_ev: int) -> list[str]:
    lines = ["- " + _header(i, p), f"  - {p.topic}"]
    # Merge the evidence paths into a tree: shared prefixes are written once.
    tree: dict = {}
    for ep in p.evidence[:n_ev]:
        node = tree
        for _, r, t in ep:
            node = node.setdefault((r, t), {})

    def walk(node: dict, depth: int) -> None:
        for (r, t), child in node.items():
            lines.append("  " * depth + f"- {r}: {t}")
            walk(child, depth + 1)

    walk(tree, 2)
    shown = p.answers[:n_ans]
    lines.append("  - answers: " + ("; ".join(shown) if shown else "(not shown)") + _more(p.total - len(shown)))
    return lines


def _render_yaml(i: int, p: ContextPath, n_ans: int, n_ev: int) -> list[str]:
    lines = [f"- path: {i}", f"  relations: [{', '.join(_q(r) for r in p.relations)}]", f"  topic: {_q(p.topic)}"]
    edges: list[Edge] = []
    for ep in p.evidence[:n_ev]:
        for e in ep:
            if e not in edges:
                edges.append(e)
    if edges:
        lines.append("  subgraph:")
        lines.extend(f"    - [{_q(h)}, {_q(r)}, {_q(t)}]" for h, r, t in edges)
    shown = p.answers[:n_ans]
    lines.append(f"  answers: [{', '.join(_q(a) for a in shown)}]")
    if p.total > len(shown):
        lines.append(f"  more_answers: {p.total - len(shown)}")
    return lines


_RENDER = {"triples": _render_triples, "lists": _render_lists, "yaml": _render_yaml}


def _render(paths: Sequence[ContextPath], style: str, n_paths: int, cap: int | None, total_paths: int) -> str:
    lines: list[str] = []
    for i, p in enumerate(paths[:n_paths], 1):
        n_ans = len(p.answers) if cap is None else min(cap, len(p.answers))
        n_ev = len(p.evidence) if cap is None else min(cap, len(p.evidence))
        lines.extend(_RENDER[style](i, p, n_ans, n_ev))
    left = total_paths - n_paths
    if left > 0:
        lines.append(f"# ({left} more path{'s' if left != 1 else ''} not shown)" if style == "yaml"
                     else f"({left} more path{'s' if left != 1 else ''} not shown)")
    return "\n".join(lines)


def format_context(paths: Sequence[ContextPath], *, style: str = "yaml", max_tokens: int | None = None,
                   count_tokens: Callable[[str], int] | None = None) -> str:
    """The candidate paths as prompt text in ``style`` (see the module docstring), within ``max_tokens``.

    Paths are numbered from 1 in the given order.  ``count_tokens``: the tokenizer to
    measure with (default :func:`estimate_tokens`).  Without ``max_tokens`` everything
    given is written.
    """
    if style not in CONTEXT_STYLES:
        raise unknown_name("context style", style, CONTEXT_STYLES)
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    count = estimate_tokens if count_tokens is None else count_tokens
    n = len(paths)
    full = _render(paths, style, n, None, n)
    if max_tokens is None or count(full) <= max_tokens:
        return full
    longest = max((max(len(p.answers), len(p.evidence)) for p in paths), default=0)

    def fits(n_paths: int, cap: int) -> str | None:
        text = _render(paths, style, n_paths, cap, n)
        return text if count(text) <= max_tokens else None

    # Every path with the largest common cap that fits (the text grows with the cap).
    if fits(n, 0) is not None:
        lo, hi = 0, longest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(n, mid) is not None:
                lo = mid
            else:
                hi = mid - 1
        return fits(n, lo) or ""
    # Not even every header fits: the most paths that fit with no answers shown, best ranked first.
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid, 0) is not None:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return ""
    return fits(lo, 0) or ""
