#!/usr/bin/env bash
# Same-call A/B through JAX (run from the repository root, on one GPU machine): this checkout (A)
# against another package tree (B), each built once for sm_90a, then installed in turn and timed
# with bench_gemm.py in the order A B A B, so that drift of the machine shows up in the table.
# Ratios between two device calls are not comparable (cuBLAS bf16 at 8192^3 read 735-806 TFLOP/s
# on different H200s); a harness A/B does not replace this (the harness and JAX disagreed once).
#   mkdir -p other/B && git archive BRANCH | tar -x -C other/B   # here; other/ travels untracked
#   benchmarks/ab_jax.sh other/B 8192x8192x8192,16384x8192x1024  # there
# Environment: JGA_AB_ROUNDS (default 2), JGA_AB_REPEATS (bench --repeats, default 5),
# JGA_AB_ARCHS (default 90a), JGA_AB_FORMAT (bench --format, default mxfp8_e4m3), JGA_AB_ARGS (more
# bench arguments, e.g. "--scan"); XLA_FLAGS reaches both sides. Small calls under lax.scan, say:
#   XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 JGA_AB_ARGS=--scan benchmarks/ab_jax.sh other/B 1024x1024x1024:20
set -uo pipefail
B=${1:?usage: benchmarks/ab_jax.sh B_TREE [SHAPES]}
SHAPES=${2:-8192x8192x8192,16384x8192x1024,2048x28672x8192,4096x4096x4096}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
REPO=$(pwd)
B=$(cd "$B" && pwd) || exit 1
install() {  # tree, build dir
  (cd "$1" && python3 -m pip install --no-build-isolation --no-deps -q -C build-dir="$2" \
    -C cmake.define.JAX_GEMM_AMAX_CUDA=ON -C cmake.define.JAX_GEMM_AMAX_CUDA_ARCHS="${JGA_AB_ARCHS:-90a}" . \
    > "$2.log" 2>&1) || { tail -40 "$2.log"; exit 1; }
}
cp "$REPO/benchmarks/bench_gemm.py" /tmp/ab_bench.py  # one benchmark for both trees
cd /tmp  # import the installed package, not a source tree
for round in $(seq "${JGA_AB_ROUNDS:-2}"); do
  for side in A B; do
    if [ $side = A ]; then install "$REPO" /tmp/ab-build-A; else install "$B" /tmp/ab-build-B; fi
    echo "== round $round, $side"
    timeout 200 python3 /tmp/ab_bench.py --shapes "$SHAPES" --repeats "${JGA_AB_REPEATS:-5}" --format "${JGA_AB_FORMAT:-mxfp8_e4m3}" ${JGA_AB_ARGS:-} | sed -n '/2MNK/,$p' | grep -E "^\| [0-9]|geometric"
  done
done
