"""Safe output folders and files, and one text reader: shared by every writer and loader (stdlib only).

Writers (``kge.build --out``, ``engine.sample --out``, ``engine.evaluate --json``,
``engine.betae --json``, the default-KG cache, the relation-embedding cache)
follow one set of rules:

* every check happens *before* any work: an output that is the current folder
  (or holds it), a file where a folder is expected (or the reverse), a missing
  or read-only parent folder -> :class:`~kgreason.errors.UserError` (``kge.build
  --out`` creates missing parents instead, when the nearest existing one is writable),
  and an output (file or folder) that is one of the run's inputs or lies inside an
  input folder, symbolic links and ``..`` resolved (:func:`check_not_input`, the
  ``inputs`` of :func:`check_output_file` and :class:`OutputFolder`) -> ``UserError``;
* a writer never deletes what it did not create: an existing folder is replaced
  only if it is an artifact (its ``meta.json`` lists every other entry in it),
  and only with ``overwrite=True`` (``--overwrite``); any other existing folder
  is an error naming it;
* output appears atomically: a folder is built in a temporary sibling
  ``.NAME.building-*`` and renamed into place; a file is written to a sibling
  ``.NAME.part-*`` and renamed when complete (or, for streamed outputs, kept on
  Ctrl-C / SIGTERM with what was written);
* an OS error while writing (a full disk, a quota) names the output, not the
  temporary, so that :func:`~kgreason.errors.cli_main` prints it as one line;
* temporaries are removed on any exception, on Ctrl-C, and on SIGTERM
  (:func:`sigterm_raises` turns SIGTERM into :class:`~kgreason.errors.Terminated`
  while they exist and restores the previous handler afterwards).

:func:`read_lines` is the one text reader: UTF-8 (a leading BOM is dropped),
universal newlines, decoding errors reported as ``file:line`` with a hint, and
a folder or missing file given where a file is expected as a ``UserError``.
:func:`loads_json` is the one JSON parser for untrusted text (JSON-lines files,
caches, LLM replies): linear time, no recursion deeper than :data:`MAX_JSON_DEPTH`
levels (``json.loads`` recurses once per level and ends in a ``RecursionError``
on ``[[[[...``), NaN/Infinity refused on request; every failure is a ``ValueError``.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from kgreason.errors import Terminated, UserError, unknown_name

__all__ = [
    "MANIFEST",
    "is_plain_name",
    "sigterm_raises",
    "interrupts_deferred",
    "user_cache_dir",
    "check_not_input",
    "check_output_folder",
    "OutputFolder",
    "check_output_file",
    "open_output",
    "write_output",
    "read_lines",
    "read_json_objects",
    "MAX_JSON_DEPTH",
    "json_depth",
    "loads_json",
    "relation_path_field",
    "text_field",
]

#: The file that makes a folder ours: a JSON object whose ``"files"`` lists every other entry.
MANIFEST = "meta.json"


# ------------------------------------------------------------------ signals
@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` (so ``finally`` blocks clean up).

    The previous handler is restored on exit.  Outside the main thread (where
    Python cannot install handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise Terminated(signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # e.g. an embedded interpreter without signal support
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during a block that must not be cut in half; deliver them after it.

    E.g. writing one record and counting it: a Ctrl-C between the two would leave
    the count and the file disagreeing.  A signal that arrives inside the block
    runs its previous handler (``KeyboardInterrupt``, :class:`Terminated`, ...) as
    the block exits.  Outside the main thread this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, Any]] = []
    previous: dict[int, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda n, frame: pending.append((n, frame)))
    except (ValueError, OSError):
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signum, frame = pending[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def user_cache_dir() -> Path:
    """``$KGREASON_HOME`` or ``~/.cache/kgreason`` (the default-KG and embedding caches live here)."""
    return Path(os.environ.get("KGREASON_HOME") or Path.home() / ".cache" / "kgreason").expanduser()


# ------------------------------------------------------------------ output folders
def _label(what: str, path: str | os.PathLike) -> str:
    return f"{what} {path}" if what else str(path)


def _manifest_entries(folder: Path) -> set[str] | None:
    """Names the folder's manifest says were written with it, or None if it has no readable manifest."""
    try:
        meta = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
        return None
    names = list(meta["files"])
    if not all(is_plain_name(n) for n in names):
        return None  # a manifest naming "../x" or "a/b" could make us delete outside the folder
    return {MANIFEST, *names}


def is_plain_name(name: object) -> bool:
    """A file name without any folder part (what a manifest may list)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name)


def _foreign_entries(folder: Path, what: str) -> tuple[list[str], bool]:
    """(entries not listed by the manifest, whether the folder has a manifest) of an existing folder."""
    try:
        entries = sorted(p.name for p in folder.iterdir())
    except OSError as exc:
        raise UserError(f"{_label(what, folder)}: cannot list the folder ({exc.strerror})") from None
    listed = _manifest_entries(folder)
    if listed is None:
        return entries, False
    return [e for e in entries if e not in listed], True


def _show(names: list[str], k: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:k])
    return shown + (f" and {len(names) - k} more" if len(names) > k else "")


def _check_dotdot(path: Path, loc: str) -> None:
    """Refuse a path that goes through a missing folder and back out with '..' (``x/../o`` with ``x`` missing).

    ``os.path.abspath`` folds ``x/..`` away, so the checks below would pass, but the OS resolves ``x``
    when the output is finally renamed into place and fails there, after all the work.
    """
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part == ".." and i > 0:
            if not Path(*parts[:i]).is_dir():
                missing = next(Path(*parts[:j]) for j in range(1, i + 1) if not Path(*parts[:j]).is_dir())
                raise UserError(f"{loc}{str(path)!r} goes through {str(missing)!r}, which is not an existing folder")


def _check_parent(path: Path, what: str, *, create: bool = False) -> Path:
    """The parent folder of ``path``, checked to exist and be writable.

    With ``create`` a missing parent is fine when its nearest existing ancestor
    is a writable folder (the caller creates the missing ones, see :class:`OutputFolder`).
    """
    parent = Path(os.path.abspath(path)).parent
    loc = f"{what}: " if what else ""
    _check_dotdot(path, loc)
    if not parent.is_dir() and create:
        ancestor = parent
        while not ancestor.exists() and not ancestor.is_symlink() and ancestor.parent != ancestor:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise UserError(f"{loc}{str(ancestor)!r} is not a folder")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise UserError(f"{loc}folder {str(ancestor)!r} is not writable (cannot create {str(parent)!r})")
        return parent
    if not parent.is_dir():
        if parent.exists():
            raise UserError(f"{loc}{str(parent)!r} is not a folder")
        raise UserError(f"{loc}folder {str(parent)!r} does not exist (create it first: mkdir -p {parent})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{loc}folder {str(parent)!r} is not writable")
    return parent


Inputs = Iterable[tuple[str, "str | os.PathLike | None"]]


def check_not_input(path: str | os.PathLike, *, what: str = "--out", inputs: Inputs = ()) -> Path:
    """Refuse an output ``path`` that is one of the run's ``inputs`` or lies inside an input folder.

    ``inputs`` are ``(flag, path)`` pairs (None or empty paths are skipped; a name that is
    not an existing path, e.g. a dataset name such as ``umls``, never matches).  Paths are
    compared after resolving symbolic links and ``..`` (:func:`os.path.realpath`).  The
    :class:`UserError` names ``what``, the flag and the input; returns ``path`` as a :class:`Path`.
    Every writer calls this (through :func:`check_output_file` and :class:`OutputFolder`),
    before any work.
    """
    inputs = list(inputs)
    # os.path.realpath raises a bare ValueError on a NUL byte, which no file name can hold.
    for flag, name in ((what, path), *inputs):
        if name is not None and "\x00" in os.fsdecode(name):
            raise UserError(f"{flag} {os.fsdecode(name)!r}: a file name cannot contain a NUL byte")
    target = Path(os.path.realpath(path))
    for flag, source in inputs:
        if source is None or str(source) == "" or not os.path.lexists(source):
            continue
        src = Path(os.path.realpath(source))
        if target == src or (src in target.parents and src.is_dir()):
            where = f"is the {flag} input" if target == src else f"is inside the {flag} folder"
            raise UserError(f"{_label(what, path)}: {where} {str(source)!r}; write the output elsewhere "
                            "(nothing was touched)")
    return Path(path)


def check_output_folder(path: str | os.PathLike, *, overwrite: bool = False, what: str = "--out",
                        create_parents: bool = False, inputs: Inputs = ()) -> Path:
    """Check that ``path`` may become an output folder; returns it as a :class:`Path`.

    Allowed: a new name in a writable folder (with ``create_parents``, in a
    missing folder whose nearest existing ancestor is writable), an empty
    folder, or (with ``overwrite``) an artifact folder holding nothing but what its manifest
    lists, and none of the run's ``inputs`` nor inside one (:func:`check_not_input`).
    Everything else is a :class:`UserError` naming ``what`` and the path, raised
    before any work is done.
    """
    p = Path(path)
    if str(path) == "":
        raise UserError(f"{what}: empty path")
    absolute = Path(os.path.abspath(p))
    cwd = Path(os.path.abspath(os.getcwd()))
    if absolute == cwd or absolute in cwd.parents or absolute.parent == absolute:
        raise UserError(f"{_label(what, path)}: is the current folder or holds it; "
                        f"give the name of a new folder (e.g. {what} {os.path.join(str(path), 'artifact')})")
    if p.is_symlink():
        raise UserError(f"{_label(what, path)}: is a symbolic link; give the real folder's path")
    if p.exists():
        if not p.is_dir():
            raise UserError(f"{_label(what, path)}: is a file, not a folder; give the name of a new folder")
        foreign, ours = _foreign_entries(p, what)
        if ours and foreign:
            raise UserError(f"{_label(what, path)}: the artifact folder also holds {_show(foreign)}, which its "
                            "meta.json does not list; move them away or choose another folder (nothing was touched)")
        if not ours and foreign:
            raise UserError(f"{_label(what, path)}: folder exists and is not an artifact (it holds {_show(foreign)}); "
                            "choose a new folder (nothing was touched)")
        if ours and not overwrite:
            raise UserError(f"{_label(what, path)}: already holds an artifact; pass --overwrite to replace it")
    check_not_input(path, what=what, inputs=inputs)
    _check_parent(p, what, create=create_parents)
    return p


class OutputFolder:
    """Build a folder in a temporary sibling and move it into place atomically.

    ::

        with OutputFolder(out, overwrite=args.overwrite) as tmp:   # checks first
            write files into tmp
            ...commit() is called on a clean exit of the block

    Construction runs :func:`check_output_folder` (``inputs``: see :func:`check_not_input`).
    An ``OSError`` out of the block (a full disk) is re-raised naming the target
    folder (or the file in it), not the temporary.  With ``create_parents``
    missing parent folders are created on entering the block (and removed again,
    if still empty, when the block fails).  Inside the block SIGTERM
    raises :class:`Terminated`; on any exception (Ctrl-C and SIGTERM included)
    the temporary folder is removed and the target is left as it was.

    ``commit`` checks the target again (time passed since the first check): a
    folder that appeared meanwhile is left alone and :class:`OutputExists` is raised.  An
    artifact being replaced is renamed aside, the new folder renamed in, and
    only the files its manifest lists are then deleted.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, what: str = "--out",
                 create_parents: bool = False, inputs: Inputs = ()) -> None:
        self.path = check_output_folder(path, overwrite=overwrite, what=what, create_parents=create_parents,
                                        inputs=inputs)
        self.created: list[Path] = []  # parent folders this object made (outermost first)
        self.overwrite = overwrite
        self.what = what
        self.tmp: Path | None = None
        self.committed = False
        self._signals: contextlib.ExitStack | None = None

    def __enter__(self) -> Path:
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(sigterm_raises())
        parent = Path(os.path.abspath(self.path)).parent
        missing = [a for a in reversed([parent, *parent.parents]) if not a.exists()]
        try:
            for folder in missing:
                folder.mkdir()
                self.created.append(folder)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.building-", dir=parent))
            os.chmod(self.tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like mkdir's
        except OSError as exc:
            self._remove_created()
            self._signals.close()
            raise UserError(f"{_label(self.what, self.path)}: cannot create a folder in {str(parent)!r} "
                            f"({exc.strerror})") from None
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if isinstance(exc, OSError) and self.tmp is not None:
            _name_output(exc, self.path, self.tmp)
        try:
            if exc_type is None and not self.committed:
                self.commit()
        finally:
            if self.tmp is not None and self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)
            if not self.committed:
                self._remove_created()
            if self._signals is not None:
                self._signals.close()

    def _remove_created(self) -> None:
        """Remove the parent folders this object created, innermost first, while they are empty."""
        for folder in reversed(self.created):
            try:
                folder.rmdir()
            except OSError:
                break
        self.created = []

    def commit(self) -> Path:
        """Move the temporary folder to the target (see the class docstring)."""
        assert self.tmp is not None, "commit() outside the with block"
        target = self.path
        if target.exists() and not target.is_symlink() and target.is_dir():
            foreign, ours = _foreign_entries(target, self.what)
            if foreign or (ours and not self.overwrite):
                raise OutputExists(f"{_label(self.what, target)}: another process wrote there meanwhile; "
                                   "nothing was replaced")
            if ours:
                old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.replace(target, old / "artifact")
                os.replace(self.tmp, target)
                self.committed = True
                _remove_listed(old / "artifact")
                with contextlib.suppress(OSError):
                    old.rmdir()
                return target
        try:
            os.rename(self.tmp, target)  # also replaces an empty folder
        except OSError as exc:
            raise OutputExists(f"{_label(self.what, target)}: cannot move the result into place ({exc.strerror}); "
                               f"nothing was replaced") from None
        self.committed = True
        return target


class OutputExists(UserError, FileExistsError):
    """The target of an :class:`OutputFolder` was taken by someone else before the commit."""


def _remove_listed(folder: Path) -> None:
    """Delete the entries the folder's manifest lists, then the folder if that left it empty."""
    listed = _manifest_entries(folder) or set()
    for name in listed:
        entry = folder / name
        if entry.is_file() or entry.is_symlink():
            with contextlib.suppress(OSError):
                entry.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # fails (and keeps everything) if something unlisted is in it


# ------------------------------------------------------------------ output files
def check_output_file(path: str | os.PathLike, *, what: str = "--out",
                      inputs: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> Path:
    """Check that ``path`` may be written as a file (before any work); returns it as a :class:`Path`.

    A folder, a missing or read-only parent folder is a :class:`UserError`.  An
    existing regular file may be replaced (the user named it as the output),
    except one of the run's ``inputs`` (``(flag, path)`` pairs; None paths are
    skipped) or a file inside an input folder: that is refused, naming the flag (:func:`check_not_input`).
    """
    p = Path(path)
    if str(path) == "":
        raise UserError(f"{what}: empty path")
    check_not_input(path, what=what, inputs=inputs)
    if p.is_dir():
        raise UserError(f"{_label(what, path)}: is a folder; give a file name (e.g. {os.path.join(str(path), 'out')})")
    _check_parent(p.resolve() if p.is_symlink() else p, what)
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{_label(what, path)}: file is not writable")
    return p


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _new_file_mode(target: Path) -> int:
    """The replaced file's mode, or what ``open(..., "w")`` would give a new one (mkstemp makes 0600)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def open_output(path: str | os.PathLike, *, what: str = "--out", binary: bool = False,
                keep_partial: bool = False) -> Iterator[IO]:
    """Open ``path`` for writing through a temporary sibling renamed into place on success.

    ``keep_partial``: on Ctrl-C or SIGTERM the lines written so far are still
    moved into place (streamed outputs); otherwise the temporary file is removed
    and ``path`` keeps its old content.  Any other exception always removes it.
    A target that is not a regular file (``/dev/stdout``, a FIFO) is written
    directly.
    """
    target = check_output_file(path, what=what)
    if target.is_symlink():
        target = target.resolve()
    if target.exists() and not target.is_file():
        with open(target, "wb") if binary else open(target, "w", encoding="utf-8", newline="\n") as f:
            yield f
        return
    with sigterm_raises():
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.part-", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            os.chmod(tmp, _new_file_mode(target))
            with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n")) as f:
                try:
                    yield f
                except (KeyboardInterrupt, Terminated):
                    if not keep_partial:
                        raise
                    _finish(f, tmp, target)
                    raise
                _finish(f, tmp, target)
        except OSError as exc:
            _name_output(exc, target, tmp)
            raise
        finally:
            if tmp.exists():
                tmp.unlink()


def _name_output(exc: OSError, target: Path, tmp: Path) -> None:
    """Point ``exc.filename`` at the output the user named: a write to an open file raises an
    OSError without a file name, and one about the temporary names a file the user never saw."""
    name = exc.filename
    if name is None or name == "":
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # a write, not some other call's failure
            exc.filename = str(target)
        return
    try:
        rel = Path(os.fsdecode(name)).relative_to(tmp)
    except ValueError:
        return
    exc.filename = str(target / rel if rel.parts else target)


def _finish(f: IO, tmp: Path, target: Path) -> None:
    f.flush()
    os.fsync(f.fileno())
    os.replace(tmp, target)


def write_output(path: str | os.PathLike, data: str | bytes, *, what: str = "--out") -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`open_output`)."""
    with open_output(path, what=what, binary=isinstance(data, bytes)) as f:
        f.write(data)
    return Path(path)


# ------------------------------------------------------------------ text input
_BOM = b"\xef\xbb\xbf"


def read_lines(path: str | os.PathLike, *, what: str = "") -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of every line of a UTF-8 text file, line endings removed.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (Python's universal newlines);
    line numbers count every line, blank ones included.  The checks on the path
    run at once; decoding errors are raised when the bad line is reached, as
    ``UserError("FILE:LINE: not UTF-8 text ...")``.  ``what`` (e.g. ``--queries``)
    prefixes the messages about the path itself.
    """
    p = Path(path)
    loc = f"{what}: " if what else ""
    if p.is_dir():
        raise UserError(f"{loc}{path} is a folder, expected a file")
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise UserError(f"{loc}file {str(path)!r} does not exist" if what else f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{loc}{path}: cannot read ({exc.strerror})") from None
    return _decoded_lines(f, str(path))


def _decoded_lines(f: IO[bytes], name: str) -> Iterator[tuple[int, str]]:
    with f:
        lineno = 0
        for chunk in f:  # binary iteration splits after b"\n" only; splitlines() adds lone "\r"
            for raw in chunk.splitlines():
                lineno += 1
                if lineno == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM):]
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
                    raise UserError(
                        f"{name}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}); "
                        f"save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8)"
                    ) from None
                yield lineno, text


#: Deepest nesting :func:`loads_json` parses (a reply, a questions line or a cache entry of kgreason's
#: is never deeper than a few levels; ``json.loads`` itself fails near the interpreter's recursion limit).
MAX_JSON_DEPTH = 100
# A JSON string from its opening quote to its closing one, or to the end of the text when it never closes:
# always matching at a quote keeps one pass linear (a string that fails to close is not retried).  The
# "unrolled loop" form: every character belongs to exactly one repeat, so no input makes it backtrack
# more than once over each character (Python 3.10 has no possessive quantifiers).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = str.maketrans({"[": "1", "{": "1", "]": "2", "}": "2"})


def json_depth(text: str) -> int:
    """An upper bound of the nesting depth ``json.loads(text)`` would reach before it returns or fails.

    Linear time, no recursion: strings are removed (from the first quote, as a JSON parser reads them),
    then the running count of opening minus closing brackets is taken at C speed.  Up to the point where
    a JSON parser stops (the end of the value or the first error), the two read the same tokens, so the
    bound holds for any text, valid JSON or not.
    """
    if text.count("[") + text.count("{") == 0:
        return 0
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).translate(_BRACKET_STEP)
    steps = itertools.accumulate(1 if c == "1" else -1 for c in brackets)
    return max(0, max(steps, default=0))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def loads_json(text: str, *, max_depth: int = MAX_JSON_DEPTH, allow_nan: bool = True) -> Any:
    """``json.loads(text)``, bounded: a value nested deeper than ``max_depth`` is a ``ValueError``
    (``"nested too deeply"``) found in linear time before any parsing, so no input reaches
    ``json``'s per-level recursion; ``allow_nan=False`` also refuses ``NaN``/``Infinity``.
    Every failure is a ``ValueError`` (``json.JSONDecodeError`` for malformed JSON)."""
    if json_depth(text) > max_depth:
        raise ValueError("nested too deeply")  # the words every JSON-lines reader of kgreason has used
    if allow_nan:
        return json.loads(text)
    return json.loads(text, parse_constant=_refuse_constant)


def read_json_objects(path: str | os.PathLike, *, what: str = "", shape: str = "") -> Iterator[tuple[str, dict]]:
    """``("FILE:LINE", object)`` of every non-blank line of a JSON-lines file of objects (:func:`read_lines`).

    A line that is not JSON (nesting deeper than :data:`MAX_JSON_DEPTH` included: :func:`loads_json`),
    or JSON but not an object, is a ``UserError`` naming ``FILE:LINE``;
    ``shape`` (e.g. ``{"question": ..., "path": [...]}``) is the object the message says was expected.
    """
    for n, line in read_lines(path, what=what):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = loads_json(line)
        except ValueError as exc:
            raise UserError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object {shape}".rstrip())
        yield where, obj


def text_field(obj: dict, key: str, where: str) -> str:
    """``obj[key]`` as non-empty text, otherwise a ``UserError`` at ``where`` (a missing key, a wrong type)."""
    if key not in obj:
        raise UserError(f"{where}: missing key {key!r}")
    v = obj[key]
    if not isinstance(v, str) or not v.strip():
        raise UserError(f"{where}: {key!r} must be non-empty text, got {v!r}")
    return v


def relation_path_field(obj: dict, key: str, where: str, relations: Iterable[str] | None = None) -> tuple[str, ...]:
    """``obj[key]`` as a relation path: a non-empty list of non-empty names, each one of ``relations`` when
    given; otherwise a ``UserError`` at ``where`` (a missing key, a wrong type, the closest known names)."""
    if key not in obj:
        raise UserError(f"{where}: missing key {key!r} (a non-empty list of relation names)")
    p = obj[key]
    if not isinstance(p, list) or not p or not all(isinstance(x, str) and x for x in p):
        raise UserError(f"{where}: {key!r} must be a non-empty list of relation names, got {p!r}")
    if relations is not None:
        known = list(relations)
        names = set(known)
        for x in p:
            if x not in names:
                raise unknown_name("relation", x, known, where)
    return tuple(p)
