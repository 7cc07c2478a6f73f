// attention_mma.cu — attention over the KV cell pool on tensor cores (mma.sync m16n8k16 bf16).
//
// The same inputs, outputs and visibility rules as attn_kernel (attention.cu; the NumPy spec is
// glimmer_cupy/reference/attention.py), the same argument list (plus `early`, below), the same
// split partials and "last block merges" counters, the same optional int8 codes of the output
// (q8.cuh).
// ops.attention's kernel for prefill-shaped steps (decode-shaped ones go to attn_stream_kernel,
// attention_stream.cu, unless kernel="mma"); its GPU tests are tests/test_attention_gpu.py (all
// of them run every kernel), timings bench/results/attention_mma.md;
// its fragment arithmetic is also checked on the CPU (tests/test_attention_mma_frag.py, through
// attention_mma_frag.cuh).
//
// attn_mma_kernel<D, MW, STAGES>  a block of WARPS warps (4; 8 for MW = 8) handles M = 16 MW query
//     rows of one kv head: the rows are (token, query head) pairs, hpb = min(group, M) heads of the
//     GQA group (head chunk blockIdx.y % head_chunks) times the tpb = ceil(n_tok / gridDim.z)
//     consecutive tokens of token block gridDim.z - 1 - blockIdx.z (reversed: in a causal prompt
//     the longest blocks start first) (ops picks tpb so that tpb * hpb <= M; rows past that are
//     padding, q = 0). Decode: MW = 1, one token, the group padded to 16 rows; prefill: MW = 4
//     (64 rows) or 8 (128 rows: each K/V tile copied once serves twice the rows).
//   The block walks K/V tiles of 64 positions of its tokens' sequence: the threads gather a tile's
//     K and V rows from the pool through the cell table with cp.async (16-byte pieces, a row's
//     D * 2 bytes contiguous; positions past the range are zero-filled, never read) into shared
//     memory (rows padded, or swizzled: kSwizzledTiles), STAGES stages: tiles i + 1 ..
//     i + STAGES - 1 are in flight while tile i is multiplied. K and V of a tile are separate
//     commit groups (the scores start when K has landed), and each tile's cell offsets are read
//     from the cell table STAGES tiles ahead into shared memory (s_off), so no copy waits on an
//     index load. The depth changes where a tile lands, never the arithmetic: every STAGES gives
//     the same output bit for bit.
//   Warp w = (mw, kw): rows 16 mw .. 16 mw + 15 of the block, positions kw * NW .. of each tile,
//     NW = 64 / KW with KW = WARPS / MW warps along positions (decode: 16 positions a warp;
//     prefill: all 64). S = Q K^T by mma (Q as bf16 in shared memory, pre-scaled; Q and K
//     fragments by ldmatrix); softcap (a uniform branch a tile); masking (window / causal /
//     visible / range) only where some position of the warp's slice is hidden from one of its
//     rows (padding rows never need it: they are not written); online softmax per row in
//     registers (row max over the quad of lanes that hold the row; exp2 by ex2.approx.ftz); P as
//     bf16 A fragments straight from S's registers; O += P V by mma (V fragments by
//     ldmatrix.trans). A lane holds rows g and g + 8 of its warp's 16 (lane = 4 g + t), columns
//     2t, 2t + 1 of each 8-wide n-tile of S and O.
//   End: the KW warps of a row group merge (m, l, O) in shared memory (the stage buffers); warp w
//     then takes rows w, w + WARPS, ..., lane C = D / 32 consecutive columns (q8_lane's layout).
//   Split-K (flash-decoding): blockIdx.x cuts the visible range into runs of whole tiles exactly as
//     attn_kernel's Span does with tiles of 64; with more than one block of work each writes a
//     partial, and the last block to count itself done on the (token, kv head x head chunk)
//     counter merges the partials in split order and resets the counter. ops launches splits > 1
//     only with one token per block. Decode with at most 16 splits (8 at head dim 256) may run a
//     token's splits as one thread block cluster (ops sets its size at launch, gridDim.x = the
//     cluster, a power of two; ops/attention.py: mma_cluster says when): each block leaves its
//     partial in its own shared memory, and after a cluster barrier warps of the cluster merge the
//     rows through distributed shared memory (attn_split.cuh: cluster_merge_row; blocks past the
//     work only wait at the barriers): no partials in global memory, no fence, counter or last
//     block.
//   PDL (pdl.cuh): before pdl_wait the block reads the index arrays and the cell table (the step's
//     upload) and, when `early` is set (ops/attention.py: mma_early), issues the cp.async copies
//     of its first STAGES - 1 tiles' K/V rows at positions below the lowest one the step writes
//     for its sequence (earlier steps' rows, which no kernel of this step writes). After the wait
//     the copies of the newer rows start first, and q is read while they are in flight. Without
//     `early` every copy comes after the wait. prepare_qkv lets this kernel be scheduled when it
//     starts (pdl_release), so the part before the wait overlaps the kernels before it.
//   Tokens of one block from different sequences (a batch of decodes packed several to a block)
//     are handled by one pass over the tiles per distinct sequence, the other rows masked.
//   grid=(splits, kv_heads * head_chunks, ceil(n_tok / tpb)) block=(32 * WARPS,)
//   dynamic shared memory: ATTN_MMA_SMEM(D, MW, STAGES) bytes = (M + 2 * STAGES * 64) rows of
//   D + 8 bf16, of which a swizzled K/V tile fills D (ops/attention.py: mma_smem; which depths
//   fit how many blocks: mma_blocks_per_sm).
// Scores live in the log2 domain as in attention.cu (q pre-multiplied by scale * log2 e, or by
// scale under a softcap whose factor carries log2 e). Error against the float64 reference: q and
// P rounded to bf16 (K and V are bf16 already); see tests/test_attention_gpu.py for the budget.

#include "attn_mma_end.cuh"
#include "attn_mma_ptx.cuh"
#include "attn_mma_rows.cuh"
#include "pdl.cuh"
#include "stamps.cuh"

namespace amma {

enum { kAllRows, kOldRows, kNewRows };        // which rows of a tile a copy issues (the PDL prologue)

// The K/V tiles' rows: unpadded with pieces swizzled (attention_mma_frag.cuh: at_swz) as
// attn_stream_kernel's ring, so that each cp.async's 32-byte shared units take one global sector
// each; ATTN_MMA_PADDED_TILES builds padded rows (at) instead, for the A/B: there every odd row sits
// 16 bytes off a unit and its copies fetch 1.5x the sectors, and causal prefill at T = 2048 took
// 5-8% more time on an H100 (bench/results/NOTES.md, sixty-seventh session)
#ifdef ATTN_MMA_PADDED_TILES
constexpr bool kSwizzledTiles = false;
#else
constexpr bool kSwizzledTiles = true;
#endif

}  // namespace amma

// Warps of a block: 8 for the 128-row prefill blocks, else 4
#define ATTN_MMA_WARPS(MW) ((MW) == 8 ? 8 : 4)
// bytes of dynamic shared memory: Q (M rows), then K and V of STAGES stages (64 rows each), sized
// for padded rows (swizzled tiles fill D of each D + 8; the block's end reuses the whole area)
#define ATTN_MMA_SMEM(D, MW, STAGES) ((16 * (MW) + 2 * (STAGES) * 64) * ((D) + 8) * 2)

template <int D, int MW, int STAGES>
__global__ void __launch_bounds__(32 * (MW == 8 ? 8 : 4), MW == 1 ? 2 : 1)    // the warps of ATTN_MMA_WARPS
attn_mma_kernel(ATTN_TC_ARGS) {
    using namespace amma;
    constexpr int WARPS = ATTN_MMA_WARPS(MW);
    constexpr int THREADS = 32 * WARPS;
    constexpr int M = 16 * MW;                        // query rows of the block
    constexpr int KW = WARPS / MW;                    // warps along a tile's positions
    constexpr int NW = kTile / KW;                    // positions per warp per tile
    constexpr int NT = NW / 8;                        // n-tiles of S per warp
    constexpr int NO = D / 8;                         // n-tiles of O per warp
    constexpr int RS = D + kRowPad;                   // shared row stride of Q and of a stage (bf16 values)
    constexpr int RR = kSwizzledTiles ? D : RS;       // a K/V tile's row stride
    constexpr int C = D / 32;                         // output columns per lane in the epilogue
    constexpr int PIECES = kTile * D / 8 / THREADS;   // 16-byte pieces of a tile's K (or V) per thread
    static_assert(NT % 2 == 0 && D % 64 == 0 && WARPS % MW == 0, "whole k-steps");
    static_assert(NW % 8 == 0, "a warp's slice of a tile starts on a row of swizzle period 0");
    static_assert(STAGES >= 2 && PIECES * THREADS == kTile * D / 8 && THREADS % (D / 8) == 0 && THREADS >= kTile, "tile copy");
    static_assert((KW * M * merge_stride<D, KW>() + 2 * KW * M) * 4 <= 2 * STAGES * kTile * RS * 2,
                  "the merge fits the stages");
    static_assert(MW != 1 || attn_end_floats<D, M, KW>() * 4 <= 2 * STAGES * kTile * RS * 2,
                  "the cluster partial fits the stages too");
    extern __shared__ __align__(128) unsigned short smem[];
    unsigned short* sQ = smem;
    unsigned short* sK = smem + M * RS;               // [stage][64 rows of RR, in 64 RS]
    unsigned short* sV = sK + STAGES * kTile * RS;
    __shared__ int s_seq[M], s_lo[M], s_hi[M];
    __shared__ long long s_off[STAGES][kTile];        // each stage's rows: byte offsets of their cells in a pool

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The swizzle phase (lane & 7) of the K/V rows this lane's ldmatrix addresses, taken at each
    // k-step from a register opaque to the compiler: knowing it, ptxas holds a base address for
    // each of the four phase-xored column groups (at head dim 256 those registers spilled)
    auto frag_phase = [lane] {
        int phase = lane & 7;
        if constexpr (kSwizzledTiles) asm volatile("" : "+r"(phase));
        return phase;
    };
    const int mw = warp / KW, kw = warp % KW;
    const int kvh = blockIdx.y / head_chunks, hc = blockIdx.y % head_chunks;
    const int group = q_heads / kv_heads;
    const int hpb = min(group, M);                    // heads of the group per block
    const int tpb = (n_tok + (int)gridDim.z - 1) / (int)gridDim.z;
    // token blocks in reverse: in a causal prompt the last tokens see the most positions, so the
    // longest blocks start first and the short ones fill the tail (any order gives the same result)
    const int t0 = ((int)gridDim.z - 1 - (int)blockIdx.z) * tpb;
    const int ntb = min(tpb, n_tok - t0);             // tokens of this block
    if (ntb <= 0) return;
    const int h0 = kvh * group + hc * hpb;            // first query head of this block's rows
    const int nh = min(hpb, group - hc * hpb);        // heads past nh are padding
    const bool masked = visible != nullptr;
    const long long row_bytes = 2ll * kv_heads * D;   // a cell of a pool
    const unsigned short* kb = k_pool + (long long)kvh * D;
    const unsigned short* vb = v_pool + (long long)kvh * D;
    const int rows = n_tok * q_heads;
    STAMP(0);

    // Before pdl_wait (pdl.cuh) the block reads only what the step's upload copied before its first
    // kernel ran (tok_seq, tok_pos, seq_lens, the cell table), and starts the cp.async copies of its
    // first pass's first STAGES - 1 tiles' K and V rows at positions below `fresh`, the lowest
    // position this step writes for that sequence: those rows are no kernel's output in this step
    // (a step writes only its own tokens' cells), so they may land while the kernel before (the
    // K/V write) finishes. q and the rows at or above `fresh` are read after the wait.
    block_tokens(tok_seq, tok_pos, seq_lens, masked, window, t0, ntb, s_seq, s_lo, s_hi);
    // not early, or wide (eager) steps: 0, nothing copied early
    const int fresh = early && n_tok <= 64 ? attn::first_new_position(tok_seq, tok_pos, n_tok, tok_seq[t0], lane) : 0;
    __syncthreads();

    // this lane's rows g and g + 8 of its warp: token index in the block (-1: padding)
    int rtok[2];
    row_tokens<M>(16 * mw, lane, hpb, ntb, nh, rtok);
    float o[NO][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    // > 1: this token's splits are the blocks of one cluster (ops: gridDim.x == ncl, one token a
    // block), which merge their partials through distributed shared memory
    const int ncl = (int)cluster_size();
    bool waited = false;                              // pdl_wait() is called in the first pass
    int active = 1;                                   // blocks with work (split mode: one pass)
    for (int pi = 0; pi < ntb; ++pi) {                // one pass per distinct sequence, first token order
        int LO, HI;
        if (!pass_range(pi, ntb, s_seq, s_lo, s_hi, LO, HI)) continue;
        const int seq = s_seq[pi];
        const int tiles = (max(HI - LO, 0) + kTile - 1) / kTile;
        const int per = max(1, (tiles + (int)gridDim.x - 1) / (int)gridDim.x);
        active = max(1, (tiles + per - 1) / per);
        // split mode only (one token): no partial. In a cluster that merges, the block stays (no
        // tiles) for the cluster barriers; nobody reads its partial (the merge reads `active`)
        const bool idle = (int)blockIdx.x >= active;
        if (idle && (ncl == 1 || active == 1)) return;
        const int tb = idle ? tiles : (int)blockIdx.x * per, te = idle ? tiles : min(tiles, tb + per);
        const int* crow = cell_table + (long long)seq * table_width;
        RowRange rr;                                  // this lane's rows in this pass
        rr.set(rtok, seq, s_seq, s_lo, s_hi, visible, t0, table_width);

        // The pipeline. A tile's cells are read from the cell table STAGES tiles ahead of its copy
        // (a register load in flight over one tile's math, stored to s_off at its end), so the
        // copy's addresses never wait on a global load. Tile j's K and V are two commit groups,
        // issued STAGES - 1 tiles ahead; past the last tile the groups are empty, so the wait
        // counts stay the same: with tiles tile .. tile + STAGES - 1 issued, K of `tile` is done
        // once at most 2 STAGES - 1 groups are pending, its V at 2 STAGES - 2.
        // byte offset of position j of `tile` in a pool (0 past the range: such pieces read nothing)
        auto offset_of = [&](int tile, int j) {
            const int p = LO + kTile * tile + j;
            return tile < te && p < HI ? (long long)crow[p] * row_bytes : 0ll;
        };
        // thread tid copies column piece tid % (D / 8) of rows tid / (D / 8) + k * (THREADS / (D / 8))
        constexpr int ROW_STEP = THREADS / (D / 8);
        static_assert(ROW_STEP % 4 == 0, "a thread's rows have two swizzle phases at most");
        const int row0 = tid / (D / 8), col0 = 8 * (tid % (D / 8));
        // part: kAllRows, or the rows no kernel of this step writes (kOldRows: below `fresh`, and
        // zero-filled rows past the range) or the others (kNewRows). Commits are the caller's.
        auto issue = [&](int tile, int st, const unsigned short* base, unsigned short* dst, int part) {
            if (tile < te) {
                // row row0 + i's piece: i is a multiple of ROW_STEP (4 or more), so its swizzle phase
                // is row0's, or row0's with bit 2 flipped where i & 4 (d4 as d0 shifted by 4 rows)
                const unsigned short* tile_base = dst + st * kTile * RS;
                const u32 d0 = smem_u32(tile_base + kv_at<D, kSwizzledTiles>(row0, col0));
                const u32 d4 = kSwizzledTiles
                                   ? smem_u32(tile_base + kv_at<D, kSwizzledTiles>(row0 + 4, col0)) - 8 * RR
                                   : d0;
                const char* src0 = reinterpret_cast<const char*>(base + col0);
                const long long* offs = &s_off[st][row0];
                const int p0 = LO + kTile * tile + row0;
                const int left = HI - p0, safe = fresh - p0;   // rows row0 + i: exist for i < left, old for i < safe
#pragma unroll
                for (int k = 0; k < PIECES; ++k) {
                    const int i = k * ROW_STEP;
                    const bool old = i < safe || i >= left;
                    if (part == kAllRows || (part == kOldRows) == old)
                        cp_async16(((i & 4) ? d4 : d0) + 2 * i * RR, src0 + offs[i], i < left ? 16 : 0);
                }
            }
        };
        for (int i = tid; i < STAGES * kTile; i += THREADS) s_off[i / kTile][i % kTile] = offset_of(tb + i / kTile, i % kTile);
        __syncthreads();
        const bool first_pass = !waited;
        if (first_pass) {
            // the first pass: old rows of the first stages before waiting, without commits, so that
            // with the new rows' commits after it the groups are the same as in any other pass
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s) {
                issue(tb + s, s, kb, sK, kOldRows);
                issue(tb + s, s, vb, sV, kOldRows);
            }
            STAMP(1);
            pdl_wait();
            STAMP(2);
            waited = true;
        }
        // the rest of the first stages (in the first pass the rows this step wrote) start before
        // q is read, so that their trip from L2 overlaps q's
        const int rest = first_pass ? kNewRows : kAllRows;
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            issue(tb + s, s, kb, sK, rest);
            cp_commit();
            issue(tb + s, s, vb, sV, rest);
            cp_commit();
        }
        if (first_pass) {
            // Q rows (token r / hpb, head r % hpb) scaled, as bf16 (prepare_qkv's output: after the
            // wait), QB float2 loads in flight at a time; the main loop's first barrier orders
            // these stores before any read
            constexpr int QN = M * D / 2 / THREADS, QB = QN < 8 ? QN : 8;
            static_assert(QN * THREADS == M * D / 2 && QN % QB == 0, "whole q loads per thread");
#pragma unroll 1
            for (int i0 = 0; i0 < QN; i0 += QB) {
                float2 v[QB];
#pragma unroll
                for (int j = 0; j < QB; ++j) {
                    const int i = tid + (i0 + j) * THREADS;
                    const int r = i / (D / 2), d = 2 * (i % (D / 2));
                    const int ti = r / hpb, hh = r % hpb;
                    v[j] = ti < ntb && hh < nh
                               ? *reinterpret_cast<const float2*>(q + ((long long)(t0 + ti) * q_heads + h0 + hh) * D + d)
                               : make_float2(0.f, 0.f);
                }
#pragma unroll
                for (int j = 0; j < QB; ++j) {
                    const int i = tid + (i0 + j) * THREADS;
                    const int r = i / (D / 2), d = 2 * (i % (D / 2));
                    *reinterpret_cast<u32*>(sQ + r * RS + d) = pack_bf16(v[j].x * q_scale, v[j].y * q_scale);
                }
            }
            STAMP(3);
        }
        int st = 0;                                   // stage of `tile`
        for (int tile = tb; tile < te; ++tile) {
            const int refill = st == 0 ? STAGES - 1 : st - 1;     // freed by the last tile's closing barrier
            issue(tile + STAGES - 1, refill, kb, sK, kAllRows);
            cp_commit();
            issue(tile + STAGES - 1, refill, vb, sV, kAllRows);
            cp_commit();
            const long long next_off = tid < kTile ? offset_of(tile + STAGES, tid) : 0;   // stage st's next tile
            cp_wait<2 * STAGES - 1>();                // K of this tile
            __syncthreads();
            if (tile == tb) STAMP(4);
            const int pb = LO + kTile * tile + kw * NW;   // the warp's first position
            const bool need = __any_sync(kAll, rr.any(pb, NW));
            const bool full = rr.all(pb, NW, masked);    // no position of the warp's slice hidden from any row
            float s[NT][4];
            if (need) {
                const unsigned short* tK = sK + st * kTile * RS + kw * NW * RR;   // NW: whole 8-row swizzle periods
#pragma unroll
                for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    const int phase = frag_phase();
                    u32 a[4];
                    const RowCol qa = q_addr(lane, ks);
                    ldsm_x4(a, smem_u32(sQ + at<D>(16 * mw + qa.row, qa.col)));
#pragma unroll
                    for (int np = 0; np < NT / 2; ++np) {
                        u32 b[4];
                        const RowCol ka = k_addr(lane, np, ks);
                        ldsm_x4(b, smem_u32(tK + kv_at<D, kSwizzledTiles>(ka.row, ka.col, phase)));
                        mma_bf16(s[2 * np], a, b[0], b[1]);
                        mma_bf16(s[2 * np + 1], a, b[2], b[3]);
                    }
                }
                if (softcap_log2 > 0.f)               // uniform: one branch a tile, not one an element
#pragma unroll
                    for (int n = 0; n < NT; ++n)
#pragma unroll
                        for (int c = 0; c < 4; ++c) s[n][c] = softcap_log2 * tanhf(s[n][c] * inv_softcap);
                if (!full) rr.mask<NT>(s, pb, lane);      // range (causal, window), visible
            }
            u32 p[NT / 2][4];                         // P as bf16 A fragments
            if (need) {
                float mx[2];
                tile_max<NT>(s, mx);
                mx[0] = quad_max(mx[0]);
                mx[1] = quad_max(mx[1]);
                update<NT, NO>(s, mx, m, l, o, p);
            }
            cp_wait<2 * STAGES - 2>();                // V of this tile
            __syncthreads();
            if (need) {
                const unsigned short* tV = sV + st * kTile * RS + kw * NW * RR;
#pragma unroll
                for (int ks = 0; ks < NT / 2; ++ks)
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        u32 b[4];
                        const int phase = frag_phase();
                        const RowCol va = v_addr(lane, ks, dp);
                        ldsm_x4_t(b, smem_u32(tV + kv_at<D, kSwizzledTiles>(va.row, va.col, phase)));
                        mma_bf16(o[2 * dp], p[ks], b[0], b[1]);
                        mma_bf16(o[2 * dp + 1], p[ks], b[2], b[3]);
                    }
            }
            if (tid < kTile) s_off[st][tid] = next_off;
            __syncthreads();                          // stage st is refilled next
            st = st == STAGES - 1 ? 0 : st + 1;
        }
    }

    // the stage buffers are free once the last copies (empty groups past the range) have landed
    STAMP(5);
    cp_wait<0>();
    __syncthreads();
    const EndRows ends{hpb, ntb, nh, t0, h0, q_heads, rows, out, part_acc, part_ml,
                       counters + (long long)t0 * gridDim.y + blockIdx.y, xq, xd, xs};
    end_block<D, M, KW, WARPS>(reinterpret_cast<float*>(sK), o, m, l, mw, kw, active,
                               MW == 1 && active > 1 && ncl > 1, ends);
}

#ifdef GLIMMER_INSTANTIATE
#define ATTN_MMA(D, MW, S) template __global__ void attn_mma_kernel<D, MW, S>(ATTN_TC_TYPES);
// every (D, MW, STAGES) whose shared memory fits a block (227 KB): ops/attention.py's MMA_VARIANTS
ATTN_MMA(64, 1, 2) ATTN_MMA(64, 1, 3) ATTN_MMA(64, 1, 4)
ATTN_MMA(64, 4, 2) ATTN_MMA(64, 4, 3) ATTN_MMA(64, 4, 4)
ATTN_MMA(64, 8, 2) ATTN_MMA(64, 8, 3) ATTN_MMA(64, 8, 4)
ATTN_MMA(128, 1, 2) ATTN_MMA(128, 1, 3) ATTN_MMA(128, 1, 4)
ATTN_MMA(128, 4, 2) ATTN_MMA(128, 4, 3) ATTN_MMA(128, 4, 4)
ATTN_MMA(128, 8, 2) ATTN_MMA(128, 8, 3) ATTN_MMA(128, 8, 4)
ATTN_MMA(256, 1, 2) ATTN_MMA(256, 1, 3)
ATTN_MMA(256, 4, 2)
ATTN_MMA(256, 8, 2)
#endif
