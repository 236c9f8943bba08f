"""Ask questions in natural language: the KARPA loop (plan → retrieve → reason) from the command line.

Examples::

    python -m engine.ask --artifact artifacts/metaqa "which person directed the movies starred by [John Krasinski]"
    python -m engine.ask --artifact artifacts/metaqa --questions questions.jsonl --json
    # with an LLM planner/reasoner (any OpenAI-compatible server; the simulator: experiments.simulate_ask)
    python -m engine.ask --artifact artifacts/metaqa --questions questions.jsonl --llm \\
        --llm-base-url http://127.0.0.1:8099/v1 --llm-model sim --context yaml

``--questions`` files: one question per line, or JSON lines ``{"question": ...,
"answers": [...]}`` (``"path"`` is for the simulator), or both (:func:`read_questions`); with gold answers the
run ends with Hits@1 on stderr.  With more than :data:`CHUNK` questions a progress
bar on stderr counts the answered ones: they run in chunks of :data:`CHUNK` (each
chunk one batch per step).
With ``--llm`` the run is one deadline scope of the client
(:meth:`llm_bridge.client.LLMClient.deadline_scope`): a server that never
answers costs one ``--llm-deadline`` for the command, after which the other
questions run without the LLM (one warning; each question's trace says why).
Without ``--llm`` retrieval is embedding-only and the answers are a vote of the
best candidate paths (``--vote-paths``).  ``--json`` prints one
:meth:`AskResult.to_json <engine.exec.ask.AskResult.to_json>` object per question.
See docs/ask.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from kgreason.cli import ArgumentParser as _Parser  # one-line UserError, user text escaped
from kgreason.errors import UserError, cli_main
from kgreason.files import json_object, read_lines
from kgreason.text import json_line, printable  # questions, KG names, LLM text: escaped where printed

#: engine.exec.ask's LEXICAL_WEIGHT and KIND_WEIGHT (importing it here would load torch for --help;
#: tests/test_ask_kind.py checks they agree).
LEXICAL_WEIGHT = 0.6
KIND_WEIGHT = 1.5

__all__ = ["AskConfig", "CHUNK", "parse_args", "read_questions", "run", "main"]

#: Questions per call of the loop in a ``--questions`` run: the progress bar moves once per chunk, and
#: each chunk's steps are batched (encoder, executor, LLM prompts sent concurrently).
CHUNK = 16


@dataclass(frozen=True)
class AskConfig:
    """Everything ``engine.ask`` was asked to do (see ``--help``)."""

    artifact: str | None = None
    question: str | None = None
    questions: str | None = None
    k: int = 16
    mode: str = "pathfinding"
    max_hops: int = 3
    answers: int = 10
    candidate_relations: int = 30
    replan: bool = True
    context: str = "yaml"
    max_context_tokens: int = 1500
    exclude_topic: bool = True
    explain: bool = True
    encoder: str = "minilm"
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    path_text: str = "questions"  # embedding-only retrieval's path text: "questions" (verbalized) or "names"
    exemplars: str | None = None  # JSON-lines file of labelled questions {"question", "path"} (kNN path vote)
    exemplar_weight: float = 4.0
    exemplar_k: int = 3
    embedding_candidates: int = 0
    vote_paths: int = 16  # answers without a reasoner's pick: vote of this many candidate paths (1: the best path)
    vote_temperature: float = 0.1
    lexical_weight: float = LEXICAL_WEIGHT  # embedding-only retrieval: cost - weight x F1(relations followed, named)
    kind_weight: float = KIND_WEIGHT  # embedding-only retrieval: cost - weight x cos(kind phrase, path's end kind)
    json: bool = False
    show_context: bool = False
    llm: Any = None  # llm_bridge.config.LLMConfig with --llm, else None (embedding-only)
    reasoner: bool = True
    llm_ask_json: str = "off"  # planner/reasoner response_format (llm_bridge.karpa_loop.JSON_OUTPUT_MODES)
    verify: bool = True  # False: --skip-artifact-checksums (finite values and shapes are checked anyway)


def _parser() -> argparse.ArgumentParser:
    from engine.exec.ask import ASK_MODES
    from engine.exec.context import CONTEXT_STYLES

    p = _Parser(prog="python -m engine.ask", description="Answer natural-language questions over a knowledge graph: "
                "plan relation paths (LLM), retrieve the KG's nearest paths, run them as logical queries, reason.")
    p.add_argument("question", nargs="?", help="a question; the topic entity in [brackets] (else found by name)")
    p.add_argument("--questions", metavar="FILE", help="one question per line, or JSON lines {\"question\", \"answers\"}")
    p.add_argument("--artifact", metavar="DIR", help="artifact folder (default: the bundled UMLS KG)")
    p.add_argument("--k", type=int, default=16, help="candidate relation paths per question (default 16)")
    p.add_argument("--mode", choices=ASK_MODES, default="pathfinding",
                   help="retrieval of planned paths: KARPA-P (the plan's length, default) or KARPA-H (any length)")
    p.add_argument("--max-hops", type=int, default=3, help="longest relation path (default 3)")
    p.add_argument("--answers", type=int, default=10, help="answers per question (default 10)")
    p.add_argument("--candidate-relations", type=int, default=30,
                   help="relations nearest to the question shown to the planner (default 30)")
    p.add_argument("--no-replan", dest="replan", action="store_false", help="ask the planner once, not twice")
    p.add_argument("--context", choices=CONTEXT_STYLES, default="yaml",
                   help="KG context format of the reasoning prompt (default yaml)")
    p.add_argument("--max-context-tokens", type=int, default=1500, help="context size bound in tokens (default 1500)")
    p.add_argument("--include-topic", dest="exclude_topic", action="store_false",
                   help="keep the topic entity among the answers (default: removed, as in MetaQA)")
    p.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                   help="print why each answer holds (default on)")
    p.add_argument("--encoder", default="minilm", help="relation/question encoder (minilm, hashing, sentence-transformers)")
    p.add_argument("--encoder-kwargs", default="{}", metavar="JSON", help="encoder keyword arguments as a JSON object")
    p.add_argument("--path-text", choices=("questions", "names"), default="questions",
                   help="embedding-only retrieval reads a relation path as its relations' questions "
                        "(default; llm_bridge.prompts.fallback_template, no LLM) or as its relation names")
    p.add_argument("--exemplars", metavar="FILE",
                   help="labelled questions, JSON lines {\"question\": ..., \"path\": [relation, ...]}: "
                        "embedding-only retrieval favours the paths of similar exemplar questions")
    p.add_argument("--exemplar-weight", type=float, default=4.0,
                   help="cost subtracted per unit of exemplar vote (default 4.0; 0 ignores the exemplars)")
    p.add_argument("--exemplar-k", type=int, default=3,
                   help="the vote averages the k most similar exemplars of a path (default 3)")
    p.add_argument("--embedding-candidates", type=int, default=0,
                   help="with --llm: when the best embedding-only path of a planned length is not among the planned "
                        "candidates, show the reasoner this many such paths too (default 0)")
    p.add_argument("--vote-paths", type=int, default=16,
                   help="answers not picked by an LLM reasoner: a vote of this many candidate paths, each weighted "
                        "exp(-(cost - lowest cost) / T) (default 16; 1: the best path's answers)")
    p.add_argument("--vote-temperature", type=float, default=0.1, metavar="T",
                   help="temperature T of the vote's path weights (default 0.1)")
    p.add_argument("--lexical-weight", type=float, default=LEXICAL_WEIGHT, metavar="W",
                   help="embedding-only retrieval: cost lowered by W x the F1 between the relations a path follows "
                        "and those the question names word for word (default %(default)s; 0 turns it off)")
    p.add_argument("--kind-weight", type=float, default=KIND_WEIGHT, metavar="W",
                   help="embedding-only retrieval: cost lowered by W x the cosine between the kind of thing the "
                        "question asks for ('which films') and the kind of entity the path ends in, read from the "
                        "KG (docs/ask.md; default %(default)s; 0 turns it off)")
    p.add_argument("--json", action="store_true", help="print one JSON object per question (JSON lines)")
    p.add_argument("--show-context", action="store_true", help="print the KG context the reasoner sees")
    from engine.providers import llm_provider
    from kge.artifact import add_checksum_argument

    add_checksum_argument(p)

    g = llm_provider().add_client_arguments(p)
    g.add_argument("--llm", action="store_true", help="plan and reason with the LLM (default: embedding-only)")
    g.add_argument("--no-llm-reasoner", dest="reasoner", action="store_false",
                   help="with --llm: the LLM plans, the best-scoring path answers")
    g.add_argument("--llm-ask-json", choices=("schema", "object", "off"), default=None,
                   help="with --llm: the planner/reasoner replies' response_format: 'off' (default) none, 'schema' "
                        "a JSON schema whose relation names / path numbers / answers are enums of the prompt's "
                        "candidates (llama.cpp compiles it into a grammar), 'object' any JSON object; dropped if "
                        "the server rejects it (docs/ask.md)")
    return p


def parse_args(argv: Sequence[str] | None) -> AskConfig:
    ns = _parser().parse_args(argv)
    if (ns.question is None) == (ns.questions is None):
        raise UserError("give a question or --questions FILE (exactly one)")
    if ns.question is not None and not ns.question.strip():
        raise UserError("the question is empty")
    for flag, v, low in (("--k", ns.k, 1), ("--max-hops", ns.max_hops, 1), ("--answers", ns.answers, 1),
                         ("--candidate-relations", ns.candidate_relations, 1),
                         ("--max-context-tokens", ns.max_context_tokens, 0), ("--exemplar-k", ns.exemplar_k, 1),
                         ("--embedding-candidates", ns.embedding_candidates, 0), ("--vote-paths", ns.vote_paths, 1)):
        if v < low:
            raise UserError(f"{flag} must be >= {low}, got {v}")
    if not 0.0 < ns.vote_temperature <= 100.0:
        raise UserError(f"--vote-temperature must be in (0, 100], got {ns.vote_temperature}")
    for flag, v in (("--lexical-weight", ns.lexical_weight), ("--kind-weight", ns.kind_weight)):
        if not 0.0 <= v <= 10.0:
            raise UserError(f"{flag} must be in [0, 10], got {v}")
    if not 0.0 <= ns.exemplar_weight <= 10.0:
        raise UserError(f"--exemplar-weight must be in [0, 10], got {ns.exemplar_weight}")
    if ns.max_hops > 6:
        raise UserError(f"--max-hops must be <= 6 (relation sequences grow exponentially), got {ns.max_hops}")
    kwargs = json_object(ns.encoder_kwargs, "--encoder-kwargs")
    from engine.providers import llm_provider

    llm = None
    if ns.llm:
        llm = llm_provider().client_config(ns)
    else:  # the rule of every --llm CLI: an LLM flag without --llm is refused (--no-llm-cache too)
        llm_provider().refuse_llm_flags(ns, also=[("--no-llm-reasoner", not ns.reasoner)])
    return AskConfig(artifact=ns.artifact, question=ns.question, questions=ns.questions, k=ns.k, mode=ns.mode,
                     max_hops=ns.max_hops, answers=ns.answers, candidate_relations=ns.candidate_relations,
                     replan=ns.replan, context=ns.context, max_context_tokens=ns.max_context_tokens,
                     exclude_topic=ns.exclude_topic, explain=ns.explain, encoder=ns.encoder, encoder_kwargs=kwargs,
                     path_text=ns.path_text, exemplars=ns.exemplars, exemplar_weight=ns.exemplar_weight,
                     exemplar_k=ns.exemplar_k, embedding_candidates=ns.embedding_candidates,
                     vote_paths=ns.vote_paths, vote_temperature=ns.vote_temperature,
                     lexical_weight=ns.lexical_weight, kind_weight=ns.kind_weight, json=ns.json,
                     show_context=ns.show_context, llm=llm, reasoner=ns.reasoner,
                     llm_ask_json=ns.llm_ask_json or "off", verify=not ns.skip_artifact_checksums)


def read_questions(path: str) -> list[tuple[str, str, tuple[str, ...] | None]]:
    """``(where, question, gold answers or None)`` per non-blank line: plain text, or (a line starting
    with ``{``) a JSON object ``{"question": str, "answers": [str, ...]}``; a file may mix both.

    Each ``{`` line is parsed by :func:`kgreason.files.json_object`, as the ``--exemplars`` reader
    (:func:`kgreason.files.read_json_objects`) parses its lines: a malformed line, however deeply nested,
    is one ``UserError`` naming ``FILE:LINE``.
    """
    lines = [(ln, line) for ln, line in read_lines(path, what="--questions") if line.strip()]
    if not lines:
        raise UserError(f"--questions: {path} has no questions")
    shape = '{"question": ..., "answers": [...]}'
    out = []
    for ln, line in lines:
        where = f"{path}:{ln}"
        if not line.lstrip().startswith("{"):
            out.append((where, line.strip(), None))
            continue
        out.append(_question(where, json_object(line, where, shape=shape)))
    return out


def _question(where: str, obj: dict) -> tuple[str, str, tuple[str, ...] | None]:
    from kgreason.files import text_field

    q = text_field(obj, "question", where)
    gold = obj.get("answers")
    if gold is not None and not (isinstance(gold, list) and all(isinstance(a, str) for a in gold)):
        raise UserError(f"{where}: \"answers\" must be a list of entity names")
    return where, q, tuple(gold) if gold is not None else None


def _linker(artifact):
    """The bridge's entity linker for bracketed mentions that are not exact names (None without rapidfuzz)."""
    from engine.providers import llm_provider

    linker = llm_provider().entity_linker(artifact)
    if linker is None:
        return None

    def link(text: str):
        return linker.link(text).entity

    return link


def _print(res, out, show_context: bool, asker) -> None:
    out.write(f"question: {printable(res.question)}\n")
    if res.error is not None:
        out.write(f"  error: {printable(res.error)}\n\n")
        return
    plans = "; ".join(" -> ".join(p) for p in res.plans) or "none"
    out.write(f"  topic: {printable(str(res.topic))}   retrieval: {printable(res.retrieval)}   plans: {printable(plans)}\n")
    if not res.answers:
        out.write("  no answers\n")
    for rank, a in enumerate(res.answers, 1):
        out.write(printable(f"  {rank:>3}. {a.score:.4f}  {a.entity}   via {' -> '.join(a.path)} (path {a.path_rank}, "
                            f"{a.selected_by}, {a.provenance})") + "\n")
        if a.explanation is not None:
            for line in a.explanation.lines():
                out.write(f"         {printable(line)}\n")
    out.write("  candidate paths:\n")
    for i, p in enumerate(res.paths, 1):
        out.write(printable(f"    {i:>2}. cost {p.cost:.4f}  {' -> '.join(p.names)}  ({p.num_tails} tails, {p.source})") + "\n")
    if show_context and res.paths:
        from engine.exec.context import format_context

        cps = [asker.context_path(res, p) for p in res.paths]
        out.write("  context:\n")
        for line in format_context(cps, style=asker.settings.context,
                                   max_tokens=asker.settings.max_context_tokens).split("\n"):  # not at U+2028
            out.write(f"    {printable(line)}\n")
    for w in res.warnings:
        out.write(f"  warning: {printable(w)}\n")
    if res.llm_calls:
        out.write(f"  llm: {res.llm_calls} calls, {res.llm_tokens} tokens\n")
    out.write("\n")


def _ask_chunks(asker, questions: list[str], err, *, progress: bool, **kw: Any) -> list:
    """``asker.ask`` over chunks of :data:`CHUNK` questions, with a bar on ``err`` that moves per chunk
    (``progress``), else in one batch.  A question's result does not depend on the others asked with it."""
    if not progress:
        return asker.ask(questions, **kw)
    from kgreason.progress import progress_bar  # a bar on a terminal, plain lines in a log

    results: list = []
    with progress_bar(total=len(questions), desc="questions", unit="question", file=err) as bar:
        for start in range(0, len(questions), CHUNK):
            part = questions[start:start + CHUNK]
            results.extend(asker.ask(part, **kw))
            bar.update(len(part))
    return results


def run(cfg: AskConfig, out=None, err=None, *, planner: Any = None, reasoner: Any = None) -> int:
    """Answer the questions of ``cfg`` and print them to ``out`` (default stdout); a summary goes to ``err``."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    from engine.exec.api import Engine
    from engine.exec.ask import Asker, AskSettings, read_exemplars

    settings = AskSettings(k=cfg.k, mode=cfg.mode, max_hops=cfg.max_hops, answers=cfg.answers,
                           candidate_relations=cfg.candidate_relations, replan=cfg.replan, context=cfg.context,
                           max_context_tokens=cfg.max_context_tokens, exclude_topic=cfg.exclude_topic,
                           explain=cfg.explain, exemplar_weight=cfg.exemplar_weight, exemplar_k=cfg.exemplar_k,
                           embedding_candidates=cfg.embedding_candidates, vote_paths=cfg.vote_paths,
                           vote_temperature=cfg.vote_temperature, lexical_weight=cfg.lexical_weight,
                           kind_weight=cfg.kind_weight)
    items = [("question", cfg.question, None)] if cfg.question is not None else read_questions(cfg.questions)
    engine = Engine.load(cfg.artifact, verify=cfg.verify)
    exemplars = None if cfg.exemplars is None else read_exemplars(cfg.exemplars, engine.artifact.relations)
    verbalizer = None
    if cfg.path_text == "questions":
        from engine.providers import llm_provider

        verbalizer = llm_provider().relation_verbalizer()
    asker = Asker(engine, engine.retriever(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_kwargs or None),
                  settings=settings, verbalizer=verbalizer, exemplars=exemplars)
    linker = _linker(engine.artifact)
    t0 = time.perf_counter()
    results = _ask_chunks(asker, [q for _, q, _ in items], err, planner=planner, reasoner=reasoner, linker=linker,
                          progress=cfg.questions is not None and len(items) > CHUNK)
    wall = time.perf_counter() - t0
    if cfg.question is not None and results[0].error is not None:
        raise UserError(f"question: {results[0].error}")
    hits, graded = 0, 0
    for (where, _, gold), res in zip(items, results):
        if cfg.json:
            d = res.to_json()
            if gold is not None:
                d["gold"] = list(gold)
            out.write(json_line(d) + "\n")
        else:
            _print(res, out, cfg.show_context, asker)
        if gold is not None:
            graded += 1
            hits += bool(res.answers) and res.answers[0].entity in gold
    out.flush()
    n = len(results)
    summary = {"questions": n, "errors": sum(r.error is not None for r in results),
               "llm_calls_per_question": round(sum(r.llm_calls for r in results) / n, 3),
               "tokens_per_question": round(sum(r.llm_tokens for r in results) / n, 1),
               "seconds_per_question": round(wall / n, 4)}
    if graded:
        summary["hits@1"] = round(hits / graded, 4)
    if cfg.questions is not None:
        err.write("ask: " + json.dumps(summary) + "\n")
    return 0


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.llm is None:
        return run(cfg)
    from engine.providers import llm_provider

    # One client and one deadline scope for the command (the provider's ask_session): a server that never
    # answers costs one --llm-deadline, not one per chunk and step (plan, replan, reason).
    with llm_provider().ask_session(cfg.llm, max_hops=cfg.max_hops, json_output=cfg.llm_ask_json,
                                    reasoner=cfg.reasoner) as (planner, reasoner):
        return run(cfg, planner=planner, reasoner=reasoner)


if __name__ == "__main__":
    raise SystemExit(main())
