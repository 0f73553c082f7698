"""Weight-only gemm_amax: bfloat16/float16 a (unscaled) times a block-scaled b, against an
independent float64 oracle (npref), on the CPU kernel, the reference, and the XLA path that the
CUDA platform lowers to (run here on CPU); the GPU cases compare the CUDA backend with the CPU one."""

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest
from conftest import on_gpu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_gemm_amax as jga
from jax_gemm_amax import _ffi
from jax_gemm_amax.ops import weight_only_sum

E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn
A_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# b format -> (operand kind of npref, scale dtype, sf_vec_size)
B_FORMATS = {
    "e4m3": ("e4m3", E8M0, 32),
    "e5m2": ("e5m2", E8M0, 32),
    "mxfp4": ("fp4", E8M0, 32),
    "mxfp4_sfv16": ("fp4", E8M0, 16),
    "nvfp4": ("fp4", E4M3, 16),
}
CPU = jax.devices("cpu")[0]


def on_sm90() -> bool:
    """Lowering happens for this GPU: a bfloat16 a of more than 64 rows takes the Hopper GEMM."""
    return on_gpu() and getattr(jax.devices()[0], "compute_capability", "") == "9.0"


def _problem(rng, b_format, a_dtype, m, n, k, batch=1):
    kind, sf_dtype, sfv = B_FORMATS[b_format]
    a = (rng.standard_normal((batch, m, k)) * 2.0).astype(A_DTYPES[a_dtype])
    b = npref.random_operand(rng, batch, n, k, kind)
    sfb = npref.random_scales(rng, batch, n, k, sfv, sf_dtype)
    return a, b, sfb, sfv


def oracle(a, b, sfb, sfv):
    """float64 ``C = a · (b * sfb)ᵀ``, ``sum |a| |b sfb|`` (the fp32 summation's error scale) and amax."""
    av = a.astype(np.float64)
    bv = npref.decode_values(b) * npref.scales_per_element(sfb, b.shape[1], av.shape[-1], sfv)
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.einsum("lmk,lnk->lmn", av, bv)
        abssum = np.einsum("lmk,lnk->lmn", np.abs(av), np.abs(bv))
    return c, abssum, np.max(np.abs(c))


def _amax_close(got, want, abssum):
    tol = 2e-5 * np.max(abssum) + 1e-30
    assert abs(float(got) - want) <= tol, (float(got), want, tol)


def _check(result, a, b, sfb, sfv, c_dtype="float32"):
    c, abssum, amax = oracle(a, b, sfb, sfv)
    npref.assert_c_close(np.asarray(result.c), c_dtype, c, abssum)
    _amax_close(result.amax, amax, abssum)


def _squeeze(x, batched):
    return x if batched else x[0]


@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
@pytest.mark.parametrize("b_format", sorted(B_FORMATS))
@pytest.mark.parametrize("m,n,k", [(1, 128, 256), (7, 200, 512), (128, 32, 64), (300, 136, 288)])
def test_cpu_kernel_matches_the_oracle(rng, b_format, a_dtype, m, n, k):
    """M = 1, partial tiles in M (7, 300) and N (200, 136: not multiples of the 16/128 tiles), K with
    a partial 4-group scale block (288 = 9 groups of 32)."""
    if B_FORMATS[b_format][0] == "fp4" and k % 32:
        pytest.skip("fp4 rows are 16-byte aligned from K = 32 on")
    a, b, sfb, sfv = _problem(rng, b_format, a_dtype, m, n, k)
    result = jga.gemm_amax(a[0], b[0], None, sfb[0], sf_vec_size=sfv)
    assert result.c.shape == (m, n) and result.c.dtype == jnp.float32
    _check(result, a, b, sfb, sfv)


@pytest.mark.parametrize("impl", ["reference", "xla_path"])
@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
@pytest.mark.parametrize("b_format", sorted(B_FORMATS))
def test_reference_and_xla_path_match_the_oracle(rng, impl, b_format, a_dtype):
    """reference_gemm_amax, and weight_only_sum, what the CUDA platform runs through XLA."""
    a, b, sfb, sfv = _problem(rng, b_format, a_dtype, 7, 200, 256, batch=2)
    if impl == "reference":
        result = jga.reference_gemm_amax(a, b, None, sfb, sf_vec_size=sfv)
    else:
        acc = jax.jit(weight_only_sum, static_argnums=3)(a, b, sfb, sfv)
        result = jga.GemmAmaxResult(acc, jnp.max(jnp.abs(acc)))
    _check(result, a, b, sfb, sfv)


C_CASES = [
    ("e4m3", "float32"),
    ("e4m3", "bfloat16"),
    ("e4m3", "float16"),
    ("e4m3", "float8_e4m3fn"),
    ("e5m2", "float8_e5m2"),
    ("nvfp4", "float4_e2m1fn"),
    ("mxfp4", "uint8"),
    ("nvfp4", "bfloat16"),
]


@pytest.mark.parametrize("b_format,c_dtype", C_CASES)
def test_every_c_dtype(rng, b_format, c_dtype):
    a, b, sfb, sfv = _problem(rng, b_format, "bfloat16", 64, 128, 256)
    if c_dtype in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "uint8"):
        a = (a.astype(np.float32) / 16).astype(ml_dtypes.bfloat16)  # most of C in range, some saturating
    for fn in (jga.gemm_amax, jga.reference_gemm_amax):
        result = fn(a[0], b[0], None, sfb[0], sf_vec_size=sfv, c_dtype=c_dtype)
        assert result.c.shape == ((64, 64) if c_dtype == "uint8" else (64, 128))
        _check(jga.GemmAmaxResult(np.asarray(result.c)[None], result.amax), a, b, sfb, sfv, c_dtype)


def test_unpacked_float4_b(rng):
    a, b, sfb, sfv = _problem(rng, "mxfp4", "bfloat16", 16, 64, 128)
    b4 = npref.decode_values(b).astype(ml_dtypes.float4_e2m1fn)
    _check(jga.gemm_amax(a[0], b4[0], None, sfb[0], sf_vec_size=sfv), a, b, sfb, sfv)


def test_batched_jit_and_vmap(rng):
    a, b, sfb, sfv = _problem(rng, "e4m3", "bfloat16", 7, 128, 256, batch=3)
    batched = jax.jit(lambda a, b, s: jga.gemm_amax(a, b, None, s))(a, b, sfb)
    _check(batched, a, b, sfb, sfv)
    mapped = jax.vmap(lambda a, b, s: jga.gemm_amax(a, b, None, s))(a, b, sfb)
    assert mapped.c.shape == (3, 7, 128) and mapped.amax.shape == (3,)
    for i in range(3):
        _check(jga.GemmAmaxResult(mapped.c[i : i + 1], mapped.amax[i]), a[i : i + 1], b[i : i + 1], sfb[i : i + 1], sfv)
    # one weight shared by a vmapped batch of activations
    shared = jax.vmap(lambda a: jga.gemm_amax(a, b[0], None, sfb[0]))(a)
    for i in range(3):
        _check(jga.GemmAmaxResult(shared.c[i : i + 1], shared.amax[i]), a[i : i + 1], b[:1], sfb[:1], sfv)


@pytest.mark.parametrize("m,a_dtype", [(8, "bfloat16"), (100, "bfloat16"), (100, "float16")])
def test_amax_is_per_call(rng, m, a_dtype):
    """amax is reset by every call: a small call after a large one reports its own. At 100 rows
    the GPU runs the Hopper GEMM (bfloat16) or two few-row launches (float16): the largest |C| in
    the first one's rows must survive the second."""
    a, b, sfb, sfv = _problem(rng, "e4m3", a_dtype, m, 64, 128)
    a[0, :3] *= 4
    f = jax.jit(lambda a: jga.gemm_amax(a, b[0], None, sfb[0]))
    big = f(a[0] * a.dtype.type(64))
    small = f(a[0])
    _check(small, a, b, sfb, sfv)
    assert float(big.amax) > 32 * float(small.amax)


@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
def test_nan_in_a_or_b_or_a_scale(rng, a_dtype):
    a, b, sfb, sfv = _problem(rng, "e4m3", a_dtype, 8, 128, 256)
    a[0, 3, 17] = np.nan  # row 3 of C
    b[0, 5, 200] = np.nan  # column 5 of C
    codes = sfb.view(np.uint8).copy()
    codes[(0,) + npref.scale_index(9, 2)] = 0xFF  # column 9 of C: a NaN e8m0 scale
    sfb = codes.view(E8M0)
    for fn in (jga.gemm_amax, jga.reference_gemm_amax):
        result = fn(a[0], b[0], None, sfb[0])
        nan = np.isnan(np.asarray(result.c))
        want = np.zeros_like(nan)
        want[3, :] = want[:, 5] = want[:, 9] = True
        np.testing.assert_array_equal(nan, want)
        assert np.isnan(float(result.amax))
    acc = weight_only_sum(a, b, sfb, sfv)
    np.testing.assert_array_equal(np.isnan(np.asarray(acc[0])), want)


@pytest.mark.parametrize("impl,m", [("kernel", 4), ("kernel", 72), ("reference", 4), ("xla_path", 4)])
@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
def test_extreme_scales(rng, impl, m, a_dtype):
    """e8m0 2^127 on tiny a and 2^-127 on large a: C is an ordinary number (and subnormal where
    2^-127 meets ordinary a), as in the block-scaled op: the scale multiplies the group's dot.
    72 rows: on sm_90 a bfloat16 a takes the Hopper GEMM, whose exact path reads a's values."""
    n, k, sfv = 64, 128, 32
    big_a = 2.0**12 if a_dtype == "float16" else 2.0**100
    tiny_a = 2.0**-14 if a_dtype == "float16" else 2.0**-100
    kinds = np.arange(m) % 4  # rows of tiny, big, ordinary, ordinary a
    rows = np.array([tiny_a, big_a, 1.0, 1.0])[kinds][:, None] * rng.choice([-1.0, 1.0], size=(m, k))
    a = rows[None].astype(A_DTYPES[a_dtype])
    b = npref.random_operand(rng, 1, n, k, "e4m3")
    codes = rng.integers(125, 130, size=(1, n, k // sfv)).astype(np.uint8)
    codes[0, : n // 2] = 254  # 2^127
    codes[0, n // 2 :] = 0  # 2^-127
    sfb = npref.physical_scales(codes, E8M0)
    if impl == "kernel":
        result = jga.gemm_amax(a[0], b[0], None, sfb[0])
        c = np.asarray(result.c)[None]
    elif impl == "reference":
        c = np.asarray(jga.reference_gemm_amax(a[0], b[0], None, sfb[0]).c)[None]
    else:
        c = np.asarray(weight_only_sum(a, b, sfb, sfv))
    want, abssum, _ = oracle(a, b, sfb, sfv)
    # Checked: tiny a (row 0) everywhere, big a (row 1) and ordinary a (rows 2, 3: subnormal C,
    # within an fp32 subnormal step per group) times 2^-127. Ordinary a times 2^127 overflows.
    finite = np.zeros(want.shape, bool)
    finite[0, kinds == 0, :] = True
    finite[0, kinds != 0, n // 2 :] = True
    with np.errstate(invalid="ignore"):
        err = np.abs(c - want)
    tol = 2e-5 * abssum + 2.0**-149 * (k // sfv) * 2
    assert np.all(err[finite] <= tol[finite]), np.max((err - tol)[finite])
    normal = 2.0**-120  # the checked extremes are normal numbers, not flushed or subnormal
    assert np.all(np.abs(want[0, 0, : n // 2]) > normal) and np.all(np.abs(want[0, 1, n // 2 :]) > normal)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_subnormal_bfloat16_activations_and_results(rng, impl):
    """bfloat16 a down to 2^-133 (fp32 subnormals, which XLA's CPU flushes inside a dot) against
    e8m0 2^100: C is an ordinary number. A subnormal C rounds once: 5 * 2^-133 times 2^-16 (e5m2)
    times 2^-3 is 0.625 * 2^-149, so 2^-149 (rounded in two steps, by 2^-1 then 2^-2, it was 0)."""
    fn = jga.gemm_amax if impl == "kernel" else jga.reference_gemm_amax
    m, n, k = 4, 32, 64
    magnitude = rng.uniform(1, 2, (1, m, k)) * np.exp2(rng.integers(-133, -118, (1, m, k)))
    a = (magnitude * rng.choice([-1.0, 1.0], (1, m, k))).astype(ml_dtypes.bfloat16)
    assert (np.abs(a.astype(np.float64)) < 2.0**-126).mean() > 0.3
    b = npref.random_operand(rng, 1, n, k, "e4m3")
    sfb = npref.physical_scales(np.full((1, n, k // 32), 227, np.uint8), E8M0)
    result = fn(a[0], b[0], None, sfb[0])
    want, abssum, amax = oracle(a, b, sfb, 32)
    assert np.all(np.abs(want) > 2.0**-100)  # ordinary numbers
    np.testing.assert_allclose(np.asarray(result.c)[None], want, rtol=0, atol=2e-5 * np.max(abssum))
    _amax_close(result.amax, amax, abssum)

    a = np.zeros((32, 32), ml_dtypes.bfloat16)
    a[0, 0] = 5 * 2.0**-133
    b = np.zeros((32, 32), np.uint8)
    b[:, 0] = 0x01  # e5m2 2^-16
    sfb = npref.physical_scales(np.full((1, 32, 1), 124, np.uint8), E8M0)[0]
    c = np.asarray(fn(a, b.view(ml_dtypes.float8_e5m2), None, sfb).c)
    assert c[0, 0] == np.float32(5 * 2.0**-152) == np.float32(2.0**-149)


def test_group_terms_round_before_they_add(rng):
    """bf16 a whose second group repeats the first, against NVFP4 b whose second group negates the
    first, both at the e4m3 scale 1.125: the CPU kernel rounds each group's term, so the two cancel
    exactly and C and amax are 0 (a fused multiply-add of the second term leaves the first's
    rounding error). The GPU kernels fold NVFP4 scales into the values and sum all of K at once."""
    m, n = 8, 32
    group = rng.standard_normal((m, 16)) * np.exp2(rng.integers(-8, 8, (m, 16)))
    a = np.concatenate([group, group], axis=1).astype(ml_dtypes.bfloat16)
    values = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], (n, 16))
    b = np.concatenate([values, -values], axis=1).astype(ml_dtypes.float4_e2m1fn)
    sfb = jga.physical_from_plain(np.full((n, 2), 1.125, np.float32).astype(ml_dtypes.float8_e4m3fn))
    for fn in (jga.gemm_amax, jga.reference_gemm_amax):
        with jax.default_device(CPU):
            c, amax = fn(a, b, None, sfb, sf_vec_size=16)
        assert not np.asarray(c).any() and float(amax) == 0.0, fn.__name__


def test_reference_is_not_differentiable(rng):
    """As gemm_amax: an error, not the zero derivative of its bit-level decoding."""
    a, b, sfb, sfv = _problem(rng, "e4m3", "bfloat16", 4, 32, 64)
    for fn, name in ((jga.gemm_amax, "gemm_amax"), (jga.reference_gemm_amax, "reference_gemm_amax")):
        with pytest.raises(NotImplementedError, match=f"^{name} is not differentiable .*mx_matmul and MXLinear"):
            jax.grad(lambda x, fn=fn: fn(x, b[0], None, sfb[0]).c.astype(jnp.float32).sum())(a[0])
    with pytest.raises(NotImplementedError, match="^quantize is not differentiable"):
        jax.grad(lambda x: jga.quantize(x)[0].astype(jnp.float32).sum())(a[0].astype(jnp.float32))


# --- errors: trace time (Python) and the FFI handler's own rules (C++) ---


def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _args(m=16, n=128, k=256, a=jnp.bfloat16, b=jnp.float8_e4m3fn, sf=E8M0, sfv=32, sfa=False):
    kb = k // 2 if b == jnp.uint8 else k
    return (
        spec((m, k), a),
        spec((n, kb), b),
        spec(jga.scale_shape(m, k, sfv), sf) if sfa else None,
        spec(jga.scale_shape(n, k, sfv), sf),
    )


def _trace(args, **kw):
    return jax.eval_shape(lambda a, b, sfa, sfb: jga.gemm_amax(a, b, sfa, sfb, **kw), *args)


@pytest.mark.parametrize(
    "args,kw,exc,match",
    [
        (_args(sfa=True), {}, TypeError, r"sfa: must be None for bfloat16 a \(weight-only"),
        (_args(a=jnp.float8_e4m3fn), {}, TypeError, r"sfa: float8_e4m3fn a needs its scales; only bfloat16/float16 a"),
        (_args(a=jnp.float32), {}, TypeError, r"a: dtype must be one of .*bfloat16, float16, got float32"),
        (_args(b=jnp.bfloat16), {}, TypeError, r"b: dtype must be one of float8_e4m3fn, .*, got bfloat16"),
        (_args()[:3] + (None,), {}, TypeError, r"sfb: b's scales are required, got None"),
        (
            _args()[:3] + (spec(jga.scale_shape(128, 256, 32), jnp.float32),),
            {},
            TypeError,
            r"sfb: dtype must be one of",
        ),
        ((spec((16, 128), jnp.bfloat16),) + _args()[1:], {}, ValueError, r"b: K must match a's"),
        ((spec((16, 128), jnp.bfloat16),) + _args(b=jnp.uint8)[1:], {}, ValueError, r"b: K must match a's"),
        ((spec((2, 16, 256), jnp.bfloat16),) + _args()[1:], {}, ValueError, r"b: must have a's rank 3"),
        (_args()[:3] + (spec((2, 2, 32, 4, 4), E8M0),), {}, ValueError, r"sfb: expected the physical 128x4 layout"),
        (
            _args(sfv=16),
            {"sf_vec_size": 16},
            ValueError,
            r"sf_vec_size: fp8 a/b \(float8_e4m3fn\) require sf_vec_size=32",
        ),
        (_args(), {"c_dtype": jnp.uint8}, ValueError, r"c_dtype: fp4 c \(uint8\) requires fp4 a/b"),
        (_args(b=jnp.uint8, sf=E4M3, sfv=32), {}, ValueError, r"float8_e4m3fn scales require sf_vec_size=16"),
        (_args(n=130), {}, ValueError, r"c_dtype: rows of c must be 16-byte aligned: N=130"),
        (_args(), {"c_major": "m"}, NotImplementedError, r"c_major: 'm' is not built for weight-only"),
    ],
)
def test_bad_input_raises_at_trace_time(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        _trace(args, **kw)


def test_primitive_rejects_sfa_beside_a_bfloat16_a():
    a, b, _, sfb = (jnp.zeros(s.shape, s.dtype) if s is not None else None for s in _args())
    sfa = jnp.zeros(jga.scale_shape(16, 256, 32), E8M0)
    params = dict(c_dtype=np.dtype(np.float32), sf_vec_size=32, tile_m=128, tile_n=128, cluster_m=1, cluster_n=1)
    with pytest.raises(TypeError, match=r"sfa: must be None for bfloat16 a"):
        jax.eval_shape(lambda *x: jga.gemm_amax_p.bind(*x, **params), a[None], b[None], sfa[None], sfb[None])
    with pytest.raises(TypeError, match=r"sfa: float8_e4m3fn a needs its scales"):
        jax.eval_shape(lambda *x: jga.gemm_amax_p.bind(*x, **params), b[None], b[None], sfb[None])


@pytest.mark.parametrize(
    "a_dtype,b_dtype,k_a,message",
    [
        (jnp.float32, jnp.float8_e4m3fn, 256, "weight-only a dtype must be bfloat16 or float16"),
        (jnp.bfloat16, jnp.bfloat16, 256, "b dtype must be float8_e4m3fn"),
        (jnp.bfloat16, jnp.float8_e4m3fn, 128, r"does not match a"),
        (jnp.bfloat16, jnp.uint8, 128, r"does not match a"),  # packed b: a's K is twice b's bytes
    ],
)
def test_ffi_handler_rejects_a_call_that_breaks_the_contract(a_dtype, b_dtype, k_a, message):
    """The C++ rules (ffi/common) answer a weight-only custom call that bypasses the Python checks."""
    m = n = 128
    kb = 128 if b_dtype == jnp.uint8 else 256
    a = jax.device_put(jnp.ones((1, m, k_a), a_dtype), CPU)
    b = jax.device_put(jnp.ones((1, n, kb), b_dtype), CPU)
    sf = jax.device_put(jnp.ones((1, 1, 2, 32, 4, 4), E8M0), CPU)
    call = jax.ffi.ffi_call(
        _ffi.CPU_WEIGHT_ONLY_TARGET,
        (jax.ShapeDtypeStruct((1, m, n), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32)),
    )
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(
            call(
                a,
                b,
                sf,
                sf_vec_size=np.int32(32),
                tile_m=np.int32(128),
                tile_n=np.int32(128),
                cluster_m=np.int32(1),
                cluster_n=np.int32(1),
            )
        )


# --- sharding (8 virtual CPU devices, conftest) ---


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
@pytest.mark.parametrize("b_format", ["e4m3", "nvfp4"])
@pytest.mark.parametrize(
    "a_spec,b_spec",
    [
        ((None, "x", None), (None, "y", None)),  # M and N
        (("x", None, None), ("x", None, None)),  # L
        ((None, None, "x"), (None, None, "x")),  # K: fp32 partial sums, amax after the sum
        ((None, "y", "x"), (None, None, "x")),  # M and K
    ],
)
def test_sharded_matches_unsharded(rng, b_format, a_spec, b_spec):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    a, b, sfb, sfv = _problem(rng, b_format, "bfloat16", 256, 256, 2048, batch=4)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, P(*s)))
    args = (put(a, a_spec), put(b, b_spec), put(sfb, b_spec + (None,) * 3))
    f = jax.jit(lambda a, b, s: jga.gemm_amax(a, b, None, s, sf_vec_size=sfv, c_dtype=jnp.bfloat16))
    result = f(*args)
    hlo = f.lower(*args).compile().as_text()
    assert _ffi.CPU_WEIGHT_ONLY_TARGET in hlo
    _check(result, a, b, sfb, sfv, c_dtype="bfloat16")
    with jax.default_device(CPU):
        ref = jga.gemm_amax(a, b, None, sfb, sf_vec_size=sfv, c_dtype=jnp.bfloat16)
    np.testing.assert_allclose(
        np.asarray(result.c, np.float32), np.asarray(ref.c, np.float32), rtol=2.0**-7, atol=1e-4 * float(ref.amax)
    )


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
@pytest.mark.parametrize("a_spec", [(None, None, None), (None, "x", None)])
def test_sharded_rows_of_whole_scale_blocks_on_every_device(rng, a_spec):
    """M of 8 scale blocks on the 8 devices: A's rows are a compound factor of the rule, whose
    block count no sfa names (a weight-only call has none)."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    a, b, sfb, sfv = _problem(rng, "e4m3", "bfloat16", 1024, 128, 256)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, P(*s)))
    args = (put(a, a_spec), put(b, (None,) * 3), put(sfb, (None,) * 6))
    result = jax.jit(lambda a, b, s: jga.gemm_amax(a, b, None, s, sf_vec_size=sfv, c_dtype=jnp.float32))(*args)
    _check(result, a, b, sfb, sfv, c_dtype="float32")


# --- the CUDA platform: the few-row kernel where it takes the problem, else XLA's dot ---


@pytest.mark.parametrize(
    "b_format,m,kernel",
    [("e4m3", 1, True), ("e5m2", 65, True), ("e4m3", 128, True), ("e4m3", 129, False), ("nvfp4", 129, False)],
)
def test_cuda_lowering_picks_the_few_row_kernel_or_a_dot(rng, b_format, m, kernel):
    """Lowered without a GPU (or for one but sm_90): the few-row kernel up to 128 rows, XLA's dot
    beyond; for an sm_90 GPU a bfloat16 a of more than 64 rows takes the Hopper GEMM."""
    if not _ffi.BUILT_WITH_CUDA:
        pytest.skip("built without the CUDA backend")
    kernel = kernel or (on_sm90() and m > 64)
    a, b, sfb, sfv = _problem(rng, b_format, "bfloat16", m, 128, 256)
    f = jax.jit(lambda *x: jga.gemm_amax(*x, sf_vec_size=sfv, c_dtype=jnp.bfloat16))
    try:
        text = f.trace(a[0], b[0], None, sfb[0]).lower(lowering_platforms=("cuda",)).as_text()
    except Exception as e:  # pragma: no cover - a jax without the CUDA lowering rules
        pytest.skip(f"cannot lower for cuda here: {e}")
    assert (f"custom_call @{_ffi.CUDA_WEIGHT_ONLY_TARGET}" in text) == kernel
    assert ("dot_general" in text) == (not kernel)
    assert f"custom_call @{_ffi.CUDA_TARGET}(" not in text


def test_weight_only_kernel_workspace_answers_per_problem():
    if not _ffi.BUILT_WITH_CUDA:
        pytest.skip("built without the CUDA backend")
    ws = _ffi.weight_only_kernel_workspace
    assert ws(1, 16, 8192, 8192, "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", 32) > 0  # split-K partials
    assert ws(1, 16, 8192, 8192, "float16", "uint8", "float8_e4m3fn", 16) > 0
    # up to 128 rows: one launch per 64, the workspace of a 64-row launch
    wide = ws(1, 128, 8192, 8192, "float16", "float8_e4m3fn", "float8_e8m0fnu", 32)
    assert wide == ws(1, 64, 8192, 8192, "float16", "float8_e4m3fn", "float8_e8m0fnu", 32) > 0
    assert ws(1, 129, 8192, 8192, "float16", "float8_e4m3fn", "float8_e8m0fnu", 32) == -1
    assert ws(1, 100, 8192, 8192, "bfloat16", "uint8", "float8_e8m0fnu", 32) > 0
    assert ws(1, 8, 256, 256, "bfloat16", "uint8", "float8_e8m0fnu", 16) == -1  # FP4 e8m0 per 16: no kernel
    # a bfloat16 a of more than 64 rows: on an sm_90 GPU the Hopper GEMM, with at least A's BF16
    # copy (2 bytes per element) in its workspace; lowered without one, the few-row kernel (<= 128)
    gemm = ws(1, 129, 8192, 8192, "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", 32)
    sfv16 = ws(1, 65, 8192, 8192, "bfloat16", "uint8", "float8_e8m0fnu", 16)
    if on_sm90():
        assert gemm >= 2 * 136 * 8192 and sfv16 >= 2 * 72 * 8192
    else:
        assert gemm == -1 and sfv16 == -1
    kernel = _ffi.weight_only_kernel
    assert kernel(1, 16, 8192, 8192, "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", 32) == (
        ws(1, 16, 8192, 8192, "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", 32),
        "skinny",
    )
    big = kernel(1, 129, 8192, 8192, "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", 32)
    assert big == (gemm, "sm90" if on_sm90() else "xla")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        ws(1, 8, 256, 256, "float32", "float8_e4m3fn", "float8_e8m0fnu", 32)


# sm_90: bfloat16 a from 65 rows on the Hopper GEMM; float16 a at 100 and 128 rows two few-row
# launches (64 + 36, 64 + 64), at 300 XLA's dot
GPU_CASES = [(b, a, m) for b in sorted(B_FORMATS) for a in sorted(A_DTYPES) for m in (1, 7, 16, 33, 64, 100, 128, 300)]


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("b_format,a_dtype,m", GPU_CASES)
def test_gpu_matches_cpu_and_the_oracle(rng, b_format, a_dtype, m):
    a, b, sfb, sfv = _problem(rng, b_format, a_dtype, m, 200, 512, batch=2)
    f = lambda *x: jga.gemm_amax(*x, sf_vec_size=sfv)
    gpu = jax.jit(f)(a, b, None, sfb)
    with jax.default_device(CPU):
        cpu = jax.jit(f)(a, b, None, sfb)
    _check(gpu, a, b, sfb, sfv)
    c_gpu, c_cpu = np.asarray(gpu.c), np.asarray(cpu.c)
    _, abssum, _ = oracle(a, b, sfb, sfv)
    assert np.all(np.abs(c_gpu - c_cpu) <= 4e-5 * abssum + 1e-30), np.max(np.abs(c_gpu - c_cpu))


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
@pytest.mark.parametrize("b_format", ["e4m3", "mxfp4", "nvfp4"])
def test_gpu_few_row_kernel_split_k_batches_and_k_tail(rng, b_format, a_dtype):
    # K = 8192 over few tiles: split-K 16 ways; K = 96 / 160: a stage of a chunk or two and a
    # partial scale block.
    for m, n, k, batch in [(16, 256, 8192, 1), (5, 136, 96 if b_format == "e4m3" else 160, 3)]:
        a, b, sfb, sfv = _problem(rng, b_format, a_dtype, m, n, k, batch=batch)
        f = jax.jit(lambda *x, sfv=sfv: jga.gemm_amax(*x, sf_vec_size=sfv))
        _check(f(a, b, None, sfb), a, b, sfb, sfv)


@pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("b_format", sorted(B_FORMATS))
def test_gpu_hopper_gemm_plans_k_tails_and_batches(rng, b_format):
    """A bfloat16 a of more than 64 rows on the Hopper GEMM, through A's BF16 copy: few tiles over
    K = 8192 (split-K), rows not a multiple of 8 with a K tail inside a 64-K unit and 3 batch
    items, and 2100 rows (where B may be converted in a pass too)."""
    k_tail = 96 if b_format in ("e4m3", "e5m2") else 160
    for m, n, k, batch in [(100, 256, 8192, 1), (73, 136, k_tail, 3), (2100, 384, 512, 1)]:
        a, b, sfb, sfv = _problem(rng, b_format, "bfloat16", m, n, k, batch=batch)
        nbytes, kernel = _ffi.weight_only_kernel(batch, m, n, k, "bfloat16", b.dtype, sfb.dtype, sfv)
        assert kernel == "sm90" and nbytes >= 2 * m * k
        f = jax.jit(lambda *x, sfv=sfv: jga.gemm_amax(*x, sf_vec_size=sfv, c_dtype=jnp.bfloat16))
        _check(f(a, b, None, sfb), a, b, sfb, sfv, "bfloat16")


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("b_format", ["e4m3", "e5m2", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_gpu_folded_and_group_path_stages(rng, b_format, m):
    """bf16 a: stages whose scale bytes all lie in 2^-64..2^1 (bounds included) fold the scales
    into B; a stage holding one byte outside (2^-65, 2^2, 0, NaN) takes the group path. With
    K = 4096 one row's stages alternate, and rows past N (zero-padded scales) must not matter."""
    n, k = 200, 4096
    a, b, _, sfv = _problem(rng, b_format, "bfloat16", m, n, k, batch=2)
    groups = k // sfv
    codes = rng.integers(63, 129, size=(2, n, groups)).astype(np.uint8)
    codes[:, :, ::7] = 63
    codes[:, :, 3::7] = 128
    per_stage = 4 if b_format != "mxfp4" else 8  # 32-groups in a 128-byte stage of B
    for i, byte in enumerate((62, 129, 0, 0xFF)):  # one in stage 1, 3, 5, 7 of a row each
        codes[i % 2, 17 + 50 * i, (2 * i + 1) * per_stage + 1] = byte
    sfb = npref.physical_scales(codes, E8M0)
    f = jax.jit(lambda *x: jga.gemm_amax(*x))
    gpu = f(a, b, None, sfb)
    with jax.default_device(CPU):
        cpu = f(a, b, None, sfb)
    c_gpu, c_cpu = np.asarray(gpu.c), np.asarray(cpu.c)
    want, abssum, _ = oracle(a, b, sfb, sfv)
    finite = np.isfinite(want)
    npref.assert_c_close(c_gpu, "float32", want, abssum, where=finite)
    np.testing.assert_array_equal(np.isnan(c_gpu), ~finite)
    assert (~finite[1, :, 17 + 150]).all() and np.isnan(float(gpu.amax))
    assert np.all(np.abs(c_gpu[finite] - c_cpu[finite]) <= 4e-5 * abssum[finite] + 1e-30)


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("a_dtype", sorted(A_DTYPES))
@pytest.mark.parametrize("b_format,codes", [("e4m3", (0x7F, 0xFF)), ("e5m2", (0x7C, 0xFC, 0x7E))])
@pytest.mark.parametrize("m", [7, 72])
def test_gpu_kernels_keep_nan_and_inf_codes_of_b(rng, b_format, a_dtype, codes, m):
    a, b, sfb, sfv = _problem(rng, b_format, a_dtype, m, 144, 96)
    raw = b.view(np.uint8).copy()
    for i, code in enumerate(codes):
        raw[0, 10 + i, 3 + 5 * i] = code
    b = raw.view(b.dtype)
    f = jax.jit(lambda *x: jga.gemm_amax(*x, sf_vec_size=sfv))
    gpu = f(a[0], b[0], None, sfb[0])
    with jax.default_device(CPU):
        cpu = f(a[0], b[0], None, sfb[0])
    c_gpu, c_cpu = np.asarray(gpu.c), np.asarray(cpu.c)
    np.testing.assert_array_equal(np.isnan(c_gpu), np.isnan(c_cpu))
    np.testing.assert_array_equal(np.isinf(c_gpu), np.isinf(c_cpu))
    assert np.isnan(c_cpu).any() and np.isnan(float(gpu.amax)) and np.isnan(float(cpu.amax))
    finite = np.isfinite(c_cpu)
    _, abssum, _ = oracle(a, b, sfb, sfv)
    assert np.all(np.abs(c_gpu[finite] - c_cpu[finite]) <= 4e-5 * abssum[0][finite] + 1e-30)


@pytest.mark.skipif(not on_gpu(), reason="needs a GPU")
@pytest.mark.parametrize("c_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("m", [7, 72])
def test_gpu_c_dtypes_nan_and_extreme_scales(rng, c_dtype, m):
    a, b, sfb, sfv = _problem(rng, "mxfp4", "bfloat16", m, 128, 256)
    a[0, 2, 5] = np.nan
    codes = sfb.view(np.uint8).copy()
    codes[(0,) + npref.scale_index(3, 1)] = 254  # 2^127 on column 3: the exact per-group path
    codes[(0,) + npref.scale_index(4, 2)] = 0  # 2^-127 on column 4
    sfb = codes.view(E8M0)
    a[0, 0] = (a[0, 0].astype(np.float32) * 2.0**-110).astype(ml_dtypes.bfloat16)
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype))
    gpu = f(a[0], b[0], None, sfb[0])
    with jax.default_device(CPU):
        cpu = f(a[0], b[0], None, sfb[0])
    assert np.isnan(float(gpu.amax)) and np.isnan(float(cpu.amax))
    c_gpu, c_cpu = (np.asarray(x.c).astype(np.float32) for x in (gpu, cpu))
    np.testing.assert_array_equal(np.isnan(c_gpu), np.isnan(c_cpu))
    tol = {"bfloat16": 2.0**-7, "float8_e4m3fn": 2.0**-3}[c_dtype]  # one ulp of C
    _, abssum, _ = oracle(a, b, sfb, 32)
    with np.errstate(invalid="ignore"):  # Inf where ordinary a meets 2^127: equal on both
        ok = (c_gpu == c_cpu) | np.isnan(c_cpu) | (np.abs(c_gpu - c_cpu) <= tol * np.abs(c_cpu) + 4e-5 * abssum[0])
    assert ok.all(), (np.argwhere(~ok)[:4], c_gpu[~ok][:4], c_cpu[~ok][:4])
    # row 0 (a * 2^-110) times 2^127 on column 3 is an ordinary number on both
    assert np.isfinite(c_gpu[0, 3]) and abs(float(c_gpu[0, 3])) > 0


# --- nn: mx_matmul(..., activations="bf16") and MXLinear(weight_only=True) ---


def _weight_only_oracle(x, w, fmt):
    """float64 bf16(x) @ dequantize(quantize(wᵀ)), decoded with npref."""
    nnmod = pytest.importorskip("jax_gemm_amax.nn")
    prepared = nnmod.prepare_weight(w, fmt)
    f = jga.FORMATS[fmt]
    q, s = np.asarray(prepared.q)[None], np.asarray(prepared.scales)[None]
    k = x.shape[1]
    kp = npref.decode_values(q).shape[-1]
    wv = npref.decode_values(q) * npref.scales_per_element(s, q.shape[1], kp, f.sf_vec_size)
    xv = np.zeros((x.shape[0], kp))
    xv[:, :k] = np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).astype(np.float64)
    y = xv @ wv[0].T
    return y[:, : w.shape[1]], (np.abs(xv) @ np.abs(wv[0]).T)[:, : w.shape[1]]


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_mx_matmul_bf16_activations(rng, fmt):
    nnmod = pytest.importorskip("jax_gemm_amax.nn")
    x = rng.standard_normal((5, 100)).astype(np.float32)
    w = rng.standard_normal((100, 70)).astype(np.float32)
    y, amax = jax.jit(lambda x, w: nnmod.mx_matmul(x, w, fmt=fmt, activations="bf16"))(x, w)
    want, abssum = _weight_only_oracle(x, w, fmt)
    assert y.dtype == jnp.float32 and y.shape == (5, 70)
    npref.assert_c_close(np.asarray(y)[None], "float32", want[None], abssum[None])
    _amax_close(amax, np.max(np.abs(want)), abssum)
    prepared = nnmod.prepare_weight(w, fmt)
    y2, amax2 = jax.jit(lambda x, p: nnmod.mx_matmul(x, p, activations="bf16"))(x, prepared)
    np.testing.assert_array_equal(np.asarray(y2), np.asarray(y))
    assert float(amax2) == float(amax)
    # the activations really stay in 16 bits: far closer to bf16(x) @ w than the quantized mode
    exact = np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64) @ w
    y_q, _ = nnmod.mx_matmul(x, w, fmt=fmt)
    assert np.linalg.norm(np.asarray(y) - exact) < 0.8 * np.linalg.norm(np.asarray(y_q) - exact)


def test_mx_matmul_bf16_gradients_are_the_straight_through_estimator(rng):
    nnmod = pytest.importorskip("jax_gemm_amax.nn")
    x = jnp.asarray(rng.standard_normal((8, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    loss = lambda mode: lambda x, w: jnp.sum(nnmod.mx_matmul(x, w, activations=mode)[0] ** 2)
    dx, dw = jax.grad(loss("bf16"), argnums=(0, 1))(x, w)
    y = nnmod.mx_matmul(x, w, activations="bf16")[0]
    # the same backward GEMMs as the quantized mode, fed this mode's dY = 2 y
    dx_want, dw_want = nnmod._mx_matmul_bwd(
        nnmod._Config("mxfp8_e4m3", "mxfp8_e4m3", np.dtype(np.float32)), (x, w), (2 * y, None)
    )
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(dx_want))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(dw_want))
    prepared = nnmod.prepare_weight(w)
    with pytest.raises(Exception, match=r"[Dd]ifferentiat|JVP|jvp"):
        jax.grad(lambda x: jnp.sum(nnmod.mx_matmul(x, prepared, activations="bf16")[0]))(x)


def test_mxlinear_weight_only_prepare(rng):
    nnx = pytest.importorskip("flax.nnx")
    nnmod = pytest.importorskip("jax_gemm_amax.nn")
    layer = nnmod.MXLinear(96, 40, weight_only=True, fmt="nvfp4", rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.standard_normal((2, 3, 96)), jnp.bfloat16)
    y_fly = layer(x)
    assert y_fly.dtype == jnp.bfloat16 and y_fly.shape == (2, 3, 40)
    layer.prepare()
    assert isinstance(layer.kernel_q, nnmod.QuantizedKernel)
    y_prep = nnx.jit(lambda m, x: m(x))(layer, x)
    np.testing.assert_array_equal(np.asarray(y_prep, np.float32), np.asarray(y_fly, np.float32))
    want, abssum = _weight_only_oracle(np.asarray(x.reshape(6, 96), np.float32), np.asarray(layer.kernel[...]), "nvfp4")
    want = want + np.asarray(layer.bias[...], np.float64)
    npref.assert_c_close(np.asarray(y_prep.reshape(6, 40), np.float32)[None], "bfloat16", want[None], abssum[None])
    np.testing.assert_allclose(float(layer.output_amax[...]), np.max(np.abs(want)), rtol=1e-5)


def test_weight_only_nn_errors(rng):
    nnx = pytest.importorskip("flax.nnx")
    nnmod = pytest.importorskip("jax_gemm_amax.nn")
    x, w = jnp.ones((4, 64)), jnp.ones((64, 32))
    with pytest.raises(ValueError, match=r"activations must be one of \('quantized', 'bf16'\), got 'fp8'"):
        nnmod.mx_matmul(x, w, activations="fp8")
    prepared = nnmod.prepare_weight(w)
    with pytest.raises(ValueError, match=r"PreparedWeight is for weight-only calls"):
        nnmod.mx_matmul(x, prepared)
    with pytest.raises(ValueError, match=r"expected x \(M, 64\) for the prepared weight, got \(4, 32\)"):
        nnmod.mx_matmul(jnp.ones((4, 32)), prepared, activations="bf16")
    with pytest.raises(ValueError, match=r"prepare_weight: expected w \(K, N\)"):
        nnmod.prepare_weight(jnp.ones((64,)))
    with pytest.raises(ValueError, match=r"only weight_only=True layers"):
        nnmod.MXLinear(8, 8, rngs=nnx.Rngs(0)).prepare()
