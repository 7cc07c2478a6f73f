// gemv_kq.cu — y = x · Wᵀ for a few rows of x and W in Q4_K or Q6_K, lanes laid along the blocks.
//
// x: M rows as int8 codes per 32 values (ops/q8.py), W: N rows of K values in 256-value
// super-blocks, y: (M, N) float32. Each warp computes R consecutive rows of W: its lanes form four
// groups of eight, group g takes super-blocks g, g+4, ... of every one of the R rows, and each lane
// owns 32 values of a super-block (kq_lanes.cuh). So a warp reads every weight byte once, in
// 16-byte loads where the layout allows; the x codes a lane loads serve R rows; the loads of the
// next super-block are issued before the arithmetic of this one (once the lane has settled this
// one's bytes), and the first ones before the kernel waits for the one before it (pdl.cuh).
// grid = (ceil(N / (R * kWarps / WS)),) block = (32 * kWarps,)
#include "kq_lanes.cuh"
#include "pdl.cuh"

constexpr int kWarps = 4;

// WS warps share each set of R rows, splitting its super-blocks between them (the block's four
// warps hold 4 / WS row sets): a short row (K = 4096 is 16 super-blocks) then costs each warp one
// round trip to memory instead of four, which is what a small matrix's time is made of.
template <class QT, int M, int R, int WS>
__device__ __forceinline__ void gemv_kq_body(float* __restrict__ y, const int* __restrict__ xq,
                                             const float* __restrict__ xd, const float* __restrict__ xs,
                                             const unsigned char* __restrict__ w, int n, int k, long long row_bytes,
                                             int bx) {
    static_assert(kWarps % WS == 0, "WS divides the block's warps");
    typedef gguf::Lanes<QT> L;
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (bx * (kWarps / WS) + wib / WS) * R;   // bx: this block among the matrix's
    const int part = lane & 7;
    const int nsb = k >> 8, nsub = k >> 5;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    if (row0 < n) {
        const int stride = 4 * WS;
        int sb = (lane >> 3) + 4 * (wib % WS);
        typename L::Row rows[R];
#pragma unroll
        for (int r = 0; r < R; ++r) rows[r] = L::row(w + (long long)min(row0 + r, n - 1) * row_bytes, sb, part);
        typename L::Regs cur[R];
        if (sb < nsb) {
#pragma unroll
            for (int r = 0; r < R; ++r) L::load(rows[r], sb, part, cur[r]);
        }
        pdl_wait();                     // the weights are no kernel's output: fetched before it
        while (sb < nsb) {
            const int nxt = sb + stride;
            typename L::Regs ahead[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                L::settle(rows[r], part, cur[r]);
                L::next(rows[r], stride);
                L::load(rows[r], nxt, part, ahead[r], nxt < nsb);
            }
#pragma unroll
            for (int m = 0; m < M; ++m) {
                typename L::X xv;
                L::load_x(xq + (long long)m * (k >> 2), xd + (long long)m * nsub, xs + (long long)m * nsub, sb,
                          part, xv);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][m] = L::accumulate(acc[r][m], cur[r], xv, part);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) cur[r] = ahead[r];
            sb = nxt;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
    if (WS > 1) {                                     // the set's first warp adds the others' sums
        __shared__ float partial[kWarps][R][M];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) partial[wib][r][m] = acc[r][m];
        __syncthreads();
        if (wib % WS) return;
#pragma unroll
        for (int j = 1; j < WS; ++j)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < M; ++m) acc[r][m] += partial[wib + j][r][m];
    }
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (row0 + r < n)
#pragma unroll
                for (int m = 0; m < M; ++m) y[(long long)m * n + row0 + r] = acc[r][m] * L::kScale;
}

#define GEMV_KQ_ARGS                                                                                         \
    float *__restrict__ y, const int *__restrict__ xq, const float *__restrict__ xd, const float *__restrict__ xs, \
        const unsigned char *__restrict__ w, int n, int k, long long row_bytes

template <class QT, int M, int R, int WS>
__global__ void __launch_bounds__(32 * kWarps) gemv_kq_kernel(GEMV_KQ_ARGS) {
    gemv_kq_body<QT, M, R, WS>(y, xq, xd, xs, w, n, k, row_bytes, blockIdx.x);
}

// The same GEMV compiled for at least B blocks per SM (Q6_K at M = 1 and B = 5: 96 registers instead of 72):
// ptxas then schedules the loads differently and more of the row's bytes are in flight. A kernel
// of its own, since any launch bound on gemv_kq_kernel changes the code of every instance; used
// where ops/matmul.py's KQ_OCCUPANCY says.
template <class QT, int M, int R, int WS, int B>
__global__ void __launch_bounds__(32 * kWarps, B) gemv_kq_occ_kernel(GEMV_KQ_ARGS) {
    gemv_kq_body<QT, M, R, WS>(y, xq, xd, xs, w, n, k, row_bytes, blockIdx.x);
}

// Two matrices that read the same x at M = 1 and have different types (Q4_K_M's q|k in Q4_K beside
// a v in Q6_K), in one launch: blocks below blocks_a compute A's rows into y[0, na), the others B's
// into y[na, na + nb), each as gemv_kq_kernel<QA or QB, 1, R, WS> does (the same bits at the same WS,
// whatever R). One kernel boundary less than a GEMV each; one register count for both bodies, so a
// large pair gives its Q6_K part fewer rows a warp (ops/matmul.py: KQ_PAIR_ROWS). grid = (blocks_a + blocks_b,)
template <class QA, int RA, int WSA, class QB, int RB, int WSB>
__global__ void __launch_bounds__(32 * kWarps) gemv_kq_pair_kernel(
    float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd, const float* __restrict__ xs,
    const unsigned char* __restrict__ wa, int na, long long row_bytes_a, int blocks_a,
    const unsigned char* __restrict__ wb, int nb, long long row_bytes_b, int k) {
    if ((int)blockIdx.x < blocks_a)
        gemv_kq_body<QA, 1, RA, WSA>(y, xq, xd, xs, wa, na, k, row_bytes_a, blockIdx.x);
    else
        gemv_kq_body<QB, 1, RB, WSB>(y + na, xq, xd, xs, wb, nb, k, row_bytes_b, blockIdx.x - blocks_a);
}

#ifdef GLIMMER_INSTANTIATE
#define KQ(QT, M, R, WS) template __global__ void gemv_kq_kernel<gguf::QT, M, R, WS>( \
    float*, const int*, const float*, const float*, const unsigned char*, int, int, long long);
#define KQ_WS(QT, M, R) KQ(QT, M, R, 1) KQ(QT, M, R, 2) KQ(QT, M, R, 4)
#define KQ_R(QT, R) KQ_WS(QT, 1, R) KQ_WS(QT, 2, R) KQ_WS(QT, 4, R) KQ_WS(QT, 8, R)
KQ_R(Q4_K, 1) KQ_R(Q4_K, 2) KQ_R(Q4_K, 4) KQ_R(Q6_K, 1) KQ_R(Q6_K, 2) KQ_R(Q6_K, 4)
KQ_R(Q6_KP, 1) KQ_R(Q6_KP, 2) KQ_R(Q6_KP, 4)
KQ_WS(Q4_K, 16, 1) KQ_WS(Q4_K, 16, 2) KQ_WS(Q6_K, 16, 1) KQ_WS(Q6_K, 16, 2)
#define KQ_OCC(QT, M, B) KQ_OCC1(QT, M, 1, B) KQ_OCC1(QT, M, 2, B) KQ_OCC1(QT, M, 4, B)
#define KQ_OCC1(QT, M, WS, B) template __global__ void gemv_kq_occ_kernel<gguf::QT, M, 2, WS, B>( \
    float*, const int*, const float*, const float*, const unsigned char*, int, int, long long);
KQ_OCC(Q6_K, 1, 5) KQ_OCC(Q4_K, 1, 5)
#define KQ_PAIR(QA, RA, WSA, QB, RB, WSB) template __global__ void gemv_kq_pair_kernel<gguf::QA, RA, WSA, gguf::QB, RB, \
    WSB>(float*, const int*, const float*, const float*, const unsigned char*, int, long long, int, \
         const unsigned char*, int, long long, int);
#define KQ_PAIR_B(QA, RA, WSA, QB, RB) KQ_PAIR(QA, RA, WSA, QB, RB, 1) KQ_PAIR(QA, RA, WSA, QB, RB, 2) \
    KQ_PAIR(QA, RA, WSA, QB, RB, 4)
#define KQ_PAIR_AB(QA, RA, QB, RB) KQ_PAIR_B(QA, RA, 1, QB, RB) KQ_PAIR_B(QA, RA, 2, QB, RB) KQ_PAIR_B(QA, RA, 4, QB, RB)
KQ_PAIR_AB(Q4_K, 2, Q6_K, 4) KQ_PAIR_AB(Q6_K, 4, Q4_K, 2)
KQ_PAIR_AB(Q4_K, 2, Q6_K, 2) KQ_PAIR_AB(Q6_K, 2, Q4_K, 2) KQ_PAIR_AB(Q4_K, 2, Q6_K, 1) KQ_PAIR_AB(Q6_K, 1, Q4_K, 2)
KQ_PAIR_AB(Q4_K, 2, Q6_KP, 4) KQ_PAIR_AB(Q4_K, 2, Q6_KP, 2) KQ_PAIR_AB(Q4_K, 2, Q6_KP, 1)
KQ_PAIR_AB(Q6_KP, 4, Q4_K, 2) KQ_PAIR_AB(Q6_KP, 2, Q4_K, 2) KQ_PAIR_AB(Q6_KP, 1, Q4_K, 2)
#endif
