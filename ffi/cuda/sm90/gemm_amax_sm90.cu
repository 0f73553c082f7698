// Host entry points of the SM90 kernel: support check, TMA descriptors, kernel parameters, launch
// (the plan: sm90_planner.cu).
#include "cuda/sm90/gemm_amax_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "cuda/sm90/sm90_launch.cuh"
#include "cuda/sm90/sm90_planner.h"

namespace jga {
namespace sm90 {
namespace {

int VariantOf(const GemmAmaxProblem& p) {
  if (p.ab_type == OperandType::kE4M3 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_E4M3;
  if (p.ab_type == OperandType::kE5M2 && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_E5M2;
  if (p.fp4_operands() && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kV_MXFP4_32;
  if (p.fp4_operands() && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 16) return kV_MXFP4_16;
  if (p.fp4_operands() && p.sf_type == ScaleType::kE4M3 && p.sf_vec_size == 16) return kV_NVFP4;
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
bool EncodeOperandMap(CUtensorMap* map, const void* ptr, uint64_t kbytes, uint64_t rows, uint64_t batch,
                      uint32_t box_rows) {
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

int& MaxActiveClusters(int device, int variant, int mi, int kind) {
  static int table[kMaxDevices][5][2][kKernelKinds] = {};
  return table[device][variant][mi - 1][kind];
}

const char* Unsupported(const GemmAmaxProblem& p) {
  if (const char* why = ContractViolation(p)) return why;  // the handler has checked it; direct callers not
  if (VariantOf(p) < 0) {
    return "sm90: unsupported operand/scale combination (allowed: e4m3|e5m2 with e8m0/32; packed e2m1 with "
           "e8m0/32, e8m0/16 or e4m3/16)";
  }
  if (p.m > (1ll << 31) - 512 || p.n > (1ll << 31) - 512 || p.batch > (1 << 30)) return "sm90: dimension too large";
  if (p.operand_row_bytes() >= (1ll << 32)) return "sm90: K too large";
  const long long tm = CeilDiv(p.m, 128), tn = CeilDiv(p.n, 128);
  if (tm * tn * p.batch >= (1ll << 31)) return "sm90: too many tiles";
  if (p.weight_only()) {  // A's copy feeds the BF16 WGMMAs as it is (PreconvertValuesKernel)
    if (p.a_type != ActivationType::kBF16) return "sm90: weight-only problems take a bfloat16 A";
    if (!CopyFits(PreconvertedABytes(p))) return "sm90: A too large for its BF16 copy";
  }
  return nullptr;
}

namespace {

// Per device: the grid barrier word of the kernel's zeroing round (KParams::reset_word) for callers
// that pass none (the kernel tests and benchmarks, direct users), allocated by Prepare(). Launches
// on one stream never overlap on it (the GEMM lets no dependent start before it ends); the FFI
// handler passes a word per call site instead, since XLA may run two calls at once (concurrent
// command-buffer branches).
std::atomic<unsigned int*> g_reset_word[kMaxDevices];

// A PreconvertKernel pass over one operand (A: rows permuted into the consumers' fragment order).
PreconvertParams PreconvertPass(const GemmAmaxProblem& p, const void* codes, const void* sf, long long sf_batch_stride,
                                long long rows, bool is_a, void* out, unsigned int* bound) {
  PreconvertParams q;
  q.bound = bound;
  q.codes = static_cast<const uint8_t*>(codes);
  q.sf = static_cast<const uint8_t*>(sf);
  q.out = static_cast<uint8_t*>(out);
  q.sf_batch_stride = sf_batch_stride;
  q.row_bytes = is_a ? p.a_row_bytes() : p.operand_row_bytes();
  q.rows = static_cast<int>(rows);
  q.l = static_cast<int>(p.batch);
  q.units_per_row = static_cast<int>(PreconvertedRowBytes(p) / 128);
  q.units = static_cast<int>(p.batch * rows * q.units_per_row);  // < 2^31 (CopyFits)
  q.k_groups = static_cast<int>(p.k_groups());
  q.k_blocks = static_cast<int>(p.k_blocks());
  q.out_rows = static_cast<int>(is_a ? PreconvertedARows(p) : rows);
  q.frag_order = is_a ? 1 : 0;
  return q;
}
}  // namespace

cudaError_t LaunchWithOptions(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream, const LaunchOptions& opt) {
  if (Unsupported(p) != nullptr) return cudaErrorInvalidValue;
  if (workspace_bytes == 0) workspace = nullptr;  // an empty result's address may be anything
  // TMA / bulk copies need 16-byte aligned global addresses; the epilogue stores up to 8 bytes.
  const uintptr_t ptr_bits = reinterpret_cast<uintptr_t>(buf.a) | reinterpret_cast<uintptr_t>(buf.b) |
                             reinterpret_cast<uintptr_t>(buf.sfa) | reinterpret_cast<uintptr_t>(buf.sfb) |
                             reinterpret_cast<uintptr_t>(buf.c) | reinterpret_cast<uintptr_t>(workspace);
  if ((ptr_bits & 15u) != 0 || buf.amax == nullptr) return cudaErrorMisalignedAddress;
  if (!Prepared()) {
    // Preparing loads modules and allocates (and synchronizes the device): never inside a capture.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capturing);
    if (e == cudaSuccess && capturing != cudaStreamCaptureStatusNone) e = cudaErrorStreamCaptureUnsupported;
    if (e == cudaSuccess) e = Prepare();
    if (e != cudaSuccess) return e;
  }
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const int sms = SmCount(dev);
  if (workspace == nullptr) workspace_bytes = 0;
  const Plan plan = PlanOf(p, sms, opt, workspace_bytes);
  const int mi = plan.mi, pre = plan.pre;
  if (p.weight_only() && (pre & kPreA) == 0) return cudaErrorInvalidValue;  // no room for A's copy

  LaunchCtx ctx{};  // zeroed: a field left unset (reset_word without amax or split) reads as null
  const int kernel_pre = KernelPre(plan);
  const int cluster = ClusterCTAs(kernel_pre), tile_rows = TileRows(kernel_pre, mi);
  const uint64_t kbytes = static_cast<uint64_t>(p.operand_row_bytes());
  const uint32_t box_a = std::min(tile_rows / cluster, kBoxRows), box_b = std::min(kBN, kBoxRows);
  // The operands as codes, or (pre-converted) as BF16 units of 128 bytes in the workspace: B' at
  // its start (after the split-K counters and partials, if any), A' after it.
  uint8_t* const b_conv = static_cast<uint8_t*>(workspace) + plan.split_bytes;
  uint8_t* const a_conv = b_conv + ((pre & kPreB) ? PreconvertedBBytes(p) : 0);
  const uint64_t conv_row_bytes = static_cast<uint64_t>(PreconvertedRowBytes(p));
  const bool ok_a = (pre & kPreA)
                        ? EncodeOperandMap(&ctx.tm_a, a_conv, conv_row_bytes, PreconvertedARows(p), p.batch, box_a)
                        : EncodeOperandMap(&ctx.tm_a, buf.a, kbytes, p.m, p.batch, box_a);
  const bool ok_b = (pre & kPreB) ? EncodeOperandMap(&ctx.tm_b, b_conv, conv_row_bytes, p.n, p.batch, box_b)
                                  : EncodeOperandMap(&ctx.tm_b, buf.b, kbytes, p.n, p.batch, box_b);
  if (!ok_a || !ok_b) return cudaErrorInvalidValue;

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
  k.flags = opt.skip_amax ? kFlagNoAmax : 0;
  k.tiles_m = static_cast<int>(CeilDiv(p.m, tile_rows));
  k.tiles_n = static_cast<int>(CeilDiv(CeilDiv(p.n, 128), cluster));
  k.tiles_per_batch = k.tiles_m * k.tiles_n;
  k.tiles_total = k.tiles_per_batch * k.l;
  k.splits = plan.splits;
  {  // the reducer's extra slabs: ~the time its partners take to store their partials
    const int bonus_units = opt.split_bonus_units >= 0 ? opt.split_bonus_units : kSplitReducerBonusUnits;
    const int bonus_slabs = static_cast<int>(bonus_units / UnitsPerSlab(p));
    k.split_slabs = std::max(1, (k.num_kslabs - bonus_slabs) / plan.splits);
  }
  k.whole_tiles = plan.whole_tiles;
  k.split_tiles = k.tiles_total - plan.whole_tiles;
  k.units_total = k.whole_tiles + k.split_tiles * plan.splits;
  k.tile_ready = plan.splits > 1 ? static_cast<unsigned int*>(workspace) : nullptr;
  k.partials =
      plan.splits > 1 ? reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + plan.ready_bytes) : nullptr;
  ctx.grid = std::min(k.units_total, sms / cluster) * cluster;
  ctx.mi = mi;
  ctx.pre = kernel_pre;
  k.a = static_cast<const uint8_t*>(buf.a);
  k.b = static_cast<const uint8_t*>(buf.b);
  k.row_bytes = static_cast<long long>(kbytes);
  k.a_row_bytes = p.a_row_bytes();
  ctx.device = dev;
  ctx.stream = stream;

  // amax and the split-K counters: zeroed by the kernel itself (ResetRound), on this device's word;
  // the words after it take the pre-conversion passes' scale bounds.
  unsigned int* const words = opt.reset_word != nullptr ? opt.reset_word
                              : dev < kMaxDevices       ? g_reset_word[dev].load(std::memory_order_acquire)
                                                        : nullptr;
  if (words == nullptr) return cudaErrorNotReady;  // Prepare() did not run on this device
  if (!opt.skip_amax || plan.splits > 1) k.reset_word = words;
  if (pre != 0) {
    ctx.pre_bounds = words + 1;
    k.pre_bounds = ctx.pre_bounds;
  }
  if (pre & kPreB) ctx.pre_b = PreconvertPass(p, buf.b, buf.sfb, k.sfb_batch_stride, p.n, false, b_conv, words + 1);
  if (pre & kPreA) ctx.pre_a = PreconvertPass(p, buf.a, buf.sfa, k.sfa_batch_stride, p.m, true, a_conv, words + 2);
  ctx.a_values = p.weight_only();

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
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (g_reset_word[dev].load(std::memory_order_acquire) == nullptr) {
    unsigned int* word = nullptr;
    err = AllocResetWord(&word);
    if (err != cudaSuccess) return err;
    g_reset_word[dev].store(word, std::memory_order_release);
  }
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

cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, const PlanOptions& opt, PlanInfo* info, int sms) {
  int dev = -1;
  if (sms <= 0) {
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    sms = SmCount(dev);
  }
  const Plan plan = PlanOf(p, sms, opt, workspace_bytes);
  info->preconvert_a = (plan.pre & kPreA) != 0;
  info->preconvert_b = (plan.pre & kPreB) != 0;
  info->tile_m = 128 * plan.mi;
  info->splits = plan.splits;
  info->whole_tiles = plan.whole_tiles;
  info->clusters = dev >= 0 && dev < kMaxDevices
                       ? MaxActiveClusters(dev, VariantOf(p), plan.mi, KernelKind(plan.splits > 1, KernelPre(plan)))
                       : 0;
  return cudaSuccess;
}

cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, PlanInfo* info, int sms) {
  return PlanFor(p, workspace_bytes, PlanOptions{}, info, sms);
}

cudaError_t AllocResetWord(unsigned int** word) {
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, kResetWords * sizeof(unsigned int));
  if (err == cudaSuccess) err = cudaMemset(ptr, 0, kResetWords * sizeof(unsigned int));
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    cudaFree(ptr);
    return err;
  }
  *word = static_cast<unsigned int*>(ptr);
  return cudaSuccess;
}

cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, unsigned int* reset_word) {
  LaunchOptions opt;
  opt.reset_word = reset_word;
  return LaunchWithOptions(p, buf, workspace, workspace_bytes, stream, opt);
}

}  // namespace sm90
}  // namespace jga
