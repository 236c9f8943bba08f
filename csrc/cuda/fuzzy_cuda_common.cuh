// Helpers shared by the CUDA kernels of the fuzzy-set ops (internal).
//
// Stream and device guard through the device-generic c10 API
// (c10/core/DeviceGuard.h, c10::Stream::native_handle()) instead of
// c10/cuda/CUDAStream.h / ATen/cuda/CUDAContext.h: the CPU torch wheel ships
// the c10/cuda headers but not the generated c10/cuda/impl/cuda_cmake_macros.h
// they include, so they do not compile there.  The generic route reaches the
// same CUDA guard implementation (registered by libc10_cuda at load time) and
// returns the same current stream, and it compiles against either wheel.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kgreason {
namespace cuda {

constexpr int kWarp = 32;
constexpr int kThreads = 256;

// The current CUDA stream of `device` (what at::cuda::getCurrentCUDAStream returns).
inline cudaStream_t current_stream(const c10::Device& device) {
  const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
  return static_cast<cudaStream_t>(s.native_handle());
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "kgreason: CUDA launch of ", what, " failed: ", cudaGetErrorString(err));
}

inline int64_t blocks_for(int64_t work, int64_t per_block, int64_t cap = 65535LL * 32) {
  int64_t b = (work + per_block - 1) / per_block;
  if (b < 1) b = 1;
  return b < cap ? b : cap;
}

// Grid-stride loops: `for (int64_t e = grid_first(); e < n; e += grid_step())` visits every e in [0, n)
// once whatever the grid size (blocks_for caps it); the warp forms give every warp one item (a column).
__device__ __forceinline__ int64_t grid_first() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
__device__ __forceinline__ int64_t warp_first() { return grid_first() / kWarp; }
__device__ __forceinline__ int64_t warp_step() { return grid_step() / kWarp; }

// Block-wide sum over kWarps warps (blockDim.x == kWarps * kWarp); every thread gets the total.
// red: kWarps elements of shared memory.  Starts with a __syncthreads, so red may be reused by
// consecutive calls.
template <typename T, int kWarps>
__device__ __forceinline__ T block_sum(T v, T* red) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  __syncthreads();
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = v;
  __syncthreads();
  T r = red[0];
  for (int i = 1; i < kWarps; ++i) r += red[i];
  return r;
}

// Non-negative floats order like their bit patterns read as unsigned ints, so
// a max of products in [0, 1] is an integer atomicMax.  With an argmax the
// value goes in the high word and the complemented index in the low word:
// a larger key is a larger value, then a smaller index (the tie rule).
__device__ __forceinline__ unsigned long long pack_value_index(float v, int64_t i) {
  return (static_cast<unsigned long long>(__float_as_uint(v)) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - static_cast<uint32_t>(i));
}

// The (value, argmax) a packed key holds: (0, -1) for a key never written (all zero).
__device__ __forceinline__ void unpack_value_index(unsigned long long key, float& v, int32_t& i) {
  const unsigned int hi = static_cast<unsigned int>(key >> 32);
  v = __uint_as_float(hi);
  i = hi == 0u ? -1 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

// (value desc, index asc) order: true when (v1, i1) beats (v2, i2).
__device__ __forceinline__ bool better(float v1, int32_t i1, float v2, int32_t i2) {
  return v1 > v2 || (v1 == v2 && v1 > 0.f && static_cast<uint32_t>(i1) < static_cast<uint32_t>(i2));
}

// Warp-wide arg-max by (value desc, index asc); every lane gets the result.
__device__ __forceinline__ void warp_best(float& v, int32_t& i) {
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const int32_t oi = __shfl_xor_sync(0xFFFFFFFFu, i, off);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

}  // namespace cuda
}  // namespace kgreason
