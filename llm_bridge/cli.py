"""The ``--llm`` flags of the engine's CLIs, in one place.

A CLI adds them with :func:`add_arguments` (which also adds the client's
``--llm-base-url``/``--llm-model``/... flags of :mod:`llm_bridge.config`), turns
the parsed namespace into :class:`LLMOptions` with :func:`options_from_args`
(``None`` without ``--llm``), and runs with the hooks of :func:`llm_hooks`::

    p = argparse.ArgumentParser(); add_arguments(p)
    ns = p.parse_args(argv)
    opts = options_from_args(ns, top_k=ns.top_k)
    with llm_hooks(opts) as hooks:             # () without --llm: the KG-only path
        Executor(artifact, hooks=hooks).answer(...)

Nothing here imports ``openai`` unless ``--llm`` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from kgreason.errors import UserError

from llm_bridge.config import (CONFIDENCE_MODES, MAX_INPUTS, MERGE_RULES, MODES, RELATION_QUESTION_MODES, LGOTSettings,
                               LLMConfig, add_llm_arguments, config_from_args, from_flags, refuse_llm_flags)

__all__ = ["LLMOptions", "add_arguments", "options_from_args", "llm_hooks", "compact_notes", "LGOT_FLAGS"]

#: The flag of each :class:`~llm_bridge.config.LGOTSettings` field (its defaults and checks are the settings').
LGOT_FLAGS = {"mode": "--llm-mode", "theta": "--llm-theta", "alpha": "--llm-alpha", "merge": "--llm-merge",
              "inputs": "--llm-inputs", "confidence": "--llm-confidence",
              "relation_questions": "--llm-relation-questions", "link_threshold": "--llm-link-threshold",
              "answer_check": "--llm-answer-check", "check_penalty": "--llm-check-penalty",
              "input_ratio": "--llm-input-ratio"}
_D = LGOTSettings()


@dataclass(frozen=True)
class LLMOptions:
    """What ``--llm`` asked for: the client's :class:`~llm_bridge.config.LLMConfig` and the bridge's settings."""

    config: LLMConfig
    settings: LGOTSettings
    names_file: str | None = None
    questions_dir: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--llm`` and the bridge's flags (and the client's, :func:`~llm_bridge.config.add_llm_arguments`)."""
    g = add_llm_arguments(parser)
    g.add_argument("--llm", action="store_true",
                   help="answer every sub-question with the LLM too (LGOT); see --llm-mode")
    g.add_argument("--llm-mode", choices=MODES, default=None,
                   help="lgot: merge filtered LLM answers into the KG's fuzzy sets; llm-only: the LLM's answers "
                        f"alone (default {_D.mode})")
    g.add_argument("--llm-theta", metavar="T", type=float, default=None,
                   help=f"likelihood-ratio filter: keep an LLM answer if p(e)/p_max >= T (default {_D.theta:g})")
    g.add_argument("--llm-alpha", metavar="A", type=float, default=None,
                   help=f"merge weight: T[e] = max(T[e], A*p(e)) (default {_D.alpha:g})")
    g.add_argument("--llm-merge", choices=MERGE_RULES, default=None,
                   help="merge rule: max (default) or LGOT's additive min(1, T[e] + A*p(e))")
    g.add_argument("--llm-inputs", metavar="K", type=int, default=None,
                   help=f"input entities per prompt: the top K of the input node (default min(--top-k, {MAX_INPUTS}))")
    g.add_argument("--llm-input-ratio", metavar="R", type=float, default=None,
                   help="an entity feeds the next sub-question's prompt only if its value is >= R x the row's best "
                        f"(default {_D.input_ratio:g}: near-zero KG predictions no longer pad the prompt; "
                        "benchmarks/results/lgot/metaqa.md)")
    g.add_argument("--llm-confidence", choices=CONFIDENCE_MODES, default=None,
                   help="p(e) from sample counts (default) or token log-probabilities (needs --llm-logprobs)")
    g.add_argument("--llm-relation-questions", choices=RELATION_QUESTION_MODES, default=None,
                   help="relation question templates: asked of the LLM once per relation (default) or built "
                        "from the relation's name")
    g.add_argument("--llm-names-file", metavar="FILE", default=None,
                   help="entity aliases for linking answers (e.g. FB15k-237's id2ent.tsv; default: one next to "
                        "the artifact's source, if any)")
    g.add_argument("--llm-link-threshold", metavar="S", type=float, default=None,
                   help=f"fuzzy linking: accept a match with token-aligned score >= S in [0, 100] (default "
                        f"{_D.link_threshold:g}, calibrated: benchmarks/results/lgot/linking.md)")
    g.add_argument("--llm-answer-check", metavar="K", type=int, default=None,
                   help="answer check (LGOT 3.3.1): ask the LLM whether each of the top K entities (K <= 10) of "
                        "every projection answers its sub-question; rejected ones are scaled by --llm-check-penalty "
                        f"(default {_D.answer_check}: off)")
    g.add_argument("--llm-check-penalty", metavar="P", type=float, default=None,
                   help=f"factor in [0, 1] for an entity the answer check rejects (default {_D.check_penalty:g})")


def options_from_args(ns: argparse.Namespace, *, top_k: int = 10) -> LLMOptions | None:
    """The :class:`LLMOptions` of parsed flags, or ``None`` without ``--llm`` (then no LLM flag may be given:
    :func:`~llm_bridge.config.refuse_llm_flags`)."""
    if not getattr(ns, "llm", False):
        refuse_llm_flags(ns)
        return None
    config = config_from_args(ns)
    values = {k: getattr(ns, flag[2:].replace("-", "_")) for k, flag in LGOT_FLAGS.items()}
    if values["inputs"] is None:  # LGOT's min(k, 10): the CLI knows k
        values["inputs"] = max(1, min(int(top_k), MAX_INPUTS))
    # unset flags take LGOTSettings' own defaults, and its checks say what is wrong, naming the flag
    settings = from_flags(LGOTSettings, {k: v for k, v in values.items() if v is not None}, LGOT_FLAGS)
    if settings.confidence in ("logprobs-first", "logprobs-mean") and not config.logprobs:
        raise UserError(f"--llm-confidence {settings.confidence} needs --llm-logprobs")
    if ns.llm_names_file is not None:
        _check_names_file(ns.llm_names_file)
    return LLMOptions(config=config, settings=settings, names_file=ns.llm_names_file)


def _check_names_file(path: str) -> None:
    """A one-line error unless ``--llm-names-file`` is a readable regular file."""
    p = Path(path).expanduser()
    if str(path) == "":
        raise UserError("--llm-names-file: empty path")
    if p.is_dir():
        raise UserError(f"--llm-names-file {path}: is a folder; give the aliases file (e.g. id2ent.tsv)")
    if not p.exists():
        raise UserError(f"--llm-names-file {path}: no such file")
    if not p.is_file():
        raise UserError(f"--llm-names-file {path}: not a regular file")
    if not os.access(p, os.R_OK):
        raise UserError(f"--llm-names-file {path}: file is not readable")


@contextlib.contextmanager
def llm_hooks(options: LLMOptions | None, *, stats_out=None) -> Iterator[Sequence[Any]]:
    """The executor hooks for ``options`` (``()`` for None), with the client closed on exit.

    Once a call ran out its ``--llm-deadline`` without any response from the server, the later calls
    of the block are not made (:meth:`~llm_bridge.client.LLMClient.deadline_scope`).

    On exit a one-line summary of the LLM's use goes to ``stats_out`` (default
    stderr): prompts, HTTP requests, cache hits, tokens, rows that fell back.
    """
    if options is None:
        yield ()
        return
    from llm_bridge.client import LLMClient
    from llm_bridge.lgot import LGOTHook

    client = LLMClient(options.config)
    try:
        hook = LGOTHook(client=client, settings=options.settings, names_file=options.names_file,
                        questions_dir=options.questions_dir)
        # A server that never answers costs one --llm-deadline for the command, not one per stage
        # (relation questions, every projection node, the answer check).
        with client.deadline_scope():
            yield (hook,)
        st = client.stats
        summary = {"mode": options.settings.mode, "model": options.config.model, "prompts": hook.stats.prompts,
                   "calls": st.calls, "requests": st.requests, "cache_hits": st.cache_hits, "retries": st.retries,
                   "failed_rows": hook.stats.failed_rows, "tokens": st.total_tokens, "timeouts": st.timeouts}
        if options.settings.answer_check:
            summary.update(checks=hook.stats.checks, failed_checks=hook.stats.failed_checks,
                           penalised=hook.stats.penalised)
        out = sys.stderr if stats_out is None else stats_out
        out.write("llm: " + json.dumps(summary, sort_keys=False) + "\n")
    finally:
        client.close()


def compact_notes(notes: Mapping[str, Any], *, limit: int = 5) -> str:
    """One line for a trace node's notes (the text output of ``engine.answer``; ``--json`` has them in full).

    The bridge's keys are summarised (``llm``: its summary line and the kept
    answers, ``merged``: how many, ``llm_set``: its first entities,
    ``warning`` verbatim); other keys as ``notes {JSON}``, as before.  The line holds LLM and KG text as
    it is: the caller escapes it where it prints it (:func:`kgreason.text.printable`, as ``engine.answer`` does).
    """
    parts: list[str] = []
    rest: dict[str, Any] = {}
    for key, value in notes.items():
        if key == "llm" and isinstance(value, Mapping):
            if "failed" in value:
                continue  # the warning says it
            if "summary" in value:
                kept = ", ".join(value.get("kept", [])[:limit])
                more = len(value.get("kept", [])) - limit
                parts.append(f"llm: {value['summary']}" + (f" [{kept}{f', +{more}' if more > 0 else ''}]" if kept else ""))
            elif "skipped" in value:
                parts.append(f"llm: skipped ({value['skipped']})")
        elif key == "check" and isinstance(value, Mapping):
            pen = value.get("penalised", [])
            shown = ", ".join(pen[:limit]) + (f", +{len(pen) - limit}" if len(pen) > limit else "")
            parts.append(f"check {len(value.get('entities', []))}, penalised {len(pen)}" + (f" [{shown}]" if pen else ""))
        elif key == "merged" and isinstance(value, list):
            parts.append(f"merged {len(value)}")
        elif key == "llm_set" and isinstance(value, Mapping):
            if "undefined" in value:
                parts.append(f"llm set undefined ({value['undefined']})")
            else:
                ents = ", ".join(f"{e['entity']} {e['p']:.2f}" for e in value.get("entities", [])[:limit])
                neg = "not " if value.get("negated") else ""
                parts.append(f"llm set {neg}{{{ents}}}" + (f" of {value.get('size')}" if value.get("size", 0) > limit else ""))
        elif key == "warning":
            parts.append(f"warning: {value}")
        else:
            rest[key] = value
    if rest:  # anything else exactly as engine.answer prints notes it does not know
        parts.append("notes " + json.dumps(rest, ensure_ascii=False, sort_keys=True))
    return "; ".join(parts)
