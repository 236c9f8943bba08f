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
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
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

// 1. The row's maximum (the only read of the row from memory in calibrate_rows).
inline float row_max(const float* s, int64_t N) {
  const int64_t Nv = N - N % W;
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
  return m;
}

// 2. e_j = exp(s_j - m) into buf (kStore), Z = sum e_j (blocks of kSumBlock in float lanes, added in double).
//    calibrate_rows and calibrate_row_stats share it, so a block's partial Z is summed as one process sums.
template <bool kStore>
double exp_sum(const float* s, int64_t N, float m, float* buf) {
  const int64_t Nv = N - N % W;
  const Vec vm(m);
  double z = 0.0;
  for (int64_t b0 = 0; b0 < Nv; b0 += kSumBlock) {
    const int64_t b1 = std::min(Nv, b0 + kSumBlock);
    Vec a0(0.f), a1(0.f);
    int64_t j = b0;
    for (; j + 2 * W <= b1; j += 2 * W) {
      const Vec e0 = (Vec::loadu(s + j) - vm).exp();
      const Vec e1 = (Vec::loadu(s + j + W) - vm).exp();
      if (kStore) {
        e0.store(buf + j);
        e1.store(buf + j + W);
      }
      a0 = a0 + e0;
      a1 = a1 + e1;
    }
    for (; j < b1; j += W) {
      const Vec e0 = (Vec::loadu(s + j) - vm).exp();
      if (kStore) e0.store(buf + j);
      a0 = a0 + e0;
    }
    z += static_cast<double>(hsum(a0 + a1));
  }
  for (int64_t j = Nv; j < N; ++j) {
    const float e = std::exp(s[j] - m);
    if (kStore) buf[j] = e;
    z += static_cast<double>(e);
  }
  return z;
}

// e_j = exp(s_j - m) into buf for an outside maximum m (calibrate_rows_normalised); returns the row's own
// maximum, which must not exceed m (the caller checks: a larger score would make p_j > k, or infinite).
inline float exp_store(const float* s, int64_t N, float m, float* buf) {
  const int64_t Nv = N - N % W;
  const Vec vm(m);
  Vec mx(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < Nv; j += W) {
    const Vec x = Vec::loadu(s + j);
    mx = at::vec::maximum(mx, x);
    (x - vm).exp().store(buf + j);
  }
  float own = Nv ? hmax(mx) : -std::numeric_limits<float>::infinity();
  for (int64_t j = Nv; j < N; ++j) {
    own = std::max(own, s[j]);
    buf[j] = std::exp(s[j] - m);
  }
  return own;
}

// The largest score calibrate_rows_normalised accepts in a row with outside maximum m: m itself, plus float32
// rounding (a row's block may be recomputed in another GEMM shape than the one its statistics came from, which
// may move a score by a few ulp); p_j is then a hair above k * e_j / Z (and capped at 1 - delta), never infinite.
inline float max_bound(float m) { return m + 1e-4f * std::max(1.f, std::fabs(m)); }

// 3-4. From the e_j in buf and the row's scale k / Z: observed columns -> 1.0, p_j = e_j * scale >= thr
//      appended (column ascending), capped.  Returns the row's number of kept entries.
template <typename idx_t>
int64_t emit_row(float* buf, int64_t N, float scale, const idx_t* obs, int64_t n_obs, float thr, float cap,
                 TaskOut& out) {
  const int64_t Nv = N - N % W;
  // observed columns: +inf, so p = inf * scale = inf passes any threshold and is written as 1.0
  // (no computed p is infinite: e_j <= 1 and Z >= 1, so p <= k)
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t o = 0; o < n_obs; ++o) buf[static_cast<int64_t>(obs[o])] = inf;

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

// One row: returns its number of kept entries, appended to out.  buf: N floats of scratch.
template <typename idx_t>
int64_t calibrate_row(const float* s, int64_t N, float* buf, const idx_t* obs, int64_t n_obs, float thr, float cap,
                      TaskOut& out) {
  const float m = row_max(s, N);
  const double z = exp_sum<true>(s, N, m, buf);
  // float32 k / Z, as the torch formulation computes it
  const float k = static_cast<float>(std::max<int64_t>(1, n_obs));
  const float scale = k / static_cast<float>(z);
  return emit_row<idx_t>(buf, N, scale, obs, n_obs, thr, cap, out);
}

// Rows [0, c) split into a few contiguous tasks per thread; row_fn(r, buf, out) computes row r into task
// buffer out (buf: N floats of scratch) and returns its entries.  Then the task buffers are placed one after
// the other.  Returns (cols, vals).
template <typename RowFn>
std::tuple<at::Tensor, at::Tensor> run_rows(int64_t c, int64_t N, const at::TensorOptions& opts, int64_t* row_nnz,
                                            const RowFn& row_fn) {
  // a few contiguous row ranges per thread (rows cost the same, ~N entries each)
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(c, 4 * at::get_num_threads()));
  std::vector<TaskOut> outs(static_cast<size_t>(tasks));
  detail::parallel_if(kEntryNs * static_cast<double>(c) * static_cast<double>(N), 0, tasks, 1,
                      [&](int64_t t0, int64_t t1) {
                        detail::AlignedFloats buf(static_cast<size_t>(N));
                        for (int64_t t = t0; t < t1; ++t) {
                          const int64_t r0 = t * c / tasks, r1 = (t + 1) * c / tasks;
                          TaskOut& out = outs[t];
                          // a guess (~1/32 of the entries) that avoids most regrowth
                          out.cols.reserve(static_cast<size_t>((r1 - r0) * std::min<int64_t>(N, 64 + N / 32)));
                          out.vals.reserve(out.cols.capacity());
                          for (int64_t r = r0; r < r1; ++r) row_nnz[r] = row_fn(r, buf.data(), out);
                        }
                      });

  std::vector<int64_t> off(static_cast<size_t>(tasks) + 1, 0);
  for (int64_t t = 0; t < tasks; ++t) off[t + 1] = off[t] + static_cast<int64_t>(outs[t].cols.size());
  const int64_t nnz = off[tasks];
  at::Tensor cols = at::empty({nnz}, opts.dtype(at::kInt));
  at::Tensor vals = at::empty({nnz}, opts.dtype(at::kFloat));
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
  return {cols, vals};
}

void check_scores(const char* op, const at::Tensor& scores) {
  TORCH_CHECK(scores.device().is_cpu() && scores.scalar_type() == at::kFloat && scores.dim() == 2, op,
              ": scores must be a 2-D float32 CPU tensor");
  TORCH_CHECK(scores.size(1) <= INT32_MAX, op, ": N must fit int32 (the output columns are int32)");
}

// The observed-tails CSR (c rows, columns in [0, N)), threshold and delta: out-of-range pointers or columns would
// write outside the row buffer, so they are checked here, O(c + E).  Returns (thr, cap) as the kernels test them.
std::pair<float, float> check_obs(const char* op, int64_t c, int64_t N, const at::Tensor& ptr_t,
                                  const at::Tensor& cols_t, double threshold, double delta) {
  TORCH_CHECK(ptr_t.device().is_cpu() && ptr_t.scalar_type() == at::kLong && ptr_t.dim() == 1 &&
                  ptr_t.numel() == c + 1,
              op, ": obs_ptr must be a (c+1,) int64 CPU tensor");
  TORCH_CHECK(cols_t.device().is_cpu() && cols_t.dim() == 1 &&
                  (cols_t.scalar_type() == at::kInt || cols_t.scalar_type() == at::kLong),
              op, ": obs_cols must be a 1-D int32/int64 CPU tensor");
  TORCH_CHECK(std::isfinite(threshold) && threshold > 0.0, op, ": threshold must be finite and > 0, got ",
              threshold);
  TORCH_CHECK(delta >= 0.0 && delta < 1.0, op, ": delta must be in [0, 1), got ", delta);
  TORCH_CHECK(ptr_t.is_contiguous() && cols_t.is_contiguous(), op, ": obs_ptr and obs_cols must be contiguous");
  const int64_t* ptr = ptr_t.data_ptr<int64_t>();
  const int64_t E = cols_t.numel();
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
  return {thr, static_cast<float>(1.0 - delta)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_cpu(const at::Tensor& scores_in,
                                                                  const at::Tensor& ptr_in,
                                                                  const at::Tensor& cols_in, double threshold,
                                                                  double delta) {
  constexpr const char* op = "kgreason::calibrate_rows";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  const at::Tensor scores = scores_in.contiguous(), ptr_t = ptr_in.contiguous(), cols_t = cols_in.contiguous();
  const auto [thr, cap] = check_obs(op, c, N, ptr_t, cols_t, threshold, delta);
  at::Tensor row_nnz = at::zeros({c}, scores.options().dtype(at::kLong));
  if (c == 0 || N == 0)
    return {row_nnz, at::empty({0}, scores.options().dtype(at::kInt)), at::empty({0}, scores.options())};
  const float* S = scores.data_ptr<float>();
  const int64_t* ptr = ptr_t.data_ptr<int64_t>();
  auto go = [&](const auto* ocol) {
    using idx_t = std::remove_const_t<std::remove_pointer_t<decltype(ocol)>>;
    return run_rows(c, N, scores.options(), row_nnz.data_ptr<int64_t>(), [&](int64_t r, float* buf, TaskOut& out) {
      return calibrate_row<idx_t>(S + r * N, N, buf, ocol + ptr[r], ptr[r + 1] - ptr[r], thr, cap, out);
    });
  };
  auto [cols, vals] = cols_t.scalar_type() == at::kInt ? go(cols_t.data_ptr<int32_t>()) : go(cols_t.data_ptr<int64_t>());
  return {row_nnz, cols, vals};
}

std::tuple<at::Tensor, at::Tensor> calibrate_row_stats_cpu(const at::Tensor& scores_in) {
  constexpr const char* op = "kgreason::calibrate_row_stats";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  const at::Tensor scores = scores_in.contiguous();
  at::Tensor max_t = at::full({c}, -std::numeric_limits<float>::infinity(), scores.options());
  at::Tensor sum_t = at::zeros({c}, scores.options().dtype(at::kDouble));
  if (c == 0 || N == 0) return {max_t, sum_t};  // a zero-width block: max -inf, sum 0 (adds nothing)
  const float* S = scores.data_ptr<float>();
  float* mp = max_t.data_ptr<float>();
  double* zp = sum_t.data_ptr<double>();
  // max + exp + sum: about two thirds of calibrate_rows' work per entry
  detail::parallel_if(0.7 * kEntryNs * static_cast<double>(c) * static_cast<double>(N), 0, c, 1,
                      [&](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* s = S + r * N;
                          mp[r] = row_max(s, N);
                          zp[r] = exp_sum<false>(s, N, mp[r], nullptr);
                        }
                      });
  return {max_t, sum_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> calibrate_rows_normalised_cpu(
    const at::Tensor& scores_in, const at::Tensor& max_in, const at::Tensor& scale_in, const at::Tensor& ptr_in,
    const at::Tensor& cols_in, double threshold, double delta) {
  constexpr const char* op = "kgreason::calibrate_rows_normalised";
  check_scores(op, scores_in);
  const int64_t c = scores_in.size(0), N = scores_in.size(1);
  auto check_row_vector = [&](const char* name, const at::Tensor& t) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == c, op, ": ",
                name, " must be a (c,) float32 CPU tensor");
  };
  check_row_vector("row_max", max_in);
  check_row_vector("row_scale", scale_in);
  const at::Tensor scores = scores_in.contiguous(), ptr_t = ptr_in.contiguous(), cols_t = cols_in.contiguous();
  const at::Tensor mx = max_in.contiguous(), sc = scale_in.contiguous();
  const auto [thr, cap] = check_obs(op, c, N, ptr_t, cols_t, threshold, delta);
  const float* M = mx.data_ptr<float>();
  const float* K = sc.data_ptr<float>();
  for (int64_t r = 0; r < c; ++r)
    TORCH_CHECK(std::isfinite(K[r]) && K[r] > 0.f && (N == 0 || std::isfinite(M[r])), op,
                ": row ", r, ": row_max must be finite and row_scale finite and > 0, got ", M[r], " and ", K[r]);
  at::Tensor row_nnz = at::zeros({c}, scores.options().dtype(at::kLong));
  if (c == 0 || N == 0)
    return {row_nnz, at::empty({0}, scores.options().dtype(at::kInt)), at::empty({0}, scores.options())};
  const float* S = scores.data_ptr<float>();
  const int64_t* ptr = ptr_t.data_ptr<int64_t>();
  // the first row whose scores exceed its row_max (c: none); rows are independent, so any thread may find one
  std::atomic<int64_t> bad{c};
  auto go = [&](const auto* ocol) {
    using idx_t = std::remove_const_t<std::remove_pointer_t<decltype(ocol)>>;
    return run_rows(c, N, scores.options(), row_nnz.data_ptr<int64_t>(), [&](int64_t r, float* buf, TaskOut& out) {
      if (exp_store(S + r * N, N, M[r], buf) > max_bound(M[r])) {
        int64_t seen = bad.load();
        while (r < seen && !bad.compare_exchange_weak(seen, r)) {
        }
        return int64_t{0};
      }
      return emit_row<idx_t>(buf, N, K[r], ocol + ptr[r], ptr[r + 1] - ptr[r], thr, cap, out);
    });
  };
  auto [cols, vals] = cols_t.scalar_type() == at::kInt ? go(cols_t.data_ptr<int32_t>()) : go(cols_t.data_ptr<int64_t>());
  const int64_t b = bad.load();
  TORCH_CHECK(b == c, op, ": row ", b, ": row_max ", M[b], " is below the row's largest score (",
              row_max(S + b * N, N), "); it must be the maximum over every block of the row (1e-4 relative slack)");
  return {row_nnz, cols, vals};
}

}  // namespace cpu
}  // namespace kgreason
