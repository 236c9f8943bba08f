"""Entity linking: LLM answer strings -> KG entity ids (exact, alias, then fuzzy), every string accounted for.

Order of the tests for one string (after :func:`normalize`):

1. **exact**: the string is an entity's name, or its normalised form is the
   normalised form of an entity's name (case, accents, punctuation, leading
   articles, underscores, Freebase-style ids and paths do not matter);
2. **alias**: the normalised form is an alias: the caller's ``aliases``
   mapping, the readable names of a names file (FB15k-237's ``id2ent.tsv``:
   mid, KG-BERT name and Wikidata label; or a two-column ``entity2text`` file),
   and each artifact name without its disambiguation suffix (``Paris (/m/05qtj)``
   -> ``Paris``);
3. **fuzzy**: the best normalised name or alias by rapidfuzz
   (``process.extractOne`` over a precomputed choice list, scorer
   ``token_sort_ratio`` by default), accepted when its score (0-100) is
   ``>= threshold`` and the string has at least ``min_fuzzy_chars`` characters
   (short strings match too much by chance).

A normalised form shared by several entities is resolved by the caller's
``prefer`` scores (e.g. the node's KG values: the entity the KG already
believes wins), then a name match over an alias, then the smaller id; the
:class:`Link` says how many candidates there were.  A string that links to
nothing is returned as a :class:`Link` with ``entity=None`` and the closest
candidate's name and score, so the trace can report it.
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

__all__ = ["normalize", "Link", "EntityLinker", "load_names_file", "SCORERS", "DEFAULT_THRESHOLD"]

#: rapidfuzz scorers a linker accepts (names of ``rapidfuzz.fuzz`` functions).
SCORERS = ("token_sort_ratio", "token_set_ratio", "ratio", "WRatio", "QRatio")
#: Default fuzzy threshold (rapidfuzz score, 0-100): token_sort_ratio 90 accepts a
#: typo or a missing middle initial in a name of ~15 characters, not a different name.
DEFAULT_THRESHOLD = 90.0

_MID = re.compile(r"^/?m[./]([0-9a-z_]+)$")
_PATH = re.compile(r"^/[\w./-]+$")
_APOSTROPHES = re.compile(r"['\u2019\u2018`\u00b4]")
_ARTICLE = re.compile(r"^(?:the|a|an)\s+(?=\S)")
_TRAILING_ARTICLE = re.compile(r",\s*(?:the|a|an)\s*$", re.IGNORECASE)
_DISAMBIGUATION = re.compile(r"^(.*\S)\s+(?:\((?:/m/[^()]*|[^()]*)\)|#\d+)$")


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


@dataclass(frozen=True)
class Link:
    """How one answer string was linked.

    ``entity``/``name``: the KG entity (``None`` when unlinked); ``method``:
    ``"exact"``, ``"alias"``, ``"fuzzy"`` or ``None``; ``score``: 100 for exact
    and alias matches, the rapidfuzz score for fuzzy ones, and for an unlinked
    string the closest candidate's score (``closest`` its name; 0 and ``None``
    when there is none); ``candidates``: entities sharing the matched form.
    """

    text: str
    entity: int | None
    name: str | None
    method: str | None
    score: float
    candidates: int = 0
    closest: str | None = None

    @property
    def linked(self) -> bool:
        return self.entity is not None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"text": self.text, "entity": self.name, "id": self.entity, "method": self.method,
                             "score": round(float(self.score), 2)}
        if self.candidates > 1:
            d["candidates"] = self.candidates
        if self.entity is None and self.closest is not None:
            d["closest"] = self.closest
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
        threshold: fuzzy acceptance, rapidfuzz score in [0, 100] (``>=`` accepts).
        scorer: one of :data:`SCORERS`.
        min_fuzzy_chars: shorter normalised strings are never fuzzy-matched.
        fuzzy: turn the fuzzy step off (exact and alias only).
    """

    def __init__(self, *, names: Sequence[str], aliases: Mapping[str, Any] | None = None,
                 threshold: float = DEFAULT_THRESHOLD, scorer: str = "token_sort_ratio",
                 min_fuzzy_chars: int = 4, fuzzy: bool = True) -> None:
        if not 0.0 <= float(threshold) <= 100.0:
            raise UserError(f"linking threshold must be in [0, 100], got {threshold}")
        if scorer not in SCORERS:
            raise UserError(f"unknown linking scorer {scorer!r}; expected one of {', '.join(SCORERS)}")
        fuzz, _ = _rapidfuzz()
        self._scorer = getattr(fuzz, scorer)
        self._choices: list[str] | None = None
        self._memo: dict[str, tuple[str, float, int] | None] = {}
        self.scorer = scorer
        self.threshold = float(threshold)
        self.min_fuzzy_chars = int(min_fuzzy_chars)
        self.fuzzy = bool(fuzzy)
        self.names = list(names)
        self._exact = {n: i for i, n in enumerate(self.names)}
        # normalised form -> {id: True if from the entity's own name, False if an alias}
        self._keys: dict[str, dict[int, bool]] = {}
        for i, n in enumerate(self.names):
            self._add(normalize(n), i, True)
            m = _DISAMBIGUATION.match(n)
            if m:
                self._add(normalize(m.group(1)), i, False)
        if aliases:
            self.add_aliases(aliases)

    def _add(self, key: str, i: int, own: bool) -> None:
        if not key:
            return
        d = self._keys.setdefault(key, {})
        d[i] = d.get(i, False) or own
        self._choices = None  # rebuilt on the next fuzzy lookup
        self._memo.clear()

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
                self._add(normalize(alias), int(t), False)

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

    # ---------------------------------------------------------------------------- linking
    def _pick(self, cands: Mapping[int, bool], prefer: Mapping[int, float] | None) -> int:
        def rank(i: int) -> tuple:
            return (-(prefer.get(i, 0.0) if prefer else 0.0), not cands[i], i)

        return min(cands, key=rank)

    def _fuzzy(self, key: str) -> tuple[str, float, int] | None:
        """(choice, score, index) of the best choice for ``key``, no cutoff (memoised)."""
        if key in self._memo:
            return self._memo[key]
        _, process = _rapidfuzz()
        if self._choices is None:
            self._choices = list(self._keys)
        hit = process.extractOne(key, self._choices, scorer=self._scorer, processor=None)
        out = None if hit is None else (hit[0], float(hit[1]), int(hit[2]))
        self._memo[key] = out
        return out

    def link(self, text: str, *, prefer: Mapping[int, float] | None = None) -> Link:
        """Link one string (see the module doc); ``prefer``: entity id -> score that breaks ties."""
        text = str(text)
        if text in self._exact:
            i = self._exact[text]
            return Link(text, i, self.names[i], "exact", 100.0, 1)
        key = normalize(text)
        if not key:
            return Link(text, None, None, None, 0.0)
        cands = self._keys.get(key)
        if cands:
            i = self._pick(cands, prefer)
            return Link(text, i, self.names[i], "exact" if cands[i] else "alias", 100.0, len(cands))
        hit = self._fuzzy(key) if self._keys else None
        if hit is None:
            return Link(text, None, None, None, 0.0)
        choice, score, _ = hit
        cands = self._keys[choice]
        if self.fuzzy and len(key) >= self.min_fuzzy_chars and score >= self.threshold:
            i = self._pick(cands, prefer)
            return Link(text, i, self.names[i], "fuzzy", score, len(cands))
        i = self._pick(cands, prefer)
        return Link(text, None, None, None, score, 0, closest=self.names[i])

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
            rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r and any(c.strip() for c in r)]
    except FileNotFoundError:
        raise UserError(f"names file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"names file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
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
