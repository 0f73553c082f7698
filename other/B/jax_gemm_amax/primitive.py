"""The primitives behind :func:`jax_gemm_amax.gemm_amax`.

Both take normalized operands only: ``a (L, M, Kb)``, ``b (L, N, Kb)`` (FP8, or packed FP4 as
uint8), physical scales ``(L, rows', G', 32, 4, 4)``, and return ``c (L, M, N)`` (``N // 2``
bytes for packed FP4) and one amax per batch item ``(L,)``.

* ``gemm_amax_p`` is what programs contain: abstract eval, a vmap rule, and a lowering through
  ``custom_partitioning`` (``sharding.py``) so that sharded operands run locally.
* ``gemm_amax_ffi_p`` is the per-device call: it lowers to the FFI target of the platform. The
  Python side knows nothing about which GPU runs it: the CUDA handler dispatches.

The public function does the normalization (2-D inputs, layouts, float4 packing, c_major, the
final max over L).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive

try:
    from jax.core import ShapedArray
except ImportError:  # pragma: no cover - moved in newer jax
    from jax._src.core import ShapedArray
from jax.interpreters import batching, mlir

from . import _ffi
from ._problem import PACKED_FP4, check_problem

PARAMS = ("c_dtype", "sf_vec_size", "tile_m", "tile_n", "cluster_m", "cluster_n")

gemm_amax_p = Primitive("jax_gemm_amax")
gemm_amax_p.multiple_results = True
gemm_amax_ffi_p = Primitive("jax_gemm_amax_ffi")
gemm_amax_ffi_p.multiple_results = True


def _abstract_eval(a, b, sfa, sfb, *, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    if a.ndim != 3:
        raise ValueError(f"gemm_amax_p takes (L, M, K) operands, got a of shape {a.shape}")
    p, _, _ = check_problem(
        a, b, sfa, sfb,
        c_dtype=c_dtype, sf_vec_size=sf_vec_size, acc_dtype=np.float32,
        mma_tiler_mn=(tile_m, tile_n), cluster_shape_mn=(cluster_m, cluster_n), c_major="n",
    )
    c_dtype = np.dtype(c_dtype)
    n_stored = p.n // 2 if c_dtype == PACKED_FP4 else p.n
    return (
        ShapedArray((p.batch, p.m, n_stored), c_dtype),
        ShapedArray((p.batch,), jnp.float32),
    )


def _def_impl(prim):
    jitted = jax.jit(prim.bind, static_argnames=PARAMS)
    prim.def_impl(jitted)


for _prim in (gemm_amax_p, gemm_amax_ffi_p):
    _prim.def_abstract_eval(_abstract_eval)
    _def_impl(_prim)


def _ffi_lowering(ctx, a, b, sfa, sfb, *, target, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    del c_dtype  # carried by the result type
    return jax.ffi.ffi_lowering(target)(
        ctx, a, b, sfa, sfb,
        sf_vec_size=np.int32(sf_vec_size), tile_m=np.int32(tile_m), tile_n=np.int32(tile_n),
        cluster_m=np.int32(cluster_m), cluster_n=np.int32(cluster_n),
    )


def _cuda_workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size) -> int:
    """Device workspace the CUDA handler gets: the SM90 kernel library's own rule, asked through the
    extension (``_ffi.sm90_workspace_bytes``; a different size would only narrow its plans). The
    BF16 copies of the operands it may convert once per call (B with many rows, A with many
    columns; 2 bytes per element) are included unless JAX_GEMM_AMAX_PRECONVERT=0 (read when a
    program is lowered): less memory, both operands converted inside the GEMM (the GEMM and passes
    took 9-18% less time with the copies on large problems, ncu, session 9)."""
    offer_copies = os.environ.get("JAX_GEMM_AMAX_PRECONVERT", "1") != "0"
    return _ffi.sm90_workspace_bytes(batch, m, n, k, operand_dtype, scale_dtype, sf_vec_size, offer_copies)


def _cuda_lowering(ctx, a, b, sfa, sfb, **params):
    if not _ffi.BUILT_WITH_CUDA:
        raise NotImplementedError(
            "jax_gemm_amax was built without its CUDA backend (no nvcc at build time); "
            "reinstall with nvcc on PATH (JAX_GEMM_AMAX_CUDA=ON makes its absence an error)"
        )
    # The workspace is a third result of the custom call that the primitive does not return: XLA
    # owns it (FFI scratch would be freed before a recorded CUDA graph replays; cuda_handler.cc).
    a_aval = ctx.avals_in[0]
    batch, m, row_bytes = a_aval.shape  # FP8: one byte per element; packed FP4: two elements per byte
    n = ctx.avals_in[1].shape[1]
    k = row_bytes * (2 if np.dtype(a_aval.dtype) == PACKED_FP4 else 1)
    nbytes = _cuda_workspace_bytes(batch, m, n, k, a_aval.dtype, ctx.avals_in[2].dtype, params["sf_vec_size"])
    workspace = ShapedArray((nbytes,), np.uint8)
    ctx3 = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    c, amax, _ = _ffi_lowering(ctx3, a, b, sfa, sfb, target=_ffi.CUDA_TARGET, **params)
    return [c, amax]


mlir.register_lowering(gemm_amax_ffi_p, functools.partial(_ffi_lowering, target=_ffi.CPU_TARGET), platform="cpu")
mlir.register_lowering(gemm_amax_ffi_p, _cuda_lowering, platform="cuda")


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
