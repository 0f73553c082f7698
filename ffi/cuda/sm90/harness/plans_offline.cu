// The plan the host side picks for each problem, without a GPU (132 SMs, the workspace the JAX
// lowering asks for): to see which shapes a planner change moves before spending device time.
// Build and run from the repository root (the kernels are never launched: the variant entry
// points are stubs):
//   nvcc -std=c++17 -O1 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I ffi \
//     ffi/cuda/sm90/harness/plans_offline.cu -o /tmp/plans
//   printf "8192 8192 8192\n3072 3072 1024 2\n" | /tmp/plans
// Input lines: M N K [format: 0 mxfp8 e4m3 (default), 1 mxfp4, 2 nvfp4]. Output: MxNxK/format
// tile/splits/whole_tiles[+A|B|AB] (the operands pre-converted).
#include <cstdio>

#include "cuda/sm90/gemm_amax_sm90.cu"

namespace jga {
namespace sm90 {
cudaError_t LaunchVariant0(const LaunchCtx&) { return cudaErrorNotSupported; }
cudaError_t LaunchVariant1(const LaunchCtx&) { return cudaErrorNotSupported; }
cudaError_t LaunchVariant2(const LaunchCtx&) { return cudaErrorNotSupported; }
cudaError_t LaunchVariant3(const LaunchCtx&) { return cudaErrorNotSupported; }
cudaError_t LaunchVariant4(const LaunchCtx&) { return cudaErrorNotSupported; }
cudaError_t PrepareVariant0() { return cudaErrorNotSupported; }
cudaError_t PrepareVariant1() { return cudaErrorNotSupported; }
cudaError_t PrepareVariant2() { return cudaErrorNotSupported; }
cudaError_t PrepareVariant3() { return cudaErrorNotSupported; }
cudaError_t PrepareVariant4() { return cudaErrorNotSupported; }
}  // namespace sm90
}  // namespace jga

int main() {
  using namespace jga;
  using namespace jga::sm90;
  constexpr int kSms = 132;  // H200
  char line[256];
  while (fgets(line, sizeof line, stdin) != nullptr) {
    long long m, n, k;
    int fmt = 0;
    if (sscanf(line, "%lld %lld %lld %d", &m, &n, &k, &fmt) < 3) continue;
    GemmAmaxProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.c_type = OutputType::kBF16;
    if (fmt > 0) {
      p.ab_type = OperandType::kE2M1x2;
      p.sf_vec_size = fmt == 1 ? 32 : 16;
      p.sf_type = fmt == 1 ? ScaleType::kE8M0 : ScaleType::kE4M3;
    }
    if (const char* why = Unsupported(p)) {
      printf("%lldx%lldx%lld/%d unsupported: %s\n", m, n, k, fmt, why);
      continue;
    }
    int pre = 0;
    const Plan plan = PlanOf(p, kSms, LaunchOptions{}, WorkspaceBytes(p, true), &pre);
    printf("%lldx%lldx%lld/%d %d/%d/%d%s%s%s\n", m, n, k, fmt, 128 * plan.mi, plan.splits, plan.whole_tiles,
           pre ? "+" : "", (pre & kPreA) ? "A" : "", (pre & kPreB) ? "B" : "");
  }
  return 0;
}
