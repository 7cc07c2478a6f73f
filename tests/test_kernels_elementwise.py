"""The small decoder-layer kernels (norm.cu, rope.cu, activation.cu, embed.cu) against their
NumPy references, the argument checks in front of them, and the GGUF block-decoding traits
(quant_blocks.cuh) against gguf-py.

GPU tests (marker `gpu`) skip without a CUDA device. They draw fresh random inputs of odd sizes,
fill every output with NaN first, and compare with the reference by NMSE = mse(out, ref) /
mse(ref, 0) under the budgets below. The argument checks and the block traits run on CPU: the
checks raise before anything touches the device, and the traits are plain __host__ __device__
code that a C++ host harness compiles (g++, or nvcc) and runs against gguf.quants.dequantize.
"""

from __future__ import annotations

import ctypes
import importlib
import zlib
from pathlib import Path

import numpy as np
import pytest
from host_harness import build_host_library
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize

from glimmer_cupy import ops
from glimmer_cupy.errors import GlimmerError
from glimmer_cupy.reference import activation as ref_act
from glimmer_cupy.reference import matmul as ref_matmul
from glimmer_cupy.reference import norm as ref_norm
from glimmer_cupy.reference import rope as ref_rope
from glimmer_cupy.runtime.device import cuda_device_count
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks

# NMSE budgets, one per op. The kernels do float32 math with the accurate library functions
# (expf, tanhf, sincosf, rsqrtf: <= 2 ulp), so the expected NMSE is ~1e-14; RoPE angles are
# formed and range-reduced in double (rope.cu), so positions up to 2^17 stay at that level too.
# Block decoding does gguf-py's float32 operations in its order: exact up to FMA contraction.
NMSE_BUDGET = {
    "rms_norm": 1e-10,
    "add_rms_norm_": 1e-10,
    "qk_norm": 1e-10,
    "rope": 1e-10,
    "silu_mul": 1e-10,
    "gelu_mul": 1e-10,
    "softcap": 1e-10,
    "scale": 1e-12,
    "embed": 1e-12,
}

HAS_GPU = cuda_device_count() > 0
REPO = Path(__file__).resolve().parents[1]


def gpu(test):
    """Marker `gpu` plus a clean skip on machines without a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")(test))


def op_module(name: str):
    # glimmer_cupy.ops re-exports the functions under the module names, so go through importlib
    return importlib.import_module(f"glimmer_cupy.ops.{name}")


def nmse(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.mean((out - ref) ** 2) / np.mean(ref ** 2))


def assert_close(op: str, out, ref) -> None:
    import cupy
    host = cupy.asnumpy(out)
    assert host.shape == ref.shape, f"{op}: shape {host.shape}, reference {ref.shape}"
    assert np.isfinite(host).all(), f"{op}: {np.count_nonzero(~np.isfinite(host))} outputs not written (still NaN) or not finite"
    err = nmse(host, ref)
    assert err <= NMSE_BUDGET[op], f"{op}: NMSE {err:.3e} over budget {NMSE_BUDGET[op]:.0e}"


def poisoned(shape, dtype=np.float32):
    import cupy
    return cupy.full(shape, np.nan, dtype=dtype)


def misaligned(host: np.ndarray):
    """A contiguous device copy whose first element is 4 bytes off a 16-byte boundary (scalar path)."""
    import cupy
    buf = cupy.empty(host.size + 1, dtype=host.dtype)
    view = buf[1:].reshape(host.shape)
    view[...] = cupy.asarray(host)
    assert view.flags.c_contiguous and view.data.ptr % 16 != 0
    return view


def fresh_rng(*key) -> np.random.Generator:
    """A new stream per test case (seeded from its parameters, so a failure reproduces)."""
    return np.random.default_rng([zlib.crc32(repr(k).encode()) for k in key] + [20261129])


# ------------------------------------------------------------------------------------------ GPU

ROWS = (1, 7, 33)
WIDTHS = (64, 576, 640, 1024, 2560, 4097, 12288, 20484)   # the last two: packs past the two a thread keeps


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d", WIDTHS)
def test_rms_norm(rows, d):
    import cupy
    rng = fresh_rng("rms_norm", rows, d)
    x = rng.normal(0, 3, (rows, d)).astype(np.float32)
    w = rng.normal(1, 0.2, d).astype(np.float32)
    out = poisoned((rows, d))
    got = ops.rms_norm(cupy.asarray(x), cupy.asarray(w), 1e-6, out=out)
    assert got is out
    assert_close("rms_norm", out, ref_norm.rms_norm(x, w, 1e-6))
    # allocating form, and the scalar path on a misaligned input
    assert_close("rms_norm", ops.rms_norm(misaligned(x), cupy.asarray(w), 1e-6), ref_norm.rms_norm(x, w, 1e-6))


@gpu
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("d", WIDTHS)
def test_add_rms_norm_(rows, d):
    import cupy
    rng = fresh_rng("add_rms_norm_", rows, d)
    res = rng.normal(0, 3, (rows, d)).astype(np.float32)
    delta = rng.normal(0, 1, (rows, d)).astype(np.float32)
    w = rng.normal(1, 0.2, d).astype(np.float32)
    res_d = cupy.asarray(res)
    out = poisoned((rows, d))
    got = ops.add_rms_norm_(res_d, cupy.asarray(delta), cupy.asarray(w), 1e-5, out=out)
    assert got is out
    res_ref = res.copy()
    want = ref_norm.add_rms_norm_(res_ref, delta, w, 1e-5)
    np.testing.assert_array_equal(cupy.asnumpy(res_d), res_ref)        # a float32 add is exact to compare
    assert_close("add_rms_norm_", out, want)


@gpu
@pytest.mark.parametrize("t,heads,head_dim", [(1, 16, 256), (7, 3, 64), (33, 8, 128), (5, 2, 80)])
def test_qk_norm(t, heads, head_dim):
    """Per-head q/k RMSNorm: the same op over the last axis of (T, heads, head_dim)."""
    import cupy
    rng = fresh_rng("qk_norm", t, heads, head_dim)
    q = rng.normal(0, 2, (t, heads, head_dim)).astype(np.float32)
    w = rng.normal(1, 0.2, head_dim).astype(np.float32)
    out = poisoned(q.shape)
    ops.rms_norm(cupy.asarray(q), cupy.asarray(w), 1e-6, out=out)
    assert_close("qk_norm", out, ref_norm.rms_norm(q, w, 1e-6))


@gpu
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("t,heads,head_dim,rot_dim", [
    (1, 32, 128, None), (7, 3, 64, None), (33, 8, 128, None), (5, 4, 64, 32), (3, 2, 80, 40), (2, 1, 256, 128)])
@pytest.mark.parametrize("base", [10000.0, 1e6])
def test_rope(neox, t, heads, head_dim, rot_dim, base):
    import cupy
    rng = fresh_rng("rope", neox, t, heads, head_dim, rot_dim, base)
    x = rng.normal(0, 1, (t, heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, 1 << 17, t).astype(np.int32)
    pos[0] = 0                                              # the identity rotation
    want = ref_rope.rope(x, pos, base, neox, rot_dim)
    out = poisoned(x.shape)
    got = ops.rope(cupy.asarray(x), cupy.asarray(pos), base, neox, rot_dim, out=out)
    assert got is out
    assert_close("rope", out, want)
    np.testing.assert_array_equal(cupy.asnumpy(out)[0], x[0])
    if rot_dim is not None:                                 # features past rot_dim are copied
        np.testing.assert_array_equal(cupy.asnumpy(out)[..., rot_dim:], x[..., rot_dim:])
    x_d = cupy.asarray(x)                                   # in place
    ops.rope(x_d, cupy.asarray(pos), base, neox, rot_dim, out=x_d)
    assert_close("rope", x_d, want)


@gpu
@pytest.mark.parametrize("op", ["silu_mul", "gelu_mul"])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("f", WIDTHS)
def test_gated(op, rows, f):
    import cupy
    rng = fresh_rng(op, rows, f)
    gu = rng.normal(0, 2, (rows, 2 * f)).astype(np.float32)
    want = getattr(ref_act, op)(gu)
    out = poisoned((rows, f))
    got = getattr(ops, op)(cupy.asarray(gu), out=out)
    assert got is out
    assert_close(op, out, want)
    assert_close(op, getattr(ops, op)(misaligned(gu)), want)


@gpu
@pytest.mark.parametrize("shape", [(1, 640), (7, 4097), (33, 2560), (3, 5, 99), (262144,)])
def test_softcap_and_scale(shape):
    import cupy
    rng = fresh_rng("unary", shape)
    x = rng.normal(0, 40, shape).astype(np.float32)
    for op, arg, want in [("softcap", 30.0, ref_act.softcap(x, 30.0)),
                          ("scale", 25.29822128134704, ref_act.scale(x, 25.29822128134704))]:
        out = poisoned(shape)
        assert getattr(ops, op)(cupy.asarray(x), arg, out=out) is out
        assert_close(op, out, want)
        x_d = cupy.asarray(x)
        getattr(ops, op)(x_d, arg, out=x_d)                 # in place
        assert_close(op, x_d, want)
        assert_close(op, getattr(ops, op)(misaligned(x), arg), want)


EMBED_TYPES = {  # type -> widths (multiples of the block size; odd block counts on purpose)
    QType.F32: (64, 4097), QType.F16: (576, 4097), QType.BF16: (640, 99),
    QType.Q4_0: (64, 576), QType.Q4_1: (640,), QType.Q5_0: (576,), QType.Q5_1: (2560,),
    QType.Q8_0: (64, 576, 4096 + 32), QType.Q2_K: (768,), QType.Q3_K: (2560,),
    QType.Q4_K: (256, 768, 2560), QType.Q5_K: (768,), QType.Q6_K: (256, 768, 2560),
}


@gpu
@pytest.mark.parametrize("qtype,cols", [(q, c) for q, cs in EMBED_TYPES.items() for c in cs],
                         ids=lambda v: v.name if isinstance(v, QType) else str(v))
@pytest.mark.parametrize("t", ROWS)
def test_embed(qtype, cols, t):
    import cupy
    rng = fresh_rng("embed", qtype, cols, t)
    n_rows = 301
    table = QuantTensor("token_embd", qtype, (n_rows, cols), random_blocks(qtype, n_rows, cols, rng, std=1.0))
    ids = rng.integers(0, n_rows, t).astype(np.int32)
    ids[-1] = n_rows - 1                                    # the last row, and repeats at t = 33
    dev = table.to_device()
    for scale in (1.0, 25.29822128134704):
        want = ref_matmul.embed(table, ids, scale)
        out = poisoned((t, cols))
        assert ops.embed(dev, cupy.asarray(ids), scale, out=out) is out
        assert_close("embed", out, want)
        assert_close("embed", ops.embed(dev, cupy.asarray(ids), scale, out=misaligned(np.full((t, cols), np.nan, np.float32))), want)


@gpu
def test_embed_out_of_range_id_gives_nan_row():
    import cupy
    rng = fresh_rng("embed_nan")
    table = QuantTensor("t", QType.Q4_K, (10, 256), random_blocks(QType.Q4_K, 10, 256, rng)).to_device()
    out = cupy.asnumpy(ops.embed(table, cupy.asarray(np.array([3, 10, -1, 9], np.int32))))
    assert np.isfinite(out[[0, 3]]).all() and np.isnan(out[[1, 2]]).all()


@gpu
def test_feed_tokens_kernel_matches_reference():
    import cupy

    rng = np.random.default_rng(3)
    for t, r in ((1, 1), (7, 3), (130, 64), (512, 512)):
        ids = rng.integers(0, 1000, t).astype(np.int32)
        feed = np.where(rng.random(t) < 0.5, -1, rng.integers(0, r, t)).astype(np.int32)
        sampled = rng.integers(0, 1000, r).astype(np.int32)
        want = ids.copy()
        ops.feed_tokens_(want, feed, sampled)
        d = cupy.asarray(ids)
        ops.feed_tokens_(d, cupy.asarray(feed), cupy.asarray(sampled))
        assert cupy.asnumpy(d).tolist() == want.tolist(), (t, r)


# ------------------------------------------------------------------ CPU: argument checks
# The GPU branches check everything before touching CuPy, so NumPy arrays reach the checks here.

class OtherArray(np.ndarray):
    """Stands in for "an array of another library" (a NumPy weight passed to a CuPy op)."""


def f32(*shape):
    return np.ones(shape, np.float32)


def raises(match_all, fn, *args, **kw):
    with pytest.raises(ValueError) as e:
        fn(*args, **kw)
    msg = str(e.value)
    for piece in match_all:
        assert piece in msg, f"{piece!r} not in {msg!r}"
    return msg


def test_check_message_format():
    from glimmer_cupy.ops._check import check
    msg = raises([], check, np.zeros((7, 4096), np.float16), "rms_norm", "x", dtypes=(np.float32,), ndim=2)
    assert msg == "rms_norm: x must be contiguous float32 (n, d), got float16 (7, 4096)"
    msg = raises([], check, f32(7, 4096).T, "rms_norm", "x", shape=(..., "d"))
    assert msg == "rms_norm: x must be contiguous float32 (..., d), got non-contiguous float32 (4096, 7)"
    check(f32(2, 3, 5), "op", "x", shape=(..., 5))          # leading dims are free
    check(f32(5), "op", "x", shape=(..., 5))
    raises(["op: x must be", "(..., 5)", "(2, 4)"], check, f32(2, 4), "op", "x", shape=(..., 5))
    raises(["a numpy.ndarray like the other arguments", "OtherArray"],
           check, f32(3).view(OtherArray), "op", "w", like=f32(3))
    raises(["op: x must be an array", "list"], check, [1.0], "op", "x")


def test_rms_norm_rejects_bad_arguments():
    norm = op_module("norm")
    raises(["rms_norm", "x", "float32", "float16 (7, 64)"], norm._rms_norm_gpu,
           np.ones((7, 64), np.float16), f32(64), 1e-6, None)
    raises(["rms_norm", "x", "non-contiguous float32 (64, 7)"], norm._rms_norm_gpu, f32(7, 64).T, f32(7), 1e-6, None)
    raises(["rms_norm: weight must be contiguous float32 (64,), got float32 (65,)"],
           norm._rms_norm_gpu, f32(7, 64), f32(65), 1e-6, None)
    raises(["rms_norm: out must be contiguous float32 (7, 64), got float32 (7, 65)"],
           norm._rms_norm_gpu, f32(7, 64), f32(64), 1e-6, f32(7, 65))
    raises(["rms_norm", "weight", "OtherArray"], norm._rms_norm_gpu, f32(7, 64), f32(64).view(OtherArray), 1e-6, None)
    raises(["add_rms_norm_: delta must be contiguous float32 (7, 64), got float32 (7, 32)"],
           norm._add_rms_norm_gpu, f32(7, 64), f32(7, 32), f32(64), 1e-6, None)
    raises(["add_rms_norm_", "residual", "float64"], norm._add_rms_norm_gpu,
           np.ones((7, 64)), f32(7, 64), f32(64), 1e-6, None)
    r = f32(7, 64)
    raises(["add_rms_norm_: out must be memory disjoint from residual"], norm._add_rms_norm_gpu,
           r, f32(7, 64), f32(64), 1e-6, r)


def test_rope_rejects_bad_arguments():
    rope = op_module("rope")
    pos = np.zeros(5, np.int32)
    raises(["rope: positions must be contiguous int32 (5,), got int64 (5,)"],
           rope._rope_gpu, f32(5, 2, 64), np.zeros(5, np.int64), 1e4, True, None, None)
    raises(["rope: x must be contiguous float32 (T, heads, head_dim), got float32 (5, 128)"],
           rope._rope_gpu, f32(5, 128), pos, 1e4, True, None, None)
    raises(["rope: rot_dim must be even", "got 33"], rope._rope_gpu, f32(5, 2, 64), pos, 1e4, True, 33, None)
    raises(["rope: rot_dim", "got 128"], rope._rope_gpu, f32(5, 2, 64), pos, 1e4, False, 128, None)
    raises(["rope: out must be contiguous float32 (5, 2, 64), got float32 (5, 2, 32)"],
           rope._rope_gpu, f32(5, 2, 64), pos, 1e4, False, None, f32(5, 2, 32))
    x = f32(5, 2, 64)
    raises(["rope: out must be memory disjoint from x"], rope._rope_gpu, x[1:], pos[1:], 1e4, False, None, x[:4])


def test_activations_reject_bad_arguments():
    act = op_module("activation")
    raises(["silu_mul: gate_up must be", "even", "(7, 9)"], act._gated_gpu, "silu_mul", f32(7, 9), None)
    raises(["gelu_mul: out must be contiguous float32 (7, 32), got float32 (7, 64)"],
           act._gated_gpu, "gelu_mul", f32(7, 64), f32(7, 64))
    raises(["gelu_mul: gate_up must be contiguous float32", "float16 (7, 64)"],
           act._gated_gpu, "gelu_mul", np.ones((7, 64), np.float16), None)
    raises(["softcap: x must be contiguous float32", "got float64 (3,)"], act._unary_gpu, "softcap", np.ones(3), 30.0, None)
    raises(["scale: out must be contiguous float32 (3, 4), got float32 (4, 3)"],
           act._unary_gpu, "scale", f32(3, 4), 2.0, f32(4, 3))


def test_embed_rejects_bad_arguments(monkeypatch):
    embed = op_module("embed")
    rng = np.random.default_rng(0)
    table = QuantTensor("t", QType.Q4_K, (10, 256), random_blocks(QType.Q4_K, 10, 256, rng))
    ids = np.zeros(3, np.int32)
    raises(["embed: ids must be contiguous int32 (T,), got int64 (3,)"],
           embed._embed_gpu, table, np.zeros(3, np.int64), 1.0, None)
    raises(["embed: table must be on the device"], embed._embed_gpu, table, ids, 1.0, None)
    raises(["embed: table must be a QuantTensor, got ndarray"], embed._embed_gpu, f32(10, 256), ids, 1.0, None)
    monkeypatch.delitem(embed.TRAITS, QType.Q4_K)
    raises(["embed: table.qtype must be a type with a kernel", "got Q4_K"], embed._embed_gpu, table, ids, 1.0, None)


def test_feed_tokens_reference():
    ids = np.array([5, 6, 7, 8], np.int32)
    ops.feed_tokens_(ids, np.array([-1, 2, 0, -1], np.int32), np.array([40, 41, 42], np.int32))
    assert ids.tolist() == [5, 42, 40, 8]
    with pytest.raises(GlimmerError, match=r"feed must be in \[-1, 3\)"):
        ops.feed_tokens_(ids, np.array([-1, 3, 0, -1], np.int32), np.array([40, 41, 42], np.int32))
    with pytest.raises(GlimmerError, match="shape of ids"):
        ops.feed_tokens_(ids, np.array([0], np.int32), np.array([40], np.int32))


def test_feed_tokens_rejects_bad_arguments():
    embed = op_module("embed")
    ids = np.zeros(3, np.int32)
    raises(["feed_tokens_: ids must be contiguous int32 (T,), got int64 (3,)"],
           embed._feed_gpu, np.zeros(3, np.int64), ids, ids)
    raises(["feed_tokens_: feed must be contiguous int32 (3,), got int32 (4,)"],
           embed._feed_gpu, ids, np.zeros(4, np.int32), ids)
    raises(["feed_tokens_: sampled must be a numpy.ndarray like the other arguments", "OtherArray"],
           embed._feed_gpu, ids, ids, ids.view(OtherArray))


def test_every_supported_type_has_an_embed_kernel():
    from glimmer_cupy.weights.quant_tensor import SUPPORTED_TYPES
    assert set(op_module("embed").TRAITS) == set(SUPPORTED_TYPES)


def test_host_paths_take_out():
    """The NumPy branches keep their results and also fill `out` when given one."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    out = np.full((3, 8), np.nan, np.float32)
    assert ops.rms_norm(x, w, 1e-6, out=out) is out
    np.testing.assert_array_equal(out, ops.rms_norm(x, w, 1e-6))
    out4 = np.full((3, 4), np.nan, np.float32)
    assert ops.silu_mul(x, out=out4) is out4
    np.testing.assert_array_equal(out4, ops.silu_mul(x))


# ------------------------------------------------------------ CPU: block-decoding traits

HARNESS = r"""
#include "quant_blocks.cuh"
#define GQ_EXPORT extern "C" __attribute__((visibility("default")))

template <class QT>
static void decode(const void* row, long long n, int mode, float* out) {
    if (mode == 0) {
        for (long long i = 0; i < n; ++i) out[i] = gguf::row_value<QT>(row, i);
    } else {
        for (long long s = 0; s < n / 32; ++s) gguf::row_sub_block<QT>(row, s, out + 32 * s);
    }
}

#define GQ_TYPES(X) X(F32) X(F16) X(BF16) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) \
                    X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K)

// mode 0: value by value (row_value); mode 1: by 32-value sub-blocks (row_sub_block).
GQ_EXPORT int gq_decode(int type, const void* row, long long n, int mode, float* out) {
    switch (type) {
#define GQ_CASE(QT) case gguf::QT::kType: decode<gguf::QT>(row, n, mode, out); return 0;
        GQ_TYPES(GQ_CASE)
    }
    return -1;
}

// Values and bytes per block as the traits declare them; -2 if sizeof(block) disagrees.
GQ_EXPORT int gq_geometry(int type, int* values, int* bytes) {
    switch (type) {
#define GQ_GEOM(QT) case gguf::QT::kType: *values = gguf::QT::kValues; *bytes = gguf::QT::kBytes; \
        return (int)sizeof(gguf::QT::block) == gguf::QT::kBytes ? 0 : -2;
        GQ_TYPES(GQ_GEOM)
    }
    return -1;
}
"""

TRAIT_TYPES = [QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1,
               QType.Q8_0, QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]


@pytest.fixture(scope="module")
def traits_lib(tmp_path_factory):
    """quant_blocks.cuh compiled for the host as a shared library (g++, else nvcc)."""
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("traits"), "gq")
    dll.gq_decode.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
    dll.gq_geometry.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return dll


def gguf_values(qtype: QType, data: np.ndarray) -> np.ndarray:
    """The oracle: gguf-py's dequantizers (plain types by their definition)."""
    if qtype == QType.F32:
        return data.astype(np.float32)
    if qtype == QType.F16:
        return data.view(np.float16).astype(np.float32)
    if qtype == QType.BF16:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    with np.errstate(all="ignore"):
        return gguf_dequantize(data, qtype).astype(np.float32)


@pytest.mark.parametrize("qtype", TRAIT_TYPES, ids=lambda q: q.name)
def test_block_traits_geometry(traits_lib, qtype):
    values, nbytes = ctypes.c_int(), ctypes.c_int()
    assert traits_lib.gq_geometry(int(qtype), ctypes.byref(values), ctypes.byref(nbytes)) == 0
    assert (values.value, nbytes.value) == GGML_QUANT_SIZES[qtype]


@pytest.mark.parametrize("qtype", TRAIT_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("mode", [0, 1], ids=["value", "sub_block"])
@pytest.mark.parametrize("bytes_kind", ["valid", "random"])
def test_block_traits_match_gguf(traits_lib, qtype, mode, bytes_kind):
    """Bit-exact against gguf.quants.dequantize, on valid blocks and on arbitrary bytes (fp16
    scales that are subnormal, inf or NaN included: NaN must land in the same places)."""
    rng = np.random.default_rng([int(qtype), mode, bytes_kind == "random"])
    rows, cols = 6, 768                                     # 3 super-blocks / 24 small blocks a row
    data = np.ascontiguousarray(random_blocks(qtype, rows, cols, rng, std=1.0))
    if bytes_kind == "random":
        data = rng.integers(0, 256, data.nbytes, dtype=np.uint8).view(data.dtype).reshape(data.shape)
    want = gguf_values(qtype, data).reshape(rows, cols)
    got = np.full((rows, cols), np.nan, np.float32)
    for r in range(rows):
        row = np.ascontiguousarray(data[r])
        assert traits_lib.gq_decode(int(qtype), row.ctypes.data, cols, mode, got[r].ctypes.data) == 0
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.argwhere(~same)
    assert same.all(), f"{qtype.name}: {len(bad)} values differ, first at {bad[0].tolist()}: " \
                       f"{got[tuple(bad[0])]} vs gguf {want[tuple(bad[0])]}"
