"""Random but valid GGUF blocks of any supported type: random quant bits, finite fp16 scales.

Used to write synthetic models for timing and to test every type's loading and kernels. The
offsets are those of ggml's block structs (ggml-common.h); only the fp16 scale fields need
care, every other byte pattern is a valid block.
"""

from __future__ import annotations

import numpy as np

from .quant_tensor import QType, block_geometry

# byte offsets of the fp16 fields in one block: (scales "d", minimums "dmin"/"m")
FP16_FIELDS: dict[QType, tuple[tuple[int, ...], tuple[int, ...]]] = {
    QType.Q4_0: ((0,), ()),
    QType.Q4_1: ((0,), (2,)),
    QType.Q5_0: ((0,), ()),
    QType.Q5_1: ((0,), (2,)),
    QType.Q8_0: ((0,), ()),
    QType.Q2_K: ((80,), (82,)),
    QType.Q3_K: ((108,), ()),
    QType.Q4_K: ((0,), (2,)),
    QType.Q5_K: ((0,), (2,)),
    QType.Q6_K: ((208,), ()),
}

# std of a random block's values in units of d (quant codes times sub-block scales), so that
# d = std / STEP gives about the asked spread. Q4_K: x = d*sc*q - dmin*m, sc, m in 0..63, q in
# 0..15; dmin = 7.5 d centres x on zero and std(x) ~= 258 d. Q6_K: x = d*s*(q-32), s in
# -128..127, q in 0..63: std ~= 1366 d (so d is an fp16 subnormal at std 0.02, as in real files).
STEP = {QType.Q4_0: 4.6, QType.Q4_1: 4.6, QType.Q5_0: 9.2, QType.Q5_1: 9.2, QType.Q8_0: 74.0,
        QType.Q2_K: 8.0, QType.Q3_K: 60.0, QType.Q4_K: 258.0, QType.Q5_K: 520.0, QType.Q6_K: 1366.0}
# dmin / d that centres the k-quants with block minimums: mean code times mean scale / mean min
MIN_RATIO = {QType.Q2_K: 1.5, QType.Q4_K: 7.5, QType.Q5_K: 15.5}


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes; full-range uint64 draws are ~10x faster than uint8 draws or rng.bytes()."""
    return rng.integers(0, 2**64 - 1, (n + 7) // 8, dtype=np.uint64, endpoint=True).view(np.uint8)[:n]


def random_blocks(qtype: QType, rows: int, cols: int, rng: np.random.Generator, std: float = 0.02) -> np.ndarray:
    """uint8 (rows, row_bytes) of random blocks whose values spread about `std`."""
    if qtype == QType.F32:
        return rng.normal(0, std, (rows, cols)).astype(np.float32)
    if qtype == QType.F16:
        return rng.normal(0, std, (rows, cols)).astype(np.float16)
    if qtype == QType.BF16:
        return (rng.normal(0, std, (rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    block, nbytes = block_geometry(qtype)
    if cols % block:
        raise ValueError(f"{qtype.name} rows need a multiple of {block} columns, got {cols}")
    nblocks = rows * cols // block
    raw = random_bytes(rng, nblocks * nbytes).reshape(nblocks, nbytes)
    d_offs, m_offs = FP16_FIELDS[qtype]
    # per-block scale spread over [0.5, 1.5] of its mean; 1.04 = sqrt(E[spread^2])
    d = rng.uniform(0.5, 1.5, nblocks).astype(np.float32) * np.float32(std / STEP[qtype] / 1.04)
    for off in d_offs:
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    for off in m_offs:
        m = d * MIN_RATIO.get(qtype, 1.0)
        raw[:, off:off + 2] = m.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)
