// quant_matmul.cu — y = x · Wᵀ for W in GGUF blocks, read as the file stores them.
//
// x: (M, K) float32, W: N rows of K values in blocks of type QT (quant_blocks.cuh), y: (M, N) float32.
// quantize_x_kernel     x -> int8 per 32 values (xq, xd = max|x| / 127, xs = xd * sum(xq)), one thread
//                       per 32 values.  grid=(ceil(M*K/32 / 256),) block=(256,)
// gemv_dp4a_kernel<QT, M>  M <= 16, types with an integer path (quant_dot.cuh): one warp per output
//                       row, each lane a 32-value sub-block at a time: eight dp4a per row of x,
//                       one float fma per 32 values.  grid=(ceil(N / kRowsPerBlock),) block=(32, kRowsPerBlock)
// gemv_kernel<QT, M>    M <= 8, every type, float math: one warp per output row,
//                       each lane decodes a 32-value sub-block at a time and uses every decoded
//                       weight for all M rows of x, so each weight byte is read once.
//                       grid=(ceil(N / kRowsPerBlock),) block=(32, kRowsPerBlock)
// dequant_kernel<QT, OUT>  W -> float32 or bfloat16 (N, K), one thread per 32-value sub-block; the
//                       large-M bucket multiplies the bf16 scratch with cuBLAS (tensor cores).
//                       grid=(ceil(N*K/32 / 256),) block=(256,); out 16-byte aligned
// dequant_lanes_kernel<QT, OUT>  the same for Q6_K and Q6_KP, the same bits, eight lanes a super-block.
//                       grid=(ceil(N*K/256 * 8 / 256),) block=(256,); out 16-byte aligned
// to_bf16_kernel        x float32 -> bfloat16, 8 values per thread.  grid=(ceil(n/8 / 256),) block=(256,)
//
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.
#include "kq_lanes.cuh"
#include "pdl.cuh"
#include "quant_dot.cuh"

constexpr int kRowsPerBlock = 4;
typedef unsigned int u32;

// No __launch_bounds__: with it ptxas spills a register in a few K-quant instances (Q2_K, Q6_K
// at M = 6, 7) to chase occupancy; without it they fit in 72-92 registers, 5 blocks per SM.
template <class QT, int M>
__global__ void gemv_kernel(float* __restrict__ y, const float* __restrict__ x, const unsigned char* __restrict__ w,
            int n, int k, long long row_bytes) {
    pdl_wait();
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
    store_row_sums<M>(y, acc, n, row, lane);
}

// float -> bfloat16 bits, round to nearest even (finite inputs; no header needed under NVRTC)
__device__ __forceinline__ unsigned short bf16_bits(float f) {
    const u32 b = __float_as_uint(f);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// 8 values as 16-byte stores: two of float, one of bf16 bits
template <typename OUT> struct Store8;
template <> struct Store8<float> {
    __device__ static void run(float* dst, const float* v) {
        float4* d = reinterpret_cast<float4*>(dst);
        d[0] = make_float4(v[0], v[1], v[2], v[3]);
        d[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
};
template <> struct Store8<unsigned short> {
    __device__ static void run(unsigned short* dst, const float* v) {
        u32 p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = (u32)bf16_bits(v[2 * i]) | ((u32)bf16_bits(v[2 * i + 1]) << 16);
        *reinterpret_cast<uint4*>(dst) = make_uint4(p[0], p[1], p[2], p[3]);
    }
};

template <class QT, typename OUT>
__global__ void __launch_bounds__(256)
dequant_kernel(OUT* __restrict__ out, const unsigned char* __restrict__ w, int n, int k, long long row_bytes) {
    pdl_wait();
    const long long sub = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nsub = k / 32;
    if (sub >= (long long)n * nsub) return;
    const long long row = sub / nsub;
    const int s = (int)(sub % nsub);
    float v[32];
    gguf::row_sub_block<QT>(w + row * row_bytes, s, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) Store8<OUT>::run(out + row * k + 32 * s + 8 * j, v + 8 * j);
}

// Q6_K (GGUF or pair order): eight lanes a super-block, each decoding its 32 values from the pieces
// gemv_kq's lanes load (kq_lanes.cuh: Lanes<QT>), so one 16-byte store a run of 8 values and a few
// wide loads a lane, where dequant_kernel's thread reads its sub-block a byte at a time
template <class QT, typename OUT>
__global__ void __launch_bounds__(256)
dequant_lanes_kernel(OUT* __restrict__ out, const unsigned char* __restrict__ w, int n, int k, long long row_bytes) {
    pdl_wait();
    typedef gguf::Lanes<QT> L;
    const long long item = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 3;   // (row, super-block)
    const int part = (int)(threadIdx.x & 7u), nsb = k / 256;
    if (item >= (long long)n * nsb) return;
    const long long row = item / nsb;
    const int sb = (int)(item % nsb);
    const typename L::Row at = L::row(w + row * row_bytes, sb, part);
    typename L::Regs r;
    L::load(at, sb, part, r);
    L::settle(at, part, r);
    float v[4][8];
    L::weights(r, v);
    OUT* dst = out + row * k + 256 * sb + 128 * (part >> 2) + 8 * (part & 3);
#pragma unroll
    for (int t = 0; t < 4; ++t) Store8<OUT>::run(dst + 32 * t, v[t]);
}

__global__ void __launch_bounds__(256)
to_bf16_kernel(unsigned short* __restrict__ out, const float* __restrict__ x, long long n8) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    const float4 a = reinterpret_cast<const float4*>(x)[2 * i], b = reinterpret_cast<const float4*>(x)[2 * i + 1];
    reinterpret_cast<uint4*>(out)[i] = make_uint4((u32)bf16_bits(a.x) | ((u32)bf16_bits(a.y) << 16),
                                                  (u32)bf16_bits(a.z) | ((u32)bf16_bits(a.w) << 16),
                                                  (u32)bf16_bits(b.x) | ((u32)bf16_bits(b.y) << 16),
                                                  (u32)bf16_bits(b.z) | ((u32)bf16_bits(b.w) << 16));
}

// 32 values of x -> 32 int8 codes (8 words), d = max|x| / 127 and s = d * sum(codes)
__device__ __forceinline__ void quantize32(const float* __restrict__ x, int* __restrict__ q, float& d, float& s) {
    const float4* src = reinterpret_cast<const float4*>(x);
    float v[32];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float4 a = src[j];
        v[4 * j] = a.x; v[4 * j + 1] = a.y; v[4 * j + 2] = a.z; v[4 * j + 3] = a.w;
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
    }
    d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    int packed[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        u32 word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int c = __float2int_rn(v[4 * j + b] * inv);
            sum += c;
            word |= (u32)(c & 0xFF) << (8 * b);
        }
        packed[j] = (int)word;
    }
    int4* dst = reinterpret_cast<int4*>(q);
    dst[0] = make_int4(packed[0], packed[1], packed[2], packed[3]);
    dst[1] = make_int4(packed[4], packed[5], packed[6], packed[7]);
    s = d * (float)sum;
}

__global__ void __launch_bounds__(256)
quantize_x_kernel(int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs,
                  const float* __restrict__ x, long long nblocks) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    quantize32(x + 32 * i, xq + 8 * i, xd[i], xs[i]);
}

// One pass of the dp4a GEMV over the sub-blocks s0 and s0 + 32 (when `two`) of a row whose
// codes are already in registers: acc[m] += the row's dot product with row m of x.
template <int M>
__device__ __forceinline__ void dp4a_pass(float* acc, const int (&wv)[2][8], const float* d0, const float* d1,
                                          const float* mw, int s0, bool two, const int* xq, const float* xd,
                                          const float* xs, int k, int nsub) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        if (u == 1 && !two) break;
        dp4a_sub_block<M>(acc, wv[u], d0[u], d1[u], mw[u], s0 + 32 * u, xq, xd, xs, k, nsub);
    }
}

// The codes and scales of sub-blocks s0 and s0 + 32 of a row into registers.
template <class QT>
__device__ __forceinline__ void dp4a_load(const unsigned char* wrow, int s0, bool two, int (&wv)[2][8],
                                          float* d0, float* d1, float* mw) {
    gguf::Dot<QT>::load(wrow, s0, wv[0], d0[0], d1[0], mw[0]);
    if (two) gguf::Dot<QT>::load(wrow, s0 + 32, wv[1], d0[1], d1[1], mw[1]);
}

template <class QT, int M>
__global__ void gemv_dp4a_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
                                 const float* __restrict__ xs, const unsigned char* __restrict__ w,
                                 int n, int k, long long row_bytes) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.y;
    const int lane = threadIdx.x;
    if (row >= n) return;
    const unsigned char* wrow = w + row * row_bytes;
    const int nsub = k / 32;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    // two sub-blocks per lane per pass, both loaded before any math: twice the bytes in flight;
    // the first pass's weights (no kernel's output) are fetched before waiting (pdl.cuh)
    int wv[2][8];
    float d0[2], d1[2], mw[2];
    if (lane < nsub) dp4a_load<QT>(wrow, lane, lane + 32 < nsub, wv, d0, d1, mw);
    pdl_wait();
    for (int s0 = lane; s0 < nsub; s0 += 64) {
        const bool two = s0 + 32 < nsub;
        if (s0 != lane) dp4a_load<QT>(wrow, s0, two, wv, d0, d1, mw);
        dp4a_pass<M>(acc, wv, d0, d1, mw, s0, two, xq, xd, xs, k, nsub);
    }
    store_row_sums<M>(y, acc, n, row, lane);
}

#ifdef GLIMMER_INSTANTIATE
#define GEMV_M(QT, M) \
    template __global__ void gemv_kernel<gguf::QT, M>(float*, const float*, const unsigned char*, int, int, long long);
#define GEMV_ALL(QT) GEMV_M(QT, 1) GEMV_M(QT, 2) GEMV_M(QT, 3) GEMV_M(QT, 4) GEMV_M(QT, 5) GEMV_M(QT, 6) \
    GEMV_M(QT, 7) GEMV_M(QT, 8)                                                                     \
    template __global__ void dequant_kernel<gguf::QT, float>(float*, const unsigned char*, int, int, long long); \
    template __global__ void dequant_kernel<gguf::QT, unsigned short>(unsigned short*, const unsigned char*, int, int, long long);
#define DP4A_M(QT, M) \
    template __global__ void gemv_dp4a_kernel<gguf::QT, M>(float*, const int*, const float*, const float*, \
                                                           const unsigned char*, int, int, long long);
#define DP4A_ALL(QT) DP4A_M(QT, 1) DP4A_M(QT, 2) DP4A_M(QT, 3) DP4A_M(QT, 4) DP4A_M(QT, 5) DP4A_M(QT, 6) \
    DP4A_M(QT, 7) DP4A_M(QT, 8) DP4A_M(QT, 9) DP4A_M(QT, 10) DP4A_M(QT, 11) DP4A_M(QT, 12)            \
    DP4A_M(QT, 13) DP4A_M(QT, 14) DP4A_M(QT, 15) DP4A_M(QT, 16)
DP4A_ALL(Q4_0) DP4A_ALL(Q4_1) DP4A_ALL(Q5_0) DP4A_ALL(Q8_0) DP4A_ALL(Q4_K) DP4A_ALL(Q5_K) DP4A_ALL(Q6_K)
GEMV_ALL(F32) GEMV_ALL(F16) GEMV_ALL(BF16) GEMV_ALL(Q4_0) GEMV_ALL(Q4_1) GEMV_ALL(Q5_0) GEMV_ALL(Q5_1)
GEMV_ALL(Q8_0) GEMV_ALL(Q2_K) GEMV_ALL(Q3_K) GEMV_ALL(Q4_K) GEMV_ALL(Q5_K) GEMV_ALL(Q6_K)
// Q6_K in pair order (quant_blocks.cuh): dequantized only (ops/matmul.py: dequantize, dequant_cublas)
template __global__ void dequant_kernel<gguf::Q6_KP, float>(float*, const unsigned char*, int, int, long long);
template __global__ void dequant_kernel<gguf::Q6_KP, unsigned short>(unsigned short*, const unsigned char*, int, int, long long);
#define DEQUANT_LANES(QT) \
    template __global__ void dequant_lanes_kernel<gguf::QT, float>(float*, const unsigned char*, int, int, long long); \
    template __global__ void dequant_lanes_kernel<gguf::QT, unsigned short>(unsigned short*, const unsigned char*, int, int, long long);
DEQUANT_LANES(Q6_K) DEQUANT_LANES(Q6_KP)
#endif
