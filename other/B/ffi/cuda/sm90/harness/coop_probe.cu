// coop_probe: can the GEMM zero its own amax / split-K counters instead of a reset kernel before it
// (NOTES.md, session 23 "one launch instead of two")? A cooperative launch gives a grid barrier
// whose state the driver keeps, so CTA 0 could zero the counters, every CTA arrive at entry and
// wait only before its first atomic. This measures what that needs, on a kernel shaped like ours
// (one 384-thread CTA per SM, ~200 KB of dynamic shared memory, 2-CTA clusters):
//   - does a cooperative launch take a cluster attribute and PDL, and a CUDA graph capture of it;
//   - the ordering: every CTA adds 1 after the barrier to the counter CTA 0 zeroed (expect gridDim);
//   - GPU time: no barrier, a full grid.sync() at entry, arrive at entry + wait after ~4 us of work;
//   - host time per direct launch: plain, cooperative, cooperative + cluster, + programmatic, and
//     the present pair (reset <<<>>> + a programmatic launch).
// Build and run (repo root, device):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a ffi/cuda/sm90/harness/coop_probe.cu -o /tmp/coop_probe && /tmp/coop_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                 \
      return false;                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kThreads = 384, kSmem = 200 * 1024;

__device__ void Work(long long cycles) {  // stands in for the main loop before the first atomic
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// mode 0: no barrier (CTA 0 zeroes, no ordering: the count may come out wrong), 1: grid.sync() at
// entry, 2: arrive at entry, wait after the work.
__global__ void __launch_bounds__(kThreads, 1) Probe(unsigned* counter, int mode, long long work) {
  extern __shared__ unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) smem[kSmem - 1] = 1;
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter = 0;
  if (mode == 1) {
    cg::this_grid().sync();
    Work(work);
  } else if (mode == 2) {
    cg::grid_group g = cg::this_grid();
    auto token = g.barrier_arrive();
    Work(work);
    g.barrier_wait(std::move(token));
  } else {
    Work(work);
  }
  if (threadIdx.x == 0) atomicAdd(counter, 1u);
}

__global__ void Reset(unsigned* counter) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) *counter = 0;
}

struct Launch {
  bool coop, cluster, programmatic;
};

cudaError_t Go(const Launch& l, int grid, cudaStream_t s, unsigned* counter, int mode, long long work) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[3];
  unsigned n = 0;
  if (l.coop) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  if (l.cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 2;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  if (l.programmatic) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, Probe, counter, mode, work);
}

bool Run() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(Probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int grid = sms / 2 * 2;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  unsigned* counter;
  CHECK(cudaMalloc(&counter, 8));  // [0]: the probe's counter, [1]: the reset kernel's
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const long long work = 8000;  // ~4 us at 1.98 GHz

  const Launch kinds[] = {{false, false, false}, {true, false, false}, {true, true, false}, {true, true, true}};
  const char* names[] = {"plain", "cooperative", "cooperative + cluster 2", "cooperative + cluster 2 + programmatic"};
  for (int k = 0; k < 4; ++k) {
    for (int mode = 0; mode < 3; ++mode) {
      if (mode > 0 && !kinds[k].coop) continue;
      const int iters = 200;
      CHECK(Go(kinds[k], grid, s, counter, mode, work));  // warm-up
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < iters; ++i) CHECK(Go(kinds[k], grid, s, counter, mode, work));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaStreamSynchronize(s));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      unsigned got = 0;
      CHECK(cudaMemcpy(&got, counter, 4, cudaMemcpyDeviceToHost));
      const bool ok = got == static_cast<unsigned>(grid);
      // host cost per launch: enqueue 50 back to back (the GPU takes longer, so the queue never fills)
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 50; ++i) CHECK(Go(kinds[k], grid, s, counter, mode, 0));
      const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50;
      CHECK(cudaStreamSynchronize(s));
      printf("%-40s mode %d (%s): GPU %6.2f us per launch, host %5.2f us, count %u of %d %s\n", names[k], mode,
             mode == 0 ? "no barrier" : mode == 1 ? "grid.sync at entry" : "arrive at entry, wait late", ms * 1e3 / iters,
             host_us, got, grid, ok ? "ok" : (mode == 0 ? "(unordered)" : "WRONG"));
    }
  }
  // The present pair: reset <<<1, 32>>> then the plain kernel as its programmatic dependent.
  {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i) {
      Reset<<<1, 32, 0, s>>>(counter + 1);
      CHECK(Go({false, true, true}, grid, s, counter, 0, 0));
    }
    const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50;
    CHECK(cudaStreamSynchronize(s));
    printf("%-40s host %5.2f us per pair\n", "reset + cluster 2 + programmatic", host_us);
  }
  // Stream capture: a reset-free cooperative + cluster + programmatic launch after another kernel, in a graph.
  {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    Reset<<<1, 32, 0, s>>>(counter + 1);
    cudaError_t launched = Go({true, true, true}, grid, s, counter, 2, work);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(launched);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int good = 0;
    for (int i = 0; i < 20; ++i) {
      CHECK(cudaMemset(counter, 0xAB, 4));  // poison: the kernel must zero it itself
      CHECK(cudaGraphLaunch(exec, s));
      CHECK(cudaStreamSynchronize(s));
      unsigned got = 0;
      CHECK(cudaMemcpy(&got, counter, 4, cudaMemcpyDeviceToHost));
      good += got == static_cast<unsigned>(grid);
    }
    printf("graph (captured cooperative + cluster 2 + programmatic, arrive/wait): %d of 20 replays counted %d\n", good, grid);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  return true;
}

int main() { return Run() ? 0 : 1; }
