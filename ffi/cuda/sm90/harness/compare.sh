#!/bin/bash
# Builds the harness twice (in parallel) and compares the builds: test and bench of each.
# Usage (repo root, on the device):
#   compare.sh "FLAGS_A" "FLAGS_B" [bench iters]
# SRC_A / SRC_B pick the kernel sources of each build (default ffi; see build.sh's SRC), e.g. the
# working tree against a branch exported to other/ffi:  SRC_B=other/ffi compare.sh "" ""
ITERS=${3:-10}
OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
SRC=${SRC_A:-ffi} ffi/cuda/sm90/harness/build.sh /tmp/ba -DJGA_WITH_CUBLAS $1 > $OUTD/build_a.txt 2>&1 &
SRC=${SRC_B:-ffi} ffi/cuda/sm90/harness/build.sh /tmp/bb $2 > $OUTD/build_b.txt 2>&1 &
wait
for x in a b; do [ -x /tmp/b$x/sm90_harness ] || { echo "build $x failed"; tail -30 $OUTD/build_$x.txt; cat /tmp/b$x/*.log | grep -m5 error; exit 1; }; done
grep -h "spill" $OUTD/build_a.txt | head -3
for x in a b; do
  timeout 120 /tmp/b$x/sm90_harness test > $OUTD/test_$x.txt 2>&1; echo "test $x rc=$?"; grep -E "FAIL|SUMMARY" $OUTD/test_$x.txt | head -20
done
echo "== A: $1"; timeout 300 /tmp/ba/sm90_harness bench $ITERS 2>&1 | tee $OUTD/bench_a.txt
echo "== B: $2"; timeout 300 /tmp/bb/sm90_harness bench $ITERS 2>&1 | tee $OUTD/bench_b.txt | cut -c1-60
