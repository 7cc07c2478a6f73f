// bf16.cuh — float -> bfloat16 bits without cuda_bf16.h (NVRTC compiles these files with no headers),
// and the bf16 tensor-core product the quantized matmuls share.
#pragma once

// round to nearest even (finite inputs)
__device__ __forceinline__ unsigned short bf16_bits(float f) {
    const unsigned int b = __float_as_uint(f);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// the two bfloat16 halves of a 32-bit word as floats (the low half is the lower address)
__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xFFFF0000u); }

// c (16x8 float32) += A (16x16 bf16, row) · B (16x8 bf16, col): mma.sync.m16n8k16, fragments as PTX
// defines them (g = lane / 4, t = lane % 4): a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
// a3 = A[g+8][2t+8..]; b0 = B[2t..][g], b1 = B[2t+8..][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][..]
__device__ __forceinline__ void mma_bf16(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
