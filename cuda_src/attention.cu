// attention.cu — attention over the KV cell pool (bf16 K and V), and the KV write.
//
// Pools: (cells, kv_heads, D) bfloat16 bits; sequence s reads position j from cell
// cell_table[s * L + j]. Visibility and GQA as in glimmer_cupy/reference/attention.py.
// kv_write_kernel       k, v float32 (T, kv_heads, D) -> bf16 (round to nearest even) into pool rows
//                       cells[t]; 8 values per thread; blockIdx.y picks K (0) or V (1).
//                       grid=(ceil(T * kv_heads * D / 8 / 256), 2) block=(256,)
// attn_kernel<D, HEADS>  split-K (flash-decoding) for any step: a block of kWarps warps per (split,
//                       kv head x head chunk, token). A token's visible positions are cut into tiles
//                       of 32 and its blocks take `per` consecutive tiles each (Span; blocks past
//                       the last with work return at once, so the grid's split count is a ceiling).
//                       A warp takes every kWarps-th tile of its block: lane i scores position i
//                       against the chunk's HEADS query heads (q in shared memory), so a K row is
//                       read once for the whole GQA group, while the tile's V rows are already in
//                       flight; then it adds the V rows into per-lane output columns (lane owns D/32
//                       columns). The block's warps merge
//                       their (m, l, acc) in shared memory. With one block of work the block writes
//                       the normalised output; otherwise each block writes a partial, counts itself
//                       done on the token's counter, and the last block merges the partials in
//                       split order (the same result whichever block is last) and resets the
//                       counter to 0: counters must start at 0 and two launches sharing them must
//                       not overlap (one stream).
//                       grid=(splits, kv_heads * head_chunks, T) block=(32 * kWarps,)
// Scores live in the log2 domain: q is pre-multiplied by scale * log2(e) (by scale alone under a
// softcap, whose factor then carries the log2(e)), so the softmax uses exp2f directly.
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.

#include "attn_split.cuh"
#include "bf16.cuh"
#include "pdl.cuh"

typedef unsigned int u32;
constexpr u32 kFull = 0xffffffffu;

__device__ __forceinline__ u32 pack2(float a, float b) { return (u32)bf16_bits(a) | ((u32)bf16_bits(b) << 16); }

__global__ void __launch_bounds__(256)
kv_write_kernel(unsigned short* __restrict__ k_pool, unsigned short* __restrict__ v_pool,
                const float* __restrict__ k, const float* __restrict__ v, const int* __restrict__ cells,
                int n_tok, int row8) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * row8) return;
    const int tok = (int)(i / row8), c = (int)(i % row8);
    const float4* src = reinterpret_cast<const float4*>((blockIdx.y ? v : k) + 8 * i);
    unsigned short* pool = blockIdx.y ? v_pool : k_pool;
    const float4 a = src[0], b = src[1];
    reinterpret_cast<uint4*>(pool)[(long long)cells[tok] * row8 + c] =
        make_uint4(pack2(a.x, a.y), pack2(a.z, a.w), pack2(b.x, b.y), pack2(b.z, b.w));
}

// C bfloat16 values of one lane's V columns, loaded in one instruction
template <int C> struct Cols;
template <> struct Cols<2> { typedef u32 T; };
template <> struct Cols<4> { typedef uint2 T; };
template <> struct Cols<8> { typedef uint4 T; };
__device__ __forceinline__ void unpack(u32 w, float* f) { f[0] = bf16_lo(w); f[1] = bf16_hi(w); }
__device__ __forceinline__ void unpack(uint2 w, float* f) { unpack(w.x, f); unpack(w.y, f + 2); }
__device__ __forceinline__ void unpack(uint4 w, float* f) {
    unpack(w.x, f); unpack(w.y, f + 2); unpack(w.z, f + 4); unpack(w.w, f + 6);
}

// V rows j0 .. j0 + N - 1 of a tile, this lane's columns (`cell`: lane i holds position i's cell);
// hidden positions and the tile's tail load nothing (their cells may hold anything)
template <int N, class VT>
__device__ __forceinline__ void load_v(VT (&vv)[N], const unsigned short* vb, int cell, u32 vmask, int j0,
                                       long long cell_stride, int lane) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const int cj = __shfl_sync(kFull, cell, j0 + j);
        vv[j] = (vmask >> (j0 + j)) & 1u ? __ldg(reinterpret_cast<const VT*>(vb + cj * cell_stride) + lane) : VT();
    }
}

// acc[h] += p[j0 + j][h] * V row j0 + j, for the N rows in vv
template <int N, int C, int HEADS, class VT>
__device__ __forceinline__ void add_v(float (&acc)[HEADS][C], const VT (&vv)[N], const float (&p)[32][HEADS], int j0) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float vf[C];
        unpack(vv[j], vf);
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            const float ph = p[j0 + j][h];
#pragma unroll
            for (int c = 0; c < C; ++c) acc[h][c] = fmaf(ph, vf[c], acc[h][c]);
        }
    }
}

using attn::warp_max;
using attn::warp_sum;

constexpr int kWarps = 4;                     // warps per block of attn_kernel
constexpr int kBlocksPerSm = 2;               // the register budget: BLOCKS_PER_SM in ops/attention.py

// the visible positions [lo, hi) of token tok, and how they are cut into blocks of whole tiles of
// 32 positions: block b of the grid's gridDim.x takes tiles [b * per, (b + 1) * per); `active`
// blocks have work (at least one, which writes zeros for a token that sees nothing)
struct Span {
    int lo, hi, per, active;
    __device__ Span(int len, int pos, bool masked, int window, int blocks) {
        attn::visible_range(len, pos, masked, window, lo, hi);
        const int tiles = (max(hi - lo, 0) + 31) >> 5;
        per = max(1, (tiles + blocks - 1) / blocks);
        active = max(1, (tiles + per - 1) / per);
    }
};

template <int D, int HEADS>
__global__ void __launch_bounds__(32 * kWarps, kBlocksPerSm)
attn_kernel(float* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
            int* __restrict__ counters, const float* __restrict__ q, const unsigned short* __restrict__ k_pool,
            const unsigned short* __restrict__ v_pool, const int* __restrict__ cell_table,
            const int* __restrict__ seq_lens, const int* __restrict__ tok_seq, const int* __restrict__ tok_pos,
            const unsigned char* __restrict__ visible, int n_tok, int q_heads, int kv_heads, int table_width,
            int head_chunks, int window, float q_scale, float softcap_log2, float inv_softcap,
            int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs) {
    constexpr int C = D / 32;                         // output columns per lane
    constexpr int KB = D / 8 < 16 ? D / 8 : 16;       // 16-byte K loads in flight per lane
    constexpr int VPRE = D == 256 ? 8 : 32;           // V rows loaded together with the tile's K
    constexpr int VB = 8;                             // V rows per later batch (D = 256)
    typedef typename Cols<C>::T VT;
    __shared__ __align__(16) float sq[HEADS][D];
    __shared__ float sp[kWarps][32][HEADS];
    __shared__ __align__(16) float sacc[kWarps][HEADS][D];
    __shared__ float sml[kWarps][HEADS][2];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tok = blockIdx.z;
    const int kvh = blockIdx.y / head_chunks, hc = blockIdx.y % head_chunks;
    const int group = q_heads / kv_heads;
    const int h0 = kvh * group + hc * HEADS;          // first query head of this chunk
    const int nh = min(HEADS, group - hc * HEADS);    // heads past nh are padding (q = 0)
    const int seq = tok_seq[tok];
    const int pos = tok_pos[tok];
    const Span span(seq_lens[seq], pos, visible != nullptr, window, (int)gridDim.x);
    if ((int)blockIdx.x >= span.active) return;        // no work, no partial: the merge reads `active`
    const int lo = span.lo, hi = span.hi;
    const int t1 = min((hi - lo + 31) >> 5, ((int)blockIdx.x + 1) * span.per);
    const int* row = cell_table + (long long)seq * table_width;
    const long long cell_stride = (long long)kv_heads * D;
    const unsigned short* kb = k_pool + (long long)kvh * D;
    const unsigned short* vb = v_pool + (long long)kvh * D;
    const int rows = n_tok * q_heads;

    // Before pdl_wait (pdl.cuh) this kernel reads only what was uploaded before the step's kernels
    // ran (index arrays, cell table) and asks L2 for the K and V rows of its warp's first tile's
    // positions that no token of this step writes (below the sequence's lowest position in this
    // step), so their trip from memory overlaps the kernel before (the K/V write).
    int tile = (int)blockIdx.x * span.per + warp;
    int cell_next = 0;                                // the cells of the warp's next tile, per lane
    {
        int fresh = pos;
        if (n_tok <= 64) {
            for (int t2 = lane; t2 < n_tok; t2 += 32)
                if (tok_seq[t2] == seq) fresh = min(fresh, tok_pos[t2]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) fresh = min(fresh, __shfl_xor_sync(kFull, fresh, off));
        } else {
            fresh = 0;                                // wide (eager) steps: nothing to overlap
        }
        const int p = lo + 32 * tile + lane;
        if (tile < t1 && p < hi) {
            cell_next = row[p];
            if (p < fresh) {
                const long long c = (long long)cell_next * cell_stride;
#pragma unroll
                for (int b = 0; b < D * 2; b += 128) {
                    prefetch_l2(reinterpret_cast<const unsigned char*>(kb + c) + b);
                    prefetch_l2(reinterpret_cast<const unsigned char*>(vb + c) + b);
                }
            }
        }
    }
    pdl_wait();

    for (int i = threadIdx.x; i < HEADS * D; i += 32 * kWarps) {
        const int h = i / D, d = i % D;
        sq[h][d] = h < nh ? q[((long long)tok * q_heads + h0 + h) * D + d] * q_scale : 0.f;
    }
    __syncthreads();

    float m[HEADS], l[HEADS], acc[HEADS][C];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        m[h] = kNegInf;
        l[h] = 0.f;                                   // this lane's share; summed at the end
#pragma unroll
        for (int c = 0; c < C; ++c) acc[h][c] = 0.f;
    }
    for (; tile < t1; tile += kWarps) {
        const int base = lo + 32 * tile, end = min(hi, base + 32);
        const int p = base + lane;
        bool vis = p < end;
        if (vis && visible != nullptr) vis = visible[(long long)tok * table_width + p] != 0;
        const u32 vmask = __ballot_sync(kFull, vis);
        const int cell = vis ? cell_next : 0;
        const int pn = p + 32 * kWarps;               // this lane's position in the warp's next tile
        cell_next = tile + kWarps < t1 && pn < hi ? row[pn] : 0;
        if (vmask == 0) continue;

        // the V rows of the tile's first VPRE positions do not depend on the scores: in flight with K
        VT vpre[VPRE];
        load_v(vpre, vb, cell, vmask, 0, cell_stride, lane);
        float s[HEADS];
#pragma unroll
        for (int h = 0; h < HEADS; ++h) s[h] = 0.f;
        if (vis) {
            const uint4* kr = reinterpret_cast<const uint4*>(kb + cell * cell_stride);
#pragma unroll 1
            for (int c0 = 0; c0 < D / 8; c0 += KB) {
                uint4 w[KB];
#pragma unroll
                for (int j = 0; j < KB; ++j) w[j] = __ldg(kr + c0 + j);
#pragma unroll
                for (int j = 0; j < KB; ++j) {
                    const float kf[8] = {bf16_lo(w[j].x), bf16_hi(w[j].x), bf16_lo(w[j].y), bf16_hi(w[j].y),
                                         bf16_lo(w[j].z), bf16_hi(w[j].z), bf16_lo(w[j].w), bf16_hi(w[j].w)};
#pragma unroll
                    for (int h = 0; h < HEADS; ++h) {
                        const float4 a = *reinterpret_cast<const float4*>(&sq[h][8 * (c0 + j)]);
                        const float4 b = *reinterpret_cast<const float4*>(&sq[h][8 * (c0 + j) + 4]);
                        float t = s[h];
                        t = fmaf(kf[0], a.x, t); t = fmaf(kf[1], a.y, t); t = fmaf(kf[2], a.z, t);
                        t = fmaf(kf[3], a.w, t); t = fmaf(kf[4], b.x, t); t = fmaf(kf[5], b.y, t);
                        t = fmaf(kf[6], b.z, t); t = fmaf(kf[7], b.w, t);
                        s[h] = t;
                    }
                }
            }
        }
        // online softmax: the tile's max joins the running max; old sums rescale by 2^(m_old - m_new)
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            float sh = softcap_log2 > 0.f ? softcap_log2 * tanhf(s[h] * inv_softcap) : s[h];
            sh = vis ? sh : kNegInf;
            const float mn = fmaxf(m[h], warp_max(sh));   // finite: the tile has a visible position
            const float alpha = exp2f(m[h] - mn);          // 0 while m[h] is still -inf
            const float ph = exp2f(sh - mn);
            m[h] = mn;
            l[h] = l[h] * alpha + ph;
            sp[warp][lane][h] = ph;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[h][c] *= alpha;
        }
        __syncwarp();
        add_v(acc, vpre, sp[warp], 0);
        const int ntile = end - base;
        for (int j0 = VPRE; j0 < ntile; j0 += VB) {
            VT vv[VB];
            load_v(vv, vb, cell, vmask, j0, cell_stride, lane);
            add_v(acc, vv, sp[warp], j0);
        }
        __syncwarp();                                 // sp is rewritten by the next tile
    }

    // the block's warps merge in shared memory; warp h (and h + kWarps, ...) owns query head h
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        const float lh = warp_sum(l[h]);
        if (lane == 0) {
            sml[warp][h][0] = m[h];
            sml[warp][h][1] = lh;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) sacc[warp][h][lane * C + c] = acc[h][c];
    }
    __syncthreads();
    const bool split = span.active > 1;
    for (int h = warp; h < nh; h += kWarps) {
        float mx, total, o[C];
        attn::merge_warps<C, kWarps>([&](int w) { return sml[w][h]; }, [&](int w) { return sacc[w][h]; }, lane, o,
                                     mx, total);
        attn::end_row<C>(o, mx, total, split, (int)blockIdx.x, (long long)tok * q_heads + h0 + h, rows, lane, out,
                         part_acc, part_ml, xq, xd, xs);
    }
    if (!split) return;

    // the last block of this (token, kv head, head chunk) to finish merges the blocks' partials
    if (!attn::last_block(counters + (long long)tok * gridDim.y + blockIdx.y, span.active)) return;
    for (int h = warp; h < nh; h += kWarps)
        attn::merge_splits<C>(span.active, (long long)tok * q_heads + h0 + h, rows, lane, out, part_acc, part_ml,
                              xq, xd, xs);
}

#ifdef GLIMMER_INSTANTIATE
#define ATTN(D, H) template __global__ void attn_kernel<D, H>(float*, float*, float*, int*, const float*,        \
    const unsigned short*, const unsigned short*, const int*, const int*, const int*, const int*,          \
    const unsigned char*, int, int, int, int, int, int, float, float, float, int*, float*, float*);
#define ATTN_ALL(D) ATTN(D, 1) ATTN(D, 2) ATTN(D, 4) ATTN(D, 8)
ATTN_ALL(64) ATTN_ALL(128) ATTN_ALL(256)
#endif
