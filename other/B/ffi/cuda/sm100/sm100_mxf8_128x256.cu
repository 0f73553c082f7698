// FP8 operands (e4m3 | e5m2 at run time), e8m0 scales, sf_vec_size 32: kind::mxf8f6f4.block_scale.
// MMA tile 128x256x128 (mma_tiler_mn = (128, 256)).
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kMxf8_128x256, cutlass::type_erased_dynamic_mx_float8_t,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100, 256, 128, 16)
