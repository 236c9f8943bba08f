// CPU kernels of kgreason::calibrate_rows, calibrate_row_stats and calibrate_rows_normalised (declarations; schema in csrc/calibrate_rows.cpp,
// definition in cpu/calibrate_rows_cpu.cpp).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace kgreason {
namespace cpu {

// Calibrated rows from GEMM scores (c, N): softmax * max(1, #observed), observed -> 1, p >= threshold kept,
// min(p, 1 - delta).  Returns (row_nnz (c,) int64, cols int32, vals float32) CSR pieces.
std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_cpu(const at::Tensor& scores, const at::Tensor& obs_ptr,
                                                                  const at::Tensor& obs_cols, double threshold,
                                                                  double delta);

// Per-row partial statistics of a score block (c, N): (max (c,) float32, sum_j exp(s_j - max) (c,) float64),
// summed as calibrate_rows sums Z.  A zero-width block gives (-inf, 0).
std::tuple<at::Tensor, at::Tensor> calibrate_row_stats_cpu(const at::Tensor& scores);

// calibrate_rows with an outside normaliser per row: p_j = exp(s_j - row_max) * row_scale (row_max >= the row's
// scores, row_scale = k / Z > 0), observed -> 1, p >= threshold kept, min(p, 1 - delta).
std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_normalised_cpu(
    const at::Tensor& scores, const at::Tensor& row_max, const at::Tensor& row_scale, const at::Tensor& obs_ptr,
    const at::Tensor& obs_cols, double threshold, double delta);

}  // namespace cpu
}  // namespace kgreason
