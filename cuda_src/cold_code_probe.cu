// cold_code_probe.cu — what a kernel pays to run code that is not in the SM's instruction caches,
// or not in L2 either, for bench/probe_cold_code.py. A decode step's kernels stream more weight
// bytes than L2 holds, so each may start with its code in DRAM; a block that runs a stretch of code
// once (the last block's merge of split attention, bench/results/NOTES.md's twenty-fourth session)
// fetches it line by line.
//
// cold_chain<N>: N fused multiply-adds in one straight line (N distinct instructions, 16 bytes of
// SASS each, none repeated), in eight independent chains so that a warm warp issues about one a
// cycle; thread 0 of each block stamps the global timer at entry and exit.
//   grid=(blocks,) block=(32,); stamps[2 b], stamps[2 b + 1]: block b's entry and exit (ns)
// cold_chain<16383> is the probe's evictor: 256 KB of code that is none of the others'.
#include "timer.cuh"

#ifndef COLD_CHAINS
#define COLD_CHAINS 8
#endif

template <int N>
__global__ void __launch_bounds__(32) cold_chain(float* __restrict__ out, unsigned long long* __restrict__ stamps,
                                                 float a) {
    const unsigned long long t0 = global_ns();
    float x[COLD_CHAINS];
#pragma unroll
    for (int c = 0; c < COLD_CHAINS; ++c) x[c] = (float)(threadIdx.x + c);
    // a different immediate every step, so no two instructions are alike and none folds away
#pragma unroll
    for (int i = 0; i < N; ++i) x[i % COLD_CHAINS] = fmaf(x[i % COLD_CHAINS], a, (float)(i + 1));
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < COLD_CHAINS; ++c) s += x[c];
    out[blockIdx.x * 32 + threadIdx.x] = s;
    const unsigned long long t1 = global_ns();
    if (threadIdx.x == 0) {
        stamps[2 * blockIdx.x] = t0;
        stamps[2 * blockIdx.x + 1] = t1;
    }
}

#ifdef GLIMMER_INSTANTIATE
template __global__ void cold_chain<256>(float*, unsigned long long*, float);
template __global__ void cold_chain<1024>(float*, unsigned long long*, float);
template __global__ void cold_chain<1536>(float*, unsigned long long*, float);
template __global__ void cold_chain<2048>(float*, unsigned long long*, float);
template __global__ void cold_chain<3072>(float*, unsigned long long*, float);
template __global__ void cold_chain<4096>(float*, unsigned long long*, float);
template __global__ void cold_chain<16384>(float*, unsigned long long*, float);
template __global__ void cold_chain<16383>(float*, unsigned long long*, float);   // the evictor: other code
#endif
