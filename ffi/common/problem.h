// The gemm_amax problem description shared by every backend.
//
//   C[l,m,n] = sum_g (sum_{k in g} A[l,m,k] * B[l,n,k]) * SFA(l,m,g) * SFB(l,n,g)   (fp32)
//   amax[l]  = max |C[l,:,:]| on the fp32 accumulator, before C is rounded to its dtype
//
// g runs over the K groups of sf_vec_size elements; how the combined scale is applied without
// intermediate over- or underflow is in numerics.h.
//
// Weight-only problems (a_type bf16/f16): A is unscaled activations, there is no SFA, and
//   C[l,m,n] = sum_g (sum_{k in g} A[l,m,k] * B[l,n,k]) * SFB(l,n,g)              (fp32)
// the same arithmetic with SFA = 1 (bf16/f16 x FP8/FP4 products are exact in fp32).
//
// A is (L, M, K) and B is (L, N, K), both K-major and C-contiguous. FP4 operands are always
// packed two per byte here (low nibble = even k); the Python layer packs `float4_e2m1fn`
// arrays before the call, so kernels see one FP4 representation only.
// Transposed output (c_major="m") is produced by the caller swapping A and B: kernels always
// write C row-major (L, M, N).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define JGA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JGA_HOST_DEVICE inline
#endif

namespace jga {

enum class OperandType : int32_t { kE4M3 = 0, kE5M2 = 1, kE2M1x2 = 2 };
// A's element type where it differs from B's: kNarrow means A is block-scaled like B (ab_type);
// kBF16/kF16 make the problem weight-only (A (L, M, K) in 16-bit values, no SFA).
enum class ActivationType : int32_t { kNarrow = 0, kBF16 = 1, kF16 = 2 };
enum class ScaleType : int32_t { kE8M0 = 0, kE4M3 = 1 };
enum class OutputType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4, kE2M1x2 = 5 };

JGA_HOST_DEVICE constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bits of one stored element of C (packed FP4 holds two per byte).
JGA_HOST_DEVICE constexpr int OutputBits(OutputType t) {
  switch (t) {
    case OutputType::kF32: return 32;
    case OutputType::kF16:
    case OutputType::kBF16: return 16;
    case OutputType::kE4M3:
    case OutputType::kE5M2: return 8;
    case OutputType::kE2M1x2: return 4;
  }
  return 0;
}

// Scale-factor layout constants (the cuBLAS / CUTLASS "128x4" block layout).
inline constexpr int64_t kScaleRowsPerBlock = 128;  // rows (m or n) per scale block
inline constexpr int64_t kScaleGroupsPerBlock = 4;  // K groups per scale block
inline constexpr int64_t kScaleBlockElems = 512;    // 32 x 4 x 4 bytes per block

struct GemmAmaxProblem {
  int64_t batch = 1;  // L
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;                             // logical K (elements, not bytes)
  OperandType ab_type = OperandType::kE4M3;  // B's, and A's unless weight-only
  ActivationType a_type = ActivationType::kNarrow;
  ScaleType sf_type = ScaleType::kE8M0;
  int32_t sf_vec_size = 32;
  OutputType c_type = OutputType::kF32;
  // Tuning hints from the caller (mma_tiler_mn / cluster_shape_mn); kernels may ignore them.
  int32_t tile_m = 128;
  int32_t tile_n = 128;
  int32_t cluster_m = 1;
  int32_t cluster_n = 1;

  JGA_HOST_DEVICE int64_t k_groups() const { return k / sf_vec_size; }
  JGA_HOST_DEVICE int64_t k_blocks() const { return CeilDiv(k_groups(), kScaleGroupsPerBlock); }
  JGA_HOST_DEVICE int64_t row_blocks(int64_t rows) const { return CeilDiv(rows, kScaleRowsPerBlock); }
  // Bytes of one scale tensor per batch item for an operand with `rows` rows.
  JGA_HOST_DEVICE int64_t scale_batch_stride(int64_t rows) const {
    return row_blocks(rows) * k_blocks() * kScaleBlockElems;
  }
  // FP4 operands (two codes per byte).
  JGA_HOST_DEVICE bool fp4_operands() const { return ab_type == OperandType::kE2M1x2; }
  JGA_HOST_DEVICE int64_t operand_row_bytes() const { return fp4_operands() ? k / 2 : k; }
  JGA_HOST_DEVICE bool weight_only() const { return a_type != ActivationType::kNarrow; }
  JGA_HOST_DEVICE int64_t a_row_bytes() const { return weight_only() ? 2 * k : operand_row_bytes(); }
  // Elements of C's minor dimension as stored (packed FP4 stores two per byte).
  JGA_HOST_DEVICE int64_t c_row_storage_elems() const { return c_type == OutputType::kE2M1x2 ? n / 2 : n; }
  JGA_HOST_DEVICE int64_t c_row_bytes() const { return n * OutputBits(c_type) / 8; }
};

// The contract's rules on a problem (formats, sizes, alignment), the one place they are checked
// for every backend: nullptr if `p` satisfies them, else why not. The FFI decoding
// (ffi_problem.cc) calls it; each kernel library's own support check adds only its own limits.
// Header-only (host), so that a kernel library linked on its own (the kernel tests) has it too.
inline const char* ContractViolation(const GemmAmaxProblem& p) {
  if (p.batch < 1 || p.m < 1 || p.n < 1 || p.k < 1) return "L, M, N and K must be at least 1";
  if (p.sf_vec_size != 16 && p.sf_vec_size != 32) return "sf_vec_size must be 16 or 32";
  if (p.sf_type == ScaleType::kE4M3 && p.sf_vec_size != 16) return "float8_e4m3fn scales require sf_vec_size=16";
  if (!p.fp4_operands() && p.sf_vec_size != 32) return "fp8 a/b require sf_vec_size=32";
  if (OutputBits(p.c_type) == 0) return "unknown c dtype";
  if (p.c_type == OutputType::kE2M1x2 && !p.fp4_operands()) return "fp4 c requires fp4 a/b";
  if (p.k % p.sf_vec_size != 0) return "K must be a multiple of sf_vec_size";
  if (p.operand_row_bytes() % 16 != 0) return "rows of a and b must be 16-byte aligned";
  if ((p.n * OutputBits(p.c_type)) % 128 != 0) return "rows of c must be 16-byte aligned";
  return nullptr;
}

// Offset of the scale of row `row` and K group `group` inside one batch item of a physical
// scale tensor (L, ceil(rows/128), ceil(groups/4), 32, 4, 4):
//   [row / 128, group / 4, row % 32, (row % 128) / 32, group % 4]
JGA_HOST_DEVICE constexpr int64_t ScaleOffset(int64_t row, int64_t group, int64_t k_blocks) {
  return ((row / 128) * k_blocks + group / 4) * kScaleBlockElems + (row % 32) * 16 + ((row % 128) / 32) * 4 + group % 4;
}

// Device-agnostic pointers of one call. amax holds one float per batch item.
struct GemmAmaxBuffers {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* sfa = nullptr;  // null for weight-only problems
  const void* sfb = nullptr;
  void* c = nullptr;
  float* amax = nullptr;
};

}  // namespace jga
