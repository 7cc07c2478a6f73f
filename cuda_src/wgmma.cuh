// wgmma.cuh — the sm_90a PTX of warpgroup matrix multiplies (wgmma.mma_async): four consecutive warps
// (a warpgroup, its first warp's index a multiple of 4) multiply a 64-row A by a B in shared memory.
// Only compiled where the target has the architecture-specific features (__CUDA_ARCH_FEAT_SM90_ALL:
// NVRTC or nvcc with -arch=sm_90a; kernels/build.py compiles the modules of ARCH_SPECIFIC so).
//
// Register layouts (PTX ISA, "Register Fragments" of wgmma .m64nNk16), warp w of the warpgroup,
// lane = 4 g + t: the same as mma.sync m16n8k16's on the warp's rows 16 w .. 16 w + 15
// (attention_mma_frag.cuh), so the online softmax and the block end of the mma.sync kernels serve:
//   A (registers, bf16): a0 = (row g, k 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..)
//   D (float): d[j][0..1] = row g, columns 8 j + 2t, +1; d[j][2..3] = row g + 8, same columns.
//
// Shared layout (sw128_offset): a tile of R rows of 64 bf16 (128 bytes) per panel, the panels one
// after another, each row's eight 16-byte pieces in the order piece ^ (row % 8) (the 128-byte
// swizzle, which the hardware undoes from the address bits, so a tile starts on 1024 bytes). Read
// as B two ways:
//   K-major (rows are B's columns n, the 64 values along k): start at the row block's first row,
//     plus 32 bytes per k-step of 16 inside a panel; stride between 8-row groups (SBO) 1024;
//   N-major (rows are k, the 64 values along n, imm-trans-b = 1): start at the k-step's first row
//     (16 rows a k-step, 2048 bytes); SBO, between 8-row groups along k, 1024; LBO, between
//     64-wide panels along n, the panel's size.
#pragma once

namespace wg {

typedef unsigned int u32;
typedef unsigned long long u64;

// byte offset of bf16 value (row, col) in a swizzled tile of `rows` rows (a multiple of 8)
__host__ __device__ __forceinline__ u32 sw128_offset(int rows, int row, int col) {
    const int panel = col >> 6, piece = (col >> 3) & 7;
    return (u32)(panel * rows * 128 + row * 128 + ((piece ^ (row & 7)) << 4) + (col & 7) * 2);
}

// a shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle
__host__ __device__ __forceinline__ u64 sw128_desc(u32 smem_addr, u32 lbo, u32 sbo) {
    return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
           ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// the accumulators d[j0 .. j0 + 7][0..3] as in-out operands of a wgmma's asm, in register order
#define WG_ACC4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_ACC8(d, j0)                                                                                     \
    WG_ACC4(d, j0), WG_ACC4(d, j0 + 1), WG_ACC4(d, j0 + 2), WG_ACC4(d, j0 + 3), WG_ACC4(d, j0 + 4),        \
        WG_ACC4(d, j0 + 5), WG_ACC4(d, j0 + 6), WG_ACC4(d, j0 + 7)

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// shared memory written by this thread's ordinary stores or cp.async copies, made visible to the
// tensor cores' reads (the async proxy); then a barrier for the other threads' writes
__device__ __forceinline__ void fence_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The compiler may not move reads or writes of these registers across this point. After wait():
// an asynchronous multiply's accumulators are the tensor cores' until then. Before fence(): every
// write to an operand (zeroed or rescaled accumulators, A fragments) must be done before the fence,
// and the fence, having no operands, would not keep a register write from sinking past it.
template <int N>
__device__ __forceinline__ void hold(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[j][c])::"memory");
}
template <int N>
__device__ __forceinline__ void hold(u32 (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) asm volatile("" : "+r"(a[j][c])::"memory");
}
__device__ __forceinline__ void hold(u32 (&a)[4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+r"(a[c])::"memory");
}

// d (+)= a b: m64n64k16, a bf16 from registers, b bf16 from shared memory through `desc`, float
// accumulators; accumulate = 0 overwrites d. TB: b N-major (1) or K-major (0).
template <int TB>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], const u32 (&a)[4], u64 desc, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %37, p, 1, 1, %38;\n}\n"
        : WG_ACC8(d, 0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc), "n"(TB));
}

// The shapes bench/probe_wgmma_tile.py measures (wgmma_probe.cu): d += a b with a and b bf16 from
// shared memory (SS, both K-major), m64n128k16 and m64n256k16; and m64n128k16 with a from registers
// (b K-major, or N-major: TB = 1, two 64-wide panels LBO apart).
__device__ __forceinline__ void mma_ss(float (&d)[16][4], u64 desc_a, u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC8(d, 0), WG_ACC8(d, 8)
        : "l"(desc_a), "l"(desc_b));
}
__device__ __forceinline__ void mma_ss(float (&d)[32][4], u64 desc_a, u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC8(d, 0), WG_ACC8(d, 8), WG_ACC8(d, 16), WG_ACC8(d, 24)
        : "l"(desc_a), "l"(desc_b));
}
template <int TB = 0>
__device__ __forceinline__ void mma_rs_n128(float (&d)[16][4], const u32 (&a)[4], u64 desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
        : WG_ACC8(d, 0), WG_ACC8(d, 8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(TB));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace wg
