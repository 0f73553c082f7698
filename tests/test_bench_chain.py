"""benchmarks/bench_gemm.py --chain: the N repeats inside one jitted call must all run (XLA merges
identical calls on identical operands, which would make the chained timing N times too fast)."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jax_gemm_amax as jga

_spec = importlib.util.spec_from_file_location("bench_gemm", Path(__file__).parents[1] / "benchmarks" / "bench_gemm.py")
bench_gemm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gemm)


@pytest.mark.parametrize("name,op", [("gemm_amax bf16", "custom-call("), ("bf16 dot, no scales (cuBLAS)", " dot(")])
def test_every_repeat_of_a_chain_is_compiled(name, op):
    if jax.default_backend() != "cpu":
        pytest.skip("counts ops in the CPU executable")
    x = jax.random.normal(jax.random.key(0), (128, 256))
    w = jax.random.normal(jax.random.key(1), (128, 256))
    qa, sfa = jga.quantize(x, "mxfp8_e4m3")
    qb, sfb = jga.quantize(w, "mxfp8_e4m3")
    ops = bench_gemm.chain_operands((qa, qb, sfa, sfb, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)), 3)
    fn = bench_gemm.chained(bench_gemm.build_candidates(False, "mxfp8_e4m3")[name], 3)
    assert fn.lower(*ops).compile().as_text().count(op) == 3
    first, rest = fn(*ops)
    assert len(rest) == 2
