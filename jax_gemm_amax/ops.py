"""The public op: :func:`gemm_amax` and its pure-jnp twin :func:`reference_gemm_amax`."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import formats
from ._problem import FP4_OPERAND, PACKED_FP4, Problem, check_problem
from .layout import as_physical
from . import sharding  # noqa: F401  (registers gemm_amax_p's partitioned lowering)
from .primitive import gemm_amax_p
from .quantize import dequantize_physical

__all__ = ["GemmAmaxResult", "gemm_amax", "reference_gemm_amax"]


class GemmAmaxResult(NamedTuple):
    c: jax.Array
    amax: jax.Array


@dataclasses.dataclass(frozen=True)
class _Call:
    """A validated call with operands normalized for ``gemm_amax_p``."""

    problem: Problem
    a: jax.Array  # (L, M, Kb)
    b: jax.Array
    sfa: jax.Array  # (L, M', G', 32, 4, 4)
    sfb: jax.Array
    c_dtype: np.dtype
    c_major: str

    @property
    def kernel_c_dtype(self) -> np.dtype:
        """What the kernel writes: float4_e2m1fn C comes out packed in uint8 and is unpacked after."""
        return PACKED_FP4 if self.c_dtype == FP4_OPERAND else self.c_dtype
    tiler: tuple[int, int]
    cluster: tuple[int, int]


def _prepare(a, b, sfa, sfb, *, c_dtype, sf_vec_size, c_major, acc_dtype, mma_tiler_mn, cluster_shape_mn) -> _Call:
    a, b, sfa, sfb = (jnp.asarray(x) for x in (a, b, sfa, sfb))
    batched = a.ndim == 3
    sfa = as_physical(sfa, batched, "sfa")
    sfb = as_physical(sfb, batched, "sfb")
    problem, tiler, cluster = check_problem(
        a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sf_vec_size, acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn, c_major=c_major,
    )
    if problem.ab_dtype == FP4_OPERAND:
        a, b = formats.packed_from_float4(a), formats.packed_from_float4(b)
    if not batched:
        a, b, sfa, sfb = a[None], b[None], sfa[None], sfb[None]
    return _Call(problem, a, b, sfa, sfb, problem.c_dtype, c_major, tiler, cluster)


def _finish(call: _Call, c, amax_per_batch) -> GemmAmaxResult:
    if call.c_dtype == FP4_OPERAND:
        c = formats.float4_from_packed(c)
    if call.problem.batch is None:
        c = c[0]
    return GemmAmaxResult(c, jnp.max(amax_per_batch))


def gemm_amax(
    a,
    b,
    sfa,
    sfb,
    *,
    c_dtype=jnp.float32,
    sf_vec_size: int = 32,
    c_major: str = "n",
    acc_dtype=jnp.float32,
    mma_tiler_mn=(128, 128),
    cluster_shape_mn=(1, 1),
) -> GemmAmaxResult:
    """Block-scaled GEMM with a fused global amax.

    ``C[l, m, n] = sum_k A[l, m, k] SFA(l, m, k // sfv) B[l, n, k] SFB(l, n, k // sfv)`` with fp32
    accumulation; ``amax = max |C|`` over everything, on the fp32 accumulator before C is rounded
    to ``c_dtype`` (NaN propagates). Returns ``GemmAmaxResult(c, amax)``.

    Args:
      a: ``(M, K)`` or ``(L, M, K)``, K-major: ``float8_e4m3fn``, ``float8_e5m2``,
        ``float4_e2m1fn``, or ``uint8`` packed FP4 ``(..., K // 2)`` (low nibble = even k).
      b: ``(N, K)`` or ``(L, N, K)``, same dtype as ``a``.
      sfa, sfb: scales in the physical layout ``(L, ceil(MN/128), ceil(K/(4 sfv)), 32, 4, 4)``
        (no leading L for 2-D operands) or the seed's logical view ``(32, 4, MN', 4, K', L)``;
        ``float8_e8m0fnu`` (``int8``/``uint8`` read as e8m0) or ``float8_e4m3fn`` (sfv 16).
      c_dtype: float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 (both saturating),
        float4_e2m1fn or uint8 (packed FP4, ``(..., M, N // 2)``), saturating.
      sf_vec_size: 16 or 32 elements of K per scale.
      c_major: ``"n"`` returns ``(..., M, N)``; ``"m"`` returns C transposed, ``(..., N, M)``.
      acc_dtype: float32 only.
      mma_tiler_mn, cluster_shape_mn: the seed's tuning hints, validated; kernels may ignore them.
    """
    call = _prepare(
        a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sf_vec_size, c_major=c_major, acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn,
    )
    # C^T = B A^T: a transposed output is the same kernel with the operands swapped.
    a, b, sfa, sfb = (call.b, call.a, call.sfb, call.sfa) if c_major == "m" else (call.a, call.b, call.sfa, call.sfb)
    c, amax = gemm_amax_p.bind(
        a, b, sfa, sfb, c_dtype=call.kernel_c_dtype, sf_vec_size=sf_vec_size,
        tile_m=call.tiler[0], tile_n=call.tiler[1], cluster_m=call.cluster[0], cluster_n=call.cluster[1],
    )
    return _finish(call, c, amax)


def reference_gemm_amax(
    a,
    b,
    sfa,
    sfb,
    *,
    c_dtype=jnp.float32,
    sf_vec_size: int = 32,
    c_major: str = "n",
    acc_dtype=jnp.float32,
    mma_tiler_mn=(128, 128),
    cluster_shape_mn=(1, 1),
) -> GemmAmaxResult:
    """Pure-jnp :func:`gemm_amax` (same signature, same validation): dequantize, fp32 matmul at
    HIGHEST precision, amax, saturating cast. The oracle of the tests."""
    call = _prepare(
        a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sf_vec_size, c_major=c_major, acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn, cluster_shape_mn=cluster_shape_mn,
    )
    a32 = dequantize_physical(call.a, call.sfa, sf_vec_size)
    b32 = dequantize_physical(call.b, call.sfb, sf_vec_size)
    acc = jnp.einsum("lmk,lnk->lmn", a32, b32, precision=jax.lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
    amax = jnp.max(jnp.abs(acc), axis=(1, 2))
    if c_major == "m":
        acc = jnp.swapaxes(acc, 1, 2)
    return _finish(call, formats.saturating_cast(acc, call.kernel_c_dtype), amax)
