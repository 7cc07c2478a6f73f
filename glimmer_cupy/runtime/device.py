"""Which device runs a model: CUDA when a device exists and is asked for, else the NumPy path."""

from __future__ import annotations

from ..errors import GlimmerError


def cuda_device_count() -> int:
    """Number of CUDA devices; 0 without CuPy, a driver or a device (never raises)."""
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def pick_device(requested: str) -> str:
    """'auto' | 'cpu' | 'cuda' -> 'cpu' or 'cuda'."""
    if requested == "cpu":
        return "cpu"
    n = cuda_device_count()
    if requested == "cuda":
        if n == 0:
            raise GlimmerError("--device cuda: no CUDA device found (or no CUDA driver)")
        return "cuda"
    if requested == "auto":
        return "cuda" if n else "cpu"
    raise GlimmerError(f"--device must be auto, cpu or cuda, got {requested!r}")
