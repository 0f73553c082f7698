// Epilogue of the SM90 kernels: the accumulators scaled, encoded in C's dtype and stored (staged
// through shared memory for full tiles), with the NaN-propagating amax of what is stored, flushed
// per warp and batch item.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/problem.h"
#include "cuda/common/device.cuh"
#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_ptx.cuh"

namespace jga {
namespace sm90 {

// Epilogue of one consumer thread: rows row_w + FragRow(g) + mi*64 + {0, 8} (row_w: the warp's first row),
// columns col_t + 2t + 8j + {0, 1} (col_t: the tile's first column).
//
// Full tiles whose C rows start 16-byte aligned go through a 1 KB shared-memory staging buffer of
// the warp: per round the warp writes 8 rows x RB bytes of C there in its fragment layout, reads
// them back as 16-byte row chunks and stores whole 64/128-byte row segments (STG.128). Stored
// straight from the fragment layout, one warp store covered 8 rows x 16 bytes (bf16): 8 L1
// wavefronts for 512 bytes, which made the epilogue ~22% of the time at 16384x8192x1024.
// Staged chunks are XOR-swizzled so that the fragment-layout writes
// are free of bank conflicts.
template <int CT, int MI, int V>
__device__ __forceinline__ void Epilogue(float (&acc)[MI][64], const KParams& p, int l, int row_w, int col_t, bool full,
                                         uint32_t stage, int lane, float& amax_run) {
  const int gr = FragRow(lane >> 2), t = lane & 3;  // this thread's rows: gr, gr + 8 of each 16
  const size_t batch_off = static_cast<size_t>(l) * p.m;
  if (full && p.c_aligned16) {
    constexpr int PB = kPairBytes<CT>;      // bytes of one thread's pair; 4 * PB per row per j
    constexpr int RB = PB == 1 ? 64 : 128;  // staged bytes per row and round (a tile row of e2m1 is 64)
    constexpr int JR = RB / (4 * PB);       // 8-column groups per round
    constexpr int CPR = RB / 16;            // 16-byte chunks per staged row
    // Chunk swizzle: the 8 rows of a fragment-layout store land in distinct banks.
    auto swz = [](int row, int chunk) {
      return PB == 8 ? chunk ^ ((2 * row) & 6) : PB == 1 ? chunk ^ ((row >> 1) & 3) : chunk ^ (row & 7);
    };
    const size_t row_pitch = static_cast<size_t>(p.n) * PB / 2;  // bytes (PB / 2 per element; e2m1: n / 2)
    uint8_t* const c_tile =
        static_cast<uint8_t*>(p.c) + (batch_off + row_w) * row_pitch + static_cast<size_t>(col_t) * PB / 2;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
        for (int cb = 0; cb < 16 / JR; ++cb) {
#pragma unroll
          for (int jj = 0; jj < JR; ++jj) {
            const int j = cb * JR + jj;
            const float v0 = acc[mi][4 * j + 2 * rr], v1 = acc[mi][4 * j + 2 * rr + 1];
            amax_run = AbsMaxNaN(amax_run, v0);
            amax_run = AbsMaxNaN(amax_run, v1);
            const uint64_t bits = EncodePair<CT>(v0, v1);
            const int off = jj * 4 * PB + t * PB;
            const uint32_t addr = stage + gr * RB + (swz(gr, off >> 4) << 4) + (off & 15);
            if constexpr (PB == 8) {
              asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(addr), "r"(static_cast<uint32_t>(bits)),
                           "r"(static_cast<uint32_t>(bits >> 32)));
            } else if constexpr (PB == 4) {
              asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(static_cast<uint32_t>(bits)));
            } else if constexpr (PB == 2) {
              asm volatile("st.shared.b16 [%0], %1;" ::"r"(addr), "h"(static_cast<uint16_t>(bits)));
            } else {
              asm volatile("st.shared.b8 [%0], %1;" ::"r"(addr), "r"(static_cast<uint32_t>(bits)));
            }
          }
          __syncwarp();
#pragma unroll
          for (int h = 0; h < CPR / 4; ++h) {
            const int r = h * (32 / CPR) + lane / CPR, c = lane % CPR;
            const uint4 v = Lds128(stage + r * RB + (swz(r, c) << 4));
            uint8_t* dst = c_tile + (mi * 64 + rr * 8 + r) * row_pitch + cb * RB + c * 16;
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                         : "memory");
          }
          __syncwarp();
        }
      }
    }
    return;
  }
#pragma unroll 1
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = row_w + gr + mi * 64 + rr * 8;
      if (row >= p.m) continue;
      const size_t row_idx = (batch_off + row) * static_cast<size_t>(p.n);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = col_t + 2 * t + 8 * j;
        if (col >= p.n) continue;
        // acc[mi] with a run-time mi would be indexed through local memory.
        const float v0 = (mi == 0) ? acc[0][4 * j + 2 * rr] : acc[MI - 1][4 * j + 2 * rr];
        const float v1 = (mi == 0) ? acc[0][4 * j + 2 * rr + 1] : acc[MI - 1][4 * j + 2 * rr + 1];
        const bool two = col + 1 < p.n;
        amax_run = AbsMaxNaN(amax_run, v0);
        if (two) amax_run = AbsMaxNaN(amax_run, v1);
        StorePair<CT>(p.c, row_idx + col, v0, v1, two);
      }
    }
  }
}

// The epilogue in C's dtype: one straight-line path per output dtype (a switch once per tile).
template <int MI, int V>
__device__ __forceinline__ void EpilogueAnyType(float (&acc)[MI][64], const KParams& p, int l, int row_w, int col_t,
                                                bool full, uint32_t stage, int lane, float& amax_run) {
  auto epilogue = [&](auto ct) {
    Epilogue<decltype(ct)::value, MI, V>(acc, p, l, row_w, col_t, full, stage, lane, amax_run);
  };
  switch (p.c_type) {
    case static_cast<int>(OutputType::kF32): epilogue(std::integral_constant<int, 0>{}); break;
    case static_cast<int>(OutputType::kF16): epilogue(std::integral_constant<int, 1>{}); break;
    case static_cast<int>(OutputType::kBF16): epilogue(std::integral_constant<int, 2>{}); break;
    case static_cast<int>(OutputType::kE4M3): epilogue(std::integral_constant<int, 3>{}); break;
    case static_cast<int>(OutputType::kE5M2): epilogue(std::integral_constant<int, 4>{}); break;
    default: epilogue(std::integral_constant<int, 5>{}); break;
  }
}

}  // namespace sm90
}  // namespace jga
