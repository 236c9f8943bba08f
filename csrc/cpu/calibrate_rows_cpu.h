// CPU kernel of kgreason::calibrate_rows (declaration; schema in csrc/calibrate_rows.cpp,
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

}  // namespace cpu
}  // namespace kgreason
