"""Argument checks at the op boundary, before any launch.

CuPy's RawKernel checks nothing: a float16 array, a transposed view or a short `out` would be
read as whatever the kernel expects. So every GPU op checks its arguments once, here, and a bad
one raises a ValueError that names the op, the argument, what it must be and what it is:

    check(x, "rms_norm", "x", dtypes=(np.float32,), shape=(..., "d"))
    -> rms_norm: x must be contiguous float32 (..., d), got float16 (7, 4096)

These functions only read `.dtype`, `.shape`, `.flags` and the array's class, so they work the
same on NumPy arrays (which is how the CPU tests exercise them) and on CuPy arrays.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..errors import GlimmerError

F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


class OpArgumentError(GlimmerError, ValueError):
    """An op was called with an argument it cannot take (dtype, shape, layout, array type)."""


def fail(op: str, arg: str, must: str, got) -> OpArgumentError:
    """The error for `op: arg must be <must>, got <got>` (return it; the caller raises)."""
    return OpArgumentError(f"{op}: {arg} must be {must}, got {got}")


def array_kind(a) -> str:
    """'cupy.ndarray', 'numpy.ndarray', 'float', ...: the class as a user would write it."""
    t = type(a)
    module = t.__module__.split(".")[0]
    return f"{module}.{t.__name__}" if module != "builtins" else t.__name__


def describe(a) -> str:
    """'float16 (7, 4096)', 'non-contiguous float32 (7, 4096)', or the class of a non-array."""
    if not (hasattr(a, "dtype") and hasattr(a, "shape") and hasattr(a, "flags")):
        return array_kind(a)
    layout = "" if a.flags.c_contiguous else "non-contiguous "
    return f"{layout}{np.dtype(a.dtype).name} {_shape_str(a.shape)}"


def _shape_str(shape: Iterable) -> str:
    parts = ["..." if s is Ellipsis else str(s) for s in shape]
    if parts == ["..."]:
        return "(any shape)"
    return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"


def _dims_match(actual: tuple[int, ...], shape: tuple) -> bool:
    """shape entries: int = that size, str or None = any size; a leading ... = any leading dims."""
    if shape and shape[0] is Ellipsis:
        tail = shape[1:]
        if len(actual) < len(tail):
            return False
        actual = actual[len(actual) - len(tail):]
        shape = tail
    elif len(actual) != len(shape):
        return False
    return all(not isinstance(want, int) or want == got for want, got in zip(shape, actual))


_DEFAULT_LABELS = {1: ("n",), 2: ("n", "d"), 3: ("t", "h", "d")}


def _want(dtypes: tuple, contiguous: bool, shape: tuple | None) -> str:
    """'contiguous float32 (..., d)': what check() asked for, for its message."""
    want = " ".join(w for w in ("contiguous" if contiguous else "", "|".join(d.name for d in dtypes)) if w)
    if shape is not None:
        want += " " + _shape_str("?" if s is None else s for s in shape)
    return want


def check(a, op: str, arg: str, *, dtypes=(F32,), ndim: int | None = None, shape: tuple | None = None,
          contiguous: bool = True, like=None) -> None:
    """Raise OpArgumentError unless `a` is an array of one of `dtypes`, C-contiguous (unless
    contiguous=False), with `ndim` dimensions or matching `shape`, and of the same array class
    as `like` (a CuPy op given a NumPy weight fails here, not in the launch).

    shape: a tuple of ints (that size), strings (any size; the label shows in the message), None
    (any size), optionally starting with ... (any number of leading dimensions).

    Runs for every argument of every op call, so the message is built only when it is raised.
    """
    if shape is None and ndim is not None:
        shape = _DEFAULT_LABELS.get(ndim, tuple(f"d{i}" for i in range(ndim)))
    if like is not None and type(a) is not type(like):
        want = _want(_dtypes(dtypes), contiguous, shape)
        raise fail(op, arg, f"a {array_kind(like)} like the other arguments ({want})", array_kind(a))
    dt = getattr(a, "dtype", None)
    if dt is None or not (hasattr(a, "shape") and hasattr(a, "flags")):
        raise fail(op, arg, f"an array ({_want(_dtypes(dtypes), contiguous, shape)})", array_kind(a))
    ok = dt in dtypes or np.dtype(dt) in _dtypes(dtypes)
    ok = ok and (not contiguous or a.flags.c_contiguous)
    ok = ok and (shape is None or _dims_match(tuple(a.shape), tuple(shape)))
    if not ok:
        raise fail(op, arg, _want(_dtypes(dtypes), contiguous, shape), describe(a))


def _dtypes(dtypes) -> tuple:
    return tuple(np.dtype(d) for d in dtypes)


def check_out(out, op: str, shape: tuple[int, ...], dtype=F32, like=None) -> None:
    """`out` must be a contiguous array of exactly this shape and dtype."""
    check(out, op, "out", dtypes=(dtype,), shape=tuple(shape), like=like)


def no_overlap(a, b, op: str, arg_a: str, arg_b: str) -> None:
    """Raise unless the memory of arrays a and b is disjoint (for kernels with __restrict__ pointers)."""
    a0, b0 = _ptr(a), _ptr(b)
    if a0 is None or b0 is None:
        return
    if a0 < b0 + b.nbytes and b0 < a0 + a.nbytes:
        raise fail(op, arg_a, f"memory disjoint from {arg_b}", "an overlapping array")


def _ptr(a) -> int | None:
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)                    # cupy
    if ptr is None and isinstance(a, np.ndarray):
        ptr = a.__array_interface__["data"][0]
    return None if ptr is None else int(ptr)


def data_ptr(a) -> int:
    """Device (CuPy) or host (NumPy) address of the first element."""
    p = _ptr(a)
    if p is None:
        raise TypeError(f"no data pointer on {array_kind(a)}")
    return p


def aligned(*arrays, to: int = 16) -> bool:
    """True when every array's first element sits on a `to`-byte boundary (vector loads)."""
    return all(data_ptr(a) % to == 0 for a in arrays)


def out_or_inplace(out, x, op: str):
    """A new array like x, or `out` checked to be like x and either x itself or disjoint from it."""
    if out is None:
        import cupy
        return cupy.empty_like(x)
    check_out(out, op, x.shape, x.dtype, like=x)
    if data_ptr(out) != data_ptr(x):             # exactly in place is fine, a shifted overlap is not
        no_overlap(out, x, op, "out", "x")
    return out
