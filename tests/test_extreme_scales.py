"""Extreme scales: gemm_amax (default backend) and reference_gemm_amax against the float64 oracle.

The semantics are the block-scaled hardware's: per K group the fp32 dot of the narrow values,
times the group's combined scale, accumulated in fp32. A scale is never applied to an element
alone, so a C that fp32 holds comes out finite and right whatever the scales are: 448 * 2^127
times 1 * 2^-127, a zero operand beside 2^127, subnormal results. float64 holds every term of
these problems exactly, so the oracle's C rounded to fp32 is the answer, up to fp32 accumulation.
"""

import ml_dtypes
import npref
import numpy as np
import pytest

import jax_gemm_amax as jga

E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn
OPS = {"gemm_amax": jga.gemm_amax, "reference": jga.reference_gemm_amax}
TINY = 2.0**-149  # fp32's smallest subnormal

# format -> (operand kind, scale dtype, sf_vec_size); mxfp4_16 is FP4 with e8m0 scales per 16.
FORMATS = {
    "mxfp8_e4m3": ("e4m3", E8M0, 32),
    "mxfp8_e5m2": ("e5m2", E8M0, 32),
    "mxfp4": ("fp4", E8M0, 32),
    "mxfp4_16": ("fp4", E8M0, 16),
    "nvfp4": ("fp4", E4M3, 16),
}


def _pack_fp4(codes):
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _run(op, a, b, sfa, sfb, sfv, c_dtype="float32"):
    """Runs `op` on batched numpy operands (L, rows, Kb), 2-D when L = 1."""
    if a.shape[0] == 1:
        args = (a[0], b[0], sfa[0], sfb[0])
    else:
        args = (a, b, sfa, sfb)
    c, amax = OPS[op](*args, c_dtype=c_dtype, sf_vec_size=sfv)
    c = np.asarray(c)
    return (c[None] if a.shape[0] == 1 else c), float(amax)


def _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv):
    """f32 C against the float64 oracle rounded to fp32: rounding, fp32 accumulation relative to
    sum |a b|, and one subnormal step per term and addition; NaN exactly where the oracle's is."""
    ref, abssum, _ = npref.gemm_amax_f64(a, b, sfa, sfb, sfv)
    want = ref.astype(np.float32).astype(np.float64)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(c), nan, err_msg="NaN where the oracle has none, or the reverse")
    groups = npref.decode_values(a).shape[-1] // sfv
    tol = 2.0**-23 * np.abs(want) + 2e-5 * abssum + 2 * groups * TINY
    got = c.astype(np.float64)
    bad = ~nan & ~(np.abs(got - want) <= tol)
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} elements differ; first at {np.argwhere(bad)[0]}: "
        f"got {got[bad][0]!r}, want {want[bad][0]!r} (tol {tol[bad][0]!r})"
    )
    assert np.isfinite(c[~nan]).all()
    if nan.any():
        assert np.isnan(amax)
    else:
        assert amax == np.max(np.abs(c)), "amax is max |C| of the fp32 sums"


def _e8m0(exponents):
    return (np.asarray(exponents) + 127).astype(np.uint8)


def _uniform(shape, value, kind):
    """An operand of one value everywhere: FP8 in its dtype, FP4 packed."""
    if kind == "fp4":
        code = int(np.flatnonzero(npref.E2M1_TABLE == value)[0])
        return _pack_fp4(np.full(shape, code, np.uint8))
    return np.full(shape, value, np.float64).astype(npref.FP8[kind])


# ---------------------------------------------------------------------------------------------
# The cases, exact.


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_huge_times_tiny_scale_is_exact(op, kind):
    # A = 448 with SFA = 2^127 (0xFE), B = 1 with SFB = 2^-127 (0x00): C = 448 K, not inf * 0.
    m, n, k = 40, 24, 64
    a, b = _uniform((1, m, k), 448.0, kind), _uniform((1, n, k), 1.0, kind)
    sfa = npref.physical_scales(np.full((1, m, k // 32), 0xFE, np.uint8), E8M0)
    sfb = npref.physical_scales(np.full((1, n, k // 32), 0x00, np.uint8), E8M0)
    c, amax = _run(op, a, b, sfa, sfb, 32)
    np.testing.assert_array_equal(c, np.full((1, m, n), 448.0 * k, np.float32))
    assert amax == 448.0 * k


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_tiny_times_huge_scale_is_exact(op, fmt):
    # A = B = 1, SFA = 2^-127, SFB = 2^127: C = K (today 0 and amax 0 where 2^-127 is flushed).
    kind, _, sfv = FORMATS[fmt]
    m, n, k = 33, 40, 96
    a, b = _uniform((1, m, k), 1.0, kind), _uniform((1, n, k), 1.0, kind)
    sfa = npref.physical_scales(np.full((1, m, k // sfv), 0x00, np.uint8), E8M0)
    sfb = npref.physical_scales(np.full((1, n, k // sfv), 0xFE, np.uint8), E8M0)
    c, amax = _run(op, a, b, sfa, sfb, sfv)
    np.testing.assert_array_equal(c, np.full((1, m, n), float(k), np.float32))
    assert amax == float(k)


# Rows of A: up to 32 run on the few-row kernel on a GPU, more on the architecture's GEMM.
FEW_AND_MANY_ROWS = [24, 64]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", FEW_AND_MANY_ROWS)
def test_zero_operand_beside_huge_scale_is_zero(op, m):
    # A = 0 (ordinary scales), B = 448 with SFB = 2^127: exact C = 0, not 0 * inf = NaN.
    n, k = 56, 64
    a, b = _uniform((1, m, k), 0.0, "e4m3"), _uniform((1, n, k), 448.0, "e4m3")
    sfa = npref.physical_scales(np.full((1, m, k // 32), 127, np.uint8), E8M0)
    sfb = npref.physical_scales(np.full((1, n, k // 32), 0xFE, np.uint8), E8M0)
    c, amax = _run(op, a, b, sfa, sfb, 32)
    assert np.isfinite(c).all()
    np.testing.assert_array_equal(c, np.zeros((1, m, n), np.float32))
    assert amax == 0.0


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "ea,eb,fp32_class",
    [
        (-60, -70, "subnormal"),  # 64 * 2^-9 * 2^-9 * 2^-130 = 2^-142
        (-127, 20, "normal"),
    ],  # 64 * 2^-9 * 2^-127 * 2^-9 * 2^20 = 2^-119, with an fp32-subnormal 2^-136 in A x SFA
    ids=["subnormal_product", "normal_product"],
)
def test_subnormal_values_times_small_scales(op, ea, eb, fp32_class):
    # e4m3 subnormal values (2^-9, code 0x01) and small scales: the exact C is K 2^-18 2^(ea + eb).
    m, n, k = 8, 16, 64
    a = np.full((1, m, k), 0x01, np.uint8).view(E4M3)
    b = np.full((1, n, k), 0x01, np.uint8).view(E4M3)
    sfa = npref.physical_scales(np.full((1, m, k // 32), ea + 127, np.uint8), E8M0)
    sfb = npref.physical_scales(np.full((1, n, k // 32), eb + 127, np.uint8), E8M0)
    c, amax = _run(op, a, b, sfa, sfb, 32)
    exact = np.float32(k * 2.0 ** (-18 + ea + eb))
    assert (exact < np.finfo(np.float32).tiny) == (fp32_class == "subnormal") and exact > 0
    np.testing.assert_array_equal(c, np.full((1, m, n), exact, np.float32))
    assert amax == exact


# ---------------------------------------------------------------------------------------------
# Random data with random extreme scale bytes.


def _random_values(rng, kind, batch, rows, k, nan_fraction=0.0):
    """Random operand bytes: FP8 around +-2 (e4m3 subnormal codes included), FP4 any code."""
    if kind == "fp4":
        return rng.integers(0, 256, size=(batch, rows, k // 2), dtype=np.uint8)
    x = (rng.standard_normal((batch, rows, k)) * 2.0).astype(npref.FP8[kind])
    if kind == "e4m3":  # some subnormal values (codes 1..7, either sign)
        sub = rng.random(x.shape) < 0.1
        codes = x.view(np.uint8)
        codes[sub] = rng.integers(1, 8, size=sub.sum()) | (rng.integers(0, 2, size=sub.sum()) << 7)
    if nan_fraction:
        nan = rng.random(x.shape) < nan_fraction
        x.view(np.uint8)[nan] = 0x7F  # NaN in both FP8 formats
    return x


def _e8m0_exponents(rng, regime, batch, m, n, groups):
    """Scale exponents of A (L, M, G) and B (L, N, G). Per group the regime picks a combined
    exponent T; A's base exponent sits near an end of the range that leaves B's (T minus it) an
    e8m0 exponent too, so one of them is extreme (ordinary groups of "mixed" excepted); each scale
    jitters by up to 3 around its base, clipped to the e8m0 range (the bytes 0x00 and 0xFE occur)."""
    ordinary, balanced, vanishing, huge, subnormal = range(5)
    pick = {
        "balanced": np.full(groups, balanced),  # ordinary products of extreme scales: 448 * 2^127 * 1 * 2^-127
        "mixed": rng.choice([ordinary, balanced, vanishing], groups),  # beside groups that vanish
        "huge": np.full(groups, huge),  # C up to ~2^110
        "subnormal": np.full(groups, subnormal),  # products about 2^-140: C an fp32 subnormal or just normal
    }[regime]
    combined = np.choose(
        pick,
        [
            rng.integers(-4, 5, groups),
            rng.integers(-4, 5, groups),
            rng.integers(-160, -110, groups),
            rng.integers(60, 96, groups),
            rng.integers(-150, -132, groups),
        ],
    )
    lo, hi = np.maximum(-127, combined - 127), np.minimum(127, combined + 127)
    offset = rng.integers(0, 4, groups)
    base_a = np.where(rng.random(groups) < 0.5, lo + offset, hi - offset)
    base_a = np.where(pick == ordinary, rng.integers(-3, 4, groups), base_a)
    base_b = combined - base_a
    ea = np.clip(base_a + rng.integers(-3, 4, (batch, m, groups)), -127, 127)
    eb = np.clip(base_b + rng.integers(-3, 4, (batch, n, groups)), -127, 127)
    return ea, eb


# e4m3 scale bytes for NVFP4: subnormal (2^-9 .. 7 * 2^-9), the largest (448, 416, 384), ordinary.
NVFP4_SCALE_CODES = np.array([0x01, 0x02, 0x03, 0x05, 0x07, 0x08, 0x7E, 0x7D, 0x7C, 0x38, 0x3C, 0x40], np.uint8)


def _random_problem(rng, fmt, regime, batch, m, n, k, nan_fraction=0.0):
    kind, sf_dtype, sfv = FORMATS[fmt]
    groups = k // sfv
    a = _random_values(rng, kind, batch, m, k, nan_fraction)
    b = _random_values(rng, kind, batch, n, k, nan_fraction)
    if sf_dtype == E4M3:
        ca = rng.choice(NVFP4_SCALE_CODES, (batch, m, groups))
        cb = rng.choice(NVFP4_SCALE_CODES, (batch, n, groups))
    else:
        ea, eb = _e8m0_exponents(rng, regime, batch, m, n, groups)
        ca, cb = _e8m0(ea), _e8m0(eb)
    if nan_fraction:  # NaN scale bytes: 0xFF (e8m0), 0x7F (e4m3)
        nan_code = 0x7F if sf_dtype == E4M3 else 0xFF
        ca[rng.random(ca.shape) < nan_fraction] = nan_code
        cb[rng.random(cb.shape) < nan_fraction] = nan_code
    return a, b, npref.physical_scales(ca, sf_dtype), npref.physical_scales(cb, sf_dtype), sfv


CASES = [
    (fmt, regime)
    for fmt in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "mxfp4_16")
    for regime in ("balanced", "mixed", "huge", "subnormal")
] + [("nvfp4", "extreme")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt,regime", CASES)
def test_random_extreme_scales(rng, op, fmt, regime):
    # M, N past a 128-row scale block and not multiples of the CPU or GPU tiles.
    a, b, sfa, sfb, sfv = _random_problem(rng, fmt, regime, 1, 136, 72, 256)
    if regime == "subnormal":  # the data do what the case is for
        want = np.abs(npref.gemm_amax_f64(a, b, sfa, sfb, sfv)[0])
        assert ((want > 0) & (want < np.finfo(np.float32).tiny)).mean() > 0.2
    c, amax = _run(op, a, b, sfa, sfb, sfv)
    assert not np.isnan(c).any() and np.isfinite(amax)
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4_16", "nvfp4"])
@pytest.mark.parametrize("batch,m,n,k", [(1, 1, 40, 256), (3, 45, 132, 192)], ids=["M1", "batched"])
def test_random_extreme_scales_shapes(rng, op, fmt, batch, m, n, k):
    a, b, sfa, sfb, sfv = _random_problem(rng, fmt, "balanced", batch, m, n, k)
    c, amax = _run(op, a, b, sfa, sfb, sfv)
    assert not np.isnan(c).any() and np.isfinite(amax)
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
def test_nan_only_from_nan_inputs(rng, op, fmt):
    # NaN scale bytes and NaN codes among extreme scales: NaN exactly where a NaN input meets C,
    # everything else finite and right, amax NaN.
    a, b, sfa, sfb, sfv = _random_problem(rng, fmt, "balanced", 1, 136, 72, 256, nan_fraction=0.002)
    c, amax = _run(op, a, b, sfa, sfb, sfv)
    ref, _, _ = npref.gemm_amax_f64(a, b, sfa, sfb, sfv)
    assert np.isnan(ref).any() and not np.isnan(ref).all()
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


# ---------------------------------------------------------------------------------------------
# FP4 C has no NaN.


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", FEW_AND_MANY_ROWS)
@pytest.mark.parametrize("c_dtype", ["float4_e2m1fn", "uint8"])
def test_fp4_c_writes_nan_as_plus_six(rng, op, c_dtype, m):
    # A NaN scale byte of A's row 5 makes C's row 5 NaN: FP4 stores it as +6 (code 0x7), amax NaN.
    n, k = 64, 64  # N: whole 16-byte rows of FP4 C
    a = rng.integers(0, 256, size=(1, m, k // 2), dtype=np.uint8)  # FP4 C needs FP4 operands
    b = rng.integers(0, 256, size=(1, n, k // 2), dtype=np.uint8)
    ca = np.full((1, m, k // 32), 122, np.uint8)  # 2^-5 each: |C| <= 64 * 36 * 2^-10 < 6
    ca[0, 5, 1] = 0xFF
    sfa = npref.physical_scales(ca, E8M0)
    sfb = npref.physical_scales(np.full((1, n, k // 32), 122, np.uint8), E8M0)
    c, amax = _run(op, a, b, sfa, sfb, 32, c_dtype=c_dtype)
    assert np.isnan(amax)
    if c_dtype == "uint8":
        assert (c[0, 5] == 0x77).all()  # two +6 codes a byte
        values = npref.decode_values(c)
    else:
        values = c.astype(np.float64)
    assert (values[0, 5] == 6.0).all()
    ref, abssum, _ = npref.gemm_amax_f64(a, b, sfa, sfb, 32)
    rest = np.delete(values, 5, axis=1)
    npref.assert_c_close(rest, "float4_e2m1fn", np.delete(ref, 5, axis=1), np.delete(abssum, 5, axis=1))
