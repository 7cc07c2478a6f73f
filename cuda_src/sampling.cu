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
#include "sampling_rows.cuh"          // the row machinery: reductions, radix select, steps 1-6
#include "sampling_topk.cuh"          // the short path for rows with a small top-k

// ---------------------------------------------------------------- kernels

template <int C>
__device__ __forceinline__ void argmax_body(int* __restrict__ out, const float* __restrict__ logits, int vocab) {
    pdl_wait();
    __shared__ float sv[kWarps];
    __shared__ int si[kWarps];
    __shared__ u64 slot;
    const int row = blockIdx.x / C;
    const float* x = logits + (long long)row * vocab;
    int lo, hi;
    chunk<C>(vocab, lo, hi);
    float v = neg_inf();
    int idx = 0x7fffffff;
    for_chunk(x, lo, hi, [&](int i, float l) { take_better(v, idx, l != l ? neg_inf() : l, i); });
    cluster_argmax<C>(v, idx, sv, si, &slot);
    if (threadIdx.x == 0 && blockIdx.x % C == 0) out[row] = idx;
}

template <int C>
__device__ __forceinline__ void sample_rows_body(
        int* __restrict__ tokens, int* __restrict__ flags, const float* __restrict__ logits,
        const float* __restrict__ temperature, const int* __restrict__ top_k, const float* __restrict__ top_p,
        const float* __restrict__ min_p, const u64* __restrict__ seed, const int* __restrict__ position, int vocab,
        int short_path) {
    pdl_wait();
    __shared__ SampleSmem sm;
    const int row = blockIdx.x / C;
    const bool leader = threadIdx.x == 0 && blockIdx.x % C == 0;
    const float* x = logits + (long long)row * vocab;
    int lo, hi;
    chunk<C>(vocab, lo, hi);
    const float t = temperature[row];
    const int k = top_k[row];
    const float tp = top_p[row], mp = min_p[row];      // loaded here, in the shadow of the first pass
    if (threadIdx.x == 0) {                 // kept in shared memory: the short path's draw is late
        sm.pub.seed = seed[row];
        sm.pub.position = (u32)position[row];
    }
    const bool short_k = short_path && t > 0.f && k > 0 && k < vocab && k <= kTopkFast;

    RowDist rd;
    float tmax;
    ThreadBest one;
    row_max_groups<C>(x, lo, hi, short_k ? topk_group_lanes<C>(k) : 0, sm, rd, &tmax, nullptr, nullptr, &one);   // 1.
    if (rd.bad || !(t > 0.f)) {             // the same decision in every block of the cluster
        if (leader) {
            tokens[row] = rd.amax;
            flags[row] = rd.bad;
        }
        if (C > 1) cluster_sync();          // the others may still read this block's TopkPub
        return;
    }
    if (short_k && topk_short_path<C>(x, lo, hi, k, t, tp, mp, tmax, one, rd, sm, tokens + row, flags + row))
        return;                                                                      // 2.-6. on a short list
    row_filter<C>(x, lo, hi, vocab, t, k, tp, mp, sm.slow, rd);                     // 2.-5.
    u64 run;                                // kept mass of the chunks before this block's
    const u64 kept = weight_sum<C>(x, lo, hi, rd, sm.slow, KeptE{}, &run);
    if (leader) flags[row] = 0;
    // the uniform is made here rather than before step 2, so that no register holds it over 2.-5.
    const u32 u24 = philox::bits24(sm.pub.seed, sm.pub.position, philox::kSample, 0u);
    draw<C>(x, lo, hi, rd, sm.slow, KeptE{}, run, draw_target(u24, kept), tokens + row);   // 6.
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
                     const u64* __restrict__ seed, const int* __restrict__ position, int vocab, int short_path) {  \
        sample_rows_body<C>(tokens, flags, logits, temperature, top_k, top_p, min_p, seed, position, vocab,        \
                            short_path);                                                                           \
    }

SAMPLING_KERNELS(1)
SAMPLING_KERNELS(2)
SAMPLING_KERNELS(4)
SAMPLING_KERNELS(8)
