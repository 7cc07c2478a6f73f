// mma_kq.cu — y = x · Wᵀ for 9..32 rows of x and W in Q4_K, on int8 tensor cores.
//
// x: M rows as int8 codes per 32 values (ops/q8.py), W: N rows of Q4_K blocks, y: (M, N) float32.
// One block computes 8 * kNT rows of W (n-tiles of 8) for every row of x; its kMmaWarps warps split
// the super-blocks. Per 32-value sub-block, mma.sync.m16n8k32 (s8) multiplies 16 rows of x's codes
// by 8 weight rows' 4-bit codes (fragments: mma_kq_frag.cuh); the int32 result is scaled into float
// accumulators by xd * (d * sc), less dmin * m * xs for the block minimum. The warps' sums are
// added in shared memory in a fixed order (no atomics: graph replay must equal an eager run).
// grid = (ceil(N / (8 * NTiles<MT>)),) block = (32 * kMmaWarps,)
//
// Status: compiled and checked for spills here, its fragments checked on the CPU; not yet run on a
// GPU, and not in quant_matmul's bucket table (force_bucket="mma_kq" only).
#include "mma_kq_frag.cuh"
#include "pdl.cuh"

constexpr int kMmaWarps = 8;
// n-tiles of 8 weight rows per block: 4 for one m-tile; 2 for two, within the registers
template <int MT> struct NTiles { static constexpr int value = MT == 1 ? 4 : 2; };

__device__ __forceinline__ void mma_s8(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                       unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

template <int MT>                            // m-tiles of 16 rows of x: M <= 16 * MT
__global__ void __launch_bounds__(32 * kMmaWarps)
mma_kq_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
              const float* __restrict__ xs, const unsigned char* __restrict__ w, int m, int n, int k,
              long long row_bytes) {
    pdl_wait();
    using namespace gguf;
    constexpr int kNT = NTiles<MT>::value;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 8 * kNT;
    const int nsb = k >> 8, nsub = k >> 5;
    // this lane's weight rows (column g of each n-tile) and x rows (g and g + 8 of each m-tile);
    // rows past the end repeat the last one and their outputs are not stored
    const u8* wrow[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) wrow[nt] = w + (long long)min(n0 + 8 * nt + g, n - 1) * row_bytes;
    int xrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        xrow[mt][0] = min(16 * mt + g, m - 1);
        xrow[mt][1] = min(16 * mt + g + 8, m - 1);
    }
    float acc[kNT][MT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[nt][mt][r] = 0.f;

    for (int sb = warp; sb < nsb; sb += kMmaWarps) {
        u32x4 hd[kNT];
        u32x2 bw[kNT][4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            hd[nt] = load16(wrow[nt] + (long long)sb * 144);
#pragma unroll
            for (int c = 0; c < 4; ++c) bw[nt][c] = mma_q4k_b_words(wrow[nt], sb, c, t);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            // the scales of this lane's rows, moved to the lanes whose C columns they are (2t, 2t+1)
            float ds[kNT][2], dm[kNT][2];
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
                const f32x2 s = mma_q4k_scale(hd[nt], j);
                ds[nt][0] = __shfl_sync(0xffffffffu, s.x, 8 * t);
                dm[nt][0] = __shfl_sync(0xffffffffu, s.y, 8 * t);
                ds[nt][1] = __shfl_sync(0xffffffffu, s.x, 8 * t + 4);
                dm[nt][1] = __shfl_sync(0xffffffffu, s.y, 8 * t + 4);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int ra = xrow[mt][0], rb = xrow[mt][1];
                const u32x2 xa = mma_x_words(xq + (long long)ra * (k >> 2), sb, j, t);
                const u32x2 xb = mma_x_words(xq + (long long)rb * (k >> 2), sb, j, t);
                const long long ia = (long long)ra * nsub + sb * 8 + j, ib = (long long)rb * nsub + sb * 8 + j;
                const float xda = xd[ia], xdb = xd[ib], xsa = xs[ia], xsb = xs[ib];
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
                    const u32x2 b = mma_q4k_b_frag(bw[nt][j >> 1], j & 1);
                    int c[4];
                    mma_s8(c, xa.x, xb.x, xa.y, xb.y, b.x, b.y);
                    acc[nt][mt][0] += xda * ds[nt][0] * (float)c[0] - dm[nt][0] * xsa;
                    acc[nt][mt][1] += xda * ds[nt][1] * (float)c[1] - dm[nt][1] * xsa;
                    acc[nt][mt][2] += xdb * ds[nt][0] * (float)c[2] - dm[nt][0] * xsb;
                    acc[nt][mt][3] += xdb * ds[nt][1] * (float)c[3] - dm[nt][1] * xsb;
                }
            }
        }
    }

    constexpr int kVals = kNT * MT * 4;
    __shared__ float part[kMmaWarps][kVals][32];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 4; ++r) part[warp][(nt * MT + mt) * 4 + r][lane] = acc[nt][mt][r];
    __syncthreads();
    for (int i = warp; i < kVals; i += kMmaWarps) {
        float s = 0.f;
#pragma unroll
        for (int wi = 0; wi < kMmaWarps; ++wi) s += part[wi][i][lane];
        const int nt = i / (MT * 4), mt = (i / 4) % MT, r = i % 4;
        const int row = 16 * mt + g + (r >= 2 ? 8 : 0), col = n0 + 8 * nt + 2 * t + (r & 1);
        if (row < m && col < n) y[(long long)row * n + col] = s;
    }
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void mma_kq_kernel<1>(float*, const int*, const float*, const float*, const unsigned char*, int,
                                          int, int, long long);
template __global__ void mma_kq_kernel<2>(float*, const int*, const float*, const float*, const unsigned char*, int,
                                          int, int, long long);
#endif
