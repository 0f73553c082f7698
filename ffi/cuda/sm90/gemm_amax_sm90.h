// Hopper (sm_90a) block-scaled GEMM with fused amax. See sm90_kernel.cuh for the design.
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
// copy, or the pre-converted operands' copies (below) if larger. Launch picks only plans that fit
// the workspace given (none or a smaller one just rules split-K and pre-conversion out). 16-byte
// aligned; contents irrelevant.
constexpr int kMaxSplits = 4;
constexpr long long kSplitMaxElems = 1ll << 22;  // fp32 elements of partial tiles, at most
// Tile-256 plans may convert an operand to BF16 once per call in a pass of its own
// (PreconvertKernel, memory-bound) instead of once per tile inside the GEMM; the plan's cost model
// decides (gemm_amax_sm90.cu, kPreconvertSaving). The BF16 copies live in the workspace (after the
// split-K area of a split plan; B' first, then A'; 2 bytes per element, K padded to a slab, A's rows
// to 8), so they are asked for before the plan exists: B's when M >= kPreconvertBMinM, A's when
// N >= kPreconvertAMinN, each when it is at most kPreconvertMaxBytes. With both offered at any size,
// the model on a 132-SM H200 takes a copy below those twice in M, N, K grids to 32768, both fp4 and
// unmeasured (A'B' at 1536x1536x2048, A' at 2048x640x32768). A' from N = 768: at 14 shapes with
// 768 <= N < 2048 the model's A' plan beat the plan without it by +1.0% (1536x768x16384) to
// +12.8% (768x1536x16384) (plans taking turns).
constexpr long long kPreconvertBMinM = 2048;
constexpr long long kPreconvertAMinN = 768;
constexpr long long kPreconvertMaxBytes = 1ll << 30;
size_t PreconvertedBBytes(const GemmAmaxProblem& p);
size_t PreconvertedABytes(const GemmAmaxProblem& p);
size_t WorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies = true);  // false: split-K only

// The kernel zeroes amax and its split-K counters itself, ordered by one round of a grid barrier
// word in device memory (sm90_kernel.cuh ResetRound): zeroed when allocated, left at zero by every
// complete round. Launches that may run at the same time must not share a word: one per device
// per call site (the FFI handler keeps them in its instantiate-stage state); Prepare() makes a
// per-device one for callers that pass none. AllocResetWord allocates one on the current device;
// it synchronizes the device, so call it outside stream capture. Free it with cudaFree.
cudaError_t AllocResetWord(unsigned int** word);

// Enqueues the whole operation on `stream`: one kernel (two or three with the BF16 passes). No host
// sync, no allocation, CUDA-graph capturable. reset_word: this call site's word on the current
// device (nullptr: the device's shared one). Returns the first CUDA error.
cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, unsigned int* reset_word = nullptr);

// Split-K: the reducer (the last split) takes this many more 64-K MMA units than each other split,
// and works through them while the others store their partials (the trace at 1024^3: a 64 KB store
// took ~4k cycles, which the reducer spent waiting). H200 harness, against equal splits:
// 1024^3 149-151 -> 168-169 TF/s, 250x6000x8192 +4%, 128x4096x4096 +6%, 640x8192x2048 and
// 2560x1792x4096 +2-6%; 256x8192x8192 and 2048x5120x8192 inside their spread. 2 and 4 units measured
// alike, 6 less (fp8; an fp4 slab holds 4 units, so fp4 gets one extra slab).
constexpr int kSplitReducerBonusUnits = 4;

// Testing / benchmarking knobs (not part of the product API).
struct LaunchOptions {
  bool skip_amax = false;  // leave amax untouched: no reset, no flush (each thread's running maximum still runs)
  int force_tile_m = 0;    // 0: heuristic; 128 or 256 forces the CTA tile height
  int force_splits = 0;    // 0: heuristic; >= 1 forces the split-K factor (capped at the K slabs)
  int force_whole_tiles = -1;  // with force_splits > 1: this many tiles run unsplit first (< tiles)
  int preconvert_b = -1;   // -1: when offered (kPreconvertBMinM) and the plan's cost model takes it; 0: never; 1: whenever the plan
                           // is tile 256 unsplit and the workspace holds the BF16 B
  int preconvert_a = -1;   // the same for A (kPreconvertAMinN), split-K plans of tile 256 included
  int split_bonus_units = -1;  // -1: kSplitReducerBonusUnits; else the split-K reducer's extra 64-K units
  unsigned int* reset_word = nullptr;   // see Launch
};
cudaError_t LaunchWithOptions(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream, const LaunchOptions& opt);
// The plan a launch with `workspace_bytes` of workspace picks on the current device (for reports).
struct PlanInfo {
  int tile_m = 0, splits = 0, whole_tiles = 0;  // whole_tiles: tiles run unsplit before the split ones
  bool preconvert_a = false, preconvert_b = false;
  int clusters = 0;  // co-resident clusters of the plan's kernel (the persistent grid's cap); 0 until a launch has prepared this device
};
// The plan a launch would take on the current device, or, with sms > 0, on a GPU with that many SMs
// (host arithmetic, no device needed; clusters stays 0).
cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, const LaunchOptions& opt, PlanInfo* info,
                    int sms = 0);

}  // namespace sm90
}  // namespace jga
