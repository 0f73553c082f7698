"""Decode-shaped GEMMs: few rows of activations (M tokens) against large pre-quantized weights, in
one process.

For each format (MXFP8 e4m3, MXFP4), M in 1..256 and weights (N, K), the candidates take turns
(benchmarks/bench_gemm.py timed_rounds):
  * ours, A quantized per call: bf16 activations -> jga.quantize -> gemm_amax (bf16 C, amax)
  * ours, kernel only: gemm_amax on A quantized beforehand
  * ours, weight-only: gemm_amax of the bf16 activations (sfa=None) and the quantized weights
  * XLA: the weights decoded elementwise to bf16 (codes x scales, as a user writes it) -> bf16 dot
  * cuBLAS bf16: jnp.dot of the bf16 activations and bf16 weights (no scales, the bar)
Each jitted call runs its candidate on R weight copies in turn (R x weight bytes >= 256 MB, five
times the H200's L2), so that every weight is read from HBM, and reports per GEMM: the wall time
(median over repeats / R) and the GPU's busy time from a profiler trace (what the kernels took;
at small M the host's per-call work can set the wall time). Effective weight bandwidth = (weight
+ scale bytes) / GPU time, beside the HBM copy rate measured the same way (a 2 GiB buffer copied:
bytes read + written / time). --span-mb sets the distinct weight bytes per call (256). Ours is
checked against the f32 product of the dequantized operands (weight-only: of the bf16 activations
and the dequantized weights). The "kernel" column names the kernel
the CUDA handler runs (the plan query, as on an sm_90 GPU), "weight-only kernel" the one it runs
weight-only calls on (sm90, skinny, or xla: XLA's dequantize -> dot; cpu without a GPU).

    python benchmarks/bench_decode.py                       # the full table
    python benchmarks/bench_decode.py --ms 1,16 --formats mxfp4 --weights 8192x8192
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
from bench_gemm import dequant_bf16, gpu_busy_per_call, timed_rounds  # noqa: E402

import jax_gemm_amax as jga  # noqa: E402
from jax_gemm_amax import _ffi  # noqa: E402
from jax_gemm_amax.primitives.gemm_amax import _cuda_workspace_bytes  # noqa: E402


def repeats_for(weight_bytes, span):
    """Weight copies each jitted call reads: at least `span` bytes of distinct weights (two at least)."""
    return max(2, math.ceil(span / weight_bytes))


def over_copies(fn, r):
    """fn(a_like, weights_i) for the r weight copies in one jitted call; returns copy 0's output and
    C[0, 0] of the others behind an optimization barrier (their C stays an XLA temporary)."""

    @jax.jit
    def run(a_like, copies):
        outs = [fn(a_like, *w) for w in copies]
        rest = [jax.lax.optimization_barrier(c)[0, 0].astype(jnp.float32) for c in outs[1:]]
        return outs[0], rest

    return run


def hbm_copy_rate(nbytes, calls=10, repeats=5):
    """Bytes moved (read + written) per second by XLA copying a buffer of nbytes, GPU time."""
    x = jnp.zeros((nbytes // 4,), jnp.float32)
    copy = jax.jit(lambda v: v + 1.0)
    timed = timed_rounds({"copy": copy}, (x,), calls, repeats)["copy"][0]
    busy = gpu_busy_per_call(copy, (x,)) or timed
    return 2 * nbytes / busy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", default="1,4,16,64,128,256")
    parser.add_argument("--weights", default="8192x8192,28672x8192,8192x28672", help="NxK,...")
    parser.add_argument("--formats", default="mxfp8_e4m3,mxfp4")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--span-mb", type=float, default=256, help="MB of distinct weights per jitted call")
    args = parser.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    weights = [tuple(int(v) for v in s.split("x")) for s in args.weights.split(",")]
    device = jax.devices()[0].device_kind
    on_gpu = jax.default_backend() == "gpu"  # else the kernel column is the plan for a 132-SM GPU

    copy_bytes = 2 << 30 if on_gpu else 64 << 20
    copy_rate = hbm_copy_rate(copy_bytes)
    print(
        f"{device}, jax {jax.__version__}: memory copy rate {copy_rate / 1e12:.2f} TB/s "
        f"({copy_bytes >> 20} MiB, read + write)\n"
    )
    print(
        "µs per GEMM: wall (GPU busy). TB/s: weight + scale bytes / ours' GPU time; / XLA, / cuBLAS: their GPU time "
        "over ours'.\n"
    )
    print(
        "| format | M | N×K | kernel | ours, A quantized | ours, kernel only | XLA dequant → bf16 dot "
        "| cuBLAS bf16 | ours TB/s | / copy rate | / XLA | / cuBLAS "
        "| weight-only kernel | ours, weight-only | weight-only TB/s | / copy rate | / cuBLAS |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        f = jga.FORMATS[fmt]
        sfv = f.sf_vec_size
        for n, k in weights:
            kw = jax.random.key(n * 7 + k)
            w = jax.random.normal(kw, (n, k), jnp.float32)
            qb, sfb = jga.quantize(w, fmt)
            wb16 = w.astype(jnp.bfloat16)
            del w
            weight_bytes = qb.size * qb.dtype.itemsize + sfb.size * sfb.dtype.itemsize
            span = args.span_mb * 2**20
            r_q, r_bf16 = repeats_for(weight_bytes, span), repeats_for(wb16.size * 2, span)
            q_copies = [(qb, sfb)] + [(jnp.copy(qb), jnp.copy(sfb)) for _ in range(r_q - 1)]
            bf16_copies = [(wb16,)] + [(jnp.copy(wb16),) for _ in range(r_bf16 - 1)]
            for m in ms:
                x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
                qa, sfa = jga.quantize(x, fmt)
                problem = (1, m, n, k, f.value_dtype, f.scale_dtype, sfv)
                kernel = (
                    _ffi.sm90_plan(*problem, _cuda_workspace_bytes(*problem), sms=0 if on_gpu else 132)["kernel"]
                    if _ffi.BUILT_WITH_CUDA
                    else "cpu"
                )
                wo_kernel = (
                    _ffi.weight_only_kernel(1, m, n, k, jnp.bfloat16, *problem[4:])[1]
                    if _ffi.BUILT_WITH_CUDA
                    else "cpu"
                )

                def quantized(xa, qw, sw, fmt=fmt, sfv=sfv):
                    qa_, sa_ = jga.quantize(xa, fmt)
                    return jga.gemm_amax(qa_, qw, sa_, sw, c_dtype=jnp.bfloat16, sf_vec_size=sfv).c

                def kernel_only(a, qw, sw, sfv=sfv):
                    return jga.gemm_amax(a[0], qw, a[1], sw, c_dtype=jnp.bfloat16, sf_vec_size=sfv).c

                def weight_only(xa, qw, sw, sfv=sfv):
                    return jga.gemm_amax(xa, qw, None, sw, c_dtype=jnp.bfloat16, sf_vec_size=sfv).c

                def xla(xa, qw, sw, sfv=sfv):
                    return jnp.dot(xa, dequant_bf16(qw, sw, sfv).T)

                def cublas(xa, wb):
                    return jnp.dot(xa, wb.T)

                cands = {
                    "quantized": (over_copies(quantized, r_q), (x, q_copies), r_q),
                    "kernel": (over_copies(kernel_only, r_q), ((qa, sfa), q_copies), r_q),
                    "weight_only": (over_copies(weight_only, r_q), (x, q_copies), r_q),
                    "xla": (over_copies(xla, r_q), (x, q_copies), r_q),
                    "cublas": (over_copies(cublas, r_bf16), (x, bf16_copies), r_bf16),
                }
                wall, gpu = {}, {}
                for name, (fn, fargs, r) in cands.items():
                    t, out = timed_rounds({name: fn}, fargs, args.calls, args.repeats)[name]
                    wall[name] = t / r
                    busy = gpu_busy_per_call(fn, fargs)
                    gpu[name] = busy / r if busy else wall[name]
                    if name in ("kernel", "weight_only"):  # ours against the f32 product, dequantized
                        xa = jga.dequantize(qa, sfa, sfv) if name == "kernel" else x.astype(jnp.float32)
                        ref = jnp.dot(xa, jga.dequantize(qb, sfb, sfv).T, precision=jax.lax.Precision.HIGHEST)
                        err = float(jnp.max(jnp.abs(out[0].astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
                        assert err < 1e-2, (fmt, name, m, n, k, err)
                us = {name: 1e6 * v for name, v in gpu.items()}
                bw, bw_wo = weight_bytes / gpu["kernel"], weight_bytes / gpu["weight_only"]
                print(
                    f"| {fmt} | {m} | {n}×{k} | {kernel} | {1e6 * wall['quantized']:.1f} ({us['quantized']:.1f}) "
                    f"| {1e6 * wall['kernel']:.1f} ({us['kernel']:.1f}) | {1e6 * wall['xla']:.1f} ({us['xla']:.1f}) "
                    f"| {1e6 * wall['cublas']:.1f} ({us['cublas']:.1f}) | {bw / 1e12:.2f} | {bw / copy_rate:.2f} "
                    f"| {gpu['xla'] / gpu['kernel']:.2f} | {gpu['cublas'] / gpu['kernel']:.2f} "
                    f"| {wo_kernel} | {1e6 * wall['weight_only']:.1f} ({us['weight_only']:.1f}) | {bw_wo / 1e12:.2f} "
                    f"| {bw_wo / copy_rate:.2f} | {gpu['cublas'] / gpu['weight_only']:.2f} |",
                    flush=True,
                )
            del q_copies, bf16_copies, qb, sfb, wb16


if __name__ == "__main__":
    main()
