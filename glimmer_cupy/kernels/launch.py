"""Kernel launches, plain (CuPy's) or with programmatic dependent launch (PDL, sm_90 and later).

With PDL the next kernel of a stream may be scheduled while the one before it is finishing; it
runs until its pdl_wait() (cuda_src/pdl.cuh), which returns once every earlier kernel is done. A
small kernel's launch and its first memory round trip then hide behind its predecessor's tail,
and a matmul fetches its first weights before it waits. CuPy cannot set launch attributes, so
PDL launches go through the driver's cuLaunchKernelEx (ctypes on libcuda: no extra package).

PDL is on only inside `overlapped()` (the executor's static steps, which CUDA graphs replay),
and only for kernels whose sources call pdl_wait() before touching any earlier kernel's data:
a kernel without the wait would race the one before it.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
from functools import cache

import numpy as np

from ..errors import GlimmerError

_OVERLAP = contextvars.ContextVar("glimmer_pdl", default=False)
PROGRAMMATIC_STREAM_SERIALIZATION = 6      # CUlaunchAttributeID in cuda.h
CLUSTER_DIMENSION = 4                      # CUlaunchAttributeID in cuda.h
CLUSTER_SCHEDULING_POLICY = 5              # CUlaunchAttributeID in cuda.h
CLUSTER_POLICIES = {"default": 0, "spread": 1, "load-balancing": 2}   # CUclusterSchedulingPolicy in cuda.h
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14     # CUfunction_attribute in cuda.h


@contextlib.contextmanager
def overlapped(on: bool = True):
    """Within the block, kernels that support it launch with programmatic dependent launch."""
    token = _OVERLAP.set(on)
    try:
        yield
    finally:
        _OVERLAP.reset(token)


class KernelLaunchError(GlimmerError):
    """The driver refused a launch (its error name in the message)."""


class _Attr(ctypes.Structure):              # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):            # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("n_attrs", ctypes.c_uint)]


@cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    lib.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                                           u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    return lib


@cache
def _pdl_attr():
    attr = _Attr()
    attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
    ctypes.memmove(ctypes.addressof(attr) + _Attr.value.offset, ctypes.byref(ctypes.c_int(1)), 4)
    return attr


def _c_arg(a):
    """A kernel argument as the ctypes value CuPy would pass: arrays as device pointers, NumPy
    scalars at their own width, Python ints and floats as int64 and double."""
    if hasattr(a, "data") and hasattr(a.data, "ptr"):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, ctypes.Array):                 # a struct passed by value (a tensor map), as its bytes
        return a
    if isinstance(a, np.generic):
        return np.ctypeslib.as_ctypes_type(a.dtype)(a.item())
    if isinstance(a, bool):
        return ctypes.c_bool(a)
    if isinstance(a, int):
        return ctypes.c_int64(a)
    if isinstance(a, float):
        return ctypes.c_double(a)
    raise TypeError(f"kernel argument of type {type(a).__name__} has no launch conversion")


def _dims(d) -> tuple[int, int, int]:
    d = tuple(d) + (1, 1)
    return int(d[0]), int(d[1]), int(d[2])


def function_ptr(fn) -> int:
    """The driver's CUfunction of fn, a RawKernel or a Function."""
    return fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr


def _current_stream() -> int:
    import cupy
    return cupy.cuda.get_current_stream().ptr


def _launch_ex(ptr: int, what: str, grid, block, args, shared_mem: int, attrs: list) -> None:
    """The CUfunction `ptr` on the current stream through cuLaunchKernelEx with launch attributes
    `attrs` (_Attr values); a refusal raises KernelLaunchError naming `what`."""
    cfg = _Config()
    cfg.grid[:] = _dims(grid)
    cfg.block[:] = _dims(block)
    cfg.shared_mem = shared_mem
    cfg.stream = _current_stream()
    array = (_Attr * len(attrs))(*attrs)
    cfg.attrs = ctypes.cast(array, ctypes.POINTER(_Attr))
    cfg.n_attrs = len(attrs)
    values = [_c_arg(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    lib = _driver()
    rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), ptr, params, None)
    if rc:
        raise KernelLaunchError(f"{what} failed: {_error_name(rc)} ({rc})")


def _error_name(rc: int) -> str:
    """The driver's name of a CUresult (CUDA_ERROR_...)."""
    err = ctypes.c_char_p()
    _driver().cuGetErrorName(rc, ctypes.byref(err))
    return (err.value or b"?").decode()


def launch_pdl(fn, name: str, grid, block, args, shared_mem: int = 0) -> None:
    """fn (a cupy Function) on the current stream with programmatic stream serialization."""
    _launch_ex(function_ptr(fn), f"launch of {name}", grid, block, args, shared_mem, [_pdl_attr()])


def launch_driver(kern: "Kernel", grid, block, args, shared_mem: int = 0) -> None:
    """kern on the current stream through the driver, PDL inside overlapped() as Kernel's call: for
    kernels whose arguments CuPy cannot pass (a tensor map by value)."""
    attrs = [_pdl_attr()] if kern.pdl and _OVERLAP.get() else []
    _launch_ex(kern.ptr, f"launch of {kern.name}", grid, block, args, shared_mem, attrs)


class Kernel:
    """A compiled kernel, called as a CuPy RawKernel is: kernel(grid, block, args, shared_mem=0).
    Inside overlapped(), kernels of PDL-ready sources launch with programmatic dependent launch."""

    __slots__ = ("fn", "name", "pdl")

    def __init__(self, fn, name: str, pdl: bool):
        self.fn, self.name, self.pdl = fn, name, pdl

    @property
    def ptr(self) -> int:
        """The driver's CUfunction, for driver calls CuPy does not wrap."""
        return function_ptr(self.fn)

    def __call__(self, grid, block, args, shared_mem: int = 0):
        if self.pdl and _OVERLAP.get():
            return launch_pdl(self.fn, self.name, grid, block, args, shared_mem)
        return self.fn(grid, block, args, shared_mem=shared_mem)


# Cluster launches. CuPy can set neither a cluster shape at launch nor the attribute that allows more
# than 8 blocks a cluster, so both go through the driver as the PDL launch does. A kernel compiled
# with __cluster_dims__ needs neither; one whose cluster shape is chosen per launch (or is wider
# than 8, which __cluster_dims__ cannot ask for) is launched here.
def allow_large_clusters(fn) -> None:
    """Let fn (a cupy Function) run clusters of up to 16 blocks (the H200's non-portable limit)."""
    lib = _driver()
    rc = lib.cuFuncSetAttribute(ctypes.c_void_p(function_ptr(fn)), NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if rc:
        raise KernelLaunchError(f"cuFuncSetAttribute(non-portable cluster size) failed ({rc})")


# How the hardware places a cluster launch's blocks on SMs (a CLUSTER_POLICIES value; None: no
# attribute, the driver's default). A kernel that fits two blocks an SM, launched as clusters of 16
# (decode attention at batch 1 and 8k positions: 8 clusters, 128 blocks), had two blocks on 16 SMs
# and none on 20 under the default; those blocks streamed their tiles a third slower, and the
# launch ends with its slowest cluster (bench/results/NOTES.md, fifty-fifth session). The spread
# preference left that placement as it was on an H100 (20.0 against 20.1 us; fifty-sixth session), so
# it stays off: an A/B arm (bench_attention.py --cluster-policy).
CLUSTER_POLICY: int | None = None


def _cluster_attrs(cluster) -> list:
    """The launch attributes of a cluster launch: its shape, and the placement policy if one is set."""
    attr = _Attr()
    attr.id = CLUSTER_DIMENSION
    dims = (ctypes.c_uint * 3)(*_dims(cluster))
    ctypes.memmove(ctypes.addressof(attr) + _Attr.value.offset, dims, ctypes.sizeof(dims))
    if CLUSTER_POLICY is None:
        return [attr]
    policy = _Attr()
    policy.id = CLUSTER_SCHEDULING_POLICY
    ctypes.memmove(ctypes.addressof(policy) + _Attr.value.offset, ctypes.byref(ctypes.c_int(CLUSTER_POLICY)), 4)
    return [attr, policy]


def launch_cluster(kern: "Kernel", grid, block, args, shared_mem: int, cluster) -> None:
    """kern on the current stream with clusters of shape `cluster` (x, y, z blocks), placed by
    CLUSTER_POLICY, and with programmatic dependent launch where kern would take it (inside
    overlapped())."""
    attrs = _cluster_attrs(cluster)
    if kern.pdl and _OVERLAP.get():
        attrs.append(_pdl_attr())
    _launch_ex(kern.ptr, f"cluster launch of {kern.name}", grid, block, args, shared_mem, attrs)


# Tensor maps (TMA descriptors, sm_90): made by the driver on the host, passed to a kernel by value
# (a `const __grid_constant__` parameter of 128 bytes), so nothing is uploaded and a captured graph
# keeps its own copy.
TENSOR_MAP_UINT16 = 1                      # CUtensorMapDataType
TENSOR_MAP_L2_256B = 3                     # CUtensorMapL2promotion


def tensor_map_2d(ptr: int, dims: tuple[int, int], row_stride: int, box: tuple[int, int],
                  dtype: int = TENSOR_MAP_UINT16, l2_promotion: int = TENSOR_MAP_L2_256B):
    """A 2-D tiled tensor map of the device array at `ptr`: dims (inner, outer) in elements, the
    outer dimension's stride in bytes, a box of (inner, outer) elements; no swizzle or interleave,
    zeros where a box reaches past the array. Returns its 128 bytes as a ctypes array (a kernel
    argument); a refusal raises KernelLaunchError with the driver's error name."""
    lib = _driver()
    raw = ctypes.create_string_buffer(128 + 64)                # the driver wants it 64-byte aligned
    at = (ctypes.addressof(raw) + 63) // 64 * 64
    rc = lib.cuTensorMapEncodeTiled(ctypes.c_void_p(at), dtype, 2, ctypes.c_void_p(ptr), (ctypes.c_uint64 * 2)(*dims),
                                    (ctypes.c_uint64 * 1)(row_stride), (ctypes.c_uint32 * 2)(*box),
                                    (ctypes.c_uint32 * 2)(1, 1), 0, 0, l2_promotion, 0)
    if rc:
        raise KernelLaunchError(f"cuTensorMapEncodeTiled(dims {dims}, row stride {row_stride}, box {box}) failed: "
                                f"{_error_name(rc)} ({rc})")
    words = (ctypes.c_uint64 * 16)()
    ctypes.memmove(words, at, 128)
    return words
