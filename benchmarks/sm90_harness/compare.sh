#!/bin/bash
# Times two builds of the SM90 kernel in one device call: builds both (in parallel), then runs
# `sm90_bench bench` on each in turn. Usage, from the repository root, on the GPU machine:
#   benchmarks/sm90_harness/compare.sh "FLAGS_A" "FLAGS_B" [bench iters]
# SRC_A / SRC_B pick the kernel sources of each build (default ffi; see build.sh's SRC), e.g. the
# working tree against a branch exported to other/ffi:  SRC_B=other/ffi compare.sh "" ""
# Build A has cuBLAS bf16 as a reference column. Logs land in $OUT (default /tmp/out). For the
# library as users call it (through JAX), benchmarks/ab_jax.sh.
ITERS=${3:-10}
OUTD=${OUT:-/tmp/out}; mkdir -p "$OUTD"
H=benchmarks/sm90_harness
SRC=${SRC_A:-ffi} $H/build.sh /tmp/ba -DJGA_WITH_CUBLAS $1 > "$OUTD/build_a.txt" 2>&1 &
SRC=${SRC_B:-ffi} $H/build.sh /tmp/bb $2 > "$OUTD/build_b.txt" 2>&1 &
wait
for x in a b; do [ -x /tmp/b$x/sm90_bench ] || { echo "build $x failed"; tail -30 "$OUTD/build_$x.txt"; exit 1; }; done
grep -h "spill" "$OUTD/build_a.txt" | head -3
echo "== A: $1"; timeout 300 /tmp/ba/sm90_bench bench "$ITERS" 2>&1 | tee "$OUTD/bench_a.txt"
echo "== B: $2"; timeout 300 /tmp/bb/sm90_bench bench "$ITERS" 2>&1 | tee "$OUTD/bench_b.txt"
