#pragma once

#include "common/problem.h"

namespace jga::cpu {

// Runs one validated problem on the calling machine's cores. Writes C and one amax per batch item.
void Run(const GemmAmaxProblem& p, const GemmAmaxBuffers& buf);

}  // namespace jga::cpu
