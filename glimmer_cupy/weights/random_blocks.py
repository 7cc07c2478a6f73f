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

# Rough step of a random block's integer codes (quant levels times sub-block scale), so that
# d = std / STEP gives dequantized values of about the asked spread.
STEP = {QType.Q4_0: 4.6, QType.Q4_1: 4.6, QType.Q5_0: 9.2, QType.Q5_1: 9.2, QType.Q8_0: 74.0,
        QType.Q2_K: 8.0, QType.Q3_K: 60.0, QType.Q4_K: 140.0, QType.Q5_K: 280.0, QType.Q6_K: 1100.0}


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
    raw = rng.integers(0, 256, (nblocks, nbytes), dtype=np.uint8)
    d_offs, m_offs = FP16_FIELDS[qtype]
    d = std / STEP[qtype]
    for off in d_offs:
        raw[:, off:off + 2] = (d * rng.uniform(0.5, 1.5, nblocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    for off in m_offs:
        raw[:, off:off + 2] = (d * rng.uniform(0.5, 1.5, nblocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)
