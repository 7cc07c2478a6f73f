// q4k_lanes.cuh — a lane's Q4_K weights as bf16 A fragments of m16n8k16 (mma.sync) or, the same per
// warp, of a warpgroup's m64nNk16 (wgmma): the header's 6-bit scales and mins turned into bf16 pairs,
// each code word into four pairs of weights. Used by mma_dq.cu and mma_wg.cu; the lane order of K
// (which values a lane holds in which k-step) is described in mma_dq.cu's header, and emulated bit
// for bit on the CPU by tests/test_mma_dq_frag.py.
#pragma once

#include "quant_blocks.cuh"

namespace dq {

typedef unsigned int u32;
constexpr int kBlockBytes = 144;          // Q4_K: d, dmin (fp16), 12 bytes of scales, 128 of codes
constexpr u32 kMagic = 0x43004300u;       // bf16 128.0 in each half: | v gives 128 + v for v < 128

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// (lo, hi) rounded to bf16, lo in the low half
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// One row's bytes of one super-block as a lane holds them: the header and its two 16-byte pieces.
struct RowBytes {
    uint4 hdr, q[2];
};

__device__ __forceinline__ void load_row(RowBytes& r, const unsigned char* blk, int t) {
    r.hdr = ldg_stream(blk);
    r.q[0] = ldg_stream(blk + 16 + 16 * t);
    r.q[1] = ldg_stream(blk + 80 + 16 * t);
}

// A row's scales for the lane's four sub-blocks: s[2h + u] = S of sub-block 2 c_h + u in both
// halves, c[] = -128 s[] (exact), and mn[h] = (-M of sub-block 2 c_h, of 2 c_h + 1).
struct RowScales {
    u32 s[4], c[4], mn[2];
};

__device__ __forceinline__ void row_scales(RowScales& r, const uint4& hdr, int t) {
    const float d = gguf::half_to_float(hdr.x & 0xFFFFu), dmin = gguf::half_to_float(hdr.x >> 16);
    const u32 d2 = pack2(d, d), cd = pack2(-128.f * d, -128.f * d);
    const u32 n2 = pack2(-dmin, -dmin), cn = pack2(128.f * dmin, 128.f * dmin);
    const int sh = 16 * (t >> 1);                       // bytes j0, j0 + 1 of each scale word, j0 = 2 (t / 2)
    const u32 y = (hdr.y >> sh) & 0xFFFFu, z = (hdr.z >> sh) & 0xFFFFu, w = (hdr.w >> sh) & 0xFFFFu;
    // gguf's get_scale_min_k4: j < 4 from the low six bits; j = 4 + jj from byte 8 + jj's nibbles and
    // the top two bits of bytes jj (scale) and 4 + jj (min)
    const u32 sc_lo = y & 0x3F3Fu, m_lo = z & 0x3F3Fu;
    const u32 sc_hi = (w & 0x0F0Fu) | ((y >> 2) & 0x3030u);
    const u32 m_hi = ((w >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u);
    r.s[0] = fma2(__byte_perm(sc_lo, 0, 0x4040) | kMagic, d2, cd);
    r.s[1] = fma2(__byte_perm(sc_lo, 0, 0x4141) | kMagic, d2, cd);
    r.s[2] = fma2(__byte_perm(sc_hi, 0, 0x4040) | kMagic, d2, cd);
    r.s[3] = fma2(__byte_perm(sc_hi, 0, 0x4141) | kMagic, d2, cd);
#pragma unroll
    for (int j = 0; j < 4; ++j) r.c[j] = fma2(r.s[j], 0xC300C300u, 0u);      // * -128
    r.mn[0] = fma2(__byte_perm(m_lo, 0, 0x4140) | kMagic, n2, cn);
    r.mn[1] = fma2(__byte_perm(m_hi, 0, 0x4140) | kMagic, n2, cn);
}

// (v & 0x000F000F) | kMagic in one lop3: a bf16 pair 128 + nibble (the magic in a register, where
// the compiler's & then | take two instructions with both constants as immediates)
__device__ __forceinline__ u32 nib_pair(u32 v) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "n"(0x000F000F), "r"(kMagic));
    return d;
}

// the four bf16 pairs of word w (bytes b0..b3): values (b0, b2) and (b1, b3) of the low nibbles
// (sub-block of scale j), then of the high nibbles (scale j + 1)
__device__ __forceinline__ void decode_word(u32 w, const RowScales& r, int j, u32& lo_e, u32& lo_o, u32& hi_e,
                                            u32& hi_o) {
    lo_e = fma2(nib_pair(w), r.s[j], r.c[j]);
    lo_o = fma2(nib_pair(w >> 8), r.s[j], r.c[j]);
    hi_e = fma2(nib_pair(w >> 4), r.s[j + 1], r.c[j + 1]);
    hi_o = fma2(nib_pair(w >> 12), r.s[j + 1], r.c[j + 1]);
}

}  // namespace dq
