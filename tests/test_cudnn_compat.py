"""The cuDNN-frontend compatibility layer: NVIDIA's usage snippets run with only the import changed,
every entry point against the float64 oracle, both scale layouts, torch interop, error paths."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest

import jax_gemm_amax as jga
from jax_gemm_amax import GemmAmaxSm100, TupleDict, gemm_amax_jax_sm100, gemm_amax_wrapper_sm100

E8M0 = ml_dtypes.float8_e8m0fnu
E4M3 = ml_dtypes.float8_e4m3fn
LOGICAL = (3, 4, 1, 5, 2, 0)  # physical (L, MN', K', 32, 4, 4) -> cuDNN's (32, 4, MN', 4, K', L)


# ---------------------------------------------------------------------------------------------
# helpers: the cuDNN frontend's layouts built from an npref problem (library order (L, M, Kb))


def cudnn_jax(p, logical_scales=False):
    """(M, K, L) / (N, K, L) JAX arrays and scales (physical, or the logical view)."""
    a, b = (jnp.asarray(np.ascontiguousarray(np.transpose(x, (1, 2, 0)))) for x in (p.a, p.b))
    sfa, sfb = (np.transpose(s, LOGICAL) if logical_scales else s for s in (p.sfa, p.sfb))
    return a, b, jnp.asarray(sfa), jnp.asarray(sfb)


def check_cudnn_c(c, amax, p, c_dtype):
    """c (M, N, L) (packed: (M, N // 2, L)) and amax (1, 1, 1) against the oracle."""
    ref, abssum, per_batch = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    npref.assert_c_close(np.transpose(np.asarray(c), (2, 0, 1)), c_dtype, ref, abssum)
    assert tuple(amax.shape) == (1, 1, 1)
    np.testing.assert_allclose(float(np.asarray(amax).reshape(())), np.max(per_batch), rtol=2e-5)


# ---------------------------------------------------------------------------------------------
# The cuDNN frontend's JAX snippets, as written except for the import


def test_cudnn_jax_wrapper_snippet():
    from jax_gemm_amax import gemm_amax_wrapper_sm100  # was: from cudnn import gemm_amax_wrapper_sm100

    m, n, k, sf_vec_size = 512, 256, 256, 32
    a = jax.device_put(np.random.randn(m, k, 1).astype(ml_dtypes.float8_e5m2))
    b = jax.device_put(np.random.randn(n, k, 1).astype(ml_dtypes.float8_e5m2))
    sfa = jax.device_put(np.ones((1, m // 128, k // (4 * sf_vec_size), 32, 4, 4), dtype=ml_dtypes.float8_e8m0fnu))
    sfb = jax.device_put(np.ones((1, n // 128, k // (4 * sf_vec_size), 32, 4, 4), dtype=ml_dtypes.float8_e8m0fnu))
    jax.block_until_ready((a, b, sfa, sfb))

    c, amax = gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_dtype=jnp.float32, sf_vec_size=sf_vec_size)
    # The cuDNN frontend's `cudart.cudaDeviceSynchronize()` follows here; XLA orders our call, so it is not needed.

    assert c.shape == (m, n, 1) and c.dtype == jnp.float32 and amax.shape == (1, 1, 1)
    p = npref.RandomProblem(
        np.transpose(np.asarray(a), (2, 0, 1)),
        np.transpose(np.asarray(b), (2, 0, 1)),
        np.asarray(sfa),
        np.asarray(sfb),
        sf_vec_size,
        k,
    )
    check_cudnn_c(c, amax, p, "float32")


def test_cudnn_jax_jit_snippet(rng):
    from jax_gemm_amax import gemm_amax_jax_sm100  # was: from cudnn import gemm_amax_jax_sm100

    @jax.jit
    def quantized_matmul(a, b, sfa, sfb):
        c, amax = gemm_amax_jax_sm100(a, b, sfa, sfb, c_dtype=jnp.float32, sf_vec_size=32)
        return c, amax

    p = npref.random_problem(rng, "e4m3", E8M0, 32, 256, 128, 256)
    c, amax = quantized_matmul(*cudnn_jax(p))
    assert c.shape == (256, 128, 1)
    check_cudnn_c(c, amax, p, "float32")


# ---------------------------------------------------------------------------------------------
# gemm_amax_jax_sm100 and the wrapper with JAX arrays: past the cuDNN frontend's JAX limits


@pytest.mark.parametrize("logical", [False, True], ids=["physical", "logical"])
@pytest.mark.parametrize(
    "kind,sf,sfv,c_dtype",
    [("e4m3", E8M0, 32, "bfloat16"), ("fp4", E4M3, 16, "uint8"), ("e5m2", E8M0, 32, "float8_e4m3fn")],
)
def test_jax_batched_both_scale_layouts(rng, logical, kind, sf, sfv, c_dtype):
    p = npref.random_problem(rng, kind, sf, sfv, 200, 96, 256, batch=3)  # L = 3, M not a multiple of 128
    a, b, sfa, sfb = cudnn_jax(p, logical_scales=logical)
    c, amax = jax.jit(lambda *x: gemm_amax_jax_sm100(*x, c_dtype=c_dtype, sf_vec_size=sfv))(a, b, sfa, sfb)
    assert c.shape == ((200, 48, 3) if c_dtype == "uint8" else (200, 96, 3))
    check_cudnn_c(c, amax, p, c_dtype)
    result = gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sfv)
    np.testing.assert_array_equal(np.asarray(result["c_tensor"]), np.asarray(c))
    assert float(result["amax_tensor"][0, 0, 0]) == float(amax[0, 0, 0])


def test_vmap_over_cudnn_calls(rng):
    ps = [npref.random_problem(rng, "e4m3", E8M0, 32, 64, 32, 128) for _ in range(3)]
    a, b, sfa, sfb = (jnp.stack(xs) for xs in zip(*(cudnn_jax(p) for p in ps)))
    c, amax = jax.jit(jax.vmap(gemm_amax_jax_sm100))(a, b, sfa, sfb)
    assert c.shape == (3, 64, 32, 1) and amax.shape == (3, 1, 1, 1)
    for i, p in enumerate(ps):
        check_cudnn_c(c[i], amax[i], p, "float32")


def test_jax_c_major_m_returns_c_contiguous_mnl(rng):
    # N = 40 float32 is 160 bytes: n-major would be fine too, so compare both.
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 64, 40, 128, batch=2)
    args = cudnn_jax(p)
    c_m, amax_m = gemm_amax_wrapper_sm100(*args, c_major="m")
    c_n, _ = gemm_amax_wrapper_sm100(*args, c_major="n")
    assert c_m.shape == (64, 40, 2)
    np.testing.assert_array_equal(np.asarray(c_m), np.asarray(c_n))
    check_cudnn_c(c_m, amax_m, p, "float32")
    # M = 64 bf16 rows are aligned, N = 20 (40 bytes) are not: only c_major="m" is valid.
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 64, 20, 128)
    c, amax = gemm_amax_jax_sm100(*cudnn_jax(p), c_dtype=jnp.bfloat16, c_major="m")
    check_cudnn_c(c, amax, p, "bfloat16")
    with pytest.raises(ValueError, match=r"c_dtype: rows of c must be 16-byte aligned: N=20"):
        gemm_amax_jax_sm100(*cudnn_jax(p), c_dtype=jnp.bfloat16, c_major="n")


def test_dtype_arguments_in_every_spelling(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    args = cudnn_jax(p)
    base = np.asarray(gemm_amax_wrapper_sm100(*args, c_dtype=jnp.bfloat16)[0])
    for spelling in (np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16, "bfloat16"):
        c, _ = gemm_amax_wrapper_sm100(*args, c_dtype=spelling, acc_dtype="float32")
        np.testing.assert_array_equal(np.asarray(c), base)
    for spelling in (np.float32, "float32", jnp.float32, np.dtype("float32")):
        gemm_amax_wrapper_sm100(*args, acc_dtype=spelling)


def test_tuple_dict():
    r = TupleDict(c_tensor=1, amax_tensor=2)
    c, amax = r
    assert (c, amax) == (1, 2) and r["c_tensor"] == 1 and r["amax_tensor"] == 2
    assert r[0] == 1 and r[1] == 2 and r[-1] == 2 and r[np.int64(1)] == 2 and len(r) == 2
    # A pytree, so that jitted functions return one.
    out = jax.jit(lambda x: TupleDict(c_tensor=x, amax_tensor=2 * x))(jnp.float32(3))
    assert isinstance(out, TupleDict) and list(out.keys()) == ["c_tensor", "amax_tensor"]
    assert (float(out[0]), float(out["amax_tensor"])) == (3.0, 6.0)
    assert list(r.keys()) == ["c_tensor", "amax_tensor"] and isinstance(r, dict)
    with pytest.raises(IndexError):
        r[2]
    with pytest.raises(KeyError):
        r["c"]


# ---------------------------------------------------------------------------------------------
# GemmAmaxSm100 with JAX arrays


class FakeCUstream:
    """cuda-python's ``cuda.CUstream`` as far as we read it: ``int()`` is the handle, ``getPtr()``
    the address of the Python object's storage (never 0)."""

    def __init__(self, handle=0):
        self._handle = handle

    def __int__(self):
        return self._handle

    def getPtr(self):
        return id(self)


def test_class_with_jax_arrays(rng):
    p = npref.random_problem(rng, "fp4", E8M0, 32, 136, 64, 256, batch=2)
    a, b, sfa, sfb = cudnn_jax(p, logical_scales=True)
    c = jnp.zeros((136, 64, 2), jnp.float16)
    amax = jnp.zeros((1, 1, 1), jnp.float32)
    op = GemmAmaxSm100(
        sample_a=a,
        sample_b=b,
        sample_sfa=sfa,
        sample_sfb=sfb,
        sample_c=c,
        sample_amax=amax,
        acc_dtype=jnp.float32,
        mma_tiler_mn=(128, 128),
        cluster_shape_mn=(1, 1),
        sf_vec_size=32,
    )
    with pytest.raises(RuntimeError, match=r"call compile\(\) first"):
        op.execute(a, b, sfa, sfb, c, amax)
    assert op.check_support()
    op.compile()
    assert op.check_support()  # still, with the samples dropped
    out = op.execute(a, b, sfa, sfb)
    assert isinstance(out, TupleDict)
    check_cudnn_c(out["c_tensor"], out["amax_tensor"], p, "float16")
    # fresh data, same shapes: the cached executable; c/amax may be left out for JAX
    q = npref.random_problem(rng, "fp4", E8M0, 32, 136, 64, 256, batch=2)
    c2, amax2 = op.execute(*cudnn_jax(q, logical_scales=True))
    check_cudnn_c(c2, amax2, q, "float16")
    # the other scale form than the samples': the same executable, the same result
    c3, amax3 = op.execute(*cudnn_jax(q, logical_scales=False))
    np.testing.assert_array_equal(np.asarray(c3), np.asarray(c2))
    np.testing.assert_array_equal(np.asarray(amax3), np.asarray(amax2))
    # other shapes raise
    r = npref.random_problem(rng, "fp4", E8M0, 32, 128, 64, 256, batch=2)
    with pytest.raises(ValueError, match=r"a_tensor: got shape \(128, 128, 2\).*compiled for \(136, 128, 2\)"):
        op.execute(*cudnn_jax(r, logical_scales=True))


def test_class_with_jax_arrays_refuses_output_buffers_and_takes_the_default_stream(rng):
    # NVIDIA's JAX usage passes c / amax buffers and cuda.CUstream(0), then reads the buffers. JAX
    # arrays are immutable: the buffers are refused, never silently left unwritten.
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = cudnn_jax(p)
    c, amax = jnp.zeros((128, 64, 1), jnp.float32), jnp.full((1, 1, 1), -jnp.inf)
    op = GemmAmaxSm100(a, b, sfa, sfb, c, amax)
    op.compile()
    must_be_none = (
        r"with JAX samples, execute returns its outputs .* must be None, got ArrayImpl; read the result instead"
    )
    with pytest.raises(TypeError, match=r"c_tensor: " + must_be_none):
        op.execute(a, b, sfa, sfb, c_tensor=c, amax_tensor=amax, current_stream=FakeCUstream(0))
    with pytest.raises(TypeError, match=r"c_tensor: " + must_be_none):
        op.execute(a, b, sfa, sfb, c, amax, current_stream=None)
    with pytest.raises(TypeError, match=r"amax_tensor: " + must_be_none):
        op.execute(a, b, sfa, sfb, amax_tensor=amax)
    for stream in (None, 0, np.int64(0), FakeCUstream(0)):
        c_out, amax_out = op.execute(a, b, sfa, sfb, current_stream=stream)
        check_cudnn_c(c_out, amax_out, p, "float32")
    with pytest.raises(
        NotImplementedError, match=r"current_stream: JAX arrays run on XLA's own stream.*got handle 0x1234"
    ):
        op.execute(a, b, sfa, sfb, current_stream=FakeCUstream(0x1234))
    with pytest.raises(TypeError, match=r"current_stream: expected a torch.cuda.Stream or a CUDA stream handle"):
        op.execute(a, b, sfa, sfb, current_stream="0")


def test_class_check_support_raises_the_functional_errors(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = cudnn_jax(p)
    c, amax = jnp.zeros((128, 64, 1)), jnp.zeros((1, 1, 1))
    with pytest.raises(ValueError) as functional:
        jga.gemm_amax(p.a, p.b, p.sfa, p.sfb, sf_vec_size=16)
    with pytest.raises(ValueError) as compat:
        GemmAmaxSm100(a, b, sfa, sfb, c, amax, sf_vec_size=16).check_support()
    assert str(compat.value) == str(functional.value)
    with pytest.raises(NotImplementedError, match=r"TILE_M = 256 \(2-SM tiles\) is not built"):
        GemmAmaxSm100(a, b, sfa, sfb, c, amax, mma_tiler_mn=(256, 128)).check_support()
    with pytest.raises(NotImplementedError, match=r"acc_dtype: only float32"):
        GemmAmaxSm100(a, b, sfa, sfb, c, amax, acc_dtype=jnp.float16).check_support()
    with pytest.raises(ValueError, match=r"sample_c: expected shape \(128, 64, 1\)"):
        GemmAmaxSm100(a, b, sfa, sfb, jnp.zeros((64, 128, 1)), amax).check_support()
    with pytest.raises(ValueError, match=r"sample_amax: expected one float32"):
        GemmAmaxSm100(a, b, sfa, sfb, c, jnp.zeros((2,))).check_support()
    with pytest.raises(TypeError, match=r"c_dtype must be one of"):
        GemmAmaxSm100(a, b, sfa, sfb, c.astype(jnp.int32), amax).check_support()


# ---------------------------------------------------------------------------------------------
# error paths of the functional entry points


def test_error_paths(rng):
    p = npref.random_problem(rng, "fp4", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = cudnn_jax(p)
    with pytest.raises(ValueError, match=r"a_tensor: expected \(M, K, L\)"):
        gemm_amax_wrapper_sm100(a[:, :, 0], b, sfa, sfb)
    with pytest.raises(ValueError, match=r"b: expected \(N, K, L\)"):
        gemm_amax_jax_sm100(a, b[None], sfa, sfb)
    with pytest.raises(ValueError, match=r"packed FP4 c .* must be n-major"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_major="m", c_dtype="uint8")
    with pytest.raises(ValueError, match=r"c_major must be 'n' or 'm', got 'k'"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_major="k")
    with pytest.raises(TypeError, match=r"c_dtype: 'float5' is not a dtype"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_dtype="float5")
    with pytest.raises(NotImplementedError, match=r"stream: JAX arrays run on XLA's own stream"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=7)
    np.testing.assert_array_equal(
        np.asarray(gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=FakeCUstream(0))[0]),
        np.asarray(gemm_amax_wrapper_sm100(a, b, sfa, sfb)[0]),
    )
    with pytest.raises(ValueError, match=r"sfa: expected the physical 128x4 layout"):
        gemm_amax_wrapper_sm100(a, b, sfa[..., :2], sfb)
    # no array where one is needed: a TypeError naming it, not an AttributeError
    with pytest.raises(TypeError, match=r"sfa_tensor: expected scales .* got None"):
        gemm_amax_wrapper_sm100(a, b, None, sfb)
    with pytest.raises(TypeError, match=r"sfb: expected scales .* got None"):
        gemm_amax_jax_sm100(a, b, sfa, None)
    with pytest.raises(TypeError, match=r"a: expected an array \(M, K, L\), got object"):
        gemm_amax_jax_sm100(object(), b, sfa, sfb)
    with pytest.raises(TypeError, match=r"sample_b: expected an array \(N, K, L\), got None"):
        GemmAmaxSm100(a, None, sfa, sfb, jnp.zeros((128, 64, 1)), jnp.zeros((1, 1, 1))).check_support()
    with pytest.raises(ValueError, match=r"mma_tiler_mn: TILE_N must be one of"):
        gemm_amax_jax_sm100(a, b, sfa, sfb, mma_tiler_mn=[128, 64])
    with pytest.raises(NotImplementedError, match=r"FP4 a/b with TILE_N = 256 requires K > 128"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, mma_tiler_mn=(128, 256))


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        ({"sf_vec_size": [32]}, TypeError, r"sf_vec_size must be an int, got \[32\] \(list\)"),
        ({"sf_vec_size": 32.0}, TypeError, r"sf_vec_size must be an int, got 32.0 \(float\)"),
        ({"c_major": ["n"]}, ValueError, r"c_major must be 'n' or 'm', got \['n'\]"),
        ({"mma_tiler_mn": [[128], [128]]}, TypeError, r"mma_tiler_mn\[0\] must be an int, got \[128\] \(list\)"),
        ({"mma_tiler_mn": (128.5, 128)}, TypeError, r"mma_tiler_mn\[0\] must be an int, got 128.5 \(float\)"),
        ({"cluster_shape_mn": [[1], [1]]}, TypeError, r"cluster_shape_mn\[0\] must be an int, got \[1\]"),
        ({"cluster_shape_mn": (1,)}, ValueError, r"cluster_shape_mn must be a pair of ints, got \(1,\)"),
    ],
)
def test_static_arguments_are_validated_before_jit(rng, kw, exc, match):
    # Unhashable or non-integer values get the library's message, not jax.jit's "non-hashable
    # static argument", and are never truncated.
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    args = cudnn_jax(p)
    with pytest.raises(exc, match=match):
        gemm_amax_wrapper_sm100(*args, **kw)
    with pytest.raises(exc, match=match):
        gemm_amax_jax_sm100(*args, **kw)
    if "c_major" not in kw:
        with pytest.raises(exc, match=match):
            GemmAmaxSm100(*args, jnp.zeros((128, 64, 1)), jnp.zeros((1, 1, 1)), **kw).check_support()
    tiler = (np.int64(128), np.int32(128))  # numpy integers are ints
    c, amax = gemm_amax_wrapper_sm100(*args, sf_vec_size=np.int64(32), mma_tiler_mn=tiler)
    check_cudnn_c(c, amax, p, "float32")


def test_torch_is_not_imported():
    code = "import jax_gemm_amax, sys; assert 'torch' not in sys.modules"
    # cwd: not the repository root, whose source tree would shadow the installed package.
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# torch tensors (skipped without torch)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def n2t(torch, x):
    """numpy (ml_dtypes included) -> torch CPU tensor, same bytes, in torch's (aligned) memory."""
    if x.dtype.itemsize == 1 and x.dtype not in (np.uint8, np.int8):
        return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).clone().view(getattr(torch, x.dtype.name))
    return torch.from_numpy(np.ascontiguousarray(x)).clone()


def t2np(torch, t):
    t = t.detach().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name == "float4_e2m1fn_x2":
        return t.view(torch.uint8).numpy()
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.element_size() == 1 and name not in ("uint8", "int8"):
        return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, name))
    return t.numpy()


def cudnn_torch(torch, p, major="k", packed_dtype=None):
    """The cuDNN frontend's torch tensors: A (M, K, L) with strides (K, 1, M·K) (k-major) or (1, M, M·K)
    (m-major), scales as the logical view of a physical allocation."""

    def operand(x):  # x: (L, rows, Kb)
        if major == "k":
            t = n2t(torch, x).permute(1, 2, 0)
        else:
            t = n2t(torch, np.swapaxes(x, 1, 2)).permute(2, 1, 0)
        return t.view(packed_dtype) if packed_dtype is not None else t

    sfa, sfb = (n2t(torch, s).permute(*LOGICAL) for s in (p.sfa, p.sfb))
    return operand(p.a), operand(p.b), sfa, sfb


def test_cudnn_torch_wrapper_snippet(rng, torch):
    from jax_gemm_amax import gemm_amax_wrapper_sm100  # was: from cudnn import gemm_amax_wrapper_sm100

    p = npref.random_problem(rng, "e4m3", E8M0, 32, 256, 128, 256, batch=2)
    a_tensor, b_tensor, sfa_tensor, sfb_tensor = cudnn_torch(torch, p)
    assert a_tensor.stride() == (256, 1, 256 * 256) and sfa_tensor.shape == (32, 4, 2, 4, 2, 2)
    result = gemm_amax_wrapper_sm100(
        a_tensor,
        b_tensor,
        sfa_tensor,
        sfb_tensor,
        c_major="n",
        c_dtype=torch.float32,
        acc_dtype=torch.float32,
        mma_tiler_mn=(128, 128),
        cluster_shape_mn=(1, 1),
        sf_vec_size=32,
        stream=None,
    )
    c, amax = result
    assert c is result["c_tensor"] and amax is result["amax_tensor"]
    assert isinstance(c, torch.Tensor) and c.shape == (256, 128, 2) and c.stride() == (128, 1, 256 * 128)
    assert amax.shape == (1, 1, 1) and amax.dtype == torch.float32
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "float32")


def test_cudnn_torch_class_snippet(rng, torch):
    from jax_gemm_amax import GemmAmaxSm100  # was: from cudnn import GemmAmaxSm100

    p = npref.random_problem(rng, "e5m2", E8M0, 32, 136, 64, 128)
    a, b, sfa, sfb = cudnn_torch(torch, p, major="m")  # m-/n-major A and B, L = 1
    c = torch.empty_strided((136, 64, 1), (64, 1, 136 * 64), dtype=torch.bfloat16)
    amax = torch.full((1, 1, 1), -float("inf"))

    op = GemmAmaxSm100(
        sample_a=a,
        sample_b=b,
        sample_sfa=sfa,
        sample_sfb=sfb,
        sample_c=c,
        sample_amax=amax,
        acc_dtype=torch.float32,
        mma_tiler_mn=(128, 128),
        cluster_shape_mn=(1, 1),
        sf_vec_size=32,
    )
    assert op.check_support()
    op.compile()
    c_ptr = c.data_ptr()
    op.execute(a, b, sfa, sfb, c, amax, current_stream=None)
    assert c.data_ptr() == c_ptr  # written in place
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "bfloat16")
    # again, keyword arguments, B = 0: amax is reset, not max-accumulated
    zero_b = torch.zeros_like(b)
    op.execute(a_tensor=a, b_tensor=zero_b, sfa_tensor=sfa, sfb_tensor=sfb, c_tensor=c, amax_tensor=amax)
    assert float(amax) == 0.0 and not c.float().any()
    with pytest.raises(ValueError, match=r"a_tensor: got shape \(136, 128, 1\).*\(major 'k'\).*\(major 'm'\)"):
        op.execute(a.contiguous(), b, sfa, sfb, c, amax)  # k-major strides: not the compiled layout
    with pytest.raises(ValueError, match=r"c_tensor: expected \(136, 64, 1\) torch.bfloat16"):
        op.execute(a, b, sfa, sfb, c.float(), amax)
    with pytest.raises(TypeError, match=r"c_tensor: expected a torch tensor"):
        op.execute(a, b, sfa, sfb, jnp.zeros((136, 64, 1), jnp.bfloat16), amax)
    with pytest.raises(ValueError, match=r"current_stream: tensors on cpu have no CUDA stream"):
        op.execute(a, b, sfa, sfb, c, amax, current_stream=0)


@pytest.mark.parametrize("major", ["k", "m"])
@pytest.mark.parametrize("c_major", ["n", "m"])
def test_torch_strides_batched(rng, torch, major, c_major):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 192, 64, 128, batch=3)
    a, b, sfa, sfb = cudnn_torch(torch, p, major=major)
    c, amax = gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_major=c_major, c_dtype=torch.float16)
    assert c.shape == (192, 64, 3) and c.dtype == torch.float16
    assert c.stride() == ((64, 1, 192 * 64) if c_major == "n" else (1, 192, 192 * 64))
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "float16")


def test_torch_inputs_are_zero_copy_or_copied_correctly(rng, torch):
    from jax_gemm_amax import cudnn_compat

    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128, batch=2)
    a, b, sfa, sfb = cudnn_torch(torch, p)
    for t, op in ((a, cudnn_compat._operand(a, "a", "M")), (sfa, cudnn_compat._scales(sfa, "sfa"))):
        assert op.array.unsafe_buffer_pointer() == t.data_ptr()  # DLPack, no copy
    m_major = cudnn_torch(torch, p, major="m")[0]
    op = cudnn_compat._operand(m_major, "a", "M")
    assert op.array.unsafe_buffer_pointer() == m_major.data_ptr() and op.perm == (0, 2, 1)
    # Strides JAX cannot express (a column slice, L innermost) are copied, and the answer is right.
    wide = n2t(torch, np.concatenate([p.a, p.a], axis=-1)).permute(1, 2, 0)[:, :128]  # K stride 1, M stride 256
    l_inner = n2t(torch, np.ascontiguousarray(np.transpose(p.b, (1, 2, 0))))  # (N, K, L) C-contiguous
    assert not wide.permute(2, 0, 1).is_contiguous() and not l_inner.permute(2, 0, 1).is_contiguous()
    c, amax = gemm_amax_wrapper_sm100(wide, l_inner, sfa, sfb)
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "float32")
    # physical scales are accepted for torch too
    c2, _ = gemm_amax_wrapper_sm100(a, b, n2t(torch, p.sfa), n2t(torch, p.sfb))
    assert torch.equal(c2, c)


@pytest.mark.parametrize("container", ["float4_e2m1fn_x2", "uint8"])
def test_torch_packed_fp4(rng, torch, container):
    p = npref.random_problem(rng, "fp4", E4M3, 16, 128, 64, 256)
    a, b, sfa, sfb = cudnn_torch(torch, p, packed_dtype=getattr(torch, container))
    c_dtype = getattr(torch, container)
    c, amax = gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=16)
    assert c.shape == (128, 32, 1) and c.dtype == c_dtype
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "uint8")
    # the class: sample_c (M, N // 2, L) packed, written in place
    out = torch.zeros((128, 32, 1), dtype=torch.uint8).view(c_dtype)
    amax_out = torch.zeros(1, 1, 1)
    op = GemmAmaxSm100(a, b, sfa, sfb, out, amax_out, sf_vec_size=16)
    op.compile()
    op.execute(a, b, sfa, sfb, out, amax_out)
    assert torch.equal(out.view(torch.uint8), c.view(torch.uint8)) and torch.equal(amax_out, amax)
    with pytest.raises(ValueError, match=r"a_tensor: packed FP4 .* must be K-major"):
        gemm_amax_wrapper_sm100(a.transpose(0, 1).contiguous().transpose(0, 1), b, sfa, sfb, sf_vec_size=16)


def test_torch_int8_scales_and_error_paths(rng, torch):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = cudnn_torch(torch, p)
    c, amax = gemm_amax_wrapper_sm100(a, b, sfa.view(torch.int8), sfb.view(torch.int8))  # int8 read as e8m0
    check_cudnn_c(t2np(torch, c), t2np(torch, amax), p, "float32")
    with pytest.raises(ValueError, match=r"stream: tensors on cpu have no CUDA stream"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=0)
    with pytest.raises(TypeError, match=r"float4_e2m1fn \(one FP4 value per byte\) has no torch dtype"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, c_dtype=jnp.float4_e2m1fn)
    with pytest.raises(TypeError, match=r"b: dtype must match a"):
        gemm_amax_wrapper_sm100(a, b.view(torch.float8_e5m2), sfa, sfb)
    with pytest.raises(NotImplementedError, match=r"acc_dtype: only float32"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, acc_dtype=torch.bfloat16)
    # a torch sample_c with m-major strides selects c_major="m"
    c_m = torch.empty_strided((128, 64, 1), (1, 128, 128 * 64), dtype=torch.float8_e4m3fn)
    op = GemmAmaxSm100(a, b, sfa, sfb, c_m, torch.zeros(1, 1, 1))
    op.compile()
    op.execute(a, b, sfa, sfb, c_m, amax)
    check_cudnn_c(t2np(torch, c_m), t2np(torch, amax), p, "float8_e4m3fn")


def test_torch_cuda_current_stream(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or jax.default_backend() != "gpu":
        pytest.skip("needs a CUDA GPU for both torch and JAX")
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 64, 128)
    a, b, sfa, sfb = (t.cuda() for t in cudnn_torch(torch, p))
    current = torch.cuda.current_stream()
    c, amax = gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=current)
    c2, _ = gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=current.cuda_stream)
    check_cudnn_c(t2np(torch, c.cpu()), t2np(torch, amax.cpu()), p, "float32")
    assert torch.equal(c, c2)
    other = torch.cuda.Stream()
    with pytest.raises(NotImplementedError, match=r"only torch's current stream"):
        gemm_amax_wrapper_sm100(a, b, sfa, sfb, stream=other)
