"""Where a jitted call's time goes: N gemm_amax calls (or N cuBLAS bf16 dots) in one jitted
function, timed, then traced with jax.profiler and summarized per profiler line (host threads, GPU
streams): the events with the largest total time. Answers "is it the kernel, our handler or XLA"
for small shapes, where the kernel is a fraction of the call.

    python benchmarks/profile_chain.py                       # gemm_amax, 20 calls of 1024^3
    python benchmarks/profile_chain.py --peer cublas         # the same chain of cuBLAS bf16 dots
    python benchmarks/profile_chain.py --peer dequant        # XLA: dequantize -> bf16 dot -> amax
    python benchmarks/profile_chain.py --shape 256x8192x8192 --calls 40 --timeline

XLA flags apply as usual, e.g. XLA_FLAGS=--xla_gpu_enable_command_buffer= (no CUDA graphs).
The first line also gives the host's share: of the time for 5 calls enqueued back to back and the wait
for the last, the part spent enqueueing (bench_gemm.timed_rounds); near 100%, the call is host-bound.
What XLA does per call with its command buffer (which commands it updates, how long that takes, which
FFI calls it re-captures) is in its log:
    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,command_executor=3,custom_call_thunk=3 \
        python benchmarks/profile_chain.py 2>&1 | grep -E "Updated|fallback"
"""

from __future__ import annotations

import argparse
import collections

import jax
import jax.numpy as jnp
from bench_gemm import (  # this directory is on sys.path when run as a script
    build_candidates,
    chain_operands,
    chained,
    profile,
    timed_rounds,
)

import jax_gemm_amax as jga

# The peers, as bench_gemm.py names its candidates (the same jitted functions are profiled).
PEERS = {
    "gemm_amax": "gemm_amax bf16",
    "dequant": "XLA dequant→bf16 dot→amax",
    "cublas": "bf16 dot, no scales (cuBLAS)",
}


def build(peer, m, n, k, calls):
    """The jitted chain (bench_gemm's candidate, so that both tools time the same program) and its operands."""
    x = jax.random.normal(jax.random.key(1), (m, k))
    w = jax.random.normal(jax.random.key(2), (n, k))
    qa, sfa = jga.quantize(x, "mxfp8_e4m3")
    qb, sfb = jga.quantize(w, "mxfp8_e4m3")
    ops = (qa, qb, sfa, sfb, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    fn = build_candidates(jax.default_backend() == "gpu", "mxfp8_e4m3")[PEERS[peer]]
    return chained(fn, calls), chain_operands(ops, calls)


def summarize(planes, top, timeline):
    for plane in planes:
        for line in plane.lines:
            events = list(line.events)
            if not events:
                continue
            totals = collections.defaultdict(lambda: [0, 0.0])
            for e in events:
                totals[e.name][0] += 1
                totals[e.name][1] += e.duration_ns / 1e3
            span = (max(e.start_ns + e.duration_ns for e in events) - min(e.start_ns for e in events)) / 1e3
            print(f"## {plane.name} | {line.name}: {len(events)} events over {span:.0f} us")
            for name, (count, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
                print(f"   {count:5d} x {total / count:9.2f} us = {total:9.1f} us  {name[:110]}")
            if timeline and plane.name.startswith("/device"):
                events.sort(key=lambda e: e.start_ns)
                print("   first events (start us, duration us, name):")
                for e in events[:24]:
                    print(
                        f"     {(e.start_ns - events[0].start_ns) / 1e3:8.1f} {e.duration_ns / 1e3:7.1f} {e.name[:80]}"
                    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", choices=sorted(PEERS), default="gemm_amax")
    parser.add_argument("--shape", default="1024x1024x1024", help="MxNxK")
    parser.add_argument("--calls", type=int, default=20, help="calls per jitted function (at least 2)")
    parser.add_argument("--traced", type=int, default=4, help="jitted calls inside the trace")
    parser.add_argument("--top", type=int, default=30, help="events listed per profiler line")
    parser.add_argument("--timeline", action="store_true", help="also list the first GPU events in order")
    args = parser.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    if args.calls < 2:
        parser.error("--calls must be at least 2 (one call per jitted function: bench_gemm.py)")
    fn, ops = build(args.peer, m, n, k, args.calls)
    share = {}
    t, _ = timed_rounds({args.peer: fn}, ops, calls=5, repeats=7, enqueue_share=share)[args.peer]
    print(
        f"{args.peer} {args.shape}, {args.calls} per jitted call: {t * 1e6:.0f} us per jitted call, "
        f"{t / args.calls * 1e6:.1f} us per operation ({jax.devices()[0].device_kind}); "
        f"{share[args.peer]:.0%} of it enqueueing the calls (near 100%: host-bound)"
    )
    data = profile(fn, ops, args.traced)
    if data is None:
        raise SystemExit("jax.profiler wrote no trace")
    summarize(data.planes, args.top, args.timeline)


if __name__ == "__main__":
    main()
