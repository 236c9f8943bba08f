"""Entity linking: LLM answer strings -> KG entity ids, every string accounted for.

A real LLM writes "Intel Corporation", "the Hale Telescope", "IBM", "Hanks, Tom"
where the KG says "Intel", "Hale telescope", "International Business
Machines", "Tom Hanks"; and a wrong link is worse than none (it becomes the
next hop's input).  The tests for one string, in order, first hit wins:

1. **exact**: the string is an entity's name, or its :func:`normalize` form
   (case, accents, punctuation, articles, underscores, Freebase ids and paths
   do not matter) is the normalised form of an entity's name;
2. **alias**: the normalised form is an alias: the caller's ``aliases``, the
   readable names of a names file (FB15k-237's ``id2ent.tsv``: mid, KG-BERT
   name and Wikidata label; a two-column ``entity2text`` file), the bare name
   of an entity named ``X (qualifier)`` (only a *trailing* parenthesised
   qualifier counts), the string without its own trailing qualifier ("Kismet
   (film)" -> "Kismet"), or the :func:`loose_form` (corporate suffixes such
   as Inc/Corporation/Ltd/Co dropped, punctuation inside a word dropped:
   "Intel Corporation" -> "Intel", "Spiderman" -> "Spider-Man");
3. **acronym**: a string written as an acronym ("UNHCR", "U.S.A.") whose
   letters are the initials of exactly one entity's name (with or without the
   words of/the/and/...); acronyms shorter than ``min_acronym_letters`` (4) only
   link to an entity the caller's ``prefer`` scores above 0, as a unique
   3-letter match is often chance on a large KG (see ``EntityLinker``).  An
   acronym is never fuzzy-matched;
4. **fuzzy**: typos and reordered tokens ("Hanks, Tom").  The 20 nearest names
   by rapidfuzz ``token_sort_ratio`` (one vectorised ``process.extract`` over
   the whole name table) are rescored by :func:`aligned_score` -- token by
   token, so "Bo Jackson" is *not* "Jackson Bond" although their
   ``token_sort_ratio`` is 90.9 -- and the best is accepted when its score is
   ``>= threshold`` and the string has at least ``min_fuzzy_chars`` characters;
5. **acronym**, the other way: a written-out name of >= 3 content words whose
   initials (>= ``min_acronym_letters``) are an entity's all-capitals name;
6. **embedding** (optional, ``embedding="minilm"``): the nearest name by cosine
   of a sentence encoder from :mod:`engine.paths.embeddings`' registry, for
   paraphrases, accepted at ``>= embedding_threshold`` with a margin over the
   second entity.

A form shared by several entities links only when it is decided: a single
candidate, else the single candidate holding it as its own name (not an
alias), else the caller's ``prefer`` scores (e.g. the node's KG values) with a
unique positive maximum, else -- own names equal after normalisation only
(MetaQA's film "Gold" and tag "gold") -- the one closest in raw form.  Otherwise the string is *ambiguous* and stays
unlinked: "Michael Jackson" never links to "Michael Jackson (American football
linebacker)" while another "Michael Jackson (...)" exists.  A fuzzy tie between
entities is ambiguous too.

**Links that respect the relation.**  A linker built with :class:`RelationRanges`
(``EntityLinker.from_artifact`` builds them from the artifact's observed triples)
links ``link(text, relation=r)`` only to entities of the right kind for ``r``: the
entities ``r`` reaches as tails in the KG (for an inverse ``X^-1``: the heads of
``X``), widened to the ranges of relations whose range overlaps ``r``'s (see
:class:`RelationRanges`), plus the entities no observed triple mentions (the KG
cannot tell their kind).  The alias, acronym, fuzzy and embedding rules only
consider entities in that set: "Movie B" no longer links the tag "b-movie" when
the question asks for films, "Jean-Claude Van Damme" not the film "JCVD" when it
asks for actors.  An **exact** name (the string is an entity's own name, up to
:func:`normalize`) still links out of the range -- an exact name is the strongest
evidence the linker has, and the range comes from an incomplete KG -- but among
several entities of that name an in-range one wins, and an out-of-range link
says so (``Link.in_range`` is ``False``, ``"in_range": false`` in the trace).
Matches a rule found outside the range are reported (``Link.out_of_range``) and
an unlinked string whose only matches were outside it has the reason
``"out of range"``.  Without ranges (or with ``relation=None``) nothing changes.

The loose form joins words only across punctuation, never across a space:
"Spiderman" links "Spider-Man", "Deadpool" does not link "The Dead Pool" (two
words: another title).

Every string gets a :class:`Link`: how it linked (``method``), the score, and
for an unlinked one the reason and the closest KG names with their scores.
The default threshold is calibrated on a labelled MetaQA set
(:mod:`experiments.linkeval`, see :data:`DEFAULT_THRESHOLD`).
"""
from __future__ import annotations

import csv
import operator
import os
import re
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kgreason.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

__all__ = ["normalize", "loose_key", "loose_form", "aligned_score", "acronyms", "Link", "EntityLinker",
           "RelationRanges", "load_names_file", "SCORERS", "METHODS", "DEFAULT_THRESHOLD",
           "DEFAULT_EMBEDDING_THRESHOLD", "WIDEN_OVERLAP"]

#: Fuzzy scorers a linker accepts: ``"aligned"`` (:func:`aligned_score`, the default) or the
#: name of a ``rapidfuzz.fuzz`` function, used on its own (the pre-calibration behaviour).
SCORERS = ("aligned", "token_sort_ratio", "token_set_ratio", "ratio", "WRatio", "QRatio")
#: How a string linked (``Link.method``); ``None`` for an unlinked string.
METHODS = ("exact", "alias", "acronym", "fuzzy", "embedding")
#: Default fuzzy threshold (``aligned`` score, 0-100), calibrated with ``python -m
#: experiments.linkeval --kb ../shared/data/metaqa/kb.txt --per-kind 400`` (and the former ``--baseline-rev 0a51aa3``)
#: (seed 0): 5,505 labelled strings (4,000 LLM-style variants of 41,472 MetaQA names, 1,505 hard
#: negatives).  At 82, precision 0.994 and recall 0.921 (the best F0.5 among the thresholds from
#: which precision stays >= 0.95; 62 gives 0.945); the previous linker (token_sort_ratio >= 90)
#: measured 0.871 / 0.713 on the same set.  Sweep: benchmarks/results/lgot/linking.md.  With the
#: wrong-kind strings of issue 32 (7,219 strings, each with its relation) 82 is still the choice: precision
#: 0.989, recall 0.922 with the relation's range (0.775 / 0.921 for the linker before it, 0467476).
DEFAULT_THRESHOLD = 82.0
#: Default cosine (x 100) for the optional embedding matcher.
DEFAULT_EMBEDDING_THRESHOLD = 90.0
#: Candidates the vectorised fuzzy search hands to the token-aligned rescoring.
FUZZY_CANDIDATES = 20
#: Closest names an unlinked :class:`Link` reports.
NEAREST = 5
#: :class:`RelationRanges` widening: relation ``r``'s range takes in the range of every relation
#: ``r'`` with ``|range(r) & range(r')| >= WIDEN_OVERLAP * min(|range(r)|, |range(r')|)``.  Measured on
#: held-out edges (answers a KG-only range misses): MetaQA with half its edges held out (linkeval's
#: "Relation ranges on held-out edges", seed 0), the share of held-out answers inside the range goes
#: 0.618 (observed range) -> 0.904 (widened at 0.3) -> 0.995 (plus the entities no observed triple
#: mentions), while the widened range admits 0.01% of the entities of another kind (film/person/tag/...);
#: FB15k-237 (ranges of train.txt, answers of valid+test): 0.834 -> 0.997, the allowed share of the
#: entities 6.4% -> 19.4%; an overlap of 0.5 gives 0.993, 0.1 gives 0.999 at 28.8% (docs/llm.md,
#: "Links that respect the relation").
WIDEN_OVERLAP = 0.3

_MID = re.compile(r"^/?m[./]([0-9a-z_]+)$")
_PATH = re.compile(r"^/[\w./-]+$")
_APOSTROPHES = re.compile(r"['\u2019\u2018`\u00b4]")
_ARTICLE = re.compile(r"^(?:the|a|an)\s+(?=\S)")
_TRAILING_ARTICLE = re.compile(r",\s*(?:the|a|an)\s*$", re.IGNORECASE)
# Only a trailing parenthesised qualifier is a disambiguation: "Michael Jackson (singer)".
_QUALIFIER = re.compile(r"^(.*\S)\s*\(([^()]*)\)\s*$")
_CORPORATE = re.compile(r"(?:\s+(?:inc|incorporated|corp|corporation|co|company|ltd|limited|llc|plc|gmbh|ag"
                        r"|sa|lp|llp|pty|nv|bv|srl|spa))+$")
_ACRONYM_TEXT = re.compile(r"^(?:[A-Z]\.?\s?){2,8}$")
_STOPWORDS = frozenset("of the and for a an in on at de du la le to".split())
_ARTICLES_AND = frozenset("of the and a an".split())


def normalize(text: str, *, strip_articles: bool = True) -> str:
    """The comparison form of a name: casefolded, no accents or punctuation, single spaces.

    ``"The Beatles"``, ``"beatles, the"``, ``"Beatles"`` -> ``"beatles"``;
    ``"Zoë_Saldaña"`` -> ``"zoe saldana"``; ``"m.027rn"`` / ``"/m/027rn"`` ->
    ``"/m/027rn"`` (a Freebase mid stays an id); ``"/en/tom_hanks"`` (a path) ->
    ``"tom hanks"``; ``"Ender's Game"`` -> ``"enders game"``; ``"AT&T"`` -> ``"at and t"``.
    """
    s = unicodedata.normalize("NFKD", str(text))
    s = "".join(c for c in s if not unicodedata.combining(c)).casefold().strip()
    m = _MID.match(s)
    if m:
        return f"/m/{m.group(1)}"
    if _PATH.match(s) and " " not in s:
        s = s.rstrip("/").rsplit("/", 1)[-1]
    if strip_articles:
        s = _TRAILING_ARTICLE.sub("", s)
    s = _APOSTROPHES.sub("", s).replace("&", " and ")
    s = "".join(c if c.isalnum() else " " for c in s.replace("_", " "))
    s = " ".join(s.split())
    if strip_articles:
        s = _ARTICLE.sub("", s)
    return s


def loose_key(key: str) -> str:
    """A normalised form without corporate suffixes: ``"intel corporation"`` -> ``"intel"``,
    ``"acme co ltd"`` -> ``"acme"``; a key that would become empty is kept (``"co"`` -> ``"co"``).

    Spaces stay: two words are not one word ("dead pool" is not "deadpool").
    """
    if key.startswith("/m/"):
        return key
    return _CORPORATE.sub("", key) or key


def loose_form(text: str) -> str:
    """The loose form of a raw name: punctuation dropped *without* splitting the word, then
    :func:`loose_key`.  ``"Spider-Man"`` and ``"Spiderman"`` -> ``"spiderman"``; ``"E.T."`` -> ``"et"``;
    ``"Walt Disney Studios, Inc."`` -> ``"walt disney studios"``; ``"The Dead Pool"`` -> ``"dead pool"``,
    which ``"Deadpool"`` (``"deadpool"``) is not: the words of a name are only joined where the name
    itself joins them with punctuation.  Freebase ids stay ids.
    """
    key = normalize(text)
    if key.startswith("/m/"):
        return key
    joined = "".join(c for c in str(text) if c in "_&/" or not unicodedata.category(c).startswith("P"))
    return loose_key(normalize(joined) or key)


def acronyms(key: str) -> set[str]:
    """Initials of a normalised name of >= 2 words, with and without the small words of/the/and/...

    ``"international business machines"`` -> ``{"ibm"}``; ``"bank of america"`` -> ``{"boa", "ba"}``;
    ``"in the company of men"`` -> ``{"itcom", "icm", "cm"}`` (all words; without of/the/and/a/an;
    without every small word).
    """
    words = _CORPORATE.sub("", key).split() if not key.startswith("/m/") else []
    out = set()
    for ws in (words, [w for w in words if w not in _ARTICLES_AND], [w for w in words if w not in _STOPWORDS]):
        if len(ws) >= 2 and all(w[0].isalpha() for w in ws):
            out.add("".join(w[0] for w in ws))
    return out


def _acronym_of_text(text: str) -> str | None:
    """The letters of ``text`` when it is written as an acronym ("IBM", "U.S.A.", "UNESCO"), else None."""
    t = text.strip()
    if not _ACRONYM_TEXT.match(t) or sum(c.isupper() for c in t) < 2:
        return None
    letters = "".join(c for c in t if c.isalpha())
    return letters.casefold() if 2 <= len(letters) <= 8 else None


def aligned_score(a: str, b: str) -> float:
    """Token-aligned similarity of two normalised names, 0-100.

    Tokens are paired greedily by ``rapidfuzz.fuzz.ratio`` (best pair first); the
    score is the *weakest* pair's ratio, capped by ``token_sort_ratio`` of the
    whole strings.  A token left without a partner scores 0, except one-letter
    tokens (initials) when the other side has more tokens and two words remain
    ("robert l zemeckis" / "robert zemeckis": 100; "m ward" / "ward": 0).  So a typo in one
    token costs that token's ratio ("tom hansk" / "tom hanks": 80) while a
    different short token is a different name ("bo jackson" / "jackson bond":
    66.7, "tim hanks" / "tom hanks": 66.7).
    """
    from rapidfuzz import fuzz

    ta, tb = a.split(), b.split()
    if not ta or not tb:
        return 0.0
    if len(ta) != len(tb):  # dropped middle initials do not count against a name of >= 2 other words
        ta2 = [t for t in ta if not (len(t) == 1 and t.isalpha())] if len(ta) > len(tb) else ta
        tb2 = [t for t in tb if not (len(t) == 1 and t.isalpha())] if len(tb) > len(ta) else tb
        if len(ta2) != len(tb2) or len(ta2) < 2:  # "m ward" is not "ward", "machine 2" not "machine"
            return 0.0
        ta, tb = ta2, tb2
    pairs = sorted(((fuzz.ratio(x, y), i, j) for i, x in enumerate(ta) for j, y in enumerate(tb)), reverse=True)
    used_a: set[int] = set()
    used_b: set[int] = set()
    weakest = 100.0
    for s, i, j in pairs:
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        weakest = min(weakest, s)
    if len(used_a) < len(ta):
        return 0.0
    return float(min(weakest, fuzz.token_sort_ratio(" ".join(ta), " ".join(tb))))


@dataclass(frozen=True)
class Link:
    """How one answer string was linked.

    ``entity``/``name``: the KG entity (``None`` when unlinked); ``method``: one
    of :data:`METHODS` or ``None``; ``score``: 100 for exact, alias and acronym
    matches, the fuzzy score (0-100) for fuzzy ones, cosine x 100 for embedding
    ones, and for an unlinked string the closest candidate's score;
    ``candidates``: entities sharing the matched form; ``closest``: the closest
    name of an unlinked string (``None`` when there is none); ``nearest``: for
    an unlinked string up to :data:`NEAREST` ``(KG name, score)`` pairs, best
    first; ``reason`` (unlinked only): ``"empty"``, ``"ambiguous"`` (several
    entities fit equally), ``"too short"`` (for fuzzy matching),
    ``"acronym"`` (an acronym matching no entity, never fuzzy-matched), ``"below threshold"``,
    ``"no exact match"`` (fuzzy off), ``"no names"`` or ``"out of range"`` (a rule matched, but only
    entities outside the relation's range); ``in_range``: ``None`` when no range applied, else
    whether the linked entity is in it (only an exact name links outside it); ``out_of_range``:
    ``(KG name, method, score)`` of matches rejected as outside the range (up to :data:`NEAREST`).
    """

    text: str
    entity: int | None
    name: str | None
    method: str | None
    score: float
    candidates: int = 0
    closest: str | None = None
    nearest: tuple[tuple[str, float], ...] = ()
    reason: str | None = None
    in_range: bool | None = None
    out_of_range: tuple[tuple[str, str, float], ...] = ()

    @property
    def linked(self) -> bool:
        return self.entity is not None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text, "entity": self.name, "id": self.entity, "method": self.method,
                             "score": round(float(self.score), 2)}
        if self.candidates > 1:
            d["candidates"] = self.candidates
        if self.entity is None:
            if self.closest is not None:
                d["closest"] = self.closest
            if self.nearest:
                d["nearest"] = [[n, round(float(s), 2)] for n, s in self.nearest]
            if self.reason is not None:
                d["reason"] = self.reason
        if self.in_range is False:
            d["in_range"] = False
        if self.out_of_range:
            d["out_of_range"] = [[n, m, round(float(s), 2)] for n, m, s in self.out_of_range]
        return d


def _rapidfuzz():
    try:
        from rapidfuzz import fuzz, process
    except ImportError:  # pragma: no cover - rapidfuzz is in the [llm] extra
        raise UserError("entity linking needs rapidfuzz: pip install -e '.[llm]'") from None
    return fuzz, process


class RelationRanges:
    """Which entities each relation can reach, judged from a KG's triples (see the module doc).

    ``allowed(r)`` is a boolean mask over the entities: the relation's *range* (the
    tails of its triples, and for a relation with an inverse the heads of the
    inverse's triples, so ``X^-1`` reaches the heads of ``X``), **widened** to the
    range of every relation ``r'`` whose range overlaps it by ``>= widen`` of the
    smaller of the two (:data:`WIDEN_OVERLAP`; ``None``: no widening), plus (``unknown=True``)
    every entity no triple mentions.  Why widened: a range read off a KG with missing
    edges misses answers -- a sparse relation's range is a handful of entities, a
    director whose directing edges were held out is in no ``directed_by`` range --
    while a relation whose range overlaps ``r``'s names entities of the same kind
    (MetaQA: ``directed_by`` and ``written_by``; every ``X^-1`` of a film relation).
    Why the unmentioned entities: the KG cannot tell their kind, so it cannot call
    them the wrong kind.  The numbers behind the default are at :data:`WIDEN_OVERLAP`.

    Args:
        triples: ``(E, 3)`` int ``(head, relation, tail)`` ids: the KG's *observed*
            triples (never held-out test edges: that would read the answers off them).
        num_entities, num_relations: id ranges.
        inverse: per relation, its inverse's id or -1 (default: none known).
        widen: overlap in (0, 1] that makes two ranges one kind, or ``None``.
        unknown: also allow the entities no triple mentions.
    """

    def __init__(self, triples: Any, *, num_entities: int, num_relations: int,
                 inverse: Sequence[int] | None = None, widen: float | None = WIDEN_OVERLAP,
                 unknown: bool = True) -> None:
        import numpy as np
        import scipy.sparse as sp

        n, r = int(num_entities), int(num_relations)
        if n < 0 or r < 0:
            raise UserError(f"relation ranges: counts must be >= 0, got {n} entities, {r} relations")
        if widen is not None and not 0.0 < float(widen) <= 1.0:
            raise UserError(f"relation ranges: widen must be in (0, 1] or None, got {widen}")
        t = np.asarray(triples, dtype=np.int64)
        if t.size == 0:
            t = t.reshape(0, 3)
        if t.ndim != 2 or t.shape[1] != 3:
            raise UserError(f"relation ranges: triples must be (E, 3) head/relation/tail ids, got shape {t.shape}")
        bad = (t[:, [0, 2]] < 0).any(axis=1) | (t[:, [0, 2]] >= n).any(axis=1) | (t[:, 1] < 0) | (t[:, 1] >= r)
        if bad.any():
            k = int(np.argmax(bad))
            raise UserError(f"relation ranges: triple {k} {t[k].tolist()} is outside {n} entities / {r} relations")
        inv = np.full(r, -1, dtype=np.int64) if inverse is None else np.asarray(inverse, dtype=np.int64).reshape(-1)
        if len(inv) != r or ((inv < -1) | (inv >= r)).any():
            raise UserError(f"relation ranges: inverse must give {r} relation ids or -1")
        rows, cols = [t[:, 1]], [t[:, 2]]
        has = inv[t[:, 1]] >= 0
        rows.append(inv[t[has, 1]])
        cols.append(t[has, 0])
        rr, cc = np.concatenate(rows), np.concatenate(cols)
        inc = sp.csr_matrix((np.ones(len(rr), dtype=np.int64), (rr, cc)), shape=(r, n))
        inc.sum_duplicates()
        inc.data[:] = 1
        self.num_entities, self.num_relations = n, r
        self.widen, self.unknown = widen, bool(unknown)
        self._inc = inc
        #: entities in each relation's own range (before widening)
        self.sizes = np.diff(inc.indptr)
        if widen is None:
            self._siblings = [np.array([k]) for k in range(r)]
        else:
            inter = (inc @ inc.T).toarray()
            small = np.minimum(self.sizes[:, None], self.sizes[None, :])
            sib = (inter > 0) & (inter >= float(widen) * small)
            np.fill_diagonal(sib, True)
            self._siblings = [np.nonzero(row)[0] for row in sib]
        seen = np.zeros(n, dtype=bool)
        seen[t[:, 0]] = True
        seen[t[:, 2]] = True
        self._unseen = ~seen
        self._masks: dict[int, Any] = {}

    @classmethod
    def from_artifact(cls, artifact: "Artifact", **kwargs: Any) -> "RelationRanges":
        """The ranges of ``artifact``'s observed triples (``X`` and ``X^-1`` paired by name)."""
        return cls(artifact.observed, num_entities=artifact.num_entities, num_relations=artifact.num_relations,
                   inverse=[artifact.inverse_relation(r) for r in range(artifact.num_relations)], **kwargs)

    def siblings(self, relation: int) -> list[int]:
        """The relations whose range widens ``relation``'s (itself included)."""
        return [int(k) for k in self._siblings[self._check(relation)]]

    def _check(self, relation: Any) -> int:
        try:
            r = operator.index(relation)
        except TypeError:
            r = None
        if r is None or isinstance(relation, bool):
            raise UserError(f"relation ranges: relation must be an id, got {relation!r}")
        if not 0 <= r < self.num_relations:
            raise UserError(f"relation ranges: relation id {r} out of range [0, {self.num_relations})")
        return r

    def allowed(self, relation: int) -> Any:
        """Boolean mask ``(num_entities,)`` of the entities of the right kind for ``relation`` (cached; do not modify)."""
        import numpy as np

        r = self._check(relation)
        mask = self._masks.get(r)
        if mask is None:
            mask = np.zeros(self.num_entities, dtype=bool)
            for k in self._siblings[r]:
                lo, hi = self._inc.indptr[k], self._inc.indptr[k + 1]
                mask[self._inc.indices[lo:hi]] = True
            if self.unknown:
                mask |= self._unseen
            mask.setflags(write=False)
            self._masks[r] = mask
        return mask

    def strict(self, relation: int) -> Any:
        """Boolean mask of ``relation``'s own range (no widening, no unmentioned entities)."""
        import numpy as np

        r = self._check(relation)
        mask = np.zeros(self.num_entities, dtype=bool)
        mask[self._inc.indices[self._inc.indptr[r]:self._inc.indptr[r + 1]]] = True
        return mask


class EntityLinker:
    """Links strings to the ids of ``names`` (an artifact's entity names, id = position).

    Args:
        names: entity names, id = index.
        aliases: extra names, alias -> entity (id, exact name, or a list of them).
        threshold: fuzzy acceptance, score in [0, 100] (``>=`` accepts); default
            :data:`DEFAULT_THRESHOLD` (calibrated, see there).
        scorer: one of :data:`SCORERS` (default ``"aligned"``).
        min_fuzzy_chars: shorter normalised strings are never fuzzy-matched.
        fuzzy: turn the fuzzy step off.
        acronyms: turn the acronym step off.
        min_acronym_letters: shorter acronyms ("IBM") link only to an entity ``prefer`` scores
            above 0 (the KG already believes it): on MetaQA's 41k names a unique 3-letter match
            was wrong 68 times in 153 (held-out names' acronyms), one of 4+ letters 5 in 64.
        embedding: ``None`` (off), an encoder name of :mod:`engine.paths.embeddings`
            (``"minilm"``) or an encoder object; encodes every name on first use.
        embedding_threshold: cosine x 100 an embedding match needs.
        embedding_margin: cosine x 100 the best entity must lead the next one by.
        ranges: :class:`RelationRanges` over these entities: ``link(..., relation=r)`` then only
            links entities of the right kind for ``r`` (see the module doc); ``None``: no ranges,
            ``relation`` is ignored.
    """

    def __init__(self, *, names: Sequence[str], aliases: Mapping[str, Any] | None = None,
                 threshold: float = DEFAULT_THRESHOLD, scorer: str = "aligned", min_fuzzy_chars: int = 4,
                 fuzzy: bool = True, acronyms: bool = True, min_acronym_letters: int = 4, embedding: Any = None,
                 embedding_threshold: float = DEFAULT_EMBEDDING_THRESHOLD, embedding_margin: float = 2.0,
                 ranges: RelationRanges | None = None) -> None:
        if not 0.0 <= float(threshold) <= 100.0:
            raise UserError(f"linking threshold must be in [0, 100], got {threshold}")
        if not 0.0 <= float(embedding_threshold) <= 100.0:
            raise UserError(f"embedding linking threshold must be in [0, 100], got {embedding_threshold}")
        if scorer not in SCORERS:
            raise UserError(f"unknown linking scorer {scorer!r}; expected one of {', '.join(SCORERS)}")
        fuzz, _ = _rapidfuzz()
        self._retrieve = fuzz.token_sort_ratio if scorer == "aligned" else getattr(fuzz, scorer)
        self._rescore = aligned_score if scorer == "aligned" else None
        self.scorer = scorer
        self.threshold = float(threshold)
        self.min_fuzzy_chars = int(min_fuzzy_chars)
        self.fuzzy = bool(fuzzy)
        self.use_acronyms = bool(acronyms)
        self.min_acronym_letters = int(min_acronym_letters)
        self.embedding_spec = embedding
        self.embedding_threshold = float(embedding_threshold)
        self.embedding_margin = float(embedding_margin)
        self.names = list(names)
        if ranges is not None and (not isinstance(ranges, RelationRanges) or ranges.num_entities != len(self.names)):
            raise UserError(f"linker ranges must be RelationRanges over the {len(self.names)} names, got "
                            + (f"ranges over {ranges.num_entities}" if isinstance(ranges, RelationRanges)
                               else type(ranges).__name__))
        self.ranges = ranges
        self._exact: dict[str, int] = {}
        for i, n in enumerate(self.names):
            self._exact.setdefault(n, i)
        # normalised form -> {id: True if it is the entity's own name, False if an alias}
        self._keys: dict[str, dict[int, bool]] = {}
        # normalised form of an all-capitals name ("IBM") -> ids, for full names written out
        self._caps: dict[str, dict[int, bool]] = {}
        # loose form (loose_form) -> ids
        self._loose: dict[str, dict[int, bool]] = {}
        self._derived: dict[str, Any] | None = None
        self._memo: dict[tuple[str, int], list[tuple[str, float]]] = {}
        self._scopes: dict[int, tuple[Any, Any, list[str]]] = {}  # id(mask) -> (mask, key mask, choices)
        for i, n in enumerate(self.names):
            self._add(n, i, True)
        if aliases:
            self.add_aliases(aliases)

    def _add(self, raw: str, i: int, own: bool) -> None:
        key = normalize(raw)
        if not key:
            return
        self._put(self._keys, key, i, own)
        self._put(self._loose, loose_form(raw), i, own)
        m = _QUALIFIER.match(raw)
        if m:  # "X (qualifier)" is also reachable as a bare "X", as an alias (own names win over it)
            bare = normalize(m.group(1))
            if bare:
                self._put(self._keys, bare, i, False)
                self._put(self._loose, loose_form(m.group(1)), i, False)
        if _acronym_of_text(raw) is not None and " " not in raw.strip():
            self._put(self._caps, key.replace(" ", ""), i, own)
        self._derived = None  # acronym/fuzzy tables are rebuilt on the next lookup
        self._memo.clear()
        self._scopes.clear()

    @staticmethod
    def _put(table: dict[str, dict[int, bool]], key: str, i: int, own: bool) -> None:
        d = table.setdefault(key, {})
        d[i] = d.get(i, False) or own

    def add_aliases(self, aliases: Mapping[str, Any]) -> None:
        """Add ``alias -> entity`` pairs (entity: id, exact name, or a list of them)."""
        n = len(self.names)
        for alias, target in aliases.items():
            targets = target if isinstance(target, (list, tuple, set, frozenset)) else [target]
            for t in targets:
                if isinstance(t, str):
                    if t not in self._exact:
                        raise UserError(f"alias {alias!r}: unknown entity {t!r}")
                    t = self._exact[t]
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n:
                    raise UserError(f"alias {alias!r}: entity id {t!r} out of range [0, {n})")
                self._add(str(alias), int(t), False)

    @classmethod
    def from_artifact(cls, artifact: "Artifact", *, names_file: str | os.PathLike | None = None,
                      aliases: Mapping[str, Any] | None = None, ranges: "bool | RelationRanges" = True,
                      **kwargs: Any) -> "EntityLinker":
        """A linker over ``artifact``'s entities, with the aliases of ``names_file``.

        ``names_file`` defaults to an ``id2ent.tsv`` / ``entity2text.txt`` next to
        the artifact's source (``meta.json["source"]``) when one exists.  ``ranges``:
        ``True`` (default) builds :class:`RelationRanges` from the artifact's observed
        triples (``link(..., relation=r)`` then respects them), ``False`` none.
        """
        if ranges is True:
            ranges = RelationRanges.from_artifact(artifact)
        linker = cls(names=artifact.entities, aliases=aliases, ranges=ranges or None, **kwargs)
        path = Path(names_file) if names_file is not None else _default_names_file(artifact)
        if path is not None:
            linker.add_aliases(load_names_file(path, artifact.entities))
        return linker

    # ---------------------------------------------------------------------------- tables
    def _tables(self) -> dict[str, Any]:
        """The derived lookup tables (loose forms, acronyms, the fuzzy choice list), built lazily."""
        if self._derived is None:
            import numpy as np

            acr: dict[str, dict[int, bool]] = {}
            for key, cands in self._keys.items():
                for i, own in cands.items():
                    for a in acronyms(key):
                        self._put(acr, a, i, own)
            # the entities of each key, in choice order (CSR), to restrict the choices to a range
            ents = [list(c) for c in self._keys.values()]
            ptr = np.cumsum([0] + [len(e) for e in ents], dtype=np.int64)
            flat = np.fromiter((i for e in ents for i in e), dtype=np.int64, count=int(ptr[-1]))
            self._derived = {"acronyms": acr, "choices": list(self._keys), "embedding": None,
                             "key_ptr": ptr, "key_ents": flat}
        return self._derived

    def _scope(self, mask: Any) -> tuple[Any, list[str]]:
        """(per choice: has an entity in ``mask``; the choices that do), cached per mask object."""
        import numpy as np

        hit = self._scopes.get(id(mask))
        if hit is not None and hit[0] is mask:
            return hit[1], hit[2]
        tables = self._tables()
        ptr, flat = tables["key_ptr"], tables["key_ents"]
        ok = (np.logical_or.reduceat(mask[flat], ptr[:-1]) if len(flat) else np.zeros(0, dtype=bool))
        choices = [c for c, k in zip(tables["choices"], ok) if k]
        if len(self._scopes) >= 256:  # masks passed per call (``allowed=``) must not pile up
            self._scopes.clear()  # and a memo entry must not outlive its mask (an id can be reused)
            self._memo = {k: v for k, v in self._memo.items() if k[1] == 0}
        self._scopes[id(mask)] = (mask, ok, choices)
        return ok, choices

    def _mask(self, relation: Any, allowed: Any) -> Any:
        """The boolean entity mask a call restricts to, or None (no restriction)."""
        import numpy as np

        if allowed is not None:
            a = np.asarray(allowed)
            if a.dtype == bool:
                if a.shape != (len(self.names),):
                    raise UserError(f"allowed: a boolean mask must have one value per name ({len(self.names)}), "
                                    f"got shape {a.shape}")
                return a.copy()  # the caller may reuse its array: a copy cannot go stale in the caches
            ids = np.asarray(list(allowed) if not isinstance(allowed, np.ndarray) else allowed, dtype=np.int64)
            if ((ids < 0) | (ids >= len(self.names))).any():
                raise UserError(f"allowed: entity ids must be in [0, {len(self.names)})")
            mask = np.zeros(len(self.names), dtype=bool)
            mask[ids] = True
            return mask
        if relation is None or self.ranges is None:
            return None
        return self.ranges.allowed(relation)

    # ---------------------------------------------------------------------------- linking
    def _decide(self, text: str, cands: Mapping[int, bool], prefer: Mapping[int, float] | None) -> int | None:
        """The entity a form shared by ``cands`` means, or None when that is not decided (ambiguous).

        A single candidate; else the single one holding the form as its own name; else the
        ``prefer`` scores' unique positive maximum; else, among several own names equal after
        normalisation (MetaQA's film "Gold" and tag "gold"), the one closest to ``text`` in raw
        form (case-sensitive ``fuzz.ratio``) when that is unique.  Aliases alone (the bare "X" of
        several "X (qualifier)") are never decided by the raw form.
        """
        if len(cands) == 1:
            return next(iter(cands))
        own = [i for i, o in cands.items() if o]
        if len(own) == 1:
            return own[0]
        pool = own or list(cands)
        if prefer:
            scores = sorted(((float(prefer.get(i, 0.0)), i) for i in pool), reverse=True)
            if scores[0][0] > 0.0 and scores[0][0] > scores[1][0]:
                return scores[0][1]
        if len(own) > 1 and len({normalize(self.names[i]) for i in own}) == 1:
            fuzz, _ = _rapidfuzz()
            raw = sorted(((fuzz.ratio(text, self.names[i]), i) for i in own), reverse=True)
            if raw[0][0] > raw[1][0]:
                return raw[0][1]
        return None

    def _hit(self, text: str, cands: Mapping[int, bool], prefer, method: str | None, score: float = 100.0,
             in_range: bool | None = None) -> Link:
        i = self._decide(text, cands, prefer)
        if i is None:
            near = tuple(sorted(((self.names[j], float(score)) for j in cands), key=lambda p: p[0]))[:NEAREST]
            return Link(text, None, None, None, float(score), len(cands), closest=near[0][0], nearest=near,
                        reason="ambiguous")
        if method is None:
            method = "exact" if cands[i] else "alias"
        return Link(text, i, self.names[i], method, float(score), len(cands), in_range=in_range)

    def _ranged(self, text: str, cands: Mapping[int, bool], prefer, method: str | None, mask: Any,
                rejected: list[tuple[str, str, float]], score: float = 100.0) -> Link | None:
        """:meth:`_hit` over the candidates inside ``mask`` (all of them when it is None); None, with
        the candidates recorded in ``rejected``, when every candidate is outside it."""
        if mask is None:
            return self._hit(text, cands, prefer, method, score)
        inside = {i: o for i, o in cands.items() if mask[i]}
        if not inside:
            rejected += [(self.names[i], method or ("exact" if o else "alias"), float(score))
                         for i, o in sorted(cands.items())]
            return None
        return self._hit(text, inside, prefer, method, score, in_range=True)

    def nearest_keys(self, key: str, limit: int = FUZZY_CANDIDATES, *, choices: Sequence[str] | None = None
                     ) -> list[tuple[str, float]]:
        """The ``limit`` normalised names nearest ``key`` by the retrieval scorer, best first (ties: table order).

        One ``rapidfuzz.process.extract`` over the whole name table (vectorised C++), or over
        ``choices`` (a subset of it, e.g. the names of a relation's range).
        """
        _, process = _rapidfuzz()
        if choices is None:
            choices = self._tables()["choices"]
        if not choices or limit <= 0:
            return []
        hits = process.extract(key, choices, scorer=self._retrieve, processor=None, limit=limit)
        return [(c, float(s)) for c, s, _ in hits]

    def _fuzzy(self, key: str, mask: Any = None) -> list[tuple[str, float]]:
        """Candidate keys with their final fuzzy score, best first (memoised), among the names with an
        entity in ``mask`` (all names when it is None)."""
        memo_key = (key, 0 if mask is None else id(mask))
        if memo_key in self._memo:
            return self._memo[memo_key]
        hits = self.nearest_keys(key, choices=None if mask is None else self._scope(mask)[1])
        if self._rescore is not None:
            hits = [(c, self._rescore(key, c)) for c, _ in hits]
        hits.sort(key=lambda cs: -cs[1])  # stable: retrieval order breaks ties
        self._memo[memo_key] = hits
        return hits

    def _nearest_names(self, scored: list[tuple[str, float]], mask: Any = None) -> tuple[tuple[str, float], ...]:
        out: list[tuple[str, float]] = []
        seen: set[int] = set()
        for key, s in scored:
            for i in sorted(self._keys[key]):
                if i not in seen and (mask is None or mask[i]):
                    seen.add(i)
                    out.append((self.names[i], round(float(s), 2)))
        return tuple(out[:NEAREST])

    def _fuzzy_reason(self, text: str, key: str, best: float) -> str | None:
        """Why a fuzzy match of score ``best`` does not link (None: it links)."""
        if self.use_acronyms and _acronym_of_text(text) is not None:
            return "acronym"  # "AYLI" is not a typo of "Ali"
        if len(key) < self.min_fuzzy_chars:
            return "too short"
        return None if best >= self.threshold else "below threshold"

    def link(self, text: str, *, prefer: Mapping[int, float] | None = None, relation: int | None = None,
             allowed: Any = None) -> Link:
        """Link one string (see the module doc); ``prefer``: entity id -> score that breaks ties.

        ``relation``: the id of the relation the string answers; with :attr:`ranges`, only
        entities of the right kind for it link (an exact name also outside, ``in_range=False``).
        ``allowed``: the same with an explicit set (entity ids, or a boolean mask over the names),
        which wins over ``relation``.
        """
        return self._link(str(text), prefer, self._mask(relation, allowed))

    def _link(self, text: str, prefer: Mapping[int, float] | None, mask: Any) -> Link:
        if not text.strip():  # an empty answer names nothing, even where the KG has an entity named ""
            return Link(text, None, None, None, 0.0, reason="empty")
        raw_exact = self._exact.get(text)
        if raw_exact is not None and (mask is None or mask[raw_exact]):
            return Link(text, raw_exact, self.names[raw_exact], "exact", 100.0, 1,
                        in_range=None if mask is None else True)
        key = normalize(text)
        if not key:
            return Link(text, None, None, None, 0.0, reason="empty")
        if not self._keys:
            return Link(text, None, None, None, 0.0, reason="no names")
        tables = self._tables()
        rejected: list[tuple[str, str, float]] = []
        cands = self._keys.get(key)
        if cands:
            hit = self._ranged(text, cands, prefer, None, mask, rejected)
            if hit is not None:
                return hit
            # Only an exact name links outside the range ("JCVD" is the film JCVD, whatever was asked).
            if raw_exact is not None:
                return Link(text, raw_exact, self.names[raw_exact], "exact", 100.0, 1, in_range=False)
            own = {i: True for i, o in cands.items() if o}
            if own:
                hit = self._hit(text, own, prefer, None)
                return hit if not hit.linked else replace(hit, in_range=False)
        m = _QUALIFIER.match(text)
        if m:  # "Kismet (film)" where the KG says "Kismet"
            bare = normalize(m.group(1))
            if bare in self._keys:
                hit = self._ranged(text, self._keys[bare], prefer, "alias", mask, rejected)
                if hit is not None:
                    return hit
        lk = loose_form(text)
        if lk in self._loose:
            hit = self._ranged(text, self._loose[lk], prefer, "alias", mask, rejected)
            if hit is not None:
                return hit
        if self.use_acronyms:
            acr = _acronym_of_text(text)
            if acr is not None and acr in tables["acronyms"]:
                hit = self._ranged(text, tables["acronyms"][acr], prefer, "acronym", mask, rejected)
                if hit is not None and (len(acr) >= self.min_acronym_letters or not hit.linked
                                        or (prefer or {}).get(hit.entity, 0.0) > 0):
                    return hit
        scored = self._fuzzy(key, mask)
        nearest = self._nearest_names(scored, mask)
        if scored and self.fuzzy:
            best = scored[0][1]
            reason = self._fuzzy_reason(text, key, best)
            if reason is None:
                cands = {}
                for k, s in scored:
                    if s < best:
                        break
                    for i, own in self._keys[k].items():
                        if mask is None or mask[i]:
                            cands[i] = cands.get(i, False) or own
                return self._hit(text, cands, prefer, "fuzzy", best, in_range=None if mask is None else True)
        else:
            reason = "no exact match" if scored else ("out of range" if mask is not None else "no names")
        if self.use_acronyms and len([w for w in key.split() if w not in _STOPWORDS]) >= 3:
            # a written-out name whose initials are an all-capitals KG name ("International Business
            # Machines" -> "IBM"); after fuzzy, as a long name's initials spell a short title by chance
            for a in sorted(acronyms(key)):
                if len(a) >= self.min_acronym_letters and a in self._caps:
                    hit = self._ranged(text, self._caps[a], prefer, "acronym", mask, rejected)
                    if hit is not None and hit.linked:
                        return hit
        if self.embedding_spec is not None:
            hit = self._embedding(text, prefer, mask)
            if hit is not None:
                return hit
        if mask is not None and self.fuzzy:
            # what the whole name table would have matched: reported, never linked
            full = self._fuzzy(key)
            if full and self._fuzzy_reason(text, key, full[0][1]) is None:
                rejected += [(self.names[i], "fuzzy", full[0][1]) for k, s in full if s >= full[0][1]
                             for i in sorted(self._keys[k]) if not mask[i]]
        score = scored[0][1] if scored else 0.0
        out = tuple(dict.fromkeys(rejected))[:NEAREST]
        return Link(text, None, None, None, score, 0, closest=nearest[0][0] if nearest else None,
                    nearest=nearest, reason="out of range" if out else reason, out_of_range=out)

    def _embedding(self, text: str, prefer, mask: Any = None) -> Link | None:
        """The embedding match of ``text``, or None (below the threshold, margin not met, ambiguous)."""
        import numpy as np

        tables = self._tables()
        if tables["embedding"] is None:
            from engine.paths.embeddings import make_encoder

            encoder = make_encoder(self.embedding_spec)
            tables["embedding"] = (encoder, np.asarray(encoder.encode(tables["choices"]), dtype=np.float32))
        encoder, mat = tables["embedding"]
        q = np.asarray(encoder.encode([normalize(text)]), dtype=np.float32)[0]
        sims = mat @ q * 100.0
        if mask is not None:  # only names with an entity in the range compete
            sims = np.where(self._scope(mask)[0], sims, -np.inf)
        order = np.argsort(-sims, kind="stable")[:FUZZY_CANDIDATES]
        if not len(order) or not np.isfinite(sims[order[0]]):
            return None
        best_key = tables["choices"][int(order[0])]
        best = float(sims[order[0]])
        if best < self.embedding_threshold:
            return None
        ents = self._keys[best_key] if mask is None else {i: o for i, o in self._keys[best_key].items() if mask[i]}
        runner = next((float(sims[j]) for j in order[1:] if set(self._keys[tables["choices"][int(j)]]) - set(ents)),
                      -100.0)
        if best - runner < self.embedding_margin:
            return None
        link = self._hit(text, ents, prefer, "embedding", best, in_range=None if mask is None else True)
        return link if link.linked else None

    def link_many(self, texts: Iterable[str], *, prefer: Mapping[int, float] | None = None,
                  relation: int | None = None, allowed: Any = None) -> list[Link]:
        """:meth:`link` for each string, in order (unlinked ones included)."""
        mask = self._mask(relation, allowed)  # one mask for the batch (its fuzzy choices built once)
        return [self._link(str(t), prefer, mask) for t in texts]


# ---------------------------------------------------------------------------------- names files
_NAME_COLUMNS = ("name", "name_kgbert", "wikidata_label", "label", "text", "alias", "title")


def _default_names_file(artifact: "Artifact") -> Path | None:
    source = (artifact.meta or {}).get("source")
    if not isinstance(source, str) or not source:
        return None
    p = Path(source)
    folder = p if p.is_dir() else p.parent
    for name in ("id2ent.tsv", "entity2text.txt", "entity2text.tsv"):
        if (folder / name).is_file():
            return folder / name
    return None


def load_names_file(path: str | os.PathLike, names: Sequence[str]) -> dict[str, list[int]]:
    """Aliases from a names file, mapped to the ids of ``names`` (an artifact's entity names).

    Accepted: a TSV with a header holding an ``id`` or ``mid`` column and name
    columns (``name``, ``name_kgbert``, ``wikidata_label``, ``label``, ``text``)
    -- FB15k-237's ``id2ent.tsv``; or a header-less two-column ``key<TAB>text``
    file (``entity2text.txt``).  A row belongs to the artifact entity whose name
    is the row's ``name (mid)`` (the artifact's disambiguated form), its mid,
    one of its names, or its id; rows matching no entity are skipped.  Every
    other value of the row becomes an alias of that entity.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            try:
                rows = [r for r in reader if r and any(c.strip() for c in r)]
            except csv.Error as exc:  # e.g. a cell over csv's field size limit (131,072 characters)
                raise UserError(f"names file {path}:{reader.line_num}: not a TSV of names ({exc})") from None
    except FileNotFoundError:
        raise UserError(f"names file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"names file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:  # a folder, no permission
        raise UserError(f"names file {path}: cannot read it ({exc.strerror})") from None
    if not rows:
        return {}
    index = {n: i for i, n in enumerate(names)}
    header = [c.strip().lower() for c in rows[0]]
    if "id" in header or "mid" in header:
        col = {c: k for k, c in enumerate(header)}
        body = rows[1:]
        key_cols = [col[c] for c in ("mid", "id") if c in col]
        name_cols = [col[c] for c in _NAME_COLUMNS if c in col]
    else:
        body = rows
        key_cols, name_cols = [0], list(range(1, max(len(r) for r in rows)))
    out: dict[str, list[int]] = {}
    for row in body:
        cell = lambda k: row[k].strip() if k < len(row) else ""  # noqa: E731
        keys = [cell(k) for k in key_cols if cell(k)]
        labels = [cell(k) for k in name_cols if cell(k)]
        candidates = [f"{lab} ({k})" for k in keys for lab in labels] + keys[:1] + labels + keys[1:]
        ent = next((index[c] for c in candidates if c in index), None)
        if ent is None:
            continue
        for alias in keys[:1] + labels:  # the mid and every readable name (never a bare numeric id)
            if names[ent] != alias:
                ids = out.setdefault(alias, [])
                if ent not in ids:
                    ids.append(ent)
    return out
