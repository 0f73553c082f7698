"""The CUDA lowering, checked on any machine (jax lowers for the "cuda" platform without a GPU):
the custom call carries the kernel's device workspace as a third result that XLA owns."""

import re

import jax
import jax.numpy as jnp
import pytest
from sm90_plans import lowering_plan

import jax_gemm_amax as jga
from jax_gemm_amax import _ffi
from jax_gemm_amax.primitives.gemm_amax import _cuda_workspace_bytes

E4M3, E8M0 = jnp.float8_e4m3fn, jnp.float8_e8m0fnu

pytestmark = pytest.mark.skipif(not _ffi.BUILT_WITH_CUDA, reason="built without the CUDA backend")


def _custom_call_results(m, n, k, fmt="mxfp8_e4m3", sfv=32, scale_dtype=None):
    qa, sfa = jga.quantize(jnp.ones((m, k), jnp.float32), fmt)
    qb, sfb = jga.quantize(jnp.ones((n, k), jnp.float32), fmt)
    if scale_dtype is not None:  # e8m0 scales given as raw bytes
        sfa, sfb = (jax.lax.bitcast_convert_type(x, scale_dtype) for x in (sfa, sfb))
    f = jax.jit(lambda *x: jga.gemm_amax(*x, c_dtype=jnp.bfloat16, sf_vec_size=sfv))
    text = f.trace(qa, qb, sfa, sfb).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @jax_gemm_amax_cuda" in line]
    assert len(calls) == 1, text
    return re.search(r"-> \((.*)\)\s*$", calls[0]).group(1)


@pytest.mark.parametrize(
    "m,n,k,workspace",
    [
        # few tiles: split-K up to 4, 3 partial slots, then the BF16 A (offered from N = 768 on)
        (256, 1024, 512, 256 + 3 * 256 * 1024 * 4 + 256 * 512 * 2),
        (256, 512, 512, 256 + 3 * 256 * 512 * 4),  # ... and below N = 768 no A'
        # 128 counters (tile 128), one partial slot, then the BF16 A (split plans pre-convert A)
        (256, 8192, 8192, 512 + 1 * 256 * 8192 * 4 + 256 * 8192 * 2),
        (300, 200, 64, 256 + 3 * 512 * 256 * 4),  # padded to 256x128 tiles
        # many tiles: 16 MB of partials (a tail split), then the BF16 A (4 MB; with B' 8 MB, less)
        (8192, 8192, 256, 64 * 64 * 4 + (1 << 22) * 4 + 8192 * 256 * 2),
        (4096, 4096, 4096, 2 * 4096 * 4096 * 2),  # many rows and columns: the BF16 B and A (64 MB) are larger
        # 16 MB of partials, then the BF16 A (4096 x 256 x 2); B' and A' together are smaller
        (4096, 1000, 192, 32 * 8 * 4 + (1 << 22) * 4 + 4096 * 256 * 2),
        # many columns: 16 MB of partials, then the BF16 A (rows padded to 8)
        (1500, 4096, 8192, 12 * 32 * 4 + (1 << 22) * 4 + 1504 * 8192 * 2),
    ],
)
def test_workspace_is_a_third_result(m, n, k, workspace):
    results = _custom_call_results(m, n, k)
    assert results == f"tensor<1x{m}x{n}xbf16>, tensor<1xf32>, tensor<{workspace}xui8>"


def test_workspace_holds_packed_fp4_operands_in_bf16():
    # K = 4096 packed in 2048 bytes per row: 16 slabs of 256 elements, 2 bytes each (32 MB each).
    results = _custom_call_results(4096, 4096, 4096, fmt="nvfp4", sfv=16)
    assert results.endswith(f"tensor<{2 * 4096 * 4096 * 2}xui8>"), results


@pytest.mark.parametrize("operand", [jnp.float4_e2m1fn, jnp.uint8])
def test_workspace_query_reads_float4_operands_as_packed(operand):
    # The name float4_e2m1fn stands for the packed uint8 operands the kernels see.
    assert _ffi.workspace_bytes(1, 4096, 4096, 4096, operand, E4M3, 16) == 2 * 4096 * 4096 * 2


def test_preconverted_operands_can_be_withheld(monkeypatch):
    monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", "0")
    results = _custom_call_results(4096, 4096, 256)
    assert results.endswith(f"tensor<{32 * 32 * 4 + (1 << 22) * 4}xui8>"), results


def test_workspace_counts_every_batch_item():
    # 4 items of 256x512: 4 x 2 x 4 = 32 counters (128 bytes, one 256-byte block) and 3 slots.
    assert _cuda_workspace_bytes(4, 256, 512, 512, E4M3, E8M0, 32) == 256 + 3 * 4 * 256 * 512 * 4
    # 2 items of 4096 x 4096: the BF16 B and A of both.
    assert _cuda_workspace_bytes(2, 4096, 4096, 4096, E4M3, E8M0, 32) == 2 * 2 * 4096 * 4096 * 2


@pytest.mark.parametrize(
    "m,n,k,copy_a,copy_b",
    [
        (2048, 768, 8192, True, True),  # B' from 2048 rows on, A' from 768 columns (the plan decides)
        (2047, 760, 8192, False, False),  # just below both (N a multiple of 8: bf16 C rows of 16 bytes)
        (2048, 768, 1024, True, True),  # at any K
        (8192, 512, 16384, False, True),  # B' alone
        (1024, 768, 8192, True, False),  # A' alone
    ],
)
def test_workspace_offers_copies_by_the_size_rule(monkeypatch, m, n, k, copy_a, copy_b):
    # The operands whose BF16 copies the kernel library asks room for (its cost model then decides
    # whether the plan converts them), seen through the workspace it asks for: the split-K area (what
    # it asks with copies withheld) followed by A', or B' and A', whichever is larger; e4m3 copies
    # hold 2 bytes per element, A's rows padded to 8. The shapes make each offered copy change the size.
    monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", "0")
    split = _cuda_workspace_bytes(1, m, n, k, E4M3, E8M0, 32)
    monkeypatch.setenv("JAX_GEMM_AMAX_PRECONVERT", "1")
    a = -(-m // 8) * 8 * k * 2 if copy_a else 0
    b = n * k * 2 if copy_b else 0
    assert _cuda_workspace_bytes(1, m, n, k, E4M3, E8M0, 32) == max(split + a, a + b)


@pytest.mark.parametrize("scale_dtype", [jnp.uint8, jnp.int8])
def test_byte_scales_lower_like_e8m0(scale_dtype):
    # int8/uint8 scales are read as e8m0: the same custom call, the same workspace.
    assert _custom_call_results(4096, 4096, 4096, scale_dtype=scale_dtype) == _custom_call_results(4096, 4096, 4096)


@pytest.mark.parametrize(
    "m,n,k,plan",
    [
        # the benchmark's six shapes
        (8192, 8192, 8192, "256/1/0+AB"),
        (4096, 4096, 4096, "256/1/0+AB"),
        (16384, 8192, 1024, "256/1/0+AB"),
        (2048, 28672, 8192, "256/1/0+A"),
        (256, 8192, 8192, "256/2/0+A"),
        (1024, 1024, 1024, "128/2/0"),
        # each candidate priced with every operand choice (percentages below: the plan against the
        # alternative named or the plan without the copy, taking turns in one process on an H200)
        (3072, 3072, 1024, "256/1/0+AB"),
        (8192, 2048, 1024, "256/1/0+AB"),
        (384, 28672, 4096, "256/2/396+A"),
        (512, 5120, 4096, "256/1/0+A"),
        (768, 2048, 4096, "256/2/0+A"),  # split plans take A' where the main loop is long enough
        (2048, 3072, 1024, "256/1/0+AB"),  # ... not at K = 1024 (A' lost 1.8%); the ping-pong A'B' +13%
        (640, 8192, 1024, "128/2/264"),  # tile 256 with A' lost 7% here
        (3072, 3072, 8192, "256/4/264+A"),  # tail splits of the same tiles: the cheaper wins outright
        # A' offered from N = 768 (the model's A' plan against the plan without it)
        (768, 1536, 16384, "256/2/0+A"),  # +12.8%
        (1792, 1792, 4096, "256/1/0+A"),  # +5.9% over a tile-128 tail split
        (3072, 1536, 8192, "256/4/132+A"),  # +7.5%
        (2048, 1792, 8192, "256/1/0+A"),  # +3.5% over B'
        (4096, 1536, 8192, "256/1/0+AB"),  # the tail split with A' +8.9%; the ping-pong A'B' +4.6% over it
        (8192, 1792, 8192, "256/1/0+AB"),  # the tail split with A' +6.8% over B'; A'B' +6.6% over it
        # the ping-pong A'B' kernel priced by its own waves
        (3072, 6144, 2048, "256/1/0+AB"),  # +7.1% over the tail split with A'
        (2048, 5120, 2048, "256/1/0+AB"),  # +7.6% over the tail split with A'
        (6144, 1024, 4096, "256/1/0+AB"),  # +7.5% over 256/2/132 without copies
        (6144, 1408, 4096, "256/1/0+B"),  # 11 column tiles: A'B' runs 12 in 2.5 waves, B' 2
    ],
)
def test_h200_plans(m, n, k, plan):
    # The SM90 planner's pick on a 132-SM H200 with the workspace the lowering asks for (host
    # arithmetic): the plans the benchmarks measured, so that a planner change shows up here first.
    info, pre = lowering_plan((1, m, n, k, E4M3, E8M0, 32), sms=132)
    got = f"{info['tile_m']}/{info['splits']}/{info['whole_tiles']}" + (f"+{pre}" if pre else "")
    assert got == plan
