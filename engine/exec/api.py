"""The Python API: load a knowledge graph once, answer queries given in any form::

    from engine import Engine
    eng = Engine.load("artifacts/umls")          # a folder, an Artifact, or None for the default KG
    res = eng.answer("(i (p affects acquired_abnormality) (p affects anatomical_abnormality))", k=5)
    best = res[0].answers[0]
    print(best.entity, best.score)
    print(best.explanation.text())
    eng.answer(("pin", ["A", "B"], ["r1", "r2", "r3"]))   # a BetaE structure with its bindings
    scores = eng.scores(["(p r e)", "(p r2 e)"])            # (2, N) float32, for other code
    res[0].answers[0].provenance, res[0].trace.to_json()    # "kg" | "llm" | "both"; per-node trace
    eng.add_hook(my_hook, ops=("p",))                       # see engine.exec.hooks

Names and explanations are the KG's (and an LLM's) text as it is; to print them on a terminal, escape them
with :func:`kgreason.text.printable` (and write JSON with :func:`kgreason.text.json_line`), as the CLIs do:
a KG name may hold ESC sequences, bidi controls or line separators.

Queries can be S-expression strings, :class:`~engine.lang.query.Node` ASTs (names or
ids), or ``(structure, anchors, relations)`` tuples; a single query or a list.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from kge.artifact import Artifact
from kgreason.errors import UserError

from engine.exec.executor import Executor, QueryResult
from engine.exec.hooks import Hook, HookHandle
from engine.lang.query import Node, describe, parse, resolve
from engine.lang.structures import check_negation, get_structure

__all__ = ["Engine", "QueryLike", "to_node", "open_artifact"]

QueryLike = Any  # str | Node | tuple[str, Sequence[str | int], Sequence[str | int]]


def _is_structure_tuple(q: Any) -> bool:
    return (isinstance(q, tuple) and len(q) == 3 and isinstance(q[0], str)
            and isinstance(q[1], (list, tuple)) and isinstance(q[2], (list, tuple)))


def to_node(query: QueryLike, *, negation: str = "qto", where: str = "") -> Node:
    """Coerce one query (expression string, AST, or ``(structure, anchors, relations)``) to an AST."""
    if isinstance(query, Node):
        return query
    if isinstance(query, str):
        return parse(query, where=where)
    if _is_structure_tuple(query):
        name, anchors, relations = query
        try:
            return get_structure(name).build(anchors, relations, negation=negation)
        except UserError as exc:
            raise UserError(f"{where}: {exc}" if where else str(exc)) from None
    raise UserError(f"{where + ': ' if where else ''}expected a query expression (str), a query AST or a "
                    f"(structure, anchors, relations) tuple, got {type(query).__name__}")


def _as_list(queries: QueryLike | Sequence[QueryLike]) -> list[QueryLike]:
    if isinstance(queries, (str, Node)) or _is_structure_tuple(queries):
        return [queries]
    return list(queries)


def open_artifact(artifact: "str | os.PathLike | Artifact | None", *, verify: bool = True) -> Artifact:
    """An artifact folder loaded (without embeddings), an :class:`Artifact` as it is, ``None``: the default KG."""
    if artifact is None:
        from engine.exec.defaults import default_artifact

        return default_artifact(verify=verify, load_embeddings=False)
    if isinstance(artifact, Artifact):
        return artifact
    from kge.sharding import check_not_shard_folder

    check_not_shard_folder(artifact)  # its meta.json is not an artifact's: say what it is instead
    return Artifact.load(artifact, verify=verify, load_embeddings=False)


class Engine:
    """A loaded knowledge graph plus an :class:`~engine.exec.executor.Executor` over it."""

    def __init__(self, artifact: Artifact, executor: Executor, *, negation: str = "qto") -> None:
        check_negation(negation)
        self.artifact = artifact
        self.executor = executor
        self.negation = negation

    @classmethod
    def load(cls, artifact: "str | os.PathLike | Artifact | None" = None, *, negation: str = "qto",
             verify: bool = True, process_group: Any = None, **executor_kwargs: Any) -> "Engine":
        """Open an artifact folder (or use an :class:`Artifact`; ``None`` = the default UMLS KG).

        ``executor_kwargs`` go to :class:`~engine.exec.executor.Executor` (``tnorm``,
        ``neg_scale``, ``device``, ``backend``, ``hooks``); ``negation`` is how BetaE
        structures given as tuples treat ``'n'`` (``"qto"`` or ``"complement"``).
        ``process_group`` (a ``torch.distributed`` group): this rank's part of a sharded run
        (:func:`engine.exec.sharded_load.load_sharded`; the artifact may be a shard folder from ``kge.shard``).
        """
        if process_group is not None:
            from engine.exec.sharded_load import load_sharded

            art, executor = load_sharded(artifact, process_group, verify=verify, open_artifact=open_artifact,
                                         **executor_kwargs)
            return cls(art, executor, negation=negation)
        art = open_artifact(artifact, verify=verify)
        return cls(art, Executor(art, **executor_kwargs), negation=negation)

    def queries(self, queries: QueryLike | Sequence[QueryLike]) -> list[Node]:
        """The queries as resolved ASTs (ids), validated against this KG."""
        items = _as_list(queries)
        out = []
        for k, q in enumerate(items):
            where = f"query {k + 1}" if len(items) > 1 else ""
            out.append(resolve(to_node(q, negation=self.negation, where=where), self.artifact, where=where))
        return out

    def answer(self, queries: QueryLike | Sequence[QueryLike], k: int = 10, explain: bool = True, *,
               trace_values: bool = False) -> list[QueryResult]:
        """Top-``k`` answers (with explanations and provenance) of each query, with its trace, in input order."""
        return self.executor.answer(self.queries(queries), k=k, explain=explain, trace_values=trace_values)

    def scores(self, queries: QueryLike | Sequence[QueryLike], *, batch_size: int = 1024,
               progress: bool = False, trace: bool = False, trace_values: bool = False):
        """Scores of all entities, float32 (len(queries), N) on the executor's device.

        With ``trace=True``: ``(scores, traces)``, one trace per query (see
        :meth:`Executor.scores <engine.exec.executor.Executor.scores>`).
        """
        return self.executor.scores(self.queries(queries), batch_size=batch_size, progress=progress, trace=trace,
                                    trace_values=trace_values)

    def add_hook(self, hook: Hook, *, ops: Sequence[str] | None = None, name: str | None = None) -> HookHandle:
        """Register a per-node hook on the executor (see :meth:`Executor.add_hook <engine.exec.executor.Executor.add_hook>`)."""
        return self.executor.add_hook(hook, ops=ops, name=name)

    def describe(self, query: QueryLike) -> str:
        """The query in words."""
        return describe(self.queries(query)[0], self.artifact)

    def retriever(self, *, encoder: Any = "minilm", encoder_kwargs: Any = None):
        """The :class:`~engine.paths.PathRetriever` over this KG's observed triples (built once per encoder)."""
        from engine.paths import PathRetriever

        key = (encoder if isinstance(encoder, str) else id(encoder), repr(sorted((encoder_kwargs or {}).items())))
        cache = self.__dict__.setdefault("_retrievers", {})
        if key not in cache:
            cache[key] = PathRetriever.from_artifact(self.artifact, encoder=encoder, encoder_kwargs=encoder_kwargs)
        return cache[key]

    def ask(self, questions: "str | Sequence[str]", *, planner: Any = None, reasoner: Any = None,
            linker: Any = None, retriever: Any = None, encoder: Any = "minilm", progress: bool = False,
            verbalizer: Any = None, exemplars: Any = None, **settings: Any):
        """Answer natural-language questions with the KARPA loop (plan → retrieve → reason).

        Without ``planner``/``reasoner`` (LLM objects, e.g. ``llm_bridge.karpa_loop.LLMPlanner``)
        retrieval is embedding-only and the answers are a vote of the best candidate paths; ``verbalizer``
        (``relation name -> question template``, e.g. ``llm_bridge.prompts.fallback_template``) makes
        it compare the question with each path read as questions (``Asker``); ``exemplars``
        (``(question, relation path)`` pairs) add a kNN vote of labelled questions (``Asker``).  ``settings``:
        :class:`~engine.exec.ask.AskSettings` fields (``k=16``, ``mode``, ``max_hops=3``, ``context``, ...).
        One :class:`~engine.exec.ask.AskResult` for a string, a list for a list.  See engine/exec/ask.py.

        The :class:`~engine.exec.ask.Asker` is kept on the engine per (retriever, settings, verbalizer,
        exemplars): its enumerated relation paths, path embeddings and kind texts serve the next call.
        """
        from engine.exec.ask import Asker, AskSettings

        batch = [questions] if isinstance(questions, str) else list(questions)
        ret = retriever if retriever is not None else self.retriever(encoder=encoder)
        asker = self._asker(Asker, ret, AskSettings(**settings), verbalizer, exemplars)
        out = asker.ask(batch, planner=planner, reasoner=reasoner, linker=linker, progress=progress)
        return out[0] if isinstance(questions, str) else out

    #: Askers kept per engine (:meth:`ask`); one more clears them (a bound for code that varies settings).
    ASKERS = 8

    def _asker(self, make: Any, retriever: Any, settings: Any, verbalizer: Any, exemplars: Any) -> Any:
        """The engine's :class:`~engine.exec.ask.Asker` for these arguments, built on first use.

        Keyed by the retriever and verbalizer objects (the Asker holds them, so their ids stay theirs), the
        settings (frozen, hashable) and the exemplars' value; exemplars that are no hashable value (the
        Asker refuses them with its own message) get an Asker of their own, not kept."""
        try:
            ex = None if exemplars is None else tuple(
                (e[0], tuple(e[1])) if isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[1], (tuple, list))
                else e for e in exemplars)
            key: Any = (id(retriever), settings, id(verbalizer), ex)
            hash(key)
        except TypeError:
            key = None
        cache = self.__dict__.setdefault("_askers", {})
        if key is None or key not in cache:
            asker = make(self, retriever, settings=settings, verbalizer=verbalizer, exemplars=exemplars)
            if key is None:
                return asker
            if len(cache) >= self.ASKERS:
                cache.clear()
            cache[key] = asker
        return cache[key]

    def example(self, structure: str, *, seed: int = 0) -> Node:
        """A seeded example query of ``structure`` that has answers on this KG (ids).

        Picked with the KG alone: hooks (an LLM) are not asked while searching.
        """
        from engine.exec.examples import example_query

        return example_query(self.artifact, structure, seed=seed, negation=self.negation,
                             executor=self.executor.without_hooks())
