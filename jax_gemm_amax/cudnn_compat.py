"""Drop-in counterparts of NVIDIA cuDNN frontend's block-scaled GEMM + amax entry points.

Code written against ``cudnn`` (``gemm_amax_wrapper_sm100``, ``GemmAmaxSm100``,
``gemm_amax_jax_sm100``) runs against this library by changing only the import::

    from jax_gemm_amax import gemm_amax_wrapper_sm100, GemmAmaxSm100, gemm_amax_jax_sm100, TupleDict

The names keep NVIDIA's ``_sm100`` suffix so that ported code reads the same; they run on every
backend this library has (CPU, Hopper, Blackwell). Everything here is an adapter around
:func:`jax_gemm_amax.gemm_amax`: it converts the cuDNN conventions (operands ``(M, K, L)``,
outputs ``(M, N, L)`` and ``(1, 1, 1)``, torch tensors with strides) to the library's
``(L, M, K)`` ones and back. Validation is the library's, so errors are the same
``ValueError`` / ``TypeError`` / ``NotImplementedError`` that ``gemm_amax`` raises; their messages
describe operands in the library's ``(L, M, K)`` / ``(L, N, K)`` order.

Differences from the cuDNN op (limits lifted):

* any batch ``L`` for JAX arrays (cuDNN: ``L == 1``); any M-/K-major torch strides; other torch
  strides are copied to a compact layout first, never read wrongly;
* ``c_major="m"`` for JAX arrays (the returned array is C-contiguous ``(M, N, L)``);
* FP8 x FP8 -> FP8 and packed FP4 in a ``uint8`` container work;
* ``check_support`` does not require a GPU.

torch is imported only when a torch tensor is passed (torch dtypes are read by name, without it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._problem import FP4_OPERAND, PACKED_FP4, canonical_dtype, check_c_major, check_int_pair, check_sf_vec_size
from .layout import PHYSICAL_FROM_LOGICAL, is_logical_shape, physical_from_logical
from .ops import GemmAmaxResult, gemm_amax

__all__ = ["GemmAmaxSm100", "TupleDict", "gemm_amax_jax_sm100", "gemm_amax_wrapper_sm100"]

_FP4X2 = "float4_e2m1fn_x2"  # torch's packed FP4 dtype (two e2m1 values per byte, low nibble first)
_A_JAX_PERM = (2, 0, 1)  # cuDNN (M, K, L) -> library (L, M, K)


class TupleDict(dict):
    """A dict that also unpacks like a tuple, in insertion order (cuDNN frontend's ``TupleDict``).

    ``c, amax = result``; ``result["c_tensor"]``; ``result[0]``.
    """

    def __iter__(self):
        return iter(tuple(self.values()))

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return tuple(self.values())[key]
        return super().__getitem__(key)


# A pytree (its values the children, its keys the aux data), so that a jitted function can return one.
jax.tree_util.register_pytree_node(
    TupleDict, lambda d: (tuple(d.values()), tuple(d.keys())), lambda keys, values: TupleDict(zip(keys, values))
)


# --------------------------------------------------------------------------------------------
# torch, DLPack and dtypes


def _torch():
    import torch  # only reached when a torch object was passed

    return torch


def _is_torch(x) -> bool:
    torch = sys.modules.get("torch")  # a torch tensor implies torch is already imported
    return torch is not None and isinstance(x, torch.Tensor)


def _dtype(dtype, argname: str) -> np.dtype:
    """``canonical_dtype`` plus torch's packed FP4 name as a string."""
    if isinstance(dtype, str) and dtype.removeprefix("torch.") == _FP4X2:
        dtype = "uint8"
    return canonical_dtype(dtype, argname)


def _is_torch_fp4x2(dtype) -> bool:
    if isinstance(dtype, str):
        return dtype.removeprefix("torch.") == _FP4X2
    return type(dtype).__module__ == "torch" and str(dtype) == f"torch.{_FP4X2}"


def _compact(t):
    """A torch tensor that JAX's DLPack import reads as a default-layout array: C-contiguous,
    with canonical strides also on size-1 dims. Anything else is copied (``contiguous()``)."""
    if not t.is_contiguous():
        t = t.contiguous()
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    strides = tuple(reversed(strides))
    if tuple(t.stride()) != strides:  # differs only on size-1 dims: same elements
        t = t.as_strided(t.shape, strides, t.storage_offset())
    return t


def _from_torch(t, name: str) -> jax.Array:
    torch = _torch()
    t = t.detach()
    if t.dtype == getattr(torch, _FP4X2, None):
        t = t.view(torch.uint8)  # DLPack has no 4-bit x2 type; the bytes are the same
    t = _compact(t)
    try:
        return jax.dlpack.from_dlpack(t)
    except Exception as e:  # unsupported dtype or device
        raise TypeError(f"{name}: cannot pass a {t.dtype} tensor on {t.device} to JAX through DLPack: {e}") from e


def _as_jax(x):
    return x if isinstance(x, jax.Array | jax.core.Tracer) else jnp.asarray(x)


@dataclasses.dataclass(frozen=True)
class _Operand:
    """An operand made ready for ``_core``: the array and the static permutation (if any) that
    turns it into the library's ``(L, rows, K)``."""

    array: Any
    perm: tuple[int, ...] | None
    cudnn_shape: tuple[int, ...]
    dtype: str
    major: str  # for messages: "k", "m"/"n", or "-" (JAX arrays, scales)

    @property
    def signature(self):
        return (tuple(self.array.shape), str(self.array.dtype), self.perm)


def _array(x, name: str, expected: str):
    """``x`` as a torch tensor or a JAX array; anything without an array form is a TypeError."""
    if _is_torch(x):
        return x
    if x is None:
        raise TypeError(f"{name}: expected {expected}, got None")
    try:
        return _as_jax(x)
    except TypeError as e:
        raise TypeError(f"{name}: expected {expected}, got {type(x).__name__}") from e


def _rank3(x, name: str, rows: str):
    if len(x.shape) != 3:
        raise ValueError(
            f"{name}: expected ({rows}, K, L) (packed FP4: ({rows}, K // 2, L)), got shape {tuple(x.shape)}"
        )


def _operand(x, name: str, rows: str) -> _Operand:
    """A / B: cuDNN ``(rows, K, L)`` -> library ``(L, rows, K)``, zero-copy for K- and MN-major
    torch tensors (the MN-major transpose then happens inside the jitted computation)."""
    x = _array(x, name, f"an array ({rows}, K, L)")
    _rank3(x, name, rows)
    cudnn_shape = tuple(x.shape)
    if not _is_torch(x):
        return _Operand(x, _A_JAX_PERM, cudnn_shape, str(x.dtype), "-")
    torch = _torch()
    k_major = x.permute(2, 0, 1)  # (L, rows, K)
    if x.dtype in (torch.uint8, getattr(torch, _FP4X2, None)):
        # Packed FP4 packs along K: only K-major is meaningful (as in cuDNN).
        if x.shape[1] > 1 and x.stride(1) != 1:
            raise ValueError(
                f"{name}: packed FP4 ({x.dtype}) must be K-major (stride 1 along K // 2), "
                f"got strides {tuple(x.stride())}"
            )
        return _Operand(_from_torch(k_major, name), None, cudnn_shape, str(x.dtype), "k")
    if k_major.is_contiguous():
        return _Operand(_from_torch(k_major, name), None, cudnn_shape, str(x.dtype), "k")
    mn_major = x.permute(2, 1, 0)  # (L, K, rows)
    if mn_major.is_contiguous():
        return _Operand(_from_torch(mn_major, name), (0, 2, 1), cudnn_shape, str(x.dtype), rows.lower())
    # Not compact in either order (a slice, an L-innermost layout, ...): _from_torch copies.
    return _Operand(_from_torch(k_major, name), None, cudnn_shape, str(x.dtype), "k")


def _scales(x, name: str) -> _Operand:
    """SFA / SFB: the physical ``(L, MN', K', 32, 4, 4)`` array or the logical view
    ``(32, 4, MN', 4, K', L)``, either turned into the physical array: torch's logical view is a
    permutation of the physical bytes, permuted back in torch (zero-copy); a JAX array's is
    transposed, as ``gemm_amax`` would (so that ``GemmAmaxSm100`` takes either form whichever it
    was compiled with)."""
    x = _array(x, name, "scales (the physical (L, MN', K', 32, 4, 4) or the logical (32, 4, MN', 4, K', L))")
    cudnn_shape = tuple(x.shape)
    if not _is_torch(x):
        x = physical_from_logical(x) if is_logical_shape(x.shape) else x
        return _Operand(x, None, cudnn_shape, str(x.dtype), "-")
    if is_logical_shape(x.shape):
        x = x.permute(*PHYSICAL_FROM_LOGICAL)
    return _Operand(_from_torch(x, name), None, cudnn_shape, str(x.dtype), "-")


# --------------------------------------------------------------------------------------------
# The computation: one jittable function, parameterized by static layout choices.


def _core(a, b, sfa, sfb, *, a_perm, b_perm, cudnn_c, c_major, **kwargs):
    """Library-order ``gemm_amax`` on adapted operands. Returns ``c`` as ``(M, N, L)`` when
    ``cudnn_c`` (JAX callers) or in the library's C-contiguous ``(L, M, N)`` / ``(L, N, M)`` for
    ``c_major`` "n" / "m" (torch callers permute that into cuDNN's strides without a copy),
    and amax as ``(1, 1, 1)``."""
    if a_perm is not None:
        a = jnp.transpose(a, a_perm)
    if b_perm is not None:
        b = jnp.transpose(b, b_perm)
    c, amax = gemm_amax(a, b, sfa, sfb, c_major=c_major, **kwargs)
    if cudnn_c:
        c = jnp.transpose(c, (1, 2, 0) if c_major == "n" else (2, 1, 0))
    return c, jnp.reshape(amax, (1, 1, 1))


_core_jit = jax.jit(
    _core,
    static_argnames=(
        "a_perm",
        "b_perm",
        "cudnn_c",
        "c_major",
        "c_dtype",
        "sf_vec_size",
        "acc_dtype",
        "mma_tiler_mn",
        "cluster_shape_mn",
    ),
)


def _static(c_dtype, c_major, acc_dtype, mma_tiler_mn, cluster_shape_mn, sf_vec_size) -> dict:
    """Hashable keyword arguments for ``_core``, validated before they reach ``jax.jit`` (which
    would reject unhashable values with its own message) by the library's own checks."""
    c_major = check_c_major(c_major)
    c = _dtype(c_dtype, "c_dtype")
    if c_major == "m" and c == PACKED_FP4:
        raise ValueError(
            "c_major: packed FP4 c (uint8 / float4_e2m1fn_x2, packed along N) must be n-major (c_major='n')"
        )
    return dict(
        c_dtype=c,
        c_major=c_major,
        acc_dtype=_dtype(acc_dtype, "acc_dtype"),
        mma_tiler_mn=check_int_pair(mma_tiler_mn, "mma_tiler_mn"),
        cluster_shape_mn=check_int_pair(cluster_shape_mn, "cluster_shape_mn"),
        sf_vec_size=check_sf_vec_size(sf_vec_size),
    )


def _cudnn_c_shape(call_c_shape, c_major: str) -> tuple[int, ...]:
    l, x, y = call_c_shape
    return (x, y, l) if c_major == "n" else (y, x, l)


# --------------------------------------------------------------------------------------------
# Streams and torch outputs


def _stream_handle(stream, argname: str) -> int:
    """The CUDA handle of a torch.cuda.Stream (``cuda_stream``), of a cuda-python ``CUstream``
    (``int()``; its ``getPtr()`` is the address of the Python object's storage, not the handle) or
    of an int."""
    try:
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        return int(stream) if hasattr(stream, "getPtr") else operator.index(stream)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{argname}: expected a torch.cuda.Stream or a CUDA stream handle (CUstream / int), got {stream!r}"
        ) from e


def _check_stream(stream, argname: str, torch_tensor):
    """``None`` always works: torch tensors are exchanged through DLPack on torch's current
    stream, JAX arrays stay on XLA's stream. With JAX arrays the default stream (handle 0, such as
    ``cuda.CUstream(0)``, which cuDNN's JAX samples pass) means the same as ``None``. With torch
    tensors an explicit stream is accepted when it is torch's current stream for a CUDA tensor.
    Anything else is rejected."""
    if stream is None:
        return
    if torch_tensor is None:
        handle = _stream_handle(stream, argname)
        if handle != 0:
            raise NotImplementedError(
                f"{argname}: JAX arrays run on XLA's own stream, ordered with the surrounding JAX work; "
                f"pass {argname}=None or the default stream (0, cuda.CUstream(0)), got handle {handle:#x}"
            )
        return
    torch = _torch()
    device = torch_tensor.device
    if device.type != "cuda":
        raise ValueError(f"{argname}: tensors on {device} have no CUDA stream; pass {argname}=None")
    handle = _stream_handle(stream, argname)
    current = torch.cuda.current_stream(device).cuda_stream
    if handle != current:
        raise NotImplementedError(
            f"{argname}: only torch's current stream ({current:#x}) is supported, got {handle:#x}; "
            f"make it current with `with torch.cuda.stream(s):` and pass {argname}=None"
        )


def _torch_c(c, c_major: str, fp4x2: bool):
    """The library-order C (JAX) as a torch (M, N, L) view with cuDNN's strides (no copy)."""
    torch = _torch()
    t = torch.from_dlpack(c)
    t = t.permute(1, 2, 0) if c_major == "n" else t.permute(2, 1, 0)
    return t.view(getattr(torch, _FP4X2)) if fp4x2 else t


def _byte_view(t):
    torch = _torch()
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _first_torch(*xs):
    return next((x for x in xs if _is_torch(x)), None)


def _check_no_unpacked_fp4_for_torch(c_dtype: np.dtype):
    if c_dtype == FP4_OPERAND:
        raise TypeError(
            "c_dtype: float4_e2m1fn (one FP4 value per byte) has no torch dtype; "
            "use torch.float4_e2m1fn_x2 or uint8 (packed along N)"
        )


# --------------------------------------------------------------------------------------------
# Entry points


def gemm_amax_jax_sm100(
    a,
    b,
    sfa,
    sfb,
    *,
    c_dtype=jnp.float32,
    sf_vec_size: int = 32,
    c_major: str = "n",
    acc_dtype=jnp.float32,
    mma_tiler_mn=(128, 128),
    cluster_shape_mn=(1, 1),
) -> GemmAmaxResult:
    """cuDNN frontend's ``gemm_amax_jax_sm100``: jittable, on every backend.

    The name is NVIDIA's (kept so ported code only changes its import); it runs wherever
    :func:`jax_gemm_amax.gemm_amax` runs (CPU, Hopper, Blackwell), under ``jax.jit``, eagerly,
    and under ``vmap``.

    Args:
      a: ``(M, K, L)`` (packed FP4 in ``uint8``: ``(M, K // 2, L)``), K-major as every JAX array
        is; ``float8_e4m3fn``, ``float8_e5m2``, ``float4_e2m1fn`` or packed ``uint8``.
      b: ``(N, K, L)``, same dtype as ``a``.
      sfa, sfb: physical ``(L, ceil(MN/128), ceil(K/(4 sfv)), 32, 4, 4)`` or the logical view
        ``(32, 4, MN', 4, K', L)``.
      c_dtype, sf_vec_size, acc_dtype, mma_tiler_mn, cluster_shape_mn: as :func:`gemm_amax`.
      c_major: ``"n"`` or ``"m"``: which kernel layout runs (and whose rows must be 16-byte
        aligned). Either way the result is a C-contiguous ``(M, N, L)`` array.

    Any ``L`` works (cuDNN: ``L == 1``). Returns ``GemmAmaxResult(c, amax)``: ``c (M, N, L)``
    (packed FP4: ``(M, N // 2, L)``), ``amax (1, 1, 1)`` float32. It unpacks as ``c, amax``.
    """
    a_op, b_op = _operand(a, "a", "M"), _operand(b, "b", "N")
    sfa_op, sfb_op = _scales(sfa, "sfa"), _scales(sfb, "sfb")
    static = _static(c_dtype, c_major, acc_dtype, mma_tiler_mn, cluster_shape_mn, sf_vec_size)
    c, amax = _core(
        a_op.array, b_op.array, sfa_op.array, sfb_op.array, a_perm=a_op.perm, b_perm=b_op.perm, cudnn_c=True, **static
    )
    return GemmAmaxResult(c, amax)


def gemm_amax_wrapper_sm100(
    a_tensor,
    b_tensor,
    sfa_tensor,
    sfb_tensor,
    c_major: str = "n",
    c_dtype=jnp.float32,
    acc_dtype=jnp.float32,
    mma_tiler_mn=(128, 128),
    cluster_shape_mn=(1, 1),
    sf_vec_size: int = 32,
    stream=None,
) -> TupleDict:
    """cuDNN frontend's ``gemm_amax_wrapper_sm100``: allocate outputs, run, return them.

    Takes torch tensors or JAX/numpy arrays in the cuDNN shapes: ``a_tensor (M, K, L)``,
    ``b_tensor (N, K, L)`` (packed FP4 ``uint8`` / ``torch.float4_e2m1fn_x2``: ``(·, K // 2, L)``,
    K-major), scales in the logical view ``(32, 4, MN', 4, K', L)`` or the physical
    ``(L, MN', K', 32, 4, 4)``. Dtype arguments accept jnp / numpy / ml_dtypes dtypes, names and
    torch dtypes.

    Returns a :class:`TupleDict` ``{"c_tensor": c, "amax_tensor": amax}`` that unpacks as
    ``c, amax``; ``c`` is ``(M, N, L)`` (packed FP4: ``(M, N // 2, L)``), ``amax`` ``(1, 1, 1)``
    float32.

    * torch inputs (any of the four): torch outputs on the same device, ``c`` with the cuDNN
      strides for ``c_major`` (n: ``(N, 1, M·N)``, m: ``(1, M, M·N)``), itself a zero-copy view of
      the JAX result. Inputs are shared with JAX through DLPack without a copy when they are K- or
      MN-major (cuDNN's strides); other strides are copied first (as are buffers JAX cannot use
      in place, e.g. misaligned ones). Packed FP4 must be K-major, as in cuDNN. ``stream=None`` orders the work after torch's current stream; passing torch's
      current stream is the same; other streams raise ``NotImplementedError``.
    * JAX / numpy inputs: JAX outputs, ``c`` C-contiguous ``(M, N, L)`` for either ``c_major``.
      Unlike cuDNN's eager wrapper, this one is functional: safe under ``jax.jit`` and ordered by
      XLA (no synchronization needed); ``stream`` must be ``None`` or the default stream (``0``,
      ``cuda.CUstream(0)``), which means the same.
    """
    torch_tensor = _first_torch(a_tensor, b_tensor, sfa_tensor, sfb_tensor)
    _check_stream(stream, "stream", torch_tensor)
    static = _static(c_dtype, c_major, acc_dtype, mma_tiler_mn, cluster_shape_mn, sf_vec_size)
    if torch_tensor is not None:
        _check_no_unpacked_fp4_for_torch(static["c_dtype"])
    a_op, b_op = _operand(a_tensor, "a_tensor", "M"), _operand(b_tensor, "b_tensor", "N")
    sfa_op, sfb_op = _scales(sfa_tensor, "sfa_tensor"), _scales(sfb_tensor, "sfb_tensor")
    cudnn_c = torch_tensor is None
    c, amax = _core_jit(
        a_op.array,
        b_op.array,
        sfa_op.array,
        sfb_op.array,
        a_perm=a_op.perm,
        b_perm=b_op.perm,
        cudnn_c=cudnn_c,
        **static,
    )
    if torch_tensor is not None:
        c = _torch_c(c, c_major, _is_torch_fp4x2(c_dtype))
        amax = _torch().from_dlpack(amax)
    return TupleDict(c_tensor=c, amax_tensor=amax)


class GemmAmaxSm100:
    """cuDNN frontend's ``GemmAmaxSm100``: check once, compile once, execute many times.

    The samples fix shapes, dtypes and layouts: ``c_dtype`` is ``sample_c``'s dtype
    (``uint8`` / ``torch.float4_e2m1fn_x2``: packed FP4) and, for torch, ``c_major`` comes from
    ``sample_c``'s strides (``(1, M, M·N)``: "m", otherwise "n"). ``sample_amax`` must hold one
    float32 (cuDNN: ``(1, 1, 1)``).

    * :meth:`check_support` validates the samples with :func:`gemm_amax`'s own checks and returns
      ``True`` or raises its errors (no GPU needed).
    * :meth:`compile` builds the XLA executable for the sample shapes (ahead of time) and caches
      it; :meth:`execute` with other shapes, dtypes or layouts raises ``ValueError``.
    * :meth:`execute` returns ``TupleDict(c_tensor=..., amax_tensor=...)``. With torch samples it
      writes into the torch ``c_tensor`` / ``amax_tensor`` given, as cuDNN does (the result is
      computed in a JAX buffer and copied in), and returns them. With JAX samples it returns new
      JAX arrays and takes no output buffers: JAX arrays are immutable and writing into one behind
      JAX's back is not safe, so a ``c_tensor`` or ``amax_tensor`` other than ``None`` raises
      ``TypeError`` rather than being left unwritten. Code ported from cuDNN's JAX usage, which
      passes ``c`` and ``amax`` and then reads them, reads the result instead:
      ``c, amax = op.execute(a, b, sfa, sfb)``.
    * ``current_stream``: as ``stream`` in :func:`gemm_amax_wrapper_sm100` (with JAX arrays
      ``None`` or the default stream, ``0`` / ``cuda.CUstream(0)``).
    """

    def __init__(
        self,
        sample_a,
        sample_b,
        sample_sfa,
        sample_sfb,
        sample_c,
        sample_amax,
        acc_dtype=jnp.float32,
        mma_tiler_mn=(128, 128),
        cluster_shape_mn=(1, 1),
        sf_vec_size: int = 32,
    ):
        self.sample_a, self.sample_b = sample_a, sample_b
        self.sample_sfa, self.sample_sfb = sample_sfa, sample_sfb
        self.sample_c, self.sample_amax = sample_c, sample_amax
        self.acc_dtype = acc_dtype
        self.mma_tiler_mn = mma_tiler_mn
        self.cluster_shape_mn = cluster_shape_mn
        self.sf_vec_size = sf_vec_size
        self._torch_out = _is_torch(sample_c)
        self._supported = False
        self._compiled = None
        self._plan = None

    # -- helpers

    @staticmethod
    def _c_major(c) -> str:
        if _is_torch(c) and len(c.shape) == 3:
            m, n, _ = c.shape
            stride = c.stride()
            if stride[0] == 1 and m > 1 and not (stride[1] == 1 and n > 1):
                return "m"
        return "n"

    def _inputs(self, a, b, sfa, sfb, prefix: str):
        return (
            _operand(a, f"{prefix}a", "M"),
            _operand(b, f"{prefix}b", "N"),
            _scales(sfa, f"{prefix}sfa"),
            _scales(sfb, f"{prefix}sfb"),
        )

    def _call_kwargs(self, ops):
        return dict(a_perm=ops[0].perm, b_perm=ops[1].perm, cudnn_c=not self._torch_out, **self._static)

    # -- the cuDNN API

    def check_support(self) -> bool:
        if self._compiled is not None:  # checked before compile(), which dropped the samples
            return True
        c, amax = self.sample_c, self.sample_amax
        if not hasattr(c, "dtype") or not hasattr(amax, "dtype"):
            raise TypeError("sample_c and sample_amax must be tensors or arrays")
        c_major = self._c_major(c)
        self._static = _static(
            c.dtype, c_major, self.acc_dtype, self.mma_tiler_mn, self.cluster_shape_mn, self.sf_vec_size
        )
        if self._torch_out:
            _check_no_unpacked_fp4_for_torch(self._static["c_dtype"])
        ops = self._inputs(self.sample_a, self.sample_b, self.sample_sfa, self.sample_sfb, "sample_")
        arrays = [jax.ShapeDtypeStruct(op.array.shape, op.array.dtype) for op in ops]
        out_c, out_amax = jax.eval_shape(functools.partial(_core, **self._call_kwargs(ops)), *arrays)
        want_c = tuple(out_c.shape) if not self._torch_out else _cudnn_c_shape(out_c.shape, c_major)
        if tuple(c.shape) != want_c:
            raise ValueError(f"sample_c: expected shape {want_c} (M, N, L), got {tuple(c.shape)}")
        if math.prod(amax.shape) != 1 or _dtype(amax.dtype, "sample_amax") != np.dtype(np.float32):
            raise ValueError(
                f"sample_amax: expected one float32 (shape (1, 1, 1)), got {tuple(amax.shape)} {amax.dtype}"
            )
        self._c_major_value = c_major
        self._supported = True
        return True

    def compile(self) -> None:
        if not self._supported:
            self.check_support()
        if self._compiled is not None:
            return
        ops = self._inputs(self.sample_a, self.sample_b, self.sample_sfa, self.sample_sfb, "sample_")
        fn = jax.jit(functools.partial(_core, **self._call_kwargs(ops)))
        self._compiled = fn.lower(*(op.array for op in ops)).compile()
        self._signatures = tuple(op.signature for op in ops)
        self._cudnn_shapes = tuple((op.cudnn_shape, op.dtype, op.major) for op in ops)
        self._c_spec = (tuple(self.sample_c.shape), str(self.sample_c.dtype))
        self._amax_spec = (tuple(self.sample_amax.shape), str(self.sample_amax.dtype))
        # As cuDNN does, drop the samples: the executable is all that is needed.
        self.sample_a = self.sample_b = self.sample_sfa = self.sample_sfb = None
        self.sample_c = self.sample_amax = None

    def execute(
        self, a_tensor, b_tensor, sfa_tensor, sfb_tensor, c_tensor=None, amax_tensor=None, current_stream=None
    ) -> TupleDict:
        if self._compiled is None:
            raise RuntimeError("GemmAmaxSm100: kernel not compiled; call compile() first")
        for name, x, (shape, dtype) in (
            ("c_tensor", c_tensor, self._c_spec),
            ("amax_tensor", amax_tensor, self._amax_spec),
        ):
            if not self._torch_out:
                if x is not None:
                    raise TypeError(
                        f"{name}: with JAX samples, execute returns its outputs and writes into no buffer "
                        f"(JAX arrays are immutable), so {name} must be None, got {type(x).__name__}; "
                        f"read the result instead: c, amax = op.execute(a, b, sfa, sfb)"
                    )
            elif not _is_torch(x):
                raise TypeError(f"{name}: expected a torch tensor like the sample, got {type(x).__name__}")
            elif (tuple(x.shape), str(x.dtype)) != (shape, dtype):
                raise ValueError(f"{name}: expected {shape} {dtype} like the sample, got {tuple(x.shape)} {x.dtype}")
        _check_stream(
            current_stream,
            "current_stream",
            _first_torch(c_tensor, amax_tensor, a_tensor, b_tensor, sfa_tensor, sfb_tensor),
        )
        ops = self._inputs(a_tensor, b_tensor, sfa_tensor, sfb_tensor, "")
        names = ("a_tensor", "b_tensor", "sfa_tensor", "sfb_tensor")
        for name, op, sig, (shape, dtype, major) in zip(names, ops, self._signatures, self._cudnn_shapes):
            if op.signature != sig:
                raise ValueError(
                    f"{name}: got shape {op.cudnn_shape} {op.dtype} (major {op.major!r}), but this GemmAmaxSm100 "
                    f"was compiled for {shape} {dtype} (major {major!r}); build another one for it"
                )
        c, amax = self._compiled(*(op.array for op in ops))
        if not self._torch_out:
            return TupleDict(c_tensor=c, amax_tensor=amax)
        torch = _torch()
        _byte_view(c_tensor).copy_(_byte_view(_torch_c(c, self._c_major_value, False)))
        amax_tensor.copy_(torch.from_dlpack(amax).reshape(amax_tensor.shape))
        return TupleDict(c_tensor=c_tensor, amax_tensor=amax_tensor)
