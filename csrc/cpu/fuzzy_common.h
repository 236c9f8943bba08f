// Helpers shared by the CPU projection kernels (header-only, internal).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace kgreason {
namespace cpu {
namespace detail {

inline void check_fuzzy_batch(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "kgreason: X must be a CPU tensor, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "kgreason: X must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2, "kgreason: X must be 2-D (B, N), got ", x.dim(), "-D");
}

inline void check_compressed(const at::Tensor& ptr, const at::Tensor& idx, const at::Tensor& val, int64_t n,
                             const char* what) {
  TORCH_CHECK(ptr.scalar_type() == at::kInt || ptr.scalar_type() == at::kLong, "kgreason: ", what,
              " pointers must be int32 or int64, got ", ptr.scalar_type());
  TORCH_CHECK(idx.scalar_type() == ptr.scalar_type(), "kgreason: ", what, " indices dtype ", idx.scalar_type(),
              " differs from its pointers' ", ptr.scalar_type());
  TORCH_CHECK(val.scalar_type() == at::kFloat, "kgreason: ", what, " values must be float32");
  TORCH_CHECK(ptr.dim() == 1 && ptr.numel() == n + 1, "kgreason: ", what, " pointers must have N+1 = ", n + 1,
              " entries, got ", ptr.numel());
  TORCH_CHECK(idx.numel() == val.numel(), "kgreason: ", what, " has ", idx.numel(), " indices but ", val.numel(),
              " values");
  TORCH_CHECK(ptr.device() == val.device() && idx.device() == val.device(), "kgreason: ", what,
              " tensors on different devices");
}

// True when any of p[0..len) is nonzero.  OR-ing the raw bits has no branch,
// so it vectorises: skipping an all-zero 256-entry block of a one-hot row costs
// a handful of vector ops instead of 256 compare-and-branches.
inline bool any_nonzero(const float* p, int64_t len) {
  uint32_t acc = 0;
  for (int64_t t = 0; t < len; ++t) {
    uint32_t u;
    std::memcpy(&u, p + t, sizeof(u));
    acc |= u;
  }
  return acc != 0;
}

// Below this much estimated single-threaded work a kernel runs on the calling
// thread.  Waking the pool costs microseconds on an idle machine but, on a
// loaded one (this 2-core machine runs several jobs), a parallel region waits
// for a descheduled worker: measured 24 ms for a B = 1 pull that takes 1.4 ms
// on one thread.  1 ms of work is where two threads reliably pay off.
constexpr double kMinParallelNs = 1.0e6;

// at::parallel_for when the work estimate is worth it, else f(begin, end) inline.
template <typename F>
void parallel_if(double work_ns, int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (work_ns < kMinParallelNs || at::get_num_threads() <= 1) {
    if (begin < end) f(begin, end);
  } else {
    at::parallel_for(begin, end, grain, f);
  }
}

// Split columns [0, n) into `parts` contiguous ranges of about equal work
// (nnz + columns): at::parallel_for hands each thread one contiguous chunk of
// the task range, so equal-work tasks keep the threads balanced on power-law
// matrices, where a few columns hold most of the entries.
template <typename idx_t>
std::vector<int64_t> balanced_column_split(const idx_t* ptr, int64_t n, int64_t parts) {
  std::vector<int64_t> bounds(parts + 1, n);
  bounds[0] = 0;
  const int64_t total = static_cast<int64_t>(ptr[n]) + n;
  int64_t j = 0;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t target = total * p / parts;
    while (j < n && static_cast<int64_t>(ptr[j]) + j < target) ++j;
    bounds[p] = j;
  }
  return bounds;
}

// Transposed, tiled copy of X (B x N, row-major): tile q holds queries
// qT..qT+T-1 as an N x T block, xt[(q*N + i)*T + t] = X[q*T + t, i] (zero for
// the padding queries of the last tile).  Gathering T queries of one entity
// into one 64-byte line (T = 16) is what lets the pull loops read a source
// entity once per tile and update T accumulators with one vector multiply and
// one vector max.  The whole of X is transposed up front so that the kernels
// need a single parallel region: on a machine shared with other jobs every
// extra fork/join waits for the slowest, possibly descheduled, thread.
template <int T>
void transpose_tiles(const float* X, int64_t B, int64_t N, float* xt) {
  const int64_t ntiles = (B + T - 1) / T;
  // ~0.5 ns per element copied
  parallel_if(0.5 * static_cast<double>(ntiles * T * N), 0, N, 2048, [&](int64_t i0, int64_t i1) {
    constexpr int64_t kBlock = 64;  // 64 entities x T floats stay in L1 while written
    for (int64_t q = 0; q < ntiles; ++q) {
      for (int64_t ib = i0; ib < i1; ib += kBlock) {
        const int64_t ie = std::min(i1, ib + kBlock);
        float* dst = xt + q * N * T;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t b = q * T + t;
          if (b < B) {
            const float* src = X + b * N;
            for (int64_t i = ib; i < ie; ++i) dst[i * T + t] = src[i];
          } else {
            for (int64_t i = ib; i < ie; ++i) dst[i * T + t] = 0.f;
          }
        }
      }
    }
  });
}

// An uninitialised float buffer whose data() is 64-byte aligned (one tile row
// per cache line).  Not a std::vector: zero-filling a 15 MB tile copy that is
// overwritten right away would cost an extra pass (~1-2 ms at B = 256).
class AlignedFloats {
 public:
  explicit AlignedFloats(size_t n) : store_(new float[n + 16]) {
    ptr_ = store_.get();
    while (reinterpret_cast<uintptr_t>(ptr_) % 64 != 0) ++ptr_;
  }
  float* data() { return ptr_; }

 private:
  std::unique_ptr<float[]> store_;
  float* ptr_;
};

// Tile width T (queries per tile) for a batch of B queries.  Measured
// single-threaded on this machine (AMD EPYC, AVX-512; N = 14,505, 1.03M-nnz
// power-law matrix; ns per support entry per tile): T = 16: 1.0, T = 32: 1.4,
// T = 64: 2.6-3.7.  Wider tiles amortise the per-entry index and value loads
// over more queries but no longer fit the tile in L2 (N x 64 floats = 3.7 MB),
// so B = 256 takes 24.7 ms with T = 16 and 15.2 ms with T = 64.  B = 1 uses a
// scalar gather (T = 1, 0.5 ns per entry).
inline int tile_width(int64_t B) { return B <= 1 ? 1 : B <= 16 ? 16 : B <= 32 ? 32 : 64; }

template <typename F>
void dispatch_tile(int64_t B, F&& f) {
  switch (tile_width(B)) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: f(std::integral_constant<int, 64>{}); break;
  }
}

// The widest float vector of the build target, as a GCC/Clang vector type.
// The explicit vector loop below runs 3.8x faster than the same loop written
// over float[16] arrays, which GCC 12 -O3 -march=native vectorises poorly
// (3.82 ms vs 0.95-1.0 ms for B = 16 on the matrix above).  The width follows
// the ISA (64 bytes with AVX-512, 32 with AVX, 16 otherwise) because a 64-byte
// vector type compiled for AVX2 is lowered through memory and runs 16x slower.
#if defined(__AVX512F__)
constexpr int kVecFloats = 16;
#elif defined(__AVX__)
constexpr int kVecFloats = 8;
#else
constexpr int kVecFloats = 4;
#endif
typedef float vfloat __attribute__((vector_size(kVecFloats * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(kVecFloats * sizeof(int32_t))));

// Max over the entries k0..k1 of one CSC column of  xt[row[k]*T + t] * factor(val[k])
// for the T queries t of a tile, with argmax (smallest row on ties, as rows
// ascend and only a strictly larger product replaces).  on_entry(i) is called
// for every support row (the negated kernel marks the support with it).
// Writes T values to out_v and, with ARG, T indices (-1 where the max is 0) to out_a.
template <int T, bool ARG, typename idx_t, typename Factor, typename OnEntry>
inline void column_max(const float* xt, const idx_t* row, const float* val, int64_t k0, int64_t k1, Factor factor,
                       OnEntry on_entry, float* out_v, int32_t* out_a) {
  if constexpr (T % kVecFloats == 0) {
    constexpr int V = T / kVecFloats;
    vfloat acc[V];
    vint arg[V];
    for (int w = 0; w < V; ++w) {
      acc[w] = vfloat{};
      arg[w] = vint{} - 1;
    }
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i = static_cast<int64_t>(row[k]);
      on_entry(i);
      const float f = factor(val[k]);
      const float* xr = xt + i * T;
      for (int w = 0; w < V; ++w) {
        vfloat x;
        std::memcpy(&x, xr + w * kVecFloats, sizeof(x));
        const vfloat p = x * f;
        if constexpr (ARG) {
          const vint better = p > acc[w];
          arg[w] = better ? (vint{} + static_cast<int32_t>(i)) : arg[w];
          acc[w] = better ? p : acc[w];
        } else {
          acc[w] = p > acc[w] ? p : acc[w];
        }
      }
    }
    for (int w = 0; w < V; ++w) {
      std::memcpy(out_v + w * kVecFloats, &acc[w], sizeof(acc[w]));
      if constexpr (ARG) std::memcpy(out_a + w * kVecFloats, &arg[w], sizeof(arg[w]));
    }
  } else {
    float acc[T];
    int32_t arg[T];
    for (int t = 0; t < T; ++t) {
      acc[t] = 0.f;
      arg[t] = -1;
    }
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i = static_cast<int64_t>(row[k]);
      on_entry(i);
      const float f = factor(val[k]);
      const float* xr = xt + i * T;
      for (int t = 0; t < T; ++t) {
        const float p = xr[t] * f;
        if (p > acc[t]) {
          acc[t] = p;
          arg[t] = static_cast<int32_t>(i);
        }
      }
    }
    for (int t = 0; t < T; ++t) out_v[t] = acc[t];
    if constexpr (ARG)
      for (int t = 0; t < T; ++t) out_a[t] = arg[t];
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace kgreason
