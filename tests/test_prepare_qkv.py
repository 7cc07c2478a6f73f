"""prepare_qkv_ (q/k norm, RoPE, K/V write in one launch) on the GPU against the NumPy reference.

The reference runs in float64 inside (norm and rope) and its K/V are rounded to bf16 as the kernel
rounds, so what differs is float32 arithmetic in the kernel: q within NMSE 1e-10 of the reference
(measured error is at float32 rounding, ~1e-14), K/V equal to the reference's bf16 bits except
where a float32 difference of one ulp crosses a bf16 rounding boundary (at most a few per
thousand, each one bf16 ulp). Pools start as bf16 NaN, q as NaN: a missing write shows, and
cells the step does not own must stay NaN.
"""

import numpy as np
import pytest
from test_attention_gpu import BF16_NAN, bf16_bits, bf16_float, nmse

from glimmer_cupy import ops
from glimmer_cupy.ops._check import OpArgumentError
from glimmer_cupy.reference.attention import prepare_qkv_ as ref_prepare

gpu = pytest.mark.gpu


def case(rng, t, hq, hkv, d, n_cells=97, qk_norm=True):
    qkv = (rng.standard_normal((t, (hq + 2 * hkv) * d)) * 3).astype(np.float32)
    cells = rng.choice(np.arange(1, n_cells), t, replace=False).astype(np.int32)
    positions = rng.integers(0, 40000, t).astype(np.int32)
    norms = [(1 + 0.3 * rng.standard_normal(d)).astype(np.float32) for _ in range(2)] if qk_norm else [None, None]
    return qkv, cells, positions, norms


def run_both(qkv, cells, positions, norms, hq, hkv, d, n_cells=97, neox=True, rope_dim=None, base=1e6):
    import cupy

    kp = np.zeros((n_cells, hkv, d), np.float32)
    vp = np.zeros_like(kp)
    want_q = ref_prepare(qkv, kp, vp, cells, positions, hq, hkv, *norms, 1e-6, base, neox, rope_dim)
    kd = cupy.full((n_cells, hkv, d), BF16_NAN, cupy.uint16)
    vd = cupy.full((n_cells, hkv, d), BF16_NAN, cupy.uint16)
    out = cupy.full((qkv.shape[0], hq, d), np.nan, cupy.float32)
    dev = [None if n is None else cupy.asarray(n) for n in norms]
    got = ops.prepare_qkv_(cupy.asarray(qkv), kd, vd, cupy.asarray(cells), cupy.asarray(positions), hq, hkv, *dev,
                           1e-6, base, neox, rope_dim, out=out)
    return got.get(), want_q, kd.get(), vd.get(), bf16_bits(kp), bf16_bits(vp)


def assert_pools(got_k, got_v, want_k, want_v, cells):
    for got, want, name in ((got_k, want_k, "k"), (got_v, want_v, "v")):
        rows, ref_rows = got[cells], want[cells]
        off = np.count_nonzero(rows != ref_rows)
        assert off <= max(2, rows.size // 200), f"{name}: {off} of {rows.size} bf16 values differ"
        if off:
            assert np.abs(bf16_float(rows) - bf16_float(ref_rows)).max() <= \
                np.abs(bf16_float(ref_rows)).max() * 2 ** -7, f"{name}: a differing value is more than 1 ulp off"
        untouched = np.setdiff1d(np.arange(got.shape[0]), cells)
        assert (got[untouched] == BF16_NAN).all(), f"{name}: a cell outside the step was written"


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_matches_reference(d, neox, qk_norm):
    rng = np.random.default_rng(d + 2 * neox + qk_norm)
    for t, hq, hkv in ((1, 8, 2), (7, 9, 3), (33, 4, 1)):
        qkv, cells, positions, norms = case(rng, t, hq, hkv, d, qk_norm=qk_norm)
        q, want_q, k, v, want_k, want_v = run_both(qkv, cells, positions, norms, hq, hkv, d, neox=neox)
        assert np.isfinite(q).all() and nmse(q, want_q) < 1e-10, (t, hq, hkv, nmse(q, want_q))
        assert_pools(k, v, want_k, want_v, cells)


@gpu
def test_partial_rope_runs_the_unfused_ops():
    rng = np.random.default_rng(5)
    qkv, cells, positions, norms = case(rng, 5, 4, 2, 128)
    q, want_q, k, v, want_k, want_v = run_both(qkv, cells, positions, norms, 4, 2, 128, rope_dim=64)
    assert nmse(q, want_q) < 1e-10
    assert_pools(k, v, want_k, want_v, cells)


@gpu
def test_bad_input_before_launch():
    import cupy

    qkv = cupy.zeros((3, (4 + 4) * 64), cupy.float32)
    kd = cupy.zeros((10, 2, 64), cupy.uint16)
    cells, pos = cupy.zeros(3, cupy.int32), cupy.zeros(3, cupy.int32)
    with pytest.raises(OpArgumentError, match="prepare_qkv_: qkv"):
        ops.prepare_qkv_(qkv[:, :500], kd, kd.copy(), cells, pos, 4, 2)
    with pytest.raises(OpArgumentError, match="prepare_qkv_: k_pool"):
        ops.prepare_qkv_(qkv, cupy.zeros((10, 3, 64), cupy.uint16), kd, cells, pos, 4, 2)
    with pytest.raises(OpArgumentError, match="prepare_qkv_: cells"):
        ops.prepare_qkv_(qkv, kd, kd.copy(), cupy.zeros(2, cupy.int32), pos, 4, 2)


def test_norms_come_in_pairs():
    qkv = np.zeros((1, 8 * 64), np.float32)
    pool = np.zeros((4, 2, 64), np.float32)
    with pytest.raises(OpArgumentError, match="q_norm"):
        ops.prepare_qkv_(qkv, pool, pool.copy(), np.array([1]), np.array([0]), 4, 2, np.ones(64, np.float32), None)
