// The contract's rules on a gemm_amax problem (problem.h): what every backend may assume.
#include "common/problem.h"

namespace jga {

const char* ContractViolation(const GemmAmaxProblem& p) {
  if (p.batch < 1 || p.m < 1 || p.n < 1 || p.k < 1) return "L, M, N and K must be at least 1";
  if (p.sf_vec_size != 16 && p.sf_vec_size != 32) return "sf_vec_size must be 16 or 32";
  if (p.sf_type == ScaleType::kE4M3 && p.sf_vec_size != 16) return "float8_e4m3fn scales require sf_vec_size=16";
  if (!p.fp4_operands() && p.sf_vec_size != 32) return "fp8 a/b require sf_vec_size=32";
  if (OutputBits(p.c_type) == 0) return "unknown c dtype";
  if (p.c_type == OutputType::kE2M1x2 && !p.fp4_operands()) return "fp4 c requires fp4 a/b";
  if (p.k % p.sf_vec_size != 0) return "K must be a multiple of sf_vec_size";
  if (p.operand_row_bytes() % 16 != 0) return "rows of a and b must be 16-byte aligned";
  if ((p.n * OutputBits(p.c_type)) % 128 != 0) return "rows of c must be 16-byte aligned";
  return nullptr;
}

}  // namespace jga
