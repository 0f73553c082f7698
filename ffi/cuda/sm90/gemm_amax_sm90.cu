// Host entry points of the SM90 kernel: support check, variant/tile selection, TMA descriptors.
#include "cuda/sm90/gemm_amax_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/sm90/sm90_launch.cuh"

namespace jga {
namespace sm90 {
namespace {

int VariantOf(const GemmAmaxProblem& p) {
  if (p.ab_type == OperandType::kE4M3 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_E4M3;
  if (p.ab_type == OperandType::kE5M2 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_E5M2;
  if (p.ab_type == OperandType::kE2M1x2 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_MXFP4_32;
  if (p.ab_type == OperandType::kE2M1x2 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 16) return kV_MXFP4_16;
  if (p.ab_type == OperandType::kE2M1x2 && p.sf_type == ScaleType::kE4M3 && p.sf_vec_size == 16) return kV_NVFP4;
  return -1;
}

PFN_cuTensorMapEncodeTiled_v12000 GetEncodeFn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
    }
  });
  return fn;
}

int SmCount(int dev) {
  static std::atomic<int> cache[kMaxDevices] = {};
  if (dev >= 0 && dev < kMaxDevices && cache[dev].load() > 0) return cache[dev].load();
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(n);
  return n;
}

// 3-D byte tensor (K bytes, rows, L), box (128 bytes, box_rows, 1), 128B swizzle.
bool EncodeOperandMap(CUtensorMap* map, const void* ptr, uint64_t kbytes, uint64_t rows, uint64_t batch, uint32_t box_rows) {
  auto fn = GetEncodeFn();
  if (fn == nullptr) return false;
  cuuint64_t dims[3] = {kbytes, rows, batch};
  cuuint64_t strides[2] = {kbytes, kbytes * rows};
  cuuint32_t box[3] = {128, box_rows, 1};
  cuuint32_t estr[3] = {1, 1, 1};
  CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(ptr), dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace

int& MaxActiveClusters(int device, int variant, int mi) {
  static int table[kMaxDevices][5][2] = {};
  return table[device][variant][mi - 1];
}

const char* Unsupported(const GemmAmaxProblem& p) {
  if (p.batch < 1 || p.m < 1 || p.n < 1 || p.k < 1) return "sm90: L, M, N and K must be >= 1";
  const int v = VariantOf(p);
  if (v < 0) {
    return "sm90: unsupported operand/scale combination (allowed: e4m3|e5m2 with e8m0/32; packed e2m1 with "
           "e8m0/32, e8m0/16 or e4m3/16)";
  }
  if (p.k % p.sf_vec_size != 0) return "sm90: K must be a multiple of sf_vec_size";
  if (p.operand_row_bytes() % 16 != 0) return "sm90: A/B rows must be 16-byte aligned (K%16 for fp8, K%32 for fp4)";
  if (OutputBits(p.c_type) == 0) return "sm90: unsupported output dtype";
  if (p.c_type == OutputType::kE2M1x2 && p.n % 2 != 0) return "sm90: packed fp4 C needs even N";
  if (p.c_row_bytes() % 16 != 0) return "sm90: C rows must be 16-byte aligned";
  if (p.m > (1ll << 31) - 512 || p.n > (1ll << 31) - 512 || p.batch > (1 << 30)) return "sm90: dimension too large";
  if (p.operand_row_bytes() >= (1ll << 32)) return "sm90: K too large";
  const long long tm = CeilDiv(p.m, 128), tn = CeilDiv(p.n, 128);
  if (tm * tn * p.batch >= (1ll << 31)) return "sm90: too many tiles";
  return nullptr;
}

cudaError_t LaunchWithOptions(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, cudaStream_t stream,
                              const LaunchOptions& opt) {
  if (Unsupported(p) != nullptr) return cudaErrorInvalidValue;
  // TMA / bulk copies need 16-byte aligned global addresses; the epilogue stores up to 8 bytes.
  const uintptr_t ptr_bits = reinterpret_cast<uintptr_t>(buf.a) | reinterpret_cast<uintptr_t>(buf.b) |
                             reinterpret_cast<uintptr_t>(buf.sfa) | reinterpret_cast<uintptr_t>(buf.sfb) |
                             reinterpret_cast<uintptr_t>(buf.c);
  if ((ptr_bits & 15u) != 0 || buf.amax == nullptr) return cudaErrorMisalignedAddress;
  if (!Prepared()) {
    cudaError_t e = Prepare();
    if (e != cudaSuccess) return e;
  }
  if (!opt.skip_amax) {
    cudaError_t e = cudaMemsetAsync(buf.amax, 0, sizeof(float) * static_cast<size_t>(p.batch), stream);
    if (e != cudaSuccess) return e;
  }
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const int sms = SmCount(dev);

  // Tile height: 256 unless 128 fills the machine noticeably better (small M*N). n-tiles are
  // scheduled in groups of kCluster (one cluster tile).
  const long long tn = CeilDiv(CeilDiv(p.n, 128), kCluster) * kCluster;
  auto wave_eff = [&](long long tiles) {
    const long long waves = (tiles + sms - 1) / sms;
    return static_cast<double>(tiles) / static_cast<double>(waves * sms);
  };
  const long long t256 = CeilDiv(p.m, 256) * tn * p.batch;
  const long long t128 = CeilDiv(p.m, 128) * tn * p.batch;
  int mi = (wave_eff(t128) * 0.85 > wave_eff(t256)) ? 1 : 2;
  if (opt.force_tile_m == 128) mi = 1;
  if (opt.force_tile_m == 256) mi = 2;

  LaunchCtx ctx;
  const uint64_t kbytes = static_cast<uint64_t>(p.operand_row_bytes());
  const uint32_t box_a = std::min(128 * mi / kCluster, kBoxRows), box_b = std::min(128, kBoxRows);
  if (!EncodeOperandMap(&ctx.tm_a, buf.a, kbytes, p.m, p.batch, box_a)) return cudaErrorInvalidValue;
  if (!EncodeOperandMap(&ctx.tm_b, buf.b, kbytes, p.n, p.batch, box_b)) return cudaErrorInvalidValue;

  KParams& k = ctx.params;
  k.m = static_cast<int>(p.m);
  k.n = static_cast<int>(p.n);
  k.l = static_cast<int>(p.batch);
  k.k_groups = static_cast<int>(p.k_groups());
  k.k_blocks = static_cast<int>(p.k_blocks());
  k.num_kslabs = static_cast<int>(CeilDiv(static_cast<int64_t>(kbytes), 128));
  k.row_blocks_a = static_cast<int>(p.row_blocks(p.m));
  k.row_blocks_b = static_cast<int>(p.row_blocks(p.n));
  k.sfa_batch_stride = p.scale_batch_stride(p.m);
  k.sfb_batch_stride = p.scale_batch_stride(p.n);
  k.sfa = static_cast<const uint8_t*>(buf.sfa);
  k.sfb = static_cast<const uint8_t*>(buf.sfb);
  k.c = buf.c;
  k.amax = buf.amax;
  k.c_type = static_cast<int>(p.c_type);
  k.c_aligned16 = (reinterpret_cast<uintptr_t>(buf.c) % 16 == 0 && p.c_row_bytes() % 16 == 0) ? 1 : 0;
  k.flags = (opt.skip_amax ? kFlagNoAmax : 0) | (opt.experiment_flags & ~kFlagNoAmax);
  k.trace = opt.trace;
  k.tiles_m = static_cast<int>(CeilDiv(p.m, 128 * mi));
  k.tiles_n = static_cast<int>(tn / kCluster);
  k.tiles_per_batch = k.tiles_m * k.tiles_n;
  k.tiles_total = k.tiles_per_batch * k.l;
  ctx.grid = std::min(k.tiles_total, sms / kCluster) * kCluster;
  ctx.mi = mi;
  ctx.device = dev;
  ctx.stream = stream;

  switch (VariantOf(p)) {
    case kV_E4M3: return LaunchVariant0(ctx);
    case kV_E5M2: return LaunchVariant1(ctx);
    case kV_MXFP4_32: return LaunchVariant2(ctx);
    case kV_MXFP4_16: return LaunchVariant3(ctx);
    default: return LaunchVariant4(ctx);
  }
}

namespace {
std::atomic<bool> g_prepared[kMaxDevices];
}  // namespace

cudaError_t Prepare() {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxDevices && g_prepared[dev].load(std::memory_order_acquire)) return cudaSuccess;
  if (GetEncodeFn() == nullptr) return cudaErrorNotSupported;
  SmCount(dev);
  for (auto prepare : {PrepareVariant0, PrepareVariant1, PrepareVariant2, PrepareVariant3, PrepareVariant4}) {
    err = prepare();
    if (err != cudaSuccess) return err;
  }
  if (dev < kMaxDevices) g_prepared[dev].store(true, std::memory_order_release);
  return cudaSuccess;
}

bool Prepared() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && dev < kMaxDevices && g_prepared[dev].load(std::memory_order_acquire);
}

cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, cudaStream_t stream) {
  return LaunchWithOptions(p, buf, stream, LaunchOptions{});
}

}  // namespace sm90
}  // namespace jga
