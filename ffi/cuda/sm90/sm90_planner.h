// The host planner of the SM90 kernels: which kernel a launch runs (tile height, split-K factor,
// operands pre-converted to BF16) from a cost model of its waves over the SMs (sm90_planner.cu),
// the workspace its plans use, and, for the kernel tests and benchmarks, launches with the
// planner's choices overridden (the product runs with the defaults).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/problem.h"
#include "cuda/sm90/gemm_amax_sm90.h"

namespace jga {
namespace sm90 {

// Split-K keeps at most kMaxSplits K ranges per tile and kSplitMaxElems fp32 elements of partial
// tiles in the workspace (16 MB + counters).
constexpr int kMaxSplits = 4;
constexpr long long kSplitMaxElems = 1ll << 22;
// Tile-256 plans may convert an operand to BF16 once per call in a pass of its own
// (PreconvertKernel, memory-bound) instead of once per tile inside the GEMM; the plan's cost model
// decides (kPreconvertSaving). The BF16 copies live in the workspace (after the split-K area of a
// split plan; B' first, then A'; 2 bytes per element, K padded to a slab, A's rows to 8), so they
// are asked for before the plan exists: B's when M >= kPreconvertBMinM, A's when
// N >= kPreconvertAMinN, each when it is at most kPreconvertMaxBytes. With both offered at any size,
// the model on a 132-SM H200 takes a copy below those twice in M, N, K grids to 32768, both fp4 and
// unmeasured (A'B' at 1536x1536x2048, A' at 2048x640x32768). At 14 shapes with 768 <= N < 2048
// the model's A' plan beat the plan without it by +1.0% (1536x768x16384) to +12.8%
// (768x1536x16384) (plans taking turns).
constexpr long long kPreconvertBMinM = 2048;
constexpr long long kPreconvertAMinN = 768;
constexpr long long kPreconvertMaxBytes = 1ll << 30;
// Split-K: the reducer (the last split) takes this many more 64-K MMA units than each other split,
// and works through them while the others store their partials (at 1024^3 a 64 KB store took ~4k
// cycles, which the reducer spent waiting). H200, against equal splits: 1024^3 149-151 -> 168-169
// TF/s, 250x6000x8192 +4%, 128x4096x4096 +6%, 640x8192x2048 and 2560x1792x4096 +2-6%;
// 256x8192x8192 and 2048x5120x8192 inside their spread. 2 and 4 units measured alike, 6 less (fp8;
// an fp4 slab holds 4 units, so fp4 gets one extra slab).
constexpr int kSplitReducerBonusUnits = 4;

// 64-K MMA units per 128-byte slab of codes (128 fp8 or 256 fp4 elements).
long long UnitsPerSlab(const GemmAmaxProblem& p);
// A pre-converted operand: rows of PreconvertedRowBytes (every 128-byte slab of codes becomes
// UnitsPerSlab units of 64 BF16 values); A' has its rows rounded up to 8 (PreconvertedARows).
long long PreconvertedRowBytes(const GemmAmaxProblem& p);
long long PreconvertedARows(const GemmAmaxProblem& p);
size_t PreconvertedBBytes(const GemmAmaxProblem& p);
size_t PreconvertedABytes(const GemmAmaxProblem& p);
// Whether a copy of `bytes` fits the passes' indexing: they number its 128-byte units with 32-bit
// ints (256 GiB), and a warp's store loop counts up to 31 past the last unit.
bool CopyFits(size_t bytes);

// Overrides of the planner's choices (the defaults: the planner decides).
struct PlanOptions {
  int force_tile_m = 0;        // 128 or 256 forces the CTA tile height
  int force_splits = 0;        // >= 1 forces the split-K factor (capped at the K slabs)
  int force_whole_tiles = -1;  // with force_splits > 1: this many tiles run unsplit first (< tiles)
  int preconvert_b = -1;       // -1: when offered (kPreconvertBMinM) and the plan's cost model takes it; 0: never;
                               // 1: whenever the plan is tile 256 unsplit and the workspace holds the BF16 B
  int preconvert_a = -1;       // the same for A (kPreconvertAMinN), split-K plans of tile 256 included
  int split_bonus_units = -1;  // -1: kSplitReducerBonusUnits; else the split-K reducer's extra 64-K units
};

struct Plan {
  int mi = 2;  // tile height / 128
  int splits = 1;
  int whole_tiles = 0;     // tiles run unsplit before the split ones (a tail split)
  size_t ready_bytes = 0;  // split-K counters, at the start of the workspace; partials follow
  size_t split_bytes = 0;  // counters + partials (a multiple of 256); BF16 copies follow them
  int pre = 0;             // operands converted in passes (kPreA | kPreB)
};
// The plan of a launch on a GPU with `sms` SMs given `workspace_bytes` of workspace.
Plan PlanOf(const GemmAmaxProblem& p, int sms, const PlanOptions& opt, size_t workspace_bytes);
// The kPre bits of the plan's kernel: its pre-converted operands, and kPingPong for an unsplit A'B'
// plan.
int KernelPre(const Plan& plan);

// A launch with the planner's choices overridden (tests, benchmarks). skip_amax leaves amax
// untouched: no zeroing, no flush (each thread's running maximum still runs).
struct LaunchOptions : PlanOptions {
  bool skip_amax = false;
  unsigned int* reset_word = nullptr;  // see Launch
};
cudaError_t LaunchWithOptions(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream, const LaunchOptions& opt);
cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, const PlanOptions& opt, PlanInfo* info,
                    int sms = 0);

}  // namespace sm90
}  // namespace jga
