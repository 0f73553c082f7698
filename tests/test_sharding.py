"""Sharded gemm_amax on a device mesh: (4, 2) over 8 virtual CPU devices in CI; whatever the
default backend has elsewhere (one GPU: a (1, 1) mesh, where the rule must still lower and run)."""

import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import npref
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_gemm_amax as jga

E8M0 = ml_dtypes.float8_e8m0fnu


def _mesh():
    """(4, 2) on 8+ devices, (2, 1) on 2+, else (1, 1); JGA_TEST_MESH="1x2" asks for another shape
    (on 2 GPUs, run once as 2x1 and once as 1x2 so that every dim is split over a real device)."""
    devices = jax.devices()
    shape = (4, 2) if len(devices) >= 8 else (2, 1) if len(devices) >= 2 else (1, 1)
    if os.environ.get("JGA_TEST_MESH"):
        shape = tuple(int(v) for v in os.environ["JGA_TEST_MESH"].split("x"))
        assert len(shape) == 2 and shape[0] * shape[1] <= len(devices), (shape, len(devices))
    return Mesh(np.array(devices[: shape[0] * shape[1]]).reshape(shape), ("x", "y"))


MESH = _mesh()
SX, SY = MESH.shape["x"], MESH.shape["y"]


def _put(x, *spec):
    return jax.device_put(x, NamedSharding(MESH, P(*spec)))


def _scale_spec(l, rows, k):
    return (l, rows, k, None, None, None)


def _run(p, specs, c_dtype="float32", out_spec=None, scale_specs=None):
    a_spec, b_spec = specs
    sfa_spec, sfb_spec = scale_specs or (_scale_spec(*a_spec), _scale_spec(*b_spec))
    args = (_put(p.a, *a_spec), _put(p.b, *b_spec), _put(p.sfa, *sfa_spec), _put(p.sfb, *sfb_spec))
    f = lambda *x: jga.gemm_amax(*x, c_dtype=c_dtype, sf_vec_size=p.sfv)
    kw = {}
    if out_spec is not None:
        kw["out_shardings"] = jga.GemmAmaxResult(NamedSharding(MESH, P(*out_spec)), NamedSharding(MESH, P()))
    jitted = jax.jit(f, **kw)
    result = jitted(*args)
    hlo = jitted.lower(*args).compile().as_text()
    return result, hlo


def _unsharded(p, c_dtype="float32"):
    with jax.default_device(jax.devices()[0]):
        return jga.gemm_amax(p.a, p.b, p.sfa, p.sfb, c_dtype=c_dtype, sf_vec_size=p.sfv)


def _custom_call_operand_shapes(hlo):
    """Shapes of the operands of the FFI custom call in compiled HLO."""
    calls = [line for line in hlo.splitlines() if "jax_gemm_amax_" in line and "custom-call" in line]
    assert calls, "the gemm_amax custom call is missing from the compiled HLO"
    return calls


def _assert_same(result, ref, exact=True):
    c, ref_c = np.asarray(result.c).astype(np.float32), np.asarray(ref.c).astype(np.float32)
    if exact:
        np.testing.assert_array_equal(c, ref_c)
        assert float(result.amax) == float(ref.amax)
    else:  # a K split sums partial products in another order: rounded C may move by one ulp
        rtol = {np.dtype(np.float32): 1e-5, np.dtype(jnp.bfloat16): 2.0**-7}[np.dtype(ref.c.dtype)]
        np.testing.assert_allclose(c, ref_c, rtol=rtol, atol=1e-4 * float(ref.amax))
        np.testing.assert_allclose(float(result.amax), float(ref.amax), rtol=1e-5)


@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16"])
def test_m_and_n_sharded_without_communication(rng, c_dtype):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128 * SX, 128 * SY, 256, batch=2)
    result, hlo = _run(p, ((None, "x", None), (None, "y", None)), c_dtype)
    _assert_same(result, _unsharded(p, c_dtype))
    assert result.c.sharding.is_equivalent_to(NamedSharding(MESH, P(None, "x", "y")), 3), result.c.sharding
    call = _custom_call_operand_shapes(hlo)[0]
    assert "[2,128,256]" in call, call  # local M (and N) blocks only
    assert "all-gather" not in hlo


def test_batch_sharded(rng):
    p = npref.random_problem(rng, "fp4", E8M0, 32, 200, 96, 256, batch=2 * SX)
    result, hlo = _run(p, (("x", None, None), ("x", None, None)), "uint8")
    _assert_same(result, _unsharded(p, "uint8"))
    assert "[2,200,128]" in _custom_call_operand_shapes(hlo)[0]
    assert "all-gather" not in hlo


@pytest.mark.parametrize("c_dtype", ["float32", "bfloat16"])
def test_k_sharded_amax_is_of_the_full_sum(rng, c_dtype):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 128, 128 * SX, batch=1)
    # The second half of K negates the first: every shard's partial amax is large while the full
    # sum cancels (to fp32 rounding of the partial sums).
    half = p.a.shape[2] // 2
    p.a[:, :, half:] = p.a[:, :, :half]
    p.b[:, :, half:] = (-p.b[:, :, :half].astype(np.float32)).astype(p.b.dtype)
    p.sfa.view(np.uint8)[:] = np.where(p.sfa.view(np.uint8) > 0, 127, 0)
    p.sfb.view(np.uint8)[:] = np.where(p.sfb.view(np.uint8) > 0, 127, 0)
    _, abssum, _ = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, p.sfv)
    partial_amax = np.max(abssum) / 2  # scale of one half's |sum|
    result, hlo = _run(p, ((None, None, "x"), (None, None, "x")), c_dtype)
    assert float(result.amax) < 1e-5 * partial_amax
    np.testing.assert_allclose(np.asarray(result.c).astype(np.float32), 0.0, atol=1e-5 * partial_amax)
    if SX > 1:
        assert "all-reduce" in hlo and "all-gather" not in hlo
        assert "[1,128,128]" in _custom_call_operand_shapes(hlo)[0]  # local K slice


def test_k_sharded_amax_keeps_a_nan(rng):
    """A NaN code in one K shard: its row of C is NaN after the sum, and so is amax (taken over the
    summed C, 128 x 128 elements: XLA's CPU float max of 4096+ can drop a NaN)."""
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128, 128, 128 * SX, batch=1)
    p.a.view(np.uint8)[0, 5, 7] = 0x7F
    result, _ = _run(p, ((None, None, "x"), (None, None, "x")), "float32")
    c = np.asarray(result.c)
    assert np.isnan(c[0, 5]).all() and not np.isnan(np.delete(c, 5, axis=1)).any()
    assert np.isnan(float(result.amax))


def test_k_sharded_with_m_sharded_output_reduce_scatters(rng):
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128 * SX, 64, 128 * SX, batch=1)
    result, hlo = _run(p, ((None, None, "x"), (None, None, "x")), "float32", out_spec=(None, "x", None))
    _assert_same(result, _unsharded(p), exact=False)
    if SX > 1:
        assert "reduce-scatter" in hlo
        assert "all-gather" not in hlo


def test_mixed_batch_m_and_k(rng):
    p = npref.random_problem(rng, "fp4", ml_dtypes.float8_e4m3fn, 16, 128 * SY, 96, 64 * SX, batch=2)
    result, _ = _run(p, ((None, "y", "x"), (None, None, "x")), "bfloat16")
    _assert_same(result, _unsharded(p, "bfloat16"), exact=False)


def test_unaligned_m_is_replicated_not_split_inside_a_scale_block(rng):
    # M = 200 cannot split on 128-row scale blocks: the rule must keep it whole, still correct.
    p = npref.random_problem(rng, "e5m2", E8M0, 32, 200, 64, 256)
    result, _ = _run(p, ((None, "x", None), (None, None, None)), "float32", scale_specs=((), ()))
    _assert_same(result, _unsharded(p))


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_shard_map_with_user_pmax(rng, nan):
    """The README's shard_map pattern; with a NaN in one shard's C, amax is NaN (a float pmax
    would return the other shards' max)."""
    p = npref.random_problem(rng, "e4m3", E8M0, 32, 128 * SX, 64, 128, batch=1)
    if nan:
        p.a.view(np.uint8)[0, 0, 3] = 0x7F  # e4m3 NaN in A's first row: NaN in C's first row, on the first shard

    @functools.partial(
        jax.shard_map,
        mesh=MESH,
        in_specs=(P(None, "x"), P(), P(None, "x"), P()),
        out_specs=(P(None, "x"), P()),
    )
    def local(a, b, sfa, sfb):
        c, amax = jga.gemm_amax(a, b, sfa, sfb)
        return c, jga.pmax_amax(amax, "x")

    c, amax = jax.jit(local)(p.a, p.b, p.sfa, p.sfb)
    ref = _unsharded(p)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(ref.c))
    assert np.isnan(float(ref.amax)) == nan
    np.testing.assert_array_equal(np.asarray(amax), np.asarray(ref.amax))


def test_vmap_over_a_sharded_call(rng):
    ps = [npref.random_problem(rng, "e4m3", E8M0, 32, 128 * SX, 64, 128) for _ in range(2)]
    a = _put(np.stack([p.a[0] for p in ps]), None, "x", None)
    b = np.stack([p.b[0] for p in ps])
    sfa = _put(np.stack([p.sfa[0] for p in ps]), None, "x", None, None, None, None)
    sfb = np.stack([p.sfb[0] for p in ps])
    c, amax = jax.jit(jax.vmap(jga.gemm_amax))(a, b, sfa, sfb)
    for i, p in enumerate(ps):
        ref = _unsharded(p)
        np.testing.assert_array_equal(np.asarray(c[i]), np.asarray(ref.c)[0] if ref.c.ndim == 3 else np.asarray(ref.c))
        assert float(amax[i]) == float(ref.amax)


# ---------------------------------------------------------------------------------------------
# Explicit sharding (sharding in types): the library's own reshapes must not trip over it.


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("spec", [("x", "y"), ("x", None), (None, "y")], ids=["rows+K", "rows", "K"])
def test_explicit_mesh_quantize_gemm_dequantize(rng, fmt, spec):
    """quantize -> gemm_amax -> dequantize on arrays sharded over an ``AxisType.Explicit`` mesh give
    the unsharded results. 256 rows over 4 shards is 64 rows each: the 128-row scale blocks straddle
    shards, so the scale layout has to gather (reshape alone is refused under explicit sharding)."""
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is None or not hasattr(jax, "set_mesh"):
        pytest.skip("this jax has no explicit sharding")
    mesh = jax.make_mesh((SX, SY), ("x", "y"), axis_types=(axis_type.Explicit, axis_type.Explicit))
    sfv = 16 if fmt == "nvfp4" else 32
    xa = rng.normal(size=(256, 512)).astype(np.float32)
    xb = rng.normal(size=(384, 512)).astype(np.float32)
    with jax.default_device(jax.devices()[0]):
        ref_qa, ref_sa = jga.quantize(xa, fmt)
        ref_qb, ref_sb = jga.quantize(xb, fmt)
        ref_c, ref_amax = jga.gemm_amax(ref_qa, ref_qb, ref_sa, ref_sb, c_dtype=jnp.float32, sf_vec_size=sfv)
        ref_da = jga.dequantize(ref_qa, ref_sa, sfv)

    def as_bytes(x):
        return np.asarray(x).view(np.uint8)

    with jax.set_mesh(mesh):
        a = jax.device_put(xa, NamedSharding(mesh, P(*spec)))
        b = jax.device_put(xb, NamedSharding(mesh, P(*spec)))
        quantize = jax.jit(lambda x: jga.quantize(x, fmt))
        qa, sa = quantize(a)
        qb, sb = quantize(b)
        da = jax.jit(lambda q, s: jga.dequantize(q, s, sfv))(qa, sa)
        c, amax = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.float32, sf_vec_size=sfv))(qa, qb, sa, sb)
    assert qa.sharding.spec == P(*spec)  # the data stays sharded
    np.testing.assert_array_equal(as_bytes(qa), as_bytes(ref_qa))
    np.testing.assert_array_equal(as_bytes(sa), as_bytes(ref_sa))
    np.testing.assert_array_equal(np.asarray(da), np.asarray(ref_da))
    # K-sharded runs sum the partial products in another order.
    np.testing.assert_allclose(np.asarray(c), np.asarray(ref_c), rtol=1e-5, atol=1e-4 * float(ref_amax))
    assert abs(float(amax) - float(ref_amax)) <= 1e-5 * float(ref_amax)


# ---------------------------------------------------------------------------------------------
# A dim sharded over more shards than it has scale blocks, or over a count that does not divide
# them: the rule replicates it rather than split a 128-row (4-group) block, and the call runs.

# (dim, devices, scale blocks along it): fewer blocks than devices, as many, a count the device
# number does not divide. An L block is one batch item.
FEW_BLOCKS = [
    (dim, devices, blocks) for dim in "MNK" for devices, blocks in [(4, 2), (4, 4), (4, 6), (8, 4), (8, 8), (8, 12)]
] + [("L", 4, 2), ("L", 8, 8), ("L", 8, 12)]
FEW_BLOCKS_EXPLICIT = [("M", 4, 6), ("N", 4, 2), ("N", 8, 4), ("M", 8, 12)]


def _ids(cases):
    return [f"{d}-{n}dev-{b}blocks" for d, n, b in cases]


def _few_blocks_problem(rng, dim, devices, blocks):
    """Float inputs x (L, M, K), w (L, N, K) with `blocks` scale blocks along `dim`, and the
    specs that split `dim` over a 1-D mesh axis "d"."""
    if len(jax.devices()) < devices:
        pytest.skip(f"needs {devices} devices")
    size = {"L": 1, "M": 64, "N": 64, "K": 128}
    size[dim] = blocks * {"L": 1, "M": 128, "N": 128, "K": 4 * 32}[dim]
    x = rng.normal(size=(size["L"], size["M"], size["K"])).astype(np.float32)
    w = rng.normal(size=(size["L"], size["N"], size["K"])).astype(np.float32)
    specs = {
        "L": (("d",), ("d",)),
        "M": ((None, "d"), ()),
        "N": ((), (None, "d")),
        "K": ((None, None, "d"), (None, None, "d")),
    }[dim]
    return x, w, specs, size


def _quantize_and_gemm(x, w):
    qa, sfa = jga.quantize(x, "mxfp8_e4m3")
    qb, sfb = jga.quantize(w, "mxfp8_e4m3")
    return jga.gemm_amax(qa, qb, sfa, sfb, c_dtype=jnp.float32)


def _local_sizes(size, dim, devices, blocks):
    """Each device's (L, M, N, K) for a and for b: `dim` split where every shard owns whole scale
    blocks, else whole."""
    split = size[dim] // devices if blocks % devices == 0 else size[dim]
    return dict(size, **({dim: split} if dim in "LMK" else {})), dict(size, **({dim: split} if dim in "LNK" else {}))


def _check_few_blocks(compiled, result, x, w, a, b):
    """C against the float64 oracle of the operands quantized on one device; a and b: the
    (L, M, N, K) sizes each device's kernel call must get."""
    c, amax = result
    with jax.default_device(jax.devices()[0]):
        operands = (*jga.quantize(x, "mxfp8_e4m3"), *jga.quantize(w, "mxfp8_e4m3"))
    ref, abssum, ref_amax = npref.gemm_amax_f64(*(np.asarray(operands[i]) for i in (0, 2, 1, 3)), 32)
    npref.assert_c_close(np.asarray(c), "float32", ref, abssum)
    np.testing.assert_allclose(float(amax), np.max(ref_amax), rtol=1e-5)

    call = _custom_call_operand_shapes(compiled.as_text())[0]
    layouts = call.split("operand_layout_constraints={")[1]
    local = [tuple(int(v) for v in dims.split(",")) for dims in re.findall(r"\[([0-9,]+)\]", layouts)[:4]]
    scales = lambda batch, rows, k: (batch, -(-rows // 128), -(-k // (4 * 32)), 32, 4, 4)
    assert local == [
        (a["L"], a["M"], a["K"]),
        (b["L"], b["N"], b["K"]),
        scales(a["L"], a["M"], a["K"]),
        scales(b["L"], b["N"], b["K"]),
    ], call


@pytest.mark.parametrize("dim,devices,blocks", FEW_BLOCKS, ids=_ids(FEW_BLOCKS))
def test_dim_over_fewer_or_indivisible_scale_blocks(rng, dim, devices, blocks):
    """quantize and gemm_amax in one jit, the float inputs constrained to split one dim (a
    constraint, like propagation, may split a dim unevenly: L = 2 over 4 devices)."""
    x, w, (x_spec, w_spec), size = _few_blocks_problem(rng, dim, devices, blocks)
    mesh = Mesh(np.array(jax.devices()[:devices]), ("d",))

    def f(x, w):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*x_spec)))
        w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P(*w_spec)))
        return _quantize_and_gemm(x, w)

    compiled = jax.jit(f).lower(x, w).compile()
    _check_few_blocks(compiled, compiled(x, w), x, w, *_local_sizes(size, dim, devices, blocks))


@pytest.mark.parametrize("dim,devices,blocks", FEW_BLOCKS_EXPLICIT, ids=_ids(FEW_BLOCKS_EXPLICIT))
def test_explicit_mesh_dim_over_fewer_or_indivisible_scale_blocks(rng, dim, devices, blocks):
    if not hasattr(jax.sharding, "AxisType") or not hasattr(jax, "set_mesh"):
        pytest.skip("this jax has no explicit sharding")
    x, w, (x_spec, w_spec), size = _few_blocks_problem(rng, dim, devices, blocks)
    explicit = (jax.sharding.AxisType.Explicit,)
    mesh = jax.make_mesh((devices,), ("d",), axis_types=explicit, devices=jax.devices()[:devices])
    with jax.set_mesh(mesh):
        args = (jax.device_put(x, NamedSharding(mesh, P(*x_spec))), jax.device_put(w, NamedSharding(mesh, P(*w_spec))))
        compiled = jax.jit(_quantize_and_gemm).lower(*args).compile()
        result = compiled(*args)
    _check_few_blocks(compiled, result, x, w, *_local_sizes(size, dim, devices, blocks))


@pytest.mark.parametrize(
    "shape,a_spec,b_spec",
    [
        ((256, 128, 512), ("d", None), (None, None)),  # M: 2 scale blocks of rows over 4 devices
        ((128, 128, 256), (None, "d"), (None, "d")),  # K: 2 scale blocks of K over 4 devices
        ((128, 256, 256), (None, None), ("d", None)),  # N: 2 scale blocks of rows over 4 devices
    ],
    ids=["M", "K", "N"],
)
def test_already_quantized_operands_over_fewer_scale_blocks(rng, shape, a_spec, b_spec):
    """Quantized operands placed by the caller (device_put, scales replicated) on 4 devices with
    fewer scale blocks along the split dim than devices: the call runs (the dim whole) and C is
    right."""
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    m, n, k = shape
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    a, b = npref.random_operand(rng, 1, m, k, "e4m3"), npref.random_operand(rng, 1, n, k, "e4m3")
    sfa, sfb = (npref.random_scales(rng, 1, rows, k, 32, E8M0) for rows in (m, n))
    put = lambda x, *spec: jax.device_put(x[0], NamedSharding(mesh, P(*spec)))
    args = (put(a, *a_spec), put(b, *b_spec), put(sfa), put(sfb))
    c, amax = jax.jit(lambda *x: jga.gemm_amax(*x))(*args)
    ref, abssum, ref_amax = npref.gemm_amax_f64(a, b, sfa, sfb, 32)
    npref.assert_c_close(np.asarray(c)[None], "float32", ref, abssum)
    np.testing.assert_allclose(float(amax), np.max(ref_amax), rtol=1e-5)


def test_m_over_fewer_blocks_beside_n_over_whole_blocks(rng):
    """On the (4, 2) mesh: M of 2 blocks over x runs whole, N of 2 blocks over y stays split (a
    block per shard), though quantize's layout splits M's scale tensor inside its blocks."""
    if (SX, SY) != (4, 2):
        pytest.skip("needs the (4, 2) mesh")
    x = rng.normal(size=(1, 256, 128)).astype(np.float32)
    w = rng.normal(size=(1, 256, 128)).astype(np.float32)

    def f(x, w):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(MESH, P(None, "x")))
        w = jax.lax.with_sharding_constraint(w, NamedSharding(MESH, P(None, "y")))
        return _quantize_and_gemm(x, w)

    compiled = jax.jit(f).lower(x, w).compile()
    size = dict(L=1, M=256, N=256, K=128)
    _check_few_blocks(compiled, compiled(x, w), x, w, size, dict(size, N=128))


def test_few_scale_blocks_with_gspmd_propagation():
    """The same calls under the GSPMD partitioner (jax_use_shardy_partitioner off), in a
    subprocess: under GSPMD a partitioner callback that raises aborts the process (an XLA check)."""
    if len(jax.devices()) < 8 or not hasattr(jax.config, "jax_use_shardy_partitioner"):
        pytest.skip("needs 8 devices and a jax with the GSPMD partitioner")
    ids = ["M-4dev-6blocks", "N-8dev-4blocks", "K-4dev-2blocks"]
    tests = [f"{os.path.abspath(__file__)}::test_dim_over_fewer_or_indivisible_scale_blocks[{i}]" for i in ids]
    env = dict(os.environ, JAX_USE_SHARDY_PARTITIONER="false")
    env.pop("JGA_TEST_SHARD", None)
    run = subprocess.run(  # cwd: not the repository root, whose source tree would shadow the package
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert run.returncode == 0 and f"{len(ids)} passed" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
