"""Open a GGUF file through the `gguf` package: metadata as plain Python values, tensors as
QuantTensors over a read-only memory map. Sizes are checked against the file before use."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from ..errors import GGUFError, UnsupportedError
from .quant_tensor import SUPPORTED_TYPES, QuantTensor

GGUF_MAGIC = b"GGUF"


class _Reader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    The reader slices its buffer once per string of the vocabulary (262144 for Gemma 3);
    slices of an np.memmap pay for memmap bookkeeping each time, slices of a plain view of
    the same mapped bytes do not — the header then parses several times faster.
    """

    def __init__(self, path, mode="r"):
        self._path = path
        super().__init__(path, mode)

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value):
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    def _build_tensors(self, start_offs, fields):
        """Check every tensor's extent against the file and its neighbours before slicing."""
        spans = []
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise UnsupportedError(f"{self._path}: tensor {name} has unknown GGUF type {int(raw_dtype[0])}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            shape = tuple(int(d) for d in reversed(dims.tolist()))
            if shape and shape[-1] % block:
                raise GGUFError(f"{self._path}: tensor {name} has rows of {shape[-1]} values, not a "
                                f"multiple of the {qtype.name} block size {block}")
            n_bytes = int(np.prod(shape, dtype=np.int64)) * type_size // block
            start = int(start_offs + offset[0])
            spans.append((start, start + n_bytes, name, shape, qtype))
        spans.sort()
        for (s0, e0, n0, shape, qtype), nxt in zip(spans, spans[1:] + [None]):
            if e0 > len(self._data):
                raise GGUFError(f"{self._path}: truncated: tensor {n0} of shape {shape} and type {qtype.name} "
                                f"needs {e0 - s0} bytes at offset {s0}, the file ends at {len(self._data)}")
            if nxt is not None and e0 > nxt[0]:
                raise GGUFError(f"{self._path}: tensor {n0} of shape {shape} and type {qtype.name} needs "
                                f"{e0 - s0} bytes, only {nxt[0] - s0} lie before tensor {nxt[2]}")
        super()._build_tensors(start_offs, fields)


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
        except (GGUFError, UnsupportedError):
            raise
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
