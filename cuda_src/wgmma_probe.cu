// wgmma_probe.cu — the multiply side of a quantized matmul's tile alone, for bench/probe_wgmma_tile.py:
// two warpgroups, each m64 x N (N = 128 or 256) from shared memory (SS, both operands K-major in the
// 128-byte swizzle of wgmma.cuh), walking a ring of four stages of 64 values of K with no copies and
// no barriers: four wgmma a stage, a commit, a wait for the group before (the consumer loop of the
// warp-specialised kernel in bench/results/NOTES.md's nineteenth session). The stages are zeros;
// the output is only there so that nothing is optimised away. Measures how much of the tensor rate
// a tile shape allows before any operand has to arrive.
//   wgmma_ss_probe<N>  grid=(blocks,) block=(256,) dynamic shared memory 4 * (128 + N) * 128 + 1024
//   wgmma_rs_probe<kHalves>  the same with A from registers (below)
#include "attn_mma_ptx.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace probe {

// zeros in the block's `bytes` of stages from shared address base, made visible to the multiplies
__device__ __forceinline__ void zero_stages(unsigned base, unsigned bytes) {
    for (unsigned i = threadIdx.x; i < bytes / 16; i += blockDim.x)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(base + 16 * i), "r"(0u) : "memory");
    wg::fence_smem();
    __syncthreads();
}

// the thread's accumulators summed into y, so that no multiply is optimised away
template <int R>
__device__ __forceinline__ void store_sum(float* y, const float (&acc)[R][4]) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < R; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    y[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

}  // namespace probe
#endif

template <int N>
__global__ void __launch_bounds__(256, 1) wgmma_ss_probe(float* __restrict__ y, int chunks) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr unsigned kStage = (128 + N) * 128;
    const unsigned raw = amma::smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    probe::zero_stages(base, 4 * kStage);
    const int ci = threadIdx.x >> 7;
    float acc[N / 8][4];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int c = 0; c < chunks; ++c) {
        const unsigned st = base + (c & 3) * kStage;
        const unsigned long long da = wg::sw128_desc(st + ci * 64 * 128, 16, 1024);
        const unsigned long long db = wg::sw128_desc(st + 128 * 128, 16, 1024);
        wg::hold(acc);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wg::mma_ss(acc, da + 2 * ks, db + 2 * ks);
        wg::commit();
        wg::wait<1>();
    }
    wg::wait<0>();
    wg::hold(acc);
    probe::store_sum(y, acc);
#endif
}

// wgmma_rs_probe<kHalves>: mma_wg's multiply side alone: each warpgroup's A (64 rows of W) from
// registers, B 128 rows of x from a ring of four 16 KB stages, a commit and a wait for the group
// before every two k-steps; kHalves = 2: two m64n64k16 a k-step (mma_wg's), 1: one m64n128k16.
//   grid=(blocks,) block=(256,) dynamic shared memory 4 * 128 * 128 + 1024
template <int kHalves>
__global__ void __launch_bounds__(256, 1) wgmma_rs_probe(float* __restrict__ y, int chunks) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr unsigned kStage = 128 * 128;
    const unsigned raw = amma::smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    probe::zero_stages(base, 4 * kStage);
    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float (&h0)[8][4] = *reinterpret_cast<float (*)[8][4]>(&acc[0][0]);
    float (&h1)[8][4] = *reinterpret_cast<float (*)[8][4]>(&acc[8][0]);
    for (int c = 0; c < chunks; ++c) {
        const unsigned long long db = wg::sw128_desc(base + (c & 3) * kStage, 16, 1024);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
            unsigned a[4] = {(unsigned)c, (unsigned)pair, 0u, 0u};
            wg::hold(a);
            wg::hold(acc);
            wg::fence();
#pragma unroll
            for (int ks = 2 * pair; ks < 2 * pair + 2; ++ks) {
                if (kHalves == 2) {
                    wg::mma_rs<0>(h0, a, db + 2 * ks, 1);
                    wg::mma_rs<0>(h1, a, db + 2 * ks + ((64 * 128) >> 4), 1);
                } else {
                    wg::mma_rs_n128(acc, a, db + 2 * ks);
                }
            }
            wg::commit();
            wg::wait<1>();
        }
    }
    wg::wait<0>();
    wg::hold(acc);
    probe::store_sum(y, acc);
#endif
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void wgmma_rs_probe<1>(float*, int);
template __global__ void wgmma_rs_probe<2>(float*, int);
template __global__ void wgmma_ss_probe<128>(float*, int);
template __global__ void wgmma_ss_probe<256>(float*, int);
#endif
