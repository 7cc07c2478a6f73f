// decode_stack.cu — every decoder layer of a one-token step in one launch of one thread-block cluster.
//
// A one-token step of a small model is a chain of ~9 short kernels a layer (SmolLM2: 16.2 µs a layer,
// most of it kernel boundaries of ~1 µs under PDL, bench/results/NOTES.md). Here one cluster of C
// blocks (C = 16, the H200's largest) runs all the layers: block `rank` computes a C-th of the rows
// of every matrix from its shared memory, and after each matmul the blocks exchange their slices
// through distributed shared memory, st.async counted in bytes on the receiver's mbarrier
// (~0.6 µs an exchange, bench/probe_cluster_exchange.py), so that every block holds every vector
// and does the row-wide work (residual add, RMSNorm, RoPE, int8 codes, the attention merge) itself.
// Weights are no kernel's output: each block's slice of a matrix comes in by one bulk copy
// (cp.async.bulk, counted on the matrix's mbarrier) issued as soon as the same matrix of the layer
// before has been read, a layer ahead of its use.
//
// Small code, on purpose. Every layer runs through the whole loop body once, and an SM holds little
// code: 16 KB stayed in it where 64 KB did not, and straight-line code it does not hold runs at
// ~2.5 ns an instruction from L2 against ~0.6 held (bench/probe_cold_code.py). The first build of
// this kernel inlined and unrolled everything: 250 KB of machine code, ~163 KB of it run once a
// layer, which is ~26 µs a layer at L2's rate, and it measured 33 (bench/results/NOTES.md, the
// thirty-seventh and thirty-eighth sessions). So here the matmul, the norm and the int8 codes are
// each one function called from every place that needs it (__noinline__), loops stay rolled, and
// only the attention's loads are unrolled, so that a tile's loads are in flight together.
// bench/code_size.py reports the kernel's size; tests/test_cuda_compile.py holds it to a budget.
//
// The arithmetic is the unfused step's: int8 codes of x per 32 values and dp4a (quant_dot.cuh),
// RMSNorm in float32, RoPE angles in double reduced to [-pi, pi] then sincosf (prepare_qkv.cu), K/V
// rounded to bfloat16 in the pool, the attention's softmax in float32 over the positions split
// across the blocks, SiLU(g) * u. Sums are ordered differently, so the bits are not the unfused
// step's; tests/test_decode_stack_gpu.py compares the two.
//
// decode_stack_kernel<QT, D, NEOX, G>
//   QT: the small-block type of every layer matrix (Q4_0, Q4_1, Q5_0, Q8_0); D: head_dim (64);
//   NEOX: RoPE pairs (i, i + D/2) or (2i, 2i + 1); G: query heads a KV head (1-4).
//   No q/k norm, biases, post norms or windows
//   (model/fused_stack.py decides which models it serves).
//   table: n_layers x kCols 8-byte words: pointers to the joined q|k|v, o, joined gate|up and down
//   matrices, the two norm vectors, the K and V pools, and log2 of the layer's rope base (double bits).
//   layout: kOffs byte offsets into dynamic shared memory (model/fused_stack.py: one place).
//   x_in: (H,) the embedded token; positions, cells, tok_seq: (1,) (the step's one token); cell_table:
//   (S, table_width), the token's sequence's row read; seq_lens: (S,).
//   h_out, xq_out, xd_out, xs_out: the final norm's row and its int8 codes (the LM head's input).
//   stamps: null, or C x n_layers x kStamps global-timer stamps (bench/probe_decode_stack.py).
//   grid=(C,) cluster=(C,) block=(kThreads,)
#include "attn_split.cuh"
#include "bf16.cuh"
#include "pdl.cuh"
#include "q8.cuh"
#include "quant_dot.cuh"
#include "timer.cuh"

namespace dstack {

// stamps (if given): the global timer at kStamps points of every layer, per block (bench/probe_decode_stack.py)
constexpr int kStamps = 16;
#define DSTAMP(i)                                   \
    if (stamps && threadIdx.x == 0 && (i) >= 0)     \
    stamps[((long long)rank * n_layers + l) * dstack::kStamps + (i)] = global_ns()

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kPart = 68;                 // a head's partial: D = 64 sums, m, l, 2 of padding (17 float4s)
constexpr int kMaxG = 4;                  // query heads a KV head, at most (a warp's slots)

enum Col { kWqkv, kWo, kWgu, kWd, kAttnNorm, kFfnNorm, kKPool, kVPool, kLog2Base, kCols };
enum Off {
    oWqkv, oWo, oWgu, oWd,                    // this block's rows of the four matrices (bulk copies)
    oX, oQkv, oPart, oAtt, oO, oAct, oDown,   // the residual; what the exchanges gather
    oRows,                                    // this block's rows of a matmul, before they are sent
    oXq, oXd, oXs,                            // int8 codes of the next matmul's input
    oWarp, oProb, oRed, oNA, oNF, oRope, oTable,
    oCells,                                   // the cells of this block's positions (as many as fit)
    oBars, kOffs
};
// weight barriers of the four matrices, then the six exchanges' barriers
enum Bar { bQkv, bO, bGu, bD, xQkv, xPart, xAtt, xO, xAct, xDown, kBars };

// STACK_CHUNK (bytes, a multiple of 16; 0: whole): a copy is issued as pieces of at most this size
#ifndef STACK_CHUNK
#define STACK_CHUNK 0
#endif

__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    const unsigned piece = STACK_CHUNK > 0 ? (unsigned)STACK_CHUNK : bytes;
    for (unsigned at = 0; at < bytes; at += piece)
        bulk_copy(static_cast<unsigned char*>(dst) + at, static_cast<const unsigned char*>(src) + at,
                  min(piece, bytes - at), bar);
}

// int8 codes of v[0, n) * scale * (w ? w : 1) per 32 values, n % 32 == 0; out (if given) gets the values.
// Whole groups of 8 lanes (32 values) are on or off together, so q8_lane's shuffles see whole groups.
__device__ __noinline__ void make_codes(const float* v, int n, float scale, const float* w, int* xq, float* xd,
                                        float* xs, float* out) {
#pragma unroll 1
    for (int base = 0; base < n / 4; base += kThreads) {
        const int t = base + threadIdx.x;
        const bool on = t < n / 4;
        const unsigned mask = __ballot_sync(0xffffffffu, on);
        if (!on) continue;
        float p[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) p[j] = v[4 * t + j] * scale * (w ? w[4 * t + j] : 1.f);
        if (out)
#pragma unroll
            for (int j = 0; j < 4; ++j) out[4 * t + j] = p[j];
        q8_lane<4>(p, 4 * t, xq, xd, xs, mask);
    }
}

// x += add (if given), then the RMSNorm of x with weight w into int8 codes (and into out); returns
// with the codes published to the block
__device__ __noinline__ void add_norm_codes(float* x, const float* add, int n, const float* w, float eps, float* red,
                                            int* xq, float* xd, float* xs, float* out) {
    float ss = 0.f;
#pragma unroll 1
    for (int i = threadIdx.x; i < n; i += kThreads) {
        const float v = add ? x[i] + add[i] : x[i];
        x[i] = v;
        ss += v * v;
    }
    ss = attn::warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();                          // also publishes x
    float tot = 0.f;
#pragma unroll 1
    for (int i = 0; i < kWarps; ++i) tot += red[i];
    make_codes(x, n, rsqrtf(tot / (float)n + eps), w, xq, xd, xs, out);
    __syncthreads();                          // the codes are whole; red is free again
}

// This block's `rows` rows of a matrix (QT blocks, K = k, row bytes rb, in shared memory at w)
// dotted with the codes, into buf; `gated`: the buffer holds 2 rows rows (gate rows, then up rows)
// and SiLU(g) * u of each pair is what is sent. Then the block's slice goes four values to a float4
// into every block's vector at dst + rank * rows, counted on barrier `bar` (this block's
// shared-window address) in each. S lanes a row, a power of two: as many as keep the rows within
// one pass of the block; each lane sums every S-th sub-block of 32 values, and the S partial sums
// meet by shuffles.
template <class QT>
__device__ __noinline__ void mat_rows(const unsigned char* w, int rows, int k, int rb, bool gated, const int* xq,
                                      const float* xd, const float* xs, float* buf, float* dst, unsigned bar,
                                      unsigned C, unsigned rank) {
    const int nsub = k / 32, total = gated ? 2 * rows : rows;
    int S = 32;
    while (S > 1 && total * S > kThreads) S >>= 1;
#pragma unroll 1
    for (int base = 0; base < total * S; base += kThreads) {       // the same passes for every lane
        const int t = base + (int)threadIdx.x, r = t / S, part = t % S;
        float acc = 0.f;
        if (r < total) {
            const unsigned char* row = w + (long long)r * rb;
#pragma unroll 2
            for (int s = part; s < nsub; s += S) {
                int wv[8];
                float d0, d1, mw;
                gguf::Dot<QT>::load(row, s, wv, d0, d1, mw);
                dp4a_sub_block<1>(&acc, wv, d0, d1, mw, s, xq, xd, xs, k, nsub);
            }
        }
#pragma unroll 1
        for (int o = S / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (r < total && part == 0) buf[r] = acc;
    }
    __syncthreads();
    if (gated) {
#pragma unroll 1
        for (int r = threadIdx.x; r < rows; r += kThreads) {
            const float g = buf[r];
            buf[r] = g / (1.f + expf(-g)) * buf[rows + r];
        }
        __syncthreads();
    }
#pragma unroll 1
    for (int t = threadIdx.x; t < rows / 4 * (int)C; t += kThreads) {
        const unsigned to = (unsigned)t % C;
        const int r = 4 * (t / (int)C);
        st_async<4>(map_rank(smem_addr(dst + rank * rows + r), to), buf + r, map_rank(bar, to));
    }
}

// cos and sin of pos * base^(-2i / D) for the D / 2 pairs, the angle as prepare_qkv.cu makes it
template <int D>
__device__ void rope_table(float* cs, int pos, double log2_base) {
    const double TWO_PI = 6.283185307179586476925286766559;
    for (int i = threadIdx.x; i < D / 2; i += kThreads) {
        const double inv_freq = exp2(-(double)(2 * i) / (double)D * log2_base);
        double ang = (double)pos * inv_freq;
        ang -= rint(ang * (1.0 / TWO_PI)) * TWO_PI;
        sincosf((float)ang, &cs[D / 2 + i], &cs[i]);
    }
}

// RoPE on the first `heads` heads of qkv (the q and k heads), in place, by the table
template <int D, bool NEOX>
__device__ void rope_heads(float* qkv, int heads, const float* cs) {
#pragma unroll 1
    for (int t = threadIdx.x; t < heads * (D / 2); t += kThreads) {
        const int h = t / (D / 2), i = t % (D / 2);
        float* v = qkv + h * D;
        const int a = NEOX ? i : 2 * i, b = NEOX ? i + D / 2 : 2 * i + 1;
        const float x = v[a], y = v[b], c = cs[i], sn = cs[D / 2 + i];
        v[a] = x * c - y * sn;
        v[b] = x * sn + y * c;
    }
}

// One tile of up to 32 positions [jb, je) of KV head g for its G query heads (q: their G * 64 values),
// merged into the warp's slots (64 sums, m, l per head; `first`: the warp's first tile). Lane j holds
// position jb + j's K row (the score is its own) and lane i features 2i, 2i + 1 of every position's
// V row; all 40 loads of a lane are issued before the first is used. row: lane j's position's row of
// KV head g in the pools, in rows of D values (cell * hkv + g; fused_stack.why_not refuses pools of
// 2^32 words or more, so 32-bit offsets serve).
template <int D>
__device__ __forceinline__ void attend_tile(float* slots, float* prob, const float* q, int G, int jb, int je,
                                            unsigned row, const uint4* kp, const unsigned* vp, float scale,
                                            bool first) {
    static_assert(D == 64, "a lane holds one K row in 8 uint4 and 2 features of each V row");
    const int lane = threadIdx.x & 31;
    const bool on = jb + lane < je;
    uint4 kr[D / 8];
    unsigned vr[32];
    if (on) {
        const uint4* k4 = kp + row * (D / 8);
#pragma unroll
        for (int c = 0; c < D / 8; ++c) kr[c] = k4[c];
    }
#pragma unroll
    for (int p = 0; p < 32; ++p) {
        const unsigned rp = __shfl_sync(0xffffffffu, row, p) * (D / 2) + lane;
        vr[p] = jb + p < je ? vp[rp] : 0u;
    }
#pragma unroll 1
    for (int hi = 0; hi < G; ++hi) {
        const float* qh = q + hi * D;
        float s = 0.f;
        if (on) {
#pragma unroll
            for (int c = 0; c < D / 8; ++c) {
                const float4 qa = reinterpret_cast<const float4*>(qh)[2 * c];
                const float4 qb = reinterpret_cast<const float4*>(qh)[2 * c + 1];
                s = fmaf(qa.x, bf16_lo(kr[c].x), s);
                s = fmaf(qa.y, bf16_hi(kr[c].x), s);
                s = fmaf(qa.z, bf16_lo(kr[c].y), s);
                s = fmaf(qa.w, bf16_hi(kr[c].y), s);
                s = fmaf(qb.x, bf16_lo(kr[c].z), s);
                s = fmaf(qb.y, bf16_hi(kr[c].z), s);
                s = fmaf(qb.z, bf16_lo(kr[c].w), s);
                s = fmaf(qb.w, bf16_hi(kr[c].w), s);
            }
        }
        const float sc = on ? s * scale : kNegInf;
        const float mt = attn::warp_max(sc);                   // finite: lane 0 is always on
        const float p = on ? expf(sc - mt) : 0.f;
        const float lt = attn::warp_sum(p);
        prob[lane] = p;
        __syncwarp();
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
            const float4 pj = reinterpret_cast<const float4*>(prob)[j / 4];
            a0 = fmaf(pj.x, bf16_lo(vr[j]), a0);
            a1 = fmaf(pj.x, bf16_hi(vr[j]), a1);
            a0 = fmaf(pj.y, bf16_lo(vr[j + 1]), a0);
            a1 = fmaf(pj.y, bf16_hi(vr[j + 1]), a1);
            a0 = fmaf(pj.z, bf16_lo(vr[j + 2]), a0);
            a1 = fmaf(pj.z, bf16_hi(vr[j + 2]), a1);
            a0 = fmaf(pj.w, bf16_lo(vr[j + 3]), a0);
            a1 = fmaf(pj.w, bf16_hi(vr[j + 3]), a1);
        }
        float* slot = slots + hi * (D + 2);                    // [64 sums, m, l]
        const float mo = first ? kNegInf : slot[D];
        const float mn = fmaxf(mo, mt);
        const float co = first ? 0.f : expf(mo - mn), ct = expf(mt - mn);
        const float lo = first ? 0.f : slot[D + 1];
        const float2 ao = first ? make_float2(0.f, 0.f) : reinterpret_cast<const float2*>(slot)[lane];
        __syncwarp();                                          // every lane has read the slot
        reinterpret_cast<float2*>(slot)[lane] = make_float2(ao.x * co + a0 * ct, ao.y * co + a1 * ct);
        if (lane == 0) {
            slot[D] = mn;
            slot[D + 1] = lo * co + lt * ct;
        }
        __syncwarp();                                          // prob and the slot are free again
    }
}

}  // namespace dstack

template <class QT, int D, bool NEOX, int G>
__global__ void __launch_bounds__(dstack::kThreads, 1) decode_stack_kernel(
    const unsigned long long* __restrict__ table, const int* __restrict__ layout, int n_layers, int H, int hq, int hkv,
    int F, const float* __restrict__ x_in, const int* __restrict__ positions, const int* __restrict__ cells,
    const int* __restrict__ tok_seq, const int* __restrict__ cell_table, int table_width,
    const int* __restrict__ seq_lens, const float* __restrict__ out_norm, float eps, float scale,
    float* __restrict__ h_out, int* __restrict__ xq_out, float* __restrict__ xd_out, float* __restrict__ xs_out,
    unsigned long long* __restrict__ stamps) {
    using namespace dstack;
    static_assert(D == 64, "the attention's registers are laid out for head_dim 64");
    static_assert(G <= kMaxG, "a warp has kMaxG slots");
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ int off[kOffs];
    const unsigned C = cluster_size(), rank = cluster_rank();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < kOffs) off[tid] = layout[tid];       // uploaded once, no kernel's output
    __syncthreads();
    unsigned char* wqkv = sm + off[oWqkv];
    unsigned char* wo = sm + off[oWo];
    unsigned char* wgu = sm + off[oWgu];
    unsigned char* wd = sm + off[oWd];
    float* x = reinterpret_cast<float*>(sm + off[oX]);
    float* qkv = reinterpret_cast<float*>(sm + off[oQkv]);
    float* part = reinterpret_cast<float*>(sm + off[oPart]);
    float* att = reinterpret_cast<float*>(sm + off[oAtt]);
    float* ob = reinterpret_cast<float*>(sm + off[oO]);
    float* act = reinterpret_cast<float*>(sm + off[oAct]);
    float* dn = reinterpret_cast<float*>(sm + off[oDown]);
    float* rowbuf = reinterpret_cast<float*>(sm + off[oRows]);
    int* xq = reinterpret_cast<int*>(sm + off[oXq]);
    float* xd = reinterpret_cast<float*>(sm + off[oXd]);
    float* xs = reinterpret_cast<float*>(sm + off[oXs]);
    float* wpart = reinterpret_cast<float*>(sm + off[oWarp]);    // kWarps x kMaxG slots of D + 2
    float* prob = reinterpret_cast<float*>(sm + off[oProb]);     // kWarps x 32
    float* red = reinterpret_cast<float*>(sm + off[oRed]);
    float* norm_a = reinterpret_cast<float*>(sm + off[oNA]);     // attention norms, by layer parity (H each)
    float* norm_f = reinterpret_cast<float*>(sm + off[oNF]);     // FFN norms, the same
    float* rope = reinterpret_cast<float*>(sm + off[oRope]);
    unsigned long long* tab = reinterpret_cast<unsigned long long*>(sm + off[oTable]);   // the table, read once
    int* pcells = reinterpret_cast<int*>(sm + off[oCells]);
    const int cell_cap = (off[oBars] - off[oCells]) / 4;
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sm + off[oBars]);

    const int QD = hq * D, KVD = hkv * D, QKV = QD + 2 * KVD;          // hq = G hkv
    const int rq = QKV / C, ro = H / C, rf = F / C, rd = H / C;
    const int rbH = H / QT::kValues * QT::kBytes, rbQ = QD / QT::kValues * QT::kBytes;
    const int rbF = F / QT::kValues * QT::kBytes;
    const unsigned nvec = (unsigned)H * 4u;
    const int own = (hq + (int)C - 1) / (int)C;                       // heads an owner block merges, at most

    // matrix m of layer l: this block's rows into its buffer, with the norm vector that rides along
    // (thread 0; a barrier's expected bytes are armed with its copies)
    auto load = [&](int m, int l) {
        const unsigned long long* row = tab + l * kCols;
        const unsigned char* src;
        switch (m) {
        case bQkv:
            src = reinterpret_cast<const unsigned char*>(row[kWqkv]);
            mbar_arrive_expect_tx(&bar[bQkv], (unsigned)(rq * rbH) + (l == 0 ? nvec : 0u));
            bulk_load(wqkv, src + (long long)rank * rq * rbH, (unsigned)(rq * rbH), &bar[bQkv]);
            if (l == 0) bulk_load(norm_a, reinterpret_cast<const float*>(row[kAttnNorm]), nvec, &bar[bQkv]);
            break;
        case bO:
            src = reinterpret_cast<const unsigned char*>(row[kWo]);
            mbar_arrive_expect_tx(&bar[bO], (unsigned)(ro * rbQ) + nvec);
            bulk_load(wo, src + (long long)rank * ro * rbQ, (unsigned)(ro * rbQ), &bar[bO]);
            bulk_load(norm_f + (l & 1) * H, reinterpret_cast<const float*>(row[kFfnNorm]), nvec, &bar[bO]);
            break;
        case bGu:
            src = reinterpret_cast<const unsigned char*>(row[kWgu]);
            mbar_arrive_expect_tx(&bar[bGu], (unsigned)(2 * rf * rbH));
            bulk_load(wgu, src + (long long)rank * rf * rbH, (unsigned)(rf * rbH), &bar[bGu]);
            bulk_load(wgu + (long long)rf * rbH, src + ((long long)F + rank * rf) * rbH, (unsigned)(rf * rbH), &bar[bGu]);
            break;
        default: {
            src = reinterpret_cast<const unsigned char*>(row[kWd]);
            const float* next = l + 1 < n_layers ? reinterpret_cast<const float*>(row[kCols + kAttnNorm]) : out_norm;
            mbar_arrive_expect_tx(&bar[bD], (unsigned)(rd * rbF) + nvec);
            bulk_load(wd, src + (long long)rank * rd * rbF, (unsigned)(rd * rbF), &bar[bD]);
            bulk_load(norm_a + ((l + 1) & 1) * H, next, nvec, &bar[bD]);
        }
        }
    };

    for (int i = tid; i < n_layers * kCols; i += kThreads) tab[i] = table[i];   // uploaded once, like weights
    if (tid == 0) {
        for (int b = 0; b < kBars; ++b) mbar_init(&bar[b], 1);
        fence_mbarrier_init();
    }
    cluster_sync();                                 // every block's barriers exist before anyone sends; tab is whole
    if (tid == 0)
        for (int m = bQkv; m <= bD; ++m) load(m, 0);
    pdl_release();                                  // the LM head's weights stream while the layers run
    pdl_wait();

    const int pos = positions[0], seq = tok_seq[0];
    const long long cell = cells[0];
    const int n_pos = min(seq_lens[seq], pos + 1);  // causal: positions 0..pos that the sequence holds
    const int* ctab = cell_table + (long long)seq * table_width;
    const int owned = hq > (int)rank ? (hq - 1 - (int)rank) / (int)C + 1 : 0;    // heads h with h % C == rank
    // positions [j0, j1) of this block, in tiles of 32; KV head g has warps g, g + hkv, ... (wpg of them)
    const int per = (n_pos + (int)C - 1) / (int)C;
    const int j0 = min(n_pos, (int)rank * per), j1 = min(n_pos, j0 + per);
    const int n_tiles = (j1 - j0 + 31) / 32, wpg = kWarps / hkv, busy = min(wpg, n_tiles);
    // the block that writes the step's K and V rows: the one whose positions hold pos (it then reads
    // them back from the pool like any other row), block 0 when no block attends to pos
    const bool writer = pos < n_pos ? (j0 <= pos && pos < j1) : rank == 0;
    for (int i = tid; i < min(j1 - j0, cell_cap); i += kThreads) pcells[i] = ctab[j0 + i];
    auto cell_at = [&](int j) { return j - j0 < cell_cap ? pcells[j - j0] : ctab[j]; };   // j in [j0, j1)
    for (int i = tid; i < H; i += kThreads) x[i] = x_in[i];
    mbar_wait_cluster(&bar[bQkv], 0u);              // layer 0's attention norm came with its q|k|v rows
    __syncthreads();
    add_norm_codes(x, nullptr, H, norm_a, eps, red, xq, xd, xs, nullptr);
    double base = -1.0;

#pragma unroll 1
    for (int l = 0; l < n_layers; ++l) {
        const unsigned ph = (unsigned)l & 1u;
        const unsigned long long* row = tab + l * kCols;
        const unsigned short* kp = reinterpret_cast<const unsigned short*>(row[kKPool]);
        const unsigned short* vp = reinterpret_cast<const unsigned short*>(row[kVPool]);
        // this block's old K and V rows into L2 while the q|k|v rows are made (no kernel writes them)
        for (int t = tid; t < (j1 - j0) * hkv; t += kThreads) {
            const int j = j0 + t / hkv, g = t % hkv;
            if (j == pos) continue;
            const long long c = cell_at(j);
            prefetch_l2(kp + (c * hkv + g) * D);
            prefetch_l2(vp + (c * hkv + g) * D);
        }
        const double b = __longlong_as_double((long long)row[kLog2Base]);
        if (b != base) {
            rope_table<D>(rope, pos, b);
            base = b;
        }
        // A matmul stage: this block's `rows` rows of the matrix in buffer wb against the codes, sent
        // into every block's vector at dst (`bytes` in all, counted on barrier xb); the buffer
        // refilled with layer l + 1's rows once read; back when every block's slice is in. Stamps
        // (-1: none) when the weights are in, the slice sent, and the vector gathered.
        auto stage = [&](int wb, int xb, const unsigned char* w, int rows, int k, int rb, bool gated, float* dst,
                         unsigned bytes, int s_in, int s_sent, int s_gathered) {
            if (tid == 0) mbar_arrive_expect_tx(&bar[xb], bytes);
            mbar_wait_cluster(&bar[wb], ph);
            DSTAMP(s_in);
            mat_rows<QT>(w, rows, k, rb, gated, xq, xd, xs, rowbuf, dst, smem_addr(&bar[xb]), C, rank);
            __syncthreads();
            if (tid == 0 && l + 1 < n_layers) load(wb, l + 1);
            DSTAMP(s_sent);
            mbar_wait_cluster(&bar[xb], ph);
            DSTAMP(s_gathered);
        };
        // ---- q|k|v rows
        DSTAMP(0);
        stage(bQkv, xQkv, wqkv, rq, H, rbH, false, qkv, (unsigned)QKV * 4u, 1, 2, 3);
        rope_heads<D, NEOX>(qkv, hq + hkv, rope);
        __syncthreads();
        if (writer) {                               // this step's K and V into the pools
            unsigned short* kw = reinterpret_cast<unsigned short*>(row[kKPool]);
            unsigned short* vw = reinterpret_cast<unsigned short*>(row[kVPool]);
            for (int i = tid; i < KVD; i += kThreads) {
                kw[cell * KVD + i] = bf16_bits(qkv[QD + i]);
                vw[cell * KVD + i] = bf16_bits(qkv[QD + KVD + i]);
            }
            __syncthreads();                        // the block reads them back below
        }
        // ---- attention: this block's positions, then every block's partial rows merged
        if (tid == 0) {
            mbar_arrive_expect_tx(&bar[xPart], (unsigned)owned * C * kPart * 4u);
            mbar_arrive_expect_tx(&bar[xAtt], (unsigned)QD * 4u);
        }
        {
            const int g = warp % hkv, k = warp / hkv;
#pragma unroll 1
            for (int t = k; k < wpg && t < n_tiles; t += wpg) {
                const int jb = j0 + 32 * t, je = min(j1, jb + 32), j = jb + lane;
                const int c = j >= je ? 0 : cell_at(j);
                attend_tile<D>(wpart + warp * kMaxG * (D + 2), prob + warp * 32, qkv + g * G * D, G, jb, je,
                               (unsigned)(c * hkv + g), reinterpret_cast<const uint4*>(kp),
                               reinterpret_cast<const unsigned*>(vp), scale, t == k);
            }
        }
        __syncthreads();
        DSTAMP(4);
        // the block's partial of head h (its KV head's busy warps merged) to the head's owner, block h % C
#pragma unroll 1
        for (int t = tid; t < hq * (kPart / 4); t += kThreads) {
            const int h = t / (kPart / 4), e0 = 4 * (t % (kPart / 4)), g = h / G, hi = h % G;
            float mx = kNegInf;
#pragma unroll 1
            for (int k = 0; k < busy; ++k) mx = fmaxf(mx, wpart[((g + hkv * k) * kMaxG + hi) * (D + 2) + D]);
            float v[4] = {e0 == D ? mx : 0.f, 0.f, 0.f, 0.f};       // [64 sums, m, l, 0, 0]
#pragma unroll 1
            for (int k = 0; k < busy; ++k) {
                const float* sl = wpart + ((g + hkv * k) * kMaxG + hi) * (D + 2);
                const float wgt = expf(sl[D] - mx);
                if (e0 < D) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) v[j] += wgt * sl[e0 + j];
                } else {
                    v[1] += wgt * sl[D + 1];
                }
            }
            const unsigned to = (unsigned)h % C;
            st_async<4>(map_rank(smem_addr(part + ((int)rank * own + h / (int)C) * kPart + e0), to), v,
                        map_rank(smem_addr(&bar[xPart]), to));
        }
        // an owner merges its heads' C partials and sends each head's D outputs to every block
        mbar_wait_cluster(&bar[xPart], ph);
        DSTAMP(5);
#pragma unroll 1
        for (int t = tid; t < owned * (D / 4) * (int)C; t += kThreads) {
            const int hl = t / ((D / 4) * (int)C), h = (int)rank + (int)C * hl, e0 = 4 * ((t / (int)C) % (D / 4));
            const unsigned to = (unsigned)(t % (int)C);
            float mx = kNegInf;
#pragma unroll 1
            for (int r = 0; r < (int)C; ++r) mx = fmaxf(mx, part[(r * own + hl) * kPart + D]);
            float num[4] = {0.f, 0.f, 0.f, 0.f}, den = 0.f;
#pragma unroll 1
            for (int r = 0; r < (int)C; ++r) {
                const float* sl = part + (r * own + hl) * kPart;
                if (sl[D] == kNegInf) continue;
                const float wgt = expf(sl[D] - mx);
                den += wgt * sl[D + 1];
                const float4 a = *reinterpret_cast<const float4*>(sl + e0);
                num[0] += wgt * a.x;
                num[1] += wgt * a.y;
                num[2] += wgt * a.z;
                num[3] += wgt * a.w;
            }
            const float inv = __fdividef(1.f, den);
#pragma unroll
            for (int j = 0; j < 4; ++j) num[j] *= inv;
            st_async<4>(map_rank(smem_addr(att + h * D + e0), to), num, map_rank(smem_addr(&bar[xAtt]), to));
        }
        mbar_wait_cluster(&bar[xAtt], ph);
        DSTAMP(6);
        __syncthreads();
        make_codes(att, QD, 1.f, nullptr, xq, xd, xs, nullptr);
        __syncthreads();
        // ---- o rows, the residual, the FFN's norm
        stage(bO, xO, wo, ro, QD, rbQ, false, ob, (unsigned)H * 4u, 7, -1, 8);
        add_norm_codes(x, ob, H, norm_f + (l & 1) * H, eps, red, xq, xd, xs, nullptr);
        // ---- gate|up rows: SiLU(g) * u of this block's rows
        DSTAMP(9);
        stage(bGu, xAct, wgu, rf, H, rbH, true, act, (unsigned)F * 4u, 10, -1, 11);
        make_codes(act, F, 1.f, nullptr, xq, xd, xs, nullptr);
        __syncthreads();
        // ---- down rows, the residual, the next norm (the final one after the last layer)
        stage(bD, xDown, wd, rd, F, rbF, false, dn, (unsigned)H * 4u, 12, -1, 13);
        add_norm_codes(x, dn, H, norm_a + ((l + 1) & 1) * H, eps, red, xq, xd, xs, l + 1 == n_layers ? ob : nullptr);
        DSTAMP(14);
    }
    if (rank == 0) {                                // the LM head's input
        for (int i = tid; i < H; i += kThreads) h_out[i] = ob[i];
        for (int i = tid; i < H / 4; i += kThreads) xq_out[i] = xq[i];
        for (int i = tid; i < H / 32; i += kThreads) {
            xd_out[i] = xd[i];
            xs_out[i] = xs[i];
        }
    }
    cluster_sync();                                 // no block leaves while another may still send to it
}

#ifdef GLIMMER_INSTANTIATE
#define DSTACK(QT, D, NEOX, G)                                                                                    \
    template __global__ void decode_stack_kernel<gguf::QT, D, NEOX, G>(                                              \
        const unsigned long long*, const int*, int, int, int, int, int, const float*, const int*, const int*,     \
        const int*, const int*, int, const int*, const float*, float, float, float*, int*, float*, float*,      \
        unsigned long long*);
#define DSTACK_G(QT, NEOX) DSTACK(QT, 64, NEOX, 1) DSTACK(QT, 64, NEOX, 2) DSTACK(QT, 64, NEOX, 3) DSTACK(QT, 64, NEOX, 4)
#define DSTACK_T(QT) DSTACK_G(QT, false) DSTACK_G(QT, true)
DSTACK_T(Q4_0) DSTACK_T(Q4_1) DSTACK_T(Q5_0) DSTACK_T(Q8_0)
#endif
