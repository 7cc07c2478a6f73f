// last_block.cuh — the last block of a grid to finish, found by a counter: the end of a split-K
// attention (attn_split.cuh) and the GEMVs with a norm tail (norm_row.cuh).
#pragma once

// Every thread of the block calls it after writing its results: true in the last of `active`
// blocks to get here for `counter`, which it sets back to 0 for the next launch (counters start
// at 0; launches that share them must not overlap). The other blocks' results are then in L2:
// read them with ld.cg (__ldcg), not through this SM's L1. leader: the one thread that counts.
__device__ __forceinline__ bool last_block(int* counter, int active, bool leader = threadIdx.x == 0) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (leader) {
        last = atomicAdd(counter, 1) == active - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    const bool mine = last;
    if (mine) __threadfence();
    return mine;
}
