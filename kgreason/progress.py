"""Progress reporting on stderr: a tqdm bar on a terminal, occasional plain lines in a log.

Every progress bar of the library comes from :func:`progress_bar`.  When its stream is a terminal it
is a ``tqdm`` bar (redrawn in place with carriage returns); otherwise (stderr redirected to a file or a
pipe) it is a :class:`LineProgress`, which writes whole ``\\n``-terminated lines and never a ``\\r``: at
most one every :data:`LINE_INTERVAL_S` seconds while work goes on, and one final line when the bar is
closed.  A log then stays readable line by line, and a summary printed after the bar (the LLM client's
``llm: {...}``) starts a line of its own.

:class:`LineProgress` answers the part of tqdm's interface that the library uses (``update``,
``reset``, ``set_description``, ``set_postfix``, ``set_postfix_str``, ``refresh``, ``write``,
``close``, the ``n``/``total`` attributes, iteration and ``with``), so a call site changes only its
import and the name it calls.  Its rate is ``(n - initial) / elapsed`` and is shown only after a
second of work: a rate over microseconds (or over work done before the bar existed) means nothing.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Any, Iterable, Iterator

__all__ = ["progress_bar", "LineProgress", "is_terminal", "LINE_INTERVAL_S"]

#: Seconds between two progress lines in a log (the final line is always written).
LINE_INTERVAL_S = 30.0
#: A rate is shown once the bar has run this long (before that it is noise).
_MIN_RATE_S = 1.0


def is_terminal(stream: Any) -> bool:
    """True when ``stream`` (a file object, or None) is an open terminal."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


def progress_bar(iterable: Iterable[Any] | None = None, *, file: IO[str] | None = None,
                 interval_s: float | None = None, **kwargs: Any) -> Any:
    """A progress bar on ``file`` (default: ``sys.stderr`` at call time): tqdm on a terminal, else lines.

    ``iterable`` and ``kwargs`` are tqdm's (``total``, ``desc``, ``unit``, ``initial``, ``disable``,
    ``leave``, ``postfix``, display options such as ``mininterval``, ``unit_scale`` or ``dynamic_ncols``,
    which only a tqdm bar uses).  ``interval_s`` (default :data:`LINE_INTERVAL_S`) spaces the lines
    written when ``file`` is not a terminal.
    """
    stream = sys.stderr if file is None else file
    if is_terminal(stream):
        from tqdm import tqdm  # type: ignore[import-untyped]  # imported here: most commands never draw a bar

        return tqdm(iterable, file=stream, **kwargs)
    return LineProgress(iterable, file=stream, interval_s=LINE_INTERVAL_S if interval_s is None else interval_s,
                        **kwargs)


class LineProgress:
    """tqdm's interface, written as plain lines: see the module docstring.

    ``clock`` (default :func:`time.monotonic`) is what elapsed time and the line interval are measured on.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, *, file: IO[str] | None = None,
                 total: float | None = None, desc: str | None = None, unit: str = "it", initial: float = 0,
                 disable: bool = False, postfix: Any = None, interval_s: float = LINE_INTERVAL_S,
                 clock: Any = time.monotonic, **_display: Any) -> None:
        # _display: tqdm's drawing options (leave, mininterval, unit_scale, ncols, ...): a line has none
        self.iterable = iterable
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.file = file
        self.total = total
        self.desc = desc or ""
        self.unit = unit
        self.initial = initial
        self.n = initial
        self.disable = disable or file is None
        self.interval_s = interval_s
        self._clock = clock
        self.start_t = self._last_line_t = clock()
        self._postfix = ""
        self._closed = False
        if postfix is not None:
            self.set_postfix_str(str(postfix) if isinstance(postfix, str) else _format_postfix(dict(postfix)))

    # ---------------------------------------------------------------- tqdm's interface
    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress bar was made without an iterable")
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        self._maybe_line()

    def reset(self, total: float | None = None) -> None:
        """Count from zero again (tqdm: a new epoch); the line interval keeps running."""
        self.n = self.initial = 0
        if total is not None:
            self.total = total
        self.start_t = self._clock()

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        self._postfix = _format_postfix({**dict(ordered_dict or {}), **kwargs})

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self._postfix = str(s)

    def refresh(self) -> None:
        """A line if the interval has passed since the last one (tqdm redraws; a log must not fill up)."""
        self._maybe_line()

    def write(self, s: str, file: IO[str] | None = None, end: str = "\n") -> None:
        out = file if file is not None else self.file
        if out is not None:
            out.write(s + end)
            out.flush()

    def close(self) -> None:
        """The final line (once)."""
        if self._closed:
            return
        self._closed = True
        self._line(final=True)

    # ---------------------------------------------------------------- lines
    def _maybe_line(self) -> None:
        if not self._closed and self._clock() - self._last_line_t >= self.interval_s:
            self._line(final=False)

    def _line(self, *, final: bool) -> None:
        now = self._clock()
        self._last_line_t = now
        if self.disable or self.file is None:
            return
        elapsed = now - self.start_t
        count = f"{_num(self.n)}/{_num(self.total)} {self.unit}" if self.total else f"{_num(self.n)} {self.unit}"
        if self.total:
            count += f" ({100.0 * self.n / self.total:.0f}%)"
        parts = [count, ("done in " if final else "") + _duration(elapsed)]
        if elapsed >= _MIN_RATE_S and self.n > self.initial:
            parts.append(f"{(self.n - self.initial) / elapsed:.3g} {self.unit}/s")
        if self._postfix:
            parts.append(self._postfix)
        text = ", ".join(parts)
        try:
            self.file.write((f"{self.desc}: {text}" if self.desc else text) + "\n")
            self.file.flush()
        except (ValueError, OSError):  # the stream was closed under us: progress is not worth an error
            self.disable = True


def _format_postfix(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.2f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
