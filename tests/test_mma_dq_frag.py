"""mma_dq.cu's lane arithmetic, emulated bit for bit in NumPy on the CPU: the header's 6-bit scales
and mins turned into bf16 pairs by byte permutes and bf16x2 FMAs, each code word into four pairs of
weights, x staged in the kernel's permuted order with its (sub-block, half) sums, and the
m16n8k16 products taken by the PTX definition of the fragments (A and B placed as PTX lays them
out, D = A @ B in float64, as the tensor cores' float32 accumulation is at these sizes). The
result must be x · dequant(W)ᵀ, gguf the oracle, up to bf16 rounding. GPU runs of the kernel
itself are in test_quant_matmul.py."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

MAGIC = 0x43004300


def bf16_value(bits: int) -> float:
    return float(np.uint32((bits & 0xFFFF) << 16).view(np.float32))


def bf16_bits(v: float) -> int:
    """float -> bf16 bits, round to nearest even (cvt.rn)."""
    u = int(np.float32(v).view(np.uint32))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def pack2(lo: float, hi: float) -> int:
    return bf16_bits(lo) | (bf16_bits(hi) << 16)


def fma2(a: int, b: int, c: int) -> int:
    """fma.rn.bf16x2: per half, a * b + c rounded once (the float64 sum is exact here)."""
    out = 0
    for s in (0, 16):
        v = bf16_value(a >> s) * bf16_value(b >> s) + bf16_value(c >> s)
        out |= bf16_bits(v) << s
    return out


def byte_perm(x: int, y: int, sel: int) -> int:
    src = (x & 0xFFFFFFFF) | ((y & 0xFFFFFFFF) << 32)
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def words(b: bytes) -> list[int]:
    return [int.from_bytes(b[4 * i:4 * i + 4], "little") for i in range(len(b) // 4)]


def row_scales(hdr: list[int], t: int):
    d = float(np.uint16(hdr[0] & 0xFFFF).view(np.float16))
    dmin = float(np.uint16(hdr[0] >> 16).view(np.float16))
    d2, cd = pack2(d, d), pack2(-128 * d, -128 * d)
    n2, cn = pack2(-dmin, -dmin), pack2(128 * dmin, 128 * dmin)
    sh = 16 * (t >> 1)
    y, z, w = ((v >> sh) & 0xFFFF for v in hdr[1:])
    sc_lo, m_lo = y & 0x3F3F, z & 0x3F3F
    sc_hi = (w & 0x0F0F) | ((y >> 2) & 0x3030)
    m_hi = ((w >> 4) & 0x0F0F) | ((z >> 2) & 0x3030)
    s = [fma2(byte_perm(v, 0, sel) | MAGIC, d2, cd) for v in (sc_lo, sc_hi) for sel in (0x4040, 0x4141)]
    c = [fma2(v, 0xC300C300, 0) for v in s]
    mn = [fma2(byte_perm(v, 0, 0x4140) | MAGIC, n2, cn) for v in (m_lo, m_hi)]
    return s, c, mn


def decode_word(w: int, s, c, j: int):
    f = lambda sh, jj: fma2(((w >> sh) & 0x000F000F) | MAGIC, s[jj], c[jj])   # noqa: E731
    return f(0, j), f(8, j), f(4, j + 1), f(12, j + 1)          # lo even, lo odd, hi even, hi odd


def stage(x: np.ndarray, sb: int, nt: int, m: int):
    """The B uint4s [(h, i)][lane] and min pairs [lane] = (b0, b1) of super-block sb, n-tile nt."""
    bf = [[None] * 32 for _ in range(8)]
    mn = [[0, 0] for _ in range(32)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        tok = 8 * nt + g
        for h in range(2):
            if tok >= m:
                for i in range(4):
                    bf[4 * h + i][lane] = (0, 0, 0, 0)
                continue
            base = 256 * sb + 32 * (2 * (2 * h + (t >> 1))) + 16 * (t & 1)
            a, b = x[tok, base:base + 16].astype(np.float32), x[tok, base + 32:base + 48].astype(np.float32)
            for i in range(4):
                p, q = a[4 * i:4 * i + 4], b[4 * i:4 * i + 4]
                bf[4 * h + i][lane] = (pack2(p[0], p[2]), pack2(p[1], p[3]), pack2(q[0], q[2]), pack2(q[1], q[3]))
            # the kernel's float32 sums, four values at a time
            s0 = np.float32(0)
            s1 = np.float32(0)
            for i in range(4):
                p, q = a[4 * i:4 * i + 4], b[4 * i:4 * i + 4]
                s0 = np.float32(s0 + np.float32(np.float32(p[0] + p[1]) + np.float32(p[2] + p[3])))
                s1 = np.float32(s1 + np.float32(np.float32(q[0] + q[1]) + np.float32(q[2] + q[3])))
            mn[lane][h] = pack2(s0, s1)
    return bf, mn


def mma(acc: np.ndarray, a_regs, b_regs) -> None:
    """acc (16, 8) += A @ B with A, B assembled from the lanes' registers as PTX defines them for
    mma.m16n8k16 .bf16 (a_regs[lane] = (a0, a1, a2, a3), b_regs[lane] = (b0, b1))."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a0, a1, a2, a3 = a_regs[lane]
        for reg, r, k in ((a0, g, 2 * t), (a1, g + 8, 2 * t), (a2, g, 2 * t + 8), (a3, g + 8, 2 * t + 8)):
            A[r, k], A[r, k + 1] = bf16_value(reg), bf16_value(reg >> 16)
        b0, b1 = b_regs[lane]
        for reg, k in ((b0, 2 * t), (b1, 2 * t + 8)):
            B[k, g], B[k + 1, g] = bf16_value(reg), bf16_value(reg >> 16)
    acc += A @ B


def tile_product(blocks: np.ndarray, x: np.ndarray, nt_count: int) -> np.ndarray:
    """One m-tile (16 rows of W, as uint8 (16, row_bytes)) against x (M, K): (16, 8 nt_count)."""
    m, k = x.shape
    acc = [np.zeros((16, 8)) for _ in range(nt_count)]
    for sb in range(k // 256):
        raw = [[bytes(blocks[g + 8 * rr, 144 * sb:144 * sb + 144]) for rr in range(2)] for g in range(8)]
        lanes = []
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            rows = []
            for rr in range(2):
                blk = raw[g][rr]
                hdr = words(blk[:16])
                q = [words(blk[16 + 16 * t:32 + 16 * t]), words(blk[80 + 16 * t:96 + 16 * t])]
                rows.append((row_scales(hdr, t), q))
            lanes.append(rows)
        for nt in range(nt_count):
            bf, mn = stage(x, sb, nt, m)
            # the mins
            mma(acc[nt], [(lanes[l][0][0][2][0], lanes[l][1][0][2][0], lanes[l][0][0][2][1], lanes[l][1][0][2][1])
                          for l in range(32)], mn)
            for h in range(2):
                for i in range(4):
                    regs = []
                    for lane in range(32):
                        pairs = [decode_word(lanes[lane][rr][1][h][i], *lanes[lane][rr][0][:2], 2 * h) for rr in range(2)]
                        regs.append(pairs)
                    for u in range(2):
                        a = [(regs[l][0][2 * u], regs[l][1][2 * u], regs[l][0][2 * u + 1], regs[l][1][2 * u + 1])
                             for l in range(32)]
                        b = [(bf[4 * h + i][l][2 * u], bf[4 * h + i][l][2 * u + 1]) for l in range(32)]
                        mma(acc[nt], a, b)
    return np.concatenate(acc, axis=1)


@pytest.mark.parametrize("m,k", [(5, 256), (16, 512), (11, 512)])
def test_lanes_multiply_to_the_product(m, k):
    rng = np.random.default_rng(m * 1000 + k)
    blocks = random_blocks(QType.Q4_K, 16, k, rng, 0.05)
    w = gguf_dequantize(blocks, QType.Q4_K).astype(np.float64).reshape(16, k)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    nt = -(-m // 8)
    got = tile_product(blocks, x, nt)[:, :m]
    ref = w @ x.astype(np.float64).T
    err = float(np.mean((got - ref) ** 2) / np.mean(ref ** 2))
    assert err < 1e-4, err                        # bf16 weights and x: ~1e-5
    assert np.all(tile_product(blocks, x, nt)[:, m:] == 0)      # padded rows of x stay zero


def test_scales_match_gguf():
    """S and -M of every sub-block, as the lanes hold them, are gguf's d * sc and dmin * m in bf16."""
    rng = np.random.default_rng(5)
    blocks = random_blocks(QType.Q4_K, 4, 256, rng, 0.05)
    for row in range(4):
        blk = bytes(blocks[row, :144])
        hdr = words(blk[:16])
        d = float(np.frombuffer(blk[0:2], np.float16)[0])
        dmin = float(np.frombuffer(blk[2:4], np.float16)[0])
        q = blk[4:16]
        sc = [q[j] & 63 if j < 4 else (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4) for j in range(8)]
        mi = [q[j + 4] & 63 if j < 4 else (q[j + 4] >> 4) | ((q[j] >> 6) << 4) for j in range(8)]
        for t in range(4):
            s, c, mn = row_scales(hdr, t)
            subs = [2 * (t >> 1), 2 * (t >> 1) + 1, 4 + 2 * (t >> 1), 5 + 2 * (t >> 1)]
            for jj, j in enumerate(subs):
                want = bf16_value(bf16_bits(bf16_value(bf16_bits(d)) * sc[j]))
                assert bf16_value(s[jj]) == bf16_value(s[jj] >> 16) == want, (row, t, j)
                assert bf16_value(c[jj]) == -128 * want
            for h in range(2):
                for u in range(2):
                    j = subs[2 * h + u]
                    want = -bf16_value(bf16_bits(bf16_value(bf16_bits(dmin)) * mi[j]))
                    assert bf16_value(mn[h] >> (16 * u)) == want, (row, t, j)
