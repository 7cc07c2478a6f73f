// attn_mma_ptx.cuh — the sm_80+ PTX the tensor-core attention kernels (attention_mma.cu,
// attention_stream.cu) are made of: cp.async, ldmatrix, mma.sync bf16, and the reductions over the
// quad of lanes that holds a row of a C fragment (attention_mma_frag.cuh).
#pragma once
#include "attention_mma_frag.cuh"
#include "cluster.cuh"

namespace amma {

constexpr u32 kAll = 0xffffffffu;

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared through L2 only; n = 0 fills zeros and reads nothing
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// The same copy with an L2 eviction policy (createpolicy's 64-bit descriptor: cluster.cuh's
// l2_evict_first_policy for bytes read once). ATTN_KV_L2_128B / ATTN_KV_L2_256B add the prefetch-size
// hint (L2 fetches the whole 128- or 256-byte segment around the piece), for the A/B.
#if defined(ATTN_KV_L2_256B)
#define ATTN_KV_PREFETCH ".L2::256B"
#elif defined(ATTN_KV_L2_128B)
#define ATTN_KV_PREFETCH ".L2::128B"
#else
#define ATTN_KV_PREFETCH ""
#endif
__device__ __forceinline__ void cp_async16_hint(u32 dst, const void* src, int n, unsigned long long policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint" ATTN_KV_PREFETCH " [%0], [%1], 16, %2, %3;" ::"r"(dst),
                 "l"(src), "r"(n), "l"(policy) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// c += a b (16 x 16 bf16 by 16 x 8 bf16, float accumulators)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(kAll, x, 1));
    return fmaxf(x, __shfl_xor_sync(kAll, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(kAll, x, 1);
    return x + __shfl_xor_sync(kAll, x, 2);
}

}  // namespace amma
