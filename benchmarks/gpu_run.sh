#!/usr/bin/env bash
# On the GPU machine (from the repository root): build and install for sm_90a and check the SASS,
# then the named stages: `tests` (the whole suite on the GPU backend, as JGA_TEST_SHARDS=4 pytest processes at once), `bench` (the
# side-by-side benchmark, --record), `memcheck` (compute-sanitizer on small cases), `train` (the
# Flax example's step times), and, when named, `layer` (benchmarks/bench_layer.py: MLP layers with the
# activation's quantization, f32 and bf16 activations, --record), `layer-train` (bench_layer.py --train: one
# linear layer's training step and a layer stack's compiled memory, --record), `transformer`
# (examples/train_transformer.py), `decode` (benchmarks/bench_decode.py: few-row GEMMs against
# pre-quantized weights) and `quantize` (benchmarks/bench_quantize.py: the quantize kernels against
# XLA's jnp fusion, --record printed to its log). Logs and the updated RESULTS.md
# land in $OUT. Each stage has its own time limit; the default four take more than 10 minutes in all,
# so where one command may run 10 minutes at most, run them as two:
#   benchmarks/gpu_run.sh tests
#   benchmarks/gpu_run.sh bench memcheck train
# Optional: JGA_TEST_PATHS="tests/test_gemm_amax.py ..." runs part of the suite (JGA_TEST_TIMEOUT: seconds per pytest process, default 530), JGA_BIG_TRAIN=0 skips the large Flax example, JGA_BENCH_ARGS="--repeats 5" is passed to
# the benchmark (all three save GPU time). The benchmark's default shapes are its six, the two small ones
# chained 20 per jitted call (bench_gemm.py's docstring).
set -uo pipefail
STAGES=" ${*:-tests bench memcheck train} "
run_stage() { [[ "$STAGES" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CMAKE_BUILD_PARALLEL_LEVEL=16
OUT=${OUT:-/tmp/jga-out}
mkdir -p "$OUT"
REPO=$(pwd)
t0=$(date +%s)
stamp() { echo "--- $1 at +$(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=/tmp/jga-build \
  -C cmake.define.JAX_GEMM_AMAX_CUDA=ON -C cmake.define.JAX_GEMM_AMAX_CUDA_ARCHS=90a . \
  > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
stamp "built and installed"

cd /tmp  # import the installed package, not the source tree
so=$(python3 -c "import jax_gemm_amax._jax_gemm_amax as e; print(e.__file__)")
if ! run_stage tests; then  # the suite checks the SASS itself (tests/test_cuda_build.py)
  cuobjdump --dump-sass "$so" > /tmp/jga-sass.txt  # once: a dump of the whole extension takes a while
  echo "SASS: HGMMA $(grep -c HGMMA /tmp/jga-sass.txt), local-memory ops $(grep -cE '\b(LDL|STL)\b' /tmp/jga-sass.txt)"
fi

if run_stage tests; then
  # The kernel's own cases (tests/test_sm90_kernel_cases.py) link the kernels just built instead of
  # compiling them again.
  export JGA_SM90_KERNEL_LIB=/tmp/jga-build/libjga_cuda_sm90.a
  # JGA_TEST_SHARDS pytest processes at once, each every N-th test (tests/conftest.py): the suite's
  # time is mostly XLA's compiles on the host, ~500 s in one process.
  # JGA_TEST_PATHS (paths relative to the repository root, default tests) runs part of the suite.
  SHARDS=${JGA_TEST_SHARDS:-4}; pids=(); paths=()
  for p in ${JGA_TEST_PATHS:-tests}; do paths+=("$REPO/$p"); done
  for ((i = 0; i < SHARDS; i++)); do
    JGA_TEST_SHARD=$i/$SHARDS timeout "${JGA_TEST_TIMEOUT:-530}" python3 -m pytest -q -rfEs -p no:cacheprovider --durations=5 \
      "${paths[@]}" > "$OUT/pytest_$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  echo "pytest rc=$rc ($SHARDS shards)"
  for ((i = 0; i < SHARDS; i++)); do echo "shard $i: $(tail -1 "$OUT/pytest_$i.log")"; done
  # The shards' failures, errors and skips, alike lines merged: "SKIPPED [N] where: why" counts N tests.
  grep -h -E "^(SKIPPED|FAILED|ERROR)" "$OUT"/pytest_*.log | awk '
    match($0, /^SKIPPED \[[0-9]+\] /) { n[substr($0, RLENGTH + 1)] += substr($0, 10, RLENGTH - 11); next }
    { n[$0] += 1 }
    END { for (line in n) printf "%7d %s\n", n[line], (line ~ /^(FAILED|ERROR)/ ? line : "SKIPPED " line) }' | sort -k2
  stamp "tests"
fi

if run_stage bench; then
  # Under JAX's default allocator (preallocation), as users run: with XLA_PYTHON_CLIENT_PREALLOCATE=false,
  # XLA's "Build buffer allocations" took 0.5-0.7 ms per call of a 20-op gemm_amax chain against
  # 71 us with the preallocated pool (profiled with benchmarks/profile_chain.py).
  env -u XLA_PYTHON_CLIENT_PREALLOCATE timeout 280 python3 "$REPO/benchmarks/bench_gemm.py" --record ${JGA_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -10 "$OUT/bench.log"
  cp "$REPO/benchmarks/RESULTS.md" "$OUT/RESULTS.md" 2>/dev/null
  stamp "benchmark"
fi

if run_stage layer; then
  for act in float32 bfloat16; do
    env -u XLA_PYTHON_CLIENT_PREALLOCATE timeout 150 python3 "$REPO/benchmarks/bench_layer.py" --act-dtype $act --record > "$OUT/layer_$act.log" 2>&1
    echo "layer ($act activations) rc=$?"; tail -4 "$OUT/layer_$act.log"
  done
  cp "$REPO/benchmarks/RESULTS.md" "$OUT/RESULTS.md" 2>/dev/null
  stamp "layer"
fi

if run_stage layer-train; then
  env -u XLA_PYTHON_CLIENT_PREALLOCATE timeout 400 python3 "$REPO/benchmarks/bench_layer.py" --train --record > "$OUT/layer_train.log" 2>&1
  echo "layer-train rc=$?"; grep -E "speedup|total / \(a\)" "$OUT/layer_train.log"; tail -12 "$OUT/layer_train.log"
  cp "$REPO/benchmarks/RESULTS.md" "$OUT/RESULTS.md" 2>/dev/null
  stamp "layer-train"
fi

if run_stage transformer; then
  timeout 280 python3 "$REPO/examples/train_transformer.py" --print-every 50 --out "$OUT/train_transformer_gpu.png" > "$OUT/train_transformer.log" 2>&1
  echo "transformer rc=$?"; tail -6 "$OUT/train_transformer.log"
  stamp "transformer"
fi

if run_stage decode; then
  # Few-row GEMMs against pre-quantized weights (the few-row kernel); JGA_DECODE_ARGS="--ms 1,16" narrows it.
  env -u XLA_PYTHON_CLIENT_PREALLOCATE timeout 560 python3 "$REPO/benchmarks/bench_decode.py" ${JGA_DECODE_ARGS:-} > "$OUT/decode.log" 2>&1
  echo "decode rc=$?"; tail -45 "$OUT/decode.log"
  stamp "decode"
fi

if run_stage quantize; then
  env -u XLA_PYTHON_CLIENT_PREALLOCATE timeout 280 python3 "$REPO/benchmarks/bench_quantize.py" --record > "$OUT/quantize.log" 2>&1
  echo "quantize rc=$?"; tail -25 "$OUT/quantize.log"
  stamp "quantize"
fi

if run_stage memcheck; then
  timeout 150 compute-sanitizer --tool memcheck python3 "$REPO/tests/sanitizer_cases.py" > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ok on|ERROR SUMMARY" "$OUT/memcheck.log"
  stamp "memcheck"
fi

if run_stage train; then
  timeout 70 python3 "$REPO/examples/train_mlp.py" --steps 40 --print-every 20 --out "$OUT/train_mlp_gpu.png" > "$OUT/train_small.log" 2>&1
  echo "train rc=$?"; tail -4 "$OUT/train_small.log"
  if [ "${JGA_BIG_TRAIN:-1}" = 1 ]; then
    timeout 60 python3 "$REPO/examples/train_mlp.py" --steps 30 --batch 4096 --hidden 2048 --print-every 30 --out "$OUT/train_big.png" > "$OUT/train_big.log" 2>&1
    echo "train big rc=$?"; tail -3 "$OUT/train_big.log"
  fi
fi
stamp "done"
