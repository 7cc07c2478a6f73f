// attention.cu — attention over the KV cell pool (bf16 K and V), and the KV write.
//
// Pools: (cells, kv_heads, D) bfloat16 bits; sequence s reads position j from cell
// cell_table[s * L + j]. Visibility and GQA as in glimmer_cupy/reference/attention.py.
// kv_write_kernel       k, v float32 (T, kv_heads, D) -> bf16 (round to nearest even) into pool rows
//                       cells[t]; 8 values per thread; blockIdx.y picks K (0) or V (1).
//                       grid=(ceil(T * kv_heads * D / 8 / 256), 2) block=(256,)
// attn_split_kernel<D, HEADS>  split-K (flash-decoding): one warp per (split, kv head x head chunk,
//                       token). The warp walks its split's positions 32 at a time: lane i scores
//                       position i against the chunk's HEADS query heads (q in shared memory), so a
//                       K row is read once for the whole GQA group; then the warp adds the tile's V
//                       rows into per-lane output columns (lane owns D/32 columns). Writes a partial
//                       (m, l, acc) per split, or the normalised output when there is one split.
//                       grid=(nsplit, kv_heads * head_chunks, T) block=(32,)
// attn_combine_kernel<D>  merges the splits' partials of one (token, q head).
//                       grid=(T * q_heads,) block=(32,)
// The kernel that writes the output (the combine, or the split kernel when there is one split) also
// writes its int8 codes per 32 values (q8.cuh) when xq is not null: the o-projection's input.
//
// Scores live in the log2 domain: q is pre-multiplied by scale * log2(e) (by scale alone under a
// softcap, whose factor then carries the log2(e)), so the softmax uses exp2f directly.
// Templates are instantiated at run time through name_expressions; nvcc builds (the compile test)
// instantiate every one with -DGLIMMER_INSTANTIATE.

#include "bf16.cuh"
#include "pdl.cuh"
#include "q8.cuh"

// -inf without math.h (NVRTC compiles this file with no headers)
#define kNegInf (-__int_as_float(0x7f800000))

typedef unsigned int u32;
constexpr u32 kFull = 0xffffffffu;

// the two bfloat16 halves of a 32-bit word (low half is the lower address)
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

__device__ __forceinline__ u32 pack2(float a, float b) { return (u32)bf16_bits(a) | ((u32)bf16_bits(b) << 16); }

__global__ void __launch_bounds__(256)
kv_write_kernel(unsigned short* __restrict__ k_pool, unsigned short* __restrict__ v_pool,
                const float* __restrict__ k, const float* __restrict__ v, const int* __restrict__ cells,
                int n_tok, int row8) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * row8) return;
    const int tok = (int)(i / row8), c = (int)(i % row8);
    const float4* src = reinterpret_cast<const float4*>((blockIdx.y ? v : k) + 8 * i);
    unsigned short* pool = blockIdx.y ? v_pool : k_pool;
    const float4 a = src[0], b = src[1];
    reinterpret_cast<uint4*>(pool)[(long long)cells[tok] * row8 + c] =
        make_uint4(pack2(a.x, a.y), pack2(a.z, a.w), pack2(b.x, b.y), pack2(b.z, b.w));
}

// C bfloat16 values of one lane's V columns, loaded in one instruction
template <int C> struct Cols;
template <> struct Cols<2> { typedef u32 T; };
template <> struct Cols<4> { typedef uint2 T; };
template <> struct Cols<8> { typedef uint4 T; };
__device__ __forceinline__ void unpack(u32 w, float* f) { f[0] = bf16_lo(w); f[1] = bf16_hi(w); }
__device__ __forceinline__ void unpack(uint2 w, float* f) { unpack(w.x, f); unpack(w.y, f + 2); }
__device__ __forceinline__ void unpack(uint4 w, float* f) {
    unpack(w.x, f); unpack(w.y, f + 2); unpack(w.z, f + 4); unpack(w.w, f + 6);
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, off));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kFull, x, off);
    return x;
}

template <int D, int HEADS>
__global__ void __launch_bounds__(32)
attn_split_kernel(float* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                  const float* __restrict__ q, const unsigned short* __restrict__ k_pool,
                  const unsigned short* __restrict__ v_pool, const int* __restrict__ cell_table,
                  const int* __restrict__ seq_lens, const int* __restrict__ tok_seq,
                  const int* __restrict__ tok_pos, const unsigned char* __restrict__ visible,
                  int n_tok, int q_heads, int kv_heads, int table_width, int head_chunks, int window,
                  float q_scale, float softcap_log2, float inv_softcap, int* __restrict__ xq,
                  float* __restrict__ xd, float* __restrict__ xs) {
    constexpr int C = D / 32;                         // output columns per lane
    constexpr int KB = D / 8 < 16 ? D / 8 : 16;       // 16-byte K loads in flight per lane
    constexpr int VB = D == 256 ? 8 : 16;             // V rows loaded ahead of their math
    typedef typename Cols<C>::T VT;
    __shared__ __align__(16) float sq[HEADS][D];
    __shared__ float sp[32][HEADS];

    const int lane = threadIdx.x;
    const int tok = blockIdx.z;
    const int kvh = blockIdx.y / head_chunks, hc = blockIdx.y % head_chunks;
    const int group = q_heads / kv_heads;
    const int h0 = kvh * group + hc * HEADS;          // first query head of this chunk
    const int nh = min(HEADS, group - hc * HEADS);    // heads past nh are padding (q = 0)
    const int seq = tok_seq[tok];
    const int len = seq_lens[seq], pos = tok_pos[tok];
    // visible positions lie in [lo, hi); a mask may hide some of them
    int lo = 0, hi = len;
    if (visible == nullptr) {
        hi = min(len, pos + 1);
        if (window > 0) lo = max(0, pos - window + 1);
    }
    const int n = max(hi - lo, 0);
    const int chunk = ((n + (int)gridDim.x - 1) / (int)gridDim.x + 31) & ~31;   // whole tiles
    const int begin = lo + (int)blockIdx.x * chunk, end = min(hi, begin + chunk);
    const int* row = cell_table + (long long)seq * table_width;
    const long long cell_stride = (long long)kv_heads * D;
    const unsigned short* kb = k_pool + (long long)kvh * D;
    const unsigned short* vb = v_pool + (long long)kvh * D + lane * C;

    // Before pdl_wait (pdl.cuh) this kernel reads only what was uploaded before the step's kernels
    // ran (index arrays, cell table) and asks L2 for the K and V rows of its first tile's positions
    // that no token of this step writes (below the sequence's lowest position in this step), so
    // their trip from memory overlaps the kernel before (the K/V write).
    {
        int fresh = pos;
        if (n_tok <= 64) {
            for (int t2 = lane; t2 < n_tok; t2 += 32)
                if (tok_seq[t2] == seq) fresh = min(fresh, tok_pos[t2]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) fresh = min(fresh, __shfl_xor_sync(kFull, fresh, off));
        } else {
            fresh = 0;                                // wide (eager) steps: nothing to overlap
        }
        const int p = begin + lane;
        if (p < end && p < fresh) {
            const long long c = (long long)row[p] * cell_stride;
#pragma unroll
            for (int b = 0; b < D * 2; b += 128) {
                prefetch_l2(reinterpret_cast<const unsigned char*>(kb + c) + b);
                prefetch_l2(reinterpret_cast<const unsigned char*>(v_pool + (long long)kvh * D + c) + b);
            }
        }
    }
    pdl_wait();

    for (int i = lane; i < HEADS * D; i += 32) {
        const int h = i / D, d = i % D;
        sq[h][d] = h < nh ? q[((long long)tok * q_heads + h0 + h) * D + d] * q_scale : 0.f;
    }
    __syncwarp();

    float m[HEADS], l[HEADS], acc[HEADS][C];
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        m[h] = kNegInf;
        l[h] = 0.f;                                   // this lane's share; summed at the end
#pragma unroll
        for (int c = 0; c < C; ++c) acc[h][c] = 0.f;
    }
    for (int base = begin; base < end; base += 32) {
        const int p = base + lane;
        bool vis = p < end;
        if (vis && visible != nullptr) vis = visible[(long long)tok * table_width + p] != 0;
        const u32 vmask = __ballot_sync(kFull, vis);
        if (vmask == 0) continue;
        const int cell = vis ? row[p] : 0;

        float s[HEADS];
#pragma unroll
        for (int h = 0; h < HEADS; ++h) s[h] = 0.f;
        if (vis) {
            const uint4* kr = reinterpret_cast<const uint4*>(kb + cell * cell_stride);
#pragma unroll 1
            for (int c0 = 0; c0 < D / 8; c0 += KB) {
                uint4 w[KB];
#pragma unroll
                for (int j = 0; j < KB; ++j) w[j] = __ldg(kr + c0 + j);
#pragma unroll
                for (int j = 0; j < KB; ++j) {
                    const float kf[8] = {bf16_lo(w[j].x), bf16_hi(w[j].x), bf16_lo(w[j].y), bf16_hi(w[j].y),
                                         bf16_lo(w[j].z), bf16_hi(w[j].z), bf16_lo(w[j].w), bf16_hi(w[j].w)};
#pragma unroll
                    for (int h = 0; h < HEADS; ++h) {
                        const float4 a = *reinterpret_cast<const float4*>(&sq[h][8 * (c0 + j)]);
                        const float4 b = *reinterpret_cast<const float4*>(&sq[h][8 * (c0 + j) + 4]);
                        float t = s[h];
                        t = fmaf(kf[0], a.x, t); t = fmaf(kf[1], a.y, t); t = fmaf(kf[2], a.z, t);
                        t = fmaf(kf[3], a.w, t); t = fmaf(kf[4], b.x, t); t = fmaf(kf[5], b.y, t);
                        t = fmaf(kf[6], b.z, t); t = fmaf(kf[7], b.w, t);
                        s[h] = t;
                    }
                }
            }
        }
        // online softmax: the tile's max joins the running max; old sums rescale by 2^(m_old - m_new)
#pragma unroll
        for (int h = 0; h < HEADS; ++h) {
            float sh = softcap_log2 > 0.f ? softcap_log2 * tanhf(s[h] * inv_softcap) : s[h];
            sh = vis ? sh : kNegInf;
            const float mn = fmaxf(m[h], warp_max(sh));   // finite: the tile has a visible position
            const float alpha = exp2f(m[h] - mn);          // 0 while m[h] is still -inf
            const float ph = exp2f(sh - mn);
            m[h] = mn;
            l[h] = l[h] * alpha + ph;
            sp[lane][h] = ph;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[h][c] *= alpha;
        }
        __syncwarp();
        // hidden positions and the tile's tail load no V (their cells may hold anything)
        const int ntile = min(32, end - base);
        for (int j0 = 0; j0 < ntile; j0 += VB) {
            VT vv[VB];
#pragma unroll
            for (int j = 0; j < VB; ++j) {
                const int cj = __shfl_sync(kFull, cell, j0 + j);
                if ((vmask >> (j0 + j)) & 1u) vv[j] = __ldg(reinterpret_cast<const VT*>(vb + cj * cell_stride));
                else vv[j] = VT();
            }
#pragma unroll
            for (int j = 0; j < VB; ++j) {
                float vf[C];
                unpack(vv[j], vf);
#pragma unroll
                for (int h = 0; h < HEADS; ++h) {
                    const float ph = sp[j0 + j][h];
#pragma unroll
                    for (int c = 0; c < C; ++c) acc[h][c] = fmaf(ph, vf[c], acc[h][c]);
                }
            }
        }
        __syncwarp();                                 // sp is rewritten by the next tile
    }

#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
        const float lh = warp_sum(l[h]);
        if (h >= nh) continue;
        const long long r = (long long)tok * q_heads + h0 + h;
        if (gridDim.x == 1) {
            const float inv = lh > 0.f ? 1.f / lh : 0.f;   // a token that sees nothing gets zeros
            float o[C];
#pragma unroll
            for (int c = 0; c < C; ++c) out[r * D + lane * C + c] = o[c] = acc[h][c] * inv;
            if (xq != nullptr) q8_lane<C>(o, (int)r * D + lane * C, xq, xd, xs);
        } else {
            const long long pr = (long long)blockIdx.x * n_tok * q_heads + r;
#pragma unroll
            for (int c = 0; c < C; ++c) part_acc[pr * D + lane * C + c] = acc[h][c];
            if (lane == 0) {
                part_ml[2 * pr] = m[h];
                part_ml[2 * pr + 1] = lh;
            }
        }
    }
}

// out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M = max_s m_s; splits that saw nothing
// have m_s = -inf, l_s = 0 and weigh 0.
template <int D>
__global__ void __launch_bounds__(32)
attn_combine_kernel(float* __restrict__ out, const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                    int rows, int nsplit, int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs) {
    pdl_wait();
    // lanes read the splits' (m, l) side by side; then every split's acc columns are loaded
    // unconditionally (independent loads the warp keeps in flight) and weighted by a select, so
    // an empty split's unwritten partials (weight 0) never reach the sum
    constexpr int C = D / 32;
    const int r = blockIdx.x, lane = threadIdx.x;
    float mx = kNegInf;
    for (int s = lane; s < nsplit; s += 32) mx = fmaxf(mx, part_ml[2 * ((long long)s * rows + r)]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    const float mu = mx == kNegInf ? 0.f : mx;
    float total = 0.f, acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = 0.f;
    for (int s0 = 0; s0 < nsplit; s0 += 32) {
        const int s = s0 + lane;
        float w = 0.f;
        if (s < nsplit) {
            const long long pr = (long long)s * rows + r;
            w = exp2f(part_ml[2 * pr] - mu);
            total = fmaf(w, part_ml[2 * pr + 1], total);
        }
        const int n = min(32, nsplit - s0);
#pragma unroll 8
        for (int j = 0; j < n; ++j) {
            const float wj = __shfl_sync(kFull, w, j);
            const float* src = part_acc + ((long long)(s0 + j) * rows + r) * D + lane * C;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const float v = src[c];
                acc[c] = wj != 0.f ? fmaf(wj, v, acc[c]) : acc[c];
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(kFull, total, o);
    const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) out[(long long)r * D + lane * C + c] = acc[c] = acc[c] * inv;
    if (xq != nullptr) q8_lane<C>(acc, r * D + lane * C, xq, xd, xs);
}

#ifdef GLIMMER_INSTANTIATE
#define SPLIT(D, H) template __global__ void attn_split_kernel<D, H>(float*, float*, float*, const float*, \
    const unsigned short*, const unsigned short*, const int*, const int*, const int*, const int*,          \
    const unsigned char*, int, int, int, int, int, int, float, float, float, int*, float*, float*);
#define SPLIT_ALL(D) SPLIT(D, 1) SPLIT(D, 2) SPLIT(D, 4) SPLIT(D, 8) \
    template __global__ void attn_combine_kernel<D>(float*, const float*, const float*, int, int, int*, float*, float*);
SPLIT_ALL(64) SPLIT_ALL(128) SPLIT_ALL(256)
#endif
