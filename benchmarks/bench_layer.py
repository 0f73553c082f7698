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

`--train` times a training step of one linear layer instead, y = x·W with x bf16 (T, D_in) and W
f32 (D_in, D_out): one jitted call of forward + dgrad + wgrad, the loss sum(y · g) against a fixed
random cotangent g (so dY = g exactly, at the cost of one fused reduction), returning dX and dW.
Three layers with the same custom-VJP structure take turns (bench_gemm.timed_rounds):

  * (a) bf16:         bf16 operands, fp32 accumulation, bf16 outputs and dX (the bar)
  * (b) XLA MXFP8:    the layer a user writes in jnp: x and W quantized to MXFP8 e4m3 and back
                      (one power-of-two scale per 32 elements along the contraction axis), bf16
                      dots on cuBLAS; the straight-through backward quantizes dY, W and x along
                      each backward GEMM's contraction axis, as MXLinear does
  * (c) mx_matmul:    jax_gemm_amax.nn.mx_matmul, MXFP8 e4m3 forward and backward

Reported per shape: ms per step, (c)'s speedup over (b) and its speed relative to (a), TFLOP/s
(6·T·D_in·D_out per step). Checked in the same run: (b) differs from (a) by the quantization error
(relative Frobenius error of y, dX and dW between 1e-3 and 1e-1), and (c) matches (b) (the same
formats: within 2%). On a GPU, XLA folds an f32 -> f8 -> f32 round trip away as excess precision,
so that (b) would not quantize at all: --train runs with --xla_allow_excess_precision=false added to
XLA_FLAGS (all three layers compile under it).

Then the compiled memory of value_and_grad over a stack of layers (the first shape's; x -> layer ->
gelu -> ..., the loss summed): arguments + outputs + temporaries from XLA's memory analysis, (a)
against (c) saving its full-precision residuals and (c) saving only the quantized operands its
backward GEMMs need (save_residuals="quantized").

    python benchmarks/bench_layer.py --train                  # GPU: 8192x4096x4096, 16384x4096x14336, 4096x8192x8192
    python benchmarks/bench_layer.py --train --shapes 256x256x256 --calls 2 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

import jax_gemm_amax as jga
from jax_gemm_amax.nn import mx_matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import dequant_bf16, record, timed_rounds  # noqa: E402

FMT = "mxfp8_e4m3"
TRAIN_GPU_SHAPES = "8192x4096x4096,16384x4096x14336,4096x8192x8192"
TRAIN_CPU_SHAPES = "256x256x256"
EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision=false"
MX_BLOCK = 32
E4M3_MAX = 448.0


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


def run_mlp(args):
    """The MLP-stack mode: µs per layer of quantize -> GEMM -> gelu."""
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


# ----------------------------------------------------------------------------------------------
# --train: one linear layer's training step.


def disallow_excess_precision():
    """Adds --xla_allow_excess_precision=false to XLA_FLAGS. Otherwise XLA on a GPU removes the
    f32 -> f8 -> f32 conversions of the plain-XLA MXFP8 layer (b) as excess precision, and (b) would
    time and return an unquantized layer. XLA reads the flags when it creates a backend, so this runs
    before anything touches a device."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("XLA_FLAGS must be set before JAX creates its backends")
    flags = os.environ.get("XLA_FLAGS", "")
    if EXCESS_PRECISION_FLAG not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {EXCESS_PRECISION_FLAG}".strip()


def parse_train_shapes(spec):
    """'TxD_INxD_OUT,...' -> [(t, d_in, d_out)], each a multiple of the MX block (every dim is some GEMM's K)."""
    shapes = [tuple(int(v) for v in item.split("x")) for item in spec.split(",")]
    for shape in shapes:
        if len(shape) != 3 or any(v <= 0 or v % MX_BLOCK for v in shape):
            raise ValueError(
                f"--shapes: expected TxD_INxD_OUT, multiples of {MX_BLOCK}, got {'x'.join(map(str, shape))}"
            )
    return shapes


def bf16_dot(a, b):
    """a @ b with bf16 operands and fp32 accumulation (cuBLAS on a GPU)."""
    return jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32)


@jax.custom_vjp
def bf16_linear(x, w):
    """(a): y = x @ w in bf16 with fp32 accumulation; its VJP saves x and w, as mx_matmul's does."""
    return bf16_dot(x, w).astype(x.dtype)


def _bf16_linear_fwd(x, w):
    return bf16_linear(x, w), (x, w)


def _bf16_linear_bwd(residuals, dy):
    x, w = residuals
    return bf16_dot(dy, w.T).astype(x.dtype), bf16_dot(x.T, dy).astype(w.dtype)


bf16_linear.defvjp(_bf16_linear_fwd, _bf16_linear_bwd)


def mx_qdq(x, axis):
    """x quantized to MXFP8 e4m3 along `axis` and back, in bf16, as a user writes it in jnp: per
    block of 32 elements the smallest power of two 2^e with amax / 2^e <= 448 (e4m3's largest
    value), x / 2^e cast to float8_e4m3fn, the codes times 2^e (exact in bf16). frexp gives the
    exponent exactly, where ceil(log2(.)) may round across a power of two."""
    axis = axis % x.ndim
    shape = x.shape
    blocks = x.astype(jnp.float32).reshape(shape[:axis] + (shape[axis] // MX_BLOCK, MX_BLOCK) + shape[axis + 1 :])
    amax = jnp.max(jnp.abs(blocks), axis=axis + 1, keepdims=True)
    mant, exp = jnp.frexp(amax / E4M3_MAX)  # amax / 448 = mant * 2^exp, mant in [0.5, 1)
    e = jnp.where(amax > 0, jnp.where(mant == 0.5, exp - 1, exp), 0)
    scale = jnp.ldexp(jnp.ones_like(amax), jnp.clip(e, -127, 127))
    codes = (blocks / scale).astype(jnp.float8_e4m3fn)
    return (codes.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)).reshape(shape)


@jax.custom_vjp
def xla_mx_linear(x, w):
    """(b): y = x @ w on MXFP8-quantized operands, dequantized to bf16 for cuBLAS."""
    return bf16_dot(mx_qdq(x, 1), mx_qdq(w, 0)).astype(x.dtype)


def _xla_mx_linear_fwd(x, w):
    return xla_mx_linear(x, w), (x, w)


def _xla_mx_linear_bwd(residuals, dy):
    # Straight-through: each backward GEMM's operands quantized along its own contraction axis,
    # out_features for dX = dY·Wᵀ, the rows of x and dY for dW = Xᵀ·dY.
    x, w = residuals
    dx = bf16_dot(mx_qdq(dy, 1), mx_qdq(w, 1).T)
    dw = bf16_dot(mx_qdq(x, 0).T, mx_qdq(dy, 0))
    return dx.astype(x.dtype), dw.astype(w.dtype)


xla_mx_linear.defvjp(_xla_mx_linear_fwd, _xla_mx_linear_bwd)


def ours_linear(save_residuals="full"):
    """(c): mx_matmul's output, MXFP8 e4m3 forward and backward."""
    return lambda x, w: mx_matmul(x, w, fmt=FMT, grad_fmt=FMT, save_residuals=save_residuals)[0]


TRAIN_LAYERS = {"(a) bf16": bf16_linear, "(b) XLA MXFP8": xla_mx_linear, "(c) mx_matmul": ours_linear()}


def train_step(layer):
    """Jitted (loss, (dX, dW)) of loss = sum(layer(x, w) · g): forward, dgrad and wgrad, dY = g."""

    def loss(x, w, g):
        return jnp.sum(layer(x, w).astype(jnp.float32) * g.astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def rel_err(a, b):
    """||a - b||_F / ||b||_F in float32."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def train_inputs(t, d_in, d_out, seed=0):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (t, d_in), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (d_in, d_out), jnp.float32) / d_in**0.5
    g = jax.random.normal(kg, (t, d_out), jnp.float32).astype(jnp.bfloat16)
    return x, w, g


def check_train_outputs(x, w, g, steps):
    """Relative Frobenius errors {pair: (y, dX, dW)} of (b) against (a) and (c) against (b); asserts
    that (b) carries the quantization error (it quantizes) and that (c) agrees with (b)."""
    outs = {}
    for name, layer in TRAIN_LAYERS.items():
        _, (dx, dw) = steps[name](x, w, g)
        outs[name] = (jax.jit(layer)(x, w), dx, dw)
    errs = {}
    for pair in (("(b) XLA MXFP8", "(a) bf16"), ("(c) mx_matmul", "(b) XLA MXFP8"), ("(c) mx_matmul", "(a) bf16")):
        errs[pair] = tuple(rel_err(u, v) for u, v in zip(outs[pair[0]], outs[pair[1]]))
        print(
            f"  {pair[0]} vs {pair[1]}: relative error y {errs[pair][0]:.3g}, dX {errs[pair][1]:.3g}, dW {errs[pair][2]:.3g}"
        )
    quantized = errs[("(b) XLA MXFP8", "(a) bf16")]
    assert all(1e-3 < e < 1e-1 for e in quantized), ("(b) does not carry MXFP8's quantization error", quantized)
    assert all(e < 2e-2 for e in errs[("(c) mx_matmul", "(b) XLA MXFP8")]), errs
    return errs


def stack_loss(layer, n):
    """loss(ws, x, g) over n layers, x -> layer -> gelu -> ..., the last activation summed against g."""

    def loss(ws, x, g):
        for w in ws:
            x = jax.nn.gelu(layer(x, w))
        return jnp.sum(x.astype(jnp.float32) * g.astype(jnp.float32))

    return loss


def compiled_memory(fn, args):
    """{arguments, outputs, temporaries, total} bytes of jax.jit(fn) compiled for args (shapes
    only), from XLA's memory analysis; None where the backend gives none."""
    try:
        stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    except Exception as e:  # a backend without the analysis: reported, not fatal
        print(f"  memory analysis unavailable: {type(e).__name__}: {e}")
        return None
    if stats is None:
        return None
    sizes = {
        "arguments": getattr(stats, "argument_size_in_bytes", None),
        "outputs": getattr(stats, "output_size_in_bytes", None),
        "temporaries": getattr(stats, "temp_size_in_bytes", None),
    }
    if any(v is None for v in sizes.values()):
        return None
    sizes["total"] = sum(sizes.values()) - (getattr(stats, "alias_size_in_bytes", 0) or 0)
    return sizes


def stack_memory_table(t, d_in, d_out, n):
    """Markdown rows: the compiled memory of value_and_grad (over the weights) of an n-layer stack,
    (a) against (c) with each save_residuals mode."""
    dims = [d_in] + [d_out] * n
    ws = [jax.ShapeDtypeStruct((a, b), jnp.float32) for a, b in zip(dims[:-1], dims[1:])]
    args = (ws, jax.ShapeDtypeStruct((t, d_in), jnp.bfloat16), jax.ShapeDtypeStruct((t, d_out), jnp.bfloat16))
    layers = {"(a) bf16": bf16_linear}
    for mode in ("full", "quantized"):
        layers[f'(c) mx_matmul, save_residuals="{mode}"'] = ours_linear(mode)
    mem = {name: compiled_memory(jax.value_and_grad(stack_loss(layer, n)), args) for name, layer in layers.items()}
    base = mem["(a) bf16"]
    rows = [
        f"| {n}-layer stack, {t}×{d_in}→{d_out} | arguments MiB | outputs MiB | temporaries MiB | total MiB | total / (a) | temporaries / (a) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in mem.items():
        if m is None:
            rows.append(f"| {name} | n/a | n/a | n/a | n/a | | |")
            continue
        mib = " | ".join(f"{m[k] / 2**20:.1f}" for k in ("arguments", "outputs", "temporaries", "total"))
        ratios = " | ".join(f"{m[k] / base[k]:.2f}" if base and base[k] else "" for k in ("total", "temporaries"))
        rows.append(f"| {name} | {mib} | {ratios} |")
    quantized = mem.get('(c) mx_matmul, save_residuals="quantized"')
    if quantized and base:
        print(
            f'  (c) save_residuals="quantized" total / (a): {quantized["total"] / base["total"]:.2f}x (target <= 0.6x)'
        )
    return rows


def run_train(args):
    """The --train mode: one layer's training step, (a), (b), (c) side by side; then the stack's memory."""
    on_gpu = jax.default_backend() == "gpu"
    shape_spec = args.shapes or (TRAIN_GPU_SHAPES if on_gpu else TRAIN_CPU_SHAPES)
    shapes = parse_train_shapes(shape_spec)
    device = jax.devices()[0].device_kind
    print(f"{device}, jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    steps = {name: train_step(layer) for name, layer in TRAIN_LAYERS.items()}
    rows = [
        "| T×D_in→D_out | (a) bf16 ms | (b) XLA MXFP8 ms | (c) mx_matmul ms | (c) speedup over (b) | (c) speed / (a) "
        "| TFLOP/s (a) | (b) | (c) | rel. err. (b) vs (a): y, dX, dW | (c) vs (b) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, d_in, d_out in shapes:
        print(f"{t}×{d_in}→{d_out}:")
        x, w, g = train_inputs(t, d_in, d_out)
        times = {name: sec for name, (sec, _) in timed_rounds(steps, (x, w, g), args.calls, args.repeats).items()}
        errs = check_train_outputs(x, w, g, steps)
        del x, w, g
        ms = {name: sec * 1e3 for name, sec in times.items()}
        tflops = {name: 6 * t * d_in * d_out / sec / 1e12 for name, sec in times.items()}
        a, b, c = (times[n] for n in TRAIN_LAYERS)
        print(
            f"  (c) speedup over (b): {b / c:.2f}x (target >= 1.25x); (c) speed / (a): {a / c:.2f}x (target >= 0.85x)"
        )
        quantized = ", ".join(f"{e:.2g}" for e in errs[("(b) XLA MXFP8", "(a) bf16")])
        agree = max(errs[("(c) mx_matmul", "(b) XLA MXFP8")])
        rows.append(
            f"| {t}×{d_in}→{d_out} | "
            + " | ".join(f"{ms[n]:.3f}" for n in TRAIN_LAYERS)
            + f" | {b / c:.2f} | {a / c:.2f} | "
            + " | ".join(f"{tflops[n]:.3g}" for n in TRAIN_LAYERS)
            + f" | {quantized} | ≤ {agree:.2g} |"
        )
        print(rows[-1], flush=True)

    t, d_in, d_out = shapes[0]
    print(f"\ncompiled memory, value_and_grad of a {args.mem_layers}-layer stack at {t}×{d_in}→{d_out}:")
    mem_rows = stack_memory_table(t, d_in, d_out, args.mem_layers)
    print("\n".join(mem_rows))

    table = "\n".join(rows) + "\n\n" + "\n".join(mem_rows)
    print(
        f"\n{device}, jax {jax.__version__}, {FMT}, one jitted training step of one layer (forward + dgrad + wgrad), "
        "ms (median), TFLOP/s = 6·T·D_in·D_out / time; ratios > 1: (c) faster"
    )
    print(table)
    if args.record:
        record(
            f"One linear layer's training step (forward + dgrad + wgrad) on {device}",
            f"`python benchmarks/bench_layer.py --train --shapes {shape_spec} --calls {args.calls} --repeats {args.repeats}"
            f" --mem-layers {args.mem_layers}` (jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}); "
            f"ms per step, median; x bf16, W f32, y and dX bf16, dW f32; {FMT} forward and backward for (b) and (c). "
            "Relative errors are Frobenius norms. The memory table: XLA's compiled memory analysis of "
            "value_and_grad over the weights of the layer stack (x -> layer -> gelu -> ...).",
            table,
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024x1024,4096x4096", help="ROWSxD,...: activation rows x layer width")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--act-dtype", default="float32", choices=["float32", "bfloat16"], help="the activation's dtype (gelu's)"
    )
    parser.add_argument(
        "--train", action="store_true", help="time one linear layer's training step instead of the MLP stack"
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help=f"--train: TxD_INxD_OUT,... (default on a GPU {TRAIN_GPU_SHAPES}; elsewhere {TRAIN_CPU_SHAPES})",
    )
    parser.add_argument(
        "--mem-layers", type=int, default=4, help="--train: layers of the stack whose memory is compared"
    )
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.train:
        disallow_excess_precision()
        run_train(args)
    else:
        run_mlp(args)


if __name__ == "__main__":
    main()
