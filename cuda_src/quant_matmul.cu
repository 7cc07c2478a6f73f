// quant_matmul.cu — y = x · Wᵀ for W in GGUF blocks, read as the file stores them.
//
// x: (M, K) float32, W: N rows of K values in blocks of type QT (quant_blocks.cuh), y: (M, N) float32.
// gemv_kernel<QT, M>    M <= 8 (decode, small batches): memory-bound; one warp per output row,
//                       each lane decodes a 32-value sub-block at a time and uses every decoded
//                       weight for all M rows of x, so each weight byte is read once.
//                       grid=(ceil(N / kRowsPerBlock),) block=(32, kRowsPerBlock)
// dequant_kernel<QT>    W -> float32 (N, K), one thread per 32-value sub-block; the large-M
//                       bucket multiplies that scratch with cuBLAS.  grid=(ceil(N*K/32 / 256),) block=(256,)
//
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.
#include "quant_blocks.cuh"

constexpr int kRowsPerBlock = 4;

// No __launch_bounds__: with it ptxas spills a register in a few K-quant instances (Q2_K, Q6_K
// at M = 6, 7) to chase occupancy; without it they fit in 72-92 registers, 5 blocks per SM.
template <class QT, int M>
__global__ void gemv_kernel(float* __restrict__ y, const float* __restrict__ x, const unsigned char* __restrict__ w,
            int n, int k, long long row_bytes) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
    const int lane = threadIdx.x;
    if (row >= n) return;
    const unsigned char* wrow = w + row * row_bytes;
    const int nsub = k / 32;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    for (int s = lane; s < nsub; s += 32) {
        float v[32];
        gguf::row_sub_block<QT>(wrow, s, v);
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float4* xs = reinterpret_cast<const float4*>(x + (long long)m * k + 32 * s);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float4 q = __ldg(xs + j);
                acc[m] = fmaf(v[4 * j], q.x, acc[m]);
                acc[m] = fmaf(v[4 * j + 1], q.y, acc[m]);
                acc[m] = fmaf(v[4 * j + 2], q.z, acc[m]);
                acc[m] = fmaf(v[4 * j + 3], q.w, acc[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float a = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) y[(long long)m * n + row] = a;
    }
}

template <class QT>
__global__ void __launch_bounds__(256)
dequant_kernel(float* __restrict__ out, const unsigned char* __restrict__ w, int n, int k, long long row_bytes) {
    const long long sub = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nsub = k / 32;
    if (sub >= (long long)n * nsub) return;
    const long long row = sub / nsub;
    const int s = (int)(sub % nsub);
    float v[32];
    gguf::row_sub_block<QT>(w + row * row_bytes, s, v);
    float4* dst = reinterpret_cast<float4*>(out + row * k + 32 * s);
#pragma unroll
    for (int j = 0; j < 8; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
}

#ifdef GLIMMER_INSTANTIATE
#define GEMV_M(QT, M) \
    template __global__ void gemv_kernel<gguf::QT, M>(float*, const float*, const unsigned char*, int, int, long long);
#define GEMV_ALL(QT) GEMV_M(QT, 1) GEMV_M(QT, 2) GEMV_M(QT, 3) GEMV_M(QT, 4) GEMV_M(QT, 5) GEMV_M(QT, 6) \
    GEMV_M(QT, 7) GEMV_M(QT, 8)                                                                     \
    template __global__ void dequant_kernel<gguf::QT>(float*, const unsigned char*, int, int, long long);
GEMV_ALL(F32) GEMV_ALL(F16) GEMV_ALL(BF16) GEMV_ALL(Q4_0) GEMV_ALL(Q4_1) GEMV_ALL(Q5_0) GEMV_ALL(Q5_1)
GEMV_ALL(Q8_0) GEMV_ALL(Q2_K) GEMV_ALL(Q3_K) GEMV_ALL(Q4_K) GEMV_ALL(Q5_K) GEMV_ALL(Q6_K)
#endif
