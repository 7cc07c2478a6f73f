// mma_st.cu — y = x · Wᵀ for 1..64 rows of x and W in Q4_K or Q6_K, on int8 tensor cores, W streamed
// into shared memory by bulk copies asked for at the block's start (or, past a ring's depth, as its
// stages free).
//
// mma_st_stage_x_kernel<NT>  x (M, K) float32 -> xst: per super-block one XStage<NT> image
//   (mma_st_lanes.cuh: int8 codes per 256 values, swizzled; the sub-blocks' sums as (hi, lo);
//   the scale). grid = (ceil(K / 256 * 8 NT / 4),) block = (128,): a warp a (super-block, row of x).
//   It lets the matmul launch first thing (pdl_release), so that, in a graph, the matmul's blocks
//   ask for W while this kernel waits for the one before and quantizes x.
// mma_st_kernel<T, NT, KS>  y (M, N) float32, M <= 8 NT; W: N rows of Q4_K (T = St4K) or Q6_K (St6K;
//   St6P: in pair order, quant_blocks.cuh, whose slices are whole pairs) blocks; Q4_K rows 16-byte aligned, a Q6_K tensor ending at a 16-byte boundary, so that the last
//   row's window (its slice rounded out to 16 bytes) stays inside it (ops/matmul.py checks both).
//   grid = (ceil(N / 64), KS), clusters of (1, KS, 1), block = (128,), dynamic shared memory
//   64 row_stride<T>(per) + per XStage<NT>::kBytes bytes, per = ceil(K / 256 / KS) (mma_st_lanes.cuh).
// mma_st_tma_kernel<T, NT, KS, RG, WK>  the same, W copied by a tensor map (passed by value) in boxes
//   of 16 RG rows by two super-blocks, each on its own barrier, through a ring of `stages` stages;
//   grid = (ceil(N / 16 RG), KS), block = (32 RG WK,); dynamic shared memory ops/matmul.py
//   mma_st_smem's. The table runs it (ops/matmul.py MMA_ST_TMA, MMA_ST_TMA_TYPES: Q4_K and Q6_K), and
//   at 33..64 rows of x as NT = 8 in one split (mma_st_kernel takes at most NT = 4).
//
// Why: at 9..32 rows the tensor-core kernels before (mma_kq.cu, mma_dq.cu) streamed W at half the
// GEMV's rate or less (M = 16 at 2.0-2.7x the M = 1 time, bench/results/NOTES.md): each warp held
// its next super-block in registers, so the bytes an SM had in flight were bounded by its registers,
// and their per-sub-block epilogues were a third to a half of their instructions. Here:
//   - the block's whole share of W (64 rows by its K slice) is asked for at once, before pdl_wait,
//     one bulk copy per row (its slice's 16-byte-aligned window), and x's images after the wait (one
//     bulk copy each), all on one mbarrier: the bytes in flight are bounded by shared memory;
//   - x is quantized per 256 values, so a super-block's sub-blocks (Q4_K) or groups (Q6_K) add up in
//     int32, one IMAD per C value and scale, and Q4_K's mins are two small multiplies (mma_st_lanes.cuh).
// K is split over the KS blocks of a cluster (rule: ops/matmul.py mma_st_config); they add their
// partial sums through distributed shared memory in rank order, so the bits do not depend on timing.
// Rows of W past N copy row N - 1 and are not stored.
#include "cluster.cuh"
#include "mma_int8.cuh"
#include "mma_st_lanes.cuh"
#include "mma_st_stage.cuh"
#include "pdl.cuh"
#include "stamps.cuh"

namespace mst {

// the tensor map's box at element coordinates (c0, c1) -> this block's shared memory (128-byte
// aligned), counted on bar as bytes (the whole box, zeros included)
__device__ __forceinline__ void tensor_copy_2d(void* dst, const void* map, int c0, int c1, unsigned long long* bar,
                                               unsigned long long policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1, {%2, %3}], [%4], %5;"
                 ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "l"(policy) : "memory");
}
// a CUtensorMap (the driver's 128-byte descriptor, made by ops/matmul.py), passed by value
struct alignas(64) TensorMap { unsigned long long words[16]; };
// mma_st_tma_kernel's ring: at most this many chunks in a block's shared memory at once
constexpr int kMaxStages = 16;

}  // namespace mst

#ifdef GLIMMER_STAMPS
// mma_st_stage_x_kernel's blocks stamp from this row of glimmer_stamps on (probe_mma_st.py), past
// the matmul's blocks
constexpr int kStageStampRow = 3072;
#endif

template <int NT>
__global__ void __launch_bounds__(128) mma_st_stage_x_kernel(unsigned char* __restrict__ xst,
                                                             const float* __restrict__ x, int m, int k) {
    STAMP_ROW(kStageStampRow + blockIdx.x, 0);
    pdl_release();                     // mma_st_kernel's blocks may start their copies of W meanwhile
    pdl_wait();
    STAMP_ROW(kStageStampRow + blockIdx.x, 1);
    using namespace mst;
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int nsb = k >> 8, r = item % (8 * NT), sb = item / (8 * NT);
    if (sb >= nsb) return;
    float v[8];
    if (r < m) {
        const float4* src = reinterpret_cast<const float4*>(x + (long long)r * k + 256 * sb + 8 * lane);
        const float4 p = src[0], q = src[1];
        v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w; v[4] = q.x; v[5] = q.y; v[6] = q.z; v[7] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.f;
    }
    stage_row(xst + (long long)sb * XStage<NT>::kBytes, v, r, NT);
    STAMP_ROW(kStageStampRow + blockIdx.x, 2);
}

// One warp's super-block of its rows g and g + 8 (blk: the rows' blocks in the stage) into acc
template <int NT>
__device__ __forceinline__ void super_block(mst::St4K, const unsigned char* const (&blk)[2], const unsigned char* xs, int g,
                                            int t, float (&acc)[NT][4]) {
    using namespace mst;
    const Scales sc = scales(blk, t);
    int main[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) main[nt][0] = main[nt][1] = main[nt][2] = main[nt][3] = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const Pair a = a_pair(blk, c, t);
        const int se[2] = {sc.sc[0][2 * c], sc.sc[1][2 * c]}, so[2] = {sc.sc[0][2 * c + 1], sc.sc[1][2 * c + 1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            int ce[4], co[4];
            mma_u8s8_k32(ce, a.lo, b_frag<NT>(xs, nt, 2 * c, g, t));
            mma_u8s8_k32(co, a.hi, b_frag<NT>(xs, nt, 2 * c + 1, g, t));
            add_scaled(main[nt], ce, se);
            add_scaled(main[nt], co, so);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const u32 bm = b_mins<NT>(xs, nt, g, t);
        int hi[4], lo[4];
        mma_s8_k16(hi, sc.mhi[0], sc.mhi[1], bm);
        mma_s8_k16(lo, sc.mlo[0], sc.mlo[1], bm);
        finish(acc[nt], main[nt], hi, lo, sc, x_scales<NT>(xs, nt, t));
    }
}
// a Q6_K super-block, read as L says (mma_st_lanes.cuh: Q6Gguf<A>, Q6Pairs<J>)
template <class L, int NT>
__device__ __forceinline__ void super_block_q6(const unsigned char* const (&blk)[2], const unsigned char* xs, int g,
                                               int t, float (&acc)[NT][4]) {
    using namespace mst;
    const typename L::Rows rows = L::where(blk, t);
    const Q6Scales sc = L::scales(rows);
    int sum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sum[nt][0] = sum[nt][1] = sum[nt][2] = sum[nt][3] = 0;
#pragma unroll
    for (int G = 0; G < 16; ++G) {
        const u32 a0 = L::a(rows, 0, G, t), a1 = L::a(rows, 1, G, t);
        const int s2[2] = {L::sc(sc, 0, G), L::sc(sc, 1, G)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            int c[4];
            mma_s8_k16(c, a0, a1, q6_b<NT>(xs, nt, G, g, t));
            add_scaled(sum[nt], c, s2);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) q6_finish(acc[nt], sum[nt], sc, x_scales<NT>(xs, nt, t));
}
// Q6_K blocks start 4-byte aligned or 2 past it: the warp's rows all one way (the usual case: rows of
// a multiple of 4 bytes), or mixed
template <int NT>
__device__ __forceinline__ void super_block(mst::St6K, const unsigned char* const (&blk)[2], const unsigned char* xs,
                                            int g, int t, float (&acc)[NT][4]) {
    const unsigned long long p0 = reinterpret_cast<unsigned long long>(blk[0]) & 2u,
                             p1 = reinterpret_cast<unsigned long long>(blk[1]) & 2u;
    if (__all_sync(0xffffffffu, (p0 | p1) == 0))
        super_block_q6<mst::Q6Gguf<mst::kAligned>, NT>(blk, xs, g, t, acc);
    else if (__all_sync(0xffffffffu, (p0 & p1) != 0))
        super_block_q6<mst::Q6Gguf<mst::kOdd>, NT>(blk, xs, g, t, acc);
    else
        super_block_q6<mst::Q6Gguf<mst::kEither>, NT>(blk, xs, g, t, acc);
}
// Q6_K in pair order: the pair's super-blocks in turn (a slice is whole pairs: ops/matmul.py)
template <int NT>
__device__ __forceinline__ void pair_blocks(const unsigned char* const (&blk)[2], const unsigned char* xs, bool second,
                                            int g, int t, float (&acc)[NT][4]) {
    super_block_q6<mst::Q6Pairs<0>, NT>(blk, xs, g, t, acc);
    if (second) {
        const unsigned char* const b1[2] = {blk[0] + 210, blk[1] + 210};
        super_block_q6<mst::Q6Pairs<1>, NT>(b1, xs + mst::XStage<NT>::kBytes, g, t, acc);
    }
}

// The block's C out: stored (KS = 1), or each rank's share of the rows summed over the cluster's
// partials in rank order through distributed shared memory (smem: the stages, free by now)
// C's places: acc[nt] = (row g: x rows 8 nt + 2t, 2t + 1), (row g + 8: the same)
// Only warps 0..RG - 1 hold C, of the block's 16 RG rows (kThreads: the block's threads; every one
// takes part in the cluster sum).
template <int NT, int KS, int kThreads = 128, int RG = mst::kWarps>
__device__ __forceinline__ void finish_block(float* __restrict__ y, const float (&acc)[NT][4], unsigned char* smem,
                                             int row0, int m, int n) {
    using namespace mst;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const bool holds = warp < RG;
    if (KS == 1) {
        if (!holds) return;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int row = row0 + 16 * warp + g + 8 * (q >> 1), col = 8 * nt + 2 * t + (q & 1);
                if (row < n && col < m) y[(long long)col * n + row] = acc[nt][q];
            }
        STAMP(6);
        return;
    }
    constexpr int kCols = 8 * NT;
    float* part = reinterpret_cast<float*>(smem);              // [16 RG][kCols], over the first stage
    __syncthreads();                                           // every warp is done reading the stages
    if (holds)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q)
                part[(16 * warp + g + 8 * (q >> 1)) * kCols + 8 * nt + 2 * t + (q & 1)] = acc[nt][q];
    cluster_sync();
    STAMP(5);
    cluster_sum_rows<KS, 16 * RG, kCols, kThreads>(y, part, row0, m, n);
    cluster_sync();                                            // no block leaves while another reads it
    STAMP(6);
}

template <class T, int NT, int KS>
__global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(128, 2)
mma_st_kernel(float* __restrict__ y, const unsigned char* __restrict__ xst, const unsigned char* __restrict__ w,
              int m, int n, int k, long long row_bytes) {
    using namespace mst;
    constexpr int kX = XStage<NT>::kBytes;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ unsigned long long bar;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int nsb = k >> 8, per = (nsb + KS - 1) / KS;
    const int sb0 = min(nsb, (int)blockIdx.y * per), count = min(nsb, sb0 + per) - sb0;
    const int row0 = blockIdx.x * kRows, rs = row_stride<T>(per);
    unsigned char* const xbase = smem + kRows * rs;           // x's images after W's rows
    // a row's first block of the slice in global memory (rows past N repeat the last)
    auto first_block = [&](int r) {
        return reinterpret_cast<unsigned long long>(w + (long long)min(row0 + r, n - 1) * row_bytes +
                                                    (long long)sb0 * T::kBlock);
    };

    // The next kernel (in a step: the op after this matmul; in a chain of matmuls: the next one's x
    // stage, which lets its matmul in at once) may launch now, so that its blocks, where they fit
    // beside this one's, ask for their weights while this one runs; its pdl_wait still waits for this
    // kernel to complete. MMA_ST_NO_RELEASE keeps the release at the end, for the A/B.
#ifndef MMA_ST_NO_RELEASE
    pdl_release();
#endif
    STAMP(0);
    // one barrier for the whole slice: each copy's thread arrives with the bytes it asks for
    if (tid == 0 && count > 0) {
        mbar_init(&bar, kRows + count);
        fence_mbarrier_init();
    }
    __syncthreads();
    // W: a row's slice in one copy, from every thread; no kernel writes W, so before the wait
    if (count > 0) {
        const unsigned long long policy = l2_evict_first_policy();
        for (int r = tid; r < kRows; r += 128) {
            const unsigned long long a = first_block(r);
            const unsigned bytes = ((unsigned)(a & 15u) + count * T::kBlock + 15u) & ~15u;
            mbar_arrive_expect_tx(&bar, bytes);
            bulk_copy_hint(smem + r * rs, reinterpret_cast<const void*>(a & ~15ull), bytes, &bar, policy);
        }
    }
    STAMP(1);
    pdl_wait();                                                // x's images are the kernel before's
    STAMP(2);
    if (tid < count) {
        mbar_arrive_expect_tx(&bar, kX);
        bulk_copy(xbase + tid * kX, xst + (long long)(sb0 + tid) * kX, kX, &bar);
    }

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const int r_lo = 16 * warp + g, r_hi = r_lo + 8;
    const unsigned char* const row_lo = smem + r_lo * rs + (int)(first_block(r_lo) & 15u);
    const unsigned char* const row_hi = smem + r_hi * rs + (int)(first_block(r_hi) & 15u);
    if (count > 0) mbar_wait(&bar, 0);
    STAMP(3);
    if constexpr (T::kPairs) {
        for (int s = 0; s < count; s += 2) {
            const unsigned char* const blk[2] = {row_lo + s * T::kBlock, row_hi + s * T::kBlock};
            pair_blocks<NT>(blk, xbase + s * kX, s + 1 < count, g, t, acc);
        }
    } else {
        for (int s = 0; s < count; ++s) {
            const unsigned char* const blk[2] = {row_lo + s * T::kBlock, row_hi + s * T::kBlock};
            super_block<NT>(T{}, blk, xbase + s * kX, g, t, acc);
        }
    }
    STAMP(4);

    finish_block<NT, KS>(y, acc, smem, row0, m, n);
}

// One super-block of a chunk: Q4_K as above; a Q6_K block at 4-byte alignment or 2 past it (A)
template <int NT, int A>
__device__ __forceinline__ void chunk_block(mst::St4K, const unsigned char* const (&blk)[2], const unsigned char* xs,
                                            int g, int t, float (&acc)[NT][4]) {
    super_block<NT>(mst::St4K{}, blk, xs, g, t, acc);
}
template <int NT, int A>
__device__ __forceinline__ void chunk_block(mst::St6K, const unsigned char* const (&blk)[2], const unsigned char* xs,
                                            int g, int t, float (&acc)[NT][4]) {
    super_block_q6<mst::Q6Gguf<A>, NT>(blk, xs, g, t, acc);
}
// Q6_K in pair order: a chunk is a pair (its slice starts at one), its first super-block A = kAligned
template <int NT, int A>
__device__ __forceinline__ void chunk_block(mst::St6P, const unsigned char* const (&blk)[2], const unsigned char* xs,
                                            int g, int t, float (&acc)[NT][4]) {
    super_block_q6<mst::Q6Pairs<A == mst::kAligned ? 0 : 1>, NT>(blk, xs, g, t, acc);
}
// A chunk's two super-blocks (the second where the slice has it), the first of alignment A0
template <class T, int NT, int A0>
__device__ __forceinline__ void chunk_pair(const unsigned char* const (&b0)[2], const unsigned char* xs, bool second,
                                           int g, int t, float (&acc)[NT][4]) {
    constexpr int kX = mst::XStage<NT>::kBytes, A1 = A0 == mst::kAligned ? mst::kOdd : mst::kAligned;
    chunk_block<NT, A0>(T{}, b0, xs, g, t, acc);
    if (second) {
        const unsigned char* const b1[2] = {b0[0] + T::kBlock, b0[1] + T::kBlock};
        chunk_block<NT, A1>(T{}, b1, xs + kX, g, t, acc);
    }
}

// mma_st_kernel with W copied by the tensor map `wmap` (u16 elements: dim 0 a row's bytes / 2,
// dim 1 the N rows): a block's 16 RG rows (RG = 4 as mma_st_kernel, or 2: twice the blocks, so a
// 4096-row matrix fills the SMs), per chunk of kChunkSb super-blocks one copy of those rows and the
// chunk's x images, into a ring of `stages` stages, each on its own barrier, so the warps multiply a
// chunk as soon as it has landed while the rest stream in. Where every chunk of the slice has a stage
// (stages = its chunks) all are asked for at the start; else (stages a multiple of WK, so a stage's
// chunks all fall to the same warps, in order) the last of a chunk's RG warps to finish it asks for
// the chunk `stages` on into its stage. So K needs no split to fit shared memory. Shared memory:
// `stages` boxes of 16 RG x box_bytes<T>() bytes, then the stages' x images (kChunkSb XStage<NT> a
// stage; where every chunk has one, the slice's per). WK warps share each 16 rows, warp w taking the
// chunks j with j % WK == w / RG (block = 32 RG WK threads), their sums added in shared memory in that
// order, so the bits depend neither on RG nor on the stages. The multiplies issue ~340 instructions a
// warp per super-block at NT = 2 (SASS), so a block of 64 rows by 16 super-blocks keeps its SM's
// schedulers busy ~4 us: more warps, and more SMs.
template <class T, int NT, int KS, int RG, int WK>
__global__ void __cluster_dims__(1, KS, 1) __launch_bounds__(32 * RG * WK, NT <= 4 ? T::kMinBlocks : 1)
mma_st_tma_kernel(float* __restrict__ y, const unsigned char* __restrict__ xst, const __grid_constant__ mst::TensorMap wmap,
                  int m, int n, int k, int stages) {
    using namespace mst;
    constexpr int kX = XStage<NT>::kBytes, kBox = box_bytes<T>(), kBlockRows = 16 * RG, kChunk = kBlockRows * kBox;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ unsigned long long bars[kMaxStages];
    __shared__ int finished[kMaxStages];                       // warps done with a stage's chunks, all told
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int half = warp / RG, rw = warp % RG;                // the warp's share of chunks, its rows
    const int nsb = k >> 8, per = (nsb + KS - 1) / KS;
    const int sb0 = min(nsb, (int)blockIdx.y * per), count = min(nsb, sb0 + per) - sb0;
    const int chunks = (count + kChunkSb - 1) / kChunkSb, row0 = blockIdx.x * kBlockRows;
    const int ring = min(chunks, stages);                      // stages this block fills at its start
    unsigned char* const xbase = smem + stages * kChunk;
    const unsigned long long policy = l2_evict_first_policy();
    // chunk j's W box into its stage, its barrier expecting the box and the chunk's x images
    auto ask_w = [&](int j) {
        const int s = j % stages, blocks = min(kChunkSb, count - kChunkSb * j);
        mbar_arrive_expect_tx(&bars[s], kChunk + blocks * kX);
        tensor_copy_2d(smem + s * kChunk, &wmap, ((sb0 + kChunkSb * j) * T::kBlock & ~15) / 2, row0, &bars[s], policy);
    };

#ifndef MMA_ST_NO_RELEASE
    pdl_release();
#endif
    STAMP(0);
    if (tid == 0) {
        for (int s = 0; s < ring; ++s) {
            mbar_init(&bars[s], 1);
            finished[s] = 0;
        }
        fence_mbarrier_init();
    }
    __syncthreads();
    // W before the wait (no kernel writes it): thread 0 arrives once a stage
    if (tid == 0)
        for (int j = 0; j < ring; ++j) ask_w(j);
    STAMP(1);
    pdl_wait();                                                // x's images are the kernel before's
    STAMP(2);
    // super-block i of the slice: its x image into its chunk's stage
    auto ask_x = [&](int i) {
        const int j = i / kChunkSb, s = j % stages;
        bulk_copy(xbase + (kChunkSb * s + i % kChunkSb) * kX, xst + (long long)(sb0 + i) * kX, kX, &bars[s]);
    };
    if (tid < min(count, kChunkSb * ring)) ask_x(tid);

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const int r_lo = 16 * rw + g, r_hi = r_lo + 8;
    const bool first_odd = T::kBlock == 210 && (sb0 & 1);     // Q6_K: the chunks' first blocks 2 past alignment
    for (int j = half; j < chunks; j += WK) {
        const int s = j % stages;
        mbar_wait(&bars[s], (j / stages) & 1);
        if (j == 0) STAMP(3);
        const unsigned char* const base = smem + s * kChunk + ((sb0 + kChunkSb * j) * T::kBlock & 15);
        const unsigned char* const b0[2] = {base + r_lo * kBox, base + r_hi * kBox};
        const unsigned char* const xs = xbase + kChunkSb * s * kX;
        const bool second = kChunkSb * j + 1 < count;
        if (first_odd)
            chunk_pair<T, NT, kOdd>(b0, xs, second, g, t, acc);
        else
            chunk_pair<T, NT, kAligned>(b0, xs, second, g, t, acc);
        if (j + stages < chunks) {                             // the stage's next chunk, once its RG warps are done
            __syncwarp();
            if (lane == 0) {
                __threadfence_block();                         // the warp's reads of the stage before its count
                if ((atomicAdd(&finished[s], 1) + 1) % RG == 0) {
                    __threadfence_block();
                    const int next = j + stages;
                    ask_w(next);
                    for (int i = kChunkSb * next; i < min(count, kChunkSb * (next + 1)); ++i) ask_x(i);
                }
            }
        }
    }
    STAMP(4);
    if constexpr (WK > 1) {                                    // the other warps' sums into warps 0..RG - 1's
        // the lane's C of share h > 0: [WK - 1][RG][32][NT 4] floats over chunk 0
        auto slot = [&](int h) { return reinterpret_cast<float*>(smem) + (((h - 1) * RG + rw) * 32 + lane) * 4 * NT; };
        __syncthreads();                                       // every warp is done reading the stages
        if (half > 0)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int q = 0; q < 4; ++q) slot(half)[4 * nt + q] = acc[nt][q];
        __syncthreads();
        if (half == 0)
            for (int h = 1; h < WK; ++h)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int q = 0; q < 4; ++q) acc[nt][q] += slot(h)[4 * nt + q];
    }
    finish_block<NT, KS, 32 * RG * WK, RG>(y, acc, smem, row0, m, n);
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_ST(T, NT, KS) template __global__ void mma_st_kernel<mst::T, NT, KS>(float*, const unsigned char*, \
    const unsigned char*, int, int, int, long long);
#define MMA_ST_TMA1(T, NT, KS, RG, WK) template __global__ void mma_st_tma_kernel<mst::T, NT, KS, RG, WK>(float*, \
    const unsigned char*, const __grid_constant__ mst::TensorMap, int, int, int, int);
#define MMA_ST_TMA2(T, NT, KS) MMA_ST_TMA1(T, NT, KS, 4, 1) MMA_ST_TMA1(T, NT, KS, 4, 2) MMA_ST_TMA1(T, NT, KS, 2, 2) \
    MMA_ST_TMA1(T, NT, KS, 2, 4)
#define MMA_ST_TMA(NT, KS) MMA_ST_TMA2(St4K, NT, KS) MMA_ST_TMA2(St6K, NT, KS) MMA_ST_TMA2(St6P, NT, KS)
#define MMA_ST_KS(NT) MMA_ST(St4K, NT, 1) MMA_ST(St4K, NT, 2) MMA_ST(St4K, NT, 4) MMA_ST(St4K, NT, 8) \
    MMA_ST(St6K, NT, 1) MMA_ST(St6K, NT, 2) MMA_ST(St6K, NT, 4) MMA_ST(St6K, NT, 8) \
    MMA_ST(St6P, NT, 1) MMA_ST(St6P, NT, 2) MMA_ST(St6P, NT, 4) MMA_ST(St6P, NT, 8) \
    MMA_ST_TMA(NT, 1) MMA_ST_TMA(NT, 2) MMA_ST_TMA(NT, 4) MMA_ST_TMA(NT, 8) \
    template __global__ void mma_st_stage_x_kernel<NT>(unsigned char*, const float*, int, int);
MMA_ST_KS(1) MMA_ST_KS(2) MMA_ST_KS(3) MMA_ST_KS(4)
// 33..64 rows of x in one launch (ops/matmul.py: MMA_ST_TMA_ROWS), the tensor-map kernel's ring in one split
MMA_ST_TMA(8, 1)
template __global__ void mma_st_stage_x_kernel<8>(unsigned char*, const float*, int, int);
#endif
