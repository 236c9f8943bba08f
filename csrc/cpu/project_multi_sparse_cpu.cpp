// Sparse-in, sparse-out multi-relation projection on the CPU (kgreason::project_multi_sparse):
//   Y[b,j] = max over the stored (i, x) of row b with x > 0 of  x * M_{r_b}[i,j]
// for batches X, Y in compressed-row form (ops/sparse_rows.py) through the stacked (R*N, N) CSR of
// project_multi.  Row b of Y holds every j reached (a product may be 0: it is stored), ascending.
// This is row-by-row Gustavson SpGEMM (Y = X * M_r with max for +).
//
// Why sparse rows: a calibrated row of M holds tens of entries out of N (FB15k-237: mean 32, median 15
// of 14,505), but the dense project_multi writes, and the next operator reads, all B*N floats (59 MB for
// B = 1,024).  Here a row costs what its pushed entries cost (the anchors of real queries are popular
// entities with long rows, so the executor falls back to the dense kernel when the push is large).
//
// Phase 1 (parallel over rows, O(nnz of X)): classify each row by its contributing entities (stored
// x > 0 with a non-empty row in M_r) and bound its output by the entries it pushes:
//   empty:   none; the row has no output.
//   single:  exactly one (the first hop from an anchor, and the commonest row): Y[b,:] = x_i * M_r[i,:]
//            is a scaled copy of one CSR row, already sorted: no scratch, no merge, no sort; its size is
//            known now and phase 3 writes it straight into the output.  It needs that CSR row's columns
//            strictly ascending, which phase 1 checks (a cheap vectorised pass over one row; prepare_stacked
//            does not require sorted rows): a row that is not goes the general way.
//   general: several: phase 2.
// Phase 2 (general rows, parallel in parts of equal estimated work, one per thread): scatter-max every
//   pushed product into a per-part dense scratch of N floats, with a bitmap of the touched columns as the
//   "seen" marker (N/8 bytes: 1.8 KB for N = 14,505, L1-resident, where a byte or float marker would be
//   8-32x larger), and a list of the touched columns.  The first product of a column is stored as is and
//   later ones max-ed in, so the value is the max over exactly the reference's products (float32 x * m,
//   max is exact and order-free): bit-identical.  The touched columns then leave in ascending order by
//   the cheaper of two ways (see use_sort), each resetting only what it touched, into the part's own
//   growable buffer (the sizes are unknown before the scatter, and scattering twice to count first would
//   double the dominant cost).
// Phase 3: prefix sum of the row sizes, exact outputs allocated once, rows copied in (parallel over rows).
//
// Memory latency, not arithmetic, is the cost: each active entity reads its two pointers of M_r (at random
// in R*N+1 of them, 55 MB on FB15k-237) and its row of M (elsewhere at random).  Phase 1 reads the
// pointers once and keeps each entry's span, so phases 2 and 3 need no pointer and prefetch the rows of
// M kAhead entries ahead.  Measured on a synthetic FB15k-237-sized stack (N = 14,505, 474 relations,
// 1.08M entries), 1 thread, kernel only: 1,024 one-hot rows 0.073 -> 0.043 ms with spans and prefetch;
// their 2-hop (14.4k entries in, 63.6k pushed, 60.7k out) 0.88 -> 0.67 ms (~10 ns per pushed entry).
// The dense project_multi of the same batches: 5-7 ms and 14-18 ms into a reused output.
//
// Trusted, as in project_multi: the stack's pointers non-decreasing and columns in [0, N)
// (ops.prepare_stacked validated them once; checking here would cost O(R*N) per call).  Checked: shapes,
// dtypes, devices, X's pointers and entity ids, rel's range.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzzy_common.h"
#include "project_cost.h"
#include "sparse_rows_cpu.h"

namespace kgreason {
namespace cpu {
namespace {

using namespace cost;

// Prefetch distance, in entries of X (phase 2) or rows (phase 3), for the rows of M about to be read.
constexpr int64_t kAhead = 8;
// At most this many entries reserved up front for a part's output (then it grows geometrically).
constexpr int64_t kReserveCap = int64_t(1) << 22;

enum : uint8_t { kRowEmpty = 0, kRowSingle = 1, kRowGeneral = 2, kRowBadId = 3 };

// A growable uninitialised array of a trivially copyable T (std::vector would zero-fill what is about to
// be overwritten).
template <typename T>
class Buffer {
 public:
  // Commits `extra` more elements and returns the first of them.
  T* grow(int64_t extra) {
    if (size_ + extra > cap_) {
      const int64_t cap = std::max<int64_t>({size_ + extra, 2 * cap_, 1024});
      std::unique_ptr<T[]> q(new T[cap]);
      if (size_ > 0) std::memcpy(q.get(), p_.get(), static_cast<size_t>(size_) * sizeof(T));
      p_ = std::move(q);
      cap_ = cap;
    }
    T* out = p_.get() + size_;
    size_ += extra;
    return out;
  }
  const T* data() const { return p_.get(); }
  // Room for n elements in all (uncommitted pages of a large block cost nothing until written).
  void reserve(int64_t n) {
    if (n > cap_) {
      std::unique_ptr<T[]> q(new T[n]);
      if (size_ > 0) std::memcpy(q.get(), p_.get(), static_cast<size_t>(size_) * sizeof(T));
      p_ = std::move(q);
      cap_ = n;
    }
  }

 private:
  std::unique_ptr<T[]> p_;
  int64_t size_ = 0, cap_ = 0;
};

// The output of one part of phase 2: its general rows one after another.
struct Part {
  Buffer<int64_t> col;
  Buffer<float> val;
};

template <typename idx_t>
inline bool strictly_ascending(const idx_t* c, int64_t len) {
  bool ok = true;
  for (int64_t k = 1; k < len; ++k) ok &= c[k - 1] < c[k];  // no early exit: vectorises
  return ok;
}

template <typename ptr_t, typename idx_t>
void run(const int64_t* xcrow, const int64_t* xcol, const float* xval, const int64_t* rel, int64_t B, int64_t N,
         const ptr_t* crow, const idx_t* col, const float* val, at::Tensor& out_crow, at::Tensor& out_col,
         at::Tensor& out_val) {
  std::vector<uint8_t> kind(B);
  std::vector<int64_t> size(B), push(B), src(B);  // src: single, X's entry; general, offset in its part
  std::vector<int32_t> part_of(B, 0);
  const int64_t x_nnz = xcrow[B];
  // Per entry e of X, the span [lo, hi) of its row of M_r (empty for entries that push nothing), found
  // once in phase 1.  M's pointers (R*N+1 of them, 55 MB for FB15k-237) are read at random: one cache miss
  // per active entity, paid once instead of once per phase, and the later phases read the spans in order
  // and can prefetch the rows of M they are about to scatter or copy (kAhead entries ahead).
  std::unique_ptr<int64_t[]> span_lo(new int64_t[std::max<int64_t>(x_nnz, 1)]);
  std::unique_ptr<int64_t[]> span_hi(new int64_t[std::max<int64_t>(x_nnz, 1)]);
  int64_t* lo_of = span_lo.get();
  int64_t* hi_of = span_hi.get();
  auto prefetch_row = [&](int64_t e) {
    __builtin_prefetch(col + lo_of[e], 0, 3);
    __builtin_prefetch(val + lo_of[e], 0, 3);
  };

  // ---- phase 1: classify
  detail::parallel_if(kEntryNs * static_cast<double>(x_nnz) + kRowNs * static_cast<double>(B), 0, B, 256,
                      [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const ptr_t* crow_r = crow + rel[b] * N;
      int64_t contributing = 0, entries = 0, first = -1;
      bool bad = false;
      for (int64_t e = xcrow[b]; e < xcrow[b + 1]; ++e) {
        const int64_t i = xcol[e];
        if (i < 0 || i >= N) {
          bad = true;
          break;
        }
        lo_of[e] = hi_of[e] = 0;
        if (!(xval[e] > 0.f)) continue;  // stored zeros (and NaN) push nothing
        const int64_t k0 = static_cast<int64_t>(crow_r[i]), k1 = static_cast<int64_t>(crow_r[i + 1]);
        if (k0 == k1) continue;
        lo_of[e] = k0;
        hi_of[e] = k1;
        if (++contributing == 1) first = e;
        entries += k1 - k0;
      }
      push[b] = entries;
      size[b] = 0;
      if (bad) {
        kind[b] = kRowBadId;
      } else if (contributing == 0) {
        kind[b] = kRowEmpty;
      } else if (contributing == 1 && strictly_ascending(col + lo_of[first], entries)) {
        kind[b] = kRowSingle;
        size[b] = entries;
        src[b] = first;
      } else {
        kind[b] = kRowGeneral;
      }
    }
  });
  std::vector<int64_t> general;
  for (int64_t b = 0; b < B; ++b) {
    if (kind[b] == kRowBadId) {
      int64_t e = xcrow[b];
      while (xcol[e] >= 0 && xcol[e] < N) ++e;
      TORCH_CHECK(false, "kgreason::project_multi_sparse: X's row ", b, " holds entity id ", xcol[e],
                  ", outside [0, ", N, ")");
    }
    if (kind[b] == kRowGeneral) general.push_back(b);
  }

  // ---- phase 2: general rows, in parts of about equal estimated work
  const int64_t words = (N + 63) / 64;
  const int64_t G = static_cast<int64_t>(general.size());
  std::vector<Part> parts;
  if (G > 0) {
    std::vector<double> cost(G);
    double total = 0.0;
    for (int64_t g = 0; g < G; ++g) {
      cost[g] = kRowNs + kPushStepNs * static_cast<double>(push[general[g]]) + kWordNs * static_cast<double>(words);
      total += cost[g];
    }
    const int64_t threads = at::get_num_threads();
    const int64_t P = (total < detail::kMinParallelNs || threads <= 1) ? 1 : std::min<int64_t>(threads, G);
    std::vector<int64_t> bounds(P + 1, G);
    bounds[0] = 0;
    double acc = 0.0;
    int64_t p = 1;
    for (int64_t g = 0; g < G && p < P; ++g) {
      const double mid = acc + 0.5 * cost[g];  // row g goes to the part its cost midpoint falls in
      acc += cost[g];
      const int64_t q = std::min<int64_t>(P - 1, static_cast<int64_t>(mid / total * static_cast<double>(P)));
      while (p <= q) bounds[p++] = g;
    }
    parts.resize(P);
    auto run_part = [&](int64_t part) {
      const int64_t g0 = bounds[part], g1 = bounds[part + 1];
      if (g0 == g1) return;
      int64_t most = 0, bound = 0;
      for (int64_t g = g0; g < g1; ++g) {
        most = std::max(most, push[general[g]]);
        bound += std::min(N, push[general[g]]);
      }
      const int64_t list_cap = std::min(N, most);
      // scratch: values (only read where the bitmap says written: left uninitialised), bitmap, touched list
      std::unique_ptr<float[]> y(new float[N]);
      std::vector<uint64_t> seen(words, 0);
      std::unique_ptr<uint32_t[]> touched(new uint32_t[std::max<int64_t>(list_cap, 1)]);
      uint64_t* bm = seen.data();
      Part& out = parts[part];
      // the outputs' upper bound, capped: no regrowth copies in the common case, and what is not written
      // of a large block is never faulted in
      out.col.reserve(std::min<int64_t>(bound, kReserveCap));
      out.val.reserve(std::min<int64_t>(bound, kReserveCap));
      int64_t offset = 0;
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t b = general[g], e0 = xcrow[b], e1 = xcrow[b + 1];
        if (g + 1 < g1) {  // the next row's first rows of M, while this one is scattered
          const int64_t n0 = xcrow[general[g + 1]], n1 = std::min(xcrow[general[g + 1] + 1], n0 + kAhead);
          for (int64_t e = n0; e < n1; ++e) prefetch_row(e);
        }
        int64_t t = 0;
        for (int64_t e = e0; e < e1; ++e) {
          if (e + kAhead < e1) prefetch_row(e + kAhead);
          const float xi = xval[e];
          const int64_t k1 = hi_of[e];
          for (int64_t k = lo_of[e]; k < k1; ++k) {
            const int64_t j = static_cast<int64_t>(col[k]);
            const float prod = xi * val[k];
            uint64_t& w = bm[j >> 6];
            const uint64_t bit = uint64_t{1} << (j & 63);
            if (w & bit) {
              if (prod > y[j]) y[j] = prod;
            } else {
              w |= bit;
              y[j] = prod;
              touched[t++] = static_cast<uint32_t>(j);
            }
          }
        }
        int64_t* oc = out.col.grow(t);
        float* ov = out.val.grow(t);
        if (use_sort(t, words)) {
          std::sort(touched.get(), touched.get() + t);
          for (int64_t q = 0; q < t; ++q) {
            const int64_t j = touched[q];
            oc[q] = j;
            ov[q] = y[j];
            bm[j >> 6] = 0;  // the whole word: its other bits are this row's too
          }
        } else {
          int64_t q = 0;
          for (int64_t wi = 0; wi < words; ++wi) {
            uint64_t w = bm[wi];
            if (w == 0) continue;
            bm[wi] = 0;
            do {
              const int64_t j = wi * 64 + __builtin_ctzll(w);
              w &= w - 1;
              oc[q] = j;
              ov[q] = y[j];
              ++q;
            } while (w != 0);
          }
        }
        size[b] = t;
        src[b] = offset;
        part_of[b] = static_cast<int32_t>(part);
        offset += t;
      }
    };
    if (P == 1) {
      run_part(0);
    } else {
      at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t q = p0; q < p1; ++q) run_part(q);
      });
    }
  }

  // ---- phase 3: exact outputs, rows copied in
  out_crow = at::empty({B + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* oc_ptr = out_crow.data_ptr<int64_t>();
  oc_ptr[0] = 0;
  for (int64_t b = 0; b < B; ++b) oc_ptr[b + 1] = oc_ptr[b] + size[b];
  const int64_t nnz = oc_ptr[B];
  out_col = at::empty({nnz}, at::TensorOptions().dtype(at::kLong));
  out_val = at::empty({nnz}, at::TensorOptions().dtype(at::kFloat));
  int64_t* ocol = out_col.data_ptr<int64_t>();
  float* oval = out_val.data_ptr<float>();
  detail::parallel_if(kCopyNs * static_cast<double>(nnz) + kRowNs * static_cast<double>(B), 0, B, 64,
                      [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t d = oc_ptr[b], len = size[b];
      if (b + kAhead < b1 && kind[b + kAhead] == kRowSingle) prefetch_row(src[b + kAhead]);
      if (kind[b] == kRowSingle) {
        const int64_t e = src[b];
        const float xi = xval[e];
        const int64_t k0 = lo_of[e];
        for (int64_t q = 0; q < len; ++q) {
          ocol[d + q] = static_cast<int64_t>(col[k0 + q]);
          oval[d + q] = xi * val[k0 + q];
        }
      } else if (kind[b] == kRowGeneral && len > 0) {
        const Part& pt = parts[part_of[b]];
        std::memcpy(ocol + d, pt.col.data() + src[b], static_cast<size_t>(len) * sizeof(int64_t));
        std::memcpy(oval + d, pt.val.data() + src[b], static_cast<size_t>(len) * sizeof(float));
      }
    }
  });
}

inline int64_t last_of(const at::Tensor& ptr) {
  return ptr.scalar_type() == at::kInt ? static_cast<int64_t>(ptr.data_ptr<int32_t>()[ptr.numel() - 1])
                                       : ptr.data_ptr<int64_t>()[ptr.numel() - 1];
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> project_multi_sparse_cpu(
    const at::Tensor& xcrow_in, const at::Tensor& xcol_in, const at::Tensor& xval_in, const at::Tensor& rel_in,
    const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& val_in, int64_t num_entities) {
  constexpr const char* op = "kgreason::project_multi_sparse";
  const int64_t N = num_entities;
  TORCH_CHECK(N >= 1 && N <= INT32_MAX, op, ": n (entities) must be in [1, 2^31), got ", N);
  for (const at::Tensor* t : {&xcrow_in, &xcol_in, &xval_in, &rel_in, &crow_in, &col_in, &val_in})
    TORCH_CHECK(t->device().is_cpu(), op, ": every tensor must be on the CPU, got one on ", t->device());
  TORCH_CHECK(xcrow_in.scalar_type() == at::kLong && xcol_in.scalar_type() == at::kLong, op,
              ": X's crow and col must be int64, got ", xcrow_in.scalar_type(), " and ", xcol_in.scalar_type());
  TORCH_CHECK(xval_in.scalar_type() == at::kFloat, op, ": X's values must be float32, got ", xval_in.scalar_type());
  TORCH_CHECK(xcrow_in.dim() == 1 && xcol_in.dim() == 1 && xval_in.dim() == 1 && xcrow_in.numel() >= 1, op,
              ": X's crow, col and val must be 1-D (crow with B+1 >= 1 entries)");
  TORCH_CHECK(xcol_in.numel() == xval_in.numel(), op, ": X has ", xcol_in.numel(), " entity ids but ",
              xval_in.numel(), " values");
  const int64_t B = xcrow_in.numel() - 1;
  TORCH_CHECK(rel_in.scalar_type() == at::kInt || rel_in.scalar_type() == at::kLong, op,
              ": rel must be int32 or int64, got ", rel_in.scalar_type());
  TORCH_CHECK(rel_in.dim() == 1 && rel_in.numel() == B, op, ": rel must have shape (B,) = (", B, ",), got ",
              rel_in.sizes());
  TORCH_CHECK(crow_in.scalar_type() == at::kInt || crow_in.scalar_type() == at::kLong, op,
              ": M's crow must be int32 or int64, got ", crow_in.scalar_type());
  TORCH_CHECK(col_in.scalar_type() == at::kInt || col_in.scalar_type() == at::kLong, op,
              ": M's col must be int32 or int64, got ", col_in.scalar_type());
  TORCH_CHECK(val_in.scalar_type() == at::kFloat, op, ": M's values must be float32, got ", val_in.scalar_type());
  TORCH_CHECK(crow_in.dim() == 1 && col_in.dim() == 1 && val_in.dim() == 1, op, ": M's crow, col, val must be 1-D");
  TORCH_CHECK(crow_in.numel() >= 1 && (crow_in.numel() - 1) % N == 0, op, ": M's crow must have R*N+1 entries for N = ",
              N, ", got ", crow_in.numel());
  TORCH_CHECK(col_in.numel() == val_in.numel(), op, ": M has ", col_in.numel(), " column indices but ",
              val_in.numel(), " values");
  const int64_t R = (crow_in.numel() - 1) / N;

  const at::Tensor xcrow = xcrow_in.contiguous(), xcol = xcol_in.contiguous(), xval = xval_in.contiguous(),
                   rel = rel_in.to(at::kLong).contiguous(), crow = crow_in.contiguous(), col = col_in.contiguous(),
                   val = val_in.contiguous();
  TORCH_CHECK(last_of(crow) == val.numel(), op, ": M's crow must end at nnz = ", val.numel(), ", got ",
              last_of(crow));
  const int64_t* xp = xcrow.data_ptr<int64_t>();
  TORCH_CHECK(xp[0] == 0 && xp[B] == xcol.numel(), op, ": X's crow must start at 0 and end at nnz = ",
              xcol.numel(), ", got ", xp[0], "..", xp[B]);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(xp[b] <= xp[b + 1], op, ": X's crow must be non-decreasing (crow[", b, "] = ", xp[b],
                " > crow[", b + 1, "] = ", xp[b + 1], ")");
  const int64_t* r = rel.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(r[b] >= 0 && r[b] < R, op, ": rel[", b, "] = ", r[b], " is out of range [0, ", R, ")");

  at::Tensor oc, ocol, oval;
  const int64_t* xc = xcol.data_ptr<int64_t>();
  const float* xv = xval.data_ptr<float>();
  const float* v = val.data_ptr<float>();
  const bool p32 = crow.scalar_type() == at::kInt, i32 = col.scalar_type() == at::kInt;
  if (p32 && i32)
    run<int32_t, int32_t>(xp, xc, xv, r, B, N, crow.data_ptr<int32_t>(), col.data_ptr<int32_t>(), v, oc, ocol, oval);
  else if (p32)
    run<int32_t, int64_t>(xp, xc, xv, r, B, N, crow.data_ptr<int32_t>(), col.data_ptr<int64_t>(), v, oc, ocol, oval);
  else if (i32)
    run<int64_t, int32_t>(xp, xc, xv, r, B, N, crow.data_ptr<int64_t>(), col.data_ptr<int32_t>(), v, oc, ocol, oval);
  else
    run<int64_t, int64_t>(xp, xc, xv, r, B, N, crow.data_ptr<int64_t>(), col.data_ptr<int64_t>(), v, oc, ocol, oval);
  return {oc, ocol, oval};
}

}  // namespace cpu
}  // namespace kgreason
