"""The LLM bridge as the engine's LLM provider (:mod:`engine.providers`).

``setup.py`` declares :data:`PROVIDER` as the entry point ``llm_bridge`` of the group
``kgreason.llm_providers``; without that metadata (a checkout, an older install) the engine imports this
module by name.  Either way the engine's CLIs never import ``llm_bridge``: they call these methods, which
hand over to :mod:`llm_bridge.cli` and :mod:`llm_bridge.config` (the flags and their one rule), the client,
the linker and the KARPA loop.  Importing this module loads nothing else (each method imports what it uses).
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = ["BridgeProvider", "PROVIDER"]


class BridgeProvider:
    """:class:`engine.providers.LLMProvider` on the LLM bridge."""

    # ------------------------------------------------------------------ engine.answer (LGOT hooks)
    def add_answer_arguments(self, parser: argparse.ArgumentParser) -> None:
        from llm_bridge.cli import add_arguments

        add_arguments(parser)

    def answer_options(self, ns: argparse.Namespace, *, top_k: int) -> Any:
        from llm_bridge.cli import options_from_args

        return options_from_args(ns, top_k=top_k)

    def answer_hooks(self, options: Any) -> contextlib.AbstractContextManager[Sequence[Any]]:
        from llm_bridge.cli import llm_hooks

        return llm_hooks(options)

    def compact_notes(self, notes: Mapping[str, Any]) -> str:
        from llm_bridge.cli import compact_notes

        return compact_notes(notes)

    # ------------------------------------------------------------------ engine.ask (KARPA)
    def add_client_arguments(self, parser: argparse.ArgumentParser) -> Any:
        from llm_bridge.config import add_llm_arguments

        return add_llm_arguments(parser)

    def client_config(self, ns: argparse.Namespace) -> Any:
        from llm_bridge.config import config_from_args

        return config_from_args(ns)

    def refuse_llm_flags(self, ns: argparse.Namespace, *, also: Sequence[tuple[str, bool]] = ()) -> None:
        from llm_bridge.config import refuse_llm_flags

        refuse_llm_flags(ns, also=also)

    def entity_linker(self, artifact: Any) -> Any:
        """The bridge's :class:`~llm_bridge.linking.EntityLinker` (None without rapidfuzz: exact names only)."""
        try:
            import rapidfuzz  # noqa: F401
        except ImportError:
            return None
        from llm_bridge.linking import EntityLinker

        # Topic mentions are linked with no relation (link(text)), so relation ranges would be built for nothing.
        return EntityLinker.from_artifact(artifact, ranges=False)

    def relation_verbalizer(self) -> Callable[[str], str]:
        from llm_bridge.prompts import fallback_template

        return fallback_template

    @contextlib.contextmanager
    def ask_session(self, config: Any, *, max_hops: int, json_output: str,
                    reasoner: bool) -> Iterator[tuple[Any, Any]]:
        from llm_bridge.client import LLMClient
        from llm_bridge.karpa_loop import LLMPlanner, LLMReasoner

        # One deadline scope for the command, as engine.answer's (llm_bridge.cli.llm_hooks): a server that never
        # answers costs one --llm-deadline, not one per chunk and step (plan, replan, reason).
        with LLMClient(config) as client, client.deadline_scope():
            yield (LLMPlanner(client, max_hops=max_hops, json_output=json_output),
                   LLMReasoner(client, json_output=json_output) if reasoner else None)


#: The provider the entry point ``llm_bridge`` (group ``kgreason.llm_providers``) names.
PROVIDER = BridgeProvider()
