// Packed e2m1 operands with e8m0 scales and sf_vec_size 16 (allowed by the contract, neither MXFP4
// nor NVFP4): the same kind::mxf4nvf4.block_scale.scale_vec::4X instruction with the ue8m0 scale
// type, spelled for CUTLASS as the element tuple (data, scale, vector size).
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kFp4E8m0Sfv16_128x128,
                        cute::tuple<cutlass::float_e2m1_t, cutlass::float_ue8m0_t, cute::Int<16>>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100, 128, 256, 32)
