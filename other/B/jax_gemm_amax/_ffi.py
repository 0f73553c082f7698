"""Loads the compiled extension and registers its FFI targets with XLA."""

from __future__ import annotations

import jax
import numpy as np

from ._problem import E4M3, E8M0_LIKE, FP4_OPERAND, FP8_OPERANDS, PACKED_FP4

try:
    from . import _jax_gemm_amax as _ext
except ImportError as e:  # pragma: no cover - depends on how the package is imported
    raise ImportError(
        "jax_gemm_amax: the compiled extension _jax_gemm_amax is missing. Install the package "
        "(`pip install .`) and import it from the installed location, not from the source tree "
        "(run the tests with `pytest`, not `python -m pytest`, from the repository root)."
    ) from e

CPU_TARGET = "jax_gemm_amax_cpu"
CUDA_TARGET = "jax_gemm_amax_cuda"

BUILT_WITH_CUDA: bool = bool(_ext.built_with_cuda)

for _name, _capsule in _ext.cpu_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
for _name, _registration in _ext.cuda_types().items():  # the CUDA handler's state, before the handler
    jax.ffi.register_ffi_type(_name, _registration, platform="CUDA")
for _name, _capsule in _ext.cuda_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


# OperandType and ScaleType as numbered in ffi/common/problem.h, decided as DescribeProblem
# (ffi_problem.cc) does: packed FP4 (uint8) and float4_e2m1fn are e2m1; int8/uint8 scales are e8m0.
_OPERAND_TYPES = {FP8_OPERANDS[0]: 0, FP8_OPERANDS[1]: 1, FP4_OPERAND: 2, PACKED_FP4: 2}
_SCALE_TYPES = {**{dt: 0 for dt in E8M0_LIKE}, E4M3: 1}


def _sm90_problem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size):
    """The arguments of the extension's sm90_* functions."""
    return (batch, m, n, k, _OPERAND_TYPES[np.dtype(operand_dtype)], _SCALE_TYPES[np.dtype(scale_dtype)], sf_vec_size)


def sm90_workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, offer_copies=True) -> int:
    """The SM90 kernel library's workspace rule (WorkspaceBytes in ffi/cuda/sm90/gemm_amax_sm90.cu):
    per-tile split-K counters and fp32 partial tiles (for every tile when there are few, else 16 MB
    for the last wave's tiles), and, if offer_copies, room for the BF16 copies of the operands it
    may convert once per call (after the split-K area: A's copy; alone: A's and B's, if larger).
    k in elements. Host arithmetic: no GPU needed."""
    return _ext.sm90_workspace_bytes(*_sm90_problem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size), offer_copies)


def sm90_plan(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, workspace_bytes, sms=0) -> dict:
    """The plan the SM90 kernel picks on the current GPU (tile_m, splits, whole_tiles, preconvert_a,
    preconvert_b), for tests and reports; sms > 0: on a GPU with that many SMs (host arithmetic, no
    GPU needed: e.g. 132 for an H200)."""
    return _ext.sm90_plan(*_sm90_problem(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size), workspace_bytes, sms)
