"""User-facing errors shared by every package and CLI.

A :class:`UserError` is a mistake in what the user gave us (a path, a name, a
query, a number).  CLIs print it as one line and exit with status 2; it never
ends in a traceback.  Programming errors stay ordinary exceptions.
"""
from __future__ import annotations

import difflib
import errno
import functools
import os
import sys
from typing import Callable, Iterable, Sequence

# The one rule for untrusted text on a terminal (kgreason.text), re-exported: messages quote user text.
from kgreason.text import printable

__all__ = ["UserError", "Terminated", "closest_names", "unknown_name", "cli_main", "printable", "os_error_message"]


class UserError(ValueError):
    """An error in user input, with a message that says what and where."""


class Terminated(BaseException):
    """SIGTERM arrived while a writer held temporary files (see :func:`kgreason.files.sigterm_raises`).

    A ``BaseException`` like ``KeyboardInterrupt``, so that ``except Exception``
    blocks do not swallow it while ``finally`` blocks still clean up.
    """


def closest_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` known names most similar to ``name`` (case-insensitive)."""
    known = list(known)
    lowered: dict[str, str] = {}
    for k in known:
        lowered.setdefault(k.lower(), k)
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.0)
    return [lowered[h] for h in hits]


def unknown_name(kind: str, name: str, known: Sequence[str], where: str = "") -> UserError:
    """A :class:`UserError` for an unknown ``kind`` (entity, relation, ...) naming the closest known ones."""
    close = closest_names(name, known)
    hint = f"; closest known: {', '.join(repr(c) for c in close)}" if close else ""
    loc = f"{where}: " if where else ""
    return UserError(f"{loc}unknown {kind} {name!r}{hint}")


def _error_lines(message: str) -> str:
    """A UserError's message as printed: :func:`printable`, except that a query parse error's
    echo and caret lines (``message\\n  echo\\n  ^``) stay lines, each made printable."""
    lines = message.split("\n")
    if len(lines) == 3 and lines[1].startswith("  ") and lines[2].startswith("  ") and lines[2].strip() == "^":
        return "\n".join(printable(line) for line in lines)
    return printable(message)


#: OS errors that are a property of where the user reads or writes, not a bug: errno -> (what, what to do).
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free space there or write the output elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota or write the output elsewhere"),
    errno.EROFS: ("read-only file system", "write the output elsewhere"),
    errno.EACCES: ("permission denied", "check the permissions or use another path"),
    errno.EPERM: ("operation not permitted", "check the permissions or use another path"),
    errno.EFBIG: ("file too large for the file system", "write the output to another file system"),
}


def os_error_message(exc: BaseException) -> str | None:
    """The one-line message of an OS error that is about a path the user chose (disk full, quota,
    read-only file system, permissions), naming ``exc.filename`` and what to do; None for any other
    error (a bug, which keeps its traceback).

    Writers attach the output's name to errors raised while writing to an open file, which carry
    none (:func:`kgreason.files.open_output`, :class:`kgreason.files.OutputFolder`).
    """
    if not isinstance(exc, OSError) or exc.errno not in _OS_ERRORS:
        return None
    what, todo = _OS_ERRORS[exc.errno]
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    where = f"{os.fsdecode(exc.filename)}: " if exc.filename not in (None, "") else ""
    return printable(f"{where}{what} ({name}); {todo}")


def cli_main(func: Callable[[Sequence[str] | None], int | None]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a CLI ``main(argv)`` so that user errors print one line and return 2.

    The message is printed with non-printable characters escaped (:func:`printable`,
    line by line), whatever user text it quotes.

    OS errors about the user's paths (ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EFBIG: a full disk
    while writing, a read-only folder) are one ``error:`` line naming the file and return 2
    (:func:`os_error_message`); a ``MemoryError`` is one line too.  This is the one place that
    maps them, so every CLI says the same.

    ``KeyboardInterrupt`` returns 130 and :class:`Terminated` (SIGTERM during a
    write) 143.  A closed stdout (``... | head``) ends the command quietly with
    status 1, as the Python documentation recommends for ``BrokenPipeError``.
    Anything else propagates (a bug, which deserves its traceback).
    """

    @functools.wraps(func)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            rc = func(argv)
            # Flush here: a reader that went away (``| head``) must show up inside
            # this try, not as an exception while the interpreter shuts down.
            sys.stdout.flush()
        except UserError as exc:  # user text in the message is escaped: never raw control characters
            print(f"error: {_error_lines(str(exc))}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            _stdout_to_devnull()
            return 1
        except OSError as exc:
            message = os_error_message(exc)
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            return 2
        except MemoryError:
            print("error: out of memory; use a smaller input or size, or a machine with more memory",
                  file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Terminated:
            print("terminated", file=sys.stderr)
            return 143
        return 0 if rc is None else int(rc)

    return wrapper


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null so that the final flush at exit cannot fail again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stdout: nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
