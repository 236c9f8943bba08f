"""One rule for the LLM flags of every CLI (issue 33): without ``--llm`` an LLM flag is refused, one error line
naming it and ``--llm``; ``--no-llm-cache`` included (``engine.ask`` accepted it silently, ``engine.answer``
refused it).  A CLI without an ``--llm`` switch always runs an LLM, so there the flag is taken."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Every CLI with the client's flags (llm_bridge.config.add_llm_arguments, --no-llm-cache among them):
#: module -> whether it has an --llm switch (the rule applies) or always runs an LLM.
CLIS = {"engine.answer": True, "engine.ask": True, "experiments.lgot_eval": False}
#: Arguments each switch CLI parses up to its LLM checks (no artifact is loaded before them).
BASE = {"engine.answer": ["--expr", "(p r A)"], "engine.ask": ["who is [A]?"]}


#: The methods of the engine's LLM provider (engine.providers) that add the flags.
PROVIDER_ADDERS = ("add_answer_arguments", "add_client_arguments")


def _adds_llm_flags(path: Path) -> bool:
    """Whether the module calls add_llm_arguments or llm_bridge.cli.add_arguments (imported under any name),
    or an LLM provider's adders (``llm_provider().add_answer_arguments(p)``: the engine's CLIs)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and n.module in ("llm_bridge.config", "llm_bridge.cli", "config", "cli") for a in n.names
             if a.name in ("add_llm_arguments", "add_arguments")}
    return any(isinstance(n, ast.Call) and ((isinstance(n.func, ast.Name) and n.func.id in names)
                                            or (isinstance(n.func, ast.Attribute) and n.func.attr in PROVIDER_ADDERS))
               for n in ast.walk(tree))


def test_the_list_holds_every_cli_with_the_llm_flags():
    # where the flags are added, and the provider handing over to them
    defining = {ROOT / "llm_bridge" / "cli.py", ROOT / "llm_bridge" / "config.py", ROOT / "llm_bridge" / "provider.py",
                ROOT / "engine" / "providers.py"}
    found = {".".join(path.relative_to(ROOT).with_suffix("").parts)
             for top in ("kgreason", "ops", "kge", "engine", "llm_bridge", "experiments")
             for path in (ROOT / top).rglob("*.py")
             if path not in defining and _adds_llm_flags(path)}
    assert found == set(CLIS), f"CLIs with the LLM flags: {sorted(found)}; the rule's list: {sorted(CLIS)}"


@pytest.mark.parametrize("module", [m for m, switch in CLIS.items() if switch])
@pytest.mark.parametrize("flags, named", [
    (["--no-llm-cache"], "--no-llm-cache"),
    (["--llm-cache", "x.sqlite"], "--llm-cache"),
    (["--llm-n", "2"], "--llm-n"),
    (["--no-llm-cache", "--llm-n", "2"], "--llm-n"),  # several: the first in the parser's order
])
def test_an_llm_flag_without_llm_is_one_error_line(module, flags, named, capsys):
    main = __import__(module, fromlist=["main"]).main
    assert main(BASE[module] + flags) == 2
    err = capsys.readouterr().err
    assert err == f"error: {named} needs --llm\n", err


@pytest.mark.parametrize("module", [m for m, switch in CLIS.items() if switch])
def test_no_llm_cache_with_llm_turns_the_cache_off(module):
    from engine.answer import parse_args as answer_args
    from engine.ask import parse_args as ask_args

    parse = {"engine.answer": answer_args, "engine.ask": ask_args}[module]
    cfg = parse(BASE[module] + ["--llm", "--no-llm-cache"])
    config = cfg.llm.config if module == "engine.answer" else cfg.llm
    assert config.use_cache is False
    plain = parse(BASE[module] + ["--llm"])
    assert (plain.llm.config if module == "engine.answer" else plain.llm).use_cache is True


def test_a_cli_that_always_runs_an_llm_takes_no_llm_cache(tmp_path):
    from experiments.lgot_eval import parse_args

    art = tmp_path / "art"
    art.mkdir()
    args = parse_args(["--artifact", str(art), "--out", str(tmp_path / "out"), "--no-llm-cache"])
    assert args.llm.use_cache is False
    assert parse_args(["--artifact", str(art), "--out", str(tmp_path / "out")]).llm.use_cache is True
