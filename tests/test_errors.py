"""Every bad input raises at trace time with a message naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gemm_amax as jga
from jax_gemm_amax import _ffi

E8M0 = jnp.float8_e8m0fnu


def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def fp8_args(m=128, n=128, k=256, dtype=jnp.float8_e4m3fn, sf=E8M0, sfv=32, batch=None):
    lead = () if batch is None else (batch,)
    return (
        spec(lead + (m, k), dtype),
        spec(lead + (n, k), dtype),
        spec(jga.scale_shape(m, k, sfv, batch), sf),
        spec(jga.scale_shape(n, k, sfv, batch), sf),
    )


def fp4_args(m=128, n=128, k=256, sf=E8M0, sfv=32):
    return (
        spec((m, k // 2), jnp.uint8),
        spec((n, k // 2), jnp.uint8),
        spec(jga.scale_shape(m, k, sfv), sf),
        spec(jga.scale_shape(n, k, sfv), sf),
    )


def trace(args, **kw):
    return jax.eval_shape(lambda *x: jga.gemm_amax(*x, **kw), *args)


def test_valid_specs_trace():
    out = trace(fp8_args())
    assert out.c.shape == (128, 128) and out.amax.shape == ()
    out = trace(fp4_args(sf=jnp.float8_e4m3fn, sfv=16), sf_vec_size=16, c_dtype=jnp.uint8)
    assert out.c.shape == (128, 64) and out.c.dtype == jnp.uint8


@pytest.mark.parametrize(
    "args,kw,exc,match",
    [
        (fp8_args(dtype=jnp.float32), {}, TypeError, r"a: dtype must be one of .*, bfloat16, float16, got float32"),
        (
            (spec((128, 256), jnp.float8_e4m3fn), spec((128, 256), jnp.float8_e5m2)) + fp8_args()[2:],
            {},
            TypeError,
            r"b: dtype must match a",
        ),
        ((spec((4, 128, 256), jnp.float8_e4m3fn),) + fp8_args()[1:], {}, ValueError, r"b: must have a's rank"),
        ((spec((128,), jnp.float8_e4m3fn),) + fp8_args()[1:], {}, ValueError, r"a: must be \(M, K\)"),
        (
            (spec((128, 256), jnp.float8_e4m3fn), spec((128, 288), jnp.float8_e4m3fn)) + fp8_args()[2:],
            {},
            ValueError,
            r"b: K must match",
        ),
        (
            fp8_args(batch=2)[:1] + fp8_args(batch=3)[1:2] + fp8_args(batch=2)[2:],
            {},
            ValueError,
            r"b: batch L must match",
        ),
        (fp8_args(sf=jnp.float16), {}, TypeError, r"sfa: dtype must be one of"),
        (
            fp8_args()[:3] + (spec(jga.scale_shape(128, 256, 32), jnp.int8),),
            {},
            TypeError,
            r"sfb: dtype must match sfa",
        ),
        (fp8_args(), {"sf_vec_size": 64}, ValueError, r"sf_vec_size must be one of"),
        (fp8_args(), {"c_dtype": jnp.int32}, TypeError, r"c_dtype must be one of"),
        (fp8_args(), {"c_dtype": None}, TypeError, r"c_dtype: None is not a dtype"),
        (fp8_args(), {"c_dtype": "not-a-dtype"}, TypeError, r"c_dtype: 'not-a-dtype' is not a dtype"),
        (fp8_args(), {"acc_dtype": jnp.float16}, NotImplementedError, r"acc_dtype: only float32"),
        (fp8_args(), {"c_major": "k"}, ValueError, r"c_major must be 'n' or 'm'"),
        (fp4_args(sf=jnp.float8_e4m3fn, sfv=32), {}, ValueError, r"float8_e4m3fn scales require sf_vec_size=16"),
        (fp8_args(sfv=16), {"sf_vec_size": 16}, ValueError, r"fp8 a/b .* require sf_vec_size=32"),
        (fp8_args(), {"c_dtype": jnp.float4_e2m1fn}, ValueError, r"fp4 c .* requires fp4 a/b"),
        (fp8_args(), {"c_dtype": jnp.uint8}, ValueError, r"fp4 c .* requires fp4 a/b"),
        (fp8_args(k=48, sfv=32), {}, ValueError, r"K \(48\) must be a multiple of sf_vec_size"),
        (
            fp4_args(k=48, sfv=16, sf=jnp.float8_e4m3fn),
            {"sf_vec_size": 16},
            ValueError,
            r"rows must be 16-byte aligned",
        ),
        (fp8_args(n=130), {}, ValueError, r"c_dtype: rows of c must be 16-byte aligned: N=130"),
        (fp8_args(m=130), {"c_major": "m"}, ValueError, r"rows of c must be 16-byte aligned: M=130"),
        (
            fp8_args(n=136),
            {"c_dtype": jnp.float8_e4m3fn},
            ValueError,
            r"N=136 in float8_e4m3fn is not a multiple of 16",
        ),
        (
            fp8_args()[:2] + (spec((1, 3, 32, 4, 4), E8M0),) + fp8_args()[3:],
            {},
            ValueError,
            r"sfa: expected the physical 128x4 layout \(1, 2, 32, 4, 4\) for M=128, K=256, sf_vec_size=32, got \(1, 3, 32, 4, 4\)",
        ),
        (fp8_args()[:3] + (spec((2, 2, 32, 4, 4), E8M0),), {}, ValueError, r"sfb: expected the physical"),
        (fp8_args(m=0), {}, ValueError, r"at least 1"),
        (fp8_args(), {"mma_tiler_mn": (256, 128)}, NotImplementedError, r"TILE_M = 256"),
        (fp8_args(), {"mma_tiler_mn": (64, 128)}, ValueError, r"mma_tiler_mn: TILE_M must be one of"),
        (fp8_args(), {"mma_tiler_mn": (128, 64)}, ValueError, r"mma_tiler_mn: TILE_N must be one of"),
        (fp8_args(), {"mma_tiler_mn": 128}, ValueError, r"mma_tiler_mn must be a pair"),
        (
            fp8_args(),
            {"mma_tiler_mn": (128, 128, 1)},
            ValueError,
            r"mma_tiler_mn must be a pair of ints, got \(128, 128, 1\)",
        ),
        (
            fp8_args(),
            {"mma_tiler_mn": (128.5, 128)},
            TypeError,
            r"mma_tiler_mn\[0\] must be an int, got 128.5 \(float\)",
        ),
        (
            fp8_args(),
            {"mma_tiler_mn": (128, 128.0)},
            TypeError,
            r"mma_tiler_mn\[1\] must be an int, got 128.0 \(float\)",
        ),
        (fp8_args(), {"cluster_shape_mn": (1, 1.5)}, TypeError, r"cluster_shape_mn\[1\] must be an int, got 1.5"),
        (fp8_args(), {"sf_vec_size": 32.0}, TypeError, r"sf_vec_size must be an int, got 32.0 \(float\)"),
        (fp8_args(), {"sf_vec_size": True}, TypeError, r"sf_vec_size must be an int, got True"),
        (fp8_args(), {"sf_vec_size": [32]}, TypeError, r"sf_vec_size must be an int, got \[32\] \(list\)"),
        (fp8_args(), {"c_major": ["n"]}, ValueError, r"c_major must be 'n' or 'm', got \['n'\]"),
        (fp8_args(), {"cluster_shape_mn": (3, 1)}, ValueError, r"cluster_shape_mn: CLUSTER_M must be one of"),
        (fp8_args(), {"cluster_shape_mn": (1, 8)}, ValueError, r"cluster_shape_mn: CLUSTER_N must be one of"),
        (fp4_args(k=128), {"mma_tiler_mn": (128, 256)}, NotImplementedError, r"TILE_N = 256 requires K > 128"),
        (
            fp4_args(sf=jnp.float8_e4m3fn, sfv=16),
            {"sf_vec_size": 16, "mma_tiler_mn": (128, 256)},
            NotImplementedError,
            r"\(128, 256\) with sf_vec_size=16",
        ),
    ],
)
def test_bad_input_raises_at_trace_time(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        trace(args, **kw)


@pytest.mark.parametrize("which", ["sfa", "sfb"])
def test_logical_view_with_wrong_batch_for_2d_operand(which):
    a, b, sfa, sfb = fp8_args()
    logical = spec((32, 4, 1, 4, 2, 2), E8M0)  # L = 2 but a is 2-D
    args = (a, b, logical, sfb) if which == "sfa" else (a, b, sfa, logical)
    with pytest.raises(
        ValueError, match=rf"^{which}: the logical view \(32, 4, 1, 4, 2, 2\) has L=2, but the operand is 2-D"
    ):
        trace(args)


def test_numpy_integers_are_ints():
    out = trace(
        fp8_args(),
        sf_vec_size=np.int64(32),
        mma_tiler_mn=(np.int32(128), np.int64(256)),
        cluster_shape_mn=np.array([2, 1]),
    )
    assert out.c.shape == (128, 128)


def test_fp8_in_fp8_out_which_cudnn_disables():
    out = trace(fp8_args(), c_dtype=jnp.float8_e5m2)
    assert out.c.dtype == jnp.float8_e5m2


def test_torch_like_dtype_names_are_accepted():
    class FakeTorchDtype:  # torch.bfloat16 prints as "torch.bfloat16"; we never import torch
        __module__ = "torch"

        def __str__(self):
            return "torch.bfloat16"

    out = trace(fp8_args(), c_dtype=FakeTorchDtype())
    assert out.c.dtype == jnp.bfloat16
    out = trace(fp8_args(), c_dtype="float16")
    assert out.c.dtype == jnp.float16


def test_primitive_rejects_a_malformed_direct_bind():
    a, b, sfa, sfb = fp8_args(batch=1)
    bad_sfb = spec((1, 3, 2, 32, 4, 4), E8M0)
    with pytest.raises(ValueError, match=r"sfb: expected"):
        jax.eval_shape(
            lambda *x: jga.gemm_amax_p.bind(
                *x, c_dtype=np.dtype(np.float32), sf_vec_size=32, tile_m=128, tile_n=128, cluster_m=1, cluster_n=1
            ),
            a,
            b,
            sfa,
            bad_sfb,
        )


@pytest.mark.parametrize(
    "k, sf_vec_size, c_dtype, message",
    [
        (48, 32, jnp.float32, "K must be a multiple of sf_vec_size"),  # K = 1.5 scale groups
        (64, 16, jnp.float32, "fp8 a/b require sf_vec_size=32"),
        (64, 32, jnp.uint8, "fp4 c requires fp4 a/b"),
    ],
)
def test_ffi_handler_rejects_a_call_that_breaks_the_contract(k, sf_vec_size, c_dtype, message):
    """The C++ rules (ffi/common) answer a custom call that bypasses the Python checks."""
    m = n = 128
    groups = -(-k // sf_vec_size)
    cpu = jax.devices("cpu")[0]  # the CPU target, also where a GPU is the default backend
    a = jax.device_put(jnp.ones((1, m, k), jnp.float8_e4m3fn), cpu)
    b = jax.device_put(jnp.ones((1, n, k), jnp.float8_e4m3fn), cpu)
    sf = jax.device_put(jnp.ones((1, 1, -(-groups // 4), 32, 4, 4), E8M0), cpu)
    call = jax.ffi.ffi_call(
        "jax_gemm_amax_cpu",
        (jax.ShapeDtypeStruct((1, m, n), c_dtype), jax.ShapeDtypeStruct((1,), jnp.float32)),
    )
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(
            call(
                a,
                b,
                sf,
                sf,
                sf_vec_size=np.int32(sf_vec_size),
                tile_m=np.int32(128),
                tile_n=np.int32(128),
                cluster_m=np.int32(1),
                cluster_n=np.int32(1),
            )
        )


@pytest.mark.parametrize(
    "operand,scale,match",
    [
        (np.float16, E8M0, r"operand_dtype must be float8_e4m3fn, .*, got 'float16'"),
        (jnp.float8_e4m3fn, np.float32, r"scale_dtype must be float8_e8m0fnu, .*, got 'float32'"),
        (jnp.float8_e4m3fn, jnp.float4_e2m1fn, r"scale_dtype must be .*, got 'float4_e2m1fn'"),  # packed operands only
    ],
)
def test_workspace_query_names_a_bad_dtype(operand, scale, match):
    # The extension parses the names (one table for the handlers and the lowering's question).
    with pytest.raises(ValueError, match=match):
        _ffi.workspace_bytes(1, 256, 256, 256, operand, scale, 32)


@pytest.mark.parametrize("fmt", sorted(jga.FORMATS))
def test_workspace_query_takes_every_format(fmt):
    f = jga.FORMATS[fmt]
    for operand in (f.value_dtype, jnp.uint8) if f.value_dtype == jnp.float4_e2m1fn else (f.value_dtype,):
        for scale in (f.scale_dtype, jnp.uint8, jnp.int8) if f.scale_dtype == E8M0 else (f.scale_dtype,):
            assert _ffi.workspace_bytes(1, 256, 512, 1024, operand, scale, f.sf_vec_size) >= 0


def test_quantize_errors():
    with pytest.raises(ValueError, match=r"fmt must be one of"):
        jga.quantize(jnp.ones((4, 32)), "fp8")
    with pytest.raises(ValueError, match=r"K=48 must be a multiple of 32"):
        jga.quantize(jnp.ones((4, 48)), "mxfp8_e4m3")
    with pytest.raises(TypeError, match=r"x: must be a floating array"):
        jga.quantize(jnp.ones((4, 32), jnp.int32))
    with pytest.raises(ValueError, match=r"x: must be \(rows, K\)"):
        jga.quantize(jnp.ones((32,)))
    with pytest.raises(TypeError, match=r"axis must be an int, got 'pair'"):
        jga.quantize(jnp.ones((32, 32)), axis="pair")
    with pytest.raises(ValueError, match=r"fmt must be one of .*, got \['nvfp4'\]"):
        jga.quantize(jnp.ones((32, 32)), ["nvfp4"])
    with pytest.raises(
        ValueError, match=r"scales: expected the physical 128x4 layout \(1, 1, 32, 4, 4\) for rows=4, K=32"
    ):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), jnp.ones((1, 2, 32, 4, 4), E8M0))


def test_dequantize_checks_dtypes():
    sf = jnp.ones((1, 1, 32, 4, 4), E8M0)
    with pytest.raises(
        TypeError, match=r"q: dtype must be one of float8_e4m3fn, float8_e5m2, float4_e2m1fn, uint8, got float32"
    ):
        jga.dequantize(jnp.ones((4, 32), jnp.float32), sf)
    with pytest.raises(TypeError, match=r"scales: dtype must be one of float8_e8m0fnu, .*, got float32"):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), jnp.ones((1, 1, 32, 4, 4), jnp.float32))
    with pytest.raises(
        ValueError, match=r"scales: expected the physical 128x4 layout \(1, 1, 32, 4, 4\) for rows=4, K=32"
    ):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), jnp.ones((4, 1), E8M0))  # plain, not physical
    with pytest.raises(TypeError, match=r"sf_vec_size must be an int, got 32.0"):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), sf, 32.0)
    with pytest.raises(ValueError, match=r"sf_vec_size must be one of \(16, 32\), got 8"):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), sf, 8)
    # Block formats there are not: the scale shapes alone match for K <= 64.
    with pytest.raises(ValueError, match=r"scales: float8_e4m3fn scales require sf_vec_size=16"):
        jga.dequantize(jnp.ones((4, 32), jnp.uint8), jnp.ones((1, 1, 32, 4, 4), jnp.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"sf_vec_size: fp8 q \(float8_e4m3fn\) require sf_vec_size=32, got 16"):
        jga.dequantize(jnp.ones((4, 32), jnp.float8_e4m3fn), sf, 16)


@pytest.mark.parametrize("batched", [False, True])
def test_plain_from_physical_rejects_more_rows_or_groups_than_it_holds(batched):
    lead = (3,) if batched else ()
    phys = jnp.ones(lead + (2, 1, 32, 4, 4), E8M0)  # 256 rows, 4 groups
    shape = r"\(" + ", ".join(map(str, phys.shape)) + r"\)"
    assert jga.plain_from_physical(phys, 256, 4).shape == lead + (256, 4)  # exactly full: fine
    with pytest.raises(
        ValueError, match=rf"rows: physical scales of shape {shape} hold at most 256 rows \(2 blocks of 128\), got 257"
    ):
        jga.plain_from_physical(phys, 257, 4)
    with pytest.raises(
        ValueError, match=rf"groups: physical scales of shape {shape} hold at most 4 groups \(1 block of 4\), got 5"
    ):
        jga.plain_from_physical(phys, 10, 5)
    with pytest.raises(ValueError, match=r"rows must be at least 0, got -1"):
        jga.plain_from_physical(phys, -1, 4)
    with pytest.raises(TypeError, match=r"groups must be an int, got 4.0"):
        jga.plain_from_physical(phys, 10, 4.0)


def test_layout_converters_name_the_argument():
    with pytest.raises(ValueError, match=r"plain: expected \(MN, G\) or \(L, MN, G\) scales, got shape \(4,\)"):
        jga.physical_from_plain(jnp.ones((4,), jnp.uint8))
    with pytest.raises(ValueError, match=r"physical: expected the physical layout .*, got shape \(1, 2, 3, 4\)"):
        jga.logical_from_physical(jnp.ones((1, 2, 3, 4), jnp.uint8))
    with pytest.raises(ValueError, match=r"physical: expected the physical layout .*, got shape \(1, 2, 32, 4\)"):
        jga.plain_from_physical(jnp.ones((1, 2, 32, 4), jnp.uint8), 1, 1)
    with pytest.raises(
        ValueError, match=r"logical: expected the logical view \(32, 4, MN', 4, G', L\), got shape \(1, 2, 32, 4, 4\)"
    ):
        jga.physical_from_logical(jnp.ones((1, 2, 32, 4, 4), jnp.uint8))
    with pytest.raises(ValueError, match=r"sf_vec_size must be one of \(16, 32\), got 0"):
        jga.scale_shape(128, 256, 0)
    with pytest.raises(TypeError, match=r"sf_vec_size must be an int, got 32.0"):
        jga.scale_shape(128, 256, 32.0)
    with pytest.raises(ValueError, match=r"rows must be at least 0, got -5"):
        jga.scale_shape(-5, 256, 32)
    with pytest.raises(ValueError, match=r"row must be at least 0, got -1"):
        jga.layout.scale_index(-1, 0)
    assert jga.physical_from_plain([[1, 2]]).shape == jga.scale_shape(1, 64, 32)  # any array-like
    with pytest.raises(TypeError, match=r"k must be an int, got 256.0"):
        jga.scale_shape(128, 256.0, 32)
    with pytest.raises(ValueError, match=r"batch must be at least 0, got -1"):
        jga.scale_shape(128, 256, 32, -1)
