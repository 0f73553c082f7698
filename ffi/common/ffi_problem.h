// Decoding and validation of one gemm_amax FFI call, shared by the CPU and CUDA handlers.
// The Python layer raises the same errors at trace time; this is the last line of defence
// against a malformed custom call (it returns an ffi::Error, never crashes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "problem.h"
#include "xla/ffi/api/ffi.h"

namespace jga {

namespace ffi = xla::ffi;

// Tuning hints passed as attributes (validated in Python against NVIDIA cuDNN frontend's allowed values).
struct GemmAmaxHints {
  int32_t tile_m = 128;
  int32_t tile_n = 128;
  int32_t cluster_m = 1;
  int32_t cluster_n = 1;
};

// The operand and scale types of problem.h that an XLA element type stands for, as every handler
// reads them: packed FP4 operands are uint8, int8 and uint8 scales hold e8m0 bits. False for any
// other element type.
bool OperandTypeOf(ffi::DataType dtype, OperandType* type);
bool ScaleTypeOf(ffi::DataType dtype, ScaleType* type);

// The same for dtype names as numpy spells them ("float8_e4m3fn"), for host-side questions asked
// before any buffer exists (the workspace the JAX lowering gives a call). float4_e2m1fn operands
// are the packed uint8 ones the kernels see. The error names the argument and what it got.
ffi::Error OperandTypeNamed(std::string_view name, OperandType* type);
ffi::Error ScaleTypeNamed(std::string_view name, ScaleType* type);

// "(2, 3)" / "(4,)": a shape as error messages print it (without iostreams, whose locale state a
// handler called from XLA's threads must not depend on), and whether `dims` is `want`.
std::string ShapeString(ffi::Span<const int64_t> dims);
inline std::string ShapeString(const std::vector<int64_t>& v) { return ShapeString({v.data(), v.size()}); }
bool ShapeIs(ffi::Span<const int64_t> dims, const std::vector<int64_t>& want);

// Arguments, in order: a (L, M, Kbytes), b (L, N, Kbytes), sfa, sfb (L, rows/128, kblocks, 32, 4, 4).
// Results: c (L, M, N or N/2), amax (L,) float32.
ffi::Error DescribeProblem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfa,
                           const ffi::AnyBuffer& sfb, const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax,
                           int32_t sf_vec_size, const GemmAmaxHints& hints, GemmAmaxProblem* problem);

GemmAmaxBuffers BuffersOf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfa,
                          const ffi::AnyBuffer& sfb, const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax);

// Weight-only calls: a (L, M, K) bfloat16 or float16, no sfa; the rest as above.
ffi::Error DescribeWeightOnlyProblem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfb,
                                     const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax, int32_t sf_vec_size,
                                     const GemmAmaxHints& hints, GemmAmaxProblem* problem);

GemmAmaxBuffers WeightOnlyBuffersOf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfb,
                                    const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax);

}  // namespace jga

// The FFI binding of the handler signature: operands, then results, then attributes. The CUDA
// handler adds a third result between them, its workspace (see cuda_handler.cc). Every stage of a
// call sees the same attributes, so each stage's binding declares them all.
#define JGA_GEMM_AMAX_BINDING_ATTRS \
  .Attr<int32_t>("sf_vec_size")     \
      .Attr<int32_t>("tile_m")      \
      .Attr<int32_t>("tile_n")      \
      .Attr<int32_t>("cluster_m")   \
      .Attr<int32_t>("cluster_n")

#define JGA_GEMM_AMAX_BINDING_BUFFERS       \
  .Arg<xla::ffi::AnyBuffer>()     /* a */   \
      .Arg<xla::ffi::AnyBuffer>() /* b */   \
      .Arg<xla::ffi::AnyBuffer>() /* sfa */ \
      .Arg<xla::ffi::AnyBuffer>() /* sfb */ \
      .Ret<xla::ffi::AnyBuffer>() /* c */   \
      .Ret<xla::ffi::AnyBuffer>() /* amax, one per batch item */

#define JGA_GEMM_AMAX_BINDING_ARGS JGA_GEMM_AMAX_BINDING_BUFFERS JGA_GEMM_AMAX_BINDING_ATTRS

// Weight-only: a, b, sfb, then the same results and attributes.
#define JGA_GEMM_AMAX_WEIGHT_ONLY_BINDING_ARGS                   \
  .Arg<xla::ffi::AnyBuffer>()     /* a, bfloat16 or float16 */   \
      .Arg<xla::ffi::AnyBuffer>() /* b */                        \
      .Arg<xla::ffi::AnyBuffer>() /* sfb */                      \
      .Ret<xla::ffi::AnyBuffer>() /* c */                        \
      .Ret<xla::ffi::AnyBuffer>() /* amax, one per batch item */ \
      JGA_GEMM_AMAX_BINDING_ATTRS
