// Schema and CPU registration of kgreason::project_multi (every row of a batch
// projected through its own relation of a stacked (R*N, N) matrix, in one call)
// and kgreason::project_multi_strategy (the per-row plan "auto" picks: 1 push, 2 pull, 3 sweep; for
// diagnostics and tests).  Kernels: cpu/project_multi_cpu.cpp, cuda/project_multi_cuda.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/project_multi_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // x (B,N) float32; rel (B,) int32/int64 in [0, R); (crow, col, val) the stacked (R*N, N) CSR (row r*N+i
  // is M_r[i,:]) and (tcrow, trow, tval) its stacked transpose (row r*N+j is M_r[:,j], rows ascending);
  // crow/tcrow int32 or int64, col/trow int32 or int64 (each pair one dtype); strategy 0 auto, 1 push,
  // 2 pull; negated: factor 1 - min(1, neg_scale * M) (1 where M has no entry).
  // Returns (Y (B,N) float32, argmax (B,N) int32 or empty).
  m.def(
      "project_multi(Tensor x, Tensor rel, Tensor crow, Tensor col, Tensor val, Tensor tcrow, Tensor trow, "
      "Tensor tval, int num_entities, int strategy, bool negated, float neg_scale, bool want_argmax) "
      "-> (Tensor, Tensor)");
  m.def("project_multi_strategy(Tensor x, Tensor rel, Tensor crow, int num_entities) -> Tensor");
  // project_multi into preallocated outputs (ops.project_multi(..., out=)): y (B,N) float32 and argmax
  // (B,N) int32 or empty (values only), contiguous, not overlapping x.
  m.def(
      "project_multi_out(Tensor x, Tensor rel, Tensor crow, Tensor col, Tensor val, Tensor tcrow, Tensor trow, "
      "Tensor tval, int num_entities, int strategy, bool negated, float neg_scale, Tensor(a!) y, "
      "Tensor(b!) argmax) -> ()");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) {
  m.impl("project_multi", &kgreason::cpu::project_multi_cpu);
  m.impl("project_multi_strategy", &kgreason::cpu::project_multi_strategy_cpu);
  m.impl("project_multi_out", &kgreason::cpu::project_multi_out_cpu);
}
