"""The benchmark scripts' own logic. bench_gemm.py --chain (and --scan): the N repeats inside one jitted call
must all run (XLA merges identical calls on identical operands, which would make the chained timing
N times too fast). bench_layer.py: runs, and its candidates compute the same layer."""

import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jax_gemm_amax as jga


def _load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_gemm = _load("bench_gemm")
bench_layer = _load("bench_layer")


@pytest.mark.parametrize("live_outputs", [False, True], ids=["temporaries", "live"])
@pytest.mark.parametrize("name,op", [("gemm_amax bf16", "custom-call("), ("bf16 dot, no scales (cuBLAS)", " dot(")])
def test_every_repeat_of_a_chain_is_compiled(name, op, live_outputs):
    """Both chain forms compile every repeat in full; the default one returns, per later repeat,
    C[0, 0] (+ amax) of that repeat's own output."""
    if jax.default_backend() != "cpu":
        pytest.skip("counts ops in the CPU executable")

    def operands(seed):  # each repeat its own values, so that a value from the wrong repeat shows
        x = jax.random.normal(jax.random.key(2 * seed), (128, 256))
        w = jax.random.normal(jax.random.key(2 * seed + 1), (128, 256))
        qa, sfa = jga.quantize(x, "mxfp8_e4m3")
        qb, sfb = jga.quantize(w, "mxfp8_e4m3")
        return qa, qb, sfa, sfb, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)

    ops = tuple(operands(i) for i in range(3))
    candidate = bench_gemm.build_candidates(False, "mxfp8_e4m3")[name]
    fn = bench_gemm.chained(candidate, 3, live_outputs)
    assert fn.lower(*ops).compile().as_text().count(op) == 3
    first, rest = fn(*ops)
    assert len(rest) == 2
    if not live_outputs:
        for i, value in enumerate(rest, start=1):
            c, amax = candidate(*ops[i])
            want = float(c[0, 0]) + (0.0 if amax is None else float(amax))
            assert float(value) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("name", ["gemm_amax bf16", "bf16 dot, no scales (cuBLAS)"])
def test_scan_form_runs_every_slice(name):
    """bench_gemm --scan: iteration i computes slice i of the stacked operands (each slice its own
    values here), and the timed form returns the sum of every iteration's C[0, 0] (+ amax)."""

    def operands(seed):
        x = jax.random.normal(jax.random.key(2 * seed), (128, 256))
        w = jax.random.normal(jax.random.key(2 * seed + 1), (128, 256))
        qa, sfa = jga.quantize(x, "mxfp8_e4m3")
        qb, sfb = jga.quantize(w, "mxfp8_e4m3")
        return qa, qb, sfa, sfb, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)

    per_slice = [operands(i) for i in range(3)]
    stacked = tuple(jnp.stack(xs) for xs in zip(*per_slice))
    assert [a.shape for a in stacked] == [b.shape for b in bench_gemm.stack_operands(per_slice[0], 3)]
    candidate = bench_gemm.build_candidates(False, "mxfp8_e4m3")[name]
    cs, amaxes = bench_gemm.scanned(candidate, 3, all_outputs=True)(*stacked)
    want_sum = 0.0
    for i, ops in enumerate(per_slice):
        c, amax = candidate(*ops)
        assert jnp.array_equal(cs[i], c)
        assert (amaxes is None) == (amax is None) and (amax is None or float(amaxes[i]) == float(amax))
        want_sum += float(c[0, 0]) + (0.0 if amax is None else float(amax))
    assert float(bench_gemm.scanned(candidate, 3)(*stacked)) == pytest.approx(want_sum, rel=1e-6)


def test_candidates_take_turns_and_get_their_own_medians(monkeypatch):
    """bench_gemm.timed_rounds: every round times each candidate once, in the same order (so that the
    GPU's clock drift reaches all of them alike), each median is that candidate's own, and so is
    its share of time spent enqueueing. A fake
    clock that only the candidates advance keeps the medians exact on a loaded machine."""
    calls = []
    clock = [0.0]
    monkeypatch.setattr(bench_gemm.time, "perf_counter", lambda: clock[0])
    # Each call's cost in its candidate's unit: four warm-up calls, then rounds of (slow, slow, fast,
    # fast). Per round the samples are slow 6, 2, 1 and fast 7, 3, 1: medians 2 and 3, which differ
    # from each candidate's first and last sample and from its mean (plus half the wait, per call).
    costs = iter([1, 1, 1, 1] + [6, 6, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1])

    def candidate(name, unit):
        def fn(x):
            calls.append(name)
            clock[0] += next(costs) * unit
            return x + 1

        return fn

    fns = {"slow": candidate("slow", 1e-3), "fast": candidate("fast", 1e-5)}

    def wait(x):  # the wait for the last call: 40 us of device time on the fake clock
        clock[0] += 4e-5
        return x

    monkeypatch.setattr(bench_gemm.jax, "block_until_ready", wait)
    share = {}
    result = bench_gemm.timed_rounds(fns, (jnp.zeros(()),), calls=2, repeats=3, enqueue_share=share)
    assert calls == ["slow", "fast", "slow", "fast"] + ["slow", "slow", "fast", "fast"] * 3
    assert result["slow"][0] == pytest.approx(2e-3 + 2e-5)
    assert result["fast"][0] == pytest.approx(3e-5 + 2e-5)
    assert float(result["slow"][1]) == 1.0
    # Enqueueing 12, 4, 2 ms before a 40 us wait (slow), 140, 60, 20 us (fast): median shares.
    assert share == {"slow": pytest.approx(4 / 4.04), "fast": pytest.approx(0.6)}


def test_shapes_carry_their_own_chain(monkeypatch, capsys):
    """bench_gemm --shapes MxNxK[:chain]: a shape without one takes --chain; the default GPU shapes
    are the benchmark's six with the two small ones chained 20 per call; a chained row says so, and every
    candidate of it is checked against the f32 product (main asserts)."""
    assert bench_gemm.parse_shapes("1x2x3,4x5x6:7", 2) == [(1, 2, 3, 2), (4, 5, 6, 7)]
    assert [chain for *_, chain in bench_gemm.parse_shapes(bench_gemm.GPU_SHAPES, 1)] == [1, 1, 1, 1, 20, 20]
    for form in ([], ["--scan"]):
        monkeypatch.setattr(
            sys,
            "argv",
            ["bench_gemm.py", "--shapes", "128x128x256,128x128x256:2", "--calls", "1", "--repeats", "1", *form],
        )
        bench_gemm.main()
        out = capsys.readouterr().out
        label = "scan" if form else "chain"
        assert "| 128×128×256 |" in out and f"| 128×128×256 ({label} 2) |" in out


def test_output_check_fails_off_its_tolerance():
    """bench_gemm.check_outputs, the check of every candidate's output: C is held to 1e-2 of max |C|,
    an amax to its candidate's tolerance (XLA's path, whose amax is of bf16 C: 2^-8; the fused ones
    1e-5), and a candidate without amax (the bar) is checked on C alone."""
    xla, ours, bar = "XLA dequant→bf16 dot→amax", "gemm_amax bf16", "bf16 dot, no scales (cuBLAS)"
    assert bench_gemm.amax_tolerance(xla) == 2.0**-8
    assert bench_gemm.amax_tolerance(ours) == bench_gemm.amax_tolerance("jax.nn.scaled_matmul f32 + amax") == 1e-5
    c = jax.random.normal(jax.random.key(0), (64, 32))
    ref = (c, float(jnp.max(jnp.abs(c))))
    bf16_amax = float(jnp.max(jnp.abs(c.astype(jnp.bfloat16))).astype(jnp.float32))
    assert bf16_amax != ref[1]  # else the two tolerances below would not be told apart
    bench_gemm.check_outputs(xla, (64, 32, 0), [(c.astype(jnp.bfloat16), bf16_amax)], ref)
    bench_gemm.check_outputs(bar, (64, 32, 0), [(c, None)], ref)
    with pytest.raises(AssertionError):
        bench_gemm.check_outputs(ours, (64, 32, 0), [(c, bf16_amax)], ref)
    with pytest.raises(AssertionError):  # one element off by 2% of max |C|
        bench_gemm.check_outputs(bar, (64, 32, 0), [(c.at[3, 5].add(0.02 * ref[1]), None)], ref)
    with pytest.raises(AssertionError):  # the second of two outputs wrong
        bench_gemm.check_outputs(ours, (64, 32, 0), [(c, ref[1]), (c, ref[1] * (1 + 2e-5))], ref)


@pytest.mark.parametrize("fmt", sorted(jga.FORMATS))
def test_xla_path_dequantizes_exactly(fmt):
    """The bench's XLA path (dequant_bf16: codes and scales in bf16, FP4 unpacked by a bitcast) gives
    the library's dequantization exactly, element for element, in every format (nibble order
    included): the baseline computes the same operands as ours, only slower or faster."""
    x = jax.random.normal(jax.random.key(1), (128, 256)) * jnp.exp2(
        jax.random.randint(jax.random.key(2), (128, 1), -20, 20)
    )
    q, sf = jga.quantize(x, fmt)
    sfv = jga.FORMATS[fmt].sf_vec_size
    got = bench_gemm.dequant_bf16(q, sf, sfv)
    assert got.dtype == jnp.bfloat16 and got.shape == x.shape
    assert jnp.array_equal(got.astype(jnp.float32), jga.dequantize(q, sf, sfv))


def test_gpu_work_counts_stream_events_once():
    """The host-bound rows' GPU time sums the kernels and copies on the device planes' stream lines:
    not the host planes, not the lines that annotate the same GPU time again (XLA modules, ops), and
    not the idle time between events."""
    from types import SimpleNamespace as NS

    def line(name, *durations):
        return NS(name=name, events=[NS(duration_ns=d) for d in durations])

    planes = [
        NS(name="/host:CPU", lines=[line("python", 10_000)]),
        NS(
            name="/device:GPU:0",
            lines=[
                line("Stream #13(Compute)", 300, 200),
                line("XLA Ops", 500),
                line("XLA Modules", 700),
                line("Stream #14(MemcpyD2D)", 40),
            ],
        ),
        NS(name="/device:GPU:1", lines=[line("Stream #20(Compute)", 7)]),
    ]
    assert bench_gemm.stream_busy_ns(planes) == 547
    assert bench_gemm.stream_busy_ns(planes[:1]) == 0


def test_gpu_work_of_a_call_is_measured_on_a_gpu_only():
    """gpu_busy_per_call traces the calls with jax.profiler: on a GPU, a positive time below the
    wall time of the calls; on the CPU backend, None (the bench lists nothing), and that because the
    trace, which profile() did write and load, has host planes with events but no GPU plane."""
    x = jnp.ones((512, 512), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    busy = bench_gemm.gpu_busy_per_call(f, (x,), calls=3)
    if jax.default_backend() == "gpu":
        wall, _ = bench_gemm.timed(f, (x,), 3, 3)
        assert busy is not None and 0 < busy < 2 * wall
    else:
        assert busy is None
        planes = bench_gemm.profile(f, (x,), calls=3).planes
        assert sum(1 for p in planes if p.name == "/host:CPU" for line in p.lines for _ in line.events) > 0
        assert not any(p.name.startswith("/device:GPU") for p in planes)


@pytest.mark.parametrize("act_dtype", ["float32", "bfloat16"])
def test_layer_benchmark_runs_and_its_candidates_agree(monkeypatch, capsys, act_dtype):
    """bench_layer.main on a tiny stack: it asserts that one layer of ours matches the XLA
    dequantize path's within 2^-7, and prints a row per size."""
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_layer.py",
            "--sizes",
            "128x256",
            "--layers",
            "2",
            "--calls",
            "1",
            "--repeats",
            "1",
            "--act-dtype",
            act_dtype,
        ],
    )
    bench_layer.main()
    assert "| 128 × 256 |" in capsys.readouterr().out
