// kq_lanes.cuh — a k-quant super-block as eight lanes' shares of an int8 dot product.
//
// gemv_kq.cu gives each 256-value super-block of a weight row to eight consecutive lanes; lane
// `part` (0..7) owns 32 of its values, and walks a row 4 * WS super-blocks at a time. Lanes<QT>
// says, for Q4_K and Q6_K:
//   Row, row(w, sb, part)    where the lane stands in the row that starts at w: at super-block sb
//   next(row, n)             n super-blocks on (a multiple of 4)
//   Regs, load(row, sb, part, r, on)  the lane's raw bytes of super-block sb (where row stands), in
//                            the widest loads the layout allows; nothing is loaded when !on
//   settle(row, part, r)     what the lane does with them once they have landed, before the
//                            arithmetic (row still at that super-block)
//   X, load_x(..., sb, part) the int8 codes (ops/q8.py: xq, xd = max|x|/127, xs = xd * sum) of the
//                            x values those 32 weights multiply
//   accumulate(acc, r, x, part)  acc + the lane's share of sum_i w_i * x_i in float, times 1 / kScale;
//                            the eight shares of a super-block add up to its whole dot product
// Q4_K: lane part holds bytes 16*part.. of qs: the low nibbles are values 16*(part&1).. of
//   sub-block 2*(part>>1), the high nibbles the same values of the next sub-block. One 16-byte
//   load for them and one for the header (d, dmin, 12 scale bytes); blocks are 144 = 9*16 bytes.
// Q6_K: lane part (half h = part>>2, l0 = 8*(part&3)) holds l = l0..l0+7 of ggml's loop: ql[l],
//   ql[l+32], qh[l] of its half, i.e. values l, l+32, l+64, l+96 of the half, each group of 8
//   within one 16-value scale. Blocks are 210 bytes, so a block starts 2-byte aligned; its three
//   8-byte pieces share one misalignment o = address & 7, which is the same for every block a lane
//   visits (4 blocks are 840 = 105 * 8 bytes), and are read as aligned 16-byte windows (two
//   8-byte loads) and shifted into place by settle(). The weights go to dp4a as 4 * (q - 32), one
//   signed byte each, built from the bits with no subtraction (codes()); each group's integer dot
//   product times its int8 scale is exact in int and in float, so a lane converts one integer per
//   group and multiplies by d once per super-block.
// Q6_KP: Q6_K in pair order (quant_blocks.cuh), so that each piece a lane reads is aligned to its
//   size: one 16-, one 8-, one 4- and one 2-byte load a super-block where the GGUF layout takes six
//   8-byte window loads, four byte loads and a 2-byte load. The arithmetic is Lanes<Q6_K>'s, so the
//   same bits.
// Everything is __host__ __device__ with host stand-ins for the intrinsics, so the CPU tests run
// this code against gguf's dequantizer (tests/test_gemv_kq_lanes.py).
#pragma once
#include "quant_blocks.cuh"

namespace gguf {

struct alignas(16) u32x4 { u32 x, y, z, w; };
struct alignas(8) u32x2 { u32 x, y; };
struct alignas(16) f32x4 { float x, y, z, w; };
struct alignas(8) f32x2 { float x, y; };

// a V (one of the above) from memory aligned to sizeof(V): one vector load on the device
template <class V>
GQ_HD V load_vec(const void* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const V*>(p);
#else
    V v;
    for (unsigned i = 0; i < sizeof(V); ++i) reinterpret_cast<u8*>(&v)[i] = reinterpret_cast<const u8*>(p)[i];
    return v;
#endif
}
GQ_HD u32x4 load16(const u8* p) { return load_vec<u32x4>(p); }
GQ_HD u32x2 load8(const u8* p) { return load_vec<u32x2>(p); }

// The weights' loads (the global* loads below, and Lanes<Q4_K>::load through wload16).
// GEMV_WEIGHTS_L2_256B adds the prefetch-size hint .L2::256B (L2 fetches the 256-byte segment around
// each piece from DRAM in one request). gemv_kq.cu's module is built with it (ops/matmul.py:
// KQ_DEFINES, where its measurement is; bench/ab_gemv_kq_model.py's arm "l2 none" builds it
// without); the other modules that include this file are built without it.
#ifdef GEMV_WEIGHTS_L2_256B
#define KQ_W_HINT ".L2::256B"
#else
#define KQ_W_HINT ""
#endif

GQ_HD float fma_rn(float a, float b, float c) {     // a * b + c, rounded once
#ifdef __CUDA_ARCH__
    return fmaf(a, b, c);
#else
    return __builtin_fmaf(a, b, c);
#endif
}

// Global loads through a pointer the compiler cannot trace to a kernel argument (opaque() below),
// which would otherwise be generic ones, skipped when `on` is false (the result is then
// unspecified). A predicate rather than a branch: ptxas may move a branch's block of loads past
// the arithmetic that follows it, and then they have no time to land. 16, 8 or 4 bytes (aligned
// to their size), a signed byte, 16 bits (2-byte aligned).
GQ_HD u32x2 global8(const u8* p, bool on) {
#ifdef __CUDA_ARCH__
    u32x2 v;
    asm("{ .reg .pred q; setp.ne.u32 q, %3, 0; @q ld.global" KQ_W_HINT ".v2.u32 {%0, %1}, [%2]; }"
        : "=r"(v.x), "=r"(v.y) : "l"(p), "r"((int)on));
    return v;
#else
    return on ? load8(p) : u32x2{0, 0};
#endif
}
GQ_HD u32x4 global16(const u8* p, bool on) {    // 16-byte aligned
#ifdef __CUDA_ARCH__
    u32x4 v;
    asm("{ .reg .pred q; setp.ne.u32 q, %5, 0; @q ld.global" KQ_W_HINT ".v4.u32 {%0, %1, %2, %3}, [%4]; }"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"((int)on));
    return v;
#else
    return on ? load16(p) : u32x4{0, 0, 0, 0};
#endif
}
// Lanes<Q4_K>'s 16-byte weight loads: a plain vector load by default (the compiler's own), global16
// with the hint under GEMV_WEIGHTS_L2_256B
GQ_HD u32x4 wload16(const u8* p) {
#ifdef GEMV_WEIGHTS_L2_256B
    return global16(p, true);
#else
    return load16(p);
#endif
}
GQ_HD u32 global32(const u8* p, bool on) {       // 4-byte aligned
#ifdef __CUDA_ARCH__
    u32 v;
    asm("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q ld.global" KQ_W_HINT ".u32 %0, [%1]; }" : "=r"(v) : "l"(p), "r"((int)on));
    return v;
#else
    return on ? load_vec<u32>(p) : 0;
#endif
}
GQ_HD int global_s8(const u8* p, bool on) {
#ifdef __CUDA_ARCH__
    int v;
    asm("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q ld.global" KQ_W_HINT ".s8 %0, [%1]; }" : "=r"(v) : "l"(p), "r"((int)on));
    return v;
#else
    return on ? *reinterpret_cast<const i8*>(p) : 0;
#endif
}
GQ_HD u16 global_u16(const u8* p, bool on) {      // 2-byte aligned
#ifdef __CUDA_ARCH__
    u16 v;
    asm("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q ld.global" KQ_W_HINT ".u16 %0, [%1]; }" : "=h"(v) : "l"(p), "r"((int)on));
    return v;
#else
    return on ? *reinterpret_cast<const u16*>(p) : 0;
#endif
}

GQ_HD int dp4a(u32 a, u32 b, int c) {    // c + dot of the four signed bytes of a and b
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; ++i) c += (int)(i8)(a >> (8 * i)) * (int)(i8)(b >> (8 * i));
    return c;
#endif
}

GQ_HD u32 shift_right64(u32 lo, u32 hi, int bits) {   // low word of (hi:lo) >> bits, bits < 32
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, bits);
#else
    return bits ? (lo >> bits) | (hi << (32 - bits)) : lo;
#endif
}

// (v & kMask) ^ kFlip in one lop3 (the compiler splits it when a mask is shared)
template <u32 kMask, u32 kFlip>
GQ_HD u32 mask_flip(u32 v) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(r) : "r"(v), "n"(kMask), "n"(kFlip));   // (a & b) ^ c
    return r;
#else
    return (v & kMask) ^ kFlip;
#endif
}

// mask's bits from a, the others from b: one lop3, which the compiler does not always find itself
GQ_HD u32 bitselect(u32 a, u32 b, u32 mask) {
#ifdef __CUDA_ARCH__
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "r"(mask));   // (a & c) | (b & ~c)
    return r;
#else
    return (a & mask) | (b & ~mask);
#endif
}

// Four Q6_K weights as signed bytes 4 * (q - 32), q the 6-bit code of each: the nibble of ql (the
// low one for s < 2, else the high one) under field s (bits 2s, 2s + 1) of the same byte of qh.
// 4q is the nibble in bits 2-5 under the qh field in bits 6-7, and subtracting 128 flips bit 7, so
// the top bit of the field is flipped first, with the fields of the other parity cleared (h02:
// fields 0 and 2 of each byte kept, h13: fields 1 and 3). The word is then one bit-select of a
// shifted ql word (bits 2-5) and the shifted qh word (bits 0-1, 6-7): what the qh shift carries into
// a byte's bits 0-1 is a field the mask cleared, and what either shift carries into bits 2-5 is not
// selected. The four s of one qh word share its two masked copies: 3.5 instructions a word.
GQ_HD u32 q6_weights(u32 ql, u32 qh, int s) {
    const u32 hm = (s & 1) ? mask_flip<0xCCCCCCCCu, 0x88888888u>(qh) : mask_flip<0x33333333u, 0x22222222u>(qh);
    return bitselect((s >> 1) ? ql >> 2 : ql << 2, hm << (6 - 2 * s), 0x3C3C3C3Cu);
}

// v, with its derivation hidden from the compiler: a value fixed before a loop stays in a register
// instead of being recomputed from its inputs on every trip
GQ_HD int opaque(int v) {
#ifdef __CUDA_ARCH__
    asm("" : "+r"(v));
#endif
    return v;
}
GQ_HD const u8* opaque(const u8* p) {
#ifdef __CUDA_ARCH__
    asm("" : "+l"(p));
#endif
    return p;
}

// The 6-bit scales and mins of Q4_K sub-blocks 0..3 (j < 4) or 4..7, one per byte of sc and mn,
// from the block's 16-byte header (d, dmin, 12 scale bytes); ggml's get_scale_min_k4 on words.
struct Q4KScales { u32 sc, mn; };
GQ_HD Q4KScales q4k_scale_words(const u32x4& hd, int j) {
    return j < 4 ? Q4KScales{hd.y & 0x3F3F3F3Fu, hd.z & 0x3F3F3F3Fu}
                 : Q4KScales{(hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u),
                             ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u)};
}

template <class QT> struct Lanes;

template <> struct Lanes<Q4_K> {
    static constexpr int kBytes = 144;
    struct Row { const u8* w; };                   // the row's start: a block is found from sb
    struct Regs { u32x4 hd, qs; };
    struct X { u32x4 a, b; float da, db, sa, sb; };
    static constexpr float kScale = 1.f;

    GQ_HD static Row row(const u8* w, int, int) { return Row{w}; }
    GQ_HD static void next(Row&, int) {}
    GQ_HD static void settle(const Row&, int, Regs&) {}
    GQ_HD static void load(const Row& row, int sb, int part, Regs& r, bool on = true) {
        if (on) {
            const u8* b = row.w + sb * kBytes;
            r.hd = wload16(b);
            r.qs = wload16(b + 16 + 16 * part);
        }
    }
    GQ_HD static void load_x(const int* xq, const float* xd, const float* xs, int sb, int part, X& x) {
        const int c = part >> 1, h = part & 1;
        const u8* q = reinterpret_cast<const u8*>(xq) + sb * 256 + 64 * c + 16 * h;
        x.a = load16(q);
        x.b = load16(q + 32);
        const int i = sb * 8 + 2 * c;             // even: the pairs are 8-byte aligned
        const f32x2 d = load_vec<f32x2>(xd + i), s = load_vec<f32x2>(xs + i);
        x.da = d.x; x.db = d.y;
        x.sa = s.x; x.sb = s.y;
    }
    GQ_HD static float dot(const Regs& r, const X& x, int part) {
        const u32 q[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
        const u32 xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo = dp4a(q[i] & 0x0F0F0F0Fu, xa[i], lo);
            hi = dp4a((q[i] >> 4) & 0x0F0F0F0Fu, xb[i], hi);
        }
        const int c = part >> 1;
        const Q4KScales w = q4k_scale_words(r.hd, 2 * c);
        const u32 sc = w.sc, mn = w.mn;
        const int sh = 16 * (c & 1);
        const float d = half_to_float((u16)(r.hd.x & 0xFFFF));
        float acc = x.da * (d * (float)((sc >> sh) & 0xFF)) * (float)lo
                  + x.db * (d * (float)((sc >> (sh + 8)) & 0xFF)) * (float)hi;
        if ((part & 1) == 0) {                        // one lane of the pair subtracts the mins
            const float dmin = half_to_float((u16)(r.hd.x >> 16));
            acc -= dmin * ((float)((mn >> sh) & 0xFF) * x.sa + (float)((mn >> (sh + 8)) & 0xFF) * x.sb);
        }
        return acc;
    }
    GQ_HD static float accumulate(float acc, const Regs& r, const X& x, int part) { return acc + dot(r, x, part); }
};

template <> struct Lanes<Q6_K> {
    static constexpr int kBytes = 210;
    // the lane's block b (2-byte aligned) and its misalignment o = address & 7
    struct Row { const u8* b; int o; };
    // win[j]: the aligned 16 bytes holding piece j (ql[l0..], ql[l0+32..], qh[l0..] of the half),
    // after settle() the piece itself in win[j][0]; sc[t]: the int8 scale of group t, d the fp16 d
    struct Regs { u32x2 win[3][2]; int sc[4]; u16 d; int o; };
    // q[t]: the codes of x that meet group t (values 32t + l0.. of the half), d[t] their step
    struct X { u32x2 q[4]; float d[4]; };
    static constexpr float kScale = 0.25f;        // accumulate() adds 4 times the lane's share

    GQ_HD static Row row(const u8* w, int sb, int) {
        const u8* b = w + sb * kBytes;
        return Row{b, opaque((int)(reinterpret_cast<unsigned long long>(b) & 7))};
    }
    GQ_HD static void next(Row& r, int n) { r.b = opaque(r.b + n * kBytes); }
    GQ_HD static void load(const Row& row, int, int part, Regs& r, bool on = true) {
        // the windows' offsets from the block's 8-byte aligned start
        const int h = part >> 2, l0 = 8 * (part & 3);
        const int ql = opaque(64 * h + l0), qh = opaque(128 + 32 * h + l0);
        const u8* a = reinterpret_cast<const u8*>(reinterpret_cast<unsigned long long>(row.b) & ~7ull);
        const u8* const p[3] = {a + ql, a + ql + 32, a + qh};
#pragma unroll
        for (int j = 0; j < 3; ++j) {           // both halves lie within the block (qh ends at byte 192)
            r.win[j][0] = global8(p[j], on);
            r.win[j][1] = global8(p[j] + 8, on);
        }
        r.o = row.o;
    }
    // the 8 bytes at offset o of a 16-byte window
    GQ_HD static u32x2 piece(const u32x2 (&w)[2], int o) {
        const int bits = 8 * (o & 3);
        const u32 w0 = o >= 4 ? w[0].y : w[0].x, w1 = o >= 4 ? w[1].x : w[0].y, w2 = o >= 4 ? w[1].y : w[1].x;
        return {shift_right64(w0, w1, bits), shift_right64(w1, w2, bits)};
    }
    // The pieces shifted into place, their windows let go; and the scales and d, loaded now rather
    // than with the windows: their bytes follow qh in lines the windows have just brought in, and
    // loaded a super-block ahead they would take four more registers and be copied every trip
    GQ_HD static void settle(const Row& row, int part, Regs& r) {
#pragma unroll
        for (int j = 0; j < 3; ++j) r.win[j][0] = piece(r.win[j], r.o);
        const int sc = opaque(192 + 8 * (part >> 2) + ((part & 3) >> 1));   // scales[8h + is + 2t]
#pragma unroll
        for (int t = 0; t < 4; ++t) r.sc[t] = global_s8(row.b + sc + 2 * t, true);
        r.d = global_u16(row.b + 208, true);
    }
    GQ_HD static void load_x(const int* xq, const float* xd, const float*, int sb, int part, X& x) {
        const int h = part >> 2, l0 = 8 * (part & 3);
        const u8* q = reinterpret_cast<const u8*>(xq) + sb * 256 + 128 * h + l0;
#pragma unroll
        for (int t = 0; t < 4; ++t) x.q[t] = load8(q + 32 * t);
        const f32x4 d = load_vec<f32x4>(xd + sb * 8 + 4 * h);   // 16-byte aligned: K/32 is a multiple of 8
        x.d[0] = d.x; x.d[1] = d.y; x.d[2] = d.z; x.d[3] = d.w;
    }
    // The weights of group t (q[t]), four values in a word (q6_weights): 4 * (q - 32) for the
    // 6-bit code q (ql nibble t / 2 below qh bits 2t, 2t+1), which dp4a takes as it is. 13
    // instructions per pair of words against 16 for the codes 0..63 and a subtraction of 32 * x
    // sums (8 dp4a per x row and super-block, 4 registers per x row).
    GQ_HD static void codes(u32 la, u32 lb, u32 h, u32 (&q)[4]) {
        q[0] = q6_weights(la, h, 0);
        q[1] = q6_weights(lb, h, 1);
        q[2] = q6_weights(la, h, 2);
        q[3] = q6_weights(lb, h, 3);
    }
    // acc + 4 * d * sum_t xd_t * (sc_t * s_t), s_t the integer dot of group t's weights with x.
    // Exact in int and as a float: |s_t| <= 8 * 128 * 127, |sc_t * s_t| <= 128 * 130048 < 2^24.
    // qa, qb, qh: the lane's pieces of ql (groups 0/2), ql (groups 1/3) and qh; sc[t] group t's scale
    GQ_HD static float dot(float acc, u32x2 qa, u32x2 qb, u32x2 qh, const int (&sc)[4], u16 d, const X& x) {
        u32 q0[4], q1[4];
        codes(qa.x, qb.x, qh.x, q0);
        codes(qa.y, qb.y, qh.y, q1);
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int s = dp4a(q1[t], x.q[t].y, dp4a(q0[t], x.q[t].x, 0));
            sum += x.d[t] * (float)(sc[t] * s);
        }
        return acc + half_to_float(d) * sum;
    }
    GQ_HD static float accumulate(float acc, const Regs& r, const X& x, int) {
        return dot(acc, r.win[0][0], r.win[1][0], r.win[2][0], r.sc, r.d, x);
    }
    // The lane's 32 weights as floats, (d sc_t) (q - 32) as the block trait computes them, so the
    // same bits: w[t][i] is value 32 t + l0 + i of the lane's half (quant_matmul.cu's
    // dequant_lanes_kernel stores them)
    GQ_HD static void weights(u32x2 qa, u32x2 qb, u32x2 qh, const int (&sc)[4], u16 d, float (&w)[4][8]) {
        u32 q0[4], q1[4];
        codes(qa.x, qb.x, qh.x, q0);
        codes(qa.y, qb.y, qh.y, q1);
        const float dd = half_to_float(d);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const float dl = dd * (float)sc[t];
#pragma unroll
            for (int i = 0; i < 4; ++i) {            // a code byte is 4 (q - 32): q - 32 exactly
                w[t][i] = dl * (float)((int)(i8)((q0[t] >> (8 * i)) & 0xFFu) >> 2);
                w[t][4 + i] = dl * (float)((int)(i8)((q1[t] >> (8 * i)) & 0xFFu) >> 2);
            }
        }
    }
    GQ_HD static void weights(const Regs& r, float (&w)[4][8]) {
        weights(r.win[0][0], r.win[1][0], r.win[2][0], r.sc, r.d, w);
    }
};

// Q6_K in pair order (quant_blocks.cuh, weights/q6k_pairs.py): lane part's ql pieces are 16 aligned
// bytes of its pair, its qh piece 8, its four scales one small word, d a half of another.
template <> struct Lanes<Q6_KP> {
    typedef Lanes<Q6_K> Q6;
    struct Row { const u8* w; };
    struct Regs { u32x4 ql; u32x2 qh; u32 sc; u16 d; };
    typedef Q6::X X;
    static constexpr float kScale = Q6::kScale;

    GQ_HD static Row row(const u8* w, int, int) { return Row{w}; }
    GQ_HD static void next(Row&, int) {}
    GQ_HD static void load(const Row& row, int sb, int part, Regs& r, bool on = true) {
        // each address from the row's start anew (opaque): hoisted, the pieces' pointers of R rows
        // would take 8 R registers
        const int s = opaque(sb), j = s & 1, h = part >> 2, is = (part & 3) >> 1;
        const u8* pair = opaque(row.w) + 420 * (s >> 1);
        const int a = q6p_prefix(pair);
        r.ql = global16(q6p_ql(pair, a, j) + 16 * part, on);
        r.qh = global8(q6p_qh(pair, a, j) + 8 * part, on);
        r.sc = global32(q6p_word(pair, a, 4 * j + 2 * h + is), on);
        r.d = global_u16(q6p_word(pair, a, 8) + 2 * j, on);
    }
    GQ_HD static void settle(const Row&, int, Regs&) {}
    GQ_HD static void load_x(const int* xq, const float* xd, const float* xs, int sb, int part, X& x) {
        Q6::load_x(xq, xd, xs, sb, part, x);
    }
    // the lane's four int8 scales, one a byte of its small word
    struct Scales { int v[4]; };
    GQ_HD static Scales scales(u32 w) {
        return Scales{{(int)(i8)(w & 0xFF), (int)(i8)((w >> 8) & 0xFF), (int)(i8)((w >> 16) & 0xFF), (int)(i8)(w >> 24)}};
    }
    GQ_HD static float accumulate(float acc, const Regs& r, const X& x, int) {
        return Q6::dot(acc, u32x2{r.ql.x, r.ql.y}, u32x2{r.ql.z, r.ql.w}, r.qh, scales(r.sc).v, r.d, x);
    }
    GQ_HD static void weights(const Regs& r, float (&w)[4][8]) {
        Q6::weights(u32x2{r.ql.x, r.ql.y}, u32x2{r.ql.z, r.ql.w}, r.qh, scales(r.sc).v, r.d, w);
    }
};

}  // namespace gguf
