// mma_ws.cu — y = x · Wᵀ for many rows of x (prefill-sized M) and W in Q4_K on Hopper's warpgroup
// multiplies with both operands in shared memory (wgmma SS, sm_90a), the warps specialised: one
// warpgroup copies x and decodes W into shared memory, two multiply. No scratch copy of W in global
// memory: each weight byte is read from L2 once per block of x rows.
//
// ws_tile_kernel  x (M, K) float32 -> xi, x as bf16 in the stages' shared-memory images: per 128
//                  rows of x (the last tile's rows past M zeros) and chunk of 64 values, 16 KB in the
//                  128-byte swizzle of wgmma.cuh, within each 8 values in the order 0, 2, 1, 3, 4, 6,
//                  5, 7 (the order the decode leaves W's values in, below). One thread a group of 8.
//                  grid=(ceil(M' K / 8 / 256),) block=(256,), M' = M rounded up to 128
// mma_ws_kernel<kStages, kAhead>  y (M, N) float32 from xi and W's blocks (144 bytes a super-block, rows
//     16-byte aligned). A block: 128 rows of x by 128 rows of W, 512 threads.
//     grid=(ceil(M / 128), ceil(N / 128)) block=(512,) dynamic shared memory ops.matmul.mma_ws_smem(kStages, kAhead).
//
// K is walked in chunks of 64 values (a quarter super-block: sub-blocks 2 q and 2 q + 1, whose codes
// are the low and high nibbles of the 32 code bytes 32 q .. 32 q + 31). Per chunk, a stage holds
// x's 128 rows and W's 128 rows of it as bf16 in the 128-byte swizzle (one panel each, 16 KB).
// Warpgroups 0 and 1 produce, chunks c = h, h + 2, ... for warpgroup h; for chunk c:
//   wait for the stage's empty barrier; thread 0 copies x's image of the chunk into it (one bulk
//   copy, counted on the stage's full barrier); each thread copies its row's raw W of its chunk
//   kAhead chunks on (the header and the chunk's 32 code bytes) into its ring of kAhead + 1 slots,
//   decodes chunk c's (landed: cp.async.wait_group kAhead) into d·sc·q − dmin·m as bf16 pairs,
//   stores its row of the stage's W panel; each warp then arrives once on full (an arrival a
//   thread, 128 on one barrier word a chunk, set the pace: bench/results/NOTES.md).
// Warpgroups 2 and 3 multiply x rows 0..63 and 64..127 of the tile: per chunk, the full barrier's
// phase, four m64n128k16 (A = x, B = W, both K-major), a commit; after waiting for the group before,
// one arrival a warp on that chunk's empty barrier. The producers run kStages chunks ahead.
//
// The decode, per code word (bytes b0..b3) of a sub-block of scale S = d·sc and min M = dmin·m:
// (128 + q) as bf16 pairs (b0, b2) and (b1, b3) by one lop3 (q4k_lanes.cuh's nib_pair), times S
// less 128 S in one bf16 fma (exact but for the product's rounding: q S), then less M: so a
// 16-byte piece holds values 0, 2, 1, 3, 4, 6, 5, 7 of its 8, and x is laid out in that order.
// Error against the float64 product: W's values rounded to bf16 twice (q S, then q S − M), x once,
// float32 accumulation.
#include "attn_mma_ptx.cuh"
#include "cluster.cuh"
#include "pdl.cuh"
#include "q4k_lanes.cuh"
#include "wgmma.cuh"

namespace wsq {

typedef unsigned int u32;
typedef unsigned long long u64;
constexpr int kTile = 128;                    // rows of x and of W a block
constexpr u32 kPanel = kTile * 128;           // one operand's chunk: 128 rows of 64 bf16
constexpr u32 kStage = 2 * kPanel;            // x, then W
constexpr u32 kRawRow = 48;                   // a row's raw chunk: 16 header bytes, 32 code bytes
constexpr u32 kRawSlot = kTile * kRawRow;     // a producer's ring: kAhead + 1 of these

}  // namespace wsq

extern "C" __global__ void __launch_bounds__(256)
ws_tile_kernel(unsigned short* __restrict__ xi, const float* __restrict__ x, int m, int k) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = k >> 3;
    const long long row = i / per_row;
    if (row >= ((m + wsq::kTile - 1) / wsq::kTile) * (long long)wsq::kTile) return;
    const int g = (int)(i - row * per_row), c = g >> 3, piece = g & 7;
    const int tile = (int)(row / wsq::kTile), r = (int)(row % wsq::kTile);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < m) {
        const float4* src = reinterpret_cast<const float4*>(x + row * k + 8 * g);
        const float4 a = src[0], b = src[1];
        v = make_uint4(dq::pack2(a.x, a.z), dq::pack2(a.y, a.w), dq::pack2(b.x, b.z), dq::pack2(b.y, b.w));
    }
    const long long at = (((long long)tile * (k >> 6) + c) * wsq::kPanel + r * 128 + ((piece ^ (r & 7)) << 4)) / 16;
    reinterpret_cast<uint4*>(xi)[at] = v;
}

// scale and min (6 bits each) of sub-block j of a Q4_K header's 12 scale bytes (y, z, w of hdr):
// gguf's get_scale_min_k4
__device__ __forceinline__ void scale_min(const uint4& hdr, int j, int& sc, int& mn) {
    const unsigned lo = j < 4 ? hdr.y : hdr.z;             // bytes j (j < 4) or j (4 <= j < 8)
    const int b = (int)((lo >> (8 * (j & 3))) & 0xFFu);
    if (j < 4) {
        sc = b & 63;
        mn = (int)((hdr.z >> (8 * j)) & 63u);
    } else {
        const int hi = (int)((hdr.w >> (8 * (j & 3))) & 0xFFu);     // byte 8 + (j - 4)
        const int top_s = (int)((hdr.y >> (8 * (j & 3))) & 0xFFu);  // byte j - 4
        sc = (hi & 0xF) | ((top_s >> 6) << 4);
        mn = (hi >> 4) | ((b >> 6) << 4);
    }
}

template <int kStages, int kAhead, int kProbe = 0>
__global__ void __launch_bounds__(4 * 128, 1)
mma_ws_kernel(float* __restrict__ y, const unsigned short* __restrict__ xi, const unsigned char* __restrict__ w,
              int m, int n, int k, long long row_bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace wsq;
    constexpr int kRawSlots = kAhead + 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned long long full[kStages], empty[kStages];
    const u32 base = (amma::smem_u32(smem_raw) + 1023u) & ~1023u;   // swizzled tiles start on 1024 bytes
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int m0 = blockIdx.x * kTile, n0 = blockIdx.y * kTile;
    const int chunks = k >> 6;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 4 + 1);               // the producer's warps (W rows), its x copy
            mbar_init(&empty[s], 8);                  // each multiplying warp
        }
    }
    __syncthreads();

    if (warp < 8) {
        // ------------------------------------------------------------------ producer h: thread p
        const int h = warp >> 2, p = tid & 127;
        const unsigned char* wrow = w + (long long)min(n0 + p, n - 1) * row_bytes;
        const u32 raw_row = base + kStages * kStage + h * (kRawSlots * kRawSlot) + p * kRawRow;
        // local chunk j is chunk 2 j + h
        auto raw_copy = [&](int j) {                  // its header and codes of row p
            const int c = 2 * j + h;
            if (c < chunks) {
                const unsigned char* blk = wrow + (long long)(c >> 2) * dq::kBlockBytes;
                const u32 d = raw_row + (j % kRawSlots) * kRawSlot;
                amma::cp_async16(d, blk, 16);
                amma::cp_async16(d + 16, blk + 16 + 32 * (c & 3), 16);
                amma::cp_async16(d + 32, blk + 32 + 32 * (c & 3), 16);
            }
            amma::cp_commit();
        };
#pragma unroll
        for (int j = 0; j < kAhead; ++j) raw_copy(j);  // W is no kernel's output
        pdl_wait();                                   // x is the tile kernel's output
        const unsigned char* ximg = reinterpret_cast<const unsigned char*>(xi) + (long long)blockIdx.x * chunks * kPanel;
        const u32 wdst = p * 128;
        for (int j = 0; 2 * j + h < chunks; ++j) {
            const int c = 2 * j + h, s = c % kStages;
            mbar_wait(&empty[s], ((c / kStages) & 1) ^ 1);
            const u32 st = base + s * kStage;
            if (kProbe == 2 || kProbe == 4) {
                if (p == 0) mbar_arrive(&full[s]);
            } else if (p == 0) {
                mbar_expect_tx(&full[s], kPanel);
                bulk_g2s(st, ximg + (long long)c * kPanel, kPanel, &full[s]);
            }
            raw_copy(j + kAhead);
            amma::cp_wait<kAhead>();                  // chunk c's raw bytes (this thread's own)
            if (kProbe == 1 || kProbe == 4) {
                __syncwarp();
                if (lane == 0) mbar_arrive(&full[s]);
                continue;
            }
            const u32 r = raw_row + (j % kRawSlots) * kRawSlot;
            uint4 hdr, q0, q1;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(hdr.x), "=r"(hdr.y), "=r"(hdr.z), "=r"(hdr.w) : "r"(r));
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(q0.x), "=r"(q0.y), "=r"(q0.z), "=r"(q0.w) : "r"(r + 16));
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(q1.x), "=r"(q1.y), "=r"(q1.z), "=r"(q1.w) : "r"(r + 32));
            const float d = gguf::half_to_float(hdr.x & 0xFFFFu), dmin = gguf::half_to_float(hdr.x >> 16);
            u32 s2[2], c2[2], m2[2];
#pragma unroll
            for (int u = 0; u < 2; ++u) {             // sub-block 2 q + u: the low (u = 0) or high nibbles
                int sc, mn;
                scale_min(hdr, 2 * (c & 3) + u, sc, mn);
                const float sv = d * (float)sc;
                s2[u] = dq::pack2(sv, sv);
                c2[u] = dq::pack2(-128.f * sv, -128.f * sv);
                const float mv = -dmin * (float)mn;
                m2[u] = dq::pack2(mv, mv);
            }
            const u32 words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            const u32 wst = st + kPanel + wdst;
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int pc = 0; pc < 4; ++pc) {      // piece 4 u + pc: values 32 u + 8 pc .. + 7
                    u32 v[4];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const u32 wd = words[2 * pc + e] >> (4 * u);
                        v[2 * e] = dq::fma2(dq::fma2(dq::nib_pair(wd), s2[u], c2[u]), 0x3F803F80u, m2[u]);
                        v[2 * e + 1] = dq::fma2(dq::fma2(dq::nib_pair(wd >> 8), s2[u], c2[u]), 0x3F803F80u, m2[u]);
                    }
                    const int piece = 4 * u + pc;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                                 ::"r"(wst + ((piece ^ (p & 7)) << 4)), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
                }
            wg::fence_smem();                         // the stores, to the tensor cores' reads
            __syncwarp();                             // the warp's rows stored: one arrival a warp
            if (lane == 0) mbar_arrive(&full[s]);
        }
        amma::cp_wait<0>();
    } else {
        // ------------------------------------------------------------------ two multiplying warpgroups
        const int ci = (warp >> 2) - 2;               // x rows 64 ci .. 64 ci + 63
        float acc[16][4];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        for (int c = 0; c < chunks; ++c) {
            const int s = c % kStages;
            mbar_wait(&full[s], (c / kStages) & 1);
            if (kProbe != 3) wg::fence_smem();
            const u32 st = base + s * kStage;
            const u64 da = wg::sw128_desc(st + ci * 64 * 128, 16, 1024), db = wg::sw128_desc(st + kPanel, 16, 1024);
            wg::hold(acc);
            wg::fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) wg::mma_ss_n128(acc, da + 2 * ks, db + 2 * ks);   // 32 bytes a k-step
            wg::commit();
            wg::wait<1>();
            if (c > 0 && lane == 0) mbar_arrive(&empty[(c - 1) % kStages]);
        }
        wg::wait<0>();
        wg::hold(acc);
        pdl_wait();
        // D fragments: acc[j] = (x row 16 w + g, W rows 8 j + 2 t, + 1), (x row + 8, the same)
        const int g = lane >> 2, t = lane & 3;
        const int xr = m0 + 64 * ci + 16 * (warp & 3) + g;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int wr = n0 + 8 * j + 2 * t;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int row = xr + 8 * hr;
                if (row >= m) continue;
                float* dst = y + (long long)row * n + wr;
                if ((n & 1) == 0 && wr + 1 < n) {
                    *reinterpret_cast<float2*>(dst) = make_float2(acc[j][2 * hr], acc[j][2 * hr + 1]);
                } else {
                    if (wr < n) dst[0] = acc[j][2 * hr];
                    if (wr + 1 < n) dst[1] = acc[j][2 * hr + 1];
                }
            }
        }
    }
#endif
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_WS(S, A, P) template __global__ void mma_ws_kernel<S, A, P>(float*, const unsigned short*, \
                                                                      const unsigned char*, int, int, int, long long);
MMA_WS(4, 2, 0) MMA_WS(4, 4, 0) MMA_WS(4, 6, 0) MMA_WS(3, 6, 0) MMA_WS(4, 6, 1) MMA_WS(4, 6, 3) MMA_WS(4, 2, 1) MMA_WS(4, 2, 4)
#endif
