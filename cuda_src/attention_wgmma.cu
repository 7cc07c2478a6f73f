// attention_wgmma.cu — prefill attention over the KV cell pool on Hopper's warpgroup multiplies
// (wgmma, sm_90a; the PTX in wgmma.cuh).
//
// The same inputs, outputs and visibility rules as attn_mma_kernel (attention_mma.cu; the NumPy spec
// is glimmer_cupy/reference/attention.py) and the same argument list, for blocks of several tokens
// with no split: ops/attention.py sends prefill-shaped steps here on an sm_90 device (head dims 64
// and 128). Its GPU tests are tests/test_attention_gpu.py
// (every test runs every kernel), its timings bench/results/attention_wgmma_*.md.
//
// attn_wgmma_kernel<D, STAGES, WGS, PRODUCER>  a block of WGS warpgroups (4 WGS warps) takes M = 64 WGS query rows
//     of one kv head, (token, query head) pairs exactly as attn_mma_kernel's blocks of M rows lay
//     them out (hpb heads of the GQA group times tpb consecutive tokens, token blocks in reverse):
//     warp w holds rows 16 w .. 16 w + 15, so warpgroup i rows 64 i .. 64 i + 63. One warpgroup
//     (two blocks an SM) or two (one block an SM, each K/V tile copied once for 128 rows).
//   q is read once, scaled, into registers as the bf16 A fragments of S = Q K^T (D / 16 k-steps);
//     at head dim 64 they are kept in shared memory and read back for each tile (Q_SHARED below).
//   The block walks K/V tiles of 64 positions of its tokens' sequence (one pass per distinct
//     sequence, as attn_mma_kernel), gathering a tile's K and V rows from the pool through the
//     cell table with cp.async (16-byte pieces) into the 128-byte-swizzled layout the tensor cores
//     read (wgmma.cuh), STAGES tiles deep, K and V separate commit groups. Two ways (PRODUCER):
//     - false: every thread of the warpgroups issues a share of each tile's pieces, each tile's
//       cell offsets read STAGES tiles ahead into s_off, and the block meets at a barrier a tile;
//     - true: one more warpgroup (the last, registers moved to the multiplying ones) issues every
//       piece; the multiplying warps only wait for a tile's K (then its V) on the stage's barriers
//       and hand the stage back on another, so the copies' instructions leave the math warps (a
//       third of the tile loop there, by the phase probe: bench/results/NOTES.md, the fortieth
//       session) and no barrier joins the warps a tile.
//   Per tile and warpgroup: S (64 rows x 64 positions) = D / 16 wgmma m64n64k16, A = q from
//     registers, B = the K tile (K-major); then per warp, in registers, softcap, masking where a
//     row does not see every position of the tile, the online softmax (attention_mma_frag.cuh:
//     tile_max, update) and P as bf16 A fragments; then O += P V: 4 k-steps x D / 64 wgmma
//     m64n64k16, B = the V tile read N-major (imm-trans-b).
//   End: each lane stores its rows' columns, normalised; where the int8 codes of the output are asked
//     for, as attn_mma_kernel's prefill blocks (attn_mma_end.cuh: end_block, one warp a row group).
//   Work items: item i is (kv head chunk i % Y, the (i / Y)-th token block from the end), Y = kv_heads *
//     head_chunks, so the longest come first. Block b of G takes items snake-wise: round r the
//     (r even ? b : G - 1 - b)-th of items r G .. r G + G - 1 (wgmma_item_index). With G = every item each
//     block takes one. With the producer and fewer blocks (two an SM at 64 rows, one at 128) a block
//     stays resident over its items: the producer makes the next item's token tables (double-buffered)
//     and starts its copies while the multiplying warps finish the last, so a block's start (index
//     reads, the passes, the first tiles' cells and copies: ~5 us of each block's ~30 in the phase
//     probe) overlaps work.
//   grid=(G,) block=(128 WGS + 128 PRODUCER,); G = every item where int8 codes are asked for (end_block
//   joins the whole block once)
//   dynamic shared memory (ops/attention.py: wgmma_smem): the K and V stages (then q's fragments
//   where Q_SHARED), or the block end's merge where that is larger, and 1024 bytes to start the
//   swizzled tiles on 1024.
// Error against the float64 reference: q and P rounded to bf16, as attn_mma_kernel.

#include "attn_mma_end.cuh"
#include "attn_mma_ptx.cuh"
#include "attn_mma_rows.cuh"
#include "pdl.cuh"
#include "wgmma.cuh"

// bytes of a K (or V) tile: 64 positions of D bf16
#define ATTN_WGMMA_TILE_BYTES(D) (64 * (D) * 2)

// The probe's phases (-DGLIMMER_STAMPS, bench/probe_attention_wgmma.py): each thread sums its SM
// clock's cycles in each phase of a tile, thread 0 writes the block's sums as stamps. Stamps 0-4
// are times (start, the first item's tables ready, its q read begun, the last item's tile loop
// ended, block done), 5 the tiles, 6 and 7 the cycles of every item's q read and of its output (the
// wait for an item's tables is left to the probe's rest), 8-14 the cycles of the phases in loop
// order (PHASE(i) ends phase i), 15 the cycles from stamp 2 to 3 (every item's q, tile loop and output).
#ifdef GLIMMER_STAMPS
#define WG_PHASES 7
#define PHASE_MARK() (ph_t = (unsigned)clock())
#define PHASE(i) do { const unsigned now_ = (unsigned)clock(); ph[i] += now_ - ph_t; ph_t = now_; } while (0)
#else
#define PHASE_MARK() ((void)0)
#define PHASE(i) ((void)0)
#endif

// Bounds of the tile loop, for the probe's question of what limits it (wrong results; never in a
// model): ATTN_WGMMA_COPY_ONLY keeps the producer's copies and the barriers and drops the multiplies
// and the softmax (the time the K/V tiles take to arrive); ATTN_WGMMA_MATH_ONLY keeps the math and
// the barriers and drops the copies (the multiplying warps' own chain).

// this thread's cp.async copies but the newest N groups have landed, and then every thread's: visible
// to the tensor cores (the async proxy) for the block
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N>
__device__ __forceinline__ void landed() {
    amma::cp_wait<N>();
    wg::fence_smem();
    __syncthreads();
}
#endif

// Item i of a launch whose blocks take M rows (above): its first token, tokens, kv head, first q head
// and heads.
struct WgItem {
    int t0, ntb, kvh, y, h0, nh;
};
// the token blocks of a launch (ops/attention.py's: M / hpb tokens a block at most)
template <int M>
__device__ __forceinline__ int wgmma_token_blocks(int n_tok, int q_heads, int kv_heads) {
    const int most = M / min(q_heads / kv_heads, M);
    return (n_tok + most - 1) / most;
}
template <int M>
__device__ __forceinline__ WgItem wgmma_item(int i, int n_tok, int q_heads, int kv_heads, int head_chunks) {
    const int group = q_heads / kv_heads, hpb = min(group, M), y_count = kv_heads * head_chunks;
    const int z_count = wgmma_token_blocks<M>(n_tok, q_heads, kv_heads);
    const int tpb = (n_tok + z_count - 1) / z_count;                 // the tokens spread evenly over them
    WgItem it;
    it.y = i % y_count;
    it.t0 = (z_count - 1 - i / y_count) * tpb;                       // longest blocks first
    it.ntb = min(tpb, n_tok - it.t0);
    it.kvh = it.y / head_chunks;
    const int hc = it.y % head_chunks;
    it.h0 = it.kvh * group + hc * hpb;
    it.nh = min(hpb, group - hc * hpb);
    return it;
}
// the index of this block's k-th item, or a value >= items past its last (snake order over rounds)
__device__ __forceinline__ int wgmma_item_index(int k, int items) {
    const int g = (int)gridDim.x, b = (int)blockIdx.x;
    const long long i = (long long)k * g + ((k & 1) ? g - 1 - b : b);
    return i < items ? (int)i : items;
}

// Registers: two blocks an SM at one warpgroup, one at two. With the producer warpgroup a block
// starts at 128 registers a thread at one multiplying warpgroup (two blocks of 256 threads fill the
// register file) and 168 at two (one block of 384); the producer gives back all but kProducerRegs
// and the multiplying warpgroups take kConsumerRegs (setmaxnreg): 128 (56 + 200) = 2 * 128 * 128 / 2,
// and 128 * 56 + 256 * 224 = 384 * 168.
constexpr int kProducerRegs = 56;
template <int WGS>
constexpr int kConsumerRegs = WGS == 1 ? 200 : 224;

template <int D, int STAGES, int WGS, bool PRODUCER>
__global__ void __launch_bounds__(128 * WGS + (PRODUCER ? 128 : 0), WGS == 1 ? 2 : 1) attn_wgmma_kernel(ATTN_TC_ARGS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace amma;
    constexpr int WARPS = 4 * WGS, THREADS = 32 * WARPS, M = 64 * WGS;   // the multiplying warpgroups'
    constexpr int NT = kTile / 8;                     // n-tiles of S per warp (64 positions)
    constexpr int NO = D / 8;                         // n-tiles of O per warp
    constexpr int KS = D / 16;                        // k-steps of S
    constexpr int PANELS = D / 64;                    // 64-wide panels of a K/V row
    constexpr u32 TILE = ATTN_WGMMA_TILE_BYTES(D);
    constexpr u32 PANEL = TILE / PANELS;              // bytes of a tile's 64-wide panel
    constexpr int PIECES = kTile * D / 8 / THREADS;   // 16-byte pieces of a tile's K (or V) per thread
    constexpr int ROW_STEP = THREADS / (D / 8);
    // Where q's fragments live across the tile loop: registers (read once), or shared memory, read back
    // for each tile's scores. At head dim 64 ptxas (13.0, and the JIT of the GPU runs) gives the
    // registers of the loop-invariant fragments to the softmax's temporaries and to P, so every tile
    // after the first multiplied by the last tile's P (the SASS writes them inside the loop; NMSE 6-68
    // on every multi-tile test). Read back, the fragments are defined inside the loop.
    constexpr bool Q_SHARED = D == 64;
    static_assert(D == 64 || D == 128, "head dims of this kernel");
    static_assert(PIECES * THREADS == kTile * D / 8 && ROW_STEP % 8 == 0, "tile copy keeps each piece's swizzle");
    static_assert(STAGES >= 2, "pipeline");
    // the producer's 128 threads' share of a tile (PIECES and ROW_STEP at one multiplying warpgroup)
    constexpr int P_PIECES = kTile * D / 8 / 128, P_ROW_STEP = 128 / (D / 8);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int NB = PRODUCER ? 2 : 1;              // token tables: the item's, and the next one's (PRODUCER)
    __shared__ int s_seq[NB][M], s_lo[NB][M], s_hi[NB][M];
    __shared__ int s_plo[NB][M], s_phi[NB][M];        // the item's passes (block_passes)
    __shared__ unsigned s_first[NB][M / 32];
    __shared__ long long s_off[PRODUCER ? 1 : STAGES][kTile];   // each stage's rows: byte offsets of their cells
    __shared__ unsigned long long s_bar[3][STAGES];   // PRODUCER: a stage's K landed, its V landed, its reads done
    __shared__ unsigned long long s_tab[2][NB];       // PRODUCER: a table buffer written, read
    const u32 raw = smem_u32(smem_raw);
    const u32 base = (raw + 1023u) & ~1023u;          // swizzled tiles start on 1024 bytes
    unsigned char* sbase = smem_raw + (base - raw);
    const u32 sK = base, sV = base + STAGES * TILE;   // stage s of K at sK + s * TILE
    uint4* qs = reinterpret_cast<uint4*>(sbase + 2 * STAGES * TILE);   // Q_SHARED: k-step ks at [ks * THREADS + tid]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int items = kv_heads * head_chunks * wgmma_token_blocks<M>(n_tok, q_heads, kv_heads);
    const int group = q_heads / kv_heads;
    const int hpb = min(group, M);
    const bool masked = visible != nullptr;
    const long long row_bytes = 2ll * kv_heads * D;
    auto item_at = [&](int k) {
        return wgmma_item<M>(wgmma_item_index(k, items), n_tok, q_heads, kv_heads, head_chunks);
    };

    STAMP(0);
    if (wgmma_item_index(0, items) >= items) return;
    {   // the first item's tables, by every thread
        const WgItem it = item_at(0);
        block_tokens(tok_seq, tok_pos, seq_lens, masked, window, it.t0, it.ntb, s_seq[0], s_lo[0], s_hi[0]);
    }
    if (PRODUCER && tid == 0)
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(&s_bar[0][i], 128u);            // the producer's threads, each after its own pieces landed
            mbar_init(&s_bar[1][i], 128u);
            mbar_init(&s_bar[2][i], (unsigned)WARPS); // a lane of each warp of the warpgroups
        }
    if (PRODUCER && tid == 0)
        for (int i = 0; i < NB; ++i) {
            mbar_init(&s_tab[0][i], 128u);            // the producer's threads, after the tables
            mbar_init(&s_tab[1][i], (unsigned)WARPS); // a lane of each multiplying warp, after its last read
        }
    __syncthreads();
    block_passes<M>(item_at(0).ntb, s_seq[0], s_lo[0], s_hi[0], s_first[0], s_plo[0], s_phi[0]);
    pdl_wait();                                       // q and the step's K/V rows are earlier kernels' output
    __syncthreads();
    STAMP(1);
    if constexpr (PRODUCER) {
        if (warp >= WARPS) {
            // Tile g goes to stage g % STAGES, tiles counted across the passes and the items; the stage
            // is free once the multiplying warps handed back tile g - STAGES. Each thread copies the
            // pieces the same thread of the warpgroup does without a producer (issue() below), its
            // rows' cells read one tile ahead into registers. Each thread's arrival on the stage's K
            // (then V) barrier is made by the copy unit once its pieces so far have landed (noinc:
            // counted in the barrier's 128), so the producer never waits for bytes, only for free
            // stages, and every stage can be in flight; the multiplying warps make the landed bytes
            // visible to the tensor cores after their wait. Item k's tables go to buffer k % 2, made
            // here from the second item on once the multiplying warps are done reading item k - 2's.
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
            const int pt = tid - THREADS;
            const int row0 = pt / (D / 8), col0 = 8 * (pt % (D / 8));
            const u32 dst0 = wg::sw128_offset(kTile, row0, col0);
            int st = 0, g = 0;
            u32 parity = 0;
            for (int k = 0; wgmma_item_index(k, items) < items; ++k) {
                const int ib = k & 1;
                const WgItem it = item_at(k);
                if (k > 0) {
                    if (k >= 2) mbar_wait(&s_tab[1][ib], ((k - 2) >> 1) & 1);
                    block_tokens(tok_seq, tok_pos, seq_lens, masked, window, it.t0, it.ntb, s_seq[ib], s_lo[ib],
                                 s_hi[ib], pt, 128);
                    bar_sync(1, 128);
                    block_passes<M>(it.ntb, s_seq[ib], s_lo[ib], s_hi[ib], s_first[ib], s_plo[ib], s_phi[ib], pt);
                    bar_sync(1, 128);
                    mbar_arrive(&s_tab[0][ib]);
                }
                // the item's q rows into L2 for the multiplying warps' reads, 128 bytes a piece
                for (int j = pt; j < it.ntb * it.nh * (D / 32); j += 128) {
                    const int r = j / (D / 32), c = j % (D / 32);   // row: token r / nh, head r % nh
                    prefetch_l2(q + ((long long)(it.t0 + r / it.nh) * q_heads + it.h0 + r % it.nh) * D + 32 * c);
                }
                const char* ksrc = reinterpret_cast<const char*>(k_pool + (long long)it.kvh * D + col0);
                const char* vsrc = reinterpret_cast<const char*>(v_pool + (long long)it.kvh * D + col0);
                const unsigned* first = s_first[ib];
                for (int pi = next_pass(0, it.ntb, first); pi < it.ntb; pi = next_pass(pi + 1, it.ntb, first)) {
                    const int LO = s_plo[ib][pi], HI = s_phi[ib][pi];
                    const int tiles = (max(HI - LO, 0) + kTile - 1) / kTile;
                    const int* crow = cell_table + (long long)s_seq[ib][pi] * table_width;
                    int cell[P_PIECES];
                    auto cells_of = [&](int tile) {
#pragma unroll
                        for (int j = 0; j < P_PIECES; ++j) {
                            const int p = LO + kTile * tile + row0 + j * P_ROW_STEP;
                            cell[j] = p < HI ? crow[p] : 0;
                        }
                    };
                    cells_of(0);
                    for (int tile = 0; tile < tiles; ++tile, ++g) {
                        long long off[P_PIECES];
#pragma unroll
                        for (int j = 0; j < P_PIECES; ++j) off[j] = (long long)cell[j] * row_bytes;
                        if (tile + 1 < tiles) cells_of(tile + 1);
                        if (g >= STAGES) mbar_wait(&s_bar[2][st], parity ^ 1u);
                        const int left = HI - (LO + kTile * tile + row0);
                        auto copy = [&](u32 stages, const char* src) {     // this thread's pieces of K or V
#pragma unroll
                            for (int j = 0; j < P_PIECES; ++j)
                                cp_async16(stages + st * TILE + dst0 + j * P_ROW_STEP * 128, src + off[j],
                                           j * P_ROW_STEP < left ? 16 : 0);
                        };
#ifndef ATTN_WGMMA_MATH_ONLY
                        copy(sK, ksrc);
#endif
                        cp_landed_arrive(&s_bar[0][st]);
#ifndef ATTN_WGMMA_MATH_ONLY
                        copy(sV, vsrc);
#endif
                        cp_landed_arrive(&s_bar[1][st]);
                        st = st == STAGES - 1 ? 0 : st + 1;
                        parity ^= st == 0 ? 1u : 0u;
                    }
                }
            }
            cp_commit();                              // nothing in flight at the thread's end
            cp_wait<0>();
            if (xq != nullptr) {                      // the block's two barriers after the tile loop when its
                __syncthreads();                      // end goes through end_block (below, and end_block's one
                __syncthreads();                      // for an unsplit block; one item a block then)
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs<WGS>));
    }
#ifdef GLIMMER_STAMPS
    unsigned ph[WG_PHASES] = {}, ph_t = 0;          // 32-bit sums: a block's loop is far below 2^32 cycles
    unsigned ph_q = 0, ph_end = 0;                  // every item's q read, its output
    int ph_tiles = 0;
#endif

    int st = 0;                                       // the stage of the next tile (PRODUCER: across passes, items)
    u32 parity = 0;                                   // PRODUCER: of the stages' phase of that tile
    STAMP(2);
#ifdef GLIMMER_STAMPS
    const long long ph_loop = clock64();
#endif
    for (int k = 0; wgmma_item_index(k, items) < items; ++k) {
#ifdef GLIMMER_STAMPS
        unsigned item_t = (unsigned)clock();
#endif
        const int ib = PRODUCER ? k & 1 : 0;              // the item's token tables
        const WgItem it = item_at(k);
        const int t0 = it.t0, ntb = it.ntb, h0 = it.h0, nh = it.nh;
        const unsigned short* kb = k_pool + (long long)it.kvh * D;
        const unsigned short* vb = v_pool + (long long)it.kvh * D;
        int rtok[2];
        row_tokens<M>(16 * warp, lane, hpb, ntb, nh, rtok);
        // q as bf16 A fragments, scaled: rows g and g + 8 of the warp, columns 2t, 2t + 1 (+ 8) of each k-step
        u32 qf[KS][4];
        {
            const float* qr[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = 16 * warp + (lane >> 2) + 8 * i;
                qr[i] = rtok[i] >= 0 ? q + ((long long)(t0 + rtok[i]) * q_heads + h0 + r % hpb) * D : nullptr;
            }
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
#pragma unroll
                for (int j = 0; j < 4; ++j) {             // a_j: row g + 8 (j & 1), columns + 8 (j >> 1)
                    const float* p = qr[j & 1];
                    const int c = 16 * ks + 2 * (lane & 3) + 8 * (j >> 1);
                    const float2 v = p != nullptr ? *reinterpret_cast<const float2*>(p + c) : make_float2(0.f, 0.f);
                    qf[ks][j] = pack_bf16(v.x * q_scale, v.y * q_scale);
                }
            if constexpr (Q_SHARED)
#pragma unroll
                for (int ks = 0; ks < KS; ++ks)
                    qs[ks * THREADS + tid] = make_uint4(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
            wg::hold(qf);
        }
#ifdef GLIMMER_STAMPS
        ph_q += (unsigned)clock() - item_t;
#endif
        if (PRODUCER && k > 0) mbar_wait(&s_tab[0][ib], ((k - 1) >> 1) & 1);   // the item's tables made

        float o[NO][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

        // one pass per distinct sequence, first token order
        for (int pi = next_pass(0, ntb, s_first[ib]); pi < ntb; pi = next_pass(pi + 1, ntb, s_first[ib])) {
            const int LO = s_plo[ib][pi], HI = s_phi[ib][pi];
            const int seq = s_seq[ib][pi];
            const int tiles = (max(HI - LO, 0) + kTile - 1) / kTile;
            const int* crow = cell_table + (long long)seq * table_width;
            RowRange rr;
            rr.set(rtok, seq, s_seq[ib], s_lo[ib], s_hi[ib], visible, t0, table_width);

            auto offset_of = [&](int tile, int j) {
                const int p = LO + kTile * tile + j;
                return tile < tiles && p < HI ? (long long)crow[p] * row_bytes : 0ll;
            };
            const int row0 = tid / (D / 8), col0 = 8 * (tid % (D / 8));
            const u32 dst0 = wg::sw128_offset(kTile, row0, col0);
            auto issue = [&](int tile, int st, const unsigned short* src, u32 dst) {
#ifdef ATTN_WGMMA_MATH_ONLY
                tile = tiles;                         // no copies: the probe's bound (above)
#endif
                if (tile < tiles) {
                    const char* src0 = reinterpret_cast<const char*>(src + col0);
                    const long long* offs = &s_off[st][row0];
                    const int left = HI - (LO + kTile * tile + row0);
#pragma unroll
                    for (int k = 0; k < PIECES; ++k) {
                        const int i = k * ROW_STEP;
                        cp_async16(dst + st * TILE + dst0 + i * 128, src0 + offs[i], i < left ? 16 : 0);
                    }
                }
            };
            if constexpr (!PRODUCER) {
                st = 0;
                for (int i = tid; i < STAGES * kTile; i += THREADS)
                    s_off[i / kTile][i % kTile] = offset_of(i / kTile, i % kTile);
                __syncthreads();
#pragma unroll
                for (int s = 0; s < STAGES - 1; ++s) {
                    issue(s, s, kb, sK);
                    cp_commit();
                    issue(s, s, vb, sV);
                    cp_commit();
                }
            }
            // S = Q K^T of the tile in stage `stage` into sc, issued (the caller waits)
            auto scores = [&](int stage, float (&sc)[NT][4]) {
                u32 qa[KS][4];
                if constexpr (Q_SHARED) {
#pragma unroll
                    for (int ks = 0; ks < KS; ++ks) {
                        const uint4 v = qs[ks * THREADS + tid];
                        qa[ks][0] = v.x, qa[ks][1] = v.y, qa[ks][2] = v.z, qa[ks][3] = v.w;
                    }
                    wg::hold(qa);
                }
#pragma unroll
                for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
                wg::hold(sc);
                wg::fence();
#pragma unroll
                for (int ks = 0; ks < KS; ++ks)
                    wg::mma_rs<0>(sc, Q_SHARED ? qa[ks] : qf[ks],
                                  wg::sw128_desc(sK + stage * TILE + (ks >> 2) * PANEL + (ks & 3) * 32, 16, 1024), ks > 0);
                wg::commit();
            };
            // softcap, mask, online softmax of the tile at pb: P as bf16 A fragments, O rescaled
            auto softmax = [&](float (&sc)[NT][4], int pb, u32 (&p)[NT / 2][4]) {
                const bool full = rr.all(pb, kTile, masked);
                if (softcap_log2 > 0.f)
#pragma unroll
                    for (int n = 0; n < NT; ++n)
#pragma unroll
                        for (int c = 0; c < 4; ++c) sc[n][c] = softcap_log2 * tanhf(sc[n][c] * inv_softcap);
                if (!full) rr.mask<NT>(sc, pb, lane);
                float mx[2];
                tile_max<NT>(sc, mx);
                mx[0] = quad_max(mx[0]);
                mx[1] = quad_max(mx[1]);
                update<NT, NO>(sc, mx, m, l, o, p);
            };
            // O += P V of the tile in stage `stage`, issued (the caller waits)
            auto values = [&](int stage, u32 (&p)[NT / 2][4]) {
                wg::hold(o);
                wg::hold(p);
                wg::fence();
#ifndef ATTN_WGMMA_PV_N64
                // head dim 128: one m64n128k16 a k-step over both 64-wide panels of V (LBO apart), half the
                // multiplies of an m64n64k16 a panel (ATTN_WGMMA_PV_N64, for A/Bs). On an H100, n128 / n64:
                // T = 2048 107.1 / 108.4 and 107.6 / 107.0 us, 8192 1372 / 1375 and 1331 / 1352
                // (bench/results/ab_prefill_next2_741f54e_h100.txt, ab_prefill_pv_1d4dacf_h100.txt)
                if constexpr (PANELS == 2) {
#pragma unroll
                    for (int ks = 0; ks < NT / 2; ++ks)
                        wg::mma_rs_n128<1>(*reinterpret_cast<float(*)[16][4]>(&o[0][0]), p[ks],
                                           wg::sw128_desc(sV + stage * TILE + ks * 16 * 128, PANEL, 1024));
                } else
#endif
#pragma unroll
                for (int ks = 0; ks < NT / 2; ++ks)
#pragma unroll
                    for (int pn = 0; pn < PANELS; ++pn)
                        wg::mma_rs<1>(*reinterpret_cast<float(*)[8][4]>(&o[8 * pn][0]), p[ks],
                                      wg::sw128_desc(sV + stage * TILE + pn * PANEL + ks * 16 * 128, PANEL, 1024), 1);
                wg::commit();
            };
            for (int tile = 0; tile < tiles; ++tile) {
                PHASE_MARK();
                long long next_off = 0;
                if constexpr (!PRODUCER) {
                    const int refill = st == 0 ? STAGES - 1 : st - 1;     // freed by the last tile's closing barrier
                    issue(tile + STAGES - 1, refill, kb, sK);
                    cp_commit();
                    issue(tile + STAGES - 1, refill, vb, sV);
                    cp_commit();
                    next_off = tid < kTile ? offset_of(tile + STAGES, tid) : 0;
                }
                float s[NT][4];
                u32 p[NT / 2][4];
                PHASE(0);                                 // the next tile's copies issued
                if constexpr (PRODUCER) {
                    mbar_wait(&s_bar[0][st], parity);
                    wg::fence_smem();                     // the producer's landed pieces, to the tensor cores
                } else
                    landed<2 * STAGES - 1>();             // K of this tile
                PHASE(1);
#ifndef ATTN_WGMMA_COPY_ONLY
                scores(st, s);
                wg::wait<0>();
                wg::hold(s);
#endif
                PHASE(2);
#ifndef ATTN_WGMMA_COPY_ONLY
                softmax(s, LO + kTile * tile, p);
#endif
                PHASE(3);
                if constexpr (PRODUCER) {
                    mbar_wait(&s_bar[1][st], parity);
                    wg::fence_smem();
                } else
                    landed<2 * STAGES - 2>();             // V of this tile
                PHASE(4);
#ifndef ATTN_WGMMA_COPY_ONLY
                values(st, p);
                wg::wait<0>();
                wg::hold(o);
#endif
                PHASE(5);
                if constexpr (PRODUCER) {
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&s_bar[2][st]);   // this warp's multiplies have read the stage
                } else {
                    if (tid < kTile) s_off[st][tid] = next_off;
                    __syncthreads();                      // stage st is refilled next
                }
                PHASE(6);
#ifdef GLIMMER_STAMPS
                ++ph_tiles;
#endif
                st = st == STAGES - 1 ? 0 : st + 1;
                parity ^= st == 0 ? 1u : 0u;
            }
        }

#ifdef GLIMMER_STAMPS
        item_t = (unsigned)clock();
#endif
        if constexpr (PRODUCER) {
            __syncwarp();
            if (lane == 0) mbar_arrive(&s_tab[1][ib]);    // this warp is done with the item's tables
        }
        cp_wait<0>();
        if (xq == nullptr) {
            // Each row is whole in one warp's fragments (a quad of lanes), so without int8 codes to
            // make (they need a row's 32-value groups on one lane's neighbours) the lanes store their
            // own columns, normalised: the same operations on the same values as end_block's merge of
            // one warp and end_row, with no pass through shared memory and no barrier.
            const float lq[2] = {quad_sum(l[0]), quad_sum(l[1])};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = 16 * warp + (lane >> 2) + 8 * h, ti = r / hpb, hh = r % hpb;
                if (ti >= ntb || hh >= nh) continue;      // padding rows
                const float inv = lq[h] > 0.f ? 1.f / lq[h] : 0.f;
                float* dst = out + ((long long)(t0 + ti) * q_heads + h0 + hh) * D + 2 * (lane & 3);
#pragma unroll
                for (int n = 0; n < NO; ++n)
                    *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
            }
        } else {
            __syncthreads();
            const EndRows ends{hpb, ntb, nh, t0, h0, q_heads, n_tok * q_heads, out, part_acc, part_ml,
                               counters + (long long)t0 * (kv_heads * head_chunks) + it.y, xq, xd, xs};
            end_block<D, M, 1, WARPS>(reinterpret_cast<float*>(sbase), o, m, l, warp, 0, 1, false, ends);
        }
#ifdef GLIMMER_STAMPS
        ph_end += (unsigned)clock() - item_t;
#endif
    }
    STAMP(3);
#ifdef GLIMMER_STAMPS
    const long long ph_loop_cycles = clock64() - ph_loop;
#endif
#ifdef GLIMMER_STAMPS
    STAMP(4);
    STAMP_VALUE(5, ph_tiles);
#pragma unroll
    for (int i = 0; i < WG_PHASES; ++i) STAMP_VALUE(8 + i, ph[i]);
    STAMP_VALUE(15, ph_loop_cycles);
    STAMP_VALUE(6, ph_q);
    STAMP_VALUE(7, ph_end);
#endif
#endif
}

#ifdef GLIMMER_INSTANTIATE
#define ATTN_WGMMA(D, S) \
    template __global__ void attn_wgmma_kernel<D, S, 1, false>(ATTN_TC_TYPES); \
    template __global__ void attn_wgmma_kernel<D, S, 2, false>(ATTN_TC_TYPES); \
    template __global__ void attn_wgmma_kernel<D, S, 1, true>(ATTN_TC_TYPES); \
    template __global__ void attn_wgmma_kernel<D, S, 2, true>(ATTN_TC_TYPES);
ATTN_WGMMA(64, 2) ATTN_WGMMA(64, 3) ATTN_WGMMA(128, 2) ATTN_WGMMA(128, 3)
template __global__ void attn_wgmma_kernel<128, 4, 2, true>(ATTN_TC_TYPES);
#endif
