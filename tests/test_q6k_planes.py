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


@pytest.mark.parametrize("n,k", [(1, 256), (7, 2048), (3, 12288)])
def test_planes_are_a_permutation_of_each_row(n, k):
    rng = np.random.default_rng(n * k)
    data = random_blocks(QType.Q6_K, n, k, rng).reshape(n, -1)
    planes = to_planes(data, n, k)
    assert planes.shape == data.shape and planes.dtype == np.uint8
    np.testing.assert_array_equal(from_planes(planes, n, k), data)
    for r in range(n):                                   # the same bytes in each row, moved
        np.testing.assert_array_equal(np.sort(planes[r]), np.sort(data[r]))


def test_plane_offsets_follow_the_lanes():
    """Lane p = 4h + i's pieces: ql[64h + 8i ..] and ql[64h + 32 + 8i ..] side by side at 16p of the
    super-block's ql plane; qh unchanged; scales[8h + i // 2 + 2t] at 4 (2h + i // 2) + t; d last."""
    nb = 2
    data = np.arange(nb * 210, dtype=np.uint16).astype(np.uint8).reshape(1, -1)
    planes = to_planes(data, 1, 256 * nb)[0]
    blocks = data.reshape(nb, 210)
    for sb in range(nb):
        ql, qh, sc, d = blocks[sb, :128], blocks[sb, 128:192], blocks[sb, 192:208], blocks[sb, 208:]
        for p in range(8):
            h, i = p >> 2, p & 3
            got = planes[128 * sb + 16 * p:128 * sb + 16 * p + 16]
            np.testing.assert_array_equal(got, np.concatenate([ql[64 * h + 8 * i:][:8], ql[64 * h + 32 + 8 * i:][:8]]))
            for t in range(4):
                assert planes[192 * nb + 16 * sb + 4 * (2 * h + i // 2) + t] == sc[8 * h + i // 2 + 2 * t]
        np.testing.assert_array_equal(planes[128 * nb + 64 * sb:][:64], qh)
        np.testing.assert_array_equal(planes[208 * nb + 2 * sb:][:2], d)
    assert sorted(QL_UNITS) == list(range(16)) and sorted(SCALE_BYTES) == list(range(16))


def test_planes_refuse_a_partial_super_block():
    with pytest.raises(ValueError, match="multiple of 256, got 300"):
        to_planes(np.zeros(210, np.uint8), 1, 300)


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
