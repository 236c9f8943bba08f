// The max-times projection on the CPU (kgreason::project): every row b of the batch
// goes through its own relation r_b of the stacked (R*N, N) matrix,
//   Y[b,j] = max_i X[b,i] * M_{r_b}[i,j]                         (plain)
//   Y[b,j] = max_i X[b,i] * (1 - min(1, s * M_{r_b}[i,j]))       (negated; factor 1 where M has no entry)
// in one call.  A single relation is the degenerate case (a one-relation stack,
// every row relation 0): issue 23 folded the former single-relation kernels
// (project, project_negated) into this one after measuring that it loses
// nothing there (benchmarks/results/ops_single_relation.md).  The alternative
// for mixed relations, one call per distinct relation, pays per relation a
// Python call, a row gather, its own parallel region and a scatter back; a batch
// of 1,024 queries over FB15k-237 touches hundreds of relations, so the loop is
// mostly overhead (numbers: benchmarks/test_ops_project_multi.py).
//
// Strategy: decided per row, executed per relation group.
// phase A (parallel over rows): scan X[b,:] in 256-entity blocks (a block whose
//   bits OR to zero is skipped with a few vector ops) summing the push cost
//   (1.8 ns per entry of the active entities' rows of M_{r_b}, 0.5 ns per
//   active entity, 250 ns per non-zero block), and stop as soon as it exceeds
//   the row's share of the pull cost of its relation group (below); a probe of
//   64 entities first sends clearly dense rows on without the scan.  A row that
//   stays under it is pushed right away: Y[b,:] is zeroed and the rows of
//   M_{r_b} of its active entities are scattered into it; Y[b,:] (58 KB for
//   N = 14,505) stays in L2 while being scattered into, and the second scan
//   reads X[b,:] from L2.  Push wins for sparse rows: a one-hot anchor costs one
//   row of M_{r_b} (~100 entries) instead of all of M_{r_b}, at ~1.8 ns per entry
//   (a scalar, data-dependent scatter).  Deciding from the row's own scan
//   instead of a sample makes a mixed batch (one-hot and dense rows, or
//   relations of very different sizes) cost what each of its rows costs.
// sweep, the third way, for dense rows through small relations: push walks
//   every non-zero block entity by entity and pull walks all N columns, so
//   both cost O(N) per row (~15-50 us for N = 14,505) even when the relation
//   holds a hundred entries.  Sweep walks M_r's own entries in CSR order, finds
//   each non-empty row i by a binary search in crow_r, and scatters
//   x_i * M_r[i,j]: O(nnz_r log N).  Chosen in phase A when cheaper than both.
// phase B (pull) for the remaining rows, grouped by relation: a group's rows are
//   processed in tiles of T = 16 or 32 queries held transposed (N x T floats:
//   one support entry costs one contiguous T-float load and T/16 AVX-512
//   multiply+max, and the tile stays in L2 while the columns' supports stream),
//   or one row at a time by a scalar gather (T = 1), whichever is cheaper for
//   the group's size: a tile must amortise its transposition (0.5 ns per
//   element) over the relation's entries.  Cost ~ (rows / T) * (nnz_r + N)
//   whatever X's density, so pull wins for dense rows.
// Negated: phase A also computes, for every row, the out-of-support maxima
//   (largest X[b,i] with i outside column j's support, from X[b,:]'s 32 largest
//   entries: out_of_support_row); the in-support products are
//   then pushed (phase A) or pulled (phase B) and merged into Y.
//
// Ties: push and sweep visit source entities in ascending i and replace only on a
// strictly larger product; pull visits each column's support in ascending row
// order (the transpose is sorted) with strict '>'; the negated merges keep the
// smaller index on equal values.  So argmax is the smallest maximising i, as in
// the pure-torch reference (ops/reference.py); -1 where Y is 0.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include <ATen/MemoryOverlap.h>

#include "../project_common.h"
#include "fuzzy_common.h"
#include "fuzzy_cpu.h"
#include "project_cpu.h"
#include "project_cost.h"

namespace kgreason {
namespace cpu {
namespace {

using detail::any_nonzero;
using namespace cost;

constexpr int64_t kScanBlock = 256;
constexpr int64_t kTopK = 32;

// The density probe: kProbe evenly spaced entities of X[b,:].  A row with at
// least a quarter of them active is estimated as (hits / kProbe) of N active
// entities holding that share of M_r's entries, and pulled without the exact
// scan when the estimate exceeds twice its budget (the margin covers rows whose
// active entities are not typical).
constexpr int64_t kProbe = 64;
// Active entities plan_row remembers for push_row (4 KB of stack per thread).
constexpr int64_t kActCap = 1024;
// How phase A handles a row; project_strategy reports sweep as code 3 (push 1, pull 2).
constexpr uint8_t kPlanPush = 0, kPlanPull = 1, kPlanSweep = 2;
constexpr int64_t kSweepCode = 3;

// At most this many floats of transposed tiles exist at once (128 MiB); a
// larger pull runs in waves.  B = 1,024 dense rows of one relation need 59 MB.
// KGREASON_PROJECT_WAVE_FLOATS overrides it: the tests set it small to
// run the multi-wave path on inputs small enough to check against the reference.
constexpr int64_t kWaveFloats = int64_t(32) << 20;

// KGREASON_PROJECT_SPLIT_TILES=1 splits every pulled tile of T > 1 into two column ranges even on one
// thread, so that the tests reach the shared-copy (wave buffer) path on small inputs.
bool force_split() {
  const char* env = std::getenv("KGREASON_PROJECT_SPLIT_TILES");
  return env != nullptr && env[0] == '1';
}

int64_t wave_floats() {
  const char* env = std::getenv("KGREASON_PROJECT_WAVE_FLOATS");
  if (env == nullptr || *env == '\0') return kWaveFloats;
  const long long v = std::atoll(env);
  return v > 0 ? static_cast<int64_t>(v) : kWaveFloats;
}

// Rows sorted by (relation, row): group g is order[start[g] .. start[g+1]) with relation rel[g].
struct Groups {
  std::vector<int64_t> order, start, rel;
};

Groups group_rows(const int64_t* rel, int64_t B) {
  Groups g;
  g.order.resize(B);
  std::iota(g.order.begin(), g.order.end(), int64_t{0});
  std::stable_sort(g.order.begin(), g.order.end(), [&](int64_t a, int64_t b) { return rel[a] < rel[b]; });
  for (int64_t k = 0; k < B; ++k) {
    if (k == 0 || rel[g.order[k]] != rel[g.order[k - 1]]) {
      g.start.push_back(k);
      g.rel.push_back(rel[g.order[k]]);
    }
  }
  g.start.push_back(B);
  return g;
}

// Per row, the most push cost (ns, beyond the block scan) at which pushing the
// row is still cheaper than its share of pulling its whole relation group with
// the best tiling; +inf for strategy push, -1 (never) for pull.  Never below 0,
// so an all-zero row (cost 0) is always "pushed" (it only costs the zero fill).
template <typename ptr_t, typename idx_t>
std::vector<double> budgets(const Groups& g, const Stack<ptr_t, idx_t>& s, int64_t B, int64_t strategy, bool arg) {
  std::vector<double> budget(B, strategy == kPush ? std::numeric_limits<double>::infinity() : -1.0);
  if (strategy != kAuto) return budget;
  const int64_t N = s.N;
  for (size_t k = 0; k + 1 < g.start.size(); ++k) {
    const int64_t c = g.start[k + 1] - g.start[k];
    const double per_row = best_tiling(c, s.nnz_of(g.rel[k]), N, arg).second / static_cast<double>(c);
    const double bg = std::max(0.0, per_row - kScanNs * static_cast<double>(N));
    for (int64_t q = g.start[k]; q < g.start[k + 1]; ++q) budget[g.order[q]] = bg;
  }
  return budget;
}

// True when the probe alone shows that pushing row x (scan) would cost more than limit.
inline bool probe_over_limit(const float* x, int64_t N, int64_t nnz_r, double limit) {
  if (N < 4 * kProbe) return false;  // small rows: the exact scan is as cheap
  int64_t hits = 0;
  for (int64_t k = 0; k < kProbe; ++k) hits += x[k * N / kProbe] > 0.f ? 1 : 0;
  if (4 * hits < kProbe) return false;
  const double share = static_cast<double>(hits) / kProbe;  // >= 1/4: (nearly) every block is non-zero
  const double blocks = static_cast<double>((N + kScanBlock - 1) / kScanBlock);
  return push_cost(share * static_cast<double>(nnz_r), share * static_cast<double>(N), blocks) > 2.0 * limit;
}

// The plan of one row once its push cost is known to be within `limit` (scan_ok) or not:
// push if it is; else sweep when that fits the budget; else pull.
inline uint8_t plan_from(bool scan_ok, double sweep, double budget) {
  return scan_ok ? kPlanPush : sweep <= budget ? kPlanSweep : kPlanPull;
}

// The plan of row x through M_r (crow_r = crow + r*N): push must beat both the
// budget (the pull share) and the sweep; the probe, then the exact scan, which
// stops once the push cost exceeds that limit.  Forced strategies: budget -1
// (pull) or +inf (push).
// The scan also records the active entities, ascending, in act (capacity
// kActCap): *nact is their count when the row is pushed and they all fit, else
// -1.  push_row then walks the list instead of scanning X[b,:] a second time
// (a one-hot row: one row of M after 57 block tests, ~1.5 us each pass for
// N = 14,505; the second scan made one-hot batches 1.13-1.4x slower than the
// former single-relation kernel, which sampled 32 rows to decide).
template <typename ptr_t>
uint8_t plan_row(const float* x, int64_t N, const ptr_t* crow_r, double budget, int32_t* act, int64_t* nact) {
  *nact = -1;
  if (budget < 0.0) return kPlanPull;
  if (budget == std::numeric_limits<double>::infinity()) return kPlanPush;
  const int64_t nnz_r = static_cast<int64_t>(crow_r[N]) - static_cast<int64_t>(crow_r[0]);
  const double sweep = kSweepEntryNs * static_cast<double>(nnz_r);
  const double limit = std::min(budget, sweep);
  if (probe_over_limit(x, N, nnz_r, limit)) return plan_from(false, sweep, budget);
  double entries = 0.0, active = 0.0, blocks = 0.0;
  int64_t cnt = 0;
  for (int64_t i0 = 0; i0 < N; i0 += kScanBlock) {
    const int64_t i1 = std::min(N, i0 + kScanBlock);
    if (!any_nonzero(x + i0, i1 - i0)) continue;
    blocks += 1.0;
    if (push_cost(entries, active, blocks) > limit) return plan_from(false, sweep, budget);
    for (int64_t i = i0; i < i1; ++i) {
      if (!(x[i] > 0.f)) continue;
      entries += static_cast<double>(crow_r[i + 1] - crow_r[i]);
      active += 1.0;
      if (push_cost(entries, active, blocks) > limit) return plan_from(false, sweep, budget);
      if (cnt < kActCap) act[cnt] = static_cast<int32_t>(i);
      ++cnt;
    }
  }
  *nact = cnt <= kActCap ? cnt : -1;
  return kPlanPush;
}

// Y[b,:] = max over active i of x_i * factor(M_r[i,:]).  NEG: factor 1 - min(1, s v), merged into the
// out-of-support maxima already in y (equal values: the smaller index wins); else y is zeroed first.
// act/nact: the row's active entities, ascending, when plan_row listed them all (nact >= 0), else scanned.
template <typename ptr_t, typename idx_t, bool ARG, bool NEG>
void push_row(const float* x, int64_t N, const ptr_t* crow_r, const idx_t* col, const float* val, float s, float* y,
              int32_t* a, const int32_t* act, int64_t nact) {
  if constexpr (!NEG) {
    // zeroed here, by the thread that scatters into the row (first touch, no separate pass)
    std::fill(y, y + N, 0.f);
    if constexpr (ARG) std::fill(a, a + N, -1);
  }
  auto scatter = [&](int64_t i, float xi) __attribute__((always_inline)) {
      const int64_t e = static_cast<int64_t>(crow_r[i + 1]);
      for (int64_t k = static_cast<int64_t>(crow_r[i]); k < e; ++k) {
        const int64_t j = static_cast<int64_t>(col[k]);
        float p;
        if constexpr (NEG)
          p = xi * (1.f - std::min(1.f, s * val[k]));
        else
          p = xi * val[k];
        if (p > y[j]) {
          y[j] = p;
          if constexpr (ARG) a[j] = static_cast<int32_t>(i);
        } else if constexpr (ARG && NEG) {
          if (p == y[j] && p > 0.f && static_cast<int32_t>(i) < a[j]) a[j] = static_cast<int32_t>(i);
        }
      }
  };
  if (nact >= 0) {
    for (int64_t q = 0; q < nact; ++q) scatter(act[q], x[act[q]]);
    return;
  }
  for (int64_t i0 = 0; i0 < N; i0 += kScanBlock) {
    const int64_t i1 = std::min(N, i0 + kScanBlock);
    if (!any_nonzero(x + i0, i1 - i0)) continue;
    for (int64_t i = i0; i < i1; ++i) {
      const float xi = x[i];
      if (xi > 0.f) scatter(i, xi);
    }
  }
}

// Push through M_r's own entries instead of X[b]'s active entities (sweep): entries in CSR order, the row
// i of each run found by a binary search in crow_r (rows ascending, as push visits them), scattered as in
// push_row (same products, same tie rule, so the same result).
template <typename ptr_t, typename idx_t, bool ARG, bool NEG>
void sweep_row(const float* x, int64_t N, const ptr_t* crow_r, const idx_t* col, const float* val, float s, float* y,
               int32_t* a) {
  if constexpr (!NEG) {
    std::fill(y, y + N, 0.f);
    if constexpr (ARG) std::fill(a, a + N, -1);
  }
  const int64_t k_end = static_cast<int64_t>(crow_r[N]);
  int64_t k = static_cast<int64_t>(crow_r[0]);
  int64_t i = 0;
  while (k < k_end) {
    // the row holding entry k: one before the first pointer above k (crow_r[N] = k_end > k bounds it)
    const ptr_t* p = std::upper_bound(crow_r + i + 1, crow_r + N + 1, static_cast<ptr_t>(k));
    i = static_cast<int64_t>(p - crow_r) - 1;
    const int64_t e = static_cast<int64_t>(crow_r[i + 1]);
    const float xi = x[i];
    if (xi > 0.f) {
      for (int64_t q = k; q < e; ++q) {
        const int64_t j = static_cast<int64_t>(col[q]);
        float prod;
        if constexpr (NEG)
          prod = xi * (1.f - std::min(1.f, s * val[q]));
        else
          prod = xi * val[q];
        if (prod > y[j]) {
          y[j] = prod;
          if constexpr (ARG) a[j] = static_cast<int32_t>(i);
        } else if constexpr (ARG && NEG) {
          if (prod == y[j] && prod > 0.f && static_cast<int32_t>(i) < a[j]) a[j] = static_cast<int32_t>(i);
        }
      }
    }
    k = e;
  }
}

// Scratch of one thread for the negated per-row pass.
struct NegScratch {
  std::vector<int64_t> stamp, rstamp;
  std::vector<int32_t> pending, next;
  int64_t tag = 0;
  float tv[kTopK];
  int32_t ti[kTopK];
};

// The K largest positive entries of x by (value desc, index asc) into sc.tv/ti (entries arrive in
// ascending index, so one equal to the current K-th is never better), their count, whether they are
// all the positive entries, and (COST) the row's full push cost through M_r.  Without COST the scan
// skips the per-entity cost sums, a chain of dependent double adds over every active entity: phase_a
// asks for them only when the probe leaves the plan open.  For dense rows they made the scan ~1.55x
// slower (perf, B = 16 dense negated, 1.4M-entry matrix: the scan took 0.21 of the pull's samples with
// them, 0.13 without).
template <bool COST, typename ptr_t>
int64_t top_list(const float* x, int64_t N, int64_t K, const ptr_t* crow_r, NegScratch& sc, bool& complete,
                 double& cost) {
  int64_t cnt = 0;
  complete = true;
  double entries = 0.0, active = 0.0, blocks = 0.0;
  float* tv = sc.tv;
  int32_t* ti = sc.ti;
  for (int64_t i0 = 0; i0 < N; i0 += kScanBlock) {
    const int64_t i1 = std::min(N, i0 + kScanBlock);
    if (!any_nonzero(x + i0, i1 - i0)) continue;
    blocks += 1.0;
    for (int64_t i = i0; i < i1; ++i) {
      const float v = x[i];
      if (!(v > 0.f)) continue;
      if constexpr (COST) {
        entries += static_cast<double>(crow_r[i + 1] - crow_r[i]);
        active += 1.0;
      }
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
  }
  if constexpr (COST) cost = push_cost(entries, active, blocks);
  return cnt;
}

// Out-of-support maxima of one row (the negated projection never forms the dense 1 - min(1, s M): for
// column j the factor is 1 outside its support, so the best there is X's largest entry outside it): every column gets
// X[b,i0] except the columns of row i0 of M_r; of those, every column not in row i1 gets X[b,i1]; and so
// on down the list.  Columns whose support holds every listed entity scan X[b,:] against the support
// (only when the list is incomplete).
template <typename ptr_t, typename idx_t, bool ARG>
void out_of_support_row(const float* x, int64_t N, const ptr_t* crow_r, const idx_t* col, const ptr_t* tcrow_r,
                        const idx_t* trow, int64_t cnt, bool complete, NegScratch& sc, float* y, int32_t* a) {
  const float* tv = sc.tv;
  const int32_t* ti = sc.ti;
  if (cnt == 0) {  // X[b,:] is all zero
    std::fill(y, y + N, 0.f);
    if constexpr (ARG) std::fill(a, a + N, -1);
    return;
  }
  if (sc.stamp.empty()) sc.stamp.assign(N, -1);
  std::fill(y, y + N, tv[0]);
  if constexpr (ARG) std::fill(a, a + N, ti[0]);
  sc.pending.clear();
  for (int64_t k = crow_r[ti[0]], e = crow_r[ti[0] + 1]; k < e; ++k) sc.pending.push_back(static_cast<int32_t>(col[k]));
  for (int64_t p = 1; p < cnt && !sc.pending.empty(); ++p) {
    ++sc.tag;
    for (int64_t k = crow_r[ti[p]], e = crow_r[ti[p] + 1]; k < e; ++k) sc.stamp[static_cast<int64_t>(col[k])] = sc.tag;
    sc.next.clear();
    for (const int32_t j : sc.pending) {
      if (sc.stamp[j] == sc.tag) {
        sc.next.push_back(j);  // ti[p] is in supp(j) too
      } else {
        y[j] = tv[p];
        if constexpr (ARG) a[j] = ti[p];
      }
    }
    sc.pending.swap(sc.next);
  }
  for (const int32_t j : sc.pending) {  // every listed entity is in supp(j)
    float ov = 0.f;
    int32_t oi = -1;
    if (!complete) {  // unlisted positive entries exist: scan the row
      if (sc.rstamp.empty()) sc.rstamp.assign(N, -1);
      ++sc.tag;
      for (int64_t k = tcrow_r[j], e = tcrow_r[j + 1]; k < e; ++k) sc.rstamp[static_cast<int64_t>(trow[k])] = sc.tag;
      for (int64_t i = 0; i < N; ++i) {
        if (x[i] > ov && sc.rstamp[i] != sc.tag) {
          ov = x[i];
          oi = static_cast<int32_t>(i);
        }
      }
    }
    y[j] = ov;
    if constexpr (ARG) a[j] = oi;
  }
}

// Phase A over all rows: push or sweep the rows whose plan says so, mark the others for pull
// (pulled[b] = 1); negated: every row's out-of-support maxima first.
template <typename ptr_t, typename idx_t, bool ARG>
void phase_a(const float* X, int64_t B, const int64_t* rel, const Stack<ptr_t, idx_t>& st, const double* budget,
             bool negated, float s, float* Y, int32_t* A, uint8_t* pulled) {
  const int64_t N = st.N;
  // ~0.2 ns per entity (scan + zero fill); negated ~1.5 (top list + out-of-support fill)
  const double work_ns = (negated ? 1.5 : 0.2) * static_cast<double>(B) * static_cast<double>(N);
  detail::parallel_if(work_ns, 0, B, 1, [&](int64_t b0, int64_t b1) {
    NegScratch sc;
    int32_t act[kActCap];
    int64_t nact = -1;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r = rel[b];
      const ptr_t* crow_r = st.crow + r * N;
      const float* x = X + b * N;
      float* y = Y + b * N;
      int32_t* a = ARG ? A + b * N : nullptr;
      if (!negated) {
        const uint8_t plan = plan_row(x, N, crow_r, budget[b], act, &nact);
        pulled[b] = plan == kPlanPull ? 1 : 0;
        if (plan == kPlanPush)
          push_row<ptr_t, idx_t, ARG, false>(x, N, crow_r, st.col, st.val, s, y, a, act, nact);
        else if (plan == kPlanSweep)
          sweep_row<ptr_t, idx_t, ARG, false>(x, N, crow_r, st.col, st.val, s, y, a);
      } else {
        // the same decision as plan_row: the probe, then the exact cost, which the top-list pass computes
        // (only when the probe left the row open)
        const double bg = budget[b];
        const bool forced = bg < 0.0 || bg == std::numeric_limits<double>::infinity();
        const int64_t nnz_r = st.nnz_of(r);
        const double sweep = kSweepEntryNs * static_cast<double>(nnz_r), limit = std::min(bg, sweep);
        const bool open = !forced && !probe_over_limit(x, N, nnz_r, limit);
        bool complete;
        double cost = 0.0;
        const int64_t K = std::min<int64_t>(kTopK, N);
        const int64_t cnt = open ? top_list<true>(x, N, K, crow_r, sc, complete, cost)
                                 : top_list<false>(x, N, K, crow_r, sc, complete, cost);
        out_of_support_row<ptr_t, idx_t, ARG>(x, N, crow_r, st.col, st.tcrow + r * N, st.trow, cnt, complete, sc, y,
                                              a);
        const uint8_t plan = bg < 0.0 ? kPlanPull : forced ? kPlanPush : plan_from(open && cost <= limit, sweep, bg);
        pulled[b] = plan == kPlanPull ? 1 : 0;
        if (plan == kPlanPush)
          push_row<ptr_t, idx_t, ARG, true>(x, N, crow_r, st.col, st.val, s, y, a, nullptr, -1);
        else if (plan == kPlanSweep)
          sweep_row<ptr_t, idx_t, ARG, true>(x, N, crow_r, st.col, st.val, s, y, a);
      }
    }
  });
}

// Runs f(t) for t in [0, n) on the pool, every thread taking one contiguous run
// of tasks of about equal total cost: at::parallel_for hands each thread one
// contiguous chunk of its range, so equal-count chunks of unequal tasks (a big
// relation's tile next to a small one's) would leave threads idle.  Inline
// when the whole is below kMinParallelNs (see fuzzy_common.h).
template <typename F>
void run_balanced(const std::vector<double>& cost, const F& f) {
  const int64_t n = static_cast<int64_t>(cost.size());
  if (n == 0) return;
  double total = 0.0;
  for (const double c : cost) total += c;
  const int64_t threads = at::get_num_threads();
  if (total < detail::kMinParallelNs || threads <= 1 || n == 1) {
    for (int64_t t = 0; t < n; ++t) f(t);
    return;
  }
  const int64_t parts = std::min<int64_t>(threads, n);
  std::vector<int64_t> bounds(parts + 1, n);
  bounds[0] = 0;
  double acc = 0.0;
  int64_t p = 1;
  for (int64_t t = 0; t < n && p < parts; ++t) {
    const double mid = acc + 0.5 * cost[t];  // task t goes to the part its cost midpoint falls in
    acc += cost[t];
    const int64_t q = std::min<int64_t>(parts - 1, static_cast<int64_t>(mid / total * static_cast<double>(parts)));
    while (p <= q) bounds[p++] = t;
  }
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t part = p0; part < p1; ++part)
      for (int64_t t = bounds[part]; t < bounds[part + 1]; ++t) f(t);
  });
}

// A tile: nb (<= T) rows of one relation, tile_rows[first .. first + nb).  xt_off: offset of its
// transposed copy in the wave buffer (T > 1, split tiles).  fac_off: offset of the relation's negation factors.
struct Tile {
  int64_t r;
  int T;
  int64_t nb, first, xt_off, fac_off;
  int64_t parts;  // column ranges the pull is split into (> 1: the copy is shared, in the wave buffer)
};

struct PullTask {
  int64_t tile, j0, j1;
};

struct PrepTask {
  bool factor;  // false: transpose entities [lo, hi) of tile idx; true: factors [lo, hi) of relation tile idx
  int64_t idx, lo, hi;
};

// Column bounds of `parts` ranges of [0, N) with about equal nnz + columns in M_r's transpose.
template <typename ptr_t>
std::vector<int64_t> split_columns(const ptr_t* tcrow_r, int64_t N, int64_t parts) {
  std::vector<int64_t> bounds(parts + 1, N);
  bounds[0] = 0;
  const int64_t base = static_cast<int64_t>(tcrow_r[0]);
  const int64_t total = static_cast<int64_t>(tcrow_r[N]) - base + N;
  int64_t j = 0;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t target = total * p / parts;
    while (j < N && static_cast<int64_t>(tcrow_r[j]) - base + j < target) ++j;
    bounds[p] = j;
  }
  return bounds;
}

// Columns [j0, j1) of one tile: the max over each column's support of M_r (entries k of the transpose,
// factor fval_r[k - tcrow_r[0]]) for the tile's queries, written to (or, negated, merged into) Y.
// 16 columns at a time: their T maxima are built in registers (column_max) and written back to the
// tile's rows with 16 x 16 register transposes (store_rows).  T = 32 prefetches the tile row of the entry
// 16 ahead (the tile, 1.9 MB for N = 14,505, does not stay whole in L2 beside the streaming supports).
template <typename ptr_t, typename idx_t, int T, bool ARG>
void pull_columns(const float* xt, const ptr_t* tcrow_r, const idx_t* trow, const float* fval_r, const int64_t* rows,
                  int64_t nb, int64_t N, int64_t j0, int64_t j1, bool merge, float* Y, int32_t* A) {
  constexpr int64_t kCols = 16;
  alignas(64) float ybuf[kCols * T];
  alignas(64) int32_t abuf[ARG ? kCols * T : 1];
  constexpr int PF = T == 32 ? 16 : 0;
  const int64_t kb = static_cast<int64_t>(tcrow_r[0]);
  const idx_t* row_end = trow + static_cast<int64_t>(tcrow_r[N]);
  for (int64_t jb = j0; jb < j1; jb += kCols) {
    const int64_t je = std::min(j1, jb + kCols);
    for (int64_t j = jb; j < je; ++j) {
      const int64_t k0 = static_cast<int64_t>(tcrow_r[j]), k1 = static_cast<int64_t>(tcrow_r[j + 1]);
      detail::column_max<T, ARG, PF>(
          xt, trow + k0, fval_r + (k0 - kb), 0, k1 - k0, [](float v) { return v; }, [](int64_t) {},
          ybuf + (j - jb) * T, abuf + (ARG ? (j - jb) * T : 0), row_end);
    }
    if (!merge) {
      detail::store_rows<T, ARG>(ybuf, abuf, je - jb, N, rows, nb, jb, Y, A);
      continue;
    }
    for (int64_t t = 0; t < nb; ++t) {
      float* y = Y + rows[t] * N;
      if constexpr (ARG) {
        int32_t* a = A + rows[t] * N;
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

// The negation factors f[k] = 1 - min(1, s v[k]) of n entries, in one pass over whole vectors.  As a
// plain loop (inline in phase_b's task lambda, or as a function of restrict pointers) GCC 12 -O3 turns
// it into a scalar compare and branch on s v < 1, a coin flip for s = 3 and values spread over (0, 1]:
// perf put ~80% of phase_b's own time of a B = 16 dense negated call there (1.4M-entry matrix, 1
// thread).  The same bits either way: one multiply, min, subtract per entry (no fused multiply-add:
// the min sits between them).
inline void negation_factors(const float* v, int64_t n, float s, float* f) {
  using detail::kVecFloats;
  using detail::vfloat;
  const vfloat one = vfloat{} + 1.f, vs = vfloat{} + s;
  int64_t k = 0;
  for (; k + kVecFloats <= n; k += kVecFloats) {
    vfloat x;
    std::memcpy(&x, v + k, sizeof(x));
    const vfloat p = vs * x;
    const vfloat r = one - (p < one ? p : one);
    std::memcpy(f + k, &r, sizeof(r));
  }
  for (; k < n; ++k) {
    const float p = s * v[k];
    f[k] = 1.f - (p < 1.f ? p : 1.f);
  }
}

template <typename F>
void dispatch_width(int T, const F& f) {
  switch (T) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;  // best_tiling's widths: 1, 16, 32
  }
}

// Phase B: pull the rows phase A left (pulled[b] = 1), tiled per relation group.
// A tile pulled by one task (every tile on one thread) is transposed by that task into the thread's
// cached scratch right before its pull: the copy is still in cache, and no buffer of all tiles is
// allocated (a fresh 59 MB one for B = 1,024 page-faults in on every call).  A tile big enough to be
// split into column ranges over several threads is transposed once beforehand into a shared buffer, in
// waves of at most kWaveFloats.
template <typename ptr_t, typename idx_t, bool ARG>
void phase_b(const float* X, const Groups& g, const Stack<ptr_t, idx_t>& st, const uint8_t* pulled, bool negated,
             float s, float* Y, int32_t* A) {
  const int64_t N = st.N;
  std::vector<int64_t> tile_rows;
  std::vector<Tile> tiles;
  std::vector<int64_t> rows;
  for (size_t k = 0; k + 1 < g.start.size(); ++k) {
    rows.clear();
    for (int64_t q = g.start[k]; q < g.start[k + 1]; ++q)
      if (pulled[g.order[q]]) rows.push_back(g.order[q]);
    const int64_t c = static_cast<int64_t>(rows.size()), nnz = st.nnz_of(g.rel[k]);
    for (int64_t pos = 0; pos < c;) {
      const int T = best_tiling(c - pos, nnz, N, ARG).first;
      const int64_t take = std::min<int64_t>(T, c - pos);
      tiles.push_back(Tile{g.rel[k], T, take, static_cast<int64_t>(tile_rows.size()), -1, -1, 1});
      tile_rows.insert(tile_rows.end(), rows.begin() + pos, rows.begin() + pos + take);
      pos += take;
    }
  }
  if (tiles.empty()) return;
  const int64_t ntiles = static_cast<int64_t>(tiles.size());

  // Negated: the factors 1 - min(1, s v) of each pulled relation, once per call in a vectorised pass:
  // computing them inside the gather loop measured 5.5x slower for T = 1.
  std::unique_ptr<float[]> factor;
  std::vector<int64_t> fac_tiles;  // one tile per relation (tiles of a relation are consecutive)
  if (negated) {
    int64_t total = 0;
    for (int64_t t = 0; t < ntiles; ++t) {
      if (t > 0 && tiles[t].r == tiles[t - 1].r) {
        tiles[t].fac_off = tiles[t - 1].fac_off;
        continue;
      }
      tiles[t].fac_off = total;
      fac_tiles.push_back(t);
      total += st.nnz_of(tiles[t].r);
    }
    factor.reset(new float[total > 0 ? total : 1]);
  }

  // Column ranges per tile: big tiles are split so that a batch of one relation still uses every
  // thread; ranges of one tile are consecutive (its copy stays in one cache).
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  std::vector<double> tcost(ntiles);
  double total = 0.0;
  for (int64_t t = 0; t < ntiles; ++t) {
    tcost[t] = tile_cost(tiles[t].T, st.nnz_of(tiles[t].r), N);
    total += tcost[t];
  }
  const bool parallel = threads > 1 && total >= detail::kMinParallelNs;
  const double target = total / static_cast<double>(threads * 4);
  const bool split_all = force_split();
  for (int64_t t = 0; t < ntiles; ++t) {
    int64_t parts = parallel ? static_cast<int64_t>(std::ceil(tcost[t] / target)) : 1;
    if (split_all && tiles[t].T > 1) parts = std::max<int64_t>(parts, 2);
    tiles[t].parts = std::max<int64_t>(1, std::min<int64_t>(parts, (N + 15) / 16));
  }

  // Waves of the shared (split, T > 1) tiles whose transposed copies fit kWaveFloats.
  std::vector<std::vector<int64_t>> waves(1);
  const int64_t wave_limit = wave_floats();
  int64_t max_floats = 0, floats = 0;
  for (int64_t t = 0; t < ntiles; ++t) {
    if (tiles[t].parts == 1 || tiles[t].T == 1) continue;
    const int64_t need = tiles[t].T * N;
    if (floats > 0 && floats + need > wave_limit) {
      waves.emplace_back();
      floats = 0;
    }
    waves.back().push_back(t);
    tiles[t].xt_off = floats;
    floats += need;
    max_floats = std::max(max_floats, floats);
  }
  std::unique_ptr<detail::AlignedFloats> xt_buf;
  if (max_floats > 0) xt_buf = std::make_unique<detail::AlignedFloats>(static_cast<size_t>(max_floats));
  float* xt_all = xt_buf ? xt_buf->data() : nullptr;

  for (size_t w = 0; w < waves.size(); ++w) {
    // 1. transpose the wave's shared tiles (and, first wave, compute the factors): one parallel region
    std::vector<PrepTask> prep;
    std::vector<double> prep_cost;
    constexpr int64_t kEntChunk = 4096, kFacChunk = 1 << 16;
    for (const int64_t t : waves[w]) {
      for (int64_t lo = 0; lo < N; lo += kEntChunk) {
        prep.push_back(PrepTask{false, t, lo, std::min(N, lo + kEntChunk)});
        prep_cost.push_back(kTransposeNs * tiles[t].T * static_cast<double>(prep.back().hi - lo));
      }
    }
    if (w == 0) {
      for (const int64_t t : fac_tiles) {
        const int64_t nnz = st.nnz_of(tiles[t].r);
        for (int64_t lo = 0; lo < nnz; lo += kFacChunk) {
          prep.push_back(PrepTask{true, t, lo, std::min(nnz, lo + kFacChunk)});
          prep_cost.push_back(kFactorNs * static_cast<double>(prep.back().hi - lo));
        }
      }
    }
    run_balanced(prep_cost, [&](int64_t p) {
      const PrepTask& task = prep[p];
      const Tile& tile = tiles[task.idx];
      if (task.factor) {
        const float* v = st.tval + static_cast<int64_t>(st.tcrow[tile.r * N]);
        float* f = factor.get() + tile.fac_off;
        negation_factors(v + task.lo, task.hi - task.lo, s, f + task.lo);
        return;
      }
      dispatch_width(tile.T, [&](auto width) {
        constexpr int T = decltype(width)::value;
        if constexpr (T > 1)
          detail::transpose_rows<T>(X, N, tile_rows.data() + tile.first, tile.nb, task.lo, task.hi,
                                    xt_all + tile.xt_off);
      });
    });

    // 2. pull: the wave's shared tiles in their column ranges; in the first wave every unsplit tile too.
    std::vector<PullTask> pull;
    std::vector<double> pull_cost;
    for (int64_t t = 0; t < ntiles; ++t) {
      const bool shared = tiles[t].parts > 1 && tiles[t].T > 1;
      if (!shared) {
        if (w == 0) {
          pull.push_back(PullTask{t, 0, N});
          pull_cost.push_back(tcost[t]);
        }
        continue;
      }
      if (std::find(waves[w].begin(), waves[w].end(), t) == waves[w].end()) continue;
      const int64_t parts = tiles[t].parts;
      const std::vector<int64_t> bounds = split_columns(st.tcrow + tiles[t].r * N, N, parts);
      for (int64_t p = 0; p < parts; ++p) {
        if (bounds[p] == bounds[p + 1]) continue;
        pull.push_back(PullTask{t, bounds[p], bounds[p + 1]});
        pull_cost.push_back(tcost[t] / static_cast<double>(parts));
      }
    }
    run_balanced(pull_cost, [&](int64_t p) {
      const PullTask& task = pull[p];
      const Tile& tile = tiles[task.tile];
      const ptr_t* tcrow_r = st.tcrow + tile.r * N;
      const float* fval = negated ? factor.get() + tile.fac_off : st.tval + static_cast<int64_t>(tcrow_r[0]);
      const int64_t* trows = tile_rows.data() + tile.first;
      dispatch_width(tile.T, [&](auto width) {
        constexpr int T = decltype(width)::value;
        const float* xt;
        std::unique_ptr<detail::ThreadScratch> own;
        if constexpr (T == 1) {
          xt = X + trows[0] * N;  // a single row is its own transposed copy
        } else if (tile.parts > 1) {
          xt = xt_all + tile.xt_off;
        } else {
          own = std::make_unique<detail::ThreadScratch>(static_cast<size_t>(N * T));
          detail::transpose_rows<T>(X, N, trows, tile.nb, 0, N, own->data());
          xt = own->data();
        }
        pull_columns<ptr_t, idx_t, T, ARG>(xt, tcrow_r, st.trow, fval, trows, tile.nb, N, task.j0, task.j1, negated,
                                           Y, A);
      });
    });
  }
}

template <typename ptr_t, typename idx_t>
void run(const at::Tensor& x, const int64_t* rel, const at::Tensor& crow, const at::Tensor& col,
         const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow, const at::Tensor& tval, int64_t N,
         int64_t strategy, bool negated, float s, bool want_argmax, at::Tensor& y, at::Tensor& a) {
  const int64_t B = x.size(0);
  const Stack<ptr_t, idx_t> st{N,
                               crow.data_ptr<ptr_t>(),
                               col.data_ptr<idx_t>(),
                               val.data_ptr<float>(),
                               tcrow.data_ptr<ptr_t>(),
                               trow.data_ptr<idx_t>(),
                               tval.data_ptr<float>()};
  const float* X = x.data_ptr<float>();
  const Groups g = group_rows(rel, B);
  const std::vector<double> budget = budgets(g, st, B, strategy, want_argmax);
  std::vector<uint8_t> pulled(B, 0);
  float* Y = y.data_ptr<float>();
  if (want_argmax) {
    int32_t* A = a.data_ptr<int32_t>();
    phase_a<ptr_t, idx_t, true>(X, B, rel, st, budget.data(), negated, s, Y, A, pulled.data());
    phase_b<ptr_t, idx_t, true>(X, g, st, pulled.data(), negated, s, Y, A);
  } else {
    phase_a<ptr_t, idx_t, false>(X, B, rel, st, budget.data(), negated, s, Y, nullptr, pulled.data());
    phase_b<ptr_t, idx_t, false>(X, g, st, pulled.data(), negated, s, Y, nullptr);
  }
}

// The checks every device's kernel shares (csrc/project_common.h, same messages): X, rel, crow.
// Returns R and rel as a contiguous int64 tensor in rel64 (its range is checked by project_checks::ranges).
int64_t check_rows(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, int64_t N, const char* op,
                   at::Tensor& rel64) {
  const int64_t R = project_checks::rows(op, x, rel, crow, N, c10::DeviceType::CPU);
  rel64 = rel.to(at::kLong).contiguous();
  return R;
}

}  // namespace

namespace {

// project into y and, when want_argmax, a (both allocated or validated by the caller, or
// allocated here when undefined).
void project_into(const at::Tensor& x_in, const at::Tensor& rel, const at::Tensor& crow_in,
                        const at::Tensor& col_in, const at::Tensor& val_in, const at::Tensor& tcrow_in,
                        const at::Tensor& trow_in, const at::Tensor& tval_in, int64_t num_entities, int64_t strategy,
                        bool negated, double neg_scale, bool want_argmax, at::Tensor& y, at::Tensor& a,
                        const char* op) {
  at::Tensor rel64;
  const int64_t N = num_entities;
  const int64_t R = check_rows(x_in, rel, crow_in, N, op, rel64);
  const int64_t nnz =
      project_checks::matrix(op, x_in, crow_in, col_in, val_in, tcrow_in, trow_in, tval_in, strategy, neg_scale);
  const at::Tensor x = x_in.contiguous(), crow = crow_in.contiguous(), col = col_in.contiguous(),
                   val = val_in.contiguous(), tcrow = tcrow_in.contiguous(), trow = trow_in.contiguous(),
                   tval = tval_in.contiguous();
  project_checks::ranges(op, rel64, R, crow, &tcrow, nnz);

  const int64_t B = x.size(0);
  const auto int_opts = x.options().dtype(at::kInt);
  if (!y.defined()) y = detail::empty_output({B, N}, x.options());
  if (!a.defined()) a = want_argmax ? detail::empty_output({B, N}, int_opts) : at::empty({0}, int_opts);
  project_checks::out(op, x_in, y, a);
  TORCH_CHECK(!want_argmax || a.numel() == y.numel(), op, ": argmax output missing");
  if (B == 0) return;
  const float s = static_cast<float>(neg_scale);
  const int64_t* r = rel64.data_ptr<int64_t>();
  const bool p32 = crow.scalar_type() == at::kInt, i32 = col.scalar_type() == at::kInt;
  if (p32 && i32)
    run<int32_t, int32_t>(x, r, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else if (p32)
    run<int32_t, int64_t>(x, r, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else if (i32)
    run<int64_t, int32_t>(x, r, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
  else
    run<int64_t, int64_t>(x, r, crow, col, val, tcrow, trow, tval, N, strategy, negated, s, want_argmax, y, a);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> project_cpu(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow,
                                               const at::Tensor& col, const at::Tensor& val, const at::Tensor& tcrow,
                                               const at::Tensor& trow, const at::Tensor& tval, int64_t num_entities,
                                               int64_t strategy, bool negated, double neg_scale, bool want_argmax) {
  at::Tensor y, a;
  project_into(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale,
                     want_argmax, y, a, "kgreason::project");
  return {y, a};
}

void project_out_cpu(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, const at::Tensor& col,
                     const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow, const at::Tensor& tval,
                     int64_t num_entities, int64_t strategy, bool negated, double neg_scale, at::Tensor& y,
                     at::Tensor& argmax) {
  TORCH_CHECK(y.defined() && argmax.defined(), "kgreason::project_out: y and argmax must be tensors");
  project_into(x, rel, crow, col, val, tcrow, trow, tval, num_entities, strategy, negated, neg_scale,
                     argmax.numel() > 0, y, argmax, "kgreason::project_out");
}

at::Tensor project_strategy_cpu(const at::Tensor& x_in, const at::Tensor& rel, const at::Tensor& crow_in,
                                int64_t num_entities) {
  at::Tensor rel64;
  const int64_t N = num_entities;
  constexpr const char* op = "kgreason::project_strategy";
  const int64_t R = check_rows(x_in, rel, crow_in, N, op, rel64);
  const at::Tensor x = x_in.contiguous(), crow = crow_in.contiguous();
  project_checks::ranges(op, rel64, R, crow, nullptr, 0);
  const int64_t B = x.size(0);
  at::Tensor out = at::empty({B}, x.options().dtype(at::kInt));
  int32_t* o = out.data_ptr<int32_t>();
  const int64_t* r = rel64.data_ptr<int64_t>();
  auto go = [&](auto ptr_tag) {
    using ptr_t = decltype(ptr_tag);
    // the decision needs only the pointers; col/val/transpose are not read
    const Stack<ptr_t, int32_t> st{N, crow.data_ptr<ptr_t>(), nullptr, nullptr, nullptr, nullptr, nullptr};
    const Groups g = group_rows(r, B);
    const std::vector<double> budget = budgets(g, st, B, kAuto, false);
    const float* X = x.data_ptr<float>();
    std::vector<int32_t> act(kActCap);
    int64_t nact = -1;
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t plan = plan_row(X + b * N, N, st.crow + r[b] * N, budget[b], act.data(), &nact);
      o[b] = static_cast<int32_t>(plan == kPlanPush ? kPush : plan == kPlanPull ? kPull : kSweepCode);
    }
  };
  if (crow.scalar_type() == at::kInt)
    go(int32_t{});
  else
    go(int64_t{});
  return out;
}

}  // namespace cpu
}  // namespace kgreason
