// q8.cuh — int8 quantization of activations per 32 values, fused into the kernel that produces them.
//
// The int8 GEMVs (quant_matmul.cu, gemv_kq.cu) read x as int8 codes per 32 values with
// d = max|x| / 127 and s = d * sum(codes); quantize_x_kernel makes them in a launch of its own. A
// kernel whose lanes each hold C consecutive outputs, with every 32-value group on 32 / C aligned
// lanes of a warp, makes the same bits in its epilogue with q8_lane: max and sum over the group by
// shuffles, codes rounded to nearest even as quantize32 rounds them.
#pragma once

// C = 2, 4 or 8: v holds values at..at+C-1 of the row (at a multiple of C); mask: the warp's lanes
// that call this (whole groups); xq, xd, xs point at the row's codes (4 per int32 word), scales
// and scaled sums (one per group).
template <int C>
__device__ __forceinline__ void q8_lane(const float* v, int at, int* __restrict__ xq, float* __restrict__ xd,
                                        float* __restrict__ xs, unsigned mask = 0xffffffffu) {
    static_assert(C == 2 || C == 4 || C == 8, "2, 4 or 8 values per lane");
    constexpr int L = 32 / C;                          // lanes per group
    float amax = fabsf(v[0]);                          // NaN only when the whole group is NaN
#pragma unroll
    for (int i = 1; i < C; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < L; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
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
    const unsigned u = (unsigned)at;                   // non-negative: divisions are shifts
    if (C == 2) reinterpret_cast<unsigned short*>(xq)[u / 2] = (unsigned short)word[0];
    else if (C == 4) xq[u / 4] = (int)word[0];
    else reinterpret_cast<int2*>(xq)[u / 8] = make_int2((int)word[0], (int)word[(C - 1) / 4]);
#pragma unroll
    for (int o = 1; o < L; o <<= 1) sum += __shfl_xor_sync(mask, sum, o);
    if (u % 32 == 0) {
        xd[u / 32] = d;
        xs[u / 32] = d * (float)sum;
    }
}
