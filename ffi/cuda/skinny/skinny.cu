// Host side of the few-row kernel: which problems it takes, its split-K plan and workspace, the
// launch.
#include "cuda/skinny/skinny.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>

#include "cuda/skinny/skinny_launch.cuh"

namespace jga {
namespace skinny {
namespace {

constexpr int kMaxDevices = 64;
// Split-K: at most this many K ranges per tile, each of at least kMinStagesPerSplit stages
// (128 bytes of K per row each), so that the copy ring fills before a range ends.
constexpr int kMaxSplits = 16;
constexpr int kMinStagesPerSplit = 4;

int VariantOf(const GemmAmaxProblem& p) {
  if (p.ab_type == OperandType::kE4M3 && p.sf_type == ScaleType::kE8M0) return kE4M3;
  if (p.ab_type == OperandType::kE5M2 && p.sf_type == ScaleType::kE8M0) return kE5M2;
  if (p.fp4_operands() && p.sf_type == ScaleType::kE8M0 && p.sf_vec_size == 32) return kMXFP4;
  if (p.fp4_operands() && p.sf_type == ScaleType::kE4M3 && p.sf_vec_size == 16) return kNVFP4;
  return -1;  // FP4 with e8m0 scales per 16: a chunk of 32 codes would span two groups
}

int AKindOf(const GemmAmaxProblem& p) {
  switch (p.a_type) {
    case ActivationType::kF16: return kAF16;
    case ActivationType::kBF16: return kABF16;
    default: return kAScaled;
  }
}

// Index of the token-tile count (kTokenTileCounts) that covers M.
int TokenTileIndex(int64_t m) { return m <= 8 ? 0 : m <= 16 ? 1 : m <= 32 ? 2 : 3; }

template <int A, int V>
constexpr std::array<int, kTokenTileIndices> SmemRow() {
  return {Smem<V, A, 1>::kBytes, Smem<V, A, 2>::kBytes, Smem<V, A, 4>::kBytes, Smem<V, A, 8>::kBytes};
}
template <int A>
constexpr std::array<std::array<int, kTokenTileIndices>, kVariants> SmemKind() {
  return {SmemRow<A, 0>(), SmemRow<A, 1>(), SmemRow<A, 2>(), SmemRow<A, 3>()};
}
constexpr std::array<std::array<std::array<int, kTokenTileIndices>, kVariants>, kAKinds> kSmemBytes = {
    SmemKind<kAScaled>(), SmemKind<kAF16>(), SmemKind<kABF16>()};

// CTAs per SM without a device to ask: what 227 KB of shared memory (1 KB reserved per CTA) and
// the kernel's register budget allow.
int HostCtasPerSm(int a, int v, int mt_index) {
  const int by_smem = (227 * 1024) / (kSmemBytes[a][v][mt_index] + 1024);
  return std::max(1, std::min(by_smem, kTokenTileCounts[mt_index] <= 2 ? 2 : 1));
}

std::atomic<int> g_ctas_per_sm[kMaxDevices][kAKinds][kVariants][kTokenTileIndices];
std::atomic<int> g_sms[kMaxDevices];

struct Plan {
  int splits = 1, stages_per_split = 1, grid = 0;
  size_t counter_bytes = 0;  // split-K counters at the workspace's start; partials follow
};

long long Tiles(const GemmAmaxProblem& p) { return p.batch * CeilDiv(p.n, kTileN); }
long long Stages(const GemmAmaxProblem& p) { return CeilDiv(p.operand_row_bytes(), kStageBytes); }
size_t CounterBytes(const GemmAmaxProblem& p) { return static_cast<size_t>(CeilDiv(Tiles(p) * 4, 256) * 256); }
size_t SplitBytes(const GemmAmaxProblem& p, int splits) {
  if (splits <= 1) return 0;
  const size_t mt = static_cast<size_t>(kTokenTileCounts[TokenTileIndex(p.m)]);
  return CounterBytes(p) + static_cast<size_t>(Tiles(p)) * splits * mt * kThreads * sizeof(float4);
}

// Splits that fill the co-resident CTAs (one wave of units) without ranges shorter than
// kMinStagesPerSplit, as many as the workspace holds; no split is left empty.
Plan MakePlan(const GemmAmaxProblem& p, int sms, int ctas_per_sm, size_t workspace_bytes) {
  const long long tiles = Tiles(p), stages = Stages(p), cap = static_cast<long long>(sms) * ctas_per_sm;
  long long splits = 1;
  if (tiles < cap)
    splits = std::min<long long>({cap / tiles, std::max<long long>(1, stages / kMinStagesPerSplit), kMaxSplits});
  while (splits > 1 && SplitBytes(p, static_cast<int>(splits)) > workspace_bytes) --splits;
  Plan plan;
  plan.stages_per_split = static_cast<int>(CeilDiv(stages, splits));
  plan.splits = static_cast<int>(CeilDiv(stages, plan.stages_per_split));
  plan.grid = static_cast<int>(std::min(tiles * plan.splits, cap));
  plan.counter_bytes = plan.splits > 1 ? CounterBytes(p) : 0;
  return plan;
}

bool PreparedOn(int dev) { return g_sms[dev].load(std::memory_order_acquire) > 0; }

// One launch for p.m <= kMaxM rows of A and C at buf.a / buf.c (`rows`: rows of A and C per batch item).
cudaError_t LaunchRows(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, int64_t rows, bool zero_amax, int v, int a,
                       int dev, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       unsigned int* reset_word) {
  const int mt_index = TokenTileIndex(p.m);
  const Plan plan = MakePlan(p, g_sms[dev].load(std::memory_order_acquire),
                             g_ctas_per_sm[dev][a][v][mt_index].load(std::memory_order_acquire), workspace_bytes);

  Params k{};
  k.a = static_cast<const uint8_t*>(buf.a);
  k.b = static_cast<const uint8_t*>(buf.b);
  k.sfa = static_cast<const uint8_t*>(buf.sfa);
  k.sfb = static_cast<const uint8_t*>(buf.sfb);
  k.c = buf.c;
  k.amax = buf.amax;
  k.zero_amax = zero_amax;
  k.m = static_cast<int>(p.m);
  k.rows = static_cast<int>(rows);
  k.n = static_cast<int>(p.n);
  k.l = static_cast<int>(p.batch);
  k.row_bytes = static_cast<int>(p.operand_row_bytes());
  k.a_row_bytes = static_cast<int>(p.a_row_bytes());
  k.k_blocks = static_cast<int>(p.k_blocks());
  k.sfa_batch_stride = p.weight_only() ? 0 : p.scale_batch_stride(p.m);
  k.sfb_batch_stride = p.scale_batch_stride(p.n);
  k.c_type = static_cast<int>(p.c_type);
  k.tiles_n = static_cast<int>(CeilDiv(p.n, kTileN));
  k.tiles = static_cast<int>(Tiles(p));
  k.splits = plan.splits;
  k.stages_per_split = plan.stages_per_split;
  k.num_stages = static_cast<int>(Stages(p));
  k.units = k.tiles * plan.splits;
  if (plan.splits > 1) {
    k.counters = static_cast<unsigned int*>(workspace);
    k.partials = reinterpret_cast<float4*>(static_cast<uint8_t*>(workspace) + plan.counter_bytes);
  }
  k.reset_word = reset_word;
  switch (a) {
    case kAF16: return LaunchKind<kAF16>(v, mt_index, k, plan.grid, stream);
    case kABF16: return LaunchKind<kABF16>(v, mt_index, k, plan.grid, stream);
    default: return LaunchKind<kAScaled>(v, mt_index, k, plan.grid, stream);
  }
}

}  // namespace

bool Accepts(const GemmAmaxProblem& p) {
  if (ContractViolation(p) != nullptr) return false;
  if (VariantOf(p) < 0 || p.m > (p.weight_only() ? kMaxWeightOnlyM : kMaxScaledM)) return false;
  // 32-bit indices: rows, row bytes, units, and element offsets of C's pairs within a batch item.
  return p.n < (1ll << 30) && p.a_row_bytes() < (1ll << 30) && p.batch < (1 << 20) && Tiles(p) * kMaxSplits < INT_MAX;
}

size_t WorkspaceBytes(const GemmAmaxProblem& p) {
  if (!Accepts(p)) return 0;
  const int v = VariantOf(p), mt_index = TokenTileIndex(p.m);
  const Plan plan = MakePlan(p, kPlanSms, HostCtasPerSm(AKindOf(p), v, mt_index), static_cast<size_t>(-1));
  return SplitBytes(p, plan.splits);
}

cudaError_t Prepare() {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (PreparedOn(dev)) return cudaSuccess;
  int ctas[kAKinds][kVariants][kTokenTileIndices] = {};
  err = ConfigureKind<kAScaled>(ctas[kAScaled]);
  if (err == cudaSuccess) err = ConfigureKind<kAF16>(ctas[kAF16]);
  if (err == cudaSuccess) err = ConfigureKind<kABF16>(ctas[kABF16]);
  if (err != cudaSuccess) return err;
  for (int a = 0; a < kAKinds; ++a)
    for (int v = 0; v < kVariants; ++v)
      for (int i = 0; i < kTokenTileIndices; ++i)
        g_ctas_per_sm[dev][a][v][i].store(ctas[a][v][i], std::memory_order_release);
  int sms = 0;
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  g_sms[dev].store(std::max(1, sms), std::memory_order_release);
  return cudaSuccess;
}

cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, PlanInfo* info, int sms) {
  if (!Accepts(p)) return cudaErrorInvalidValue;
  const int a = AKindOf(p), v = VariantOf(p), mt_index = TokenTileIndex(p.m);
  int ctas_per_sm = HostCtasPerSm(a, v, mt_index);
  if (sms <= 0) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess && dev >= kMaxDevices) err = cudaErrorInvalidDevice;
    if (err == cudaSuccess && !PreparedOn(dev)) err = Prepare();
    if (err != cudaSuccess) return err;
    sms = g_sms[dev].load(std::memory_order_acquire);
    ctas_per_sm = g_ctas_per_sm[dev][a][v][mt_index].load(std::memory_order_acquire);
  }
  const Plan plan = MakePlan(p, sms, ctas_per_sm, workspace_bytes);
  info->tokens = 8 * kTokenTileCounts[mt_index];
  info->splits = plan.splits;
  info->ctas_per_sm = ctas_per_sm;
  info->grid = plan.grid;
  return cudaSuccess;
}

cudaError_t Launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, unsigned int* reset_word) {
  if (!Accepts(p) || reset_word == nullptr || buf.amax == nullptr) return cudaErrorInvalidValue;
  if (workspace == nullptr) workspace_bytes = 0;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!PreparedOn(dev)) {
    // Preparing sets kernel attributes: never inside a capture.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    err = cudaStreamIsCapturing(stream, &capturing);
    if (err == cudaSuccess && capturing != cudaStreamCaptureStatusNone) err = cudaErrorStreamCaptureUnsupported;
    if (err == cudaSuccess) err = Prepare();
    if (err != cudaSuccess) return err;
  }
  const int a = AKindOf(p), v = VariantOf(p);
  // One launch per kMaxM rows of A (weight-only M > kMaxM), in order on the stream: the first
  // zeroes amax, the others add to it; each takes the whole workspace in turn.
  for (int64_t m0 = 0; m0 < p.m; m0 += kMaxM) {
    GemmAmaxProblem slab = p;
    slab.m = std::min(kMaxM, p.m - m0);
    GemmAmaxBuffers at = buf;
    at.a = static_cast<const uint8_t*>(buf.a) + m0 * p.a_row_bytes();
    at.c = static_cast<uint8_t*>(buf.c) + m0 * p.c_row_bytes();
    err = LaunchRows(slab, at, p.m, m0 == 0, v, a, dev, workspace, workspace_bytes, stream, reset_word);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace skinny
}  // namespace jga
