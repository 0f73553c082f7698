// The XLA FFI handler of the CUDA quantize kernels: validates the call (common/ffi_quantize.cc),
// then enqueues them on XLA's stream. No allocation, no host sync: CUDA-graph capturable. The
// instantiate stage loads the kernels, outside any capture.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <string>

#include "common/ffi_quantize.h"
#include "cuda/quantize/quantize_cuda.h"

namespace jga {
namespace {

constexpr int kMaxDevices = 64;

ffi::Error CudaError(cudaError_t err, const char* what) {
  return ffi::Error::Internal(std::string("quantize: ") + what + ": " + cudaGetErrorName(err) + ": " +
                              cudaGetErrorString(err));
}

// Multiprocessors of `device`, queried once per device.
ffi::Error SmCount(int device, int* count) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  if (device >= 0 && device < kMaxDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    *count = cache[device].load(std::memory_order_relaxed);
    return ffi::Error::Success();
  }
  const cudaError_t err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return CudaError(err, "querying the multiprocessor count");
  if (device >= 0 && device < kMaxDevices) cache[device].store(*count, std::memory_order_relaxed);
  return ffi::Error::Success();
}

ffi::Error QuantizeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingRets results, int32_t format,
                            int32_t mode) {
  QuantizeProblem problem;
  QuantizeBuffers buffers;
  ffi::Error status = DescribeQuantize(x, results, format, mode, &problem, &buffers);
  if (status.failure()) return status;
  // XLA makes the stream's device current while it runs (or records) the call.
  int device = 0, sms = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return CudaError(err, "finding the current device");
  status = SmCount(device, &sms);
  if (status.failure()) return status;
  const cudaError_t launch = quantize::Launch(problem, buffers, sms, stream);
  if (launch != cudaSuccess) return CudaError(launch, "launching the kernel");
  return ffi::Error::Success();
}

ffi::Error QuantizeCudaInstantiateImpl(int32_t, int32_t) {
  int current = 0, count = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess) err = cudaGetDeviceCount(&count);
  for (int device = 0; err == cudaSuccess && device < count; ++device) {
    err = cudaSetDevice(device);
    if (err == cudaSuccess) err = quantize::Prepare();
  }
  const cudaError_t restore = cudaSetDevice(current);
  if (err != cudaSuccess) return CudaError(err, "loading the kernels");
  if (restore != cudaSuccess) return CudaError(restore, "restoring the current device");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jga

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaQuantizeCudaInstantiate, jga::QuantizeCudaInstantiateImpl,
                              xla::ffi::Ffi::BindInstantiate().Attr<int32_t>("format").Attr<int32_t>("mode"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JgaQuantizeCuda, jga::QuantizeCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()  // x (L, R, K)
                                  .RemainingRets()             // q, scales per orientation, then amax
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("mode"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
