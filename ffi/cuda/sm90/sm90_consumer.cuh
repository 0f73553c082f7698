// The consumer role of the SM90 kernels (the last two warpgroups): per work unit, the main loop of
// BF16 WGMMAs into FP32 accumulators (A converted in registers, RS, or pre-converted, SS; B from
// the converter's or the producer's BF16 buffers), then the split-K hand-over and the epilogue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_convert.cuh"
#include "cuda/sm90/sm90_epilogue.cuh"
#include "cuda/sm90/sm90_exact.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/sm90_scheduler.cuh"
#include "cuda/sm90/sm90_split_k.cuh"

namespace jga {
namespace sm90 {

template <int V, int MI, bool kSplitK, int kPre>
__device__ __forceinline__ void Consume(const Cta<Smem<V, MI, kPre>>& cta) {
  using Tr = VariantTraits<V>;
  using S = Smem<V, MI, kPre>;
  using R = Roles<MI>;
  constexpr int kBM = S::kBM;
  constexpr int kUPS = Tr::kUnitsPerSlab;
  constexpr int kNSB = Tr::kScaleBlocksPerSlab;
  constexpr bool kPP = S::kPingPongTiles;
  constexpr int kAReaderCTAs = kPP ? 2 : 1;  // CTAs whose consumers read an A' stage
  const KParams& p = cta.p;
  const uint32_t smem = cta.smem;
  const Barriers<S>& bar = cta.bar;
  const int lane = cta.lane;
  const int wg = (cta.warp_idx - R::kFirstConsumerWarp) / 4;
  const int warp = cta.warp_idx & 3;
  const int g = lane >> 2;
  const int t = lane & 3;
  Ring<S::kRawStages> r_ring;
  Ring<S::kBStages> b_ring;
  float amax_run = 0.0f;
  int cur_l = -1;
  const bool do_amax = (p.flags & kFlagNoAmax) == 0;

  float acc[MI][64];
  // Software pipeline over MMA "steps" (one step = one 64-K unit x one 64-row slice): step s
  // converts its A fragment into frag[s & 1] while the WGMMAs of step s-1 (the other buffer) run,
  // then issues its own and waits for step s-1 only. Both buffers are loop-carried and read by an
  // empty asm after the wait that retires them: ptxas does not track registers an in-flight RS
  // WGMMA reads and would otherwise place new values on top of them.
  uint32_t frag[2][4][4];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) frag[b][s][r] = 0u;
  auto keep_alive = [](const uint32_t (&f)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" ::"r"(f[s][r]));
  };
  int inflight_b_stage = -1;  // B stage of the unit whose last WGMMA group may still run
  Ring<S::kAStages> a_ring;
  int inflight_a_stage = -1;  // the same for pre-converted A
  // Slab-invariant parts of this thread's A and scale addresses: rows row0 + mi*64 + rr*8.
  const int gr = FragRow(g);  // every row of this thread is gr mod 8
  const int row0 = wg * 64 * MI + warp * 16 + gr;
  const uint32_t a_row_off = static_cast<uint32_t>(row0) * 128u;
  uint32_t sf_row_off[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = row0 + mi * 64 + rr * 8;
      sf_row_off[mi][rr] = static_cast<uint32_t>((row >> 7) * kNSB * 512) + SfInBlock(row, 0);
    }

  // Ping-pong: this warpgroup takes every other tile of the CTA, and the ring positions of the
  // other warpgroup's tiles (whole tiles, all of K) are skipped.
  const int units_per_tile = p.num_kslabs * kUPS;
  auto skip_units = [&](int n) {
    if constexpr (kPP) {  // (no A' ring otherwise)
      const int ai = a_ring.stage + n, bi = b_ring.stage + n;
      a_ring.phase ^= (ai / S::kAStages) & 1;
      a_ring.stage = ai % S::kAStages;
      b_ring.phase ^= (bi / S::kBStages) & 1;
      b_ring.stage = bi % S::kBStages;
    }
  };
  int pp_turns = 0;  // ping-pong: this warpgroup's main loops so far (the order barrier's parity)
  if (kPP && wg == 1) skip_units(units_per_tile);
  for (int u = cta.cluster_id + (kPP ? wg * cta.num_clusters : 0); u < p.units_total;
       u += (kPP ? 2 : 1) * cta.num_clusters) {
    const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
    const TileCoord tc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
    if constexpr (kPP) MbarWait(bar.order + 8 * wg, pp_turns & 1);  // the other warpgroup's main loop is issued
    if (tc.l != cur_l) {
      if (cur_l >= 0 && do_amax) FlushAmax(amax_run, p.amax, cur_l);
      amax_run = 0.0f;
      cur_l = tc.l;
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[mi][i] = 0.0f;
    // Lower bounds of this tile's ScaleBound: of this thread's A rows (kSafeHalf unless a rare
    // fragment lowers it), of the B tile (the converter warps' words, published with each unit).
    uint32_t a_bound = Tr::kSafeHalf, b_bound = kNoBound;
    auto read_b_bound = [&] {
      if constexpr (!S::kPreconvertedB && !Tr::kScaleE4M3) {
        const uint4 w = Lds128(smem + S::kOffFlagsB + 16 * b_ring.stage);
        b_bound = min(b_bound, min(min(w.x, w.y), min(w.z, w.w)));
      }
    };

    for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
      if constexpr (S::kPreconvertedA) {
        // A arrives as BF16 (PreconvertKernel): per unit, wait for its A and B buffers, issue the
        // SS WGMMAs of this warpgroup's 64-row blocks, retire the previous unit's group and hand
        // its buffers back.
#pragma unroll 1
        for (int ui = 0; ui < kUPS; ++ui) {
          MbarWait(bar.full_a + 8 * a_ring.stage, a_ring.phase);
          MbarWait(bar.full_b + 8 * b_ring.stage, b_ring.phase);
          read_b_bound();
          const uint64_t desc_b = SmemDesc128B(smem + S::kOffBufB + b_ring.stage * S::kBufB);
          const uint32_t buf_a = smem + S::kOffBufA + a_ring.stage * S::kBufA + (kPP ? 0 : wg * (64 * MI) * 128);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) FenceOperand(acc[mi]);
          WgmmaFence();
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            const uint64_t desc_a = SmemDesc128B(buf_a + mi * 64 * 128);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) WgmmaSS_m64n128k16(acc[mi], desc_a + 2 * ks, desc_b + 2 * ks);
          }
          WgmmaCommit();
          WgmmaWait<1>();  // retires the previous unit
          __syncwarp();
          MbarArriveClusterIf<kAReaderCTAs>(bar.empty_a + 8 * inflight_a_stage, lane == 0 && inflight_a_stage >= 0);
          MbarArriveIf(bar.empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
          inflight_a_stage = a_ring.stage;
          inflight_b_stage = b_ring.stage;
          a_ring.Advance();
          b_ring.Advance();
        }
      } else {
        MbarWait(bar.full_raw + 8 * r_ring.stage, r_ring.phase);
        const uint32_t raw_a = smem + S::kOffRawA + r_ring.stage * S::kRawA;
        const uint32_t sfa = smem + S::kOffSfA + r_ring.stage * S::kSfA;
        // fp8: all four scale bytes of the slab of each of this thread's rows are one aligned word;
        // loaded once per slab, they are in registers long before the second unit needs them.
        uint32_t sf_words[MI][2] = {};
        if constexpr (!Tr::kFp4) {
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) sf_words[mi][rr] = Lds32(sfa + sf_row_off[mi][rr]);
        }
        constexpr int RW = kAWords<V>;
        // Units run as a real loop (two at a time when MI == 1, so that the fragment buffer index
        // stays a compile-time constant): fully unrolled, ptxas gives every step's fragments
        // registers of their own and runs out of them (wgmma serialization, C7511, for fp4).
        constexpr int kUnitUnroll = (MI == 2) ? 1 : 2;
#pragma unroll kUnitUnroll
        for (int ui = 0; ui < kUPS; ++ui) {
          const int gis = GroupInSlab<V>(ui, t);
          const bool gvalid = slab * Tr::kGroupsPerSlab + gis < p.k_groups;
          const uint64_t desc_b = SmemDesc128B(smem + S::kOffBufB + b_ring.stage * S::kBufB);  // this unit's BF16 B
          // This unit's A codes (16 bytes per row: chunk `chunk` of the row, 128B-swizzled; every
          // row of this thread has row % 8 == gr) and, fp4, scale bytes of (mi, rr) packed in svp.
          const int chunk = UnitChunk<V>(ui, t);
          const uint32_t a_addr = raw_a + a_row_off + (((chunk ^ gr) << 4) | (Tr::kFp4 ? 8 * (ui & 1) : 0));
          const uint32_t s_addr = sfa + (gis >> 2) * 512 + (gis & 3);
          uint32_t rawv[MI][2][RW];
          uint32_t svp = 0u;
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const uint32_t addr = a_addr + (mi * 64 + rr * 8) * 128;
              if constexpr (!Tr::kFp4) {
                const uint4 q = Lds128(addr);
                rawv[mi][rr][0] = q.x;
                rawv[mi][rr][1] = q.y;
                rawv[mi][rr][RW - 2] = q.z;
                rawv[mi][rr][RW - 1] = q.w;
              } else {
                const uint2 q = Lds64(addr);
                rawv[mi][rr][0] = q.x;
                rawv[mi][rr][1] = q.y;
              }
              if constexpr (Tr::kFp4) svp |= Lds8(s_addr + sf_row_off[mi][rr]) << (8 * (mi * 2 + rr));
            }
          }
          const uint32_t sf_sel = 0x4440u + static_cast<uint32_t>(gis & 3);  // PRMT: byte gis of a word
          auto scale_byte = [&](int mi, int rr) -> uint32_t {
            if constexpr (Tr::kFp4) {
              return (svp >> (8 * (mi * 2 + rr))) & 0xFFu;
            } else {
              return __byte_perm(sf_words[mi][rr], 0u, sf_sel);
            }
          };

#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            // Buffer of this step: steps alternate buffers (kUPS is even, so the parity of the
            // unit index is the parity of the step when MI == 1).
            const int fb = (MI == 2) ? mi : (ui & 1);
            uint32_t (&f)[4][4] = frag[fb];
            // Pin the conversion below the previous step's wait (asm volatile statements keep their
            // order): hoisted above it, its results would need registers besides frag[fb]'s.
#pragma unroll
            for (int rr = 0; rr < 2; ++rr)
#pragma unroll
              for (int w = 0; w < RW; ++w) asm volatile("" : "+r"(rawv[mi][rr][w]));
            ConvertAFragment<V>(rawv[mi], [&](int rr) { return scale_byte(mi, rr); }, gvalid, a_bound, f);
            // The slab's last step has consumed every value loaded from the raw stage: hand it back
            // (after the conversion, so that the fence finds no load of this thread in flight).
            if (ui == kUPS - 1 && mi == MI - 1) ReleaseRawStage(bar.empty_raw + 8 * r_ring.stage, lane);
            if (mi == 0) {
              MbarWait(bar.full_b + 8 * b_ring.stage, b_ring.phase);
              read_b_bound();
            }
            FenceOperand(acc[mi]);
            WgmmaFence();
#pragma unroll
            for (int s = 0; s < 4; ++s) {  // k-step s starts 32 bytes (2 descriptor units) further
              WgmmaRS_m64n128k16(acc[mi], f[s][0], f[s][1], f[s][2], f[s][3], desc_b + 2 * s);
            }
            WgmmaCommit();
            WgmmaWait<1>();  // retires step s-1
            keep_alive(frag[fb ^ 1]);
            // Step s-1 was the last step of the previous unit: its B buffer is free.
            if (mi == 0) {
              __syncwarp();
              MbarArriveIf(bar.empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
            }
          }
          inflight_b_stage = b_ring.stage;
          b_ring.Advance();
        }
        r_ring.Advance();
      }
    }
    if constexpr (kPP) {  // this tile's MMAs are issued: the other warpgroup's turn
      MbarArriveIf(bar.order + 8 * (wg ^ 1), threadIdx.x % 128 == 0);
      ++pp_turns;
    }
    // Drain the pipeline before the accumulators are read.
    WgmmaWait<0>();
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) FenceOperand(acc[mi]);
    keep_alive(frag[0]);
    keep_alive(frag[1]);
    __syncwarp();
    MbarArriveIf(bar.empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
    inflight_b_stage = -1;
    if constexpr (S::kPreconvertedA) {
      MbarArriveClusterIf<kAReaderCTAs>(bar.empty_a + 8 * inflight_a_stage, lane == 0 && inflight_a_stage >= 0);
      inflight_a_stage = -1;
    }

    // From here on the accumulators hold C itself (FP4: without the operands' offset 2^-2D).
    if constexpr (Tr::kFp4) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[mi][i] *= Tr::kAccScale;
    }
    // The warp's first row of C and the tile's first column (computed where used: live through
    // the split-K hand-over, they cost the split kernels spills).
    auto row_w = [&] { return tc.mt * kBM + (kPP ? 0 : wg * 64 * MI) + warp * 16; };
    auto col_t = [&] { return (tc.nt * S::kClusterCTAs + cta.rank) * kBN; };
    if constexpr (!Tr::kScaleE4M3) {
      // Scales the BF16 path does not carry exactly (VariantTraits::kSafe*): this warp's
      // accumulators again, on the CUDA cores, over the unit's K range.
      const uint32_t ab = S::kPreconvertedA ? PreBound<V>(p, 1) : __reduce_min_sync(0xFFFFFFFFu, a_bound);
      const uint32_t bb = S::kPreconvertedB ? PreBound<V>(p, 0) : b_bound;
      if (ab == 0u || bb == 0u || ab + bb < static_cast<uint32_t>(Tr::kSafeSum)) {
        ExactAccumulators<MI, V, S::kValuesInA>(acc, p, tc.l, row_w(), col_t(), lane, wu.slab_lo * Tr::kGroupsPerSlab,
                                                min(wu.slab_hi * Tr::kGroupsPerSlab, p.k_groups));
      }
    }

    MbarWait(bar.reset, 0);  // amax and the split-K counters are zero (ResetRound): before any atomic on them
    if constexpr (kSplitK) {
      const int ctid = threadIdx.x - 32 * R::kFirstConsumerWarp;
      if (wu.split < wu.splits - 1) {
        StorePartial<MI>(acc, p, wu, ctid);
        continue;  // the reducer stores this tile and takes its amax
      }
      if (wu.splits > 1) {
        WaitForPartials(p, wu);
        AddPartials<MI>(acc, p, wu, ctid);
      }
    }

    const bool full = (tc.mt * kBM + kBM <= p.m) && (col_t() + kBN <= p.n);
    const uint32_t stage = smem + S::kOffStage + (cta.warp_idx - R::kFirstConsumerWarp) * kStageBytesPerWarp;
    EpilogueAnyType<MI, V>(acc, p, tc.l, row_w(), col_t(), full, stage, lane, amax_run);
    if constexpr (kPP) skip_units(units_per_tile);  // the other warpgroup's next tile
  }
  if (cur_l >= 0 && do_amax) FlushAmax(amax_run, p.amax, cur_l);
}

}  // namespace sm90
}  // namespace jga
