"""Fake (meta) kernels of every ``torch.ops.kgreason.*`` op, for FakeTensor / torch.compile tracing.

A fake kernel computes only the outputs' shapes, dtypes and devices, mirroring
the real kernels (csrc/cpu/*.cpp, csrc/cuda/*.cu) exactly: the opcheck tests
(tests/test_ops_opcheck.py) compare them, and pin the list of ops so that a new
op needs a fake.  Imported by :mod:`ops._backend` once the extension has loaded
(the ops must exist before a fake can be registered).
"""
from __future__ import annotations

import torch
from torch.library import register_fake

__all__: list[str] = []


def _projection_outputs(x: torch.Tensor, want_argmax: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(x.dim() == 2, lambda: f"kgreason: x must be 2-D (B, N), got {x.dim()}-D")
    torch._check(x.dtype == torch.float32, lambda: f"kgreason: x must be float32, got {x.dtype}")
    b, n = x.shape
    y = x.new_empty((b, n))
    # argmax is (B, N) int32, or an empty (0,) tensor when not asked for
    a = x.new_empty((b, n) if want_argmax else (0,), dtype=torch.int32)
    return y, a


@register_fake("kgreason::project")
def _project_fake(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale, want_argmax):
    torch._check(rel.dim() == 1 and rel.shape[0] == x.shape[0], lambda: "kgreason::project: rel must have shape (B,)")
    return _projection_outputs(x, want_argmax)


@register_fake("kgreason::project_out")
def _project_out_fake(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale, y, argmax):
    # writes into y (and argmax, unless empty); returns nothing
    torch._check(y.shape == x.shape, lambda: "kgreason::project_out: y must have X's shape")
    return None


@register_fake("kgreason::project_strategy")
def _project_strategy_fake(x, rel, crow, num_entities):
    # one plan code per row (1 push, 2 pull, 3 sweep); the codes depend on X's values, the shape does not
    return x.new_empty((x.shape[0],), dtype=torch.int32)


@register_fake("kgreason::csr_transpose")
def _csr_transpose_fake(crow, col, val, n):
    nnz = val.shape[0]  # a stack of R matrices: crow has R*N+1 entries, and so has the transpose's
    return crow.new_empty((crow.shape[0],)), col.new_empty((nnz,)), val.new_empty((nnz,))


@register_fake("kgreason::fuzzy_reduce")
def _fuzzy_reduce_fake(xs, op):
    torch._check(len(xs) > 0, lambda: "kgreason::fuzzy_reduce: needs at least one tensor")
    torch._check(0 <= op <= 3, lambda: f"kgreason::fuzzy_reduce: op must be 0..3, got {op}")
    for x in xs[1:]:
        torch._check(x.dim() == xs[0].dim(), lambda: "kgreason::fuzzy_reduce: inputs must share one shape")
        for a, b in zip(x.shape, xs[0].shape):
            torch._check(a == b, lambda: "kgreason::fuzzy_reduce: inputs must share one shape")
    return xs[0].new_empty(xs[0].shape)


@register_fake("kgreason::dijkstra")
def _dijkstra_fake(indptr, tails, rels, relation_costs, sources, targets, heuristic, max_hops, return_predecessors,
                   heap):
    torch._check(max_hops >= -1, lambda: f"kgreason::dijkstra: max_hops must be >= -1, got {max_hops}")
    n = indptr.shape[0] - 1
    s = sources.shape[0]
    # The kernel allocates its outputs on the CPU (it has no other device).
    dist = indptr.new_empty((s, n), dtype=torch.float32, device="cpu")
    layers = max_hops + 1
    if return_predecessors:
        shape = (s, layers, n) if max_hops >= 0 else (s, n)
        pred_e = indptr.new_empty(shape, dtype=torch.int32, device="cpu")
        pred_r = indptr.new_empty(shape, dtype=torch.int32, device="cpu")
    else:
        pred_e = indptr.new_empty((0,), dtype=torch.int32, device="cpu")
        pred_r = indptr.new_empty((0,), dtype=torch.int32, device="cpu")
    hops = indptr.new_empty((s, n) if max_hops >= 0 else (0,), dtype=torch.int32, device="cpu")
    return dist, pred_e, pred_r, hops


@register_fake("kgreason::calibrate_rows")
def _calibrate_rows_fake(scores, obs_ptr, obs_cols, threshold, delta):
    torch._check(scores.dim() == 2, lambda: f"kgreason::calibrate_rows: scores must be 2-D (c, N), got {scores.dim()}-D")
    torch._check(scores.dtype == torch.float32,
                 lambda: f"kgreason::calibrate_rows: scores must be float32, got {scores.dtype}")
    torch._check(obs_ptr.shape[0] == scores.shape[0] + 1, lambda: "kgreason::calibrate_rows: obs_ptr must have c+1 entries")
    # How many entries survive the threshold depends on the scores' values: an unbacked size, as
    # for torch.nonzero (tracing needs a ShapeEnv; a plain FakeTensorMode raises DynamicOutputShapeException).
    nnz = torch.library.get_ctx().new_dynamic_size()
    return (scores.new_empty((scores.shape[0],), dtype=torch.int64), scores.new_empty((nnz,), dtype=torch.int32),
            scores.new_empty((nnz,)))


@register_fake("kgreason::calibrate_row_stats")
def _calibrate_row_stats_fake(scores):
    torch._check(scores.dim() == 2, lambda: f"kgreason::calibrate_row_stats: scores must be 2-D (c, N), got {scores.dim()}-D")
    return scores.new_empty((scores.shape[0],)), scores.new_empty((scores.shape[0],), dtype=torch.float64)


@register_fake("kgreason::calibrate_rows_normalised")
def _calibrate_rows_normalised_fake(scores, row_max, row_scale, obs_ptr, obs_cols, threshold, delta):
    torch._check(scores.dim() == 2,
                 lambda: f"kgreason::calibrate_rows_normalised: scores must be 2-D (c, N), got {scores.dim()}-D")
    torch._check(row_max.shape[0] == scores.shape[0] and row_scale.shape[0] == scores.shape[0],
                 lambda: "kgreason::calibrate_rows_normalised: row_max and row_scale must have c entries")
    nnz = torch.library.get_ctx().new_dynamic_size()  # data-dependent, as for calibrate_rows
    return (scores.new_empty((scores.shape[0],), dtype=torch.int64), scores.new_empty((nnz,), dtype=torch.int32),
            scores.new_empty((nnz,)))


@register_fake("kgreason::project_multi_sparse")
def _project_multi_sparse_fake(xcrow, xcol, xval, rel, crow, col, val, n):
    torch._check(xcrow.dim() == 1 and xcrow.shape[0] >= 1,
                 lambda: "kgreason::project_multi_sparse: X's crow must be 1-D with B+1 entries")
    torch._check(rel.dim() == 1 and rel.shape[0] == xcrow.shape[0] - 1,
                 lambda: "kgreason::project_multi_sparse: rel must have shape (B,)")
    # The output's nnz (the columns the rows reach) depends on the values: an unbacked size, as for
    # calibrate_rows.  The kernel allocates on the CPU (it has no other device).
    nnz = torch.library.get_ctx().new_dynamic_size()
    return (xcrow.new_empty(xcrow.shape, dtype=torch.int64), xcrow.new_empty((nnz,), dtype=torch.int64),
            xval.new_empty((nnz,), dtype=torch.float32))


@register_fake("kgreason::sparse_align")
def _sparse_align_fake(crows, cols, vals, intersect):
    torch._check(len(crows) > 0, lambda: "kgreason::sparse_align: needs at least one sparse batch")
    torch._check(len(cols) == len(crows) and len(vals) == len(crows),
                 lambda: "kgreason::sparse_align: crows, cols and vals must have one tensor per input")
    for cr in crows[1:]:
        torch._check(cr.shape[0] == crows[0].shape[0], lambda: "kgreason::sparse_align: inputs must share B")
    nnz = torch.library.get_ctx().new_dynamic_size()  # the support's size depends on the columns
    return (crows[0].new_empty(crows[0].shape, dtype=torch.int64), crows[0].new_empty((nnz,), dtype=torch.int64),
            vals[0].new_empty((len(vals), nnz), dtype=torch.float32))
