// gemv_kb.cu — y = x · Wᵀ for one or two rows of x and W in Q4_K or Q6_K, W streamed into shared
// memory by the bulk-copy engine (bulk_copy.cuh).
//
// x: M rows as int8 codes per 32 values (ops/q8.py), W: N rows of K values in 256-value
// super-blocks, y: (M, N) float32. gemv_kq.cu holds a lane's next super-block in registers, so
// the bytes an SM has in flight are bounded by its resident warps (~25 KB at five blocks of four
// warps), too few to cover DRAM's latency, and every block starts with an empty pipe; on the
// layer shapes it reaches 46-76% of the copy rate. Here one thread of each block asks for whole
// stages, S ahead, each kRows consecutive rows by kChunk super-blocks (one bulk copy per row);
// the block keeps S - 1 stages in flight with no registers held, and asks for its first S before
// it waits for the kernel before it (pdl.cuh: weights are no kernel's output). That thread is a
// warp of its own (warp W), which refills a stage once the W computing warps have each arrived on
// its `empty` barrier; they wait on its `full` one. No barrier of the whole block, so a slow warp
// holds back only the refill of the stage it is on.
//
// Blocks are persistent: block b takes row tiles b, b + G, ... (G = gridDim.x), each tile's
// chunks in turn. In a stage, warp w takes rows 2 (w & 3) and 2 (w & 3) + 1, and its four groups
// of eight lanes take super-blocks j, j + 4 W / 4, ... of the chunk, j = 4 (w >> 2) + group (W = 8:
// two a lane; W = 16: one); each lane owns 32 values of a super-block (kq_lanes.cuh, load_shared).
// x's codes are copied into shared memory once. The W / 4 warps of a pair of rows add up in
// shared memory at the tile's end, the first of them writes y.
//
// Rows and chunks must start 16-byte aligned: row_bytes % 16 == 0, true of every Q4_K matrix and of
// Q6_K when K is a multiple of 2048 (ops/matmul.py: kb_fits).
// Shared memory, dynamic: S stages of kRows * kChunk blocks, then x (M * K code bytes, M * K / 32
// d, M * K / 32 s), then 2 S mbarriers; ops/matmul.py: kb_smem_bytes (the kernel traps if given less).
// grid = (min(tiles, SMs * blocks per SM),) block = (32 * (W + 1),)
#include "bulk_copy.cuh"
#include "kq_lanes.cuh"
#include "pdl.cuh"

constexpr int kbRows = 8;       // rows of W in a stage
constexpr int kbChunk = 16;     // super-blocks of each row in a stage

__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

// the W computing warps only (the copying warp never joins): named barrier 1
template <int W>
__device__ __forceinline__ void compute_warps_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(32 * W) : "memory");
}

template <class QT, int M, int S, int W>
__global__ void __launch_bounds__(32 * (W + 1), 1)
    gemv_kb_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
                   const float* __restrict__ xs, const unsigned char* __restrict__ w, int n, int k,
                   long long row_bytes) {
    typedef gguf::Lanes<QT> L;
    static_assert(W == 8 || W == 16, "W / 4 warps share each pair of rows");
    constexpr int kShare = W / 4, kPasses = kbChunk / (4 * kShare);   // super-blocks of a chunk per lane
    constexpr int kRowBytes = kbChunk * L::kBytes, kStage = kbRows * kRowBytes;
    extern __shared__ __align__(16) unsigned char smem[];
    const int nsb = k >> 8, nsub = k >> 5, nch = (nsb + kbChunk - 1) / kbChunk;
    const int tiles = (n + kbRows - 1) / kbRows;
    const int items = (int)blockIdx.x < tiles ? ((tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * nch : 0;
    unsigned char* const stage = smem;
    unsigned char* const xq_s = smem + S * kStage;
    float* const xd_s = reinterpret_cast<float*>(xq_s + M * k);
    float* const xs_s = xd_s + M * nsub;
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(xs_s + M * nsub);
    unsigned long long* const empty = full + S;
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool copier = wib == W;
    if (threadIdx.x == 0 && dynamic_smem_size() < (unsigned)(reinterpret_cast<unsigned char*>(empty + S) - smem))
        __trap();

    // the copying warp's lane 0: item i (tile i / nch of this block, chunk i % nch) into stage i % S
    auto issue = [&](int i) {
        const int r0 = ((int)blockIdx.x + (i / nch) * (int)gridDim.x) * kbRows, c = i % nch;
        const int rows = min(kbRows, n - r0);
        const unsigned bytes = min(kbChunk, nsb - c * kbChunk) * L::kBytes;
        unsigned long long* b = full + i % S;
        mbar_expect(b, bytes * rows);
        const unsigned char* src = w + (long long)r0 * row_bytes + (long long)c * kRowBytes;
        unsigned char* dst = stage + (i % S) * kStage;
        for (int r = 0; r < rows; ++r) bulk_load(dst + r * kRowBytes, src + r * row_bytes, bytes, b);
    };
    if (copier && lane == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, W);
        }
        mbar_init_fence();
        for (int i = 0; i < min(S, items); ++i) issue(i);
    }
    pdl_wait();
    for (int i = threadIdx.x; i < M * k / 16; i += blockDim.x)
        reinterpret_cast<gguf::u32x4*>(xq_s)[i] = reinterpret_cast<const gguf::u32x4*>(xq)[i];
    for (int i = threadIdx.x; i < M * nsub; i += blockDim.x) {
        xd_s[i] = xd[i];
        xs_s[i] = xs[i];
    }
    __syncthreads();                        // x, and the barriers' initialisation, seen by all
    if (copier) {                           // refill each stage once every computing warp is done with it
        if (lane == 0)
            for (int i = S; i < items; ++i) {
                mbar_wait(empty + i % S, (i / S - 1) & 1);
                issue(i);
            }
        return;
    }

    const int part = lane & 7;
    const int pr = 2 * (wib & 3), sh = wib >> 2;        // the warp's first row of a tile, its share
    const int j0 = 4 * sh + (lane >> 3);                // its super-blocks j0 + 4 kShare p of a chunk
    __shared__ float partial[2][kShare - 1][4][2][M];   // by tile parity: a tile's sums are read
                                                        // after the next tile's may be written
    float acc[2][M];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    for (int i = 0; i < items; ++i) {
        const int s = i % S, c = i % nch;
        mbar_wait(full + s, (i / S) & 1);
        const unsigned char* st = stage + s * kStage + pr * kRowBytes;
        const int sbs = min(kbChunk, nsb - c * kbChunk);
#pragma unroll
        for (int jj = 0; jj < kPasses; ++jj) {
            const int j = j0 + 4 * kShare * jj;
            if (j < sbs) {
                typename L::Regs regs[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) L::load_shared(st + r * kRowBytes + j * L::kBytes, part, regs[r]);
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    typename L::X xv;
                    L::load_x(reinterpret_cast<const int*>(xq_s + m * k), xd_s + m * nsub, xs_s + m * nsub,
                              c * kbChunk + j, part, xv);
#pragma unroll
                    for (int r = 0; r < 2; ++r) acc[r][m] = L::accumulate(acc[r][m], regs[r], xv, part);
                }
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + s);          // this warp is done with stage s
        if (c == nch - 1) {                             // the tile's last chunk: its sums
            const int par = (i / nch) & 1;
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) {
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
                    if (lane == 0 && sh > 0) partial[par][sh - 1][wib & 3][r][m] = acc[r][m];
                }
            compute_warps_sync<W>();
            const int r0 = ((int)blockIdx.x + (i / nch) * (int)gridDim.x) * kbRows + pr;
            if (sh == 0 && lane == 0)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (r0 + r < n)
#pragma unroll
                        for (int m = 0; m < M; ++m) {
                            float v = acc[r][m];
#pragma unroll
                            for (int o = 0; o < kShare - 1; ++o) v += partial[par][o][wib][r][m];
                            y[(long long)m * n + r0 + r] = v * L::kScale;
                        }
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
        }
    }
}

#ifdef GLIMMER_INSTANTIATE
#define KB(QT, M, S, W) template __global__ void gemv_kb_kernel<gguf::QT, M, S, W>( \
    float*, const int*, const float*, const float*, const unsigned char*, int, int, long long);
#define KB_W(QT, M, S) KB(QT, M, S, 8) KB(QT, M, S, 16)
#define KB_S(QT, M) KB_W(QT, M, 2) KB_W(QT, M, 3) KB_W(QT, M, 4)
KB_S(Q4_K, 1) KB_S(Q4_K, 2) KB_S(Q6_K, 1) KB_S(Q6_K, 2)
#endif
