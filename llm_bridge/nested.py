"""Nested sub-questions: asking a hop whose input set is empty (LGOT's chained prompts).

When the knowledge graph (and the LLM's linked answers) leave a projection's
input empty, the bridge still asks the LLM -- about the *previous
sub-question* instead of a list of entities.  The nested question is the
relation's question template with its ``{entity}`` slot filled by the package
template ``nested_entity`` (``the answers to «$question»``) around the previous
sub-question's own template, which keeps its ``{entity}`` slot; that slot is
filled with the previous hop's input names as usual.  For a 2-hop chain whose
first hop found nothing::

    Who directed the answers to «Which films starred {entity}?»?      -> filled with "Tom Hanks"

and a third empty hop nests once more.  A nested template is an ordinary
question template (one line, one ``{entity}``, no double quotes), so the
projection prompt, the answer-check prompt and the response cache treat it like
any other; :func:`unnest` splits it back into its chain of templates (the
simulated LLM answers the composed relation path with it).
"""
from __future__ import annotations

from functools import lru_cache

from . import prompts

__all__ = ["nest", "unnest", "is_nested"]


@lru_cache(maxsize=None)
def _marks() -> tuple[str, str]:
    """(text before, text after) the inner question in the ``nested_entity`` template."""
    raw = prompts.load_template("nested_entity").template
    key = "$question"
    if raw.count(key) != 1 or '"' in raw or "\n" in raw or prompts.ENTITY_SLOT in raw:
        raise ValueError("template 'nested_entity' must hold $question once, on one line, without double quotes")
    before, after = raw.split(key)
    if not before or not after:
        raise ValueError("template 'nested_entity' must have text on both sides of $question")
    return before, after


def nest(outer: str, inner: str) -> str:
    """The template ``outer`` asked about the answers of the template ``inner`` (its ``{entity}`` kept).

    Both must be question templates (one ``{entity}``, no double quotes).
    """
    for t in (outer, inner):
        if t.count(prompts.ENTITY_SLOT) != 1 or '"' in t or "\n" in t:
            raise ValueError(f"not a question template (one line, one {prompts.ENTITY_SLOT}, no double quotes): {t!r}")
    before, after = _marks()
    return outer.replace(prompts.ENTITY_SLOT, before + inner + after)


def is_nested(template: str) -> bool:
    before, after = _marks()
    return before in template and after in template


def unnest(template: str) -> list[str]:
    """The chain of plain templates of a (possibly nested) template, innermost (first hop) first.

    Inverts :func:`nest`: the outermost pair of marks (first opening, last
    closing) delimits the inner template, so names and templates inside never
    confuse it.  A plain template gives ``[template]``.
    """
    before, after = _marks()
    i = template.find(before)
    j = template.rfind(after)
    if i < 0 or j < i + len(before):
        return [template]
    outer = template[:i] + prompts.ENTITY_SLOT + template[j + len(after):]
    inner = template[i + len(before):j]
    if inner.count(prompts.ENTITY_SLOT) != 1:
        return [template]
    return unnest(inner) + [outer]
