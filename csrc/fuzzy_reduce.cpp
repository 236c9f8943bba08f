// Schema and CPU registration of kgreason::fuzzy_reduce, the fused k-ary
// fuzzy intersection / union.  Kernels: cpu/fuzzy_reduce_cpu.cpp,
// cuda/fuzzy_reduce_cuda.cu.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cpu/fuzzy_cpu.h"

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // op: 0 product t-norm, 1 Goedel (min), 2 probabilistic sum, 3 Goedel t-conorm (max).
  m.def("fuzzy_reduce(Tensor[] xs, int op) -> Tensor");
}

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("fuzzy_reduce", &kgreason::cpu::fuzzy_reduce_cpu); }
