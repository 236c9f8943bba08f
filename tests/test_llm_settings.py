"""The LLM bridge's settings have one home (llm_bridge.config): every entry point reaches the same default
and fails the same check with the same words, naming the field (Python) or the flag (a CLI)."""
from __future__ import annotations

import dataclasses

import pytest

from kgreason.cli import ArgumentParser
from kgreason.errors import UserError
from llm_bridge.config import LGOTSettings, LLMConfig, SettingError, config_from_args, from_flags, number_problem

BASE = ["--llm", "--llm-base-url", "http://127.0.0.1:1/v1", "--llm-model", "m"]

# (LGOTSettings field, engine.answer flag, text on the command line, the value from Python, the check's words)
LGOT_CASES = [
    ("theta", "--llm-theta", "2", 2.0, "must be in [0, 1], got 2.0"),
    ("theta", "--llm-theta", "nan", float("nan"), "must be in [0, 1], got nan"),
    ("alpha", "--llm-alpha", "-0.5", -0.5, "must be in [0, 1], got -0.5"),
    ("alpha", "--llm-alpha", "inf", float("inf"), "must be in [0, 1], got inf"),
    ("input_ratio", "--llm-input-ratio", "1.5", 1.5, "must be in [0, 1], got 1.5"),
    ("check_penalty", "--llm-check-penalty", "-0.1", -0.1, "must be in [0, 1], got -0.1"),
    ("inputs", "--llm-inputs", "11", 11, "must be in [1, 10], got 11"),
    ("inputs", "--llm-inputs", "0", 0, "must be in [1, 10], got 0"),
    ("answer_check", "--llm-answer-check", "11", 11, "must be in [0, 10], got 11"),
    ("link_threshold", "--llm-link-threshold", "101", 101.0, "must be in [0, 100], got 101.0"),
]


def _engine_options(argv):
    from llm_bridge.cli import add_arguments, options_from_args

    parser = ArgumentParser(prog="t")
    add_arguments(parser)
    return options_from_args(parser.parse_args(argv), top_k=10)


@pytest.mark.parametrize("field,flag,text,value,words", LGOT_CASES, ids=[f"{c[0]}={c[2]}" for c in LGOT_CASES])
def test_each_bad_lgot_value_fails_one_check_from_every_entry_point(field, flag, text, value, words, capsys):
    from engine.answer import main
    from llm_bridge.lgot import LGOTHook

    # Python keyword: the settings, as LGOTHook(settings=...) and Engine.load(hooks=[...]) receive them
    with pytest.raises(SettingError) as exc:
        LGOTSettings(**{field: value})
    assert str(exc.value) == f"LGOT settings: {field} {words}"
    with pytest.raises(SettingError) as exc:
        LGOTHook(client=None, settings=LGOTSettings(**{field: value}))
    assert str(exc.value) == f"LGOT settings: {field} {words}"
    # the engine's --llm-* flag: the same check, the flag named
    with pytest.raises(UserError) as exc:
        _engine_options(BASE + [flag, text])
    assert str(exc.value) == f"{flag} {words}"
    assert main(["--expr", "(p r e)", *BASE, flag, text]) == 2  # refused before any artifact is loaded
    assert capsys.readouterr().err == f"error: {flag} {words}\n"


@pytest.mark.parametrize("argv,message", [
    (["--theta", "0.3", "2"], "--theta must be in [0, 1], got 2.0"),
    (["--alpha", "-1"], "--alpha must be in [0, 1], got -1.0"),
    (["--answer-check", "11"], "--answer-check must be in [0, 10], got 11"),
])
def test_experiment_flags_use_the_settings_checks(argv, message, tmp_path):
    from experiments.lgot_eval import parse_args

    with pytest.raises(UserError) as exc:
        parse_args(["--artifact", str(tmp_path), "--out", str(tmp_path / "o"), *argv])
    assert str(exc.value) == message


@pytest.mark.parametrize("argv,message", [
    (["--theta", "1.5"], "--theta must be in [0, 1], got 1.5"),
    (["--alpha", "nan"], "--alpha must be in [0, 1], got nan"),
    (["--input-ratio", "-0.2"], "--input-ratio must be in [0, 1], got -0.2"),
])
def test_metaqa_experiment_flags_use_the_settings_checks(argv, message, tmp_path):
    from experiments.metaqa_lgot import parse_args

    with pytest.raises(UserError) as exc:
        parse_args(["--artifact", str(tmp_path), "--metaqa", str(tmp_path), "--out", str(tmp_path / "o"), *argv])
    assert str(exc.value) == message


def test_every_entry_point_takes_the_settings_defaults(tmp_path):
    from experiments import lgot_eval as experiment, metaqa_lgot as metaqa_experiment

    d = LGOTSettings()
    assert _engine_options(BASE).settings == d
    m = {f.name: f.default for f in dataclasses.fields(metaqa_experiment.MetaQAArgs)}
    assert (m["theta"], m["alpha"], m["merge"], m["input_ratio"]) == (d.theta, d.alpha, d.merge, d.input_ratio)
    p = metaqa_experiment._parser().parse_args(["--artifact", "a", "--metaqa", "m", "--out", "o"])
    assert (p.theta, p.alpha, p.merge, p.input_ratio) == (d.theta, d.alpha, d.merge, d.input_ratio)
    (tmp_path / "art").mkdir()
    e = experiment.parse_args(["--artifact", str(tmp_path / "art"), "--out", str(tmp_path / "o")])
    assert e.theta == (d.theta,) and e.alpha == (d.alpha,) and e.answer_check == d.answer_check


# (LLMConfig field, flag, text, Python value, words): the client's settings follow the same rule
LLM_CASES = [
    ("deadline_s", "--llm-deadline", "0", 0.0, "must be in (0, inf), got 0.0"),
    ("timeout_s", "--llm-timeout", "-1", -1.0, "must be in (0, inf), got -1.0"),
    ("temperature", "--llm-temperature", "3", 3.0, "must be in [0, 2], got 3.0"),
    ("n", "--llm-n", "0", 0, "must be in [1, 128], got 0"),
    ("concurrency", "--llm-concurrency", "0", 0, "must be in [1, 4096], got 0"),
]


@pytest.mark.parametrize("field,flag,text,value,words", LLM_CASES, ids=[c[0] for c in LLM_CASES])
def test_each_bad_client_value_fails_one_check(field, flag, text, value, words):
    from llm_bridge.config import add_llm_arguments

    with pytest.raises(SettingError) as exc:
        LLMConfig(**{field: value})
    assert str(exc.value) == f"LLM config: {field} {words}"
    parser = ArgumentParser(prog="t")
    add_llm_arguments(parser)
    with pytest.raises(UserError) as exc:
        config_from_args(parser.parse_args(["--llm-model", "m", flag, text]), env={})
    assert str(exc.value) == f"{flag} {words}"


def test_from_flags_names_only_values_that_came_from_a_flag():
    with pytest.raises(UserError) as exc:
        from_flags(LGOTSettings, {"alpha": 2.0}, {"alpha": "--alpha"})
    assert str(exc.value) == "--alpha must be in [0, 1], got 2.0"
    with pytest.raises(UserError) as exc:  # no flag for the field: the field's own words
        from_flags(LGOTSettings, {"max_answers": 0}, {"alpha": "--alpha"})
    assert str(exc.value) == "LGOT settings: max_answers must be in [1, 100], got 0"


@pytest.mark.parametrize("value,kw,expected", [
    (0.5, dict(integer=False, low=0, high=1), None),
    (True, dict(integer=False, low=0, high=1), "must be a number, got True"),
    ("x", dict(integer=False, low=0, high=1), "must be a number, got 'x'"),
    (0, dict(integer=False, low=0, low_open=True), "must be in (0, inf), got 0"),
    (2.5, dict(integer=True, low=0, high=10), "must be an integer, got 2.5"),
    (11, dict(integer=True, low=0, high=10), "must be in [0, 10], got 11"),
    (None, dict(integer=True, low=0, optional=True), None),
    (None, dict(integer=True, low=0), "must be an integer, got None"),
])
def test_number_problem(value, kw, expected):
    assert number_problem(value, **kw) == expected
