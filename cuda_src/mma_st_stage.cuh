// mma_st_stage.cuh — a super-block of one row of x into mma_st's image of it (XStage, mma_st_lanes.cuh):
// the int8 codes of 256 values rounded half to even from v * 127 / max|v|, each sub-block's sum of
// codes as (hi, lo) = (sum >> 6, sum & 63), and the scale max|v| / 127 (0 for an all-zero row).
// One warp, 8 values a lane (lane l: values 8l .. 8l + 7 of the super-block). Made by
// mma_st_stage_x_kernel from x, and by the ops that produce a matmul's x (norm.cu) from the values
// they hold, so that the matmul finds its images made: the same bits either way.
#pragma once
#include "mma_st_lanes.cuh"

namespace mst {

// row r's part of the image at st (the super-block's, of nt n-tiles: XStage<nt>, whose offsets are nt
// times XStage<1>'s)
__device__ __forceinline__ void stage_row(unsigned char* st, const float (&v)[8], int r, int nt) {
    const int lane = threadIdx.x & 31;
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;
    u32 word[2] = {0u, 0u};
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int c = (int)rintf(__fmul_rn(v[i], inv));
        sum += c;
        word[i >> 2] |= ((u32)c & 0xFFu) << (8 * (i & 3));
    }
    const int j = lane >> 2;                                   // the sub-block; lanes 4j..4j+3 hold it
    *reinterpret_cast<uint2*>(st + XStage<1>::kCodes + 256 * r + 32 * (j ^ (r & 7)) + 8 * (lane & 3)) =
        make_uint2(word[0], word[1]);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if ((lane & 3) == 0) {                                      // (hi, lo) = (sum >> 6, sum & 63)
        const unsigned short pair = (unsigned short)(((u32)(sum >> 6) & 0xFFu) | ((u32)(sum & 63) << 8));
        *reinterpret_cast<unsigned short*>(st + XStage<1>::kMins * nt + 16 * r + 2 * j) = pair;
    }
    if (lane == 0) *reinterpret_cast<float*>(st + XStage<1>::kScales * nt + 4 * r) = __fdiv_rn(amax, 127.f);
}

// A producer's share of super-block sb of xst (images of st_rows = 8 n-tiles rows, `rows` of them
// real): row `row`'s part from v, and, where row + rows is one of the padding rows past them, that
// row's zeros (st_rows - rows <= rows for the 4..32 rows images are made at, q8.ST_ROWS, so the first
// rows' warps cover them).
__device__ __forceinline__ void stage_row_padded(unsigned char* xst, int sb, const float (&v)[8], int row, int rows,
                                                 int st_rows) {
    const int nt = st_rows >> 3;
    unsigned char* const image = xst + (long long)sb * XStage<1>::kBytes * nt;
    stage_row(image, v, row, nt);
    if (row + rows < st_rows) {
        const float zero[8] = {};
        stage_row(image, zero, row + rows, nt);
    }
}

}  // namespace mst
