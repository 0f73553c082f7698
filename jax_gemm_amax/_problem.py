"""The Python half of the semantic core: dtype tables and trace-time validation.

Everything here works on shapes and dtypes only, so errors surface at trace time with the
argument's name, what was expected and what came. ``ffi/common/ffi_problem.cc`` holds the C++
twin that guards the custom call itself.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import jax.numpy as jnp
import numpy as np

# Operand (A/B) dtypes. uint8 is packed FP4: two e2m1 values per byte, low nibble = even k.
FP8_OPERANDS = (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))
FP4_OPERAND = np.dtype(jnp.float4_e2m1fn)
PACKED_FP4 = np.dtype(np.uint8)
OPERAND_DTYPES = FP8_OPERANDS + (FP4_OPERAND, PACKED_FP4)
# Weight-only A dtypes: unscaled activations times a block-scaled B (sfa is None).
ACTIVATION_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))

# Scale dtypes: int8/uint8 are read as e8m0.
E8M0 = np.dtype(jnp.float8_e8m0fnu)
E8M0_LIKE = (E8M0, np.dtype(np.int8), np.dtype(np.uint8))
E4M3 = np.dtype(jnp.float8_e4m3fn)
SCALE_DTYPES = E8M0_LIKE + (E4M3,)

# Output dtypes. uint8 is packed FP4 along N.
C_DTYPES = (
    np.dtype(np.float32),
    np.dtype(jnp.float16),
    np.dtype(jnp.bfloat16),
    np.dtype(jnp.float8_e4m3fn),
    np.dtype(jnp.float8_e5m2),
    FP4_OPERAND,
    PACKED_FP4,
)
FP4_C_DTYPES = (FP4_OPERAND, PACKED_FP4)

SF_VEC_SIZES = (16, 32)
SCALE_ROWS_PER_BLOCK = 128
SCALE_GROUPS_PER_BLOCK = 4
SCALE_ATOM = (32, 4, 4)

# The cuDNN frontend's tuning surface. Tile M = 256 (2-SM) is valid on Blackwell but not built.
TILE_M_VALUES = (128,)
TILE_M_NOT_BUILT = (256,)
TILE_N_VALUES = (128, 256)
CLUSTER_VALUES = (1, 2, 4)


def _dtype_name(dt: Any) -> str:
    return np.dtype(dt).name


def _names(dtypes) -> str:
    return ", ".join(_dtype_name(d) for d in dtypes)


def canonical_dtype(dtype: Any, argname: str) -> np.dtype:
    """Accepts jnp/numpy/ml_dtypes dtypes, dtype name strings and torch dtypes."""
    if type(dtype).__module__ == "torch" or (isinstance(dtype, str) and dtype.startswith("torch.")):
        dtype = str(dtype).removeprefix("torch.")  # torch.float32 etc., without importing torch
        dtype = {"float4_e2m1fn_x2": "uint8"}.get(dtype, dtype)
    if dtype is None:  # numpy reads None as float64
        raise TypeError(f"{argname}: None is not a dtype")
    try:
        return np.dtype(jnp.dtype(dtype))
    except TypeError as e:
        raise TypeError(f"{argname}: {dtype!r} is not a dtype") from e


def is_fp4(dtype: np.dtype) -> bool:
    return dtype in (FP4_OPERAND, PACKED_FP4)


def check_dtype(x, allowed, argname: str) -> np.dtype:
    """``x.dtype`` if it is one of ``allowed``, else a TypeError naming ``argname``."""
    dtype = np.dtype(x.dtype)
    if dtype not in allowed:
        raise TypeError(f"{argname}: dtype must be one of {_names(allowed)}, got {dtype.name}")
    return dtype


def check_int(value, argname: str, minimum: int | None = None) -> int:
    """``value`` as a Python int. Python and numpy integers pass; floats, bools and anything else
    raise TypeError rather than being truncated."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{argname} must be an int, got {value!r}")
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{argname} must be an int, got {value!r} ({type(value).__name__})") from None
    if minimum is not None and result < minimum:
        raise ValueError(f"{argname} must be at least {minimum}, got {result}")
    return result


def check_int_pair(value, argname: str) -> tuple[int, int]:
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != 2:
        raise ValueError(f"{argname} must be a pair of ints, got {value!r}")
    return check_int(items[0], f"{argname}[0]"), check_int(items[1], f"{argname}[1]")


def check_sf_vec_size(sf_vec_size) -> int:
    result = check_int(sf_vec_size, "sf_vec_size")
    if result not in SF_VEC_SIZES:
        raise ValueError(f"sf_vec_size must be one of {SF_VEC_SIZES}, got {result}")
    return result


def check_c_major(c_major) -> str:
    if not isinstance(c_major, str) or c_major not in ("n", "m"):
        raise ValueError(f"c_major must be 'n' or 'm', got {c_major!r}")
    return str(c_major)


def check_block_format(value_dtype, sf_dtype, sf_vec_size: int, values: str, scales: str) -> None:
    """The block formats there are: e4m3 scales per 16 (NVFP4), FP8 values per 32 (MXFP8); FP4
    values with e8m0 scales per 16 or 32. ``values`` and ``scales`` name the arguments."""
    if sf_dtype == E4M3 and sf_vec_size != 16:
        raise ValueError(f"{scales}: float8_e4m3fn scales require sf_vec_size=16")
    if not is_fp4(value_dtype) and sf_vec_size != 32:
        raise ValueError(f"sf_vec_size: fp8 {values} ({value_dtype.name}) require sf_vec_size=32, got {sf_vec_size}")


def check_quantize(x, fmt: str, sf_vec_size: int, axis, pair: bool = False) -> int:
    """Validates a quantize call on ``x`` (anything with ``.shape`` and ``.dtype``) along ``axis``
    (-1 or -2, or their non-negative forms), or along both with ``pair``. Returns the primitive's
    mode: 1 (along the last axis), 2 (along the one before it), 3 (both)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x: must be a floating array, got {np.dtype(x.dtype).name}")
    ndim = len(x.shape)
    if ndim < 2:
        raise ValueError(f"x: must be (rows, K) or (..., rows, K), got shape {tuple(x.shape)}")
    if pair:
        mode = 3
    else:
        axis = check_int(axis, "axis")
        if axis not in (-1, -2, ndim - 1, ndim - 2):
            raise ValueError(
                f"axis: must be the last axis (-1) or the one before it (-2) of x with shape {tuple(x.shape)}, got {axis}"
            )
        mode = 1 if axis in (-1, ndim - 1) else 2
    for bit, dim, name in ((1, -1, "K"), (2, -2, "R")):
        if mode & bit and x.shape[dim] % sf_vec_size:
            raise ValueError(
                f"x: {name}={x.shape[dim]} must be a multiple of {sf_vec_size} for {fmt} (axis {ndim + dim} is quantized)"
            )
    return mode


def scale_shape(rows: int, k: int, sf_vec_size: int, batch: int | None = None) -> tuple[int, ...]:
    """Physical 128x4 scale shape (L, ceil(rows/128), ceil(K/(4*sfv)), 32, 4, 4)."""
    rows = check_int(rows, "rows", minimum=0)
    k = check_int(k, "k", minimum=0)
    sf_vec_size = check_sf_vec_size(sf_vec_size)
    if batch is not None:
        batch = check_int(batch, "batch", minimum=0)
    groups = k // sf_vec_size
    shape = (
        math.ceil(rows / SCALE_ROWS_PER_BLOCK),
        math.ceil(groups / SCALE_GROUPS_PER_BLOCK),
    ) + SCALE_ATOM
    return shape if batch is None else (batch,) + shape


@dataclasses.dataclass(frozen=True)
class Problem:
    """A validated gemm_amax call, described by shapes and dtypes."""

    batch: int | None  # None when a and b are 2-D
    m: int
    n: int
    k: int  # logical K, in elements
    ab_dtype: np.dtype  # the block-scaled dtype: b's, and a's too unless weight-only
    sf_dtype: np.dtype
    sf_vec_size: int
    c_dtype: np.dtype
    a_dtype: np.dtype  # ab_dtype, or bfloat16/float16 for weight-only calls

    @property
    def fp4(self) -> bool:
        return is_fp4(self.ab_dtype)

    @property
    def weight_only(self) -> bool:
        return self.a_dtype in ACTIVATION_DTYPES


def _check_cudnn_tuning(mma_tiler_mn, cluster_shape_mn, problem: Problem) -> tuple[tuple[int, int], tuple[int, int]]:
    tile_m, tile_n = check_int_pair(mma_tiler_mn, "mma_tiler_mn")
    cluster_m, cluster_n = check_int_pair(cluster_shape_mn, "cluster_shape_mn")
    if tile_m in TILE_M_NOT_BUILT:
        raise NotImplementedError(f"mma_tiler_mn: TILE_M = {tile_m} (2-SM tiles) is not built; use TILE_M = 128")
    if tile_m not in TILE_M_VALUES:
        raise ValueError(f"mma_tiler_mn: TILE_M must be one of {TILE_M_VALUES}, got {tile_m}")
    if tile_n not in TILE_N_VALUES:
        raise ValueError(f"mma_tiler_mn: TILE_N must be one of {TILE_N_VALUES}, got {tile_n}")
    for name, v in (("CLUSTER_M", cluster_m), ("CLUSTER_N", cluster_n)):
        if v not in CLUSTER_VALUES:
            raise ValueError(f"cluster_shape_mn: {name} must be one of {CLUSTER_VALUES}, got {v}")
    if problem.fp4 and tile_n == 256 and problem.k <= 128:
        raise NotImplementedError("mma_tiler_mn: FP4 a/b with TILE_N = 256 requires K > 128")
    if (
        (tile_m, tile_n) == (128, 256)
        and problem.sf_vec_size == 16
        and problem.c_dtype in (np.dtype(np.float32), np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
    ):
        raise NotImplementedError(
            "mma_tiler_mn=(128, 256) with sf_vec_size=16 and a float32/float16/bfloat16 c is not supported"
        )
    return (tile_m, tile_n), (cluster_m, cluster_n)


def check_problem(
    a, b, sfa, sfb, *, c_dtype, sf_vec_size, acc_dtype, mma_tiler_mn, cluster_shape_mn, c_major
) -> tuple[Problem, tuple[int, int], tuple[int, int]]:
    """Validates a gemm_amax call. ``a``..``sfb`` are anything with ``.shape`` and ``.dtype``;
    the scales must already be in the physical layout (see ``layout.as_physical``)."""
    a_dtype = check_dtype(a, OPERAND_DTYPES + ACTIVATION_DTYPES, "a")
    weight_only = a_dtype in ACTIVATION_DTYPES
    if weight_only:
        ab_dtype = check_dtype(b, OPERAND_DTYPES, "b")
    else:
        ab_dtype = a_dtype
        if np.dtype(b.dtype) != ab_dtype:
            raise TypeError(f"b: dtype must match a ({ab_dtype.name}), got {np.dtype(b.dtype).name}")
    if a.ndim not in (2, 3):
        raise ValueError(f"a: must be (M, K) or (L, M, K), got shape {tuple(a.shape)}")
    if b.ndim != a.ndim:
        raise ValueError(
            f"b: must have a's rank {a.ndim} ({'(N, K)' if a.ndim == 2 else '(L, N, K)'}), got shape {tuple(b.shape)}"
        )
    batch = None if a.ndim == 2 else a.shape[0]
    if batch is not None and b.shape[0] != batch:
        raise ValueError(f"b: batch L must match a's ({batch}), got shape {tuple(b.shape)}")
    k = b.shape[-1] * (2 if ab_dtype == PACKED_FP4 else 1)
    if a.shape[-1] * (2 if a_dtype == PACKED_FP4 else 1) != k:
        raise ValueError(f"b: K must match a's (a {tuple(a.shape)} {a_dtype.name}, b {tuple(b.shape)} {ab_dtype.name})")
    m, n = a.shape[-2], b.shape[-2]
    if min(m, n, k) < 1 or (batch is not None and batch < 1):
        raise ValueError(f"a, b: L, M, N and K must be at least 1 (a {tuple(a.shape)}, b {tuple(b.shape)})")

    if sfb is None:
        raise TypeError("sfb: b's scales are required, got None")
    if weight_only:
        if sfa is not None:
            raise TypeError(
                f"sfa: must be None for {a_dtype.name} a (weight-only: a is not scaled), "
                f"got an array of dtype {np.dtype(sfa.dtype).name}"
            )
        sf_dtype = check_dtype(sfb, SCALE_DTYPES, "sfb")
    else:
        if sfa is None:
            raise TypeError(
                f"sfa: {a_dtype.name} a needs its scales; only bfloat16/float16 a (weight-only) take sfa=None"
            )
        sf_dtype = check_dtype(sfa, SCALE_DTYPES, "sfa")
        if np.dtype(sfb.dtype) != sf_dtype:
            raise TypeError(f"sfb: dtype must match sfa ({sf_dtype.name}), got {np.dtype(sfb.dtype).name}")
    sf_vec_size = check_sf_vec_size(sf_vec_size)
    c_dtype = canonical_dtype(c_dtype, "c_dtype")
    if c_dtype not in C_DTYPES:
        raise TypeError(f"c_dtype must be one of {_names(C_DTYPES)}, got {c_dtype.name}")
    acc = canonical_dtype(acc_dtype, "acc_dtype")
    if acc != np.dtype(np.float32):
        raise NotImplementedError(f"acc_dtype: only float32 accumulation is supported, got {acc.name}")
    check_c_major(c_major)

    fp4 = is_fp4(ab_dtype)
    check_block_format(ab_dtype, sf_dtype, sf_vec_size, "a/b", "sfa/sfb")
    if c_dtype in FP4_C_DTYPES and not fp4:
        raise ValueError(f"c_dtype: fp4 c ({c_dtype.name}) requires fp4 a/b, got {ab_dtype.name}")
    if k % sf_vec_size:
        raise ValueError(f"a, b: K ({k}) must be a multiple of sf_vec_size ({sf_vec_size})")
    row_bytes = k // 2 if fp4 else k
    if row_bytes % 16:
        raise ValueError(
            f"a, b: rows must be 16-byte aligned: K={k} {ab_dtype.name} is {row_bytes} bytes "
            f"(K must be a multiple of {32 if fp4 else 16})"
        )
    c_minor = m if c_major == "m" else n
    c_bits = 4 if c_dtype in FP4_C_DTYPES else c_dtype.itemsize * 8
    if c_minor * c_bits % 128:
        which = "M" if c_major == "m" else "N"
        raise ValueError(
            f"c_dtype: rows of c must be 16-byte aligned: {which}={c_minor} in {c_dtype.name} "
            f"is not a multiple of {128 // c_bits}"
        )

    for name, sf, rows in (("sfa", sfa, m), ("sfb", sfb, n)):
        if sf is None:
            continue
        want = scale_shape(rows, k, sf_vec_size, batch)
        if tuple(sf.shape) != want:
            raise ValueError(
                f"{name}: expected the physical 128x4 layout {want} for {'M' if name == 'sfa' else 'N'}={rows}, "
                f"K={k}, sf_vec_size={sf_vec_size}, got {tuple(sf.shape)}"
            )
    problem = Problem(batch, m, n, k, ab_dtype, sf_dtype, sf_vec_size, c_dtype, a_dtype)
    tiler, cluster = _check_cudnn_tuning(mma_tiler_mn, cluster_shape_mn, problem)
    return problem, tiler, cluster
