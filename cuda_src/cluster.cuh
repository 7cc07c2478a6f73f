// cluster.cuh — thread block clusters in sm_90 PTX (no headers: NVRTC compiles these files bare),
// for the kernels whose blocks cooperate through distributed shared memory: the split-K decode
// merge (attn_split.cuh, attn_mma_end.cuh) and the sampling rows (sampling_rows.cuh, sampling_topk.cuh);
// and a block's own barriers (mbarriers, named barriers) for the kernels whose warps take roles.
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

// The split-K sum of a matmul whose KS blocks (a cluster along K) each hold their partial C of the
// same kRows rows of W in shared memory (part: [kRows][kCols] floats, a column a row of x): rank r
// adds rows [r kRows / KS, (r + 1) kRows / KS) over the ranks in rank order, so the bits do not depend
// on timing, and stores y (kCols rows of x by n; rows of W from row0, those past n and columns past m
// left out). Every thread of the block (kThreads) calls it after the cluster_sync that published
// part, and a cluster_sync after it keeps every block until the others are done reading.
template <int KS, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void cluster_sum_rows(float* __restrict__ y, const float* part, int row0, int m, int n) {
    const int rank = (int)cluster_rank();
    constexpr int kShare = kRows / KS * kCols;
    const unsigned local = smem_addr(part);
    for (int idx = threadIdx.x; idx < kShare; idx += kThreads) {
        const int off = rank * kShare + idx;
        const int row = row0 + off / kCols, col = off % kCols;
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < KS; ++q) {
            float v;
            asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(map_rank(local + 4u * off, q)) : "memory");
            sum += v;
        }
        if (row < n && col < m) y[(long long)col * n + row] = sum;
    }
}

// The cluster barrier in its two halves, for a barrier met long after it is announced: arrive
// (relaxed: orders nothing by itself; fence_mbarrier_init before it publishes barriers set up
// just before) and wait (acquire). Every thread of every block does both, in this order.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// ---------------------------------------------------------------- mbarriers shared in a cluster

// a barrier of this block that completes its phase after `count` arrivals
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// after mbar_init and before the cluster barrier that lets other blocks use it
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// one relaxed arrival on the barrier at shared::cluster address `bar` (map_rank): for a barrier that
// says only that the arriving block is past its own reads of memory the waiting one will write, so
// that nothing is published (a .release.cluster arrival compiles to MEMBAR.ALL.GPU first)
__device__ __forceinline__ void mbar_arrive_cluster_relaxed(unsigned bar) {
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
// until this block's barrier has completed the phase of the given parity; acquires what the
// arrivals released (Ordered false: acquires nothing, and so needs no L1 invalidation)
template <bool Ordered = true>
__device__ __forceinline__ void mbar_wait_cluster(unsigned long long* bar, unsigned parity) {
    const unsigned a = smem_addr(bar);
    unsigned done = 0;
    while (!done) {
        if constexpr (Ordered)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(a), "r"(parity) : "memory");
        else
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.relaxed.cluster.shared::cta.b64 p, [%1], %2; "
                         "selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(a), "r"(parity) : "memory");
    }
}

// This block's own arrival on its barrier (relaxed: the block publishes nothing by it), which also
// expects `bytes` more to land by st_async
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.relaxed.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes) : "memory");
}

// ---------------------------------------------------------------- a block's own barriers

// one arrival (release at the block: what this thread wrote before is visible to a thread that
// waits for the phase)
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// until the barrier has completed the phase of the given parity (acquire at the block)
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    const unsigned a = smem_addr(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(a), "r"(parity) : "memory");
}

// `bytes` (a multiple of 16, both ends 16-byte aligned) global -> this block's shared memory,
// counted on bar as they land
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// the same with an L2 policy (createpolicy's 64-bit descriptor, e.g. l2_evict_first_policy)
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, unsigned bytes, unsigned long long* bar,
                                               unsigned long long policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy) : "memory");
}
// an L2 policy for bytes read once: they leave L2 before the lines other work reuses
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// Barrier `id` (1..15; 0 is __syncthreads) of `threads` threads (a multiple of 32) of this block: the
// threads that reach it first wait for the rest
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// an arrival on this block's barrier made when every cp.async this thread issued before has landed
// (noinc: the arrival is one of the barrier's count, not added to it)
__device__ __forceinline__ void cp_landed_arrive(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// C consecutive floats (C = 2, 4, 8; 8 C-byte aligned) into another block's shared memory at
// shared::cluster address a, counted on that block's barrier at shared::cluster address bar as
// bytes when they land (st.async: no fence or arrival of the sender's is needed for them)
template <int C>
__device__ __forceinline__ void st_async(unsigned a, const float* v, unsigned bar) {
    if constexpr (C == 2) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                     ::"r"(a), "f"(v[0]), "f"(v[1]), "r"(bar) : "memory");
    } else {
#pragma unroll
        for (int i = 0; i < C; i += 4)
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                         ::"r"(a + 4 * i), "f"(v[i]), "f"(v[i + 1]), "f"(v[i + 2]), "f"(v[i + 3]), "r"(bar) : "memory");
    }
}
