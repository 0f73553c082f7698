// Maps a gemm_amax problem to one of the instantiated SM100 kernel configurations.
//
// The deliberate set of instantiations (one translation unit each; measured on 2 cores with nvcc
// 13.0: 30-55 s and 3.5-4.6 GB of compiler memory per TU, about 4-5 minutes for all of them one at
// a time):
//
//   operand format                          tile 128x128           tile 128x256    tile 256x128 (2-SM)
//   FP8 e4m3 | e5m2, e8m0, sfv 32 (MXFP8)   kMxf8_128x128          kMxf8_128x256   kMxf8_256x128
//   FP4 e2m1, e4m3 scales, sfv 16 (NVFP4)   kNvf4_128x128          kNvf4_128x256   -
//   FP4 e2m1, e8m0 scales, sfv 32 (MXFP4)   kMxf4_128x128          -               -
//   FP4 e2m1, e8m0 scales, sfv 16           kFp4E8m0Sfv16_128x128  -               -
//
// Why this set and not the cross product:
// - e4m3 and e5m2 share one kernel: CUTLASS's type-erased MX FP8 element sets the tcgen05
//   instruction descriptor's A/B format at run time (same smem layout, same TMA, same instruction
//   kind::mxf8f6f4), so the FP8 formats cost one instantiation per tile, not two.
// - The three FP4 scale flavours are different instructions (scale_vec::2X vs 4X) or scale types
//   in the descriptor that CUTLASS fixes at compile time: one instantiation each.
// - The output dtype is a run-time switch in the epilogue (sm100_kernel.cuh), not a template
//   parameter: one kernel serves all six c_dtypes.
// - The cluster shape is dynamic (Shape<int, int, _1>): every cluster_shape_mn in {1, 2, 4}^2 is
//   a launch argument of the same kernel.
// - mma_tiler_mn = (128, 256) is built for the two formats most used for large GEMMs (MXFP8 and
//   NVFP4); the other FP4 flavours answer it with Unsupported() (use (128, 128)).
// - TILE_M = 256 (the 2-SM cta_group::2 path, which NVIDIA's cuDNN-frontend op disables) is built
//   once, for MXFP8 with TILE_N = 128, to have the path compiled and dispatchable; it needs an even
//   CLUSTER_M.
#include <cuda_runtime.h>

#include <climits>

#include "cuda/sm100/gemm_amax_sm100.h"
#include "cuda/sm100/sm100_configs.h"

namespace jga {
namespace sm100 {
namespace {

enum class Format { kInvalid, kMxf8, kMxf4, kNvf4, kFp4E8m0Sfv16 };

Format FormatOf(const GemmAmaxProblem& p) {
  const bool fp4 = p.fp4_operands();
  if (!fp4) { return (p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) ? Format::kMxf8 : Format::kInvalid; }
  if (p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return Format::kMxf4;
  if (p.sf_type == ScaleType::kE4M3 && p.sf_vec_size == 16) return Format::kNvf4;
  if (p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 16) return Format::kFp4E8m0Sfv16;
  return Format::kInvalid;
}

bool IsWideOutput(OutputType t) { return t == OutputType::kF32 || t == OutputType::kF16 || t == OutputType::kBF16; }

// The configuration for `p`, or nullptr with *why set.
const ConfigFns* Select(const GemmAmaxProblem& p, const char** why) {
  auto no = [&](const char* reason) -> const ConfigFns* {
    *why = reason;
    return nullptr;
  };
  if (const char* reason = ContractViolation(p)) return no(reason);  // checked by the handler; direct callers not
  const Format format = FormatOf(p);
  switch (format) {
    case Format::kInvalid:
      return no(p.fp4_operands()
                    ? "fp4 a/b need e8m0 scales with sf_vec_size 32 or 16, or e4m3 scales with sf_vec_size 16"
                    : "fp8 a/b need e8m0 scales with sf_vec_size 32");
    default: break;
  }
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || p.batch > INT_MAX)
    return no("L, M, N and K must each be below 2^31 for the sm_100 kernel");

  // Tuning hints (mma_tiler_mn, cluster_shape_mn), with NVIDIA cuDNN frontend's rules.
  if (p.tile_m != 128 && p.tile_m != 256) return no("mma_tiler_mn: TILE_M must be 128 or 256");
  if (p.tile_n != 128 && p.tile_n != 256) return no("mma_tiler_mn: TILE_N must be 128 or 256");
  auto cluster_ok = [](int32_t v) { return v == 1 || v == 2 || v == 4; };
  if (!cluster_ok(p.cluster_m) || !cluster_ok(p.cluster_n))
    return no("cluster_shape_mn: CLUSTER_M and CLUSTER_N must each be 1, 2 or 4");
  if (p.tile_m == 256) {
    if (format != Format::kMxf8 || p.tile_n != 128)
      return no(
          "mma_tiler_mn: TILE_M = 256 (2-SM tiles) is built on sm_100 only for fp8 a/b with TILE_N = 128; "
          "use TILE_M = 128");
    if (p.cluster_m % 2 != 0) return no("mma_tiler_mn: TILE_M = 256 (2-SM tiles) needs CLUSTER_M = 2 or 4");
    return &kMxf8_256x128;
  }
  const bool fp4 = p.fp4_operands();
  if (fp4 && p.tile_n == 256 && p.k <= 128) return no("mma_tiler_mn: FP4 a/b with TILE_N = 256 requires K > 128");
  if (p.tile_n == 256 && p.sf_vec_size == 16 && IsWideOutput(p.c_type))
    return no("mma_tiler_mn=(128, 256) with sf_vec_size=16 and a float32/float16/bfloat16 c is not supported");

  if (p.tile_n == 128) {
    switch (format) {
      case Format::kMxf8: return &kMxf8_128x128;
      case Format::kMxf4: return &kMxf4_128x128;
      case Format::kNvf4: return &kNvf4_128x128;
      case Format::kFp4E8m0Sfv16: return &kFp4E8m0Sfv16_128x128;
      default: break;
    }
  } else {
    switch (format) {
      case Format::kMxf8: return &kMxf8_128x256;
      case Format::kNvf4: return &kNvf4_128x256;
      case Format::kMxf4:
        return no(
            "mma_tiler_mn=(128, 256) is not built for MXFP4 (fp4 a/b, e8m0 scales, sf_vec_size 32) on sm_100; "
            "use (128, 128)");
      case Format::kFp4E8m0Sfv16:
        return no(
            "mma_tiler_mn=(128, 256) is not built for fp4 a/b with e8m0 scales and sf_vec_size 16 on sm_100; "
            "use (128, 128)");
      default: break;
    }
  }
  return no("no sm_100 kernel for this problem");
}

}  // namespace

const char* Unsupported(const GemmAmaxProblem& p) {
  const char* why = nullptr;
  return Select(p, &why) ? nullptr : why;
}

size_t WorkspaceBytes(const GemmAmaxProblem& p) {
  const char* why = nullptr;
  const ConfigFns* config = Select(p, &why);
  return config ? config->workspace(p) : 0;
}

cudaError_t Prepare() {
  for (const ConfigFns* config : {&kMxf8_128x128, &kMxf8_128x256, &kMxf8_256x128, &kMxf4_128x128, &kNvf4_128x128,
                                  &kNvf4_128x256, &kFp4E8m0Sfv16_128x128}) {
    const cudaError_t err = config->prepare();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, cudaStream_t stream,
                   const char** error_message) {
  const char* why = nullptr;
  const ConfigFns* config = Select(p, &why);
  if (config == nullptr) {
    if (error_message) *error_message = why;
    return cudaErrorNotSupported;
  }
  return config->launch(p, buf, workspace, stream, error_message);
}

}  // namespace sm100
}  // namespace jga
