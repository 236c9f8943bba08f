// CPU kernels of the fuzzy-set ops (declarations; schemas live in csrc/<op>.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

namespace kgreason {
namespace cpu {

// strategy codes shared with ops/projection.py (STRATEGIES)
constexpr int64_t kAuto = 0;
constexpr int64_t kPush = 1;
constexpr int64_t kPull = 2;

// Y[b,j] = max_i X[b,i] * M[i,j]; returns (Y, argmax) (argmax empty when !want_argmax).
std::tuple<at::Tensor, at::Tensor> project_cpu(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col,
                                               const at::Tensor& val, const at::Tensor& ccol, const at::Tensor& row,
                                               const at::Tensor& tval, int64_t strategy, bool want_argmax);

// project writing into preallocated outputs: y (B,N) float32 and argmax (B,N) int32, or an empty
// argmax for values only; both contiguous, on X's device, not overlapping X.
void project_out_cpu(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val,
                     const at::Tensor& ccol, const at::Tensor& row, const at::Tensor& tval, int64_t strategy,
                     at::Tensor& y, at::Tensor& argmax);

// The validation of project_out's outputs (shared with project_multi_out).
void check_out(const at::Tensor& x, const at::Tensor& y, const at::Tensor& argmax, const char* op);

// The strategy (kPush / kPull) that kAuto picks for this X.
int64_t project_strategy_cpu(const at::Tensor& x, const at::Tensor& crow, int64_t nnz);

// Y[b,j] = max_i X[b,i] * (1 - min(1, s * M[i,j])), from the CSR structure and the CSC of M.
std::tuple<at::Tensor, at::Tensor> project_negated_cpu(const at::Tensor& x, const at::Tensor& crow,
                                                       const at::Tensor& col, const at::Tensor& ccol,
                                                       const at::Tensor& row, const at::Tensor& tval,
                                                       double neg_scale, bool want_argmax);

// CSR -> CSC (row indices ascending inside each column); returns (ccol, row, tval).
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& crow, const at::Tensor& col,
                                                                 const at::Tensor& val, int64_t n);

// k-ary element-wise reduction; op: 0 product, 1 min, 2 probabilistic sum, 3 max.
at::Tensor fuzzy_reduce_cpu(at::TensorList xs, int64_t op);

}  // namespace cpu
}  // namespace kgreason
