// sampling_topk.cuh — the short path of sample_rows for rows with a small top-k (0 < k <= kTopkFast):
// one read of the row for its maximum and a lower bound on the k-th largest logit, a second read
// (from L1/L2) that gathers the few logits at or above the bound into one block, and steps 2-6 of
// sampling.cu on that list in the one block, with no radix passes and no more cluster barriers.
//
// The bound. Split the row's ids into G disjoint groups (g lanes' ids each) and take each group's
// largest logit. The k-th largest of these G maxima, tau, is at most the row's k-th largest logit:
// the k groups with the largest maxima hold k distinct ids >= tau. So {l >= tau} holds every id
// that top-k keeps, and the k-th largest of that list is the row's k-th largest. With G >= 4k
// groups of iid logits the list holds about 1.2k entries.
//
// The list's entries are the row's ids with their logits; the weights E = fixed(exp_rel(l)) and
// every threshold are computed by the rules of row_filter / weight_sum / draw in
// sampling_rows.cuh (the top-p threshold is the largest e whose weight of e-values >= it reaches
// the target, as select_from_top finds it), so the token is the one the long path draws. When the
// list would exceed kTopkList entries (many ties at the bound, or -inf logits around it), every
// block of the cluster learns it from the same count and the row takes the long path.
#pragma once
#include "sampling_rows.cuh"

constexpr int kTopkFast = 256;              // the largest k the short path serves
constexpr int kTopkList = kThreads;         // list entries: one per thread of the last block

// ---------------------------------------------------------------- distributed shared memory

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ u32 map_rank(u32 local, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}

__device__ __forceinline__ u32 ld_cluster_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_cluster_u32(u32 addr, u32 v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ u32 add_cluster_u32(u32 addr, u32 v) {
    u32 old;
    asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(addr), "r"(v) : "memory");
    return old;
}

// ---------------------------------------------------------------- reading a chunk

// f(i, x[i]) for every id of [lo, hi): 16-byte loads for the aligned middle, four in flight per
// thread, and single loads for the ends. Every thread of the block calls it.
template <class F>
__device__ __forceinline__ void for_chunk(const float* __restrict__ x, int lo, int hi, F&& f) {
    const int mis = (int)(((size_t)(x + lo) >> 2) & 3u);
    const int a = min(hi, lo + ((4 - mis) & 3));
    const int nv = (hi - a) >> 2;
    const int b = a + 4 * nv;
    const int t = threadIdx.x;
    if (t < a - lo) f(lo + t, x[lo + t]);
    if (t < hi - b) f(b + t, x[b + t]);
    const float4* __restrict__ v = reinterpret_cast<const float4*>(x + a);
    int j = t;
    for (; j + 3 * kThreads < nv; j += 4 * kThreads) {
        float4 q[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) q[u] = v[j + u * kThreads];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = a + 4 * (j + u * kThreads);
            f(i, q[u].x);
            f(i + 1, q[u].y);
            f(i + 2, q[u].z);
            f(i + 3, q[u].w);
        }
    }
    for (; j < nv; j += kThreads) {
        const float4 q = v[j];
        const int i = a + 4 * j;
        f(i, q.x);
        f(i + 1, q.y);
        f(i + 2, q.z);
        f(i + 3, q.w);
    }
}

// ---------------------------------------------------------------- shared memory

// What a block publishes for the others of its cluster (outside the union below, so the long
// path's use of Smem never overwrites it while another block may still read it).
struct TopkPub {
    float gmax[kThreads];                   // this block's group maxima (the first kThreads / g)
    float v;                                // the block's max logit (NaN read as -inf) ...
    int i;                                  // ... its lowest id
    int bad;                                // NaN or +inf seen
    u32 n;                                  // rank 0: list entries claimed (more than kTopkList: overflowed)
};

// The short path's working set (in a union with the long path's Smem).
struct TopkWork {
    float __align__(16) all[kThreads];      // every group maximum of the cluster, -inf padded
    float __align__(16) lval[kTopkList];    // rank 0: the list's logits ...
    int lid[kTopkList];                     // ... their ids
    float le[kTopkList];                    // e of each kept entry, -1 for the others
    u64 lw[kTopkList];                      // E, then the drawn weight
    u64 sh[kWarps + 1];
    float fsh[kWarps];
    u32 tau_key;
};

struct SampleSmem {
    TopkPub pub;
    union {
        Smem slow;
        TopkWork fast;
    };
};

// Lanes per group: the largest power of two (<= 32) that leaves at least 4k groups in the cluster.
template <int C>
__device__ __forceinline__ int topk_group_lanes(int k) {
    int g = 32;
    while (g > 1 && C * kThreads / g < 4 * k) g >>= 1;
    return g;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    return v;
}

// ---------------------------------------------------------------- step 1, with the group maxima

// Max, lowest argmax and the non-finite check over this block's ids [lo, hi), combined over the
// cluster into rd (the results of row_max); with g > 0 also the cluster's group maxima of g lanes
// each into w.all (G = C * kThreads / g of them, padded with -inf to a multiple of 4). Two cluster
// barriers: after the first every block reads the others' TopkPub, after the second it may be reused.
template <int C>
__device__ __forceinline__ void row_max_groups(const float* __restrict__ x, int lo, int hi, int g, SampleSmem& sm,
                                               RowDist& rd) {
    float lmax = neg_inf(), mine = neg_inf();
    int amax = 0x7fffffff;
    int bad = 0;
    for_chunk(x, lo, hi, [&](int i, float l) {
        bad |= (l != l) | (l == pos_inf());
        const float m = l != l ? neg_inf() : l;
        take_better(lmax, amax, m, i);
        mine = fmaxf(mine, m);
    });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (g > 0) {
        for (int o = g >> 1; o > 0; o >>= 1) mine = fmaxf(mine, __shfl_xor_sync(0xffffffffu, mine, o));
        if ((lane & (g - 1)) == 0) sm.pub.gmax[threadIdx.x / g] = mine;
    }
    // the block's max and lowest argmax (as cluster_argmax's first half)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(lmax, amax, __shfl_xor_sync(0xffffffffu, lmax, o), __shfl_xor_sync(0xffffffffu, amax, o));
    float* sv = sm.fast.fsh;
    int* si = reinterpret_cast<int*>(sm.fast.sh);
    if (lane == 0) {
        sv[warp] = lmax;
        si[warp] = amax;
    }
    bad = __syncthreads_or(bad);
    lmax = sv[lane];
    amax = si[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(lmax, amax, __shfl_xor_sync(0xffffffffu, lmax, o), __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x == 0) {
        sm.pub.v = lmax;
        sm.pub.i = amax;
        sm.pub.bad = bad;
        sm.pub.n = 0;
    }
    const int per_block = g > 0 ? kThreads / g : 0;
    const int groups = C * per_block;
    if (C == 1) {
        __syncthreads();
        if (g > 0) sm.fast.all[threadIdx.x] = threadIdx.x < groups ? sm.pub.gmax[threadIdx.x] : neg_inf();
    } else {
        cluster_sync();
        for (u32 r = 0; r < (u32)C; ++r) {
            const u32 base = map_rank(smem_addr(&sm.pub.v), r);
            const float v2 = __uint_as_float(ld_cluster_u32(base));
            const int i2 = (int)ld_cluster_u32(base + 4);
            bad |= (int)ld_cluster_u32(base + 8);
            take_better(lmax, amax, v2, i2);
        }
        if (g > 0) {
            const int j = threadIdx.x;
            float m = neg_inf();
            if (j < groups) m = __uint_as_float(ld_cluster_u32(map_rank(smem_addr(&sm.pub.gmax[j % per_block]), j / per_block)));
            sm.fast.all[j] = m;
        }
        cluster_sync();
    }
    rd.bad = bad | (lmax == neg_inf());
    rd.lmax = lmax;
    rd.amax = amax;
}

// ---------------------------------------------------------------- steps 2-6 on a gathered list

// The token of a finite row at temperature t > 0 with 0 < k <= kTopkFast, k < vocab, after
// row_max_groups<C>(..., topk_group_lanes<C>(k), ...). Returns false (in every block of the
// cluster alike) when the list overflowed: the caller then runs the long path, which rewrites
// all of Smem it reads. Otherwise rank 0 writes tokens[row] and flags[row] and the others are done.
template <int C>
__device__ __forceinline__ bool topk_short_path(const float* __restrict__ x, int lo, int hi, int k, float t,
                                                float top_p, float min_p, u32 u24, const RowDist& rd, SampleSmem& sm,
                                                int* token, int* flag) {
    TopkWork& w = sm.fast;
    const int tid = threadIdx.x;
    const int groups = C * (kThreads / topk_group_lanes<C>(k));
    // tau: the k-th largest group maximum (ties: the smallest value whose count of larger ones is < k)
    if (tid == 0) w.tau_key = 0xffffffffu;
    __syncthreads();
    if (tid < groups) {
        const float m = w.all[tid];
        int gt = 0;
        const float4* a4 = reinterpret_cast<const float4*>(w.all);
        for (int q = 0; q < (groups + 3) / 4; ++q) {
            const float4 a = a4[q];
            gt += (a.x > m) + (a.y > m) + (a.z > m) + (a.w > m);
        }
        if (gt < k) atomicMin(&w.tau_key, order_key(m));
    }
    __syncthreads();
    const float tau = key_value(w.tau_key);

    // the list: every id of the row with l >= tau, in rank 0's shared memory
    const u32 n_at = map_rank(smem_addr(&sm.pub.n), 0);
    const u32 val_at = map_rank(smem_addr(&w.lval[0]), 0);
    const u32 id_at = map_rank(smem_addr(&w.lid[0]), 0);
    for_chunk(x, lo, hi, [&](int i, float l) {
        if (l >= tau) {
            const u32 at = C == 1 ? atomicAdd(&sm.pub.n, 1u) : add_cluster_u32(n_at, 1u);
            if (at < (u32)kTopkList) {
                if (C == 1) {
                    w.lval[at] = l;
                    w.lid[at] = i;
                } else {
                    st_cluster_u32(val_at + 4 * at, __float_as_uint(l));
                    st_cluster_u32(id_at + 4 * at, (u32)i);
                }
            }
        }
    });
    if (C == 1) __syncthreads();
    else cluster_sync();                    // every entry is in rank 0's list
    const u32 n = C == 1 ? sm.pub.n : ld_cluster_u32(n_at);
    if (n > (u32)kTopkList) return false;   // the same count in every block
    if (C > 1 && cluster_rank() != 0) return true;

    // rank 0 alone from here: entry tid of the list, if any
    const int N = (int)n, N4 = (N + 3) & ~3;
    if (tid >= N && tid < N4) w.lval[tid] = neg_inf();     // padding: never larger than an entry
    __syncthreads();
    const bool mine = tid < N;
    const float l = mine ? w.lval[tid] : neg_inf();
    const int id = mine ? w.lid[tid] : 0x7fffffff;
    // 2. top-k: kept when fewer than k entries are larger (the list holds every id >= the k-th)
    int gt = 0;
    if (mine) {
        const float4* a4 = reinterpret_cast<const float4*>(w.lval);
        for (int q = 0; q < N4 / 4; ++q) {
            const float4 a = a4[q];
            gt += (a.x > l) + (a.y > l) + (a.z > l) + (a.w > l);
        }
    }
    const bool kept = mine && gt < k;
    // 3. e and E of the kept entries, S their sum
    const float e = kept ? exp_rel(l, rd.lmax, t) : 0.f;
    const u64 E = kept ? fixed(e) : 0ull;
    if (tid < N4) {
        w.le[tid] = kept ? e : -1.f;
        w.lw[tid] = E;
    }
    const u64 s = block_sum(E, w.sh);       // its barriers order the writes above
    // 4. top-p: the largest e of a kept entry whose weight of e-values >= it reaches the target
    float e_min = 0.f;
    if (top_p < 1.f) {
        double want = ceil((double)top_p * (double)s);
        want = want < 1.0 ? 1.0 : (want > (double)s ? (double)s : want);
        u64 above = 0;
        if (kept)
            for (int j = 0; j < N; ++j) above += w.le[j] >= e ? w.lw[j] : 0ull;
        e_min = block_max(kept && above >= (u64)want ? e : 0.f, w.fsh);
    }
    // 5. min-p, as in row_filter
    e_min = fminf(fmaxf(e_min, min_p), 1.f);
    // 6. the draw, in id order, over the kept entries' weights
    const u64 wt = kept && e >= e_min ? E : 0ull;
    __syncthreads();                        // every read of lw above is done
    if (tid < N4) w.lw[tid] = wt;
    const u64 total = block_sum(wt, w.sh);
    const u64 target = draw_target(u24, total);
    if (wt) {
        u64 c = 0;
        for (int j = 0; j < N; ++j) c += w.lid[j] < id ? w.lw[j] : 0ull;
        if (c <= target && target < c + wt) *token = id;   // exactly one entry
    }
    if (tid == 0) *flag = 0;
    return true;
}
