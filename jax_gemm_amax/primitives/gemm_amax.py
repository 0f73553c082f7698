"""The primitives behind :func:`jax_gemm_amax.gemm_amax`, with all their rules.

Both take normalized operands only: ``a (L, M, Kb)``, ``b (L, N, Kb)`` (FP8, or packed FP4 as
uint8), physical scales ``(L, rows', G', 32, 4, 4)``, and return ``c (L, M, N)`` (``N // 2``
bytes for packed FP4) and one amax per batch item ``(L,)``.

* ``gemm_amax_p`` is what programs contain: abstract eval, a vmap rule, and a lowering through
  ``custom_partitioning`` (with a Shardy rule) so that sharded operands run locally.
* ``gemm_amax_ffi_p`` is the per-device call: it lowers to the FFI target of the platform. The
  Python side knows nothing about which GPU runs it: the CUDA handler dispatches, and the
  extension sizes its workspace.

Weight-only calls (``a (L, M, K)`` bfloat16/float16, unscaled) bind the same primitives without
the ``sfa`` operand: ``(a, b, sfb)``. On CPU they lower to their own FFI target; on CUDA to the
weight-only CUDA target where a kernel takes the problem (the Hopper GEMM for a bfloat16 A of
more than 64 rows, else the few-row kernel for M <= 128 on sm_90a or sm_100a; the extension
answers, ``_ffi.weight_only_kernel_workspace``), else through XLA itself
(:func:`jax_gemm_amax.ops.weight_only_sum`, a cuBLAS dot). Their sharding follows the same plan,
without ``sfa``.

The public function does the normalization (2-D inputs, layouts, float4 packing, c_major, the
final max over L).

How a sharded call runs (decided in :func:`_plan`, from the operands' shardings):

* L, M and N shard without communication. Scales follow their operand: the physical scale
  tensor's row-block dim is the major part of M (or N), its K-block dim the major part of K, so
  a dim is kept sharded only where every shard owns whole 128-row (or 4-group) scale blocks;
  otherwise it is replicated (XLA reshards the operand). So is a dim split in a way no tuple of
  whole mesh axes describes (fewer blocks than shards, where Shardy may split a mesh axis).
* K sharding computes each shard's partial C in fp32, sums it across the K axes (``psum``, or
  ``psum_scatter`` when the requested output is sharded along those axes over M or N), and
  only then takes amax and rounds to ``c_dtype``: amax is that of the full sum.
* amax is the ``pmax`` of the local amaxes over the axes that split C (on their bits: NaN kept).

Inside ``shard_map`` (all axes manual) the op runs on the local blocks as written; the user
reduces amax with ``jax.lax.pmax``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive

try:
    from jax.core import ShapedArray
except ImportError:  # pragma: no cover - moved in newer jax
    from jax._src.core import ShapedArray
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .. import _ffi, formats
from .._problem import PACKED_FP4, SCALE_GROUPS_PER_BLOCK, SCALE_ROWS_PER_BLOCK, check_problem
from ._partitioning import axes_size, dim_axes, ir_shape, manual_mesh, require_devices_during_lowering, spec_entry

PARAMS = ("c_dtype", "sf_vec_size", "tile_m", "tile_n", "cluster_m", "cluster_n")

gemm_amax_p = Primitive("jax_gemm_amax")
gemm_amax_p.multiple_results = True
gemm_amax_ffi_p = Primitive("jax_gemm_amax_ffi")
gemm_amax_ffi_p.multiple_results = True


# --- abstract eval and impl (both primitives) ---


def _split(operands):
    """``(a, b, sfa, sfb)``, sfa None for the weight-only form ``(a, b, sfb)``."""
    if len(operands) == 3:
        a, b, sfb = operands
        return a, b, None, sfb
    return operands


def _abstract_eval(*operands, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    a, b, sfa, sfb = _split(operands)
    if a.ndim != 3:
        raise ValueError(f"gemm_amax_p takes (L, M, K) operands, got a of shape {a.shape}")
    p, _, _ = check_problem(
        a,
        b,
        sfa,
        sfb,
        c_dtype=c_dtype,
        sf_vec_size=sf_vec_size,
        acc_dtype=np.float32,
        mma_tiler_mn=(tile_m, tile_n),
        cluster_shape_mn=(cluster_m, cluster_n),
        c_major="n",
    )
    c_dtype = np.dtype(c_dtype)
    n_stored = p.n // 2 if c_dtype == PACKED_FP4 else p.n
    return (
        ShapedArray((p.batch, p.m, n_stored), c_dtype),
        ShapedArray((p.batch,), jnp.float32),
    )


for _prim in (gemm_amax_p, gemm_amax_ffi_p):
    _prim.def_abstract_eval(_abstract_eval)
    _prim.def_impl(jax.jit(_prim.bind, static_argnames=PARAMS))


# --- vmap ---


def _batch_rule(args, dims, **params):
    """vmap folds the mapped axis into L: one amax per (mapped item, batch item)."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    folded = []
    for x, d in zip(args, dims):
        if d is None:  # not mapped
            x = jnp.broadcast_to(x, (size,) + x.shape)
        else:
            x = jnp.moveaxis(x, d, 0)
        folded.append(x.reshape((size * x.shape[1],) + x.shape[2:]))
    c, amax = gemm_amax_p.bind(*folded, **params)
    return (c.reshape((size, -1) + c.shape[1:]), amax.reshape(size, -1)), (0, 0)


batching.primitive_batchers[gemm_amax_p] = _batch_rule


# --- FFI lowerings of the per-device call (CPU, CUDA) ---


def _ffi_lowering(ctx, *operands, target, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    del c_dtype  # carried by the result type
    return jax.ffi.ffi_lowering(target)(
        ctx,
        *operands,
        sf_vec_size=np.int32(sf_vec_size),
        tile_m=np.int32(tile_m),
        tile_n=np.int32(tile_n),
        cluster_m=np.int32(cluster_m),
        cluster_n=np.int32(cluster_n),
    )


def _cuda_workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size) -> int:
    """Device workspace the CUDA handler gets, as the extension's kernels ask for it
    (``_ffi.workspace_bytes``; a different size would only narrow the SM90 kernel's plans). The
    BF16 copies of the operands the SM90 kernel may convert once per call (B with many rows, A with
    many columns; 2 bytes per element) are included unless JAX_GEMM_AMAX_PRECONVERT=0 (read when a
    program is lowered): less memory, both operands converted inside the GEMM (the GEMM and passes
    take 9-18% less time with the copies on large problems, ncu on an H200)."""
    offer_copies = os.environ.get("JAX_GEMM_AMAX_PRECONVERT", "1") != "0"
    return _ffi.workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, offer_copies)


def _weight_only_xla(a, b, sfb, *, c_dtype, sf_vec_size, **hints):
    """A weight-only call through XLA: the fp32 sum, amax on it, then C rounded as the kernels do."""
    from ..ops import weight_only_sum  # ops imports this module

    acc = weight_only_sum(a, b, sfb, sf_vec_size)
    return formats.saturating_cast(acc, c_dtype), formats.magnitude_max(acc, axis=(1, 2))


def _with_workspace(ctx, operands, nbytes, target, params):
    """The custom call with its workspace as a third result that the primitive does not return:
    XLA owns it (FFI scratch would be freed before a recorded CUDA graph replays; cuda_handler.cc)."""
    workspace = ShapedArray((nbytes,), np.uint8)
    ctx3 = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    c, amax, _ = _ffi_lowering(ctx3, *operands, target=target, **params)
    return [c, amax]


def _cuda_weight_only_lowering(ctx, a, b, sfb, **params):
    batch, m, k = ctx.avals_in[0].shape
    n = ctx.avals_in[1].shape[1]
    b_dtype, sfb_dtype = ctx.avals_in[1].dtype, ctx.avals_in[2].dtype
    nbytes = -1
    if _ffi.BUILT_WITH_CUDA:
        nbytes = _ffi.weight_only_kernel_workspace(
            batch, m, n, k, ctx.avals_in[0].dtype, b_dtype, sfb_dtype, params["sf_vec_size"]
        )
    if nbytes < 0:
        return mlir.lower_fun(functools.partial(_weight_only_xla, **params), multiple_results=True)(ctx, a, b, sfb)
    return _with_workspace(ctx, (a, b, sfb), nbytes, _ffi.CUDA_WEIGHT_ONLY_TARGET, params)


def _cuda_lowering(ctx, *operands, **params):
    if len(operands) == 3:
        return _cuda_weight_only_lowering(ctx, *operands, **params)
    if not _ffi.BUILT_WITH_CUDA:
        raise NotImplementedError(
            "jax_gemm_amax was built without its CUDA backend (no nvcc at build time); "
            "reinstall with nvcc on PATH (JAX_GEMM_AMAX_CUDA=ON makes its absence an error)"
        )
    a_aval = ctx.avals_in[0]
    batch, m, row_bytes = a_aval.shape  # FP8: one byte per element; packed FP4: two elements per byte
    n = ctx.avals_in[1].shape[1]
    k = row_bytes * (2 if np.dtype(a_aval.dtype) == PACKED_FP4 else 1)
    nbytes = _cuda_workspace_bytes(batch, m, n, k, a_aval.dtype, ctx.avals_in[2].dtype, params["sf_vec_size"])
    return _with_workspace(ctx, operands, nbytes, _ffi.CUDA_TARGET, params)


def _cpu_lowering(ctx, *operands, **params):
    target = _ffi.CPU_TARGET if len(operands) == 4 else _ffi.CPU_WEIGHT_ONLY_TARGET
    return _ffi_lowering(ctx, *operands, target=target, **params)


mlir.register_lowering(gemm_amax_ffi_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(gemm_amax_ffi_p, _cuda_lowering, platform="cuda")


# --- partitioning of gemm_amax_p (custom_partitioning and the Shardy rule) ---


@dataclasses.dataclass(frozen=True)
class _Plan:
    l: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    scatter_dim: int | None  # with K sharded: 1 (M) or 2 (N) to psum_scatter the sum into, else psum

    def operand_shardings(self, mesh, weight_only=False):
        l, m, n, k = (spec_entry(x) for x in (self.l, self.m, self.n, self.k))
        a, b = NamedSharding(mesh, P(l, m, k)), NamedSharding(mesh, P(l, n, k))
        sfa = NamedSharding(mesh, P(l, m, k, None, None, None))
        sfb = NamedSharding(mesh, P(l, n, k, None, None, None))
        return (a, b, sfb) if weight_only else (a, b, sfa, sfb)

    def c_axes(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        m, n = self.m, self.n
        if self.scatter_dim == 1:
            m = self.k
        elif self.scatter_dim == 2:
            n = self.k
        return m, n

    def result_shardings(self, mesh):
        m, n = self.c_axes()
        return (
            NamedSharding(mesh, P(spec_entry(self.l), spec_entry(m), spec_entry(n))),
            NamedSharding(mesh, P(spec_entry(self.l))),
        )


def _plan(mesh, a_shape, b_shape, k_groups, c_dtype, a_axes, b_axes, c_axes) -> _Plan:
    """``*_axes``: per dim, the mesh axes that split it (:func:`_partitioning.dim_axes`)."""
    batch, m, _ = a_shape
    n = b_shape[1]
    l_axes, m_a, k_a = a_axes
    _, n_b, k_b = b_axes
    if batch % axes_size(mesh, l_axes):
        l_axes = ()
    used = set(l_axes)

    def keep(axes, rows):
        if not axes or used & set(axes) or rows % (SCALE_ROWS_PER_BLOCK * axes_size(mesh, axes)):
            return ()
        used.update(axes)
        return axes

    m_axes = keep(m_a, m)
    n_axes = keep(n_b, n)
    k_axes = k_a
    if (
        not k_axes
        or k_axes != k_b
        or used & set(k_axes)
        or k_groups % (SCALE_GROUPS_PER_BLOCK * axes_size(mesh, k_axes))
    ):
        k_axes = ()

    scatter_dim = None
    if k_axes:
        _, m_c, n_c = c_axes
        k_size = axes_size(mesh, k_axes)
        packed = np.dtype(c_dtype) == PACKED_FP4
        if m_c == k_axes and not m_axes and m % k_size == 0:
            scatter_dim = 1
        elif n_c == k_axes and not n_axes and n % (k_size * (2 if packed else 1)) == 0:
            scatter_dim = 2
    return _Plan(l_axes, m_axes, n_axes, k_axes, scatter_dim)


def _local_gemm_amax(*args):
    operands, (c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n) = args[: -len(PARAMS)], args[-len(PARAMS) :]
    return tuple(
        gemm_amax_ffi_p.bind(
            *operands,
            c_dtype=c_dtype,
            sf_vec_size=sf_vec_size,
            tile_m=tile_m,
            tile_n=tile_n,
            cluster_m=cluster_m,
            cluster_n=cluster_n,
        )
    )


def _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, c_sharding):
    a, b = arg_shapes[0], arg_shapes[1]
    k = a.shape[2] * (2 if np.dtype(a.dtype) == PACKED_FP4 else 1)
    a_axes, b_axes, c_axes = (dim_axes(mesh, 3, s) for s in (a.sharding, b.sharding, c_sharding))
    return _plan(mesh, a.shape, b.shape, k // sf_vec_size, c_dtype, a_axes, b_axes, c_axes)


def _infer_sharding_from_operands(
    c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, arg_shapes, result_shape
):
    plan = _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, None)
    return plan.result_shardings(mesh)


def _partition(c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, arg_shapes, result_shape):
    plan = _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, result_shape[0].sharding)
    c_m_axes, c_n_axes = plan.c_axes()
    amax_axes = c_m_axes + c_n_axes
    hints = (tile_m, tile_n, cluster_m, cluster_n)
    per_device_mesh = manual_mesh(mesh)

    weight_only = len(arg_shapes) == 3

    def lower_fn(*operands):
        with jax.sharding.use_abstract_mesh(per_device_mesh):
            if not plan.k:
                c, amax = _local_gemm_amax(*operands, c_dtype, sf_vec_size, *hints)
            else:
                # Partial sums in fp32; amax and rounding only after the sum over K.
                c32, _ = _local_gemm_amax(*operands, np.dtype(np.float32), sf_vec_size, *hints)
                if plan.scatter_dim is None:
                    c32 = jax.lax.psum(c32, plan.k)
                else:
                    c32 = jax.lax.psum_scatter(c32, plan.k, scatter_dimension=plan.scatter_dim, tiled=True)
                amax = formats.magnitude_max(c32, axis=(1, 2))  # NaN kept
                c = formats.saturating_cast(c32, c_dtype)
            if amax_axes:
                amax = formats.pmax_amax(amax, amax_axes)
            return c, amax

    return mesh, lower_fn, plan.result_shardings(mesh), plan.operand_shardings(mesh, weight_only)


def _sharding_rule(c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, operand_types, result_types):
    """Einsum-like Shardy rule. Where M (N, K) is a whole number of scale blocks, and every way of
    sharding it over the mesh leaves whole blocks, it is a compound factor whose major part is the
    scale tensor's block dim, so sharding one shards the other."""
    weight_only = len(operand_types) == 3
    a = ir_shape(operand_types[0])
    sfb = ir_shape(operand_types[-1])
    c = ir_shape(result_types[0])
    m = a[1]
    b = ir_shape(operand_types[1])
    n, kb = b[1], b[2]
    sizes = {}

    def linked(block_count):
        # Every product of mesh axes divides the block count: elsewhere Shardy would split an axis
        # to fit the blocks (half of a 4-way axis over 2 blocks) and shard the operand inside a
        # block. Shardy also takes no size-1 factors.
        return block_count > 1 and block_count % mesh.size == 0

    def rows(name, count, block_count, minor_name, minor_size):
        if linked(block_count) and block_count * SCALE_ROWS_PER_BLOCK == count:
            sizes[minor_name] = minor_size
            return f"({name}b {minor_name})"
        return f"{name}"

    m_blocks = -(-m // SCALE_ROWS_PER_BLOCK)
    a_rows = rows("m", m, m_blocks, "mr", SCALE_ROWS_PER_BLOCK)
    b_rows = rows("n", n, sfb[1], "nr", SCALE_ROWS_PER_BLOCK)
    c_cols = rows("n", n, sfb[1], "nc", c[2] // sfb[1]) if b_rows.startswith("(") else "n"
    sfa_rows = "mb" if a_rows.startswith("(") else "ma"
    if weight_only and a_rows.startswith("("):  # no sfa names mb's size
        sizes["mb"] = m_blocks
    sfb_rows = "nb" if b_rows.startswith("(") else "na"
    k_blocks = sfb[2]
    packed_b = _is_packed(operand_types[1])
    k_elems = kb * 2 if packed_b else kb
    if linked(k_blocks) and k_blocks * SCALE_GROUPS_PER_BLOCK * sf_vec_size == k_elems:
        sizes["kr"] = kb // k_blocks
        k_fac, sf_k = "(kb kr)", "kb"
    else:
        k_fac, sf_k = "k", "kg"
    a_k = k_fac
    if weight_only and packed_b:  # a holds K elements where b holds K / 2 bytes: a minor factor of 2
        sizes["kp"] = 2
        a_k = f"({k_fac.strip('()')} kp)"
    # The (32, 4, 4) atoms inside a block: their own factors per operand (sfa's and sfb's are
    # unrelated; one shared factor would carry a split of sfa's atom over to sfb and so to b).
    sfa_rule = "" if weight_only else f" l {sfa_rows} {sf_k} ai aj aq,"
    rule = f"l {a_rows} {a_k}, l {b_rows} {k_fac},{sfa_rule} l {sfb_rows} {sf_k} bi bj bq -> l {a_rows} {c_cols}, l"
    return rule, sizes


def _is_packed(ir_type) -> bool:
    """uint8 operands are packed FP4 (two elements per byte)."""
    return str(mlir.ir.RankedTensorType(ir_type).element_type) == "ui8"


def _partitioned_call(operand_count):
    fn = custom_partitioning(_local_gemm_amax, static_argnums=tuple(range(operand_count, operand_count + len(PARAMS))))
    fn.def_partition(
        partition=_partition,
        infer_sharding_from_operands=_infer_sharding_from_operands,
        decode_shardings=False,
        sharding_rule=_sharding_rule,
    )
    return fn


_partitioned = {4: _partitioned_call(4), 3: _partitioned_call(3)}  # both-scaled, weight-only


def _lower(*operands, **params):
    return _partitioned[len(operands)](*operands, *(params[p] for p in PARAMS))


mlir.register_lowering(gemm_amax_p, mlir.lower_fun(_lower, multiple_results=True))
require_devices_during_lowering(gemm_amax_p)
