// Host entry points of the SM90 kernel: support check, variant/tile selection, TMA descriptors.
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

int& MaxActiveClusters(int device, int variant, int mi, int kind) {
  static int table[kMaxDevices][5][2][kKernelKinds] = {};
  return table[device][variant][mi - 1][kind];
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

namespace {

// Per device: the grid barrier word of the kernel's zeroing round (KParams::reset_word) for callers
// that pass none (the harness, direct users), allocated by Prepare(). Launches on one stream never
// overlap on it (the GEMM lets no dependent start before it ends); the FFI handler passes a word
// per call site instead, since XLA may run two calls at once (concurrent command-buffer branches).
std::atomic<unsigned int*> g_reset_word[kMaxDevices];

// Tile height (MI) and split-K factor, from a cost model in units of one 64-K MMA unit of a
// 256-row tile, by waves of work units over the SMs: a unit of tile 128 costs 0.60 (it runs at
// ~0.83x the rate of tile 256 since it has two B converters); each unit costs a pipeline fill
// plus its epilogue; a split tile costs the partial tiles' store, the reducer's wait and its read
// (128 KB per split at tile 256): kSplitCostPerRowBlock x MI units per extra split, + 0.6. Fitted
// to H200 harness timings: 256x8192x8192 tile 256 / 2 splits 503 TF/s vs tile 128 unsplit 433;
// tile 128 vs tile 256 and tail splits (512x4096x4096, 640x8192x2048, 2560x1792x4096), which fit
// a split term of 3.8 x MI while the reducer took no extra K. With the reducer's extra K
// (kSplitReducerBonusUnits) making the hand-over cheaper, 2.0 x MI picks the best measured plan
// (within 2%; readings of one plan pooled over builds) at 31 of 32 shapes against 19 of 32 for
// 3.8. The 2.0 build against the 3.8 one, two
// calls each: 768x28672x8192 +10%, 256x8192x4096 and 640x8192x1024 +9%, 2560x4096x2048 and
// 128x2048x2048 +8%, 512x4096x4096, 1024x14336x4096 and 2048x5120x2048 +6%; 512x5120x4096 -4%
// (a 4-way tail split at tile 128 instead of tile 256 unsplit with A pre-converted). The
// benchmark's six shapes keep their plans.
// Candidates: every tile split S ways (S = 1: no split-K), or, when the last wave of tiles is
// partial, the whole waves unsplit and only the last wave's tiles split. Only plans
// whose split-K workspace fits in `available` bytes are considered.
constexpr double kSplitCostPerRowBlock = 2.0;  // per 128 rows of the tile and extra split (above)
// Each tile-256 candidate is priced with every choice of operands it may pre-convert (PreChoices):
// converting X once per call in passes saves kPreconvertSaving[fp4][X] of the GEMM's main loop (no
// operand conversion left in its CTAs; the epilogues and a split plan's hand-over of partial tiles
// stay as they are), and the passes cost their bytes (codes read, BF16 written) at
// kPassBytesPerUnit plus a fixed cost, kFirstPassUnits for the first (a launch boundary and a wave)
// and kSecondPassUnits for the second (its start overlaps the first: PDL). One cost unit is ~1 us
// at tile 256 (0.92-1.04 us at 3072x3072x1024, 4096^3, 8192^3 without pre-conversion).
// Fitted (least squares on relative error) to 102 readings of plans taking turns in one process on
// an H200: 17 shapes at tile 256 unsplit with each of the four choices, and 17 pairs (two
// choices), 8 of them split plans with and without A'.
// RMS error 1.3%; of those 34 choices the model makes the measured best at 30, the other 4 within
// 0.1-1.8% of it.
// A saving priced on the whole GEMM time fits as well unsplit but took
// A' for split plans at K = 1024 where it loses (2048x3072x1024 -1.8%, 640x8192x1024 -7% as tile
// 256 + A' over tile 128): there a split tile's hand-over is a third of its time.
// Both operands (the unsplit A'B' plan) run the ping-pong kernel (KernelPre), priced by its own
// waves (PingPongWaves): a consumer warpgroup's epilogue (a 128-row tile's, half a 256-row one's)
// runs beside the other's main loop, so a wave pays half the epilogue, and the last tile's half
// is paid whole.
// Per operand format, fitted (least squares on relative error, each shape's scale free) to every
// choice at tile 256 unsplit taking turns in one process on an H200: fp8 32 shapes (B' and A'
// within 0.004 of the 102-reading fit's values, which they keep; 0.271 for the ping-pong A'B'; RMS
// 1.2%), fp4 32 mxfp4 + 12 nvfp4 shapes (RMS 1.4% / 2.0%; with fp8's values 3.7% / 2.2%: an fp4
// code costs the consumers more to convert). Against one set of savings for both formats with the
// ping-pong plan priced like a cooperative one, at the grid shapes whose plan this changes: e4m3
// +5.1% (geometric mean of 107), mxfp4 +7.2% (80), worst -3.8% / -4.9%. Indexed by
// [fp4][kPreB | kPreA].
constexpr double kPreconvertSaving[2][4] = {{0.0, 0.163, 0.204, 0.271}, {0.0, 0.186, 0.258, 0.335}};
constexpr double kPassBytesPerUnit = 3.45e6;
constexpr double kFirstPassUnits = 3.1, kSecondPassUnits = 0.34;
// Waves of the ping-pong kernel in units of a cooperative tile-256 wave: each CTA runs 128x128
// tiles, two at a time (one per consumer warpgroup, their main loops taking turns), in 2-CTA
// clusters along N (sms / 2 clusters, each a pair of adjacent 128-column tiles): half a wave per
// round of cluster tiles.
double PingPongWaves(const GemmAmaxProblem& p, int sms) {
  const long long cluster_tiles = CeilDiv(p.m, 128) * CeilDiv(CeilDiv(p.n, 128), 2) * p.batch;
  return 0.5 * static_cast<double>(CeilDiv(cluster_tiles, std::max(1, sms / 2)));
}
// 64-K MMA units per 128-byte slab of codes (128 fp8 or 256 fp4 elements).
long long UnitsPerSlab(const GemmAmaxProblem& p) { return p.fp4_operands() ? 4 : 2; }

double PassUnits(const GemmAmaxProblem& p, int pre) {
  if (pre == 0) return 0.0;
  const double row_bytes = static_cast<double>(p.operand_row_bytes()) * p.batch;
  double bytes = 0;
  if (pre & kPreB) bytes += row_bytes * p.n + PreconvertedBBytes(p);
  if (pre & kPreA) bytes += row_bytes * p.m + PreconvertedABytes(p);
  return bytes / kPassBytesPerUnit + kFirstPassUnits + (pre == (kPreA | kPreB) ? kSecondPassUnits : 0.0);
}

struct Plan {
  int mi = 2;
  int splits = 1;
  int whole_tiles = 0;     // tiles run unsplit before the split ones (a tail split)
  size_t ready_bytes = 0;  // split-K counters, at the start of the workspace; partials follow
  size_t split_bytes = 0;  // counters + partials (a multiple of 256); BF16 copies follow them
  int pre = 0;             // operands converted in passes (kPreA | kPreB)
};

// What a plan may pre-convert: tile 256 unsplit, any part of `unsplit` (the operands wanted whose
// copies fit the workspace together); tile 256 split, A alone if wanted and its copy fits after the
// split-K area (each CTA reads only its own K range of B once, so B's pass would not pay, but
// every n-tile converts the same A rows). Operands the options force (`required`) are taken by
// every candidate that allows them.
struct PreChoices {
  int unsplit = 0;            // kPreA | kPreB
  bool split_a = false;       // A wanted for split plans
  int required = 0;           // forced by the options
  size_t workspace_bytes = 0;
};

Plan MakePlan(const GemmAmaxProblem& p, int sms, const LaunchOptions& opt, size_t available, const PreChoices& pc) {
  const long long tn = CeilDiv(p.n, 128);
  const long long nslabs = CeilDiv(p.operand_row_bytes(), 128);
  const long long units_per_slab = UnitsPerSlab(p);
  double pass_units[4];  // the passes of each operand choice: the same for every candidate
  for (int x = 0; x < 4; ++x) pass_units[x] = PassUnits(p, x);
  const size_t a_copy_bytes = PreconvertedABytes(p);
  const double* const saving = kPreconvertSaving[p.fp4_operands() ? 1 : 0];
  const double pingpong_waves = PingPongWaves(p, sms);  // the A'B' choice's kernel (KernelPre)
  Plan best;
  double best_cost = -1;
  for (int mi = 2; mi >= 1; --mi) {
    if ((opt.force_tile_m == 128 && mi != 1) || (opt.force_tile_m == 256 && mi != 2)) continue;
    const long long tiles = CeilDiv(p.m, 128 * mi) * tn * p.batch;
    const double rate = mi == 2 ? 1.0 : 0.60, epilogue = mi == 2 ? 2.4 : 1.6;
    // A wave: its main loop (the units: what pre-converted operands speed up), its epilogue, and
    // with split-K the hand-over of partial tiles.
    auto wave_units = [&](int splits) {
      return static_cast<double>(CeilDiv(nslabs, splits) * units_per_slab) * rate;
    };
    auto wave_cost = [&](int splits) {
      return wave_units(splits) + epilogue + (splits > 1 ? kSplitCostPerRowBlock * mi * (splits - 1) + 0.6 : 0.0);
    };
    const long long max_splits = std::min<long long>(kMaxSplits, nslabs);
    for (int splits = 1; splits <= max_splits; ++splits) {
      if (opt.force_splits > 0 && splits != std::min<long long>({opt.force_splits, kMaxSplits, nslabs})) continue;
      // Tiles run whole before the split ones: none (every tile split), or, when the last wave is
      // partial, those of the whole waves (only the last wave's tiles split, spread over the SMs).
      long long wholes[2] = {0, -1};
      if (splits > 1 && opt.force_whole_tiles >= 0) {
        wholes[0] = std::min<long long>(opt.force_whole_tiles, tiles - 1);
      } else if (splits > 1 && tiles > sms && tiles % sms != 0) {
        wholes[1] = tiles - tiles % sms;
      }
      for (const long long whole : wholes) {
        if (whole < 0) continue;
        const long long split_tiles = tiles - whole;
        const size_t ready_bytes = static_cast<size_t>(CeilDiv(split_tiles * 4, 256) * 256);
        const size_t need = static_cast<size_t>(splits - 1) * split_tiles * (128 * mi) * 128 * sizeof(float) + ready_bytes;
        if (splits > 1 && need > available) continue;
        const double whole_waves = static_cast<double>(CeilDiv(whole, sms));
        const double split_waves = static_cast<double>(CeilDiv(split_tiles * splits, sms));
        const double gemm = whole_waves * wave_cost(1) + split_waves * wave_cost(splits);
        const double main_loop = whole_waves * wave_units(1) + split_waves * wave_units(splits);
        // This candidate's cheapest choice of operands to pre-convert.
        int allowed = 0;
        if (mi == 2 && splits == 1) {
          allowed = pc.unsplit;
        } else if (mi == 2 && pc.split_a && pc.workspace_bytes >= need + a_copy_bytes) {
          allowed = kPreA;
        }
        int pre = -1;
        double cost = 0;
        for (int x = 0; x <= 3; ++x) {
          if ((x & ~allowed) != 0 || (pc.required & allowed & ~x) != 0) continue;
          // A'B' (offered to unsplit tile 256 only) runs the ping-pong kernel: its own waves.
          const double c = (x == (kPreA | kPreB)
                                ? pingpong_waves * (wave_units(1) * (1 - saving[x]) + epilogue / 2) + epilogue / 2
                                : gemm - main_loop * saving[x]) +
                           pass_units[x];
          if (pre < 0 || c < cost) { pre = x; cost = c; }
        }
        // A candidate must be 2% cheaper than the best so far (the model's error), except a tail
        // split of the same tiles as the best: the two share their whole waves, so the model's
        // error on what differs (the last wave) is far below 2% of the whole (measured: 4-way over
        // 3-way tails +1.0 to +2.5% at 1536x3072x4096, 3072x3072x4096/8192 and 768x28672x8192,
        // which a 2% margin on the whole left at 3).
        const bool same_whole_waves = whole > 0 && best_cost >= 0 && best.mi == mi && best.whole_tiles == whole;
        if (best_cost < 0 || cost < best_cost * (same_whole_waves ? 1.0 : 0.98)) {
          best_cost = cost;
          best.mi = mi;
          best.splits = splits;
          best.whole_tiles = static_cast<int>(whole);
          best.ready_bytes = splits > 1 ? ready_bytes : 0;
          best.split_bytes = splits > 1 ? need : 0;
          best.pre = pre;
        }
      }
    }
  }
  return best;
}

// Bytes of one row of a pre-converted operand: every 128-byte slab of codes becomes UnitsPerSlab
// units of 64 BF16 values.
long long PreconvertedRowBytes(const GemmAmaxProblem& p) {
  return CeilDiv(p.operand_row_bytes(), 128) * UnitsPerSlab(p) * 128;
}
long long PreconvertedARows(const GemmAmaxProblem& p) { return CeilDiv(p.m, 8) * 8; }

}  // namespace

size_t PreconvertedBBytes(const GemmAmaxProblem& p) {
  return static_cast<size_t>(p.batch * p.n * PreconvertedRowBytes(p));
}
size_t PreconvertedABytes(const GemmAmaxProblem& p) {
  return static_cast<size_t>(p.batch * PreconvertedARows(p) * PreconvertedRowBytes(p));
}

namespace {
// Split-K: partial slots for every tile (few tiles), or kSplitMaxElems elements (a tail split: the
// last wave's tiles only), and the tile counters. Plans never use more than this, however large
// the workspace (the cost model was fitted with it).
size_t SplitWorkspaceBytes(const GemmAmaxProblem& p) {
  const long long elems = CeilDiv(p.m, 256) * 256 * CeilDiv(p.n, 128) * 128 * p.batch;
  const long long slots = elems <= kSplitMaxElems / 4 ? kMaxSplits - 1 : 1;
  const long long counters = CeilDiv(CeilDiv(p.m, 128) * CeilDiv(p.n, 128) * p.batch * 4, 256) * 256;
  return static_cast<size_t>(counters + std::min(slots * elems, kSplitMaxElems) * 4);
}
bool OfferB(const GemmAmaxProblem& p) {
  return p.m >= kPreconvertBMinM && PreconvertedBBytes(p) <= static_cast<size_t>(kPreconvertMaxBytes);
}
bool OfferA(const GemmAmaxProblem& p) {
  return p.n >= kPreconvertAMinN && PreconvertedABytes(p) <= static_cast<size_t>(kPreconvertMaxBytes);
}
}  // namespace

size_t WorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies) {
  // The JAX lowering asks for this (through the extension); a smaller workspace only narrows the
  // plans. The split-K workspace, or the BF16 copies if larger (unsplit plans), or the split-K
  // workspace followed by A's copy (split plans pre-convert A only).
  const size_t split = SplitWorkspaceBytes(p);
  if (!offer_copies) return split;
  const size_t a = OfferA(p) ? PreconvertedABytes(p) : 0, b = OfferB(p) ? PreconvertedBBytes(p) : 0;
  return std::max(split + a, a + b);
}

namespace {
// The operands the options ask to pre-convert or the library offers to. PreconvertKernel numbers a copy's
// 128-byte units with 32-bit ints (256 GiB; the library offers at most kPreconvertMaxBytes,
// options may force more), and a warp's store loop counts up to 31 past the last unit.
bool CopyFits(size_t bytes) { return bytes / 128 <= static_cast<size_t>(INT_MAX - 32); }
bool WantA(const GemmAmaxProblem& p, const LaunchOptions& opt) {
  return (opt.preconvert_a == 1 || (opt.preconvert_a < 0 && OfferA(p))) && CopyFits(PreconvertedABytes(p));
}
bool WantB(const GemmAmaxProblem& p, const LaunchOptions& opt) {
  return (opt.preconvert_b == 1 || (opt.preconvert_b < 0 && OfferB(p))) && CopyFits(PreconvertedBBytes(p));
}
// Which operands an unsplit plan may pre-convert (kPreA | kPreB): those wanted, if the workspace
// holds them (B' at its start, A' after it); A is given up first.
int PreconvertPossible(const GemmAmaxProblem& p, size_t workspace_bytes, const LaunchOptions& opt) {
  const bool want_b = WantB(p, opt), want_a = WantA(p, opt);
  const size_t b = want_b ? PreconvertedBBytes(p) : 0, a = want_a ? PreconvertedABytes(p) : 0;
  if (workspace_bytes >= a + b) return (want_a ? kPreA : 0) | (want_b ? kPreB : 0);
  if (want_b && workspace_bytes >= b) return kPreB;
  return 0;
}
Plan PlanOf(const GemmAmaxProblem& p, int sms, const LaunchOptions& opt, size_t workspace_bytes, int* pre) {
  PreChoices pc;
  pc.unsplit = PreconvertPossible(p, workspace_bytes, opt);
  pc.split_a = WantA(p, opt);
  pc.required = (opt.preconvert_a == 1 ? kPreA : 0) | (opt.preconvert_b == 1 ? kPreB : 0);
  pc.workspace_bytes = workspace_bytes;
  const Plan plan = MakePlan(p, sms, opt, std::min(workspace_bytes, SplitWorkspaceBytes(p)), pc);
  *pre = plan.pre;
  return plan;
}

// A PreconvertKernel pass over one operand (A: rows permuted into the consumers' fragment order).
PreconvertParams PreconvertPass(const GemmAmaxProblem& p, const void* codes, const void* sf, long long sf_batch_stride,
                                long long rows, bool is_a, void* out) {
  PreconvertParams q;
  q.codes = static_cast<const uint8_t*>(codes);
  q.sf = static_cast<const uint8_t*>(sf);
  q.out = static_cast<uint8_t*>(out);
  q.sf_batch_stride = sf_batch_stride;
  q.row_bytes = p.operand_row_bytes();
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

// The kernel's kPre bits for a plan: its pre-converted operands, and kPingPong for an unsplit A'B'
// plan.
static int KernelPre(const Plan& plan, int pre) {
  if (plan.mi != 2 || plan.splits != 1 || pre != (kPreA | kPreB)) return pre;
  return pre | kPingPong;
}

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
  int pre = 0;
  const Plan plan = PlanOf(p, sms, opt, workspace_bytes, &pre);
  const int mi = plan.mi;

  LaunchCtx ctx{};  // zeroed: a field left unset (reset_word without amax or split) reads as null
  const int kernel_pre = KernelPre(plan, pre);
  const int cluster = ClusterCTAs(kernel_pre), tile_rows = TileRows(kernel_pre, mi);
  const uint64_t kbytes = static_cast<uint64_t>(p.operand_row_bytes());
  const uint32_t box_a = std::min(tile_rows / cluster, kBoxRows), box_b = std::min(kBN, kBoxRows);
  // The operands as codes, or (pre-converted) as BF16 units of 128 bytes in the workspace: B' at
  // its start (after the split-K counters and partials, if any), A' after it.
  uint8_t* const b_conv = static_cast<uint8_t*>(workspace) + plan.split_bytes;
  uint8_t* const a_conv = b_conv + ((pre & kPreB) ? PreconvertedBBytes(p) : 0);
  const uint64_t conv_row_bytes = static_cast<uint64_t>(PreconvertedRowBytes(p));
  const bool ok_a = (pre & kPreA) ? EncodeOperandMap(&ctx.tm_a, a_conv, conv_row_bytes, PreconvertedARows(p), p.batch, box_a)
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
  k.partials = plan.splits > 1 ? reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + plan.ready_bytes) : nullptr;
  ctx.grid = std::min(k.units_total, sms / cluster) * cluster;
  ctx.mi = mi;
  ctx.pre = kernel_pre;
  if (pre & kPreB) ctx.pre_b = PreconvertPass(p, buf.b, buf.sfb, k.sfb_batch_stride, p.n, false, b_conv);
  if (pre & kPreA) ctx.pre_a = PreconvertPass(p, buf.a, buf.sfa, k.sfa_batch_stride, p.m, true, a_conv);
  ctx.device = dev;
  ctx.stream = stream;

  // amax and the split-K counters: zeroed by the kernel itself (ResetRound), on this device's word.
  if (!opt.skip_amax || plan.splits > 1) {
    k.reset_word = opt.reset_word != nullptr ? opt.reset_word
                   : dev < kMaxDevices       ? g_reset_word[dev].load(std::memory_order_acquire)
                                             : nullptr;
    if (k.reset_word == nullptr) return cudaErrorNotReady;  // Prepare() did not run on this device
  }

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

cudaError_t PlanFor(const GemmAmaxProblem& p, size_t workspace_bytes, const LaunchOptions& opt, PlanInfo* info,
                    int sms) {
  int dev = -1;
  if (sms <= 0) {
    const cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    sms = SmCount(dev);
  }
  int pre = 0;
  const Plan plan = PlanOf(p, sms, opt, workspace_bytes, &pre);
  info->preconvert_a = (pre & kPreA) != 0;
  info->preconvert_b = (pre & kPreB) != 0;
  info->tile_m = 128 * plan.mi;
  info->splits = plan.splits;
  info->whole_tiles = plan.whole_tiles;
  info->clusters = dev >= 0 && dev < kMaxDevices
                       ? MaxActiveClusters(dev, VariantOf(p), plan.mi, KernelKind(plan.splits > 1, KernelPre(plan, pre)))
                       : 0;
  return cudaSuccess;
}

cudaError_t AllocResetWord(unsigned int** word) {
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, sizeof(unsigned int));
  if (err == cudaSuccess) err = cudaMemset(ptr, 0, sizeof(unsigned int));
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
