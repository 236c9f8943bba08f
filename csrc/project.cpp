// Schema and CPU registration of kgreason::project, the one max-times projection op: every row of a batch
// through its own relation of a stacked (R*N, N) matrix (a single relation is the one-relation stack, every
// row relation 0), plain or QTO-negated, values only or with argmax; kgreason::project_out (into
// preallocated outputs) and kgreason::project_strategy (the per-row plan "auto" picks: 1 push, 2 pull,
// 3 sweep; for diagnostics and tests).  Kernels: cpu/project_cpu.cpp, cuda/*.cu.  The sparse-in, sparse-out
// variant is its own op (kgreason::project_multi_sparse, csrc/project_multi_sparse.cpp): its output has a
// data-dependent size.  Python entry point for all of them: ops.project (ops/projection.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/project_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // x (B,N) float32; rel (B,) int32/int64 in [0, R); (crow, col, val) the stacked (R*N, N) CSR (row r*N+i
  // is M_r[i,:]) and (tcrow, trow, tval) its stacked transpose (row r*N+j is M_r[:,j], rows ascending);
  // crow/tcrow int32 or int64, col/trow int32 or int64 (each pair one dtype); strategy 0 auto, 1 push,
  // 2 pull; negated: factor 1 - min(1, neg_scale * M) (1 where M has no entry).
  // Returns (Y (B,N) float32, argmax (B,N) int32 or empty).
  m.def(
      "project(Tensor x, Tensor rel, Tensor crow, Tensor col, Tensor val, Tensor tcrow, Tensor trow, "
      "Tensor tval, int num_entities, int strategy, bool negated, float neg_scale, bool want_argmax) "
      "-> (Tensor, Tensor)");
  m.def("project_strategy(Tensor x, Tensor rel, Tensor crow, int num_entities) -> Tensor");
  // project into preallocated outputs (ops.project(..., out=)): y (B,N) float32 and argmax (B,N) int32 or
  // empty (values only), contiguous, not overlapping x.  Reusing them across calls spares the page faults
  // of a fresh output (a (1024, 14505) float32 Y is 59 MB, above glibc's mmap threshold).
  m.def(
      "project_out(Tensor x, Tensor rel, Tensor crow, Tensor col, Tensor val, Tensor tcrow, Tensor trow, "
      "Tensor tval, int num_entities, int strategy, bool negated, float neg_scale, Tensor(a!) y, "
      "Tensor(b!) argmax) -> ()");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) {
  m.impl("project", &kgreason::cpu::project_cpu);
  m.impl("project_strategy", &kgreason::cpu::project_strategy_cpu);
  m.impl("project_out", &kgreason::cpu::project_out_cpu);
}
