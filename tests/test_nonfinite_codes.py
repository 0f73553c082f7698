"""NaN and Inf codes inside FP8 operands reach C and amax on every backend.

e4m3 reserves S.1111.111 for NaN, e5m2 S.11111.00 for Inf and S.11111.MM (MM != 0) for NaN. An
exact kernel must treat them as the values they are: a NaN code makes every C element of its row
(of A) or column (of B) NaN; an Inf code gives +-Inf where it meets a nonzero finite value, NaN
where it meets zero or an Inf of the other sign. The float64 oracle decodes the codes with
ml_dtypes; on a GPU machine the CPU backend must agree with the GPU element for element.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest

import jax_gemm_amax as jga

E8M0 = ml_dtypes.float8_e8m0fnu
NAN_CODES = {"e4m3": [0x7F, 0xFF], "e5m2": [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]}
INF_CODES = {"e4m3": [], "e5m2": [0x7C, 0xFC]}
ON_GPU = jax.default_backend() == "gpu"


def _plant(rng, x, codes, count):
    """Writes `count` codes from `codes` at random places of x (L, rows, K) in place."""
    flat = x.view(np.uint8).reshape(-1)
    where = rng.choice(flat.size, size=count, replace=False)
    flat[where] = rng.choice(np.array(codes, np.uint8), size=count)


def _check_nonfinite(result, p, c_dtype):
    ref, abssum, _ = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    got = npref.decode_c(np.asarray(result.c)[None], c_dtype)
    finite = np.isfinite(ref)
    fp8_c = c_dtype in npref.OUT_MAX
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg="NaN pattern of C")
    inf = np.isinf(ref)
    if fp8_c:  # FP8 C saturates: +-Inf is written as the largest finite value
        np.testing.assert_array_equal(got[inf], np.sign(ref[inf]) * npref.OUT_MAX[c_dtype])
    else:
        np.testing.assert_array_equal(got[inf], ref[inf])
    with np.errstate(invalid="ignore"):
        npref.assert_c_close(np.asarray(result.c)[None], c_dtype, ref, np.where(finite, abssum, 0.0), where=finite)
    amax = float(result.amax)
    if np.isnan(ref).any():
        assert np.isnan(amax), amax
    elif inf.any():
        assert amax == np.inf, amax
    else:
        np.testing.assert_allclose(amax, np.abs(ref).max(), rtol=2e-5)


def _problem(rng, kind, m, n, k, nan, inf):
    p = npref.random_problem(rng, kind, E8M0, 32, m, n, k)
    if nan:
        _plant(rng, p.a, NAN_CODES[kind], nan)
        _plant(rng, p.b, NAN_CODES[kind], nan)
    if inf:
        _plant(rng, p.a, INF_CODES[kind], inf)
        _plant(rng, p.b, INF_CODES[kind], inf)
    return p


def _run(p, c_dtype, device=None):
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype), device=device)
    return f(p.a[0], p.b[0], p.sfa[0], p.sfb[0])


CASES = [  # kind, NaN codes per operand, Inf codes per operand
    ("e4m3", 3, 0),
    ("e5m2", 2, 0),
    ("e5m2", 0, 3),
    ("e5m2", 2, 2),
]


@pytest.mark.parametrize("kind,nan,inf", CASES)
@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_codes_reach_c_and_amax(rng, kind, nan, inf, c_dtype):
    p = _problem(rng, kind, 200, 144, 256, nan, inf)  # partial tiles, K of 2 slabs
    _check_nonfinite(_run(p, c_dtype), p, c_dtype)


def test_inf_meets_zero_and_opposite_inf(rng):
    """Inf x 0 is NaN, Inf + (-Inf) is NaN, Inf x finite is +-Inf with the product's sign."""
    p = npref.random_problem(rng, "e5m2", E8M0, 32, 8, 8, 64)
    a, b = p.a.view(np.uint8), p.b.view(np.uint8)
    a[0, 0, :], b[0, 0, :] = 0x3C, 0x3C  # 1.0 everywhere in row 0 of A and row 0 of B
    a[0, 0, 5] = 0x7C  # +Inf in A row 0
    b[0, 1, 5] = 0x00  # meets 0: C[0, 1] NaN
    b[0, 2, :] = 0x3C
    b[0, 2, 5] = 0xBC  # meets -1: C[0, 2] = -Inf
    a[0, 3, :] = 0x3C
    a[0, 3, 7], b[0, 3, 7] = 0x7C, 0x7C  # +Inf x +Inf: C[3, 3] = +Inf
    a[0, 4, :] = 0x3C
    b[0, 4, :] = 0x3C
    a[0, 4, 9], a[0, 4, 10] = 0x7C, 0xFC  # +Inf - Inf in row 4 of A: C[4, n] NaN where B is nonzero there
    result = _run(p, "float32")
    c = np.asarray(result.c)
    assert c[0, 0] == np.inf and np.isnan(c[0, 1]) and c[0, 2] == -np.inf and c[3, 3] == np.inf
    assert np.isnan(c[4, 4])
    assert np.isnan(float(result.amax))
    _check_nonfinite(result, p, "float32")


def test_first_call_with_a_nan_code_has_nan_amax(rng):
    """A fresh program's first call (amax reset inside the kernel) already reports the NaN."""
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 64, 64, 128)
    p.a.view(np.uint8)[0, 17, 33] = 0x7F
    result = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.bfloat16))(p.a[0], p.b[0], p.sfa[0], p.sfb[0])
    assert np.isnan(float(result.amax))
    c = np.asarray(result.c.astype(jnp.float32))
    assert np.isnan(c[17]).all() and not np.isnan(np.delete(c, 17, axis=0)).any()


# Shapes whose sm_90a plans convert the operands in each of its ways (tile 128 and 256, split-K,
# the pre-conversion passes; JAX_GEMM_AMAX_PRECONVERT=0 keeps every conversion in the GEMM).
GPU_SHAPES = [(1024, 1024, 1024), (250, 6000, 8192), (4096, 4096, 1024), (64, 8192, 4096)]


@pytest.mark.skipif(not ON_GPU, reason="the GPU kernel's conversion paths, against the CPU backend")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
@pytest.mark.parametrize("preconvert", ["1", "0"])
def test_gpu_agrees_with_cpu_backend(rng, m, n, k, kind, preconvert, monkeypatch):
    monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", preconvert)
    p = _problem(rng, kind, m, n, k, nan=4, inf=4 if kind == "e5m2" else 0)
    gpu = _run(p, "float32")
    cpu = _run(p, "float32", device=jax.devices("cpu")[0])
    g, c = np.asarray(gpu.c), np.asarray(cpu.c)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
    np.testing.assert_array_equal(np.isinf(g), np.isinf(c))
    fin = np.isfinite(c)
    np.testing.assert_array_equal(g[np.isinf(c)], c[np.isinf(c)])
    scale = np.abs(c[fin]).max()
    np.testing.assert_allclose(g[fin], c[fin], rtol=1e-5, atol=1e-5 * scale)
    assert np.isnan(float(gpu.amax)) and np.isnan(float(cpu.amax))
