// The SM90 kernel's test cases (no JAX): every operand format with every C dtype, odd shapes, both
// tile heights, split-K and tail splits, pre-converted operands and the ping-pong kernel, NaN
// scales of A and B, the amax reset, skip_amax, and two call sites replayed as CUDA graphs at once,
// each launch checked against a float64 host reference with C, amax and the workspace poisoned
// before it. tests/test_sm90_kernel_cases.py builds and runs it.
//
//   kernel_cases test COMBO   the cases of one operand format (0..4, kCombos)
//   kernel_cases test sites   two call sites as XLA runs them (CUDA graphs on two streams)
//   kernel_cases small        a few small cases of every format (for compute-sanitizer)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/sm90/harness.h"

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

static std::vector<float> Dequant(const GemmAmaxProblem& p, const std::vector<uint8_t>& x,
                                  const std::vector<uint8_t>& sf, int64_t rows) {
  std::vector<float> out(static_cast<size_t>(p.batch * rows * p.k));
  const int64_t rb = p.operand_row_bytes();
  for (int64_t l = 0; l < p.batch; ++l)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = x.data() + (l * rows + r) * rb;
      for (int64_t k = 0; k < p.k; ++k) {
        const float s = DecodeScale(
            p.sf_type, sf[l * p.scale_batch_stride(rows) + ScaleOffset(r, k / p.sf_vec_size, p.k_blocks())]);
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

static DevBufs Upload(const HostProblem& hp) {
  DevBufs d;
  const GemmAmaxProblem& p = hp.p;
  CK(cudaMalloc(&d.a, hp.a.size()));
  CK(cudaMalloc(&d.b, hp.b.size()));
  CK(cudaMalloc(&d.sfa, hp.sfa.size()));
  CK(cudaMalloc(&d.sfb, hp.sfb.size()));
  d.c_bytes = static_cast<size_t>(p.batch * p.m * p.n * OutputBits(p.c_type) / 8);
  CK(cudaMalloc(&d.c, d.c_bytes));
  CK(cudaMalloc(&d.amax, sizeof(float) * p.batch));
  CK(cudaMemcpy(d.a, hp.a.data(), hp.a.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.b, hp.b.data(), hp.b.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sfa, hp.sfa.data(), hp.sfa.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.sfb, hp.sfb.data(), hp.sfb.size(), cudaMemcpyHostToDevice));
  return d;
}

static HostProblem MakeProblem(const Combo& cb, int64_t L, int64_t M, int64_t N, int64_t K, std::mt19937& rng, int slo,
                               int shi) {
  HostProblem hp;
  GemmAmaxProblem& p = hp.p;
  p.batch = L;
  p.m = M;
  p.n = N;
  p.k = K;
  p.ab_type = cb.ab;
  p.sf_type = cb.sf;
  p.sf_vec_size = cb.sfv;
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
         static_cast<long long>(out.bad), static_cast<long long>(p.batch * p.m * p.n), out.worst, out.amax[0],
         ref.amax[0]);
  if (out.first_bad >= 0) {
    const int64_t i = out.first_bad;
    printf("         first bad idx=%lld (l=%lld m=%lld n=%lld) ref=%.8g\n", static_cast<long long>(i),
           static_cast<long long>(i / (p.m * p.n)), static_cast<long long>((i / p.n) % p.m),
           static_cast<long long>(i % p.n), ref.c[i]);
  }
  return ok;
}

// n rounded up so that C rows are 16-byte multiples in dtype ct.
static int64_t AlignN(int64_t n, OutputType ct) {
  const int64_t e16 = 128 / OutputBits(ct);  // elements per 16 bytes
  return (n + e16 - 1) / e16 * e16;
}

// The cases of one operand format.
static void TestCombo(const Combo& cb, std::mt19937& rng) {
  const OutputType cts[] = {OutputType::kF32,  OutputType::kF16,  OutputType::kBF16,
                            OutputType::kE4M3, OutputType::kE5M2, OutputType::kE2M1x2};
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
    for (int pre = 1; pre <= 3; ++pre)
      RunAndCheck(hp, ref, OutputType::kF32, 256, "wide scales L=2 M=300 N=272 K=288", 1, -1, pre);
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
    for (int pre = 1; pre <= 3; ++pre)
      RunAndCheck(hp, ref, OutputType::kF32, 256, "L=2 M=1000 N=1040 K=1024", 1, -1, pre);
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
    for (int pre = 1; pre <= 3; ++pre)
      RunAndCheck(hp, ref, OutputType::kF32, 256, "NaN scale (l=0,m=5,g=1)", 1, -1, pre);
    RunAndCheck(hp, ref, OutputType::kE4M3, 0, "NaN scale (l=0,m=5,g=1)");
    // ... and one of B (column 7): the converter's and PreconvertKernel's NaN.
    HostProblem hb = MakeProblem(cb, 2, 200, 136, 352, rng, 120, 134);
    hb.sfb[ScaleOffset(7, 2, hb.p.k_blocks())] = (cb.sf == ScaleType::kE8M0) ? 0xFF : 0x7F;
    Ref refb = Reference(hb);
    RunAndCheck(hb, refb, OutputType::kF32, 256, "NaN scale of B (l=0,n=7,g=2)", 1);
    for (int pre = 1; pre <= 3; ++pre)
      RunAndCheck(hb, refb, OutputType::kF32, 256, "NaN scale of B (l=0,n=7,g=2)", 1, -1, pre);
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
    printf("  [%s] no amax (skip_amax), splits=%d: bad=%lld, amax[0] bits %08x (poison 7f7f7f7f)\n",
           ok ? "PASS" : "FAIL", splits, static_cast<long long>(out.bad), FloatToBits(out.amax[0]));
  }
}

// Two call sites, as XLA runs them: each launch captured into a CUDA graph with its own workspace
// and reset word (sm90::AllocResetWord), the two graphs replayed at the same time on two streams,
// C, amax and the workspaces poisoned before every replay. A split-K plan and one without split,
// so that both the zeroing round and the split-K hand-over are in play.
static void TestCallSites(std::mt19937& rng) {
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
  // Loading the kernels allocates and synchronizes: before any capture, as the FFI handler's
  // instantiate stage does.
  CK(sm90::Prepare());
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

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash or a time limit keeps the lines printed so far
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "test" && argc == 3) {
    const std::string what = argv[2];
    if (what == "sites") {
      std::mt19937 rng(12345);
      TestCallSites(rng);
    } else {
      const int ci = atoi(what.c_str());
      if (ci < 0 || ci >= kNumCombos || what != std::to_string(ci)) {
        fprintf(stderr, "test %s: want an operand format 0..%d or `sites`\n", what.c_str(), kNumCombos - 1);
        return 2;
      }
      std::mt19937 rng(12345 + ci);
      TestCombo(kCombos[ci], rng);
    }
  } else if (mode == "small" && argc == 2) {
    std::mt19937 rng(1);
    for (const Combo& cb : kCombos) {
      HostProblem hp = MakeProblem(cb, 2, 200, 136, 352, rng, 120, 134);
      Ref ref = Reference(hp);
      RunAndCheck(hp, ref, OutputType::kBF16, 128, cb.name);
      RunAndCheck(hp, ref, OutputType::kE2M1x2, 256, cb.name);
      RunAndCheck(hp, ref, OutputType::kBF16, 256, cb.name, 1, -1, 3);  // pre-converted A and B
      RunAndCheck(hp, ref, OutputType::kF32, 256, cb.name, 2, -1, 2);   // split-K, pre-converted A
    }
  } else {
    fprintf(stderr, "usage: %s test COMBO|sites | small\n", argv[0]);
    return 2;
  }
  printf("\nSUMMARY: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
