"""MXFP8 / MXFP4 / NVFP4 quantization along the last axis, scales in the physical layout."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from . import formats
from ._problem import (
    FP4_OPERAND, OPERAND_DTYPES, PACKED_FP4, SCALE_DTYPES, canonical_dtype, check_dtype, check_sf_vec_size, is_fp4,
    scale_shape,
)
from .layout import as_physical, plain_from_physical, physical_from_plain

__all__ = ["quantize", "dequantize"]


def quantize(x, fmt: str = "mxfp8_e4m3", *, packed: bool = True):
    """Quantizes ``x`` (``(..., K)``, float) along its last axis.

    Returns ``(q, scales)``. ``q`` has ``x``'s shape in the format's element dtype; FP4 formats
    return packed ``uint8`` ``(..., K // 2)`` (low nibble = even k) unless ``packed=False``, which
    gives ``float4_e2m1fn``. ``scales`` are in the physical 128x4 layout: ``(MN', G', 32, 4, 4)``
    for 2-D ``x``, else ``(L, MN', G', 32, 4, 4)``; all leading dims of ``x`` fold into one L,
    for ``q`` too (``(L, rows, K)``), which is what :func:`gemm_amax` takes.

    * ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp4``: one e8m0 scale per 32 values, the block's amax
      over the format's max, rounded up to a power of two (so no value saturates).
    * ``nvfp4``: one float8_e4m3fn scale per 16 values, the block's amax / 6 rounded to nearest
      (values saturate at +-6; blocks whose amax / 6 exceeds 448 saturate the scale). Scale the
      tensor beforehand (a per-tensor global scale) if its range needs it.
    * A block holding a NaN or an Inf, in every format, gets a NaN scale (e8m0 ``0xFF``; e4m3
      ``0x7F`` for ``nvfp4``), so the non-finite value is not lost: the whole block dequantizes to
      NaN, and :func:`gemm_amax` returns NaN in C wherever the block contributes, and a NaN amax.
      Its codes are its values quantized at scale 1. Other blocks are unaffected.

    Zero rows or ``K = 0`` give empty ``q`` and ``scales`` of the shapes above
    (:func:`gemm_amax` rejects empty operands).
    """
    f = formats.get_format(fmt)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x: must be a floating array, got {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"x: must be (rows, K) or (..., rows, K), got shape {x.shape}")
    k = x.shape[-1]
    if k % f.sf_vec_size:
        raise ValueError(f"x: K={k} must be a multiple of {f.sf_vec_size} for {fmt}")
    lead = x.shape[:-2]
    rows = x.shape[-2]
    # math.prod, not reshape's -1, which cannot be inferred when rows or K is 0.
    x3 = x.reshape((math.prod(lead), rows, k)).astype(jnp.float32)
    blocks = x3.reshape(x3.shape[0], rows, k // f.sf_vec_size, f.sf_vec_size)
    # NaN enters the max as +Inf: XLA's CPU max reductions of 4096+ elements can drop a NaN, never an Inf.
    amax = jnp.max(jnp.where(jnp.isnan(blocks), jnp.inf, jnp.abs(blocks)), axis=-1)
    finite = amax < jnp.inf

    if f.scale_dtype == np.dtype(jnp.float8_e8m0fnu):
        mant, exp = jnp.frexp(amax / f.max_value)  # ratio = mant * 2^exp, mant in [0.5, 1)
        exponent = jnp.where(mant == 0.5, exp - 1, exp)  # ceil(log2(ratio))
        exponent = jnp.where(amax > 0, exponent, -127)
        exponent = jnp.where(finite, jnp.clip(exponent, -127, 127), 0)
        scales = formats.e8m0_from_exponent(exponent)
        scales = jnp.where(finite, scales, jnp.array(jnp.nan, scales.dtype))  # 0xFF
        scaled = blocks * formats.exact_pow2(-exponent)[..., None]  # per block, not per element
    else:  # nvfp4: e4m3 scales
        scales = jnp.clip(amax / f.max_value, 0, 448.0).astype(jnp.float8_e4m3fn)
        s = jnp.where(finite, formats.decode_fp8(scales), 1.0)[..., None]
        scales = jnp.where(finite, scales, jnp.array(jnp.nan, scales.dtype))  # 0x7F
        scaled = jnp.where(s > 0, blocks / jnp.where(s > 0, s, 1), 0.0)
    scaled = scaled.reshape(x3.shape)

    if is_fp4(f.value_dtype):
        codes = formats.e2m1_codes(scaled)
        q = formats.pack_fp4(codes) if packed else formats.e2m1_values(codes).astype(jnp.float4_e2m1fn)
    else:
        q = formats.saturating_cast(scaled, f.value_dtype)
    physical = physical_from_plain(scales)
    if not lead:
        return q[0], physical[0]
    return q, physical


def dequantize_physical(q, scales, sf_vec_size: int):
    """float32 ``q * scales`` for validated operands: ``q`` FP8 or packed FP4 (uint8), ``(L, rows,
    Kb)`` or ``(rows, Kb)``, and its physical scales. The one dequantization of the library."""
    values = formats.operand_values(q)
    rows, k = values.shape[-2:]
    plain = formats.decode_scales(plain_from_physical(scales, rows, k // sf_vec_size))
    return values * jnp.repeat(plain, sf_vec_size, axis=-1)


def dequantize(q, scales, sf_vec_size: int = 32, *, dtype=jnp.float32):
    """Inverse of :func:`quantize`: ``q`` (``(rows, K)`` or ``(L, rows, K)``) times its scales
    (physical or the cuDNN frontend's logical layout). ``q`` is ``float8_e4m3fn``, ``float8_e5m2``,
    ``float4_e2m1fn`` or packed FP4 ``uint8`` (``K // 2`` bytes); ``scales`` are
    ``float8_e8m0fnu`` (``int8``/``uint8`` read as e8m0) or ``float8_e4m3fn``."""
    q, scales = jnp.asarray(q), jnp.asarray(scales)
    q_dtype = check_dtype(q, OPERAND_DTYPES, "q")
    check_dtype(scales, SCALE_DTYPES, "scales")
    if q.ndim not in (2, 3):
        raise ValueError(f"q: must be (rows, K) or (L, rows, K), got shape {q.shape}")
    sf_vec_size = check_sf_vec_size(sf_vec_size)
    dtype = canonical_dtype(dtype, "dtype")
    rows, k = q.shape[-2], q.shape[-1] * (2 if q_dtype == PACKED_FP4 else 1)
    if k % sf_vec_size:
        raise ValueError(f"q: K={k} must be a multiple of sf_vec_size={sf_vec_size}")
    scales = as_physical(scales, batched=q.ndim == 3)
    want = scale_shape(rows, k, sf_vec_size, q.shape[0] if q.ndim == 3 else None)
    if tuple(scales.shape) != want:
        raise ValueError(
            f"scales: expected the physical 128x4 layout {want} for rows={rows}, K={k}, "
            f"sf_vec_size={sf_vec_size}, got {tuple(scales.shape)}"
        )
    if q_dtype == FP4_OPERAND:
        q = formats.packed_from_float4(q)
    return dequantize_physical(q, scales, sf_vec_size).astype(dtype)
