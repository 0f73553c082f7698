#!/bin/bash
# Timing experiments + ncu summary for one shape. Run from the repo root on the device.
# Usage: ncu_run.sh "FLAGS..." [ncu flags list]
B=/tmp/b
ffi/cuda/sm90/harness/build.sh $B > /tmp/build.txt 2>&1 || { tail -30 /tmp/build.txt; exit 1; }
for f in $1; do
  for t in 256 128; do $B/sm90_harness one 8192 8192 8192 $t $f 10; done
done
for f in $2; do
  ncu --clock-control none -k regex:GemmAmax --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats \
    --metrics lts__t_sectors_op_read.sum.per_second,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_membar,smsp__average_warp_latency_issue_stalled_sleeping,smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_lg_throttle,smsp__average_warp_latency_issue_stalled_dispatch_stall,smsp__average_warp_latency_issue_stalled_not_selected,smsp__average_warp_latency_issue_stalled_selected,smsp__average_warp_latency_issue_stalled_branch_resolving,smsp__average_warp_latency_issue_stalled_no_instruction,smsp__average_warp_latency_issue_stalled_drain,smsp__average_warp_latency_issue_stalled_misc,smsp__average_warp_latency_issue_stalled_tex_throttle,smsp__average_warp_latency_issue_stalled_imc_miss \
    $B/sm90_harness one 8192 8192 8192 256 $f 3 2>&1 | grep -v "^==PROF==" | grep -E "^ +[a-zA-Z]" | grep -v "^          " > $OUT/ncu_$f.txt
done
