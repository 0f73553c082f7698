// Blackwell (sm_100a) block-scaled GEMM with fused amax, built from CUTLASS 4.x's SM100
// block-scaled collective (tcgen05.mma ... block_scale) and an epilogue that stores C in any
// c_dtype of the contract and reduces amax per batch item. See sm100_kernel.cuh for the design
// and sm100_dispatch.cu for the deliberate set of instantiated configurations.
//
// This path is compile-verified only (no SM100 GPU was available when it was written): the
// test tests/test_sm100_build.py checks that the sm_100a cubin holds block-scaled tcgen05 MMAs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/problem.h"

namespace jga {
namespace sm100 {

// nullptr if an instantiated SM100 kernel handles `p` (operand format, scale type, sf_vec_size,
// output dtype, mma_tiler_mn and cluster_shape_mn hints), else a human-readable reason.
const char* Unsupported(const GemmAmaxProblem& p);

// Bytes of device workspace that Launch needs for `p` (CUTLASS's kernel workspace; 0 for every
// configuration today). The caller provides it (the custom call's workspace result, see
// cuda_handler.cc); it must be 16-byte aligned.
size_t WorkspaceBytes(const GemmAmaxProblem& p);

// Loads every sm_100 kernel on the current device (outside stream capture; the FFI instantiate
// stage calls it) so that Launch never loads a module while XLA records a CUDA graph.
cudaError_t Prepare();

// Enqueues the whole operation on `stream`: amax[0..L) reset (cudaMemsetAsync), then one GEMM
// kernel for all L batch items. No host sync, no allocation, CUDA-graph capturable.
// Checks CUTLASS's can_implement / initialize; on failure returns an error code and sets
// *error_message (if non-null) to a static string naming the cause.
cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, cudaStream_t stream,
                   const char** error_message);

}  // namespace sm100
}  // namespace jga
