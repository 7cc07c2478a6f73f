"""quant_matmul on the GPU against x · dequant(W)ᵀ in float64, gguf's dequantizer the oracle.

Every type, M across every bucket edge, real K and N. Outputs are filled with NaN first; the
error is NMSE = mse(out, ref) / mse(ref, 0), budget per bucket:
- gemv decodes blocks exactly and accumulates in float32: float32 rounding over K terms;
- mma and dequant_cublas round W and x to bf16 (8-bit mantissa) for tensor cores: NMSE ~6e-6,
  so 1e-4;
- gemv_kq and gemv_dp4a quantize x to int8 per 32 values (step max|x|/127): for Gaussian x that alone is
  NMSE ~3e-5 (seen up to 1.2e-4 on one row), so 5e-4. A wrong nibble, bit or scale in a block gives 1e-3 or worse;
- mma_st quantizes x per 256 values (a larger max|x| a step): for Gaussian x ~6e-5, so 5e-4 too.
"""

import functools

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops.matmul import BUCKETS, KQ_TYPES, MMA_WG_SPLITS, TRAITS, bucket
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks

NMSE_BUDGET = {"gemv": 1e-9, "dequant_cublas": 1e-4, "mma": 1e-4, "gemv_dp4a": 5e-4, "gemv_kq": 5e-4,
               "mma_kq": 5e-4, "mma_dq": 1e-4, "mma_wg": 1e-4,
               "mma_st": 5e-4}
gpu = pytest.mark.gpu          # skipped without a device (conftest.py)

M_SWEEP = (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 32, 33, 64, 65, 128, 512)
K_QUANTS = (QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K)


def shapes_for(q):
    """(N, K) pairs from the real models; K-quants need K % 256 == 0."""
    if q in K_QUANTS:
        # the last two: N not a multiple of a block's rows, super-blocks not a multiple of 4 per row
        return [(1024, 4096), (4096, 1024), (2048, 1536), (1027, 768), (515, 2560)]
    return [(576, 1536), (1536, 576), (640, 2048), (2048, 640)]


def nmse(out, ref):
    return float(np.mean((out - ref) ** 2) / np.mean(ref ** 2))


def check_sweep(q, n, k, ms, rng):
    """Fresh random W (decoded once by gguf) and x for each M; NaN-filled outputs."""
    import cupy
    w = QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05))
    w_ref = w.dequantize(np.float64)
    w_dev = w.to_device()
    for m in ms:
        x = rng.normal(0, 1, (m, k)).astype(np.float32)
        ref = x.astype(np.float64) @ w_ref.T
        out = cupy.full((m, n), np.nan, dtype=cupy.float32)
        ops.quant_matmul(cupy.asarray(x), w_dev, out=out)
        got = cupy.asnumpy(out)
        assert np.isfinite(got).all(), (q.name, n, k, m)
        e = nmse(got, ref)
        assert e < NMSE_BUDGET[bucket(m, q)], (q.name, n, k, m, bucket(m, q), e)


@gpu
@pytest.mark.parametrize("q", list(TRAITS), ids=lambda q: q.name)
def test_every_type_every_bucket(q):
    rng = np.random.default_rng(int(q))
    for n, k in shapes_for(q):
        check_sweep(q, n, k, M_SWEEP, rng)


@gpu
@pytest.mark.parametrize("q,n,k", [(QType.Q6_K, 151936, 1024), (QType.Q8_0, 262144, 640),
                                    (QType.Q4_K, 12288, 4096), (QType.Q6_K, 4096, 12288)])
def test_large_shapes(q, n, k):
    check_sweep(q, n, k, (1, 8, 9), np.random.default_rng(7))


def test_mma_wg_splits_fill_the_chip_without_a_second_wave():
    """K splits only where the tiles leave SMs idle, never past one split per super-block group,
    always a cluster size the kernel is built for."""
    from glimmer_cupy.ops.matmul import mma_wg_splits
    assert [mma_wg_splits(m, 4096, 4096) for m in (33, 128, 256, 512)] == [2, 2, 2, 1]
    assert [mma_wg_splits(m, 4096, 12288) for m in (33, 128, 256, 512)] == [8, 8, 2, 1]
    assert mma_wg_splits(33, 151936, 4096) == 1 and mma_wg_splits(33, 4096, 256) == 1
    for sms in (78, 114, 132):
        for m in (1, 33, 129, 300, 513):
            for n, k in ((512, 1024), (4096, 4096), (4096, 12288), (12288, 4096)):
                ks = mma_wg_splits(m, n, k, sms)
                blocks = -(-m // 128) * -(-n // 128)
                assert ks in MMA_WG_SPLITS and (ks == 1 or (blocks * ks <= 2 * sms and k // 256 >= 4 * ks)), (m, n, k, sms)


def test_bucket_table_covers_every_m():
    assert [bucket(m, QType.F16) for m in (1, 8, 9, 4096)] == ["gemv", "gemv", "dequant_cublas", "dequant_cublas"]
    assert [bucket(m, QType.Q4_K) for m in (1, 3, 4, 8, 9, 16, 17, 32, 33, 64, 65)] == \
        ["gemv_kq"] * 2 + ["mma_st"] * 8 + ["mma_wg"]
    assert [bucket(m, QType.Q6_K) for m in (1, 7, 8, 16, 17, 32, 33, 40, 41, 64, 65)] == \
        ["gemv_kq"] * 2 + ["mma_st"] * 8 + ["dequant_cublas"]
    assert bucket(64, QType.Q4_K, graph_safe=True) == "mma_st" and bucket(65, QType.Q4_K, graph_safe=True) == "mma_wg"
    assert bucket(64, QType.Q6_K, graph_safe=True) == "mma_st" and bucket(65, QType.Q6_K, graph_safe=True) == "mma"
    assert bucket(16, QType.Q4_K, graph_safe=True) == "mma_st"
    assert [bucket(m, QType.Q8_0) for m in (1, 16, 17)] == ["gemv_dp4a", "gemv_dp4a", "dequant_cublas"]
    assert all(rows[-1][0] is None for rows in BUCKETS.values())


def test_kq_pair_config_cpu():
    """A pair launch keeps each part's own warps a row set; a large pair (Qwen3-8B's q|k beside a Q6_K
    v) runs its Q6_K part at one row a warp (and, as every Q6_K matrix at M = 1, at most two warps a
    set), a small one (0.6B's) at kq_rows's four."""
    from glimmer_cupy.ops.matmul import kq_pair_config
    assert kq_pair_config(QType.Q4_K, QType.Q6_K, 5120, 1024, 4096) == ((2, 4), (1, 2))
    assert kq_pair_config(QType.Q6_K, QType.Q4_K, 1024, 5120, 4096) == ((1, 2), (2, 4))
    assert kq_pair_config(QType.Q4_K, QType.Q6_K, 3072, 1024, 1024) == ((2, 1), (4, 1))


def test_kq_config_fills_the_chip_within_a_row():
    from glimmer_cupy.ops.matmul import kq_config
    assert kq_config(1, 4096, 4096) == (2, 4)          # 2048 row sets: four warps each
    assert kq_config(1, 12288, 4096) == (2, 2)
    assert kq_config(1, 151936, 4096, QType.Q4_K) == (2, 1)   # the head fills the chip with one warp a set
    assert kq_config(1, 151936, 4096, QType.Q6_K) == (4, 1)   # Q6_K's head: 4 rows a warp
    assert kq_config(2, 151936, 4096, QType.Q6_K) == (2, 1) and kq_config(2, 12288, 4096, QType.Q6_K) == (2, 2)
    # Q6_K at M = 1: at most two warps a set (KQ_M1_MAX_WS): 8B's down in one wave of 512 blocks
    assert kq_config(1, 12288, 4096, QType.Q6_K) == (4, 2) and kq_config(1, 4096, 12288, QType.Q6_K) == (4, 2)
    assert kq_config(1, 1024, 4096, QType.Q6_K) == (4, 2) and kq_config(1, 4096, 12288, QType.Q4_K) == (2, 4)
    assert kq_config(1, 1024, 3072, QType.Q6_K) == (4, 2) and kq_config(1, 1024, 1024, QType.Q6_K) == (4, 1)
    assert kq_config(1, 12288, 4096, QType.Q4_K) == (2, 2)
    assert kq_config(1, 1027, 768) == (2, 1)           # 3 super-blocks: one group of four at most
    assert kq_config(1, 515, 2560) == (2, 2)           # 10 super-blocks: three groups, two warps
    assert kq_config(8, 4096, 4096)[0] == 4 and kq_config(16, 4096, 4096)[0] == 2


def test_mma_dq_config_splits_short_blocks_onto_the_chip():
    """K splits double, up to a cluster of 8, while a block holds more than MMA_DQ_SB_PER_BLOCK
    super-blocks or fewer than MMA_DQ_MIN_BLOCKS blocks are launched, and each split keeps a
    super-block; one more doubling would break one of those."""
    from glimmer_cupy.ops.matmul import MMA_DQ_BLOCK_ROWS, MMA_DQ_MIN_BLOCKS, MMA_DQ_SB_PER_BLOCK, mma_dq_config
    for m in (9, 16, 24, 32):
        for n in (256, 1000, 4096, 6144, 12288, 24576, 151936):
            for k in (256, 1024, 3072, 4096, 8448, 12288):
                nt, ks = mma_dq_config(m, n, k)
                groups, nsb = -(-n // MMA_DQ_BLOCK_ROWS), k // 256
                what = (m, n, k, ks)
                assert nt == -(-m // 8) and ks in (1, 2, 4, 8) and ks <= max(1, nsb), what
                done = -(-nsb // ks) <= MMA_DQ_SB_PER_BLOCK and groups * ks >= MMA_DQ_MIN_BLOCKS
                assert ks == 8 or 2 * ks > nsb or done, what
    assert mma_dq_config(16, 24576, 4096) == (2, 4) and mma_dq_config(16, 4096, 12288) == (2, 8)


def test_mma_st_config_takes_the_fewest_splits_that_fit():
    """K splits double, up to a cluster of 8, while a block's rows do not fit shared memory; every
    split keeps a super-block."""
    from glimmer_cupy.ops.matmul import MMA_ST_SMEM_CAP, mma_st_config, mma_st_smem
    for q in (QType.Q4_K, QType.Q6_K):
        for m in (1, 9, 16, 32):
            for n, k in ((4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (300, 256), (77, 768)):
                nt, ks = mma_st_config(m, n, k, q)
                assert nt == -(-m // 8) and ks in (1, 2, 4, 8) and ks <= max(1, k // 256)
                assert mma_st_smem(nt, k, ks, q) <= MMA_ST_SMEM_CAP, (q.name, m, n, k, ks)
                assert ks == 1 or mma_st_smem(nt, k, ks // 2, q) > MMA_ST_SMEM_CAP, (q.name, m, n, k, ks)
    assert mma_st_config(16, 4096, 4096) == (2, 1) and mma_st_config(16, 4096, 12288) == (2, 4)
    assert mma_st_config(16, 4096, 4096, QType.Q6_K) == (2, 2)


def test_beside_mma_st_serves_every_mma_st_row():
    """Where mma_st cannot run (no sm_90, x or W not aligned for it), each of the table's mma_st rows
    gets the table's bucket from before mma_st took them, one that serves that M."""
    from glimmer_cupy.ops.matmul import _beside_mma_st, serves
    for q in (QType.Q4_K, QType.Q6_K):
        for m in range(1, 65):
            if bucket(m, q) != "mma_st":
                continue
            for graph_safe in (False, True):
                b = _beside_mma_st(m, q, graph_safe)
                assert b != "mma_st" and serves(b, q, m), (q.name, m, graph_safe, b)
    assert [_beside_mma_st(m, QType.Q4_K, False) for m in (4, 9, 32, 33, 64)] == \
        ["mma_kq", "mma_dq", "mma_dq", "mma_wg", "mma_wg"]
    assert [_beside_mma_st(m, QType.Q6_K, False) for m in (8, 40, 41)] == ["mma_kq", "mma_kq", "dequant_cublas"]
    assert _beside_mma_st(64, QType.Q6_K, True) == "mma_kq"


def test_mma_st_tma_ring_holds_what_fits():
    """The tensor-map kernel's ring: a stage a chunk where every chunk of the slice fits, else the
    most stages that fit shared memory, a multiple of wk; so one split serves any K."""
    from glimmer_cupy.ops.matmul import (MMA_ST_MAX_STAGES, MMA_ST_SMEM_CAP, mma_st_config, mma_st_smem,
                                         mma_st_stages)
    for q in (QType.Q4_K, QType.Q6_K):
        for rg, wk in ((4, 1), (4, 2), (2, 2), (2, 4)):
            for m in (1, 9, 16, 32):
                nt = -(-m // 8)
                for k in (256, 768, 4096, 8448, 12288, 49152):
                    assert mma_st_config(m, 4096, k, q, True, rg, wk) == (nt, 1)
                    chunks = -(-(k // 256) // 2)
                    s = mma_st_stages(nt, k, 1, q, rg, wk)
                    what = (q.name, rg, wk, m, k, s)
                    assert 0 < s <= min(chunks, MMA_ST_MAX_STAGES) and (s == chunks or s % wk == 0), what
                    assert mma_st_smem(nt, k, 1, q, True, rg, wk) <= MMA_ST_SMEM_CAP, what
                    if s < min(chunks, MMA_ST_MAX_STAGES):     # one more stage (wk more) would not fit
                        assert mma_st_smem(nt, k, 1, q, True, rg, wk, s + wk) > MMA_ST_SMEM_CAP, what
                    assert mma_st_stages(nt, k, 1, q, rg, wk, cap=wk) == min(chunks, wk) or chunks > wk
    # K = 12288 at 16 rows of x, 32-row blocks: 24 chunks of 18 KB, 12 in the ring
    assert mma_st_stages(2, 12288, 1, QType.Q4_K, 2, 4) == 12
    assert mma_st_smem(2, 4096, 1, QType.Q4_K, True, 2, 4) == 8 * 32 * 288 + 16 * 2 * 2208


@pytest.mark.parametrize("sms", [132, 114, 78])
def test_mma_st_tma_shape_keeps_blocks_resident_and_rings_deep(monkeypatch, sms):
    """mma_st_tma_shape's rule, on devices of several SM counts: a compiled block shape; where 32-row
    blocks fit the SMs, one wave with a ring of every chunk or two chunks a warp; where they fit twice
    over, every block resident at once; and from MMA_ST_TMA_WIDE_NT n-tiles on many blocks, two
    blocks an SM (of 64 rows where two fit: x's images read once for twice the W)."""
    from glimmer_cupy.ops import matmul as mm
    monkeypatch.setattr(mm, "sm_count", lambda: sms)
    monkeypatch.setattr(mm, "dram_bytes_per_s", lambda: 4.1e12)
    for q in (QType.Q4_K, QType.Q6_K):
        for nt in (1, 2, 3, 4, 8):
            for n in (1024, 2048, 3072, 4096, 6144, 8192, 12288, 24576, 151936):
                for k in (1024, 4096, 12288):
                    rg, wk, cap = mm.mma_st_tma_shape(n, qtype=q, nt=nt)
                    what = (q.name, nt, n, k, rg, wk, cap)
                    assert (rg, wk) in mm.MMA_ST_TMA_SHAPES, what
                    chunks = mm.mma_st_chunks(k, 1)
                    s = mm.mma_st_stages(nt, k, 1, q, rg, wk, cap)
                    blocks = -(-n // (16 * rg))
                    per_sm = mm.MMA_ST_SM_SMEM // (mm.mma_st_smem(nt, k, 1, q, True, rg, wk, s) + mm.MMA_ST_STATIC_SMEM + 1024)
                    if -(-n // 32) <= sms:
                        assert blocks <= sms and (s == chunks or s >= 2 * wk), what
                    elif -(-n // 32) <= 2 * sms:
                        assert blocks <= per_sm * sms, what
                    elif nt >= mm.MMA_ST_TMA_WIDE_NT:
                        assert per_sm >= 2, what
    # the measured cases: Q6_K at 32 rows of x on 4096 rows (a ring of 4 at (2, 4)) and on 6144
    monkeypatch.setattr(mm, "sm_count", lambda: 132)
    assert mm.mma_st_tma_shape(4096, qtype=QType.Q6_K, nt=4) == (2, 2, None)
    assert mm.mma_st_tma_shape(6144, qtype=QType.Q6_K, nt=4) == (4, 2, None)
    assert mm.mma_st_tma_shape(24576, qtype=QType.Q4_K, nt=4) == mm.MMA_ST_TMA_WIDE
    assert mm.mma_st_tma_shape(24576, qtype=QType.Q4_K, nt=2) == mm.MMA_ST_TMA_MANY[QType.Q4_K]
    assert mm.mma_st_tma_shape(24576, qtype=QType.Q6_K, nt=8) == mm.MMA_ST_TMA_WIDE_PAIRED
    assert mm.mma_st_tma_shape(24576, qtype=QType.Q4_K, nt=8) == mm.MMA_ST_TMA_WIDE
    for q in (QType.Q4_K, QType.Q6_K):       # a head: its own shapes to 2 n-tiles, the many-block ones at 3
        assert mm.mma_st_tma_shape(151936, qtype=q, nt=2) == mm.MMA_ST_TMA_HEAD[q]
        assert mm.mma_st_tma_shape(151936, qtype=q, nt=3) == mm.MMA_ST_TMA_MANY[q]
    monkeypatch.setattr(mm, "dram_bytes_per_s", lambda: 3.35e12)   # an H100's DRAM: the many-block ones
    for q in (QType.Q4_K, QType.Q6_K):
        assert mm.mma_st_tma_shape(151936, qtype=q, nt=2) == mm.MMA_ST_TMA_MANY[q]


def test_kq_occupancy_serves_small_layers_at_m1_only():
    from glimmer_cupy.ops.matmul import kq_occupancy
    assert kq_occupancy(QType.Q4_K, 1, 6144, 1024, 2) == 5 and kq_occupancy(QType.Q4_K, 1, 1024, 3072, 2) == 5
    assert kq_occupancy(QType.Q4_K, 1, 4096, 4096, 2) == 0         # Qwen3-8B's matrices: the plain kernel
    assert kq_occupancy(QType.Q4_K, 1, 24576, 4096, 2) == 0
    assert kq_occupancy(QType.Q6_K, 1, 4096, 1024, 2) == 0          # Q6_K takes 4 rows a warp at M = 1 instead
    assert kq_occupancy(QType.Q4_K, 1, 151936, 1024, 2) == 0        # a head keeps the plain kernel
    assert kq_occupancy(QType.Q6_K, 2, 1024, 1024, 2) == 0 and kq_occupancy(QType.Q4_K, 1, 1024, 1024, 4) == 0


@gpu
@pytest.mark.parametrize("q", [QType.Q4_K, QType.Q6_K, QType.Q8_0], ids=lambda q: q.name)
def test_forced_buckets_agree(q):
    """Every bucket that can serve an M gives the same product (the edges are a speed choice)."""
    import cupy
    rng = np.random.default_rng(3)
    w = QuantTensor("w", q, (512, 1024), random_blocks(q, 512, 1024, rng, 0.05))
    ref_w = w.dequantize(np.float64)
    w_dev = w.to_device()
    for m in (1, 3, 8, 16, 33, 100):
        x = rng.normal(0, 1, (m, 1024)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_w.T
        for b in ("gemv_kq", "gemv_dp4a", "gemv", "mma", "dequant_cublas", "mma_dq", "mma_wg", "mma_st"):
            if (b == "gemv" and m > 8) or (b in ("gemv_dp4a", "gemv_kq") and m > 16) \
                    or (b == "gemv_kq" and q not in KQ_TYPES) or (b == "mma_dq" and (q != QType.Q4_K or m > 32)) \
                    or (b == "mma_st" and (q not in KQ_TYPES or m > 32)) or (b == "mma_wg" and q != QType.Q4_K):
                continue
            got = cupy.asnumpy(ops.quant_matmul(cupy.asarray(x), w_dev, force_bucket=b))
            assert nmse(got, ref) < NMSE_BUDGET[b], (q.name, m, b)


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k", [(512, 1024), (1000, 2560), (300, 256), (5000, 512), (77, 768)])
def test_mma_kq_matches_the_reference_and_the_gemv(qtype, n, k):
    """The int8 tensor-core bucket (forced) on Q4_K and Q6_K: every n-tile count of x (M 1..32, and
    33..64 as a launch per 32 rows),
    K split over 1, 2, 4 and 8 warps (the shapes pick them), rows of x and W past the tiles' edges
    (Q6_K: with K / 256 odd, rows start at both 4-byte alignments); on the same codes it differs
    from gemv_kq only in the order of float additions."""
    import cupy

    from glimmer_cupy.ops.matmul import mma_kq_config, quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    rng = np.random.default_rng(n + k)
    w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
    ref_w = w.dequantize(np.float64)
    w_dev = w.to_device()
    for m in (1, 9, 16, 17, 24, 32, 33, 57, 64):
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        xin = Q8Rows(x, *quantize_x(x, qtype.name))
        out = cupy.full((m, n), np.nan, np.float32)
        got = cupy.asnumpy(ops.quant_matmul(xin, w_dev, out=out, force_bucket="mma_kq"))
        what = (qtype.name, m, mma_kq_config(m, n, k, qtype))
        assert np.isfinite(got).all(), what
        assert nmse(got, cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_kq"], what
        if m <= 16:
            gemv = cupy.asnumpy(ops.quant_matmul(xin, w_dev, force_bucket="gemv_kq"))
            np.testing.assert_allclose(got, gemv, rtol=1e-4, atol=1e-4 * np.abs(gemv).max(), err_msg=str(what))


@gpu
@pytest.mark.parametrize("n,k", [(512, 1024), (1000, 2560), (300, 256), (5000, 512), (77, 768), (4096, 12288),
                                 (1000, 8448)])
def test_mma_dq_matches_the_reference(n, k):
    """The bf16 tensor-core bucket (forced) on Q4_K: every n-tile count of x (M 1..32, rows of x
    past a tile's edge), K split over clusters of 1..8 blocks (the shapes pick them, some splits
    empty where K has fewer super-blocks than splits, as 8448's 33 in 8 splits of 5), rows of W
    past a block's 256; the same bits on a second call (the cluster sums in rank order)."""
    import cupy

    from glimmer_cupy.ops.matmul import mma_dq_config
    rng = np.random.default_rng(n + k + 1)
    w = QuantTensor("w", QType.Q4_K, (n, k), random_blocks(QType.Q4_K, n, k, rng, 0.05))
    ref_w = w.dequantize(np.float64)
    w_dev = w.to_device()
    for m in (1, 3, 8, 9, 16, 17, 24, 25, 32):
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        out = cupy.full((m, n), np.nan, np.float32)
        got = cupy.asnumpy(ops.quant_matmul(x, w_dev, out=out, force_bucket="mma_dq"))
        what = (m, n, k, mma_dq_config(m, n, k))
        assert np.isfinite(got).all(), what
        assert nmse(got, cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_dq"], what
        again = cupy.asnumpy(ops.quant_matmul(x, w_dev, force_bucket="mma_dq"))
        assert np.array_equal(got, again), what


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k", [(512, 1024), (1000, 2560), (300, 256), (5000, 512), (77, 768), (4096, 12288),
                                 (1000, 8448), (4096, 4096)])
def test_mma_st_matches_the_reference(qtype, n, k):
    """The staged int8 tensor-core bucket (forced) on Q4_K and Q6_K: every n-tile count of x (M 1..32,
    rows of x past a tile's edge; M 33..64 in one tensor-map launch, or launches of 32 rows where the
    tensor-map kernel cannot copy W), K split over clusters of 1..8
    blocks (the shapes pick them; 8448's 33 super-blocks in 8 splits of 5 leave the last with 3), rows
    of W past a block's 64, Q6_K blocks at every 2-byte offset of their windows (K of an odd number of
    super-blocks: rows of 210 * odd bytes); every output written (NaN first); the same bits on a second
    call (the cluster sums in rank order)."""
    import cupy

    from glimmer_cupy.ops.matmul import mma_st_config
    rng = np.random.default_rng(n + k + 2)
    w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
    ref_w = w.dequantize(np.float64)
    w_dev = w.to_device()
    if qtype == QType.Q6_K and n * (k // 256) % 8:
        # the last row's 16-byte-aligned window would end past the tensor: refused, before any launch
        x = cupy.zeros((16, k), np.float32)
        from glimmer_cupy.ops._check import OpArgumentError
        with pytest.raises(OpArgumentError, match=r"mma_st: w must be a Q6_K tensor whose last 16-byte window "
                                                  r"ends inside it, got \d+ bytes past its end"):
            ops.quant_matmul(x, w_dev, force_bucket="mma_st")
        return
    for m in (1, 3, 8, 9, 16, 17, 24, 25, 32, 33, 57, 64):       # past 32: one wide launch or 32-row parts
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        out = cupy.full((m, n), np.nan, np.float32)
        got = cupy.asnumpy(ops.quant_matmul(x, w_dev, out=out, force_bucket="mma_st"))
        what = (qtype.name, m, n, k, mma_st_config(m, n, k, qtype))
        assert np.isfinite(got).all(), what
        assert nmse(got, cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_st"], what
        again = cupy.asnumpy(ops.quant_matmul(x, w_dev, force_bucket="mma_st"))
        assert np.array_equal(got, again), what


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("splits", [1, 2, 4, 8])
def test_mma_st_every_split_gives_the_same_products(splits, qtype):
    """Each cluster size along K, on a shape where 8 splits leave some blocks without a super-block
    (K of 5: splits of 1 super-block and 3 empty), against float64 and against the codes' exact
    product (the x image of test_mma_st_lanes.py, which the stage kernel must write byte for byte)."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    from test_mma_st_lanes import image_values, stage_x_image
    rng = np.random.default_rng(splits)
    for n, k, m in ((328, 1280, 16), (200, 4096, 5), (64, 256, 32)):
        if splits > k // 256 or not mm.mma_st_fits(-(-m // 8), k, splits, qtype, False):
            continue                    # no super-block for some split, or the stages do not fit
        w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
        ref_w = w.dequantize(np.float64)
        w_dev = w.to_device()
        x = rng.normal(0, 1, (m, k)).astype(np.float32)
        out = cupy.full((m, n), np.nan, np.float32)
        mm.mma_st(out, cupy.asarray(x), w_dev, splits=splits)
        got = cupy.asnumpy(out)
        codes = image_values(stage_x_image(x, -(-m // 8)), m)
        exact = codes @ ref_w.T
        what = (splits, n, k, m)
        assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max(), what
        assert nmse(got, x.astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_st"], what


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k", [(300, 4096), (4096, 12288), (1000, 8448), (77, 2048)])
def test_mma_st_tma_wide_launch_gives_the_bits_of_32_row_parts(qtype, n, k):
    """33..64 rows of x in one tensor-map launch (8 n-tiles, the rows past M zero) give the bits of
    two launches of at most 32 rows each, at every block shape, with the rule's ring and with the
    shortest (wk stages); rows past M are not written; near float64. Splits other than one, and
    the bulk kernel past 32 rows, are refused by name."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    from glimmer_cupy.ops._check import OpArgumentError
    if qtype == QType.Q6_K and (k // 256) % 8:
        return                      # rows of a multiple of 16 bytes only
    rng = np.random.default_rng(n + k + 11)
    w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
    w_dev = w.to_device()
    ref_w = w.dequantize(np.float64)
    for m in (33, 40, 57, 64):
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        ref = cupy.asnumpy(x).astype(np.float64) @ ref_w.T
        for rg, wk in sorted(mm.MMA_ST_TMA_SHAPES):
            for stages in (None, wk):
                if stages is None and not mm.mma_st_fits(8, k, 1, qtype, True, rg, wk):
                    continue
                parts = cupy.full((m, n), np.nan, np.float32)
                for r0 in (0, 32):
                    mm.mma_st(parts[r0:r0 + 32], x[r0:r0 + 32], w_dev, tma=True, rg=rg, wk=wk, stages=stages)
                wide = cupy.full((m + 3, n), np.nan, np.float32)
                mm.mma_st(wide[:m], x, w_dev, tma=True, rg=rg, wk=wk, stages=stages)
                what = (qtype.name, m, n, k, rg, wk, stages)
                assert np.array_equal(cupy.asnumpy(wide[:m]), cupy.asnumpy(parts)), what
                assert np.isnan(cupy.asnumpy(wide[m:])).all(), what
                assert nmse(cupy.asnumpy(wide[:m]), ref) < NMSE_BUDGET["mma_st"], what
    x = cupy.zeros((40, k), np.float32)
    with pytest.raises(OpArgumentError, match=r"mma_st: splits must be 1, 2, 4 or 8 \(1 above 32 rows of x\), got 2"):
        mm.mma_st(cupy.empty((40, n), np.float32), x, w_dev, tma=True, splits=2)
    with pytest.raises(OpArgumentError, match=r"mma_st: x must be at most 32 rows, 64 on the tensor-map kernel"):
        mm.mma_st(cupy.empty((40, n), np.float32), x, w_dev, tma=False)


@gpu
def test_mma_st_tma_refuses_what_it_cannot_copy():
    """The tensor-map kernel needs rows of a multiple of 16 bytes (a Q6_K row of 4 super-blocks, 840
    bytes, is not one) and a block shape (rg, wk) it was compiled for: both refused by name before
    any launch."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    from glimmer_cupy.ops._check import OpArgumentError
    n, k = 78, 1024                 # 78 x 840 bytes: the tensor ends at a 16-byte boundary (mma_st's own rule)
    blocks = random_blocks(QType.Q6_K, n, k, np.random.default_rng(3), 0.05)
    w_dev = QuantTensor("w", QType.Q6_K, (n, k), blocks).to_device()
    assert not mm.mma_st_tma_serves(w_dev)
    with pytest.raises(OpArgumentError, match=r"mma_st: w must be a 16-byte aligned Q4_K or Q6_K tensor with rows "
                                              r"of a multiple of 16 bytes for the tensor-map kernel, got Q6_K at "
                                              r"0x[0-9a-f]+, 840 bytes a row"):
        mm.mma_st(cupy.empty((16, n), np.float32), cupy.zeros((16, k), np.float32), w_dev, tma=True)
    q4 = QuantTensor("w", QType.Q4_K, (n, k), random_blocks(QType.Q4_K, n, k, np.random.default_rng(4), 0.05))
    with pytest.raises(OpArgumentError, match=r"mma_st: \(rg, wk\) must be one of \[.*\], got \(2, 1\)"):
        mm.mma_st(cupy.empty((16, n), np.float32), cupy.zeros((16, k), np.float32), q4.to_device(), tma=True,
                  rg=2, wk=1)


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K])
@pytest.mark.parametrize("n,k", [(40, 2048), (300, 4096), (1000, 4096), (4096, 12288), (77, 6144)])
def test_mma_st_tma_gives_the_bulk_kernels_bits(qtype, n, k):
    """mma_st_tma_kernel (W by tensor-map boxes, a barrier a chunk of two super-blocks) adds the
    same products in the same order as mma_st_kernel: the same bits at every split that fits, M
    1..32, N below a block's 64 rows and past it, an odd number of super-blocks a split (a chunk's
    second block missing); and near float64. With warps sharing rows (wk), the bits do not depend
    on the block's rows (rg)."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    rng = np.random.default_rng(n + k)
    w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
    w_dev = w.to_device()
    ref_w = w.dequantize(np.float64)
    for m in (1, 3, 9, 16, 17, 32):
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        for ks in (1, 2, 4, 8):
            nt = -(-m // 8)
            if ks > k // 256 or not mm.mma_st_fits(nt, k, ks, qtype, True) or not mm.mma_st_fits(nt, k, ks, qtype, False):
                continue
            want = cupy.full((m, n), np.nan, np.float32)
            got = cupy.full((m, n), np.nan, np.float32)
            mm.mma_st(want, x, w_dev, splits=ks, tma=False)
            mm.mma_st(got, x, w_dev, splits=ks, tma=True, rg=4, wk=1)
            what = (qtype.name, m, n, k, ks)
            assert np.array_equal(cupy.asnumpy(got), cupy.asnumpy(want)), what
            assert nmse(cupy.asnumpy(got), cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_st"], what
            # two warps a 16 rows, alternate chunks, their sums added after: near float64, the same bits twice,
            # and the same bits from blocks of 32 rows; four warps a 16 rows (32-row blocks) likewise
            got2 = cupy.full((m, n), np.nan, np.float32)
            mm.mma_st(got2, x, w_dev, splits=ks, tma=True, wk=2, rg=4)
            assert nmse(cupy.asnumpy(got2), cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_st"], what
            for rg in (4, 2):
                again = cupy.full((m, n), np.nan, np.float32)
                mm.mma_st(again, x, w_dev, splits=ks, tma=True, wk=2, rg=rg)
                assert np.array_equal(cupy.asnumpy(got2), cupy.asnumpy(again)), what + (rg,)
            if mm.mma_st_fits(nt, k, ks, qtype, True, 2, 4):
                got4, again = (cupy.full((m, n), np.nan, np.float32) for _ in range(2))
                mm.mma_st(got4, x, w_dev, splits=ks, tma=True, wk=4, rg=2)
                mm.mma_st(again, x, w_dev, splits=ks, tma=True, wk=4, rg=2)
                assert nmse(cupy.asnumpy(got4), cupy.asnumpy(x).astype(np.float64) @ ref_w.T) < NMSE_BUDGET["mma_st"], what
                assert np.array_equal(cupy.asnumpy(got4), cupy.asnumpy(again)), what


@gpu
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k", [(300, 4096), (77, 6144), (4096, 12288), (1000, 8448)])
def test_mma_st_tma_ring_gives_the_same_bits(qtype, n, k):
    """The tensor-map kernel with fewer stages than chunks (each stage refilled by the last of its
    chunk's warps): the same bits as with every chunk held (where they fit) and as any other ring,
    at every block shape, M 1..32, one split and two, an odd number of super-blocks (8448: the last
    chunk's second block missing); near float64. At K = 12288 one block takes the whole K."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    rng = np.random.default_rng(n + k + 7)
    if qtype == QType.Q6_K and (k // 256) % 8:
        return                      # rows of a multiple of 16 bytes only (test_mma_st_tma_refuses_what_it_cannot_copy)
    w = QuantTensor("w", qtype, (n, k), random_blocks(qtype, n, k, rng, 0.05))
    w_dev = w.to_device()
    ref_w = w.dequantize(np.float64)
    for m in (1, 9, 16, 32):
        x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
        want = x.get().astype(np.float64) @ ref_w.T
        for ks in (1, 2):
            for rg, wk in sorted(mm.MMA_ST_TMA_SHAPES):
                full = cupy.full((m, n), np.nan, np.float32)
                mm.mma_st(full, x, w_dev, splits=ks, tma=True, rg=rg, wk=wk)
                got = cupy.asnumpy(full)
                what = (qtype.name, m, n, k, ks, rg, wk)
                assert nmse(got, want) < NMSE_BUDGET["mma_st"], what
                for cap in (wk, 2 * wk, 3 * wk):
                    ring = cupy.full((m, n), np.nan, np.float32)
                    mm.mma_st(ring, x, w_dev, splits=ks, tma=True, rg=rg, wk=wk, stages=cap)
                    assert np.array_equal(cupy.asnumpy(ring), got), what + (cap,)


@gpu
def test_mma_st_tma_refuses_a_ring_it_cannot_run():
    """A ring of fewer stages than the warps that share a row set, or more than a block holds, and
    a ring on the bulk kernel: refused by name before any launch."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    from glimmer_cupy.ops._check import OpArgumentError
    n, k = 64, 4096
    blocks = random_blocks(QType.Q4_K, n, k, np.random.default_rng(5), 0.05)
    w_dev = QuantTensor("w", QType.Q4_K, (n, k), blocks).to_device()
    x, out = cupy.zeros((16, k), np.float32), cupy.empty((16, n), np.float32)
    for kw, got in ((dict(tma=True, rg=2, wk=4, stages=2), "2"), (dict(tma=True, rg=4, wk=1, stages=17), "17"),
                    (dict(tma=False, stages=4), "4")):
        with pytest.raises(OpArgumentError, match=r"mma_st: stages must be the tensor-map kernel's, \d+\.\.16, got "
                                                  + got):
            mm.mma_st(out, x, w_dev, **kw)


@gpu
def test_mma_st_stage_kernel_writes_the_image():
    """mma_st_stage_x_kernel's bytes equal the NumPy image (codes rounded half to even from x times
    127 / max|x|, the sums' (hi, lo), the scale), with rows past M and an all-zero super-block."""
    import cupy

    from glimmer_cupy.ops import matmul as mm
    from test_mma_st_lanes import stage_x_image
    rng = np.random.default_rng(9)
    for m, k in ((13, 768), (1, 256), (32, 1024)):
        x = (rng.normal(0, 1, (m, k)) * rng.uniform(0.01, 30, (m, 1))).astype(np.float32)
        x[0, :256] = 0
        nt = -(-m // 8)
        _, stage = mm._mma_st_module("St4K", nt, 1)
        xst = cupy.full(k // 256 * mm.MMA_ST_X_BYTES * nt, 0xAB, dtype=cupy.uint8)
        stage((-(-(k // 256) * 8 * nt // 4),), (128,), (xst, cupy.asarray(x), np.int32(m), np.int32(k)))
        want = stage_x_image(x, nt).reshape(-1)
        assert np.array_equal(cupy.asnumpy(xst), want), (m, k)


@gpu
@pytest.mark.parametrize("zero,splits", [(None, None), (False, 1)] + [(True, ks) for ks in MMA_WG_SPLITS])
@pytest.mark.parametrize("n,k", [(512, 1024), (1027, 768), (300, 256), (515, 2560), (4096, 4096), (4096, 12288)])
def test_mma_wg_matches_the_reference(n, k, zero, splits):
    """The warpgroup kernel on Q4_K through quant_matmul's forced bucket, and at every split count,
    rows past M zeros or clamped: rows of x and W past the 128-row tiles' edges (M 1..513,
    N not a multiple of 128), K of one super-block to 48, splits of no super-block where K has
    fewer than the splits; every output written (NaN first); the same bits on a second call."""
    import cupy

    from glimmer_cupy.ops.matmul import mma_wg
    w_dev, cases = _mma_wg_case(n, k)

    def run(x, out=None):
        if splits is None:
            return ops.quant_matmul(x, w_dev, out=out, force_bucket="mma_wg")
        out = cupy.empty((x.shape[0], n), np.float32) if out is None else out
        mma_wg(out, x, w_dev, splits=splits, zero=zero)
        return out

    for x, want in cases:
        m = x.shape[0]
        x = cupy.asarray(x)
        got = cupy.asnumpy(run(x, cupy.full((m, n), np.nan, np.float32)))
        assert np.isfinite(got).all(), (m, n, k)
        e = nmse(got, want)
        assert e < NMSE_BUDGET["mma_wg"], (m, n, k, e)
        assert np.array_equal(got, cupy.asnumpy(run(x))), (m, n, k)


@functools.cache
def _mma_wg_case(n, k):
    """W (on the device) and (x, x @ dequant(W)^T in float64) for M 1..513, shared by the variants."""
    rng = np.random.default_rng(n + k + 2)
    w = QuantTensor("w", QType.Q4_K, (n, k), random_blocks(QType.Q4_K, n, k, rng, 0.05))
    ref_w = w.dequantize(np.float64)
    xs = [rng.normal(0, 1, (m, k)).astype(np.float32) for m in (1, 5, 33, 64, 127, 128, 129, 300, 513)]
    return w.to_device(), [(x, x.astype(np.float64) @ ref_w.T) for x in xs]


@gpu
def test_mma_wg_stage_is_its_emulation():
    """wg_stage_q4k_kernel's xp and xs, bit for bit, are the CPU emulation's (test_mma_wg_layout.py)."""
    import cupy

    from glimmer_cupy.ops.matmul import _mma_wg_kernel
    from test_mma_wg_layout import wg_stage
    rng = np.random.default_rng(11)
    m, k = 7, 768
    x = rng.normal(0, 2, (m, k)).astype(np.float32)
    xp = cupy.full((m, k), 0xFFFF, cupy.uint16)
    xs = cupy.full((m, k // 16), 0xFFFF, cupy.uint16)
    _mma_wg_kernel("wg_stage_q4k_kernel")((-(-m * k // 16 // 256),), (256,),
                                          (xp, xs, cupy.asarray(x), np.int32(m), np.int32(k)))
    want_p, want_s = wg_stage(x)
    assert np.array_equal(cupy.asnumpy(xp), want_p)
    assert np.array_equal(cupy.asnumpy(xs), want_s)


@gpu
def test_bad_input_before_launch():
    import cupy

    from glimmer_cupy.ops._check import OpArgumentError
    rng = np.random.default_rng(0)
    w = QuantTensor("w", QType.Q4_K, (256, 512), random_blocks(QType.Q4_K, 256, 512, rng)).to_device()
    x = cupy.ones((3, 512), cupy.float32)
    with pytest.raises(OpArgumentError, match=r"quant_matmul: x must be contiguous float32 \(M, 512\), got float16"):
        ops.quant_matmul(x.astype(cupy.float16), w)
    with pytest.raises(OpArgumentError, match="got non-contiguous float32 \\(3, 256\\)"):
        ops.quant_matmul(x[:, :256], w)
    with pytest.raises(OpArgumentError, match="non-contiguous"):
        ops.quant_matmul(cupy.ones((512, 3), cupy.float32).T, w)
    with pytest.raises(OpArgumentError, match=r"out must be contiguous float32 \(3, 256\), got float32 \(3, 255\)"):
        ops.quant_matmul(x, w, out=cupy.empty((3, 255), cupy.float32))
    with pytest.raises(OpArgumentError, match="force_bucket must be a bucket that serves F16 at M = 3, got gemv_dp4a"):
        ops.quant_matmul(x, QuantTensor("h", QType.F16, (256, 512), np.ones((256, 512), np.float16)).to_device(),
                         force_bucket="gemv_dp4a")
    with pytest.raises(OpArgumentError, match="force_bucket must be a bucket that serves Q4_K at M = 65, got mma_kq"):
        ops.quant_matmul(cupy.ones((65, 512), cupy.float32), w, force_bucket="mma_kq")
    with pytest.raises(OpArgumentError, match="force_bucket must be a bucket that serves Q4_K at M = 33, got mma_dq"):
        ops.quant_matmul(cupy.ones((33, 512), cupy.float32), w, force_bucket="mma_dq")
    with pytest.raises(OpArgumentError, match="force_bucket must be a bucket that serves Q6_K at M = 3, got mma_dq"):
        ops.quant_matmul(x, QuantTensor("q", QType.Q6_K, (256, 512), random_blocks(QType.Q6_K, 256, 512, rng)).to_device(),
                         force_bucket="mma_dq")
    with pytest.raises(OpArgumentError, match="quant_matmul: x must be 16-byte aligned for mma_dq, got address"):
        ops.quant_matmul(cupy.ones(3 * 512 + 1, cupy.float32)[1:].reshape(3, 512), w, force_bucket="mma_dq")
    with pytest.raises(OpArgumentError, match="quant_matmul: x must be 16-byte aligned for mma_wg, got address"):
        ops.quant_matmul(cupy.ones(3 * 512 + 1, cupy.float32)[1:].reshape(3, 512), w, force_bucket="mma_wg")
    with pytest.raises(OpArgumentError, match="force_bucket must be a bucket that serves Q8_0 at M = 3, got gemv_kq"):
        ops.quant_matmul(x, QuantTensor("q", QType.Q8_0, (256, 512), random_blocks(QType.Q8_0, 256, 512, rng)).to_device(),
                         force_bucket="gemv_kq")
    host_w = QuantTensor("w", QType.Q4_K, (256, 512), random_blocks(QType.Q4_K, 256, 512, rng))
    with pytest.raises(OpArgumentError, match="on the device"):
        ops.quant_matmul(x, host_w)


def test_host_path_checks_shape():
    from glimmer_cupy.ops._check import OpArgumentError
    w = QuantTensor("w", QType.F32, (4, 64), np.ones((4, 64), np.float32))
    with pytest.raises(OpArgumentError, match=r"quant_matmul: x must be float32\|float64 \(M, 64\), got float32 \(2, 63\)"):
        ops.quant_matmul(np.ones((2, 63), np.float32), w)


@gpu
@pytest.mark.parametrize("q6k_rows", [4, 2, 1], ids=lambda r: f"q6k_rows{r}")
@pytest.mark.parametrize("types", [(QType.Q4_K, QType.Q6_K), (QType.Q6_K, QType.Q4_K)], ids=lambda t: f"{t[0].name}+{t[1].name}")
@pytest.mark.parametrize("na,nb,k", [(5120, 1024, 4096), (2560, 512, 1024), (77, 300, 768), (1024, 3, 12288)])
def test_pair_is_two_gemvs_bit_for_bit(types, na, nb, k, q6k_rows, monkeypatch):
    """quant_matmul_rows over two parts of different K-quant types at one row (one
    gemv_kq_pair_kernel launch) gives each part's columns exactly as its own quant_matmul does:
    the Qwen3-8B q|k beside a Q6_K v, small and odd row counts, a row count smaller than a block;
    the large pairs (above KQ_OCC_WEIGHTS) with their Q6_K part at each of KQ_PAIR_ROWS's choices
    (a row's sums depend on the warps a row set, which the pair keeps, not on the rows a warp)."""
    import cupy

    import glimmer_cupy.ops.matmul as matmul
    from glimmer_cupy.ops.matmul import quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    monkeypatch.setattr(matmul, "KQ_PAIR_ROWS", {QType.Q6_K: q6k_rows})
    rng = np.random.default_rng(na + nb + k)
    a = QuantTensor("a", types[0], (na, k), random_blocks(types[0], na, k, rng, 0.05)).to_device()
    b = QuantTensor("b", types[1], (nb, k), random_blocks(types[1], nb, k, rng, 0.05)).to_device()
    x = cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32))
    xin = Q8Rows(x, *quantize_x(x, types[0].name))
    out = cupy.full((1, na + nb), np.nan, np.float32)
    got = cupy.asnumpy(ops.quant_matmul_rows(xin, [a, b], out=out))
    want = np.concatenate([cupy.asnumpy(ops.quant_matmul(xin, a)), cupy.asnumpy(ops.quant_matmul(xin, b))], axis=-1)
    np.testing.assert_array_equal(got, want)


@gpu
@pytest.mark.parametrize("q", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (1, 77, 768), (2, 515, 1024), (3, 300, 2048)])
def test_kq_load_hint_switch_keeps_the_bits(q, m, n, k, monkeypatch):
    """gemv_kq as the library builds it, with GEMV_WEIGHTS_L2_256B (the weights' loads with L2's
    prefetch-size hint, kq_lanes.cuh; ops.matmul.KQ_DEFINES), gives the outputs of the build without
    the hint bit for bit, at M = 1 and a few rows (the table sends M <= 3 to gemv_kq for both types),
    on full and odd shapes, and the pair kernel too."""
    import cupy

    import glimmer_cupy.ops.matmul as matmul
    from glimmer_cupy.ops.matmul import quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    rng = np.random.default_rng(m * n + k)
    w = QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05)).to_device()
    other = QType.Q6_K if q == QType.Q4_K else QType.Q4_K
    v = QuantTensor("v", other, (64, k), random_blocks(other, 64, k, rng, 0.05)).to_device()
    x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
    xin = Q8Rows(x, *quantize_x(x, q.name))
    assert bucket(m, q) == "gemv_kq"

    def outputs():              # the GEMV, and at M = 1 the pair kernel
        got = [cupy.asnumpy(ops.quant_matmul(xin, w))]
        if m == 1:
            got.append(cupy.asnumpy(ops.quant_matmul_rows(xin, [w, v])))
        return got
    assert "GEMV_WEIGHTS_L2_256B" in matmul.KQ_DEFINES
    hinted = outputs()
    default_kernel = matmul._kq_kernel(matmul.block_trait(w), 1, 2, 1)
    monkeypatch.setattr(matmul, "KQ_DEFINES", {})
    assert matmul._kq_kernel(matmul.block_trait(w), 1, 2, 1) is not default_kernel   # another build
    for a, b in zip(hinted, outputs()):
        np.testing.assert_array_equal(a, b)


def test_rows_host_path_is_the_parts_joined():
    """On NumPy arrays quant_matmul_rows is each part's quant_matmul, joined along the columns."""
    rng = np.random.default_rng(4)
    parts = [QuantTensor(f"p{i}", q, (n, 512), random_blocks(q, n, 512, rng, 0.05))
             for i, (q, n) in enumerate([(QType.Q4_K, 40), (QType.Q6_K, 24), (QType.Q8_0, 8)])]
    x = rng.normal(0, 1, (3, 512)).astype(np.float32)
    want = np.concatenate([ops.quant_matmul(x, p) for p in parts], axis=-1)
    np.testing.assert_array_equal(ops.quant_matmul_rows(x, parts), want)


@gpu
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
@pytest.mark.parametrize("q", [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k", [(1027, 576), (515, 640), (77, 1536), (300, 32), (5, 4096)])
def test_staged_gemv_is_gemv_dp4a_bit_for_bit(q, n, k, rows, monkeypatch):
    """gemv_staged_kernel (each warp's rows copied into shared memory first) against gemv_dp4a_kernel,
    bit for bit, at every R it is built for and M up to STAGED_MAX_M, with N not a multiple of a
    block's rows and rows whose bytes start off a 16-byte boundary; and against float64."""
    import cupy
    from glimmer_cupy.ops import matmul
    rng = np.random.default_rng(int(q) * 1000 + n + rows)
    w = QuantTensor("w", q, (n, k), random_blocks(q, n, k, rng, 0.05))
    row_bytes = w.data.nbytes // n
    monkeypatch.setattr(matmul, "STAGED_ROWS", (rows,))
    if not matmul.staged_rows(row_bytes):                      # both sides would be gemv_dp4a
        pytest.skip(f"{rows} rows of {row_bytes} bytes exceed a warp's part; gemv_dp4a_kernel serves them")
    w_ref, w_dev = w.dequantize(np.float64), w.to_device()
    for m in range(1, matmul.STAGED_MAX_M + 1):
        x = rng.normal(0, 1, (m, k)).astype(np.float32)
        got = {}
        for staged in (True, False):
            monkeypatch.setattr(matmul, "STAGED_TYPES", frozenset({q}) if staged else frozenset())
            out = cupy.full((m, n), np.nan, dtype=cupy.float32)
            ops.quant_matmul(cupy.asarray(x), w_dev, out=out)
            got[staged] = cupy.asnumpy(out)
        np.testing.assert_array_equal(got[True], got[False], err_msg=f"{q.name} {n}x{k} M={m} R={rows}")
        ref = x.astype(np.float64) @ w_ref.T
        assert nmse(got[True], ref) < NMSE_BUDGET["gemv_dp4a"], (q.name, n, k, m, rows)


def test_staged_rows_fit_a_warps_part():
    """R is the most rows whose bytes fit a warp's part; a row that does not fit alone goes to gemv_dp4a
    (0), so no launch asks for more than 48 KB of dynamic shared memory."""
    from glimmer_cupy.ops.matmul import STAGED_WARP_BYTES, staged_rows, staged_smem
    assert staged_rows(612) == 8 and staged_rows(680) == 4 and staged_rows(1632) == 2   # Q8_0 K = 576, 640, 1536
    assert staged_rows(4352) == 1 and staged_rows(13056) == 0                           # K = 4096, 12288
    for rb in range(2, STAGED_WARP_BYTES + 1, 2):
        r = staged_rows(rb)
        assert r >= 1 and r * rb <= STAGED_WARP_BYTES and staged_smem(r, rb) <= 48 << 10
