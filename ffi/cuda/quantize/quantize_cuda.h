// Host interface of the CUDA quantize kernels (quantize_launch.cu), compiled for every
// architecture in JAX_GEMM_AMAX_CUDA_ARCHS (the kernels are arch-neutral, sm_89 and later).
#pragma once

#include <cuda_runtime.h>

#include "common/quantize_problem.h"

namespace jga::quantize {

// Loads every quantize kernel on the current device and reads its occupancy (which sizes its
// grid), so that no launch loads a module or queries the device while a CUDA graph is captured.
cudaError_t Prepare();

// Enqueues one call on `stream`: zeroes amax, then one kernel. No allocation, no host sync.
// `sm_count`: the device's multiprocessors (sizes the grid).
cudaError_t Launch(const QuantizeProblem& problem, const QuantizeBuffers& buffers, int sm_count, cudaStream_t stream);

}  // namespace jga::quantize
