// Max-times SpMM  Y[b,j] = max_i X[b,i] * M[i,j]  on the CPU, direction-optimizing.
//
// push  (CSR; parallel over queries b): for every active entity i of query b
//       (X[b,i] > 0) walk row i of M and scatter-max into Y[b,:].  Work is
//       the sum over active i of deg(i): for a one-hot anchor one row (~100
//       entries on FB15k-237-sized matrices) instead of all nnz, and Y[b,:]
//       (58 KB for N = 14,505) stays in L2 while being scattered into.  The
//       scatter is scalar (data-dependent j), 2-4 ns per entry, so push loses
//       once X has more than a few percent active entries.
// pull  (CSC): for column j gather the max over its support, in the
//       batch-minor layout: queries are processed in tiles of T (16 or 32)
//       transposed to N x T (X^T tile), so one support entry costs one
//       contiguous T-float load and T/16 AVX-512 multiplies and maxes into
//       accumulators held in registers for the whole column (several
//       independent chains, see column_max), no write conflicts, and Y is
//       written once, 16 columns at a time through register transposes.
//       Cost ~ ceil(B/T) * (nnz + T*N) whatever the sparsity of X.  Threads
//       take whole tiles, each transposing its own just before pulling it
//       (pull() explains the split).
// auto  estimates both costs from a sample of up to 32 rows of X (estimate()).
//
// Single-threaded CPU time on Sapphire Rapids (N = 14,505, FB15k-237's largest
// relation, 1.66M entries), ours vs torch.sparse.mm(reduce="amax"), same runs:
//   B = 256 dense:   pull 26-27 ms, sparse.mm 110-120 ms (4.3-4.4x);
//   B = 1 dense:     pull 1.35 ms, sparse.mm 6.6 ms.
// The previous layout (whole batch transposed first, 64-query tiles, one
// accumulator chain, scalar write-back) measured the same single-threaded at
// B = 256 (25.5-25.8 ms) and 15-25% slower on two threads at B >= 64.
// Roofline and tables: benchmarks/results/ops_notes.md, ops_projection.md.
//
// Ties: both strategies visit sources in ascending i (push: rows in order;
// pull: CSC rows sorted) and replace only on a strictly larger product, so
// argmax is the smallest maximising i in both; -1 where Y is 0.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

#include <array>

#include "fuzzy_common.h"
#include "fuzzy_cpu.h"

namespace kgreason {
namespace cpu {
namespace {

using detail::any_nonzero;

constexpr int64_t kScanBlock = 256;

// Costs in ns, single-threaded, measured on Sapphire Rapids (CPU time, N = 14,505;
// FB15k-237 relations of 195k and 1.66M entries, B = 64, X with 0.2-5% active
// entities): a push step (one entry of an active row, scalar scatter-max for
// one query) 2-4 ns; push also scans X[b,:] and zero-fills Y[b,:] (~0.4 ns per
// entity).  A pull step (one support entry for one tile of 16 queries) ~1.0 ns,
// plus ~1.0 ns per element of the tile for its transposition and write-back:
// 1.1-1.3 ns per entry-tile on the 1.66M-entry relation, 2.2-2.6 on the
// 195k-entry one, where the N x 16 terms weigh more.  (32-query tiles cost
// about the same per query.)  So push wins below a few percent of active
// entities; a one-hot anchor is far below, a projected set usually far above.
constexpr double kPushStepNs = 2.5;
constexpr double kScanNs = 0.4;
constexpr double kScanOnlyNs = 0.1;  // the scan of X[b,:] alone, without the zero fill of Y[b,:]
constexpr double kTileElementNs = 1.0;
inline double pull_step_ns(int T) { return T == 1 ? 0.5 : 1.0; }

struct Estimate {
  double push_ns;
  double pull_ns;
  // push's work without the zero fill of Y, for the parallel-or-not decision: the fill is
  // memory-bound (a second thread barely speeds it up), and on a machine shared with other
  // jobs a parallel region can wait a whole time slice (~8 ms measured) for its second
  // thread, so a one-hot B = 256 push (~0.5 ms of scan and scatter, 14.8 MB to zero) stays
  // on the calling thread.
  double push_parallel_ns;
};

template <typename idx_t>
Estimate estimate(const float* X, int64_t B, int64_t N, const idx_t* crow, int64_t nnz) {
  if (B == 0) return {0.0, 0.0, 0.0};
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
  const int T = B <= 1 ? 1 : 16;  // pull_tile's usual width (32 costs about the same per query)
  const double push = kPushStepNs * active_work * (static_cast<double>(B) / S) + kScanNs * B * N;
  const double tile = pull_step_ns(T) * static_cast<double>(nnz + N) + (T > 1 ? kTileElementNs * T * N : 0.0);
  const double pull = static_cast<double>((B + T - 1) / T) * tile;
  const double push_parallel = kPushStepNs * active_work * (static_cast<double>(B) / S) + kScanOnlyNs * B * N;
  return {push, pull, push_parallel};
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

// Columns [j0, j1) of one tile (rows b0 .. b0+nb of Y, transposed copy xt: N x T)
// in blocks of 16 columns: each column's T maxima are built in registers
// (column_max), 16 columns are collected in buf and written back to the rows
// of Y with register transposes (store_columns).
template <typename idx_t, int T, bool ARG>
void pull_columns(const float* xt, const idx_t* ccol, const idx_t* row, const float* tval, int64_t N, int64_t b0,
                  int64_t nb, int64_t j0, int64_t j1, float* Y, int32_t* A) {
  alignas(64) float ybuf[16 * T];
  alignas(64) int32_t abuf[ARG ? 16 * T : 1];
  const idx_t* row_end = row + static_cast<int64_t>(ccol[N]);
  constexpr int PF = T == 32 ? 16 : 0;  // see column_max
  for (int64_t jb = j0; jb < j1; jb += 16) {
    const int64_t je = std::min(j1, jb + 16);
    for (int64_t j = jb; j < je; ++j)
      detail::column_max<T, ARG, PF>(
          xt, row, tval, static_cast<int64_t>(ccol[j]), static_cast<int64_t>(ccol[j + 1]), [](float v) { return v; },
          [](int64_t) {}, ybuf + (j - jb) * T, abuf + (ARG ? (j - jb) * T : 0), row_end);
    detail::store_columns<T, ARG>(ybuf, abuf, je - jb, N, b0, nb, jb, Y, A);
  }
}

// Tile width of the pull: 1 for B = 1 (a scalar gather straight from X), 16 up
// to 16 queries; for more, 32 when the matrix's non-empty columns hold >= 128
// entries on average, else 16.  A 32-query tile halves the index and value
// loads per query, but its copy (N x 32 floats, 1.9 MB for N = 14,505) no
// longer fits the 2 MB L2 beside the streaming supports; long columns pay for
// that, short ones do not.  Measured single-threaded on Sapphire Rapids, B = 256,
// six FB15k-237 relations (T = 16 / T = 32, ms): 195k entries, 30 per non-empty
// column: 6.8 / 10.2; 439k, 49: 9.9 / 12.4; 665k, 46: 11.4 / 10.3; 816k, 56:
// 17.3 / 21.3; 1.14M, 78: 23.7 / 26.7; 1.66M, 346: 31.5 / 26.0 (with the prefetch).
template <typename idx_t>
int pull_tile(int64_t B, int64_t N, const idx_t* ccol) {
  if (B <= 1) return 1;
  if (B <= 16) return 16;
  int64_t cols = 0;
  for (int64_t j = 0; j < N; ++j) cols += ccol[j + 1] > ccol[j] ? 1 : 0;
  return static_cast<int64_t>(ccol[N]) >= 128 * std::max<int64_t>(cols, 1) ? 32 : 16;
}

// Pull in the batch-minor layout.  The batch is cut into tiles of T rows; a tile
// is transposed to N x T (entity-major: the T values of one entity are one
// 64- or 128-byte line pair), so a support entry (i, v) of column j costs one
// contiguous load of T floats, T/16 AVX-512 multiplies and maxes into
// accumulators that stay in registers for the whole column, and each column's
// maxima are written once.  Work is (tiles) x (nnz + N) whatever X's density.
//
// Threads: the (tile, column range) tasks are dealt in equal contiguous runs,
// one per thread.  When there are at least as many tiles as threads, a thread
// transposes each tile it works on into its own buffer just before pulling it,
// so the copy (N x T floats: 1.9 MB for T = 32, N = 14,505) is still in its L2;
// a tile is split into column ranges of equal nnz only as far as needed to give
// every thread the same number of tasks.  With fewer tiles than threads (small
// B) the whole batch is transposed once into a shared buffer first.
// One parallel region either way (on a machine shared with other jobs every
// extra fork/join waits for the slowest, possibly descheduled, thread).
template <typename idx_t, int T, bool ARG>
void pull(const float* X, int64_t B, int64_t N, const idx_t* ccol, const idx_t* row, const float* tval, float* Y,
          int32_t* A, double work_ns) {
  const int64_t ntiles = (B + T - 1) / T;
  const int64_t threads =
      (work_ns < detail::kMinParallelNs || at::in_parallel_region()) ? 1 : std::max<int64_t>(1, at::get_num_threads());
  // parts per tile: ntiles * parts is a multiple of threads, at most one part per 16 columns
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads / std::gcd(ntiles, threads), (N + 15) / 16));
  const std::vector<int64_t> bounds = detail::balanced_column_split(ccol, N, parts);
  const int64_t ntasks = ntiles * parts;
  const bool shared = T == 1 || ntiles < threads;

  // Shared transposed copy (T = 1: X itself, row q is tile q)
  const float* xt_shared = X;
  std::unique_ptr<detail::ThreadScratch> shared_buf;
  if (shared && T != 1) {
    shared_buf = std::make_unique<detail::ThreadScratch>(static_cast<size_t>(ntiles * N * T));
    float* dst = shared_buf->data();
    for (int64_t q = 0; q < ntiles; ++q)
      detail::transpose_tile<T>(X, N, q * T, std::min<int64_t>(T, B - q * T), 0, N, dst + q * N * T);
    xt_shared = dst;
  }
  auto body = [&](int64_t th0, int64_t th1) {
    const int64_t task0 = th0 * ntasks / threads, task1 = th1 * ntasks / threads;
    std::unique_ptr<detail::ThreadScratch> own;
    int64_t current = -1;
    for (int64_t task = task0; task < task1; ++task) {
      const int64_t q = task / parts, p = task % parts;
      const int64_t b0 = q * T, nb = std::min<int64_t>(T, B - b0);
      const float* xt;
      if (shared) {
        xt = xt_shared + q * N * T;
      } else {
        if (!own) own = std::make_unique<detail::ThreadScratch>(static_cast<size_t>(N * T));
        if (q != current) {
          detail::transpose_tile<T>(X, N, b0, nb, 0, N, own->data());
          current = q;
        }
        xt = own->data();
      }
      pull_columns<idx_t, T, ARG>(xt, ccol, row, tval, N, b0, nb, bounds[p], bounds[p + 1], Y, A);
    }
  };
  if (threads <= 1)
    body(0, 1);
  else
    at::parallel_for(0, threads, 1, body);
}

template <typename idx_t>
void run(const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val,
         const at::Tensor& ccol, const at::Tensor& row, const at::Tensor& tval, int64_t strategy, float* Y,
         int32_t* A) {
  const int64_t B = x.size(0), N = x.size(1);
  if (B * N == 0) return;
  const float* X = x.data_ptr<float>();
  const Estimate est = estimate<idx_t>(X, B, N, crow.data_ptr<idx_t>(), val.numel());
  if (strategy == kAuto) strategy = est.push_ns <= est.pull_ns ? kPush : kPull;
  if (strategy == kPush) {
    if (A != nullptr)
      push<idx_t, true>(X, B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(), Y, A,
                        est.push_parallel_ns);
    else
      push<idx_t, false>(X, B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(), val.data_ptr<float>(), Y, nullptr,
                         est.push_parallel_ns);
    return;
  }
  auto go = [&](auto tile) {
    constexpr int T = decltype(tile)::value;
    if (A != nullptr)
      pull<idx_t, T, true>(X, B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), Y, A,
                           est.pull_ns);
    else
      pull<idx_t, T, false>(X, B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), Y,
                            nullptr, est.pull_ns);
  };
  // With argmax, 16-query tiles whatever the matrix: the index vectors double the accumulator
  // traffic, and 32-query tiles measured 1.3-1.4x slower (B = 256, FB15k-237's largest relation
  // and a 1.14M-entry one: 58.5 vs 43.1 ms and 55.0 vs 42.6 ms single-threaded).
  const int tile = A != nullptr ? (B <= 1 ? 1 : 16) : pull_tile(B, N, ccol.data_ptr<idx_t>());
  switch (tile) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 16: go(std::integral_constant<int, 16>{}); break;
    default: go(std::integral_constant<int, 32>{}); break;
  }
}

// Checks shared by project and project_out; returns the contiguous inputs.
std::array<at::Tensor, 7> checked_inputs(const at::Tensor& x_in, const at::Tensor& crow_in, const at::Tensor& col_in,
                                         const at::Tensor& val_in, const at::Tensor& ccol_in,
                                         const at::Tensor& row_in, const at::Tensor& tval_in, int64_t strategy) {
  detail::check_fuzzy_batch(x_in);
  const int64_t N = x_in.size(1);
  detail::check_compressed(crow_in, col_in, val_in, N, "CSR");
  detail::check_compressed(ccol_in, row_in, tval_in, N, "CSC");
  TORCH_CHECK(strategy == kAuto || strategy == kPush || strategy == kPull, "kgreason::project: strategy must be 0 (auto), 1 (push) or 2 (pull), got ", strategy);
  TORCH_CHECK(N <= INT32_MAX, "kgreason::project: N must fit int32 for argmax");
  return {x_in.contiguous(),    crow_in.contiguous(), col_in.contiguous(), val_in.contiguous(),
          ccol_in.contiguous(), row_in.contiguous(),  tval_in.contiguous()};
}

template <typename F>
void dispatch_index(const at::Tensor& crow, const F& f) {
  if (crow.scalar_type() == at::kInt)
    f(int32_t{});
  else
    f(int64_t{});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> project_cpu(const at::Tensor& x_in, const at::Tensor& crow_in,
                                               const at::Tensor& col_in, const at::Tensor& val_in,
                                               const at::Tensor& ccol_in, const at::Tensor& row_in,
                                               const at::Tensor& tval_in, int64_t strategy, bool want_argmax) {
  const auto in = checked_inputs(x_in, crow_in, col_in, val_in, ccol_in, row_in, tval_in, strategy);
  const at::Tensor& x = in[0];
  const int64_t B = x.size(0), N = x.size(1);
  at::Tensor y = detail::empty_output({B, N}, x.options());
  at::Tensor a = want_argmax ? detail::empty_output({B, N}, x.options().dtype(at::kInt))
                             : at::empty({0}, x.options().dtype(at::kInt));
  dispatch_index(in[1], [&](auto tag) {
    using idx_t = decltype(tag);
    run<idx_t>(x, in[1], in[2], in[3], in[4], in[5], in[6], strategy, y.data_ptr<float>(),
               want_argmax ? a.data_ptr<int32_t>() : nullptr);
  });
  return {y, a};
}

void check_out(const at::Tensor& x, const at::Tensor& y, const at::Tensor& a, const char* op) {
  const int64_t B = x.size(0), N = x.size(1);
  TORCH_CHECK(y.device() == x.device(), op, ": out y must be on ", x.device(), ", got ", y.device());
  TORCH_CHECK(y.scalar_type() == at::kFloat, op, ": out y must be float32, got ", y.scalar_type());
  TORCH_CHECK(y.dim() == 2 && y.size(0) == B && y.size(1) == N, op, ": out y must have shape (", B, ", ", N,
              "), got ", y.sizes());
  TORCH_CHECK(y.is_contiguous(), op, ": out y must be contiguous");
  at::assert_no_overlap(y, x);
  if (a.numel() == 0) return;
  TORCH_CHECK(a.device() == x.device(), op, ": out argmax must be on ", x.device(), ", got ", a.device());
  TORCH_CHECK(a.scalar_type() == at::kInt, op, ": out argmax must be int32, got ", a.scalar_type());
  TORCH_CHECK(a.dim() == 2 && a.size(0) == B && a.size(1) == N, op, ": out argmax must have shape (", B, ", ", N,
              ") or be empty, got ", a.sizes());
  TORCH_CHECK(a.is_contiguous(), op, ": out argmax must be contiguous");
  at::assert_no_overlap(a, x);
  at::assert_no_overlap(a, y);
}

void project_out_cpu(const at::Tensor& x_in, const at::Tensor& crow_in, const at::Tensor& col_in,
                     const at::Tensor& val_in, const at::Tensor& ccol_in, const at::Tensor& row_in,
                     const at::Tensor& tval_in, int64_t strategy, at::Tensor& y, at::Tensor& a) {
  const auto in = checked_inputs(x_in, crow_in, col_in, val_in, ccol_in, row_in, tval_in, strategy);
  check_out(x_in, y, a, "kgreason::project_out");
  dispatch_index(in[1], [&](auto tag) {
    using idx_t = decltype(tag);
    run<idx_t>(in[0], in[1], in[2], in[3], in[4], in[5], in[6], strategy, y.data_ptr<float>(),
               a.numel() > 0 ? a.data_ptr<int32_t>() : nullptr);
  });
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
