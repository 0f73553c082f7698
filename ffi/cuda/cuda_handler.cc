// The XLA FFI handler of the CUDA platform: validates the call, then dispatches by the compute
// capability of the stream's device. Everything is enqueued on XLA's stream: no host sync, no
// allocation, the same device work on every call (CUDA-graph capturable).
//
// Device workspace is a third result of the custom call (sized by the JAX lowering through
// CudaWorkspaceBytes, arch.h), not FFI scratch: XLA frees a ScratchAllocator's memory when the
// handler returns, which is before a CUDA graph recorded from the call ever runs, so a graph replay
// would use memory that XLA may have handed to another buffer. A result buffer is XLA's, for as
// long as the executable lives.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <string>

#include "common/ffi_problem.h"
#include "cuda/arch.h"
#include "cuda/skinny/skinny.h"
#include "cuda/sm90/gemm_amax_sm90.h"
#if defined(JGA_HAVE_SM100)
#include "cuda/sm100/gemm_amax_sm100.h"
#endif

namespace jga {

// The state of one gemm_amax custom call (one per call site of an executable), made by the
// instantiate stage: the zeroing word per device (sm90::AllocResetWord) of the kernels that zero
// amax themselves (sm_90's, the few-row kernel). Two calls
// that XLA runs at the same time (concurrent command-buffer branches) must not share a word.
struct CallSiteState {
  static xla::ffi::TypeId id;
  std::array<unsigned int*, kMaxDevices> reset_word{};
  CallSiteState() = default;
  CallSiteState(const CallSiteState&) = delete;
  CallSiteState& operator=(const CallSiteState&) = delete;
  ~CallSiteState() {  // the executable is gone, and its graphs with it
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) return;
    for (int device = 0; device < kMaxDevices; ++device) {
      if (reset_word[device] == nullptr || cudaSetDevice(device) != cudaSuccess) continue;
      cudaFree(reset_word[device]);  // on the device that allocated it
    }
    cudaSetDevice(current);
  }
};
xla::ffi::TypeId CallSiteState::id = {};

namespace {

ffi::Error CudaError(cudaError_t err, const char* what) {
  return ffi::Error::Internal(std::string("gemm_amax: ") + what + ": " + cudaGetErrorName(err) + ": " +
                              cudaGetErrorString(err));
}

#if defined(JGA_HAVE_SM100)
constexpr const char* kBuiltKernels = "built kernels: sm_90a (H100/H200), sm_100a (B200/GB200)";

// Blackwell B200/GB200 (compute capability 10.0): the sm_100a CUTLASS kernels. The cubins are
// arch-specific (sm_100a), so other 10.x parts (e.g. B300, 10.3) are refused with a clear error.
ffi::Error LaunchSm100(const GemmAmaxProblem& problem, const GemmAmaxBuffers& buffers, cudaStream_t stream,
                       ffi::AnyBuffer& workspace_buffer) {
  if (const char* why = sm100::Unsupported(problem))
    return ffi::Error(ffi::ErrorCode::kUnimplemented, std::string("gemm_amax (sm_100): ") + why);
  void* workspace = nullptr;
  if (const size_t bytes = sm100::WorkspaceBytes(problem)) {
    if (workspace_buffer.size_bytes() < bytes)
      return ffi::Error::InvalidArgument("gemm_amax (sm_100): the workspace result holds " +
                                         std::to_string(workspace_buffer.size_bytes()) + " bytes, the kernel needs " +
                                         std::to_string(bytes));
    workspace = workspace_buffer.untyped_data();
  }
  const char* message = nullptr;
  const cudaError_t err = sm100::Launch(problem, buffers, workspace, stream, &message);
  if (err == cudaSuccess) return ffi::Error::Success();
  const std::string what = std::string("gemm_amax (sm_100): ") + (message ? message : "launch failed");
  if (err == cudaErrorNotSupported) return ffi::Error(ffi::ErrorCode::kUnimplemented, what);
  if (err == cudaErrorInvalidValue) return ffi::Error::InvalidArgument(what);
  return ffi::Error::Internal(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
#else
constexpr const char* kBuiltKernels = "built kernels: sm_90a (H100/H200); this build has no sm_100a kernels";
#endif

// One call, both forms: the few-row kernel where it takes the problem, else the architecture's
// GEMM (weight-only problems by WeightOnlyRouteFor, arch.h: the JAX lowering sends them here only
// where a kernel takes them).
ffi::Error Run(cudaStream_t stream, CallSiteState* state, const GemmAmaxProblem& problem,
               const GemmAmaxBuffers& buffers, ffi::AnyBuffer& workspace) {
  // XLA makes the stream's device current while it runs (or records) the call; unlike
  // cudaStreamGetDevice, cudaGetDevice is allowed while the stream is being captured.
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return CudaError(err, "finding the current device");
  int cc = 0;
  err = ComputeCapability(device, &cc);
  if (err != cudaSuccess) return CudaError(err, "querying the compute capability");

  // The call site's reset word on this device, which the few-row and sm_90 kernels' zeroing round uses.
  unsigned int* reset_word = device < kMaxDevices ? state->reset_word[device] : nullptr;
  auto no_reset_word = [&] {
    return ffi::Error::Internal("gemm_amax: no reset word for device " + std::to_string(device) +
                                " (the instantiate stage did not prepare it)");
  };

  // Few rows of A (skinny::Accepts): the memory-bound few-row kernel, built for every arch of the
  // build, which streams B once (skinny.h).
  const WeightOnlyRoute route =
      problem.weight_only() ? WeightOnlyRouteFor(problem, cc, workspace.size_bytes()) : WeightOnlyRoute::kNone;
  if (problem.weight_only() ? route == WeightOnlyRoute::kFewRows
                            : FewRowKernelBuiltFor(cc) && skinny::Accepts(problem)) {
    if (reset_word == nullptr) return no_reset_word();
    err = skinny::Launch(problem, buffers, workspace.untyped_data(), workspace.size_bytes(), stream, reset_word);
    if (err != cudaSuccess) return CudaError(err, "launching the few-row kernel");
    return ffi::Error::Success();
  }
  if (problem.weight_only() && route != WeightOnlyRoute::kGemm)
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "gemm_amax: this weight-only problem has no CUDA kernel (the few-row kernel takes M <= 128 "
                      "on compute capability 9.0 or 10.0, the sm_90 GEMM a bfloat16 A of more rows with the "
                      "workspace it asks for); the JAX lowering runs such calls through XLA");
  if (cc == 90) {
    if (const char* why = sm90::Unsupported(problem))
      return ffi::Error(ffi::ErrorCode::kUnimplemented, std::string("gemm_amax (sm_90): ") + why);
    if (reset_word == nullptr) return no_reset_word();
    err = sm90::Launch(problem, buffers, workspace.untyped_data(), workspace.size_bytes(), stream, reset_word);
    if (err != cudaSuccess) return CudaError(err, "launching the sm_90 kernel");
    return ffi::Error::Success();
  }
#if defined(JGA_HAVE_SM100)
  if (cc == 100) return LaunchSm100(problem, buffers, stream, workspace);
#endif
  return ffi::Error(ffi::ErrorCode::kUnimplemented, "gemm_amax: no kernel for this GPU (compute capability " +
                                                        std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
                                                        "); " + kBuiltKernels);
}

ffi::Error GemmAmaxCudaImpl(cudaStream_t stream, CallSiteState* state, ffi::AnyBuffer a, ffi::AnyBuffer b,
                            ffi::AnyBuffer sfa, ffi::AnyBuffer sfb, ffi::Result<ffi::AnyBuffer> c,
                            ffi::Result<ffi::AnyBuffer> amax, ffi::Result<ffi::AnyBuffer> workspace,
                            int32_t sf_vec_size, int32_t tile_m, int32_t tile_n, int32_t cluster_m, int32_t cluster_n) {
  GemmAmaxProblem problem;
  const GemmAmaxHints hints{tile_m, tile_n, cluster_m, cluster_n};
  ffi::Error status = DescribeProblem(a, b, sfa, sfb, *c, *amax, sf_vec_size, hints, &problem);
  if (status.failure()) return status;
  return Run(stream, state, problem, BuffersOf(a, b, sfa, sfb, *c, *amax), *workspace);
}

ffi::Error GemmAmaxWeightOnlyCudaImpl(cudaStream_t stream, CallSiteState* state, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                      ffi::AnyBuffer sfb, ffi::Result<ffi::AnyBuffer> c,
                                      ffi::Result<ffi::AnyBuffer> amax, ffi::Result<ffi::AnyBuffer> workspace,
                                      int32_t sf_vec_size, int32_t tile_m, int32_t tile_n, int32_t cluster_m,
                                      int32_t cluster_n) {
  GemmAmaxProblem problem;
  const GemmAmaxHints hints{tile_m, tile_n, cluster_m, cluster_n};
  ffi::Error status = DescribeWeightOnlyProblem(a, b, sfb, *c, *amax, sf_vec_size, hints, &problem);
  if (status.failure()) return status;
  return Run(stream, state, problem, WeightOnlyBuffersOf(a, b, sfb, *c, *amax), *workspace);
}

// The instantiate stage runs once per executable (per call site), outside CUDA-graph capture: load
// the kernels of every device now, so that the execute stage never loads a module while XLA records
// a graph, and make this call site's state (its reset words).
ffi::ErrorOr<std::unique_ptr<CallSiteState>> GemmAmaxCudaInstantiateImpl(int32_t, int32_t, int32_t, int32_t, int32_t) {
  using Result = ffi::ErrorOr<std::unique_ptr<CallSiteState>>;
  const auto fail = [](ffi::Error error) -> Result { return ffi::Unexpected<ffi::Error>(std::move(error)); };
  auto state = std::make_unique<CallSiteState>();
  int current = 0, count = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess) err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return fail(CudaError(err, "listing devices"));
  for (int device = 0; device < count && device < kMaxDevices; ++device) {
    int cc = 0;
    err = ComputeCapability(device, &cc);
    if (err != cudaSuccess) return fail(CudaError(err, "querying the compute capability"));
    cudaError_t (*prepare)() = cc == 90 ? sm90::Prepare : nullptr;
#if defined(JGA_HAVE_SM100)
    if (cc == 100) prepare = sm100::Prepare;
#endif
    if (prepare == nullptr) continue;
    err = cudaSetDevice(device);
    if (err == cudaSuccess) err = prepare();
    if (err == cudaSuccess) err = skinny::Prepare();  // built for every arch with a prepare stage here
    if (err == cudaSuccess) err = sm90::AllocResetWord(&state->reset_word[device]);
    if (err != cudaSuccess) {
      cudaSetDevice(current);
      return fail(CudaError(err, "loading the kernels"));
    }
  }
  err = cudaSetDevice(current);
  if (err != cudaSuccess) return fail(CudaError(err, "restoring the current device"));
  return Result(std::move(state));
}

}  // namespace
}  // namespace jga

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaGemmAmaxCudaInstantiate, jga::GemmAmaxCudaInstantiateImpl,
                              xla::ffi::Ffi::BindInstantiate() JGA_GEMM_AMAX_BINDING_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaGemmAmaxCuda, jga::GemmAmaxCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::State<jga::CallSiteState>>() JGA_GEMM_AMAX_BINDING_BUFFERS
                                  .Ret<xla::ffi::AnyBuffer>()  // workspace (uint8; may be empty)
                              JGA_GEMM_AMAX_BINDING_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});

// Weight-only calls (a, b, sfb): the same instantiate stage and state.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaGemmAmaxWeightOnlyCuda, jga::GemmAmaxWeightOnlyCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::State<jga::CallSiteState>>()
                                  .Arg<xla::ffi::AnyBuffer>()  // a, bfloat16 or float16
                                  .Arg<xla::ffi::AnyBuffer>()  // b
                                  .Arg<xla::ffi::AnyBuffer>()  // sfb
                                  .Ret<xla::ffi::AnyBuffer>()  // c
                                  .Ret<xla::ffi::AnyBuffer>()  // amax, one per batch item
                                  .Ret<xla::ffi::AnyBuffer>()  // workspace (uint8; may be empty)
                              JGA_GEMM_AMAX_BINDING_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});

// The state's type, registered with XLA before the handlers (jax.ffi.register_ffi_type).
extern "C" XLA_FFI_TypeId* JgaCallSiteStateTypeId() { return &jga::CallSiteState::id; }
extern "C" const XLA_FFI_TypeInfo* JgaCallSiteStateTypeInfo() {
  static const XLA_FFI_TypeInfo info = xla::ffi::MakeTypeInfo<jga::CallSiteState>();
  return &info;
}
