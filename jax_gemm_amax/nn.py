"""Flax NNX layer: :class:`MXLinear`, a drop-in ``nnx.Linear`` whose three GEMMs (forward, dgrad,
wgrad) run through :func:`jax_gemm_amax.gemm_amax` on block-scaled (MXFP8 by default) operands.

Import it as ``import jax_gemm_amax.nn`` (or ``from jax_gemm_amax.nn import MXLinear``); it needs
``flax``, which ``import jax_gemm_amax`` does not.

Gradients are a straight-through estimator with respect to the quantization: the backward pass
treats ``quantize`` as the identity and differentiates the float product ``x @ W``, i.e.

    dX = dY · Wᵀ        (contraction over out_features)
    dW = Xᵀ · dY        (contraction over the flattened batch M)

and evaluates both products with ``gemm_amax`` on operands re-quantized (format ``grad_fmt``) along
*their* contraction axis. No gradient flows into the amax.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import MappingProxyType
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.linear import default_bias_init, default_kernel_init

from . import formats
from ._problem import canonical_dtype, check_int, is_fp4
from .ops import gemm_amax
from .quantize import quantize, quantize_pair

__all__ = ["AmaxHistory", "MXLinear", "OutputAmax", "PreparedWeight", "QuantizedKernel", "mx_matmul", "prepare_weight"]


class OutputAmax(nnx.Variable):
    """``max |y|`` of the layer's latest forward call (float32 scalar, before rounding to out_dtype)."""


class AmaxHistory(nnx.Variable):
    """The last ``amax_history_length`` output amaxes, newest first (float32 vector)."""


class QuantizedKernel(nnx.Variable):
    """A weight-only layer's kernel quantized once (:meth:`MXLinear.prepare`): codes or scales."""


# ----------------------------------------------------------------------------------------------
# The functional core: y = x @ w through gemm_amax, with a custom VJP.


@dataclasses.dataclass(frozen=True)
class _Config:
    fmt: str
    grad_fmt: str
    c_dtype: np.dtype  # of the forward GEMM's output
    weight_only: bool = False  # x stays in 16 bits, only w is quantized
    save_residuals: str = "full"  # what the VJP keeps for the backward pass: _SAVE_RESIDUALS


_SAVE_RESIDUALS = ("full", "quantized")
_WEIGHT_ONLY_N_MULTIPLE = 16  # C's rows 16-byte aligned for every float C dtype
_GRAD_N_MULTIPLE = 8  # the backward GEMMs' C rows 16-byte aligned in 16-bit and fp32 C
_DIRECT_C_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(jnp.float16))  # C dtypes the kernels store


# out_dtype: the floats a result is rounded to (FP8 and FP4 saturating, as gemm_amax's C).
_OUT_DTYPES = (
    (np.dtype(np.float64),)
    + _DIRECT_C_DTYPES
    + tuple(np.dtype(d) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float4_e2m1fn))
)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _round_to(y, dtype):
    """float ``y`` -> ``dtype`` as gemm_amax rounds C: nearest even, FP8/FP4 saturating to their
    largest finite value (``astype`` gives NaN or Inf past it). The derivative is ``astype``'s
    (the identity), not the clip's zero beyond the range."""
    return formats.saturating_cast(y, dtype)


@_round_to.defjvp
def _round_to_jvp(dtype, primals, tangents):
    return _round_to(primals[0], dtype), tangents[0].astype(dtype)


def _c_dtype(dtype) -> np.dtype:
    """The C dtype a GEMM whose result is wanted in ``dtype`` stores: ``dtype`` itself where the
    kernels store it (one rounding of the fp32 sum either way), else float32 (cast afterwards)."""
    dtype = np.dtype(dtype)
    return dtype if dtype in _DIRECT_C_DTYPES else np.dtype(np.float32)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["q", "scales"], meta_fields=["fmt", "in_features", "out_features"]
)
@dataclasses.dataclass(frozen=True)
class PreparedWeight:
    """A weight ``w (in_features, out_features)`` quantized once along in_features for weight-only
    :func:`mx_matmul`: ``q`` ``(N', K')`` and its physical ``scales``, zero-padded to the format's
    K multiple and N to 16 (:func:`prepare_weight`)."""

    q: jax.Array
    scales: jax.Array
    fmt: str
    in_features: int
    out_features: int


def prepare_weight(w, fmt: str = "mxfp8_e4m3") -> PreparedWeight:
    """Quantizes ``w (K, N)`` for weight-only inference (``mx_matmul(x, prepared, activations="bf16")``)."""
    formats.get_format(fmt)
    w = jnp.asarray(w)
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"prepare_weight: w must be a floating array, got {w.dtype}")
    if w.ndim != 2 or 0 in w.shape:
        raise ValueError(f"prepare_weight: expected w (K, N) with K, N >= 1, got shape {w.shape}")
    q, scales = _quantize_along(w, fmt, -2, _WEIGHT_ONLY_N_MULTIPLE)
    return PreparedWeight(q, scales, fmt, int(w.shape[0]), int(w.shape[1]))


def _activations_16(x):
    """Weight-only activations: bfloat16 and float16 as they are, other floats rounded to bfloat16."""
    return x if np.dtype(x.dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)) else x.astype(jnp.bfloat16)


def _weight_only_gemm(x, prepared: PreparedWeight, c_dtype):
    """``x (M, K) · w`` for a prepared ``w``: one weight-only gemm_amax, C ``(M, N)`` in c_dtype."""
    a = _pad_to(_activations_16(x), 1, _k_multiple(prepared.fmt))  # to the prepared K'
    sfv = formats.get_format(prepared.fmt).sf_vec_size
    c, amax = gemm_amax(a, prepared.q, None, prepared.scales, c_dtype=c_dtype, sf_vec_size=sfv)
    return c[:, : prepared.out_features], amax


def _k_multiple(fmt: str) -> int:
    """The contraction length must be a multiple of this: the scale block and 16-byte rows."""
    f = formats.get_format(fmt)
    elements_per_16_bytes = 32 if is_fp4(f.value_dtype) else 16
    return math.lcm(f.sf_vec_size, elements_per_16_bytes)


def _pad_to(x, axis: int, multiple: int):
    size = x.shape[axis]
    extra = -size % multiple
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)  # zeros: they add nothing to the sums and never raise a block's amax


# A GEMM operand is ``(q, scales)``, K-major: ``t (R, C)`` quantized along C ("rows", codes
# ``(R', C')``) or along R ("columns", codes of the transpose ``(C', R')``, written directly by
# quantize(axis=-2), so no transposed copy of ``t`` is made). The quantized axis is zero-padded to
# the format's K multiple, the other one to the row alignment that operand's C needs; the padded
# rows and columns of C are cut off. Padding adds zero blocks only, so every code and scale of the
# real elements, and every element of C, is what the unpadded operands give.


def _quantize_along(t, fmt: str, axis: int, align: int):
    """``t (R, C)`` quantized to ``fmt`` along ``axis`` (-1: rows, -2: columns); the other axis
    padded to a multiple of ``align``."""
    other = 0 if axis == -1 else 1
    return quantize(_pad_to(_pad_to(t, axis, _k_multiple(fmt)), other, align), fmt, axis=axis)


def _quantize_both(t, row_fmt: str, col_fmt: str, row_align: int, col_align: int):
    """``(rows, columns)`` of ``t (R, C)``: along C in ``row_fmt`` (R padded to ``row_align``) and
    along R in ``col_fmt`` (C padded to ``col_align``). In one format, one quantize_pair: a single
    read of ``t`` gives both."""
    if row_fmt != col_fmt:
        return _quantize_along(t, row_fmt, -1, row_align), _quantize_along(t, col_fmt, -2, col_align)
    t = _pad_to(t, 0, math.lcm(_k_multiple(col_fmt), row_align))
    t = _pad_to(t, 1, math.lcm(_k_multiple(row_fmt), col_align))
    return quantize_pair(t, row_fmt)


def _gemm(a, b, fmt: str, c_dtype, rows: int, cols: int):
    """``a · bᵀ`` of two quantized operands through gemm_amax: ``(c (rows, cols), amax)``."""
    (qa, sfa), (qb, sfb) = a, b
    c, amax = gemm_amax(qa, qb, sfa, sfb, c_dtype=c_dtype, sf_vec_size=formats.get_format(fmt).sf_vec_size)
    return c[:rows, :cols], amax


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["x_cols", "w_rows"],
    meta_fields=["in_features", "x_dtype", "w_dtype"],
)
@dataclasses.dataclass(frozen=True)
class _QuantizedResiduals:
    """What ``save_residuals="quantized"`` keeps: the backward GEMMs' operands that come from x and
    w, already in ``grad_fmt`` (``(q, scales)`` each, padded), x's K and the dtypes the cotangents
    return in."""

    x_cols: tuple  # x along M: wgrad's A, (K', M')
    w_rows: tuple  # w along out_features: dgrad's B, (K', N')
    in_features: int
    x_dtype: np.dtype
    w_dtype: np.dtype


def _forward(x, w, cfg: _Config):
    """``((y, amax), residuals)``: the forward product, and what the backward pass needs."""
    (m, k), n = x.shape, w.shape[1]
    n_align = _WEIGHT_ONLY_N_MULTIPLE if cfg.weight_only else 16 // cfg.c_dtype.itemsize
    if cfg.save_residuals == "full":
        x_rows = None if cfg.weight_only else _quantize_along(x, cfg.fmt, -1, 1)
        w_cols = _quantize_along(w, cfg.fmt, -2, n_align)
        residuals = (x, w)
    else:
        # In one format, a single read of x (of w) gives its forward operand and its saved one.
        w_rows, w_cols = _quantize_both(w, cfg.grad_fmt, cfg.fmt, _GRAD_N_MULTIPLE, n_align)
        if cfg.weight_only:
            x_rows, x_cols = None, _quantize_along(x, cfg.grad_fmt, -2, 1)
        else:
            x_rows, x_cols = _quantize_both(x, cfg.fmt, cfg.grad_fmt, 1, 1)
        residuals = _QuantizedResiduals(x_cols, w_rows, k, np.dtype(x.dtype), np.dtype(w.dtype))
    if cfg.weight_only:
        return _weight_only_gemm(x, PreparedWeight(*w_cols, cfg.fmt, k, n), cfg.c_dtype), residuals
    return _gemm(x_rows, w_cols, cfg.fmt, cfg.c_dtype, m, n), residuals


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mx_matmul(x, w, cfg: _Config):
    return _forward(x, w, cfg)[0]


def _mx_matmul_bwd(cfg: _Config, residuals, cotangents):
    dy, _ = cotangents  # amax is not differentiable: its cotangent is dropped
    m, n = dy.shape
    g = cfg.grad_fmt
    if isinstance(residuals, _QuantizedResiduals):
        r = residuals
        x_cols, w_rows, k, x_dtype, w_dtype = r.x_cols, r.w_rows, r.in_features, r.x_dtype, r.w_dtype
    else:
        x, w = residuals
        x_cols, w_rows = _quantize_along(x, g, -2, 1), _quantize_along(w, g, -1, _GRAD_N_MULTIPLE)
        x_dtype, w_dtype, k = x.dtype, w.dtype, x.shape[1]
    dy_rows, dy_cols = _quantize_both(dy, g, g, 1, _GRAD_N_MULTIPLE)
    # The gradients are stored in their primals' dtypes by the kernels where they can (_c_dtype).
    # dgrad: dX (M, in) = dY (M, out) · W (in, out)ᵀ, contraction over out.
    dx, _ = _gemm(dy_rows, w_rows, g, _c_dtype(x_dtype), m, k)
    # wgrad: dW (in, out) = Xᵀ (in, M) · dYᵀ (out, M)ᵀ, contraction over M.
    dw, _ = _gemm(x_cols, dy_cols, g, _c_dtype(w_dtype), k, n)
    return dx.astype(x_dtype), dw.astype(w_dtype)


_mx_matmul.defvjp(_forward, _mx_matmul_bwd)


_ACTIVATIONS = ("quantized", "bf16")


def _out_dtype(dtype, where: str) -> np.dtype:
    result = canonical_dtype(dtype, f"{where}: out_dtype")
    if result not in _OUT_DTYPES:
        raise TypeError(
            f"{where}: out_dtype must be one of {', '.join(d.name for d in _OUT_DTYPES)}, got {result.name}"
        )
    return result


def _check_save_residuals(save_residuals, where: str) -> None:
    if not isinstance(save_residuals, str) or save_residuals not in _SAVE_RESIDUALS:
        raise ValueError(f"{where}: save_residuals must be one of {_SAVE_RESIDUALS}, got {save_residuals!r}")


def mx_matmul(
    x,
    w,
    *,
    fmt: str | None = None,
    grad_fmt: str = "mxfp8_e4m3",
    out_dtype=None,
    activations: str = "quantized",
    save_residuals: str = "full",
):
    """``y = x @ w`` with ``x (M, K)``, ``w (K, N)`` through :func:`gemm_amax`; returns ``(y, amax)``.

    Forward: ``x`` quantized to ``fmt`` (default ``"mxfp8_e4m3"``) along K, ``w`` along K (its
    first axis), GEMM with fp32 accumulation, ``amax = max |x @ w|`` fused (on the fp32
    accumulator, before rounding to ``out_dtype``, default ``x.dtype``: float64/32, bfloat16,
    float16, or FP8/FP4, which saturate as gemm_amax's C does).
    Backward (``jax.custom_vjp``): the straight-through estimator, ``dX = dY·Wᵀ`` and
    ``dW = Xᵀ·dY`` both through gemm_amax with operands quantized to ``grad_fmt`` along their
    contraction axis (both operands of a backward GEMM use ``grad_fmt``: the kernel takes one
    element dtype for A and B). Cotangents come back in ``x.dtype`` / ``w.dtype``; amax has none.
    Any M, K, N >= 1 work: non-aligned sizes are zero-padded internally.

    ``save_residuals`` is what the VJP keeps between the passes: ``"full"`` (default) ``x`` and
    ``w`` in their own precision, quantized for the backward GEMMs there; ``"quantized"`` only
    those backward operands, quantized in the forward pass (``x`` along M and ``w`` along N, in
    ``grad_fmt``): about 1 byte per element for FP8, from the same read of each tensor that feeds
    the forward GEMM when ``fmt == grad_fmt``. The gradients are bit-identical.

    ``activations="bf16"`` (weight-only, for inference): ``x`` is not quantized; bfloat16 and
    float16 ``x`` go in as they are, other floats rounded to bfloat16, and only ``w`` is quantized
    (``fmt``): one weight-only gemm_amax. ``w`` may then be a :class:`PreparedWeight`
    (:func:`prepare_weight`: quantized once, in its own format, which ``fmt`` may name or leave
    out; not differentiable). With a float ``w`` the backward
    pass is the same straight-through estimator as above.
    """
    if activations not in _ACTIVATIONS:
        raise ValueError(f"mx_matmul: activations must be one of {_ACTIVATIONS}, got {activations!r}")
    _check_save_residuals(save_residuals, "mx_matmul")
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"mx_matmul: x must be a floating array, got {x.dtype}")
    if isinstance(w, PreparedWeight):
        if activations != "bf16":
            raise ValueError("mx_matmul: a PreparedWeight is for weight-only calls, activations='bf16'")
        if x.ndim != 2 or x.shape[1] != w.in_features:
            raise ValueError(f"mx_matmul: expected x (M, {w.in_features}) for the prepared weight, got {x.shape}")
        if fmt is not None and fmt != w.fmt:
            raise ValueError(f"mx_matmul: fmt {fmt!r} differs from the prepared weight's {w.fmt!r}")
        fmt, n = w.fmt, w.out_features
    else:
        w = jnp.asarray(w)
        if not jnp.issubdtype(w.dtype, jnp.floating):
            raise TypeError(f"mx_matmul: w must be a floating array, got {w.dtype}")
        if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
            raise ValueError(f"mx_matmul: expected x (M, K) and w (K, N), got {x.shape} and {w.shape}")
        fmt, n = "mxfp8_e4m3" if fmt is None else fmt, w.shape[1]
    formats.get_format(fmt)
    formats.get_format(grad_fmt, "grad_fmt")
    out_dtype = _out_dtype(out_dtype if out_dtype is not None else x.dtype, "mx_matmul")
    c_dtype = _c_dtype(out_dtype)
    if 0 in x.shape or n == 0:  # nothing to multiply: an empty (or all-zero) product
        return jnp.zeros((x.shape[0], n), out_dtype), jnp.zeros((), jnp.float32)
    if isinstance(w, PreparedWeight):
        y, amax = _weight_only_gemm(formats.not_differentiable(x, "mx_matmul with a PreparedWeight"), w, c_dtype)
    else:
        y, amax = _mx_matmul(x, w, _Config(fmt, grad_fmt, c_dtype, activations == "bf16", save_residuals))
    return _round_to(y, out_dtype), jax.lax.stop_gradient(amax)


# ----------------------------------------------------------------------------------------------
# The layer.


class MXLinear(nnx.Module):
    """A linear layer, ``y = x @ kernel + bias``, whose GEMMs run through :func:`gemm_amax`.

    Parameters are those of ``nnx.Linear`` (``kernel (in_features, out_features)``,
    ``bias (out_features,)``, same initializers, same order of RNG draws), so the same seed gives
    the same weights and ``nnx.state(..., nnx.Param)`` moves between the two layers unchanged.
    Inputs have any leading shape ``(..., in_features)``; the leading dims flatten into the GEMM's M.
    Any feature sizes work (non-aligned ones are zero-padded internally).

    Forward: activations quantized to ``fmt`` along in_features, the kernel along its input axis,
    one ``gemm_amax`` with fp32 accumulation, then the bias added in fp32 and the result rounded to
    ``out_dtype`` (default: the input's dtype).

    Backward (``jax.custom_vjp``): a **straight-through estimator** with respect to the
    quantization (``quantize`` is treated as the identity). ``dX = dY·Wᵀ`` and ``dW = Xᵀ·dY``
    both run through ``gemm_amax``, each operand re-quantized to ``grad_fmt`` along its
    contraction axis (out_features for dgrad, the flattened batch for wgrad); both operands of a
    backward GEMM use ``grad_fmt`` because the kernel takes one element dtype for A and B. The
    bias gradient is the fp32 sum of dY. Gradients come back in the parameters' / input's dtypes.
    By default (``save_residuals="full"``) the VJP saves ``x`` and the kernel in their own
    precision (what ``nnx.Linear`` saves) and quantizes them for the backward GEMMs there; with
    ``"quantized"`` it saves only those backward operands, quantized in the forward pass. Every
    scale is computed just in time from the tensor's own blocks (MX scaling), so no amax history
    feeds the layer's own quantization.

    State: ``output_amax`` (:class:`OutputAmax`) holds ``max |y|`` of the latest call, on the fp32
    output before rounding to out_dtype (the GEMM's fused amax when ``use_bias=False``; with a
    bias, the max over ``x @ W + b``, reduced by XLA in the bias-add fusion); ``amax_history``
    (:class:`AmaxHistory`) the last ``amax_history_length`` of them, newest first (``None`` when
    the length is 0). They update on every forward call (eagerly, under ``nnx.jit``,
    ``nnx.value_and_grad``, ...), never from inside the custom VJP, and carry no gradient.
    ``update_amax=False`` freezes them; ``nnx.vmap`` with the layer broadcast (``in_axes=None``)
    over a batch of inputs needs it (a per-example amax does not fit the shared state), while an
    ``nnx.vmap`` ensemble of layers keeps one amax per member, and ``jax.vmap`` over
    ``nnx.merge(graphdef, state)`` returns per-example state.

    Args:
      in_features, out_features: sizes of the last input / output axis.
      use_bias: whether to add a bias.
      fmt: forward quantization, one of ``jax_gemm_amax.FORMATS`` (``"mxfp8_e4m3"``,
        ``"mxfp8_e5m2"``, ``"mxfp4"``, ``"nvfp4"``). NVFP4 here uses no per-tensor global scale.
      grad_fmt: quantization of both operands of the dgrad and wgrad GEMMs (typically
        ``"mxfp8_e4m3"`` or ``"mxfp8_e5m2"``).
      out_dtype: output dtype; default the input's dtype.
      param_dtype, kernel_init, bias_init, kernel_metadata, bias_metadata: as in ``nnx.Linear``
        (the metadata carries e.g. sharding annotations).
      save_residuals: what the VJP keeps for the backward pass. ``"full"`` (default): the
        activations and the kernel in their own precision. ``"quantized"``: only the operands the
        backward GEMMs take from them, in ``grad_fmt`` (activations along the batch, the kernel
        along out_features), about 1 byte per element for FP8 instead of 2-4; when
        ``fmt == grad_fmt`` the forward pass quantizes each tensor for both passes in one read.
        Gradients are bit-identical either way.
      amax_history_length: length of ``amax_history`` (0: keep none).
      update_amax: whether forward calls update the amax state (also settable later as the
        attribute ``update_amax``).
      weight_only: inference mode: activations stay in 16 bits (bfloat16/float16; other floats
        rounded to bfloat16) and only the kernel is quantized to ``fmt``, one weight-only
        ``gemm_amax`` (``mx_matmul(..., activations="bf16")``). :meth:`prepare` quantizes the
        kernel once and keeps it (:class:`QuantizedKernel`); until then each call quantizes it, and
        gradients are the straight-through estimator above. A prepared layer is not differentiable.
      rngs: ``nnx.Rngs`` providing the ``params`` stream.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        fmt: str = "mxfp8_e4m3",
        grad_fmt: str = "mxfp8_e4m3",
        out_dtype: Any = None,
        param_dtype: Any = jnp.float32,
        kernel_init=default_kernel_init,
        bias_init=default_bias_init,
        amax_history_length: int = 16,
        update_amax: bool = True,
        weight_only: bool = False,
        save_residuals: str = "full",
        rngs: nnx.Rngs,
        kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
        bias_metadata: Mapping[str, Any] = MappingProxyType({}),
    ):
        formats.get_format(fmt)  # ValueError naming the allowed formats
        formats.get_format(grad_fmt, "grad_fmt")
        _check_save_residuals(save_residuals, "MXLinear")
        for name, flag in (("update_amax", update_amax), ("weight_only", weight_only), ("use_bias", use_bias)):
            if not isinstance(flag, bool | np.bool_):
                raise TypeError(f"MXLinear: {name} must be a bool, got {flag!r}")
        in_features = check_int(in_features, "MXLinear: in_features", minimum=1)
        out_features = check_int(out_features, "MXLinear: out_features", minimum=1)
        amax_history_length = check_int(amax_history_length, "MXLinear: amax_history_length", minimum=0)
        if out_dtype is not None:
            out_dtype = _out_dtype(out_dtype, "MXLinear")

        kernel_key = rngs.params()
        self.kernel = nnx.Param(kernel_init(kernel_key, (in_features, out_features), param_dtype), **kernel_metadata)
        self.bias: nnx.Param | None
        if use_bias:
            bias_key = rngs.params()
            self.bias = nnx.Param(bias_init(bias_key, (out_features,), param_dtype), **bias_metadata)
        else:
            self.bias = nnx.data(None)
        self.output_amax = OutputAmax(jnp.zeros((), jnp.float32))
        self.amax_history: AmaxHistory | None
        if amax_history_length:
            self.amax_history = AmaxHistory(jnp.zeros((amax_history_length,), jnp.float32))
        else:
            self.amax_history = nnx.data(None)

        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias
        self.fmt = fmt
        self.grad_fmt = grad_fmt
        self.out_dtype = out_dtype
        self.param_dtype = param_dtype
        self.amax_history_length = amax_history_length
        self.update_amax = bool(update_amax)
        self.weight_only = bool(weight_only)
        self.save_residuals = save_residuals
        self.kernel_q: QuantizedKernel | None = nnx.data(None)
        self.kernel_scales: QuantizedKernel | None = nnx.data(None)

    def prepare(self) -> None:
        """Quantizes the kernel once for weight-only inference (again after the kernel changes)."""
        if not self.weight_only:
            raise ValueError("MXLinear.prepare: only weight_only=True layers keep a quantized kernel")
        prepared = prepare_weight(self.kernel[...], self.fmt)
        self.kernel_q = QuantizedKernel(prepared.q)
        self.kernel_scales = QuantizedKernel(prepared.scales)

    def _weight(self):
        if self.kernel_q is None:
            return self.kernel[...]
        return PreparedWeight(
            self.kernel_q[...], self.kernel_scales[...], self.fmt, self.in_features, self.out_features
        )

    def __call__(self, inputs) -> jax.Array:
        x = jnp.asarray(inputs)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"MXLinear: inputs must be (..., {self.in_features}), got shape {x.shape}")
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            raise TypeError(f"MXLinear: inputs must be real, got {x.dtype}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(self.param_dtype)
        out_dtype = np.dtype(self.out_dtype if self.out_dtype is not None else x.dtype)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        kernel = self._weight()
        mode = dict(
            fmt=self.fmt,
            grad_fmt=self.grad_fmt,
            activations="bf16" if self.weight_only else "quantized",
            save_residuals=self.save_residuals,
        )
        if self.bias is None:
            y, amax = mx_matmul(x2, kernel, out_dtype=out_dtype, **mode)
        else:
            y, _ = mx_matmul(x2, kernel, out_dtype=jnp.float32, **mode)
            y = y + self.bias[...].astype(jnp.float32)  # d(bias) = fp32 sum of dY
            amax = jax.lax.stop_gradient(formats.magnitude_max(y))  # NaN kept
            y = _round_to(y, out_dtype)
        if self.update_amax:
            self.output_amax[...] = amax
            if self.amax_history is not None:
                history = self.amax_history[...]
                self.amax_history[...] = jnp.concatenate([amax[None].astype(history.dtype), history[:-1]])
        return y.reshape(lead + (self.out_features,))
