"""Scale layouts and quantization."""

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest

import jax_gemm_amax as jga
from jax_gemm_amax.quantize import _tiny_amax_bits


@pytest.mark.parametrize("rows,groups,batch", [(1, 1, None), (200, 10, None), (128, 4, 3), (300, 17, 2)])
def test_physical_plain_round_trip_and_cudnn_offsets(rng, rows, groups, batch):
    shape = (rows, groups) if batch is None else (batch, rows, groups)
    plain = rng.integers(1, 255, size=shape).astype(np.uint8)
    phys = np.asarray(jga.physical_from_plain(jnp.asarray(plain)))
    assert phys.shape == jga.scale_shape(rows, groups * 32, 32, batch)
    p3 = phys if batch is not None else phys[None]
    pl3 = plain if batch is not None else plain[None]
    # Flat C-contiguous offsets follow the cuBLAS formula: tile-major, then (r % 32) * 16 + ((r % 128) // 32) * 4 + g % 4.
    flat = p3.reshape(p3.shape[0], -1)
    k_blocks = p3.shape[2]
    for r in range(rows):
        for g in range(groups):
            off = ((r // 128) * k_blocks + g // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + g % 4
            np.testing.assert_array_equal(flat[:, off], pl3[:, r, g])
    # Padding is zero-filled.
    assert int(flat.astype(np.int64).sum()) == int(pl3.astype(np.int64).sum())
    back = np.asarray(jga.plain_from_physical(jnp.asarray(phys), rows, groups))
    np.testing.assert_array_equal(back, plain)


def test_logical_view_is_the_cudnn_permutation(rng):
    phys = rng.integers(0, 255, size=(2, 3, 2, 32, 4, 4)).astype(np.uint8)
    logical = np.asarray(jga.logical_from_physical(jnp.asarray(phys)))
    assert logical.shape == (32, 4, 3, 4, 2, 2)
    np.testing.assert_array_equal(logical, np.transpose(phys, (3, 4, 1, 5, 2, 0)))
    np.testing.assert_array_equal(np.asarray(jga.physical_from_logical(jnp.asarray(logical))), phys)
    assert jga.layout.scale_index(130, 5) == npref.scale_index(130, 5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="jax.nn.scaled_matmul lowers only on GPU")
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
def test_scaled_matmul_plain_layout_interop(rng, fmt):
    # Our physical scales, converted to plain, drive jax.nn.scaled_matmul to the same result (FP4
    # codes unpacked, as scaled_matmul takes them; the benchmark's peer runs this way).
    sfv = jga.FORMATS[fmt].sf_vec_size
    x = rng.standard_normal((2, 64, 128)).astype(np.float32)
    w = rng.standard_normal((2, 32, 128)).astype(np.float32)
    qa, sfa = jga.quantize(x, fmt, packed=False)
    qb, sfb = jga.quantize(w, fmt, packed=False)
    ours = jga.gemm_amax(qa, qb, sfa, sfb, sf_vec_size=sfv)
    plain_a = jga.plain_from_physical(sfa, 64, 128 // sfv)
    plain_b = jga.plain_from_physical(sfb, 32, 128 // sfv)
    theirs = jax.nn.scaled_matmul(qa, qb, plain_a, plain_b, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(np.asarray(ours.c), np.asarray(theirs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt,fmax", [("mxfp8_e4m3", 448.0), ("mxfp8_e5m2", 57344.0), ("mxfp4", 6.0)])
def test_mx_scale_is_block_amax_over_format_max_rounded_up(rng, fmt, fmax):
    x = (rng.standard_normal((130, 96)) * np.exp(rng.uniform(-6, 6, size=(130, 1)))).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block
    q, sf = jga.quantize(x, fmt)
    plain = npref.decode_scales(np.asarray(jga.plain_from_physical(sf, 130, 3)))
    amax = np.abs(x.astype(np.float64)).reshape(130, 3, 32).max(-1)
    want = np.where(amax > 0, 2.0 ** np.ceil(np.log2(np.maximum(amax, 1e-300) / fmax)), 2.0**-127)
    np.testing.assert_array_equal(plain, want)
    deq = np.asarray(jga.dequantize(q, sf, 32))
    rel = {"mxfp8_e4m3": 2**-4, "mxfp8_e5m2": 2**-3, "mxfp4": 2**-1}[fmt]
    step = np.repeat(plain, 32, axis=-1)  # quantum near zero
    assert np.all(np.abs(deq - x) <= rel * np.abs(x) + step * (0.5 if fmt == "mxfp4" else 2**-7))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
def test_mx_codes_are_the_scaled_values_rounded(rng, fmt):
    """Every code is x / scale rounded to nearest even in the format (float64 reference), with
    magnitudes spread over 2^-40..2^40 inside each block, so that small values land on the
    format's subnormals and on zero (with their sign), and one block of values exactly halfway
    between two codes (a scale off by one ulp rounds them the other way)."""
    x = (rng.standard_normal((96, 128)) * np.exp2(rng.integers(-40, 40, size=(96, 128)))).astype(np.float32)
    x[5, :32] = 0.0
    x[6, 32:64] = -0.0
    halfway = {
        "mxfp8_e4m3": [1.0625, 2.125, 1.1875],
        "mxfp8_e5m2": [1.125, 2.25, 1.375],
        "mxfp4": [0.25, 1.25, 2.5, 5.0],
    }[fmt]
    fmax = jga.FORMATS[fmt].max_value
    x[7, 0] = fmax * 8.0  # the block's amax: its scale is exactly 2^3
    x[7, 1:32] = np.resize(halfway, 31) * np.resize([8.0, -8.0], 31)
    q, sf = jga.quantize(x, fmt)
    scale = np.repeat(npref.decode_scales(np.asarray(jga.plain_from_physical(sf, 96, 4))), 32, axis=-1)
    scaled = x.astype(np.float64) / scale  # exact (powers of two); ml_dtypes rounds once, to nearest even
    if fmt == "mxfp4":
        want = scaled.astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
        np.testing.assert_array_equal(npref.decode_values(np.asarray(q)), want)
        return
    want = scaled.astype(jga.FORMATS[fmt].value_dtype)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), want.view(np.uint8))


def test_nvfp4_uses_e4m3_scales_per_16(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    q, sf = jga.quantize(x, "nvfp4")
    assert q.dtype == jnp.uint8 and q.shape == (64, 32)
    assert sf.dtype == jnp.float8_e4m3fn and sf.shape == jga.scale_shape(64, 64, 16)
    plain = np.asarray(jga.plain_from_physical(sf, 64, 4)).astype(np.float64)
    amax = np.abs(x).reshape(64, 4, 16).max(-1)
    np.testing.assert_array_equal(plain, (amax / 6).astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
    deq = np.asarray(jga.dequantize(q, sf, 16))
    assert np.max(np.abs(deq - x)) <= 0.5 * np.max(plain) * 2 + 1e-6


def test_fp4_containers_agree(rng):
    x = rng.standard_normal((3, 40, 64)).astype(np.float32)
    packed, sf = jga.quantize(x, "mxfp4")
    unpacked, sf2 = jga.quantize(x, "mxfp4", packed=False)
    assert packed.shape == (3, 40, 32) and unpacked.shape == (3, 40, 64)
    assert unpacked.dtype == jnp.float4_e2m1fn
    np.testing.assert_array_equal(np.asarray(sf), np.asarray(sf2))
    np.testing.assert_array_equal(npref.decode_values(np.asarray(packed)), np.asarray(unpacked).astype(np.float64))


def test_e2m1_rounding_is_nearest_even_and_saturating():
    vals = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e9, -0.3, -5.1, 0.0], np.float32)
    got = np.asarray(jga.formats.e2m1_values(jga.formats.e2m1_codes(jnp.asarray(vals))))
    np.testing.assert_array_equal(got, [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -6.0, 0.0])


def test_quantized_gemm_tracks_the_float_product(rng):
    x = rng.standard_normal((2, 96, 256)).astype(np.float32)
    w = rng.standard_normal((2, 64, 256)).astype(np.float32)
    exact = np.einsum("lmk,lnk->lmn", x.astype(np.float64), w.astype(np.float64))
    # Relative Frobenius error of each format on Gaussian data (measured: 0.037, 0.075, 0.16, 0.135).
    for fmt, tol in [("mxfp8_e4m3", 0.05), ("mxfp8_e5m2", 0.1), ("mxfp4", 0.2), ("nvfp4", 0.17)]:
        sfv = jga.FORMATS[fmt].sf_vec_size
        qa, sfa = jga.quantize(x, fmt)
        qb, sfb = jga.quantize(w, fmt)
        c, amax = jga.gemm_amax(qa, qb, sfa, sfb, sf_vec_size=sfv)
        err = np.linalg.norm(np.asarray(c) - exact) / np.linalg.norm(exact)
        assert err < tol, (fmt, err)
        assert abs(float(amax) - np.abs(exact).max()) / np.abs(exact).max() < tol


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "nvfp4"])
def test_quantize_dequantize_in_one_jit_keeps_the_rounding(rng, fmt):
    # XLA may fold convert(convert(x, f8), f32) into x inside one jit (excess precision, on by
    # default on GPU); dequantize must still see the quantized values.
    x = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
    sfv = jga.FORMATS[fmt].sf_vec_size
    fused = jax.jit(lambda x: jga.dequantize(*jga.quantize(x, fmt), sfv))(x)
    q, sf = jax.jit(lambda x: jga.quantize(x, fmt))(x)
    np.testing.assert_array_equal(np.asarray(fused), np.asarray(jga.dequantize(q, sf, sfv)))
    assert not np.array_equal(np.asarray(fused), np.asarray(x))


def _block_mask(x, sfv):
    """(..., K) -> (..., K // sfv): blocks holding a NaN or an Inf."""
    return ~np.isfinite(x).reshape(*x.shape[:-1], x.shape[-1] // sfv, sfv).all(-1)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
def test_non_finite_block_gets_a_nan_scale_that_reaches_c_and_amax(rng, fmt):
    f = jga.FORMATS[fmt]
    sfv, rows, k = f.sf_vec_size, 64, 128
    clean = (rng.standard_normal((2, rows, k)) * np.exp2(rng.integers(-8, 8, size=(2, rows, 1)))).astype(np.float32)
    x = clean.copy()
    x[0, 3, 5] = np.nan
    x[0, 3, 40], x[0, 3, 41] = np.inf, 1000.0  # a finite neighbour above the format's max
    x[1, 10, 127] = -np.inf  # last element of the last block
    x[1, 63, 0] = np.nan  # first element
    x[1, 20, 16:32] = np.nan  # a whole block of NaN (for sfv 32, half of one)
    mask = _block_mask(x, sfv)
    q, sf = jga.quantize(x, fmt)
    q0, sf0 = jga.quantize(clean, fmt)

    # Scales: NaN exactly on the non-finite blocks, every other byte as for the finite data.
    codes = np.asarray(jga.plain_from_physical(sf, rows, k // sfv)).view(np.uint8)
    codes0 = np.asarray(jga.plain_from_physical(sf0, rows, k // sfv)).view(np.uint8)
    nan_code = 0x7F if fmt == "nvfp4" else 0xFF
    np.testing.assert_array_equal(codes, np.where(mask, nan_code, codes0))
    assert (
        np.count_nonzero(np.asarray(sf).view(np.uint8) != np.asarray(sf0).view(np.uint8)) == mask.sum()
    )  # padding too

    # Values: other blocks bit for bit; the non-finite blocks hold their values at scale 1
    # (saturated, NaN kept where the format has one).
    packed = fmt in ("mxfp4", "nvfp4")
    per_byte = np.repeat(mask, sfv // 2 if packed else sfv, axis=-1)
    qb, qb0 = np.asarray(q).view(np.uint8), np.asarray(q0).view(np.uint8)
    np.testing.assert_array_equal(qb[~per_byte], qb0[~per_byte])
    per_elem = np.repeat(mask, sfv, axis=-1)
    at_one = np.clip(x.astype(np.float64), -f.max_value, f.max_value).astype(f.value_dtype).astype(np.float64)
    got = npref.decode_values(np.asarray(q))
    check = per_elem & ~(np.isnan(x) & packed)  # e2m1 has no NaN
    np.testing.assert_array_equal(got[check], at_one[check])

    # dequantize: the whole block is NaN, the rest as for the finite data.
    deq, deq0 = np.asarray(jga.dequantize(q, sf, sfv)), np.asarray(jga.dequantize(q0, sf0, sfv))
    assert np.isnan(deq[per_elem]).all()
    np.testing.assert_array_equal(deq[~per_elem], deq0[~per_elem])

    # gemm_amax: every C element of a row with a non-finite block is NaN, and so is amax; the
    # other rows match the float64 oracle of the finite data.
    w = rng.standard_normal((2, 32, k)).astype(np.float32)
    qw, sw = jga.quantize(w, fmt)
    c, amax = jga.gemm_amax(q, qw, sf, sw, sf_vec_size=sfv)
    c = np.asarray(c)
    nan_rows = mask.any(-1)
    np.testing.assert_array_equal(np.isnan(c), np.broadcast_to(nan_rows[..., None], c.shape))
    assert np.isnan(float(amax))
    ref, abssum, _ = npref.gemm_amax_f64(np.asarray(q0), np.asarray(qw), np.asarray(sf0), np.asarray(sw), sfv)
    npref.assert_c_close(np.where(nan_rows[..., None], ref, c), "float32", ref, abssum)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(0, 64), (5, 0), (2, 0, 64), (0, 3, 64), (2, 3, 0)])
def test_quantize_empty_input_gives_empty_results(fmt, shape):
    f = jga.FORMATS[fmt]
    *lead, rows, k = shape
    packed = fmt != "mxfp8_e4m3"
    q, sf = jga.quantize(np.zeros(shape, np.float32), fmt)
    assert q.shape == (*lead, rows, k // 2 if packed else k)
    assert q.dtype == (jnp.uint8 if packed else f.value_dtype)
    batch = int(np.prod(lead)) if lead else None
    assert sf.shape == jga.scale_shape(rows, k, f.sf_vec_size, batch) and sf.dtype == f.scale_dtype
    if len(lead) < 2:
        deq = jga.dequantize(q, sf, f.sf_vec_size)
        assert deq.shape == shape and deq.dtype == jnp.float32


def test_gemm_amax_rejects_what_empty_quantize_returns():
    qa, sfa = jga.quantize(np.zeros((0, 64), np.float32))
    qb, sfb = jga.quantize(np.ones((32, 64), np.float32))
    with pytest.raises(ValueError, match=r"a, b: L, M, N and K must be at least 1 \(a \(0, 64\), b \(32, 64\)\)"):
        jga.gemm_amax(qa, qb, sfa, sfb)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_dequantize_takes_unpacked_fp4(rng, fmt):
    sfv = jga.FORMATS[fmt].sf_vec_size
    x = rng.standard_normal((3, 40, 64)).astype(np.float32)
    q, sf = jga.quantize(x, fmt, packed=False)
    assert q.dtype == jnp.float4_e2m1fn
    got = np.asarray(jga.dequantize(q, sf, sfv))
    want = np.asarray(q).astype(np.float64) * npref.scales_per_element(np.asarray(sf), 40, 64, sfv)
    np.testing.assert_array_equal(got, want)
    packed, sf_packed = jga.quantize(x, fmt)
    np.testing.assert_array_equal(np.asarray(jga.dequantize(packed, sf_packed, sfv)), got)


def _mx_oracle(x, fmt):
    """Scale exponents and codes of quantize along rows of 32, from the definition in float64:
    the exponent is ceil(log2(fl32(amax * fl32(1 / max)))), clamped to [-127, 127] (-127 for an
    all-zero block), with fl32 IEEE rounding, subnormals included (numpy's cast from float64 rounds
    once); the codes are x / 2^exponent (exact) rounded to the format."""
    f = jga.FORMATS[fmt]
    blocks = x.astype(np.float64).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(-1)
    ratio = (amax * np.float64(np.float32(1) / np.float32(f.max_value))).astype(np.float32).astype(np.float64)
    mant, exp = np.frexp(ratio)
    exponent = np.where(ratio > 0, np.where(mant == 0.5, exp - 1, exp), -127).clip(-127, 127)
    scaled = (blocks / np.exp2(exponent)[..., None]).reshape(x.shape)
    if fmt == "mxfp4":
        return exponent, scaled.astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    return exponent, scaled.astype(f.value_dtype).view(np.uint8)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
def test_tiny_blocks_and_subnormal_inputs_keep_their_codes(rng, fmt):
    """Blocks whose amax lies between fp32's subnormals and 2^-95, with elements spread 2^30 below it
    (subnormal inputs among them): the scale is 2^-127 or 2^-126 where amax / max is below 2^-126,
    and values there keep their codes instead of flushing to zero (XLA's CPU flushes subnormal
    operands and results). The amaxes on either side of the two boundaries are among them."""
    assert np.float32(2.0**-140) * np.float32(2.0**20) == np.float32(2.0**-120)  # numpy keeps subnormals
    rows = 120
    top = rng.integers(-150, -95, size=(rows, 1)).astype(np.float64)
    x = rng.uniform(0.5, 1.0, (rows, 64)) * np.exp2(top - rng.integers(0, 30, (rows, 64)))
    x = (x * rng.choice([-1.0, 1.0], (rows, 64))).astype(np.float32)
    normal, above = _tiny_amax_bits(jga.FORMATS[fmt].max_value)
    for i, bits in enumerate((normal - 1, normal, normal + 1, above - 1, above, above + 1)):
        x[i, 0] = np.array(bits, np.uint32).view(np.float32)
        x[i, 1:32] = x[i, 1:32].clip(-x[i, 0], x[i, 0])
    q, sf, amax = jga.quantize(x, fmt, return_amax=True)
    exponent, want = _mx_oracle(x, fmt)
    got_exponent = np.asarray(jga.plain_from_physical(sf, rows, 2)).view(np.uint8).astype(np.int64) - 127
    np.testing.assert_array_equal(got_exponent, exponent)
    assert (exponent <= -117).any() and (exponent == -126).any() and (exponent == -127).any()
    if fmt == "mxfp4":
        np.testing.assert_array_equal(npref.decode_values(np.asarray(q)), want)
    else:
        np.testing.assert_array_equal(np.asarray(q).view(np.uint8), want)
    assert (want != 0).sum() > rows  # not a test of zeros
    assert float(amax) == np.abs(x).max()
    tiny = np.array([0x00000003], np.uint32).view(np.float32)  # 3 * 2^-149 alone
    assert float(jga.quantize(np.resize(tiny, (1, 32)), fmt, return_amax=True)[2]) == tiny[0]


@pytest.mark.parametrize("kind,sfv", [("e4m3", 32), ("e5m2", 32), ("fp4", 32)])
def test_dequantize_applies_extreme_e8m0_scales_exactly(rng, kind, sfv):
    """2^-127 (byte 0, an fp32 subnormal) and 2^127 (0xFE) against every code: exact wherever the
    product is a normal fp32 number, Inf beyond fp32's range, NaN for 0xFF."""
    a = npref.random_operand(rng, 1, 3, 64, kind)[0]
    codes = np.zeros((3, 2), np.uint8)
    codes[0], codes[1], codes[2] = (0, 254), (254, 0), (255, 7)
    sf = npref.physical_scales(codes[None], ml_dtypes.float8_e8m0fnu)[0]
    got = np.asarray(jga.dequantize(a, sf, sfv)).astype(np.float64)
    with np.errstate(over="ignore"):  # beyond fp32's range: Inf
        want = (npref.decode_values(a) * npref.scales_per_element(sf[None], 3, 64, sfv)[0]).astype(np.float32)
    normal = ~(np.abs(want) < 2.0**-126)  # NaN, Inf and normal products
    np.testing.assert_array_equal(got[normal], want[normal])
    assert (want[:2][normal[:2]] != 0).sum() > 32 and np.isnan(got[2, :32]).all()
