// The few-row kernels with weight-only, float16 A (skinny_launch.cuh).
#include "cuda/skinny/skinny_launch.cuh"

namespace jga {
namespace skinny {

template cudaError_t ConfigureKind<kAF16>(int (&)[kVariants][kTokenTileIndices]);
template cudaError_t LaunchKind<kAF16>(int, int, const Params&, int, cudaStream_t);

}  // namespace skinny
}  // namespace jga
