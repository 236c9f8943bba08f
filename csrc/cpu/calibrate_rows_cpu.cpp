// QTO calibration of GEMM score rows on the CPU, fused: one pass over the scores per row.
//
// For each row of scores s (c, N), with k = max(1, #observed tails of the row):
//   m = max_j s_j;  e_j = exp(s_j - m);  Z = sum_j e_j;  scale = k / Z;  p_j = e_j * scale
//   keep p_j >= threshold;  p_j = min(p_j, 1 - delta);  p_j = 1 (kept) at the observed columns.
//
// The torch formulation (ops/calibrate_rows_reference.py, the code RowCalibrator ran before) makes
// eight passes over the (c, N) buffer -- amax, sub_, exp_, sum, an indexed write, a >= compare into a
// bool matrix, nonzero, an indexed gather -- each reading the whole chunk from DRAM (c x N floats =
// 64 MB for c = 1,156, N = 14,505) and each a fork/join of the thread pool.  Profiled on FB15k-237 at
// threshold 2e-4 (417 kept per row of 14,505): compare + nonzero + gather took 50 ms of the 76 ms after
// the 65 ms GEMM.  Here a row is read from DRAM once (the max); it then sits in L2 (58 KB at
// N = 14,505; 252 KB at NELL-995's 63k), where exp + sum write the e_j into a per-thread row buffer and
// one more vector pass compares p_j with the threshold and appends the few survivors.
//
// Output strategy: per-task buffers, not count-then-write.  Rows are split into a few contiguous tasks
// per thread; each task appends its rows' entries to its own vectors and writes its rows' counts, and a
// final (parallel) memcpy places the task buffers one after the other.  Count-then-write would need the
// e_j of every row again after the counting pass: either the whole (c, N) chunk kept (mutating the
// scores, and reading 64 MB from DRAM a second time, ~5 ms per chunk) or exp recomputed (the most
// expensive step).  The extra copy here moves only the kept entries (8 bytes each; 417 per row is ~3%
// of the row's bytes).
//
// Vectorised with at::vec::Vectorized<float> (AVX-512 / AVX2 when the build targets them: exp is
// Sleef_expf16_u10 / Sleef_expf8_u10, the same function torch's own vectorised exp uses, exported by
// libtorch_cpu).  Every row is computed by one thread in a fixed order (max, then sums of 1,024-entry
// blocks added in double), so a row's result depends only on its scores and observed columns, not on
// the chunk it is computed in nor the thread count: lazy rows equal eager rows bit for bit.
//
// The threshold test is on the float p_j itself, against the smallest float >= threshold, so every
// kept value is >= threshold exactly (the reference compares e_j with threshold / scale instead;
// entries within an ulp of the cut can land on either side, see tests/test_ops_calibrate_rows.py).

// The vector ISA of the build target, before any ATen header (vec.h picks the implementation by it).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    defined(__FMA__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

#include "calibrate_rows_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzzy_common.h"

namespace kgreason {
namespace cpu {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();
// Entries summed in float vector lanes before the block sum is added in double: with 2 x W lanes each
// lane adds at most 1024 / (2W) values, so Z is accurate to ~1e-7 relative for any N.
constexpr int64_t kSumBlock = 1024;
static_assert(kSumBlock % (2 * W) == 0, "sum block must hold whole vector pairs");
// Single-threaded cost per score entry (max, exp, sum, compare), measured 1.1-1.7 ns on this machine
// (Intel Sapphire Rapids, AVX-512, busy): a 1,156 x 14,505 chunk takes 28 ms on one thread, 15 ms on two
// (the torch reference: ~100 ms).  A call under ~1 ms of work stays on the calling thread (parallel_if).
constexpr double kEntryNs = 1.2;

// Bit t set where lane t of p is >= thr.
inline uint32_t keep_bits(const Vec& p, const Vec& thr) {
#if defined(CPU_CAPABILITY_AVX512)
  return static_cast<uint32_t>(_mm512_cmp_ps_mask(p, thr, _CMP_GE_OQ));
#elif defined(CPU_CAPABILITY_AVX2)
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(p, thr, _CMP_GE_OQ)));
#else
  // comparisons give all-ones lanes (a NaN, not 0) where true; zero_mask marks the lanes equal to 0
  return ~static_cast<uint32_t>((p >= thr).zero_mask()) & ((1u << W) - 1u);
#endif
}

inline float hsum(const Vec& v) {
  alignas(64) float t[W];
  v.store(t);
  float s = 0.f;
  for (int64_t i = 0; i < W; ++i) s += t[i];
  return s;
}

inline float hmax(const Vec& v) {
  alignas(64) float t[W];
  v.store(t);
  float m = t[0];
  for (int64_t i = 1; i < W; ++i) m = std::max(m, t[i]);
  return m;
}

struct TaskOut {
  std::vector<int32_t> cols;
  std::vector<float> vals;
};

// One row: returns its number of kept entries, appended to out.  buf: N floats of scratch.
template <typename idx_t>
int64_t calibrate_row(const float* s, int64_t N, float* buf, const idx_t* obs, int64_t n_obs, float thr, float cap,
                      TaskOut& out) {
  const int64_t Nv = N - N % W;
  // 1. row max (the only read of the row from memory)
  float m = -std::numeric_limits<float>::infinity();
  if (Nv) {
    Vec m0(m), m1(m);
    int64_t j = 0;
    for (; j + 2 * W <= Nv; j += 2 * W) {
      m0 = at::vec::maximum(m0, Vec::loadu(s + j));
      m1 = at::vec::maximum(m1, Vec::loadu(s + j + W));
    }
    for (; j < Nv; j += W) m0 = at::vec::maximum(m0, Vec::loadu(s + j));
    m = hmax(at::vec::maximum(m0, m1));
  }
  for (int64_t j = Nv; j < N; ++j) m = std::max(m, s[j]);

  // 2. e_j = exp(s_j - m) into buf, Z = sum e_j (blocks of kSumBlock in float lanes, added in double)
  const Vec vm(m);
  double z = 0.0;
  for (int64_t b0 = 0; b0 < Nv; b0 += kSumBlock) {
    const int64_t b1 = std::min(Nv, b0 + kSumBlock);
    Vec a0(0.f), a1(0.f);
    int64_t j = b0;
    for (; j + 2 * W <= b1; j += 2 * W) {
      const Vec e0 = (Vec::loadu(s + j) - vm).exp();
      const Vec e1 = (Vec::loadu(s + j + W) - vm).exp();
      e0.store(buf + j);
      e1.store(buf + j + W);
      a0 = a0 + e0;
      a1 = a1 + e1;
    }
    for (; j < b1; j += W) {
      const Vec e0 = (Vec::loadu(s + j) - vm).exp();
      e0.store(buf + j);
      a0 = a0 + e0;
    }
    z += static_cast<double>(hsum(a0 + a1));
  }
  for (int64_t j = Nv; j < N; ++j) {
    buf[j] = std::exp(s[j] - m);
    z += static_cast<double>(buf[j]);
  }
  // float32 k / Z, as the torch formulation computes it
  const float k = static_cast<float>(std::max<int64_t>(1, n_obs));
  const float scale = k / static_cast<float>(z);

  // 3. observed columns: +inf, so p = inf * scale = inf passes any threshold and is written as 1.0
  //    (no computed p is infinite: e_j <= 1 and Z >= 1, so p <= k)
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t o = 0; o < n_obs; ++o) buf[static_cast<int64_t>(obs[o])] = inf;

  // 4. p_j = e_j * scale >= threshold: append (column ascending)
  const size_t before = out.cols.size();
  auto emit = [&](int64_t j, float p) {
    out.cols.push_back(static_cast<int32_t>(j));
    out.vals.push_back(p == inf ? 1.f : std::min(p, cap));
  };
  const Vec vscale(scale), vthr(thr);
  alignas(64) float tmp[W];
  for (int64_t j = 0; j < Nv; j += W) {
    const Vec p = Vec::loadu(buf + j) * vscale;
    uint32_t bits = keep_bits(p, vthr);
    if (!bits) continue;  // the common case: ~3% of entries survive 2e-4 on FB15k-237
    p.store(tmp);
    while (bits) {
      const int t = __builtin_ctz(bits);
      bits &= bits - 1u;
      emit(j + t, tmp[t]);
    }
  }
  for (int64_t j = Nv; j < N; ++j) {
    const float p = buf[j] * scale;
    if (p >= thr) emit(j, p);
  }
  return static_cast<int64_t>(out.cols.size() - before);
}

template <typename idx_t>
void run(const float* S, int64_t c, int64_t N, const int64_t* ptr, const idx_t* ocol, float thr, float cap,
         int64_t* row_nnz, std::vector<TaskOut>& outs) {
  const int64_t tasks = static_cast<int64_t>(outs.size());
  detail::parallel_if(kEntryNs * static_cast<double>(c) * static_cast<double>(N), 0, tasks, 1,
                      [&](int64_t t0, int64_t t1) {
                        detail::AlignedFloats buf(static_cast<size_t>(N));
                        for (int64_t t = t0; t < t1; ++t) {
                          const int64_t r0 = t * c / tasks, r1 = (t + 1) * c / tasks;
                          TaskOut& out = outs[t];
                          // a guess (~1/32 of the entries) that avoids most regrowth
                          out.cols.reserve(static_cast<size_t>((r1 - r0) * std::min<int64_t>(N, 64 + N / 32)));
                          out.vals.reserve(out.cols.capacity());
                          for (int64_t r = r0; r < r1; ++r)
                            row_nnz[r] = calibrate_row<idx_t>(S + r * N, N, buf.data(), ocol + ptr[r],
                                                              ptr[r + 1] - ptr[r], thr, cap, out);
                        }
                      });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_cpu(const at::Tensor& scores_in,
                                                                  const at::Tensor& ptr_in,
                                                                  const at::Tensor& cols_in, double threshold,
                                                                  double delta) {
  constexpr const char* op = "kgreason::calibrate_rows";
  TORCH_CHECK(scores_in.device().is_cpu() && scores_in.scalar_type() == at::kFloat && scores_in.dim() == 2, op,
              ": scores must be a 2-D float32 CPU tensor");
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  TORCH_CHECK(N <= INT32_MAX, op, ": N must fit int32 (the output columns are int32)");
  TORCH_CHECK(ptr_in.device().is_cpu() && ptr_in.scalar_type() == at::kLong && ptr_in.dim() == 1 &&
                  ptr_in.numel() == c + 1,
              op, ": obs_ptr must be a (c+1,) int64 CPU tensor");
  TORCH_CHECK(cols_in.device().is_cpu() && cols_in.dim() == 1 &&
                  (cols_in.scalar_type() == at::kInt || cols_in.scalar_type() == at::kLong),
              op, ": obs_cols must be a 1-D int32/int64 CPU tensor");
  TORCH_CHECK(std::isfinite(threshold) && threshold > 0.0, op, ": threshold must be finite and > 0, got ",
              threshold);
  TORCH_CHECK(delta >= 0.0 && delta < 1.0, op, ": delta must be in [0, 1), got ", delta);
  const at::Tensor scores = scores_in.contiguous(), ptr_t = ptr_in.contiguous(), cols_t = cols_in.contiguous();
  const int64_t* ptr = ptr_t.data_ptr<int64_t>();
  const int64_t E = cols_t.numel();
  // Out-of-range pointers or columns would write outside the row buffer: checked here, O(c + E).
  TORCH_CHECK(ptr[0] == 0 && ptr[c] == E, op, ": obs_ptr must start at 0 and end at len(obs_cols) = ", E);
  for (int64_t r = 0; r < c; ++r) TORCH_CHECK(ptr[r] <= ptr[r + 1], op, ": obs_ptr must be non-decreasing");
  auto check_cols = [&](const auto* oc) {
    for (int64_t e = 0; e < E; ++e)
      TORCH_CHECK(oc[e] >= 0 && static_cast<int64_t>(oc[e]) < N, op, ": obs_cols must lie in [0, ", N, ")");
  };
  if (cols_t.scalar_type() == at::kInt)
    check_cols(cols_t.data_ptr<int32_t>());
  else
    check_cols(cols_t.data_ptr<int64_t>());

  // keep p >= threshold exactly: against the smallest float >= threshold
  float thr = static_cast<float>(threshold);
  if (static_cast<double>(thr) < threshold) thr = std::nextafter(thr, std::numeric_limits<float>::infinity());
  const float cap = static_cast<float>(1.0 - delta);

  at::Tensor row_nnz = at::zeros({c}, scores.options().dtype(at::kLong));
  if (c == 0 || N == 0)
    return {row_nnz, at::empty({0}, scores.options().dtype(at::kInt)), at::empty({0}, scores.options())};
  // a few contiguous row ranges per thread (rows cost the same, ~N entries each)
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(c, 4 * at::get_num_threads()));
  std::vector<TaskOut> outs(static_cast<size_t>(tasks));
  if (cols_t.scalar_type() == at::kInt)
    run<int32_t>(scores.data_ptr<float>(), c, N, ptr, cols_t.data_ptr<int32_t>(), thr, cap,
                 row_nnz.data_ptr<int64_t>(), outs);
  else
    run<int64_t>(scores.data_ptr<float>(), c, N, ptr, cols_t.data_ptr<int64_t>(), thr, cap,
                 row_nnz.data_ptr<int64_t>(), outs);

  std::vector<int64_t> off(static_cast<size_t>(tasks) + 1, 0);
  for (int64_t t = 0; t < tasks; ++t) off[t + 1] = off[t] + static_cast<int64_t>(outs[t].cols.size());
  const int64_t nnz = off[tasks];
  at::Tensor cols = at::empty({nnz}, scores.options().dtype(at::kInt));
  at::Tensor vals = at::empty({nnz}, scores.options());
  int32_t* cp = cols.data_ptr<int32_t>();
  float* vp = vals.data_ptr<float>();
  // ~0.1 ns per byte copied
  detail::parallel_if(0.8 * static_cast<double>(nnz), 0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const size_t n = outs[t].cols.size();
      if (n == 0) continue;
      std::memcpy(cp + off[t], outs[t].cols.data(), n * sizeof(int32_t));
      std::memcpy(vp + off[t], outs[t].vals.data(), n * sizeof(float));
    }
  });
  return {row_nnz, cols, vals};
}

}  // namespace cpu
}  // namespace kgreason
