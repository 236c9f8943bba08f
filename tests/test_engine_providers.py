"""engine.providers: the engine's CLIs find their LLM provider by name (issue 33, "arrows down only").

Lookup order: registered in the process, the entry point of group ``kgreason.llm_providers``, the default
module by name; without any, runs without ``--llm`` are unchanged and ``--llm`` is one error line.
"""
from __future__ import annotations

import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from engine import providers

ROOT = Path(__file__).resolve().parents[1]


class _Recording:
    """A provider that records which of its methods the CLIs called (and hands over to the bridge's)."""

    def __init__(self) -> None:
        from llm_bridge.provider import PROVIDER

        self.inner = PROVIDER
        self.calls: list[str] = []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.inner, name)


FAKE = _Recording()


@pytest.fixture
def lookups(monkeypatch):
    """A clean registry and a controllable entry point list: {"eps": [EntryPoint, ...]}."""
    state: dict = {"eps": []}
    monkeypatch.setattr(providers, "_REGISTERED", {})
    monkeypatch.delenv("KGREASON_LLM_PROVIDER", raising=False)
    monkeypatch.setattr(providers, "entry_points",
                        lambda group, name: [ep for ep in state["eps"] if ep.group == group and ep.name == name])
    return state


def _ep(value: str, name: str = "llm_bridge") -> EntryPoint:
    return EntryPoint(name=name, value=value, group=providers.ENTRY_POINT_GROUP)


def test_setup_declares_the_bridge_entry_point_and_it_loads():
    text = (ROOT / "setup.py").read_text(encoding="utf-8")
    m = re.search(r'"kgreason\.llm_providers":\s*\["llm_bridge = ([\w.:]+)"\]', text)
    assert m is not None, "setup.py declares no llm_bridge entry point in kgreason.llm_providers"
    from llm_bridge.provider import PROVIDER

    assert _ep(m.group(1)).load() is PROVIDER


def test_entry_point_first_then_the_default_module(lookups):
    lookups["eps"] = [_ep("test_engine_providers:FAKE")]
    assert providers.llm_provider() is FAKE
    assert providers.llm_provider() is FAKE  # remembered
    providers.unregister("llm_bridge")
    lookups["eps"] = []  # no metadata (a checkout): llm_bridge.provider by name
    from llm_bridge.provider import PROVIDER

    assert providers.llm_provider() is PROVIDER


def test_the_cli_goes_through_the_provider(lookups):
    """engine.answer and engine.ask ask the provider for their flags and options (no llm_bridge import)."""
    from engine.answer import parse_args as answer_args
    from engine.ask import parse_args as ask_args

    lookups["eps"] = [_ep("test_engine_providers:FAKE")]
    FAKE.calls.clear()
    assert answer_args(["--expr", "(p r A)"]).llm is None
    assert ask_args(["who is [A]?"]).llm is None
    assert FAKE.calls == ["add_answer_arguments", "answer_options", "add_client_arguments", "refuse_llm_flags"]
    cfg = answer_args(["--expr", "(p r A)", "--llm", "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-model", "m"])
    assert cfg.llm.config.model == "m"


@pytest.mark.parametrize("why, setup", [
    ("no entry point 'llm_bridge' in the group kgreason.llm_providers; module no_such_provider_xyz cannot be "
     "imported", lambda st, mp: mp.setitem(providers.DEFAULT_MODULES, "llm_bridge", "no_such_provider_xyz")),
    ("its entry point 'no_such_provider_xyz:P' does not load (ModuleNotFoundError",
     lambda st, mp: (st.__setitem__("eps", [_ep("no_such_provider_xyz:P")]),
                     mp.setitem(providers.DEFAULT_MODULES, "llm_bridge", "no_such_provider_xyz"))),
])
def test_no_provider_keeps_kg_runs_and_refuses_llm_in_one_line(lookups, monkeypatch, capsys, why, setup):
    from engine import answer, ask

    setup(lookups, monkeypatch)
    assert isinstance(providers.llm_provider(), providers.MissingProvider)
    assert answer.parse_args(["--expr", "(p r A)"]).llm is None  # runs without --llm: unchanged
    assert ask.parse_args(["who is [A]?"]).llm is None
    for main, argv in ((answer.main, ["--expr", "(p r A)", "--llm"]), (ask.main, ["who is [A]?", "--llm"])):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --llm: no LLM provider 'llm_bridge' is installed (") and why in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert ask.main(["who is [A]?", "--no-llm-reasoner"]) == 2  # the --llm rule holds without a provider
    assert capsys.readouterr().err == "error: --no-llm-reasoner needs --llm\n"


def test_another_provider_by_name(lookups, monkeypatch):
    lookups["eps"] = [_ep("test_engine_providers:FAKE", name="recording")]
    monkeypatch.setenv("KGREASON_LLM_PROVIDER", "recording")
    assert providers.llm_provider() is FAKE
    missing = providers.llm_provider("nope")  # no default module for another name
    assert isinstance(missing, providers.MissingProvider) and "no LLM provider 'nope'" in missing.reason
