"""attention and kv_write_ on the GPU against the NumPy reference (reference/attention.py).

Every GPU test of attention runs every kernel (the `kernel` fixture): "mma" (attention_mma.cu),
"stream" (the default: attention_stream.cu for decode-shaped steps, attention_wgmma.cu for the
others on Hopper), "wgmma" (the same) and "simt" (attention.cu). The
pools hold bf16; the reference reads the same bf16 values widened to float32, so only the
kernel's own error counts: for simt float32 scores and sums with exp2f, NMSE ~1e-12 on these
inputs, budget NMSE = mse(out, ref) / mse(ref, 0) < 1e-5; for mma and stream also q and P
rounded to bf16, budget MMA_NMSE_BUDGET (below). One wrong cell, position or head
gives 1e-3 or worse. Cells no token may read (cell 0 the scratch, cells past seq_lens, the free ones) hold
bf16 NaN, and outputs are filled with NaN before each call, so a stray read or a missing write
shows. The reference loops over tokens in Python: long contexts run with few tokens and heads.
"""

import sys

import numpy as np
import pytest

from glimmer_cupy import ops
from glimmer_cupy.ops._check import OpArgumentError
from glimmer_cupy.ops.attention import check_args, n_splits, workspace_size
from glimmer_cupy.ops.q8 import Q8Rows
from glimmer_cupy.reference.attention import attention as ref_attention

NMSE_BUDGET = 1e-5
# The tensor-core kernel rounds q (times scale * log2 e) and the softmax weights P to bf16 before
# the mma. Emulated on these inputs (tests/test_attention_mma_frag.py,
# test_bf16_rounding_error_is_inside_the_gpu_budget) that costs NMSE 2e-6 .. 7e-6; the budget is
# ~7x the worst. A wrong cell, position, mask or row gives 1e-3 or worse.
MMA_NMSE_BUDGET = 5e-5
BUDGETS = {"simt": NMSE_BUDGET, "mma": MMA_NMSE_BUDGET, "stream": MMA_NMSE_BUDGET, "wgmma": MMA_NMSE_BUDGET}
BF16_NAN = 0x7FC0
gpu = pytest.mark.gpu          # skipped without a device (conftest.py)


@pytest.fixture(params=["mma", "simt", "stream", "wgmma"])
def kernel(request):
    """Every attention kernel for every GPU test that takes it ("stream" and "wgmma" run
    decode-shaped steps on attention_stream.cu, the others on attention_wgmma.cu where it serves
    them, else as "mma")."""
    return request.param


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (finite x), as the kernel rounds."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def nmse(out, ref):
    return float(np.mean((out - ref) ** 2) / np.mean(ref ** 2))


def make_step(rng, lens, q_heads, kv_heads, d, per_seq=1, share=0):
    """Sequences of `lens` positions over scattered cells; the last `per_seq` positions of each are
    this step's tokens. share: sequence 1 reads sequence 0's first `share` cells (a shared prefix).
    Returns host arrays: q, K and V pools as bf16 bits (unused cells NaN), cell_table, seq_lens,
    tok_seq, tok_pos."""
    s, width = len(lens), max(lens) + 5                  # table wider than any sequence
    n_cells = s * width + 17
    perm = rng.permutation(np.arange(1, n_cells)).astype(np.int32)     # cell 0: scratch
    table = perm[:s * width].reshape(s, width).copy()
    if share:
        table[1, :share] = table[0, :share]
    k_pool = np.full((n_cells, kv_heads, d), BF16_NAN, np.uint16)
    v_pool = np.full((n_cells, kv_heads, d), BF16_NAN, np.uint16)
    for i, n in enumerate(lens):
        used = table[i, :n]
        k_pool[used] = bf16_bits(rng.normal(0, 1, (n, kv_heads, d)))
        v_pool[used] = bf16_bits(rng.normal(0, 1, (n, kv_heads, d)))
    tok_seq = np.repeat(np.arange(s), per_seq).astype(np.int32)
    tok_pos = np.concatenate([np.arange(max(n - per_seq, 0), max(n - per_seq, 0) + per_seq) for n in lens])
    q = rng.normal(0, 1, (len(tok_seq), q_heads, d)).astype(np.float32)
    return q, k_pool, v_pool, table, np.asarray(lens, np.int32), tok_seq, tok_pos.astype(np.int32)


def run_both(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, window=0, softcap=0.0, visible=None,
             device_index=True, force_splits=None, kernel="mma", **kw):
    """(kernel output, reference output) with out and the split workspace poisoned with NaN; index
    arrays on the device, or left on the host."""
    import cupy
    d = q.shape[2]
    scale = d ** -0.5
    # the reference never reads NaN cells: only visible positions
    ref = ref_attention(q, bf16_float(k_pool), bf16_float(v_pool), table, seq_lens, tok_seq, tok_pos, scale,
                        window, softcap, visible)
    idx = [table, seq_lens, tok_seq, tok_pos]
    if device_index:
        idx = [cupy.asarray(a) for a in idx]
    out = cupy.full(q.shape, np.nan, dtype=cupy.float32)
    work = cupy.full(workspace_size(q.shape[0], q.shape[1], d), np.nan, dtype=cupy.float32)
    vis = None if visible is None else cupy.asarray(visible)
    ops.attention(cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool), *idx, scale, window, softcap,
                  vis, out=out, workspace=work, force_splits=force_splits, kernel=kernel, **kw)
    return cupy.asnumpy(out), ref


def assert_q8_codes(res, rows, what="", sums=False):
    """res's int8 codes (q, d and with sums s) are quantize32's (gpu_rounding) of rows, bit for bit."""
    import cupy
    from gpu_rounding import q8_blocks
    codes, d, s = q8_blocks(rows.reshape(rows.shape[0], -1))
    np.testing.assert_array_equal(cupy.asnumpy(res.q).view(np.int8).reshape(codes.shape), codes, what)
    np.testing.assert_array_equal(cupy.asnumpy(res.d).reshape(d.shape), d, what)
    if sums:
        np.testing.assert_array_equal(cupy.asnumpy(res.s).reshape(s.shape), s, what)


def assert_close(got, ref, what, kernel="mma"):
    assert np.isfinite(got).all(), what
    e = nmse(got, ref)
    assert e < BUDGETS[kernel], (what, kernel, e)


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("length", [1, 7, 511, 512, 513, 4095])
def test_decode_lengths(d, length, kernel):
    rng = np.random.default_rng(length * 1000 + d)
    step = make_step(rng, [length, length], 8, 2, d)
    got, ref = run_both(*step, kernel=kernel)
    assert_close(got, ref, (d, length), kernel)


@gpu
def test_long_context(kernel):
    """32768 positions, one KV head and four query heads: many splits and the combine pass."""
    rng = np.random.default_rng(1)
    step = make_step(rng, [32768], 4, 1, 128)
    got, ref = run_both(*step, device_index=False, kernel=kernel)   # host seq_lens: the split count from 32768
    assert_close(got, ref, "32k", kernel)
    got, ref = run_both(*step, kernel=kernel)                       # device tables: from the table width
    assert_close(got, ref, "32k device tables", kernel)


@gpu
@pytest.mark.parametrize("splits", [1, 2, 3, 31, 200])
def test_forced_splits_agree(splits, kernel):
    """Any split count gives the same attention (the rule is a speed choice), empty splits included."""
    import cupy
    rng = np.random.default_rng(splits)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [1000, 37], 8, 2, 128)
    ref = ref_attention(q, bf16_float(k_pool), bf16_float(v_pool), table, seq_lens, tok_seq, tok_pos, 0.1)
    out = cupy.full(q.shape, np.nan, dtype=cupy.float32)
    work = cupy.full(workspace_size(q.shape[0], 8, 128, splits), np.nan, dtype=cupy.float32)   # poisoned too
    ops.attention(cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool), table, seq_lens, tok_seq, tok_pos,
                  0.1, out=out, workspace=work, force_splits=splits, kernel=kernel)
    assert_close(cupy.asnumpy(out), ref, splits, kernel)


@gpu
def test_mixed_lengths_one_batch(kernel):
    rng = np.random.default_rng(2)
    lens = [1, 7, 33, 511, 512, 513, 2000, 64]
    got, ref = run_both(*make_step(rng, lens, 32, 8, 128), kernel=kernel)
    assert_close(got, ref, "mixed", kernel)


@gpu
@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (6, 2), (9, 3), (16, 2), (20, 2), (7, 1), (32, 1)])
def test_gqa_groups(q_heads, kv_heads, kernel):
    """Group sizes 1, 3, 7, 8, 10 and 32: padded head chunks and groups over several chunks."""
    rng = np.random.default_rng(q_heads * 10 + kv_heads)
    got, ref = run_both(*make_step(rng, [300, 1500], q_heads, kv_heads, 64), kernel=kernel)
    assert_close(got, ref, (q_heads, kv_heads), kernel)


@gpu
def test_verify_blocks_shared_prefix(kernel):
    """16 tokens per sequence (a speculative block), two sequences sharing their first 400 cells."""
    rng = np.random.default_rng(3)
    got, ref = run_both(*make_step(rng, [900, 700], 16, 4, 128, per_seq=16, share=400), kernel=kernel)
    assert_close(got, ref, "verify", kernel)


@gpu
@pytest.mark.parametrize("length", [511, 512, 513, 3000])
@pytest.mark.parametrize("d", [64, 256])
def test_sliding_window(length, d, kernel):
    rng = np.random.default_rng(length + d)
    step = make_step(rng, [length, length + 1], 8, 4, d, per_seq=4)
    got, ref = run_both(*step, window=512, kernel=kernel)
    assert_close(got, ref, ("window", length, d), kernel)


@gpu
def test_softcap(kernel):
    rng = np.random.default_rng(4)
    q, *rest = make_step(rng, [1200], 8, 2, 256)
    got, ref = run_both(q * 8, *rest, softcap=5.0, kernel=kernel)   # large scores so the cap bites
    assert_close(got, ref, "softcap", kernel)


def hidden_row_step(seed: int, d: int):
    """A packed step of two sequences (5 tokens each) with a random visibility mask in which token 2
    sees nothing (its output must be zeros, not NaN) and token 6 only the last position."""
    rng = np.random.default_rng(seed)
    step = make_step(rng, [40, 1300], 8, 2, d, per_seq=5)
    t, width = step[0].shape[0], step[3].shape[1]
    visible = rng.random((t, width)) < 0.3
    visible[2] = False
    visible[6, :] = False
    visible[6, 1299] = True
    return step, visible


@gpu
@pytest.mark.parametrize("d", [64, 128])
def test_visible_mask_with_hidden_row(d, kernel):
    step, visible = hidden_row_step(5 + d, d)
    got, ref = run_both(*step, visible=visible.astype(np.uint8), kernel=kernel)
    assert (got[2] == 0).all()
    assert_close(got, ref, "visible", kernel)
    got_b, _ = run_both(*step, visible=visible, kernel=kernel)      # bool masks read the same
    np.testing.assert_array_equal(got_b, got)


@gpu
def test_all_hidden_splits_give_zeros(kernel):
    """A zero-length sequence beside a long one: its token sees nothing, and every one of its splits is empty."""
    rng = np.random.default_rng(6)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [3000, 5], 8, 2, 128)
    seq_lens[1] = 0
    got, ref = run_both(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, kernel=kernel)
    assert (got[1] == 0).all()
    assert_close(got, ref, "empty", kernel)


@gpu
def test_kv_write_round_trips_bf16():
    import cupy
    rng = np.random.default_rng(7)
    t, hkv, d, n_cells = 37, 8, 128, 100
    k = (rng.normal(0, 1, (t, hkv, d)) * 10.0 ** rng.integers(-3, 4, (t, hkv, 1))).astype(np.float32)
    v = rng.normal(0, 1, (t, hkv, d)).astype(np.float32)
    cells = rng.permutation(np.arange(1, n_cells))[:t].astype(np.int32)
    cells[-3:] = 0                                          # padding rows write the scratch cell
    k[-3:] = k[-4]
    v[-3:] = v[-4]
    k_pool = cupy.full((n_cells, hkv, d), 0x1234, cupy.uint16)
    v_pool = cupy.full((n_cells, hkv, d), 0x1234, cupy.uint16)
    ops.kv_write_(k_pool, v_pool, cupy.asarray(k), cupy.asarray(v), cupy.asarray(cells))
    kp, vp = cupy.asnumpy(k_pool), cupy.asnumpy(v_pool)
    np.testing.assert_array_equal(kp[cells], bf16_bits(k))
    np.testing.assert_array_equal(vp[cells], bf16_bits(v))
    untouched = np.setdiff1d(np.arange(n_cells), cells)
    assert (kp[untouched] == 0x1234).all() and (vp[untouched] == 0x1234).all()
    # bf16 values written again come back bit for bit
    ops.kv_write_(k_pool, v_pool, cupy.asarray(bf16_float(kp[cells])), cupy.asarray(bf16_float(vp[cells])),
                  cupy.asarray(cells))
    np.testing.assert_array_equal(cupy.asnumpy(k_pool), kp)
    np.testing.assert_array_equal(cupy.asnumpy(v_pool), vp)


@gpu
def test_bad_input_before_launch():
    import cupy
    rng = np.random.default_rng(8)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [10], 4, 2, 64)
    qd, kd, vd = cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool)
    with pytest.raises(OpArgumentError, match="attention: k_pool must be contiguous uint16"):
        ops.attention(qd, kd.astype(cupy.float32), vd, table, seq_lens, tok_seq, tok_pos, 0.1)
    with pytest.raises(OpArgumentError, match="attention: out must be contiguous float32"):
        ops.attention(qd, kd, vd, table, seq_lens, tok_seq, tok_pos, 0.1, out=cupy.empty((1, 4, 63), cupy.float32))
    with pytest.raises(OpArgumentError, match="kv_write_: k must be contiguous float32"):
        ops.kv_write_(kd, vd, cupy.ones((3, 2, 32), cupy.float32), cupy.ones((3, 2, 64), cupy.float32),
                      cupy.zeros(3, cupy.int32))
    work = cupy.empty(workspace_size(1, 4, 64, 2) + 1, cupy.float32)
    with pytest.raises(OpArgumentError, match="attention: workspace must be an 8-byte aligned array"):
        ops.attention(qd, kd, vd, table, seq_lens, tok_seq, tok_pos, 0.1, workspace=work[1:], force_splits=2,
                      force_cluster=1)
    with pytest.raises(OpArgumentError, match="attention: workspace must be at least"):
        ops.attention(qd, kd, vd, table, seq_lens, tok_seq, tok_pos, 0.1, workspace=work[:8], force_splits=2,
                      force_cluster=1)


# -- argument checks, on the CPU (check_args reads shapes and dtypes, and NumPy index values) --

def host_args(t=3, hq=8, hkv=2, d=128, s=2, width=50, n_cells=200):
    return dict(q=np.zeros((t, hq, d), np.float32), k_pool=np.zeros((n_cells, hkv, d), np.uint16),
                v_pool=np.zeros((n_cells, hkv, d), np.uint16), cell_table=np.zeros((s, width), np.int32),
                seq_lens=np.full(s, width, np.int32), tok_seq=np.zeros(t, np.int32),
                tok_pos=np.zeros(t, np.int32), window=0, softcap=0.0, visible=None)


@pytest.mark.parametrize("change,message", [
    (dict(q=np.zeros((3, 8, 96), np.float32)), r"attention: q must be head_dim one of \(64, 128, 256\), got head_dim 96"),
    (dict(q=np.zeros((3, 7, 128), np.float32)), "q must be q_heads a multiple of kv_heads = 2, got q_heads = 7"),
    (dict(q=np.zeros((3, 8, 128), np.float16)), r"q must be contiguous float32 \(t, h, d\), got float16"),
    (dict(k_pool=np.zeros((200, 2, 128), np.float32)), "k_pool must be contiguous uint16"),
    (dict(k_pool=np.zeros((200, 2, 64), np.uint16)), r"k_pool must be contiguous uint16 \(cells, kv_heads, 128\)"),
    (dict(v_pool=np.zeros((199, 2, 128), np.uint16)), r"v_pool must be contiguous uint16 \(200, 2, 128\), got uint16 \(199, 2, 128\)"),
    (dict(cell_table=np.zeros((2, 50), np.int64)), "cell_table must be contiguous int32"),
    (dict(seq_lens=np.full(3, 5, np.int32)), r"seq_lens must be contiguous int32 \(2,\), got int32 \(3,\)"),
    (dict(tok_pos=np.zeros(4, np.int32)), r"tok_pos must be contiguous int32 \(3,\)"),
    (dict(visible=np.zeros((3, 49), np.uint8)), r"visible must be contiguous uint8\|bool \(3, 50\)"),
    (dict(seq_lens=np.array([50, 51], np.int32)), "seq_lens must be at most the cell_table width 50, got max 51"),
    (dict(tok_seq=np.array([0, 1, 2], np.int32)), r"tok_seq must be indices into the 2 sequences, got range 0..2"),
    (dict(cell_table=np.full((2, 50), 200, np.int32)), r"cell_table must be cells in 0..199, got range 200..200"),
    (dict(window=-1), "window must be 0 .off. or a positive number of positions, got -1"),
    (dict(softcap=float("nan")), "softcap must be 0.0 .off. or positive, got nan"),
])
def test_argument_checks(change, message):
    args = host_args()
    args.update(change)
    with pytest.raises(OpArgumentError, match=message):
        check_args(**args)
    assert issubclass(OpArgumentError, ValueError)


def test_good_arguments_pass():
    check_args(**host_args())
    check_args(**host_args(hq=9, hkv=3, d=64))
    check_args(**{**host_args(d=256), "visible": np.zeros((3, 50), bool)})


def test_split_rule():
    """Batch 1 at 32k fills the SMs with splits; big batches and short contexts barely split."""
    assert n_splits(8, 32768, 132) == 33               # one wave of 2 blocks per SM: 264 // 8
    assert n_splits(8, 1024, 132) == 32                # no split under 32 positions (one tile)
    assert n_splits(64, 8192, 132) == 4
    assert n_splits(256, 32768, 132) == 1
    assert n_splits(8, 100, 132) == 4
    assert n_splits(8, 32, 132) == 1
    assert n_splits(1, 10 ** 7, 132) == 256            # MAX_SPLITS (264 wanted)


BENCH_CASES = [(b, ctx) for ctx in (1024, 8192, 32768) for b in (1, 8, 32, 64)]


@pytest.mark.parametrize("b,ctx", BENCH_CASES)
def test_bench_shapes_in_bounds(b, ctx):
    """bench/bench_attention.py's cases (Qwen3-8B: 32 q / 8 KV heads, D 128): the workspace it
    passes holds the split rule's partials, and the furthest offsets the split and combine kernels
    compute stay inside the pool, the cell table and the partials (CPU only: the arithmetic)."""
    from bench.bench_attention import D, HKV, HQ
    from glimmer_cupy.benchmarks.timing import n_sets
    cells = n_sets(b * ctx * HKV * D * 4) * b * ctx + 1
    splits = n_splits(b * HKV, ctx, 132)
    need, n_acc = workspace_size(b, HQ, D, splits), splits * b * HQ * D
    assert workspace_size(b, HQ, D) >= need
    # attention.cu's Span: whole tiles of 32 positions, `per` to a block, `active` blocks with work
    tiles = -(-ctx // 32)
    per = -(-tiles // splits)
    active = -(-tiles // per)
    assert active <= splits and (active - 1) * per < tiles <= active * per
    assert (cells - 1) * HKV * D + (HKV - 1) * D + D - 1 < cells * HKV * D
    last = (active - 1) * b * HQ + b * HQ - 1                        # partial row of the last active split
    assert last * D + D - 1 < n_acc and 2 * last + 1 < need - n_acc


@gpu
def test_bench_case_waits_for_its_inputs():
    """Regression (B=8 ctx=8192 on the H200: cudaErrorInvalidAddressSpace): the benchmark builds
    its pools and index arrays on the default stream and times on a non-blocking one, so it must
    synchronize in between. A spin ahead of the setup keeps the default stream busy; without the
    sync the first launch reads the unwritten cell table and tok_seq (stale NaN-filled pool memory
    from earlier tests) as indices."""
    import cupy
    from bench import bench_attention
    from glimmer_cupy.benchmarks.timing import _spin
    rng = np.random.default_rng(0)
    for b, ctx in ((8, 1024), (8, 2048)):
        _spin(50_000)                                   # 50 ms of default-stream work ahead of the setup
        row = bench_attention.run_case(b, ctx, rng, launches=2, reps=1, copy_bw=1e12, torch=None,
                                       splits_sweep=())
        cupy.cuda.Device().synchronize()
        assert row["splits"] == n_splits(b * 8, ctx, bench_attention.sm_count()) and row["us"] > 0


def test_bench_exact_arbiter_matches_reference_cpu():
    """bench_attention's float64 arbiter (used to decide kernel vs SDPA at large pools) agrees with the
    NumPy reference on scattered cells, GQA 4; and its NMSE flags zero / non-finite outputs. CPU only."""
    import math
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.bench_attention import exact_rows, nmse
    from glimmer_cupy.reference import attention as refmod
    rng = np.random.default_rng(1)
    b, ctx, hq, hkv, d = 3, 40, 8, 2, 16
    cells = b * ctx + 1
    bits = lambda shape: (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    k_bits, v_bits = bits((cells, hkv, d)), bits((cells, hkv, d))
    table = rng.permutation(np.arange(1, cells)).astype(np.int32).reshape(b, ctx)
    q = rng.standard_normal((b, hq, d)).astype(np.float32)
    scale = d ** -0.5
    got = exact_rows(np, q, k_bits, v_bits, table, [0, b - 1], scale)
    kf = (k_bits.astype(np.uint32) << 16).view(np.float32)
    vf = (v_bits.astype(np.uint32) << 16).view(np.float32)
    want = refmod.attention(q, kf, vf, table, np.full(b, ctx, np.int32), np.arange(b, dtype=np.int32),
                            np.full(b, ctx - 1, np.int32), scale)
    assert nmse(np, got, want[[0, b - 1]]) < 1e-10
    assert nmse(np, np.zeros_like(got), got) == 1.0
    assert math.isinf(nmse(np, got, np.zeros_like(got)))
    assert math.isnan(nmse(np, np.full_like(got, np.inf), got))


def test_bench_table_marks_an_sdpa_time_whose_output_was_off():
    """A row where SDPA's output missed the exact rows (zeros: NMSE inf, or garbage, or NaN) keeps its
    time but says so in the table; a row whose output matched is printed plain. CPU only."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.bench_attention import markdown
    row = dict(batch=8, context=32768, splits=4, us=361.3, kv_gbps=2970.0, of_copy=0.70, torch_us=238.3,
               torch_gbps=4510.0, stream_us=286.4, stream_splits=2, stream_of_copy=0.88)
    meta = dict(gpu="GPU", date="today", commit="abc", copy_tbps=4.24)
    def line(v):
        return markdown(meta, [dict(row, torch_nmse_vs_exact=v)]).splitlines()[-1]
    assert "| 238.3 | 4.51 |" in line(8e-6) and "off" not in line(8e-6)
    assert line(8e-6).endswith("| 286.4 | 2 | 88% |")            # the stream kernel's own split count
    table = markdown(meta, [dict(row, torch_nmse_vs_exact=8e-6)]).splitlines()
    assert table[-3].count("|") == table[-2].count("|") == table[-1].count("|")
    for v in (float("inf"), 1.0, float("nan")):
        assert f"| 238.3 (its output off: NMSE {v:.1e}) | 4.51 |" in line(v), line(v)


# -- the tensor-core kernel's own shapes: prefill-shaped blocks (64 and 128 rows), pipeline depths --


def run_mma(*step, **kw):
    """run_both on the tensor-core kernel."""
    return run_both(*step, kernel="mma", **kw)


def assert_mma_close(got, ref, what):
    assert_close(got, ref, what, "mma")


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("length", [1, 7, 511, 512, 513, 4095])
@pytest.mark.parametrize("per_seq", [1, 16])
@pytest.mark.parametrize("rows", [None, 128])
def test_mma_lengths(d, length, per_seq, rows):
    """Decode (one token a sequence: 16-row blocks, split) and prefill-shaped steps (16 tokens a
    sequence: 64-row blocks, causal inside the step's own tokens); and both in 128-row blocks of
    8 warps (rows=128: decode tokens of both sequences in one block, one pass each)."""
    rng = np.random.default_rng(length * 1000 + d + per_seq)
    step = make_step(rng, [length, length], 8, 2, d, per_seq=min(per_seq, length))
    got, ref = run_mma(*step, force_rows=rows)
    assert_mma_close(got, ref, (d, length, per_seq, rows))


@gpu
@pytest.mark.parametrize("rows", [None, 64, 128])
def test_mma_causal_prompt(rows):
    """A whole 700-token prompt of Qwen3-8B's heads (32 q / 8 kv, D 128), causal from position 0,
    as a prefill step runs it: diagonal tiles masked, the others on the unmasked path, token
    blocks launched in reverse."""
    rng = np.random.default_rng(30)
    got, ref = run_mma(*make_step(rng, [700], 32, 8, 128, per_seq=700), force_rows=rows)
    assert_mma_close(got, ref, ("prompt", rows))


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("per_seq,rows", [(1, None), (1, 16), (40, 64), (40, 128)])
def test_mma_stages_are_bit_identical(d, per_seq, rows):
    """Every pipeline depth gives the same output bit for bit (the depth changes which buffer a
    tile lands in, never the arithmetic): a split decode step and a prefill-shaped one, 64 and
    128 rows; each depth also against the reference."""
    from glimmer_cupy.ops.attention import MMA_STAGES, MMA_VARIANTS, mma_plan
    rng = np.random.default_rng(31 + d + per_seq)
    step = make_step(rng, [3000, 300], 8, 2, d, per_seq=per_seq)
    t = step[0].shape[0]
    mw = mma_plan(t, 2, 4, 3000, 2, force_rows=rows)[0]
    depths = [st for st in MMA_STAGES if (d, mw, st) in MMA_VARIANTS]
    assert len(depths) >= 1 + (d < 256 or mw == 1)
    outs = []
    for st in depths:
        got, ref = run_mma(*step, force_rows=rows, force_stages=st)
        assert_mma_close(got, ref, (d, per_seq, rows, st))
        outs.append(got)
    for st, got in zip(depths[1:], outs[1:]):
        np.testing.assert_array_equal(got, outs[0], err_msg=f"{st} stages vs {depths[0]}")


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("lens,per_seq,rows", [
    ([3000, 300], 1, None),             # split decode, 16-row blocks, four warps along a tile
    ([3000, 7], 1, 16),                 # a partial last tile: zero-filled rows
    ([700, 65], 40, 64),                # prefill-shaped, one warp a row group along all 64 positions
    ([700, 65], 40, 128),               # 128-row blocks: eight warps copy a tile
])
def test_mma_swizzled_tiles_equal_padded(monkeypatch, d, lens, per_seq, rows):
    """attn_mma_kernel's K/V tiles in swizzled rows (at_swz, the default) against the same kernel
    built with ATTN_MMA_PADDED_TILES (padded rows, at): the same bytes reach the same fragments, so
    the same output bit for bit; and the reference's attention."""
    att = sys.modules["glimmer_cupy.ops.attention"]
    if rows == 128 and (d, 8, att.MMA_DEPTH) not in att.MMA_VARIANTS:
        pytest.skip(f"no 128-row build at head dim {d} and {att.MMA_DEPTH} stages")
    rng = np.random.default_rng(d + per_seq + len(lens))
    step = make_step(rng, lens, 8, 2, d, per_seq=per_seq)
    swizzled, ref = run_mma(*step, force_rows=rows)
    use_defines(monkeypatch, "_mma_kernel", ["ATTN_MMA_PADDED_TILES"])
    padded, _ = run_mma(*step, force_rows=rows)
    np.testing.assert_array_equal(swizzled, padded)
    assert_mma_close(swizzled, ref, (d, lens, per_seq, rows))


@gpu
@pytest.mark.parametrize("per_seq", [1, 3])
@pytest.mark.parametrize("rows", [None, 64, 128])
def test_mma_mixed_batch(per_seq, rows):
    """Eight sequences of mixed lengths; with three tokens each the 64- and 128-row blocks hold
    tokens of several sequences (one pass per sequence)."""
    rng = np.random.default_rng(12 + per_seq)
    lens = [1, 7, 33, 511, 512, 513, 2000, 64]
    got, ref = run_mma(*make_step(rng, lens, 32, 8, 128, per_seq=per_seq), force_rows=rows)
    assert_mma_close(got, ref, ("mixed", per_seq, rows))


@gpu
@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (9, 3), (20, 2), (7, 1), (32, 1), (128, 1)])
@pytest.mark.parametrize("per_seq", [1, 8])
@pytest.mark.parametrize("rows", [None, 128])
def test_mma_gqa_groups(q_heads, kv_heads, per_seq, rows):
    """Groups 1, 3, 7, 10, 32 and 128: padded rows, several tokens a block, head chunks."""
    rng = np.random.default_rng(q_heads * 10 + kv_heads + per_seq)
    got, ref = run_mma(*make_step(rng, [300, 1500], q_heads, kv_heads, 64, per_seq=per_seq), force_rows=rows)
    assert_mma_close(got, ref, (q_heads, kv_heads, per_seq, rows))


@gpu
@pytest.mark.parametrize("length", [511, 512, 513, 3000])
@pytest.mark.parametrize("d,per_seq,rows", [(64, 4, None), (256, 1, None), (128, 70, None), (128, 70, 128),
                                            (256, 70, 128)])
def test_mma_sliding_window(length, d, per_seq, rows):
    rng = np.random.default_rng(length + d + per_seq)
    step = make_step(rng, [length, length + 1], 8, 4, d, per_seq=per_seq)
    got, ref = run_mma(*step, window=512, force_rows=rows)
    assert_mma_close(got, ref, ("window", length, d, per_seq, rows))


@gpu
@pytest.mark.parametrize("rows", [None, 128])
def test_mma_softcap(rows):
    rng = np.random.default_rng(21)
    q, *rest = make_step(rng, [1200], 8, 2, 256, per_seq=5)
    got, ref = run_mma(q * 8, *rest, softcap=5.0, force_rows=rows)
    assert_mma_close(got, ref, ("softcap", rows))


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("rows", [None, 128])
def test_mma_visible_mask_with_hidden_row(d, rows):
    step, visible = hidden_row_step(22 + d, d)
    got, ref = run_mma(*step, visible=visible.astype(np.uint8), force_rows=rows)
    assert (got[2] == 0).all()
    assert_mma_close(got, ref, ("visible", rows))


def check_q8_codes(kernel: str, per_seq: int, seed: int):
    """q8=True on `kernel`: the output is the same, and its int8 codes are those of quantize32
    (gpu_rounding) applied to that output, bit for bit (q8_lane in the epilogue, as in attn_kernel)."""
    import cupy
    rng = np.random.default_rng(seed)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [700, 300], 32, 8, 128, per_seq=per_seq)
    args = (cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool), cupy.asarray(table),
            cupy.asarray(seq_lens), cupy.asarray(tok_seq), cupy.asarray(tok_pos), 128 ** -0.5)
    res = ops.attention(*args, q8=True, kernel=kernel)
    plain = cupy.asnumpy(ops.attention(*args, kernel=kernel))
    if not hasattr(res, "q"):
        pytest.skip("no codes made for this shape (wants_q8)")
    np.testing.assert_array_equal(cupy.asnumpy(res.x), plain)
    assert_q8_codes(res, plain, sums=True)


@gpu
@pytest.mark.parametrize("per_seq", [1, 4])
def test_mma_q8_codes(per_seq):
    check_q8_codes("mma", per_seq, 24 + per_seq)


# -- the warpgroup kernel's own shapes (attention_wgmma.cu: prefill-shaped steps, 128-row blocks) --


def run_wgmma(*step, **kw):
    """run_both on the warpgroup kernel (Hopper only: elsewhere the test is skipped)."""
    from glimmer_cupy.ops.attention import wgmma_runs
    hq, d = step[0].shape[1:]
    if not wgmma_runs(d, hq // step[1].shape[1], "wgmma"):
        pytest.skip("attn_wgmma_kernel needs an sm_90 device and head dim 64 or 128")
    return run_both(*step, kernel="wgmma", **kw)


@gpu
def test_wgmma_serves_prefill_on_hopper():
    """On an sm_90 device the default route sends prefill-shaped steps of head dim 64 and 128 to
    attn_wgmma_kernel (not 256), and its module compiles for sm_90a."""
    import cupy
    from glimmer_cupy.ops.attention import WGMMA_VARIANTS, _wgmma_kernel, wgmma_runs
    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("not an sm_90 device")
    assert wgmma_runs(128, 1) and wgmma_runs(128, 4) and wgmma_runs(64, 3) and not wgmma_runs(256, 4)
    assert wgmma_runs(64, 3, "wgmma") and not wgmma_runs(256, 4, "wgmma") and not wgmma_runs(128, 4, "mma")
    for v in WGMMA_VARIANTS:
        assert _wgmma_kernel(*v).fn.ptr, v


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("length", [7, 511, 512, 513, 4095])
@pytest.mark.parametrize("per_seq", [16, 70])
def test_wgmma_lengths(d, length, per_seq):
    """Prefill-shaped steps (the last per_seq positions of two sequences, causal inside the step's
    own tokens): 32 tokens a block, so a block holds tokens of both sequences when per_seq is 16."""
    rng = np.random.default_rng(length * 1000 + d + per_seq)
    step = make_step(rng, [length, length], 8, 2, d, per_seq=min(per_seq, length))
    got, ref = run_wgmma(*step)
    assert_close(got, ref, (d, length, per_seq), "wgmma")


@gpu
@pytest.mark.parametrize("length", [700, 2048])
@pytest.mark.parametrize("heads", [(32, 8, 128), (9, 3, 64)], ids=["qwen3-8b", "smollm2"])
def test_wgmma_causal_prompt(length, heads):
    """A whole prompt of Qwen3-8B's heads (32 q / 8 kv, D 128) or SmolLM2's (9 / 3, D 64), causal
    from position 0, as a prefill step runs it; and the same step on attn_mma_kernel gives nearly
    the same output (both round q and P to bf16, in different summation orders)."""
    rng = np.random.default_rng(30 + length + heads[2])
    step = make_step(rng, [length], *heads, per_seq=length)
    got, ref = run_wgmma(*step)
    assert_close(got, ref, ("prompt", length, heads), "wgmma")
    other, _ = run_mma(*step)
    assert nmse(other, got) < MMA_NMSE_BUDGET


@gpu
@pytest.mark.parametrize("per_seq", [3, 40])
@pytest.mark.parametrize("d", [64, 128])
def test_wgmma_variants_are_bit_identical(per_seq, d):
    """Eight sequences of mixed lengths (blocks hold tokens of several sequences: one pass each),
    on every variant: 64- and 128-row blocks, each depth, with and without the producer
    warpgroup. Each against the reference; the variants of one block size give the same output bit
    for bit."""
    from glimmer_cupy.ops.attention import WGMMA_VARIANTS
    rng = np.random.default_rng(12 + per_seq + d)
    lens = [1, 7, 33, 511, 512, 513, 2000, 64]
    step = make_step(rng, lens, 32, 8, d, per_seq=per_seq)
    first = {}
    for _, st, rows, producer in (v for v in WGMMA_VARIANTS if v[0] == d):
        got, ref = run_wgmma(*step, force_stages=st, force_rows=rows, force_producer=producer)
        assert_close(got, ref, ("mixed", per_seq, d, st, rows, producer), "wgmma")
        if rows in first:
            np.testing.assert_array_equal(got, first[rows], err_msg=f"{st} stages, producer {producer}")
        first.setdefault(rows, got)


@gpu
@pytest.mark.parametrize("blocks", [1, 3, 7])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("rows", [64, 128])
def test_wgmma_resident_blocks_take_many_items(blocks, d, rows, monkeypatch):
    """With the producer, a launch of a few resident blocks, each taking many items (token tables
    double-buffered, its copies' stages and barriers carried from item to item), gives the output
    of a block an item bit for bit, at 64 and 128 rows a block: mixed sequences (several passes a
    block), a window, a visibility mask with a hidden row, a softcap."""
    import sys
    attention = sys.modules["glimmer_cupy.ops.attention"]    # the module (ops.attention is the function)
    rng = np.random.default_rng(70 + blocks + d)
    cases = [(make_step(rng, [1, 7, 33, 511, 512, 513, 900, 64], 32, 8, d, per_seq=40), {}),
             (make_step(rng, [700, 701], 8, 4, d, per_seq=300), dict(window=512)),
             (make_step(rng, [1200], 8, 2, d, per_seq=50), dict(softcap=5.0))]
    step, visible = hidden_row_step(23 + d, d)
    cases.append((step, dict(visible=visible.astype(np.uint8))))
    for i, (step, kw) in enumerate(cases):
        monkeypatch.setattr(attention, "WGMMA_PERSISTENT", False)
        one, ref = run_wgmma(*step, force_producer=True, force_rows=rows, **kw)
        monkeypatch.setattr(attention, "WGMMA_PERSISTENT", True)
        monkeypatch.setattr(attention, "WGMMA_MAX_BLOCKS", blocks)
        got, _ = run_wgmma(*step, force_producer=True, force_rows=rows, **kw)
        monkeypatch.setattr(attention, "WGMMA_MAX_BLOCKS", None)
        assert_close(got, ref, ("resident", blocks, d, rows, i), "wgmma")
        np.testing.assert_array_equal(got, one, err_msg=f"case {i}, {blocks} blocks")


@gpu
@pytest.mark.parametrize("q_heads,kv_heads", [(8, 8), (12, 4), (16, 2), (9, 3), (64, 1)])
def test_wgmma_gqa_groups(q_heads, kv_heads):
    """GQA groups of 1, 3, 8, 3 and 64 query heads: rows // group tokens a block, padding rows when
    the group does not divide the rows."""
    rng = np.random.default_rng(q_heads * 10 + kv_heads)
    got, ref = run_wgmma(*make_step(rng, [300, 1500], q_heads, kv_heads, 128, per_seq=37))
    assert_close(got, ref, (q_heads, kv_heads), "wgmma")


@gpu
@pytest.mark.parametrize("length", [511, 512, 513, 3000])
@pytest.mark.parametrize("d,per_seq", [(64, 70), (128, 4), (128, 70), (128, 600)])
def test_wgmma_sliding_window(length, d, per_seq):
    rng = np.random.default_rng(length + d + per_seq)
    step = make_step(rng, [length, length + 1], 8, 4, d, per_seq=min(per_seq, length))
    got, ref = run_wgmma(*step, window=512)
    assert_close(got, ref, ("window", length, d, per_seq), "wgmma")


@gpu
@pytest.mark.parametrize("d", [64, 128])
def test_wgmma_softcap_and_visible_mask(d):
    rng = np.random.default_rng(41 + d)
    q, *rest = make_step(rng, [1200], 8, 2, d, per_seq=50)
    got, ref = run_wgmma(q * 8, *rest, softcap=5.0)
    assert_close(got, ref, ("softcap", d), "wgmma")
    step, visible = hidden_row_step(22 + d, d)
    got, ref = run_wgmma(*step, visible=visible.astype(np.uint8))
    assert (got[2] == 0).all()
    assert_close(got, ref, ("visible", d), "wgmma")


@gpu
def test_wgmma_q8_codes():
    from glimmer_cupy.ops.attention import wgmma_runs
    if not wgmma_runs(128, 4):
        pytest.skip("attn_wgmma_kernel needs an sm_90 device")
    check_q8_codes("wgmma", 16, 25)        # 32 tokens of two sequences: a prefill-shaped step that makes codes


def test_wgmma_rows_rule_cpu():
    """Prefill blocks of 128 rows at head dim 128 where resident producer blocks get at least 3.25
    128-row items an SM, else 64: Qwen3-8B heads at T = 2048 (512 items of 32 tokens) and 8192, not
    at 512, 1024 or 1696 (128, 256 and 424 items on 132 SMs); not at head dim 64 (SmolLM2's 9 / 3
    heads), nor for blocks that are not resident."""
    from glimmer_cupy.ops.attention import wgmma_rows
    assert wgmma_rows(2048, 4, 8, 128, 132, True) == 128
    assert wgmma_rows(8192, 4, 8, 128, 132, True) == 128
    assert wgmma_rows(512, 4, 8, 128, 132, True) == 64
    assert wgmma_rows(1024, 4, 8, 128, 132, True) == 64
    assert wgmma_rows(1696, 4, 8, 128, 132, True) == 64       # 53 token blocks of 32: 424 items < 3.25 * 132
    assert wgmma_rows(1697, 4, 8, 128, 132, True) == 128      # 54: 432 items
    assert wgmma_rows(2048, 3, 3, 64, 132, True) == 64
    assert wgmma_rows(2048, 4, 8, 128, 132, False) == 64


def test_wgmma_depth_rule_cpu():
    """4 stages for 128-row producer blocks at head dim 128 with fewer than 6 items an SM (Qwen3-8B
    heads at T = 2048: 512 items on 132 SMs), 3 otherwise: at 8192 (2048 items), for 64-row blocks,
    without the producer, and at head dim 64 (no 4-stage build); every depth it picks is built."""
    from glimmer_cupy.ops.attention import WGMMA_DEPTH, WGMMA_VARIANTS, wgmma_depth, wgmma_items
    assert wgmma_depth(wgmma_items(2048, 4, 8, 128), 128, 128, True, 132) == 4
    assert wgmma_depth(wgmma_items(8192, 4, 8, 128), 128, 128, True, 132) == WGMMA_DEPTH == 3
    assert wgmma_depth(6 * 132 - 1, 128, 128, True, 132) == 4
    assert wgmma_depth(6 * 132, 128, 128, True, 132) == 3
    assert wgmma_depth(wgmma_items(2048, 4, 8, 64), 128, 64, True, 132) == 3
    assert wgmma_depth(wgmma_items(2048, 4, 8, 128), 128, 128, False, 132) == 3
    assert wgmma_depth(wgmma_items(2048, 4, 8, 128), 64, 128, True, 132) == 3
    for d, rows, producer in {(d, r, p) for d, _, r, p in WGMMA_VARIANTS}:
        for items in (1, 100, 791, 792, 5000):
            assert (d, wgmma_depth(items, d, rows, producer, 132), rows, producer) in WGMMA_VARIANTS


def test_wgmma_plan_cpu():
    """A prefill launch's rows, stages and items: the rules' where not forced, the depth following
    forced rows."""
    from glimmer_cupy.ops.attention import wgmma_plan
    assert wgmma_plan(2048, 4, 8, 128, 132, True, True) == (128, 4, 512)
    assert wgmma_plan(8192, 4, 8, 128, 132, True, True) == (128, 3, 2048)
    assert wgmma_plan(512, 4, 8, 128, 132, True, True) == (64, 3, 256)     # 32 blocks of 16 tokens a kv head
    assert wgmma_plan(512, 4, 8, 128, 132, True, True, force_rows=128) == (128, 4, 128)
    assert wgmma_plan(2048, 4, 8, 128, 132, True, True, force_stages=2) == (128, 2, 512)


def test_mma_plan_cpu():
    """The mma route's block shapes: decode steps 16-row blocks split over positions; wider steps
    64-row blocks of 64 // group tokens, unsplit (128-row blocks only when forced); forced splits
    take one token a block."""
    from glimmer_cupy.ops.attention import mma_plan
    assert mma_plan(1, 1, 4, 32768, 8, 132) == (1, 1, 1, 33)
    assert mma_plan(8, 8, 4, 32768, 8, 132) == (1, 1, 1, 4)
    assert mma_plan(2048, 1, 4, 2048, 8, 132) == (4, 16, 1, 1)
    assert mma_plan(2048, 1, 4, 2048, 8, 132, force_rows=128) == (8, 32, 1, 1)
    assert mma_plan(2048, 1, 4, 2048, 8, 132, force_rows=64) == (4, 16, 1, 1)
    assert mma_plan(32, 2, 4, 900, 8, 132) == (4, 16, 1, 1)          # 16-token verify blocks: 64 rows
    assert mma_plan(1, 1, 32, 1000, 1, 132) == (1, 1, 2, 16)
    assert mma_plan(64, 2, 128, 1000, 1, 132) == (4, 1, 2, 2)
    assert mma_plan(64, 2, 128, 1000, 1, 132, force_rows=64) == (4, 1, 2, 2)
    assert mma_plan(64, 2, 4, 1000, 8, 132, force_splits=3) == (4, 1, 1, 3)
    # head dim 256 (one block an SM at 2 stages): one_block_splits, as the decode kernel's
    assert mma_plan(1, 1, 4, 8192, 1, 132, d=256) == (1, 1, 1, 32)
    assert mma_plan(1, 1, 4, 32768, 1, 132, d=256) == (1, 1, 1, 64)
    assert mma_plan(8, 8, 4, 32768, 1, 132, d=256) == (1, 1, 1, 16)
    assert mma_plan(1, 1, 4, 32768, 8, 132, d=128, stages=4) == (1, 1, 1, 16)   # one block an SM too
    assert mma_plan(1, 1, 4, 32768, 8, 132, d=256, force_splits=256) == (1, 1, 1, 256)
    with pytest.raises(OpArgumentError, match="force_rows must be one of"):
        mma_plan(64, 2, 4, 1000, 8, 132, force_rows=32)


def test_mma_stages_rule_cpu():
    """The pipeline depth (2 stages, by measurement), shared memory per depth and the
    instances: every (D, rows, depth) whose shared memory fits one block, and attention_mma.cu
    instantiates the same list for the compile test."""
    import re
    from pathlib import Path
    from glimmer_cupy.ops.attention import MMA_DEPTH, MMA_VARIANTS, mma_blocks_per_sm, mma_smem
    assert MMA_DEPTH == 2 and all(mma_blocks_per_sm(d, mw, MMA_DEPTH) > 0 for d in (64, 128, 256) for mw in (1, 4, 8))
    assert mma_smem(128, 1, 2) == 73984 and mma_smem(128, 1, 3) == 108800
    assert mma_blocks_per_sm(128, 1, 3) == 2 and mma_blocks_per_sm(128, 1, 4) == 1
    assert mma_blocks_per_sm(256, 1, 4) == 0 and (256, 1, 4) not in MMA_VARIANTS
    src = (Path(__file__).resolve().parents[1] / "cuda_src" / "attention_mma.cu").read_text()
    listed = {tuple(map(int, m)) for m in re.findall(r"ATTN_MMA\((\d+), (\d+), (\d+)\)", src)}
    assert listed == set(MMA_VARIANTS)


def test_stream_variants_rule_cpu():
    """The decode kernel's depths: 3 stages at head dim 64 and 128 (two blocks an SM), 2 at 256 (one
    block); its instances are every (D, depth) that fits one block, and attention_stream.cu
    instantiates the same list."""
    import re
    from pathlib import Path
    from glimmer_cupy.ops.attention import (STREAM_DEPTH, STREAM_VARIANTS, stream_blocks_per_sm,
                                            stream_cluster_cap, stream_smem)
    assert stream_smem(128, 3) == 108800 and stream_blocks_per_sm(128, 3) == 2 and stream_blocks_per_sm(128, 4) == 1
    assert stream_blocks_per_sm(256, 2) == 1 and stream_blocks_per_sm(256, 4) == 0
    assert all((d, st) in STREAM_VARIANTS for d, st in STREAM_DEPTH.items())
    assert stream_cluster_cap(128, 3) == 16 and stream_cluster_cap(256, 2) == 8
    src = (Path(__file__).resolve().parents[1] / "cuda_src" / "attention_stream.cu").read_text()
    listed = {tuple(map(int, m)) for m in re.findall(r"ATTN_STREAM\((\d+), (\d+)\)", src)}
    assert listed == set(STREAM_VARIANTS)


@pytest.mark.parametrize("units", [1, 2, 3, 5, 8, 15, 16, 64])
@pytest.mark.parametrize("width", [16, 300, 1024, 2048, 4096, 8192, 8193, 16384, 131072])
def test_stream_splits_rule_cpu(units, width):
    """The decode split rule: never more splits than the wave (n_splits) nor than the width's tiles;
    below 16 units and up to a width of 8192, at most max(a power of two of about 64 blocks, one
    split per 512 positions); wider, the wave itself. At 8 kv heads (Qwen3): 8 splits up to 4096,
    16 at 8192, 33 beyond; at 3 (SmolLM2) 16 from a width of 1024."""
    from glimmer_cupy.ops.attention import MMA_TILE, stream_splits
    got = stream_splits(units, width)
    assert 1 <= got <= -(-width // MMA_TILE)
    if units >= 16:
        return
    wave = n_splits(units, width, 132, MMA_TILE)
    assert got <= wave
    if width > 8192:
        assert got == wave
    else:
        few = max(p for p in (1, 2, 4, 8, 16, 32, 64) if p * units <= 64)
        assert got == min(wave, max(few, width // 512))
    expect = {(8, 1024): 8, (8, 4096): 8, (8, 8192): 16, (8, 16384): 33, (8, 131072): 33, (3, 1024): 16,
              (3, 8192): 16}
    if (units, width) in expect:
        assert got == expect[(units, width)]


@pytest.mark.parametrize("units", [1, 2, 4, 8, 15, 16, 64])
@pytest.mark.parametrize("width", [16, 300, 512, 1024, 8192, 16384, 32768, 131072])
def test_stream_splits_one_block_an_sm_cpu(units, width):
    """Head dim 256 (one block an SM): at most one wave of one block an SM, the width's tiles and the
    power of two at or below sqrt(width / 8). Gemma 3 (one kv head): 8 splits at 512 (its window)
    and 1024, 32 at 8192 and 16384, 64 at 32768; batch 8, 16 from 8192."""
    from glimmer_cupy.ops.attention import MMA_TILE, stream_splits
    got = stream_splits(units, width, 132, 256)
    root = max(p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256) if p * p * 8 <= max(8, width))
    assert got == max(1, min(132 // units, -(-width // MMA_TILE), 256, root))
    assert got == stream_splits(units, width, 132, 128, 4)     # head dim 128 at 4 stages: one block too
    expect = {(1, 512): 8, (1, 1024): 8, (1, 8192): 32, (1, 16384): 32, (1, 32768): 64, (8, 1024): 8,
              (8, 8192): 16, (8, 32768): 16}
    if (units, width) in expect:
        assert got == expect[(units, width)]


@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("length", [1, 64, 65, 600, 1000])
@pytest.mark.parametrize("cluster", [None, 1, 8, 16])
@pytest.mark.parametrize("kern", ["mma", "stream"])
def test_mma_cluster_merge(d, length, cluster, kern):
    """Decode splits merged in a thread block cluster (distributed shared memory) or through
    global memory (cluster=1) give the reference's attention, q8 codes included; a 1024-wide
    table makes 16 splits, so blocks past a short sequence's work wait in the cluster idle.
    A forced cluster of c blocks runs c splits. Head dim 256 allows at most 8 a cluster: 16 is
    refused there. Both kernels whose decode blocks merge so: "mma" and "stream" (whose head dim
    256 blocks fill an SM too)."""
    import cupy
    rng = np.random.default_rng(length * 7 + d)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, [length], 32, 8, d)
    wide = np.zeros((1, 1024), np.int32)                      # cell 0 past the sequence: never read
    wide[0, :table.shape[1]] = table[0]
    if cluster == 16 and d == 256:
        with pytest.raises(OpArgumentError, match="force_cluster"):
            run_both(q, k_pool, v_pool, wide, seq_lens, tok_seq, tok_pos, force_cluster=16, force_splits=16,
                     kernel=kern)
        return
    kw = {} if cluster is None else {"force_cluster": cluster}
    if cluster and cluster > 1:
        kw["force_splits"] = cluster
    got, ref = run_both(q, k_pool, v_pool, wide, seq_lens, tok_seq, tok_pos, kernel=kern, **kw)
    assert_close(got, ref, (d, length, cluster), kern)
    res = ops.attention(cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool), cupy.asarray(wide),
                        cupy.asarray(seq_lens), cupy.asarray(tok_seq), cupy.asarray(tok_pos), d ** -0.5,
                        workspace=cupy.empty(workspace_size(1, 32, d), cupy.float32), q8=True, kernel=kern, **kw)
    if hasattr(res, "q"):                                     # the codes of the merged rows, exactly
        assert_q8_codes(res, cupy.asnumpy(res.x))


@gpu
@pytest.mark.parametrize("hq,hkv", [(9, 3), (16, 8), (4, 1), (40, 8), (32, 4)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("lens", [[600], [1000], [600, 65, 1000]])
def test_stream_cluster_merge_by_group(hq, hkv, d, lens):
    """attn_stream_kernel's cluster merge for every group size: at most 4 query heads a KV head
    (1, 2, 3 and 4 here) the splits push their partials into rank 0 (attn_mma_end.cuh); 5 and 8
    heads a group take the pulled merge. Several sequences of different lengths in one step (so
    clusters of one launch have different numbers of splits with work, and idle blocks), the
    reference's attention and the output's codes exactly."""
    import cupy
    rng = np.random.default_rng(hq * 1000 + d + len(lens))
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, lens, hq, hkv, d)
    wide = np.zeros((len(lens), 1024), np.int32)               # a graph's table: 16 splits
    wide[:, :table.shape[1]] = table
    got, ref = run_both(q, k_pool, v_pool, wide, seq_lens, tok_seq, tok_pos, kernel="stream")
    assert_close(got, ref, (hq, hkv, d, lens), "stream")
    res = ops.attention(cupy.asarray(q), cupy.asarray(k_pool), cupy.asarray(v_pool), cupy.asarray(wide),
                        cupy.asarray(seq_lens), cupy.asarray(tok_seq), cupy.asarray(tok_pos), d ** -0.5,
                        workspace=cupy.empty(workspace_size(len(lens), hq, d), cupy.float32), q8=True,
                        kernel="stream")
    assert hasattr(res, "q"), "a decode attention with codes asked returns them"
    plain = cupy.asnumpy(res.x)
    np.testing.assert_allclose(plain, got, rtol=0, atol=0)     # the same rows with and without codes
    assert_q8_codes(res, plain)


@gpu
@pytest.mark.parametrize("policy", ["spread", "load-balancing"])
@pytest.mark.parametrize("lens,width", [([8187], 8192), ([600, 65, 1000], 1024)])
def test_cluster_placement_changes_no_bit(monkeypatch, policy, lens, width):
    """Where the hardware puts a cluster's blocks (launch.CLUSTER_POLICY) changes only the time: at
    batch 1 and 8k positions (clusters of 16) and in a mixed step (clusters of 8, some blocks idle),
    the same output and int8 codes bit for bit as the driver's default placement."""
    import cupy

    from glimmer_cupy.kernels import launch
    rng = np.random.default_rng(width + len(lens))
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, lens, 32, 8, 128)
    wide = np.zeros((len(lens), width), np.int32)
    wide[:, :table.shape[1]] = table
    args = [cupy.asarray(a) for a in (q, k_pool, v_pool, wide, seq_lens, tok_seq, tok_pos)]

    def run():
        work = cupy.full(workspace_size(len(lens), 32, 128), np.nan, dtype=cupy.float32)
        res = ops.attention(*args, 128 ** -0.5, workspace=work, q8=True, kernel="stream")
        return [cupy.asnumpy(a) for a in (res.x, res.q, res.d)]

    default = run()
    monkeypatch.setattr(launch, "CLUSTER_POLICY", launch.CLUSTER_POLICIES[policy])
    for got, want in zip(run(), default):
        np.testing.assert_array_equal(got, want)


def use_defines(monkeypatch, builder: str, names) -> None:
    """Launch the kernel that ops.attention's `builder` (_stream_kernel, _mma_kernel) gives, built
    with the switches `names` (the builder's `defines`, part of its cache key)."""
    att = sys.modules["glimmer_cupy.ops.attention"]         # the module (ops.attention is the op)
    built = getattr(att, builder)
    defines = tuple((n, 1) for n in sorted(names))
    monkeypatch.setattr(att, builder, lambda *variant: built(*variant, defines))


def assert_switch_same_bits(monkeypatch, switch, hq, hkv, d, lens, splits, seed):
    """One decode step on attn_stream_kernel in its default build and built with `switch`
    (use_defines): the same output and int8 codes bit for bit, and the reference's attention."""
    import cupy
    rng = np.random.default_rng(seed)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, lens, hq, hkv, d)
    args = [cupy.asarray(a) for a in (q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos)]

    def run():
        work = cupy.full(workspace_size(len(lens), hq, d), np.nan, dtype=cupy.float32)
        res = ops.attention(*args, d ** -0.5, workspace=work, force_splits=splits, q8=True, kernel="stream")
        return cupy.asnumpy(res.x), [cupy.asnumpy(a) for a in (res.q, res.d)]

    default, default_codes = run()
    with monkeypatch.context() as m:
        use_defines(m, "_stream_kernel", [switch])
        built, built_codes = run()
    np.testing.assert_array_equal(built, default)
    for a, b in zip(built_codes, default_codes):
        np.testing.assert_array_equal(a, b)
    ref = ref_attention(q, bf16_float(k_pool), bf16_float(v_pool), table, seq_lens, tok_seq, tok_pos, d ** -0.5)
    assert_close(default, ref, (hq, hkv, d, lens, splits), "stream")


@gpu
@pytest.mark.parametrize("hq,hkv,d,lens,splits", [
    (32, 8, 128, [32768], None),        # batch 1 at 32k: 33 splits, one batch staged
    (4, 1, 128, [32768], None),         # one kv head: 256 splits, staged in batches of 49
    (8, 2, 256, [4095, 4095], None),    # head dim 256 at two stages: 64 splits, batches of 32
    (9, 3, 64, [3000, 45, 2999], 47),   # three rows, splits with no work
    (16, 2, 128, [5000], 40),           # 8 rows a block: the warps' own loads (merge_splits)
])
def test_stream_rolled_merge_equals_pulled(monkeypatch, hq, hkv, d, lens, splits):
    """The last block's merge of global partials, each warp staging its row's in shared memory
    (merge_rolled) against the same kernel built with ATTN_MERGE_PULLED (merge_splits' loads):
    the same sums in the same order, so the same output and codes bit for bit; and the
    reference's attention."""
    assert_switch_same_bits(monkeypatch, "ATTN_MERGE_PULLED", hq, hkv, d, lens, splits, hq + d + len(lens))


@gpu
@pytest.mark.parametrize("hq,hkv,d,lens,splits", [
    (32, 8, 128, [32768], None),        # batch 1 at 32k, whole tiles
    (32, 8, 128, [7, 511, 513], None),  # partial last tiles: zero-filled rows
    (8, 2, 256, [4095, 4095], None),    # head dim 256 at two stages
    (9, 3, 64, [3000, 45, 2999], 47),   # head dim 64, splits with no work
])
def test_stream_swizzled_ring_equals_padded(monkeypatch, hq, hkv, d, lens, splits):
    """The K/V ring's swizzled rows (at_swz) against the same kernel built with
    ATTN_STREAM_PADDED_RING (padded rows, at): the same bytes reach the same
    fragments, so the same output and codes bit for bit; and the reference's attention."""
    assert_switch_same_bits(monkeypatch, "ATTN_STREAM_PADDED_RING", hq, hkv, d, lens, splits, 7 * hq + d)


@gpu
@pytest.mark.parametrize("d", [64, 128])
def test_stream_positions_past_the_length(d):
    """attn_stream_kernel loads a token's first cells for the range ending at its own position
    before seq_lens arrives, and again when the length ends it sooner: tokens at positions past
    their sequence's length (they see positions below the length only), one past the table's
    width, one inside, in one step; the reference's attention."""
    rng = np.random.default_rng(d + 11)
    lens = [600, 300, 1000, 77]
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, lens, 32, 8, d)
    wide = np.zeros((len(lens), 1024), np.int32)
    wide[:, :table.shape[1]] = table
    tok_pos = np.array([650, 299, 5000, 1020], np.int32)       # past, at, past the width, past
    got, ref = run_both(q, k_pool, v_pool, wide, seq_lens, tok_seq, tok_pos, kernel="stream")
    assert_close(got, ref, (d, "past"), "stream")


@gpu
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (9, 3, 64)])
@pytest.mark.parametrize("kernel_", ["mma", "simt", "stream"])
def test_decode_graph_with_pdl_reads_the_new_rows(hq, hkv, d, kernel_):
    """prepare_qkv_ then attention, captured in a graph with programmatic dependent launch: the
    attention kernel copies old K/V rows before it waits, so the rows this step writes (the new
    cells start as NaN) must still come from after prepare_qkv_. Sequence 0 has two tokens in the
    step (positions p and p + 1: the second reads the first's new row), sequence 1 one; the
    result must equal eager attention over the pools the graph left."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    rng = np.random.default_rng(hq + d)
    lens = [600, 300, 1]
    q, k_pool, v_pool, table, seq_lens, _, _ = make_step(rng, lens, hq, hkv, d)
    tok_seq = np.array([0, 0, 1], np.int32)
    tok_pos = np.array([598, 599, 299], np.int32)
    cells = np.array([table[0, 598], table[0, 599], table[1, 299]], np.int32)
    k_pool[cells] = BF16_NAN                                   # what prepare_qkv_ writes
    v_pool[cells] = BF16_NAN
    wide = np.zeros((3, 1024), np.int32)
    wide[:, :table.shape[1]] = table
    qkv = cupy.asarray(rng.standard_normal((3, (hq + 2 * hkv) * d)).astype(np.float32))
    kd, vd = cupy.asarray(k_pool), cupy.asarray(v_pool)
    idx = [cupy.asarray(a) for a in (wide, seq_lens, tok_seq, tok_pos, cells)]
    qd = cupy.empty((3, hq, d), cupy.float32)
    out = cupy.full((3, hq, d), np.nan, cupy.float32)
    work = cupy.empty(workspace_size(3, hq, d), cupy.float32)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, overlapped():
        def step():
            ops.prepare_qkv_(qkv, kd, vd, idx[4], idx[3], hq, hkv, None, None, 1e-6, 1e6, True, out=qd)
            ops.attention(qd, kd, vd, idx[0], idx[1], idx[2], idx[3], d ** -0.5, out=out, workspace=work,
                          kernel=kernel_, q8=True)
        step()                                                 # compile outside the capture
        stream.synchronize()
        out.fill(np.nan)
        kd[idx[4]] = BF16_NAN
        vd[idx[4]] = BF16_NAN
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    got = cupy.asnumpy(out)
    ref = ref_attention(cupy.asnumpy(qd), bf16_float(cupy.asnumpy(kd)), bf16_float(cupy.asnumpy(vd)), wide,
                        seq_lens, tok_seq, tok_pos, d ** -0.5)
    assert_close(got, ref, (hq, d, kernel_), kernel_)


def test_mma_cluster_rule_cpu():
    """One cluster a token's splits up to 16, rounded up to a power of two; more splits, and 64-row
    blocks, merge through global memory. Head dim 256's clusters stop at 8 (a block fills half an
    SM)."""
    from glimmer_cupy.ops.attention import mma_cluster, mma_cluster_cap, mma_early
    assert [mma_cluster(128, 1, 2, s) for s in (1, 2, 3, 5, 8, 9, 16, 17, 33)] == [1, 2, 4, 8, 8, 16, 16, 1, 1]
    assert [mma_cluster(64, 1, 2, s) for s in (10, 16)] == [16, 16]
    assert [mma_cluster(256, 1, 2, s) for s in (2, 3, 8, 9)] == [2, 4, 8, 1] and mma_cluster_cap(256, 1, 2) == 8
    assert mma_cluster(128, 1, 4, 16) == 1 and mma_cluster(128, 4, 2, 4) == 1
    assert mma_early(64) and mma_early(128) and mma_early(256)


def test_stream_early_rule_cpu():
    """The stream kernel copies old K/V rows before its wait only at head dim 256 (64 and 128 were
    timed faster without the early copies in the models' decode steps)."""
    from glimmer_cupy.ops.attention import stream_early
    assert [stream_early(d) for d in (64, 128, 256)] == [False, False, True]


# Gemma 3 270M's attention as its decode runs it: head dim 256, 4 query heads on 1 KV head, a
# sliding-window layer (window 512, rope base 1e4) and a global one (1e6), q/k norms, NeoX rope, q8
# codes for the o-projection; a captured step's cell table is wider than the sequence (at least 256
# cells: runtime/static_step.py), so the split rule sees the width, not the length.
GEMMA_HEADS, GEMMA_D, GEMMA_LAYERS = (4, 1), 256, ((512, 1e4), (0, 1e6))   # (window, rope base)
GEMMA_PATHS = {
    "rule": {},
    "one-split": {"force_splits": 1},
    "early-global": {"force_early": True, "force_cluster": 1},      # old rows before the wait, global merge
    "early-cluster": {"force_early": True, "cluster": True},        # ... and a cluster merge (splits = its size)
}


def gemma_decode(prompt: int, width: int, mode: str, path: dict, steps: int = 4, seed: int = 0):
    """A prompt of `prompt` positions prefilled in one eager step (prepare_qkv_ then attention per
    layer), then `steps` single-token decode steps, each the sliding-window layer then the global
    one. mode "eager": plain launches; "pdl": every decode kernel with programmatic dependent
    launch; "graph": as the executor runs a static step, the first decode step eagerly with PDL,
    the second captured (PDL inside), the rest replays of it with new index arrays. The rows each
    step writes start as NaN (so does every unwritten cell, and the scratch cell 0 that the table
    holds past the sequence), outputs and workspaces are NaN before every step. Returns
    [(what, got, ref, codes)] for every layer of every step: the output, the reference over the
    pools as the step left them, and the codes as the step left them (Q8Rows of host arrays, or None)."""
    import cupy
    from glimmer_cupy.kernels.launch import overlapped
    rt = cupy.cuda.runtime
    (hq, hkv), d = GEMMA_HEADS, GEMMA_D
    rng = np.random.default_rng(seed + 7 * prompt + width)
    n = prompt + steps
    n_cells = n + 40
    cell_of = rng.permutation(np.arange(1, n_cells))[:n].astype(np.int32)    # position -> cell
    table = np.zeros((1, width), np.int32)
    table[0, :n] = cell_of
    pools = [(cupy.full((n_cells, hkv, d), BF16_NAN, cupy.uint16), cupy.full((n_cells, hkv, d), BF16_NAN, cupy.uint16))
             for _ in GEMMA_LAYERS]
    q_norm, k_norm = (cupy.asarray((1 + 0.1 * rng.standard_normal(d)).astype(np.float32)) for _ in range(2))
    scale = d ** -0.5
    kw = dict(path)
    if kw.pop("cluster", False):
        kw["force_splits"] = kw["force_cluster"] = 4 if width == 256 else 8      # 8: head dim 256's cap
    results = []

    def check(what, t, pos, lens, q_out, out, res):
        for i, (window, _) in enumerate(GEMMA_LAYERS):
            k_pool, v_pool = (bf16_float(cupy.asnumpy(p)) for p in pools[i])
            ref = ref_attention(cupy.asnumpy(q_out[i]), k_pool, v_pool, table, lens, np.zeros(t, np.int32), pos,
                                scale, window)
            results.append((f"{what}, layer {i} (window {window})", cupy.asnumpy(out[i]), ref, host_codes(res[i])))

    def layers(qkv, cells, pos, tab, lens, seqs, q_out, out, work, **extra):
        res = []
        for i, (window, base) in enumerate(GEMMA_LAYERS):
            k_pool, v_pool = pools[i]
            q = ops.prepare_qkv_(qkv[i], k_pool, v_pool, cells, pos, hq, hkv, q_norm, k_norm, 1e-6, base, True,
                                 out=q_out[i])
            res.append(ops.attention(q, k_pool, v_pool, tab, lens, seqs, pos, scale, window, out=out[i],
                                     workspace=work[i], q8=True, **extra))
        return res

    def buffers(t):
        qkv = [cupy.asarray(rng.standard_normal((t, (hq + 2 * hkv) * d)).astype(np.float32)) for _ in GEMMA_LAYERS]
        q_out = [cupy.empty((t, hq, d), cupy.float32) for _ in GEMMA_LAYERS]
        out = [cupy.full((t, hq, d), np.nan, cupy.float32) for _ in GEMMA_LAYERS]
        # 16 splits at most: a 1024-wide table's 16 tiles
        work = [cupy.full(workspace_size(t, hq, d, 16), np.nan, cupy.float32) for _ in GEMMA_LAYERS]
        return qkv, q_out, out, work

    def host_codes(res):
        # a copy now: a graph's replays write the same code buffers every step
        return None if res is None or not hasattr(res, "q") else Q8Rows(None, *(cupy.asnumpy(a) for a in res[1:4]))

    stream = cupy.cuda.Stream(non_blocking=True)
    tab_d = cupy.asarray(table)
    with stream:
        pos = np.arange(prompt, dtype=np.int32)                  # the prefill: one eager step
        qkv, q_out, out, work = buffers(prompt)
        res = layers(qkv, cupy.asarray(cell_of[:prompt]), cupy.asarray(pos), tab_d,
                     cupy.asarray(np.array([prompt], np.int32)), cupy.zeros(prompt, cupy.int32), q_out, out, work)
        stream.synchronize()
        check("prefill", prompt, pos, np.array([prompt], np.int32), q_out, out, res)

        # decode: one set of device buffers, as a static step keeps them
        qkv, q_out, out, work = buffers(1)
        cells_d, pos_d, lens_d, seqs_d = (cupy.zeros(1, cupy.int32) for _ in range(4))
        graph = held = None
        for s in range(steps):
            p = prompt + s
            cells_d.set(cell_of[p:p + 1], stream=stream)
            pos_d.set(np.array([p], np.int32), stream=stream)
            lens_d.set(np.array([p + 1], np.int32), stream=stream)
            for i in range(len(GEMMA_LAYERS)):
                qkv[i].set(rng.standard_normal((1, (hq + 2 * hkv) * d)).astype(np.float32), stream=stream)
                out[i].fill(np.nan)
                work[i].fill(np.nan)
            run = lambda: layers(qkv, cells_d, pos_d, tab_d, lens_d, seqs_d, q_out, out, work, **kw)
            if mode == "eager":
                res = run()
            elif mode == "pdl" or s == 0:
                with overlapped():
                    res = run()
            else:
                if graph is None:
                    with overlapped():
                        stream.begin_capture(rt.streamCaptureModeRelaxed)
                        held = run()                             # its q8 buffers: the graph writes them
                        graph = stream.end_capture()
                graph.launch(stream)
                res = held
            stream.synchronize()
            check(f"decode step {s} (position {p})", 1, np.array([p], np.int32), np.array([p + 1], np.int32),
                  q_out, out, res)
    return results


@gpu
@pytest.mark.parametrize("prompt,width", [(9, 256), (9, 1024), (600, 1024)])
@pytest.mark.parametrize("mode", ["eager", "pdl", "graph"])
@pytest.mark.parametrize("path", list(GEMMA_PATHS))
def test_gemma_shaped_decode(prompt, width, mode, path):
    """Gemma 3's decode, step by step (gemma_decode): a 9-position prompt (one tile, one split of
    work whatever the grid) and a 600-position one (past the 512 window: the sliding layer's range
    starts at p - 511; 10 tiles for the global layer), tables 256 and 1024 wide (4 splits, or 16
    global / 8 sliding), eager, with PDL, and in a graph replayed over the steps. Paths: the split
    rule, one split, and both decode shortcuts forced at head dim 256 (which does not take them by
    default): old rows copied before the wait with the global merge, and with a cluster merge.
    Every output equals the reference over the pools the step left, and its q8 codes are exact."""
    for what, got, ref, res in gemma_decode(prompt, width, mode, GEMMA_PATHS[path]):
        assert_mma_close(got, ref, (prompt, width, mode, path, what))
        if res is not None:
            assert_q8_codes(res, got, what)


@gpu
@pytest.mark.parametrize("lens,per_seq", [([600], 1), ([600, 65, 1000], 1), ([300, 200], 40)])
def test_l2_prefetch_changes_no_result(kernel, lens, per_seq):
    """Attention given weight ranges to bring into L2 (ops/prefetch.py) returns the same bits as
    without, on every kernel: the stream kernel's blocks of a pushed cluster merge but rank 0 ask
    for them as they leave (600 positions of 4 kv heads: a cluster of 16 blocks a head, pushed), the others
    ignore them; ranges whose bytes do not divide among those blocks and lanes, one of them empty."""
    import cupy
    from glimmer_cupy.ops.prefetch import l2_ranges
    rng = np.random.default_rng(len(lens) * 100 + per_seq)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(rng, lens, 16, 4, 128, per_seq=per_seq)
    weights = cupy.asarray(rng.integers(0, 255, 3 << 20, dtype=np.uint8))
    ranges = l2_ranges((weights, weights.nbytes - 48), (weights[4096:], 1000), (weights, 0))
    assert ranges is not None and ranges.nbytes == weights.nbytes - 48 + 992
    without, ref = run_both(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, kernel=kernel)
    with_l2, _ = run_both(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, kernel=kernel, prefetch=ranges)
    np.testing.assert_array_equal(with_l2, without)
    assert_close(with_l2, ref, (lens, per_seq), kernel)


@gpu
def test_l2_ranges_reject_bad_ranges():
    """A range longer than its array, a view off a 16-byte boundary, too many ranges, and a prefetch
    that is not L2Ranges: one-line errors naming the argument, before any launch."""
    import cupy
    from glimmer_cupy.ops.prefetch import l2_ranges
    w = cupy.zeros(4096, cupy.uint8)
    with pytest.raises(OpArgumentError, match=r"parts\[0\] bytes must be 0..4096"):
        l2_ranges((w, 4097))
    with pytest.raises(OpArgumentError, match=r"parts\[1\] must be an array on a 16-byte boundary"):
        l2_ranges((w, 16), (w[8:], 16))
    with pytest.raises(OpArgumentError, match="at most 3 ranges"):
        l2_ranges(*[(w, 16)] * 4)
    q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos = make_step(np.random.default_rng(0), [40], 4, 1, 64)
    with pytest.raises(OpArgumentError, match="prefetch must be None or"):
        run_both(q, k_pool, v_pool, table, seq_lens, tok_seq, tok_pos, kernel="stream", prefetch=(w, 16))
