#include "ffi_quantize.h"

#include "ffi_problem.h"

#include <string>
#include <vector>

namespace jga {
namespace {

ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument("quantize: " + msg); }

ffi::DataType CodeType(QuantizeFormat f) {
  switch (f) {
    case QuantizeFormat::kMxfp8E4M3: return ffi::DataType::F8E4M3FN;
    case QuantizeFormat::kMxfp8E5M2: return ffi::DataType::F8E5M2;
    default: return ffi::DataType::U8;  // packed FP4
  }
}

// Checks result `index` against `dtype` and `shape`; stores its data pointer in `*data`.
ffi::Error CheckResult(const ffi::RemainingRets& results, size_t index, const char* name, ffi::DataType dtype,
                       const std::vector<int64_t>& shape, void** data) {
  auto result = results.get<ffi::AnyBuffer>(index);
  if (result.has_error()) return Invalid(std::string(name) + ": not a buffer");
  ffi::AnyBuffer buf = **result;
  if (buf.element_type() != dtype) return Invalid(std::string(name) + ": wrong dtype");
  if (!ShapeIs(buf.dimensions(), shape))
    return Invalid(std::string(name) + " must be " + ShapeString(shape) + ", got " + ShapeString(buf.dimensions()));
  *data = buf.untyped_data();
  return ffi::Error::Success();
}

}  // namespace

ffi::Error DescribeQuantize(const ffi::AnyBuffer& x, const ffi::RemainingRets& results, int32_t format, int32_t mode,
                            QuantizeProblem* p, QuantizeBuffers* buf) {
  using DT = ffi::DataType;
  if (format < 0 || format > 3) return Invalid("format must be 0..3 (mxfp8_e4m3, mxfp8_e5m2, mxfp4, nvfp4)");
  if (mode < kQuantizeRows || mode > kQuantizePair) return Invalid("mode must be 1 (rows), 2 (columns) or 3 (pair)");
  p->format = static_cast<QuantizeFormat>(format);
  p->mode = mode;
  switch (x.element_type()) {
    case DT::F32: p->input = QuantizeInput::kF32; break;
    case DT::F16: p->input = QuantizeInput::kF16; break;
    case DT::BF16: p->input = QuantizeInput::kBF16; break;
    default: return Invalid("x dtype must be float32, float16 or bfloat16");
  }
  auto dims = x.dimensions();
  if (dims.size() != 3) return Invalid("x must be (L, R, K), got " + ShapeString(dims));
  p->batch = dims[0];
  p->rows = dims[1];
  p->k = dims[2];
  if (p->batch < 1 || p->rows < 1 || p->k < 1) return Invalid("L, R and K must be at least 1");
  const int64_t sfv = p->sf_vec_size();
  const bool rows = mode & kQuantizeRows, cols = mode & kQuantizeCols;
  if (rows && p->k % sfv) return Invalid("K must be a multiple of " + std::to_string(sfv) + " to quantize rows");
  if (cols && p->rows % sfv) return Invalid("R must be a multiple of " + std::to_string(sfv) + " to quantize columns");
  // Rowwise kernels move 16 elements per thread along K (a multiple of 16 in every format);
  // columnwise ones take any K.
  const size_t want = (rows ? 2 : 0) + (cols ? 2 : 0) + 1;
  if (results.size() != want) return Invalid("expected " + std::to_string(want) + " results");
  const DT sf = p->format == QuantizeFormat::kNvfp4 ? DT::F8E4M3FN : DT::F8E8M0FNU;
  size_t i = 0;
  ffi::Error err = ffi::Error::Success();
  *buf = QuantizeBuffers{};
  buf->x = x.untyped_data();
  if (rows) {
    err = CheckResult(results, i++, "q (rows)", CodeType(p->format), {p->batch, p->rows, p->code_bytes(p->k)},
                      &buf->q_row);
    if (err.failure()) return err;
    err = CheckResult(results, i++, "scales (rows)", sf,
                      {p->batch, p->row_blocks(p->rows), p->k_blocks(p->k), 32, 4, 4}, &buf->s_row);
    if (err.failure()) return err;
  }
  if (cols) {
    err = CheckResult(results, i++, "q (columns)", CodeType(p->format), {p->batch, p->k, p->code_bytes(p->rows)},
                      &buf->q_col);
    if (err.failure()) return err;
    err = CheckResult(results, i++, "scales (columns)", sf,
                      {p->batch, p->row_blocks(p->k), p->k_blocks(p->rows), 32, 4, 4}, &buf->s_col);
    if (err.failure()) return err;
  }
  void* amax = nullptr;
  err = CheckResult(results, i, "amax", DT::F32, {p->batch}, &amax);
  buf->amax = static_cast<float*>(amax);
  return err;
}

}  // namespace jga
