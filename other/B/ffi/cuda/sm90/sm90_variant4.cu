// One operand/scale variant of the SM90 kernel (two tile heights), in its own TU for parallel builds.
#include "cuda/sm90/sm90_launch.cuh"

namespace jga {
namespace sm90 {
JGA_SM90_INSTANTIATE_VARIANT(4)
}  // namespace sm90
}  // namespace jga
