// q8.cuh — int8 quantization of activations per 32 values, fused into the kernel that produces them.
//
// The dp4a GEMVs (quant_matmul.cu) read x as int8 codes per 32 values with d = max|x| / 127 and
// s = d * sum(codes); quantize_x_kernel makes them in a launch of its own. A kernel whose threads
// each hold a pack of 4 consecutive outputs, with the 8 packs of every 32-value group on 8 aligned
// lanes of a warp, makes the same bits in its epilogue with q8_pack4: max and sum over the group by
// shuffles, codes rounded to nearest even as quantize32 rounds them.
#pragma once

// v: this lane's 4 values, pack k of its row (k % 8 is the lane's place in its group); mask: the
// warp's lanes that call this (whole groups); xq, xd, xs point at the row's codes (one int32 word
// per pack), scales and scaled sums (one per group).
__device__ __forceinline__ void q8_pack4(const float* v, unsigned mask, int k, int* __restrict__ xq,
                                         float* __restrict__ xd, float* __restrict__ xs) {
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
    const float d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    unsigned word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const int c = __float2int_rn(v[b] * inv);
        sum += c;
        word |= (unsigned)(c & 0xFF) << (8 * b);
    }
    xq[k] = (int)word;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(mask, sum, o);
    if ((k & 7) == 0) {
        xd[k >> 3] = d;
        xs[k >> 3] = d * (float)sum;
    }
}

// The same bits for C = 2, 4 or 8 consecutive values per lane, a 32-value group on 32 / C aligned
// lanes of a full warp: v holds values at..at+C-1 of the row (at a multiple of C).
template <int C>
__device__ __forceinline__ void q8_lane(const float* v, int at, int* __restrict__ xq, float* __restrict__ xd,
                                        float* __restrict__ xs) {
    static_assert(C == 2 || C == 4 || C == 8, "2, 4 or 8 values per lane");
    constexpr int L = 32 / C;                          // lanes per group
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < C; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < L; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    unsigned word[(C + 3) / 4] = {};
#pragma unroll
    for (int i = 0; i < C; ++i) {
        const int c = __float2int_rn(v[i] * inv);
        sum += c;
        word[i / 4] |= (unsigned)(c & 0xFF) << (8 * (i % 4));
    }
    if (C == 2) reinterpret_cast<unsigned short*>(xq)[at / 2] = (unsigned short)word[0];
    else if (C == 4) xq[at / 4] = (int)word[0];
    else reinterpret_cast<int2*>(xq)[at / 8] = make_int2((int)word[0], (int)word[(C - 1) / 4]);
#pragma unroll
    for (int o = 1; o < L; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (at % 32 == 0) {
        xd[at / 32] = d;
        xs[at / 32] = d * (float)sum;
    }
}
