"""Linear layers over QuantTensors: matrices that read the same input are joined at load time.

q/k/v and gate/up read the same normed activations; joined into one matrix they cost one
pass over the input and one launch on the GPU. GGUF files sometimes give them different
quant types (Gemma 3 270M: q, k Q5_0 and v Q8_0); consecutive parts of one type are joined and
the rest stay separate parts, and the layer writes each part's columns of the output.

The same layer runs on NumPy and CuPy arrays: a layer whose parts are on the device
(`to_device`) takes and returns CuPy arrays, and joins them with CuPy.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..weights.quant_tensor import QuantTensor


def array_module(a):
    """numpy for NumPy arrays, else cupy (imported only when a CuPy array is seen)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy
    return cupy.get_array_module(a)


def joinable(a: QuantTensor, b: QuantTensor) -> bool:
    """Whether b's rows can be stacked under a's: one type, one width."""
    return a.qtype == b.qtype and a.shape[1:] == b.shape[1:]


def join_rows(name: str, parts: list[QuantTensor]) -> QuantTensor | None:
    """One QuantTensor stacking the rows of `parts`, or None when their types or widths differ."""
    first = parts[0]
    if not all(joinable(first, p) for p in parts):
        return None
    rows = sum(p.shape[0] for p in parts)
    data = np.concatenate([np.asarray(p.data).reshape(p.shape[0], -1) for p in parts], axis=0)
    if not first.is_quantized:
        data = data.reshape((rows,) + first.shape[1:])
    return QuantTensor(name, first.qtype, (rows,) + first.shape[1:], data)


class Linear:
    """y = x @ W^T (+ bias) for W the row-stack of one or more QuantTensors."""

    def __init__(self, name: str, parts: list[QuantTensor], biases: list[np.ndarray] | None = None):
        # consecutive parts of one type and width are joined: q and k stay one matrix when v has
        # a type of its own (Q4_K_M gives v Q6_K on half the layers)
        runs: list[list[QuantTensor]] = []
        for p in parts:
            if runs and joinable(runs[-1][0], p):
                runs[-1].append(p)
            else:
                runs.append([p])
        self.name = name
        self.parts = [join_rows(name, r) if len(r) > 1 else r[0] for r in runs]
        self.out_dims = [p.shape[0] for p in parts]
        self.in_dim = parts[0].shape[1]
        self.bias = np.concatenate(biases).astype(np.float32) if biases else None

    @property
    def out_dim(self) -> int:
        return sum(self.out_dims)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x):
        """x: (T, in_dim), or ops.q8.Q8Rows -> (T, out_dim). Parts of different types write their own
        columns (ops.quant_matmul_rows: one launch for a Q4_K / Q6_K pair at one row)."""
        if len(self.parts) == 1:
            y = ops.quant_matmul(x, self.parts[0])
        else:
            y = ops.quant_matmul_rows(x, self.parts)
        if self.bias is not None:
            y = y + self.bias
        return y

    def to_device(self, upload=None) -> Linear:
        """The same layer with its parts uploaded (QuantTensor.to_device, or `upload(part)`, which
        lets a caller upload a tensor shared by two layers once: a tied embedding and head) and
        its bias as a CuPy float32 array."""
        import cupy

        upload = upload or (lambda p: p.to_device())
        dev = object.__new__(Linear)
        dev.parts = [upload(p) for p in self.parts]
        dev.out_dims = list(self.out_dims)
        dev.in_dim = self.in_dim
        dev.bias = None if self.bias is None else cupy.asarray(np.ascontiguousarray(self.bias, np.float32))
        return dev
