"""Small gemm_amax calls for `compute-sanitizer --tool memcheck` on a GPU: a partial-tile case
(M, N not multiples of any tile, K' padded), batched cases, one with A and B pre-converted to BF16,
one split-K plan with A pre-converted, and few-row cases (the few-row kernel, both-scaled and
weight-only), each checked for correctness; then the quantize kernels (rows, columns, pair) on shapes with partial tiles and scale
blocks, checked against jnp bit for bit.
Not a pytest module: run as `compute-sanitizer --tool memcheck python tests/sanitizer_cases.py`;
JGA_SANITIZER_CASES=<text> runs only the cases whose name holds it (e.g. "few rows", "quantize")."""

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import npref  # noqa: E402
import numpy as np  # noqa: E402

import jax_gemm_amax as jga  # noqa: E402

rng = np.random.default_rng(7)
only = os.environ.get("JGA_SANITIZER_CASES", "")
cases = [
    ("partial tiles e4m3 -> bf16", "e4m3", ml_dtypes.float8_e8m0fnu, 32, 200, 136, 320, 1, "bfloat16"),
    ("batched nvfp4 -> packed fp4", "fp4", ml_dtypes.float8_e4m3fn, 16, 130, 96, 256, 3, "uint8"),
    ("batched mxfp4 -> f32", "fp4", ml_dtypes.float8_e8m0fnu, 32, 72, 200, 512, 2, "float32"),
    # M, N >= 4096 and (by the cost model, on a 132-SM H200) a tile-256 unsplit plan: the SM90 kernel
    # converts A and B to BF16 in passes of their own first (K tail, partial tiles, M not a multiple of 8)
    ("pre-converted A and B e4m3 -> bf16", "e4m3", ml_dtypes.float8_e8m0fnu, 32, 4100, 4104, 352, 1, "bfloat16"),
    # few rows, many columns, long K: tile 256 split-K 2 ways, A pre-converted after the split-K area
    ("split-K with pre-converted A mxfp4 -> f32", "fp4", ml_dtypes.float8_e8m0fnu, 32, 250, 6000, 8192, 1, "float32"),
    # few rows (M <= 32): the few-row kernel; split-K, partial tiles, a partial scale block, batches
    ("few rows split-K e4m3 -> bf16", "e4m3", ml_dtypes.float8_e8m0fnu, 32, 7, 1000, 4096, 1, "bfloat16"),
    ("few rows batched nvfp4 -> packed fp4", "fp4", ml_dtypes.float8_e4m3fn, 16, 31, 224, 4096, 2, "uint8"),
    ("few rows partial scale block mxfp4 -> f32", "fp4", ml_dtypes.float8_e8m0fnu, 32, 32, 200, 160, 1, "float32"),
    ("few rows e5m2 -> e4m3", "e5m2", ml_dtypes.float8_e8m0fnu, 32, 1, 144, 8288, 1, "float8_e4m3fn"),
    # 8-token FP4 kernels with splits of 4+ stages: the copy ring's refills run
    ("few rows refills mxfp4 -> bf16", "fp4", ml_dtypes.float8_e8m0fnu, 32, 5, 256, 4096, 1, "bfloat16"),
    ("few rows refills nvfp4 -> f32", "fp4", ml_dtypes.float8_e4m3fn, 16, 2, 384, 8192, 1, "float32"),
]
for name, kind, sf, sfv, m, n, k, batch, c_dtype in cases:
    if only not in name:
        continue
    p = npref.random_problem(rng, kind, sf, sfv, m, n, k, batch=batch)
    c, amax = jga.gemm_amax(p.a, p.b, p.sfa, p.sfb, c_dtype=c_dtype, sf_vec_size=sfv)
    ref, abssum, ref_amax = npref.gemm_amax_f64(p.a, p.b, p.sfa, p.sfb, sfv)
    npref.assert_c_close(np.asarray(c), c_dtype, ref, abssum)
    np.testing.assert_allclose(float(amax), ref_amax.max(), rtol=2e-5)
    print(f"{name}: ok on {jax.devices()[0].device_kind}", flush=True)

# Weight-only calls (bfloat16/float16 a, sfa=None) on the few-row kernel: split-K, batches, partial
# tiles and a K tail, every B format; on sm_90 a bfloat16 a of more than 64 rows runs on the Hopper
# GEMM (A's BF16 copy: rows past a multiple of 8, a K tail, split-K); checked against the CPU backend.
E8M0, E4M3 = ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn
weight_only_cases = [  # (name, a dtype, b kind, scale dtype, sf_vec_size, m, n, k, batch, c dtype)
    ("few rows weight-only bf16 x mxfp4 split-K -> bf16", "bfloat16", "fp4", E8M0, 32, 13, 200, 4096, 1, "bfloat16"),
    ("few rows weight-only f16 x e4m3 batched -> f32", "float16", "e4m3", E8M0, 32, 64, 136, 1056, 2, "float32"),
    ("few rows weight-only bf16 x nvfp4 -> f32", "bfloat16", "fp4", E4M3, 16, 32, 256, 8192, 1, "float32"),
    ("few rows weight-only f16 x e5m2 K tail -> e4m3", "float16", "e5m2", E8M0, 32, 1, 144, 96, 1, "float8_e4m3fn"),
    (
        "hopper gemm weight-only bf16 x e4m3 K tail batched -> bf16",
        "bfloat16",
        "e4m3",
        E8M0,
        32,
        73,
        136,
        96,
        3,
        "bfloat16",
    ),
    ("hopper gemm weight-only bf16 x nvfp4 split-K -> f32", "bfloat16", "fp4", E4M3, 16, 100, 256, 8192, 1, "float32"),
    # scales within 2^-64..2^1: folded stages; 100 rows: two launches
    (
        "few rows weight-only bf16 x mxfp4 folded 100 rows batched -> bf16",
        "bfloat16",
        "fp4",
        E8M0,
        32,
        100,
        200,
        2048,
        2,
        "bfloat16",
    ),
]
for name, a_dtype, kind, sf, sfv, m, n, k, batch, c_dtype in weight_only_cases:
    if only not in name:
        continue
    a = rng.standard_normal((batch, m, k)).astype(a_dtype if a_dtype == "float16" else ml_dtypes.bfloat16)
    b = npref.random_operand(rng, batch, n, k, kind)
    sfb = npref.random_scales(rng, batch, n, k, sfv, sf)
    if "folded" in name:
        sfb = npref.physical_scales(rng.integers(100, 129, size=(batch, n, k // sfv)).astype(np.uint8), sf)
    f = jax.jit(
        lambda a, b, s, sfv=sfv, c_dtype=c_dtype: jga.gemm_amax(a, b, None, s, c_dtype=c_dtype, sf_vec_size=sfv)
    )
    got = f(a, b, sfb)
    with jax.default_device(jax.devices("cpu")[0]):
        want = f(a, b, sfb)
    c_got, c_want = (np.asarray(x.c).astype(np.float32) for x in (got, want))
    rtol = {"float32": 2e-5, "bfloat16": 2.0**-7, "float8_e4m3fn": 2.0**-3}[c_dtype]  # one ulp of C
    np.testing.assert_allclose(c_got, c_want, rtol=rtol, atol=1e-3 * float(want.amax))
    np.testing.assert_allclose(float(got.amax), float(want.amax), rtol=2e-5)
    print(f"{name}: ok on {jax.devices()[0].device_kind}", flush=True)

from jax_gemm_amax.primitives.quantize import COLS, PAIR, ROWS, quantize_p  # noqa: E402
from jax_gemm_amax.quantize import quantize_jnp  # noqa: E402

quantize_cases = [  # (format, input dtype, mode, x shape): rows/K not multiples of the tiles or of 128
    ("mxfp8_e4m3", "bfloat16", ROWS, (2, 200, 160)),
    ("mxfp8_e5m2", "float32", COLS, (3, 96, 208)),
    ("mxfp4", "float16", PAIR, (2, 320, 160)),
    ("nvfp4", "bfloat16", PAIR, (1, 80, 272)),
    ("nvfp4", "float32", ROWS, (1, 4100, 1040)),
    ("mxfp8_e4m3", "bfloat16", COLS, (2, 64, 101)),  # odd K: element loads
    ("nvfp4", "float32", PAIR, (1, 80, 208)),  # R an odd multiple of 16
]
for fmt, dtype, mode, shape in quantize_cases:
    if only not in f"quantize {fmt} {dtype}":
        continue
    x = jax.numpy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    got = jax.jit(lambda v, fmt=fmt, mode=mode: quantize_p.bind(v, fmt=fmt, mode=mode))(x)
    want = jax.jit(lambda v, fmt=fmt, mode=mode: quantize_jnp(v, fmt, mode))(x)
    for g, w in zip(got, want):
        assert np.array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8)), (fmt, dtype, mode, shape)
    print(f"quantize {fmt} {dtype} mode {mode} {shape}: ok on {jax.devices()[0].device_kind}", flush=True)
