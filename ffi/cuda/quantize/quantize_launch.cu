#include <atomic>

#include "cuda/quantize/quantize_cuda.h"
#include "cuda/quantize/quantize_kernels.cuh"

namespace jga::quantize {
namespace {

// Resident blocks of `kernel` per multiprocessor, queried once per kernel: the grid is one full
// wave of them (grid-stride beyond it), so that no block waits for a second wave.
// `smem`: the kernel's dynamic shared memory, whose limit is raised here first.
template <typename Kernel>
cudaError_t BlocksPerSm(Kernel kernel, int threads, int smem, std::atomic<int>* cache, int* blocks) {
  *blocks = cache->load(std::memory_order_relaxed);
  if (*blocks > 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (smem > 0) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  if (*blocks < 1) *blocks = 1;
  cache->store(*blocks, std::memory_order_relaxed);
  return cudaSuccess;
}

int Grid(int64_t work_blocks, int sm_count, int per_sm) {
  const int64_t wave = int64_t(sm_count) * per_sm;
  return static_cast<int>(work_blocks < wave ? work_blocks : wave);
}

template <QuantizeFormat F, QuantizeInput I>
struct Kernels {
  using T = typename InputTraits<I>::T;

  // Resident blocks per SM of each kernel, filled by Prepare (outside any graph capture).
  static inline std::atomic<int> row_per_sm{0}, col_per_sm{0}, pair_per_sm{0};

  static constexpr int kSmem = kTileSmem<T>;

  static cudaError_t Prepare() {
    int per_sm = 0;
    cudaError_t err = BlocksPerSm(RowKernel<F, I>, kRowThreads, 0, &row_per_sm, &per_sm);
    if (err == cudaSuccess) err = BlocksPerSm(TileKernel<F, I>, kTileThreads, kSmem, &col_per_sm, &per_sm);
    if (err == cudaSuccess) err = BlocksPerSm(StripKernel<F, I>, kStripThreads, 0, &pair_per_sm, &per_sm);
    return err;
  }

  static cudaError_t Launch(const QuantizeProblem& p, const QuantizeBuffers& b, int sm_count, cudaStream_t stream) {
    const T* x = static_cast<const T*>(b.x);
    unsigned* amax = reinterpret_cast<unsigned*>(b.amax);
    auto u8 = [](void* ptr) { return static_cast<uint8_t*>(ptr); };
    int per_sm = 0;
    cudaError_t err = cudaSuccess;
    if (p.mode == kQuantizeRows) {
      err = BlocksPerSm(RowKernel<F, I>, kRowThreads, 0, &row_per_sm, &per_sm);
      if (err != cudaSuccess) return err;
      const int grid = Grid(CeilDiv(p.batch * p.rows * (p.k / 16), kRowThreads), sm_count, per_sm);
      RowKernel<F, I><<<grid, kRowThreads, 0, stream>>>(p, x, u8(b.q_row), u8(b.s_row), amax);
    } else if (p.mode == kQuantizeCols) {
      const int64_t tiles = p.batch * CeilDiv(p.rows, kTileRows<T>) * CeilDiv(p.k, kTileD);
      if (tiles >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit tile indices
      err = BlocksPerSm(TileKernel<F, I>, kTileThreads, kSmem, &col_per_sm, &per_sm);
      if (err != cudaSuccess) return err;
      TileKernel<F, I>
          <<<Grid(tiles, sm_count, per_sm), kTileThreads, kSmem, stream>>>(p, x, u8(b.q_col), u8(b.s_col), amax);
    } else {
      // One unit of work per warp: 32 strips of kStripRows rows side by side.
      const int64_t units = p.batch * CeilDiv(p.rows, kStripRows) * CeilDiv(p.k, 32 * kStripCols<I>);
      if (units >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit unit indices
      err = BlocksPerSm(StripKernel<F, I>, kStripThreads, 0, &pair_per_sm, &per_sm);
      if (err != cudaSuccess) return err;
      StripKernel<F, I><<<Grid(CeilDiv(units, kStripThreads / 32), sm_count, per_sm), kStripThreads, 0, stream>>>(
          p, x, u8(b.q_row), u8(b.s_row), u8(b.q_col), u8(b.s_col), amax);
    }
    return cudaGetLastError();
  }
};

template <QuantizeFormat F>
cudaError_t ForInput(const QuantizeProblem& p, const QuantizeBuffers& b, int sm_count, cudaStream_t stream) {
  switch (p.input) {
    case QuantizeInput::kF32: return Kernels<F, QuantizeInput::kF32>::Launch(p, b, sm_count, stream);
    case QuantizeInput::kF16: return Kernels<F, QuantizeInput::kF16>::Launch(p, b, sm_count, stream);
    case QuantizeInput::kBF16: return Kernels<F, QuantizeInput::kBF16>::Launch(p, b, sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

template <QuantizeFormat F>
cudaError_t PrepareFormat() {
  cudaError_t err = Kernels<F, QuantizeInput::kF32>::Prepare();
  if (err == cudaSuccess) err = Kernels<F, QuantizeInput::kF16>::Prepare();
  if (err == cudaSuccess) err = Kernels<F, QuantizeInput::kBF16>::Prepare();
  return err;
}

}  // namespace

cudaError_t Prepare() {
  cudaError_t err = PrepareFormat<QuantizeFormat::kMxfp8E4M3>();
  if (err == cudaSuccess) err = PrepareFormat<QuantizeFormat::kMxfp8E5M2>();
  if (err == cudaSuccess) err = PrepareFormat<QuantizeFormat::kMxfp4>();
  if (err == cudaSuccess) err = PrepareFormat<QuantizeFormat::kNvfp4>();
  return err;
}

cudaError_t Launch(const QuantizeProblem& p, const QuantizeBuffers& b, int sm_count, cudaStream_t stream) {
  if (sm_count < 1) return cudaErrorInvalidValue;
  cudaError_t err = cudaMemsetAsync(b.amax, 0, sizeof(float) * p.batch, stream);
  if (err != cudaSuccess) return err;
  switch (p.format) {
    case QuantizeFormat::kMxfp8E4M3: return ForInput<QuantizeFormat::kMxfp8E4M3>(p, b, sm_count, stream);
    case QuantizeFormat::kMxfp8E5M2: return ForInput<QuantizeFormat::kMxfp8E5M2>(p, b, sm_count, stream);
    case QuantizeFormat::kMxfp4: return ForInput<QuantizeFormat::kMxfp4>(p, b, sm_count, stream);
    case QuantizeFormat::kNvfp4: return ForInput<QuantizeFormat::kNvfp4>(p, b, sm_count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jga::quantize
