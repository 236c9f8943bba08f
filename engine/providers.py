"""LLM providers: how the engine's CLIs reach an LLM without importing one.

``engine.answer --llm`` (LGOT hooks) and ``engine.ask --llm`` (the KARPA planner and reasoner) need an LLM
client, its flags and the objects built on it.  The engine owns this registration point; a provider fills it.
The layering is then one way (tests/test_imports.py): the engine names no provider package in an import, and
the provider -- ``llm_bridge`` -- depends on the engine, never the reverse.

A provider is found by name (default :data:`DEFAULT_PROVIDER`, or ``$KGREASON_LLM_PROVIDER``), in order:

1. one registered in this process with :func:`register` (tests, an embedding application);
2. a Python entry point of that name in the group :data:`ENTRY_POINT_GROUP` (``setup.py`` declares
   ``llm_bridge = llm_bridge.provider:PROVIDER``; another package can declare its own);
3. for the default name only, the module :data:`DEFAULT_MODULES` names, imported by name (a source checkout,
   or an install whose metadata predates the entry point); its ``PROVIDER`` attribute is the provider.

Without one, :func:`llm_provider` returns a stand-in that keeps every run without ``--llm`` working (the
flag is still accepted and listed) and turns ``--llm`` into one error line saying what is missing.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
from importlib.metadata import entry_points
from typing import Any, Callable, ContextManager, Mapping, Protocol, Sequence

from kgreason.errors import UserError

__all__ = ["ENTRY_POINT_GROUP", "DEFAULT_PROVIDER", "DEFAULT_MODULES", "LLMProvider", "MissingProvider",
           "llm_provider", "register", "unregister"]

#: The entry point group providers are declared in (``setup.py``'s ``entry_points``).
ENTRY_POINT_GROUP = "kgreason.llm_providers"
#: The provider the CLIs use unless ``$KGREASON_LLM_PROVIDER`` names another.
DEFAULT_PROVIDER = "llm_bridge"
#: Modules tried (by name, with importlib) when no entry point is installed: name -> module with ``PROVIDER``.
DEFAULT_MODULES = {"llm_bridge": "llm_bridge.provider"}

_REGISTERED: dict[str, "LLMProvider"] = {}


class LLMProvider(Protocol):
    """What the engine's CLIs ask of an LLM provider (``llm_bridge.provider.BridgeProvider`` implements it).

    Every method is called whether or not ``--llm`` was given (the flags are always listed); only
    :meth:`answer_hooks` with options, :meth:`client_config` and :meth:`ask_session` talk to a server.
    """

    # ------------------------------------------------------------------ engine.answer (LGOT hooks)
    def add_answer_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add ``--llm`` and its flags to ``engine.answer``'s parser."""

    def answer_options(self, ns: argparse.Namespace, *, top_k: int) -> Any:
        """The options of ``--llm`` (``None`` without it; then an LLM flag given is a :class:`UserError`)."""

    def answer_hooks(self, options: Any) -> ContextManager[Sequence[Any]]:
        """The executor hooks for :meth:`answer_options`' result (``()`` for ``None``), closed on exit."""

    def compact_notes(self, notes: Mapping[str, Any]) -> str:
        """One line for a trace node's notes (the provider's hooks wrote them)."""

    # ------------------------------------------------------------------ engine.ask (KARPA)
    def add_client_arguments(self, parser: argparse.ArgumentParser) -> Any:
        """Add the client's ``--llm-*`` flags as one argument group and return it (the CLI adds ``--llm``)."""

    def client_config(self, ns: argparse.Namespace) -> Any:
        """The client settings of the parsed flags (``--llm`` given)."""

    def refuse_llm_flags(self, ns: argparse.Namespace, *, also: Sequence[tuple[str, bool]] = ()) -> None:
        """Without ``--llm``: a :class:`UserError` ``--FLAG needs --llm`` for the first LLM flag given."""

    def entity_linker(self, artifact: Any) -> Any:
        """An object whose ``link(text).entity`` is an entity id or None, or None when the provider cannot link."""

    def relation_verbalizer(self) -> Callable[[str], str]:
        """``relation name -> question template`` with no LLM call (``engine.ask --path-text questions``)."""

    def ask_session(self, config: Any, *, max_hops: int, json_output: str,
                    reasoner: bool) -> ContextManager[tuple[Any, Any]]:
        """``(planner, reasoner or None)`` on one client, under one deadline, closed on exit."""


class MissingProvider:
    """The stand-in when no provider is installed: runs without ``--llm`` are unchanged, ``--llm`` is refused.

    ``reason`` is the one line a user sees (what was looked for and why it was not found).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def _refuse(self, flag: str = "--llm") -> UserError:
        return UserError(f"{flag}: {self.reason}")

    def add_answer_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--llm", action="store_true", help="answer with an LLM too (needs an LLM provider: "
                            "kgreason's llm_bridge with the [llm] extra; none is installed)")

    def answer_options(self, ns: argparse.Namespace, *, top_k: int) -> None:
        if getattr(ns, "llm", False):
            raise self._refuse()
        return None

    def answer_hooks(self, options: Any) -> ContextManager[Sequence[Any]]:
        if options is not None:  # only a provider makes options
            raise self._refuse()
        return contextlib.nullcontext(())

    def compact_notes(self, notes: Mapping[str, Any]) -> str:
        return "notes " + json.dumps(dict(notes), sort_keys=True, default=str)

    def add_client_arguments(self, parser: argparse.ArgumentParser) -> Any:
        return parser.add_argument_group("LLM", "no LLM provider is installed: --llm is refused")

    def client_config(self, ns: argparse.Namespace) -> Any:
        raise self._refuse()

    def refuse_llm_flags(self, ns: argparse.Namespace, *, also: Sequence[tuple[str, bool]] = ()) -> None:
        given = [f"--{d.replace('_', '-')}" for d, v in vars(ns).items() if d.startswith("llm_") and v not in (None, False)]
        given += [flag for flag, on in also if on]
        if given:
            raise UserError(f"{given[0]} needs --llm")

    def entity_linker(self, artifact: Any) -> None:
        return None  # exact names only, as without rapidfuzz

    def relation_verbalizer(self) -> Callable[[str], str]:
        raise self._refuse("--path-text questions")

    def ask_session(self, config: Any, *, max_hops: int, json_output: str,
                    reasoner: bool) -> ContextManager[tuple[Any, Any]]:
        raise self._refuse()


def register(name: str, provider: LLMProvider) -> None:
    """Make ``provider`` the one :func:`llm_provider` returns for ``name`` in this process."""
    _REGISTERED[name] = provider


def unregister(name: str) -> None:
    """Forget a provider :func:`register` (or a lookup) recorded for ``name``; the next lookup searches again."""
    _REGISTERED.pop(name, None)


def llm_provider(name: str | None = None) -> LLMProvider:
    """The provider called ``name`` (default ``$KGREASON_LLM_PROVIDER``, else :data:`DEFAULT_PROVIDER`), or a
    :class:`MissingProvider` saying why there is none.  A provider found is remembered for the process."""
    name = name or os.environ.get("KGREASON_LLM_PROVIDER") or DEFAULT_PROVIDER
    if name in _REGISTERED:
        return _REGISTERED[name]
    found: Any = None
    why = []
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            found = ep.load()
            break
        except Exception as exc:  # noqa: BLE001 - another package's code: say which entry point and why
            why.append(f"its entry point {ep.value!r} does not load ({type(exc).__name__}: {exc})")
    if found is None and name in DEFAULT_MODULES:
        module = DEFAULT_MODULES[name]
        try:
            found = getattr(importlib.import_module(module), "PROVIDER", None)
            if found is None:
                why.append(f"module {module} has no PROVIDER")
        except ImportError as exc:
            why.append(f"module {module} cannot be imported ({exc})")
    if found is None:
        where = f"no entry point {name!r} in the group {ENTRY_POINT_GROUP}" + ("; " + "; ".join(why) if why else "")
        return MissingProvider(f"no LLM provider {name!r} is installed ({where}); install kgreason with its "
                               "[llm] extra, or register a provider (docs/layout.md)")
    _REGISTERED[name] = found
    return found
