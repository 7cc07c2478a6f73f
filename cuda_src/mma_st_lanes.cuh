// mma_st_lanes.cuh — the stages of mma_st.cu in shared memory and a lane's fragments of them.
//
// mma_st multiplies Q4_K or Q6_K weight rows by x quantized per 256 values (one float scale a
// super-block and row of x, int8 codes), on int8 tensor cores, 16 weight rows as A and 8 rows of x
// as B. One scale per super-block of x is what lets a super-block's sub-blocks add up in int32:
// lane (g, t) adds sc * C for each scale's share with one integer multiply-add per C value, and
// turns the sum into float once per super-block, where a scale per 32 values (mma_kq.cu) costs
// three float operations per C value and sub-block.
//   Q4_K (mma.sync m16n8k32, k = a 32-value sub-block): value = d sc q - dmin m. The mins are a
//     16-deep product of their own, sum_j m_j * xsum_j, as two m16n8k16 multiplies a super-block
//     (xsum_j, up to 32 * 127, does not fit a byte: it is split as 64 hi + lo, hi in [-64, 63], lo
//     in [0, 63]).
//   Q6_K (m16n8k16, k = a 16-value group with its int8 scale): value = d sc (q - 32); A is
//     4 (q - 32) as a signed byte ((q << 2) ^ 0x80), so no correction by x's sums, and d / 4 undoes
//     the factor. Blocks are 210 bytes, so every other one starts 2 bytes past 4-byte alignment:
//     its words are two aligned loads and a byte permute. In pair order (St6P, quant_blocks.cuh:
//     q6p_*) every word is one aligned load.
//
// Shared memory of a block whose K slice is `per` super-blocks (every part 16-byte aligned):
//   W:  kRows = 64 rows at row_stride<T>(per) bytes: one bulk copy a row of its slice, from the first
//       block's address rounded down to 16 (Q4_K blocks are 16-byte aligned; a Q6_K row's slice
//       sits at its offset o = address % 16, its super-block s at o + 210 s).
//       A bulk copy costs the SM's copy engine about the same whatever its size up to a few hundred
//       bytes, so one a row and slice (4 super-blocks: 576 or 840 bytes) rather than one a row and
//       super-block (144 bytes: ~20 cycles a copy held a 4096x4096 matmul to ~8 µs, H100).
//   x:  per XStage<NT> images, one a super-block (written by mma_st_stage_x_kernel, one copy each):
//       codes   8 NT rows x 256 bytes: row r's sub-block j (32 codes, in order) at slot j ^ (r & 7),
//               so that a Q4_K B load (8 rows, 8 bytes from each of 4 lanes) covers the banks once
//               per half-warp;
//       mins    8 NT rows x 16 bytes: byte 2j = hi_j, byte 2j + 1 = lo_j (xsum_j = 64 hi_j + lo_j);
//       scales  8 NT floats: the row's xs (max |x| / 127 over the super-block; 0 for an all-zero one).
//   Rows of x past M are zeros everywhere, so their sums are 0 (and are not stored).
// Q4_K: the order of k inside a sub-block is free as long as A and B agree (the sum does not depend
// on it): fragment k 4t + i and 16 + 4t + i hold the sub-block's values 8t + i and 8t + 4 + i, so a
// lane's A and B of a sub-block are each one 8-byte load (values 8t .. 8t + 7). Q6_K: fragment k
// 4t + i is the group's value 4t + i.
// Fragments (PTX, lane = 4g + t):
//   m16n8k32 u8 x s8  A: a0 = row g, k 4t..4t+3; a1 = row g+8; a2 = row g, k 16+4t..; a3 = row g+8
//                     B: b0 = column g, k 4t..4t+3; b1 = column g, k 16+4t..
//   m16n8k16 s8 x s8  A: a0 = row g, k 4t..4t+3; a1 = row g+8;  B: b0 = column g, k 4t..4t+3
//   C (int32): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, the same columns.
// Q4_K's sub-block 2c is the low nibbles of qs[32c .. 32c+31], 2c + 1 the high ones; A of the high
// ones is the byte with its low nibble cleared (16 q, an unsigned byte), so no shift: its C is 16x,
// and the low nibbles' scale is taken 16x to match (the super-block's sum is 16x; d / 16 undoes it).
// Everything here is __host__ __device__, so tests/test_mma_st_lanes.py runs it on the CPU.
#pragma once
#include "kq_lanes.cuh"

namespace mst {

using gguf::u32;
using gguf::u8;
using gguf::u32x2;
using gguf::u32x4;
using gguf::f32x2;

constexpr int kWarps = 4;                      // each 16 weight rows
constexpr int kRows = 16 * kWarps;             // weight rows of a block

// kMinBlocks: blocks an SM the tensor-map kernel is compiled for (its launch bound): St6P's pair reads
// took 142 registers unbound at up to 4 n-tiles, one 256-thread block an SM where St6K's 115-120
// allow two (at 8 n-tiles both kinds hold one)
struct St4K { static constexpr int kBlock = 144, kMinBlocks = 1; static constexpr bool kPairs = false; };   // Q4_K
struct St6K { static constexpr int kBlock = 210, kMinBlocks = 1; static constexpr bool kPairs = false; };   // Q6_K
// Q6_K in pair order (quant_blocks.cuh: q6p_*), read a pair at a time
struct St6P { static constexpr int kBlock = 210, kMinBlocks = 2; static constexpr bool kPairs = true; };

template <int NT>
struct XStage {                                // x's part of a stage: 8 NT rows of x
    static constexpr int kCodes = 0;
    static constexpr int kMins = 256 * 8 * NT;
    static constexpr int kScales = kMins + 16 * 8 * NT;
    static constexpr int kBytes = kScales + 4 * 8 * NT;     // 2208 NT
};
// Bytes of a weight row's window in shared memory for `per` super-blocks: the row's blocks from the
// first one's address rounded down to 16 (Q6_K: up to 14 bytes before it) to a 16-byte boundary,
// padded so that the lanes' loads at rows g = 0..7 fall on distinct banks: Q4_K's 8-byte loads want
// a stride of 32 bytes mod 128, Q6_K's 4-byte ones an odd multiple of 16 bytes.
template <class T>
GQ_HD int row_stride(int per) {
    const bool q4 = T::kBlock == 144;
    const int w = q4 ? per * 144 : (14 + per * 210 + 15) / 16 * 16;
    int rs = w;
    while (q4 ? rs % 128 != 32 : rs % 32 != 16) rs += 16;
    return rs;
}

// mma_st_tma_kernel's W: per chunk of kChunkSb super-blocks one tensor-map copy of a box of the
// block's rows (64 or 32) by box_bytes<T>() bytes (past a row's end or past N the box is zeros),
// landing as rows at that stride: 288 = 32 mod 128 for Q4_K's 8-byte loads, 464 an odd multiple of
// 16 for Q6_K's 4-byte ones (row_stride's rule). A box starts at a 16-byte boundary of the row (on
// the H100 a tensor copy whose start was not one stopped the kernel with an illegal instruction,
// bench/results/NOTES.md, forty-ninth session): at the chunk's first block for Q4_K (144 is 9 x 16);
// for Q6_K at the boundary at or before it, the block at offset o = its byte in the row % 16 (even,
// at most 14: 14 + 420 bytes fit 464), the second block at o + 210. o % 4 is 2 (sb0 % 2) for every
// chunk of a block (420 is a multiple of 4), so which of the two is 4-byte aligned is the block's.
constexpr int kChunkSb = 2;
template <class T>
GQ_HD constexpr int box_bytes() { return T::kBlock == 144 ? 288 : 464; }

GQ_HD u32 load4(const u8* p) { return gguf::load_vec<u32>(p); }

// bytes of x (lo) picked by selector nibbles, 4..7 giving zero (PRMT with a zero second word)
GQ_HD u32 pick_bytes(u32 x, u32 sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, 0u, sel);
#else
    u32 r = 0;
    for (int i = 0; i < 4; ++i) {
        const u32 s = (sel >> (4 * i)) & 7u;
        r |= (s < 4 ? (x >> (8 * s)) & 0xFFu : 0u) << (8 * i);
    }
    return r;
#endif
}

// A lane's view of one super-block of its weight rows g and g + 8 (wrow[r]: the row's block in
// the stage): the words of sub-block pair c
struct Pair { u32 lo[4], hi[4]; };             // A of sub-blocks 2c (low nibbles) and 2c + 1
GQ_HD Pair a_pair(const u8* const (&wrow)[2], int c, int t) {
    const u32x2 w0 = gguf::load8(wrow[0] + 16 + 32 * c + 8 * t), w1 = gguf::load8(wrow[1] + 16 + 32 * c + 8 * t);
    const u32 v[4] = {w0.x, w1.x, w0.y, w1.y};
    Pair p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p.lo[i] = v[i] & 0x0F0F0F0Fu;
        p.hi[i] = v[i] & 0xF0F0F0F0u;
    }
    return p;
}

// The two rows' scales of a super-block: sc (as the integer factors of C, 16x for the low-nibble
// sub-blocks), the mins' A fragments, d / 16 and dmin
struct Scales {
    int sc[2][8];
    u32 mhi[2], mlo[2];                        // A of the mins' two multiplies: rows g, g + 8
    float d16[2], dmin[2];
};
GQ_HD Scales scales(const u8* const (&wrow)[2], int t) {
    Scales s;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32x4 hd = gguf::load16(wrow[r]);
        const gguf::Q4KScales a = gguf::q4k_scale_words(hd, 0), b = gguf::q4k_scale_words(hd, 4);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int v = (int)(((j < 4 ? a.sc : b.sc) >> (8 * (j & 3))) & 0xFFu);
            s.sc[r][j] = (j & 1) ? v : 16 * v;
        }
        // lane t's slots 4t..4t+3 are (hi, lo) of sub-blocks 2t and 2t + 1
        const u32 mn = ((t < 2 ? a.mn : b.mn) >> (16 * (t & 1))) & 0xFFFFu;
        s.mhi[r] = pick_bytes(mn, 0x4140u);    // m_2t, 0, m_2t+1, 0
        s.mlo[r] = pick_bytes(mn, 0x1404u);    // 0, m_2t, 0, m_2t+1
        s.d16[r] = gguf::half_to_float((gguf::u16)(hd.x & 0xFFFFu)) * 0.0625f;
        s.dmin[r] = gguf::half_to_float((gguf::u16)(hd.x >> 16));
    }
    return s;
}

// x's B fragment of sub-block j for n-tile nt (b0, b1), its mins fragment and its two scales
template <int NT>
GQ_HD u32x2 b_frag(const u8* xs, int nt, int j, int g, int t) {
    const int r = 8 * nt + g;
    return gguf::load8(xs + XStage<NT>::kCodes + 256 * r + 32 * (j ^ (r & 7)) + 8 * t);
}
template <int NT>
GQ_HD u32 b_mins(const u8* xs, int nt, int g, int t) {
    return load4(xs + XStage<NT>::kMins + 16 * (8 * nt + g) + 4 * t);
}
template <int NT>
GQ_HD f32x2 x_scales(const u8* xs, int nt, int t) {
    return gguf::load_vec<f32x2>(xs + XStage<NT>::kScales + 4 * (8 * nt + 2 * t));
}

// acc (C's places) += sc * C for the lane's two rows
GQ_HD void add_scaled(int (&acc)[4], const int (&c)[4], const int (&sc)[2]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += sc[q >> 1] * c[q];
}

// The super-block done: y += xs * (d / 16 * main - dmin * (64 hi + lo)), main the 16x sum of sc * C
GQ_HD void finish(float (&y)[4], const int (&main)[4], const int (&hi)[4], const int (&lo)[4], const Scales& s,
                  f32x2 xs) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int r = q >> 1;
        const float mins = (float)(64 * hi[q] + lo[q]);
        const float v = gguf::fma_rn(s.d16[r], (float)main[q], -(s.dmin[r] * mins));
        y[q] = gguf::fma_rn((q & 1) ? xs.y : xs.x, v, y[q]);
    }
}

// ---------------------------------------------------------------------------------------- Q6_K

// 4 bytes at p, which is 2-byte aligned (a Q6_K block starts at an even offset of its window).
// Kind kAligned: p is 4-byte aligned; kOdd: p is 2 past it (two aligned loads and a byte permute);
// kEither: decided per load. A warp takes the first two where all its lanes' rows agree (rows of a
// multiple of 4 bytes, as every K of an even number of super-blocks gives), the third otherwise.
enum Align { kAligned, kOdd, kEither };
template <int A>
GQ_HD u32 load4_even(const u8* p) {
#ifdef __CUDA_ARCH__
    if (A == kAligned || (A == kEither && (reinterpret_cast<unsigned long long>(p) & 3u) == 0))
        return *reinterpret_cast<const u32*>(p);
    const u32* q = reinterpret_cast<const u32*>(p - 2);
    return __byte_perm(q[0], q[1], 0x5432u);
#else
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
#endif
}

// The two rows' 16 int8 scales (4 words each) and d / 4
struct Q6Scales { u32 w[2][4]; float d4[2]; };
template <int A>
GQ_HD Q6Scales q6_scales(const u8* const (&blk)[2]) {
    Q6Scales s;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s.w[r][i] = load4_even<A>(blk[r] + 192 + 4 * i);
        s.d4[r] = gguf::half_to_float((gguf::u16)(blk[r][208] | (blk[r][209] << 8))) * 0.25f;
    }
    return s;
}
// scale byte `pos` of row r (GGUF: scale G at byte G), sign-extended: on the GPU one PRMT (byte
// pos & 3, then its sign bit replicated)
GQ_HD int q6_sc(const Q6Scales& s, int r, int pos) {
#ifdef __CUDA_ARCH__
    const unsigned b = (unsigned)(pos & 3), sel = b | ((8u | b) * 0x1110u);
    int v;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(s.w[r][pos >> 2]), "r"(sel));
    return v;
#else
    return (int)(signed char)((s.w[r][pos >> 2] >> (8 * (pos & 3))) & 0xFFu);
#endif
}

// A of group G (values 16G .. 16G + 15) of a row, lane t: 4 (q - 32) of values 16G + 4t .. + 3 as
// signed bytes. Value v = 128 n + 32 s + l (l < 32) has its low four bits in ql[64 n + 32 (s & 1) + l]
// (nibble s >> 1) and its top two in qh[32 n + l] (bits 2s, 2s + 1); G = 8n + 2s + l / 16. From the
// word of ql and the word of qh that hold those values, s = (G >> 1) & 3: gguf::q6_weights (the
// four groups of a qh word share its masked copies).
template <int A>
GQ_HD u32 q6_a(const u8* blk, int G, int t) {
    const int n = G >> 3, s = (G >> 1) & 3, l = 16 * (G & 1) + 4 * t;
    return gguf::q6_weights(load4_even<A>(blk + 64 * n + 32 * (s & 1) + l), load4_even<A>(blk + 128 + 32 * n + l), s);
}

// How a warp's super-block of its rows g and g + 8 is read (mma_st.cu: super_block_q6): `blk`, the
// rows' blocks in the stage, as where(blk, t) -> Rows for lane t; scales(Rows); a(Rows, r, G, t), A of row r and
// group G; sc(Q6Scales, r, G), the group's scale.
// GGUF blocks, all at alignment A:
template <int A> struct Q6Gguf {
    struct Rows { const u8* b[2]; };
    GQ_HD static Rows where(const u8* const (&blk)[2], int) { return Rows{{blk[0], blk[1]}}; }
    GQ_HD static Q6Scales scales(const Rows& w) { return q6_scales<A>(w.b); }
    GQ_HD static u32 a(const Rows& w, int r, int G, int t) { return q6_a<A>(w.b[r], G, t); }
    GQ_HD static int sc(const Q6Scales& s, int r, int G) { return q6_sc(s, r, G); }
};
// Q6_K in pair order, super-block J of a pair: blk is where the GGUF block would start in the stage,
// the pair's first byte plus 210 J (the pair's image keeps its address mod 16). Every load is an
// aligned word at a fixed offset from the pair (scale words of J = 1 and d always after qh).
template <int J> struct Q6Pairs {
    // the pair's start and prefix; ql and qh of lane t's values (value 4t of a group of ql's, in
    // plane order 16 (t >> 1) + 4 (t & 1) past its unit; of qh's, 4t): every word a fixed offset on
    struct Rows { const u8* pair[2]; const u8* ql[2]; const u8* qh[2]; int a[2]; };
    GQ_HD static Rows where(const u8* const (&blk)[2], int t) {
        Rows w;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            w.pair[r] = blk[r] - 210 * J;
            w.a[r] = gguf::q6p_prefix(w.pair[r]);
            w.ql[r] = gguf::q6p_ql(w.pair[r], w.a[r], J) + 16 * (t >> 1) + 4 * (t & 1);
            w.qh[r] = gguf::q6p_qh(w.pair[r], w.a[r], J) + 4 * t;
        }
        return w;
    }
    GQ_HD static Q6Scales scales(const Rows& w) {
        Q6Scales s;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s.w[r][i] = load4(gguf::q6p_word(w.pair[r], w.a[r], 4 * J + i));
            const u32 d2 = load4(gguf::q6p_word(w.pair[r], w.a[r], 8));     // both d's
            s.d4[r] = gguf::half_to_float((gguf::u16)(J ? d2 >> 16 : d2 & 0xFFFFu)) * 0.25f;
        }
        return s;
    }
    // GGUF ql byte 64n + 32 (s & 1) + 16 (G & 1) + 4t is at 64n + 32 (G & 1) + 8 (s & 1) of the plane
    // order, plus the lane's part (gguf::q6p_ql_at, written so that the offset folds)
    GQ_HD static u32 a(const Rows& w, int r, int G, int) {
        const int n = G >> 3, s = (G >> 1) & 3;
        return gguf::q6_weights(load4(w.ql[r] + 64 * n + 32 * (G & 1) + 8 * (s & 1)), load4(w.qh[r] + 32 * n + 16 * (G & 1)), s);
    }
    GQ_HD static int sc(const Q6Scales& s, int r, int G) { return q6_sc(s, r, gguf::q6p_scale_at(G)); }
};

// x's B fragment of group G for n-tile nt: values 16G + 4t .. + 3 of x row 8 nt + g
template <int NT>
GQ_HD u32 q6_b(const u8* xs, int nt, int G, int g, int t) {
    const int r = 8 * nt + g;
    return load4(xs + XStage<NT>::kCodes + 256 * r + 32 * ((G >> 1) ^ (r & 7)) + 16 * (G & 1) + 4 * t);
}
// The super-block done: y += xs * d / 4 * sum, sum the 4x sum of sc * C
GQ_HD void q6_finish(float (&y)[4], const int (&sum)[4], const Q6Scales& s, f32x2 xs) {
#pragma unroll
    for (int q = 0; q < 4; ++q) y[q] = gguf::fma_rn((q & 1) ? xs.y : xs.x, s.d4[q >> 1] * (float)sum[q], y[q]);
}

}  // namespace mst
