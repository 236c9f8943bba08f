// Helpers shared by the CPU projection kernels (header-only, internal).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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
  at::parallel_for(0, N, 2048, [&](int64_t i0, int64_t i1) {
    constexpr int64_t kBlock = 256;
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

// A float buffer whose data() is 64-byte aligned (one tile row per cache line).
class AlignedFloats {
 public:
  explicit AlignedFloats(size_t n) : store_(n + 16) {
    ptr_ = store_.data();
    while (reinterpret_cast<uintptr_t>(ptr_) % 64 != 0) ++ptr_;
  }
  float* data() { return ptr_; }

 private:
  std::vector<float> store_;
  float* ptr_;
};

// Tile width for a batch of B queries: a full 16-float (64-byte, one AVX-512
// register / one cache line) tile once there are enough queries, narrower
// tiles for small batches so B = 1 does not pay 16x padding.
template <typename F>
void dispatch_tile(int64_t B, F&& f) {
  if (B >= 9) {
    f(std::integral_constant<int, 16>{});
  } else if (B >= 5) {
    f(std::integral_constant<int, 8>{});
  } else if (B >= 2) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace kgreason
