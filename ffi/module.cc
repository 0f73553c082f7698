// The Python extension: hands the FFI handlers to jax_gemm_amax._ffi as capsules.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "xla/ffi/api/c_api.h"
#if JGA_WITH_CUDA
#include "cuda/sm90/gemm_amax_sm90.h"
#endif

namespace nb = nanobind;

extern "C" XLA_FFI_Error* JgaGemmAmaxCpu(XLA_FFI_CallFrame* call_frame);
#if JGA_WITH_CUDA
extern "C" XLA_FFI_Error* JgaGemmAmaxCuda(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaGemmAmaxCudaInstantiate(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_TypeId* JgaCallSiteStateTypeId();
extern "C" const XLA_FFI_TypeInfo* JgaCallSiteStateTypeInfo();
#endif

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

#if JGA_WITH_CUDA
// C is f32 (its type changes neither rule); require_supported: raise unless the kernel takes the problem.
jga::GemmAmaxProblem Sm90Problem(int64_t batch, int64_t m, int64_t n, int64_t k, int32_t ab_type, int32_t sf_type,
                                 int32_t sf_vec_size, bool require_supported) {
  jga::GemmAmaxProblem p;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.ab_type = static_cast<jga::OperandType>(ab_type);
  p.sf_type = static_cast<jga::ScaleType>(sf_type);
  p.sf_vec_size = sf_vec_size;
  p.c_type = jga::OutputType::kF32;
  if (const char* why = require_supported ? jga::sm90::Unsupported(p) : nullptr) throw std::invalid_argument(why);
  return p;
}
#endif

}  // namespace

NB_MODULE(_jax_gemm_amax, m) {
  m.def("cpu_targets", []() {
    nb::dict targets;
    targets["jax_gemm_amax_cpu"] = Capsule(JgaGemmAmaxCpu);
    return targets;
  });
  m.def("cuda_types", []() {
    nb::dict types;
#if JGA_WITH_CUDA
    // The CUDA handler's per-call-site state (made by its instantiate stage).
    nb::dict registration;
    registration["type_id"] = nb::capsule(static_cast<void*>(JgaCallSiteStateTypeId()));
    registration["type_info"] = nb::capsule(const_cast<void*>(static_cast<const void*>(JgaCallSiteStateTypeInfo())));
    types["jax_gemm_amax_cuda_call_site"] = registration;
#endif
    return types;
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
#if JGA_WITH_CUDA
  // The SM90 kernel's host-side rules: the workspace a call is offered (the JAX lowering sizes the
  // custom call's workspace result with it; host arithmetic, no GPU needed) and, for tests, the plan
  // the current device picks with a given workspace (sms > 0: a GPU with that many SMs, no device
  // needed). Types as in common/problem.h (OperandType, ScaleType).
  m.def("sm90_workspace_bytes", [](int64_t batch, int64_t m, int64_t n, int64_t k, int32_t ab_type, int32_t sf_type,
                                   int32_t sf_vec_size, bool offer_copies) {
    return jga::sm90::WorkspaceBytes(Sm90Problem(batch, m, n, k, ab_type, sf_type, sf_vec_size, false), offer_copies);
  });
  m.def("sm90_plan", [](int64_t batch, int64_t m, int64_t n, int64_t k, int32_t ab_type, int32_t sf_type,
                        int32_t sf_vec_size, size_t workspace_bytes, int32_t sms) {
    jga::sm90::PlanInfo info;
    const cudaError_t err = jga::sm90::PlanFor(Sm90Problem(batch, m, n, k, ab_type, sf_type, sf_vec_size, true),
                                               workspace_bytes, &info, sms);
    if (err != cudaSuccess) throw std::runtime_error(std::string("sm90_plan: ") + cudaGetErrorString(err));
    nb::dict plan;
    plan["tile_m"] = info.tile_m;
    plan["splits"] = info.splits;
    plan["whole_tiles"] = info.whole_tiles;
    plan["preconvert_a"] = info.preconvert_a;
    plan["preconvert_b"] = info.preconvert_b;
    return plan;
  });
#endif
}
