// QTO-negated projection  Y[b,j] = max_i X[b,i] * (1 - min(1, s * M[i,j]))  on the CPU.
//
// The negated matrix is dense (factor 1 wherever M is 0), so it is never
// formed.  For column j the maximum is the larger of
//   out-of-support: max over i not in supp(j) of X[b,i]          (factor 1), and
//   in-support:     max over i in supp(j) of X[b,i] * f(i,j),
// computed in two phases:
// 1. out (parallel over queries, push-like): with X[b,:]'s K = 32 largest
//    positive entries (value desc, index asc) i0, i1, ..., every column gets
//    X[b,i0] except the columns of CSR row i0 (those have i0 in their
//    support); of those, every column not in row i1 gets X[b,i1], and so on.
//    Cost per query: N writes plus the lengths of the few rows walked, all
//    sequential or L1/L2-resident, instead of a per-(query, column) search.
//    Columns whose support holds all K listed entities (and the row has more
//    positive entries) fall back to scanning X[b,:] against that column.
// 2. in (parallel over column ranges, pull): the in-support products, vectorised
//    over tiles of queries exactly as in project_cpu.cpp, merged into Y.
// Measured (1 thread, N = 14,505, 1.4M-nnz power-law matrix): see docs/readme/ops.md.
//
// Ties: phase 1 visits equal values in ascending index, phase 2 visits support
// rows ascending with strict '>', and the merge keeps the smaller index on
// equal values, so argmax is the smallest maximising i (the same rule as
// project); -1 where Y is 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "fuzzy_common.h"
#include "fuzzy_cpu.h"

namespace kgreason {
namespace cpu {
namespace {

constexpr int64_t kTopK = 32;
constexpr int64_t kColBlock = 64;

struct TopLists {
  int64_t K = 0;
  std::vector<float> val;     // B x K, descending
  std::vector<int32_t> idx;   // B x K, ascending among equal values
  std::vector<int32_t> count; // listed entries per query (all positive)
  std::vector<uint8_t> complete;  // 1 when every positive entry of the row is listed
};

// Per query, the K largest positive entries by (value desc, index asc), in one
// pass: entries arrive in ascending index, so an entry equal to the current
// K-th is never better and is only inserted on a strictly larger value.
TopLists top_lists(const float* X, int64_t B, int64_t N, int64_t K) {
  TopLists tl;
  tl.K = K;
  tl.val.assign(B * K, 0.f);
  tl.idx.assign(B * K, -1);
  tl.count.assign(B, 0);
  tl.complete.assign(B, 1);
  detail::parallel_if(0.5 * static_cast<double>(B * N), 0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* x = X + b * N;
      float* tv = tl.val.data() + b * K;
      int32_t* ti = tl.idx.data() + b * K;
      int64_t cnt = 0;
      bool complete = true;
      for (int64_t i = 0; i < N; ++i) {
        const float v = x[i];
        if (!(v > 0.f)) continue;
        if (cnt == K) {
          complete = false;
          if (!(v > tv[K - 1])) continue;
          --cnt;  // drop the last entry
        }
        int64_t p = cnt;
        while (p > 0 && v > tv[p - 1]) {
          tv[p] = tv[p - 1];
          ti[p] = ti[p - 1];
          --p;
        }
        tv[p] = v;
        ti[p] = static_cast<int32_t>(i);
        ++cnt;
      }
      tl.count[b] = static_cast<int32_t>(cnt);
      tl.complete[b] = complete ? 1 : 0;
    }
  });
  return tl;
}

template <typename idx_t, bool ARG>
void out_of_support(const float* X, int64_t B, int64_t N, const idx_t* crow, const idx_t* col, const idx_t* ccol,
                    const idx_t* row, const TopLists& tl, float* Y, int32_t* A) {
  const int64_t K = tl.K;
  // ~1 ns per entity written, plus the walked rows
  detail::parallel_if(1.0 * static_cast<double>(B * N), 0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> stamp(N, -1);  // stamp[j] == tag: column j is in the row being walked
    std::vector<int64_t> rstamp;        // for the rare full-row fallback: rows of one column
    std::vector<int32_t> pending, next;
    int64_t tag = 0;
    for (int64_t b = b0; b < b1; ++b) {
      float* y = Y + b * N;
      int32_t* a = ARG ? A + b * N : nullptr;
      const float* tv = tl.val.data() + b * K;
      const int32_t* ti = tl.idx.data() + b * K;
      const int64_t cnt = tl.count[b];
      if (cnt == 0) {  // X[b,:] is all zero
        std::fill(y, y + N, 0.f);
        if constexpr (ARG) std::fill(a, a + N, -1);
        continue;
      }
      std::fill(y, y + N, tv[0]);
      if constexpr (ARG) std::fill(a, a + N, ti[0]);
      pending.clear();
      for (int64_t k = crow[ti[0]], e = crow[ti[0] + 1]; k < e; ++k) pending.push_back(static_cast<int32_t>(col[k]));
      for (int64_t p = 1; p < cnt && !pending.empty(); ++p) {
        ++tag;
        for (int64_t k = crow[ti[p]], e = crow[ti[p] + 1]; k < e; ++k) stamp[static_cast<int64_t>(col[k])] = tag;
        next.clear();
        for (const int32_t j : pending) {
          if (stamp[j] == tag) {
            next.push_back(j);  // ti[p] is in supp(j) too
          } else {
            y[j] = tv[p];
            if constexpr (ARG) a[j] = ti[p];
          }
        }
        pending.swap(next);
      }
      for (const int32_t j : pending) {  // every listed entity is in supp(j)
        float ov = 0.f;
        int32_t oi = -1;
        if (!tl.complete[b]) {  // unlisted positive entries exist: scan the row
          if (rstamp.empty()) rstamp.assign(N, -1);
          ++tag;
          for (int64_t k = ccol[j], e = ccol[j + 1]; k < e; ++k) rstamp[static_cast<int64_t>(row[k])] = tag;
          const float* x = X + b * N;
          for (int64_t i = 0; i < N; ++i) {
            if (x[i] > ov && rstamp[i] != tag) {
              ov = x[i];
              oi = static_cast<int32_t>(i);
            }
          }
        }
        y[j] = ov;
        if constexpr (ARG) a[j] = oi;
      }
    }
  });
}

template <typename idx_t, int T, bool ARG>
void negated(const float* X, int64_t B, int64_t N, const idx_t* crow, const idx_t* col, const idx_t* ccol,
             const idx_t* row, const float* tval, float s, float* Y, int32_t* A) {
  const TopLists tl = top_lists(X, B, N, std::min<int64_t>(kTopK, N));
  out_of_support<idx_t, ARG>(X, B, N, crow, col, ccol, row, tl, Y, A);

  const int64_t tasks = std::max<int64_t>(1, at::get_num_threads()) * 4;
  const std::vector<int64_t> bounds = detail::balanced_column_split(ccol, N, tasks);
  const int64_t ntiles = (B + T - 1) / T;
  detail::AlignedFloats xt_all(T == 1 ? 0 : static_cast<size_t>(ntiles * N * T));
  const float* xt_base = X;
  if constexpr (T != 1) {
    detail::transpose_tiles<T>(X, B, N, xt_all.data());
    xt_base = xt_all.data();
  }
  // The negated factors, once per call in one vectorised pass (0.3 ms for 1.4M entries): computing
  // 1 - min(1, s v) inside the gather loop measured 5.5x slower for B = 1 (7.1 ms vs 1.3 ms).
  const int64_t nnz = static_cast<int64_t>(ccol[N]);
  std::unique_ptr<float[]> factor(new float[nnz > 0 ? nnz : 1]);
  detail::parallel_if(0.3 * static_cast<double>(nnz), 0, nnz, 1 << 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) factor[k] = 1.f - std::min(1.f, s * tval[k]);
  });
  const float* fval = factor.get();
  const double work_ns = static_cast<double>(ntiles) * static_cast<double>(nnz + N);
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
                xt, row, fval, static_cast<int64_t>(ccol[j]), static_cast<int64_t>(ccol[j + 1]),
                [](float f) { return f; }, [](int64_t) {}, ybuf + (j - jb) * T, abuf + (ARG ? (j - jb) * T : 0));
          // merge with the out-of-support maxima already in Y
          for (int64_t t = 0; t < nb; ++t) {
            float* y = Y + (b0 + t) * N;
            if constexpr (ARG) {
              int32_t* a = A + (b0 + t) * N;
              for (int64_t j = jb; j < je; ++j) {
                const float vin = ybuf[(j - jb) * T + t];
                const int32_t ain = abuf[(j - jb) * T + t];
                if (vin > y[j]) {
                  y[j] = vin;
                  a[j] = ain;
                } else if (vin == y[j] && vin > 0.f && ain < a[j]) {
                  a[j] = ain;  // equal values: the smaller index wins
                }
              }
            } else {
              for (int64_t j = jb; j < je; ++j) y[j] = std::max(y[j], ybuf[(j - jb) * T + t]);
            }
          }
        }
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> project_negated_cpu(const at::Tensor& x_in, const at::Tensor& crow_in,
                                                       const at::Tensor& col_in, const at::Tensor& ccol_in,
                                                       const at::Tensor& row_in, const at::Tensor& tval_in,
                                                       double neg_scale, bool want_argmax) {
  detail::check_fuzzy_batch(x_in);
  const int64_t B = x_in.size(0), N = x_in.size(1);
  detail::check_compressed(crow_in, col_in, tval_in, N, "CSR");
  detail::check_compressed(ccol_in, row_in, tval_in, N, "CSC");
  TORCH_CHECK(crow_in.scalar_type() == ccol_in.scalar_type(), "kgreason::project_negated: CSR and CSC index dtypes differ");
  TORCH_CHECK(neg_scale >= 0.0, "kgreason::project_negated: neg_scale must be >= 0, got ", neg_scale);
  TORCH_CHECK(N <= INT32_MAX, "kgreason::project_negated: N must fit int32 for argmax");
  const at::Tensor x = x_in.contiguous(), crow = crow_in.contiguous(), col = col_in.contiguous(),
                   ccol = ccol_in.contiguous(), row = row_in.contiguous(), tval = tval_in.contiguous();
  at::Tensor y = detail::empty_output({B, N}, x.options());
  at::Tensor a = want_argmax ? detail::empty_output({B, N}, x.options().dtype(at::kInt))
                             : at::empty({0}, x.options().dtype(at::kInt));
  if (B * N == 0) return {y, a};
  const float s = static_cast<float>(neg_scale);
  detail::dispatch_tile(B, [&](auto tile) {
    constexpr int T = decltype(tile)::value;
    auto go = [&](auto idx_tag) {
      using idx_t = decltype(idx_tag);
      if (want_argmax)
        negated<idx_t, T, true>(x.data_ptr<float>(), B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(),
                                ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
                                y.data_ptr<float>(), a.data_ptr<int32_t>());
      else
        negated<idx_t, T, false>(x.data_ptr<float>(), B, N, crow.data_ptr<idx_t>(), col.data_ptr<idx_t>(),
                                 ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(), tval.data_ptr<float>(), s,
                                 y.data_ptr<float>(), nullptr);
    };
    if (ccol.scalar_type() == at::kInt)
      go(int32_t{});
    else
      go(int64_t{});
  });
  return {y, a};
}

}  // namespace cpu
}  // namespace kgreason
