// Hopper (sm_90a) block-scaled GEMM with fused amax. How it works: DESIGN.md beside this file.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/problem.h"

namespace jga {
namespace sm90 {

// nullptr if the SM90 kernel handles `p`, else a human-readable reason.
const char* Unsupported(const GemmAmaxProblem& p);

// Loads the kernels on the current device and caches per-device state. Call it outside stream
// capture (the FFI instantiate stage does, on every device) so that Launch never loads modules
// while XLA records a CUDA graph; Launch prepares lazily if this was not done.
cudaError_t Prepare();
bool Prepared();

// Split-K (problems with few output tiles, or a last wave with few tiles) keeps fp32 partial
// tiles and per-tile counters in a device workspace that the caller provides (the JAX lowering: an
// extra output of the custom call, so that XLA owns it, CUDA graphs included). WorkspaceBytes is
// the size to offer for `p`: for split-K 16 MB + counters at most, plus A's pre-converted BF16
// copy, or the pre-converted operands' copies if larger (sm90_planner.h). Launch picks only plans
// that fit the workspace given (none or a smaller one just rules split-K and pre-conversion out).
// 16-byte aligned; contents irrelevant. offer_copies false: the split-K workspace only.
size_t WorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies = true);

// The kernel zeroes amax and its split-K counters itself, ordered by one round of a grid barrier
// word in device memory (sm90_split_k.cuh ResetRound): zeroed when allocated, left at zero by every
// complete round. Launches that may run at the same time must not share a word: one per device
// per call site (the FFI handler keeps them in its instantiate-stage state); Prepare() makes a
// per-device one for callers that pass none. AllocResetWord allocates one on the current device,
// with kResetWords words (the pre-conversion passes' scale bounds follow the round word);
// it synchronizes the device, so call it outside stream capture. Free it with cudaFree.
cudaError_t AllocResetWord(unsigned int** word);

// Enqueues the whole operation on `stream`: one kernel (two or three with the BF16 passes). No host
// sync, no allocation, CUDA-graph capturable. reset_word: this call site's word on the current
// device (nullptr: the device's shared one). Returns the first CUDA error.
cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, unsigned int* reset_word = nullptr);

// The plan a launch with `workspace_bytes` of workspace takes.
struct PlanInfo {
  int tile_m = 0, splits = 0, whole_tiles = 0;  // whole_tiles: tiles run unsplit before the split ones
  bool preconvert_a = false, preconvert_b = false;
  int clusters = 0;  // co-resident clusters of the plan's kernel (the persistent grid's cap); 0 until a launch has
                     // prepared this device
};
// The plan a launch would take on the current device, or, with sms > 0, on a GPU with that many SMs
// (host arithmetic, no device needed; clusters stays 0).
cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, PlanInfo* info, int sms = 0);

}  // namespace sm90
}  // namespace jga
