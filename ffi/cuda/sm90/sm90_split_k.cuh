// The SM90 kernels' hand-overs between CTAs: split-K partial tiles (stored by the non-reducing
// splits, added by the reducer) and the launch's zeroing round of amax and the split-K counters.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_scheduler.cuh"

namespace jga {
namespace sm90 {

// Split-K hand-over between the consumers of two CTAs. A non-reducing split stores its fp32
// accumulators in fragment order (16-byte chunk q of consumer thread c at chunk q * 256 + c: each
// store instruction of the 256 threads covers 4 KB contiguously) and counts itself in with a
// release; the reducer acquires the count and adds the partials in slot order (deterministic).
template <int MI>
__device__ __forceinline__ float4* PartialSlot(const KParams& p, int slot, int tile, int ctid) {
  const size_t index = static_cast<size_t>(slot) * p.split_tiles + (tile - p.whole_tiles);
  return reinterpret_cast<float4*>(p.partials + index * (MI * 128 * kBN)) + ctid;
}
template <int MI>
__device__ __forceinline__ void StorePartial(const float (&acc)[MI][64], const KParams& p, const WorkUnit& w,
                                             int ctid) {
  float4* dst = PartialSlot<MI>(p, w.split, w.tile, ctid);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < 16; ++j)
      __stcg(dst + (mi * 16 + j) * 256,
             make_float4(acc[mi][4 * j], acc[mi][4 * j + 1], acc[mi][4 * j + 2], acc[mi][4 * j + 3]));
  // The barrier orders every consumer thread's stores before thread 0's release (cumulativity).
  ConsumerBarrier();
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.eq.u32 p, %1, 0;\n"
      "@p red.release.gpu.global.add.u32 [%0], 1;\n"
      "}\n" ::"l"(p.tile_ready + (w.tile - p.whole_tiles)),
      "r"(static_cast<uint32_t>(ctid))
      : "memory");
}
// The reducer: waits until the tile's other splits have counted themselves in, then adds them.
__device__ __forceinline__ void WaitForPartials(const KParams& p, const WorkUnit& w) {
  const uint32_t need = static_cast<uint32_t>(w.splits - 1);
  const unsigned int* ready = p.tile_ready + (w.tile - p.whole_tiles);
  uint32_t seen;
  do {  // the whole warp polls, so that the loop stays warp-uniform (see FlushAmax)
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ready) : "memory");
  } while (!__all_sync(0xFFFFFFFFu, seen >= need));
}
// The launch's zeroing of amax and the split-K counters, ordered before every CTA's first atomic
// without a kernel before this one, on the reset word p.reset_word (ResetArrive,
// cuda/common/device.cuh). Run by one warp per CTA (an idle producer warp): CTA 0's
// lanes zero, then lane 0 arrives with release and polls with acquire until the bit flips, then
// arrives on the CTA's reset mbarrier, which the consumers wait for after every main loop (a
// completed phase: no wait after the first).
__device__ __forceinline__ void ResetRound(const KParams& p, uint32_t bar_reset, int lane) {
  if (p.reset_word == nullptr) {  // nothing to zero
    MbarArriveIf(bar_reset, lane == 0);
    return;
  }
  if (blockIdx.x == 0) {
    if ((p.flags & kFlagNoAmax) == 0)
      for (int i = lane; i < p.l; i += 32) p.amax[i] = 0.0f;
    if (p.splits > 1)
      for (int i = lane; i < p.split_tiles; i += 32) p.tile_ready[i] = 0u;
    __threadfence();  // each lane's zeroes visible GPU-wide, then (the warp barrier) lane 0's release
    __syncwarp();
  }
  if (lane == 0) {
    ResetWait(p.reset_word, ResetArrive(p.reset_word));
    MbarArriveIf(bar_reset, true);
  }
  __syncwarp();
}

template <int MI>
__device__ __forceinline__ void AddPartials(float (&acc)[MI][64], const KParams& p, const WorkUnit& w, int ctid) {
#pragma unroll 1
  for (int slot = 0; slot < w.splits - 1; ++slot) {
    const float4* src = PartialSlot<MI>(p, slot, w.tile, ctid);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float4 v = __ldcg(src + (mi * 16 + j) * 256);
        acc[mi][4 * j] += v.x;
        acc[mi][4 * j + 1] += v.y;
        acc[mi][4 * j + 2] += v.z;
        acc[mi][4 * j + 3] += v.w;
      }
  }
}

}  // namespace sm90
}  // namespace jga
