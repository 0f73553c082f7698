// Configuration of the SM90 kernels: the operand variants, the kernel parameters, the CTA's roles
// and register budgets, and the shared-memory layout of each kernel (see sm90_kernel.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jga {
namespace sm90 {

// Variants (operand type / scale type / scale vector size).
enum Variant : int { kV_E4M3 = 0, kV_E5M2 = 1, kV_MXFP4_32 = 2, kV_MXFP4_16 = 3, kV_NVFP4 = 4 };

template <int V>
struct VariantTraits {
  static constexpr bool kFp4 = (V >= kV_MXFP4_32);
  static constexpr bool kScaleE4M3 = (V == kV_NVFP4);
  static constexpr int kSfv = (V == kV_MXFP4_16 || V == kV_NVFP4) ? 16 : 32;
  // One raw stage ("slab") = 128 bytes of K per row: 128 fp8 or 256 fp4 elements.
  static constexpr int kKPerSlab = kFp4 ? 256 : 128;
  static constexpr int kGroupsPerSlab = kKPerSlab / kSfv;         // 4, 8 or 16
  static constexpr int kScaleBlocksPerSlab = kGroupsPerSlab / 4;  // 1, 2 or 4
  static constexpr int kUnitsPerSlab = kKPerSlab / 64;            // 64-K MMA units per slab: 2 or 4
  // Raw BF16 bits of a code are value * 2^-kO; fp4 operands get an extra 2^-kD.
  static constexpr int kO = (V == kV_E4M3) ? 120 : (V == kV_E5M2) ? 112 : 126;
  static constexpr int kD = kFp4 ? 8 : 0;
  static constexpr int kOD = kO - kD;                         // multiplier exponent field = s + kOD
  static constexpr int kT = 254 - kOD;                        // largest e8m0 byte handled by one multiply
  static constexpr float kAccScale = kFp4 ? 65536.0f : 1.0f;  // 2^(2D)
  // Where the BF16 path is exact for e8m0 scales (bytes s; 0xFF, NaN, is carried anyway). Per
  // element, code x scale must be a BF16 number: kSafeLo <= s <= kSafeHi for blocks holding a
  // nonzero code. Per product, the MMA's terms must stay fp32 normals: the smallest code products
  // (e4m3 2^-9 x 2^-9, e5m2 2^-16 x 2^-16, e2m1 2^-1 x 2^-1 with the FP4 offset 2^-2D) times the
  // two scales >= 2^-126, i.e. sa + sb >= kSafeSum. A tile that breaks either is computed again
  // on the CUDA cores (ExactAccumulators). e4m3 scales (NVFP4) are always exact here.
  static constexpr int kSafeLo = (V == kV_E5M2) ? 10 : 3;
  static constexpr int kSafeSum = (V == kV_E5M2) ? 160 : 146;
  static constexpr int kSafeHi = (V == kV_E4M3) ? 246 : (V == kV_E5M2) ? 239 : 254;
  // The conversions' common path takes bytes in [kSafeHalf, kT] only: two such bytes sum to
  // kSafeSum or more, so it needs no per-block bound; a warp holding any other byte takes the rare
  // path, which works out the exact bound (ScaleBound).
  static constexpr int kSafeHalf = (kSafeSum + 1) / 2;
};

struct KParams {
  int m, n, l;
  int k_groups;    // K / sfv
  int k_blocks;    // ceil(k_groups / 4): scale blocks along K
  int num_kslabs;  // ceil(K bytes / 64)
  int row_blocks_a, row_blocks_b;
  long long sfa_batch_stride, sfb_batch_stride;
  const uint8_t* sfa;
  const uint8_t* sfb;
  void* c;
  float* amax;
  int c_type;
  int c_aligned16;  // every C row starts 16-byte aligned: full tiles take the staged epilogue
  int flags;        // kFlagNoAmax: skip amax
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
  int split_slabs;  // K slabs of each non-reducing split; the reducer takes the rest (see DecodeUnit)
  int whole_tiles, split_tiles;
  int units_total;           // whole_tiles + split_tiles * splits
  unsigned int* tile_ready;  // [split_tiles]
  float* partials;           // [(splits - 1) * split_tiles][kBM * kBN] in the consumers' fragment order
  // The kernel zeroes amax and tile_ready itself (no kernel before it): CTA 0 writes the zeroes,
  // then every CTA arrives on one round of this word, and the consumers wait for the round to
  // complete before their first atomic (ResetRound). nullptr: nothing to zero (no amax, unsplit).
  unsigned int* reset_word;
  // For the exact path (ExactAccumulators): the operands' codes (l, rows, row_bytes), and the
  // pre-conversion passes' ScaleBound of B' ([0]) and A' ([1]) over the whole operand (nullptr:
  // no pass; 0xFFFFFFFF: no bound).
  const uint8_t* a;
  const uint8_t* b;
  long long row_bytes;
  const unsigned int* pre_bounds;
  // Weight-only problems (the kValuesA kernels): A holds bfloat16 values, a_row_bytes = 2K, no SFA.
  long long a_row_bytes;
};
// Words of a reset word's allocation (AllocResetWord): the round word, the passes' two bounds.
constexpr int kResetWords = 3;

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
// is L2-bound, 3-5% slower than the cooperative kernel's.
// kValuesA: A' kernels for weight-only problems, whose A' is a copy of A's bfloat16 values: their
// exact path reads those (ExactValuesElement); separate kernels, so that the block-scaled ones keep
// their registers and schedule.
constexpr int kPreB = 1, kPreA = 2, kPingPong = 4, kValuesA = 8;
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
  static constexpr bool kValuesInA = (kPre & kValuesA) != 0;
  static_assert(!kValuesInA || kPreconvertedA, "weight-only: A' kernels only");
  static_assert(!kPingPongTiles || (kPreconvertedA && kPreconvertedB && MI == 2),
                "ping-pong: A'B' tile 256 kernel only");
  static_assert(kPingPongTiles || !(kPreconvertedA && kPreconvertedB), "A'B': the ping-pong kernel only");
  static constexpr int kClusterCTAs = ClusterCTAs(kPre);
  static constexpr int kBM = TileRows(kPre, MI);
  // m-tiles per group of the tile raster (DecodeTile): 2048 rows at tile 256, in both kernels.
  static constexpr int kRasterMTiles = kPingPongTiles ? 16 : 8;
  static constexpr int kRawStages = (kPreconvertedA && kPreconvertedB) ? 0
                                    : kPreconvertedB                   ? 4
                                    : kPreconvertedA                   ? 3
                                                                       : (MI == 2 ? 3 : 4);
  static constexpr int kRawA = kPreconvertedA ? 0 : kBM * 128;
  static constexpr int kRawB = kPreconvertedB ? 0 : kBN * 128;
  static constexpr int kBufB = kBN * 128;                       // bf16 B of one 64-K unit: 128 rows x 128 bytes
  static constexpr int kBufA = kPreconvertedA ? kBM * 128 : 0;  // bf16 A of one 64-K unit
  static constexpr int kAStages = kPingPongTiles ? 6 : kPreconvertedA ? 3 : 0;
  static constexpr int kSfA = kPreconvertedA ? 0 : MI * Tr::kScaleBlocksPerSlab * 512;
  static constexpr int kSfB = kPreconvertedB ? 0 : Tr::kScaleBlocksPerSlab * 512;
  static constexpr int kRawBytes = kRawStages * (kRawA + kRawB + kSfA + kSfB);
  static constexpr int kFixedBytes = 1024 + 256 + 8 * kStageBytesPerWarp;  // alignment slack, barriers, epilogue
  static constexpr int kUsed = kRawBytes + kAStages * kBufA + kFixedBytes;
  static constexpr int kBStages = kPingPongTiles                                        ? kAStages
                                  : (kPreconvertedB && kUsed + 5 * kBufB <= 227 * 1024) ? 5
                                  : (kUsed + 4 * kBufB <= 227 * 1024)                   ? 4
                                                                                        : 3;
  static constexpr int kOffRawA = 0;
  static constexpr int kOffRawB = kOffRawA + kRawStages * kRawA;
  static constexpr int kOffBufB = kOffRawB + kRawStages * kRawB;
  static constexpr int kOffBufA = kOffBufB + kBStages * kBufB;
  static constexpr int kOffSfA = kOffBufA + kAStages * kBufA;
  static constexpr int kOffSfB = kOffSfA + kRawStages * kSfA;
  static constexpr int kOffBar = kOffSfB + kRawStages * kSfB;
  static constexpr int kNumBars =
      2 * (kRawStages + kBStages + kAStages) + 3;  // + the ping-pong order pair, the reset round
  // Per B stage, each converter warp's lower bound of its rows' ScaleBound (ConvertRowUnit).
  static constexpr int kOffFlagsB = (kOffBar + kNumBars * 8 + 15) / 16 * 16;
  static constexpr int kOffStage = (kOffFlagsB + (kPreconvertedB ? 0 : 16 * kBStages) + 127) / 128 *
                                   128;  // epilogue staging, 1 KB per consumer warp
  static constexpr int kBytes = kOffStage + 8 * kStageBytesPerWarp;
  static constexpr int kDynBytes = kBytes + 1024;  // slack for 1024-byte alignment
  static constexpr uint32_t kTxBytes = kRawA + kRawB + kSfA + kSfB;
  static_assert(kDynBytes <= 227 * 1024, "shared memory budget");
};

// The mbarriers of a CTA, laid out at Smem::kOffBar: full / empty pairs of each ring (raw stages,
// BF16 B buffers, pre-converted A buffers), the ping-pong order pair (warpgroup w's turn at
// order + 8w) and the zeroing round's (ResetRound).
template <class S>
struct Barriers {
  uint32_t full_raw, empty_raw, full_b, empty_b, full_a, empty_a, order, reset;
  __device__ __forceinline__ explicit Barriers(uint32_t smem)
      : full_raw(smem + S::kOffBar),
        empty_raw(full_raw + 8 * S::kRawStages),
        full_b(empty_raw + 8 * S::kRawStages),
        empty_b(full_b + 8 * S::kBStages),
        full_a(empty_b + 8 * S::kBStages),
        empty_a(full_a + 8 * S::kAStages),
        order(empty_a + 8 * S::kAStages),
        reset(order + 16) {}
};

// What every role of a CTA knows: the kernel's parameters, the (1024-byte aligned) base of the
// CTA's shared memory and its barriers, the CTA's rank in its cluster, the cluster's index and the
// number of clusters, the thread's warp (warp-uniform, see GemmAmaxKernel) and lane.
template <class S>
struct Cta {
  const KParams& p;
  uint32_t smem;
  Barriers<S> bar;
  int rank, cluster_id, num_clusters;
  int warp_idx, lane;
};

// A position in a ring of N stages: the stage and the parity of its mbarriers' current phase.
template <int N>
struct Ring {
  int stage = 0, phase = 0;
  __device__ __forceinline__ void Advance() {
    if (++stage == N) {
      stage = 0;
      phase ^= 1;
    }
  }
};

}  // namespace sm90
}  // namespace jga
