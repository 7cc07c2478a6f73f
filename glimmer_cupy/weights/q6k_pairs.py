"""Q6_K matrices on the device in pair order: the layout every Q6_K matmul kernel reads.

A GGUF Q6_K super-block is 210 bytes (ql 128, qh 64, scales 16, d 2), so blocks start 2-byte
aligned and gemv_kq's lanes must read their 8-byte pieces as overlapping 16-byte windows (six
loads and a shift each, and four byte loads for the scales: the GEMV at M = 1 is bound by L1 on
the H200). Here the bytes of each pair of super-blocks (420 bytes) are reordered in place, so that
its large pieces fall on 16-byte boundaries: a pair at byte offset A of the tensor (A is a multiple
of 4) starts with a prefix of a = -A mod 16 bytes, then
    ql of both super-blocks (256 bytes), each in plane order: the 8-byte units reordered so that
        lane p = 4h + i of gemv_kq finds its two pieces, units 8h + i and 8h + 4 + i, side by side
        at 16 p;
    qh of both (128 bytes), as in the blocks;
and nine 4-byte "small words" fill the prefix and then follow qh: words 0-3 the first super-block's
scales and 4-7 the second's, each in plane order (position 4 (2h + is) + t holds scales[8h + is +
2t], so a lane's four are one word), word 8 both d's. Every pair keeps its 420 bytes and its place,
so row strides, slices of rows and the 16-byte-aligned windows and boxes mma_st copies are those
of the GGUF tensor; only the decoders differ (cuda_src/quant_blocks.cuh: q6p_*). Rows must hold
whole pairs (K a multiple of 512), and the device buffer must start 16-byte aligned, as CuPy's do,
and end at a 16-byte boundary, as mma_st needs of any Q6_K tensor (serves). Works on NumPy and CuPy
arrays alike.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .quant_tensor import PAIR_ORDER as LAYOUT
from .quant_tensor import QType, QuantTensor

PAIR_BYTES = 420
# the 8-byte units of a super-block's ql in plane order: lane p = 4h + i takes units 8h + i, 8h + 4 + i
QL_UNITS = np.array([8 * (p >> 2) + (p & 3) + 4 * j for p in range(8) for j in range(2)])
# the scale bytes in plane order: position 4 (2h + is) + t holds scales[8h + is + 2t]
SCALE_BYTES = np.array([8 * (j >> 3) + ((j >> 2) & 1) + 2 * (j & 3) for j in range(16)])


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def check_k(k: int, what: str) -> None:
    if k % 512:
        raise ValueError(f"{what}: K must be a multiple of 512 (whole pairs of Q6_K super-blocks), got {k}")


def pair_order() -> np.ndarray:
    """(4, 420): row phase, for a pair at byte offset A with A / 4 = phase mod 4, the GGUF byte of the
    pair that each of its bytes in pair order holds."""
    blocks = np.arange(PAIR_BYTES).reshape(2, 210)
    ql = np.concatenate([blocks[j, :128].reshape(16, 8)[QL_UNITS].ravel() for j in range(2)])
    qh = blocks[:, 128:192].ravel()
    small = np.concatenate([blocks[0, 192:208][SCALE_BYTES], blocks[1, 192:208][SCALE_BYTES],
                            blocks[0, 208:], blocks[1, 208:]])
    return np.stack([np.concatenate([small[:(-4 * ph) % 16], ql, qh, small[(-4 * ph) % 16:]]) for ph in range(4)])


def _permute(data, n: int, k: int, what: str, inverse: bool):
    """The tensor's pairs permuted by pair_order (pair i is at byte offset 420 i, so its phase is
    i mod 4), or by its inverse, as (n, row bytes)."""
    check_k(k, what)
    xp = _xp(data)
    src, order = data.reshape(-1, PAIR_BYTES), pair_order()
    out = xp.empty_like(src)
    for ph in range(4):
        idx = xp.asarray(order[ph])
        if inverse:
            view = out[ph::4]                               # a view: its columns written in place
            view[:, idx] = src[ph::4]
        else:
            out[ph::4] = src[ph::4][:, idx]
    return out.reshape(n, -1)


def to_pairs(data, n: int, k: int):
    """The (n, k) Q6_K tensor's GGUF bytes (any shape) in pair order, (n, row bytes)."""
    return _permute(data, n, k, "to_pairs", inverse=False)


def from_pairs(data, n: int, k: int):
    """to_pairs's inverse: the GGUF blocks, (n, row bytes)."""
    return _permute(data, n, k, "from_pairs", inverse=True)


def serves(w: QuantTensor) -> bool:
    """Whether w is a device Q6_K matrix in GGUF order that the pair layout fits: whole pairs a row,
    a 16-byte aligned buffer that ends at a 16-byte boundary (as mma_st needs of a Q6_K tensor)."""
    return (w.qtype == QType.Q6_K and w.layout == "gguf" and w.on_device and len(w.shape) == 2
            and w.shape[1] % 512 == 0 and w.data.data.ptr % 16 == 0 and w.data.nbytes % 16 == 0)


def repack(w: QuantTensor) -> QuantTensor:
    """w in pair order where serves(w), else w itself."""
    if not serves(w):
        return w
    n, k = w.shape
    return dataclasses.replace(w, data=to_pairs(w.data, n, k), layout=LAYOUT)
