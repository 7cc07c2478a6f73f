"""Gated activations and elementwise ops (kernels: cuda_src/activation.cu)."""

from functools import cache

import numpy as np

from ..kernels.build import get_kernel
from ..reference import activation as ref
from ._check import (
    F32,
    aligned,
    check,
    check_out,
    fail,
    no_overlap,
    out_or_inplace,
)
from ._dispatch import host_result, is_host
from .q8 import NO_CODES, q8_buffers, staged_args, staged_buffer, wants_q8, wants_staged, with_codes

_CTYPE = {F32: "float"}
_GATED = {"silu_mul": "Silu", "gelu_mul": "GeluTanh"}
_UNARY = {"softcap": "Softcap", "scale": "Scale"}
_EXPRS = tuple([f"gated_kernel<{a}, {t}, {v}, {q}>" for a in _GATED.values() for t in _CTYPE.values()
                for v, q in ((1, "false, false"), (4, "false, false"), (4, "true, false"), (4, "true, true"))]
               + [f"unary_kernel<{a}, {t}, {v}>" for a in _UNARY.values() for t in _CTYPE.values() for v in (1, 4)])
_THREADS = 256
_MAX_BLOCKS = 4096          # grid-stride beyond this (about 31 blocks of 256 per H200 SM)


@cache
def _kernel(family: str, functor: str, dtype: np.dtype, vec: int, q8: bool | None = None, st: bool = False):
    tail = "" if q8 is None else f", {'true' if q8 else 'false'}, {'true' if st else 'false'}"
    return get_kernel("activation", f"{family}<{functor}, {_CTYPE[dtype]}, {vec}{tail}>", name_expressions=_EXPRS)


def silu_mul(gate_up, *, out=None, q8: bool = False):
    """(T, 2F), gate first -> silu(gate) * up, (T, F). q8: on the GPU, for T a dp4a GEMV serves,
    return Q8Rows (the output and its int8 codes, ops/q8.py)."""
    if is_host(gate_up):
        return host_result(ref.silu_mul(gate_up), out)
    return _gated_gpu("silu_mul", gate_up, out, q8)


def gelu_mul(gate_up, *, out=None, q8: bool = False):
    """(T, 2F), gate first -> gelu_tanh(gate) * up, (T, F). q8: as silu_mul."""
    if is_host(gate_up):
        return host_result(ref.gelu_mul(gate_up), out)
    return _gated_gpu("gelu_mul", gate_up, out, q8)


def softcap(x, cap: float, *, out=None):
    """cap * tanh(x / cap), elementwise; on the GPU out may be x."""
    if is_host(x):
        return host_result(ref.softcap(x, cap), out)
    if not cap > 0:
        raise fail("softcap", "cap", "positive", cap)
    return _unary_gpu("softcap", x, cap, out)


def scale(x, s: float, *, out=None):
    """x * s, elementwise; on the GPU out may be x."""
    if is_host(x):
        return host_result(ref.scale(x, s), out)
    return _unary_gpu("scale", x, s, out)


def _gated_gpu(op: str, gate_up, out, q8=False):
    check(gate_up, op, "gate_up", dtypes=tuple(_CTYPE), shape=(..., "2F"))
    two_f = gate_up.shape[-1]                          # check() guarantees ndim >= 1
    if two_f % 2 or two_f == 0:
        raise fail(op, "gate_up", "(..., 2F) with an even, non-zero last axis", tuple(gate_up.shape))
    f = two_f // 2
    shape = (*gate_up.shape[:-1], f)
    if out is None:
        import cupy
        out = cupy.empty(shape, dtype=gate_up.dtype)
    else:
        check_out(out, op, shape, gate_up.dtype, like=gate_up)
        no_overlap(out, gate_up, op, "out", "gate_up")
    rows = gate_up.size // two_f
    if rows == 0:
        return out
    vec = 4 if f % 4 == 0 and aligned(gate_up, out) else 1
    grid = (rows, (f // vec + _THREADS - 1) // _THREADS)
    codes = q8_buffers(rows, f) if q8 and gate_up.ndim == 2 and wants_q8(rows, f, vec == 4) else None
    staged = staged_buffer(rows, f) if codes is not None and wants_staged(rows, f, vec == 4) else None
    _kernel("gated_kernel", _GATED[op], gate_up.dtype, vec, codes is not None, staged is not None)(
        grid, (_THREADS,), (out, gate_up, np.int32(f), *(codes or NO_CODES), *staged_args(staged)))
    return with_codes(out, codes, staged)


def _unary_gpu(op: str, x, a: float, out):
    check(x, op, "x", dtypes=tuple(_CTYPE), shape=(...,))
    out = out_or_inplace(out, x, op)
    n = x.size
    if n == 0:
        return out
    vec = 4 if n % 4 == 0 and aligned(x, out) else 1
    blocks = max(1, min(_MAX_BLOCKS, (n // vec + _THREADS - 1) // _THREADS))
    _kernel("unary_kernel", _UNARY[op], x.dtype, vec)((blocks,), (_THREADS,), (out, x, np.int64(n), np.float32(a)))
    return out
