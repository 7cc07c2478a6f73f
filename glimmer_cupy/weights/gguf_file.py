"""Open a GGUF file through the `gguf` package: metadata as plain Python values, tensors as
QuantTensors over a read-only memory map. Sizes are checked against the file before use."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from ..errors import GGUFError, UnsupportedError
from .quant_tensor import SUPPORTED_TYPES, QuantTensor

GGUF_MAGIC = b"GGUF"


class _Reader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    The reader slices its buffer once per string of the vocabulary (262144 for Gemma 3);
    slices of an np.memmap pay for memmap bookkeeping each time, slices of a plain view of
    the same mapped bytes do not — the header then parses several times faster.
    """

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value):
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


class GGUFFile:
    """A GGUF model file: `metadata` (key -> value) and `tensors` (name -> QuantTensor)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: not a file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
        self.file_size = self.path.stat().st_size
        try:
            self._reader = _Reader(self.path, "r")
        except Exception as e:  # the gguf package raises many kinds on a damaged header
            raise GGUFError(f"{self.path}: damaged or truncated GGUF header ({type(e).__name__}: {e})") from None

    @cached_property
    def metadata(self) -> dict[str, object]:
        out = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                out[key] = field.contents()
            except Exception as e:
                raise GGUFError(f"{self.path}: metadata {key} cannot be read ({e})") from None
        return out

    @cached_property
    def tensors(self) -> dict[str, QuantTensor]:
        out = {}
        for t in self._reader.tensors:
            try:
                qtype = GGMLQuantizationType(int(t.tensor_type))
            except ValueError:
                raise UnsupportedError(f"{self.path}: tensor {t.name} has unknown GGUF type {int(t.tensor_type)}") from None
            if qtype not in SUPPORTED_TYPES:
                raise UnsupportedError(f"{self.path}: tensor {t.name} has GGUF type {qtype.name}, "
                                       f"which is not supported")
            end = int(t.data_offset) + int(t.n_bytes)
            if end > self.file_size:
                raise GGUFError(f"{self.path}: truncated: tensor {t.name} needs bytes up to {end}, "
                                f"the file has {self.file_size}")
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            data = np.asarray(t.data)
            if data.nbytes != int(t.n_bytes):
                raise GGUFError(f"{self.path}: tensor {t.name} has {data.nbytes} bytes, its shape "
                                f"{shape} and {qtype.name} need {int(t.n_bytes)}")
            try:
                out[t.name] = QuantTensor(t.name, qtype, shape, data)
            except GGUFError as e:
                raise GGUFError(f"{self.path}: {e}") from None
        return out

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def require(self, key: str):
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata key {key} is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))
