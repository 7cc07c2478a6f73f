// pdl.cuh — programmatic dependent launch: a kernel may start while the one before it finishes.
//
// Inside a CUDA graph the runtime launches a step's kernels with programmatic stream serialization
// (kernels/launch.py): the next kernel's blocks may be scheduled before this one completes, and
// run until they call pdl_wait(), which returns once every kernel before them has completed and
// its writes are visible. So every kernel calls pdl_wait() before it reads anything an earlier
// kernel wrote and before it writes anything (an earlier kernel may still read the old contents);
// only reads of data no kernel writes (weights) may come before it. After waiting, it lets the
// next kernel be scheduled. Without the launch attribute both are no-ops.
#pragma once
#include "timer.cuh"

// Ask for a 128-byte line of data no kernel of the step writes (weights, or what the step's upload
// copied) before waiting: into L2, or into this SM's L1 for data this thread reads itself. Holds no
// register, unlike a load, and never faults.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" :: "l"(p)); }

// L2 prefetch ranges passed by value (ops/prefetch.py): up to kPrefetchRanges (address, bytes)
// pairs of weights, both multiples of 16, bytes 0 for an unused pair
constexpr int kPrefetchRanges = 3;
#define L2_PREFETCH_ARGS                                                                                     \
    unsigned long long pf_addr0, unsigned long long pf_bytes0, unsigned long long pf_addr1,                   \
        unsigned long long pf_bytes1, unsigned long long pf_addr2, unsigned long long pf_bytes2
#define L2_PREFETCH_TYPES \
    unsigned long long, unsigned long long, unsigned long long, unsigned long long, unsigned long long, unsigned long long
#define L2_PREFETCH_PASS pf_addr0, pf_bytes0, pf_addr1, pf_bytes1, pf_addr2, pf_bytes2

// Lane `lane` of one warp of each of `blocks` blocks (this one is `block`) asks for its share of
// every range to be brought into L2 by bulk prefetches (cp.async.bulk.prefetch.L2, sm_90): for a
// latency-bound kernel whose memory system is idle, so that the matmuls after it read weights
// from L2. Data no kernel writes only, so it may come before pdl_wait; nothing waits for it and
// no register is held.
__device__ __forceinline__ void prefetch_l2_share(int lane, long long block, long long blocks, L2_PREFETCH_ARGS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long addr[kPrefetchRanges] = {pf_addr0, pf_addr1, pf_addr2};
    const unsigned long long bytes[kPrefetchRanges] = {pf_bytes0, pf_bytes1, pf_bytes2};
    const unsigned long long pieces = (unsigned long long)blocks * 32ull;
    const unsigned long long me = (unsigned long long)block * 32ull + (unsigned long long)lane;
#pragma unroll
    for (int r = 0; r < kPrefetchRanges; ++r) {
        const unsigned long long units = bytes[r] >> 4;            // 16-byte units
        const unsigned long long per = (units + pieces - 1) / pieces;
        const unsigned long long u0 = me * per;
        if (u0 < units) {
            const unsigned size = (unsigned)((units - u0 < per ? units - u0 : per) << 4);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr[r] + (u0 << 4)), "r"(size) : "memory");
        }
    }
#endif
}

// Let the next kernel be scheduled now, before this one waits: for the short kernels between the
// long ones (norms, the gated activation, prepare_qkv), whose successor has its own work before
// pdl_wait (a GEMV's weight loads, attention's index reads and old K/V rows), so that work overlaps
// the kernel this one waits for instead of following this one's short run. Safe for the same
// reason as the early reads: the successor's pdl_wait still waits for this kernel, which completes
// only after its own wait; and a kernel's dependents launch only once all its blocks have started,
// so the blocks of the kernels before are resident and never wait for room behind them.
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#ifdef GLIMMER_STAMPS
// A launch log for bench/probe_decode_stamps.py, compiled only with -DGLIMMER_STAMPS: thread 0 of
// block 0 of every launch notes when its wait returned (the global timer, ns: the moment every
// kernel before it had completed), its grid and its block shape, in a ring of kLogLaunches per module.
constexpr unsigned kLogLaunches = 4096;
__device__ unsigned glimmer_log_n;
__device__ unsigned long long glimmer_log[kLogLaunches][3];
__device__ __forceinline__ void log_wait() {
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) != 0) return;
    const unsigned i = atomicAdd(&glimmer_log_n, 1u) % kLogLaunches;
    glimmer_log[i][0] = global_ns();
    glimmer_log[i][1] = gridDim.x | (unsigned long long)gridDim.y << 24 | (unsigned long long)gridDim.z << 44;
    glimmer_log[i][2] = blockDim.x | (unsigned long long)blockDim.y << 16 | (unsigned long long)blockDim.z << 32;
}
#else
__device__ __forceinline__ void log_wait() {}
#endif

// pdl_wait without letting the next kernel be scheduled: for a kernel that does that itself later
// (pdl_release), or at its exit
__device__ __forceinline__ void pdl_wait_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    log_wait();
#endif
}

__device__ __forceinline__ void pdl_wait() {
    pdl_wait_only();
    pdl_release();
}
