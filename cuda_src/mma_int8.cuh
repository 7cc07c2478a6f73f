// mma_int8.cuh — the int8 mma.sync shapes of the quantized matmuls (mma_kq.cu, mma_st.cu): a warp's
// C (16 x 8 int32) = A (16 x k, row-major) B (k x 8, column-major), C not accumulated into (its
// input is zero). The fragments' lanes are laid out in mma_kq_frag.cuh and mma_st_lanes.cuh.
#pragma once
#include "kq_lanes.cuh"

// m16n8k32, A and B signed
__device__ __forceinline__ void mma_s8_k32(int (&c)[4], const unsigned (&a)[4], gguf::u32x2 b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}
// m16n8k32, A unsigned (Q4_K's nibbles), B signed
__device__ __forceinline__ void mma_u8s8_k32(int (&c)[4], const unsigned (&a)[4], gguf::u32x2 b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(0));
}
// m16n8k16, A and B signed
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], unsigned a0, unsigned a1, unsigned b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(0));
}
