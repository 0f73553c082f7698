"""MXLinear (jax_gemm_amax.nn): the Flax NNX layer whose three GEMMs run through gemm_amax.

Expected accuracy (the figures the gradient tests check). MXFP8 e4m3 keeps 3 mantissa bits: a value
whose magnitude is log-uniform within its binade is rounded with an RMS relative error of
2^-3 / sqrt(12) * sqrt(E[1/x^2]) = 0.125 * 0.2887 * 0.7355 ~= 0.0265 (the power-of-two block scale
does not change this: values stay normal). A product of two independently quantized Gaussian
operands therefore has a relative (Frobenius) error of sqrt(2) * 0.0265 ~= 0.0375 against the float
product, for y, dX and dW alike (the backward operands are re-quantized). e5m2 (2 mantissa bits)
doubles that to ~0.075. The tests bracket the measured error around these figures (from below too:
an error far under the quantization error would mean something skipped the quantization).
"""

import functools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jax_gemm_amax as jga  # noqa: E402
from jax_gemm_amax.nn import AmaxHistory, MXLinear, OutputAmax, mx_matmul, prepare_weight  # noqa: E402

# Predicted relative error of a product of two quantized operands (see the module docstring).
PREDICTED_REL_ERR = {"mxfp8_e4m3": np.sqrt(2) * 0.0265, "mxfp8_e5m2": np.sqrt(2) * 0.053}
KERNEL_CALL = re.compile(
    r'call_target_name = "jax_gemm_amax_(?:cpu|cuda)"|custom_call @jax_gemm_amax_(?:cpu|cuda)\b'
)  # the GEMM, not quantize


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize_dequantize(x, fmt, k_multiple):
    k = x.shape[-1]
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, -k % k_multiple)])
    q, s = jga.quantize(xp, fmt)
    return jga.dequantize(q, s, jga.FORMATS[fmt].sf_vec_size)[..., :k]


def _dequantized(x, fmt, k_multiple=32):
    """float64 numpy value of quantize(x zero-padded along its last axis), padding cut off."""
    return np.asarray(_quantize_dequantize(jnp.asarray(x, jnp.float32), fmt, k_multiple), np.float64)


def _pair(in_f, out_f, seed=0, **kw):
    """An MXLinear and an nnx.Linear built from the same seed."""
    return MXLinear(in_f, out_f, rngs=nnx.Rngs(seed), **kw), nnx.Linear(
        in_f, out_f, use_bias=kw.get("use_bias", True), rngs=nnx.Rngs(seed)
    )


# ---------------------------------------------------------------------------------------------
# Parameters: nnx.Linear's names, shapes, initializers; checkpoints move both ways.


def test_parameters_match_nnx_linear():
    for use_bias in (True, False):
        mx, lin = _pair(96, 48, seed=3, use_bias=use_bias)
        mx_params, lin_params = nnx.state(mx, nnx.Param), nnx.state(lin, nnx.Param)
        assert jax.tree.structure(mx_params) == jax.tree.structure(lin_params)
        for a, b in zip(jax.tree.leaves(mx_params), jax.tree.leaves(lin_params)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)  # same initializers, same RNG draws
    mx = MXLinear(8, 4, rngs=nnx.Rngs(0))
    assert isinstance(mx.output_amax, OutputAmax) and isinstance(mx.amax_history, AmaxHistory)
    assert mx.amax_history[...].shape == (16,)


def test_parameter_swap_both_ways(rng):
    mx = MXLinear(64, 40, rngs=nnx.Rngs(1))
    lin = nnx.Linear(64, 40, rngs=nnx.Rngs(2))  # different weights
    kernel = jnp.asarray(rng.normal(size=(64, 40)), jnp.float32) * 0.1
    lin.kernel[...] = kernel
    lin.bias[...] = jnp.asarray(rng.normal(size=(40,)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(5, 64)), jnp.float32)

    nnx.update(mx, nnx.state(lin, nnx.Param))  # nnx.Linear checkpoint -> MXLinear
    np.testing.assert_array_equal(mx.kernel[...], kernel)
    assert _rel(mx(x), lin(x)) < 2 * PREDICTED_REL_ERR["mxfp8_e4m3"]

    back = nnx.Linear(64, 40, rngs=nnx.Rngs(7))
    nnx.update(back, nnx.state(mx, nnx.Param))  # and back
    np.testing.assert_array_equal(back(x), lin(x))

    # Through a pure-dict checkpoint as well.
    mx2 = MXLinear(64, 40, rngs=nnx.Rngs(9))
    nnx.replace_by_pure_dict(params := nnx.state(mx2, nnx.Param), nnx.to_pure_dict(nnx.state(lin, nnx.Param)))
    nnx.update(mx2, params)
    np.testing.assert_array_equal(mx2(x), mx(x))


# ---------------------------------------------------------------------------------------------
# Forward: exactly gemm_amax on the quantized operands.


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"])
def test_forward_is_gemm_amax_on_quantized_operands(rng, fmt):
    x = jnp.asarray(rng.normal(size=(2, 96, 128)), jnp.float32)  # aligned: no padding involved
    mx = MXLinear(128, 64, use_bias=False, fmt=fmt, rngs=nnx.Rngs(0))
    y = mx(x)
    qa, sfa = jga.quantize(x.reshape(-1, 128), fmt)
    qb, sfb = jga.quantize(mx.kernel[...].T, fmt)
    want = jga.gemm_amax(qa, qb, sfa, sfb, sf_vec_size=jga.FORMATS[fmt].sf_vec_size)
    np.testing.assert_array_equal(y, want.c.reshape(2, 96, 64))
    np.testing.assert_array_equal(mx.output_amax[...], want.amax)  # the fused amax, stored


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("fmt,use_bias", [("mxfp8_e4m3", False), ("nvfp4", False), ("mxfp8_e4m3", True)])
def test_non_finite_input_reaches_output_amax(rng, fmt, use_bias, bad):
    """A NaN or Inf in the input gives its quantization block a NaN scale: the rows of y it
    touches are NaN and output_amax is NaN, the other rows are unaffected; with a bias too, whose
    amax is taken over y (4096+ elements, where XLA's CPU float max can drop a NaN)."""
    x = np.asarray(rng.normal(size=(64, 128)), np.float32)
    x[5, 17] = bad
    mx = MXLinear(128, 64, use_bias=use_bias, fmt=fmt, rngs=nnx.Rngs(0))
    y = np.asarray(mx(jnp.asarray(x)))
    assert np.isnan(float(mx.output_amax[...]))
    assert np.isnan(y[5]).all() and np.isfinite(np.delete(y, 5, axis=0)).all()


@pytest.mark.parametrize("lead,in_f,out_f", [((3, 7), 40, 10), ((5,), 33, 1), ((), 17, 70), ((2, 1, 3), 64, 6)])
def test_forward_any_shapes_and_bias(rng, lead, in_f, out_f):
    """Non-aligned feature sizes are zero-padded: the result is the float64 product of the
    quantized operands, plus the bias."""
    x = jnp.asarray(rng.normal(size=lead + (in_f,)), jnp.float32)
    mx = MXLinear(in_f, out_f, rngs=nnx.Rngs(0))
    mx.bias[...] = jnp.asarray(rng.normal(size=(out_f,)), jnp.float32)
    y = mx(x)
    assert y.shape == lead + (out_f,) and y.dtype == jnp.float32
    xd = _dequantized(x.reshape(-1, in_f), "mxfp8_e4m3")
    wd = _dequantized(mx.kernel[...].T, "mxfp8_e4m3")
    ref = (xd @ wd.T + np.asarray(mx.bias[...], np.float64)).reshape(lead + (out_f,))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mx.output_amax[...], np.max(np.abs(ref)), rtol=1e-5)


def test_out_dtype_and_bf16_inputs(rng):
    x = jnp.asarray(rng.normal(size=(4, 64)), jnp.bfloat16)
    mx = MXLinear(64, 32, rngs=nnx.Rngs(0))
    assert mx(x).dtype == jnp.bfloat16  # default: the input's dtype
    assert mx(x.astype(jnp.float32)).dtype == jnp.float32
    mx16 = MXLinear(64, 32, use_bias=False, out_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    y = mx16(x.astype(jnp.float32))
    assert y.dtype == jnp.bfloat16
    # The kernel rounds its fp32 accumulator to bf16 directly: the float32 output, rounded.
    y32 = MXLinear(64, 32, use_bias=False, rngs=nnx.Rngs(0))(x.astype(jnp.float32))
    np.testing.assert_array_equal(y, y32.astype(jnp.bfloat16))
    # Gradients come back in the parameters' dtype (float32), the input's for the input.
    grads = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32)))(mx)
    assert grads["kernel"][...].dtype == jnp.float32 and grads["bias"][...].dtype == jnp.float32
    dx = jax.grad(lambda x: jnp.sum(mx_matmul(x, mx.kernel[...])[0].astype(jnp.float32)))(x)
    assert dx.dtype == jnp.bfloat16


# ---------------------------------------------------------------------------------------------
# Backward: the straight-through estimator, three kernel calls, close to float32 nnx.Linear.


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_gradients_close_to_float32_linear(rng, fmt):
    """loss = sum(y * G): dY = G for both layers, so the differences are the quantization's."""
    mx, lin = _pair(96, 80, seed=5, fmt=fmt, grad_fmt=fmt)
    x = jnp.asarray(rng.normal(size=(4, 64, 96)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(4, 64, 80)), jnp.float32)

    def loss(model, x):
        return jnp.sum(model(x) * g)

    (l_mx, (gm, gx_mx)) = nnx.value_and_grad(loss, argnums=(0, 1))(mx, x)
    (l_lin, (gl, gx_lin)) = nnx.value_and_grad(loss, argnums=(0, 1))(lin, x)
    predicted = PREDICTED_REL_ERR[fmt]
    for name, a, b in (
        ("y", mx(x), lin(x)),
        ("dW", gm["kernel"][...], gl["kernel"][...]),
        ("dX", gx_mx, gx_lin),
    ):
        err = _rel(a, b)
        assert 0.7 * predicted < err < 1.35 * predicted, f"{name}: relative error {err:.4f}, predicted {predicted:.4f}"
    # The bias gradient is the fp32 sum of dY, as in nnx.Linear (up to summation order).
    # The two sums may run in different orders (on GPU they do): allow float32 rounding relative to
    # the summed magnitudes, not to the (possibly cancelling) result.
    sum_abs = np.asarray(jnp.sum(jnp.abs(g), axis=(0, 1)))
    np.testing.assert_array_less(np.abs(np.asarray(gm["bias"][...]) - np.asarray(gl["bias"][...])), 1e-6 * sum_abs)
    assert abs(float(l_mx) - float(l_lin)) < 3 * predicted * np.sqrt(float(jnp.sum(lin(x) ** 2)) * float(jnp.sum(g**2)))


@pytest.mark.parametrize(
    "fmt,grad_fmt", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp8_e5m2"), ("nvfp4", "mxfp8_e4m3")]
)
def test_backward_is_gemm_on_requantized_operands(rng, fmt, grad_fmt):
    """dX = q(dY)·q(W)ᵀ quantized along out_features, dW = q(Xᵀ)·q(dYᵀ)ᵀ quantized along M, both in
    grad_fmt; M = 45 and the feature sizes are not aligned (zero-padded contraction axes)."""
    m_rows, in_f, out_f = 45, 40, 24
    x = jnp.asarray(rng.normal(size=(m_rows, in_f)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(in_f, out_f)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(m_rows, out_f)), jnp.float32)

    def loss(x, w):
        return jnp.sum(mx_matmul(x, w, fmt=fmt, grad_fmt=grad_fmt)[0] * g)

    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    want_dx = _dequantized(g, grad_fmt) @ _dequantized(w, grad_fmt).T
    want_dw = _dequantized(x.T, grad_fmt) @ _dequantized(g.T, grad_fmt).T
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)


def test_all_three_gemms_use_the_kernel():
    mx = MXLinear(64, 32, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(mx)
    x = jnp.ones((8, 64))

    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    def train_grads(state, x):
        model = nnx.merge(graphdef, state)
        return nnx.grad(loss, argnums=(0, 1))(model, x), nnx.state(model)

    forward_hlo = jax.jit(lambda s, x: loss(nnx.merge(graphdef, s), x)).lower(state, x).as_text()
    grad_hlo = jax.jit(train_grads).lower(state, x).as_text()
    assert len(KERNEL_CALL.findall(forward_hlo)) == 1
    assert len(KERNEL_CALL.findall(grad_hlo)) == 3  # forward, dgrad, wgrad
    assert "dot_general" not in grad_hlo  # and no float matmul anywhere


# ---------------------------------------------------------------------------------------------
# How the operands are quantized: one read per tensor, no transposed copies; what the VJP saves.


def _pad2(x, rows, cols):
    return jnp.pad(x, ((0, -x.shape[0] % rows), (0, -x.shape[1] % cols)))


def _transposed_operand_gemm(a, b, fmt, c_dtype):
    """``a (R, K) · b (S, K)ᵀ``, each operand quantized along K as given (transposes materialized
    by the caller); K zero-padded to 32 (every format's block and 16-byte row), S to C's 16 bytes."""
    c_dtype = np.dtype(c_dtype)
    qa, sfa = jga.quantize(_pad2(a, 1, 32), fmt)
    qb, sfb = jga.quantize(_pad2(b, 16 // c_dtype.itemsize, 32), fmt)
    c, amax = jga.gemm_amax(qa, qb, sfa, sfb, c_dtype=c_dtype, sf_vec_size=jga.FORMATS[fmt].sf_vec_size)
    return c[:, : b.shape[0]], amax


@functools.partial(jax.jit, static_argnums=(3, 4))
def _reference_vjp(x, w, dy, fmt, grad_fmt):
    """y, amax, dX, dW of mx_matmul written with the transposed arrays quantized along their last axis."""
    y, amax = _transposed_operand_gemm(x, w.T, fmt, x.dtype)
    dx, _ = _transposed_operand_gemm(dy, w, grad_fmt, jnp.float32)
    dw, _ = _transposed_operand_gemm(x.T, dy.T, grad_fmt, jnp.float32)
    return y, amax, dx.astype(x.dtype), dw.astype(w.dtype)


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def _mx_matmul_vjp(x, w, dy, fmt, grad_fmt, save_residuals, activations="quantized"):
    call = functools.partial(
        mx_matmul, fmt=fmt, grad_fmt=grad_fmt, save_residuals=save_residuals, activations=activations
    )
    (y, amax), vjp = jax.vjp(call, x, w)
    return y, amax, *vjp((dy, jnp.zeros_like(amax)))


FORMAT_PAIRS = [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp8_e5m2"), ("nvfp4", "mxfp8_e4m3"), ("mxfp4", "mxfp4")]


@pytest.mark.parametrize("fmt,grad_fmt", FORMAT_PAIRS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("m,k,n", [(64, 96, 32), (45, 40, 24), (33, 17, 70)])
def test_outputs_and_gradients_bit_identical_to_transposed_operands(rng, m, k, n, dtype, fmt, grad_fmt):
    """Quantizing along the row axis (and both axes in one pass) gives exactly what quantizing the
    transposed copies gives, padding included, whatever the VJP saves."""
    x = jnp.asarray(rng.normal(size=(m, k)), dtype)
    w = jnp.asarray(rng.normal(size=(k, n)), dtype)
    dy = jnp.asarray(rng.normal(size=(m, n)), dtype)
    want = _reference_vjp(x, w, dy, fmt, grad_fmt)
    for save_residuals in ("full", "quantized"):
        got = _mx_matmul_vjp(x, w, dy, fmt, grad_fmt, save_residuals)
        for name, a, b in zip(("y", "amax", "dX", "dW"), got, want):
            assert a.dtype == b.dtype and a.shape == b.shape, (save_residuals, name)
            np.testing.assert_array_equal(
                np.asarray(a, np.float32), np.asarray(b, np.float32), f"{save_residuals} {name}"
            )


@pytest.mark.parametrize("fmt,grad_fmt", [("mxfp8_e4m3", "mxfp8_e4m3"), ("nvfp4", "mxfp8_e5m2")])
def test_weight_only_gradients_same_with_quantized_residuals(rng, fmt, grad_fmt):
    x = jnp.asarray(rng.normal(size=(21, 50)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(50, 30)), jnp.float32)
    dy = jnp.asarray(rng.normal(size=(21, 30)), jnp.bfloat16)
    full = _mx_matmul_vjp(x, w, dy, fmt, grad_fmt, "full", "bf16")
    quantized = _mx_matmul_vjp(x, w, dy, fmt, grad_fmt, "quantized", "bf16")
    for a, b in zip(quantized, full):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _quantize_modes(jaxpr, found):
    """The mode of every quantize in a jaxpr and its sub-jaxprs (1 rows, 2 columns, 3 both), and
    whether anything is transposed."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "jax_gemm_amax_quantize":
            found.append(eqn.params["mode"])
        elif eqn.primitive.name == "transpose":
            found.append("transpose")
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                    _quantize_modes(getattr(sub, "jaxpr", sub), found)
    return found


@pytest.mark.parametrize(
    "fmt,grad_fmt,save_residuals,modes",
    [
        # forward: x rows, w columns; backward: x columns, w rows, dY both
        ("mxfp8_e4m3", "mxfp8_e4m3", "full", [1, 1, 2, 2, 3]),
        # x and w each read once for both passes
        ("mxfp8_e4m3", "mxfp8_e4m3", "quantized", [3, 3, 3]),
        ("nvfp4", "mxfp8_e4m3", "quantized", [1, 1, 2, 2, 3]),
    ],
)
def test_each_operand_quantized_without_transposes(fmt, grad_fmt, save_residuals, modes):
    x, w = jnp.ones((45, 40)), jnp.ones((40, 24))
    loss = lambda x, w: jnp.sum(mx_matmul(x, w, fmt=fmt, grad_fmt=grad_fmt, save_residuals=save_residuals)[0])
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w).jaxpr
    assert sorted(_quantize_modes(jaxpr, []), key=str) == modes


@pytest.mark.parametrize("fmt,grad_fmt", [("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4", "mxfp8_e5m2")])
def test_quantized_residuals_are_one_byte_codes(rng, fmt, grad_fmt):
    m, k, n = 256, 128, 128  # whole 128x4 scale blocks: no scale padding
    x = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)

    def residuals(save_residuals):
        call = functools.partial(mx_matmul, fmt=fmt, grad_fmt=grad_fmt, save_residuals=save_residuals)
        return jax.tree_util.tree_leaves(jax.vjp(call, x, w)[1])

    def is_float_copy(leaf, of):
        return jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype.itemsize > 1 and leaf.size == of.size

    full = residuals("full")
    assert any(is_float_copy(leaf, x) for leaf in full) and any(is_float_copy(leaf, w) for leaf in full)
    quantized = residuals("quantized")
    assert not any(is_float_copy(leaf, x) or is_float_copy(leaf, w) for leaf in quantized)
    assert all(leaf.dtype.itemsize == 1 for leaf in quantized)  # grad_fmt codes and scales
    # x along M and w along out_features, codes plus one scale per 32 values
    assert sum(leaf.nbytes for leaf in quantized) == (m * k + k * n) * (1 + 1 / 32)


def test_quantized_residuals_shrink_a_layer_stack():
    """fwd+bwd of four layers under lax.scan (so the saved activations are stacked loop outputs):
    the compiled program's temporaries and outputs, and the forward pass's saved residuals."""
    m, d = 1024, 128
    x = jnp.ones((m, d), jnp.float32)
    ws = jnp.ones((4, d, d), jnp.float32)

    def loss(save_residuals):
        def body(h, w):
            return mx_matmul(h, w, save_residuals=save_residuals)[0], None

        return lambda x, ws: jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2)

    def memory(f):
        stats = jax.jit(f).lower(x, ws).compile().memory_analysis()
        if stats is None:
            pytest.skip("no compiled memory statistics on this backend")
        return stats

    step = {}
    for mode in ("full", "quantized"):
        stats = memory(jax.grad(loss(mode), argnums=(0, 1)))
        step[mode] = stats.temp_size_in_bytes + stats.output_size_in_bytes
    assert step["quantized"] < 0.8 * step["full"], step
    # The forward pass alone returns what it saves for the backward pass.
    saved = {
        mode: memory(lambda x, ws, mode=mode: jax.vjp(loss(mode), x, ws)[1]).output_size_in_bytes
        for mode in ("full", "quantized")
    }
    # full: four f32 activations and weights; quantized: 1 byte per element (+1/32 for scales)
    assert saved["full"] - saved["quantized"] > 0.99 * 4 * (m * d + d * d) * (4 - 1 - 1 / 32), saved


def test_mxlinear_save_residuals(rng):
    x = jnp.asarray(rng.normal(size=(3, 7, 40)), jnp.bfloat16)
    grads = {}
    for save_residuals in ("full", "quantized"):
        mx = MXLinear(40, 10, save_residuals=save_residuals, rngs=nnx.Rngs(0))
        grads[save_residuals] = nnx.grad(lambda m, x: jnp.sum(m(x).astype(jnp.float32) ** 2), argnums=(0, 1))(mx, x)
    for a, b in zip(jax.tree_util.tree_leaves(grads["quantized"]), jax.tree_util.tree_leaves(grads["full"])):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# ---------------------------------------------------------------------------------------------
# amax state.


def test_amax_updates_and_history(rng):
    mx = MXLinear(64, 32, use_bias=False, amax_history_length=3, rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.normal(size=(16, 64)), jnp.float32)
    amaxes = []
    for scale in (1.0, 4.0, 0.5, 2.0):
        y = mx(scale * x)
        amaxes.append(float(jnp.max(jnp.abs(y))))
        assert float(mx.output_amax[...]) == pytest.approx(amaxes[-1], rel=1e-6)
    np.testing.assert_allclose(mx.amax_history[...], amaxes[::-1][:3], rtol=1e-6)  # newest first

    frozen = MXLinear(64, 32, amax_history_length=0, update_amax=False, rngs=nnx.Rngs(0))
    assert frozen.amax_history is None
    frozen(x)
    assert float(frozen.output_amax[...]) == 0.0


def test_jit_value_and_grad_training_step_updates_state(rng):
    mx = MXLinear(64, 32, rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.normal(size=(3, 8, 64)), jnp.float32)
    optimizer = nnx.Optimizer(mx, optax.sgd(0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    amax_before = []
    losses = []
    for _ in range(3):
        kernel = mx.kernel[...]
        amax_before.append(float(jnp.max(jnp.abs(mx(x)))))  # eager call: also updates the state
        losses.append(float(step(mx, optimizer, x)))
        assert not np.array_equal(kernel, mx.kernel[...])
        # The amax recorded inside the jitted step is that step's forward (before the update).
        assert float(mx.output_amax[...]) == pytest.approx(amax_before[-1], rel=1e-6)
        np.testing.assert_allclose(mx.amax_history[...][:2], [amax_before[-1]] * 2, rtol=1e-6)
    assert losses[2] < losses[1] < losses[0]
    # The amax carries no gradient and never becomes a tracer outside.
    assert isinstance(mx.output_amax[...], jax.Array)


def test_functional_jax_jit(rng):
    mx = MXLinear(48, 24, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(mx)
    x = jnp.asarray(rng.normal(size=(10, 48)), jnp.float32)

    @jax.jit
    def apply(state, x):
        model = nnx.merge(graphdef, state)
        return model(x), nnx.state(model)

    y, new_state = apply(state, x)
    np.testing.assert_array_equal(y, mx(x))
    np.testing.assert_array_equal(new_state["output_amax"][...], mx.output_amax[...])


# ---------------------------------------------------------------------------------------------
# vmap.


def test_vmap_over_inputs(rng):
    mx = MXLinear(64, 32, rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.normal(size=(4, 8, 64)), jnp.float32)
    want = jnp.stack([mx(xi) for xi in x])
    per_item_amax = [float(jnp.max(jnp.abs(w))) for w in want]

    # jax.vmap of the functional form: per-example outputs and per-example state.
    graphdef, state = nnx.split(mx)

    def apply(state, x):
        model = nnx.merge(graphdef, state)
        return model(x), nnx.state(model)

    y, new_state = jax.vmap(apply, in_axes=(None, 0))(state, x)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_allclose(new_state["output_amax"][...], per_item_amax, rtol=1e-6)

    # nnx.vmap with the layer broadcast: the shared amax state must be frozen.
    mx.update_amax = False
    y = nnx.vmap(lambda model, x: model(x), in_axes=(None, 0))(mx, x)
    np.testing.assert_array_equal(y, want)


def test_vmap_ensemble_of_layers(rng):
    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return MXLinear(64, 32, rngs=rngs)

    ensemble = make(nnx.Rngs(0))
    assert ensemble.kernel[...].shape == (3, 64, 32) and ensemble.output_amax[...].shape == (3,)
    x = jnp.asarray(rng.normal(size=(8, 64)), jnp.float32)

    @nnx.vmap(in_axes=(0, None), out_axes=0)
    def forward(model, x):
        return model(x)

    @nnx.jit
    def grads(model, x):
        # Summed over members, so each member's dY is what it gets alone (a factor 1/3 would
        # change dY's quantization).
        return nnx.value_and_grad(lambda m: jnp.sum(jnp.mean(forward(m, x) ** 2, axis=(1, 2))))(model)

    loss, g = grads(ensemble, x)
    assert g["kernel"][...].shape == (3, 64, 32)
    for i in range(3):
        member = MXLinear(64, 32, rngs=nnx.Rngs(0))
        nnx.update(member, jax.tree.map(lambda v, i=i: v[i], nnx.state(ensemble, nnx.Param)))
        yi = member(x)
        np.testing.assert_allclose(ensemble.output_amax[...][i], jnp.max(jnp.abs(yi)), rtol=1e-6)
        gi = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(member)
        np.testing.assert_allclose(g["kernel"][...][i], gi["kernel"][...], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Sharded parameters (several host devices need a fresh process).

_SHARDED = textwrap.dedent(
    """
    import os, sys
    if os.environ.get("JAX_PLATFORMS") == "cpu":
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jax_gemm_amax.nn import MXLinear

    shape = tuple(int(v) for v in sys.argv[1].split("x"))
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    def build():
        return MXLinear(64, 96, rngs=nnx.Rngs(0),
                        kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model")),
                        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("model",)))
    with jax.set_mesh(mesh):
        sharded = build()
    plain = MXLinear(64, 96, rngs=nnx.Rngs(0))
    assert sharded.kernel[...].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    x = jax.random.normal(jax.random.key(1), (48, 64))
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None)))

    @nnx.jit
    def step(model, x):
        return nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)

    with jax.set_mesh(mesh):
        loss_s, g_s = step(sharded, xs)
    loss_p, g_p = step(plain, x)
    np.testing.assert_allclose(loss_s, loss_p, rtol=1e-5)
    np.testing.assert_allclose(g_s["kernel"][...], g_p["kernel"][...], rtol=1e-5, atol=1e-7)
    assert g_s["kernel"][...].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    np.testing.assert_allclose(sharded.output_amax[...], plain.output_amax[...], rtol=1e-6)
    print("OK")
    """
)


def _run_sharded_layer(platform, mesh_shape):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = platform
    run = subprocess.run(  # cwd: not the repository root, whose source tree would shadow the package
        [sys.executable, "-c", _SHARDED, mesh_shape],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout + run.stderr


def test_sharded_parameters():
    """Kernel and bias sharded over a 'model' axis, inputs over 'data' (4 CPU devices, Auto
    sharding): same loss, gradients and amax as unsharded, gradients keep the kernel's sharding.
    The three GEMMs go through gemm_amax's partitioning rule (jax_gemm_amax/primitives/gemm_amax.py);
    the layer adds no host callback or device_get that would stand in its way."""
    _run_sharded_layer("cpu", "2x2")  # the virtual devices are CPU ones, also on a GPU machine


@pytest.mark.skipif(jax.default_backend() != "gpu" or jax.device_count() < 2, reason="needs 2 GPUs")
def test_sharded_parameters_on_two_gpus():
    """The same on two GPUs, the kernel's N split over a real second device."""
    _run_sharded_layer("cuda", "1x2")


# ---------------------------------------------------------------------------------------------
# Errors and edge cases.


def test_errors():
    with pytest.raises(ValueError, match="fmt must be one of"):
        MXLinear(8, 8, fmt="fp8", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="grad_fmt"):
        MXLinear(8, 8, grad_fmt="bf16", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="amax_history_length"):
        MXLinear(8, 8, amax_history_length=-1, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"MXLinear: in_features must be an int, got 70.5"):
        MXLinear(70.5, 8, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"MXLinear: out_dtype must be one of float64, .*, got int32"):
        MXLinear(8, 8, out_dtype=jnp.int32, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"mx_matmul: out_dtype must be one of .*, got float8_e8m0fnu"):
        mx_matmul(jnp.ones((4, 8)), jnp.ones((8, 4)), out_dtype=jnp.float8_e8m0fnu)
    # the array at fault is named (int x was blamed on out_dtype, int w on x)
    with pytest.raises(TypeError, match=r"mx_matmul: x must be a floating array, got int32"):
        mx_matmul(jnp.ones((4, 8), jnp.int32), jnp.ones((8, 4)))
    with pytest.raises(TypeError, match=r"mx_matmul: w must be a floating array, got int32"):
        mx_matmul(jnp.ones((4, 8)), jnp.ones((8, 4), jnp.int32))
    with pytest.raises(TypeError, match=r"prepare_weight: w must be a floating array, got int32"):
        prepare_weight(jnp.ones((8, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"mx_matmul: fmt 'nvfp4' differs from the prepared weight's 'mxfp8_e4m3'"):
        mx_matmul(jnp.ones((4, 8)), prepare_weight(jnp.ones((8, 4))), fmt="nvfp4", activations="bf16")
    with pytest.raises(NotImplementedError, match="^mx_matmul with a PreparedWeight is not differentiable"):
        jax.grad(lambda x: mx_matmul(x, prepare_weight(jnp.ones((8, 4))), activations="bf16")[0].sum())(
            jnp.ones((4, 8))
        )
    with pytest.raises(TypeError, match=r"MXLinear: inputs must be real, got complex64"):
        MXLinear(8, 4, rngs=nnx.Rngs(0))(jnp.ones((2, 8), jnp.complex64))
    with pytest.raises(TypeError, match=r"MXLinear: update_amax must be a bool, got 'False'"):
        MXLinear(8, 4, update_amax="False", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"grad_fmt must be one of .*, got 'bad'"):
        mx_matmul(jnp.ones((4, 8)), jnp.ones((8, 4)), grad_fmt="bad")
    with pytest.raises(TypeError, match=r"mx_matmul: out_dtype: 'foo' is not a dtype"):
        mx_matmul(jnp.ones((4, 8)), jnp.ones((8, 4)), out_dtype="foo")
    with pytest.raises(ValueError, match=r"MXLinear: save_residuals must be one of \('full', 'quantized'\), got 'fp8'"):
        MXLinear(8, 8, save_residuals="fp8", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"mx_matmul: save_residuals must be one of \('full', 'quantized'\), got None"):
        mx_matmul(jnp.ones((4, 8)), jnp.ones((8, 4)), save_residuals=None)
    mx = MXLinear(8, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"\(\.\.\., 8\)"):
        mx(jnp.ones((2, 9)))


@pytest.mark.parametrize("use_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"])
def test_narrow_out_dtype_saturates_as_gemm_amax(out_dtype, use_bias):
    """Results past an FP8/FP4 out_dtype's range come out as its largest finite value, as
    gemm_amax's C does (astype gave NaN for e4m3, Inf for e5m2); the gradient is astype's
    (the identity), not zero where the result saturated."""
    x, w = jnp.full((2, 64), 8.0), jnp.full((64, 16), 8192.0)  # y = 2^22, past every narrow format
    dt = jnp.dtype(out_dtype)
    limit = float(jnp.finfo(dt).max)
    for sign in (1.0, -1.0):
        y, amax = mx_matmul(sign * x, w, out_dtype=dt)
        assert y.dtype == dt and float(amax) == 2.0**22
        np.testing.assert_array_equal(np.asarray(y.astype(jnp.float32)), sign * limit)
    layer = MXLinear(64, 16, use_bias=use_bias, out_dtype=dt, rngs=nnx.Rngs(0))
    layer.kernel[...] = w
    np.testing.assert_array_equal(np.asarray(layer(x).astype(jnp.float32)), limit)
    assert float(layer.output_amax[...]) == 2.0**22
    grad = jax.grad(lambda v: mx_matmul(v, w, out_dtype=dt)[0].astype(jnp.float32).sum())(x)
    np.testing.assert_array_equal(np.asarray(grad), 16 * 8192.0)  # dY = 1: dX = w's row sums


def test_empty_batch_and_integer_inputs():
    mx = MXLinear(8, 4, rngs=nnx.Rngs(0))
    y = mx(jnp.ones((0, 8)))
    assert y.shape == (0, 4)
    y = mx(jnp.ones((2, 8), jnp.int32))
    assert y.dtype == jnp.float32 and y.shape == (2, 4)
