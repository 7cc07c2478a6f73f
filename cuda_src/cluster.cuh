// cluster.cuh — thread block clusters in sm_90 PTX (no headers: NVRTC compiles these files bare),
// for the kernels whose blocks cooperate through distributed shared memory: the split-K decode
// merge (attn_split.cuh) and the sampling rows (sampling_rows.cuh, sampling_topk.cuh).
#pragma once

// blocks in this block's cluster (1 when launched without one) and this block's rank in it
__device__ __forceinline__ unsigned cluster_size() {
    unsigned n;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// every thread of every block of the cluster: what each wrote to its shared memory before is
// visible to all after (release / acquire)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The 32-bit shared-window address of p (a __shared__ address of this block).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// The same shared variable (a shared-window address of this block) in the block of rank `rank`.
__device__ __forceinline__ unsigned map_rank(unsigned local, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}
