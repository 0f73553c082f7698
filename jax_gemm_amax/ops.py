"""The public op: :func:`gemm_amax` and its pure-jnp twin :func:`reference_gemm_amax`."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import formats
from ._problem import FP4_OPERAND, PACKED_FP4, Problem, check_problem
from .layout import as_physical, plain_from_physical
from .primitives.gemm_amax import gemm_amax_p

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
    sfa: jax.Array | None  # (L, M', G', 32, 4, 4); None for weight-only calls
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
    a, b, sfa, sfb = (None if x is None else jnp.asarray(x) for x in (a, b, sfa, sfb))
    batched = a.ndim == 3
    sfa = None if sfa is None else as_physical(sfa, batched, "sfa")
    sfb = None if sfb is None else as_physical(sfb, batched, "sfb")
    problem, tiler, cluster = check_problem(
        a,
        b,
        sfa,
        sfb,
        c_dtype=c_dtype,
        sf_vec_size=sf_vec_size,
        acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn,
        cluster_shape_mn=cluster_shape_mn,
        c_major=c_major,
    )
    if problem.weight_only and c_major == "m":
        # C^T = B A^T would need a block-scaled A and an unscaled B: not built.
        raise NotImplementedError("c_major: 'm' is not built for weight-only (bfloat16/float16 a) calls; use 'n'")
    if problem.a_dtype == FP4_OPERAND:
        a = formats.packed_from_float4(a)
    if problem.ab_dtype == FP4_OPERAND:
        b = formats.packed_from_float4(b)
    if not batched:
        a, b, sfb = a[None], b[None], sfb[None]
        sfa = None if sfa is None else sfa[None]
    return _Call(problem, a, b, sfa, sfb, problem.c_dtype, c_major, tiler, cluster)


def _finish(call: _Call, c, amax_per_batch) -> GemmAmaxResult:
    if call.c_dtype == FP4_OPERAND:
        c = formats.float4_from_packed(c)
    if call.problem.batch is None:
        c = c[0]
    return GemmAmaxResult(c, formats.magnitude_max(amax_per_batch, axis=None))


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

    ``C[l, m, n] = sum_g (sum_{k in g} A[l, m, k] B[l, n, k]) SFA(l, m, g) SFB(l, n, g)`` over the
    K groups g of ``sf_vec_size`` elements, as block-scaled hardware computes it: each group's dot
    of the narrow values in fp32 (their products are exact), times the group's combined scale,
    accumulated in fp32. A scale never meets an element alone, so a C that fp32 can represent
    comes out finite and right for any scales (e8m0 2^127 beside 2^-127, subnormal results). NaN
    comes from NaN inputs (an e8m0 0xFF byte, NaN codes and scales), e5m2 Inf, or terms beyond
    fp32's range of both signs (Inf - Inf). ``amax = max |C|`` over
    everything, on the fp32 accumulator before C is rounded to ``c_dtype`` (NaN propagates).
    Returns ``GemmAmaxResult(c, amax)``.

    Weight-only: ``a`` bfloat16 or float16 with ``sfa=None`` (``b`` any block-scaled dtype, with
    ``sfb``) computes ``C[l, m, n] = sum_g (sum_{k in g} A[l, m, k] B[l, n, k]) SFB(l, n, g)``, the
    same per-group arithmetic with A's unscaled values (their products with B's narrow values are
    exact in fp32). ``c_major="m"`` is not built for it.

    Args:
      a: ``(M, K)`` or ``(L, M, K)``, K-major: ``float8_e4m3fn``, ``float8_e5m2``,
        ``float4_e2m1fn``, or ``uint8`` packed FP4 ``(..., K // 2)`` (low nibble = even k);
        or ``bfloat16``/``float16`` (weight-only, ``sfa=None``).
      b: ``(N, K)`` or ``(L, N, K)``, same dtype as ``a`` (any of the block-scaled ones for a
        weight-only call).
      sfa, sfb: scales in the physical layout ``(L, ceil(MN/128), ceil(K/(4 sfv)), 32, 4, 4)``
        (no leading L for 2-D operands) or the cuDNN frontend's logical view ``(32, 4, MN', 4, K', L)``;
        ``float8_e8m0fnu`` (``int8``/``uint8`` read as e8m0) or ``float8_e4m3fn`` (sfv 16).
      c_dtype: float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 (both saturating),
        float4_e2m1fn or uint8 (packed FP4, ``(..., M, N // 2)``), saturating. FP4 has no NaN:
        a NaN element of C is stored as +6 (code 0x7), while amax is NaN.
      sf_vec_size: 16 or 32 elements of K per scale.
      c_major: ``"n"`` returns ``(..., M, N)``; ``"m"`` returns C transposed, ``(..., N, M)``.
      acc_dtype: float32 only.
      mma_tiler_mn, cluster_shape_mn: the cuDNN frontend's tuning hints, validated; kernels may ignore them.
    """
    call = _prepare(
        a,
        b,
        sfa,
        sfb,
        c_dtype=c_dtype,
        sf_vec_size=sf_vec_size,
        c_major=c_major,
        acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn,
        cluster_shape_mn=cluster_shape_mn,
    )
    # C^T = B A^T: a transposed output is the same kernel with the operands swapped.
    a, b, sfa, sfb = (call.b, call.a, call.sfb, call.sfa) if c_major == "m" else (call.a, call.b, call.sfa, call.sfb)
    operands = (a, b, sfb) if sfa is None else (a, b, sfa, sfb)  # weight-only: no sfa operand
    c, amax = gemm_amax_p.bind(
        *(formats.not_differentiable(x, "gemm_amax") for x in operands),
        c_dtype=call.kernel_c_dtype,
        sf_vec_size=sf_vec_size,
        tile_m=call.tiler[0],
        tile_n=call.tiler[1],
        cluster_m=call.cluster[0],
        cluster_n=call.cluster[1],
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
    """Pure-jnp :func:`gemm_amax` (same signature, same validation, same semantics): per K group
    the fp32 dot of the narrow values (HIGHEST precision), times the group's combined scale,
    summed over the groups; amax on that sum; saturating cast. The oracle of the tests.

    Its arithmetic does not depend on a flush-to-zero mode (XLA's CPU runs with one): the sum is
    kept as a float32 fraction and an integer exponent and put together from the bits, so
    subnormal and extreme results come out as on the kernels."""
    call = _prepare(
        a,
        b,
        sfa,
        sfb,
        c_dtype=c_dtype,
        sf_vec_size=sf_vec_size,
        c_major=c_major,
        acc_dtype=acc_dtype,
        mma_tiler_mn=mma_tiler_mn,
        cluster_shape_mn=cluster_shape_mn,
    )
    operands = [
        formats.not_differentiable(x, "reference_gemm_amax") if x is not None else None
        for x in (call.a, call.b, call.sfa, call.sfb)
    ]
    acc = _block_scaled_sum(*operands, sf_vec_size)
    amax = formats.magnitude_max(acc, axis=(1, 2))
    if c_major == "m":
        acc = jnp.swapaxes(acc, 1, 2)
    return _finish(call, formats.saturating_cast(acc, call.kernel_c_dtype), amax)


def weight_only_sum(a, b, sfb, sf_vec_size):
    """The fp32 accumulator of a weight-only call (``a (L, M, K)`` bfloat16/float16, ``b`` and its
    physical scales normalized as for ``gemm_amax_p``), in plain jnp: where every scale keeps
    ``b``'s dequantized values exact (and normal) in bfloat16, one dot of A with them (fp32
    accumulation); elsewhere (extreme or NaN e8m0 scales, decided at run time) the exact
    per-group sum of :func:`reference_gemm_amax`. What the CUDA platform runs (through XLA)."""

    def dot():
        # Dequantized inside the branch: computed before the lax.cond, the product is an operand
        # of it, materialized in fp32 (the call took 1.8x the time at 128x28672x8192, H100).
        values = formats.operand_values(b)
        groups = values.shape[-1] // sf_vec_size
        scales = formats.decode_scales(plain_from_physical(sfb, b.shape[1], groups))
        dequantized = values * jnp.repeat(scales, sf_vec_size, axis=-1)  # exact in fp32 where finite
        if np.dtype(a.dtype) == np.dtype(jnp.bfloat16):
            return jnp.einsum("lmk,lnk->lmn", a, dequantized.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
        return jnp.einsum(
            "lmk,lnk->lmn",
            formats.operand_values(a),
            dequantized,
            precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32,
        )

    if np.dtype(sfb.dtype) == np.dtype(jnp.float8_e4m3fn):
        return dot()  # e2m1 x e4m3 values: at most 6 significant bits, within [2^-10, 2688]
    # e8m0 2^e: FP8/FP4 values times 2^e stay normal and finite in bfloat16 for |e| <= 100.
    exponents = jax.lax.bitcast_convert_type(sfb, jnp.uint8).astype(jnp.int32) - 127
    exact = jnp.all(jnp.abs(exponents) <= 100)
    return jax.lax.cond(exact, dot, lambda: _block_scaled_sum(a, b, None, sfb, sf_vec_size))


# Float32 arithmetic through the bits, for the reference: exact, and the same on every backend
# whatever its flush-to-zero mode.
_SIGN = np.int32(-(2**31))
_EXPONENT = np.int32(0x7F800000)
_NO_TERM = -(2**20)  # the exponent of a sum without terms yet
_CHUNK_ELEMENTS = 2**20  # (L, groups, M, N) elements of one step over K


def _bits(x):
    return jax.lax.bitcast_convert_type(x, jnp.int32)


def _fraction_exponent(x):
    """``x = f * 2^e`` with |f| in [1, 2) for finite nonzero x, subnormals included (a subnormal is
    m * 2^-149, and float(m) is normal and exact); zero, Inf and NaN give (x, 0)."""
    bits = _bits(x)
    field = (bits & _EXPONENT) >> 23
    fraction = bits & 0x7FFFFF
    subnormal = (field == 0) & (fraction != 0)
    m = _bits(fraction.astype(jnp.float32))
    bits = jnp.where(subnormal, m | (bits & _SIGN), bits)
    e = jnp.where(subnormal, ((m & _EXPONENT) >> 23) - 127 - 149, field - 127)
    regular = subnormal | ((field > 0) & (field < 255))
    f = jax.lax.bitcast_convert_type((bits & ~_EXPONENT) | np.int32(127 << 23), jnp.float32)
    return jnp.where(regular, f, x), jnp.where(regular, e, 0)


def _normalized_groups(v):
    """``v`` (L, rows, G, sfv) float32 as ``v' * 2^E`` per (row, group): E the exponent of the
    group's largest finite nonzero |v| (0 for none), v' built from the bits, so that subnormal
    values, which XLA's CPU would flush inside a dot, become normal. Values below 2^-126 of the
    group's largest become zero (far below the group sum's rounding); Inf and NaN stay."""
    f, e = _fraction_exponent(v)
    bits = _bits(v) & ~_SIGN
    live = (bits != 0) & (bits < _EXPONENT)
    top = jnp.max(jnp.where(live, e, _NO_TERM), axis=-1)
    top = jnp.where(top == _NO_TERM, 0, top)
    return jnp.where(live, _times_pow2(f, e - top[..., None]), v), top


def _times_pow2(f, d):
    """``f * 2^d`` for ``d <= 0``, zero below ``2^-126`` times ``f`` (terms that small beside the
    sum's largest one are far below its rounding)."""
    return jnp.where(d >= -126, f * formats.exact_pow2(jnp.maximum(d, -126)), 0.0)


def _ldexp(s, r):
    """``s * 2^r`` (s normal or zero, int32 r) rounded to float32, to nearest even, subnormals
    included, overflow to Inf: built from the bits."""
    bits = _bits(s)
    t = ((bits & _EXPONENT) >> 23) - 127 + r  # the result's exponent
    significand = (bits & 0x7FFFFF) | 0x800000
    normal = ((t + 127) << 23) | (bits & 0x7FFFFF)
    shift = jnp.clip(-126 - t, 1, 25)  # subnormal: significand * 2^(t - 23) in units of 2^-149
    q = significand >> shift
    rem = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).astype(jnp.int32)
    magnitude = jnp.where(t > 127, _EXPONENT, jnp.where(t >= -126, normal, q))
    out = jax.lax.bitcast_convert_type((bits & _SIGN) | magnitude, jnp.float32)
    return jnp.where((bits & _EXPONENT) == 0, 0.0, out)


def _operand_scales(scales, rows, groups):
    """Physical scales -> plain (L, rows, G): e8m0 (and int8/uint8) bytes as int32 codes, e4m3 as
    float32 values."""
    plain = plain_from_physical(scales, rows, groups)
    if np.dtype(plain.dtype) == np.dtype(jnp.float8_e4m3fn):
        return formats.decode_fp8(plain)
    return jax.lax.bitcast_convert_type(plain, jnp.uint8).astype(jnp.int32)


def _combined_scales(sa, sb):
    """The combined scale of every (l, m, n, group) as ``f * 2^e``, from :func:`_operand_scales`
    of A (L, M, G) and B (L, N, G): e8m0 ``f = 1`` (NaN if either byte is 0xFF), ``e = ea + eb``;
    e4m3 the product ``sa sb`` (exact in float32) split in fraction and exponent."""
    if sa.dtype == jnp.float32:
        return _fraction_exponent(sa[:, :, None, :] * sb[:, None, :, :])
    nan = (sa == 255)[:, :, None, :] | (sb == 255)[:, None, :, :]
    return jnp.where(nan, jnp.nan, 1.0).astype(jnp.float32), sa[:, :, None, :] + sb[:, None, :, :] - 254


@functools.partial(jax.jit, static_argnames="sf_vec_size")  # one compile per shape, also when called eagerly
def _block_scaled_sum(a, b, sfa, sfb, sf_vec_size):
    """``sum_g blockdot_g * scale_g`` for (L, M, Kb) and (L, N, Kb) operands and physical scales
    (``sfa`` None for weight-only bfloat16/float16 ``a``):
    (L, M, N) float32. Kept as ``s * 2^r`` (s a float32 sum of fractions, r the exponent of the
    largest term) over steps of a few groups, so that no term or partial sum over- or underflows
    where the result does not; Inf and NaN terms are summed apart."""
    va, vb = formats.operand_values(a), formats.operand_values(b)
    batch, m, k = va.shape
    n = vb.shape[1]
    groups = k // sf_vec_size
    chunk = int(np.clip(_CHUNK_ELEMENTS // max(batch * m * n, 1), 1, groups))
    steps = -(-groups // chunk)
    pad = steps * chunk - groups  # padding groups: zero values and scale bytes

    def by_step(x):  # (L, rows, G, ...) -> (steps, L, rows, chunk, ...)
        x = jnp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
        return jnp.moveaxis(x.reshape(x.shape[:2] + (steps, chunk) + x.shape[3:]), 2, 0)

    sb = _operand_scales(sfb, n, groups)
    if sfa is None:  # weight-only: A unscaled, a unit scale of sfb's kind (e8m0 code 127, or 1.0)
        sa = jnp.full((batch, m, groups), 1.0 if sb.dtype == jnp.float32 else 127, sb.dtype)
    else:
        sa = _operand_scales(sfa, m, groups)
    va = va.reshape(batch, m, groups, sf_vec_size)
    vb = vb.reshape(batch, n, groups, sf_vec_size)
    if np.dtype(a.dtype) == np.dtype(jnp.bfloat16):
        # bfloat16 A reaches fp32's subnormals, and its products with B's values below them: both
        # operands' groups normalized (their exponents added back to the terms').
        (va, ea), (vb, eb) = _normalized_groups(va), _normalized_groups(vb)
    else:  # FP8, FP4 and float16 products are >= 2^-40: normal
        ea, eb = jnp.zeros((batch, m, groups), jnp.int32), jnp.zeros((batch, n, groups), jnp.int32)
    xs = tuple(by_step(x) for x in (va, vb, sa, sb, ea, eb))

    def step(carry, x):
        s, r, special = carry
        xa, xb, xsa, xsb, xea, xeb = x
        xf, xe = _combined_scales(xsa, xsb)
        xe = xe + xea[:, :, None, :] + xeb[:, None, :, :]
        dot = jnp.einsum(
            "lmgk,lngk->lmng", xa, xb, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )
        term = dot * xf  # exact for e8m0 (f = 1); one rounding for the e4m3 product, as the kernels
        frac, frac_e = _fraction_exponent(term)
        live = jnp.isfinite(term) & ((_bits(term) & ~_SIGN) != 0)  # subnormal terms too
        exponent = jnp.where(live, frac_e + xe, _NO_TERM)
        special = special + jnp.sum(jnp.where(jnp.isfinite(term), 0.0, term), axis=-1)
        r_new = jnp.maximum(r, jnp.max(exponent, axis=-1))
        s = _times_pow2(s, r - r_new) + jnp.sum(
            _times_pow2(jnp.where(live, frac, 0.0), exponent - r_new[..., None]), axis=-1
        )
        return (s, r_new, special), None

    init = (
        jnp.zeros((batch, m, n), jnp.float32),
        jnp.full((batch, m, n), _NO_TERM, jnp.int32),
        jnp.zeros((batch, m, n), jnp.float32),
    )
    (s, r, special), _ = jax.lax.scan(step, init, xs)
    return jnp.where(special == 0, _ldexp(s, r), special)
