// The exact path of the SM90 kernels: a consumer warp whose tile the BF16 path cannot carry
// exactly (scales outside VariantTraits' safe range, see ScaleBound) computes its accumulators
// again on the CUDA cores, from the codes and scales in global memory, with the contract's block
// semantics (numerics.h). Slow (each element reads its row and column from L2) and only for such
// scales; the split-K hand-over and the epilogue then run as on the BF16 path.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/numerics.h"
#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_convert.cuh"

namespace jga {
namespace sm90 {

// Two codes as floats: FP8, the low 16 bits of x; E2M1, its low 8 bits.
template <int V>
__device__ __forceinline__ float2 DecodePair(uint32_t x) {
  if constexpr (VariantTraits<V>::kFp4) {
    return make_float2(DecodeE2M1(x & 0xFu), DecodeE2M1((x >> 4) & 0xFu));
  } else {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu),
                                                     V == kV_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half22float2(__half2(h));
  }
}

// C element (l, row, col) summed over K groups [g0, g1): per group the fp32 dot of the decoded
// codes (in K order, as the CPU backend sums them), times the scales (ScaleBlockDot), in fp32.
template <int V>
__device__ __forceinline__ float ExactElement(const KParams& p, int l, int row, int col, int g0, int g1) {
  using Tr = VariantTraits<V>;
  constexpr int kGroupBytes = Tr::kFp4 ? Tr::kSfv / 2 : Tr::kSfv;
  const uint8_t* a = p.a + (static_cast<long long>(l) * p.m + row) * p.row_bytes;
  const uint8_t* b = p.b + (static_cast<long long>(l) * p.n + col) * p.row_bytes;
  const uint8_t* sfa = p.sfa + l * p.sfa_batch_stride + static_cast<long long>(row >> 7) * p.k_blocks * 512;
  const uint8_t* sfb = p.sfb + l * p.sfb_batch_stride + static_cast<long long>(col >> 7) * p.k_blocks * 512;
  constexpr ScaleType kScale = Tr::kScaleE4M3 ? ScaleType::kE4M3 : ScaleType::kE8M0;
  float sum = 0.0f;
#pragma unroll 1
  for (int g = g0; g < g1; ++g) {
    const uint32_t* aw = reinterpret_cast<const uint32_t*>(a + static_cast<long long>(g) * kGroupBytes);
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(b + static_cast<long long>(g) * kGroupBytes);
    float dot = 0.0f;
#pragma unroll 1
    for (int w = 0; w < kGroupBytes / 4; ++w) {
      const uint32_t x = __ldg(aw + w), y = __ldg(bw + w);
#pragma unroll
      for (int h = 0; h < 32; h += Tr::kFp4 ? 8 : 16) {  // FP8: two codes per 16 bits; E2M1: two per 8
        const float2 u = DecodePair<V>(x >> h), v = DecodePair<V>(y >> h);
        dot = fmaf(u.x, v.x, dot);
        dot = fmaf(u.y, v.y, dot);
      }
    }
    const uint32_t off = (g >> 2) * 512;
    sum += ScaleBlockDot(dot, kScale, sfa[off + SfInBlock(row, g & 3)], sfb[off + SfInBlock(col, g & 3)]);
  }
  return sum;
}
// ExactElement of a weight-only problem (the kValuesA kernels): A's bfloat16 values (a_row_bytes
// apart) against B's codes, SFA = 1, as the CPU backend computes it.
template <int V>
__device__ __forceinline__ float ExactValuesElement(const KParams& p, int l, int row, int col, int g0, int g1) {
  using Tr = VariantTraits<V>;
  constexpr int kGroupBytes = Tr::kFp4 ? Tr::kSfv / 2 : Tr::kSfv;
  constexpr int kPerWord = Tr::kFp4 ? 8 : 4;                   // B's codes per 32-bit word
  constexpr uint8_t kUnitScale = Tr::kScaleE4M3 ? 0x38 : 127;  // 1.0 as an e4m3 / e8m0 byte
  const uint32_t* a = reinterpret_cast<const uint32_t*>(p.a + (static_cast<long long>(l) * p.m + row) * p.a_row_bytes);
  const uint8_t* b = p.b + (static_cast<long long>(l) * p.n + col) * p.row_bytes;
  const uint8_t* sfb = p.sfb + l * p.sfb_batch_stride + static_cast<long long>(col >> 7) * p.k_blocks * 512;
  constexpr ScaleType kScale = Tr::kScaleE4M3 ? ScaleType::kE4M3 : ScaleType::kE8M0;
  float sum = 0.0f;
#pragma unroll 1
  for (int g = g0; g < g1; ++g) {
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(b + static_cast<long long>(g) * kGroupBytes);
    float dot = 0.0f;
#pragma unroll 1
    for (int w = 0; w < kGroupBytes / 4; ++w) {
      const uint32_t y = __ldg(bw + w);
#pragma unroll
      for (int j = 0; j < kPerWord / 2; ++j) {  // codes 2j, 2j + 1 of the word against A's pair at k
        const int k = g * Tr::kSfv + w * kPerWord + 2 * j;
        const uint32_t x = __ldg(a + k / 2);
        const float2 v = DecodePair<V>(y >> (Tr::kFp4 ? 8 * j : 16 * j));
        dot = fmaf(__uint_as_float(x << 16), v.x, dot);
        dot = fmaf(__uint_as_float(x & 0xFFFF0000u), v.y, dot);
      }
    }
    const uint32_t off = (g >> 2) * 512;
    sum += ScaleBlockDot(dot, kScale, kUnitScale, sfb[off + SfInBlock(col, g & 3)]);
  }
  return sum;
}

// A lower bound of a pre-converted operand's ScaleBound (KParams::pre_bounds: 0 B', 1 A', where the
// passes' rare-path warps leave their bounds; the common path's are kSafeHalf). The passes have
// completed (this thread waits for the grids before the kernel, as the producer did).
template <int V>
__device__ __forceinline__ uint32_t PreBound(const KParams& p, int which) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p.pre_bounds + which) : "memory");
  return min(v, static_cast<uint32_t>(VariantTraits<V>::kSafeHalf));
}

// A consumer thread's accumulators (Epilogue's layout: acc[mi][4j + 2rr + e] is row
// row_w + FragRow(g) + 64mi + 8rr, column col_t + 2t + 8j + e) over K groups [g0, g1), exactly;
// 0 outside C. The elements go one at a time (a loop, not unrolled: 128 inlined copies of
// ExactElement would bloat every kernel), each written into its register by a compare per
// accumulator (acc with a run-time index would live in local memory).
template <int MI, int V, bool kValues>
__device__ __forceinline__ void ExactAccumulators(float (&acc)[MI][64], const KParams& p, int l, int row_w, int col_t,
                                                  int lane, int g0, int g1) {
  const int gr = FragRow(lane >> 2), t = lane & 3;
#pragma unroll 1
  for (int e = 0; e < MI * 64; ++e) {
    const int mi = e >> 6, i = e & 63;
    const int row = row_w + gr + 64 * mi + 8 * ((i >> 1) & 1);
    const int col = col_t + 2 * t + 8 * (i >> 2) + (i & 1);
    float v = 0.0f;
    if (row < p.m && col < p.n) {
      if constexpr (kValues) {
        v = ExactValuesElement<V>(p, l, row, col, g0, g1);
      } else {
        v = ExactElement<V>(p, l, row, col, g0, g1);
      }
    }
#pragma unroll
    for (int m2 = 0; m2 < MI; ++m2)
#pragma unroll
      for (int i2 = 0; i2 < 64; ++i2)
        if (64 * m2 + i2 == e) acc[m2][i2] = v;
  }
}

}  // namespace sm90
}  // namespace jga
