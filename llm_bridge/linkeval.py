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
  not a name in the KB), and the ambiguous bare titles.

A link is correct when it picks the labelled entity (or an entity with the same
normalised name); precision = correct links / links, recall = correct links /
positives.  The fuzzy threshold is swept from one run at threshold 0 (a string
links at threshold ``t`` iff it linked by a non-fuzzy method, or fuzzily with a
score ``>= t``; the fuzzy decision is otherwise independent of the threshold).

Run (writes the Markdown table and the PNG next to it)::

    python -m llm_bridge.linkeval --kb ../shared/data/metaqa/kb.txt \\
        --out benchmarks/results/lgot/linking.md --baseline-rev 0a51aa3

``--baseline-rev`` measures the linker of that git revision side by side (its
``llm_bridge/linking.py`` is loaded from ``git show`` into a temporary module).
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kgreason.cli import ArgumentParser, check_seed
from kgreason.errors import UserError, cli_main
from kgreason.files import _check_parent, check_not_input, read_lines
from llm_bridge.linking import DEFAULT_THRESHOLD, EntityLinker, normalize

__all__ = ["Example", "LinkingSet", "load_kb_names", "build_set", "evaluate", "sweep", "choose_threshold", "main"]

PERSON_RELATIONS = ("directed_by", "written_by", "starred_actors")
CORPORATE = (" Inc.", " Corporation", " Ltd", " Co.", ", Inc.", " LLC")
ACCENTS = {"a": "á", "e": "é", "i": "í", "o": "ö", "u": "ü", "n": "ñ", "c": "ç"}
POSITIVE_KINDS = ("case", "article", "punctuation", "corporate", "accents", "reorder", "acronym", "typo",
                  "qualifier_added", "qualifier_dropped")
NEGATIVE_KINDS = ("held_out", "held_out_acronym", "swapped_first_name", "ambiguous_bare")
THRESHOLDS = tuple(float(t) for t in range(50, 101, 2))


@dataclass(frozen=True)
class Example:
    """One labelled string: ``target`` is the table name it means (``None`` for a negative)."""

    text: str
    target: str | None
    kind: str
    source: str


@dataclass
class LinkingSet:
    """The linker's name table and the labelled strings."""

    names: list[str]
    examples: list[Example]


def load_kb_names(path: str | Path) -> tuple[list[str], set[str], dict[str, str]]:
    """(entity names in first-seen order, person names, film -> release year) of a MetaQA ``kb.txt``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--kb: {str(path)!r} is not a file (MetaQA's kb.txt: head|relation|tail lines)")
    seen: dict[str, None] = {}
    persons: set[str] = set()
    years: dict[str, str] = {}
    for lineno, line in read_lines(path, what="--kb"):  # a non-UTF-8 line is a FILE:LINE error
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3:
            raise UserError(f"{path}:{lineno}: expected head|relation|tail, got {len(parts)} field(s)")
        h, r, t = (p.strip() for p in parts)
        seen.setdefault(h, None)
        seen.setdefault(t, None)
        if r in PERSON_RELATIONS:
            persons.add(t)
        elif r == "release_year":
            years.setdefault(h, t)
    if not seen:  # else an empty report: 0 positives, "precision 1.000"
        raise UserError(f"--kb {path}: no head|relation|tail line (an empty file?)")
    return list(seen), persons, years


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
              per_kind: int = 400, held_out: float = 0.05) -> LinkingSet:
    """The name table and labelled strings (see the module doc); deterministic for a seed.

    ``per_kind``: strings per positive kind and per negative kind (fewer when too few names fit).
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
    return LinkingSet(table, examples)


# ------------------------------------------------------------------------------- evaluation
@dataclass(frozen=True)
class Outcome:
    """What a linker did with one example: linked name (or None), method, score."""

    name: str | None
    method: str | None
    score: float


def evaluate(linker: Any, examples: Sequence[Example], *, desc: str = "linking") -> list[Outcome]:
    """Run ``linker.link`` on every example (progress on stderr)."""
    from kgreason.progress import progress_bar

    out = []
    for ex in progress_bar(examples, desc=desc, file=sys.stderr, mininterval=1.0, leave=False):
        link = linker.link(ex.text)
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


def check_revision(rev: str) -> str:
    """``rev`` if it can only be read by git as a revision, else a one-line :class:`UserError`: a value
    starting with '-' would be taken as an option (``--output=FILE`` writes a file), and an empty one, one
    holding ':' (``rev:path`` syntax) or a control character never names a commit."""
    if not rev or rev.startswith("-") or ":" in rev or not rev.isprintable() or rev != rev.strip():
        raise UserError(f"--baseline-rev {rev!r}: not a git revision (a commit, branch or tag name, such as "
                        "HEAD~1 or 0a51aa3)")
    return rev


def _load_revision(rev: str) -> Any:
    """``llm_bridge/linking.py`` of git revision ``rev``, as a module (``rev`` checked by :func:`check_revision`).

    git gets ``--end-of-options`` before the revision, so that nothing in it is read as an option; a
    missing git, an unknown revision, or a file there without an ``EntityLinker`` is a :class:`UserError`.
    """
    check_revision(rev)
    repo = Path(__file__).resolve().parent.parent
    try:
        src = subprocess.run(["git", "show", "--end-of-options", f"{rev}:llm_bridge/linking.py"], cwd=repo,
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        detail = " ".join(str(getattr(exc, "stderr", "") or exc).split())
        raise UserError(f"--baseline-rev {rev!r}: cannot read llm_bridge/linking.py from git ({detail})") from None
    folder = Path(tempfile.mkdtemp(prefix="linking_baseline_"))
    try:
        path = folder / "linking_baseline.py"
        path.write_text(src, encoding="utf-8")
        spec = importlib.util.spec_from_file_location("linking_baseline", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
        try:
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - that revision's code, not ours: report which and why
            raise UserError(f"--baseline-rev {rev!r}: its llm_bridge/linking.py does not load "
                            f"({type(exc).__name__}: {exc})") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not hasattr(mod, "EntityLinker") or not isinstance(getattr(mod, "DEFAULT_THRESHOLD", None), (int, float)):
        raise UserError(f"--baseline-rev {rev!r}: its llm_bridge/linking.py has no EntityLinker and "
                        "DEFAULT_THRESHOLD to compare with")
    return mod


def baseline_linker(mod: Any, rev: str, names: Sequence[str]) -> Any:
    """``mod.EntityLinker(names=..., threshold=0.0)`` of the ``--baseline-rev`` module; a revision whose linker
    takes other arguments is a one-line :class:`UserError`, not a TypeError out of that revision's code."""
    try:
        return mod.EntityLinker(names=names, threshold=0.0)
    except TypeError as exc:
        raise UserError(f"--baseline-rev {rev!r}: its EntityLinker cannot be built as this tool builds it ({exc})") from None


# ------------------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x:.3f}"


def write_report(path: Path, *, config: "Config", data: LinkingSet, results: dict[str, dict[str, Any]],
                 chosen: dict[str, float] | None, plot: Path | None) -> None:
    ex = data.examples
    kinds = Counter(e.kind for e in ex)
    lines = [
        "# Entity linking on a labelled MetaQA set",
        "",
        f"Produced by `python -m llm_bridge.linkeval --kb {config.kb} --seed {config.seed} --per-kind "
        f"{config.per_kind}" + (f" --baseline-rev {config.baseline_rev}" if config.baseline_rev else "")
        + (f" --embedding {config.embedding}" if config.embedding else "")
        + (f" --max-names {config.max_names}" if config.max_names else "") + f" --out {config.out}`"
        f" ({time.strftime('%Y-%m-%d')}).",
        "",
        f"Name table: {len(data.names):,} names (MetaQA kb.txt"
        + (f", a random {config.max_names:,} of its names," if config.max_names else "")
        + f" minus {config.held_out:.0%} held out; some films "
        f"renamed `X (film)`, some doubled as `X (film)` + `X (novel)`). Labelled strings: {len(ex):,} "
        f"({sum(e.target is not None for e in ex):,} positives, {sum(e.target is None for e in ex):,} negatives). "
        "A link is correct when it picks the labelled entity; "
        "precision = correct / links, recall = correct / positives.",
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
              "Positives: recall (correct links / strings); wrong links in brackets. Negatives: false links / strings.",
              "", "| kind | " + " | ".join(results) + " |", "|---|" + "---:|" * len(results)]
    for kind in POSITIVE_KINDS + NEGATIVE_KINDS:
        if not kinds[kind]:
            continue
        cells = []
        for r in results.values():
            c = counts(ex, r["outcomes"], r["threshold"], kinds=[kind])
            if kind in POSITIVE_KINDS:
                cells.append(f"{_fmt(c['recall'])} ({c['links'] - c['correct']})")
            else:
                cells.append(f"{c['links']} / {kinds[kind]}")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
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
    for (name, r), color in zip(results.items(), ("C0", "C1", "C2")):
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
PLOT_MARK = "kgreason llm_bridge.linkeval"


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
@dataclass(frozen=True)
class Config:
    """``python -m llm_bridge.linkeval`` options (defaults as documented in ``--help``)."""

    kb: str
    out: str
    seed: int = 0
    per_kind: int = 400
    held_out: float = 0.05
    baseline_rev: str | None = None
    embedding: str | None = None
    min_precision: float = 0.95
    max_names: int | None = None


def parse_args(argv: Sequence[str] | None) -> Config:
    p = ArgumentParser(prog="python -m llm_bridge.linkeval",
                       description="Build a labelled linking set from MetaQA's kb.txt and measure linking "
                                   "precision/recall over the fuzzy threshold.")
    p.add_argument("--kb", required=True, help="MetaQA kb.txt (head|relation|tail lines)")
    p.add_argument("--out", required=True, help="Markdown report; the PNG plot is written next to it")
    p.add_argument("--seed", type=int, default=0, help="random seed of the set (default 0)")
    p.add_argument("--per-kind", type=int, default=400, help="strings per kind of perturbation (default 400)")
    p.add_argument("--held-out", type=float, default=0.05, help="share of names held out as negatives (default 0.05)")
    p.add_argument("--baseline-rev", default=None, help="git revision whose linker to measure side by side")
    p.add_argument("--embedding", default=None, help="also measure the embedding matcher with this encoder (minilm)")
    p.add_argument("--min-precision", type=float, default=0.95, help="precision the chosen threshold keeps (0.95)")
    p.add_argument("--max-names", type=int, default=None,
                   help="use a seeded random sample of this many KB names (default: all), e.g. to afford --embedding")
    a = p.parse_args(argv)
    check_seed(a.seed)
    if a.baseline_rev is not None:
        check_revision(a.baseline_rev)
    if Path(a.out).is_dir():
        raise UserError(f"--out: {a.out!r} is a folder; give the Markdown file to write")
    # Before any linking: the report and its plot never replace --kb, and their folder can be made.
    plot = Path(a.out).with_suffix(".png")
    if plot == Path(a.out):
        raise UserError(f"--out: {a.out!r} ends in .png, the name of its plot; give the Markdown report's name "
                        "(the plot is written next to it as .png)")
    for what, path in (("--out", a.out), ("--out's plot", plot)):
        check_not_input(path, what=what, inputs=[("--kb", a.kb)])
    if not plot_replaceable(plot, Path(a.out)):
        raise UserError(f"--out's plot: {str(plot)!r} exists and was not written by llm_bridge.linkeval; not "
                        "replacing it (move it, or choose another --out)")
    _check_parent(Path(a.out), "--out", create=True)
    if a.embedding is not None:
        from engine.paths.embeddings import ENCODERS

        if a.embedding not in ENCODERS:
            raise UserError(f"--embedding: unknown encoder {a.embedding!r}; known: {', '.join(ENCODERS)}")
    if not 1 <= a.per_kind <= 100_000:
        raise UserError(f"--per-kind must be in [1, 100000], got {a.per_kind}")
    if not 0.0 < a.held_out < 1.0:
        raise UserError(f"--held-out must be in (0, 1), got {a.held_out}")
    if not 0.0 < a.min_precision <= 1.0:
        raise UserError(f"--min-precision must be in (0, 1], got {a.min_precision}")
    if a.max_names is not None and a.max_names < 10:
        raise UserError(f"--max-names must be >= 10, got {a.max_names}")
    return Config(kb=a.kb, out=a.out, seed=a.seed, per_kind=a.per_kind, held_out=a.held_out,
                  baseline_rev=a.baseline_rev, embedding=a.embedding, min_precision=a.min_precision,
                  max_names=a.max_names)


def run(config: Config) -> dict[str, Any]:
    """Build the set, measure the linkers, write the report and plot; returns the chosen row."""
    old = _load_revision(config.baseline_rev) if config.baseline_rev else None  # a bad revision fails first
    names, persons, years = load_kb_names(config.kb)
    if config.max_names is not None and config.max_names < len(names):
        keep = np.random.default_rng([config.seed, 1]).permutation(len(names))[: config.max_names]
        names = [names[i] for i in sorted(keep)]
    data = build_set(names, persons, years, seed=config.seed, per_kind=config.per_kind, held_out=config.held_out)
    results: dict[str, dict[str, Any]] = {}

    def measure(label: str, make: Callable[[], Any], threshold: float) -> None:
        t0 = time.perf_counter()
        linker = make()
        outcomes = evaluate(linker, data.examples, desc=label)
        results[label] = {"outcomes": outcomes, "threshold": threshold, "seconds": time.perf_counter() - t0,
                          "sweep": sweep(data.examples, outcomes)}

    measure("new", lambda: EntityLinker(names=data.names, threshold=0.0), DEFAULT_THRESHOLD)
    chosen = choose_threshold(results["new"]["sweep"], min_precision=config.min_precision)
    if chosen is not None:
        results["new"]["threshold"] = chosen["threshold"]
    if old is not None:
        measure(f"old ({config.baseline_rev})", lambda: baseline_linker(old, config.baseline_rev, data.names),
                float(old.DEFAULT_THRESHOLD))
    if config.embedding:
        th = results["new"]["threshold"]
        measure(f"new + {config.embedding}",
                lambda: EntityLinker(names=data.names, threshold=th, embedding=config.embedding), th)
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = out.with_suffix(".png")
    write_plot(plot, results, chosen)
    write_report(out, config=config, data=data, results=results, chosen=chosen, plot=plot)
    for name, r in results.items():
        c = counts(data.examples, r["outcomes"], r["threshold"])
        print(f"{name}: threshold {r['threshold']:g}: precision {c['precision']:.3f}, recall {c['recall']:.3f} "
              f"({c['correct']}/{c['positives']} positives, {c['links']} links), {r['seconds']:.1f} s")
    print(f"wrote {out} and {plot}")
    return {"chosen": chosen, "results": results}


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
