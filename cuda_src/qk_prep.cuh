// qk_prep.cuh — one head's q or k row from the qkv matmul's output to attention's input, by one
// warp: the optional per-head RMSNorm, then RoPE at the token's position (prepare_qkv.cu; the
// decode attention that does it itself, attention_stream.cu). The same arithmetic as norm.cu and
// rope.cu: x * rsqrt(mean(x^2) + eps) * w in float32; angles in double, reduced to [-pi, pi],
// then sincosf.
//
// A lane holds D/32 values of the head, laid out so that both values of every rotated pair sit in
// the lane:
//   NEOX   (pairs i, i + D/2):  value j is feature lane + 32 j;
//   normal (pairs 2i, 2i + 1):  values 2r, 2r + 1 are features 2 lane + 64 r and the next one.
// Either way lane's pair r (r < D/64) has frequency index i = lane + 32 r.
#pragma once

template <int D, bool NEOX>
__device__ __forceinline__ int feature(int lane, int j) {
    return NEOX ? lane + 32 * j : 2 * lane + 64 * (j >> 1) + (j & 1);
}

// cos and sin of this lane's D/64 pairs at position pos (needs only the position: before pdl_wait)
template <int D>
__device__ __forceinline__ void rope_angles(double pos, double log2_base, int lane, float (&cs)[D / 64],
                                            float (&sn)[D / 64]) {
    const double TWO_PI = 6.283185307179586476925286766559;
#pragma unroll
    for (int r = 0; r < D / 64; ++r) {
        const int i = lane + 32 * r;
        const double inv_freq = exp2(-(double)(2 * i) / (double)D * log2_base);
        double ang = pos * inv_freq;
        ang -= rint(ang * (1.0 / TWO_PI)) * TWO_PI;
        sincosf((float)ang, &sn[r], &cs[r]);
    }
}

// this lane's values of head row x
template <int D, bool NEOX>
__device__ __forceinline__ void load_head(const float* x, int lane, float (&v)[D / 32]) {
#pragma unroll
    for (int j = 0; j < D / 32; ++j) v[j] = x[feature<D, NEOX>(lane, j)];
}

// v *= rsqrt(mean over the head of v^2 + eps) * w (every lane of the warp)
template <int D, bool NEOX>
__device__ __forceinline__ void head_norm(float (&v)[D / 32], const float* w, float eps, int lane) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) ss += v[j] * v[j];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv = rsqrtf(ss / (float)D + eps);
#pragma unroll
    for (int j = 0; j < D / 32; ++j) v[j] = v[j] * inv * w[feature<D, NEOX>(lane, j)];
}

// RoPE of this lane's pairs
template <int D, bool NEOX>
__device__ __forceinline__ void rotate(float (&v)[D / 32], const float (&cs)[D / 64], const float (&sn)[D / 64]) {
    constexpr int NP = D / 64;
#pragma unroll
    for (int r = 0; r < NP; ++r) {
        const int ja = NEOX ? r : 2 * r, jb = NEOX ? r + NP : 2 * r + 1;
        const float a = v[ja], b = v[jb];
        v[ja] = a * cs[r] - b * sn[r];
        v[jb] = a * sn[r] + b * cs[r];
    }
}

// feature() for a layout chosen at run time
template <int D>
__device__ __forceinline__ int feature_of(bool neox, int lane, int j) {
    return neox ? feature<D, true>(lane, j) : feature<D, false>(lane, j);
}

// this lane's values of head row x, the layout chosen at run time
template <int D>
__device__ __forceinline__ void load_head_of(bool neox, const float* x, int lane, float (&v)[D / 32]) {
    if (neox) load_head<D, true>(x, lane, v);
    else load_head<D, false>(x, lane, v);
}

// loaded values (load_head_of) as prepare_qkv.cu makes them: normed with w when w is given,
// rotated when `rope` (every lane of the warp)
template <int D>
__device__ __forceinline__ void finish_head(float (&v)[D / 32], const float* w, bool rope, bool neox, float eps,
                                            const float (&cs)[D / 64], const float (&sn)[D / 64], int lane) {
    if (neox) {
        if (w != nullptr) head_norm<D, true>(v, w, eps, lane);
        if (rope) rotate<D, true>(v, cs, sn);
    } else {
        if (w != nullptr) head_norm<D, false>(v, w, eps, lane);
        if (rope) rotate<D, false>(v, cs, sn);
    }
}
