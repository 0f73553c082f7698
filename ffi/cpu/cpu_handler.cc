// The XLA FFI handler of the CPU platform.
#include <exception>
#include <string>

#include "common/ffi_problem.h"
#include "cpu/gemm_amax_cpu.h"

namespace jga {
namespace {

ffi::Error GemmAmaxCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer sfa, ffi::AnyBuffer sfb,
                           ffi::Result<ffi::AnyBuffer> c, ffi::Result<ffi::AnyBuffer> amax, int32_t sf_vec_size,
                           int32_t tile_m, int32_t tile_n, int32_t cluster_m, int32_t cluster_n) {
  GemmAmaxProblem problem;
  const GemmAmaxHints hints{tile_m, tile_n, cluster_m, cluster_n};
  ffi::Error status = DescribeProblem(a, b, sfa, sfb, *c, *amax, sf_vec_size, hints, &problem);
  if (status.failure()) return status;
  try {
    cpu::Run(problem, BuffersOf(a, b, sfa, sfb, *c, *amax));
  } catch (const std::exception& e) {  // e.g. std::bad_alloc for the dequantized operands
    return ffi::Error::Internal(std::string("gemm_amax (cpu): ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error GemmAmaxWeightOnlyCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer sfb,
                                     ffi::Result<ffi::AnyBuffer> c, ffi::Result<ffi::AnyBuffer> amax,
                                     int32_t sf_vec_size, int32_t tile_m, int32_t tile_n, int32_t cluster_m,
                                     int32_t cluster_n) {
  GemmAmaxProblem problem;
  const GemmAmaxHints hints{tile_m, tile_n, cluster_m, cluster_n};
  ffi::Error status = DescribeWeightOnlyProblem(a, b, sfb, *c, *amax, sf_vec_size, hints, &problem);
  if (status.failure()) return status;
  try {
    cpu::Run(problem, WeightOnlyBuffersOf(a, b, sfb, *c, *amax));
  } catch (const std::exception& e) { return ffi::Error::Internal(std::string("gemm_amax (cpu): ") + e.what()); }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jga

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaGemmAmaxCpu, jga::GemmAmaxCpuImpl, xla::ffi::Ffi::Bind() JGA_GEMM_AMAX_BINDING_ARGS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaGemmAmaxWeightOnlyCpu, jga::GemmAmaxWeightOnlyCpuImpl,
                              xla::ffi::Ffi::Bind() JGA_GEMM_AMAX_WEIGHT_ONLY_BINDING_ARGS);
