// quant_blocks.cuh — GGUF block types as compile-time traits: layout and decoding to float.
//
// One struct per GGUF type in namespace `gguf` (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K
// Q4_K Q5_K Q6_K). Each one holds
//   block                  the block struct, field for field ggml's (ggml-common.h); fp16 fields
//                          are raw bits (unsigned short)
//   kType                  the GGML type id (GGMLQuantizationType in gguf-py)
//   kValues, kBytes        values and bytes per block (GGML_QUANT_SIZES); plain types are blocks of 1
//   kQuantized             false for F32/F16/BF16
//   value(b, i)            value i of block b, i in [0, kValues)
//   sub_block(b, s, out)   (quantized types) out[0..31] = values 32*s .. 32*s+31, s in [0, kValues/32)
// and two helpers over a row of blocks, valid for every type:
//   row_value<QT>(row, i)        value i of the row
//   row_sub_block<QT>(row, s, out)  values 32*s .. 32*s+31 of the row (plain types: 32 plain loads)
//
// The float arithmetic follows gguf-py's quants.py (the oracle) operation for operation, e.g.
// Q4_K is (d * sc) * q - (dmin * m); only FMA contraction on the device can move the last bit.
// Block starts are 2-byte aligned (every block size is even and tensors start aligned), so the
// fp16 fields are read as 16-bit words; everything wider is assembled from bytes.
//
// Everything is __host__ __device__ and needs no header, so one source serves NVRTC (the run-time
// build), nvcc, and a plain g++ host harness (tests/test_kernels_elementwise.py checks every type
// against gguf.quants.dequantize through that harness).
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GQ_HD __host__ __device__ __forceinline__
#else
#define GQ_HD inline
#endif

namespace gguf {

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

constexpr int QK_K = 256;        // values per k-quant super-block
constexpr int K_SCALE_SIZE = 12; // bytes of packed 6-bit scales and mins in Q4_K / Q5_K

GQ_HD float bits_to_float(u32 bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    union { u32 u; float f; } v;
    v.u = bits;
    return v.f;
#endif
}

// IEEE binary16 bits -> float (exact; no header needed).
GQ_HD float half_to_float(u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    const u32 sign = (u32)(h & 0x8000u) << 16;
    const u32 exp = (h >> 10) & 0x1fu;
    const u32 mant = h & 0x3ffu;
    if (exp == 0) {                                   // zero or subnormal: mant * 2^-24, exact
        const float f = (float)mant * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));   // inf / nan
    return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));         // rebias 15 -> 127
#endif
}

// bfloat16 is the top half of a float32.
GQ_HD float bf16_to_float(u16 h) { return bits_to_float((u32)h << 16); }

// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min, packed in 12 bytes:
//   bytes 0-3: scale j (j<4) in bits 0-5, high bits of scale j+4 in bits 6-7
//   bytes 4-7: min j (j<4) in bits 0-5, high bits of min j+4 in bits 6-7
//   bytes 8-11: low 4 bits of scale j+4 in bits 0-3, low 4 bits of min j+4 in bits 4-7
// (ggml's get_scale_min_k4)
GQ_HD void scale_min_k4(int j, const u8* q, float& sc, float& m) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        m = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q3_K: 16 signed 6-bit scales (stored +32) packed in 12 bytes:
//   low 4 bits of scale j: bytes 0-7, low nibble for j<8, high nibble of byte j-8 for j>=8
//   high 2 bits of scale j: byte 8 + j%4, bits 2*(j/4) .. 2*(j/4)+1
GQ_HD float scale_q3_k(int j, const u8* q) {
    const int lo = j < 8 ? (q[j] & 0x0F) : (q[j - 8] >> 4);
    const int hi = (q[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (float)((lo | (hi << 4)) - 32);
}

// ---------------------------------------------------------------- ggml's block structs
struct block_q4_0 { u16 d; u8 qs[16]; };                       // w = d * (q - 8)
struct block_q4_1 { u16 d; u16 m; u8 qs[16]; };                // w = d * q + m
struct block_q5_0 { u16 d; u8 qh[4]; u8 qs[16]; };             // w = d * (q - 16)
struct block_q5_1 { u16 d; u16 m; u8 qh[4]; u8 qs[16]; };      // w = d * q + m
struct block_q8_0 { u16 d; i8 qs[32]; };                       // w = d * q
struct block_q2_K { u8 scales[QK_K / 16]; u8 qs[QK_K / 4]; u16 d; u16 dmin; };
struct block_q3_K { u8 hmask[QK_K / 8]; u8 qs[QK_K / 4]; u8 scales[12]; u16 d; };
struct block_q4_K { u16 d; u16 dmin; u8 scales[K_SCALE_SIZE]; u8 qs[QK_K / 2]; };
struct block_q5_K { u16 d; u16 dmin; u8 scales[K_SCALE_SIZE]; u8 qh[QK_K / 8]; u8 qs[QK_K / 2]; };
struct block_q6_K { u8 ql[QK_K / 2]; u8 qh[QK_K / 4]; i8 scales[QK_K / 16]; u16 d; };

static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");

// ---------------------------------------------------------------- plain types (blocks of one value)
struct F32 {
    struct block { float v; };
    static constexpr int kType = 0, kValues = 1, kBytes = 4;
    static constexpr bool kQuantized = false;
    GQ_HD static float value(const block& b, int) { return b.v; }
};

struct F16 {
    struct block { u16 v; };
    static constexpr int kType = 1, kValues = 1, kBytes = 2;
    static constexpr bool kQuantized = false;
    GQ_HD static float value(const block& b, int) { return half_to_float(b.v); }
};

struct BF16 {
    struct block { u16 v; };
    static constexpr int kType = 30, kValues = 1, kBytes = 2;
    static constexpr bool kQuantized = false;
    GQ_HD static float value(const block& b, int) { return bf16_to_float(b.v); }
};

// ---------------------------------------------------------------- 32-value blocks
// Q4_0 / Q4_1 / Q5_0 / Q5_1: byte qs[j] holds value j in its low nibble and value j+16 in its
// high nibble; Q5 types keep the 5th bit of value i in bit i of the little-endian word qh.

struct Q4_0 {
    typedef block_q4_0 block;
    static constexpr int kType = 2, kValues = 32, kBytes = 18;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int q = (b.qs[i & 15] >> ((i >> 4) * 4)) & 0x0F;
        return half_to_float(b.d) * (float)(q - 8);   // q4_0 stores unsigned nibbles: -8 recentres
    }
    GQ_HD static void sub_block(const block& b, int, float* out) {
        const float d = half_to_float(b.d);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            out[j] = d * (float)((b.qs[j] & 0x0F) - 8);
            out[j + 16] = d * (float)((b.qs[j] >> 4) - 8);
        }
    }
};

struct Q4_1 {
    typedef block_q4_1 block;
    static constexpr int kType = 3, kValues = 32, kBytes = 20;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int q = (b.qs[i & 15] >> ((i >> 4) * 4)) & 0x0F;
        return half_to_float(b.d) * (float)q + half_to_float(b.m);
    }
    GQ_HD static void sub_block(const block& b, int, float* out) {
        const float d = half_to_float(b.d), m = half_to_float(b.m);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            out[j] = d * (float)(b.qs[j] & 0x0F) + m;
            out[j + 16] = d * (float)(b.qs[j] >> 4) + m;
        }
    }
};

GQ_HD u32 load_qh32(const u8* qh) {
    return (u32)qh[0] | ((u32)qh[1] << 8) | ((u32)qh[2] << 16) | ((u32)qh[3] << 24);
}

struct Q5_0 {
    typedef block_q5_0 block;
    static constexpr int kType = 6, kValues = 32, kBytes = 22;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int lo = (b.qs[i & 15] >> ((i >> 4) * 4)) & 0x0F;
        const int hi = (load_qh32(b.qh) >> i) & 1;
        return half_to_float(b.d) * (float)((lo | (hi << 4)) - 16);
    }
    GQ_HD static void sub_block(const block& b, int, float* out) {
        const float d = half_to_float(b.d);
        const u32 qh = load_qh32(b.qh);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int q0 = (b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            const int q1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)(q0 - 16);
            out[j + 16] = d * (float)(q1 - 16);
        }
    }
};

struct Q5_1 {
    typedef block_q5_1 block;
    static constexpr int kType = 7, kValues = 32, kBytes = 24;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int lo = (b.qs[i & 15] >> ((i >> 4) * 4)) & 0x0F;
        const int hi = (load_qh32(b.qh) >> i) & 1;
        return half_to_float(b.d) * (float)(lo | (hi << 4)) + half_to_float(b.m);
    }
    GQ_HD static void sub_block(const block& b, int, float* out) {
        const float d = half_to_float(b.d), m = half_to_float(b.m);
        const u32 qh = load_qh32(b.qh);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int q0 = (b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            const int q1 = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (float)q0 + m;
            out[j + 16] = d * (float)q1 + m;
        }
    }
};

struct Q8_0 {
    typedef block_q8_0 block;
    static constexpr int kType = 8, kValues = 32, kBytes = 34;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) { return half_to_float(b.d) * (float)b.qs[i]; }
    GQ_HD static void sub_block(const block& b, int, float* out) {
        const float d = half_to_float(b.d);
#pragma unroll
        for (int j = 0; j < 32; ++j) out[j] = d * (float)b.qs[j];
    }
};

// ---------------------------------------------------------------- 256-value k-quant super-blocks
// Value i of a super-block sits at (h, g, l) = (i / 128, (i % 128) / 32, i % 32) in the types that
// split the block into two halves of 128 (Q2_K, Q3_K, Q6_K); Q4_K / Q5_K are 4 pairs of 32.

// Q2_K: 2-bit q at qs[32h + l] bits 2g..2g+1; byte scales[i / 16] holds a 4-bit scale (low) and
// a 4-bit min (high) for each 16 values. w = (d * sc) * q - (dmin * m).
struct Q2_K {
    typedef block_q2_K block;
    static constexpr int kType = 10, kValues = QK_K, kBytes = 84;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        const int q = (b.qs[32 * h + l] >> (2 * g)) & 3;
        const u8 sc = b.scales[i >> 4];
        return half_to_float(b.d) * (float)(sc & 0x0F) * (float)q - half_to_float(b.dmin) * (float)(sc >> 4);
    }
    GQ_HD static void sub_block(const block& b, int s, float* out) {
        const int h = s >> 2, g = s & 3;
        const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u8 sc = b.scales[2 * s + half];
            const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int l = 16 * half + j;
                out[l] = dl * (float)((b.qs[32 * h + l] >> (2 * g)) & 3) - ml;
            }
        }
    }
};

// Q3_K: low 2 bits at qs[32h + l] bits 2g..2g+1; the 3rd bit of value i at hmask[i % 32] bit
// i / 32, and a *clear* bit subtracts 4 (q in -4..3). 6-bit signed scale per 16 values.
// w = (d * scale) * q.
struct Q3_K {
    typedef block_q3_K block;
    static constexpr int kType = 11, kValues = QK_K, kBytes = 110;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        const int lo = (b.qs[32 * h + l] >> (2 * g)) & 3;
        const int q = lo - (((b.hmask[l] >> (i >> 5)) & 1) ? 0 : 4);
        return half_to_float(b.d) * scale_q3_k(i >> 4, b.scales) * (float)q;
    }
    GQ_HD static void sub_block(const block& b, int s, float* out) {
        const int h = s >> 2, g = s & 3;
        const float d = half_to_float(b.d);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float dl = d * scale_q3_k(2 * s + half, b.scales);
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int l = 16 * half + j;
                const int lo = (b.qs[32 * h + l] >> (2 * g)) & 3;
                out[l] = dl * (float)(lo - (((b.hmask[l] >> s) & 1) ? 0 : 4));
            }
        }
    }
};

// Q4_K: sub-block s (32 values) takes nibble s % 2 of qs[32 * (s / 2) + l]; scale and min from
// scale_min_k4(s). w = (d * sc) * q - (dmin * m).
struct Q4_K {
    typedef block_q4_K block;
    static constexpr int kType = 12, kValues = QK_K, kBytes = 144;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int s = i >> 5, l = i & 31;
        float sc, m;
        scale_min_k4(s, b.scales, sc, m);
        const int q = (b.qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 0x0F;
        return half_to_float(b.d) * sc * (float)q - half_to_float(b.dmin) * m;
    }
    GQ_HD static void sub_block(const block& b, int s, float* out) {
        float sc, m;
        scale_min_k4(s, b.scales, sc, m);
        const float dl = half_to_float(b.d) * sc, ml = half_to_float(b.dmin) * m;
        const u8* qs = b.qs + 32 * (s >> 1);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) out[l] = dl * (float)((qs[l] >> shift) & 0x0F) - ml;
    }
};

// Q5_K: Q4_K plus a 5th bit for sub-block s at qh[l] bit s.
struct Q5_K {
    typedef block_q5_K block;
    static constexpr int kType = 13, kValues = QK_K, kBytes = 176;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int s = i >> 5, l = i & 31;
        float sc, m;
        scale_min_k4(s, b.scales, sc, m);
        const int q = ((b.qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 0x0F) | (((b.qh[l] >> s) & 1) << 4);
        return half_to_float(b.d) * sc * (float)q - half_to_float(b.dmin) * m;
    }
    GQ_HD static void sub_block(const block& b, int s, float* out) {
        float sc, m;
        scale_min_k4(s, b.scales, sc, m);
        const float dl = half_to_float(b.d) * sc, ml = half_to_float(b.dmin) * m;
        const u8* qs = b.qs + 32 * (s >> 1);
        const int shift = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = ((qs[l] >> shift) & 0x0F) | (((b.qh[l] >> s) & 1) << 4);
            out[l] = dl * (float)q - ml;
        }
    }
};

// Q6_K: low 4 bits at ql[64h + 32(g % 2) + l], nibble g / 2; high 2 bits at qh[32h + l] bits
// 2g..2g+1; q in -32..31; int8 scale per 16 values (scales[i / 16]). w = (d * scale) * q.
// The 6-bit code (q + 32) of a value of group g from its ql and qh bytes:
GQ_HD int q6_code(int ql, int qh, int g) { return ((ql >> (4 * (g >> 1))) & 0x0F) | (((qh >> (2 * g)) & 3) << 4); }
struct Q6_K {
    typedef block_q6_K block;
    static constexpr int kType = 14, kValues = QK_K, kBytes = 210;
    static constexpr bool kQuantized = true;
    GQ_HD static float value(const block& b, int i) {
        const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        const int q = q6_code(b.ql[64 * h + 32 * (g & 1) + l], b.qh[32 * h + l], g);
        return half_to_float(b.d) * (float)b.scales[i >> 4] * (float)(q - 32);
    }
    GQ_HD static void sub_block(const block& b, int s, float* out) {
        const int h = s >> 2, g = s & 3;
        const float d = half_to_float(b.d);
        const u8* ql = b.ql + 64 * h + 32 * (g & 1);
        const u8* qh = b.qh + 32 * h;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float dl = d * (float)b.scales[2 * s + half];
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int l = 16 * half + j;
                out[l] = dl * (float)(q6_code(ql[l], qh[l], g) - 32);
            }
        }
    }
};

// ---------------------------------------------------------------- Q6_K in pair order
// A Q6_K matrix as the CUDA executor uploads it (weights/q6k_pairs.py): each pair of super-blocks
// keeps its 420 bytes and place, reordered so that its large pieces are 16-byte aligned. A pair at
// address A (4-byte aligned; the tensor 16-byte aligned) holds a prefix of a = -A mod 16 bytes, both
// super-blocks' ql at A + a (16-byte aligned) in plane order (GGUF 8-byte unit 8h + 4c + i at
// position 8h + 2i + c), both qh at A + a + 256, and nine small words, those that fit the prefix
// first, the rest after qh: 0-3 the first super-block's scales, 4-7 the second's (scale G at byte
// 8 (G >> 3) + 4 (G & 1) + ((G >> 1) & 3): a lane's four scales, scales[8h + is + 2t], are one
// word), 8 both d's. Super-block j of a pair starts, as a GGUF block would, at A + 210 j, so j is
// bit 1 of that address.
GQ_HD int q6p_prefix(const u8* pair) { return (int)((0ull - (unsigned long long)pair) & 15ull); }
// small word w: at 4w in the prefix, else 384 on (a + 384 + 4 (w - a / 4) from the pair's start)
GQ_HD const u8* q6p_word(const u8* pair, int a, int w) { return pair + 4 * w + (w < (a >> 2) ? 0 : 384); }
GQ_HD const u8* q6p_ql(const u8* pair, int a, int j) { return pair + a + 128 * j; }
GQ_HD const u8* q6p_qh(const u8* pair, int a, int j) { return pair + a + 256 + 64 * j; }
// where GGUF ql byte b of a super-block is in its plane-ordered ql
GQ_HD int q6p_ql_at(int b) {
    const int u = b >> 3;
    return 8 * (8 * (u >> 3) + 2 * (u & 3) + ((u >> 2) & 1)) + (b & 7);
}
// where scale G of a super-block is among its plane-ordered scale bytes
GQ_HD int q6p_scale_at(int G) { return 8 * (G >> 3) + 4 * (G & 1) + ((G >> 1) & 3); }

// Q6_K in pair order as a block trait: values from (a row, a super-block), since a block's bytes are
// spread over its pair. Not a GGUF type (kType -1); the same float arithmetic as Q6_K.
struct Q6_KP {
    static constexpr int kType = -1, kValues = QK_K, kBytes = 210;
    static constexpr bool kQuantized = true;
    struct Where { const u8* pair; int a, j; };
    GQ_HD static Where at(const u8* row, long long sb) {
        const u8* pair = row + 420 * (sb >> 1);
        return Where{pair, q6p_prefix(pair), (int)(sb & 1)};
    }
    GQ_HD static float d(const Where& w) {
        const u8* p = q6p_word(w.pair, w.a, 8) + 2 * w.j;
        return half_to_float((u16)(p[0] | (p[1] << 8)));
    }
    GQ_HD static int scale(const Where& w, int G) {
        const int pos = q6p_scale_at(G);
        return (int)(i8)q6p_word(w.pair, w.a, 4 * w.j + (pos >> 2))[pos & 3];
    }
    GQ_HD static int q(const Where& w, int i) {          // the 6-bit code of value i, 0..63
        const int h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        return q6_code(q6p_ql(w.pair, w.a, w.j)[q6p_ql_at(64 * h + 32 * (g & 1) + l)],
                       q6p_qh(w.pair, w.a, w.j)[32 * h + l], g);
    }
    GQ_HD static float value(const u8* row, long long sb, int i) {
        const Where w = at(row, sb);
        return d(w) * (float)scale(w, i >> 4) * (float)(q(w, i) - 32);
    }
    GQ_HD static void sub_block(const u8* row, long long sb, int s, float* out) {
        const Where w = at(row, sb);
        const float dd = d(w);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float dl = dd * (float)scale(w, 2 * s + half);
#pragma unroll
            for (int j = 0; j < 16; ++j) out[16 * half + j] = dl * (float)(q(w, 32 * s + 16 * half + j) - 32);
        }
    }
};
template <class QT> struct InPairs { static constexpr bool value = false; };
template <> struct InPairs<Q6_KP> { static constexpr bool value = true; };

// ---------------------------------------------------------------- rows of blocks

// Value i of a row that starts at `row` (a whole number of blocks).
template <class QT>
GQ_HD float row_value(const void* row, long long i) {
    if constexpr (InPairs<QT>::value) {
        return QT::value(static_cast<const u8*>(row), i / QT::kValues, (int)(i % QT::kValues));
    } else {
        const typename QT::block* blocks = static_cast<const typename QT::block*>(row);
        return QT::value(blocks[i / QT::kValues], (int)(i % QT::kValues));
    }
}

// Values 32*s .. 32*s+31 of a row into out[0..31] (Q6_KP: s / 8 the super-block, s % 8 its sub-block).
template <class QT>
GQ_HD void row_sub_block(const void* row, long long s, float* out) {
    if constexpr (InPairs<QT>::value) {
        QT::sub_block(static_cast<const u8*>(row), s / 8, (int)(s % 8), out);
    } else if constexpr (QT::kQuantized) {
        constexpr int subs = QT::kValues / 32;
        QT::sub_block(static_cast<const typename QT::block*>(row)[s / subs], (int)(s % subs), out);
    } else {
        const typename QT::block* blocks = static_cast<const typename QT::block*>(row);
#pragma unroll
        for (int j = 0; j < 32; ++j) out[j] = QT::value(blocks[32 * s + j], 0);
    }
}

}  // namespace gguf
