// The few-row kernels with weight-only, bfloat16 A (skinny_launch.cuh).
#include "cuda/skinny/skinny_launch.cuh"

namespace jga {
namespace skinny {

template cudaError_t ConfigureKind<kABF16>(int (&)[kVariants][kTokenTileIndices]);
template cudaError_t LaunchKind<kABF16>(int, int, const Params&, int, cudaStream_t);

}  // namespace skinny
}  // namespace jga
