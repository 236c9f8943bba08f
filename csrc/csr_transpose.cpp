// Schema and CPU registration of kgreason::csr_transpose: the stacked (R*N, N) CSR of R relation
// matrices (crow has R*N+1 entries; R = 1 for one matrix) to its stacked transpose (row r*N + j is
// column j of M_r), used by ops.prepare_matrices.  Kernel: cpu/csr_transpose_cpu.cpp.  On CUDA,
// prepare_matrices transposes with torch ops instead (a stable argsort), which is fast there.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/fuzzy_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  m.def("csr_transpose(Tensor crow, Tensor col, Tensor val, int n) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("csr_transpose", &kgreason::cpu::csr_transpose_cpu); }
