// The one cost model of the projection kernels (header-only, internal): every choice between push,
// sweep and pull (kgreason::project, cpu/project_cpu.cpp), of a pull's tile width, and of how the
// sparse-in, sparse-out variant (kgreason::project_multi_sparse, cpu/project_multi_sparse_cpu.cpp) emits
// its rows is made from these measured per-step costs, in one place: a constant re-measured on another
// machine changes every decision consistently.  (Whether a set is kept sparse at all is the executor's
// choice, from push_sizes in ops/sparse_rows.py.)  The choices only affect speed: every strategy returns
// the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace kgreason {
namespace cpu {
namespace cost {

// Dense projection (push / sweep / pull, and the tile width of a pull).
// Costs in ns, single-threaded on this machine (AMD EPYC Zen 4, AVX-512): a push step (one entry of
// an active row, scalar scatter-max) 1.8; a pull step (one support entry for
// one tile of T queries) 1.0 (T = 1), 1.0 (T = 16), 1.4 (T = 32), plus a per-column term (pull_column_ns);
// scanning X[b,:] 0.1 per entity; transposing X into a tile 0.5 per element.
constexpr double kPushStepNs = 1.8;
constexpr double kScanNs = 0.1;
// A 256-entity block of X[b,:] that is not all zero is walked entity by
// entity: ~250 ns, plus ~0.5 ns per active entity (reading crow_r[i],
// crow_r[i+1]) even where M_r's row is empty.  Measured on 256-row batches
// through an 85-entry relation (N = 14,505; per pass, measure + scatter):
// dense rows ~20 us per row, rows with 1% active ~15 us (every block holds an
// active entity).  Without these terms a dense or 1%-dense row of a small
// relation looked cheap to push (its few entries) and cost 3-8x its sweep or pull.
constexpr double kBlockNs = 250.0;
constexpr double kActiveNs = 0.5;
// Sweep: per entry of M_r, the scatter step plus (at most one per entry) the
// binary search in crow_r for its row, ~14 dependent loads over an L2-resident
// array for N = 14,505.  Measured 5.0 us per dense row through an 85-entry
// relation (N = 14,505; 1.5 us of it the zero fill): ~40 ns per entry.
constexpr double kSweepEntryNs = 40.0;

constexpr double kTransposeNs = 0.5;
constexpr double kFactorNs = 0.3;  // 1 - min(1, s v) per entry, vectorised
// Per support entry of a tile: 1.0 ns for T = 1 (a dense row through the 1.4M-entry power-law matrix of
// benchmarks/test_ops_bench.py: 1.44 ms, quiet, 1 thread), 1.0 (T = 16), 1.4 (T = 32).  At 1.2 ns a lone
// row of that matrix looked cheaper in a 16-wide tile (1.62 vs 1.73 ms) and took 1.8 ms there.
inline double pull_step_ns(int T) { return T == 1 ? 1.0 : T == 16 ? 1.0 : 1.4; }
// Per column of a tile, support or not: reading tcrow, the 16-column register block and its
// write-back.  Pulling a column costs this even where M_r's column is empty, so on a sparse
// relation it is most of a pull: a row pulled alone (T = 1) cost 3.6 ns x N (+ 2.0 ns x nnz there),
// fitted on 8 relations of the synthetic FB15k-237-sized KG (N = 14,505, nnz 835-37,306, dense
// rows, 1 thread); a 16-row tile of a 2,513-6,139-entry relation ~224 us, a 32-row tile ~432 us
// (the transpose and the entry steps above leave ~7 and ~13 ns per column).  With the former
// model (0.5 ns per column and entry, no column term) a one-row pull looked 7x cheaper than it
// is: auto pulled rows whose push cost 10-15 us at 55-65 us (benchmark b1 3p at 0.88x).
inline double pull_column_ns(int T) { return T == 1 ? 3.6 : T == 16 ? 7.0 : 13.0; }

// Cost of pulling one tile of width T through a relation with nnz entries.
inline double tile_cost(int T, int64_t nnz, int64_t N) {
  return pull_step_ns(T) * static_cast<double>(nnz) + pull_column_ns(T) * static_cast<double>(N) +
         (T > 1 ? kTransposeNs * T * static_cast<double>(N) : 0.0);
}

// The cheapest tile width for pulling c rows of one relation, and the cost.
// T = 64 (which the former single-relation kernel used for B > 32) is no candidate: per row it
// costs more than T = 32 under these constants (3.0 / 64 > 1.4 / 32 ns per
// entry), and measured the same way here through ops.project (1 thread, dense
// rows, the 1.4M-entry power-law matrix of benchmarks/test_ops_bench.py, tile
// transposition included): 0.141 ms per row with T = 16, 0.135 with T = 32,
// 0.153 with T = 64.  With argmax T = 32 is no candidate either: the index
// vectors double the accumulator traffic, and it measured 1.3-1.4x slower than
// T = 16 (B = 256, FB15k-237's largest relation and a 1.14M-entry one: 58.5 vs
// 43.1 ms and 55.0 vs 42.6 ms single-threaded, the former single-relation
// kernel); here the one-relation stack with T = 32 took 1.41x the time of that
// kernel at B = 1,024 (ops_single_relation.md, before).
inline std::pair<int, double> best_tiling(int64_t c, int64_t nnz, int64_t N, bool arg) {
  int best_t = 1;
  double best = static_cast<double>(c) * tile_cost(1, nnz, N);
  for (const int T : {16, 32}) {
    if (T == 32 && arg) continue;
    const double cost = static_cast<double>((c + T - 1) / T) * tile_cost(T, nnz, N);
    if (cost < best) {
      best = cost;
      best_t = T;
    }
  }
  return {best_t, best};
}

// Push cost of entries (rows of M), active entities and non-zero blocks of X[b,:] (beyond the
// kScanNs-per-entity test of every block, which the budget already accounts for).
inline double push_cost(double entries, double active, double blocks) {
  return kPushStepNs * entries + kActiveNs * active + kBlockNs * blocks;
}

// Sparse in, sparse out (kgreason::project_multi_sparse), single-threaded (AMD EPYC Zen 4): a pushed entry
// (scalar scatter-max into the scratch) kPushStepNs, the dense push's step; a phase-1 entry of X 1.0; an entry copied in phase 3 0.7;
// per row 30.
constexpr double kEntryNs = 1.0;
constexpr double kCopyNs = 0.7;
constexpr double kRowNs = 30.0;
// Emitting the t touched columns of a row in ascending order, measured with g++ -O3 -march=native on this
// machine (random columns, values gathered and marker reset included):
//   sort the touched list:            ~3 ns * t log2 t  (std::sort of uint32; 1.2 us for t = 64, 36 us for 1,024)
//   scan the bitmap, ctz per word:   ~0.3 ns per word (ceil(N/64) words) + ~2-4 ns per touched column
//                                      (the bit loop's branch; 0.6 us for t = 64, 6.6 us for t = 1,024, N = 14,505)
// With a bitmap the scan reads N/64 words, not N markers, so it wins as soon as t log2 t exceeds ~W/10:
// t >= ~12 for N = 14,505 (227 words), t >= ~50 for N = 120,000 (1,875 words).  Sorting wins only for
// rows that reach a handful of columns in a large N.
constexpr double kSortNs = 3.0;
constexpr double kWordNs = 0.3;
constexpr double kBitNs = 2.0;

inline bool use_sort(int64_t t, int64_t words) {
  const double tt = static_cast<double>(t);
  return kSortNs * tt * std::log2(std::max(tt, 2.0)) < kWordNs * static_cast<double>(words) + kBitNs * tt;
}

}  // namespace cost
}  // namespace cpu
}  // namespace kgreason
