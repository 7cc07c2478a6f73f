// dep_probe.cu — what a dependence between two kernels of a step costs, by how it is kept
// (bench/probe_dep_wait.py). A chain of launches of dep_link<MODE>: each block reads the whole
// vector the launch before wrote (n floats, as a one-row GEMV reads its input), sums it, and
// writes its own slice of the next vector, so every launch depends on every block of the one
// before. The modes keep that dependence differently:
//   0  griddepcontrol.wait, then let the next launch be scheduled (pdl_wait, the step's default);
//   1  let the next launch be scheduled first, then wait (pdl_release; pdl_wait_only: the
//      step's short kernels);
//   2  a counter a launch: each block, its slice written, adds 1 to its launch's counter with
//      release semantics; the next launch's blocks poll the counter of the one before (acquire)
//      until every block has added, instead of waiting for the grid to complete. The next launch is
//      scheduled once the wait is over, so at most two launches are resident;
//   3  a flag a block: each block, its slice written, stores the step's value into its own word of
//      its launch's flags with release semantics (no two blocks touch one word); the next
//      launch's threads poll the words of the one before in parallel (acquire), then meet at a
//      block barrier. Mode 2 without the atomics' contention on one word.
// Without the PDL launch attribute modes 0 and 1 are plain launches (the stream orders them);
// mode 2 needs the attribute, or its blocks would wait for a launch that has already completed
// (harmless) — it is timed only with it.
#include "pdl.cuh"

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

template <int MODE>
__global__ void __launch_bounds__(128) dep_link(float* __restrict__ out, const float* __restrict__ in, int n,
                                                unsigned* __restrict__ counters, int link, unsigned blocks_before) {
    __shared__ float part[4];
    if (MODE == 0) {
        pdl_wait_only();                     // pdl_wait(), spelled out: this source launches its
        pdl_release();                       // kernels itself and is not in PDL_SOURCES
    } else if (MODE == 1) {
        pdl_release();
        pdl_wait_only();
    } else if (MODE == 2) {
        if (threadIdx.x == 0 && link > 0)
            while (ld_acquire(counters + link - 1) < blocks_before) {}
        __syncthreads();
        pdl_release();
    } else {
        if (link > 0)
            for (unsigned b = threadIdx.x; b < blocks_before; b += blockDim.x)
                while (ld_acquire(counters + (long long)(link - 1) * blocks_before + b) == 0u) {}
        __syncthreads();
        pdl_release();
    }
    float s = 0.f;
    for (int i = threadIdx.x * 4; i < n; i += blockDim.x * 4) {
        const float4 v = *reinterpret_cast<const float4*>(in + i);
        s += (v.x + v.y) + (v.z + v.w);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    s = (part[0] + part[1]) + (part[2] + part[3]);
    const int per = (n + gridDim.x - 1) / gridDim.x;
    for (int i = blockIdx.x * per + threadIdx.x; i < min(n, (blockIdx.x + 1) * per); i += blockDim.x)
        out[i] = s * 1e-6f + (float)(i & 7);
    if (MODE >= 2) {
        __syncthreads();                     // the block's slice is written
        if (threadIdx.x == 0) {
            if (MODE == 2) red_release(counters + link, 1u);
            else st_release(counters + (long long)link * gridDim.x + blockIdx.x, 1u);
        }
    }
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void dep_link<0>(float*, const float*, int, unsigned*, int, unsigned);
template __global__ void dep_link<1>(float*, const float*, int, unsigned*, int, unsigned);
template __global__ void dep_link<2>(float*, const float*, int, unsigned*, int, unsigned);
template __global__ void dep_link<3>(float*, const float*, int, unsigned*, int, unsigned);
#endif
