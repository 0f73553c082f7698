"""Train the same MLP twice, side by side: once with float32 ``nnx.Linear`` layers, once with
``MXLinear`` (MXFP8: all three GEMMs of every layer through ``gemm_amax``), from the same seed on
the same batches. Prints both loss curves step by step, the median step time of each (after
warm-up), a ready-to-paste markdown table row, and saves a PNG plot of the two curves.

The task is generated on the fly (no downloads): inputs are Gaussian, labels are the argmax of a
fixed random "teacher" MLP, and the students learn to imitate it with a cross-entropy loss.

    python examples/train_mlp.py                         # CPU: about a minute; a GPU is used if present
    python examples/train_mlp.py --steps 1000 --batch 1024 --hidden 1024 --out /tmp/curves.png
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_gemm_amax.nn import MXLinear


class MLP(nnx.Module):
    """in -> hidden -> hidden -> classes, GELU; ``linear`` is nnx.Linear or MXLinear."""

    def __init__(self, linear, d_in: int, hidden: int, classes: int, *, rngs: nnx.Rngs, **linear_kw):
        self.layers = nnx.List(
            [linear(a, b, rngs=rngs, **linear_kw) for a, b in ((d_in, hidden), (hidden, hidden), (hidden, classes))]
        )

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.gelu(layer(x))
        return self.layers[-1](x)


def teacher_fn(d_in: int, classes: int, seed: int):
    """A fixed random two-layer tanh network whose argmax gives the labels."""
    k1, k2 = jax.random.split(jax.random.key(seed + 1000))
    w1 = jax.random.normal(k1, (d_in, 32)) / np.sqrt(d_in)
    w2 = jax.random.normal(k2, (32, classes)) / np.sqrt(32)
    return lambda x: jnp.argmax(jnp.tanh(x @ w1) @ w2, axis=-1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden width (default 512)")
    parser.add_argument("--d-in", type=int, default=64, help="input features (default 64)")
    parser.add_argument("--classes", type=int, default=16, help="number of classes (default 16)")
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="peak Adam learning rate, warm-up then cosine decay (default 3e-3)"
    )
    parser.add_argument("--fmt", default="mxfp8_e4m3", help="MXLinear forward format (default mxfp8_e4m3)")
    parser.add_argument("--grad-fmt", default="mxfp8_e4m3", help="MXLinear backward format (default mxfp8_e4m3)")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the step-time median (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=1, help="print the losses every N steps (default 1)")
    parser.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_mlp.png"),
        help="PNG path for the loss plot (default: examples/train_mlp.png next to this script)",
    )
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    device = jax.devices()[0]
    print(f"backend: {jax.default_backend()} ({device.device_kind}), jax {jax.__version__}")
    shape = f"MLP {args.d_in}-{args.hidden}-{args.hidden}-{args.classes}, batch {args.batch}"
    print(f"model: {shape}, Adam peak lr {args.lr} (cosine), {args.steps} steps, seed {args.seed}")

    teacher = teacher_fn(args.d_in, args.classes, args.seed)

    @jax.jit
    def make_batch(step):
        x = jax.random.normal(jax.random.fold_in(jax.random.key(args.seed), step), (args.batch, args.d_in))
        return x, teacher(x)

    names = ("fp32 nnx.Linear", f"{args.fmt} MXLinear")
    models = (
        MLP(nnx.Linear, args.d_in, args.hidden, args.classes, rngs=nnx.Rngs(args.seed)),
        MLP(
            MXLinear,
            args.d_in,
            args.hidden,
            args.classes,
            rngs=nnx.Rngs(args.seed),
            fmt=args.fmt,
            grad_fmt=args.grad_fmt,
        ),
    )
    # Same seed, same initializers: the two models start from identical weights.
    for a, b in zip(jax.tree.leaves(nnx.state(models[0], nnx.Param)), jax.tree.leaves(nnx.state(models[1], nnx.Param))):
        assert np.array_equal(a, b)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(20, args.steps // 10), args.steps)
    optimizers = tuple(nnx.Optimizer(m, optax.adam(schedule), wrt=nnx.Param) for m in models)

    def loss_fn(model, x, labels):
        logits = model(x).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    # The functional form (split once, jax.jit a pure step, merge back at the end) keeps NNX's
    # per-call Python graph traversal out of the timed loop; nnx.jit works as well, with more
    # host overhead per step.
    def make_step(model, optimizer):
        graphdef, state = nnx.split((model, optimizer))

        @functools.partial(jax.jit, donate_argnums=0)
        def step(state, x, labels):
            model, optimizer = nnx.merge(graphdef, state)
            loss, grads = nnx.value_and_grad(loss_fn)(model, x, labels)
            optimizer.update(model, grads)
            return loss, nnx.state((model, optimizer))

        return step, state

    steps_and_states = [make_step(m, o) for m, o in zip(models, optimizers)]

    @nnx.jit
    def accuracy(model, x, labels):
        return jnp.mean(jnp.argmax(model(x), axis=-1) == labels)

    losses = [[], []]
    times = [[], []]
    print(f"\n{'step':>5}  {'loss ' + names[0]:>24}  {'loss ' + names[1]:>26}")
    for step in range(args.steps):
        x, labels = make_batch(step)
        jax.block_until_ready((x, labels))
        for i, (step_fn, state) in enumerate(steps_and_states):
            start = time.perf_counter()
            loss, state = jax.block_until_ready(step_fn(state, x, labels))
            times[i].append(time.perf_counter() - start)
            steps_and_states[i] = (step_fn, state)
            losses[i].append(float(loss))
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"{step:5d}  {losses[0][-1]:24.5f}  {losses[1][-1]:26.5f}")

    for (_, state), model, opt in zip(steps_and_states, models, optimizers):
        nnx.update((model, opt), state)  # the trained weights (and amax state) back into the modules
    last_amax = [float(layer.output_amax[...]) for layer in models[1].layers]  # before the evaluation calls
    held_out = [make_batch(10**6 + i) for i in range(8)]  # batches no step trained on
    ms = [1e3 * statistics.median(t[args.warmup :]) for t in times]
    window = max(1, args.steps // 10)
    print("\nsummary")
    for i, name in enumerate(names):
        print(
            f"  {name:>22}: final loss (mean of last {window} steps) {np.mean(losses[i][-window:]):.4f}, "
            f"held-out accuracy {np.mean([float(accuracy(models[i], *b)) for b in held_out]):.3f}, "
            f"median step time {ms[i]:.2f} ms (steps {args.warmup}..{args.steps - 1})"
        )
    gap = np.abs(np.array(losses[1]) - np.array(losses[0])) / np.array(losses[0])
    print(f"  relative loss gap |MX - fp32| / fp32 over the last {window} steps: mean {gap[-window:].mean():.4f}")
    print(
        "  MXLinear output amax (OutputAmax) of the last training step, per layer: "
        + ", ".join(f"{a:.3g}" for a in last_amax)
    )

    print("\nmarkdown (benchmarks/RESULTS.md):")
    print(f"| device | model | {names[0]} step (ms) | {names[1]} step (ms) | MX / fp32 |")
    print("|---|---|---|---|---|")
    print(
        f"| {device.device_kind} ({jax.default_backend()}) | {shape}, train step (fwd+bwd+Adam) "
        f"| {ms[0]:.3f} | {ms[1]:.3f} | {ms[1] / ms[0]:.2f}x |"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def trailing_mean(v, w):
        c = np.cumsum(np.insert(np.asarray(v, np.float64), 0, 0.0))
        t = np.arange(1, len(v) + 1)
        lo = np.maximum(t - w, 0)
        return (c[t] - c[lo]) / (t - lo)

    smooth_w = max(1, min(20, args.steps // 20))
    fig, (ax, ax_gap) = plt.subplots(
        2, 1, figsize=(6.4, 4.8), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    steps = np.arange(args.steps)
    for i, (name, color, style) in enumerate(zip(names, ("tab:blue", "tab:orange"), ("-", "--"))):
        ax.plot(steps, losses[i], color=color, alpha=0.2, linewidth=0.7)
        ax.plot(
            steps,
            trailing_mean(losses[i], smooth_w),
            color=color,
            linestyle=style,
            linewidth=1.6,
            label=f"{name} ({smooth_w}-step mean)",
        )
    ax.set_yscale("log")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"{shape}, same seed and batches ({jax.default_backend()})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    rel = (np.array(losses[1]) - np.array(losses[0])) / np.array(losses[0])
    ax_gap.axhline(0.0, color="gray", linewidth=0.8)
    ax_gap.plot(steps, 100 * trailing_mean(rel, smooth_w), color="tab:orange", linewidth=1.2)
    ax_gap.set_ylabel("MX − fp32 (%)", fontsize=9)
    ax_gap.set_xlabel("step")
    ax_gap.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"\nplot saved to {args.out} ({os.path.getsize(args.out) / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
