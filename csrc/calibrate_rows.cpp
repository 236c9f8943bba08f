// Schema and CPU registration of kgreason::calibrate_rows (the QTO calibration of score rows after the
// GEMM: softmax, times max(1, #observed), observed edges 1, threshold, cap; CSR out).  Used by
// kge.calibrate.RowCalibrator (eager builds and lazy artifacts).  Kernels: cpu/calibrate_rows_cpu.cpp,
// cuda/calibrate_rows_cuda.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/calibrate_rows_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // scores (c,N) float32 (finite; read only); observed tails per row as a CSR: obs_ptr (c+1,) int64 from 0,
  // obs_cols (E,) int32/int64 in [0, N); threshold > 0, delta in [0, 1).  Per row:
  //   p = softmax(scores[row]) * max(1, #observed);  keep p >= threshold;  p = min(p, 1 - delta);
  //   p = 1 at the observed columns (always kept).
  // Returns (row_nnz (c,) int64, cols (nnz,) int32 ascending within each row, vals (nnz,) float32).
  m.def(
      "calibrate_rows(Tensor scores, Tensor obs_ptr, Tensor obs_cols, float threshold, float delta) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("calibrate_rows", &kgreason::cpu::calibrate_rows_cpu); }
