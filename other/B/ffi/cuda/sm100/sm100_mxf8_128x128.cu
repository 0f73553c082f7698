// FP8 operands (e4m3 or e5m2, chosen at run time through CUTLASS's type-erased MX FP8 element:
// the tcgen05 instruction descriptor's A/B format fields are set from the arguments), e8m0
// scales, sf_vec_size 32: tcgen05.mma.kind::mxf8f6f4.block_scale. MMA tile 128x128x128.
#include "cuda/sm100/sm100_kernel.cuh"

JGA_SM100_DEFINE_CONFIG(kMxf8_128x128, cutlass::type_erased_dynamic_mx_float8_t,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100, 128, 128, 16)
