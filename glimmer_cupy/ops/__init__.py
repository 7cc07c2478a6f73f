"""The kernel-level API: one function per op; NumPy arrays run the reference, CuPy the kernel."""

from .activation import gelu_mul, scale, silu_mul, softcap
from .attention import attention, kv_write_
from .embed import embed, feed_tokens_
from .matmul import quant_matmul, quant_matmul_rows
from .norm import add_rms_norm_, rms_norm
from .prepare_qkv import prepare_qkv_
from .rope import rope
from .sampling import GREEDY, DeviceSamplingParams, SamplingParams, argmax, sample_rows
from .speculative import sample_token

__all__ = ["rms_norm", "add_rms_norm_", "rope", "silu_mul", "gelu_mul", "softcap", "scale",
           "quant_matmul", "quant_matmul_rows", "embed", "feed_tokens_", "kv_write_", "prepare_qkv_", "attention", "argmax", "sample_rows",
           "sample_token", "SamplingParams", "DeviceSamplingParams", "GREEDY"]
