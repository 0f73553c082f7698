// CPU kernel, the block-scaled hardware's semantics: per K group (sf_vec_size elements) the dot of
// the narrow values, summed in fp32 (their products are exact in fp32), times the group's combined
// scale, accumulated in fp32. The scale is never folded into an element, so a C that fp32 holds
// comes out right for any pair of scales (448 * 2^127 * 2^-127, or subnormal results).
//
// Weight-only problems run the same code with A's 16-bit values (exact in fp32) and unit scales.
//
// Operands are decoded to fp32 values once and packed in panels (A: kMR rows, B: kNR columns,
// K outermost); the register-blocked micro-kernel holds kMR x kNR block dots in vector lanes
// that run along N, so one group's scales fold in as whole vectors.
#include "cpu/gemm_amax_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "common/numerics.h"

namespace jga::cpu {
namespace {

constexpr int64_t kVec = 8;        // floats per vector
constexpr int64_t kMR = 6;         // rows of A per micro-kernel
constexpr int64_t kNR = 2 * kVec;  // columns of B per micro-kernel: 12 accumulators + 3 operands fit 16 ymm
constexpr int64_t kTileM = 48;     // multiple of kMR
constexpr int64_t kTileN = 128;    // multiple of kNR
constexpr int64_t kBlockK = 256;   // multiple of every sf_vec_size; keeps a tile's K slice in L1/L2

typedef float Vec8 __attribute__((vector_size(kVec * sizeof(float))));

// The IEEE subnormal behaviour for the lifetime of the object: XLA's CPU threads run with
// flush-to-zero and denormals-are-zero, which would flush subnormal scales, terms and results.
class ScopedSubnormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(kFtz | kDaz)); }
  ~ScopedSubnormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  unsigned saved_;
#elif defined(__aarch64__)
  ScopedSubnormals() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t ieee = saved_ & ~kFlush;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
  }
  ~ScopedSubnormals() { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_)); }

 private:
  static constexpr uint64_t kFlush = (uint64_t{1} << 24) | 1u;  // FZ, and FIZ where FEAT_AFP has it
  uint64_t saved_;
#else
#error "the CPU kernel needs a way to turn off flush-to-zero on this architecture"
#endif
  ScopedSubnormals(const ScopedSubnormals&) = delete;
  ScopedSubnormals& operator=(const ScopedSubnormals&) = delete;
};

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
    ScopedSubnormals ieee;  // every thread that computes, the caller included
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  try {
    for (int64_t t = 0; t + 1 < workers; ++t) threads.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads (a process or container limit): the ones started, and this one, take the
    // rest. Unwinding past the started ones would terminate the process.
  }
  work();
  for (auto& t : threads) t.join();
}

// NaN-propagating max of |x|.
inline float AbsMax(float acc, float x) {
  const float ax = std::fabs(x);
  return (std::isnan(ax) || ax > acc) ? ax : acc;
}

// A scale as two factors whose products with the other operand's factors split the combined
// scale in halves (numerics.h): e8m0 2^e gives (2^floor(e/2), 2^ceil(e/2)) on A and
// (2^ceil(e/2), 2^floor(e/2)) on B, so A1*B1 and A2*B2 are 2^floor(E/2) and 2^ceil(E/2), in some
// order (E = ea + eb), each in [2^-127, 2^127]: whole vectors of them per group cost two
// multiplies. e4m3 scales (sa * sb is exact and in range) use the first factor alone, and so do
// weight-only problems (`whole`): SFB's 2^e is itself an fp32 number (2^-127 a subnormal, which
// this kernel keeps), and one multiply rounds a group's term once, as the contract says.
struct ScalePair {
  float first, second;
};

inline ScalePair SplitScale(ScaleType type, uint8_t byte, bool is_a, bool whole) {
  if (type == ScaleType::kE4M3) return {DecodeE4M3(byte), 1.0f};
  if (byte == 0xFF) return {NAN, NAN};
  const int e = static_cast<int>(byte) - 127;
  if (whole) return {Pow2(e), 1.0f};
  const int lo = e >> 1, hi = e - lo;
  return is_a ? ScalePair{Pow2(lo), Pow2(hi)} : ScalePair{Pow2(hi), Pow2(lo)};
}

// One operand of one batch item, decoded and packed: panels of `width` rows (kMR for A, kNR for
// B), values [panel][k][width] and scale factors [panel][group][width]. Rows past `rows` are zero
// with unit scales.
struct Packed {
  std::vector<float> values, scale1, scale2;
};

void PackPanel(const GemmAmaxProblem& p, const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t width,
               bool is_a, int64_t panel, Packed* out) {
  const bool half = is_a && p.weight_only();  // 16-bit values, no scales
  const int64_t row_bytes = is_a ? p.a_row_bytes() : p.operand_row_bytes();
  const int64_t groups = p.k_groups();
  const int64_t k_blocks = p.k_blocks();
  float* dst = out->values.data() + panel * p.k * width;
  float* s1 = out->scale1.data() + panel * groups * width;
  float* s2 = out->scale2.data() + panel * groups * width;
  for (int64_t w = 0; w < width; ++w) {
    const int64_t row = panel * width + w;
    if (row >= rows) {
      for (int64_t k = 0; k < p.k; ++k) dst[k * width + w] = 0.0f;
      for (int64_t g = 0; g < groups; ++g) s1[g * width + w] = s2[g * width + w] = 1.0f;
      continue;
    }
    const uint8_t* src = values + row * row_bytes;
    if (half) {
      const bool bf16 = p.a_type == ActivationType::kBF16;
      for (int64_t k = 0; k < p.k; ++k) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * k, sizeof(bits));
        dst[k * width + w] = bf16 ? DecodeBF16(bits) : DecodeF16(bits);
      }
      for (int64_t g = 0; g < groups; ++g) s1[g * width + w] = s2[g * width + w] = 1.0f;
      continue;
    }
    if (p.fp4_operands()) {
      for (int64_t i = 0; i < p.k / 2; ++i) {
        dst[2 * i * width + w] = DecodeE2M1(src[i] & 0xF);
        dst[(2 * i + 1) * width + w] = DecodeE2M1(src[i] >> 4);
      }
    } else {
      for (int64_t k = 0; k < p.k; ++k) dst[k * width + w] = DecodeOperand(p.ab_type, src[k]);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const ScalePair s = SplitScale(p.sf_type, scales[ScaleOffset(row, g, k_blocks)], is_a, p.weight_only());
      s1[g * width + w] = s.first;
      s2[g * width + w] = s.second;
    }
  }
}

// out[r][c] += sum over `groups` groups g of blockdot_g(r, c) * (A1 B1)(g) * (A2 B2)(g), for a
// kMR x kNR block; a, b, a_s*, b_s* point at the first group's values and scale factors of
// the A and B panels.
template <int kSfv, bool kTwoFactors>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void MicroKernel(const float* a, const float* b, const float* a_s1, const float* a_s2, const float* b_s1,
                 const float* b_s2, int64_t groups, float* out, int64_t ld_out) {
  for (int64_t g = 0; g < groups; ++g) {
    Vec8 acc[kMR][2] = {};
    for (int k = 0; k < kSfv; ++k) {
      Vec8 b0, b1;
      std::memcpy(&b0, b, sizeof(Vec8));
      std::memcpy(&b1, b + kVec, sizeof(Vec8));
      for (int64_t r = 0; r < kMR; ++r) {
        acc[r][0] += a[r] * b0;
        acc[r][1] += a[r] * b1;
      }
      a += kMR;
      b += kNR;
    }
    Vec8 s1[2], s2[2], total;
    std::memcpy(s1, b_s1, sizeof(s1));
    std::memcpy(s2, b_s2, sizeof(s2));
    for (int64_t r = 0; r < kMR; ++r) {
      for (int64_t h = 0; h < 2; ++h) {
        Vec8 term = acc[r][h] * (a_s1[r] * s1[h]);
        if (kTwoFactors) term *= a_s2[r] * s2[h];
        // The term is rounded before it is added (the contract): through memory, the compiler
        // cannot fuse its multiply into the add (GCC contracts across statements by default). The
        // block dots above may fuse: their products are exact.
        asm("" : "+m"(term));
        float* o = out + r * ld_out + h * kVec;
        std::memcpy(&total, o, sizeof(Vec8));
        total += term;
        std::memcpy(o, &total, sizeof(Vec8));
      }
    }
    a_s1 += kMR;
    a_s2 += kMR;
    b_s1 += kNR;
    b_s2 += kNR;
  }
}

using MicroKernelFn = void (*)(const float*, const float*, const float*, const float*, const float*, const float*,
                               int64_t, float*, int64_t);

MicroKernelFn PickMicroKernel(const GemmAmaxProblem& p) {
  if (p.sf_type == ScaleType::kE4M3) return MicroKernel<16, false>;  // NVFP4: sf_vec_size 16
  if (p.weight_only()) return p.sf_vec_size == 16 ? MicroKernel<16, false> : MicroKernel<32, false>;
  return p.sf_vec_size == 16 ? MicroKernel<16, true> : MicroKernel<32, true>;
}

// Writes one row of fp32 sums to C in the output dtype.
void StoreRow(OutputType type, const float* src, int64_t count, void* dst_row, int64_t col0) {
  switch (type) {
    case OutputType::kF32: std::memcpy(static_cast<float*>(dst_row) + col0, src, sizeof(float) * count); break;
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
    case OutputType::kE2M1x2:  // col0 and count are even (tiles are multiples of 16, N is even)
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
  ScopedSubnormals ieee;  // the calling thread's share of the work and the amax reduction below
  const int64_t a_panels = CeilDiv(p.m, kMR);
  const int64_t b_panels = CeilDiv(p.n, kNR);
  const int64_t m_pad = a_panels * kMR;
  const int64_t n_pad = b_panels * kNR;
  const int64_t groups = p.k_groups();
  const int64_t sfv = p.sf_vec_size;
  const int64_t row_bytes = p.operand_row_bytes();
  const int64_t a_row_bytes = p.a_row_bytes();
  const auto* a_bytes = static_cast<const uint8_t*>(buf.a);
  const auto* b_bytes = static_cast<const uint8_t*>(buf.b);
  const auto* sfa_bytes = static_cast<const uint8_t*>(buf.sfa);
  const auto* sfb_bytes = static_cast<const uint8_t*>(buf.sfb);
  const MicroKernelFn micro_kernel = PickMicroKernel(p);

  Packed a_pack, b_pack;
  a_pack.values.resize(static_cast<size_t>(m_pad * p.k));
  b_pack.values.resize(static_cast<size_t>(n_pad * p.k));
  for (auto* v : {&a_pack.scale1, &a_pack.scale2}) v->resize(static_cast<size_t>(m_pad * groups));
  for (auto* v : {&b_pack.scale1, &b_pack.scale2}) v->resize(static_cast<size_t>(n_pad * groups));
  const int64_t tiles_m = CeilDiv(p.m, kTileM);
  const int64_t tiles_n = CeilDiv(p.n, kTileN);
  std::vector<float> tile_amax(static_cast<size_t>(tiles_m * tiles_n));
  const int64_t c_row_bytes = p.c_row_bytes();

  for (int64_t l = 0; l < p.batch; ++l) {
    const uint8_t* a_l = a_bytes + l * p.m * a_row_bytes;
    const uint8_t* b_l = b_bytes + l * p.n * row_bytes;
    const uint8_t* sfa_l = sfa_bytes ? sfa_bytes + l * p.scale_batch_stride(p.m) : nullptr;
    const uint8_t* sfb_l = sfb_bytes + l * p.scale_batch_stride(p.n);
    ParallelFor(a_panels + b_panels, [&](int64_t panel) {
      if (panel < a_panels) {
        PackPanel(p, a_l, sfa_l, p.m, kMR, /*is_a=*/true, panel, &a_pack);
      } else {
        PackPanel(p, b_l, sfb_l, p.n, kNR, /*is_a=*/false, panel - a_panels, &b_pack);
      }
    });

    auto* c_l = static_cast<uint8_t*>(buf.c) + l * p.m * c_row_bytes;
    ParallelFor(tiles_m * tiles_n, [&](int64_t t) {
      const int64_t i0 = (t / tiles_n) * kTileM;
      const int64_t j0 = (t % tiles_n) * kTileN;
      const int64_t i1 = std::min(i0 + kTileM, m_pad);
      const int64_t j1 = std::min(j0 + kTileN, n_pad);
      float acc[kTileM * kTileN] = {};
      for (int64_t k0 = 0; k0 < p.k; k0 += kBlockK) {
        const int64_t g0 = k0 / sfv;
        const int64_t block_groups = std::min(kBlockK, p.k - k0) / sfv;
        for (int64_t i = i0; i < i1; i += kMR) {
          const int64_t pa = i / kMR;
          const float* a = a_pack.values.data() + (pa * p.k + k0) * kMR;
          const float* a_s1 = a_pack.scale1.data() + (pa * groups + g0) * kMR;
          const float* a_s2 = a_pack.scale2.data() + (pa * groups + g0) * kMR;
          for (int64_t j = j0; j < j1; j += kNR) {
            const int64_t pb = j / kNR;
            micro_kernel(a, b_pack.values.data() + (pb * p.k + k0) * kNR, a_s1, a_s2,
                         b_pack.scale1.data() + (pb * groups + g0) * kNR,
                         b_pack.scale2.data() + (pb * groups + g0) * kNR, block_groups,
                         acc + (i - i0) * kTileN + (j - j0), kTileN);
          }
        }
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
