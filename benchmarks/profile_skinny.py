"""One few-row call (bf16 activations against a pre-quantized weight), run a few times, for a
kernel profiler to attach to:

    ncu --kernel-name regex:SkinnyKernel --launch-skip 2 --launch-count 1 --clock-control none \
        --section SpeedOfLight --section WarpStateStats \
        python benchmarks/profile_skinny.py --m 64 --format mxfp4 --weight 28672x8192

--quantized-a quantizes the activations too (the both-quantized kernel).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jax_gemm_amax as jga


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--format", default="mxfp4")
    parser.add_argument("--weight", default="28672x8192", help="NxK")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--quantized-a", action="store_true")
    args = parser.parse_args()
    n, k = (int(v) for v in args.weight.split("x"))
    w = jax.random.normal(jax.random.key(0), (n, k), jnp.float32) * 0.05
    qw, sw = jga.quantize(w, args.format)
    x = jax.random.normal(jax.random.key(1), (args.m, k), jnp.float32).astype(jnp.bfloat16)
    a, sa = jga.quantize(x, args.format) if args.quantized_a else (x, None)
    f = jax.jit(lambda qw, sw: jga.gemm_amax(a, qw, sa, sw, c_dtype=jnp.bfloat16))
    for _ in range(args.calls):
        f(qw, sw).c.block_until_ready()


if __name__ == "__main__":
    main()
