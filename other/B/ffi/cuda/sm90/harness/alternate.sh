#!/bin/bash
# One device call that checks the working tree's kernel and times it against another copy of the
# kernel sources, the two builds alternating (the GPU's drift hits both alike).
# Before it, on the development machine:
#   mkdir -p other/main && git archive main ffi | tar -x -C other/main      # then carry other/main
# On the device, from the repository root:
#   ffi/cuda/sm90/harness/alternate.sh other/main/ffi ROUNDS "M N K TILE FLAGS PRE" ...
# Builds /tmp/bn (working tree) and /tmp/bo (the other sources), both with -DJGA_SM90_EXPERIMENTS;
# runs the harness test and memcheck (small) on /tmp/bn; then, ROUNDS times, each configuration
# with `one M N K TILE FLAGS 20 PRE` on both builds (TILE 0 and PRE -1: the planner's choice).
OTHER=${1:?usage: alternate.sh OTHER_FFI_DIR ROUNDS "M N K TILE FLAGS PRE"...}; ROUNDS=${2:?}; shift 2
CONFIGS=("$@")
t0=$(date +%s)
ffi/cuda/sm90/harness/build.sh /tmp/bn -DJGA_SM90_EXPERIMENTS > /tmp/bn.log 2>&1 &
SRC=$OTHER ffi/cuda/sm90/harness/build.sh /tmp/bo -DJGA_SM90_EXPERIMENTS > /tmp/bo.log 2>&1 &
wait
for x in n o; do [ -x /tmp/b$x/sm90_harness ] || { echo "build $x failed"; grep -m10 -h error /tmp/b$x/*.log; tail -20 /tmp/b$x.log; exit 1; }; done
echo "builds: $(( $(date +%s) - t0 )) s"; grep -h "spill" /tmp/bn.log | sort | uniq -c
timeout 150 /tmp/bn/sm90_harness test > /tmp/test_n.txt 2>&1; echo "test rc=$?"; grep -E "FAIL|SUMMARY" /tmp/test_n.txt | head -20
timeout 150 compute-sanitizer --tool memcheck /tmp/bn/sm90_harness small 2>&1 | tail -2
for round in $(seq $ROUNDS); do
  for c in "${CONFIGS[@]}"; do
    read -r m n k tile flags pre <<< "$c"
    for x in n o; do echo "b$x $(timeout 30 /tmp/b$x/sm90_harness one $m $n $k $tile $flags 20 $pre | grep -o 'one .* TF/s')"; done
  done
done
echo "total $(( $(date +%s) - t0 )) s"
