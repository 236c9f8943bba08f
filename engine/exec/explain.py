"""Result types of the executor: explanations (with provenance), answers, query results.

An :class:`Explanation` mirrors the query tree at one entity: for a projection
the witness source entity (the argmax) and the atom's truth value
``M_r[i, j]``; for a node where a hook merged a score, the
:class:`~engine.exec.hooks.Evidence` and its merge rule.
:meth:`Explanation.recompute` rebuilds the score from atoms and evidence alone
(float64), following the merge rule that produced it:

* no evidence:            the KG part (``child * truth`` for ``p``/``np``, the t-norm/t-conorm
  of the children for ``i``/``u``, ``1 - child`` for ``n``, the anchor atom for ``e``);
* evidence ``"max"``:     ``max(kg, evidence.score)``;
* evidence ``"add"``:     ``min(1, kg + evidence.score)``;
* evidence ``"replace"``: ``evidence.score`` (no KG part);
* evidence ``"scale"``:   ``kg * evidence.score`` (a factor: the LLM answer check's penalty).

The KG part of each op is its ``recompute`` facet in the op table
(:mod:`engine.lang.optable`; the built-ins' are registered at the bottom of this
module), so a registered node type's explanations recompute too.

Provenance (``Explanation.source``, ``Answer.provenance``) is the set of
sources that contributed a positive part to the score, anywhere in the
explanation tree: ``"kg"`` (KG atoms only), ``"llm"`` (hook evidence only),
``"both"``, or ``"a+b"`` for other sources (see
:func:`~engine.exec.hooks.provenance_label`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from engine.exec.hooks import Evidence, provenance_label
from engine.lang import optable
from engine.lang.query import Anchor, Complement, Intersection, NegatedProjection, Projection, Union

if TYPE_CHECKING:  # pragma: no cover
    from engine.exec.trace import Trace

__all__ = ["Explanation", "Answer", "QueryResult", "combine_scores"]

_NONE: frozenset[str] = frozenset()
_KG: frozenset[str] = frozenset({"kg"})


def _union(sets: list[frozenset[str]]) -> frozenset[str]:
    if all(s <= _KG for s in sets):  # the common KG-only case: no new set
        return _KG if any(sets) else _NONE
    return _NONE.union(*sets)


def combine_scores(op: str, values: Sequence[float], tnorm: str) -> float:
    """The scalar version of ``intersect``/``union`` (used to recompute explained scores)."""
    if op == "i":
        if tnorm == "godel":
            return float(min(values))
        out = 1.0
        for v in values:
            out *= v
        return out
    if op == "u":
        if tnorm == "godel":
            return float(max(values))
        out = 0.0
        for v in values:  # probabilistic sum a + b - ab, folded left to right
            out = out + v - out * v
        return out
    raise ValueError(op)


@dataclass(frozen=True)
class Explanation:
    """Why a sub-query holds for ``entity``: a tree mirroring the query.

    ``op`` is ``"e"`` (anchor), ``"p"``, ``"np"``, ``"i"``, ``"u"`` or ``"n"``;
    ``score`` the sub-query's value at ``entity`` (as computed by the executor,
    after hooks).  For ``p``/``np``: ``children[0]`` explains the source entity
    ``i`` (the argmax), ``weight = M_r[i, entity]`` and ``truth`` is the atom's
    truth value (``weight`` for ``p``, ``1 - min(1, neg_scale * weight)`` for
    ``np``); for ``e``, ``truth`` is the anchor atom (1 at the anchor, 0
    elsewhere; ``None`` = take ``score``).  A sub-query whose KG part is 0 has no
    witness (no children).  ``evidence`` is what a hook merged in at this node
    and entity (``None``: nothing); ``source`` the provenance of the score
    (computed from the tree when not given).
    """

    op: str
    entity: int
    entity_name: str
    score: float
    relation: int | None = None
    relation_name: str | None = None
    weight: float | None = None
    truth: float | None = None
    neg_scale: float | None = None
    children: tuple["Explanation", ...] = ()
    evidence: Evidence | None = None
    source: str | None = field(default=None)
    # The contributing sources, computed once from the children's (built bottom-up).
    _sources: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        srcs = self._kg_sources()
        if self.evidence is not None:
            srcs = srcs | self.evidence.sources()
        object.__setattr__(self, "_sources", srcs)
        if self.source is None:
            object.__setattr__(self, "source", provenance_label(srcs))

    # ---------------------------------------------------------------------------- scores
    def kg_score(self, tnorm: str) -> float:
        """The KG part of the score (before this node's evidence), recomputed from the children (float64):
        the op's ``recompute`` facet (:mod:`engine.lang.optable`)."""
        return optable.by_op(self.op).need("recompute", "recompute explained scores")(self, tnorm)

    def recompute(self, tnorm: str) -> float:
        """The score recomputed from the atoms' truth values and the evidence alone (float64)."""
        ev = self.evidence
        if ev is None:
            return self.kg_score(tnorm)
        if ev.discards_kg():
            return ev.merged(0.0)
        return ev.merged(self.kg_score(tnorm))

    def _kg_sources(self) -> frozenset[str]:
        """Sources behind the KG part (empty when the KG part is 0 or only the anchor)."""
        if self.op == "e" or (self.evidence is not None and self.evidence.discards_kg()):
            return _NONE
        if self.op in ("p", "np"):
            if not self.children:
                return _NONE
            inner = self.children[0]._sources
            return _KG if inner <= _KG else _KG | inner
        if self.op == "i":
            if not self.children or any(c.score <= 0 for c in self.children):
                return _NONE
            return _union([c._sources for c in self.children])
        if self.op == "u":
            return _union([c._sources for c in self.children if c.score > 0])
        if self.op == "n":
            if not self.children or self.children[0].score >= 1:
                return _NONE
            inner = self.children[0]
            # 1 - 0: the closed-world absence of the inner set is a fact of the KG
            return inner._sources if inner.score > 0 else _KG
        # A registered op: the sources of the children that hold (score > 0), as for a union.
        return _union([c._sources for c in self.children if c.score > 0])

    def sources(self) -> frozenset[str]:
        """Every source contributing a positive part to this score (``"kg"`` for KG atoms)."""
        return self._sources

    def atoms(self) -> list["Explanation"]:
        """The relation atoms (``p``/``np`` nodes with a witness), in pre-order."""
        out = [self] if self.op in ("p", "np") and self.children else []
        for c in self.children:
            out.extend(c.atoms())
        return out

    def evidences(self) -> list["Explanation"]:
        """The nodes with hook evidence, in pre-order."""
        out = [self] if self.evidence is not None else []
        for c in self.children:
            out.extend(c.evidences())
        return out

    # -------------------------------------------------------------------------- rendering
    def _tag(self) -> str:
        """``⟨llm 0.4000 max⟩`` for the evidence chain of this node ('' when none)."""
        if self.evidence is None:
            return ""
        return "⟨" + ", ".join(f"{e.source} {e.score:.4f} {e.merge}" for e in self.evidence.chain()) + "⟩"

    def _arrow(self) -> str:
        if self.op == "p":
            return f"—{self.relation_name} ({self.truth:.3f})→"
        if self.weight == 0:
            return f"—not {self.relation_name} (no edge: {self.truth:.3f})→"
        return f"—not {self.relation_name} (1−min(1, {self.neg_scale:g}×{self.weight:.3f}) = {self.truth:.3f})→"

    def _chain(self) -> tuple[list[str], str]:
        """(lines explaining the chain's start, the chain text ending at this entity)."""
        tag = self._tag()
        if self.op == "e":
            return [], self.entity_name + (f" {tag}" if tag else "")
        if self.op in ("p", "np"):
            if not self.children:
                if tag:  # a hook's answer to this sub-question, no KG witness
                    word = "" if self.op == "p" else "not "
                    return [], f"{tag} —{word}{self.relation_name}→ {self.entity_name}"
                kind = "path" if self.op == "p" else "source"
                return [f"(no {kind} reaches {self.entity_name} via {self.relation_name})"], ""
            pre, chain = self.children[0]._chain()
            return pre, f"{chain} {self._arrow()} {self.entity_name}" + (f" {tag}" if tag else "")
        return self._block(), self.entity_name

    def _block(self) -> list[str]:
        tag = f" {self._tag()}" if self.evidence is not None else ""
        if self.op != "n":  # i, u, and registered ops over children at the same entity
            if not self.children:
                return [f"{self.entity_name} ({self.score:.4f}){tag}"]
            word, bullet = _BLOCK_WORDS.get(self.op, (f"{self.op} of", "· "))
            lines = [f"{self.entity_name} ({self.score:.4f}) satisfies {word}:{tag}"]
            for c in self.children:
                lines.extend("  " + bullet + l if k == 0 else "    " + l for k, l in enumerate(c.lines()))
            return lines
        if self.op == "n":
            if not self.children:
                return [f"{self.entity_name} ({self.score:.4f}){tag}"]
            inner = self.children[0]
            lines = [f"{self.entity_name} ({self.score:.4f}) = 1 − {inner.score:.4f}, not in:{tag}"]
            if inner.score > 0:
                lines.extend("    " + l for l in inner.lines())
            else:
                lines.append(f"    (nothing: {self.entity_name} has value 0 there)")
            return lines
        raise ValueError(self.op)

    def lines(self) -> list[str]:
        """Readable chains, e.g. ``Tom Hanks —starred_actors^-1 (0.98)→ Cast Away —directed_by (0.95)→ Robert Zemeckis (0.931)``.

        Evidence a hook merged in shows as ``⟨source score merge⟩`` after the entity
        it concerns (``⟨llm 0.4000 max⟩ —treats→ C`` when there is no KG witness).
        """
        if self.op not in ("e", "p", "np"):
            return self._block()
        pre, chain = self._chain()
        if not chain:
            return pre
        return pre + [f"{chain} ({self.score:.4f})"]

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op, "entity": self.entity_name, "id": self.entity, "score": self.score,
                             "source": self.source}
        if self.op in ("p", "np"):
            d.update(relation=self.relation_name, relation_id=self.relation, weight=self.weight, truth=self.truth)
            if self.op == "np":
                d["neg_scale"] = self.neg_scale
        if self.evidence is not None:
            d["evidence"] = self.evidence.to_json()
        if self.children:
            d["children"] = [c.to_json() for c in self.children]
        return d


_BLOCK_WORDS = {"i": ("all of", "∧ "), "u": ("any of", "∨ ")}


# ------------------------------------------------------------------- recompute facets (op table)
def _kg_anchor(e: Explanation, tnorm: str) -> float:
    return e.score if e.truth is None else float(e.truth)  # the anchor atom: 1 at the anchor entity, 0 elsewhere


def _kg_projection(e: Explanation, tnorm: str) -> float:
    return e.children[0].recompute(tnorm) * float(e.truth) if e.children else 0.0  # type: ignore[arg-type]


def _kg_combination(e: Explanation, tnorm: str) -> float:
    # no children: the KG part was discarded (a replace)
    return combine_scores(e.op, [c.recompute(tnorm) for c in e.children], tnorm) if e.children else 0.0


def _kg_complement(e: Explanation, tnorm: str) -> float:
    return 1.0 - e.children[0].recompute(tnorm) if e.children else 0.0


optable.register(Anchor, recompute=_kg_anchor)
optable.register(Projection, recompute=_kg_projection)
optable.register(NegatedProjection, recompute=_kg_projection)
optable.register(Intersection, recompute=_kg_combination)
optable.register(Union, recompute=_kg_combination)
optable.register(Complement, recompute=_kg_complement)


@dataclass(frozen=True)
class Answer:
    """One ranked answer: entity name and id, its score, its provenance and (optionally) its explanation.

    ``provenance``: ``"kg"``, ``"llm"``, ``"both"``, ... (see the module doc).
    """

    entity: str
    id: int
    score: float
    explanation: Explanation | None = None
    provenance: str = "kg"

    def to_json(self) -> dict[str, Any]:
        expl = None
        if self.explanation is not None:
            expl = {"text": self.explanation.lines(), "tree": self.explanation.to_json()}
        return {"entity": self.entity, "id": self.id, "score": self.score, "provenance": self.provenance,
                "explanation": expl}


@dataclass(frozen=True)
class QueryResult:
    """The answers of one query (``query`` is its S-expression with names), best first, and its trace."""

    query: str
    answers: list[Answer] = field(default_factory=list)
    # Not part of equality: two results with the same answers are equal wherever they ran.
    trace: "Trace | None" = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"query": self.query, "answers": [a.to_json() for a in self.answers]}
        if self.trace is not None:
            d["trace"] = self.trace.to_json()
        return d
