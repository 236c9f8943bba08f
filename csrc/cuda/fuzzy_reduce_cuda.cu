// CUDA kernel of kgreason::fuzzy_reduce (fused k-ary intersection / union):
// one grid-stride pass reading up to kMaxInputs inputs per launch (passed by
// value in a struct, so no pointer array has to be copied to the device);
// longer lists fold the partial result in as the first input of the next launch.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "fuzzy_cuda_common.cuh"

namespace kgreason {
namespace cuda {
namespace {

constexpr int kMaxInputs = 8;

struct Inputs {
  const float* p[kMaxInputs];
  int k;
};

__global__ void reduce_kernel(Inputs in, int64_t n, int op, bool complemented_first, float* __restrict__ out) {
  for (int64_t e = grid_first(); e < n; e += grid_step()) {
    float acc = in.p[0][e];
    if (op == 2 && !complemented_first) acc = 1.f - acc;  // running prod(1 - x)
    for (int m = 1; m < in.k; ++m) {
      const float v = in.p[m][e];
      switch (op) {
        case 0: acc *= v; break;
        case 1: acc = fminf(acc, v); break;
        case 2: acc *= 1.f - v; break;
        default: acc = fmaxf(acc, v); break;
      }
    }
    out[e] = acc;
  }
}

__global__ void complement_kernel(float* __restrict__ x, int64_t n) {
  for (int64_t e = grid_first(); e < n; e += grid_step())
    x[e] = 1.f - x[e];
}

at::Tensor fuzzy_reduce_cuda(at::TensorList xs_in, int64_t op) {
  TORCH_CHECK(!xs_in.empty(), "kgreason::fuzzy_reduce: needs at least one tensor");
  TORCH_CHECK(op >= 0 && op <= 3, "kgreason::fuzzy_reduce: op must be 0..3, got ", op);
  const c10::DeviceGuard guard(xs_in[0].device());
  std::vector<at::Tensor> xs;
  for (const auto& x : xs_in) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.sizes() == xs_in[0].sizes() &&
                    x.device() == xs_in[0].device(),
                "kgreason::fuzzy_reduce: inputs must be float32 CUDA tensors of one shape on one device");
    xs.push_back(x.contiguous());
  }
  at::Tensor out = at::empty(xs[0].sizes(), xs[0].options());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const cudaStream_t stream = current_stream(out.device());
  const int64_t grid = blocks_for(n, kThreads);
  size_t next = 0;
  bool first = true;
  while (next < xs.size()) {
    Inputs in{};
    in.k = 0;
    if (!first) in.p[in.k++] = out.data_ptr<float>();  // partial result (prod(1-x) for op 2)
    while (in.k < kMaxInputs && next < xs.size()) in.p[in.k++] = xs[next++].data_ptr<float>();
    reduce_kernel<<<grid, kThreads, 0, stream>>>(in, n, static_cast<int>(op), !first, out.data_ptr<float>());
    check_launch("fuzzy_reduce");
    first = false;
  }
  if (op == 2) {
    complement_kernel<<<grid, kThreads, 0, stream>>>(out.data_ptr<float>(), n);
    check_launch("fuzzy_reduce complement");
  }
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace kgreason

TORCH_LIBRARY_IMPL(kgreason, CUDA, m) { m.impl("fuzzy_reduce", &kgreason::cuda::fuzzy_reduce_cuda); }
