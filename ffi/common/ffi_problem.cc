#include "ffi_problem.h"

#include <string>
#include <vector>

namespace jga {

std::string ShapeString(ffi::Span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

bool ShapeIs(ffi::Span<const int64_t> dims, const std::vector<int64_t>& want) {
  if (dims.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (dims[i] != want[i]) return false;
  return true;
}

namespace {

using jga::ShapeString;  // the overloads below join, not hide, the shared ones
std::string ShapeString(const ffi::AnyBuffer& buf) { return ShapeString(buf.dimensions()); }
bool ShapeIs(const ffi::AnyBuffer& buf, const std::vector<int64_t>& want) {
  return jga::ShapeIs(buf.dimensions(), want);
}

ffi::Error Invalid(const std::string& msg) { return ffi::Error::InvalidArgument("gemm_amax: " + msg); }

// XLA element types by numpy name: those an operand or scale may have.
bool DataTypeNamed(std::string_view name, ffi::DataType* dtype) {
  struct Named {
    std::string_view name;
    ffi::DataType dtype;
  };
  static constexpr Named kNamed[] = {
      {"float8_e4m3fn", ffi::DataType::F8E4M3FN},
      {"float8_e5m2", ffi::DataType::F8E5M2},
      {"float8_e8m0fnu", ffi::DataType::F8E8M0FNU},
      {"uint8", ffi::DataType::U8},
      {"int8", ffi::DataType::S8},
  };
  for (const Named& n : kNamed) {
    if (n.name == name) {
      *dtype = n.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace

bool OperandTypeOf(ffi::DataType dtype, OperandType* type) {
  switch (dtype) {
    case ffi::DataType::F8E4M3FN: *type = OperandType::kE4M3; return true;
    case ffi::DataType::F8E5M2: *type = OperandType::kE5M2; return true;
    case ffi::DataType::U8: *type = OperandType::kE2M1x2; return true;
    default: return false;
  }
}

bool ScaleTypeOf(ffi::DataType dtype, ScaleType* type) {
  switch (dtype) {
    case ffi::DataType::F8E8M0FNU:
    case ffi::DataType::U8:
    case ffi::DataType::S8: *type = ScaleType::kE8M0; return true;
    case ffi::DataType::F8E4M3FN: *type = ScaleType::kE4M3; return true;
    default: return false;
  }
}

ffi::Error OperandTypeNamed(std::string_view name, OperandType* type) {
  ffi::DataType dtype;
  if (!DataTypeNamed(name == "float4_e2m1fn" ? "uint8" : name, &dtype) || !OperandTypeOf(dtype, type))
    return Invalid("operand_dtype must be float8_e4m3fn, float8_e5m2, float4_e2m1fn or uint8 (packed fp4), got '" +
                   std::string(name) + "'");
  return ffi::Error::Success();
}

ffi::Error ScaleTypeNamed(std::string_view name, ScaleType* type) {
  ffi::DataType dtype;
  if (!DataTypeNamed(name, &dtype) || !ScaleTypeOf(dtype, type))
    return Invalid("scale_dtype must be float8_e8m0fnu, int8, uint8 or float8_e4m3fn, got '" + std::string(name) + "'");
  return ffi::Error::Success();
}

namespace {

// Both forms: sfa is null for a weight-only call.
ffi::Error Describe(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer* sfa,
                    const ffi::AnyBuffer& sfb, const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax, int32_t sf_vec_size,
                    const GemmAmaxHints& hints, GemmAmaxProblem* p) {
  using DT = ffi::DataType;
  if (a.dimensions().size() != 3) return Invalid("a must be (L, M, K), got " + ShapeString(a));
  if (b.dimensions().size() != 3) return Invalid("b must be (L, N, K), got " + ShapeString(b));
  if (sfa == nullptr) {
    switch (a.element_type()) {
      case DT::BF16: p->a_type = ActivationType::kBF16; break;
      case DT::F16: p->a_type = ActivationType::kF16; break;
      default: return Invalid("weight-only a dtype must be bfloat16 or float16");
    }
    if (!OperandTypeOf(b.element_type(), &p->ab_type))
      return Invalid("b dtype must be float8_e4m3fn, float8_e5m2 or uint8 (packed fp4)");
  } else {
    if (a.element_type() != b.element_type()) return Invalid("a and b must have the same dtype");
    if (!OperandTypeOf(a.element_type(), &p->ab_type))
      return Invalid("a/b dtype must be float8_e4m3fn, float8_e5m2 or uint8 (packed fp4)");
    if (sfa->element_type() != sfb.element_type()) return Invalid("sfa and sfb must have the same dtype");
  }
  if (!ScaleTypeOf(sfb.element_type(), &p->sf_type))
    return Invalid("sfa/sfb dtype must be float8_e8m0fnu, int8, uint8 or float8_e4m3fn");
  switch (c.element_type()) {
    case DT::F32: p->c_type = OutputType::kF32; break;
    case DT::F16: p->c_type = OutputType::kF16; break;
    case DT::BF16: p->c_type = OutputType::kBF16; break;
    case DT::F8E4M3FN: p->c_type = OutputType::kE4M3; break;
    case DT::F8E5M2: p->c_type = OutputType::kE5M2; break;
    case DT::U8: p->c_type = OutputType::kE2M1x2; break;
    default: return Invalid("c dtype must be float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 or uint8");
  }
  if (amax.element_type() != DT::F32) return Invalid("amax must be float32");
  if (sf_vec_size != 16 && sf_vec_size != 32) return Invalid("sf_vec_size must be 16 or 32");
  p->sf_vec_size = sf_vec_size;

  const bool fp4 = p->fp4_operands();
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  p->batch = ad[0];
  p->m = ad[1];
  p->n = bd[1];
  p->k = fp4 ? bd[2] * 2 : bd[2];
  if (bd[0] != p->batch || (p->weight_only() ? ad[2] != p->k : bd[2] != ad[2]))
    return Invalid("b " + ShapeString(b) + " does not match a " + ShapeString(a));
  if (const char* why = ContractViolation(*p)) return Invalid(why);

  const std::vector<int64_t> want_sfa = {p->batch, p->row_blocks(p->m), p->k_blocks(), 32, 4, 4};
  const std::vector<int64_t> want_sfb = {p->batch, p->row_blocks(p->n), p->k_blocks(), 32, 4, 4};
  if (sfa != nullptr && !ShapeIs(*sfa, want_sfa))
    return Invalid("sfa must be " + ShapeString(want_sfa) + ", got " + ShapeString(*sfa));
  if (!ShapeIs(sfb, want_sfb)) return Invalid("sfb must be " + ShapeString(want_sfb) + ", got " + ShapeString(sfb));
  const std::vector<int64_t> want_c = {p->batch, p->m, p->c_row_storage_elems()};
  if (!ShapeIs(c, want_c)) return Invalid("c must be " + ShapeString(want_c) + ", got " + ShapeString(c));
  if (!ShapeIs(amax, {p->batch})) return Invalid("amax must be (L,), got " + ShapeString(amax));

  p->tile_m = hints.tile_m;
  p->tile_n = hints.tile_n;
  p->cluster_m = hints.cluster_m;
  p->cluster_n = hints.cluster_n;
  return ffi::Error::Success();
}

}  // namespace

ffi::Error DescribeProblem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfa,
                           const ffi::AnyBuffer& sfb, const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax,
                           int32_t sf_vec_size, const GemmAmaxHints& hints, GemmAmaxProblem* p) {
  return Describe(a, b, &sfa, sfb, c, amax, sf_vec_size, hints, p);
}

ffi::Error DescribeWeightOnlyProblem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfb,
                                     const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax, int32_t sf_vec_size,
                                     const GemmAmaxHints& hints, GemmAmaxProblem* p) {
  return Describe(a, b, nullptr, sfb, c, amax, sf_vec_size, hints, p);
}

GemmAmaxBuffers BuffersOf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfa,
                          const ffi::AnyBuffer& sfb, const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax) {
  GemmAmaxBuffers buf;
  buf.a = a.untyped_data();
  buf.b = b.untyped_data();
  buf.sfa = sfa.untyped_data();
  buf.sfb = sfb.untyped_data();
  buf.c = c.untyped_data();
  buf.amax = static_cast<float*>(amax.untyped_data());
  return buf;
}

GemmAmaxBuffers WeightOnlyBuffersOf(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sfb,
                                    const ffi::AnyBuffer& c, const ffi::AnyBuffer& amax) {
  GemmAmaxBuffers buf = BuffersOf(a, b, sfb, sfb, c, amax);
  buf.sfa = nullptr;
  return buf;
}

}  // namespace jga
