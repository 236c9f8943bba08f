// Schema and CPU registration of kgreason::project_negated (QTO's negated
// projection, without materialising 1 - M).  Kernels:
// cpu/project_negated_cpu.cpp, cuda/project_negated_cuda.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/fuzzy_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // x (B,N) float32; (crow, col) the CSR structure of M (N,N) and (ccol, row, tval) its CSC with rows
  // ascending per column.  Returns (Y (B,N) float32, argmax (B,N) int32 or empty).
  m.def(
      "project_negated(Tensor x, Tensor crow, Tensor col, Tensor ccol, Tensor row, Tensor tval, float neg_scale, "
      "bool want_argmax) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("project_negated", &kgreason::cpu::project_negated_cpu); }
