// Fused k-ary fuzzy intersection / union: one pass over the k inputs.
//
// Chained torch ops make k-1 passes (product, min, max: each reads two
// tensors and writes one) or 2k+1 passes (probabilistic sum: k complements,
// k-1 products, one complement).  Here each thread takes a chunk of 4096
// elements (16 KB, L1-resident), folds the k inputs into it with contiguous,
// vectorised loops and writes the result once.  The union by probabilistic
// sum keeps prod(1 - x) and complements at the end, so it stays in [0, 1].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "fuzzy_common.h"
#include "fuzzy_cpu.h"

namespace kgreason {
namespace cpu {

at::Tensor fuzzy_reduce_cpu(at::TensorList xs_in, int64_t op) {
  TORCH_CHECK(!xs_in.empty(), "kgreason::fuzzy_reduce: needs at least one tensor");
  TORCH_CHECK(op >= 0 && op <= 3, "kgreason::fuzzy_reduce: op must be 0..3, got ", op);
  std::vector<at::Tensor> xs;
  xs.reserve(xs_in.size());
  for (const auto& x : xs_in) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "kgreason::fuzzy_reduce: CPU float32 inputs");
    TORCH_CHECK(x.sizes() == xs_in[0].sizes(), "kgreason::fuzzy_reduce: shapes differ: ", x.sizes(), " vs ",
                xs_in[0].sizes());
    xs.push_back(x.contiguous());
  }
  at::Tensor out = detail::empty_output(xs[0].sizes(), xs[0].options());
  const int64_t n = out.numel();
  std::vector<const float*> src;
  for (const auto& x : xs) src.push_back(x.data_ptr<float>());
  float* dst = out.data_ptr<float>();
  const size_t k = src.size();
  constexpr int64_t kChunk = 4096;
  // ~0.3 ns per element and input; small batches stay on the calling thread
  detail::parallel_if(0.3 * static_cast<double>(n) * static_cast<double>(k), 0, n, kChunk, [&](int64_t lo, int64_t hi) {
    for (int64_t c0 = lo; c0 < hi; c0 += kChunk) {
      const int64_t len = std::min(hi, c0 + kChunk) - c0;
      float* o = dst + c0;
      const float* x0 = src[0] + c0;
      switch (op) {
        case 0:  // product t-norm
          for (int64_t e = 0; e < len; ++e) o[e] = x0[e];
          for (size_t m = 1; m < k; ++m) {
            const float* x = src[m] + c0;
            for (int64_t e = 0; e < len; ++e) o[e] *= x[e];
          }
          break;
        case 1:  // Goedel t-norm
          for (int64_t e = 0; e < len; ++e) o[e] = x0[e];
          for (size_t m = 1; m < k; ++m) {
            const float* x = src[m] + c0;
            for (int64_t e = 0; e < len; ++e) o[e] = std::min(o[e], x[e]);
          }
          break;
        case 2:  // probabilistic sum 1 - prod(1 - x)
          for (int64_t e = 0; e < len; ++e) o[e] = 1.f - x0[e];
          for (size_t m = 1; m < k; ++m) {
            const float* x = src[m] + c0;
            for (int64_t e = 0; e < len; ++e) o[e] *= 1.f - x[e];
          }
          for (int64_t e = 0; e < len; ++e) o[e] = 1.f - o[e];
          break;
        default:  // Goedel t-conorm
          for (int64_t e = 0; e < len; ++e) o[e] = x0[e];
          for (size_t m = 1; m < k; ++m) {
            const float* x = src[m] + c0;
            for (int64_t e = 0; e < len; ++e) o[e] = std::max(o[e], x[e]);
          }
          break;
      }
    }
  });
  return out;
}

}  // namespace cpu
}  // namespace kgreason
