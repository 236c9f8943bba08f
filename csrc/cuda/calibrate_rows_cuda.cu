// CUDA kernel of kgreason::calibrate_rows (QTO calibration of GEMM score rows; formula in
// csrc/calibrate_rows.cpp and csrc/cpu/calibrate_rows_cpu.cpp).
//
// Count, then write; one block per row in both passes:
//   1. stats:  the row's observed columns set bits in a (c, ceil(N/32)) bitmap (1/32 of the scores'
//              size; the scores are read only); block max; block sum of exp(s - max) (per-thread sums in
//              double, then a fixed-order tree: deterministic); scale = k / Z; the count of
//              {j : exp(s_j - max) * scale >= threshold or j observed} -> row_nnz.
//   2. host:   offsets = cumsum(row_nnz); one device sync for the total (the output size).
//   3. write:  the row in tiles of blockDim columns; each thread recomputes its p_j (the same device
//              function on the same inputs as in 1, so the same float and the same decision), and a
//              block-wide prefix of the keep flags (warp ballots) places the kept entries in column order.
// Recomputing exp in pass 3 is cheaper on a GPU than keeping a second (c, N) buffer of probabilities.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <utility>

#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / kWarp;

__device__ __forceinline__ bool observed(const uint32_t* bits, int64_t j) {
  return (bits[j >> 5] >> (j & 31)) & 1u;
}

__device__ __forceinline__ float prob(float s, float m, float scale) { return expf(s - m) * scale; }

// Block-wide max (kRowThreads threads); every thread gets the result (the sum: block_sum).
__device__ float block_max(float v, float* red) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  const int w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float r = red[0];
  for (int i = 1; i < kRowWarps; ++i) r = fmaxf(r, red[i]);
  return r;
}

template <typename idx_t>
__global__ void stats_kernel(const float* __restrict__ S, int64_t c, int64_t N, int64_t nw,
                             const int64_t* __restrict__ ptr, const idx_t* __restrict__ ocol,
                             uint32_t* __restrict__ bits, float thr, float* __restrict__ row_max,
                             float* __restrict__ row_scale, int64_t* __restrict__ row_nnz) {
  __shared__ float fred[kRowWarps];
  __shared__ double dred[kRowWarps];
  for (int64_t r = blockIdx.x; r < c; r += gridDim.x) {
    const float* s = S + r * N;
    uint32_t* b = bits + r * nw;
    const int64_t o0 = ptr[r], o1 = ptr[r + 1];
    for (int64_t o = o0 + threadIdx.x; o < o1; o += blockDim.x) {
      const int64_t j = static_cast<int64_t>(ocol[o]);
      atomicOr(b + (j >> 5), 1u << (j & 31));
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) m = fmaxf(m, s[j]);
    m = block_max(m, fred);
    double z = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) z += static_cast<double>(expf(s[j] - m));
    z = block_sum<double, kRowWarps>(z, dred);  // its __syncthreads also publish the bitmap's bits to the block
    const float k = static_cast<float>(o1 - o0 > 1 ? o1 - o0 : 1);
    const float scale = k / static_cast<float>(z);
    double cnt = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
      cnt += (observed(b, j) || prob(s[j], m, scale) >= thr) ? 1.0 : 0.0;
    cnt = block_sum<double, kRowWarps>(cnt, dred);
    if (threadIdx.x == 0) {
      row_max[r] = m;
      row_scale[r] = scale;
      row_nnz[r] = static_cast<int64_t>(cnt);
    }
    __syncthreads();
  }
}

// calibrate_row_stats: per row its max and sum of exp(s - max) (the first half of stats_kernel).
__global__ void row_stats_kernel(const float* __restrict__ S, int64_t c, int64_t N, float* __restrict__ row_max,
                                 double* __restrict__ row_sum) {
  __shared__ float fred[kRowWarps];
  __shared__ double dred[kRowWarps];
  for (int64_t r = blockIdx.x; r < c; r += gridDim.x) {
    const float* s = S + r * N;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) m = fmaxf(m, s[j]);
    m = block_max(m, fred);
    double z = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) z += static_cast<double>(expf(s[j] - m));
    z = block_sum<double, kRowWarps>(z, dred);
    if (threadIdx.x == 0) {
      row_max[r] = m;
      row_sum[r] = z;
    }
    __syncthreads();
  }
}

// calibrate_rows_normalised's count pass: stats_kernel with (max, scale) given per row.  A row whose scores exceed
// its given max sets *bad to the smallest such row (checked on the host after the pass).
template <typename idx_t>
__global__ void given_count_kernel(const float* __restrict__ S, int64_t c, int64_t N, int64_t nw,
                                   const int64_t* __restrict__ ptr, const idx_t* __restrict__ ocol,
                                   uint32_t* __restrict__ bits, float thr, const float* __restrict__ row_max,
                                   const float* __restrict__ row_scale, int64_t* __restrict__ row_nnz,
                                   unsigned long long* __restrict__ bad) {
  __shared__ float fred[kRowWarps];
  __shared__ double dred[kRowWarps];
  for (int64_t r = blockIdx.x; r < c; r += gridDim.x) {
    const float* s = S + r * N;
    uint32_t* b = bits + r * nw;
    for (int64_t o = ptr[r] + threadIdx.x; o < ptr[r + 1]; o += blockDim.x) {
      const int64_t j = static_cast<int64_t>(ocol[o]);
      atomicOr(b + (j >> 5), 1u << (j & 31));
    }
    const float m = row_max[r], scale = row_scale[r];
    float own = -INFINITY;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) own = fmaxf(own, s[j]);
    own = block_max(own, fred);  // its __syncthreads publish the bitmap's bits to the block
    double cnt = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
      cnt += (observed(b, j) || prob(s[j], m, scale) >= thr) ? 1.0 : 0.0;
    cnt = block_sum<double, kRowWarps>(cnt, dred);
    if (threadIdx.x == 0) {
      row_nnz[r] = static_cast<int64_t>(cnt);
      // as the CPU kernel's max_bound: float32 rounding of a recomputed block is accepted
      if (own > m + 1e-4f * fmaxf(1.f, fabsf(m))) atomicMin(bad, static_cast<unsigned long long>(r));
    }
    __syncthreads();
  }
}

__global__ void write_kernel(const float* __restrict__ S, int64_t c, int64_t N, int64_t nw,
                             const uint32_t* __restrict__ bits, float thr, float cap,
                             const float* __restrict__ row_max, const float* __restrict__ row_scale,
                             const int64_t* __restrict__ row_end, int32_t* __restrict__ cols,
                             float* __restrict__ vals) {
  __shared__ int warp_count[kRowWarps];
  const int w = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int64_t r = blockIdx.x; r < c; r += gridDim.x) {
    const float* s = S + r * N;
    const uint32_t* b = bits + r * nw;
    const float m = row_max[r], scale = row_scale[r];
    const int64_t end = row_end[r];
    int64_t base = r == 0 ? 0 : row_end[r - 1];
    for (int64_t j0 = 0; j0 < N; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x;
      bool keep = false;
      float v = 0.f;
      if (j < N) {
        const bool obs = observed(b, j);
        const float p = prob(s[j], m, scale);
        keep = obs || p >= thr;
        v = obs ? 1.f : fminf(p, cap);
      }
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, keep);
      if (lane == 0) warp_count[w] = __popc(ballot);
      __syncthreads();
      int before = 0, total = 0;
      for (int i = 0; i < kRowWarps; ++i) {
        before += i < w ? warp_count[i] : 0;
        total += warp_count[i];
      }
      const int64_t pos = base + before + __popc(ballot & ((1u << lane) - 1u));
      if (keep && pos < end) {  // pos < end always holds (same floats as the count); a guard all the same
        cols[pos] = static_cast<int32_t>(j);
        vals[pos] = v;
      }
      base += total;
      __syncthreads();
    }
  }
}

void check_scores(const char* op, const at::Tensor& scores) {
  TORCH_CHECK(scores.is_cuda() && scores.scalar_type() == at::kFloat && scores.dim() == 2, op,
              ": scores must be a 2-D float32 CUDA tensor");
  TORCH_CHECK(scores.size(1) <= INT32_MAX, op, ": N must fit int32 (the output columns are int32)");
}

// The observed-tails CSR, threshold and delta (an out-of-range pointer or column would write outside the bitmap:
// one sync to rule them out; c > 0, N > 0).  Returns (thr, cap) as the kernels test them.
std::pair<float, float> check_obs(const char* op, const at::Tensor& scores, const at::Tensor& ptr,
                                  const at::Tensor& ocol, double threshold, double delta) {
  const int64_t c = scores.size(0), N = scores.size(1);
  TORCH_CHECK(ptr.device() == scores.device() && ptr.scalar_type() == at::kLong && ptr.dim() == 1 &&
                  ptr.numel() == c + 1,
              op, ": obs_ptr must be a (c+1,) int64 tensor on scores' device");
  TORCH_CHECK(ocol.device() == scores.device() && ocol.dim() == 1 &&
                  (ocol.scalar_type() == at::kInt || ocol.scalar_type() == at::kLong),
              op, ": obs_cols must be a 1-D int32/int64 tensor on scores' device");
  TORCH_CHECK(std::isfinite(threshold) && threshold > 0.0, op, ": threshold must be finite and > 0, got ",
              threshold);
  TORCH_CHECK(delta >= 0.0 && delta < 1.0, op, ": delta must be in [0, 1), got ", delta);
  if (c > 0 && N > 0) {
    const int64_t E = ocol.numel();
    TORCH_CHECK(ptr[0].item<int64_t>() == 0 && ptr[c].item<int64_t>() == E, op,
                ": obs_ptr must start at 0 and end at len(obs_cols) = ", E);
    TORCH_CHECK(!(ptr.slice(0, 1) < ptr.slice(0, 0, c)).any().item<bool>(), op, ": obs_ptr must be non-decreasing");
    if (E) TORCH_CHECK(!((ocol < 0) | (ocol >= N)).any().item<bool>(), op, ": obs_cols must lie in [0, ", N, ")");
  }
  float thr = static_cast<float>(threshold);
  if (static_cast<double>(thr) < threshold) thr = std::nextafter(thr, std::numeric_limits<float>::infinity());
  return {thr, static_cast<float>(1.0 - delta)};
}

// The write pass (offsets from the counts: one device sync for the output size), shared by both calibrations.
std::tuple<at::Tensor, at::Tensor, at::Tensor> write_rows(const at::Tensor& scores, const at::Tensor& bits,
                                                          float thr, float cap, const at::Tensor& row_max,
                                                          const at::Tensor& row_scale, const at::Tensor& row_nnz,
                                                          int grid, cudaStream_t stream) {
  const int64_t c = scores.size(0), N = scores.size(1), nw = bits.size(1);
  const at::Tensor row_end = at::cumsum(row_nnz, 0);
  const int64_t nnz = row_end[c - 1].item<int64_t>();  // the output size: one device sync
  at::Tensor cols = at::empty({nnz}, scores.options().dtype(at::kInt));
  at::Tensor vals = at::empty({nnz}, scores.options());
  if (nnz > 0) {
    write_kernel<<<grid, kRowThreads, 0, stream>>>(scores.data_ptr<float>(), c, N, nw,
                                                   reinterpret_cast<const uint32_t*>(bits.data_ptr<int32_t>()), thr,
                                                   cap, row_max.data_ptr<float>(), row_scale.data_ptr<float>(),
                                                   row_end.data_ptr<int64_t>(), cols.data_ptr<int32_t>(),
                                                   vals.data_ptr<float>());
    check_launch("calibrate_rows write");
  }
  return {row_nnz, cols, vals};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_cuda(const at::Tensor& scores_in,
                                                                   const at::Tensor& ptr_in,
                                                                   const at::Tensor& cols_in, double threshold,
                                                                   double delta) {
  constexpr const char* op = "kgreason::calibrate_rows";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  const c10::DeviceGuard guard(scores_in.device());
  const at::Tensor scores = scores_in.contiguous(), ptr = ptr_in.contiguous(), ocol = cols_in.contiguous();
  const auto [thr, cap] = check_obs(op, scores, ptr, ocol, threshold, delta);
  const auto long_opts = scores.options().dtype(at::kLong);
  if (c == 0 || N == 0)
    return {at::zeros({c}, long_opts), at::empty({0}, scores.options().dtype(at::kInt)),
            at::empty({0}, scores.options())};
  const int64_t nw = (N + 31) / 32;
  at::Tensor bits = at::zeros({c, nw}, scores.options().dtype(at::kInt));
  at::Tensor row_max = at::empty({c}, scores.options()), row_scale = at::empty({c}, scores.options());
  at::Tensor row_nnz = at::empty({c}, long_opts);
  const cudaStream_t stream = current_stream(scores.device());
  const int grid = static_cast<int>(c < 65535 * 4 ? c : 65535 * 4);
  uint32_t* bp = reinterpret_cast<uint32_t*>(bits.data_ptr<int32_t>());
  if (ocol.scalar_type() == at::kInt)
    stats_kernel<int32_t><<<grid, kRowThreads, 0, stream>>>(
        scores.data_ptr<float>(), c, N, nw, ptr.data_ptr<int64_t>(), ocol.data_ptr<int32_t>(), bp, thr,
        row_max.data_ptr<float>(), row_scale.data_ptr<float>(), row_nnz.data_ptr<int64_t>());
  else
    stats_kernel<int64_t><<<grid, kRowThreads, 0, stream>>>(
        scores.data_ptr<float>(), c, N, nw, ptr.data_ptr<int64_t>(), ocol.data_ptr<int64_t>(), bp, thr,
        row_max.data_ptr<float>(), row_scale.data_ptr<float>(), row_nnz.data_ptr<int64_t>());
  check_launch("calibrate_rows stats");
  return write_rows(scores, bits, thr, cap, row_max, row_scale, row_nnz, grid, stream);
}

std::tuple<at::Tensor, at::Tensor> calibrate_row_stats_cuda(const at::Tensor& scores_in) {
  constexpr const char* op = "kgreason::calibrate_row_stats";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  const c10::DeviceGuard guard(scores_in.device());
  const at::Tensor scores = scores_in.contiguous();
  at::Tensor row_max = at::full({c}, -std::numeric_limits<float>::infinity(), scores.options());
  at::Tensor row_sum = at::zeros({c}, scores.options().dtype(at::kDouble));
  if (c == 0 || N == 0) return {row_max, row_sum};
  const int grid = static_cast<int>(c < 65535 * 4 ? c : 65535 * 4);
  row_stats_kernel<<<grid, kRowThreads, 0, current_stream(scores.device())>>>(
      scores.data_ptr<float>(), c, N, row_max.data_ptr<float>(), row_sum.data_ptr<double>());
  check_launch("calibrate_row_stats");
  return {row_max, row_sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_normalised_cuda(
    const at::Tensor& scores_in, const at::Tensor& max_in, const at::Tensor& scale_in, const at::Tensor& ptr_in,
    const at::Tensor& cols_in, double threshold, double delta) {
  constexpr const char* op = "kgreason::calibrate_rows_normalised";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  for (const at::Tensor* t : {&max_in, &scale_in})
    TORCH_CHECK(t->device() == scores_in.device() && t->scalar_type() == at::kFloat && t->dim() == 1 &&
                    t->size(0) == c,
                op, ": row_max and row_scale must be (c,) float32 tensors on scores' device");
  const c10::DeviceGuard guard(scores_in.device());
  const at::Tensor scores = scores_in.contiguous(), ptr = ptr_in.contiguous(), ocol = cols_in.contiguous();
  const at::Tensor row_max = max_in.contiguous(), row_scale = scale_in.contiguous();
  const auto [thr, cap] = check_obs(op, scores, ptr, ocol, threshold, delta);
  const auto long_opts = scores.options().dtype(at::kLong);
  if (c == 0 || N == 0)
    return {at::zeros({c}, long_opts), at::empty({0}, scores.options().dtype(at::kInt)),
            at::empty({0}, scores.options())};
  TORCH_CHECK(at::isfinite(row_max).all().item<bool>() &&
                  (at::isfinite(row_scale) & (row_scale > 0)).all().item<bool>(),
              op, ": row_max must be finite and row_scale finite and > 0");
  const int64_t nw = (N + 31) / 32;
  at::Tensor bits = at::zeros({c, nw}, scores.options().dtype(at::kInt));
  at::Tensor row_nnz = at::empty({c}, long_opts);
  at::Tensor bad = at::full({1}, c, long_opts);
  const cudaStream_t stream = current_stream(scores.device());
  const int grid = static_cast<int>(c < 65535 * 4 ? c : 65535 * 4);
  uint32_t* bp = reinterpret_cast<uint32_t*>(bits.data_ptr<int32_t>());
  auto* badp = reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>());
  if (ocol.scalar_type() == at::kInt)
    given_count_kernel<int32_t><<<grid, kRowThreads, 0, stream>>>(
        scores.data_ptr<float>(), c, N, nw, ptr.data_ptr<int64_t>(), ocol.data_ptr<int32_t>(), bp, thr,
        row_max.data_ptr<float>(), row_scale.data_ptr<float>(), row_nnz.data_ptr<int64_t>(), badp);
  else
    given_count_kernel<int64_t><<<grid, kRowThreads, 0, stream>>>(
        scores.data_ptr<float>(), c, N, nw, ptr.data_ptr<int64_t>(), ocol.data_ptr<int64_t>(), bp, thr,
        row_max.data_ptr<float>(), row_scale.data_ptr<float>(), row_nnz.data_ptr<int64_t>(), badp);
  check_launch("calibrate_rows_normalised count");
  const int64_t b = bad.item<int64_t>();
  TORCH_CHECK(b == c, op, ": row ", b, ": row_max is below the row's largest score; it must be the maximum over "
              "every block of the row (1e-4 relative slack)");
  return write_rows(scores, bits, thr, cap, row_max, row_scale, row_nnz, grid, stream);
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) {
  m.impl("calibrate_rows", &kgreason::cuda::calibrate_rows_cuda);
  m.impl("calibrate_row_stats", &kgreason::cuda::calibrate_row_stats_cuda);
  m.impl("calibrate_rows_normalised", &kgreason::cuda::calibrate_rows_normalised_cuda);
}
