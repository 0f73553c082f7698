// PTX wrappers of the SM90 kernels: mbarriers, TMA and bulk copies, clusters, proxy fences,
// WGMMA fences and register budgets (the WGMMAs themselves: wgmma.h), shared-memory access and
// the few arithmetic instructions the conversion and the amax need.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/sm90/wgmma.h"

namespace jga {
namespace sm90 {

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
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void TmaLoad3DMulticast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                                   int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%3, %4, %5}], [%2], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}
// Arrives (if pred) on the mbarrier at offset `bar` in each of the cluster's first kCTAs CTAs
// (predicated, no branch: see FlushAmax).
// The arrive keeps the default .release.cta semantics: `.release.cluster` compiles to MEMBAR.ALL.GPU
// + CCTL.IVALL per arrive, which waits for every memory operation of the thread in flight (the
// epilogue's stores too): the paired ping-pong kernel ran at 217 against 572 TF/s with it
// (8192^3). The reads the arrive hands back are this CTA's completed WGMMA reads of its
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
  if constexpr (kCTAs > 1)
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
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
// on the H200 with a consumer that converted through f16: a few rows of 1-6 tiles per call wrong
// at 16384x8192x1024; ptxas turns the fence into MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, which waits for
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
__device__ __forceinline__ void Sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}
// Programmatic dependent launch: the kernel may start while the grids before it still run (the
// PreconvertKernel passes); every access to their output waits for them first. Without the launch
// attribute this returns at once.
__device__ __forceinline__ void WaitForPrecedingGrids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// The 256 consumer threads (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void ConsumerBarrier() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

}  // namespace sm90
}  // namespace jga
