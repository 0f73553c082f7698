"""The SM90 planner's choice for a problem with the workspace the lowering asks for (host
arithmetic, no GPU), and the operand copies it takes as the tests name them."""

from __future__ import annotations

from jax_gemm_amax import _ffi
from jax_gemm_amax.primitives.gemm_amax import _cuda_workspace_bytes


def lowering_plan(problem, sms=0):
    """problem: (L, M, N, K, value dtype, scale dtype, sf_vec_size); sms 0: the current GPU's count.

    Returns the plan dict and its copies: "A", "B", "AB" or "" (operands pre-converted to BF16)."""
    plan = _ffi.sm90_plan(*problem, _cuda_workspace_bytes(*problem), sms=sms)
    return plan, ("A" if plan["preconvert_a"] else "") + ("B" if plan["preconvert_b"] else "")
