"""Scales beyond BF16's reach: the products of the codes are ordinary numbers although the
dequantized values (448 x 2^127, 2^-9 x 2^-127) are not fp32 or BF16 numbers. Block semantics give
the right C; on the GPU the cases run in each sm_90a plan (tile 128 and 256, split-K, pre-converted
operands or not) against the float64 oracle."""

import jax
import ml_dtypes
import npref
import numpy as np
import pytest

import jax_gemm_amax as jga

E8M0 = ml_dtypes.float8_e8m0fnu
ON_GPU = jax.default_backend() == "gpu"


def _unsafe_problem(rng, kind, m, n, k, sfv=32):
    """Random operands with ordinary scales except in two K groups: in one, a few rows of A at
    2^126 and every row of B at 2^-126; in the other, one row of B at 2^127 and every row of A at
    2^-125. Every product is an ordinary number; the dequantized values are not BF16 (nor fp32)
    numbers."""
    p = npref.random_problem(rng, kind, E8M0, sfv, m, n, k)
    sfa, sfb = p.sfa.view(np.uint8), p.sfb.view(np.uint8)
    g1, g2 = rng.choice(k // sfv, size=2, replace=False)
    for col in range(n):
        sfb[(0,) + npref.scale_index(col, g1)] = 1
    for row in rng.choice(m, size=min(3, m), replace=False):
        sfa[(0,) + npref.scale_index(row, g1)] = 253
    for row in range(m):
        sfa[(0,) + npref.scale_index(row, g2)] = 2
    sfb[(0,) + npref.scale_index(int(rng.integers(n)), g2)] = 254
    return p


def _check(p, c_dtype):
    result = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype, sf_vec_size=p.sfv))(
        p.a[0], p.b[0], p.sfa[0], p.sfb[0]
    )
    ref, abssum, amax = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    c = np.asarray(result.c)[None]
    assert np.isfinite(npref.decode_c(c, c_dtype)).all()
    npref.assert_c_close(c, c_dtype, ref, abssum)
    np.testing.assert_allclose(float(result.amax), np.max(amax), rtol=2e-5)


@pytest.mark.parametrize("kind", ["e4m3", "e5m2", "fp4"])
@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16"])
def test_small_problem_with_unsafe_scales(rng, kind, c_dtype):
    _check(_unsafe_problem(rng, kind, 136, 96, 256), c_dtype)


# Shapes whose sm_90a plans differ (tile 128 split-K, tile 256 with passes, ping-pong A'B').
GPU_SHAPES = [(256, 4096, 2048), (1024, 1024, 1024), (2560, 1792, 1024), (4096, 2048, 1024)]


@pytest.mark.skipif(not ON_GPU, reason="the GPU kernel's plans")
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
@pytest.mark.parametrize("preconvert", ["1", "0"])
def test_every_plan_with_unsafe_scales(rng, m, n, k, preconvert, monkeypatch):
    monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", preconvert)
    _check(_unsafe_problem(rng, "e4m3", m, n, k), "bfloat16")


@pytest.mark.skipif(not ON_GPU, reason="the GPU kernel's two paths in one program")
def test_safe_call_after_unsafe_call_takes_the_fast_path_again(rng):
    """An ordinary problem right after one with unsafe scales, in one process, is right too."""
    p = _unsafe_problem(rng, "e4m3", 512, 512, 1024)
    _check(p, "float32")
    q = npref.random_problem(rng, "e4m3", E8M0, 32, 512, 512, 1024)
    _check(q, "float32")
