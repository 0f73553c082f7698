// SM90 (Hopper, sm_90a) block-scaled GEMM + fused amax.
//
// Design (see ffi/cuda/sm90/DESIGN.md, "One CTA: producer, converters, consumers"):
//   * persistent, warp-specialized CTA of 4 warpgroups (512 threads), one CTA per SM:
//       WG0: one thread is the producer: TMA loads of the narrow A/B tiles (128-byte K slabs,
//            128B swizzle) and 1-D bulk copies of the 512-byte 128x4 scale blocks straight from
//            the physical layout into a ring of raw stages. Its own warpgroup (24 registers):
//            issuing one slab's copies takes it ~1000-2000 cycles, which must not delay anyone.
//       WG1: converts the B tile (value x scale -> BF16, exact) into a 128B-swizzled buffer per
//            64-K unit (a ring of BF16 B buffers).
//       WG2, WG3: consumers. Each loads its rows of one 64-K unit of A into registers, converts
//            them (value x scale -> BF16) straight into WGMMA A-fragment registers and issues BF16
//            WGMMA (RS: A in registers, B from shared memory) with FP32 accumulators, software-
//            pipelined so that a step's conversion overlaps the previous step's WGMMAs; then the
//            epilogue (C in any dtype + amax).
//     ptxas serializes WGMMAs (a wait after each) when it sees them in a path it considers
//     divergent or runs short of registers (infos C7511/C7517/C7518); tests/test_cuda_build.py
//     checks the SASS for it. Hence: warp-uniform role index, predicated arrives and amax atomics,
//     a real (not unrolled) unit loop.
//   * K is permuted consistently for A and B inside each 64-K unit so that every thread reads
//     16 contiguous bytes of A per row (one LDS.128) and the converter writes whole 16-byte chunks.
//   * Pre-converted operands (kPre, tile 256, problems with many rows (B, unsplit plans) or columns
//     (A, split-K plans too)): PreconvertKernel writes the operand as BF16 in the converter's K
//     order into the workspace first (memory-bound: 54 us for 8192 x 8192 fp8 codes, ncu); the
//     producer TMA-loads it per 64-K unit into BF16 buffers. B: the converter warpgroup idles
//     (converting B per tile costs ~12% of the GEMM, ncu, 8192^3: 1.72 ms vs 1.52). A: the
//     consumers run SS WGMMAs instead of converting.
//   * CTA tile: (128*MI) x 128 (MI = 1 or 2, picked by the host's cost model). A work unit is a
//     tile, or, in the kSplitK kernels (problems with few tiles), one of `splits` K ranges of a
//     tile: the other splits hand fp32 partial tiles to the last one through a device workspace.
//   * amax and the split-K counters are zeroed by this kernel (CTA 0), ordered before every
//     CTA's first atomic on them by one round of a grid barrier word that needs no reset
//     (ResetRound): no kernel runs before it for that.
//   * Conversion: the code's bits are moved into BF16 position with PRMT/SHF/LOP (value * 2^-O
//     exactly, subnormals included), then multiplied (BF16 HMUL2, exact) by a per-group
//     power-of-two (e8m0) or e4m3 multiplier that also undoes 2^-O (a second multiply only when an
//     e8m0 byte is too large for one BF16 multiplier, NaN included). FP4 operands carry an extra
//     2^-8 each, undone by x2^16 on the FP32 accumulator.
//   * amax: NaN-propagating |x| max per thread (max.NaN.xorsign.abs), warp redux, one atomicMax
//     per warp per batch item on the float bits (valid for |x| >= +0; NaN bits sort above inf).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

#include "common/numerics.h"
#include "common/problem.h"
#include "cuda/sm90/wgmma.h"

namespace jga {
namespace sm90 {

// ---------------------------------------------------------------------------------------------
// Variants (operand type / scale type / scale vector size).
enum Variant : int { kV_E4M3 = 0, kV_E5M2 = 1, kV_MXFP4_32 = 2, kV_MXFP4_16 = 3, kV_NVFP4 = 4 };

template <int V>
struct VariantTraits {
  static constexpr bool kFp4 = (V >= kV_MXFP4_32);
  static constexpr bool kScaleE4M3 = (V == kV_NVFP4);
  static constexpr int kSfv = (V == kV_MXFP4_16 || V == kV_NVFP4) ? 16 : 32;
  // One raw stage ("slab") = 128 bytes of K per row: 128 fp8 or 256 fp4 elements.
  static constexpr int kKPerSlab = kFp4 ? 256 : 128;
  static constexpr int kGroupsPerSlab = kKPerSlab / kSfv;      // 4, 8 or 16
  static constexpr int kScaleBlocksPerSlab = kGroupsPerSlab / 4;  // 1, 2 or 4
  static constexpr int kUnitsPerSlab = kKPerSlab / 64;         // 64-K MMA units per slab: 2 or 4
  // Raw BF16 bits of a code are value * 2^-kO; fp4 operands get an extra 2^-kD.
  static constexpr int kO = (V == kV_E4M3) ? 120 : (V == kV_E5M2) ? 112 : 126;
  static constexpr int kD = kFp4 ? 8 : 0;
  static constexpr int kOD = kO - kD;         // multiplier exponent field = s + kOD
  static constexpr int kT = 254 - kOD;        // largest e8m0 byte handled by one multiply
  static constexpr float kAccScale = kFp4 ? 65536.0f : 1.0f;  // 2^(2D)
};

struct KParams {
  int m, n, l;
  int k_groups;        // K / sfv
  int k_blocks;        // ceil(k_groups / 4): scale blocks along K
  int num_kslabs;      // ceil(K bytes / 64)
  int row_blocks_a, row_blocks_b;
  long long sfa_batch_stride, sfb_batch_stride;
  const uint8_t* sfa;
  const uint8_t* sfb;
  void* c;
  float* amax;
  int c_type;
  int c_aligned16;     // every C row starts 16-byte aligned: full tiles take the staged epilogue
  int flags;           // kFlagNoAmax: skip amax
  // From here on the fields keep the 8-byte alignment of the layout the kernels' SASS and timings
  // were measured with (ptxas pairs 4-byte fields into 64-bit constant loads).
  alignas(8) int tiles_m;
  int tiles_n;
  int tiles_per_batch, tiles_total;
  // Split-K: the first `whole_tiles` tiles are one work unit each; the K slabs of each of the
  // other `split_tiles` tiles are cut into `splits` contiguous ranges (the last, the reducer's,
  // longer), one work unit each (few tiles in all: whole_tiles = 0; a last wave of few tiles: the
  // whole waves first, then the last one's tiles split, so that they fill the GPU). Splits 0..S-2
  // store their fp32 accumulators to `partials` and count themselves in `tile_ready` (zeroed
  // before the launch); split S-1, the reducer, waits for that count, adds the partials and runs
  // the epilogue. splits == 1: no workspace.
  int splits;
  int split_slabs;     // K slabs of each non-reducing split; the reducer takes the rest (see DecodeUnit)
  int whole_tiles, split_tiles;
  int units_total;     // whole_tiles + split_tiles * splits
  unsigned int* tile_ready;  // [split_tiles]
  float* partials;     // [(splits - 1) * split_tiles][kBM * kBN] in the consumers' fragment order
  // The kernel zeroes amax and tile_ready itself (no kernel before it): CTA 0 writes the zeroes,
  // then every CTA arrives on one round of this word, and the consumers wait for the round to
  // complete before their first atomic (ResetRound). nullptr: nothing to zero (no amax, unsplit).
  unsigned int* reset_word;
};

// Warpgroups of a CTA: the producer, kConverterWGs B converters, two consumers. Tile height 128
// (MI = 1) has two converters, which take the 64-K units of a slab in turn: B is converted once per
// tile at either height, so at MI = 1 it is the same work for half the MMAs, and with one converter
// the consumers waited for it (8192^3: ~450 cycles per slab waiting for full B buffers).
// At MI = 2 the consumers' registers leave no room for a second converter.
template <int MI>
struct Roles {
  static constexpr int kConverterWGs = MI == 1 ? 2 : 1;
  static constexpr int kFirstConsumerWarp = 4 * (1 + kConverterWGs);
  static constexpr int kThreads = 32 * kFirstConsumerWarp + 256;
  // setmaxnreg budgets. The CTA's register pool is what it was launched with: the per-thread count
  // that __launch_bounds__(kThreads, 1) allows (ptxas uses all of it in kernels with setmaxnreg),
  // times kThreads; the producer keeps 24, the converters 56, the consumers get the rest (MI = 2:
  // 216 of 128 x 512; MI = 1: 168 of 96 x 640). A consumer budget above the pool would hang the
  // CTA in setmaxnreg.inc.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24, kConverterRegs = 56;
  static constexpr int kConsumerRegs =
      (kLaunchRegs * kThreads - 128 * kProducerRegs - 128 * kConverterWGs * kConverterRegs) / 256 / 8 * 8;
  static_assert(kConsumerRegs >= 160, "consumer register budget");
};
// Rows per TMA box (A and B slabs are loaded as several boxes of this many 128-byte rows).
constexpr int kBoxRows = 64;
// Which row of its 8-row group the A codes (and so the accumulators and C values) of fragment row
// g carry. The WGMMA fragment gives lanes 4g..4g+3 row g; an LDS.128 is served a quarter-warp at a
// time, i.e. rows g and g+1 (lanes 0-7, 8-15, ...). In the TMA's 128B swizzle a 16-byte chunk c of
// row r sits at chunk c ^ (r & 7), so rows r and r+1 put a unit's 4 chunks into the same 4 chunk
// slots: a 2-way bank conflict on every A load. Giving the two rows of a quarter-warp rows g/2 and
// g/2 + 4 instead puts them into opposite halves of the 128 bytes (conflict-free; fp4's 8-byte
// loads: 2-way instead of 4-way).
__device__ __forceinline__ int FragRow(int g) { return (g >> 1) | ((g & 1) << 2); }
// KParams::flags bits.
constexpr int kFlagNoAmax = 1;  // no amax flush (LaunchOptions::skip_amax); the per-element maximum still runs
constexpr int kBN = 128;
// Epilogue staging buffer of each of the 8 consumer warps (see Epilogue).
constexpr int kStageBytesPerWarp = 1024;

// Operands pre-converted to BF16 (kPre bits, see PreconvertKernel): kPreB = 1, kPreA = 2. A
// pre-converted operand arrives by TMA straight into a ring of BF16 unit buffers (B: the converter's
// buffers, A: buffers the consumers read with SS WGMMAs); the raw stages hold only what is still
// converted in the kernel, which leaves room for deeper rings.
// kPingPong (with kPreA | kPreB only: the unsplit A'B' plans' kernel): ping-pong consumers. Each
// consumer warpgroup owns a tile of 64 * MI = 128 rows and the CTA's tiles go to the two warpgroups
// alternately; their main loops take turns (an order barrier pair), so one warpgroup's MMAs run
// while the other's epilogue does (the cooperative kernel's tensor cores idle through the epilogue
// of its 256-row tile: ~15% of the kernel at K = 1024). One ring of units in tile order: a stage
// holds one warpgroup's A' rows and the B' tile. The CTAs run in clusters of 2 along N (adjacent
// n-tiles of one m-tile) and each loads half of the A' rows, multicast to both, so that a CTA's
// L2->SM traffic per unit is 8 + 16 KB instead of 16 + 16: without it the 128-row tiles' main loop
// is L2-bound, 3-5% slower than the cooperative kernel's (DESIGN.md, "The ping-pong A'B' kernel").
constexpr int kPreB = 1, kPreA = 2, kPingPong = 4;
// The shape of a kernel's work, for the kernel (Smem) and the host that launches it: CTAs per
// cluster (along N; a ping-pong cluster's CTAs each load a part of the A tile for both), rows of a
// tile (ping-pong: one warpgroup's).
constexpr int ClusterCTAs(int pre) { return (pre & kPingPong) ? 2 : 1; }
constexpr int TileRows(int pre, int mi) { return (pre & kPingPong) ? 64 * mi : 128 * mi; }
template <int V, int MI, int kPre = 0>
struct Smem {
  using Tr = VariantTraits<V>;
  static constexpr bool kPreconvertedA = (kPre & kPreA) != 0, kPreconvertedB = (kPre & kPreB) != 0;
  static constexpr bool kPingPongTiles = (kPre & kPingPong) != 0;
  static_assert(!kPingPongTiles || (kPreconvertedA && kPreconvertedB && MI == 2), "ping-pong: A'B' tile 256 kernel only");
  static constexpr int kClusterCTAs = ClusterCTAs(kPre);
  static constexpr int kBM = TileRows(kPre, MI);
  // m-tiles per group of the tile raster (DecodeTile): 2048 rows at tile 256, in both kernels.
  static constexpr int kRasterMTiles = kPingPongTiles ? 16 : 8;
  static constexpr int kRawStages = (kPreconvertedA && kPreconvertedB) ? 0
                                    : kPreconvertedB                  ? 4
                                    : kPreconvertedA                  ? 3
                                                                      : (MI == 2 ? 3 : 4);
  static constexpr int kRawA = kPreconvertedA ? 0 : kBM * 128;
  static constexpr int kRawB = kPreconvertedB ? 0 : kBN * 128;
  static constexpr int kBufB = kBN * 128;  // bf16 B of one 64-K unit: 128 rows x 128 bytes
  static constexpr int kBufA = kPreconvertedA ? kBM * 128 : 0;  // bf16 A of one 64-K unit
  static constexpr int kAStages = kPingPongTiles ? 6 : kPreconvertedA ? (kPreconvertedB ? 4 : 3) : 0;
  static constexpr int kSfA = kPreconvertedA ? 0 : MI * Tr::kScaleBlocksPerSlab * 512;
  static constexpr int kSfB = kPreconvertedB ? 0 : Tr::kScaleBlocksPerSlab * 512;
  static constexpr int kRawBytes = kRawStages * (kRawA + kRawB + kSfA + kSfB);
  static constexpr int kFixedBytes = 1024 + 256 + 8 * kStageBytesPerWarp;  // alignment slack, barriers, epilogue
  static constexpr int kUsed = kRawBytes + kAStages * kBufA + kFixedBytes;
  static constexpr int kBStages = kPingPongTiles ? kAStages
                                  : (kPreconvertedB && kUsed + 5 * kBufB <= 227 * 1024) ? 5
                                  : (kUsed + 4 * kBufB <= 227 * 1024)                 ? 4
                                                                                      : 3;
  static constexpr int kOffRawA = 0;
  static constexpr int kOffRawB = kOffRawA + kRawStages * kRawA;
  static constexpr int kOffBufB = kOffRawB + kRawStages * kRawB;
  static constexpr int kOffBufA = kOffBufB + kBStages * kBufB;
  static constexpr int kOffSfA = kOffBufA + kAStages * kBufA;
  static constexpr int kOffSfB = kOffSfA + kRawStages * kSfA;
  static constexpr int kOffBar = kOffSfB + kRawStages * kSfB;
  static constexpr int kNumBars = 2 * (kRawStages + kBStages + kAStages) + 3;  // + the ping-pong order pair, the reset round
  static constexpr int kOffStage = (kOffBar + kNumBars * 8 + 127) / 128 * 128;  // epilogue staging, 1 KB per consumer warp
  static constexpr int kBytes = kOffStage + 8 * kStageBytesPerWarp;
  static constexpr int kDynBytes = kBytes + 1024;  // slack for 1024-byte alignment
  static constexpr uint32_t kTxBytes = kRawA + kRawB + kSfA + kSfB;
  static_assert(kDynBytes <= 227 * 1024, "shared memory budget");
};

// ---------------------------------------------------------------------------------------------
// PTX helpers.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
// Predicated arrive (no branch: see FlushAmax).
__device__ __forceinline__ void MbarArriveIf(uint32_t bar, bool pred) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "}\n" ::"r"(bar),
      "r"(static_cast<uint32_t>(pred))
      : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void TmaLoad3D(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void TmaLoad3DMulticast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                                   int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}
// Arrives (if pred) on the mbarrier at offset `bar` in each of the cluster's first kCTAs CTAs
// (predicated, no branch: see FlushAmax).
// The arrive keeps the default .release.cta semantics: `.release.cluster` compiles to MEMBAR.ALL.GPU
// + CCTL.IVALL per arrive, which waits for every memory operation of the thread in flight (the
// epilogue's stores too): the paired ping-pong kernel ran at 217 against 572 TF/s with it (8192^3,
// measured). The reads the arrive hands back are this CTA's completed WGMMA reads of its
// own shared memory, which CTA scope orders (as CUTLASS's ClusterBarrier::arrive(cta_id)).
template <int kCTAs>
__device__ __forceinline__ void MbarArriveClusterIf(uint32_t bar, bool pred) {
#pragma unroll
  for (int c = 0; c < kCTAs; ++c) {
    if constexpr (kCTAs == 1) {
      MbarArriveIf(bar, pred);
    } else {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(c));
      asm volatile(
          "{\n"
          ".reg .pred p;\n"
          "setp.ne.u32 p, %1, 0;\n"
          "@p mbarrier.arrive.shared::cluster.b64 _, [%0];\n"
          "}\n" ::"r"(remote),
          "r"(static_cast<uint32_t>(pred))
          : "memory");
    }
  }
}
template <int kCTAs>
__device__ __forceinline__ void ClusterSync() {
  if constexpr (kCTAs > 1) asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
template <int kCTAs>
__device__ __forceinline__ uint32_t ClusterCtaRank() {
  uint32_t r = 0;
  if constexpr (kCTAs > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Hands a raw stage back to the producer after this warp's last read of it. The producer's next
// write into the stage is a TMA (async proxy), and an mbarrier release orders only generic-proxy
// accesses: without the proxy fence a read still in flight can return the next slab's bytes (seen
// on the H200 with a variant of the consumer: a few rows of 1-6 tiles per call wrong at
// 16384x8192x1024; ptxas turns the fence into MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, which waits for
// this thread's loads).
__device__ __forceinline__ void ReleaseRawStage(uint32_t bar, int lane) {
  FenceProxyAsync();
  __syncwarp();
  MbarArriveIf(bar, lane == 0);
}
// WGMMA descriptor of a 128B-swizzled K-major tile in shared memory (rows of 128 bytes, 8-row groups
// of 1024 bytes): start address / 16 (1024-aligned tiles below 2^18, so adding k-step offsets never
// carries out of the field), leading byte offset 1 (unused with 128B swizzle), stride 1024 B / 16,
// swizzle mode 1 (128B). K-step s (16 bf16) starts 32 bytes, 2 descriptor units, further.
__device__ __forceinline__ uint64_t SmemDesc128B(uint32_t addr) {
  return static_cast<uint64_t>(addr >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void SetMaxNReg() {
  if constexpr (R >= 128) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
  }
}
__device__ __forceinline__ void FenceOperand(float (&a)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(a[i])::"memory");
}
__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t MulBF16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint4 Lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 Lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t Lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t Lds8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void Sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}
// |m| = max(|m|, |v|), NaN-propagating (sign of the result is junk; fabs at the end).
__device__ __forceinline__ float AbsMaxNaN(float m, float v) {
  float r;
  asm("max.NaN.xorsign.abs.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(v));
  return r;
}

// Programmatic dependent launch: the kernel may start while the grids before it still run (the
// PreconvertKernel passes); every access to their output waits for them first. Without the launch
// attribute this returns at once.
__device__ __forceinline__ void WaitForPrecedingGrids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// The 256 consumer threads (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void ConsumerBarrier() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// Tile scheduling: linear tile id -> (l, m-tile, n-tile), grouped raster of 8 m-tiles.
struct TileCoord {
  int l, mt, nt;
};
// Work unit u < whole_tiles: tile u, all of K. Then v = u - whole_tiles: split v / split_tiles of
// tile whole_tiles + v % split_tiles. Every reducer (split S-1) has a larger index than the units
// it waits for, and each CTA runs its units in increasing order, so the lowest unfinished unit never
// waits: no deadlock, however the units land on the CTAs.
struct WorkUnit {
  int tile, split, splits, slab_lo, slab_hi;  // splits: 1 for a whole tile
};
// Kernels without split-K (kSplitK false; the host launches them when splits == 1) decode a unit as
// the whole tile, at compile time: their loops stay exactly the pre-split-K code (a runtime slab
// range cost the large shapes 2.5-4%, measured side by side, through a different instruction
// schedule of the consumer loop).
template <bool kSplitK>
__device__ __forceinline__ WorkUnit DecodeUnit(const KParams& p, int u) {
  WorkUnit w;
  if (!kSplitK || u < p.whole_tiles) {  // folded at compile time without split-K
    w.tile = u;
    w.split = 0;
    w.splits = 1;
    w.slab_lo = 0;
    w.slab_hi = p.num_kslabs;
    return w;
  }
  // Splits 0..S-2 take split_slabs each, the reducer the rest: more than its share, which it works
  // through while the others store their partials (it would otherwise wait for them idle).
  const int v = u - p.whole_tiles;
  w.split = v / p.split_tiles;
  w.tile = p.whole_tiles + (v - w.split * p.split_tiles);
  w.splits = p.splits;
  w.slab_lo = w.split * p.split_slabs;
  w.slab_hi = w.split == p.splits - 1 ? p.num_kslabs : w.slab_lo + p.split_slabs;
  return w;
}
// G: m-tiles per group (Smem::kRasterMTiles).
template <int G = 8>
__device__ __forceinline__ TileCoord DecodeTile(const KParams& p, int tile) {
  TileCoord tc;
  tc.l = tile / p.tiles_per_batch;
  const int rem = tile - tc.l * p.tiles_per_batch;
  const int group_span = G * p.tiles_n;
  const int grp = rem / group_span;
  const int first_m = grp * G;
  const int gsize = min(G, p.tiles_m - first_m);
  const int r = rem - grp * group_span;
  tc.mt = first_m + r % gsize;
  tc.nt = r / gsize;
  return tc;
}

// ---------------------------------------------------------------------------------------------
// Epilogue store of two adjacent columns (col even) of one row.
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

// ---------------------------------------------------------------------------------------------
// Split-K hand-over between the consumers of two CTAs. A non-reducing split stores its fp32
// accumulators in fragment order (16-byte chunk q of consumer thread c at chunk q * 256 + c: each
// store instruction of the 256 threads covers 4 KB contiguously) and counts itself in with a
// release; the reducer acquires the count and adds the partials in slot order (deterministic).
template <int MI>
__device__ __forceinline__ float4* PartialSlot(const KParams& p, int slot, int tile, int ctid) {
  const size_t index = static_cast<size_t>(slot) * p.split_tiles + (tile - p.whole_tiles);
  return reinterpret_cast<float4*>(p.partials + index * (MI * 128 * kBN)) + ctid;
}
template <int MI>
__device__ __forceinline__ void StorePartial(const float (&acc)[MI][64], const KParams& p, const WorkUnit& w, int ctid) {
  float4* dst = PartialSlot<MI>(p, w.split, w.tile, ctid);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < 16; ++j)
      __stcg(dst + (mi * 16 + j) * 256, make_float4(acc[mi][4 * j], acc[mi][4 * j + 1], acc[mi][4 * j + 2], acc[mi][4 * j + 3]));
  // The barrier orders every consumer thread's stores before thread 0's release (cumulativity).
  ConsumerBarrier();
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.eq.u32 p, %1, 0;\n"
      "@p red.release.gpu.global.add.u32 [%0], 1;\n"
      "}\n" ::"l"(p.tile_ready + (w.tile - p.whole_tiles)),
      "r"(static_cast<uint32_t>(ctid))
      : "memory");
}
// The reducer: waits until the tile's other splits have counted themselves in, then adds them.
__device__ __forceinline__ void WaitForPartials(const KParams& p, const WorkUnit& w) {
  const uint32_t need = static_cast<uint32_t>(w.splits - 1);
  const unsigned int* ready = p.tile_ready + (w.tile - p.whole_tiles);
  uint32_t seen;
  do {  // the whole warp polls, so that the loop stays warp-uniform (see FlushAmax)
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(ready) : "memory");
  } while (!__all_sync(0xFFFFFFFFu, seen >= need));
}
// The launch's zeroing of amax and the split-K counters, ordered before every CTA's first atomic
// without a kernel before this one. p.reset_word is a grid barrier word as cooperative groups keep
// theirs (cooperative_groups/details/sync.h): zeroed once when allocated, never reset; CTA 0 adds
// 0x80000000 - (CTAs - 1), every other CTA 1, so a complete round flips bit 31 and leaves the low
// bits at zero for the next launch. Run by one warp per CTA (an idle producer warp): CTA 0's
// lanes zero, then lane 0 arrives with release and polls with acquire until the bit flips, then
// arrives on the CTA's reset mbarrier, which the consumers wait for after every main loop (a
// completed phase: no wait after the first).
__device__ __forceinline__ void ResetRound(const KParams& p, uint32_t bar_reset, int lane) {
  if (p.reset_word == nullptr) {  // nothing to zero
    MbarArriveIf(bar_reset, lane == 0);
    return;
  }
  if (blockIdx.x == 0) {
    if ((p.flags & kFlagNoAmax) == 0)
      for (int i = lane; i < p.l; i += 32) p.amax[i] = 0.0f;
    if (p.splits > 1)
      for (int i = lane; i < p.split_tiles; i += 32) p.tile_ready[i] = 0u;
    __threadfence();  // each lane's zeroes visible GPU-wide, then (the warp barrier) lane 0's release
    __syncwarp();
  }
  if (lane == 0) {
    const uint32_t add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
    uint32_t old, now;
    asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p.reset_word), "r"(add) : "memory");
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(p.reset_word) : "memory");
      if (((now ^ old) & 0x80000000u) == 0u) __nanosleep(100);
    } while (((now ^ old) & 0x80000000u) == 0u);
    MbarArriveIf(bar_reset, true);
  }
  __syncwarp();
}

template <int MI>
__device__ __forceinline__ void AddPartials(float (&acc)[MI][64], const KParams& p, const WorkUnit& w, int ctid) {
#pragma unroll 1
  for (int slot = 0; slot < w.splits - 1; ++slot) {
    const float4* src = PartialSlot<MI>(p, slot, w.tile, ctid);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float4 v = __ldcg(src + (mi * 16 + j) * 256);
        acc[mi][4 * j] += v.x;
        acc[mi][4 * j + 1] += v.y;
        acc[mi][4 * j + 2] += v.z;
        acc[mi][4 * j + 3] += v.w;
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Epilogue of one consumer thread: rows row_w + FragRow(g) + mi*64 + {0, 8} (row_w: the warp's first row),
// columns col_t + 2t + 8j + {0, 1} (col_t: the tile's first column).
//
// Full tiles whose C rows start 16-byte aligned go through a 1 KB shared-memory staging buffer of
// the warp: per round the warp writes 8 rows x RB bytes of C there in its fragment layout, reads
// them back as 16-byte row chunks and stores whole 64/128-byte row segments (STG.128). Stored
// straight from the fragment layout, one warp store covered 8 rows x 16 bytes (bf16): 8 L1
// wavefronts for 512 bytes, which made the epilogue ~22% of the time at 16384x8192x1024
// (cycle counters in the kernel). Staged chunks are XOR-swizzled so that the fragment-layout writes
// are free of bank conflicts.
template <int CT, int MI, int V>
__device__ __forceinline__ void Epilogue(float (&acc)[MI][64], const KParams& p, int l, int row_w, int col_t,
                                         bool full, uint32_t stage, int lane, float& amax_run) {
  const int gr = FragRow(lane >> 2), t = lane & 3;  // this thread's rows: gr, gr + 8 of each 16
  const size_t batch_off = static_cast<size_t>(l) * p.m;
  auto value = [&](int mi, int i) { return acc[mi][i] * VariantTraits<V>::kAccScale; };
  if (full && p.c_aligned16) {
    constexpr int PB = kPairBytes<CT>;        // bytes of one thread's pair; 4 * PB per row per j
    constexpr int RB = PB == 1 ? 64 : 128;     // staged bytes per row and round (a tile row of e2m1 is 64)
    constexpr int JR = RB / (4 * PB);          // 8-column groups per round
    constexpr int CPR = RB / 16;               // 16-byte chunks per staged row
    // Chunk swizzle: the 8 rows of a fragment-layout store land in distinct banks.
    auto swz = [](int row, int chunk) { return PB == 8 ? chunk ^ ((2 * row) & 6) : PB == 1 ? chunk ^ ((row >> 1) & 3) : chunk ^ (row & 7); };
    const size_t row_pitch = static_cast<size_t>(p.n) * PB / 2;  // bytes (PB / 2 per element; e2m1: n / 2)
    uint8_t* const c_tile = static_cast<uint8_t*>(p.c) + (batch_off + row_w) * row_pitch + static_cast<size_t>(col_t) * PB / 2;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
        for (int cb = 0; cb < 16 / JR; ++cb) {
#pragma unroll
          for (int jj = 0; jj < JR; ++jj) {
            const int j = cb * JR + jj;
            const float v0 = value(mi, 4 * j + 2 * rr), v1 = value(mi, 4 * j + 2 * rr + 1);
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
        const float v0 = (mi == 0) ? value(0, 4 * j + 2 * rr) : value(MI - 1, 4 * j + 2 * rr);
        const float v1 = (mi == 0) ? value(0, 4 * j + 2 * rr + 1) : value(MI - 1, 4 * j + 2 * rr + 1);
        const bool two = col + 1 < p.n;
        amax_run = AbsMaxNaN(amax_run, v0);
        if (two) amax_run = AbsMaxNaN(amax_run, v1);
        StorePair<CT>(p.c, row_idx + col, v0, v1, two);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
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
      codes[4 * t] = v.x; codes[4 * t + 1] = v.y; codes[4 * t + 2] = v.z; codes[4 * t + 3] = v.w;
    } else {
      codes[2 * t] = v.x; codes[2 * t + 1] = v.y;
    }
  }
#pragma unroll
  for (int j = 0; j < kRowUnitGroups<V>; ++j) {
    const int gis = RowUnitGroup<V>(ui, j);
    sf[j] = load_sf(gis);
    valid[j] = slab * Tr::kGroupsPerSlab + gis < k_groups;
  }
}

// Runs convert(std::true_type) when any lane of the warp needs the second multiply (an e8m0 scale
// above kT, NaN included), else convert(std::false_type): the rare path is a copy of the loop, one
// uniform branch around it (inside the loop ptxas would issue the multiply predicated for every
// value).
template <class Convert>
__device__ __forceinline__ void WithSecondMultiplyIfAny(bool any_big, Convert&& convert) {
  if (__any_sync(0xFFFFFFFFu, any_big)) {
    convert(std::true_type{});
  } else {
    convert(std::false_type{});
  }
}

// Conversion of one operand row's 64-K unit ui of a slab (value x scale -> BF16, exact), shared by
// the B converter warpgroup and PreconvertKernel (A or B); the consumers' in-register A conversion
// produces the same values in WGMMA fragment layout instead. In (GatherRowUnit): the unit's codes
// (fp8: words codes[4t + s] of piece t; fp4: codes[2t + w]), the scale bytes of its groups
// (RowUnitGroup j in sf[j]) and whether each group lies within K. Out: the unit's eight 16-byte
// BF16 chunks in the consumers' K order, handed to store(chunk, x, y, z, w). The converter puts
// chunk c of row r at c ^ (r & 7) of the row (128B swizzle); PreconvertKernel writes it at c, and
// a 128B-swizzled TMA load of 128-byte rows puts it where the converter would.
// Must be called by whole warps (a vote picks the rare two-multiply path).
template <int V, class Store>
__device__ __forceinline__ void ConvertRowUnit(const uint32_t (&codes)[16], const uint32_t (&sf)[4], const bool (&valid)[4],
                                             Store&& store) {
  using Tr = VariantTraits<V>;
  if constexpr (!Tr::kFp4) {
    uint32_t m1[2], m2[2];
    bool any_big = false;
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      bool big;
      ScaleToMul<V>(sf[gi], valid[gi], m1[gi], m2[gi], big);
      any_big |= big;
    }
    WithSecondMultiplyIfAny(any_big, [&](auto two_multiplies) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t a0, a1;
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
  } else {
    uint32_t m1[4];
    bool any_big = false;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      uint32_t m2d;
      bool big;
      ScaleToMul<V>(sf[t], valid[t], m1[t], m2d, big);
      any_big |= big;
    }
    WithSecondMultiplyIfAny(any_big, [&](auto two_multiplies) {
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
  }
}

// An operand (codes x scales) -> BF16 in global memory, once per call, for the kPre GEMM kernels:
// row r of batch item l becomes units_per_row 128-byte units (unit u: K elements 64u..64u+63 in
// the consumers' order, see ConvertRowUnit; zeros past K), at output row r (B) or, for A, at the row
// of its 8-row group that the consumers' SS WGMMA reads as fragment row FragRow^-1(r % 8), so that
// the accumulators hold the same rows as with A converted in registers (the epilogue is shared).
// Units (l, r, u) are numbered u fastest and a warp takes 32 consecutive ones at a time, mostly 4 KB
// of consecutive output: they are staged in shared memory (chunks XOR-swizzled, conflict-free) and
// stored 16 bytes per lane, 512 bytes per instruction (stored straight from each thread, every
// instruction wrote 16 bytes into each of 32 lines: 144 us for B at 8192^3, ncu; staged: 54.5 us).
struct PreconvertParams {
  const uint8_t* codes;
  const uint8_t* sf;
  uint8_t* out;
  long long sf_batch_stride;
  long long row_bytes;  // bytes of K per row of codes
  int rows, l, units_per_row, k_groups, k_blocks;
  int units;            // l x rows x units_per_row (< 2^31: the host checks)
  int out_rows;         // rows per batch item of out: rows (B) or rows rounded up to 8 (A)
  int frag_order;       // 1: A (rows permuted within 8-row groups, as above)
};
__device__ __forceinline__ int FragOrderRow(int r) {  // the inverse of FragRow within an 8-row group
  return (r & ~7) | ((r & 3) << 1) | ((r >> 2) & 1);
}
// A unit's place: batch item l, row r, unit u of the row; Step moves it `by` units on (32-bit
// arithmetic and no division per step: the divisions were most of the pass's instructions).
struct UnitPos {
  int l, r, u;
  __device__ __forceinline__ UnitPos(int v, const PreconvertParams& q) {
    const int row_id = v / q.units_per_row;  // l * rows + r
    u = v - row_id * q.units_per_row;
    l = row_id / q.rows;
    r = row_id - l * q.rows;
  }
  __device__ __forceinline__ void Step(int by, const PreconvertParams& q) {
    for (u += by; u >= q.units_per_row; u -= q.units_per_row) {
      if (++r == q.rows) {
        r = 0;
        ++l;
      }
    }
  }
};
// Units per thread of PreconvertKernel, their loads issued together: the pass is latency-bound
// (one unit per thread: 24 cycles between a warp's instructions, a third of them waiting on L1TEX,
// 1.29 waves, 14.6 us for a 4096^2 B, ncu), so each thread keeps two units' loads in flight
// (13.9-14.0 us; four units need 128 registers and gain nothing more). At 8192^2 the
// pass moves its 203 MB at ~3.6 TB/s, the rate of a bare read-1-write-2 kernel on an H200 and
// within ~2% of a plain copy's (harness `ceiling`): the DRAM ceiling of its traffic.
// Other grid shapes (one unit per thread, 512 threads per CTA) and a grid-stride loop that loads
// the next unit before storing the current one read -3% to +2% of this at 8192^3 (the loop held to
// 64 registers spilled and lost 18%).
constexpr int kPreconvertUnitsPerThread = 2;
constexpr int kPreconvertThreads = 256;

// Loads unit v's codes and scale bytes (GatherRowUnit); past the last unit, every group is invalid
// (multiplier 0), so dead lanes still vote in ConvertRowUnit.
template <int V>
__device__ __forceinline__ void GatherPreconvertUnit(const PreconvertParams& q, long long v, uint32_t (&codes)[16],
                                                     uint32_t (&sf)[4], bool (&valid)[4]) {
  using Tr = VariantTraits<V>;
  const bool live = v < q.units;
  const UnitPos pos(live ? static_cast<int>(v) : 0, q);
  const int slab = pos.u / Tr::kUnitsPerSlab, ui = pos.u % Tr::kUnitsPerSlab;
  const uint8_t* src = q.codes + (static_cast<long long>(pos.l) * q.rows + pos.r) * q.row_bytes + slab * 128ll;
  const uint8_t* sfr = q.sf + pos.l * q.sf_batch_stride + static_cast<long long>(pos.r >> 7) * q.k_blocks * 512;
  const int k_groups = live ? q.k_groups : 0;
  GatherRowUnit<V>(
      ui, slab, k_groups,
      [&](int chunk, int half) {
        if (!live || slab * 128ll + 16 * chunk >= q.row_bytes) return make_uint4(0, 0, 0, 0);  // past K (rows are 16-byte multiples)
        if constexpr (!Tr::kFp4) {
          return __ldg(reinterpret_cast<const uint4*>(src + 16 * chunk));
        } else {
          const uint2 w = __ldg(reinterpret_cast<const uint2*>(src + 16 * chunk + 8 * half));
          return make_uint4(w.x, w.y, 0, 0);
        }
      },
      [&](int gis) {
        const int group = slab * Tr::kGroupsPerSlab + gis;
        return group < k_groups ? static_cast<uint32_t>(__ldg(sfr + (group >> 2) * 512 + SfInBlock(pos.r, group & 3))) : 0u;
      },
      codes, sf, valid);
}

template <int V>
__global__ void __launch_bounds__(kPreconvertThreads) PreconvertKernel(const PreconvertParams q) {
  // Lets the next kernel (the other pass, or the GEMM, whose producer waits for this grid before it
  // loads the BF16 operand(s)) launch as this one's programmatic dependent.
  asm volatile("griddepcontrol.launch_dependents;");
  constexpr int kU = kPreconvertUnitsPerThread;
  // This thread's units: first + kPreconvertThreads * h (a warp's 32 units consecutive each time).
  const long long first = static_cast<long long>(blockIdx.x) * (kPreconvertThreads * kU) + threadIdx.x;
  uint32_t codes[kU][16], sf[kU][4];
  bool valid[kU][4];
#pragma unroll
  for (int h = 0; h < kU; ++h) GatherPreconvertUnit<V>(q, first + kPreconvertThreads * h, codes[h], sf[h], valid[h]);
  __shared__ __align__(16) uint4 stage[kPreconvertThreads / 32][32 * 8];  // per warp: 32 units x 8 chunks
  const int lane = threadIdx.x & 31;
  uint4* ws = stage[threadIdx.x >> 5];
#pragma unroll
  for (int h = 0; h < kU; ++h) {
    if (h > 0) __syncwarp();  // the previous units' stores have read the stage
    ConvertRowUnit<V>(codes[h], sf[h], valid[h], [&](int chunk, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
      ws[lane * 8 + (chunk ^ (lane & 7))] = make_uint4(x, y, z, w);
    });
    __syncwarp();
    // Store pass r: 16-byte chunk c = 32r + lane of the warp's 4 KB, i.e. chunk c & 7 of the warp's
    // unit 4r + lane / 8 (unit v, in input order).
    const long long warp_first = first + kPreconvertThreads * h - lane;
    if (warp_first >= q.units) continue;
    int v = static_cast<int>(warp_first) + (lane >> 3);
    UnitPos at(min(v, q.units - 1), q);
#pragma unroll
    for (int r = 0; r < 8; ++r, v += 4) {
      if (v >= q.units) break;
      if (r > 0) at.Step(4, q);
      const int unit = 4 * r + (lane >> 3), c = lane & 7;
      const int out_r = q.frag_order ? FragOrderRow(at.r) : at.r;
      const long long dst = (static_cast<long long>(at.l) * q.out_rows + out_r) * q.units_per_row + at.u;
      reinterpret_cast<uint4*>(q.out)[dst * 8 + c] = ws[unit * 8 + (c ^ (unit & 7))];
    }
  }
  // Launched as a programmatic dependent (LaunchPreconvert), this grid may run beside the kernel
  // before it; it completes only after that one has, so whoever waits for this grid (the GEMM)
  // waits for every kernel of the launch before it. A no-op otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// kPre (kPreA | kPreB bits): tm_a / tm_b map PreconvertKernel's BF16 operand (128-byte units)
// instead of the codes; the producer loads it per unit into BF16 buffers. Pre-converted B: the
// converter warpgroup idles. Pre-converted A: the consumers run SS WGMMAs on the A buffers instead
// of converting A into registers.
template <int V, int MI, bool kSplitK, int kPre>
__global__ void __launch_bounds__(Roles<MI>::kThreads, 1)
    GemmAmaxKernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b, const KParams p) {
  using Tr = VariantTraits<V>;
  using S = Smem<V, MI, kPre>;
  constexpr bool kPreconvertedA = S::kPreconvertedA, kPreconvertedB = S::kPreconvertedB;
  constexpr int kAStages = S::kAStages;
  constexpr int kBM = S::kBM;
  constexpr int kRawStages = S::kRawStages;
  constexpr int kBStages = S::kBStages;
  constexpr int kUPS = Tr::kUnitsPerSlab;
  constexpr int kNSB = Tr::kScaleBlocksPerSlab;
  using R = Roles<MI>;
  constexpr int kCl = S::kClusterCTAs;
  constexpr int kAReaderCTAs = S::kPingPongTiles ? 2 : 1;  // CTAs whose consumers read an A' stage

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint32_t smem = (SmemAddr(smem_raw) + 1023u) & ~1023u;
  // Opaque to the compiler, so it keeps the base in a register instead of recomputing it from
  // %cluster_ctarank-derived state (S2UR + 4 uniform ops) in every loop iteration.
  asm volatile("" : "+r"(smem));
  const uint32_t bar_full_raw = smem + S::kOffBar;
  const uint32_t bar_empty_raw = bar_full_raw + 8 * kRawStages;
  const uint32_t bar_full_b = bar_empty_raw + 8 * kRawStages;
  const uint32_t bar_empty_b = bar_full_b + 8 * kBStages;
  const uint32_t bar_full_a = bar_empty_b + 8 * kBStages;  // pre-converted A only
  const uint32_t bar_empty_a = bar_full_a + 8 * kAStages;
  const uint32_t bar_order = bar_empty_a + 8 * kAStages;  // ping-pong: warpgroup w's turn, w = 0, 1
  const uint32_t bar_reset = bar_order + 16;  // ResetRound: amax and the split-K counters are zero

  // Broadcast from lane 0 so that ptxas can prove the role branches warp-uniform: WGMMA inside a
  // path it considers divergent gets serialized (a wait after every instruction, ptxas C7518).
  const int warp_idx = __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x / 32), 0);
  const int lane = threadIdx.x & 31;

  if (threadIdx.x == 0) {
    // Bring the TMA descriptors (kernel parameters) into the descriptor cache once, so that the
    // first loads do not wait for them.
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tm_b)) : "memory");
    for (int s = 0; s < kRawStages; ++s) {
      MbarInit(bar_full_raw + 8 * s, 1);
      // the warps that read the stage: consumers (A codes), converters (B codes)
      MbarInit(bar_empty_raw + 8 * s, (kPreconvertedA ? 0 : 8) + (kPreconvertedB ? 0 : 4 * R::kConverterWGs));
    }
    constexpr int kReaders = S::kPingPongTiles ? 4 : 8;  // consumer warps that read a stage
    for (int s = 0; s < kAStages; ++s) {
      MbarInit(bar_full_a + 8 * s, 1);  // the producer's arrive (+ TMA bytes)
      MbarInit(bar_empty_a + 8 * s, kReaders * kAReaderCTAs);
    }
    for (int s = 0; s < kBStages; ++s) {
      MbarInit(bar_full_b + 8 * s, kPreconvertedB ? 1 : 4);  // the producer's arrive (+ TMA bytes), or the converter warps
      MbarInit(bar_empty_b + 8 * s, kReaders);
    }
    if constexpr (S::kPingPongTiles) {
      MbarInit(bar_order, 1);
      MbarInit(bar_order + 8, 1);
      MbarArriveIf(bar_order, true);  // warpgroup 0's first main loop may start
    }
    MbarInit(bar_reset, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  ClusterSync<kCl>();  // the peers' barriers are initialized before any multicast or remote arrive
  const int rank = static_cast<int>(ClusterCtaRank<kCl>());
  const int cluster_id = blockIdx.x / kCl;
  const int num_clusters = gridDim.x / kCl;

  if (warp_idx < 4) {
    // ======================= WG0: producer (warps 0 and 1) =======================
    // A warpgroup of its own: issuing the copies must not delay the B conversion or the MMAs
    // (~2000 cycles per slab when a converter warp issued them).
    SetMaxNReg<R::kProducerRegs>();
    // Two issuing warps, each gated only by its own ring: warp 0 copies the raw stages (codes and
    // scales converted in this kernel), warp 1 the pre-converted BF16 units. One thread issuing both
    // waited for a free A' buffer (held until the consumers' MMAs on it retire) before it could
    // issue the next raw B slab, so B was prefetched only as deep as the A' ring (1.5 slabs).
    // 256x8192x8192 (harness): 520 -> 545 TF/s. The whole warp runs the loop and lane 0 issues:
    // with one lane in a divergent branch, ptxas kept the loop state in vector registers and spilled
    // them (24 per thread under setmaxnreg).
    const bool issues_raw = kRawStages > 0 && warp_idx == 0;
    const bool issues_pre = kPre != 0 && warp_idx == 1;
    const bool lane0 = threadIdx.x % 32 == 0;
    constexpr int kPartRows = kBM / kCl;  // rows of the A tile this CTA loads for all of the cluster
    constexpr int kBoxA = kPartRows < kBoxRows ? kPartRows : kBoxRows;  // as the host encodes
    constexpr int kBoxB = kBN < kBoxRows ? kBN : kBoxRows;
    if (issues_raw) {  // the codes (and scales) converted in this kernel
      int stage = 0, phase = 0;
      for (int u = cluster_id; u < p.units_total; u += num_clusters) {
        const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
        const TileCoord pc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
        const int my_nt = pc.nt * kCl + rank;
        for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
          MbarWait(bar_empty_raw + 8 * stage, phase ^ 1);
          if (lane0) {
            const uint32_t fb = bar_full_raw + 8 * stage;
            MbarArriveExpectTx(fb, S::kTxBytes);
            const uint32_t dst_a = smem + S::kOffRawA + stage * S::kRawA;
#pragma unroll
            for (int bx = 0; bx < kBM / kBoxA; ++bx) {
              if (kPreconvertedA) break;
              TmaLoad3D(dst_a + bx * kBoxA * 128, &tm_a, fb, slab * 128, pc.mt * kBM + bx * kBoxA, pc.l);
            }
#pragma unroll
            for (int bx = 0; bx < kBN / kBoxB; ++bx) {
              if (kPreconvertedB) break;
              TmaLoad3D(smem + S::kOffRawB + stage * S::kRawB + bx * kBoxB * 128, &tm_b, fb, slab * 128,
                        my_nt * kBN + bx * kBoxB, pc.l);
            }
            // Scale blocks: each 512 bytes = 128 rows x 4 groups, contiguous in the physical layout.
#pragma unroll
            for (int j = 0; j < kNSB; ++j) {
              const int kb4 = min(slab * kNSB + j, p.k_blocks - 1);
              if constexpr (!kPreconvertedA) {
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                  const int rb = min(pc.mt * MI + i, p.row_blocks_a - 1);
                  const uint8_t* src = p.sfa + pc.l * p.sfa_batch_stride + (static_cast<long long>(rb) * p.k_blocks + kb4) * 512;
                  BulkLoad(smem + S::kOffSfA + stage * S::kSfA + (i * kNSB + j) * 512, src, 512, fb);
                }
              }
              if constexpr (!kPreconvertedB) {
                const int rbb = min(my_nt, p.row_blocks_b - 1);
                const uint8_t* srcb = p.sfb + pc.l * p.sfb_batch_stride + (static_cast<long long>(rbb) * p.k_blocks + kb4) * 512;
                BulkLoad(smem + S::kOffSfB + stage * S::kSfB + j * 512, srcb, 512, fb);
              }
            }
          }
          if (++stage == kRawStages) { stage = 0; phase ^= 1; }
        }
      }
    } else if (issues_pre) {  // the slab's BF16 units, one buffer each (unit u: bytes 128u.. of a row)
      int a_stage = 0, a_phase = 0, b_stage = 0, b_phase = 0;
      // The pre-converted operands are PreconvertKernel's output, the grid this one depends on
      // (the raw operands are the call's inputs: their copies need not wait).
      WaitForPrecedingGrids();
      for (int u = cluster_id; u < p.units_total; u += num_clusters) {
        const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
        const TileCoord pc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
        const int my_nt = pc.nt * kCl + rank;
        for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
#pragma unroll 1
          for (int ui = 0; ui < kUPS; ++ui) {
            const int k_byte = (slab * kUPS + ui) * 128;
            if constexpr (kPreconvertedA) {
              MbarWait(bar_empty_a + 8 * a_stage, a_phase ^ 1);
              if (lane0) {
                const uint32_t fba = bar_full_a + 8 * a_stage;
                MbarArriveExpectTx(fba, S::kBufA);
                if constexpr (S::kPingPongTiles) {  // this CTA's half of the rows, into both CTAs
                  constexpr int kHalf = kBM / 2;
#pragma unroll
                  for (int bx = 0; bx < kHalf / kBoxA; ++bx) {
                    const int r0 = rank * kHalf + bx * kBoxA;
                    TmaLoad3DMulticast(smem + S::kOffBufA + a_stage * S::kBufA + r0 * 128, &tm_a, fba, k_byte,
                                       pc.mt * kBM + r0, pc.l, static_cast<uint16_t>(3));
                  }
                } else {
#pragma unroll
                  for (int bx = 0; bx < kBM / kBoxA; ++bx)
                    TmaLoad3D(smem + S::kOffBufA + a_stage * S::kBufA + bx * kBoxA * 128, &tm_a, fba, k_byte,
                              pc.mt * kBM + bx * kBoxA, pc.l);
                }
              }
              if (++a_stage == kAStages) { a_stage = 0; a_phase ^= 1; }
            }
            if constexpr (kPreconvertedB) {
              MbarWait(bar_empty_b + 8 * b_stage, b_phase ^ 1);
              if (lane0) {
                const uint32_t fbb = bar_full_b + 8 * b_stage;
                // A ping-pong cluster's second CTA past the last column (an odd count of column
                // tiles) loads no B': TMA's zero fill of a box wholly out of bounds is slow (it
                // cost the whole kernel 12-15% at 4096x1408x4096 and 3072x1920x4096).
                // Its MMAs read stale shared memory; the epilogue stores, and takes the amax of,
                // no column >= n.
                const bool past_n = kCl > 1 && my_nt * kBN >= p.n;
                MbarArriveExpectTx(fbb, past_n ? 0 : S::kBufB);
#pragma unroll
                for (int bx = 0; bx < (past_n ? 0 : kBN / kBoxB); ++bx)
                  TmaLoad3D(smem + S::kOffBufB + b_stage * S::kBufB + bx * kBoxB * 128, &tm_b, fbb, k_byte,
                            my_nt * kBN + bx * kBoxB, pc.l);
              }
              if (++b_stage == kBStages) { b_stage = 0; b_phase ^= 1; }
            }
          }
        }
      }
    } else if (warp_idx == 2) {  // a warp that issues no copies
      ResetRound(p, bar_reset, lane);
    }
  } else if (warp_idx < R::kFirstConsumerWarp) {
    // ======================= WG1 (and WG2 at MI = 1): B converters =======================
    SetMaxNReg<R::kConverterRegs>();
    if constexpr (!kPreconvertedB) {
      const int cw = warp_idx / 4 - 1;                   // converter cw takes units ui % kConverterWGs == cw
      const int n_local = threadIdx.x - 128 * (1 + cw);  // row of the B tile this thread converts
      int r_stage = 0, r_phase = 0, b_stage = 0, b_phase = 0;
      const int r7 = n_local & 7;
      for (int u = cluster_id; u < p.units_total; u += num_clusters) {
        const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
        for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
          // ---- convert the B slab, one 64-K unit (one bf16 buffer) at a time ----
          MbarWait(bar_full_raw + 8 * r_stage, r_phase);
          const uint32_t raw = smem + S::kOffRawB + r_stage * S::kRawB + n_local * 128;
          const uint32_t sfb = smem + S::kOffSfB + r_stage * S::kSfB + SfInBlock(n_local, 0);
#pragma unroll 1
          for (int ui = 0; ui < kUPS; ++ui) {
            if (R::kConverterWGs > 1 && ui % R::kConverterWGs != cw) {  // the other converter's unit
              if (++b_stage == kBStages) { b_stage = 0; b_phase ^= 1; }
              continue;
            }
            MbarWait(bar_empty_b + 8 * b_stage, b_phase ^ 1);
            const uint32_t dst = smem + S::kOffBufB + b_stage * S::kBufB + (n_local >> 3) * 1024 + r7 * 128;
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
            ConvertRowUnit<V>(codes, sf, valid, [&](int chunk, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
              Sts128(dst + ((chunk ^ r7) << 4), x, y, z, w);
            });
            FenceProxyAsync();
            __syncwarp();
            MbarArriveIf(bar_full_b + 8 * b_stage, lane == 0);
            if (++b_stage == kBStages) { b_stage = 0; b_phase ^= 1; }
          }
          // No ReleaseRawStage here: the proxy fence before the last unit's full_b arrive already
          // follows every read of this raw stage.
          __syncwarp();
          MbarArriveIf(bar_empty_raw + 8 * r_stage, lane == 0);
          if (++r_stage == kRawStages) { r_stage = 0; r_phase ^= 1; }
        }
      }
    }
  } else {
    // ======================= the last two warpgroups: consumers =======================
    SetMaxNReg<R::kConsumerRegs>();
    const int wg = (warp_idx - R::kFirstConsumerWarp) / 4;
    const int warp = warp_idx & 3;
    const int g = lane >> 2;
    const int t = lane & 3;
    int r_stage = 0, r_phase = 0, b_stage = 0, b_phase = 0;
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
    int a_stage = 0, a_phase = 0, inflight_a_stage = -1;  // the same for pre-converted A
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
    constexpr bool kPP = S::kPingPongTiles;
    const int units_per_tile = p.num_kslabs * kUPS;
    auto skip_units = [&](int n) {
      const int ai = a_stage + n, bi = b_stage + n;
      a_phase ^= (ai / kAStages) & 1;
      a_stage = ai % kAStages;
      b_phase ^= (bi / kBStages) & 1;
      b_stage = bi % kBStages;
    };
    int pp_turns = 0;  // ping-pong: this warpgroup's main loops so far (the order barrier's parity)
    if (kPP && wg == 1) skip_units(units_per_tile);
    for (int u = cluster_id + (kPP ? wg * num_clusters : 0); u < p.units_total; u += (kPP ? 2 : 1) * num_clusters) {
      const WorkUnit wu = DecodeUnit<kSplitK>(p, u);
      const TileCoord tc = DecodeTile<S::kRasterMTiles>(p, wu.tile);
      if constexpr (kPP) MbarWait(bar_order + 8 * wg, pp_turns & 1);  // the other warpgroup's main loop is issued
      if (tc.l != cur_l) {
        if (cur_l >= 0 && do_amax) FlushAmax(amax_run, p.amax, cur_l);
        amax_run = 0.0f;
        cur_l = tc.l;
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[mi][i] = 0.0f;

      for (int slab = wu.slab_lo; slab < wu.slab_hi; ++slab) {
        if constexpr (kPreconvertedA) {
          // A arrives as BF16 (PreconvertKernel): per unit, wait for its A and B buffers, issue the
          // SS WGMMAs of this warpgroup's 64-row blocks, retire the previous unit's group and hand
          // its buffers back. (The conversion path below is unreachable here.)
#pragma unroll 1
          for (int ui = 0; ui < kUPS; ++ui) {
            MbarWait(bar_full_a + 8 * a_stage, a_phase);
            MbarWait(bar_full_b + 8 * b_stage, b_phase);
            const uint64_t desc_b = SmemDesc128B(smem + S::kOffBufB + b_stage * S::kBufB);
            const uint32_t buf_a = smem + S::kOffBufA + a_stage * S::kBufA + (kPP ? 0 : wg * (64 * MI) * 128);
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
            MbarArriveClusterIf<kAReaderCTAs>(bar_empty_a + 8 * inflight_a_stage, lane == 0 && inflight_a_stage >= 0);
            MbarArriveIf(bar_empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
            inflight_a_stage = a_stage;
            inflight_b_stage = b_stage;
            if (++a_stage == kAStages) { a_stage = 0; a_phase ^= 1; }
            if (++b_stage == kBStages) { b_stage = 0; b_phase ^= 1; }
          }
          continue;
        }
        MbarWait(bar_full_raw + 8 * r_stage, r_phase);
        const uint32_t raw_a = smem + S::kOffRawA + r_stage * S::kRawA;
        const uint32_t sfa = smem + S::kOffSfA + r_stage * S::kSfA;
        // fp8: all four scale bytes of the slab of each of this thread's rows are one aligned word;
        // loaded once per slab, they are in registers long before the second unit needs them.
        uint32_t sf_words[MI][2] = {};
        if constexpr (!Tr::kFp4) {
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) sf_words[mi][rr] = Lds32(sfa + sf_row_off[mi][rr]);
        }
        constexpr int RW = Tr::kFp4 ? 2 : 4;
        // Units run as a real loop (two at a time when MI == 1, so that the fragment buffer index
        // stays a compile-time constant): fully unrolled, ptxas gives every step's fragments
        // registers of their own and runs out of them (wgmma serialization, C7511, for fp4).
        constexpr int kUnitUnroll = (MI == 2) ? 1 : 2;
#pragma unroll kUnitUnroll
        for (int ui = 0; ui < kUPS; ++ui) {
          const int gis = GroupInSlab<V>(ui, t);
          const bool gvalid = slab * Tr::kGroupsPerSlab + gis < p.k_groups;
          const uint64_t desc_b = SmemDesc128B(smem + S::kOffBufB + b_stage * S::kBufB);  // this unit's BF16 B
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
                rawv[mi][rr][0] = q.x; rawv[mi][rr][1] = q.y; rawv[mi][rr][RW - 2] = q.z; rawv[mi][rr][RW - 1] = q.w;
              } else {
                const uint2 q = Lds64(addr);
                rawv[mi][rr][0] = q.x; rawv[mi][rr][1] = q.y;
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
            uint32_t m1v[2], m2v[2];
            bool any_big;
            if constexpr (Tr::kScaleE4M3) {
#pragma unroll
              for (int rr = 0; rr < 2; ++rr) {
                bool big;
                ScaleToMul<V>(scale_byte(mi, rr), gvalid, m1v[rr], m2v[rr], big);
              }
              any_big = false;
            } else {
              // e8m0: one multiply unless a byte of this warp is above kT (rare: scale > 2^(127-O)).
              const uint32_t s0 = scale_byte(mi, 0), s1 = scale_byte(mi, 1);
              any_big = __any_sync(0xFFFFFFFFu, gvalid && max(s0, s1) > static_cast<uint32_t>(Tr::kT));
              if (!any_big) {
                m1v[0] = gvalid ? (s0 + Tr::kOD) * 0x00800080u : 0u;
                m1v[1] = gvalid ? (s1 + Tr::kOD) * 0x00800080u : 0u;
                m2v[0] = m2v[1] = 0x3F803F80u;
              } else {
                bool big;
                ScaleToMul<V>(s0, gvalid, m1v[0], m2v[0], big);
                ScaleToMul<V>(s1, gvalid, m1v[1], m2v[1], big);
              }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              uint32_t pr[4][2];  // [kstep][half]
              if constexpr (!Tr::kFp4) {
#pragma unroll
                for (int s = 0; s < 4; ++s) Fp8WordToRaw<V>(rawv[mi][rr][s], pr[s][0], pr[s][1]);
              } else {
#pragma unroll
                for (int w = 0; w < 2; ++w)
                  Fp4WordToRaw(rawv[mi][rr][w], pr[2 * w][0], pr[2 * w][1], pr[2 * w + 1][0], pr[2 * w + 1][1]);
              }
#pragma unroll
              for (int s = 0; s < 4; ++s)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) f[s][rr + 2 * hh] = MulBF16x2(pr[s][hh], m1v[rr]);
            }
            // Rare (an e8m0 scale above 2^(127-O), or NaN): a second multiplier. One uniform
            // branch around the block; per value, ptxas would issue it predicated every time.
            if (any_big) {
#pragma unroll
              for (int s = 0; s < 4; ++s)
#pragma unroll
                for (int r = 0; r < 4; ++r) f[s][r] = MulBF16x2(f[s][r], m2v[r & 1]);
            }
            // The slab's last step has consumed every value loaded from the raw stage: hand it back
            // (after the conversion, so that the fence finds no load of this thread in flight).
            if (ui == kUPS - 1 && mi == MI - 1) ReleaseRawStage(bar_empty_raw + 8 * r_stage, lane);
            if (mi == 0) MbarWait(bar_full_b + 8 * b_stage, b_phase);
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
              MbarArriveIf(bar_empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
            }
          }
          inflight_b_stage = b_stage;
          if (++b_stage == kBStages) { b_stage = 0; b_phase ^= 1; }
        }
        if (++r_stage == kRawStages) { r_stage = 0; r_phase ^= 1; }
      }
      if constexpr (kPP) {  // this tile's MMAs are issued: the other warpgroup's turn
        MbarArriveIf(bar_order + 8 * (wg ^ 1), threadIdx.x % 128 == 0);
        ++pp_turns;
      }
      // Drain the pipeline before the accumulators are read.
      WgmmaWait<0>();
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) FenceOperand(acc[mi]);
      keep_alive(frag[0]);
      keep_alive(frag[1]);
      __syncwarp();
      MbarArriveIf(bar_empty_b + 8 * inflight_b_stage, lane == 0 && inflight_b_stage >= 0);
      inflight_b_stage = -1;
      if constexpr (kPreconvertedA) {
        MbarArriveClusterIf<kAReaderCTAs>(bar_empty_a + 8 * inflight_a_stage, lane == 0 && inflight_a_stage >= 0);
        inflight_a_stage = -1;
      }

      MbarWait(bar_reset, 0);  // amax and the split-K counters are zero (ResetRound): before any atomic on them
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

      // ---- epilogue: one straight-line path per output dtype (switch once per tile) ----
      {
        const int row_w = tc.mt * kBM + (kPP ? 0 : wg * 64 * MI) + warp * 16;
        const int col_t = (tc.nt * kCl + rank) * kBN;
        const bool full = (tc.mt * kBM + kBM <= p.m) && (col_t + kBN <= p.n);
        const uint32_t stage = smem + S::kOffStage + (warp_idx - R::kFirstConsumerWarp) * kStageBytesPerWarp;
        auto epilogue = [&](auto ct) {
          Epilogue<decltype(ct)::value, MI, V>(acc, p, tc.l, row_w, col_t, full, stage, lane, amax_run);
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
      if constexpr (kPP) skip_units(units_per_tile);  // the other warpgroup's next tile
    }
    if (cur_l >= 0 && do_amax) FlushAmax(amax_run, p.amax, cur_l);
  }
  // No CTA may exit while a peer can still multicast into its shared memory or arrive on it.
  ClusterSync<kCl>();
}


}  // namespace sm90
}  // namespace jga
