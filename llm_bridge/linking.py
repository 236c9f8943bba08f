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
   (film)" -> "Kismet"), or the :func:`loose_key` form (corporate suffixes such
   as Inc/Corporation/Ltd/Co and spaces dropped: "Intel Corporation" ->
   "Intel", "Spider Man" -> "Spider-Man");
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

Every string gets a :class:`Link`: how it linked (``method``), the score, and
for an unlinked one the reason and the closest KG names with their scores.
The default threshold is calibrated on a labelled MetaQA set
(:mod:`llm_bridge.linkeval`, see :data:`DEFAULT_THRESHOLD`).
"""
from __future__ import annotations

import csv
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kgreason.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

__all__ = ["normalize", "loose_key", "aligned_score", "acronyms", "Link", "EntityLinker", "load_names_file",
           "SCORERS", "METHODS", "DEFAULT_THRESHOLD", "DEFAULT_EMBEDDING_THRESHOLD"]

#: Fuzzy scorers a linker accepts: ``"aligned"`` (:func:`aligned_score`, the default) or the
#: name of a ``rapidfuzz.fuzz`` function, used on its own (the pre-calibration behaviour).
SCORERS = ("aligned", "token_sort_ratio", "token_set_ratio", "ratio", "WRatio", "QRatio")
#: How a string linked (``Link.method``); ``None`` for an unlinked string.
METHODS = ("exact", "alias", "acronym", "fuzzy", "embedding")
#: Default fuzzy threshold (``aligned`` score, 0-100), calibrated with ``python -m
#: llm_bridge.linkeval --kb ../shared/data/metaqa/kb.txt --per-kind 400 --baseline-rev 0a51aa3``
#: (seed 0): 5,505 labelled strings (4,000 LLM-style variants of 41,472 MetaQA names, 1,505 hard
#: negatives).  At 82, precision 0.994 and recall 0.921 (the best F0.5 among the thresholds from
#: which precision stays >= 0.95; 62 gives 0.945); the previous linker (token_sort_ratio >= 90)
#: measured 0.871 / 0.713 on the same set.  Sweep: benchmarks/results/lgot/linking.md.
DEFAULT_THRESHOLD = 82.0
#: Default cosine (x 100) for the optional embedding matcher.
DEFAULT_EMBEDDING_THRESHOLD = 90.0
#: Candidates the vectorised fuzzy search hands to the token-aligned rescoring.
FUZZY_CANDIDATES = 20
#: Closest names an unlinked :class:`Link` reports.
NEAREST = 5

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
    """A normalised form without corporate suffixes and spaces: ``"intel corporation"`` -> ``"intel"``,
    ``"spider man"`` -> ``"spiderman"``; a key that would become empty is kept (``"co"`` -> ``"co"``)."""
    if key.startswith("/m/"):
        return key
    core = _CORPORATE.sub("", key)
    return (core or key).replace(" ", "")


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
    ``"no exact match"`` (fuzzy off) or ``"no names"``.
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
        return d


def _rapidfuzz():
    try:
        from rapidfuzz import fuzz, process
    except ImportError:  # pragma: no cover - rapidfuzz is in the [llm] extra
        raise UserError("entity linking needs rapidfuzz: pip install -e '.[llm]'") from None
    return fuzz, process


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
    """

    def __init__(self, *, names: Sequence[str], aliases: Mapping[str, Any] | None = None,
                 threshold: float = DEFAULT_THRESHOLD, scorer: str = "aligned", min_fuzzy_chars: int = 4,
                 fuzzy: bool = True, acronyms: bool = True, min_acronym_letters: int = 4, embedding: Any = None,
                 embedding_threshold: float = DEFAULT_EMBEDDING_THRESHOLD, embedding_margin: float = 2.0) -> None:
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
        self._exact: dict[str, int] = {}
        for i, n in enumerate(self.names):
            self._exact.setdefault(n, i)
        # normalised form -> {id: True if it is the entity's own name, False if an alias}
        self._keys: dict[str, dict[int, bool]] = {}
        # normalised form of an all-capitals name ("IBM") -> ids, for full names written out
        self._caps: dict[str, dict[int, bool]] = {}
        self._derived: dict[str, Any] | None = None
        self._memo: dict[str, list[tuple[str, float]]] = {}
        for i, n in enumerate(self.names):
            self._add(n, i, True)
        if aliases:
            self.add_aliases(aliases)

    def _add(self, raw: str, i: int, own: bool) -> None:
        key = normalize(raw)
        if not key:
            return
        self._put(self._keys, key, i, own)
        m = _QUALIFIER.match(raw)
        if m:  # "X (qualifier)" is also reachable as a bare "X", as an alias (own names win over it)
            bare = normalize(m.group(1))
            if bare:
                self._put(self._keys, bare, i, False)
        if _acronym_of_text(raw) is not None and " " not in raw.strip():
            self._put(self._caps, key.replace(" ", ""), i, own)
        self._derived = None  # loose/acronym/fuzzy tables are rebuilt on the next lookup
        self._memo.clear()

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
                      aliases: Mapping[str, Any] | None = None, **kwargs: Any) -> "EntityLinker":
        """A linker over ``artifact``'s entities, with the aliases of ``names_file``.

        ``names_file`` defaults to an ``id2ent.tsv`` / ``entity2text.txt`` next to
        the artifact's source (``meta.json["source"]``) when one exists.
        """
        linker = cls(names=artifact.entities, aliases=aliases, **kwargs)
        path = Path(names_file) if names_file is not None else _default_names_file(artifact)
        if path is not None:
            linker.add_aliases(load_names_file(path, artifact.entities))
        return linker

    # ---------------------------------------------------------------------------- tables
    def _tables(self) -> dict[str, Any]:
        """The derived lookup tables (loose forms, acronyms, the fuzzy choice list), built lazily."""
        if self._derived is None:
            loose: dict[str, dict[int, bool]] = {}
            acr: dict[str, dict[int, bool]] = {}
            for key, cands in self._keys.items():
                for i, own in cands.items():
                    self._put(loose, loose_key(key), i, own)
                    for a in acronyms(key):
                        self._put(acr, a, i, own)
            self._derived = {"loose": loose, "acronyms": acr, "choices": list(self._keys), "embedding": None}
        return self._derived

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

    def _hit(self, text: str, cands: Mapping[int, bool], prefer, method: str | None, score: float = 100.0) -> Link:
        i = self._decide(text, cands, prefer)
        if i is None:
            near = tuple(sorted(((self.names[j], float(score)) for j in cands), key=lambda p: p[0]))[:NEAREST]
            return Link(text, None, None, None, float(score), len(cands), closest=near[0][0], nearest=near,
                        reason="ambiguous")
        if method is None:
            method = "exact" if cands[i] else "alias"
        return Link(text, i, self.names[i], method, float(score), len(cands))

    def nearest_keys(self, key: str, limit: int = FUZZY_CANDIDATES) -> list[tuple[str, float]]:
        """The ``limit`` normalised names nearest ``key`` by the retrieval scorer, best first (ties: table order).

        One ``rapidfuzz.process.extract`` over the whole name table (vectorised C++).
        """
        _, process = _rapidfuzz()
        choices = self._tables()["choices"]
        if not choices or limit <= 0:
            return []
        hits = process.extract(key, choices, scorer=self._retrieve, processor=None, limit=limit)
        return [(c, float(s)) for c, s, _ in hits]

    def _fuzzy(self, key: str) -> list[tuple[str, float]]:
        """Candidate keys with their final fuzzy score, best first (memoised)."""
        if key in self._memo:
            return self._memo[key]
        hits = self.nearest_keys(key)
        if self._rescore is not None:
            hits = [(c, self._rescore(key, c)) for c, _ in hits]
        hits.sort(key=lambda cs: -cs[1])  # stable: retrieval order breaks ties
        self._memo[key] = hits
        return hits

    def _nearest_names(self, scored: list[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
        out: list[tuple[str, float]] = []
        seen: set[int] = set()
        for key, s in scored:
            for i in sorted(self._keys[key]):
                if i not in seen:
                    seen.add(i)
                    out.append((self.names[i], round(float(s), 2)))
        return tuple(out[:NEAREST])

    def link(self, text: str, *, prefer: Mapping[int, float] | None = None) -> Link:
        """Link one string (see the module doc); ``prefer``: entity id -> score that breaks ties."""
        text = str(text)
        if not text.strip():  # an empty answer names nothing, even where the KG has an entity named ""
            return Link(text, None, None, None, 0.0, reason="empty")
        if text in self._exact:
            i = self._exact[text]
            return Link(text, i, self.names[i], "exact", 100.0, 1)
        key = normalize(text)
        if not key:
            return Link(text, None, None, None, 0.0, reason="empty")
        if not self._keys:
            return Link(text, None, None, None, 0.0, reason="no names")
        tables = self._tables()
        cands = self._keys.get(key)
        if cands:
            return self._hit(text, cands, prefer, None)
        m = _QUALIFIER.match(text)
        if m:  # "Kismet (film)" where the KG says "Kismet"
            bare = normalize(m.group(1))
            if bare in self._keys:
                return self._hit(text, self._keys[bare], prefer, "alias")
        lk = loose_key(key)
        if lk in tables["loose"]:
            return self._hit(text, tables["loose"][lk], prefer, "alias")
        if self.use_acronyms:
            acr = _acronym_of_text(text)
            if acr is not None and acr in tables["acronyms"]:
                hit = self._hit(text, tables["acronyms"][acr], prefer, "acronym")
                if len(acr) >= self.min_acronym_letters or not hit.linked or (prefer or {}).get(hit.entity, 0.0) > 0:
                    return hit
        scored = self._fuzzy(key)
        nearest = self._nearest_names(scored)
        if scored and self.fuzzy:
            best_key, best = scored[0]
            if self.use_acronyms and _acronym_of_text(text) is not None:
                reason = "acronym"  # "AYLI" is not a typo of "Ali"
            elif len(key) < self.min_fuzzy_chars:
                reason = "too short"
            elif best >= self.threshold:
                cands = {}
                for k, s in scored:
                    if s < best:
                        break
                    for i, own in self._keys[k].items():
                        cands[i] = cands.get(i, False) or own
                return self._hit(text, cands, prefer, "fuzzy", best)
            else:
                reason = "below threshold"
        else:
            reason = "no exact match" if scored else "no names"
        if self.use_acronyms and len([w for w in key.split() if w not in _STOPWORDS]) >= 3:
            # a written-out name whose initials are an all-capitals KG name ("International Business
            # Machines" -> "IBM"); after fuzzy, as a long name's initials spell a short title by chance
            for a in sorted(acronyms(key)):
                if len(a) >= self.min_acronym_letters and a in self._caps:
                    hit = self._hit(text, self._caps[a], prefer, "acronym")
                    if hit.linked:
                        return hit
        if self.embedding_spec is not None:
            hit = self._embedding(text, prefer)
            if hit is not None:
                return hit
        score = scored[0][1] if scored else 0.0
        return Link(text, None, None, None, score, 0, closest=nearest[0][0] if nearest else None,
                    nearest=nearest, reason=reason)

    def _embedding(self, text: str, prefer) -> Link | None:
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
        order = np.argsort(-sims, kind="stable")[:FUZZY_CANDIDATES]
        best_key = tables["choices"][int(order[0])]
        best = float(sims[order[0]])
        if best < self.embedding_threshold:
            return None
        ents = self._keys[best_key]
        runner = next((float(sims[j]) for j in order[1:] if set(self._keys[tables["choices"][int(j)]]) - set(ents)),
                      -100.0)
        if best - runner < self.embedding_margin:
            return None
        link = self._hit(text, ents, prefer, "embedding", best)
        return link if link.linked else None

    def link_many(self, texts: Iterable[str], *, prefer: Mapping[int, float] | None = None) -> list[Link]:
        """:meth:`link` for each string, in order (unlinked ones included)."""
        return [self.link(t, prefer=prefer) for t in texts]


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
