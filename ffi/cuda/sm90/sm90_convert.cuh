// Conversion of the SM90 kernels' operands to BF16 (value x scale, exact): the bit moves of the
// fp8 / fp4 codes, the scale multipliers, where a 64-K unit's codes and scale groups sit in a slab,
// and the three users' forms: ConvertRowUnit (a row's unit as 16-byte chunks: the B converter and
// PreconvertKernel) and ConvertAFragment (the consumers' WGMMA A fragments).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_ptx.cuh"

namespace jga {
namespace sm90 {

// Code -> BF16 bit conversions (value * 2^-O, exact).
// fp8: one 32-bit word (4 codes, k0..k3) -> two bf16x2 pairs (k0,k1), (k2,k3).
template <int V>
__device__ __forceinline__ void Fp8WordToRaw(uint32_t x, uint32_t& p0, uint32_t& p1) {
  // PRMT builds halfwords [sign-replicated byte | byte]; a shift puts exponent/mantissa in place.
  const uint32_t h0 = Prmt(x, 0u, 0x9180u);
  const uint32_t h1 = Prmt(x, 0u, 0xB3A2u);
  if constexpr (V == kV_E4M3) {
    p0 = (h0 << 4) & 0x87F087F0u;
    p1 = (h1 << 4) & 0x87F087F0u;
  } else {
    p0 = (h0 << 5) & 0x8FE08FE0u;
    p1 = (h1 << 5) & 0x8FE08FE0u;
  }
}
// The bit move above maps the codes FP8 reserves for NaN (e4m3 S.1111.111) and Inf/NaN (e5m2
// S.11111.MM) to finite values. Fp8Specials flags them: bit 7 of byte i of the result is set when
// code i of x is one (the masked code plus one carries into bit 7 only from all-ones; no carry
// crosses a byte), so the OR of many words tells whether any is. Warps that hold one convert on
// the rare path, Fp8WordToRawSpecial: the flag byte, sign-replicated into its halfword by the same
// PRMT, sets the BF16 exponent to all-ones, which leaves the code's sign and its mantissa bits
// (e4m3 111: NaN; e5m2 MM: Inf for 00, else NaN). The multipliers keep them (Inf x 0 is NaN, as
// in fp32), and so do the MMAs.
template <int V>
__device__ __forceinline__ uint32_t Fp8Specials(uint32_t x) {
  return V == kV_E4M3 ? (x & 0x7F7F7F7Fu) + 0x01010101u : (x & 0x7C7C7C7Cu) + 0x04040404u;
}
__device__ __forceinline__ bool AnySpecial(uint32_t specials) { return (specials & 0x80808080u) != 0u; }
template <int V>
__device__ __forceinline__ void Fp8WordToRawSpecial(uint32_t x, uint32_t& p0, uint32_t& p1) {
  Fp8WordToRaw<V>(x, p0, p1);
  const uint32_t flags = Fp8Specials<V>(x);
  p0 |= Prmt(flags, 0u, 0x9180u) & 0x7F807F80u;
  p1 |= Prmt(flags, 0u, 0xB3A2u) & 0x7F807F80u;
}
// Fp8WordToRaw, or with kSpecial Fp8WordToRawSpecial.
template <int V, bool kSpecial>
__device__ __forceinline__ void Fp8WordToBF16(uint32_t x, uint32_t& p0, uint32_t& p1) {
  if constexpr (kSpecial) {
    Fp8WordToRawSpecial<V>(x, p0, p1);
  } else {
    Fp8WordToRaw<V>(x, p0, p1);
  }
}

// fp4: one 32-bit word (8 codes, low nibble first) -> four bf16x2 pairs (k0,k1)...(k6,k7).
__device__ __forceinline__ void Fp4WordToRaw(uint32_t x, uint32_t& p0, uint32_t& p1, uint32_t& p2, uint32_t& p3) {
  const uint32_t xe = x << 4;  // even-k nibbles in the high half of each byte
  p0 = (Prmt(xe, x, 0xC480u) << 2) & 0x81C081C0u;
  p1 = (Prmt(xe, x, 0xD591u) << 2) & 0x81C081C0u;
  p2 = (Prmt(xe, x, 0xE6A2u) << 2) & 0x81C081C0u;
  p3 = (Prmt(xe, x, 0xF7B3u) << 2) & 0x81C081C0u;
}

// Scale byte -> multipliers (bf16x2 bit patterns). m2 is only applied when `big` (e8m0 bytes above
// kT, NaN included); invalid groups (past K) get m1 = 0.
template <int V>
__device__ __forceinline__ void ScaleToMul(uint32_t s, bool valid, uint32_t& m1, uint32_t& m2, bool& big) {
  using Tr = VariantTraits<V>;
  if constexpr (Tr::kScaleE4M3) {
    // e4m3 scale * 2^(O - D) = scale * 2^118, exact in bf16 (<= 4 significant bits).
    float f = __uint_as_float((s & 0x7Fu) << 20);  // scale * 2^-120 (fp32, subnormals exact)
    f = f * 0x1p119f * 0x1p119f;
    uint32_t b = (__float_as_uint(f) >> 16) | ((s & 0x80u) << 8);
    if ((s & 0x7Fu) == 0x7Fu) b = 0x7FC0u;
    b = valid ? b : 0u;
    m1 = b | (b << 16);
    m2 = 0x3F803F80u;
    big = false;
  } else {
    const uint32_t sc = min(s, static_cast<uint32_t>(Tr::kT));
    uint32_t b = valid ? ((sc + Tr::kOD) << 7) : 0u;
    m1 = b | (b << 16);
    big = valid && (s > static_cast<uint32_t>(Tr::kT));
    uint32_t b2 = (s == 255u) ? 0x7FC0u : ((s - Tr::kT + 127u) << 7);
    b2 = big ? b2 : 0x3F80u;
    m2 = b2 | (b2 << 16);
  }
}

// Offset of (row within a 128-row scale block, group%4) inside a 512-byte scale block.
__device__ __forceinline__ uint32_t SfInBlock(int row, int g4) {
  return static_cast<uint32_t>((row & 31) * 16 + ((row & 127) >> 5) * 4 + g4);
}

// Scale-group bookkeeping of one thread's 16 (fp8) / 16 (fp4, 8 bytes) codes of a 64-K unit.
//   fp8:  unit ui = half h of the slab; chunk t of the half -> group-in-slab 2h + t/2
//   fp4:  unit ui = 2h + u (half h, quarter u); chunk t -> sfv32: 4h + t; sfv16: 8h + 2t + u
template <int V>
__device__ __forceinline__ int GroupInSlab(int ui, int t) {
  using Tr = VariantTraits<V>;
  if constexpr (!Tr::kFp4) {
    return 2 * ui + (t >> 1);
  } else if constexpr (Tr::kSfv == 32) {
    return 4 * (ui >> 1) + t;
  } else {
    return 8 * (ui >> 1) + 2 * t + (ui & 1);
  }
}

// The 16-byte chunk of a slab row that holds piece t (< 4) of 64-K unit ui: fp8 takes all of chunk
// 4ui + t, fp4 the 8-byte half ui & 1 of chunk 4(ui >> 1) + t.
template <int V>
__device__ __forceinline__ int UnitChunk(int ui, int t) {
  return VariantTraits<V>::kFp4 ? 4 * (ui >> 1) + t : 4 * ui + t;
}
// The scale groups of one row's 64-K unit ui: fp8 two (2ui + j), fp4 four (one per piece).
template <int V>
constexpr int kRowUnitGroups = VariantTraits<V>::kFp4 ? 4 : 2;
template <int V>
__device__ __forceinline__ int RowUnitGroup(int ui, int j) {
  return VariantTraits<V>::kFp4 ? GroupInSlab<V>(ui, j) : 2 * ui + j;
}

// The inputs of ConvertRowUnit for one row's unit ui of `slab`: load_piece(chunk, half) returns
// piece t of the unit (UnitChunk; fp8: 16 bytes, fp4: 8 bytes in .x/.y at byte 8 * half), and
// load_sf(group in slab) its scale byte; a group is valid when it lies below k_groups.
template <int V, class LoadPiece, class LoadSf>
__device__ __forceinline__ void GatherRowUnit(int ui, int slab, int k_groups, LoadPiece&& load_piece, LoadSf&& load_sf,
                                              uint32_t (&codes)[16], uint32_t (&sf)[4], bool (&valid)[4]) {
  using Tr = VariantTraits<V>;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint4 v = load_piece(UnitChunk<V>(ui, t), ui & 1);
    if constexpr (!Tr::kFp4) {
      codes[4 * t] = v.x;
      codes[4 * t + 1] = v.y;
      codes[4 * t + 2] = v.z;
      codes[4 * t + 3] = v.w;
    } else {
      codes[2 * t] = v.x;
      codes[2 * t + 1] = v.y;
    }
  }
#pragma unroll
  for (int j = 0; j < kRowUnitGroups<V>; ++j) {
    const int gis = RowUnitGroup<V>(ui, j);
    sf[j] = load_sf(gis);
    valid[j] = slab * Tr::kGroupsPerSlab + gis < k_groups;
  }
}

// What a block needs of the other operand's scales on the BF16 path (VariantTraits::kSafe*): its
// byte s when kSafeLo <= s <= kSafeHi (the tile is exact while the two bytes sum to kSafeSum or
// more); 0 (exact on the CUDA cores, whatever the other) outside that window with a nonzero code;
// kNoBound for a block of zeros, a NaN scale or a group past K. Bounds combine by min.
constexpr uint32_t kNoBound = 255u;
template <int V>
__device__ __forceinline__ uint32_t ScaleBound(uint32_t s, bool valid, bool nonzero) {
  using Tr = VariantTraits<V>;
  if (!valid || s == 255u) return kNoBound;
  if (s < static_cast<uint32_t>(Tr::kSafeLo) || s > static_cast<uint32_t>(Tr::kSafeHi)) return nonzero ? 0u : kNoBound;
  return s;
}
// Whether any code of the words is nonzero (FP8 and E2M1 have a zero of each sign).
template <int V, int N>
__device__ __forceinline__ bool AnyNonzeroCode(const uint32_t* w) {
  constexpr uint32_t kMag = VariantTraits<V>::kFp4 ? 0x77777777u : 0x7F7F7F7Fu;
  uint32_t any = 0u;
#pragma unroll
  for (int i = 0; i < N; ++i) any |= w[i];
  return (any & kMag) != 0u;
}

// Runs convert(std::true_type) when `rare` holds for any lane of the warp (an e8m0 byte outside
// [kSafeHalf, kT], see RareScale; an FP8 NaN/Inf code among the consumers' A codes),
// else convert(std::false_type): the rare path is a copy of the loop, one uniform branch around it
// (inside the loop ptxas would issue its work predicated for every value).
template <class Convert>
__device__ __forceinline__ void WithRarePathIfAny(bool rare, Convert&& convert) {
  if (__any_sync(0xFFFFFFFFu, rare)) {
    convert(std::true_type{});
  } else {
    convert(std::false_type{});
  }
}

// Whether an e8m0 byte of a valid group sends its warp to the rare path of the conversions: outside
// [kSafeHalf, kT] (a second multiply above kT, NaN included; a bound to work out below kSafeHalf).
template <int V>
__device__ __forceinline__ bool RareScale(uint32_t s, bool valid) {
  using Tr = VariantTraits<V>;
  return valid && (s - static_cast<uint32_t>(Tr::kSafeHalf) > static_cast<uint32_t>(Tr::kT - Tr::kSafeHalf));
}

// The ScaleBound of one row's 64-K unit (GatherRowUnit's codes, sf, valid), for the rare path.
template <int V>
__device__ __forceinline__ uint32_t RowUnitBound(const uint32_t (&codes)[16], const uint32_t (&sf)[4],
                                                 const bool (&valid)[4]) {
  using Tr = VariantTraits<V>;
  uint32_t bound = kNoBound;
#pragma unroll
  for (int g = 0; g < kRowUnitGroups<V>; ++g) {  // group g: fp8 words 8g..8g+7; fp4 words 2g, 2g+1
    bool nonzero;
    if constexpr (Tr::kFp4) {
      nonzero = AnyNonzeroCode<V, 2>(&codes[2 * g]);
    } else {
      nonzero = AnyNonzeroCode<V, 8>(&codes[8 * g]);
    }
    bound = min(bound, ScaleBound<V>(sf[g], valid[g], nonzero));
  }
  return bound;
}

// Conversion of one operand row's 64-K unit ui of a slab (value x scale -> BF16, exact), shared by
// the B converter warpgroup and PreconvertKernel (A or B); the consumers' in-register A conversion
// produces the same values in WGMMA fragment layout instead. In (GatherRowUnit): the unit's codes
// (fp8: words codes[4t + s] of piece t; fp4: codes[2t + w]), the scale bytes of its groups
// (RowUnitGroup j in sf[j]) and whether each group lies within K. Out: the unit's eight 16-byte
// BF16 chunks in the consumers' K order, handed to store(chunk, x, y, z, w). The converter puts
// chunk c of row r at c ^ (r & 7) of the row (128B swizzle); PreconvertKernel writes it at c, and
// a 128B-swizzled TMA load of 128-byte rows puts it where the converter would.
// e8m0 scales: bound(b) receives, before the conversion, a lower bound b of the unit's ScaleBound,
// warp-uniform: kSafeHalf on the common path, the warp's RowUnitBound on the rare one.
// Must be called by whole warps (a vote picks the rare path, RareScale). Returns whether a lane
// of the warp holds an FP8 NaN/Inf code (converted as a finite value): the caller then converts
// the unit again with ConvertRowUnitSpecial before it publishes the chunks. Flagging while
// converting, not voting first, lets each code die with its conversion.
template <int V, class Store, class Bound>
__device__ __forceinline__ bool ConvertRowUnit(const uint32_t (&codes)[16], const uint32_t (&sf)[4],
                                               const bool (&valid)[4], Store&& store, Bound&& bound) {
  using Tr = VariantTraits<V>;
  // The bound of the path taken, published first: it then holds no register through the conversion.
  auto publish_bound = [&](auto rare_path) {
    if constexpr (!Tr::kScaleE4M3) {
      bound(decltype(rare_path)::value ? __reduce_min_sync(0xFFFFFFFFu, RowUnitBound<V>(codes, sf, valid))
                                       : static_cast<uint32_t>(Tr::kSafeHalf));
    }
  };
  if constexpr (!Tr::kFp4) {
    uint32_t m1[2], m2[2];
    bool rare = false;
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      bool big;
      ScaleToMul<V>(sf[gi], valid[gi], m1[gi], m2[gi], big);
      rare |= RareScale<V>(sf[gi], valid[gi]);
    }
    uint32_t specials = 0u;
    WithRarePathIfAny(rare, [&](auto two_multiplies) {
      publish_bound(two_multiplies);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t a0, a1;
          specials |= Fp8Specials<V>(codes[4 * t + s]);
          Fp8WordToRaw<V>(codes[4 * t + s], a0, a1);
          const int gi = t >> 1;
          a0 = MulBF16x2(a0, m1[gi]);
          a1 = MulBF16x2(a1, m1[gi]);
          if constexpr (decltype(two_multiplies)::value) {
            a0 = MulBF16x2(a0, m2[gi]);
            a1 = MulBF16x2(a1, m2[gi]);
          }
          lo[t] = a0;
          hi[t] = a1;
        }
        store(2 * s, lo[0], lo[1], lo[2], lo[3]);
        store(2 * s + 1, hi[0], hi[1], hi[2], hi[3]);
      }
    });
    return __any_sync(0xFFFFFFFFu, AnySpecial(specials));
  } else {
    uint32_t m1[4];
    bool rare = false;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      uint32_t m2d;
      bool big;
      ScaleToMul<V>(sf[t], valid[t], m1[t], m2d, big);
      if constexpr (!Tr::kScaleE4M3) rare |= RareScale<V>(sf[t], valid[t]);
    }
    WithRarePathIfAny(rare, [&](auto two_multiplies) {
      publish_bound(two_multiplies);
#pragma unroll
      for (int ww = 0; ww < 2; ++ww) {
        uint32_t pr[4][4];  // [pair][t]
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t a[4];
          Fp4WordToRaw(codes[2 * t + ww], a[0], a[1], a[2], a[3]);
#pragma unroll
          for (int j = 0; j < 4; ++j) pr[j][t] = MulBF16x2(a[j], m1[t]);
          if constexpr (decltype(two_multiplies)::value) {
            uint32_t m1d, m2;
            bool big;
            ScaleToMul<V>(sf[t], valid[t], m1d, m2, big);
#pragma unroll
            for (int j = 0; j < 4; ++j) pr[j][t] = MulBF16x2(pr[j][t], m2);
          }
        }
        // pairs of word ww: (s=2ww,h=0),(2ww,1),(2ww+1,0),(2ww+1,1); chunk = 2s+h.
#pragma unroll
        for (int j = 0; j < 4; ++j) store(2 * (2 * ww + (j >> 1)) + (j & 1), pr[j][0], pr[j][1], pr[j][2], pr[j][3]);
      }
    });
    return false;  // every E2M1 code is finite
  }
}

// ConvertRowUnit's FP8 values again, carrying NaN/Inf codes (Fp8WordToRawSpecial), one code word at
// a time: code_word(i) returns codes[i] of ConvertRowUnit, store_word(chunk, j, w) stores 32-bit
// word j of a chunk. It holds few registers (the B converter's 56 do not fit a second copy of
// ConvertRowUnit's unit of codes and results) and runs only for the rare warps that need it.
template <int V, class CodeWord, class StoreWord>
__device__ __forceinline__ void ConvertRowUnitSpecial(CodeWord&& code_word, const uint32_t (&sf)[4],
                                                      const bool (&valid)[4], StoreWord&& store_word) {
  static_assert(!VariantTraits<V>::kFp4, "E2M1 has no NaN/Inf codes");
#pragma unroll
  for (int gi = 0; gi < 2; ++gi) {
    uint32_t m1, m2;
    bool big;
    ScaleToMul<V>(sf[gi], valid[gi], m1, m2, big);  // m2 = 1 unless big
#pragma unroll
    for (int i = 8 * gi; i < 8 * gi + 8; ++i) {  // word i: piece t = i / 4, word s = i % 4
      uint32_t a0, a1;
      Fp8WordToRawSpecial<V>(code_word(i), a0, a1);
      store_word(2 * (i & 3), i >> 2, MulBF16x2(MulBF16x2(a0, m1), m2));
      store_word(2 * (i & 3) + 1, i >> 2, MulBF16x2(MulBF16x2(a1, m1), m2));
    }
  }
}

// 32-bit words of one row's codes of a 64-K unit that a consumer thread converts: 16 fp8 or fp4
// bytes (fp8: 16 codes, one LDS.128; fp4: 16 codes in 8 bytes, one LDS.64).
template <int V>
constexpr int kAWords = VariantTraits<V>::kFp4 ? 2 : 4;

// The consumers' in-register conversion of A: one thread's codes of a 64-K unit for the two rows
// rr = 0, 1 of a 64-row WGMMA slice (raw[rr], loaded as GatherRowUnit's pieces t of the thread's
// lane % 4) with their scale bytes scale_byte(rr) (valid: the group lies below K) -> the BF16 A
// fragment f[k-step][register] of the RS WGMMA (registers rr and rr + 2 of each k-step: the row's
// two halves of the k-step). The same values as ConvertRowUnit, in fragment layout. e8m0 scales:
// on the rare path, bound takes the min with the rows' ScaleBound. Must be called by whole warps
// (a vote picks the rare path).
template <int V, class ScaleByte>
__device__ __forceinline__ void ConvertAFragment(const uint32_t (&raw)[2][kAWords<V>], ScaleByte&& scale_byte,
                                                 bool valid, uint32_t& bound, uint32_t (&f)[4][4]) {
  using Tr = VariantTraits<V>;
  uint32_t m1v[2], m2v[2];
  bool any_big;
  if constexpr (Tr::kScaleE4M3) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      bool big;
      ScaleToMul<V>(scale_byte(rr), valid, m1v[rr], m2v[rr], big);
    }
    any_big = false;
  } else {
    // e8m0: one multiply and no bound to lower (the caller starts from kSafeHalf) unless a byte of
    // this warp is outside [kSafeHalf, kT] (RareScale: rare).
    const uint32_t s0 = scale_byte(0), s1 = scale_byte(1);
    if (!__any_sync(0xFFFFFFFFu, RareScale<V>(s0, valid) || RareScale<V>(s1, valid))) {
      m1v[0] = valid ? (s0 + Tr::kOD) * 0x00800080u : 0u;
      m1v[1] = valid ? (s1 + Tr::kOD) * 0x00800080u : 0u;
      m2v[0] = m2v[1] = 0x3F803F80u;
      any_big = false;
    } else {
      bool big0, big1;
      ScaleToMul<V>(s0, valid, m1v[0], m2v[0], big0);
      ScaleToMul<V>(s1, valid, m1v[1], m2v[1], big1);
      any_big = __any_sync(0xFFFFFFFFu, big0 || big1);
      bound = min(bound, min(ScaleBound<V>(s0, valid, AnyNonzeroCode<V, kAWords<V>>(raw[0])),
                             ScaleBound<V>(s1, valid, AnyNonzeroCode<V, kAWords<V>>(raw[1]))));
    }
  }
  auto convert = [&](auto special) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      uint32_t pr[4][2];  // [kstep][half]
      if constexpr (!Tr::kFp4) {
#pragma unroll
        for (int s = 0; s < 4; ++s) Fp8WordToBF16<V, decltype(special)::value>(raw[rr][s], pr[s][0], pr[s][1]);
      } else {
#pragma unroll
        for (int w = 0; w < 2; ++w)
          Fp4WordToRaw(raw[rr][w], pr[2 * w][0], pr[2 * w][1], pr[2 * w + 1][0], pr[2 * w + 1][1]);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) f[s][rr + 2 * hh] = MulBF16x2(pr[s][hh], m1v[rr]);
    }
  };
  // Rarer still (an FP8 NaN/Inf code among this warp's): the conversion that carries them, picked
  // by a vote before converting, so that the codes die with the conversion on either path.
  if constexpr (!Tr::kFp4) {
    uint32_t specials = 0u;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int s = 0; s < 4; ++s) specials |= Fp8Specials<V>(raw[rr][s]);
    WithRarePathIfAny(AnySpecial(specials), convert);
  } else {
    convert(std::false_type{});
  }
  // Rare (an e8m0 scale above 2^(127-O), or NaN): a second multiplier. One uniform branch around
  // the block; per value, ptxas would issue it predicated every time.
  if (any_big) {
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int r = 0; r < 4; ++r) f[s][r] = MulBF16x2(f[s][r], m2v[r & 1]);
  }
}

}  // namespace sm90
}  // namespace jga
