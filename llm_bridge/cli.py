"""The ``--llm`` flags of the engine's CLIs, in one place.

A CLI adds them with :func:`add_arguments` (which also adds the client's
``--llm-base-url``/``--llm-model``/... flags of :mod:`llm_bridge.config`), turns
the parsed namespace into :class:`LLMSettings` with :func:`options_from_args`
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

from kgreason.cli import Settings, add_settings_arguments, flag_names, setting, settings_values
from kgreason.errors import UserError

from llm_bridge.config import (MAX_INPUTS, LGOTConfig, LLMConfig, add_llm_arguments, config_from_args, from_flags,
                               refuse_llm_flags)

__all__ = ["LLMSettings", "LLMOptions", "add_arguments", "options_from_args", "llm_hooks", "compact_notes",
           "LGOT_FLAGS"]

#: The flag of each :class:`~llm_bridge.config.LGOTConfig` field (declared with the fields, as are their
#: defaults and checks).
LGOT_FLAGS = flag_names(LGOTConfig)


def _check_names_file(path: str, flag: str) -> None:
    """A one-line error unless ``--llm-names-file`` is a readable regular file."""
    p = Path(path).expanduser()
    if str(path) == "":
        raise UserError(f"{flag}: empty path")
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give the aliases file (e.g. id2ent.tsv)")
    if not p.exists():
        raise UserError(f"{flag} {path}: no such file")
    if not p.is_file():
        raise UserError(f"{flag} {path}: not a regular file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{flag} {path}: file is not readable")


@dataclass(frozen=True, kw_only=True)
class LLMSettings(Settings):
    """What ``--llm`` asked for: the client's :class:`~llm_bridge.config.LLMConfig` and the bridge's
    :class:`~llm_bridge.config.LGOTConfig` (each from its own ``--llm-*`` flags), and the aliases file."""

    config: LLMConfig
    settings: LGOTConfig
    names_file: str | None = setting(None, flag="--llm-names-file", metavar="FILE", check=_check_names_file,
                                     shown_default="one next to the artifact's source, if any",
                                     help="entity aliases for linking answers (e.g. FB15k-237's id2ent.tsv)")
    questions_dir: str | None = None


#: The former name of :class:`LLMSettings` (settings classes are named by docs/cli.md's rule).
LLMOptions = LLMSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--llm`` and the bridge's flags (:class:`~llm_bridge.config.LGOTConfig`'s and
    :class:`LLMSettings`', declared with their fields), and the client's
    (:func:`~llm_bridge.config.add_llm_arguments`)."""
    g = add_llm_arguments(parser)
    g.add_argument("--llm", action="store_true",
                   help="answer every sub-question with the LLM too (LGOT); see --llm-mode")
    add_settings_arguments(g, LGOTConfig, unset=True)
    add_settings_arguments(g, LLMSettings, unset=True)


def options_from_args(ns: argparse.Namespace, *, top_k: int = 10) -> LLMSettings | None:
    """The :class:`LLMSettings` of parsed flags, or ``None`` without ``--llm`` (then no LLM flag may be given:
    :func:`~llm_bridge.config.refuse_llm_flags`)."""
    if not getattr(ns, "llm", False):
        refuse_llm_flags(ns)
        return None
    config = config_from_args(ns)
    values = settings_values(LGOTConfig, ns)
    if values.get("inputs") is None:  # LGOT's min(k, 10): the CLI knows k
        values["inputs"] = max(1, min(int(top_k), MAX_INPUTS))
    # unset flags take LGOTConfig's own defaults, and its checks say what is wrong, naming the flag
    settings = from_flags(LGOTConfig, values, LGOT_FLAGS)
    if settings.confidence in ("logprobs-first", "logprobs-mean") and not config.logprobs:
        raise UserError(f"--llm-confidence {settings.confidence} needs --llm-logprobs")
    return LLMSettings(config=config, settings=settings, **settings_values(LLMSettings, ns))


@contextlib.contextmanager
def llm_hooks(options: LLMSettings | None, *, stats_out=None) -> Iterator[Sequence[Any]]:
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
