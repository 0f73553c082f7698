"""Train the same small transformer twice, side by side: once with float32 ``nnx.Linear``
projections, once with ``MXLinear`` (MXFP8: the forward, dgrad and wgrad GEMMs of every projection
through ``gemm_amax``), from the same seed on the same batches. Prints the two losses every few
steps, a summary (first and final loss, median step time) and saves a PNG plot of the two curves.

The model: a token embedding and a learned position embedding, pre-norm transformer blocks
(LayerNorm, causal multi-head self-attention whose q/k/v/out projections are MXLinear, LayerNorm,
an MLP of two MXLinear with gelu), a final LayerNorm and an ``nnx.Linear`` output head.

The task is generated on the fly (no downloads): sequences from a fixed random second-order Markov
chain, each token drawn from a distribution that depends on the two tokens before it. Predicting
the next token from the current one alone leaves most of the uncertainty; attending to the
previous position removes it, down to the chain's own entropy, which is printed and plotted as the
floor (the mean of -log p(next | two before) over the same batches).

    python examples/train_transformer.py              # CPU: small sizes, a couple of minutes; a GPU picks larger ones
    python examples/train_transformer.py --steps 1000 --d-model 256 --out /tmp/curves.png
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

# Sizes by backend: a GPU runs a model whose GEMMs are large enough to matter; the CPU defaults
# keep the run to a couple of minutes.
DEFAULTS = {
    "gpu": dict(vocab=64, seq=256, batch=64, d_model=512, heads=8, mlp=2048, blocks=2, lr=3e-3),
    "cpu": dict(vocab=16, seq=64, batch=16, d_model=64, heads=4, mlp=256, blocks=1, lr=1e-2),
}


class Attention(nnx.Module):
    """Causal multi-head self-attention; q, k, v and the output projection are ``linear``."""

    def __init__(self, linear, d_model: int, heads: int, *, rngs: nnx.Rngs, **linear_kw):
        self.heads = heads
        self.q = linear(d_model, d_model, rngs=rngs, **linear_kw)
        self.k = linear(d_model, d_model, rngs=rngs, **linear_kw)
        self.v = linear(d_model, d_model, rngs=rngs, **linear_kw)
        self.out = linear(d_model, d_model, rngs=rngs, **linear_kw)

    def __call__(self, x):
        b, t, d = x.shape
        split = lambda y: y.reshape(b, t, self.heads, d // self.heads)
        o = jax.nn.dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        return self.out(o.reshape(b, t, d))


class Block(nnx.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, linear, d_model: int, heads: int, mlp: int, *, rngs: nnx.Rngs, **linear_kw):
        self.ln1 = nnx.LayerNorm(d_model, rngs=rngs)
        self.attn = Attention(linear, d_model, heads, rngs=rngs, **linear_kw)
        self.ln2 = nnx.LayerNorm(d_model, rngs=rngs)
        self.fc1 = linear(d_model, mlp, rngs=rngs, **linear_kw)
        self.fc2 = linear(mlp, d_model, rngs=rngs, **linear_kw)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(jax.nn.gelu(self.fc1(self.ln2(x))))


class Transformer(nnx.Module):
    """Token + position embedding, ``blocks`` blocks, final LayerNorm, nnx.Linear head."""

    def __init__(self, linear, vocab, seq, d_model, heads, mlp, blocks, *, rngs: nnx.Rngs, **linear_kw):
        self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (seq, d_model)))
        self.blocks = nnx.List([Block(linear, d_model, heads, mlp, rngs=rngs, **linear_kw) for _ in range(blocks)])
        self.ln_f = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = nnx.Linear(d_model, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos[...][: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def markov_chain(vocab: int, seed: int, sharpness: float = 3.0):
    """log p(next | two before), (vocab, vocab, vocab): softmax of scaled Gaussian logits, a few
    likely successors per context."""
    logits = sharpness * jax.random.normal(jax.random.key(seed + 1000), (vocab, vocab, vocab))
    return jax.nn.log_softmax(logits, axis=-1)


def batch_fn(log_p, batch: int, seq: int, seed: int):
    """step -> (tokens (batch, seq + 1), floor): sequences of the chain (the first two tokens
    uniform) and the mean -log p of their tokens 2.. given the two before each."""
    vocab = log_p.shape[0]

    @jax.jit
    def make_batch(step):
        k0, k1 = jax.random.split(jax.random.fold_in(jax.random.key(seed), step))
        first = jax.random.randint(k0, (2, batch), 0, vocab)

        def draw(carry, key):
            a, b = carry
            c = jax.random.categorical(key, log_p[a, b])
            return (b, c), c

        _, rest = jax.lax.scan(draw, (first[0], first[1]), jax.random.split(k1, seq - 1))
        tokens = jnp.concatenate([first, rest]).T
        floor = -jnp.mean(log_p[tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]])
        return tokens, floor

    return make_batch


def loss_fn(model, tokens):
    """Next-token cross-entropy over the targets that have two tokens of context (2.. of the sequence)."""
    logits = model(tokens[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, 1:], tokens[:, 2:]).mean()


def make_step(model, optimizer):
    """A jitted pure step over the split (model, optimizer) state: NNX's Python graph traversal
    stays out of the timed loop."""
    graphdef, state = nnx.split((model, optimizer))

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, tokens):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    return step, state


def plot(path, names, losses, floor, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def trailing_mean(v, w):
        c = np.cumsum(np.insert(np.asarray(v, np.float64), 0, 0.0))
        t = np.arange(1, len(v) + 1)
        lo = np.maximum(t - w, 0)
        return (c[t] - c[lo]) / (t - lo)

    n = len(losses[0])
    smooth_w = max(1, min(20, n // 20))
    fig, (ax, ax_gap) = plt.subplots(
        2, 1, figsize=(6.4, 4.8), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    steps = np.arange(n)
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
    ax.axhline(floor, color="gray", linestyle=":", linewidth=1.2, label=f"chain entropy {floor:.3f}")
    ax.set_ylabel("next-token cross-entropy")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    rel = (np.array(losses[1]) - np.array(losses[0])) / np.array(losses[0])
    ax_gap.axhline(0.0, color="gray", linewidth=0.8)
    ax_gap.plot(steps, 100 * trailing_mean(rel, smooth_w), color="tab:orange", linewidth=1.2)
    ax_gap.set_ylabel("MX − fp32 (%)", fontsize=9)
    ax_gap.set_xlabel("step")
    ax_gap.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main():
    backend = jax.default_backend()
    sizes = DEFAULTS["gpu" if backend == "gpu" else "cpu"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--batch", type=int, default=sizes["batch"], help="sequences per batch")
    parser.add_argument("--seq", type=int, default=sizes["seq"], help="context length")
    parser.add_argument("--vocab", type=int, default=sizes["vocab"], help="vocabulary size")
    parser.add_argument("--d-model", type=int, default=sizes["d_model"], help="model width")
    parser.add_argument("--heads", type=int, default=sizes["heads"], help="attention heads")
    parser.add_argument("--mlp", type=int, default=sizes["mlp"], help="MLP hidden width")
    parser.add_argument("--blocks", type=int, default=sizes["blocks"], help="transformer blocks")
    parser.add_argument(
        "--lr", type=float, default=sizes["lr"], help="peak AdamW learning rate, warm-up then cosine decay"
    )
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--fmt", default="mxfp8_e4m3", help="MXLinear forward format")
    parser.add_argument("--grad-fmt", default="mxfp8_e4m3", help="MXLinear backward format")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the step-time median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-every", type=int, default=25, help="print the losses every N steps")
    parser.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_transformer.png"),
        help="PNG path for the loss plot (default: examples/train_transformer.png next to this script)",
    )
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    if args.d_model % args.heads:
        parser.error("--d-model must be a multiple of --heads")

    device = jax.devices()[0]
    print(f"backend: {backend} ({device.device_kind}), jax {jax.__version__}")
    shape = (
        f"{args.blocks} block{'s' * (args.blocks > 1)}, d {args.d_model}, {args.heads} heads, MLP {args.mlp}, "
        f"vocab {args.vocab}, {args.batch}×{args.seq} tokens"
    )
    print(f"model: {shape}; AdamW peak lr {args.lr} (cosine), {args.steps} steps, seed {args.seed}")

    make_batch = batch_fn(markov_chain(args.vocab, args.seed), args.batch, args.seq, args.seed)
    dims = (args.vocab, args.seq, args.d_model, args.heads, args.mlp, args.blocks)
    names = ("fp32 nnx.Linear", f"{args.fmt} MXLinear")
    models = (
        Transformer(nnx.Linear, *dims, rngs=nnx.Rngs(args.seed)),
        Transformer(MXLinear, *dims, rngs=nnx.Rngs(args.seed), fmt=args.fmt, grad_fmt=args.grad_fmt),
    )
    # Same seed, same initializers, same order of draws: the two models start from identical weights.
    for a, b in zip(jax.tree.leaves(nnx.state(models[0], nnx.Param)), jax.tree.leaves(nnx.state(models[1], nnx.Param))):
        assert np.array_equal(a, b)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(20, args.steps // 10), args.steps)
    tx = optax.adamw(schedule, weight_decay=args.weight_decay)
    steps_and_states = [make_step(m, nnx.Optimizer(m, tx, wrt=nnx.Param)) for m in models]

    losses, times, floors = [[], []], [[], []], []
    print(f"\n{'step':>5}  {'loss ' + names[0]:>22}  {'loss ' + names[1]:>25}  {'chain entropy':>13}")
    for step in range(args.steps):
        tokens, floor = jax.block_until_ready(make_batch(step))
        floors.append(float(floor))
        for i, (step_fn, state) in enumerate(steps_and_states):
            start = time.perf_counter()
            loss, state = jax.block_until_ready(step_fn(state, tokens))
            times[i].append(time.perf_counter() - start)
            steps_and_states[i] = (step_fn, state)
            losses[i].append(float(loss))
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"{step:5d}  {losses[0][-1]:22.4f}  {losses[1][-1]:25.4f}  {floors[-1]:13.4f}")

    window = max(1, args.steps // 10)
    floor = float(np.mean(floors))
    ms = [1e3 * statistics.median(t[args.warmup :]) for t in times]
    print(f"\nsummary (chain entropy, the lowest reachable loss: {floor:.4f}; uniform guess: {np.log(args.vocab):.4f})")
    for i, name in enumerate(names):
        print(
            f"  {name:>20}: first loss {losses[i][0]:.4f}, final loss (mean of last {window} steps) "
            f"{np.mean(losses[i][-window:]):.4f}, median step time {ms[i]:.2f} ms (steps {args.warmup}..{args.steps - 1})"
        )
    final = [np.mean(v[-window:]) for v in losses]
    print(f"  final loss MX / fp32: {final[1] / final[0]:.4f}; step time MX / fp32: {ms[1] / ms[0]:.2f}x")

    plot(args.out, names, losses, floor, f"transformer: {shape}\nsame seed and batches ({backend})")
    print(f"\nplot saved to {args.out} ({os.path.getsize(args.out) / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
