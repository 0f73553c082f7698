#!/bin/bash
# Builds the SM90 harness. Usage: build.sh OUTDIR [extra nvcc flags...]
# Run from the repository root. SRC=<dir> builds the kernel from another copy of ffi/ (e.g. a
# branch's, exported with `git archive BRANCH ffi | tar -x -C other/`, then SRC=other/ffi), so two
# versions can be compared in one device call; the harness itself always comes from ./ffi.
set -e
SRC=${SRC:-ffi}
OUT=${1:-build_sm90}; shift || true
mkdir -p "$OUT"
NVCC=${NVCC:-nvcc}
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I $SRC $*"
SRCS="gemm_amax_sm90 sm90_variant0 sm90_variant1 sm90_variant2 sm90_variant3 sm90_variant4"
pids=()
for s in $SRCS; do
  ( start=$(date +%s%N); $NVCC $FLAGS -Xptxas -v -c $SRC/cuda/sm90/$s.cu -o "$OUT/$s.o" > "$OUT/$s.log" 2>&1; rc=$?;
    end=$(date +%s%N); echo "$s: rc=$rc $(( (end - start) / 1000000 )) ms (parallel build)" >> "$OUT/times.txt"; exit $rc ) &
  pids+=($!)
done
$NVCC $FLAGS -c ffi/cuda/sm90/harness/sm90_harness.cu -o "$OUT/sm90_harness.o" > "$OUT/harness.log" 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait $p; done
LIBS=""
if echo "$*" | grep -q JGA_WITH_CUBLAS; then LIBS="-lcublas"; fi
$NVCC -gencode=arch=compute_90a,code=sm_90a -o "$OUT/sm90_harness" "$OUT"/*.o $LIBS
cat "$OUT/times.txt"
grep -h -E "spill|Used|warn" "$OUT"/*.log | sort | uniq -c
