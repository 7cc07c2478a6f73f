// mma_kq_frag.cuh — Q4_K and Q6_K weight rows and int8 x as fragments of int8 mma.sync.
//
// The PTX fragments (s8; lane = 4 * g + t, g = groupID, t = threadID_in_group; 4 int8 per
// register, lowest k in the low byte):
//   m16n8k32 (Q4_K)  A (16 x 32, row-major): a0 = row g, k 4t..4t+3; a1 = row g+8, same k;
//                    a2 = row g, k 16+4t..; a3 = row g+8, k 16+4t..
//                    B (32 x 8, column n): b0 = column g, k 4t..4t+3; b1 = column g, k 16+4t..
//   m16n8k16 (Q6_K)  A (16 x 16): a0 = row g, k 4t..4t+3; a1 = row g+8, same k
//                    B (16 x 8):  b0 = column g, k 4t..4t+3
//   C (16 x 8, int32, both): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, same columns.
// mma_kq.cu puts 16 weight rows in A and 8 rows of x in B (one n-tile). C's rows are the lane's own
// weight rows g and g + 8, so the weight scales it needs come from its own rows' headers (each of
// the four lanes of a row loads one word of them and takes the others by shuffles); C's columns
// are x rows 2t and 2t+1, whose scales the lane reads from shared memory.
// The sum over k does not depend on the order of k, so A and B may use one permutation of the
// values that share a weight scale:
// Q4_K, k = one 32-value sub-block: fragment k 4t+i and 16+4t+i hold the sub-block's values 8t+i
//   and 8t+4+i. A lane then owns values 8t..8t+7 of its weight rows: 8 contiguous bytes of qs per
//   row, whose low nibbles are sub-block 2c and high nibbles 2c+1. Per sub-block and n-tile the
//   lane adds xd * (d * sc) * C - (dmin * m) * xs for its four C values; sc * C is an exact
//   integer, converted without a conversion instruction.
// Q6_K, k = one 16-value group G (one int8 scale), unpermuted: k 4t+i is the group's value 4t+i.
//   Group G = 2j + e of sub-block j = 4h + qq (h: half of the block, qq: quarter of the half) has
//   its low nibbles in ql bytes 64h + 32(qq & 1) + 16e.. (nibble qq >> 1) and its high two bits in
//   qh bytes 128 + 32h + 16e.. (bits 2qq..2qq+1). So the block is 13 pieces of 16 bytes (8 of ql,
//   4 of qh, the 16 scales) and d, and lane t owns word t of each piece of its rows g and g + 8.
//   Blocks are 210 bytes, so a block starts at 4-byte alignment + o, o = 0 or 2: the lane loads
//   the aligned word 4t of each piece (from the piece's start - o) and shifts in the next aligned
//   word, which lane t + 1 loaded (for t = 3: lane 4g's word of the next piece), by a shuffle.
//   A is 4 * (q - 32) per byte: q's six bits at bits 2..7 with bit 7 flipped (two shifts and two
//   logic operations per word, no correction by x's sums); C is then 4x the group's dot product,
//   and the lane adds xd * ((d * sc0 / 4) * C0 + (d * sc1 / 4) * C1) per 32-value sub-block (two
//   groups, one xd of x) and n-tile. The scale words are fetched per sub-block from the lane
//   that holds them, so that a super-block's arithmetic fits in the registers beside the next one.
//
// x in shared memory (MmaX<QT, NT>, one super-block of NT n-tiles = 8 * NT rows of x, laid out for
// weights of type QT):
//   codes, Q4_K: row r's 256 bytes, 32-byte sub-block j at slot j ^ (r & 7). A B load (8 rows, 8
//          bytes each from 4 lanes per row) then covers all 32 banks twice, the least two wavefronts.
//   codes, Q6_K: row r's 256 bytes in order at r * 272 (padded by 16 bytes): a B load (8 rows x 4
//          lanes x 4 bytes) at the same place of 8 rows covers the 32 banks once.
//   scales: per (sub-block j, n-tile, t) one float4 (xd of x rows 2t and 2t+1, then xs of both)
//          for Q4_K, one float2 (the xd) for Q6_K, so a lane's scales of a sub-block are one load.
// Everything here is __host__ __device__ (host stand-ins in kq_lanes.cuh); the warp-wide steps
// (shuffles, mma) and the copies come in as arguments, so the CPU tests run the staging, the
// fragments and the per-super-block routines, with C from an emulation of the mma's definition
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
GQ_HD u32 load_stream2(const u8* p) {              // 2-byte aligned, zero-extended
#ifdef __CUDA_ARCH__
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
#else
    return *reinterpret_cast<const u16*>(p);
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

GQ_HD u32 word_of(const u32x4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// ---------------------------------------------------------------------------------------- Q4_K

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

// ---------------------------------------------------------------------------------------- Q6_K

// A lane's share of one Q6_K super-block of its weight rows g (r = 0) and g + 8 (r = 1), whose
// blocks start at b_r = 4-byte aligned + o_r: the aligned words at b_r - o_r + 16u + 4t for u =
// 0..12 (pieces 0..7 of ql, 8..11 of qh, 12 the scales), and the bytes b_r + 206 .. 209 (scales
// 14, 15 and d; the aligned word after the last piece when o_r = 2). W's base is 4-byte aligned
// (row 0's first block has o = 0, so no load precedes W).
struct MmaQ6K {
    u32 w[2][13];
    u32 tail[2];
};
// 8 * o of super-block sb of a row: the shift that puts a piece's bytes into the lane's word
GQ_HD int mma_q6k_shift(const u8* row, int sb) {
    return 8 * (int)((reinterpret_cast<unsigned long long>(row) + 210ull * (unsigned)sb) & 3);
}
// Loads of row r (part 0: pieces 0..6; part 1: pieces 7..12 and the tail) of super-block sb
GQ_HD void mma_q6k_load_row(const u8* row, int sb, int t, int r, int part, MmaQ6K& w) {
    const u8* b = row + (long long)sb * 210;
    const u8* a = b - (int)(reinterpret_cast<unsigned long long>(b) & 3) + 4 * t;
#pragma unroll
    for (int u = 0; u < 13; ++u)
        if ((u < 7) == (part == 0)) w.w[r][u] = load_stream4(a + 16 * u);
    if (part == 1) w.tail[r] = load_stream2(b + 206) | (load_stream2(b + 208) << 16);
}
GQ_HD void mma_q6k_load(const u8* row0, const u8* row1, int sb, int t, MmaQ6K& w) {
#pragma unroll
    for (int part = 0; part < 4; ++part) mma_q6k_load_row(part < 2 ? row0 : row1, sb, t, part >> 1, part & 1, w);
}
// The word of piece u of row r at the lane: its aligned word and the next one, which is lane
// t + 1's word of the same piece, or for t = 3 lane 4g's word of the next piece (the tail after
// the last), shifted by sh = 8 * o_r (mma_q6k_shift). On the device one shuffle: lane t sends
// mma_q6k_sent and reads lane mma_q6k_next_lane; warp.shfl_next(w, r, u, lane) is mma_q6k_sent
// of that lane.
GQ_HD u32 mma_q6k_sent(const MmaQ6K& w, int r, int u, int t) {
    return t != 0 ? w.w[r][u] : u < 12 ? w.w[r][u + 1] : w.tail[r];
}
GQ_HD int mma_q6k_next_lane(int lane) { return (lane & ~3) | ((lane + 1) & 3); }
#pragma nv_exec_check_disable
template <class Warp>
GQ_HD u32 mma_q6k_word(const MmaQ6K& w, int r, int u, int lane, int sh, Warp& warp) {
    return shift_right64(w.w[r][u], warp.shfl_next(w, r, u, lane), sh);
}
// The lane's word of the scale piece with each byte's sign bit flipped: scales 4t .. 4t + 3 of
// row r, each plus 128. Scale word i of the row is lane 4g + i's (warp.shfl_scales(w, own, r, sh,
// lane): own of that lane).
#pragma nv_exec_check_disable
template <class Warp>
GQ_HD u32 mma_q6k_own_scales(const MmaQ6K& w, int r, int lane, int sh, Warp& warp) {
    return mma_q6k_word(w, r, 12, lane, sh, warp) ^ 0x80808080u;
}
// d / 4 of row r
GQ_HD float mma_q6k_dq(const MmaQ6K& w, int r) { return 0.25f * half_to_float((u16)(w.tail[r] >> 16)); }
// A of one group for one row: ql, qh the lane's words of the group's ql and qh pieces, qq the
// quarter (which nibble, which two bits): 4 * (q - 32) per byte = (q << 2) ^ 0x80
GQ_HD u32 mma_q6k_a(u32 ql, u32 qh, int qq) {
    const u32 lo = (qq & 2) ? ql >> 2 : ql << 2;     // the nibble at bits 2..5
    const u32 hi = qh << (6 - 2 * qq);               // the two bits at 6..7
    return (lo & 0x3C3C3C3Cu) | ((hi & 0xC0C0C0C0u) ^ 0x80808080u);
}
// d * scale / 4 of the group whose scale is byte i of scale word sw (mma_q6k_own_scales), rounded
// once as gguf rounds d * scale: (2^23 + scale + 128) - (2^23 + 128) is the scale, exactly
GQ_HD float mma_q6k_ds(u32 sw, int i, float dq) { return (biased_byte(sw, i) - 8388736.f) * dq; }
// The two groups of sub-block j and one n-tile into the lane's sums, in C's places: c0, c1 are C
// of groups 2j and 2j + 1 (4x their dot products, |C| <= 16 * 128 * 127 < 2^22), ds[e][r] their
// d * scale / 4 per row, x the xd of x rows 2t, 2t + 1
GQ_HD void mma_q6k_accumulate(float (&acc)[4], const int (&c0)[4], const int (&c1)[4], const float (&ds)[2][2],
                              const f32x2& x) {
    const float xd[2] = {x.x, x.y};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int r = q >> 1, col = q & 1;
        const float s = fma_rn(ds[1][r], small_int_to_float(c1[q]), ds[0][r] * small_int_to_float(c0[q]));
        acc[q] = fma_rn(xd[col], s, acc[q]);
    }
}

// ---------------------------------------------------------------------------------------- x

// How x is staged for weights of type QT: bytes per row of codes, the swizzle of a row's 16-byte
// pieces (piece u of row r at slot u ^ ((r & 7) * kSwizzle)), and whether xs (x's sums, for
// Q4_K's minimums) is staged beside xd. Q6_K's rows are padded by one piece instead of swizzled,
// so a lane's B addresses differ by constants (no per-group address registers) and 8 rows still
// start in 8 different bank quads.
template <class QT> struct MmaXOf;
template <> struct MmaXOf<Q4_K> {
    static constexpr int kRowBytes = 256, kSwizzle = 2;
    static constexpr bool kSums = true;
};
template <> struct MmaXOf<Q6_K> {
    static constexpr int kRowBytes = 272, kSwizzle = 0;
    static constexpr bool kSums = false;
};

// One super-block of NT n-tiles of x (8 * NT rows) as mma_kq.cu stages it in shared memory.
template <class QT, int NT>
struct MmaX {
    static constexpr int kRows = 8 * NT;
    static constexpr int kRowBytes = MmaXOf<QT>::kRowBytes;
    static constexpr bool kSums = MmaXOf<QT>::kSums;
    static constexpr int kSlot = kSums ? 4 : 2;                     // floats per (sub-block, n-tile, t)
    static constexpr int kCodeBytes = kRows * kRowBytes;
    static constexpr int kBytes = kCodeBytes + 8 * NT * 4 * 4 * kSlot;  // codes, then scales: Q4_K 2560, Q6_K 2432 * NT

    // where 16-byte piece u (bytes 16u..16u+15 of the super-block) of x row r's codes goes
    GQ_HD static int code_offset(int r, int u) {
        return r * kRowBytes + 16 * (u ^ ((r & 7) * MmaXOf<QT>::kSwizzle));
    }
    // where xd (which = 0) or xs (which = 1) of x row r, sub-block j goes, in floats after the codes
    GQ_HD static int scale_index(int r, int j, int which) {
        return ((j * NT + (r >> 3)) * 4 + ((r & 7) >> 1)) * kSlot + 2 * which + (r & 1);
    }
    // Q4_K's B of n-tile nt, sub-block j: x row 8nt + g, values 8t..8t+7 (b0 = .x, b1 = .y)
    GQ_HD static u32x2 b(const u8* stage, int nt, int j, int g, int t) {
        return load8(stage + (8 * nt + g) * 256 + 32 * (j ^ g) + 8 * t);
    }
    // Q6_K's B of n-tile nt, group G: x row 8nt + g, values 16G + 4t .. +3
    GQ_HD static u32 b16(const u8* stage, int nt, int G, int g, int t) {
        return load_vec<u32>(stage + (8 * nt + g) * kRowBytes + 16 * G + 4 * t);
    }
    // Q4_K's (xd, xd', xs, xs') of x rows 8nt + 2t and 8nt + 2t + 1, sub-block j
    GQ_HD static f32x4 scales(const u8* stage, int nt, int j, int t) {
        return load_vec<f32x4>(stage + kCodeBytes + 16 * ((j * NT + nt) * 4 + t));
    }
    // Q6_K's (xd, xd') of the same
    GQ_HD static f32x2 xd(const u8* stage, int nt, int j, int t) {
        return load_vec<f32x2>(stage + kCodeBytes + 8 * ((j * NT + nt) * 4 + t));
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
template <class QT, int NT, class Copy>
GQ_HD void mma_stage_x(u8* buf, const int* xq, const float* xd, const float* xs, int m, int k, int first_sb,
                       int bits, int tid, Copy& copy) {
    typedef MmaX<QT, NT> X;
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
                if (X::kSums) copy.c4(dst + X::scale_index(r, j, 1), ss + off);     // Q4_K's mins need xs
            }
        }
    }
}

// ---------------------------------------------------------------------------------------- super-blocks

// One super-block of this lane's Q4_K weights w (hd: its rows' headers, mma_q4k_headers) against
// the staged x (one slice: MmaX::kBytes at stage) into acc: the kernel's inner loop.
// warp.mma(c, a, b) is the warp's m16n8k32 product (in the CPU tests, C from an emulation of its
// definition). Up to two n-tiles keep partial sums in units of d; more would not fit in 128
// registers beside two super-blocks of weights, so three and four multiply by d * sc per sub-block.
#pragma nv_exec_check_disable
template <int NT, class Warp>
GQ_HD void mma_q4k_super_block(const MmaQ4K& w, const u32x4 (&hd)[2], const u8* stage, int g, int t,
                               float (&acc)[NT][4], Warp& warp) {
    typedef MmaX<Q4_K, NT> X;
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

// The same for Q6_K, in two halves of the block (sub-blocks 0..3, 4..7): per half the lane's words
// of its 6 pieces are shifted into place, and per sub-block j the rows' scale words are fetched
// from the lane that holds them and two m16n8k16 products per n-tile (warp.mma16(c, a, b); groups
// 2j and 2j + 1) are scaled into acc. sh: 8 * o of both rows (mma_q6k_shift). The sub-blocks of
// a half run in the order 0, 2, 1, 3 (the first two share ql pieces 4h, 4h + 1, which are then
// done with); mid(1) runs before the second half and mid(2) after its second sub-block (the
// kernel loads parts of the next super-block there, into registers this one no longer needs).
#pragma nv_exec_check_disable
template <int NT, class Warp, class Mid>
GQ_HD void mma_q6k_super_block(const MmaQ6K& w, const int (&sh)[2], const u8* stage, int g, int t,
                               float (&acc)[NT][4], Warp& warp, Mid&& mid) {
    typedef MmaX<Q6_K, NT> X;
    const int lane = 4 * g + t;
    u32 own[2];
    float dq[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        own[r] = mma_q6k_own_scales(w, r, lane, sh[r], warp);
        dq[r] = mma_q6k_dq(w, r);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (h == 1) mid(1);
        u32 ql[2][4], qh[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) ql[r][i] = mma_q6k_word(w, r, 4 * h + i, lane, sh[r], warp);
#pragma unroll
            for (int e = 0; e < 2; ++e) qh[r][e] = mma_q6k_word(w, r, 8 + 2 * h + e, lane, sh[r], warp);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int qq = ((k & 1) << 1) | (k >> 1), j = 4 * h + qq;      // qq = 0, 2, 1, 3
            if (h == 1 && k == 2) mid(2);
            u32 a[2][2];
            float ds[2][2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const u32 sw = warp.shfl_scales(w, own[r], r, sh[r], 4 * g + (j >> 1));
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    a[e][r] = mma_q6k_a(ql[r][2 * (qq & 1) + e], qh[r][e], qq);
                    ds[e][r] = mma_q6k_ds(sw, 2 * (j & 1) + e, dq[r]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                int c0[4], c1[4];
                warp.mma16(c0, a[0], X::b16(stage, nt, 2 * j, g, t));
                warp.mma16(c1, a[1], X::b16(stage, nt, 2 * j + 1, g, t));
                mma_q6k_accumulate(acc[nt], c0, c1, ds, X::xd(stage, nt, j, t));
            }
        }
    }
}

// Where the lane's sum acc[nt][q] belongs: x row (C's column) and weight row within the tile (C's row)
GQ_HD int mma_out_x_row(int nt, int q, int t) { return 8 * nt + 2 * t + (q & 1); }
GQ_HD int mma_out_w_row(int q, int g) { return g + 8 * (q >> 1); }

// What mma_kq.cu needs of a weight type: the lane's registers for one super-block, their loads
// (load before the previous super-block's arithmetic; load_rest(..., part) where that arithmetic
// calls mid(part)), and the super-block's arithmetic against one staged slice of x.
template <class QT> struct MmaKQ;
template <> struct MmaKQ<Q4_K> {
    typedef MmaQ4K Regs;
    static constexpr int kBlockBytes = 144;
    GQ_HD static void load(const u8* row0, const u8* row1, int sb, int t, Regs& w) { mma_q4k_load(row0, row1, sb, t, w); }
    GQ_HD static void load_rest(const u8*, const u8*, int, int, int, Regs&) {}
#pragma nv_exec_check_disable
    template <int NT, class Warp, class Mid>
    GQ_HD static void super_block(const Regs& w, const u8*, const u8*, int, const u8* stage, int g, int t,
                                  float (&acc)[NT][4], Warp& warp, Mid&&) {
        u32x4 hd[2];
        mma_q4k_headers(w, g, warp, hd);
        mma_q4k_super_block<NT>(w, hd, stage, g, t, acc, warp);
    }
};
template <> struct MmaKQ<Q6_K> {                    // row g before, row g + 8 in two parts during
    typedef MmaQ6K Regs;
    static constexpr int kBlockBytes = 210;
    GQ_HD static void load(const u8* row0, const u8*, int sb, int t, Regs& w) {
        mma_q6k_load_row(row0, sb, t, 0, 0, w);
        mma_q6k_load_row(row0, sb, t, 0, 1, w);
    }
    GQ_HD static void load_rest(const u8*, const u8* row1, int sb, int t, int part, Regs& w) {
        mma_q6k_load_row(row1, sb, t, 1, part - 1, w);
    }
#pragma nv_exec_check_disable
    template <int NT, class Warp, class Mid>
    GQ_HD static void super_block(const Regs& w, const u8* row0, const u8* row1, int sb, const u8* stage, int g,
                                  int t, float (&acc)[NT][4], Warp& warp, Mid&& mid) {
        const int sh[2] = {mma_q6k_shift(row0, sb), mma_q6k_shift(row1, sb)};
        mma_q6k_super_block<NT>(w, sh, stage, g, t, acc, warp, mid);
    }
};

}  // namespace gguf
