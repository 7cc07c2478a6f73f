"""Embedding lookup from a quantized table."""

import numpy as np

from ..errors import GlimmerError
from ..reference import matmul as ref
from ..weights.quant_tensor import QuantTensor
from ._dispatch import is_host, no_kernel


def embed(table: QuantTensor, ids, scale: float = 1.0):
    """Rows `ids` of a quantized table times `scale`: (T,) -> (T, hidden) float32."""
    if is_host(ids):
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise GlimmerError(f"embed: token ids must be in [0, {table.shape[0]}), "
                               f"got {int(ids.min())}..{int(ids.max())}")
        return ref.embed(table, ids, scale)
    raise no_kernel("embed", ids)
