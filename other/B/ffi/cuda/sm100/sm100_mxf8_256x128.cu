// FP8 operands (e4m3 | e5m2 at run time), e8m0 scales, sf_vec_size 32, on the 2-SM path:
// MMA tile 256x128x128 computed by a CTA pair (tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale,
// each CTA holds 128 rows of the accumulator); cluster_shape_mn needs an even CLUSTER_M.
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kMxf8_256x128, cutlass::type_erased_dynamic_mx_float8_t,
                        cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100, 128, 128, 16, 256,
                        cutlass::epilogue::NoSmemWarpSpecialized2Sm)
