"""Ask in natural language: the KARPA loop (plan → retrieve → reason) over the engine.

For each question:

1. **topic**: the entity in ``[brackets]`` (MetaQA's convention), or the longest
   run of words that is an entity name (case-insensitive); a ``linker``
   (``text -> entity id or None``, e.g. :class:`llm_bridge.linking.EntityLinker`)
   links a bracketed mention that is not an exact name.
2. **candidate relations**: the ``candidate_relations`` (≤ 30, KARPA's number)
   relations nearest to the question (its text without the topic) in the
   retriever's embedding space.
3. **pre-planning** (with a :class:`Planner`): the planner proposes relation
   paths from the question, the topic and the candidates; it is then asked once
   more (``replan``) with the candidates nearest to each step of its first plans
   and those plans, and the second answer is used (the first where the second
   fails).  A plan step is a relation name, or any phrase (a paraphrase is
   embedded); a plan is dropped with a trace warning when it is empty, longer
   than ``max_hops``, or has a step whose nearest relation is less similar than
   ``min_step_similarity``.  No usable plan (or no planner) → embedding-only.
4. **retrieving** (:class:`engine.paths.PathRetriever`): the top ``k`` relation
   paths of each plan (``mode="pathfinding"``: KARPA-P, the plan's length;
   ``"heuristic"``: KARPA-H, any length up to ``max_hops``), merged over plans by
   lowest cost; a plan whose steps all name KG relations is a candidate itself
   (cost 0) even when the KG lacks its edges; after them the plan's cheapest one-step variants
   (``plan_variants``) that have answers.  Embedding-only retrieval ranks every relation sequence of
   1..``max_hops`` hops from the topic by the similarity of its text to the
   question's (KARPA-H with the question as the plan), an answer-type term, a kind
   term (the kind of entity a path ends in, read from the KG, against the kind the
   question asks for: :meth:`Asker.kind_texts`), a question-length prior per extra
   hop and the relations the question names word for word (:meth:`Asker.embedding_retrieve`).
5. **reasoning**: every candidate path becomes a logical query
   ``(p r_L … (p r_1 topic))``, all of them run by the executor in one batch, each
   distinct query once; the entities each reaches and their scores serve the answers,
   the reasoner's context and the vote, and the returned answers' explanations come
   from one batch of their paths restricted to them.  With a :class:`Reasoner` the LLM sees the paths and
   their tail entities (:mod:`engine.exec.context`, bounded in tokens) and picks
   paths and/or answers; without one (or when it fails) the answers are ranked
   by a vote of the best ``vote_paths`` candidate paths (:func:`vote_ranking`); a pick of paths alone
   keeps their answers, ordered by that vote (``pick_vote``).

Every answer carries the path and query that produced it, the executor's score,
explanation and provenance, and who selected it (``"llm"``, ``"vote"``, or ``"best-path"`` with
``vote_paths=1``).
The trace (``AskResult.trace``) says what each step did, and its warnings every
fallback.  ``exclude_topic`` (default on) removes the topic entity from the
answers, as MetaQA's gold answers do ("co-directors of X" does not list X).

Planners and reasoners are injected (the engine never imports the LLM bridge):
:class:`llm_bridge.karpa_loop.LLMPlanner` / ``LLMReasoner`` are the LLM ones.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from engine.exec.ask_settings import (ANSWER_TYPE_WEIGHT, ASK_MODES, EMBEDDING_CANDIDATES, EXEMPLAR_K,  # noqa: F401
                                      EXEMPLAR_WEIGHT, KIND_COVERAGE, KIND_WEIGHT, KIND_WORDS, LENGTH_PENALTY,
                                      LENGTH_PIVOT, LENGTH_PRIOR, LEXICAL_WEIGHT, PLAN_VARIANTS, RANGE_EXAMPLES,
                                      VOTE_PATHS, VOTE_TEMPERATURE, AskSettings, PlanSettings, ReasonSettings,
                                      ResultSettings, RetrieveSettings, ScoreSettings, VoteSettings)
from engine.exec.context import ContextPath, format_context
from engine.exec.explain import Answer
from engine.lang.query import Anchor, Complement, Intersection, Node, Projection, named, to_sexpr
from engine.paths import PathRetriever, Plan, PlanStep, relation_text
from kgreason.errors import UserError, unknown_name
from kgreason.files import read_json_objects, relation_path_field, text_field

__all__ = [
    "ASK_MODES",
    "AskSettings",
    "RetrieveSettings",
    "PlanSettings",
    "ScoreSettings",
    "ReasonSettings",
    "VoteSettings",
    "ResultSettings",
    "AskAnswer",
    "AskPath",
    "AskResult",
    "PlanRequest",
    "PlanReply",
    "ReasonRequest",
    "ReasonReply",
    "Planner",
    "Reasoner",
    "Asker",
    "find_topic",
    "path_query",
    "question_text",
    "answer_phrase",
    "kind_phrase",
    "content_words",
    "words_match",
    "lexical_f1",
    "read_exemplars",
    "vote_ranking",
]

#: A relation whose tails are at least this share of a larger relation's tails reads as that one's kind.
KIND_CONTAINMENT = 0.9
#: Relations named per side of a kind text (the most covering first): a bound on the text's length.
KIND_RELATIONS = 8
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


# ------------------------------------------------------------------------------ planner / reasoner
@dataclass(frozen=True)
class PlanRequest:
    """What a planner is asked: ``relations`` are candidate relation names, nearest first;
    ``previous`` the plans of the first round (``None`` in the first round)."""

    question: str
    topic: str
    relations: tuple[str, ...]
    previous: tuple[tuple[str, ...], ...] | None = None


@dataclass(frozen=True)
class PlanReply:
    """A planner's answer: plans (each a sequence of relation names or phrases), or ``ok=False`` with
    ``warnings`` saying why (timeout, malformed reply ...); ``calls``/``tokens``: LLM use."""

    plans: tuple[tuple[str, ...], ...] = ()
    ok: bool = True
    warnings: tuple[str, ...] = ()
    calls: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class ReasonRequest:
    """What a reasoner is asked: the candidate paths (numbered from 1) and their context text."""

    question: str
    topic: str
    paths: tuple[ContextPath, ...]
    context: str
    style: str


@dataclass(frozen=True)
class ReasonReply:
    """A reasoner's pick: path numbers (1-based) and/or answer names, or ``ok=False`` with warnings."""

    paths: tuple[int, ...] = ()
    answers: tuple[str, ...] = ()
    ok: bool = True
    warnings: tuple[str, ...] = ()
    calls: int = 0
    tokens: int = 0


class Planner(Protocol):
    """Proposes relation paths for a batch of questions (one reply per request, in order)."""

    def plan(self, requests: Sequence[PlanRequest]) -> list[PlanReply]: ...


class Reasoner(Protocol):
    """Picks paths/answers for a batch of questions (one reply per request, in order)."""

    def reason(self, requests: Sequence[ReasonRequest]) -> list[ReasonReply]: ...


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class AskPath:
    """One candidate relation path: its relations, retrieval cost, the executor's query and answers."""

    relations: tuple[int, ...]
    names: tuple[str, ...]
    cost: float
    query: str
    answers: tuple[Any, ...]  # engine.exec.explain.Answer, best first (topic excluded when asked); no explanation
    # (the executor ran the path once, for scores; AskAnswer.explanation explains what is returned)
    num_tails: int  # entities the path reaches in the KG graph (topic excluded when asked)
    source: str  # "plan", "plan-variant" or "embedding"
    entity_paths: tuple = field(default=(), compare=False)  # a few (head, relation, tail) id paths (evidence)

    def to_json(self) -> dict[str, Any]:
        return {"relations": list(self.names), "cost": round(self.cost, 6), "query": self.query,
                "source": self.source, "num_tails": self.num_tails,
                "answers": [{"entity": a.entity, "id": a.id, "score": a.score} for a in self.answers]}


@dataclass(frozen=True)
class AskAnswer:
    """One answer: the entity, its score on the path that produced it, that path, and provenance."""

    entity: str
    id: int
    score: float
    path: tuple[str, ...]
    path_rank: int  # 1-based position of the path among the candidates
    query: str
    provenance: str  # the executor's: "kg" (or "llm"/"both" when executor hooks merged evidence)
    selected_by: str  # "llm" (the reasoner picked it), "vote" (the candidate paths' vote) or "best-path"
    explanation: Any = None

    def to_json(self) -> dict[str, Any]:
        d = {"entity": self.entity, "id": self.id, "score": self.score, "path": list(self.path),
             "path_rank": self.path_rank, "query": self.query, "provenance": self.provenance,
             "selected_by": self.selected_by}
        if self.explanation is not None:
            d["explanation"] = self.explanation.lines()
        return d


@dataclass
class AskResult:
    """The loop's outcome for one question (``error`` set, no answers, when no topic was found)."""

    question: str
    topic: str | None
    topic_id: int | None
    answers: list[AskAnswer] = field(default_factory=list)
    paths: list[AskPath] = field(default_factory=list)
    plans: list[tuple[str, ...]] = field(default_factory=list)
    retrieval: str = "embedding"  # "plan" or "embedding"
    trace: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    llm_calls: int = 0
    llm_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None

    def warn(self, step: str, message: str) -> None:
        self.warnings.append(f"{step}: {message}")

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "topic": self.topic, "topic_id": self.topic_id, "error": self.error,
                "retrieval": self.retrieval, "plans": [list(p) for p in self.plans],
                "answers": [a.to_json() for a in self.answers], "paths": [p.to_json() for p in self.paths],
                "warnings": list(self.warnings), "trace": self.trace,
                "llm": {"calls": self.llm_calls, "tokens": self.llm_tokens}, "seconds": round(self.seconds, 6)}


def path_query(topic: int | str, relations: Sequence[int | str], *, exclude_topic: bool = True) -> Node:
    """The logical query of a relation path from ``topic``: ``(p r_L … (p r_1 topic))``.

    With ``exclude_topic`` the topic is removed from every set from the second hop on,
    ``(i (p r_s …) (n topic))``: a path that comes back through the topic is no
    evidence (MetaQA's answer rule, :mod:`engine.eval.metaqa`).
    """
    node: Node = Anchor(topic)
    for step, x in enumerate(relations):
        node = Projection(x, node)
        if exclude_topic and step >= 1:
            node = Intersection((node, Complement(Anchor(topic))))
    return node


# ------------------------------------------------------------------------------ topic entity
def _fold(s: str) -> str:
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
        folded = _folded(names) if folded is None else folded
        if _fold(mention) in folded:
            return folded[_fold(mention)], "brackets"
        if linker is not None:
            i = linker(mention)
            if i is not None:
                return int(i), "linked"
        return None, f"[{mention}] is no entity name" + ("" if linker is None else " and was not linked")
    folded = _folded(names) if folded is None else folded
    words = _WORD.findall(question)
    stripped = [w.strip("?!.,;:\"'()") for w in words]
    for n in range(min(max_words, len(words)), 0, -1):
        for s in range(len(words) - n + 1):
            for cand in (" ".join(words[s:s + n]), " ".join(stripped[s:s + n])):
                key = _fold(cand)
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


def vote_ranking(scores: np.ndarray, costs: Sequence[float], temperature: float, n: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best entities of a vote of candidate paths, and for each the first path that reaches it.

    ``scores``: (P, N) executor scores of every entity on each of P candidate paths, best-ranked path first;
    ``costs``: their retrieval costs.  Path ``i`` weighs ``exp(-(costs[i] - min(costs)) / temperature)``; an
    entity's vote is the weighted sum of its scores.  Entities with a positive vote, by vote (highest
    first), then the first path with a positive score for it, its score there (highest first), its id.
    Returns (entity ids, path indices), both int64 of length ``min(n, entities with a vote)``.
    """
    S = np.asarray(scores, dtype=np.float64)
    c = np.asarray(costs, dtype=np.float64)
    w = np.exp(-(c - c.min()) / float(temperature)) if len(c) else c
    vote = np.round(w @ S, 12)  # sums of equal terms in another order tie exactly
    cand = np.flatnonzero(vote > 0)
    reach = S[:, cand] > 0
    first = np.argmax(reach, axis=0)
    own = S[first, cand]
    order = np.lexsort((cand, -own, first, -vote[cand]))[:n]
    return cand[order].astype(np.int64), first[order].astype(np.int64)


#: The path-embedding cache is rewritten once it would grow by 1/_CACHE_GROWTH (Asker._sequence_embeddings).
_CACHE_GROWTH = 8


def _read_sequence_cache(path: os.PathLike, width: int) -> dict[str, np.ndarray]:
    """The path-text -> embedding map of a path-embedding cache file (``texts``: N strings, ``emb``: (N, width)
    finite float32); ``ValueError(why)`` when it is not one (see :meth:`Asker._sequence_embeddings`)."""
    from engine.paths.embeddings import check_embeddings

    with np.load(path, allow_pickle=False) as z:
        texts, emb = z["texts"], z["emb"]
    if not isinstance(texts, np.ndarray) or texts.ndim != 1 or texts.dtype.kind != "U":
        raise ValueError("'texts' is not a list of strings")
    why = check_embeddings(emb, rows=len(texts), width=width)
    if why is not None:
        raise ValueError(f"'emb': {why}")
    return dict(zip(texts.tolist(), emb))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _folded(names: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, n in enumerate(names):
        out.setdefault(_fold(n), i)
    return out


# ------------------------------------------------------------------------------ the loop
class Asker:
    """The loop over one engine (executor) and one path retriever (see the module docstring).

    Args:
        engine: an :class:`engine.exec.api.Engine` (its artifact and executor).
        retriever: the :class:`~engine.paths.PathRetriever` over the same KG.
        verbalizer: ``relation name -> question template`` holding one ``{entity}`` slot (an inverse
            name ``X^-1`` asks X's inverse question), e.g. ``llm_bridge.prompts.fallback_template``;
            embedding-only retrieval then compares the question with each path read as questions
            (:meth:`path_text`) instead of its comma-joined relation names.  ``None``: the names.
        settings: :class:`AskSettings`.
        exemplars: labelled questions, ``(question text, relation path as names)`` pairs (e.g.
            :func:`read_exemplars`); embedding-only retrieval then lowers each candidate path's cost by
            ``exemplar_weight`` times its kNN vote (:meth:`exemplar_votes`).  ``None`` or empty: costs
            exactly as without them.
    """

    def __init__(self, engine: Any, retriever: PathRetriever, *, settings: AskSettings | None = None,
                 verbalizer: Callable[[str], str] | None = None,
                 exemplars: Sequence[tuple[str, Sequence[str]]] | None = None) -> None:
        self.engine = engine
        self.retriever = retriever
        self.settings = settings or AskSettings()
        self.verbalizer = verbalizer
        rel_ids = {n: i for i, n in enumerate(retriever.graph.relation_names)}
        self._ex_texts: list[str] = []
        self._ex_paths: dict[tuple[int, ...], list[int]] = {}
        for j, ex in enumerate(exemplars or ()):
            if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and isinstance(ex[0], str) and ex[0].strip()
                    and isinstance(ex[1], (tuple, list)) and ex[1]):
                raise UserError(f"ask: exemplar {j + 1} must be (question text, non-empty relation path), got {ex!r}")
            ids = []
            for x in ex[1]:
                if x not in rel_ids:
                    raise unknown_name("relation", str(x), list(rel_ids), f"ask: exemplar {j + 1}")
                ids.append(rel_ids[x])
            self._ex_paths.setdefault(tuple(ids), []).append(len(self._ex_texts))
            self._ex_texts.append(question_text(ex[0]) or ex[0])
        self._ex_emb: np.ndarray | None = None
        self._path_text: dict[tuple[int, ...], str] = {}
        self._mu: np.ndarray | None = None
        self._range: np.ndarray | None = None
        self._kind: np.ndarray | None = None
        self._wh_centre: np.ndarray | None = None
        self._rel_words: list[tuple[str, tuple[str, ...]]] | None = None
        names = engine.artifact.entities
        self._index = {n: i for i, n in enumerate(names)}
        self._folded: dict[str, int] | None = None
        self._outrel: tuple[np.ndarray, np.ndarray] | None = None
        self._seq_emb: dict[str, np.ndarray] | None = None
        self._seq_damage: str | None = None  # why the path-embedding cache read was damaged, until rewritten
        self._seq_saved = 0  # texts in the cache file (as read or last written)
        self._seq_wrote = False  # this Asker wrote (or tried to write) the cache file
        self._seq_cache: dict[tuple[int, int], tuple[list[tuple[int, ...]], bool]] = {}
        rel = retriever.relation_emb
        self._rel_unit = rel / np.maximum(np.linalg.norm(rel, axis=1, keepdims=True), 1e-12)

    # ---------------------------------------------------------------- helpers
    def _nearest_relations(self, texts: Sequence[str], n: int) -> list[list[int]]:
        if not texts:
            return []
        q = np.asarray(self.retriever.encoder.encode(list(texts)), dtype=np.float64)
        sims = q @ self._rel_unit.T
        return [list(np.argsort(-row, kind="stable")[:n]) for row in sims]

    def _warm(self, steps: Sequence[str]) -> None:
        """Encode every plan step text of a batch in one encoder call (the per-question calls then hit the cache)."""
        texts = list(dict.fromkeys(relation_text(x) if " " not in x else x for x in steps))
        if texts:
            self.retriever.encoder.encode(texts)

    def _check_plan(self, plan: Sequence[Any], where: str) -> tuple[Plan | None, str | None]:
        """A usable :class:`Plan` of ``plan``'s steps, or (None, why not)."""
        s = self.settings
        if not isinstance(plan, (list, tuple)) or not plan:
            return None, f"{where}: empty plan"
        if len(plan) > s.max_hops:
            return None, f"{where}: {len(plan)} steps, more than max_hops={s.max_hops}"
        steps: list[PlanStep] = []
        free: list[tuple[int, str]] = []
        for j, ph in enumerate(plan):
            if not isinstance(ph, str) or not ph.strip():
                return None, f"{where}: step {j + 1} is not a relation name ({ph!r})"
            ph = ph.strip()
            try:
                r = self.retriever.resolve_relation(ph)
            except UserError:
                r = None  # an unknown or ambiguous single token: embedded as a paraphrase
            if r is None:
                steps.append(PlanStep(raw=ph, text=relation_text(ph) if " " not in ph else ph, relation=None))
                free.append((j, steps[-1].text))
            else:
                steps.append(PlanStep(raw=ph, text=relation_text(self.retriever.graph.relation_names[r]), relation=r))
        if free:
            emb = np.asarray(self.retriever.encoder.encode([t for _, t in free]), dtype=np.float64)
            sims = emb @ self._rel_unit.T
            for (j, text), row in zip(free, sims):
                best = int(np.argmax(row))
                if row[best] < s.min_step_similarity:
                    name = self.retriever.graph.relation_names[best]
                    return None, (f"{where}: step {j + 1} {plan[j]!r} names no relation of the KG (closest "
                                  f"{name!r}, similarity {row[best]:.2f} < {s.min_step_similarity})")
        return Plan(tuple(steps)), None

    # ---------------------------------------------------------------- API
    def ask(self, questions: Sequence[str], *, planner: Planner | None = None, reasoner: Reasoner | None = None,
            linker: Callable[[str], int | None] | None = None, progress: bool = False) -> list[AskResult]:
        """Answer each question (one :class:`AskResult` each, in order); questions are batched per step."""
        s = self.settings
        t_start = time.perf_counter()
        names = self.engine.artifact.entities
        results: list[AskResult] = []
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise UserError(f"ask: a question must be non-empty text, got {q!r}")
            if self._folded is None:
                self._folded = _folded(names)
            tid, how = find_topic(q, names, index=self._index, folded=self._folded, linker=linker)
            r = AskResult(question=q, topic=names[tid] if tid is not None else None, topic_id=tid)
            if tid is None:
                r.error = how
                r.warn("topic", how)
            else:
                r.trace.append({"step": "topic", "entity": names[tid], "id": tid, "how": how})
            results.append(r)
        live = [r for r in results if r.topic_id is not None]
        texts = {id(r): question_text(r.question, r.topic) or r.question for r in live}

        # 2-3. candidate relations, plans
        rel_names = self.retriever.graph.relation_names
        plans: dict[int, list[Plan]] = {id(r): [] for r in live}
        if planner is not None and live:
            near = self._nearest_relations([texts[id(r)] for r in live], s.candidate_relations)
            reqs = [PlanRequest(r.question, r.topic, tuple(rel_names[i] for i in nr)) for r, nr in zip(live, near)]
            replies = self._call_planner(planner, reqs, live, round_=1)
            final = replies
            if s.replan:
                self._warm([st for rep in replies if rep.ok for p in rep.plans if isinstance(p, (list, tuple))
                            for st in p if isinstance(st, str) and st.strip()])
                again, again_req = [], []
                for r, req, rep in zip(live, reqs, replies):
                    if not rep.ok or not rep.plans:
                        continue
                    steps = [st for p in rep.plans for st in p if isinstance(st, str) and st.strip()]
                    near_steps = self._nearest_relations([relation_text(x) if " " not in x else x for x in steps],
                                                         s.candidate_relations)
                    cand: list[int] = []
                    for k in range(s.candidate_relations):  # round robin over the steps: each step's nearest first
                        for row in near_steps:
                            if k < len(row) and row[k] not in cand:
                                cand.append(int(row[k]))
                    cand = cand[: s.candidate_relations]
                    prev = tuple(tuple(str(x) for x in p) for p in rep.plans if isinstance(p, (list, tuple)))
                    again.append(r)
                    again_req.append(PlanRequest(r.question, r.topic, tuple(rel_names[i] for i in cand), prev))
                if again:
                    second = self._call_planner(planner, again_req, again, round_=2)
                    by_id = {id(r): rep for r, rep in zip(again, second)}
                    final = [by_id[id(r)] if id(r) in by_id and by_id[id(r)].ok and by_id[id(r)].plans else rep
                             for r, rep in zip(live, replies)]
            self._warm([st.strip() for rep in final if rep.ok for p in rep.plans if isinstance(p, (list, tuple))
                        for st in p if isinstance(st, str) and st.strip()])
            for r, rep in zip(live, final):
                if not rep.ok:
                    continue
                for j, p in enumerate(rep.plans):
                    plan, why = self._check_plan(p, f"plan {j + 1}")
                    if plan is None:
                        r.warn("plan", why or "unusable plan")
                    elif all(plan.steps != q.steps for q in plans[id(r)]):
                        plans[id(r)].append(plan)
                        r.plans.append(tuple(st.raw for st in plan.steps))
                if not plans[id(r)]:
                    r.warn("plan", "no usable plan: embedding-only retrieval")

        # 4. retrieval
        planned = [(r, p) for r in live for p in plans[id(r)]]
        by_q: dict[int, dict[tuple[int, ...], tuple[float, str, Any]]] = {id(r): {} for r in live}
        if planned:
            kw: dict[str, Any] = dict(mode=s.mode, k=s.k, progress=progress)
            if s.mode == "heuristic":
                kw["max_hops"] = s.max_hops
            got = self.retriever.retrieve([r.topic_id for r, _ in planned], plans=[p for _, p in planned], **kw)
            for (r, _), res in zip(planned, got):
                for path in res.paths:
                    cur = by_q[id(r)].get(path.relations)
                    if cur is None or path.cost < cur[0]:
                        by_q[id(r)][path.relations] = (path.cost, "plan", path)
            # A plan naming KG relations exactly is a candidate even where the KG lacks its edges: the
            # executor's calibrated matrices (link prediction) may still answer it.
            for r, p in planned:
                rels = tuple(st.relation for st in p.steps)
                if all(x is not None for x in rels) and rels not in by_q[id(r)]:
                    by_q[id(r)][rels] = (0.0, "plan", self.retriever._result_path(int(r.topic_id), rels, 0.0))
        # Around the plan: a plan of several steps with one step replaced by another relation, the best
        # `plan_variants` of them by the embedding-only cost, after the planned candidates (run on the
        # calibrated matrices even where the observed KG lacks their edges, like a plan).
        variants: dict[int, list[tuple[tuple[int, ...], float, str, Any]]] = {id(r): [] for r in live}
        if planned and s.plan_variants > 0:
            n_rel = len(rel_names)
            var_q, var_lists = [], []
            for r in live:
                vs: dict[tuple[int, ...], None] = {}
                for p in plans[id(r)]:
                    if len(p.steps) < 2:  # a 1-step plan's retrieval already holds every relation of the topic
                        continue
                    rels = [st.relation if st.relation is not None else int(self._nearest_relations([st.text], 1)[0][0])
                            for st in p.steps]
                    for j in range(len(rels)):
                        for x in range(n_rel):
                            v = tuple(rels[:j] + [x] + rels[j + 1:])
                            if x != rels[j] and v not in by_q[id(r)]:
                                vs[v] = None
                if vs:
                    var_q.append(r)
                    var_lists.append(list(vs))
            if var_q:
                for r, vs, c in zip(var_q, var_lists, self.score_sequences(var_lists, [texts[id(r)] for r in var_q])):
                    for j in sorted(range(len(vs)), key=lambda j: (c[j], vs[j]))[: s.plan_variants]:
                        variants[id(r)].append((vs[j], float(c[j]), "plan-variant",
                                                self.retriever._result_path(int(r.topic_id), vs[j], float(c[j]))))
        for r in live:
            r.retrieval = "plan" if by_q[id(r)] else "embedding"
            if planner is not None and plans[id(r)] and not by_q[id(r)]:
                r.warn("retrieve", "the plans match no path from the topic: embedding-only retrieval")
        # Embedding-only retrieval: the candidates of questions without planned paths, and, beside the planned
        # ones, the best `embedding_candidates` paths of the others when the best embedding-only path is not
        # among the planned ones (a wrong plan step then still leaves the reasoner the path the question's
        # wording points at; when both agree, more candidates only give the reasoner more ways to go wrong).
        extra: dict[int, list[tuple[tuple[int, ...], float, str, Any]]] = {id(r): [] for r in live}
        emb_q = [r for r in live if not by_q[id(r)] or s.embedding_candidates > 0]
        if emb_q:
            for r, found in zip(emb_q, self.embedding_retrieve([r.topic_id for r in emb_q],
                                                               [texts[id(r)] for r in emb_q], r_progress=progress,
                                                               results=emb_q)):
                if not by_q[id(r)]:
                    for cost, rels in found:
                        by_q[id(r)][rels] = (cost, "embedding",
                                             self.retriever._result_path(int(r.topic_id), rels, cost))
                    continue
                lengths = {len(p.steps) for p in plans[id(r)]}
                found = [(c, x) for c, x in found if len(x) in lengths]  # a plan's length is the planner's call
                if not found or found[0][1] in by_q[id(r)]:
                    continue  # the question's wording agrees with the plans: their candidates only
                for cost, rels in found:
                    if len(extra[id(r)]) >= s.embedding_candidates:
                        break
                    if rels not in by_q[id(r)]:
                        extra[id(r)].append((rels, cost, "embedding",
                                             self.retriever._result_path(int(r.topic_id), rels, cost)))
        ranked: dict[int, list[tuple[tuple[int, ...], float, str, Any]]] = {}
        for r in live:
            items = sorted(by_q[id(r)].items(), key=lambda kv: (kv[1][0], len(kv[0]), kv[0]))[: s.k]
            ranked[id(r)] = [(rels, c, src, rp) for rels, (c, src, rp) in items] + extra[id(r)]
            if items:
                ranked[id(r)] += [v for v in variants[id(r)] if v[0] not in {x[0] for x in extra[id(r)]}]
            r.trace.append({"step": "retrieve", "source": r.retrieval, "plans": [list(p) for p in r.plans],
                            "paths": [[rel_names[x] for x in rels] for rels, _, _, _ in ranked[id(r)]]})

        # 5. executor: every candidate path runs once, all in one call (a path two questions share, once);
        # what each reaches
        # (entity ids and scores, the topic removed when asked) is kept for the answers, the reasoner's
        # context, the vote and the explanations, none of which runs a path again.
        reach: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {id(r): [] for r in live}
        nodes: list[Node] = []
        owners: list[tuple[AskResult, tuple[int, ...], float, str, Any]] = []
        for r in live:
            for rels, c, src, rp in ranked[id(r)]:
                nodes.append(path_query(int(r.topic_id), rels, exclude_topic=s.exclude_topic))
                owners.append((r, rels, c, src, rp))
        if nodes:
            keep = max(s.answers, s.tails_per_path)
            dropped: dict[int, list[list[str]]] = {}
            keys = [to_sexpr(named(node, self.engine.artifact)) for node in nodes]
            for (r, rels, c, src, rp), key, (ids, vals) in zip(owners, keys, self._execute(nodes, keys)):
                if s.exclude_topic:
                    mask = ids != int(r.topic_id)
                    ids, vals = ids[mask], vals[mask]
                if src == "plan-variant" and not len(ids) and not s.empty_variants:
                    # A variant is a guess at a path the plan missed; one without answers offers the reasoner
                    # nothing to pick (and a simulated reasoner's random wrong pick a harmless target).
                    dropped.setdefault(id(r), []).append([rel_names[x] for x in rels])
                    continue
                top = np.lexsort((ids, -vals))[:keep]  # best first, ties by smaller id (the executor's top-k)
                ans = tuple(Answer(entity=names[e], id=e, score=float(v), explanation=None, provenance="kg")
                            for e, v in zip(ids[top].tolist(), vals[top].tolist()))
                tails = rp.tails
                ntails = int(len(tails)) - int(s.exclude_topic and bool(np.any(tails == r.topic_id)))
                r.paths.append(AskPath(relations=rels, names=tuple(rel_names[x] for x in rels), cost=float(c),
                                       query=key, answers=ans,
                                       num_tails=max(ntails, 0), source=src, entity_paths=rp.entity_paths))
                reach[id(r)].append((ids, vals))
            for r in live:
                if id(r) in dropped:
                    r.trace.append({"step": "variants", "dropped_without_answers": dropped[id(r)]})

        # reasoning
        picked: dict[int, ReasonReply] = {}
        if reasoner is not None:
            reqs_r, who = [], []
            for r in live:
                if not r.paths:
                    continue
                cps = tuple(self.context_path(r, p) for p in r.paths)
                ctx = format_context(cps, style=s.context, max_tokens=s.max_context_tokens,
                                     count_tokens=getattr(reasoner, "count_tokens", None))
                reqs_r.append(ReasonRequest(r.question, r.topic, cps, ctx, s.context))
                who.append(r)
            if reqs_r:
                try:
                    replies_r = list(reasoner.reason(reqs_r))
                except UserError:
                    raise
                except Exception as exc:  # a broken reasoner degrades to the paths' vote, with a warning
                    replies_r = [ReasonReply(ok=False, warnings=(f"reasoner failed: {type(exc).__name__}: {exc}",))
                                 for _ in reqs_r]
                if len(replies_r) != len(reqs_r):
                    raise RuntimeError(f"reasoner returned {len(replies_r)} replies for {len(reqs_r)} requests")
                for r, rep in zip(who, replies_r):
                    r.llm_calls += rep.calls
                    r.llm_tokens += rep.tokens
                    for w in rep.warnings:
                        r.warn("reason", w)
                    r.trace.append({"step": "reason", "ok": rep.ok, "paths": list(rep.paths),
                                    "answers": list(rep.answers)})
                    if rep.ok:
                        picked[id(r)] = rep
        unpicked = []
        chosen: dict[int, list[int]] = {}  # paths-only picks whose answers the candidates' vote orders
        for r in live:
            r.answers = self._select(r, picked.get(id(r)))
            if not r.answers and r.paths:
                unpicked.append(r)
            elif s.pick_vote and s.vote_paths > 1 and r.answers and id(r) in picked and not picked[id(r)].answers:
                chosen[id(r)] = list(dict.fromkeys(i - 1 for i in picked[id(r)].paths
                                                   if isinstance(i, int) and 1 <= i <= len(r.paths)))
        self._vote(unpicked, reach)
        if chosen:
            rs = [r for r in live if id(r) in chosen]
            for r in rs:
                r.answers = []
            self._vote(rs, reach, chosen=chosen)
        self._explain(live)
        for r in live:
            if not r.answers and r.paths:
                r.warn("answer", "no candidate path has answers")
            elif not r.paths:
                r.warn("retrieve", "no relation path from the topic")
        elapsed = time.perf_counter() - t_start
        for r in results:
            r.seconds = elapsed / max(len(results), 1)
        return results

    # ---------------------------------------------------------------- embedding-only retrieval
    def _out_relations(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, relations): the distinct relations leaving each entity, CSR over entities."""
        if self._outrel is None:
            g = self.retriever.graph
            rels, _ = g.by_relation()
            ip = np.asarray(g.indptr, dtype=np.int64)
            heads = np.repeat(np.arange(len(ip) - 1), np.diff(ip))
            keep = np.ones(len(rels), dtype=bool)
            keep[1:] = (rels[1:] != rels[:-1]) | (heads[1:] != heads[:-1])
            counts = np.bincount(heads[keep], minlength=len(ip) - 1)
            self._outrel = (np.concatenate(([0], np.cumsum(counts))), np.asarray(rels[keep], dtype=np.int64))
        return self._outrel

    def reachable_sequences(self, topic: int, max_hops: int) -> tuple[list[tuple[int, ...]], bool]:
        """Distinct relation sequences of 1..max_hops hops that exist from ``topic`` (breadth first), and
        whether the retriever's ``max_sequences`` cap was hit.

        The same set as KARPA-H's enumeration; the last hop reads the frontier's distinct out-relations
        (a per-entity table) instead of expanding its tails, which is most of the cost on dense KGs.
        """
        key = (int(topic), int(max_hops))
        hit = self._seq_cache.get(key)
        if hit is not None:
            return hit
        out = self._reachable(int(topic), int(max_hops))
        if len(self._seq_cache) >= 100_000:  # bounded: a long-running process asks about many topics
            self._seq_cache.clear()
        self._seq_cache[key] = out
        return out

    def _reachable(self, topic: int, max_hops: int) -> tuple[list[tuple[int, ...]], bool]:
        ip, orel = self._out_relations()
        cap = self.retriever.max_sequences
        level: list[tuple[tuple[int, ...], np.ndarray]] = [((), np.array([topic], dtype=np.int64))]
        seqs: list[tuple[int, ...]] = []
        for step in range(max_hops):
            nxt = []
            for prefix, F in level:
                if step == max_hops - 1:
                    lo, hi = ip[F], ip[F + 1]
                    lens = hi - lo
                    idx = np.repeat(lo - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))
                    out = np.unique(orel[idx]).tolist()
                    if len(seqs) + len(out) > cap:
                        seqs.extend(prefix + (int(x),) for x in out[: cap - len(seqs)])
                        return seqs, True
                    seqs.extend(prefix + (int(x),) for x in out)
                    continue
                for x, tails in self.retriever.expand(F):
                    if len(seqs) >= cap:
                        return seqs, True
                    seqs.append(prefix + (x,))
                    nxt.append((prefix + (x,), tails))
            level = nxt
        return seqs, False

    def _sequence_cache_path(self):
        from kgreason.files import user_cache_dir

        key = json.dumps([self.retriever.encoder.name, list(self.retriever.graph.relation_names)])
        return user_cache_dir() / "ask_sequences" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"

    def _sequence_embeddings(self, texts: Sequence[str]) -> None:
        """Make ``self._seq_emb`` hold every text's embedding: from memory, the disk cache
        (``$KGREASON_HOME/ask_sequences/<encoder and relations key>.npz``), else one encoder call.

        The cache is verified when read (:func:`_read_sequence_cache`); a damaged one is dropped and
        rewritten with the texts of this run, or used from memory only when its folder cannot be written,
        with one warning (:func:`engine.paths.embeddings.cache_warning`).  Writes are atomic.  The first call
        that embeds new texts writes the file; later calls of the same Asker rewrite it only once the texts
        not in it are at least 1/:data:`_CACHE_GROWTH` of those in it, so a run of many chunks of questions
        (``engine.ask --questions``) writes ~``_CACHE_GROWTH`` times the final size in all rather than the
        whole file per chunk; what is left unwritten is recomputed, and written, by the next run."""
        from engine.paths.embeddings import cache_warning, read_cache, write_cache

        if self._seq_emb is None:
            width = int(self._rel_unit.shape[1])  # the encoder's width (the relation embeddings')
            got, self._seq_damage = read_cache(self._sequence_cache_path(),
                                               lambda p: _read_sequence_cache(p, width))
            self._seq_emb = got or {}
            self._seq_saved = len(self._seq_emb)
        todo = [t for t in dict.fromkeys(texts) if t not in self._seq_emb]
        if not todo:
            return
        self._seq_emb.update(zip(todo, np.asarray(self.retriever.encoder.encode(todo), dtype=np.float32)))
        if self._seq_wrote and (len(self._seq_emb) - self._seq_saved) * _CACHE_GROWTH < self._seq_saved:
            return
        path = self._sequence_cache_path()
        names = list(self._seq_emb)
        buf = io.BytesIO()
        np.savez(buf, texts=np.array(names, dtype=str), emb=np.stack([self._seq_emb[t] for t in names]))
        # A cache folder that cannot be written only costs the recomputation (silent unless it was damaged).
        unwritten = write_cache(path, buf.getvalue(), "path-embedding cache")
        self._seq_saved = len(names)  # written, or given up until the cache grows as much again
        self._seq_wrote = True
        if self._seq_damage is not None:
            cache_warning("path-embedding cache", path, self._seq_damage, unwritten)
            self._seq_damage = None

    def path_text(self, relations: Sequence[int]) -> str:
        """The text embedding-only retrieval compares with the question (topic mention removed).

        With a verbalizer: each hop's question template, the first with its entity slot empty (the
        question's topic is removed too) and the next ones about ``them`` (the previous hop's answers):
        ``directed_by^-1, written_by`` -> "Who or what is directed by ? Who or what is them written by?".
        Without one: the retriever's relation-name text (``inverse of directed by, written by``).
        """
        key = tuple(int(x) for x in relations)
        t = self._path_text.get(key)
        if t is None:
            if self.verbalizer is None:
                t = self.retriever.sequence_text(key)
            else:
                names = self.retriever.graph.relation_names
                parts = []
                for i, x in enumerate(key):
                    template = str(self.verbalizer(names[x]))
                    if "{entity}" not in template:
                        raise UserError(f"ask: the verbalizer's text for relation {names[x]!r} has no "
                                        f"{{entity}} slot: {template!r}")
                    parts.append(template.replace("{entity}", "them" if i else ""))
                t = " ".join(" ".join(parts).split())
            self._path_text[key] = t
        return t

    def _verbalized_mean(self) -> np.ndarray:
        """Mean embedding of every relation's verbalized 1-hop path text (the KG's relation questions).

        Every verbalized path shares the templates' wording ("Who or what is ... ?"), a common direction
        of the embeddings that dominates their cosine with any question; subtracting this KG-level mean
        from the question and the path embeddings compares what differs between relations (540 MetaQA
        dev questions, length penalty 0.05, top path's Hits@1 on 1/2/3 hops: 73/48/27 -> 76/52/34).
        """
        if self._mu is None:
            texts = [self.path_text((r,)) for r in range(len(self.retriever.graph.relation_names))]
            self._sequence_embeddings(texts)
            self._mu = np.mean(np.stack([self._seq_emb[t] for t in texts]).astype(np.float64), axis=0)
        return self._mu

    def range_text(self, relation: int) -> str:
        """The names of the ``range_examples`` most frequent tails of ``relation`` in the KG (ties by
        smaller id), comma-joined: what its answers look like ("1999, 2004, ..." or person names).
        Empty for a relation without edges."""
        g = self.retriever.graph
        rels = np.asarray(g.rels)
        tails = np.asarray(g.tails)[rels == int(relation)]
        if not len(tails):
            return ""
        ids, counts = np.unique(tails, return_counts=True)
        top = ids[np.lexsort((ids, -counts))][: self.settings.range_examples]
        return ", ".join(str(g.entity_name(int(t))) for t in top)

    def _range_embeddings(self) -> np.ndarray:
        """(R, d) unit rows: each relation's range text embedding, centred (:meth:`_centred_texts`)."""
        if self._range is None:
            self._range = self._centred_texts([self.range_text(r) for r in range(len(self.retriever.graph.relation_names))])
        return self._range

    def _centred_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), d) unit rows: each text's embedding minus the mean over the non-empty texts (the
        direction they share), renormalised; zero rows for empty texts."""
        have = [i for i, t in enumerate(texts) if t]
        E = np.zeros((len(texts), 0 if not have else 1), dtype=np.float64)
        if have:
            X = np.asarray(self.retriever.encoder.encode([texts[i] for i in have]), dtype=np.float64)
            X = _unit(X - X.mean(axis=0)) if len(have) > 1 else _unit(X)
            E = np.zeros((len(texts), X.shape[1]), dtype=np.float64)
            E[have] = X
        return E

    def kind_texts(self) -> list[str]:
        """Per relation id, the kind of entity it reaches, read from the KG: of the relation's tails, which
        base relations (inverse names read as their base) most of them (``kind_coverage``) have as heads,
        "thing with A, B" (for ``X^-1`` X itself too: leaving it out cost 1-hop questions most, MetaQA dev
        proxy 90.5 -> 77.5), and as tails, "the C or D", at most :data:`KIND_RELATIONS` each, the most
        covering, in name order: films are things with a director, a genre, a release year; people are the
        directed-by or written-by of something; years the release year.  Empty for a relation without edges
        or whose tails share no relation that widely."""
        from kge.artifact import INVERSE_SUFFIX

        g = self.retriever.graph
        names = g.relation_names
        rels = np.asarray(g.rels, dtype=np.int64)
        heads = np.repeat(np.arange(len(g.indptr) - 1), np.diff(np.asarray(g.indptr, dtype=np.int64)))
        tails = np.asarray(g.tails, dtype=np.int64)
        # Forward edges only: a graph with inverse edges holds each fact twice (h r t and t r^-1 h).
        inverse = np.array([n.endswith(INVERSE_SUFFIX) for n in names], dtype=bool)
        fwd = ~inverse[rels]
        bases = [n[: -len(INVERSE_SUFFIX)] if n.endswith(INVERSE_SUFFIX) else n for n in names]
        base_ids = sorted({bases[r] for r in range(len(names))})
        bid = {b: i for i, b in enumerate(base_ids)}
        rb = np.array([bid[b] for b in bases], dtype=np.int64)
        n_ent, n_b = len(g.indptr) - 1, len(base_ids)
        # Sparse incidence: entity x base relation, as head (attribute) and as tail (role), 0/1.
        from scipy import sparse

        def incidence(ents: np.ndarray) -> Any:
            m = sparse.coo_matrix((np.ones(len(ents), dtype=np.float32), (ents, rb[rels[fwd]])), shape=(n_ent, n_b))
            m = m.tocsr()
            m.data[:] = 1.0  # several edges of one relation count once
            return m

        as_head, as_tail = incidence(heads[fwd]), incidence(tails[fwd])
        # Relations whose tails are (almost) all tails of a larger relation read as that one: one kind, one
        # text (in_language^-1's films are among release_year^-1's), so that centring the texts does not
        # blow up the small differences between near-copies into what tells them apart.
        reach = sparse.csr_matrix((np.ones(len(rels), dtype=np.float32), (rels, tails)), shape=(len(names), n_ent))
        reach.data[:] = 1.0
        both = (reach @ reach.T).toarray()
        size = np.diag(both).copy()
        rep = [int(np.lexsort((np.arange(len(names)), -size * (both[r] >= KIND_CONTAINMENT * size[r])))[0])
               if size[r] else r for r in range(len(names))]
        out: list[str] = []
        cov = self.settings.kind_coverage
        own: dict[int, str] = {}
        for r in range(len(names)):
            if rep[r] in own:
                out.append(own[rep[r]])
                continue
            t = np.unique(tails[rels == rep[r]])
            if not len(t):
                out.append("")
                continue
            parts = []
            for m, fmt in ((as_head, "thing with {}"), (as_tail, "the {}")):
                share = np.asarray(m[t].sum(axis=0)).ravel() / len(t)
                # In name order: the same kind of entity reads the same whichever relation reached it.
                keep = sorted(b for b in np.lexsort((np.arange(n_b), -share)) if share[b] >= cov)[:KIND_RELATIONS]
                if keep:
                    joined = (", " if fmt.startswith("thing") else " or ").join(relation_text(base_ids[b]) for b in keep)
                    parts.append(fmt.format(joined))
            own[rep[r]] = "; ".join(parts)
            out.append(own[rep[r]])
        return out

    def _kind_embeddings(self) -> np.ndarray:
        """(R, d) unit rows: each relation's kind text (:meth:`kind_texts`) embedding, centred."""
        if self._kind is None:
            self._kind = self._centred_texts(self.kind_texts())
        return self._kind

    def relation_words(self) -> list[tuple[str, tuple[str, ...]]]:
        """Per relation id: (its base name, the words of that name that can name it in a question).

        The base name drops the inverse suffix (``directed_by^-1`` -> ``directed_by``: a question names a
        relation whichever way it is followed). Its words are :func:`content_words` of its readable text
        (:func:`engine.paths.relation_text`), less the words found in the names of more than
        ``max(2, 10%)`` of the base relations: such a word names no relation in particular (``film`` in
        most of FB15k-237's ``/film/...`` names; none of MetaQA's words is dropped).
        """
        if self._rel_words is None:
            from kge.artifact import INVERSE_SUFFIX

            names = self.retriever.graph.relation_names
            bases = [n[: -len(INVERSE_SUFFIX)] if n.endswith(INVERSE_SUFFIX) else n for n in names]
            words = {b: tuple(dict.fromkeys(content_words(relation_text(b)))) for b in dict.fromkeys(bases)}
            df: dict[str, int] = {}
            for ws in words.values():
                for w in ws:
                    df[w] = df.get(w, 0) + 1
            cap = max(2, int(0.1 * len(words)))
            self._rel_words = [(b, tuple(w for w in words[b] if df[w] <= cap)) for b in bases]
        return self._rel_words

    def named_relations(self, text: str) -> frozenset[str]:
        """The base relations (:meth:`relation_words`) that ``text`` names: one of its :func:`content_words`
        matches (:func:`words_match`) a word of the relation's name."""
        qw = set(content_words(text))
        if not qw:
            return frozenset()
        return frozenset(b for b, ws in dict(self.relation_words()).items()
                         if any(words_match(a, w) for a in qw for w in ws))

    def phrase_embeddings(self, phrases: Sequence[str]) -> np.ndarray:
        """(len(phrases), d) unit rows: each answer phrase embedded, minus the mean of :data:`WH_CENTRE`'s
        (fixed, so a question's cost does not depend on the other questions asked)."""
        enc = self.retriever.encoder
        if self._wh_centre is None:
            self._wh_centre = _unit(np.asarray(enc.encode(list(WH_CENTRE)), dtype=np.float64)).mean(axis=0)
        return _unit(np.asarray(enc.encode(list(phrases)), dtype=np.float64) - self._wh_centre)

    def answer_type_scores(self, texts: Sequence[str]) -> np.ndarray:
        """(questions, R): cosine between each question's answer phrase (:func:`answer_phrase`, centred:
        :meth:`phrase_embeddings`) and each relation's centred range text (0 without edges)."""
        return self.phrase_embeddings([answer_phrase(t) or t for t in texts]) @ self._range_embeddings().T

    def kind_scores(self, texts: Sequence[str]) -> np.ndarray:
        """(questions, R): cosine between each question's kind phrase (:func:`kind_phrase`, centred:
        :meth:`phrase_embeddings`) and each relation's centred kind text (:meth:`kind_texts`; 0 when empty)."""
        w = self.settings.kind_words
        phrases = [kind_phrase(t, w) or t for t in texts]
        out = self.phrase_embeddings(phrases) @ self._kind_embeddings().T
        # A question word alone ("who", "when") names no kind of thing: its cosines with the kind texts
        # only echo the texts' wording (MiniLM puts "who" nearer "the starred actors" than "the written by").
        out[[len(p.split()) < 2 for p in phrases]] = 0.0
        return out

    def embedding_retrieve(self, topics: Sequence[int], texts: Sequence[str], *, r_progress: bool = False,
                           results: Sequence[AskResult] | None = None) -> list[list[tuple[float, tuple[int, ...]]]]:
        """Embedding-only retrieval: per topic the ``k`` cheapest reachable relation sequences, cost
        ``1 − cos(embed(path text), embed(question text)) + (length_penalty + length_prior · (length_pivot
        − question words)) · (hops − 1) − answer_type_weight · cos(answer phrase, range text of the last
        relation) − kind_weight · cos(kind phrase, kind text of the last relation) − lexical_weight ·
        F1(relations followed, relations named)`` (KARPA-H with the question as the plan, a per-hop cost that
        depends on the question's length, an answer-type term, a kind term and a lexical term, all on this
        one cost scale: :meth:`path_text`, :meth:`answer_type_scores`, :meth:`kind_scores`,
        :meth:`named_relations`); ties by
        length, then ids.  With a verbalizer the first two embeddings are centred on the mean of the
        relations' verbalized texts (:meth:`_verbalized_mean`)."""
        s = self.settings
        enumerated = []
        iterator: Any = range(len(topics))
        if r_progress:
            from kgreason.progress import progress_bar

            iterator = progress_bar(iterator, desc="ask: enumerate paths", unit="question")
        for i in iterator:
            seqs, truncated = self.reachable_sequences(int(topics[i]), s.max_hops)
            if truncated and results is not None:
                results[i].warn("retrieve", f"relation sequences capped at {len(seqs)}")
            enumerated.append(seqs)
        costs = self.score_sequences(enumerated, texts)
        out = []
        for seqs, cost in zip(enumerated, costs):
            order = sorted(range(len(seqs)), key=lambda j: (cost[j], len(seqs[j]), seqs[j]))[: s.k]
            out.append([(float(cost[j]), seqs[j]) for j in order])
        return out

    def score_sequences(self, seq_lists: Sequence[Sequence[tuple[int, ...]]], texts: Sequence[str]) -> list[np.ndarray]:
        """Embedding-only costs (:meth:`embedding_retrieve`'s formula) of any relation sequences, one list per
        question text (the sequences need not exist in the KG)."""
        s = self.settings
        enc = self.retriever.encoder
        # One encoder call for every sequence text not seen before; kept across calls and on disk.
        self._sequence_embeddings([self.path_text(x) for seqs in seq_lists for x in seqs])
        q = np.asarray(enc.encode(list(texts)), dtype=np.float64)
        votes = self.exemplar_votes(q, seq_lists) if self._ex_texts and s.exemplar_weight > 0 else None
        mu = self._verbalized_mean() if self.verbalizer is not None else None
        if mu is not None:
            q = _unit(q - mu)
        types = self.answer_type_scores(texts) if s.answer_type_weight > 0 else None
        kinds = self.kind_scores(texts) if s.kind_weight > 0 else None
        out = []
        for i, seqs in enumerate(seq_lists):
            if not seqs:
                out.append(np.zeros(0, dtype=np.float64))
                continue
            E = np.stack([self._seq_emb[self.path_text(x)] for x in seqs]).astype(np.float64)
            if mu is not None:
                E = _unit(E - mu)
            per_hop = s.length_penalty + s.length_prior * (s.length_pivot - len(str(texts[i]).split()))
            cost = np.round(np.clip(1.0 - E @ q[i], 0.0, 2.0), 12) + per_hop * np.array(
                [len(x) - 1 for x in seqs], dtype=np.float64)
            if types is not None:
                cost = np.round(cost - s.answer_type_weight * types[i][[x[-1] for x in seqs]], 12)
            if kinds is not None:
                cost = np.round(cost - s.kind_weight * kinds[i][[x[-1] for x in seqs]], 12)
            if s.lexical_weight > 0:
                named = self.named_relations(texts[i])
                if named:
                    base = self.relation_words()
                    lex = np.array([lexical_f1([base[r][0] for r in x], named) for x in seqs], dtype=np.float64)
                    cost = np.round(cost - s.lexical_weight * lex, 12)
            if votes is not None:
                cost = np.round(cost - s.exemplar_weight * votes[i], 12)
            out.append(cost)
        return out

    def exemplar_votes(self, q: np.ndarray, enumerated: Sequence[Sequence[tuple[int, ...]]]) -> list[np.ndarray]:
        """Per question, each candidate path's exemplar vote: the mean of the ``exemplar_k`` highest
        cosines between the question embedding (row of ``q``, uncentred: question against question) and
        the exemplar questions labelled with that path (fewer when it has fewer); 0 for unlabelled paths."""
        k = self.settings.exemplar_k
        if self._ex_emb is None:
            self._ex_emb = _unit(np.asarray(self.retriever.encoder.encode(self._ex_texts), dtype=np.float64))
        sims = _unit(q) @ self._ex_emb.T
        out = []
        for i, seqs in enumerate(enumerated):
            v = np.zeros(len(seqs), dtype=np.float64)
            for j, x in enumerate(seqs):
                idx = self._ex_paths.get(tuple(x))
                if idx is not None:
                    row = sims[i, idx]
                    top = row if len(row) <= k else np.partition(row, len(row) - k)[len(row) - k:]
                    v[j] = float(np.mean(top))
            out.append(v)
        return out

    # ---------------------------------------------------------------- pieces
    def _call_planner(self, planner: Planner, reqs: list[PlanRequest], live: list[AskResult], round_: int
                      ) -> list[PlanReply]:
        try:
            replies = list(planner.plan(reqs))
        except UserError:
            raise
        except Exception as exc:  # a broken planner degrades to embedding-only, with a warning
            replies = [PlanReply(ok=False, warnings=(f"planner failed: {type(exc).__name__}: {exc}",)) for _ in reqs]
        if len(replies) != len(reqs):
            raise RuntimeError(f"planner returned {len(replies)} replies for {len(reqs)} requests")
        for r, req, rep in zip(live, reqs, replies):
            r.llm_calls += rep.calls
            r.llm_tokens += rep.tokens
            for w in rep.warnings:
                r.warn(f"plan round {round_}", w)
            r.trace.append({"step": "plan", "round": round_, "candidates": len(req.relations), "ok": rep.ok,
                            "plans": [list(p) if isinstance(p, (list, tuple)) else p for p in rep.plans]})
        return replies

    def context_path(self, r: AskResult, p: AskPath) -> ContextPath:
        s = self.settings
        g = self.retriever.graph
        evidence = tuple(tuple((g.entity_name(h), g.relation_name(x), g.entity_name(t)) for h, x, t in ep)
                         for ep in p.entity_paths)
        return ContextPath(topic=str(r.topic), relations=p.names,
                           answers=tuple(a.entity for a in p.answers[: s.tails_per_path]),
                           evidence=evidence, num_answers=max(p.num_tails, len(p.answers)))

    def _select(self, r: AskResult, rep: ReasonReply | None) -> list[AskAnswer]:
        s = self.settings
        out: list[AskAnswer] = []
        seen: set[int] = set()

        def add(rank: int, a: Any, by: str) -> None:
            if a.id in seen or len(out) >= s.answers:
                return
            seen.add(a.id)
            out.append(self._answer(r, rank, a, by))

        if rep is not None:
            bad = [i for i in rep.paths if not (isinstance(i, int) and 1 <= i <= len(r.paths))]
            if bad:
                r.warn("reason", f"path numbers {bad} out of range 1..{len(r.paths)}: ignored")
            chosen = [i for i in rep.paths if isinstance(i, int) and 1 <= i <= len(r.paths)]
            if rep.answers:
                # Named answers: each from the first chosen (else any) path that has it.
                order = chosen + [i for i in range(1, len(r.paths) + 1) if i not in chosen]
                unknown = []
                for name in rep.answers:
                    key = _fold(str(name))
                    hit = next(((i, a) for i in order for a in r.paths[i - 1].answers if _fold(a.entity) == key), None)
                    if hit is None:
                        unknown.append(str(name))
                    else:
                        add(hit[0], hit[1], "llm")
                if unknown:
                    r.warn("reason", f"{len(unknown)} answer(s) not among the candidates' tails, e.g. {unknown[0]!r}")
            elif chosen:
                # Paths only: their answers merged by the executor's score.
                merged = sorted(((a.score, -i, a) for i in chosen for a in r.paths[i - 1].answers),
                                key=lambda t: (-t[0], -t[1], t[2].id))
                for _, neg_i, a in merged:
                    add(-neg_i, a, "llm")
            if out:
                return out
            r.warn("reason", "the reasoner picked nothing usable: "
                   + ("best-path answers" if s.vote_paths == 1 else "the candidate paths' vote"))
        return out

    def _execute(self, nodes: Sequence[Node], keys: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Run every distinct query once (one executor pass, :meth:`~engine.exec.executor.Executor.iter_scores`;
        ``keys``: the queries' S-expressions, equal for equal queries, e.g. two questions about one topic):
        per query, the entities with a positive score (int64 ids, ascending) and their scores (float64)."""
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        todo = sorted(first.values())
        got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for idx, rows in self.engine.executor.iter_scores([nodes[i] for i in todo]):
            rows = rows.float().cpu().numpy()
            for k, row in zip(idx, rows):
                ids = np.flatnonzero(row > 0)
                got[keys[todo[k]]] = (ids.astype(np.int64), row[ids].astype(np.float64))
        return [got[k] for k in keys]

    def _vote(self, rs: Sequence[AskResult], reach: dict[int, list[tuple[np.ndarray, np.ndarray]]],
              chosen: dict[int, list[int]] | None = None) -> None:
        """Answers of questions without a reasoner's pick: the vote of their first ``vote_paths`` candidate
        paths with answers (:func:`vote_ranking` on the executor's scores of every entity they reach,
        ``reach``: per question, per path, the (ids, scores) step 5 kept), each answer carrying the
        best-ranked of those paths that reaches it and its score there.  Runs no query: explanations come
        after (:meth:`_explain`).

        ``chosen`` (``id(result) -> 0-based path indices``, ``AskSettings.pick_vote``): the paths a reasoner
        picked; only entities they reach are ranked, they vote first with the weight of the cheapest
        candidate (the others as above), and each answer carries the first chosen path reaching it
        (``selected_by="llm"``)."""
        s = self.settings
        if s.vote_paths == 1:
            for r in rs:
                for i, p in enumerate(r.paths, 1):
                    if p.answers:
                        r.answers = [self._answer(r, i, a, "best-path") for a in p.answers[: s.answers]]
                        break
            return
        chosen = chosen or {}
        names = self.engine.artifact.entities
        for r in rs:
            ch = chosen.get(id(r), [])
            idx = list(dict.fromkeys(ch + [i for i, p in enumerate(r.paths) if p.answers][: s.vote_paths]))
            if not idx:
                continue
            rows = [reach[id(r)][i] for i in idx]
            # The vote over the entities these paths reach only (columns in id order: ties stay by id).
            cols = np.unique(np.concatenate([ids for ids, _ in rows]))
            S = np.zeros((len(idx), len(cols)), dtype=np.float64)
            for k, (ids, vals) in enumerate(rows):
                S[k, np.searchsorted(cols, ids)] = vals
            costs = [r.paths[i].cost for i in idx]
            if ch:
                # The reasoner's paths decide which entities; the other candidates only order them
                # (an exact KG gives every answer of a path the same score).
                S[:, ~np.any(S[: len(ch)] > 0, axis=0)] = 0.0
                costs = [min(costs)] * len(ch) + costs[len(ch):]
            ents, first = vote_ranking(S, costs, s.vote_temperature, s.answers)
            r.trace.append({"step": "vote", "paths": len(idx), "temperature": s.vote_temperature,
                            **({"chosen": [i + 1 for i in ch]} if ch else {})})
            for c, f in zip(ents.tolist(), first.tolist()):
                e = int(cols[c])
                a = Answer(entity=names[e], id=e, score=float(S[f, c]), explanation=None, provenance="kg")
                r.answers.append(self._answer(r, idx[f] + 1, a, "llm" if ch else "vote"))

    def _explain(self, rs: Sequence[AskResult]) -> None:
        """Explanations (with ``explain``) and provenance (also when the executor has hooks, which may merge
        evidence) of every answer: one executor batch of each answer's path query restricted to it,
        ``(i path (e answer))``, which walks that path's witnesses for one entity."""
        s = self.settings
        if not (s.explain or self.engine.executor.hooks):
            return
        need = [(r, j) for r in rs for j in range(len(r.answers))]
        if not need:
            return
        nodes = [Intersection((path_query(int(r.topic_id), r.paths[r.answers[j].path_rank - 1].relations,
                                          exclude_topic=s.exclude_topic), Anchor(r.answers[j].id)))
                 for r, j in need]
        for (r, j), qr in zip(need, self.engine.executor.answer(nodes, k=1, explain=s.explain)):
            if qr.answers:
                got = qr.answers[0]
                ex = got.explanation.children[0] if got.explanation is not None else None
                r.answers[j] = replace(r.answers[j], explanation=ex, provenance=got.provenance)

    def _answer(self, r: AskResult, rank: int, a: Any, by: str) -> AskAnswer:
        p = r.paths[rank - 1]
        return AskAnswer(entity=a.entity, id=a.id, score=a.score, path=p.names, path_rank=rank, query=p.query,
                         provenance=a.provenance, selected_by=by, explanation=a.explanation)
