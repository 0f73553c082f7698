// Decoding and validation of one quantize FFI call (the CUDA handler's; the Python layer raises the
// same errors at trace time).
#pragma once

#include <cstdint>

#include "quantize_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jga {

namespace ffi = xla::ffi;

// Validates one quantize custom call: x, then its results (q, scales per orientation of `mode`,
// rowwise first, then amax) against the shapes of quantize_problem.h. Returns InvalidArgument naming what is wrong.
ffi::Error DescribeQuantize(const ffi::AnyBuffer& x, const ffi::RemainingRets& results, int32_t format, int32_t mode,
                            QuantizeProblem* problem, QuantizeBuffers* buffers);

}  // namespace jga
