#include "cuda/quantize/quantize_cuda.h"
#include "cuda/quantize/quantize_kernels.cuh"

namespace jga::quantize {
namespace {

template <QuantizeFormat F, QuantizeInput I>
struct Kernels {
  using T = typename InputTraits<I>::T;

  static cudaError_t Prepare() {
    cudaFuncAttributes attr;
    cudaError_t err = cudaFuncGetAttributes(&attr, RowKernel<F, I>);
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, TileKernel<F, I, false>);
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, TileKernel<F, I, true>);
    return err;
  }

  static cudaError_t Launch(const QuantizeProblem& p, const QuantizeBuffers& b, int sm_count, cudaStream_t stream) {
    const T* x = static_cast<const T*>(b.x);
    unsigned* amax = reinterpret_cast<unsigned*>(b.amax);
    auto u8 = [](void* ptr) { return static_cast<uint8_t*>(ptr); };
    if (p.mode == kQuantizeRows) {
      const int64_t chunks = p.batch * p.rows * (p.k / 16);
      const int64_t blocks = CeilDiv(chunks, kRowThreads);
      // A full machine of 2048 resident threads per SM, grid-stride beyond it.
      const int grid = static_cast<int>(blocks < int64_t(sm_count) * 8 ? blocks : int64_t(sm_count) * 8);
      RowKernel<F, I><<<grid, kRowThreads, 0, stream>>>(p, x, u8(b.q_row), u8(b.s_row), amax);
    } else {
      constexpr int kTileT = FormatTraits<F>::kFp4 ? 64 : 32;
      const int64_t tiles = p.batch * CeilDiv(p.rows, kTileT) * CeilDiv(p.k, kTileD);
      if (tiles >= (int64_t(1) << 31)) return cudaErrorInvalidValue;  // 32-bit tile indices
      const int grid = static_cast<int>(tiles < int64_t(sm_count) * 16 ? tiles : int64_t(sm_count) * 16);
      if (p.mode == kQuantizeCols) {
        TileKernel<F, I, false><<<grid, kTileThreads, 0, stream>>>(p, x, nullptr, nullptr, u8(b.q_col), u8(b.s_col), amax);
      } else {
        TileKernel<F, I, true><<<grid, kTileThreads, 0, stream>>>(p, x, u8(b.q_row), u8(b.s_row), u8(b.q_col),
                                                                  u8(b.s_col), amax);
      }
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
