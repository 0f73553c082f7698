"""An independent float64 numpy oracle and random problem generator for the tests.

Nothing here uses jax_gemm_amax: operands are decoded with ml_dtypes or explicit tables and the
scales are read with NVIDIA cuDNN frontend's offset formula, so a layout or decoding bug in the
library cannot hide in its own reference.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

E2M1_TABLE = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def scale_index(row, group):
    """NVIDIA cuDNN frontend's offset formula: tile (row // 128, group // 4), then
    (row % 32, (row % 128) // 32, group % 4)."""
    return row // 128, group // 4, row % 32, (row % 128) // 32, group % 4


def decode_values(arr: np.ndarray) -> np.ndarray:
    """Operand bytes -> float64 (uint8 = packed fp4, low nibble first)."""
    if arr.dtype == np.uint8:
        lo, hi = arr & 0xF, arr >> 4
        codes = np.stack([lo, hi], axis=-1).reshape(*arr.shape[:-1], arr.shape[-1] * 2)
        return E2M1_TABLE[codes]
    return arr.astype(np.float64)


def decode_scales(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == ml_dtypes.float8_e4m3fn:
        return arr.astype(np.float64)
    code = arr.view(np.uint8).astype(np.float64)
    return np.where(code == 255, np.nan, 2.0 ** (code - 127))


def scales_per_element(physical: np.ndarray, rows: int, k: int, sfv: int) -> np.ndarray:
    """(L, R', G', 32, 4, 4) -> (L, rows, k) float64 scale of every element."""
    r = np.arange(rows)[:, None]
    g = np.arange(k // sfv)[None, :]
    idx = scale_index(r, g)
    dec = decode_scales(physical)
    per_group = dec[(slice(None),) + idx]  # (L, rows, G)
    return np.repeat(per_group, sfv, axis=-1)


def gemm_amax_f64(a, b, sfa, sfb, sfv):
    """a (L, M, Kb), b (L, N, Kb), physical scales -> (C float64 (L, M, N), amax per batch)."""
    av = decode_values(a)
    bv = decode_values(b)
    k = av.shape[-1]
    at = av * scales_per_element(sfa, av.shape[1], k, sfv)
    bt = bv * scales_per_element(sfb, bv.shape[1], k, sfv)
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.einsum("lmk,lnk->lmn", at, bt)
        abssum = np.einsum("lmk,lnk->lmn", np.abs(at), np.abs(bt))
    amax = np.array([np.max(np.abs(ci)) for ci in c])
    return c, abssum, amax


@dataclasses.dataclass
class RandomProblem:
    a: np.ndarray  # (L, M, Kb) numpy, in the operand dtype (uint8 for packed fp4)
    b: np.ndarray
    sfa: np.ndarray  # physical (L, ...)
    sfb: np.ndarray
    sfv: int
    k: int


def physical_scales(codes: np.ndarray, sf_dtype) -> np.ndarray:
    """Scale bytes (L, rows, groups) -> the physical layout (L, R', G', 32, 4, 4) in ``sf_dtype``,
    padding zero, placed with the cuDNN frontend's offset formula."""
    batch, rows, groups = codes.shape
    phys = np.zeros((batch, -(-rows // 128), -(-groups // 4), 32, 4, 4), np.uint8)
    idx = scale_index(np.arange(rows)[:, None], np.arange(groups)[None, :])
    for l in range(batch):
        phys[(l,) + idx] = codes[l]
    return phys.view(sf_dtype) if sf_dtype != np.uint8 else phys


def random_scales(rng, batch, rows, k, sfv, sf_dtype):
    groups = k // sfv
    if sf_dtype == ml_dtypes.float8_e4m3fn:
        # positive normal e4m3 scales in [2^-3, 2^3)
        codes = rng.integers(0x20, 0x50, size=(batch, rows, groups)).astype(np.uint8)
    else:
        codes = rng.integers(124, 131, size=(batch, rows, groups)).astype(np.uint8)
    return physical_scales(codes, sf_dtype)


def random_operand(rng, batch, rows, k, kind):
    if kind == "fp4":
        return rng.integers(0, 256, size=(batch, rows, k // 2), dtype=np.uint8)
    x = rng.standard_normal((batch, rows, k)) * 2.0
    return x.astype(FP8[kind])


def random_problem(rng, kind, sf_dtype, sfv, m, n, k, batch=1) -> RandomProblem:
    return RandomProblem(
        a=random_operand(rng, batch, m, k, kind),
        b=random_operand(rng, batch, n, k, kind),
        sfa=random_scales(rng, batch, m, k, sfv, sf_dtype),
        sfb=random_scales(rng, batch, n, k, sfv, sf_dtype),
        sfv=sfv,
        k=k,
    )


# Relative spacing of each output format (one ulp at |x|) and its smallest subnormal step.
OUT_ULP = {
    "float32": (2.0**-23, 0.0),
    "bfloat16": (2.0**-7, 0.0),
    "float16": (2.0**-10, 2.0**-24),
    "float8_e4m3fn": (2.0**-3, 2.0**-9),
    "float8_e5m2": (2.0**-2, 2.0**-16),
    "float4_e2m1fn": (2.0**-1, 0.5),
}
OUT_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "float4_e2m1fn": 6.0}


def decode_c(c: np.ndarray, c_dtype_name: str) -> np.ndarray:
    if c_dtype_name == "uint8":
        return decode_values(c)
    return c.astype(np.float64)


def assert_c_close(c: np.ndarray, c_dtype_name: str, ref: np.ndarray, abssum: np.ndarray, where=None):
    """C must equal the float64 result rounded to its format: within one ulp of the format, plus
    the fp32 accumulation error, with FP8/FP4 saturation to the largest finite value. `where`: a
    mask of the elements to check (default all)."""
    got = decode_c(c, c_dtype_name)
    fmt = "float4_e2m1fn" if c_dtype_name == "uint8" else c_dtype_name
    want = ref
    if fmt in OUT_MAX:
        want = np.clip(ref, -OUT_MAX[fmt], OUT_MAX[fmt])
    rel, sub = OUT_ULP[fmt]
    tol = rel * np.abs(want) + sub + 2e-5 * abssum + 1e-30
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(got - want) <= tol)
    if where is not None:
        bad &= where
    if fmt == "float16":  # IEEE half overflows to infinity instead of saturating
        bad &= ~((np.abs(ref) >= 65504) & np.isinf(got) & (np.sign(got) == np.sign(ref)))
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} elements differ; first at {np.argwhere(bad)[0]}: "
        f"got {got[bad][0]}, want {want[bad][0]} (tol {tol[bad][0]})"
    )
