"""ops.matmul_add_rms_norm_: a matmul, its output added into the residual stream and normed.

On the NumPy path it is quant_matmul, rms_norm and add_rms_norm_ one after another. On the GPU, at
decode width, the GEMV's last block does the norm (the norm tail, cuda_src/norm_row.cuh); there
the results are compared with the same three ops on the GPU (the GEMV is the same kernel, so y is
the same bits; the norm's sum runs in another order, so the normed values may differ in the last
place) and with a float64 norm of that y, and the codes with quantize_x's of the returned floats.
"""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.matmul_norm import fused
from glimmer_cupy.ops.q8 import Q8Rows
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks

gpu = pytest.mark.gpu
EPS = 1e-6


def weights(q, n, k, rng):
    return QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05))


def vectors(rng, m, n):
    residual = (3 * rng.standard_normal((m, n))).astype(np.float32)
    weight = (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)
    post = (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)
    return residual, weight, post


def rms(v, w):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + EPS) * w


def test_host_path_is_the_three_ops():
    rng = np.random.default_rng(1)
    w = weights(QType.Q4_K, 64, 256, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    residual, weight, post = vectors(rng, 3, 64)
    for p in (None, post):
        r1, r2 = residual.copy(), residual.copy()
        got = ops.matmul_add_rms_norm_(x, w, r1, weight, EPS, post=p, q8=True)
        y = ops.quant_matmul(x, w)
        if p is not None:
            y = ops.rms_norm(y, p, EPS)
        want = ops.add_rms_norm_(r2, y, weight, EPS)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(r1, r2)


def test_which_calls_run_the_tail():
    """A GEMV bucket at M <= 2 with whole packs (and groups, for codes) and aligned vectors."""
    v = np.zeros(1024, np.float32)
    rng = np.random.default_rng(0)
    q4k, q41, f16 = (weights(q, 4, 256, rng) for q in (QType.Q4_K, QType.Q4_1, QType.F16))
    assert fused(1, 1024, q4k, True, v) and fused(2, 1024, q41, True, v)
    assert not fused(3, 1024, q4k, True, v)                  # wider steps: the three ops
    assert not fused(1, 1024, f16, True, v)                  # float GEMV: no tail
    assert fused(1, 1028, q4k, False, v) and not fused(1, 1028, q4k, True, v)
    assert not fused(1, 1030, q4k, False, v)
    assert not fused(1, 1024, q4k, False, v[1:])             # 4-byte aligned only


# (type, M, N, K, post, q8): the layer shapes of the real models and Qwen3 (wo and down), rows of
# a GEMV block left over (N = 1028), and calls that take the three ops (M = 3, N % 4 != 0, F16)
CASES = [
    (QType.Q4_K, 1, 4096, 4096, False, True),
    (QType.Q4_K, 2, 1024, 2048, False, True),
    (QType.Q6_K, 1, 2048, 1536, False, True),
    (QType.Q6_K, 2, 1024, 3072, True, True),
    (QType.Q4_1, 1, 576, 1536, False, True),
    (QType.Q4_1, 2, 576, 576, False, True),
    (QType.Q8_0, 1, 640, 2048, True, True),
    (QType.Q5_0, 2, 640, 1024, True, False),
    (QType.Q4_K, 1, 1028, 1024, False, False),
    (QType.Q4_K, 3, 1024, 1024, True, True),
    (QType.Q8_0, 1, 1030, 640, False, True),
    (QType.F16, 1, 640, 640, True, True),
]


def _same_codes(got: Q8Rows):
    import cupy

    from glimmer_cupy.ops.matmul import quantize_x

    assert isinstance(got, Q8Rows)
    q, d, s = quantize_x(cupy.ascontiguousarray(got.x), "Q8_0")
    for name, a, b in (("q", got.q, q), ("d", got.d, d), ("s", got.s, s)):
        assert a.shape == b.shape and bool((a.view(cupy.int32) == b.view(cupy.int32)).all()), name


@gpu
@pytest.mark.parametrize("q,m,n,k,with_post,q8", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_against_the_three_ops(q, m, n, k, with_post, q8):
    import cupy

    rng = np.random.default_rng(m * n + k)
    w = weights(q, n, k, rng).to_device()
    x = cupy.asarray(rng.standard_normal((m, k)).astype(np.float32))
    residual, weight, post = (cupy.asarray(a) for a in vectors(rng, m, n))
    post = post if with_post else None
    r_fused, r_ops = residual.copy(), residual.copy()
    got = ops.matmul_add_rms_norm_(x, w, r_fused, weight, EPS, post=post, q8=q8)
    y = ops.quant_matmul(x, w)
    yp = y if post is None else ops.rms_norm(y, post, EPS)
    want = ops.add_rms_norm_(r_ops, yp, weight, EPS, q8=q8)
    tail = fused(m, n, w, q8, r_fused, weight)
    assert isinstance(got, Q8Rows) == isinstance(want, Q8Rows)
    gx, wx = (cupy.asnumpy(a.x if isinstance(a, Q8Rows) else a) for a in (got, want))
    rf, ro = cupy.asnumpy(r_fused), cupy.asnumpy(r_ops)
    assert np.isfinite(gx).all() and np.isfinite(rf).all()
    if post is None or not tail:
        np.testing.assert_array_equal(rf, ro)             # residual + y: the same adds
    else:
        np.testing.assert_allclose(rf, ro, rtol=1e-5, atol=1e-5)
    if tail:
        np.testing.assert_allclose(gx, wx, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(gx, wx)
    # against float64 norms of the GEMV's own y
    y64 = cupy.asnumpy(y).astype(np.float64)
    if post is not None:
        y64 = rms(y64, cupy.asnumpy(post).astype(np.float64))
    s64 = cupy.asnumpy(residual).astype(np.float64) + y64
    ref = rms(s64, cupy.asnumpy(weight).astype(np.float64))
    assert float(np.mean((gx - ref) ** 2) / np.mean(ref ** 2)) < 1e-12
    assert float(np.mean((rf - s64) ** 2) / np.mean(s64 ** 2)) < 1e-12
    if isinstance(got, Q8Rows):
        _same_codes(got)


@gpu
def test_tail_in_a_pdl_graph_equals_eager():
    """Four fused launches in a row, over three grid sizes, captured with PDL and replayed twice:
    the same bits as eager calls (the block counter is set back after every launch)."""
    import cupy

    from glimmer_cupy.kernels.launch import overlapped

    rng = np.random.default_rng(5)
    n = 1024
    mats = [weights(q, n, n, rng).to_device() for q in (QType.Q4_K, QType.Q6_K, QType.Q8_0, QType.Q4_K)]
    norms = [cupy.asarray((1 + 0.2 * rng.standard_normal(n)).astype(np.float32)) for _ in mats]
    start = cupy.asarray((3 * rng.standard_normal((1, n))).astype(np.float32))
    residual = cupy.empty_like(start)

    def chain():
        h = ops.rms_norm(residual, norms[0], EPS, q8=True)
        for i, w in enumerate(mats):
            h = ops.matmul_add_rms_norm_(h, w, residual, norms[(i + 1) % len(norms)], EPS, q8=i < 3)
        return h

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, overlapped():
        residual[...] = start
        eager = chain().copy()
        eager_res = residual.copy()
        residual[...] = start
        stream.synchronize()
        stream.begin_capture()
        out = chain()
        graph = stream.end_capture()
        for _ in range(2):
            residual[...] = start
            graph.launch(stream)
            stream.synchronize()
            assert bool((out == eager).all()) and bool((residual == eager_res).all())


@gpu
def test_bad_arguments_name_themselves():
    import cupy

    rng = np.random.default_rng(2)
    w = weights(QType.Q4_K, 256, 256, rng).to_device()
    x = cupy.zeros((1, 256), np.float32)
    good = cupy.zeros((1, 256), np.float32)
    vec = cupy.ones(256, np.float32)
    with pytest.raises(ValueError, match="matmul_add_rms_norm_: residual must be"):
        ops.matmul_add_rms_norm_(x, w, cupy.zeros((2, 256), np.float32), vec, EPS)
    with pytest.raises(ValueError, match="matmul_add_rms_norm_: weight must be"):
        ops.matmul_add_rms_norm_(x, w, good, cupy.ones(255, np.float32), EPS)
    with pytest.raises(ValueError, match="matmul_add_rms_norm_: post must be"):
        ops.matmul_add_rms_norm_(x, w, good, vec, EPS, post=np.ones(256, np.float32))
    with pytest.raises(ValueError, match="matmul_add_rms_norm_: x must be"):
        ops.matmul_add_rms_norm_(cupy.zeros((1, 128), np.float32), w, good, vec, EPS)
