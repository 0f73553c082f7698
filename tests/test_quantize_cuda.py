"""quantize along either contraction axis, quantize_pair and the global amax.

CPU (everywhere): against an independent numpy oracle (float64, with float32 where the contract
computes in float32: the ratio amax * fl(1/max) and NVFP4's values times fl(1/scale)), feeding
gemm_amax, vmap, sharding, errors.
GPU (skip without one): the CUDA kernels against the jnp implementation compiled by XLA on the same
GPU, bit for bit (codes and scale bytes as uint8, amax), for every format, input dtype and
orientation, on data built to hit the edge cases (subnormals, zero blocks, rounding ties, exact
power-of-two amaxes, NaN/Inf blocks, rows not a multiple of 128, partial 4-group scale blocks).
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest
from conftest import on_gpu

import jax_gemm_amax as jga
from jax_gemm_amax.primitives.quantize import COLS, PAIR, ROWS, quantize_p
from jax_gemm_amax.quantize import quantize_jnp

FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"]
FMAX = {"mxfp8_e4m3": 448.0, "mxfp8_e5m2": 57344.0, "mxfp4": 6.0, "nvfp4": 6.0}
SFV = {"mxfp8_e4m3": 32, "mxfp8_e5m2": 32, "mxfp4": 32, "nvfp4": 16}
FP8 = {"mxfp8_e4m3": ml_dtypes.float8_e4m3fn, "mxfp8_e5m2": ml_dtypes.float8_e5m2}


# ---------------------------------------------------------------------------------------------
# The oracle


def _e2m1_codes(v):
    """float64 -> e2m1 codes: nearest magnitude, ties to the even code, saturating at 6."""
    mags = npref.E2M1_TABLE[:8]
    a = np.minimum(np.abs(v), 6.0)
    dist = np.abs(a[..., None] - mags)
    best = dist.min(-1, keepdims=True)
    cand = dist == best
    # two candidates: a tie; take the even code
    code = np.where(cand.sum(-1) > 1, np.argmax(cand & (np.arange(8) % 2 == 0), -1), np.argmin(dist, -1))
    return (code + np.where(np.signbit(v), 8, 0)).astype(np.uint8)


def oracle_rows(x, fmt):
    """(L, R, K) finite float32 -> (codes as uint8 (L, R, K or K/2), plain scale bytes (L, R, G), amax (L,))."""
    sfv = SFV[fmt]
    batch, rows, k = x.shape
    blocks = x.astype(np.float64).reshape(batch, rows, k // sfv, sfv)
    amax = np.abs(blocks).max(-1)
    ratio = amax.astype(np.float32) * (np.float32(1) / np.float32(FMAX[fmt]))  # float32 by contract
    if fmt != "nvfp4":
        mant, exp = np.frexp(ratio.astype(np.float64))
        e = np.where(mant == 0.5, exp - 1, exp)
        e = np.clip(np.where(amax > 0, e, -127), -127, 127)
        scale_bytes = (e + 127).astype(np.uint8)
        scaled = blocks * np.exp2(-e.astype(np.float64))[..., None]
    else:
        s = np.minimum(ratio, np.float32(448)).astype(ml_dtypes.float8_e4m3fn)
        scale_bytes = s.view(np.uint8)
        sv = s.astype(np.float32)
        recip = np.where(sv > 0, np.float32(1) / np.where(sv > 0, sv, np.float32(1)), np.float32(0))
        scaled = (blocks.astype(np.float32) * recip[..., None]).astype(np.float64)
        scaled = np.where(sv[..., None] > 0, scaled, 0.0)
    scaled = scaled.reshape(batch, rows, k)
    if fmt in FP8:
        lim = float(ml_dtypes.finfo(FP8[fmt]).max)
        codes = np.clip(scaled, -lim, lim).astype(FP8[fmt]).view(np.uint8)
    else:
        c = _e2m1_codes(scaled)
        codes = (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)
    return codes, scale_bytes, np.abs(x.astype(np.float64)).max(axis=(1, 2))


def _plain_bytes(physical, rows, groups):
    """Physical scales -> (L, rows, groups) bytes with npref's offset formula (not the library's)."""
    p = np.asarray(physical).view(np.uint8)
    p = p if p.ndim == 6 else p[None]
    idx = npref.scale_index(np.arange(rows)[:, None], np.arange(groups)[None, :])
    return p[(slice(None),) + idx]


def _check_against_oracle(q, s, x3, fmt):
    want_q, want_s, _ = oracle_rows(x3, fmt)
    q = np.asarray(q).view(np.uint8)
    q = q if q.ndim == 3 else q[None]
    np.testing.assert_array_equal(q, want_q)
    rows, groups = want_s.shape[1:]
    np.testing.assert_array_equal(_plain_bytes(s, rows, groups), want_s)
    # every byte outside the plain scales is padding, zero
    p = np.asarray(s).view(np.uint8)
    assert int(p.astype(np.int64).sum()) == int(want_s.astype(np.int64).sum())


def _finite_data(rng, shape, magnitude_range=20):
    """Normal values with per-element magnitudes over 2^+-magnitude_range, zero blocks, exact
    power-of-two-times-max amaxes and rows of values on the formats' rounding ties."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-magnitude_range, magnitude_range, size=shape))
    x = x.reshape(-1, shape[-1])
    n = x.shape[0]
    x[: n // 8] = rng.integers(-96, 97, size=(n // 8, shape[-1])) / 16.0  # ties after power-of-two scaling
    x[n // 8 : n // 4, ::7] = 448.0 * 2.0 ** rng.integers(-4, 4)
    x[n // 4 : n // 4 + 3, :64] = 0.0
    x[n // 4 + 3, ::3] = -0.0
    return x.reshape(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# CPU (and every backend): the oracle


@pytest.mark.parametrize("fmt", FORMATS)
def test_axis_minus_two_is_the_transpose_quantized(rng, fmt):
    x = _finite_data(rng, (2, 160, 96))  # R = 160 (5 MX groups: a partial 4-group), K = 96 rows of q
    q, s = jga.quantize(x, fmt, axis=-2)
    q1, s1 = jga.quantize(x, fmt, axis=1)  # the same axis, non-negative
    assert q.shape == ((2, 96, 80) if fmt in ("mxfp4", "nvfp4") else (2, 96, 160))
    assert s.shape == jga.scale_shape(96, 160, SFV[fmt], 2)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(q1).view(np.uint8))
    _check_against_oracle(q, s, np.swapaxes(x, 1, 2), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_against_oracle(rng, fmt):
    x = _finite_data(rng, (200, 160))
    q, s = jga.quantize(x, fmt)
    _check_against_oracle(q, s, x[None], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_pair_is_both_orientations(rng, fmt):
    x = _finite_data(rng, (3, 64, 160))
    (qr, sr), (qc, sc), amax = jga.quantize_pair(x, fmt, return_amax=True)
    _check_against_oracle(qr, sr, x, fmt)
    _check_against_oracle(qc, sc, np.swapaxes(x, 1, 2), fmt)
    assert float(amax) == np.abs(x).max()
    for got, want in zip((qr, sr, qc, sc), (*jga.quantize(x, fmt), *jga.quantize(x, fmt, axis=-2))):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


def test_pair_unpacked_fp4(rng):
    x = _finite_data(rng, (64, 96))
    (qr, _), (qc, _) = jga.quantize_pair(x, "mxfp4", packed=False)
    assert qr.dtype == jnp.float4_e2m1fn and qr.shape == (64, 96) and qc.shape == (96, 64)
    want, _ = jga.quantize(x, "mxfp4", axis=-2, packed=False)
    np.testing.assert_array_equal(np.asarray(qc, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("axis", [-1, -2])
def test_return_amax(rng, axis):
    x = _finite_data(rng, (4, 64, 64))
    *_, amax = jga.quantize(x, "nvfp4", axis=axis, return_amax=True)
    assert amax.dtype == jnp.float32 and amax.shape == ()
    assert float(amax) == np.abs(x).max()
    x[2, 5, 7] = np.nan
    *_, amax = jga.quantize(x, "mxfp8_e4m3", axis=axis, return_amax=True)
    assert np.isnan(float(amax))
    x[2, 5, 7] = -np.inf
    *_, amax = jax.jit(lambda v: jga.quantize(v, "mxfp4", axis=axis, return_amax=True))(x)
    assert float(amax) == np.inf


def test_empty_input_amax_is_zero():
    q, s, amax = jga.quantize(jnp.zeros((0, 64)), "mxfp8_e4m3", return_amax=True)
    assert q.shape == (0, 64) and s.shape == (0, 1, 32, 4, 4) and float(amax) == 0.0


@pytest.mark.parametrize("shape", [(3, 0, 64), (0, 4, 64), (3, 2, 0, 64)])
def test_vmap_of_empty_input(shape):
    """Empty items, or none, under vmap: the shapes quantize gives item by item."""
    q, s, amax = jax.vmap(lambda v: jga.quantize(v, "mxfp4", return_amax=True))(jnp.ones(shape))
    item_q, item_s = jga.quantize(jnp.ones(shape[1:]), "mxfp4")
    assert q.shape == (shape[0],) + item_q.shape and s.shape == (shape[0],) + item_s.shape
    assert amax.shape == (shape[0],) and not np.asarray(amax).any()


def test_vmap_of_axis_minus_two_is_per_item(rng):
    x = _finite_data(rng, (3, 2, 64, 96))
    f = functools.partial(jga.quantize, fmt="mxfp8_e5m2", axis=-2, return_amax=True)
    q, s, amax = jax.vmap(f)(x)
    assert q.shape == (3, 2, 96, 64) and amax.shape == (3,)
    for i in range(3):
        qi, si, ai = f(x[i])
        np.testing.assert_array_equal(np.asarray(q[i]).view(np.uint8), np.asarray(qi).view(np.uint8))
        np.testing.assert_array_equal(np.asarray(s[i]).view(np.uint8), np.asarray(si).view(np.uint8))
        assert float(amax[i]) == float(ai)


@pytest.mark.parametrize("fmt", FORMATS)
def test_wgrad_operands_feed_gemm_amax(rng, fmt):
    """dW = X^T dY from X (T, D_in) and dY (T, D_out) quantized along T: gemm_amax of the two
    columnwise operands is the float64 product of their dequantized values."""
    sfv = SFV[fmt]
    x = rng.standard_normal((256, 160)).astype(np.float32)
    dy = rng.standard_normal((256, 128)).astype(np.float32)
    qx, sx = jga.quantize(x, fmt, axis=-2)
    qd, sd = jga.quantize(dy, fmt, axis=-2)
    c, amax = jga.gemm_amax(qx, qd, sx, sd, sf_vec_size=sfv)
    assert c.shape == (160, 128)
    a, b, sa, sb = (np.asarray(v)[None] for v in (qx, qd, sx, sd))
    ref, abssum, ref_amax = npref.gemm_amax_f64(a, b, sa, sb, sfv)
    npref.assert_c_close(np.asarray(c)[None], "float32", ref, abssum)
    np.testing.assert_allclose(float(amax), ref_amax.max(), rtol=2e-5)
    # and it approximates the unquantized product
    rel = np.abs(np.asarray(c) - x.T.astype(np.float64) @ dy).max() / np.abs(x.T @ dy).max()
    assert rel < (0.1 if fmt in ("mxfp8_e4m3", "mxfp8_e5m2") else 0.5)


def test_errors():
    x = jnp.ones((64, 96))
    with pytest.raises(ValueError, match=r"axis: must be the last axis \(-1\) or the one before it \(-2\).*got 0"):
        jga.quantize(jnp.ones((2, 64, 64)), axis=0)
    with pytest.raises(ValueError, match=r"axis: .*got 2"):
        jga.quantize(x, axis=2)
    with pytest.raises(TypeError, match=r"axis must be an int, got -1.0"):
        jga.quantize(x, axis=-1.0)
    with pytest.raises(ValueError, match=r"x: R=48 must be a multiple of 32 for mxfp4 \(axis 0 is quantized\)"):
        jga.quantize(jnp.ones((48, 64)), "mxfp4", axis=-2)
    with pytest.raises(ValueError, match=r"x: R=40 must be a multiple of 16 for nvfp4"):
        jga.quantize_pair(jnp.ones((40, 64)), "nvfp4")
    with pytest.raises(ValueError, match=r"x: K=40 must be a multiple of 16 for nvfp4"):
        jga.quantize_pair(jnp.ones((64, 40)), "nvfp4")
    with pytest.raises(TypeError, match=r"x: must be a floating array, got int32"):
        jga.quantize_pair(jnp.ones((64, 64), jnp.int32))
    with pytest.raises(ValueError, match=r"fmt must be one of"):
        jga.quantize_pair(x, "fp8")


@pytest.mark.parametrize(
    "shape,spec,axis",
    [
        ((1024, 64), ("x", None), -1),  # R: 8 blocks over 8 devices, kept sharded
        ((64, 1024), (None, "x"), -2),  # K becomes the rows: 8 blocks, kept sharded
        ((256, 64), ("x", None), -1),  # R: 2 blocks over 8: replicated
        ((8, 64, 96), ("x", None, None), "pair"),  # L
        ((64, 256), (None, "x"), "pair"),  # quantized along both: replicated
    ],
)
def test_sharded_matches_one_device(rng, shape, spec, axis):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    x = _finite_data(rng, shape)
    x.reshape(-1)[77] = np.nan  # amax reaches every shard
    if axis == "pair":
        f = lambda v: jga.quantize_pair(v, "mxfp8_e4m3", return_amax=True)  # noqa: E731
    else:
        f = lambda v: jga.quantize(v, "nvfp4", axis=axis, return_amax=True)  # noqa: E731
    want = jax.tree.leaves(f(x))
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    got = jax.tree.leaves(jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P(*spec)))))
    for g, w in zip(got, want):
        if g.dtype == jnp.float32:
            assert np.isnan(float(g)) and np.isnan(float(w))
        else:
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


# ---------------------------------------------------------------------------------------------
# GPU: the kernels against the jnp implementation, bit for bit

gpu = pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
INPUTS = ["float32", "float16", "bfloat16"]
MODES = {"rows": ROWS, "cols": COLS, "pair": PAIR}


def _hostile(rng, shape, dtype, nonfinite):
    """Finite edge cases plus f32 subnormals (whole blocks and single elements) and, with
    nonfinite, NaN (both signs), +Inf and -Inf in a few blocks."""
    x = _finite_data(rng, shape, magnitude_range=12 if dtype == "float16" else 60).reshape(-1, shape[-1])
    n = x.shape[0]
    if dtype == "float32":
        x[n // 2 : n // 2 + 2] = rng.standard_normal((2, shape[-1])) * 2.0**-140  # subnormal blocks
        x[n // 2 + 2, ::5] = 1e-42
    else:  # the input format's own subnormals
        tiny = 2.0**-20 if dtype == "float16" else 2.0**-130
        x[n // 2 : n // 2 + 2] = rng.standard_normal((2, shape[-1])) * tiny
    if nonfinite:
        bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
        x[1, 3], x[n // 3, 40], x[n - 1, -1] = bits[0], bits[1], bits[2]
        x[5, 17], x[n // 2 + 5, 2] = np.inf, -np.inf
    return jnp.asarray(x.reshape(shape)).astype(dtype)


def _kernel_and_jnp(fmt, mode):
    kernel = jax.jit(lambda x: quantize_p.bind(x, fmt=fmt, mode=mode))
    reference = jax.jit(lambda x: quantize_jnp(x, fmt, mode))
    return kernel, reference


def _assert_bitwise(got, want, what):
    """Outputs: codes, scales per orientation, amax last."""
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if i == len(got) - 1:  # amax
            assert np.array_equal(g, w, equal_nan=True), f"{what}: amax {g} != jnp's {w}"
            continue
        g8, w8 = g.view(np.uint8), w.view(np.uint8)
        bad = np.argwhere(g8 != w8)
        if len(bad):
            pos = tuple(bad[0])
            raise AssertionError(
                f"{what}: output {i} ({'scales' if i % 2 else 'codes'}) differs in {len(bad)} of {g8.size} "
                f"bytes; first at {pos}: kernel 0x{g8[pos]:02x}, jnp 0x{w8[pos]:02x}"
            )


@gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", INPUTS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("nonfinite", [False, True], ids=["finite", "nonfinite"])
def test_kernel_is_bitwise_jnp(rng, fmt, dtype, mode, nonfinite):
    """Shapes: rows not a multiple of 128 (nor of the 32/64-row tile), K with a partial 4-group
    and a partial 128-column tile, L > 1; a second, larger one for the grid-stride loops; a third
    with R an odd multiple of 16 (NVFP4) and, for columns, an odd K (element loads)."""
    kernel, reference = _kernel_and_jnp(fmt, MODES[mode])
    text = kernel.lower(jnp.zeros((2, 320, 160), dtype)).as_text()
    assert "jax_gemm_amax_quantize_cuda" in text, "the kernel is not in the lowered program"
    r3 = 208 if fmt == "nvfp4" else 224
    third = (2, r3, 101 if mode == "cols" else r3)
    for shape in ((3, 320, 160), (2, 2080, 4128), third):
        x = _hostile(rng, shape, dtype, nonfinite)
        _assert_bitwise(kernel(x), reference(x), f"{fmt} {dtype} {mode} {shape}")


def _bf16_grid(rng):
    """Every bf16 mantissa at every exponent, subnormals included: one 32-row band per exponent E,
    holding both signs of all 128 mantissas times 2^(E-5) to 2^(E+2), shuffled, so that each block
    (32 rows of a column, 32 elements of a row) scales values over eight binades below its amax
    (the e2m1 and FP8 midpoints among them); plus NaN, Inf and -Inf in a few blocks."""
    mant = 1.0 + np.arange(128) / 128.0
    bands = []
    for e in range(-133, 126):
        v = (mant[:, None] * np.exp2(np.arange(e - 5, e + 3, dtype=np.float64))).reshape(-1)
        v = np.concatenate([v, -v]).astype(np.float32)  # exact in float32; the bf16 cast rounds subnormals
        bands.append(rng.permutation(v).reshape(32, 64))
    x = np.concatenate(bands)
    x[40, 3], x[4000, 17], x[8000, 60] = np.nan, np.inf, -np.inf
    return jnp.asarray(x[None]).astype(jnp.bfloat16)


@gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_bf16_grid_is_bitwise_jnp(rng, fmt, mode):
    """bf16 input over its whole range (the packed MXFP4 encoder computes in bf16): equal to jnp."""
    kernel, reference = _kernel_and_jnp(fmt, MODES[mode])
    x = _bf16_grid(rng)
    _assert_bitwise(kernel(x), reference(x), f"{fmt} {mode} bf16 grid")


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_under_vmap_and_called_twice(rng, fmt):
    """vmap over the public functions, in one jit that XLA may run as a CUDA graph, called twice on
    different inputs: each call equals the jnp path."""

    def f(x):
        (qr, sr), (qc, sc), amax = jax.vmap(lambda v: jga.quantize_pair(v, fmt, return_amax=True))(x)
        q, s, a = jax.vmap(lambda v: jga.quantize(v, fmt, axis=-2, return_amax=True))(x * 2)
        return qr, sr, qc, sc, q, s, amax + a

    def ref(x):
        outs = []
        for i in range(x.shape[0]):
            row = quantize_jnp(x[i][None], fmt, PAIR)
            col = quantize_jnp((x[i] * 2)[None], fmt, COLS)
            outs.append([o[0] for o in row[:4]] + [o[0] for o in col[:2]] + [row[4][0] + col[2][0]])
        return [jnp.stack(o) for o in zip(*outs)]

    fj, rj = jax.jit(f), jax.jit(ref)
    for _ in range(2):
        x = _hostile(rng, (2, 256, 192), "bfloat16", nonfinite=False)
        _assert_bitwise(fj(x), rj(x), f"{fmt} vmap")


@gpu
def test_kernel_empty_and_other_dtypes_take_the_jnp_path():
    q, s, amax = jga.quantize(jnp.zeros((0, 64), jnp.bfloat16), return_amax=True)
    assert q.shape == (0, 64) and float(amax) == 0.0
    text = jax.jit(lambda x: jga.quantize(x, "mxfp4")).lower(jnp.zeros((64, 64), jnp.float8_e4m3fn)).as_text()
    assert "jax_gemm_amax_quantize_cuda" not in text
