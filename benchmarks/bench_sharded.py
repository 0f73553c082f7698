"""Weak scaling of the sharded gemm_amax over the GPUs of one host (needs at least 2 devices).

The work per GPU stays 8192×8192×8192 (MXFP8 e4m3, e8m0 scales per 32, bf16 C, amax fused):
  * 1 GPU:        8192×8192×8192 on device 0 (the baseline)
  * M-sharded:    16384×8192×8192, A and its scales split over M; C stays split, amax is a pmax
  * K-sharded:    8192×8192×16384, A, B and scales split over K; each GPU computes an fp32 partial C,
                  the partials are summed (all-reduce), then amax is taken and C rounded to bf16
Efficiency = t(1 GPU) / t(sharded). The collective's share is the time of that collective alone
(the all-reduce of one fp32 8192×8192 partial for K; the scalar pmax for M), over the sharded time.
Every sharded result is checked against the float32 product of the dequantized operands.

    python benchmarks/bench_sharded.py --record    # also appends the table to benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_gemm_amax as jga

sys.path.insert(0, os.path.dirname(__file__))
from bench_gemm import record, timed  # noqa: E402  (timed: median over repeats of enqueue-then-block)


def quantized(key, rows, k):
    x = jax.random.normal(key, (rows, k), jnp.float32)
    return jga.quantize(x, "mxfp8_e4m3")


def check(result, qa, qb, sfa, sfb):
    """Asserts C and amax of a sharded run against the f32 product (operands live on device 0)."""
    ref = jnp.dot(jga.dequantize(qa, sfa), jga.dequantize(qb, sfb).T, precision=jax.lax.Precision.HIGHEST)
    ref_amax = float(jnp.max(jnp.abs(ref)))
    c = jax.device_put(result.c, jax.devices()[0]).astype(jnp.float32)  # gathers the shards
    err = float(jnp.max(jnp.abs(c - ref))) / ref_amax
    amax_err = abs(float(result.amax) - ref_amax) / ref_amax
    assert err < 1e-2 and amax_err < 1e-5, (err, amax_err)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=8192, help="per-GPU problem is size³")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()

    devices = jax.devices()
    if len(devices) < 2:
        sys.exit(f"bench_sharded needs at least 2 devices; this backend ({jax.default_backend()}) has {len(devices)}")
    ng = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    s = args.size
    flop = 2 * s * s * s
    gemm = jax.jit(lambda qa, qb, sfa, sfb: jga.gemm_amax(qa, qb, sfa, sfb, c_dtype=jnp.bfloat16))
    keys = jax.random.split(jax.random.key(0), 4)

    rows = []
    # One GPU (the default device, devices[0]): the baseline.
    qa, sfa = quantized(keys[0], s, s)
    qb, sfb = quantized(keys[1], s, s)
    t1, _ = timed(gemm, (qa, qb, sfa, sfb), args.calls, args.repeats)
    rows.append(("1 GPU", f"{s}×{s}×{s}", t1, 1.0, None))

    # M-sharded: A split over M, B replicated; no collective but the scalar pmax.
    qa, sfa = quantized(keys[0], ng * s, s)
    qb, sfb = quantized(keys[1], s, s)
    m_args = (put(qa, "d", None), put(qb, None, None), put(sfa, "d"), put(sfb))
    tm, res = timed(gemm, m_args, args.calls, args.repeats)
    assert res.c.sharding.spec[0] == "d", res.c.sharding
    check(res, qa, qb, sfa, sfb)
    pmax = jax.jit(jax.shard_map(lambda x: jax.lax.pmax(x, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))
    t_pmax, _ = timed(pmax, (put(jnp.ones((ng,), jnp.float32), "d"),), args.calls, args.repeats)
    rows.append((f"M-sharded, {ng} GPUs", f"{ng * s}×{s}×{s}", tm, t1 / tm, t_pmax))
    del qa, sfa, qb, sfb, m_args, res

    # K-sharded: every operand split over K; each GPU's fp32 partial is all-reduced.
    qa, sfa = quantized(keys[2], s, ng * s)
    qb, sfb = quantized(keys[3], s, ng * s)
    k_args = (put(qa, None, "d"), put(qb, None, "d"), put(sfa, None, "d"), put(sfb, None, "d"))
    tk, res = timed(gemm, k_args, args.calls, args.repeats)
    hlo = gemm.lower(*k_args).compile().as_text()
    assert "all-reduce" in hlo and "all-gather" not in hlo
    check(res, qa, qb, sfa, sfb)
    psum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))
    partials = put(jnp.ones((ng * s, s), jnp.float32), "d")
    t_psum, _ = timed(psum, (partials,), args.calls, args.repeats)
    rows.append((f"K-sharded, {ng} GPUs", f"{s}×{s}×{ng * s}", tk, t1 / tk, t_psum))
    del qa, sfa, qb, sfb, k_args, res, partials

    header = (
        "| run | M×N×K | time (ms) | TFLOP/s per GPU | weak-scaling efficiency | collective alone (ms) "
        "| collective share |"
    )
    lines = [header, "|---|---|---|---|---|---|---|"]
    for name, shape, t, eff, tc in rows:
        coll = "—" if tc is None else f"{tc * 1e3:.3f}"
        share = "—" if tc is None else f"{100 * tc / t:.1f}%"
        lines.append(f"| {name} | {shape} | {t * 1e3:.3f} | {flop / t / 1e12:.0f} | {eff:.2f} | {coll} | {share} |")
    table = "\n".join(lines)
    kind = devices[0].device_kind
    print(
        f"{ng}× {kind}, jax {jax.__version__}, bf16 C, median of {args.repeats} × {args.calls} calls; "
        "outputs checked against the f32 product"
    )
    print(table)
    if args.record:
        record(
            f"sharded gemm_amax, weak scaling on {ng}× {kind}",
            f"`python benchmarks/bench_sharded.py --calls {args.calls} --repeats {args.repeats}`"
            f" (jax {jax.__version__}); MXFP8 e4m3, bf16 C, {s}³ of work per GPU.",
            table,
        )


if __name__ == "__main__":
    main()
