// timer.cuh — the GPU's global timer (ns, one clock for every SM, so stamps of different kernels and
// blocks compare), for the probes' stamps.
#pragma once

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
