// CPU kernels of the sparse-row ops of ops/sparse_rows.py (declarations; schemas in
// csrc/project_multi_sparse.cpp and csrc/sparse_align.cpp, definitions in
// cpu/project_multi_sparse_cpu.cpp and cpu/sparse_align_cpu.cpp).
//
// A sparse batch is a (B, N) fuzzy batch in compressed-row form: crow int64 (B+1,),
// col int64 (nnz,) strictly ascending inside each row, val float32 (nnz,).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

namespace kgreason {
namespace cpu {

// Y[b,j] = max over stored (i, x) of row b with x > 0 of x * M_{rel[b]}[i,j], over the stacked (R*N, N)
// CSR (crow, col, val) (crow and col int32 or int64, independently).  Row b of the result holds every
// j reached (values may be 0 where the products are), ascending.
// Returns (crow int64 (B+1,), col int64 (nnz,), val float32 (nnz,)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_multi_sparse_cpu(
    const at::Tensor& xcrow, const at::Tensor& xcol, const at::Tensor& xval, const at::Tensor& rel,
    const at::Tensor& crow, const at::Tensor& col, const at::Tensor& val, int64_t num_entities);

// The support intersection (intersect) or union of k >= 1 sparse batches of B rows, and each input's
// value on it.  Returns (crow int64 (B+1,), col int64 (nnz,), vals float32 (k, nnz)); vals[m, e] is input
// m's stored value at entry e, 0 where it has none.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_align_cpu(at::TensorList crows, at::TensorList cols,
                                                                 at::TensorList vals, bool intersect);

}  // namespace cpu
}  // namespace kgreason
