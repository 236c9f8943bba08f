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
// Plan (strategy auto), per row and on the device, so that no host sync decides anything:
// plan_kernel sums over the row's active entities i (X[b,i] > 0) the push work 1 + |row i of M_r|
// (one thread step per active entity plus one atomic per entry) and compares it with the pull work
// of that row, N + nnz(M_r) column and support steps, of which kPushStepsPerPull cost one push step
// (a pulled step is a coalesced, atomic-free load shared by a warp):
//     push  iff  kPushStepsPerPull * (active + entries) < N + nnz(M_r).
// For a matrix of uniform row length this is "push when under 1/kPushStepsPerPull = 5% of the row
// is active"; per row, a mixed batch (one-hot anchors and dense sets, hub entities and leaves) costs
// what each row costs.
// NOT MEASURED ON A GPU.  20 is the former CUDA kernels' "push under 5% active" rule (a global count;
// written with the first kernels, never timed on a GPU) restated per row.  The two GPU runs so far
// (stop 26, H100) checked results only, and the folded kernel has not run on a GPU at all.  To
// calibrate it, a GPU session runs (after `python -m pytest -q tests/test_ops_*.py -k cuda`):
//     python benchmarks/ops_cuda_bench.py --device cuda --out ops_cuda.md
//         push, pull and auto at the two ends (one-hot anchors, dense rows): auto must match the
//         faster of push and pull on each row of the table;
//     KGREASON_BENCH_DEVICE=cuda python -m pytest benchmarks/test_ops_bench.py -q -k push_pull_crossover
//         push and pull forced on rows of 0.01% to 50% active entities; it writes
//         benchmarks/results/ops_push_pull_crossover_cuda.md with the active share where pull starts
//         to win and the kPushStepsPerPull that crossover implies, (N + nnz) / (active + entries) there.
// Set the constant to that value (or keep 20 if it is within ~2x: a row near the crossover costs
// about the same either way) and record the table.
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

// A row's plan is kPush or kPull (the strategy codes; sweep is never chosen here).
constexpr int64_t kAuto = kStrategyAuto;
constexpr int32_t kPush = kStrategyPush, kPull = kStrategyPull;
constexpr int64_t kPushStepsPerPull = 20;
constexpr int64_t kPlanChunk = 8 * kThreads;  // entities of X[b,:] one plan block scans
constexpr int kTopK = kWarp;                  // one list entry per lane

// The plan of each row: code[b] when the chooser ran, else one forced plan for every row.
struct Plan {
  const int32_t* code;
  int32_t forced;
  __device__ __forceinline__ int32_t of(int64_t b) const { return code != nullptr ? code[b] : forced; }
};

// Top lists of the negated form: X[b,:]'s count[b] <= K largest positive entries (value desc, index
// asc) at v/i[b*K ..]; complete[b] = 0 when more positive entries exist beyond them.
struct TopLists {
  float* v;
  int32_t* i;
  int32_t* count;
  uint8_t* complete;
};

// grid (B, chunks): block (b, c) adds the push work of its chunks of X[b,:] to work[b]; the last block
// of row b to finish decides code[b] and, for a pushed row, zeroes that row of the push target (Y's
// value bits, or the packed keys with argmax; none for project_strategy).
template <typename ptr_t>
__global__ void plan_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t N,
                            const ptr_t* __restrict__ crow, unsigned long long* __restrict__ work,
                            unsigned long long* __restrict__ done, int32_t* __restrict__ code,
                            float* __restrict__ yzero, unsigned long long* __restrict__ kzero) {
  __shared__ unsigned long long red[kThreads / kWarp];
  __shared__ bool last;
  __shared__ int32_t decided;
  const int64_t b = blockIdx.x;
  const ptr_t* cr = crow + rel[b] * N;
  const float* x = X + b * N;
  unsigned long long mine = 0;
  for (int64_t lo = static_cast<int64_t>(blockIdx.y) * kPlanChunk; lo < N; lo += gridDim.y * kPlanChunk) {
    const int64_t hi = lo + kPlanChunk < N ? lo + kPlanChunk : N;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      if (x[i] > 0.f) mine += 1ull + static_cast<unsigned long long>(cr[i + 1] - cr[i]);
  }
  mine = block_sum<unsigned long long, kThreads / kWarp>(mine, red);
  if (threadIdx.x == 0) {
    atomicAdd(work + b, mine);
    __threadfence();  // this block's work is visible before its ticket
    last = atomicAdd(done + b, 1ull) == gridDim.y - 1;
    if (last) {
      const unsigned long long total = atomicAdd(work + b, 0ull);  // every block's share
      const int64_t nnz = Stack<ptr_t, int32_t>{N, crow}.nnz_of(rel[b]);  // only the pointers are read
      decided = static_cast<double>(kPushStepsPerPull) * static_cast<double>(total) < static_cast<double>(N + nnz)
                    ? kPush
                    : kPull;
      code[b] = decided;
    }
  }
  __syncthreads();
  if (!last || decided != kPush) return;
  if (yzero != nullptr)
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) yzero[b * N + j] = 0.f;
  if (kzero != nullptr)
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) kzero[b * N + j] = 0ull;
}

// Pushed rows only; their targets were zeroed (plan_kernel or the caller).
template <typename ptr_t, typename idx_t, bool ARG>
__global__ void push_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                            Stack<ptr_t, idx_t> m, Plan plan, unsigned int* __restrict__ ybits,
                            unsigned long long* __restrict__ keys) {
  const int64_t N = m.N, total = B * N;
  for (int64_t e = grid_first(); e < total; e += grid_step()) {
    const int64_t b = e / N;
    if (plan.of(b) != kPush) continue;
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
__global__ void unpack_kernel(const unsigned long long* __restrict__ keys, int64_t B, int64_t N, Plan plan,
                              float* __restrict__ Y, int32_t* __restrict__ A) {
  for (int64_t e = grid_first(); e < B * N; e += grid_step())
    if (plan.of(e / N) == kPush) unpack_value_index(keys[e], Y[e], A[e]);
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

// Pulled rows only; writes every (b, j) of them.  NEG: the negated factor and the out-of-support merge.
template <typename ptr_t, typename idx_t, bool ARG, bool NEG>
__global__ void pull_kernel(const float* __restrict__ X, const int64_t* __restrict__ rel, int64_t B,
                            Stack<ptr_t, idx_t> m, Plan plan, float s, TopLists top, float* __restrict__ Y,
                            int32_t* __restrict__ A) {
  const int lane = threadIdx.x % kWarp;
  const int64_t N = m.N;
  for (int64_t j = warp_first(); j < N; j += warp_step()) {
    for (int64_t b = 0; b < B; ++b) {
      if (plan.of(b) != kPull) continue;
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

// code (B,) int32 on X's device, filled by plan_kernel, which also zeroes the pushed rows of yzero or kzero.
template <typename ptr_t>
void launch_plan(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, int64_t N, at::Tensor& code,
                 float* yzero, unsigned long long* kzero) {
  const int64_t B = x.size(0);
  const at::Tensor counters = at::zeros({2, B}, x.options().dtype(at::kLong));  // work, done
  auto* c = reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>());
  const int64_t chunks = (N + kPlanChunk - 1) / kPlanChunk;
  const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
  plan_kernel<ptr_t><<<grid, kThreads, 0, current_stream(x.device())>>>(
      x.data_ptr<float>(), rel.data_ptr<int64_t>(), N, crow.data_ptr<ptr_t>(), c, c + B, code.data_ptr<int32_t>(),
      yzero, kzero);
  check_launch("project plan");
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
  auto pull = [&](Plan plan, TopLists top) {
    if (negated && arg)
      pull_kernel<ptr_t, idx_t, true, true><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, plan, s, top, Y, A);
    else if (negated)
      pull_kernel<ptr_t, idx_t, false, true><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, plan, s, top, Y, A);
    else if (arg)
      pull_kernel<ptr_t, idx_t, true, false><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, plan, s, top, Y, A);
    else
      pull_kernel<ptr_t, idx_t, false, false><<<pull_grid, kThreads, 0, stream>>>(X, rel, B, m, plan, s, top, Y, A);
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
    pull(Plan{nullptr, kPull}, top);
    return;
  }

  Plan plan{nullptr, strategy == kPush ? kPush : kPull};
  at::Tensor code, keys;
  if (arg && strategy != kPull) keys = at::empty({B, N}, x.options().dtype(at::kLong));
  auto* K = keys.defined() ? reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>()) : nullptr;
  if (strategy == kAuto) {
    code = at::empty({B}, x.options().dtype(at::kInt));
    launch_plan<ptr_t>(x, in.rel, in.crow, N, code, arg ? nullptr : Y, K);
    plan.code = code.data_ptr<int32_t>();
  } else if (strategy == kPush) {
    if (arg)
      keys.zero_();
    else
      y.zero_();
  }
  if (strategy != kPull) {
    const int64_t grid = blocks_for(B * N, kThreads);
    auto* ybits = reinterpret_cast<unsigned int*>(Y);
    if (arg)
      push_kernel<ptr_t, idx_t, true><<<grid, kThreads, 0, stream>>>(X, rel, B, m, plan, ybits, K);
    else
      push_kernel<ptr_t, idx_t, false><<<grid, kThreads, 0, stream>>>(X, rel, B, m, plan, ybits, K);
    check_launch("project push");
    if (arg) {
      unpack_kernel<<<grid, kThreads, 0, stream>>>(K, B, N, plan, Y, A);
      check_launch("project unpack");
    }
  }
  if (strategy != kPush) pull(plan, TopLists{});
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
  at::Tensor code = at::empty({x.size(0)}, x.options().dtype(at::kInt));
  if (x.size(0) == 0) return code;
  project_checks::ranges(op, rel, R, crow, nullptr, -1);
  if (crow.scalar_type() == at::kInt)
    launch_plan<int32_t>(x, rel, crow, num_entities, code, nullptr, nullptr);
  else
    launch_plan<int64_t>(x, rel, crow, num_entities, code, nullptr, nullptr);
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
