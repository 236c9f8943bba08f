// CPU kernels of kgreason::project (declarations; schema in csrc/project.cpp, definitions in
// cpu/project_cpu.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

namespace kgreason {
namespace cpu {

// Y[b,j] = max_i X[b,i] * M_{rel[b]}[i,j] (or, negated, X[b,i] * (1 - min(1, s * M_{rel[b]}[i,j])), factor 1
// where M has no entry) over the stacked (R*N, N) CSR (crow, col, val) and its stacked transpose
// (tcrow, trow, tval): row r*N + j of the transpose holds column j of M_r, rows ascending.
// Returns (Y (B,N) float32, argmax (B,N) int32 or empty).
std::tuple<at::Tensor, at::Tensor> project_cpu(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow,
                                               const at::Tensor& col, const at::Tensor& val, const at::Tensor& tcrow,
                                               const at::Tensor& trow, const at::Tensor& tval, int64_t num_entities,
                                               int64_t strategy, bool negated, double neg_scale, bool want_argmax);

// project into preallocated outputs: y (B,N) float32 and argmax (B,N) int32, or an empty argmax
// for values only; contiguous, on X's device, not overlapping X.
void project_out_cpu(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow, const at::Tensor& col,
                     const at::Tensor& val, const at::Tensor& tcrow, const at::Tensor& trow, const at::Tensor& tval,
                     int64_t num_entities, int64_t strategy, bool negated, double neg_scale, at::Tensor& y,
                     at::Tensor& argmax);

// The plan kAuto picks for each row, (B,) int32: kPush (1), kPull (2) or 3 (sweep: push through M_r's entries).
at::Tensor project_strategy_cpu(const at::Tensor& x, const at::Tensor& rel, const at::Tensor& crow,
                                int64_t num_entities);

}  // namespace cpu
}  // namespace kgreason
