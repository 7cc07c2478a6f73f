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
from .q8 import NO_CODES, q8_buffers, staged_args, staged_buffer, wants_q8, wants_staged, with_codes

ST_MIN_K = 1024     # a norm makes mma_st's images for rows of at least this width (one row a block)
ST_MAX_K = 8192     # and at most this (the row in 32 KB of shared memory: 48 KB less the static)

_CTYPE = {F32: "float"}
_VARIANTS = ((1, "false", "false"), (4, "false", "false"), (4, "true", "false"), (4, "true", "true"))  # (VEC, Q8, ST)
_EXPRS = tuple(f"{k}<{t}, {v}, {q}, {st}>" for k in ("rms_norm_kernel", "add_rms_norm_kernel")
               for t in _CTYPE.values() for v, q, st in _VARIANTS)


def _flag(b: bool) -> str:
    return "true" if b else "false"


@cache
def _kernel(name: str, dtype: np.dtype, vec: int, q8: bool = False, st: bool = False):
    return get_kernel("norm", f"{name}<{_CTYPE[dtype]}, {vec}, {_flag(q8)}, {_flag(st)}>", name_expressions=_EXPRS)


def _launch_shape(rows: int, d: int, vec: int) -> tuple[tuple[int], tuple[int, int]]:
    """blockDim.x threads per row (one pack each where the row allows, a power of two in 32..1024),
    rows stacked in y up to 256 threads per block: a warp per row for head_dim, a block per row
    for hidden. (Four packs per thread left a decode step's norms latency-bound: 6.7 us for one
    1024-wide row under ncu, each thread walking its packs one dependent load after another.)"""
    packs = d // vec
    tx = 32
    while tx < 1024 and tx < packs:
        tx *= 2
    ty = max(1, 256 // tx)
    return ((rows + ty - 1) // ty,), (tx, ty)


def _vec(d: int, *arrays) -> int:
    return 4 if d % 4 == 0 and aligned(*arrays) else 1


def rms_norm(x, weight, eps: float, *, out=None, q8: bool = False):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis; x: (..., d), weight: (d,).
    On the GPU, x is float32 and `out` (if given) must not overlap it. q8: for a 2-D x of rows a
    dp4a GEMV serves, return Q8Rows (the output and its int8 codes, ops/q8.py; and, at the rows the
    table runs mma_st, its images)."""
    if is_host(x):
        return host_result(ref.rms_norm(x, weight, eps), out)
    return _rms_norm_gpu(x, weight, eps, out, q8)


def add_rms_norm_(residual, delta, weight, eps: float, *, out=None, q8: bool = False):
    """residual += delta (in place); returns rms_norm(residual) * weight (q8: as rms_norm)."""
    if is_host(residual):
        return host_result(ref.add_rms_norm_(residual, delta, weight, eps), out)
    return _add_rms_norm_gpu(residual, delta, weight, eps, out, q8)


def _check_common(op: str, x, xname: str, weight, out):
    check(x, op, xname, dtypes=tuple(_CTYPE), shape=(..., "d"))
    if x.ndim < 1 or x.shape[-1] < 1:
        raise fail(op, xname, "an array with a non-empty last axis", tuple(x.shape))
    d = x.shape[-1]
    check(weight, op, "weight", dtypes=(F32,), shape=(d,), like=x)
    if out is not None:
        check_out(out, op, x.shape, x.dtype, like=x)
    return d


def _codes(q8: bool, x, vec: int):
    """(q, d, s) buffers when the int8 form is wanted and can be made here, else None; and (xst,
    st_rows) when mma_st's images are too, else None."""
    rows, d = (x.shape[0], x.shape[1]) if x.ndim == 2 else (0, 0)
    if not (q8 and wants_q8(rows, d, vec == 4)):
        return None, None
    images = ST_MIN_K <= d <= ST_MAX_K and wants_staged(rows, d, vec == 4)
    return q8_buffers(rows, d), staged_buffer(rows, d) if images else None


def _rms_norm_gpu(x, weight, eps, out, q8=False):
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
    codes, staged = _codes(q8, x, vec)
    _kernel("rms_norm_kernel", x.dtype, vec, codes is not None, staged is not None)(
        grid, block, (out, x, weight, np.int32(rows), np.int32(d), np.float32(eps), *(codes or NO_CODES),
                      *staged_args(staged)), shared_mem=_staged_smem(staged, d))
    return with_codes(out, codes, staged)


def _staged_smem(staged, d: int) -> int:
    """The row's floats in shared memory, from which a block making images stages them."""
    return 0 if staged is None else 4 * d


def _add_rms_norm_gpu(residual, delta, weight, eps, out, q8=False):
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
    codes, staged = _codes(q8, residual, vec)
    _kernel("add_rms_norm_kernel", residual.dtype, vec, codes is not None, staged is not None)(
        grid, block, (out, residual, delta, weight, np.int32(rows), np.int32(d), np.float32(eps),
                      *(codes or NO_CODES), *staged_args(staged)), shared_mem=_staged_smem(staged, d))
    return with_codes(out, codes, staged)
