"""mma_st.cu's stages and lane code (mma_st_lanes.cuh) on the CPU, for Q4_K and Q6_K weights.

A NumPy image of a stage (64 weight rows' super-block windows at 160- or 240-byte strides, each
Q6_K block at its address's offset in its 16-byte-aligned window, then x's part as
mma_st_stage_x_kernel writes it: int8 codes per 256 values, swizzled, the sub-blocks' sums as
(hi, lo), the scale) is read by the header's __host__ __device__ functions through a host harness
(g++, or nvcc), lane by lane: the scales, the A fragments of each sub-block pair (Q4_K) or group
(Q6_K), x's B fragments, the mins' fragments. The warp's multiplies are emulated from PTX's definition of the s8/u8
fragments (A and B placed where the lanes hold them, C = A @ B handed back in C's places), and the
lanes' integer sums and per-super-block float step (add_scaled, finish) run as the kernel runs them.
The result must be the exact product of the codes, and close to x · dequant(W)ᵀ. GPU runs of the
kernel itself are in test_quant_matmul.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from gpu_rounding import q8_blocks
from host_harness import aligned16, build_host_library

from glimmer_cupy.weights.quant_tensor import QType
from glimmer_cupy.weights.random_blocks import random_blocks

HARNESS = r"""
#include "mma_st_lanes.cuh"
using namespace mst;

static_assert(XStage<1>::kBytes == 2208 && XStage<2>::kBytes == 4416, "x's part of a stage");

// The CPU test's stage images: a super-block's 64 rows at 160 (Q4_K) or 240 (Q6_K) bytes, then x's image
constexpr int kImgStride4 = 160, kImgStride6 = 240;
template <int NT> static const u8* xpart(const u8* stage) { return stage + kRows * kImgStride4; }
static void rows_of(const u8* stage, int warp, int lane, const u8* (&w)[2]) {
    w[0] = stage + (16 * warp + (lane >> 2)) * kImgStride4;
    w[1] = stage + (16 * warp + (lane >> 2) + 8) * kImgStride4;
}
extern "C" int consts(int* out) {
    out[0] = kRows; out[1] = XStage<2>::kMins; out[2] = XStage<2>::kScales; out[3] = XStage<2>::kBytes;
    for (int per = 1; per <= 16; ++per) { out[3 + per] = row_stride<St4K>(per); out[19 + per] = row_stride<St6K>(per); }
    return 36;
}
// Q6_K: blk points at each lane's two rows' blocks in the stage (offsets given by the caller)
extern "C" void q6_lane_scales(const u8* b0, const u8* b1, int* sc, float* d4) {
    const u8* const blk[2] = {b0, b1};
    const Q6Scales s = q6_scales<kEither>(blk);
    for (int r = 0; r < 2; ++r) {
        for (int G = 0; G < 16; ++G) sc[16 * r + G] = q6_sc(s, r, G);
        d4[r] = s.d4[r];
    }
}
extern "C" u32 q6_lane_a(const u8* b, int G, int t) { return q6_a<kEither>(b, G, t); }
// the same for a super-block of a pair image (St6P): b where its GGUF block would start
template <int J> static void q6p_scales_j(const u8* b0, const u8* b1, int* sc, float* d4) {
    const u8* const blk[2] = {b0, b1};
    const Q6Scales s = Q6Pairs<J>::scales(Q6Pairs<J>::where(blk, 0));
    for (int r = 0; r < 2; ++r) {
        for (int G = 0; G < 16; ++G) sc[16 * r + G] = Q6Pairs<J>::sc(s, r, G);
        d4[r] = s.d4[r];
    }
}
// j: the super-block's place in its pair (both rows'), as the kernels know it
extern "C" void q6p_lane_scales(const u8* b0, const u8* b1, int j, int* sc, float* d4) {
    if (j) q6p_scales_j<1>(b0, b1, sc, d4); else q6p_scales_j<0>(b0, b1, sc, d4);
}
extern "C" u32 q6p_lane_a(const u8* b, int j, int G, int t) {
    const u8* const blk[2] = {b, b};
    return j ? Q6Pairs<1>::a(Q6Pairs<1>::where(blk, t), 0, G, t) : Q6Pairs<0>::a(Q6Pairs<0>::where(blk, t), 0, G, t);
}
extern "C" u32 q6_lane_b(const u8* stage, int nt, int G, int lane) {
    return q6_b<2>(stage + kRows * kImgStride6, nt, G, lane >> 2, lane & 3);
}
extern "C" void q6_lane_finish(const u8* b0, const u8* b1, const u8* stage, int nt, int lane, float* y, const int* sum) {
    const u8* const blk[2] = {b0, b1};
    const Q6Scales s = q6_scales<kEither>(blk);
    float yy[4];
    int s4[4];
    for (int q = 0; q < 4; ++q) { yy[q] = y[q]; s4[q] = sum[q]; }
    q6_finish(yy, s4, s, x_scales<2>(stage + kRows * kImgStride6, nt, lane & 3));
    for (int q = 0; q < 4; ++q) y[q] = yy[q];
}
extern "C" void lane_scales(const u8* stage, int warp, int lane, int* sc, u32* mins, float* d) {
    const u8* w[2];
    rows_of(stage, warp, lane, w);
    const Scales s = scales(w, lane & 3);
    for (int r = 0; r < 2; ++r) {
        for (int j = 0; j < 8; ++j) sc[8 * r + j] = s.sc[r][j];
        mins[r] = s.mhi[r]; mins[2 + r] = s.mlo[r];
        d[r] = s.d16[r]; d[2 + r] = s.dmin[r];
    }
}
extern "C" void lane_pair(const u8* stage, int warp, int lane, int c, u32* lo, u32* hi) {
    const u8* w[2];
    rows_of(stage, warp, lane, w);
    const Pair p = a_pair(w, c, lane & 3);
    for (int i = 0; i < 4; ++i) { lo[i] = p.lo[i]; hi[i] = p.hi[i]; }
}
extern "C" void lane_b(const u8* stage, int nt, int j, int lane, u32* b) {
    const u32x2 f = b_frag<2>(xpart<2>(stage), nt, j, lane >> 2, lane & 3);
    b[0] = f.x; b[1] = f.y;
}
extern "C" u32 lane_bmins(const u8* stage, int nt, int lane) { return b_mins<2>(xpart<2>(stage), nt, lane >> 2, lane & 3); }
extern "C" void lane_add(int* acc, const int* c, int sc0, int sc1) {
    int a[4], cc[4];
    for (int q = 0; q < 4; ++q) { a[q] = acc[q]; cc[q] = c[q]; }
    const int sc[2] = {sc0, sc1};
    add_scaled(a, cc, sc);
    for (int q = 0; q < 4; ++q) acc[q] = a[q];
}
extern "C" void lane_finish(const u8* stage, int warp, int lane, int nt, float* y, const int* main, const int* hi,
                            const int* lo) {
    const u8* w[2];
    rows_of(stage, warp, lane, w);
    const Scales s = scales(w, lane & 3);
    float yy[4];
    int m4[4], h4[4], l4[4];
    for (int q = 0; q < 4; ++q) { yy[q] = y[q]; m4[q] = main[q]; h4[q] = hi[q]; l4[q] = lo[q]; }
    finish(yy, m4, h4, l4, s, x_scales<2>(xpart<2>(stage), nt, lane & 3));
    for (int q = 0; q < 4; ++q) y[q] = yy[q];
}
"""

NT = 2


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = build_host_library(HARNESS, tmp_path_factory.mktemp("mma_st"), "mma_st_lanes")
    u8p, i32p, u32p, f32p = (ctypes.POINTER(t) for t in (ctypes.c_uint8, ctypes.c_int, ctypes.c_uint32,
                                                         ctypes.c_float))
    lib.consts.argtypes = [i32p]
    lib.lane_scales.argtypes = [u8p, ctypes.c_int, ctypes.c_int, i32p, u32p, f32p]
    lib.lane_pair.argtypes = [u8p, ctypes.c_int, ctypes.c_int, ctypes.c_int, u32p, u32p]
    lib.lane_b.argtypes = [u8p, ctypes.c_int, ctypes.c_int, ctypes.c_int, u32p]
    lib.lane_bmins.argtypes = [u8p, ctypes.c_int, ctypes.c_int]
    lib.lane_bmins.restype = ctypes.c_uint32
    lib.lane_add.argtypes = [i32p, i32p, ctypes.c_int, ctypes.c_int]
    lib.lane_finish.argtypes = [u8p, ctypes.c_int, ctypes.c_int, ctypes.c_int, f32p, i32p, i32p, i32p]
    lib.q6_lane_scales.argtypes = [u8p, u8p, i32p, f32p]
    lib.q6_lane_a.argtypes = [u8p, ctypes.c_int, ctypes.c_int]
    lib.q6_lane_a.restype = ctypes.c_uint32
    lib.q6p_lane_scales.argtypes = [u8p, u8p, ctypes.c_int, i32p, f32p]
    lib.q6p_lane_a.argtypes = [u8p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.q6p_lane_a.restype = ctypes.c_uint32
    lib.q6_lane_b.argtypes = [u8p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.q6_lane_b.restype = ctypes.c_uint32
    lib.q6_lane_finish.argtypes = [u8p, u8p, u8p, ctypes.c_int, ctypes.c_int, f32p, i32p]
    return lib


def ptr(a: np.ndarray, t):
    return a.ctypes.data_as(ctypes.POINTER(t))


ROWS, ROW_STRIDE, BLOCK = 64, 160, 144
Q6_STRIDE, Q6_COPY, Q6_BLOCK = 240, 224, 210     # the images' Q6_K rows: a block's 16-byte window
X_BYTES = 2208                         # a super-block of one n-tile of x


def stage_x_image(x: np.ndarray, nt: int) -> np.ndarray:
    """x (M, K) float32 as mma_st_stage_x_kernel writes it: (K / 256, 2208 nt) bytes."""
    m, k = x.shape
    rows, nsb = 8 * nt, k // 256
    v = np.zeros((rows, k), np.float32)
    v[:m] = x
    v = v.reshape(rows, nsb, 256).transpose(1, 0, 2)                   # (sb, row, 256)
    codes, d, _ = q8_blocks(v, 256)
    codes = codes.astype(np.int64)
    sums = codes.reshape(nsb, rows, 8, 32).sum(-1)                     # (sb, row, sub-block)
    hi, lo = sums >> 6, sums & 63
    out = np.zeros((nsb, X_BYTES * nt), np.uint8)
    for r in range(rows):
        for j in range(8):
            at = 256 * r + 32 * (j ^ (r & 7))
            out[:, at:at + 32] = codes[:, r, 32 * j:32 * j + 32].astype(np.int8).view(np.uint8)
    mins = np.stack([hi, lo], -1).reshape(nsb, rows, 16).astype(np.int8).view(np.uint8)
    out[:, 256 * rows:256 * rows + 16 * rows] = mins.reshape(nsb, 16 * rows)
    xs = np.ascontiguousarray(d[..., 0], np.float32)
    out[:, 272 * rows:276 * rows] = xs.view(np.uint8).reshape(nsb, 4 * rows)
    return out


def image_values(img: np.ndarray, rows: int) -> np.ndarray:
    """The x values an image's codes stand for, codes times scales in float64: (rows, K)."""
    nsb, nt = img.shape[0], img.shape[1] // X_BYTES
    out = np.zeros((rows, 256 * nsb))
    for sb in range(nsb):
        xs = img[sb, 256 * 8 * nt + 16 * 8 * nt:][:4 * 8 * nt].view(np.float32).astype(np.float64)
        for r in range(rows):
            c = np.concatenate([img[sb, 256 * r + 32 * (j ^ (r & 7)):][:32].view(np.int8) for j in range(8)])
            out[r, 256 * sb:256 * (sb + 1)] = c * xs[r]
    return out


def block_result(y: np.ndarray) -> np.ndarray:
    """(64 weight rows, 8 NT rows of x) from the four warps' lanes' sums in C's places."""
    got = np.zeros((ROWS, 8 * NT))
    for warp in range(4):
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for nt in range(NT):
                for q in range(4):
                    got[16 * warp + g + 8 * (q >> 1), 8 * nt + 2 * t + (q & 1)] = y[warp, lane, nt, q]
    return got


def check_block(got: np.ndarray, wf: np.ndarray, xst: np.ndarray, x: np.ndarray) -> None:
    """The block's result is the exact product of W's values (rows past N repeat the last) and x's
    codes, close to x · Wᵀ, and zero for rows of x past M."""
    n, m = wf.shape[0], x.shape[0]
    exact = wf[np.minimum(np.arange(ROWS), n - 1)] @ image_values(xst, 8 * NT).T
    assert np.abs(got - exact).max() <= 2e-5 * np.abs(exact).max()
    ref = wf @ x.astype(np.float64).T
    e = ((got[:n, :m] - ref) ** 2).mean() / (ref ** 2).mean()
    assert e < 5e-4, e
    assert not got[:, m:].any()


def stage_image(w_bytes: np.ndarray, row0: int, sb: int, xst: np.ndarray, nt: int) -> np.ndarray:
    """One super-block's stage of the block whose rows start at row0 (rows past N repeat the last)."""
    n = w_bytes.shape[0]
    st = np.zeros(ROWS * ROW_STRIDE + X_BYTES * nt, np.uint8)
    for r in range(ROWS):
        src = w_bytes[min(row0 + r, n - 1), BLOCK * sb:BLOCK * (sb + 1)]
        st[ROW_STRIDE * r:ROW_STRIDE * r + BLOCK] = src
    st[ROWS * ROW_STRIDE:] = xst[sb]
    return st


def bytes_of(word: int, signed: bool) -> np.ndarray:
    b = np.array([(word >> (8 * i)) & 0xFF for i in range(4)], np.int64)
    return np.where(b > 127, b - 256, b) if signed else b


def mma_k32(a_lanes, b_lanes):
    """C (per lane, 4 ints) of m16n8k32 from the lanes' A (4 words, u8) and B (2 words, s8)."""
    A = np.zeros((16, 32), np.int64)
    B = np.zeros((32, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a, b = a_lanes[lane], b_lanes[lane]
        A[g, 4 * t:4 * t + 4] = bytes_of(a[0], False)
        A[g + 8, 4 * t:4 * t + 4] = bytes_of(a[1], False)
        A[g, 16 + 4 * t:20 + 4 * t] = bytes_of(a[2], False)
        A[g + 8, 16 + 4 * t:20 + 4 * t] = bytes_of(a[3], False)
        B[4 * t:4 * t + 4, g] = bytes_of(b[0], True)
        B[16 + 4 * t:20 + 4 * t, g] = bytes_of(b[1], True)
    return c_places(A @ B)


def mma_k16(a_lanes, b_lanes):
    """C of m16n8k16 s8 x s8 from the lanes' A (2 words) and B (1 word)."""
    A = np.zeros((16, 16), np.int64)
    B = np.zeros((16, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g, 4 * t:4 * t + 4] = bytes_of(a_lanes[lane][0], True)
        A[g + 8, 4 * t:4 * t + 4] = bytes_of(a_lanes[lane][1], True)
        B[4 * t:4 * t + 4, g] = bytes_of(b_lanes[lane], True)
    return c_places(A @ B)


def c_places(C):
    out = np.zeros((32, 4), np.int32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] = [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]
    return out


def warp_super_block(lib, st: np.ndarray, warp: int, y: np.ndarray) -> None:
    """One warp's super-block as mma_st_kernel runs it; y (32 lanes, NT, 4) float32 in and out."""
    stp = ptr(st, ctypes.c_uint8)
    sc = np.zeros((32, 16), np.int32)
    mins = np.zeros((32, 4), np.uint32)
    d = np.zeros((32, 4), np.float32)
    for lane in range(32):
        lib.lane_scales(stp, warp, lane, ptr(sc[lane], ctypes.c_int), ptr(mins[lane], ctypes.c_uint32),
                        ptr(d[lane], ctypes.c_float))
    main = np.zeros((NT, 32, 4), np.int32)
    for c in range(4):
        lo = np.zeros((32, 4), np.uint32)
        hi = np.zeros((32, 4), np.uint32)
        for lane in range(32):
            lib.lane_pair(stp, warp, lane, c, ptr(lo[lane], ctypes.c_uint32), ptr(hi[lane], ctypes.c_uint32))
        for nt in range(NT):
            bs = []
            for j in (2 * c, 2 * c + 1):
                b = np.zeros((32, 2), np.uint32)
                for lane in range(32):
                    lib.lane_b(stp, nt, j, lane, ptr(b[lane], ctypes.c_uint32))
                bs.append(b)
            ce, co = mma_k32(lo, bs[0]), mma_k32(hi, bs[1])
            for lane in range(32):
                acc = main[nt, lane].copy()
                lib.lane_add(ptr(acc, ctypes.c_int), ptr(np.ascontiguousarray(ce[lane]), ctypes.c_int),
                             int(sc[lane, 2 * c]), int(sc[lane, 8 + 2 * c]))
                lib.lane_add(ptr(acc, ctypes.c_int), ptr(np.ascontiguousarray(co[lane]), ctypes.c_int),
                             int(sc[lane, 2 * c + 1]), int(sc[lane, 8 + 2 * c + 1]))
                main[nt, lane] = acc
    for nt in range(NT):
        bm = [lib.lane_bmins(stp, nt, lane) for lane in range(32)]
        hi = mma_k16([(mins[lane, 0], mins[lane, 1]) for lane in range(32)], bm)
        lo = mma_k16([(mins[lane, 2], mins[lane, 3]) for lane in range(32)], bm)
        for lane in range(32):
            yy = np.ascontiguousarray(y[lane, nt])
            lib.lane_finish(stp, warp, lane, nt, ptr(yy, ctypes.c_float),
                            ptr(np.ascontiguousarray(main[nt, lane]), ctypes.c_int),
                            ptr(np.ascontiguousarray(hi[lane]), ctypes.c_int),
                            ptr(np.ascontiguousarray(lo[lane]), ctypes.c_int))
            y[lane, nt] = yy


def test_layout_constants_match_the_harness(lib):
    """The header's x layout and row strides, and ops/matmul.py's copies of them (the launch's grid
    and shared memory); each stride holds its window and puts rows 0..7 on distinct banks."""
    from glimmer_cupy.ops import matmul as mm
    out = np.zeros(36, np.int32)
    lib.consts(ptr(out, ctypes.c_int))
    assert list(out[:4]) == [ROWS, 256 * 8 * NT, 272 * 8 * NT, X_BYTES * NT]
    assert (mm.MMA_ST_BLOCK_ROWS, mm.MMA_ST_X_BYTES) == (ROWS, X_BYTES)
    for per in range(1, 17):
        r4, r6 = int(out[3 + per]), int(out[19 + per])
        assert (r4, r6) == (mm.mma_st_row_stride(per, QType.Q4_K), mm.mma_st_row_stride(per, QType.Q6_K))
        assert r4 >= 144 * per and r4 % 128 == 32 and r4 < 144 * per + 128
        assert r6 >= 14 + 210 * per and r6 % 32 == 16 and r6 % 16 == 0
        assert len({(g * r4 // 4) % 32 // 8 for g in range(4)}) == 4                # 8-byte loads, half-warps
        assert len({(g * r6 // 4) % 32 // 4 for g in range(8)}) == 8                 # 4-byte loads
    assert mm.mma_st_smem(NT, 1024, 1, QType.Q6_K) == ROWS * mm.mma_st_row_stride(4, QType.Q6_K) + 4 * X_BYTES * NT


def test_stage_x_image_codes_sums_and_scales():
    """The x image: codes within one unit of x / xs, sub-block sums split exactly, rows past M zero."""
    rng = np.random.default_rng(5)
    x = (rng.normal(0, 1, (11, 512)) * rng.uniform(0.1, 10, (11, 1))).astype(np.float32)
    x[3, 256:] = 0                                       # an all-zero super-block of a row
    img = stage_x_image(x, NT)
    for sb in range(2):
        xs = img[sb, 272 * 16:276 * 16].view(np.float32)
        for r in range(16):
            codes = np.concatenate([img[sb, 256 * r + 32 * (j ^ (r & 7)):][:32].view(np.int8) for j in range(8)])
            mins = img[sb, 256 * 16 + 16 * r:][:16].view(np.int8).astype(np.int64)
            if r >= 11 or (r == 3 and sb == 1):
                assert xs[r] == 0 and not codes.any() and not mins.any()
                continue
            v = x[r, 256 * sb:256 * (sb + 1)]
            assert np.abs(codes).max() == 127
            assert np.abs(codes * np.float64(xs[r]) - v).max() <= 0.5001 * xs[r]
            sums = codes.astype(np.int64).reshape(8, 32).sum(-1)
            assert np.array_equal(64 * mins[0::2] + mins[1::2], sums)
            assert (mins[1::2] >= 0).all() and (mins[1::2] < 64).all()


@pytest.mark.parametrize("m", [16, 9, 3])
def test_a_warp_gives_the_product_of_its_codes(lib, m):
    """Four warps' super-blocks of a 64-row block (rows past N repeating the last), two super-blocks
    accumulated: each lane's sums are the exact integer product of W's codes and x's, scaled as the
    kernel scales it, and within the int8 rounding of x · dequant(W)ᵀ."""
    rng = np.random.default_rng(m)
    n, k = 57, 512
    w = random_blocks(QType.Q4_K, n, k, rng, 0.05)
    wf = gguf_dequantize(w, QType.Q4_K).reshape(n, k).astype(np.float64)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    xst = stage_x_image(x, NT)
    y = np.zeros((4, 32, NT, 4), np.float32)
    for sb in range(2):
        st = stage_image(w, 0, sb, xst, NT)
        for warp in range(4):
            warp_super_block(lib, st, warp, y[warp])
    check_block(block_result(y), wf, xst, x)


def q6_stage(w_bytes: np.ndarray, row_bytes: int, sb: int, xst: np.ndarray, nt: int, base: int):
    """A Q6_K stage: each row's 224-byte window (its block's address, base + row * row_bytes + 210 sb,
    rounded down to 16) at 240-byte strides; and each row's block offset in it."""
    n = w_bytes.shape[0]
    flat = np.concatenate([w_bytes.reshape(-1), np.zeros(32, np.uint8)])   # the window may run past the end
    st = np.zeros(ROWS * Q6_STRIDE + X_BYTES * nt, np.uint8)
    offs = []
    for r in range(ROWS):
        at = min(r, n - 1) * row_bytes + Q6_BLOCK * sb
        o = (base + at) % 16
        st[Q6_STRIDE * r:Q6_STRIDE * r + Q6_COPY] = flat[at - o:at - o + Q6_COPY] if at >= o else \
            np.concatenate([np.zeros(o - at, np.uint8), flat[:Q6_COPY - (o - at)]])
        offs.append(o)
    st[ROWS * Q6_STRIDE:] = xst[sb]
    return st, offs


@pytest.mark.parametrize("m,k,base", [(16, 512, 0), (9, 768, 2), (3, 256, 6)])
def test_q6k_warp_gives_the_product_of_its_codes(lib, m, k, base):
    """Q6_K: four warps' super-blocks of a 64-row block, blocks at every 2-byte alignment of their
    windows (K of 3 super-blocks: rows of 630 bytes, so rows and super-blocks start at offsets 0, 2,
    ... 14; `base` the tensor's own offset from a 16-byte boundary), super-blocks accumulated: the
    exact product of W's values and x's codes, and close to x · dequant(W)ᵀ."""
    rng = np.random.default_rng(m + k)
    n = 50
    w = random_blocks(QType.Q6_K, n, k, rng, 0.05)
    wf = gguf_dequantize(w, QType.Q6_K).reshape(n, k).astype(np.float64)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    xst = stage_x_image(x, NT)
    row_bytes = w.shape[1]
    y = np.zeros((4, 32, NT, 4), np.float32)
    for sb in range(k // 256):
        st, offs = q6_stage(w, row_bytes, sb, xst, NT, base)
        stp = ptr(st, ctypes.c_uint8)
        for warp in range(4):
            blk = {}
            for lane in range(32):
                g = lane >> 2
                r0, r1 = 16 * warp + g, 16 * warp + g + 8
                blk[lane] = (ctypes.cast(ctypes.addressof(stp.contents) + Q6_STRIDE * r0 + offs[r0],
                                         ctypes.POINTER(ctypes.c_uint8)),
                             ctypes.cast(ctypes.addressof(stp.contents) + Q6_STRIDE * r1 + offs[r1],
                                         ctypes.POINTER(ctypes.c_uint8)))
            sc = np.zeros((32, 32), np.int32)
            d4 = np.zeros((32, 2), np.float32)
            for lane in range(32):
                lib.q6_lane_scales(*blk[lane], ptr(sc[lane], ctypes.c_int), ptr(d4[lane], ctypes.c_float))
            sums = np.zeros((NT, 32, 4), np.int32)
            for G in range(16):
                a = [(lib.q6_lane_a(blk[lane][0], G, lane & 3), lib.q6_lane_a(blk[lane][1], G, lane & 3))
                     for lane in range(32)]
                for nt in range(NT):
                    c = mma_k16(a, [lib.q6_lane_b(stp, nt, G, lane) for lane in range(32)])
                    for lane in range(32):
                        acc = sums[nt, lane].copy()
                        lib.lane_add(ptr(acc, ctypes.c_int), ptr(np.ascontiguousarray(c[lane]), ctypes.c_int),
                                     int(sc[lane, G]), int(sc[lane, 16 + G]))
                        sums[nt, lane] = acc
            for nt in range(NT):
                for lane in range(32):
                    yy = np.ascontiguousarray(y[warp, lane, nt])
                    lib.q6_lane_finish(*blk[lane], stp, nt, lane, ptr(yy, ctypes.c_float),
                                       ptr(np.ascontiguousarray(sums[nt, lane]), ctypes.c_int))
                    y[warp, lane, nt] = yy
    check_block(block_result(y), wf, xst, x)


def test_q6_pairs_lanes_read_what_the_gguf_lanes_read(lib):
    """St6P's reads (Q6Pairs: A of every group and lane, the sixteen scales, d / 4) of each super-block
    of a 16-byte aligned tensor in pair order (every pair phase, both super-blocks of a pair) equal
    St6K's reads of the same super-block in GGUF order."""
    from glimmer_cupy.weights.q6k_pairs import to_pairs
    rng = np.random.default_rng(9)
    n, k = 3, 1024                                      # 4 super-blocks a row, 840-byte rows: every phase
    data = np.ascontiguousarray(random_blocks(QType.Q6_K, n, k, rng, std=1.0).reshape(-1))
    pairs = aligned16(to_pairs(data, n, k).reshape(-1))
    u8p = ctypes.POINTER(ctypes.c_uint8)
    for sb in range(data.nbytes // Q6_BLOCK):
        g = np.ascontiguousarray(data[Q6_BLOCK * sb:][:Q6_BLOCK + 8])      # GGUF block (kEither reads past it)
        gp = ptr(g, ctypes.c_uint8)
        pp = ctypes.cast(pairs.ctypes.data + Q6_BLOCK * sb, u8p)
        for G in range(16):
            for t in range(4):
                assert lib.q6p_lane_a(pp, sb & 1, G, t) == lib.q6_lane_a(gp, G, t), f"block {sb} G {G} t {t}"
        sc, scp, d4, d4p = np.zeros(32, np.int32), np.zeros(32, np.int32), np.zeros(2, np.float32), np.zeros(2, np.float32)
        lib.q6_lane_scales(gp, gp, ptr(sc, ctypes.c_int), ptr(d4, ctypes.c_float))
        lib.q6p_lane_scales(pp, pp, sb & 1, ptr(scp, ctypes.c_int), ptr(d4p, ctypes.c_float))
        np.testing.assert_array_equal(scp, sc)
        np.testing.assert_array_equal(d4p, d4)
