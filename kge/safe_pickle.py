"""Restricted unpickling: only builtin containers and scalars, never arbitrary classes.

A pickle can name any importable callable and call it while loading; the
unpickler here refuses every global except plain containers, so a hostile or
corrupt file raises :class:`~kgreason.errors.UserError` instead of running code.

Nesting is bounded too: before unpickling, the opcode stream is scanned
(:func:`pickletools.genops`, simulating the unpickler's stack) and a file whose
containers nest deeper than :data:`MAX_DEPTH` levels is refused.  Unpickling
itself is iterative, but hashing a tuple nested 200,000 deep (a dict key, a set
member) recurses in C and crashes the interpreter, and ``repr`` of one 2,000
deep raises ``RecursionError``.  The scan costs about 1 s per million opcodes
(a 3 MB BetaE query pickle: ~1 s).
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
from typing import Any

from kgreason.errors import UserError

__all__ = ["safe_load", "ALLOWED_GLOBALS", "MAX_DEPTH", "nesting_depth"]

#: Deepest container nesting a pickle may hold (BetaE query structures nest 4 levels).
MAX_DEPTH = 100

#: (module, name) pairs a pickle may reference.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("builtins", "dict"),
        ("builtins", "list"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "tuple"),
        ("builtins", "str"),
        ("builtins", "int"),
        ("builtins", "float"),
        ("builtins", "bool"),
        ("builtins", "bytes"),
        ("collections", "defaultdict"),
        ("collections", "OrderedDict"),
    }
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


_CONTAINERS = frozenset({"list", "tuple", "dict", "set", "frozenset"})
_IN_PLACE = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"})
_MARK = pickletools.markobject
# What each opcode does to the stack, as (kind, items popped below a mark or plainly, pushes a container).
_PUSH, _MARKOP, _GET, _PUT, _MEMOIZE, _DUP, _NOOP, _POPMARK, _POPN, _INPLACE_MARK, _INPLACE, _BUILD_MARK, _BUILD_N = range(13)


def _kind(op: pickletools.OpcodeInfo) -> tuple[int, int, bool]:
    name, before, after = op.name, op.stack_before, op.stack_after
    container = len(after) == 1 and after[0].name in _CONTAINERS
    if name == "MARK":
        return _MARKOP, 0, False
    if name in ("GET", "BINGET", "LONG_BINGET"):
        return _GET, 0, False
    if name in ("PUT", "BINPUT", "LONG_BINPUT"):
        return _PUT, 0, False
    if name == "MEMOIZE":
        return _MEMOIZE, 0, False
    if name == "DUP":
        return _DUP, 0, False
    if name == "READONLY_BUFFER" or not (before or after):
        return _NOOP, 0, False
    if not before:
        return _PUSH, 0, name.startswith("EMPTY_")
    if _MARK in before:
        n_below = before.index(_MARK)
        if not after:
            return _POPMARK, n_below, False
        return (_INPLACE_MARK if name in _IN_PLACE else _BUILD_MARK), n_below, container
    if not after:
        return _POPN, len(before), False
    return (_INPLACE if name in _IN_PLACE else _BUILD_N), len(before), container


_KINDS = {op.code: _kind(op) for op in pickletools.opcodes}


class _TooDeep(Exception):
    pass


class _Malformed(Exception):
    """The opcode stream does not make sense (the unpickler would fail on it too)."""


def nesting_depth(data: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep the containers a pickle builds nest (0: a scalar), read from its opcodes without unpickling.

    Simulates the unpickler's stack with one depth cell per object (shared by the memo,
    so that a container filled after it was memoized counts what went into it; an object
    built by a call such as ``set(list)`` counts as deep as its arguments).  Not counted:
    growth of a mutable container after it went into another one (through the memo);
    only lists, dicts and sets can nest that way, and CPython guards their ``repr``,
    comparison and deallocation against deep recursion (hashing, the unguarded one,
    needs tuples or frozensets, which are built whole and counted).  Raises
    ``_TooDeep`` as soon as a depth exceeds ``limit``, and ``_Malformed`` for a stream
    the unpickler would fail on as well (never stopping the scan early, so that nothing
    after an oddity goes unchecked).
    """
    stack: list = []  # depth cells ([int]) per stack item, None for a mark
    marks: list[int] = []  # stack positions of the marks
    memo: dict[int, list[int]] = {}
    deepest = 0
    kinds, push = _KINDS, stack.append
    zero = [0]
    try:
        for op, arg, _pos in pickletools.genops(data):
            kind, n, container = kinds[op.code]
            if kind == _PUSH:
                if container:
                    push([1])
                    deepest = deepest or 1
                else:
                    push(zero)  # a scalar: shared cell, never updated in place
                continue
            if kind == _PUT:
                memo[arg] = stack[-1]
            elif kind == _GET:
                stack.append(memo[arg])
            elif kind == _MEMOIZE:
                memo[len(memo)] = stack[-1]
            elif kind == _MARKOP:
                marks.append(len(stack))
                stack.append(None)
            elif kind == _DUP:
                stack.append(stack[-1])
            elif kind == _NOOP:
                pass
            elif kind == _POPN and n == 1 and stack and stack[-1] is None:  # POP also pops a mark (protocol 0)
                stack.pop()
                marks.pop()
            else:
                if kind in (_POPMARK, _INPLACE_MARK, _BUILD_MARK):
                    k = marks.pop()
                    if k < n:
                        raise _Malformed(f"{op.name} without its operands")
                    consumed, below = stack[k + 1:], stack[k - n:k]
                    del stack[k - n:]
                else:
                    if n > len(stack) or (marks and len(stack) - n <= marks[-1]):
                        raise _Malformed(f"stack underflow at {op.name}")
                    consumed, below = stack[len(stack) - n:], []
                    del stack[len(stack) - n:]
                if kind in (_POPMARK, _POPN):
                    continue
                if kind in (_INPLACE_MARK, _INPLACE):  # APPEND(S), SETITEM(S), ADDITEMS, BUILD: the same object
                    cell = below[0] if below else consumed[0]
                    items = consumed if below else consumed[1:]
                    if cell is None:
                        raise _Malformed(f"{op.name} on a mark")
                    if cell is zero:  # not a container (the unpickler will say so): keep the shared cell at 0
                        cell = [0]
                    cell[0] = max(cell[0], 1 + max((c[0] for c in items), default=0))
                else:
                    cell = [max((c[0] for c in consumed), default=0) + (1 if container else 0)]
                if cell[0] > deepest:
                    deepest = cell[0]
                    if deepest > limit:
                        raise _TooDeep
                stack.append(cell)
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # genops: truncated, unknown opcode; a bad memo key
        raise _Malformed(f"{type(exc).__name__}: {exc}") from None
    return deepest


def safe_load(path: str | os.PathLike) -> Any:
    """Unpickle ``path`` allowing only builtin containers/scalars nested at most :data:`MAX_DEPTH` deep
    (UserError otherwise, naming the file)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, expected a pickle file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        nesting_depth(data)
    except _TooDeep:
        raise UserError(f"{path}: refused pickle: containers nest deeper than {MAX_DEPTH} levels") from None
    except _Malformed as exc:
        raise UserError(f"{path}: refused or unreadable pickle (malformed: {exc})") from None
    try:
        return _RestrictedUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, KeyError, TypeError, ValueError,
            OverflowError, RecursionError) as exc:
        raise UserError(f"{path}: refused or unreadable pickle ({exc})") from None
