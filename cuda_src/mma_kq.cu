// mma_kq.cu — y = x · Wᵀ for up to 32 rows of x and W in Q4_K or Q6_K, on int8 tensor cores.
//
// x: M rows as int8 codes per 32 values (ops/q8.py: codes xq, scale xd, scaled sum xs per 32),
// W: N rows of 256-value super-blocks, y: (M, N) float32. mma_kq_kernel<QT, NT>: 16 weight rows
// are the mma's A (a tile), 8 rows of x its B (an n-tile; NT = ceil(M / 8) of them). The two types:
//   Q4_K, 144 bytes per super-block: d, dmin (fp16), 12 bytes of 6-bit scales and mins of its
//     eight 32-value sub-blocks, qs[128] (two 4-bit codes per byte); value = d * sc * q - dmin * m.
//     mma.sync.m16n8k32, k = one sub-block: per sub-block and n-tile the lane adds
//     xd * (d * sc) * C - (dmin * m) * xs. Blocks are 16-byte aligned: a lane loads 8-byte words
//     of qs and one 4-byte word of the header per row.
//   Q6_K, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales (one per 16
//     values), d (fp16); value = d * scale[i / 16] * (q - 32). mma.sync.m16n8k16, k = one 16-value
//     group, A = 4 * (q - 32) per byte (so x's sums are not needed): per 32-value sub-block (two
//     groups, one xd) and n-tile the lane adds xd * ((d * sc0 / 4) * C0 + (d * sc1 / 4) * C1).
//     Blocks start 2 bytes past 4-byte alignment every other time: a lane loads the aligned 4-byte
//     word of each of the block's 13 16-byte pieces per row and shifts in the next aligned word,
//     which its neighbour lane loaded (one shuffle per piece), and the 4 bytes that hold d.
// Fragments, the shared-memory layouts of x and the per-lane arithmetic: mma_kq_frag.cuh.
//
// A block is kMmaWarps = 8 warps: R = 8 / S tiles of 16 weight rows times S slices of K
// (S = 1 << slice_bits = 1, 2, 4 or 8, chosen at launch). Warp (tile, slice) takes super-blocks
// slice, slice + S, ... of its tile's rows, one per step:
//   - x: per step the block's S super-blocks of x (codes and scales of all 8 * NT rows, rows
//     past M repeating row M - 1) are copied into shared memory by cp.async through L1 (the other
//     block on the SM reads the same x), double-buffered: one __syncthreads per step, after which
//     the next step's copies are issued into the buffer every warp has finished reading.
//   - weights: each warp holds two super-blocks of its rows in registers, the one it computes and
//     the next one, whose loads (not kept in L1) are issued while it computes this one: Q4_K's all
//     before, Q6_K's row g before and its row g + 8 in two parts during the second half of this
//     one (into the registers its first half has freed: a Q6_K super-block is 28 registers a
//     lane); the super-block after that is asked into L2 (one bulk prefetch per row).
//   - lane (g, t) owns weight rows g and g + 8 of its tile. Per super-block it gathers the two
//     rows' scales from lanes 4g..4g+3 (shuffles), then per sub-block builds A from its words of
//     the rows and per n-tile reads B and the x scales from shared memory, runs the mma(s), and
//     scales the int32 C (its own rows, x rows 2t and 2t + 1) into float sums.
// At the end the S slices of each tile are added in shared memory in slice order (no atomics:
// graph replay must equal an eager run) and the tile's warps store the sums; rows of W past N
// are read as row N - 1 and not stored.
// grid = (ceil(ceil(N / 16) / R),) block = (256,)
// dynamic shared memory = 2 * S * MmaX<QT, NT>::kBytes = 2 * S * NT * (2560 for Q4_K, 2432 for
// Q6_K) bytes (ops/matmul.py keeps it <= 80 KB, two blocks per SM; it also holds the slice sums
// at the end)
// Registers: __launch_bounds__(256, 2), 128 at most, no spills (tests/test_cuda_compile.py).
//
// Both types pass their GPU tests (tests/test_quant_matmul.py) and run from quant_matmul's bucket
// table (measured: bench/results/quant_matmul_v5.md, quant_matmul_q6k.md); their loads,
// fragments, staging and arithmetic are also checked on the CPU (tests/test_mma_kq_frag.py).
#include "mma_int8.cuh"
#include "mma_kq_frag.cuh"
#include "pdl.cuh"

constexpr int kMmaWarps = 8;
static_assert(32 * kMmaWarps == gguf::kStageThreads, "the block stages x with all its threads");

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src) : "memory");
}
// ask L2 for `bytes` (a multiple of 16) at p, 16-byte aligned: one instruction, no register, no fault
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

struct Warp {                                // the warp-wide steps mma_kq_frag.cuh asks for
    __device__ __forceinline__ void mma(int (&c)[4], const unsigned (&a)[4], gguf::u32x2 b) const {
        mma_s8_k32(c, a, b);
    }
    __device__ __forceinline__ void mma16(int (&c)[4], const unsigned (&a)[2], unsigned b) const {
        mma_s8_k16(c, a[0], a[1], b);
    }
    __device__ __forceinline__ unsigned shfl_header(const gguf::MmaQ4K& w, int r, int lane) const {
        return __shfl_sync(0xffffffffu, w.hw[r], lane);
    }
    __device__ __forceinline__ unsigned shfl_scales(const gguf::MmaQ6K&, unsigned own, int, int, int lane) const {
        return __shfl_sync(0xffffffffu, own, lane);
    }
    __device__ __forceinline__ unsigned shfl_next(const gguf::MmaQ6K& w, int r, int u, int lane) const {
        return __shfl_sync(0xffffffffu, gguf::mma_q6k_sent(w, r, u, lane & 3), gguf::mma_q6k_next_lane(lane));
    }
};
struct AsyncCopy {                           // the copies of mma_stage_x: cp.async, through L1
    __device__ __forceinline__ void c16(void* dst, const void* src) const { cp_async16(dst, src); }
    __device__ __forceinline__ void c4(void* dst, const void* src) const { cp_async4(dst, src); }
};

// x's super-blocks first_sb .. first_sb + S - 1 into buf (one commit group)
template <class QT, int NT>
__device__ __forceinline__ void stage_x(unsigned char* buf, const int* __restrict__ xq, const float* __restrict__ xd,
                                        const float* __restrict__ xs, int m, int k, int first_sb, int bits) {
    int tid = threadIdx.x;
    asm volatile("" : "+r"(tid));            // recomputed per call: no addresses held across the loop
    AsyncCopy copy;
    gguf::mma_stage_x<QT, NT>(buf, xq, xd, xs, m, k, first_sb, bits, tid, copy);
    cp_async_commit();
}

// ask L2 for super-block sb of a row: its bytes widened to a 16-byte boundary at the start and
// narrowed to one at the end (Q4_K's blocks are whole 16-byte pieces; a Q6_K block's last few
// bytes are left to its loads, which fetch 256-byte neighbourhoods into L2)
template <class QT>
__device__ __forceinline__ void prefetch_super_block(const unsigned char* row, int sb) {
    constexpr int kBytes = gguf::MmaKQ<QT>::kBlockBytes;
    const unsigned char* p = row + (long long)sb * kBytes;
    if (kBytes % 16 == 0) {
        prefetch_l2_bulk(p, kBytes);
    } else {
        const unsigned long long a = reinterpret_cast<unsigned long long>(p);
        const unsigned long long lo = a & ~15ull, hi = (a + kBytes) & ~15ull;
        prefetch_l2_bulk(reinterpret_cast<const void*>(lo), (unsigned)(hi - lo));
    }
}

template <class QT, int NT>                  // weight type, n-tiles of 8 rows of x: M <= 8 * NT
__global__ void __launch_bounds__(32 * kMmaWarps, 2)
mma_kq_kernel(float* __restrict__ y, const int* __restrict__ xq, const float* __restrict__ xd,
              const float* __restrict__ xs, const unsigned char* __restrict__ w, int m, int n, int k,
              long long row_bytes, int slice_bits) {
    pdl_wait();
    using namespace gguf;
    typedef MmaX<QT, NT> X;
    typedef MmaKQ<QT> W;
    extern __shared__ __align__(16) unsigned char smem[];
    const int S = 1 << slice_bits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int tile = warp >> slice_bits, slice = warp & (S - 1);
    const int row0 = ((blockIdx.x << (3 - slice_bits)) + tile) * 16;
    const int nsb = k >> 8, steps = (nsb + S - 1) >> slice_bits;
    // rows past the end repeat row n - 1 (not stored); a tile wholly past the end loads nothing
    const bool live = row0 < n;
    const u8* w0 = w + (long long)min(row0 + g, n - 1) * row_bytes;
    const u8* w1 = w + (long long)min(row0 + g + 8, n - 1) * row_bytes;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[nt][q] = 0.f;
    Warp ops;

    typename W::Regs wa, wb;
    if (live && slice < nsb) {
        W::load(w0, w1, slice, t, wa);
        W::load_rest(w0, w1, slice, t, 1, wa);
        W::load_rest(w0, w1, slice, t, 2, wa);
    }
    stage_x<QT, NT>(smem, xq, xd, xs, m, k, 0, slice_bits);

    // step i: x of step i is in buffer i & 1, this warp's weights of it in cur; fetch step i + 1
    // (x into the other buffer, which every warp finished reading before this step's barrier)
    auto step = [&](int i, const typename W::Regs& cur, typename W::Regs& next) {
        cp_async_wait_all();
        __syncthreads();
        const int sb = (i << slice_bits) + slice;
        if (i + 1 < steps) {
            stage_x<QT, NT>(smem + ((i + 1) & 1) * S * X::kBytes, xq, xd, xs, m, k, (i + 1) << slice_bits, slice_bits);
            if (live && sb + S < nsb) W::load(w0, w1, sb + S, t, next);
            // and the super-block after that into L2, a row per lane of the first half-warp: the
            // registers hold one super-block ahead, L2 a second
            if (live && sb + 2 * S < nsb && lane < 16) {
                prefetch_super_block<QT>(w + (long long)min(row0 + lane, n - 1) * row_bytes, sb + 2 * S);
            }
        }
        if (live && sb < nsb) {
            // the rest of the next super-block's loads (Q6_K), issued where this one's arithmetic
            // has freed registers
            auto rest = [&](int part) { if (sb + S < nsb) W::load_rest(w0, w1, sb + S, t, part, next); };
            W::template super_block<NT>(cur, w0, w1, sb, smem + ((i & 1) * S + slice) * X::kBytes, g, t, acc, ops,
                                        rest);
        }
    };
    for (int i = 0; i < steps; i += 2) {     // two steps per turn: the weight registers swap roles
        step(i, wa, wb);
        if (i + 1 < steps) step(i + 1, wb, wa);
    }

    // the slices of each tile, added in slice order; sums[warp][4 * NT][32] over the x buffers
    __syncthreads();
    float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) sums[(warp * 4 * NT + 4 * nt + q) * 32 + lane] = acc[nt][q];
    __syncthreads();
    for (int v = slice; v < 4 * NT; v += S) {
        float s = 0.f;
        for (int i = 0; i < S; ++i) s += sums[(((tile << slice_bits) + i) * 4 * NT + v) * 32 + lane];
        const int xr = mma_out_x_row(v >> 2, v & 3, t), wr = row0 + mma_out_w_row(v & 3, g);
        if (xr < m && wr < n) y[(long long)xr * n + wr] = s;
    }
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_KQ(QT, NT) template __global__ void mma_kq_kernel<gguf::QT, NT>(float*, const int*, const float*, \
    const float*, const unsigned char*, int, int, int, long long, int);
MMA_KQ(Q4_K, 1) MMA_KQ(Q4_K, 2) MMA_KQ(Q4_K, 3) MMA_KQ(Q4_K, 4)
MMA_KQ(Q6_K, 1) MMA_KQ(Q6_K, 2) MMA_KQ(Q6_K, 3) MMA_KQ(Q6_K, 4)
#endif
