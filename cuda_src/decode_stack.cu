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
// The arithmetic is the unfused step's: int8 codes of x per 32 values and dp4a (quant_dot.cuh),
// RMSNorm in float32, RoPE angles in double reduced to [-pi, pi] then sincosf (prepare_qkv.cu), K/V
// rounded to bfloat16 in the pool, the attention's softmax in float32 over the positions split
// across the blocks, SiLU(g) * u. Sums are ordered differently, so the bits are not the unfused
// step's; tests/test_decode_stack_gpu.py compares the two.
//
// Measured on SmolLM2-135M (bench/results/NOTES.md, the thirty-seventh session): correct, and 2.2x
// slower than the unfused step (1,092 µs against 491), for reasons not yet measured; so the library
// runs it only when asked (model/fused_stack.py: ENABLED).
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
#include "bf16.cuh"
#include "cluster.cuh"
#include "pdl.cuh"
#include "q8.cuh"
#include "quant_dot.cuh"

namespace dstack {

// stamps (if given): the global timer at kStamps points of every layer, per block (bench/probe_decode_stack.py)
constexpr int kStamps = 16;
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define DSTAMP(i)                                   \
    if (stamps && threadIdx.x == 0 && (i) >= 0)     \
    stamps[((long long)rank * n_layers + l) * dstack::kStamps + (i)] = dstack::global_ns()

#define kNegInf (-__int_as_float(0x7f800000))        // NVRTC has no INFINITY

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kRowsWarp = 8;              // rows a warp sums before reducing them together
constexpr int kPart = 68;                 // a head's partial: m, l, D = 64 sums, 2 of padding (17 float4s)

enum Col { kWqkv, kWo, kWgu, kWd, kAttnNorm, kFfnNorm, kKPool, kVPool, kLog2Base, kCols };
enum Off {
    oWqkv, oWo, oWgu, oWd,                    // this block's rows of the four matrices (bulk copies)
    oX, oQkv, oPart, oAtt, oO, oAct, oDown,   // the residual; what the exchanges gather
    oXq, oXd, oXs,                            // int8 codes of the next matmul's input
    oWarp, oRed, oNA, oNF, oRope, oTable, oBars, kOffs
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
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(static_cast<unsigned char*>(dst) + at)),
                     "l"(static_cast<const unsigned char*>(src) + at), "r"(min(piece, bytes - at)),
                     "r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ float bf16_round(float v) { return __uint_as_float((unsigned)bf16_bits(v) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// the sum over the block of v (every thread calls it; red: kWarps floats)
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w];
    __syncthreads();                          // red is free again
    return s;
}

// int8 codes of v[0, n) * scale * (w ? w : 1) per 32 values, n % 32 == 0; out (if given) gets the values
__device__ __forceinline__ void make_codes(const float* v, int n, float scale, const float* w, int* xq, float* xd, float* xs,
                           float* out = nullptr) {
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

// x += add (if given), then the RMSNorm of x with weight w into int8 codes (and into out)
__device__ __forceinline__ void add_norm_codes(float* x, const float* add, int n, const float* w, float eps, float* red, int* xq,
                               float* xd, float* xs, float* out = nullptr) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
        const float v = add ? x[i] + add[i] : x[i];
        x[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);                  // its barriers also publish x
    make_codes(x, n, rsqrtf(ss / (float)n + eps), w, xq, xd, xs, out);
    __syncthreads();
}

// The warp's rows of a slice of `rows` rows (row bytes rb, K = k) dotted with the codes, P matrices
// side by side (the p-th `second` bytes after w): warp w takes `per` consecutive rows (a multiple of
// 4), kRowsWarp at a time summed before their reductions run side by side; emit(r, v) for each 4
// rows from r (rows % 4 == 0), v[j][p] on every lane, so that one float4 carries them.
template <class QT, int P, class Emit>
__device__ __forceinline__ void slice_rows(const unsigned char* w, long long second, int rows, int k, int rb,
                                           const int* xq, const float* xd, const float* xs, Emit emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nsub = k / 32;
    const int per = (rows + 4 * kWarps - 1) / (4 * kWarps) * 4;
    const int first = warp * per, last = min(rows, first + per);
    for (int r0 = first; r0 < last; r0 += kRowsWarp) {
        float acc[kRowsWarp][P];
#pragma unroll
        for (int i = 0; i < kRowsWarp; ++i) {
#pragma unroll
            for (int p = 0; p < P; ++p) acc[i][p] = 0.f;
            const int r = r0 + i;
            if (r >= last) continue;
            for (int s = lane; s < nsub; s += 32) {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    int wv[8];
                    float d0, d1, mw;
                    gguf::Dot<QT>::load(w + p * second + (long long)r * rb, s, wv, d0, d1, mw);
                    dp4a_sub_block<1>(&acc[i][p], wv, d0, d1, mw, s, xq, xd, xs, k, nsub);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < kRowsWarp; ++i)
#pragma unroll
            for (int p = 0; p < P; ++p) acc[i][p] = warp_sum(acc[i][p]);
#pragma unroll
        for (int i = 0; i < kRowsWarp; i += 4)
            if (r0 + i < last) emit(r0 + i, &acc[i]);
    }
}

// P: how many matrices a matmul stage reads side by side (a tag for the stage's generic lambda)
template <int N>
struct Mats {
    static constexpr int P = N;
};

// 4 rows' values (v[j][p]) from row r of this block's slice into every block's vector at base + r,
// one float4 a block from lanes 0..C-1 (f picks or combines the P values of a row)
template <int P, class Fn>
__device__ __forceinline__ void send_rows(float* base, int r, const float (*v)[P], unsigned long long* bar,
                                          unsigned C, Fn f) {
    const int lane = threadIdx.x & 31;
    if (lane >= (int)C) return;
    const float q[4] = {f(v[0]), f(v[1]), f(v[2]), f(v[3])};
    st_async<4>(map_rank(smem_addr(base + r), (unsigned)lane), q, map_rank(smem_addr(bar), (unsigned)lane));
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
    for (int t = threadIdx.x; t < heads * (D / 2); t += kThreads) {
        const int h = t / (D / 2), i = t % (D / 2);
        float* v = qkv + h * D;
        const int a = NEOX ? i : 2 * i, b = NEOX ? i + D / 2 : 2 * i + 1;
        const float x = v[a], y = v[b], c = cs[i], sn = cs[D / 2 + i];
        v[a] = x * c - y * sn;
        v[b] = x * sn + y * c;
    }
}

// Attention of the G = hq / hkv query heads of KV head g over this warp's tiles of 32 positions
// (t0 = j0, j0 + step, ... below j1): lane j loads position t0 + j's K row and makes its score per
// head; its V loads are laid LPR lanes a row, 8 features a lane, PPI rows an instruction, so that
// every K and V load of a tile is issued before the first is used (one memory trip a tile). The
// running state (m, l per head; each lane's sums of its features over its positions) is merged
// across lanes by the caller. This step's row (position pos) comes from the block's own k and v,
// rounded to bfloat16 as the pool holds it.
template <int G>
struct AttnState {
    float m[G], l[G], acc[G][8];
};

__device__ __forceinline__ void bf16x8(const uint4 u, float* f) {
    const unsigned w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        f[2 * e] = __uint_as_float(w4[e] << 16);
        f[2 * e + 1] = __uint_as_float(w4[e] & 0xFFFF0000u);
    }
}

template <int D, int G>
__device__ __forceinline__ void attend_tiles(AttnState<G>& st, const float* q, const float* knew, const float* vnew, int g,
                             int hkv, int j0, int j1, int step, int pos, const int* cell_table,
                             const unsigned short* kp, const unsigned short* vp, float scale) {
    constexpr int LPR = D / 8, PPI = 32 / LPR, IT = 32 / PPI;
    const int lane = threadIdx.x & 31, pi = lane / LPR, fc = lane % LPR;
    for (int t0 = j0; t0 < j1; t0 += step) {
        const int j = t0 + lane;
        const bool on = j < j1, mine = on && j == pos;
        const long long cell = on && !mine ? (long long)cell_table[j] : 0;
        uint4 kr[D / 8], vr[IT];
        if (on && !mine) {
            const uint4* k4 = reinterpret_cast<const uint4*>(kp + (cell * hkv + g) * D);
#pragma unroll
            for (int c = 0; c < D / 8; ++c) kr[c] = k4[c];
        }
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int jj = it * PPI + pi;
            const long long cj = __shfl_sync(0xffffffffu, cell, jj);
            if (t0 + jj < j1 && t0 + jj != pos)
                vr[it] = reinterpret_cast<const uint4*>(vp + (cj * hkv + g) * D)[fc];
        }
        float s[G];
#pragma unroll
        for (int h = 0; h < G; ++h) s[h] = 0.f;
        if (on) {
#pragma unroll
            for (int c = 0; c < D / 8; ++c) {
                float kv[8];
                if (mine) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) kv[e] = bf16_round(knew[8 * c + e]);
                } else {
                    bf16x8(kr[c], kv);
                }
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float* qh = q + h * D + 8 * c;
#pragma unroll
                    for (int e = 0; e < 8; ++e) s[h] = fmaf(qh[e], kv[e], s[h]);
                }
            }
        }
        float p[G];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float sc = on ? s[h] * scale : kNegInf;
            const float mn = fmaxf(st.m[h], warp_max(sc));          // finite: lane 0 is always on
            const float corr = st.m[h] == kNegInf ? 0.f : expf(st.m[h] - mn);
            p[h] = on ? expf(sc - mn) : 0.f;
            st.l[h] = st.l[h] * corr + warp_sum(p[h]);
#pragma unroll
            for (int e = 0; e < 8; ++e) st.acc[h][e] *= corr;
            st.m[h] = mn;
        }
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int jj = it * PPI + pi;
            float vv[8];
            if (t0 + jj == pos) {
#pragma unroll
                for (int e = 0; e < 8; ++e) vv[e] = bf16_round(vnew[8 * fc + e]);
            } else if (t0 + jj < j1) {
                bf16x8(vr[it], vv);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) vv[e] = 0.f;
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float pj = __shfl_sync(0xffffffffu, p[h], jj);
#pragma unroll
                for (int e = 0; e < 8; ++e) st.acc[h][e] = fmaf(pj, vv[e], st.acc[h][e]);
            }
        }
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
    int* xq = reinterpret_cast<int*>(sm + off[oXq]);
    float* xd = reinterpret_cast<float*>(sm + off[oXd]);
    float* xs = reinterpret_cast<float*>(sm + off[oXs]);
    float* wpart = reinterpret_cast<float*>(sm + off[oWarp]);
    float* red = reinterpret_cast<float*>(sm + off[oRed]);
    float* norm_a = reinterpret_cast<float*>(sm + off[oNA]);     // attention norms, by layer parity (H each)
    float* norm_f = reinterpret_cast<float*>(sm + off[oNF]);     // FFN norms, the same
    float* rope = reinterpret_cast<float*>(sm + off[oRope]);
    unsigned long long* tab = reinterpret_cast<unsigned long long*>(sm + off[oTable]);   // the table, read once
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(sm + off[oBars]);

    const int QD = hq * D, KVD = hkv * D, QKV = QD + 2 * KVD;          // hq = G hkv
    const int rq = QKV / C, ro = H / C, rf = F / C, rd = H / C;
    const int rbH = H / QT::kValues * QT::kBytes, rbQ = QD / QT::kValues * QT::kBytes;
    const int rbF = F / QT::kValues * QT::kBytes;
    const unsigned nvec = (unsigned)H * 4u;

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
    for (int i = tid; i < H; i += kThreads) x[i] = x_in[i];
    mbar_wait_cluster(&bar[bQkv], 0u);              // layer 0's attention norm came with its q|k|v rows
    __syncthreads();
    add_norm_codes(x, nullptr, H, norm_a, eps, red, xq, xd, xs);

    // positions [j0, j1) of this block; KV head g has warps g, g + hkv, ... (wpg of them)
    const int per = (n_pos + (int)C - 1) / (int)C;
    const int j0 = min(n_pos, (int)rank * per), j1 = min(n_pos, j0 + per);
    const int wpg = kWarps / hkv;
    double base = -1.0;

    for (int l = 0; l < n_layers; ++l) {
        const unsigned ph = (unsigned)l & 1u;
        const unsigned long long* row = tab + l * kCols;
        const unsigned short* kp = reinterpret_cast<const unsigned short*>(row[kKPool]);
        const unsigned short* vp = reinterpret_cast<const unsigned short*>(row[kVPool]);
        // this block's old K and V rows into L2 while the q|k|v rows are made (no kernel writes them)
        for (int t = tid; t < (j1 - j0) * hkv; t += kThreads) {
            const int j = j0 + t / hkv, g = t % hkv;
            if (j == pos) continue;
            const long long c = ctab[j];
            prefetch_l2(kp + (c * hkv + g) * D);
            prefetch_l2(vp + (c * hkv + g) * D);
        }
        const double b = __longlong_as_double((long long)row[kLog2Base]);
        if (b != base) {
            rope_table<D>(rope, pos, b);
            base = b;
        }
        // A matmul stage: this block's `rows` rows of the P matrices in buffer wb (the second `second`
        // bytes after the first) against the codes, fn of each row's P values sent into every block's
        // vector at dst (a slice of `rows` a block, `bytes` in all, counted on barrier xb); the buffer
        // refilled with layer l + 1's rows once read; back when every block's slice is in. Stamps
        // (-1: none) when the weights are in, the slice sent, and the vector gathered.
        auto stage = [&](auto mats, int wb, int xb, const unsigned char* w, long long second, int rows, int k, int rb,
                         float* dst, unsigned bytes, auto fn, int s_in, int s_sent, int s_gathered) {
            constexpr int P = decltype(mats)::P;
            if (tid == 0) mbar_arrive_expect_tx(&bar[xb], bytes);
            mbar_wait_cluster(&bar[wb], ph);
            DSTAMP(s_in);
            slice_rows<QT, P>(w, second, rows, k, rb, xq, xd, xs, [&](int r, const float (*v)[P]) {
                send_rows<P>(dst + rank * rows, r, v, &bar[xb], C, fn);
            });
            __syncthreads();
            if (tid == 0 && l + 1 < n_layers) load(wb, l + 1);
            DSTAMP(s_sent);
            mbar_wait_cluster(&bar[xb], ph);
            DSTAMP(s_gathered);
        };
        const auto first = [](const float* u) { return u[0]; };
        // ---- q|k|v rows
        DSTAMP(0);
        stage(Mats<1>{}, bQkv, xQkv, wqkv, 0, rq, H, rbH, qkv, (unsigned)QKV * 4u, first, 1, 2, 3);
        rope_heads<D, NEOX>(qkv, hq + hkv, rope);
        __syncthreads();
        const float* knew = qkv + QD;
        const float* vnew = qkv + QD + KVD;
        if (rank == 0) {                            // this step's K and V into the pools
            unsigned short* kw = reinterpret_cast<unsigned short*>(row[kKPool]);
            unsigned short* vw = reinterpret_cast<unsigned short*>(row[kVPool]);
            for (int i = tid; i < KVD; i += kThreads) {
                kw[cell * KVD + i] = bf16_bits(knew[i]);
                vw[cell * KVD + i] = bf16_bits(vnew[i]);
            }
        }
        // ---- attention: this block's positions, then every block's partial rows merged
        if (tid == 0) {
            mbar_arrive_expect_tx(&bar[xPart], (unsigned)owned * C * kPart * 4u);
            mbar_arrive_expect_tx(&bar[xAtt], (unsigned)QD * 4u);
        }
        {
            const int g = warp % hkv, k = warp / hkv;
            AttnState<G> st;
#pragma unroll
            for (int h = 0; h < G; ++h) {
                st.m[h] = kNegInf;
                st.l[h] = 0.f;
#pragma unroll
                for (int e = 0; e < 8; ++e) st.acc[h][e] = 0.f;
            }
            if (k < wpg)
                attend_tiles<D, G>(st, qkv + g * G * D, knew + g * D, vnew + g * D, g, hkv, j0 + 32 * k, j1, 32 * wpg,
                                pos, ctab, kp, vp, scale);
            // lanes of one feature chunk hold sums over different positions: add them up
#pragma unroll
            for (int h = 0; h < G; ++h)
#pragma unroll
                for (int e = 0; e < 8; ++e)
#pragma unroll
                    for (int o = D / 8; o < 32; o <<= 1) st.acc[h][e] += __shfl_xor_sync(0xffffffffu, st.acc[h][e], o);
            if (k < wpg) {
                for (int h = 0; h < G; ++h) {       // (m, l, acc[D]) per head of the group, in the warp's slot
                    float* slot = wpart + ((k * hkv + g) * G + h) * (D + 2);
                    if (lane == 0) {
                        slot[0] = st.m[h];
                        slot[1] = st.l[h];
                    }
                    if (lane < D / 8)
#pragma unroll
                        for (int e = 0; e < 8; ++e) slot[2 + 8 * lane + e] = st.acc[h][e];
                }
            }
        }
        __syncthreads();
        DSTAMP(4);
        // the block's partial of head h (its KV head's warps merged) to the head's owner, block h % C
        for (int t = tid; t < hq * (kPart / 4); t += kThreads) {
            const int h = t / (kPart / 4), e0 = 4 * (t % (kPart / 4)), g = h / G, hi = h % G;
            float mx = kNegInf;
            for (int k = 0; k < wpg; ++k) mx = fmaxf(mx, wpart[((k * hkv + g) * G + hi) * (D + 2)]);
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int e = e0 + j;
                v[j] = e == 0 ? mx : 0.f;
                if (e > 0 && e < D + 2 && mx != kNegInf)
                    for (int k = 0; k < wpg; ++k) {
                        const float* sl = wpart + ((k * hkv + g) * G + hi) * (D + 2);
                        if (sl[0] != kNegInf) v[j] += expf(sl[0] - mx) * sl[e];
                    }
            }
            const unsigned to = (unsigned)h % C;
            st_async<4>(map_rank(smem_addr(part + ((int)rank * hq + h) * kPart + e0), to), v,
                        map_rank(smem_addr(&bar[xPart]), to));
        }
        // an owner merges its heads' C partials and sends each head's D outputs to every block
        mbar_wait_cluster(&bar[xPart], ph);
        DSTAMP(5);
        for (int t = tid; t < owned * (D / 4) * (int)C; t += kThreads) {
            const int h = (int)rank + (int)C * (t / ((D / 4) * (int)C)), e0 = 4 * ((t / (int)C) % (D / 4));
            const unsigned to = (unsigned)(t % (int)C);
            float mx = kNegInf;
            for (unsigned r = 0; r < C; ++r) mx = fmaxf(mx, part[(r * hq + h) * kPart]);
            float num[4] = {0.f, 0.f, 0.f, 0.f}, den = 0.f;
            for (unsigned r = 0; r < C; ++r) {
                const float* sl = part + (r * hq + h) * kPart;
                if (sl[0] == kNegInf) continue;
                const float wgt = expf(sl[0] - mx);
                den += wgt * sl[1];
#pragma unroll
                for (int j = 0; j < 4; ++j) num[j] += wgt * sl[2 + e0 + j];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) num[j] /= den;
            st_async<4>(map_rank(smem_addr(att + h * D + e0), to), num, map_rank(smem_addr(&bar[xAtt]), to));
        }
        mbar_wait_cluster(&bar[xAtt], ph);
        DSTAMP(6);
        __syncthreads();
        make_codes(att, QD, 1.f, nullptr, xq, xd, xs);
        __syncthreads();
        // ---- o rows, the residual, the FFN's norm
        stage(Mats<1>{}, bO, xO, wo, 0, ro, QD, rbQ, ob, (unsigned)H * 4u, first, 7, -1, 8);
        add_norm_codes(x, ob, H, norm_f + (l & 1) * H, eps, red, xq, xd, xs);
        // ---- gate|up rows: SiLU(g) * u of this block's rows
        DSTAMP(9);
        stage(Mats<2>{}, bGu, xAct, wgu, (long long)rf * rbH, rf, H, rbH, act, (unsigned)F * 4u,
              [](const float* gu) { return gu[0] / (1.f + expf(-gu[0])) * gu[1]; }, 10, -1, 11);
        make_codes(act, F, 1.f, nullptr, xq, xd, xs);
        __syncthreads();
        // ---- down rows, the residual, the next norm (the final one after the last layer)
        stage(Mats<1>{}, bD, xDown, wd, 0, rd, F, rbF, dn, (unsigned)H * 4u, first, 12, -1, 13);
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
