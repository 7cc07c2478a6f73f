// prepare_qkv.cu — from one matmul's q|k|v rows to attention's inputs, in one launch per layer:
// the optional per-head RMSNorm of q and k, RoPE on q and k at each token's position, q out as
// float32 and K, V into their pool cells as bfloat16. It replaces the split copies, two norms, two
// ropes and the KV write (eight launches) of the unfused graph, with the same arithmetic: the norm
// as norm.cu (x * rsqrt(mean(x^2) + eps) * w in float32), the angles as rope.cu (double, reduced
// to [-pi, pi], then sincosf), the bfloat16 rounding as the KV write (nearest even).
//
// prepare_qkv_kernel<D, NEOX, QKNORM>  qkv: (T, (Hq + 2 Hkv) * D) float32, heads in the order q, k, v;
//     q_out: (T, Hq, D) float32; k_pool, v_pool: (cells, Hkv, D) bf16 bits; rope over all D
//     features. A block per (token, 8 heads): each warp takes a head (q, k or v), a lane holds D/32
//     values of the head, laid out so that both values of every rotated pair sit in the lane:
//       NEOX   (pairs i, i + D/2):  value j is feature lane + 32 j;
//       normal (pairs 2i, 2i + 1):  values 2r, 2r + 1 are features 2 lane + 64 r and the next one.
//     Either way lane's pair r (r < D/64) has frequency index i = lane + 32 r.
//     grid=(T, ceil((Hq + 2 Hkv) / 8)) block=(32, 8)
//
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.
#include "bf16.cuh"
#include "pdl.cuh"
#include "stamps.cuh"

template <int D, bool NEOX>
__device__ __forceinline__ int feature(int lane, int j) {
    return NEOX ? lane + 32 * j : 2 * lane + 64 * (j >> 1) + (j & 1);
}

template <int D, bool NEOX, bool QKNORM>
__global__ void __launch_bounds__(256) prepare_qkv_kernel(
    float* __restrict__ q_out, unsigned short* __restrict__ k_pool, unsigned short* __restrict__ v_pool,
    const float* __restrict__ qkv, const float* __restrict__ q_norm, const float* __restrict__ k_norm,
    const int* __restrict__ positions, const int* __restrict__ cells, int hq, int hkv, float eps,
    double log2_base) {
    constexpr int NR = D / 32;              // values per lane
    constexpr int NP = NR / 2;              // rotated pairs per lane
    const double TWO_PI = 6.283185307179586476925286766559;
    const int t = blockIdx.x, lane = threadIdx.x;
    const int heads = hq + 2 * hkv;
    const float* src = qkv + (long long)t * heads * D;
    STAMP(0);
    pdl_release();                          // attention's index reads and old rows overlap this kernel's wait
    const long long cell = cells[t];

    float cs[NP], sn[NP];
    const double pos = (double)positions[t];
#pragma unroll
    for (int r = 0; r < NP; ++r) {
        const int i = lane + 32 * r;
        const double inv_freq = exp2(-(double)(2 * i) / (double)D * log2_base);
        double ang = pos * inv_freq;
        ang -= rint(ang * (1.0 / TWO_PI)) * TWO_PI;
        sincosf((float)ang, &sn[r], &cs[r]);
    }
    // the angles need only the positions (the step's upload): computed before waiting (pdl.cuh)
    pdl_wait();
    STAMP(1);

    for (int h = blockIdx.y * blockDim.y + threadIdx.y; h < heads; h += gridDim.y * blockDim.y) {
        const float* x = src + h * D;
        float v[NR];
#pragma unroll
        for (int j = 0; j < NR; ++j) v[j] = x[feature<D, NEOX>(lane, j)];
        if (h >= hq + hkv) {                                  // v: straight into its cell
            unsigned short* dst = v_pool + (cell * hkv + (h - hq - hkv)) * D;
#pragma unroll
            for (int j = 0; j < NR; ++j) dst[feature<D, NEOX>(lane, j)] = bf16_bits(v[j]);
            continue;
        }
        const bool is_q = h < hq;
        if (QKNORM) {
            float ss = 0.f;
#pragma unroll
            for (int j = 0; j < NR; ++j) ss += v[j] * v[j];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
            const float inv = rsqrtf(ss / (float)D + eps);
            const float* w = is_q ? q_norm : k_norm;
#pragma unroll
            for (int j = 0; j < NR; ++j) v[j] = v[j] * inv * w[feature<D, NEOX>(lane, j)];
        }
#pragma unroll
        for (int r = 0; r < NP; ++r) {
            const int ja = NEOX ? r : 2 * r, jb = NEOX ? r + NP : 2 * r + 1;
            const float a = v[ja], b = v[jb];
            v[ja] = a * cs[r] - b * sn[r];
            v[jb] = a * sn[r] + b * cs[r];
        }
        if (is_q) {
            float* dst = q_out + ((long long)t * hq + h) * D;
#pragma unroll
            for (int j = 0; j < NR; ++j) dst[feature<D, NEOX>(lane, j)] = v[j];
        } else {
            unsigned short* dst = k_pool + (cell * hkv + (h - hq)) * D;
#pragma unroll
            for (int j = 0; j < NR; ++j) dst[feature<D, NEOX>(lane, j)] = bf16_bits(v[j]);
        }
    }
    STAMP(2);
}

#ifdef GLIMMER_INSTANTIATE
#define PREP(D, NEOX, QKN) template __global__ void prepare_qkv_kernel<D, NEOX, QKN>(float*, unsigned short*, \
    unsigned short*, const float*, const float*, const float*, const int*, const int*, int, int, float, double);
#define PREP_D(D) PREP(D, false, false) PREP(D, false, true) PREP(D, true, false) PREP(D, true, true)
PREP_D(64) PREP_D(128) PREP_D(256)
#endif
