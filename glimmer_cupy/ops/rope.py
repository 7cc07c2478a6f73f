"""Rotary position embedding (normal and NeoX ordering), positions per token (kernel: cuda_src/rope.cu)."""

import math
from functools import cache

import numpy as np

from ..kernels.build import get_kernel
from ..reference import rope as ref
from ._check import (
    F32,
    I32,
    check,
    fail,
    out_or_inplace,
)
from ._dispatch import host_result, is_host

_CTYPE = {F32: "float"}
_EXPRS = tuple(f"rope_kernel<{t}, {n}>" for t in _CTYPE.values() for n in ("false", "true"))
_GRID_TARGET = 264          # blocks to aim for when T is small: 2 per SM on an H200


@cache
def _kernel(dtype: np.dtype, neox: bool):
    return get_kernel("rope", f"rope_kernel<{_CTYPE[dtype]}, {'true' if neox else 'false'}>",
                      name_expressions=_EXPRS)


def rope(x, positions, base: float, neox: bool, rot_dim: int | None = None, *, out=None):
    """x: (T, heads, head_dim) -> rotated (T, heads, head_dim); only the first rot_dim features
    rotate. On the GPU, positions is int32 (T,) and out may be x (rotate in place)."""
    if is_host(x):
        return host_result(ref.rope(x, positions, base, neox, rot_dim), out)
    return _rope_gpu(x, positions, base, neox, rot_dim, out)


def _rope_gpu(x, positions, base, neox, rot_dim, out):
    op = "rope"
    check(x, op, "x", dtypes=tuple(_CTYPE), shape=("T", "heads", "head_dim"))
    t, heads, head_dim = x.shape
    check(positions, op, "positions", dtypes=(I32,), shape=(t,), like=x)
    rot = head_dim if rot_dim is None else int(rot_dim)
    if rot < 2 or rot % 2 or rot > head_dim or head_dim % 2:
        raise fail(op, "rot_dim", f"even, in [2, head_dim] with head_dim even (head_dim {head_dim})", rot_dim)
    if not base > 0:
        raise fail(op, "base", "positive", base)
    out = out_or_inplace(out, x, op)
    if x.size == 0:
        return out
    pairs = head_dim // 2
    tx = min(256, 32 * ((pairs + 31) // 32))
    ty = max(1, min(heads, 256 // tx))
    gy = max(1, min((heads + ty - 1) // ty, (_GRID_TARGET + t - 1) // t))
    _kernel(x.dtype, bool(neox))(
        (t, gy), (tx, ty),
        (out, x, positions, np.int32(heads), np.int32(head_dim), np.int32(rot), np.float64(math.log2(base))))
    return out
