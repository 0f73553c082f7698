// Device helpers every CUDA kernel of the library shares (arch-neutral, sm_89+ PTX): C's encoding
// and stores, the NaN-propagating amax and its flush, and the launch's zeroing round on a reset
// word. One definition for all kernels, so that C and amax mean the same whichever kernel runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace jga {

// |m| = max(|m|, |v|), NaN-propagating (sign of the result is junk; fabs at the end).
__device__ __forceinline__ float AbsMaxNaN(float m, float v) {
  float r;
  asm("max.NaN.xorsign.abs.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(v));
  return r;
}

// The e2m1 code of x: round to nearest even, saturating at 6; NaN -> 0x7 (e2m1 has no NaN).
__device__ __forceinline__ uint32_t EncodeFp4Nibble(float x) {
  if (isnan(x)) return 0x7u;
  const float a = fabsf(x);
  uint32_t c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return c | (signbit(x) ? 0x8u : 0u);
}

// Two adjacent elements of C (col even) encoded in the output format: f32 8 bytes, f16/bf16 4,
// fp8 2, packed e2m1 1 (low nibble first). The FP8/FP4 formats saturate.
template <int CT>
constexpr int kPairBytes = OutputBits(static_cast<OutputType>(CT)) / 4;
template <int CT>
__device__ __forceinline__ uint64_t EncodePair(float v0, float v1) {
  if constexpr (CT == static_cast<int>(OutputType::kF32)) {
    return static_cast<uint64_t>(__float_as_uint(v0)) | (static_cast<uint64_t>(__float_as_uint(v1)) << 32);
  } else if constexpr (CT == static_cast<int>(OutputType::kF16)) {
    const __half2 h = __floats2half2_rn(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else if constexpr (CT == static_cast<int>(OutputType::kBF16)) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else if constexpr (CT == static_cast<int>(OutputType::kE4M3)) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(v1), "f"(v0));
    return r;
  } else if constexpr (CT == static_cast<int>(OutputType::kE5M2)) {
    uint16_t r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(v1), "f"(v0));
    return r;
  } else {
    return EncodeFp4Nibble(v0) | (EncodeFp4Nibble(v1) << 4);
  }
}

// Stores one pair (or, if !two, its first element) at element index idx (even for packed e2m1,
// where N is even so `two` always holds).
template <int CT>
__device__ __forceinline__ void StorePair(void* c, size_t idx, float v0, float v1, bool two) {
  constexpr int PB = kPairBytes<CT>;
  const uint64_t bits = EncodePair<CT>(v0, v1);
  uint8_t* p = static_cast<uint8_t*>(c) + (PB == 1 ? idx / 2 : idx * (PB / 2));
  if constexpr (PB == 8) {
    if (two) *reinterpret_cast<uint2*>(p) = make_uint2(static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32));
    else *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(bits);
  } else if constexpr (PB == 4) {
    if (two) *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(bits);
    else *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(bits);
  } else if constexpr (PB == 2) {
    if (two) *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(bits);
    else *p = static_cast<uint8_t>(bits);
  } else {
    *p = static_cast<uint8_t>(bits);
  }
}

__device__ __forceinline__ void FlushAmax(float m, float* amax, int l) {
  uint32_t bits = __float_as_uint(m) & 0x7FFFFFFFu;
  bits = __reduce_max_sync(0xFFFFFFFFu, bits);
  // A predicated reduction, not a branch: a divergent branch in the consumer's tile loop makes
  // ptxas serialize every WGMMA of the kernel (C7518).
  const uint32_t leader = ((threadIdx.x & 31) == 0 && bits != 0u) ? 1u : 0u;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.u32 p, %2, 0;\n"
      "@p red.relaxed.gpu.global.max.u32 [%0], %1;\n"
      "}\n" ::"l"(reinterpret_cast<unsigned int*>(amax) + l),
      "r"(bits), "r"(leader)
      : "memory");
}

// The launch's zeroing round on a reset word, a grid barrier word as cooperative groups keep theirs
// (cooperative_groups/details/sync.h): zeroed once when allocated, never reset. Every CTA of a
// cooperative launch arrives once, CTA 0 after it has zeroed amax (and any counters) and made that
// visible; CTA 0 adds 0x80000000 - (CTAs - 1), every other CTA 1, so a complete round flips bit 31
// and leaves the low bits at zero for the next launch. ResetArrive returns the word before the
// arrival, which ResetWait compares against: once the bit has flipped, every CTA's zeroes are
// visible (release/acquire), and atomics on what was zeroed may start.
__device__ __forceinline__ uint32_t ResetArrive(unsigned int* word) {
  const uint32_t add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
  uint32_t old;
  asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(add) : "memory");
  return old;
}
__device__ __forceinline__ void ResetWait(const unsigned int* word, uint32_t old) {
  uint32_t now;
  do {
    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
    if (((now ^ old) & 0x80000000u) == 0u) __nanosleep(100);
  } while (((now ^ old) & 0x80000000u) == 0u);
}

}  // namespace jga
