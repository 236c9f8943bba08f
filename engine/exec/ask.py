"""Ask in natural language: the KARPA loop (plan → retrieve → reason) over the engine.

:meth:`Asker.ask` is the driver: six stages, each a method run on the whole batch of questions, in this
order (read this file top-down; the pieces live beside it)::

    topics    the topic entity of each question                          Asker.topics    (ask_text.find_topic)
    plan      the planner's relation paths (an LLM; none without one)    Asker.plan
    retrieve  the candidate paths, best first                            Asker.retrieve  (ask_score.PathScorer)
    execute   every candidate path run ONCE; the rows it reaches kept    Asker.execute
    reason    the reasoner's pick of paths/answers (an LLM)              Asker.reason
    vote      the answers: the paths' vote, a pick one more voter        Asker.vote      (vote_ranking)

    engine/exec/ask_settings.py  the settings, one class per concern (AskSettings: all of them)
    engine/exec/ask_types.py     what planners/reasoners are asked and answer; AskResult, AskPath, AskAnswer
    engine/exec/ask_text.py      reading question text: topic, answer and kind phrases, named relations
    engine/exec/ask_score.py     the embedding-only path score: enumeration, path texts, one embedding cache

In detail:

1. **topics**: the entity in ``[brackets]`` (MetaQA's convention), or the longest
   run of words that is an entity name (case-insensitive); a ``linker``
   (``text -> entity id or None``, e.g. :class:`llm_bridge.linking.EntityLinker`)
   links a bracketed mention that is not an exact name.
2. **plan** (with a :class:`Planner`): the planner proposes relation paths from the question, the topic and
   the ``candidate_relations`` (≤ 30, KARPA's number) relations nearest to the question (its text without
   the topic) in the retriever's embedding space; it is then asked once
   more (``replan``) with the candidates nearest to each step of its first plans
   and those plans, and the second answer is used (the first where the second
   fails).  A plan step is a relation name, or any phrase (a paraphrase is
   embedded); a plan is dropped with a trace warning when it is empty, longer
   than ``max_hops``, or has a step whose nearest relation is less similar than
   ``min_step_similarity``.  No usable plan (or no planner) → embedding-only.
3. **retrieve** (:class:`engine.paths.PathRetriever`): the top ``k`` relation
   paths of each plan (``mode="pathfinding"``: KARPA-P, the plan's length;
   ``"heuristic"``: KARPA-H, any length up to ``max_hops``), merged over plans by
   lowest cost; a plan whose steps all name KG relations is a candidate itself
   (cost 0) even when the KG lacks its edges; after them the plan's cheapest one-step variants
   (``plan_variants``) that have answers.  Embedding-only retrieval ranks every relation sequence of
   1..``max_hops`` hops from the topic by its *cost* (:mod:`engine.exec.ask_score`: the similarity of its
   text to the question's, an answer-type term, a kind term, a question-length prior per extra hop and
   the relations the question names word for word; :meth:`PathScorer.embedding_retrieve`).
4. **execute**: every candidate path becomes a logical query
   ``(p r_L … (p r_1 topic))``, all of them run by the executor in one batch, each
   distinct query once; the entities each reaches and their scores serve the answers,
   the reasoner's context and the vote, and the returned answers' explanations come
   from one batch of their paths restricted to them.
5. **reason**: with a :class:`Reasoner` the LLM sees the paths and
   their tail entities (:mod:`engine.exec.context`, bounded in tokens) and picks
   paths and/or answers.
6. **vote**: the answers are ranked by a vote of the best ``vote_paths`` candidate paths
   (:func:`vote_ranking`), each weighing ``exp(-(cost - lowest) / vote_temperature)`` on the embedding-only
   cost scale; a planned path's cost is lowered by ``plan_bonus`` (:meth:`Asker.weigh`, which also ranks
   the candidates by it) and a reasoner's pick votes with its path's cost lowered by ``pick_bonus``: the
   LLM's word is evidence, not an override (docs/ask.md, "Weighing the LLM").  With ``llm_decides`` (the
   loop before stop 40) plans are ranked first and a pick decides: named answers are the answers, a pick
   of paths alone keeps their answers, ordered by that vote (``pick_vote``).

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

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from kgreason.errors import UserError

from engine.exec.ask_score import PathScorer
from engine.exec.ask_settings import (ANSWER_TYPE_WEIGHT, ASK_MODES, EMBEDDING_CANDIDATES, EXEMPLAR_K,  # noqa: F401
                                      EXEMPLAR_WEIGHT, KIND_COVERAGE, KIND_WEIGHT, KIND_WORDS, LENGTH_PENALTY,
                                      LENGTH_PIVOT, LENGTH_PRIOR, LEXICAL_WEIGHT, PLAN_VARIANTS, RANGE_EXAMPLES,
                                      VOTE_PATHS, VOTE_TEMPERATURE, AskSettings, PlanSettings, ReasonSettings,
                                      ResultSettings, RetrieveSettings, ScoreSettings, VoteSettings)
from engine.exec.ask_text import (ANSWER_PHRASE_WORDS, FILLER_WORDS, FUNCTION_WORDS, MIN_COMPOUND,  # noqa: F401
                                  MIN_WORD, WH_CENTRE, WH_WORDS, answer_phrase, content_words, find_topic, fold,
                                  folded_names, kind_phrase, lexical_f1, question_text, read_exemplars, words_match)
from engine.exec.ask_types import (AskAnswer, AskPath, AskResult, Planner, PlanReply, PlanRequest, Reasoner,
                                   ReasonReply, ReasonRequest, path_query)
from engine.exec.context import ContextPath, format_context
from engine.exec.explain import Answer
from engine.lang.query import Anchor, Intersection, Node, named, to_sexpr
from engine.paths import PathRetriever, Plan, PlanStep, relation_text

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
    "PathScorer",
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


# ------------------------------------------------------------------------------ the loop
class Asker(PathScorer):
    """The loop over one engine (executor) and one path retriever (see the module docstring): :meth:`ask`
    runs the stages below in order, each on the whole batch of questions.

    Args:
        engine: an :class:`engine.exec.api.Engine` (its artifact and executor).
        retriever, settings, verbalizer, exemplars: the embedding-only path score's
            (:class:`~engine.exec.ask_score.PathScorer`); ``settings``: :class:`AskSettings`.
    """

    def __init__(self, engine: Any, retriever: PathRetriever, *, settings: AskSettings | None = None,
                 verbalizer: Callable[[str], str] | None = None,
                 exemplars: Sequence[tuple[str, Sequence[str]]] | None = None) -> None:
        super().__init__(retriever, settings=settings, verbalizer=verbalizer, exemplars=exemplars)
        self.engine = engine
        names = engine.artifact.entities
        self._index = {n: i for i, n in enumerate(names)}
        self._folded: dict[str, int] | None = None

    # ---------------------------------------------------------------- the driver
    def ask(self, questions: Sequence[str], *, planner: Planner | None = None, reasoner: Reasoner | None = None,
            linker: Callable[[str], int | None] | None = None, progress: bool = False) -> list[AskResult]:
        """Answer each question (one :class:`AskResult` each, in order); questions are batched per stage."""
        t_start = time.perf_counter()
        results = self.topics(questions, linker)
        live = [r for r in results if r.topic_id is not None]
        texts = {id(r): self.scoring_text(r.question, r.topic, r.topic_id) for r in live}
        plans = self.plan(live, texts, planner)
        ranked = self.retrieve(live, texts, plans, planner, progress)
        ranked, costs, bonus = self.weigh(live, ranked, self.embedding_costs(live, texts, ranked))
        reach = self.execute(live, ranked, costs, bonus)
        picked = self.reason(live, reasoner)
        self.vote(live, picked, reach)
        elapsed = time.perf_counter() - t_start
        for r in results:
            r.seconds = elapsed / max(len(results), 1)
        return results

    # ---------------------------------------------------------------- 1. topic
    def topics(self, questions: Sequence[str], linker: Callable[[str], int | None] | None) -> list[AskResult]:
        """One result per question, its topic entity found (:func:`find_topic`) or its ``error`` set."""
        names = self.engine.artifact.entities
        results: list[AskResult] = []
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise UserError(f"ask: a question must be non-empty text, got {q!r}")
            if self._folded is None:
                self._folded = folded_names(names)
            tid, how = find_topic(q, names, index=self._index, folded=self._folded, linker=linker)
            r = AskResult(question=q, topic=names[tid] if tid is not None else None, topic_id=tid)
            if tid is None:
                r.error = how
                r.warn("topic", how)
            else:
                r.trace.append({"step": "topic", "entity": names[tid], "id": tid, "how": how})
            results.append(r)
        return results

    # ---------------------------------------------------------------- 2. plan
    def plan(self, live: list[AskResult], texts: dict[int, str], planner: Planner | None) -> dict[int, list[Plan]]:
        """Per question (``id(result)``), the planner's usable plans, checked (:meth:`_check_plan`); none
        without a planner.  Round 1 shows the relations nearest to the question; with ``replan``, round 2 those
        nearest to each step of the first plans, and its answer wins where it has plans."""
        s = self.settings
        rel_names = self.retriever.graph.relation_names
        plans: dict[int, list[Plan]] = {id(r): [] for r in live}
        if planner is not None and live:
            near = self._nearest_relations([texts[id(r)] for r in live], s.candidate_relations)
            conts = {id(r): self.continuations(int(r.topic_id), s.max_hops) for r in live}
            reqs = [PlanRequest(r.question, r.topic, tuple(rel_names[i] for i in nr), continuations=conts[id(r)])
                    for r, nr in zip(live, near)]
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
                    again_req.append(PlanRequest(r.question, r.topic, tuple(rel_names[i] for i in cand), prev,
                                                 continuations=conts[id(r)]))
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

        return plans

    # ---------------------------------------------------------------- 3. retrieve
    def retrieve(self, live: list[AskResult], texts: dict[int, str], plans: dict[int, list[Plan]],
                 planner: Planner | None, progress: bool) -> dict[int, list[tuple[tuple[int, ...], float, str, Any]]]:
        """Per question, its candidate paths, best first: ``(relation ids, cost, source, retriever path)``.

        A question with plans: the retriever's top ``k`` paths of each plan (merged by lowest cost; a plan
        naming KG relations is a candidate itself, cost 0), then the embedding-only ones (``embedding_candidates``)
        and the plan variants (``plan_variants``).  Without: the ``k`` best by the embedding-only score
        (:meth:`embedding_retrieve`)."""
        s = self.settings
        rel_names = self.retriever.graph.relation_names
        planned = [(r, p) for r in live for p in plans[id(r)]]
        by_q = self._planned_paths(live, planned, progress)
        variants = (self._plan_variants(live, plans, by_q, texts) if planned and s.plan_variants > 0
                    else {id(r): [] for r in live})
        for r in live:
            r.retrieval = "plan" if by_q[id(r)] else "embedding"
            if planner is not None and plans[id(r)] and not by_q[id(r)]:
                r.warn("retrieve", "the plans match no path from the topic: embedding-only retrieval")
        # Embedding-only retrieval: the candidates of questions without planned paths, and, beside the planned
        # ones, the best `embedding_candidates` paths of the others when the best embedding-only path is not
        # among the planned ones (a wrong plan step then still leaves the reasoner the path the question's
        # wording points at; when both agree, more candidates only give the reasoner more ways to go wrong).
        # Weighed plans (not llm_decides): every question gets its k best embedding-only paths; the planned
        # ones join them and `weigh` ranks them all on one cost.
        extra: dict[int, list[tuple[tuple[int, ...], float, str, Any]]] = {id(r): [] for r in live}
        emb_q = [r for r in live if not by_q[id(r)] or s.embedding_candidates > 0 or not s.llm_decides]
        if emb_q:
            for r, found in zip(emb_q, self.embedding_retrieve([r.topic_id for r in emb_q],
                                                               [texts[id(r)] for r in emb_q], r_progress=progress,
                                                               results=emb_q)):
                if not by_q[id(r)] or not s.llm_decides:
                    for cost, rels in found:
                        if rels not in by_q[id(r)]:
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
            items = sorted(by_q[id(r)].items(), key=lambda kv: (kv[1][0], len(kv[0]), kv[0]))
            if s.llm_decides or r.retrieval == "embedding":
                items = items[: s.k]  # else `weigh` keeps the k best of them and the variants on one cost
            ranked[id(r)] = [(rels, c, src, rp) for rels, (c, src, rp) in items] + extra[id(r)]
            if items:
                ranked[id(r)] += [v for v in variants[id(r)] if v[0] not in {x[0] for x in extra[id(r)]}]
            r.trace.append({"step": "retrieve", "source": r.retrieval, "plans": [list(p) for p in r.plans],
                            "paths": [[rel_names[x] for x in rels] for rels, _, _, _ in ranked[id(r)]]})
        return ranked

    def _planned_paths(self, live: list[AskResult], planned: list[tuple[AskResult, Plan]], progress: bool
                       ) -> dict[int, dict[tuple[int, ...], tuple[float, str, Any]]]:
        """Per question, its plans' paths: ``relations -> (retriever cost, "plan", retriever path)``, the
        retriever's top ``k`` of each plan merged by lowest cost (without ``llm_decides``: only its best match,
        the paths at the lowest cost), and each plan naming KG relations exactly."""
        s = self.settings
        by_q: dict[int, dict[tuple[int, ...], tuple[float, str, Any]]] = {id(r): {} for r in live}
        if planned:
            kw: dict[str, Any] = dict(mode=s.mode, k=s.k, progress=progress)
            if s.mode == "heuristic":
                kw["max_hops"] = s.max_hops
            got = self.retriever.retrieve([r.topic_id for r, _ in planned], plans=[p for _, p in planned], **kw)
            for (r, _), res in zip(planned, got):
                # Weighed plans: a plan's neighbours are no evidence of the planner's; the embedding-only
                # candidates stand in for them.
                best = min((p.cost for p in res.paths), default=0.0)
                for path in res.paths if s.llm_decides else [p for p in res.paths if p.cost <= best]:
                    cur = by_q[id(r)].get(path.relations)
                    if cur is None or path.cost < cur[0]:
                        by_q[id(r)][path.relations] = (path.cost, "plan", path)
            # A plan naming KG relations exactly is a candidate even where the KG lacks its edges: the
            # executor's calibrated matrices (link prediction) may still answer it.
            for r, p in planned:
                rels = tuple(st.relation for st in p.steps)
                if all(x is not None for x in rels) and rels not in by_q[id(r)]:
                    by_q[id(r)][rels] = (0.0, "plan", self.retriever._result_path(int(r.topic_id), rels, 0.0))
        return by_q

    def _plan_variants(self, live: list[AskResult], plans: dict[int, list[Plan]],
                       by_q: dict[int, dict[tuple[int, ...], tuple[float, str, Any]]], texts: dict[int, str]
                       ) -> dict[int, list[tuple[tuple[int, ...], float, str, Any]]]:
        """Per question, the best ``plan_variants`` variants of its plans of two or more steps (one step
        replaced by another relation) not among its planned paths, by the embedding-only cost."""
        s = self.settings
        rel_names = self.retriever.graph.relation_names
        # Around the plan: a plan of several steps with one step replaced by another relation, the best
        # `plan_variants` of them by the embedding-only cost, after the planned candidates (run on the
        # calibrated matrices even where the observed KG lacks their edges, like a plan).
        variants: dict[int, list[tuple[tuple[int, ...], float, str, Any]]] = {id(r): [] for r in live}
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
        return variants

    def embedding_costs(self, live: list[AskResult], texts: dict[int, str],
                        ranked: dict[int, list[tuple[tuple[int, ...], float, str, Any]]]) -> dict[int, list[float]]:
        """Per question, the embedding-only cost of each candidate (:meth:`score_sequences`): one scale for
        the paths of every source, which the vote weighs them by.  A candidate of embedding-only retrieval
        has it as its cost already; only planned questions are scored again."""
        out = {id(r): [c if src == "embedding" else float("nan") for _, c, src, _ in ranked[id(r)]] for r in live}
        todo = [r for r in live if any(src != "embedding" for _, _, src, _ in ranked[id(r)])]
        if todo:
            got = self.score_sequences([[rels for rels, _, _, _ in ranked[id(r)]] for r in todo],
                                       [texts[id(r)] for r in todo])
            for r, costs in zip(todo, got):
                out[id(r)] = [float(c) for c in costs]
        return out

    def weigh(self, live: list[AskResult], ranked: dict[int, list[tuple[tuple[int, ...], float, str, Any]]],
              embedding_costs: dict[int, list[float]]
              ) -> tuple[dict[int, list[tuple[tuple[int, ...], float, str, Any]]], dict[int, list[float]],
                         dict[int, list[float]]]:
        """The candidates of planned questions ranked by one cost (not with ``llm_decides``): each path's
        embedding-only cost, a planned path's lowered by ``plan_bonus``; the ``k`` best kept, and every
        planned path (the LLM's proposal stays in view, after them).  Returns the ranked candidates (their
        cost that one), their embedding-only costs and their bonuses (all 0 with ``llm_decides``, where the
        plans stay first)."""
        s = self.settings
        bonus = {id(r): [0.0] * len(ranked[id(r)]) for r in live}
        if s.llm_decides:
            return ranked, embedding_costs, bonus
        rel_names = self.retriever.graph.relation_names
        out, costs = dict(ranked), dict(embedding_costs)
        for r in live:
            cands, embs = ranked[id(r)], embedding_costs[id(r)]
            if not any(src == "plan" for _, _, src, _ in cands):
                continue
            eff = [e - (s.plan_bonus if src == "plan" else 0.0) for (_, _, src, _), e in zip(cands, embs)]
            order = sorted(range(len(cands)), key=lambda j: (eff[j], len(cands[j][0]), cands[j][0]))
            keep = order[: s.k] + [j for j in order[s.k:] if cands[j][2] == "plan"]
            out[id(r)] = [(cands[j][0], eff[j], cands[j][2], cands[j][3]) for j in keep]
            costs[id(r)] = [embs[j] for j in keep]
            bonus[id(r)] = [s.plan_bonus if cands[j][2] == "plan" else 0.0 for j in keep]
            r.trace.append({"step": "weigh", "plan_bonus": s.plan_bonus,
                            "paths": [[rel_names[x] for x in cands[j][0]] for j in keep],
                            "costs": [round(eff[j], 6) for j in keep]})
        return out, costs, bonus

    # ---------------------------------------------------------------- 4. execute
    def execute(self, live: list[AskResult], ranked: dict[int, list[tuple[tuple[int, ...], float, str, Any]]],
                embedding_costs: dict[int, list[float]], bonus: dict[int, list[float]] | None = None
                ) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
        """Run every candidate path once, all in one executor call (a path two questions share, once), and
        fill each result's ``paths``; returns per question, per path, what it reaches: (entity ids, scores),
        the topic removed when asked.  The answers, the reasoner's context, the vote and the explanations
        read these rows: none of them runs a path again."""
        s = self.settings
        names = self.engine.artifact.entities
        rel_names = self.retriever.graph.relation_names
        reach: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {id(r): [] for r in live}
        nodes: list[Node] = []
        owners: list[tuple[AskResult, tuple[int, ...], float, str, Any, float, float]] = []
        for r in live:
            bs = bonus[id(r)] if bonus is not None else [0.0] * len(ranked[id(r)])
            for (rels, c, src, rp), e, b in zip(ranked[id(r)], embedding_costs[id(r)], bs):
                nodes.append(path_query(int(r.topic_id), rels, exclude_topic=s.exclude_topic))
                owners.append((r, rels, c, src, rp, e, b))
        if nodes:
            keep = max(s.answers, s.tails_per_path)
            dropped: dict[int, list[list[str]]] = {}
            keys = [to_sexpr(named(node, self.engine.artifact)) for node in nodes]
            for (r, rels, c, src, rp, e, b), key, (ids, vals) in zip(owners, keys, self._execute(nodes, keys)):
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
                                       num_tails=max(ntails, 0), source=src, entity_paths=rp.entity_paths,
                                       embedding_cost=e, plan_bonus=b))
                reach[id(r)].append((ids, vals))
            for r in live:
                if id(r) in dropped:
                    r.trace.append({"step": "variants", "dropped_without_answers": dropped[id(r)]})

        return reach

    # ---------------------------------------------------------------- 5. reason
    def reason(self, live: list[AskResult], reasoner: Reasoner | None) -> dict[int, ReasonReply]:
        """Per question with candidate paths, the reasoner's usable pick (none without a reasoner, or where it
        failed: a broken reasoner degrades to the vote, with a warning)."""
        s = self.settings
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
        return picked

    # ---------------------------------------------------------------- 6. vote
    def vote(self, live: list[AskResult], picked: dict[int, ReasonReply],
             reach: dict[int, list[tuple[np.ndarray, np.ndarray]]]) -> None:
        """Each question's answers, then explained (:meth:`_explain`): the vote of the candidate paths
        (:meth:`_vote`), where a reasoner's pick is one more voter weighed on the paths' cost scale
        (:meth:`_pick_rows`, ``pick_bonus``); with ``llm_decides`` the pick itself (:meth:`_select`), else
        that vote (also the order of a pick of paths alone, ``pick_vote``)."""
        s = self.settings
        if not s.llm_decides:
            picks: dict[int, list[tuple[int, np.ndarray | None]]] = {}
            for r in live:
                rep = picked.get(id(r))
                if rep is not None and r.paths:
                    picks[id(r)] = self._pick_rows(r, rep)
                    if not picks[id(r)]:
                        r.warn("reason", "the reasoner picked nothing usable: the candidate paths' vote")
            self._vote([r for r in live if r.paths], reach, picks=picks)
            self._finish(live)
            return
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
        self._finish(live)

    def _finish(self, live: list[AskResult]) -> None:
        """Explain the answers; warn where a question has none."""
        self._explain(live)
        for r in live:
            if not r.answers and r.paths:
                r.warn("answer", "no candidate path has answers")
            elif not r.paths:
                r.warn("retrieve", "no relation path from the topic")

    # ---------------------------------------------------------------- pieces
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
            chosen, named = self._read_pick(r, rep)
            if rep.answers:
                for i, a in named:
                    add(i, a, "llm")
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

    def _read_pick(self, r: AskResult, rep: ReasonReply) -> tuple[list[int], list[tuple[int, Any]]]:
        """A reasoner's reply read against the candidates: the picked path numbers in range (1-based, in
        order), and each named answer found with the first picked (else any) path that has it, ``(path
        number, answer)``; bad path numbers and unknown names are dropped with a warning."""
        bad = [i for i in rep.paths if not (isinstance(i, int) and 1 <= i <= len(r.paths))]
        if bad:
            r.warn("reason", f"path numbers {bad} out of range 1..{len(r.paths)}: ignored")
        chosen = [i for i in rep.paths if isinstance(i, int) and 1 <= i <= len(r.paths)]
        order = chosen + [i for i in range(1, len(r.paths) + 1) if i not in chosen]
        named, unknown = [], []
        for name in rep.answers:
            key = fold(str(name))
            hit = next(((i, a) for i in order for a in r.paths[i - 1].answers if fold(a.entity) == key), None)
            if hit is None:
                unknown.append(str(name))
            else:
                named.append(hit)
        if unknown:
            r.warn("reason", f"{len(unknown)} answer(s) not among the candidates' tails, e.g. {unknown[0]!r}")
        return chosen, named

    def _pick_rows(self, r: AskResult, rep: ReasonReply) -> list[tuple[int, np.ndarray | None]]:
        """A reasoner's pick as voters (not with ``llm_decides``): ``(0-based path index, entity ids or
        None)`` rows.  Named answers (:meth:`_read_pick`): one row per path they were found on, restricted
        to them; else each picked path whole.  ``[]``: nothing usable."""
        chosen, named = self._read_pick(r, rep)
        if not rep.answers:
            return [(i - 1, None) for i in dict.fromkeys(chosen)]
        rows: dict[int, set[int]] = {}
        for i, a in named:
            rows.setdefault(i - 1, set()).add(a.id)
        return [(i, np.asarray(sorted(ids), dtype=np.int64)) for i, ids in rows.items()]

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
              chosen: dict[int, list[int]] | None = None,
              picks: dict[int, list[tuple[int, np.ndarray | None]]] | None = None) -> None:
        """Answers of questions without a reasoner's pick: the vote of their first ``vote_paths`` candidate
        paths with answers (:func:`vote_ranking` on the executor's scores of every entity they reach,
        ``reach``: per question, per path, the (ids, scores) step 5 kept), each answer carrying the
        best-ranked of those paths that reaches it and its score there.  Runs no query: explanations come
        after (:meth:`_explain`).

        ``chosen`` (``id(result) -> 0-based path indices``, ``AskSettings.pick_vote``): the paths a reasoner
        picked; only entities they reach are ranked, they vote first with the weight of the cheapest
        candidate (the others as above), and each answer carries the first chosen path reaching it
        (``selected_by="llm"``, ``llm_decides``).

        ``picks`` (``id(result) -> (0-based path index, entity ids or None)`` rows, :meth:`_pick_rows`): a
        reasoner's pick as voters beside the paths, each with its path's cost lowered by ``pick_bonus``
        (a whole picked path votes once, so); an answer first reached by one of them is ``selected_by="llm"``."""
        s = self.settings
        picks = picks or {}
        if s.vote_paths == 1:
            for r in [r for r in rs if picks.get(id(r))]:
                self._vote_rows(r, reach, picks[id(r)])
            for r in [r for r in rs if not picks.get(id(r))]:
                for i, p in enumerate(r.paths, 1):
                    if p.answers:
                        r.answers = [self._answer(r, i, a, "best-path") for a in p.answers[: s.answers]]
                        break
            return
        if not s.llm_decides:
            for r in rs:
                self._vote_rows(r, reach, picks.get(id(r), []))
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
            costs = [r.paths[i].vote_cost for i in idx]  # one scale: the embedding-only cost of every path
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

    def _vote_rows(self, r: AskResult, reach: dict[int, list[tuple[np.ndarray, np.ndarray]]],
                   picks: Sequence[tuple[int, np.ndarray | None]]) -> None:
        """One question's vote (:func:`vote_ranking`): the reasoner's ``picks`` first, each with its path's
        vote cost lowered by ``pick_bonus``, then the first ``vote_paths`` candidate paths with answers (a
        path picked whole votes once, as a pick)."""
        s = self.settings
        whole = {i for i, ids in picks if ids is None}
        voters: list[tuple[int, np.ndarray | None, bool]] = [(i, ids, True) for i, ids in picks]
        voters += [(i, None, False) for i, p in enumerate(r.paths) if p.answers and i not in whole][: s.vote_paths]
        rows = []
        for i, keep, _ in voters:
            ids, vals = reach[id(r)][i]
            if keep is not None:
                m = np.isin(ids, keep)
                ids, vals = ids[m], vals[m]
            rows.append((ids, vals))
        if not any(len(ids) for ids, _ in rows):
            return
        cols = np.unique(np.concatenate([ids for ids, _ in rows]))
        S = np.zeros((len(rows), len(cols)), dtype=np.float64)
        for k, (ids, vals) in enumerate(rows):
            S[k, np.searchsorted(cols, ids)] = vals
        costs = [r.paths[i].vote_cost - (s.pick_bonus if by_llm else 0.0) for i, _, by_llm in voters]
        ents, first = vote_ranking(S, costs, s.vote_temperature, s.answers)
        r.trace.append({"step": "vote", "paths": len(voters), "temperature": s.vote_temperature,
                        **({"picked": [i + 1 for i, _ in picks], "pick_bonus": s.pick_bonus} if picks else {})})
        names = self.engine.artifact.entities
        for c, f in zip(ents.tolist(), first.tolist()):
            e = int(cols[c])
            a = Answer(entity=names[e], id=e, score=float(S[f, c]), explanation=None, provenance="kg")
            r.answers.append(self._answer(r, voters[f][0] + 1, a, "llm" if voters[f][2] else "vote"))

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
