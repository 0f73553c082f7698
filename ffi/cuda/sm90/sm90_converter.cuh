// The B converter role of the SM90 kernels (warpgroup 1, and 2 at tile height 128): each thread
// converts one row of the B tile per 64-K unit, from a raw stage into a 128B-swizzled BF16 buffer
// that the consumers' WGMMAs read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_convert.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_scheduler.cuh"

namespace jga {
namespace sm90 {

template <int V, int MI, bool kSplitK, int kPre>
__device__ __forceinline__ void ConvertB(const Cta<Smem<V, MI, kPre>>& cta) {
  using Tr = VariantTraits<V>;
  using S = Smem<V, MI, kPre>;
  using R = Roles<MI>;
  constexpr int kUPS = Tr::kUnitsPerSlab;
  const KParams& p = cta.p;
  const uint32_t smem = cta.smem;
  const int lane = cta.lane;
  const int cw = cta.warp_idx / 4 - 1;               // converter cw takes units ui % kConverterWGs == cw
  const int n_local = threadIdx.x - 128 * (1 + cw);  // row of the B tile this thread converts
  Ring<S::kRawStages> r_ring;
  Ring<S::kBStages> b_ring;
  const int r7 = n_local & 7;
  // The step read from gridDim each time (a uniform register), not held in one of the 56.
  for (int u = cta.cluster_id; u < p.units_total; u += static_cast<int>(gridDim.x) / S::kClusterCTAs) {
    const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
    for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
      // The B slab, one 64-K unit (one BF16 buffer) at a time.
      MbarWait(cta.bar.full_raw + 8 * r_ring.stage, r_ring.phase);
      const uint32_t raw = smem + S::kOffRawB + r_ring.stage * S::kRawB + n_local * 128;
      const uint32_t sfb = smem + S::kOffSfB + r_ring.stage * S::kSfB + SfInBlock(n_local, 0);
#pragma unroll 1
      for (int ui = 0; ui < kUPS; ++ui) {
        if (R::kConverterWGs > 1 && ui % R::kConverterWGs != cw) {  // the other converter's unit
          b_ring.Advance();
          continue;
        }
        MbarWait(cta.bar.empty_b + 8 * b_ring.stage, b_ring.phase ^ 1);
        const uint32_t dst = smem + S::kOffBufB + b_ring.stage * S::kBufB + (n_local >> 3) * 1024 + r7 * 128;
        uint32_t codes[16], sf[4];
        bool valid[4];
        GatherRowUnit<V>(
            ui, slab, p.k_groups,
            [&](int chunk, int half) {  // the raw stage is 128B-swizzled
              if constexpr (!Tr::kFp4) {
                return Lds128(raw + ((chunk ^ r7) << 4));
              } else {
                const uint2 v = Lds64(raw + ((chunk ^ r7) << 4) + 8 * half);
                return make_uint4(v.x, v.y, 0, 0);
              }
            },
            [&](int gis) { return Lds8(sfb + (gis >> 2) * 512 + (gis & 3)); }, codes, sf, valid);
        if (ConvertRowUnit<V>(
                codes, sf, valid,
                [&](int chunk, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
                  Sts128(dst + ((chunk ^ r7) << 4), x, y, z, w);
                },
                [&](uint32_t bound) {  // the warp's scale bound for the consumers, published with the unit
                  Sts32(smem + S::kOffFlagsB + 16 * b_ring.stage + 4 * (cta.warp_idx & 3), bound);  // warp-uniform
                })) {
          if constexpr (!Tr::kFp4) {  // an FP8 NaN/Inf code in the warp: the unit again, carrying it
            ConvertRowUnitSpecial<V>(
                [&](int i) { return Lds32(raw + ((UnitChunk<V>(ui, i >> 2) ^ r7) << 4) + 4 * (i & 3)); }, sf, valid,
                [&](int chunk, int j, uint32_t w) { Sts32(dst + ((chunk ^ r7) << 4) + 4 * j, w); });
          }
        }
        FenceProxyAsync();
        __syncwarp();
        MbarArriveIf(cta.bar.full_b + 8 * b_ring.stage, lane == 0);
        b_ring.Advance();
      }
      // No ReleaseRawStage here: the proxy fence before the last unit's full_b arrive already
      // follows every read of this raw stage.
      __syncwarp();
      MbarArriveIf(cta.bar.empty_raw + 8 * r_ring.stage, lane == 0);
      r_ring.Advance();
    }
  }
}

}  // namespace sm90
}  // namespace jga
