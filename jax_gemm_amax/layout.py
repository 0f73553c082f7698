"""Scale-factor layouts and the converters between them.

* physical: ``(L, ceil(MN/128), ceil(G/4), 32, 4, 4)`` C-contiguous, G = K / sf_vec_size: the
  cuBLAS / CUTLASS "128x4" block layout the kernels read. The scale of row ``r`` and K group
  ``j`` is at ``[l, r // 128, j // 4, r % 32, (r % 128) // 32, j % 4]``; padding is zero.
* logical: the cuDNN frontend's view ``(32, 4, ceil(MN/128), 4, ceil(G/4), L)`` = physical permuted by
  ``(3, 4, 1, 5, 2, 0)`` (same bytes in torch; a transpose in JAX).
* plain: ``(L, MN, G)`` as ``jax.nn.scaled_matmul`` takes it.

The leading ``L`` is absent for 2-D operands (physical ``(MN', G', 32, 4, 4)``, plain ``(MN, G)``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ._problem import SCALE_ATOM, SCALE_GROUPS_PER_BLOCK, SCALE_ROWS_PER_BLOCK, check_int, scale_shape

__all__ = [
    "LOGICAL_FROM_PHYSICAL",
    "PHYSICAL_FROM_LOGICAL",
    "scale_shape",
    "scale_index",
    "physical_from_plain",
    "plain_from_physical",
    "physical_from_logical",
    "logical_from_physical",
    "as_physical",
]

# Axis permutations between the physical layout and the cuDNN frontend's logical view (for any array
# library's transpose/permute).
LOGICAL_FROM_PHYSICAL = (3, 4, 1, 5, 2, 0)
PHYSICAL_FROM_LOGICAL = (5, 2, 4, 0, 1, 3)
# (L, MN', G', 32, 4, 4) <-> (L, MN', 4, 32, G', 4): swapping axes 2 and 4 is its own inverse.
_BLOCKED_FROM_PHYSICAL = (0, 1, 4, 3, 2, 5)


def scale_index(row: int, group: int) -> tuple[int, int, int, int, int]:
    """Index of (row, K group) inside one batch item of a physical scale tensor."""
    row, group = check_int(row, "row", minimum=0), check_int(group, "group", minimum=0)
    return (row // 128, group // 4, row % 32, (row % 128) // 32, group % 4)


def _replicate_explicit_dims(x, dims):
    """Under explicit sharding (``AxisType.Explicit`` meshes), reshards ``dims`` of ``x`` to
    replicated: the 128x4 block interleave splits and merges the row and group axes, which a
    reshape of an explicitly sharded axis refuses unless every shard holds whole blocks. Scales
    are 1/32 of their operand's elements, so gathering them is cheap. A no-op otherwise."""
    sharding = getattr(jax.typeof(x), "sharding", None) if hasattr(jax, "typeof") else None
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or getattr(mesh, "empty", True):
        return x
    explicit = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit}
    spec = list(sharding.spec) + [None] * (x.ndim - len(sharding.spec))

    def names(entry):
        return () if entry is None else entry if isinstance(entry, tuple) else (entry,)

    if not any(n in explicit for d in dims for n in names(spec[d])):
        return x
    replicated = jax.sharding.PartitionSpec(*(None if d in dims else e for d, e in enumerate(spec)))
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, replicated))


def _check_physical(physical):
    if physical.ndim not in (5, 6) or tuple(physical.shape[-3:]) != SCALE_ATOM:
        raise ValueError(
            f"physical: expected the physical layout (L, MN', G', 32, 4, 4) or (MN', G', 32, 4, 4), "
            f"got shape {tuple(physical.shape)}"
        )


def physical_from_plain(plain):
    """``(L, MN, G)`` or ``(MN, G)`` scales -> physical layout, zero-padded."""
    plain = jnp.asarray(plain)
    if plain.ndim not in (2, 3):
        raise ValueError(f"plain: expected (MN, G) or (L, MN, G) scales, got shape {tuple(plain.shape)}")
    squeeze = plain.ndim == 2
    if squeeze:
        plain = plain[None]
    plain = _replicate_explicit_dims(plain, (1, 2))
    batch, rows, groups = plain.shape
    row_blocks = math.ceil(rows / SCALE_ROWS_PER_BLOCK)
    k_blocks = math.ceil(groups / SCALE_GROUPS_PER_BLOCK)
    # Pad with zero bytes, not the value 0 (which e8m0 cannot represent: it would become NaN).
    as_bytes = jax.lax.bitcast_convert_type(plain, jnp.uint8) if plain.dtype.itemsize == 1 else plain
    padded = jnp.pad(
        as_bytes,
        ((0, 0), (0, row_blocks * SCALE_ROWS_PER_BLOCK - rows), (0, k_blocks * SCALE_GROUPS_PER_BLOCK - groups)),
    )
    if padded.dtype != plain.dtype:
        padded = jax.lax.bitcast_convert_type(padded, plain.dtype)
    blocked = padded.reshape(batch, row_blocks, 4, 32, k_blocks, 4)
    physical = blocked.transpose(_BLOCKED_FROM_PHYSICAL)
    return physical[0] if squeeze else physical


def plain_from_physical(physical, rows: int, groups: int):
    """Physical scales -> ``(L, rows, groups)`` (or ``(rows, groups)`` for a 5-D input)."""
    _check_physical(physical)
    for name, value, blocks, per_block in (
        ("rows", rows, physical.shape[-5], SCALE_ROWS_PER_BLOCK),
        ("groups", groups, physical.shape[-4], SCALE_GROUPS_PER_BLOCK),
    ):
        if check_int(value, name, minimum=0) > blocks * per_block:
            raise ValueError(
                f"{name}: physical scales of shape {tuple(physical.shape)} hold at most {blocks * per_block} "
                f"{name} ({blocks} block{'s' * (blocks != 1)} of {per_block}), got {value}"
            )
    squeeze = physical.ndim == 5
    if squeeze:
        physical = physical[None]
    physical = _replicate_explicit_dims(physical, (1, 2))
    batch, row_blocks, k_blocks = physical.shape[:3]
    blocked = physical.transpose(_BLOCKED_FROM_PHYSICAL)
    plain = blocked.reshape(batch, row_blocks * SCALE_ROWS_PER_BLOCK, k_blocks * SCALE_GROUPS_PER_BLOCK)
    plain = plain[:, :rows, :groups]
    return plain[0] if squeeze else plain


def physical_from_logical(logical):
    """The cuDNN frontend's logical view ``(32, 4, MN', 4, G', L)`` -> ``(L, MN', G', 32, 4, 4)``."""
    shape = tuple(logical.shape)
    if len(shape) != 6 or shape[:2] != SCALE_ATOM[:2] or shape[3] != SCALE_ATOM[2]:
        raise ValueError(f"logical: expected the logical view (32, 4, MN', 4, G', L), got shape {shape}")
    return jnp.transpose(logical, PHYSICAL_FROM_LOGICAL)


def logical_from_physical(physical):
    """``(L, MN', G', 32, 4, 4)`` (or 5-D without L) -> the cuDNN frontend's ``(32, 4, MN', 4, G', L)``."""
    _check_physical(physical)
    if physical.ndim == 5:
        physical = physical[None]
    return jnp.transpose(physical, LOGICAL_FROM_PHYSICAL)


def is_logical_shape(shape) -> bool:
    return len(shape) == 6 and tuple(shape[:2]) == SCALE_ATOM[:2] and shape[3] == 4 and tuple(shape[-3:]) != SCALE_ATOM


def as_physical(scales, batched: bool, argname: str = "scales"):
    """Returns scales in the physical layout, converting the cuDNN frontend's logical view if given.

    ``batched`` says whether the operand has a leading L; ``argname`` names ``scales`` in errors.
    Shapes that are neither layout pass through unchanged so that validation reports them against
    the expected physical shape.
    """
    if not is_logical_shape(scales.shape):
        return scales
    physical = physical_from_logical(scales)
    if not batched:
        if physical.shape[0] != 1:
            raise ValueError(
                f"{argname}: the logical view {tuple(scales.shape)} has L={physical.shape[0]}, "
                "but the operand is 2-D (L=1)"
            )
        physical = physical[0]
    return physical
