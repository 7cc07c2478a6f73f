// sampling_topk.cuh — the short path of sample_rows for rows with a small top-k (0 < k <= kTopkFast):
// one read of the row for its maximum and a lower bound on the k-th largest logit, a second read
// (from L1/L2) that gathers the few logits at or above the bound into one block, and steps 2-6 of
// sampling.cu on that list in the one block, with no radix passes and no more cluster barriers.
//
// The bound. Split the row's ids into G disjoint groups (g lanes' ids each) and take each group's
// largest logit. A value tau at most the k-th largest of these G maxima (group_bound: the lower
// edge of its radix bin) is at most the row's k-th largest logit: the k groups with the largest
// maxima hold k distinct ids >= tau. So {l >= tau} holds every id
// that top-k keeps, and the k-th largest of that list is the row's k-th largest. With G >= 4k
// groups of iid logits the list holds about 1.2k entries.
//
// The list's entries are the row's ids with their logits; the weights E = fixed(exp_rel(l)) and
// every threshold are computed by the rules of row_filter / weight_sum / draw in
// sampling_rows.cuh (the top-p threshold is the largest e whose weight of e-values >= it reaches
// the target, as select_from_top finds it), so the token is the one the long path draws. When the
// list would exceed kTopkList entries (many ties at the bound, or -inf logits around it), every
// block of the cluster learns it from the same count and the row takes the long path.
// The verification kernel (speculative.cu: verify_list) decides its positions from the same list.
#pragma once
#include "sampling_rows.cuh"

// GLIMMER_TOPK_CLOCKS (bench/probe_sampling_topk.py only): thread 0 of block 0 stamps clock64()
// at each stage boundary into topk_clocks, so one launch shows where the row's time goes.
#ifdef GLIMMER_TOPK_CLOCKS
__device__ long long topk_clocks[24];
#define TOPK_CLOCK(n) do { if (threadIdx.x == 0 && blockIdx.x == 0) topk_clocks[n] = clock64(); } while (0)
#else
#define TOPK_CLOCK(n) do { } while (0)
#endif

constexpr int kTopkFast = 256;              // the largest k the short path serves
constexpr int kTopkList = kThreads;         // list entries: one per thread of the last block

// ---------------------------------------------------------------- distributed shared memory

__device__ __forceinline__ uint4 ld_cluster_v4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr) : "memory");
    return v;
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

// [lo, hi) as for_chunk reads it: ids [lo, a) and [b, hi) singly, [a, b) in float4s from x + a,
// which is 16-byte aligned.
struct ChunkSplit {
    int a, nv, b;
};

__device__ __forceinline__ ChunkSplit chunk_split(const float* x, int lo, int hi) {
    const int mis = (int)(((size_t)(x + lo) >> 2) & 3u);
    const int a = min(hi, lo + ((4 - mis) & 3));
    const int nv = (hi - a) >> 2;
    return ChunkSplit{a, nv, a + 4 * nv};
}

// f(i, x[i]) for the single ids at the ends of [lo, hi) (at most 3 each, one a thread).
template <class F>
__device__ __forceinline__ void for_chunk_ends(const float* __restrict__ x, int lo, int hi, const ChunkSplit& c,
                                               F&& f) {
    const int t = threadIdx.x;
    if (t < c.a - lo) f(lo + t, x[lo + t]);
    if (t < hi - c.b) f(c.b + t, x[c.b + t]);
}

// f4(i, j, q) for float4 j (ids i = a + 4j ..) of the aligned middle, from a thread's float4 j on,
// U loads in flight, while U remain; returns the first float4 not taken.
template <int U, class F4, class Stop>
__device__ __forceinline__ int float4_batches(const float4* __restrict__ v, const ChunkSplit& c, int j, F4&& f4,
                                              Stop&& stop) {
    for (; j + (U - 1) * kThreads < c.nv && !stop(); j += U * kThreads) {
        float4 q[U];
#pragma unroll
        for (int u = 0; u < U; ++u) q[u] = v[j + u * kThreads];
#pragma unroll
        for (int u = 0; u < U; ++u) f4(c.a + 4 * (j + u * kThreads), j + u * kThreads, q[u]);
    }
    return j;
}

// f4(i, j, q) for every float4 of the aligned middle: U loads in flight per thread (four by default),
// then four, then one at a time. stop() is asked before each batch of U: true leaves the rest out.
template <int U = 4, class F4, class Stop>
__device__ __forceinline__ void for_chunk_float4s(const float* __restrict__ x, const ChunkSplit& c, F4&& f4,
                                                  Stop&& stop) {
    const float4* __restrict__ v = reinterpret_cast<const float4*>(x + c.a);
    int j = float4_batches<U>(v, c, (int)threadIdx.x, f4, stop);
    if (stop()) return;
    if constexpr (U > 4) j = float4_batches<4>(v, c, j, f4, stop);
    for (; j < c.nv; j += kThreads) f4(c.a + 4 * j, j, v[j]);
}

template <int U = 4, class F4>
__device__ __forceinline__ void for_chunk_float4s(const float* __restrict__ x, const ChunkSplit& c, F4&& f4) {
    for_chunk_float4s<U>(x, c, f4, [] { return false; });
}

// f(i, x[i]) for every id of [lo, hi): 16-byte loads for the aligned middle, four in flight per
// thread, and single loads for the ends. Every thread of the block calls it.
template <class F>
__device__ __forceinline__ void for_chunk(const float* __restrict__ x, int lo, int hi, F&& f) {
    const ChunkSplit c = chunk_split(x, lo, hi);
    for_chunk_ends(x, lo, hi, c, f);
    for_chunk_float4s(x, c, [&](int i, int, const float4& q) {
        f(i, q.x);
        f(i + 1, q.y);
        f(i + 2, q.z);
        f(i + 3, q.w);
    });
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
    float kth, e_min;                       // rank 0: the thresholds of row_filter_short
    u64 seed;                               // sample_rows: the row's seed and position (thread 0
    u32 position;                           // writes them at the start; read after barriers)
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
    float cv;                               // the cluster's max, its lowest id and whether any block
    int ci;                                 // saw NaN or +inf (warp 0 combines the blocks' TopkPub)
    int cbad;
    u32 tau_key;
    u32 n_want;
};

struct SampleSmem {
    TopkPub __align__(16) pub;
    union {
        Smem slow;
        TopkWork fast;
    };
};

// What each thread's first read keeps for the gather (verification at C = 1, where a thread reads
// ~37 float4s of a row): its best float4 (the first holding its max), that float4's index in the
// chunk's aligned middle, and the largest logit it read outside it (its single ids at the chunk's
// ends included; +inf when the read met a non-finite logit). A thread whose `rest` is below the
// bound has every id at or above it in `v`, so it lists them without reading the row again.
struct KeptFloat4 {
    float4 v[kThreads];
    int j[kThreads];                        // -1: the thread read no float4
    float rest[kThreads];
};
constexpr int kKeptBytes = 24 * kThreads;   // ops/speculative.py: KEPT_BYTES_PER_THREAD
// A verification position's watch on its row while it reads (C = 1): thread 0 loads the row's stop
// word with each batch of loads and sets `ended` when the row ended before position a; every thread
// tests `ended` before its next batch and leaves the rest of its chunk out. Set before the read's
// first barrier, read after its last (VERIFY_NO_READ_WATCH: no watch, for the A/B).
struct ReadWatch {
    const int* stop;
    int a;
    int ended;
};

// A thread's own best of the first read (sample_rows): its lowest argmax and its second largest
// logit. A thread whose second largest is below the bound has one id at or above it, its argmax,
// and lists it without reading its ids again (gather_list).
struct ThreadBest {
    float sec;
    int id;
};

#ifdef VERIFY_GATHER_REREAD
constexpr bool kKeepFloat4 = false;         // for the A/B: nothing kept, every listing thread reads again
#else
constexpr bool kKeepFloat4 = true;
#endif
static_assert(sizeof(KeptFloat4) == kKeptBytes, "KeptFloat4's size is part of the launch's contract");

// Lanes per group: the largest power of two (<= 32) that leaves at least 4k groups in the cluster,
// and at most kThreads of them (g >= C): w.all and group_bound's passes hold one a thread. With
// 4 kTopkFast <= kThreads (1024 threads) 4k groups are at most kThreads, so the loop stops at g >= C
// by itself; at 512 threads (speculative.cu's VERIFY_THREADS=512) a k of 129-256 gets kThreads
// groups, still >= k (the bound holds; the list is longer and may overflow to the long path).
// Without the cap, 1024 groups made group_bound's named barrier wait for 1024 threads of a
// 512-thread block: the launch never ended.
template <int C>
__device__ __forceinline__ int topk_group_lanes(int k) {
    constexpr int g_min = 4 * kTopkFast <= kThreads ? 1 : C;
    int g = 32;
    while (g > g_min && C * kThreads / g < 4 * k) g >>= 1;
    return g;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < kWarps ? sh[lane] : neg_inf();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    return v;
}

// Pairwise work over a list of n entries in shared memory, spread over the block: entry j has the
// s consecutive threads (s a power of two <= 32, the largest with s * n <= kThreads) of
// j * s .. j * s + s - 1, thread q of them takes the slice q, q + s, ... of the list, and seg_sum
// adds the s partial results (every thread of the block calls it; each of the s gets the sum).
struct Seg {
    int s, j, q;
    bool on;                                // j < n
};

__device__ __forceinline__ Seg segment(int n) {
    Seg g;
    g.s = 32;
    while (g.s > 1 && g.s * n > kThreads) g.s >>= 1;
    g.j = threadIdx.x / g.s;
    g.q = threadIdx.x & (g.s - 1);
    g.on = g.j < n;
    return g;
}

template <class T>
__device__ __forceinline__ T seg_sum(T v, int s) {
    for (int o = s >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// How many of the n4 (a multiple of 4) floats at a4 exceed m, over the slice q of s (float4 steps).
__device__ __forceinline__ int count_above(const float4* a4, int n4, float m, int q, int s) {
    int gt = 0;
#pragma unroll 4
    for (int i = q; i < n4 / 4; i += s) {
        const float4 a = a4[i];
        gt += (a.x > m) + (a.y > m) + (a.z > m) + (a.w > m);
    }
    return gt;
}

// ---------------------------------------------------------------- step 1, with the group maxima

// Max, lowest argmax and the non-finite check over this block's ids [lo, hi), combined over the
// cluster into rd (the results of row_max); with g > 0 also the cluster's group maxima of g lanes
// each into w.all (G = C * kThreads / g of them, padded with -inf to kThreads), and the thread's
// own max into *tmax. One cluster barrier, after which every block reads the others' TopkPub
// (which nothing overwrites). A block must not exit before the cluster's next barrier: the others
// may still be reading its TopkPub.
//
// kMax4: the aligned middle is taken through rowmath::Max4 (speculative.cu's verification, where a
// block reads a whole row in ~9 rounds of loads); sample_rows' reads are one or two rounds a thread
// and its 64 registers have no room for Max4's seven (it would spill). With kMax4 at C = 1, keep
// (required there) receives each thread's KeptFloat4 for gather_list; without kMax4, one (if
// given) receives the thread's lowest argmax and second largest logit.
template <int C, bool kMax4 = false>
__device__ __forceinline__ void row_max_groups(const float* __restrict__ x, int lo, int hi, int g, SampleSmem& sm,
                                               RowDist& rd, float* tmax, KeptFloat4* keep = nullptr,
                                               ReadWatch* watch = nullptr, ThreadBest* one = nullptr) {
    TOPK_CLOCK(0);
    float lmax = neg_inf(), mine = neg_inf();
    int amax = 0x7fffffff;
    int bad = 0;
    float sec = neg_inf();                  // !kMax4: the thread's second largest logit
    const auto take = [&](int i, float l) {
        bad |= (l != l) | (l == pos_inf());
        const float m = l != l ? neg_inf() : l;
        take_better(lmax, amax, m, i);
        if (!kMax4) sec = fmaxf(sec, fminf(mine, m));
        mine = fmaxf(mine, m);
    };
    if (!kMax4) {
        for_chunk(x, lo, hi, take);
        if (one) {
            one->sec = sec;
            one->id = amax;
        }
    } else {
        // Max4's m is also the thread's max when every logit is finite; a thread that met a
        // non-finite logit takes its float4s again one logit at a time
        const ChunkSplit c = chunk_split(x, lo, hi);
        for_chunk_ends(x, lo, hi, c, take);
        constexpr bool keeps = C == 1 && kKeepFloat4;
        const float ends = mine;
        float rest = neg_inf();             // kept: the max of the float4s but the best
        rowmath::Max4 s4 = rowmath::max4_start();
        // eight loads in flight as the loop without `rest` had them (ptxas unrolled it twice),
        // which it no longer does by itself
        // with a watch (C = 1): thread 0's stop word of the batch before, tested with this one's loads
        int word = 0x7fffffff;
        const auto stop = [&]() {
#ifndef VERIFY_NO_READ_WATCH
            if constexpr (keeps) {
                if (threadIdx.x == 0) {
                    if (rowmath::stop_at(word) < watch->a) watch->ended = 1;
                    word = __ldcg(watch->stop);
                }
                return *(volatile int*)&watch->ended != 0;
            }
#endif
            return false;
        };
        for_chunk_float4s<keeps ? 8 : 4>(x, c, [&](int, int j, const float4& q) {
            if constexpr (keeps) {
                const float t4 = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
                rest = fmaxf(rest, t4 > s4.m ? s4.m : t4);
            }
            rowmath::max4_take(s4, q.x, q.y, q.z, q.w, j);
        }, stop);
        const bool exact = rowmath::max4_exact(s4);
        if constexpr (keeps) {
            keep->v[threadIdx.x] = make_float4(s4.v0, s4.v1, s4.v2, s4.v3);
            keep->j[threadIdx.x] = s4.j;
            keep->rest[threadIdx.x] = exact ? fmaxf(ends, rest) : pos_inf();
        }
        if (exact) {
            rowmath::max4_end(s4, c.a, lmax, amax);
            mine = fmaxf(mine, s4.m);
        } else {
            for_chunk_float4s(x, c, [&](int i, int, const float4& q) {
                take(i, q.x);
                take(i + 1, q.y);
                take(i + 2, q.z);
                take(i + 3, q.w);
            });
        }
    }
    TOPK_CLOCK(1);
    *tmax = mine;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (g > 0) {
        for (int o = g >> 1; o > 0; o >>= 1) mine = fmaxf(mine, __shfl_xor_sync(0xffffffffu, mine, o));
        if ((lane & (g - 1)) == 0) sm.pub.gmax[threadIdx.x / g] = mine;
    }
    // the block's max and lowest argmax (as cluster_argmax's first half)
    warp_best(lmax, amax);
    TopkWork& w = sm.fast;
    if (lane == 0) {
        w.fsh[warp] = lmax;
        reinterpret_cast<int*>(w.sh)[warp] = amax;
    }
    bad = __syncthreads_or(bad);
    TOPK_CLOCK(2);
    if (warp == 0) {                        // the block's best, by warp 0 alone
        lmax = lane < kWarps ? w.fsh[lane] : neg_inf();
        amax = lane < kWarps ? reinterpret_cast<int*>(w.sh)[lane] : 0x7fffffff;
        warp_best(lmax, amax);
        if (lane == 0) {
            sm.pub.v = lmax;
            sm.pub.i = amax;
            sm.pub.bad = bad;
            sm.pub.n = 0;
        }
    }
    const int per_block = g > 0 ? kThreads / g : 0;
    const int groups = C * per_block;
    if (C == 1) {
        __syncthreads();
        if (g > 0) w.all[threadIdx.x] = threadIdx.x < groups ? sm.pub.gmax[threadIdx.x] : neg_inf();
        lmax = sm.pub.v;
        amax = sm.pub.i;
    } else {
        cluster_sync();
        const int j = threadIdx.x;
        if (warp == 0) {                    // lane r reads block r's (v, i, bad, n) in one 16-byte
            float v = neg_inf();            // load, and the warp combines them ((value, lowest id)
            int i = 0x7fffffff, b = 0;      // is a total order: any order of combines agrees)
            if (lane < C) {
                const uint4 q = ld_cluster_v4(map_rank(smem_addr(&sm.pub.v), (u32)lane));
                v = __uint_as_float(q.x);
                i = (int)q.y;
                b = (int)q.z;
            }
            warp_best(v, i);
            b = __any_sync(0xffffffffu, b);
            if (lane == 0) {
                w.cv = v;
                w.ci = i;
                w.cbad = b;
            }
        }
        if (g > 0) {
            float m = neg_inf();
            if (j < groups)
                m = __uint_as_float(ld_cluster_u32(map_rank(smem_addr(&sm.pub.gmax[j % per_block]), j / per_block)));
            w.all[j] = m;
        }
        __syncthreads();
        TOPK_CLOCK(3);
        lmax = w.cv;
        amax = w.ci;
        bad = w.cbad;
    }
    TOPK_CLOCK(4);
    rd.bad = bad | (lmax == neg_inf());
    rd.lmax = lmax;
    rd.amax = amax;
}

// ---------------------------------------------------------------- the list

// group_bound's result for at most 256 maxima, by one warp (lane holds w.all[lane + 32 r]): the
// largest T with 16 low zero bits and at least k keys >= T. Every key lies between the least and
// the largest, so T has their common leading bits; the bits below are decided from the top, two a
// step (the counts of keys >= each of three candidates, a ballot per key and candidate), down to
// bit 16. The same value as the radix passes below, and as deciding every bit in turn.
__device__ __forceinline__ u32 bound_key_warp(int groups, int k, const TopkWork& w) {
    const int lane = threadIdx.x & 31;
    u32 key[8], hi = 0, lo = 0xffffffffu;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const bool on = lane + 32 * r < groups;
        key[r] = on ? order_key(w.all[lane + 32 * r]) : 0u;
        hi = max(hi, key[r]);
        lo = on ? min(lo, key[r]) : lo;
    }
    hi = __reduce_max_sync(0xffffffffu, hi);
    lo = __reduce_min_sync(0xffffffffu, lo);
    const int same = __clz(hi ^ lo);                    // 32 when every key is the same
    int bit = 31 - same;                                // the highest bit not yet decided
    u32 t = same >= 16 ? hi & 0xffff0000u : hi & ~(0xffffffffu >> same);
    const auto count = [&](u32 cand) {
        int n = 0;
#pragma unroll
        for (int r = 0; r < 8; ++r) n += __popc(__ballot_sync(0xffffffffu, key[r] >= cand));
        return n;
    };
#pragma unroll 1
    for (; bit >= 17; bit -= 2) {                       // bits bit and bit - 1
        const u32 c1 = t | (1u << (bit - 1)), c2 = t | (2u << (bit - 1)), c3 = t | (3u << (bit - 1));
        const int n1 = count(c1), n2 = count(c2), n3 = count(c3);
        t = n3 >= k ? c3 : n2 >= k ? c2 : n1 >= k ? c1 : t;
    }
    if (bit == 16 && count(t | 0x10000u) >= k) t |= 0x10000u;
    return t;
}

// A lower bound on the k-th largest of the `groups` group maxima in w.all, every thread of the
// block: the least value whose order key has the top 16 bits of the k-th largest's key. At least k
// maxima are >= it, so at least k logits are (the bound of this file's header), and it is below
// the k-th largest by less than 2^-7 of that value's binade. Up to 256 maxima one warp finds it
// (bound_key_warp); more go through two radix passes of 8 bits over the keys (a histogram, then
// one warp's scan of it) by the warps that hold them. Either is a few hundred instructions, where
// a pairwise count by the whole block was groups^2 comparisons (measured 2.8 -> 1.4 us at 256).
__device__ __forceinline__ float group_bound(int groups, int k, TopkWork& w) {
    u32* hist = reinterpret_cast<u32*>(w.lw);           // free until the list is built
    const int tid = threadIdx.x, lane = tid & 31;
    const int nt = 32 * ((groups + 31) >> 5);           // the warps that hold a maximum do the passes
    if (groups <= 256) {
        if (tid < 32) {
            const u32 t = bound_key_warp(groups, k, w);
            if (tid == 0) w.tau_key = t >> 16;
        }
    } else if (tid < nt) {                              // (named barrier 2); the rest wait at the end
        const u32 key = tid < groups ? order_key(w.all[tid]) : 0u;
        u32 prefix = 0, want = (u32)k;      // want: how many more maxima the bins below must hold
#pragma unroll 1
        for (int pass = 0; pass < 2; ++pass) {
            const int shift = 24 - 8 * pass;
            for (int b = tid; b < kBins; b += nt) hist[b] = 0;
            bar_sync(2, nt);
            const bool in = tid < groups && (pass == 0 || (key >> 24) == prefix);
            const u32 bin = (key >> shift) & 0xffu;
            const u32 active = __ballot_sync(0xffffffffu, in);
            if (in) {
                const u32 peers = __match_any_sync(active, bin);
                if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (u32)__popc(peers));
            }
            bar_sync(2, nt);
            if (tid < 32) {                 // lane holds bins 8 lane .. 8 lane + 7; find from the top
                u32 c[8], mine = 0;
#pragma unroll
                for (int b = 0; b < 8; ++b) mine += (c[b] = hist[8 * lane + b]);
                u32 suf = mine;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const u32 v = __shfl_down_sync(0xffffffffu, suf, o);
                    if (lane + o < 32) suf += v;
                }
                const u32 higher = suf - mine;                  // maxima in the bins of the lanes above
                int hit = -1;
                u32 run = higher, left = 0;
#pragma unroll
                for (int b = 7; b >= 0; --b) {
                    if (hit < 0 && run + c[b] >= want) {
                        hit = b;
                        left = want - run;
                    }
                    run += c[b];
                }
                const u32 found = __ballot_sync(0xffffffffu, hit >= 0 && higher < want);
                const int src = 31 - __clz(found);              // the one lane whose bins reach it
                const int bsel = __shfl_sync(0xffffffffu, hit, src);
                const u32 lsel = __shfl_sync(0xffffffffu, left, src);
                if (lane == 0) {
                    w.tau_key = (prefix << 8) | (u32)(8 * src + bsel);
                    w.n_want = lsel;
                }
            }
            if (pass == 0) {
                bar_sync(2, nt);
                prefix = w.tau_key;
                want = w.n_want;
            }
        }
    }
    __syncthreads();
    const float b = key_value(w.tau_key << 16);
    return b == b ? b : neg_inf();          // the bin of -inf: its lower edge's bits are a NaN's
}

// Steps 2's list: every id of [lo, hi) of the row x with l >= tau (the bound of group_bound), from
// every block of the cluster into rank 0's w.lval / w.lid; a thread whose own max tmax is below tau
// has none. Ends on a cluster barrier; returns the count (the same in every block; more than
// kTopkList: the list overflowed and holds only the first kTopkList). pub.n must be 0 on entry
// and no block may touch rank 0's list since the cluster's last barrier.
//
// keep (C = 1 only; row_max_groups' KeptFloat4): a thread whose every id at or above tau lies in its
// kept float4 lists them from there, and only the others are read again (VERIFY_GATHER_REREAD: all
// are, for the A/B).
//
// one (sample_rows; ThreadBest of row_max_groups): a thread whose second largest is below tau lists
// its argmax alone and reads nothing again (SAMPLE_GATHER_REREAD: it reads, for the A/B).
template <int C>
__device__ __forceinline__ u32 gather_list(const float* __restrict__ x, int lo, int hi, float tau, float tmax,
                                           SampleSmem& sm, const KeptFloat4* keep = nullptr,
                                           const ThreadBest* one = nullptr) {
    TopkWork& w = sm.fast;
    const u32 n_at = map_rank(smem_addr(&sm.pub.n), 0);
    const u32 val_at = map_rank(smem_addr(&w.lval[0]), 0);
    const u32 id_at = map_rank(smem_addr(&w.lid[0]), 0);
    const auto add = [&](int i, float l) {
        if (!(l >= tau)) return;
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
    };
    // The ids of each thread whose max reaches tau (for_chunk's: one float4 every kThreads, and a
    // single id at each end) are read again by its whole warp, the float4s spread over the lanes,
    // so that they are in flight at once rather than four at a time in one thread (a 151936 row at
    // C = 1 is 37 float4s a thread; one such thread held its block's barrier ~8 us).
    // At C = 8 (a thread has ~5 float4s of a 151936 row) each thread reads its own again: the
    // warp's loop spills in sample_rows_c8 under its 64 registers. With keep or one, most threads
    // read nothing again (~60 ids reach the bound, rarely two of them in one thread's share).
    bool reread = tmax >= tau;
#ifndef SAMPLE_GATHER_REREAD
    if (one && reread && one->sec < tau) {
        reread = false;
        add(one->id, tmax);
    }
#endif
    if (C == 8) {
        if (reread) for_chunk(x, lo, hi, add);
    } else {
        const int lane = threadIdx.x & 31;
        const int mis = (int)(((size_t)(x + lo) >> 2) & 3u);
        const int a = min(hi, lo + ((4 - mis) & 3));
        if (C == 1 && kKeepFloat4 && keep && reread && keep->rest[threadIdx.x] < tau) {
            reread = false;
            const float4 q = keep->v[threadIdx.x];
            const int i = a + 4 * keep->j[threadIdx.x];
            add(i, q.x);
            add(i + 1, q.y);
            add(i + 2, q.z);
            add(i + 3, q.w);
        }
        if (unsigned need = __ballot_sync(0xffffffffu, reread)) {
            const int nv = (hi - a) >> 2;
            const int b = a + 4 * nv;
            const float4* __restrict__ v = reinterpret_cast<const float4*>(x + a);
            do {
                const int t = (threadIdx.x & ~31) + __ffs(need) - 1;
                need &= need - 1;
                if (lane == 0 && t < a - lo) add(lo + t, x[lo + t]);
                if (lane == 1 && t < hi - b) add(b + t, x[b + t]);
                for (int j = t + lane * kThreads; j < nv; j += 32 * kThreads) {
                    const float4 q = v[j];
                    const float l[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                    for (int c = 0; c < 4; ++c) add(a + 4 * j + c, l[c]);
                }
            } while (need);
        }
    }
    TOPK_CLOCK(6);
    if (C == 1) __syncthreads();
    else cluster_sync();                    // every entry is in rank 0's list
    TOPK_CLOCK(7);
    return C == 1 ? sm.pub.n : ld_cluster_u32(n_at);
}

// One list entry as the threads of its segment hold it after list_weights.
struct ListEntry {
    Seg sg;
    bool lead;                              // thread q = 0 of the entry
    int id;
    u64 w;                                  // its weight in the draw: E if kept by every filter, else 0
};

// Steps 2-5 on rank 0's list of n (<= kTopkList) entries, which holds every id top-k keeps: top-k
// (kept when fewer than k entries are larger), E and S (e relative to the row's max lmax), top-p,
// min-p, all by row_filter's rules. Leaves each entry's weight in w.lw[j] and returns the sum of
// the weights in *total; with kth and e_min (both or neither) also row_filter's two thresholds:
// the least kept logit (the k-th largest of the row) and the lower bound on e.
__device__ __forceinline__ ListEntry list_weights(int n, int k, float t, float top_p, float min_p, float lmax,
                                                  TopkWork& w, u64* total, float* kth = nullptr,
                                                  float* e_min_out = nullptr) {
    const int tid = threadIdx.x, n4 = (n + 3) & ~3;
    if (tid >= n && tid < n4) w.lval[tid] = neg_inf();     // padding: never larger than an entry
    __syncthreads();
    ListEntry le;
    le.sg = segment(n);
    const Seg& sg = le.sg;
    const bool mine = sg.on;
    le.lead = mine && sg.q == 0;
    const float l = mine ? w.lval[sg.j] : neg_inf();
    le.id = mine ? w.lid[sg.j] : 0x7fffffff;
    // 2. top-k
    const int gt = seg_sum(count_above(reinterpret_cast<const float4*>(w.lval), n4, l, sg.q, sg.s), sg.s);
    const bool kept = mine && gt < k;
    // 3. e and E of the kept entries, S their sum
    const float e = kept ? exp_rel(l, lmax, t) : 0.f;
    const u64 E = kept ? fixed(e) : 0ull;
    if (le.lead) {
        w.le[sg.j] = kept ? e : -1.f;
        w.lw[sg.j] = E;
    }
    const u64 s = block_sum(le.lead ? E : 0ull, w.sh);    // its barriers order the writes above
    if (kth) *kth = -block_max(kept ? -l : neg_inf(), w.fsh);
    TOPK_CLOCK(8);
    // 4. top-p: the largest e of a kept entry whose weight of e-values >= it reaches the target
    float e_min = 0.f;
    if (top_p < 1.f) {
        double want = ceil((double)top_p * (double)s);
        want = want < 1.0 ? 1.0 : (want > (double)s ? (double)s : want);
        u64 above = 0;
        if (kept)
#pragma unroll 4
            for (int i = sg.q; i < n; i += sg.s) above += w.le[i] >= e ? w.lw[i] : 0ull;
        above = seg_sum(above, sg.s);
        e_min = block_max(kept && above >= (u64)want ? e : 0.f, w.fsh);
    }
    TOPK_CLOCK(9);
    // 5. min-p
    e_min = fminf(fmaxf(e_min, min_p), 1.f);
    if (e_min_out) *e_min_out = e_min;
    le.w = kept && e >= e_min ? E : 0ull;
    __syncthreads();                        // every read of lw above is done
    if (le.lead) w.lw[sg.j] = le.w;
    *total = block_sum(le.lead ? le.w : 0ull, w.sh);
    return le;
}

// Step 6 on the list: the entry whose inclusive prefix sum of w.lw (in id order) first exceeds
// target (< the sum) writes its id to *dst; `mine` is the entry's own weight (its w.lw). Every
// thread of the block calls it.
__device__ __forceinline__ void list_draw(const ListEntry& le, u64 mine, int n, u64 target, const TopkWork& w,
                                          int* dst) {
    u64 c = 0;
    if (mine)
#pragma unroll 4
        for (int i = le.sg.q; i < n; i += le.sg.s) c += w.lid[i] < le.id ? w.lw[i] : 0ull;
    c = seg_sum(c, le.sg.s);
    if (le.lead && mine && c <= target && target < c + mine) *dst = le.id;   // exactly one entry
}

// Steps 2-6 by W warps on a list of n <= kWarpList entries: every warp holds the whole list (lane
// holds entries lane and lane + 32) and computes list_weights' weights and thresholds and
// list_draw's pick by the same rules, with shuffles in place of the block's barriers; the three
// pairwise sums over the list (larger logits, weight of larger e, weight of lower ids) are split
// over the W warps by source entry and added through shared memory after a barrier of the W warps
// (named barrier 1). Every sum is of integers and the thresholds are maxima, so the token is
// list_draw's whatever W. Every lane of the W warps calls it; warp 0's lane of the drawn entry
// writes *dst.
constexpr int kWarpList = 64;
constexpr int kListWarps = 4;               // W for sample_rows' short lists (1 / 2 / 4 / 8 measured)

__device__ __forceinline__ u64 shfl_u64(u64 v, int src) {
    return ((u64)__shfl_sync(0xffffffffu, (u32)(v >> 32), src) << 32) | __shfl_sync(0xffffffffu, (u32)v, src);
}
__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += shfl_u64(v, (threadIdx.x & 31) ^ o);
    return v;
}

// v[h] (entry lane + 32 h of this warp's share) summed over the W warps: each warp's two partials
// go to part[warp][64], and after the W warps' barrier every warp adds the W of its entries in
// warp order. part must not be read by an earlier call's adds still in flight (each of the three
// sums has its own).
template <int W, class T>
__device__ __forceinline__ void warps_sum(T (&v)[2], T* part) {
    if (W == 1) return;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    part[wi * 64 + lane] = v[0];
    part[wi * 64 + lane + 32] = v[1];
    bar_sync(1, W * 32);
    v[0] = v[1] = 0;
#pragma unroll
    for (int r = 0; r < W; ++r) {
        v[0] += part[r * 64 + lane];
        v[1] += part[r * 64 + lane + 32];
    }
}

// Steps 2-5 by W warps: lane holds entries lane and lane + 32 of the list, their ids and their
// weights in the draw (E if kept by every filter, else 0), by list_weights' rules.
template <int W>
__device__ __forceinline__ void list_weights_warps(int n, int k, float t, float top_p, float min_p, float lmax,
                                                   TopkWork& w, int (&id)[2], u64 (&wt)[2]) {
    static_assert(W >= 1 && W <= 8 && 32 % W == 0, "W warps split 32 source lanes; 2 x 64 W u64 fit w.lw");
    constexpr int kSrc = 32 / W;            // source lanes a warp takes
    const int lane = threadIdx.x & 31, s0 = (threadIdx.x >> 5) * kSrc;
    float l[2], e[2];
    bool kept[2];
    u64 E[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = lane + 32 * h;
        l[h] = j < n ? w.lval[j] : neg_inf();          // padding: never larger than an entry
        id[h] = j < n ? w.lid[j] : 0x7fffffff;
    }
    // e of every entry (kept or not: the padding's is 0), before the count, so that the compiler
    // may interleave the two (measured 11.06 -> 10.99 us a call at batch 1 / 151936)
#pragma unroll
    for (int h = 0; h < 2; ++h) e[h] = exp_rel(l[h], lmax, t);
    // 2. top-k: kept when fewer than k entries are larger
    int gt[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kSrc; ++i) {
        const int src = s0 + i;
        const float a = __shfl_sync(0xffffffffu, l[0], src), b = __shfl_sync(0xffffffffu, l[1], src);
#pragma unroll
        for (int h = 0; h < 2; ++h) gt[h] += (a > l[h]) + (b > l[h]);
    }
    warps_sum<W>(gt, reinterpret_cast<int*>(w.le));
    TOPK_CLOCK(20);
    // 3. e and E of the kept entries, S their sum
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        kept[h] = lane + 32 * h < n && gt[h] < k;
        e[h] = kept[h] ? e[h] : 0.f;
        E[h] = kept[h] ? fixed(e[h]) : 0ull;
    }
    const u64 s = warp_sum_u64(E[0] + E[1]);
    TOPK_CLOCK(21);
    // 4. top-p: the largest e of a kept entry whose weight of e-values >= it reaches the target
    float e_min = 0.f;
    if (top_p < 1.f) {
        double want = ceil((double)top_p * (double)s);
        want = want < 1.0 ? 1.0 : (want > (double)s ? (double)s : want);
        const float le0 = kept[0] ? e[0] : -1.f, le1 = kept[1] ? e[1] : -1.f;
        u64 above[2] = {0, 0};
#pragma unroll 2
        for (int i = 0; i < kSrc; ++i) {
            const int src = s0 + i;
            const float ea = __shfl_sync(0xffffffffu, le0, src), eb = __shfl_sync(0xffffffffu, le1, src);
            const u64 wa = shfl_u64(E[0], src), wb = shfl_u64(E[1], src);
#pragma unroll
            for (int h = 0; h < 2; ++h) above[h] += (ea >= e[h] ? wa : 0ull) + (eb >= e[h] ? wb : 0ull);
        }
        warps_sum<W>(above, w.lw);
        float m = fmaxf(kept[0] && above[0] >= (u64)want ? e[0] : 0.f, kept[1] && above[1] >= (u64)want ? e[1] : 0.f);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        e_min = m;
    }
    TOPK_CLOCK(22);
    // 5. min-p
    e_min = fminf(fmaxf(e_min, min_p), 1.f);
    wt[0] = kept[0] && e[0] >= e_min ? E[0] : 0ull;
    wt[1] = kept[1] && e[1] >= e_min ? E[1] : 0ull;
}

// Step 6 by W warps on list_weights_warps' entries with weights wt (any weights of them, in id
// order): the entry whose inclusive prefix sum first exceeds target (< the sum) writes its id to
// *dst, from warp 0. The pairwise sums use w.lw + 64 W (list_weights_warps' top-p used w.lw).
template <int W>
__device__ __forceinline__ void list_pick_warps(const int (&id)[2], u64 w0, u64 w1, u64 target, TopkWork& w,
                                                int* dst) {
    constexpr int kSrc = 32 / W;
    const int s0 = (threadIdx.x >> 5) * kSrc;
    u64 c[2] = {0, 0};
#pragma unroll 2
    for (int i = 0; i < kSrc; ++i) {
        const int src = s0 + i;
        const int ia = __shfl_sync(0xffffffffu, id[0], src), ib = __shfl_sync(0xffffffffu, id[1], src);
        const u64 wa = shfl_u64(w0, src), wb = shfl_u64(w1, src);
#pragma unroll
        for (int h = 0; h < 2; ++h) c[h] += (ia < id[h] ? wa : 0ull) + (ib < id[h] ? wb : 0ull);
    }
    warps_sum<W>(c, w.lw + 64 * W);
    if (threadIdx.x >= 32) return;
    if (w0 && c[0] <= target && target < c[0] + w0) *dst = id[0];       // exactly one entry
    if (w1 && c[1] <= target && target < c[1] + w1) *dst = id[1];
}

template <int W>
__device__ __forceinline__ void list_draw_warps(int n, int k, float t, float top_p, float min_p, float lmax,
                                                u32 u24, TopkWork& w, int* dst) {
    int id[2];
    u64 wt[2];
    list_weights_warps<W>(n, k, t, top_p, min_p, lmax, w, id, wt);
    // 6. the draw over the weights in id order
    const u64 target = draw_target(u24, warp_sum_u64(wt[0] + wt[1]));
    TOPK_CLOCK(23);
    list_pick_warps<W>(id, wt[0], wt[1], target, w, dst);
}

// ---------------------------------------------------------------- sample_rows' short path

// The token of a finite row at temperature t > 0 with 0 < k <= kTopkFast, k < vocab, after
// row_max_groups<C>(..., topk_group_lanes<C>(k), ..., &tmax). Returns false (in every block of the
// cluster alike) when the list overflowed: the caller then runs the long path, which rewrites all
// of Smem it reads. Otherwise rank 0 writes tokens[row] and flags[row] and the others are done.
template <int C>
__device__ __forceinline__ bool topk_short_path(const float* __restrict__ x, int lo, int hi, int k, float t,
                                                float top_p, float min_p, float tmax, const ThreadBest& one,
                                                const RowDist& rd, SampleSmem& sm, int* token, int* flag) {
    TopkWork& w = sm.fast;
    const float tau = group_bound(C * (kThreads / topk_group_lanes<C>(k)), k, w);
    TOPK_CLOCK(5);
    const u32 n = gather_list<C>(x, lo, hi, tau, tmax, sm, nullptr, &one);
    if (n > (u32)kTopkList) return false;   // the same count in every block
    if (C > 1 && cluster_rank() != 0) return true;
    if (n <= (u32)kWarpList) {              // a short list: a few warps, no block barriers
        if (threadIdx.x < 32 * kListWarps) {
            const u32 u24 = philox::bits24(sm.pub.seed, sm.pub.position, philox::kSample, 0u);
            list_draw_warps<kListWarps>((int)n, k, t, top_p, min_p, rd.lmax, u24, w, token);
            if (threadIdx.x == 0) *flag = 0;
            TOPK_CLOCK(11);
        }
        return true;
    }
#ifdef GLIMMER_TOPK_CLOCKS
    // the last block's steps twice (the same result): the second from a warm instruction cache;
    // stamps 12-15 keep the first's 8-11, stamp 16 the second's start
#pragma unroll 1
    for (int rep = 0; rep < 2; ++rep) {
        if (rep == 1 && threadIdx.x == 0 && blockIdx.x == 0) {
            for (int i = 0; i < 4; ++i) topk_clocks[12 + i] = topk_clocks[8 + i];
            topk_clocks[16] = clock64();
        }
        __syncthreads();
#endif
    u64 total;
    const ListEntry le = list_weights((int)n, k, t, top_p, min_p, rd.lmax, w, &total);
    const u64 target = draw_target(philox::bits24(sm.pub.seed, sm.pub.position, philox::kSample, 0u), total);
    TOPK_CLOCK(10);
    list_draw(le, le.w, (int)n, target, w, token);
    if (threadIdx.x == 0) *flag = 0;
    TOPK_CLOCK(11);
#ifdef GLIMMER_TOPK_CLOCKS
    }
#endif
    return true;
}
