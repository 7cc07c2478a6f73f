// speculative.cu — verification of a drafted block per row (rules: glimmer_cupy/reference/
// speculative.py), on the row machinery of sampling.cu (sampling_rows.cuh) and the scalar rules of
// row_math.cuh, so that every p here is the distribution sample_rows draws from.
//
// verify_<D>_c<C>   D = i32 | i64 (the drafts' dtype), C blocks per row (a thread block cluster, as
//                   in sampling.cu; only C = 1 is instantiated, see the end).  grid=(rows * C,) block=(kThreads,)
//
// One cluster walks its row's positions a = 0, 1, ... in order and stops at the first one that
// does not accept, so positions after a rejection are never read. Position a reads logits row
// (row, a) once for max/argmax/non-finite (step 1 of sampling.cu); a greedy row compares the draft
// with the argmax and goes on. A stochastic row runs steps 2-5 (top-k, top-p, min-p; lists when
// top-k is on) and K = sum of kept E, then reads E(d) and q(d) (one float each) and accepts iff
// u < (E(d) / K) / q(d) in float64 (u = uniform(seed, pos + a, ACCEPT)). At the end:
//   - a non-finite row: its argmax, flag 1;
//   - greedy: the argmax;
//   - all k drafts accepted: the bonus, step 6 over E with uniform(seed, pos + k, SAMPLE): exactly
//     sample_rows' draw for that row;
//   - a rejected point-mass draft: step 6 over E without d (its weight K - E(d); before this
//     block's chunk, `before` less E(d) if d lies there), p itself if that is empty;
//   - a rejected draft with q: one more pass over the kept ids (their list when it holds them)
//     summing W = max(0, E - floor(q K)) (row_math.cuh), then step 6 over W; p if W sums to 0.
// All sums are integers, so the result does not depend on C, on the batch, or on graph replay.
// Every decision is made from cluster-uniform values, so all blocks take the same branches.
//
// Device inputs are not checked (ops/speculative.py checks host inputs): a draft outside
// [0, vocab) is rejected without being read (flag 4, INVALID_DRAFT; the correction is then drawn
// from p, or from max(0, p - q)), n_drafts is clamped to [0, n], and q entries that are negative or
// NaN act as 0 in the test and in the residual. Every written token is still a valid id.
#include "sampling_rows.cuh"

constexpr int kNonFinite = 1, kZeroQDraft = 2, kInvalidDraft = 4;
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

template <int C, class D>
__device__ __forceinline__ void verify_body(
        int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,
        const float* __restrict__ logits, const D* __restrict__ drafts, const float* __restrict__ q,
        const int* __restrict__ n_drafts, const float* __restrict__ temperature, const int* __restrict__ top_k,
        const float* __restrict__ top_p, const float* __restrict__ min_p, const u64* __restrict__ seed,
        const int* __restrict__ position, int n, int vocab, int has_q, int has_n_drafts) {
    __shared__ Smem sm;
    const int row = blockIdx.x / C;
    const bool leader = threadIdx.x == 0 && blockIdx.x % C == 0;
    int lo, hi;
    chunk<C>(vocab, lo, hi);
    const float t = temperature[row];
    const int k = has_n_drafts ? min(max(n_drafts[row], 0), n) : n;
    int* out = tokens + (long long)row * (n + 1);
    RowDist rd;
    // How the last position ends, in shared memory (written by thread 0, read after a barrier):
    // registers are short across the radix selects, and this is live only from the decision on
    __shared__ struct {
        EndWeights wf;
        u64 run, total;                     // the draw's weight before this block's chunk, and in all
        u32 u24;
        int drawn;                          // the last position ends with a draw (else its argmax)
        int flag;                           // the row's flags so far
        int a;                              // the position examined
    } end;
    if (threadIdx.x == 0) {
        end.drawn = 0;
        end.flag = 0;
        end.a = 0;
    }
    for (;;) {
        __syncthreads();                    // end.a is written
        const int a = end.a;
        const float* x = logits + ((long long)row * (n + 1) + a) * vocab;
        row_max<C>(x, lo, hi, sm, rd);
        if (rd.bad) {
            if (threadIdx.x == 0) end.flag |= kNonFinite;
            break;
        }
        if (!(t > 0.f)) {                   // greedy: the draft must be the argmax
            const bool drafted = a < k;
            const long long dl = drafted ? (long long)drafts[(long long)row * n + a] : -1;
            const bool valid = dl >= 0 && dl < vocab;
            const int d = valid ? (int)dl : -1;
            if (drafted && !valid && threadIdx.x == 0) end.flag |= kInvalidDraft;
            if (drafted && d == rd.amax) {
                if (leader) out[a] = d;
                __syncthreads();            // every thread has read end.a
                if (threadIdx.x == 0) end.a = a + 1;
                continue;
            }
            break;
        }
        row_filter<C>(x, lo, hi, vocab, t, top_k[row], top_p[row], min_p[row], sm, rd);
        u64 before;
        const u64 kept = weight_sum<C>(x, lo, hi, rd, sm, KeptE{}, &before);
        const u32 pa = (u32)position[row] + (u32)a;
        const bool drafted = a < k;
        const long long dl = drafted ? (long long)drafts[(long long)row * n + a] : -1;
        const bool valid = dl >= 0 && dl < vocab;
        const int d = valid ? (int)dl : -1;
        if (drafted && !valid && threadIdx.x == 0) end.flag |= kInvalidDraft;
        if (!drafted) {                     // every draft accepted: the bonus, as sample_rows draws it
            if (threadIdx.x == 0) {
                end.wf = EndWeights{EndWeights::kP, -1, nullptr, kept};
                end.run = before;
                end.total = kept;
                end.u24 = philox::bits24(seed[row], pa, philox::kSample, 0u);
                end.drawn = 1;
            }
            break;
        }
        const float* qa = q + ((long long)row * n + a) * vocab;
        const u64 e_d = valid ? kept_weight(rd, x, d, KeptE{}) : 0;
        const double q_d = !has_q ? 1.0 : valid ? (double)qa[d] : 0.0;
        if (valid && rowmath::accepts(philox::bits24(seed[row], pa, philox::kAccept, 0u), e_d, kept, q_d)) {
            if (leader) out[a] = d;
            if (threadIdx.x == 0) end.a = a + 1;     // the barriers of weight_sum came after every read
            continue;
        }
        if (has_q && valid && q_d == 0.0 && threadIdx.x == 0) end.flag |= kZeroQDraft;
        EndWeights wf{EndWeights::kP, -1, nullptr, kept};
        u64 run = before, total = kept;
        if (!has_q) {                       // excluded-token correction; p itself if only d was kept
            if (kept - e_d) {
                wf = EndWeights{EndWeights::kExclude, d, nullptr, kept};
                run = before - (valid && d < lo ? e_d : 0);
                total = kept - e_d;
            }
        } else {                            // residual correction; p itself if max(0, p - q) = 0
            const EndWeights res{EndWeights::kResidual, d, qa, kept};
            u64 rrun;
            const u64 w = weight_sum<C>(x, lo, hi, rd, sm, res, &rrun);
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
        }
        break;
    }
    __syncthreads();
    const int a = end.a;
    const float* x = logits + ((long long)row * (n + 1) + a) * vocab;
    if (end.drawn) draw<C>(x, lo, hi, rd, sm, end.wf, end.run, draw_target(end.u24, end.total), out + a);
    else if (leader) out[a] = rd.amax;      // a non-finite row, or a greedy row's end
    if (leader) {
        n_accepted[row] = a;
        flags[row] = end.flag;
        for (int j = a + 1; j <= n; ++j) out[j] = kPad;
    }
}

#define VERIFY_KERNEL(NAME, D, C)                                                                                 \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(kThreads, 1)                            \
    NAME##_c##C(int* __restrict__ n_accepted, int* __restrict__ tokens, int* __restrict__ flags,                   \
                const float* __restrict__ logits, const D* __restrict__ drafts, const float* __restrict__ q,        \
                const int* __restrict__ n_drafts, const float* __restrict__ temperature,                           \
                const int* __restrict__ top_k, const float* __restrict__ top_p, const float* __restrict__ min_p,    \
                const u64* __restrict__ seed, const int* __restrict__ position, int n, int vocab, int has_q,       \
                int has_n_drafts) {                                                                                \
        verify_body<C, D>(n_accepted, tokens, flags, logits, drafts, q, n_drafts, temperature, top_k, top_p,       \
                          min_p, seed, position, n, vocab, has_q, has_n_drafts);                                   \
    }

// C = 1 only for now: C = 2, 4, 8 compile but spill 20-48 bytes around the radix selects at the
// 64 registers a 1024-thread block allows (the loop's state lives across them); one line each to add.
VERIFY_KERNEL(verify_i32, int, 1)
VERIFY_KERNEL(verify_i64, long long, 1)
