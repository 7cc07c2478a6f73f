// pdl.cuh — programmatic dependent launch: a kernel may start while the one before it finishes.
//
// Inside a CUDA graph the runtime launches a step's kernels with programmatic stream serialization
// (kernels/build.py): the next kernel's blocks may be scheduled before this one completes, and
// run until they call pdl_wait(), which returns once every kernel before them has completed and
// its writes are visible. So every kernel calls pdl_wait() before it reads anything an earlier
// kernel wrote and before it writes anything (an earlier kernel may still read the old contents);
// only reads of data no kernel writes (weights) may come before it. After waiting, it lets the
// next kernel be scheduled. Without the launch attribute both are no-ops.
#pragma once

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
