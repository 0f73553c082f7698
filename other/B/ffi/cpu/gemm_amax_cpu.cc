// CPU kernel: dequantize each operand once to fp32 (exact: narrow value x scale fits fp32),
// then a blocked, multithreaded fp32 GEMM over K-major rows with a register-blocked
// micro-kernel, and an epilogue that reduces amax on the fp32 sums before rounding C.
#include "cpu/gemm_amax_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/numerics.h"

namespace jga::cpu {
namespace {

constexpr int64_t kMR = 3;         // rows of A per micro-kernel
constexpr int64_t kNR = 4;         // rows of B per micro-kernel
constexpr int64_t kVec = 8;        // floats per vector lane group
constexpr int64_t kTileM = 48;     // multiple of kMR
constexpr int64_t kTileN = 64;     // multiple of kNR
constexpr int64_t kBlockK = 256;   // multiple of kVec; keeps a tile's K slice in L1/L2

typedef float Vec8 __attribute__((vector_size(kVec * sizeof(float))));

template <typename Fn>
void ParallelFor(int64_t count, Fn&& fn) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>(hw, count);
  if (workers <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int64_t t = 0; t + 1 < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
}

// NaN-propagating max of |x|.
inline float AbsMax(float acc, float x) {
  const float ax = std::fabs(x);
  return (std::isnan(ax) || ax > acc) ? ax : acc;
}

// Dequantizes `rows` rows of one operand of one batch item into fp32, K padded to `k_pad`
// with zeros; rows past `rows` (up to the padded row count) are zero.
void Dequantize(const GemmAmaxProblem& p, const uint8_t* values, const uint8_t* scales, int64_t rows,
                int64_t row, int64_t k_pad, float* out) {
  const int64_t row_bytes = p.operand_row_bytes();
  const int64_t sfv = p.sf_vec_size;
  const int64_t k_blocks = p.k_blocks();
  if (row >= rows) {
    std::memset(out, 0, sizeof(float) * k_pad);
    return;
  }
  const uint8_t* src = values + row * row_bytes;
  for (int64_t g = 0; g < p.k_groups(); ++g) {
    const float scale = DecodeScale(p.sf_type, scales[ScaleOffset(row, g, k_blocks)]);
    float* dst = out + g * sfv;
    if (p.fp4_operands()) {
      const uint8_t* s = src + g * sfv / 2;
      for (int64_t i = 0; i < sfv / 2; ++i) {
        dst[2 * i] = DecodeE2M1(s[i] & 0xF) * scale;
        dst[2 * i + 1] = DecodeE2M1(s[i] >> 4) * scale;
      }
    } else {
      const uint8_t* s = src + g * sfv;
      for (int64_t i = 0; i < sfv; ++i) dst[i] = DecodeOperand(p.ab_type, s[i]) * scale;
    }
  }
  std::memset(out + p.k, 0, sizeof(float) * (k_pad - p.k));
}

// acc[r][c] += dot(a[r], b[c]) over `k_len` (a multiple of kVec) floats.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void MicroKernel(const float* a, const float* b, int64_t ld, int64_t k_len, float* out, int64_t ld_out) {
  Vec8 acc[kMR][kNR] = {};
  for (int64_t k = 0; k < k_len; k += kVec) {
    Vec8 av[kMR];
    for (int64_t r = 0; r < kMR; ++r) std::memcpy(&av[r], a + r * ld + k, sizeof(Vec8));
    for (int64_t c = 0; c < kNR; ++c) {
      Vec8 bv;
      std::memcpy(&bv, b + c * ld + k, sizeof(Vec8));
      for (int64_t r = 0; r < kMR; ++r) acc[r][c] += av[r] * bv;
    }
  }
  for (int64_t r = 0; r < kMR; ++r)
    for (int64_t c = 0; c < kNR; ++c) {
      float s = 0.0f;
      for (int64_t v = 0; v < kVec; ++v) s += acc[r][c][v];
      out[r * ld_out + c] += s;
    }
}

// Writes one row of fp32 sums to C in the output dtype.
void StoreRow(OutputType type, const float* src, int64_t count, void* dst_row, int64_t col0) {
  switch (type) {
    case OutputType::kF32:
      std::memcpy(static_cast<float*>(dst_row) + col0, src, sizeof(float) * count);
      break;
    case OutputType::kF16:
      for (int64_t j = 0; j < count; ++j) static_cast<uint16_t*>(dst_row)[col0 + j] = EncodeF16(src[j]);
      break;
    case OutputType::kBF16:
      for (int64_t j = 0; j < count; ++j) static_cast<uint16_t*>(dst_row)[col0 + j] = EncodeBF16(src[j]);
      break;
    case OutputType::kE4M3:
      for (int64_t j = 0; j < count; ++j) static_cast<uint8_t*>(dst_row)[col0 + j] = EncodeE4M3(src[j]);
      break;
    case OutputType::kE5M2:
      for (int64_t j = 0; j < count; ++j) static_cast<uint8_t*>(dst_row)[col0 + j] = EncodeE5M2(src[j]);
      break;
    case OutputType::kE2M1x2:  // col0 and count are even (tiles are multiples of 4, N is even)
      for (int64_t j = 0; j < count; j += 2) {
        const uint8_t lo = EncodeE2M1(src[j]);
        const uint8_t hi = j + 1 < count ? EncodeE2M1(src[j + 1]) : 0;
        static_cast<uint8_t*>(dst_row)[(col0 + j) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      break;
  }
}

}  // namespace

void Run(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf) {
  const int64_t m_pad = CeilDiv(p.m, kMR) * kMR;
  const int64_t n_pad = CeilDiv(p.n, kNR) * kNR;
  const int64_t k_pad = CeilDiv(p.k, kVec) * kVec;
  const int64_t row_bytes = p.operand_row_bytes();
  const auto* a_bytes = static_cast<const uint8_t*>(buf.a);
  const auto* b_bytes = static_cast<const uint8_t*>(buf.b);
  const auto* sfa_bytes = static_cast<const uint8_t*>(buf.sfa);
  const auto* sfb_bytes = static_cast<const uint8_t*>(buf.sfb);

  std::vector<float> a_f32(static_cast<size_t>(m_pad * k_pad));
  std::vector<float> b_f32(static_cast<size_t>(n_pad * k_pad));
  const int64_t tiles_m = CeilDiv(p.m, kTileM);
  const int64_t tiles_n = CeilDiv(p.n, kTileN);
  std::vector<float> tile_amax(static_cast<size_t>(tiles_m * tiles_n));
  const int64_t c_row_bytes = p.c_row_bytes();

  for (int64_t l = 0; l < p.batch; ++l) {
    const uint8_t* a_l = a_bytes + l * p.m * row_bytes;
    const uint8_t* b_l = b_bytes + l * p.n * row_bytes;
    const uint8_t* sfa_l = sfa_bytes + l * p.scale_batch_stride(p.m);
    const uint8_t* sfb_l = sfb_bytes + l * p.scale_batch_stride(p.n);
    ParallelFor(m_pad + n_pad, [&](int64_t r) {
      if (r < m_pad) {
        Dequantize(p, a_l, sfa_l, p.m, r, k_pad, a_f32.data() + r * k_pad);
      } else {
        r -= m_pad;
        Dequantize(p, b_l, sfb_l, p.n, r, k_pad, b_f32.data() + r * k_pad);
      }
    });

    auto* c_l = static_cast<uint8_t*>(buf.c) + l * p.m * c_row_bytes;
    ParallelFor(tiles_m * tiles_n, [&](int64_t t) {
      const int64_t i0 = (t / tiles_n) * kTileM;
      const int64_t j0 = (t % tiles_n) * kTileN;
      const int64_t i1 = std::min(i0 + kTileM, m_pad);
      const int64_t j1 = std::min(j0 + kTileN, n_pad);
      float acc[kTileM * kTileN] = {};
      for (int64_t k0 = 0; k0 < k_pad; k0 += kBlockK) {
        const int64_t k_len = std::min(kBlockK, k_pad - k0);
        for (int64_t i = i0; i < i1; i += kMR)
          for (int64_t j = j0; j < j1; j += kNR)
            MicroKernel(a_f32.data() + i * k_pad + k0, b_f32.data() + j * k_pad + k0, k_pad, k_len,
                        acc + (i - i0) * kTileN + (j - j0), kTileN);
      }
      float amax = 0.0f;
      const int64_t rows = std::min(i1, p.m) - i0;
      const int64_t cols = std::min(j1, p.n) - j0;
      for (int64_t i = 0; i < rows; ++i) {
        const float* row = acc + i * kTileN;
        for (int64_t j = 0; j < cols; ++j) amax = AbsMax(amax, row[j]);
        StoreRow(p.c_type, row, cols, c_l + (i0 + i) * c_row_bytes, j0);
      }
      tile_amax[t] = amax;
    });

    float amax = 0.0f;
    for (float v : tile_amax) amax = AbsMax(amax, v);
    buf.amax[l] = amax;
  }
}

}  // namespace jga::cpu
