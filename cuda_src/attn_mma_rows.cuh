// attn_mma_rows.cuh — which positions a tensor-core attention block's rows see, for the kernels whose
// blocks take several tokens (attention_mma.cu, attention_wgmma.cu): the block's tokens in shared
// memory, a lane's two rows (g and g + 8 of its warp's 16; attention_mma_frag.cuh), the passes over
// the distinct sequences of a block's tokens, and the masking of a tile's scores.
#pragma once
#include "attn_mma_ptx.cuh"
#include "attn_split.cuh"

namespace amma {

constexpr int kTile = 64;                     // positions per K/V tile

// the block's tokens t0 .. t0 + ntb - 1: sequence and visible range [lo, hi)
// (attn::visible_range), by the threads `first`, `first + stride`, ... (all threads of the block by
// default); the caller synchronises
__device__ __forceinline__ void block_tokens(const int* __restrict__ tok_seq, const int* __restrict__ tok_pos,
                                             const int* __restrict__ seq_lens, bool masked, int window, int t0,
                                             int ntb, int* s_seq, int* s_lo, int* s_hi, int first = threadIdx.x,
                                             int stride = blockDim.x) {
    for (int i = first; i < ntb; i += stride) {
        const int sq = tok_seq[t0 + i], p = tok_pos[t0 + i];
        int lo, hi;
        attn::visible_range(seq_lens[sq], p, masked, window, lo, hi);
        s_seq[i] = sq;
        s_lo[i] = lo;
        s_hi[i] = hi;
    }
}

// the token (index in the block) of this lane's rows g and g + 8 of the warp whose first row is
// `row0`; -1 for padding rows (row r is token r / hpb, head r % hpb of the block's heads)
template <int M>
__device__ __forceinline__ void row_tokens(int row0, int lane, int hpb, int ntb, int nh, int (&rtok)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = row0 + (lane >> 2) + 8 * i;
        rtok[i] = r / hpb < ntb && r % hpb < nh ? r / hpb : -1;
    }
}

// Pass pi (one per distinct sequence, in first-token order): false when token pi's sequence had an
// earlier pass; else [LO, HI), the union of the visible ranges of its tokens in the block (0, 0 when
// none sees anything). Each call scans the block's tokens: for blocks of few tokens
// (attention_mma.cu); block_passes below finds every pass once.
__device__ __forceinline__ bool pass_range(int pi, int ntb, const int* s_seq, const int* s_lo, const int* s_hi,
                                           int& LO, int& HI) {
    const int seq = s_seq[pi];
    bool seen = false;
    for (int j = 0; j < pi; ++j) seen |= s_seq[j] == seq;
    if (seen) return false;
    LO = 0x7fffffff;
    HI = 0;
    for (int j = pi; j < ntb; ++j)
        if (s_seq[j] == seq && s_hi[j] > s_lo[j]) {
            LO = min(LO, s_lo[j]);
            HI = max(HI, s_hi[j]);
        }
    if (HI == 0) LO = 0;
    return true;
}

// The block's passes, found once by M threads in whole warps, token i's by the thread numbered i
// among them (threadIdx.x by default; after block_tokens' writes are visible; the caller
// synchronises before reading them): bit i of
// s_first[i / 32] set where token i opens a pass (pass_range true), and then s_plo[i], s_phi[i] the
// pass's range. pass_range, called for every token, scans the block's tokens again each time: the
// prefill kernel's blocks of 16 to 128 tokens spent ~3,000 cycles on those scans.
template <int M>
__device__ __forceinline__ void block_passes(int ntb, const int* s_seq, const int* s_lo, const int* s_hi,
                                             unsigned* s_first, int* s_plo, int* s_phi, int i = threadIdx.x) {
    static_assert(M % 32 == 0, "whole warps");
    if (i < 0 || i >= M) return;
    const bool first = i < ntb && pass_range(i, ntb, s_seq, s_lo, s_hi, s_plo[i], s_phi[i]);
    const unsigned opens = __ballot_sync(0xffffffffu, first);
    if ((i & 31) == 0) s_first[i >> 5] = opens;
}

// The first token at or after pi that opens a pass (block_passes' s_first), or ntb.
__device__ __forceinline__ int next_pass(int pi, int ntb, const unsigned* s_first) {
    for (; pi < ntb; pi = (pi | 31) + 1) {
        const unsigned b = s_first[pi >> 5] >> (pi & 31);
        if (b != 0u) return pi + __ffs(b) - 1;
    }
    return ntb;
}

// This lane's two rows in a pass: their visible range (empty for rows of another sequence), whether
// each is padding (never written out: its scores need no mask), and its row of the visibility mask.
struct RowRange {
    int lo[2], hi[2];
    bool pad[2];
    const unsigned char* vis[2];

    __device__ __forceinline__ void set(const int (&rtok)[2], int seq, const int* s_seq, const int* s_lo,
                                        const int* s_hi, const unsigned char* visible, int t0, int table_width) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const bool act = rtok[i] >= 0 && s_seq[rtok[i]] == seq;
            pad[i] = rtok[i] < 0;
            lo[i] = act ? s_lo[rtok[i]] : 0;
            hi[i] = act ? s_hi[rtok[i]] : 0;
            vis[i] = visible != nullptr && act ? visible + (long long)(t0 + rtok[i]) * table_width : nullptr;
        }
    }
    // some row of this lane sees a position of [pb, pb + n)
    __device__ __forceinline__ bool any(int pb, int n) const {
        return (pb < hi[0] && pb + n > lo[0]) || (pb < hi[1] && pb + n > lo[1]);
    }
    // warp-wide: no position of [pb, pb + n) is hidden from any row of the warp (never with a mask)
    __device__ __forceinline__ bool all(int pb, int n, bool masked) const {
        bool full = !masked;
#pragma unroll
        for (int i = 0; i < 2; ++i) full &= pad[i] || (pb >= lo[i] && pb + n <= hi[i]);
        return __all_sync(kAll, full);
    }
    // hidden scores of a tile (n-tiles of 8 positions from pb) to -inf: range (causal, window), visible
    template <int NT>
    __device__ __forceinline__ void mask(float (&s)[NT][4], int pb, int lane) const {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int i = c >> 1, p = pb + 8 * n + c_col(lane, c);
                bool v = p >= lo[i] && p < hi[i];
                if (v && vis[i] != nullptr) v = vis[i][p] != 0;
                s[n][c] = v ? s[n][c] : neg_inf();
            }
    }
};

}  // namespace amma
