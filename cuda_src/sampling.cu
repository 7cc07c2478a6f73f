// sampling.cu — token selection per row of (rows, vocab) float32 logits, per-row parameters on
// the device (rules: glimmer_cupy/reference/sampling.py).
//
// argmax_c<C>       ties to the lowest id, NaN read as -inf.  grid=(rows * C,) block=(kThreads,)
// sample_rows_c<C>  temperature -> top-k -> softmax -> top-p -> min-p -> inverse-CDF draw in id
//                   order.  grid=(rows * C,) block=(kThreads,)
// C = 1, 2, 4, 8: a row is split into C contiguous chunks, one per block of a thread block cluster
// (__cluster_dims__), so that a few rows still spread over many SMs; the blocks combine their
// partial results (maxima, sums, histograms, prefix sums) through distributed shared memory, and
// every block computes the same combined value in the same order. C = 1 is one block per row.
//
// Nothing is sorted. Each step reads the block's chunk of the row (1 MB for a 262144 vocabulary,
// from L2 after the first) or a shorter list of its ids (below):
//   1. max and argmax; a row with NaN, +inf or no finite logit is flagged and gets the argmax,
//      and so does a row with temperature <= 0 (greedy);
//   2. top-k: the k-th largest logit by radix select over an order-preserving key of its bits
//      (4 passes of 8 bits, counting into 256 bins); every logit >= it is kept (ties kept);
//   3. e = exp((l - lmax) / T) of the kept logits (max e = 1), as fixed-point integers
//      E = round(e * 2^40); S = sum E;
//   4. top-p < 1: the largest e-value t with sum(E of e >= t) >= top_p * S, by the same radix
//      select with E as the weight (the bits of a positive float order it as its value);
//   5. min-p: keep e >= min_p (the reference's p >= min_p * max(p) with max(e) = 1);
//   6. K = sum of kept E; target = floor(u * K) with u's 24 bits, exact in 128-bit integers; the
//      token is the first id whose inclusive prefix sum of kept E exceeds it (each block starts
//      from the kept mass of the chunks before its own and scans its chunk in tiles, in id order).
// Steps 2 and 4 read the chunk four times; the second pass also lists, in shared memory, the ids
// under the first digit, and when they fit the last two passes read only them. With top-k on,
// step 3 lists the kept set, and a block whose set fits runs steps 4-6 on its list (the draw
// ranks a short list's entries by id pairwise instead of scanning the chunk). A list holds the
// same values the chunk would give, so the token does not depend on which a block reads.
// Sums are integers, so they do not depend on summation order: the result is deterministic and
// the same in a graph replay as eagerly. e is float32 with the rounding of l - lmax and of the
// division carried as a first-order correction, so its error is expf's own (~2 ulp); E's grain is
// 2^-40 of the largest e (a token below 2^-41 of the top one is never drawn). Against the float64
// reference (and its float64 parameters: here they are float32) the token differs only where
// u * total falls within that rounding (~1e-6 relative) of a cumulative boundary, or where
// top_p * total or min_p lands that close to a threshold.
//
// Device parameters are not checked (the host side checks what it uploads); odd values still give
// a valid id: temperature <= 0 or NaN is greedy, top_k outside (0, vocab) and top_p >= 1 or NaN
// disable the filter, min_p is capped at 1 so the top token always survives.
#include "philox.cuh"

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;       // 32: the warp totals fit one warp
constexpr int kBins = 256;
constexpr int kTile = kThreads * 4;         // ids per scan tile: four consecutive ids per thread
constexpr int kList = 2048;                 // candidates a block keeps in shared memory
constexpr int kListDraw = 256;              // the most list entries the draw ranks pairwise

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// ---------------------------------------------------------------- cluster plumbing (PTX, no headers)

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// The u64 at `p` (a __shared__ address of this block) in the shared memory of block `rank`.
__device__ __forceinline__ u64 remote_u64(const u64* p, u32 rank) {
    u32 local, remote;
    u64 v;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(remote) : "memory");
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

// (v, i) becomes the better of itself and (v2, i2): larger value, then lower id.
__device__ __forceinline__ void take_better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// Argmax over the cluster; every thread gets the result.
template <int C>
__device__ __forceinline__ void cluster_argmax(float& v, int& i, float* sv, int* si, u64* slot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        v = sv[lane];
        i = si[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            take_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
        if (lane == 0) {
            sv[0] = v;
            si[0] = i;
        }
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
    __syncthreads();                        // sv, si free for the next use
    if (C > 1) {
        if (threadIdx.x == 0) *slot = ((u64)__float_as_uint(v) << 32) | (u32)i;
        cluster_sync();
        for (u32 r = 0; r < (u32)C; ++r) {
            const u64 x = remote_u64(slot, r);
            take_better(v, i, __uint_as_float((u32)(x >> 32)), (int)(u32)x);
        }
        cluster_sync();
    }
}

// Block-wide sum of integers; every thread gets the result.
__device__ __forceinline__ u64 block_sum(u64 s, u64* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) sh[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = sh[lane];
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
        const u64 w = sh[lane];
        u64 wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 t = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += t;
        }
        sh[lane] = wi - w;                  // exclusive prefix of the warp totals
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

// ---------------------------------------------------------------- kernels

template <int C>
__device__ __forceinline__ void argmax_body(int* __restrict__ out, const float* __restrict__ logits, int vocab) {
    __shared__ float sv[kWarps];
    __shared__ int si[kWarps];
    __shared__ u64 slot;
    const int row = blockIdx.x / C;
    const float* x = logits + (long long)row * vocab;
    int lo, hi;
    chunk<C>(vocab, lo, hi);
    float v = neg_inf();
    int idx = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
        const float l = x[i];
        take_better(v, idx, l != l ? neg_inf() : l, i);
    }
    cluster_argmax<C>(v, idx, sv, si, &slot);
    if (threadIdx.x == 0 && blockIdx.x % C == 0) out[row] = idx;
}

template <int C>
__device__ __forceinline__ void sample_rows_body(
        int* __restrict__ tokens, int* __restrict__ flags, const float* __restrict__ logits,
        const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,
        const float* __restrict__ min_p, const u64* __restrict__ seed, const int* __restrict__ position, int vocab) {
    __shared__ Smem sm;
    const int row = blockIdx.x / C;
    const bool leader = threadIdx.x == 0 && blockIdx.x % C == 0;
    const float* x = logits + (long long)row * vocab;
    int lo, hi;
    chunk<C>(vocab, lo, hi);
    u64 before;

    // 1. max, argmax, non-finite check
    float lmax = neg_inf();
    int amax = 0x7fffffff;
    int bad = 0;
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
        const float l = x[i];
        bad |= (l != l) | (l == pos_inf());
        take_better(lmax, amax, l != l ? neg_inf() : l, i);
    }
    bad = __syncthreads_or(bad);
    bad = cluster_sum<C>((u64)bad, &sm.slot, &before) != 0;
    cluster_argmax<C>(lmax, amax, sm.sv, sm.si, &sm.slot);
    bad |= lmax == neg_inf();               // no finite logit
    const float t = temperature[row];
    if (bad || !(t > 0.f)) {                // the same decision in every block of the cluster
        if (leader) {
            tokens[row] = amax;
            flags[row] = bad;
        }
        return;
    }

    // 2. top-k threshold on the logits (division by t > 0 keeps their order)
    const int k = top_k[row];
    float kth = neg_inf();
    if (k > 0 && k < vocab) kth = key_value(select_from_top<C>(TopKKeys{x}, lo, hi, (u64)k, sm));

    // 3. S = sum of E over the top-k set; with top-k on, the set (E > 0) is listed as well, and a
    // block whose set fits reads only its list in the steps below (the same values either way)
    const TopPKeys tp{x, kth, lmax, t};
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
    const int n = sm.n;
    const bool listed = try_list && n <= kList;

    // 4. top-p threshold in e; 5. min-p; both as one lower bound on e, at most 1 (the top token)
    float e_min = 0.f;
    const float p = top_p[row];
    if (p < 1.f) {
        double want = ceil((double)p * (double)s);
        want = want < 1.0 ? 1.0 : (want > (double)s ? (double)s : want);
        e_min = __uint_as_float(select_from_top<C>(tp, lo, hi, (u64)want, sm, listed));
    }
    e_min = fminf(fmaxf(e_min, min_p[row]), 1.f);

    // 6. draw: the first id whose prefix sum of kept E exceeds floor(u * K)
    u64 kept = 0;
    if (listed) {
        for (int j = threadIdx.x; j < n; j += kThreads)
            if (__uint_as_float(sm.lkey[j]) >= e_min) kept += sm.lw[j];
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
            const float l = x[i];
            if (l >= kth) {
                const float e = exp_rel(l, lmax, t);
                if (e >= e_min) kept += fixed(e);
            }
        }
    }
    u64 run;                                // kept mass of the chunks before this block's
    kept = cluster_sum<C>(block_sum(kept, sm.sh), &sm.slot, &run);
    const u64 u24 = philox::bits24(seed[row], (u32)position[row], philox::kSample, 0u);
    const u64 target = (__umul64hi(u24, kept) << 40) | ((u24 * kept) >> 24);   // floor(u24 * K / 2^24) < K
    if (leader) flags[row] = 0;
    if (listed && n <= kListDraw) {
        // a short list: each entry's kept mass below it in id order, by comparing every pair
        if (run <= target && threadIdx.x < n && __uint_as_float(sm.lkey[threadIdx.x]) >= e_min) {
            const int id = sm.lid[threadIdx.x];
            u64 c = run;
            for (int j = 0; j < n; ++j)
                if (sm.lid[j] < id && __uint_as_float(sm.lkey[j]) >= e_min) c += sm.lw[j];
            if (c <= target && target < c + sm.lw[threadIdx.x]) tokens[row] = id;   // one entry of the cluster
        }
        return;
    }
    for (int base = lo; base < hi && run <= target; base += kTile) {
        u64 w[4];
        u64 mine = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + 4 * threadIdx.x + j;
            w[j] = 0;
            if (i < hi) {
                const float l = x[i];
                if (l >= kth) {
                    const float e = exp_rel(l, lmax, t);
                    if (e >= e_min) w[j] = fixed(e);
                }
            }
            mine += w[j];
        }
        u64 tile;
        u64 c = run + block_exclusive_scan(mine, sm.sh, &tile);
        if (c <= target && target < c + mine) {           // exactly one thread of the cluster
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                c += w[j];
                if (c > target) {
                    tokens[row] = base + 4 * threadIdx.x + j;
                    break;
                }
            }
        }
        run += tile;
    }
}

#define SAMPLING_KERNELS(C)                                                                                       \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, 1)                            \
    argmax_c##C(int* __restrict__ out, const float* __restrict__ logits, int vocab) {                              \
        argmax_body<C>(out, logits, vocab);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, 1)                            \
    sample_rows_c##C(int* __restrict__ tokens, int* __restrict__ flags, const float* __restrict__ logits,          \
                     const float* __restrict__ temperature, const int* __restrict__ top_k,                         \
                     const float* __restrict__ top_p, const float* __restrict__ min_p,                             \
                     const u64* __restrict__ seed, const int* __restrict__ position, int vocab) {                  \
        sample_rows_body<C>(tokens, flags, logits, temperature, top_k, top_p, min_p, seed, position, vocab);       \
    }

SAMPLING_KERNELS(1)
SAMPLING_KERNELS(2)
SAMPLING_KERNELS(4)
SAMPLING_KERNELS(8)
