"""Loading cuda_src/*.cu into cupy.RawModule: compile once per process, cache on disk."""

from .build import (
    CUDA_SRC,
    KernelBuildError,
    NoDeviceError,
    device_arch,
    get_kernel,
    load_module,
)

__all__ = ["CUDA_SRC", "KernelBuildError", "NoDeviceError", "device_arch", "get_kernel", "load_module"]
