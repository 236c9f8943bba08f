// CPU kernels of the fuzzy-set ops (declarations; schemas live in csrc/<op>.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

namespace kgreason {
namespace cpu {

// strategy codes of kgreason::project, shared with ops/projection.py (STRATEGIES)
constexpr int64_t kAuto = 0;
constexpr int64_t kPush = 1;
constexpr int64_t kPull = 2;

// CSR -> CSC (row indices ascending inside each column); returns (ccol, row, tval).
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& crow, const at::Tensor& col,
                                                                 const at::Tensor& val, int64_t n);

// k-ary element-wise reduction; op: 0 product, 1 min, 2 probabilistic sum, 3 max.
at::Tensor fuzzy_reduce_cpu(at::TensorList xs, int64_t op);

}  // namespace cpu
}  // namespace kgreason
