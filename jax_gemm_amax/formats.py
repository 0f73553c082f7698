"""Narrow formats: the quantization formats and the packed-FP4 container.

Packed FP4 is ``uint8`` holding two e2m1 codes, the low nibble the even element. Conversions
work on the codes with elementwise integer and float arithmetic (no gathers, no FP8/FP4 converts):
exact, independent of how a backend stores ``float4_e2m1fn`` arrays, safe from XLA's
excess-precision folding, and shardable like any elementwise op (a table gather is not, on
``AxisType.Explicit`` meshes).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

# Magnitudes of e2m1 codes 0..7; code | 8 is the negative.
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
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


def get_format(fmt: str, argname: str = "fmt") -> Format:
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):  # TypeError: unhashable
        raise ValueError(f"{argname} must be one of {sorted(FORMATS)}, got {fmt!r}") from None


def e2m1_codes(x):
    """Rounds float values to e2m1 (nearest, ties to even, saturating at 6) and returns 4-bit codes
    as uint8. NaN becomes +6 (e2m1 has no NaN)."""
    x = jnp.asarray(x, jnp.float32)
    mag = jnp.abs(x)
    # Code = number of midpoints below the magnitude; on a midpoint (between codes i and i + 1)
    # round to the even code.
    idx = jnp.zeros(x.shape, jnp.int32)
    for i, mid in enumerate(_E2M1_MIDPOINTS):
        up = (mag > mid) | ((mag == mid) & ((i + 1) % 2 == 0))
        idx = idx + up.astype(jnp.int32)
    idx = jnp.where(jnp.isnan(x), 7, idx)
    sign = jnp.where(jnp.signbit(x) & ~jnp.isnan(x), 8, 0)
    return (idx + sign).astype(jnp.uint8)


def _minifloat_value(mag, negative, *, mantissa_bits: int, bias: int):
    """Magnitude codes (int32: the exponent field above ``mantissa_bits`` mantissa bits, exponent 0
    subnormal) and a sign flag -> float32, exactly. Inf/NaN codes are the caller's."""
    e = mag >> mantissa_bits
    m = mag & ((1 << mantissa_bits) - 1)
    significand = jnp.where(e > 0, m + (1 << mantissa_bits), m).astype(jnp.float32)
    # exact_pow2, not jnp.ldexp (~60 ops per element): the weight-only XLA path decodes whole weights.
    value = significand * exact_pow2(jnp.maximum(e, 1) - bias - mantissa_bits)
    return jnp.where(negative != 0, -value, value)


def e2m1_values(codes):
    """4-bit codes (uint8) -> float32 values."""
    codes = codes.astype(jnp.int32)
    return _minifloat_value(codes & 7, codes & 8, mantissa_bits=1, bias=1)


def pack_fp4(codes):
    """(..., K) e2m1 codes -> (..., K // 2) uint8, low nibble = even element."""
    lo = codes[..., 0::2]
    hi = codes[..., 1::2]
    return (lo | (hi << 4)).astype(jnp.uint8)


def unpack_fp4(packed):
    """(..., K // 2) uint8 -> (..., K) e2m1 codes: each byte shifted by (0, 4) along a new minor
    axis, then merged into K. Elementwise on a broadcast, which XLA fuses into the consumer; a stack
    of the two nibbles made the weight-only XLA path take 1.7x the time (128x28672x8192, H100;
    measured against jnp.repeat, the same broadcast and reshape, which under an explicit mesh
    would need an out_sharding)."""
    shifts = jnp.array([0, 4], dtype=jnp.uint8)
    return ((packed[..., None] >> shifts) & 0xF).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


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


# (mantissa bits, exponent bias) of the FP8 formats.
_FP8_FIELDS = {np.dtype(jnp.float8_e4m3fn): (3, 7), np.dtype(jnp.float8_e5m2): (2, 15)}


def decode_fp8(x):
    """float8_e4m3fn / float8_e5m2 -> float32 through the bit pattern.

    Not ``x.astype(float32)``: inside one jit, XLA may fold ``convert(convert(y, f8), f32)`` into
    ``y`` (excess precision, on by default on GPU), so a quantize-then-dequantize would silently
    skip the rounding. Decoding the bitcast code arithmetically keeps the FP8 value exact.
    """
    dtype = np.dtype(x.dtype)
    mantissa_bits, bias = _FP8_FIELDS[dtype]
    code = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.int32)
    mag = code & 0x7F
    value = _minifloat_value(mag, code & 0x80, mantissa_bits=mantissa_bits, bias=bias)
    if dtype == np.dtype(jnp.float8_e4m3fn):  # S.1111.111 is NaN, no infinities
        return jnp.where(mag == 0x7F, jnp.nan, value)
    # e5m2: exponent 11111 is Inf (mantissa 0) or NaN
    special = jnp.where(mag == 0x7C, jnp.where(code & 0x80, -jnp.inf, jnp.inf), jnp.nan)
    return jnp.where(mag >= 0x7C, special, value)


def decode_half(x):
    """bfloat16 / float16 -> float32 through the bit pattern (as :func:`decode_fp8`, so that XLA
    cannot fold a preceding rounding to the half format away)."""
    code = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    if np.dtype(x.dtype) == np.dtype(jnp.bfloat16):
        return jax.lax.bitcast_convert_type(code << 16, jnp.float32)
    mag = (code & 0x7FFF).astype(jnp.int32)
    value = _minifloat_value(mag, code & 0x8000, mantissa_bits=10, bias=15)
    special = jnp.where(mag == 0x7C00, jnp.where(code & 0x8000, -jnp.inf, jnp.inf), jnp.nan)
    return jnp.where(mag >= 0x7C00, special, value)


def operand_values(q):
    """Operand codes -> float32 values, exactly: FP8 (``float8_e4m3fn``, ``float8_e5m2``), packed
    FP4 (``uint8``, ``(..., K // 2)`` -> ``(..., K)``) or weight-only bfloat16/float16."""
    dtype = np.dtype(q.dtype)
    if dtype == np.dtype(np.uint8):
        return e2m1_values(unpack_fp4(q))
    if dtype in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)):
        return decode_half(q)
    return decode_fp8(q)


def decode_scales(scales):
    """Scale bytes -> float32. e8m0 (and int8/uint8 read as e8m0) is 2^(code - 127), 0xFF NaN;
    float8_e4m3fn is converted as a value."""
    dtype = np.dtype(scales.dtype)
    if dtype == np.dtype(jnp.float8_e4m3fn):
        return decode_fp8(scales)
    if dtype != np.dtype(np.uint8):
        scales = jax.lax.bitcast_convert_type(scales, jnp.uint8)
    code = scales.astype(jnp.int32)
    return jnp.where(code == 255, jnp.nan, exact_pow2(code - 127))


def exact_pow2(k):
    """2.0 ** k as float32 for int32 ``k`` in [-127, 127], built from its bits (2^-127 is the one
    subnormal). Multiplying by it scales exactly, as ``jnp.ldexp`` does (the same bits on the GPU on
    random and edge-case blocks), at one op per element instead of ldexp's ~60 (a frexp and a float
    power per element): the whole quantize takes 29-36% less time at 8192^2 on an H200."""
    k = jnp.asarray(k, jnp.int32)
    bits = jnp.where(k >= -126, (k + 127) << 23, 1 << 22)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def magnitude_max(x, axis=None):
    """max |x| of float32 ``x`` over ``axis`` (0 where empty), NaN if any is NaN: an integer max of
    the bit patterns, which order |x| as floats do. Exact on every backend: XLA's CPU float max
    treats subnormals as zero (JAX runs the CPU with flush-to-zero), and its reductions of 4096+
    elements can drop a NaN."""
    bits = jnp.max(jax.lax.bitcast_convert_type(x, jnp.int32) & np.int32(0x7FFFFFFF), axis=axis, initial=np.int32(0))
    bits = jnp.minimum(bits, np.int32(0x7FC00000))  # every NaN as the canonical one
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def pmax_amax(amax, axes):
    """The max of an amax (>= 0 or NaN) over the named mapped ``axes`` (inside ``shard_map``), NaN
    if any device's is NaN: ``jax.lax.pmax`` on the bits, which order as int32 (NaN above +Inf).
    ``jax.lax.pmax`` on the floats drops NaN (on the CPU it returns the max of the others)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(jnp.isnan(amax), jnp.nan, amax), jnp.int32)
    return jax.lax.bitcast_convert_type(jax.lax.pmax(bits, axes), jnp.float32)


def e8m0_from_exponent(exponent):
    """Integer exponents in [-127, 127] -> float8_e8m0fnu scales."""
    code = (jnp.clip(exponent, -127, 127) + 127).astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(code, jnp.float8_e8m0fnu)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def not_differentiable(x, what: str):
    """``x``, with a JVP that raises a NotImplementedError naming ``what`` (a function of quantized
    operands: their codes have no derivative, and the reference decodes them through their bits,
    whose derivative would silently be zero)."""
    return x


@not_differentiable.defjvp
def _not_differentiable_jvp(what, primals, tangents):
    raise NotImplementedError(
        f"{what} is not differentiable (quantized operands have no derivative); for training, "
        "jax_gemm_amax.nn.mx_matmul and MXLinear differentiate through the straight-through estimator"
    )
