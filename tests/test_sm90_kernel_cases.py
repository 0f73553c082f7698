"""The SM90 kernel's own test cases (tests/sm90/kernel_cases.cu), below JAX: every operand format
with every C dtype, odd shapes, both tile heights, split-K and tail splits, pre-converted operands
and the ping-pong kernel, NaN scales, the amax reset, skip_amax, and two call sites replayed as
CUDA graphs at once, ~100 launches per format, each checked against a float64 host reference.

The program is built on demand with nvcc from ffi/cuda/sm90 (minutes: the kernels are large), or
linked against the kernels of a build: JGA_SM90_KERNEL_LIB=<libjga_cuda_sm90.a> (the extension's
static library in its CMake build directory, e.g. /tmp/jga-build/libjga_cuda_sm90.a after
benchmarks/gpu_run.sh's install), which also tests exactly what the extension ships. Needs an
sm_90 GPU (skips without one, or without nvcc); test_kernel_cases_memcheck also compute-sanitizer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL_SOURCES = REPO / "ffi" / "cuda" / "sm90"
CASES_SOURCE = REPO / "tests" / "sm90" / "kernel_cases.cu"
NVCC_FLAGS = ["-std=c++17", "-O3", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a"]
# The case groups of `kernel_cases test GROUP`: the five operand formats (kCombos), two call sites.
GROUPS = {"e4m3": "0", "e5m2": "1", "mxfp4": "2", "e2m1-e8m0-16": "3", "nvfp4": "4", "call-sites": "sites"}
SUMMARY = re.compile(r"^SUMMARY: (\d+) passed, (\d+) failed$", re.MULTILINE)


def _cuda_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / name).is_file():
            return str(Path(home) / "bin" / name)
    return None


def _has_sm90_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(line.strip() == "9.0" for line in out.stdout.splitlines())


def _nvcc(nvcc: str, args: list[str]) -> None:
    out = subprocess.run(
        [nvcc, *NVCC_FLAGS, f"-I{REPO / 'ffi'}", f"-I{REPO}", *args], capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        raise AssertionError(
            f"nvcc {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-4000:]}{out.stdout[-2000:]}"
        )


@pytest.fixture(scope="module")
def kernel_cases(tmp_path_factory) -> Path:
    if not _has_sm90_gpu():
        pytest.skip("needs an sm_90 (Hopper) GPU")
    nvcc = _cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    out = tmp_path_factory.mktemp("sm90-kernel-cases")
    library = os.environ.get("JGA_SM90_KERNEL_LIB")
    sources = [CASES_SOURCE] + ([] if library else sorted(KERNEL_SOURCES.glob("*.cu")))
    objects = [out / (src.stem + ".o") for src in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for job in [pool.submit(_nvcc, nvcc, ["-c", str(s), "-o", str(o)]) for s, o in zip(sources, objects)]:
            job.result()
    binary = out / "kernel_cases"
    _nvcc(nvcc, ["-o", str(binary), *map(str, objects), *([library] if library else [])])
    return binary


def _run(cmd: list[str], timeout: int) -> tuple[int, str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("group", list(GROUPS))
def test_kernel_cases(kernel_cases, group):
    rc, log = _run([str(kernel_cases), "test", GROUPS[group]], timeout=600)
    failed = [line for line in log.splitlines() if "[FAIL]" in line or "first bad" in line]
    summary = SUMMARY.search(log)
    assert rc == 0 and summary and not failed, f"rc={rc}\n" + "\n".join(failed or log.splitlines()[-40:])
    assert int(summary.group(1)) > 0 and int(summary.group(2)) == 0, log[-4000:]


def test_kernel_cases_memcheck(kernel_cases):
    sanitizer = _cuda_tool("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    rc, log = _run([sanitizer, "--tool", "memcheck", "--error-exitcode", "99", str(kernel_cases), "small"], timeout=600)
    assert rc == 0 and "ERROR SUMMARY: 0 errors" in log, log[-4000:]
