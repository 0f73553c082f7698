// Standalone correctness + benchmark harness for the SM90 gemm_amax kernel (no JAX).
//
//   sm90_harness test            all combos x all C dtypes x odd shapes x both tile heights,
//                                NaN-scale case, amax reset case
//   sm90_harness bench [iters]   TFLOP/s on the contract's shapes (e4m3/e8m0, bf16 C),
//                                with and without the amax reduction (and cuBLAS bf16 if built
//                                with -DJGA_WITH_CUBLAS -lcublas)
//   sm90_harness small           one small case (for compute-sanitizer)
//   sm90_harness hostcost M N K  host time of one call, piece by piece, direct and captured into a
//                                CUDA graph as XLA's command buffers do (update, graph launch)
//   JGA_SPLIT_BONUS=N (any mode)  the split-K reducer's extra 64-K units (LaunchOptions::
//                                split_bonus_units), for sweeps; unset: the library's default
//   JGA_FORCE_SPLITS=S (any mode) force the split-K factor where a mode does not (plans: `one`
//                                with its tile argument; S = 1: unsplit)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifdef JGA_WITH_CUBLAS
#include <cublas_v2.h>
#endif

#include "common/numerics.h"
#include "common/problem.h"
#include "cuda/sm90/gemm_amax_sm90.h"
#include "cuda/sm90/sm90_planner.h"

using namespace jga;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

struct Combo {
  OperandType ab;
  ScaleType sf;
  int sfv;
  const char* name;
};
static const Combo kCombos[] = {
    {OperandType::kE4M3, ScaleType::kE8M0, 32, "e4m3/e8m0/32"},
    {OperandType::kE5M2, ScaleType::kE8M0, 32, "e5m2/e8m0/32"},
    {OperandType::kE2M1x2, ScaleType::kE8M0, 32, "e2m1/e8m0/32"},
    {OperandType::kE2M1x2, ScaleType::kE8M0, 16, "e2m1/e8m0/16"},
    {OperandType::kE2M1x2, ScaleType::kE4M3, 16, "e2m1/e4m3/16"},
};
static const char* CName(OutputType t) {
  switch (t) {
    case OutputType::kF32: return "f32";
    case OutputType::kF16: return "f16";
    case OutputType::kBF16: return "bf16";
    case OutputType::kE4M3: return "e4m3";
    case OutputType::kE5M2: return "e5m2";
    case OutputType::kE2M1x2: return "e2m1";
  }
  return "?";
}
static int CBytesTimes2(OutputType t) {
  switch (t) {
    case OutputType::kF32: return 8;
    case OutputType::kF16:
    case OutputType::kBF16: return 4;
    case OutputType::kE4M3:
    case OutputType::kE5M2: return 2;
    default: return 1;
  }
}

// ------------------------------------------------------------------------------------------
struct HostProblem {
  GemmAmaxProblem p;
  std::vector<uint8_t> a, b, sfa, sfb;
};

static uint8_t RandOperandByte(std::mt19937& rng, OperandType t) {
  for (;;) {
    uint8_t v = static_cast<uint8_t>(rng() & 0xFF);
    if (t == OperandType::kE4M3 && (v & 0x7F) == 0x7F) continue;
    if (t == OperandType::kE5M2 && (v & 0x7C) == 0x7C) continue;
    return v;
  }
}

static void FillScales(std::vector<uint8_t>& sf, const GemmAmaxProblem& p, int64_t rows, std::mt19937& rng, int lo,
                       int hi) {
  sf.assign(static_cast<size_t>(p.batch * p.scale_batch_stride(rows)), 0);
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t l = 0; l < p.batch; ++l)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < p.k_groups(); ++g) {
        int v = d(rng);
        if (p.sf_type == ScaleType::kE4M3) {
          // e4m3 scale byte in a sane positive range
          v = 0x20 + (v - lo) % 0x38;  // 0x20 (2^-3) .. 0x57 (~2^3.9)
        }
        sf[l * p.scale_batch_stride(rows) + ScaleOffset(r, g, p.k_blocks())] = static_cast<uint8_t>(v);
      }
}

static float DecodeVal(const GemmAmaxProblem& p, const uint8_t* row, int64_t k) {
  if (p.fp4_operands()) {
    uint8_t byte = row[k / 2];
    return DecodeE2M1((k & 1) ? (byte >> 4) : (byte & 0xF));
  }
  return DecodeOperand(p.ab_type, row[k]);
}

// Dequantized operand (value * scale, exact in float) as (L, rows, K).
static std::vector<float> Dequant(const GemmAmaxProblem& p, const std::vector<uint8_t>& x, const std::vector<uint8_t>& sf,
                                  int64_t rows) {
  std::vector<float> out(static_cast<size_t>(p.batch * rows * p.k));
  const int64_t rb = p.operand_row_bytes();
  for (int64_t l = 0; l < p.batch; ++l)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = x.data() + (l * rows + r) * rb;
      for (int64_t k = 0; k < p.k; ++k) {
        const float s =
            DecodeScale(p.sf_type, sf[l * p.scale_batch_stride(rows) + ScaleOffset(r, k / p.sf_vec_size, p.k_blocks())]);
        out[(l * rows + r) * p.k + k] = DecodeVal(p, row, k) * s;
      }
    }
  return out;
}

struct Ref {
  std::vector<double> c, sumabs;
  std::vector<double> amax;  // per batch, NaN if any NaN
  double max_sumabs = 0;
};

static Ref Reference(const HostProblem& hp) {
  const GemmAmaxProblem& p = hp.p;
  auto A = Dequant(p, hp.a, hp.sfa, p.m);
  auto B = Dequant(p, hp.b, hp.sfb, p.n);
  Ref r;
  r.c.assign(static_cast<size_t>(p.batch * p.m * p.n), 0);
  r.sumabs.assign(r.c.size(), 0);
  r.amax.assign(p.batch, 0);
  const int nth = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  const int64_t rows_total = p.batch * p.m;
  for (int ti = 0; ti < nth; ++ti) {
    th.emplace_back([&, ti] {
      for (int64_t lr = ti; lr < rows_total; lr += nth) {
        const int64_t l = lr / p.m, m = lr % p.m;
        const float* a = &A[(l * p.m + m) * p.k];
        for (int64_t n = 0; n < p.n; ++n) {
          const float* b = &B[(l * p.n + n) * p.k];
          double s = 0, sa = 0;
          for (int64_t k = 0; k < p.k; ++k) {
            const double pr = static_cast<double>(a[k]) * static_cast<double>(b[k]);
            s += pr;
            sa += std::fabs(pr);
          }
          r.c[lr * p.n + n] = s;
          r.sumabs[lr * p.n + n] = sa;
        }
      }
    });
  }
  for (auto& t : th) t.join();
  for (int64_t l = 0; l < p.batch; ++l) {
    double mx = 0;
    for (int64_t i = 0; i < p.m * p.n; ++i) {
      const double v = r.c[l * p.m * p.n + i];
      if (std::isnan(v)) {
        mx = NAN;
        break;
      }
      mx = std::max(mx, std::fabs(v));
      r.max_sumabs = std::max(r.max_sumabs, r.sumabs[l * p.m * p.n + i]);
    }
    r.amax[l] = mx;
  }
  return r;
}

static int Ordinal(uint32_t code, int mag_mask, int sign_bit) {
  const int mag = static_cast<int>(code & mag_mask);
  return (code & sign_bit) ? -mag : mag;
}

// Checks one output element; returns true if ok.
static bool CheckElem(OutputType t, const uint8_t* cbuf, int64_t idx, double ref, double sumabs, double* worst) {
  const float r32 = static_cast<float>(ref);
  const double f32tol = 1e-5 * sumabs + 1e-30;
  switch (t) {
    case OutputType::kF32: {
      float v;
      memcpy(&v, cbuf + idx * 4, 4);
      if (std::isnan(ref)) return std::isnan(v);
      const double err = std::fabs(v - ref);
      *worst = std::max(*worst, err / (sumabs + 1e-30));
      return err <= f32tol;
    }
    case OutputType::kBF16: {
      uint16_t h;
      memcpy(&h, cbuf + idx * 2, 2);
      const float v = BitsToFloat(static_cast<uint32_t>(h) << 16);
      if (std::isnan(ref)) return std::isnan(v);
      const double err = std::fabs(v - ref);
      *worst = std::max(*worst, err / (std::fabs(ref) + sumabs * 1e-5 + 1e-30));
      return err <= std::ldexp(std::fabs(ref), -7) + f32tol;
    }
    case OutputType::kF16: {
      uint16_t h;
      memcpy(&h, cbuf + idx * 2, 2);
      // decode half
      const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 0x1F, m = h & 0x3FF;
      float v;
      if (e == 0x1F) v = m ? NAN : (s ? -INFINITY : INFINITY);
      else if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
      else v = std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
      if (s && !std::isnan(v)) v = -v;
      if (std::isnan(ref)) return std::isnan(v);
      if (std::fabs(r32) >= 65520.0f * 0.999f) return std::isinf(v) || std::fabs(v) >= 65000.0f;
      const double err = std::fabs(v - ref);
      *worst = std::max(*worst, err / (std::fabs(ref) + sumabs * 1e-5 + 1e-30));
      return err <= std::ldexp(std::fabs(ref), -10) + std::ldexp(1.0, -24) + f32tol;
    }
    case OutputType::kE4M3: {
      const uint8_t c = cbuf[idx];
      if (std::isnan(ref)) return (c & 0x7F) == 0x7F;
      if ((c & 0x7F) == 0x7F) return false;
      const uint8_t e = EncodeE4M3(r32);
      const int d = std::abs(Ordinal(c, 0x7F, 0x80) - Ordinal(e, 0x7F, 0x80));
      *worst = std::max(*worst, static_cast<double>(d));
      return d <= 1;
    }
    case OutputType::kE5M2: {
      const uint8_t c = cbuf[idx];
      const bool cnan = (c & 0x7C) == 0x7C && (c & 3);
      if (std::isnan(ref)) return cnan;
      if ((c & 0x7C) == 0x7C) return false;  // inf/nan never produced for finite input (saturating)
      const uint8_t e = EncodeE5M2(r32);
      const int d = std::abs(Ordinal(c, 0x7F, 0x80) - Ordinal(e, 0x7F, 0x80));
      *worst = std::max(*worst, static_cast<double>(d));
      return d <= 1;
    }
    default: {
      const uint8_t byte = cbuf[idx / 2];
      const uint8_t c = (idx & 1) ? (byte >> 4) : (byte & 0xF);
      if (std::isnan(ref)) return c == 0x7;
      const uint8_t e = EncodeE2M1(r32);
      const int d = std::abs(Ordinal(c, 0x7, 0x8) - Ordinal(e, 0x7, 0x8));
      *worst = std::max(*worst, static_cast<double>(d));
      return d <= 1;
    }
  }
}

struct DevBufs {
  uint8_t *a = nullptr, *b = nullptr, *sfa = nullptr, *sfb = nullptr, *c = nullptr;
  float* amax = nullptr;
  size_t c_bytes = 0;
  void Free() {
    cudaFree(a); cudaFree(b); cudaFree(sfa); cudaFree(sfb); cudaFree(c); cudaFree(amax);
  }
};

static DevBufs Upload(const HostProblem& hp) {
  DevBufs d;
  const GemmAmaxProblem& p = hp.p;
  CK(cudaMalloc(&d.a, hp.a.size()));
  CK(cudaMalloc(&d.b, hp.b.size()));
  CK(cudaMalloc(&d.sfa, hp.sfa.size()));
  CK(cudaMalloc(&d.sfb, hp.sfb.size()));
  d.c_bytes = static_cast<size_t>(p.batch * p.m * p.n * CBytesTimes2(p.c_type) / 2);
  CK(cudaMalloc(&d.c, d.c_bytes));
  CK(cudaMalloc(&d.amax, sizeof(float) * p.batch));
  CK(cudaMemcpy(d.a, hp.a.data(), hp.a.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.b, hp.b.data(), hp.b.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sfa, hp.sfa.data(), hp.sfa.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sfb, hp.sfb.data(), hp.sfb.size(), cudaMemcpyHostToDevice));
  return d;
}

// Split-K workspace: what the JAX lowering offers (sm90::WorkspaceBytes), or, when a test forces a
// split factor, enough for any plan. One allocation, grown as needed.
static void* g_ws = nullptr;
static size_t g_ws_bytes = 0;
// Environment overrides for sweeps (any mode; unset: the options as given).
static sm90::LaunchOptions WithEnvOverrides(sm90::LaunchOptions o) {
  static const int bonus = [] { const char* e = getenv("JGA_SPLIT_BONUS"); return e ? atoi(e) : -1; }();
  static const int splits = [] { const char* e = getenv("JGA_FORCE_SPLITS"); return e ? atoi(e) : 0; }();
  if (o.split_bonus_units < 0) o.split_bonus_units = bonus;
  if (o.force_splits == 0 && splits > 0) o.force_splits = splits;
  return o;
}

// The workspace a launch with options `o` (overrides applied) is given. Forced copies go after the
// split-K area (split plans may take A' too).
static size_t WorkspaceFor(const GemmAmaxProblem& p, const sm90::LaunchOptions& o) {
  const size_t any_plan = static_cast<size_t>(sm90::kMaxSplits) * ((p.m + 255) / 256 * 256) * ((p.n + 127) / 128 * 128) *
                          p.batch * 4 + 1024 * 1024;
  const size_t copies = (o.preconvert_b == 1 ? sm90::PreconvertedBBytes(p) : 0) + (o.preconvert_a == 1 ? sm90::PreconvertedABytes(p) : 0);
  return o.force_splits > 1 ? any_plan + copies : std::max(sm90::WorkspaceBytes(p), sm90::WorkspaceBytes(p, false) + copies);
}

static cudaError_t LaunchH(const GemmAmaxProblem& p, const GemmAmaxBuffers& b, const sm90::LaunchOptions& opt) {
  const sm90::LaunchOptions o = WithEnvOverrides(opt);
  const size_t want = WorkspaceFor(p, o);
  if (want > g_ws_bytes) {
    cudaFree(g_ws);
    CK(cudaMalloc(&g_ws, want));
    CK(cudaMemset(g_ws, 0xFF, want));  // poisoned from the start (see RunAndCheck)
    g_ws_bytes = want;
  }
  return sm90::LaunchWithOptions(p, b, want > 0 ? g_ws : nullptr, want, 0, o);
}
// The plan LaunchH runs with these options (its workspace, the environment overrides).
static sm90::PlanInfo PlanH(const GemmAmaxProblem& p, const sm90::LaunchOptions& opt) {
  const sm90::LaunchOptions o = WithEnvOverrides(opt);
  sm90::PlanInfo plan;
  CK(sm90::PlanFor(p, WorkspaceFor(p, o), o, &plan));
  return plan;
}

static GemmAmaxBuffers Bufs(const DevBufs& d) {
  GemmAmaxBuffers b;
  b.a = d.a; b.b = d.b; b.sfa = d.sfa; b.sfb = d.sfb; b.c = d.c; b.amax = d.amax;
  return b;
}

static HostProblem MakeProblem(const Combo& cb, int64_t L, int64_t M, int64_t N, int64_t K, std::mt19937& rng, int slo,
                               int shi) {
  HostProblem hp;
  GemmAmaxProblem& p = hp.p;
  p.batch = L; p.m = M; p.n = N; p.k = K;
  p.ab_type = cb.ab; p.sf_type = cb.sf; p.sf_vec_size = cb.sfv;
  const int64_t rb = p.operand_row_bytes();
  hp.a.resize(static_cast<size_t>(L * M * rb));
  hp.b.resize(static_cast<size_t>(L * N * rb));
  for (auto& v : hp.a) v = RandOperandByte(rng, p.ab_type);
  for (auto& v : hp.b) v = RandOperandByte(rng, p.ab_type);
  FillScales(hp.sfa, p, M, rng, slo, shi);
  FillScales(hp.sfb, p, N, rng, slo, shi);
  return hp;
}

static int g_fail = 0, g_pass = 0;

// Pre-converted operands of a launch: -1 as the plan decides; else bits 1 (B) and 2 (A) forced on, the
// others off.
static void SetPre(sm90::LaunchOptions& o, int pre) {
  o.preconvert_b = pre < 0 ? -1 : (pre & 1) ? 1 : 0;
  o.preconvert_a = pre < 0 ? -1 : (pre & 2) ? 1 : 0;
}
// "", "A", "B" or "AB": the operands a launch pre-converts.
static const char* PreName(bool a, bool b) { return a ? (b ? "AB" : "A") : b ? "B" : ""; }

// Before a checked launch: C and amax poisoned (0xFF bytes: NaN or the largest code; amax 0x7F7F7F7F),
// and the workspace too: split-K counters that were not reset would read as "all partials ready".
static void Poison(const DevBufs& d, int64_t batch, void* ws, size_t ws_bytes) {
  CK(cudaMemset(d.c, 0xFF, d.c_bytes));
  CK(cudaMemset(d.amax, 0x7F, sizeof(float) * batch));
  if (ws != nullptr) CK(cudaMemset(ws, 0xFF, ws_bytes));
}

// A finished launch's C and amax (device buffers d, problem hp with its c_type) against ref.
struct Outputs {
  int64_t bad = 0, first_bad = -1;
  double worst = 0;
  std::vector<float> amax;
  bool amax_ok = true;
};
static Outputs Compare(const HostProblem& hp, const Ref& ref, const DevBufs& d) {
  const GemmAmaxProblem& p = hp.p;
  Outputs out;
  std::vector<uint8_t> c(d.c_bytes);
  out.amax.resize(p.batch);
  CK(cudaMemcpy(c.data(), d.c, d.c_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.amax.data(), d.amax, sizeof(float) * p.batch, cudaMemcpyDeviceToHost));
  const int64_t total = p.batch * p.m * p.n;
  for (int64_t i = 0; i < total; ++i) {
    if (!CheckElem(p.c_type, c.data(), i, ref.c[i], ref.sumabs[i], &out.worst)) {
      if (out.first_bad < 0) out.first_bad = i;
      ++out.bad;
    }
  }
  for (int64_t l = 0; l < p.batch; ++l) {
    const double r = ref.amax[l];
    const float a = out.amax[l];
    out.amax_ok &= std::isnan(r) ? std::isnan(a) : !std::isnan(a) && std::fabs(a - r) <= 1e-5 * ref.max_sumabs + 1e-30;
  }
  return out;
}

// Runs the kernel on hp (with c_type set) and compares against ref.
static bool RunAndCheck(HostProblem& hp, const Ref& ref, OutputType ct, int force_tile, const char* tag,
                        int force_splits = 0, int force_whole_tiles = -1, int pre = -1) {
  hp.p.c_type = ct;
  GemmAmaxProblem& p = hp.p;
  if (const char* why = sm90::Unsupported(p)) {
    printf("  [skip] %s: %s\n", tag, why);
    return true;
  }
  DevBufs d = Upload(hp);
  sm90::LaunchOptions opt;
  opt.force_tile_m = force_tile;
  opt.force_splits = force_splits;
  opt.force_whole_tiles = force_whole_tiles;
  SetPre(opt, pre);
  Poison(d, p.batch, g_ws, g_ws_bytes);
  CK(LaunchH(p, Bufs(d), opt));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const sm90::PlanInfo plan = PlanH(p, opt);  // what the launch did (the operands it pre-converted), for the report
  const Outputs out = Compare(hp, ref, d);
  d.Free();
  const bool ok = out.bad == 0 && out.amax_ok;
  ok ? ++g_pass : ++g_fail;
  printf("  [%s] %-40s C=%-4s tile=%d splits=%d whole=%d pre=%s(%s)  bad=%lld/%lld worst=%.3g amax[0]=%.8g ref=%.8g\n",
         ok ? "PASS" : "FAIL", tag, CName(ct), force_tile, force_splits, force_whole_tiles,
         pre < 0 ? "auto" : PreName(pre & 2, pre & 1), PreName(plan.preconvert_a, plan.preconvert_b),
         static_cast<long long>(out.bad), static_cast<long long>(p.batch * p.m * p.n), out.worst, out.amax[0], ref.amax[0]);
  if (out.first_bad >= 0) {
    const int64_t i = out.first_bad;
    printf("         first bad idx=%lld (l=%lld m=%lld n=%lld) ref=%.8g\n", static_cast<long long>(i),
           static_cast<long long>(i / (p.m * p.n)), static_cast<long long>((i / p.n) % p.m),
           static_cast<long long>(i % p.n), ref.c[i]);
  }
  return ok;
}

static int64_t AlignN(int64_t n, OutputType ct) {
  const int64_t q = 32 / CBytesTimes2(ct) * 1;  // elements per 16 bytes = 16*2/bytes2
  const int64_t e16 = 32 / CBytesTimes2(ct);
  (void)q;
  return (n + e16 - 1) / e16 * e16;
}

static void TestAll() {
  std::mt19937 rng(12345);
  const OutputType cts[] = {OutputType::kF32, OutputType::kF16, OutputType::kBF16,
                            OutputType::kE4M3, OutputType::kE5M2, OutputType::kE2M1x2};
  for (const Combo& cb : kCombos) {
    printf("== %s ==\n", cb.name);
    // Shape 1: L=3, M=200, N~136..160, K=352 (K tail), all C dtypes, both tile heights.
    for (OutputType ct : cts) {
      const int64_t N = AlignN(136, ct);
      HostProblem hp = MakeProblem(cb, 3, 200, N, 352, rng, 120, 134);
      Ref ref = Reference(hp);
      char tag[128];
      snprintf(tag, sizeof tag, "%s L=3 M=200 N=%lld K=352", cb.name, static_cast<long long>(N));
      RunAndCheck(hp, ref, ct, 128, tag);
      RunAndCheck(hp, ref, ct, 256, tag);
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hp, ref, ct, 256, tag, 1, -1, pre);  // B, A, both pre-converted
    }
    // Shape 1b: only full tiles, C rows 16-byte aligned in every C dtype (the staged epilogue).
    for (OutputType ct : cts) {
      HostProblem hp = MakeProblem(cb, 1, 256, 384, 160, rng, 120, 134);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, ct, 128, "full tiles M=256 N=384 K=160");
      RunAndCheck(hp, ref, ct, 256, "full tiles M=256 N=384 K=160");
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hp, ref, ct, 256, "full tiles M=256 N=384 K=160", 1, -1, pre);
    }
    // Shape 2: odd M, K=288 (scale-block clamp for sfv16), wide scale range (two-multiply path).
    {
      HostProblem hp = MakeProblem(cb, 2, 300, 272, 288, rng, 100, 160);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kF32, 128, "wide scales L=2 M=300 N=272 K=288");
      RunAndCheck(hp, ref, OutputType::kF32, 256, "wide scales L=2 M=300 N=272 K=288");
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hp, ref, OutputType::kF32, 256, "wide scales L=2 M=300 N=272 K=288", 1, -1, pre);
    }
    // Shape 3: tiny.
    {
      HostProblem hp = MakeProblem(cb, 1, 1, 32, 32, rng, 120, 134);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kBF16, 0, "tiny M=1 N=32 K=32");
    }
    // Shape 4: several waves, multiple tiles per CTA, larger K.
    {
      HostProblem hp = MakeProblem(cb, 2, 1000, 1040, 1024, rng, 118, 136);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kF32, 128, "L=2 M=1000 N=1040 K=1024");
      RunAndCheck(hp, ref, OutputType::kBF16, 256, "L=2 M=1000 N=1040 K=1024");
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hp, ref, OutputType::kF32, 256, "L=2 M=1000 N=1040 K=1024", 1, -1, pre);
    }
    // Shape 4b, for the A'B' plan's ping-pong kernel: 243 tiles of 128 x 256 (a 2-CTA cluster's), 3-4
    // per cluster, so each warpgroup runs 1-2; full and edge tiles, L = 3, and an odd count of 128-column
    // tiles (17), so that the second CTA of each m-tile's last pair has no columns.
    {
      HostProblem hp = MakeProblem(cb, 3, 1100, 2120, 192, rng, 118, 136);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kBF16, 256, "L=3 M=1100 N=2120 K=192", 1, -1, 3);
      RunAndCheck(hp, ref, OutputType::kF32, 256, "L=3 M=1100 N=2120 K=192", 1, -1, 3);
    }
    // Shape 5: split-K forced (1-4 ranges of uneven slab counts, K tail), partial tiles, L=2.
    {
      HostProblem hp = MakeProblem(cb, 2, 300, 264, 1056, rng, 118, 136);
      Ref ref = Reference(hp);
      for (int splits = 1; splits <= 4; ++splits) {
        RunAndCheck(hp, ref, OutputType::kBF16, 256, "split-K L=2 M=300 N=264 K=1056", splits);
        RunAndCheck(hp, ref, OutputType::kF32, 128, "split-K L=2 M=300 N=264 K=1056", splits);
        RunAndCheck(hp, ref, OutputType::kF32, 256, "split-K L=2 M=300 N=264 K=1056", splits, -1, 2);  // A pre-converted
      }
      // Tail split: the first tiles whole, the rest split (12 tiles at 256, 18 at 128).
      for (int splits = 2; splits <= 4; ++splits) {
        RunAndCheck(hp, ref, OutputType::kBF16, 256, "tail split L=2 M=300 N=264 K=1056", splits, 5);
        RunAndCheck(hp, ref, OutputType::kF32, 128, "tail split L=2 M=300 N=264 K=1056", splits, 11);
        RunAndCheck(hp, ref, OutputType::kBF16, 256, "tail split L=2 M=300 N=264 K=1056", splits, 5, 2);
      }
    }
    // NaN scale: one scale of batch 0 is NaN -> amax[0] NaN, the other batch finite.
    {
      HostProblem hp = MakeProblem(cb, 2, 200, 136, 352, rng, 120, 134);
      hp.sfa[ScaleOffset(5, 1, hp.p.k_blocks())] = (cb.sf == ScaleType::kE8M0) ? 0xFF : 0x7F;
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kF32, 0, "NaN scale (l=0,m=5,g=1)");
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hp, ref, OutputType::kF32, 256, "NaN scale (l=0,m=5,g=1)", 1, -1, pre);
      RunAndCheck(hp, ref, OutputType::kE4M3, 0, "NaN scale (l=0,m=5,g=1)");
      // ... and one of B (column 7): the converter's and PreconvertKernel's NaN.
      HostProblem hb = MakeProblem(cb, 2, 200, 136, 352, rng, 120, 134);
      hb.sfb[ScaleOffset(7, 2, hb.p.k_blocks())] = (cb.sf == ScaleType::kE8M0) ? 0xFF : 0x7F;
      Ref refb = Reference(hb);
      RunAndCheck(hb, refb, OutputType::kF32, 256, "NaN scale of B (l=0,n=7,g=2)", 1);
      for (int pre = 1; pre <= 3; ++pre) RunAndCheck(hb, refb, OutputType::kF32, 256, "NaN scale of B (l=0,n=7,g=2)", 1, -1, pre);
    }
    // amax reset: run once with data, then B = 0 -> amax exactly 0.
    {
      HostProblem hp = MakeProblem(cb, 2, 200, 136, 352, rng, 120, 134);
      hp.p.c_type = OutputType::kF32;
      DevBufs d = Upload(hp);
      CK(LaunchH(hp.p, Bufs(d), sm90::LaunchOptions{}));
      CK(cudaMemset(d.b, 0, hp.b.size()));
      CK(LaunchH(hp.p, Bufs(d), sm90::LaunchOptions{}));
      CK(cudaDeviceSynchronize());
      std::vector<float> amax(2);
      std::vector<float> c(hp.p.batch * hp.p.m * hp.p.n);
      CK(cudaMemcpy(amax.data(), d.amax, 8, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
      d.Free();
      bool ok = amax[0] == 0.0f && amax[1] == 0.0f && !std::signbit(amax[0]);
      for (float v : c) ok &= (v == 0.0f);
      ok ? ++g_pass : ++g_fail;
      printf("  [%s] amax reset (second call, B = 0): amax = %g %g\n", ok ? "PASS" : "FAIL", amax[0], amax[1]);
    }
    // Without amax (LaunchOptions::skip_amax, the amax-cost timing): C right, amax left as it was
    // (poisoned), unsplit (nothing to zero: no zeroing round) and split 2 (the round zeroes the
    // counters only).
    for (int splits : {1, 2}) {
      HostProblem hp = MakeProblem(cb, 2, 300, 264, 1056, rng, 118, 136);
      hp.p.c_type = OutputType::kF32;
      const Ref ref = Reference(hp);
      DevBufs d = Upload(hp);
      Poison(d, hp.p.batch, g_ws, g_ws_bytes);
      sm90::LaunchOptions o;
      o.skip_amax = true;
      o.force_splits = splits;
      CK(LaunchH(hp.p, Bufs(d), o));
      CK(cudaDeviceSynchronize());
      const Outputs out = Compare(hp, ref, d);
      d.Free();
      bool ok = out.bad == 0;
      for (float a : out.amax) ok &= FloatToBits(a) == 0x7F7F7F7Fu;
      ok ? ++g_pass : ++g_fail;
      printf("  [%s] no amax (skip_amax), splits=%d: bad=%lld, amax[0] bits %08x (poison 7f7f7f7f)\n", ok ? "PASS" : "FAIL",
             splits, static_cast<long long>(out.bad), FloatToBits(out.amax[0]));
    }
  }
  // Two call sites, as XLA runs them: each launch captured into a CUDA graph with its own
  // workspace and reset word (sm90::AllocResetWord), the two graphs replayed at the same time on two
  // streams, C, amax and the workspaces poisoned before every replay. A split-K plan and one
  // without split, so that both the zeroing round and the split-K hand-over are in play.
  {
    const Combo cb = kCombos[0];
    HostProblem hp = MakeProblem(cb, 2, 300, 264, 1056, rng, 118, 136);
    hp.p.c_type = OutputType::kF32;
    const Ref ref = Reference(hp);
    struct Site {
      DevBufs d;
      void* ws = nullptr;
      size_t ws_bytes = 0;
      unsigned int* word = nullptr;
      cudaStream_t stream = nullptr;
      cudaGraphExec_t exec = nullptr;
    } sites[2];
    for (int i = 0; i < 2; ++i) {
      Site& st = sites[i];
      st.d = Upload(hp);
      sm90::LaunchOptions o;
      o.force_splits = i == 0 ? 2 : 1;
      st.ws_bytes = WorkspaceFor(hp.p, o);
      CK(cudaMalloc(&st.ws, st.ws_bytes));
      CK(sm90::AllocResetWord(&st.word));
      o.reset_word = st.word;
      CK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
      const cudaError_t launched = sm90::LaunchWithOptions(hp.p, Bufs(st.d), st.ws, st.ws_bytes, st.stream, o);
      CK(cudaStreamEndCapture(st.stream, &g));
      CK(launched);
      CK(cudaGraphInstantiate(&st.exec, g, 0));
      CK(cudaGraphDestroy(g));
    }
    int good = 0;
    for (int replay = 0; replay < 3; ++replay) {
      for (Site& st : sites) Poison(st.d, hp.p.batch, st.ws, st.ws_bytes);
      CK(cudaDeviceSynchronize());
      for (Site& st : sites) CK(cudaGraphLaunch(st.exec, st.stream));
      CK(cudaDeviceSynchronize());
      for (Site& st : sites) {
        const Outputs out = Compare(hp, ref, st.d);
        good += out.bad == 0 && out.amax_ok;
      }
    }
    for (Site& st : sites) {
      cudaGraphExecDestroy(st.exec);
      cudaStreamDestroy(st.stream);
      cudaFree(st.ws);
      cudaFree(st.word);
      st.d.Free();
    }
    const bool ok = good == 6;
    ok ? ++g_pass : ++g_fail;
    printf("  [%s] two call sites, graphs replayed together on two streams (split 2 and 1), poisoned: %d of 6 right\n",
           ok ? "PASS" : "FAIL", good);
  }
  printf("\nTEST SUMMARY: %d passed, %d failed\n", g_pass, g_fail);
}

// ------------------------------------------------------------------------------------------
// Benchmark.
__global__ void FillRandomE4M3(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    uint8_t v = static_cast<uint8_t>(x);
    if ((v & 0x7F) == 0x7F) v = 0x3F;
    p[i] = v;
  }
}
__global__ void FillScalesDev(uint8_t* p, size_t n, uint32_t seed, bool e4m3) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2246822519u ^ seed;
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    p[i] = static_cast<uint8_t>(e4m3 ? 0x30 + x % 16 : 120 + x % 15);  // e4m3 0.25..1.875, e8m0 2^-7..2^7
  }
}
__global__ void FillBF16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15;
    p[i] = static_cast<uint16_t>(0x3C00 | (x & 0x83FF));  // +-[2^-7, 2^-6)
  }
}

static double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The operand format of the timing modes (one, turns, bench, exp, hostcost): kCombos[JGA_COMBO]
// (default 0, e4m3 / e8m0 / 32; 2 mxfp4, 4 nvfp4), so that fp4 plans can be timed too.
static const Combo& TimedCombo() {
  static const int i = [] {
    const char* e = getenv("JGA_COMBO");
    const int n = static_cast<int>(sizeof(kCombos) / sizeof(kCombos[0]));
    const int v = e ? atoi(e) : 0;
    if (v < 0 || v >= n) {
      fprintf(stderr, "JGA_COMBO=%s: want 0..%d\n", e, n - 1);
      exit(2);
    }
    return v;
  }();
  return kCombos[i];
}

// A random problem in TimedCombo()'s format with bf16 C and L batch items, generated on the device
// into `d` (batch item 0 first in every buffer). Scales stay near 1 (e8m0 2^-7..2^7, e4m3 0.25..1.9),
// so that the conversions take their usual one-multiply path.
static GemmAmaxProblem RandomProblem(int64_t M, int64_t N, int64_t K, DevBufs& d, int64_t L = 1) {
  const Combo& cb = TimedCombo();
  GemmAmaxProblem p;
  p.batch = L; p.m = M; p.n = N; p.k = K;
  p.ab_type = cb.ab; p.sf_type = cb.sf; p.sf_vec_size = cb.sfv; p.c_type = OutputType::kBF16;
  const size_t rb = static_cast<size_t>(p.operand_row_bytes());
  const size_t sfab = p.scale_batch_stride(M) * L, sfbb = p.scale_batch_stride(N) * L;
  d.c_bytes = L * M * N * 2;
  CK(cudaMalloc(&d.a, L * M * rb)); CK(cudaMalloc(&d.b, L * N * rb));
  CK(cudaMalloc(&d.sfa, sfab)); CK(cudaMalloc(&d.sfb, sfbb));
  CK(cudaMalloc(&d.c, d.c_bytes)); CK(cudaMalloc(&d.amax, 4 * L));
  FillRandomE4M3<<<1024, 256>>>(d.a, L * M * rb, 1);  // any byte but e4m3's NaN codes: valid in every format
  FillRandomE4M3<<<1024, 256>>>(d.b, L * N * rb, 2);
  const bool e4m3_scales = cb.sf == ScaleType::kE4M3;
  FillScalesDev<<<256, 256>>>(d.sfa, sfab, 3, e4m3_scales);
  FillScalesDev<<<256, 256>>>(d.sfb, sfbb, 4, e4m3_scales);
  CK(cudaDeviceSynchronize());
  return p;
}

// Median milliseconds per launch over `iters` samples, after >= 50 ms of warm-up launches; each
// sample times kBackToBack launches queued back to back between two events, as a JAX program
// issues them (one launch per sample would add the host's launch latency to every small problem).
// (With 3 warm-up launches, the first configuration timed per shape read up to ~10% below the
// later ones in session 6, for every build; the time-based warm-up has not run on a GPU yet.)
constexpr int kBackToBack = 8;
// Median time per launch of each of `launches`, timed taking turns: every round takes one sample
// (kBackToBack launches between two events) of each, so that clock drift under the power cap falls
// on all of them alike (separate processes read one configuration up to 10% apart, session 16).
// Round i starts with configuration i mod n: with a fixed order, the configuration listed first in a
// round of five read 0.7-1.0% above its identical twin listed last (session 17); rotated, 0.3-0.7%
// (the build's own plan against the same plan forced, at three shapes).
static std::vector<double> MedianMsTakingTurns(const std::vector<std::function<void()>>& launches, int iters) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  auto sample_ms = [&](const std::function<void()>& launch) {
    CK(cudaEventRecord(e0));
    for (int r = 0; r < kBackToBack; ++r) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / kBackToBack;
  };
  float warm_ms = 0;
  for (int n = 0; n < 1000 && warm_ms < 50.0f; ++n)
    for (const auto& launch : launches) warm_ms += sample_ms(launch) * kBackToBack;
  std::vector<std::vector<float>> ts(launches.size());
  for (int i = 0; i < iters; ++i)
    for (size_t j = 0; j < launches.size(); ++j) {
      const size_t c = (j + i) % launches.size();
      ts[c].push_back(sample_ms(launches[c]));
    }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  std::vector<double> medians;
  for (const auto& t : ts) medians.push_back(Median(t));
  return medians;
}
static double MedianMs(const std::function<void()>& launch, int iters) { return MedianMsTakingTurns({launch}, iters)[0]; }

static double MedianLaunchMs(const GemmAmaxProblem& p, const DevBufs& d, const sm90::LaunchOptions& o, int iters) {
  return MedianMs([&] { CK(LaunchH(p, Bufs(d), o)); }, iters);
}

struct Shape {
  int64_t m, n, k, l = 1;
};
// "MxNxK,MxNxKxL,..." (L: batch items, default 1; an empty list: the issue's six shapes).
static std::vector<Shape> ParseShapes(const char* list) {
  std::vector<Shape> shapes;
  for (const char* q = list; q != nullptr && *q != '\0';) {
    long long m, n, k, l = 1;
    const int got = sscanf(q, "%lldx%lldx%lldx%lld", &m, &n, &k, &l);
    if (got < 3 || m <= 0 || n <= 0 || k <= 0 || k % 128 != 0 || l <= 0) {
      fprintf(stderr, "bad shape list at '%s' (want MxNxK[xL],..., K a multiple of 128)\n", q);
      exit(2);
    }
    shapes.push_back({m, n, k, got == 4 ? l : 1});
    q = strchr(q, ',');
    if (q != nullptr) ++q;
  }
  if (shapes.empty()) {
    shapes = {{8192, 8192, 8192}, {4096, 4096, 4096}, {16384, 8192, 1024},
              {2048, 28672, 8192}, {256, 8192, 8192}, {1024, 1024, 1024}};
  }
  return shapes;
}

static void Bench(int iters, const std::vector<Shape>& shapes) {
  printf("%-20s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %10s %s\n", "MxNxK", "plan t/s/w", "TF/s", "TF/s noflush", "TF/s t128",
         "TF/s t256", "TF/s nosplit", "TF/s noPre", "TF/s PreB", "TF/s PreA", "TF/s PreAB", "cuBLASbf16", "check");
  for (const Shape& s : shapes) {
    DevBufs d;
    const GemmAmaxProblem p = RandomProblem(s.m, s.n, s.k, d, s.l);
    const double flop = 2.0 * s.l * s.m * s.n * s.k;
    const int64_t rb = p.operand_row_bytes();
    const size_t abytes = s.m * rb, bbytes = s.n * rb;  // batch item 0 (checked below)
    const size_t sfab = p.scale_batch_stride(s.m), sfbb = p.scale_batch_stride(s.n);
    auto time_it = [&](const sm90::LaunchOptions& opt) {
      return flop / (MedianLaunchMs(p, d, opt, iters) * 1e-3) / 1e12;
    };
    sm90::LaunchOptions o;
    const double tf = time_it(o);
    const sm90::PlanInfo plan = PlanH(p, o);
    char plan_name[32];  // tile height / splits / tiles run whole first
    const char* pre = PreName(plan.preconvert_a, plan.preconvert_b);
    snprintf(plan_name, sizeof plan_name, "%d/%d/%d%s%s", plan.tile_m, plan.splits, plan.whole_tiles, *pre ? "+" : "", pre);
    // correctness spot-check of the measured output
    std::vector<uint8_t> ha(abytes), hb(bbytes), hsa(sfab), hsb(sfbb);
    std::vector<uint16_t> hc(s.m * s.n);
    float amax = 0;
    CK(cudaMemcpy(ha.data(), d.a, abytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), d.b, bbytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hsa.data(), d.sfa, sfab, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hsb.data(), d.sfb, sfbb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), d.c, hc.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));  // batch item 0
    CK(cudaMemcpy(&amax, d.amax, 4, cudaMemcpyDeviceToHost));
    std::mt19937 rng(7);
    int bad = 0;
    double smax = 0;
    for (int i = 0; i < 256; ++i) {
      const int64_t m = rng() % s.m, n = rng() % s.n;
      double acc = 0, sa = 0;
      for (int64_t k = 0; k < s.k; ++k) {
        // in the timed format (JGA_COMBO), as the reference of the test modes decodes it
        const double va = DecodeVal(p, ha.data() + m * rb, k) *
                          DecodeScale(p.sf_type, hsa[ScaleOffset(m, k / p.sf_vec_size, p.k_blocks())]);
        const double vb = DecodeVal(p, hb.data() + n * rb, k) *
                          DecodeScale(p.sf_type, hsb[ScaleOffset(n, k / p.sf_vec_size, p.k_blocks())]);
        acc += va * vb;
        sa += std::fabs(va * vb);
      }
      const float v = BitsToFloat(static_cast<uint32_t>(hc[m * s.n + n]) << 16);
      if (!(std::fabs(v - acc) <= std::ldexp(std::fabs(acc), -7) + 1e-5 * sa)) ++bad;
      smax = std::max(smax, std::fabs(acc));
    }
    const bool amax_ok = std::isfinite(amax) && amax >= smax * (1 - 1e-5);
    o.skip_amax = true;
    const double tf_noflush = time_it(o);
    o.skip_amax = false;
    o.force_tile_m = 128;
    const double tf128 = time_it(o);
    o.force_tile_m = 256;
    const double tf256 = time_it(o);
    o.force_tile_m = 0;
    o.force_splits = 1;
    const double tf_nosplit = time_it(o);
    o.force_splits = 0;
    double tf_pre[4];  // none, B, A, both pre-converted
    for (int pre = 0; pre < 4; ++pre) {
      SetPre(o, pre);
      tf_pre[pre] = time_it(o);
    }
    double cublas_tf = 0;
#ifdef JGA_WITH_CUBLAS
    {
      cublasHandle_t h;
      cublasCreate(&h);
      uint16_t *ba, *bb, *bc;
      CK(cudaMalloc(&ba, s.l * abytes * 2)); CK(cudaMalloc(&bb, s.l * bbytes * 2)); CK(cudaMalloc(&bc, s.l * s.m * s.n * 2));
      FillBF16<<<1024, 256>>>(ba, s.l * abytes, 5);
      FillBF16<<<1024, 256>>>(bb, s.l * bbytes, 6);
      const float alpha = 1, beta = 0;
      auto run = [&] {
        // C^T (N x M, col-major) = B (N x K row-major viewed col-major K x N)^T * A^T, per batch item
        return cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, bb, CUDA_R_16BF, s.k,
                                          s.n * s.k, ba, CUDA_R_16BF, s.k, s.m * s.k, &beta, bc, CUDA_R_16BF, s.n,
                                          s.m * s.n, s.l, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      const double cublas_ms = MedianMs([&] {
        if (run() != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasGemmStridedBatchedEx failed\n"); exit(2); }
      }, iters);
      cublas_tf = flop / (cublas_ms * 1e-3) / 1e12;
      cudaFree(ba); cudaFree(bb); cudaFree(bc);
      cublasDestroy(h);
    }
#endif
    char name[64];
    snprintf(name, sizeof name, s.l > 1 ? "%lldx%lldx%lldx%lld" : "%lldx%lldx%lld", static_cast<long long>(s.m),
             static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(s.l));
    printf("%-20s %12s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %10.1f %s (bad %d/256, amax %g)\n", name,
           plan_name, tf, tf_noflush, tf128, tf256, tf_nosplit, tf_pre[0], tf_pre[1], tf_pre[2], tf_pre[3], cublas_tf,
           (bad == 0 && amax_ok) ? "ok" : "WRONG", bad, amax);
    d.Free();
  }
}

static void OneConfig(int64_t M, int64_t N, int64_t K, int tile, int iters, int pre) {
  DevBufs d;
  const GemmAmaxProblem p = RandomProblem(M, N, K, d);
  sm90::LaunchOptions o;
  o.force_tile_m = tile;
  SetPre(o, pre);
  const double med = MedianLaunchMs(p, d, o, iters);
  const sm90::PlanInfo plan = PlanH(p, o);  // tile 0: the heuristic's tile
  // Host time of one launch (plan, two tensor maps, the GEMM), queued back to back.
  CK(cudaDeviceSynchronize());
  constexpr int kHostLaunches = 200;
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kHostLaunches; ++i) CK(LaunchH(p, Bufs(d), o));
  const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / kHostLaunches;
  CK(cudaDeviceSynchronize());
  printf("one %lldx%lldx%lld tile=%d %8.3f ms %8.1f TF/s  host %.1f us per launch  clusters %d  plan %d/%d/%d\n",
         (long long)M, (long long)N, (long long)K, tile, med, 2.0 * M * N * K / (med * 1e-3) / 1e12, host_us,
         plan.clusters, plan.tile_m, plan.splits, plan.whole_tiles);
  d.Free();
}

// Configurations of one problem timed taking turns (MedianMsTakingTurns): the way to compare plans.
// Each configuration is TILE:SPLITS:PRE[:WHOLE] (0 / 0 / -1 / -1: the heuristic's; WHOLE: tiles run
// unsplit before the split ones, with SPLITS > 1).
static void Turns(int64_t M, int64_t N, int64_t K, int iters, const std::vector<std::string>& cfgs) {
  DevBufs d;
  const GemmAmaxProblem p = RandomProblem(M, N, K, d);
  std::vector<sm90::LaunchOptions> opts;
  for (const std::string& c : cfgs) {
    int tile = 0, splits = 0, pre = -1, whole = -1;
    if (sscanf(c.c_str(), "%d:%d:%d:%d", &tile, &splits, &pre, &whole) < 1) {
      fprintf(stderr, "bad configuration '%s' (want TILE:SPLITS:PRE[:WHOLE])\n", c.c_str());
      exit(2);
    }
    sm90::LaunchOptions o;
    o.force_tile_m = tile;
    o.force_splits = splits;
    o.force_whole_tiles = whole;
    SetPre(o, pre);
    opts.push_back(o);
  }
  std::vector<std::function<void()>> launches;
  for (const auto& o : opts) launches.push_back([&p, &d, o] { CK(LaunchH(p, Bufs(d), o)); });
  const std::vector<double> ms = MedianMsTakingTurns(launches, iters);
  printf("turns %lldx%lldx%lld %s:", (long long)M, (long long)N, (long long)K, TimedCombo().name);
  for (size_t c = 0; c < opts.size(); ++c) {
    const sm90::PlanInfo plan = PlanH(p, opts[c]);
    printf("  %s=%.1f (%d/%d/%d%s%s)", cfgs[c].c_str(), 2.0 * M * N * K / (ms[c] * 1e-3) / 1e12, plan.tile_m,
           plan.splits, plan.whole_tiles, plan.preconvert_a || plan.preconvert_b ? "+" : "",
           PreName(plan.preconvert_a, plan.preconvert_b));
  }
  printf("\n");
  d.Free();
}

// The DRAM ceiling for a pass's traffic (read n bytes, write 2n: one byte -> one BF16), without
// the pass's gathers and staging: each thread loads U 16-byte pieces (grid-stride), writes 2U.
template <int U, bool kExpand>
static __global__ void __launch_bounds__(256) ExpandKernel(const uint4* in, uint4* out, long long n16) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * U;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x * U + threadIdx.x; i < n16; i += stride) {
    uint4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = i + u * blockDim.x < n16 ? __ldg(in + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long j = i + u * blockDim.x;
      if (j >= n16) break;
      if constexpr (kExpand) {
        out[2 * j] = make_uint4(__byte_perm(x[u].x, 0, 0x1404), __byte_perm(x[u].x, 0, 0x3424),
                                __byte_perm(x[u].y, 0, 0x1404), __byte_perm(x[u].y, 0, 0x3424));
        out[2 * j + 1] = make_uint4(__byte_perm(x[u].z, 0, 0x1404), __byte_perm(x[u].z, 0, 0x3424),
                                    __byte_perm(x[u].w, 0, 0x1404), __byte_perm(x[u].w, 0, 0x3424));
      } else {
        out[j] = x[u];
      }
    }
  }
}
static void Ceiling(long long bytes, int iters) {
  const long long n16 = bytes / 16;
  uint8_t *in, *out;
  CK(cudaMalloc(&in, n16 * 16));
  CK(cudaMalloc(&out, n16 * 32));
  FillRandomE4M3<<<1024, 256>>>(in, n16 * 16, 5);
  CK(cudaDeviceSynchronize());
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const auto* i4 = reinterpret_cast<const uint4*>(in);
  auto* o4 = reinterpret_cast<uint4*>(out);
  auto blocks = [&](int u) { return static_cast<unsigned>((n16 + 256 * u - 1) / (256 * u)); };
  const char* names[] = {"expand U1 one-shot", "expand U2 one-shot", "expand U4 one-shot", "expand U2 8/SM loop",
                         "expand U4 4/SM loop", "expand U1 8/SM loop", "copy U4 one-shot (read n, write n)"};
  std::vector<std::function<void()>> launches = {
      [&] { ExpandKernel<1, true><<<blocks(1), 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<2, true><<<blocks(2), 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<4, true><<<blocks(4), 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<2, true><<<sms * 8, 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<4, true><<<sms * 4, 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<1, true><<<sms * 8, 256>>>(i4, o4, n16); },
      [&] { ExpandKernel<4, false><<<blocks(4), 256>>>(i4, o4, n16); },
  };
  const std::vector<double> ms = MedianMsTakingTurns(launches, iters);
  CK(cudaGetLastError());
  for (size_t c = 0; c < ms.size(); ++c) {
    const double moved = c + 1 == ms.size() ? 2.0 * bytes : 3.0 * bytes;
    printf("ceiling %lld bytes in: %-36s %8.1f us %6.2f TB/s\n", bytes, names[c], ms[c] * 1e3, moved / (ms[c] * 1e-3) / 1e12);
  }
  cudaFree(in);
  cudaFree(out);
}

// Host time of the pieces of one launch (no device work is timed): where the ~10 us per call go.
static __global__ void EmptyKernel(int) {}
static void HostCost(int64_t M, int64_t N, int64_t K) {
  DevBufs d;
  const GemmAmaxProblem p = RandomProblem(M, N, K, d);
  const sm90::LaunchOptions o;
  const GemmAmaxBuffers b = Bufs(d);
  auto time_us = [](const char* what, int n, auto&& fn) {
    CK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) fn();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
    CK(cudaDeviceSynchronize());
    printf("  %-52s %7.2f us\n", what, us);
  };
  const size_t ws = sm90::WorkspaceBytes(p);
  void* w = nullptr;
  if (ws > 0) CK(cudaMalloc(&w, ws));
  printf("host cost per call, %lldx%lldx%lld:\n", (long long)M, (long long)N, (long long)K);
  CK(sm90::Launch(p, b, w, ws, 0));  // the first call loads the kernels (Prepare): not timed
  time_us("sm90::Launch (plan, tensor maps, GEMM)", 200, [&] { CK(sm90::Launch(p, b, w, ws, 0)); });
  sm90::PlanInfo info;
  time_us("sm90::PlanFor", 2000, [&] { CK(sm90::PlanFor(p, ws, o, &info)); });
  time_us("sm90::WorkspaceBytes", 2000, [&] { (void)sm90::WorkspaceBytes(p); });
  time_us("EmptyKernel<<<1, 256>>>", 500, [&] { EmptyKernel<<<1, 256>>>(0); CK(cudaGetLastError()); });
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(132, 1, 1);
  cfg.blockDim = dim3(512, 1, 1);
  cfg.attrs = attr;
  for (int n : {0, 1, 2}) {
    cfg.numAttrs = n;
    const char* names[] = {"cudaLaunchKernelEx, no attributes", "cudaLaunchKernelEx, cluster (1,1,1)",
                           "cudaLaunchKernelEx, cluster + programmatic"};
    time_us(names[n], 500, [&] { CK(cudaLaunchKernelEx(&cfg, EmptyKernel, 0)); });
  }
  cfg.attrs = attr + 1;
  cfg.numAttrs = 1;
  time_us("cudaLaunchKernelEx, programmatic only", 500, [&] { CK(cudaLaunchKernelEx(&cfg, EmptyKernel, 0)); });
  int dev = 0;
  time_us("cudaGetDevice", 2000, [&] { CK(cudaGetDevice(&dev)); });

  // XLA's update of a custom call inside a command buffer (CUDA graph), when its buffers moved:
  // capture the handler's launches into a new graph, then swap it into the executable graph's
  // child node. The same steps here, per call, for our launches and for bare kernels.
  cudaStream_t cap;
  CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  auto capture = [&](auto&& launches) {  // as XLA traces an FFI call: thread-local capture into a new graph
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    CK(cudaStreamBeginCaptureToGraph(cap, g, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal));
    launches(cap);
    CK(cudaStreamEndCapture(cap, &g));
    return g;
  };
  auto captured = [&](const char* what, auto&& launches) {
    cudaGraph_t parent, child = capture(launches);
    cudaGraphNode_t node;
    CK(cudaGraphCreate(&parent, 0));
    CK(cudaGraphAddChildGraphNode(&node, parent, nullptr, 0, child));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, parent, 0));
    CK(cudaGraphLaunch(exec, cap));
    CK(cudaStreamSynchronize(cap));
    time_us((std::string("captured + child update: ") + what).c_str(), 200, [&] {
      cudaGraph_t g = capture(launches);
      CK(cudaGraphExecChildGraphNodeSetParams(exec, node, g));
      CK(cudaGraphDestroy(g));
    });
    CK(cudaGraphLaunch(exec, cap));  // the updated graph still runs
    CK(cudaStreamSynchronize(cap));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(parent));
    CK(cudaGraphDestroy(child));
  };
  // A jitted chain as XLA's command buffer holds it: `ops` child graphs (each call captured), a
  // one-block kernel node between two of them (the chain's add fusion), all in one line. Host time
  // of cudaGraphLaunch, and wall time per launch with the GPU in the loop.
  auto chain = [&](const char* what, int ops, auto&& launches) {
    cudaGraph_t parent;
    CK(cudaGraphCreate(&parent, 0));
    cudaGraphNode_t prev = nullptr;
    int arg = 0;
    void* args[] = {&arg};
    for (int i = 0; i < ops; ++i) {
      cudaGraph_t g = capture(launches);
      cudaGraphNode_t node;
      CK(cudaGraphAddChildGraphNode(&node, parent, prev ? &prev : nullptr, prev ? 1 : 0, g));
      CK(cudaGraphDestroy(g));
      prev = node;
      if (i + 1 < ops) {
        cudaKernelNodeParams kp = {};
        kp.func = reinterpret_cast<void*>(EmptyKernel);
        kp.gridDim = dim3(1, 1, 1);
        kp.blockDim = dim3(32, 1, 1);
        kp.kernelParams = args;
        CK(cudaGraphAddKernelNode(&node, parent, &prev, 1, &kp));
        prev = node;
      }
    }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, parent, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, cap));
    CK(cudaStreamSynchronize(cap));
    const int n = 30;
    double host_us = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      const auto h0 = std::chrono::steady_clock::now();
      CK(cudaGraphLaunch(exec, cap));
      host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count();
    }
    CK(cudaStreamSynchronize(cap));
    const double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    printf("  graph of %d x %-44s launch %7.1f us host, %7.1f us wall\n", ops, what, host_us / n, wall_us / n);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(parent));
  };
  sm90::LaunchOptions gemm_only;
  gemm_only.skip_amax = true;
  gemm_only.force_splits = 1;
  cfg.attrs = attr + 1;  // programmatic only
  cfg.numAttrs = 1;
  const std::vector<std::pair<const char*, std::function<void(cudaStream_t)>>> calls = {
      {"sm90::Launch", [&](cudaStream_t s) { CK(sm90::Launch(p, b, w, ws, s)); }},
      {"GEMM alone (no amax, unsplit)", [&](cudaStream_t s) { CK(sm90::LaunchWithOptions(p, b, w, ws, s, gemm_only)); }},
      {"EmptyKernel", [&](cudaStream_t s) { EmptyKernel<<<1, 256, 0, s>>>(0); }},
      {"EmptyKernel, then one with PDL",
       [&](cudaStream_t s) {
         EmptyKernel<<<1, 256, 0, s>>>(0);
         cfg.stream = s;
         CK(cudaLaunchKernelEx(&cfg, EmptyKernel, 0));
       }},
      {"two EmptyKernels",
       [&](cudaStream_t s) {
         EmptyKernel<<<1, 256, 0, s>>>(0);
         EmptyKernel<<<132, 512, 0, s>>>(0);
       }},
  };
  for (const auto& [what, launches] : calls) captured(what, launches);
  for (const auto& [what, launches] : calls) chain(what, 20, launches);
  CK(cudaStreamDestroy(cap));
  if (w) cudaFree(w);
  d.Free();
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash or a time limit keeps the lines printed so far
  const std::string mode = argc > 1 ? argv[1] : "test";
  if (mode == "test") {
    TestAll();
    return g_fail == 0 ? 0 : 1;
  }
  if (mode == "small") {
    std::mt19937 rng(1);
    for (int ci = 0; ci < 5; ++ci) {
      HostProblem hp = MakeProblem(kCombos[ci], 2, 200, 136, 352, rng, 120, 134);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kBF16, 128, kCombos[ci].name);
      RunAndCheck(hp, ref, OutputType::kE2M1x2, 256, kCombos[ci].name);
      RunAndCheck(hp, ref, OutputType::kBF16, 256, kCombos[ci].name, 1, -1, 3);  // pre-converted A and B
      RunAndCheck(hp, ref, OutputType::kF32, 256, kCombos[ci].name, 2, -1, 2);   // split-K, pre-converted A
    }
    printf("SMALL SUMMARY: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
  }
  if (mode == "hostcost") {  // hostcost M N K
    if (argc < 5) return 2;
    HostCost(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]));
    return 0;
  }
  if (mode == "one") {  // one M N K tile iters [pre: -1 auto, bits 1 B, 2 A]: a single configuration (for ncu)
    if (argc < 7) return 2;
    OneConfig(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]), atoi(argv[6]), argc > 7 ? atoi(argv[7]) : -1);
    return 0;
  }
  if (mode == "turns") {  // turns M N K iters TILE:SPLITS:PRE[:WHOLE]...: configurations taking turns
    if (argc < 7) return 2;
    Turns(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]), std::vector<std::string>(argv + 6, argv + argc));
    return 0;
  }
  if (mode == "ceiling") {  // ceiling BYTES iters: the DRAM ceiling for a pass's traffic
    if (argc < 4) return 2;
    Ceiling(atoll(argv[2]), atoi(argv[3]));
    return 0;
  }
  if (mode == "bench") {
    Bench(argc > 2 ? atoi(argv[2]) : 30, ParseShapes(argc > 3 ? argv[3] : nullptr));
    return 0;
  }
  fprintf(stderr, "usage: %s [test|small|bench [iters [MxNxK[xL],...]]|one M N K tile iters [pre: -1 auto, bits 1 B, 2 A]|turns M N K iters TILE:SPLITS:PRE[:WHOLE]...|hostcost M N K|ceiling BYTES iters] (timing modes: env JGA_COMBO=0..4 picks the operand format, 2 mxfp4, 4 nvfp4)\n", argv[0]);
  return 2;
}
