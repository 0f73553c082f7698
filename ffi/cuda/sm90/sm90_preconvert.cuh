// The pre-conversion passes of the SM90 kernels: PreconvertKernel writes an operand as BF16, in
// the consumers' K order, into the workspace once per call, for the GEMM kernels that take that
// operand pre-converted (kPre).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/sm90_config.cuh"
#include "cuda/sm90/sm90_convert.cuh"

namespace jga {
namespace sm90 {

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
  unsigned int* bound;  // the min of the operand's ScaleBound (KParams::pre_bounds)
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
// within ~2% of a plain copy's (benchmarks/sm90_harness `ceiling`): the DRAM ceiling of its traffic.
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
        if (!live || slab * 128ll + 16 * chunk >= q.row_bytes)
          return make_uint4(0, 0, 0, 0);  // past K (rows are 16-byte multiples)
        if constexpr (!Tr::kFp4) {
          return __ldg(reinterpret_cast<const uint4*>(src + 16 * chunk));
        } else {
          const uint2 w = __ldg(reinterpret_cast<const uint2*>(src + 16 * chunk + 8 * half));
          return make_uint4(w.x, w.y, 0, 0);
        }
      },
      [&](int gis) {
        const int group = slab * Tr::kGroupsPerSlab + gis;
        return group < k_groups ? static_cast<uint32_t>(__ldg(sfr + (group >> 2) * 512 + SfInBlock(pos.r, group & 3)))
                                : 0u;
      },
      codes, sf, valid);
}

// Four CTAs per SM: 64 registers, no spills (left to itself ptxas gives the NaN/Inf rare path
// below 80, a quarter of the pass's occupancy).
template <int V>
__global__ void __launch_bounds__(kPreconvertThreads, 4) PreconvertKernel(const PreconvertParams q) {
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
  uint32_t redo = 0u;  // bit h: unit h of the warp's lanes holds an FP8 NaN/Inf code (warp-uniform)
#pragma unroll
  for (int h = 0; h < kU; ++h) {
    if (h > 0) __syncwarp();  // the previous units' stores have read the stage
    const auto store = [&](int chunk, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
      ws[lane * 8 + (chunk ^ (lane & 7))] = make_uint4(x, y, z, w);
    };
    // The unit's scale bound, where the rare path gives one below the common path's kSafeHalf
    // (PreBound takes the min with it): into the operand's word at once, holding no register.
    const auto bound = [&](uint32_t b) {
      if (lane == 0 && b < static_cast<uint32_t>(VariantTraits<V>::kSafeHalf)) atomicMin(q.bound, b);
    };
    if (ConvertRowUnit<V>(codes[h], sf[h], valid[h], store, bound)) redo |= 1u << h;
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
  if constexpr (!VariantTraits<V>::kFp4) {
    // The rare units again, carrying their NaN/Inf codes, each lane's own unit straight into the
    // output over what the store passes wrote (after them: __syncwarp). Loading the codes again
    // here, with every other unit's registers dead, keeps the pass at its register count.
#pragma unroll 1
    for (int h = 0; h < kU; ++h) {
      if (((redo >> h) & 1u) == 0u) continue;
      const long long v = first + kPreconvertThreads * h;
      uint32_t again[16], sf_again[4];
      bool valid_again[4];
      GatherPreconvertUnit<V>(q, v, again, sf_again, valid_again);
      __syncwarp();
      if (v >= q.units) continue;
      const UnitPos at(static_cast<int>(v), q);
      const int out_r = q.frag_order ? FragOrderRow(at.r) : at.r;
      uint32_t* const dst = reinterpret_cast<uint32_t*>(q.out) +
                            ((static_cast<long long>(at.l) * q.out_rows + out_r) * q.units_per_row + at.u) * 32;
      ConvertRowUnitSpecial<V>([&](int i) { return again[i]; }, sf_again, valid_again,
                               [&](int chunk, int j, uint32_t w) { dst[chunk * 4 + j] = w; });
    }
  }
  // Launched as a programmatic dependent (LaunchPreconvert), this grid may run beside the kernel
  // before it; it completes only after that one has, so whoever waits for this grid (the GEMM)
  // waits for every kernel of the launch before it. A no-op otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Weight-only problems: A's bfloat16 values -> A', the layout PreconvertKernel gives a converted
// A (the same units, K order, fragment-order rows), with no conversion: BF16 already holds them.
// FP4 variants multiply by 2^-kD, the offset both FP4 operands carry (exact for |a| >= 2^-118;
// below, a bf16 subnormal keeps what it can, as the tensor cores do for products that small).
// In ConvertRowUnit's K order, chunk c of unit u holds the pairs 2c, 2c + 1 of its four pieces t,
// piece t being 16 consecutive K values at k0(u) + kStride * t; so each thread makes one chunk from
// four 32-bit loads (a warp: four units, 32-byte segments) and one 16-byte store (a warp: 512
// contiguous bytes). q.codes is A, q.row_bytes = 2K; sf and bound are unused.
constexpr int kPreconvertValuesThreads = 256;
template <int V>
__global__ void __launch_bounds__(kPreconvertValuesThreads) PreconvertValuesKernel(const PreconvertParams q) {
  asm volatile("griddepcontrol.launch_dependents;");  // see PreconvertKernel
  using Tr = VariantTraits<V>;
  const long long i = static_cast<long long>(blockIdx.x) * kPreconvertValuesThreads + threadIdx.x;
  if (i < 8ll * q.units) {
    const int c = static_cast<int>(i & 7);
    const UnitPos pos(static_cast<int>(i >> 3), q);
    const long long k0 = Tr::kFp4 ? 256ll * (pos.u >> 2) + 128 * ((pos.u >> 1) & 1) + 16 * (pos.u & 1) : 64ll * pos.u;
    constexpr int kStride = Tr::kFp4 ? 32 : 16;
    const long long k_end = q.row_bytes / 2;
    const uint32_t* src =
        reinterpret_cast<const uint32_t*>(q.codes + (static_cast<long long>(pos.l) * q.rows + pos.r) * q.row_bytes);
    uint32_t w[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const long long k = k0 + kStride * t + 2 * c;  // even, and K is even: the pair lies within K or past it
      w[t] = k < k_end ? __ldg(src + k / 2) : 0u;
      if constexpr (Tr::kFp4) w[t] = MulBF16x2(w[t], ((127u - Tr::kD) << 7) * 0x10001u);
    }
    const long long dst = (static_cast<long long>(pos.l) * q.out_rows + FragOrderRow(pos.r)) * q.units_per_row + pos.u;
    reinterpret_cast<uint4*>(q.out)[dst * 8 + c] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // see PreconvertKernel
}

}  // namespace sm90
}  // namespace jga
