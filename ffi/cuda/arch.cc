#include "cuda/arch.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>

#include "cuda/skinny/skinny.h"
#include "cuda/sm90/gemm_amax_sm90.h"
#if defined(JGA_HAVE_SM100)
#include "cuda/sm100/gemm_amax_sm100.h"
#endif

namespace jga {

cudaError_t ComputeCapability(int device, int* cc) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  if (device >= 0 && device < kMaxDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    *cc = cache[device].load(std::memory_order_relaxed);
    return cudaSuccess;
  }
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  *cc = major * 10 + minor;
  if (device >= 0 && device < kMaxDevices) cache[device].store(*cc, std::memory_order_relaxed);
  return cudaSuccess;
}

bool FewRowKernelBuiltFor(int cc) {
#if defined(JGA_HAVE_SM100)
  if (cc == 100) return true;
#endif
  return cc == 90;
}

namespace {
int CurrentCc() {
  int device = 0, cc = 0;  // cc stays 0 where there is no usable device
  if (cudaGetDevice(&device) == cudaSuccess) ComputeCapability(device, &cc);
  return cc;
}
// Above one few-row launch (skinny::kMaxM, 64 rows). H100, MXFP8 and MXFP4 weights of 8192x8192 to
// 28672x8192 (benchmarks/RESULTS.md, decode tables; GPU time): at 128 rows the GEMM took 69-220 us
// where two few-row launches took 122-502; at 48-64 rows 78-274 us against the few-row kernel's
// 61-251 (the GEMM's A' plans are tile 256: at 64 rows three quarters of the MMAs are padding).
bool WeightOnlyOnGemm(const GemmAmaxProblem& p, int cc) {
  return cc == 90 && p.a_type == ActivationType::kBF16 && p.m > skinny::kMaxM && sm90::Unsupported(p) == nullptr;
}
bool WeightOnlyOnFewRows(const GemmAmaxProblem& p, int cc) {
  return (cc == 0 || FewRowKernelBuiltFor(cc)) && skinny::Accepts(p);
}
}  // namespace

WeightOnlyRoute WeightOnlyRouteFor(const GemmAmaxProblem& p, int cc, size_t workspace_bytes) {
  if (WeightOnlyOnGemm(p, cc) && workspace_bytes >= sm90::WorkspaceBytes(p)) return WeightOnlyRoute::kGemm;
  if (WeightOnlyOnFewRows(p, cc)) return WeightOnlyRoute::kFewRows;
  return WeightOnlyRoute::kNone;
}

long long WeightOnlyWorkspaceBytes(const GemmAmaxProblem& p, WeightOnlyRoute* route) {
  // The route of a call given all the workspace it could ask for, and that route's need.
  const WeightOnlyRoute r = WeightOnlyRouteFor(p, CurrentCc(), std::numeric_limits<size_t>::max());
  if (route != nullptr) *route = r;
  switch (r) {
    case WeightOnlyRoute::kGemm: return static_cast<long long>(sm90::WorkspaceBytes(p));
    case WeightOnlyRoute::kFewRows: return static_cast<long long>(skinny::WorkspaceBytes(p));
    case WeightOnlyRoute::kNone: break;
  }
  return -1;
}

size_t CudaWorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies) {
  // Both architectures run the problems the few-row kernel accepts on it: the larger of its need
  // and their GEMM's.
  const size_t few_rows = skinny::WorkspaceBytes(p);
  const size_t sm90 = std::max(sm90::WorkspaceBytes(p, offer_copies), few_rows);
#if defined(JGA_HAVE_SM100)
  const size_t sm100 = std::max(sm100::WorkspaceBytes(p), few_rows);
#else
  const size_t sm100 = 0;
#endif
  const int cc = CurrentCc();
  if (cc == 90) return sm90;
#if defined(JGA_HAVE_SM100)
  if (cc == 100) return sm100;
#endif
  return std::max(sm90, sm100);  // lowered without a GPU, or for one that has no kernels: enough for any
}

}  // namespace jga
