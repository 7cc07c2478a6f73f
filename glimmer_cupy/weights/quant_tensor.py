"""QuantTensor: a weight as GGUF stores it — raw block bytes, the GGUF type, the logical shape."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from ..errors import GGUFError, UnsupportedError

QType = GGMLQuantizationType

# The types llama.cpp's common files use; each loads and dequantizes on the NumPy path.
SUPPORTED_TYPES = frozenset({
    QType.F32, QType.F16, QType.BF16,
    QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0,
    QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K,
})


# byte orders of a QuantTensor's data: the file's, and Q6_K in pair order (weights/q6k_pairs.py)
PAIR_ORDER = "q6k_pairs"
LAYOUTS = ("gguf", PAIR_ORDER)


def block_geometry(qtype: QType) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGUF type."""
    return GGML_QUANT_SIZES[qtype]


def row_bytes(qtype: QType, cols: int) -> int:
    """Bytes one row of `cols` elements takes; cols must be a whole number of blocks."""
    block, nbytes = block_geometry(qtype)
    return cols // block * nbytes


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A matrix or vector in GGUF block form.

    shape is logical, NumPy order: a weight of GGUF shape [K, N] is (N, K) here, one row per
    output feature, so y = x @ dequantize().T. `data` holds the bytes as the file has them:
    uint8 of shape (rows, row_bytes) for block types, the plain dtype for F32/F16/BF16 (BF16
    as uint16). It may be a read-only memory map of the file.

    layout: the order of the bytes: "gguf" (the file's), or "q6k_pairs", a Q6_K matrix whose pairs
    of super-blocks are reordered for aligned loads (weights/q6k_pairs.py), as the CUDA executor
    uploads them.
    """

    name: str
    qtype: QType
    shape: tuple[int, ...]
    data: np.ndarray
    layout: str = "gguf"

    def __post_init__(self):
        if self.qtype not in SUPPORTED_TYPES:
            raise UnsupportedError(f"tensor {self.name}: GGUF type {self.qtype.name} is not supported")
        block, _ = block_geometry(self.qtype)
        if self.shape[-1] % block:
            raise GGUFError(f"tensor {self.name}: last dimension {self.shape[-1]} is not a "
                            f"multiple of the {self.qtype.name} block size {block}")
        if self.layout not in LAYOUTS or (self.layout != "gguf" and self.qtype != QType.Q6_K):
            raise GGUFError(f"tensor {self.name}: layout {self.layout!r} is not one of {', '.join(LAYOUTS)} "
                            f"for {self.qtype.name}")
        need = self.nbytes_expected
        if self.data.nbytes != need:
            raise GGUFError(f"tensor {self.name} has {self.data.nbytes} bytes, its shape "
                            f"{self.shape} and {self.qtype.name} need {need}")

    @property
    def nbytes_expected(self) -> int:
        rows = int(np.prod(self.shape[:-1], dtype=np.int64))
        return rows * row_bytes(self.qtype, self.shape[-1])

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in (QType.F32, QType.F16, QType.BF16)

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """The logical values, through gguf's own dequantizers (the oracle for block decoding)."""
        if self.qtype == QType.F32:
            out = np.asarray(self.data, dtype=np.float32)
        elif self.qtype == QType.F16:
            out = np.asarray(self.data).view(np.float16).astype(np.float32)
        elif self.qtype == QType.BF16:
            bits = np.asarray(self.data).view(np.uint16).astype(np.uint32) << 16
            out = bits.view(np.float32)
        else:
            raw = np.ascontiguousarray(self.data).reshape(-1, row_bytes(self.qtype, self.shape[-1]))
            if self.layout != "gguf":
                from .q6k_pairs import from_pairs
                raw = from_pairs(raw, raw.shape[0], self.shape[-1])
            out = gguf_dequantize(raw, self.qtype)
        return out.reshape(self.shape).astype(dtype, copy=False)

    @property
    def on_device(self) -> bool:
        return not isinstance(self.data, np.ndarray)

    def to_device(self) -> "QuantTensor":
        """The same tensor with its bytes uploaded as they are (kernels read GGUF blocks directly)."""
        import cupy
        return QuantTensor(self.name, self.qtype, self.shape, cupy.asarray(np.ascontiguousarray(self.data)),
                           self.layout)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Dequantize only the given rows (an embedding lookup), float32 (len(ids), cols)."""
        if self.layout != "gguf":                  # a pair's order depends on its offset in the tensor
            return self.dequantize()[np.asarray(ids)]
        data = np.asarray(self.data).reshape(self.shape[0], -1)[np.asarray(ids)]
        sub = QuantTensor(self.name, self.qtype, (len(ids), self.shape[-1]), data)
        return sub.dequantize()
