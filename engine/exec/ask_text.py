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

__all__ = ["FUNCTION_WORDS", "MIN_WORD", "MIN_COMPOUND", "WH_WORDS", "WH_CENTRE", "WHO_KIND", "ANSWER_PHRASE_WORDS",
           "FILLER_WORDS", "IRREGULAR_VERBS", "question_text", "word_before_topic", "kind_phrase", "kind_word", "noun_run", "NOUN_SKIP", "answer_phrase", "content_words", "words_match",
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
#: What "who"/"whom" ask for when no word naming a relation follows them (``AskSettings.kind_who``).
WHO_KIND = "which person"
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


def question_text(question: str, topic: str | None = None, *, drop_before: bool = False) -> str:
    """The question without its topic mention (brackets removed; the topic's words dropped); with
    ``drop_before`` without the word right before the mention too (:func:`word_before_topic`)."""
    if drop_before:
        start = _mention_start(question, topic)
        if start is not None:
            before = question[:start].split()
            question = " ".join(before[:-1] + [question[start:]])
    text = _BRACKET.sub(" ", question) if _BRACKET.search(question) else question
    if topic and not _BRACKET.search(question):
        text = re.sub(re.escape(topic), " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def _mention_start(question: str, topic: str | None) -> int | None:
    """Where the topic mention starts: its first [bracket], else the topic's name (case-insensitive)."""
    m = _BRACKET.search(question)
    if m is None and topic:
        m = re.search(re.escape(topic), question, flags=re.IGNORECASE)
    return None if m is None else m.start()


def word_before_topic(question: str, topic: str | None = None) -> str | None:
    """The word right before the question's topic mention (:func:`question_text`'s), lower-cased, when it is
    one content word (:func:`content_words`): where English puts a noun naming the topic's own kind ("describe
    the *film* [X]", "the *actor* [X] starred with who"), or a verb ("*describe* [X]"). None otherwise."""
    start = _mention_start(question, topic)
    before = question[:start].split() if start is not None else []
    if not before:
        return None
    got = content_words(before[-1])
    return got[0] if len(got) == 1 and _LETTERS.fullmatch(before[-1].lower().strip("?,.!;:\"'")) else None


def kind_phrase(text: str, words: int = KIND_WORDS, *, names: Callable[[str], bool] | None = None,
                window: int = 0, person: str = "") -> str:
    """The words saying what kind of thing a question asks for: its first English question word
    (:data:`WH_WORDS`), and after "which" or "what", the next ``words`` words that are not
    :data:`FILLER_WORDS` ("what are the movies that share" -> "what movies that", "which films share" ->
    "which films share"), after "how" the next word ("how many"); "who", "when", "where" ... say it alone
    ("when were the movies released" asks for a time, not movies).  No question word: the first words.

    ``names`` (``word -> whether it names a relation of the KG``, e.g. :meth:`PathScorer.names_relation`)
    and ``window`` > 0: the word naming a relation that says what is asked for (:func:`kind_word`), when
    there is one, follows the question word instead ("what film *genre* is" -> "what genre", "who are the
    *writers* of" -> "who writers", "[X] co-*starred* with who" -> "who starred"): an adjective or the topic's
    own kind before the noun is not what is asked for.  ``person``: what "who"/"whom" stand for when no such
    word is found ("which person"; empty: "who" alone)."""
    m = _WH.search(text)
    if m is None:
        return " ".join(text.split()[: words + 1])
    wh, rest = m.group(0), text[m.end():].split()
    low = wh.lower()
    hit = kind_word(text, names, window) if names is not None else None
    if hit is not None:
        return f"{wh} {hit}"
    if low in ("which", "what"):
        rest = [w for w in rest if w.lower().strip("?,.!") not in FILLER_WORDS][:words]
    elif low in ("who", "whom") and person:
        return person
    else:
        rest = rest[:1] if low == "how" else []
    return " ".join([wh] + rest)


def kind_word(text: str, names: Callable[[str], bool], window: int) -> str | None:
    """The word naming a relation (``names``) that says what ``text`` asks for, read around its first
    "which", "what", "who" or "whom"; None when there is none (or ``window`` is 0).

    After "which"/"what": the first such word among the first ``window`` words of the noun phrase that
    follows (:func:`noun_run`: "what film *genre* is", "what primary *language*", not "what does *star* in").
    After "who"/"whom", whose noun is a verb's agent: the first among the next ``window`` content words, a
    passive verb's (before "by") left out ("who *directed* the films", "who is listed as *director* of",
    not "who acted in the movies *directed* by"); none there, the nearest of the ``window`` content words
    before it ("the movies are *directed* by who", "[X] co-*starred* with who")."""
    m = _WH.search(text)
    if m is None or window <= 0:
        return None
    wh = m.group(0).lower()
    after = text[m.end():].split()
    if wh in ("which", "what"):
        return next((w for w in noun_run(after)[:window] if names(w)), None)
    if wh not in ("who", "whom"):
        return None
    lows = [w.lower().strip("?,.!;:") for w in after]
    agent = [c for i, low in enumerate(lows) if lows[i + 1: i + 2] != ["by"] for c in content_words(low)]
    hit = next((w for w in agent[:window] if names(w)), None)
    if hit is None:
        hit = next((w for w in content_words(text[: m.start()])[::-1][:window] if names(w)), None)
    return hit


#: Words a noun phrase after "which"/"what" skips before its noun (:func:`noun_run`): articles and "be".
NOUN_SKIP = frozenset("a an the is are was were be been being".split())


def noun_run(words: Sequence[str]) -> list[str]:
    """The content words (:func:`content_words`) of the noun phrase that opens ``words``: leading
    :data:`NOUN_SKIP` words skipped ("are the"), then the words up to the first filler, function or short
    word ("film genre | is", "primary language | in", "writers | of", "films | did"; "does | star in": no
    noun), or before a passive verb ("movie | written by"): where a question word's noun is."""
    out: list[str] = []
    started = False
    lows = [w.lower().strip("?,.!;:") for w in words]
    for i, low in enumerate(lows):
        if low in NOUN_SKIP and not started:
            continue
        started = True
        got = content_words(low)
        if low in FILLER_WORDS or not got or len(low) < MIN_WORD or lows[i + 1: i + 2] == ["by"]:
            break  # a word before "by" is a passive verb: it says what the noun underwent, not what it is
        out.extend(got)
    return out


def answer_phrase(text: str) -> str:
    """The words saying what a question asks for: :data:`ANSWER_PHRASE_WORDS` words from its first English
    question word (:data:`WH_WORDS`; "[X] appears in which movies" -> "which movies", "what sort of movie
    is [X]" -> "what sort of"), else its first words."""
    m = _WH.search(text)
    words = (text[m.start():] if m else text).split()
    return " ".join(words[:ANSWER_PHRASE_WORDS])


_LETTERS = re.compile(r"[a-z0-9]+")

#: English irregular verbs, their past forms of :data:`MIN_WORD`+ letters -> the base form (whose start the
#: prefix rule of :func:`words_match` can read): "wrote" names what "write", "writer", "written" name.
#: English, as :data:`FUNCTION_WORDS` is; no KG's relation names.
IRREGULAR_VERBS = {past: base for base, forms in (
    ("begin", "began begun"), ("bring", "brought"), ("build", "built"), ("buy", "bought"),
    ("choose", "chose chosen"), ("come", "came"), ("draw", "drew drawn"), ("drive", "drove driven"),
    ("fall", "fell fallen"), ("feel", "felt"), ("fight", "fought"), ("find", "found"), ("fly", "flew flown"),
    ("forget", "forgot forgotten"), ("give", "gave given"), ("grow", "grew grown"), ("hold", "held"),
    ("keep", "kept"), ("know", "knew known"), ("lead", "led"), ("leave", "left"), ("lose", "lost"),
    ("make", "made"), ("ride", "rode ridden"), ("rise", "rose risen"), ("sell", "sold"), ("send", "sent"),
    ("shake", "shook shaken"), ("shoot", "shot"), ("sing", "sang sung"), ("speak", "spoke spoken"),
    ("spend", "spent"), ("stand", "stood"), ("steal", "stole stolen"), ("strike", "struck"),
    ("swim", "swam swum"), ("take", "took taken"), ("teach", "taught"), ("tell", "told"), ("think", "thought"),
    ("throw", "threw thrown"), ("wear", "wore worn"), ("write", "wrote written"))
    for past in forms.split() if len(past) >= MIN_WORD}


def content_words(text: str) -> list[str]:
    """The lower-cased words of ``text`` (runs of letters and digits) of at least :data:`MIN_WORD` characters
    that are not :data:`FUNCTION_WORDS`, in order: the words that can name a relation."""
    return [w for w in _LETTERS.findall(str(text).lower()) if len(w) >= MIN_WORD and w not in FUNCTION_WORDS]


def words_match(a: str, b: str) -> bool:
    """Whether two words are read as the same word: a common prefix of at least :data:`MIN_WORD` characters
    that covers 60% of the shorter one ("writer"/"written", "director"/"directed", "stars"/"starred"; not
    "wrote"/"written" but see below): English inflection and derivation change the end of a word, rarely its start.  Or
    one is a closed compound whose last part, of at least :data:`MIN_COMPOUND` letters, matches the other
    that way ("screenwriter"/"written", "costar"/"starred" no: "star" is too short to stand alone).  An
    irregular past form reads as its base form (:data:`IRREGULAR_VERBS`: "wrote" as "write", which matches
    "written" and "writer")."""
    a, b = IRREGULAR_VERBS.get(a, a), IRREGULAR_VERBS.get(b, b)
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
