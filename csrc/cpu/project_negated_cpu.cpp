// QTO-negated projection  Y[b,j] = max_i X[b,i] * (1 - min(1, s * M[i,j]))  on the CPU.
//
// The negated matrix is dense (factor 1 wherever M is 0), so it is never
// formed.  For column j the maximum is the larger of
//   in-support:  max over i in supp(j) of X[b,i] * f(i,j)   (a pull over the CSC column,
//                vectorised over a tile of 16 queries exactly as in project_cpu.cpp), and
//   out-support: max over i not in supp(j) of X[b,i]         (factor 1),
// the latter read off a per-query list of X's largest entries (value desc,
// index asc): the first list entry whose entity is not in supp(j), tested by
// binary search in the column's sorted rows.  The walk almost always stops at
// the first or second entry, so this costs O(log deg(j)) per (query, column)
// and nothing per support entry.  (Marking the support in a stamp array
// instead cost a store per entry and tile: 9.2 ms vs 2.1 ms for a plain pull at
// B = 16 on a 1.4M-nnz matrix.)  Only when all K listed
// entries are in supp(j) (and the row has more positive entries than K) does
// the kernel fall back to scanning the whole row of X, O(N) for that (b, j).
//
// Ties: in-support candidates are visited in ascending i with strict '>', the
// top list orders equal values by ascending index, and the two are merged by
// taking the smaller index on equality, so argmax is the smallest maximising
// i (the same rule as project); -1 where Y is 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
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

template <typename idx_t, int T, bool ARG>
void negated(const float* X, int64_t B, int64_t N, const idx_t* ccol, const idx_t* row, const float* tval, float s,
             float* Y, int32_t* A) {
  const TopLists tl = top_lists(X, B, N, std::min<int64_t>(kTopK, N));
  const int64_t K = tl.K;
  const int64_t tasks = std::max<int64_t>(1, at::get_num_threads()) * 4;
  const std::vector<int64_t> bounds = detail::balanced_column_split(ccol, N, tasks);
  const int64_t ntiles = (B + T - 1) / T;
  detail::AlignedFloats xt_all(static_cast<size_t>(ntiles * N * T));
  detail::transpose_tiles<T>(X, B, N, xt_all.data());

  // ~1 ns per support entry per tile plus ~2 ns per (query, column) for the out-of-support walk
  const double work_ns = static_cast<double>(ntiles) * static_cast<double>(ccol[N] + N) + 2.0 * B * N;
  detail::parallel_if(work_ns, 0, tasks, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) float ybuf[kColBlock * T];
    alignas(64) int32_t abuf[kColBlock * T];
    for (int64_t task = t0; task < t1; ++task) {
      for (int64_t q = 0; q < ntiles; ++q) {
        const float* xt = xt_all.data() + q * N * T;
        const int64_t b0 = q * T, nb = std::min<int64_t>(T, B - b0);
        for (int64_t jb = bounds[task]; jb < bounds[task + 1]; jb += kColBlock) {
          const int64_t je = std::min(bounds[task + 1], jb + kColBlock);
          for (int64_t j = jb; j < je; ++j) {
            alignas(64) float acc[T];
            alignas(64) int32_t arg[T];
            const int64_t k0 = static_cast<int64_t>(ccol[j]), k1 = static_cast<int64_t>(ccol[j + 1]);
            detail::column_max<T, ARG>(
                xt, row, tval, k0, k1, [s](float v) { return 1.f - std::min(1.f, s * v); }, [](int64_t) {}, acc,
                arg);
            auto in_support = [&](int64_t i) {
              const idx_t* lo = row + k0;
              const idx_t* hi = row + k1;
              const idx_t* it = std::lower_bound(lo, hi, static_cast<idx_t>(i));
              return it != hi && static_cast<int64_t>(*it) == i;
            };
            for (int64_t t = 0; t < nb; ++t) {
              const int64_t b = b0 + t;
              const float* tv = tl.val.data() + b * K;
              const int32_t* ti = tl.idx.data() + b * K;
              const int64_t cnt = tl.count[b];
              int64_t p = 0;
              while (p < cnt && in_support(ti[p])) ++p;
              float ov = 0.f;
              int32_t oi = -1;
              if (p < cnt) {
                ov = tv[p];
                oi = ti[p];
              } else if (!tl.complete[b]) {
                const float* x = X + b * N;  // every listed entry is in supp(j): scan the row
                for (int64_t i = 0; i < N; ++i) {
                  if (x[i] > ov && !in_support(i)) {
                    ov = x[i];
                    oi = static_cast<int32_t>(i);
                  }
                }
              }
              float yv = acc[t];
              if constexpr (ARG) {
                int32_t ya = arg[t];
                if (ov > yv) {
                  yv = ov;
                  ya = oi;
                } else if (ov == yv && oi >= 0 && (ya < 0 || oi < ya)) {
                  ya = oi;  // equal values: the smaller index wins
                }
                abuf[(j - jb) * T + t] = yv > 0.f ? ya : -1;
              } else {
                yv = ov > yv ? ov : yv;
              }
              ybuf[(j - jb) * T + t] = yv;
            }
          }
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

}  // namespace

std::tuple<at::Tensor, at::Tensor> project_negated_cpu(const at::Tensor& x_in, const at::Tensor& ccol_in,
                                                       const at::Tensor& row_in, const at::Tensor& tval_in,
                                                       double neg_scale, bool want_argmax) {
  detail::check_fuzzy_batch(x_in);
  const int64_t B = x_in.size(0), N = x_in.size(1);
  detail::check_compressed(ccol_in, row_in, tval_in, N, "CSC");
  TORCH_CHECK(neg_scale >= 0.0, "kgreason::project_negated: neg_scale must be >= 0, got ", neg_scale);
  TORCH_CHECK(N <= INT32_MAX, "kgreason::project_negated: N must fit int32 for argmax");
  const at::Tensor x = x_in.contiguous(), ccol = ccol_in.contiguous(), row = row_in.contiguous(),
                   tval = tval_in.contiguous();
  at::Tensor y = at::empty({B, N}, x.options());
  at::Tensor a = want_argmax ? at::empty({B, N}, x.options().dtype(at::kInt))
                             : at::empty({0}, x.options().dtype(at::kInt));
  if (B * N == 0) return {y, a};
  const float s = static_cast<float>(neg_scale);
  detail::dispatch_tile(B, [&](auto tile) {
    constexpr int T = decltype(tile)::value;
    auto go = [&](auto idx_tag) {
      using idx_t = decltype(idx_tag);
      if (want_argmax)
        negated<idx_t, T, true>(x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(),
                                tval.data_ptr<float>(), s, y.data_ptr<float>(), a.data_ptr<int32_t>());
      else
        negated<idx_t, T, false>(x.data_ptr<float>(), B, N, ccol.data_ptr<idx_t>(), row.data_ptr<idx_t>(),
                                 tval.data_ptr<float>(), s, y.data_ptr<float>(), nullptr);
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
