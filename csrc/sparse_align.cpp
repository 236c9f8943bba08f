// Schema and CPU registration of kgreason::sparse_align: the support intersection or union of k sparse
// batches (compressed rows) and each one's values on it (ops/sparse_rows.py's sparse_align, from which
// intersect_sparse / union_sparse fold the t-norm / t-conorm).  Kernel: cpu/sparse_align_cpu.cpp; no
// CUDA kernel (the wrapper runs the pure-torch reference there).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/sparse_rows_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // crows[m] int64 (B+1,), cols[m] int64 (nnz_m,) strictly ascending per row, vals[m] float32 (nnz_m,),
  // for k >= 1 inputs with the same B.  intersect: columns in every input's row; else in any.
  // Returns (crow int64 (B+1,), col int64 (nnz,), vals float32 (k, nnz)), vals 0 where an input has no entry.
  m.def("sparse_align(Tensor[] crows, Tensor[] cols, Tensor[] vals, bool intersect) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("sparse_align", &kgreason::cpu::sparse_align_cpu); }
