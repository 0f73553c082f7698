// Host-side launch of one variant (instantiated once per variant TU).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/problem.h"
#include "cuda/sm90/sm90_kernel.cuh"

namespace jga {
namespace sm90 {

struct LaunchCtx {
  CUtensorMap tm_a;
  CUtensorMap tm_b;
  KParams params;
  int grid;
  int mi;
  cudaStream_t stream;
};

cudaError_t LaunchVariant0(const LaunchCtx& ctx);  // e4m3, e8m0/32
cudaError_t LaunchVariant1(const LaunchCtx& ctx);  // e5m2, e8m0/32
cudaError_t LaunchVariant2(const LaunchCtx& ctx);  // e2m1, e8m0/32
cudaError_t LaunchVariant3(const LaunchCtx& ctx);  // e2m1, e8m0/16
cudaError_t LaunchVariant4(const LaunchCtx& ctx);  // e2m1, e4m3/16 (NVFP4)

// Loads both kernels of variant V on the current device and raises their dynamic shared-memory
// limit. Must run outside stream capture (it may load the module lazily): see Prepare().
cudaError_t PrepareVariant0();
cudaError_t PrepareVariant1();
cudaError_t PrepareVariant2();
cudaError_t PrepareVariant3();
cudaError_t PrepareVariant4();

template <int V, int MI>
cudaError_t ConfigureKernel() {
  using S = Smem<V, MI>;
  static_assert(S::kDynBytes <= 227 * 1024, "shared memory budget");
  return cudaFuncSetAttribute(GemmAmaxKernel<V, MI>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kDynBytes);
}

template <int V, int MI>
cudaError_t LaunchVariantMI(const LaunchCtx& ctx) {
  using S = Smem<V, MI>;
  GemmAmaxKernel<V, MI><<<ctx.grid, kThreads, S::kDynBytes, ctx.stream>>>(ctx.tm_a, ctx.tm_b, ctx.params);
  return cudaGetLastError();
}

#define JGA_SM90_INSTANTIATE_VARIANT(V)                                            \
  cudaError_t LaunchVariant##V(const LaunchCtx& ctx) {                             \
    return ctx.mi == 2 ? LaunchVariantMI<V, 2>(ctx) : LaunchVariantMI<V, 1>(ctx); \
  }                                                                                \
  cudaError_t PrepareVariant##V() {                                                \
    cudaError_t err = ConfigureKernel<V, 1>();                                     \
    return err != cudaSuccess ? err : ConfigureKernel<V, 2>();                     \
  }

}  // namespace sm90
}  // namespace jga
