// The few-row kernels with A block-scaled like B (skinny_launch.cuh).
#include "cuda/skinny/skinny_launch.cuh"

namespace jga {
namespace skinny {

template cudaError_t ConfigureKind<kAScaled>(int (&)[kVariants][kTokenTileIndices]);
template cudaError_t LaunchKind<kAScaled>(int, int, const Params&, int, cudaStream_t);

}  // namespace skinny
}  // namespace jga
