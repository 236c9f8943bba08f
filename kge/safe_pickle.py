"""Restricted unpickling: only builtin containers and scalars, never arbitrary classes.

A pickle can name any importable callable and call it while loading; the
unpickler here refuses every global except plain containers, so a hostile or
corrupt file raises :class:`~kgreason.errors.UserError` instead of running code.
"""
from __future__ import annotations

import os
import pickle
from typing import Any

from kgreason.errors import UserError

__all__ = ["safe_load", "ALLOWED_GLOBALS"]

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


def safe_load(path: str | os.PathLike) -> Any:
    """Unpickle ``path`` allowing only builtin containers/scalars (UserError otherwise)."""
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f).load()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, expected a pickle file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, KeyError, TypeError, ValueError,
            OverflowError, RecursionError) as exc:
        raise UserError(f"{path}: refused or unreadable pickle ({exc})") from None
