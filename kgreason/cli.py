"""Shared pieces of the command-line interfaces: the argparse parser and option checks.

Every CLI builds its parser with :class:`ArgumentParser` (mistakes become one
:class:`~kgreason.errors.UserError` line, exit status 2 via
:func:`~kgreason.errors.cli_main`) and checks ``--seed`` and ``--device`` with
:func:`check_seed` and :func:`check_device`, so that the same mistake reads the
same everywhere.
"""
from __future__ import annotations

import argparse
import re
from typing import NoReturn

from kgreason.errors import UserError, printable

__all__ = ["ArgumentParser", "printable", "check_seed", "check_device", "SEED_MAX"]

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
