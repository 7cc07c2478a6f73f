// quant_mma.cu — y = x · Wᵀ on tensor cores for mid-size M, W in GGUF blocks.
//
// mma_kernel<QT, BM>   x16: (M, K) bf16 bits (x rounded once by to_bf16_kernel), W: N rows of GGUF
//                      blocks, y: (M, N) float32. A block owns BM rows of x (16, 32 or 64) and 64
//                      rows of W; per K-step of 64 every thread decodes one 32-value sub-block of W
//                      (quant_blocks.cuh traits, so every type works) to bf16 in shared memory, and
//                      4 warps run mma.sync m16n8k16 bf16 with float32 accumulators.
//                      Split-K: blockIdx.z takes K-steps [z * steps, (z + 1) * steps) and writes
//                      its partial sums to y + z * M * N; reduce_splits_kernel adds them.
//                      grid=(ceil(N / 64), ceil(M / BM), splits) block=(128,)
// reduce_splits_kernel y[i] = sum over z of partial[z][i], fixed order (deterministic).
// W is decoded once per BM rows of x, so it suits M up to a few tiles; it allocates nothing and
// calls no library, so it can be captured in a CUDA graph (cuBLAS cannot, through CuPy).
//
// Fragments of mma.m16n8k16.row.col (g = lane / 4, t = lane % 4; pairs of bf16 in 32-bit words):
//   A (16x16, row-major): a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8, B[k][n] = W[n][k]): b0 = W[n=g][k=2t..], b1 = W[g][2t+8..]
//   C (16x8 float): c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// Shared rows are padded by 8 bf16 (row stride 36 words), so the 32 lanes of a fragment load hit
// 32 different banks.
#include "bf16.cuh"
#include "quant_blocks.cuh"
#include "pdl.cuh"

namespace {

constexpr int kBN = 64;            // rows of W per block
constexpr int kBK = 64;            // values of K per step: two sub-blocks per W row
constexpr int kStride = kBK + 8;   // shared row stride in bf16
typedef unsigned int u32;

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    const u32 a = __float_as_uint(lo), b = __float_as_uint(hi);
    const u32 ra = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;      // round to nearest even
    const u32 rb = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    return ra | (rb << 16);
}

}  // namespace

template <class QT, int BM>
__global__ void __launch_bounds__(128)
mma_kernel(float* __restrict__ y, const unsigned short* __restrict__ x16, const unsigned char* __restrict__ w,
           int m, int n, int k, long long row_bytes, int steps_per_split) {
    pdl_wait();
    constexpr int WM = BM / 16;            // warps along M
    constexpr int WN = 4 / WM;             // warps along N
    constexpr int NT = kBN / 8 / WN;       // n8 tiles per warp
    __shared__ __align__(16) unsigned short xs[BM * kStride];
    __shared__ __align__(16) unsigned short ws[kBN * kStride];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * BM;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    const int k_begin = blockIdx.z * steps_per_split * kBK;
    const int k_end = min(k, k_begin + steps_per_split * kBK);
    y += (long long)blockIdx.z * m * n;
    for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
        // x tile: BM rows x 64 bf16 = 8 chunks of 16 bytes per row
        for (int c = tid; c < BM * 8; c += 128) {
            const int r = c >> 3, col = (c & 7) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (m0 + r < m && k0 + col < k_end)
                v = *reinterpret_cast<const uint4*>(x16 + (long long)(m0 + r) * k + k0 + col);
            *reinterpret_cast<uint4*>(xs + r * kStride + col) = v;
        }
        // W tile: thread -> (row, sub-block) = (tid / 2, tid % 2), decoded to bf16
        {
            const int r = tid >> 1, j = tid & 1;
            const int s = k0 / 32 + j;
            u32 packed[16];
            if (n0 + r < n && 32 * s < k_end) {
                float v[32];
                gguf::row_sub_block<QT>(w + (long long)(n0 + r) * row_bytes, s, v);
#pragma unroll
                for (int i = 0; i < 16; ++i) packed[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) packed[i] = 0u;
            }
            uint4* dst = reinterpret_cast<uint4*>(ws + r * kStride + 32 * j);
#pragma unroll
            for (int i = 0; i < 4; ++i) dst[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            const unsigned short* ar = xs + (wm * 16 + g) * kStride + kk + 2 * t;
            const u32 a0 = *reinterpret_cast<const u32*>(ar);
            const u32 a1 = *reinterpret_cast<const u32*>(ar + 8 * kStride);
            const u32 a2 = *reinterpret_cast<const u32*>(ar + 8);
            const u32 a3 = *reinterpret_cast<const u32*>(ar + 8 * kStride + 8);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const unsigned short* br = ws + (wn * (kBN / WN) + nt * 8 + g) * kStride + kk + 2 * t;
                mma_bf16(acc[nt], a0, a1, a2, a3, *reinterpret_cast<const u32*>(br),
                         *reinterpret_cast<const u32*>(br + 8));
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int col = n0 + wn * (kBN / WN) + nt * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + wm * 16 + g + 8 * h;
            if (row >= m) continue;
            float* dst = y + (long long)row * n + col;
            if (col < n) dst[0] = acc[nt][2 * h];
            if (col + 1 < n) dst[1] = acc[nt][2 * h + 1];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
reduce_splits_kernel(float* __restrict__ y, const float* __restrict__ partial, long long count, int splits) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float a = 0.f;
    for (int z = 0; z < splits; ++z) a += partial[z * count + i];
    y[i] = a;
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_BM(QT, BM) \
    template __global__ void mma_kernel<gguf::QT, BM>(float*, const unsigned short*, const unsigned char*, int, int, int, long long, int);
#define MMA_ALL(QT) MMA_BM(QT, 16) MMA_BM(QT, 32) MMA_BM(QT, 64)
MMA_ALL(F32) MMA_ALL(F16) MMA_ALL(BF16) MMA_ALL(Q4_0) MMA_ALL(Q4_1) MMA_ALL(Q5_0) MMA_ALL(Q5_1)
MMA_ALL(Q8_0) MMA_ALL(Q2_K) MMA_ALL(Q3_K) MMA_ALL(Q4_K) MMA_ALL(Q5_K) MMA_ALL(Q6_K)
#endif
