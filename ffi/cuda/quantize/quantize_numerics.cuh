// Device arithmetic of the quantize kernels, bit for bit that of jax_gemm_amax/quantize.py (which
// defines it; XLA compiles it on the GPU to the same instructions used here):
//   * the block amax is taken on |x| as bits, where NaN (above +Inf as an unsigned integer) is
//     clamped to +Inf for the scale and kept, canonical, for the global amax;
//   * MX: ratio = amax * fl(1/max) (the reciprocal as an fp32 constant, as quantize.py writes
//     it), exponent = ceil(log2(ratio)) as frexp gives it, in [-127, 127] (-127 for amax 0); a
//     non-finite block gets scale 0xFF and its values at scale 1; values times 2^-exponent, exact;
//   * NVFP4: scale = e4m3(min(amax * fl(1/6), 448)), values times fl(1 / scale) (0 where the
//     scale is 0); a non-finite block gets scale 0x7F and its values at scale 1;
//   * FP8 codes: cvt.rn.satfinite (round to nearest even, saturating, NaN stays NaN), the
//     instruction XLA emits for quantize.py's clip + convert; FP4 codes: e2m1_codes' comparisons
//     (E2M1Code; MXFP4 from bf16 two at a time in bf16 arithmetic, E2M1CodesBF16x2).
// Built without fast math and without flushing subnormals: every multiply is __fmul_rn.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/quantize_problem.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "the quantize kernels use cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 and {add,sub,mul}.rn.bf16x2 (sm_90 and later)"
#endif

namespace jga::quantize {

constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kCanonicalNaNBits = 0x7FC00000u;

template <QuantizeFormat F>
struct FormatTraits;
template <>
struct FormatTraits<QuantizeFormat::kMxfp8E4M3> {
  static constexpr int kVec = 32;
  static constexpr bool kFp4 = false, kMx = true;
  static constexpr float kInvMax = 1.0f / 448.0f;
};
template <>
struct FormatTraits<QuantizeFormat::kMxfp8E5M2> {
  static constexpr int kVec = 32;
  static constexpr bool kFp4 = false, kMx = true;
  static constexpr float kInvMax = 1.0f / 57344.0f;
};
template <>
struct FormatTraits<QuantizeFormat::kMxfp4> {
  static constexpr int kVec = 32;
  static constexpr bool kFp4 = true, kMx = true;
  static constexpr float kInvMax = 1.0f / 6.0f;
};
template <>
struct FormatTraits<QuantizeFormat::kNvfp4> {
  static constexpr int kVec = 16;
  static constexpr bool kFp4 = true, kMx = false;
  static constexpr float kInvMax = 1.0f / 6.0f;
};

// An input type's elements in 32-bit words (two of a 16-bit type, low half first). |x| as bits
// orders like |x| in every type (NaN above +Inf), so a block's max |x| is an unsigned max over the
// words with their sign bits cleared: two 16-bit elements per instruction (__vmaxu2).
template <QuantizeInput I>
struct InputTraits;
template <>
struct InputTraits<QuantizeInput::kF32> {
  using T = float;
  __device__ __forceinline__ static float FromBits(uint32_t word, int) { return __uint_as_float(word); }
  // |x| of a word's elements, their elementwise max, and one element's |x| as fp32 bits (below).
  __device__ __forceinline__ static uint32_t AbsWord(uint32_t word) { return word & 0x7FFFFFFFu; }
  __device__ __forceinline__ static uint32_t MaxWord(uint32_t a, uint32_t b) { return max(a, b); }
  __device__ __forceinline__ static uint32_t AbsBitsOf(uint32_t abs_word, int) { return abs_word; }
};
template <>
struct InputTraits<QuantizeInput::kF16> {
  using T = __half;
  __device__ __forceinline__ static float FromBits(uint32_t word, int half) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(word >> (16 * half))));
  }
  __device__ __forceinline__ static uint32_t AbsWord(uint32_t word) { return word & 0x7FFF7FFFu; }
  __device__ __forceinline__ static uint32_t MaxWord(uint32_t a, uint32_t b) { return __vmaxu2(a, b); }
  __device__ __forceinline__ static uint32_t AbsBitsOf(uint32_t abs_word, int half) {
    return __float_as_uint(FromBits(abs_word, half));  // exact; a NaN stays above +Inf
  }
};
template <>
struct InputTraits<QuantizeInput::kBF16> {
  using T = __nv_bfloat16;
  __device__ __forceinline__ static float FromBits(uint32_t word, int half) {
    // bf16 is fp32's upper half: one byte permutation, also where `half` is not a constant.
    return __uint_as_float(__byte_perm(word, 0u, half ? 0x3244u : 0x1044u));
  }
  __device__ __forceinline__ static uint32_t AbsWord(uint32_t word) { return word & 0x7FFF7FFFu; }
  __device__ __forceinline__ static uint32_t MaxWord(uint32_t a, uint32_t b) { return __vmaxu2(a, b); }
  __device__ __forceinline__ static uint32_t AbsBitsOf(uint32_t abs_word, int half) {
    return __float_as_uint(FromBits(abs_word, half));
  }
};

// The elements of one 16-byte vector of input as fp32 (from the words, not through memory).
template <QuantizeInput I>
__device__ __forceinline__ void FromVector(const uint4& raw, float* v) {
  constexpr int kPerWord = I == QuantizeInput::kF32 ? 1 : 2;
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4 * kPerWord; ++i) v[i] = InputTraits<I>::FromBits(words[i / kPerWord], i % kPerWord);
}

// |v| as bits: unsigned order is float order for magnitudes, NaN above +Inf.
__device__ __forceinline__ uint32_t AbsBits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

// The global amax contribution of a block's max |x| bits: NaN canonical.
__device__ __forceinline__ uint32_t AmaxBits(uint32_t abs_bits) {
  return abs_bits > kInfBits ? kCanonicalNaNBits : abs_bits;
}

// 2^k for k in [-127, 127] from its bits (formats.exact_pow2: 2^-127 is the one subnormal).
__device__ __forceinline__ float ExactPow2(int k) {
  return __uint_as_float(k >= -126 ? static_cast<uint32_t>(k + 127) << 23 : 1u << 22);
}

// ceil(log2(r)) for finite r > 0, subnormals included.
__device__ __forceinline__ int CeilLog2(float r) {
  const uint32_t bits = __float_as_uint(r);
  const uint32_t e = bits >> 23, man = bits & 0x7FFFFFu;
  if (e == 0) {  // subnormal: r = man * 2^-149
    const int floor_log2 = 31 - __clz(man) - 149;
    return (man & (man - 1)) == 0 ? floor_log2 : floor_log2 + 1;
  }
  return static_cast<int>(e) - 127 + (man != 0);
}

// The scale of one block from its max |x| bits: its byte and the factor its values are multiplied by.
struct BlockScale {
  uint8_t code;
  float mul;  // 0 for an NVFP4 block of scale 0 (its values become +0)
};

__device__ __forceinline__ uint8_t CvtE4M3(float v) {
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(0.0f), "f"(v));
  return static_cast<uint8_t>(out & 0xFF);
}

__device__ __forceinline__ float DecodeE4M3Scale(uint8_t c) {  // c in [0, 0x7E]: finite, non-negative
  const uint32_t e = c >> 3, m = c & 7;
  // Exactly the value: a subnormal m * 2^-9, or (8 + m) * 2^(e - 10).
  return e == 0 ? __fmul_rn(static_cast<float>(m), ExactPow2(-9))
                : __fmul_rn(static_cast<float>(8 + m), ExactPow2(static_cast<int>(e) - 10));
}

template <QuantizeFormat F>
__device__ __forceinline__ BlockScale ScaleOf(uint32_t abs_bits) {
  using FT = FormatTraits<F>;
  if (abs_bits >= kInfBits) return {static_cast<uint8_t>(FT::kMx ? 0xFF : 0x7F), 1.0f};  // NaN or Inf
  const float amax = __uint_as_float(abs_bits);
  if constexpr (FT::kMx) {
    // A ratio that underflows to 0 (amax below 2^-149 times the format's max: an all-subnormal
    // block) clamps to -127 as ceil(log2(0)) would, like an all-zero block.
    const float ratio = __fmul_rn(amax, FT::kInvMax);
    int exponent = ratio > 0.0f ? CeilLog2(ratio) : -127;
    exponent = min(max(exponent, -127), 127);
    return {static_cast<uint8_t>(exponent + 127), ExactPow2(-exponent)};
  } else {
    const uint8_t code = CvtE4M3(fminf(__fmul_rn(amax, FT::kInvMax), 448.0f));
    const float s = DecodeE4M3Scale(code);
    return {code, s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f};
  }
}

// Two FP8 codes (lo = the even element) from scaled values.
template <QuantizeFormat F>
__device__ __forceinline__ uint16_t Fp8Pair(float lo, float hi) {
  uint16_t out;
  if constexpr (F == QuantizeFormat::kMxfp8E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  }
  return out;
}

// formats.e2m1_codes: round to nearest even over the midpoints, saturate at 6, NaN -> +6 (code 7),
// sign bit 8 (negative zero included). The rounding is (a + C) - C with C = 2^23 times the grid
// step of a's binade (0.5 below 2, 1 in [2, 4), 2 above), and the grid value r times 2^-126 is an
// fp32 number whose bits >> 22 are the code (e2m1 is fp32 with 1 mantissa bit, exponent bias 1):
// fewer instructions than seven comparisons and their sums, and the same code for every fp32 input
// (checked exhaustively against the comparisons).
__device__ __forceinline__ uint32_t E2M1Code(float v) {
  const float a = fminf(fabsf(v), 6.0f);  // saturates; Inf and NaN (fminf drops it) become 6: code 7
  const float c = __uint_as_float(max(__float_as_uint(a) & 0x7F800000u, 0x3F800000u) + (22u << 23));
  const float r = __fsub_rn(__fadd_rn(a, c), c);
  const uint32_t code = __float_as_uint(__fmul_rn(r, 0x1p-126f)) >> 22;
  return v == v ? code | ((__float_as_uint(v) >> 28) & 8u) : code;
}

// MXFP4 codes of the two bf16 elements of `word` (bits 0-3: the low half, 16-19: the high half)
// times the power-of-two multipliers in `mul2` (bf16 each), the same codes as E2M1Code of their
// fp32 products in about half its instructions per element (counted in the SASS): the bf16 product is exact (it rounds
// only below bf16's normal range, far under e2m1's first midpoint, and keeps its sign), and the
// rounding is E2M1Code's (a + C) - C on the bf16 grid (7 mantissa bits: C = 2^6 times the step).
// Checked for every bf16 input and multiplier 2^-127..2^127 against E2M1Code in an emulation of
// bf16 arithmetic (one rounding per operation), and on the GPU by the quantize tests' bf16 grid.
__device__ __forceinline__ uint32_t E2M1CodesBF16x2(uint32_t word, uint32_t mul2) {
  uint32_t s, a6, c, r, m;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(s) : "r"(word), "r"(mul2));
  const uint32_t a = s & 0x7FFF7FFFu;
  asm("min.bf16x2 %0, %1, %2;" : "=r"(a6) : "r"(a), "r"(0x40C040C0u));  // 6: saturates, NaN becomes 6
  asm("max.bf16x2 %0, %1, %2;" : "=r"(c) : "r"(a6), "r"(0x3F803F80u));  // the binade, 1 at least
  c = (c & 0x7F807F80u) + 0x03000300u;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a6), "r"(c));
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(r), "r"(c));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(r), "r"(0x00800080u));  // times 2^-126: bits >> 6 are the code
  const uint32_t sign = s & ~(a + 0x007F007Fu) & 0x80008000u;             // a NaN's sign is dropped
  return ((m << 6) | sign) >> 12;
}

// Four MXFP4 codes of two bf16 words (elements in order, two per word) in the low 16 bits; the
// high bits are not cleared.
__device__ __forceinline__ uint32_t E2M1Codes4BF16(uint32_t w0, uint32_t w1, uint32_t mul2) {
  const uint32_t t = E2M1CodesBF16x2(w0, mul2) | E2M1CodesBF16x2(w1, mul2) << 8;
  return t | t >> 12;
}

// A power-of-two multiplier (2^-127 to 2^127) as bf16 in both halves.
__device__ __forceinline__ uint32_t BF16x2Pow2(float mul) { return (__float_as_uint(mul) >> 16) * 0x00010001u; }

// Scaled value of one element: x * mul, or +0 where an NVFP4 block's scale is 0 (mul == 0).
template <QuantizeFormat F>
__device__ __forceinline__ float Scaled(float x, float mul) {
  if constexpr (FormatTraits<F>::kMx) {
    return __fmul_rn(x, mul);
  } else {
    return mul > 0.0f ? __fmul_rn(x, mul) : 0.0f;
  }
}

// Codes of N consecutive scaled values in one word, the first in the low bits: FP8 N <= 4 (a
// byte each), FP4 N <= 8 (a nibble each).
template <QuantizeFormat F, int N>
__device__ __forceinline__ uint32_t EncodeWord(const float* v, float mul) {
  uint32_t packed = 0;
  if constexpr (FormatTraits<F>::kFp4) {
    static_assert(N <= 8, "eight FP4 codes per word");
#pragma unroll
    for (int i = 0; i < N; ++i) packed |= E2M1Code(Scaled<F>(v[i], mul)) << (4 * i);
  } else {
    static_assert(N <= 4, "four FP8 codes per word");
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float hi = i + 1 < N ? Scaled<F>(v[i + 1], mul) : 0.0f;
      packed |= uint32_t(Fp8Pair<F>(Scaled<F>(v[i], mul), hi)) << (8 * i);
    }
  }
  return packed;
}

// Codes of 8 consecutive scaled values: FP8 in 8 bytes (uint2), FP4 in 4 bytes (uint32 in .x).
template <QuantizeFormat F>
__device__ __forceinline__ uint2 Encode8(const float* v, float mul) {
  if constexpr (FormatTraits<F>::kFp4) {
    return make_uint2(EncodeWord<F, 8>(v, mul), 0u);
  } else {
    return make_uint2(EncodeWord<F, 4>(v, mul), EncodeWord<F, 4>(v + 4, mul));
  }
}

}  // namespace jga::quantize
