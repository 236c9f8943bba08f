// Schema and CPU registration of kgreason::project (max-times projection) and
// kgreason::project_strategy (which strategy "auto" picks; for diagnostics).
// Kernels: cpu/project_cpu.cpp, cuda/project_cuda.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/fuzzy_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // x (B,N) float32; (crow, col, val) CSR and (ccol, row, tval) CSC of M (N,N), int32 or int64 indices;
  // strategy 0 auto, 1 push, 2 pull.  Returns (Y (B,N) float32, argmax (B,N) int32 or empty).
  m.def(
      "project(Tensor x, Tensor crow, Tensor col, Tensor val, Tensor ccol, Tensor row, Tensor tval, "
      "int strategy, bool want_argmax) -> (Tensor, Tensor)");
  // Returns the strategy code (1 push, 2 pull) as a 0-dim int64 tensor: the choice depends on X's
  // values, and a tensor (unlike an int) can stand for it in fake/meta tracing (ops/_fake.py).
  m.def("project_strategy(Tensor x, Tensor crow, int nnz) -> Tensor");
  // project into preallocated outputs (ops.project(..., out=)): y (B,N) float32 and argmax (B,N) int32 or
  // empty (values only), contiguous, not overlapping x.  Reusing them across calls spares the page faults
  // of a fresh output (a (1024, 14505) float32 Y is 59 MB, above glibc's mmap threshold).
  m.def(
      "project_out(Tensor x, Tensor crow, Tensor col, Tensor val, Tensor ccol, Tensor row, Tensor tval, "
      "int strategy, Tensor(a!) y, Tensor(b!) argmax) -> ()");
}

namespace {
at::Tensor project_strategy_tensor(const at::Tensor& x, const at::Tensor& crow, int64_t nnz) {
  return at::scalar_tensor(kgreason::cpu::project_strategy_cpu(x, crow, nnz), at::TensorOptions().dtype(at::kLong));
}
}  // namespace

TORCH_LIBRARY_IMPL(kgreason, CPU, m) {
  m.impl("project", &kgreason::cpu::project_cpu);
  m.impl("project_strategy", &project_strategy_tensor);
  m.impl("project_out", &kgreason::cpu::project_out_cpu);
}
