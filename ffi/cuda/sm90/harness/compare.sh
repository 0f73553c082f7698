#!/bin/bash
# Builds the harness with two sets of extra nvcc flags (in parallel) and compares them:
# test (first build only) and bench. (Timing experiments: trace.sh.) Usage (repo root, on the device):
#   compare.sh "FLAGS_A" "FLAGS_B" [bench iters]
ITERS=${3:-10}
OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
ffi/cuda/sm90/harness/build.sh /tmp/ba -DJGA_WITH_CUBLAS $1 > $OUTD/build_a.txt 2>&1 &
ffi/cuda/sm90/harness/build.sh /tmp/bb $2 > $OUTD/build_b.txt 2>&1 &
wait
for x in a b; do [ -x /tmp/b$x/sm90_harness ] || { echo "build $x failed"; tail -30 $OUTD/build_$x.txt; cat /tmp/b$x/*.log | grep -m5 error; exit 1; }; done
grep -h "spill" $OUTD/build_a.txt | head -3
/tmp/ba/sm90_harness test > $OUTD/test_a.txt 2>&1; echo "test A rc=$?"; grep -E "FAIL|SUMMARY" $OUTD/test_a.txt | head -20
echo "== A: $1"; /tmp/ba/sm90_harness bench $ITERS 2>&1 | tee $OUTD/bench_a.txt
echo "== B: $2"; /tmp/bb/sm90_harness bench $ITERS 2>&1 | tee $OUTD/bench_b.txt | cut -c1-60
