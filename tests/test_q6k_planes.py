"""Q6_K rows repacked into planes (weights/q6k_planes.py): the repack is a permutation of each
row's bytes that from_planes undoes, and on the GPU gemv_kq over the planes (Lanes<Q6_KP>) gives
the GGUF rows' outputs bit for bit. The lanes' arithmetic on the CPU: test_gemv_kq_lanes.py."""

from __future__ import annotations

import numpy as np
import pytest

from glimmer_cupy.weights.q6k_planes import QL_UNITS, SCALE_BYTES, from_planes, to_planes
from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

gpu = pytest.mark.gpu          # skipped without a device (conftest.py)


@pytest.mark.parametrize("n,k", [(1, 2048), (7, 4096), (3, 12288)])
def test_planes_are_a_permutation_of_each_row(n, k):
    rng = np.random.default_rng(n * k)
    data = random_blocks(QType.Q6_K, n, k, rng).reshape(n, -1)
    planes = to_planes(data, n, k)
    assert planes.shape == data.shape and planes.dtype == np.uint8
    np.testing.assert_array_equal(from_planes(planes, n, k), data)
    for r in range(n):                                   # the same bytes in each row, moved
        np.testing.assert_array_equal(np.sort(planes[r]), np.sort(data[r]))


def test_plane_offsets_follow_the_lanes():
    """In a run of eight super-blocks, lane p = 4h + i's pieces of super-block j: ql[64h + 8i ..] and
    ql[64h + 32 + 8i ..] side by side at 128j + 16p; qh at 1024 + 64j, unchanged; scales[8h + i // 2 +
    2t] at 1536 + 16j + 4 (2h + i // 2) + t; d at 1664 + 2j. The second run of a row the same, 1680 on."""
    runs = 2
    data = (np.arange(runs * 8 * 210) * 7 % 251).astype(np.uint8).reshape(1, -1)
    planes = to_planes(data, 1, 2048 * runs)[0]
    blocks = data.reshape(runs, 8, 210)
    for run in range(runs):
        base = 1680 * run
        for j in range(8):
            ql, qh, sc, d = blocks[run, j, :128], blocks[run, j, 128:192], blocks[run, j, 192:208], blocks[run, j, 208:]
            for p in range(8):
                h, i = p >> 2, p & 3
                got = planes[base + 128 * j + 16 * p:][:16]
                np.testing.assert_array_equal(got, np.concatenate([ql[64 * h + 8 * i:][:8], ql[64 * h + 32 + 8 * i:][:8]]))
                for t in range(4):
                    assert planes[base + 1536 + 16 * j + 4 * (2 * h + i // 2) + t] == sc[8 * h + i // 2 + 2 * t]
            np.testing.assert_array_equal(planes[base + 1024 + 64 * j:][:64], qh)
            np.testing.assert_array_equal(planes[base + 1664 + 2 * j:][:2], d)
    assert sorted(QL_UNITS) == list(range(16)) and sorted(SCALE_BYTES) == list(range(16))


def test_planes_refuse_a_partial_run():
    with pytest.raises(ValueError, match="to_planes: K must be a multiple of 2048 .* got 1024"):
        to_planes(np.zeros(4 * 210, np.uint8), 1, 1024)


@gpu
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("ws", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(1037, 4096), (64, 12288), (3, 2048)])
def test_gemv_kq_on_planes_is_gemv_kq_bit_for_bit(n, k, ws, rows, m):
    """Every rows-a-warp and warps-a-row-set instance, N not a multiple of a block's rows, M = 1 and
    4: the same floats from the planes as from the GGUF rows (outputs poisoned first)."""
    import cupy

    from glimmer_cupy.ops import matmul
    from glimmer_cupy.ops.matmul import KQ_WARPS, TRAITS, quantize_x
    rng = np.random.default_rng(n + k + 10 * ws + rows + m)
    data = cupy.asarray(random_blocks(QType.Q6_K, n, k, rng, 0.05).reshape(n, -1))
    planes = to_planes(data, n, k)
    x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
    xq, xd, xs = quantize_x(x, TRAITS[QType.Q6_K])
    per_block = rows * KQ_WARPS // ws
    outs = []
    for trait, w in (("Q6_K", data), ("Q6_KP", planes)):
        out = cupy.full((m, n), np.nan, np.float32)
        matmul._kq_kernel(trait, m, rows, ws)(((n + per_block - 1) // per_block,), (32 * KQ_WARPS,),
                                              (out, xq, xd, xs, w, np.int32(n), np.int32(k), np.int64(data.shape[1])))
        outs.append(cupy.asnumpy(out))
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[1], outs[0])


@gpu
@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("n,k", [(1037, 4096), (300, 12288)])
def test_quant_matmul_with_planes_is_without(n, k, m):
    """A Q6_K matrix with its planes (with_planes) through quant_matmul: gemv_kq reads the planes
    where the table gives it (M <= 7), the other buckets the GGUF bytes; the same bits either way."""
    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.ops.matmul import TRAITS, quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    from glimmer_cupy.weights.q6k_planes import with_planes
    from glimmer_cupy.weights.quant_tensor import QuantTensor
    rng = np.random.default_rng(n + k + m)
    w = QuantTensor("w", QType.Q6_K, (n, k), random_blocks(QType.Q6_K, n, k, rng, 0.05)).to_device()
    wp = with_planes(w)
    assert wp.planes is not None and with_planes(wp) is wp
    x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
    xin = Q8Rows(x, *quantize_x(x, TRAITS[QType.Q6_K]))
    want = cupy.asnumpy(ops.quant_matmul(xin, w))
    got = cupy.asnumpy(ops.quant_matmul(xin, wp, out=cupy.full((m, n), np.nan, np.float32)))
    np.testing.assert_array_equal(got, want)


@gpu
@pytest.mark.parametrize("order", ["q4k+q6k", "q6k+q4k"])
def test_pair_launch_with_planes_is_without(order):
    """quant_matmul_rows's one launch for a Q4_K / Q6_K pair at one row, its Q6_K part with planes:
    the same bits as the pair without them (Qwen3-8B's q|k beside a Q6_K v, and the other order)."""
    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.ops.matmul import TRAITS, quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    from glimmer_cupy.weights.q6k_planes import with_planes
    from glimmer_cupy.weights.quant_tensor import QuantTensor
    rng = np.random.default_rng(3)
    k = 4096
    q4 = QuantTensor("qk", QType.Q4_K, (5120, k), random_blocks(QType.Q4_K, 5120, k, rng, 0.05)).to_device()
    q6 = QuantTensor("v", QType.Q6_K, (1024, k), random_blocks(QType.Q6_K, 1024, k, rng, 0.05)).to_device()
    parts, planes = ([q4, q6], [q4, with_planes(q6)]) if order == "q4k+q6k" else ([q6, q4], [with_planes(q6), q4])
    x = cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32))
    xin = Q8Rows(x, *quantize_x(x, TRAITS[QType.Q4_K]))
    want = cupy.asnumpy(ops.quant_matmul_rows(xin, parts))
    got = cupy.asnumpy(ops.quant_matmul_rows(xin, planes))
    np.testing.assert_array_equal(got, want)
