// stamps.cuh — per-block timestamps for probes (bench/probe_attention_decode.py): compiled only with
// -DGLIMMER_STAMPS, when thread 0 of a block writes the global timer (ns, one clock for the whole
// GPU, so stamps of different kernels and SMs compare) at stage `i` into glimmer_stamps[block][i].
// Without the define STAMP is nothing, so the kernels that carry stamps are unchanged.
#pragma once
#include "timer.cuh"

#ifdef GLIMMER_STAMPS
constexpr int kStampBlocks = 4096, kStamps = 16;
__device__ unsigned long long glimmer_stamps[kStampBlocks][kStamps];
__device__ unsigned glimmer_smids[kStampBlocks];      // the SM of row b's stage 0
// thread 0 writes the global timer into glimmer_stamps[b][i] (rows past kStampBlocks are dropped),
// and at stage 0 its SM into glimmer_smids[b]
__device__ __forceinline__ void stamp_row(unsigned b, int i) {
    if (threadIdx.x == 0 && threadIdx.y == 0 && b < kStampBlocks) {
        glimmer_stamps[b][i] = global_ns();
        if (i == 0) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            glimmer_smids[b] = sm;
        }
    }
}
__device__ __forceinline__ unsigned stamp_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }
__device__ __forceinline__ void stamp(int i) { stamp_row(stamp_block(), i); }
#define STAMP(i) stamp(i)
// thread 0 stamps row b itself: a second kernel of a module keeps its stamps apart from the first's
#define STAMP_ROW(b, i) stamp_row((unsigned)(b), i)
// thread 0 writes v, a probe's own count or sum rather than a time, into this block's glimmer_stamps[b][i]
__device__ __forceinline__ void stamp_value(int i, unsigned long long v) {
    const unsigned b = stamp_block();
    if (threadIdx.x == 0 && threadIdx.y == 0 && b < kStampBlocks) glimmer_stamps[b][i] = v;
}
#define STAMP_VALUE(i, v) stamp_value(i, v)
// a kernel whose blocks take several work items stamps per item: STAMP_SLOT(s) names the row s of
// glimmer_stamps that this block's STAMP_AT(i) then write
__shared__ unsigned glimmer_stamp_slot;
__device__ __forceinline__ void stamp_at(int i) { stamp_row(glimmer_stamp_slot, i); }
#define STAMP_SLOT(s) do { if (threadIdx.x == 0 && threadIdx.y == 0) glimmer_stamp_slot = (unsigned)(s); } while (0)
#define STAMP_AT(i) stamp_at(i)
#else
#define STAMP(i) ((void)0)
#define STAMP_ROW(b, i) ((void)0)
#define STAMP_VALUE(i, v) ((void)0)
#define STAMP_SLOT(s) ((void)0)
#define STAMP_AT(i) ((void)0)
#endif
