"""Sustained speed under the GPU's power cap: gemm_amax and cuBLAS bf16 each run back to back for a
few seconds (twice, alternating) while nvidia-smi samples the SM clock, the board power and the
throttle reasons; prints TF/s with the mean clock and power of each phase. Short benchmarks
(bench_gemm.py) run before the card reaches its power cap; a training step does not.

    python benchmarks/power_draw.py                    # 8192^3, 6 s per phase
    python benchmarks/power_draw.py --shape 4096x4096x4096 --seconds 4
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp

import jax_gemm_amax as jga

SMI_FIELDS = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


def phases(m, n, k):
    x = jax.random.normal(jax.random.key(1), (m, k))
    w = jax.random.normal(jax.random.key(2), (n, k))
    qa, sfa = jga.quantize(x, "mxfp8_e4m3")
    qb, sfb = jga.quantize(w, "mxfp8_e4m3")
    ours = jax.jit(lambda a, b, sa, sb: jga.gemm_amax(a, b, sa, sb, c_dtype=jnp.bfloat16))
    cublas = jax.jit(lambda a, b: jnp.dot(a, b.T))
    runs = {
        "gemm_amax bf16": (ours, (qa, qb, sfa, sfb)),
        "cuBLAS bf16": (cublas, (x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))),
    }
    for fn, args in runs.values():
        jax.block_until_ready(fn(*args))  # compile outside the timed phases
    return runs


def run_phase(fn, args, seconds, flop):
    start = time.time()
    calls = 0
    while time.time() - start < seconds:
        for _ in range(10):
            out = fn(*args)
        jax.block_until_ready(out)
        calls += 10
    end = time.time()
    return start, end, flop * calls / (end - start) / 1e12


def read_samples(path):
    samples = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 4:
                continue
            try:
                t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                samples.append((t, float(parts[1].split()[0]), float(parts[2].split()[0]), parts[3]))
            except ValueError:
                continue
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x8192x8192", help="MxNxK")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each phase")
    parser.add_argument("--rest", type=float, default=3.0, help="idle seconds before each phase")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        parser.error("needs a GPU (it reads nvidia-smi)")
    m, n, k = (int(v) for v in args.shape.split("x"))
    runs = phases(m, n, k)
    log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader", "-lms", "250", "-i", "0"],
        stdout=log,
        stderr=subprocess.DEVNULL,
    )
    try:
        results = []
        for name in list(runs) * 2:
            time.sleep(args.rest)
            fn, fn_args = runs[name]
            results.append((name, *run_phase(fn, fn_args, args.seconds, 2.0 * m * n * k)))
    finally:
        smi.terminate()
        smi.wait()
    samples = read_samples(log.name)
    print(f"{jax.devices()[0].device_kind}, {args.shape}, {args.seconds:g} s per phase, back to back")
    print("| phase | TF/s | SM clock MHz (mean / min) | power W (mean) | throttle reasons |")
    print("|---|---|---|---|---|")
    for name, start, end, tflops in results:
        inside = [s for s in samples if start + 1.0 <= s[0] <= end]  # the first second ramps
        if not inside:
            print(f"| {name} | {tflops:.0f} | n/a | n/a | n/a |")
            continue
        clocks = [s[1] for s in inside]
        watts = [s[2] for s in inside]
        reasons = " ".join(sorted({s[3] for s in inside}))
        print(
            f"| {name} | {tflops:.0f} | {sum(clocks) / len(clocks):.0f} / {min(clocks):.0f} | "
            f"{sum(watts) / len(watts):.0f} | {reasons} |"
        )


if __name__ == "__main__":
    main()
