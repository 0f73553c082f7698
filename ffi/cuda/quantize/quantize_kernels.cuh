// The quantize kernels (memory-bound; arithmetic in quantize_numerics.cuh):
//   * RowKernel, rowwise only: streaming, grid-stride; each thread owns 16 consecutive elements
//     of a row (16-byte loads, one 16- or 8-byte store of codes), an MX block of 32 is two
//     neighbouring lanes (one shuffle for its amax).
//   * TileKernel, columnwise (and the pair): a tile of kTileT rows x 128 columns of x goes through
//     shared memory as fp32; each thread quantizes one column's blocks along the rows (the
//     transposed output, one 16/32-byte store per block), and in the pair also blocks of rows,
//     one warp per block column (lane = tile row; float4 reads, conflict-free with the padding).
// Both write every scale byte of the physical layout (padding bytes 0, as physical_from_plain)
// and reduce amax per batch item into bits zeroed before the launch (unsigned max of |x| bits is
// the float max, NaN canonical above +Inf).
#pragma once

#include "cuda/quantize/quantize_numerics.cuh"

namespace jga::quantize {

constexpr int kRowThreads = 256;
constexpr int kTileThreads = 128;
constexpr int kTileD = 128;  // columns of x per tile (= threads)
constexpr int kTilePad = 4;  // floats of padding per tile row against bank conflicts

// Running max of one thread over the batch items it visits; flushed on every change of item.
struct AmaxAccumulator {
  int64_t item = -1;
  uint32_t bits = 0;
  __device__ __forceinline__ void Add(int64_t l, uint32_t b, unsigned* amax) {
    if (l != item) {
      if (item >= 0) atomicMax(amax + item, bits);
      item = l;
      bits = 0;
    }
    bits = max(bits, b);
  }
  // The whole block's flush: one atomic per run of warps on the same item.
  __device__ __forceinline__ void Flush(unsigned* amax) {
    __shared__ int64_t items[32];
    __shared__ uint32_t maxima[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t lead = __shfl_sync(0xFFFFFFFFu, item, 0);
    if (__all_sync(0xFFFFFFFFu, item == lead)) {
      const uint32_t m = __reduce_max_sync(0xFFFFFFFFu, bits);
      if (lane == 0) items[warp] = lead, maxima[warp] = m;
    } else {
      if (item >= 0) atomicMax(amax + item, bits);
      if (lane == 0) items[warp] = -1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t run = -1;
      uint32_t m = 0;
      for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (items[w] != run) {
          if (run >= 0) atomicMax(amax + run, m);
          run = items[w];
          m = 0;
        }
        m = max(m, maxima[w]);
      }
      if (run >= 0) atomicMax(amax + run, m);
    }
  }
};

// Zero scale bytes of one batch item: groups [groups, 4 * k_blocks) of row `row` (the last
// block's missing groups).
__device__ __forceinline__ void ZeroGroupPadding(uint8_t* s, int64_t row, int64_t groups, int64_t k_blocks) {
  for (int64_t g = groups; g < k_blocks * kScaleGroupsPerBlock; ++g) s[ScaleOffset(row, g, k_blocks)] = 0;
}

// Zero scale bytes of padded rows [rows, 128 * row_blocks) for every batch item, grid-stride.
// 32-bit index arithmetic: a 64-bit division is a subroutine call, whose register convention
// made ptxas spill around it.
__device__ __forceinline__ void ZeroRowPadding(uint8_t* s, int64_t batch, int64_t rows, int64_t k_blocks) {
  const int64_t row_blocks = CeilDiv(rows, kScaleRowsPerBlock);
  const uint32_t pad_rows = static_cast<uint32_t>(row_blocks * kScaleRowsPerBlock - rows);
  const uint32_t groups =
      static_cast<uint32_t>(k_blocks * kScaleGroupsPerBlock);  // pad_rows * groups < 2^32 below K = 2^29
  const int64_t stride = row_blocks * k_blocks * kScaleBlockElems;
  for (int64_t l = 0; l < batch; ++l) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < pad_rows * groups; i += gridDim.x * blockDim.x)
      s[l * stride + ScaleOffset(rows + i / groups, i % groups, k_blocks)] = 0;
  }
}

// 16 consecutive input elements as fp32 (16-byte loads that bypass L1: each is read once).
template <QuantizeInput I>
__device__ __forceinline__ void Load16(const typename InputTraits<I>::T* src, float* v) {
  using T = typename InputTraits<I>::T;
  constexpr int kPerVec = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < 16 / kPerVec; ++i) {
    FromVector<I>(__ldcs(reinterpret_cast<const uint4*>(src) + i), v + i * kPerVec);
  }
}

template <QuantizeFormat F>
__device__ __forceinline__ void StoreCodes16(uint8_t* dst, const float* v, float mul) {
  const uint2 a = Encode8<F>(v, mul), b = Encode8<F>(v + 8, mul);
  if constexpr (FormatTraits<F>::kFp4) {
    __stcs(reinterpret_cast<uint2*>(dst), make_uint2(a.x, b.x));
  } else {
    __stcs(reinterpret_cast<uint4*>(dst), make_uint4(a.x, a.y, b.x, b.y));
  }
}

template <QuantizeFormat F, QuantizeInput I>
__global__ void __launch_bounds__(kRowThreads)
    RowKernel(QuantizeProblem p, const typename InputTraits<I>::T* x, uint8_t* q, uint8_t* s, unsigned* amax) {
  constexpr int kLanesPerBlock = FormatTraits<F>::kVec / 16;
  const int64_t per_row = p.k / 16;  // chunks of 16 elements
  const int64_t groups = p.k / FormatTraits<F>::kVec, k_blocks = p.k_blocks(p.k);
  const int64_t scale_stride = p.row_blocks(p.rows) * k_blocks * kScaleBlockElems;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (kRowThreads / 32);
  const int64_t warp = blockIdx.x * int64_t(kRowThreads / 32) + (threadIdx.x >> 5);
  // Position (item l, row r, chunk c) of this lane's chunk, advanced by the grid stride without
  // divisions: stride = (dl items, dr rows, dc chunks).
  const int64_t stride = warps * 32;
  int64_t chunk = warp * 32 + lane;
  int64_t row_all = chunk / per_row, c = chunk % per_row;
  int64_t l = row_all / p.rows, r = row_all % p.rows;
  const int64_t stride_rows = stride / per_row, dc = stride % per_row;
  const int64_t dl = stride_rows / p.rows, dr = stride_rows % p.rows;
  AmaxAccumulator acc;
  // The loop runs while any lane of the warp has a chunk: all lanes take part in the shuffle.
  for (int64_t base = warp * 32; base < p.batch * p.rows * per_row; base += stride) {
    const bool valid = l < p.batch;
    float v[16];
    uint32_t m = 0;
    if (valid) {
      Load16<I>(x + ((l * p.rows + r) * per_row + c) * 16, v);
#pragma unroll
      for (int i = 0; i < 16; ++i) m = max(m, AbsBits(v[i]));
    }
    if constexpr (kLanesPerBlock == 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    if (valid) {
      acc.Add(l, AmaxBits(m), amax);
      const BlockScale bs = ScaleOf<F>(m);
      StoreCodes16<F>(q + p.code_bytes(((l * p.rows + r) * per_row + c) * 16), v, bs.mul);
      if (c % kLanesPerBlock == 0) {
        const int64_t g = c / kLanesPerBlock;
        uint8_t* sl = s + l * scale_stride;
        sl[ScaleOffset(r, g, k_blocks)] = bs.code;
        if (g == groups - 1) ZeroGroupPadding(sl, r, groups, k_blocks);
      }
    }
    c += dc;
    r += dr + (c >= per_row);
    if (c >= per_row) c -= per_row;
    l += dl + (r >= p.rows);
    if (r >= p.rows) r -= p.rows;
  }
  ZeroRowPadding(s, p.batch, p.rows, k_blocks);
  acc.Flush(amax);
}

// Codes of kVec scaled values into dst (kVec bytes for FP8, kVec / 2 for FP4).
template <QuantizeFormat F>
__device__ __forceinline__ void StoreBlock(uint8_t* dst, const float* v, float mul) {
  constexpr int kVec = FormatTraits<F>::kVec;
#pragma unroll
  for (int i = 0; i < kVec; i += 16) StoreCodes16<F>(dst + (FormatTraits<F>::kFp4 ? i / 2 : i), v + i, mul);
}

template <QuantizeFormat F, QuantizeInput I, bool kRows>
__global__ void __launch_bounds__(kTileThreads)
    TileKernel(QuantizeProblem p, const typename InputTraits<I>::T* x, uint8_t* q_row, uint8_t* s_row, uint8_t* q_col,
               uint8_t* s_col, unsigned* amax) {
  using T = typename InputTraits<I>::T;
  constexpr int kVec = FormatTraits<F>::kVec;
  // 32 (FP8) or 64 (FP4) rows: each column's codes per tile fill one 32-byte sector.
  constexpr int kTileT = FormatTraits<F>::kFp4 ? 64 : 32;
  constexpr int kPerVec = 16 / sizeof(T);
  constexpr int kStride = kTileD + kTilePad;
  __shared__ __align__(16) float tile[kTileT * kStride];

  const int64_t t_tiles = CeilDiv(p.rows, kTileT), d_tiles = CeilDiv(p.k, kTileD);
  const int64_t col_groups = p.rows / kVec, col_k_blocks = p.k_blocks(p.rows);
  const int64_t col_stride = p.row_blocks(p.k) * col_k_blocks * kScaleBlockElems;
  const int64_t row_groups = p.k / kVec, row_k_blocks = p.k_blocks(p.k);
  const int64_t row_stride = p.row_blocks(p.rows) * row_k_blocks * kScaleBlockElems;
  // 16-byte loads need 16-byte aligned rows of x (K * sizeof(T) a multiple of 16).
  const bool vector_rows = (p.k * int64_t(sizeof(T))) % 16 == 0;
  AmaxAccumulator acc;

  // Tile counts fit 32 bits (the launcher checks): 32-bit divisions, no subroutine calls.
  const uint32_t per_item = static_cast<uint32_t>(t_tiles * d_tiles), d_tiles32 = static_cast<uint32_t>(d_tiles);
  for (uint32_t tile_id = blockIdx.x; tile_id < p.batch * per_item; tile_id += gridDim.x) {
    const int64_t l = tile_id / per_item;
    const uint32_t rem = tile_id % per_item;
    const int64_t t0 = int64_t(rem / d_tiles32) * kTileT, d0 = int64_t(rem % d_tiles32) * kTileD;
    const T* xl = x + l * p.rows * p.k;
    // Load the tile as fp32; out-of-range elements read as 0 (never stored, amax unaffected).
    for (int i = threadIdx.x; i < kTileT * (kTileD / kPerVec); i += kTileThreads) {
      const int row = i / (kTileD / kPerVec), col = (i % (kTileD / kPerVec)) * kPerVec;
      const int64_t t = t0 + row, d = d0 + col;
      float v[kPerVec];
      if (t < p.rows && d + kPerVec <= p.k && vector_rows) {
        FromVector<I>(__ldcs(reinterpret_cast<const uint4*>(xl + t * p.k + d)), v);
      } else {
#pragma unroll
        for (int j = 0; j < kPerVec; ++j)
          v[j] = t < p.rows && d + j < p.k ? InputTraits<I>::ToFloat(xl[t * p.k + d + j]) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kPerVec; j += 4)
        *reinterpret_cast<float4*>(&tile[row * kStride + col + j]) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
    __syncthreads();

    // Columns: this thread's column d, blocks of kVec rows.
    const int64_t d = d0 + threadIdx.x;
    if (d < p.k) {
#pragma unroll 1
      for (int b = 0; b < kTileT / kVec; ++b) {
        const int64_t t = t0 + b * kVec;
        if (t >= p.rows) break;  // rows is a multiple of kVec: blocks are whole
        float v[kVec];
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          v[j] = tile[(b * kVec + j) * kStride + threadIdx.x];
          m = max(m, AbsBits(v[j]));
        }
        acc.Add(l, AmaxBits(m), amax);
        const BlockScale bs = ScaleOf<F>(m);
        StoreBlock<F>(q_col + (l * p.k + d) * p.code_bytes(p.rows) + p.code_bytes(t), v, bs.mul);
        const int64_t g = t / kVec;
        uint8_t* sl = s_col + l * col_stride;
        sl[ScaleOffset(d, g, col_k_blocks)] = bs.code;
        if (g == col_groups - 1) ZeroGroupPadding(sl, d, col_groups, col_k_blocks);
      }
    }

    if constexpr (kRows) {
      // Rows: item = (block column g, tile row); a warp's 32 items share g, one tile row per lane.
#pragma unroll 1
      for (int item = threadIdx.x; item < kTileT * (kTileD / kVec); item += kTileThreads) {
        const int g_local = item / kTileT, row = item % kTileT;
        const int64_t t = t0 + row, dstart = d0 + g_local * kVec;
        if (t >= p.rows || dstart >= p.k) continue;  // K is a multiple of kVec: blocks are whole
        float v[kVec];
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < kVec; j += 4) {
          const float4 f = *reinterpret_cast<const float4*>(&tile[row * kStride + g_local * kVec + j]);
          v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) m = max(m, AbsBits(v[j]));
        const BlockScale bs = ScaleOf<F>(m);  // amax: the column pass saw these elements
        StoreBlock<F>(q_row + (l * p.rows + t) * p.code_bytes(p.k) + p.code_bytes(dstart), v, bs.mul);
        const int64_t g = dstart / kVec;
        uint8_t* sl = s_row + l * row_stride;
        sl[ScaleOffset(t, g, row_k_blocks)] = bs.code;
        if (g == row_groups - 1) ZeroGroupPadding(sl, t, row_groups, row_k_blocks);
      }
    }
    __syncthreads();  // the next tile overwrites shared memory
  }
  ZeroRowPadding(s_col, p.batch, p.k, col_k_blocks);
  if constexpr (kRows) ZeroRowPadding(s_row, p.batch, p.rows, row_k_blocks);
  acc.Flush(amax);
}

}  // namespace jga::quantize
