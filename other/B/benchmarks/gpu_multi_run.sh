#!/usr/bin/env bash
# One call on a machine with 2+ GPUs (from the repository root): build and install for sm_90a; the
# sharding tests on a GPU mesh, once as 2x1 and once as 1x2 so that M, N, K and L are each split
# over a real device, and on 8 virtual CPU devices of the machine's jax; the Flax layer sharded over
# 2 GPUs; the weak-scaling benchmark. Logs and the updated RESULTS.md land in $OUT.
#   benchmarks/gpu_multi_run.sh
set -uo pipefail
# NVLink multicast stays off: a program that uses it can take the host's shared GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CMAKE_BUILD_PARALLEL_LEVEL=32
OUT=${OUT:-/tmp/jga-out}
mkdir -p "$OUT"
REPO=$(pwd)
t0=$(date +%s)
stamp() { echo "--- $1 at +$(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -6

python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=/tmp/jga-build \
  -C cmake.define.JAX_GEMM_AMAX_CUDA=ON -C cmake.define.JAX_GEMM_AMAX_CUDA_ARCHS=90a . \
  > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
stamp "built and installed"

cd /tmp  # import the installed package, not the source tree
python3 -c "import jax; print(jax.__version__, jax.devices())"
for mesh in 2x1 1x2; do
  JGA_TEST_MESH=$mesh timeout 150 python3 -m pytest -q -p no:cacheprovider -rs "$REPO/tests/test_sharding.py" \
    > "$OUT/pytest_sharding_$mesh.log" 2>&1
  echo "sharding tests, mesh $mesh: rc=$?"; tail -3 "$OUT/pytest_sharding_$mesh.log"
done
JAX_PLATFORMS=cpu timeout 120 python3 -m pytest -q -p no:cacheprovider "$REPO/tests/test_sharding.py" \
  > "$OUT/pytest_sharding_cpu.log" 2>&1
echo "sharding tests, 8 CPU devices of this jax: rc=$?"; tail -2 "$OUT/pytest_sharding_cpu.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs "$REPO/tests/test_nn.py" -k sharded > "$OUT/pytest_nn.log" 2>&1
echo "layer tests: rc=$?"; tail -3 "$OUT/pytest_nn.log"
stamp "tests"

timeout 200 python3 "$REPO/benchmarks/bench_sharded.py" --record ${JGA_BENCH_ARGS:-} > "$OUT/bench_sharded.log" 2>&1
echo "bench rc=$?"; tail -8 "$OUT/bench_sharded.log"
cp "$REPO/benchmarks/RESULTS.md" "$OUT/RESULTS.md" 2>/dev/null
stamp "done"
