"""Read safetensors into QuantTensors (F32, F16, BF16) through the `safetensors` package."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import GGUFError, UnsupportedError
from .quant_tensor import QType, QuantTensor

_DTYPES = {"F32": (QType.F32, np.float32), "F16": (QType.F16, np.float16), "BF16": (QType.BF16, np.uint16)}


def load_safetensors(path: str | os.PathLike) -> dict[str, QuantTensor]:
    """All tensors of a .safetensors file, name -> QuantTensor (bf16 kept as raw uint16 bits)."""
    import json
    import struct

    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    # numpy cannot hold bf16, so read the header for dtypes and take bf16 tensors as raw bytes
    with open(path, "rb") as f:
        try:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        except Exception as e:
            raise GGUFError(f"{path}: not a safetensors file ({e})") from None
    out = {}
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            info = header[name]
            dtype = info["dtype"]
            if dtype not in _DTYPES:
                raise UnsupportedError(f"{path}: tensor {name} has dtype {dtype}, which is not supported")
            qtype, np_dtype = _DTYPES[dtype]
            start, end = info["data_offsets"]
            data = raw[8 + n + start: 8 + n + end].view(np_dtype).reshape(info["shape"])
            out[name] = QuantTensor(name, qtype, tuple(info["shape"]), data)
    return out
