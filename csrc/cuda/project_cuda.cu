// CUDA kernels of kgreason::project (max-times projection).
//
// push: one thread per (query b, entity i) with X[b,i] > 0 walks row i of M
//       and atomically maxes products into Y[b,:].  Products are in [0, 1] and
//       non-negative floats order like their bits, so the max is an integer
//       atomicMax on the float bits; with argmax a 64-bit atomicMax on
//       (value bits << 32 | ~i) keeps the smallest i among equal values.
// pull: one warp per column j; for each query the lanes stride over the
//       column's support, then a shuffle reduction by (value desc, index asc).
// auto: push when under 5% of X is active (one-hot anchors: a few rows of M
//       per query instead of all nnz), pull otherwise (no atomics).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

constexpr double kPushMaxActiveFraction = 0.05;

template <typename idx_t>
__global__ void push_value_kernel(const float* __restrict__ X, int64_t B, int64_t N, const idx_t* __restrict__ crow,
                                  const idx_t* __restrict__ col, const float* __restrict__ val,
                                  unsigned int* __restrict__ ybits) {
  const int64_t total = B * N;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = X[e];
    if (!(x > 0.f)) continue;
    const int64_t b = e / N, i = e - b * N;
    unsigned int* y = ybits + b * N;
    for (int64_t k = crow[i], end = crow[i + 1]; k < end; ++k) {
      const float p = x * val[k];
      if (p > 0.f) atomicMax(y + static_cast<int64_t>(col[k]), __float_as_uint(p));
    }
  }
}

template <typename idx_t>
__global__ void push_argmax_kernel(const float* __restrict__ X, int64_t B, int64_t N, const idx_t* __restrict__ crow,
                                   const idx_t* __restrict__ col, const float* __restrict__ val,
                                   unsigned long long* __restrict__ keys) {
  const int64_t total = B * N;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = X[e];
    if (!(x > 0.f)) continue;
    const int64_t b = e / N, i = e - b * N;
    unsigned long long* key = keys + b * N;
    for (int64_t k = crow[i], end = crow[i + 1]; k < end; ++k) {
      const float p = x * val[k];
      if (p > 0.f) atomicMax(key + static_cast<int64_t>(col[k]), pack_value_index(p, i));
    }
  }
}

__global__ void unpack_kernel(const unsigned long long* __restrict__ keys, int64_t total, float* __restrict__ Y,
                              int32_t* __restrict__ A) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long k = keys[e];
    const unsigned int hi = static_cast<unsigned int>(k >> 32);
    Y[e] = __uint_as_float(hi);
    A[e] = hi == 0u ? -1 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k & 0xFFFFFFFFull));
  }
}

template <typename idx_t, bool ARG>
__global__ void pull_kernel(const float* __restrict__ X, int64_t B, int64_t N, const idx_t* __restrict__ ccol,
                            const idx_t* __restrict__ row, const float* __restrict__ tval, float* __restrict__ Y,
                            int32_t* __restrict__ A) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t j = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp; j < N; j += warps) {
    const int64_t start = ccol[j], end = ccol[j + 1];
    for (int64_t b = 0; b < B; ++b) {
      const float* x = X + b * N;
      float best = 0.f;
      int32_t arg = -1;
      for (int64_t k = start + lane; k < end; k += kWarp) {
        const int32_t i = static_cast<int32_t>(row[k]);
        const float p = x[i] * tval[k];
        if (better(p, i, best, arg)) {
          best = p;
          arg = i;
        }
      }
      warp_best(best, arg);
      if (lane == 0) {
        Y[b * N + j] = best;
        if (ARG) A[b * N + j] = best > 0.f ? arg : -1;
      }
    }
  }
}

template <typename idx_t>
void run(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val,
         const at::Tensor& ccol, const at::Tensor& row, const at::Tensor& tval, bool push, bool want_argmax,
         at::Tensor& y, at::Tensor& a) {
  const int64_t B = x.size(0), N = x.size(1);
  const cudaStream_t stream = current_stream(x.device());
  const auto int_opts = x.options().dtype(at::kInt);
  if (push) {
    const int64_t grid = blocks_for(B * N, kThreads);
    if (want_argmax) {
      at::Tensor keys = at::zeros({B, N}, x.options().dtype(at::kLong));
      push_argmax_kernel<idx_t><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
          reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>()));
      check_launch("project push (argmax)");
      y = at::empty({B, N}, x.options());
      a = at::empty({B, N}, int_opts);
      unpack_kernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const unsigned long long*>(keys.data_ptr<int64_t>()),
                                                   B * N, y.data_ptr<float>(), a.data_ptr<int32_t>());
      check_launch("project unpack");
    } else {
      y = at::zeros({B, N}, x.options());
      a = at::empty({0}, int_opts);
      push_value_kernel<idx_t><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
          reinterpret_cast<unsigned int*>(y.data_ptr<float>()));
      check_launch("project push");
    }
    return;
  }
  y = at::empty({B, N}, x.options());
  a = want_argmax ? at::empty({B, N}, int_opts) : at::empty({0}, int_opts);
  const int64_t grid = blocks_for(N, kThreads / kWarp);
  if (want_argmax)
    pull_kernel<idx_t, true><<<grid, kThreads, 0, stream>>>(x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(),
                                                           row.data_ptr<idx_t>(), tval.data_ptr<float>(),
                                                           y.data_ptr<float>(), a.data_ptr<int32_t>());
  else
    pull_kernel<idx_t, false><<<grid, kThreads, 0, stream>>>(x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(),
                                                            row.data_ptr<idx_t>(), tval.data_ptr<float>(),
                                                            y.data_ptr<float>(), nullptr);
  check_launch("project pull");
}

std::tuple<at::Tensor, at::Tensor> project_cuda(const at::Tensor& x_in, const at::Tensor& crow_in,
                                                const at::Tensor& col_in, const at::Tensor& val_in,
                                                const at::Tensor& ccol_in, const at::Tensor& row_in,
                                                const at::Tensor& tval_in, int64_t strategy, bool want_argmax) {
  TORCH_CHECK(x_in.is_cuda() && x_in.scalar_type() == at::kFloat && x_in.dim() == 2,
              "kgreason::project: X must be a 2-D float32 CUDA tensor");
  TORCH_CHECK(strategy >= 0 && strategy <= 2, "kgreason::project: strategy must be 0, 1 or 2, got ", strategy);
  TORCH_CHECK(crow_in.scalar_type() == col_in.scalar_type() && ccol_in.scalar_type() == crow_in.scalar_type() &&
                  row_in.scalar_type() == crow_in.scalar_type(),
              "kgreason::project: index tensors must share one dtype");
  const c10::DeviceGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), crow = crow_in.contiguous(), col = col_in.contiguous(),
                   val = val_in.contiguous(), ccol = ccol_in.contiguous(), row = row_in.contiguous(),
                   tval = tval_in.contiguous();
  const int64_t B = x.size(0), N = x.size(1);
  TORCH_CHECK(crow.numel() == N + 1 && ccol.numel() == N + 1, "kgreason::project: pointers must have N+1 entries");
  bool push = strategy == 1;
  if (strategy == 0 && B * N > 0) {
    const double active = static_cast<double>(at::count_nonzero(x).item<int64_t>());
    push = active < kPushMaxActiveFraction * static_cast<double>(B * N);
  }
  at::Tensor y, a;
  if (B * N == 0) {
    y = at::zeros({B, N}, x.options());
    a = want_argmax ? at::full({B, N}, -1, x.options().dtype(at::kInt)) : at::empty({0}, x.options().dtype(at::kInt));
    return {y, a};
  }
  if (crow.scalar_type() == at::kInt)
    run<int32_t>(x, crow, col, val, ccol, row, tval, push, want_argmax, y, a);
  else
    run<int64_t>(x, crow, col, val, ccol, row, tval, push, want_argmax, y, a);
  return {y, a};
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) { m.impl("project", &kgreason::cuda::project_cuda); }
