// SM90 (Hopper, sm_90a) block-scaled GEMM + fused amax.
//
// Design (see DESIGN.md):
//   * persistent, warp-specialized CTA of 4 warpgroups (512 threads; 5 at tile height 128), one
//     CTA per SM:
//       WG0: the producer (sm90_producer.cuh): TMA loads of the narrow A/B tiles (128-byte K
//            slabs, 128B swizzle) and 1-D bulk copies of the 512-byte 128x4 scale blocks straight
//            from the physical layout into a ring of raw stages. Its own warpgroup (24 registers):
//            issuing one slab's copies takes it ~1000-2000 cycles, which must not delay anyone.
//       WG1 (and WG2 at tile height 128): the B converter (sm90_converter.cuh): the B tile
//            (value x scale -> BF16, exact) into a 128B-swizzled buffer per 64-K unit (a ring of
//            BF16 B buffers).
//       the last two: consumers (sm90_consumer.cuh). Each loads its rows of one 64-K unit of A into registers, converts
//            them (value x scale -> BF16) straight into WGMMA A-fragment registers and issues BF16
//            WGMMA (RS: A in registers, B from shared memory) with FP32 accumulators, software-
//            pipelined so that a step's conversion overlaps the previous step's WGMMAs; then the
//            epilogue (C in any dtype + amax).
//     ptxas serializes WGMMAs (a wait after each) when it sees them in a path it considers
//     divergent or runs short of registers (infos C7511/C7517/C7518); tests/test_cuda_build.py
//     checks the SASS for it. Hence: warp-uniform role index, predicated arrives and amax atomics,
//     a real (not unrolled) unit loop.
//   * K is permuted consistently for A and B inside each 64-K unit so that every thread reads
//     16 contiguous bytes of A per row (one LDS.128) and the converter writes whole 16-byte chunks.
//   * Pre-converted operands (kPre, tile 256, problems with many rows (B, unsplit plans) or columns
//     (A, split-K plans too)): PreconvertKernel writes the operand as BF16 in the converter's K
//     order into the workspace first (memory-bound: 54 us for 8192 x 8192 fp8 codes, ncu); the
//     producer TMA-loads it per 64-K unit into BF16 buffers. B: the converter
//     warpgroup idles (converting B per tile costs ~12% of the GEMM, ncu, 8192^3: 1.72 ms vs
//     1.52). A: the consumers run SS WGMMAs instead of converting.
//   * CTA tile: (128*MI) x 128 (MI = 1 or 2, picked by the host's cost model). A work unit is a
//     tile, or, in the kSplitK kernels (problems with few tiles), one of `splits` K ranges of a
//     tile: the other splits hand fp32 partial tiles to the last one through a device workspace.
//   * amax and the split-K counters are zeroed by this kernel (CTA 0), ordered before every
//     CTA's first atomic on them by one round of a grid barrier word that needs no reset
//     (ResetRound, sm90_split_k.cuh): no kernel runs before it for that.
//   * Conversion (sm90_convert.cuh): the code's bits are moved into BF16 position with PRMT/SHF/LOP (value * 2^-O
//     exactly, subnormals included), then multiplied (BF16 HMUL2, exact) by a per-group
//     power-of-two (e8m0) or e4m3 multiplier that also undoes 2^-O (a second multiply only when an
//     e8m0 byte is too large for one BF16 multiplier, NaN included). FP4 operands carry an extra
//     2^-8 each, undone by x2^16 on the FP32 accumulator.
//   * amax (sm90_epilogue.cuh): NaN-propagating |x| max per thread (max.NaN.xorsign.abs), warp redux, one atomicMax
//     per warp per batch item on the float bits (valid for |x| >= +0; NaN bits sort above inf).
//
// Layers: sm90_config.cuh (variants, parameters, roles, shared-memory layout), sm90_ptx.cuh and
// wgmma.h (PTX wrappers), sm90_convert.cuh, sm90_scheduler.cuh (work units, tile raster),
// sm90_epilogue.cuh, sm90_split_k.cuh (hand-overs between CTAs), sm90_preconvert.cuh (the BF16
// passes), the three roles, and this file: the kernel that runs them. The host side:
// sm90_planner.cu (the cost model and the plan of a launch), gemm_amax_sm90.cu (tensor maps,
// parameters, launch), sm90_launch.cuh (one variant's kernels).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_consumer.cuh"
#include "cuda/sm90/sm90_converter.cuh"
#include "cuda/sm90/sm90_preconvert.cuh"
#include "cuda/sm90/sm90_producer.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_split_k.cuh"

namespace jga {
namespace sm90 {

// kPre (kPreA | kPreB bits): tm_a / tm_b map PreconvertKernel's BF16 operand (128-byte units)
// instead of the codes; the producer loads it per unit into BF16 buffers. Pre-converted B: the
// converter warpgroup idles. Pre-converted A: the consumers run SS WGMMAs on the A buffers instead
// of converting A into registers.
template <int V, int MI, bool kSplitK, int kPre>
__global__ void __launch_bounds__(Roles<MI>::kThreads, 1)
    GemmAmaxKernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                   const KParams p) {
  using S = Smem<V, MI, kPre>;
  using R = Roles<MI>;
  constexpr int kCl = S::kClusterCTAs;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint32_t smem = (SmemAddr(smem_raw) + 1023u) & ~1023u;
  // Opaque to the compiler, so it keeps the base in a register instead of recomputing it from
  // %cluster_ctarank-derived state (S2UR + 4 uniform ops) in every loop iteration.
  asm volatile("" : "+r"(smem));
  const Barriers<S> bar(smem);

  // Broadcast from lane 0 so that ptxas can prove the role branches warp-uniform: WGMMA inside a
  // path it considers divergent gets serialized (a wait after every instruction, ptxas C7518).
  const int warp_idx = __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x / 32), 0);
  const int lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    // Bring the TMA descriptors (kernel parameters) into the descriptor cache once, so that the
    // first loads do not wait for them.
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm_b)) : "memory");
    for (int s = 0; s < S::kRawStages; ++s) {
      MbarInit(bar.full_raw + 8 * s, 1);
      // the warps that read the stage: consumers (A codes), converters (B codes)
      MbarInit(bar.empty_raw + 8 * s, (S::kPreconvertedA ? 0 : 8) + (S::kPreconvertedB ? 0 : 4 * R::kConverterWGs));
    }
    constexpr int kReaders = S::kPingPongTiles ? 4 : 8;      // consumer warps that read a stage
    constexpr int kAReaderCTAs = S::kPingPongTiles ? 2 : 1;  // CTAs whose consumers read an A' stage
    for (int s = 0; s < S::kAStages; ++s) {
      MbarInit(bar.full_a + 8 * s, 1);  // the producer's arrive (+ TMA bytes)
      MbarInit(bar.empty_a + 8 * s, kReaders * kAReaderCTAs);
    }
    for (int s = 0; s < S::kBStages; ++s) {
      MbarInit(bar.full_b + 8 * s,
               S::kPreconvertedB ? 1 : 4);  // the producer's arrive (+ TMA bytes), or the converter warps
      MbarInit(bar.empty_b + 8 * s, kReaders);
    }
    if constexpr (S::kPingPongTiles) {
      MbarInit(bar.order, 1);
      MbarInit(bar.order + 8, 1);
      MbarArriveIf(bar.order, true);  // warpgroup 0's first main loop may start
    }
    MbarInit(bar.reset, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  ClusterSync<kCl>();  // the peers' barriers are initialized before any multicast or remote arrive
  const Cta<S> cta{p,
                   smem,
                   bar,
                   static_cast<int>(ClusterCtaRank<kCl>()),
                   static_cast<int>(blockIdx.x / kCl),
                   static_cast<int>(gridDim.x / kCl),
                   warp_idx,
                   lane};

  if (warp_idx < 4) {
    // WG0, the producer: a warpgroup of its own, since issuing the copies must not delay the B
    // conversion or the MMAs (~2000 cycles per slab when a converter warp issued them). Two
    // issuing warps, each gated only by its own ring: warp 0 copies the raw stages (codes and
    // scales converted in this kernel), warp 1 the pre-converted BF16 units. One thread issuing
    // both waited for a free A' buffer (held until the consumers' MMAs on it retire) before it
    // could issue the next raw B slab, so B was prefetched only as deep as the A' ring (1.5 slabs):
    // 256x8192x8192 520 -> 545 TF/s. The whole warp runs the loop and lane 0 issues: with one lane
    // in a divergent branch, ptxas kept the loop state in vector registers and spilled them (24 per
    // thread under setmaxnreg). Warp 2 runs the zeroing round.
    SetMaxNReg<R::kProducerRegs>();
    const bool lane0 = threadIdx.x % 32 == 0;
    if (S::kRawStages > 0 && warp_idx == 0) {
      ProduceRawStages<V, MI, kSplitK, kPre>(cta, tm_a, tm_b, lane0);
    } else if (kPre != 0 && warp_idx == 1) {
      ProducePreconvertedUnits<V, MI, kSplitK, kPre>(cta, tm_a, tm_b, lane0);
    } else if (warp_idx == 2) {
      ResetRound(p, bar.reset, lane);
    }
  } else if (warp_idx < R::kFirstConsumerWarp) {
    SetMaxNReg<R::kConverterRegs>();
    if constexpr (!S::kPreconvertedB) ConvertB<V, MI, kSplitK, kPre>(cta);
  } else {
    SetMaxNReg<R::kConsumerRegs>();
    Consume<V, MI, kSplitK, kPre>(cta);
  }
  // No CTA may exit while a peer can still multicast into its shared memory or arrive on it.
  ClusterSync<kCl>();
}

}  // namespace sm90
}  // namespace jga
