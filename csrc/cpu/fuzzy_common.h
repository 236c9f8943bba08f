// Helpers shared by the CPU projection kernels (header-only, internal).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cstdlib>
#include <mutex>
#include <utility>

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

// Large kernel outputs are recycled by empty_output instead of going back to the OS.  Why: glibc serves a
// block above its mmap threshold (at most 32 MiB on 64-bit) with a fresh mmap on every allocation and unmaps
// it on free, so every call faults its output in again, one 4 KiB page at a time: a (1024, 14505) float32
// projection output (59 MB) took 14,506 minor faults, 21.7 ms for a one-hot push whose kernel needs 3.6 ms
// (AMD EPYC, 2 threads).  Smaller blocks are recycled by glibc itself (no faults after the first call).
// Transparent huge pages were measured too and rejected: 6 ms in a tight loop, but 62-82 ms once the
// process paused for 3 s (in a VM, freed 2 MiB blocks go back to the host, which faults them in again).
// A freed output of at least kCachedOutputBytes is kept, up to a cap, and handed to the next request of
// the same byte size: batches of one shape (the common case) never fault after the first call.
constexpr size_t kCachedOutputBytes = size_t(32) << 20;

class OutputCache {
 public:
  // The one cache of the process (never destroyed: a tensor may be freed during interpreter shutdown).
  static OutputCache& instance() {
    static OutputCache* cache = new OutputCache();
    return *cache;
  }
  // A cached block of exactly `bytes`, else a new one (nullptr when allocation fails).
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = free_.size(); k-- > 0;) {  // newest first: most likely still in cache and TLB
        if (free_[k].first == bytes) {
          void* p = free_[k].second;
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(k));
          held_ -= bytes;
          return p;
        }
      }
    }
    void* p = nullptr;
    return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
  }
  // Back into the cache; the oldest blocks are freed while the cache holds more than its cap.
  void give(void* p, size_t bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.emplace_back(bytes, p);
      held_ += bytes;
      while (held_ > cap_ && !free_.empty()) {
        held_ -= free_.front().first;
        drop.push_back(free_.front().second);
        free_.erase(free_.begin());
      }
    }
    for (void* q : drop) std::free(q);
  }
  bool enabled() const { return cap_ > 0; }

 private:
  // KGREASON_OUTPUT_CACHE_MB: the most memory kept in freed outputs (default 256; 0 turns the cache off).
  OutputCache() {
    const char* v = std::getenv("KGREASON_OUTPUT_CACHE_MB");
    long long mb = 256;
    if (v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long long parsed = std::strtoll(v, &end, 10);
      if (end != nullptr && *end == '\0' && parsed >= 0) mb = parsed;
    }
    cap_ = static_cast<size_t>(mb) << 20;
  }
  std::mutex mu_;
  std::vector<std::pair<size_t, void*>> free_;  // (bytes, block), oldest first
  size_t held_ = 0;
  size_t cap_ = 0;
};

// at::empty(sizes, opts) for a kernel's output; a CPU output of at least kCachedOutputBytes comes from (and
// returns to) the OutputCache.  Its storage is not resizable (as any from_blob tensor).
inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t numel = 1;
  for (const int64_t d : sizes) numel *= d;
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(opts.dtype()));
  OutputCache& cache = OutputCache::instance();
  if (opts.device().is_cpu() && bytes >= kCachedOutputBytes && cache.enabled()) {
    if (void* p = cache.take(bytes)) {
      return at::from_blob(p, sizes, [bytes](void* q) { OutputCache::instance().give(q, bytes); }, opts);
    }
  }
  return at::empty(sizes, opts);
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

// Independent accumulator chains per column in column_max.  Each entry's
// vector max depends on the previous entry's (vmaxps latency 4 cycles on
// Sapphire Rapids / Zen 4), so with one chain a T = 16 column advances one
// entry per 4 cycles whatever the width of the machine; U chains, entries
// dealt round-robin and merged at the end, keep U entries in flight.  Enough
// chains to have ~4 vectors in flight: U = 4 for one vector per entry (T = 16
// with AVX-512, T = 1), 2 for two, 1 beyond.  Measured single-threaded on
// Sapphire Rapids (FB15k-237's largest relation, 1.66M entries, B = 256,
// tile + pull + write, T = 16): 37.7 -> 31.6 ms with U = 4; with argmax (a
// compare and two blends per vector, a longer chain) 70.1 -> 39.3 ms.
template <int V>
constexpr int chains_for() {
  return V <= 1 ? 4 : V == 2 ? 2 : 1;
}

// Max over the entries k0..k1 of one CSC column of  xt[row[k]*T + t] * factor(val[k])
// for the T queries t of a tile, with argmax.  on_entry(i) is called for every
// support row, in ascending order (the negated kernel marks the support with it).
// Writes T values to out_v and, with ARG, T indices (-1 where the max is 0) to out_a.
//
// Ties: every chain sees its entries in ascending row order and replaces only
// on a strictly larger product, so it holds its own smallest maximising row;
// the merge takes the larger value and, on equal positive values, the smaller
// row.  The result is the smallest maximising i of the whole column, exactly
// as a single ascending scan with strict '>' (the reference's rule).
//
// PF > 0: prefetch the tile row of the entry PF positions ahead (up to row_end,
// the end of the whole CSC, so the next columns' first rows come in too).  For
// T = 32 the tile (1.9 MB for N = 14,505) shares a 2 MB L2 with the streaming
// supports and part of it is evicted: prefetching 16 entries ahead measured
// 12% faster on FB15k-237's largest relation (B = 256, 29.6 -> 26.0 ms).
template <int T, bool ARG, int PF = 0, typename idx_t, typename Factor, typename OnEntry>
inline void column_max(const float* xt, const idx_t* row, const float* val, int64_t k0, int64_t k1, Factor factor,
                       OnEntry on_entry, float* out_v, int32_t* out_a, const idx_t* row_end = nullptr) {
  if constexpr (T % kVecFloats == 0) {
    constexpr int V = T / kVecFloats;
    constexpr int U = chains_for<V>();
    vfloat acc[U][V];
    vint arg[U][V];
    for (int u = 0; u < U; ++u)
      for (int w = 0; w < V; ++w) {
        acc[u][w] = vfloat{};
        arg[u][w] = vint{} - 1;
      }
    auto step = [&](int u, int64_t k) __attribute__((always_inline)) {
      if constexpr (PF > 0) {
        const idx_t* ahead = row + k + PF;
        if (ahead < row_end) {
          const char* line = reinterpret_cast<const char*>(xt + static_cast<int64_t>(*ahead) * T);
          for (int b = 0; b < T * static_cast<int>(sizeof(float)); b += 64) __builtin_prefetch(line + b, 0, 3);
        }
      }
      const int64_t i = static_cast<int64_t>(row[k]);
      on_entry(i);
      const float f = factor(val[k]);
      const float* xr = xt + i * T;
      for (int w = 0; w < V; ++w) {
        vfloat x;
        std::memcpy(&x, xr + w * kVecFloats, sizeof(x));
        const vfloat p = x * f;
        if constexpr (ARG) {
          const vint better = p > acc[u][w];
          arg[u][w] = better ? (vint{} + static_cast<int32_t>(i)) : arg[u][w];
          acc[u][w] = better ? p : acc[u][w];
        } else {
          acc[u][w] = p > acc[u][w] ? p : acc[u][w];
        }
      }
    };
    int64_t k = k0;
    for (; k + U <= k1; k += U)
      for (int u = 0; u < U; ++u) step(u, k + u);
    for (; k < k1; ++k) step(0, k);  // the tail's rows are above all of chain 0's: still ascending
    for (int u = 1; u < U; ++u)
      for (int w = 0; w < V; ++w) {
        if constexpr (ARG) {
          const vint gt = acc[u][w] > acc[0][w];
          const vint take = gt | ((acc[u][w] == acc[0][w]) & (acc[u][w] > vfloat{}) & (arg[u][w] < arg[0][w]));
          arg[0][w] = take ? arg[u][w] : arg[0][w];
          acc[0][w] = gt ? acc[u][w] : acc[0][w];
        } else {
          acc[0][w] = acc[u][w] > acc[0][w] ? acc[u][w] : acc[0][w];
        }
      }
    for (int w = 0; w < V; ++w) {
      std::memcpy(out_v + w * kVecFloats, &acc[0][w], sizeof(acc[0][w]));
      if constexpr (ARG) std::memcpy(out_a + w * kVecFloats, &arg[0][w], sizeof(arg[0][w]));
    }
  } else {
    constexpr int U = T == 1 ? 4 : 1;
    float acc[U][T];
    int32_t arg[U][T];
    for (int u = 0; u < U; ++u)
      for (int t = 0; t < T; ++t) {
        acc[u][t] = 0.f;
        arg[u][t] = -1;
      }
    auto step = [&](int u, int64_t k) __attribute__((always_inline)) {
      const int64_t i = static_cast<int64_t>(row[k]);
      on_entry(i);
      const float f = factor(val[k]);
      const float* xr = xt + i * T;
      for (int t = 0; t < T; ++t) {
        const float p = xr[t] * f;
        if (p > acc[u][t]) {
          acc[u][t] = p;
          if constexpr (ARG) arg[u][t] = static_cast<int32_t>(i);
        }
      }
    };
    int64_t k = k0;
    for (; k + U <= k1; k += U)
      for (int u = 0; u < U; ++u) step(u, k + u);
    for (; k < k1; ++k) step(0, k);
    for (int u = 1; u < U; ++u)
      for (int t = 0; t < T; ++t) {
        if (acc[u][t] > acc[0][t] || (ARG && acc[u][t] == acc[0][t] && acc[u][t] > 0.f && arg[u][t] < arg[0][t])) {
          acc[0][t] = acc[u][t];
          arg[0][t] = arg[u][t];
        }
      }
    for (int t = 0; t < T; ++t) out_v[t] = acc[0][t];
    if constexpr (ARG)
      for (int t = 0; t < T; ++t) out_a[t] = arg[0][t];
  }
}

#if defined(__AVX512F__)
// In-register transpose of a 16 x 16 float block: r[c][t] = in[t][c].
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4i + k] now holds, in 128-bit lane L, rows 4i..4i+3 of column 4L + k
  for (int k = 0; k < 4; ++k) {
    const __m512 ab_lo = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 ab_hi = _mm512_shuffle_f32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 cd_lo = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 cd_hi = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
    t[k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(2, 0, 2, 0));
    t[8 + k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, _MM_SHUFFLE(3, 1, 3, 1));
    t[4 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}
#endif

// One tile of the batch-minor layout: xt[i*T + t] = X[rows[t]*N + i] for the
// entities i in [i0, i1) and the tile's nb (<= T) rows, 0 for t in [nb, T).
// With AVX-512 in 16 x 16 blocks transposed in registers (16 row loads, 16
// aligned 64-byte stores, 64 shuffles): 1.4 ms for a batch of 256 x 14,505
// (16 tiles of 16) against 3.2 ms for the scalar blocked copy below (single
// thread, about the cost of a plain copy of X).  xt must be 64-byte aligned.
template <int T>
void transpose_rows(const float* X, int64_t N, const int64_t* rows, int64_t nb, int64_t i0, int64_t i1, float* xt) {
#if defined(__AVX512F__)
  if constexpr (T % 16 == 0) {
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      const int64_t live = std::max<int64_t>(0, std::min<int64_t>(16, nb - t0));
      for (int64_t ib = i0; ib < i1; ib += 16) {
        const int64_t len = std::min<int64_t>(16, i1 - ib);
        const __mmask16 m = static_cast<__mmask16>((1u << len) - 1u);
        __m512 r[16];
        for (int64_t t = 0; t < 16; ++t)
          r[t] = t < live ? _mm512_maskz_loadu_ps(m, X + rows[t0 + t] * N + ib) : _mm512_setzero_ps();
        transpose16(r);
        for (int64_t c = 0; c < len; ++c) _mm512_store_ps(xt + (ib + c) * T + t0, r[c]);
      }
    }
    return;
  }
#endif
  constexpr int64_t kBlock = 64;  // 64 entities x T floats stay in L1 while written
  for (int64_t ib = i0; ib < i1; ib += kBlock) {
    const int64_t ie = std::min(i1, ib + kBlock);
    for (int64_t t = 0; t < T; ++t) {
      if (t < nb) {
        const float* src = X + rows[t] * N;
        for (int64_t i = ib; i < ie; ++i) xt[i * T + t] = src[i];
      } else {
        for (int64_t i = ib; i < ie; ++i) xt[i * T + t] = 0.f;
      }
    }
  }
}

// Writes a block of nc (<= 16) consecutive output columns jb.. of one tile
// back to the batch-major Y (and A): buf[c*T + t] is the value of column jb + c
// for row rows[t] (t < nb).  With AVX-512, 16 x 16 register transposes and one
// masked 64-byte store per output row instead of 16 scalar strided copies.
template <int T, bool ARG>
inline void store_rows(const float* ybuf, const int32_t* abuf, int64_t nc, int64_t N, const int64_t* rows, int64_t nb,
                       int64_t jb, float* Y, int32_t* A) {
#if defined(__AVX512F__)
  if constexpr (T % 16 == 0) {
    const __mmask16 m = static_cast<__mmask16>((1u << nc) - 1u);
    for (int64_t t0 = 0; t0 < nb; t0 += 16) {
      const int64_t live = std::min<int64_t>(16, nb - t0);
      __m512 r[16];
      for (int64_t c = 0; c < 16; ++c) r[c] = c < nc ? _mm512_load_ps(ybuf + c * T + t0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t t = 0; t < live; ++t) _mm512_mask_storeu_ps(Y + rows[t0 + t] * N + jb, m, r[t]);
      if constexpr (ARG) {
        for (int64_t c = 0; c < 16; ++c)
          r[c] = c < nc ? _mm512_castsi512_ps(_mm512_load_si512(abuf + c * T + t0)) : _mm512_setzero_ps();
        transpose16(r);
        for (int64_t t = 0; t < live; ++t)
          _mm512_mask_storeu_epi32(A + rows[t0 + t] * N + jb, m, _mm512_castps_si512(r[t]));
      }
    }
    return;
  }
#endif
  for (int64_t t = 0; t < nb; ++t) {
    float* y = Y + rows[t] * N + jb;
    for (int64_t c = 0; c < nc; ++c) y[c] = ybuf[c * T + t];
    if constexpr (ARG) {
      int32_t* a = A + rows[t] * N + jb;
      for (int64_t c = 0; c < nc; ++c) a[c] = abuf[c * T + t];
    }
  }
}

// A per-thread scratch buffer of at least n floats, 64-byte aligned, kept
// between calls (grow-only) when n <= kCachedScratchFloats: the tile copies are
// re-made on every call, and a fresh multi-megabyte allocation page-faults in
// every page again (glibc returns large blocks to the OS when freed).  Larger
// requests get a buffer of their own, freed with the object.  One user per
// thread at a time (the kernels use it only inside one call).
constexpr size_t kCachedScratchFloats = size_t(4) << 20;  // 16 MiB

class ThreadScratch {
 public:
  explicit ThreadScratch(size_t n) {
    if (n > kCachedScratchFloats) {
      own_ = std::make_unique<AlignedFloats>(n);
      ptr_ = own_->data();
      return;
    }
    thread_local std::unique_ptr<AlignedFloats> cache;
    thread_local size_t capacity = 0;
    if (capacity < n || !cache) {
      cache = std::make_unique<AlignedFloats>(std::max<size_t>(n, 1));
      capacity = std::max<size_t>(n, 1);
    }
    ptr_ = cache->data();
  }
  float* data() { return ptr_; }

 private:
  std::unique_ptr<AlignedFloats> own_;
  float* ptr_ = nullptr;
};

}  // namespace detail
}  // namespace cpu
}  // namespace kgreason
