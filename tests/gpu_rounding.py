"""The NumPy path with the CUDA path's roundings, so CUDA logits can be compared tightly.

The CUDA executor rounds in three places the NumPy path does not:
- K and V are stored as bfloat16 (round to nearest even);
- a matmul in an int8 bucket (gemv_kq, gemv_dp4a: M <= 16) quantizes x per 32 values to int8
  with d = max|x| / 127 and round-half-even codes (mma_st: per 256 values); the integer dot
  products are exact;
- a matmul in a tensor-core bucket (mma, mma_dq, mma_wg, dequant_cublas: the rest above the GEMVs)
  multiplies bfloat16 x by bfloat16 W with float32 accumulation (mma_dq and mma_wg round each weight
  once from its codes and take the mins as a product of their own: close to, not the same as, bf16 W).
GpuRoundingExecutor applies the same roundings to the reference ops. What remains between the two
is float32 accumulation order (and the int8 codes it sometimes tips: test_cuda_executor.py), so
greedy tokens can be compared wherever the top-1 margin is clear of that, not of the roundings
(which alone move tiny-model logits by 0.5-2.7%, measured on the H200).
"""

from __future__ import annotations

import contextlib

import numpy as np

from glimmer_cupy.ops import matmul as gpu_matmul
from glimmer_cupy.reference import attention as ref_attention
from glimmer_cupy.reference import matmul as ref_matmul
from glimmer_cupy.runtime.host_executor import HostExecutor


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def q8_blocks(x: np.ndarray, size: int = 32):
    """x (..., K) quantized per `size` values as quantize_x_kernel does (32; mma_st_stage_x_kernel:
    256): int8 codes (..., K), and d = max|x| / 127 and s = d * sum(codes), float32 (..., K/size)."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], x.shape[-1] // size, size)
    amax = np.abs(b).max(-1)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    codes = np.rint(b * inv[..., None]).astype(np.int8)
    d = amax / np.float32(127)
    s = (d * codes.sum(-1, dtype=np.int32).astype(np.float32)).astype(np.float32)
    return codes.reshape(x.shape), d, s


def int8_blocks(x: np.ndarray, size: int = 32) -> np.ndarray:
    """x (M, K) quantized per `size` values (q8_blocks), returned as d * code."""
    codes, d, _ = q8_blocks(x, size)
    return codes.astype(np.float64) * np.repeat(d.astype(np.float64), size, axis=-1)


def gpu_bucket(m: int, qtype, graph_widths: bool) -> str:
    """The bucket the CUDA executor runs: its table, with mma for the tensor-core rows of steps
    that a graph may capture (graph_widths: the step is at most the widest static width)."""
    b = gpu_matmul.bucket(m, qtype)
    return "mma" if b == "dequant_cublas" and graph_widths else b


class GpuRoundingExecutor(HostExecutor):
    """HostExecutor whose K/V and matmuls round as the CUDA executor's do."""

    def __init__(self, decoder, n_cells: int, max_graph_width: int = 64):
        super().__init__(decoder, n_cells)
        self.max_graph_width = max_graph_width

    def _matmul(self, x, w):
        b = gpu_bucket(x.shape[0], w.qtype, x.shape[0] <= self.max_graph_width)
        if b in gpu_matmul.INT8_BUCKETS:
            return np.ascontiguousarray((ref_matmul.dense(w).astype(np.float64) @ int8_blocks(x).T).T, np.float32)
        if b == "mma_st":
            return np.ascontiguousarray((ref_matmul.dense(w).astype(np.float64) @ int8_blocks(x, 256).T).T,
                                        np.float32)
        if b == "gemv":
            return ref_matmul.quant_matmul(x, w)
        return np.ascontiguousarray((bf16(ref_matmul.dense(w)) @ bf16(x).T).T)

    @staticmethod
    def _kv_write(k_pool, v_pool, k, v, cells):
        k_pool[cells] = bf16(k)
        v_pool[cells] = bf16(v)

    @contextlib.contextmanager
    def _rounding(self):
        saved = ref_matmul.quant_matmul, ref_attention.kv_write_
        ref_matmul.quant_matmul, ref_attention.kv_write_ = self._matmul, self._kv_write
        try:
            yield
        finally:
            ref_matmul.quant_matmul, ref_attention.kv_write_ = saved

    def logits(self, step):
        with self._rounding():
            return super().logits(step)
