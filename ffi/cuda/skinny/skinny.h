// The few-row kernel: gemm_amax for problems with few rows of A (decode: M tokens against a large
// weight B), for every CUDA architecture the library builds (mma.sync, FP8 conversions: sm_89+ PTX). Such problems
// are bound by the bytes of B over the memory bandwidth; the kernel streams B once through shared
// memory, converts it in registers and splits K over the SMs so that all of them pull bandwidth
// even at M = 1. Same C and amax contract as the other kernels (cuda/common/device.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace jga {
namespace skinny {

// Rows of A one launch takes at most (C^T tiles of 8 tokens, up to 8 of them per CTA).
constexpr int64_t kMaxM = 64;
// Rows of a block-scaled A the host takes: from 33 rows the architecture's GEMM is faster (H100,
// MXFP8 8192x8192: 91.5 us here at 48 rows, 46.6 us on the Hopper GEMM at 128), so the 64-token
// kernels are built for 16-bit activations only.
constexpr int64_t kMaxScaledM = 32;
// Rows of a weight-only A the host takes, one launch per kMaxM rows (each streams B again): two
// launches at 64 rows each are faster than XLA's dequantize -> dot, three are not.
constexpr int64_t kMaxWeightOnlyM = 2 * kMaxM;

// Whether the host runs `p` on this kernel (where it is built for the device): M <= kMaxScaledM
// (kMaxWeightOnlyM), a format it has for B (MXFP8 e4m3/e5m2, MXFP4 with e8m0/32, NVFP4) with A
// block-scaled like B or weight-only (bfloat16/float16), within its index ranges. The other
// problems, and FP4 with e8m0 scales per 16, go to the architecture's GEMM (weight-only: where
// WeightOnlyRouteFor says, arch.h) or to XLA.
bool Accepts(const GemmAmaxProblem& p);

// The workspace to offer for `p` (0 if !Accepts(p)): split-K counters and fp32 partial tiles for
// the splits the planner picks on a GPU of up to kPlanSms SMs. Launch fits its splits to what it
// is given (none: no split-K). Contents irrelevant.
constexpr int kPlanSms = 148;
size_t WorkspaceBytes(const GemmAmaxProblem& p);

// Sets the kernels' shared-memory limits and reads their occupancy on the current device. Call it
// outside stream capture (the FFI instantiate stage does); Launch prepares lazily otherwise.
cudaError_t Prepare();

// The plan for `p` with `workspace_bytes` of workspace on the current device, or (sms > 0) on a
// GPU with that many SMs (host arithmetic, no device needed).
struct PlanInfo {
  int tokens = 0;       // columns of the CTA's C^T tile (M rounded up to 8, 16, 32 or 64)
  int splits = 0;       // K ranges per 128-row tile of B
  int ctas_per_sm = 0;  // co-resident CTAs per SM (the cooperative grid's cap)
  int grid = 0;         // CTAs launched
};
cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, PlanInfo* info, int sms = 0);

// Enqueues the whole operation on `stream` (one cooperative kernel; no host sync, no allocation,
// CUDA-graph capturable). reset_word: this call site's zeroing word on the current device
// (gemm_amax_sm90.h AllocResetWord; the kernel zeroes amax and its counters itself, ResetArrive).
cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, unsigned int* reset_word);

}  // namespace skinny
}  // namespace jga
