#!/bin/bash
# Builds the SM90 kernel benchmarks (sm90_bench.cu). Usage, from the repository root:
#   benchmarks/sm90_harness/build.sh OUTDIR [extra nvcc flags...]   (-DJGA_WITH_CUBLAS: cuBLAS bf16 too)
# SRC=<dir> builds the kernel from another copy of ffi/ with the same host API (e.g. a branch's,
# exported with `git archive BRANCH ffi | tar -x -C other/`, then SRC=other/ffi), so that two
# versions of the kernel can be timed in one device call (compare.sh); the benchmark itself always
# comes from this tree.
set -e
SRC=${SRC:-ffi}
OUT=${1:?usage: build.sh OUTDIR [nvcc flags...]}; shift
mkdir -p "$OUT"
NVCC=${NVCC:-nvcc}
FLAGS="-std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I $SRC -I . $*"
pids=()
for f in "$SRC"/cuda/sm90/*.cu benchmarks/sm90_harness/sm90_bench.cu; do
  s=$(basename "$f" .cu)
  $NVCC $FLAGS -Xptxas -v -c "$f" -o "$OUT/$s.o" > "$OUT/$s.log" 2>&1 &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc = 0 ] || { grep -h -m5 error "$OUT"/*.log; exit 1; }
LIBS=""
if echo "$*" | grep -q JGA_WITH_CUBLAS; then LIBS="-lcublas"; fi
$NVCC -gencode=arch=compute_90a,code=sm_90a -o "$OUT/sm90_bench" "$OUT"/*.o $LIBS
grep -h -E "spill|Used" "$OUT"/*.log | sort | uniq -c
