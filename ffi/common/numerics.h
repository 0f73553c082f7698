// Reference-quality conversions between fp32 and the narrow formats of the contract.
// Decoding is exact. Encoding rounds to nearest even and saturates to the largest finite
// value (the contract for FP8/FP4 outputs); NaN stays NaN where the format has one. FP4 has
// none: a NaN is written as +6 (code 0x7, whatever its sign) on every backend, and the amax
// output carries the NaN.
//
// Scales are applied the way block-scaled hardware does, never to an element alone (448 * 2^127
// overflows fp32 although C may be an ordinary number): per K group the products of the decoded
// values (exact in fp32) are summed in fp32, and that block dot is multiplied by the group's
// combined scale. e4m3 scales: sa * sb, exact and within fp32's range, one multiply. e8m0 scales
// 2^ea, 2^eb: the combined exponent E = ea + eb (in [-254, 254]) goes on in two power-of-two
// factors 2^(E >> 1) and 2^(E - (E >> 1)), each an fp32 number (2^-127 a subnormal), so no step
// over- or underflows unless the term itself does; an 0xFF byte (NaN) makes the term NaN.
// Kernels must not flush subnormals (scales, terms or results) to zero.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "problem.h"

namespace jga {

#if !defined(__CUDACC__)
using std::isnan;
using std::signbit;
#endif

JGA_HOST_DEVICE float BitsToFloat(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

JGA_HOST_DEVICE uint32_t FloatToBits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// A minifloat format with `kExpBits` exponent bits, `kManBits` mantissa bits and bias `kBias`.
template <int kExpBits, int kManBits, int kBias>
struct MiniFloat {
  static constexpr int kMinNormalExp = 1 - kBias;

  JGA_HOST_DEVICE static float Decode(uint32_t code) {
    const uint32_t sign = (code >> (kExpBits + kManBits)) & 1u;
    const uint32_t exp = (code >> kManBits) & ((1u << kExpBits) - 1u);
    const uint32_t man = code & ((1u << kManBits) - 1u);
    float mag;
    if (exp == 0) {
      mag = ldexpf(static_cast<float>(man), kMinNormalExp - kManBits);
    } else {
      mag = ldexpf(static_cast<float>((1u << kManBits) | man), static_cast<int>(exp) - kBias - kManBits);
    }
    return sign ? -mag : mag;
  }

  // Rounds |x| (finite, below the saturation bound) to the format and returns its code without sign.
  JGA_HOST_DEVICE static uint32_t EncodeMagnitude(float a, float max_finite, uint32_t max_code) {
    if (!(a > 0.0f)) return 0;
    if (a >= max_finite) return max_code;
    int e2;
    frexpf(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
    int exp = e2 - 1;
    if (exp < kMinNormalExp) exp = kMinNormalExp;
    const float quantum = ldexpf(1.0f, exp - kManBits);
    const float r = nearbyintf(a / quantum) * quantum;  // exact scaling, ties to even
    if (r >= max_finite) return max_code;
    if (r == 0.0f) return 0;
    frexpf(r, &e2);
    int rexp = e2 - 1;
    if (rexp < kMinNormalExp) {  // subnormal
      return static_cast<uint32_t>(ldexpf(r, kManBits - kMinNormalExp));
    }
    const uint32_t man = static_cast<uint32_t>(ldexpf(r, kManBits - rexp)) - (1u << kManBits);
    return (static_cast<uint32_t>(rexp + kBias) << kManBits) | man;
  }
};

using E4M3 = MiniFloat<4, 3, 7>;
using E5M2 = MiniFloat<5, 2, 15>;
using E2M1 = MiniFloat<2, 1, 1>;

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

JGA_HOST_DEVICE float DecodeE4M3(uint8_t c) {
  if ((c & 0x7F) == 0x7F) return NAN;
  return E4M3::Decode(c);
}

JGA_HOST_DEVICE float DecodeE5M2(uint8_t c) {
  if ((c & 0x7C) == 0x7C) {
    if (c & 0x03) return NAN;
    return (c & 0x80) ? -INFINITY : INFINITY;
  }
  return E5M2::Decode(c);
}

JGA_HOST_DEVICE float DecodeE2M1(uint8_t nibble) { return E2M1::Decode(nibble & 0xF); }

// e8m0: 2^(c - 127); 0xFF is NaN.
JGA_HOST_DEVICE float DecodeE8M0(uint8_t c) {
  if (c == 0xFF) return NAN;
  if (c == 0) return BitsToFloat(0x00400000u);  // 2^-127 is an fp32 subnormal
  return BitsToFloat(static_cast<uint32_t>(c) << 23);
}

JGA_HOST_DEVICE uint8_t EncodeE4M3(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0x00;
  if (isnan(x)) return 0x7F;
  return sign | static_cast<uint8_t>(E4M3::EncodeMagnitude(fabsf(x), kE4M3Max, 0x7E));
}

JGA_HOST_DEVICE uint8_t EncodeE5M2(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0x00;
  if (isnan(x)) return 0x7F;
  return sign | static_cast<uint8_t>(E5M2::EncodeMagnitude(fabsf(x), kE5M2Max, 0x7B));
}

JGA_HOST_DEVICE uint8_t EncodeE2M1(float x) {
  if (isnan(x)) return 0x7;
  const uint8_t sign = signbit(x) ? 0x8 : 0x0;
  return sign | static_cast<uint8_t>(E2M1::EncodeMagnitude(fabsf(x), kE2M1Max, 0x7));
}

JGA_HOST_DEVICE uint16_t EncodeBF16(float x) {
  uint32_t bits = FloatToBits(x);
  if (isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE half, round to nearest even, overflow to infinity (f16 is not a saturating output).
JGA_HOST_DEVICE uint16_t EncodeF16(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (isnan(x)) return sign | 0x7E00;
  const float a = fabsf(x);
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  return sign | static_cast<uint16_t>(MiniFloat<5, 10, 15>::EncodeMagnitude(a, 65504.0f, 0x7BFF));
}

// 2^e for e in [-127, 127] (2^-127 is an fp32 subnormal), exactly.
JGA_HOST_DEVICE float Pow2(int e) {
  return e >= -126 ? BitsToFloat(static_cast<uint32_t>(e + 127) << 23) : BitsToFloat(0x00400000u);
}

// One K block's term of C as the rule above applies it: `dot`, the fp32 sum of the block's
// products of decoded values, times the two scales. e8m0: 2^floor(E/2), then 2^(E - floor(E/2)),
// each an fp32 number (E = ea + eb); 0xFF is NaN. e4m3 scales: one multiply by their product.
JGA_HOST_DEVICE float ScaleBlockDot(float dot, ScaleType t, uint8_t sa, uint8_t sb) {
  if (t != ScaleType::kE8M0) return dot * (DecodeE4M3(sa) * DecodeE4M3(sb));
  if (sa == 0xFF || sb == 0xFF) return NAN;
  const int e = static_cast<int>(sa) + static_cast<int>(sb) - 254;
  const int lo = e >= 0 ? e / 2 : -((1 - e) / 2);  // floor(e / 2)
  return dot * Pow2(lo) * Pow2(e - lo);
}

// The 16-bit A values of weight-only problems, exactly.
JGA_HOST_DEVICE float DecodeBF16(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

JGA_HOST_DEVICE float DecodeF16(uint16_t bits) {
  const uint32_t exp = (bits >> 10) & 0x1Fu;
  if (exp == 0x1F) {
    if (bits & 0x3FFu) return NAN;
    return (bits & 0x8000u) ? -INFINITY : INFINITY;
  }
  return MiniFloat<5, 10, 15>::Decode(bits);
}

JGA_HOST_DEVICE float DecodeOperand(OperandType t, uint8_t byte) {
  return t == OperandType::kE4M3 ? DecodeE4M3(byte) : DecodeE5M2(byte);
}

JGA_HOST_DEVICE float DecodeScale(ScaleType t, uint8_t byte) {
  return t == ScaleType::kE8M0 ? DecodeE8M0(byte) : DecodeE4M3(byte);
}

}  // namespace jga
