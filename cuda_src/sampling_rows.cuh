// sampling_rows.cuh — the per-row machinery of sampling.cu, shared with speculative.cu: cluster
// plumbing, block reductions, the radix select, and the filtered distribution of one row
// (steps 1-6 of sampling.cu's header) as functions over a row, so that a token drawn by
// sample_rows and one drawn by a verification from the same row and uniform are the same token.
//
// RowDist   what steps 1-5 leave: max/argmax/bad, then kth, t, e_min and the candidate list;
//           the filtered distribution is p(i) ∝ E(i) = fixed(exp_rel(l_i)) over the kept ids
// row_max   step 1; row_filter steps 2-5; weight_sum and draw: step 6 over any weight that is a
//           function of (id, E) of the kept ids (p itself, max(0, p - q), p without one id)
// Every function is called by every thread of every block of the row's cluster, with the same
// row-uniform arguments, and ends on a barrier that frees the shared memory it used.
#pragma once
#include "cluster.cuh"
#include "pdl.cuh"
#include "philox.cuh"
#include "row_math.cuh"         // draw_target; the verification's scalar rules

using rowmath::draw_target;

// Threads a block of the row kernels: sample_rows' 1024; speculative.cu sets ROW_THREADS to its
// VERIFY_THREADS before including this file. 64 to 1024: the warp totals fit one warp, whose lanes
// past kWarps read the reduction's identity.
#ifndef ROW_THREADS
#define ROW_THREADS 1024
#endif
constexpr int kThreads = ROW_THREADS;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 64 == 0 && kWarps <= 32, "ROW_THREADS: a multiple of 64 up to 1024");
constexpr int kBins = 256;
constexpr int kTile = kThreads * 4;         // ids per scan tile: four consecutive ids per thread
constexpr int kList = 2048;                 // candidates a block keeps in shared memory
constexpr int kListDraw = 256;              // the most list entries the draw ranks pairwise

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// The u64 at `p` (a __shared__ address of this block) in the shared memory of block `rank`.
__device__ __forceinline__ u64 remote_u64(const u64* p, u32 rank) {
    u64 v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(map_rank(smem_addr(p), rank)) : "memory");
    return v;
}

// Sum over the cluster of v (the same in every thread of a block); *before gets the sum over
// the blocks of lower rank. Ends on a cluster barrier, so `slot` is free again.
template <int C>
__device__ __forceinline__ u64 cluster_sum(u64 v, u64* slot, u64* before) {
    if (C == 1) {
        *before = 0;
        return v;
    }
    if (threadIdx.x == 0) *slot = v;
    cluster_sync();
    const u32 me = cluster_rank();
    u64 s = 0, b = 0;
#pragma unroll
    for (u32 r = 0; r < (u32)C; ++r) {
        const u64 x = remote_u64(slot, r);
        s += x;
        b += r < me ? x : 0;
    }
    cluster_sync();
    *before = b;
    return s;
}

// ---------------------------------------------------------------- block reductions

using rowmath::take_better;               // (v, i) becomes the better of itself and (v2, i2)
using rowmath::take1;                     // a logit into a scan's (max, argmax, non-finite flag)

// (v, i) becomes the best pair of its warp (every lane gets it).
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// Argmax over the cluster; every thread gets the result. Warp 0 alone combines: the warps' bests,
// then (C > 1) the blocks' through distributed shared memory, lane r reading block r's slot, so a
// remote value is read C times a block rather than C times a thread. (value, lowest id) is a total
// order, so the result does not depend on the order of the combines.
template <int C>
__device__ __forceinline__ void cluster_argmax(float& v, int& i, float* sv, int* si, u64* slot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_best(v, i);
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < kWarps ? sv[lane] : neg_inf();
        i = lane < kWarps ? si[lane] : 0x7fffffff;
        warp_best(v, i);
        if (lane == 0) {
            if (C > 1) *slot = ((u64)__float_as_uint(v) << 32) | (u32)i;
            else sv[0] = v, si[0] = i;
        }
    }
    if (C > 1) {
        cluster_sync();
        if (warp == 0) {
            v = neg_inf();
            i = 0x7fffffff;
            if (lane < C) {
                const u64 x = remote_u64(slot, (u32)lane);
                v = __uint_as_float((u32)(x >> 32));
                i = (int)(u32)x;
            }
            warp_best(v, i);
            if (lane == 0) {
                sv[0] = v;
                si[0] = i;
            }
        }
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    if (C > 1) cluster_sync();              // no block leaves while another reads its slot; sv free again
    else __syncthreads();                   // sv, si free for the next use
}

// Block-wide sum of integers; every thread gets the result.
__device__ __forceinline__ u64 block_sum(u64 s, u64* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sh[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < kWarps ? sh[lane] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sh[0] = s;
    }
    __syncthreads();
    s = sh[0];
    __syncthreads();
    return s;
}

// Block-wide exclusive prefix sum in thread order; *total gets the sum of all.
__device__ __forceinline__ u64 block_exclusive_scan(u64 s, u64* sh, u64* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const u64 w = lane < kWarps ? sh[lane] : 0;
        u64 wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 t = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += t;
        }
        if (lane < kWarps) sh[lane] = wi - w;   // exclusive prefix of the warp totals
        if (lane == 31) sh[kWarps] = wi;
    }
    __syncthreads();
    const u64 r = sh[warp] + incl - s;
    *total = sh[kWarps];
    __syncthreads();
    return r;
}

// ---------------------------------------------------------------- values

// A float's bits as an unsigned key in the order of the values (-0 read as +0).
__device__ __forceinline__ u32 order_key(float x) {
    const u32 u = __float_as_uint(x + 0.0f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// exp((l - lmax) / t) for l <= lmax. The rounding of l - lmax (TwoSum) and of the division is
// carried into exp(z + zl) ~ exp(z) * (1 + zl), so the error is expf's, not |z| ulps of z.
__device__ __forceinline__ float exp_rel(float l, float lmax, float t) {
    if (l == neg_inf()) return 0.f;
    const float d = l - lmax;
    const float bb = d - l;
    const float err = (l - (d - bb)) + (-lmax - bb);
    const float z = d / t;
    if (z < -104.f) return 0.f;             // expf underflows to 0 here; keeps zl finite
    const float zl = (fmaf(-z, t, d) + err) / t;
    const float ez = expf(z);
    return fmaf(ez, zl, ez);
}

__device__ __forceinline__ u64 fixed(float e) { return __float2ull_rn(e * 1099511627776.0f); }   // 2^40

// hist[bin] += w for every lane with `in` set (every lane of the warp calls it), one atomic per
// distinct bin of the warp: the first passes put most of a row into a few bins, where plain
// shared atomics would serialise up to 32 lanes on one address. w < 2^45: the two 32-bit partial
// sums below cannot overflow over 32 lanes.
__device__ __forceinline__ void hist_add(u64* hist, u32 bin, u64 w, bool in) {
    const u32 active = __ballot_sync(0xffffffffu, in);
    if (!in) return;
    const u32 peers = __match_any_sync(active, bin);
    const u32 hi = __reduce_add_sync(peers, (u32)(w >> 20));
    const u32 lo = __reduce_add_sync(peers, (u32)w & 0xfffffu);
    if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], ((u64)hi << 20) + lo);
}

// Shared memory of one block.
struct Smem {
    float sv[kWarps];
    int si[kWarps];
    u64 sh[kWarps + 1];
    u64 slot;                               // what the other blocks of the cluster read
    u64 hist[kBins];                        // this block's histogram (read by the cluster)
    u64 ghist[kBins];                       // the cluster's
    int n;                                  // entries appended to the list (more than kList: overflowed)
    int lid[kList];                         // the list: (id, key, weight) of a subset of the chunk,
    u32 lkey[kList];                        // in no particular order
    u64 lw[kList];
};

// Append (id, key, w) to the list for every lane with `in` set (every lane of the warp calls it):
// one shared atomic per warp. Entries past kList are counted, not stored.
__device__ __forceinline__ void list_append(Smem& sm, bool in, int id, u32 key, u64 w) {
    const u32 m = __ballot_sync(0xffffffffu, in);
    if (!m) return;
    const int lane = threadIdx.x & 31, first = __ffs(m) - 1;
    int base = 0;
    if (lane == first) base = atomicAdd(&sm.n, __popc(m));
    base = __shfl_sync(0xffffffffu, base, first);
    const int at = base + __popc(m & ((1u << lane) - 1u));
    if (in && at < kList) {
        sm.lid[at] = id;
        sm.lkey[at] = key;
        sm.lw[at] = w;
    }
}

// Radix select from the top: the largest key t such that the weight of the row's keys >= t
// reaches `target` (which must be in [1, weight of the whole set]). kw(i, &key, &w) returns false
// for ids outside the set; this block sees ids [lo, hi). Four passes of 8 bits, weights summed
// per digit in shared memory, then over the cluster. A pass reads the block's chunk, or the list
// when it holds every candidate of this block: with from_list, the list is the block's whole set
// (and is left as it is); otherwise the second pass also lists the keys under the first digit,
// and when they fit, the last two passes read only them. Either way each block counts the same
// keys, so the result does not depend on which source a block reads.
template <int C, class KW>
__device__ u32 select_from_top(const KW& kw, int lo, int hi, u64 target, Smem& sm, bool from_list = false) {
    const int lane = threadIdx.x & 31;
    u32 prefix = 0;
    u64 above = 0;                          // weight of keys above the current prefix's range
    bool listed = from_list;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < kBins; b += kThreads) sm.hist[b] = 0;
        const bool fill = !listed && shift == 16;
        if (fill && threadIdx.x == 0) sm.n = 0;
        __syncthreads();
        const u32 hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        if (listed) {
            const int n = sm.n;
            for (int j0 = 0; j0 < n; j0 += kThreads) {        // the same trip count for a whole warp
                const int j = j0 + threadIdx.x;
                const u32 k = j < n ? sm.lkey[j] : 0u;
                const u64 w = j < n ? sm.lw[j] : 0ull;
                hist_add(sm.hist, (k >> shift) & 0xffu, w, j < n && w && (k & hi_mask) == prefix);
            }
        } else {
            for (int i0 = lo; i0 < hi; i0 += kThreads) {
                const int i = i0 + threadIdx.x;
                u32 k = 0;
                u64 w = 0;
                const bool in = i < hi && kw(i, k, w) && w && (k & hi_mask) == prefix;
                hist_add(sm.hist, (k >> shift) & 0xffu, w, in);
                if (fill) list_append(sm, in, i, k, w);
            }
        }
        const u64* g = sm.hist;
        if (C > 1) {
            cluster_sync();                 // every block's histogram is complete
            for (int b = threadIdx.x; b < kBins; b += kThreads) {
                u64 s = 0;
                for (u32 r = 0; r < (u32)C; ++r) s += remote_u64(&sm.hist[b], r);
                sm.ghist[b] = s;
            }
            cluster_sync();                 // and read by all before anyone clears it
            g = sm.ghist;
        } else {
            __syncthreads();
        }
        if (threadIdx.x < 32) {
            // lane l holds digits 255 - 8l down to 248 - 8l; scan from the top digit
            u64 s = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) s += g[255 - 8 * lane - j];
            u64 incl = s;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            const u32 hit = __ballot_sync(0xffffffffu, above + incl >= target);
            const int first = hit ? __ffs(hit) - 1 : 31;      // no hit only if target is too large
            if (lane == first) {
                u64 c = above + incl - s;
                int d = 255 - 8 * lane;
                for (int j = 0; j < 8; ++j, --d) {
                    if (c + g[d] >= target || j == 7) break;
                    c += g[d];
                }
                sm.sh[0] = prefix | ((u32)d << shift);
                sm.sh[1] = c;
            }
        }
        __syncthreads();
        prefix = (u32)sm.sh[0];
        above = sm.sh[1];
        if (fill) listed = sm.n <= kList;   // read after the barrier above: every append is in
        __syncthreads();
    }
    return prefix;
}

struct TopKKeys {                           // every id; key: the logit's order; weight: 1
    const float* x;
    __device__ bool operator()(int i, u32& k, u64& w) const {
        k = order_key(x[i]);
        w = 1;
        return true;
    }
};

struct TopPKeys {                           // the ids top-k kept; key: e's bits; weight: E
    const float* x;
    float kth, lmax, t;
    __device__ bool operator()(int i, u32& k, u64& w) const {
        const float l = x[i];
        if (!(l >= kth)) return false;
        const float e = exp_rel(l, lmax, t);
        k = __float_as_uint(e);
        w = fixed(e);
        return true;
    }
};

// This block's ids of its row: [lo, hi).
template <int C>
__device__ __forceinline__ void chunk(int vocab, int& lo, int& hi) {
    const int per = (vocab + C - 1) / C;
    const int r = C == 1 ? 0 : (int)cluster_rank();
    lo = min(vocab, r * per);
    hi = min(vocab, lo + per);
}

// ---------------------------------------------------------------- one row's filtered distribution

struct RowDist {
    int bad;                                // NaN, +inf, or no finite logit (cluster-wide)
    float lmax;                             // max logit (NaN read as -inf)
    int amax;                               // its lowest id
    float t, kth, e_min;                    // kept: l >= kth and e = exp_rel(l, lmax, t) >= e_min
    int n;                                  // entries in this block's list
    bool listed;                            // the list holds this block's whole top-k set
};

// The end of step 1: each thread's max, argmax and non-finite flag over its ids, reduced over the
// cluster into rd. __syncthreads_or also orders any shared-memory writes made beside the reads.
template <int C>
__device__ __forceinline__ void finish_row_max(float lmax, int amax, int bad, Smem& sm, RowDist& rd) {
    u64 before;
    bad = __syncthreads_or(bad);
    bad = cluster_sum<C>((u64)bad, &sm.slot, &before) != 0;
    cluster_argmax<C>(lmax, amax, sm.sv, sm.si, &sm.slot);
    rd.bad = bad | (lmax == neg_inf());     // no finite logit
    rd.lmax = lmax;
    rd.amax = amax;
}

// Step 1: max, argmax and the non-finite check of the row x over this block's ids [lo, hi).
template <int C>
__device__ __forceinline__ void row_max(const float* __restrict__ x, int lo, int hi, Smem& sm, RowDist& rd) {
    float lmax = neg_inf();
    int amax = 0x7fffffff;
    int bad = 0;
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
        take1(x[i], i, lmax, amax, bad);
    }
    finish_row_max<C>(lmax, amax, bad, sm, rd);
}

// Steps 2-5 for a row that row_max found finite, at temperature t > 0.
template <int C>
__device__ __forceinline__ void row_filter(const float* __restrict__ x, int lo, int hi, int vocab, float t, int k,
                                           float top_p, float min_p, Smem& sm, RowDist& rd) {
    u64 before;
    rd.t = t;
    // 2. top-k threshold on the logits (division by t > 0 keeps their order)
    rd.kth = neg_inf();
    if (k > 0 && k < vocab) rd.kth = key_value(select_from_top<C>(TopKKeys{x}, lo, hi, (u64)k, sm));

    // 3. S = sum of E over the top-k set; with top-k on, the set (E > 0) is listed as well, and a
    // block whose set fits reads only its list in the steps below (the same values either way)
    const TopPKeys tp{x, rd.kth, rd.lmax, t};
    const bool try_list = k > 0 && k < vocab;
    if (threadIdx.x == 0) sm.n = 0;
    __syncthreads();
    u64 s = 0;
    for (int i0 = lo; i0 < hi; i0 += kThreads) {          // the same trip count for a whole warp
        const int i = i0 + threadIdx.x;
        u32 key = 0;
        u64 w = 0;
        const bool in = i < hi && tp(i, key, w);
        if (in) s += w;
        if (try_list) list_append(sm, in && w, i, key, w);
    }
    s = cluster_sum<C>(block_sum(s, sm.sh), &sm.slot, &before);    // block_sum's barriers order the appends
    rd.n = sm.n;
    rd.listed = try_list && rd.n <= kList;

    // 4. top-p threshold in e; 5. min-p; both as one lower bound on e, at most 1 (the top token)
    float e_min = 0.f;
    if (top_p < 1.f) {
        double want = ceil((double)top_p * (double)s);
        want = want < 1.0 ? 1.0 : (want > (double)s ? (double)s : want);
        e_min = __uint_as_float(select_from_top<C>(tp, lo, hi, (u64)want, sm, rd.listed));
    }
    rd.e_min = fminf(fmaxf(e_min, min_p), 1.f);
}

// The weights of step 6: wf(id, E) of each kept id (E > 0 there), 0 elsewhere.
struct KeptE {                              // p itself
    __device__ u64 operator()(int, u64 e) const { return e; }
};

// Id i's weight, read from the row.
template <class WF>
__device__ __forceinline__ u64 kept_weight(const RowDist& rd, const float* __restrict__ x, int i, const WF& wf) {
    const float l = x[i];
    if (!(l >= rd.kth)) return 0;
    const float e = exp_rel(l, rd.lmax, rd.t);
    return e >= rd.e_min ? wf(i, fixed(e)) : 0;
}

// List entry j's weight (the same value kept_weight gives for its id).
template <class WF>
__device__ __forceinline__ u64 listed_weight(const RowDist& rd, const Smem& sm, int j, const WF& wf) {
    return __uint_as_float(sm.lkey[j]) >= rd.e_min ? wf(sm.lid[j], sm.lw[j]) : 0;
}

// Sum of the weights over the row; *before gets the sum over the ids before this block's chunk.
template <int C, class WF>
__device__ __forceinline__ u64 weight_sum(const float* __restrict__ x, int lo, int hi, const RowDist& rd, Smem& sm,
                                          const WF& wf, u64* before) {
    u64 s = 0;
    if (rd.listed) {
        for (int j = threadIdx.x; j < rd.n; j += kThreads) s += listed_weight(rd, sm, j, wf);
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += kThreads) s += kept_weight(rd, x, i, wf);
    }
    return cluster_sum<C>(block_sum(s, sm.sh), &sm.slot, before);
}

// Step 6: the first id whose inclusive prefix sum of weights exceeds target (< the total), with
// `run` the weight of the ids before this block's chunk. Exactly one thread of the cluster finds
// it and writes it to *dst; nothing else is written.
template <int C, class WF>
__device__ __forceinline__ void draw(const float* __restrict__ x, int lo, int hi, const RowDist& rd, Smem& sm,
                                     const WF& wf, u64 run, u64 target, int* dst) {
    if (rd.listed && rd.n <= kListDraw) {
        // a short list: each entry's weight below it in id order, by comparing every pair
        const int n = rd.n;
        if (run <= target && (int)threadIdx.x < n) {
            const u64 mine = listed_weight(rd, sm, threadIdx.x, wf);
            if (mine) {
                const int id = sm.lid[threadIdx.x];
                u64 c = run;
                for (int j = 0; j < n; ++j)
                    if (sm.lid[j] < id) c += listed_weight(rd, sm, j, wf);
                if (c <= target && target < c + mine) *dst = id;   // one entry of the cluster
            }
        }
        __syncthreads();
        return;
    }
    for (int base = lo; base < hi && run <= target; base += kTile) {
        u64 w[4];
        u64 mine = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + 4 * threadIdx.x + j;
            w[j] = i < hi ? kept_weight(rd, x, i, wf) : 0;
            mine += w[j];
        }
        u64 tile;
        u64 c = run + block_exclusive_scan(mine, sm.sh, &tile);
        if (c <= target && target < c + mine) {           // exactly one thread of the cluster
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                c += w[j];
                if (c > target) {
                    *dst = base + 4 * threadIdx.x + j;
                    break;
                }
            }
        }
        run += tile;
    }
}
