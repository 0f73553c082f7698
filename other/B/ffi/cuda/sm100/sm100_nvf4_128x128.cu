// NVFP4: packed e2m1 operands, e4m3 scales, sf_vec_size 16: kind::mxf4nvf4.block_scale.scale_vec::4X.
// MMA tile 128x128x256.
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kNvf4_128x128, cutlass::nv_float4_t<cutlass::float_e2m1_t>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100, 128, 256, 32)
