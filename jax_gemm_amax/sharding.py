"""Sharded gemm_amax: ``custom_partitioning`` with a Shardy rule.

How a sharded call runs (decided in :func:`_plan`, from the operands' shardings):

* L, M and N shard without communication. Scales follow their operand: the physical scale
  tensor's row-block dim is the major part of M (or N), its K-block dim the major part of K, so
  a dim is kept sharded only where every shard owns whole 128-row (or 4-group) scale blocks;
  otherwise it is replicated (XLA reshards the operand). So is a dim split in a way no tuple of
  whole mesh axes describes (fewer blocks than shards, where Shardy may split a mesh axis).
* K sharding computes each shard's partial C in fp32, sums it across the K axes (``psum``, or
  ``psum_scatter`` when the requested output is sharded along those axes over M or N), and
  only then takes amax and rounds to ``c_dtype``: amax is that of the full sum.
* amax is the ``pmax`` of the local amaxes over the axes that split C.

Inside ``shard_map`` (all axes manual) the op runs on the local blocks as written; the user
reduces amax with ``jax.lax.pmax``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from . import formats
from ._problem import PACKED_FP4, SCALE_GROUPS_PER_BLOCK, SCALE_ROWS_PER_BLOCK
from .primitive import PARAMS, gemm_amax_ffi_p, gemm_amax_p


def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _size(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def _dim_axes(mesh, ndim, sharding) -> tuple[tuple[str, ...], ...]:
    """The mesh axes (major first) that split each dim of an operand; () for a dim kept whole or
    split in a way no tuple of whole mesh axes describes (Shardy's sub-axes, such as half of a
    4-way axis over a dim of 2 scale blocks). The partitioner takes raw shardings
    (``decode_shardings=False``): JAX cannot write such a split as a PartitionSpec and would fail
    before the rule runs, even for operands whose sharding the rule replaces anyway."""
    if sharding is None:
        return ((),) * ndim
    # Which shard each device holds does not depend on the dim sizes; this probe shape is one that
    # every tiling divides (a dim may be split unevenly, which devices_indices_map refuses).
    index = sharding.devices_indices_map((mesh.size,) * ndim)
    coords = {dev: dict(zip(mesh.axis_names, pos)) for pos, dev in np.ndenumerate(mesh.devices)}
    if not set(index) <= set(coords):
        return ((),) * ndim
    axes_in_use = [a for a in mesh.axis_names if mesh.shape[a] > 1]

    def shard_index(coord, axes):
        return functools.reduce(lambda i, a: i * mesh.shape[a] + coord[a], axes, 0)

    result = []
    for d in range(ndim):
        starts = {dev: slices[d].start or 0 for dev, slices in index.items()}
        shard = {start: i for i, start in enumerate(sorted(set(starts.values())))}
        candidates = [
            axes
            for r in range(1, len(axes_in_use) + 1)
            for axes in itertools.permutations(axes_in_use, r)
            if len(shard) > 1 and _size(mesh, axes) == len(shard)
        ]
        result.append(next(
            (axes for axes in candidates
             if all(shard[start] == shard_index(coords[dev], axes) for dev, start in starts.items())),
            (),
        ))
    return tuple(result)


@dataclasses.dataclass(frozen=True)
class _Plan:
    l: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    scatter_dim: int | None  # with K sharded: 1 (M) or 2 (N) to psum_scatter the sum into, else psum

    def operand_shardings(self, mesh):
        l, m, n, k = (_entry(x) for x in (self.l, self.m, self.n, self.k))
        return (
            NamedSharding(mesh, P(l, m, k)),
            NamedSharding(mesh, P(l, n, k)),
            NamedSharding(mesh, P(l, m, k, None, None, None)),
            NamedSharding(mesh, P(l, n, k, None, None, None)),
        )

    def c_axes(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        m, n = self.m, self.n
        if self.scatter_dim == 1:
            m = self.k
        elif self.scatter_dim == 2:
            n = self.k
        return m, n

    def result_shardings(self, mesh):
        m, n = self.c_axes()
        return (NamedSharding(mesh, P(_entry(self.l), _entry(m), _entry(n))), NamedSharding(mesh, P(_entry(self.l))))


def _plan(mesh, a_shape, b_shape, k_groups, c_dtype, a_axes, b_axes, c_axes) -> _Plan:
    """``*_axes``: per dim, the mesh axes that split it (:func:`_dim_axes`)."""
    batch, m, _ = a_shape
    n = b_shape[1]
    l_axes, m_a, k_a = a_axes
    _, n_b, k_b = b_axes
    if batch % _size(mesh, l_axes):
        l_axes = ()
    used = set(l_axes)

    def keep(axes, rows):
        if not axes or used & set(axes) or rows % (SCALE_ROWS_PER_BLOCK * _size(mesh, axes)):
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
        or k_groups % (SCALE_GROUPS_PER_BLOCK * _size(mesh, k_axes))
    ):
        k_axes = ()

    scatter_dim = None
    if k_axes:
        _, m_c, n_c = c_axes
        k_size = _size(mesh, k_axes)
        packed = np.dtype(c_dtype) == PACKED_FP4
        if m_c == k_axes and not m_axes and m % k_size == 0:
            scatter_dim = 1
        elif n_c == k_axes and not n_axes and n % (k_size * (2 if packed else 1)) == 0:
            scatter_dim = 2
    return _Plan(l_axes, m_axes, n_axes, k_axes, scatter_dim)


def _local_gemm_amax(a, b, sfa, sfb, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    return tuple(
        gemm_amax_ffi_p.bind(
            a, b, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sf_vec_size,
            tile_m=tile_m, tile_n=tile_n, cluster_m=cluster_m, cluster_n=cluster_n,
        )
    )


def _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, c_sharding):
    a, b = arg_shapes[0], arg_shapes[1]
    k = a.shape[2] * (2 if np.dtype(a.dtype) == PACKED_FP4 else 1)
    a_axes, b_axes, c_axes = (_dim_axes(mesh, 3, s) for s in (a.sharding, b.sharding, c_sharding))
    return _plan(mesh, a.shape, b.shape, k // sf_vec_size, c_dtype, a_axes, b_axes, c_axes)


def _infer_sharding_from_operands(c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, arg_shapes, result_shape):
    plan = _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, None)
    return plan.result_shardings(mesh)


def _partition(c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, arg_shapes, result_shape):
    plan = _plan_from_shapes(c_dtype, sf_vec_size, mesh, arg_shapes, result_shape[0].sharding)
    c_m_axes, c_n_axes = plan.c_axes()
    amax_axes = c_m_axes + c_n_axes
    hints = dict(tile_m=tile_m, tile_n=tile_n, cluster_m=cluster_m, cluster_n=cluster_n)

    # lower_fn runs per device: trace it under the mesh with every axis Manual, as shard_map does.
    # Without this, jax 0.11 traces it under the caller's mesh; on an Explicit mesh the collectives'
    # reducer bodies then carry sharding annotations and XLA rejects them (GPU: a CHECK failure in
    # AllReduceThunk; CPU: "Unsupported reduction computation").
    manual_mesh = mesh.abstract_mesh.update_axis_types({name: AxisType.Manual for name in mesh.axis_names})

    def lower_fn(a, b, sfa, sfb):
        with jax.sharding.use_abstract_mesh(manual_mesh):
            if not plan.k:
                c, amax = _local_gemm_amax(a, b, sfa, sfb, c_dtype, sf_vec_size, **hints)
            else:
                # Partial sums in fp32; amax and rounding only after the sum over K.
                c32, _ = _local_gemm_amax(a, b, sfa, sfb, np.dtype(np.float32), sf_vec_size, **hints)
                if plan.scatter_dim is None:
                    c32 = jax.lax.psum(c32, plan.k)
                else:
                    c32 = jax.lax.psum_scatter(c32, plan.k, scatter_dimension=plan.scatter_dim, tiled=True)
                amax = jnp.max(jnp.abs(c32), axis=(1, 2))
                c = formats.saturating_cast(c32, c_dtype)
            if amax_axes:
                amax = jax.lax.pmax(amax, amax_axes)
            return c, amax

    return mesh, lower_fn, plan.result_shardings(mesh), plan.operand_shardings(mesh)


def _shape(ir_type) -> tuple[int, ...]:
    return tuple(mlir.ir.RankedTensorType(ir_type).shape)


def _sharding_rule(c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n, mesh, operand_types, result_types):
    """Einsum-like Shardy rule. Where M (N, K) is a whole number of scale blocks, and every way of
    sharding it over the mesh leaves whole blocks, it is a compound factor whose major part is the
    scale tensor's block dim, so sharding one shards the other."""
    a, _, sfa, sfb = (_shape(t) for t in operand_types)
    c = _shape(result_types[0])
    m, kb = a[1], a[2]
    n = _shape(operand_types[1])[1]
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

    a_rows = rows("m", m, sfa[1], "mr", SCALE_ROWS_PER_BLOCK)
    b_rows = rows("n", n, sfb[1], "nr", SCALE_ROWS_PER_BLOCK)
    c_cols = rows("n", n, sfb[1], "nc", c[2] // sfb[1]) if b_rows.startswith("(") else "n"
    sfa_rows = "mb" if a_rows.startswith("(") else "ma"
    sfb_rows = "nb" if b_rows.startswith("(") else "na"
    k_blocks = sfa[2]
    k_elems = kb * 2 if _is_packed(operand_types[0]) else kb
    if linked(k_blocks) and k_blocks * SCALE_GROUPS_PER_BLOCK * sf_vec_size == k_elems:
        sizes["kr"] = kb // k_blocks
        k_fac, sf_k = "(kb kr)", "kb"
    else:
        k_fac, sf_k = "k", "kg"
    # The (32, 4, 4) atoms inside a block: their own factors per operand (sfa's and sfb's are
    # unrelated; one shared factor would carry a split of sfa's atom over to sfb and so to b).
    rule = (
        f"l {a_rows} {k_fac}, l {b_rows} {k_fac}, l {sfa_rows} {sf_k} ai aj aq, l {sfb_rows} {sf_k} bi bj bq"
        f" -> l {a_rows} {c_cols}, l"
    )
    return rule, sizes


def _is_packed(ir_type) -> bool:
    """uint8 operands are packed FP4 (two elements per byte)."""
    return str(mlir.ir.RankedTensorType(ir_type).element_type) == "ui8"


_partitioned = custom_partitioning(_local_gemm_amax, static_argnums=tuple(range(4, 4 + len(PARAMS))))
_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding_from_operands,
    decode_shardings=False,
    sharding_rule=_sharding_rule,
)


def _lower(a, b, sfa, sfb, **params):
    return _partitioned(a, b, sfa, sfb, *(params[p] for p in PARAMS))


mlir.register_lowering(gemm_amax_p, mlir.lower_fun(_lower, multiple_results=True))

try:  # eager calls of a partitioned primitive need the devices during lowering
    from jax._src import dispatch as _dispatch

    _dispatch.prim_requires_devices_during_lowering.add(gemm_amax_p)
except (ImportError, AttributeError):  # pragma: no cover - internal API moved
    pass
