// The SM90 planner: the cost model that picks a launch's kernel, tile height, split-K factor and
// pre-converted operands, and the workspace its plans use (sm90_planner.h).
#include "cuda/sm90/sm90_planner.h"

#include <algorithm>
#include <climits>

#include "cuda/sm90/sm90_config.cuh"

namespace jga {
namespace sm90 {

long long UnitsPerSlab(const GemmAmaxProblem& p) { return p.fp4_operands() ? 4 : 2; }
long long PreconvertedRowBytes(const GemmAmaxProblem& p) {
  return CeilDiv(p.operand_row_bytes(), 128) * UnitsPerSlab(p) * 128;
}
long long PreconvertedARows(const GemmAmaxProblem& p) { return CeilDiv(p.m, 8) * 8; }
size_t PreconvertedBBytes(const GemmAmaxProblem& p) {
  return static_cast<size_t>(p.batch * p.n * PreconvertedRowBytes(p));
}
size_t PreconvertedABytes(const GemmAmaxProblem& p) {
  return static_cast<size_t>(p.batch * PreconvertedARows(p) * PreconvertedRowBytes(p));
}

namespace {

// Tile height (MI) and split-K factor, from a cost model in units of one 64-K MMA unit of a
// 256-row tile, by waves of work units over the SMs: a unit of tile 128 costs 0.60 (it runs at
// ~0.83x the rate of tile 256 since it has two B converters); each unit costs a pipeline fill plus
// its epilogue; a split tile costs the partial tiles' store, the reducer's wait and its read
// (128 KB per split at tile 256): kSplitCostPerRowBlock x MI units per extra split, + 0.6. Fitted
// to H200 timings (benchmarks/sm90_harness): 256x8192x8192 tile 256 / 2 splits 503 TF/s vs tile
// 128 unsplit 433; tile 128 vs tile 256 and tail splits (512x4096x4096, 640x8192x2048,
// 2560x1792x4096); with the reducer's extra K (kSplitReducerBonusUnits), 2.0 x MI picks the best
// measured plan (within 2%; readings of one plan pooled over builds) at 31 of 32 shapes, against 19
// of 32 for 3.8 x MI, the fit without it (the 2.0 build against the 3.8 one: 768x28672x8192 +10%,
// 256x8192x4096 and 640x8192x1024 +9%, 2560x4096x2048 and 128x2048x2048 +8%, 512x4096x4096,
// 1024x14336x4096 and 2048x5120x2048 +6%; 512x5120x4096 -4%, a 4-way tail split at tile 128 instead
// of tile 256 unsplit with A pre-converted).
// Candidates: every tile split S ways (S = 1: no split-K), or, when the last wave of tiles is
// partial, the whole waves unsplit and only the last wave's tiles split. Only plans whose split-K
// workspace fits in `available` bytes are considered.
constexpr double kSplitCostPerRowBlock = 2.0;  // per 128 rows of the tile and extra split (above)
// Each tile-256 candidate is priced with every choice of operands it may pre-convert (PreChoices):
// converting X once per call in passes saves kPreconvertSaving[fp4][X] of the GEMM's main loop (no
// operand conversion left in its CTAs; the epilogues and a split plan's hand-over of partial tiles
// stay as they are), and the passes cost their bytes (codes read, BF16 written) at
// kPassBytesPerUnit plus a fixed cost, kFirstPassUnits for the first (a launch boundary and a wave)
// and kSecondPassUnits for the second (its start overlaps the first: PDL). One cost unit is ~1 us
// at tile 256 (0.92-1.04 us at 3072x3072x1024, 4096^3, 8192^3 without pre-conversion).
// A saving priced on the whole GEMM time fits as well unsplit but took A' for split plans at
// K = 1024 where it loses (2048x3072x1024 -1.8%, 640x8192x1024 -7% as tile 256 + A' over tile
// 128): there a split tile's hand-over is a third of its time.
// Both operands (the unsplit A'B' plan) run the ping-pong kernel (KernelPre), priced by its own
// waves (PingPongWaves): a consumer warpgroup's epilogue (a 128-row tile's, half a 256-row one's)
// runs beside the other's main loop, so a wave pays half the epilogue, and the last tile's half
// is paid whole.
// Fitted by least squares on relative error (each shape's scale free) to every choice at tile 256
// unsplit, the choices taking turns in one process on an H200: fp8 32 shapes (RMS 1.2%), fp4 32
// mxfp4 + 12 nvfp4 shapes (RMS 1.4% / 2.0%; with fp8's values 3.7% / 2.2%: an fp4 code costs the
// consumers more to convert); before the ping-pong kernel, 102 readings of 17 shapes with each
// choice and 17 pairs of choices, 8 of them split plans with and without A' (RMS 1.3%; the model's
// choice the measured best at 30 of 34, the other 4 within 0.1-1.8% of it). Indexed by
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

double PassUnits(const GemmAmaxProblem& p, int pre) {
  if (pre == 0) return 0.0;
  const double row_bytes = static_cast<double>(p.operand_row_bytes()) * p.batch;
  double bytes = 0;
  if (pre & kPreB) bytes += row_bytes * p.n + PreconvertedBBytes(p);
  if (pre & kPreA) bytes += static_cast<double>(p.a_row_bytes()) * p.batch * p.m + PreconvertedABytes(p);
  return bytes / kPassBytesPerUnit + kFirstPassUnits + (pre == (kPreA | kPreB) ? kSecondPassUnits : 0.0);
}

// What a plan may pre-convert: tile 256 unsplit, any part of `unsplit` (the operands wanted whose
// copies fit the workspace together); tile 256 split, A alone if wanted and its copy fits after the
// split-K area (each CTA reads only its own K range of B once, so B's pass would not pay, but
// every n-tile converts the same A rows). Operands the options force (`required`) are taken by
// every candidate that allows them.
struct PreChoices {
  int unsplit = 0;       // kPreA | kPreB
  bool split_a = false;  // A wanted for split plans
  int required = 0;      // forced by the options
  size_t workspace_bytes = 0;
};

Plan MakePlan(const GemmAmaxProblem& p, int sms, const PlanOptions& opt, size_t available, const PreChoices& pc) {
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
    auto wave_units = [&](int splits) { return static_cast<double>(CeilDiv(nslabs, splits) * units_per_slab) * rate; };
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
        const size_t need =
            static_cast<size_t>(splits - 1) * split_tiles * (128 * mi) * 128 * sizeof(float) + ready_bytes;
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
          if (p.weight_only() && (x & kPreA) == 0) continue;  // A' is how these kernels read 16-bit A
          // A'B' (offered to unsplit tile 256 only) runs the ping-pong kernel: its own waves.
          const double c =
              (x == (kPreA | kPreB) ? pingpong_waves * (wave_units(1) * (1 - saving[x]) + epilogue / 2) + epilogue / 2
                                    : gemm - main_loop * saving[x]) +
              pass_units[x];
          if (pre < 0 || c < cost) {
            pre = x;
            cost = c;
          }
        }
        if (pre < 0) continue;  // weight-only, and A' does not fit
        // A candidate must be 2% cheaper than the best so far (the model's error), except a tail
        // split of the same tiles as the best: the two share their whole waves, so the model's
        // error on what differs (the last wave) is far below 2% of the whole (4-way over 3-way
        // tails measured +1.0 to +2.5% at 1536x3072x4096, 3072x3072x4096/8192 and 768x28672x8192,
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

// The operands the options ask to pre-convert or the library offers to (CopyFits: the library offers
// at most kPreconvertMaxBytes, options may force more).
bool WantA(const GemmAmaxProblem& p, const PlanOptions& opt) {
  return (opt.preconvert_a == 1 || (opt.preconvert_a < 0 && OfferA(p))) && CopyFits(PreconvertedABytes(p));
}
bool WantB(const GemmAmaxProblem& p, const PlanOptions& opt) {
  return (opt.preconvert_b == 1 || (opt.preconvert_b < 0 && OfferB(p))) && CopyFits(PreconvertedBBytes(p));
}
// Which operands an unsplit plan may pre-convert (kPreA | kPreB): those wanted, if the workspace
// holds them (B' at its start, A' after it); A is given up first.
int PreconvertPossible(const GemmAmaxProblem& p, size_t workspace_bytes, const PlanOptions& opt) {
  const bool want_b = WantB(p, opt), want_a = WantA(p, opt);
  const size_t b = want_b ? PreconvertedBBytes(p) : 0, a = want_a ? PreconvertedABytes(p) : 0;
  if (workspace_bytes >= a + b) return (want_a ? kPreA : 0) | (want_b ? kPreB : 0);
  if (want_b && workspace_bytes >= b) return kPreB;
  return 0;
}

}  // namespace

bool CopyFits(size_t bytes) { return bytes / 128 <= static_cast<size_t>(INT_MAX - 32); }

size_t WorkspaceBytes(const GemmAmaxProblem& p, bool offer_copies) {
  // The JAX lowering asks for this (through the extension); a smaller workspace only narrows the
  // plans. The split-K workspace, or the BF16 copies if larger (unsplit plans), or the split-K
  // workspace followed by A's copy (split plans pre-convert A only).
  const size_t split = SplitWorkspaceBytes(p);
  if (!offer_copies) return split;
  const size_t a = OfferA(p) || p.weight_only() ? PreconvertedABytes(p) : 0, b = OfferB(p) ? PreconvertedBBytes(p) : 0;
  return std::max(split + a, a + b);
}

Plan PlanOf(const GemmAmaxProblem& p, int sms, const PlanOptions& options, size_t workspace_bytes) {
  PlanOptions opt = options;
  if (p.weight_only()) {  // only the tile-256 A' kernels read a 16-bit A (its copy, PreconvertValuesKernel)
    opt.force_tile_m = 256;
    opt.preconvert_a = 1;
  }
  PreChoices pc;
  pc.unsplit = PreconvertPossible(p, workspace_bytes, opt);
  pc.split_a = WantA(p, opt);
  pc.required = (opt.preconvert_a == 1 ? kPreA : 0) | (opt.preconvert_b == 1 ? kPreB : 0);
  pc.workspace_bytes = workspace_bytes;
  return MakePlan(p, sms, opt, std::min(workspace_bytes, SplitWorkspaceBytes(p)), pc);
}

int KernelPre(const Plan& plan) {
  if (plan.mi != 2 || plan.splits != 1 || plan.pre != (kPreA | kPreB)) return plan.pre;
  return plan.pre | kPingPong;
}

}  // namespace sm90
}  // namespace jga
