"""Shared pieces of the command-line interfaces: the argparse parser, the settings dataclasses and option checks.

Every CLI builds its parser with :class:`ArgumentParser` (mistakes become one
:class:`~kgreason.errors.UserError` line, exit status 2 via
:func:`~kgreason.errors.cli_main`) and parses its flags into one frozen settings
dataclass whose fields declare the flags (:func:`setting`: name, type, default,
range, choices, help, written once); :func:`add_settings_arguments` adds them to
the parser and :func:`settings_from_args` builds the dataclass, whose
construction runs the range checks (:class:`Settings`), so that the same mistake
reads the same everywhere::

    @dataclass(frozen=True, kw_only=True)
    class SampleSettings(Settings):
        artifact: Path = setting(help="artifact folder")                     # no default: required
        per_structure: int = setting(1000, low=1, integer=True, help="queries per structure")
        seed: int = setting(0, low=0, high=SEED_MAX, integer=True, help="random seed")

    p = ArgumentParser(prog="python -m engine.sample")
    add_settings_arguments(p, SampleSettings)
    settings = settings_from_args(SampleSettings, p.parse_args(argv))

``--seed`` and ``--device`` are checked by :func:`check_seed` and :func:`check_device`
(a field's ``check=``).  The naming rule of the dataclasses is in docs/cli.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import re
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, NoReturn, Sequence

from kgreason.errors import UserError, printable

__all__ = ["ArgumentParser", "printable", "check_seed", "check_device", "SEED_MAX", "Flag", "setting", "Settings",
           "same_setting", "flag_of", "choices_of", "flag_name", "flag_names", "flag_fields", "field_default", "number_problem", "value_problem",
           "check_settings", "QuietSettings", "verify_setting", "SKIP_CHECKSUMS_FLAG", "SKIP_CHECKSUMS_HELP", "add_settings_arguments", "settings_values", "settings_from_args", "default_help"]

#: Largest seed accepted (numpy's legacy seeding, used by pykeen, takes 32-bit seeds).
SEED_MAX = 2**32 - 1


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports mistakes as one :class:`UserError` line, user text escaped
    (:func:`~kgreason.errors.printable`; :func:`~kgreason.errors.cli_main` escapes every message again).

    ``prefix_prog=True`` starts the message with the program name (``python -m engine.betae: ...``).
    """

    def __init__(self, *args, prefix_prog: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prefix_prog = prefix_prog

    def error(self, message: str) -> NoReturn:
        message = printable(message)
        raise UserError(f"{self.prog}: {message}" if self._prefix_prog else message)


def check_seed(value: int, flag: str = "--seed") -> int:
    """``value`` if it is a valid random seed (0 <= seed <= 2**32 - 1), else a :class:`UserError` naming ``flag``."""
    if not 0 <= value <= SEED_MAX:
        raise UserError(f"{flag} must be in [0, {SEED_MAX}], got {value}")
    return value


_CUDA = re.compile(r"cuda(?::(\d+))?")


def check_device(value: str, flag: str = "--device", *, allow_auto: bool = False) -> str:
    """``value`` if it names a usable torch device (``cpu``, ``cuda``, ``cuda:N``; ``auto`` when
    ``allow_auto``), else a one-line :class:`UserError` naming ``flag`` and the valid choices.

    ``cuda``/``cuda:N`` need a CUDA device (N below the number of devices).
    """
    choices = (["auto"] if allow_auto else []) + ["cpu", "cuda", "cuda:N"]
    text = value
    if text == "cpu" or (allow_auto and text == "auto"):
        return text
    m = _CUDA.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise UserError(f"{flag}: unknown device {value!r}; choose from {', '.join(choices)}")
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"{flag} {text}: CUDA is not available on this machine; use {flag} cpu")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise UserError(f"{flag} {text}: no such CUDA device (this machine has {n}: cuda:0..cuda:{n - 1})")
    return text


# ------------------------------------------------------------------------------------------ settings
# The one rule of every CLI: its flags parse into one frozen dataclass (named ``*Settings``; a library
# configuration that a CLI parses straight into keeps its ``*Config`` name: docs/cli.md, "Settings classes").
# Each field that has a flag is declared with :func:`setting`: the flag's name, help, choices and range sit
# next to the default, written once.  :func:`add_settings_arguments` makes the argparse flags of them,
# :func:`settings_from_args` the dataclass of the parsed flags, and :func:`check_settings` (called by the
# dataclass's ``__post_init__``, through :class:`Settings`) is the one range check, whichever way the
# dataclass was built.  tests/test_cli_settings.py checks every CLI's parser against its dataclass.

_FLAG_KEY = "kgreason.cli"


@dataclass(frozen=True)
class Flag:
    """What a settings field's command-line flag looks like (the field's default is the flag's).

    ``flag``: its name (default ``--`` + the field's name with ``-`` for ``_``); ``negate``: a bool field that
    defaults to True set to False by the flag (``--no-progress`` for ``progress``); ``low``/``high`` (with
    ``low_open``/``high_open``): the range of a number; ``integer``: an int range (bools refused);
    ``choices``: the allowed values, or a function returning them (for a constant whose module is
    imported only when the flags are used: ``ops.fuzzy.TNORMS`` loads torch); ``nargs``: ``"+"`` for a tuple field (the default), or ``repeat``: the flag
    repeated, one value each (``--from A --from B``); ``type``: the argparse conversion
    (default: the field's annotated type); ``shown_default``: the help's default where the value alone does
    not say it (``"all"`` for None; a function for a constant read late, as ``choices``); ``check``: one more check, ``check(value, flag)`` raising
    :class:`UserError` (:func:`check_seed`, :func:`check_device`); ``boolean_optional``: a bool with both
    ``--x`` and ``--no-x``; ``command_line=False``: a setting checked like the others but without a flag.
    """

    help: str
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[Any, ...] | Callable[[], Sequence[Any]] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    nargs: str | None = None
    repeat: bool = False
    type: Callable[[str], Any] | None = None
    negate: bool = False
    boolean_optional: bool = False
    shown_default: str | Callable[[], str] | None = None
    check: Callable[[Any, str], Any] | None = None
    command_line: bool = True


def setting(default: Any = MISSING, *, help: str, default_factory: Any = MISSING, **flag: Any) -> Any:
    """A dataclass field with a command-line flag (:class:`Flag`'s keywords); no default = a required flag."""
    meta = {_FLAG_KEY: Flag(help=help, **flag)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def same_setting(cls: type, name: str, *, default: Any = MISSING, **changes: Any) -> Any:
    """A new field declared as ``cls``'s field ``name`` (default, flag, range, help), with ``changes`` to its
    :class:`Flag` and optionally another ``default``: two CLIs sharing a setting declare it once."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    spec = flag_of(f)
    assert spec is not None, f"{cls.__name__}.{name} has no flag"
    value = field_default(f) if default is MISSING else default
    return field(default=value, metadata={_FLAG_KEY: dataclasses.replace(spec, **changes)})


def flag_of(f: dataclasses.Field) -> Flag | None:
    """The :class:`Flag` of a dataclass field declared with :func:`setting`, else None."""
    return f.metadata.get(_FLAG_KEY)


def flag_name(f: dataclasses.Field) -> str:
    """The flag of a field declared with :func:`setting` (``--max-answers`` for ``max_answers``)."""
    spec = flag_of(f)
    if spec is not None and spec.flag is not None:
        return spec.flag
    return "--" + f.name.replace("_", "-")


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of the dataclass ``cls`` that have a flag, in declaration order."""
    return [f for f in dataclasses.fields(cls) if (spec := flag_of(f)) is not None and spec.command_line]


def flag_names(cls: type) -> dict[str, str]:
    """Field name -> flag, for every field of ``cls`` that has one."""
    return {f.name: flag_name(f) for f in flag_fields(cls)}


def field_default(f: dataclasses.Field) -> Any:
    """The default of a dataclass field (its factory called), or :data:`dataclasses.MISSING`."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def number_problem(value: Any, *, integer: bool, low: float = -math.inf, high: float = math.inf,
                   low_open: bool = False, high_open: bool = False, optional: bool = False) -> str | None:
    """What is wrong with ``value`` as a number in ``[low, high]`` (``(`` / ``)`` with ``low_open`` /
    ``high_open``), or None: the one wording of a range error.

    ``must be an integer, got 2.5`` / ``must be a number, got 'x'`` for the wrong type, else
    ``must be >= 1, got 0`` (a closed lower bound alone) or ``must be in [0, 1], got 1.5``; non-finite values
    are out of range.  ``optional``: None is fine.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        return f"must be {'an integer' if integer else 'a number'}, got {value!r}"
    try:
        v = float(value)
    except OverflowError:  # an integer beyond float's range (a 400-digit --seed)
        v = math.copysign(math.inf, value)
    inside = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if math.isfinite(v) and inside:
        return None
    def bound(x: float) -> str:  # an integer range's bounds in full (a seed's 4294967295, not 4.29497e+09)
        return str(int(x)) if integer and math.isfinite(x) and float(x).is_integer() else f"{x:g}"

    if high == math.inf and not low_open:
        return f"must be >= {bound(low)}, got {value!r}"
    lo, hi = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    return f"must be in {lo}{bound(low)}, {bound(high)}{hi}, got {value!r}"


def choices_of(spec: Flag) -> tuple[Any, ...] | None:
    """The allowed values of a flag (``spec.choices``, called if it is a function), or None."""
    return tuple(spec.choices() if callable(spec.choices) else spec.choices) if spec.choices is not None else None


def value_problem(f: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with ``value`` for the field ``f`` by its :class:`Flag` (range, choices), or None.

    None is fine for a field whose default is None; a tuple is checked element by element."""
    spec = flag_of(f)
    if spec is None or (value is None and f.default is None):
        return None
    if isinstance(value, tuple) and spec.nargs:
        return next((p for p in (value_problem(f, v) for v in value) if p), None)
    choices = choices_of(spec)
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
    if spec.low is not None or spec.high is not None:
        return number_problem(value, integer=spec.integer,
                              low=-math.inf if spec.low is None else spec.low,
                              high=math.inf if spec.high is None else spec.high,
                              low_open=spec.low_open, high_open=spec.high_open)
    return None


def check_settings(settings: Any) -> None:
    """Check every flagged field of the dataclass instance ``settings`` (:func:`value_problem`, then the
    field's own ``check``): a :class:`UserError` ``--FLAG must be ..., got ...`` for the first bad one."""
    for f in dataclasses.fields(settings):
        if flag_of(f) is None:
            continue
        value = getattr(settings, f.name)
        problem = value_problem(f, value)
        if problem:
            raise UserError(f"{flag_name(f)} {problem}")
        spec = flag_of(f)
        if spec is not None and spec.check is not None and value is not None:
            spec.check(value, flag_name(f))


class Settings:
    """Base of the ``*Settings`` dataclasses: construction runs :func:`check_settings`, so settings built in
    code fail the same check, with the same words, as the flags.  A subclass with its own ``__post_init__``
    calls ``super().__post_init__()`` first."""

    def __post_init__(self) -> None:
        check_settings(self)


#: The flag that loads an artifact without checking its files' sha256 (every artifact reader has it).
SKIP_CHECKSUMS_FLAG = "--skip-artifact-checksums"
SKIP_CHECKSUMS_HELP = ("do not verify the sha256 of the artifact's files against meta.json (faster on large "
                       "artifacts; the finite-value and shape checks still run)")


def verify_setting() -> Any:
    """The ``verify: bool`` field of an artifact reader's settings: True unless ``--skip-artifact-checksums``."""
    return setting(True, flag=SKIP_CHECKSUMS_FLAG, negate=True, help=SKIP_CHECKSUMS_HELP)


@dataclass(frozen=True, kw_only=True)
class QuietSettings(Settings):
    """``--quiet`` of the tools that print progress and a summary (``kge.build``, ``kge.materialize``)."""

    progress: bool = setting(True, flag="--quiet", negate=True, help="print nothing but errors")


def _field_type(cls: type, f: dataclasses.Field) -> tuple[Any, bool]:
    """(the conversion of one command-line value, whether the field is a tuple) of ``f``'s annotation."""
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    hint = args[0] if len(args) == 1 else str
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    return str(value)


def default_help(f: dataclasses.Field) -> str:
    """The help of ``f``'s flag, ending in its default (``(default 10)``; ``shown_default`` where given)."""
    spec = flag_of(f)
    assert spec is not None
    default = field_default(f)
    if spec.shown_default is not None:
        shown = spec.shown_default() if callable(spec.shown_default) else spec.shown_default
    elif default is MISSING or default is None or isinstance(default, bool):
        return spec.help  # required, "not given", or an on/off switch: the help says what it does
    else:
        shown = _shown(default)
    return f"{spec.help} (default {shown})" if spec.help else f"default {shown}"


def add_settings_arguments(parser: Any, cls: type, *, unset: bool = False, only: Sequence[str] | None = None,
                           skip: Sequence[str] = ()) -> None:
    """Add a flag to ``parser`` (a parser or an argument group) for every flagged field of ``cls``.

    Each flag's dest is its name without the dashes (``--llm-timeout``: ``llm_timeout``), its default the
    field's, shown in the help.  ``unset``: every flag defaults to None instead ("not given"), for settings
    that another source fills in (:func:`settings_from_args` drops the Nones; the LLM client reads the
    environment); the help still shows the field's default.  ``only``: just these fields; ``skip``: all but
    these (to put some in an argument group).
    """
    for f in flag_fields(cls):
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        spec = flag_of(f)
        assert spec is not None
        name = flag_name(f)
        dest = name[2:].replace("-", "_")
        default = field_default(f)
        kw: dict[str, Any] = {"dest": dest, "help": default_help(f)}
        if spec.metavar is not None:
            kw["metavar"] = spec.metavar
        kind, many = _field_type(cls, f)
        if kind is bool:
            if spec.boolean_optional:
                kw.update(action=argparse.BooleanOptionalAction, default=None if unset else default)
            else:  # --x sets True (default False); a negated field's --no-x sets True into its own dest
                if default is not False and not spec.negate:
                    raise TypeError(f"{cls.__name__}.{f.name}: a bool flag defaulting to {default!r} needs "
                                    "negate=True (and a --no-... flag) or boolean_optional=True")
                kw.update(action="store_true", default=None if unset else False)
        else:
            kw.update(type=spec.type or kind, default=None if unset or default is MISSING else default)
            if spec.choices is not None:
                kw["choices"] = list(choices_of(spec) or ())
            if spec.repeat:
                kw["action"] = "append"
            elif many or spec.nargs:
                kw["nargs"] = spec.nargs or "+"
                if kw["default"] is not None:
                    kw["default"] = list(kw["default"])
            if default is MISSING:
                kw["required"] = True
        action = parser.add_argument(name, **kw)
        action.setting = (cls, f.name)  # read by tests/test_cli_settings.py


def settings_values(cls: type, ns: argparse.Namespace) -> dict[str, Any]:
    """The values of ``cls``'s flagged fields in ``ns`` (parsed by :func:`add_settings_arguments`), by field
    name; a flag that was not given under ``unset`` is left out, a negated flag turned back into its field."""
    values: dict[str, Any] = {}
    for f in flag_fields(cls):
        spec = flag_of(f)
        assert spec is not None
        dest = flag_name(f)[2:].replace("-", "_")
        if not hasattr(ns, dest):
            continue
        value = getattr(ns, dest)
        if spec.negate:
            value = None if value is None else (not value if value else field_default(f))
        if value is None and field_default(f) is not None:
            continue  # unset: the default (or the other source) stays
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return values


def settings_from_args(cls: type, ns: argparse.Namespace, **extra: Any) -> Any:
    """``cls`` of the parsed flags in ``ns`` (:func:`settings_values`) and ``extra`` (fields without a flag,
    or values the CLI derived); its checks raise the one-line errors naming the flags."""
    return cls(**{**settings_values(cls, ns), **extra})
