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

// Whether the CUDA handler runs `p` on the few-row kernel on the current device (skinny::Accepts
// there) or, with no usable device, on a GPU the build has kernels for. Weight-only problems reach
// the handler only where this holds; the JAX lowering sends the others through XLA.
bool RunsOnFewRowKernel(const GemmAmaxProblem& p);

// Bytes of device workspace to offer a call of `p` (the custom call's workspace result, sized when
// the JAX lowering runs): the rule of the current device's architecture (sm_90: sm90::WorkspaceBytes,
// offer_copies as there; sm_100: sm100::WorkspaceBytes; on both at least skinny::WorkspaceBytes) or, with no usable
// device or none that the build has kernels for, the largest over the architectures built. Asks the device only for its
// attributes (no allocation, no work).
size_t CudaWorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies);

}  // namespace jga
