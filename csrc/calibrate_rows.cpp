// Schemas and CPU registrations of kgreason::calibrate_rows (the QTO calibration of score rows after the
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
  // The two halves of calibrate_rows for a row split into column blocks (engine.exec.sharded_lazy: each rank
  // holds a block of every row; the blocks' statistics merged as a log-sum-exp give the row's normaliser).
  // scores (c,N) float32.  Returns (row_max (c,) float32, row_sumexp (c,) float64): per row its max m and
  // sum_j exp(s_j - m), summed as calibrate_rows sums Z; N = 0 gives (-inf, 0).
  m.def("calibrate_row_stats(Tensor scores) -> (Tensor, Tensor)");
  // calibrate_rows with the normaliser given per row: row_max (c,) float32 (the max over the whole row, >= every
  // score here; finite) and row_scale (c,) float32 (k / Z, finite, > 0).  Per row:
  //   p = exp(scores[row] - row_max) * row_scale;  keep p >= threshold;  p = min(p, 1 - delta);
  //   p = 1 at the observed columns (always kept).  Output as calibrate_rows'.
  m.def(
      "calibrate_rows_normalised(Tensor scores, Tensor row_max, Tensor row_scale, Tensor obs_ptr, Tensor obs_cols, "
      "float threshold, float delta) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) {
  m.impl("calibrate_rows", &kgreason::cpu::calibrate_rows_cpu);
  m.impl("calibrate_row_stats", &kgreason::cpu::calibrate_row_stats_cpu);
  m.impl("calibrate_rows_normalised", &kgreason::cpu::calibrate_rows_normalised_cpu);
}
