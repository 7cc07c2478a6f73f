// kq_lanes.cuh — a k-quant super-block as eight lanes' shares of an int8 dot product.
//
// gemv_kq.cu gives each 256-value super-block of a weight row to eight consecutive lanes; lane
// `part` (0..7) owns 32 of its values. Lanes<QT> says, for Q4_K and Q6_K:
//   Regs, load(b, part, r)   the lane's raw bytes of super-block b, in the widest loads the layout
//                            allows (all issued before any arithmetic needs them)
//   X, load_x(..., sb, part) the int8 codes (ops/q8.py: xq, xd = max|x|/127, xs = xd * sum) of the
//                            x values those 32 weights multiply
//   dot(r, x, part)          the lane's share of sum_i w_i * x_i in float; the eight shares of a
//                            super-block add up to its whole dot product
// Q4_K: lane part holds bytes 16*part.. of qs: the low nibbles are values 16*(part&1).. of
//   sub-block 2*(part>>1), the high nibbles the same values of the next sub-block. One 16-byte
//   load for them and one for the header (d, dmin, 12 scale bytes); blocks are 144 = 9*16 bytes.
// Q6_K: lane part (half h = part>>2, l0 = 8*(part&3)) holds l = l0..l0+7 of ggml's loop: ql[l],
//   ql[l+32], qh[l] of its half, i.e. values l, l+32, l+64, l+96 of the half, each group of 8
//   within one 16-value scale. Blocks are 210 bytes, so a block starts 2-byte aligned; its three
//   8-byte pieces share one misalignment o = address & 7 and are read as aligned 16-byte windows
//   (two 8-byte loads) and shifted into place in dot(). The codes are 0..63 for values q - 32:
//   dot() takes dp4a of the raw codes and subtracts 32 * sum(x codes), which load_x makes once
//   for all the rows a warp computes (a per-byte subtraction costs ~8 instructions per word).
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

GQ_HD u32 load4_a2(const u8* p) {        // 2-byte aligned
    const u16* h = reinterpret_cast<const u16*>(p);
    return (u32)h[0] | ((u32)h[1] << 16);
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

GQ_HD int signed_byte(u32 w, int i) { return (int)(i8)(w >> (8 * i)); }

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
    struct Regs { u32x4 hd, qs; };
    struct X { u32x4 a, b; float da, db, sa, sb; };

    GQ_HD static void load(const u8* b, int part, Regs& r) {
        r.hd = load16(b);
        r.qs = load16(b + 16 + 16 * part);
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
};

template <> struct Lanes<Q6_K> {
    static constexpr int kBytes = 210;
    // win[j]: the aligned 16 bytes holding piece j (ql[l0..], ql[l0+32..], qh[l0..] of the half)
    struct Regs { u32x2 win[3][2]; u32 sc0, sc1; u16 d; int o; };
    struct X { u32x2 q[4]; int sum32[4]; float d[4]; };

    GQ_HD static void load(const u8* b, int part, Regs& r) {
        const int h = part >> 2, l0 = 8 * (part & 3);
        r.o = (int)(reinterpret_cast<unsigned long long>(b) & 7);
        const int off[3] = {64 * h + l0, 64 * h + 32 + l0, 128 + 32 * h + l0};
#pragma unroll
        for (int j = 0; j < 3; ++j) {
            const u8* p = b + off[j] - r.o;
            r.win[j][0] = load8(p);
            r.win[j][1] = r.o ? load8(p + 8) : u32x2{0, 0};   // within the block: qh ends at byte 192
        }
        r.sc0 = load4_a2(b + 192 + 8 * h);
        r.sc1 = load4_a2(b + 196 + 8 * h);
        r.d = *reinterpret_cast<const u16*>(b + 208);
    }
    GQ_HD static void load_x(const int* xq, const float* xd, const float*, int sb, int part, X& x) {
        const int h = part >> 2, l0 = 8 * (part & 3);
        const u8* q = reinterpret_cast<const u8*>(xq) + sb * 256 + 128 * h + l0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            x.q[t] = load8(q + 32 * t);
            x.sum32[t] = dp4a(0x20202020u, x.q[t].y, dp4a(0x20202020u, x.q[t].x, 0));
        }
        const f32x4 d = load_vec<f32x4>(xd + sb * 8 + 4 * h);   // 16-byte aligned: K/32 is a multiple of 8
        x.d[0] = d.x; x.d[1] = d.y; x.d[2] = d.z; x.d[3] = d.w;
    }
    // the 8 bytes at offset o of a 16-byte window
    GQ_HD static u32x2 piece(const u32x2 (&w)[2], int o) {
        const int bits = 8 * (o & 3);
        const u32 w0 = o >= 4 ? w[0].y : w[0].x, w1 = o >= 4 ? w[1].x : w[0].y, w2 = o >= 4 ? w[1].y : w[1].x;
        return {shift_right64(w0, w1, bits), shift_right64(w1, w2, bits)};
    }
    GQ_HD static float dot(const Regs& r, const X& x, int part) {
        const u32x2 qa = piece(r.win[0], r.o), qb = piece(r.win[1], r.o), qh = piece(r.win[2], r.o);
        const int is = (part & 3) >> 1;               // which 16-value scale of each group of 32
        const float d = half_to_float(r.d);
        float acc = 0.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const u32x2 ql = (t & 1) ? qb : qa;
            const int ns = 4 * (t >> 1), hs = 2 * t;
            const u32 q0 = ((ql.x >> ns) & 0x0F0F0F0Fu) | (((qh.x >> hs) & 0x03030303u) << 4);
            const u32 q1 = ((ql.y >> ns) & 0x0F0F0F0Fu) | (((qh.y >> hs) & 0x03030303u) << 4);
            const int s = dp4a(q1, x.q[t].y, dp4a(q0, x.q[t].x, 0)) - x.sum32[t];
            const int sc = signed_byte(t < 2 ? r.sc0 : r.sc1, is + 2 * (t & 1));
            acc += x.d[t] * (d * (float)sc) * (float)s;
        }
        return acc;
    }
};

}  // namespace gguf
