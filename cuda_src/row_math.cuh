// row_math.cuh — the scalar decisions of a row's draw and of a speculative verification, on the
// integer weights of sampling_rows.cuh (E = round(e * 2^40) per kept id, K their sum, so that
// p(i) = E(i) / K), and the stop word that joins a row's positions when speculative.cu examines
// them in parallel. __host__ __device__ and free of headers: tests/test_speculative_emulation.py
// builds it for the host (g++) and replays the reference's rules with it on machines without a GPU.
#pragma once

#if defined(__CUDACC__)
#define ROW_HD __host__ __device__ __forceinline__
#else
#define ROW_HD inline
#endif

namespace rowmath {

typedef unsigned int u32;
typedef unsigned long long u64;

// The flag bits of a verification (ops/speculative.py, reference/speculative.py).
enum { kNonFinite = 1, kZeroQDraft = 2, kInvalidDraft = 4 };

// floor(u24 * total / 2^24), exact (a 24 x 64-bit product), < total for total > 0: the categorical
// draw picks the first id whose inclusive prefix sum of weights exceeds it.
ROW_HD u64 draw_target(u32 u24, u64 total) {
    const u64 u = u24;
#if defined(__CUDA_ARCH__)
    const u64 hi = __umul64hi(u, total);
#else
    const u64 hi = (u64)(((unsigned __int128)u * total) >> 64);
#endif
    return (hi << 40) | ((u * total) >> 24);
}

// The stochastic acceptance test u < p(d) / q(d) in float64, p(d) = e_d / kept, u = u24 * 2^-24.
// q(d) = 1 for a point-mass draft; q(d) <= 0 or NaN rejects (the caller flags q(d) = 0).
ROW_HD bool accepts(u32 u24, u64 e_d, u64 kept, double q_d) {
    if (!(q_d > 0.0)) return false;
    const double u = (double)u24 * 5.9604644775390625e-8;     // 2^-24, exact
    return u < ((double)e_d / (double)kept) / q_d;
}

// The residual max(0, p - q) of one id in the units of E: max(0, E - q * K), with q * K rounded
// down (float64, ~2^-53 relative) so that the weight is an integer and sums do not depend on
// their order. q NaN or <= 0 leaves E.
ROW_HD u64 residual_weight(u64 e, float q, u64 kept) {
    const double qk = (double)q * (double)kept;
    if (!(qk > 0.0)) return e;
    if (qk >= (double)e) return 0;
    return e - (u64)qk;                     // (u64)qk <= qk < e
}

// ---------------------------------------------------------------- the stop word of a verification
// speculative.cu examines a row's positions 0..k in parallel (one cluster each). A position that
// ends the walk (a rejection, a non-finite row, a greedy mismatch, or k itself: the bonus) writes
// its token to tokens[a] and folds key(a, flags) into the row's stop word with atomicMin, so the
// word ends as the first such position with that position's flags (flags < 8, a < 2^28); the
// positions before it all accepted. The word starts at none(k), above every key of 0..k, and a
// cluster at a position past stop_at(word) may skip its work: it cannot be the first.
ROW_HD int stop_key(int a, int flags) { return (a << 3) | flags; }
ROW_HD int stop_none(int k) { return (k + 1) << 3; }
ROW_HD int stop_at(int word) { return word >> 3; }
ROW_HD int stop_flags(int word) { return word & 7; }

// n_drafts as the kernel reads it: clamped to [0, n] (device inputs are not checked).
ROW_HD int clamp_drafts(int k, int n) { return k < 0 ? 0 : (k > n ? n : k); }

// ---------------------------------------------------------------- a row's max scan

ROW_HD float inf_f32() {
    union {
        u32 u;
        float f;
    } x{0x7f800000u};
    return x.f;
}

// (v, i) becomes the better of itself and (v2, i2): larger value, then lower id.
ROW_HD void take_better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// One logit l at id i into a scan's running max, lowest argmax and non-finite flag (NaN read as
// -inf; bad set by NaN or +inf).
ROW_HD void take1(float l, int i, float& lmax, int& amax, int& bad) {
    bad |= (l != l) | (l == inf_f32());
    take_better(lmax, amax, l != l ? -inf_f32() : l, i);
}

// A max scan over float4s that keeps, in place of the lowest argmax, the first float4 that held
// the running max and its index: a few branch-free instructions a logit where take1 takes ten.
// z stays 0 while every logit taken is finite (x * 0 is 0 for finite x, NaN for NaN and +-inf; a
// pair sum that overflows also makes it NaN), and then max4_end gives exactly the (lmax, amax) of
// take1 over the same ids in any order: the max, and the lowest id holding it. Otherwise the
// caller scans again with take1 (which also sets the non-finite flag).
struct Max4 {
    float m, v0, v1, v2, v3, z;
    int j;                                  // the float4 that first held m; -1: none taken
};

ROW_HD Max4 max4_start() {
    Max4 s;
    s.m = s.v0 = s.v1 = s.v2 = s.v3 = -inf_f32();
    s.z = 0.f;
    s.j = -1;
    return s;
}

ROW_HD float max_of(float a, float b) {
#if defined(__CUDA_ARCH__)
    return fmaxf(a, b);
#else
    return a > b ? a : b;                   // the same for the finite values max4_end relies on
#endif
}

// float4 j (ids i0 + 4j .. i0 + 4j + 3, taken in increasing j)
ROW_HD void max4_take(Max4& s, float a, float b, float c, float d, int j) {
    const float t = max_of(max_of(a, b), max_of(c, d));
    s.z += ((a + b) + (c + d)) * 0.f;
    const bool up = t > s.m;
    s.m = up ? t : s.m;
    s.j = up ? j : s.j;
    s.v0 = up ? a : s.v0;
    s.v1 = up ? b : s.v1;
    s.v2 = up ? c : s.v2;
    s.v3 = up ? d : s.v3;
}

ROW_HD bool max4_exact(const Max4& s) { return s.z == 0.f; }

// The scan's max and lowest argmax (float4 j at ids i0 + 4j) into (lmax, amax), when max4_exact.
ROW_HD void max4_end(const Max4& s, int i0, float& lmax, int& amax) {
    if (s.j < 0) return;
    const int lane = s.v0 == s.m ? 0 : s.v1 == s.m ? 1 : s.v2 == s.m ? 2 : 3;
    const float v = lane == 0 ? s.v0 : lane == 1 ? s.v1 : lane == 2 ? s.v2 : s.v3;
    take_better(lmax, amax, v, i0 + 4 * s.j + lane);
}

// Row r's drafts: n_drafts[r] clamped, or n when the launch has no n_drafts.
ROW_HD int row_drafts(int has_n_drafts, const int* n_drafts, int r, int n) {
    return has_n_drafts ? clamp_drafts(n_drafts[r], n) : n;
}

// A greedy position's decision: accepted iff it is drafted with a valid id equal to the argmax.
// Otherwise it ends the walk with the argmax; *flags gets kInvalidDraft for a drafted id outside
// [0, vocab) (a stochastic position uses the same flag and rejects it unread).
ROW_HD bool greedy_accepts(bool drafted, long long d, int vocab, int amax, int* flags) {
    const bool valid = d >= 0 && d < vocab;
    *flags = drafted && !valid ? kInvalidDraft : 0;
    return drafted && valid && (int)d == amax;
}

}  // namespace rowmath
