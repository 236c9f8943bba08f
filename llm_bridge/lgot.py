"""LGOT: LLM answers to every sub-question, filtered by likelihood ratio and merged into the fuzzy vectors.

The bridge is one executor hook (:class:`LGOTHook`, registered for every node
op); the executor still walks the query.  Three configurations of one path:

* **KG-only**: no hook;
* **LGOT** (``mode="lgot"``): at each projection node the LLM answers the
  node's sub-question; answers passing the filter are merged into the node's
  fuzzy vector;
* **LLM-only** (``mode="llm-only"``): the node's values are replaced by the
  LLM's scores alone (the LLM answer set as a fuzzy vector).

At a projection node ``(p r q)``, for each of the B rows (all rows in one
``complete_many`` call; the client asks identical prompts once):

1. inputs: the top ``min(inputs, 10)`` entities of the input node ``q``'s value
   (after its own merge: LGOT feeds the merged answers forward), value > 0 and
   value >= ``input_ratio`` x the row's best value (near-zero KG predictions
   padding the prompt drew confident LLM answers about the wrong entities);
2. prompt: ``r``'s question template (:mod:`llm_bridge.relations`) about the
   inputs (:func:`~llm_bridge.prompts.projection_messages`).  A row whose
   input is empty (the KG lost the edges and no LLM answer linked) is still
   asked: about the *previous sub-question* (:func:`llm_bridge.nested.nest`,
   e.g. ``Who directed the answers to «Which films starred "X"?»?``), built
   from the chain of sub-questions down to the anchor, as LGOT's chained
   prompts do; an intersection stands for its one positive child's
   sub-question (MetaQA's ``(i (p ...) (n topic))`` exclusions).  Only a row
   with no sub-question below it to nest is skipped (trace ``skipped``);
3. parse each of the n samples (:func:`~llm_bridge.parse.extract_entities`);
   confidence ``p(e)`` = count/n, or from token log-probabilities;
4. **filter** (likelihood ratio): keep ``e`` iff ``p(e) / p_max >= theta``
   (ratios within 1e-9 of ``theta`` count as equal, i.e. kept);
5. link the kept strings to KG entities (:class:`~llm_bridge.linking.EntityLinker`;
   ties go to the entity the node's KG value prefers); two strings linked to
   one entity keep the larger ``p``;
6. **merge** (LGOT): ``T[e] = max(T[e], alpha * p(e))`` (``merge="max"``) or
   LGOT's additive ``T[e] = min(1, T[e] + alpha * p(e))`` (``merge="add"``),
   through the executor's evidence helper so every merged score keeps its
   provenance; LLM-only: the row becomes ``{e: p(e)}``.

**LLM answer sets through the set operators** (LGOT §3.2): every node has, per
row, an LLM answer set ``{entity: p}`` (an anchor: ``{a: 1}``), possibly
*negated* (from ``np`` or ``n``), or undefined; it travels with the node's value
to the parent's hook call as an annotation (:class:`LGOTRow` under the hook's name,
see :meth:`engine.exec.hooks.NodeValue.annotate`), beside the sub-question the node
was asked with (what an empty-input parent nests).  Intersection = the
intersection of the positive children's sets (``p`` = min) minus the union of
the negated children's sets (LGOT's difference); union = the union (``p`` =
max), undefined when a child is negated; ``n`` flips the child's sign.  The
fuzzy vector itself is still computed by ``ops`` from the (merged) children;
in LGOT mode the combined set is then merged by ``max`` with ``alpha * p``
where that raises the value (the children's merges already reach the node, so
adding again would count the LLM twice; without this an entity both branches'
LLM answers agree on would sink to ``alpha**2``); in LLM-only mode it replaces
the row.  A negated set is never
merged on its own (it has no finite extension); it acts at the enclosing
intersection.  In LLM-only mode an ``np`` row becomes ``1 - p(e)`` on the
LLM's set and 1 elsewhere.

**Answer check** (LGOT §3.3.1, optional: ``answer_check=K > 0``): after the
merge at a ``p`` node, for each row with a sub-question, its top ``K`` entities
by merged value (value > 0, ties by id) are checked with the answer-check
prompt (:func:`~llm_bridge.prompts.answer_check_messages`: the row's filled
sub-question and the entity's name), all rows' checks in one ``complete_many``
call (the client asks identical prompts once), with the client's n samples and temperature.
``p_yes`` = yes votes / valid votes (:func:`~llm_bridge.parse.parse_yes_no`;
undecided replies are not votes).  An entity the LLM rejects (``p_yes < 0.5``
with at least one valid vote) has its value multiplied by ``check_penalty``
(evidence ``merge="scale"``: the explanation keeps its KG witness and
recomputes ``kg * penalty``); accepted or undecided entities are unchanged.
The row's LLM answer set is not changed by the check.  ``np`` nodes are not
checked (a negated set acts at the enclosing intersection).  A failed check
call leaves the row's values unchanged, with a ``"warning"`` note.

**Failures never fail a batch**: a row whose LLM call failed (after the
client's retries, or with the budget spent) keeps its KG value (both modes),
its LLM set is undefined, and the trace gets a ``"warning"`` note.  So does a
row whose reply is *unusable*: no sample reads as entity names
(:attr:`~llm_bridge.parse.ParsedReply.unusable`: ``[[[[...``, a 1 MB line; a
refusal or ``[]`` is an answer, not unusable) or the parsers raised on it; its
``"llm"`` note gets ``unusable`` (why, samples, the first 120 characters).  A
cached reply replays the same way, so a bad reply in the cache never ends a run.

**Trace** (``ctx.note``), per projection row, key ``"llm"``: ``question``,
``inputs``, ``inputs_below_ratio`` (when > 0: how many top entities
``input_ratio`` left out), ``nested`` (empty input: the ``previous`` sub-question
asked about and its input ``names``), ``answers`` (parsed, with ``p`` and ``count``), ``kept``
(passed the filter), ``linked`` / ``unlinked`` (what each kept string became;
an unlinked one with its closest KG names and scores, also listed in the
summary: an answer that does not link never vanishes silently), ``merged`` (entity, ``p``, merged-in score, value after
the merge), ``samples``, ``refusals``, ``tokens``, ``summary`` (one line);
key ``"merged"``: per merged entity its ``p``, the score merged in, the KG
value before and the value after; key ``"check"`` (with ``answer_check``):
``question``, ``entities`` (per checked entity: ``entity``, ``id``, ``p_yes``
(None when no vote was valid), ``yes``, ``votes``, ``samples``, ``value``
(before), ``after``, ``penalised``; or ``failed``: the failure's reason),
``penalised`` (names) and, when some checks failed, ``failed`` (reasons,
entities); at set-operator nodes, key ``"llm_set"``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from kgreason.errors import UserError

from engine.exec.hooks import NodeContext, NodeValue
# The settings, their defaults and checks live in llm_bridge.config (re-exported here).
from llm_bridge.config import CONFIDENCE_MODES, MERGE_RULES, MODES, RELATION_QUESTION_MODES, LGOTSettings
from llm_bridge.linking import EntityLinker
from llm_bridge.nested import nest
from llm_bridge.parse import Confidence, extract_entities, logprob_confidence, parse_yes_no, sample_confidence
from llm_bridge.prompts import answer_check_messages, fill_question, projection_messages, projection_response_format
from llm_bridge.relations import RelationQuestions

if TYPE_CHECKING:  # pragma: no cover
    from kge.artifact import Artifact

__all__ = [
    "MODES",
    "MERGE_RULES",
    "CONFIDENCE_MODES",
    "RELATION_QUESTION_MODES",
    "LGOTSettings",
    "LLMSet",
    "LGOTRow",
    "likelihood_filter",
    "combine_sets",
    "LGOTHook",
]

_TOL = 1e-9  # a ratio this close to theta counts as equal to it (kept)


# ------------------------------------------------------------------------------ pure functions
def likelihood_filter(confidences: Sequence[Confidence], theta: float) -> tuple[list[Confidence], list[Confidence]]:
    """Split answers into ``(kept, rejected)``: kept iff ``p / p_max >= theta`` (equal ratios kept).

    Answers with ``p = 0`` are always rejected; order is preserved.
    """
    p_max = max((c.p for c in confidences), default=0.0)
    kept, rejected = [], []
    for c in confidences:
        (kept if c.p > 0 and p_max > 0 and c.p / p_max >= theta - _TOL else rejected).append(c)
    return kept, rejected


@dataclass(frozen=True)
class LLMSet:
    """One row's LLM answer set at a node: ``scores`` entity id -> p; ``negated``: the set's complement."""

    scores: Mapping[int, float]
    negated: bool = False

    def to_json(self, names: Sequence[str], limit: int = 20) -> dict[str, Any]:
        top = sorted(self.scores.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        d: dict[str, Any] = {"entities": [{"entity": names[e], "id": int(e), "p": round(float(p), 6)} for e, p in top],
                             "size": len(self.scores)}
        if self.negated:
            d["negated"] = True
        return d


def combine_sets(op: str, children: Sequence[LLMSet | None]) -> tuple[LLMSet | None, str | None]:
    """LGOT's set operators on LLM answer sets: ``(set, None)`` or ``(None, why undefined)``.

    ``op``: ``"i"`` (intersection of the positive sets, p = min, minus the
    negated sets), ``"u"`` (union, p = max; undefined with a negated child) or
    ``"n"`` (the child with its sign flipped).
    """
    if any(c is None for c in children):
        return None, "a sub-query has no LLM answer set"
    kids = [c for c in children if c is not None]
    if op == "n":
        return LLMSet(dict(kids[0].scores), not kids[0].negated), None
    pos = [c for c in kids if not c.negated]
    neg = [c for c in kids if c.negated]
    if op == "u":
        if neg:
            return None, "union with a negated sub-query"
        out: dict[int, float] = {}
        for c in pos:
            for e, p in c.scores.items():
                out[e] = max(out.get(e, 0.0), p)
        return LLMSet(out), None
    if op == "i":
        if not pos:
            return None, "intersection of negated sub-queries only"
        common = set(pos[0].scores)
        for c in pos[1:]:
            common &= set(c.scores)
        for c in neg:
            common -= set(c.scores)
        return LLMSet({e: min(c.scores[e] for c in pos) for e in sorted(common)}), None
    raise ValueError(f"not a set operator: {op!r}")


@dataclass(frozen=True)
class LGOTRow:
    """What the hook annotates each row of a node's value with (key: the hook's ``name``, ``"llm"``).

    ``llm_set``: the row's LLM answer set at the node (``None``: undefined); ``asked``:
    ``(question template, input names)`` the node's sub-question was asked with (a
    projection), or the one an intersection stands for; ``None`` when there is none.
    The parent node's call reads its children's rows from ``ctx.inputs[k]``
    (:meth:`~engine.exec.hooks.NodeValue.annotation`): LGOT's set operators and nested
    questions need nothing else, so nothing is kept between calls.
    """

    llm_set: LLMSet | None
    asked: tuple[str, list[str]] | None = None


def _unlinked_text(link: Any) -> str:
    """``"text" (closest "name" 84.2)``: an unlinked answer and the KG name it came closest to."""
    near = list(getattr(link, "nearest", ()) or ())
    name, score = (near[0][0], near[0][1]) if near else (getattr(link, "closest", None), getattr(link, "score", 0.0))
    text = json.dumps(link.text, ensure_ascii=False)
    if name is None:
        return f"{text} (no close KG name)"
    return f"{text} (closest {json.dumps(name, ensure_ascii=False)} {float(score):.1f})"


# ------------------------------------------------------------------------------------ the hook
class _Prefer:
    """``prefer.get(id, default)`` over a row of KG values (linking tie-breaks), without building a dict."""

    def __init__(self, row: np.ndarray) -> None:
        self._row = row

    def get(self, i: int, default: float = 0.0) -> float:
        return float(self._row[i]) if 0 <= i < len(self._row) else default


@dataclass
class HookStats:
    """Counters over the hook's life: prompts asked, rows that fell back (``failed_rows``: the call failed;
    ``unusable_rows``: no sample of the reply could be read), LLM entities merged;
    ``nested``: projection rows asked with an empty input (a nested sub-question), ``skipped``:
    rows with an empty input and no sub-question to nest (nothing asked);
    answer checks asked (``checks``, per row and entity; ``unique_checks``: distinct prompts among them),
    ``failed_checks`` (entities whose check failed) and ``penalised`` (entities scaled)."""

    nodes: int = 0
    prompts: int = 0
    unique_prompts: int = 0
    failed_rows: int = 0
    unusable_rows: int = 0
    answers: int = 0
    nested: int = 0
    skipped: int = 0
    kept: int = 0
    linked: int = 0
    unlinked: int = 0
    merged: int = 0
    checks: int = 0
    unique_checks: int = 0
    failed_checks: int = 0
    penalised: int = 0
    relation_questions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class LGOTHook:
    """The executor hook of the LLM bridge (register with ``Executor(..., hooks=[hook])``; see the module doc).

    Args:
        client: an :class:`~llm_bridge.client.LLMClient` (``complete_many_sync``).
        artifact: the executor's artifact (names, relations, sample pairs); default:
            bound on the first node the hook sees.
        settings: :class:`LGOTSettings`.
        linker: an :class:`~llm_bridge.linking.EntityLinker` (default: one over
            the artifact's names and its names file, at ``settings.link_threshold``).
        questions: :class:`~llm_bridge.relations.RelationQuestions` (default:
            the artifact's, with the model's sidecar).
        questions_dir: root of the relation-question sidecars (default: the user cache dir).
        names_file: aliases for the default linker (see :func:`~llm_bridge.linking.load_names_file`).
    """

    name = "llm"

    def __init__(self, *, client: Any, artifact: "Artifact | None" = None, settings: LGOTSettings | None = None,
                 linker: EntityLinker | None = None, questions: RelationQuestions | None = None,
                 questions_dir: str | None = None, names_file: str | None = None) -> None:
        self.client = client
        self.settings = settings or LGOTSettings()
        self.model = getattr(getattr(client, "config", None), "model", None)
        self.questions_dir = questions_dir
        self.names_file = names_file
        self.artifact: "Artifact | None" = None
        self.linker = linker
        self.questions = questions
        self.stats = HookStats()
        if artifact is not None:
            self.bind(artifact)

    def bind(self, artifact: "Artifact") -> None:
        """Attach the hook to ``artifact`` (done on the first node when it was built without one)."""
        if self.artifact is not None:
            if artifact is not self.artifact:
                raise UserError("an LGOT hook serves one artifact; build another hook for another artifact")
            return
        self.artifact = artifact
        if self.linker is None:
            self.linker = EntityLinker.from_artifact(artifact, names_file=self.names_file,
                                                     threshold=self.settings.link_threshold)
        if self.questions is None:
            self.questions = RelationQuestions.for_artifact(
                artifact, model=self.model, cache_dir=self.questions_dir,
                use_cache=bool(getattr(getattr(self.client, "config", None), "use_cache", True)))

    # ------------------------------------------------------------------------------ dispatch
    def __call__(self, ctx: NodeContext, value: NodeValue) -> NodeValue | None:
        self.bind(ctx.artifact)
        self.stats.nodes += 1
        asked: list[tuple[str, list[str]] | None] = [None] * ctx.rows
        if ctx.op == "e":
            sets: list[LLMSet | None] = [LLMSet({int(a): 1.0}) for a in ctx.anchors or ()]
            out = None
        elif ctx.op in ("p", "np"):
            out, sets, asked = self._projection(ctx, value)
        elif ctx.op in ("i", "u", "n"):
            out, sets = self._set_op(ctx, value)
            if ctx.op == "i":
                asked = self._intersection_question(ctx)
        else:  # a node type registered beyond LGOT's operators: its LLM set is undefined
            out, sets = None, [None] * ctx.rows
        # The rows' sets and questions travel with the node's value to the parent's call.
        return (value if out is None else out).annotate(
            self.name, [LGOTRow(st, a) for st, a in zip(sets, asked)])

    def _child_rows(self, ctx: NodeContext, k: int) -> tuple[LGOTRow | None, ...]:
        """Child ``k``'s per-row :class:`LGOTRow` (``None`` per row when this hook did not annotate it)."""
        got = ctx.inputs[k].annotation(self.name)
        return (None,) * ctx.rows if got is None else got

    def _child_asked(self, ctx: NodeContext, k: int) -> list[tuple[str, list[str]] | None]:
        return [None if r is None else r.asked for r in self._child_rows(ctx, k)]

    def _intersection_question(self, ctx: NodeContext) -> list[tuple[str, list[str]] | None]:
        """Per row, the sub-question an intersection stands for: that of its one positive child with a
        sub-question (the others, e.g. MetaQA's ``(n topic)`` exclusion, only filter); else None."""
        kids = ctx.node.children()
        positive = [k for k, c in enumerate(kids) if getattr(c, "head", None) in ("p", "i")]
        per_kid = {k: self._child_asked(ctx, k) for k in positive}
        out: list[tuple[str, list[str]] | None] = []
        for row in range(ctx.rows):
            found = [per_kid[k][row] for k in positive if per_kid[k][row] is not None]
            out.append(found[0] if len(found) == 1 else None)
        return out

    def _child_sets(self, ctx: NodeContext, k: int) -> list[LLMSet | None]:
        return [None if r is None else r.llm_set for r in self._child_rows(ctx, k)]

    # ---------------------------------------------------------------------------- projection
    def _inputs(self, ctx: NodeContext) -> tuple[list[list[int]], list[int]]:
        """Per row, the top entities of the input node's value, best first, ties by id: value > 0 and
        ``value >= input_ratio * best`` (ratios within 1e-9 of ``input_ratio`` kept).

        Why the ratio: the calibrated matrices give a long tail of near-zero predictions (the
        same popular entities for many rows); padding the prompt with them makes the LLM answer
        about them as confidently as about the real inputs, and those answers are merged at
        full weight (benchmarks/results/lgot/metaqa.md, "Diagnosis").  Also returns, per row, how
        many of the top ``inputs`` entities with value > 0 the ratio left out (the trace shows it).
        """
        x = ctx.inputs[0].values
        k = min(self.settings.inputs, x.shape[1])
        vals, ids = torch.sort(x, dim=1, descending=True, stable=True)
        vals, ids = vals[:, :k].cpu().numpy(), ids[:, :k].cpu().numpy()
        ratio = self.settings.input_ratio
        out, dropped = [], []
        for vr, ir in zip(vals, ids):
            best = float(vr[0]) if len(vr) else 0.0
            out.append([int(i) for v, i in zip(vr, ir) if v > 0 and float(v) >= (ratio - _TOL) * best])
            dropped.append(int(np.count_nonzero(vr > 0)) - len(out[-1]))
        return out, dropped

    def _ask(self, ctx: NodeContext) -> tuple[list[list[int]], list[str | None], list[Any],
                                              list[tuple[str, list[str]] | None], list[str | None], list[int]]:
        """Build every row's prompt and send them in one ``complete_many`` call (identical ones asked once).

        Returns per row: the input entity ids, the filled sub-question (None: nothing
        asked), the LLM result, ``(template, names)`` the question was asked with, and for
        a row whose input is empty the previous sub-question it nests (else None), and the
        number of top entities ``input_ratio`` left out of the prompt.
        """
        s = self.settings
        names = self.artifact.entities
        inputs, below_ratio = self._inputs(ctx)
        rels = [ctx.relation_name(r) for r in range(ctx.rows)]
        previous = self._child_asked(ctx, 0)
        # An empty input is asked about the previous sub-question (LGOT's chained prompts): the KG
        # having nothing is exactly when the LLM is needed.  No previous question: nothing to ask.
        askable = [bool(inp) or prev is not None for inp, prev in zip(inputs, previous)]
        if s.relation_questions == "llm":
            todo = sorted({r for r, ok in zip(rels, askable) if ok and r is not None})
            got = self.questions.ensure(todo, artifact=self.artifact, client=self.client, model=self.model,
                                        cache_dir=self.questions_dir)
            self.stats.relation_questions.update(got)
        questions: list[str | None] = []
        prompts: list[Any] = []
        asked: list[tuple[str, list[str]] | None] = []
        nested_from: list[str | None] = []
        for rel, inp, prev, ok in zip(rels, inputs, previous, askable):
            if not ok:
                questions.append(None)
                prompts.append(None)
                asked.append(None)
                nested_from.append(None)
                continue
            template = self.questions.template(rel)
            if inp:
                in_names = [names[i] for i in inp]
                nested_from.append(None)
            else:
                assert prev is not None
                inner, in_names = prev
                nested_from.append(fill_question(inner, in_names))
                template = nest(template, inner)
            asked.append((template, in_names))
            questions.append(fill_question(template, in_names))
            prompts.append(projection_messages(template, in_names, max_answers=s.max_answers))
        # Every row's prompt goes to the client as it is: the client asks identical prompts once (the
        # bridge's one de-duplication layer), so rows sharing a sub-question share one request.
        batch = [p for p in prompts if p is not None]
        fmt = projection_response_format(getattr(getattr(self.client, "config", None), "json_output", "off"),
                                         max_answers=s.max_answers)
        if not batch:
            results = []
        elif fmt is None:
            results = self.client.complete_many_sync(batch)
        else:
            results = self.client.complete_many_sync(batch, response_format=fmt)
        self.stats.prompts += len(batch)
        self.stats.unique_prompts += _distinct(batch)
        answers = iter(results)
        per_row = [None if p is None else next(answers) for p in prompts]
        return inputs, questions, per_row, asked, nested_from, below_ratio

    def _confidence(self, res: Any) -> tuple[list[Confidence], int, list[str]]:
        """(answers with p(e), refusals, the rule each reply was read by, ``"unusable"`` for a reply with
        nothing that reads as names: :attr:`~llm_bridge.parse.ParsedReply.unusable`)."""
        parsed = [extract_entities(t, limit=self.settings.max_answers) for t in res.texts]
        refusals = sum(p.refused for p in parsed)
        n = max(int(getattr(res, "n_requested", 0) or 0), len(parsed))
        mode = self.settings.confidence
        if mode != "samples" and getattr(res, "has_logprobs", False):
            samples = [(t, [(tok.token, tok.logprob) for tok in (lp or ())], p.entities)
                       for t, lp, p in zip(res.texts, res.logprobs, parsed)]
            conf = logprob_confidence(samples, mode=mode.split("-", 1)[1], n=n)
        else:
            conf = sample_confidence([p.entities for p in parsed], n=n)
        return conf, refusals, ["unusable" if p.unusable else p.how for p in parsed]

    def _projection(self, ctx: NodeContext, value: NodeValue) -> tuple[NodeValue | None, list[LLMSet | None],
                                                                        list[tuple[str, list[str]] | None]]:
        s = self.settings
        names = self.artifact.entities
        negated = ctx.op == "np"
        inputs, questions, results, asked, nested_from, below_ratio = self._ask(ctx)
        kg_rows = value.values.detach().cpu().numpy()
        sets: list[LLMSet | None] = []
        updates: list[tuple[int, dict[int, float], dict[int, dict[str, Any]]]] = []
        failed: dict[int, str] = {}  # row -> its warning (a failed check adds to it)
        for row in range(ctx.rows):
            res = results[row]
            if questions[row] is None:
                self.stats.skipped += 1
                ctx.note(row, "llm", {"inputs": [], "skipped": "the input node has no entity with value > 0 "
                                                              "and no sub-question to nest"})
                sets.append(LLMSet({}, negated))
                if s.mode == "llm-only":
                    updates.append((row, {}, {}))  # nothing in, nothing out
                continue
            info: dict[str, Any] = {"question": questions[row], "inputs": [names[i] for i in inputs[row]]}
            if below_ratio[row]:
                info["inputs_below_ratio"] = below_ratio[row]
            if nested_from[row] is not None:
                self.stats.nested += 1
                info["nested"] = {"previous": nested_from[row], "names": asked[row][1],  # type: ignore[index]
                                  "why": "the input node has no entity with value > 0"}
            if not getattr(res, "ok", False):
                self.stats.failed_rows += 1
                reason = getattr(res, "reason", "unknown")
                info["failed"] = {"reason": reason, "message": getattr(res, "message", "")}
                ctx.note(row, "llm", info)
                failed[row] = f"LLM call failed ({reason}); this row is KG-only"
                ctx.note(row, "warning", failed[row])
                sets.append(None)
                continue
            try:
                conf, refusals, hows = self._confidence(res)
                unusable = bool(hows) and all(h == "unusable" for h in hows)
                why = "no sample could be read as entity names" if unusable else ""
            except Exception as exc:  # noqa: BLE001  a reply the parsers cannot read must not end the run
                why = f"{type(exc).__name__} while reading it"
            if why:
                # Live or replayed from the cache, the same reply degrades the same way: the row keeps its
                # KG value, its LLM set is undefined, and the trace says why.
                self.stats.unusable_rows += 1
                texts = [str(t) for t in getattr(res, "texts", ())]
                info["unusable"] = {"why": why, "samples": len(texts),
                                    "first": texts[0][:120] if texts else ""}
                ctx.note(row, "llm", info)
                failed[row] = f"LLM reply unusable ({why}); this row is KG-only"
                ctx.note(row, "warning", failed[row])
                sets.append(None)
                continue
            kept, _ = likelihood_filter(conf, s.theta)
            links = self.linker.link_many([c.text for c in kept], prefer=_Prefer(kg_rows[row]),
                                          relation=None if ctx.relations is None else ctx.relations[row])
            best: dict[int, float] = {}
            detail: dict[int, dict[str, Any]] = {}
            for c, link in zip(kept, links):
                if link.entity is not None and c.p > best.get(link.entity, -1.0):
                    best[link.entity] = c.p
                    detail[link.entity] = {"p": round(c.p, 6), "text": c.text, "link": link.method,
                                           "link_score": round(link.score, 2)}
            info.update(
                answers=[c.to_json() for c in conf],
                kept=[c.text for c in kept],
                linked=[l.to_json() for l in links if l.linked],
                unlinked=[l.to_json() for l in links if not l.linked],
                # No "cached" flag: a replay from the cache must print exactly what the live run printed.
                samples=len(res.texts), refusals=refusals,
                tokens=int(getattr(res, "prompt_tokens", 0)) + int(getattr(res, "completion_tokens", 0)),
            )
            lost = [l for l in links if not l.linked]
            info["summary"] = (f"{'no input (nested question)' if nested_from[row] is not None else f'{len(inputs[row])} input(s)'}; "
                               f"{len(conf)} answer(s) from {len(res.texts)} sample(s), "
                               f"{len(kept)} kept, {sum(l.linked for l in links)} linked, {len(lost)} unlinked"
                               + (" (" + ", ".join(_unlinked_text(l) for l in lost[:5])
                                  + (f", +{len(lost) - 5}" if len(lost) > 5 else "") + ")" if lost else ""))
            self.stats.answers += len(conf)
            self.stats.kept += len(kept)
            self.stats.linked += sum(l.linked for l in links)
            self.stats.unlinked += sum(not l.linked for l in links)
            ctx.note(row, "llm", info)
            sets.append(LLMSet(best, negated))
            updates.append((row, best, detail))
        if negated:
            if s.mode == "llm-only":
                return self._negated_only(ctx, value, updates), sets, asked
            for row, best, _ in updates:
                if best:
                    ctx.note(row, "llm_set", {**sets[row].to_json(names),  # type: ignore[union-attr]
                                              "merged": "no (a negated set acts at the enclosing intersection)"})
            return None, sets, asked
        out = self._write(ctx, value, updates)
        if s.answer_check > 0:
            out = self._check(ctx, value if out is None else out, questions, failed) or out
        return out, sets, asked

    # ---------------------------------------------------------------------------- answer check
    def _check(self, ctx: NodeContext, value: NodeValue, questions: Sequence[str | None],
               warnings: Mapping[int, str]) -> NodeValue | None:
        """LGOT §3.3.1: ask whether each row's top-K entities answer its sub-question; scale the rejected."""
        s = self.settings
        names = self.artifact.entities
        k = min(s.answer_check, value.values.shape[1])
        vals, ids = torch.sort(value.values, dim=1, descending=True, stable=True)
        vals, ids = vals[:, :k].cpu().numpy(), ids[:, :k].cpu().numpy()
        todo: list[tuple[int, list[tuple[int, float]]]] = []
        batch: list[Any] = []
        slots: dict[tuple[int, int], int] = {}  # (row, entity) -> index into batch
        for row in range(ctx.rows):
            q = questions[row]
            cand = [(int(e), float(v)) for v, e in zip(vals[row], ids[row]) if v > 0]
            if q is None or not cand:
                continue
            todo.append((row, cand))
            for e, _ in cand:
                slots[(row, e)] = len(batch)
                batch.append(answer_check_messages(q, names[e]))  # identical checks: asked once by the client
        if not batch:
            return None
        results = self.client.complete_many_sync(batch)
        self.stats.checks += len(slots)
        self.stats.unique_checks += _distinct(batch)
        edit = value.edit()
        touched = False
        for row, cand in todo:
            recs: list[dict[str, Any]] = []
            bad: list[dict[str, Any]] = []
            penal: list[int] = []
            for e, v in cand:
                res = results[slots[(row, e)]]
                rec: dict[str, Any] = {"entity": names[e], "id": e}
                if not getattr(res, "ok", False):
                    rec["failed"] = getattr(res, "reason", "unknown")
                    bad.append(rec)
                    recs.append(rec)
                    continue
                votes = [parse_yes_no(t) for t in res.texts]
                valid = [x for x in votes if x is not None]
                yes = sum(valid)
                p_yes = yes / len(valid) if valid else None
                reject = p_yes is not None and p_yes < 0.5
                after = float(np.float32(v * s.check_penalty)) if reject else v  # what the edit writes
                rec.update(p_yes=None if p_yes is None else round(p_yes, 6), yes=yes, votes=len(valid),
                           samples=len(res.texts), value=round(v, 6), after=round(after, 6), penalised=reject)
                if reject:
                    penal.append(e)
                recs.append(rec)
            note: dict[str, Any] = {"question": questions[row], "entities": recs,
                                    "penalised": [names[e] for e in penal]}
            if bad:
                self.stats.failed_checks += len(bad)
                reasons = sorted({r["failed"] for r in bad})
                note["failed"] = {"reasons": reasons, "entities": [r["entity"] for r in bad]}
                msg = (f"answer check failed ({', '.join(reasons)}) for {len(bad)} of {len(cand)} "
                       f"entit{'y' if len(cand) == 1 else 'ies'}; their scores are unchanged")
                prev = warnings.get(row)
                ctx.note(row, "warning", msg if prev is None else f"{prev}; {msg}")
            if penal:
                edit.merge(row, penal, [s.check_penalty] * len(penal), source="llm", merge="scale",
                           detail=[{"check": "rejected", "p_yes": next(r["p_yes"] for r in recs if r["id"] == e)}
                                   for e in penal])
                touched = True
                self.stats.penalised += len(penal)
            ctx.note(row, "check", note)
        if not touched:
            return None
        return edit.done()

    # ------------------------------------------------------------------------------ writing
    def _write(self, ctx: NodeContext, value: NodeValue,
               updates: Sequence[tuple[int, Mapping[int, float], Mapping[int, Mapping[str, Any]]]],
               set_rule: str | None = None) -> NodeValue | None:
        """Merge (LGOT) or replace (LLM-only) each updated row; note the merged values."""
        s = self.settings
        names = self.artifact.entities
        if not updates:
            return None
        edit = value.edit()
        touched = False
        rule = s.merge if set_rule is None else set_rule
        for row, best, detail in updates:
            ids = sorted(best, key=lambda e: (-best[e], e))
            if s.mode == "llm-only":
                edit.replace_row(row, ids, [best[e] for e in ids], source="llm",
                                 detail=[dict(detail.get(e, {"p": round(best[e], 6)})) for e in ids])
                touched = True
            elif ids:
                edit.merge(row, ids, [s.alpha * best[e] for e in ids], source="llm", merge=rule,
                           detail=[dict(detail.get(e, {"p": round(best[e], 6)})) for e in ids])
                touched = True
        if not touched:
            return None
        out = edit.done()
        for row, best, _ in updates:
            ids = sorted(best, key=lambda e: (-best[e], e))
            if not ids:
                continue
            after = out.values[row, ids].tolist()
            before = value.values[row, ids].tolist()
            ctx.note(row, "merged", [
                {"entity": names[e], "id": int(e), "p": round(best[e], 6),
                 "score": round(best[e] if s.mode == "llm-only" else s.alpha * best[e], 6),
                 "kg": round(float(b), 6), "value": round(float(a), 6)}
                for e, b, a in zip(ids, before, after)])
            self.stats.merged += len(ids)
        return out

    def _negated_only(self, ctx: NodeContext, value: NodeValue,
                      updates: Sequence[tuple[int, Mapping[int, float], Mapping[int, Mapping[str, Any]]]]) -> NodeValue | None:
        """LLM-only ``np`` rows: 1 everywhere except ``1 - p(e)`` on the LLM's set (the KG is discarded)."""
        if not updates:
            return None
        # replace_row(base=1.0) records evidence for the whole row (unlisted entities score 1
        # from the LLM-only negation too), so every answer's recompute reproduces its score.
        edit = value.edit()
        for row, best, detail in updates:
            ids = sorted(best)
            edit.replace_row(row, ids, [1.0 - best[e] for e in ids], source="llm", base=1.0,
                             detail=[{**detail.get(e, {}), "negated": True} for e in ids])
        return edit.done()

    # --------------------------------------------------------------------------- set operators
    def _set_op(self, ctx: NodeContext, value: NodeValue) -> tuple[NodeValue | None, list[LLMSet | None]]:
        names = self.artifact.entities
        kids = [self._child_sets(ctx, k) for k in range(len(ctx.inputs))]
        sets: list[LLMSet | None] = []
        updates = []
        for row in range(ctx.rows):
            st, why = combine_sets(ctx.op, [k[row] for k in kids])
            sets.append(st)
            if st is None:
                ctx.note(row, "llm_set", {"op": ctx.op, "undefined": why})
                continue
            ctx.note(row, "llm_set", {"op": ctx.op, **st.to_json(names)})
            if ctx.op == "n" or st.negated:
                continue
            if self.settings.mode == "llm-only":
                updates.append((row, dict(st.scores), {}))
                continue
            # LGOT: the children's merges already reach this node through ops; merge the combined set only
            # where it raises the value (by max, whatever the rule: adding again would count the LLM twice).
            cur = value.values[row].detach().cpu().numpy()
            a = self.settings.alpha
            raise_ = {e: p for e, p in st.scores.items() if np.float32(a * p) > cur[e]}
            if raise_:
                updates.append((row, raise_, {}))
        if ctx.op == "n":
            return None, sets  # ops already computed 1 - child; a negated set acts at the intersection above
        return self._write(ctx, value, updates, set_rule="max"), sets


def _distinct(prompts: Sequence[Any]) -> int:
    """How many different prompts ``prompts`` holds: the requests a de-duplicating client makes (for the stats)."""
    return len({json.dumps(p, sort_keys=True, ensure_ascii=False) for p in prompts})
