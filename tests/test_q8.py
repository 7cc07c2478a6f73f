"""Producers of int8 activations (ops/q8.py): norms and gated activations asked for q8 on the GPU
return the same floats as without it, and codes bit-identical to quantize_x's of those floats; a
dp4a matmul given them returns exactly what it returns from the floats."""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.norm import ST_MAX_K, ST_MIN_K
from glimmer_cupy.ops.q8 import Q8_MAX_ROWS, ST_ROWS, Q8Rows, plain, staged_bytes, wants_q8, wants_staged

gpu = pytest.mark.gpu


def test_host_path_ignores_q8():
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    assert isinstance(ops.rms_norm(x, w, 1e-6, q8=True), np.ndarray)
    assert isinstance(ops.silu_mul(np.concatenate([x, x], 1), q8=True), np.ndarray)
    assert plain(x) is x


def test_wants_q8():
    assert wants_q8(1, 1024, True) and wants_q8(16, 32, True)
    assert wants_q8(32, 1024, True) and not wants_q8(33, 1024, True) and not wants_q8(4, 1000, True) and not wants_q8(4, 64, False)


def test_wants_staged(monkeypatch):
    """Images are made at the rows the table runs mma_st at (Q4_K's: Q6_K's start at 8) that have
    codes, for rows of whole super-blocks, and only where mma_st runs (sm_90)."""
    from glimmer_cupy.kernels import build
    from glimmer_cupy.ops.matmul import bucket
    from glimmer_cupy.weights.quant_tensor import QType

    assert list(ST_ROWS) == [m for m in range(1, Q8_MAX_ROWS + 1) if bucket(m, QType.Q4_K) == "mma_st"]
    assert all(bucket(m, QType.Q6_K) != "mma_st" or m in ST_ROWS for m in range(1, Q8_MAX_ROWS + 1))
    monkeypatch.setattr(build, "has_arch_specific", lambda: True)
    assert wants_staged(4, 1024, True) and wants_staged(16, 4096, True) and wants_staged(9, 12288, True)
    assert not wants_staged(3, 4096, True) and not wants_staged(33, 4096, True) and wants_staged(32, 4096, True)
    assert not wants_staged(8, 576, True) and not wants_staged(8, 4096, False) and wants_staged(8, 768, True)
    monkeypatch.setattr(build, "has_arch_specific", lambda: False)
    assert not wants_staged(16, 4096, True)
    assert staged_bytes(16, 4096) == 16 * 2208 * 2 and staged_bytes(5, 1024) == 4 * 2208


def _same_codes(got: Q8Rows, trait="Q8_0"):
    import cupy

    from glimmer_cupy.ops.matmul import quantize_x

    assert isinstance(got, Q8Rows)
    q, d, s = quantize_x(cupy.ascontiguousarray(got.x), trait)
    for name, a, b in (("q", got.q, q), ("d", got.d, d), ("s", got.s, s)):
        assert a.shape == b.shape and bool((a.view(cupy.int32) == b.view(cupy.int32)).all()), name


@gpu
@pytest.mark.parametrize("rows,d", [(1, 1024), (3, 576), (16, 2560), (5, 64), (3, 12288)])
def test_norms_make_quantize_x_codes(rows, d):
    import cupy

    rng = np.random.default_rng(rows * d)
    x = cupy.asarray((rng.standard_normal((rows, d)) * 4).astype(np.float32))
    w = cupy.asarray((1 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    delta = cupy.asarray(rng.standard_normal((rows, d)).astype(np.float32))
    plain_out = ops.rms_norm(x, w, 1e-6)
    got = ops.rms_norm(x, w, 1e-6, q8=True)
    assert bool((got.x == plain_out).all())
    _same_codes(got)
    r1, r2 = x.copy(), x.copy()
    a = ops.add_rms_norm_(r1, delta, w, 1e-6)
    b = ops.add_rms_norm_(r2, delta, w, 1e-6, q8=True)
    assert bool((a == b.x).all()) and bool((r1 == r2).all())
    _same_codes(b)


@gpu
@pytest.mark.parametrize("rows,d", [(4, 1024), (5, 4096), (9, 2048), (16, 4096), (3, 4096), (17, 4096), (8, 768),
                                    (12, 1280), (16, 12288), (32, 4096), (25, 12288)])
def test_producers_make_mma_st_images(rows, d):
    """At mma_st's rows a norm or gated activation asked for q8 also makes x's images, byte for byte
    those of mma_st's own stage launch on its output (the rows past M zeros), and a Q4_K matmul given
    them returns the bits it returns from the floats; elsewhere (the norms: rows narrower than a
    block or wider than its shared memory) it makes none."""
    import cupy

    from glimmer_cupy.kernels.build import has_arch_specific
    from glimmer_cupy.ops.matmul import mma_st_stage
    from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
    from glimmer_cupy.weights.random_blocks import random_blocks

    if not has_arch_specific():
        pytest.skip("mma_st's images are made on sm_90 only")
    rng = np.random.default_rng(rows * d + 1)
    x = cupy.asarray((rng.standard_normal((rows, d)) * 4).astype(np.float32))
    w = cupy.asarray((1 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    delta = cupy.asarray(rng.standard_normal((rows, d)).astype(np.float32))
    wt = QuantTensor("w", QType.Q4_K, (200, d), random_blocks(QType.Q4_K, 200, d, rng, 0.02)).to_device()
    made = (ops.rms_norm(x, w, 1e-6, q8=True), ops.add_rms_norm_(x.copy(), delta, w, 1e-6, q8=True),
            ops.silu_mul(cupy.concatenate([x, delta], 1), q8=True), ops.gelu_mul(cupy.concatenate([delta, x], 1), q8=True))
    for i, got in enumerate(made):
        assert isinstance(got, Q8Rows)
        _same_codes(got)
        if not wants_staged(rows, d, True) or (i < 2 and not ST_MIN_K <= d <= ST_MAX_K):
            assert got.st is None, (i, rows, d)
            continue
        want = mma_st_stage(cupy.ascontiguousarray(got.x))
        assert got.st.shape == want.shape and bool((got.st == want).all()), (i, rows, d)
        assert bool((ops.quant_matmul(got, wt) == ops.quant_matmul(got.x, wt)).all()), (i, rows, d)


@gpu
@pytest.mark.parametrize("op", ["silu_mul", "gelu_mul"])
@pytest.mark.parametrize("rows,f", [(1, 3072), (7, 1536), (16, 96)])
def test_gated_make_quantize_x_codes(op, rows, f):
    import cupy

    rng = np.random.default_rng(rows + f)
    gu = cupy.asarray((rng.standard_normal((rows, 2 * f)) * 3).astype(np.float32))
    want = getattr(ops, op)(gu)
    got = getattr(ops, op)(gu, q8=True)
    assert bool((got.x == want).all())
    _same_codes(got)


@gpu
def test_rows_no_int8_bucket_serves_get_plain_arrays():
    import cupy

    x = cupy.ones((33, 64), cupy.float32)
    assert isinstance(ops.rms_norm(x, cupy.ones(64, cupy.float32), 1e-6, q8=True), cupy.ndarray)
    assert isinstance(ops.silu_mul(cupy.ones((2, 100), cupy.float32), q8=True), cupy.ndarray)   # F % 32 != 0


@gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "F16"])
def test_matmul_on_codes_equals_matmul_on_floats(qtype):
    import cupy

    from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
    from glimmer_cupy.weights.random_blocks import random_blocks

    rng = np.random.default_rng(3)
    qt = QType[qtype]
    n, k = 96, 512
    if qt == QType.F16:
        wt = QuantTensor("w", qt, (n, k), rng.standard_normal((n, k)).astype(np.float16)).to_device()
    else:
        wt = QuantTensor("w", qt, (n, k), random_blocks(qt, n, k, rng, 0.02)).to_device()
    for rows in (1, 3, 16):
        x = cupy.asarray(rng.standard_normal((rows, k)).astype(np.float32))
        h = ops.rms_norm(x, cupy.ones(k, cupy.float32), 1e-6, q8=True)
        a = ops.quant_matmul(h, wt)
        b = ops.quant_matmul(h.x, wt)
        assert bool((a == b).all()), (qtype, rows)


def test_q8rows_reshape_keeps_rows():
    x = np.zeros((3, 4, 64), np.float32)
    r = Q8Rows(x, np.zeros((3, 64), np.int32), np.zeros((3, 8), np.float32), np.zeros((3, 8), np.float32))
    assert r.reshape(3, 256).shape == (3, 256) and r.reshape(3, 256).q is r.q
    with pytest.raises(ValueError, match="Q8Rows.reshape: 3 rows of codes, asked for shape \\(6, 128\\)"):
        r.reshape(6, 128)


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("splits", [1, 5])
@pytest.mark.parametrize("t", [1, 3, 16])
def test_attention_makes_quantize_x_codes(d, splits, t):
    """The kernel that writes the output (split kernel alone, or the combine) makes the codes."""
    import cupy

    rng = np.random.default_rng(d * 100 + splits * 10 + t)
    hq, hkv, n_cells, length = 8, 2, 300, 257
    q = cupy.asarray((rng.standard_normal((t, hq, d)) * 2).astype(np.float32))
    pool = lambda: cupy.asarray((rng.standard_normal((n_cells, hkv, d)).astype(np.float32)  # noqa: E731
                                 .view(np.uint32) >> 16).astype(np.uint16))
    k_pool, v_pool = pool(), pool()
    table = cupy.asarray(rng.permutation(n_cells)[:length].astype(np.int32)[None, :])
    args = (q, k_pool, v_pool, table, cupy.asarray([length], np.int32), cupy.zeros(t, np.int32),
            cupy.asarray(np.arange(length - t, length, dtype=np.int32)), d ** -0.5)
    want = ops.attention(*args, force_splits=splits)
    got = ops.attention(*args, force_splits=splits, q8=True)
    assert bool((got.x == want).all())
    _same_codes(got.reshape(t, hq * d))
    if t == 16:                                          # 33 rows: no int8 bucket, a plain array
        wide = (cupy.zeros((33, hq, d), np.float32), k_pool, v_pool, table, args[4], cupy.zeros(33, np.int32),
                cupy.asarray(np.arange(length - 33, length, dtype=np.int32)), d ** -0.5)
        assert isinstance(ops.attention(*wide, force_splits=splits, q8=True), cupy.ndarray)
