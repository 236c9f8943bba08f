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

Deprecated aliases of the release before issue 23's fold (one release, each warns):
``project_negated``, ``project_multi``, ``project_multi_strategies``, ``prepare``,
``prepare_stacked``, ``PreparedMatrix``, ``ops.sparse_rows.project_multi_sparse``.
"""
from ._backend import BACKENDS, extension_available, get_backend, has_kernel, set_backend
from .fuzzy import TNORMS, check_tnorm, intersect, negate, topk_prune, union
from .paths import HEAPS, ShortestPathTensors, check_relation_costs, dijkstra
from .prepared import PreparedMatrix, StackedMatrices, prepare, prepare_matrices, prepare_stacked
from .projection import STRATEGIES, SWEEP, choose_strategy, project, project_multi, project_negated, project_strategies

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
    # deprecated aliases (one release)
    "project_negated",
    "project_multi",
    "project_multi_strategies",
    "prepare",
    "prepare_stacked",
    "PreparedMatrix",
]

# (re-binds ops.project_multi to the function: importing the submodule set the attribute to the module)
from .project_multi import project_multi, project_multi_strategies  # noqa: E402,F811  (deprecated aliases)

# QTO calibration of GEMM score rows (ops/calibrate_rows.py; used by kge.calibrate.RowCalibrator).
from .calibrate_rows import calibrate_rows  # noqa: E402

__all__ += ["calibrate_rows"]
