// Host-side launch of one variant (instantiated once per variant TU).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/problem.h"
#include "cuda/sm90/sm90_kernel.cuh"

namespace jga {
namespace sm90 {

struct LaunchCtx {
  CUtensorMap tm_a;
  CUtensorMap tm_b;
  KParams params;
  int grid;  // CTAs wanted (a multiple of the cluster size); capped at launch by co-residency
  int mi;
  int device;
  cudaStream_t stream;
  // MI = 2 only: the operands in `pre` (kPreA | kPreB bits; split-K plans: kPreA alone) are
  // converted by PreconvertKernel (pre_a, pre_b) first, then the kPre GEMM runs.
  int pre = 0;
  PreconvertParams pre_a, pre_b;
  bool a_values = false;               // weight-only: pre_a copies A's bfloat16 values (PreconvertValuesKernel)
  unsigned int* pre_bounds = nullptr;  // the passes' two scale bounds (KParams::pre_bounds), reset per launch
};

// Per device and kernel: how many clusters fit on the GPU at once (a persistent grid
// must be co-resident; not every SM can host a CTA of a cluster). Filled by Prepare*().
// kind: 0 the plain kernel, 1 split-K, 1 + kPre with pre-converted operands (2: B', 3: A', 8: A'B'
// ping-pong, 2-CTA clusters; weight-only 11: A', 16: A'B'), 5 split-K with pre-converted A (17:
// weight-only).
constexpr int kMaxDevices = 64;
constexpr int kKernelKinds = 18;
int& MaxActiveClusters(int device, int variant, int mi, int kind);
constexpr int KernelKind(bool split_k, int pre) {
  return split_k ? (pre == 0 ? 1 : (pre & kValuesA) ? 17 : 5) : pre != 0 ? 1 + pre : 0;
}

cudaError_t LaunchVariant0(const LaunchCtx& ctx);  // e4m3, e8m0/32
cudaError_t LaunchVariant1(const LaunchCtx& ctx);  // e5m2, e8m0/32
cudaError_t LaunchVariant2(const LaunchCtx& ctx);  // e2m1, e8m0/32
cudaError_t LaunchVariant3(const LaunchCtx& ctx);  // e2m1, e8m0/16
cudaError_t LaunchVariant4(const LaunchCtx& ctx);  // e2m1, e4m3/16 (NVFP4)

// Loads the eleven kernels of variant V (two tile heights, with and without split-K; tile 256 with
// pre-converted A, B, or both (ping-pong), and split-K with pre-converted A; the three with A' again
// for weight-only problems) on the current device
// and raises their dynamic shared-memory limit. Must run outside stream capture (it may load the module
// lazily): see Prepare().
cudaError_t PrepareVariant0();
cudaError_t PrepareVariant1();
cudaError_t PrepareVariant2();
cudaError_t PrepareVariant3();
cudaError_t PrepareVariant4();

// The GEMM's launch configuration. cooperative (every launch; not the occupancy query): its CTAs
// wait for each other (the zeroing round, split-K partials), so all of them must be resident at
// once even when another kernel runs beside it (another stream, a concurrent command-buffer
// branch); two persistent grids sharing the SMs could otherwise each hold SMs that the other's
// missing CTAs need.
template <int V, int MI, int kPre>
cudaLaunchConfig_t LaunchConfig(int grid, cudaStream_t stream, cudaLaunchAttribute* attr, bool programmatic,
                                bool cooperative) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(Roles<MI>::kThreads, 1, 1);
  cfg.dynamicSmemBytes = Smem<V, MI, kPre>::kDynBytes;
  cfg.stream = stream;
  unsigned n = 0;
  attr[n].id = cudaLaunchAttributeClusterDimension;
  attr[n].val.clusterDim.x = Smem<V, MI, kPre>::kClusterCTAs;
  attr[n].val.clusterDim.y = 1;
  attr[n++].val.clusterDim.z = 1;
  if (programmatic) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

template <int V, int MI, bool kSplitK, int kPre = 0>
cudaError_t ConfigureKernel() {
  using S = Smem<V, MI, kPre>;
  const auto kernel = GemmAmaxKernel<V, MI, kSplitK, kPre>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kDynBytes);
  if (err != cudaSuccess) return err;
  int dev = 0;
  err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[3];
  const cudaLaunchConfig_t cfg = LaunchConfig<V, MI, kPre>(S::kClusterCTAs * 1024, nullptr, attr, false, false);
  int clusters = 0;
  err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
  if (err != cudaSuccess) return err;
  if (clusters <= 0) return cudaErrorInvalidConfiguration;
  if (dev < kMaxDevices) MaxActiveClusters(dev, V, MI, KernelKind(kSplitK, kPre)) = clusters;
  return cudaSuccess;
}

template <int V, int MI>
cudaError_t ConfigureKernels() {
  cudaError_t err = ConfigureKernel<V, MI, false>();
  if (err == cudaSuccess) err = ConfigureKernel<V, MI, true>();
  if constexpr (MI == 2) {
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, false, kPreB>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, false, kPreA>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, false, kPreA | kPreB | kPingPong>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, true, kPreA>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, false, kPreA | kValuesA>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, false, kPreA | kPreB | kPingPong | kValuesA>();
    if (err == cudaSuccess) err = ConfigureKernel<V, MI, true, kPreA | kValuesA>();
  }
  return err;
}

template <int V, int MI, bool kSplitK, int kPre = 0>
cudaError_t LaunchKernel(const LaunchCtx& ctx, bool programmatic) {
  const int fit = ctx.device < kMaxDevices ? MaxActiveClusters(ctx.device, V, MI, KernelKind(kSplitK, kPre)) : 0;
  const int grid = fit > 0 ? std::min(ctx.grid, fit * Smem<V, MI, kPre>::kClusterCTAs) : ctx.grid;
  cudaLaunchAttribute attr[3];
  const cudaLaunchConfig_t cfg = LaunchConfig<V, MI, kPre>(grid, ctx.stream, attr, programmatic, true);
  return cudaLaunchKernelEx(&cfg, GemmAmaxKernel<V, MI, kSplitK, kPre>, ctx.tm_a, ctx.tm_b, ctx.params);
}

// programmatic: launched as the programmatic dependent of the kernel before it on the stream (the
// other pass), which it does not read: its CTAs fill the SMs as that grid
// drains instead of after it; PreconvertKernel waits for that grid before it exits (see there).
// values: PreconvertValuesKernel (weight-only A), one thread per 16-byte chunk of the copy.
template <int V>
cudaError_t LaunchPreconvert(const PreconvertParams& q, cudaStream_t stream, bool programmatic, bool values = false) {
  const long long per_block =
      values ? kPreconvertValuesThreads / 8 : kPreconvertThreads * kPreconvertUnitsPerThread;  // units
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((q.units + per_block - 1) / per_block), 1, 1);
  cfg.blockDim = dim3(values ? kPreconvertValuesThreads : kPreconvertThreads, 1, 1);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  return values ? cudaLaunchKernelEx(&cfg, PreconvertValuesKernel<V>, q)
                : cudaLaunchKernelEx(&cfg, PreconvertKernel<V>, q);
}

// The GEMM of a plan with pre-converted operands (kValues: kValuesA for weight-only problems).
template <int V, int kValues>
cudaError_t LaunchPreKernel(const LaunchCtx& ctx) {
  if (ctx.params.splits > 1) return LaunchKernel<V, 2, true, kPreA | kValues>(ctx, true);
  switch (ctx.pre) {
    case kPreB:
      if constexpr (kValues == 0) return LaunchKernel<V, 2, false, kPreB>(ctx, true);
      return cudaErrorInvalidConfiguration;  // weight-only plans always take A' (PlanOf)
    case kPreA: return LaunchKernel<V, 2, false, kPreA | kValues>(ctx, true);
    case kPreA | kPreB | kPingPong: return LaunchKernel<V, 2, false, kPreA | kPreB | kPingPong | kValues>(ctx, true);
    default: return cudaErrorInvalidConfiguration;
  }
}

template <int V, int MI>
cudaError_t LaunchVariantMI(const LaunchCtx& ctx) {
  if constexpr (MI == 2) {
    if (ctx.pre != 0) {
      // The operands -> BF16 first, the second pass the programmatic dependent of the first, the
      // GEMM that of the last pass. A pass exits only after its predecessor has completed, so the
      // last pass's completion, which the GEMM's producer waits for, covers every kernel before it.
      const bool split = ctx.params.splits > 1;
      if (split && ctx.pre != kPreA) return cudaErrorInvalidConfiguration;  // split plans: A only (PlanOf)
      // The passes' bounds start at "no bound" (a min over the blocks they see).
      cudaError_t err = cudaMemsetAsync(ctx.pre_bounds, 0xFF, (kResetWords - 1) * sizeof(unsigned int), ctx.stream);
      if (err == cudaSuccess && (ctx.pre & kPreB)) err = LaunchPreconvert<V>(ctx.pre_b, ctx.stream, false);
      if (err == cudaSuccess && (ctx.pre & kPreA))
        err = LaunchPreconvert<V>(ctx.pre_a, ctx.stream, (ctx.pre & kPreB) != 0, ctx.a_values);
      if (err != cudaSuccess) return err;
      return ctx.a_values ? LaunchPreKernel<V, kValuesA>(ctx) : LaunchPreKernel<V, 0>(ctx);
    }
  }
  return ctx.params.splits > 1 ? LaunchKernel<V, MI, true>(ctx, false) : LaunchKernel<V, MI, false>(ctx, false);
}

#define JGA_SM90_INSTANTIATE_VARIANT(V)                                           \
  cudaError_t LaunchVariant##V(const LaunchCtx& ctx) {                            \
    return ctx.mi == 2 ? LaunchVariantMI<V, 2>(ctx) : LaunchVariantMI<V, 1>(ctx); \
  }                                                                               \
  cudaError_t PrepareVariant##V() {                                               \
    cudaError_t err = ConfigureKernels<V, 1>();                                   \
    return err != cudaSuccess ? err : ConfigureKernels<V, 2>();                   \
  }

}  // namespace sm90
}  // namespace jga
