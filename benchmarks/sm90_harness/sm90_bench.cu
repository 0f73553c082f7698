// Benchmarks of the SM90 kernel (no JAX): its speed on the benchmark's shapes and its plans, for
// A/B comparisons of two builds (compare.sh) and the planner's cost model. The correctness cases
// are tests/sm90/kernel_cases.cu.
//
//   sm90_bench bench [iters [MxNxK[xL],...]]  TFLOP/s of the planner's plan, without the amax flush,
//                         at each tile height, unsplit, with each choice of pre-converted operands
//                         (and cuBLAS bf16 if built with -DJGA_WITH_CUBLAS -lcublas); each output
//                         spot-checked. Default shapes: the JAX benchmark's six.
//   sm90_bench one M N K TILE ITERS [PRE]     one configuration (TILE 0: the planner's; PRE -1: the
//                         planner's, else bits 1 B, 2 A pre-converted), e.g. under ncu
//   sm90_bench turns M N K ITERS TILE:SPLITS:PRE[:WHOLE]...  configurations timed taking turns
//   sm90_bench hostcost M N K    host time of one call, piece by piece, direct and captured into a
//                         CUDA graph as XLA's command buffers do (update, graph launch)
//   sm90_bench ceiling BYTES ITERS  the DRAM ceiling of a pre-conversion pass's traffic
// JGA_COMBO=0..4 picks the operand format of every mode (0 e4m3, 2 mxfp4, 4 nvfp4; kCombos).
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
#include <vector>

#ifdef JGA_WITH_CUBLAS
#include <cublas_v2.h>
#endif

#include "tests/sm90/harness.h"

// Environment overrides for sweeps (every mode; unset: the options as given): JGA_SPLIT_BONUS=N the
// split-K reducer's extra 64-K units (PlanOptions::split_bonus_units), JGA_FORCE_SPLITS=S the
// split-K factor where a mode does not force one (S = 1: unsplit).
static sm90::LaunchOptions WithEnvOverrides(sm90::LaunchOptions o) {
  static const int bonus = [] {
    const char* e = getenv("JGA_SPLIT_BONUS");
    return e ? atoi(e) : -1;
  }();
  static const int splits = [] {
    const char* e = getenv("JGA_FORCE_SPLITS");
    return e ? atoi(e) : 0;
  }();
  if (o.split_bonus_units < 0) o.split_bonus_units = bonus;
  if (o.force_splits == 0 && splits > 0) o.force_splits = splits;
  return o;
}

// The launches and plans of the timing modes: the harness's (LaunchH, PlanH) with the environment
// overrides.
static cudaError_t LaunchB(const GemmAmaxProblem& p, const GemmAmaxBuffers& b, const sm90::LaunchOptions& o) {
  return LaunchH(p, b, WithEnvOverrides(o));
}
static sm90::PlanInfo PlanB(const GemmAmaxProblem& p, const sm90::LaunchOptions& o) {
  return PlanH(p, WithEnvOverrides(o));
}

__global__ void FillRandomE4M3(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    uint8_t v = static_cast<uint8_t>(x);
    if ((v & 0x7F) == 0x7F) v = 0x3F;
    p[i] = v;
  }
}
__global__ void FillScalesDev(uint8_t* p, size_t n, uint32_t seed, bool e4m3) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2246822519u ^ seed;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    p[i] = static_cast<uint8_t>(e4m3 ? 0x30 + x % 16 : 120 + x % 15);  // e4m3 0.25..1.875, e8m0 2^-7..2^7
  }
}
__global__ void FillBF16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += gridDim.x * static_cast<size_t>(blockDim.x)) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    p[i] = static_cast<uint16_t>(0x3C00 | (x & 0x83FF));  // +-[2^-7, 2^-6)
  }
}

static double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The operand format of the timing modes (one, turns, bench, hostcost): kCombos[JGA_COMBO]
// (default 0, e4m3 / e8m0 / 32; 2 mxfp4, 4 nvfp4), so that fp4 plans can be timed too.
static const Combo& TimedCombo() {
  static const int i = [] {
    const char* e = getenv("JGA_COMBO");
    const int v = e ? atoi(e) : 0;
    if (v < 0 || v >= kNumCombos) {
      fprintf(stderr, "JGA_COMBO=%s: want 0..%d\n", e, kNumCombos - 1);
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
  p.batch = L;
  p.m = M;
  p.n = N;
  p.k = K;
  p.ab_type = cb.ab;
  p.sf_type = cb.sf;
  p.sf_vec_size = cb.sfv;
  p.c_type = OutputType::kBF16;
  const size_t rb = static_cast<size_t>(p.operand_row_bytes());
  const size_t sfab = p.scale_batch_stride(M) * L, sfbb = p.scale_batch_stride(N) * L;
  d.c_bytes = L * M * N * 2;
  CK(cudaMalloc(&d.a, L * M * rb));
  CK(cudaMalloc(&d.b, L * N * rb));
  CK(cudaMalloc(&d.sfa, sfab));
  CK(cudaMalloc(&d.sfb, sfbb));
  CK(cudaMalloc(&d.c, d.c_bytes));
  CK(cudaMalloc(&d.amax, 4 * L));
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
// later ones, for every build.)
constexpr int kBackToBack = 8;
// Median time per launch of each of `launches`, timed taking turns: every round takes one sample
// (kBackToBack launches between two events) of each, so that clock drift under the power cap falls
// on all of them alike (separate processes read one configuration up to 10% apart). Round i starts
// with configuration i mod n: with a fixed order, the configuration listed first in a round of five
// read 0.7-1.0% above its identical twin listed last; rotated, 0.3-0.7% (the build's own plan
// against the same plan forced, at three shapes).
static std::vector<double> MedianMsTakingTurns(const std::vector<std::function<void()>>& launches, int iters) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
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
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::vector<double> medians;
  for (const auto& t : ts) medians.push_back(Median(t));
  return medians;
}
static double MedianMs(const std::function<void()>& launch, int iters) {
  return MedianMsTakingTurns({launch}, iters)[0];
}

static double MedianLaunchMs(const GemmAmaxProblem& p, const DevBufs& d, const sm90::LaunchOptions& o, int iters) {
  return MedianMs([&] { CK(LaunchB(p, Bufs(d), o)); }, iters);
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
    shapes = {{8192, 8192, 8192},  {4096, 4096, 4096}, {16384, 8192, 1024},
              {2048, 28672, 8192}, {256, 8192, 8192},  {1024, 1024, 1024}};
  }
  return shapes;
}

static void Bench(int iters, const std::vector<Shape>& shapes) {
  printf("%-20s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s %10s %s\n", "MxNxK", "plan t/s/w", "TF/s",
         "TF/s noflush", "TF/s t128", "TF/s t256", "TF/s nosplit", "TF/s noPre", "TF/s PreB", "TF/s PreA", "TF/s PreAB",
         "cuBLASbf16", "check");
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
    const sm90::PlanInfo plan = PlanB(p, o);
    char plan_name[32];  // tile height / splits / tiles run whole first
    const char* pre = PreName(plan.preconvert_a, plan.preconvert_b);
    snprintf(plan_name, sizeof plan_name, "%d/%d/%d%s%s", plan.tile_m, plan.splits, plan.whole_tiles, *pre ? "+" : "",
             pre);
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
      CK(cudaMalloc(&ba, s.l * abytes * 2));
      CK(cudaMalloc(&bb, s.l * bbytes * 2));
      CK(cudaMalloc(&bc, s.l * s.m * s.n * 2));
      FillBF16<<<1024, 256>>>(ba, s.l * abytes, 5);
      FillBF16<<<1024, 256>>>(bb, s.l * bbytes, 6);
      const float alpha = 1, beta = 0;
      auto run = [&] {
        // C^T (N x M, col-major) = B (N x K row-major viewed col-major K x N)^T * A^T, per batch item
        return cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, bb, CUDA_R_16BF, s.k,
                                          s.n * s.k, ba, CUDA_R_16BF, s.k, s.m * s.k, &beta, bc, CUDA_R_16BF, s.n,
                                          s.m * s.n, s.l, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      const double cublas_ms = MedianMs(
          [&] {
            if (run() != CUBLAS_STATUS_SUCCESS) {
              fprintf(stderr, "cublasGemmStridedBatchedEx failed\n");
              exit(2);
            }
          },
          iters);
      cublas_tf = flop / (cublas_ms * 1e-3) / 1e12;
      cudaFree(ba);
      cudaFree(bb);
      cudaFree(bc);
      cublasDestroy(h);
    }
#endif
    char name[64];
    snprintf(name, sizeof name, s.l > 1 ? "%lldx%lldx%lldx%lld" : "%lldx%lldx%lld", static_cast<long long>(s.m),
             static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(s.l));
    printf(
        "%-20s %12s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %10.1f %s (bad %d/256, amax %g)\n",
        name, plan_name, tf, tf_noflush, tf128, tf256, tf_nosplit, tf_pre[0], tf_pre[1], tf_pre[2], tf_pre[3],
        cublas_tf, (bad == 0 && amax_ok) ? "ok" : "WRONG", bad, amax);
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
  const sm90::PlanInfo plan = PlanB(p, o);  // tile 0: the heuristic's tile
  // Host time of one launch (plan, two tensor maps, the GEMM), queued back to back.
  CK(cudaDeviceSynchronize());
  constexpr int kHostLaunches = 200;
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kHostLaunches; ++i) CK(LaunchB(p, Bufs(d), o));
  const double host_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() / kHostLaunches;
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
  for (const auto& o : opts) launches.push_back([&p, &d, o] { CK(LaunchB(p, Bufs(d), o)); });
  const std::vector<double> ms = MedianMsTakingTurns(launches, iters);
  printf("turns %lldx%lldx%lld %s:", (long long)M, (long long)N, (long long)K, TimedCombo().name);
  for (size_t c = 0; c < opts.size(); ++c) {
    const sm90::PlanInfo plan = PlanB(p, opts[c]);
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
    for (int u = 0; u < U; ++u)
      x[u] = i + u * blockDim.x < n16 ? __ldg(in + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
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
  const char* names[] = {"expand U1 one-shot",
                         "expand U2 one-shot",
                         "expand U4 one-shot",
                         "expand U2 8/SM loop",
                         "expand U4 4/SM loop",
                         "expand U1 8/SM loop",
                         "copy U4 one-shot (read n, write n)"};
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
    printf("ceiling %lld bytes in: %-36s %8.1f us %6.2f TB/s\n", bytes, names[c], ms[c] * 1e3,
           moved / (ms[c] * 1e-3) / 1e12);
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
  time_us("EmptyKernel<<<1, 256>>>", 500, [&] {
    EmptyKernel<<<1, 256>>>(0);
    CK(cudaGetLastError());
  });
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
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
      {"GEMM alone (no amax, unsplit)",
       [&](cudaStream_t s) { CK(sm90::LaunchWithOptions(p, b, w, ws, s, gemm_only)); }},
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
  const std::string mode = argc > 1 ? argv[1] : "bench";
  if (mode == "hostcost" && argc >= 5) {
    HostCost(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]));
    return 0;
  }
  if (mode == "one" && argc >= 7) {
    OneConfig(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]), atoi(argv[6]),
              argc > 7 ? atoi(argv[7]) : -1);
    return 0;
  }
  if (mode == "turns" && argc >= 7) {
    Turns(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]),
          std::vector<std::string>(argv + 6, argv + argc));
    return 0;
  }
  if (mode == "ceiling" && argc >= 4) {
    Ceiling(atoll(argv[2]), atoi(argv[3]));
    return 0;
  }
  if (mode == "bench") {
    Bench(argc > 2 ? atoi(argv[2]) : 30, ParseShapes(argc > 3 ? argv[3] : nullptr));
    return 0;
  }
  fprintf(stderr,
          "usage: %s bench [iters [MxNxK[xL],...]] | one M N K TILE ITERS [PRE] | turns M N K ITERS "
          "TILE:SPLITS:PRE[:WHOLE]... | hostcost M N K | ceiling BYTES ITERS\n",
          argv[0]);
  return 2;
}
