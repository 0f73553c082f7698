"""Properties of the compiled CUDA kernels that no numerical test can see, read from the SASS.

sm_90a (Hopper): every GemmAmaxKernel must keep its WGMMAs asynchronous and use no local memory.
ptxas silently serializes WGMMAs it cannot prove safe (info C7511 "insufficient register
resources", C7517/C7518 "WG.DP in divergent path": a wait after every HGMMA), which halved the
kernel's speed once; the results stay right, so only the SASS shows it.

sm_100a (Blackwell): the kernels are compile-verified, no SM100 GPU runs in CI. These tests
inspect the built extension instead: its fat binary must hold an sm_100a cubin whose
SASS contains block-scaled tcgen05 MMAs (and, where the PTX is embedded, `tcgen05.mma ...
block_scale`). The numerical tests in test_gemm_amax.py are the same on every GPU, so they run
unchanged on a B200.

SASS forms (nvcc 13.0 / cuobjdump 13.x), established by compiling each PTX form alone:
  PTX tcgen05.mma.cta_group::1 ...                     SASS
  kind::f16 (no scales)                                UTCHMMA    gdesc, gdesc, tmem, tmem, idesc, pred
  kind::f8f6f4 (no scales)                             UTCQMMA    gdesc, gdesc, tmem, tmem, idesc, pred
  kind::mxf8f6f4.block_scale (MXFP8)                   UTCQMMA    gdesc, gdesc, tmem, tmem, idesc, tmem, pred
  kind::mxf4.block_scale.scale_vec::2X (MXFP4)         UTCOMMA    gdesc, gdesc, tmem, tmem, idesc, tmem, pred
  kind::mxf4nvf4.block_scale.scale_vec::4X (sfv 16)    UTCOMMA.4X gdesc, gdesc, tmem, tmem, idesc, tmem, pred
The block-scaled forms carry one more TMEM operand after the instruction descriptor (the scale
factors of B; those of A are the second TMEM operand).

Tools: `cuobjdump` and `nvdisasm` from PATH, $CUDA_HOME/bin, or the `nvidia-cuda-cuobjdump` and
`nvidia-cuda-nvdisasm` wheels (test extra). JGA_SM100_BINARY=<file> inspects another binary
(e.g. an object or static library of the sm100 kernels); JAX_GEMM_AMAX_REQUIRE_SM100=1 turns the
"built without sm_100a" skip into a failure (for CI jobs that build the CUDA backend).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REQUIRE_SM100 = os.environ.get("JAX_GEMM_AMAX_REQUIRE_SM100") == "1"

# One block-scaled UMMA: two smem descriptors, D and SFA in TMEM, the instruction descriptor,
# then SFB in TMEM.
_OPERAND = r"\s*{kind}\[[^\]]*\]"
BLOCK_SCALED_MMA = re.compile(
    r"\b(?P<op>UTC[QO]MMA(?:\.[0-9A-Z]+)*)\s+"
    + r",".join(_OPERAND.format(kind=k) for k in ("gdesc", "gdesc", "tmem", "tmem", "idesc", "tmem"))
)
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)


def _skip_or_fail(reason: str):
    if REQUIRE_SM100:
        pytest.fail(reason + " (JAX_GEMM_AMAX_REQUIRE_SM100=1)")
    pytest.skip(reason)


def _wheel_binary(dist: str, name: str) -> Path | None:
    """`name` from the bin/ folder of an installed NVIDIA wheel (nvidia/cu13/bin or nvidia/*/bin)."""
    try:
        files = importlib.metadata.files(dist) or []
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == name and f.parent.name == "bin":
            path = Path(d.locate_file(f))
            if path.is_file():
                return path
    return None


def _tool(name: str, dist: str, tmp_dir: Path) -> Path | None:
    found = shutil.which(name)
    if found:
        return Path(found)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / name).is_file():
            return Path(home) / "bin" / name
    path = _wheel_binary(dist, name)
    if path is None:
        return None
    if not os.access(path, os.X_OK):  # some installers drop the executable bit
        copy = tmp_dir / name
        shutil.copy2(path, copy)
        copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
        path = copy
    return path


@pytest.fixture(scope="module")
def tools(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuda-tools")
    cuobjdump = _tool("cuobjdump", "nvidia-cuda-cuobjdump", tmp)
    nvdisasm = _tool("nvdisasm", "nvidia-cuda-nvdisasm", tmp)
    if cuobjdump is None:
        _skip_or_fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (or put the CUDA toolkit on PATH)")
    env = dict(os.environ)
    if nvdisasm is not None:  # cuobjdump -sass runs nvdisasm from PATH
        env["PATH"] = str(nvdisasm.parent) + os.pathsep + env.get("PATH", "")
    return cuobjdump, nvdisasm, env


@pytest.fixture(scope="module")
def binary() -> Path:
    override = os.environ.get("JGA_SM100_BINARY")
    if override:
        return Path(override)
    import jax_gemm_amax  # noqa: F401  (loads the extension the way users do)
    from jax_gemm_amax import _ffi, _jax_gemm_amax

    if not _ffi.BUILT_WITH_CUDA:
        _skip_or_fail("jax_gemm_amax was built without the CUDA backend (no nvcc at build time)")
    return Path(_jax_gemm_amax.__file__)


def _run(cmd, env=None) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stderr}{out.stdout}")
    return out.stdout


@pytest.fixture(scope="module")
def sm100_elf(tools, binary) -> list[str]:
    cuobjdump, _, env = tools
    listing = _run([cuobjdump, "--list-elf", binary], env)
    elves = [line.split(":", 1)[1].strip() for line in listing.splitlines() if "sm_100a" in line]
    if not elves:
        _skip_or_fail(f"{binary.name} holds no sm_100a cubin (built without 100a in JAX_GEMM_AMAX_CUDA_ARCHS?)")
    return elves


def test_sm100a_cubin_present(sm100_elf):
    assert all(e.endswith(".cubin") for e in sm100_elf), sm100_elf


def _sass_by_function(sass: str) -> dict[str, str]:
    parts = FUNCTION.split(sass)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_sm100a_sass_has_block_scaled_tcgen05_mma(tools, binary, sm100_elf):
    cuobjdump, nvdisasm, env = tools
    if nvdisasm is None:
        _skip_or_fail("nvdisasm not found (cuobjdump -sass needs it): pip install nvidia-cuda-nvdisasm")
    sass = _run([cuobjdump, "-sass", "-arch", "sm_100a", binary], env)
    functions = _sass_by_function(sass)
    assert functions, "no SASS functions in the sm_100a cubin"

    kernels: dict[str, set[str]] = {}
    for name, body in functions.items():
        ops = {m.group("op") for m in BLOCK_SCALED_MMA.finditer(body)}
        if ops:
            kernels[name] = ops
    found = set().union(*kernels.values()) if kernels else set()
    summary = {name[:80]: sorted(ops) for name, ops in kernels.items()}

    # MXFP8 (e4m3/e5m2 x e8m0, sfv 32): kind::mxf8f6f4.block_scale
    assert "UTCQMMA" in found, f"no block-scaled UTCQMMA (MXFP8) in the sm_100a SASS: {summary}"
    # MXFP4 (e8m0, sfv 32): kind::mxf4.block_scale.scale_vec::2X
    assert "UTCOMMA" in found, f"no block-scaled UTCOMMA (MXFP4, scale_vec::2X) in the sm_100a SASS: {summary}"
    # NVFP4 (e4m3, sfv 16) and FP4 with e8m0/sfv 16: kind::mxf4nvf4.block_scale.scale_vec::4X
    assert "UTCOMMA.4X" in found, f"no block-scaled UTCOMMA.4X (NVFP4, scale_vec::4X) in the sm_100a SASS: {summary}"
    # One GEMM kernel per instantiated configuration (sm100_dispatch.cu lists six).
    assert len(kernels) >= 6, f"expected >= 6 block-scaled GEMM kernels, found {len(kernels)}: {summary}"
    # The scale factors reach tensor memory through tcgen05.cp (UTCCP) in every one of them.
    for name in kernels:
        assert "UTCCP" in functions[name], f"{name[:80]}: no UTCCP (scale-factor copy to TMEM)"


def test_sm100a_kernels_do_not_spill(tools, binary, sm100_elf):
    cuobjdump, _, env = tools
    usage = _run([cuobjdump, "-res-usage", "-arch", "sm_100a", binary], env)
    entries = re.findall(r"Function (\S+):\s*\n?\s*(REG:\d+ STACK:(\d+) SHARED:\d+ LOCAL:(\d+)[^\n]*)", usage)
    gemm = [(name, line, int(stack), int(local)) for name, line, stack, local in entries if "GemmUniversal" in name]
    assert gemm, f"no GemmUniversal kernels in the sm_100a resource usage:\n{usage[:2000]}"
    for name, line, stack, local in gemm:
        assert stack == 0 and local == 0, f"{name[:80]}: local memory use (spills): {line}"


def test_sm100a_ptx_has_tcgen05_block_scale(tools, binary, sm100_elf):
    cuobjdump, _, env = tools
    listing = _run([cuobjdump, "--list-ptx", binary], env)
    if "sm_100a" not in listing and "compute_100a" not in listing:
        pytest.skip(f"{binary.name} embeds no compute_100a PTX (SASS only); the SASS test covers the kernels")
    ptx = _run([cuobjdump, "-ptx", "-arch", "sm_100a", binary], env)
    # PTX spells the scale-vector size either .scale_vec::NX or (newer ISA) .blockNN.
    pattern = r"tcgen05\.mma\.cta_group::[12]\.kind::(\w+)\.block_scale(?:\.(scale_vec::\w+|block\d+))?"
    kinds = set(re.findall(pattern, ptx))
    assert any(k == "mxf8f6f4" for k, _ in kinds), f"no tcgen05.mma.kind::mxf8f6f4.block_scale in the PTX: {kinds}"
    assert any(k == "mxf4" and v in ("", "scale_vec::2X", "block32") for k, v in kinds), f"no kind::mxf4 2X: {kinds}"
    assert any(k == "mxf4nvf4" and v in ("scale_vec::4X", "block16") for k, v in kinds), f"no mxf4nvf4 4X: {kinds}"


# ---------------------------------------------------------------------------------------------
# sm_90a


@pytest.fixture(scope="module")
def sm90_kernels(tools, binary) -> dict[str, str]:
    """SASS of each sm_90a GemmAmaxKernel instantiation (5 variants x (2 tile heights x split-K or not,
    + tile 256 with pre-converted A, B or both, + tile 256 split-K with pre-converted A, + the three
    with A' again for weight-only problems))."""
    cuobjdump, nvdisasm, env = tools
    listing = _run([cuobjdump, "--list-elf", binary], env)
    if "sm_90a" not in listing:
        _skip_or_fail(f"{binary.name} holds no sm_90a cubin (built without 90a in JAX_GEMM_AMAX_CUDA_ARCHS?)")
    if nvdisasm is None:
        _skip_or_fail("nvdisasm not found (cuobjdump -sass needs it): pip install nvidia-cuda-nvdisasm")
    sass = _run([cuobjdump, "-sass", "-arch", "sm_90a", binary], env)
    kernels = {name: body for name, body in _sass_by_function(sass).items() if "GemmAmaxKernel" in name}
    assert len(kernels) == 55, f"expected 55 sm_90a GemmAmaxKernel instantiations, found {sorted(kernels)}"
    return kernels


def test_sm90a_wgmmas_are_pipelined(sm90_kernels):
    for name, body in sm90_kernels.items():
        hgmma = len(re.findall(r"\bHGMMA\.64x128x16\.F32\.BF16\b", body))
        waits = len(re.findall(r"\bWARPGROUP\.DEPBAR\b", body))
        assert hgmma >= 8, f"{name[:60]}: {hgmma} bf16 HGMMAs"
        # Pipelined: one wait per group of 4 HGMMAs (plus the drain); serialized: one per HGMMA.
        assert 2 * waits < hgmma, f"{name[:60]}: {waits} warpgroup waits for {hgmma} HGMMAs: serialized WGMMAs"


def test_sm90a_kernels_use_no_local_memory(sm90_kernels):
    for name, body in sm90_kernels.items():
        spills = re.findall(r"\b(?:LDL|STL)(?:\.[0-9A-Z]+)*\b", body)
        assert not spills, f"{name[:60]}: {len(spills)} local-memory instructions (register spills)"


# ---------------------------------------------------------------------------------------------
# The few-row kernel (ffi/cuda/skinny), built for every architecture of the build.

# 4 operand formats x token-tile widths: 3 for a block-scaled A (up to 32 rows), 4 for float16 and bfloat16.
SKINNY_KERNELS = 4 * (3 + 4 + 4)


def _skinny_a_kind(name: str) -> int:
    """The A-kind template argument of a mangled SkinnyKernel<V, A, MT> (0 scaled, 1 f16, 2 bf16)."""
    m = re.search(r"SkinnyKernelILi(\d)ELi(\d)ELi(\d)E", name)
    assert m, f"unexpected SkinnyKernel name {name}"
    return int(m[2])


@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def skinny_kernels(request, tools, binary) -> dict[str, str]:
    cuobjdump, nvdisasm, env = tools
    arch = request.param
    listing = _run([cuobjdump, "--list-elf", binary], env)
    if arch not in listing:
        if arch == "sm_100a":
            _skip_or_fail(f"{binary.name} holds no sm_100a cubin (built without 100a in JAX_GEMM_AMAX_CUDA_ARCHS?)")
        pytest.skip(f"{binary.name} holds no {arch} cubin")
    if nvdisasm is None:
        _skip_or_fail("nvdisasm not found (cuobjdump -sass needs it): pip install nvidia-cuda-nvdisasm")
    sass = _run([cuobjdump, "-sass", "-arch", arch, binary], env)
    kernels = {name: body for name, body in _sass_by_function(sass).items() if "SkinnyKernel" in name}
    assert len(kernels) == SKINNY_KERNELS, (
        f"expected {SKINNY_KERNELS} {arch} SkinnyKernel instantiations, found {sorted(kernels)}"
    )
    return kernels


def test_skinny_kernels_use_no_local_memory(skinny_kernels):
    for name, body in skinny_kernels.items():
        spills = re.findall(r"\b(?:LDL|STL)(?:\.[0-9A-Z]+)*\b", body)
        assert not spills, f"{name[:60]}: {len(spills)} local-memory instructions (register spills)"


# One SASS instruction of a cuobjdump listing: opcode and operands.
SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?(?P<op>[A-Z][A-Z0-9_.]*)\s+(?P<args>[^;]*);")


def _unwritten_uniform_operands(body: str) -> list[str]:
    """Instructions whose memory operand (a memory descriptor desc[URn], 64 bits, or a uniform
    register in an address) reads a uniform register that no instruction of the function writes
    (a uniform register as the first operand is written; .64 and .128 forms write 2 and 4)."""
    written: set[int] = set()
    uses: list[tuple[set[int], str]] = []
    for m in SASS_INSTRUCTION.finditer(body):
        op, args = m["op"], m["args"]
        first = re.fullmatch(r"UR(\d+)", args.split(",")[0].strip())
        if first:
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            written.update(range(int(first[1]), int(first[1]) + width))
        read: set[int] = set()
        for r in re.findall(r"desc\[UR(\d+)\]", args):
            read.update((int(r), int(r) + 1))
        for address in re.findall(r"(?<!desc)\[([^\]]*)\]", args):
            read.update(int(r) for r in re.findall(r"\bUR(\d+)\b", address))
        if read:
            uses.append((read, f"{op} {args.strip()}"))
    return [text for read, text in uses if not read <= written]


def test_skinny_kernels_address_memory_through_written_registers(skinny_kernels):
    # ptxas 13.0 compiles cp.async.L2::cache_hint with a createpolicy descriptor into LDGSTS whose
    # descriptor and shared offset are uniform registers nothing writes (sm_90a: the MXFP4 kernel
    # for 8 tokens; sm_100a: every kernel); the GPU raises an illegal instruction on them.
    for name, body in skinny_kernels.items():
        bad = _unwritten_uniform_operands(body)
        assert not bad, f"{name[:60]}: {len(bad)} memory operands in unwritten uniform registers, e.g. {bad[0]}"


def test_skinny_kernels_stream_b_into_tensor_core_mmas(skinny_kernels):
    for name, body in skinny_kernels.items():
        if _skinny_a_kind(name) == 2:  # bfloat16 activations: the bf16 MMA only
            assert re.search(r"\bHMMA\.16816\.F32\.BF16\b", body), f"{name[:60]}: no bf16 m16n8k16 HMMA"
            assert not re.search(r"\bHMMA\.16816\.F32(?!\.BF16)\b", body), f"{name[:60]}: an f16 HMMA"
        else:
            assert re.search(r"\bHMMA\.16816\.F32(?!\.BF16)\b", body), f"{name[:60]}: no f16 m16n8k16 HMMA"
        assert re.search(r"\bLDSM\.16\.M88\.4\b", body), f"{name[:60]}: B not read with ldmatrix.x4"
        assert re.search(r"\bLDGSTS\b", body), f"{name[:60]}: no cp.async copies"


# The quantize kernels (ffi/cuda/quantize): arch-neutral, built for every architecture


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_quantize_kernels_use_no_local_memory(tools, binary, arch):
    """4 formats x 3 input dtypes x (rows, columns, pair) kernels per architecture, none of them
    with local memory (a spill would cost their memory-bound loops bandwidth)."""
    cuobjdump, nvdisasm, env = tools
    if arch not in _run([cuobjdump, "--list-elf", binary], env):
        _skip_or_fail(f"{binary.name} holds no {arch} cubin")
    if nvdisasm is None:
        _skip_or_fail("nvdisasm not found (cuobjdump -sass needs it): pip install nvidia-cuda-nvdisasm")
    sass = _run([cuobjdump, "-sass", "-arch", arch, binary], env)
    kernels = {
        name: body
        for name, body in _sass_by_function(sass).items()
        if "8quantize" in name and any(k in name for k in ("RowKernel", "TileKernel", "StripKernel"))
    }
    assert len(kernels) == 36, f"expected 36 quantize kernels for {arch}, found {sorted(kernels)}"
    for name, body in kernels.items():
        spills = re.findall(r"\b(?:LDL|STL)(?:\.[0-9A-Z]+)*\b", body)
        assert not spills, f"{arch} {name[:70]}: {len(spills)} local-memory instructions"
