// mma_kq_frag.cuh — Q4_K weight rows and int8 x as fragments of mma.sync.m16n8k32.s8.s8.s32.
//
// The PTX fragments of m16n8k32 (s8): lane = 4 * g + t (g = groupID, t = threadID_in_group);
//   A (16 x 32, row-major): a0 = row g, k 4t..4t+3; a1 = row g+8, same k; a2 = row g, k 16+4t..;
//                           a3 = row g+8, k 16+4t..  (4 int8 per register, lowest k in the low byte)
//   B (32 x 8, column n):   b0 = column g, k 4t..4t+3; b1 = column g, k 16+4t..
//   C (16 x 8, int32):      c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, same columns.
// mma_kq.cu puts 16 weight rows in A and 8 rows of x in B (one n-tile), k = one 32-value
// sub-block. The sum over k does not depend on the order of k, so A and B use one permutation of
// the sub-block: fragment k 4t+i and 16+4t+i hold the sub-block's values 8t+i and 8t+4+i. A lane
// then owns values 8t..8t+7 of its weight rows g and g+8: for Q4_K 8 contiguous bytes of qs per
// row, whose low nibbles are sub-block 2c and high nibbles 2c+1. C's rows are the lane's own
// weight rows, so the weight scales it needs come from its own rows' headers (each of the four
// lanes of a row loads one header word; a super-block's headers are gathered by four shuffles
// per row); C's columns are x rows 2t and 2t+1, whose scales the lane reads from shared memory.
//
// x in shared memory (MmaX<NT>, one super-block of NT n-tiles = 8 * NT rows of x):
//   codes: row r's 256 bytes, 32-byte sub-block j at slot j ^ (r & 7). A B load (8 rows, 8 bytes
//          each from 4 lanes per row) then covers all 32 banks twice, the least two wavefronts.
//   scales: per (sub-block j, n-tile, t) one float4 (xd of x rows 2t and 2t+1, then xs of both),
//          so a lane's four scales of a sub-block are one 16-byte load.
// Per sub-block and n-tile the lane adds xd * (d * sc) * C - (dmin * m) * xs for its four C
// values; sc * C is an exact integer, converted without a conversion instruction.
// Everything here is __host__ __device__ (host stand-ins in kq_lanes.cuh); the warp-wide steps
// (shuffle, mma) and the copies come in as arguments, so the CPU tests run the staging, the
// fragments and the per-super-block routine, with C from an emulation of the mma's definition
// (tests/test_mma_kq_frag.py).
#pragma once
#include "kq_lanes.cuh"

namespace gguf {

// Weights stream through once: not kept in L1, which holds x for the block's other warps and for
// the next block on the SM; each load asks L2 for its whole 256-byte neighbourhood, which the
// next slices or super-blocks of the same rows read next.
GQ_HD u32 load_stream4(const u8* p) {
#ifdef __CUDA_ARCH__
    u32 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return load_vec<u32>(p);
#endif
}
GQ_HD u32x2 load_stream8(const u8* p) {
#ifdef __CUDA_ARCH__
    u32x2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    return load8(p);
#endif
}

GQ_HD float fma_rn(float a, float b, float c) {     // a * b + c, rounded once
#ifdef __CUDA_ARCH__
    return fmaf(a, b, c);
#else
    return __builtin_fmaf(a, b, c);
#endif
}

// 2^23 + byte i of w as a float (one PRMT on the device): fmaf(that, d, -2^23 d) is d * byte, rounded once
GQ_HD float biased_byte(u32 w, int i) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (u32)i));
#else
    return bits_to_float(0x4B000000u | ((w >> (8 * i)) & 0xFFu));
#endif
}
// c as a float, exact for |c| < 2^22 (an add and a float add, not a conversion instruction):
// 0x4B400000 is 1.5 * 2^23, whose last 22 mantissa bits absorb c
GQ_HD float small_int_to_float(int c) { return bits_to_float(0x4B400000u + (u32)c) - 12582912.f; }

// A lane's share of one Q4_K super-block of its weight rows g (r = 0) and g + 8 (r = 1): word t
// of each row's 16-byte header (d and dmin, then 12 scale bytes), and qs bytes 32c + 8t .. +7
// for c = 0..3. The four lanes of a row hold its header between them (mma_q4k_headers).
struct MmaQ4K {
    u32 hw[2];
    u32x2 qs[2][4];
};
GQ_HD void mma_q4k_load(const u8* row0, const u8* row1, int sb, int t, MmaQ4K& w) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u8* b = (r ? row1 : row0) + (long long)sb * 144;
        w.hw[r] = load_stream4(b + 4 * t);
#pragma unroll
        for (int c = 0; c < 4; ++c) w.qs[r][c] = load_stream8(b + 16 + 32 * c + 8 * t);
    }
}
// The whole headers of rows g and g + 8 from lanes 4g .. 4g + 3: warp.shfl_header(w, r, lane) is
// w.hw[r] of that lane (a shuffle on the device, a look-up in the CPU tests)
#pragma nv_exec_check_disable
template <class Warp>
GQ_HD void mma_q4k_headers(const MmaQ4K& w, int g, Warp& warp, u32x4 (&hd)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
        hd[r] = {warp.shfl_header(w, r, 4 * g), warp.shfl_header(w, r, 4 * g + 1), warp.shfl_header(w, r, 4 * g + 2),
                 warp.shfl_header(w, r, 4 * g + 3)};
}
// A of sub-block j: low (j even) or high (j odd) nibbles of the words of pair c = j / 2
GQ_HD void mma_q4k_a(const MmaQ4K& w, int j, u32 (&a)[4]) {
    const int c = j >> 1, s = 4 * (j & 1);
    a[0] = (w.qs[0][c].x >> s) & 0x0F0F0F0Fu;
    a[1] = (w.qs[1][c].x >> s) & 0x0F0F0F0Fu;
    a[2] = (w.qs[0][c].y >> s) & 0x0F0F0F0Fu;
    a[3] = (w.qs[1][c].y >> s) & 0x0F0F0F0Fu;
}
// d of a header, the factor of the whole super-block
GQ_HD float mma_q4k_d(const u32x4& hd) { return half_to_float((u16)(hd.x & 0xFFFF)); }
// Sub-block j of both rows: the 6-bit scales as integers and dmin * m as floats
struct MmaQ4KSub { int sc[2]; float dm[2]; };
GQ_HD MmaQ4KSub mma_q4k_sub(const u32x4 (&hd)[2], int j) {
    MmaQ4KSub s;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const Q4KScales q = q4k_scale_words(hd[r], j);
        const float dmin = half_to_float((u16)(hd[r].x >> 16));
        s.sc[r] = (int)((q.sc >> (8 * (j & 3))) & 0xFFu);
        s.dm[r] = fma_rn(biased_byte(q.mn, j & 3), dmin, -8388608.f * dmin);
    }
    return s;
}
// C of sub-block j and one n-tile into the lane's sums, in C's places (row g: x rows 2t, 2t+1; row
// g + 8: the same). x = (xd, xd', xs, xs') of x rows 2t, 2t + 1 (MmaX::scales). sc * C is exact
// in float (|C| <= 32 * 15 * 127, so |sc * C| < 2^22), so the super-block's d multiplies once:
//   part += xd * (sc * C)        (this super-block, in units of d; first: j == 0 starts it)
//   acc  -= (dmin * m) * xs      (the block minimum, which needs no C)
GQ_HD void mma_q4k_accumulate(float (&part)[4], float (&acc)[4], const int (&c)[4], const MmaQ4KSub& s,
                              const f32x4& x, bool first) {
    const float xd[2] = {x.x, x.y}, xs[2] = {x.z, x.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int r = q >> 1, col = q & 1;
        const float v = small_int_to_float(s.sc[r] * c[q]);
        part[q] = first ? xd[col] * v : fma_rn(xd[col], v, part[q]);
        acc[q] = fma_rn(-s.dm[r], xs[col], acc[q]);
    }
}
// The same without the partial sums (two registers fewer per n-tile, one multiply more per value):
// acc += (xd * ds) * C - (dmin * m) * xs, ds = d * sc of the row (mma_q4k_ds)
GQ_HD void mma_q4k_accumulate_direct(float (&acc)[4], const int (&c)[4], const MmaQ4KSub& s, const float (&ds)[2],
                                     const f32x4& x) {
    const float xd[2] = {x.x, x.y}, xs[2] = {x.z, x.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int r = q >> 1, col = q & 1;
        acc[q] = fma_rn(-s.dm[r], xs[col], fma_rn(ds[r] * xd[col], small_int_to_float(c[q]), acc[q]));
    }
}
// d * sc of sub-block j for both rows (s from mma_q4k_sub), rounded once
GQ_HD void mma_q4k_ds(const u32x4 (&hd)[2], const MmaQ4KSub& s, float (&ds)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) ds[r] = mma_q4k_d(hd[r]) * (float)s.sc[r];
}
// the super-block done: acc += d * part
GQ_HD void mma_q4k_finish(float (&acc)[4], const float (&part)[4], float d0, float d1) {
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] = fma_rn(q < 2 ? d0 : d1, part[q], acc[q]);
}

// One super-block of NT n-tiles of x (8 * NT rows) as mma_kq.cu stages it in shared memory.
template <int NT>
struct MmaX {
    static constexpr int kRows = 8 * NT;
    static constexpr int kCodeBytes = kRows * 256;
    static constexpr int kBytes = kCodeBytes + 8 * NT * 4 * 16;      // codes, then scales: 2560 * NT

    // where 16-byte piece u (bytes 16u..16u+15 of the super-block) of x row r's codes goes
    GQ_HD static int code_offset(int r, int u) { return r * 256 + 16 * (u ^ (2 * (r & 7))); }
    // where xd (which = 0) or xs (which = 1) of x row r, sub-block j goes, in floats after the codes
    GQ_HD static int scale_index(int r, int j, int which) {
        return ((j * NT + (r >> 3)) * 4 + ((r & 7) >> 1)) * 4 + 2 * which + (r & 1);
    }
    // B of n-tile nt, sub-block j: x row 8nt + g, values 8t..8t+7 (b0 = .x, b1 = .y)
    GQ_HD static u32x2 b(const u8* stage, int nt, int j, int g, int t) {
        return load8(stage + (8 * nt + g) * 256 + 32 * (j ^ g) + 8 * t);
    }
    // (xd, xd', xs, xs') of x rows 8nt + 2t and 8nt + 2t + 1, sub-block j
    GQ_HD static f32x4 scales(const u8* stage, int nt, int j, int t) {
        return load_vec<f32x4>(stage + kCodeBytes + 16 * ((j * NT + nt) * 4 + t));
    }
};

// Copy super-blocks first_sb .. first_sb + S - 1 of x (S = 1 << bits; all 8 * NT rows: rows past m
// repeat row m - 1; super-blocks past the row are skipped) into one stage buffer, slice s at
// s * kBytes, as thread tid of kStageThreads. copy.c16(dst, src) and copy.c4(dst, src) copy 16 and
// 4 bytes (cp.async on the device). S divides 16, so a thread's slice and place within a row stay
// fixed and only its rows advance; consecutive threads copy consecutive 16 bytes (codes) or 4
// bytes (scales) of a row. Offsets within x are 32-bit (M * K < 2^31).
constexpr int kStageThreads = 256;
#pragma nv_exec_check_disable
template <int NT, class Copy>
GQ_HD void mma_stage_x(u8* buf, const int* xq, const float* xd, const float* xs, int m, int k, int first_sb,
                       int bits, int tid, Copy& copy) {
    typedef MmaX<NT> X;
    const int nsb = k >> 8, nsub = k >> 5;
    {   // codes: thread = (row, slice, 16-byte piece u); rows advance by 16 / S
        const int u = tid & 15, s = (tid >> 4) & ((1 << bits) - 1), sb = first_sb + s;
        if (sb < nsb) {
            const u8* src = reinterpret_cast<const u8*>(xq) + sb * 256 + 16 * u;
            u8* dst = buf + s * X::kBytes;
            for (int r = tid >> (4 + bits); r < X::kRows; r += (kStageThreads / 16) >> bits)
                copy.c16(dst + X::code_offset(r, u), src + (r < m ? r : m - 1) * k);
        }
    }
    {   // scales: thread = (row, slice, sub-block j), xd and xs; rows advance by 32 / S
        const int j = tid & 7, s = (tid >> 3) & ((1 << bits) - 1), sb = first_sb + s;
        if (sb < nsb) {
            float* dst = reinterpret_cast<float*>(buf + s * X::kBytes + X::kCodeBytes);
            const float* sd = xd + sb * 8 + j;
            const float* ss = xs + sb * 8 + j;
            for (int r = tid >> (3 + bits); r < X::kRows; r += (kStageThreads / 8) >> bits) {
                const int off = (r < m ? r : m - 1) * nsub;
                copy.c4(dst + X::scale_index(r, j, 0), sd + off);
                copy.c4(dst + X::scale_index(r, j, 1), ss + off);
            }
        }
    }
}

// One super-block of this lane's weights w (hd: its rows' headers, mma_q4k_headers) against the
// staged x (one slice: MmaX<NT>::kBytes at stage) into acc: the kernel's inner loop.
// warp.mma(c, a, b) is the warp's m16n8k32 product (in the CPU tests, C from an emulation of its
// definition). Up to two n-tiles keep partial sums in units of d; more would not fit in 128
// registers beside two super-blocks of weights, so three and four multiply by d * sc per sub-block.
#pragma nv_exec_check_disable
template <int NT, class Warp>
GQ_HD void mma_q4k_super_block(const MmaQ4K& w, const u32x4 (&hd)[2], const u8* stage, int g, int t,
                               float (&acc)[NT][4], Warp& warp) {
    typedef MmaX<NT> X;
    constexpr bool kPart = NT <= 2;
    float part[NT][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        u32 a[4];
        mma_q4k_a(w, j, a);
        const MmaQ4KSub s = mma_q4k_sub(hd, j);
        float ds[2];
        if (!kPart) mma_q4k_ds(hd, s, ds);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            int c[4];
            warp.mma(c, a, X::b(stage, nt, j, g, t));
            if (kPart) mma_q4k_accumulate(part[nt], acc[nt], c, s, X::scales(stage, nt, j, t), j == 0);
            else mma_q4k_accumulate_direct(acc[nt], c, s, ds, X::scales(stage, nt, j, t));
        }
    }
    if (kPart) {
        const float d0 = mma_q4k_d(hd[0]), d1 = mma_q4k_d(hd[1]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_q4k_finish(acc[nt], part[nt], d0, d1);
    }
}

// Where the lane's sum acc[nt][q] belongs: x row (C's column) and weight row within the tile (C's row)
GQ_HD int mma_out_x_row(int nt, int q, int t) { return 8 * nt + 2 * t + (q & 1); }
GQ_HD int mma_out_w_row(int q, int g) { return g + 8 * (q >> 1); }

}  // namespace gguf
