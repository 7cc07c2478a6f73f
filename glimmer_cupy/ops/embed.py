"""Embedding lookup from a quantized table (kernel: cuda_src/embed.cu, block decoding in
cuda_src/quant_blocks.cuh), and feed_tokens_, which sets a step's token ids from the previous
step's samples where the host does not have them yet."""

from functools import cache

import numpy as np

from ..errors import GlimmerError
from ..kernels.build import get_kernel
from ..reference import matmul as ref
from ..weights.quant_tensor import QType, QuantTensor, row_bytes
from ._check import F32, I32, aligned, check, check_out, fail
from ._dispatch import host_result, is_host

# GGUF type -> block-traits struct of quant_blocks.cuh
TRAITS: dict[QType, str] = {
    QType.F32: "gguf::F32", QType.F16: "gguf::F16", QType.BF16: "gguf::BF16",
    QType.Q4_0: "gguf::Q4_0", QType.Q4_1: "gguf::Q4_1", QType.Q5_0: "gguf::Q5_0",
    QType.Q5_1: "gguf::Q5_1", QType.Q8_0: "gguf::Q8_0",
    QType.Q2_K: "gguf::Q2_K", QType.Q3_K: "gguf::Q3_K", QType.Q4_K: "gguf::Q4_K",
    QType.Q5_K: "gguf::Q5_K", QType.Q6_K: "gguf::Q6_K",
}
_PLAIN = frozenset({QType.F32, QType.F16, QType.BF16})
_EXPRS = tuple(f"embed_kernel<{t}, {v}>" for q, t in TRAITS.items()
               for v in (("false",) if q in _PLAIN else ("false", "true"))) + ("feed_tokens_kernel",)
_THREADS = 128


@cache
def _kernel(qtype: QType, vec4: bool):
    return get_kernel("embed", f"embed_kernel<{TRAITS[qtype]}, {'true' if vec4 else 'false'}>",
                      name_expressions=_EXPRS)


@cache
def _feed_kernel():
    return get_kernel("embed", "feed_tokens_kernel", name_expressions=_EXPRS)


def embed(table: QuantTensor, ids, scale: float = 1.0, *, out=None):
    """Rows `ids` of a quantized table times `scale`: (T,) -> (T, hidden) float32.

    On the GPU: table on the device (QuantTensor.to_device()), ids a cupy int32 (T,) array. Ids
    are not range-checked there (that would need a sync); a row for an id outside the table
    comes out as NaN.
    """
    if is_host(ids):
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise GlimmerError(f"embed: token ids must be in [0, {table.shape[0]}), "
                               f"got {int(ids.min())}..{int(ids.max())}")
        return host_result(ref.embed(table, ids, scale), out)
    return _embed_gpu(table, ids, scale, out)


def _embed_gpu(table, ids, scale, out):
    op = "embed"
    check(ids, op, "ids", dtypes=(I32,), shape=("T",))
    if not isinstance(table, QuantTensor):
        raise fail(op, "table", "a QuantTensor", type(table).__name__)
    if table.qtype not in TRAITS:
        raise fail(op, "table.qtype", f"a type with a kernel ({'|'.join(q.name for q in TRAITS)})", table.qtype.name)
    if len(table.shape) != 2:
        raise fail(op, "table", "a matrix (rows, hidden)", table.shape)
    if not table.on_device:
        raise fail(op, "table", "on the device (QuantTensor.to_device())", "host data")
    if table.layout != "gguf":
        raise fail(op, "table", "GGUF block order (the CUDA executor keeps tables so)", table.layout)
    if type(table.data) is not type(ids) or not table.data.flags.c_contiguous:
        raise fail(op, "table", f"contiguous data of the same array class as ids ({type(ids).__name__})",
                   ("non-contiguous " if not table.data.flags.c_contiguous else "") + type(table.data).__name__)
    n_rows, cols = table.shape
    if out is None:
        import cupy
        out = cupy.empty((ids.shape[0], cols), dtype=np.float32)
    else:
        check_out(out, op, (ids.shape[0], cols), F32, like=ids)
    if ids.shape[0] == 0:
        return out
    quantized = table.qtype not in _PLAIN
    vec4 = quantized and aligned(out)
    units = cols // 32 if quantized else cols
    grid = (ids.shape[0], max(1, min(65535, (units + _THREADS - 1) // _THREADS)))
    _kernel(table.qtype, vec4)(
        grid, (_THREADS,),
        (out, table.data, ids, np.int32(n_rows), np.int32(cols),
         np.int64(row_bytes(table.qtype, cols)), np.float32(scale)))
    return out


def feed_tokens_(ids, feed, sampled) -> None:
    """ids[t] = sampled[feed[t]] wherever feed[t] >= 0; ids elsewhere unchanged. All int32: ids and
    feed (T,), sampled (R,), the previous step's sampled tokens.

    On the GPU feed is not range-checked (that would need a sync): the executor checks it on the
    host (runtime/pipeline.py's check_feed) before the step is launched."""
    if is_host(ids):
        feed, sampled = np.asarray(feed), np.asarray(sampled)
        if feed.shape != ids.shape:
            raise GlimmerError(f"feed_tokens_: feed must have the shape of ids {ids.shape}, got {feed.shape}")
        if feed.size and (feed.min() < -1 or feed.max() >= sampled.shape[0]):
            raise GlimmerError(f"feed_tokens_: feed must be in [-1, {sampled.shape[0]}) ({sampled.shape[0]} sampled "
                               f"rows), got {int(feed.min())}..{int(feed.max())}")
        ref.feed_tokens_(ids, feed, sampled)
        return
    _feed_gpu(ids, feed, sampled)


def _feed_gpu(ids, feed, sampled) -> None:
    op = "feed_tokens_"
    check(ids, op, "ids", dtypes=(I32,), shape=("T",))
    check(feed, op, "feed", dtypes=(I32,), shape=ids.shape, like=ids)
    check(sampled, op, "sampled", dtypes=(I32,), shape=("R",), like=ids)
    n = ids.shape[0]
    if n:
        _feed_kernel()(((n + _THREADS - 1) // _THREADS,), (_THREADS,), (ids, feed, sampled, np.int32(n)))
