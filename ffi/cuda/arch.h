// Which CUDA architecture a device is, and the host-side rules that depend on it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/problem.h"

namespace jga {

constexpr int kMaxDevices = 64;

// Compute capability (major * 10 + minor) of `device`, cached: queried once per device.
cudaError_t ComputeCapability(int device, int* cc);

// Whether this build has the few-row kernel for compute capability `cc` (sm_90a; sm_100a where built).
bool FewRowKernelBuiltFor(int cc);

// Weight-only problems: on compute capability 9.0 a bfloat16 A of more than skinny::kMaxM (64) rows
// runs on the sm_90 GEMM (its A' plans, whose BF16 copy of A is A's values as they are) when the
// call has the workspace that asks for (sm90::WorkspaceBytes); otherwise on the few-row kernel where
// it takes the problem (skinny::Accepts: M <= 128, float16 A too); else on no CUDA kernel (the JAX
// lowering sends such calls through XLA). cc 0 (no usable device while lowering): the few-row
// kernel only, which every GPU the build has kernels for runs.
enum class WeightOnlyRoute { kNone, kFewRows, kGemm };
WeightOnlyRoute WeightOnlyRouteFor(const GemmAmaxProblem& p, int cc, size_t workspace_bytes);
// The workspace to offer a weight-only call on the current device by the rule above (its route's
// need), or -1 where no CUDA kernel takes it; the route in *route if given.
long long WeightOnlyWorkspaceBytes(const GemmAmaxProblem& p, WeightOnlyRoute* route = nullptr);

// Bytes of device workspace to offer a call of `p` (the custom call's workspace result, sized when
// the JAX lowering runs): the rule of the current device's architecture (sm_90: sm90::WorkspaceBytes,
// offer_copies as there; sm_100: sm100::WorkspaceBytes; on both at least skinny::WorkspaceBytes) or, with no usable
// device or none that the build has kernels for, the largest over the architectures built. Asks the device only for its
// attributes (no allocation, no work).
size_t CudaWorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies);

}  // namespace jga
