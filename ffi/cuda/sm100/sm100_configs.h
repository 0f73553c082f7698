// The instantiated SM100 kernel configurations (one translation unit each, sm100_<name>.cu), as
// plain function pointers so that the dispatcher (sm100_dispatch.cu) does not include CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/problem.h"

namespace jga {
namespace sm100 {

struct ConfigFns {
  size_t (*workspace)(const GemmAmaxProblem& p);
  cudaError_t (*launch)(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf, void* workspace, cudaStream_t stream,
                        const char** error_message);
  cudaError_t (*prepare)();  // loads the kernel on the current device, outside stream capture
};

// <operand format>_<MMA tile M>x<N>, dynamic cluster; M = 128: 1-SM (tcgen05 cta_group::1), M = 256: 2-SM
// (cta_group::2, a CTA pair computes one 256-row tile).
extern const ConfigFns kMxf8_128x128;  // FP8 e4m3 | e5m2 (run-time format), e8m0 scales, sfv 32
extern const ConfigFns kMxf8_128x256;
extern const ConfigFns kMxf8_256x128;  // 2-SM
extern const ConfigFns kMxf4_128x128;  // FP4 e2m1, e8m0 scales, sfv 32 (MXFP4)
extern const ConfigFns kNvf4_128x128;  // FP4 e2m1, e4m3 scales, sfv 16 (NVFP4)
extern const ConfigFns kNvf4_128x256;
extern const ConfigFns kFp4E8m0Sfv16_128x128;  // FP4 e2m1, e8m0 scales, sfv 16

}  // namespace sm100
}  // namespace jga
