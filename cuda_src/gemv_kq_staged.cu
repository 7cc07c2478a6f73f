// gemv_kq_staged.cu — gemv_kq's Q4_K GEMV with every weight byte of a block copied into shared
// memory before the block waits for the kernel before it.
//
// gemv_kq_kernel (gemv_kq.cu) holds the super-block it will multiply next in registers, and only the
// first before its wait: at 55 registers an SM keeps 9 of its 128-thread blocks, so of Qwen3-8B's
// o projection (4096x4096 Q4_K, 9.4 MB, 2,048 blocks of 2 rows) 58% of the bytes are in flight
// when attention completes and the rest is asked for by blocks that start after the first ones
// leave, a second round trip to DRAM on the step's critical path. Here a block copies the bytes of
// its T row sets (T * R contiguous rows) into shared memory by 16-byte cp.async, the first `early`
// 16-byte pieces before pdl_wait and the rest right after it, all blocks of the launch resident
// at once (a matrix of up to ~20 MB: 132 SMs' shared memory), so every byte is asked for by the
// time the kernel before it completes, none by a block that starts after another leaves.
// The arithmetic is gemv_kq_body<QT, M, R, 4>'s, row set by row set: lane group g of warp w takes
// super-blocks g + 4w, g + 4w + 16, ... of each row, the 32 lanes' shares are added by the same
// butterfly and the four warps' sums in warp order, so the bits are gemv_kq_kernel<QT, M, R, 4>'s.
//
// gemv_kq_staged_kernel<QT, M, R, T>  grid=(ceil(N / (T R)),) block=(128,)
//   dynamic shared memory T * R * row_bytes (ops/matmul.py: kq_staged_smem)
#include "attn_mma_ptx.cuh"
#include "kq_lanes.cuh"
#include "pdl.cuh"

namespace kqstaged {
constexpr int kWarps = 4;        // every warp of the block shares each row set (gemv_kq's WS = 4)
}

template <class QT, int M, int R, int T>
__global__ void __launch_bounds__(32 * kqstaged::kWarps)
gemv_kq_staged_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
                      const float* __restrict__ xs, const unsigned char* __restrict__ w, int n, int k,
                      long long row_bytes, int early) {
    using namespace kqstaged;
    typedef gguf::Lanes<QT> L;
    extern __shared__ __align__(16) unsigned char staged[];
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31, part = lane & 7;
    const int row0 = blockIdx.x * T * R;
    const int rows = min(T * R, n - row0);             // this block's rows (none past n)
    // rows [row0, row0 + rows): row_bytes is a multiple of 16 (144 a super-block), W 16-byte aligned.
    // The first `early` 16-byte pieces before the wait, the rest after it: every piece in flight
    // on an SM waits in line before the loads of the kernel still running there
    const unsigned char* src = w + (long long)row0 * row_bytes;
    const int pieces = (int)(rows * row_bytes >> 4), first = min(early, pieces);
    for (int p = threadIdx.x; p < first; p += 32 * kWarps)
        amma::cp_async16(amma::smem_u32(staged + 16 * p), src + 16ll * p, 16);
    amma::cp_commit();
    pdl_wait();                         // the weights are no kernel's output: copied before it
    for (int p = first + threadIdx.x; p < pieces; p += 32 * kWarps)
        amma::cp_async16(amma::smem_u32(staged + 16 * p), src + 16ll * p, 16);
    amma::cp_commit();
    const int nsb = k >> 8, nsub = k >> 5;
    float acc[T][R][M];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) acc[t][r][m] = 0.f;
    amma::cp_wait<0>();
    __syncthreads();                    // every thread's pieces
    for (int sb = (lane >> 3) + 4 * wib; sb < nsb; sb += 4 * kWarps) {
        typename L::X xv[M];
#pragma unroll
        for (int m = 0; m < M; ++m)
            L::load_x(xq + (long long)m * (k >> 2), xd + (long long)m * nsub, xs + (long long)m * nsub, sb, part,
                      xv[m]);
#pragma unroll
        for (int t = 0; t < T; ++t)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                // a row past n reads the block's last row, as gemv_kq clamps to row n - 1; never stored
                const typename L::Row row =
                    L::row(staged + (long long)min(t * R + r, rows - 1) * row_bytes, sb, part);
                typename L::Regs cur;
                L::load(row, sb, part, cur);
                L::settle(row, part, cur);
#pragma unroll
                for (int m = 0; m < M; ++m) acc[t][r][m] = L::accumulate(acc[t][r][m], cur, xv[m], part);
            }
    }
    __shared__ float partial[kWarps][T][R][M];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < M; ++m) {
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) acc[t][r][m] += __shfl_xor_sync(0xffffffffu, acc[t][r][m], off);
                if (lane == 0) partial[wib][t][r][m] = acc[t][r][m];
            }
    __syncthreads();
    // thread i adds the four warps' sums of output i (row set t, row r, row m of x) in warp order
    for (int i = threadIdx.x; i < T * R * M; i += 32 * kWarps) {
        const int t = i / (R * M), r = i / M % R, m = i % M;
        const int row = row0 + t * R + r;
        if (row >= n) continue;
        float s = partial[0][t][r][m];
#pragma unroll
        for (int j = 1; j < kWarps; ++j) s += partial[j][t][r][m];
        y[(long long)m * n + row] = s * L::kScale;
    }
}

#ifdef GLIMMER_INSTANTIATE
#define KQ_STAGED(M, T) template __global__ void gemv_kq_staged_kernel<gguf::Q4_K, M, 2, T>( \
    float*, const int*, const float*, const float*, const unsigned char*, int, int, long long, int);
KQ_STAGED(1, 2) KQ_STAGED(1, 4) KQ_STAGED(1, 8) KQ_STAGED(1, 16)
KQ_STAGED(2, 2) KQ_STAGED(2, 4) KQ_STAGED(2, 8)
#endif
