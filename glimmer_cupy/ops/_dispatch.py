"""Dispatch on array type: NumPy arrays run the reference, CuPy arrays the CUDA kernel."""

import numpy as np

from ..errors import UnsupportedError


def is_host(x) -> bool:
    return isinstance(x, np.ndarray)


def no_kernel(op: str, x) -> UnsupportedError:
    return UnsupportedError(f"{op}: no CUDA kernel for {type(x).__module__}.{type(x).__name__} inputs yet; "
                            f"pass NumPy arrays for the reference path")


def host_result(y, out):
    """The reference's result, copied into `out` when the caller gave one."""
    if out is None:
        return y
    out[...] = y
    return out
