"""Q6_K rows repacked into planes, the layout gemv_kq's Lanes<Q6_KP> reads (cuda_src/kq_lanes.cuh).

A GGUF Q6_K super-block is 210 bytes (ql 128, qh 64, scales 16, d 2), so blocks start 2-byte
aligned and a lane's three 8-byte pieces must be read as overlapping 16-byte windows. Here each run
of eight super-blocks of a row (1680 bytes, a multiple of 16) becomes four planes, each in
super-block order: ql (1024 bytes; within a super-block the 8-byte units reordered so that lane
p = 4h + i finds its two pieces, units 8h + i and 8h + 4 + i, side by side at 16p), qh (512,
unchanged), the scales (128; lane p's four, scales[8h + is + 2t] for t = 0..3 with is = i // 2,
side by side at 4 (2h + is)) and d (16). Bytes move only inside a run, so a row keeps its 210 nb
bytes and its place; K must be a multiple of 2048 (whole runs, rows 16-byte aligned). Works on
NumPy and CuPy arrays alike.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .quant_tensor import QType, QuantTensor

BLOCK_BYTES = 210
RUN = 8                                     # super-blocks a run
# the 8-byte units of a super-block's ql in plane order: lane p = 4h + i takes units 8h + i, 8h + 4 + i
QL_UNITS = np.array([8 * (p >> 2) + (p & 3) + 4 * j for p in range(8) for j in range(2)])
# the scale bytes in plane order: position 4 (2h + is) + t holds scales[8h + is + 2t]
SCALE_BYTES = np.array([8 * (j >> 3) + ((j >> 2) & 1) + 2 * (j & 3) for j in range(16)])


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def check_k(k: int, what: str = "to_planes") -> None:
    if k % (256 * RUN):
        raise ValueError(f"{what}: K must be a multiple of {256 * RUN} (whole runs of {RUN} Q6_K super-blocks), "
                         f"got {k}")


def to_planes(data, n: int, k: int):
    """The (n, k) Q6_K tensor's bytes (any shape holding its n * k / 256 blocks) as planes, (n, row bytes)."""
    check_k(k)
    xp = _xp(data)
    runs = n * k // (256 * RUN)
    b = data.reshape(runs, RUN, BLOCK_BYTES)
    ql = b[:, :, :128].reshape(runs, RUN, 16, 8)[:, :, xp.asarray(QL_UNITS)].reshape(runs, RUN * 128)
    qh = b[:, :, 128:192].reshape(runs, RUN * 64)
    sc = b[:, :, 192:208][:, :, xp.asarray(SCALE_BYTES)].reshape(runs, RUN * 16)
    d = b[:, :, 208:].reshape(runs, RUN * 2)
    return xp.ascontiguousarray(xp.concatenate([ql, qh, sc, d], axis=1)).reshape(n, -1)


def from_planes(planes, n: int, k: int):
    """to_planes's inverse: the GGUF blocks, (n, row bytes)."""
    check_k(k, "from_planes")
    xp = _xp(planes)
    runs = n * k // (256 * RUN)
    p = planes.reshape(runs, RUN * BLOCK_BYTES)
    out = xp.empty((runs, RUN, BLOCK_BYTES), np.uint8)
    ql = xp.empty((runs, RUN, 16, 8), np.uint8)
    ql[:, :, xp.asarray(QL_UNITS)] = p[:, :RUN * 128].reshape(runs, RUN, 16, 8)
    out[:, :, :128] = ql.reshape(runs, RUN, 128)
    out[:, :, 128:192] = p[:, RUN * 128:RUN * 192].reshape(runs, RUN, 64)
    out[:, :, 192:208][:, :, xp.asarray(SCALE_BYTES)] = p[:, RUN * 192:RUN * 208].reshape(runs, RUN, 16)
    out[:, :, 208:] = p[:, RUN * 208:].reshape(runs, RUN, 2)
    return out.reshape(n, -1)


def serves(w: QuantTensor) -> bool:
    """Whether w is a device Q6_K matrix of whole runs, which gemv_kq can read as planes."""
    return w.qtype == QType.Q6_K and w.on_device and len(w.shape) == 2 and w.shape[1] % (256 * RUN) == 0


def with_planes(w: QuantTensor) -> QuantTensor:
    """w with its planes beside its GGUF bytes (QuantTensor.planes) where serves(w), else w itself."""
    if not serves(w) or w.planes is not None:
        return w
    n, k = w.shape
    return dataclasses.replace(w, planes=to_planes(w.data, n, k))
