"""The ask loop's settings: one frozen class per concern, :class:`AskSettings` all of them together.

Each field is declared once, with its default, range and help (:func:`kgreason.cli.setting`): the flags of
``python -m engine.ask`` are made from these fields (:func:`kgreason.cli.add_settings_arguments`), and a bad
value fails the same check with the same words whether it came from a flag or from code
(``AskSettings(k=0)`` and ``--k 0``: ``--k must be >= 1, got 0``).

The concerns, in the loop's order (:mod:`engine.exec.ask`)::

    RetrieveSettings  how many candidate paths, how long, how plans are retrieved
    PlanSettings      the LLM planner: candidates shown, replanning, plan checks, plan variants
    ScoreSettings     the embedding-only path score (the terms of :meth:`engine.exec.ask_score.PathScorer.score_sequences`)
    ReasonSettings    the LLM reasoner: its context, and how a pick of paths is ordered
    VoteSettings      the vote of candidate paths that answers without a reasoner's pick
    ResultSettings    what an answer list holds

Imports nothing heavy (no torch, no numpy): ``python -m engine.ask --help`` reads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kgreason.cli import Settings, setting
from kgreason.errors import UserError

from engine.exec.context import CONTEXT_STYLES

__all__ = ["ASK_MODES", "AskSettings", "RetrieveSettings", "PlanSettings", "ScoreSettings", "ReasonSettings",
           "VoteSettings", "ResultSettings", "MAX_HOPS", "PLAN_BONUS", "PICK_BONUS"]

ASK_MODES = ("pathfinding", "heuristic")
#: Longest relation path: the relation sequences from a topic grow exponentially with it.
MAX_HOPS = 6
#: Embedding-only score defaults, chosen on MetaQA dev questions (docs/ask.md): the cost per hop beyond the
#: first, the answer-type term and the question-length prior.
LENGTH_PENALTY = 0.05
ANSWER_TYPE_WEIGHT = 0.7
RANGE_EXAMPLES = 6
LENGTH_PRIOR = 0.04
LENGTH_PIVOT = 8
#: Kind term (the question's answer phrase against the kind of entity a path ends in, read from the KG).
KIND_WEIGHT = 1.5
KIND_COVERAGE = 0.5
KIND_WORDS = 1
#: The kind word (stop 40): a word naming a relation near the question word is what is asked for, read as the
#: kind texts of the relations it names; "who" naming none reads as "which person" (MetaQA dev, docs/ask.md).
KIND_WINDOW = 3
KIND_WHO = True
KIND_NAMED = True
#: The topic's kind word (stop 41): a content word right before the topic mention naming no relation, whose
#: cosine with the kind text of a relation reaching the topic is at least this, describes the topic ("describe
#: the *film* [X]"), not what is asked, and is left out of the question text (MetaQA dev, docs/ask.md).
TOPIC_KIND_COS = 0.3
#: Lexical term: the F1 between the relations a path follows and those the question names.
LEXICAL_WEIGHT = 0.6
#: Exemplar vote, chosen on held-out MetaQA dev exemplars.
EXEMPLAR_WEIGHT = 4.0
EXEMPLAR_K = 3
#: Embedding-only paths shown to the reasoner beside the planned ones: off, no gain measured on MetaQA.
EMBEDDING_CANDIDATES = 0
#: Plans of several steps with one step replaced, shown beside the planned paths.
PLAN_VARIANTS = 4
#: How much an LLM's word weighs on the embedding-only cost scale (docs/ask.md, "Weighing the LLM"): a planned
#: path's cost and a reasoner's picked path's cost are lowered by these, chosen on MetaQA dev questions.
PLAN_BONUS = 0.3
PICK_BONUS = 0.3
#: The vote of the top candidate paths, chosen on MetaQA dev questions (docs/ask.md).
VOTE_PATHS = 16
VOTE_TEMPERATURE = 0.1


def _boolean(value: Any, flag: str) -> None:
    """A switch set from code must be a bool (``"yes"`` is not one)."""
    if not isinstance(value, bool):
        raise UserError(f"{flag} must be true or false, got {value!r}")


def _switch(default: bool, help: str, **flag: Any) -> Any:
    return setting(default, check=_boolean, help=help, **flag)


@dataclass(frozen=True, kw_only=True)
class RetrieveSettings(Settings):
    """Candidate relation paths: ``k`` kept per question (KARPA's K), at most ``max_hops`` long; a plan's
    paths are retrieved by ``mode``: ``"pathfinding"`` (KARPA-P, the plan's length) or ``"heuristic"``
    (KARPA-H, any length up to ``max_hops``)."""

    k: int = setting(16, low=1, integer=True, help="candidate relation paths per question")
    mode: str = setting("pathfinding", choices=ASK_MODES,
                        help="retrieval of planned paths: KARPA-P (the plan's length) or KARPA-H (any length)")
    max_hops: int = setting(3, low=1, high=MAX_HOPS, integer=True, help="longest relation path")


@dataclass(frozen=True, kw_only=True)
class PlanSettings(Settings):
    """The planner (an LLM, with ``--llm``).

    ``candidate_relations``: relations nearest to the question shown to it; ``replan``: ask it a second time
    with the candidates of its first plans; ``min_step_similarity``: a plan step whose nearest relation has a
    lower cosine similarity names nothing in the KG and drops its plan.  ``plan_variants``: for a plan of two
    or more steps, its variants with one step replaced by another relation, the best this many by the
    embedding-only score, are added after the planned candidates (source ``"plan-variant"``; run like a plan
    even where the observed KG lacks them): a plan with one wrong step still offers the reasoner the right
    path.  A 1-step plan has none: its retrieval already holds every relation leaving the topic.
    ``empty_variants``: also show the variants the executor finds no answers for (the trace lists them,
    step ``"variants"``).

    How a plan counts (docs/ask.md, "Weighing the LLM"): by default a plan is evidence beside the question's
    wording, never an override.  The best match of each plan among the paths from the topic (the
    retriever's lowest cost; the plan itself where its steps name KG relations) joins the ``k`` best
    embedding-only candidates with its embedding-only cost lowered by ``plan_bonus``, and all of them are
    ranked (and voted) by that one cost: a plan wins a close call and loses to a clearly better-worded path.
    ``llm_decides`` restores the loop before stop 40: the plans' retrieved paths (the retriever's top ``k``
    of each) ranked first, the embedding-only candidates only beside them (``embedding_candidates``: when
    the best embedding-only path of a planned length is not among the planned candidates, the best this many
    such paths are added after them, source ``"embedding"``), and a reasoner's pick decides the answers."""

    candidate_relations: int = setting(30, low=1, integer=True,
                                       help="relations nearest to the question shown to the planner")
    replan: bool = _switch(True, "ask the planner once, not twice", flag="--no-replan", negate=True)
    min_step_similarity: float = setting(0.2, low=-1.0, high=1.0, metavar="S",
                                         help="a plan step whose nearest relation is less similar names no "
                                              "relation and drops its plan")
    plan_variants: int = setting(PLAN_VARIANTS, low=0, integer=True,
                                 help="with --llm: a plan's best variants with one step replaced, shown beside it")
    empty_variants: bool = _switch(False, "with --llm: also show the plan variants that have no answers")
    embedding_candidates: int = setting(EMBEDDING_CANDIDATES, low=0, integer=True,
                                        help="with --llm-decides: when the best embedding-only path of a planned "
                                             "length is not among the planned candidates, show the reasoner this "
                                             "many such paths too")
    plan_bonus: float = setting(PLAN_BONUS, low=0.0, high=10.0, metavar="B",
                                help="with --llm: a planned path competes with the embedding-only candidates at "
                                     "its embedding-only cost lowered by B (0: no more than any candidate)")
    llm_decides: bool = _switch(False, "with --llm: planned paths ranked first and a reasoner's pick decides the "
                                "answers (before stop 40; default: both weighed on the embedding-only cost scale, "
                                "--plan-bonus and --pick-bonus)")


@dataclass(frozen=True, kw_only=True)
class ScoreSettings(Settings):
    """The embedding-only path score: a path's *cost*, lower is better (docs/ask.md, "The path score").

    ``1 − cos(path text, question text)`` (in [0, 2]) plus ``length_penalty + length_prior · (length_pivot −
    words)`` per hop beyond the first (``words``: the question's word count without its topic), minus
    ``answer_type_weight`` times the cosine between the question's answer phrase ("which movies") and the
    path's range text (the names of the ``range_examples`` most frequent tails of its last relation), minus
    ``kind_weight`` times the cosine between the question's kind phrase (the question word and ``kind_words``
    words after it; with ``kind_window``, the word naming a relation among the ``kind_window`` words around
    "which"/"what"/"who", :func:`~engine.exec.ask_text.kind_word`, which with ``kind_named`` stands for the
    kind texts of the relations it names; with ``kind_who`` a "who" naming none reads as "which person") and
    the kind text of the path's last relation (read from the KG: a relation enters it when at least
    ``kind_coverage`` of its tails take part in it), minus ``lexical_weight`` times the F1
    between the relations the path follows and those the question names word for word, minus
    ``exemplar_weight`` times the mean of the ``exemplar_k`` highest cosines with the exemplar questions
    labelled with the path (with exemplars).  The terms may take a cost below 0: it is a cost, compared
    between paths, never a probability.  The question text is the question without its topic mention and,
    with ``topic_kind_cos`` < 1, without a word before it naming the topic's kind
    (:meth:`~engine.exec.ask_score.PathScorer.scoring_text`)."""

    length_penalty: float = setting(LENGTH_PENALTY, low=0.0, high=1.0, metavar="C",
                                    help="embedding-only score: cost per hop beyond the first")
    length_prior: float = setting(LENGTH_PRIOR, low=0.0, high=1.0, metavar="C",
                                  help="embedding-only score: and C x (--length-pivot - question words) per hop "
                                       "beyond the first (0 turns it off)")
    length_pivot: int = setting(LENGTH_PIVOT, low=0, integer=True, metavar="WORDS",
                                help="see --length-prior")
    answer_type_weight: float = setting(ANSWER_TYPE_WEIGHT, low=0.0, high=10.0, metavar="W",
                                        help="embedding-only score: cost lowered by W x the cosine between the "
                                             "question's answer phrase and the path's range text (0 turns it off)")
    range_examples: int = setting(RANGE_EXAMPLES, low=1, integer=True, metavar="N",
                                  help="tail names per relation in its range text")
    kind_weight: float = setting(KIND_WEIGHT, low=0.0, high=10.0, metavar="W",
                                 help="embedding-only score: cost lowered by W x the cosine between the kind of "
                                      "thing the question asks for ('which films') and the kind of entity the "
                                      "path ends in, read from the KG (docs/ask.md; 0 turns it off)")
    kind_coverage: float = setting(KIND_COVERAGE, low=0.0, low_open=True, high=1.0, metavar="SHARE",
                                   help="a relation enters a kind text when at least this share of the tails "
                                        "take part in it")
    kind_words: int = setting(KIND_WORDS, low=0, integer=True, metavar="N",
                              help="words after 'which'/'what' in the question's kind phrase")
    kind_window: int = setting(KIND_WINDOW, low=0, integer=True, metavar="N",
                               help="the kind phrase takes the first word naming a relation among the N words "
                                    "around 'which'/'what'/'who' ('what film genre' -> 'what genre'; 0 turns it off)")
    kind_who: bool = _switch(KIND_WHO, "a 'who'/'whom' naming no relation reads as 'who' alone (no kind term), not as "
                             "'which person'", flag="--no-kind-who", negate=True)
    kind_named: bool = _switch(KIND_NAMED, "a kind word naming relations is embedded as a word, not read as the kind "
                               "texts of the relations it names", flag="--no-kind-named", negate=True)
    topic_kind_cos: float = setting(TOPIC_KIND_COS, low=0.0, high=1.0, metavar="COS",
                                    help="a word right before the topic mention that names no relation and whose "
                                         "cosine with the topic's kind text (read from the KG) is at least COS "
                                         "names the topic's kind ('describe the film [X]') and is left out of the "
                                         "question text (1 turns it off)")
    lexical_weight: float = setting(LEXICAL_WEIGHT, low=0.0, high=10.0, metavar="W",
                                    help="embedding-only score: cost lowered by W x the F1 between the relations "
                                         "a path follows and those the question names word for word (0 turns it off)")
    exemplar_weight: float = setting(EXEMPLAR_WEIGHT, low=0.0, high=10.0, metavar="W",
                                     help="cost lowered per unit of exemplar vote (0 ignores the exemplars)")
    exemplar_k: int = setting(EXEMPLAR_K, low=1, integer=True,
                              help="the exemplar vote averages the k most similar exemplars of a path")


@dataclass(frozen=True, kw_only=True)
class ReasonSettings(Settings):
    """The reasoner (an LLM, with ``--llm``): its prompt's KG context (``context`` style, at most
    ``max_context_tokens`` tokens, ``tails_per_path`` tail entities per path).

    By default a pick is one more voter in the candidate paths' vote (:meth:`engine.exec.ask.Asker.vote`):
    each picked path, and each path's named answers (the path a named answer is found on, restricted to the
    named answers), votes with that path's cost lowered by ``pick_bonus`` (the embedding-only scale of
    ``plan_bonus``), so a pick decides a close call and not a clear one.  With ``llm_decides`` the pick
    decides: named answers are the answers; a pick of paths without named answers keeps the entities the
    chosen paths reach, ordered by the vote of the candidate paths (``pick_vote``: the chosen paths weigh as
    much as the cheapest candidate) instead of by the chosen paths' own scores, which tie on an exact KG
    (not with ``vote_paths=1``)."""

    context: str = setting("yaml", choices=CONTEXT_STYLES, help="KG context format of the reasoning prompt")
    max_context_tokens: int = setting(1500, low=0, integer=True, help="context size bound in tokens")
    tails_per_path: int = setting(20, low=1, integer=True, metavar="N",
                                  help="tail entities per path shown to the reasoner")
    pick_vote: bool = _switch(True, "with --llm-decides: a reasoner's pick of paths keeps their answers in the order "
                              "of their own scores, not of the candidate paths' vote", flag="--no-pick-vote", negate=True)
    pick_bonus: float = setting(PICK_BONUS, low=0.0, high=10.0, metavar="B",
                                help="with --llm: a reasoner's picked paths (and named answers) vote with their "
                                     "path's embedding-only cost lowered by B")


@dataclass(frozen=True, kw_only=True)
class VoteSettings(Settings):
    """Answers not picked by a reasoner (no reasoner, or it failed): a vote of the first ``vote_paths``
    candidate paths that have answers (:func:`engine.exec.ask.vote_ranking`): an entity's vote is the sum
    over those paths of ``exp(-(cost - lowest cost) / vote_temperature)`` times its executor score on the
    path, so where the retrieval hesitates between paths, answers several of them reach come first
    (``vote_paths=1``: the best path's answers, ``selected_by="best-path"``)."""

    vote_paths: int = setting(VOTE_PATHS, low=1, integer=True,
                              help="answers not picked by an LLM reasoner: a vote of this many candidate paths, each "
                                   "weighted exp(-(cost - lowest cost) / T) (1: the best path's answers)")
    vote_temperature: float = setting(VOTE_TEMPERATURE, low=0.0, low_open=True, high=100.0, metavar="T",
                                      help="temperature T of the vote's path weights")


@dataclass(frozen=True, kw_only=True)
class ResultSettings(Settings):
    """What an answer list holds: ``answers`` per question, the topic removed (``exclude_topic``, as
    MetaQA's gold answers: "co-directors of X" does not list X), each explained (``explain``)."""

    answers: int = setting(10, low=1, integer=True, help="answers per question")
    exclude_topic: bool = _switch(True, "keep the topic entity among the answers (default: removed, as in MetaQA)",
                                  flag="--include-topic", negate=True)
    explain: bool = _switch(True, "print why each answer holds (default on)", boolean_optional=True)


@dataclass(frozen=True, kw_only=True)
class AskSettings(ResultSettings, VoteSettings, ReasonSettings, ScoreSettings, PlanSettings, RetrieveSettings):
    """How the loop runs: every concern's settings in one frozen value (each field documented on its
    concern's class), e.g. ``AskSettings(k=8, vote_paths=1)``; hashable, so an engine keeps one
    :class:`~engine.exec.ask.Asker` per settings (:meth:`engine.exec.api.Engine.ask`).  (The bases are listed
    last concern first: a dataclass takes its bases' fields in reverse order, so the fields, and the flags,
    read in the loop's order.)"""
