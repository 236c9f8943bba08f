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

from kgreason.constants import INVERSE_SUFFIX

__all__ = [
    "ENTITY_SLOT",
    "MAX_ANSWERS",
    "load_template",
    "render",
    "clean_question_template",
    "relation_words",
    "fallback_template",
    "fallback_templates",
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


#: Inverse-relation suffixes: the artifact's ``^-1``, and DeepPath's NELL-995 ``_inv``.
_INVERSE_SUFFIXES = (INVERSE_SUFFIX, "_inv")
_PREPS = frozenset("in of for by with from to on at as against within than about into over under near via "
                   "during since after before out up".split())
_COPULAS = frozenset({"is", "was", "are", "were"})
_HAVE = frozenset({"has", "have", "had"})
# Participles that, followed by a preposition, make a passive ("born in", "headquartered in"); any
# "...ed by" is passive too.
_PASSIVE = frozenset("""born located headquartered known based buried situated married employed educated named
    listed released set written directed produced nominated influenced affiliated endorsed founded owned called
    used worked made held acquired hired terminated composed edited performed distributed spoken adapted
    associated related contained included featured published classified derived honored awarded""".split())
_WAS = frozenset({"born", "buried", "educated", "founded", "married"})
# Verbs in the third person or the past, with their base form (for "does/did {entity} ...").
_VERBS = {w: b for pair in """plays:play leads:lead controls:control belongs:belong collaborates:collaborate
    competes:compete acts:act contains:contain produces:produce writes:write holds:hold represents:represent
    uses:use coaches:coach preys:prey works:work lives:live interacts:interact includes:include owns:own
    teaches:teach speaks:speak borders:border flows:flow participates:participate attends:attend creates:create
    develops:develop publishes:publish manufactures:manufacture sells:sell supports:support regulates:regulate
    causes:cause treats:treat affects:affect precedes:precede follows:follow performs:perform directs:direct
    prevents:prevent complicates:complicate diagnoses:diagnose measures:measure produced:produce
    occurs:occur exhibits:exhibit indicates:indicate manifests:manifest consists:consist carries:carry
    adjoins:adjoin connects:connect graduated:graduate won:win wrote:write created:create acquired:acquire
    acted:act played:play studied:study died:die lived:live came:come received:receive attended:attend
    competed:compete participated:participate coached:coach led:lead hired:hire terminated:terminate
    invented:invent discovered:discover founded:found joined:join married:marry designed:design
    composed:compose starred:star appeared:appear released:release influenced:influence co-occurs:co-occur
    assesses:assess analyzes:analyze manages:manage practices:practice disrupts:disrupt surrounds:surround
    interconnects:interconnect""".split()
          for w, b in [pair.split(":")]}
_PAST_OR_PARTICIPLE = frozenset(w for w in _VERBS if w.endswith(("ed", "en")) or w in {"won", "wrote", "came", "led"})
# NELL-style category nouns: the first word of a typed relation name ("athleteplaysforteam").
_TYPES = frozenset("""agent athlete city country person team organization location league sport stadium company
    animal arthropod bodypart chemical drug journalist publication newspaper televisionstation radiostation
    book writer musician musicartist instrument plant politician coach product state province trophy
    university school building river lake mountain island continent region county food beverage disease
    vehicle weapon bird fish mammal reptile insect event award movie film actor director profession
    geopoliticallocation sportsteam sportsgame writer""".split())
# Words a concatenated relation name ("concept:athleteplaysforteam") may be split into.
_LEXICON = frozenset(_PREPS | _COPULAS | _HAVE | _PASSIVE | set(_VERBS) | set(_VERBS.values()) | _TYPES | set(
    """home office residence capital part sub super mutual proxy synonym type body sports game games winner loser
    equipment fans product economic sector television station radio artist music genre mate teammate wife
    husband father mother parent child children sibling spouse member members headquarters inverse taller
    larger smaller geopolitical located within date also alias the a an and or us usa company companies
    agricultural growing grows grown specialization instance instances category stadiums leagues teams
    cities countries people persons arthropods animals plants player players leader leaders ceo president
    acquired subpart superpart known hometown birthplace nationality language languages
    tags tag rating votes year release actors actor imdb writer writers directors
    """.split()))
_TOKEN = re.compile(r"[^\w-]+|_+")
_ALIASES = {"isa": ["is", "a"], "subclassof": ["subclass", "of"], "instanceof": ["instance", "of"]}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAMESPACE = re.compile(r"^[A-Za-z]+:(?=\S)")


def _segment(token: str) -> list[str]:
    """``"athleteplaysforteam"`` -> ``["athlete", "plays", "for", "team"]`` over :data:`_LEXICON`
    (fewest words; a word may take a plural "s"); ``[token]`` when no full split exists."""
    def known(w: str) -> bool:
        return len(w) >= 2 and (w in _LEXICON or (w.endswith("s") and w[:-1] in _LEXICON and len(w) > 3))

    n = len(token)
    best: list[list[str] | None] = [None] * (n + 1)
    best[0] = []
    for i in range(1, n + 1):
        for j in range(max(0, i - 24), i):
            if best[j] is not None and known(token[j:i]):
                cand = best[j] + [token[j:i]]
                if best[i] is None or len(cand) < len(best[i]):
                    best[i] = cand
    return best[n] if best[n] and len(best[n]) > 1 else [token]


def _split_relation(relation: str) -> tuple[list[str], bool, bool]:
    """(lower-case words, inverse?, typed?) of a relation name of any naming style.

    ``typed``: a NELL-style name (``concept:athleteplaysforteam``) whose first word
    is the head's category and last word often the tail's.
    """
    base, inverse = relation.strip(), False
    for suffix in _INVERSE_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            base, inverse = base[: -len(suffix)], True
            break
    namespaced = bool(_NAMESPACE.match(base))
    base = _NAMESPACE.sub("", base)
    if "/" in base:  # Freebase path: the last segment of each "."-joined part (CVT relations)
        parts = [p for p in base.split(".") if p.strip("/")]
        segs = [[s for s in p.split("/") if s][-1] for p in parts]
    elif "." in base:  # dotted Freebase id: domain.type.property
        segs = [s for s in base.split(".") if s.strip()][-1:] or [base]
    else:
        segs = [base]
    out: list[list[str]] = []
    typed = False
    for seg in segs:
        words: list[str] = []
        for w in _TOKEN.split(_CAMEL.sub(" ", seg)):
            w = w.strip("-")
            if not w:
                continue
            w = w if (w.isupper() and len(w) > 1) else w.lower()
            if w in _ALIASES:
                words += _ALIASES[w]
            elif (namespaced or (len(segs) == 1 and len(re.split(r"[\W_]+", seg)) == 1 and len(w) >= 10)) \
                    and w.isalpha() and w.islower() and w not in _LEXICON:
                pieces = _segment(w)
                typed = typed or len(pieces) > 1 or namespaced
                words += pieces
            else:
                words.append(w)
        if words:  # a segment of punctuation alone ("a/._") has no words
            out.append([w for w in words if w != "s"] or words)
    # a CVT path whose last part is a verb phrase ("... award_nomination/nominated_for") asks that
    if len(out) > 1 and _kind(out[-1], False)[0] != "noun":
        out = [out[-1]]
    flat: list[str] = []
    for words in out:
        for w in words:
            if not flat or flat[-1].lower() != w.lower():
                flat.append(w)
    if not flat:
        flat = [w for w in re.split(r"[\W_]+", base) if w] or [base.strip() or relation]
    return flat, inverse, typed


def relation_words(relation: str) -> str:
    """Readable words of a relation name in any naming style (the inverse suffix dropped).

    ``/film/film/directed_by`` -> ``directed by``; ``royalty.chivalric_office.position_holders``
    -> ``position holders``; ``bornIn`` -> ``born in``; ``concept:athleteplaysforteam`` ->
    ``athlete plays for team``; ``starred_actors^-1`` -> ``starred actors``.  Freebase paths keep
    the last segment of each ``.``-joined part (``/film/actor/film./film/performance/film`` ->
    ``film``), repeated words collapse.  Concatenated names are split over a built-in lexicon of
    relation words (a token no full split covers stays whole).
    """
    return " ".join(_split_relation(relation)[0])


def _base(verb: str) -> str:
    """Base form of a third-person verb: :data:`_VERBS`, else "-ies" -> "-y", "-ches/-shes/-sses/-xes" lose
    "es", else the "s" goes ("deals" -> "deal")."""
    if verb in _VERBS:
        return _VERBS[verb]
    if verb.endswith("ies"):
        return verb[:-3] + "y"
    if verb.endswith(("ches", "shes", "sses", "xes")):
        return verb[:-2]
    return verb[:-1]


def _plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3


def _head_type(relation: str) -> list[str]:
    """Words of the head's type in a Freebase name: ``/film/film/country`` and ``film.film.country`` ->
    ``["film"]``; ``/location/administrative_division/country`` -> ``["administrative", "division"]``;
    ``[]`` for names without one."""
    base = relation.strip()
    for suffix in _INVERSE_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    if "/" in base:
        segs = [s for s in base.split(".")[0].split("/") if s]
    elif "." in base and not _NAMESPACE.match(base):
        segs = [s for s in base.split(".") if s]
    else:
        return []
    if len(segs) < 3:
        return []
    return [w.lower() for w in _TOKEN.split(_CAMEL.sub(" ", segs[-2])) if w.strip("-") and w.isalnum()]


def _kind(words: list[str], typed: bool, head_type: Sequence[str] = ()) -> tuple[str, dict[str, str]]:
    """The question shape of ``words`` and its template fields (see :func:`fallback_templates`).

    ``head_type``: the head's type words (Freebase), named in the question ("the film {entity}",
    "Which film ...") so that same-named properties of different types ask different questions.
    """
    w = list(words)
    domain: list[str] = []
    if typed and len(w) >= 2 and w[0] in _TYPES:
        domain, w = w[:1], w[1:]
    who_d = f"Which {' '.join(domain)}" if domain else "Who or what"
    subject = ENTITY_SLOT
    if not domain and head_type and list(head_type) != w:
        subject = f"the {' '.join(head_type)} {ENTITY_SLOT}"
        who_d = f"Which {' '.join(head_type)}"
    fields = _kind_fields(w, typed, domain, who_d)
    kind = fields.pop("kind")
    fields.setdefault("subject", subject)
    fields.setdefault("who", who_d)
    if kind == "noun":
        fields["who_have"] = f"{who_d} has" if who_d != "Who or what" else "Which entities have"
        fields["their"] = "its" if who_d != "Who or what" else "their"
    return kind, fields


def _kind_fields(w: list[str], typed: bool, domain: list[str], who_d: str) -> dict[str, str]:
    if w[0] in _HAVE and len(w) > 2 and (w[1] in _PAST_OR_PARTICIPLE or w[1] in _PASSIVE):
        # perfect tense: "has won prize" -> "What prize has {entity} won?"
        p = max((k for k, x in enumerate(w[2:], 2) if x in _PREPS), default=-1)
        mid, rng = (w[2: p + 1], w[p + 1:]) if p >= 0 else ([], w[2:])
        return {"kind": "verb", "what": f"{'Which' if typed else 'What'} {' '.join(rng)}" if rng else "Who or what",
                "aux": "has", "base": " ".join([w[1]] + mid), "words": " ".join(["has", w[1]] + mid)}
    if w[0] in _HAVE and len(w) > 1:
        rest = w[1:]
        return {"kind": "have", "words": " ".join(rest), "verb": w[0] if w[0] != "have" else "has",
                "as": "among" if _plural(rest[-1]) else "as"}
    if w[0] in _COPULAS and len(w) > 1:
        rest = w[1:] + (["kind", "of"] if w[1:] == ["a"] else [])
        return {"kind": "copula", "be": w[0], "words": " ".join(rest), "what": "Who or what"}
    if w[0] in _PREPS and len(w) > 1 and not domain:
        return {"kind": "prep", "prep": w[0].capitalize(), "prep_lower": w[0], "words": " ".join(w[1:])}
    start = 1 if len(w) > 1 and w[0].endswith("ly") else 0  # "conceptually related to"
    v = next((k for k in range(start, len(w)) if w[k] in _VERBS or w[k] in _PASSIVE
              or (k == start and len(w) > k + 1 and w[k + 1] in _PREPS and _plural(w[k]))), -1)
    if v >= 0 and (v == start or domain):
        verb, after = w[v], w[v + 1:]
        p = max((k for k, x in enumerate(after) if x in _PREPS), default=-1)
        mid, rng = (after[: p + 1], after[p + 1:]) if p >= 0 else ([], after)
        if not (rng and not typed and p < 0):  # "starred actors", "featured film locations": a noun phrase
            what = f"{'Which' if typed else 'What'} {' '.join(rng)}" if rng else "Who or what"
            lead = w[start:v] if not domain else []
            passive = (verb in _PASSIVE and mid[:1] and mid[0] in _PREPS) or (
                mid[-1:] == ["by"] and verb.endswith(("ed", "en")))
            if passive:
                return {"kind": "copula", "be": "was" if verb in _WAS else "is",
                        "words": " ".join(w[:start] + lead + [verb] + mid), "what": what}
            if verb not in _PASSIVE or verb in _VERBS:
                aux = "did" if verb in _PAST_OR_PARTICIPLE else "does"
                base = _base(verb) if aux == "does" else _VERBS.get(verb, verb)
                return {"kind": "verb", "what": what, "aux": aux, "base": " ".join(w[:start] + [base] + mid),
                        "words": " ".join(w[:start] + [verb] + mid)}
    if len(w) >= 2 and w[-1] in _PREPS:  # "part of", "location of", "story by": a role of the entity
        return {"kind": "copula", "be": "is", "words": "the " + " ".join(w), "what": "Who or what",
                "subject": ENTITY_SLOT}
    if typed and "of" in w[1:-1]:  # NELL "capital of country" with the domain "city" removed
        p = w.index("of")
        return {"kind": "copula", "be": "is", "words": "the " + " ".join(w[: p + 1]),
                "what": f"Which {' '.join(w[p + 1:])}"}
    return {"kind": "noun", "words": " ".join(w), "be": "are" if _plural(w[-1]) else "is",
            "as": "among" if _plural(w[-1]) else "as"}


#: Most characters of a relation's words (and of its head type's) a fallback question quotes.
_MAX_WORDS_CHARS = 60


def _first_words(words: list[str], limit: int) -> list[str]:
    """The first of ``words`` whose joined length stays within ``limit`` (a longer first word cut to it)."""
    out: list[str] = []
    size = -1
    for w in words:
        if size + 1 + len(w) > limit:
            if not out:
                out.append(w[:limit])
            break
        out.append(w)
        size += 1 + len(w)
    return out


def fallback_templates(relation: str) -> tuple[str, str]:
    """(forward, inverse) question templates of ``relation``'s name, without an LLM.

    The forward one asks for the tails of a head ``{entity}``, the inverse one for the heads of a
    tail.  The shape follows the name: a noun (``genre`` -> "Who or what is the genre of
    {entity}?"), a passive (``directed_by`` -> "Who or what is {entity} directed by?"), "has"
    (``has_tags`` -> "What tags does {entity} have?"), a preposition (``in_language`` -> "In
    which language is {entity}?"), a verb (``concept:athleteplaysforteam`` -> "Which team does
    {entity} play for?", inverse "Which athlete plays for {entity}?").  A Freebase name's head
    type is named ("Who or what is the country of the film {entity}?", "Which film has {entity} as
    its country?"): of FB15k-237's 474 names, 22 (8 groups, e.g. the four ``current_roster`` positions)
    then share a question, which :class:`~llm_bridge.relations.RelationQuestions` qualifies; 72 did
    with the property words alone.
    Templates are package data (``fallback_forward.txt``, ``fallback_inverse.txt``,
    ``fallback_<shape>_forward.txt`` / ``_inverse.txt``).
    """
    words, _, typed = _split_relation(relation)
    # A very long name would make a template over clean_question_template's 300 characters: keep the
    # first words of the name and of its head type (so every relation has a fallback; RelationQuestions
    # qualifies the clashes this may make).
    kind, fields = _kind(_first_words(words, _MAX_WORDS_CHARS), typed,
                         _first_words(_head_type(relation), _MAX_WORDS_CHARS))
    out = []
    for direction in ("forward", "inverse"):
        name = f"fallback_{kind}_{direction}" if kind != "noun" else f"fallback_{direction}"
        t = clean_question_template(render(name, **fields))
        if t is None:  # pragma: no cover - the packaged templates hold one slot
            raise ValueError(f"template {name!r} must hold exactly one {ENTITY_SLOT}")
        out.append(" ".join(t.split()))
    return out[0], out[1]


def fallback_template(relation: str) -> str:
    """The question template of ``relation`` without an LLM (:func:`fallback_templates`; an inverse
    name, ``X^-1`` or NELL's ``X_inv``, asks X's inverse question).

    ``directed_by`` -> ``Who or what is {entity} directed by?``;
    ``directed_by^-1`` -> ``Who or what is directed by {entity}?``.
    """
    forward, inverse = fallback_templates(relation)
    return inverse if _split_relation(relation)[1] else forward


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
