"""Fuzzy-set operators on batches of fuzzy vectors, with C++ (OpenMP) and CUDA kernels.

A fuzzy batch ``X`` is a (B, N) float32 tensor in [0, 1]: one row per query,
one column per entity.  A relation is an (N, N) sparse CSR matrix ``M`` in
[0, 1] (or a :class:`PreparedMatrix` from :func:`prepare`).

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
"""
from ._backend import BACKENDS, extension_available, get_backend, has_kernel, set_backend
from .fuzzy import TNORMS, check_tnorm, intersect, negate, topk_prune, union
from .paths import HEAPS, ShortestPathTensors, check_relation_costs, dijkstra
from .prepared import PreparedMatrix, prepare
from .projection import STRATEGIES, choose_strategy, project, project_negated

__all__ = [
    "project",
    "project_negated",
    "intersect",
    "union",
    "negate",
    "topk_prune",
    "dijkstra",
    "ShortestPathTensors",
    "check_relation_costs",
    "HEAPS",
    "prepare",
    "PreparedMatrix",
    "choose_strategy",
    "extension_available",
    "set_backend",
    "get_backend",
    "has_kernel",
    "BACKENDS",
    "TNORMS",
    "check_tnorm",
    "STRATEGIES",
]

# Multi-relation projection over a stacked (R*N, N) matrix (ops/project_multi.py).
from .project_multi import StackedMatrices, prepare_stacked, project_multi, project_multi_strategies  # noqa: E402

__all__ += ["project_multi", "prepare_stacked", "StackedMatrices", "project_multi_strategies"]

# QTO calibration of GEMM score rows (ops/calibrate_rows.py; used by kge.calibrate.RowCalibrator).
from .calibrate_rows import calibrate_rows  # noqa: E402

__all__ += ["calibrate_rows"]
