"""jax_gemm_amax: block-scaled low-precision GEMM (MXFP8, MXFP4, NVFP4) with a fused global amax."""

from . import layout
from .cudnn_compat import GemmAmaxSm100, TupleDict, gemm_amax_jax_sm100, gemm_amax_wrapper_sm100
from .formats import FORMATS, pmax_amax
from .layout import (
    logical_from_physical,
    physical_from_logical,
    physical_from_plain,
    plain_from_physical,
    scale_shape,
)
from .ops import GemmAmaxResult, gemm_amax, reference_gemm_amax
from .primitives.gemm_amax import gemm_amax_p
from .quantize import dequantize, quantize, quantize_pair

__version__ = "0.1.0"

__all__ = [
    "FORMATS",
    "GemmAmaxResult",
    "GemmAmaxSm100",
    "TupleDict",
    "dequantize",
    "gemm_amax",
    "gemm_amax_jax_sm100",
    "gemm_amax_p",
    "gemm_amax_wrapper_sm100",
    "layout",
    "logical_from_physical",
    "physical_from_logical",
    "physical_from_plain",
    "plain_from_physical",
    "pmax_amax",
    "quantize",
    "quantize_pair",
    "reference_gemm_amax",
    "scale_shape",
]
