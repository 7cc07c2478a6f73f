// mma_kq_frag.cuh — Q4_K rows and int8 x as fragments of mma.sync.m16n8k32.s8.s8.s32.
//
// The PTX fragments of m16n8k32 (s8): lane = 4 * g + t (g = groupID, t = threadID_in_group);
//   A (16 x 32, row-major): a0 = row g, k 4t..4t+3; a1 = row g+8, same k; a2 = row g, k 16+4t..;
//                           a3 = row g+8, k 16+4t..  (4 int8 per register, lowest k in the low byte)
//   B (32 x 8, column n):   b0 = column g, k 4t..4t+3; b1 = column g, k 16+4t..
//   C (16 x 8, int32):      c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, same columns.
// The sum over k does not depend on the order of k, so A and B use one permutation of a 32-value
// sub-block: fragment k 4t+i and 16+4t+i hold the sub-block's values 8t+i and 8t+4+i. A lane then
// owns values 8t..8t+7 of its x rows and of its weight row: 8 contiguous bytes of x's codes, and
// for Q4_K 8 contiguous bytes of qs, whose low nibbles are sub-block 2c and high nibbles 2c+1.
// Everything here is __host__ __device__ (host stand-ins in kq_lanes.cuh), so the CPU tests run
// these functions through an emulation of the mma's definition (tests/test_mma_kq_frag.py).
#pragma once
#include "kq_lanes.cuh"

namespace gguf {

// B: the two words of weight row `row` (a Q4_K row of bytes) for sub-blocks 2c and 2c+1 of
// super-block sb, lane part t: qs bytes 32c + 8t .. +7 of the block.
GQ_HD u32x2 mma_q4k_b_words(const u8* row, int sb, int c, int t) {
    return load_vec<u32x2>(row + (long long)sb * 144 + 16 + 32 * c + 8 * t);
}
// the B fragment of sub-block 2c + hi from those words: low (hi = 0) or high nibbles
GQ_HD u32x2 mma_q4k_b_frag(u32x2 w, int hi) {
    const int s = 4 * hi;
    return {(w.x >> s) & 0x0F0F0F0Fu, (w.y >> s) & 0x0F0F0F0Fu};
}
// (d * sc, dmin * m) of sub-block j of the super-block whose 16-byte header is hd
GQ_HD f32x2 mma_q4k_scale(const u32x4& hd, int j) {
    const Q4KScales w = q4k_scale_words(hd, j);
    const int sh = 8 * (j & 3);
    return {half_to_float((u16)(hd.x & 0xFFFF)) * (float)((w.sc >> sh) & 0xFF),
            half_to_float((u16)(hd.x >> 16)) * (float)((w.mn >> sh) & 0xFF)};
}
// A: x row m's codes for values 8t..8t+7 of sub-block j of super-block sb (a0/a1 take .x, a2/a3 .y)
GQ_HD u32x2 mma_x_words(const int* xq_row, int sb, int j, int t) {
    return load_vec<u32x2>(reinterpret_cast<const u8*>(xq_row) + sb * 256 + 32 * j + 8 * t);
}

}  // namespace gguf
