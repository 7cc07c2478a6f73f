"""Compile cuda_src/*.cu through cupy.RawModule, once per process, cached on disk across runs.

CuPy keys its on-disk cache by the source text and the options; headers a source includes are
not part of that text, so the options carry a hash of the source and of every cuda_src/ header it
includes, directly or not: an edited header recompiles the modules that include it, and no other.
Templates are instantiated through `name_expressions`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import cache
from pathlib import Path

from ..errors import GlimmerError
from .launch import Kernel

CUDA_SRC = Path(__file__).resolve().parents[2] / "cuda_src"


class KernelBuildError(GlimmerError):
    """A .cu file failed to compile; the message carries the compiler's log."""


class NoDeviceError(GlimmerError):
    """CUDA was asked for on a machine without a device or a driver."""


@cache
def device_arch() -> str:
    """'sm_90' on Hopper; raises NoDeviceError (at the first GPU call, never at import)."""
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise NoDeviceError(f"no usable CUDA device ({type(e).__name__}: {e})") from None
    if n == 0:
        raise NoDeviceError("no CUDA device found")
    return f"sm_{cupy.cuda.Device().compute_capability}"      # CuPy gives e.g. '90'


@cache
def sm_count() -> int:
    """Streaming multiprocessors of the current device (132 on an H200)."""
    import cupy
    device_arch()
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


@cache
def dram_bytes_per_s() -> float:
    """The current device's peak DRAM bandwidth in bytes a second, from the memory clock and bus width
    its driver reports (two transfers a clock)."""
    import cupy
    device_arch()
    a = cupy.cuda.Device().attributes
    return 2.0 * a["MemoryClockRate"] * 1e3 * a["GlobalMemoryBusWidth"] / 8


_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


@cache
def _sources_hash(name: str) -> str:
    """A hash of cuda_src/<name>.cu and of every cuda_src/ file it includes, directly or not."""
    seen, todo = {}, [f"{name}.cu"]
    while todo:
        f = todo.pop()
        p = CUDA_SRC / f
        if f in seen or not p.is_file():
            continue
        seen[f] = p.read_bytes()
        todo += [m.decode() for m in _INCLUDE.findall(seen[f])]
    h = hashlib.sha256()
    for f in sorted(seen):
        h.update(f.encode())
        h.update(seen[f])
    return h.hexdigest()[:16]


# defines every module compiled from now on gets (add_defines): compile-time switches of probes and
# benchmarks, e.g. GLIMMER_STAMPS
_EXTRA_DEFINES: list[tuple[str, object]] = []


def add_defines(*names: str) -> None:
    """Compile every module loaded after this call with -DNAME=1 for each name too (a process-wide
    switch for probes and benchmarks; modules already loaded keep their build)."""
    _EXTRA_DEFINES.extend((n, 1) for n in names)


def compile_options(name: str, defines: tuple[tuple[str, object], ...] = ()) -> tuple[str, ...]:
    """NVRTC's options for cuda_src/<name>.cu."""
    opts = ["-std=c++17", f"-I{CUDA_SRC}", f"-DGLIMMER_SRC_HASH=0x{_sources_hash(name)}ULL"]
    opts += [f"-D{k}={v}" for k, v in tuple(defines) + tuple(_EXTRA_DEFINES)]
    return tuple(opts)


# Modules made of architecture-specific instructions (Hopper's wgmma): compiled for sm_90a, whose
# code runs only on sm_90 devices. CuPy's RawModule always appends its own -arch=sm_XY, so these go
# through NVRTC directly (the same library CuPy uses) and are cached on disk here, keyed like
# CuPy's cache by the source, the options (which carry _sources_hash) and the NVRTC version.
ARCH_SPECIFIC = frozenset({"attention_wgmma", "mma_wg", "wgmma_probe"})
ARCH_SPECIFIC_DEVICE = "sm_90"


def has_arch_specific() -> bool:
    """Whether the device runs ARCH_SPECIFIC modules (an sm_90 GPU: H100, H200)."""
    return device_arch() == ARCH_SPECIFIC_DEVICE


def _cache_dir() -> Path:
    root = os.environ.get("GLIMMER_KERNEL_CACHE") or Path.home() / ".cache" / "glimmer_cupy" / "kernels"
    return Path(root)


class _ArchModule:
    """A cubin loaded through CuPy, with the lowered names of its name expressions."""

    def __init__(self, cubin: bytes, mapping: dict[str, str]):
        from cupy.cuda import function
        self.module = function.Module()
        self.module.load(cubin)
        self.mapping = mapping

    def get_function(self, name: str):
        return self.module.get_function(self.mapping.get(name, name))

    def get_global(self, name: str):
        """A device pointer to the module's global `name`, as RawModule.get_global gives it (its size
        unknown, so 0: wrap it in an array of the shape the source declares)."""
        from cupy.cuda import memory
        from cupy_backends.cuda.api import driver
        ptr = driver.moduleGetGlobal(self.module.ptr, name)
        return memory.MemoryPointer(memory.UnownedMemory(ptr, 0, self), 0)


def _compile_arch_specific(path: Path, options: tuple[str, ...], name_expressions: tuple[str, ...]) -> _ArchModule:
    from cupy_backends.cuda.libs import nvrtc

    if device_arch() != ARCH_SPECIFIC_DEVICE:
        raise KernelBuildError(f"{path}: needs an {ARCH_SPECIFIC_DEVICE} device, this one is {device_arch()}")
    arch = device_arch() + "a"
    code = path.read_text()
    opts = options + (f"-arch={arch}", "-ftz=true", "--device-as-default-execution-space")
    key = hashlib.sha256(repr((code, opts, name_expressions, nvrtc.getVersion())).encode()).hexdigest()[:32]
    cubin_path, names_path = _cache_dir() / f"{key}.cubin", _cache_dir() / f"{key}.json"
    if cubin_path.is_file() and names_path.is_file():
        return _ArchModule(cubin_path.read_bytes(), json.loads(names_path.read_text()))
    prog = nvrtc.createProgram(code, path.name, (), ())
    try:
        for e in name_expressions:
            nvrtc.addNameExpression(prog, e)
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError:
            raise KernelBuildError(f"{path}: compilation for {arch} failed:\n{nvrtc.getProgramLog(prog)}") from None
        cubin = nvrtc.getCUBIN(prog)
        mapping = {e: nvrtc.getLoweredName(prog, e) for e in name_expressions}
    finally:
        nvrtc.destroyProgram(prog)
    _cache_dir().mkdir(parents=True, exist_ok=True)
    # whole files only, if processes race; the names first, so that a cubin found has its names
    for dest, data in ((names_path, json.dumps(mapping).encode()), (cubin_path, cubin)):
        tmp = dest.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(dest)
    return _ArchModule(cubin, mapping)


@cache
def _load(name: str, defines: tuple[tuple[str, object], ...], name_expressions: tuple[str, ...]):
    import cupy
    from cupy.cuda.compiler import CompileException

    device_arch()
    path = CUDA_SRC / f"{name}.cu"
    if not path.is_file():
        raise KernelBuildError(f"no CUDA source {path}")
    if name in ARCH_SPECIFIC:
        return _compile_arch_specific(path, compile_options(name, defines), name_expressions)
    module = cupy.RawModule(code=path.read_text(), options=compile_options(name, defines),
                            name_expressions=name_expressions or None)
    try:
        module.compile()
    except CompileException as e:
        raise KernelBuildError(f"{path}: compilation failed:\n{e.get_message()}") from None
    return module


def load_module(name: str, defines: dict | None = None, name_expressions=()):
    """The compiled module of cuda_src/<name>.cu (compiled on first use in this process)."""
    return _load(name, tuple(sorted((defines or {}).items())), tuple(name_expressions))


# sources whose every kernel calls pdl_wait() before touching earlier kernels' data (pdl.cuh);
# tests/test_launch.py checks the list against the sources
PDL_SOURCES = frozenset({"activation", "attention", "attention_mma", "attention_stream", "attention_wgmma", "decode_stack", "embed",
                         "gemv_kq", "gemv_staged", "mma_dq", "mma_kq", "mma_st", "mma_wg", "norm", "prepare_qkv", "quant_matmul",
                         "quant_mma", "rope", "sampling", "speculative"})


def get_kernel(name: str, kernel: str, defines: dict | None = None, name_expressions=()) -> Kernel:
    """One kernel of a module; `kernel` is a plain name or one of the name expressions."""
    return _kernel(name, kernel, tuple(sorted((defines or {}).items())), tuple(name_expressions))


@cache
def _kernel(name: str, kernel: str, defines: tuple, name_expressions: tuple) -> Kernel:
    return Kernel(_load(name, defines, name_expressions).get_function(kernel), kernel, name in PDL_SOURCES)
