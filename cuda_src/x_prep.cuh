// x_prep.cuh — a one-row GEMV's int8 input made by its own blocks, from what the op before it
// would have made it from: the residual add + RMSNorm before qkv and gate/up, the gated activation
// before down (ops/fused_input.py). Each block makes the whole row's codes (q8.cuh's form) in its
// shared memory; the kernel boundary of the norm or activation goes, at the cost of every block
// reading the row (a few KB from L2) and doing its arithmetic.
//
// The codes are the bits the separate op makes (norm.cu's add_rms_norm_kernel<float, 4, true>,
// activation.cu's gated_kernel<Act, float, 4, true>): the same float expressions, and the norm's
// sum of squares in that kernel's order for its launch width tx (ops/norm.py's _launch_shape):
// thread u of tx sums packs u, u + tx, ... in turn, a warp's 32 sums meet by xor shuffles, and
// the warps' sums are added in warp order. So a step with the input made here gives the tokens a
// step with the separate op gives.
//
// Every thread of the block calls a prep (T threads, a multiple of 32, linear index t); rows of 4
// floats (packs), the row's length a multiple of 32.
#pragma once
#include "gated_act.cuh"
#include "q8.cuh"

namespace xprep {

// codes of packs k = t, t + T, ...: o(k, v) fills the pack's 4 values; whole 32-value groups lie
// on 8 aligned lanes of a warp, as q8_lane wants
template <int T, class F>
__device__ __forceinline__ void codes_of(int nv, int t, int* xq, float* xd, float* xs, F o) {
    for (int base = 0; base < nv; base += T) {
        const int k = base + t;
        const bool act = k < nv;
        const unsigned mask = __ballot_sync(0xffffffffu, act);
        if (act) {
            float v[4];
            o(k, v);
            q8_lane<4>(v, 4 * k, xq, xd, xs, mask);
        }
    }
}

// x = rms_norm(residual + delta) * weight; block 0 also stores residual + delta to res_out (the
// step's new residual: out of place, since the other blocks still read residual). scratch: d + 32
// floats of shared memory.
template <int T>
struct Norm {
    float* __restrict__ res_out;
    const float* __restrict__ residual;
    const float* __restrict__ delta;
    const float* __restrict__ weight;
    float eps;
    int d;
    int tx;                                           // the separate norm's threads a row

    __host__ __device__ static constexpr int scratch_floats(int d) { return d + 32; }

    // the weight is no kernel's output: into L1 before the wait (as the norm kernel does)
    __device__ __forceinline__ void before_wait(int t) const {
        for (int k = t; k < d / 4; k += T) asm volatile("prefetch.global.L1 [%0];" :: "l"(weight + 4 * k));
    }

    __device__ __forceinline__ void operator()(int t, int* xq, float* xd, float* xs, float* scratch) const {
        const int nv = d / 4, warp = t >> 5, lane = t & 31;
        float4* v = reinterpret_cast<float4*>(scratch);
        float* red = scratch + d;
        const float4* r4 = reinterpret_cast<const float4*>(residual);
        const float4* d4 = reinterpret_cast<const float4*>(delta);
        for (int k = t; k < nv; k += T) {
            const float4 a = r4[k], b = d4[k];
            const float4 s = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            v[k] = s;
            if (blockIdx.x == 0) reinterpret_cast<float4*>(res_out)[k] = s;
        }
        __syncthreads();
        const int vw_n = tx >> 5;                     // the separate norm's warps
        for (int vw = warp; vw < vw_n; vw += T / 32) {
            float ss = 0.f;
            for (int k = vw * 32 + lane; k < nv; k += tx) {
                const float4 s = v[k];
                ss += s.x * s.x;
                ss += s.y * s.y;
                ss += s.z * s.z;
                ss += s.w * s.w;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) red[vw] = ss;
        }
        __syncthreads();
        float s = 0.f;
        for (int i = 0; i < vw_n; ++i) s += red[i];
        const float inv = rsqrtf(s / (float)d + eps);
        const float4* w4 = reinterpret_cast<const float4*>(weight);
        codes_of<T>(nv, t, xq, xd, xs, [&](int k, float* o) {
            const float4 p = v[k], w = w4[k];
            o[0] = p.x * inv * w.x;
            o[1] = p.y * inv * w.y;
            o[2] = p.z * inv * w.z;
            o[3] = p.w * inv * w.w;
        });
    }
};

// x = act(gate) * up for gate_up = [gate | up], each f wide
template <int T, class Act>
struct Gated {
    const float* __restrict__ gate_up;
    int f;

    __host__ __device__ static constexpr int scratch_floats(int) { return 0; }
    __device__ __forceinline__ void before_wait(int) const {}

    __device__ __forceinline__ void operator()(int t, int* xq, float* xd, float* xs, float*) const {
        const int nv = f / 4;
        const float4* g4 = reinterpret_cast<const float4*>(gate_up);
        codes_of<T>(nv, t, xq, xd, xs, [&](int k, float* o) {
            const float4 g = g4[k], u = g4[nv + k];
            o[0] = Act::apply(g.x) * u.x;
            o[1] = Act::apply(g.y) * u.y;
            o[2] = Act::apply(g.z) * u.z;
            o[3] = Act::apply(g.w) * u.w;
        });
    }
};

// shared memory a prep's GEMV asks for: the codes (k bytes), a norm's scratch (k + 32 floats), then
// d and s (k / 32 floats each)
__host__ __device__ constexpr int smem_bytes(int k, bool norm) {
    return k + 8 * (k / 32) + (norm ? 4 * (k + 32) : 0);
}

}  // namespace xprep
