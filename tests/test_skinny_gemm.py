"""The few-row kernel (ffi/cuda/skinny): gemm_amax with a block-scaled A of M <= 32 on a GPU
(weight-only calls, up to 128 rows: tests/test_weight_only.py).

The host runs every problem with M <= 32 in MXFP8, MXFP4 (e8m0 per 32) or NVFP4 on it (sm_90 and
sm_100); FP4 with e8m0 scales per 16 and larger M stay on the architecture's GEMM. Checked here on
a GPU against the float64 oracle (tests/npref.py) and the CPU backend: every M tile width, N past
a 128-row tile, K with a partial scale block and split-K, batches, every operand format and C
dtype, extreme scales, NaN/Inf codes, amax across calls, C left over from earlier calls, and two
calls at once. The plan checks are host arithmetic (any machine with the CUDA backend built).
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest
from sm90_plans import lowering_plan
from test_extreme_scales import _assert_matches_oracle, _random_problem, _uniform
from test_nonfinite_codes import _check_nonfinite
from test_nonfinite_codes import _problem as _nonfinite_problem

import jax_gemm_amax as jga
from jax_gemm_amax import _ffi

E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn
ON_GPU = jax.default_backend() == "gpu"
needs_cuda_build = pytest.mark.skipif(not _ffi.BUILT_WITH_CUDA, reason="built without the CUDA backend")
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the few-row kernel runs on a GPU")

# format -> (npref operand kind, scale dtype, sf_vec_size, gemm_amax's value dtype)
FORMATS = {
    "mxfp8_e4m3": ("e4m3", E8M0, 32, ml_dtypes.float8_e4m3fn),
    "mxfp8_e5m2": ("e5m2", E8M0, 32, ml_dtypes.float8_e5m2),
    "mxfp4": ("fp4", E8M0, 32, np.uint8),
    "nvfp4": ("fp4", E4M3, 16, np.uint8),
}
MS = [1, 2, 7, 8, 16, 17, 32]
# (N, K): a partial second tile and 5 groups (a partial scale block, K ends inside a stage);
# 8 tiles and a long K (split-K); N of one partial tile and 259 groups (split-K, partial block).
SHAPES = [(200, 160), (1000, 4096), (136, 8288)]
C_DTYPES = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
FP4_C_DTYPES = ["float4_e2m1fn", "uint8"]


def _kernel(fmt, m, n, k, batch=1, sms=0):
    kind, sf, sfv, value_dtype = FORMATS[fmt]
    plan, _ = lowering_plan((batch, m, n, k, value_dtype, sf, sfv), sms=sms)
    return plan


def _gemm(p, c_dtype, device=None):
    """gemm_amax on the problem's (L, ...) operands (2-D when L = 1), jitted for `device`."""
    args = (p.a, p.b, p.sfa, p.sfb) if p.a.shape[0] > 1 else (p.a[0], p.b[0], p.sfa[0], p.sfb[0])
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype, sf_vec_size=p.sfv), device=device)
    c, amax = f(*args)
    c = np.asarray(c)
    return (c if p.a.shape[0] > 1 else c[None]), float(amax)


def _check_against_oracle(p, c, amax, c_dtype):
    ref, abssum, ref_amax = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    npref.assert_c_close(c, c_dtype, ref, abssum)
    np.testing.assert_allclose(amax, ref_amax.max(), rtol=2e-5, err_msg="amax")


def _random(rng, fmt, m, n, k, batch=1):
    kind, sf, sfv, _ = FORMATS[fmt]
    return npref.random_problem(rng, kind, sf, sfv, m, n, k, batch=batch)


# ---------------------------------------------------------------------------------------------
# The host's choice (host arithmetic on a 132-SM H200).


@needs_cuda_build
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", MS)
def test_host_picks_the_few_row_kernel(fmt, m):
    plan = _kernel(fmt, m, 8192, 8192, sms=132)
    assert plan["kernel"] == "skinny", plan
    # 64 tiles of 128 rows split K to fill 132 SMs; every split at least 4 stages of 128 bytes.
    assert plan["skinny_tokens"] == {1: 8, 2: 8, 7: 8, 8: 8, 16: 16, 17: 32, 32: 32}[m], plan
    assert plan["skinny_splits"] >= 2 and plan["skinny_grid"] <= 2 * 132, plan


@needs_cuda_build
@pytest.mark.parametrize(
    "fmt,m,sfv",
    [("mxfp8_e4m3", 33, 32), ("mxfp4", 64, 32), ("mxfp8_e4m3", 256, 32), ("mxfp4", 8, 16)],
    ids=["M33", "M64", "M256", "mxfp4-per-16"],
)
def test_host_keeps_the_gemm_for_other_problems(fmt, m, sfv):
    kind, sf, _, value_dtype = FORMATS[fmt]
    plan, _ = lowering_plan((1, m, 8192, 8192, value_dtype, sf, sfv), sms=132)
    assert plan["kernel"] == "sm90", plan


@needs_cuda_build
def test_workspace_holds_the_split_partials():
    # The lowering's workspace lets the few-row kernel take the splits an unbounded one would.
    for fmt in FORMATS:
        for m, n, k, batch in [(16, 8192, 8192, 1), (32, 1000, 4096, 3), (1, 128, 28672, 2)]:
            kind, sf, sfv, value_dtype = FORMATS[fmt]
            unbounded = _ffi.sm90_plan(batch, m, n, k, value_dtype, sf, sfv, 1 << 40, sms=132)
            plan = _kernel(fmt, m, n, k, batch=batch, sms=132)
            assert plan["skinny_splits"] == unbounded["skinny_splits"] > 1, (fmt, m, n, k, plan, unbounded)


# ---------------------------------------------------------------------------------------------
# Numbers on the GPU.


@needs_gpu
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"N{n}xK{k}" for n, k in SHAPES])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", MS)
def test_matches_oracle(rng, m, fmt, n, k):
    assert _kernel(fmt, m, n, k)["kernel"] == "skinny"
    p = _random(rng, fmt, m, n, k)
    c, amax = _gemm(p, "float32")
    _check_against_oracle(p, c, amax, "float32")


@needs_gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 16, 32])
def test_agrees_with_the_cpu_backend(rng, m, fmt):
    p = _random(rng, fmt, m, 1000, 4096)
    c, amax = _gemm(p, "float32")
    c_cpu, amax_cpu = _gemm(p, "float32", device=jax.devices("cpu")[0])
    np.testing.assert_allclose(c, c_cpu, rtol=1e-5, atol=1e-5 * np.abs(c_cpu).max())
    np.testing.assert_allclose(amax, amax_cpu, rtol=1e-5)


@needs_gpu
@pytest.mark.parametrize("c_dtype", C_DTYPES + FP4_C_DTYPES)
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [7, 25])
def test_every_c_dtype(rng, m, fmt, c_dtype):
    if c_dtype in FP4_C_DTYPES and FORMATS[fmt][0] != "fp4":
        pytest.skip("FP4 C needs FP4 operands")
    p = _random(rng, fmt, m, 224, 4096)  # N: whole 16-byte rows of FP8 and FP4 C
    c, amax = _gemm(p, c_dtype)
    _check_against_oracle(p, c, amax, c_dtype)


@needs_gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m,n,k", [(5, 200, 160), (30, 1000, 4096)])
def test_batched(rng, m, n, k, fmt):
    p = _random(rng, fmt, m, n, k, batch=2)
    p.a[1] = p.a[1][:, ::-1]  # the items differ (amax per item before the reduction too)
    c, amax = _gemm(p, "bfloat16")
    _check_against_oracle(p, c, amax, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Extreme scales, NaN and Inf codes (the same cases test_extreme_scales.py and
# test_nonfinite_codes.py run, at few rows and without their sm_90a expected failures).


@needs_gpu
@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_huge_times_tiny_scale_is_exact(kind):
    m, n, k = 9, 24, 64  # A = 448 with SFA = 2^127, B = 1 with SFB = 2^-127: C = 448 K
    a, b = _uniform((1, m, k), 448.0, kind), _uniform((1, n, k), 1.0, kind)
    p = npref.RandomProblem(
        a,
        b,
        npref.physical_scales(np.full((1, m, k // 32), 0xFE, np.uint8), E8M0),
        npref.physical_scales(np.full((1, n, k // 32), 0x00, np.uint8), E8M0),
        32,
        k,
    )
    c, amax = _gemm(p, "float32")
    np.testing.assert_array_equal(c, np.full((1, m, n), 448.0 * k, np.float32))
    assert amax == 448.0 * k


@needs_gpu
@pytest.mark.parametrize("regime", ["balanced", "mixed", "huge", "subnormal"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
@pytest.mark.parametrize("m", [1, 17, 32])
def test_random_extreme_scales(rng, m, fmt, regime):
    a, b, sfa, sfb, sfv = _random_problem(rng, fmt, regime, 1, m, 136, 256)
    p = npref.RandomProblem(a, b, sfa, sfb, sfv, 256)
    c, amax = _gemm(p, "float32")
    assert not np.isnan(c).any() and np.isfinite(amax)
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


@needs_gpu
@pytest.mark.parametrize("m", [1, 29])
def test_random_extreme_nvfp4_scales(rng, m):
    a, b, sfa, sfb, sfv = _random_problem(rng, "nvfp4", "extreme", 1, m, 136, 256)
    c, amax = _gemm(npref.RandomProblem(a, b, sfa, sfb, sfv, 256), "float32")
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


@needs_gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_nan_only_from_nan_inputs(rng, fmt):
    # NaN scale bytes and NaN codes among extreme scales: NaN exactly where a NaN input meets C.
    a, b, sfa, sfb, sfv = _random_problem(rng, fmt, "balanced", 1, 50, 136, 256, nan_fraction=0.002)
    c, amax = _gemm(npref.RandomProblem(a, b, sfa, sfb, sfv, 256), "float32")
    _assert_matches_oracle(c, amax, a, b, sfa, sfb, sfv)


@needs_gpu
@pytest.mark.parametrize("kind,nan,inf", [("e4m3", 3, 0), ("e5m2", 2, 0), ("e5m2", 0, 3), ("e5m2", 2, 2)])
@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("m", [3, 32])
def test_nonfinite_codes_reach_c_and_amax(rng, m, kind, nan, inf, c_dtype):
    p = _nonfinite_problem(rng, kind, m, 224, 4096, nan, inf)
    result = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype))(p.a[0], p.b[0], p.sfa[0], p.sfb[0])
    _check_nonfinite(result, p, c_dtype)
    # ... and agree with the CPU backend element for element where not finite.
    cpu, _ = _gemm(p, "float32", device=jax.devices("cpu")[0])
    gpu, _ = _gemm(p, "float32")
    np.testing.assert_array_equal(np.isnan(gpu), np.isnan(cpu))
    np.testing.assert_array_equal(gpu[np.isinf(cpu)], cpu[np.isinf(cpu)])


# ---------------------------------------------------------------------------------------------
# amax and C across calls.


@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("n,k", [(200, 160), (1000, 4096)], ids=["unsplit", "split-K"])
def test_amax_is_reset_on_every_call(rng, fmt, n, k):
    p = _random(rng, fmt, 16, n, k)
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.float32, sf_vec_size=p.sfv))
    for _ in range(3):  # the same executable, its counters and amax zeroed by each call
        first = f(p.a[0], p.b[0], p.sfa[0], p.sfb[0])
        zero = f(p.a[0], np.zeros_like(p.b[0]), p.sfa[0], p.sfb[0])
        assert float(zero.amax) == 0.0 and not np.asarray(zero.c).any()
        _check_against_oracle(p, np.asarray(first.c)[None], float(first.amax), "float32")


@needs_gpu
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4"])
def test_c_over_an_earlier_calls_buffer(rng, fmt):
    """C's buffer may hold anything (here, likely, a NaN C freed just before): every element is
    written, amax read from what is written."""
    good = _random(rng, fmt, 24, 1000, 4096)
    poison = _random(rng, fmt, 24, 1000, 4096)
    poison.sfa.view(np.uint8)[...] = 0xFF  # NaN scales: a C of NaN everywhere
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.float32, sf_vec_size=good.sfv))
    for _ in range(3):
        bad = f(poison.a[0], poison.b[0], poison.sfa[0], poison.sfb[0])
        assert np.isnan(float(bad.amax))
        del bad
        result = f(good.a[0], good.b[0], good.sfa[0], good.sfb[0])
        _check_against_oracle(good, np.asarray(result.c)[None], float(result.amax), "float32")

    @jax.jit
    def both(pa, pb, psa, psb, a, b, sa, sb):  # one program: the NaN C's buffer is dead before the second
        nan_c = jga.gemm_amax(pa, pb, psa, psb, c_dtype=jnp.float32, sf_vec_size=good.sfv).c
        return jnp.isnan(nan_c).all(), jga.gemm_amax(a, b, sa, sb, c_dtype=jnp.float32, sf_vec_size=good.sfv)

    all_nan, result = both(
        poison.a[0], poison.b[0], poison.sfa[0], poison.sfb[0], good.a[0], good.b[0], good.sfa[0], good.sfb[0]
    )
    assert bool(all_nan)
    _check_against_oracle(good, np.asarray(result.c)[None], float(result.amax), "float32")


@needs_gpu
def test_two_calls_at_once(rng):
    """Independent calls of one program (concurrent command-buffer branches), each with its own
    reset word and split-K counters."""
    problems = [_random(rng, "mxfp8_e4m3", m, 1000, 4096) for m in (1, 16, 16, 32)]

    @jax.jit
    def four(ops):
        return [jga.gemm_amax(*o, c_dtype=jnp.bfloat16) for o in ops]

    for _ in range(3):
        results = four([(p.a[0], p.b[0], p.sfa[0], p.sfb[0]) for p in problems])
        for p, r in zip(problems, results):
            _check_against_oracle(p, np.asarray(r.c)[None], float(r.amax), "bfloat16")
