// MXFP4: packed e2m1 operands, e8m0 scales, sf_vec_size 32: kind::mxf4nvf4.block_scale.scale_vec::2X.
// MMA tile 128x128x256 (128 bytes of K per stage row, as for FP8).
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kMxf4_128x128, cutlass::mx_float4_t<cutlass::float_e2m1_t>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmMxf4Sm100, 128, 256, 32)
