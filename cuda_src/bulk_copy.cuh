// bulk_copy.cuh — one thread's bulk copy of contiguous global bytes into this block's shared memory
// (cp.async.bulk, the copy engine of sm_90), completing on an mbarrier of the block: the thread
// announces the bytes (expect_tx) and issues the copy; the block's threads wait for the phase.
#pragma once

#include "cluster.cuh"

// the barrier's current phase expects `bytes` more, and this thread's arrival
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from src to shared address dst,
// counted on bar when they land
__device__ __forceinline__ void bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// until the block's barrier has completed the phase of the given parity
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    const unsigned a = smem_addr(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(a), "r"(parity) : "memory");
}
