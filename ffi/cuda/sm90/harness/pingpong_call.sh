#!/bin/bash
# The device call that decides branch pingpong's next step (NOTES, session 19; RESULTS.md
# "Ping-pong consumers"). From the repository root, on the device, the branch checked out:
#   ffi/cuda/sm90/harness/pingpong_call.sh
# Builds the harness with -DJGA_SM90_EXPERIMENTS (~35 s), checks every A'B' launch as ping-pong
# (harness test and memcheck with JGA_EXPERIMENT_FLAGS=32768), then times in one process, per
# shape: the planner's plan, A'B' tile 256 as ping-pong (flag 32768) and cooperative, and both
# without the epilogue (flag 16), alternating.
t0=$(date +%s)
ffi/cuda/sm90/harness/build.sh /tmp/bx -DJGA_SM90_EXPERIMENTS > /tmp/bx.log 2>&1 || { tail -30 /tmp/bx.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"; grep -h spill /tmp/bx.log | sort | uniq -c
JGA_EXPERIMENT_FLAGS=32768 timeout 120 /tmp/bx/sm90_harness test > /tmp/test_pp.txt 2>&1
echo "test (ping-pong) rc=$?"; grep -E "FAIL|SUMMARY" /tmp/test_pp.txt | head -12
JGA_EXPERIMENT_FLAGS=32768 timeout 90 compute-sanitizer --tool memcheck /tmp/bx/sm90_harness small 2>&1 | tail -2
for s in "16384 8192 1024" "8192 8192 1024" "4096 4096 4096" "8192 8192 8192" "2048 28672 8192" "4096 4096 2048" "8192 8192 4096"; do
  set -- $s
  timeout 60 /tmp/bx/sm90_harness turns $1 $2 $3 30 0:0:-1:-1:0 256:1:3:-1:32768 256:1:3:-1:0 256:1:3:-1:32768 256:1:3:-1:0 \
    256:1:3:-1:32784 256:1:3:-1:16
done
echo "total $(( $(date +%s) - t0 )) s"
