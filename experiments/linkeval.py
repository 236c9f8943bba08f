"""A labelled entity-linking set built from MetaQA's KB, and the precision/recall of a linker on it.

The set imitates how an LLM writes the names of a KG's entities.  From
``kb.txt``'s entity names (seeded, deterministic):

* a random share of the names is **held out**: they are not in the linker's
  name table and serve as negatives (real names near real names: another film
  of a similar title, another person with a shared surname);
* some films are renamed ``"X (film)"`` in the table (a bare ``"X"`` must link
  to it), and some become two entries ``"X (film)"`` and ``"X (novel)"`` (a bare
  ``"X"`` is then *ambiguous* and must not link);
* **positives** (the string names a table entity; label = that entity): case
  changes, an article added/removed/moved (``"Matrix, The"``), punctuation
  removed/changed, a corporate suffix added, accents stripped/added, a person
  as ``"Last, First"``, the acronym of a name of >= 3 words, one typo in a long
  token, a ``"(film)"`` / ``"(1999 film)"`` qualifier added, the qualifier of a
  renamed film dropped;
* **negatives** (the string names no table entity, label ``None``): held-out
  names and their acronyms, persons with the first name of another person (``"Bo Jackson"``-like,
  not a name in the KB), and the ambiguous bare titles;
* **negatives of the wrong kind** (issue 32: what a real LLM's answers to MetaQA
  sub-questions linked to), each asked under a relation: ``other_kind_typo`` -- one
  letter added or changed at the start of a name of another kind than the
  relation reaches ("selling" near the film "Elling" for a tag question, "The
  Lobster" near the tag "mobster" for a film question; persons vs works
  included); ``placeholder`` -- "Movie B", "Actor C", "Film #2" (the tag
  "b-movie" is "Movie B" at fuzzy score 100); ``person_acronym`` -- a made-up
  person whose initials spell an all-capitals KB title ("Jean-Claude Van Damme"
  -> the film "JCVD"); ``partial_name`` -- a person's initials or one of their
  names alone ("P.J" of "P.J. Hogan"); ``joined_words`` -- a two-word name
  written as one word ("Deadpool" is not "The Dead Pool").

Every string carries the **relation** its question asked (``Example.relation``): for
a positive one reaching the labelled entity in the table's KG, for a negative one
reaching its source name in the KB, for the wrong-kind kinds one whose range
(:class:`~llm_bridge.linking.RelationRanges` of the table's KG) excludes the name
it is near.  The table's KG is ``kb.txt``'s triples over the table (held-out names'
triples dropped, renamed films under their new name), relation ``2k`` a KB relation
and ``2k+1`` its inverse ``X^-1``.  The ranged linker is called with the relation,
the others without.

A link is correct when it picks the labelled entity (or an entity with the same
normalised name); precision = correct links / links, recall = correct links /
positives, overall and per kind (a negative kind has no recall: every link of it is
wrong).  The fuzzy threshold is swept from one run at threshold 0 (a string
links at threshold ``t`` iff it linked by a non-fuzzy method, or fuzzily with a
score ``>= t``; the fuzzy decision is otherwise independent of the threshold).
The sweep misses what the rules *after* the fuzzy step (written-out acronyms,
embedding) link once the fuzzy step rejects a string, which at threshold 0 it
never does; the side-by-side and per-kind tables are exact: every string not
linked at or above a linker's threshold by the run at 0 is linked again at it.

Run (writes the Markdown table and the PNG next to it)::

    python -m experiments.linkeval --kb ../shared/data/metaqa/kb.txt \\
        --out benchmarks/results/lgot/linking.md --save-results linking.json
    # later, after changing the linker: the saved run side by side with the new one
    python -m experiments.linkeval --kb ../shared/data/metaqa/kb.txt \\
        --out /tmp/linking.md --baseline linking.json

``--save-results FILE`` writes the linker's outcome on every labelled string (at
threshold 0 and at its chosen threshold) with a fingerprint of the set;
``--baseline FILE`` reads such a file and shows that run's linker side by side.
A baseline measured on another set (another ``--kb``, ``--seed``, ``--per-kind``,
``--held-out`` or ``--max-names``, or a changed set builder) is refused: its
outcomes would not belong to these strings.  No git checkout is needed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kgreason.cli import SEED_MAX, ArgumentParser, Settings, add_settings_arguments, setting, settings_from_args
from kgreason.constants import INVERSE_SUFFIX
from kgreason.errors import UserError, cli_main
from kgreason.files import _check_parent, check_not_input, json_object, read_lines, write_output
from llm_bridge.linking import DEFAULT_THRESHOLD, EntityLinker, RelationRanges, acronyms, loose_form, normalize

__all__ = ["Example", "LinkingSet", "load_kb", "load_kb_names", "build_set", "evaluate", "sweep", "per_kind",
           "choose_threshold", "range_coverage", "LinkEvalSettings", "parse_args", "main"]

PERSON_RELATIONS = ("directed_by", "written_by", "starred_actors")
CORPORATE = (" Inc.", " Corporation", " Ltd", " Co.", ", Inc.", " LLC")
ACCENTS = {"a": "á", "e": "é", "i": "í", "o": "ö", "u": "ü", "n": "ñ", "c": "ç"}
POSITIVE_KINDS = ("case", "article", "punctuation", "corporate", "accents", "reorder", "acronym", "typo",
                  "qualifier_added", "qualifier_dropped")
NEGATIVE_KINDS = ("held_out", "held_out_acronym", "swapped_first_name", "ambiguous_bare", "other_kind_typo",
                  "placeholder", "person_acronym", "partial_name", "joined_words")
#: The kinds a real LLM's wrong-kind answers showed (issue 32); built only when the KB's triples are given.
WRONG_KIND_KINDS = NEGATIVE_KINDS[4:]
#: "Movie B"-like placeholders: the noun, and the KB relations whose answers it stands for (X^-1: films).
PLACEHOLDER_NOUNS = {"Movie": ("directed_by^-1", "starred_actors^-1", "has_tags^-1", "release_year^-1"),
                     "Film": ("directed_by^-1", "written_by^-1", "has_genre^-1"),
                     "Title": ("starred_actors^-1", "in_language^-1"), "Actor": ("starred_actors",),
                     "Actress": ("starred_actors",), "Director": ("directed_by",), "Writer": ("written_by",),
                     "Person": PERSON_RELATIONS}
THRESHOLDS = tuple(float(t) for t in range(50, 101, 2))


@dataclass(frozen=True)
class Example:
    """One labelled string: ``target`` is the table name it means (``None`` for a negative); ``relation``:
    the name of the relation whose question it answers (``None``: no relation known)."""

    text: str
    target: str | None
    kind: str
    source: str
    relation: str | None = None


@dataclass
class LinkingSet:
    """The linker's name table, the labelled strings, and (when built from triples) the table's KG:
    ``relations`` (``2k``: a KB relation, ``2k+1``: its inverse) and ``triples`` (``(E, 3)`` table ids)."""

    names: list[str]
    examples: list[Example]
    relations: list[str] = field(default_factory=list)
    triples: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))

    def ranges(self) -> RelationRanges:
        """The :class:`RelationRanges` of the table's KG."""
        return RelationRanges(self.triples, num_entities=len(self.names), num_relations=len(self.relations),
                              inverse=[k ^ 1 for k in range(len(self.relations))])

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, LinkingSet) and (self.names, self.examples, self.relations)
                == (other.names, other.examples, other.relations) and np.array_equal(self.triples, other.triples))


def load_kb_names(path: str | Path) -> tuple[list[str], set[str], dict[str, str]]:
    """(entity names in first-seen order, person names, film -> release year) of a MetaQA ``kb.txt``."""
    names, persons, years, _ = load_kb(path)
    return names, persons, years


def load_kb(path: str | Path) -> tuple[list[str], set[str], dict[str, str], list[tuple[str, str, str]]]:
    """:func:`load_kb_names` and the ``(head, relation, tail)`` name triples (duplicates dropped, file order)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--kb: {str(path)!r} is not a file (MetaQA's kb.txt: head|relation|tail lines)")
    seen: dict[str, None] = {}
    persons: set[str] = set()
    years: dict[str, str] = {}
    triples: dict[tuple[str, str, str], None] = {}
    for lineno, line in read_lines(path, what="--kb"):  # a non-UTF-8 line is a FILE:LINE error
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3:
            raise UserError(f"{path}:{lineno}: expected head|relation|tail, got {len(parts)} field(s)")
        h, r, t = (p.strip() for p in parts)
        seen.setdefault(h, None)
        seen.setdefault(t, None)
        triples.setdefault((h, r, t), None)
        if r in PERSON_RELATIONS:
            persons.add(t)
        elif r == "release_year":
            years.setdefault(h, t)
    if not seen:  # else an empty report: 0 positives, "precision 1.000"
        raise UserError(f"--kb {path}: no head|relation|tail line (an empty file?)")
    return list(seen), persons, years, list(triples)


# ----------------------------------------------------------------------------- perturbations
def _case(rng, s):
    return [s.lower(), s.upper(), s.title(), s.swapcase()][rng.integers(4)]


def _article(rng, s):
    low = s.lower()
    if low.startswith("the "):
        return s[4:] if rng.random() < 0.5 else f"{s[4:]}, The"
    return f"The {s}" if rng.random() < 0.7 else f"the {s}"


def _punctuation(rng, s):
    if any(not c.isalnum() and not c.isspace() for c in s):
        return "".join(c for c in s if c.isalnum() or c.isspace())
    words = s.split()
    if len(words) >= 2:
        return ["-", ". ", ": "][rng.integers(3)].join(words) if rng.random() < 0.5 else " ".join(words) + "."
    return s + ["!", ".", "?"][rng.integers(3)]


def _strip_accents(s):
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


def _accents(rng, s):
    if _strip_accents(s) != s:
        return _strip_accents(s)
    idx = [i for i, c in enumerate(s) if c.lower() in ACCENTS]
    if not idx:
        return None
    i = idx[rng.integers(len(idx))]
    rep = ACCENTS[s[i].lower()]
    return s[:i] + (rep.upper() if s[i].isupper() else rep) + s[i + 1:]


def _typo(rng, s):
    words = s.split()
    long = [k for k, w in enumerate(words) if len(w) >= 6 and w.isalpha()]
    if not long:
        return None
    k = long[rng.integers(len(long))]
    w = words[k]
    j = int(rng.integers(1, len(w) - 1))  # never the first letter: LLM typos keep the initial
    op = rng.integers(4)
    letters = "abcdefghijklmnopqrstuvwxyz"
    if op == 0:
        w = w[:j] + w[j + 1] + w[j] + w[j + 2:] if j + 1 < len(w) else w[:j] + w[j + 1:]
    elif op == 1:
        w = w[:j] + w[j + 1:]
    elif op == 2:
        w = w[:j] + letters[rng.integers(26)] + w[j:]
    else:
        w = w[:j] + letters[rng.integers(26)] + w[j + 1:]
    words[k] = w
    return " ".join(words)


def _acronym(s):
    words = [w for w in normalize(s).split() if w not in ("of", "the", "and", "a", "an")]
    if len(words) < 3 or not all(w[0].isalpha() for w in words):
        return None
    return "".join(w[0] for w in words).upper()


def build_set(names: Sequence[str], persons: set[str], years: dict[str, str], *, seed: int = 0,
              per_kind: int = 400, held_out: float = 0.05,
              triples: Sequence[tuple[str, str, str]] | None = None) -> LinkingSet:
    """The name table and labelled strings (see the module doc); deterministic for a seed.

    ``per_kind``: strings per positive kind and per negative kind (fewer when too few names fit).
    ``triples``: the KB's name triples; with them every string gets its relation, the table its KG, and
    the wrong-kind kinds are added (drawn from their own random streams: the other strings are those
    built without triples).
    """
    rng = np.random.default_rng(seed)
    names = list(dict.fromkeys(names))
    order = rng.permutation(len(names))
    n_out = int(round(held_out * len(names)))
    out_set = {names[i] for i in order[:n_out]}
    kept = [names[i] for i in sorted(order[n_out:])]
    # renamed/doubled films: only titles no other name shares (after normalisation), else a bare
    # title is another entity's exact name and the label would be wrong
    n_key = Counter(normalize(n) for n in names)
    films = [n for n in kept if n in years and n not in persons and n_key[normalize(n)] == 1]
    film_order = [films[i] for i in rng.permutation(len(films))]
    renamed = film_order[:per_kind]                    # "X" -> "X (film)"
    doubled = film_order[per_kind:2 * per_kind]        # "X" -> "X (film)", "X (novel)"
    ren, dbl = set(renamed), set(doubled)
    table: list[str] = []
    for n in kept:
        if n in ren:
            table.append(f"{n} (film)")
        elif n in dbl:
            table += [f"{n} (film)", f"{n} (novel)"]
        else:
            table.append(n)
    keys = {normalize(n) for n in table} | {normalize(n) for n in names}
    plain = [n for n in kept if n not in ren and n not in dbl]

    def pick(pool, k):
        return [pool[i] for i in rng.permutation(len(pool))[:k]]

    examples: list[Example] = []

    def add_positive(kind: str, pool: Sequence[str], fn: Callable[[str], str | None]) -> None:
        count = 0
        for n in pick(list(pool), len(pool)):
            if count >= per_kind:
                break
            t = fn(n)
            if t is None or t == n or not normalize(t):
                continue
            examples.append(Example(t, n, kind, n))
            count += 1

    pool = plain[: max(20 * per_kind, 1)] if len(plain) > 20 * per_kind else plain
    add_positive("case", pool, lambda n: _case(rng, n))
    add_positive("article", [n for n in plain if len(n.split()) >= 2 or n.lower().startswith("the ")],
                 lambda n: _article(rng, n))
    add_positive("punctuation", pool, lambda n: _punctuation(rng, n))
    add_positive("corporate", pool, lambda n: n + CORPORATE[rng.integers(len(CORPORATE))])
    add_positive("accents", pool, lambda n: _accents(rng, n))
    two = [n for n in plain if n in persons and len(n.split()) == 2 and n.replace(" ", "").isalpha()]
    add_positive("reorder", two, lambda n: "{1}, {0}".format(*n.split()))
    add_positive("acronym", plain, lambda n: None if (a := _acronym(n)) is None or normalize(a) in keys else a)
    add_positive("typo", [n for n in plain if len(n) >= 8], lambda n: _typo(rng, n))
    add_positive("qualifier_added", [n for n in plain if n in years],
                 lambda n: f"{n} (film)" if rng.random() < 0.5 else f"{n} ({years[n]} film)")
    examples += [Example(n, f"{n} (film)", "qualifier_dropped", n) for n in renamed]

    # negatives
    outs = [n for n in names if n in out_set]
    table_keys = {normalize(n) for n in table}
    outs = [n for n in outs if normalize(n) not in table_keys]  # held-out names that equal a kept one are not negatives
    examples += [Example(n, None, "held_out", n) for n in pick(outs, per_kind)]
    out_acr = [(a, n) for n in outs if (a := _acronym(n)) is not None and normalize(a) not in keys]
    examples += [Example(a, None, "held_out_acronym", n) for a, n in pick(out_acr, per_kind)]
    two_all = [n for n in kept if n in persons and len(n.split()) == 2 and n.replace(" ", "").isalpha()]
    firsts = sorted({n.split()[0] for n in two_all})
    count = 0
    for n in pick(two_all, len(two_all)):
        if count >= per_kind:
            break
        first = firsts[rng.integers(len(firsts))]
        t = f"{first} {n.split()[1]}"
        if normalize(t) in keys or first == n.split()[0]:
            continue
        keys.add(normalize(t))
        examples.append(Example(t, None, "swapped_first_name", n))
        count += 1
    examples += [Example(n, None, "ambiguous_bare", n) for n in doubled]
    if triples is None:
        return LinkingSet(table, examples)
    rename = {n: n for n in kept} | {n: f"{n} (film)" for n in renamed + doubled}
    return _with_relations(LinkingSet(table, examples), triples, rename, persons, keys, seed=seed,
                           per_kind=per_kind)


def _with_relations(data: LinkingSet, triples: Sequence[tuple[str, str, str]], rename: dict[str, str],
                    persons: set[str], keys: set[str], *, seed: int, per_kind: int) -> LinkingSet:
    """``data`` with the table's KG, a relation on every string, and the wrong-kind kinds (module doc)."""
    base = list(dict.fromkeys(r for _, r, _ in triples))
    relations = [x for r in base for x in (r, r + INVERSE_SUFFIX)]
    rid = {r: k for k, r in enumerate(relations)}
    ids = {n: i for i, n in enumerate(data.names)}
    reach: dict[str, set[str]] = {}  # KB name -> the relations reaching it (as a tail; X^-1: as a head)
    rows = []
    for h, r, t in triples:
        reach.setdefault(t, set()).add(r)
        reach.setdefault(h, set()).add(r + INVERSE_SUFFIX)
        th, tt = rename.get(h), rename.get(t)
        if th is not None and tt is not None:  # a held-out name's triples are not in the table's KG
            rows += [(ids[th], rid[r], ids[tt]), (ids[tt], rid[r + INVERSE_SUFFIX], ids[th])]
    trip = np.array(sorted(set(rows)), dtype=np.int64).reshape(-1, 3)
    out = LinkingSet(data.names, [], relations, trip)
    ranges = out.ranges()
    rng = np.random.default_rng([seed, 2])
    table_reach: dict[int, list[str]] = {}
    for h, r, t in trip.tolist():
        table_reach.setdefault(t, []).append(relations[r])

    def pick_rel(pool) -> str | None:
        pool = sorted(set(pool))
        return pool[rng.integers(len(pool))] if pool else None

    for ex in data.examples:
        if ex.target is not None:
            rel = pick_rel(table_reach.get(ids[ex.target], ()))
        else:
            rel = pick_rel(reach.get(ex.source, ()))
        out.examples.append(replace(ex, relation=rel))
    ex_keys = set(keys) | {normalize(e.text) for e in out.examples}

    def add(kind: str, text: str, source: str, relation: str | None) -> bool:
        k = normalize(text)
        if relation is None or not k or k in ex_keys:  # a KB name, or a string already labelled
            return False
        ex_keys.add(k)
        out.examples.append(Example(text, None, kind, source, relation))
        return True

    def shuffled(pool):
        pool = list(pool)
        return [pool[i] for i in rng.permutation(len(pool))]

    letters = "abcdefghijklmnopqrstuvwxyz"
    mentioned = np.zeros(len(data.names), dtype=bool)
    mentioned[trip[:, 0]] = True
    mentioned[trip[:, 2]] = True
    # other_kind_typo: a letter added before or changed at the start of a name of another kind, asked under
    # a relation reaching no entity of that name (MetaQA's tag "insomnia" is also the film "Insomnia")
    same: dict[str, list[int]] = {}
    for i, n in enumerate(data.names):
        same.setdefault(normalize(n), []).append(i)
    count = 0
    for i in shuffled([i for i, n in enumerate(data.names) if mentioned[i] and len(normalize(n)) >= 5]):
        if count >= per_kind:
            break
        twins = same[normalize(data.names[i])]
        wrong = [relations[r] for r in range(len(relations))
                 if ranges.sizes[r] >= 20 and not ranges.allowed(r)[twins].any()]
        n = data.names[i]
        if not n[:1].isalpha() or not wrong or normalize(n, strip_articles=False) != normalize(n):
            continue  # a name starting with an article would have its typo in "The"
        c = letters[rng.integers(26)]
        t = c + n[0].lower() + n[1:] if rng.random() < 0.5 else c + n[1:]  # "Elling" -> "selling"; "mobster" -> "lobster"
        t = t.capitalize() if n[0].isupper() else t
        if rng.random() < 0.2:
            t = "The " + t
        count += add("other_kind_typo", t, n, pick_rel(wrong))
    # placeholder: "Movie B", "Actor C", "Film #2"
    count = 0
    forms = [(f"{noun} {x}", noun) for noun in PLACEHOLDER_NOUNS for x in list("ABCDEFGHXYZ") + ["1", "2", "#1", "#2"]]
    forms += [(f"{x} {noun}", noun) for noun in ("Movie", "Film") for x in "ABCXYZ"]
    for text, noun in shuffled(forms):
        if count >= per_kind:
            break
        count += add("placeholder", text, noun, pick_rel(r for r in PLACEHOLDER_NOUNS[noun] if r in rid))
    # person_acronym: a made-up person whose initials spell an all-capitals title ("Jean Claude Van Damme")
    caps = [n for n in data.names if n.isalpha() and n.isupper() and 4 <= len(n) <= 8 and n not in persons]
    words: dict[str, list[str]] = {}
    for p in sorted(persons):
        for w in p.split():
            if w.isalpha() and len(w) >= 3 and w.lower() not in ("the", "and", "for"):
                words.setdefault(w[0].upper(), []).append(w)
    person_rels = [r for r in PERSON_RELATIONS if r in rid]
    count = tries = 0
    while caps and person_rels and count < per_kind and tries < 20 * per_kind:
        tries += 1
        title = caps[rng.integers(len(caps))]
        if not all(c in words for c in title):
            continue
        parts = [words[c][rng.integers(len(words[c]))] for c in title]
        text = " ".join(parts) if rng.random() < 0.5 else "-".join(parts[:2]) + " " + " ".join(parts[2:])
        if normalize(title).replace(" ", "") not in acronyms(normalize(text)):
            continue
        count += add("person_acronym", text, title, pick_rel(person_rels))
    # partial_name: a person's initials ("P.J" of "P.J. Hogan"), or one of their names alone
    count = 0
    people = [p for p in data.names if p in persons and len(p.split()) >= 2]
    initials = [p for p in people if re.fullmatch(r"(?:[A-Z]\.){2,3}", p.split()[0])]
    for p in shuffled(initials) + shuffled(people):
        if count >= per_kind:
            break
        first = p.split()[0]
        if p in initials:
            text = first.rstrip(".") if rng.random() < 0.7 else first.replace(".", "")
        else:
            text = first if rng.random() < 0.5 else p.split()[-1]
        count += add("partial_name", text, p, pick_rel(table_reach.get(ids[p], ())))
    # joined_words: a two-word name as one word ("Deadpool" is not "The Dead Pool")
    count = 0
    heads = {k for k, r in enumerate(relations) if r.endswith(INVERSE_SUFFIX)}  # X^-1 reaches X's heads: the works
    works = sorted({i for _, r, i in trip.tolist() if r in heads})
    for n in shuffled([data.names[i] for i in works]):
        if count >= per_kind:
            break
        w = normalize(n).split()
        if len(w) != 2 or not all(x.isalpha() and len(x) >= 3 for x in w) or "(" in n or " " not in loose_form(n):
            continue  # "Semi-Pro" joins its words itself: "Semipro" is that name
        count += add("joined_words", (w[0] + w[1]).capitalize(), n, pick_rel(table_reach.get(ids[n], ())))
    return out


# ------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Outcome:
    """What a linker did with one example: linked name (or None), method, score."""

    name: str | None
    method: str | None
    score: float


def evaluate(linker: Any, examples: Sequence[Example], *, desc: str = "linking",
             relations: dict[str, int] | None = None) -> list[Outcome]:
    """Run ``linker.link`` on every example (progress on stderr); with ``relations`` (name -> id) each
    example's relation is passed too (``relation=``; a linker with ranges then respects them)."""
    from kgreason.progress import progress_bar

    out = []
    for ex in progress_bar(examples, desc=desc, file=sys.stderr, mininterval=1.0, leave=False):
        rel = None if relations is None or ex.relation is None else relations[ex.relation]
        link = linker.link(ex.text) if rel is None else linker.link(ex.text, relation=rel)
        out.append(Outcome(link.name, link.method, float(link.score)))
    return out


def _correct(ex: Example, o: Outcome) -> bool:
    return ex.target is not None and o.name is not None and (o.name == ex.target or
                                                             normalize(o.name) == normalize(ex.target))


def counts(examples: Sequence[Example], outcomes: Sequence[Outcome], threshold: float,
           kinds: Sequence[str] | None = None) -> dict[str, float]:
    """Links, correct links, positives, precision and recall at ``threshold`` (fuzzy links below it drop)."""
    links = correct = positives = 0
    for ex, o in zip(examples, outcomes):
        if kinds is not None and ex.kind not in kinds:
            continue
        positives += ex.target is not None
        if o.name is None or (o.method == "fuzzy" and o.score < threshold):
            continue
        links += 1
        correct += _correct(ex, o)
    return {"links": links, "correct": correct, "positives": positives,
            "precision": correct / links if links else 1.0, "recall": correct / positives if positives else 0.0}


def per_kind(examples: Sequence[Example], outcomes: Sequence[Outcome], threshold: float) -> dict[str, dict[str, float]]:
    """:func:`counts` of each kind present, in :data:`POSITIVE_KINDS` + :data:`NEGATIVE_KINDS` order (then
    any other kind): a positive kind's precision and recall; a negative kind has no positives (recall 0)
    and every link of it is wrong (precision 0, or 1.0 when it has no link)."""
    present = dict.fromkeys(e.kind for e in examples)
    order = [k for k in POSITIVE_KINDS + NEGATIVE_KINDS if k in present] + [k for k in present
                                                                           if k not in POSITIVE_KINDS + NEGATIVE_KINDS]
    return {k: {"strings": sum(e.kind == k for e in examples), **counts(examples, outcomes, threshold, kinds=[k])}
            for k in order}


def sweep(examples, outcomes, thresholds=THRESHOLDS) -> list[dict[str, float]]:
    """:func:`counts` at each threshold."""
    return [{"threshold": t, **counts(examples, outcomes, t)} for t in thresholds]


def f_beta(row: dict[str, float], beta: float = 0.5) -> float:
    """F-beta of a :func:`counts` row (beta 0.5: precision weighs more, a wrong link is worse than none)."""
    p, r = row["precision"], row["recall"]
    return (1 + beta**2) * p * r / (beta**2 * p + r) if p + r > 0 else 0.0


def choose_threshold(rows: Sequence[dict[str, float]], *, min_precision: float = 0.95) -> dict[str, float] | None:
    """The row of best F0.5 among thresholds from which precision stays >= ``min_precision`` up to the top
    (ties: the higher threshold); None when even the top threshold misses the precision."""
    ok = None
    for row in sorted(rows, key=lambda r: -r["threshold"]):
        if row["precision"] < min_precision:
            break
        ok = row if ok is None or f_beta(row) > f_beta(ok) else ok
    return ok


def range_coverage(names: Sequence[str], triples: Sequence[tuple[str, str, str]], *, seed: int = 0,
                   drop: float = 0.5) -> list[dict[str, Any]]:
    """What :class:`RelationRanges` would cost in answers on a KB with held-out edges (see the report).

    ``drop`` of the triples (seeded) are held out; the ranges are read from the rest (with the inverses,
    as artifacts store them) under three rules: the observed range, widened at
    :data:`~llm_bridge.linking.WIDEN_OVERLAP`, and widened plus the entities no kept triple mentions (the
    linker's default).  Per rule: ``inside`` (held-out answers in the allowed set of their relation),
    ``allowed`` (allowed share of the entities, mean over held-out triples) and ``other_kind`` (share of
    the entities of another kind admitted, mean over held-out triples; an entity's kinds: "head" for a
    head of any triple -- MetaQA's films --, "person" for a tail of a :data:`PERSON_RELATIONS` relation,
    else the relation it is a tail of).
    """
    from llm_bridge.linking import WIDEN_OVERLAP

    ids = {n: i for i, n in enumerate(names)}
    base = list(dict.fromkeys(r for _, r, _ in triples))
    rid = {r: k for k, r in enumerate(base)}
    canon = np.array([(ids[h], 2 * rid[r], ids[t]) for h, r, t in triples], dtype=np.int64).reshape(-1, 3)
    perm = np.random.default_rng([seed, 3]).permutation(len(canon))
    k = int(round(drop * len(canon)))

    def both(a):
        return np.concatenate([a, np.stack([a[:, 2], a[:, 1] + 1, a[:, 0]], 1)])

    kept, held = both(canon[perm[k:]]), both(canon[perm[:k]])
    n, nrel = len(names), 2 * len(base)
    kind_of = lambda r: ("head" if r % 2 else  # noqa: E731
                         "person" if base[r // 2] in PERSON_RELATIONS else base[r // 2])
    kinds = sorted({kind_of(r) for r in range(nrel)})
    has = {kd: np.zeros(n, dtype=bool) for kd in kinds}
    full = both(canon)
    for r in range(nrel):
        has[kind_of(r)][full[full[:, 1] == r, 2]] = True
    out = []
    for rule, widen, unknown in (("observed range", None, False), (f"widened ({WIDEN_OVERLAP:g})", WIDEN_OVERLAP, False),
                                 (f"widened ({WIDEN_OVERLAP:g}) + unmentioned entities (default)", WIDEN_OVERLAP, True)):
        rr = RelationRanges(kept, num_entities=n, num_relations=nrel, inverse=[j ^ 1 for j in range(nrel)],
                            widen=widen, unknown=unknown)
        inside = allowed = other = 0.0
        for r in range(nrel):
            t = held[held[:, 1] == r, 2]
            if not len(t):
                continue
            mask, right = rr.allowed(r), has[kind_of(r)]
            inside += float(mask[t].sum())
            allowed += len(t) * float(mask.mean())
            other += len(t) * float((mask & ~right).sum() / max(int((~right).sum()), 1))
        m = max(len(held), 1)
        out.append({"rule": rule, "inside": inside / m, "allowed": allowed / m, "other_kind": other / m,
                    "triples": len(canon), "dropped": k})
    return out


#: What a results file of :func:`save_results` says it is (``"format"``), and its layout's version.
RESULTS_FORMAT = "kgreason linkeval results"
RESULTS_VERSION = 1


def set_fingerprint(data: LinkingSet) -> str:
    """SHA-256 of the name table and the labelled strings (text, kind, label, relation, in order): two runs
    with the same fingerprint linked the same strings against the same table, so their outcomes line up."""
    h = hashlib.sha256()
    h.update(json.dumps(data.names, ensure_ascii=True).encode())
    h.update(json.dumps([[e.text, e.kind, e.target, e.relation] for e in data.examples], ensure_ascii=True).encode())
    return h.hexdigest()


def _set_options(config: "LinkEvalSettings") -> dict[str, Any]:
    return {"kb": str(config.kb), "seed": config.seed, "per_kind": config.per_kind, "held_out": config.held_out,
            "max_names": config.max_names}


def _outcome_rows(outcomes: Sequence[Outcome]) -> list[list[Any]]:
    return [[o.name, o.method, o.score] for o in outcomes]


def save_results(path: Path, *, config: "LinkEvalSettings", data: LinkingSet, result: dict[str, Any],
                 first: list[Outcome]) -> None:
    """Write the ``new`` linker's outcomes (``first``: the run at threshold 0 the sweep is read from;
    ``result["outcomes"]``: at its chosen threshold) and the set's fingerprint, for a later ``--baseline``."""
    doc = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "command": command_line(config),
           "date": time.strftime("%Y-%m-%d"), "set": {**_set_options(config), "strings": len(data.examples),
                                                      "sha256": set_fingerprint(data)},
           "threshold": result["threshold"], "seconds": result["seconds"],
           "outcomes_at_0": _outcome_rows(first), "outcomes": _outcome_rows(result["outcomes"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, json.dumps(doc, indent=None, separators=(",", ":")) + "\n", what="--save-results")


@dataclass(frozen=True)
class Baseline:
    """A results file of an earlier run (:func:`save_results`), checked by :func:`read_baseline`."""

    path: Path
    options: dict[str, Any]
    strings: int
    sha256: str
    threshold: float
    seconds: float
    outcomes_at_0: list[Outcome]
    outcomes: list[Outcome]

    def check_matches(self, data: LinkingSet) -> None:
        """A :class:`UserError` unless the baseline was measured on exactly ``data``'s strings and table."""
        if self.strings == len(data.examples) and self.sha256 == set_fingerprint(data):
            return
        opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.options.items() if v is not None)
        raise UserError(f"--baseline {str(self.path)!r}: measured on another linking set ({self.strings:,} strings "
                        f"from {opts}; this run has {len(data.examples):,}); run with its options, or save a new "
                        "baseline with --save-results")


def _outcomes(rows: Any, key: str, where: str) -> list[Outcome]:
    if not isinstance(rows, list):
        raise UserError(f"{where}: {key!r} is not a list of outcomes")
    out = []
    for k, row in enumerate(rows):
        ok = (isinstance(row, list) and len(row) == 3 and (row[0] is None or isinstance(row[0], str))
              and (row[1] is None or isinstance(row[1], str)) and isinstance(row[2], (int, float))
              and not isinstance(row[2], bool))
        if not ok:
            raise UserError(f"{where}: {key}[{k}] is not [name, method, score]")
        out.append(Outcome(row[0], row[1], float(row[2])))
    return out


def read_baseline(path: str | Path) -> Baseline:
    """The results file ``path`` (``--baseline``); anything else -- missing, unreadable, not JSON, another
    kind of file, a damaged field -- is a one-line :class:`UserError` naming the file and what is wrong."""
    where = f"--baseline {str(path)!r}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text, so not a results file of --save-results") from None
    doc = json_object(text, where, shape="(a results file of --save-results)")
    if doc.get("format") != RESULTS_FORMAT:
        raise UserError(f"{where}: not a results file of --save-results (no \"format\": {RESULTS_FORMAT!r})")
    if doc.get("version") != RESULTS_VERSION:
        raise UserError(f"{where}: results file version {doc.get('version')!r}; this linkeval reads version "
                        f"{RESULTS_VERSION}")
    st = doc.get("set")
    if not (isinstance(st, dict) and isinstance(st.get("strings"), int) and isinstance(st.get("sha256"), str)):
        raise UserError(f"{where}: damaged: 'set' lacks its string count and fingerprint")
    for key in ("threshold", "seconds"):
        if not isinstance(doc.get(key), (int, float)) or isinstance(doc.get(key), bool):
            raise UserError(f"{where}: damaged: {key!r} is not a number")
    first, settled = _outcomes(doc.get("outcomes_at_0"), "outcomes_at_0", where), _outcomes(
        doc.get("outcomes"), "outcomes", where)
    if not len(first) == len(settled) == st["strings"]:
        raise UserError(f"{where}: damaged: {len(first)} and {len(settled)} outcomes for {st['strings']} strings")
    options = {k: st.get(k) for k in ("kb", "seed", "per_kind", "held_out", "max_names")}
    return Baseline(Path(path), options, st["strings"], st["sha256"], float(doc["threshold"]),
                    float(doc["seconds"]), first, settled)


# ------------------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x:.3f}"


def command_line(config: "LinkEvalSettings") -> str:
    """The command of this run, as the report and the results file record it."""
    return (f"python -m experiments.linkeval --kb {config.kb} --seed {config.seed} --per-kind {config.per_kind}"
            + (f" --baseline {config.baseline}" if config.baseline else "")
            + (f" --save-results {config.save_results}" if config.save_results else "")
            + (f" --embedding {config.embedding}" if config.embedding else "")
            + (f" --max-names {config.max_names}" if config.max_names else "") + f" --out {config.out}")


def write_report(path: Path, *, config: "LinkEvalSettings", data: LinkingSet, results: dict[str, dict[str, Any]],
                 chosen: dict[str, float] | None, plot: Path | None,
                 coverage: Sequence[dict[str, Any]] = ()) -> None:
    ex = data.examples
    kinds = Counter(e.kind for e in ex)
    lines = [
        "# Entity linking on a labelled MetaQA set",
        "",
        f"Produced by `{command_line(config)}` ({time.strftime('%Y-%m-%d')}).",
        "",
        f"Name table: {len(data.names):,} names (MetaQA kb.txt"
        + (f", a random {config.max_names:,} of its names," if config.max_names else "")
        + f" minus {config.held_out:.0%} held out; some films "
        f"renamed `X (film)`, some doubled as `X (film)` + `X (novel)`). Labelled strings: {len(ex):,} "
        f"({sum(e.target is not None for e in ex):,} positives, {sum(e.target is None for e in ex):,} negatives). "
        "A link is correct when it picks the labelled entity; "
        "precision = correct / links, recall = correct / positives.",
        "",
        f"Every string carries the relation its question asked ({sum(e.relation is not None for e in ex):,} of "
        f"{len(ex):,}); the table's KG is kb.txt's triples over the table ({len(data.triples):,} with the inverses, "
        f"{len(data.relations)} relations). `new` is called with the relation and respects its range "
        "(`RelationRanges` of the table's KG); `new, no relation` is the same linker called without it; "
        "a `baseline` (an earlier run's saved results) is shown as it was measured.",
        "",
        "| kind | strings | label |",
        "|---|---:|---|",
    ]
    lines += [f"| {k} | {kinds[k]} | {'positive' if k in POSITIVE_KINDS else 'negative'} |"
              for k in POSITIVE_KINDS + NEGATIVE_KINDS if kinds[k]]
    lines += ["", "## Precision and recall over the fuzzy threshold", "",
              "| threshold | " + " | ".join(f"{name} precision | {name} recall" for name in results) + " |",
              "|---:|" + "---:|---:|" * len(results)]
    for k, t in enumerate(THRESHOLDS):
        cells = []
        for r in results.values():
            row = r["sweep"][k]
            cells += [_fmt(row["precision"]), _fmt(row["recall"])]
        mark = " **(chosen)**" if chosen and t == chosen["threshold"] else ""
        lines.append(f"| {t:g}{mark} | " + " | ".join(cells) + " |")
    lines += ["", "## Side by side at each linker's threshold", "",
              "| linker | threshold | links | correct | precision | recall (linking rate of positives) | seconds |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        c = counts(ex, r["outcomes"], r["threshold"])
        lines.append(f"| {name} | {r['threshold']:g} | {c['links']} | {c['correct']} | {_fmt(c['precision'])} | "
                     f"{_fmt(c['recall'])} | {r['seconds']:.1f} |")
    lines += ["", "## Per kind (at each linker's threshold)", "",
              "Each cell: precision / recall (links). Precision = correct links / links (`-` without links), "
              "recall = correct links / positives (`-` for a negative kind: every link of it is wrong).",
              "", "| kind | label | strings | " + " | ".join(results) + " |", "|---|---|---:|" + "---:|" * len(results)]
    tables = [per_kind(ex, r["outcomes"], r["threshold"]) for r in results.values()]
    for kind, first in tables[0].items():
        cells = [f"{_fmt(t[kind]['precision']) if t[kind]['links'] else '-'} / "
                 f"{_fmt(t[kind]['recall']) if t[kind]['positives'] else '-'} ({t[kind]['links']})" for t in tables]
        label = "positive" if first["positives"] else "negative"
        lines.append(f"| {kind} | {label} | {first['strings']} | " + " | ".join(cells) + " |")
    if coverage:
        lines += ["", "## Relation ranges on held-out edges", "",
                  f"What the range rule would cost in answers: kb.txt's triples, {coverage[0]['dropped']:,} of "
                  f"{coverage[0]['triples']:,} (half, seed {config.seed}) held out as LGOT's protocol drops them; "
                  "the ranges read from the rest. *Inside*: held-out answers (tail of a held-out triple, both "
                  "directions) in the allowed set of their relation; *allowed*: the allowed share of all entities "
                  "(mean over held-out triples); *other kind admitted*: the share of the entities of another kind "
                  "(film / person / tag / genre / ...) the allowed set takes in.", "",
                  "| rule | inside | allowed | other kind admitted |", "|---|---:|---:|---:|"]
        lines += [f"| {c['rule']} | {_fmt(c['inside'])} | {_fmt(c['allowed'])} | {c['other_kind']:.4f} |"
                  for c in coverage]
    lines += ["", "## Methods of the links (new linker, chosen threshold)", ""]
    new = next(iter(results.values()))
    meth = Counter(o.method for o in new["outcomes"]
                   if o.name is not None and not (o.method == "fuzzy" and o.score < new["threshold"]))
    lines += ["| method | links |", "|---|---:|"] + [f"| {m} | {n} |" for m, n in meth.most_common()]
    wrong = [(e, o) for e, o in zip(ex, new["outcomes"])
             if o.name is not None and not (o.method == "fuzzy" and o.score < new["threshold"]) and not _correct(e, o)]
    lines += ["", f"Wrong links of the new linker: {len(wrong)}. First 15:", "",
              "| kind | string | label | linked to | method | score |", "|---|---|---|---|---|---:|"]
    esc = lambda s: "" if s is None else str(s).replace("|", "\\|")  # noqa: E731
    lines += [f"| {e.kind} | {esc(e.text)} | {esc(e.target) or '(none)'} | {esc(o.name)} | {o.method} | {o.score:.1f} |"
              for e, o in wrong[:15]]
    if plot is not None:
        lines += ["", f"![precision and recall vs threshold]({plot.name})"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_plot(path: Path, results: dict[str, dict[str, Any]], chosen: dict[str, float] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, r), color in zip(results.items(), ("C0", "C1", "C2", "C3")):
        ts = [row["threshold"] for row in r["sweep"]]
        ax.plot(ts, [row["precision"] for row in r["sweep"]], color=color, label=f"{name}: precision")
        ax.plot(ts, [row["recall"] for row in r["sweep"]], color=color, linestyle="--", label=f"{name}: recall")
    ax.axhline(0.95, color="grey", linewidth=0.8, linestyle=":")
    if chosen:
        ax.axvline(chosen["threshold"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("fuzzy threshold (score 0-100)")
    ax.set_ylabel("precision / recall")
    ax.set_ylim(0, 1.02)
    ax.set_title("Entity linking on the labelled MetaQA set")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": PLOT_MARK})
    plt.close(fig)


# The plot's name is derived from --out, not given by the user, so it may only replace a file this tool
# wrote: one carrying this PNG "Software" text, or the plot an existing linkeval report beside it links to.
PLOT_MARK = "kgreason experiments.linkeval"


def plot_replaceable(plot: Path, report: Path) -> bool:
    """True when writing ``plot`` loses nothing: it does not exist, or an earlier run of this tool wrote it."""
    if not plot.exists():
        return True
    if not plot.is_file():
        return False
    try:
        with plot.open("rb") as f:
            if PLOT_MARK.encode() in f.read(1 << 16):
                return True
        if report.is_file():
            with report.open("rb") as f:
                head = f.read(1 << 20)
            return head.startswith(b"# Entity linking") and f"]({plot.name})".encode() in head
    except OSError:
        return False
    return False


# ---------------------------------------------------------------------------------------- CLI
def _check_encoder(value: str, flag: str) -> str:
    """``value`` if it names a known sentence encoder (imported only when the flag is given)."""
    from engine.paths.embeddings import ENCODERS

    if value not in ENCODERS:
        raise UserError(f"{flag}: unknown encoder {value!r}; known: {', '.join(ENCODERS)}")
    return value


@dataclass(frozen=True, kw_only=True)
class LinkEvalSettings(Settings):
    """What ``python -m experiments.linkeval`` was asked to do; each field's flag is declared with it."""

    kb: str = setting(help="MetaQA kb.txt (head|relation|tail lines)")
    out: str = setting(help="Markdown report; the PNG plot is written next to it")
    seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="random seed of the set, 0 to 2**32-1")
    per_kind: int = setting(400, low=1, high=100_000, integer=True, help="strings per kind of perturbation")
    held_out: float = setting(0.05, low=0, high=1, low_open=True, high_open=True,
                              help="share of names held out as negatives")
    baseline: str | None = setting(None, metavar="RESULTS.json",
                                   help="an earlier run's --save-results file, shown side by side (the same set options)")
    save_results: str | None = setting(None, metavar="RESULTS.json",
                                       help="also write the linker's outcomes, a later run's --baseline")
    embedding: str | None = setting(None, check=_check_encoder,
                                    help="also measure the embedding matcher with this encoder (minilm)")
    min_precision: float = setting(0.95, low=0, high=1, low_open=True, help="precision the chosen threshold keeps")
    max_names: int | None = setting(None, low=10, integer=True, shown_default="all",
                                    help="use a seeded random sample of this many KB names, e.g. to afford --embedding")


#: The former name (before the settings rule, docs/cli.md "Settings classes").
Config = LinkEvalSettings


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.linkeval",
                       description="Build a labelled linking set from MetaQA's kb.txt and measure linking "
                                   "precision/recall over the fuzzy threshold.")
    add_settings_arguments(p, LinkEvalSettings)
    return p


def parse_args(argv: Sequence[str] | None) -> LinkEvalSettings:
    """The settings of ``argv`` (ranges checked with the fields), then the files: before any linking, the
    report and its plot never replace --kb, and their folders can be made."""
    a = settings_from_args(LinkEvalSettings, _parser().parse_args(argv))
    if a.baseline is not None and not Path(a.baseline).is_file():
        raise UserError(f"--baseline {a.baseline!r}: no such file (an earlier run's --save-results)")
    if Path(a.out).is_dir():
        raise UserError(f"--out: {a.out!r} is a folder; give the Markdown file to write")
    # Before any linking: the report and its plot never replace --kb, and their folder can be made.
    plot = Path(a.out).with_suffix(".png")
    if plot == Path(a.out):
        raise UserError(f"--out: {a.out!r} ends in .png, the name of its plot; give the Markdown report's name "
                        "(the plot is written next to it as .png)")
    inputs = [("--kb", a.kb), ("--baseline", a.baseline)]
    for what, path in (("--out", a.out), ("--out's plot", plot)):
        check_not_input(path, what=what, inputs=inputs)
    if not plot_replaceable(plot, Path(a.out)):
        raise UserError(f"--out's plot: {str(plot)!r} exists and was not written by experiments.linkeval; not "
                        "replacing it (move it, or choose another --out)")
    _check_parent(Path(a.out), "--out", create=True)
    if a.save_results is not None:  # checked as --out is: its folder may be new (made when it is written)
        for what, path in (("--out", a.out), ("--out's plot", plot)):
            if Path(os.path.realpath(a.save_results)) == Path(os.path.realpath(path)):
                raise UserError(f"--save-results {a.save_results!r}: is also {what}; give another file")
        check_not_input(a.save_results, what="--save-results", inputs=inputs)
        if Path(a.save_results).is_dir():
            raise UserError(f"--save-results: {a.save_results!r} is a folder; give the JSON file to write")
        _check_parent(Path(a.save_results), "--save-results", create=True)
    return a


def run(config: LinkEvalSettings) -> dict[str, Any]:
    """Build the set, measure the linkers, write the report and plot; returns the chosen row."""
    old = read_baseline(config.baseline) if config.baseline else None  # a bad baseline fails before any linking
    names, persons, years, triples = load_kb(config.kb)
    if config.max_names is not None and config.max_names < len(names):
        keep = np.random.default_rng([config.seed, 1]).permutation(len(names))[: config.max_names]
        names = [names[i] for i in sorted(keep)]
        kept = set(names)
        triples = [t for t in triples if t[0] in kept and t[2] in kept]
    data = build_set(names, persons, years, seed=config.seed, per_kind=config.per_kind, held_out=config.held_out,
                     triples=triples)
    if old is not None:
        old.check_matches(data)
    ranges = data.ranges()
    rel_ids = {r: k for k, r in enumerate(data.relations)}
    results: dict[str, dict[str, Any]] = {}

    def measure(label: str, make: Callable[[float], Any], threshold: float | None, ranged: bool = False) -> None:
        """The sweep from one run at threshold 0, then (``threshold`` given) the exact outcomes at it."""
        t0 = time.perf_counter()
        rel = rel_ids if ranged else None
        outcomes = evaluate(make(0.0), data.examples, desc=label, relations=rel)
        results[label] = {"outcomes": outcomes, "threshold": 0.0, "seconds": time.perf_counter() - t0,
                          "sweep": sweep(data.examples, outcomes), "make": make, "relations": rel}
        if threshold is not None:
            settle(label, threshold)

    def settle(label: str, threshold: float) -> None:
        """Outcomes at ``threshold`` exactly: the rules after the fuzzy step (written-out acronyms,
        embedding) only run on a string the fuzzy step rejected, which at threshold 0 it never does; so
        every string the run at 0 did not link at or above ``threshold`` is linked again."""
        r = results[label]
        t0 = time.perf_counter()
        redo = [k for k, o in enumerate(r["outcomes"])
                if o.name is None or (o.method == "fuzzy" and o.score < threshold)]
        again = evaluate(r["make"](threshold), [data.examples[k] for k in redo], desc=f"{label} at {threshold:g}",
                         relations=r["relations"])
        outcomes = list(r["outcomes"])
        for k, o in zip(redo, again):
            outcomes[k] = o
        r.update(outcomes=outcomes, threshold=threshold, seconds=r["seconds"] + time.perf_counter() - t0)

    measure("new", lambda th: EntityLinker(names=data.names, threshold=th, ranges=ranges), None, True)
    first = results["new"]["outcomes"]  # at threshold 0: what a later run's --baseline sweeps
    chosen = choose_threshold(results["new"]["sweep"], min_precision=config.min_precision)
    settle("new", DEFAULT_THRESHOLD if chosen is None else chosen["threshold"])
    measure("new, no relation", lambda th: EntityLinker(names=data.names, threshold=th), DEFAULT_THRESHOLD)
    if old is not None:
        results[f"baseline ({old.path.name})"] = {"outcomes": old.outcomes, "threshold": old.threshold,
                                                  "seconds": old.seconds, "sweep": sweep(data.examples,
                                                                                         old.outcomes_at_0)}
    if config.embedding:
        th = results["new"]["threshold"]
        t0 = time.perf_counter()
        outcomes = evaluate(EntityLinker(names=data.names, threshold=th, embedding=config.embedding, ranges=ranges),
                            data.examples, desc=f"new + {config.embedding}", relations=rel_ids)
        results[f"new + {config.embedding}"] = {"outcomes": outcomes, "threshold": th, "seconds": time.perf_counter()
                                                - t0, "sweep": sweep(data.examples, outcomes)}
    coverage = range_coverage(names, triples, seed=config.seed)
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_suffix(".png")
    write_plot(plot, results, chosen)
    write_report(out, config=config, data=data, results=results, chosen=chosen, plot=plot, coverage=coverage)
    if config.save_results:
        save_results(Path(config.save_results), config=config, data=data, result=results["new"], first=first)
    for name, r in results.items():
        c = counts(data.examples, r["outcomes"], r["threshold"])
        print(f"{name}: threshold {r['threshold']:g}: precision {c['precision']:.3f}, recall {c['recall']:.3f} "
              f"({c['correct']}/{c['positives']} positives, {c['links']} links), {r['seconds']:.1f} s")
    print(f"wrote {out} and {plot}" + (f", and the results {config.save_results}" if config.save_results else ""))
    return {"chosen": chosen, "results": results}


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
