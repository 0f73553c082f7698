#!/bin/bash
# One full device session: build, SASS check, tests, sanitizer, benchmark. Logs under $OUT.
# Usage (repo root): ffi/cuda/sm90/harness/device_run.sh [test|bench|all] [bench iters]
MODE=${1:-all}; ITERS=${2:-30}
OUTD=${OUT:-/tmp/out}; mkdir -p $OUTD
B=/tmp/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
ffi/cuda/sm90/harness/build.sh $B -DJGA_WITH_CUBLAS 2>&1 | tee $OUTD/build.txt | tail -12
[ -x $B/sm90_harness ] || { cat $B/*.log | head -50; exit 1; }
echo "HGMMA count: $(cuobjdump --dump-sass $B/sm90_variant0.o | grep -c HGMMA)  (v0), QGMMA: $(cuobjdump --dump-sass $B/sm90_variant0.o | grep -c QGMMA)"
if [ $MODE = test -o $MODE = all ]; then
  timeout 120 $B/sm90_harness test > $OUTD/test.txt 2>&1; echo "test rc=$?"
  grep -E "FAIL|SUMMARY" $OUTD/test.txt | head -40
  timeout 300 compute-sanitizer --tool memcheck $B/sm90_harness small > $OUTD/sanitizer.txt 2>&1; echo "sanitizer rc=$?"
  tail -4 $OUTD/sanitizer.txt
fi
if [ $MODE = bench -o $MODE = all ]; then
  timeout 300 $B/sm90_harness bench $ITERS 2>&1 | tee $OUTD/bench.txt
fi
