"""ops.attention_qkv: a one-token step as one kernel (attn_stream_kernel making its own q, K and V,
cuda_src/attention_stream.cu kPrepFused) against the two ops it replaces (prepare_qkv_ then
attention), bit for bit in the output, its int8 codes and the pools; against the NumPy path; inside
a PDL graph; and the calls it refuses."""

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops._check import OpArgumentError
from glimmer_cupy.ops.attention import workspace_size
from test_attention_gpu import BF16_NAN, BUDGETS, bf16_float, gpu, make_step, nmse


def step_inputs(rng, length, hq, hkv, d, qknorm):
    """One sequence of `length` positions whose last is the step's token: its cell poisoned (NaN)
    in both pools, a random qkv row, norm weights or None."""
    _, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [length], hq, hkv, d)
    wide = np.zeros((1, 1024), np.int32)                       # a graph's table: 16 splits
    wide[0, :table.shape[1]] = table[0]
    cells = np.array([table[0, length - 1]], np.int32)
    k_pool[cells] = BF16_NAN
    v_pool[cells] = BF16_NAN
    qkv = rng.standard_normal((1, (hq + 2 * hkv) * d)).astype(np.float32)
    norms = ((1 + 0.2 * rng.standard_normal(d)).astype(np.float32),
             (1 + 0.2 * rng.standard_normal(d)).astype(np.float32)) if qknorm else (None, None)
    return qkv, k_pool, v_pool, cells, wide, seq_lens, tok_seq, tok_pos, norms


def run(inputs, hq, hkv, d, neox, fuse, q8=False, window=0):
    import cupy
    qkv, k_pool, v_pool, cells, wide, seq_lens, tok_seq, tok_pos, (qn, kn) = inputs
    kp, vp = cupy.asarray(k_pool), cupy.asarray(v_pool)
    dev = [None if a is None else cupy.asarray(a) for a in (qkv, cells, wide, seq_lens, tok_seq, tok_pos, qn, kn)]
    out = cupy.full((1, hq, d), np.nan, cupy.float32)
    work = cupy.full(workspace_size(1, hq, d), np.nan, cupy.float32)
    got = ops.attention_qkv(dev[0], kp, vp, dev[1], hq, hkv, dev[6], dev[7], 1e-6, 1e6, neox, None, dev[2], dev[3],
                            dev[4], dev[5], d ** -0.5, window, q8=q8, out=out if not q8 else None, workspace=work,
                            fuse=fuse)
    return got, cupy.asnumpy(kp), cupy.asnumpy(vp)


@gpu
@pytest.mark.parametrize("hq,hkv", [(32, 8), (9, 3), (4, 1), (40, 8)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("qknorm", [False, True])
@pytest.mark.parametrize("length", [1, 65, 600, 1000])
def test_one_kernel_equals_the_two_ops(hq, hkv, d, neox, qknorm, length):
    """The same attention output and int8 codes, bit for bit, and the same K/V rows in the token's
    cell (which starts as NaN: a read of it before it is written would show), at every group size
    (the pushed and pulled cluster merges), head dim, pair layout, with and without q/k norms, and
    lengths from one position (one split) to 1000 (16)."""
    import cupy
    rng = np.random.default_rng(hq * 7 + d + length + 2 * neox + qknorm)
    inputs = step_inputs(rng, length, hq, hkv, d, qknorm)
    two, kp2, vp2 = run(inputs, hq, hkv, d, neox, fuse=False)
    one, kp1, vp1 = run(inputs, hq, hkv, d, neox, fuse=True)
    np.testing.assert_array_equal(kp1, kp2)
    np.testing.assert_array_equal(vp1, vp2)
    assert np.isfinite(cupy.asnumpy(one)).all()
    np.testing.assert_array_equal(cupy.asnumpy(one), cupy.asnumpy(two))
    c_two, _, _ = run(inputs, hq, hkv, d, neox, fuse=False, q8=True)
    c_one, _, _ = run(inputs, hq, hkv, d, neox, fuse=True, q8=True)
    for a, b in ((c_one.x, c_two.x), (c_one.q, c_two.q), (c_one.d, c_two.d), (c_one.s, c_two.s)):
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("window", [0, 100])
def test_one_kernel_matches_the_numpy_path(d, window):
    """Against the NumPy path of the same op (prepare_qkv_ then attention in float64-free NumPy),
    within the stream kernel's budget, with a sliding window too; the pools' new rows as the
    reference writes them (bf16 of its float32 K and V)."""
    import cupy
    hq, hkv = 16, 4
    rng = np.random.default_rng(d + window)
    inputs = step_inputs(rng, 700, hq, hkv, d, True)
    got, kp, vp = run(inputs, hq, hkv, d, True, fuse=True, window=window)
    qkv, k_pool, v_pool, cells, wide, seq_lens, tok_seq, tok_pos, (qn, kn) = inputs
    k_ref, v_ref = bf16_float(k_pool).copy(), bf16_float(v_pool).copy()
    want = ops.attention_qkv(qkv, k_ref, v_ref, cells, hq, hkv, qn, kn, 1e-6, 1e6, True, None, wide, seq_lens,
                             tok_seq, tok_pos, d ** -0.5, window)
    e = nmse(cupy.asnumpy(got), want)
    assert e < BUDGETS["stream"], e
    assert nmse(bf16_float(kp[cells]), k_ref[cells]) < 1e-5
    assert nmse(bf16_float(vp[cells]), v_ref[cells]) < 1e-5


@gpu
def test_one_kernel_in_a_pdl_graph():
    """Captured in a graph under programmatic dependent launch after the matmul-like kernel that
    writes qkv (here a copy): the same output as eager, and the qkv it reads is that step's."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    hq, hkv, d = 32, 8, 128
    rng = np.random.default_rng(5)
    inputs = step_inputs(rng, 600, hq, hkv, d, True)
    want, _, _ = run(inputs, hq, hkv, d, False, fuse=True)
    qkv, k_pool, v_pool, cells, wide, seq_lens, tok_seq, tok_pos, (qn, kn) = inputs
    src = cupy.asarray(qkv)
    staged = cupy.zeros_like(src)
    kp, vp = cupy.asarray(k_pool), cupy.asarray(v_pool)
    idx = [cupy.asarray(a) for a in (cells, wide, seq_lens, tok_seq, tok_pos, qn, kn)]
    out = cupy.full((1, hq, d), np.nan, cupy.float32)
    work = cupy.empty(workspace_size(1, hq, d), cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, overlapped():
        def step():
            ops.scale(src, 1.0, out=staged)
            ops.attention_qkv(staged, kp, vp, idx[0], hq, hkv, idx[5], idx[6], 1e-6, 1e6, False, None, idx[1],
                              idx[2], idx[3], idx[4], d ** -0.5, out=out, workspace=work, fuse=True)
        step()
        stream.synchronize()
        out.fill(np.nan)
        staged.fill(0)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(want))


@gpu
def test_one_kernel_refuses_what_it_cannot_do():
    """fuse=True on a two-token step or a masked one: a ValueError naming the argument."""
    import cupy
    hq, hkv, d = 8, 2, 64
    rng = np.random.default_rng(9)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [50, 40], hq, hkv, d)
    qkv = cupy.asarray(rng.standard_normal((2, (hq + 2 * hkv) * d)).astype(np.float32))
    cells = cupy.asarray(table[[0, 1], [49, 39]].astype(np.int32))
    args = [cupy.asarray(a) for a in (table, seq_lens, tok_seq, tok_pos)]
    with pytest.raises(OpArgumentError, match="attention_qkv.*fuse"):
        ops.attention_qkv(qkv, cupy.asarray(k_pool), cupy.asarray(v_pool), cells, hq, hkv, None, None, 1e-6, 1e4,
                          False, None, *args, d ** -0.5, fuse=True)


def test_numpy_path_is_the_two_ops_cpu():
    """On NumPy arrays attention_qkv is prepare_qkv_ then attention, to the bit, pools included;
    fuse changes nothing there."""
    hq, hkv, d = 8, 2, 64
    rng = np.random.default_rng(3)
    qkv, k_pool, v_pool, cells, wide, seq_lens, tok_seq, tok_pos, (qn, kn) = step_inputs(rng, 90, hq, hkv, d, True)
    pools = [bf16_float(k_pool).copy() for _ in range(2)], [bf16_float(v_pool).copy() for _ in range(2)]
    q = ops.prepare_qkv_(qkv, pools[0][0], pools[1][0], cells, tok_pos, hq, hkv, qn, kn, 1e-6, 1e6, True)
    want = ops.attention(q, pools[0][0], pools[1][0], wide, seq_lens, tok_seq, tok_pos, d ** -0.5)
    got = ops.attention_qkv(qkv, pools[0][1], pools[1][1], cells, hq, hkv, qn, kn, 1e-6, 1e6, True, None, wide,
                            seq_lens, tok_seq, tok_pos, d ** -0.5, fuse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(pools[0][1], pools[0][0])
    np.testing.assert_array_equal(pools[1][1], pools[1][0])
