"""The ask loop's reading of question text, no embeddings: the topic entity (:func:`find_topic`), the
question without it (:func:`question_text`), what it asks for (:func:`answer_phrase`, :func:`kind_phrase`),
the words that can name a relation (:func:`content_words`, :func:`words_match`, :func:`lexical_f1`), and the
labelled questions of an exemplars file (:func:`read_exemplars`)."""
from __future__ import annotations

import os
import re
from typing import Callable, Sequence

from kgreason.errors import UserError
from kgreason.files import read_json_objects, relation_path_field, text_field

from engine.exec.ask_settings import KIND_WORDS

__all__ = ["FUNCTION_WORDS", "MIN_WORD", "MIN_COMPOUND", "WH_WORDS", "WH_CENTRE", "ANSWER_PHRASE_WORDS",
           "FILLER_WORDS", "question_text", "kind_phrase", "answer_phrase", "content_words", "words_match",
           "lexical_f1", "find_topic", "read_exemplars", "fold", "folded_names"]

#: English function words (and the question words) never read as naming a relation; words shorter than
#: :data:`MIN_WORD` letters are never read either.
FUNCTION_WORDS = frozenset("""
    about above after again against also among another been before being below between both could does
    doing down during each either every from further have having here inverse into itself just many more
    most much must neither only other over same should some such than that their theirs them then there
    these they this those through under until upon very were what when where which while whom whose with
    within without would your yours""".split())
MIN_WORD = 4
#: The shortest last part of a closed compound read as a word of its own (:func:`words_match`).
MIN_COMPOUND = 6
#: English question words: a question's answer phrase starts at the first of them (:func:`answer_phrase`).
WH_WORDS = ("which", "what", "who", "whom", "whose", "where", "when", "how")
#: Words in an answer phrase: 3 ("what sort of", "which words describe") rather than 2 ("what sort"), chosen
#: on MetaQA dev questions (docs/ask.md: 91.7 / 63.3 / 64.0 -> 92.5 / 63.7 / 65.0 with the full KG).
ANSWER_PHRASE_WORDS = 3
#: Answer phrases whose mean embedding centres the question side of the answer-type term (fixed, so a
#: question's cost does not depend on the other questions asked).
WH_CENTRE = ("who", "what", "which", "when", "where", "whom", "whose", "how many", "how much", "what is",
             "which one")
#: Words a kind phrase skips (:func:`kind_phrase`): English articles and auxiliary verbs, which say nothing
#: of what is asked for ("what *are the* movies").
FILLER_WORDS = frozenset("a an the is are was were be been being do does did has have had can could will "
                         "would shall should may might must".split())
_WH = re.compile(r"\b(" + "|".join(WH_WORDS) + r")\b", re.IGNORECASE)
_BRACKET = re.compile(r"\[([^\[\]]+)\]")
_WORD = re.compile(r"\S+")


def fold(s: str) -> str:
    """``s`` case-folded, its white space runs one space: how names are compared case-insensitively."""
    return " ".join(s.casefold().split())


def question_text(question: str, topic: str | None = None) -> str:
    """The question without its topic mention (brackets removed; the topic's words dropped)."""
    text = _BRACKET.sub(" ", question) if _BRACKET.search(question) else question
    if topic and not _BRACKET.search(question):
        text = re.sub(re.escape(topic), " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def kind_phrase(text: str, words: int = KIND_WORDS) -> str:
    """The words saying what kind of thing a question asks for: its first English question word
    (:data:`WH_WORDS`), and after "which" or "what", the next ``words`` words that are not
    :data:`FILLER_WORDS` ("what are the movies that share" -> "what movies that", "which films share" ->
    "which films share"), after "how" the next word ("how many"); "who", "when", "where" ... say it alone
    ("when were the movies released" asks for a time, not movies).  No question word: the first words."""
    m = _WH.search(text)
    if m is None:
        return " ".join(text.split()[: words + 1])
    wh, rest = m.group(0), text[m.end():].split()
    if wh.lower() in ("which", "what"):
        rest = [w for w in rest if w.lower().strip("?,.!") not in FILLER_WORDS][:words]
    else:
        rest = rest[:1] if wh.lower() == "how" else []
    return " ".join([wh] + rest)


def answer_phrase(text: str) -> str:
    """The words saying what a question asks for: :data:`ANSWER_PHRASE_WORDS` words from its first English
    question word (:data:`WH_WORDS`; "[X] appears in which movies" -> "which movies", "what sort of movie
    is [X]" -> "what sort of"), else its first words."""
    m = _WH.search(text)
    words = (text[m.start():] if m else text).split()
    return " ".join(words[:ANSWER_PHRASE_WORDS])


_LETTERS = re.compile(r"[a-z0-9]+")


def content_words(text: str) -> list[str]:
    """The lower-cased words of ``text`` (runs of letters and digits) of at least :data:`MIN_WORD` characters
    that are not :data:`FUNCTION_WORDS`, in order: the words that can name a relation."""
    return [w for w in _LETTERS.findall(str(text).lower()) if len(w) >= MIN_WORD and w not in FUNCTION_WORDS]


def words_match(a: str, b: str) -> bool:
    """Whether two words are read as the same word: a common prefix of at least :data:`MIN_WORD` characters
    that covers 60% of the shorter one ("writer"/"written", "director"/"directed", "stars"/"starred"; not
    "wrote"/"written"): English inflection and derivation change the end of a word, rarely its start.  Or
    one is a closed compound whose last part, of at least :data:`MIN_COMPOUND` letters, matches the other
    that way ("screenwriter"/"written", "costar"/"starred" no: "star" is too short to stand alone)."""
    if _prefix_match(a, b):
        return True
    for x, y in ((a, b), (b, a)):
        for k in range(MIN_WORD - 1, len(x) - MIN_COMPOUND + 1):  # the compound's first part: 3+ letters
            if _prefix_match(x[k:], y):
                return True
    return False


def _prefix_match(a: str, b: str) -> bool:
    n = len(os.path.commonprefix((a, b)))
    return n >= MIN_WORD and n >= 0.6 * min(len(a), len(b))


def lexical_f1(path: Sequence[str], named: set[str] | frozenset[str]) -> float:
    """F1 between the set of base relations a path follows (``path``: base names, repeats counted once) and
    ``named``, the base relations the question names: 1 when the path follows exactly the named relations;
    0 when the question names none or the path follows none of them."""
    followed = set(path)
    if not followed or not named:
        return 0.0
    both = len(followed & set(named))
    if not both:
        return 0.0
    precision, recall = both / len(followed), both / len(named)
    return 2 * precision * recall / (precision + recall)


def find_topic(question: str, names: Sequence[str], *, index: dict[str, int] | None = None,
               folded: dict[str, int] | None = None, linker: Callable[[str], int | None] | None = None,
               max_words: int = 12) -> tuple[int | None, str]:
    """(entity id or None, how) of the question's topic entity.

    ``how``: ``"brackets"``, ``"linked"`` (the linker mapped the bracketed mention),
    ``"words"`` (the longest word run equal to a name, case-insensitive) or an
    explanation of the failure.  ``index``/``folded``: name -> id maps (built from
    ``names`` when not given; pass them for many questions).
    """
    index = {n: i for i, n in enumerate(names)} if index is None else index
    m = _BRACKET.search(question)
    if m is not None:
        mention = m.group(1).strip()
        if mention in index:
            return index[mention], "brackets"
        folded = folded_names(names) if folded is None else folded
        if fold(mention) in folded:
            return folded[fold(mention)], "brackets"
        if linker is not None:
            i = linker(mention)
            if i is not None:
                return int(i), "linked"
        return None, f"[{mention}] is no entity name" + ("" if linker is None else " and was not linked")
    folded = folded_names(names) if folded is None else folded
    words = _WORD.findall(question)
    stripped = [w.strip("?!.,;:\"'()") for w in words]
    for n in range(min(max_words, len(words)), 0, -1):
        for s in range(len(words) - n + 1):
            for cand in (" ".join(words[s:s + n]), " ".join(stripped[s:s + n])):
                key = fold(cand)
                if key and key in folded:
                    return folded[key], "words"
    return None, "no entity name in the question (put the topic entity in [brackets])"


def read_exemplars(path: str | os.PathLike, relation_names: Sequence[str] | None = None
                   ) -> list[tuple[str, tuple[str, ...]]]:
    """(question, relation path) pairs of a JSON-lines file ``{"question": str, "path": [relation, ...]}``.

    Blank lines are skipped.  Any other malformed line (not JSON, not an object, a missing or mistyped
    key, a relation not in ``relation_names`` when given) is a :class:`UserError` naming ``FILE:LINE``.
    """
    out: list[tuple[str, tuple[str, ...]]] = []
    for where, obj in read_json_objects(path, what="exemplars file", shape='{"question": ..., "path": [...]}'):
        out.append((text_field(obj, "question", where), relation_path_field(obj, "path", where, relation_names)))
    if not out:
        raise UserError(f"{path}: no exemplars in the file")
    return out


def folded_names(names: Sequence[str]) -> dict[str, int]:
    """Folded name (:func:`fold`) -> the first entity id of that name: the case-insensitive index."""
    out: dict[str, int] = {}
    for i, n in enumerate(names):
        out.setdefault(fold(n), i)
    return out
