"""Q6_K matrices in pair order (weights/q6k_pairs.py): the repack is a permutation of each pair's
bytes that from_pairs undoes; the block trait Q6_KP (quant_blocks.cuh) decodes every value as
Q6_K does from the GGUF bytes, on the CPU; and on the GPU every quant_matmul bucket that serves
Q6_K gives a matrix in pair order the GGUF matrix's outputs bit for bit. The gemv_kq lanes on the
CPU: test_gemv_kq_lanes.py; mma_st's: test_mma_st_lanes.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from host_harness import aligned16, build_host_library

from glimmer_cupy.weights.q6k_pairs import QL_UNITS, SCALE_BYTES, from_pairs, pair_order, to_pairs
from glimmer_cupy.weights.quant_tensor import QType, QuantTensor
from glimmer_cupy.weights.random_blocks import random_blocks

gpu = pytest.mark.gpu          # skipped without a device (conftest.py)


@pytest.mark.parametrize("n,k", [(1, 512), (7, 1024), (3, 12288)])
def test_pairs_are_a_permutation_of_each_pair(n, k):
    rng = np.random.default_rng(n * k)
    data = random_blocks(QType.Q6_K, n, k, rng).reshape(n, -1)
    pairs = to_pairs(data, n, k)
    assert pairs.shape == data.shape and pairs.dtype == np.uint8
    np.testing.assert_array_equal(from_pairs(pairs, n, k), data)
    for i in range(data.size // 420):
        np.testing.assert_array_equal(np.sort(pairs.ravel()[420 * i:][:420]), np.sort(data.ravel()[420 * i:][:420]))


def test_pair_offsets():
    """A pair at byte offset A: a = -A mod 16 bytes of small words, then lane p = 4h + i's ql pieces
    of super-block j (ql[64h + 8i ..], ql[64h + 32 + 8i ..]) side by side at a + 128j + 16p, qh of j at
    a + 256 + 64j, and the small words: scales[8h + is + 2t] of j at byte t of word 4j + 2h + is, d of j
    at bytes 2j, 2j + 1 of word 8."""
    pairs = 4                                          # every phase of A / 4 mod 4
    data = (np.arange(pairs * 420) * 7 % 251).astype(np.uint8).reshape(1, -1)
    out = to_pairs(data, 1, 512 * pairs)[0]
    for i in range(pairs):
        A, blocks, got = 420 * i, data[0, 420 * i:][:420].reshape(2, 210), out[420 * i:][:420]
        a = -A % 16

        def word(w):
            at = 4 * w if w < a // 4 else a + 384 + 4 * (w - a // 4)
            return got[at:at + 4]
        for j in range(2):
            ql, qh, sc, d = blocks[j, :128], blocks[j, 128:192], blocks[j, 192:208], blocks[j, 208:]
            for p in range(8):
                h, ii = p >> 2, p & 3
                np.testing.assert_array_equal(got[a + 128 * j + 16 * p:][:16],
                                              np.concatenate([ql[64 * h + 8 * ii:][:8], ql[64 * h + 32 + 8 * ii:][:8]]))
                for t in range(4):
                    assert word(4 * j + 2 * h + ii // 2)[t] == sc[8 * h + ii // 2 + 2 * t]
            np.testing.assert_array_equal(got[a + 256 + 64 * j:][:64], qh)
            np.testing.assert_array_equal(word(8)[2 * j:2 * j + 2], d)
    assert sorted(QL_UNITS) == list(range(16)) and sorted(SCALE_BYTES) == list(range(16))
    assert all(sorted(r) == list(range(420)) for r in pair_order())


def test_pairs_refuse_a_partial_pair():
    with pytest.raises(ValueError, match="to_pairs: K must be a multiple of 512 .* got 768"):
        to_pairs(np.zeros(3 * 210, np.uint8), 1, 768)


def test_host_tensor_in_pair_order_dequantizes_as_gguf():
    rng = np.random.default_rng(2)
    data = random_blocks(QType.Q6_K, 6, 1024, rng).reshape(6, -1)
    w = QuantTensor("w", QType.Q6_K, (6, 1024), data)
    wp = QuantTensor("w", QType.Q6_K, (6, 1024), to_pairs(data, 6, 1024), layout="q6k_pairs")
    np.testing.assert_array_equal(wp.dequantize(), w.dequantize())
    np.testing.assert_array_equal(wp.rows(np.array([5, 0, 3])), w.rows(np.array([5, 0, 3])))
    with pytest.raises(Exception, match="layout 'q6k_pairs' is not one of .* for Q4_K"):
        QuantTensor("w", QType.Q4_K, (1, 256), np.zeros((1, 144), np.uint8), layout="q6k_pairs")


HARNESS = r"""
#include "quant_blocks.cuh"
using namespace gguf;
// every value of n rows (row_bytes apart) through row_sub_block and row_value, of QT
template <class QT>
static void decode(const u8* w, int n, int k, long long row_bytes, float* subs, float* values) {
    for (int r = 0; r < n; ++r)
        for (int s = 0; s < k / 32; ++s) {
            row_sub_block<QT>(w + r * row_bytes, s, subs + (long long)r * k + 32 * s);
            for (int i = 0; i < 32; ++i) values[(long long)r * k + 32 * s + i] = row_value<QT>(w + r * row_bytes, 32 * s + i);
        }
}
extern "C" void decode_q6k(const u8* w, int n, int k, long long rb, float* s, float* v) { decode<Q6_K>(w, n, k, rb, s, v); }
extern "C" void decode_q6kp(const u8* w, int n, int k, long long rb, float* s, float* v) { decode<Q6_KP>(w, n, k, rb, s, v); }
"""


@pytest.fixture(scope="module")
def blocks_lib(tmp_path_factory):
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("q6kp"), "q6kp")
    for f in (dll.decode_q6k, dll.decode_q6kp):
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p]
    return dll


@pytest.mark.parametrize("n,k", [(5, 512), (3, 1024), (2, 4096)])
def test_q6kp_trait_decodes_as_q6k(blocks_lib, n, k):
    """row_sub_block / row_value of Q6_KP on the rows in pair order (16-byte aligned, so every pair
    phase is met) give every value bit for bit as Q6_K's on the GGUF rows, which match gguf."""
    from gguf.quants import dequantize as gguf_dequantize
    rng = np.random.default_rng(n + k)
    data = np.ascontiguousarray(random_blocks(QType.Q6_K, n, k, rng, std=1.0).reshape(n, -1))
    pairs = aligned16(to_pairs(data, n, k))
    out = {}
    for name, f, w in (("q6k", blocks_lib.decode_q6k, data), ("q6kp", blocks_lib.decode_q6kp, pairs)):
        subs, values = np.zeros((n, k), np.float32), np.zeros((n, k), np.float32)
        f(w.ctypes.data, n, k, data.shape[1], subs.ctypes.data, values.ctypes.data)
        out[name] = subs, values
    np.testing.assert_array_equal(out["q6kp"][0], out["q6k"][0])
    np.testing.assert_array_equal(out["q6kp"][1], out["q6k"][1])
    np.testing.assert_allclose(out["q6k"][0], gguf_dequantize(data, QType.Q6_K).reshape(n, k), rtol=1e-6, atol=1e-30)


# ---- GPU ---------------------------------------------------------------------------------------

def device_pair(n: int, k: int, seed: int):
    """A random (n, k) Q6_K matrix on the device in GGUF order and the same in pair order."""
    from glimmer_cupy.weights.q6k_pairs import repack
    rng = np.random.default_rng(seed)
    w = QuantTensor("w", QType.Q6_K, (n, k), random_blocks(QType.Q6_K, n, k, rng, 0.05)).to_device()
    wp = repack(w)
    assert wp.layout == "q6k_pairs" and repack(wp) is wp
    return w, wp


@gpu
@pytest.mark.parametrize("m", [1, 2, 5, 7, 8, 9, 16, 17, 24, 32, 33, 64, 65, 130])
@pytest.mark.parametrize("n,k", [(1037, 4096), (300, 1024), (64, 12288), (76, 512)])
def test_quant_matmul_in_pair_order_is_in_gguf_order(n, k, m):
    """Every bucket the table gives Q6_K (gemv_kq to 7 rows, mma_st to 64 on the tensor-map kernel,
    rows of a multiple of 16 bytes, or the bulk one, dequant_cublas past), N not a multiple of a
    block's rows: the same floats from the pair order as from GGUF order (outputs poisoned first),
    with x's int8 codes made beforehand where the model makes them (M <= 7) and without."""
    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.ops.matmul import TRAITS, quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    w, wp = device_pair(n, k, n + k + m)
    rng = np.random.default_rng(m)
    x = cupy.asarray(rng.normal(0, 1, (m, k)).astype(np.float32))
    inputs = [x] + ([Q8Rows(x, *quantize_x(x, TRAITS[QType.Q6_K]))] if m <= 7 else [])
    for xin in inputs:
        want = cupy.asnumpy(ops.quant_matmul(xin, w))
        got = cupy.asnumpy(ops.quant_matmul(xin, wp, out=cupy.full((m, n), np.nan, np.float32)))
        assert np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)


@gpu
@pytest.mark.parametrize("m", [8, 16, 32])
@pytest.mark.parametrize("tma", [False, True])
def test_mma_st_in_pair_order_at_every_split(m, tma):
    """mma_st's both kernels at each split that keeps whole pairs (4096 = 16 super-blocks: 1, 2, 4,
    8), and a split that would cut a pair refused by name (1024 = 4 super-blocks at 4 splits)."""
    import cupy

    from glimmer_cupy.ops import matmul
    from glimmer_cupy.ops._check import OpArgumentError
    w, wp = device_pair(1000, 4096, m)
    x = cupy.asarray(np.random.default_rng(1).normal(0, 1, (m, 4096)).astype(np.float32))
    for ks in (1, 2, 4, 8):
        if not tma and not matmul.mma_st_fits(-(-m // 8), 4096, ks, QType.Q6_K, False):
            continue                                   # the bulk kernel's slice must fit shared memory
        want, got = cupy.full((m, 1000), np.nan, np.float32), cupy.full((m, 1000), np.nan, np.float32)
        matmul.mma_st(want, x, w, splits=ks, tma=tma)
        matmul.mma_st(got, x, wp, splits=ks, tma=tma)
        np.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(want))
    _, small = device_pair(64, 1024, 3)
    with pytest.raises(OpArgumentError, match=r"splits of whole pairs of super-blocks for a matrix in pair order \(K = 1024\), got 4"):
        matmul.mma_st(cupy.empty((m, 64), np.float32), x[:, :1024].copy(), small, splits=4)


@gpu
@pytest.mark.parametrize("order", ["q4k+q6k", "q6k+q4k"])
def test_pair_launch_in_pair_order(order):
    """quant_matmul_rows's one launch for a Q4_K / Q6_K pair at one row, its Q6_K part in pair order:
    the same bits as in GGUF order (Qwen3-8B's q|k beside a Q6_K v, and the other order)."""
    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.ops.matmul import TRAITS, quantize_x
    from glimmer_cupy.ops.q8 import Q8Rows
    rng = np.random.default_rng(3)
    k = 4096
    q4 = QuantTensor("qk", QType.Q4_K, (5120, k), random_blocks(QType.Q4_K, 5120, k, rng, 0.05)).to_device()
    q6, q6p = device_pair(1024, k, 4)
    gguf_parts, pair_parts = ([q4, q6], [q4, q6p]) if order == "q4k+q6k" else ([q6, q4], [q6p, q4])
    x = cupy.asarray(rng.normal(0, 1, (1, k)).astype(np.float32))
    xin = Q8Rows(x, *quantize_x(x, TRAITS[QType.Q4_K]))
    np.testing.assert_array_equal(cupy.asnumpy(ops.quant_matmul_rows(xin, pair_parts)),
                                  cupy.asnumpy(ops.quant_matmul_rows(xin, gguf_parts)))


@gpu
def test_dequantize_and_refusals_in_pair_order():
    """ops.dequantize reads the pair order (float32 and bf16 alike); buckets that read only GGUF
    order, a token table in pair order and a forced graph-unsafe bucket are refused by name."""
    import cupy

    from glimmer_cupy import ops
    from glimmer_cupy.ops._check import OpArgumentError
    from glimmer_cupy.ops.matmul import dequantize
    w, wp = device_pair(334, 1024, 5)              # 334 rows of 840 bytes: whole 16-byte lines
    for bf16 in (False, True):
        np.testing.assert_array_equal(cupy.asnumpy(dequantize(wp, bf16=bf16)), cupy.asnumpy(dequantize(w, bf16=bf16)))
    x = cupy.ones((4, 1024), np.float32)
    for b in ("mma_kq", "gemv_dp4a", "gemv", "mma"):
        with pytest.raises(OpArgumentError, match=f"GGUF block order for bucket {b} at M = 4 .* q6k_pairs"):
            ops.quant_matmul(x, wp, force_bucket=b)
    with pytest.raises(OpArgumentError, match="embed: table must be GGUF block order"):
        ops.embed(wp, cupy.zeros(3, np.int32))


@gpu
@pytest.mark.parametrize("n,k", [(334, 1024), (77, 4096), (5, 12288)])
def test_dequant_lanes_kernel_gives_dequant_kernels_bits(n, k, monkeypatch):
    """dequant_lanes_kernel (eight lanes a super-block, Q6_K in either order) gives dequant_kernel's
    bits, float32 and bf16, and float32 equals gguf's dequantizer; an `out` that is not 16-byte
    aligned (both kernels store 16-byte runs) is refused by name before any launch."""
    import cupy
    from gguf.quants import dequantize as gguf_dequantize

    import glimmer_cupy.ops.matmul as matmul
    from glimmer_cupy.ops._check import OpArgumentError
    w, wp = device_pair(n, k, n + k)
    want = gguf_dequantize(cupy.asnumpy(w.data).reshape(n, -1), QType.Q6_K).reshape(n, k).astype(np.float32)
    for bf16 in (False, True):
        dtype = np.uint16 if bf16 else np.float32
        got = {}
        for lanes in (True, False):
            monkeypatch.setattr(matmul, "DEQUANT_LANES_TYPES", frozenset({QType.Q6_K}) if lanes else frozenset())
            for name, t in (("gguf", w), ("pairs", wp)):
                out = cupy.full((n, k), 0x7FC1 if bf16 else np.nan, dtype)   # poisoned
                got[lanes, name] = cupy.asnumpy(matmul.dequantize(t, bf16=bf16, out=out))
        for key, v in got.items():
            np.testing.assert_array_equal(v, got[False, "gguf"], err_msg=f"bf16={bf16} {key}")
        if not bf16:
            np.testing.assert_array_equal(got[True, "gguf"], want)
        buf = cupy.zeros(n * k + 8, dtype)
        skew = buf[2:2 + n * k].reshape(n, k) if bf16 else buf[1:1 + n * k].reshape(n, k)
        for types in (frozenset({QType.Q6_K}), frozenset()):
            monkeypatch.setattr(matmul, "DEQUANT_LANES_TYPES", types)
            with pytest.raises(OpArgumentError, match=r"dequantize: out must be 16-byte aligned, got an array at "
                                                      r"(4|8|12) bytes past a 16-byte boundary"):
                matmul.dequantize(wp, bf16=bf16, out=skew)
        assert not buf.any()


@gpu
def test_executor_in_pair_order_gives_the_gguf_logits(tmp_path, monkeypatch):
    """Synthetic Qwen3-0.6B (two layers; layer 1's v and down are Q6_K, the tied table stays GGUF)
    on the CUDA executor with Q6_K uploaded in pair order and in GGUF order: the same logits, bit for
    bit, for a 70-token prefill (dequant_cublas), a packed step of 16 (mma_st, in a graph's buckets)
    and one-token steps (gemv_kq and the q|k + v pair launch)."""
    import glimmer_cupy.runtime.cuda_executor as ce
    from glimmer_cupy.model.config import ModelConfig
    from glimmer_cupy.model.decoder import Decoder
    from glimmer_cupy.model.weights import load_weights
    from glimmer_cupy.reference.sampling import GREEDY
    from glimmer_cupy.runtime.cell_pool import CellPool
    from glimmer_cupy.runtime.sequence import Sequence
    from glimmer_cupy.runtime.step_planner import plan_step
    from glimmer_cupy.weights import GGUFFile
    from glimmer_cupy.weights.synthetic import write_synthetic_gguf
    f = GGUFFile(write_synthetic_gguf("qwen3-0.6b", tmp_path / "q.gguf", layers=2))
    cfg = ModelConfig.from_gguf(f)
    dec = Decoder(cfg, load_weights(f, cfg))
    out = {}
    for pairs in (False, True):
        monkeypatch.setattr(ce, "Q6K_PAIRS", pairs)
        ex = ce.CudaExecutor(dec, 256)
        layouts = {p.layout for lw in ex.decoder.w.layers for lin in (lw.qkv, lw.down) for p in lin.parts}
        assert ("q6k_pairs" in layouts) == pairs and ex.decoder.w.embed.layout == "gguf"
        pool = CellPool(256)
        rng = np.random.default_rng(0)
        seqs = [Sequence(list(rng.integers(0, 1000, 70)), GREEDY)] + \
               [Sequence([int(t)], GREEDY) for t in rng.integers(0, 1000, 16)]     # whole prompts: 16 logit rows
        got = [ex.logits(plan_step(pool, [(seqs[0], 70)])).get()]
        got.append(ex.logits(plan_step(pool, [(s, 1) for s in seqs[1:]])).get())
        for _ in range(3):                             # the prefill's token, then each step's
            seqs[0].tokens.append(int(np.argmax(got[0 if len(got) == 2 else -1][-1])))
            got.append(ex.logits(plan_step(pool, [(seqs[0], 1)])).get())
        out[pairs] = got
    for a, b in zip(out[True], out[False]):
        np.testing.assert_array_equal(a, b)
