"""The fragments of mma_kq.cu (mma_kq_frag.cuh) on the CPU: A and B placed as PTX defines the
m16n8k32 s8 fragments multiply to each sub-block's integer dot products, and the scales map the
int32 results to gguf's values. The header is __host__ __device__; a host harness (g++, or nvcc)
runs the code the GPU runs. The kernel itself runs in test_quant_matmul.py (GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from gpu_rounding import q8_blocks as q8
from host_harness import build_host_library

from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

HARNESS = r"""
#include "mma_kq_frag.cuh"
using namespace gguf;

extern "C" void b_frag(const u8* row, int sb, int j, int t, unsigned* out) {
    const u32x2 f = mma_q4k_b_frag(mma_q4k_b_words(row, sb, j >> 1, t), j & 1);
    out[0] = f.x; out[1] = f.y;
}
extern "C" void a_words(const int* xq_row, int sb, int j, int t, unsigned* out) {
    const u32x2 f = mma_x_words(xq_row, sb, j, t);
    out[0] = f.x; out[1] = f.y;
}
extern "C" void scale(const u8* row, int sb, int j, float* out) {
    const f32x2 s = mma_q4k_scale(load16(row + sb * 144), j);
    out[0] = s.x; out[1] = s.y;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("mma"), "mmakq")
    for f in (dll.b_frag, dll.a_words):
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    dll.scale.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return dll


def words(fn, ptr, sb, j, t) -> np.ndarray:
    out = np.zeros(2, np.uint32)
    fn(ptr, sb, j, t, out.ctypes.data)
    return out.view(np.int8 if fn.__name__ == "a_words" else np.uint8).astype(np.int64)


def fragments(lib, wrows, xrows, sb, j):
    """A (16 x 32) and B (32 x 8) of sub-block j, each lane's registers put where PTX says."""
    a = np.zeros((16, 32), np.int64)
    b = np.zeros((32, 8), np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        lo, hi = words(lib.a_words, xrows[g].ctypes.data, sb, j, t).reshape(2, 4)          # a0, a2
        lo8, hi8 = words(lib.a_words, xrows[g + 8].ctypes.data, sb, j, t).reshape(2, 4)   # a1, a3
        a[g, 4 * t:4 * t + 4], a[g, 16 + 4 * t:20 + 4 * t] = lo, hi
        a[g + 8, 4 * t:4 * t + 4], a[g + 8, 16 + 4 * t:20 + 4 * t] = lo8, hi8
        b0, b1 = words(lib.b_frag, wrows[g].ctypes.data, sb, j, t).reshape(2, 4)
        b[4 * t:4 * t + 4, g], b[16 + 4 * t:20 + 4 * t, g] = b0, b1
    return a, b


def test_fragments_multiply_to_the_sub_block_dot_products(lib):
    rng = np.random.default_rng(11)
    k = 512
    data = np.ascontiguousarray(random_blocks(QType.Q4_K, 8, k, rng, std=1.0))
    wrows = [np.ascontiguousarray(data[n]) for n in range(8)]
    xs = rng.normal(0, 1, (16, k)).astype(np.float32)
    codes = [q8(x) for x in xs]
    xrows = [np.ascontiguousarray(c[0]).view(np.int32) for c in codes]
    for sb in range(k // 256):
        for j in range(8):
            a, b = fragments(lib, wrows, xrows, sb, j)
            c = a @ b                                                     # the mma's definition
            qs = data[:, sb * 144 + 16:(sb + 1) * 144].astype(np.int64)
            wq = (qs[:, 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 0xF          # (8, 32) codes
            xq = np.stack([cd[0][sb * 256 + 32 * j:sb * 256 + 32 * j + 32] for cd in codes]).astype(np.int64)
            np.testing.assert_array_equal(c, xq @ wq.T, err_msg=f"super-block {sb}, sub-block {j}")


def test_scales_map_codes_to_gguf_values(lib):
    rng = np.random.default_rng(12)
    k = 768
    data = np.ascontiguousarray(random_blocks(QType.Q4_K, 3, k, rng, std=1.0))
    want = gguf_dequantize(data, QType.Q4_K).reshape(3, k)
    out = np.zeros(2, np.float32)
    for n in range(3):
        row = np.ascontiguousarray(data[n])
        for sb in range(k // 256):
            qs = row[sb * 144 + 16:(sb + 1) * 144].astype(np.int64)
            for j in range(8):
                lib.scale(row.ctypes.data, sb, j, out.ctypes.data)
                q = ((qs[32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 0xF).astype(np.float32)
                got = out[0] * q - out[1]
                np.testing.assert_array_equal(got, want[n, sb * 256 + 32 * j:sb * 256 + 32 * j + 32])


def test_scaled_sums_give_the_row_dot_product(lib):
    """The kernel's arithmetic on one (x row, weight row): sum over sub-blocks of
    xd * (d sc) * C - (dmin m) * xs equals x_hat . w."""
    rng = np.random.default_rng(13)
    k = 1024
    data = np.ascontiguousarray(random_blocks(QType.Q4_K, 8, k, rng, std=1.0))
    w = gguf_dequantize(data, QType.Q4_K).astype(np.float64).reshape(8, k)
    xs = rng.normal(0, 1, (16, k)).astype(np.float32)
    codes = [q8(x) for x in xs]
    xrows = [np.ascontiguousarray(c[0]).view(np.int32) for c in codes]
    wrows = [np.ascontiguousarray(data[n]) for n in range(8)]
    acc = np.zeros((16, 8))
    sc = np.zeros(2, np.float32)
    for sb in range(k // 256):
        for j in range(8):
            a, b = fragments(lib, wrows, xrows, sb, j)
            c = a @ b
            for n in range(8):
                lib.scale(wrows[n].ctypes.data, sb, j, sc.ctypes.data)
                s = sb * 8 + j
                xd = np.array([cd[1][s] for cd in codes], np.float64)
                xsum = np.array([cd[2][s] for cd in codes], np.float64)
                acc[:, n] += xd * sc[0] * c[:, n] - sc[1] * xsum
    xhat = np.stack([cd[0].astype(np.float64) * np.repeat(cd[1].astype(np.float64), 32) for cd in codes])
    want = xhat @ w.T
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
