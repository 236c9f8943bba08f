// What the kgreason::project kernels of every device share (header-only, internal): the stacked
// relation matrices as the kernels read them, the strategy codes, and the checks of the arguments
// (the messages are the same whichever kernel raises them).  R matrices M_r (N x N) are stacked as
// one (R*N, N) CSR, row r*N + i holding M_r[i,:], with its stacked transpose, row r*N + j holding
// M_r[:,j] with rows ascending (ops.StackedMatrices).  Schemas: csrc/project.cpp.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <cmath>
#include <cstdint>
#include <vector>

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

// The stack as plain pointers, so that a kernel takes it by value.
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

namespace project_checks {

inline bool is_index(const at::Tensor& t) { return t.scalar_type() == at::kInt || t.scalar_type() == at::kLong; }

// X (B, N) float32 on a `type` device, rel (B,) and the pointers crow (R*N+1,), int32/int64, on X's
// device: what every op reads (project_strategy nothing more).  Returns R.
inline int64_t rows(const char* op, const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, int64_t N,
                    c10::DeviceType type) {
  TORCH_CHECK(x.device().type() == type, op, ": X must be a ", c10::DeviceTypeName(type, true), " tensor, got ",
              x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": X must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2, op, ": X must be 2-D (B, N), got ", x.dim(), "-D");
  TORCH_CHECK(N >= 1 && N <= INT32_MAX, op, ": num_entities must be in [1, 2^31) (argmax is int32), got ", N);
  TORCH_CHECK(x.size(1) == N, op, ": X must have N = ", N, " columns, got shape ", x.sizes());
  TORCH_CHECK(rel.device() == x.device() && crow.device() == x.device(), op, ": rel and crow must be on X's device ",
              x.device(), ", got ", rel.device(), " and ", crow.device());
  TORCH_CHECK(is_index(rel), op, ": rel must be int32 or int64, got ", rel.scalar_type());
  TORCH_CHECK(rel.dim() == 1 && rel.numel() == x.size(0), op, ": rel must have shape (B,) = (", x.size(0),
              ",), got ", rel.sizes());
  TORCH_CHECK(is_index(crow), op, ": crow must be int32 or int64, got ", crow.scalar_type());
  TORCH_CHECK(crow.dim() == 1 && crow.numel() >= 1 && (crow.numel() - 1) % N == 0, op,
              ": crow must have R*N+1 entries for N = ", N, ", got ", crow.numel());
  return (crow.numel() - 1) / N;
}

// The rest of the stack (dtypes, sizes, X's device), strategy and neg_scale.  Returns nnz.
inline int64_t matrix(const char* op, const at::Tensor& x, const at::Tensor& crow, const at::Tensor& col,
                      const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow, const at::Tensor& tval,
                      int64_t strategy, double neg_scale) {
  TORCH_CHECK(strategy == kStrategyAuto || strategy == kStrategyPush || strategy == kStrategyPull, op,
              ": strategy must be 0 (auto), 1 (push) or 2 (pull), got ", strategy);
  TORCH_CHECK(neg_scale >= 0.0 && std::isfinite(neg_scale), op, ": neg_scale must be finite and >= 0, got ",
              neg_scale);
  TORCH_CHECK(tcrow.scalar_type() == crow.scalar_type() && tcrow.numel() == crow.numel(), op,
              ": tcrow must match crow (dtype ", crow.scalar_type(), ", ", crow.numel(), " entries), got ",
              tcrow.scalar_type(), ", ", tcrow.numel());
  TORCH_CHECK(is_index(col), op, ": col must be int32 or int64, got ", col.scalar_type());
  TORCH_CHECK(trow.scalar_type() == col.scalar_type(), op, ": trow dtype ", trow.scalar_type(), " differs from col's ",
              col.scalar_type());
  TORCH_CHECK(val.scalar_type() == at::kFloat && tval.scalar_type() == at::kFloat, op,
              ": val and tval must be float32");
  const int64_t nnz = val.numel();
  TORCH_CHECK(col.numel() == nnz && trow.numel() == nnz && tval.numel() == nnz, op,
              ": col, val, trow and tval must have nnz entries each, got ", col.numel(), ", ", nnz, ", ",
              trow.numel(), ", ", tval.numel());
  for (const at::Tensor* t : {&col, &val, &tcrow, &trow, &tval})
    TORCH_CHECK(t->device() == x.device(), op, ": every matrix tensor must be on X's device ", x.device(), ", got ",
                t->device());
  return nnz;
}

// What only the data tells, since an id or a pointer out of range would read outside the stack: every
// rel in [0, R) and, unless tcrow is null, crow and tcrow ending at nnz.  rel int64, crow and tcrow
// contiguous.  On a GPU one device sync (the extremes and the pointer ends copied together); the
// first bad id is looked for only to word the error.
inline void ranges(const char* op, const at::Tensor& rel, int64_t R, const at::Tensor& crow, const at::Tensor* tcrow,
                   int64_t nnz) {
  int64_t lo = 0, hi = -1, end = nnz, tend = nnz;
  if (rel.is_cpu()) {
    const int64_t* r = rel.data_ptr<int64_t>();
    for (int64_t b = 0; b < rel.numel(); ++b) {
      lo = b == 0 || r[b] < lo ? r[b] : lo;
      hi = b == 0 || r[b] > hi ? r[b] : hi;
    }
    const auto last_cpu = [](const at::Tensor& p) {
      return p.scalar_type() == at::kInt ? static_cast<int64_t>(p.data_ptr<int32_t>()[p.numel() - 1])
                                         : p.data_ptr<int64_t>()[p.numel() - 1];
    };
    if (tcrow != nullptr) {
      end = last_cpu(crow);
      tend = last_cpu(*tcrow);
    }
  } else {
    const auto last = [](const at::Tensor& p) { return p.narrow(0, p.numel() - 1, 1).to(at::kLong); };
    std::vector<at::Tensor> parts{at::zeros({0}, rel.options())};
    if (rel.numel() > 0) {
      const auto [mn, mx] = at::aminmax(rel);
      parts = {mn.view({1}), mx.view({1})};
    }
    if (tcrow != nullptr) parts.insert(parts.end(), {last(crow), last(*tcrow)});
    const at::Tensor h = at::cat(parts).cpu();
    const int64_t* v = h.data_ptr<int64_t>();
    const int64_t k = rel.numel() > 0 ? 2 : 0;
    if (k) lo = v[0], hi = v[1];
    if (tcrow != nullptr) end = v[k], tend = v[k + 1];
  }
  if (rel.numel() > 0 && (lo < 0 || hi >= R)) {
    const int64_t b = ((rel < 0) | (rel >= R)).nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, op, ": rel[", b, "] = ", rel[b].item<int64_t>(), " is out of range [0, ", R, ")");
  }
  TORCH_CHECK(end == nnz && tend == nnz, op, ": crow and tcrow must end at nnz = ", nnz, ", got ", end, " and ",
              tend);
}

// The outputs of project_out: y (B,N) float32 and argmax (B,N) int32 or empty (values only);
// contiguous, on X's device, not overlapping X or each other.
inline void out(const char* op, const at::Tensor& x, const at::Tensor& y, const at::Tensor& a) {
  const int64_t B = x.size(0), N = x.size(1);
  TORCH_CHECK(y.device() == x.device(), op, ": out y must be on ", x.device(), ", got ", y.device());
  TORCH_CHECK(y.scalar_type() == at::kFloat, op, ": out y must be float32, got ", y.scalar_type());
  TORCH_CHECK(y.dim() == 2 && y.size(0) == B && y.size(1) == N, op, ": out y must have shape (", B, ", ", N,
              "), got ", y.sizes());
  TORCH_CHECK(y.is_contiguous(), op, ": out y must be contiguous");
  at::assert_no_overlap(y, x);
  if (a.numel() == 0) return;
  TORCH_CHECK(a.device() == x.device(), op, ": out argmax must be on ", x.device(), ", got ", a.device());
  TORCH_CHECK(a.scalar_type() == at::kInt, op, ": out argmax must be int32, got ", a.scalar_type());
  TORCH_CHECK(a.dim() == 2 && a.size(0) == B && a.size(1) == N, op, ": out argmax must have shape (", B, ", ", N,
              ") or be empty, got ", a.sizes());
  TORCH_CHECK(a.is_contiguous(), op, ": out argmax must be contiguous");
  at::assert_no_overlap(a, x);
  at::assert_no_overlap(a, y);
}

}  // namespace project_checks
}  // namespace kgreason
