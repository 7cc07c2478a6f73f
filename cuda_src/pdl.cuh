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

// Ask for a 128-byte line of data no kernel of the step writes (weights, or what the step's upload
// copied) before waiting: into L2, or into this SM's L1 for data this thread reads itself. Holds no
// register, unlike a load, and never faults.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" :: "l"(p)); }

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

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
