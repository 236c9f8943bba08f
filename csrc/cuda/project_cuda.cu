// CUDA kernels of kgreason::project, project_out and project_strategy (schemas: csrc/project.cpp):
// row b of the batch projected through relation rel[b] of the stacked (R*N, N) CSR (row r*N + i is
// M_r[i,:]) or, for pull, its stacked transpose (row r*N + j is M_r[:,j], rows ascending):
//   Y[b,j] = max_i X[b,i] * M_{rel[b]}[i,j]                       (plain)
//   Y[b,j] = max_i X[b,i] * (1 - min(1, s * M_{rel[b]}[i,j]))     (negated; factor 1 where M has no entry)
// A single relation is the degenerate stack (R = 1, rel all 0).
//
// push: one thread per (query b, entity i) with X[b,i] > 0 walks row rel[b]*N + i and atomically
//       maxes products into Y[b,:].  Products are in [0, 1] and non-negative floats order like their
//       bits, so the max is an integer atomicMax on the float bits; with argmax a 64-bit atomicMax on
//       (value bits << 32 | ~i) keeps the smallest i among equal values.
// pull: one warp per column j; for each query b the lanes stride over column j of M_{rel[b]}, then a
//       shuffle reduction by (value desc, index asc).  Rows of different relations need no grouping:
//       each (j, b) reads its own support, and the warp's loads of one support are coalesced.
// negated: always the pull form (Y is dense whatever X is).  Per query, top_kernel first lists the
//       K = 32 largest entries of X[b,:]; the warp of column j then merges the in-support products
//       with the best entry outside the support: the first listed entity that is not in it (a ballot
//       over one binary search per lane), or, when all 32 are in it and X[b,:] has more positive
//       entries, a scan of the row.
//
// Strategy auto is push for the plain projection, on every row, with no plan pass.  Measured on an
// H200 (2026-11-28, benchmarks/results/ops_cuda_h200.md and ops_push_pull_crossover_cuda.md): push
// beat pull at every active share from 0.01% to 50% of a 1.4M-entry FB15k-237-sized matrix (pull /
// push 2.2-21x at B = 64) and on dense batches of 1,024 rows (0.37 vs 6.96 ms), while the former
// per-row plan (push iff 20 * (active + entries) < N + nnz) sent those dense rows to pull (22x slower)
// and its extra pass over X cost 0.27 ms at B = 1,024 even where it chose push.  Why push wins here
// although a pulled step is a coalesced, atomic-free load: a push step is one thread's atomicMax on a
// (b, j) it rarely contends for, and push only touches active rows; pull gives each column j a warp
// that walks that column's support once per query b, and most supports hold far fewer than 32
// entries, so most lanes idle and every row costs N + nnz steps whatever X is.  The per-step costs
// came out about equal at 50% active (1.31 ms for 0.71M steps vs 2.84 ms for 1.41M), so pull could
// only win with every entity active, where push steps equal pull's.  Pull stays a forced strategy.
// The codes are ops.STRATEGIES' (1 push, 2 pull), the ones project_strategy returns; the CPU
// kernel's third plan (sweep, 3) is a CPU cache trick and is never chosen here.
//
// Ties: push keeps the smallest i through the packed key; pull and the out-of-support merge use
// better() (value desc, index asc).  So argmax is the smallest maximising i, -1 where Y is 0, as in
// the pure-torch reference and the CPU kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../project_common.h"
#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

// The strategy codes (sweep is never chosen here).
constexpr int32_t kPush = kStrategyPush, kPull = kStrategyPull;
constexpr int kTopK = kWarp;                  // one list entry per lane

// Top lists of the negated form: X[b,:]'s count[b] <= K largest positive entries (value desc, index
// asc) at v/i[b*K ..]; complete[b] = 0 when more positive entries exist beyond them.
struct TopLists {
  float* v;
  int32_t* i;
  int32_t* count;
  uint8_t* complete;
};

// Every row pushed; the targets (Y's value bits, or the packed keys with argmax) were zeroed by the caller.
template <typename ptr_t, typename idx_t, bool ARG>
__global__ void push_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                            Stack<ptr_t, idx_t> m, unsigned int* __restrict__ ybits,
                            unsigned long long* __restrict__ keys) {
  const int64_t N = m.N, total = B * N;
  for (int64_t e = grid_first(); e < total; e += grid_step()) {
    const int64_t b = e / N;
    const float x = X[e];
    if (!(x > 0.f)) continue;
    const int64_t i = e - b * N, row = rel[b] * N + i;
    for (int64_t k = m.crow[row], end = m.crow[row + 1]; k < end; ++k) {
      const float p = x * m.val[k];
      if (!(p > 0.f)) continue;
      const int64_t out = b * N + static_cast<int64_t>(m.col[k]);
      if (ARG)
        atomicMax(keys + out, pack_value_index(p, i));
      else
        atomicMax(ybits + out, __float_as_uint(p));
    }
  }
}

// Y and argmax of the pushed rows from their packed keys.
__global__ void unpack_kernel(const unsigned long long* __restrict__ keys, int64_t B, int64_t N,
                              float* __restrict__ Y, int32_t* __restrict__ A) {
  for (int64_t e = grid_first(); e < B * N; e += grid_step()) unpack_value_index(keys[e], Y[e], A[e]);
}

// (v, i) ranks strictly after (pv, pi) in (value desc, index asc) order.
__device__ __forceinline__ bool after(float v, int32_t i, float pv, int32_t pi) {
  return v < pv || (v == pv && i > pi);
}

// One block per query: X[b,:]'s K largest positive entries by (value desc, index asc), by K + 1
// rounds of a block-wide arg-max over the entries ranked after the previous pick (the extra round
// only tells whether positive entries remain beyond the list).
__global__ void top_kernel(const float* __restrict__ X, int64_t N, TopLists top) {
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
      if (threadIdx.x == 0) top.complete[b] = 0;
      break;
    }
    if (threadIdx.x == 0) {
      top.v[b * kTopK + round] = best;
      top.i[b * kTopK + round] = arg;
    }
    pv = best;
    pi = arg;
    ++cnt;
  }
  if (threadIdx.x == 0) top.count[b] = cnt;
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

// Merge into (best, arg) the largest X[b,i] with i outside the support trow[start..end) (factor 1
// there).  Warp-collective: every lane calls it with the same b and support.
template <typename idx_t>
__device__ __forceinline__ void merge_outside(const float* __restrict__ x, int64_t N, int64_t b, const TopLists& top,
                                              const idx_t* __restrict__ trow, int64_t start, int64_t end, int lane,
                                              float& best, int32_t& arg) {
  const int cnt = top.count[b];
  const bool outside = lane < cnt && !in_support(trow, start, end, top.i[b * kTopK + lane]);
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, outside);
  if (ballot != 0u) {
    const int first = __ffs(ballot) - 1;
    const float ov = top.v[b * kTopK + first];
    const int32_t oi = top.i[b * kTopK + first];
    if (better(ov, oi, best, arg)) {
      best = ov;
      arg = oi;
    }
  } else if (!top.complete[b]) {
    for (int64_t i = lane; i < N; i += kWarp) {
      const float v = x[i];
      if (better(v, static_cast<int32_t>(i), best, arg) && !in_support(trow, start, end, i)) {
        best = v;
        arg = static_cast<int32_t>(i);
      }
    }
  }
}

// Every row pulled; writes every (b, j).  NEG: the negated factor and the out-of-support merge.
template <typename ptr_t, typename idx_t, bool ARG, bool NEG>
__global__ void pull_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                            Stack<ptr_t, idx_t> m, float s, TopLists top, float* __restrict__ Y,
                            int32_t* __restrict__ A) {
  const int lane = threadIdx.x % kWarp;
  const int64_t N = m.N;
  for (int64_t j = warp_first(); j < N; j += warp_step()) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t c = rel[b] * N + j;
      const int64_t start = m.tcrow[c], end = m.tcrow[c + 1];
      const float* x = X + b * N;
      float best = 0.f;
      int32_t arg = -1;
      for (int64_t k = start + lane; k < end; k += kWarp) {
        const int32_t i = static_cast<int32_t>(m.trow[k]);
        const float v = m.tval[k];
        const float p = x[i] * (NEG ? 1.f - fminf(1.f, s * v) : v);
        if (better(p, i, best, arg)) {
          best = p;
          arg = i;
        }
      }
      if (NEG) merge_outside(x, N, b, top, m.trow, start, end, lane, best, arg);
      warp_best(best, arg);
      if (lane == 0) {
        Y[b * N + j] = best;
        if (ARG) A[b * N + j] = best > 0.f ? arg : -1;
      }
    }
  }
}

// The checked, contiguous inputs of one call.
struct Inputs {
  at::Tensor x, rel, crow, col, val, tcrow, trow, tval;
};

template <typename ptr_t, typename idx_t>
void run(const Inputs& in, int64_t N, int64_t strategy, bool negated, float s, at::Tensor& y, at::Tensor& a) {
  const at::Tensor& x = in.x;
  const int64_t B = x.size(0);
  const bool arg = a.numel() > 0;
  const cudaStream_t stream = current_stream(x.device());
  const Stack<ptr_t, idx_t> m{N,
                              in.crow.data_ptr<ptr_t>(),
                              in.col.data_ptr<idx_t>(),
                              in.val.data_ptr<float>(),
                              in.tcrow.data_ptr<ptr_t>(),
                              in.trow.data_ptr<idx_t>(),
                              in.tval.data_ptr<float>()};
  const float* X = x.data_ptr<float>();
  const int64_t* rel = in.rel.data_ptr<int64_t>();
  float* Y = y.data_ptr<float>();
  int32_t* A = arg ? a.data_ptr<int32_t>() : nullptr;
  const int64_t pull_grid = blocks_for(N, kThreads / kWarp);
  auto pull = [&](TopLists top) {
    if (negated && arg)
      pull_kernel<ptr_t, idx_t, true, true><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, s, top, Y, A);
    else if (negated)
      pull_kernel<ptr_t, idx_t, false, true><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, s, top, Y, A);
    else if (arg)
      pull_kernel<ptr_t, idx_t, true, false><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, s, top, Y, A);
    else
      pull_kernel<ptr_t, idx_t, false, false><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, s, top, Y, A);
    check_launch("project pull");
  };

  if (negated) {
    const auto int_opts = x.options().dtype(at::kInt);
    at::Tensor topv = at::zeros({B, kTopK}, x.options()), topi = at::full({B, kTopK}, -1, int_opts),
               count = at::zeros({B}, int_opts), complete = at::ones({B}, x.options().dtype(at::kByte));
    const TopLists top{topv.data_ptr<float>(), topi.data_ptr<int32_t>(), count.data_ptr<int32_t>(),
                       complete.data_ptr<uint8_t>()};
    top_kernel<<<B, kThreads, 0, stream>>>(X, N, top);
    check_launch("project top lists");
    pull(top);
    return;
  }

  if (strategy == kPull) {
    pull(TopLists{});
    return;
  }
  // push, also for auto (the top of this file says why)
  const int64_t grid = blocks_for(B * N, kThreads);
  if (arg) {
    at::Tensor keys = at::zeros({B, N}, x.options().dtype(at::kLong));
    auto* K = reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>());
    push_kernel<ptr_t, idx_t, true><<<grid, kThreads, 0, stream>>>(X, rel, B, m, nullptr, K);
    check_launch("project push");
    unpack_kernel<<<grid, kThreads, 0, stream>>>(K, B, N, Y, A);
    check_launch("project unpack");
  } else {
    y.zero_();
    push_kernel<ptr_t, idx_t, false><<<grid, kThreads, 0, stream>>>(X, rel, B, m, reinterpret_cast<unsigned int*>(Y),
                                                                     nullptr);
    check_launch("project push");
  }
}

// The checked, contiguous inputs of one call (project_common.h's checks; one device sync).
Inputs check_inputs(const char* op, const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow,
                    const at::Tensor& col, const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow,
                    const at::Tensor& tval, int64_t N, int64_t strategy, double neg_scale) {
  const int64_t R = project_checks::rows(op, x, rel, crow, N, c10::DeviceType::CUDA);
  const int64_t nnz = project_checks::matrix(op, x, crow, col, val, tcrow, trow, tval, strategy, neg_scale);
  Inputs in{x.contiguous(),     rel.to(at::kLong).contiguous(), crow.contiguous(), col.contiguous(),
            val.contiguous(),   tcrow.contiguous(),             trow.contiguous(), tval.contiguous()};
  if (x.size(0) > 0) project_checks::ranges(op, in.rel, R, in.crow, &in.tcrow, nnz);
  return in;
}

// Calls f(ptr_t{}, idx_t{}) with the index types of (crow, col).
template <typename F>
void dispatch_index(const at::Tensor& crow, const at::Tensor& col, F f) {
  const bool p32 = crow.scalar_type() == at::kInt, i32 = col.scalar_type() == at::kInt;
  if (p32 && i32)
    f(int32_t{}, int32_t{});
  else if (p32)
    f(int32_t{}, int64_t{});
  else if (i32)
    f(int64_t{}, int32_t{});
  else
    f(int64_t{}, int64_t{});
}

void project_into(const char* op, const at::Tensor& x_in, const at::Tensor& rel, const at::Tensor& crow,
                  const at::Tensor& col, const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow,
                  const at::Tensor& tval, int64_t N, int64_t strategy, bool negated, double neg_scale, at::Tensor& y,
                  at::Tensor& a) {
  const c10::DeviceGuard guard(x_in.device());
  const Inputs in = check_inputs(op, x_in, rel, crow, col, val, tcrow, trow, tval, N, strategy, neg_scale);
  if (in.x.size(0) == 0) return;
  dispatch_index(in.crow, in.col, [&](auto ptr_tag, auto idx_tag) {
    run<decltype(ptr_tag), decltype(idx_tag)>(in, N, strategy, negated, static_cast<float>(neg_scale), y, a);
  });
}

std::tuple<at::Tensor, at::Tensor> project_cuda(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow,
                                                const at::Tensor& col, const at::Tensor& val,
                                                const at::Tensor& tcrow, const at::Tensor& trow,
                                                const at::Tensor& tval, int64_t num_entities, int64_t strategy,
                                                bool negated, double neg_scale, bool want_argmax) {
  constexpr const char* op = "kgreason::project";
  project_checks::rows(op, x, rel, crow, num_entities, c10::DeviceType::CUDA);  // shapes before allocating
  const int64_t B = x.size(0), N = num_entities;
  const auto int_opts = x.options().dtype(at::kInt);
  at::Tensor y = at::empty({B, N}, x.options());
  at::Tensor a = want_argmax ? at::empty({B, N}, int_opts) : at::empty({0}, int_opts);
  project_into(op, x, rel, crow, col, val, tcrow, trow, tval, N, strategy, negated, neg_scale, y, a);
  return {y, a};
}

void project_out_cuda(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, const at::Tensor& col,
                      const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow,
                      const at::Tensor& tval, int64_t num_entities, int64_t strategy, bool negated,
                      double neg_scale, at::Tensor& y, at::Tensor& argmax) {
  constexpr const char* op = "kgreason::project_out";
  project_checks::rows(op, x, rel, crow, num_entities, c10::DeviceType::CUDA);
  project_checks::out(op, x, y, argmax);
  project_into(op, x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale, y, argmax);
}

at::Tensor project_strategy_cuda(const at::Tensor& x_in, const at::Tensor& rel_in, const at::Tensor& crow_in,
                                 int64_t num_entities) {
  constexpr const char* op = "kgreason::project_strategy";
  const int64_t R = project_checks::rows(op, x_in, rel_in, crow_in, num_entities, c10::DeviceType::CUDA);
  const c10::DeviceGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), rel = rel_in.to(at::kLong).contiguous(), crow = crow_in.contiguous();
  // auto's plan on a GPU: push for every row (see the top of this file)
  at::Tensor code = at::full({x.size(0)}, kPush, x.options().dtype(at::kInt));
  if (x.size(0) > 0) project_checks::ranges(op, rel, R, crow, nullptr, -1);
  return code;
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) {
  m.impl("project", &kgreason::cuda::project_cuda);
  m.impl("project_out", &kgreason::cuda::project_out_cuda);
  m.impl("project_strategy", &kgreason::cuda::project_strategy_cuda);
}
