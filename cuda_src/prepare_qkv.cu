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
//     values of the head in qk_prep.cuh's layout (both values of every rotated pair in the lane).
//     grid=(T, ceil((Hq + 2 Hkv) / 8)) block=(32, 8)
//
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.
#include "bf16.cuh"
#include "pdl.cuh"
#include "qk_prep.cuh"
#include "stamps.cuh"

template <int D, bool NEOX, bool QKNORM>
__global__ void __launch_bounds__(256) prepare_qkv_kernel(
    float* __restrict__ q_out, unsigned short* __restrict__ k_pool, unsigned short* __restrict__ v_pool,
    const float* __restrict__ qkv, const float* __restrict__ q_norm, const float* __restrict__ k_norm,
    const int* __restrict__ positions, const int* __restrict__ cells, int hq, int hkv, float eps,
    double log2_base) {
    constexpr int NR = D / 32;              // values per lane
    const int t = blockIdx.x, lane = threadIdx.x;
    const int heads = hq + 2 * hkv;
    const float* src = qkv + (long long)t * heads * D;
    STAMP(0);
    pdl_release();                          // attention's index reads and old rows overlap this kernel's wait
    const long long cell = cells[t];

    float cs[D / 64], sn[D / 64];
    rope_angles<D>((double)positions[t], log2_base, lane, cs, sn);
    // the angles need only the positions (the step's upload): computed before waiting (pdl.cuh)
    pdl_wait();
    STAMP(1);

    for (int h = blockIdx.y * blockDim.y + threadIdx.y; h < heads; h += gridDim.y * blockDim.y) {
        const float* x = src + h * D;
        float v[NR];
        load_head<D, NEOX>(x, lane, v);
        if (h >= hq + hkv) {                                  // v: straight into its cell
            unsigned short* dst = v_pool + (cell * hkv + (h - hq - hkv)) * D;
#pragma unroll
            for (int j = 0; j < NR; ++j) dst[feature<D, NEOX>(lane, j)] = bf16_bits(v[j]);
            continue;
        }
        const bool is_q = h < hq;
        if (QKNORM) head_norm<D, NEOX>(v, is_q ? q_norm : k_norm, eps, lane);
        rotate<D, NEOX>(v, cs, sn);
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
