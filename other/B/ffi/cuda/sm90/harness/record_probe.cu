// record_probe: does this jax call an XLA FFI "record" handler (the command-buffer stage that would
// let gemm_amax be updated as two kernel nodes instead of re-captured on every call, NOTES.md
// session 23)? A toy custom call (reset + a 2-CTA-cluster kernel with 100 KB of dynamic shared
// memory, a 256-byte by-value argument and PDL: what our GEMM launch needs) is registered twice:
// with an "execute" and a "record" handler, and with "execute" alone. record_probe.py runs each in
// a 20-call jitted chain and prints the record handler's create / update counts (0 / 0: jax did not
// pass the record handler through, as with jax 0.11.2) and the host time per call.
// Needs jaxlib's xla/ffi/api/record_api.h (jaxlib >= 0.11.2). Build and run (repo root, device):
//   I=$(python3 -c "import jax; print(jax.ffi.include_dir())"); D=/tmp/record_probe; mkdir -p $D
//   F="-std=c++17 -arch=sm_90a -I$I -diag-suppress 940,2473"
//   nvcc $F -shared -Xcompiler -fPIC ffi/cuda/sm90/harness/record_probe.cu -o $D/librecord_probe.so
//   nvcc $F -cubin ffi/cuda/sm90/harness/record_probe.cu -o $D/record_probe.cubin
//   python3 ffi/cuda/sm90/harness/record_probe.py $D
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "xla/ffi/api/record_api.h"

namespace ffi = xla::ffi;

struct Big {
  float add;
  int pad[63];
};
constexpr int kSmem = 100 * 1024;

extern "C" __global__ void probe_reset(float* amax) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *amax = 0.f;
}

extern "C" __global__ void probe_add(const float* x, float* y, float* amax, int n, const __grid_constant__ Big b) {
  extern __shared__ float smem[];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] + b.add : 0.f;
  smem[threadIdx.x + 24000] = v;
  __syncthreads();
  v = smem[threadIdx.x + 24000];
  unsigned csize;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(csize));
  if (i < n) y[i] = v + (csize == 2 ? 0.f : 1000.f);
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(fabsf(v)));
}

static std::atomic<long> g_exec{0}, g_create{0}, g_update{0}, g_capture{0};
static double g_rec_ns = 0;
extern "C" long probe_counter(int i) {
  switch (i) {
    case 0: return g_exec;
    case 1: return g_create;
    case 2: return g_update;
    case 3: return g_capture;
    default: return (long)g_rec_ns;
  }
}

static int Grid(int n) { return ((n + 255) / 256 + 1) / 2 * 2; }

ffi::Error Exec(cudaStream_t s, ffi::Buffer<ffi::F32> x, ffi::Result<ffi::Buffer<ffi::F32>> y,
                ffi::Result<ffi::Buffer<ffi::F32>> amax) {
  ++g_exec;
  static bool once = [] {
    return cudaFuncSetAttribute(probe_add, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) == cudaSuccess;
  }();
  if (!once) return ffi::Error::Internal("smem attr");
  const int n = static_cast<int>(x.element_count());
  probe_reset<<<1, 32, 0, s>>>(amax->typed_data());
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(Grid(n));
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  Big b{};
  b.add = 1.f;
  cudaError_t e = cudaLaunchKernelEx(&cfg, probe_add, x.typed_data(), y->typed_data(), amax->typed_data(), n, b);
  if (e != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(e));
  return ffi::Error::Success();
}

using RecordContext = ffi::internal::RecordContextBase<ffi::internal::ErrorPolicy>;
struct RecordExt : ffi::internal::RecordExtensionBase<RecordContext> {};

static const std::string& Cubin() {
  static std::string data = [] {
    const char* path = std::getenv("PROBE_CUBIN");
    std::ifstream f(path ? path : "record_probe.cubin", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  return data;
}

ffi::Error Rec(cudaStream_t, RecordContext rc, ffi::Buffer<ffi::F32> x,
               ffi::Result<ffi::Buffer<ffi::F32>> y, ffi::Result<ffi::Buffer<ffi::F32>> amax) {
  auto t0 = std::chrono::steady_clock::now();
  if (std::getenv("PROBE_CAPTURE")) {
    ++g_capture;
    return rc.RequestStreamCapture();
  }
  const int n = static_cast<int>(x.element_count());
  void* xp = x.untyped_data();
  void* yp = y->untyped_data();
  void* ap = amax->untyped_data();
  Big b{};
  b.add = 1.f;
  std::vector<ffi::KernelArg> reset_args = {ffi::DevicePointer{ap}};
  std::vector<ffi::KernelArg> add_args = {ffi::DevicePointer{xp}, ffi::DevicePointer{yp}, ffi::DevicePointer{ap},
                               ffi::HostValue{&n, sizeof(n)}, ffi::HostValue{&b, sizeof(b)}};
  const std::string& cubin = Cubin();
  if (cubin.empty()) return ffi::Error::Internal("no cubin");
  if (rc.action() == ffi::RecordAction::kCreate) {
    ++g_create;
    XLA_FFI_LaunchDims d0{{1, 1, 1}, {32, 1, 1}, {0, 0, 0}};
    auto r = rc.CreateLaunch("probe_reset", cubin.data(), cubin.size(), ffi::SourceFormat::kCubin, d0, 0, false,
                             reset_args);
    if (r.has_error()) return r.error();
    const XLA_FFI_Command* reset_cmd = r.value();
    XLA_FFI_LaunchDims d1{{Grid(n), 1, 1}, {256, 1, 1}, {2, 1, 1}};
    auto r2 = rc.CreateLaunch("probe_add", cubin.data(), cubin.size(), ffi::SourceFormat::kCubin, d1, kSmem, true,
                              add_args, {reset_cmd});
    if (r2.has_error()) return r2.error();
  } else {
    ++g_update;
    auto cmds = rc.commands();
    if (cmds.size() != 2) return ffi::Error::Internal("expected 2 commands, got " + std::to_string(cmds.size()));
    ffi::Error e = rc.UpdateLaunch(cmds[0], reset_args);
    if (e.failure()) return e;
    e = rc.UpdateLaunch(cmds[1], add_args);
    if (e.failure()) return e;
  }
  g_rec_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ProbeExec, Exec,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ProbeRecord, Rec,
                              ffi::Ffi::BindRecord()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::Extension<RecordExt>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
