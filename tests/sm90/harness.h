// Host helpers of the SM90 kernel's test cases (kernel_cases.cu) and benchmarks
// (benchmarks/sm90_harness/sm90_bench.cu): the operand formats, device buffers, and launches with
// the planner's choices overridden, each given the workspace it needs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/numerics.h"
#include "common/problem.h"
#include "cuda/sm90/gemm_amax_sm90.h"
#include "cuda/sm90/sm90_planner.h"

using namespace jga;

#define CK(x)                                                                                          \
  do {                                                                                                 \
    cudaError_t e_ = (x);                                                                              \
    if (e_ != cudaSuccess) {                                                                           \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                         \
    }                                                                                                  \
  } while (0)

struct Combo {
  OperandType ab;
  ScaleType sf;
  int sfv;
  const char* name;
};
inline const Combo kCombos[] = {
    {OperandType::kE4M3, ScaleType::kE8M0, 32, "e4m3/e8m0/32"},
    {OperandType::kE5M2, ScaleType::kE8M0, 32, "e5m2/e8m0/32"},
    {OperandType::kE2M1x2, ScaleType::kE8M0, 32, "e2m1/e8m0/32"},
    {OperandType::kE2M1x2, ScaleType::kE8M0, 16, "e2m1/e8m0/16"},
    {OperandType::kE2M1x2, ScaleType::kE4M3, 16, "e2m1/e4m3/16"},
};
constexpr int kNumCombos = static_cast<int>(sizeof(kCombos) / sizeof(kCombos[0]));

// Element k of an operand row of codes, decoded (fp4: packed two per byte, low nibble first).
inline float DecodeVal(const GemmAmaxProblem& p, const uint8_t* row, int64_t k) {
  if (p.fp4_operands()) {
    uint8_t byte = row[k / 2];
    return DecodeE2M1((k & 1) ? (byte >> 4) : (byte & 0xF));
  }
  return DecodeOperand(p.ab_type, row[k]);
}

struct DevBufs {
  uint8_t *a = nullptr, *b = nullptr, *sfa = nullptr, *sfb = nullptr, *c = nullptr;
  float* amax = nullptr;
  size_t c_bytes = 0;
  void Free() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(sfa);
    cudaFree(sfb);
    cudaFree(c);
    cudaFree(amax);
  }
};

inline GemmAmaxBuffers Bufs(const DevBufs& d) {
  GemmAmaxBuffers b;
  b.a = d.a;
  b.b = d.b;
  b.sfa = d.sfa;
  b.sfb = d.sfb;
  b.c = d.c;
  b.amax = d.amax;
  return b;
}

// Split-K workspace: what the JAX lowering offers (sm90::WorkspaceBytes), or, when a test forces a
// split factor, enough for any plan. One allocation, grown as needed.
inline void* g_ws = nullptr;
inline size_t g_ws_bytes = 0;
// The workspace a launch with options `o` is given. Forced copies go after the split-K area
// (split plans may take A' too).
inline size_t WorkspaceFor(const GemmAmaxProblem& p, const sm90::LaunchOptions& o) {
  const size_t any_plan =
      static_cast<size_t>(sm90::kMaxSplits) * ((p.m + 255) / 256 * 256) * ((p.n + 127) / 128 * 128) * p.batch * 4 +
      1024 * 1024;
  const size_t copies =
      (o.preconvert_b == 1 ? sm90::PreconvertedBBytes(p) : 0) + (o.preconvert_a == 1 ? sm90::PreconvertedABytes(p) : 0);
  return o.force_splits > 1 ? any_plan + copies
                            : std::max(sm90::WorkspaceBytes(p), sm90::WorkspaceBytes(p, false) + copies);
}

inline cudaError_t LaunchH(const GemmAmaxProblem& p, const GemmAmaxBuffers& b, const sm90::LaunchOptions& opt) {
  const size_t want = WorkspaceFor(p, opt);
  if (want > g_ws_bytes) {
    cudaFree(g_ws);
    CK(cudaMalloc(&g_ws, want));
    CK(cudaMemset(g_ws, 0xFF, want));  // poisoned from the start (see the test cases' Poison)
    g_ws_bytes = want;
  }
  return sm90::LaunchWithOptions(p, b, want > 0 ? g_ws : nullptr, want, 0, opt);
}
// The plan LaunchH runs with these options (with its workspace).
inline sm90::PlanInfo PlanH(const GemmAmaxProblem& p, const sm90::LaunchOptions& opt) {
  sm90::PlanInfo plan;
  CK(sm90::PlanFor(p, WorkspaceFor(p, opt), opt, &plan));
  return plan;
}

// Pre-converted operands of a launch: -1 as the plan decides; else bits 1 (B) and 2 (A) forced on,
// the others off.
inline void SetPre(sm90::LaunchOptions& o, int pre) {
  o.preconvert_b = pre < 0 ? -1 : (pre & 1) ? 1 : 0;
  o.preconvert_a = pre < 0 ? -1 : (pre & 2) ? 1 : 0;
}
// "", "A", "B" or "AB": the operands a launch pre-converts.
inline const char* PreName(bool a, bool b) { return a ? (b ? "AB" : "A") : b ? "B" : ""; }
