// mma_wg.cu — y = x · Wᵀ for many rows of x (prefill-sized M) and W in Q4_K, on Hopper's warpgroup
// multiplies (wgmma, sm_90a; the PTX in wgmma.cuh), W decoded in registers straight into the A
// fragments. No scratch copy of W: each weight byte is read from L2 once per block of x rows.
//
// wg_stage_q4k_kernel  x (M, K) float32 -> xp (M, K) bf16 and xs (M, K / 16) bf16, the B side laid out
//     for the lanes' order of K: each super-block's 256 values of x permuted as the A fragments hold
//     the weights (below), and the sums of x over its sixteen (sub-block, half) slots, the mins'
//     sixteen-deep product. One thread a slot (16 values).   grid=(ceil(M K / 16 / 256),) block=(256,)
// mma_wg_kernel<KS, kZero>  y (M, N) float32 from xp, xs and W's blocks (144 bytes a super-block, rows
//     16-byte aligned). A block is two warpgroups: 128 rows of W (64 a warpgroup, warp w of it rows
//     16 w .. 16 w + 15) by 128 rows of x (two n64 halves); with KS > 1 a cluster of KS blocks along
//     z shares one such tile, each block a KS-th of K (for launches of few tiles).
//     grid=(ceil(M / 128), ceil(N / 128), KS) block=(256,) dynamic shared memory kStages * kStage + 1024.
//
// The order of K. Per warp, a wgmma's A fragments are those of mma.sync m16n8k16 on its 16 rows, so
// mma_dq's lanes serve unchanged (q4k_lanes.cuh, described in mma_dq.cu): in k-step s = 8 h + 2 i + u
// of a super-block, lane t holds for k' = 16 s + 8 b + 2 t + e (b, e in {0, 1}) the weight of value
//     64 (2 h + t / 2) + 32 u + 16 (t & 1) + 4 i + 2 e + b,
// so xp holds x's value there at position k'. The mins' step: slot 8 h + 2 t + e holds -dmin * m of
// sub-block 2 (2 h + t / 2) + e, and xs the sum of x over values 64 (2 h + t / 2) + 32 e + 16 (t & 1)
// .. + 15 (the slot's half of that sub-block). tests/test_mma_wg_layout.py checks both against the
// order mma_dq stages x in, which tests/test_mma_dq_frag.py multiplies to gguf's product.
//
// Per super-block and block: both stages' tiles arrive by cp.async (16-byte pieces) in the
// 128-byte-swizzled layout of wgmma.cuh: x's 256 values in four 64-wide panels, the 16 slot sums in
// the first 16 columns of a fifth; stage s + 1 is copied while stage s is multiplied, its copies
// issued two a thread after each k-step pair's multiplies (with the tensor pipe busy; issued all
// at once after the block's barrier, where neither warpgroup multiplies, the kernel was 3-15%
// slower on most shapes: bench/results/ab_mma_wg_spread_7e0fb78.txt). Each lane loads its two
// rows' header and codes of the next super-block into registers while this one is multiplied (W is
// no kernel's output: the first super-block's loads go out before pdl_wait). Per warpgroup a
// super-block is 17 k-steps (the mins' first), each two wgmma m64n64k16 (A from registers, B = the
// x tile read K-major), in commit groups of two k-steps, at most two in flight.
// Error against the float64 product: x and W rounded to bf16, float32 accumulation (mma_dq's).
// Speed on the H200 and what limits it (the tensor pipe about half busy): bench/results/NOTES.md,
// seventeenth and eighteenth sessions.
#include "attn_mma_ptx.cuh"
#include "cluster.cuh"
#include "pdl.cuh"
#include "q4k_lanes.cuh"
#include "wgmma.cuh"

namespace wgq {

typedef unsigned int u32;
typedef unsigned long long u64;
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kRowsW = 128;                   // rows of W a block
constexpr int kRowsX = 128;                   // rows of x a block
constexpr u32 kPanel = kRowsX * 128;          // one 64-wide panel of the x tile
constexpr u32 kHalf = 64 * 128;               // the second n64 half of a panel starts 64 rows in
constexpr u32 kStage = 5 * kPanel;            // 4 panels of values, 1 of slot sums
constexpr int kStages = 2;                    // stage sb in sb & 1

}  // namespace wgq

// Slot sg of a super-block of x, its four float4 of values given by load(i): put(kk, pair) for each
// bf16 pair, at position kk + 2 t in the super-block's lanes' order (t = slot_lane(sg)), and their
// sum returned, as both stage kernels lay them out.
template <class Load, class Put>
__device__ __forceinline__ float stage_slot(int sg, Load load, Put put) {
    const int h = sg >> 3, u = sg & 1;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 v = load(i);
        s += (v.x + v.y) + (v.z + v.w);
        const int kk = 16 * (8 * h + 2 * i + u);              // k-step 8 h + 2 i + u, b = 0
        put(kk, dq::pack2(v.x, v.z));                         // e = 0, 1
        put(kk + 8, dq::pack2(v.y, v.w));                     // b = 1
    }
    return s;
}

// the lane t whose fragments hold slot sg's values
__device__ __forceinline__ int slot_lane(int sg) { return (sg >> 1) & 3; }

// where slot sg's values start in a super-block of x
__device__ __forceinline__ int slot_first(int sg) {
    const int h = sg >> 3, t = (sg >> 1) & 3, u = sg & 1;
    return 64 * (2 * h + (t >> 1)) + 32 * u + 16 * (t & 1);
}

// One thread per (row of x, super-block, slot): its 16 values into their places in xp, their sum
// into xs.
extern "C" __global__ void __launch_bounds__(256)
wg_stage_q4k_kernel(unsigned short* __restrict__ xp, unsigned short* __restrict__ xs, const float* __restrict__ x,
                    int m, int k) {
    pdl_wait();
    const long long slot = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = k >> 4;
    if (slot >= (long long)m * per_row) return;
    const long long row = slot / per_row;
    const int c = (int)(slot - row * per_row), sb = c >> 4, sg = c & 15;
    dq::u32* dst = reinterpret_cast<dq::u32*>(xp + row * k + 256 * sb + 2 * slot_lane(sg));
    const float4* src = reinterpret_cast<const float4*>(x + row * k + 256 * sb + slot_first(sg));
    const float s = stage_slot(sg, [&](int i) { return src[i]; }, [&](int kk, dq::u32 pair) { dst[kk / 2] = pair; });
    xs[row * per_row + c] = (unsigned short)(dq::pack2(s, 0.f) & 0xFFFFu);
}

// KS > 1: the super-blocks split over the KS blocks of a cluster along z, each block's partial
// tile summed by the cluster through shared memory in rank order (the same bits on every run).
// kZero: rows of x past M copied as zeros (cp.async of no source bytes) rather than clamped to row
// M - 1, whose repeated reads of the same lines slow a partial tile (bench/ab_mma_wg.py measures both).
template <int KS, bool kZero, int kProbe = 0>
__global__ void __cluster_dims__(1, 1, KS) __launch_bounds__(256, 1)
mma_wg_kernel(float* __restrict__ y, const unsigned short* __restrict__ xp, const unsigned short* __restrict__ xs,
              const unsigned char* __restrict__ w, int m, int n, int k, long long row_bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace wgq;
    static_assert(kStages == 2, "the loop alternates two stages");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 raw = amma::smem_u32(smem_raw);
    const u32 base = (raw + 1023u) & ~1023u;          // swizzled tiles start on 1024 bytes
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wgi = warp >> 2, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * kRowsX, n0 = blockIdx.y * kRowsW;
    const int nsb = k >> 8, per_row = k >> 4;
    const int s0 = (int)blockIdx.z * nsb / KS, s1 = ((int)blockIdx.z + 1) * nsb / KS;   // this split's super-blocks
    const int r0 = n0 + 64 * wgi + 16 * (warp & 3) + g;             // this lane's rows r0, r0 + 8 of W
    const unsigned char* rows[2] = {w + (long long)min(r0, n - 1) * row_bytes,
                                    w + (long long)min(r0 + 8, n - 1) * row_bytes};

    dq::RowBytes cur[2], nxt[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) dq::load_row(cur[r], rows[r] + (long long)s0 * dq::kBlockBytes, t);
    pdl_wait();                                       // x is the stage kernel's output

    // the copies of a stage: xp rows prow + 8 j (j < 16) at 16-byte piece c8 of 32, and one xs piece
    const int prow = tid >> 5, c8 = tid & 31;
    const u32 xdst = (c8 >> 3) * kPanel + prow * 128 + (((c8 & 7) ^ (prow & 7)) << 4);
    const int srow = tid >> 1, sc8 = tid & 1;
    const u32 sdst = 4 * kPanel + srow * 128 + ((sc8 ^ (srow & 7)) << 4);
    const unsigned short* ssrc = xs + (long long)min(m0 + srow, m - 1) * per_row + 8 * sc8;
    const int sbytes = (kZero && m0 + srow >= m) ? 0 : 16;
    // part p < 8 of a stage's copies: xp rows j = 2 p, 2 p + 1 (and the xs piece with part 0)
    auto issue_part = [&](int sb, int st, int p) {
        if constexpr ((kProbe & 2) != 0) return;      // probe: no x copies
        const u32 d = base + st * kStage;
#pragma unroll
        for (int j = 2 * p; j < 2 * p + 2; ++j) {
            const int row = m0 + prow + 8 * j;
            amma::cp_async16(d + xdst + j * 1024, xp + (long long)min(row, m - 1) * k + 256 * sb + 8 * c8,
                             (kZero && row >= m) ? 0 : 16);
        }
        if (p == 0) amma::cp_async16(d + sdst, ssrc + 16 * sb, sbytes);
    };

    float acc[2][8][4];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[hf][j][0] = acc[hf][j][1] = acc[hf][j][2] = acc[hf][j][3] = 0.f;
    // the A fragments a of one k-step times both halves of the x tile at descriptor d (a k-step's
    // columns); a descriptor's start field is the address / 16, so an offset inside the tile adds
    // offset / 16 to it (no carry: shared addresses stay below 256 KB)
    auto step = [&](const u32 (&a)[4], u64 d) {
        wg::mma_rs<0>(acc[0], a, d, 1);
        wg::mma_rs<0>(acc[1], a, d + (kHalf >> 4), 1);
    };

    // the mins' k-step and the 16 others of super-block sb from the W registers cur and the stage at
    // shared address sa; pre(p) after k-step pair p's commit
    auto multiply = [&](u32 sa, auto&& pre) {
        const u64 dx = wg::sw128_desc(sa, 16, 1024);
        dq::RowScales sc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) dq::row_scales(sc[r], cur[r].hdr, t);
        {
            u32 a[4] = {sc[0].mn[0], sc[1].mn[0], sc[0].mn[1], sc[1].mn[1]};
            wg::hold(acc[0]);
            wg::hold(acc[1]);
            wg::hold(a);
            wg::fence();
            step(a, dx + ((4 * kPanel) >> 4));        // the mins: slot sums in the fifth panel's k-step 0
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                u32 lo0[4], hi0[4];                   // k-steps s = 8 h + 2 i (low nibbles) and s + 1 (high)
                if constexpr ((kProbe & 1) != 0) {    // probe: no decode (nor W loads)
#pragma unroll
                    for (int c = 0; c < 4; ++c) lo0[c] = hi0[c] = 0x3F803F80u + 2 * (4 * h + i) + c;
                } else {
                    dq::decode_word((&cur[0].q[h].x)[i], sc[0], 2 * h, lo0[0], lo0[2], hi0[0], hi0[2]);
                    dq::decode_word((&cur[1].q[h].x)[i], sc[1], 2 * h, lo0[1], lo0[3], hi0[1], hi0[3]);
                }
                wg::hold(lo0);
                wg::hold(hi0);
                wg::fence();
                const int s = 8 * h + 2 * i;
                step(lo0, dx + (((s >> 2) * kPanel + (s & 3) * 32) >> 4));
                step(hi0, dx + ((((s + 1) >> 2) * kPanel + ((s + 1) & 3) * 32) >> 4));
                wg::commit();
                pre(4 * h + i);
                wg::wait<1>();
            }
    };
    auto next_w = [&](int sb) {
        if constexpr (!(kProbe & 1)) {
#pragma unroll
            for (int r = 0; r < 2; ++r) dq::load_row(nxt[r], rows[r] + (long long)sb * dq::kBlockBytes, t);
        }
    };

#pragma unroll
    for (int p = 0; p < 8; ++p) issue_part(s0, s0 & 1, p);
    amma::cp_commit();
#pragma unroll 1
    for (int sb = s0; sb < s1; ++sb) {
        const int st = sb & 1;
        if constexpr (!(kProbe & 4)) {            // (probe 4: no stage hand-over; only without copies)
            amma::cp_wait<0>();
            wg::fence_smem();
            __syncthreads();                      // stage st landed; every warpgroup is done with st ^ 1
        }
        const bool more = sb + 1 < s1;
        if (more) next_w(sb + 1);
        // the next stage, a part a k-step pair
        multiply(base + st * kStage, [&](int p) { if (more) issue_part(sb + 1, st ^ 1, p); });
        amma::cp_commit();
        if constexpr (!(kProbe & 4)) wg::wait<0>();
        wg::hold(acc[0]);
        wg::hold(acc[1]);
        if (more && !(kProbe & 1)) {
#pragma unroll
            for (int r = 0; r < 2; ++r) cur[r] = nxt[r];
        }
    }

    // D fragments: acc[hf][j] = (W row r0, x rows 64 hf + 8 j + 2 t, + 1), (W row r0 + 8, the same)
    if constexpr (KS == 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int xr = m0 + 64 * hf + 8 * j + 2 * t + (c & 1), wr = r0 + 8 * (c >> 1);
                    if (xr < m && wr < n) y[(long long)xr * n + wr] = acc[hf][j][c];
                }
    } else {
        // the partial tile over stage 0, (x row, W row) at x row * kLd + W row (kLd = 132: a store's
        // 32 lanes, x rows 2 t and W rows g, fall on 32 banks)
        constexpr int kLd = kRowsW + 4;
        float* part = reinterpret_cast<float*>(smem_raw + (base - raw));
        amma::cp_commit();                            // with the wait: every copy (an empty split's first stage)
        amma::cp_wait<0>();                           // lands before part overwrites it
        __syncthreads();                              // both warpgroups are done reading the stages
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    part[(64 * hf + 8 * j + 2 * t + (c & 1)) * kLd + (r0 - n0) + 8 * (c >> 1)] = acc[hf][j][c];
        cluster_sync();
        // rank q adds x rows [q kRowsX / KS, (q + 1) kRowsX / KS) over the ranks in order, four W rows a thread
        const int rank = (int)cluster_rank();
        constexpr int kShare = kRowsX / KS * kRowsW / 4;
        const u32 local = smem_addr(part);
        for (int idx = tid; idx < kShare; idx += kThreads) {
            const int xl = rank * (kRowsX / KS) + idx / (kRowsW / 4), wl = 4 * (idx % (kRowsW / 4));
            const u32 off = 4u * (xl * kLd + wl);
            float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int q = 0; q < KS; ++q) {
                float4 v;
                asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                             : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(map_rank(local + off, q)) : "memory");
                s.x += v.x;
                s.y += v.y;
                s.z += v.z;
                s.w += v.w;
            }
            const int xr = m0 + xl, wr = n0 + wl;
            if (xr < m) {
                float* dst = y + (long long)xr * n + wr;
                if (wr < n) dst[0] = s.x;
                if (wr + 1 < n) dst[1] = s.y;
                if (wr + 2 < n) dst[2] = s.z;
                if (wr + 3 < n) dst[3] = s.w;
            }
        }
        cluster_sync();                               // no block leaves while another reads it
    }
#endif
}

#ifdef GLIMMER_INSTANTIATE
#define MMA_WG(KS, Z)                                                                                     \
    template __global__ void mma_wg_kernel<KS, Z>(float*, const unsigned short*, const unsigned short*,    \
                                                  const unsigned char*, int, int, int, long long);
#define MMA_WG_KS(Z) MMA_WG(1, Z) MMA_WG(2, Z) MMA_WG(4, Z) MMA_WG(8, Z)
MMA_WG_KS(false) MMA_WG_KS(true)
// probes for bench/ab_mma_wg.py --probes (wrong results): 1 no W loads nor decode, 2 no x copies, 3 neither,
// 7 neither and no stage hand-over (no copy wait, barrier or drain a super-block)
template __global__ void mma_wg_kernel<1, false, 1>(float*, const unsigned short*, const unsigned short*,
                                                    const unsigned char*, int, int, int, long long);
template __global__ void mma_wg_kernel<1, false, 2>(float*, const unsigned short*, const unsigned short*,
                                                    const unsigned char*, int, int, int, long long);
template __global__ void mma_wg_kernel<1, false, 3>(float*, const unsigned short*, const unsigned short*,
                                                    const unsigned char*, int, int, int, long long);
template __global__ void mma_wg_kernel<1, false, 7>(float*, const unsigned short*, const unsigned short*,
                                                    const unsigned char*, int, int, int, long long);
#endif
