// mma_dq.cu — y = x · Wᵀ for 1..32 rows of x and W in Q4_K, on bf16 tensor cores, W decoded in registers.
//
// mma_dq_kernel<NT, KS>  x: (M, K) float32, M <= 8 NT; W: N rows of Q4_K blocks (144 bytes a 256-value
//                        super-block, rows 16-byte aligned); y: (M, N) float32.
//   grid = (ceil(N / 256), KS), clusters of (1, KS, 1), block = (256,), dynamic shared memory
//   kChunk * NT * kStage bytes.
//
// Why bf16 and not int8: the int8 kernel (mma_kq.cu) scales every 32-value sub-block's int32 sums
// into float, per row and per row of x, and that epilogue, not the memory, is what bounded it at
// M = 16 (~2.3x the M = 1 time). Here each weight is decoded once to bf16 with its sub-block scale
// already applied — (128 + q) * S - 128 * S is one bf16x2 FMA a pair, exact up to the final
// rounding since 128 * S is exact in bf16 — and the tensor cores accumulate the whole of K in
// float32. The mins (-dmin * m per sub-block) would cost an FMA per value; instead they are a
// sixteen-deep product of their own, -M[row][slot] * sum(x)[slot][col], one more mma a super-block
// on the same accumulators, its sixteen slots the (sub-block, half) pairs the lanes hold.
//
// Fragments of mma.m16n8k16.row.col (g = lane / 4, t = lane % 4): A = 16 rows of W by 16 values of
// K, B = those 16 values by 8 rows of x. The sum over K does not care how K is ordered inside a
// super-block, so each lane's A values are the ones it can load: lane t takes qs bytes
// [16t, 16t + 16) and [64 + 16t, 64 + 16t + 16) of rows g and g + 8, i.e. for h = 0, 1 the values
// e0 .. e0 + 15 (e0 = 16 (t & 1)) of sub-blocks 2 c_h (low nibbles) and 2 c_h + 1 (high nibbles),
// c_h = 2 h + t / 2. Word i (bytes 4i..4i+3) of half h gives k-steps s = 8h + 2i + u, u = 0 (low
// nibbles) and 1 (high): a0 / a2 = row g's values 4i, 4i+2 / 4i+1, 4i+3 (a1 / a3: row g + 8).
// x is staged in shared memory in the same order, converted to bf16 once per block: for
// (super-block, h, i, n-tile, lane) one uint4 = b0, b1 of k-step u = 0, then of u = 1, so a lane's
// B fragments for two k-steps are one conflict-free 16-byte load.
//
// A block is 8 warps, each two m-tiles (32 rows of W), so the x it stages serves 256 rows. K is
// split over the KS blocks of a cluster; each adds the others' partial sums from their shared
// memory in rank order (deterministic: a graph replay gives the bits of an eager call). Weights
// stream once, past L1; the lines of the super-block after next are asked into L2 while this one
// is computed, so a warp's own loads find them on chip.
#include "bf16.cuh"
#include "cluster.cuh"
#include "pdl.cuh"
#include "q4k_lanes.cuh"
#include "quant_blocks.cuh"

namespace dq {

typedef unsigned int u32;
constexpr int kWarps = 8;
constexpr int kRows = 32 * kWarps;        // rows of W per block
constexpr int kChunk = 2;                 // super-blocks of x staged at once
constexpr int kStageB = 8 * 32 * 16;      // B fragments of one super-block and n-tile
constexpr int kStage = kStageB + 32 * 8;  // and the min fragments: 4352 bytes
constexpr int kAhead = 2;                 // super-blocks of W asked into L2 ahead of the loads

// Stage super-blocks [sb0, sb0 + count) of x (every n-tile) into `stage` as the header describes;
// rows of x past m are zeros.
template <int NT>
__device__ __forceinline__ void stage_x(unsigned char* stage, const float* __restrict__ x, int m, int k, int sb0,
                                        int count) {
    const int items = count * NT * 64;
    for (int it = threadIdx.x; it < items; it += 32 * kWarps) {
        const int lane = it & 31, h = (it >> 5) & 1, nt = (it >> 6) % NT, sbl = (it >> 6) / NT;
        const int g = lane >> 2, t = lane & 3, tok = 8 * nt + g;
        unsigned char* base = stage + (sbl * NT + nt) * kStage;
        uint4* bf = reinterpret_cast<uint4*>(base) + (4 * h) * 32 + lane;
        u32* mn = reinterpret_cast<u32*>(base + kStageB) + 2 * lane + h;
        if (tok >= m) {
#pragma unroll
            for (int i = 0; i < 4; ++i) bf[i * 32] = make_uint4(0, 0, 0, 0);
            *mn = 0;
            continue;
        }
        const float* src = x + (long long)tok * k + 256 * (sb0 + sbl) + 32 * (2 * (2 * h + (t >> 1))) + 16 * (t & 1);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float4 a = *reinterpret_cast<const float4*>(src + 4 * i);        // sub-block 2 c_h
            const float4 b = *reinterpret_cast<const float4*>(src + 32 + 4 * i);   // sub-block 2 c_h + 1
            s0 += (a.x + a.y) + (a.z + a.w);
            s1 += (b.x + b.y) + (b.z + b.w);
            bf[i * 32] = make_uint4(pack2(a.x, a.z), pack2(a.y, a.w), pack2(b.x, b.z), pack2(b.y, b.w));
        }
        *mn = pack2(s0, s1);
    }
}

}  // namespace dq

// two blocks an SM up to 16 rows of x; three or four n-tiles need more than 128 registers
template <int NT, int KS>
__global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(32 * dq::kWarps, NT <= 2 ? 2 : 1)
mma_dq_kernel(float* __restrict__ y, const float* __restrict__ x, const unsigned char* __restrict__ w, int m, int n,
              int k, long long row_bytes) {
    using namespace dq;
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nsb = k >> 8, per = (nsb + KS - 1) / KS;
    const int sb_begin = min(nsb, (int)blockIdx.y * per), sb_end = min(nsb, sb_begin + per);
    const int row_base = blockIdx.x * kRows + 32 * warp;

    const unsigned char* rows[2][2];          // [m-tile][rr]: rows g and g + 8 of the tile
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
            rows[mt][rr] = w + (long long)min(row_base + 16 * mt + 8 * rr + g, n - 1) * row_bytes;
    // the L2 requests: lane l covers row l of the warp's 32, the 144 bytes' first and last lines
    const unsigned char* pf_row = w + (long long)min(row_base + lane, n - 1) * row_bytes;

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

    RowBytes cur[2][2];
    if (sb_begin < sb_end) {
#pragma unroll
        for (int a = 1; a <= kAhead; ++a)
            if (sb_begin + a < sb_end) {
                prefetch_l2(pf_row + (sb_begin + a) * kBlockBytes);
                prefetch_l2(pf_row + (sb_begin + a) * kBlockBytes + kBlockBytes - 1);
            }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) load_row(cur[mt][rr], rows[mt][rr] + sb_begin * kBlockBytes, t);
    }
    pdl_wait();                                   // x is the kernel before's output; W is no kernel's

    for (int c0 = sb_begin; c0 < sb_end; c0 += kChunk) {
        const int count = min(kChunk, sb_end - c0);
        __syncthreads();                          // every warp is done with the last chunk
        stage_x<NT>(smem, x, m, k, c0, count);
        __syncthreads();
        for (int sbl = 0; sbl < count; ++sbl) {
            const int sb = c0 + sbl;
            if (sb + kAhead + 1 < sb_end) {
                prefetch_l2(pf_row + (sb + kAhead + 1) * kBlockBytes);
                prefetch_l2(pf_row + (sb + kAhead + 1) * kBlockBytes + kBlockBytes - 1);
            }
            const unsigned char* stage = smem + sbl * NT * kStage;
            RowScales sc[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) row_scales(sc[mt][rr], cur[mt][rr].hdr, t);
            // the mins: -M[row][slot] * sum(x)[slot][col], slot = the lane's (sub-block, half)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint2 bm = reinterpret_cast<const uint2*>(stage + nt * kStage + kStageB)[lane];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
                    mma_bf16(acc[mt][nt], sc[mt][0].mn[0], sc[mt][1].mn[0], sc[mt][0].mn[1], sc[mt][1].mn[1], bm.x, bm.y);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    uint4 b[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        b[nt] = reinterpret_cast<const uint4*>(stage + nt * kStage)[(4 * h + i) * 32 + lane];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        const u32 w0 = (&cur[mt][0].q[h].x)[i], w1 = (&cur[mt][1].q[h].x)[i];
                        u32 le0, lo0, he0, ho0, le1, lo1, he1, ho1;
                        decode_word(w0, sc[mt][0], 2 * h, le0, lo0, he0, ho0);
                        decode_word(w1, sc[mt][1], 2 * h, le1, lo1, he1, ho1);
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            mma_bf16(acc[mt][nt], le0, le1, lo0, lo1, b[nt].x, b[nt].y);     // u = 0
                            mma_bf16(acc[mt][nt], he0, he1, ho0, ho1, b[nt].z, b[nt].w);     // u = 1
                        }
                    }
                }
            if (sb + 1 < sb_end) {
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) load_row(cur[mt][rr], rows[mt][rr] + (sb + 1) * kBlockBytes, t);
            }
        }
    }

    // C fragment: acc[mt][nt] = (row g, cols 2t, 2t + 1), (row g + 8, the same cols); col = row of x
    if (KS == 1) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row_base + 16 * mt + g + 8 * (e >> 1), col = 8 * nt + 2 * t + (e & 1);
                    if (row < n && col < m) y[(long long)col * n + row] = acc[mt][nt][e];
                }
        return;
    }
    constexpr int kCols = 8 * NT;
    float* part = reinterpret_cast<float*>(smem);         // [kRows][kCols], over the stage buffer
    __syncthreads();                                      // every warp is done reading the stage
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                part[(32 * warp + 16 * mt + g + 8 * (e >> 1)) * kCols + 8 * nt + 2 * t + (e & 1)] = acc[mt][nt][e];
    cluster_sync();
    cluster_sum_rows<KS, kRows, kCols, 32 * kWarps>(y, part, blockIdx.x * kRows, m, n);
    cluster_sync();                                       // no block leaves while another reads it
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_DQ(NT, KS) \
    template __global__ void mma_dq_kernel<NT, KS>(float*, const float*, const unsigned char*, int, int, int, long long);
#define MMA_DQ_KS(NT) MMA_DQ(NT, 1) MMA_DQ(NT, 2) MMA_DQ(NT, 4) MMA_DQ(NT, 8)
MMA_DQ_KS(1) MMA_DQ_KS(2) MMA_DQ_KS(3) MMA_DQ_KS(4)
#endif
