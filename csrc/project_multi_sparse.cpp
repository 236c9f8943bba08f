// Schema and CPU registration of kgreason::project_multi_sparse: a sparse batch (compressed rows) projected
// row by row through its own relation of a stacked (R*N, N) matrix, sparse out (ops/sparse_rows.py's
// project_multi_sparse).  Kernel: cpu/project_multi_sparse_cpu.cpp; no CUDA kernel (the wrapper runs
// the pure-torch reference there).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/sparse_rows_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // (xcrow int64 (B+1,), xcol int64 (nnz,), xval float32 (nnz,)) the input rows (columns in [0, n));
  // rel (B,) int64 (int32 accepted) in [0, R); (crow, col, val) the stacked (R*N, N) CSR, row r*N + i
  // is M_r[i, :] (crow, col int32 or int64 each); n = N.
  // Returns (crow int64 (B+1,), col int64 (nnz_out,), val float32 (nnz_out,)): row b holds every j of
  // a row of M_{rel[b]} of an entity i with X[b, i] > 0, ascending, Y[b, j] = max_i X[b, i] * M[i, j].
  m.def(
      "project_multi_sparse(Tensor xcrow, Tensor xcol, Tensor xval, Tensor rel, Tensor crow, Tensor col, "
      "Tensor val, int n) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("project_multi_sparse", &kgreason::cpu::project_multi_sparse_cpu); }
