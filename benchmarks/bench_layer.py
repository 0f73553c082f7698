"""A stack of MLP layers as a user writes them, side by side: each layer quantizes its activation
and multiplies it by a pre-quantized weight, then applies gelu. Where bench_gemm.py times the GEMM
on operands quantized beforehand, this times what a layer pays, the activation's quantization
included (on an H200 it is about a fifth of a 4096 x 4096 layer, paid by both quantized paths).

  * gemm_amax:   q, s = jga.quantize(x); c, amax = jga.gemm_amax(q, qw, s, sw) (bf16 C); gelu
  * XLA dequant: the same quantization of x, dequantized to bf16 (XLA fuses both into one pass),
                 the weight dequantized to bf16, jnp.dot (cuBLAS), amax = max |c|; gelu
  * cuBLAS bf16: gelu(x_bf16 @ w_bf16.T), no quantization (the bar)

All layers run in one jitted call (their activations stay XLA temporaries); the candidates take
turns in every repeat (bench_gemm.timed_rounds). Reported: microseconds per layer, and the final
output of one layer of ours against the XLA dequant path's (the same quantized operands: they
differ only by summation order and C's bf16 rounding; checked, < 2^-7 of the largest).

    python benchmarks/bench_layer.py                          # 1024x1024 and 4096x4096, 20 layers
    python benchmarks/bench_layer.py --sizes 256x4096 --layers 8 --record
    python benchmarks/bench_layer.py --act-dtype bfloat16     # gelu and the activation in bf16
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

import jax_gemm_amax as jga

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import dequant_bf16, record, timed_rounds  # noqa: E402

FMT = "mxfp8_e4m3"


def build_layers(rows, d, layers, seed=0, act_dtype=jnp.float32):
    """The input activation (act_dtype) and each layer's weight (quantized, bf16)."""
    key = jax.random.key(seed)
    ws = [jax.random.normal(jax.random.fold_in(key, i), (d, d), jnp.float32) / d**0.5 for i in range(layers)]
    x = jax.random.normal(jax.random.fold_in(key, layers), (rows, d), jnp.float32).astype(act_dtype)
    return x, [jga.quantize(w, FMT) for w in ws], [w.astype(jnp.bfloat16) for w in ws]


def candidates(act_dtype=jnp.float32):
    """name -> jitted stack(x, quantized weights, bf16 weights); each uses the weights it needs.
    gelu runs in act_dtype (f32: the activation XLA writes between the quantize's two passes is
    f32, 4 bytes per element; bf16 halves that)."""

    def ours(x, qws, _):  # returns the last activation and every layer's amax (a layer needs it)
        amaxes = []
        for qw, sw in qws:
            q, s = jga.quantize(x, FMT)
            c, amax = jga.gemm_amax(q, qw, s, sw, c_dtype=jnp.bfloat16)
            amaxes.append(amax.reshape(()))
            x = jax.nn.gelu(c.astype(act_dtype))
        return x, jnp.stack(amaxes)

    def xla_dequant(x, qws, _):
        amaxes = []
        for qw, sw in qws:
            q, s = jga.quantize(x, FMT)
            c = jnp.dot(dequant_bf16(q, s), dequant_bf16(qw, sw).T)
            amaxes.append(jnp.max(jnp.abs(c)).astype(jnp.float32))
            x = jax.nn.gelu(c.astype(act_dtype))
        return x, jnp.stack(amaxes)

    def cublas(x, _, ws):
        for w in ws:
            x = jax.nn.gelu(jnp.dot(x.astype(jnp.bfloat16), w.T).astype(act_dtype))
        return x, None

    return {"gemm_amax": jax.jit(ours), "XLA dequant": jax.jit(xla_dequant), "cuBLAS bf16": jax.jit(cublas)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024x1024,4096x4096", help="ROWSxD,...: activation rows x layer width")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--act-dtype", default="float32", choices=["float32", "bfloat16"], help="the activation's dtype (gelu's)"
    )
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    act_dtype = jnp.dtype(args.act_dtype)
    device = jax.devices()[0].device_kind
    rows_out = [
        "| rows × width | gemm_amax | XLA dequant | cuBLAS bf16 | ours / XLA dequant | ours / cuBLAS | one layer: max rel. diff ours vs dequant |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in args.sizes.split(","):
        rows, d = (int(v) for v in size.split("x"))
        x, qws, bws = build_layers(rows, d, args.layers, act_dtype=act_dtype)
        cands = candidates(act_dtype)
        times = {
            name: t / args.layers
            for name, (t, _) in timed_rounds(cands, (x, qws, bws), args.calls, args.repeats).items()
        }
        # One layer on the same input: the same quantized operands, so the outputs differ only by
        # summation order and C's bf16 rounding (over more layers a code flipped by that rounding
        # propagates, so the stacks are not compared).
        one = {name: cands[name](x, qws[:1], bws[:1]) for name in ("gemm_amax", "XLA dequant")}
        ref, ref_amax = one["XLA dequant"]
        diff = float(
            jnp.max(jnp.abs(one["gemm_amax"][0].astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref.astype(jnp.float32)))
        )
        amax_diff = float(jnp.abs(one["gemm_amax"][1][0] - ref_amax[0]) / ref_amax[0])
        assert diff < 2**-7 and amax_diff < 2**-7, (size, diff, amax_diff)
        us = {k: v * 1e6 for k, v in times.items()}
        rows_out.append(
            f"| {rows} × {d} | {us['gemm_amax']:.1f} | {us['XLA dequant']:.1f} | {us['cuBLAS bf16']:.1f} | "
            f"{times['XLA dequant'] / times['gemm_amax']:.2f} | {times['cuBLAS bf16'] / times['gemm_amax']:.2f} | {diff:.2g} |"
        )
        print(rows_out[-1], flush=True)
    table = "\n".join(rows_out)
    print(
        f"\n{device}, jax {jax.__version__}, {FMT}, {args.act_dtype} activations, {args.layers} layers per jitted call, "
        "µs per layer (median), ratios > 1: ours faster"
    )
    print(table)
    if args.record:
        record(
            f"MLP layers (quantize → GEMM → gelu) on {device}",
            f"`python benchmarks/bench_layer.py --sizes {args.sizes} --layers {args.layers} --calls {args.calls}"
            f" --repeats {args.repeats} --act-dtype {args.act_dtype}` (jax {jax.__version__}); µs per layer, median; {FMT}.",
            table,
        )


if __name__ == "__main__":
    main()
