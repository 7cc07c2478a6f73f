// quant_dot.cuh — GGUF blocks as int8 lanes for dp4a dot products against int8-quantized x.
//
// x is quantized per 32 values (q8): xq int8, xd = max|x| / 127, xs = xd * sum(xq). One struct per
// weight type gives, for the 32-value sub-block s of a row, eight 32-bit words w[i] holding the
// integer codes of values 4i..4i+3 (one per byte, in x's order), and the affine map that turns
// integer dot products into the float result:
//   sum_l w_l * x_l  ~=  xd * (d0 * dot(w[0..3], xq[0..15]) + d1 * dot(w[4..7], xq[16..31])) + mw * xs
// d0 = d1 for types with one scale per 32 values; k-quants with 16-value scales (Q6_K) give two.
// mw carries a constant offset or a block minimum (-8 d for Q4_0, m for Q4_1, -dmin * m for Q4_K).
// Offsets follow quant_blocks.cuh (ggml's structs); blocks whose size is not a multiple of 4
// (Q4_0, Q5_0, Q8_0, Q6_K) are read as 16-bit halves.
#pragma once
#include "quant_blocks.cuh"

namespace gguf {

__device__ __forceinline__ int ld32_a2(const u8* p) {       // 2-byte aligned 32-bit load
    const u16* h = reinterpret_cast<const u16*>(p);
    return (int)((u32)h[0] | ((u32)h[1] << 16));
}
__device__ __forceinline__ int ld32_a4(const u8* p) { return *reinterpret_cast<const int*>(p); }

// bits 0..3 of b into bit 4 of bytes 0..3
__device__ __forceinline__ int spread4_to_bit4(u32 b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

template <class QT> struct Dot;   // specialised for the types that have an integer path

template <> struct Dot<Q4_0> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)s * 18;
        const u8* qs = b + 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld32_a2(qs + 4 * i);
            w[i] = v & 0x0F0F0F0F;
            w[i + 4] = (v >> 4) & 0x0F0F0F0F;
        }
        d0 = d1 = half_to_float(*reinterpret_cast<const u16*>(b));
        mw = -8.f * d0;
    }
};

template <> struct Dot<Q4_1> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)s * 20;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld32_a4(b + 4 + 4 * i);
            w[i] = v & 0x0F0F0F0F;
            w[i + 4] = (v >> 4) & 0x0F0F0F0F;
        }
        const u16* h = reinterpret_cast<const u16*>(b);
        d0 = d1 = half_to_float(h[0]);
        mw = half_to_float(h[1]);
    }
};

template <> struct Dot<Q5_0> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)s * 22;
        const u32 qh = (u32)ld32_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int v = ld32_a2(b + 6 + 4 * i);
            w[i] = (v & 0x0F0F0F0F) | spread4_to_bit4(qh >> (4 * i));
            w[i + 4] = ((v >> 4) & 0x0F0F0F0F) | spread4_to_bit4(qh >> (16 + 4 * i));
        }
        d0 = d1 = half_to_float(*reinterpret_cast<const u16*>(b));
        mw = -16.f * d0;
    }
};

template <> struct Dot<Q8_0> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)s * 34;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = ld32_a2(b + 2 + 4 * i);
        d0 = d1 = half_to_float(*reinterpret_cast<const u16*>(b));
        mw = 0.f;
    }
};

template <> struct Dot<Q4_K> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)(s >> 3) * 144;
        const int j = s & 7;
        const u8* qs = b + 16 + 32 * (j >> 1);
        const int shift = 4 * (j & 1);
        // 16-byte aligned: a Q4_K block is 144 = 9 * 16 bytes and qs starts at byte 16
        const int4 lo = *reinterpret_cast<const int4*>(qs), hi = *reinterpret_cast<const int4*>(qs + 16);
        const int v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (v[i] >> shift) & 0x0F0F0F0F;
        float sc, m;
        scale_min_k4(j, b + 4, sc, m);
        const u16* h = reinterpret_cast<const u16*>(b);
        d0 = d1 = half_to_float(h[0]) * sc;
        mw = -half_to_float(h[1]) * m;
    }
};

template <> struct Dot<Q5_K> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)(s >> 3) * 176;
        const int j = s & 7;
        const u8* qs = b + 48 + 32 * (j >> 1);
        const u8* qh = b + 16;
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = ((ld32_a4(qs + 4 * i) >> shift) & 0x0F0F0F0F) | (((ld32_a4(qh + 4 * i) >> j) & 0x01010101) << 4);
        float sc, m;
        scale_min_k4(j, b + 4, sc, m);
        const u16* h = reinterpret_cast<const u16*>(b);
        d0 = d1 = half_to_float(h[0]) * sc;
        mw = -half_to_float(h[1]) * m;
    }
};

template <> struct Dot<Q6_K> {
    __device__ static void load(const u8* row, int s, int* w, float& d0, float& d1, float& mw) {
        const u8* b = row + (long long)(s >> 3) * 210;
        const int j = s & 7, h = j >> 2, g = j & 3;
        const u8* ql = b + 64 * h + 32 * (g & 1);
        const u8* qh = b + 128 + 32 * h;
        const int lshift = 4 * (g >> 1), hshift = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = ((ld32_a2(ql + 4 * i) >> lshift) & 0x0F0F0F0F) | (((ld32_a2(qh + 4 * i) >> hshift) & 0x03030303) << 4);
            w[i] = __vsubss4(q, 0x20202020);      // codes 0..63 -> -32..31, per byte
        }
        const float d = half_to_float(*reinterpret_cast<const u16*>(b + 208));
        const i8* sc = reinterpret_cast<const i8*>(b + 192);
        d0 = d * (float)sc[2 * j];
        d1 = d * (float)sc[2 * j + 1];
        mw = 0.f;
    }
};

}  // namespace gguf

// acc[m] += the dot product of a row's sub-block s (its codes wv and map d0, d1, mw, as Dot<QT>::load
// gives them) with sub-block s of row m of x, for every row m of x: eight dp4a and one float fma
// per 32 values (gemv_dp4a_kernel, gemv_staged_kernel).
template <int M>
__device__ __forceinline__ void dp4a_sub_block(float* acc, const int (&wv)[8], float d0, float d1, float mw, int s,
                                               const int* xq, const float* xd, const float* xs, int k, int nsub) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const int4* xp = reinterpret_cast<const int4*>(xq + ((long long)m * k + 32 * s) / 4);
        const int4 a = xp[0], b = xp[1];
        int s0 = __dp4a(wv[0], a.x, 0);
        s0 = __dp4a(wv[1], a.y, s0);
        s0 = __dp4a(wv[2], a.z, s0);
        s0 = __dp4a(wv[3], a.w, s0);
        int s1 = __dp4a(wv[4], b.x, 0);
        s1 = __dp4a(wv[5], b.y, s1);
        s1 = __dp4a(wv[6], b.z, s1);
        s1 = __dp4a(wv[7], b.w, s1);
        const long long xi = (long long)m * nsub + s;
        acc[m] = fmaf(xd[xi], d0 * (float)s0 + d1 * (float)s1, fmaf(mw, xs[xi], acc[m]));
    }
}

// y[m, row] = the warp's sum of acc[m], for every row m of x; stored only when `on` (every lane
// still takes part in the sums: a row past N is summed and dropped)
template <int M>
__device__ __forceinline__ void store_row_sums(float* __restrict__ y, const float* acc, int n, int row, int lane,
                                               bool on = true) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float a = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0 && on) y[(long long)m * n + row] = a;
    }
}
