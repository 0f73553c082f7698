"""gemm_amax against the independent float64 oracle, on the default backend (CPU in CI, the
CUDA kernel on a GPU machine)."""

import itertools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest
from sm90_plans import lowering_plan

import jax_gemm_amax as jga
from jax_gemm_amax import _ffi

E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn

FP8_C = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
ALL_C = FP8_C + ["float4_e2m1fn", "uint8"]

# (operand kind, operand container, scale dtype, sf_vec_size)
FP8_CASES = [(kind, None, E8M0, 32) for kind in ("e4m3", "e5m2")]
FP4_CASES = [
    ("fp4", container, sf, sfv)
    for container in ("uint8", "float4_e2m1fn")
    for sf, sfv in ((E8M0, 32), (E8M0, 16), (E4M3, 16))
]
COMBOS = [case + (c,) for case in FP8_CASES for c in FP8_C] + [case + (c,) for case in FP4_CASES for c in ALL_C]


def _operands(p: npref.RandomProblem, container, squeeze=True):
    a, b = p.a, p.b
    if container == "float4_e2m1fn":
        a = npref.decode_values(a).astype(ml_dtypes.float4_e2m1fn)
        b = npref.decode_values(b).astype(ml_dtypes.float4_e2m1fn)
    sfa, sfb = p.sfa, p.sfb
    if squeeze:
        a, b, sfa, sfb = a[0], b[0], sfa[0], sfb[0]
    return a, b, sfa, sfb


def _check(result, p, c_dtype, c_major="n"):
    ref, abssum, amax = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    c = np.asarray(result.c)
    if c.ndim == 2:
        c = c[None]
    if c_major == "m":
        assert c_dtype != "uint8", "packed C^T is packed along M: compare it unpacked"
        c = np.swapaxes(c, 1, 2)
    npref.assert_c_close(c, c_dtype, ref, abssum)
    np.testing.assert_allclose(float(result.amax), np.max(amax), rtol=2e-5)
    assert result.amax.dtype == jnp.float32 and result.amax.shape == ()


@pytest.mark.parametrize("kind,container,sf_dtype,sfv,c_dtype", COMBOS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_dtype_combination(rng, kind, container, sf_dtype, sfv, c_dtype):
    m, n, k = 200, 160, 320  # M, N not multiples of 128; K' padded
    p = npref.random_problem(rng, kind, sf_dtype, sfv, m, n, k)
    a, b, sfa, sfb = _operands(p, container)
    result = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype, sf_vec_size=sfv))(a, b, sfa, sfb)
    n_stored = n // 2 if c_dtype == "uint8" else n
    assert result.c.shape == (m, n_stored) and result.c.dtype == jnp.dtype(c_dtype)
    _check(result, p, c_dtype)


@pytest.mark.parametrize("sf_dtype", [np.int8, np.uint8])
def test_integer_scale_containers_read_as_e8m0(rng, sf_dtype):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 136, 64, 256)
    a, b, sfa, sfb = _operands(p, None)
    result = jga.gemm_amax(a, b, sfa.view(sf_dtype), sfb.view(sf_dtype))
    _check(result, p, "float32")


@pytest.mark.parametrize("kind,c_dtype", [("e4m3", "bfloat16"), ("fp4", "float32"), ("fp4", "uint8")])
def test_batched(rng, kind, c_dtype):
    p = npref.random_problem(rng, kind, E8M0, 32, 130, 96, 256, batch=3)
    a, b, sfa, sfb = _operands(p, "uint8" if kind == "fp4" else None, squeeze=False)
    result = jga.gemm_amax(a, b, sfa, sfb, c_dtype=c_dtype)
    assert result.c.shape[0] == 3
    _check(result, p, c_dtype)


@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_c_major_m_returns_transpose(rng, c_dtype):
    p = npref.random_problem(rng, "e5m2", E8M0, 32, 144, 80, 192)
    a, b, sfa, sfb = _operands(p, None)
    result = jga.gemm_amax(a, b, sfa, sfb, c_dtype=c_dtype, c_major="m")
    assert result.c.shape == (80, 144)
    _check(result, p, c_dtype, c_major="m")


def test_logical_scale_view_is_accepted(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 256, 128, 256)
    a, b, sfa, sfb = _operands(p, None)
    logical_a = np.transpose(p.sfa, (3, 4, 1, 5, 2, 0))  # the cuDNN frontend's logical view (32, 4, M', 4, K', L)
    logical_b = np.transpose(p.sfb, (3, 4, 1, 5, 2, 0))
    result = jga.gemm_amax(a, b, logical_a, logical_b)
    _check(result, p, "float32")
    batched = jga.gemm_amax(p.a, p.b, logical_a, logical_b)
    np.testing.assert_array_equal(np.asarray(batched.c)[0], np.asarray(result.c))


def test_the_primitive_and_its_rules_are_one_module():
    # Each primitive's rules are registered where it is defined; nothing is imported for its side effects.
    from jax_gemm_amax.primitives import gemm_amax as module

    assert jga.gemm_amax_p is module.gemm_amax_p
    package = os.path.dirname(jga.__file__)
    sources = [os.path.join(d, f) for d, _, files in os.walk(package) for f in files if f.endswith(".py")]
    assert not [path for path in sources if "noqa: F401" in open(path).read()]


def test_vmap_gives_one_amax_per_item(rng):
    ps = [npref.random_problem(rng, "e4m3", E8M0, 32, 64, 32, 128) for _ in range(4)]
    a = np.stack([p.a[0] for p in ps])
    b = np.stack([p.b[0] for p in ps])
    sfa = np.stack([p.sfa[0] for p in ps])
    sfb = np.stack([p.sfb[0] for p in ps])
    c, amax = jax.jit(jax.vmap(lambda *x: jga.gemm_amax(*x)))(a, b, sfa, sfb)
    assert c.shape == (4, 64, 32) and amax.shape == (4,)
    for i, p in enumerate(ps):
        _check(jga.GemmAmaxResult(c[i], amax[i]), p, "float32")


def test_vmap_with_shared_operand_and_nested(rng):
    ps = [npref.random_problem(rng, "fp4", E4M3, 16, 64, 64, 128) for _ in range(3)]
    b, sfb = ps[0].b[0], ps[0].sfb[0]  # shared, unmapped
    a = np.stack([p.a[0] for p in ps])
    sfa = np.stack([p.sfa[0] for p in ps])
    f = jax.vmap(lambda a, sfa: jga.gemm_amax(a, b, sfa, sfb, sf_vec_size=16))
    c, amax = f(a, sfa)
    for i, p in enumerate(ps):
        shared = npref.RandomProblem(p.a, ps[0].b, p.sfa, ps[0].sfb, 16, 128)
        _check(jga.GemmAmaxResult(c[i], amax[i]), shared, "float32")
    # vmap of vmap over a batched (L, ...) op: amax per outer item, max over inner items and L.
    a4 = np.stack([a, a[::-1]])[:, :, None]  # (2, 3, 1, M, Kb)
    sfa4 = np.stack([sfa, sfa[::-1]])[:, :, None]
    nested = jax.vmap(jax.vmap(lambda a, sfa: jga.gemm_amax(a, b[None], sfa, sfb[None], sf_vec_size=16)))
    c2, amax2 = nested(a4, sfa4)
    assert c2.shape == (2, 3, 1, 64, 64) and amax2.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(c2)[0, :, 0], np.asarray(c))
    np.testing.assert_array_equal(np.asarray(amax2)[1], np.asarray(amax)[::-1])


def test_jit_composition_and_eager_agree(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 96, 48, 128)
    a, b, sfa, sfb = _operands(p, None)

    @jax.jit
    def f(a, b, sfa, sfb, bias):
        c, amax = jga.gemm_amax(a, b, sfa, sfb)
        return jax.nn.relu(c + bias), amax * 2

    bias = jnp.ones((48,), jnp.float32)
    y, amax2 = f(a, b, sfa, sfb, bias)
    eager = jga.gemm_amax(a, b, sfa, sfb)
    np.testing.assert_array_equal(np.asarray(y), np.maximum(np.asarray(eager.c) + 1, 0))
    assert float(amax2) == 2 * float(eager.amax)
    _check(eager, p, "float32")


def test_amax_is_reset_between_calls(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = _operands(p, None)
    f = jax.jit(lambda *x: jga.gemm_amax(*x))
    first = f(a, b, sfa, sfb)
    assert float(first.amax) > 0
    zero_b = np.zeros_like(b)
    second = f(a, zero_b, sfa, sfb)
    assert float(second.amax) == 0.0
    assert not np.asarray(second.c).any()


def test_nan_propagates_to_amax_and_c(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    sfa = p.sfa.copy()
    sfa.view(np.uint8)[0, 0, 0, 5, 0, 1] = 0xFF  # e8m0 NaN for row 5, group 1
    a, b, _, sfb = _operands(p, None)
    result = jga.gemm_amax(a, b, sfa[0], sfb)
    assert np.isnan(float(result.amax))
    c = np.asarray(result.c)
    assert np.isnan(c[5]).all() and not np.isnan(np.delete(c, 5, axis=0)).any()


def test_amax_is_taken_before_rounding(rng):
    # FP8 C saturates at 448; amax reports the fp32 accumulator.
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 64, 32, 128)
    sfa = p.sfa.copy()
    sfa.view(np.uint8)[sfa.view(np.uint8) != 0] = 134  # scale 2^7: results far beyond 448
    a, b, _, sfb = _operands(p, None)
    result = jga.gemm_amax(a, b, sfa[0], sfb, c_dtype=jnp.float8_e4m3fn)
    assert float(result.amax) > 448
    assert np.max(np.abs(np.asarray(result.c).astype(np.float32))) == 448.0
    p.sfa = sfa
    _check(result, p, "float8_e4m3fn")


def test_reference_matches_oracle(rng):
    for kind, sf, sfv, c in [
        ("e4m3", E8M0, 32, "bfloat16"),
        ("fp4", E4M3, 16, "uint8"),
        ("e5m2", E8M0, 32, "float8_e5m2"),
    ]:
        p = npref.random_problem(rng, kind, sf, sfv, 136, 64, 256, batch=2)
        a, b, sfa, sfb = _operands(p, "uint8" if kind == "fp4" else None, squeeze=False)
        _check(jga.reference_gemm_amax(a, b, sfa, sfb, c_dtype=c, sf_vec_size=sfv), p, c)


def test_tuning_hints_do_not_change_results(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 256, 256)
    a, b, sfa, sfb = _operands(p, None)
    base = jga.gemm_amax(a, b, sfa, sfb)
    for tiler, cluster in itertools.product([(128, 128), (128, 256)], [(1, 1), (2, 1), (4, 4)]):
        other = jga.gemm_amax(a, b, sfa, sfb, mma_tiler_mn=tiler, cluster_shape_mn=cluster)
        np.testing.assert_array_equal(np.asarray(other.c), np.asarray(base.c))


@pytest.mark.parametrize(
    "kind,sf_dtype,sfv,m,n,k",
    [
        ("e4m3", E8M0, 32, 1, 72, 32),
        ("e4m3", E8M0, 32, 45, 40, 32),
        ("e5m2", E8M0, 32, 64, 64, 32),
        ("fp4", E8M0, 32, 3, 40, 64),
        ("fp4", E4M3, 16, 45, 40, 32),
        ("e4m3", E8M0, 32, 1, 8, 96),
    ],
)
def test_short_k_and_few_rows(rng, kind, sf_dtype, sfv, m, n, k):
    # K shorter than one 128-byte K slab and single-row operands: the TMA boxes overhang.
    p = npref.random_problem(rng, kind, sf_dtype, sfv, m, n, k)
    a, b, sfa, sfb = _operands(p, "uint8" if kind == "fp4" else None)
    _check(jga.gemm_amax(a, b, sfa, sfb, sf_vec_size=sfv), p, "float32")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="GPU-sized problems (1.7e10-2.7e11 flops a call)")
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize(
    "m,n,k", [(16384, 8192, 1024), (256, 4096, 8192), (2560, 1792, 4096)], ids=["persistent", "split_k", "tail_split"]
)
def test_every_element_of_a_long_run(fmt, m, n, k):
    """16384x8192x1024: each CTA of the persistent kernel runs ~30 short-K tiles back to back, where
    a shared-memory stage is reused soonest (a missing proxy fence once left a few wrong rows in 1-6
    tiles per call here, which a sampled check missed). 256x4096x8192: 32 output tiles for 132 SMs,
    so the SM90 kernel splits K and hands fp32 partial tiles between CTAs (and 16384x8192x1024,
    with many rows, converts B to BF16 in a pass of its own first). 2560x1792x4096: the last
    wave of tiles is partial (on a 132-SM H200 the plan is 140 tiles of 256 rows: 132 run whole,
    the last 8 split K 4 ways, a tail split). Every element, in several calls, against the float32 product."""
    sfv = 16 if fmt == "nvfp4" else 32
    kx, kw = jax.random.split(jax.random.key(7))
    qa, sfa = jga.quantize(jax.random.normal(kx, (m, k), jnp.float32), fmt)
    qb, sfb = jga.quantize(jax.random.normal(kw, (n, k), jnp.float32), fmt)

    @jax.jit
    def reference(qa, qb, sfa, sfb):
        ref = jnp.dot(jga.dequantize(qa, sfa, sfv), jga.dequantize(qb, sfb, sfv).T, precision=jax.lax.Precision.HIGHEST)
        return ref, jnp.max(jnp.abs(ref))

    ref, ref_amax = reference(qa, qb, sfa, sfb)
    run = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.bfloat16, sf_vec_size=sfv))

    @jax.jit  # ref is an argument: closed over, it would be compiled in as a constant (512 MB)
    def wrong_elements(c, ref, ref_amax):  # bf16 rounding (2^-9 relative) plus fp32 summation-order slack
        return jnp.sum(jnp.abs(c.astype(jnp.float32) - ref) > 2.0**-7 * jnp.abs(ref) + 1e-4 * ref_amax)

    for call in range(3):
        c, amax = run(qa, qb, sfa, sfb)
        assert int(wrong_elements(c, ref, ref_amax)) == 0, f"call {call}"
        np.testing.assert_allclose(float(amax), float(ref_amax), rtol=1e-5)


# Shapes whose plan on a 132-SM H200 pre-converts `pre` ("A", "B", "AB") with split-K or not, in
# every format (test_preconversion_cases_get_their_plan checks that on any machine).
PRECONVERT_CASES = [
    (4100, 760, 2080, "B", False),
    (1996, 3100, 1056, "A", False),
    (4100, 4100, 352, "AB", False),
    (3100, 2200, 2080, "AB", False),
    (250, 6000, 8192, "A", True),
]
PRECONVERT_IDS = ["B", "A", "AB", "AB-long-K", "A-split-K"]


def _sm90_plan_kind(fmt, m, n, k, sms=0):
    f = jga.FORMATS[fmt]
    plan, pre = lowering_plan((1, m, n, k, f.value_dtype, f.scale_dtype, f.sf_vec_size), sms=sms)
    return plan, (pre, plan["splits"] > 1)


@pytest.mark.skipif(not _ffi.BUILT_WITH_CUDA, reason="built without the CUDA backend")
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("m,n,k,pre,split", PRECONVERT_CASES, ids=PRECONVERT_IDS)
def test_preconversion_cases_get_their_plan(fmt, m, n, k, pre, split):
    """The GPU test below skips a case whose plan differs on the GPU it runs on; on an H200 (132 SMs,
    host arithmetic) none may, or it would check nothing there."""
    plan, kind = _sm90_plan_kind(fmt, m, n, k, sms=132)
    assert kind == (pre, split), plan


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the SM90 kernel's two ways of converting operands")
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("m,n,k,pre,split", PRECONVERT_CASES, ids=PRECONVERT_IDS)
def test_preconverted_operands_match_in_kernel_conversion(fmt, m, n, k, pre, split, monkeypatch):
    """The SM90 kernel may convert B and A to BF16 in passes of their own when its plan is tile 256
    (unsplit; split-K: A only; its cost model decides), and loads them; JAX_GEMM_AMAX_PRECONVERT=0 (read
    at lowering) keeps both conversions inside the GEMM. The same BF16 values meet the same WGMMAs
    either way (A from shared memory instead of registers), and split-K partials are added in the
    same order: f32 C must agree bit for bit (K tail, partial tiles, M not a multiple of 8), and with
    the float64 product. The cases are ones whose plan pre-converts `pre` on a 132-SM H200
    (250x6000x8192: 47 tiles, split-K); the kernel library's own plan query says whether that holds
    on this GPU."""
    sfv = jga.FORMATS[fmt].sf_vec_size
    plan, kind = _sm90_plan_kind(fmt, m, n, k)
    if kind != (pre, split):
        pytest.skip(f"this GPU's plan at {m}x{n}x{k} is {plan}, not the one this case is for: {pre}, split-K {split}")
    kx, kw = jax.random.split(jax.random.key(11))
    qa, sfa = jga.quantize(jax.random.normal(kx, (m, k), jnp.float32), fmt)
    qb, sfb = jga.quantize(jax.random.normal(kw, (n, k), jnp.float32), fmt)
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", setting)
        run = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.float32, sf_vec_size=sfv))  # traced anew
        results[setting] = run(qa, qb, sfa, sfb)
    np.testing.assert_array_equal(np.asarray(results["1"].c), np.asarray(results["0"].c))
    assert float(results["1"].amax) == float(results["0"].amax)
    ref = np.asarray(jga.dequantize(qa, sfa, sfv), np.float64) @ np.asarray(jga.dequantize(qb, sfb, sfv), np.float64).T
    np.testing.assert_allclose(np.asarray(results["1"].c), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(float(results["1"].amax), np.abs(ref).max(), rtol=1e-5)


_CONCURRENT_CALLS = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    import jax_gemm_amax as jga

    # Two split-K shapes (fp32 partials handed between CTAs) and two unsplit ones, each its own data.
    shapes = [(256, 4096, 8192), (256, 4096, 8192), (2048, 2048, 1024), (2048, 2048, 1024)]
    operands, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        kx, kw = jax.random.split(jax.random.key(i))
        qa, sfa = jga.quantize(jax.random.normal(kx, (m, k), jnp.float32) * (i + 1), "mxfp8_e4m3")
        qb, sfb = jga.quantize(jax.random.normal(kw, (n, k), jnp.float32), "mxfp8_e4m3")
        operands.append((qa, qb, sfa, sfb))
        ref = jnp.dot(jga.dequantize(qa, sfa, 32), jga.dequantize(qb, sfb, 32).T, precision=jax.lax.Precision.HIGHEST)
        refs.append((ref, jnp.max(jnp.abs(ref))))

    @jax.jit  # four independent calls: parallel branches of one command buffer under CONCURRENT
    def four(operands):
        return [jga.gemm_amax(*ops, c_dtype=jnp.bfloat16) for ops in operands]

    for call in range(5):
        for i, ((c, amax), (ref, ref_amax)) in enumerate(zip(four(operands), refs)):
            wrong = int(jnp.sum(jnp.abs(c.astype(jnp.float32) - ref) > 2.0**-7 * jnp.abs(ref) + 1e-4 * ref_amax))
            assert wrong == 0, (call, i, wrong)
            np.testing.assert_allclose(float(amax), float(ref_amax), rtol=1e-5, err_msg=f"call {call}, gemm {i}")
    print("OK")
    """
)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="XLA's concurrent command-buffer branches on the GPU")
def test_independent_calls_in_concurrent_command_buffer_branches():
    """Four independent gemm_amax calls in one jit, under XLA's CONCURRENT command-buffer scheduling
    (independent commands become parallel graph branches, so the GPU may run the kernels at once).
    Each call site zeroes its amax and split-K counters behind its own grid-barrier word, and the
    kernels launch cooperatively (a grid's CTAs all resident), so two grids that wait on their own
    CTAs can neither mix rounds nor deadlock on SMs the other holds. A hang is caught by the timeout."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT --xla_gpu_graph_min_graph_size=1"
    run = subprocess.run(  # cwd: not the repository root, whose source tree would shadow the package
        [sys.executable, "-c", _CONCURRENT_CALLS],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr[-4000:]
