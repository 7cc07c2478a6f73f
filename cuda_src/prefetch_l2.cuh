// prefetch_l2.cuh — bulk L2 prefetches (sm_90's cp.async.bulk.prefetch): one instruction asks L2
// for a range, with no register held for the data and no fault for what is never read.
#pragma once

// ask L2 for `bytes` (a multiple of 16) at p, 16-byte aligned
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// ask L2 for the 16-byte-aligned part of at most `cap` bytes from p of [p, p + count) floats, in
// pieces of 64 KB (the calling thread issues them all)
__device__ __forceinline__ void prefetch_l2_floats(const float* p, long long count, long long cap) {
    const unsigned long long a = ((unsigned long long)p + 15) & ~15ull;
    unsigned long long e = (unsigned long long)(p + count) & ~15ull;
    if (e > a + (unsigned long long)cap) e = (a + (unsigned long long)cap) & ~15ull;
    for (unsigned long long at = a; at < e; at += 65536ull) {
        const unsigned long long left = e - at;
        prefetch_l2_bulk(reinterpret_cast<const void*>(at), left < 65536ull ? (unsigned)left : 65536u);
    }
}
