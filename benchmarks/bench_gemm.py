"""Side-by-side GEMM benchmark: gemm_amax against the peers a JAX user has, in one process.

For each shape (M, N, K), on operands of one format (`--format`, default MXFP8: e4m3 values, e8m0
scales per 32) quantized from random data:
  * gemm_amax, bf16 C and f32 C (amax fused)
  * XLA: dequantize to bf16 (codes and scales converted, multiplied; FP4 unpacked by a bitcast) -> jnp.dot (cuBLAS) -> amax
  * jax.nn.scaled_matmul (f32 out; FP4 unpacked by the same bitcast) -> amax   (GPU only: no CPU lowering)
  * cuBLAS bf16 jnp.dot on unscaled bf16 operands, no amax (the bar)
Each is timed as the median over repeats of (enqueue `--calls` calls, block), the candidates
taking turns in every repeat, reported in TFLOP/s = 2MNK / time, and its output is checked against
the float32 product of the dequantized operands (the bar's against that of its bf16 operands): C
within 1e-2 of max |C|, amax within 1e-5 of it, relative (XLA's path: 2^-8, its amax is of bf16 C).
Small problems are bound by JAX's per-call dispatch that way (every path reads ~30 TFLOP/s at
1024^3 on an H200); `--chain N` makes each call run the operation N times inside one jitted
function, on N copies of the operands (identical calls on the same operands would be merged by
XLA, and an optimization barrier does not survive its passes), so that the table compares the
operations rather than the dispatch. The repeats' outputs stay XLA temporaries, as a layer's do in
a jitted step (`--chain-live-outputs` returns them all, which costs every path more host time per
call). Even chained, a small shape can stay host-bound: XLA updates its command buffer on every
call. Under the table, rows where a candidate spent most of its time enqueueing its calls
(the host's share of the wall time, before the wait for the last call) are listed with that share,
and with each candidate's GPU work per operation from a jax.profiler trace: what the kernels do
where the wall time is the host's (the ratios and means above stay by wall time).

`--scan` runs each chain as `lax.scan` over the stacked operands instead (a stack of layers, as a
model runs them): with jax 0.11.2 the loop runs on the host, one body per iteration, and XLA folds
the slices of the stacked operands into the call. Its outputs are checked from a
second, untimed scan that returns every iteration's C and amax.

A shape may carry its own chain length, `MxNxK:N`. The default GPU shapes are six that span large,
long-K, short-K, few-row and small problems, the two small ones chained 20 per call.

    python benchmarks/bench_gemm.py                 # default shapes, prints a markdown table
    python benchmarks/bench_gemm.py --record        # also appends the table to benchmarks/RESULTS.md
    python benchmarks/bench_gemm.py --format nvfp4  # NVFP4 operands
    python benchmarks/bench_gemm.py --chain 20      # 20 repeats per jitted call for every shape
    python benchmarks/bench_gemm.py --shapes 8192x8192x8192,1024x1024x1024:20
    python benchmarks/bench_gemm.py --shapes 1024x1024x1024:20 --scan
"""

from __future__ import annotations

import argparse
import datetime
import glob
import math
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

import jax_gemm_amax as jga

GPU_SHAPES = "8192x8192x8192,4096x4096x4096,16384x8192x1024,2048x28672x8192,256x8192x8192:20,1024x1024x1024:20"
CPU_SHAPES = "256x256x512,512x512x1024"
HOST_BOUND_SHARE = 0.8  # a row is listed as host-bound when a candidate spent this share of its time enqueueing


def parse_shapes(spec, default_chain):
    """'MxNxK[:chain],...' -> [(m, n, k, chain)]; a shape without ':chain' gets default_chain."""
    shapes = []
    for item in spec.split(","):
        dims, _, chain = item.partition(":")
        m, n, k = (int(v) for v in dims.split("x"))
        shapes.append((m, n, k, int(chain) if chain else default_chain))
    return shapes


def timed_rounds(fns, args, calls, repeats, enqueue_share=None):
    """{name: (median seconds per call, first output)} for the functions in fns, which take turns:
    each of `repeats` rounds times `calls` calls of every function, in the same order. These GEMMs
    run at the GPU's power cap, where the clocks drift with what ran before; taking turns exposes
    every function to the same drift (timed one after the other, the first could read ~5% off).
    enqueue_share, a dict, gets each function's median share of a round spent enqueueing its calls
    (before the wait for the last one): near 1, the host sets the time, not the GPU."""
    outs = {name: jax.block_until_ready(fn(*args)) for name, fn in fns.items()}  # compile + warm up
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    samples = {name: [] for name in fns}
    shares = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                last = fn(*args)
            enqueued = time.perf_counter()
            jax.block_until_ready(last)
            total = time.perf_counter() - start
            samples[name].append(total / calls)
            shares[name].append((enqueued - start) / total if total > 0 else 1.0)
    if enqueue_share is not None:
        enqueue_share.update({name: statistics.median(v) for name, v in shares.items()})
    return {name: (statistics.median(samples[name]), outs[name]) for name in fns}


def stream_busy_ns(planes):
    """Nanoseconds of GPU work in a jax.profiler trace's planes: the events (kernels, copies) on the
    stream lines of the device planes, summed; the idle time between them does not count, nor do
    the lines that annotate the same time again (XLA modules and ops)."""
    return sum(
        e.duration_ns
        for plane in planes
        if plane.name.startswith("/device:GPU")
        for line in plane.lines
        if line.name.startswith("Stream")
        for e in line.events
    )


def profile(fn, args, calls):
    """A jax.profiler trace of `calls` calls of fn (after one untraced call), loaded (ProfileData),
    or None when the profiler wrote none. The trace's files are removed."""
    from jax.profiler import ProfileData

    jax.block_until_ready(fn(*args))
    trace_dir = tempfile.mkdtemp(prefix="jga-trace-")
    try:
        with jax.profiler.trace(trace_dir):
            for _ in range(calls):
                out = fn(*args)
            jax.block_until_ready(out)
        paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
        return ProfileData.from_file(paths[0]) if paths else None
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def gpu_busy_per_call(fn, args, calls=4):
    """Seconds of GPU work per call of fn (stream_busy_ns of a trace of `calls` calls), or None when
    the trace has none (the CPU backend). Where the host sets the wall time, this is what the GPU did."""
    data = profile(fn, args, calls)
    busy = stream_busy_ns(data.planes) if data is not None else 0
    return busy / calls / 1e9 if busy else None


def timed(fn, args, calls, repeats):
    return timed_rounds({"": fn}, args, calls, repeats)[""]


def chained(fn, n, live_outputs=False):
    """fn run n times in one jitted call, repeat i on copy i of the operands (distinct buffers, so
    that XLA cannot merge the repeats). Takes the n copies, returns repeat 0's output and one value
    per other repeat: by default C[0, 0] (+ amax) read behind an optimization barrier, so that every
    repeat's whole C is computed but lives in XLA's temporaries, as a layer's output does inside a
    jitted step. live_outputs=True returns every repeat's C instead: n more program outputs at new
    addresses on every call (at 1024^3 on an H200: +11 us per op for gemm_amax and the dequant path,
    +5 for cuBLAS). Either way the program's outputs move on every call, so XLA updates every command
    of its command buffer per call and re-captures every FFI call in it (as XLA's log shows):
    chained small shapes measure that host work, not the kernels."""
    if n == 1:
        return fn

    @jax.jit
    def run(*copies):
        outs = [fn(*ops) for ops in copies]
        if live_outputs:
            return outs[0], outs[1:]
        rest = []
        for c, amax in outs[1:]:
            c = jax.lax.optimization_barrier(c)  # the slice cannot be moved into the producer of c
            rest.append(c[0, 0].astype(jnp.float32) + (0.0 if amax is None else amax.astype(jnp.float32)))
        return outs[0], rest

    return run


def scanned(fn, n, all_outputs=False):
    """fn run n times in one jitted call as lax.scan over stacked operands (stack_operands), iteration
    i on slice i. Returns, as chained's default form reads each repeat, the sum over iterations of
    C[0, 0] (+ amax) behind an optimization barrier; all_outputs=True returns every iteration's
    (C, amax) stacked instead (the check; it makes C a loop output, so it is not what is timed)."""
    if n == 1:
        return fn

    @jax.jit
    def run(*stacked):
        def body(acc, ops):
            c, amax = fn(*ops)
            if all_outputs:
                return acc, (c, amax)
            c = jax.lax.optimization_barrier(c)
            return acc + c[0, 0].astype(jnp.float32) + (0.0 if amax is None else amax.astype(jnp.float32)), None

        acc, outs = jax.lax.scan(body, jnp.float32(0), stacked)
        return outs if all_outputs else acc

    return run


def stack_operands(ops, n):
    """The arguments of scanned(fn, n): each operand stacked n times along a new leading axis."""
    return ops if n == 1 else tuple(jnp.stack([x] * n) for x in ops)


def chain_operands(ops, n):
    """The arguments of chained(fn, n): the operands, or n copies of them."""
    return ops if n == 1 else tuple(ops if i == 0 else tuple(jnp.copy(x) for x in ops) for i in range(n))


def record(title, description, table):
    """Appends a dated section to benchmarks/RESULTS.md."""
    path = os.path.join(os.path.dirname(__file__), "RESULTS.md")
    with open(path, "a") as f:
        f.write(f"\n## {datetime.date.today().isoformat()} — {title}\n\n{description}\n\n{table}\n")


def unpacked(q):
    """The codes as a JAX dtype: packed FP4 (uint8, two codes per byte, low nibble first) unpacked by a
    bitcast to float4_e2m1fn; other codes as they are."""
    if q.dtype == jnp.uint8:
        return jax.lax.bitcast_convert_type(q, jnp.float4_e2m1fn).reshape(*q.shape[:-1], -1)
    return q


def dequant_bf16(q, sf, sf_vec_size=32):
    """q times its scales in bf16 arithmetic, as a user would write it in XLA: the codes (unpacked) and
    the scales converted to bf16 and multiplied (exact: every product fits a bf16)."""
    q = unpacked(q)
    rows, k = q.shape
    scales = jga.plain_from_physical(sf, rows, k // sf_vec_size).astype(jnp.bfloat16)
    return q.astype(jnp.bfloat16) * jnp.repeat(scales, sf_vec_size, axis=-1)


def reference(a, b):
    """(a @ b.T in float32 at full precision, max |of it|): what the candidates' outputs are checked against."""
    c = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    return c, float(jnp.max(jnp.abs(c)))


def amax_tolerance(name):
    """How far a candidate's amax may be from the reference's, relative. The fused amaxes (ours,
    scaled_matmul's of its f32 C) are maxima of fp32 sums; XLA's path takes its amax from C rounded
    to bf16, which moves it by up to half a bf16 ulp (2^-9), so 2^-8 there."""
    return 2.0**-8 if name.startswith("XLA") else 1e-5


def check_outputs(name, shape, outputs, ref):
    """Asserts, for each (C, amax) in candidate `name`'s outputs, that C is within 1e-2 of max |ref C|
    everywhere (bf16 C rounds by 2^-9 of its own size) and that amax, unless None (the bar has none),
    is within amax_tolerance(name) of max |ref C|, relative."""
    ref_c, ref_amax = ref
    amax_tol = amax_tolerance(name)
    for c, amax in outputs:
        err = float(jnp.max(jnp.abs(c.astype(jnp.float32) - ref_c))) / ref_amax
        amax_err = 0.0 if amax is None else abs(float(amax) - ref_amax) / ref_amax
        assert err < 1e-2 and amax_err <= amax_tol, (name, shape, err, amax_err)


def build_candidates(on_gpu, fmt):
    sfv = jga.FORMATS[fmt].sf_vec_size

    def ours(c_dtype):
        return jax.jit(
            lambda qa, qb, sfa, sfb, xa, xb: jga.gemm_amax(qa, qb, sfa, sfb, c_dtype=c_dtype, sf_vec_size=sfv)
        )

    @jax.jit
    def xla_dequant(qa, qb, sfa, sfb, xa, xb):
        c = jnp.dot(dequant_bf16(qa, sfa, sfv), dequant_bf16(qb, sfb, sfv).T)
        return c, jnp.max(jnp.abs(c))

    @jax.jit
    def scaled_matmul(qa, qb, sfa, sfb, xa, xb):
        qa, qb = unpacked(qa), unpacked(qb)  # scaled_matmul takes FP4 as float4_e2m1fn
        pa = jga.plain_from_physical(sfa, qa.shape[0], qa.shape[1] // sfv)[None]
        pb = jga.plain_from_physical(sfb, qb.shape[0], qb.shape[1] // sfv)[None]
        c = jax.nn.scaled_matmul(qa[None], qb[None], pa, pb, preferred_element_type=jnp.float32)[0]
        return c, jnp.max(jnp.abs(c))

    @jax.jit
    def cublas_bf16(qa, qb, sfa, sfb, xa, xb):
        return jnp.dot(xa, xb.T), None

    cands = {
        "gemm_amax bf16": ours(jnp.bfloat16),
        "gemm_amax f32": ours(jnp.float32),
        "XLA dequant→bf16 dot→amax": xla_dequant,
    }
    if on_gpu:  # jax.nn.scaled_matmul has no CPU lowering
        cands["jax.nn.scaled_matmul f32 + amax"] = scaled_matmul
    cands["bf16 dot, no scales (cuBLAS)"] = cublas_bf16
    return cands


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=None, help="MxNxK[:chain],... e.g. 8192x8192x8192,256x8192x8192:20")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--chain",
        type=int,
        default=1,
        help="repeats of the operation inside one jitted call, for shapes without their own ':chain'",
    )
    parser.add_argument(
        "--chain-live-outputs",
        action="store_true",
        help="return every repeat's C from the chain (program outputs) instead of keeping them temporary",
    )
    parser.add_argument(
        "--scan",
        action="store_true",
        help="run each chain as lax.scan over stacked operands instead of unrolled on copies",
    )
    parser.add_argument("--format", default="mxfp8_e4m3", choices=sorted(jga.FORMATS), help="operand format")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.scan and args.chain_live_outputs:
        parser.error("--scan keeps each iteration's C inside the loop: it does not combine with --chain-live-outputs")
    fmt, sfv = args.format, jga.FORMATS[args.format].sf_vec_size

    on_gpu = jax.default_backend() == "gpu"
    shape_spec = args.shapes or (GPU_SHAPES if on_gpu else CPU_SHAPES)
    shapes = parse_shapes(shape_spec, args.chain)
    candidates = build_candidates(on_gpu, fmt)

    def form(fn, n):
        return scanned(fn, n) if args.scan else chained(fn, n, args.chain_live_outputs)

    chains = {
        n: {name: form(fn, n) for name, fn in candidates.items()} for n in sorted({chain for *_, chain in shapes})
    }
    device = jax.devices()[0].device_kind

    peers = {"cuBLAS bf16": "bf16 dot, no scales (cuBLAS)", "XLA dequant": "XLA dequant→bf16 dot→amax"}
    if "jax.nn.scaled_matmul f32 + amax" in candidates:
        peers["scaled_matmul"] = "jax.nn.scaled_matmul f32 + amax"
    header = "| M×N×K | " + " | ".join(candidates) + " | " + " | ".join(f"ours bf16 / {p}" for p in peers) + " |"
    rows = [header, "|" + "---|" * (len(candidates) + len(peers) + 1)]
    ratios = {p: [] for p in peers}
    host_bound = []  # rows where some candidate spent most of each round enqueueing
    gpu_time = []  # those rows kernel for kernel: GPU work per operation from a profiler trace
    for m, n, k, chain in shapes:
        kx, kw = jax.random.split(jax.random.key(m * 7 + n * 3 + k))
        x = jax.random.normal(kx, (m, k), jnp.float32)
        w = jax.random.normal(kw, (n, k), jnp.float32)
        qa, sfa = jga.quantize(x, fmt)
        qb, sfb = jga.quantize(w, fmt)
        xa, xb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
        del x, w
        ops = (stack_operands if args.scan else chain_operands)((qa, qb, sfa, sfb, xa, xb), chain)
        refs = {}  # the f32 products the outputs are checked against, made on first use
        tflops, share = {}, {}
        for name, (t, out) in timed_rounds(chains[chain], ops, args.calls, args.repeats, share).items():
            tflops[name] = 2 * m * n * k * chain / t / 1e12
            if args.scan and chain > 1:
                cs, amaxes = scanned(candidates[name], chain, all_outputs=True)(*ops)
                outputs = [(cs[i], None if amaxes is None else amaxes[i]) for i in range(chain)]
            else:
                outputs = [out if chain == 1 else out[0]]
            unscaled = name.startswith("bf16")  # the bar multiplies the unquantized bf16 operands
            if unscaled not in refs:
                refs[unscaled] = (
                    reference(xa, xb)
                    if unscaled
                    else reference(jga.dequantize(qa, sfa, sfv), jga.dequantize(qb, sfb, sfv))
                )
            check_outputs(name, (m, n, k), outputs, refs[unscaled])
        del refs
        cells = " | ".join(f"{tflops[c]:.3g}" for c in candidates)
        for p, name in peers.items():
            ratios[p].append(tflops["gemm_amax bf16"] / tflops[name])
        label = f"{m}×{n}×{k}" + (f" ({'scan' if args.scan else 'chain'} {chain})" if chain > 1 else "")
        rows.append(f"| {label} | {cells} | " + " | ".join(f"{ratios[p][-1]:.2f}" for p in peers) + " |")
        print(rows[-1], flush=True)
        if on_gpu and max(share.values()) >= HOST_BOUND_SHARE:  # the CPU backend may run a call while enqueueing it
            host_bound.append(f"{label}: " + ", ".join(f"{c} {share[c]:.2f}" for c in candidates))
            busy = {c: gpu_busy_per_call(chains[chain][c], ops) for c in candidates}
            if all(busy.values()):
                gpu_time.append(
                    f"{label}: "
                    + ", ".join(f"{c} {busy[c] / chain * 1e6:.1f} µs" for c in candidates)
                    + "; ours bf16 / "
                    + ", / ".join(f"{p} {busy[name] / busy['gemm_amax bf16']:.2f}" for p, name in peers.items())
                )
    geomean = {p: math.exp(sum(map(math.log, r)) / len(r)) for p, r in ratios.items()}
    rows.append(
        "| geometric mean | "
        + " | ".join("" for _ in candidates)
        + " | "
        + " | ".join(f"**{geomean[p]:.2f}**" for p in peers)
        + " |"
    )

    if host_bound:
        rows += [
            "",
            f"Host-bound rows (share of the wall time spent enqueueing the calls, ≥ {HOST_BOUND_SHARE} for some candidate): "
            + "; ".join(host_bound)
            + ".",
        ]
    if gpu_time:
        rows += [
            "",
            "Their GPU work per operation (jax.profiler: kernels and copies on the GPU's streams, idle time "
            "excluded), and the ratios by it: " + "; ".join(gpu_time) + ".",
        ]
    table = "\n".join(rows)
    print()
    live = " (live outputs)" if args.chain_live_outputs else ""
    print(
        f"{device}, jax {jax.__version__}, {fmt}{live}, TFLOP/s (2MNK x chain / median time), outputs checked against the f32 product"
    )
    print(table)
    if args.record:
        record(
            f"gemm_amax vs peers on {device}",
            f"`python benchmarks/bench_gemm.py --format {fmt} --shapes {shape_spec} --calls {args.calls} --repeats {args.repeats}"
            f" --chain {args.chain}{' --chain-live-outputs' if args.chain_live_outputs else ''}{' --scan' if args.scan else ''}`"
            f"{' XLA_FLAGS=' + repr(os.environ['XLA_FLAGS']) if os.environ.get('XLA_FLAGS') else ''}"
            f" (jax {jax.__version__}); TFLOP/s = 2MNK x chain / median time, {fmt} operands; a row's chain: "
            f"the operation that many times per jitted call"
            f"{', as lax.scan over stacked operands' if args.scan else ''}, the outputs "
            f"{'live' if args.chain_live_outputs else 'temporaries'}.",
            table,
        )


if __name__ == "__main__":
    main()
