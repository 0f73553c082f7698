"""Loads the compiled extension and registers its FFI targets with XLA."""

from __future__ import annotations

import jax

try:
    from . import _jax_gemm_amax as _ext
except ImportError as e:  # pragma: no cover - depends on how the package is imported
    raise ImportError(
        "jax_gemm_amax: the compiled extension _jax_gemm_amax is missing. Install the package "
        "(`pip install .`) and import it from the installed location, not from the source tree "
        "(run the tests with `pytest`, not `python -m pytest`, from the repository root)."
    ) from e

CPU_TARGET = "jax_gemm_amax_cpu"
CUDA_TARGET = "jax_gemm_amax_cuda"

BUILT_WITH_CUDA: bool = bool(_ext.built_with_cuda)

for _name, _capsule in _ext.cpu_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
for _name, _capsule in _ext.cuda_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")
