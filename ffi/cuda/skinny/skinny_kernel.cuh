// The few-row kernel (skinny.h): C^T tiles of 128 rows of B x 8..64 tokens of A, K split over CTAs.
//
// Work: a unit is one (batch item, 128-row tile of B, K range) and one CTA of 8 warps runs it;
// every warp owns 16 rows of B. The MMA is mma.sync m16n8k16 f16 -> f32 with the rows of B on its
// 16-row side and tokens on its 8-column side, so that M = 1..8 wastes no weight bandwidth.
//
// Loads: a ring of kStages stages, each 128 bytes of K of the tile's 128 rows of B (16 KB), of
// the tokens' A rows and of the scale blocks both need (the physical 128x4 layout holds a tile's
// 4 K groups as one 512-byte block), copied with 16-byte cp.async. B's copies carry no L2 cache
// hint: with createpolicy and cp.async.L2::cache_hint, ptxas 13.0 addresses some of the ring's
// refill copies through uniform registers it never writes (sm_90a: MXFP4 with 8 tokens; sm_100a:
// every instantiation), a garbage memory descriptor on which the GPU raises an illegal
// instruction (tests/test_cuda_build.py checks the descriptors). B is read from shared memory
// with ldmatrix (128-byte rows, 16-byte chunks XOR-swizzled by row: conflict-free) and converted
// in registers; A is converted once per stage by the whole CTA into a buffer in the MMA's
// fragment order.
//
// K order: each thread's 4 bytes of a 16-byte chunk (ldmatrix hands thread t bytes 4t..4t+3)
// decode into f16x2 registers that feed one or two MMA k-steps; A's codes go through the same
// Decode, so both operands carry the same permutation of K inside the chunk. A chunk lies within
// one scale group (16 fp8 codes: half of a 32-group; 32 fp4 codes: one 32-group), so every k-step
// sums the codes of one group only.
//
// Numerics (numerics.h): the codes decode exactly into f16 (e4m3 and e5m2 by hardware conversion
// and byte placement, NaN and Inf kept; e2m1 as value * 2^-14 by bit placement). MXFP8 and MXFP4
// (e8m0 scales): per group the MMAs sum into a zeroed block accumulator (products exact in fp32),
// which is then scaled and added: (block * sfb) * sfa when sfb is within 2^+-64, where the first
// product is exact and the second rounds once, as the two power-of-two halves do; (block * sfa) *
// sfb when sfa is; the two halves of numerics.h otherwise (an e8m0 NaN gives NaN). NVFP4 (e4m3
// scales per 16): value x scale is exact in f16 (at most 6 significant bits, 2^-17..21 with B's
// extra 2^-7), so the scales go into the conversion and the MMAs accumulate over all of K.
//
// Rows: one launch takes up to 64 tokens of 16-bit activations or 32 of a block-scaled A (skinny.h
// kMaxScaledM); the host runs a weight-only call of up to 128 as two launches (Params::rows,
// zero_amax), each streaming B again.
//
// Split-K: every split stores its fp32 partial tile in the workspace and counts itself in; the
// last to arrive adds the splits' partials in split order (deterministic) and runs the epilogue:
// the tile staged through shared memory, C stored as pairs of columns, the NaN-propagating amax
// flushed per warp. amax and the counters are zeroed by CTA 0 at the start, ordered before every
// CTA's first atomic by the reset word's round (ResetArrive / ResetWait): a cooperative launch.
//
// Weight-only (AKind kAF16 / kABF16): A is unscaled 16-bit activations, copied through the same
// ring (2 bytes per element: 256 bytes of A per 128 bytes of FP8 codes, 512 per 128 bytes of FP4;
// rows past M zero-filled) and read by the MMAs in place (AFragments: 8 bytes as they lie for FP8,
// 16 bytes paired by PRMT for FP4, in Decode's K order), so there is no conversion pass and one
// barrier per stage (a conversion pass into a fragment buffer, as for a block-scaled A, left no
// shared memory for an FP4 ring of 64 tokens). An f16 A meets B's f16 codes on the f16 MMA; a
// bf16 A takes the bf16 MMA: MXFP4 codes decode straight to bf16 at their value (DecodeFp4BF16),
// the other formats' f16 registers are widened to f32, multiplied back to their value (NVFP4's
// 2^-7 undone) and narrowed to bf16 (ToBF16); exact, NaN and Inf kept, and a small activation
// cannot underflow against an offset. The group path scales block sums by SFB alone. A bf16 A
// against e8m0 scales folds them where they are moderate (kFoldLo..kFoldHi, all of a stage's,
// agreed by the CTA at the stage's barrier): B decodes to value x scale, one exact bf16, and the
// MMAs accumulate the whole stage with no block sums, as NVFP4 does; the products are the group
// path's, times the scale (C = a . dequant(b)^T). Other stages, and an f16 A (whose range holds
// value x scale for too few scales), take the group path.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/numerics.h"
#include "common/problem.h"
#include "cuda/common/device.cuh"
#include "cuda/common/ptx.cuh"

namespace jga {
namespace skinny {

// Operand formats the kernel has (VariantOf in skinny.cu).
enum Variant : int { kE4M3 = 0, kE5M2 = 1, kMXFP4 = 2, kNVFP4 = 3 };
constexpr int kVariants = 4;
constexpr int kTokenTileCounts[4] = {1, 2, 4, 8};  // MT: 8-token column tiles per CTA

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileN = 16 * kWarps;  // rows of B per CTA (one 128-row scale block)
constexpr int kStages = 4;
constexpr int kStageBytes = 128;  // K bytes per row of B and stage

// A's kind: block-scaled like B, or unscaled 16-bit activations (weight-only).
enum AKind : int { kAScaled = 0, kAF16 = 1, kABF16 = 2 };
constexpr int kAKinds = 3;

template <int V, int A>
struct Traits {
  static constexpr bool kFp4 = V == kMXFP4 || V == kNVFP4;
  static constexpr bool kFolded = V == kNVFP4;  // scales folded into the f16 values
  static constexpr int kSfv = kFolded ? 16 : 32;
  static constexpr int kGroupsPerStage = (kFp4 ? 2 * kStageBytes : kStageBytes) / kSfv;  // 4, 8, 16
  static constexpr int kBlocksPerStage = kGroupsPerStage / 4;                            // 1, 2, 4
  static constexpr int kStepsPerChunk = kFp4 ? 2 : 1;  // MMA k-steps in 16 bytes of codes
  static constexpr int kSteps = 8 * kStepsPerChunk;    // per stage
  static constexpr int kHalves = 2 * kStepsPerChunk;   // f16x2 registers decoded from 4 bytes
  static constexpr bool kWeightOnly = A != kAScaled;
  static constexpr bool kBF16 = A == kABF16;
  static constexpr int kAStageBytes = kWeightOnly ? 2 * (kFp4 ? 2 : 1) * kStageBytes : kStageBytes;  // 128, 256, 512
  static constexpr int kAChunks = kAStageBytes / 16;  // 16-byte chunks of A per token and stage
  // B decodes to f16 as value * 2^-14 (fp4) or value * scale * 2^-7 (NVFP4); the bf16 MMA takes B
  // at its value: ToBF16 multiplies FP8 and NVFP4 registers by kBOffset, MXFP4 decodes straight
  // to bf16 (DecodeFp4BF16).
  static constexpr float kBOffset = kFolded ? 128.0f : 1.0f;
  // The group path's block sums carry fp4's 2^-14 once per f16 operand: 2^-28 with both scaled,
  // 2^-14 with an f16 A, none with a bf16 A. NVFP4's sums carry 2^-7 except on the bf16 MMA.
  static constexpr float kBlockScale = !kFp4 || kBF16 ? 1.0f : kWeightOnly ? 16384.0f : 268435456.0f;
  static constexpr float kAccScale = kFolded && !kBF16 ? 128.0f : 1.0f;
  // A bf16 A against e8m0 scales folds them per stage where it can (ScalesFold): B at value x
  // scale, one bf16 each, and the MMAs sum the whole stage into the accumulators.
  static constexpr bool kFoldable = kBF16 && !kFolded;
  static constexpr int kGroupBytes = kFp4 ? 16 : 32;  // bytes of B per 32-group
};

// The e8m0 bytes a folded stage takes: 2^-64..2^1. In it every code x scale is a bf16 number (at
// most 4 significant bits, 2^-80..2^17) and its product with an activation of magnitude 2^-46..2^110
// a normal fp32 number, so the stage's sum is the group path's up to the order of its roundings;
// 2^1 is the largest multiplier DecodeFp4BF16 can take (bf16 2^127 on the code's 2^-126).
constexpr uint32_t kFoldLo = 63, kFoldHi = 128;

template <int V, int A, int MT>
struct Smem {
  using Tr = Traits<V, A>;
  static constexpr int kTokens = 8 * MT;
  static constexpr int kBSlot = kTileN * kStageBytes;
  static constexpr int kASlot = kTokens * Tr::kAStageBytes;
  static constexpr int kSfSlot = Tr::kBlocksPerStage * 512;
  static constexpr int kSfaSlot = Tr::kWeightOnly ? 0 : kSfSlot;
  // [step][token tile][lane] x 2 f16x2; a 16-bit A is read from the ring in fragment order instead.
  static constexpr int kConvA = Tr::kWeightOnly ? 0 : Tr::kSteps * MT * 32 * 8;
  static constexpr int kScaleA =
      Tr::kFolded || Tr::kWeightOnly ? 0 : Tr::kGroupsPerStage * kTokens * 4;  // [group][token] fp32
  static constexpr int kOffA = kStages * kBSlot;
  static constexpr int kOffSfb = kOffA + kStages * kASlot;
  static constexpr int kOffSfa = kOffSfb + kStages * kSfSlot;
  static constexpr int kOffConv = kOffSfa + kStages * kSfaSlot;
  static constexpr int kOffScaleA = kOffConv + kConvA;
  static constexpr int kBytes = kOffScaleA + kScaleA;
  // The epilogue stages the finished tile [token][row] in the B ring; the pitch of 132 floats
  // puts a warp's fragment-order writes in 32 distinct banks.
  static constexpr int kCPitch = kTileN + 4;
  static_assert(kTokens * kCPitch * 4 <= kStages * kBSlot, "C staging fits the B ring");
};

// Minimum CTAs per SM the kernel is compiled for (register budget: 128 per thread at 2).
template <int MT>
constexpr int kMinCtasPerSm = MT <= 2 ? 2 : 1;

struct Params {
  const uint8_t* a;
  const uint8_t* b;
  const uint8_t* sfa;
  const uint8_t* sfb;
  void* c;
  float* amax;
  int zero_amax;    // this launch zeroes amax (the first of a call's launches)
  int m, n, l;      // m: rows of A and C this launch takes
  int rows;         // rows of A and C per batch item (>= m: a weight-only call over several launches)
  int row_bytes;    // bytes of one row of B (and of A unless weight-only)
  int a_row_bytes;  // bytes of one row of A
  int k_blocks;     // scale blocks along K
  long long sfa_batch_stride, sfb_batch_stride;
  int c_type;
  int tiles_n;             // 128-row tiles of B per batch item
  int tiles;               // l * tiles_n
  int splits;              // K ranges per tile
  int stages_per_split;    // stages of each K range (the last may have fewer)
  int num_stages;          // stages of a whole row
  int units;               // tiles * splits
  unsigned int* counters;  // [tiles], splits > 1
  float4* partials;        // [units][MT][kThreads], splits > 1
  unsigned int* reset_word;
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers.
__device__ __forceinline__ void Ldmatrix4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Sts64(uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(addr), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ uint32_t Hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Two e4m3 codes -> f16x2, exact (NaN kept).
__device__ __forceinline__ uint32_t CvtE4M3x2(uint32_t two_codes) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(static_cast<uint16_t>(two_codes)));
  return d;
}
// D += A * B, m16n8k16, f16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// D += A * B, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBF16(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}
// f16x2 -> bf16x2 times `scale` (a power of two): exact for B's decoded values (at most 7
// significant bits, within bf16's range once scaled), NaN and Inf kept.
__device__ __forceinline__ uint32_t ToBF16(uint32_t h2, float scale) {
  const __half2 h = *reinterpret_cast<const __half2*>(&h2);
  const float lo = __low2float(h) * scale, hi = __high2float(h) * scale;
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// ---------------------------------------------------------------------------------------------
// Conversion: 4 bytes of codes -> Traits::kHalves f16x2 registers (k-step s takes h[2s], h[2s+1]).
template <int V>
__device__ __forceinline__ void Decode(uint32_t w, uint32_t (&h)[Traits<V, kAScaled>::kHalves]) {
  if constexpr (V == kE4M3) {
    h[0] = CvtE4M3x2(w & 0xFFFFu);
    h[1] = CvtE4M3x2(w >> 16);
  } else if constexpr (V == kE5M2) {  // an e5m2 code is the high byte of its f16
    h[0] = __byte_perm(w, 0u, 0x1404);
    h[1] = __byte_perm(w, 0u, 0x3424);
  } else {  // e2m1 nibbles i and i + 4: sign << 15 | magnitude << 9 is value * 2^-14
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = w >> (4 * i);
      h[i] = ((x << 9) & 0x0E000E00u) | ((x << 12) & 0x80008000u);
    }
  }
}

// e2m1 nibbles i and i + 4 straight to bf16x2 at their value: sign << 15 | magnitude << 6 is
// value * 2^-126 (the exponent-0 code 0.5 a bf16 subnormal), times 2^126 by an fma (subnormals
// kept) with -0 added (a zero keeps its sign). For the bf16 MMA, in place of Decode + ToBF16.
// A folded stage multiplies by 2^126 x its scale instead (BF16x2Pow126Times).
constexpr uint32_t kBF16x2Pow126 = 0x7E807E80u;
constexpr uint32_t kBF16x2NegZero = 0x80008000u;
__device__ __forceinline__ void DecodeFp4BF16(uint32_t w, uint32_t (&h)[4], uint32_t mul = kBF16x2Pow126) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t x = w >> (4 * i), v = ((x << 6) & 0x01C001C0u) | ((x << 12) & 0x80008000u);
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(h[i]) : "r"(v), "r"(mul), "r"(kBF16x2NegZero));
  }
}
// bf16x2 (2^(e - 1), 2^(e - 1)) for an e8m0 byte e in [kFoldLo, kFoldHi]: 2^126 x its scale.
__device__ __forceinline__ uint32_t BF16x2Pow126Times(uint32_t e) { return (e + 126u) * 0x00800080u; }

// An e4m3 scale byte as f16x2 (both halves), times 2^7 for B (see Traits::kAccScale).
__device__ __forceinline__ uint32_t ScaleHalf2(uint32_t byte) { return CvtE4M3x2(byte * 0x0101u); }
constexpr uint32_t kHalf2Pow7 = 0x58005800u;   // f16x2 (2^7, 2^7)
constexpr uint32_t kHalf2Pow14 = 0x74007400u;  // f16x2 (2^14, 2^14)

__device__ __forceinline__ float E8M0Float(uint32_t e) {
  return e == 0xFFu ? __uint_as_float(0x7FC00000u) : e == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}
// e8m0 bytes within 2^+-64: a block sum (|x| in 2^-32..2^37, fp4's 2^-28 undone) times it stays a
// normal fp32 number, so the multiply is exact.
__device__ __forceinline__ bool Moderate(uint32_t e) { return e - 63u <= 128u; }

// One group's term when the fast path does not apply: x (the block sum, 2^-28 undone) times the
// combined scale of e8m0 bytes ea (A) and eb (B), per numerics.h. Static: one copy per translation
// unit (skinny_<kind>.cu) rather than one definition shared by them.
static __device__ __noinline__ float ExactTerm(float x, uint32_t ea, uint32_t eb) {
  if (ea == 0xFFu || eb == 0xFFu) return __uint_as_float(0x7FC00000u);
  if (Moderate(ea)) return (x * E8M0Float(ea)) * E8M0Float(eb);
  const int e = static_cast<int>(ea) + static_cast<int>(eb) - 254;
  const int half = e >> 1;
  return (x * Pow2(half)) * Pow2(e - half);
}

// Offset of row r (< 128) and group j (< 4) in a 512-byte scale block (problem.h ScaleOffset).
__device__ __forceinline__ int BlockOffset(int r, int j) { return (r & 31) * 16 + (r >> 5) * 4 + j; }

__device__ __forceinline__ void StoreC(int c_type, void* c, size_t idx, float v0, float v1, bool two) {
  switch (static_cast<OutputType>(c_type)) {
    case OutputType::kF32: StorePair<0>(c, idx, v0, v1, two); break;
    case OutputType::kF16: StorePair<1>(c, idx, v0, v1, two); break;
    case OutputType::kBF16: StorePair<2>(c, idx, v0, v1, two); break;
    case OutputType::kE4M3: StorePair<3>(c, idx, v0, v1, two); break;
    case OutputType::kE5M2: StorePair<4>(c, idx, v0, v1, two); break;
    default: StorePair<5>(c, idx, v0, v1, two); break;
  }
}

// ---------------------------------------------------------------------------------------------
// One stage's copies into ring slot `slot`: B's 128 rows (8 chunks each, chunk c of row r at
// c ^ (r & 7)), the tokens' A rows (kAChunks chunks each, the same swizzle of the chunk index's
// low 3 bits), the scale blocks of B's tile and of A. Thread i copies chunk i % 8 of B rows
// i / 8 + 32 j and chunk i % kAChunks of A rows i / kAChunks + (256 / kAChunks) j, so its sources
// move by a fixed stride a stage; they are set up once per unit (UnitCopies).
struct UnitCopies {
  const uint8_t* b;   // chunk tid % 8 of B row n0 + tid / 8 at stage 0
  const uint8_t* a;   // chunk tid % kAChunks of A row tid / kAChunks at stage 0
  const uint8_t* sf;  // this thread's 16 bytes of the scale blocks at stage 0 (B's: threads 0-127, A's: 128-255)
  uint32_t b_rows;    // bit j: B row n0 + tid / 8 + 32 j exists
};

// Bytes of a row of A: B's unless weight-only (the same value, known to the compiler).
template <int V, int A>
__device__ __forceinline__ int ARowBytes(const Params& p) {
  return Traits<V, A>::kWeightOnly ? p.a_row_bytes : p.row_bytes;
}

template <int V, int A, int MT>
__device__ __forceinline__ UnitCopies SetUpCopies(const Params& p, int l, int n0) {
  using Tr = Traits<V, A>;
  constexpr int kBlocks = Tr::kBlocksPerStage;
  const int tid = threadIdx.x, r = tid >> 3, c = tid & 7;
  UnitCopies u;
  u.b = p.b + (static_cast<size_t>(l) * p.n + n0 + r) * p.row_bytes + c * 16;
  u.a = p.a + (static_cast<size_t>(l) * p.rows + tid / Tr::kAChunks) * ARowBytes<V, A>(p) + (tid % Tr::kAChunks) * 16;
  u.b_rows = 0;
#pragma unroll
  for (int j = 0; j < kTileN / 32; ++j) u.b_rows |= (n0 + r + 32 * j < p.n ? 1u : 0u) << j;
  const int which = tid >> 7, ch = tid & 127;
  u.sf = nullptr;
  if (ch < 32 * kBlocks && (which == 0 || !Tr::kWeightOnly)) {
    const uint8_t* sf = which == 0
                            ? p.sfb + l * p.sfb_batch_stride + static_cast<size_t>(n0 / kTileN) * p.k_blocks * 512
                            : p.sfa + l * p.sfa_batch_stride;
    u.sf = sf + (ch >> 5) * 512 + (ch & 31) * 16;
  }
  return u;
}

template <int V, int A, int MT>
__device__ __forceinline__ void IssueStage(const Params& p, const UnitCopies& u, uint32_t base, int slot, int stage) {
  using S = Smem<V, A, MT>;
  using Tr = Traits<V, A>;
  constexpr int kBlocks = Tr::kBlocksPerStage;
  const int tid = threadIdx.x, r = tid >> 3, c = tid & 7;
  const size_t koff = static_cast<size_t>(stage) * kStageBytes, rows32 = static_cast<size_t>(p.row_bytes) * 32;
  const bool k_ok = static_cast<int>(koff) + c * 16 < p.row_bytes;
  const uint32_t dst_b = base + slot * S::kBSlot + r * 128 + ((c ^ (r & 7)) << 4);
#pragma unroll
  for (int j = 0; j < kTileN / 32; ++j) {
    const bool ok = k_ok && ((u.b_rows >> j) & 1u);
    CpAsync16(dst_b + j * 32 * 128, ok ? u.b + koff + j * rows32 : p.b, ok ? 16u : 0u);
  }
  // A: rows ar + kRowsPerPass j (kRowsPerPass is a multiple of 8: every row has ar's swizzle).
  constexpr int kRowsPerPass = kThreads / Tr::kAChunks;
  const int ar = tid / Tr::kAChunks, ac = tid % Tr::kAChunks;
  const size_t akoff = static_cast<size_t>(stage) * Tr::kAStageBytes,
               apass = static_cast<size_t>(ARowBytes<V, A>(p)) * kRowsPerPass;
  const bool ak_ok = static_cast<int>(akoff) + ac * 16 < ARowBytes<V, A>(p);
  const uint32_t dst_a = base + S::kOffA + slot * S::kASlot + ar * Tr::kAStageBytes + ((ac ^ (ar & 7)) << 4);
#pragma unroll
  for (int j = 0; j < (S::kTokens + kRowsPerPass - 1) / kRowsPerPass; ++j) {
    // A 16-bit A is read from the ring by the MMAs: its rows past M are zero-filled.
    const bool row_ok = ar + kRowsPerPass * j < p.m, ok = ak_ok && row_ok;
    if (row_ok || (Tr::kWeightOnly && ar + kRowsPerPass * j < S::kTokens))
      CpAsync16(dst_a + j * kRowsPerPass * Tr::kAStageBytes, ok ? u.a + akoff + j * apass : p.a, ok ? 16u : 0u);
  }
  if (u.sf != nullptr) {  // scale blocks: B's tile (row block n0 / 128), A's first row block (M <= 64)
    const int ch = tid & 127;
    const bool ok = stage * kBlocks + (ch >> 5) < p.k_blocks;
    CpAsync16(base + ((tid >> 7) == 0 ? S::kOffSfb : S::kOffSfa) + slot * S::kSfSlot + ch * 16,
              ok ? u.sf + static_cast<size_t>(stage) * kBlocks * 512 : p.sfb, ok ? 16u : 0u);
  }
}

// Whether ring slot `slot` (stage `stage`) can take the fold (Traits::kFoldable): this thread's
// 16 bytes of B's scale blocks, copied by itself (so visible to it once its copies are waited
// for), lie in [kFoldLo, kFoldHi], counting only bytes of rows and groups of B that exist (a NaN
// scale, 0xFF, does not fold: the group path carries it). The CTA folds when all threads agree.
template <int V, int A, int MT>
__device__ __forceinline__ bool ScalesFold(const Params& p, uint32_t base, int slot, int stage, int n0) {
  using S = Smem<V, A, MT>;
  using Tr = Traits<V, A>;
  constexpr int kBlocks = Tr::kBlocksPerStage;
  const int tid = threadIdx.x;
  if (tid >= 32 * kBlocks) return true;
  const int groups = (p.row_bytes + Tr::kGroupBytes - 1) / Tr::kGroupBytes - (stage * kBlocks + (tid >> 5)) * 4;
  if (groups <= 0) return true;
  const uint32_t present = groups >= 4 ? 0xFFFFFFFFu : (1u << (8 * groups)) - 1u;  // bytes of groups within K
  const uint4 v = Lds128(base + S::kOffSfb + slot * S::kSfSlot + tid * 16);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};  // word q: row (tid % 32) + 32 q, groups 0..3
  bool ok = true;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (n0 + (tid & 31) + 32 * q >= p.n) continue;
    const uint32_t w = (words[q] & present) | (kFoldLo * 0x01010101u & ~present);
    ok &= (__vcmpgeu4(w, kFoldLo * 0x01010101u) & __vcmpleu4(w, kFoldHi * 0x01010101u)) == 0xFFFFFFFFu;
  }
  return ok;
}

// A of one stage into the fragment buffer (block-scaled A only; a 16-bit A is read in place,
// AFragments): item (token m, chunk c, thread slot t) decodes A's 4 bytes at 16c + 4t of row m
// into the B-operand registers (b0, b1) of k-step(s) of chunk c that lane (m % 8) * 4 + t of
// every warp reads for token tile m / 8. Tokens past M are zero. The group path also writes A's
// scales as fp32 [group][token] (1 for tokens past M).
template <int V, int A, int MT>
__device__ __forceinline__ void ConvertA(const Params& p, uint32_t base, int slot) {
  using S = Smem<V, A, MT>;
  using Tr = Traits<V, A>;
  static_assert(!Tr::kWeightOnly, "a 16-bit A needs no conversion");
  const int tid = threadIdx.x;
  const uint32_t raw = base + S::kOffA + slot * S::kASlot, sfa = base + S::kOffSfa + slot * S::kSfSlot;
  const uint32_t conv = base + S::kOffConv;
#pragma unroll
  for (int i = tid; i < S::kTokens * 32; i += kThreads) {
    const int t = i & 3, m = (i >> 8) * 8 + ((i >> 2) & 7),
              c = (i >> 5) & 7;  // a warp: 8 tokens x 4 slots of one chunk
    uint32_t h[Tr::kHalves];
#pragma unroll
    for (int x = 0; x < Tr::kHalves; ++x) h[x] = 0u;
    if (m < p.m) {
      Decode<V>(Lds32(raw + m * 128 + ((c ^ (m & 7)) << 4) + 4 * t), h);
      if constexpr (Tr::kFolded) {  // group 2c + t / 2 of the stage: block c / 2, byte 2 (c % 2) + t / 2
        const uint32_t s = ScaleHalf2(Lds8(sfa + (c >> 1) * 512 + BlockOffset(m, 2 * (c & 1) + (t >> 1))));
#pragma unroll
        for (int x = 0; x < Tr::kHalves; ++x) h[x] = Hmul2(Hmul2(h[x], kHalf2Pow14), s);
      }
    }
#pragma unroll
    for (int s = 0; s < Tr::kStepsPerChunk; ++s)
      Sts64(conv + (((c * Tr::kStepsPerChunk + s) * MT + (m >> 3)) * 32 + (m & 7) * 4 + t) * 8, h[2 * s], h[2 * s + 1]);
  }
  if constexpr (!Tr::kFolded) {
    for (int i = tid; i < Tr::kGroupsPerStage * S::kTokens; i += kThreads) {
      const int gi = i / S::kTokens, m = i % S::kTokens;
      const float f = m < p.m ? E8M0Float(Lds8(sfa + (gi >> 2) * 512 + BlockOffset(m, gi & 3))) : 1.0f;
      Sts32(base + S::kOffScaleA + i * 4, __float_as_uint(f));
    }
  }
}

// A 16-bit A's B-operand registers (b0, b1) of k-steps step0 and step0 + 1 for this lane (token
// row `row` of the ring slot, thread slot t = lane % 4), read in place: they must hold the values
// that meet B's bytes 16c + 4t..16c + 4t + 3 in Decode's order. FP8: chunk c = step0 + s meets
// elements 16c + 4t.. (8 bytes, as they are); FP4: chunk c = step0 / 2 meets 32c + 8t.. (16 bytes),
// paired i, i + 4 as Decode pairs nibbles.
template <int V, int A>
__device__ __forceinline__ void AFragments(uint32_t row, int step0, int lane, uint2 (&b)[2]) {
  const int g = lane >> 2, t = lane & 3;
  if constexpr (!Traits<V, A>::kFp4) {
#pragma unroll
    for (int s = 0; s < 2; ++s) b[s] = Lds64(row + (((2 * (step0 + s) + (t >> 1)) ^ g) << 4) + 8 * (t & 1));
  } else {
    const uint4 v = Lds128(row + (((2 * step0 + t) ^ g) << 4));
    b[0] = make_uint2(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632));
    b[1] = make_uint2(__byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
  }
}

// Adds one group's block sums to the accumulators: acc[jt][e] holds row (g, g, g+8, g+8) and
// token 8 jt + 2t + (0, 1, 0, 1) of the warp's tile. Weight-only: each term is the block sum times
// SFB, one rounding whatever the scale (E8M0Float: 2^-127 subnormal, 0xFF NaN).
template <int V, int A, int MT>
__device__ __forceinline__ void AddGroup(float (&acc)[MT][4], const float (&blk)[MT][4], uint32_t eb0, uint32_t eb1,
                                         uint32_t scale_a, int t) {
  constexpr float kBs = Traits<V, A>::kBlockScale;
  if constexpr (Traits<V, A>::kWeightOnly) {
    const float fb0 = E8M0Float(eb0), fb1 = E8M0Float(eb1);
#pragma unroll
    for (int jt = 0; jt < MT; ++jt) {
      acc[jt][0] = fmaf(blk[jt][0] * kBs, fb0, acc[jt][0]);
      acc[jt][1] = fmaf(blk[jt][1] * kBs, fb0, acc[jt][1]);
      acc[jt][2] = fmaf(blk[jt][2] * kBs, fb1, acc[jt][2]);
      acc[jt][3] = fmaf(blk[jt][3] * kBs, fb1, acc[jt][3]);
    }
  } else {
    float2 fa[MT];
#pragma unroll
    for (int jt = 0; jt < MT; ++jt) {
      const uint2 v = Lds64(scale_a + (8 * jt + 2 * t) * 4);
      fa[jt] = make_float2(__uint_as_float(v.x), __uint_as_float(v.y));
    }
    if (Moderate(eb0) && Moderate(eb1)) {
      const float fb0 = __uint_as_float(eb0 << 23) * kBs, fb1 = __uint_as_float(eb1 << 23) * kBs;  // normal: Moderate
#pragma unroll
      for (int jt = 0; jt < MT; ++jt) {
        acc[jt][0] = fmaf(blk[jt][0] * fb0, fa[jt].x, acc[jt][0]);
        acc[jt][1] = fmaf(blk[jt][1] * fb0, fa[jt].y, acc[jt][1]);
        acc[jt][2] = fmaf(blk[jt][2] * fb1, fa[jt].x, acc[jt][2]);
        acc[jt][3] = fmaf(blk[jt][3] * fb1, fa[jt].y, acc[jt][3]);
      }
    } else {
#pragma unroll
      for (int jt = 0; jt < MT; ++jt) {
        const uint32_t ea0 = __float_as_uint(fa[jt].x) >> 23,
                       ea1 = __float_as_uint(fa[jt].y) >> 23;  // E8M0Float's byte
        acc[jt][0] += ExactTerm(blk[jt][0] * kBs, ea0, eb0);
        acc[jt][1] += ExactTerm(blk[jt][1] * kBs, ea1, eb0);
        acc[jt][2] += ExactTerm(blk[jt][2] * kBs, ea0, eb1);
        acc[jt][3] += ExactTerm(blk[jt][3] * kBs, ea1, eb1);
      }
    }
  }
}

// The MMAs of one 16-byte chunk's two k-steps (step0, step0 + 1 of the stage) against every token
// tile: a[s] is k-step s's fragment of B's rows, the tokens' fragments come from the converted A
// (abuf: the fragment buffer) or, for a 16-bit A, from its ring slot (abuf: the slot).
template <int V, int A, int MT>
__device__ __forceinline__ void MmaChunk(float (&d)[MT][4], const uint32_t (&a)[2][4], uint32_t abuf, int step0,
                                         int lane) {
#pragma unroll
  for (int jt = 0; jt < MT; ++jt) {
    uint2 b[2];
    if constexpr (Traits<V, A>::kWeightOnly) {
      AFragments<V, A>(abuf + (8 * jt + (lane >> 2)) * Traits<V, A>::kAStageBytes, step0, lane, b);
    } else {
#pragma unroll
      for (int s = 0; s < 2; ++s) b[s] = Lds64(abuf + (((step0 + s) * MT + jt) * 32 + lane) * 8);
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if constexpr (A == kABF16) MmaBF16(d[jt], a[s], b[s]);
      else Mma(d[jt], a[s], b[s]);
    }
  }
}

// A group's block sums: the chunk's MMAs into zeroed accumulators (AddGroup scales and adds them).
template <int V, int A, int MT>
__device__ __forceinline__ void BlockSums(float (&blk)[MT][4], const uint32_t (&a)[2][4], uint32_t abuf, int step0,
                                          int lane) {
#pragma unroll
  for (int jt = 0; jt < MT; ++jt)
#pragma unroll
    for (int e = 0; e < 4; ++e) blk[jt][e] = 0.0f;
  MmaChunk<V, A, MT>(blk, a, abuf, step0, lane);
}

// Whether B's FP4 codes decode straight to bf16 (DecodeFp4BF16): MXFP4 against a bf16 A.
template <int V, int A>
constexpr bool kDecodeToBF16 = V == kMXFP4 && A == kABF16;

// B's decoded registers as the MMA takes them: f16 as they are, bf16 at their value (ToBF16).
template <int V, int A>
__device__ __forceinline__ void ToMmaType(uint32_t (&a)[2][4]) {
  if constexpr (A == kABF16 && !kDecodeToBF16<V, A>) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
      for (int x = 0; x < 4; ++x) a[s][x] = ToBF16(a[s][x], Traits<V, A>::kBOffset);
  }
}

// One stage of one warp: its 16 rows of B (ldmatrix: matrices rows 0-7 / 8-15 of chunks c, c + 1)
// against every token tile. kFold (the CTA's vote, ScalesFold): B's registers carry their scales
// and the MMAs accumulate straight into acc. kFull: the stage lies wholly inside K. Both are
// template arguments so that a stage's chunks are one straight-line block, which ptxas
// interleaves (loads and decodes of the next chunks during this one's MMAs): with a branch per
// chunk the warp waited out each chunk's dependency chain.
template <int V, int A, int MT, bool kFold, bool kFull>
__device__ __forceinline__ void ComputeStage(const Params& p, uint32_t base, int slot, int stage, float (&acc)[MT][4]) {
  using S = Smem<V, A, MT>;
  using Tr = Traits<V, A>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  const int r0 = warp * 16 + (lane >> 2);  // this thread's rows of the tile: r0, r0 + 8
  const uint32_t bslot = base + slot * S::kBSlot, sfb = base + S::kOffSfb + slot * S::kSfSlot;
  const uint32_t scale_a = base + S::kOffScaleA;
  const uint32_t abuf = Tr::kWeightOnly ? base + S::kOffA + slot * S::kASlot : base + S::kOffConv;
  const int lrow = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;  // the row this lane addresses
  uint32_t wb[Tr::kBlocksPerStage][2];                              // B's scale bytes of 4 groups, rows r0 and r0 + 8
#pragma unroll
  for (int kb = 0; kb < Tr::kBlocksPerStage; ++kb) {
    wb[kb][0] = Lds32(sfb + kb * 512 + BlockOffset(r0, 0));
    wb[kb][1] = Lds32(sfb + kb * 512 + BlockOffset(r0 + 8, 0));
  }
  const int kbyte0 = stage * kStageBytes;
#pragma unroll
  for (int cp = 0; cp < 4; ++cp) {  // chunk pairs
    if (!kFull && kbyte0 + cp * 32 >= p.row_bytes) break;
    uint32_t r[4];
    const int ch = 2 * cp + (lane >> 4);
    Ldmatrix4(bslot + lrow * 128 + ((ch ^ (lrow & 7)) << 4), r);
    if constexpr (!Tr::kFp4) {  // one 32-group: chunk 2cp (r0, r1), chunk 2cp + 1 (r2, r3)
      uint32_t h[4][2];
#pragma unroll
      for (int x = 0; x < 4; ++x) Decode<V>(r[x], h[x]);
      uint32_t a[2][4] = {{h[0][0], h[1][0], h[0][1], h[1][1]}, {h[2][0], h[3][0], h[2][1], h[3][1]}};
      const uint32_t eb0 = (wb[0][0] >> (8 * cp)) & 0xFFu, eb1 = (wb[0][1] >> (8 * cp)) & 0xFFu;  // group cp
      if constexpr (kFold) {  // rows r0 (even registers), r0 + 8 (odd) at value x scale
        const float f0 = __uint_as_float(eb0 << 23), f1 = __uint_as_float(eb1 << 23);
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int x = 0; x < 4; ++x) a[s][x] = ToBF16(a[s][x], (x & 1) ? f1 : f0);
        MmaChunk<V, A, MT>(acc, a, abuf, 2 * cp, lane);
        continue;
      }
      ToMmaType<V, A>(a);
      float blk[MT][4];
      BlockSums<V, A, MT>(blk, a, abuf, 2 * cp, lane);
      AddGroup<V, A, MT>(acc, blk, eb0, eb1, scale_a + cp * S::kTokens * 4, t);
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // chunk 2cp + half: rows r0 in r[2 half], r0 + 8 in r[2 half + 1]
        const int chunk = 2 * cp + half;
        if (!kFull && half == 1 && kbyte0 + chunk * 16 >= p.row_bytes) break;
        uint32_t h0[4], h1[4];
        const uint32_t eb0 = (wb[chunk >> 2][0] >> (8 * (chunk & 3))) & 0xFFu,  // the chunk's 32-group (MXFP4)
            eb1 = (wb[chunk >> 2][1] >> (8 * (chunk & 3))) & 0xFFu;
        if constexpr (kDecodeToBF16<V, A>) {
          if constexpr (kFold) {  // value x scale
            DecodeFp4BF16(r[2 * half], h0, BF16x2Pow126Times(eb0));
            DecodeFp4BF16(r[2 * half + 1], h1, BF16x2Pow126Times(eb1));
            const uint32_t a[2][4] = {{h0[0], h1[0], h0[1], h1[1]}, {h0[2], h1[2], h0[3], h1[3]}};
            MmaChunk<V, A, MT>(acc, a, abuf, 2 * chunk, lane);
            continue;
          }
          DecodeFp4BF16(r[2 * half], h0);
          DecodeFp4BF16(r[2 * half + 1], h1);
        } else {
          Decode<V>(r[2 * half], h0);
          Decode<V>(r[2 * half + 1], h1);
        }
        // k-step s of the chunk: rows r0 (h0) and r0 + 8 (h1), each as two f16x2 (bf16x2) registers.
        uint32_t a[2][4] = {{h0[0], h1[0], h0[1], h1[1]}, {h0[2], h1[2], h0[3], h1[3]}};
        if constexpr (Tr::kFolded) {
          // This thread's group is 2 chunk + t / 2: block chunk / 2, byte 2 (chunk % 2) + t / 2.
          const int kb = chunk >> 1, sh = 8 * (2 * (chunk & 1) + (t >> 1));
          const uint32_t s0 = Hmul2(ScaleHalf2((wb[kb][0] >> sh) & 0xFFu), kHalf2Pow7);
          const uint32_t s1 = Hmul2(ScaleHalf2((wb[kb][1] >> sh) & 0xFFu), kHalf2Pow7);
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int x = 0; x < 4; ++x) a[s][x] = Hmul2(a[s][x], (x & 1) ? s1 : s0);
          ToMmaType<V, A>(a);
          MmaChunk<V, A, MT>(acc, a, abuf, 2 * chunk, lane);
        } else {  // one 32-group per chunk
          ToMmaType<V, A>(a);
          float blk[MT][4];
          BlockSums<V, A, MT>(blk, a, abuf, 2 * chunk, lane);
          AddGroup<V, A, MT>(acc, blk, eb0, eb1, scale_a + chunk * S::kTokens * 4, t);
        }
      }
    }
  }
}

// The finished tile (fp32 accumulators of every warp) -> C and amax, staged [token][row] through
// the B ring (free: the pipeline has drained).
template <int V, int A, int MT>
__device__ __forceinline__ void StoreTile(const Params& p, uint32_t base, const float (&acc)[MT][4], int l, int n0) {
  using S = Smem<V, A, MT>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
  const int r0 = warp * 16 + (lane >> 2);
#pragma unroll
  for (int jt = 0; jt < MT; ++jt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 8 * jt + 2 * t + (e & 1), r = r0 + 8 * (e >> 1);
      Sts32(base + (m * S::kCPitch + r) * 4, __float_as_uint(acc[jt][e] * Traits<V, A>::kAccScale));
    }
  __syncthreads();
  float amax_run = 0.0f;
  for (int i = tid; i < p.m * (kTileN / 2); i += kThreads) {
    const int m = i / (kTileN / 2), pr = i % (kTileN / 2), n = n0 + 2 * pr;
    if (n >= p.n) continue;
    const uint2 v = Lds64(base + (m * S::kCPitch + 2 * pr) * 4);
    const float v0 = __uint_as_float(v.x), v1 = __uint_as_float(v.y);
    const bool two = n + 1 < p.n;
    amax_run = AbsMaxNaN(amax_run, v0);
    if (two) amax_run = AbsMaxNaN(amax_run, v1);
    StoreC(p.c_type, p.c, (static_cast<size_t>(l) * p.rows + m) * p.n + n, v0, v1, two);
  }
  FlushAmax(amax_run, p.amax, l);
}

template <int V, int A, int MT>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<MT>) SkinnyKernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint32_t s_last;
  const int tid = threadIdx.x;
  const uint32_t base = SmemAddr(smem);

  // The zeroing round: CTA 0 zeroes amax and the split counters, every CTA arrives; the first
  // atomic of each CTA (a counter or an amax flush) waits for the round to complete.
  if (blockIdx.x == 0) {
    if (p.zero_amax)
      for (int i = tid; i < p.l; i += kThreads) p.amax[i] = 0.0f;
    if (p.splits > 1)
      for (int i = tid; i < p.tiles; i += kThreads) p.counters[i] = 0u;
    __threadfence();
  }
  __syncthreads();
  uint32_t reset_old = 0;
  bool reset_done = false;
  if (tid == 0) reset_old = ResetArrive(p.reset_word);

  for (int unit = blockIdx.x; unit < p.units; unit += gridDim.x) {
    const int tile = unit / p.splits, split = unit - tile * p.splits;
    const int l = tile / p.tiles_n, n0 = (tile - l * p.tiles_n) * kTileN;
    const int first = split * p.stages_per_split;
    const int count = min(p.stages_per_split, p.num_stages - first);  // >= 1 (the planner leaves no empty split)

    float acc[MT][4];
#pragma unroll
    for (int jt = 0; jt < MT; ++jt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[jt][e] = 0.0f;
    const UnitCopies copies = SetUpCopies<V, A, MT>(p, l, n0);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (i < count) IssueStage<V, A, MT>(p, copies, base, i, first + i);
      CpAsyncCommit();
    }
#pragma unroll 1
    for (int it = 0; it < count; ++it) {
      CpAsyncWait<kStages - 2>();
      // Stage `it` has landed everywhere; every warp is done with stage it - 1's slot.
      bool fold = false;
      if constexpr (Traits<V, A>::kFoldable)
        fold = __syncthreads_and(ScalesFold<V, A, MT>(p, base, it % kStages, first + it, n0));
      else __syncthreads();
      const int next = it + kStages - 1;
      if (next < count) IssueStage<V, A, MT>(p, copies, base, next % kStages, first + next);
      CpAsyncCommit();
      if constexpr (!Traits<V, A>::kWeightOnly) {
        ConvertA<V, A, MT>(p, base, it % kStages);
        __syncthreads();
      }
      // The K tail's stage (the last of a row, when K is not a multiple of a stage) takes the group
      // path, which is exact for any scales: one variant with the tail's checks, not two. 64 tokens
      // keep the checks in every stage (kFull false): interleaved, their chunks made ptxas spill
      // (sm_100a, MXFP4 against a bf16 A).
      constexpr bool kStraight = MT <= 4;
      const int slot = it % kStages, stage = first + it;
      const bool tail = (stage + 1) * kStageBytes > p.row_bytes;
      if (fold && !tail) ComputeStage<V, A, MT, Traits<V, A>::kFoldable, kStraight>(p, base, slot, stage, acc);
      else if (tail || !kStraight) ComputeStage<V, A, MT, false, false>(p, base, slot, stage, acc);
      else ComputeStage<V, A, MT, false, true>(p, base, slot, stage, acc);
    }
    CpAsyncWait<0>();  // only empty groups remain

    if (p.splits > 1) {
      float4* const partials = p.partials + static_cast<size_t>(tile) * p.splits * MT * kThreads;
#pragma unroll
      for (int jt = 0; jt < MT; ++jt)
        __stcg(partials + (split * MT + jt) * kThreads + tid,
               make_float4(acc[jt][0], acc[jt][1], acc[jt][2], acc[jt][3]));
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        if (!reset_done) ResetWait(p.reset_word, reset_old);
        reset_done = true;
        s_last = atomicAdd(p.counters + tile, 1u) == static_cast<unsigned int>(p.splits - 1);
      }
      __syncthreads();
      if (!s_last) continue;
      __threadfence();
#pragma unroll
      for (int jt = 0; jt < MT; ++jt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[jt][e] = 0.0f;
#pragma unroll 1
      for (int sp = 0; sp < p.splits; ++sp)  // in split order, whichever split finished last
#pragma unroll
        for (int jt = 0; jt < MT; ++jt) {
          const float4 v = __ldcg(partials + (sp * MT + jt) * kThreads + tid);
          acc[jt][0] += v.x;
          acc[jt][1] += v.y;
          acc[jt][2] += v.z;
          acc[jt][3] += v.w;
        }
    } else {
      if (tid == 0 && !reset_done) ResetWait(p.reset_word, reset_old);
      reset_done = true;
      __syncthreads();  // also: every warp is done with the ring, which StoreTile reuses
    }
    StoreTile<V, A, MT>(p, base, acc, l, n0);
    __syncthreads();  // the staged tile is read before the next unit's copies overwrite the ring
  }
  if (tid == 0 && !reset_done) ResetWait(p.reset_word, reset_old);  // a CTA with no unit: the round still completes
}

}  // namespace skinny
}  // namespace jga
