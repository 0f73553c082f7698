"""The primitives behind :func:`jax_gemm_amax.quantize` and :func:`jax_gemm_amax.quantize_pair`.

Both take ``x (L, R, K)`` (a floating dtype) and a mode: rows (quantized along K), columns (along
R: the transposed ``(L, K, R)`` codes) or the pair (both from one read of x, rows first). They
return, per orientation, the codes (FP8, or FP4 packed in uint8) and the physical scales, then one
amax per batch item ``(L,)`` (max |x|, NaN where the item holds a NaN).

* ``quantize_p`` is what programs contain: abstract eval, a vmap rule (the mapped axis folds into
  L), and a lowering through ``custom_partitioning``, so that sharded inputs run locally.
* ``quantize_ffi_p`` is the per-device call: on CPU the jnp implementation (``quantize.py``, which
  defines the arithmetic); on CUDA the kernels (``jax_gemm_amax_quantize_cuda``) for float32,
  float16 and bfloat16 inputs on Hopper and Blackwell, bit-identical to it; other dtypes, other
  GPUs and empty inputs take the jnp path.
"""

from __future__ import annotations

import functools

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
from .._problem import PACKED_FP4, SCALE_GROUPS_PER_BLOCK, SCALE_ROWS_PER_BLOCK, is_fp4, scale_shape
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


@functools.lru_cache(maxsize=None)
def _kernels_run_here() -> bool:
    """Whether this process's GPUs are ones the kernels are built for (Hopper 9.0, Blackwell 10.0);
    other GPUs keep the jnp path. Lowering for a GPU this process does not have assumes one."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return True
    return all(str(getattr(d, "compute_capability", "")) in ("9.0", "10.0") for d in devices)


def _cuda_lowering(ctx, x, *, fmt, mode):
    aval = ctx.avals_in[0]
    kernel = _ffi.BUILT_WITH_CUDA and _kernels_run_here()
    if np.dtype(aval.dtype) not in KERNEL_INPUTS or 0 in aval.shape or not kernel:
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
    return [o.reshape((size, x.shape[1]) + o.shape[1:]) for o in outs], [0] * len(outs)


batching.primitive_batchers[quantize_p] = _batch_rule


# ---------------------------------------------------------------------------------------------
# Sharding: L stays sharded where the shards divide it. R and K stay sharded where every shard
# holds whole scale blocks of each role the dim plays: 128 rows where it becomes an output's rows,
# 4 groups (4 * sf_vec_size elements) where it is quantized along; so the pair, where both dims
# play both roles, needs 128. Elsewhere the dim is gathered (XLA reshards x).


def _block(fmt, mode, dim):
    """Elements per shard-able block of x's dim 1 (R) or 2 (K)."""
    rows_role = mode & (ROWS if dim == 1 else COLS)
    return SCALE_ROWS_PER_BLOCK if rows_role else SCALE_GROUPS_PER_BLOCK * formats.get_format(fmt).sf_vec_size


def _plan(mesh, shape, x_axes, fmt, mode):
    """Per dim of x, the mesh axes it stays sharded over."""
    l_axes = x_axes[0] if shape[0] % axes_size(mesh, x_axes[0]) == 0 else ()
    used = set(l_axes)
    plan = [l_axes]
    for dim in (1, 2):
        axes = x_axes[dim]
        if not axes or used & set(axes) or shape[dim] % (_block(fmt, mode, dim) * axes_size(mesh, axes)):
            axes = ()
        used.update(axes)
        plan.append(axes)
    return tuple(plan)


def _result_shardings(mesh, plan, mode):
    l, r, k = (spec_entry(a) for a in plan)
    out = []
    if mode & ROWS:
        out += [NamedSharding(mesh, P(l, r, k)), NamedSharding(mesh, P(l, r, k, None, None, None))]
    if mode & COLS:
        out += [NamedSharding(mesh, P(l, k, r)), NamedSharding(mesh, P(l, k, r, None, None, None))]
    return tuple(out) + (NamedSharding(mesh, P(l)),)


def _local_quantize(x, fmt, mode):
    return tuple(quantize_ffi_p.bind(x, fmt=fmt, mode=mode))


def _plan_from_shapes(fmt, mode, mesh, arg_shapes):
    x = arg_shapes[0]
    return _plan(mesh, x.shape, dim_axes(mesh, 3, x.sharding), fmt, mode)


def _infer_sharding_from_operands(fmt, mode, mesh, arg_shapes, result_shape):
    return _result_shardings(mesh, _plan_from_shapes(fmt, mode, mesh, arg_shapes), mode)


def _partition(fmt, mode, mesh, arg_shapes, result_shape):
    plan = _plan_from_shapes(fmt, mode, mesh, arg_shapes)
    within_item = plan[1] + plan[2]  # the axes that split one item share its amax

    def lower_fn(x):
        with jax.sharding.use_abstract_mesh(manual_mesh(mesh)):
            *outs, amax = _local_quantize(x, fmt, mode)
            if within_item:
                amax = formats.pmax_amax(amax, within_item)
            return (*outs, amax)

    x_sharding = NamedSharding(mesh, P(*(spec_entry(a) for a in plan)))
    return mesh, lower_fn, _result_shardings(mesh, plan, mode), (x_sharding,)


def _sharding_rule(fmt, mode, mesh, operand_types, result_types):
    """Einsum-like Shardy rule. L is shared by x and every result. R (K) is a compound factor
    (blocks, elements in a block) where every way of sharding it over the mesh leaves whole
    blocks (``_block``); its block factor is then the major part of each result dim it becomes
    (rows, codes, scale blocks), so sharding one shards the others. Other dims get factors of
    their own in every result."""
    f = formats.get_format(fmt)
    shape = ir_shape(operand_types[0])
    sizes = {}
    fresh = iter(f"u{i}" for i in range(64))

    def factors(dim):
        """x's factor and, per role, the result factor of dim 1 (r) or 2 (k)."""
        name, n, block = "rk"[dim - 1], shape[dim], _block(fmt, mode, dim)
        blocks = n // block
        if n % block or blocks < 2 or blocks % mesh.size:  # Shardy would split a mesh axis (or takes no size 1)
            # The codes of the same length still follow x (the partitioner then decides).
            codes = next(fresh) if is_fp4(f.value_dtype) else name
            return name, {"rows": name, "scale_rows": next(fresh), "codes": codes, "groups": next(fresh)}

        def part(suffix, size):
            if size == 1:
                return f"{name}b"
            sizes[f"{name}{suffix}"] = size
            return f"({name}b {name}{suffix})"

        return part("e", block), {
            "rows": part("e", block),
            "scale_rows": part("s", block // SCALE_ROWS_PER_BLOCK) if block >= SCALE_ROWS_PER_BLOCK else next(fresh),
            "codes": part("c", block // 2 if is_fp4(f.value_dtype) else block),
            "groups": part("g", block // (SCALE_GROUPS_PER_BLOCK * f.sf_vec_size)),
        }

    (x_r, r), (x_k, k) = factors(1), factors(2)
    outs = []
    for rows, along in ((r, k),) * bool(mode & ROWS) + ((k, r),) * bool(mode & COLS):
        outs.append(f"l {rows['rows']} {along['codes']}")
        outs.append(f"l {rows['scale_rows']} {along['groups']} {next(fresh)} {next(fresh)} {next(fresh)}")
    rule = f"l {x_r} {x_k} -> {', '.join(outs)}, l"
    used = set(rule.replace("(", " ").replace(")", " ").replace(",", " ").split())
    return rule, {name: size for name, size in sizes.items() if name in used}


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
