// The SM100 (Blackwell, sm_100a) gemm_amax kernel, assembled from CUTLASS 4.x.
//
// Mainloop: CUTLASS's block-scaled collective,
//   CollectiveBuilder<arch::Sm100, arch::OpClassBlockScaledTensorOp, ...>,
// a persistent warp-specialized kernel (TMA loads of A/B/SFA/SFB, tcgen05.mma ... block_scale
// into TMEM, CLC tile scheduler). Its SFA/SFB layout, Sm1xxBlkScaledConfig::tile_atom_to_shape_SFA/
// SFB(M, N, K, L), is tile_to_shape(((32,4),(sfv,4)):((16,4),(0,1)), (MN, K, L), K-blocks inner),
// i.e. byte for byte our physical layout (L, ceil(MN/128), ceil(K/(4 sfv)), 32, 4, 4) with per-batch
// padding (problem.h ScaleOffset): scales pass through untouched.
//
// Epilogue: a visitor tree Sm90EVT<Sm90ScalarReduction<|x| max, atomic max>, Sm90AccFetch> computes
// amax on the fp32 accumulator (before any rounding) with one float per batch item
// (dScalar = (0, 0, 1): amax[l]); the SM100 epilogue reuses the SM90 visitor nodes. C is stored by
// RuntimeOutputEpilogue below: a copy of CUTLASS's "no smem" SM100 epilogue
// (sm100_epilogue_nosmem.hpp: TMEM -> registers -> predicated 16-byte global stores) whose output
// element is a run-time choice among the six c_dtypes of the contract instead of a template
// parameter. That keeps the number of kernel instantiations at one per mainloop configuration
// (each costs 30-55 s of nvcc and up to ~4.6 GB of compiler memory) instead of six, with no f32
// intermediate buffer and no extra pass over C. Each thread owns one row of a 128x64 epilogue
// subtile (tcgen05.ld 32x32b.x64) and writes it with 16-byte vector stores predicated on the
// problem bounds (M, N need no padding; rows of C are 16-byte aligned by contract).
// Conversions are CUTLASS's NumericArrayConverter with round-to-nearest-even:
// cvt.rn.satfinite.{e4m3x2,e5m2x2,e2m1x2}.f32 for the FP8/FP4 outputs (saturate to the largest
// finite value, NaN stays NaN for FP8), cvt.rn.bf16x2.f32 and cvt.rn.f16x2.f32 (overflow to inf)
// for the 16-bit ones.
//
// amax: per thread |x| max with max.NaN.f32 (NaN propagates), then per warp a redux.sync max and
// one atomicMax on the int bits per warp per output tile (valid because |x| >= +0, and a positive
// NaN's bits are above +inf's). amax[0..L) is zeroed with cudaMemsetAsync on the stream before the
// kernel; CUTLASS's own reset (Sm90ScalarReduction::initialize_workspace) is compiled out with
// CUTLASS_SKIP_REDUCTION_INIT because it calls the driver API (cuMemsetD32Async) and the
// extension must not link libcuda (it is imported on machines without a GPU driver).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#ifndef CUTLASS_SKIP_REDUCTION_INIT
#define CUTLASS_SKIP_REDUCTION_INIT 1
#endif

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/functional.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"

#include "common/problem.h"
#include "cuda/sm100/sm100_configs.h"

namespace jga {
namespace sm100 {
namespace detail {

using namespace cute;

// |x| max that propagates NaN (max.NaN.f32); the left operand is the running max (already >= 0).
template <class T>
struct AmaxReduce : cutlass::maximum_absolute_value_reduction<T, /*PropagateNaN=*/true> {};

// The global step of the amax: CUTLASS's atomic_maximum<float> issues one atomic per thread per
// tile (128 same-address atomics per tile); this one first takes the max over the warp with
// redux.sync on the int bits and lets one lane do the atomicMax (32x fewer atomics). Valid because
// every value is max|x| >= +0 or a positive NaN, whose int bits order like the values (NaN above
// +inf, so NaN propagates). All threads of the warp call it together (end() of the epilogue).
template <class T>
struct WarpAtomicMax;

template <>
struct WarpAtomicMax<float> {
  CUTLASS_DEVICE float operator()(float* ptr, float value) const {
#if defined(__CUDA_ARCH__)
    const unsigned mask = __activemask();
    const int bits = __reduce_max_sync(mask, __float_as_int(value));
    if (static_cast<int>(threadIdx.x % 32) == __ffs(mask) - 1) { atomicMax(reinterpret_cast<int*>(ptr), bits); }
#endif
    return value;
  }
};

}  // namespace detail
}  // namespace sm100
}  // namespace jga

namespace cutlass {
// Sm90ScalarReduction accepts only atomic global reductions.
template <class T>
struct is_atomic<jga::sm100::detail::WarpAtomicMax<T>> : platform::true_type {};
}  // namespace cutlass

namespace jga {
namespace sm100 {
namespace detail {

// One float per batch item: amax + l * 1.
using AmaxStride = Stride<_0, _0, int64_t>;
using AmaxNode = cutlass::epilogue::fusion::Sm90ScalarReduction<AmaxReduce, WarpAtomicMax, float, float,
                                                                cutlass::FloatRoundStyle::round_to_nearest, AmaxStride>;
using AmaxTree = cutlass::epilogue::fusion::Sm90EVT<AmaxNode, cutlass::epilogue::fusion::Sm90AccFetch>;

// C is row-major (L, M, N) for every output type, strides in elements (FP4: two per byte).
using StrideOut = Stride<int64_t, _1, int64_t>;

// ---------------------------------------------------------------------------------------------
// RuntimeOutputEpilogue: CUTLASS's Sm100NoSmem collective epilogue (sm100_epilogue_nosmem.hpp,
// the fusion-callbacks specialization) with the D element chosen at run time. Differences from
// the original: no C source (beta = 0), D is a void pointer plus an OutputType, the store is a
// switch over the six output types (each branch is the original's predicated vector store), and
// the smem reduction hook is not called (the amax tree has no smem reduction).
// ---------------------------------------------------------------------------------------------
template <class EpilogueTile_, class FusionCallbacks_, class CopyOpT2R_>
class RuntimeOutputEpilogueImpl {
 public:
  using DispatchPolicy = cutlass::epilogue::Sm100NoSmem;
  using ElementC = void;
  using ElementD = float;  // nominal: the stored type is Params::c_type
  using GmemElementC = float;
  using StrideC = StrideOut;
  using StrideD = StrideOut;
  using EpilogueTile = EpilogueTile_;
  using CopyOpT2R = CopyOpT2R_;
  using FusionCallbacks = FusionCallbacks_;
  using ThreadEpilogueOp = typename cutlass::epilogue::fusion::FusionCallbacksTraits<FusionCallbacks>::Operation;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  static constexpr int ThreadCount = 128;
  static constexpr uint32_t TmaTransactionBytes = 0;
  static constexpr int kStoreBits = 128;  // 16-byte stores; the contract guarantees 16-byte aligned rows of C

  struct SharedStorage {
    using FusionStorage = typename FusionCallbacks::SharedStorage;
    FusionStorage thread;
  };

  struct Arguments {
    typename FusionCallbacks::Arguments thread{};
    void* ptr_D = nullptr;
    StrideD dD = {};
    OutputType c_type = OutputType::kF32;
  };

  struct Params {
    typename FusionCallbacks::Params thread{};
    void* ptr_D = nullptr;
    StrideD dD = {};
    OutputType c_type = OutputType::kF32;
  };

  CUTLASS_DEVICE
  RuntimeOutputEpilogueImpl(Params const& params_, SharedStorage& shared_tensors)
      : fusion_callbacks(params_.thread, shared_tensors.thread), params(params_) {}

 protected:
  FusionCallbacks fusion_callbacks;
  Params const& params;

 public:
  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                                  void* workspace) {
    return {FusionCallbacks::to_underlying_arguments(problem_shape, args.thread, workspace), args.ptr_D, args.dD,
            args.c_type};
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const& args) {
    return FusionCallbacks::get_workspace_size(problem_shape, args.thread);
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const& problem_shape, Arguments const& args, void* workspace,
                                              cudaStream_t stream, cutlass::CudaHostAdapter* cuda_adapter = nullptr) {
    return FusionCallbacks::initialize_workspace(problem_shape, args.thread, workspace, stream, cuda_adapter);
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto problem_shape_mnkl = append<4>(problem_shape, 1);
    const int64_t n = get<1>(problem_shape_mnkl);
    const int bits = OutputBits(args.c_type);
    if (bits == 0 || args.ptr_D == nullptr) return false;
    const bool aligned = (n * bits) % kStoreBits == 0 && (get<0>(args.dD) * bits) % kStoreBits == 0 &&
                         (get<2>(args.dD) * bits) % kStoreBits == 0 &&
                         reinterpret_cast<uintptr_t>(args.ptr_D) % (kStoreBits / 8) == 0;
    return aligned && FusionCallbacks::can_implement(problem_shape, args.thread);
  }

  // Converts the fp32 subtile `tTR_rD` to T and stores it with predicated 16-byte vector stores
  // (the body of Sm100NoSmem's D store with ElementD = T, AlignmentD = 128 / bits(T)).
  template <class T, class TensorRD, class TensorPred, class ProblemShapeMNL, class CtaTileMNK, class CtaCoordMNKL,
            class TiledT2R>
  CUTLASS_DEVICE void store_subtile(TensorRD const& tTR_rD, TensorPred const& tTR_pCD_mn,
                                    ProblemShapeMNL const& problem_shape_mnl, CtaTileMNK const& cta_tile_mnk,
                                    CtaCoordMNKL const& cta_coord_mnkl, TiledT2R const& tiled_t2r, int thread_idx,
                                    int epi_m, int epi_n) const {
    constexpr bool RefSrc = false;
    constexpr int FragmentSize = size(EpilogueTile{}) / ThreadCount;
    constexpr int AlignmentD = kStoreBits / cute::sizeof_bits_v<T>;

    Tensor mD =
        make_tensor(make_gmem_ptr(recast_ptr<T>(reinterpret_cast<T*>(params.ptr_D))), problem_shape_mnl, params.dD);
    Tensor tTR_gD = cutlass::epilogue::fusion::sm90_partition_for_epilogue<RefSrc>(
        mD, cta_tile_mnk, cta_coord_mnkl, EpilogueTile{}, tiled_t2r, thread_idx);  // (T2R,T2R_M,T2R_N,EPI_M,EPI_N)
    Tensor tTR_rT = make_tensor<T>(take<0, 3>(shape(tTR_gD)));                     // (T2R,T2R_M,T2R_N)

    Tensor src_frg = recast<cutlass::Array<float, FragmentSize>>(coalesce(tTR_rD));
    Tensor dst_frg = recast<cutlass::Array<T, FragmentSize>>(coalesce(tTR_rT));
    cutlass::NumericArrayConverter<T, float, FragmentSize, cutlass::FloatRoundStyle::round_to_nearest> convert;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < size(src_frg); ++v) { dst_frg(v) = convert(src_frg(v)); }

    constexpr auto mclD = decltype(max_common_layout(tTR_gD(_, _, _, _0{}, _0{}), tTR_rT)){};
    constexpr int VD = cute::min(AlignmentD, size(mclD));
    using VecType = cute::uint_bit_t<VD * cute::sizeof_bits_v<T>>;
    Tensor tTR_gD_frg = recast<VecType>(coalesce(tTR_gD(_, _, _, epi_m, epi_n)));
    Tensor tTR_rD_frg = recast<VecType>(coalesce(tTR_rT));
    Tensor tTR_pD_frg = tensor<1>(zipped_divide(coalesce(tTR_pCD_mn), mclD.compose(Int<VD>{})));
    copy_if(tTR_pD_frg, tTR_rD_frg, tTR_gD_frg);
  }

  template <bool ReuseTmem = false, class AccumulatorPipeline, class AccumulatorPipelineState, class ProblemShapeMNKL,
            class CtaTileMNK, class CtaCoordMNKL, class AccEngine, class AccLayout>
  CUTLASS_DEVICE auto operator()(AccumulatorPipeline acc_pipeline, AccumulatorPipelineState acc_pipe_consumer_state,
                                 ProblemShapeMNKL problem_shape_mnkl, CtaTileMNK cta_tile_mnk,
                                 CtaCoordMNKL cta_coord_mnkl, cute::Tensor<AccEngine, AccLayout> accumulators,
                                 [[maybe_unused]] SharedStorage&) {
    using ElementAccumulator = typename AccEngine::value_type;
    static_assert(cute::is_same_v<ElementAccumulator, float>, "fp32 accumulators expected");
    static_assert(is_tmem<AccEngine>::value, "Accumulator must be TMEM resident.");
    static_assert(rank(ProblemShapeMNKL{}) == 4, "ProblemShapeMNKL must be rank 4");
    static_assert(rank(CtaCoordMNKL{}) == 4, "TileCoordMNKL must be rank 4");

    auto [M, N, K, L] = problem_shape_mnkl;
    auto problem_shape_mnl = select<0, 1, 3>(problem_shape_mnkl);
    auto cta_coord_mnl = select<0, 1, 3>(cta_coord_mnkl);
    auto cta_tiler = take<0, 2>(cta_tile_mnk);

    int thread_idx = threadIdx.x % ThreadCount;

    Tensor tAcc = accumulators(make_coord(_, _), _0{}, _0{});  // (CTA_M,CTA_N)
    Tensor tAcc_epi = flat_divide(tAcc, EpilogueTile{});       // (EPI_TILE_M,EPI_TILE_N,EPI_M,EPI_N)
    TiledCopy tiled_t2r = make_tmem_copy(CopyOpT2R{}, tAcc_epi(_, _, _0{}, _0{}));
    ThrCopy thread_t2r = tiled_t2r.get_slice(thread_idx);
    Tensor tTR_tAcc = thread_t2r.partition_S(tAcc_epi);  // (T2R,T2R_M,T2R_N,EPI_M,EPI_N)

    constexpr int FragmentSize = size(EpilogueTile{}) / ThreadCount;

    Tensor coordD = make_identity_tensor(problem_shape_mnl);   // (M,N,L) -> (m,n,l)
    Tensor cD = local_tile(coordD, cta_tiler, cta_coord_mnl);  // (CTA_M,CTA_N) -> (m,n,l)
    Tensor cD_epi = flat_divide(cD, EpilogueTile{});
    Tensor tTR_cD = thread_t2r.partition_D(cD_epi);  // (T2R,T2R_M,T2R_N,EPI_M,EPI_N) -> (m,n,l)

    Tensor tTR_rAcc = make_tensor<ElementAccumulator>(shape(tTR_cD(_, _, _, _0{}, _0{})));
    Tensor tTR_rD = make_tensor<float>(shape(tTR_cD(_, _, _, _0{}, _0{})));  // visitor output (fp32)

    // Construct the EVT consumer callbacks
    auto residue_cD = make_coord(M, N) - cD(_0{});
    auto residue_tTR_cD = make_coord(M, N) - tTR_cD(_0{});
    Tensor cD_ = make_coord_tensor(cD.layout());
    Tensor tTR_cD_ = make_coord_tensor(tTR_cD.layout());
    constexpr bool RefSrc = false;

    Tensor coord_cCD = make_identity_tensor(problem_shape_mnl);
    Tensor tTR_cCD = cutlass::epilogue::fusion::sm90_partition_for_epilogue<RefSrc>(
        coord_cCD, cta_tile_mnk, cta_coord_mnkl, EpilogueTile{}, tiled_t2r, thread_idx);

    auto tCrC = make_tensor<GmemElementC>(take<0, 3>(shape(tTR_cCD)));  // no source: never read

    Tensor tTR_rD_frg = recast<cutlass::Array<float, FragmentSize>>(coalesce(tTR_rD));

    auto cst_args = cutlass::epilogue::fusion::detail::ConsumerStoreArgs{
        problem_shape_mnkl, cta_tile_mnk, cta_coord_mnkl, int(0), EpilogueTile{}, tiled_t2r, cD_,
        residue_cD,         tTR_cD_,      residue_tTR_cD, tCrC,   thread_idx};

    auto synchronize = []() CUTLASS_LAMBDA_FUNC_INLINE {
      cutlass::arch::NamedBarrier::sync(ThreadCount, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    };

    const OutputType c_type = params.c_type;

    auto epi_loop_fn = [&](auto& cst_callbacks) CUTLASS_LAMBDA_FUNC_INLINE {
      // Ensure there are no threads from the previous wave still using shared memory.
      synchronize();
      cst_callbacks.begin();
      if (cst_callbacks.begin_sync_needed()) { synchronize(); }

      [[maybe_unused]] bool reverse_epi_n = ReuseTmem && acc_pipe_consumer_state.phase() == 0;
      static_assert(not(ReuseTmem && AccumulatorPipeline::Stages != 1), "Tmem reuse requires 1 accumulator stage");

      constexpr int NumEpiSubtilesN = CUTE_STATIC_V(size<4>(tTR_tAcc));
      constexpr int NumEpiSubtilesM = CUTE_STATIC_V(size<3>(tTR_tAcc));
      CUTLASS_PRAGMA_UNROLL
      for (int iter_n = 0; iter_n < NumEpiSubtilesN; ++iter_n) {
        CUTLASS_PRAGMA_UNROLL
        for (int iter_m = 0; iter_m < NumEpiSubtilesM; ++iter_m) {
          int epi_m = iter_m, epi_n = iter_n;
          bool is_last_iteration = iter_m == size<3>(tTR_tAcc) - 1 && iter_n == size<4>(tTR_tAcc) - 1;
          bool do_acc_release = is_last_iteration;

          if constexpr (ReuseTmem) {
            if (reverse_epi_n) { epi_n = size<4>(tTR_tAcc) - 1 - iter_n; }
            do_acc_release = iter_m == size<3>(tTR_tAcc) - 1 && iter_n == 0;
          }

          Tensor tTR_cCD_mn = tTR_cCD(_, _, _, epi_m, epi_n);
          Tensor tTR_pCD_mn = cute::lazy::transform(
              tTR_cCD_mn, [&](auto const& c) CUTLASS_LAMBDA_FUNC_INLINE { return elem_less(c, problem_shape_mnl); });
          cst_callbacks.begin_loop(epi_m, epi_n);

          // Copy the accumulator subtile from TMEM to registers
          Tensor tTR_tAcc_mn = tTR_tAcc(_, _, _, epi_m, epi_n);
          Tensor tTR_rAcc_frg = recast<cutlass::Array<ElementAccumulator, FragmentSize>>(coalesce(tTR_rAcc));
          copy(tiled_t2r, tTR_tAcc_mn, tTR_rAcc);

          // After the last TMEM load, signal that the TMEM buffer is consumed and empty
          if (do_acc_release) {
            cutlass::arch::fence_view_async_tmem_load();
            acc_pipeline.consumer_release(acc_pipe_consumer_state);
            ++acc_pipe_consumer_state;
          }

          // Visitor tree: amax on the fp32 accumulator; returns the accumulator unchanged.
          CUTLASS_PRAGMA_UNROLL
          for (int epi_v = 0; epi_v < size(tTR_rAcc_frg); ++epi_v) {
            tTR_rD_frg(epi_v) = cst_callbacks.visit(tTR_rAcc_frg(epi_v), epi_v, epi_m, epi_n);
          }

          cst_callbacks.end_loop(epi_m, epi_n);

          // One store per output dtype, chosen at run time (the element type is the tag's type).
          auto store = [&](auto element) {
            store_subtile<decltype(element)>(tTR_rD, tTR_pCD_mn, problem_shape_mnl, cta_tile_mnk, cta_coord_mnkl,
                                             tiled_t2r, thread_idx, epi_m, epi_n);
          };
          switch (c_type) {
            case OutputType::kF32: store(float{}); break;
            case OutputType::kF16: store(cutlass::half_t{}); break;
            case OutputType::kBF16: store(cutlass::bfloat16_t{}); break;
            case OutputType::kE4M3: store(cutlass::float_e4m3_t{}); break;
            case OutputType::kE5M2: store(cutlass::float_e5m2_t{}); break;
            case OutputType::kE2M1x2: store(cutlass::float_e2m1_t{}); break;
          }
        }  // for epi_m
      }  // for epi_n

      cst_callbacks.end();  // amax: one atomic max per thread for this tile
    };

    auto cst_callbacks = fusion_callbacks.template get_consumer_store_callbacks<RefSrc>(cst_args);
    epi_loop_fn(cst_callbacks);
    return cute::make_tuple(acc_pipe_consumer_state);
  }
};

// The warp-specialized wrapper the SM100 GEMM kernel expects (as CUTLASS does for Sm100NoSmem).
template <class EpilogueTile_, class FusionCallbacks_, class CopyOpT2R_>
class RuntimeOutputEpilogue : public cutlass::epilogue::collective::detail::Sm100TmaWarpSpecializedAdapter<
                                  RuntimeOutputEpilogueImpl<EpilogueTile_, FusionCallbacks_, CopyOpT2R_>> {
 public:
  using Base = cutlass::epilogue::collective::detail::Sm100TmaWarpSpecializedAdapter<
      RuntimeOutputEpilogueImpl<EpilogueTile_, FusionCallbacks_, CopyOpT2R_>>;
  using Base::Base;
};

// ---------------------------------------------------------------------------------------------
// One kernel configuration: operand format (CUTLASS element pair + mainloop schedule), MMA tile
// (1-SM with M = 128; M = 256 with the 2-SM schedules), dynamic cluster shape (any of {1,2,4}^2 at
// run time; CLUSTER_M even for 2-SM).
// ---------------------------------------------------------------------------------------------
template <class ElementPair_, class MainloopSchedule_, int TileN_, int TileK_, int AlignmentAB_, int TileM_ = 128,
          class EpilogueSchedule_ = cutlass::epilogue::NoSmemWarpSpecialized1Sm>
struct Sm100Gemm {
  using ElementPair = ElementPair_;
  static constexpr int kCtasPerMma = TileM_ / 128;  // 2 for the 2-SM (cta_group::2) tiles
  using MmaTileShape = Shape<Int<TileM_>, Int<TileN_>, Int<TileK_>>;
  using ClusterShape = Shape<int, int, _1>;  // dynamic: cluster_shape_mn is a run-time argument

  // The stock "no smem" epilogue for an fp32 D gives the epilogue subtile and the TMEM load op that
  // RuntimeOutputEpilogue reuses (fp32 is the widest output, so the same TMEM load suits all).
  using StockEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, 4, float,
      cutlass::layout::RowMajor, 4, EpilogueSchedule_, AmaxTree>::CollectiveOp;

  using CollectiveEpilogue =
      RuntimeOutputEpilogue<typename StockEpilogue::EpilogueTile, AmaxTree, typename StockEpilogue::CopyOpT2R>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPair, cutlass::layout::RowMajor,
      AlignmentAB_, ElementPair, cutlass::layout::ColumnMajor, AlignmentAB_, float, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule_>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

// Multiprocessor count of `device`, cached (queried once per device).
inline int SmCount(int device) {
  static std::array<std::atomic<int>, 64> cache{};
  if (device >= 0 && device < 64) {
    int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (device >= 0 && device < 64) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

template <class Config>
typename Config::Gemm::Arguments MakeArguments(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, int device,
                                               int sm_count) {
  using Gemm = typename Config::Gemm;
  using Mainloop = typename Config::CollectiveMainloop;
  using BlkScaledConfig = typename Mainloop::Sm1xxBlkScaledConfig;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using ElementA = typename Mainloop::ArrayElementA;
  using ElementB = typename Mainloop::ArrayElementB;
  using ElementSF = typename Mainloop::ElementSF;

  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int l = static_cast<int>(p.batch);
  auto problem = make_shape(m, n, k, l);

  // A (L, M, K) and B (L, N, K), K-major; strides in elements (FP4 elements for packed operands).
  StrideA stride_a = make_stride(int64_t(k), _1{}, int64_t(m) * k);
  StrideB stride_b = make_stride(int64_t(k), _1{}, int64_t(n) * k);
  StrideOut stride_c = make_stride(int64_t(n), _1{}, int64_t(m) * n);

  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = problem;
  args.mainloop.ptr_A = reinterpret_cast<ElementA const*>(buf.a);
  args.mainloop.dA = stride_a;
  args.mainloop.ptr_B = reinterpret_cast<ElementB const*>(buf.b);
  args.mainloop.dB = stride_b;
  args.mainloop.ptr_SFA = reinterpret_cast<ElementSF const*>(buf.sfa);
  args.mainloop.layout_SFA = BlkScaledConfig::tile_atom_to_shape_SFA(problem);
  args.mainloop.ptr_SFB = reinterpret_cast<ElementSF const*>(buf.sfb);
  args.mainloop.layout_SFB = BlkScaledConfig::tile_atom_to_shape_SFB(problem);
  if constexpr (Mainloop::IsRuntimeDataTypeA) {
    using Fmt = cute::UMMA::MXF8F6F4Format;
    const Fmt fmt = p.ab_type == OperandType::kE5M2 ? Fmt::E5M2 : Fmt::E4M3;
    args.mainloop.runtime_data_type_a = fmt;
    args.mainloop.runtime_data_type_b = fmt;
  }

  // amax tree: Sm90EVT<ScalarReduction, AccFetch> -> {AccFetch args, ScalarReduction args}
  typename AmaxNode::Arguments amax_args;
  amax_args.ptr_scalar = buf.amax;
  amax_args.reduction_identity = 0.0f;
  amax_args.dScalar = make_stride(_0{}, _0{}, int64_t(1));
  args.epilogue.thread = {{}, amax_args};
  args.epilogue.ptr_D = buf.c;
  args.epilogue.dD = stride_c;
  args.epilogue.c_type = p.c_type;

  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  args.hw_info.cluster_shape = dim3(p.cluster_m, p.cluster_n, 1);
  // Where the requested cluster cannot be scheduled, CUDA falls back to the smallest cluster the
  // MMA allows (1x1, or 2x1 for 2-SM tiles); CUTLASS builds the matching TMA descriptors for both.
  args.hw_info.cluster_shape_fallback = dim3(Config::kCtasPerMma, 1, 1);
  return args;
}

// CUTLASS's workspace for `p` (host only: no CUDA call). With the persistent CLC tile scheduler and
// no stream-K it is 0 for every configuration; the nominal SM count (B200: 148) does not enter it.
template <class Config>
size_t WorkspaceOf(const GemmAmaxProblem& p) {
  GemmAmaxBuffers dummy;
  auto args = MakeArguments<Config>(p, dummy, 0, 148);
  return Config::Gemm::get_workspace_size(args);
}

template <class Config>
cudaError_t Run(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, cudaStream_t stream,
                const char** error_message) {
  auto fail = [&](const char* msg, cudaError_t err) {
    if (error_message) *error_message = msg;
    return err;
  };
  // cudaGetDevice, not cudaStreamGetDevice: the latter is refused while XLA captures the stream.
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return fail("cudaGetDevice failed", err);
  const int sm_count = SmCount(device);
  if (sm_count <= 0) return fail("could not query the multiprocessor count", cudaErrorInvalidDevice);

  using Gemm = typename Config::Gemm;
  auto args = MakeArguments<Config>(p, buf, device, sm_count);

  Gemm gemm;
  cutlass::Status status = gemm.can_implement(args);
  if (status != cutlass::Status::kSuccess)
    return fail(
        "CUTLASS can_implement rejected the problem (alignment of A/B/C rows or pointers, cluster shape "
        "not a power of two <= 4, or an unsupported shape)",
        cudaErrorInvalidValue);
  if (Gemm::get_workspace_size(args) > 0 && workspace == nullptr)
    return fail("the CUTLASS kernel needs a workspace and none was given", cudaErrorInvalidValue);

  // amax is reset on every call, on the stream, before the kernel (one float per batch item).
  err = cudaMemsetAsync(buf.amax, 0, sizeof(float) * static_cast<size_t>(p.batch), stream);
  if (err != cudaSuccess) return fail("resetting amax failed", err);

  status = gemm.initialize(args, workspace, stream);
  if (status != cutlass::Status::kSuccess) {
    cudaError_t last = cudaGetLastError();
    return fail("CUTLASS initialize failed (TMA descriptor creation or the shared-memory size attribute)",
                last != cudaSuccess ? last : cudaErrorUnknown);
  }
  status = gemm.run(stream);
  if (status != cutlass::Status::kSuccess) {
    cudaError_t last = cudaGetLastError();
    return fail("CUTLASS kernel launch failed", last != cudaSuccess ? last : cudaErrorLaunchFailure);
  }
  return cudaSuccess;
}

// Loads the kernel on the current device (CUDA loads modules lazily) and raises its dynamic
// shared-memory limit, outside stream capture: called from the FFI instantiate stage.
template <class Config>
cudaError_t Prepare() {
  using GemmKernel = typename Config::Gemm::GemmKernel;
  return cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(GemmKernel::SharedStorageSize));
}

}  // namespace detail
}  // namespace sm100
}  // namespace jga

// Defines the ConfigFns entry `name` for a configuration (one per translation unit).
#define JGA_SM100_DEFINE_CONFIG(name, ...)                                                               \
  namespace jga {                                                                                        \
  namespace sm100 {                                                                                      \
  namespace {                                                                                            \
  using name##_type = ::jga::sm100::detail::Sm100Gemm<__VA_ARGS__>;                                      \
  size_t name##_workspace(const GemmAmaxProblem& p) { return detail::WorkspaceOf<name##_type>(p); }      \
  cudaError_t name##_launch(const GemmAmaxProblem& p, const GemmAmaxBuffers& b, void* w, cudaStream_t s, \
                            const char** e) {                                                            \
    return detail::Run<name##_type>(p, b, w, s, e);                                                      \
  }                                                                                                      \
  cudaError_t name##_prepare() { return detail::Prepare<name##_type>(); }                                \
  }                                                                                                      \
  extern const ConfigFns name = {&name##_workspace, &name##_launch, &name##_prepare};                    \
  }                                                                                                      \
  }
