"""q|k|v rows of one matmul -> attention's inputs: per-head q/k RMSNorm, RoPE, K/V into the pool
(rules: reference/attention.py prepare_qkv_; kernel: cuda_src/prepare_qkv.cu, one launch).

On the GPU the kernel covers head_dim 64, 128 and 256 with RoPE over the whole head; other shapes
(a partial rope_dim) run the unfused ops (split, rms_norm, rope, kv_write_), same results.
"""

import math
from functools import cache

import numpy as np

from ..kernels.build import get_kernel
from ..reference import attention as ref
from ._check import F32, I32, check, check_out, fail
from ._dispatch import host_result, is_host
from .attention import BF16, HEAD_DIMS, kv_write_
from .norm import rms_norm
from .rope import rope

_B = ("false", "true")
_EXPRS = tuple(f"prepare_qkv_kernel<{d}, {n}, {q}>" for d in HEAD_DIMS for n in _B for q in _B)
WARPS = 8                                   # blockDim.y: warps per token


@cache
def _kernel(d: int, neox: bool, qk_norm: bool):
    return get_kernel("prepare_qkv", f"prepare_qkv_kernel<{d}, {_B[neox]}, {_B[qk_norm]}>", name_expressions=_EXPRS)


def prepare_qkv_(qkv, k_pool, v_pool, cells, positions, n_heads: int, n_kv_heads: int, q_norm=None, k_norm=None,
                 eps: float = 1e-6, rope_base: float = 10000.0, neox: bool = False, rope_dim: int | None = None, *,
                 out=None):
    """qkv: (T, (n_heads + 2 n_kv_heads) * D) float32, heads in the order q, k, v -> q (T, n_heads, D)
    float32; k and v are written to k_pool[cells], v_pool[cells] (bf16 bits on the GPU). q_norm and
    k_norm: (D,) weights of the per-head RMSNorm, both or neither."""
    if (q_norm is None) != (k_norm is None):
        raise fail("prepare_qkv_", "q_norm", "given together with k_norm, or both None",
                   f"q_norm {'None' if q_norm is None else 'given'}, k_norm {'None' if k_norm is None else 'given'}")
    if is_host(qkv):
        return host_result(ref.prepare_qkv_(qkv, k_pool, v_pool, cells, positions, n_heads, n_kv_heads, q_norm,
                                            k_norm, eps, rope_base, neox, rope_dim), out)
    op = "prepare_qkv_"
    check(qkv, op, "qkv", dtypes=(F32,), shape=("T", "W"))
    t, width = qkv.shape
    heads = n_heads + 2 * n_kv_heads
    if n_kv_heads <= 0 or n_heads <= 0 or width % heads:
        raise fail(op, "qkv", f"(T, (n_heads + 2 n_kv_heads) * D) with n_heads {n_heads}, n_kv_heads {n_kv_heads}",
                   tuple(qkv.shape))
    d = width // heads
    check(k_pool, op, "k_pool", dtypes=(BF16,), shape=("cells", n_kv_heads, d), like=qkv)
    check(v_pool, op, "v_pool", dtypes=(BF16,), shape=tuple(k_pool.shape), like=qkv)
    check(cells, op, "cells", dtypes=(I32,), shape=(t,), like=qkv)
    check(positions, op, "positions", dtypes=(I32,), shape=(t,), like=qkv)
    qk_norm = q_norm is not None
    if qk_norm:
        check(q_norm, op, "q_norm", dtypes=(F32,), shape=(d,), like=qkv)
        check(k_norm, op, "k_norm", dtypes=(F32,), shape=(d,), like=qkv)
    if d not in HEAD_DIMS or (rope_dim or d) != d:
        return _unfused(qkv, k_pool, v_pool, cells, positions, n_heads, n_kv_heads, d, q_norm, k_norm, eps,
                        rope_base, neox, rope_dim, out)
    import cupy

    if out is None:
        out = cupy.empty((t, n_heads, d), dtype=cupy.float32)
    check_out(out, op, (t, n_heads, d), like=qkv)
    if t:
        null = np.uint64(0)
        _kernel(d, bool(neox), qk_norm)(
            (t, -(-heads // WARPS)), (32, WARPS),
            (out, k_pool, v_pool, qkv, q_norm if qk_norm else null, k_norm if qk_norm else null, positions, cells,
             np.int32(n_heads), np.int32(n_kv_heads), np.float32(eps), np.float64(math.log2(rope_base))))
    return out


def _unfused(qkv, k_pool, v_pool, cells, positions, n_heads, n_kv_heads, d, q_norm, k_norm, eps, rope_base, neox,
             rope_dim, out):
    import cupy

    t = qkv.shape[0]
    q_dim, kv_dim = n_heads * d, n_kv_heads * d
    q = cupy.ascontiguousarray(qkv[:, :q_dim]).reshape(t, n_heads, d)
    k = cupy.ascontiguousarray(qkv[:, q_dim:q_dim + kv_dim]).reshape(t, n_kv_heads, d)
    v = cupy.ascontiguousarray(qkv[:, q_dim + kv_dim:]).reshape(t, n_kv_heads, d)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
        k = rms_norm(k, k_norm, eps)
    q = rope(q, positions, rope_base, neox, rope_dim, out=out)
    k = rope(k, positions, rope_base, neox, rope_dim)
    kv_write_(k_pool, v_pool, k, v, cells)
    return q
