"""Quantize benchmark: the CUDA quantize kernels against XLA's fusion of the same jnp function, and
the GPU's measured copy rate, in one process.

For every format (`--formats`), orientation (rows: along the last axis; cols: along the one before
it, the transposed codes; pair: both from one read) and size R x K (`--sizes`), on random
`--dtype` input:
  * ours: the quantize primitive as `jga.quantize` / `jga.quantize_pair` run it (the kernels on a
    GPU; codes, scales and amax)
  * XLA: `quantize_jnp`, the jnp implementation the library runs elsewhere (the same outputs),
    jitted: what XLA makes of it
Each is timed as the median over `--repeats` rounds of (enqueue `--calls` calls, block), the two
taking turns, and reported in TB/s = bytes read and written / median time (x, codes, scales; amax
is 4 bytes). Both outputs are compared bit for bit in the same run (a mismatch is reported under
the table). The bar: a jitted `x + 1` on a 1 GiB float32 array (2 GiB moved per call), the copy
rate XLA reaches on this GPU.

    python benchmarks/bench_quantize.py                        # every format and orientation, three sizes
    python benchmarks/bench_quantize.py --formats mxfp8_e4m3 --modes rows --sizes 16384x8192
    python benchmarks/bench_quantize.py --record               # also prints a RESULTS.md section
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_gemm import timed_rounds  # noqa: E402

import jax_gemm_amax as jga  # noqa: E402
from jax_gemm_amax.primitives.quantize import COLS, PAIR, ROWS, quantize_p  # noqa: E402
from jax_gemm_amax.quantize import quantize_jnp  # noqa: E402

MODES = {"rows": ROWS, "cols": COLS, "pair": PAIR}
GPU_SIZES = "4096x4096,8192x8192,16384x8192"
CPU_SIZES = "512x512"


def moved_bytes(outs, x) -> int:
    return x.size * x.dtype.itemsize + sum(o.size * o.dtype.itemsize for o in outs)


def copy_rate(calls, repeats) -> tuple[float, int]:
    """(TB/s, MiB) of a jitted x + 1 on a 1 GiB float32 array (256 MiB on CPU)."""
    n = (1 << 28) if jax.default_backend() == "gpu" else (1 << 26)
    x = jnp.zeros((n,), jnp.float32)
    seconds, _ = timed_rounds({"copy": jax.jit(lambda v: v + 1)}, (x,), calls, repeats)["copy"]
    return 2 * x.nbytes / seconds / 1e12, x.nbytes >> 20


def same_bits(a, b) -> bool:
    return all(np.array_equal(np.asarray(u).view(np.uint8), np.asarray(v).view(np.uint8)) for u, v in zip(a, b))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default=",".join(jga.FORMATS))
    parser.add_argument("--modes", default="rows,cols,pair")
    parser.add_argument("--sizes", default=None, help=f"RxK,... (default {GPU_SIZES} on GPU, {CPU_SIZES} on CPU)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--record", action="store_true", help="also print the table as a RESULTS.md section")
    args = parser.parse_args()
    sizes = [
        tuple(int(v) for v in s.split("x"))
        for s in (args.sizes or (GPU_SIZES if jax.default_backend() == "gpu" else CPU_SIZES)).split(",")
    ]

    copy, copy_mib = copy_rate(args.calls, args.repeats)
    rng = np.random.default_rng(0)
    rows, mismatches = [], []
    for fmt in args.formats.split(","):
        for mode_name in args.modes.split(","):
            mode = MODES[mode_name]
            for r, k in sizes:
                x = jnp.asarray(rng.standard_normal((1, r, k)).astype(np.float32)).astype(args.dtype)
                fns = {
                    "ours": jax.jit(lambda v, fmt=fmt, mode=mode: quantize_p.bind(v, fmt=fmt, mode=mode)),
                    "xla": jax.jit(lambda v, fmt=fmt, mode=mode: quantize_jnp(v, fmt, mode)),
                }
                result = timed_rounds(fns, (x,), args.calls, args.repeats)
                nbytes = moved_bytes(result["ours"][1], x)
                tbs = {name: nbytes / seconds / 1e12 for name, (seconds, _) in result.items()}
                if not same_bits(result["ours"][1], result["xla"][1]):
                    mismatches.append(f"{fmt} {mode_name} {r}x{k}")
                rows.append((fmt, mode_name, f"{r}×{k}", tbs["ours"], tbs["xla"]))
                print(f"{fmt} {mode_name} {r}x{k}: ours {tbs['ours']:.2f} TB/s, XLA {tbs['xla']:.2f} TB/s", flush=True)

    header = (
        "| format | orientation | R×K | ours TB/s | XLA jnp TB/s | ours / XLA | ours / copy |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {fmt} | {mode} | {size} | {ours:.2f} | {xla:.2f} | {ours / xla:.2f} | {ours / copy:.2f} |\n"
        for fmt, mode, size, ours, xla in rows
    )
    table = header + body
    device = jax.devices()[0].device_kind
    notes = f"Copy rate (jitted x + 1, {copy_mib} MiB of float32): {copy:.2f} TB/s on {device}.\n"
    notes += (
        "Outputs bit-identical to XLA's in every row.\n"
        if not mismatches
        else (f"**Outputs differ from XLA's in: {', '.join(mismatches)}.**\n")
    )
    print("\n" + table + "\n" + notes)
    if args.record:
        command = "python benchmarks/bench_quantize.py " + " ".join(sys.argv[1:])
        print(
            f"## bench_quantize.py: quantize kernels against XLA's jnp fusion\n\n"
            f"{device}, jax {jax.__version__}, {datetime.date.today().isoformat()}. `{command}`; {args.dtype} input "
            f"(1, R, K); TB/s = bytes read + written (x, codes, scales) / median time over {args.repeats} rounds of "
            f"{args.calls} calls, ours and XLA taking turns.\n\n{table}\n{notes}"
        )
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
