#!/bin/bash
# Traced timing of one shape under several experiment flags, for two builds.
# Usage (repo root, device): trace.sh "FLAGS_A" "FLAGS_B" "EXPERIMENT FLAG SETS" [M N K tile]
ffi/cuda/sm90/harness/build.sh /tmp/ta -DJGA_SM90_TRACE -DJGA_SM90_EXPERIMENTS $1 > /tmp/ta.txt 2>&1 &
ffi/cuda/sm90/harness/build.sh /tmp/tb -DJGA_SM90_TRACE -DJGA_SM90_EXPERIMENTS $2 > /tmp/tb.txt 2>&1 &
wait
SHAPE=${4:-"8192 8192 8192 256"}
for x in a b; do
  [ -x /tmp/t$x/sm90_harness ] || { echo "build $x failed"; grep -m5 error /tmp/t$x/*.log; continue; }
  [ $x = a ] && echo "=== A: $1" || echo "=== B: $2"
  for f in $3; do timeout 60 /tmp/t$x/sm90_harness one $SHAPE $f 5; done
done
