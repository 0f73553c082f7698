"""MXFP8 / MXFP4 / NVFP4 quantization along a contraction axis, scales in the physical layout."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import formats
from ._problem import (
    FP4_OPERAND,
    OPERAND_DTYPES,
    PACKED_FP4,
    SCALE_DTYPES,
    canonical_dtype,
    check_block_format,
    check_dtype,
    check_quantize,
    check_sf_vec_size,
    is_fp4,
    scale_shape,
)
from .layout import as_physical, physical_from_plain, plain_from_physical
from .primitives.quantize import COLS, ROWS, quantize_p

__all__ = ["quantize", "quantize_pair", "dequantize"]


def quantize(x, fmt: str = "mxfp8_e4m3", *, axis: int = -1, packed: bool = True, return_amax: bool = False):
    """Quantizes ``x`` (``(..., R, K)``, float) along ``axis``, its contraction axis: the last
    (``-1``, default) or the one before it (``-2``).

    Returns ``(q, scales)``, or ``(q, scales, amax)`` with ``return_amax``, laid out as
    :func:`gemm_amax` takes them. Along the last axis ``q`` is ``(R, K)`` (2-D ``x``) or
    ``(L, R, K)``; along ``-2`` it is the transpose, ``(K, R)`` or ``(L, K, R)`` (K-major for a
    wgrad ``dW = X^T dY``): the rows are K and each is quantized along R. ``q`` is in the format's
    element dtype; FP4 formats return packed ``uint8`` (two values per byte along the quantized
    axis, low nibble first) unless ``packed=False``, which gives ``float4_e2m1fn``. ``scales`` are
    in the physical 128x4 layout, ``(MN', G', 32, 4, 4)`` for 2-D ``x``, else
    ``(L, MN', G', 32, 4, 4)``: all leading dims of ``x`` fold into one L, for ``q`` too
    (``(L, rows, K)``). ``amax`` is max |x| over the whole input, float32 (NaN if ``x`` holds a
    NaN).

    * ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp4``: one e8m0 scale per 32 values, the block's amax
      times the reciprocal of the format's max (an fp32 constant), rounded up to a power of two
      (so no value saturates).
    * ``nvfp4``: one float8_e4m3fn scale per 16 values, the block's amax times 1/6 rounded to
      nearest (values saturate at +-6; blocks whose amax / 6 exceeds 448 saturate the scale);
      values are multiplied by the fp32 reciprocal of their scale. Scale the tensor beforehand
      (a per-tensor global scale) if its range needs it.
    * A block holding a NaN or an Inf, in every format, gets a NaN scale (e8m0 ``0xFF``; e4m3
      ``0x7F`` for ``nvfp4``), so the non-finite value is not lost: the whole block dequantizes to
      NaN, and :func:`gemm_amax` returns NaN in C wherever the block contributes, and a NaN amax.
      Its codes are its values quantized at scale 1. Other blocks are unaffected.

    The arithmetic is IEEE fp32, subnormals included, on every backend (the jnp code below works
    on the bits where XLA's CPU would flush them); float64 input is rounded to float32 first. On
    Hopper and Blackwell GPUs float32, float16 and bfloat16 inputs run as CUDA kernels,
    bit-identical to the jnp implementation that runs elsewhere. Zero rows or ``K = 0`` give empty
    ``q`` and ``scales`` of the shapes above (:func:`gemm_amax` rejects empty operands) and an
    amax of 0.
    """
    f = formats.get_format(fmt)
    x = jnp.asarray(x)
    mode = check_quantize(x, f.name, f.sf_vec_size, axis=axis)
    return _quantize(x, f, mode, packed, return_amax)


def quantize_pair(x, fmt: str = "mxfp8_e4m3", *, packed: bool = True, return_amax: bool = False):
    """Both orientations of ``x`` (``(..., R, K)``) from one read of it: ``((q_row, s_row),
    (q_col, s_col))``, plus ``amax`` with ``return_amax``; the same as ``quantize(x, fmt)`` and
    ``quantize(x, fmt, axis=-2)``. A linear layer's activations need both, rowwise for the
    forward GEMM and columnwise for the weight gradient. R and K must be multiples of the
    format's block size."""
    f = formats.get_format(fmt)
    x = jnp.asarray(x)
    mode = check_quantize(x, f.name, f.sf_vec_size, axis=None, pair=True)
    (q_row, s_row, q_col, s_col), amax = _quantize(x, f, mode, packed, True, flat=True)
    pair = ((q_row, s_row), (q_col, s_col))
    return (*pair, amax) if return_amax else pair


def _quantize(x, f, mode, packed, return_amax, flat=False):
    lead, (rows, k) = x.shape[:-2], x.shape[-2:]
    # math.prod, not reshape's -1, which cannot be inferred when rows or K is 0.
    x3 = formats.not_differentiable(x.reshape((math.prod(lead), rows, k)), "quantize")
    if _explicitly_sharded(x3):
        # Sharding in types: jnp keeps the codes sharded as x is (the primitive's results would
        # come out replicated).
        *outs, amax = quantize_jnp(x3, f.name, mode)
    else:
        *outs, amax = quantize_p.bind(x3, fmt=f.name, mode=mode)
    if not packed and is_fp4(f.value_dtype):
        outs = [formats.float4_from_packed(o) if i % 2 == 0 else o for i, o in enumerate(outs)]
    if not lead:
        outs = [o[0] for o in outs]
    amax = formats.magnitude_max(amax)  # over the items
    if flat:
        return outs, amax
    return (*outs, amax) if return_amax else tuple(outs)


def _explicitly_sharded(x) -> bool:
    sharding = getattr(jax.typeof(x), "sharding", None) if hasattr(jax, "typeof") else None
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True):
        return False
    return any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types) and any(
        e is not None for e in sharding.spec
    )


@functools.cache
def _tiny_amax_bits(max_value: float) -> tuple[int, int]:
    """Bit patterns of two block amaxes for a format whose values reach ``max_value``: the least
    whose exact product with the format's fp32 reciprocal is at least 2^-126, and the least whose
    fp32 product rounds above 2^-127 (exponent -126). Below the first the product is an fp32
    subnormal, which XLA's CPU flushes to zero; the scale exponent there, clamped at -127, is -126
    or -127, and these two patterns decide it. Found by bisection over the fp32 bit patterns, with
    the product formed exactly in float64 and rounded once to float32, as IEEE fp32 (the GPU's)
    does."""
    reciprocal = np.float64(np.float32(1) / np.float32(max_value))

    def least(pred):
        lo, hi = 0, 0x7F800000
        while lo < hi:
            mid = (lo + hi) // 2
            amax = np.float64(np.array(mid, np.uint32).view(np.float32))
            lo, hi = (lo, mid) if pred(amax * reciprocal) else (mid + 1, hi)
        return lo

    normal = least(lambda exact: exact >= 2.0**-126)
    above = least(lambda exact: np.float32(exact) > np.float32(2.0**-127))
    return normal, above


def _quantize_rows(x3, f):
    """The arithmetic of quantize along the last axis of ``(L, R, K)``: codes (FP4 packed),
    physical scales, and each item's amax. The CUDA kernels (ffi/cuda/quantize) follow it bit for
    bit; the reciprocals are written out because XLA rewrites divisions by them into these
    multiplies anyway, so the arithmetic is the same on every backend. It is IEEE fp32 arithmetic,
    subnormals included; on the CPU, where XLA flushes subnormals to zero, the parts that meet
    them go through the bits instead (the same results, more operations)."""
    return jax.lax.platform_dependent(
        x3, cpu=functools.partial(_rows, f=f, flushing=True), default=functools.partial(_rows, f=f, flushing=False)
    )


def _rows(x3, f, flushing: bool):
    """:func:`_quantize_rows`; ``flushing``: for a backend that flushes subnormals to zero."""
    batch, rows, k = x3.shape
    x3 = x3.astype(jnp.float32)
    blocks = x3.reshape(batch, rows, k // f.sf_vec_size, f.sf_vec_size)
    if flushing:
        amax = formats.magnitude_max(blocks, axis=-1)  # an integer max: NaN and subnormals kept
        amax_bits = jax.lax.bitcast_convert_type(amax, jnp.int32)
        finite = amax_bits < 0x7F800000
    else:
        # NaN enters the max as +Inf: a float max reduction may drop a NaN, never an Inf.
        amax = jnp.max(jnp.where(jnp.isnan(blocks), jnp.inf, jnp.abs(blocks)), axis=-1)
        finite = amax < jnp.inf
    reciprocal_max = np.float32(1) / np.float32(f.max_value)

    if f.scale_dtype == np.dtype(jnp.float8_e8m0fnu):
        ratio = amax * reciprocal_max
        mant, exp = jnp.frexp(ratio)  # ratio = mant * 2^exp, mant in [0.5, 1)
        exponent = jnp.where(mant == 0.5, exp - 1, exp)  # ceil(log2(ratio))
        if flushing:  # where the ratio is an fp32 subnormal, it is 0 here: two thresholds decide
            normal, above = _tiny_amax_bits(f.max_value)
            exponent = jnp.where(amax_bits >= normal, exponent, jnp.where(amax_bits >= above, -126, -127))
        else:  # ceil(log2(0)) clamps to -127: an all-zero block, or one whose ratio underflows
            exponent = jnp.where(ratio > 0, exponent, -127)
        exponent = jnp.where(finite, jnp.clip(exponent, -127, 127), 0)
        scales = formats.e8m0_from_exponent(exponent)
        scales = jnp.where(finite, scales, jnp.array(jnp.nan, scales.dtype))  # 0xFF
        scaled = blocks * formats.exact_pow2(-exponent)[..., None]  # per block, not per element
        if flushing:
            scaled = jnp.where(_subnormal(blocks), _subnormal_times_pow2(blocks, -exponent[..., None]), scaled)
    else:  # nvfp4: e4m3 scales; x / s for a subnormal x is below e2m1's smallest value (s >= 2^-9)
        scales = jnp.clip(amax * reciprocal_max, 0, 448.0).astype(jnp.float8_e4m3fn)
        s = jnp.where(finite, formats.decode_fp8(scales), 1.0)
        scales = jnp.where(finite, scales, jnp.array(jnp.nan, scales.dtype))  # 0x7F
        scaled = jnp.where(s[..., None] > 0, blocks * (1 / jnp.where(s > 0, s, 1))[..., None], 0.0)
    scaled = scaled.reshape(x3.shape)

    if is_fp4(f.value_dtype):
        q = formats.pack_fp4(formats.e2m1_codes(scaled))
    else:
        q = formats.saturating_cast(scaled, f.value_dtype)
    if flushing:
        item_amax = formats.magnitude_max(amax, axis=(1, 2))
    else:
        item_amax = jnp.max(amax, axis=(1, 2), initial=0.0)
        item_amax = jnp.where(jnp.any(jnp.isnan(x3), axis=(1, 2)), jnp.nan, item_amax)
    return q, physical_from_plain(scales), item_amax


def _subnormal(x):
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return ((bits & 0x7F800000) == 0) & ((bits & 0x7FFFFF) != 0)


def _subnormal_times_pow2(x, k):
    """``x * 2^k`` for subnormal ``x`` (m * 2^-149, m its fraction bits) and int ``k`` <= 127,
    through the bits: m * 2^(k - 149), normal where k >= 23, else far below every format's
    smallest value and given as a signed zero."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    shift = k - 149
    fraction = (bits & 0x7FFFFF).astype(jnp.float32)
    magnitude = jnp.where(shift >= -126, fraction * formats.exact_pow2(jnp.maximum(shift, -126)), 0.0)
    signed = jax.lax.bitcast_convert_type(magnitude, jnp.int32) | (bits & np.int32(-(2**31)))
    return jax.lax.bitcast_convert_type(signed, jnp.float32)


def quantize_jnp(x3, fmt: str, mode: int):
    """What ``quantize_p`` computes, in jnp: the CPU path and the GPU kernels' definition."""
    f = formats.get_format(fmt)
    outs = []
    if mode & ROWS:
        q, s, amax = _quantize_rows(x3, f)
        outs += [q, s]
    if mode & COLS:
        q, s, amax = _quantize_rows(jnp.swapaxes(x3, 1, 2), f)
        outs += [q, s]
    return outs + [amax]


def dequantize_physical(q, scales, sf_vec_size: int):
    """float32 ``q * scales`` for validated operands: ``q`` FP8 or packed FP4 (uint8), ``(L, rows,
    Kb)`` or ``(rows, Kb)``, and its physical scales. The one dequantization of the library. An
    e8m0 scale 2^e multiplies in two halves, 2^floor(e/2) then the rest: one rounding, as a single
    multiply by 2^e, but no subnormal factor (2^-127), which XLA's CPU would flush to zero."""
    values = formats.operand_values(q)
    rows, k = values.shape[-2:]
    groups = k // sf_vec_size
    values = values.reshape(*values.shape[:-1], groups, sf_vec_size)
    plain = plain_from_physical(scales, rows, groups)
    if np.dtype(plain.dtype) == np.dtype(jnp.float8_e4m3fn):
        out = values * formats.decode_fp8(plain)[..., None]
    else:
        code = jax.lax.bitcast_convert_type(plain, jnp.uint8).astype(jnp.int32)
        e = code - 127
        first = jnp.where(code == 255, jnp.nan, formats.exact_pow2(e >> 1))  # 0xFF: NaN
        out = values * first[..., None] * formats.exact_pow2(e - (e >> 1))[..., None]
    return out.reshape(*out.shape[:-2], k)


def dequantize(q, scales, sf_vec_size: int = 32, *, dtype=jnp.float32):
    """Inverse of :func:`quantize`: ``q`` (``(rows, K)`` or ``(L, rows, K)``) times its scales
    (physical or the cuDNN frontend's logical layout). ``q`` is ``float8_e4m3fn``, ``float8_e5m2``,
    ``float4_e2m1fn`` or packed FP4 ``uint8`` (``K // 2`` bytes); ``scales`` are
    ``float8_e8m0fnu`` (``int8``/``uint8`` read as e8m0) or ``float8_e4m3fn``. Every product is
    exact where fp32 holds it; below 2^-126 it is an fp32 subnormal, which XLA's CPU flushes to
    zero."""
    q, scales = jnp.asarray(q), jnp.asarray(scales)
    q_dtype = check_dtype(q, OPERAND_DTYPES, "q")
    sf_dtype = check_dtype(scales, SCALE_DTYPES, "scales")
    if q.ndim not in (2, 3):
        raise ValueError(f"q: must be (rows, K) or (L, rows, K), got shape {q.shape}")
    sf_vec_size = check_sf_vec_size(sf_vec_size)
    check_block_format(q_dtype, sf_dtype, sf_vec_size, "q", "scales")
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
