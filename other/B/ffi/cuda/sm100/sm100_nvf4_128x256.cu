// NVFP4 (e2m1, e4m3 scales, sf_vec_size 16), MMA tile 128x256x256 (mma_tiler_mn = (128, 256)).
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kNvf4_128x256, cutlass::nv_float4_t<cutlass::float_e2m1_t>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100, 256, 256, 32)
