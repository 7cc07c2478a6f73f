// attention_stream.cu — decode attention over the KV cell pool (one query token a block) on
// tensor cores, each warp streaming its own K/V tiles through the bulk-copy engine.
//
// The same inputs, outputs, visibility rules, split partials, cluster merge and int8 output codes
// as attn_mma_kernel at 16 rows a block (attention_mma.cu; NumPy spec glimmer_cupy/reference/
// attention.py), and the same argument list; ops/attention.py runs it for decode-shaped steps
// (one token a block) and the mma kernel for the others.
//
// Why a second kernel: attn_mma_kernel's 16-row blocks copy 64-position tiles with cp.async and
// meet at three block barriers a tile; ncu at batch 1 / 32k (bench/results/NOTES.md) found 2 warps
// a scheduler issuing every 8.3 cycles, ~470 instructions per warp per 16 positions (a third of
// them the copies' address arithmetic: a 64-bit offset from shared memory per piece), DRAM at 44%.
// Here:
//   - warp w takes tiles w, w + 4, ... of 16 positions of the block's split (whole tiles of 16;
//     attn_mma_kernel's splits are whole tiles of 64), through its own STAGES-deep ring in shared
//     memory and its own cp.async groups (one a tile), so a warp waits only for its own bytes and
//     meets the other warps only at the end;
//   - lane r < 16 loads the cell of row r of the warp's tile two tiles ahead; a copy takes its row's
//     cell by a shuffle (bulk copies of a row each were tried: their operands are uniform
//     registers, so ptxas issues a warp's 32 rows one lane at a time, twice the instructions);
//   - O is rescaled only when some row's running max rose (after the first tiles, rarely).
//   Then the warps merge as attn_mma_kernel's do (attn_mma_end.cuh: end_block), and a cluster's
//   splits, when a block has at most 4 real rows (GQA up to 4), by pushing their partials into
//   rank 0's shared memory: rank 0 merges as soon as the last one lands, no block waits at a
//   cluster barrier after its partial, and no block reads another's shared memory.
// Rows of a partial last tile past the range are zero-filled; their scores are masked.
//
// attn_stream_kernel<D, STAGES>  grid=(splits, kv_heads * head_chunks, n_tok) block=(128,)
//   dynamic shared memory ATTN_STREAM_SMEM(D, STAGES) (ops/attention.py: stream_smem).
// PDL: before pdl_wait the block reads the step's index arrays and the cell table and, with
// `early`, issues the copies of its first tiles that lie wholly below the lowest position the step
// writes for its sequence (earlier steps' rows); the rest, and q, after the wait.
#include "attn_mma_end.cuh"
#include "attn_mma_ptx.cuh"
#include "pdl.cuh"

namespace astream {

constexpr int kWarps = 4;
constexpr int kRows = 16;          // query rows of a block: a token's group of heads, padded
constexpr int kPos = 16;           // positions of a warp's tile
// splits are whole tiles of a warp, so the longest split is ceil(positions / 16 / splits) tiles:
// at batch 1 / 32k, 33 splits of at most 1008 positions, where whole tiles of 64 (attn_mma_kernel's)
// gave 32 of 1024 and one idle (128k: 3984 against 4032); ATTN_SPLIT_TILES_OF_64 keeps those, for
// the A/B
#ifdef ATTN_SPLIT_TILES_OF_64
constexpr int kSplitTile = 64;
#else
constexpr int kSplitTile = kPos;
#endif

// The K/V ring's rows: unpadded with pieces swizzled (attention_mma_frag.cuh: at_swz), so that each
// cp.async's 32-byte shared units take one global sector each; ATTN_STREAM_PADDED_RING builds
// padded rows (at) instead, for the A/B
#ifdef ATTN_STREAM_PADDED_RING
constexpr bool kSwizzledRing = false;
#else
constexpr bool kSwizzledRing = true;
#endif

// a token's visible positions [lo, hi), and the share of them of a block (split) and of a warp
struct Span {
    int lo, hi;
    int per;                        // tiles of kSplitTile a split
    int active;                     // splits with work
    int p_begin, p_end;             // this block's positions
    int n_mine;                     // this warp's tiles of kPos
};

}  // namespace astream

// bytes of dynamic shared memory: Q (16 rows), then per warp and stage 16 K rows and 16 V rows, sized
// for padded rows (the swizzled ring fills D of each D + 8; the block's end reuses the whole area)
#define ATTN_STREAM_SMEM(D, STAGES) ((16 + 4 * (STAGES) * 32) * ((D) + 8) * 2)

template <int D, int STAGES>
__global__ void __launch_bounds__(128, 2)
attn_stream_kernel(ATTN_TC_ARGS) {
    using namespace amma;
    using namespace astream;
    constexpr int M = kRows, NT = kPos / 8, NO = D / 8, RS = D + kRowPad;
    constexpr int RR = kSwizzledRing ? D : RS;      // the ring's row stride (RS: the allocation's)
    static_assert(attn_end_floats<D, M, kWarps>() * 4 <= kWarps * STAGES * 2 * kPos * RS * 2,
                  "the merge and the cluster partial fit the stages");
    static_assert(attn_push_floats<D, M, kWarps>() * 4 <= kWarps * STAGES * 2 * kPos * RS * 2,
                  "the merge and a pushed merge's partials fit the stages");
    extern __shared__ __align__(128) unsigned short smem[];
    unsigned short* sQ = smem;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned short* ring = smem + M * RS + warp * STAGES * 2 * kPos * RR;   // [stage][K rows, V rows][RR]
    const int kvh = blockIdx.y / head_chunks, hc = blockIdx.y % head_chunks;
    const int group = q_heads / kv_heads;
    const int hpb = min(group, M);
    const int t0 = blockIdx.z;                        // this block's token
    const int h0 = kvh * group + hc * hpb;
    const int nh = min(hpb, group - hc * hpb);
    const bool masked = visible != nullptr;
    // a cell of a pool in 16-byte units (32 bits: pools up to 64 GB), and this lane's piece of the
    // kv head's row in each pool
    const u32 cell16 = (u32)(kv_heads * D / 8);

    STAMP(0);
    // Before pdl_wait: the step's upload only (tok_seq, tok_pos, seq_lens, the cell table)
    const int seq = tok_seq[t0], pos = tok_pos[t0];
    const int* crow = cell_table + (long long)seq * table_width;
    // the step's lowest new position of this sequence (0, nothing copied before the wait: not early,
    // or a wide eager step); loaded beside seq_lens and the first cells
    const int fresh = early && n_tok <= 64 ? attn::first_new_position(tok_seq, tok_pos, n_tok, seq, lane) : 0;
    // the positions [lo, hi) the token sees for a sequence length, and this block's and warp's share
    auto span_of = [&](int len) {
        Span sp;
        attn::visible_range(len, pos, masked, window, sp.lo, sp.hi);
        if (sp.hi <= sp.lo) sp.lo = sp.hi = 0;
        const int tiles = (sp.hi - sp.lo + kSplitTile - 1) / kSplitTile;
        sp.per = max(1, (tiles + (int)gridDim.x - 1) / (int)gridDim.x);
        sp.active = max(1, (tiles + sp.per - 1) / sp.per);
        const bool idle = (int)blockIdx.x >= sp.active;
        sp.p_begin = min(sp.hi, sp.lo + (int)blockIdx.x * sp.per * kSplitTile);
        sp.p_end = idle ? sp.p_begin : min(sp.hi, sp.p_begin + sp.per * kSplitTile);
        const int n_all = (sp.p_end - sp.p_begin + kPos - 1) / kPos;
        sp.n_mine = n_all > warp ? (n_all - warp + kWarps - 1) / kWarps : 0;
        return sp;
    };
    // the cell of row lane % 16 of this warp's tile j (0 past the range: never copied)
    auto cell_at = [&](const Span& sp, int j) {
        const int p = sp.p_begin + kPos * (warp + kWarps * j) + (lane & (kPos - 1));
        return j < sp.n_mine && p < sp.p_end ? crow[p] : 0;
    };
    // Unmasked, a token's range ends at its own position whenever its sequence reaches it (as the
    // runtime writes steps), so the cells of the first tiles are loaded for that range while
    // seq_lens is still in flight, and again only if the length says otherwise: two trips to the
    // upload before the first copies instead of three.
    int cells[STAGES];
    const Span guess = span_of(min(pos + 1, table_width));
    if (!masked)
#pragma unroll
        for (int s = 0; s < STAGES; ++s) cells[s] = cell_at(guess, s);
    const Span span = span_of(seq_lens[seq]);
    if (masked || span.lo != guess.lo || span.hi != guess.hi)
#pragma unroll
        for (int s = 0; s < STAGES; ++s) cells[s] = cell_at(span, s);
    const int hi = span.hi, active = span.active;
    const int ncl = (int)cluster_size();
    const bool idle = (int)blockIdx.x >= active;
    if (idle && (ncl == 1 || active == 1)) return;
    // a split cluster whose rows fit rank 0's area pushes its partials there (attn_mma_end.cuh);
    // its idle blocks take no part past the announcement
    __shared__ PushBars bars;
    const bool push = ncl > 1 && active > 1 && active <= kPushSplits && nh <= kPushRows;
    if (push) {
        push_begin(&bars);
        if (idle) {
            cluster_wait();
            return;
        }
    }
    // this block's positions [p_begin, p_end) and this warp's tiles of them
    const int p_begin = span.p_begin, p_end = span.p_end, n_mine = span.n_mine;
    auto tile_start = [&](int j) { return p_begin + kPos * (warp + kWarps * j); };
    auto cell_of = [&](int j) { return cell_at(span, j); };
    // tile j into stage j % STAGES: lane copies 16-byte piece lane % PPR of rows lane / PPR + RPI i,
    // each row's cell from the lane that loaded it (lane r: row r); rows past the range zero-filled
    constexpr int PPR = D / 8, RPI = 32 / PPR, ITER = kPos / RPI;
    const char* kp = reinterpret_cast<const char*>(k_pool + (long long)kvh * D + 8 * (lane % PPR));
    const char* vp = reinterpret_cast<const char*>(v_pool + (long long)kvh * D + 8 * (lane % PPR));
    // K and V, read once, are copied evict-first, so that the stream does not push the cell table,
    // the partials and the kernel's code out of L2 (batch 1 at 32k: 44.6 -> 42.3 us, bench/results/
    // NOTES.md); ATTN_KV_EVICT_NORMAL copies them with the default policy, for the A/B
#ifndef ATTN_KV_EVICT_NORMAL
    const unsigned long long kv_policy = l2_evict_first_policy();
#endif
    auto issue = [&](int j, int cell) {
        const int st = j % STAGES;
        const int rows = j < n_mine ? min(kPos, p_end - tile_start(j)) : 0;
        const u32 stage = smem_u32(ring + st * 2 * kPos * RR);
#pragma unroll
        for (int i = 0; i < ITER; ++i) {
            const int r = lane / PPR + RPI * i;
            const unsigned long long off = (unsigned long long)((u32)__shfl_sync(kAll, cell, r) * cell16) * 16u;
            const int n = r < rows ? 16 : 0;
            const u32 dk = stage + 2 * kv_at<D, kSwizzledRing>(r, 8 * (lane % PPR));
            const u32 dv = dk + 2 * kPos * RR;
#ifndef ATTN_KV_EVICT_NORMAL
            cp_async16_hint(dk, kp + off, n, kv_policy);
            cp_async16_hint(dv, vp + off, n, kv_policy);
#else
            cp_async16(dk, kp + off, n);
            cp_async16(dv, vp + off, n);
#endif
        }
        cp_commit();
    };

    // the first tiles: the wholly old ones (a prefix) before the wait, one commit group each, so that
    // group j is tile j's throughout
    int n_early = 0;
    while (n_early < STAGES && n_early < n_mine && min(p_end, tile_start(n_early) + kPos) <= fresh) {
        issue(n_early, cells[n_early]);
        ++n_early;
    }
    STAMP(1);
    pdl_wait();
    STAMP(2);
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
        if (s >= n_early) issue(s, cells[s]);
    int next_cell = cell_of(STAGES), next_cell2 = cell_of(STAGES + 1);

    // Q rows (head r, of this token) scaled, as bf16, shared by the warps
    {
        constexpr int QN = M * D / 2 / (32 * kWarps);
#pragma unroll
        for (int j = 0; j < QN; ++j) {
            const int i = tid + j * 32 * kWarps;
            const int r = i / (D / 2), d = 2 * (i % (D / 2));
            const float2 v = r < nh ? *reinterpret_cast<const float2*>(q + ((long long)t0 * q_heads + h0 + r) * D + d)
                                    : make_float2(0.f, 0.f);
            *reinterpret_cast<u32*>(sQ + r * RS + d) = pack_bf16(v.x * q_scale, v.y * q_scale);
        }
    }
    __syncthreads();
    STAMP(3);

    const unsigned char* rvis = masked ? visible + (long long)t0 * table_width : nullptr;
    float o[NO][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int j = 0; j < n_mine; ++j) {
        const int st = j % STAGES;
        const unsigned short* tK = ring + st * 2 * kPos * RR;
        const unsigned short* tV = tK + kPos * RR;
        const int pb = tile_start(j);
        cp_wait<STAGES - 1>();                        // tile j's group (one committed a tile since)
        __syncwarp();                                 // and every lane's pieces of it
        if (j == 0) STAMP(4);
        const bool full = !masked && pb + kPos <= hi;       // pb >= lo always
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            u32 a[4], b[4];
            const RowCol qa = q_addr(lane, ks);
            ldsm_x4(a, smem_u32(sQ + at<D>(qa.row, qa.col)));
            const RowCol ka = k_addr(lane, 0, ks);
            ldsm_x4(b, smem_u32(tK + kv_at<D, kSwizzledRing>(ka.row, ka.col)));
            mma_bf16(s[0], a, b[0], b[1]);
            mma_bf16(s[1], a, b[2], b[3]);
        }
        if (softcap_log2 > 0.f)                       // uniform: one branch a tile
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) s[n][c] = softcap_log2 * tanhf(s[n][c] * inv_softcap);
        if (!full)                                    // range (causal, window, the tile's end), visible
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int p = pb + 8 * n + c_col(lane, c);
                    bool vis = p < hi;
                    if (vis && rvis != nullptr) vis = rvis[p] != 0;
                    s[n][c] = vis ? s[n][c] : kNegInf;
                }
        // online softmax (attention_mma_frag.cuh's update, with O rescaled only when a max rose)
        float mx[2], mu[2], alpha[2];
        tile_max<NT>(s, mx);
        mx[0] = quad_max(mx[0]);
        mx[1] = quad_max(mx[1]);
        new_max(mx, m, l, mu, alpha);
        if (__any_sync(kAll, alpha[0] != 1.f || alpha[1] != 1.f)) rescale<NO>(o, alpha);
        u32 p[NT / 2][4];
        exp_pack<NT>(s, mu, l, p);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b[4];
            const RowCol va = v_addr(lane, 0, dp);
            ldsm_x4_t(b, smem_u32(tV + kv_at<D, kSwizzledRing>(va.row, va.col)));
            mma_bf16(o[2 * dp], p[0], b[0], b[1]);
            mma_bf16(o[2 * dp + 1], p[0], b[2], b[3]);
        }
        // stage st is free (its reads are in registers, consumed by the mma above) once every lane
        // is past them: the warp's tile j + STAGES goes there (an empty group past the last), its
        // cell loaded two tiles ago
        const int cell = next_cell;
        next_cell = next_cell2;
        next_cell2 = cell_of(j + STAGES + 2);
        __syncwarp();
        issue(j + STAGES, cell);
    }
    cp_wait<0>();                                     // the empty groups
    __syncthreads();                                  // every warp's copies have landed and been read
    STAMP(5);
    const amma::EndRows ends{hpb, 1, nh, t0, h0, q_heads, n_tok * q_heads, out, part_acc, part_ml,
                             counters + (long long)t0 * gridDim.y + blockIdx.y, xq, xd, xs};
    // the stages take the last block's merge of global partials (merge_rolled; ATTN_MERGE_PULLED:
    // merge_splits, for an A/B)
#ifdef ATTN_MERGE_PULLED
    constexpr int stage_floats = 0;
#else
    constexpr int stage_floats = kWarps * STAGES * kPos * RS;
#endif
    // a pushing block other than rank 0, once its rows are sent: warp 0 asks for its share of the
    // L2 prefetch ranges (the weights the matmuls after attention read), when no load on the step's
    // critical path can queue behind them but the next GEMV's x (ops/prefetch.py)
    const auto on_exit = [&]() {
        if (threadIdx.x < 32) {
            const long long cl = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * (gridDim.x / ncl) + blockIdx.x / ncl;
            prefetch_l2_share((int)threadIdx.x, cl * (ncl - 1) + (long long)cluster_rank() - 1,
                              (long long)gridDim.z * gridDim.y * (gridDim.x / ncl) * (ncl - 1), L2_PREFETCH_PASS);
        }
    };
    end_block<D, M, kWarps, kWarps>(reinterpret_cast<float*>(smem + M * RS), o, m, l, 0, warp, active,
                                    active > 1 && ncl > 1, ends, push ? &bars : nullptr, stage_floats, on_exit);
}

#ifdef GLIMMER_INSTANTIATE
#define ATTN_STREAM(D, S) template __global__ void attn_stream_kernel<D, S>(ATTN_TC_TYPES);
// every (D, STAGES) whose shared memory fits a block (227 KB): ops/attention.py's STREAM_VARIANTS
ATTN_STREAM(64, 2) ATTN_STREAM(64, 3) ATTN_STREAM(64, 4)
ATTN_STREAM(128, 2) ATTN_STREAM(128, 3) ATTN_STREAM(128, 4)
ATTN_STREAM(256, 2) ATTN_STREAM(256, 3)
#endif
