// attn_split.cuh — what the attention kernels (attention.cu, attention_mma.cu) share: the positions
// a token sees, and the end of split-K (flash-decoding): each block with work writes its rows'
// output or partial, and the last block of a (token, kv head x head chunk) to finish merges the
// partials in split order, so the sum does not depend on which block is last.
//
// Partials: part_acc[(s * rows + r) * D + column] (unnormalised output of split s for output row
// r = token * q_heads + head), part_ml[2 * (s * rows + r)] = (max, sum) in the log2 domain.
// Or, when a token's splits are the blocks of one thread block cluster (attention_mma.cu), each
// block leaves its partial in its own shared memory and the merge reads them through distributed
// shared memory (cluster_merge_row): no global round trip, fence or counter.
#pragma once
#include "cluster.cuh"
#include "q8.cuh"

// -inf without math.h (NVRTC compiles these files with no headers)
#define kNegInf (-__int_as_float(0x7f800000))

namespace attn {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, off));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kFull, x, off);
    return x;
}

// the positions [lo, hi) a token at `pos` of a sequence of `len` may see (masked: all of them,
// the visibility mask decides per position)
__device__ __forceinline__ void visible_range(int len, int pos, bool masked, int window, int& lo, int& hi) {
    lo = 0;
    hi = len;
    if (!masked) {
        hi = min(len, pos + 1);
        if (window > 0) lo = max(0, pos - window + 1);
    }
}

// The lowest position the step's tokens write for sequence seq (0x7fffffff: none), by a warp's
// lanes together (tok_seq and tok_pos are the step's upload, so this may run before pdl_wait).
__device__ __forceinline__ int first_new_position(const int* __restrict__ tok_seq, const int* __restrict__ tok_pos,
                                                  int n_tok, int seq, int lane) {
    int lowest = 0x7fffffff;
    for (int t = lane; t < n_tok; t += 32)
        if (tok_seq[t] == seq) lowest = min(lowest, tok_pos[t]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) lowest = min(lowest, __shfl_xor_sync(kFull, lowest, off));
    return lowest;
}

// One warp merges a row's partials from the KW warps of its block that split its positions: warp
// w's (max, sum) at ml(w)[0], ml(w)[1] and its unnormalised columns at acc(w)[column]; this lane's
// columns lane * C .. into o, and the row's max and sum into mx and total (for end_row).
template <int C, int KW, class ML, class ACC>
__device__ __forceinline__ void merge_warps(ML ml, ACC acc, int lane, float (&o)[C], float& mx, float& total) {
    mx = kNegInf;
#pragma unroll
    for (int w = 0; w < KW; ++w) mx = fmaxf(mx, ml(w)[0]);
    const float mu = mx == kNegInf ? 0.f : mx;
    total = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = 0.f;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
        const float wt = exp2f(ml(w)[0] - mu);        // 0 for a warp that saw nothing
        total = fmaf(wt, ml(w)[1], total);
#pragma unroll
        for (int c = 0; c < C; ++c) o[c] = fmaf(wt, acc(w)[lane * C + c], o[c]);
    }
}

// One warp ends output row r (lane holds columns lane * C ..): with one block of work, the
// normalised output (zeros for a row that saw nothing) and its int8 codes when xq is not null;
// otherwise split `split`'s partial (o unnormalised, with the row's max mx and sum total).
template <int C>
__device__ __forceinline__ void end_row(float (&o)[C], float mx, float total, bool split, int split_index,
                                        long long r, int rows, int lane, float* __restrict__ out,
                                        float* __restrict__ part_acc, float* __restrict__ part_ml,
                                        int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs) {
    constexpr int D = 32 * C;
    if (!split) {
        const float inv = total > 0.f ? 1.f / total : 0.f;   // a token that sees nothing gets zeros
#pragma unroll
        for (int c = 0; c < C; ++c) out[r * D + lane * C + c] = o[c] = o[c] * inv;
        if (xq != nullptr) q8_lane<C>(o, (int)r * D + lane * C, xq, xd, xs);
    } else {
        const long long pr = (long long)split_index * rows + r;
        float* dst = part_acc + pr * D + lane * C;   // 8 C-byte aligned (the workspace is)
#pragma unroll
        for (int c = 0; c < C; c += 2) *reinterpret_cast<float2*>(dst + c) = make_float2(o[c], o[c + 1]);
        if (lane == 0) *reinterpret_cast<float2*>(part_ml + 2 * pr) = make_float2(mx, total);
    }
}

// Every thread of the block calls it after writing its partials: true in the last of `active`
// blocks to get here for `counter`, which it sets back to 0 for the next launch (counters start
// at 0; launches that share them must not overlap). The other blocks' partials are then in L2.
__device__ __forceinline__ bool last_block(int* counter, int active) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == active - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    const bool mine = last;
    if (mine) __threadfence();
    return mine;
}

constexpr int kSplitGroups = 8;                     // kSplitGroups * 32 >= MAX_SPLITS (ops/attention.py)

// Lane s's (max, sum) of row r's global partials s, s + 32, ... (past `active`: none), from L2
__device__ __forceinline__ void load_split_ml(int active, long long r, int rows, int lane,
                                              const float* __restrict__ part_ml, float2 (&ml)[kSplitGroups]) {
#pragma unroll
    for (int k = 0; k < kSplitGroups; ++k) {
        const int s = lane + 32 * k;
        ml[k] = s < active ? __ldcg(reinterpret_cast<const float2*>(part_ml) + (long long)s * rows + r)
                           : make_float2(kNegInf, 0.f);
    }
}

// From load_split_ml's values: the row's max over the splits, split s's weight 2^(max_s - max) in
// wt[s / 32] of lane s % 32, and this lane's share of the row's sum (warp_sum adds them)
__device__ __forceinline__ void global_split_weights(const float2 (&ml)[kSplitGroups], int active, int lane, float& mx,
                                                     float (&wt)[kSplitGroups], float& total) {
    mx = kNegInf;
#pragma unroll
    for (int k = 0; k < kSplitGroups; ++k) mx = fmaxf(mx, ml[k].x);
    mx = warp_max(mx);
    const float mu = mx == kNegInf ? 0.f : mx;
    total = 0.f;
#pragma unroll
    for (int k = 0; k < kSplitGroups; ++k) {
        wt[k] = lane + 32 * k < active ? exp2f(ml[k].x - mu) : 0.f;
        total = fmaf(wt[k], ml[k].y, total);
    }
}

// One warp merges output row r over the `active` splits' partials, in split order, read from L2
// (ld.cg), and writes the normalised output and its codes. The loads are a chain of L2 trips after
// every other block's end, so they are issued as early as they can be: every split's (max, sum)
// (lane s: splits s, s + 32, ...) together with the first B splits' columns, and each next B
// splits' columns before the current ones are summed (B C = 32 floats a lane in flight). The sums
// are the same, in the same order, as one split after another.
template <int C>
__device__ __forceinline__ void merge_splits(int active, long long r, int rows, int lane, float* __restrict__ out,
                                             const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                             int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs) {
    constexpr int D = 32 * C, B = 32 / C, K = kSplitGroups;
    const float* col = part_acc + r * D + lane * C;  // split s: col + s * rows * D
    const long long step = (long long)rows * D;
    float v[2][B][C];
    auto load = [&](float (&dst)[B][C], int s0) {
#pragma unroll
        for (int j = 0; j < B; ++j)
            if (s0 + j < active)
#pragma unroll
                for (int c = 0; c < C; ++c) dst[j][c] = __ldcg(col + (s0 + j) * step + c);
    };
    float2 ml[K];
    load_split_ml(active, r, rows, lane, part_ml, ml);
    load(v[0], 0);
    float mx, total, wt[K], o[C];
    global_split_weights(ml, active, lane, mx, wt, total);
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = 0.f;
    int cur = 0;                                     // the buffer of the batch being summed
#pragma unroll
    for (int k = 0; k < K; ++k) {                    // splits 32 k .. 32 k + 31: weights in lane order
        if (32 * k >= active) break;
        for (int jb = 0; jb < 32 && 32 * k + jb < active; jb += B) {
            const int s0 = 32 * k + jb;
            if (s0 + B < active) {
                if (cur == 0) load(v[1], s0 + B);
                else load(v[0], s0 + B);
            }
#pragma unroll
            for (int j = 0; j < B; ++j) {
                const float wj = __shfl_sync(kFull, wt[k], jb + j);
                if (s0 + j < active)
#pragma unroll
                    for (int c = 0; c < C; ++c) o[c] = fmaf(wj, cur == 0 ? v[0][j][c] : v[1][j][c], o[c]);
            }
            cur ^= 1;
        }
    }
    total = warp_sum(total);
    end_row<C>(o, mx, total, false, 0, r, rows, lane, out, nullptr, nullptr, xq, xd, xs);
}

// ---------------------------------------------------------------- thread block clusters (sm_90 PTX)

// the shared-memory address of *p in block `rank` of the cluster (cluster.cuh's map_rank; the
// local address by the builtin, as attention_mma.cu converts its own)
__device__ __forceinline__ unsigned cluster_addr(const void* p, unsigned rank) {
    return map_rank((unsigned)__cvta_generic_to_shared(p), rank);
}
__device__ __forceinline__ float2 ld_cluster2(unsigned a) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}
// C consecutive floats (C = 2, 4, 8; 8 C-byte aligned)
template <int C>
__device__ __forceinline__ void ld_cluster(float (&v)[C], unsigned a) {
    if constexpr (C == 2) {
        const float2 t = ld_cluster2(a);
        v[0] = t.x;
        v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < C; i += 4)
            asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[i]), "=f"(v[i + 1]), "=f"(v[i + 2]), "=f"(v[i + 3]) : "r"(a + 4 * i) : "memory");
    }
}

// From lane s's (max, sum) of split s (lanes past `active`: none), the row's max over the splits,
// this lane's split weight 2^(max_s - max) and its share of the row's sum (warp_sum adds them).
__device__ __forceinline__ void split_weights(float2 sml, int active, int lane, float& mx, float& wt, float& total) {
    mx = warp_max(sml.x);
    const float mu = mx == kNegInf ? 0.f : mx;
    wt = lane < active ? exp2f(sml.x - mu) : 0.f;
    total = lane < active ? wt * sml.y : 0.f;
}

// One warp merges output row r over the partials of the cluster's first `active` blocks (at most
// 32), in split (= rank) order as merge_splits does, and writes the normalised output and its
// codes. acc: this block's partial of the row (D floats), ml: its (max, sum); the other blocks'
// lie at the same shared addresses of theirs. Call between two cluster_sync(): after every block
// wrote its partial, before any block exits.
template <int C>
__device__ __forceinline__ void cluster_merge_row(int active, const float* acc, const float* ml, long long r,
                                                  int lane, float* __restrict__ out, int* __restrict__ xq,
                                                  float* __restrict__ xd, float* __restrict__ xs) {
    constexpr int B = C == 8 ? 4 : 8;                // splits whose columns are loaded together
    const float* mine = acc + lane * C;
    float2 sml = make_float2(kNegInf, 0.f);
    if (lane < active) sml = ld_cluster2(cluster_addr(ml, lane));
    float v[B][C];                                   // the first B splits' columns, in flight with (m, l)
#pragma unroll
    for (int j = 0; j < B; ++j)
        if (j < active) ld_cluster<C>(v[j], cluster_addr(mine, j));
    float mx, wt, total, o[C];
    split_weights(sml, active, lane, mx, wt, total);
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = 0.f;
    for (int s0 = 0; s0 < active; s0 += B) {
        if (s0 > 0)
#pragma unroll
            for (int j = 0; j < B; ++j)
                if (s0 + j < active) ld_cluster<C>(v[j], cluster_addr(mine, s0 + j));
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const float wj = __shfl_sync(kFull, wt, (s0 + j) & 31);
            if (s0 + j < active)
#pragma unroll
                for (int c = 0; c < C; ++c) o[c] = fmaf(wj, v[j][c], o[c]);
        }
    }
    total = warp_sum(total);
    end_row<C>(o, mx, total, false, 0, r, 0, lane, out, nullptr, nullptr, xq, xd, xs);
}

// cluster_merge_row's merge, the same sums in the same order, over partials already in this
// block's shared memory (the pushed merge, attn_mma_end.cuh): split s's columns at acc + s * astep,
// its (max, sum) at ml + s * mstep.
template <int C>
__device__ __forceinline__ void pushed_merge_row(int active, const float* acc, const float* ml, int astep, int mstep,
                                                 long long r, int lane, float* __restrict__ out, int* __restrict__ xq,
                                                 float* __restrict__ xd, float* __restrict__ xs) {
    const float* mine = acc + lane * C;
    float2 sml = make_float2(kNegInf, 0.f);
    if (lane < active) sml = *reinterpret_cast<const float2*>(ml + lane * mstep);
    float mx, wt, total, o[C];
    split_weights(sml, active, lane, mx, wt, total);
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = 0.f;
#pragma unroll 4
    for (int s = 0; s < active; ++s) {
        const float ws = __shfl_sync(kFull, wt, s);
        float v[C];
#pragma unroll
        for (int c = 0; c < C; c += 2) {
            const float2 t = *reinterpret_cast<const float2*>(mine + s * astep + c);
            v[c] = t.x;
            v[c + 1] = t.y;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) o[c] = fmaf(ws, v[c], o[c]);
    }
    total = warp_sum(total);
    end_row<C>(o, mx, total, false, 0, r, 0, lane, out, nullptr, nullptr, xq, xd, xs);
}

}  // namespace attn
