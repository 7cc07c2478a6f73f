"""Weights: GGUF (through the `gguf` package) and safetensors into QuantTensors."""

from .gguf_file import GGUFFile
from .quant_tensor import SUPPORTED_TYPES, QType, QuantTensor, block_geometry, row_bytes
from .safetensors_file import load_safetensors

__all__ = ["GGUFFile", "QuantTensor", "QType", "SUPPORTED_TYPES", "block_geometry", "row_bytes",
           "load_safetensors"]
