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
from host_harness import build_host_library

from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

HARNESS = r"""
#include "kq_lanes.cuh"
using namespace gguf;

template <class QT>
static double row_dot(const u8* row, int k, const int* xq, const float* xd, const float* xs, int only_part) {
    double sum = 0.0;
    for (int sb = 0; sb < k / 256; ++sb)
        for (int part = 0; part < 8; ++part) {
            if (only_part >= 0 && part != only_part) continue;
            typename Lanes<QT>::Regs r;
            typename Lanes<QT>::X x;
            Lanes<QT>::load(row + sb * Lanes<QT>::kBytes, part, r);
            Lanes<QT>::load_x(xq, xd, xs, sb, part, x);
            sum += Lanes<QT>::dot(r, x, part);
        }
    return sum;
}

extern "C" int kq_row_dot(int type, const u8* row, int k, const int* xq, const float* xd, const float* xs,
                          int only_part, double* out) {
    if (type == Q4_K::kType) *out = row_dot<Q4_K>(row, k, xq, xd, xs, only_part);
    else if (type == Q6_K::kType) *out = row_dot<Q6_K>(row, k, xq, xd, xs, only_part);
    else return 1;
    return 0;
}
"""


@pytest.fixture(scope="module")
def lanes_lib(tmp_path_factory):
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("kq"), "kq")
    dll.kq_row_dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    return dll


def lane_dot(lib, qtype, row, k, codes, d, s, only_part=-1) -> float:
    out = ctypes.c_double()
    xq = np.ascontiguousarray(codes).view(np.int32)
    assert lib.kq_row_dot(int(qtype), row.ctypes.data, k, xq.ctypes.data, d.ctypes.data, s.ctypes.data,
                          only_part, ctypes.byref(out)) == 0
    return out.value


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("k", [256, 768, 4096])
def test_lane_shares_sum_to_the_dot_product(lanes_lib, qtype, k):
    rng = np.random.default_rng([int(qtype), k])
    rows = 9                       # Q6_K rows of 210-byte blocks start at every 2-byte misalignment
    data = np.ascontiguousarray(random_blocks(qtype, rows, k, rng, std=1.0))
    w = gguf_dequantize(data, qtype).astype(np.float64).reshape(rows, k)
    for r in range(rows):
        x = rng.normal(0, 1, k).astype(np.float32)
        x[rng.integers(0, k, 5)] *= 20                             # outliers: uneven block scales
        codes, d, s = q8(x)
        xhat = codes.astype(np.float64) * np.repeat(d.astype(np.float64), 32)
        want = float(w[r] @ xhat)
        row = np.ascontiguousarray(data[r])
        got = lane_dot(lanes_lib, qtype, row, k, codes, d, s)
        scale = float(np.abs(w[r] * xhat).sum())
        assert abs(got - want) <= 1e-5 * scale, f"{qtype.name} k={k} row {r}: {got} vs {want} (scale {scale})"


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
