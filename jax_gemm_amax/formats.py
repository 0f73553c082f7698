"""Narrow formats: the quantization formats and the packed-FP4 container.

Packed FP4 is ``uint8`` holding two e2m1 codes, the low nibble the even element. Conversions go
through explicit code tables, so they are exact and do not depend on how a backend stores
``float4_e2m1fn`` arrays.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# Magnitudes of e2m1 codes 0..7; code | 8 is the negative.
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])
_E2M1_MIDPOINTS = (E2M1_MAGNITUDES[1:] + E2M1_MAGNITUDES[:-1]) / 2


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    value_dtype: np.dtype  # logical element dtype
    max_value: float
    scale_dtype: np.dtype
    sf_vec_size: int


FORMATS = {
    "mxfp8_e4m3": Format("mxfp8_e4m3", np.dtype(jnp.float8_e4m3fn), 448.0, np.dtype(jnp.float8_e8m0fnu), 32),
    "mxfp8_e5m2": Format("mxfp8_e5m2", np.dtype(jnp.float8_e5m2), 57344.0, np.dtype(jnp.float8_e8m0fnu), 32),
    "mxfp4": Format("mxfp4", np.dtype(jnp.float4_e2m1fn), 6.0, np.dtype(jnp.float8_e8m0fnu), 32),
    "nvfp4": Format("nvfp4", np.dtype(jnp.float4_e2m1fn), 6.0, np.dtype(jnp.float8_e4m3fn), 16),
}


def get_format(fmt: str) -> Format:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"fmt must be one of {sorted(FORMATS)}, got {fmt!r}") from None


def e2m1_codes(x):
    """Rounds float values to e2m1 (nearest, ties to even, saturating at 6) and returns 4-bit codes
    as uint8. NaN becomes +6 (e2m1 has no NaN)."""
    x = jnp.asarray(x, jnp.float32)
    mag = jnp.abs(x)
    idx = jnp.searchsorted(jnp.asarray(_E2M1_MIDPOINTS), mag, side="right")
    # A magnitude exactly on a midpoint rounded up; ties go to the even code.
    on_tie = (idx > 0) & (mag == jnp.asarray(_E2M1_MIDPOINTS)[jnp.maximum(idx - 1, 0)])
    idx = jnp.where(on_tie & (idx % 2 == 1), idx - 1, idx)
    idx = jnp.where(jnp.isnan(x), 7, idx)
    sign = jnp.where(jnp.signbit(x) & ~jnp.isnan(x), 8, 0)
    return (idx + sign).astype(jnp.uint8)


def e2m1_values(codes):
    """4-bit codes (uint8) -> float32 values."""
    return jnp.asarray(E2M1_VALUES)[codes.astype(jnp.int32)]


def pack_fp4(codes):
    """(..., K) e2m1 codes -> (..., K // 2) uint8, low nibble = even element."""
    lo = codes[..., 0::2]
    hi = codes[..., 1::2]
    return (lo | (hi << 4)).astype(jnp.uint8)


def unpack_fp4(packed):
    """(..., K // 2) uint8 -> (..., K) e2m1 codes."""
    lo = packed & 0xF
    hi = packed >> 4
    return jnp.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def packed_from_float4(x):
    """A ``float4_e2m1fn`` array -> packed uint8 along the last axis."""
    return pack_fp4(e2m1_codes(x.astype(jnp.float32)))


def float4_from_packed(packed):
    """Packed uint8 -> ``float4_e2m1fn`` array (last axis doubled)."""
    return e2m1_values(unpack_fp4(packed)).astype(jnp.float4_e2m1fn)


def saturating_cast(x, dtype):
    """float32 -> ``dtype`` with round-to-nearest-even and, for FP8/FP4, saturation to the
    largest finite value (NaN stays NaN where the format has one)."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)):
        limit = float(jnp.finfo(dtype).max)
        return jnp.clip(x, -limit, limit).astype(dtype)
    if dtype == np.dtype(jnp.float4_e2m1fn):
        return e2m1_values(e2m1_codes(x)).astype(dtype)
    if dtype == np.dtype(np.uint8):
        return pack_fp4(e2m1_codes(x))
    return x.astype(dtype)


def _fp8_table(dtype) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)


_FP8_TABLES = {np.dtype(d): _fp8_table(d) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2)}


def decode_fp8(x):
    """float8_e4m3fn / float8_e5m2 -> float32 through the bit pattern.

    Not ``x.astype(float32)``: inside one jit, XLA may fold ``convert(convert(y, f8), f32)`` into
    ``y`` (excess precision, on by default on GPU), so a quantize-then-dequantize would silently
    skip the rounding. A bitcast and a table lookup keep the FP8 value exact.
    """
    table = _FP8_TABLES[np.dtype(x.dtype)]
    return jnp.asarray(table)[jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.int32)]


def decode_scales(scales):
    """Scale bytes -> float32. e8m0 (and int8/uint8 read as e8m0) is 2^(code - 127), 0xFF NaN;
    float8_e4m3fn is converted as a value."""
    dtype = np.dtype(scales.dtype)
    if dtype == np.dtype(jnp.float8_e4m3fn):
        return decode_fp8(scales)
    if dtype != np.dtype(np.uint8):
        scales = jax.lax.bitcast_convert_type(scales, jnp.uint8)
    code = scales.astype(jnp.int32)
    return jnp.where(code == 255, jnp.nan, jnp.ldexp(jnp.float32(1.0), code - 127))


def e8m0_from_exponent(exponent):
    """Integer exponents in [-127, 127] -> float8_e8m0fnu scales."""
    code = (jnp.clip(exponent, -127, 127) + 127).astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(code, jnp.float8_e8m0fnu)
