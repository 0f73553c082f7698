// The few-row kernel's instantiations of one A kind: their configuration (shared-memory limit,
// occupancy) and launch. Each A kind is compiled in its own translation unit (skinny_<kind>.cu),
// so that the 44 kernels of an architecture build in parallel (a block-scaled A has no
// 64-token kernels: kBuilt).
#pragma once

#include <cuda_runtime.h>

#include "cuda/skinny/skinny.h"
#include "cuda/skinny/skinny_kernel.cuh"

namespace jga {
namespace skinny {

constexpr int kTokenTileIndices = 4;  // kTokenTileCounts

// Sets the shared-memory limits of A's kernels on the current device and reads their occupancy
// into ctas[v][mt index].
template <int A>
cudaError_t ConfigureKind(int (&ctas)[kVariants][kTokenTileIndices]);

// Launches A's kernel of variant v with kTokenTileCounts[mt_index] token tiles (cooperative).
template <int A>
cudaError_t LaunchKind(int v, int mt_index, const Params& params, int grid, cudaStream_t stream);

#if defined(__CUDACC__)
// Whether A's kernels with MT token tiles are built: a block-scaled A stops at kMaxScaledM rows.
template <int A, int MT>
constexpr bool kBuilt = 8 * MT <= (A == kAScaled ? kMaxScaledM : kMaxM);

template <int V, int A, int MT>
cudaError_t Configure(int& ctas) {
  ctas = 0;
  if constexpr (!kBuilt<A, MT>) {
    return cudaSuccess;  // never planned (Accepts)
  } else {
    const auto kernel = SkinnyKernel<V, A, MT>;
    constexpr int kBytes = Smem<V, A, MT>::kBytes;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (err == cudaSuccess)
      err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads, kBytes);
    if (err != cudaSuccess) return err;
    return ctas > 0 ? cudaSuccess : cudaErrorInvalidConfiguration;
  }
}

template <int V, int A>
cudaError_t ConfigureVariant(int (&ctas)[kTokenTileIndices]) {
  cudaError_t err = Configure<V, A, 1>(ctas[0]);
  if (err == cudaSuccess) err = Configure<V, A, 2>(ctas[1]);
  if (err == cudaSuccess) err = Configure<V, A, 4>(ctas[2]);
  if (err == cudaSuccess) err = Configure<V, A, 8>(ctas[3]);
  return err;
}

template <int A>
cudaError_t ConfigureKind(int (&ctas)[kVariants][kTokenTileIndices]) {
  cudaError_t err = ConfigureVariant<kE4M3, A>(ctas[kE4M3]);
  if (err == cudaSuccess) err = ConfigureVariant<kE5M2, A>(ctas[kE5M2]);
  if (err == cudaSuccess) err = ConfigureVariant<kMXFP4, A>(ctas[kMXFP4]);
  if (err == cudaSuccess) err = ConfigureVariant<kNVFP4, A>(ctas[kNVFP4]);
  return err;
}

template <int V, int A, int MT>
cudaError_t LaunchKernel(const Params& params, int grid, cudaStream_t stream) {
  if constexpr (!kBuilt<A, MT>) {
    return cudaErrorInvalidValue;  // never planned (Accepts)
  } else {
    // Cooperative: the zeroing round needs every CTA resident (the grid is capped at the occupancy).
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = Smem<V, A, MT>::kBytes;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, SkinnyKernel<V, A, MT>, params);
  }
}

template <int V, int A>
cudaError_t LaunchVariant(const Params& params, int mt_index, int grid, cudaStream_t stream) {
  switch (mt_index) {
    case 0: return LaunchKernel<V, A, 1>(params, grid, stream);
    case 1: return LaunchKernel<V, A, 2>(params, grid, stream);
    case 2: return LaunchKernel<V, A, 4>(params, grid, stream);
    default: return LaunchKernel<V, A, 8>(params, grid, stream);
  }
}

template <int A>
cudaError_t LaunchKind(int v, int mt_index, const Params& params, int grid, cudaStream_t stream) {
  switch (v) {
    case kE4M3: return LaunchVariant<kE4M3, A>(params, mt_index, grid, stream);
    case kE5M2: return LaunchVariant<kE5M2, A>(params, mt_index, grid, stream);
    case kMXFP4: return LaunchVariant<kMXFP4, A>(params, mt_index, grid, stream);
    default: return LaunchVariant<kNVFP4, A>(params, mt_index, grid, stream);
  }
}
#endif

// Instantiated in skinny_<kind>.cu only.
extern template cudaError_t ConfigureKind<kAScaled>(int (&)[kVariants][kTokenTileIndices]);
extern template cudaError_t ConfigureKind<kAF16>(int (&)[kVariants][kTokenTileIndices]);
extern template cudaError_t ConfigureKind<kABF16>(int (&)[kVariants][kTokenTileIndices]);
extern template cudaError_t LaunchKind<kAScaled>(int, int, const Params&, int, cudaStream_t);
extern template cudaError_t LaunchKind<kAF16>(int, int, const Params&, int, cudaStream_t);
extern template cudaError_t LaunchKind<kABF16>(int, int, const Params&, int, cudaStream_t);

}  // namespace skinny
}  // namespace jga
