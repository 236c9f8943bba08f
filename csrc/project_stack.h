// The stacked relation matrices as the kgreason::project kernels read them, shared by the CPU
// (cpu/project_cpu.cpp) and CUDA (cuda/project_cuda.cu) kernels: R matrices M_r (N x N) stacked as
// one (R*N, N) CSR, row r*N + i holding M_r[i,:], and its stacked transpose, row r*N + j holding
// M_r[:,j] with rows ascending (ops.StackedMatrices).  Plain pointers, so a kernel takes it by value.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KGREASON_HOST_DEVICE __host__ __device__
#else
#define KGREASON_HOST_DEVICE
#endif

namespace kgreason {

// Strategy codes of the schema (ops.STRATEGIES) and the per-row plans project_strategy reports.
constexpr int64_t kStrategyAuto = 0;
constexpr int64_t kStrategyPush = 1;
constexpr int64_t kStrategyPull = 2;
constexpr int64_t kStrategySweep = 3;  // a plan of the CPU kernel only

template <typename ptr_t, typename idx_t>
struct Stack {
  int64_t N;
  const ptr_t* crow;   // (R*N+1,)
  const idx_t* col;    // (nnz,)
  const float* val;    // (nnz,)
  const ptr_t* tcrow;  // (R*N+1,)
  const idx_t* trow;   // (nnz,)
  const float* tval;   // (nnz,)
  // Entries of M_r.
  KGREASON_HOST_DEVICE int64_t nnz_of(int64_t r) const {
    return static_cast<int64_t>(crow[(r + 1) * N]) - static_cast<int64_t>(crow[r * N]);
  }
};

}  // namespace kgreason
