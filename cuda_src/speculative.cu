// speculative.cu — verification of a drafted block per row (rules: glimmer_cupy/reference/
// speculative.py), on the row machinery of sampling.cu (sampling_rows.cuh) and the scalar rules of
// row_math.cuh, so that every p here is the distribution sample_rows draws from.
//
// verify_init      a row's stop word (in n_accepted) and done count (in flags), the greedy
//                  kernel's per-position slots, both kernels' queues and their lists of rows (the
//                  rows at temperature > 0, then the others, each in row order).  grid=(1,) block=(kInitThreads,)
// verify_<D>_c<C>  D = i32 | i64 (the drafts' dtype); the rows at temperature > 0: clusters of C
//                  blocks, as many as fit at once, each taking (position, row) items (position-major:
//                  position i / R of the (i % R)-th of the R listed rows) from a queue until it is empty.
//                  grid=(clusters * C,) block=(VERIFY_THREADS,) dynamic smem=4 * (cache + 4) bytes
// verify_greedy_<D> the greedy rows (temperature <= 0 or NaN): S items per (position, listed row),
//                  each the argmax of `per` ids, position-major as above, taken from a queue by the
//                  launch's blocks, which jump it past a finished row's items; the last block
//                  to leave decides every greedy row.
//                  grid=(min(items, resident blocks),) block=(kGreedyThreads,)
// Both kernels run on every verification, each over its own list of rows: a kernel with no row
// costs a launch of resident blocks that find their queue empty (a launch of one block or cluster
// an item cost ~3 us a wave of SMs, even for blocks that returned at once).
//
// Every position 0..k of a row is an item of its own, examined by one cluster; a position does
// not wait for the ones before it. What joins them is the row's stop word (row_math.cuh): a
// position that ends the walk folds (a, flags) into it with atomicMin, so it ends as the first
// such position, and every position before that one accepted. Nothing else is shared, and the
// token of each position is a function of that position alone, so the result is the sequential
// walk's (and does not depend on C, the batch, the order the clusters run in, or graph replay).
// Items are taken in position-major order, position 0 of every row first, so an item usually starts
// after the positions before it have ended; the stop word is read first (and a stochastic row's
// again after its max pass), and the work is skipped when an earlier position already ended the
// row: the bytes read are about those of the examined positions, not of all n + 1. A greedy row
// also lowers its early end as soon as one block sees its draft beaten (verify_greedy below).
//
// A position a reads its logits row once for max/argmax/non-finite (step 1 of sampling.cu),
// in float4 loads, 4 in flight per thread. Then:
//   - a non-finite row: it ends with its argmax, flag 1;
//   - greedy: accept iff the draft is the argmax, else end with the argmax;
//   - stochastic with 0 < top-k <= kTopkFast: the first read also takes the
//     group maxima of sample_rows' short path (sampling_topk.cuh), a second read gathers the list
//     of logits at or above their bound into rank 0, and rank 0 decides the position from the list
//     alone (verify_list: the same weights, tests and draws as below, on the listed ids);
//   - other stochastic rows (and a list that overflowed) keep the block's chunk in shared memory
//     (`cache` floats per block, 0: the chunk does not fit and the later passes read global memory)
//     and run steps 2-5 (top-k, top-p, min-p; a plain temperature row skips them and sums K in the
//     same pass as S) and K = sum of kept E, then E(d) and q(d) (one float each) and accept iff
//     u < (E(d) / K) / q(d) in float64 (u = uniform(seed, pos + a, ACCEPT)). Ending positions draw
//     their token:
//       a = k: the bonus, step 6 over E with uniform(seed, pos + k, SAMPLE): sample_rows' draw;
//       a rejected point-mass draft: step 6 over E without d (K - E(d); before this block's
//       chunk, `before` less E(d) if d lies there), p itself if that is empty;
//       a rejected draft with q: one more pass over the kept ids summing W = max(0, E - floor(q K))
//       (row_math.cuh), then step 6 over W (uniform(seed, pos + a, RESIDUAL)); p if W is 0.
// Each cluster then counts itself done in the row's count (flags); the last of the row's k + 1
// writes n_accepted = a and flags from the stop word and pads tokens after a. Only the ending
// position a's token and the accepted drafts before it survive: a later position that ran
// anyway may have written its own token, which the last one overwrites with the pad.
//
// Device inputs are not checked (ops/speculative.py checks host inputs): a draft outside
// [0, vocab) is rejected without being read (flag 4, INVALID_DRAFT; the correction is then drawn
// from p, or from max(0, p - q)), n_drafts is clamped to [0, n], and q entries that are negative or
// NaN act as 0 in the test and in the residual. Every written token is still a valid id.
// Threads a block of the cluster kernel, the row machinery's kThreads here: a compile-time switch,
// built at both sizes (ops/speculative.py: verify_threads picks one a launch). 1024: one block an SM
// at 64 registers. At 512 (C = 1 bounded to two blocks an SM, so that one block's latency-bound
// stages after its read overlap the other's read) the H200 measured 64 rows x 16 at vocab 151936
// 129.3 against 103.2 us, and faster with few rows or a small vocabulary (one row at 262144: 26.6
// against 42.2; bench/results/probe_verify_threads_7ffe144.txt). Larger clusters keep up to 128
// registers at 512 threads (under 64 their list steps spill).
#ifndef VERIFY_THREADS
#define VERIFY_THREADS 1024
#endif
#define ROW_THREADS VERIFY_THREADS
#include "sampling_rows.cuh"
#include "sampling_topk.cuh"          // the short path's list, for rows with a small top-k
template <int C>
constexpr int verify_blocks_per_sm() { return C == 1 ? 1024 / kThreads : 1; }
#include "stamps.cuh"                 // per-item stage stamps (bench/probe_verify.py)

using rowmath::kNonFinite;
using rowmath::kZeroQDraft;
constexpr int kPad = -1;

// The weights of the draw that ends a verification, one functor so that the kernel has one draw:
// p itself, p without the rejected point-mass draft d, or max(0, p - q) in E's units (row_math.cuh).
struct EndWeights {
    enum { kP, kExclude, kResidual } mode;
    int d;
    const float* q;                         // the drafter's row at the rejected position
    u64 kept;
    __device__ u64 operator()(int i, u64 e) const {
        if (mode == kP) return e;
        if (mode == kExclude) return i == d ? 0 : e;
        return rowmath::residual_weight(e, q[i], kept);
    }
};

// A load the compiler may not move into the branch that uses it (issued where written).
__device__ __forceinline__ float ld_early(const float* p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// verify_list's steps 2-6 on a list of at most kWarpList entries by the first kListWarps warps of
// rank 0 (sampling_topk.cuh's list_weights_warps / list_pick_warps: shuffles and one named barrier
// a pairwise sum in place of the block's barriers; integer sums and maxima, so the same token as
// the block's steps). Every lane of those warps calls it. VERIFY_LIST_BLOCK keeps every list on the
// block's steps, for the A/B.
__device__ __forceinline__ void verify_list_warps(u32 n, int k, float t, float top_p, float min_p, const RowDist& rd,
                                                  SampleSmem& sm, long long dl, bool drafted, int fl,
                                                  const float* __restrict__ qa, u64 seed, u32 pa, int a, int* out,
                                                  int* key) {
    TopkWork& w = sm.fast;
    int id[2];
    u64 wt[2];
    list_weights_warps<kListWarps>((int)n, k, t, top_p, min_p, rd.lmax, w, id, wt);
    const u64 kept = warp_sum_u64(wt[0] + wt[1]);
    const int d = drafted && fl == 0 ? (int)dl : -1;         // fl: a drafted id outside [0, vocab)
    const unsigned at0 = __ballot_sync(0xffffffffu, d >= 0 && id[0] == d);
    const unsigned at1 = __ballot_sync(0xffffffffu, d >= 0 && id[1] == d);
    const u64 e_d0 = shfl_u64(wt[0], at0 ? __ffs(at0) - 1 : 0), e_d1 = shfl_u64(wt[1], at1 ? __ffs(at1) - 1 : 0);
    const u64 e_d = at0 ? e_d0 : at1 ? e_d1 : 0ull;           // 0: d not listed
    STAMP_AT(5);
    u64 m0 = wt[0], m1 = wt[1], total = kept;
    u32 u24;
    int end_key;
    if (!drafted) {                         // every draft accepted: the bonus, as sample_rows draws it
        u24 = philox::bits24(seed, pa, philox::kSample, 0u);
        end_key = rowmath::stop_key(a, 0);
    } else {
        // q at d and at the listed ids in one trip, before the test (the residual's loads, after
        // a rejection, were a second trip to DRAM; VERIFY_LATE_Q: the order before, for the A/B)
#ifndef VERIFY_LATE_Q
        const float q0 = qa && wt[0] ? ld_early(qa + id[0]) : 0.f;
        const float q1 = qa && wt[1] ? ld_early(qa + id[1]) : 0.f;
#endif
        const double q_d = !qa ? 1.0 : d >= 0 ? (double)qa[d] : 0.0;
        if (d >= 0 && rowmath::accepts(philox::bits24(seed, pa, philox::kAccept, 0u), e_d, kept, q_d)) {
            if (threadIdx.x == 0) *out = d;
            return;
        }
#ifdef VERIFY_LATE_Q
        const float q0 = qa && wt[0] ? qa[id[0]] : 0.f;
        const float q1 = qa && wt[1] ? qa[id[1]] : 0.f;
#endif
        if (!qa) {                          // excluded-token correction; p itself if only d was kept
            if (kept - e_d) {
                m0 = id[0] == d ? 0 : wt[0];
                m1 = id[1] == d ? 0 : wt[1];
                total = kept - e_d;
            }
        } else {                            // residual correction; p itself if max(0, p - q) = 0
            const u64 r0 = wt[0] ? rowmath::residual_weight(wt[0], q0, kept) : 0;
            const u64 r1 = wt[1] ? rowmath::residual_weight(wt[1], q1, kept) : 0;
            const u64 rs = warp_sum_u64(r0 + r1);
            if (rs) {
                m0 = r0;
                m1 = r1;
                total = rs;
            }
        }
        u24 = philox::bits24(seed, pa, philox::kResidual, 0u);
        end_key = rowmath::stop_key(a, fl | (qa && d >= 0 && q_d == 0.0 ? kZeroQDraft : 0));
    }
    list_pick_warps<kListWarps>(id, m0, m1, draw_target(u24, total), w, out);
    STAMP_AT(6);
    if (threadIdx.x == 0) *key = end_key;
}

// Steps 2-6 of a stochastic position from the short path's list (sampling_topk.cuh), after
// row_max_groups<C>(x, lo, hi, topk_group_lanes<C>(k), ...): the list holds every id top-k keeps,
// so E(d) is its entry's weight (0 when d is not listed: its logit is below the bound, so below
// the k-th), K is the list's total, and every end draws over the list's weights (p, p without d, or
// max(0, E - floor(q K)) at the listed ids: outside the kept set E is 0 and so is the residual),
// with the long path's uniforms, tests and fallbacks, so the token is the one the long path gives.
// Returns false in every block alike when the list overflowed (the caller runs the long path);
// otherwise rank 0 writes out[0] (position a's token) if the position accepts or draws, and *key
// (its stop key, left as it is on acceptance), and the other blocks return at once.
//
// At C = 1 the row's stop word is read again (stop, loaded before the bound, read after it): a
// position whose row ended meanwhile, while its chunk was read, leaves the gather, the weights and
// the decision out, as a position claimed after the end leaves out all of its work (a hint: any
// value is safe). VERIFY_NO_LATE_SKIP builds it without, for the A/B.
template <int C>
__device__ __forceinline__ bool verify_list(const float* __restrict__ x, int lo, int hi, int k, float t, float top_p,
                                         float min_p, float tmax, const RowDist& rd, SampleSmem& sm, long long dl,
                                         bool drafted, int fl, const float* __restrict__ qa, u64 seed, u32 pa, int a,
                                         int* out, int* key, const int* stop, const KeptFloat4* keep) {
    TopkWork& w = sm.fast;
#ifndef VERIFY_NO_LATE_SKIP
    const int word = C == 1 && threadIdx.x == 0 ? __ldcg(stop) : 0;      // in flight during the bound
#endif
    const float tau = group_bound(C * (kThreads / topk_group_lanes<C>(k)), k, w);
    STAMP_AT(3);
#ifndef VERIFY_NO_LATE_SKIP
    if (C == 1) {
        __shared__ int ended;
        if (threadIdx.x == 0) ended = rowmath::stop_at(word) < a;
        __syncthreads();
        if (ended) return true;             // (ended is next written after the item's end barriers)
    }
#endif
    const u32 n = gather_list<C>(x, lo, hi, tau, tmax, sm, keep);
    STAMP_AT(4);
    if (n > (u32)kTopkList) return false;   // the same count in every block
    if (C > 1 && cluster_rank() != 0) return true;
#ifndef VERIFY_LIST_BLOCK
    // a short list at C = 1 (the many-row case): kListWarps warps, no block barriers (at C >= 2 the
    // warps' path spills under the 64 registers of the cluster builds)
    if (C == 1 && n <= (u32)kWarpList) {
        if (threadIdx.x < 32 * kListWarps)
            verify_list_warps(n, k, t, top_p, min_p, rd, sm, dl, drafted, fl, qa, seed, pa, a, out, key);
        return true;
    }
#endif
    __shared__ u64 e_d;
    if (threadIdx.x == 0) e_d = 0;
    u64 kept;
    const ListEntry le = list_weights((int)n, k, t, top_p, min_p, rd.lmax, w, &kept);   // its barriers order e_d's
    const int d = drafted && fl == 0 ? (int)dl : -1;         // fl: a drafted id outside [0, vocab)
    if (le.lead && le.id == d) e_d = le.w;
    __syncthreads();
    STAMP_AT(5);
    u64 mine = le.w, total = kept;
    u32 u24;
    int end_key;
    if (!drafted) {                         // every draft accepted: the bonus, as sample_rows draws it
        u24 = philox::bits24(seed, pa, philox::kSample, 0u);
        end_key = rowmath::stop_key(a, 0);
    } else {
        const double q_d = !qa ? 1.0 : d >= 0 ? (double)qa[d] : 0.0;
        if (d >= 0 && rowmath::accepts(philox::bits24(seed, pa, philox::kAccept, 0u), e_d, kept, q_d)) {
            if (threadIdx.x == 0) *out = d;
            return true;
        }
        if (!qa) {                          // excluded-token correction; p itself if only d was kept
            if (kept - e_d) {
                mine = le.id == d ? 0 : le.w;
                total = kept - e_d;
            }
        } else {                            // residual correction; p itself if max(0, p - q) = 0
            const u64 r = le.w ? rowmath::residual_weight(le.w, qa[le.id], kept) : 0;
            const u64 rs = block_sum(le.lead ? r : 0ull, w.sh);
            if (rs) {
                mine = r;
                total = rs;
            }
        }
        u24 = philox::bits24(seed, pa, philox::kResidual, 0u);
        end_key = rowmath::stop_key(a, fl | (qa && d >= 0 && q_d == 0.0 ? kZeroQDraft : 0));
    }
    __syncthreads();                        // every read of w.lw is done
    if (le.lead) w.lw[le.sg.j] = mine;
    __syncthreads();
    list_draw(le, mine, (int)n, draw_target(u24, total), w, out);
    STAMP_AT(6);
    if (threadIdx.x == 0) *key = end_key;
    return true;
}

// verify_init's block (one, walking the rows in steps of its size).
constexpr int kInitThreads = 1024;

extern "C" __global__ void __launch_bounds__(kInitThreads)
verify_init(int* __restrict__ n_accepted, int* __restrict__ flags, const int* __restrict__ n_drafts,
            const float* __restrict__ temperature, u64* __restrict__ best, int* __restrict__ done,
            int* __restrict__ queues, int* __restrict__ lists, int rows, int n, int has_n_drafts) {
    pdl_wait();
    __shared__ int warp_n[2][kInitThreads / 32];
    __shared__ int base[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) base[0] = base[1] = 0;
    for (int r0 = 0; r0 < rows; r0 += kInitThreads) {
        const int r = r0 + threadIdx.x;
        bool stochastic = false;
        if (r < rows) {
            n_accepted[r] = rowmath::stop_none(rowmath::row_drafts(has_n_drafts, n_drafts, r, n));
            flags[r] = 0;
            for (int a = 0; a <= n; ++a) {  // slot g = a * rows + r of the greedy kernel
                best[(long long)a * rows + r] = 0;
                done[(long long)a * rows + r] = 0;
            }
            done[(long long)(n + 1) * rows + r] = n + 1;    // the greedy row's early end: none known yet
            stochastic = temperature[r] > 0.f;
        }
        // each row's place in its list, in row order: a scan of the two predicates over the block
        const unsigned st = __ballot_sync(0xffffffffu, r < rows && stochastic);
        const unsigned gr = __ballot_sync(0xffffffffu, r < rows && !stochastic);
        if (lane == 0) {
            warp_n[0][warp] = __popc(st);
            warp_n[1][warp] = __popc(gr);
        }
        __syncthreads();
        if (r < rows) {
            const int l = stochastic ? 0 : 1;
            int at = base[l] + __popc((stochastic ? st : gr) & ((1u << lane) - 1u));
            for (int w = 0; w < warp; ++w) at += warp_n[l][w];
            lists[2 + l * rows + at] = r;
        }
        __syncthreads();
        if (threadIdx.x < 2) {
            int t = 0;
            for (int w = 0; w < kInitThreads / 32; ++w) t += warp_n[threadIdx.x][w];
            base[threadIdx.x] += t;
        }
        __syncthreads();
    }
    if (threadIdx.x < 2) lists[threadIdx.x] = base[threadIdx.x];    // rows in each list
    if (threadIdx.x < 3) queues[threadIdx.x] = 0;   // the cluster kernel's queue, verify_greedy's, its exits
}

// This block's ids [lo, hi): chunks of a multiple of 4 ids, so that a row whose start is 16-byte
// aligned is read in float4 (the chunking does not change any result: sums are integers).
template <int C>
__device__ __forceinline__ void chunk4(int vocab, int& lo, int& hi) {
    const int per = ((vocab + C - 1) / C + 3) & ~3;
    const int r = C == 1 ? 0 : (int)cluster_rank();
    lo = min(vocab, r * per);
    hi = min(vocab, lo + per);
}

// Every thread of the cluster gets thread 0 of block 0's `v` (so that all blocks branch alike).
template <int C>
__device__ __forceinline__ bool cluster_leader_says(bool v, Smem& sm) {
    __shared__ int said;
    if (threadIdx.x == 0) said = v && (C == 1 || cluster_rank() == 0);
    __syncthreads();
    const int s = said;
    __syncthreads();                        // `said` is free again
    u64 before;
    return cluster_sum<C>((u64)s, &sm.slot, &before) != 0;
}

// The row already ended before position a (read from its stop word; a hint, any value is safe).
template <int C>
__device__ __forceinline__ bool ended_before(const int* stop, int a, Smem& sm) {
    const bool v = threadIdx.x == 0 && rowmath::stop_at(__ldcg(stop)) < a;
    return cluster_leader_says<C>(v, sm);
}

// Max, lowest argmax and the non-finite check of a thread's share of [lo, hi) of the global row x,
// in a block of T threads: float4 loads, U in flight per thread, when x + lo is 16-byte aligned;
// the chunk is copied to cache[0, hi - lo) unless cache is null. Order does not matter: the pair
// (value, lowest id of the maximum) and the OR are the same in any order.
template <int T, int U = 4>
__device__ __forceinline__ void scan_max(const float* __restrict__ x, int lo, int hi, float* cache, float& lmax,
                                         int& amax, int& bad) {
    if ((((size_t)(x + lo)) & 15) == 0) {
        const int n4 = (hi - lo) >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(x + lo);
        for (int j0 = threadIdx.x; j0 < n4; j0 += U * T) {
            float4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = j0 + u * T;
                v[u] = j < n4 ? __ldcs(x4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int j = j0 + u * T;
                if (j < n4) {
                    if (cache) reinterpret_cast<float4*>(cache)[j] = v[u];
                    take1(v[u].x, lo + 4 * j, lmax, amax, bad);
                    take1(v[u].y, lo + 4 * j + 1, lmax, amax, bad);
                    take1(v[u].z, lo + 4 * j + 2, lmax, amax, bad);
                    take1(v[u].w, lo + 4 * j + 3, lmax, amax, bad);
                }
            }
        }
        for (int i = lo + 4 * n4 + threadIdx.x; i < hi; i += T) {
            const float l = x[i];
            if (cache) cache[i - lo] = l;
            take1(l, i, lmax, amax, bad);
        }
    } else {
        for (int i0 = lo + threadIdx.x; i0 < hi; i0 += U * T) {
            float v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * T;
                v[u] = i < hi ? __ldcs(x + i) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = i0 + u * T;
                if (i < hi) {
                    if (cache) cache[i - lo] = v[u];
                    take1(v[u], i, lmax, amax, bad);
                }
            }
        }
    }
}

// Step 1 (row_max's result) over [lo, hi) of the global row x for a block of the cluster,
// copying the chunk to cache unless it is null.
template <int C>
__device__ __forceinline__ void max_pass(const float* __restrict__ x, int lo, int hi, float* cache, Smem& sm,
                                         RowDist& rd) {
    float lmax = neg_inf();
    int amax = 0x7fffffff;
    int bad = 0;
    scan_max<kThreads>(x, lo, hi, cache, lmax, amax, bad);
    finish_row_max<C>(lmax, amax, bad, sm, rd);   // its barrier also orders the cache's writes
}

// A plain temperature row (no top-k, top-p or min-p): kth = -inf and e_min = 0, so K is S, summed
// in one pass of exactly the weights weight_sum<KeptE> would add.
template <int C>
__device__ __forceinline__ u64 plain_sum(const float* x, int lo, int hi, float t, Smem& sm, RowDist& rd, u64* before) {
    rd.t = t;
    rd.kth = neg_inf();
    rd.e_min = 0.f;
    rd.n = 0;
    rd.listed = false;
    u64 s = 0;
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) s += fixed(exp_rel(x[i], rd.lmax, t));
    return cluster_sum<C>(block_sum(s, sm.sh), &sm.slot, before);
}

// An int in shared memory, read where it is used.
struct SharedInt {
    const volatile int* p;
    __device__ __forceinline__ operator int() const { return *p; }
};

// A position is done (key: its stop key, -1 if it accepted or was skipped):
// the leader folds it into the row's stop word, and the row's last position to finish writes the
// row's result.
__device__ __forceinline__ void end_position(int* __restrict__ n_accepted, int* __restrict__ tokens,
                                             int* __restrict__ flags, int row, int k, int n, int key) {
    int* stop = n_accepted + row;
    if (key >= 0) atomicMin(stop, key);
    __threadfence();
    if (atomicAdd(flags + row, 1) == k) {   // the row's last position to finish
        __threadfence();
        const int word = atomicOr(stop, 0);
        const int at = rowmath::stop_at(word);
        *stop = at;
        flags[row] = rowmath::stop_flags(word);
        int* out = tokens + (long long)row * (n + 1);
        for (int j = at + 1; j <= n; ++j) out[j] = kPad;
    }
}

template <int C, class D>
__device__ __forceinline__ void verify_item(
        int g, int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,
        const float* __restrict__ logits, const D* __restrict__ drafts, const float* __restrict__ q,
        const int* __restrict__ n_drafts, const float* __restrict__ temperature, const int* __restrict__ top_k,
        const float* __restrict__ top_p, const float* __restrict__ min_p, const u64* __restrict__ seed,
        const int* __restrict__ position, int rows, int n, int vocab, int has_q, int has_n_drafts, int cache_cap) {
    __shared__ SampleSmem ssm;              // the long path's Smem, in a union with the short path's
    Smem& sm = ssm.slow;
    extern __shared__ float4 dyn_cache[];
    // How the position ends, in shared memory (written by thread 0, read after a barrier):
    // registers are short across the radix selects
    __shared__ struct {
        EndWeights wf;
        u64 run, total;                     // the draw's weight before this block's chunk, and in all
        u32 u24;
        int drawn;                          // the position ends with a draw
        int key;                            // its stop key, -1: it accepted (or was skipped)
    } end;
    // the item (a, row, k) read from shared memory where used, not held in registers across the
    // passes (the kernel has 64 a thread, and g is no longer blockIdx, which costs none)
    __shared__ int item[3];
    // at C = 1 each thread's best float4 of the first read, for the gather (gather_list), in the
    // dynamic shared memory that the long path's cache uses (a position takes one path or the other;
    // the launch gives C = 1 at least kKeptBytes)
    KeptFloat4* const keep = C == 1 ? reinterpret_cast<KeptFloat4*>(dyn_cache) : nullptr;
    if (threadIdx.x == 0) {
        const int ga = g / rows, grow = g - ga * rows;
        item[0] = ga;
        item[1] = grow;
        item[2] = rowmath::row_drafts(has_n_drafts, n_drafts, grow, n);
    }
    __syncthreads();
    const SharedInt a{item}, row{item + 1}, k{item + 2};
    STAMP_SLOT(g * C + (C == 1 ? 0 : cluster_rank()));
    STAMP_AT(0);
    const bool leader = threadIdx.x == 0 && (C == 1 || cluster_rank() == 0);
    const auto out = [&]() { return tokens + (long long)(int)row * (n + 1); };   // made where used
    int lo, hi;
    chunk4<C>(vocab, lo, hi);
    __shared__ ReadWatch watch;             // C = 1, short lists: the row's end seen during the read
    if (threadIdx.x == 0) {
        end.drawn = 0;
        end.key = -1;
        watch.stop = n_accepted + row;
        watch.a = a;
        watch.ended = 0;
    }
    if (!ended_before<C>(n_accepted + row, a, sm)) {        // its barriers order the writes above
        const auto x = [&]() { return logits + ((long long)(int)row * (n + 1) + (int)a) * vocab; };
        const float t = temperature[row];
        const bool greedy = !(t > 0.f);
        // a small top-k: step 1 with the group maxima, then steps 2-6 on the short path's list
        const int tk0 = top_k[row];
        const bool short_k = !greedy && tk0 > 0 && tk0 < vocab && tk0 <= kTopkFast;
        const bool cached = !greedy && !short_k && hi - lo <= cache_cap;
        float* cache = reinterpret_cast<float*>(dyn_cache);
        RowDist rd;
        float tmax = neg_inf();
        STAMP_AT(1);
        if (short_k) row_max_groups<C, true>(x(), lo, hi, topk_group_lanes<C>(tk0), ssm, rd, &tmax, keep, &watch);
        else max_pass<C>(x(), lo, hi, cached ? cache : nullptr, sm, rd);
        STAMP_AT(2);
        const bool drafted = a < k;
        const long long dl = drafted ? (long long)drafts[(long long)row * n + a] : -1;
        int fl;
        const bool accept_greedy = rowmath::greedy_accepts(drafted, dl, vocab, rd.amax, &fl);
        if (C == 1 && short_k && watch.ended) {
            // the row ended while the chunk was read (the read stopped there): nothing to decide
        } else if (rd.bad || greedy) {
            if (leader) {
                out()[a] = accept_greedy && !rd.bad ? (int)dl : rd.amax;
                if (rd.bad || !accept_greedy) end.key = rowmath::stop_key(a, rd.bad ? kNonFinite : fl);
            }
        } else if (short_k && verify_list<C>(x(), lo, hi, tk0, t, top_p[row], min_p[row], tmax, rd, ssm,
                                             dl, drafted, fl, has_q ? q + ((long long)row * n + a) * vocab : nullptr,
                                             seed[row], (u32)position[row] + (u32)a, a, out() + a, &end.key,
                                             n_accepted + row, keep)) {
            // the list held every kept id: the position is decided
        } else if (!ended_before<C>(n_accepted + row, a, sm)) {
            // the long path, and a short-k row whose list overflowed (every block alike: the list's
            // shared memory is free again after gather_list's last barrier)
            const float* xs = cached ? cache - lo : x();      // ids [lo, hi) from the cache
            const int tk = top_k[row];
            const float tp = top_p[row], mp = min_p[row];
            u64 before, kept;
            if (!(tk > 0 && tk < vocab) && !(tp < 1.f) && !(mp > 0.f)) {
                kept = plain_sum<C>(xs, lo, hi, t, sm, rd, &before);
            } else {
                row_filter<C>(xs, lo, hi, vocab, t, tk, tp, mp, sm, rd);
                kept = weight_sum<C>(xs, lo, hi, rd, sm, KeptE{}, &before);
            }
            const u32 pa = (u32)position[row] + (u32)a;
            const bool valid = dl >= 0 && dl < vocab;
            const int d = valid ? (int)dl : -1;
            if (!drafted) {                 // every draft accepted: the bonus, as sample_rows draws it
                if (threadIdx.x == 0) {
                    end.wf = EndWeights{EndWeights::kP, -1, nullptr, kept};
                    end.run = before;
                    end.total = kept;
                    end.u24 = philox::bits24(seed[row], pa, philox::kSample, 0u);
                    end.drawn = 1;
                    end.key = rowmath::stop_key(a, 0);
                }
            } else {
                const float* qa = q + ((long long)row * n + a) * vocab;
                const u64 e_d = valid ? kept_weight(rd, x(), d, KeptE{}) : 0;     // x: d may lie in any chunk
                const double q_d = !has_q ? 1.0 : valid ? (double)qa[d] : 0.0;
                if (valid && rowmath::accepts(philox::bits24(seed[row], pa, philox::kAccept, 0u), e_d, kept, q_d)) {
                    if (leader) out()[a] = d;
                } else {
                    EndWeights wf{EndWeights::kP, -1, nullptr, kept};
                    u64 run = before, total = kept;
                    if (!has_q) {           // excluded-token correction; p itself if only d was kept
                        if (kept - e_d) {
                            wf = EndWeights{EndWeights::kExclude, d, nullptr, kept};
                            run = before - (valid && d < lo ? e_d : 0);
                            total = kept - e_d;
                        }
                    } else {                // residual correction; p itself if max(0, p - q) = 0
                        const EndWeights res{EndWeights::kResidual, d, qa, kept};
                        u64 rrun;
                        const u64 w = weight_sum<C>(xs, lo, hi, rd, sm, res, &rrun);
                        if (w) {
                            wf = res;
                            run = rrun;
                            total = w;
                        }
                    }
                    if (threadIdx.x == 0) {
                        end.wf = wf;
                        end.run = run;
                        end.total = total;
                        end.u24 = philox::bits24(seed[row], pa, philox::kResidual, 0u);
                        end.drawn = 1;
                        end.key = rowmath::stop_key(a, fl | (has_q && valid && q_d == 0.0 ? kZeroQDraft : 0));
                    }
                }
            }
            __syncthreads();
            if (end.drawn) draw<C>(xs, lo, hi, rd, sm, end.wf, end.run, draw_target(end.u24, end.total), out() + a);
        }
    }
    // done: every write of this cluster (tokens, the draw's one) before the leader's atomics
    __threadfence();
    __syncthreads();
    if (C > 1) cluster_sync();
    STAMP_AT(7);
    if (leader) end_position(n_accepted, tokens, flags, row, k, n, end.key);
    STAMP_AT(8);
}

// The leader's next (position, row) of this kernel, as g = a * rows + row: items are taken in
// position-major order over the listed rows from `queue`; a position past the row's drafts and one
// after the row already ended (its stop word, a hint) are passed over, the latter counted as done.
// -1: none left.
__device__ __forceinline__ int claim_item(int* __restrict__ queue, const int* __restrict__ lists,
                                          int* __restrict__ n_accepted, int* __restrict__ tokens,
                                          int* __restrict__ flags, const int* __restrict__ n_drafts, int rows,
                                          int n, int has_n_drafts) {
    const int listed = lists[0];
    for (;;) {
        const int i = atomicAdd(queue, 1);
        if (i >= (n + 1) * listed) return -1;
        const int a = i / listed, row = lists[2 + i - a * listed];
        const int k = rowmath::row_drafts(has_n_drafts, n_drafts, row, n);
        if (a > k) continue;
        if (rowmath::stop_at(__ldcg(n_accepted + row)) >= a) return a * rows + row;
        end_position(n_accepted, tokens, flags, row, k, n, -1);
    }
}

// The clusters of the launch take (position, row) items from `queue` until it is empty; the
// leader passes over the positions whose row already ended (counting them as done), so that they
// cost an atomic, not a cluster's launch and barriers.
template <int C, class D>
__device__ __forceinline__ void verify_body(
        int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,
        const float* __restrict__ logits, const D* __restrict__ drafts, const float* __restrict__ q,
        const int* __restrict__ n_drafts, const float* __restrict__ temperature, const int* __restrict__ top_k,
        const float* __restrict__ top_p, const float* __restrict__ min_p, const u64* __restrict__ seed,
        const int* __restrict__ position, int rows, int n, int vocab, int has_q, int has_n_drafts, int cache_cap,
        int* __restrict__ queue, const int* __restrict__ lists) {
    pdl_wait();
    __shared__ int claimed;
    __shared__ u64 slot;
    for (;;) {
        if (threadIdx.x == 0)
            claimed = C == 1 || cluster_rank() == 0
                          ? claim_item(queue, lists, n_accepted, tokens, flags, n_drafts, rows, n, has_n_drafts) + 1
                          : 0;
        __syncthreads();
        u64 before;
        const int g = (int)cluster_sum<C>((u64)claimed, &slot, &before) - 1;   // rank 0's item
        if (g < 0) return;
        verify_item<C, D>(g, n_accepted, tokens, flags, logits, drafts, q, n_drafts, temperature, top_k, top_p,
                          min_p, seed, position, rows, n, vocab, has_q, has_n_drafts, cache_cap);
    }
}

// ---------------------------------------------------------------- greedy rows, without clusters

// threads a block (GREEDY_THREADS, a compile-time switch for bench/probe_verify_greedy.py)
#ifndef GREEDY_THREADS
#define GREEDY_THREADS 256
#endif
constexpr int kGreedyThreads = GREEDY_THREADS;
// float4 loads in flight a thread, and the blocks an SM the registers must allow (compile-time
// switches for bench/probe_verify_greedy.py). 5 blocks: 48 registers; greedy_scan4 asks 59 without
// the bound, and at 4 blocks an SM the probe's 64 x 16 case ran 100.2 us against 98.3.
#ifndef GREEDY_LOADS
#define GREEDY_LOADS 4
#endif
#ifndef GREEDY_MIN_BLOCKS
#define GREEDY_MIN_BLOCKS 5
#endif
#define GREEDY_BOUNDS __launch_bounds__(kGreedyThreads, GREEDY_MIN_BLOCKS)
constexpr int kGreedyLoads = GREEDY_LOADS;

// (value, id) as one integer whose maximum is the larger value, then the lower id; 0 is below
// every pair a block writes (order_key(-inf) > 0).
__device__ __forceinline__ u64 pair_key(float v, int i) {
    return ((u64)order_key(v) << 32) | (u64)(0xffffffffu - (u32)i);
}

// float4s j0, j0 + T, ... below jend of x4 into s, U loads in flight
__device__ __forceinline__ void max4_range(const float4* __restrict__ x4, int j0, int jend, rowmath::Max4& s) {
    for (int j = j0; j < jend; j += kGreedyLoads * kGreedyThreads) {
        float4 v[kGreedyLoads];
#pragma unroll
        for (int u = 0; u < kGreedyLoads; ++u) {
            const int jj = j + u * kGreedyThreads;
            v[u] = jj < jend ? __ldcs(x4 + jj) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < kGreedyLoads; ++u)
            if (j + u * kGreedyThreads < jend) rowmath::max4_take(s, v[u].x, v[u].y, v[u].z, v[u].w, j + u * kGreedyThreads);
    }
}

__device__ __forceinline__ void take1_range(const float4* __restrict__ x4, int lo, int j0, int jend, float& lmax,
                                            int& amax, int& bad) {
    for (int j = j0; j < jend; j += kGreedyThreads) {
        const float4 v = x4[j];
        take1(v.x, lo + 4 * j, lmax, amax, bad);
        take1(v.y, lo + 4 * j + 1, lmax, amax, bad);
        take1(v.z, lo + 4 * j + 2, lmax, amax, bad);
        take1(v.w, lo + 4 * j + 3, lmax, amax, bad);
    }
}

// verify_greedy's scan of [lo, hi) for x + lo 16-byte aligned, through rowmath::Max4: the float4s
// of [lo, mid), the early end's hint, those of [mid, hi), then the ids past the last float4 by
// take1. The hint needs a logit strictly above the draft's (or no valid draft): it beats the draft
// whatever the ids, and NaN never passes for one (the item's end makes the exact test). A thread
// that took a non-finite logit scans its float4s again with take1, which also sets `bad`.
__device__ __forceinline__ void greedy_scan4(const float* __restrict__ x, int lo, int mid, int hi, u64 draft_key,
                                             int* early, int a, float& lmax, int& amax, int& bad) {
    const float4* x4 = reinterpret_cast<const float4*>(x + lo);
    const int n4 = (hi - lo) >> 2, m4 = (mid - lo) >> 2, t = threadIdx.x;
    rowmath::Max4 s = rowmath::max4_start();
    max4_range(x4, t, m4, s);
    const float dv = draft_key ? key_value((u32)(draft_key >> 32)) : neg_inf();
    if (__any_sync(0xffffffffu, lo < mid && (draft_key == 0 || s.m > dv)) && (t & 31) == 0) atomicMin(early, a);
    max4_range(x4, m4 + t, n4, s);
    if (rowmath::max4_exact(s)) {
        rowmath::max4_end(s, lo, lmax, amax);
    } else {
        take1_range(x4, lo, t, m4, lmax, amax, bad);
        take1_range(x4, lo, m4 + t, n4, lmax, amax, bad);
    }
    for (int i = lo + 4 * n4 + t; i < hi; i += kGreedyThreads) take1(x[i], i, lmax, amax, bad);
}

// A greedy position g's argmax is reduced over its S blocks through best[g] (atomicMax of
// pair_key), and a block that saw NaN or +inf sets done[g] to 1. No block waits for a position to
// be decided: the launch's last block to leave (the exit count, queue[1]) decides every listed row
// from best and done at once (greedy_decide), so an item ends in fire-and-forget reductions.
// The row's early end (done[(n + 1) * rows + row], atomicMin) lets the positions after a rejection
// be passed over: a block whose chunk holds an id that beats the draft (or a non-finite value, or
// that is the bonus position's) knows at once that its position ends the row; it says so a quarter
// of the way through its chunk and again at the end. The early end only ever holds a position that
// ends the row, so it is never before the row's first ending position: every position up to that
// one is read whole, and the ones passed over come after it, where the decision does not look.
//
// A block takes its items from `queue` in order (w = i * S + s: slice s of the i-th (position,
// listed greedy row), position-major). Thread 0 claims the next item while the block reads the
// current one, and then examines it, passing over the ones it need not read: a position past the
// row's drafts, or after the row's early end; it then moves the queue to the next (position, row)
// with one atomicMax, so a dead position costs about one examination, not S.
// Thread 32 meanwhile ends the current item (the block's argmax into best[g]).
struct GreedyItem {
    int w;                                  // the item; >= the queue's total: none left
    int a, row, k;                          // position, row, the row's drafts
    long long dl;                           // the draft at a (-1: a == k, the bonus position)
};

constexpr int kGreedyRowCache = 256;        // listed rows a block keeps (id, drafts) of in shared memory
constexpr int kDecideRows = 256;            // listed rows greedy_decide takes at a time
constexpr int kDecideLoads = 2;             // positions a thread of greedy_decide loads at once

struct GreedyArgs {
    int* n_accepted;
    int* tokens;
    int* flags;
    u64* best;
    int* done;
    int* queue;                             // [0] the items taken, [1] the blocks that left
    const int* lists;
    const int* n_drafts;
    int rows, n, vocab, has_n_drafts, slices, total;
};

__device__ __forceinline__ int greedy_row(const GreedyArgs& p, const int* s_row, int li) {
    return li < kGreedyRowCache ? s_row[li] : p.lists[2 + p.rows + li];
}

__device__ __forceinline__ int greedy_drafts(const GreedyArgs& p, const int* s_k, int row, int li) {
    return li < kGreedyRowCache ? s_k[li] : rowmath::row_drafts(p.has_n_drafts, p.n_drafts, row, p.n);
}

// Claimed item w with what its examination reads (the row's early end and the draft at a), whose
// loads are in flight until greedy_next looks at them.
struct GreedyLook {
    int w, a, row, k, next;                 // next: the first slice of the next (position, row)
    int early;
    long long dl;
};

template <class D>
__device__ __forceinline__ GreedyLook greedy_look(const GreedyArgs& p, const D* __restrict__ drafts,
                                                  const int* s_row, const int* s_k, int w) {
    GreedyLook l{w, 0, 0, 0, 0, 0, -1};
    if (w >= p.total) return l;
    const int listed = p.lists[1];
    const int i = w / p.slices;
    l.a = i / listed;
    const int li = i - l.a * listed;
    l.row = greedy_row(p, s_row, li);
    l.k = greedy_drafts(p, s_k, l.row, li);
    l.next = (i + 1) * p.slices;
    if (l.a < l.k) l.dl = (long long)drafts[(long long)l.row * p.n + l.a];
    if (l.a <= l.k) l.early = __ldcg(p.done + (p.n + 1) * p.rows + l.row);
    return l;
}

// Thread 0: from claimed item l on, the first one the block must read, into *it (it->w >= total:
// none left).
template <class D>
__device__ __forceinline__ void greedy_next(const GreedyArgs& p, const D* __restrict__ drafts, const int* s_row,
                                            const int* s_k, GreedyLook l, GreedyItem* it) {
    for (;;) {
        if (l.w >= p.total) {
            it->w = p.total;
            return;
        }
        if (l.a <= l.k && l.early >= l.a) {
            *it = GreedyItem{l.w, l.a, l.row, l.k, l.dl};
            return;
        }
        atomicMax(p.queue, l.next);         // on to the next (position, row)'s first slice
        l = greedy_look<D>(p, drafts, s_row, s_k, atomicAdd(p.queue, 1));
    }
}

// The last block to leave: every listed row's result from best and done. A position ends the row
// when it is not finite or its draft is not its argmax (the bonus position always does); the row's
// first ending position is its n_accepted, with that position's flags, every token before it is
// its draft and after it the pad. kDecideLoads positions a thread are loaded before any is used.
template <class D>
__device__ __forceinline__ void greedy_decide(const GreedyArgs& p, const D* __restrict__ drafts, const int* s_row,
                                              const int* s_k) {
    __shared__ int s_end[kDecideRows];
    const int listed = p.lists[1], n1 = p.n + 1;
    for (int l0 = 0; l0 < listed; l0 += kDecideRows) {
        const int lr = min(kDecideRows, listed - l0), items = lr * n1;
        for (int t = threadIdx.x; t < lr; t += kGreedyThreads) s_end[t] = 0x7fffffff;
        __syncthreads();
        for (int e0 = threadIdx.x; e0 < items; e0 += kDecideLoads * kGreedyThreads) {
            u64 key[kDecideLoads];
            int bad[kDecideLoads];
            long long dl[kDecideLoads];
#pragma unroll
            for (int u = 0; u < kDecideLoads; ++u) {
                const int e = e0 + u * kGreedyThreads, a = e / lr, li = l0 + e - a * lr;
                key[u] = 0;
                bad[u] = 0;
                dl[u] = -1;
                if (e < items) {
                    const int row = greedy_row(p, s_row, li);
                    if (a <= greedy_drafts(p, s_k, row, li)) {
                        const int g = a * p.rows + row;
                        key[u] = __ldcg(p.best + g);
                        bad[u] = __ldcg(p.done + g);
                        if (a < greedy_drafts(p, s_k, row, li)) dl[u] = (long long)drafts[(long long)row * p.n + a];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < kDecideLoads; ++u) {
                const int e = e0 + u * kGreedyThreads, a = e / lr, li = l0 + e - a * lr;
                if (e >= items) break;
                const int row = greedy_row(p, s_row, li), k = greedy_drafts(p, s_k, row, li);
                if (a > k) continue;
                const float lmax = key[u] ? key_value((u32)(key[u] >> 32)) : neg_inf();
                const int amax = key[u] ? (int)(0xffffffffu - (u32)key[u]) : 0;
                const int is_bad = bad[u] | (lmax == neg_inf());
                int fl;
                const bool accept = rowmath::greedy_accepts(a < k, dl[u], p.vocab, amax, &fl);
                p.tokens[(long long)row * n1 + a] = accept && !is_bad ? (int)dl[u] : amax;
                if (is_bad || !accept) atomicMin(s_end + (li - l0), rowmath::stop_key(a, is_bad ? kNonFinite : fl));
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < items; e += kGreedyThreads) {   // the same thread as each token's write
            const int a = e / lr, li = l0 + e - a * lr;
            const int row = greedy_row(p, s_row, li), word = s_end[li - l0];
            if (a > rowmath::stop_at(word)) p.tokens[(long long)row * n1 + a] = kPad;
            if (a == 0) {
                p.n_accepted[row] = rowmath::stop_at(word);
                p.flags[row] = rowmath::stop_flags(word);
            }
        }
        __syncthreads();                    // s_end free again
    }
}

template <class D>
__device__ __forceinline__ void verify_greedy_body(
        int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,
        const float* __restrict__ logits, const D* __restrict__ drafts, const int* __restrict__ n_drafts,
        u64* __restrict__ best, int* __restrict__ done, int rows, int n, int vocab, int has_n_drafts, int slices,
        int per, int* __restrict__ queue, const int* __restrict__ lists) {
    pdl_wait();
    const GreedyArgs p{n_accepted, tokens, flags, best, done, queue, lists, n_drafts, rows, n, vocab,
                       has_n_drafts, slices, (n + 1) * lists[1] * slices};
    if (p.total == 0) return;
    __shared__ GreedyItem items[2];
    __shared__ int s_row[kGreedyRowCache], s_k[kGreedyRowCache];
    __shared__ float sv[kGreedyThreads / 32];
    __shared__ int si[kGreedyThreads / 32];
    __shared__ int last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cached = min(p.lists[1], kGreedyRowCache);
    for (int t = threadIdx.x; t < cached; t += kGreedyThreads) {
        const int row = p.lists[2 + p.rows + t];
        s_row[t] = row;
        s_k[t] = rowmath::row_drafts(p.has_n_drafts, p.n_drafts, row, p.n);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        greedy_next<D>(p, drafts, s_row, s_k, greedy_look<D>(p, drafts, s_row, s_k, atomicAdd(p.queue, 1)), &items[0]);
    __syncthreads();
    for (int b = 0;; b ^= 1) {
        const GreedyItem it = items[b];
        if (it.w >= p.total) break;
        int next = 0;
        if (threadIdx.x == 0) next = atomicAdd(p.queue, 1);
        const int s = it.w % p.slices;
        const float* x = logits + ((long long)it.row * (p.n + 1) + it.a) * p.vocab;
        const int lo = min(p.vocab, s * per), hi = min(p.vocab, lo + per);
        // pair_key of the draft; 0 (below every pair): no valid draft. Its load is in flight with
        // the first quarter's.
        const u64 draft_key = it.dl >= 0 && it.dl < p.vocab ? pair_key(__ldcg(x + it.dl), (int)it.dl) : 0;
        int* early = p.done + (p.n + 1) * p.rows + it.row;
        float lmax = neg_inf();
        int amax = 0x7fffffff, bad = 0;
        // the first quarter, then the early end if any of it beats the draft (or is not finite, or
        // there is no valid draft), then the rest: the hint goes out a quarter of the way in
        const int mid = min(hi, lo + (((hi - lo) / 4 + 3) & ~3));     // 16-byte steps stay aligned
        if ((((size_t)(x + lo)) & 15) == 0) {
            greedy_scan4(x, lo, mid, hi, draft_key, early, it.a, lmax, amax, bad);
        } else {
            scan_max<kGreedyThreads, kGreedyLoads>(x, lo, mid, nullptr, lmax, amax, bad);
            if (__any_sync(0xffffffffu, bad || (lo < mid && pair_key(lmax, amax) > draft_key)) && lane == 0)
                atomicMin(early, it.a);
            scan_max<kGreedyThreads, kGreedyLoads>(x, mid, hi, nullptr, lmax, amax, bad);
        }
        warp_best(lmax, amax);
        if (lane == 0) {
            sv[warp] = lmax;
            si[warp] = amax;
        }
        bad = __syncthreads_or(bad);
        if (threadIdx.x == 32) {            // this item's end: reductions nothing waits for
            for (int v = 0; v < kGreedyThreads / 32; ++v) take_better(lmax, amax, sv[v], si[v]);
            if (lo < hi) {
                const u64 key = pair_key(lmax, amax);
                atomicMax(p.best + it.a * p.rows + it.row, key);
                if (bad || key > draft_key) atomicMin(early, it.a);
            }
            if (bad) atomicOr(p.done + it.a * p.rows + it.row, 1);
        }
        if (threadIdx.x == 0) greedy_next<D>(p, drafts, s_row, s_k, greedy_look<D>(p, drafts, s_row, s_k, next), &items[b ^ 1]);
        __syncthreads();                    // the next item seen; sv, si and items[b] free again
    }
    // the last block to leave decides: every block's best and done before its exit count
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.queue + 1, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    greedy_decide<D>(p, drafts, s_row, s_k);
}

#define VERIFY_GREEDY_KERNEL(NAME, D)                                                                             \
    extern "C" __global__ void GREEDY_BOUNDS                                                                       \
    NAME(int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,                          \
         const float* __restrict__ logits, const D* __restrict__ drafts, const int* __restrict__ n_drafts,         \
         u64* __restrict__ best, int* __restrict__ done, int rows, int n, int vocab, int has_n_drafts, int slices,  \
         int per, int* __restrict__ queue, const int* __restrict__ lists) {                                         \
        verify_greedy_body<D>(n_accepted, tokens, flags, logits, drafts, n_drafts, best, done, rows, n, vocab,     \
                              has_n_drafts, slices, per, queue, lists);                                            \
    }

VERIFY_GREEDY_KERNEL(verify_greedy_i32, int)
VERIFY_GREEDY_KERNEL(verify_greedy_i64, long long)

#define VERIFY_KERNEL(NAME, D, C)                                                                                 \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, verify_blocks_per_sm<C>())     \
    NAME##_c##C(int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,                   \
                const float* __restrict__ logits, const D* __restrict__ drafts, const float* __restrict__ q,        \
                const int* __restrict__ n_drafts, const float* __restrict__ temperature,                           \
                const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,    \
                const u64* __restrict__ seed, const int* __restrict__ position, int rows, int n, int vocab,        \
                int has_q, int has_n_drafts, int cache, int* __restrict__ queue, const int* __restrict__ lists) {   \
        verify_body<C, D>(n_accepted, tokens, flags, logits, drafts, q, n_drafts, temperature, top_k, top_p,       \
                          min_p, seed, position, rows, n, vocab, has_q, has_n_drafts, cache, queue, lists);        \
    }

VERIFY_KERNEL(verify_i32, int, 1)
VERIFY_KERNEL(verify_i32, int, 2)
VERIFY_KERNEL(verify_i32, int, 4)
VERIFY_KERNEL(verify_i32, int, 8)
VERIFY_KERNEL(verify_i64, long long, 1)
VERIFY_KERNEL(verify_i64, long long, 2)
VERIFY_KERNEL(verify_i64, long long, 4)
VERIFY_KERNEL(verify_i64, long long, 8)
