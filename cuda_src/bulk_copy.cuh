// bulk_copy.cuh — sm_90's bulk-copy engine without a tensor map: a contiguous range of global
// memory copied into this block's shared memory, its completion counted in bytes on an mbarrier
// (PTX ISA: cp.async.bulk, mbarrier). No registers are held while the bytes are in flight.
//
//   mbar_init(bar, 1) by one thread, then mbar_init_fence() and a __syncthreads before any wait
//   mbar_expect(bar, bytes)   the issuing thread's arrival, and the bytes the phase waits for
//   mbar_arrive(bar)          an arrival with no bytes (a consumer giving a buffer back)
//   bulk_load(dst, src, bytes, bar)  16-byte aligned dst and src, bytes a multiple of 16
//   mbar_wait(bar, parity)    until the phase of that parity (0, 1, 0, ... per use) has completed
#pragma once
#include "cluster.cuh"

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
