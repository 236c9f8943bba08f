"""Deprecated module (kept for one release after issue 23's fold): the multi-relation projection is
:func:`ops.project` with a ``rel`` argument, over :class:`ops.StackedMatrices` from
:func:`ops.prepare_matrices`.

Here: ``project_multi(X, rel, M, negated=...)`` = ``ops.project(X, M, rel, negate=...)``;
``prepare_stacked`` = ``ops.prepare_matrices``; ``project_multi_strategies(X, rel, M)`` =
``ops.project_strategies(X, M, rel)``; ``reference_project_multi`` =
``ops.reference.project_stacked``.  Each warns with a ``DeprecationWarning``.
"""
from __future__ import annotations

import torch

from kgreason.constants import QTO_NEG_SCALE

from . import reference
from .prepared import StackedMatrices, deprecated, prepare_stacked
from .projection import SWEEP, project_multi, project_strategies

__all__ = ["StackedMatrices", "prepare_stacked", "project_multi", "project_multi_strategies", "reference_project_multi",
           "SWEEP"]


def project_multi_strategies(X: torch.Tensor, rel, M) -> torch.Tensor:
    """Deprecated: ``ops.project_strategies(X, M, rel)``."""
    deprecated("ops.project_multi_strategies", "ops.project_strategies(X, M, rel)")
    return project_strategies(X, M, rel)


def reference_project_multi(x: torch.Tensor, rel: torch.Tensor, M: StackedMatrices, *, negated: bool = False,
                            neg_scale: float = QTO_NEG_SCALE, return_argmax: bool = False):
    """Deprecated: ``ops.reference.project_stacked``."""
    deprecated("ops.project_multi.reference_project_multi", "ops.reference.project_stacked")
    return reference.project_stacked(x, rel, M, negated=negated, neg_scale=neg_scale, return_argmax=return_argmax)
