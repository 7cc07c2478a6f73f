"""y = x @ dequant(W)^T for W a QuantTensor, embedding rows from a quantized table, and a step's
token ids fed from the previous step's samples.

gguf's dequantizers decode the blocks. The dequantized float32 matrix is cached per tensor
(weakly, so it goes when the tensor goes): the NumPy path runs whole models, and decoding the
blocks again every step would dominate its time.
"""

import weakref

import numpy as np

from ..weights.quant_tensor import QuantTensor

_dense: "weakref.WeakKeyDictionary[QuantTensor, np.ndarray]" = weakref.WeakKeyDictionary()


def dense(w: QuantTensor) -> np.ndarray:
    """float32 values of w, decoded once."""
    d = _dense.get(w)
    if d is None:
        d = w.dequantize(np.float32)
        _dense[w] = d
    return d


def quant_matmul(x: np.ndarray, w: QuantTensor) -> np.ndarray:
    """x: (M, K) float32, w: (N, K) -> (M, N) float32, accumulated in float32 by BLAS."""
    # W @ x^T rather than x @ W^T: OpenBLAS takes a far slower path for the latter at small M
    return np.ascontiguousarray((dense(w) @ x.astype(np.float32, copy=False).T).T)


def embed(table: QuantTensor, ids: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Rows `ids` of the table times `scale`: (T,) -> (T, hidden) float32."""
    rows = table.rows(np.asarray(ids, dtype=np.int64))
    return rows * np.float32(scale) if scale != 1.0 else rows


def feed_tokens_(ids: np.ndarray, feed: np.ndarray, sampled: np.ndarray) -> None:
    """ids[t] = sampled[feed[t]] wherever feed[t] >= 0 (in place); -1 keeps ids[t]."""
    take = feed >= 0
    ids[take] = sampled[feed[take]]
