"""Activations with their int8 form: what a dp4a GEMV reads, made by the op that produces them.

quant_matmul's small-M buckets (gemv_kq, gemv_dp4a) read x as int8 codes per 32 values (xq: one int32
word per 4 values, xd = max|x| / 127 and xs = xd * sum(codes) per 32 values); made by a launch
of its own, that costs about as much as a small GEMV. The ops that feed matmuls (rms_norm,
add_rms_norm_, silu_mul, gelu_mul, and attention for the o-projection) make the same bits in
their own pass when asked (q8=True) and return Q8Rows; quant_matmul takes Q8Rows wherever it
takes x, and reads the codes in the int8 buckets and x itself in the others. The NumPy path has
no int8 form: there q8 is ignored.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

Q8_MAX_ROWS = 32              # the widest int8 launch (ops/matmul.py: mma_kq); above it quant_matmul quantizes x itself


class Q8Rows(NamedTuple):
    """x (M, K) float32 and its codes: q int32 (M, K/4), d and s float32 (M, K/32)."""
    x: object
    q: object
    d: object
    s: object

    @property
    def shape(self):
        return self.x.shape

    def reshape(self, *shape):
        """The same codes with x reshaped, rows kept: (T, heads, D) -> (T, heads * D)."""
        x = self.x.reshape(*shape)
        if x.ndim != 2 or x.shape[0] != self.q.shape[0]:
            raise ValueError(f"Q8Rows.reshape: {self.q.shape[0]} rows of codes, asked for shape {x.shape}")
        return Q8Rows(x, self.q, self.d, self.s)


def wants_q8(rows: int, k: int, aligned_vec4: bool) -> bool:
    """Whether a producer should make the int8 form: rows a dp4a GEMV serves, whole 32-value groups
    and the 4-wide packs the fused epilogue quantizes."""
    return 0 < rows <= Q8_MAX_ROWS and k % 32 == 0 and aligned_vec4


def q8_buffers(rows: int, k: int):
    """(q, d, s) device arrays for rows x k activations."""
    import cupy
    return (cupy.empty((rows, k // 4), dtype=cupy.int32), cupy.empty((rows, k // 32), dtype=cupy.float32),
            cupy.empty((rows, k // 32), dtype=cupy.float32))


NO_CODES = (np.uint64(0),) * 3      # null (q, d, s) pointers for a kernel asked for no codes


def with_codes(out, codes):
    """out, or Q8Rows(out, *codes) when the producer made codes."""
    return out if codes is None else Q8Rows(out, *codes)


def plain(x):
    """The float array of x, whether or not it carries codes."""
    return x.x if isinstance(x, Q8Rows) else x
