"""Quantize two matrices to MXFP8, multiply them with gemm_amax on the default backend (GPU if
present, else CPU), and compare with the pure-jnp reference and the float product."""

import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_gemm_amax as jga

M, N, K = 1024, 768, 2048
x = jax.random.normal(jax.random.key(0), (M, K), jnp.float32)
w = jax.random.normal(jax.random.key(1), (N, K), jnp.float32)

qa, sfa = jga.quantize(x, "mxfp8_e4m3")  # fp8 values + e8m0 scales in the 128x4 layout
qb, sfb = jga.quantize(w, "mxfp8_e4m3")

matmul = jax.jit(lambda *ops: jga.gemm_amax(*ops, c_dtype=jnp.bfloat16))
c, amax = jax.block_until_ready(matmul(qa, qb, sfa, sfb))
start = time.perf_counter()
c, amax = jax.block_until_ready(matmul(qa, qb, sfa, sfb))
elapsed = time.perf_counter() - start

c_ref, amax_ref = jga.reference_gemm_amax(qa, qb, sfa, sfb, c_dtype=jnp.bfloat16)
exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
c32 = np.asarray(c, np.float32)

print(f"backend          : {jax.default_backend()} ({jax.devices()[0].device_kind})")
print(f"C                : shape {c.shape}, dtype {c.dtype}, {2 * M * N * K / elapsed / 1e9:.1f} GFLOP/s")
print(f"amax             : {float(amax):.6g} (reference {float(amax_ref):.6g})")
print(f"max |C - ref|    : {np.max(np.abs(c32 - np.asarray(c_ref, np.float32))):.3g} (bf16 rounding of the same sums)")
print(f"rel. error vs f64: {np.linalg.norm(c32 - exact) / np.linalg.norm(exact):.4f} (MXFP8 quantization of x and w)")
