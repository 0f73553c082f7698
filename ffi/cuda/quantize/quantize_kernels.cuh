// The quantize kernels (memory-bound; arithmetic in quantize_numerics.cuh):
//   * RowKernel, rowwise only: streaming, grid-stride; a chunk is 16 consecutive elements of a
//     row (16-byte loads, one 16- or 8-byte store of codes) and an MX block of 32 is two
//     neighbouring lanes (one shuffle for its amax). Each thread loads kRowChunks chunks (128
//     bytes of input) before converting any, so that enough bytes are in flight to cover the
//     memory latency: with one chunk per load-convert-store round the kernel was latency-bound.
//   * TileKernel, columnwise only: tiles of kTileRows rows x 128 columns of x are copied into
//     shared memory with cp.async, double-buffered (the next tile lands while this one is
//     converted); each item quantizes one block of kVec rows of one or two columns (the
//     transposed output: a column's codes of a tile are 32-128 contiguous bytes).
//   * StripKernel, the pair: each thread holds a strip of 32 rows x 4 bytes of columns in
//     registers and quantizes its columns (one MX block each, the transposed output) and its
//     share of the rows (a row block spans 8-32 lanes of the warp).
// Measured on an H100 at 16384 x 8192 bf16 (bench_quantize.py, fraction of the copy rate), the
// strip kernel beats the tile kernel with a row pass for the pair (MXFP8 0.57 against 0.45-0.46)
// and loses to it on columns alone (MXFP8 0.54 against 0.57-0.58, NVFP4 0.29 against 0.46); not
// profiled, but a strip's loads are not overlapped with its own conversion, and the tile
// kernel's cp.async ring overlaps them.
// MXFP4 from bf16 encodes two elements per instruction in RowKernel and StripKernel
// (E2M1CodesBF16x2): MXFP4 rows went from 0.58 to 0.74 of the copy rate with it.
// Both write every scale byte of the physical layout (padding bytes 0, as physical_from_plain)
// and reduce amax per batch item into bits zeroed before the launch (unsigned max of |x| bits is
// the float max, NaN canonical above +Inf).
#pragma once

#include "cuda/common/ptx.cuh"
#include "cuda/quantize/quantize_numerics.cuh"

namespace jga::quantize {

constexpr int kRowThreads = 256;
constexpr int kRowChunks = 8;  // 16-byte vectors of input each thread loads per round (128 bytes)
constexpr int kTileThreads = 256;
constexpr int kTileD = 128;        // columns of x per tile
constexpr int kTileBytes = 32768;  // input bytes of a tile: 128 rows of 2-byte input, 64 of fp32
constexpr int kTilePad = 16;       // bytes of padding per shared-memory tile row (conflict-free reads)
constexpr int kStripThreads = 256;
constexpr int kStripRows = 32;  // rows of a strip: one MX block of each of its columns

// Rows of x per tile, and the shared-memory pitch of a tile row (bytes).
template <class T>
constexpr int kTileRows = kTileBytes / (kTileD * int(sizeof(T)));
template <class T>
constexpr int kTilePitch = kTileD * int(sizeof(T)) + kTilePad;
// Dynamic shared memory of a TileKernel: two tile buffers.
template <class T>
constexpr int kTileSmem = 2 * kTileRows<T> * kTilePitch<T>;

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

// Zeros the padding bytes of one orientation's scales (those physical_from_plain pads) for every
// batch item, grid-stride: the missing groups [groups, 4 * k_blocks) of rows [0, rows), then every
// group of the padded rows [rows, 128 * row_blocks). Kept out of the kernels' loops, where the
// branch on the last group cost registers. 32-bit index arithmetic (the counts are below 2^32 for
// K < 2^29): a 64-bit division is a subroutine call, whose register convention made ptxas spill.
__device__ __forceinline__ void ZeroScalePadding(uint8_t* s, int64_t batch, int64_t rows, int64_t groups,
                                                 int64_t k_blocks) {
  const int64_t row_blocks = CeilDiv(rows, kScaleRowsPerBlock);
  const uint32_t all = static_cast<uint32_t>(k_blocks * kScaleGroupsPerBlock);
  const uint32_t missing = all - static_cast<uint32_t>(groups);
  const uint32_t tail = static_cast<uint32_t>(rows) * missing;
  const uint32_t total = tail + static_cast<uint32_t>(row_blocks * kScaleRowsPerBlock - rows) * all;
  const int64_t stride = row_blocks * k_blocks * kScaleBlockElems;
  for (int64_t l = 0; l < batch; ++l) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
      int64_t row, g;
      if (i < tail) {
        row = i / missing, g = groups + i % missing;
      } else {
        row = rows + (i - tail) / all, g = (i - tail) % all;
      }
      s[l * stride + ScaleOffset(row, g, k_blocks)] = 0;
    }
  }
}

// A 16-byte vector of input as fp32 (4 or 8 elements).
template <QuantizeInput I>
constexpr int kPerVec = I == QuantizeInput::kF32 ? 4 : 8;

template <QuantizeFormat F>
__device__ __forceinline__ void StoreCodes16(uint8_t* dst, const float* v, float mul) {
  const uint2 a = Encode8<F>(v, mul), b = Encode8<F>(v + 8, mul);
  if constexpr (FormatTraits<F>::kFp4) {
    __stcs(reinterpret_cast<uint2*>(dst), make_uint2(a.x, b.x));
  } else {
    __stcs(reinterpret_cast<uint4*>(dst), make_uint4(a.x, a.y, b.x, b.y));
  }
}

// Position of a lane's chunk in (batch item, row of the item, chunk of the row), advanced by a
// fixed number of chunks without divisions.
struct ChunkPos {
  int64_t l, r, c;
  __device__ __forceinline__ void Advance(int64_t dl, int64_t dr, int64_t dc, int64_t per_row, int64_t rows) {
    c += dc;
    r += dr + (c >= per_row);
    if (c >= per_row) c -= per_row;
    l += dl + (r >= rows);
    if (r >= rows) r -= rows;
  }
};

template <QuantizeFormat F, QuantizeInput I>
__global__ void __launch_bounds__(kRowThreads)
    RowKernel(QuantizeProblem p, const typename InputTraits<I>::T* x, uint8_t* q, uint8_t* s, unsigned* amax) {
  constexpr int kLanesPerBlock = FormatTraits<F>::kVec / 16;
  constexpr int kVecs = 16 / kPerVec<I>;  // 16-byte vectors per chunk of 16 elements
  constexpr int kU = kRowChunks / kVecs;  // chunks per lane and round (32 apart)
  const int64_t per_row = p.k / 16;       // chunks of 16 elements
  const int64_t groups = p.k / FormatTraits<F>::kVec, k_blocks = p.k_blocks(p.k);
  const int64_t scale_stride = p.row_blocks(p.rows) * k_blocks * kScaleBlockElems;
  const int64_t total = p.batch * p.rows * per_row;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (kRowThreads / 32);
  const int64_t warp = blockIdx.x * int64_t(kRowThreads / 32) + (threadIdx.x >> 5);
  // A round of a warp covers kU * 32 consecutive chunks; rounds are `warps` apart. Steps of the
  // chunk position: 32 chunks (the next u), and from the round's last u to the next round's first.
  const int64_t round = kU * 32, stride = warps * round;
  auto split = [&](int64_t n, int64_t& dl, int64_t& dr, int64_t& dc) {
    const int64_t rows_all = n / per_row;
    dc = n % per_row, dl = rows_all / p.rows, dr = rows_all % p.rows;
  };
  int64_t dl32, dr32, dc32, dlr, drr, dcr;
  split(32, dl32, dr32, dc32);
  split(stride - (kU - 1) * 32, dlr, drr, dcr);
  ChunkPos pos;
  split(warp * round + lane, pos.l, pos.r, pos.c);
  AmaxAccumulator acc;
  // The loop runs while any lane of the warp has a chunk: all lanes take part in the shuffle.
  for (int64_t base = warp * round; base < total; base += stride) {
    uint4 raw[kU][kVecs];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t chunk = base + u * 32 + lane;
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
        raw[u][i] = chunk < total ? __ldcs(reinterpret_cast<const uint4*>(x + chunk * 16) + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t chunk = base + u * 32 + lane;
      const bool valid = chunk < total;
      float v[16];
#pragma unroll
      for (int i = 0; i < kVecs; ++i) FromVector<I>(raw[u][i], v + i * kPerVec<I>);
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 16; ++i) m = max(m, AbsBits(v[i]));
      if constexpr (kLanesPerBlock == 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
      if (valid) {
        acc.Add(pos.l, AmaxBits(m), amax);
        const BlockScale bs = ScaleOf<F>(m);
        if constexpr (F == QuantizeFormat::kMxfp4 && I == QuantizeInput::kBF16) {  // E2M1CodesBF16x2
          const uint32_t mul2 = BF16x2Pow2(bs.mul);
          const uint4 a = raw[u][0], b = raw[u][1];
          const uint32_t lo = __byte_perm(E2M1Codes4BF16(a.x, a.y, mul2), E2M1Codes4BF16(a.z, a.w, mul2), 0x5410u);
          const uint32_t hi = __byte_perm(E2M1Codes4BF16(b.x, b.y, mul2), E2M1Codes4BF16(b.z, b.w, mul2), 0x5410u);
          __stcs(reinterpret_cast<uint2*>(q + p.code_bytes(chunk * 16)), make_uint2(lo, hi));
        } else {
          StoreCodes16<F>(q + p.code_bytes(chunk * 16), v, bs.mul);
        }
        if (pos.c % kLanesPerBlock == 0) {
          const int64_t g = pos.c / kLanesPerBlock;
          uint8_t* sl = s + pos.l * scale_stride;
          sl[ScaleOffset(pos.r, g, k_blocks)] = bs.code;
        }
      }
      if (u + 1 < kU) pos.Advance(dl32, dr32, dc32, per_row, p.rows);
    }
    pos.Advance(dlr, drr, dcr, per_row, p.rows);
  }
  ZeroScalePadding(s, p.batch, p.rows, groups, k_blocks);
  acc.Flush(amax);
}

// Codes of kVec scaled values into dst (kVec bytes for FP8, kVec / 2 for FP4).
template <QuantizeFormat F>
__device__ __forceinline__ void StoreBlock(uint8_t* dst, const float* v, float mul) {
  constexpr int kVec = FormatTraits<F>::kVec;
#pragma unroll
  for (int i = 0; i < kVec; i += 16) StoreCodes16<F>(dst + (FormatTraits<F>::kFp4 ? i / 2 : i), v + i, mul);
}

// The low kBytes bytes of `bits` to global memory, streaming.
template <int kBytes>
__device__ __forceinline__ void StoreBits(uint8_t* dst, uint32_t bits) {
  if constexpr (kBytes == 4) {
    __stcs(reinterpret_cast<unsigned int*>(dst), bits);
  } else if constexpr (kBytes == 2) {
    __stcs(reinterpret_cast<unsigned short*>(dst), static_cast<unsigned short>(bits));
  } else {
    static_assert(kBytes == 1, "1, 2 or 4 bytes");
    __stcs(reinterpret_cast<unsigned char*>(dst), static_cast<unsigned char>(bits));
  }
}

// Copies tile (l, t0, d0) of x into the tile buffer at shared address `buf` (rows kTileRows,
// pitch kTilePitch): 16-byte cp.async chunks where x's rows are 16-byte aligned (elements past
// R or K zero-filled), element by element otherwise (then complete when this returns).
template <QuantizeInput I>
__device__ __forceinline__ void LoadTile(const QuantizeProblem& p, const typename InputTraits<I>::T* xl, int64_t t0,
                                         int64_t d0, bool vector_rows, uint8_t* buf) {
  using T = typename InputTraits<I>::T;
  constexpr int kRows = kTileRows<T>, kPitch = kTilePitch<T>, kChunksPerRow = kTileD * int(sizeof(T)) / 16;
  if (vector_rows) {  // K * sizeof(T) % 16 == 0: every 16-byte chunk lies wholly inside or outside K
    // Thread i copies chunk i % kChunksPerRow of rows i / kChunksPerRow + j * kRowStep.
    constexpr int kRowStep = kTileThreads / kChunksPerRow;
    static_assert(kTileThreads % kChunksPerRow == 0 && kRows % kRowStep == 0, "whole rounds of copies");
    const int row0 = threadIdx.x / kChunksPerRow, ch = threadIdx.x % kChunksPerRow;
    const int64_t d = d0 + ch * (16 / int(sizeof(T)));
    const T* src = xl + (t0 + row0) * p.k + d;
    const uint32_t dst = SmemAddr(buf) + row0 * kPitch + ch * 16;
#pragma unroll
    for (int j = 0; j < kRows / kRowStep; ++j) {
      const bool in_range = t0 + row0 + j * kRowStep < p.rows && d < p.k;
      CpAsync16(dst + j * kRowStep * kPitch, in_range ? src + j * kRowStep * p.k : xl, in_range ? 16u : 0u);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kTileD; i += kTileThreads) {
      const int row = i / kTileD, col = i % kTileD;
      const int64_t t = t0 + row, d = d0 + col;
      reinterpret_cast<T*>(buf + row * kPitch)[col] = t < p.rows && d < p.k ? xl[t * p.k + d] : T(0.0f);
    }
  }
}

template <QuantizeFormat F, QuantizeInput I>
__global__ void __launch_bounds__(kTileThreads, 1)  // without the 1, ptxas spilled the FP8 kernels
    TileKernel(QuantizeProblem p, const typename InputTraits<I>::T* x, uint8_t* q_col, uint8_t* s_col, unsigned* amax) {
  using T = typename InputTraits<I>::T;
  constexpr int kVec = FormatTraits<F>::kVec;
  constexpr int kTileT = kTileRows<T>;
  constexpr int kPitch = kTilePitch<T>;
  // Column items: one block of kVec rows of the kColsPerItem adjacent columns that one 32-bit
  // word of a tile row holds (two of 2-byte input, one of fp32: 256 items of 32-row blocks cover
  // a tile), read a word per row.
  constexpr int kColsPerItem = 4 / int(sizeof(T));
  constexpr int kColItems = (kTileD / kColsPerItem) * (kTileT / kVec);
  extern __shared__ __align__(16) uint8_t tiles[];

  const int64_t t_tiles = CeilDiv(p.rows, kTileT), d_tiles = CeilDiv(p.k, kTileD);
  const int64_t col_groups = p.rows / kVec, col_k_blocks = p.k_blocks(p.rows);
  const int64_t col_stride = p.row_blocks(p.k) * col_k_blocks * kScaleBlockElems;
  const bool vector_rows = (p.k * int64_t(sizeof(T))) % 16 == 0;
  AmaxAccumulator acc;

  // Tile counts fit 32 bits (the launcher checks): 32-bit divisions, no subroutine calls.
  const uint32_t per_item = static_cast<uint32_t>(t_tiles * d_tiles), d_tiles32 = static_cast<uint32_t>(d_tiles);
  const uint32_t tiles_total = static_cast<uint32_t>(p.batch) * per_item;
  auto issue = [&](uint32_t tile_id, uint8_t* buf) {
    const int64_t l = tile_id / per_item;
    const uint32_t rem = tile_id % per_item;
    LoadTile<I>(p, x + l * p.rows * p.k, int64_t(rem / d_tiles32) * kTileT, int64_t(rem % d_tiles32) * kTileD,
                vector_rows, buf);
  };
  if (blockIdx.x < tiles_total) issue(blockIdx.x, tiles);
  CpAsyncCommit();
  int parity = 0;
  for (uint32_t tile_id = blockIdx.x; tile_id < tiles_total; tile_id += gridDim.x, parity ^= 1) {
    // The next tile lands in the other buffer while this one is converted.
    const uint32_t next = tile_id + gridDim.x;
    if (next < tiles_total) issue(next, tiles + (parity ^ 1) * kTileT * kPitch);
    CpAsyncCommit();
    CpAsyncWait<1>();  // this thread's copies of the current tile have landed
    __syncthreads();   // everyone's have
    const uint8_t* buf = tiles + parity * kTileT * kPitch;
    const int64_t l = tile_id / per_item;
    const uint32_t rem = tile_id % per_item;
    const int64_t t0 = int64_t(rem / d_tiles32) * kTileT, d0 = int64_t(rem % d_tiles32) * kTileD;

    // Columns: blocks of kVec rows, one or two columns per item (the transposed output).
#pragma unroll 1
    for (int item = threadIdx.x; item < kColItems; item += kTileThreads) {
      const int cl = (item % (kTileD / kColsPerItem)) * kColsPerItem, b = item / (kTileD / kColsPerItem);
      const int64_t t = t0 + b * kVec;
      if (t >= p.rows) continue;  // rows is a multiple of kVec: blocks are whole
      uint32_t words[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        words[e] = *reinterpret_cast<const uint32_t*>(buf + (b * kVec + e) * kPitch + cl * int(sizeof(T)));
#pragma unroll
      for (int j = 0; j < kColsPerItem; ++j) {
        const int64_t d = d0 + cl + j;
        if (d >= p.k) break;
        float v[kVec];
        uint32_t m = 0;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          v[e] = InputTraits<I>::FromBits(words[e], j);
          m = max(m, AbsBits(v[e]));
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
    __syncthreads();  // the buffer is read before the copy after next overwrites it
  }
  ZeroRowPadding(s_col, p.batch, p.k, col_k_blocks);
  acc.Flush(amax);
}

// Elements of a strip row: one 32-bit word (2 of 2-byte input, 1 of fp32).
template <QuantizeInput I>
constexpr int kStripCols = I == QuantizeInput::kF32 ? 1 : 2;

// Loads one strip: `rows` rows (0 past K) from xs, K's pitch apart, zeros below them. K is a
// multiple of the block size, so a row's 4-byte word lies wholly inside or past K.
template <QuantizeInput I>
__device__ __forceinline__ void LoadStrip(const QuantizeProblem& p, const typename InputTraits<I>::T* xs, int rows,
                                          uint32_t (&raw)[kStripRows]) {
  const unsigned int* src = reinterpret_cast<const unsigned int*>(xs);
  const int64_t pitch = p.k * int64_t(sizeof(typename InputTraits<I>::T)) / 4;  // words per row
#pragma unroll
  for (int r = 0; r < kStripRows; ++r, src += pitch) raw[r] = r < rows ? __ldcs(src) : 0u;
}

// The pair's rows are quantized a slice of strip rows at a time (fewer registers): 16 rows, or one
// per lane where a row block spans the whole warp (fp32 MX).
template <int P>
constexpr int kRowSlice = P < 16 ? 16 : P;

// Max over the P lanes of a row block, transposed: on entry m[r] is this lane's max of slice row r;
// on return m[i], i < S / P, is the row block's max of row (lane % P) * (S / P) + i. Each step
// trades half of the rows with the lane H apart: S - S / P shuffles in all, not log2(P) per row.
// Call with H = P / 2, N = S.
template <int H, int N, int S>
__device__ __forceinline__ void TransposeMax(uint32_t (&m)[S], int lane) {
  if constexpr (H >= 1) {
    const bool upper = lane & H;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint32_t lo = m[i], hi = m[i + N / 2];
      m[i] = max(upper ? hi : lo, __shfl_xor_sync(0xFFFFFFFFu, upper ? lo : hi, H));
    }
    TransposeMax<H / 2, N / 2>(m, lane);
  }
}

// The pair (both orientations from one read). A thread quantizes one strip of x at a time:
// kStripRows rows of kStripCols adjacent columns, one 4-byte load per row, all in registers; a
// warp's strips are side by side, so each of its loads reads 128 contiguous bytes, and a warp's 32
// loads are in flight together. The strip's columns are one MX block (two NVFP4 blocks) each: their
// amax, scale and codes (32 contiguous bytes of the transposed output, FP4 16) need no other
// thread. The rows: a row block spans P = kVec / kStripCols lanes, whose maxima TransposeMax
// combines; each lane then takes the scales of 1 / P of a slice's rows and hands their multipliers
// to the block's other lanes by one shuffle per row. No shared memory and no barriers: TileKernel
// with a row pass reached 0.45 of the copy rate for the MXFP8 pair on an H100, this kernel 0.57;
// with 8-byte loads per row (twice the columns) a thread needed over 200 registers; a
// prefetch.global.L2 of the warp's unit after next lowered the MXFP8 pair to 0.52.
template <QuantizeFormat F, QuantizeInput I>
__global__ void __launch_bounds__(kStripThreads, 2)
    StripKernel(QuantizeProblem p, const typename InputTraits<I>::T* x, uint8_t* q_row, uint8_t* s_row, uint8_t* q_col,
                uint8_t* s_col, unsigned* amax) {
  using IT = InputTraits<I>;
  constexpr int kVec = FormatTraits<F>::kVec;
  constexpr int kCols = kStripCols<I>, kWarpCols = 32 * kCols;
  constexpr int kBlocks = kStripRows / kVec;  // column blocks per strip
  // MXFP4 from bf16: two elements per instruction (E2M1CodesBF16x2).
  constexpr bool kPackedE2M1 = F == QuantizeFormat::kMxfp4 && I == QuantizeInput::kBF16;
  const int64_t col_groups = p.rows / kVec, col_k_blocks = p.k_blocks(p.rows);
  const int64_t col_stride = p.row_blocks(p.k) * col_k_blocks * kScaleBlockElems;
  const int64_t row_groups = p.k / kVec, row_k_blocks = p.k_blocks(p.k);
  const int64_t row_stride = p.row_blocks(p.rows) * row_k_blocks * kScaleBlockElems;
  const int lane = threadIdx.x & 31;
  AmaxAccumulator acc;

  // Strip counts fit 32 bits (the launcher checks): 32-bit divisions, no subroutine calls.
  const uint32_t warp_cols = static_cast<uint32_t>(CeilDiv(p.k, kWarpCols));
  const uint32_t per_item = static_cast<uint32_t>(CeilDiv(p.rows, kStripRows)) * warp_cols;
  const uint32_t units = static_cast<uint32_t>(p.batch) * per_item;
  constexpr uint32_t kWarps = kStripThreads / 32;
  // One unit (32 strips side by side) per warp and round; consecutive warps walk along K.
  for (uint32_t unit = blockIdx.x * kWarps + (threadIdx.x >> 5); unit < units; unit += gridDim.x * kWarps) {
    const int64_t l = unit / per_item;
    const uint32_t rem = unit % per_item;
    const int64_t t0 = int64_t(rem / warp_cols) * kStripRows;
    const int64_t d0 = int64_t(rem % warp_cols) * kWarpCols + lane * kCols;
    // Rows of the strip inside R, 0 where its columns are past K: every load and store is
    // predicated on one 32-bit comparison with it.
    const int rows = d0 < p.k ? static_cast<int>(min(int64_t(kStripRows), p.rows - t0)) : 0;
    uint32_t raw[kStripRows];
    LoadStrip<I>(p, x + (l * p.rows + t0) * p.k + d0, rows, raw);

    // Columns: per block, the word's max |x| (both columns at once for 2-byte input).
    uint32_t cmax[kBlocks] = {};
#pragma unroll
    for (int r = 0; r < kStripRows; ++r) cmax[r / kVec] = IT::MaxWord(cmax[r / kVec], IT::AbsWord(raw[r]));
    uint8_t* scl = s_col + l * col_stride;
    if constexpr (kPackedE2M1) {  // both columns at once, a row's word per step
      const bool second = d0 + 1 < p.k;
      const BlockScale b0 = ScaleOf<F>(IT::AbsBitsOf(cmax[0], 0)), b1 = ScaleOf<F>(IT::AbsBitsOf(cmax[0], 1));
      if (rows > 0) {
        acc.Add(l, AmaxBits(IT::AbsBitsOf(cmax[0], 0)), amax);
        acc.Add(l, AmaxBits(IT::AbsBitsOf(cmax[0], 1)), amax);
      }
      const uint32_t mul2 = (__float_as_uint(b0.mul) >> 16) | (__float_as_uint(b1.mul) & 0xFFFF0000u);
      uint32_t out0[4], out1[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // 8 rows: a word of codes of each column
        uint32_t pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          pr[i] = E2M1CodesBF16x2(raw[8 * q + 2 * i], mul2) | E2M1CodesBF16x2(raw[8 * q + 2 * i + 1], mul2) << 4;
        const uint32_t lo = __byte_perm(pr[0], pr[1], 0x6240u), hi = __byte_perm(pr[2], pr[3], 0x6240u);
        out0[q] = __byte_perm(lo, hi, 0x5410u);
        out1[q] = __byte_perm(lo, hi, 0x7632u);
      }
      if (rows > 0) {
        uint8_t* q0 = q_col + (l * p.k + d0) * p.code_bytes(p.rows) + p.code_bytes(t0);
        __stcs(reinterpret_cast<uint4*>(q0), make_uint4(out0[0], out0[1], out0[2], out0[3]));
        scl[ScaleOffset(d0, t0 / kVec, col_k_blocks)] = b0.code;
        if (second) {
          __stcs(reinterpret_cast<uint4*>(q0 + p.code_bytes(p.rows)), make_uint4(out1[0], out1[1], out1[2], out1[3]));
          scl[ScaleOffset(d0 + 1, t0 / kVec, col_k_blocks)] = b1.code;
        }
      }
    } else {
      // One column at a time: unrolled, the compiler interleaves both and needs ~50 more registers.
#pragma unroll 1
      for (int j = 0; j < kCols; ++j) {
        const int64_t d = d0 + j;
        if (d >= p.k) break;
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          const int64_t t = t0 + b * kVec;
          if (t >= p.rows) break;  // rows is a multiple of kVec: blocks are whole
          const uint32_t m = IT::AbsBitsOf(cmax[b], j);
          acc.Add(l, AmaxBits(m), amax);
          const BlockScale bs = ScaleOf<F>(m);
          float v[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) v[e] = IT::FromBits(raw[b * kVec + e], j);
          StoreBlock<F>(q_col + (l * p.k + d) * p.code_bytes(p.rows) + p.code_bytes(t), v, bs.mul);
          const int64_t g = t / kVec;
          scl[ScaleOffset(d, g, col_k_blocks)] = bs.code;
        }
      }
    }

    {  // The rows.
      constexpr int P = kVec / kCols, S = kRowSlice<P>, kRowsPerLane = S / P;
      // The row block: K is a multiple of kVec, so a block lies inside K or past it, with d0.
      const int64_t g = (d0 - (lane % P) * kCols) / kVec;
      uint8_t* srl = s_row + l * row_stride;
      const int64_t row_bytes = p.code_bytes(p.k);
      uint8_t* qr = q_row + (l * p.rows + t0) * row_bytes + p.code_bytes(d0);  // advanced a row at a time
#pragma unroll
      for (int r0 = 0; r0 < kStripRows; r0 += S) {
        uint32_t rmax[S];
#pragma unroll
        for (int r = 0; r < S; ++r) {
          const uint32_t m = IT::AbsWord(raw[r0 + r]);
          // The row's max |x| (2-byte input: in both halves, which order as the max does).
          rmax[r] = kCols == 2 ? __vmaxu2(m, __byte_perm(m, 0u, 0x1032u)) : m;
        }
        TransposeMax<P / 2, S>(rmax, lane);
        float mul[kRowsPerLane];
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          const int r = r0 + (lane % P) * kRowsPerLane + i;
          const BlockScale bs = ScaleOf<F>(IT::AbsBitsOf(rmax[i], 0));
          mul[i] = bs.mul;
          if (r < rows) srl[ScaleOffset(t0 + r, g, row_k_blocks)] = bs.code;  // the block is inside K with d0
        }
        // No early exit from this loop: its shuffles need the whole warp, and a compiler that
        // cannot prove a branch uniform guards every shuffle after it.
#pragma unroll
        for (int r = 0; r < S; ++r) {
          // Row r's multiplier, from the lane of the row block that took its scale.
          const float row_mul = __shfl_sync(0xFFFFFFFFu, mul[r % kRowsPerLane], r / kRowsPerLane, P);
          float v[kCols];
#pragma unroll
          for (int e = 0; e < kCols; ++e) v[e] = IT::FromBits(raw[r0 + r], e);
          uint32_t codes;
          if constexpr (kPackedE2M1) {
            const uint32_t n = E2M1CodesBF16x2(raw[r0 + r], BF16x2Pow2(row_mul));
            codes = n | n >> 12;
          } else {
            codes = EncodeWord<F, kCols>(v, row_mul);
          }
          bool store = r0 + r < rows;
          if constexpr (FormatTraits<F>::kFp4 && kCols == 1) {  // a nibble: the even lane stores the byte
            codes |= __shfl_down_sync(0xFFFFFFFFu, codes, 1) << 4;
            store = store && !(lane & 1);
          }
          if (store) StoreBits<FormatTraits<F>::kFp4 ? 1 : kCols>(qr, codes);
          qr += row_bytes;
        }
      }
    }
  }
  ZeroScalePadding(s_col, p.batch, p.k, col_groups, col_k_blocks);
  ZeroScalePadding(s_row, p.batch, p.rows, row_groups, row_k_blocks);
  acc.Flush(amax);
}

}  // namespace jga::quantize
