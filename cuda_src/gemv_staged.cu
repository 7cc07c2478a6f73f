// gemv_staged.cu — y = x · Wᵀ for a few rows of x and W in one of the small-block integer types
// (Q4_0, Q4_1, Q5_0, Q8_0: 18-34 byte blocks, 2-byte aligned), with each warp's rows copied into
// shared memory first.
//
// gemv_dp4a_kernel (quant_matmul.cu) gives each lane a 32-value block of one row and reads it from
// global memory where it lies: a Q8_0 block is 34 bytes at a 2-byte boundary, so a lane makes 17
// 16-bit loads and a warp's load instruction spans ~5 cache lines; with one row a warp, a warp has
// one row (612 bytes at SmolLM2's K = 576) in flight. The LM heads of both real models are Q8_0 at
// K = 576 and 640 (30 and 178 MB), and SmolLM2's runs at ~44% of the copy bandwidth.
// Here a warp copies the R consecutive rows it computes (R * row_bytes contiguous bytes) into its own
// part of shared memory with 16-byte cp.async, coalesced, before it waits for the kernel before it
// (weights are no kernel's output, pdl.cuh), then every lane computes its blocks from shared memory
// exactly as gemv_dp4a does from global memory (Dot<QT>::load, then quant_dot.cuh's dp4a_sub_block and
// store_row_sums: the same bits; Q8_0's blocks by aligned 32-bit loads, load_q8_0).
//
// gemv_staged_kernel<QT, M, R>  grid=(ceil(N / (kWarps R)),) block=(32 kWarps,)
//   dynamic shared memory kWarps * staged_bytes(R, row_bytes) (ops/matmul.py: staged_smem)

#include "attn_mma_ptx.cuh"
#include "pdl.cuh"
#include "quant_dot.cuh"

namespace gstaged {

constexpr int kWarps = 4;

// bytes of a warp's part: its rows and up to 16 bytes before them (the first copy starts on the
// 16-byte boundary at or below the rows), rounded up to 16
__host__ __device__ constexpr long long staged_bytes(int rows, long long row_bytes) {
    return (rows * row_bytes + 16 + 15) / 16 * 16;
}

// A Q8_0 block from shared memory at a 2-byte boundary b: nine aligned 32-bit loads from the word at or
// below b (the last may reach 2 bytes past the block, never used) and each code word shifted out of
// two of them, where Dot<Q8_0>::load makes 17 16-bit loads.
// Lanes alternate between the two alignments (blocks are 34 bytes), so the choice is a select, not a
// branch. The same codes and scale, so the same sums.
__device__ __forceinline__ void load_q8_0(const unsigned char* b, int (&w)[8], float& d) {
    const unsigned off = (unsigned)__cvta_generic_to_shared(b) & 2u;   // 0: b on a word; 2: b half-way
    const unsigned* base = reinterpret_cast<const unsigned*>(b - off);
    unsigned v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = base[i];
    // codes from byte b + 2: word 0 bits 16.. (off 0) or word 1 (off 2)
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = (int)(off ? v[i + 1] : __funnelshift_r(v[i], v[i + 1], 16));
    d = gguf::half_to_float((unsigned short)(off ? v[0] >> 16 : v[0] & 0xFFFFu));
}

}  // namespace gstaged

template <class QT, int M, int R>
__global__ void __launch_bounds__(32 * gstaged::kWarps)
gemv_staged_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
                   const float* __restrict__ xs, const unsigned char* __restrict__ w, int n, int k, long long row_bytes) {
    using namespace gstaged;
    extern __shared__ __align__(16) unsigned char staged[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = (blockIdx.x * kWarps + warp) * R;
    const int rows = min(R, n - row0);                 // this warp's rows (none past n)
    unsigned char* part = staged + warp * staged_bytes(R, row_bytes);
    const int nsub = k / 32;
    // the rows' bytes [begin, end) of W, copied from the 16-byte boundary at or below begin; the
    // last piece stops at the end of W (zeros after it, nothing read past it)
    const long long begin = rows > 0 ? (long long)row0 * row_bytes : 0, end = begin + max(rows, 0) * row_bytes;
    const long long first = begin & ~15ll, total = (long long)n * row_bytes;
    const int pieces = (int)((end - first + 15) >> 4);
    for (int p = lane; p < pieces; p += 32) {
        const long long at = first + 16ll * p;
        amma::cp_async16(amma::smem_u32(part + 16 * p), w + at, (int)min(16ll, total - at));
    }
    amma::cp_commit();
    pdl_wait();
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    amma::cp_wait<0>();
    __syncwarp();                                       // every lane's pieces
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const unsigned char* srow = part + (begin - first) + r * row_bytes;
        for (int s = lane; s < nsub; s += 32) {
            int wv[8];
            float d0, d1, mw;
            if constexpr (QT::kType == gguf::Q8_0::kType) {
                load_q8_0(srow + 34 * s, wv, d0);
                d1 = d0;
                mw = 0.f;
            } else {
                gguf::Dot<QT>::load(srow, s, wv, d0, d1, mw);
            }
            dp4a_sub_block<M>(acc[r], wv, d0, d1, mw, s, xq, xd, xs, k, nsub);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) store_row_sums<M>(y, acc[r], n, row0 + r, lane, r < rows);
}

#ifdef GLIMMER_INSTANTIATE
#define STAGED(QT, M, R) \
    template __global__ void gemv_staged_kernel<gguf::QT, M, R>(float*, const int*, const float*, const float*, \
                                                                const unsigned char*, int, int, long long);
#define STAGED_R(QT, R) STAGED(QT, 1, R) STAGED(QT, 2, R) STAGED(QT, 3, R) STAGED(QT, 4, R)
#define STAGED_ALL(QT) STAGED_R(QT, 1) STAGED_R(QT, 2) STAGED_R(QT, 4) STAGED_R(QT, 8)
STAGED_ALL(Q4_0) STAGED_ALL(Q4_1) STAGED_ALL(Q5_0) STAGED_ALL(Q8_0)
#endif
