// The Python extension: hands the FFI handlers to jax_gemm_amax._ffi as capsules.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

extern "C" XLA_FFI_Error* JgaGemmAmaxCpu(XLA_FFI_CallFrame* call_frame);
#if JGA_WITH_CUDA
extern "C" XLA_FFI_Error* JgaGemmAmaxCuda(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaGemmAmaxCudaInstantiate(XLA_FFI_CallFrame* call_frame);
#endif

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jax_gemm_amax, m) {
  m.def("cpu_targets", []() {
    nb::dict targets;
    targets["jax_gemm_amax_cpu"] = Capsule(JgaGemmAmaxCpu);
    return targets;
  });
  m.def("cuda_targets", []() {
    nb::dict targets;
#if JGA_WITH_CUDA
    // Per-stage handlers: instantiate loads the kernels outside CUDA-graph capture.
    nb::dict stages;
    stages["instantiate"] = Capsule(JgaGemmAmaxCudaInstantiate);
    stages["execute"] = Capsule(JgaGemmAmaxCuda);
    targets["jax_gemm_amax_cuda"] = stages;
#endif
    return targets;
  });
  m.attr("built_with_cuda") = bool(JGA_WITH_CUDA);
}
