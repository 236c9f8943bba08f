// Max-times SpMM  Y[b,j] = max_i X[b,i] * M[i,j]  on the CPU, direction-optimizing.
//
// push  (CSR; parallel over queries b): for every active entity i of query b
//       (X[b,i] > 0) walk row i of M and scatter-max into Y[b,:].  Work is
//       the sum over active i of deg(i): for a one-hot anchor one row (~100
//       entries on FB15k-237-sized matrices) instead of all nnz, and Y[b,:]
//       (58 KB for N = 14,505) stays in L2 while being scattered into.  The
//       scatter is scalar (data-dependent j), ~1.8 ns per entry, so push loses
//       once X has more than a few percent active entries.
// pull  (CSC; parallel over column ranges of equal nnz): for column j gather
//       the max over its support.  Queries are processed in tiles of T (16, 32
//       or 64) held transposed (X^T tile, N x T floats), so one support entry
//       costs one contiguous T-float load, T/16 AVX-512 multiplies and maxes,
//       no write conflicts, and Y is written once, sequentially.  Cost
//       ~ ceil(B/T) * nnz steps whatever the sparsity of X.
// auto  estimates both costs from a sample of up to 32 rows of X (estimate()).
//
// Single-threaded CPU time on this machine (AMD EPYC Zen 4, N = 14,505,
// 1.03M-nnz power-law matrix), ours vs torch.sparse.mm(reduce="amax"):
//   B = 256 one-hot: push 1.19 ms, pull 24.1 ms, sparse.mm 67.0 ms (56x);
//   B = 256 dense:   push 409 ms,  pull 26.4 ms, sparse.mm 73.3 ms (2.8x);
//   B = 1 dense:     push 1.58 ms, pull 0.98 ms, sparse.mm 3.78 ms.
// Full tables (wall clock, 2 threads): benchmarks/results/ops_projection.md.
//
// Ties: both strategies visit sources in ascending i (push: rows in order;
// pull: CSC rows sorted) and replace only on a strictly larger product, so
// argmax is the smallest maximising i in both; -1 where Y is 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "fuzzy_common.h"
#include "fuzzy_cpu.h"

namespace kgreason {
namespace cpu {
namespace {

using detail::any_nonzero;

constexpr int64_t kScanBlock = 256;
constexpr int64_t kColBlock = 64;  // columns per output block written to Y (T x 64 floats)

// Costs in ns, single-threaded on this machine (AMD EPYC Zen 4, AVX-512;
// N = 14,505, ~1M-nnz power-law matrix): a push step (one entry of an active
// row, scalar scatter-max for one query) ~1.8 ns; a pull step (one support
// entry for one tile of T queries) 0.5 ns (T = 1), 1.0 (T = 16), 1.4 (T = 32),
// 2.6-3.7 (T = 64).  Push also scans X[b,:] (~0.1 ns per entity).  So for
// B = 256 (four T = 64 tiles) push wins below ~3% active entries; a one-hot
// anchor (1/14,505) is far below, a projected set usually far above.
constexpr double kPushStepNs = 1.8;
constexpr double kScanNs = 0.1;
inline double pull_step_ns(int T) { return T == 1 ? 0.5 : T == 16 ? 1.0 : T == 32 ? 1.4 : 3.0; }

struct Estimate {
  double push_ns;
  double pull_ns;
};

template <typename idx_t>
Estimate estimate(const float* X, int64_t B, int64_t N, const idx_t* crow, int64_t nnz) {
  if (B == 0) return {0.0, 0.0};
  // Sample up to 32 evenly spaced queries; the decision only affects speed.
  const int64_t S = std::min<int64_t>(B, 32);
  double active_work = 0.0;
  for (int64_t s = 0; s < S; ++s) {
    const float* x = X + (s * B / S) * N;
    for (int64_t i0 = 0; i0 < N; i0 += kScanBlock) {
      const int64_t i1 = std::min(N, i0 + kScanBlock);
      if (!any_nonzero(x + i0, i1 - i0)) continue;
      for (int64_t i = i0; i < i1; ++i)
        if (x[i] > 0.f) active_work += static_cast<double>(crow[i + 1] - crow[i]);
    }
  }
  const int T = detail::tile_width(B);
  const double push = kPushStepNs * active_work * (static_cast<double>(B) / S) + kScanNs * B * N;
  const double pull = pull_step_ns(T) * static_cast<double>((B + T - 1) / T) * static_cast<double>(nnz + N);
  return {push, pull};
}

template <typename idx_t>
int64_t choose(const float* X, int64_t B, int64_t N, const idx_t* crow, int64_t nnz) {
  const Estimate e = estimate<idx_t>(X, B, N, crow, nnz);
  return e.push_ns <= e.pull_ns ? kPush : kPull;
}

template <typename idx_t, bool ARG>
void push(const float* X, int64_t B, int64_t N, const idx_t* crow, const idx_t* col, const float* val, float* Y,
          int32_t* A, double work_ns) {
  detail::parallel_if(work_ns, 0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* x = X + b * N;
      float* y = Y + b * N;
      int32_t* a = ARG ? A + b * N : nullptr;
      // Zeroed here rather than by at::zeros: no separate parallel pass, and
      // each row is first touched by the thread that scatters into it.
      std::fill(y, y + N, 0.f);
      if constexpr (ARG) std::fill(a, a + N, -1);
      for (int64_t i0 = 0; i0 < N; i0 += kScanBlock) {
        const int64_t i1 = std::min(N, i0 + kScanBlock);
        if (!any_nonzero(x + i0, i1 - i0)) continue;
        for (int64_t i = i0; i < i1; ++i) {
          const float xi = x[i];
          if (!(xi > 0.f)) continue;
          const int64_t e = static_cast<int64_t>(crow[i + 1]);
          for (int64_t k = static_cast<int64_t>(crow[i]); k < e; ++k) {
            const int64_t j = static_cast<int64_t>(col[k]);
            const float p = xi * val[k];
            if (p > y[j]) {
              y[j] = p;
              if constexpr (ARG) a[j] = static_cast<int32_t>(i);
            }
          }
        }
      }
    }
  });
}

template <typename idx_t, int T, bool ARG>
void pull(const float* X, int64_t B, int64_t N, const idx_t* ccol, const idx_t* row, const float* tval, float* Y,
          int32_t* A, double work_ns) {
  const int64_t ntiles = (B + T - 1) / T;
  const int64_t tasks = std::max<int64_t>(1, at::get_num_threads()) * 4;
  const std::vector<int64_t> bounds = detail::balanced_column_split(ccol, N, tasks);
  // T = 1 tiles are X itself (xt[q*N + i] = X[q, i]): no copy
  detail::AlignedFloats xt_all(T == 1 ? 0 : static_cast<size_t>(ntiles * N * T));
  const float* xt_base = X;
  if constexpr (T != 1) {
    detail::transpose_tiles<T>(X, B, N, xt_all.data());
    xt_base = xt_all.data();
  }

  // One parallel region; each thread walks its column range once per tile, so
  // the tile (N x T floats) stays in its L2 while the range's supports stream.
  detail::parallel_if(work_ns, 0, tasks, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) float ybuf[kColBlock * T];
    alignas(64) int32_t abuf[ARG ? kColBlock * T : 1];
    for (int64_t task = t0; task < t1; ++task) {
      for (int64_t q = 0; q < ntiles; ++q) {
        const float* xt = xt_base + q * N * T;
        const int64_t b0 = q * T, nb = std::min<int64_t>(T, B - b0);
        for (int64_t jb = bounds[task]; jb < bounds[task + 1]; jb += kColBlock) {
          const int64_t je = std::min(bounds[task + 1], jb + kColBlock);
          for (int64_t j = jb; j < je; ++j)
            detail::column_max<T, ARG>(
                xt, row, tval, static_cast<int64_t>(ccol[j]), static_cast<int64_t>(ccol[j + 1]),
                [](float v) { return v; }, [](int64_t) {}, ybuf + (j - jb) * T, abuf + (ARG ? (j - jb) * T : 0));
          for (int64_t t = 0; t < nb; ++t) {
            float* y = Y + (b0 + t) * N;
            for (int64_t j = jb; j < je; ++j) y[j] = ybuf[(j - jb) * T + t];
            if constexpr (ARG) {
              int32_t* a = A + (b0 + t) * N;
              for (int64_t j = jb; j < je; ++j) a[j] = abuf[(j - jb) * T + t];
            }
          }
        }
      }
    }
  });
}

template <typename idx_t>
void run(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val,
         const at::Tensor& ccol, const at::Tensor& row, const at::Tensor& tval, int64_t strategy, bool want_argmax,
         at::Tensor& y, at::Tensor& a) {
  const int64_t B = x.size(0), N = x.size(1);
  const float* X = x.data_ptr<float>();
  const Estimate est = estimate<idx_t>(X, B, N, crow.data_ptr<idx_t>(), val.numel());
  if (strategy == kAuto) strategy = est.push_ns <= est.pull_ns ? kPush : kPull;
  if (strategy == kPush) {
    y = at::empty({B, N}, x.options());
    a = want_argmax ? at::empty({B, N}, x.options().dtype(at::kInt)) : at::empty({0}, x.options().dtype(at::kInt));
    if (B * N == 0) return;
    if (want_argmax)
      push<idx_t, true>(X, B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
                        y.data_ptr<float>(), a.data_ptr<int32_t>(), est.push_ns);
    else
      push<idx_t, false>(X, B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(),
                         y.data_ptr<float>(), nullptr, est.push_ns);
    return;
  }
  y = at::empty({B, N}, x.options());
  a = want_argmax ? at::empty({B, N}, x.options().dtype(at::kInt)) : at::empty({0}, x.options().dtype(at::kInt));
  if (B * N == 0) return;
  detail::dispatch_tile(B, [&](auto tile) {
    constexpr int T = decltype(tile)::value;
    if (want_argmax)
      pull<idx_t, T, true>(X, B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(),
                           y.data_ptr<float>(), a.data_ptr<int32_t>(), est.pull_ns);
    else
      pull<idx_t, T, false>(X, B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(),
                            y.data_ptr<float>(), nullptr, est.pull_ns);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> project_cpu(const at::Tensor& x_in, const at::Tensor& crow_in,
                                               const at::Tensor& col_in, const at::Tensor& val_in,
                                               const at::Tensor& ccol_in, const at::Tensor& row_in,
                                               const at::Tensor& tval_in, int64_t strategy, bool want_argmax) {
  detail::check_fuzzy_batch(x_in);
  const int64_t N = x_in.size(1);
  detail::check_compressed(crow_in, col_in, val_in, N, "CSR");
  detail::check_compressed(ccol_in, row_in, tval_in, N, "CSC");
  TORCH_CHECK(strategy == kAuto || strategy == kPush || strategy == kPull, "kgreason::project: strategy must be 0 (auto), 1 (push) or 2 (pull), got ", strategy);
  TORCH_CHECK(N <= INT32_MAX, "kgreason::project: N must fit int32 for argmax");
  const at::Tensor x = x_in.contiguous(), crow = crow_in.contiguous(), col = col_in.contiguous(),
                   val = val_in.contiguous(), ccol = ccol_in.contiguous(), row = row_in.contiguous(),
                   tval = tval_in.contiguous();
  at::Tensor y, a;
  if (crow.scalar_type() == at::kInt)
    run<int32_t>(x, crow, col, val, ccol, row, tval, strategy, want_argmax, y, a);
  else
    run<int64_t>(x, crow, col, val, ccol, row, tval, strategy, want_argmax, y, a);
  return {y, a};
}

int64_t project_strategy_cpu(const at::Tensor& x_in, const at::Tensor& crow, int64_t nnz) {
  detail::check_fuzzy_batch(x_in);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor c = crow.contiguous();
  TORCH_CHECK(c.numel() == x.size(1) + 1, "kgreason::project_strategy: crow must have N+1 entries");
  if (c.scalar_type() == at::kInt)
    return choose<int32_t>(x.data_ptr<float>(), x.size(0), x.size(1), c.data_ptr<int32_t>(), nnz);
  TORCH_CHECK(c.scalar_type() == at::kLong, "kgreason::project_strategy: crow must be int32 or int64");
  return choose<int64_t>(x.data_ptr<float>(), x.size(0), x.size(1), c.data_ptr<int64_t>(), nnz);
}

}  // namespace cpu
}  // namespace kgreason
