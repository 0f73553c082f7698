// The producer role of the SM90 kernels (warpgroup 0): the TMA loads of the operands and the bulk
// copies of their scale blocks into the CTA's rings, one warp per ring, lane 0 issuing.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_scheduler.cuh"

namespace jga {
namespace sm90 {

// Rows per TMA box of each tile, as the host encodes the tensor maps: a ping-pong cluster's CTA
// loads its part of the A tile for both CTAs.
template <class S>
constexpr int kBoxA = S::kBM / S::kClusterCTAs < kBoxRows ? S::kBM / S::kClusterCTAs : kBoxRows;
constexpr int kBoxB = kBN < kBoxRows ? kBN : kBoxRows;

// The raw stages: per slab of each of the CTA's work units, the codes (128 bytes of K per row) of
// the A and B tiles that this kernel converts, and their scale blocks.
template <int V, int MI, bool kSplitK, int kPre>
__device__ __forceinline__ void ProduceRawStages(const Cta<Smem<V, MI, kPre>>& cta, const CUtensorMap& tm_a,
                                                 const CUtensorMap& tm_b, bool lane0) {
  using S = Smem<V, MI, kPre>;
  constexpr int kNSB = VariantTraits<V>::kScaleBlocksPerSlab;
  const KParams& p = cta.p;
  const uint32_t smem = cta.smem;
  Ring<S::kRawStages> ring;
  for (int u = cta.cluster_id; u < p.units_total; u += cta.num_clusters) {
    const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
    const TileCoord pc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
    const int my_nt = pc.nt * S::kClusterCTAs + cta.rank;
    for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
      MbarWait(cta.bar.empty_raw + 8 * ring.stage, ring.phase ^ 1);
      if (lane0) {
        const uint32_t fb = cta.bar.full_raw + 8 * ring.stage;
        MbarArriveExpectTx(fb, S::kTxBytes);
        const uint32_t dst_a = smem + S::kOffRawA + ring.stage * S::kRawA;
        if constexpr (!S::kPreconvertedA) {
#pragma unroll
          for (int bx = 0; bx < S::kBM / kBoxA<S>; ++bx)
            TmaLoad3D(dst_a + bx * kBoxA<S> * 128, &tm_a, fb, slab * 128, pc.mt * S::kBM + bx * kBoxA<S>, pc.l);
        }
        if constexpr (!S::kPreconvertedB) {
#pragma unroll
          for (int bx = 0; bx < kBN / kBoxB; ++bx)
            TmaLoad3D(smem + S::kOffRawB + ring.stage * S::kRawB + bx * kBoxB * 128, &tm_b, fb, slab * 128,
                      my_nt * kBN + bx * kBoxB, pc.l);
        }
        // Scale blocks: each 512 bytes = 128 rows x 4 groups, contiguous in the physical layout.
#pragma unroll
        for (int j = 0; j < kNSB; ++j) {
          const int kb4 = min(slab * kNSB + j, p.k_blocks - 1);
          if constexpr (!S::kPreconvertedA) {
#pragma unroll
            for (int i = 0; i < MI; ++i) {
              const int rb = min(pc.mt * MI + i, p.row_blocks_a - 1);
              const uint8_t* src =
                  p.sfa + pc.l * p.sfa_batch_stride + (static_cast<long long>(rb) * p.k_blocks + kb4) * 512;
              BulkLoad(smem + S::kOffSfA + ring.stage * S::kSfA + (i * kNSB + j) * 512, src, 512, fb);
            }
          }
          if constexpr (!S::kPreconvertedB) {
            const int rbb = min(my_nt, p.row_blocks_b - 1);
            const uint8_t* srcb =
                p.sfb + pc.l * p.sfb_batch_stride + (static_cast<long long>(rbb) * p.k_blocks + kb4) * 512;
            BulkLoad(smem + S::kOffSfB + ring.stage * S::kSfB + j * 512, srcb, 512, fb);
          }
        }
      }
      ring.Advance();
    }
  }
}

// The pre-converted operands (kPre): per 64-K unit of each slab, the BF16 unit (bytes 128u.. of a
// row of PreconvertKernel's output) of A' and / or B' into a buffer of its ring.
template <int V, int MI, bool kSplitK, int kPre>
__device__ __forceinline__ void ProducePreconvertedUnits(const Cta<Smem<V, MI, kPre>>& cta, const CUtensorMap& tm_a,
                                                         const CUtensorMap& tm_b, bool lane0) {
  using S = Smem<V, MI, kPre>;
  constexpr int kUPS = VariantTraits<V>::kUnitsPerSlab;
  constexpr int kBM = S::kBM;
  const KParams& p = cta.p;
  const uint32_t smem = cta.smem;
  Ring<S::kAStages> a_ring;
  Ring<S::kBStages> b_ring;
  // The pre-converted operands are PreconvertKernel's output, the grid this one depends on
  // (the raw operands are the call's inputs: their copies need not wait).
  WaitForPrecedingGrids();
  for (int u = cta.cluster_id; u < p.units_total; u += cta.num_clusters) {
    const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
    const TileCoord pc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
    const int my_nt = pc.nt * S::kClusterCTAs + cta.rank;
    for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
#pragma unroll 1
      for (int ui = 0; ui < kUPS; ++ui) {
        const int k_byte = (slab * kUPS + ui) * 128;
        if constexpr (S::kPreconvertedA) {
          MbarWait(cta.bar.empty_a + 8 * a_ring.stage, a_ring.phase ^ 1);
          if (lane0) {
            const uint32_t fba = cta.bar.full_a + 8 * a_ring.stage;
            MbarArriveExpectTx(fba, S::kBufA);
            if constexpr (S::kPingPongTiles) {  // this CTA's half of the rows, into both CTAs
              constexpr int kHalf = kBM / 2;
#pragma unroll
              for (int bx = 0; bx < kHalf / kBoxA<S>; ++bx) {
                const int r0 = cta.rank * kHalf + bx * kBoxA<S>;
                TmaLoad3DMulticast(smem + S::kOffBufA + a_ring.stage * S::kBufA + r0 * 128, &tm_a, fba, k_byte,
                                   pc.mt * kBM + r0, pc.l, static_cast<uint16_t>(3));
              }
            } else {
#pragma unroll
              for (int bx = 0; bx < kBM / kBoxA<S>; ++bx)
                TmaLoad3D(smem + S::kOffBufA + a_ring.stage * S::kBufA + bx * kBoxA<S> * 128, &tm_a, fba, k_byte,
                          pc.mt * kBM + bx * kBoxA<S>, pc.l);
            }
          }
          a_ring.Advance();
        }
        if constexpr (S::kPreconvertedB) {
          MbarWait(cta.bar.empty_b + 8 * b_ring.stage, b_ring.phase ^ 1);
          if (lane0) {
            const uint32_t fbb = cta.bar.full_b + 8 * b_ring.stage;
            // A ping-pong cluster's second CTA past the last column (an odd count of column tiles)
            // loads no B': TMA's zero fill of a box wholly out of bounds is slow (it cost the whole
            // kernel 12-15% at 4096x1408x4096 and 3072x1920x4096). Its MMAs read stale shared
            // memory; the epilogue stores, and takes the amax of, no column >= n.
            const bool past_n = S::kClusterCTAs > 1 && my_nt * kBN >= p.n;
            MbarArriveExpectTx(fbb, past_n ? 0 : S::kBufB);
#pragma unroll
            for (int bx = 0; bx < (past_n ? 0 : kBN / kBoxB); ++bx)
              TmaLoad3D(smem + S::kOffBufB + b_ring.stage * S::kBufB + bx * kBoxB * 128, &tm_b, fbb, k_byte,
                        my_nt * kBN + bx * kBoxB, pc.l);
          }
          b_ring.Advance();
        }
      }
    }
  }
}

}  // namespace sm90
}  // namespace jga
