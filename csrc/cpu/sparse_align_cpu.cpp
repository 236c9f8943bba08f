// The support intersection or union of k sparse batches and each input's values on it, on the CPU
// (kgreason::sparse_align; ops/sparse_rows.py folds the t-norm / t-conorm from its output).
//
// Per row b, the k inputs' rows are sorted lists of columns:
//   intersect: walk the shortest list and, for each of its columns, advance a cursor in every other list
//     to the first column >= it (a short linear step, then galloping: a list much longer than the
//     shortest is crossed in O(short * log(long / short)) instead of O(long)); the column is kept when
//     every cursor lands on it.  An intersection of a 20-entry one-hop set with a 3,000-entry one reads
//     ~20 * 12 entries of the long list, not 3,000.  (A branch-free leapfrog over all k lists at once
//     measured 20% faster only for k = 2 lists of equal length, as fast at a length ratio of 2, and
//     slower beyond and for k = 3: 256 rows of ~300 random columns of 14,505, 1 thread, both passes:
//     leapfrog / walk 1.23 / 1.57 ms for k = 2, 1.76 / 1.51 ms for k = 3, 6.0 / 0.72 ms for 20 vs 3,000.)
//   union: a k-way merge of the heads, the smallest head emitted each step with the value of every list
//     whose head it is (0 for the others).  k is small (the arguments of one query's union), so the
//     minimum is a linear pass over the k heads rather than a heap.
// Two passes over the rows, both parallel: count each row's output (crow by a prefix sum), then the same
// walk again writing into the exact outputs: no buffers sized by an upper bound (for an intersection the
// shortest list, often far above the result) to be faulted in and copied; the second pass finds the
// inputs in cache for small batches.  The k = 2, 3, 4 walks are compiled for their k (Cursors).  k = 1 is
// a copy.
//
// Trusted, as the wrapper validates them (validate=True): columns strictly ascending inside each row
// (and below INT64_MAX, the union's end marker).
// Unsorted input gives a meaningless result but never reads or writes out of bounds (every cursor stays
// in its row and both passes make the same walk).  Checked: dtypes, shapes, devices and pointers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzzy_common.h"
#include "sparse_rows_cpu.h"

namespace kgreason {
namespace cpu {
namespace {

// ~3 ns per entry and list of a merge step (compare, advance, maybe emit), per pass.
constexpr double kMergeNs = 3.0;
constexpr double kRowNs = 20.0;

struct Lists {
  int64_t k;
  std::vector<const int64_t*> crow, col;
  std::vector<const float*> val;
};

// The first position p' >= p in col[p, hi) with col[p'] >= c (hi if none): up to 8 linear steps (lists of
// similar lengths advance by one or two), then galloping and a binary search.
inline int64_t seek(const int64_t* col, int64_t p, int64_t hi, int64_t c) {
  for (int q = 0; q < 8; ++q, ++p)
    if (p >= hi || col[p] >= c) return p;
  if (p >= hi || col[p] >= c) return p;
  int64_t step = 1;  // invariant: col[p] < c
  while (p + step < hi && col[p + step] < c) {
    p += step;
    step <<= 1;
  }
  return std::lower_bound(col + p + 1, col + std::min(hi, p + step), c) - col;
}

// The head of an exhausted list in the union's merge (above every column id).
constexpr int64_t kNone = INT64_MAX;

// Per-list state of one row's walk: the list's arrays, cursor, row end, head column and value.  A fixed K
// (2, 3, 4: the arity of a query's intersections and unions) lets the compiler unroll the loops over the
// lists and keep this state in registers; the union's merge is a dependency chain through it (head ->
// minimum -> advance -> next head), and kept in memory, as for a runtime k, each link waits for a store
// and a reload: 120 rows of overlapping random supports, k = 3, 156k entries out, 1 thread, both passes:
// 3.6-4.6 ms with a runtime k, 1.9-2.1 ms with K = 3 (a loaded machine).  K = 0: any k, in vectors.
template <int K>
struct Cursors {
  explicit Cursors(int64_t) {}
  static constexpr int64_t k() { return K; }
  const int64_t* col[K];
  const float* val[K];
  int64_t pos[K], end[K], head[K];
  float hval[K];
};

template <>
struct Cursors<0> {
  explicit Cursors(int64_t n) : n_(n), col(n), val(n), pos(n), end(n), head(n), hval(n) {}
  int64_t k() const { return n_; }
  int64_t n_;
  std::vector<const int64_t*> col;
  std::vector<const float*> val;
  std::vector<int64_t> pos, end, head;
  std::vector<float> hval;
};

// Row b's output size (WRITE false) or its entries written at oc[0..) and ov[m * stride + 0..) (WRITE true).
template <bool WRITE, typename C>
int64_t align_row(const Lists& in, int64_t b, bool intersect, C& cur, int64_t* oc, float* ov, int64_t stride) {
  const int64_t k = cur.k();
  for (int64_t m = 0; m < k; ++m) {
    cur.col[m] = in.col[m];
    cur.val[m] = in.val[m];
    cur.pos[m] = in.crow[m][b];
    cur.end[m] = in.crow[m][b + 1];
  }
  if (k == 1) {
    const int64_t lo = cur.pos[0], len = cur.end[0] - lo;
    if (WRITE && len > 0) {
      std::memcpy(oc, cur.col[0] + lo, static_cast<size_t>(len) * sizeof(int64_t));
      std::memcpy(ov, cur.val[0] + lo, static_cast<size_t>(len) * sizeof(float));
    }
    return len;
  }
  int64_t count = 0;
  if (intersect) {
    int64_t s = 0;
    for (int64_t m = 1; m < k; ++m)
      if (cur.end[m] - cur.pos[m] < cur.end[s] - cur.pos[s]) s = m;
    const int64_t* cs = cur.col[s];
    for (int64_t e = cur.pos[s], e1 = cur.end[s]; e < e1; ++e) {
      const int64_t c = cs[e];
      bool all = true;
      for (int64_t m = 0; m < k && all; ++m) {
        if (m == s) continue;
        cur.pos[m] = seek(cur.col[m], cur.pos[m], cur.end[m], c);
        if (cur.pos[m] == cur.end[m]) return count;  // list m is exhausted: nothing further can be common
        all = cur.col[m][cur.pos[m]] == c;
      }
      if (!all) continue;
      if (WRITE) {
        oc[count] = c;
        for (int64_t m = 0; m < k; ++m) ov[m * stride + count] = m == s ? cur.val[s][e] : cur.val[m][cur.pos[m]];
      }
      ++count;
    }
    return count;
  }
  // union: the heads' columns (kNone once a list is exhausted) and values, so that the minimum is a
  // branch-free pass over k values and a list's value a select.  (Advancing without a branch, the next
  // head loaded from min(cursor, last index) and kept where the list advanced, measured no faster: 3.4 vs
  // 3.0 ms for k = 3 rows of ~300 random columns of 14,505, 256 rows; the loop is bound by its chain of
  // dependent loads, not by mispredictions.)
  for (int64_t m = 0; m < k; ++m) {
    const bool live = cur.pos[m] < cur.end[m];
    cur.head[m] = live ? cur.col[m][cur.pos[m]] : kNone;
    cur.hval[m] = live ? cur.val[m][cur.pos[m]] : 0.f;
  }
  while (true) {
    int64_t c = cur.head[0];
    for (int64_t m = 1; m < k; ++m) c = std::min(c, cur.head[m]);
    if (c == kNone) return count;
    if (WRITE) oc[count] = c;
    for (int64_t m = 0; m < k; ++m) {
      const bool here = cur.head[m] == c;
      if (WRITE) ov[m * stride + count] = here ? cur.hval[m] : 0.f;
      if (here) {
        const int64_t q = ++cur.pos[m];
        if (q < cur.end[m]) {
          cur.head[m] = cur.col[m][q];
          cur.hval[m] = cur.val[m][q];
        } else {
          cur.head[m] = kNone;
        }
      }
    }
    ++count;
  }
}

// Both passes over the rows with K lists (0: any k): count (crow by a prefix sum), allocate, fill.
template <int K>
void align_rows(const Lists& in, int64_t B, bool intersect, double work, int64_t* oc, at::Tensor& out_col,
                at::Tensor& out_vals) {
  detail::parallel_if(work, 0, B, 64, [&](int64_t b0, int64_t b1) {
    Cursors<K> cur(in.k);
    for (int64_t b = b0; b < b1; ++b) oc[b + 1] = align_row<false>(in, b, intersect, cur, nullptr, nullptr, 0);
  });
  oc[0] = 0;
  for (int64_t b = 0; b < B; ++b) oc[b + 1] += oc[b];
  const int64_t nnz = oc[B];
  out_col = at::empty({nnz}, at::TensorOptions().dtype(at::kLong));
  out_vals = at::empty({in.k, nnz}, at::TensorOptions().dtype(at::kFloat));
  if (nnz == 0) return;
  int64_t* ocol = out_col.data_ptr<int64_t>();
  float* ov = out_vals.data_ptr<float>();
  detail::parallel_if(work, 0, B, 64, [&](int64_t b0, int64_t b1) {
    Cursors<K> cur(in.k);
    for (int64_t b = b0; b < b1; ++b) align_row<true>(in, b, intersect, cur, ocol + oc[b], ov + oc[b], nnz);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_align_cpu(at::TensorList crows, at::TensorList cols,
                                                                 at::TensorList vals, bool intersect) {
  constexpr const char* op = "kgreason::sparse_align";
  const int64_t k = static_cast<int64_t>(crows.size());
  TORCH_CHECK(k >= 1, op, ": needs at least one sparse batch");
  TORCH_CHECK(static_cast<int64_t>(cols.size()) == k && static_cast<int64_t>(vals.size()) == k, op,
              ": crows, cols and vals must have one tensor per input, got ", k, ", ", cols.size(), " and ",
              vals.size());
  std::vector<at::Tensor> keep;  // the contiguous inputs, alive while their pointers are used
  keep.reserve(3 * k);
  Lists in;
  in.k = k;
  int64_t B = -1;
  for (int64_t m = 0; m < k; ++m) {
    const at::Tensor &cr = crows[m], &co = cols[m], &va = vals[m];
    for (const at::Tensor* t : {&cr, &co, &va})
      TORCH_CHECK(t->device().is_cpu(), op, ": input ", m, " has a tensor on ", t->device(), "; expected CPU");
    TORCH_CHECK(cr.scalar_type() == at::kLong && co.scalar_type() == at::kLong, op, ": input ", m,
                ": crow and col must be int64, got ", cr.scalar_type(), " and ", co.scalar_type());
    TORCH_CHECK(va.scalar_type() == at::kFloat, op, ": input ", m, ": values must be float32, got ",
                va.scalar_type());
    TORCH_CHECK(cr.dim() == 1 && co.dim() == 1 && va.dim() == 1 && cr.numel() >= 1, op, ": input ", m,
                ": crow, col and val must be 1-D (crow with B+1 >= 1 entries)");
    TORCH_CHECK(co.numel() == va.numel(), op, ": input ", m, " has ", co.numel(), " columns but ", va.numel(),
                " values");
    if (m == 0) B = cr.numel() - 1;
    TORCH_CHECK(cr.numel() - 1 == B, op, ": input ", m, " has ", cr.numel() - 1, " rows, input 0 has ", B);
    keep.push_back(cr.contiguous());
    keep.push_back(co.contiguous());
    keep.push_back(va.contiguous());
    const int64_t* p = keep[3 * m].data_ptr<int64_t>();
    TORCH_CHECK(p[0] == 0 && p[B] == co.numel(), op, ": input ", m, ": crow must start at 0 and end at nnz = ",
                co.numel(), ", got ", p[0], "..", p[B]);
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(p[b] <= p[b + 1], op, ": input ", m, ": crow must be non-decreasing (crow[", b, "] = ", p[b],
                  " > crow[", b + 1, "] = ", p[b + 1], ")");
    in.crow.push_back(p);
    in.col.push_back(keep[3 * m + 1].data_ptr<int64_t>());
    in.val.push_back(keep[3 * m + 2].data_ptr<float>());
  }
  // Work of one pass: a union reads every entry of every list; an intersection walks each row's
  // shortest list, seeking once in each other list per entry (cheap for lopsided rows: a 20-entry
  // one-hop set against a 3,000-entry one costs ~20 seeks, not 3,000 steps).
  double work = kRowNs * static_cast<double>(B);
  for (int64_t b = 0; b < B; ++b) {
    int64_t shortest = INT64_MAX, all = 0;
    for (int64_t m = 0; m < k; ++m) {
      const int64_t len = in.crow[m][b + 1] - in.crow[m][b];
      shortest = std::min(shortest, len);
      all += len;
    }
    work += kMergeNs * static_cast<double>(k) * static_cast<double>(intersect && k > 1 ? shortest : all);
  }

  at::Tensor out_crow = at::empty({B + 1}, at::TensorOptions().dtype(at::kLong)), out_col, out_vals;
  int64_t* oc = out_crow.data_ptr<int64_t>();
  switch (k) {
    case 2: align_rows<2>(in, B, intersect, work, oc, out_col, out_vals); break;
    case 3: align_rows<3>(in, B, intersect, work, oc, out_col, out_vals); break;
    case 4: align_rows<4>(in, B, intersect, work, oc, out_col, out_vals); break;
    default: align_rows<0>(in, B, intersect, work, oc, out_col, out_vals); break;  // k = 1 (a copy) or k > 4
  }
  return {out_crow, out_col, out_vals};
}

}  // namespace cpu
}  // namespace kgreason
