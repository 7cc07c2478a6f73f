// norm_row.cuh — RMSNorm of one row by a group of threads: the steps norm.cu's kernels are made of,
// and the norm tail a GEMV's last block runs on the rows it finished (gemv_kq.cu, quant_matmul.cu).
//
// A row is handled by nt threads (a multiple of 32: whole warps), thread t of them; `slot` numbers
// the row's warps in the block's shared array (warps slot * nt / 32 ...). The sum of squares is
// float32 per thread, reduced by warp shuffles and then across the row's warps.
#pragma once
#include "last_block.cuh"
#include "pack.cuh"
#include "pdl.cuh"
#include "q8.cuh"

// Sum of `v` over the row's nt threads (every thread of the block must call it). `red` holds a
// float per warp of the block; a caller that reuses it puts a barrier between the calls.
__device__ __forceinline__ float row_sum(float v, float* red, int t, int nt, int slot) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warps = nt >> 5;
    if (warps == 1) return v;
    if ((t & 31) == 0) red[(slot * nt + t) >> 5] = v;
    __syncthreads();
    const float* mine = red + slot * warps;
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += mine[w];
    return s;
}

// The weight packs this thread scales by, into L1 before the kernel waits (pdl.cuh): they are read
// only after the row's sum, so their trip from memory would otherwise follow it.
template <int VEC>
__device__ __forceinline__ void prefetch_weight(const float* weight, int nv, int t, int nt) {
    for (int k = t; k < nv; k += nt) prefetch_l1(weight + k * VEC);
}

// out row = p * inv * w, pack by pack; with q8 also its codes (q8.cuh). Every lane of the row's
// warps runs the same trip count, so the q8 shuffles see whole groups.
template <typename T, int VEC, bool Q8>
__device__ __forceinline__ void scale_row(T* __restrict__ orow, const T* xrow, const float* __restrict__ weight,
                                          float inv, int nv, int t, int nt, int* xq, float* xd, float* xs) {
    typedef Pack<T, VEC> PT;
    typedef Pack<float, VEC> PF;
    const PT* xr = reinterpret_cast<const PT*>(xrow);
    const PF* wr = reinterpret_cast<const PF*>(weight);
    PT* orp = reinterpret_cast<PT*>(orow);
    for (int base = 0; base < nv; base += nt) {
        const int k = base + t;
        const bool act = k < nv;
        const unsigned mask = Q8 ? __ballot_sync(0xffffffffu, act) : 0u;
        if (!act) continue;
        const PT p = xr[k];
        const PF w = wr[k];
        PT o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) from_f32(to_f32(p.v[j]) * inv * w.v[j], o.v[j]);
        orp[k] = o;
        if constexpr (Q8) q8_lane<4>(o.v, 4 * k, xq, xd, xs, mask);
    }
}

// The norm tail of a GEMV y (M rows of n float32 values): what the ops
//     y = rms_norm(y) * post          (when post is given: Gemma's norm after a sublayer)
//     residual += y; out = rms_norm(residual) * weight     (and out's int8 codes when oq is given)
// do, run by the last of the GEMV's blocks to finish, so that the norm costs no launch of its own.
// n % 4 == 0 and 16-byte aligned rows (ops/matmul_norm.py checks); counter: a zeroed int
// (last_block). A kernel takes NORM_TAIL_ARGS and hands its body NormTail{NORM_TAIL_PASS}.
#define NORM_TAIL_ARGS                                                                                     \
    float *__restrict__ residual, const float *__restrict__ post, const float *__restrict__ weight,          \
        float *__restrict__ out, int *__restrict__ oq, float *__restrict__ od, float *__restrict__ os,        \
        int *__restrict__ counter, float eps
#define NORM_TAIL_PASS residual, post, weight, out, oq, od, os, counter, eps

struct NormTail {
    float* residual;
    const float* post;
    const float* weight;
    float* out;
    int* oq;
    float* od;
    float* os;
    int* counter;
    float eps;
};

// Before the GEMV waits: the norm weights into L2, a 128-byte line per block, for whichever block
// turns out last (they are no kernel's output).
__device__ __forceinline__ void norm_tail_prefetch(const NormTail& a, int n) {
    const int line = blockIdx.x * 32;
    if (threadIdx.x == 0 && threadIdx.y == 0 && line < n) {
        prefetch_l2(a.weight + line);
        if (a.post) prefetch_l2(a.post + line);
    }
}

// Called by every thread of every block of the GEMV, after its stores of y.
__device__ __forceinline__ void norm_tail(const float* y, int m_rows, int n, const NormTail& a) {
    if (!last_block(a.counter, gridDim.x, threadIdx.x == 0 && threadIdx.y == 0)) return;
    __shared__ float red[32];
    typedef Pack<float, 4> P;
    const int nt = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
    const int nv = n / 4;
    for (int m = 0; m < m_rows; ++m) {
        const long long mo = (long long)m * n;
        const P* yr = reinterpret_cast<const P*>(y + mo);
        P* rr = reinterpret_cast<P*>(a.residual + mo);
        float inv_post = 1.f;
        if (a.post) {                                 // uniform: the same pointer in every thread
            float ss = 0.f;
            for (int k = t; k < nv; k += nt) {
                const float4 v = __ldcg(reinterpret_cast<const float4*>(yr + k));
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            __syncthreads();                          // red's last readers are done
            inv_post = rsqrtf(row_sum(ss, red, t, nt, 0) / (float)n + a.eps);
        }
        float ss = 0.f;
        for (int k = t; k < nv; k += nt) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(yr + k));
            const float d[4] = {v.x, v.y, v.z, v.w};
            P pw;
            if (a.post) pw = reinterpret_cast<const P*>(a.post)[k];
            const P r = rr[k];
            P s;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float dj = a.post ? d[j] * inv_post * pw.v[j] : d[j];     // rms_norm's rounding
                from_f32(to_f32(r.v[j]) + dj, s.v[j]);
                const float v2 = to_f32(s.v[j]);      // the stored (rounded) sum is what we norm
                ss += v2 * v2;
            }
            rr[k] = s;
        }
        __syncthreads();
        const float inv = rsqrtf(row_sum(ss, red, t, nt, 0) / (float)n + a.eps);
        // each thread re-reads exactly the packs it wrote above, so no barrier is needed
        if (a.oq) scale_row<float, 4, true>(a.out + mo, a.residual + mo, a.weight, inv, nv, t, nt, a.oq + mo / 4,
                                            a.od + mo / 32, a.os + mo / 32);
        else scale_row<float, 4, false>(a.out + mo, a.residual + mo, a.weight, inv, nv, t, nt, nullptr, nullptr,
                                        nullptr);
    }
}
