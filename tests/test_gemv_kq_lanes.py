"""The lane shares of gemv_kq.cu (kq_lanes.cuh) on the CPU: for Q4_K and Q6_K rows, the eight
lanes' shares of every super-block add up to the row's dot product with int8-quantized x, against
gguf's dequantizer in float64. The header is __host__ __device__, so a host harness (g++, or nvcc)
runs the very code the GPU runs; GPU runs of the kernel itself are in test_quant_matmul.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from gpu_rounding import q8_blocks as q8
from host_harness import aligned16, build_host_library

from glimmer_cupy.weights.q6k_pairs import to_pairs
from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

PAIRS = 1014                       # the harness's type code for Lanes<Q6_KP> (Q6_K in pair order)

HARNESS = r"""
#include "kq_lanes.cuh"
using namespace gguf;

// as gemv_kq_kernel walks a row: each lane of a group of eight starts at super-block first < step
// and moves step on (step = 4 * WS); a part that is not only_part (when >= 0) is left out
template <class QT>
static double row_dot(const u8* row, int k, const int* xq, const float* xd, const float* xs, int only_part,
                      int step) {
    typedef Lanes<QT> L;
    double sum = 0.0;
    for (int part = 0; part < 8; ++part) {
        if (only_part >= 0 && part != only_part) continue;
        for (int first = 0; first < step; ++first) {
            typename L::Row rw = L::row(row, first, part);
            for (int sb = first; sb < k / 256; sb += step) {
                typename L::Regs r;
                typename L::X x;
                L::load(rw, sb, part, r);
                L::settle(rw, part, r);
                L::load_x(xq, xd, xs, sb, part, x);
                sum += L::accumulate(0.f, r, x, part);
                L::next(rw, step);
            }
        }
    }
    return sum * L::kScale;
}

// Lanes<Q6_K>::codes over n triples of words (ql of groups 0/2, ql of groups 1/3, qh): q has 4n words
extern "C" void q6k_codes(const u32* la, const u32* lb, const u32* h, u32* q, int n) {
    for (int i = 0; i < n; ++i) {
        u32 out[4];
        Lanes<Q6_K>::codes(la[i], lb[i], h[i], out);
        for (int t = 0; t < 4; ++t) q[4 * i + t] = out[t];
    }
}

// type PAIRS: a Q6_K row in pair order (weights/q6k_pairs.py), read by Lanes<Q6_KP>
#define PAIRS 1014

// Lanes<QT>::weights of super-block sb of a row, every part: out[256] in the row's value order, as
// quant_matmul.cu's dequant_lanes_kernel places them
template <class QT>
static void sb_weights(const u8* row, int sb, float* out) {
    typedef Lanes<QT> L;
    for (int part = 0; part < 8; ++part) {
        const typename L::Row at = L::row(row, sb, part);
        typename L::Regs r;
        L::load(at, sb, part, r);
        L::settle(at, part, r);
        float w[4][8];
        L::weights(r, w);
        for (int t = 0; t < 4; ++t)
            for (int i = 0; i < 8; ++i) out[128 * (part >> 2) + 8 * (part & 3) + 32 * t + i] = w[t][i];
    }
}
extern "C" int q6_row_weights(int type, const u8* row, int k, float* out) {
    for (int sb = 0; sb < k / 256; ++sb) {
        if (type == Q6_K::kType) sb_weights<Q6_K>(row, sb, out + 256 * sb);
        else if (type == PAIRS) sb_weights<Q6_KP>(row, sb, out + 256 * sb);
        else return 1;
    }
    return 0;
}
extern "C" int kq_row_dot(int type, const u8* row, int k, const int* xq, const float* xd, const float* xs,
                          int only_part, int step, double* out) {
    if (type == Q4_K::kType) *out = row_dot<Q4_K>(row, k, xq, xd, xs, only_part, step);
    else if (type == Q6_K::kType) *out = row_dot<Q6_K>(row, k, xq, xd, xs, only_part, step);
    else if (type == PAIRS) *out = row_dot<Q6_KP>(row, k, xq, xd, xs, only_part, step);
    else return 1;
    return 0;
}
"""


@pytest.fixture(scope="module")
def lanes_lib(tmp_path_factory):
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("kq"), "kq")
    dll.kq_row_dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    dll.q6k_codes.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
    dll.q6_row_weights.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return dll


def test_q6k_codes_are_four_times_the_centred_values(lanes_lib):
    """Every ql / qh byte pair: byte j of code word t is 4 * (q - 32) as a signed byte, q the 6-bit
    value ggml builds from ql nibble t / 2 (of the ql word of group t % 2) and qh bits 2t, 2t+1."""
    a = np.arange(1 << 16, dtype=np.uint32)
    ql, qh = (a & 0xFF).astype(np.uint8), (a >> 8).astype(np.uint8)      # every (ql, qh) byte pair
    # byte j of word i: the pairs rolled by 4j + 1 (la) and 4j + 3 (lb, h), so every pair meets
    # every group in every byte, next to different neighbours
    lanes = [np.roll(ql, 4 * j + 1) for j in range(4)], [np.roll(ql, 4 * j + 3) for j in range(4)], \
        [np.roll(qh, 4 * j + 3) for j in range(4)]
    la, lb, h = (np.stack(w, axis=1).view(np.uint32).ravel() for w in lanes)
    q = np.zeros(4 * la.size, np.uint32)
    lanes_lib.q6k_codes(la.ctypes.data, lb.ctypes.data, h.ctypes.data, q.ctypes.data, la.size)
    got = q.reshape(-1, 4).view(np.int8).reshape(-1, 4, 4)            # (word, t, byte j)
    qla, qlb, qhb = (np.stack(w, axis=1).reshape(-1, 4).astype(np.int32) for w in lanes)
    for t in range(4):
        nib = ((qla if t % 2 == 0 else qlb) >> (4 * (t // 2))) & 0x0F
        want = 4 * ((nib | (((qhb >> (2 * t)) & 3) << 4)) - 32)
        np.testing.assert_array_equal(got[:, t, :], want, err_msg=f"group {t}")


def lane_dot(lib, qtype, row, k, codes, d, s, only_part=-1, step=4) -> float:
    out = ctypes.c_double()
    xq = np.ascontiguousarray(codes).view(np.int32)
    assert lib.kq_row_dot(qtype if qtype == PAIRS else int(qtype), row.ctypes.data, k, xq.ctypes.data, d.ctypes.data, s.ctypes.data,
                          only_part, step, ctypes.byref(out)) == 0
    return out.value


def at_offset(row: np.ndarray, shift: int) -> np.ndarray:
    """The bytes of row in a buffer of their own that starts shift bytes past an 8-byte boundary."""
    buf = np.zeros(row.nbytes + 16, np.uint8)
    start = (-buf.ctypes.data) % 8 + shift
    out = buf[start:start + row.nbytes]
    out[:] = row
    return out


def check_rows(lib, qtype, data, k, rng, steps=(4,), shift=None):
    """Every row of data (blocks of qtype) against gguf: the lanes' shares, walked as the kernel
    walks with each step, add up to the row's dot product with fresh int8-quantized x."""
    rows = data.shape[0]
    w = gguf_dequantize(data, qtype).astype(np.float64).reshape(rows, k)
    for r in range(rows):
        x = rng.normal(0, 1, k).astype(np.float32)
        x[rng.integers(0, k, 5)] *= 20                             # outliers: uneven block scales
        codes, d, s = q8(x)
        xhat = codes.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
        want = float(w[r] @ xhat)
        row = np.ascontiguousarray(data[r]) if shift is None else at_offset(data[r], shift)
        scale = float(np.abs(w[r] * xhat).sum())
        for step in steps:
            got = lane_dot(lib, qtype, row, k, codes, d, s, step=step)
            assert abs(got - want) <= 1e-5 * scale, \
                f"{qtype.name} k={k} row {r} step {step} shift {shift}: {got} vs {want} (scale {scale})"


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("k", [256, 768, 2560, 4096])
def test_lane_shares_sum_to_the_dot_product(lanes_lib, qtype, k):
    """Steps 4, 8, 16: one, two and four warps sharing a row (WS); 2560 = 10 super-blocks, not a
    whole number of steps."""
    rng = np.random.default_rng([int(qtype), k])
    rows = 9                       # Q6_K rows of 210-byte blocks start at every 2-byte misalignment
    data = np.ascontiguousarray(random_blocks(qtype, rows, k, rng, std=1.0))
    check_rows(lanes_lib, qtype, data, k, rng, steps=(4, 8, 16))


@pytest.mark.parametrize("shift", [0, 2, 4, 6])
def test_q6k_rows_at_every_alignment(lanes_lib, shift):
    """A Q6_K row whose first block starts `shift` bytes past an 8-byte boundary: each lane reads
    its pieces as aligned windows and keeps the misalignment from the first block it reads."""
    rng = np.random.default_rng(shift)
    k = 2048
    data = np.ascontiguousarray(random_blocks(QType.Q6_K, 3, k, rng, std=1.0))
    check_rows(lanes_lib, QType.Q6_K, data, k, rng, steps=(4, 8), shift=shift)


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
def test_each_lane_owns_its_own_values(lanes_lib, qtype):
    """x nonzero only in one 32-value sub-block: only the lanes said to own it contribute."""
    rng = np.random.default_rng(7)
    k = 256
    data = np.ascontiguousarray(random_blocks(qtype, 1, k, rng, std=1.0))
    w = gguf_dequantize(data, qtype).astype(np.float64).reshape(k)
    for sub in range(8):
        x = np.zeros(k, np.float32)
        x[32 * sub:32 * sub + 32] = rng.normal(0, 1, 32)
        codes, d, s = q8(x)
        xhat = codes.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
        row = np.ascontiguousarray(data[0])
        if qtype == QType.Q4_K:
            owners = {2 * (sub // 2), 2 * (sub // 2) + 1}          # parts 2c, 2c+1 hold sub-blocks 2c, 2c+1
        else:
            owners = set(range(4 * (sub // 4), 4 * (sub // 4) + 4))   # the four parts of its half
        for part in range(8):
            got = lane_dot(lanes_lib, qtype, row, k, codes, d, s, part)
            if part not in owners:
                assert got == 0.0, f"{qtype.name}: part {part} adds {got} for sub-block {sub}"
        total = sum(lane_dot(lanes_lib, qtype, row, k, codes, d, s, p) for p in owners)
        want = float(w @ xhat)
        assert abs(total - want) <= 1e-5 * float(np.abs(w * xhat).sum())


@pytest.mark.parametrize("k", [512, 1024, 4096, 12288])
def test_q6k_pairs_give_the_gguf_lanes_sums(lanes_lib, k):
    """Lanes<Q6_KP> on rows in pair order (each row read where it lies in a 16-byte aligned tensor,
    so every pair phase is met) gives every part's share bit for bit as Lanes<Q6_K> on the GGUF
    rows (the same arithmetic on the same bytes), at steps 4, 8 and 16."""
    rng = np.random.default_rng(k)
    rows = 5
    data = np.ascontiguousarray(random_blocks(QType.Q6_K, rows, k, rng, std=1.0)).reshape(rows, -1)
    pairs = aligned16(to_pairs(data, rows, k))
    for r in range(rows):
        x = rng.normal(0, 1, k).astype(np.float32)
        x[rng.integers(0, k, 5)] *= 20
        codes, d, s = q8(x)
        for step in (4, 8, 16):
            for part in range(8):
                want = lane_dot(lanes_lib, QType.Q6_K, np.ascontiguousarray(data[r]), k, codes, d, s, part, step)
                got = lane_dot(lanes_lib, PAIRS, pairs[r], k, codes, d, s, part, step)
                assert got == want, f"k={k} row {r} step {step} part {part}: {got} vs {want}"


@pytest.mark.parametrize("k", [256, 1024, 4096])
def test_q6k_lane_weights_are_ggufs_values(lanes_lib, k):
    """Lanes<Q6_K>::weights and Lanes<Q6_KP>::weights (what dequant_lanes_kernel stores), every part
    of every super-block placed where its values lie, equal gguf's dequantized row bit for bit: the
    same (d * scale) * (q - 32) in float32. Rows at every offset of a 16-byte aligned tensor, so each
    misalignment of a GGUF block and each pair phase is met."""
    rng = np.random.default_rng(k + 1)
    rows = 7
    data = np.ascontiguousarray(random_blocks(QType.Q6_K, rows, k, rng, std=1.0)).reshape(rows, -1)
    want = gguf_dequantize(data, QType.Q6_K).reshape(rows, k).astype(np.float32)
    tensors = {QType.Q6_K.value: aligned16(data)}
    if k % 512 == 0:
        tensors[PAIRS] = aligned16(to_pairs(data, rows, k))
    for type_code, tensor in tensors.items():
        for r in range(rows):
            got = np.empty(k, np.float32)
            assert lanes_lib.q6_row_weights(type_code, tensor[r].ctypes.data, k, got.ctypes.data) == 0
            np.testing.assert_array_equal(got, want[r], err_msg=f"type {type_code} row {r}")
