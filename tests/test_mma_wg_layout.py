"""mma_wg.cu's B side on the CPU: wg_stage_q4k_kernel's layout of x (xp, each super-block's values in
the lanes' order of K, and xs, the (sub-block, half) sums), emulated bit for bit, is the B operand
mma_dq stages for the same A fragments, placed where a wgmma reads B: value (k', n) at xp[n, k'].
mma_dq's staging and lanes multiply to gguf's product (test_mma_dq_frag.py), and a warpgroup's A
fragments are mma_dq's per warp, so the two layouts agreeing is the kernel's K order being right.
GPU runs of the kernel itself are in test_quant_matmul.py."""

from __future__ import annotations

import numpy as np
import pytest

from test_mma_dq_frag import pack2, stage


def wg_stage(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """wg_stage_q4k_kernel: x (M, K) float32 -> (xp (M, K), xs (M, K / 16)) as bf16 bits."""
    m, k = x.shape
    xp = np.zeros((m, k), np.uint16)
    xs = np.zeros((m, k // 16), np.uint16)
    for row in range(m):
        for c in range(k // 16):
            sb, sg = divmod(c, 16)
            h, t, u = sg >> 3, (sg >> 1) & 3, sg & 1
            src = 256 * sb + 64 * (2 * h + (t >> 1)) + 32 * u + 16 * (t & 1)
            s = np.float32(0)
            for i in range(4):
                v = x[row, src + 4 * i:src + 4 * i + 4].astype(np.float32)
                s = np.float32(s + np.float32(np.float32(v[0] + v[1]) + np.float32(v[2] + v[3])))
                kk = 256 * sb + 16 * (8 * h + 2 * i + u) + 2 * t
                for pos, (lo, hi) in ((kk, (v[0], v[2])), (kk + 8, (v[1], v[3]))):
                    word = pack2(lo, hi)
                    xp[row, pos], xp[row, pos + 1] = word & 0xFFFF, word >> 16
            xs[row, c] = pack2(s, 0.0) & 0xFFFF
    return xp, xs


def pair(a: np.ndarray, i: int) -> int:
    return int(a[i]) | (int(a[i + 1]) << 16)


@pytest.mark.parametrize("m,k", [(8, 256), (13, 512)])
def test_wgmma_b_is_the_staged_b(m, k):
    rng = np.random.default_rng(m + k)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    xp, xs = wg_stage(x)
    for sb in range(k // 256):
        for nt in range(-(-m // 8)):
            bf, mn = stage(x, sb, nt, m)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                tok = 8 * nt + g
                if tok >= m:
                    continue
                for h in range(2):
                    for i in range(4):
                        for u in range(2):
                            s = 8 * h + 2 * i + u            # b0: k' = 2t, 2t + 1 of the k-step; b1: + 8
                            want = bf[4 * h + i][lane][2 * u:2 * u + 2]
                            got = (pair(xp[tok], 256 * sb + 16 * s + 2 * t), pair(xp[tok], 256 * sb + 16 * s + 2 * t + 8))
                            assert got == want, (sb, lane, h, i, u)
                    assert pair(xs[tok], 16 * sb + 8 * h + 2 * t) == mn[lane][h], (sb, lane, h)


def test_stage_is_a_permutation_of_x():
    """Every value of x lands once in xp (the K order is a permutation within each super-block)."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (2, 512)).astype(np.float32)
    xp, _ = wg_stage(x)
    xb = np.array([[pack2(v, 0.0) & 0xFFFF for v in r] for r in x], np.uint16)
    for sb in range(2):
        for r in range(2):
            assert sorted(xp[r, 256 * sb:256 * sb + 256]) == sorted(xb[r, 256 * sb:256 * sb + 256])


PANEL = 128 * 128                   # kPanel: a 64-wide panel of 128 rows
STAGE = 5 * PANEL                   # kStage


def sw128_offset(rows: int, row: int, col: int) -> int:
    """wgmma.cuh's sw128_offset: byte offset of bf16 (row, col) in a 128-byte-swizzled tile."""
    panel, piece = col >> 6, (col >> 3) & 7
    return panel * rows * 128 + row * 128 + ((piece ^ (row & 7)) << 4) + (col & 7) * 2


def cp_async_stage(xp: np.ndarray, xs: np.ndarray, m0: int, sb: int) -> dict[int, int]:
    """The shared-memory image mma_wg_kernel's issue() copies for rows m0.. of x and super-block sb,
    as {byte offset: bf16 bits}: thread tid's 16 xp pieces and its slot-sum piece (rows clamped)."""
    m, k = xp.shape
    img = {}
    for tid in range(256):
        prow, c8 = tid >> 5, tid & 31
        xdst = (c8 >> 3) * PANEL + prow * 128 + (((c8 & 7) ^ (prow & 7)) << 4)
        for j in range(16):
            row = min(m0 + prow + 8 * j, m - 1)
            for e in range(8):
                img[xdst + j * 1024 + 2 * e] = int(xp[row, 256 * sb + 8 * c8 + e])
        srow, sc8 = tid >> 1, tid & 1
        sdst = 4 * PANEL + srow * 128 + ((sc8 ^ (srow & 7)) << 4)
        for e in range(8):
            img[sdst + 2 * e] = int(xs[min(m0 + srow, m - 1), 16 * sb + 8 * sc8 + e])
    return img
