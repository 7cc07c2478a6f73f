"""A matmul whose output joins the residual stream and is normed for the next matmul.

    y = x @ W^T;  y = rms_norm(y, post) when post is given (Gemma's norm after a sublayer);
    residual += y;  return rms_norm(residual, weight)

is what quant_matmul, rms_norm and add_rms_norm_ do one after another, and on the NumPy path it is
exactly that. On the GPU, where the matmul runs a GEMV bucket at decode width (M <= NORM_TAIL_ROWS),
the GEMV's last block to finish does the rest (the norm tail of cuda_src/gemv_kq.cu and
quant_matmul.cu, norm_row.cuh): a decoder layer's two norms then cost no launch of their own. In
a PDL graph a norm kernel between two GEMVs costs 1.5-2.8 us (bench/results/chain_e3544a2.json),
most of it the wait for the GEMV before it and the next one's wait for it. Other buckets (wider
steps, float weights) run the three ops.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..weights.quant_tensor import QuantTensor
from . import norm
from ._check import F32, aligned, check, no_overlap
from ._dispatch import is_host
from .matmul import NORM_TAIL_ROWS, active_bucket, check_device_operands, int8_matmul, quant_matmul
from .q8 import NO_CODES, Q8Rows, q8_buffers, wants_q8, with_codes

OP = "matmul_add_rms_norm_"
TAIL_BUCKETS = frozenset({"gemv_kq", "gemv_dp4a"})


@cache
def _counter(device_id: int):
    """The norm tail's block counter (last_block.cuh): one per device, zeroed once, set back to 0 by
    each launch's last block. Launches on one stream never overlap (a PDL launch's tail runs after
    its wait for the kernel before), so the fused launches of a step share it."""
    import cupy
    with cupy.cuda.Device(device_id):
        return cupy.zeros(1, dtype=cupy.int32)


def fused(m: int, n: int, w: QuantTensor, q8: bool, *arrays) -> bool:
    """Whether the GPU call runs as one GEMV with the norm tail: a GEMV bucket at M <= NORM_TAIL_ROWS,
    rows of whole 4-value packs (and 32-value groups for codes), 16-byte aligned vectors."""
    return (active_bucket(m, w.qtype) in TAIL_BUCKETS and 0 < m <= NORM_TAIL_ROWS and n % 4 == 0
            and (not q8 or n % 32 == 0) and aligned(*arrays))


def matmul_add_rms_norm_(x, w: QuantTensor, residual, weight, eps: float, *, post=None, q8: bool = False):
    """residual += y (in place), y = x @ W^T normed by `post` first when given; returns
    rms_norm(residual) * weight, with q8 as rms_norm (Q8Rows on the GPU for rows a dp4a GEMV
    serves). x: (M, K) float32 or Q8Rows; w: QuantTensor (N, K); residual: (M, N) float32;
    weight, post: (N,) float32."""
    x_in, codes = x, None
    if isinstance(x, Q8Rows):
        x, codes = x.x, x
    if is_host(x):
        return _composed(x_in, w, residual, weight, eps, post, q8)
    check_device_operands(x, w, OP)
    m, n = x.shape[0], w.shape[0]
    check(residual, OP, "residual", dtypes=(F32,), shape=(m, n), like=x)
    check(weight, OP, "weight", dtypes=(F32,), shape=(n,), like=x)
    if post is not None:
        check(post, OP, "post", dtypes=(F32,), shape=(n,), like=x)
    vectors = (residual, weight) + (() if post is None else (post,))
    if m == 0 or not fused(m, n, w, q8, *vectors):
        return _composed(x_in, w, residual, weight, eps, post, q8)
    import cupy

    y = cupy.empty((m, n), dtype=cupy.float32)
    out = cupy.empty_like(residual)
    no_overlap(x, residual, OP, "x", "residual")
    out_codes = q8_buffers(m, n) if q8 and wants_q8(m, n, True) else None
    tail = (residual, NO_CODES[0] if post is None else post, weight, out, *(out_codes or NO_CODES),
            _counter(x.device.id), np.float32(eps))
    int8_matmul(active_bucket(m, w.qtype), x, codes, w, y, tail)
    return with_codes(out, out_codes)


def _composed(x, w, residual, weight, eps, post, q8):
    """The three ops one after another: the NumPy path, and the GPU buckets without a norm tail."""
    y = quant_matmul(x, w)
    if post is not None:
        y = norm.rms_norm(y, post, eps)
    return norm.add_rms_norm_(residual, y, weight, eps, q8=q8)
