"""Fuzzy-set operators on batches of fuzzy vectors, with C++ (OpenMP) and CUDA kernels.

A fuzzy batch ``X`` is a (B, N) float32 tensor in [0, 1]: one row per query,
one column per entity.  Relations are N x N sparse CSR matrices in [0, 1], kept
as a :class:`StackedMatrices` (R relations stacked; one matrix is the
one-relation stack) from :func:`prepare_matrices`.  :func:`project` is the one
projection: row ``b`` through relation ``rel[b]``, plain or negated, with argmax
or not, dense or sparse (:class:`ops.sparse_rows.SparseRows`) input.

>>> import torch, ops
>>> M = torch.tensor([[0.0, 0.9], [0.5, 0.0]]).to_sparse_csr()
>>> ops.project(torch.tensor([[1.0, 0.2]]), M)
tensor([[0.1000, 0.9000]])

Also :func:`dijkstra`: batched shortest paths over a relation multigraph in CSR
form (``kgreason::dijkstra``; :mod:`engine.paths` builds the graph from triples).

Backends: ``"cpp"`` (the compiled ``ops._C`` kernels; torch.ops.kgreason.*) and
``"reference"`` (pure torch, any device; pure Python for :func:`dijkstra`).  The
default picks ``cpp`` when the extension has a kernel for the input's device;
see :func:`set_backend`.

The names of the release before issue 23's fold (``project_negated``, ``project_multi``,
``prepare``, ...) were deprecated aliases for one release and are gone; reading one raises an
``AttributeError`` naming its replacement.
"""
from ._backend import BACKENDS, extension_available, get_backend, has_kernel, set_backend
from .fuzzy import TNORMS, check_tnorm, intersect, negate, topk_prune, union
from .paths import HEAPS, ShortestPathTensors, check_relation_costs, dijkstra
from .prepared import StackedMatrices, prepare_matrices
from .projection import STRATEGIES, SWEEP, choose_strategy, project, project_strategies

__all__ = [
    "project",
    "project_strategies",
    "choose_strategy",
    "StackedMatrices",
    "prepare_matrices",
    "intersect",
    "union",
    "negate",
    "topk_prune",
    "dijkstra",
    "ShortestPathTensors",
    "check_relation_costs",
    "HEAPS",
    "extension_available",
    "set_backend",
    "get_backend",
    "has_kernel",
    "BACKENDS",
    "TNORMS",
    "check_tnorm",
    "STRATEGIES",
    "SWEEP",
]

# QTO calibration of GEMM score rows (ops/calibrate_rows.py; used by kge.calibrate.RowCalibrator).
from .calibrate_rows import calibrate_row_stats, calibrate_rows, calibrate_rows_normalised  # noqa: E402

__all__ += ["calibrate_rows", "calibrate_row_stats", "calibrate_rows_normalised"]

#: The removed aliases of the release before issue 23's fold, and what replaces each.
_REMOVED = {
    "project_negated": "ops.project(X, M, negate=True)",
    "project_multi": "ops.project(X, M, rel, negate=...)",
    "project_multi_strategies": "ops.project_strategies(X, M, rel)",
    "prepare": "ops.prepare_matrices(M)",
    "prepare_stacked": "ops.prepare_matrices(M)",
    "PreparedMatrix": "ops.StackedMatrices (from ops.prepare_matrices)",
}


def __getattr__(name: str):
    """A removed alias says what replaces it (instead of a bare "no attribute")."""
    if name in _REMOVED:
        raise AttributeError(f"ops.{name} was removed (a deprecated alias of the release before issue 23's fold); "
                             f"use {_REMOVED[name]}")
    raise AttributeError(f"module 'ops' has no attribute {name!r}")
