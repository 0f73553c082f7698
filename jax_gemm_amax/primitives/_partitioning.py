"""Mesh and sharding helpers for the primitives' ``custom_partitioning`` rules."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
from jax.interpreters import mlir
from jax.sharding import AxisType


def spec_entry(axes: tuple[str, ...]):
    """A PartitionSpec entry for a dim split by ``axes`` (major first)."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def axes_size(mesh, axes) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def dim_axes(mesh, ndim, sharding) -> tuple[tuple[str, ...], ...]:
    """The mesh axes (major first) that split each dim of an operand; () for a dim kept whole or
    split in a way no tuple of whole mesh axes describes (Shardy's sub-axes, such as half of a
    4-way axis over a dim of 2 scale blocks). For partitioners that take raw shardings
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
            if len(shard) > 1 and axes_size(mesh, axes) == len(shard)
        ]
        result.append(
            next(
                (
                    axes
                    for axes in candidates
                    if all(shard[start] == shard_index(coords[dev], axes) for dev, start in starts.items())
                ),
                (),
            )
        )
    return tuple(result)


def manual_mesh(mesh):
    """``mesh`` with every axis Manual, to trace a partition's per-device ``lower_fn`` under, as
    shard_map does. Without it, jax 0.11 traces lower_fn under the caller's mesh; on an Explicit
    mesh the collectives' reducer bodies then carry sharding annotations and XLA rejects them
    (GPU: a CHECK failure in AllReduceThunk; CPU: "Unsupported reduction computation")."""
    return mesh.abstract_mesh.update_axis_types({name: AxisType.Manual for name in mesh.axis_names})


def ir_shape(ir_type) -> tuple[int, ...]:
    """The shape of an MLIR tensor type (the Shardy rule's operand and result types)."""
    return tuple(mlir.ir.RankedTensorType(ir_type).shape)


def require_devices_during_lowering(prim) -> None:
    """Eager calls of a partitioned primitive need the devices during lowering."""
    try:
        from jax._src import dispatch

        dispatch.prim_requires_devices_during_lowering.add(prim)
    except (ImportError, AttributeError):  # pragma: no cover - internal API moved
        pass
