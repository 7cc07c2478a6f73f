// gemv_kq.cu — y = x · Wᵀ for a few rows of x and W in Q4_K or Q6_K, lanes laid along the blocks.
//
// x: M rows as int8 codes per 32 values (ops/q8.py), W: N rows of K values in 256-value
// super-blocks, y: (M, N) float32. Each warp computes R consecutive rows of W: its lanes form four
// groups of eight, group g takes super-blocks g, g+4, ... of every one of the R rows, and each lane
// owns 32 values of a super-block (kq_lanes.cuh). So a warp reads every weight byte once, in
// 16-byte loads where the layout allows; the x codes a lane loads serve R rows; the loads of the
// next super-block are issued before the arithmetic of this one.
// grid = (ceil(N / (R * kWarps)),) block = (32 * kWarps,)
#include "kq_lanes.cuh"

constexpr int kWarps = 4;

template <class QT, int M, int R>
__global__ void __launch_bounds__(32 * kWarps)
gemv_kq_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
               const float* __restrict__ xs, const unsigned char* __restrict__ w, int n, int k, long long row_bytes) {
    typedef gguf::Lanes<QT> L;
    const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int row0 = warp * R;
    if (row0 >= n) return;
    const int part = lane & 7;
    const int nsb = k >> 8, nsub = k >> 5;
    const unsigned char* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = w + (long long)min(row0 + r, n - 1) * row_bytes;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    int sb = lane >> 3;
    typename L::Regs cur[R];
    if (sb < nsb) {
#pragma unroll
        for (int r = 0; r < R; ++r) L::load(rows[r] + sb * L::kBytes, part, cur[r]);
    }
    while (sb < nsb) {
        const int nxt = sb + 4;
        typename L::Regs ahead[R];
        if (nxt < nsb) {
#pragma unroll
            for (int r = 0; r < R; ++r) L::load(rows[r] + nxt * L::kBytes, part, ahead[r]);
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
            typename L::X xv;
            L::load_x(xq + (long long)m * (k >> 2), xd + (long long)m * nsub, xs + (long long)m * nsub, sb, part, xv);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][m] += L::dot(cur[r], xv, part);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) cur[r] = ahead[r];
        sb = nxt;
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float a = acc[r][m];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0 && row0 + r < n) y[(long long)m * n + row0 + r] = a;
        }
}

#ifdef GLIMMER_INSTANTIATE
#define KQ(QT, M, R) template __global__ void gemv_kq_kernel<gguf::QT, M, R>( \
    float*, const int*, const float*, const float*, const unsigned char*, int, int, long long);
#define KQ_R(QT, R) KQ(QT, 1, R) KQ(QT, 2, R) KQ(QT, 4, R) KQ(QT, 8, R)
KQ_R(Q4_K, 1) KQ_R(Q4_K, 2) KQ_R(Q4_K, 4) KQ_R(Q6_K, 1) KQ_R(Q6_K, 2) KQ_R(Q6_K, 4)
KQ(Q4_K, 16, 1) KQ(Q4_K, 16, 2) KQ(Q6_K, 16, 1) KQ(Q6_K, 16, 2)
#endif
