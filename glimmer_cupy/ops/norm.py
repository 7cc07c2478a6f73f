"""RMSNorm, optionally fused with the residual add (kernels: cuda_src/norm.cu).

Per-head q/k norm is the same op on a (T, heads, head_dim) array: the norm runs over the last
axis, so the kernel sees (T * heads, head_dim) rows.
"""

from functools import cache

import numpy as np

from ..kernels.build import get_kernel
from ..reference import norm as ref
from ._check import F32, aligned, check, check_out, fail, no_overlap
from ._dispatch import host_result, is_host

_CTYPE = {F32: "float"}
_EXPRS = tuple(f"{k}<{t}, {v}>" for k in ("rms_norm_kernel", "add_rms_norm_kernel")
               for t in _CTYPE.values() for v in (1, 4))


@cache
def _kernel(name: str, dtype: np.dtype, vec: int):
    return get_kernel("norm", f"{name}<{_CTYPE[dtype]}, {vec}>", name_expressions=_EXPRS)


def _launch_shape(rows: int, d: int, vec: int) -> tuple[tuple[int], tuple[int, int]]:
    """blockDim.x threads per row (about 4 packs each, a power of two in 32..1024), rows stacked
    in y up to 256 threads per block: a warp per row for head_dim, a block per row for hidden."""
    packs = d // vec
    tx = 32
    while tx < 1024 and tx * 4 < packs:
        tx *= 2
    ty = max(1, 256 // tx)
    return ((rows + ty - 1) // ty,), (tx, ty)


def _vec(d: int, *arrays) -> int:
    return 4 if d % 4 == 0 and aligned(*arrays) else 1


def rms_norm(x, weight, eps: float, *, out=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis; x: (..., d), weight: (d,).
    On the GPU, x is float32 and `out` (if given) must not overlap it."""
    if is_host(x):
        return host_result(ref.rms_norm(x, weight, eps), out)
    return _rms_norm_gpu(x, weight, eps, out)


def add_rms_norm_(residual, delta, weight, eps: float, *, out=None):
    """residual += delta (in place); returns rms_norm(residual) * weight."""
    if is_host(residual):
        return host_result(ref.add_rms_norm_(residual, delta, weight, eps), out)
    return _add_rms_norm_gpu(residual, delta, weight, eps, out)


def _check_common(op: str, x, xname: str, weight, out):
    check(x, op, xname, dtypes=tuple(_CTYPE), shape=(..., "d"))
    if x.ndim < 1 or x.shape[-1] < 1:
        raise fail(op, xname, "an array with a non-empty last axis", tuple(x.shape))
    d = x.shape[-1]
    check(weight, op, "weight", dtypes=(F32,), shape=(d,), like=x)
    if out is not None:
        check_out(out, op, x.shape, x.dtype, like=x)
    return d


def _rms_norm_gpu(x, weight, eps, out):
    d = _check_common("rms_norm", x, "x", weight, out)
    if out is None:
        import cupy
        out = cupy.empty_like(x)
    no_overlap(out, x, "rms_norm", "out", "x")
    rows = x.size // d
    if rows == 0:
        return out
    vec = _vec(d, x, weight, out)
    grid, block = _launch_shape(rows, d, vec)
    _kernel("rms_norm_kernel", x.dtype, vec)(
        grid, block, (out, x, weight, np.int32(rows), np.int32(d), np.float32(eps)))
    return out


def _add_rms_norm_gpu(residual, delta, weight, eps, out):
    op = "add_rms_norm_"
    d = _check_common(op, residual, "residual", weight, out)
    check(delta, op, "delta", dtypes=(residual.dtype,), shape=tuple(residual.shape), like=residual)
    if out is None:
        import cupy
        out = cupy.empty_like(residual)
    no_overlap(out, residual, op, "out", "residual")
    no_overlap(out, delta, op, "out", "delta")
    no_overlap(delta, residual, op, "delta", "residual")
    rows = residual.size // d
    if rows == 0:
        return out
    vec = _vec(d, residual, delta, weight, out)
    grid, block = _launch_shape(rows, d, vec)
    _kernel("add_rms_norm_kernel", residual.dtype, vec)(
        grid, block, (out, residual, delta, weight, np.int32(rows), np.int32(d), np.float32(eps)))
    return out
