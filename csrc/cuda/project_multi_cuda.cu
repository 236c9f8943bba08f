// CUDA kernels of kgreason::project_multi: row b of the batch projected through
// relation rel[b] of the stacked (R*N, N) CSR (row r*N + i is M_r[i,:]) or,
// for pull, its stacked transpose (row r*N + j is M_r[:,j], rows ascending).
// The patterns are project_cuda.cu's and project_negated_cuda.cu's with a
// per-row offset r*N into the stack:
//
// push: one thread per (query b, entity i) with X[b,i] > 0 walks row
//       rel[b]*N + i and atomically maxes products into Y[b,:] (integer atomicMax
//       on the float bits; with argmax a 64-bit atomicMax on (bits << 32 | ~i),
//       so the smallest i wins among equal values).
// pull: one warp per column j; for each query b the lanes stride over column
//       j of M_{rel[b]}, then a shuffle reduction by (value desc, index asc).
//       Rows of different relations need no grouping: each (j, b) reads its own
//       support, and the warp's loads of one support are coalesced.
// auto: push when under 5% of X is active, else pull (as project_cuda.cu).
// negated: per query, the K = 32 largest entries of X[b,:] (top_kernel, as in
//       project_negated_cuda.cu); then one warp per column j computes, per query,
//       the in-support products through M_{rel[b]} and the first listed entity
//       outside the support (always this pull form, like project_negated: Y is
//       dense whatever X is).
// top_kernel and the membership search are copies of project_negated_cuda.cu's
// (file-local there); the ownership of that file kept them from being hoisted
// into fuzzy_cuda_common.cuh in this change.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

constexpr double kPushMaxActiveFraction = 0.05;
constexpr int kTopK = kWarp;  // one list entry per lane

template <typename ptr_t, typename idx_t>
__global__ void multi_push_value_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                                        int64_t N, const ptr_t* __restrict__ crow, const idx_t* __restrict__ col,
                                        const float* __restrict__ val, unsigned int* __restrict__ ybits) {
  const int64_t total = B * N;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = X[e];
    if (!(x > 0.f)) continue;
    const int64_t b = e / N, i = e - b * N;
    const int64_t row = rel[b] * N + i;
    unsigned int* y = ybits + b * N;
    for (int64_t k = crow[row], end = crow[row + 1]; k < end; ++k) {
      const float p = x * val[k];
      if (p > 0.f) atomicMax(y + static_cast<int64_t>(col[k]), __float_as_uint(p));
    }
  }
}

template <typename ptr_t, typename idx_t>
__global__ void multi_push_argmax_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                                         int64_t N, const ptr_t* __restrict__ crow, const idx_t* __restrict__ col,
                                         const float* __restrict__ val, unsigned long long* __restrict__ keys) {
  const int64_t total = B * N;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = X[e];
    if (!(x > 0.f)) continue;
    const int64_t b = e / N, i = e - b * N;
    const int64_t row = rel[b] * N + i;
    unsigned long long* key = keys + b * N;
    for (int64_t k = crow[row], end = crow[row + 1]; k < end; ++k) {
      const float p = x * val[k];
      if (p > 0.f) atomicMax(key + static_cast<int64_t>(col[k]), pack_value_index(p, i));
    }
  }
}

__global__ void multi_unpack_kernel(const unsigned long long* __restrict__ keys, int64_t total, float* __restrict__ Y,
                                    int32_t* __restrict__ A) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long k = keys[e];
    const unsigned int hi = static_cast<unsigned int>(k >> 32);
    Y[e] = __uint_as_float(hi);
    A[e] = hi == 0u ? -1 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k & 0xFFFFFFFFull));
  }
}

template <typename ptr_t, typename idx_t, bool ARG>
__global__ void multi_pull_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B, int64_t N,
                                  const ptr_t* __restrict__ tcrow, const idx_t* __restrict__ trow,
                                  const float* __restrict__ tval, float* __restrict__ Y, int32_t* __restrict__ A) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t j = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp; j < N; j += warps) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t col = rel[b] * N + j;
      const int64_t start = tcrow[col], end = tcrow[col + 1];
      const float* x = X + b * N;
      float best = 0.f;
      int32_t arg = -1;
      for (int64_t k = start + lane; k < end; k += kWarp) {
        const int32_t i = static_cast<int32_t>(trow[k]);
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

// (v, i) ranks strictly after (pv, pi) in (value desc, index asc) order.
__device__ __forceinline__ bool after(float v, int32_t i, float pv, int32_t pi) {
  return v < pv || (v == pv && i > pi);
}

// One block per query: X[b,:]'s K largest positive entries by (value desc, index asc), by K + 1 rounds of
// a block-wide arg-max over the entries ranked after the previous pick (the extra round only tells whether
// positive entries remain beyond the list).
__global__ void multi_top_kernel(const float* __restrict__ X, int64_t N, float* __restrict__ topv,
                                 int32_t* __restrict__ topi, int32_t* __restrict__ count,
                                 uint8_t* __restrict__ complete) {
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

// Is entity i among trow[lo..hi) (sorted ascending)?
template <typename idx_t>
__device__ __forceinline__ bool in_support(const idx_t* __restrict__ trow, int64_t lo, int64_t hi, int64_t i) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const int64_t r = static_cast<int64_t>(trow[mid]);
    if (r == i) return true;
    if (r < i)
      lo = mid + 1;
    else
      hi = mid;
  }
  return false;
}

template <typename ptr_t, typename idx_t, bool ARG>
__global__ void multi_negated_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                                     int64_t N, const ptr_t* __restrict__ tcrow, const idx_t* __restrict__ trow,
                                     const float* __restrict__ tval, float s, const float* __restrict__ topv,
                                     const int32_t* __restrict__ topi, const int32_t* __restrict__ count,
                                     const uint8_t* __restrict__ complete, float* __restrict__ Y,
                                     int32_t* __restrict__ A) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t j = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp; j < N; j += warps) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t col = rel[b] * N + j;
      const int64_t start = tcrow[col], end = tcrow[col + 1];
      const float* x = X + b * N;
      float best = 0.f;
      int32_t arg = -1;
      for (int64_t k = start + lane; k < end; k += kWarp) {
        const int32_t i = static_cast<int32_t>(trow[k]);
        const float f = 1.f - fminf(1.f, s * tval[k]);
        const float p = x[i] * f;
        if (better(p, i, best, arg)) {
          best = p;
          arg = i;
        }
      }
      // out of support: the first listed entry not in supp(j)
      const int cnt = count[b];
      bool outside = false;
      if (lane < cnt) outside = !in_support(trow, start, end, topi[b * kTopK + lane]);
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
          if (better(v, static_cast<int32_t>(i), best, arg) && !in_support(trow, start, end, i)) {
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

template <typename ptr_t, typename idx_t>
void run(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, const at::Tensor& col,
         const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow, const at::Tensor& tval, int64_t N,
         int64_t strategy, bool negated, float s, bool want_argmax, at::Tensor& y, at::Tensor& a) {
  const int64_t B = x.size(0);
  const cudaStream_t stream = current_stream(x.device());
  const auto int_opts = x.options().dtype(at::kInt);
  const int64_t* r = rel.data_ptr<int64_t>();
  if (negated) {
    y = at::empty({B, N}, x.options());
    a = want_argmax ? at::empty({B, N}, int_opts) : at::empty({0}, int_opts);
    at::Tensor topv = at::zeros({B, kTopK}, x.options());
    at::Tensor topi = at::full({B, kTopK}, -1, int_opts);
    at::Tensor count = at::zeros({B}, int_opts);
    at::Tensor complete = at::ones({B}, x.options().dtype(at::kByte));
    multi_top_kernel<<<B, kThreads, 0, stream>>>(x.data_ptr<float>(), N, topv.data_ptr<float>(),
                                                 topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(),
                                                 complete.data_ptr<uint8_t>());
    check_launch("project_multi top lists");
    const int64_t grid = blocks_for(N, kThreads / kWarp);
    if (want_argmax)
      multi_negated_kernel<ptr_t, idx_t, true><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), r, B, N, tcrow.data_ptr<ptr_t>(), trow.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
          topv.data_ptr<float>(), topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(), complete.data_ptr<uint8_t>(),
          y.data_ptr<float>(), a.data_ptr<int32_t>());
    else
      multi_negated_kernel<ptr_t, idx_t, false><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), r, B, N, tcrow.data_ptr<ptr_t>(), trow.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
          topv.data_ptr<float>(), topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(), complete.data_ptr<uint8_t>(),
          y.data_ptr<float>(), nullptr);
    check_launch("project_multi negated");
    return;
  }
  bool push = strategy == 1;
  if (strategy == 0) {
    const double active = static_cast<double>(at::count_nonzero(x).item<int64_t>());
    push = active < kPushMaxActiveFraction * static_cast<double>(B * N);
  }
  if (push) {
    const int64_t grid = blocks_for(B * N, kThreads);
    if (want_argmax) {
      at::Tensor keys = at::zeros({B, N}, x.options().dtype(at::kLong));
      multi_push_argmax_kernel<ptr_t, idx_t><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), r, B, N, crow.data_ptr<ptr_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
          reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>()));
      check_launch("project_multi push (argmax)");
      y = at::empty({B, N}, x.options());
      a = at::empty({B, N}, int_opts);
      multi_unpack_kernel<<<grid, kThreads, 0, stream>>>(
          reinterpret_cast<const unsigned long long*>(keys.data_ptr<int64_t>()), B * N, y.data_ptr<float>(),
          a.data_ptr<int32_t>());
      check_launch("project_multi unpack");
    } else {
      y = at::zeros({B, N}, x.options());
      a = at::empty({0}, int_opts);
      multi_push_value_kernel<ptr_t, idx_t><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<float>(), r, B, N, crow.data_ptr<ptr_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
          reinterpret_cast<unsigned int*>(y.data_ptr<float>()));
      check_launch("project_multi push");
    }
    return;
  }
  y = at::empty({B, N}, x.options());
  a = want_argmax ? at::empty({B, N}, int_opts) : at::empty({0}, int_opts);
  const int64_t grid = blocks_for(N, kThreads / kWarp);
  if (want_argmax)
    multi_pull_kernel<ptr_t, idx_t, true><<<grid, kThreads, 0, stream>>>(
        x.data_ptr<float>(), r, B, N, tcrow.data_ptr<ptr_t>(), trow.data_ptr<idx_t>(), tval.data_ptr<float>(),
        y.data_ptr<float>(), a.data_ptr<int32_t>());
  else
    multi_pull_kernel<ptr_t, idx_t, false><<<grid, kThreads, 0, stream>>>(
        x.data_ptr<float>(), r, B, N, tcrow.data_ptr<ptr_t>(), trow.data_ptr<idx_t>(), tval.data_ptr<float>(),
        y.data_ptr<float>(), nullptr);
  check_launch("project_multi pull");
}

std::tuple<at::Tensor, at::Tensor> project_multi_cuda(const at::Tensor& x_in, const at::Tensor& rel_in,
                                                      const at::Tensor& crow_in, const at::Tensor& col_in,
                                                      const at::Tensor& val_in, const at::Tensor& tcrow_in,
                                                      const at::Tensor& trow_in, const at::Tensor& tval_in,
                                                      int64_t num_entities, int64_t strategy, bool negated,
                                                      double neg_scale, bool want_argmax) {
  constexpr const char* op = "kgreason::project_multi";
  TORCH_CHECK(x_in.is_cuda() && x_in.scalar_type() == at::kFloat && x_in.dim() == 2, op,
              ": X must be a 2-D float32 CUDA tensor");
  const int64_t N = num_entities;
  TORCH_CHECK(N >= 1 && N <= INT32_MAX, op, ": num_entities must be in [1, 2^31), got ", N);
  TORCH_CHECK(x_in.size(1) == N, op, ": X must have N = ", N, " columns, got shape ", x_in.sizes());
  TORCH_CHECK(strategy >= 0 && strategy <= 2, op, ": strategy must be 0, 1 or 2, got ", strategy);
  TORCH_CHECK(neg_scale >= 0.0, op, ": neg_scale must be >= 0, got ", neg_scale);
  TORCH_CHECK((crow_in.scalar_type() == at::kInt || crow_in.scalar_type() == at::kLong) &&
                  tcrow_in.scalar_type() == crow_in.scalar_type(),
              op, ": crow and tcrow must share one dtype, int32 or int64");
  TORCH_CHECK((col_in.scalar_type() == at::kInt || col_in.scalar_type() == at::kLong) &&
                  trow_in.scalar_type() == col_in.scalar_type(),
              op, ": col and trow must share one dtype, int32 or int64");
  TORCH_CHECK(rel_in.dim() == 1 && rel_in.numel() == x_in.size(0) &&
                  (rel_in.scalar_type() == at::kInt || rel_in.scalar_type() == at::kLong),
              op, ": rel must be a (B,) int32/int64 tensor");
  TORCH_CHECK(crow_in.numel() >= 1 && (crow_in.numel() - 1) % N == 0 && tcrow_in.numel() == crow_in.numel(), op,
              ": crow and tcrow must have R*N+1 entries");
  for (const at::Tensor* t : {&rel_in, &crow_in, &col_in, &val_in, &tcrow_in, &trow_in, &tval_in})
    TORCH_CHECK(t->device() == x_in.device(), op, ": every tensor must be on X's device ", x_in.device(), ", got ",
                t->device());
  const c10::DeviceGuard guard(x_in.device());
  const int64_t R = (crow_in.numel() - 1) / N;
  const at::Tensor x = x_in.contiguous(), rel = rel_in.to(at::kLong).contiguous(), crow = crow_in.contiguous(),
                   col = col_in.contiguous(), val = val_in.contiguous(), tcrow = tcrow_in.contiguous(),
                   trow = trow_in.contiguous(), tval = tval_in.contiguous();
  const int64_t B = x.size(0);
  if (B == 0) {
    const auto int_opts = x.options().dtype(at::kInt);
    return {at::zeros({0, N}, x.options()), want_argmax ? at::empty({0, N}, int_opts) : at::empty({0}, int_opts)};
  }
  // An id out of range would read outside the stack: one device sync to rule it out.
  TORCH_CHECK(!((rel < 0) | (rel >= R)).any().item<bool>(), op, ": rel holds ids outside [0, ", R, ")");
  const float s = static_cast<float>(neg_scale);
  at::Tensor y, a;
  const bool p32 = crow.scalar_type() == at::kInt, i32 = col.scalar_type() == at::kInt;
  if (p32 && i32)
    run<int32_t, int32_t>(x, rel, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else if (p32)
    run<int32_t, int64_t>(x, rel, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else if (i32)
    run<int64_t, int32_t>(x, rel, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else
    run<int64_t, int64_t>(x, rel, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  return {y, a};
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) { m.impl("project_multi", &kgreason::cuda::project_multi_cuda); }
