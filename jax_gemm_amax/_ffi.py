"""Loads the compiled extension and registers its FFI targets with XLA."""

from __future__ import annotations

import jax
import numpy as np

try:
    from . import _jax_gemm_amax as _ext
except ImportError as e:  # pragma: no cover - depends on how the package is imported
    raise ImportError(
        "jax_gemm_amax: the compiled extension _jax_gemm_amax is missing. Install the package "
        "(`pip install .`) and import it from the installed location, not from the source tree "
        "(run the tests with `pytest`, not `python -m pytest`, from the repository root)."
    ) from e

CPU_TARGET = "jax_gemm_amax_cpu"
CPU_WEIGHT_ONLY_TARGET = "jax_gemm_amax_weight_only_cpu"  # (a, b, sfb): bfloat16/float16 a, unscaled
CUDA_TARGET = "jax_gemm_amax_cuda"
CUDA_WEIGHT_ONLY_TARGET = "jax_gemm_amax_weight_only_cuda"  # the few-row kernel's problems only
QUANTIZE_CUDA_TARGET = "jax_gemm_amax_quantize_cuda"

BUILT_WITH_CUDA: bool = bool(_ext.built_with_cuda)

for _name, _capsule in _ext.cpu_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
for _name, _registration in _ext.cuda_types().items():  # the CUDA handler's state, before the handler
    jax.ffi.register_ffi_type(_name, _registration, platform="CUDA")
for _name, _capsule in _ext.cuda_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


def workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, offer_copies=True) -> int:
    """Device workspace the CUDA handler needs for a problem, asked from the extension, which
    answers for the architecture of the current GPU (SM90: per-tile split-K counters and fp32
    partial tiles, and, if offer_copies, room for the BF16 copies of the operands it may convert
    once per call; SM100: CUTLASS's kernel workspace; on both, where the few-row kernel takes the
    problem (M <= 32, weight-only M <= 128: ffi/cuda/skinny/skinny.h), at least its split-K partials) or, without a usable
    GPU, the largest over the architectures built (0 in a build without CUDA). k in elements. No
    GPU needed."""
    return _ext.workspace_bytes(
        batch, m, n, k, np.dtype(operand_dtype).name, np.dtype(scale_dtype).name, sf_vec_size, offer_copies
    )


def weight_only_kernel(batch, m, n, k, activation_dtype, operand_dtype, scale_dtype, sf_vec_size) -> tuple[int, str]:
    """For a weight-only call (``a (batch, m, k)`` bfloat16/float16, ``b (batch, n, ...)``): the
    kernel the CUDA handler runs the problem on and the device workspace to give it: on an sm_90
    GPU the Hopper GEMM (``"sm90"``) for a bfloat16 ``a`` of more than 64 rows, else the few-row
    kernel (``"skinny"``) for M <= 128 (on the current GPU if it is an sm_90/sm_100 part the build
    has kernels for, or on any such GPU when lowered without one); ``(-1, "xla")`` where none does
    (the call then goes through XLA). k in elements. No GPU needed."""
    return _ext.weight_only_kernel(
        batch,
        m,
        n,
        k,
        np.dtype(activation_dtype).name,
        np.dtype(operand_dtype).name,
        np.dtype(scale_dtype).name,
        sf_vec_size,
    )


def weight_only_kernel_workspace(batch, m, n, k, activation_dtype, operand_dtype, scale_dtype, sf_vec_size) -> int:
    """:func:`weight_only_kernel`'s workspace: bytes, or -1 where the call goes through XLA."""
    return weight_only_kernel(batch, m, n, k, activation_dtype, operand_dtype, scale_dtype, sf_vec_size)[0]


def sm90_plan(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, workspace_bytes, sms=0) -> dict:
    """The plan the SM90 kernel picks on the current GPU (tile_m, splits, whole_tiles, preconvert_a,
    preconvert_b), for tests and reports; sms > 0: on a GPU with that many SMs (host arithmetic, no
    GPU needed: e.g. 132 for an H200). "kernel" names the kernel the CUDA handler runs on an sm_90 GPU:
    "skinny" (the few-row kernel, with skinny_tokens, skinny_splits and skinny_grid) or "sm90".
    Built with CUDA only."""
    return _ext.sm90_plan(
        batch, m, n, k, np.dtype(operand_dtype).name, np.dtype(scale_dtype).name, sf_vec_size, workspace_bytes, sms
    )
