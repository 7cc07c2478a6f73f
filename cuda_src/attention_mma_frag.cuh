// attention_mma_frag.cuh — where attention_mma.cu's lanes find their mma.sync fragments, and the
// per-lane online softmax step. __host__ __device__ and header-free, so the CPU tests
// (tests/test_attention_mma_frag.py) run this code against an emulation of the PTX definitions.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, lane = 4 g + t:
//   A (16 x 16, row-major): a0 = row g, k 2t..2t+1; a1 = row g+8, same k; a2 = row g, k 2t+8..2t+9;
//                           a3 = row g+8, k 2t+8..  (two bf16 per register, lower k in the low half)
//   B (16 x 8, column n):   b0 = column g, k 2t..2t+1; b1 = column g, k 2t+8..2t+9
//   C (16 x 8, float):      c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, same columns
// ldmatrix.x4: thread i gives the shared address of row i % 8 of 8x8 matrix i / 8 (16 bytes); lane
// receives register j = (row lane / 4, columns 2 (lane % 4), +1) of matrix j, or with .trans
// (rows 2 (lane % 4), +1 of column lane / 4).
//
// Shared tiles are row-major bf16 rows of D values padded to D + 8 (kRowPad): eight consecutive
// rows' 16-byte pieces of one column then start 4 banks apart, so every ldmatrix phase is
// conflict-free.
//   S = Q K^T: A = Q rows (16 of a warp) x 16 head dims; B = K: column n = position n, k = head
//     dim, i.e. K's rows as stored: ldmatrix (no .trans) of K rows gives b0/b1 directly.
//   O += P V: A = P (16 rows x 16 positions) made from S's C registers of two adjacent n-tiles
//     (the C layout of n-tiles 2j, 2j+1 is the A layout of k-step j); B = V: k = position, column
//     n = head dim, stored position-major, so ldmatrix.trans.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define AM_HD __host__ __device__ __forceinline__
#else
#define AM_HD inline
#endif

namespace amma {

typedef unsigned int u32;

constexpr int kRowPad = 8;                    // bf16 values of padding after each shared row

// Row-major offset (in bf16 values) of (row, col) in a shared tile of D-wide rows
template <int D>
AM_HD int at(int row, int col) { return row * (D + kRowPad) + col; }

// The K/V tiles of both tensor-core kernels (attention_stream.cu's ring, attention_mma.cu's stages):
// unpadded rows of D values, 16-byte piece c of row r stored at piece c ^ (r & 7). An ldmatrix
// phase's eight rows of one piece still fall in eight distinct 16-byte bank groups, and the two
// pieces of a 32-byte global sector stay in one 32-byte shared unit. Padded rows (at) put every
// other row 16 bytes off a shared unit, and a cp.async then fetches both sectors each unit
// straddles: ncu counted 1.5x the K/V bytes' sectors at L2 (bench/results/NOTES.md, sixty-fifth
// session). `phase` is the row's r & 7, which a caller may pass from a register of its own.
template <int D>
AM_HD int at_swz(int row, int col, int phase) {
    static_assert(D >= 64 && D % 64 == 0, "a swizzled row holds whole 128-byte lines");
    return row * D + (((col >> 3) ^ phase) << 3) + (col & 7);
}
template <int D>
AM_HD int at_swz(int row, int col) { return at_swz<D>(row, col, row & 7); }

// A K/V tile's offset in the layout a kernel's build chose: swizzled (at_swz) or padded (at, which
// has no phase)
template <int D, bool kSwizzled>
AM_HD int kv_at(int row, int col, int phase) {
    return kSwizzled ? at_swz<D>(row, col, phase) : at<D>(row, col);
}
template <int D, bool kSwizzled>
AM_HD int kv_at(int row, int col) { return kv_at<D, kSwizzled>(row, col, row & 7); }

// ldmatrix.x4 row addresses, per thread i of the warp (mi = i / 8 the matrix, r = i % 8 its row):
// Q, k-step ks: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15,
// k 8-15) give a0..a3.
struct RowCol { int row, col; };
AM_HD RowCol q_addr(int i, int ks) {
    const int mi = i >> 3, r = i & 7;
    return {(mi & 1) * 8 + r, 16 * ks + (mi >> 1) * 8};
}
// K, n-tile pair np (positions 16 np .. 16 np + 15 of the warp's slice), k-step ks: matrices
// (positions 0-7, k 0-7), (positions 0-7, k 8-15), (8-15, k 0-7), (8-15, k 8-15) give b0, b1 of
// n-tile 2 np and b0, b1 of n-tile 2 np + 1.
AM_HD RowCol k_addr(int i, int np, int ks) {
    const int mi = i >> 3, r = i & 7;
    return {16 * np + (mi >> 1) * 8 + r, 16 * ks + (mi & 1) * 8};
}
// V (.trans), k-step ks (positions 16 ks..), head-dim pair dp (columns 16 dp..): matrices
// (positions 0-7, d 0-7), (positions 8-15, d 0-7), (0-7, d 8-15), (8-15, d 8-15) give b0, b1 of
// n-tile 2 dp and b0, b1 of n-tile 2 dp + 1.
AM_HD RowCol v_addr(int i, int ks, int dp) {
    const int mi = i >> 3, r = i & 7;
    return {16 * ks + (mi & 1) * 8 + r, 16 * dp + (mi >> 1) * 8};
}
// C register c (0..3) of a lane: its row within the 16 and its column within the n-tile
AM_HD int c_row(int lane, int c) { return (lane >> 2) + 8 * (c >> 1); }
AM_HD int c_col(int lane, int c) { return 2 * (lane & 3) + (c & 1); }

// Tile copy: 16-byte piece `idx` of a tile of D-wide rows is row idx / (D / 8), piece idx % (D / 8)
template <int D>
AM_HD RowCol piece(int idx) { return {idx / (D / 8), 8 * (idx % (D / 8))}; }

// two floats -> bf16x2 (round to nearest even), lo in the low half
AM_HD u32 pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    auto bits = [](float f) {
        u32 b;
        __builtin_memcpy(&b, &f, 4);
        return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    };
    return bits(lo) | (bits(hi) << 16);
#endif
}

// 2^x by the MUFU unit alone: ftz, so results below 2^-126 are 0 (a weight that small is 0 in bf16
// P's sums anyway); exp2f adds a denormal fix-up of ~3 instructions to each of a tile's NT * 4 + 2
AM_HD float exp2_(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return __builtin_exp2f(x);
#endif
}
AM_HD float max_(float a, float b) {
#if defined(__CUDA_ARCH__)
    return fmaxf(a, b);
#else
    return __builtin_fmaxf(a, b);
#endif
}
AM_HD float neg_inf() {
#if defined(__CUDA_ARCH__)
    return -__int_as_float(0x7f800000);
#else
    return -__builtin_huge_valf();
#endif
}

// Online softmax, per lane, for one tile of NT n-tiles of S (scores in the log2 domain, hidden
// ones -inf) on the lane's rows g (i = 0) and g + 8 (i = 1):
//   1. tile_max: the lane's own maximum per row; the warp takes the max over the row's quad
//      (lanes 4g .. 4g + 3: shuffles on the device, the test on the host);
//   2. update(quad max): m_new = max(m, quad max); alpha = 2^(m - m_new) rescales l and the NO
//      output n-tiles; p = 2^(s - m_new), added to the lane's share of l (the quad's shares are
//      summed once at the end) and packed to bf16 as the A fragments of P (NT / 2 k-steps).
// A row that has seen nothing keeps m = -inf; it subtracts 0 instead, so p = 0 and alpha = 0
// (never inf - inf).
template <int NT>
AM_HD void tile_max(const float (&s)[NT][4], float (&mx)[2]) {
    mx[0] = mx[1] = neg_inf();
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        mx[0] = max_(mx[0], max_(s[n][0], s[n][1]));
        mx[1] = max_(mx[1], max_(s[n][2], s[n][3]));
    }
}
// The steps of update, for a kernel that rescales O only when a max rose (attention_stream.cu):
// new_max (m, l and the tile's mu and alpha), rescale (O by alpha), exp_pack (p = 2^(s - mu), added
// to l, packed as P's A fragments).
AM_HD void new_max(const float (&quad_max)[2], float (&m)[2], float (&l)[2], float (&mu)[2], float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float mn = max_(m[i], quad_max[i]);
        mu[i] = mn == neg_inf() ? 0.f : mn;
        alpha[i] = exp2_(m[i] - mu[i]);
        m[i] = mn;
        l[i] *= alpha[i];
    }
}
template <int NO>
AM_HD void rescale(float (&o)[NO][4], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
        o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
        o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
    }
}
template <int NT>
AM_HD void exp_pack(const float (&s)[NT][4], const float (&mu)[2], float (&l)[2], u32 (&p)[NT / 2][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        float e[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) e[c] = exp2_(s[n][c] - mu[c >> 1]);
        l[0] += e[0] + e[1];
        l[1] += e[2] + e[3];
        // n-tile n holds k 0..7 (n even) or 8..15 (n odd) of k-step n / 2
        p[n >> 1][2 * (n & 1)] = pack_bf16(e[0], e[1]);       // row g: a0 or a2
        p[n >> 1][2 * (n & 1) + 1] = pack_bf16(e[2], e[3]);   // row g + 8: a1 or a3
    }
}
template <int NT, int NO>
AM_HD void update(const float (&s)[NT][4], const float (&quad_max)[2], float (&m)[2], float (&l)[2],
                  float (&o)[NO][4], u32 (&p)[NT / 2][4]) {
    float mu[2], alpha[2];
    new_max(quad_max, m, l, mu, alpha);
    rescale<NO>(o, alpha);
    exp_pack<NT>(s, mu, l, p);
}

}  // namespace amma
