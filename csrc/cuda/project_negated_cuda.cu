// CUDA kernels of kgreason::project_negated:
//   Y[b,j] = max_i X[b,i] * (1 - min(1, s * M[i,j]))   (factor 1 outside column j's support).
//
// 1. top_kernel: one block per query lists X[b,:]'s K = 32 largest positive
//    entries by (value desc, index asc), by K + 1 rounds of a block-wide
//    arg-max over the entries ranked after the previous pick (the extra round
//    only tells whether positive entries remain beyond the list).
// 2. negated_kernel: one warp per column j; per query, the lanes stride over
//    the support for the in-support products, and lane p tests list entry p
//    for membership in the support (binary search: CSC rows are sorted); a
//    ballot gives the first listed entity outside the support.  If all 32 are
//    inside and the row has more positive entries, the warp scans the row.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

constexpr int kTopK = kWarp;  // one list entry per lane

// (v, i) ranks strictly after (pv, pi) in (value desc, index asc) order.
__device__ __forceinline__ bool after(float v, int32_t i, float pv, int32_t pi) {
  return v < pv || (v == pv && i > pi);
}

__global__ void top_kernel(const float* __restrict__ X, int64_t N, float* __restrict__ topv,
                           int32_t* __restrict__ topi, int32_t* __restrict__ count, uint8_t* __restrict__ complete) {
  __shared__ float sv[kThreads / kWarp];
  __shared__ int32_t si[kThreads / kWarp];
  const int64_t b = blockIdx.x;
  const float* x = X + b * N;
  float pv = 2.f;  // above every value in [0, 1]
  int32_t pi = -1;
  int cnt = 0;
  for (int round = 0; round <= kTopK; ++round) {
    float best = 0.f;
    int32_t arg = -1;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const float v = x[i];
      if (v > 0.f && after(v, static_cast<int32_t>(i), pv, pi) && better(v, static_cast<int32_t>(i), best, arg)) {
        best = v;
        arg = static_cast<int32_t>(i);
      }
    }
    warp_best(best, arg);
    const int w = threadIdx.x / kWarp;
    if (threadIdx.x % kWarp == 0) {
      sv[w] = best;
      si[w] = arg;
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {
      const bool have = threadIdx.x < blockDim.x / kWarp;
      best = have ? sv[threadIdx.x] : 0.f;
      arg = have ? si[threadIdx.x] : -1;
      warp_best(best, arg);
      if (threadIdx.x == 0) {
        sv[0] = best;
        si[0] = arg;
      }
    }
    __syncthreads();
    best = sv[0];
    arg = si[0];
    __syncthreads();  // everyone has read sv[0] before the next round overwrites it
    if (!(best > 0.f)) break;
    if (round == kTopK) {  // a positive entry beyond the list
      if (threadIdx.x == 0) complete[b] = 0;
      break;
    }
    if (threadIdx.x == 0) {
      topv[b * kTopK + round] = best;
      topi[b * kTopK + round] = arg;
    }
    pv = best;
    pi = arg;
    ++cnt;
  }
  if (threadIdx.x == 0) count[b] = cnt;
}

template <typename idx_t>
__device__ __forceinline__ bool in_support(const idx_t* __restrict__ row, int64_t lo, int64_t hi, int64_t i) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const int64_t r = static_cast<int64_t>(row[mid]);
    if (r == i) return true;
    if (r < i) lo = mid + 1;
    else hi = mid;
  }
  return false;
}

template <typename idx_t, bool ARG>
__global__ void negated_kernel(const float* __restrict__ X, int64_t B, int64_t N, const idx_t* __restrict__ ccol,
                               const idx_t* __restrict__ row, const float* __restrict__ tval, float s,
                               const float* __restrict__ topv, const int32_t* __restrict__ topi,
                               const int32_t* __restrict__ count, const uint8_t* __restrict__ complete,
                               float* __restrict__ Y, int32_t* __restrict__ A) {
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
        const float f = 1.f - fminf(1.f, s * tval[k]);
        const float p = x[i] * f;
        if (better(p, i, best, arg)) {
          best = p;
          arg = i;
        }
      }
      // out of support: first listed entry not in supp(j)
      const int cnt = count[b];
      bool outside = false;
      if (lane < cnt) outside = !in_support(row, start, end, topi[b * kTopK + lane]);
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, outside);
      if (ballot != 0u) {
        const int first = __ffs(ballot) - 1;
        const float ov = topv[b * kTopK + first];
        const int32_t oi = topi[b * kTopK + first];
        if (better(ov, oi, best, arg)) {
          best = ov;
          arg = oi;
        }
      } else if (!complete[b]) {
        for (int64_t i = lane; i < N; i += kWarp) {
          const float v = x[i];
          if (better(v, static_cast<int32_t>(i), best, arg) && !in_support(row, start, end, i)) {
            best = v;
            arg = static_cast<int32_t>(i);
          }
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

// crow/col (the CSR structure) are part of the schema for the CPU kernel's
// per-query pass; the warp-per-column kernel here only needs the CSC.
std::tuple<at::Tensor, at::Tensor> project_negated_cuda(const at::Tensor& x_in, const at::Tensor& crow_in,
                                                        const at::Tensor& col_in, const at::Tensor& ccol_in,
                                                        const at::Tensor& row_in, const at::Tensor& tval_in,
                                                        double neg_scale, bool want_argmax) {
  TORCH_CHECK(x_in.is_cuda() && x_in.scalar_type() == at::kFloat && x_in.dim() == 2,
              "kgreason::project_negated: X must be a 2-D float32 CUDA tensor");
  TORCH_CHECK(ccol_in.scalar_type() == row_in.scalar_type() && crow_in.scalar_type() == ccol_in.scalar_type() &&
                  col_in.scalar_type() == ccol_in.scalar_type(),
              "kgreason::project_negated: index dtypes differ");
  TORCH_CHECK(neg_scale >= 0.0, "kgreason::project_negated: neg_scale must be >= 0");
  const c10::DeviceGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), ccol = ccol_in.contiguous(), row = row_in.contiguous(),
                   tval = tval_in.contiguous();
  const int64_t B = x.size(0), N = x.size(1);
  TORCH_CHECK(ccol.numel() == N + 1, "kgreason::project_negated: ccol must have N+1 entries");
  const auto int_opts = x.options().dtype(at::kInt);
  at::Tensor y = at::empty({B, N}, x.options());
  at::Tensor a = want_argmax ? at::empty({B, N}, int_opts) : at::empty({0}, int_opts);
  if (B * N == 0) return {y, a};
  const cudaStream_t stream = current_stream(x.device());
  at::Tensor topv = at::zeros({B, kTopK}, x.options());
  at::Tensor topi = at::full({B, kTopK}, -1, int_opts);
  at::Tensor count = at::zeros({B}, int_opts);
  at::Tensor complete = at::ones({B}, x.options().dtype(at::kByte));
  top_kernel<<<B, kThreads, 0, stream>>>(x.data_ptr<float>(), N, topv.data_ptr<float>(), topi.data_ptr<int32_t>(),
                                         count.data_ptr<int32_t>(), complete.data_ptr<uint8_t>());
  check_launch("project_negated top lists");
  const int64_t grid = blocks_for(N, kThreads / kWarp);
  const float s = static_cast<float>(neg_scale);
  auto go = [&](auto idx_tag) {
    using idx_t = decltype(idx_tag);
    if (want_argmax)
      negated_kernel<idx_t, true><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
          topv.data_ptr<float>(), topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(), complete.data_ptr<uint8_t>(),
          y.data_ptr<float>(), a.data_ptr<int32_t>());
    else
      negated_kernel<idx_t, false><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
          topv.data_ptr<float>(), topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(), complete.data_ptr<uint8_t>(),
          y.data_ptr<float>(), nullptr);
    check_launch("project_negated");
  };
  if (ccol.scalar_type() == at::kInt)
    go(int32_t{});
  else
    go(int64_t{});
  return {y, a};
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) { m.impl("project_negated", &kgreason::cuda::project_negated_cuda); }
