"""mma_kq.cu's per-lane code (mma_kq_frag.cuh) on the CPU, and the kernel's whole arithmetic on
tiny cases, for Q4_K and Q6_K weights. The header is __host__ __device__; a host harness (g++, or
nvcc) runs the code the GPU runs: the weight loads (Q6_K: from rows at every 2-byte alignment, as
the kernel addresses them), the header gathers and the words shifted into place, the A fragments,
the staging of x into shared memory and the B fragments read from it, and the per-super-block
routines with the int32 results of the m16n8k32 (Q4_K) and m16n8k16 (Q6_K) taken from an
emulation of the mma's definition (A and B placed as PTX defines the s8 fragments, C = A @ B).
The warp's shuffles are look-ups of the source lane's registers. The kernel's loop over blocks,
steps and K slices and its slice sum are mirrored in Python. GPU runs of the kernel itself are in
test_quant_matmul.py."""

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
#include <string.h>
using namespace gguf;

static_assert(sizeof(MmaQ4K) == 72, "18 words per lane");
static_assert(sizeof(MmaQ6K) == 112, "28 words per lane");

struct HostWarp {                  // the warp-wide steps: header words by look-up, C from a table
    const MmaQ4K* lanes;
    const int* c;                  // this lane's C, 4 ints per call, in call order
    unsigned* seen;                // the A and B each call passed: 6 words per call
    int calls;
    u32 shfl_header(const MmaQ4K&, int r, int lane) const { return lanes[lane].hw[r]; }
    void mma(int (&out)[4], const u32 (&a)[4], u32x2 b) {
        for (int i = 0; i < 4; ++i) out[i] = c[4 * calls + i];
        unsigned* s = seen + 6 * calls;
        for (int i = 0; i < 4; ++i) s[i] = a[i];
        s[4] = b.x; s[5] = b.y;
        ++calls;
    }
};
struct MemCopy {
    void c16(void* dst, const void* src) const { memcpy(dst, src, 16); }
    void c4(void* dst, const void* src) const { memcpy(dst, src, 4); }
};

// the 32 lanes' loads of super-block sb of a tile of 16 weight rows (row r at tile + r * row_bytes)
extern "C" void load_lanes(const u8* tile, long long row_bytes, int sb, MmaQ4K* out) {
    for (int lane = 0; lane < 32; ++lane)
        mma_q4k_load(tile + (lane >> 2) * row_bytes, tile + ((lane >> 2) + 8) * row_bytes, sb, lane & 3, out[lane]);
}
extern "C" void headers(const MmaQ4K* lanes, u32x4* hd) {           // hd: 32 x 2
    HostWarp w{lanes, nullptr, nullptr, 0};
    for (int lane = 0; lane < 32; ++lane) {
        u32x4 h[2];
        mma_q4k_headers(lanes[lane], lane >> 2, w, h);
        hd[2 * lane] = h[0]; hd[2 * lane + 1] = h[1];
    }
}
extern "C" void a_frags(const MmaQ4K* lanes, u32* a) {              // 32 x 8 sub-blocks x 4
    for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < 8; ++j) {
            u32 f[4];
            mma_q4k_a(lanes[lane], j, f);
            for (int i = 0; i < 4; ++i) a[(lane * 8 + j) * 4 + i] = f[i];
        }
}
extern "C" void sub_scales(const u32x4* hd, int j, int* sc, float* dm, float* d) {   // hd: 2 rows
    const u32x4 h[2] = {hd[0], hd[1]};
    const MmaQ4KSub s = mma_q4k_sub(h, j);
    float ds[2];
    mma_q4k_ds(h, s, ds);
    for (int r = 0; r < 2; ++r) { sc[r] = s.sc[r]; dm[r] = s.dm[r]; d[r] = mma_q4k_d(h[r]); d[2 + r] = ds[r]; }
}
extern "C" float small_int(int c) { return small_int_to_float(c); }

template <class QT, int NT> static void stage_t(const int* xq, const float* xd, const float* xs, int m, int k,
                                                int first_sb, int bits, u8* buf) {
    MemCopy copy;
    for (int tid = 0; tid < kStageThreads; ++tid) mma_stage_x<QT, NT>(buf, xq, xd, xs, m, k, first_sb, bits, tid, copy);
}
template <int NT> static void b_t(const u8* stage, u32* b, float* x) {      // 32 x NT x 8 x (2 | 4)
    for (int lane = 0; lane < 32; ++lane)
        for (int nt = 0; nt < NT; ++nt)
            for (int j = 0; j < 8; ++j) {
                const u32x2 f = MmaX<Q4_K, NT>::b(stage, nt, j, lane >> 2, lane & 3);
                const f32x4 s = MmaX<Q4_K, NT>::scales(stage, nt, j, lane & 3);
                const int i = (lane * NT + nt) * 8 + j;
                b[2 * i] = f.x; b[2 * i + 1] = f.y;
                x[4 * i] = s.x; x[4 * i + 1] = s.y; x[4 * i + 2] = s.z; x[4 * i + 3] = s.w;
            }
}
// one lane's super-block; acc (NT x 4) in and out, c: 8 x NT x 4 ints, seen: 8 x NT x 6 words
template <int NT> static void super_block_t(const MmaQ4K* lanes, int lane, const u8* stage, const int* c, float* acc,
                                            unsigned* seen) {
    HostWarp w{lanes, c, seen, 0};
    u32x4 hd[2];
    mma_q4k_headers(lanes[lane], lane >> 2, w, hd);
    float a[NT][4];
    memcpy(a, acc, sizeof(a));
    mma_q4k_super_block<NT>(lanes[lane], hd, stage, lane >> 2, lane & 3, a, w);
    memcpy(acc, a, sizeof(a));
}

#define BY_NT(CALL) switch (nt) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; \
                                  case 4: CALL(4); break; default: return 1; } return 0;
extern "C" int stage(int type, int nt, const int* xq, const float* xd, const float* xs, int m, int k, int first_sb,
                     int bits, u8* buf) {
#define STAGE4(N) stage_t<Q4_K, N>(xq, xd, xs, m, k, first_sb, bits, buf)
#define STAGE6(N) stage_t<Q6_K, N>(xq, xd, xs, m, k, first_sb, bits, buf)
    if (type == Q6_K::kType) { BY_NT(STAGE6) }
    BY_NT(STAGE4)
}
extern "C" int b_frags(int nt, const u8* stage, u32* b, float* x) {
#define BFR(N) b_t<N>(stage, b, x)
    BY_NT(BFR)
}
extern "C" int super_block(int nt, const MmaQ4K* lanes, int lane, const u8* stage, const int* c, float* acc,
                           unsigned* seen) {
#define SB(N) super_block_t<N>(lanes, lane, stage, c, acc, seen)
    BY_NT(SB)
}
// ---------------------------------------------------------------- Q6_K
struct HostWarp6 {                 // shuffles by look-up of the source lane, C from a table
    const MmaQ6K* lanes;
    const int* c;                  // this lane's C, 4 ints per call, in call order
    unsigned* seen;                // the A and B each call passed: 3 words per call
    int calls;
    u32 shfl_next(const MmaQ6K&, int r, int u, int lane) const {
        const int src = mma_q6k_next_lane(lane);
        return mma_q6k_sent(lanes[src], r, u, src & 3);
    }
    u32 shfl_scales(const MmaQ6K&, u32, int r, int sh, int lane) {
        return mma_q6k_own_scales(lanes[lane], r, lane, sh, *this);
    }
    void mma16(int (&out)[4], const u32 (&a)[2], u32 b) {
        for (int i = 0; i < 4; ++i) out[i] = c[4 * calls + i];
        unsigned* s = seen + 3 * calls;
        s[0] = a[0]; s[1] = a[1]; s[2] = b;
        ++calls;
    }
};
// the 32 lanes' loads of super-block sb of the tile at row0 of W (n rows), addressed as the kernel
// addresses them (rows past the end read row n - 1), and 8 * o of each lane's two rows
extern "C" void q6k_load_lanes(const u8* W, int n, long long row_bytes, int row0, int sb, MmaQ6K* out, int* sh) {
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        const u8* r0 = W + (long long)(row0 + g < n - 1 ? row0 + g : n - 1) * row_bytes;
        const u8* r1 = W + (long long)(row0 + g + 8 < n - 1 ? row0 + g + 8 : n - 1) * row_bytes;
        MmaKQ<Q6_K>::load(r0, r1, sb, t, out[lane]);
        MmaKQ<Q6_K>::load_rest(r0, r1, sb, t, 1, out[lane]);
        MmaKQ<Q6_K>::load_rest(r0, r1, sb, t, 2, out[lane]);
        sh[2 * lane] = mma_q6k_shift(r0, sb);
        sh[2 * lane + 1] = mma_q6k_shift(r1, sb);
    }
}
// every lane's words of the 13 pieces, both rows (piece 12: its scale word, sign bits flipped): 32 x 2 x 13
extern "C" void q6k_words(const MmaQ6K* lanes, const int* sh, u32* out) {
    HostWarp6 w{lanes, nullptr, nullptr, 0};
    for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 2; ++r)
            for (int u = 0; u < 13; ++u)
                out[(lane * 2 + r) * 13 + u] = u < 12 ? mma_q6k_word(lanes[lane], r, u, lane, sh[2 * lane + r], w)
                                                      : mma_q6k_own_scales(lanes[lane], r, lane, sh[2 * lane + r], w);
}
// A of group G = 2j + e (j = 4h + qq) for both rows: 32 x 16 x 2
extern "C" void q6k_a_frags(const MmaQ6K* lanes, const int* sh, u32* a) {
    HostWarp6 w{lanes, nullptr, nullptr, 0};
    for (int lane = 0; lane < 32; ++lane)
        for (int G = 0; G < 16; ++G) {
            const int j = G >> 1, e = G & 1, h = j >> 2, qq = j & 3;
            for (int r = 0; r < 2; ++r) {
                const int s = sh[2 * lane + r];
                a[(lane * 16 + G) * 2 + r] = mma_q6k_a(mma_q6k_word(lanes[lane], r, 4 * h + 2 * (qq & 1) + e, lane, s, w),
                                                       mma_q6k_word(lanes[lane], r, 8 + 2 * h + e, lane, s, w), qq);
            }
        }
}
extern "C" float q6k_ds(u32 sw, int i, float dq) { return mma_q6k_ds(sw, i, dq); }
extern "C" float q6k_dq(const MmaQ6K* lane, int r) { return mma_q6k_dq(*lane, r); }
template <int NT> static void b16_t(const u8* stage, u32* b, float* x) {    // b: 32 x NT x 16, x: 32 x NT x 8 x 2
    for (int lane = 0; lane < 32; ++lane)
        for (int nt = 0; nt < NT; ++nt) {
            for (int G = 0; G < 16; ++G) b[(lane * NT + nt) * 16 + G] = MmaX<Q6_K, NT>::b16(stage, nt, G, lane >> 2, lane & 3);
            for (int j = 0; j < 8; ++j) {
                const f32x2 v = MmaX<Q6_K, NT>::xd(stage, nt, j, lane & 3);
                x[((lane * NT + nt) * 8 + j) * 2] = v.x;
                x[((lane * NT + nt) * 8 + j) * 2 + 1] = v.y;
            }
        }
}
extern "C" int q6k_b_frags(int nt, const u8* stage, u32* b, float* x) {
#define B16(N) b16_t<N>(stage, b, x)
    BY_NT(B16)
}
// one lane's super-block; acc (NT x 4) in and out, c: 16 x NT x 4 ints in call order, seen: 3
// words per call, mids: the parts mid() was called with, in order (-1 after the last)
template <int NT> static void q6k_super_block_t(const MmaQ6K* lanes, const int* sh, int lane, const u8* stage,
                                                const int* c, float* acc, unsigned* seen, int* mids) {
    HostWarp6 w{lanes, c, seen, 0};
    float a[NT][4];
    memcpy(a, acc, sizeof(a));
    int calls = 0;
    const int s[2] = {sh[2 * lane], sh[2 * lane + 1]};
    mma_q6k_super_block<NT>(lanes[lane], s, stage, lane >> 2, lane & 3, a, w, [&](int part) { mids[calls++] = part; });
    mids[calls] = -1;
    memcpy(acc, a, sizeof(a));
}
extern "C" int q6k_super_block(int nt, const MmaQ6K* lanes, const int* sh, int lane, const u8* stage, const int* c,
                               float* acc, unsigned* seen, int* mids) {
#define SB6(N) q6k_super_block_t<N>(lanes, sh, lane, stage, c, acc, seen, mids)
    BY_NT(SB6)
}
extern "C" int stage_bytes(int type, int nt) {
    return nt * (type == Q6_K::kType ? MmaX<Q6_K, 1>::kBytes : MmaX<Q4_K, 1>::kBytes);
}
extern "C" int out_x_row(int nt, int q, int t) { return mma_out_x_row(nt, q, t); }
extern "C" int out_w_row(int q, int g) { return mma_out_w_row(q, g); }
"""

P = ctypes.c_void_p
I = ctypes.c_int


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = build_host_library(HARNESS, tmp_path_factory.mktemp("mma"), "mmakq")
    dll.load_lanes.argtypes = [P, ctypes.c_longlong, I, P]
    dll.headers.argtypes = [P, P]
    dll.a_frags.argtypes = [P, P]
    dll.sub_scales.argtypes = [P, I, P, P, P]
    dll.small_int.argtypes = [I]
    dll.small_int.restype = ctypes.c_float
    dll.stage_bytes.argtypes = [I, I]
    dll.stage.argtypes = [I, I, P, P, P, I, I, I, I, P]
    dll.b_frags.argtypes = [I, P, P, P]
    dll.super_block.argtypes = [I, P, I, P, P, P, P]
    dll.q6k_load_lanes.argtypes = [P, I, ctypes.c_longlong, I, I, P, P]
    dll.q6k_words.argtypes = [P, P, P]
    dll.q6k_a_frags.argtypes = [P, P, P]
    dll.q6k_ds.argtypes = [ctypes.c_uint32, I, ctypes.c_float]
    dll.q6k_ds.restype = ctypes.c_float
    dll.q6k_dq.argtypes = [P, I]
    dll.q6k_dq.restype = ctypes.c_float
    dll.q6k_b_frags.argtypes = [I, P, P, P]
    dll.q6k_super_block.argtypes = [I, P, P, I, P, P, P, P, P]
    return dll


def ptr(a: np.ndarray):
    assert a.flags.c_contiguous
    return a.ctypes.data


def s8(words: np.ndarray) -> np.ndarray:
    """uint32 words (..., n) -> their signed bytes (..., 4n), lowest byte first."""
    return np.ascontiguousarray(words, np.uint32).view(np.int8).astype(np.int64)


class Q4KRows:
    """W: n rows of Q4_K blocks (k values each), with gguf's values in float64."""

    def __init__(self, rng, n, k):
        self.n, self.k = n, k
        self.data = np.ascontiguousarray(random_blocks(QType.Q4_K, n, k, rng, std=1.0))
        self.row_bytes = self.data.shape[1]
        self.values = gguf_dequantize(self.data, QType.Q4_K).astype(np.float64).reshape(n, k)

    def tile(self, row0):
        """16 rows from row0, rows past the end repeating the last (the kernel's clamp)."""
        return np.ascontiguousarray(self.data[np.minimum(np.arange(row0, row0 + 16), self.n - 1)])

    def codes(self, rows, sb, j):
        """(len(rows), 32) 4-bit codes of sub-block j of super-block sb."""
        qs = self.data[rows, sb * 144 + 16:(sb + 1) * 144].astype(np.int64)
        return (qs[:, 32 * (j // 2):32 * (j // 2) + 32] >> (4 * (j % 2))) & 0xF


class X8:
    """x: m rows quantized per 32 values as quantize_x_kernel does."""

    def __init__(self, rng, m, k):
        self.m, self.k = m, k
        codes, d, s = q8(rng.normal(0, 1, (m, k)).astype(np.float32))
        self.codes = np.ascontiguousarray(codes)
        self.xq = self.codes.view(np.int32)
        self.xd, self.xs = np.ascontiguousarray(d), np.ascontiguousarray(s)
        self.values = codes.astype(np.float64) * np.repeat(d.astype(np.float64), 32, axis=-1)

    def lane_rows(self, lane, n):
        """Rows of x a lane's fragments hold in n-tile n, clamped to the last row as the staging
        repeats it: the B fragment's row (8n + lane / 4) and the scale pair's (8n + 2 (lane % 4), + 1)."""
        g, t = divmod(lane, 4)
        last = self.m - 1
        return min(8 * n + g, last), min(8 * n + 2 * t, last), min(8 * n + 2 * t + 1, last)


def staged(lib, x: X8, nt, first_sb, bits, qtype=QType.Q4_K):
    """The stage buffer of super-blocks first_sb .. + 2^bits - 1 of x, as the kernel for qtype lays it out."""
    buf = np.zeros((1 << bits) * lib.stage_bytes(int(qtype), nt), np.uint8)
    assert lib.stage(int(qtype), nt, ptr(x.xq), ptr(x.xd), ptr(x.xs), x.m, x.k, first_sb, bits, ptr(buf)) == 0
    return buf


def lanes_of(lib, tile, row_bytes, sb):
    lanes = np.zeros((32, 18), np.uint32)
    lib.load_lanes(ptr(tile), row_bytes, sb, ptr(lanes))
    return lanes


def fragments(lib, lanes, stage, nt):
    a = np.zeros((32, 8, 4), np.uint32)
    lib.a_frags(ptr(lanes), ptr(a))
    b = np.zeros((32, nt, 8, 2), np.uint32)
    xs = np.zeros((32, nt, 8, 4), np.float32)
    assert lib.b_frags(nt, ptr(stage), ptr(b), ptr(xs)) == 0
    return a, b, xs


def mma(a, b, nt):
    """C (nt, 8, 16, 8) of every n-tile and sub-block from the lanes' registers, placed as PTX
    defines m16n8k32 .row.col s8 (lane = 4g + t): A a0 = (g, 4t..), a1 = (g+8, 4t..), a2 = (g, 16+4t..),
    a3 = (g+8, 16+4t..); B b0 = (4t.., column g), b1 = (16+4t.., column g)."""
    c = np.zeros((nt, 8, 16, 8), np.int64)
    for n in range(nt):
        for j in range(8):
            am = np.zeros((16, 32), np.int64)
            bm = np.zeros((32, 8), np.int64)
            for lane in range(32):
                g, t = divmod(lane, 4)
                w = s8(a[lane, j]).reshape(4, 4)
                am[g, 4 * t:4 * t + 4], am[g + 8, 4 * t:4 * t + 4] = w[0], w[1]
                am[g, 16 + 4 * t:20 + 4 * t], am[g + 8, 16 + 4 * t:20 + 4 * t] = w[2], w[3]
                v = s8(b[lane, n, j]).reshape(2, 4)
                bm[4 * t:4 * t + 4, g], bm[16 + 4 * t:20 + 4 * t, g] = v[0], v[1]
            c[n, j] = am @ bm
    return c


def c_of_lane(c, lane):
    """The lane's C registers (c0..c3 = (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)) per call, in the
    order the routine calls the mma (sub-block, then n-tile): (8, nt, 4) int32."""
    g, t = divmod(lane, 4)
    return np.ascontiguousarray(np.stack([c[:, :, g, 2 * t], c[:, :, g, 2 * t + 1], c[:, :, g + 8, 2 * t],
                                          c[:, :, g + 8, 2 * t + 1]], -1).transpose(1, 0, 2), np.int32)


@pytest.mark.parametrize("nt", [1, 2, 4])
def test_fragments_multiply_to_the_sub_block_dot_products(lib, nt):
    """Weight rows as A (16 rows of a tile), x rows from the staged buffer as B (8 per n-tile):
    C's (row, column) is the dot product of weight row and x row over each sub-block."""
    rng = np.random.default_rng(11 + nt)
    w, x = Q4KRows(rng, 16, 512), X8(rng, 8 * nt - 3, 512)      # x rows past m repeat the last
    for sb in range(2):
        lanes = lanes_of(lib, w.tile(0), w.row_bytes, sb)
        a, b, _ = fragments(lib, lanes, staged(lib, x, nt, sb, 0), nt)
        c = mma(a, b, nt)
        for n in range(nt):
            xrows = np.minimum(np.arange(8 * n, 8 * n + 8), x.m - 1)
            for j in range(8):
                xq = x.codes[xrows, sb * 256 + 32 * j:sb * 256 + 32 * j + 32].astype(np.int64)
                np.testing.assert_array_equal(c[n, j], w.codes(np.arange(16), sb, j) @ xq.T,
                                              err_msg=f"super-block {sb}, n-tile {n}, sub-block {j}")


def test_headers_gather_each_rows_header(lib):
    rng = np.random.default_rng(21)
    w = Q4KRows(rng, 16, 768)
    for sb in range(3):
        lanes = lanes_of(lib, w.tile(0), w.row_bytes, sb)
        hd = np.zeros((32, 2, 4), np.uint32)
        lib.headers(ptr(lanes), ptr(hd))
        for lane in range(32):
            g = lane // 4
            for r in range(2):
                want = w.data[g + 8 * r, sb * 144:sb * 144 + 16].view(np.uint32)
                np.testing.assert_array_equal(hd[lane, r], want)
                assert lanes[lane, r] == want[lane % 4]          # each lane loaded one word of each


def test_scales_map_codes_to_gguf_values(lib):
    """(d * sc) * q - dmin * m from the routine's integer scale, d and dmin * m is gguf's value, bit
    for bit; so is d * sc as the three- and four-n-tile path rounds it."""
    rng = np.random.default_rng(12)
    w = Q4KRows(rng, 6, 768)
    sc, dm, d = np.zeros(2, np.int32), np.zeros(2, np.float32), np.zeros(4, np.float32)
    for n in range(0, 6, 2):
        for sb in range(3):
            hd = np.ascontiguousarray(w.data[[n, n + 1], sb * 144:sb * 144 + 16]).view(np.uint32)
            for j in range(8):
                lib.sub_scales(ptr(hd), j, ptr(sc), ptr(dm), ptr(d))
                for r in range(2):
                    ds = np.float32(d[r] * np.float32(sc[r]))
                    assert ds == d[2 + r]
                    q = w.codes([n + r], sb, j)[0].astype(np.float32)
                    got = ds * q - dm[r]
                    want = gguf_dequantize(w.data[[n + r]], QType.Q4_K).reshape(-1)[sb * 256 + 32 * j:][:32]
                    np.testing.assert_array_equal(got, want)


def test_small_ints_convert_exactly(lib):
    """The routine converts sc * C by the 1.5 * 2^23 trick, exact for |v| < 2^22; |sc * C| is at most
    63 * 32 * 15 * 127 = 3 840 480."""
    for v in (0, 1, -1, 12345, -54321, 3_840_480, -3_840_480, 2**22 - 1, -(2**22)):
        assert lib.small_int(v) == float(v)


@pytest.mark.parametrize("nt,bits", [(1, 0), (2, 1), (3, 2), (4, 3)])
def test_staging_places_codes_and_scales(lib, nt, bits):
    """Every slice of a stage buffer: B of (n-tile, sub-block) is x row 8nt + g's codes 8t..8t+7,
    and the lane's scales are (xd, xd', xs, xs') of x rows 8nt + 2t, 8nt + 2t + 1; slices past the
    row are left alone."""
    rng = np.random.default_rng(31 + nt)
    k = 256 * ((1 << bits) + 1)                                  # the second step's last slices are past K
    x = X8(rng, 8 * nt - 1, k)
    for first in (0, 1 << bits):
        buf = staged(lib, x, nt, first, bits)
        for s in range(1 << bits):
            size = lib.stage_bytes(int(QType.Q4_K), nt)
            stage = np.ascontiguousarray(buf[s * size:(s + 1) * size])
            if first + s >= k // 256:
                assert not stage.any()
                continue
            _, b, xs = fragments(lib, np.zeros((32, 18), np.uint32), stage, nt)
            sb = first + s
            for lane in range(32):
                t = lane % 4
                for n in range(nt):
                    row, r0, r1 = x.lane_rows(lane, n)
                    for j in range(8):
                        at = sb * 256 + 32 * j + 8 * t
                        np.testing.assert_array_equal(s8(b[lane, n, j]), x.codes[row, at:at + 8])
                        i = sb * 8 + j
                        np.testing.assert_array_equal(xs[lane, n, j], [x.xd[r0, i], x.xd[r1, i], x.xs[r0, i],
                                                                       x.xs[r1, i]])


def store_slice_sums(lib, acc, block, R, S, nt, y):
    """The kernel's fixed-order slice sum and store, emulated: the S slices' accumulators of each
    of the block's R tiles added in slice order into y (M, N), each output stored once; rows past
    y's edges are not stored."""
    m, n_rows = y.shape
    for warp in range(8):
        tile, slice_ = divmod(warp, S)
        row0 = (block * R + tile) * 16
        for v in range(slice_, 4 * nt, S):
            n, q = divmod(v, 4)
            for lane in range(32):
                g, t = divmod(lane, 4)
                total = np.float32(0)
                for s in range(S):
                    total = np.float32(total + acc[tile * S + s, lane, n, q])
                xr, wr = lib.out_x_row(n, q, t), row0 + lib.out_w_row(q, g)
                if xr < m and wr < n_rows:
                    assert np.isnan(y[xr, wr]), (xr, wr)            # stored once
                    y[xr, wr] = total


def kernel_on_cpu(lib, w: Q4KRows, x: X8, nt, bits):
    """mma_kq_kernel<nt> with 1 << bits slices, block by block as the kernel runs: per step the
    stage buffer, per warp (tile, slice) the 32 lanes' routine with C from the emulated mma, then
    each tile's slices added in slice order in float32 and stored. Returns y (m, n), NaN where
    nothing was stored."""
    S, R = 1 << bits, 8 >> bits
    nsb, tiles = w.k // 256, -(-w.n // 16)
    steps = -(-nsb // S)
    y = np.full((x.m, w.n), np.nan, np.float32)
    for block in range(-(-tiles // R)):
        acc = np.zeros((8, 32, nt, 4), np.float32)              # per warp, per lane
        for i in range(steps):
            buf = staged(lib, x, nt, i * S, bits)
            for warp in range(8):
                tile, slice_ = divmod(warp, S)
                row0, sb = (block * R + tile) * 16, i * S + slice_
                if row0 >= w.n or sb >= nsb:
                    continue
                size = lib.stage_bytes(int(QType.Q4_K), nt)
                stage = np.ascontiguousarray(buf[slice_ * size:(slice_ + 1) * size])
                lanes = lanes_of(lib, w.tile(row0), w.row_bytes, sb)
                a, b, _ = fragments(lib, lanes, stage, nt)
                c = mma(a, b, nt)
                for lane in range(32):
                    cl = c_of_lane(c, lane)
                    seen = np.zeros((8, nt, 6), np.uint32)
                    assert lib.super_block(nt, ptr(lanes), lane, ptr(stage), ptr(cl), ptr(acc[warp, lane]),
                                           ptr(seen)) == 0
                    # the routine multiplied exactly the fragments the emulated C was made of
                    np.testing.assert_array_equal(seen[:, :, :4], np.broadcast_to(a[lane][:, None], (8, nt, 4)))
                    np.testing.assert_array_equal(seen[:, :, 4:], b[lane].transpose(1, 0, 2))
        store_slice_sums(lib, acc, block, R, S, nt, y)
    return y


@pytest.mark.parametrize("m,n,k,bits", [(5, 40, 768, 0), (13, 24, 512, 1), (16, 16, 1024, 2), (20, 33, 768, 2),
                                        (32, 20, 512, 1), (1, 16, 2048, 3)])
def test_kernel_arithmetic_gives_x_times_w(lib, m, n, k, bits):
    """The whole kernel on the CPU (but for the loop and the sum, mirrored here) against
    x_hat . dequant(W)^T in float64, x_hat the int8 codes times their scales: rows of W and x past
    the tiles' ends, slices past K, and every n-tile count."""
    rng = np.random.default_rng(m * 1000 + n)
    w, x = Q4KRows(rng, n, k), X8(rng, m, k)
    y = kernel_on_cpu(lib, w, x, -(-m // 8), bits)
    assert not np.isnan(y).any()
    want = x.values @ w.values.T
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max() * np.sqrt(k / 256))


# ---------------------------------------------------------------- Q6_K

class Q6KRows:
    """W: n rows of Q6_K blocks (k values each) in one buffer (rows start 2-byte aligned when K / 256
    is odd), with gguf's values in float64."""

    def __init__(self, rng, n, k, data=None):
        self.n, self.k = n, k
        self.data = np.ascontiguousarray(random_blocks(QType.Q6_K, n, k, rng, std=1.0) if data is None else data)
        assert self.data.ctypes.data % 16 == 0
        self.row_bytes = self.data.shape[1]
        self.values = gguf_dequantize(self.data, QType.Q6_K).astype(np.float64).reshape(n, k)

    def block(self, rows, sb):
        return self.data[rows, sb * 210:(sb + 1) * 210].astype(np.int64)

    def codes(self, rows, sb, G):
        """(len(rows), 16) 6-bit codes of group G (values 16G..16G+15) of super-block sb, read as
        ggml lays them out: half h, quarter qq, half-group e."""
        b = self.block(rows, sb)
        h, qq, e = G // 8, (G // 2) % 4, G % 2
        lo = (b[:, 64 * h + 32 * (qq & 1) + 16 * e:][:, :16] >> (4 * (qq >> 1))) & 0xF
        hi = (b[:, 128 + 32 * h + 16 * e:][:, :16] >> (2 * qq)) & 3
        return lo | (hi << 4)

    def scales(self, rows, sb):
        return self.block(rows, sb)[:, 192:208].astype(np.uint8).view(np.int8).astype(np.int64)


def q6k_lanes(lib, w: Q6KRows, row0, sb):
    """The 32 lanes' registers for super-block sb of the tile at row0 (28 words each) and 8 * o of
    their rows (32, 2)."""
    lanes = np.zeros((32, 28), np.uint32)
    sh = np.zeros((32, 2), np.int32)
    lib.q6k_load_lanes(ptr(w.data), w.n, w.row_bytes, row0, sb, ptr(lanes), ptr(sh))
    return lanes, sh


def q6k_fragments(lib, lanes, sh, stage, nt):
    a = np.zeros((32, 16, 2), np.uint32)
    lib.q6k_a_frags(ptr(lanes), ptr(sh), ptr(a))
    b = np.zeros((32, nt, 16), np.uint32)
    xd = np.zeros((32, nt, 8, 2), np.float32)
    assert lib.q6k_b_frags(nt, ptr(stage), ptr(b), ptr(xd)) == 0
    return a, b, xd


def mma16(a, b, nt):
    """C (nt, 16, 16, 8) of every n-tile and group from the lanes' registers, placed as PTX defines
    m16n8k16 .row.col s8 (lane = 4g + t): A a0 = (g, 4t..4t+3), a1 = (g+8, 4t..); B b0 = (4t.., column g)."""
    g, t = np.arange(32) // 4, np.arange(32) % 4
    av = s8(a).reshape(32, 16, 2, 4)                        # lane, group, row half, k
    bv = s8(b).reshape(32, nt, 16, 4)
    am = np.zeros((16, 16, 16), np.int64)                   # group, row, k
    bm = np.zeros((nt, 16, 16, 8), np.int64)                # n-tile, group, k, column
    for lane in range(32):
        am[:, g[lane], 4 * t[lane]:4 * t[lane] + 4] = av[lane, :, 0]
        am[:, g[lane] + 8, 4 * t[lane]:4 * t[lane] + 4] = av[lane, :, 1]
        bm[:, :, 4 * t[lane]:4 * t[lane] + 4, g[lane]] = bv[lane]
    return np.einsum("grk,ngkc->ngrc", am, bm)


def q6k_call_order(nt):
    """(n-tile, group) of the routine's m16n8k16 calls in order: halves, sub-blocks 0, 2, 1, 3 of each,
    n-tiles, the two groups."""
    return [(n, 2 * (4 * h + qq) + e) for h in range(2) for qq in (0, 2, 1, 3) for n in range(nt) for e in range(2)]


def q6k_c_of_lane(c, lane, nt):
    g, t = divmod(lane, 4)
    return np.ascontiguousarray([[c[n, G, g, 2 * t], c[n, G, g, 2 * t + 1], c[n, G, g + 8, 2 * t],
                                  c[n, G, g + 8, 2 * t + 1]] for n, G in q6k_call_order(nt)], np.int32)


def q6k_tile_rows(w, row0):
    return np.minimum(np.arange(row0, row0 + 16), w.n - 1)


@pytest.mark.parametrize("n,k", [(16, 512), (21, 768), (9, 1280)])
def test_q6k_words_are_the_pieces(lib, n, k):
    """Every lane's word of every piece, from rows at both alignments (K / 256 odd: rows alternate;
    every second super-block is 2 bytes past alignment) and from the clamped rows past N: bytes
    16u + 4t .. + 3 of the block; piece 12 is the scales with sign bits flipped; d from the tail."""
    rng = np.random.default_rng(n * 7 + k)
    w = Q6KRows(rng, n, k)
    seen = set()
    for row0 in range(0, n, 16):
        rows = q6k_tile_rows(w, row0)
        for sb in range(k // 256):
            lanes, sh = q6k_lanes(lib, w, row0, sb)
            words = np.zeros((32, 2, 13), np.uint32)
            lib.q6k_words(ptr(lanes), ptr(sh), ptr(words))
            for lane in range(32):
                g, t = divmod(lane, 4)
                for r in range(2):
                    row = rows[g + 8 * r]
                    block = np.ascontiguousarray(w.data[row, sb * 210:(sb + 1) * 210])
                    want = block[:208].reshape(13, 4, 4)[:, t].copy().view(np.uint32).reshape(13)
                    want[12] ^= 0x80808080
                    np.testing.assert_array_equal(words[lane, r], want, err_msg=f"row {row} sb {sb} lane {lane}")
                    assert sh[lane, r] == 8 * ((w.data.ctypes.data + row * w.row_bytes + sb * 210) % 4)
                    seen.add(int(sh[lane, r]))
                    dq = lib.q6k_dq(lanes[lane:].ctypes.data, r)
                    assert dq == np.float32(block[208:210].view(np.float16)[0]) / 4
    assert seen == ({0, 16} if k // 256 > 1 or (k // 256) % 2 else {0})


@pytest.mark.parametrize("nt", [1, 2, 4])
def test_q6k_fragments_multiply_to_the_group_dot_products(lib, nt):
    """Weight rows as A (16 rows of a tile, rows past N clamped), x rows from the staged buffer as B
    (8 per n-tile): C's (row, column) of group G is 4 x the dot product of (q - 32) of the weight
    row and the x row's codes over the group's 16 values."""
    rng = np.random.default_rng(41 + nt)
    w, x = Q6KRows(rng, 27, 768), X8(rng, 8 * nt - 3, 768)    # x rows past m repeat the last
    for row0, sb in ((0, 0), (0, 1), (16, 2), (16, 1)):
        lanes, sh = q6k_lanes(lib, w, row0, sb)
        a, b, _ = q6k_fragments(lib, lanes, sh, staged(lib, x, nt, sb, 0, QType.Q6_K), nt)
        c = mma16(a, b, nt)
        rows = q6k_tile_rows(w, row0)
        for n in range(nt):
            xrows = np.minimum(np.arange(8 * n, 8 * n + 8), x.m - 1)
            for G in range(16):
                xq = x.codes[xrows, sb * 256 + 16 * G:sb * 256 + 16 * G + 16].astype(np.int64)
                np.testing.assert_array_equal(c[n, G], 4 * (w.codes(rows, sb, G) - 32) @ xq.T,
                                              err_msg=f"rows {row0}.., super-block {sb}, n-tile {n}, group {G}")


def test_q6k_codes_read_as_gguf_lays_them_out(lib):
    """The test's own reading of the layout (codes, scales, d) gives gguf's values."""
    rng = np.random.default_rng(5)
    w = Q6KRows(rng, 4, 512)
    for sb in range(2):
        d = w.data[:, sb * 210 + 208:sb * 210 + 210].copy().view(np.float16).astype(np.float32)[:, 0]
        sc = w.scales(range(4), sb)
        for G in range(16):
            q = w.codes(range(4), sb, G)
            got = (d[:, None] * sc[:, G:G + 1].astype(np.float32)) * (q - 32).astype(np.float32)
            np.testing.assert_array_equal(got, w.values[:, sb * 256 + 16 * G:][:, :16].astype(np.float32))


def q6k_extreme_blocks(rng, n, k):
    """Random Q6_K blocks with the extremes put in: scales -128 and 127, codes 0 and 63, tiny,
    subnormal and large d."""
    data = random_blocks(QType.Q6_K, n, k, rng, std=1.0)
    for sb in range(k // 256):
        blk = data[:, sb * 210:(sb + 1) * 210]
        blk[0, 192:208] = np.array([-128, 127, -1, 0, 1, -127, 64, -64] * 2, np.int8).view(np.uint8)
        blk[1, :192] = 0                                    # every code 0: q - 32 = -32
        blk[2, :192] = 0xFF                                 # every code 63
        d = np.array([6e-8, 1e-5, 65504.0, 0.5][sb % 4], np.float16)
        blk[3, 208:210] = d.reshape(1).view(np.uint8)
    return data


def test_q6k_scales_map_codes_to_gguf_values(lib):
    """(d * scale / 4) from the gathered scale word and d, times A's byte 4 * (q - 32), is gguf's value
    bit for bit (A's factor 4 is exact), also at the extremes (scales -128 and 127, codes 0 and 63,
    subnormal and largest d)."""
    rng = np.random.default_rng(17)
    w = Q6KRows(rng, 16, 1024, data=q6k_extreme_blocks(rng, 16, 1024))
    for sb in range(4):
        lanes, sh = q6k_lanes(lib, w, 0, sb)
        words = np.zeros((32, 2, 13), np.uint32)
        lib.q6k_words(ptr(lanes), ptr(sh), ptr(words))
        a = np.zeros((32, 16, 2), np.uint32)
        lib.q6k_a_frags(ptr(lanes), ptr(sh), ptr(a))
        for lane in range(32):
            g, t = divmod(lane, 4)
            for r in range(2):
                row = g + 8 * r
                dq = np.float32(lib.q6k_dq(lanes[lane:].ctypes.data, r))
                for G in range(16):
                    sw = int(words[4 * g + G // 4, r, 12])          # scale word G / 4 of the row, from its lane
                    ds = np.float32(lib.q6k_ds(sw, G % 4, float(dq)))
                    got = ds * s8(a[lane, G, r]).astype(np.float32)
                    want = w.values[row, sb * 256 + 16 * G + 4 * t:][:4].astype(np.float32)
                    np.testing.assert_array_equal(got, want, err_msg=f"row {row} sb {sb} group {G} lane {lane}")


@pytest.mark.parametrize("nt,bits", [(1, 0), (2, 1), (3, 2), (4, 3)])
def test_q6k_staging_places_codes_and_scales(lib, nt, bits):
    """Every slice of a Q6_K stage buffer, byte for byte: x row r's codes at r * 272, in order (the
    16 bytes after them untouched), then xd of (sub-block j, n-tile, t) as a pair of x rows 8nt + 2t,
    8nt + 2t + 1 (no xs); B of (n-tile, group G) read back is x row 8nt + g's codes 16G + 4t .. + 3
    and the lane's xd pair that of its rows; slices past the row are left alone."""
    rng = np.random.default_rng(61 + nt)
    k = 256 * ((1 << bits) + 1)
    x = X8(rng, 8 * nt - 1, k)
    size = lib.stage_bytes(int(QType.Q6_K), nt)
    assert size == 2432 * nt
    for first in (0, 1 << bits):
        buf = staged(lib, x, nt, first, bits, QType.Q6_K)
        for s in range(1 << bits):
            stage = np.ascontiguousarray(buf[s * size:(s + 1) * size])
            sb = first + s
            want = np.zeros(size, np.uint8)
            if sb < k // 256:
                rows = np.minimum(np.arange(8 * nt), x.m - 1)
                want[:2176 * nt].reshape(8 * nt, 272)[:, :256] = x.codes[rows, sb * 256:(sb + 1) * 256].view(np.uint8)
                xd = want[2176 * nt:].view(np.float32).reshape(8, nt, 4, 2)
                xd[:] = x.xd[rows, sb * 8:(sb + 1) * 8].T.reshape(8, nt, 4, 2)
            np.testing.assert_array_equal(stage, want, err_msg=f"slice {s} of super-blocks {first}..")
            if sb >= k // 256:
                continue
            _, b, xd = q6k_fragments(lib, np.zeros((32, 28), np.uint32), np.zeros((32, 2), np.int32), stage, nt)
            for lane in range(32):
                t = lane % 4
                for n in range(nt):
                    row, r0, r1 = x.lane_rows(lane, n)
                    for G in range(16):
                        at = sb * 256 + 16 * G + 4 * t
                        np.testing.assert_array_equal(s8(b[lane, n, G]), x.codes[row, at:at + 4])
                    for j in range(8):
                        np.testing.assert_array_equal(xd[lane, n, j], [x.xd[r0, sb * 8 + j], x.xd[r1, sb * 8 + j]])


def q6k_kernel_on_cpu(lib, w: Q6KRows, x: X8, nt, bits):
    """mma_kq_kernel<Q6_K, nt> with 1 << bits slices, block by block as the kernel runs (see
    kernel_on_cpu). Returns y (m, n), NaN where nothing was stored."""
    S, R = 1 << bits, 8 >> bits
    nsb, tiles = w.k // 256, -(-w.n // 16)
    steps = -(-nsb // S)
    size = lib.stage_bytes(int(QType.Q6_K), nt)
    y = np.full((x.m, w.n), np.nan, np.float32)
    order = q6k_call_order(nt)
    for block in range(-(-tiles // R)):
        acc = np.zeros((8, 32, nt, 4), np.float32)
        for i in range(steps):
            buf = staged(lib, x, nt, i * S, bits, QType.Q6_K)
            for warp in range(8):
                tile, slice_ = divmod(warp, S)
                row0, sb = (block * R + tile) * 16, i * S + slice_
                if row0 >= w.n or sb >= nsb:
                    continue
                stage = np.ascontiguousarray(buf[slice_ * size:(slice_ + 1) * size])
                lanes, sh = q6k_lanes(lib, w, row0, sb)
                a, b, _ = q6k_fragments(lib, lanes, sh, stage, nt)
                c = mma16(a, b, nt)
                for lane in range(32):
                    cl = q6k_c_of_lane(c, lane, nt)
                    seen = np.zeros((16 * nt, 3), np.uint32)
                    mids = np.zeros(4, np.int32)
                    assert lib.q6k_super_block(nt, ptr(lanes), ptr(sh), lane, ptr(stage), ptr(cl),
                                               ptr(acc[warp, lane]), ptr(seen), ptr(mids)) == 0
                    # the routine multiplied exactly the fragments the emulated C was made of, in
                    # the order the test laid C out, and asked for the next super-block's loads
                    np.testing.assert_array_equal(seen[:, :2], [a[lane, G] for _, G in order])
                    np.testing.assert_array_equal(seen[:, 2], [b[lane, n, G] for n, G in order])
                    np.testing.assert_array_equal(mids, [1, 2, -1, 0])
        store_slice_sums(lib, acc, block, R, S, nt, y)
    return y


@pytest.mark.parametrize("m,n,k,bits", [(5, 40, 768, 0), (13, 24, 512, 1), (16, 16, 1024, 2), (20, 33, 768, 2),
                                        (32, 20, 512, 1), (1, 17, 2048, 3), (27, 9, 1280, 3)])
def test_q6k_kernel_arithmetic_gives_x_times_w(lib, m, n, k, bits):
    """The whole Q6_K kernel on the CPU (but for the loop and the sum, mirrored here) against
    x_hat . dequant(W)^T in float64: rows of W at both alignments and past the tiles' ends, rows of
    x past M, slices past K, every n-tile count and every slice count."""
    rng = np.random.default_rng(m * 1000 + n + 7)
    w, x = Q6KRows(rng, n, k), X8(rng, m, k)
    y = q6k_kernel_on_cpu(lib, w, x, -(-m // 8), bits)
    assert not np.isnan(y).any()
    want = x.values @ w.values.T
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max() * np.sqrt(k / 256))
