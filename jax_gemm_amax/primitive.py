"""``gemm_amax_p``: the primitive behind :func:`jax_gemm_amax.gemm_amax`.

It takes normalized operands only: ``a (L, M, Kb)``, ``b (L, N, Kb)`` (FP8, or packed FP4 as
uint8), physical scales ``(L, rows', G', 32, 4, 4)``, and returns ``c (L, M, N)`` (``N // 2``
bytes for packed FP4) and one amax per batch item ``(L,)``. The public function does the
normalization (2-D inputs, layouts, float4 packing, c_major, the final max over L). The
primitive knows nothing about which GPU runs it: the CUDA handler dispatches.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from . import _ffi
from ._problem import PACKED_FP4, check_problem

gemm_amax_p = Primitive("jax_gemm_amax")
gemm_amax_p.multiple_results = True

_PARAMS = ("c_dtype", "sf_vec_size", "tile_m", "tile_n", "cluster_m", "cluster_n")


def _check(a, b, sfa, sfb, *, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    return check_problem(
        a, b, sfa, sfb,
        c_dtype=c_dtype, sf_vec_size=sf_vec_size, acc_dtype=np.float32,
        mma_tiler_mn=(tile_m, tile_n), cluster_shape_mn=(cluster_m, cluster_n), c_major="n",
    )[0]


@gemm_amax_p.def_abstract_eval
def _abstract_eval(a, b, sfa, sfb, **params):
    if a.ndim != 3:
        raise ValueError(f"gemm_amax_p takes (L, M, K) operands, got a of shape {a.shape}")
    p = _check(a, b, sfa, sfb, **params)
    c_dtype = np.dtype(params["c_dtype"])
    n_stored = p.n // 2 if c_dtype == PACKED_FP4 else p.n
    return (
        jax.core.ShapedArray((p.batch, p.m, n_stored), c_dtype),
        jax.core.ShapedArray((p.batch,), jnp.float32),
    )


@functools.partial(jax.jit, static_argnames=_PARAMS)
def _jitted(a, b, sfa, sfb, **params):
    return gemm_amax_p.bind(a, b, sfa, sfb, **params)


gemm_amax_p.def_impl(_jitted)


def _lowering(ctx, a, b, sfa, sfb, *, target, c_dtype, sf_vec_size, tile_m, tile_n, cluster_m, cluster_n):
    del c_dtype  # carried by the result type
    return jax.ffi.ffi_lowering(target)(
        ctx, a, b, sfa, sfb,
        sf_vec_size=np.int32(sf_vec_size), tile_m=np.int32(tile_m), tile_n=np.int32(tile_n),
        cluster_m=np.int32(cluster_m), cluster_n=np.int32(cluster_n),
    )


def _cuda_lowering(ctx, *args, **params):
    if not _ffi.BUILT_WITH_CUDA:
        raise NotImplementedError(
            "jax_gemm_amax was built without its CUDA backend (no nvcc at build time); "
            "reinstall with nvcc on PATH (JAX_GEMM_AMAX_CUDA=ON makes its absence an error)"
        )
    return _lowering(ctx, *args, target=_ffi.CUDA_TARGET, **params)


mlir.register_lowering(gemm_amax_p, functools.partial(_lowering, target=_ffi.CPU_TARGET), platform="cpu")
mlir.register_lowering(gemm_amax_p, _cuda_lowering, platform="cuda")


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
