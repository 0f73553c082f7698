// The quantize op shared by every backend that runs it as a kernel (the CUDA one; the CPU path is
// jnp, jax_gemm_amax/quantize.py, which defines the arithmetic).
//
//   x (L, R, K) float32 / float16 / bfloat16, C-contiguous.
//   rowwise (along K):    q (L, R, K) [packed FP4: K / 2 bytes], scales (L, R', ceil(K/sfv/4), 32, 4, 4)
//   columnwise (along R): q (L, K, R) [packed FP4: R / 2 bytes], scales (L, K', ceil(R/sfv/4), 32, 4, 4)
//   amax (L,) float32: max |x| per batch item (NaN if the item holds a NaN)
// R' = ceil(rows / 128) of the output's rows. The pair mode writes both, rowwise first.
#pragma once

#include <cstdint>

#include "problem.h"

namespace jga {

// Numbered as jax_gemm_amax/primitives/quantize.py passes them.
enum class QuantizeFormat : int32_t { kMxfp8E4M3 = 0, kMxfp8E5M2 = 1, kMxfp4 = 2, kNvfp4 = 3 };
enum class QuantizeInput : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
// Bit set: which orientations a call writes.
enum QuantizeMode : int32_t { kQuantizeRows = 1, kQuantizeCols = 2, kQuantizePair = 3 };

struct QuantizeProblem {
  int64_t batch = 1;  // L
  int64_t rows = 0;   // R
  int64_t k = 0;      // K (x's last dim)
  QuantizeFormat format = QuantizeFormat::kMxfp8E4M3;
  QuantizeInput input = QuantizeInput::kF32;
  int32_t mode = kQuantizeRows;

  JGA_HOST_DEVICE bool fp4() const { return format == QuantizeFormat::kMxfp4 || format == QuantizeFormat::kNvfp4; }
  JGA_HOST_DEVICE int32_t sf_vec_size() const { return format == QuantizeFormat::kNvfp4 ? 16 : 32; }
  JGA_HOST_DEVICE int32_t input_bytes() const { return input == QuantizeInput::kF32 ? 4 : 2; }
  // Stored bytes of `n` quantized elements.
  JGA_HOST_DEVICE int64_t code_bytes(int64_t n) const { return fp4() ? n / 2 : n; }
  // Physical scale blocks of an output with `out_rows` rows quantized along `len` elements.
  JGA_HOST_DEVICE int64_t row_blocks(int64_t out_rows) const { return CeilDiv(out_rows, kScaleRowsPerBlock); }
  JGA_HOST_DEVICE int64_t k_blocks(int64_t len) const { return CeilDiv(len / sf_vec_size(), kScaleGroupsPerBlock); }
};

// Device pointers of one call; the orientations the mode leaves out are null.
struct QuantizeBuffers {
  const void* x = nullptr;
  void* q_row = nullptr;
  void* s_row = nullptr;
  void* q_col = nullptr;
  void* s_col = nullptr;
  float* amax = nullptr;
};

}  // namespace jga
