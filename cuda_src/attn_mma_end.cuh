// attn_mma_end.cuh — the end of a tensor-core attention block (attention_mma.cu, attention_stream.cu):
// the KW warps that split a row group's positions merge their (m, l, O) in shared memory, then the
// block writes its rows (one block of work), or leaves its partial for the cluster merge through
// distributed shared memory, or writes a global partial and the last block of the (token, kv head x
// head chunk) merges them (attn_split.cuh).
//
// A lane holds rows g and g + 8 of its warp's 16 (lane = 4 g + t), columns 2t, 2t + 1 of each
// 8-wide n-tile of O (attention_mma_frag.cuh). `so` is shared memory free for reuse (the stage
// buffers, after every copy into them has landed and a __syncthreads): KW * M * merge_stride +
// 2 * KW * M floats for the merge, and M * D + 2 * M more for a clustered block's partial
// (attn_end_floats). The warps' O rows go there as float2 pairs, padding rows left out; in decode
// blocks a row stride of D + 8 floats puts a quad's eight rows in distinct banks (with a stride of
// D every store of the pattern hit four banks, 8-way conflicts).
#pragma once
#include "attn_mma_ptx.cuh"
#include "attn_split.cuh"
#include "pdl.cuh"
#include "stamps.cuh"

// The argument list of both tensor-core kernels (attn_mma_kernel, attn_stream_kernel): attn_kernel's
// plus `early` and the L2 prefetch ranges (pdl.cuh: prefetch_l2_share; attn_stream_kernel's pushing
// blocks issue them as they leave), so ops/attention.py launches either with the same arguments;
// ATTN_TC_TYPES is the same list as types, for the explicit instantiations.
#define ATTN_TC_ARGS                                                                                         \
    float *__restrict__ out, float *__restrict__ part_acc, float *__restrict__ part_ml, int *__restrict__ counters, \
        const float *__restrict__ q, const unsigned short *__restrict__ k_pool,                                \
        const unsigned short *__restrict__ v_pool, const int *__restrict__ cell_table,                         \
        const int *__restrict__ seq_lens, const int *__restrict__ tok_seq, const int *__restrict__ tok_pos,    \
        const unsigned char *__restrict__ visible, int n_tok, int q_heads, int kv_heads, int table_width,      \
        int head_chunks, int window, int early, float q_scale, float softcap_log2, float inv_softcap,          \
        int *__restrict__ xq, float *__restrict__ xd, float *__restrict__ xs, L2_PREFETCH_ARGS
#define ATTN_TC_TYPES                                                                                        \
    float*, float*, float*, int*, const float*, const unsigned short*, const unsigned short*, const int*,      \
        const int*, const int*, const int*, const unsigned char*, int, int, int, int, int, int, int, float, float, \
        float, int*, float*, float*, L2_PREFETCH_TYPES

namespace amma {

// The row stride of the warps' O in the merge: D + 8 floats where several warps split a row
// group's positions (decode blocks), D where one warp holds each row (prefill blocks, whose stage
// buffers the padded rows would not fit at 128 rows and two stages).
template <int D, int KW>
__host__ __device__ constexpr int merge_stride() { return D + (KW > 1 ? 8 : 0); }

// floats of `so` that end_block uses: the merge, then a clustered block's partial
template <int D, int M, int KW>
__host__ __device__ constexpr int attn_end_floats() { return KW * M * merge_stride<D, KW>() + 2 * KW * M + M * D + 2 * M; }

// The pushed cluster merge (attn_stream_kernel, when a block's real rows are at most kPushRows):
// each block sends its rows' partials straight into rank 0's shared memory by st.async, where the
// pulled merge (cluster_merge_row) would leave them in its own, each store counted in bytes on rank
// 0's barrier `full`; rank 0 merges from its own shared memory. No cluster barrier after the
// partials, none before exit, no remote load. Rank 0's area for them: [kPushSplits][kPushRows][D]
// partials, then [..][..][2] (max, sum), after the warps' merge; a block writes there only once
// rank 0 has said it is past its K/V tiles (the area lies in its stage buffers).
constexpr int kPushRows = 4, kPushSplits = 16;
template <int D, int M, int KW>
__host__ __device__ constexpr int attn_push_floats() {
    return KW * M * merge_stride<D, KW>() + 2 * KW * M + kPushSplits * kPushRows * (D + 2);
}

// this block's barriers of a pushed merge: `full` completes when every other block's rows have
// landed (rank 0's), `ready` when rank 0 may receive (the other blocks'). `ready` is arrived at and
// waited on relaxed: it orders rank 0's reads of its stage buffers, done before its block barrier,
// before the others' writes into them, and publishes nothing. Both measured faster than stores and
// a released arrival of every warp, with `ready` acquired (bench/results/NOTES.md, thirty-fourth session).
struct PushBars {
    unsigned long long full, ready;
};

// Every thread of every block of the cluster, early (no data is touched: before pdl_wait is fine),
// when the merge will be pushed: set up this block's barriers and announce them; end_block waits
// for the announcement before the first use of another block's.
__device__ __forceinline__ void push_begin(PushBars* b) {
    if (threadIdx.x == 0) {
        mbar_init(&b->full, 1u);        // rank 0's one arrival; the rows count in bytes
        mbar_init(&b->ready, 1u);
        fence_mbarrier_init();
    }
    cluster_arrive_relaxed();
}

// Where the block's rows go: row r of the block is token t0 + r / hpb (of ntb), head h0 + r % hpb
// (of nh); rows past those are padding and are never written.
struct EndRows {
    int hpb, ntb, nh, t0, h0, q_heads, rows;
    float* out;
    float* part_acc;
    float* part_ml;
    int* counter;                       // this (token block, kv head x head chunk)'s last-block counter
    int* xq;
    float* xd;
    float* xs;
};

// The last block's merge with the partials staged in shared memory a warp at a time (attn_stream_kernel,
// one token a block, at most WARPS real rows): warp i copies its row's partials of a batch of splits
// into its own part of `so` (cp.async, through L2: one trip a batch) and sums them from there, the
// same weights and the same sums in the same order as merge_splits, so the same bits. The loops are
// rolled (the sums' by kMergeSumUnroll splits) and no warp waits for another: the last block runs
// this code once, cold, and merge_splits' unrolled batches are ~19 KB of it for 32 splits
// (bench/results/NOTES.md, twenty-fourth session).
// so: `floats` free floats, 16-byte aligned, a multiple of 4 WARPS; a warp's part holds its weights
// (32 kSplitGroups) and then batches of as many splits' rows as fit.
#ifndef ATTN_MERGE_SUM_UNROLL
#define ATTN_MERGE_SUM_UNROLL 4
#endif
constexpr int kMergeSumUnroll = ATTN_MERGE_SUM_UNROLL;
template <int D, int WARPS>
__device__ __forceinline__ void merge_rolled(float* so, int floats, int active, const EndRows& e) {
    constexpr int C = D / 32, P = D / 4, K = attn::kSplitGroups, SW = 32 * K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= e.nh) return;
    const int part = floats / WARPS;
    float* sw = so + warp * part;       // this warp's weights, then its batch [per][D]
    float* sv = sw + SW;
    const int per = (part - SW) / D;
    const long long r = (long long)e.t0 * e.q_heads + e.h0 + warp;
    const float* src = e.part_acc + r * D;
    const long long step = (long long)e.rows * D;
    auto stage = [&](int s0, int n) {   // splits s0 .. s0 + n - 1 of this row, a 16-byte piece a lane a step
#pragma unroll 1
        for (int x = lane; x < n * P; x += 32)
            cp_async16(smem_u32(sv + x * 4), src + (s0 + x / P) * step + 4 * (x % P), 16);
        cp_commit();
    };
    stage(0, min(per, active));
    float2 ml[K];
    attn::load_split_ml(active, r, e.rows, lane, e.part_ml, ml);
    float mx, total, wt[K], o[C];
    attn::global_split_weights(ml, active, lane, mx, wt, total);
#pragma unroll
    for (int k = 0; k < K; ++k) sw[lane + 32 * k] = wt[k];
    STAMP(10);
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = 0.f;
#pragma unroll 1
    for (int s0 = 0; s0 < active; s0 += per) {
        const int n = min(per, active - s0);
        if (s0 > 0) {
            __syncwarp();               // every lane past the batch before
            stage(s0, n);
        }
        cp_wait<0>();
        __syncwarp();                   // the batch's pieces (and the weights) from every lane
        if (s0 == 0) STAMP(11);
        // kMergeSumUnroll splits' shared-memory loads at once, not each after the one before's sums
        // (ATTN_MERGE_SUM_UNROLL=1: one at a time, for the A/B)
#pragma unroll kMergeSumUnroll
        for (int s = 0; s < n; ++s) {
            const float ws = sw[s0 + s];
            const float* v = sv + s * D + lane * C;
#pragma unroll
            for (int c = 0; c < C; c += 2) {
                const float2 t = *reinterpret_cast<const float2*>(v + c);
                o[c] = fmaf(ws, t.x, o[c]);
                o[c + 1] = fmaf(ws, t.y, o[c + 1]);
            }
        }
    }
    total = attn::warp_sum(total);
    attn::end_row<C>(o, mx, total, false, 0, r, 0, lane, e.out, nullptr, nullptr, e.xq, e.xd, e.xs);
}

// active: blocks with work in this block's split group (1: no split); clustered: the split's
// blocks are one cluster (MW = 1 decode), whose merge this does between two cluster barriers, or,
// with `push` (push_begin called; one token a block, real rows r < nh <= kPushRows <= WARPS),
// through rank 0's barriers. stage_floats: floats of `so` the last block of a global merge may stage
// the partials in (merge_rolled, one token a block with at most WARPS real rows; 0: merge_splits).
struct NoExitHook {
    __device__ void operator()() const {}
};
template <int D, int M, int KW, int WARPS, class Exit = NoExitHook>
__device__ __forceinline__ void end_block(float* so, const float (&o)[D / 8][4], const float (&m)[2],
                                          const float (&l)[2], int mw, int kw, int active, bool clustered,
                                          const EndRows& e, PushBars* push = nullptr, int stage_floats = 0,
                                          Exit on_exit = Exit()) {
    constexpr int NO = D / 8, C = D / 32, SD = merge_stride<D, KW>();
    static_assert(kPushRows <= WARPS, "a pushed merge's rows are one a warp");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* sml = so + KW * M * SD;
    float* cacc = sml + 2 * KW * M;     // cluster merge: this block's partial [M][D] ...
    float* cml = cacc + M * D;          // ... and its (max, sum) [M][2]
    float* pacc = cacc;                 // pushed merge (rank 0's): [kPushSplits][kPushRows][D] ...
    float* pml = pacc + kPushSplits * kPushRows * D;   // ... and [kPushSplits][kPushRows][2]
    const unsigned rank = push != nullptr ? cluster_rank() : 0u;
    if (push != nullptr) {
        cluster_wait();                 // push_begin's announcement: every block's barriers are set
        STAMP(12);
        // rank 0's K/V tiles are done (the caller's barrier): the others may push into it
        if (rank == 0 && threadIdx.x > 0 && (int)threadIdx.x < active)
            mbar_arrive_cluster_relaxed(map_rank(smem_addr(&push->ready), threadIdx.x));
        // every other split's rows: D floats and (max, sum). Their bytes may land before this
        // (tx-count below zero for a while, as the PTX ISA allows); the phase cannot complete
        // before this, its one arrival
        if (rank == 0 && threadIdx.x == 0)
            mbar_arrive_expect_tx(&push->full, (unsigned)((active - 1) * e.nh * (D + 2) * 4));
    }
    {
        const float lq[2] = {quad_sum(l[0]), quad_sum(l[1])};
#pragma unroll
        for (int h = 0; h < 2; ++h) {   // rows g and g + 8: c = 2h, 2h + 1
            const int r = 16 * mw + c_row(lane, 2 * h);
            if (r / e.hpb >= e.ntb || r % e.hpb >= e.nh) continue;   // padding: never merged
            float2* row = reinterpret_cast<float2*>(so + (kw * M + r) * SD + c_col(lane, 2 * h));
#pragma unroll
            for (int n = 0; n < NO; ++n) row[4 * n] = make_float2(o[n][2 * h], o[n][2 * h + 1]);
        }
        if ((lane & 3) == 0)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = 16 * mw + (lane >> 2) + 8 * i;
                sml[2 * (kw * M + r)] = m[i];
                sml[2 * (kw * M + r) + 1] = lq[i];
            }
    }
    __syncthreads();
    STAMP(13);
    const bool split = active > 1;
    for (int r = warp; r < M; r += WARPS) {
        const int ti = r / e.hpb, hh = r % e.hpb;
        if (ti >= e.ntb || hh >= e.nh) continue;
        float mx, total, ov[C];
        attn::merge_warps<C, KW>([&](int w) { return sml + 2 * (w * M + r); },
                                 [&](int w) { return so + (w * M + r) * SD; }, lane, ov, mx, total);
        if (r == 0) STAMP(14);
        if (push != nullptr) {          // split `rank`'s partial of row r into rank 0's area
            float* acc = pacc + ((int)rank * kPushRows + r) * D + lane * C;
            float* ml = pml + 2 * ((int)rank * kPushRows + r);
            if (rank == 0) {
#pragma unroll
                for (int c = 0; c < C; ++c) acc[c] = ov[c];
                if (lane == 0) *reinterpret_cast<float2*>(ml) = make_float2(mx, total);
            } else {
                mbar_wait_cluster<false>(&push->ready, 0);
                if (r == 0) STAMP(15);
                const float v[2] = {mx, total};
                const unsigned full0 = map_rank(smem_addr(&push->full), 0);
                st_async<C>(map_rank(smem_addr(acc), 0), ov, full0);
                if (lane == 0) st_async<2>(map_rank(smem_addr(ml), 0), v, full0);
            }
        } else if (clustered) {         // the partial stays in shared memory
#pragma unroll
            for (int c = 0; c < C; ++c) cacc[r * D + lane * C + c] = ov[c];
            if (lane == 0) {
                cml[2 * r] = mx;
                cml[2 * r + 1] = total;
            }
        } else {
            attn::end_row<C>(ov, mx, total, split, (int)blockIdx.x, (long long)(e.t0 + ti) * e.q_heads + e.h0 + hh,
                             e.rows, lane, e.out, e.part_acc, e.part_ml, e.xq, e.xd, e.xs);
        }
    }
    STAMP(6);
    if (!split) return;
    if (push != nullptr) {
        if (rank != 0) {                // its rows are counted on rank 0's `full` as they land
            on_exit();
            return;
        }
        if (warp >= e.nh) return;
        mbar_wait_cluster(&push->full, 0);
        __syncwarp();                   // and this warp's own split-0 row, stored by its lanes
        STAMP(8);
        attn::pushed_merge_row<C>(active, pacc + warp * D, pml + 2 * warp, kPushRows * D, 2 * kPushRows,
                                  (long long)e.t0 * e.q_heads + e.h0 + warp, lane, e.out, e.xq, e.xd, e.xs);
        STAMP(9);
        STAMP(7);
        return;
    }
    if (clustered) {
        // every block's partial is in its shared memory: warp w of block b merges rows b WARPS + w,
        // + WARPS ncl, ... over the blocks of rank < active (rank = split), then all wait until
        // those reads are done before any block exits
        cluster_sync();
        STAMP(8);
        const int ncl = (int)cluster_size();
        for (int r = (int)cluster_rank() * WARPS + warp; r < M; r += WARPS * ncl) {
            const int ti = r / e.hpb, hh = r % e.hpb;
            if (ti < e.ntb && hh < e.nh)
                attn::cluster_merge_row<C>(active, cacc + r * D, cml + 2 * r, (long long)(e.t0 + ti) * e.q_heads + e.h0 + hh,
                                           lane, e.out, e.xq, e.xd, e.xs);
        }
        STAMP(9);
        cluster_sync();
        STAMP(7);
        return;
    }
    // the last block of this (token, kv head x head chunk) merges the partials (attn_split.cuh)
    if (!attn::last_block(e.counter, active)) return;
    STAMP(8);
    if (e.ntb == 1 && e.nh <= WARPS && stage_floats / WARPS >= 32 * attn::kSplitGroups + D) {
        merge_rolled<D, WARPS>(so, stage_floats, active, e);
        STAMP(7);
        return;
    }
    for (int r = warp; r < M; r += WARPS) {
        const int ti = r / e.hpb, hh = r % e.hpb;
        if (ti < e.ntb && hh < e.nh)
            attn::merge_splits<C>(active, (long long)(e.t0 + ti) * e.q_heads + e.h0 + hh, e.rows, lane, e.out,
                                  e.part_acc, e.part_ml, e.xq, e.xd, e.xs);
    }
    STAMP(7);
}

}  // namespace amma
