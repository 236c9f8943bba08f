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
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from kgreason.cli import ArgumentParser as _Parser  # one-line UserError, user text escaped
from kgreason.cli import add_settings_arguments, setting, settings_from_args, verify_setting
from kgreason.errors import UserError, cli_main
from kgreason.files import json_object, read_lines
from kgreason.text import json_line, printable  # questions, KG names, LLM text: escaped where printed

from engine.exec.ask_settings import AskSettings

__all__ = ["AskConfig", "CHUNK", "UNUSED_LLM_FLAGS", "parse_args", "read_questions", "run", "main"]

#: Questions per call of the loop in a ``--questions`` run: the progress bar moves once per chunk, and
#: each chunk's steps are batched (encoder, executor, LLM prompts sent concurrently).
CHUNK = 16
#: The LLM client's flags that the ask loop has no use for, refused with ``--llm`` (one line saying why)
#: rather than accepted and ignored: its planner and reasoner ask for one reply per prompt at temperature
#: 0 (deterministic, so cacheable), with their own JSON switch, and read no log-probabilities.
UNUSED_LLM_FLAGS = {
    "--llm-temperature": "the planner and reasoner ask for one reply at temperature 0 (deterministic, cacheable)",
    "--llm-n": "the planner and reasoner ask for one reply per prompt",
    "--llm-json": "the planner and reasoner's JSON output is --llm-ask-json",
    "--llm-logprobs": "the planner and reasoner read no log-probabilities",
}
#: The choices of ``--llm-ask-json`` (llm_bridge.karpa_loop.JSON_OUTPUT_MODES; not imported: it loads the bridge).
ASK_JSON_MODES = ("schema", "object", "off")


def _kwargs_problem(text: object, flag: str) -> None:
    if isinstance(text, str):
        json_object(text, flag)  # a one-line UserError when it is not a JSON object


@dataclass(frozen=True, kw_only=True)
class AskConfig(AskSettings):
    """Everything ``engine.ask`` was asked to do (see ``--help``): the loop's :class:`AskSettings` (its
    fields, inherited, are the loop's flags) and the command's own fields below."""

    artifact: str | None = setting(None, metavar="DIR", help="artifact folder (default: the bundled UMLS KG)")
    question: str | None = None  # the positional question (exactly one of it and --questions)
    questions: str | None = setting(None, metavar="FILE",
                                    help='one question per line, or JSON lines {"question", "answers"}')
    encoder: str = setting("minilm", help="relation/question encoder (minilm, mpnet, hashing, sentence-transformers)")
    encoder_kwargs: str = setting("{}", metavar="JSON", check=_kwargs_problem,
                                  help="encoder keyword arguments as a JSON object")
    path_text: str = setting("questions", choices=("questions", "names"),
                             help="embedding-only retrieval reads a relation path as its relations' questions "
                                  "(llm_bridge.prompts.fallback_template, no LLM) or as its relation names")
    exemplars: str | None = setting(None, metavar="FILE",
                                    help='labelled questions, JSON lines {"question": ..., "path": [relation, ...]}: '
                                         "embedding-only retrieval favours the paths of similar exemplar questions")
    json: bool = setting(False, help="print one JSON object per question (JSON lines)")
    show_context: bool = setting(False, help="print the KG context the reasoner sees")
    llm: Any = None  # llm_bridge.config.LLMConfig with --llm, else None (embedding-only)
    reasoner: bool = setting(True, flag="--no-llm-reasoner", negate=True,
                             help="with --llm: the LLM plans, the best-scoring path answers")
    llm_ask_json: str | None = setting(None, choices=ASK_JSON_MODES, shown_default="off",
                                       help="with --llm: the planner/reasoner replies' response_format: 'off' none, "
                                            "'schema' a JSON schema whose relation names / path numbers / answers "
                                            "are enums of the prompt's candidates (llama.cpp compiles it into a "
                                            "grammar), 'object' any JSON object; dropped if the server rejects it "
                                            "(docs/ask.md)")
    verify: bool = verify_setting()

    @property
    def settings(self) -> AskSettings:
        """The loop's settings (the :class:`AskSettings` fields of this config)."""
        return AskSettings(**{f.name: getattr(self, f.name) for f in fields(AskSettings)})

    @property
    def encoder_options(self) -> dict[str, Any]:
        return json_object(self.encoder_kwargs, "--encoder-kwargs")


#: The command's own flags (the LLM ones go to the LLM group).
_LLM_FIELDS = ("reasoner", "llm_ask_json")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine.ask", description="Answer natural-language questions over a knowledge graph: "
                "plan relation paths (LLM), retrieve the KG's nearest paths, run them as logical queries, reason.")
    p.add_argument("question", nargs="?", help="a question; the topic entity in [brackets] (else found by name)")
    add_settings_arguments(p, AskConfig, skip=_LLM_FIELDS)
    from engine.providers import llm_provider

    g = llm_provider().add_client_arguments(p)
    g.add_argument("--llm", action="store_true", help="plan and reason with the LLM (default: embedding-only)")
    add_settings_arguments(g, AskConfig, only=_LLM_FIELDS)
    for action in g._group_actions:
        why = UNUSED_LLM_FLAGS.get(action.option_strings[0] if action.option_strings else "")
        if why is not None:
            action.help = f"refused by engine.ask ({why}); elsewhere: {action.help}"
    return p


def parse_args(argv: Sequence[str] | None) -> AskConfig:
    ns = _parser().parse_args(argv)
    if (ns.question is None) == (ns.questions is None):
        raise UserError("give a question or --questions FILE (exactly one)")
    if ns.question is not None and not ns.question.strip():
        raise UserError("the question is empty")
    cfg = settings_from_args(AskConfig, ns, question=ns.question)  # every range check, naming the flag
    from engine.providers import llm_provider

    if not ns.llm:  # the rule of every --llm CLI: an LLM flag without --llm is refused (--no-llm-cache too)
        llm_provider().refuse_llm_flags(ns, also=[("--no-llm-reasoner", not cfg.reasoner)])
        return cfg
    llm = llm_provider().client_config(ns)  # the client's own checks first (a bad --llm-n 0 names its range)
    given = [flag for flag in UNUSED_LLM_FLAGS if getattr(ns, flag[2:].replace("-", "_"), None) not in (None, False)]
    if given:
        raise UserError(f"{given[0]} is not used by engine.ask: {UNUSED_LLM_FLAGS[given[0]]}")
    return replace(cfg, llm=llm, llm_ask_json=cfg.llm_ask_json or "off")


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
    from engine.exec.ask import Asker, read_exemplars

    settings = cfg.settings
    items = [("question", cfg.question, None)] if cfg.question is not None else read_questions(cfg.questions)
    engine = Engine.load(cfg.artifact, verify=cfg.verify)
    exemplars = None if cfg.exemplars is None else read_exemplars(cfg.exemplars, engine.artifact.relations)
    verbalizer = None
    if cfg.path_text == "questions":
        from engine.providers import llm_provider

        verbalizer = llm_provider().relation_verbalizer()
    asker = Asker(engine, engine.retriever(encoder=cfg.encoder, encoder_kwargs=cfg.encoder_options or None),
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
    with llm_provider().ask_session(cfg.llm, max_hops=cfg.max_hops, json_output=cfg.llm_ask_json or "off",
                                    reasoner=cfg.reasoner) as (planner, reasoner):
        return run(cfg, planner=planner, reasoner=reasoner)


if __name__ == "__main__":
    raise SystemExit(main())
