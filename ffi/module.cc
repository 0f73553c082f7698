// The Python extension: hands the FFI handlers to jax_gemm_amax._ffi as capsules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/ffi_problem.h"
#include "xla/ffi/api/c_api.h"
#if JGA_WITH_CUDA
#include "cuda/arch.h"
#include "cuda/skinny/skinny.h"
#include "cuda/sm90/gemm_amax_sm90.h"
#endif

namespace nb = nanobind;

extern "C" XLA_FFI_Error* JgaGemmAmaxCpu(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaGemmAmaxWeightOnlyCpu(XLA_FFI_CallFrame* call_frame);
#if JGA_WITH_CUDA
extern "C" XLA_FFI_Error* JgaGemmAmaxCuda(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaGemmAmaxCudaInstantiate(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaGemmAmaxWeightOnlyCuda(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaQuantizeCuda(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_Error* JgaQuantizeCudaInstantiate(XLA_FFI_CallFrame* call_frame);
extern "C" XLA_FFI_TypeId* JgaCallSiteStateTypeId();
extern "C" const XLA_FFI_TypeInfo* JgaCallSiteStateTypeInfo();
#endif

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// A problem of the host-side rules, its dtypes named as numpy does; C is f32 (its type changes no
// rule asked here) and the tuning hints are the defaults.
jga::GemmAmaxProblem HostProblem(int64_t batch, int64_t m, int64_t n, int64_t k, const std::string& operand_dtype,
                                 const std::string& scale_dtype, int32_t sf_vec_size) {
  jga::GemmAmaxProblem p;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  xla::ffi::Error error = jga::OperandTypeNamed(operand_dtype, &p.ab_type);
  if (error.success()) error = jga::ScaleTypeNamed(scale_dtype, &p.sf_type);
  if (error.failure()) throw std::invalid_argument(error.message());
  p.sf_vec_size = sf_vec_size;
  p.c_type = jga::OutputType::kF32;
  return p;
}

}  // namespace

NB_MODULE(_jax_gemm_amax, m) {
  m.def("cpu_targets", []() {
    nb::dict targets;
    targets["jax_gemm_amax_cpu"] = Capsule(JgaGemmAmaxCpu);
    targets["jax_gemm_amax_weight_only_cpu"] = Capsule(JgaGemmAmaxWeightOnlyCpu);
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
    nb::dict weight_only_stages;  // the same instantiate stage and call-site state
    weight_only_stages["instantiate"] = Capsule(JgaGemmAmaxCudaInstantiate);
    weight_only_stages["execute"] = Capsule(JgaGemmAmaxWeightOnlyCuda);
    targets["jax_gemm_amax_weight_only_cuda"] = weight_only_stages;
    nb::dict quantize_stages;
    quantize_stages["instantiate"] = Capsule(JgaQuantizeCudaInstantiate);
    quantize_stages["execute"] = Capsule(JgaQuantizeCuda);
    targets["jax_gemm_amax_quantize_cuda"] = quantize_stages;
#endif
    return targets;
  });
  m.attr("built_with_cuda") = bool(JGA_WITH_CUDA);
  // The device workspace a call is offered (the JAX lowering sizes the custom call's workspace
  // result with it): the rule of the current GPU's architecture or, without a usable GPU, the
  // largest over the architectures built; 0 without CUDA. No GPU needed.
  m.def("workspace_bytes",
        [](int64_t batch, int64_t m, int64_t n, int64_t k, const std::string& operand_dtype,
           const std::string& scale_dtype, int32_t sf_vec_size, bool offer_copies) -> size_t {
          const jga::GemmAmaxProblem p = HostProblem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size);
#if JGA_WITH_CUDA
          return jga::CudaWorkspaceBytes(p, offer_copies);
#else
    (void)p;
    (void)offer_copies;
    return 0;
#endif
        });
  // Weight-only calls: the workspace of the kernel the CUDA handler runs the problem on (arch.h,
  // WeightOnlyRouteFor: the current GPU, or without one the few-row kernel that every GPU the build
  // has kernels for runs), -1 where none does (the JAX lowering then goes through XLA) or without CUDA.
  // The kernel that route names (as sm90_plan's "kernel": "sm90", "skinny"), or "xla".
  m.def("weight_only_kernel",
        [](int64_t batch, int64_t m, int64_t n, int64_t k, const std::string& activation_dtype,
           const std::string& operand_dtype, const std::string& scale_dtype,
           int32_t sf_vec_size) -> std::pair<int64_t, std::string> {
          jga::GemmAmaxProblem p = HostProblem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size);
          if (activation_dtype == "bfloat16") p.a_type = jga::ActivationType::kBF16;
          else if (activation_dtype == "float16") p.a_type = jga::ActivationType::kF16;
          else
            throw std::invalid_argument("weight-only activations must be bfloat16 or float16, got " + activation_dtype);
#if JGA_WITH_CUDA
          jga::WeightOnlyRoute route = jga::WeightOnlyRoute::kNone;
          const int64_t bytes = static_cast<int64_t>(jga::WeightOnlyWorkspaceBytes(p, &route));
          return {bytes, route == jga::WeightOnlyRoute::kGemm      ? "sm90"
                         : route == jga::WeightOnlyRoute::kFewRows ? "skinny"
                                                                   : "xla"};
#else
    return {-1, "xla"};
#endif
        });
#if JGA_WITH_CUDA
  // For tests: the plan the SM90 kernel picks with a given workspace on the current device (sms > 0:
  // a GPU with that many SMs, no device needed); raises unless the kernel takes the problem.
  m.def("sm90_plan", [](int64_t batch, int64_t m, int64_t n, int64_t k, const std::string& operand_dtype,
                        const std::string& scale_dtype, int32_t sf_vec_size, size_t workspace_bytes, int32_t sms) {
    const jga::GemmAmaxProblem p = HostProblem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size);
    if (const char* why = jga::sm90::Unsupported(p)) throw std::invalid_argument(why);
    jga::sm90::PlanInfo info;
    const cudaError_t err = jga::sm90::PlanFor(p, workspace_bytes, &info, sms);
    if (err != cudaSuccess) throw std::runtime_error(std::string("sm90_plan: ") + cudaGetErrorString(err));
    nb::dict plan;
    plan["tile_m"] = info.tile_m;
    plan["splits"] = info.splits;
    plan["whole_tiles"] = info.whole_tiles;
    plan["preconvert_a"] = info.preconvert_a;
    plan["preconvert_b"] = info.preconvert_b;
    // Which kernel the handler runs on a GPU of compute capability 9.0: the few-row kernel where it
    // accepts the problem (then with its own plan), else the sm_90 kernel with the plan above.
    plan["kernel"] = jga::skinny::Accepts(p) ? "skinny" : "sm90";
    if (jga::skinny::Accepts(p)) {
      jga::skinny::PlanInfo few;
      const cudaError_t e = jga::skinny::PlanFor(p, workspace_bytes, &few, sms);
      if (e != cudaSuccess)
        throw std::runtime_error(std::string("sm90_plan (few-row kernel): ") + cudaGetErrorString(e));
      plan["skinny_tokens"] = few.tokens;
      plan["skinny_splits"] = few.splits;
      plan["skinny_grid"] = few.grid;
    }
    return plan;
  });
#endif
}
