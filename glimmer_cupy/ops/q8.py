"""Activations with their int8 form: what a dp4a GEMV reads, made by the op that produces them.

quant_matmul's small-M buckets (gemv_kq, gemv_dp4a) read x as int8 codes per 32 values (xq: one int32
word per 4 values, xd = max|x| / 127 and xs = xd * sum(codes) per 32 values); made by a launch
of its own, that costs about as much as a small GEMV. The ops that feed matmuls (rms_norm,
add_rms_norm_, silu_mul, gelu_mul, and attention for the o-projection) make the same bits in
their own pass when asked (q8=True) and return Q8Rows; quant_matmul takes Q8Rows wherever it
takes x, and reads the codes in the int8 buckets and x itself in the others. The NumPy path has
no int8 form: there q8 is ignored.

At the rows where the table runs mma_st (ST_ROWS), the norms and gated activations also make x's
mma_st images (int8 per 256 values, mma_st_stage.cuh), carried as Q8Rows.st, so that the matmul has
no stage launch of its own (attention's output does not yet: the o projection stages its x).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

Q8_MAX_ROWS = 32              # the widest int8 launch (ops/matmul.py: mma_kq); above it quant_matmul quantizes x itself
ST_ROWS = range(4, 33)        # rows of x where ops/matmul.py's BUCKETS run mma_st (for Q4_K; Q6_K from 8)
ST_IMAGE_BYTES = 2208         # XStage<1>::kBytes (mma_st_lanes.cuh): a super-block of 8 rows of x


class Q8Rows(NamedTuple):
    """x (M, K) float32 and its codes: q int32 (M, K/4), d and s float32 (M, K/32); st: x's mma_st
    images (uint8, staged_bytes(M, K)) where the producer made them, else None."""
    x: object
    q: object
    d: object
    s: object
    st: object = None

    @property
    def shape(self):
        return self.x.shape

    def reshape(self, *shape):
        """The same codes with x reshaped, rows kept: (T, heads, D) -> (T, heads * D)."""
        x = self.x.reshape(*shape)
        if x.ndim != 2 or x.shape[0] != self.q.shape[0]:
            raise ValueError(f"Q8Rows.reshape: {self.q.shape[0]} rows of codes, asked for shape {x.shape}")
        return Q8Rows(x, self.q, self.d, self.s, self.st)


def wants_q8(rows: int, k: int, aligned_vec4: bool) -> bool:
    """Whether a producer should make the int8 form: rows a dp4a GEMV serves, whole 32-value groups
    and the 4-wide packs the fused epilogue quantizes."""
    return 0 < rows <= Q8_MAX_ROWS and k % 32 == 0 and aligned_vec4


def wants_staged(rows: int, k: int, aligned_vec4: bool) -> bool:
    """Whether a producer of codes should make x's mma_st images too: rows the table runs mma_st at,
    whole super-blocks, its 4-wide packs, an sm_90 device (mma_st's). (The norms ask more: norm.py.)"""
    from ..kernels.build import has_arch_specific
    return rows in ST_ROWS and k % 256 == 0 and aligned_vec4 and has_arch_specific()


def staged_bytes(rows: int, k: int) -> int:
    """Bytes of x's mma_st images: a super-block's image of 8 rows per n-tile of x."""
    return k // 256 * ST_IMAGE_BYTES * -(-rows // 8)


def staged_buffer(rows: int, k: int):
    """(xst, st_rows): the images' device buffer and their rows (8 per n-tile; those past `rows` are
    written as zeros)."""
    import cupy
    return cupy.empty(staged_bytes(rows, k), dtype=cupy.uint8), 8 * -(-rows // 8)


def q8_buffers(rows: int, k: int):
    """(q, d, s) device arrays for rows x k activations."""
    import cupy
    return (cupy.empty((rows, k // 4), dtype=cupy.int32), cupy.empty((rows, k // 32), dtype=cupy.float32),
            cupy.empty((rows, k // 32), dtype=cupy.float32))


NO_CODES = (np.uint64(0),) * 3      # null (q, d, s) pointers for a kernel asked for no codes
NO_STAGED = (np.uint64(0), np.int32(0))     # null (xst, st_rows) for a producer asked for no images


def staged_args(staged):
    """A producer kernel's (xst, st_rows) arguments for staged_buffer's pair, or NO_STAGED."""
    return NO_STAGED if staged is None else (staged[0], np.int32(staged[1]))


def with_codes(out, codes, staged=None):
    """out, or Q8Rows(out, *codes, images) when the producer made codes (and images)."""
    return out if codes is None else Q8Rows(out, *codes, None if staged is None else staged[0])


def plain(x):
    """The float array of x, whether or not it carries codes."""
    return x.x if isinstance(x, Q8Rows) else x
