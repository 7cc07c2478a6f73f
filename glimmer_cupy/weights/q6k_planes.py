"""Q6_K rows repacked into planes, the layout gemv_kq's Lanes<Q6_KP> reads (cuda_src/kq_lanes.cuh).

A GGUF Q6_K super-block is 210 bytes (ql 128, qh 64, scales 16, d 2), so blocks start 2-byte
aligned and a lane's three 8-byte pieces must be read as overlapping 16-byte windows. Here a row of
nb super-blocks becomes four planes, each in super-block order: ql (128 nb bytes; within a
super-block the 8-byte units reordered so that lane p = 4h + i finds its two pieces, units 8h + i
and 8h + 4 + i, side by side at 16p), qh (64 nb, unchanged), the scales (16 nb; lane p's four,
scales[8h + is + 2t] for t = 0..3 with is = i // 2, side by side at 4 (2h + is)) and d (2 nb). The
row keeps its 210 nb bytes and its place, so row strides are the GGUF ones; only bytes inside a row
move. Works on NumPy and CuPy arrays alike.
"""

from __future__ import annotations

import numpy as np

BLOCK_BYTES = 210
# the 8-byte units of a super-block's ql in plane order: lane p = 4h + i takes units 8h + i, 8h + 4 + i
QL_UNITS = np.array([8 * (p >> 2) + (p & 3) + 4 * j for p in range(8) for j in range(2)])
# the scale bytes in plane order: position 4 (2h + is) + t holds scales[8h + is + 2t]
SCALE_BYTES = np.array([8 * (j >> 3) + ((j >> 2) & 1) + 2 * (j & 3) for j in range(16)])


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def to_planes(data, n: int, k: int):
    """The (n, k) Q6_K tensor's bytes (any shape holding n * k / 256 blocks) as planes, (n, row bytes)."""
    xp = _xp(data)
    if k % 256:
        raise ValueError(f"to_planes: k must be a multiple of 256, got {k}")
    nb = k // 256
    b = data.reshape(n, nb, BLOCK_BYTES)
    ql = b[:, :, :128].reshape(n, nb, 16, 8)[:, :, xp.asarray(QL_UNITS)].reshape(n, nb * 128)
    qh = b[:, :, 128:192].reshape(n, nb * 64)
    sc = b[:, :, 192:208][:, :, xp.asarray(SCALE_BYTES)].reshape(n, nb * 16)
    d = b[:, :, 208:].reshape(n, nb * 2)
    return xp.ascontiguousarray(xp.concatenate([ql, qh, sc, d], axis=1))


def from_planes(planes, n: int, k: int):
    """to_planes's inverse: the GGUF blocks, (n, row bytes)."""
    xp = _xp(planes)
    nb = k // 256
    p = planes.reshape(n, nb * BLOCK_BYTES)
    out = xp.empty((n, nb, BLOCK_BYTES), np.uint8)
    ql = xp.empty((n, nb, 16, 8), np.uint8)
    ql[:, :, xp.asarray(QL_UNITS)] = p[:, :nb * 128].reshape(n, nb, 16, 8)
    out[:, :, :128] = ql.reshape(n, nb, 128)
    out[:, :, 128:192] = p[:, nb * 128:nb * 192].reshape(n, nb, 64)
    out[:, :, 192:208][:, :, xp.asarray(SCALE_BYTES)] = p[:, nb * 192:nb * 208].reshape(n, nb, 16)
    out[:, :, 208:] = p[:, nb * 208:].reshape(n, nb, 2)
    return out.reshape(n, nb * BLOCK_BYTES)
