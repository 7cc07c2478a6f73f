"""Quantized matmul y = x @ W^T."""

from ..errors import GlimmerError
from ..reference import matmul as ref
from ..weights.quant_tensor import QuantTensor
from ._dispatch import is_host, no_kernel


def quant_matmul(x, w: QuantTensor):
    """x: (M, K) float32, w: QuantTensor (N, K) -> (M, N) float32."""
    if x.ndim != 2 or x.shape[1] != w.shape[-1]:
        raise GlimmerError(f"quant_matmul: x must be (M, {w.shape[-1]}) for {w.name}, got {tuple(x.shape)}")
    if is_host(x):
        return ref.quant_matmul(x, w)
    raise no_kernel("quant_matmul", x)
