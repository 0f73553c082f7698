"""The primitives behind :func:`jax_gemm_amax.quantize` and :func:`jax_gemm_amax.quantize_pair`.

Both take ``x (L, R, K)`` (a floating dtype) and a mode: rows (quantized along K), columns (along
R: the transposed ``(L, K, R)`` codes) or the pair (both from one read of x, rows first). They
return, per orientation, the codes (FP8, or FP4 packed in uint8) and the physical scales, then one
amax per batch item ``(L,)`` (max |x|, NaN where the item holds a NaN).

* ``quantize_p`` is what programs contain: abstract eval, a vmap rule (the mapped axis folds into
  L), and a lowering through ``custom_partitioning``, so that sharded inputs run locally.
* ``quantize_ffi_p`` is the per-device call: on CPU the jnp implementation (``quantize.py``, which
  defines the arithmetic); on CUDA the kernels (``jax_gemm_amax_quantize_cuda``) for float32,
  float16 and bfloat16 inputs, bit-identical to it; other dtypes and empty inputs take the jnp path.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

try:
    from jax.core import ShapedArray
except ImportError:  # pragma: no cover - moved in newer jax
    from jax._src.core import ShapedArray

from .. import _ffi, formats
from .._problem import PACKED_FP4, SCALE_ROWS_PER_BLOCK, is_fp4, scale_shape
from ._partitioning import axes_size, dim_axes, ir_shape, manual_mesh, require_devices_during_lowering, spec_entry

ROWS, COLS, PAIR = 1, 2, 3
# Numbered as ffi/common/quantize_problem.h's QuantizeFormat.
FORMAT_CODES = {"mxfp8_e4m3": 0, "mxfp8_e5m2": 1, "mxfp4": 2, "nvfp4": 3}
KERNEL_INPUTS = (np.dtype(np.float32), np.dtype(jnp.float16), np.dtype(jnp.bfloat16))

quantize_p = Primitive("jax_gemm_amax_quantize")
quantize_p.multiple_results = True
quantize_ffi_p = Primitive("jax_gemm_amax_quantize_ffi")
quantize_ffi_p.multiple_results = True


def _orientation(f, batch, rows, k):
    """Codes and scales of ``(batch, rows, k)`` quantized along k."""
    code_dtype = PACKED_FP4 if is_fp4(f.value_dtype) else f.value_dtype
    q = ShapedArray((batch, rows, k // 2 if code_dtype == PACKED_FP4 else k), code_dtype)
    return [q, ShapedArray(scale_shape(rows, k, f.sf_vec_size, batch), f.scale_dtype)]


def _abstract_eval(x, *, fmt, mode):
    if x.ndim != 3:
        raise ValueError(f"quantize_p takes (L, R, K) inputs, got x of shape {x.shape}")
    f = formats.get_format(fmt)
    batch, rows, k = x.shape
    outs = []
    if mode & ROWS:
        outs += _orientation(f, batch, rows, k)
    if mode & COLS:
        outs += _orientation(f, batch, k, rows)
    return outs + [ShapedArray((batch,), jnp.float32)]


def _def_impl(prim):
    prim.def_impl(jax.jit(prim.bind, static_argnames=("fmt", "mode")))


for _prim in (quantize_p, quantize_ffi_p):
    _prim.def_abstract_eval(_abstract_eval)
    _def_impl(_prim)


def _jnp(x, *, fmt, mode):
    from ..quantize import quantize_jnp  # that module imports this one

    return quantize_jnp(x, fmt, mode)


_jnp_lowering = mlir.lower_fun(_jnp, multiple_results=True)


def _cuda_lowering(ctx, x, *, fmt, mode):
    aval = ctx.avals_in[0]
    if np.dtype(aval.dtype) not in KERNEL_INPUTS or 0 in aval.shape or not _ffi.BUILT_WITH_CUDA:
        return _jnp_lowering(ctx, x, fmt=fmt, mode=mode)
    return jax.ffi.ffi_lowering(_ffi.QUANTIZE_CUDA_TARGET)(
        ctx, x, format=np.int32(FORMAT_CODES[fmt]), mode=np.int32(mode)
    )


mlir.register_lowering(quantize_ffi_p, _jnp_lowering, platform="cpu")
mlir.register_lowering(quantize_ffi_p, _cuda_lowering, platform="cuda")


def _batch_rule(args, dims, *, fmt, mode):
    """vmap folds the mapped axis into L."""
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    size = x.shape[0]
    outs = quantize_p.bind(x.reshape((size * x.shape[1],) + x.shape[2:]), fmt=fmt, mode=mode)
    return [o.reshape((size, -1) + o.shape[1:]) for o in outs], [0] * len(outs)


batching.primitive_batchers[quantize_p] = _batch_rule


# ---------------------------------------------------------------------------------------------
# Sharding: L always stays sharded (where the shards divide it); the dim that becomes the rows of
# an output (R for rows, K for columns) stays sharded where every shard holds whole 128-row scale
# blocks; the quantized axis is gathered. The pair quantizes along both, so only L stays sharded.


def _plan(mesh, shape, x_axes, mode):
    """Per dim of x, the mesh axes it stays sharded over."""
    batch, rows, k = shape
    l_axes, r_axes, k_axes = x_axes
    if batch % axes_size(mesh, l_axes):
        l_axes = ()

    def keep(axes, count):
        if not axes or set(axes) & set(l_axes) or count % (SCALE_ROWS_PER_BLOCK * axes_size(mesh, axes)):
            return ()
        return axes

    return (
        l_axes,
        keep(r_axes, rows) if mode == ROWS else (),
        keep(k_axes, k) if mode == COLS else (),
    )


def _result_shardings(mesh, plan, mode):
    l, r, k = (spec_entry(a) for a in plan)
    out = []
    if mode & ROWS:
        out += [NamedSharding(mesh, P(l, r, None)), NamedSharding(mesh, P(l, r, None, None, None, None))]
    if mode & COLS:
        out += [NamedSharding(mesh, P(l, k, None)), NamedSharding(mesh, P(l, k, None, None, None, None))]
    return tuple(out) + (NamedSharding(mesh, P(l)),)


def _local_quantize(x, fmt, mode):
    return tuple(quantize_ffi_p.bind(x, fmt=fmt, mode=mode))


def _plan_from_shapes(mode, mesh, arg_shapes):
    x = arg_shapes[0]
    return _plan(mesh, x.shape, dim_axes(mesh, 3, x.sharding), mode)


def _infer_sharding_from_operands(fmt, mode, mesh, arg_shapes, result_shape):
    return _result_shardings(mesh, _plan_from_shapes(mode, mesh, arg_shapes), mode)


def pmax_nan(amax, axes):
    """``pmax`` that keeps NaN: amax is >= 0 or NaN, whose bits order as int32 (NaN above +Inf)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(jnp.isnan(amax), jnp.nan, amax), jnp.int32)
    return jax.lax.bitcast_convert_type(jax.lax.pmax(bits, axes), jnp.float32)


def _partition(fmt, mode, mesh, arg_shapes, result_shape):
    plan = _plan_from_shapes(mode, mesh, arg_shapes)
    split_rows = plan[1] + plan[2]  # the axes that split an output's rows share one item's amax
    def lower_fn(x):
        with jax.sharding.use_abstract_mesh(manual_mesh(mesh)):
            *outs, amax = _local_quantize(x, fmt, mode)
            if split_rows:
                amax = pmax_nan(amax, split_rows)
            return (*outs, amax)

    x_sharding = NamedSharding(mesh, P(*(spec_entry(a) for a in plan)))
    return mesh, lower_fn, _result_shardings(mesh, plan, mode), (x_sharding,)


def _sharding_rule(fmt, mode, mesh, operand_types, result_types):
    """Einsum-like Shardy rule: L is shared by every operand and result; the dim that becomes an
    output's rows is a compound factor (scale blocks, rows in a block) where every way of sharding
    it over the mesh leaves whole 128-row blocks, so that sharding it shards the scales with it."""
    _, rows, k = ir_shape(operand_types[0])
    sizes = {}

    def linked(count):
        blocks = count // SCALE_ROWS_PER_BLOCK
        return count % SCALE_ROWS_PER_BLOCK == 0 and blocks > 1 and blocks % mesh.size == 0

    if mode == ROWS and linked(rows):
        sizes["rr"] = SCALE_ROWS_PER_BLOCK
        x, outs = "l (rb rr) k", "l (rb rr) qk, l rb sg si sj sq"
    elif mode == COLS and linked(k):
        sizes["kr"] = SCALE_ROWS_PER_BLOCK
        x, outs = "l r (kb kr)", "l (kb kr) qr, l kb sg si sj sq"
    else:  # whatever the sharding of x, its outputs are computed whole but for L
        x = "l r k"
        outs = ", ".join(
            f"l a{i} b{i}" if i % 2 == 0 else f"l c{i} d{i} e{i} f{i} g{i}" for i in range(len(result_types) - 1)
        )
    return f"{x} -> {outs}, l", sizes


_partitioned = custom_partitioning(_local_quantize, static_argnums=(1, 2))
_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding_from_operands,
    decode_shardings=False,
    sharding_rule=_sharding_rule,
)


def _lower(x, *, fmt, mode):
    return _partitioned(x, fmt, mode)


mlir.register_lowering(quantize_p, mlir.lower_fun(_lower, multiple_results=True))

require_devices_during_lowering(quantize_p)

