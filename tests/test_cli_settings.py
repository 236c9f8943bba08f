"""Every CLI's flags match its settings dataclass (docs/cli.md, "Settings classes"): names, defaults, types,
choices and ranges, each written once, with the field (:func:`kgreason.cli.setting`).

:data:`CLIS` lists the converted CLIs (module -> its parser, the settings classes its flags come from, and
the few flags that are no settings field); :data:`NOT_CONVERTED` the ones still to do, each naming its issue.
A CLI module in neither list fails :func:`test_every_cli_is_listed`, so a new tool cannot skip the rule.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import typing
from pathlib import Path

import pytest

from kgreason.cli import (ArgumentParser, choices_of, field_default, flag_fields, flag_name, flag_of, settings_from_args,
                          value_problem)
from kgreason.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

#: The CLIs not yet built from their settings (shrink this list as they are converted).
NOT_CONVERTED = {
    "experiments.metaqa_ask": "issue 31 (Ask, round two): the ask loop's MetaQA runner, with engine.ask",
}


def _llm_classes():
    from llm_bridge.cli import LLMSettings
    from llm_bridge.config import LGOTConfig, LLMConfig

    return [LLMConfig, LGOTConfig, LLMSettings]


def _local_parse(argv):
    from llm_bridge.local import LocalSettings, _parser

    return settings_from_args(LocalSettings, _parser().parse_args(argv))


#: module -> (settings classes, of which those whose flags are "unset" (None until given), the flags that are
#: no settings field, the arguments every command needs, the parse function's dotted name)
CLIS = {
    "engine.answer": (lambda: [_mod("engine.answer").AnswerSettings, *_llm_classes()], 3,
                      {"--llm": "the switch that turns the LLM settings on",
                       "--llm-api-key-env": "names the variable holding the key (a key is never a flag)"},
                      ["--expr", "(p r e)", "--llm"], "parse_args"),
    "engine.ask": (lambda: [_mod("engine.ask").AskConfig, _mod("llm_bridge.config").LLMConfig], 1,
                   {"--llm": "the switch that turns the LLM settings on",
                    "--llm-api-key-env": "names the variable holding the key (a key is never a flag)"},
                   ["q", "--llm"], "parse_args"),
    "engine.evaluate": (lambda: [_mod("engine.evaluate").EvaluateSettings], 0, {}, ["--artifact", "a", "--queries", "q"],
                        "parse_args"),
    "engine.sample": (lambda: [_mod("engine.sample").SampleSettings], 0, {}, ["--artifact", "a", "--out", "o.jsonl"],
                      "parse_args"),
    "engine.betae": (lambda: [_mod("engine.betae").BetaESettings], 0, {}, ["--queries", "q", "--folder", "f"],
                     "parse_args"),
    "engine.paths.__main__": (lambda: [_mod("engine.paths.__main__").PathsSettings], 0, {},
                              ["--artifact", "a", "--from", "e", "--plan", "r"], "parse_args"),
    "kge.build": (lambda: [_mod("kge.build_config").BuildConfig, _mod("kge.build_config").BuildTrainSettings,
                           _mod("kgreason.cli").QuietSettings], 0, {}, ["--kg", "k", "--out", "o"], "parse_args"),
    "kge.linkpred": (lambda: [_mod("kge.linkpred").LinkPredSettings], 0, {}, ["--artifact", "a", "--kg", "k"],
                     "parse_args"),
    "kge.materialize": (lambda: [_mod("kge.materialize").MaterializeConfig, _mod("kgreason.cli").QuietSettings], 0, {},
                        ["--artifact", "a", "--out", "o"], "parse_args"),
    "kge.shard": (lambda: [_mod("kge.shard").ShardSettings, _mod("kgreason.cli").QuietSettings], 0, {},
                  ["--artifact", "a", "--shards", "2", "--out", "o"], "parse_args"),
    "experiments.lgot_eval": (lambda: [_mod("experiments.lgot_eval").LGOTEvalSettings, _mod("llm_bridge.config").LLMConfig],
                              1, {"--llm-api-key-env": "names the variable holding the key (a key is never a flag)"},
                              ["--artifact", "a", "--out", "o"], "parse_args"),
    "experiments.linkeval": (lambda: [_mod("experiments.linkeval").LinkEvalSettings], 0, {},
                             ["--kb", "kb.txt", "--out", "r.md"], "parse_args"),
    "experiments.metaqa_lgot": (lambda: [_mod("experiments.metaqa_lgot").MetaQALGOTSettings], 0, {},
                                ["--artifact", "a", "--metaqa", "m", "--out", "o"], "parse_args"),
    "experiments.simulate": (lambda: [_mod("experiments.simulate").SimulateSettings,
                                      _mod("experiments.simulate").SimulatorConfig], 0, {},
                             ["--artifact", "a"], "parse_args"),
    "experiments.simulate_ask": (lambda: [_mod("experiments.simulate_ask").SimulateAskSettings,
                                          _mod("experiments.simulate_ask").AskSimConfig], 0, {},
                                 ["--artifact", "a", "--questions", "q"], "parse_args"),
    "experiments.synthetic_kg": (lambda: [_mod("experiments.synthetic_kg").SyntheticSettings], 0, {},
                                 ["--entities", "20", "--relations", "2", "--edges", "60", "--out", "o.tsv"],
                                 "parse_args"),
    "experiments.train_curve": (lambda: [_mod("experiments.train_curve").TrainCurveSettings], 0, {},
                                ["--artifact", "a", "--out", "o.png"], "parse_args"),
    "llm_bridge.local": (lambda: [_mod("llm_bridge.local").LocalSettings], 0, {}, [], None),
}


def _mod(name: str):
    return importlib.import_module(name)


def _parser(module: str) -> argparse.ArgumentParser:
    m = _mod(module)
    if hasattr(m, "_parser"):
        return m._parser()
    raise AssertionError(f"{module} has no _parser()")


def _parse(module: str):
    name = CLIS[module][4]
    return getattr(_mod(module), name) if name else _local_parse


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each flag's action, by its first option string (``--explain`` stands for ``--explain/--no-explain``)."""
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"}


def test_every_cli_is_listed():
    """Each library module with a ``__main__`` block is in CLIS or NOT_CONVERTED (and no name is stale)."""
    found = set()
    for package in ("engine", "kge", "llm_bridge", "kgreason", "experiments"):
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []:
            if 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    listed = set(CLIS) | set(NOT_CONVERTED)
    assert found - listed == set(), "CLI modules in neither CLIS nor NOT_CONVERTED"
    assert set(CLIS) - found == set(), "CLIS names modules that are no CLI"
    assert set(CLIS).isdisjoint(NOT_CONVERTED)


def flag_problems(parser: argparse.ArgumentParser, classes, unset=(), extras=()) -> list[str]:
    """What differs between ``parser``'s flags and the flagged fields of ``classes`` (``unset``: those whose
    flags default to None until given; ``extras``: flags that are no settings field), one line each."""
    problems: list[str] = []
    options = _options(parser)
    expected = {}
    for cls in classes:
        for f in flag_fields(cls):
            name = flag_name(f)
            if name in expected:
                problems.append(f"{name} is the flag of two fields")
            expected[name] = (cls, f)
    problems += [f"{o}: no settings field" for o in sorted(set(options) - set(expected) - set(extras))]
    problems += [f"{o}: a settings field without its flag" for o in sorted(set(expected) - set(options))]
    for name, (cls, f) in expected.items():
        if name not in options:
            continue
        action, spec = options[name], flag_of(f)
        if getattr(action, "setting", None) != (cls, f.name):
            problems.append(f"{name}: not made from {cls.__name__}.{f.name}")
        default = field_default(f)
        if cls in unset:
            want = None
        elif action.nargs in ("+", "*"):
            want = list(default) if default is not None else None
        elif isinstance(default, bool):
            want = default if spec.boolean_optional else False
        else:
            want = None if default is dataclasses.MISSING else default
        if action.default != want:
            problems.append(f"{name}: default {action.default!r}, the field's is {want!r}")
        if action.required != (default is dataclasses.MISSING and cls not in unset):
            problems.append(f"{name}: required is {action.required}")
        if not isinstance(default, bool):
            hint = typing.get_type_hints(cls)[f.name]
            kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
            kinds = [typing.get_args(k)[0] if typing.get_origin(k) is tuple else k for k in kinds]
            if action.type not in ([spec.type] if spec.type else kinds):
                problems.append(f"{name}: type {action.type} for {hint}")
        if spec.choices is not None and tuple(action.choices or ()) != choices_of(spec):
            problems.append(f"{name}: choices {action.choices}, the field's are {choices_of(spec)}")
        shown = spec.shown_default is not None or not (default is None or default is dataclasses.MISSING
                                                      or isinstance(default, bool))
        if shown and "default" not in (action.help or ""):
            problems.append(f"{name}: --help does not show the default")
    return problems


@pytest.mark.parametrize("module", sorted(CLIS))
def test_flags_are_the_settings_fields(module):
    """Every flag is one settings field's (or a listed exception), and every flagged field has its flag, with
    the field's default, type, choices and (for required fields) required; --help shows the default."""
    classes_of, unset_from, extras, _, _ = CLIS[module]
    classes = classes_of()
    unset = set(classes[1:]) if unset_from else set()
    assert flag_problems(_parser(module), classes, unset, extras) == []


def _outside(spec) -> list[float]:
    """Values just outside a flag's range."""
    out = []
    if spec.low is not None and math.isfinite(spec.low):
        out.append(spec.low if spec.low_open else spec.low - 1)
    if spec.high is not None and math.isfinite(spec.high):
        out.append(spec.high if spec.high_open else spec.high + 1)
    return out


@pytest.mark.parametrize("module", sorted(CLIS))
def test_ranges_are_checked_naming_the_flag(module, tmp_path, monkeypatch):
    """Each ranged flag refuses a value just outside its declared range with ``--FLAG must ...`` (the field's
    own check, whichever dataclass it belongs to), and accepts its bounds where they are inside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    classes_of, _, _, base, _ = CLIS[module]
    parse = _parse(module)
    checked = 0
    for cls in classes_of():
        for f in flag_fields(cls):
            spec = flag_of(f)
            for bad in _outside(spec):
                text = str(int(bad)) if spec.integer else repr(float(bad))
                with pytest.raises(UserError) as exc:
                    parse([*base, flag_name(f), text])
                assert str(exc.value).startswith(f"{flag_name(f)} must"), (module, flag_name(f), str(exc.value))
                assert value_problem(f, int(bad) if spec.integer else float(bad)) is not None
                checked += 1
    if module in ("engine.answer", "engine.evaluate", "engine.sample", "kge.build", "llm_bridge.local"):
        assert checked > 0  # these have ranged flags: the loop above ran


def test_planted_violations_fail_the_check():
    """The check finds a flag added by hand beside the generated ones, a flag whose default was retyped, a
    field left without its flag, and a help without the default."""
    from engine.betae import BetaESettings
    from kgreason.cli import add_settings_arguments

    p = ArgumentParser(prog="x")
    add_settings_arguments(p, BetaESettings)
    assert flag_problems(p, [BetaESettings]) == []
    p.add_argument("--hand-made", type=int, default=3)
    assert flag_problems(p, [BetaESettings]) == ["--hand-made: no settings field"]

    p = ArgumentParser(prog="x")
    add_settings_arguments(p, BetaESettings, skip=("negation",))
    p.add_argument("--negation", type=str, choices=["qto", "complement"], default="complement",
                   help="retyped (default qto)")
    assert flag_problems(p, [BetaESettings]) == ["--negation: not made from BetaESettings.negation",
                                                 "--negation: default 'complement', the field's is 'qto'"]

    p = ArgumentParser(prog="x")
    add_settings_arguments(p, BetaESettings, skip=("json",))
    assert flag_problems(p, [BetaESettings]) == ["--json: a settings field without its flag"]

    p = ArgumentParser(prog="x")
    add_settings_arguments(p, BetaESettings, skip=("negation",))
    action = p.add_argument("--negation", type=str, choices=["qto", "complement"], default="qto",
                            help="how negations become ASTs")
    action.setting = (BetaESettings, "negation")
    assert flag_problems(p, [BetaESettings]) == ["--negation: --help does not show the default"]


def test_a_setting_is_checked_the_same_from_code_and_flags():
    """Settings built in code run the same range check, with the same words, as the flags."""
    from engine.sample import SampleSettings, parse_args

    with pytest.raises(UserError, match=r"^--per-structure must be >= 1, got 0$"):
        SampleSettings(artifact=Path("a"), out=Path("o"), per_structure=0)
    with pytest.raises(UserError, match=r"^--per-structure must be >= 1, got 0$"):
        parse_args(["--artifact", "a", "--out", "o", "--per-structure", "0"])
