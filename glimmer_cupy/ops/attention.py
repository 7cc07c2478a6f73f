"""Attention over the KV cell pool and the KV write (see reference/attention.py for the rules;
kernels: cuda_src/attention_stream.cu and attention_mma.cu, the default pair, and
cuda_src/attention.cu).

On the GPU the pools hold bfloat16 bits (uint16; Gemma 3's activations overflow fp16), K and V
are written from float32 with round to nearest even, and q and the output stay float32. The
default (kernel="stream") runs on tensor cores, q and the softmax weights rounded to bf16 (NMSE
~5e-6 against the reference): decode-shaped steps (one token a block, split over positions) on
attn_stream_kernel, whose warps each stream their own tiles, and the others (prefill, verification
blocks) on attn_mma_kernel; kernel="mma" runs every shape on attn_mma_kernel; kernel="simt" keeps
the CUDA-core kernel (attn_kernel, float32 scores, NMSE ~1e-12). All read a KV head's cells once
for its whole GQA group.

What is checked before a launch: dtypes, shapes, contiguity, head_dim, the GQA ratio, window and
softcap. Index arrays given as NumPy arrays are checked on the host too (seq_lens within the table
width, tok_seq within the sequences, positions non-negative) and copied to the device — an
allocation, so not inside a captured step. Index arrays already on the device are not read back:
that cells lie inside the pool, positions below seq_lens fit the table and tok_seq names a
sequence of the step is the runtime's contract, and breaking it reads out of bounds.
"""

import math
from functools import cache

import numpy as np

from ..kernels.build import get_kernel, has_arch_specific, sm_count
from ..kernels.launch import allow_large_clusters, launch_cluster
from ..reference import attention as ref
from ._check import F32, I32, aligned, check, check_out, fail, no_overlap
from ._dispatch import host_result, is_host
from .prefetch import L2Ranges, prefetch_args
from .q8 import NO_CODES, q8_buffers, wants_q8, with_codes

BF16 = np.dtype(np.uint16)                   # bfloat16 bits
HEAD_DIMS = (64, 128, 256)
HEAD_CHUNKS = (1, 2, 4, 8)                   # query heads one warp scores against each K row
_EXPRS = ("kv_write_kernel",) + tuple(f"attn_kernel<{d}, {h}>" for d in HEAD_DIMS for h in HEAD_CHUNKS)
LOG2E = 1.4426950408889634

# Split count (flash-decoding). Each (token, kv head, head chunk) is cut into splits of whole tiles
# of 32 positions, one block of WARPS warps per split; a warp takes every WARPS-th tile of its
# block's range and the block's warps merge in shared memory, so a split leaves one partial. The
# rule fills the SMs with one wave of blocks, BLOCKS_PER_SM per SM (the kernel's launch bounds):
# a second, partial wave cost batch 8 at 8k 120 us against 100 in one wave. Two blocks per SM
# (up to 226 registers) measured as fast as three (<= 168) or 2-warp blocks at six per SM, or
# faster at batch 1 (bench/results/NOTES.md). A split is at least one tile; the grid's split count
# is a ceiling: the kernel cuts the positions a token actually sees, so a graph captured for the
# table's width runs only the blocks that a shorter sequence needs. MAX_SPLITS bounds the partials.
WARPS = 4                                    # kWarps in attention.cu
BLOCKS_PER_SM = 2                            # kBlocksPerSm in attention.cu
MIN_SPLIT = 32
MAX_SPLITS = 256
# One counter per (token, kv head, head chunk) of a split step: the blocks of a split count
# themselves done and the last merges the partials, then sets its counter back to 0. They live in
# one zeroed buffer per device (so a captured graph and eager calls share them; steps on one
# stream never overlap).
COUNTERS = 1 << 16


@cache
def _kernel(expr: str):
    return get_kernel("attention", expr, name_expressions=_EXPRS)


# The tensor-core kernel (attention_mma.cu, attn_mma_kernel<D, MW, STAGES>), the default: a block
# takes M = 16 MW query rows, (token, query head) pairs of one kv head. MW = 1 (16 rows, the group
# padded; 4 warps) for steps of at most one token per sequence, split over the positions like
# attn_kernel but in tiles of MMA_TILE; otherwise unsplit blocks of MW = 4 (64 rows, 4 warps) of
# 64 // group tokens (MW = 8, 128 rows of 8 warps, only when forced: measured slower). STAGES K/V
# tiles in flight (cp.async). The split rule is n_splits' (one wave of BLOCKS_PER_SM blocks) in
# MMA_TILE tiles, or one_block_splits' for an instance of one block an SM (head dim 256). Measured
# on the H200 (ea56ef0, bench/results/attention_mma_stages.md and attention_mma_prefill.md): decode
# batch 1 / 32k 53.0 us (attn_kernel 57.6), causal prefill T = 2048 276 us (attn_kernel 2372; SDPA
# 81.3).
MMA_TILE = 64                                # positions per K/V tile (kTile)
KERNELS = ("mma", "simt", "stream", "wgmma")
MMA_ROWS = (16, 64, 128)                     # rows per block: MW = 1, 4, 8
SMEM_PER_SM = 228 * 1024                     # H100 / H200: shared memory of an SM ...
SMEM_PER_BLOCK = 227 * 1024                  # ... the most one block may have ...
SMEM_RESERVED = 1024                         # ... and what the system takes per resident block


def mma_warps(mw: int) -> int:
    return 8 if mw == 8 else 4


def mma_smem(d: int, mw: int, stages: int = 2) -> int:
    """Dynamic shared memory of attn_mma_kernel<d, mw, stages>: Q rows, then K and V of each stage
    (rows of d + 8 bf16)."""
    return (16 * mw + 2 * stages * MMA_TILE) * (d + 8) * 2


def mma_static_smem(mw: int, stages: int) -> int:
    """Its static shared memory (ptxas: s_seq, s_lo, s_hi, s_off and the last-block flag)."""
    return 3 * 4 * 16 * mw + 8 * MMA_TILE * stages + 16


def mma_blocks_per_sm(d: int, mw: int, stages: int) -> int:
    """Blocks one SM holds: shared memory, and at most 2 (the launch bounds of MW = 1; the 64-row
    blocks' ~190 registers also allow 2 of 128 threads, the 128-row blocks' only 1 of 256)."""
    return blocks_by_smem(mma_smem(d, mw, stages) + mma_static_smem(mw, stages), 1 if mw == 8 else 2)


def blocks_by_smem(per_block: int, most: int) -> int:
    """Blocks of `per_block` bytes of shared memory one SM holds, at most `most` (0: too large)."""
    if per_block > SMEM_PER_BLOCK:
        return 0
    return min(most, SMEM_PER_SM // (per_block + SMEM_RESERVED))


# Decode splits merged in a thread block cluster (attention_mma.cu): with one token a block and at
# most MMA_CLUSTER splits (a graph's 1024-wide table gives 16), a (token, kv head, head chunk)'s
# splits are the blocks of one cluster, the split count rounded up to a power of two (the grid's
# x; blocks past the work only wait at the cluster's two barriers). They merge their partials
# through distributed shared memory: no partials in global memory, fence, counter, or last block
# reading them back from L2. More splits take that global path. 16 is past the portable 8: the
# function attribute allows it; blocks too large for two per SM (head dim 256) stop at 8, so that a
# cluster needs at most 8 SMs of a GPC.
MMA_CLUSTER = 16
CLUSTER_SIZES = (1, 2, 4, 8, 16)

# Head dims whose decode takes the two shortcuts by default: the cluster merge (mma_cluster) and the
# K/V rows copied before pdl_wait (mma_early); all three. Head dim 256 (Gemma 3) was held back
# while a Gemma-shaped graph test failed on its int8 codes: that test read every replay's codes
# after the last replay had overwritten them (the buffers a captured step writes are the same at
# every replay), so it compared the last step's codes with earlier outputs; read when each step
# ends, they are exact in every mode and path (bench/results/NOTES.md). force_cluster and
# force_early still choose either way for tests and benchmarks.
SHORTCUT_DIMS = (64, 128, 256)


def mma_early(d: int) -> bool:
    """Whether attn_mma_kernel with head dim d copies its old K/V rows before pdl_wait by default."""
    return d in SHORTCUT_DIMS


# The stream kernel (decode, one token a block) copies old K/V rows before pdl_wait only at these
# head dims. Timed in the models' own decode steps (bench/ab_attention_model.py, arms "rule" and
# "no early" alternated, bench/results/NOTES.md, the thirty-second session), the early copies cost
# SmolLM2 (64) ~7 us a step and Qwen3-0.6B (128) ~9, and changed nothing beyond the noise at 8B
# (128); Gemma 3 (256) measured the other way, 545-549 us with them against 560-564 without.
STREAM_EARLY_DIMS = (256,)


def stream_early(d: int) -> bool:
    """Whether attn_stream_kernel with head dim d copies its old K/V rows before pdl_wait by default."""
    return d in STREAM_EARLY_DIMS


def mma_cluster_cap(d: int, mw: int, stages: int) -> int:
    """The most blocks a cluster of attn_mma_kernel<d, mw, stages> may have (1: no clusters)."""
    if mw != 1:
        return 1
    return cluster_cap(mma_blocks_per_sm(d, mw, stages))


def cluster_cap(blocks_per_sm: int) -> int:
    """MMA_CLUSTER for kernels of two blocks an SM, else 8 (so that a cluster needs at most 8 SMs of
    a GPC)."""
    return MMA_CLUSTER if blocks_per_sm >= 2 else 8


def mma_cluster(d: int, mw: int, stages: int, splits: int) -> int:
    """Blocks per cluster of attn_mma_kernel<d, mw, stages> at `splits` splits: 1 (partials
    merged through global memory) or the power of two 2..16 at or above splits (one cluster a
    token's splits, merged in distributed shared memory), the latter for SHORTCUT_DIMS only."""
    if mw != 1:
        return 1
    return cluster_for(d, splits, mma_cluster_cap(d, mw, stages))


def pick_cluster(d: int, splits: int, cap: int, force_cluster: int | None, what: str) -> int:
    """cluster_for's choice, or force_cluster checked against the split count and the cap."""
    if force_cluster is None:
        return cluster_for(d, splits, cap)
    c = int(force_cluster)
    if c not in CLUSTER_SIZES or (c > 1 and (c > cap or c < splits)):
        raise fail("attention", "force_cluster", f"one of {CLUSTER_SIZES}, at least the {splits} splits and at "
                   f"most {cap} for {what}", c)
    return c


def cluster_for(d: int, splits: int, cap: int) -> int:
    """1, or the power of two 2..cap at or above splits (SHORTCUT_DIMS only)."""
    if splits <= 1 or d not in SHORTCUT_DIMS or splits > cap:
        return 1
    c = 2
    while c < splits:
        c *= 2
    return c


MMA_STAGES = (2, 3, 4)
# every instance that fits (attention_mma.cu instantiates the same list for the compile test)
MMA_VARIANTS = tuple((d, mw, st) for d in HEAD_DIMS for mw in (1, 4, 8) for st in MMA_STAGES
                     if mma_blocks_per_sm(d, mw, st) > 0)
_MMA_EXPRS = tuple(f"attn_mma_kernel<{d}, {mw}, {st}>" for d, mw, st in MMA_VARIANTS)


# The pipeline depth of every step: 2 stages. Measured on the H200 (bench_attention.py --stages,
# head dim 128): decode at batch 1 / 8 and 1k / 32k the same at 2 and 3 stages (53.0 / 53.1 us at
# 32k) and slower at 4, which leaves one block per SM (73.8); prefill with 64-row blocks 39.1 / 276
# us at T = 512 / 2048 with 2 stages against 54.6 / 440 with 3 (one block per SM). Bytes in flight
# are not what limits these kernels; two blocks per SM is. Other depths: force_stages.
MMA_DEPTH = 2


# The decode kernel (attention_stream.cu, attn_stream_kernel<D, STAGES>): for decode-shaped steps
# (one token a block) in place of attn_mma_kernel's 16-row blocks, with the same split rule, cluster
# merge and outputs; every warp streams its own 16-position tiles, STAGES deep. Q (16 rows), then
# per warp and stage 16 K and 16 V rows of d + 8 bf16.
STREAM_POS = 16                              # positions of a warp's tile (kPos)
STREAM_WARPS = 4


def stream_smem(d: int, stages: int) -> int:
    return (16 + STREAM_WARPS * stages * 2 * STREAM_POS) * (d + 8) * 2


def stream_blocks_per_sm(d: int, stages: int) -> int:
    """Blocks one SM holds by shared memory (32 bytes static: the last-block flag, the pushed merge's
    barriers), at most 2 (the launch bounds)."""
    return blocks_by_smem(stream_smem(d, stages) + 32, 2)


STREAM_VARIANTS = tuple((d, st) for d in HEAD_DIMS for st in MMA_STAGES if stream_blocks_per_sm(d, st) > 0)
_STREAM_EXPRS = tuple(f"attn_stream_kernel<{d}, {st}>" for d, st in STREAM_VARIANTS)
# The depth of a decode step: the deepest that keeps two blocks an SM (3 at head dim 64 and 128);
# head dim 256 fits one block of 2 stages (1 a SM either way at 2 or 3).
STREAM_DEPTH = {64: 3, 128: 3, 256: 2}


# Below 16 units and up to a width of STREAM_CAPPED_WIDTH: at most one split per STREAM_SPLIT_SPAN
# positions of the table's width, or as many as make STREAM_FEW_BLOCKS blocks (a power of two, so at
# 8 kv heads 8 splits: one portable cluster each, merged in distributed shared memory).
STREAM_SPLIT_SPAN = 512
STREAM_FEW_BLOCKS = 64
STREAM_CAPPED_WIDTH = 8192
STREAM_MERGE_SPAN = 8


def stream_splits(units: int, max_len: int, sms: int = 132, d: int = 128, stages: int | None = None) -> int:
    """Splits per (token, kv head, head chunk) of a decode step on attn_stream_kernel<d, stages> (stages:
    STREAM_DEPTH's). units: tokens x kv heads x head chunks; max_len: the table's width in a graph.

    Below 16 units: one wave of two blocks an SM (n_splits), up to a width of STREAM_CAPPED_WIDTH
    capped at max(the power of two at or below STREAM_FEW_BLOCKS // units, max_len //
    STREAM_SPLIT_SPAN). For Qwen3's 8 kv heads: 8 splits up to a width of 4096, 16 at 8192, the
    wave's 33 from 16384; SmolLM2's 3: 16. Measured in the models' decode step
    (bench/ab_attention_model.py; bench/results/NOTES.md, the thirty-first session), synthetic
    Qwen3-8B, GPU step µs at the wave's split count / 16 / 8 splits:

        width 1024   2150-2168 (16) / -         / 2120-2134
        width 2048   2297 (32)      / 2227-2241 / 2212-2226
        width 4096   2335 (33)      / 2283-2288 / 2247-2260   (a 2100-position sequence)
        width 8192   2489-2494 (33) / 2447-2452 / 2458-2462
        width 16384  2581 (33)      / 2611      / 2660        (32 splits: 2610-2613)
        width 32768  3399-3417 (33) / 3692      / 4177

    A split of few positions and a 16-block cluster both cost the step more than the wave's
    parallelism gains until a token sees some thousands of positions. SmolLM2 (3 kv heads) at width
    1024: 16 splits 519.5-522.6 µs a step, 8 splits 528.3-529.6.

    From 16 units one block an SM (batch 8: 2 splits 17.2 / 79.2 / 287.8 us at 1k / 8k / 32k
    against the two-a-SM wave's 4 splits' 25.0 / 94.0 / 340.2; batch 32 and 64 take 1).

    An instance that holds one block an SM (head dim 256) takes, at any units, at most one wave of
    one block an SM and at most the power of two at or below sqrt(max_len / STREAM_MERGE_SPAN): the
    last block of a (token, kv head) merges every split's partial alone, so the merge grows with the
    splits as the stream shrinks with them, and their sum is least near the square root. Gemma 3's
    heads (4 / 1 / 256) on an H100, µs (bench/results/NOTES.md, the sixty-eighth session):

        batch 1:  1k  8 splits 9.2,  16 10.1, 32 11.7
                  8k  16 19.5, 32 16.7, 64 18.8-19.0, 132 24.1, 256 41.8
                  16k 64 21.8, 132 28.2, 256 45.0            (SDPA 20.3)
                  32k 32 32.2, 64-66 28.6-28.7, 132 33.2, 256 52.2
        batch 8:  1k  8 11.6-11.9, 16 13.4; 8k 8 34.6, 16 32.8-34.1, 32 39.9; 32k 16 99.0, 33 105.4"""
    if stream_blocks_per_sm(d, STREAM_DEPTH[d] if stages is None else stages) < 2:
        return one_block_splits(units, max_len, sms)
    if units < 16:
        wave = n_splits(units, max_len, sms, MMA_TILE)
        if max_len > STREAM_CAPPED_WIDTH:
            return wave
        few = 1 << max(0, (STREAM_FEW_BLOCKS // units).bit_length() - 1)
        return min(wave, max(few, max_len // STREAM_SPLIT_SPAN))
    return one_block_wave(units, max_len, sms)


def one_block_wave(units: int, max_len: int, sms: int = 132) -> int:
    """Splits that fill the SMs with one wave of one block an SM: at most sms // units, the width's
    tiles of MMA_TILE and MAX_SPLITS, at least 1."""
    return max(1, min(sms // units, -(-max_len // MMA_TILE), MAX_SPLITS))


def one_block_splits(units: int, max_len: int, sms: int = 132) -> int:
    """Decode splits of a tensor-core instance that holds one block an SM (head dim 256, either kernel):
    at most one wave of one block an SM, the width's tiles of MMA_TILE and the power of two at or below
    sqrt(max_len / STREAM_MERGE_SPAN) (stream_splits says why). attn_mma_kernel's counts at Gemma 3's
    heads on an H100 follow the same law, µs (bench/results/NOTES.md, the sixty-eighth session):
    batch 1 at 1k / 8k / 32k 8 splits 13.4, 32 25.5, 64 46.0 (the two-a-SM wave's 16 / 256 / 256: 15.1,
    42.0, 89.2); batch 8 8 splits 13.8, 16 42.5, 16 114.1 (16 / 33 / 33: 16.4, 49.4, 122.3)."""
    root = 1 << (math.isqrt(max(1, max_len // STREAM_MERGE_SPAN)).bit_length() - 1)
    return min(one_block_wave(units, max_len, sms), root)


def stream_cluster_cap(d: int, stages: int) -> int:
    """The most blocks a cluster of attn_stream_kernel<d, stages> may have (cluster_cap)."""
    return cluster_cap(stream_blocks_per_sm(d, stages))


@cache
def _stream_kernel(d: int, stages: int, defines: tuple[tuple[str, int], ...] = ()):
    """attn_stream_kernel<d, stages>; `defines`: attention_stream.cu's switches, for A/Bs."""
    kern = get_kernel("attention_stream", f"attn_stream_kernel<{d}, {stages}>", defines=dict(defines),
                      name_expressions=_STREAM_EXPRS)
    kern.fn.max_dynamic_shared_size_bytes = stream_smem(d, stages)
    kern.fn.preferred_shared_memory_carveout = 100
    allow_large_clusters(kern.fn)
    return kern


# Prefill on Hopper's warpgroup multiplies (attention_wgmma.cu, attn_wgmma_kernel<D, STAGES, WGS, PRODUCER>,
# sm_90a): unsplit blocks of WGS warpgroups, 64 WGS rows laid out as attn_mma_kernel's blocks of as
# many rows (rows // group tokens). The default for prefill-shaped steps of head dim 64 and 128
# ("stream"; "mma" keeps attn_mma_kernel). Measured on the H200 (bench/results/attention_wgmma_*.md), causal
# prefill T = 2048, Qwen3-8B heads: 64-row blocks (two an SM) 167 us, 128-row blocks 194,
# attn_mma_kernel 248, SDPA 83; 2 or 3 stages the same (a variant that overlapped each tile's softmax
# with the next tile's scores, measured no faster, was removed).
# Head dim 64 too, since its build reads q's fragments back from shared memory (WGMMA_Q_SHARED_DIMS;
# the first build's outputs were wrong: ptxas reused those registers inside the tile loop): at
# SmolLM2's heads (9 / 3) causal T = 512 22.2 us and T = 2048 53.4 against attn_mma_kernel's 25.6
# and 67.4 (bench/results/attention_wgmma_d64_14f1c48.md). 256 would not fit the registers.
WGMMA_DIMS = (64, 128)
WGMMA_DEFAULT_DIMS = (64, 128)
WGMMA_Q_SHARED_DIMS = (64,)          # attention_wgmma.cu's Q_SHARED: q's fragments in shared memory
WGMMA_DEPTH = 3                      # with the producer 2-3% faster than 2 (the same without it)
WGMMA_ROW_CHOICES = (64, 128)
WGMMA_ROWS = 64
# PRODUCER: one more warpgroup issues every K/V copy, the others wait on the stages' barriers.
# Measured (bench/results/attention_wgmma_producer_*_efce866.md), causal,
# against the same kernel without it: Qwen3-8B heads T = 512 24.8 / 26.2 us, 2048 147.7 / 166.5,
# 8192 1548 / 1974 (SDPA 12.8, 82.6, 1020); SmolLM2's T = 2048 46.2 / 53.5, T = 512 23.1 / 22.4. A
# producer of one warp was 2.6x slower (431 us at 2048: its copies issue ~80 cycles apart). With the
# copy unit's arrivals, the direct output store and the block's passes found once
# (bench/results/attention_wgmma_passes_d128_acead8a.md): T = 512 16.4 us, 2048 113.8, 8192 1483 (SDPA
# 12.8, 83.4, 1031.5; 111.6 against 83.8 at 2048 in another call); without the producer 20.5, 147.3, 1948.
WGMMA_PRODUCER = True
# With the producer, blocks stay resident over several work items (two blocks an SM, each taking items
# snake-wise): the producer makes the next item's token tables and starts its copies while the
# multiplying warpgroup finishes the last (attention_wgmma.cu). False: a block an item. WGMMA_MAX_BLOCKS
# caps the resident blocks (None: two an SM at 64 rows, one at 128; tests set a few to give every
# block many items). Measured
# (bench/results/attention_wgmma_resident_41ef0c6_h200.txt), Qwen3-8B heads, causal, against a block an
# item: T = 2048 110.8 / 119.9 us (SDPA 85.1), 8192 1523 / 1539 (1039); T = 512 has fewer items than
# blocks (18.4 either way). On an H100: 112.9 / 122.2 (SDPA 84.9).
WGMMA_PERSISTENT = True
WGMMA_MAX_BLOCKS: int | None = None
WGMMA_VARIANTS = tuple((d, st, r, p) for d in WGMMA_DIMS for st in (2, 3) for r in WGMMA_ROW_CHOICES
                       for p in (False, True)) + ((128, 4, 128, True),)     # the deep one: wgmma_depth


def wgmma_expr(d: int, stages: int, rows: int, producer: bool) -> str:
    """The name expression of attn_wgmma_kernel<d, stages, rows // 64, producer>."""
    return f"attn_wgmma_kernel<{d}, {stages}, {rows // 64}, {str(producer).lower()}>"


_WGMMA_EXPRS = tuple(wgmma_expr(*v) for v in WGMMA_VARIANTS)


def wgmma_smem(d: int, stages: int, rows: int = WGMMA_ROWS) -> int:
    """Dynamic shared memory of attn_wgmma_kernel<d, stages, rows // 64>: the K and V stages (and
    q's fragments where they are kept there) or the block end's merge, whichever is larger, and
    1024 bytes to align the swizzled tiles."""
    q = rows * d * 2 if d in WGMMA_Q_SHARED_DIMS else 0
    return max(2 * stages * MMA_TILE * d * 2 + q, 4 * (rows * d + 2 * rows)) + 1024


# head dims where 128-row prefill blocks are the default when resident blocks fill the SMs (wgmma_rows;
# measured at 128 only)
WGMMA_WIDE_DIMS = (128,)


def wgmma_items(n_tok: int, group: int, kv_heads: int, rows: int) -> int:
    """Work items of a prefill launch of rows-row blocks: each kv head's token blocks of rows // group
    tokens (attention_wgmma.cu's wgmma_token_blocks, at group <= rows)."""
    return kv_heads * -(-n_tok // (rows // group))


def wgmma_rows(n_tok: int, group: int, kv_heads: int, d: int, sms: int, resident: bool) -> int:
    """Rows of a prefill block: 128 (two multiplying warpgroups share each K/V tile, so half the
    tiles are copied) where resident producer blocks get at least 3.25 128-row items an SM, at
    WGMMA_WIDE_DIMS; else WGMMA_ROWS. Measured on an H100, Qwen3-8B heads, causal, 64 / 128 rows
    (bench/results/ab_prefill_rows_584cdb6_h100.txt): T = 1088 42.0 / 45.4 us, 1536 68.6 / 75.2,
    1600 74.9 / 76.0, 1664 78.9 / 80.1 (416 items, 3.15 an SM), 1728 84.0 / 83.5 (432, 3.27),
    1792 89.6 / 87.6, 2048 111.2 / 107.8, 2560 166.8 / 159.2; T = 8192 1501 / 1330
    (ab_prefill_r128p_c133a72_h100.txt). 128-row blocks copy half the K/V tiles from L2 (at 64 rows
    the copies alone take 73.5 of 111 us at T = 2048); with fewer items, one block an SM has too
    little to overlap its math with."""
    if not resident or d not in WGMMA_WIDE_DIMS:
        return WGMMA_ROWS
    return 128 if 4 * wgmma_items(n_tok, group, kv_heads, 128) >= 13 * sms else WGMMA_ROWS


# 128-row producer blocks with fewer work items than this an SM run 4 stages (wgmma_depth)
WGMMA_DEEP_ITEMS = 6


def wgmma_depth(items: int, d: int, rows: int, producer: bool, sms: int) -> int:
    """Stages of a prefill launch: 4 for 128-row producer blocks with fewer than WGMMA_DEEP_ITEMS
    items an SM at the head dims built with 4 (WGMMA_VARIANTS), else WGMMA_DEPTH. Measured with
    Qwen3-8B heads, causal, 3 / 4 / 5 stages on an H100 (bench/results/ab_prefill_stages_1d4dacf_h100.txt):
    T = 2048 (3.9 items an SM) 107.6 / 101.9 / 102.0 us, 4096 (7.8) 357.2 / 356.4 / 356.6, 8192 (15.5)
    1317 / 1345 / 1341; 3 / 4 stages (ab_prefill_depth_ce25013_h100.txt): 1792 87.9 / 86.0, 2048
    107.9 / 104.3, 3072 (5.8) 214.5 / 209.0; on the H200 (ab_prefill_depth_807626f_h200.txt): 2048
    105.1 / 101.9. With few items, a block's item boundaries (the next item's q read and tables) come
    every ~16 tiles and a deeper producer covers more of them; with many, 4 stages lose ~2% (not
    understood: the L1 is the same, the kernel asks for all of the shared memory at either depth)."""
    deep = (d, 4, rows, producer) in WGMMA_VARIANTS
    return 4 if deep and items < WGMMA_DEEP_ITEMS * sms else WGMMA_DEPTH


def wgmma_plan(n_tok: int, group: int, kv_heads: int, d: int, sms: int, producer: bool, resident: bool,
               force_rows: int | None = None, force_stages: int | None = None) -> tuple[int, int, int]:
    """(rows, stages, work items) of a prefill launch on attn_wgmma_kernel: wgmma_rows' and
    wgmma_depth's choices where not forced (the depth follows the rows either way)."""
    rows = force_rows or wgmma_rows(n_tok, group, kv_heads, d, sms, resident)
    items = wgmma_items(n_tok, group, kv_heads, rows)
    stages = int(force_stages) if force_stages else wgmma_depth(items, d, rows, producer, sms)
    return rows, stages, items


def wgmma_runs(d: int, group: int, kernel: str = "stream") -> bool:
    """Whether attn_wgmma_kernel serves a prefill step of head dim d and GQA group size `group`
    for `kernel` ("wgmma" asks for it at every head dim it is built for; "stream", the default,
    takes it at WGMMA_DEFAULT_DIMS)."""
    dims = WGMMA_DIMS if kernel == "wgmma" else WGMMA_DEFAULT_DIMS if kernel == "stream" else ()
    return d in dims and group <= min(WGMMA_ROW_CHOICES) and has_arch_specific()


@cache
def _wgmma_kernel(d: int, stages: int, rows: int, producer: bool = False):
    """attn_wgmma_kernel<d, stages, rows // 64, producer>."""
    from cupy_backends.cuda.api import driver
    kern = get_kernel("attention_wgmma", wgmma_expr(d, stages, rows, producer), name_expressions=_WGMMA_EXPRS)
    driver.funcSetAttribute(kern.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            wgmma_smem(d, stages, rows))
    driver.funcSetAttribute(kern.ptr, driver.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    return kern


@cache
def _mma_kernel(d: int, mw: int, stages: int, defines: tuple[tuple[str, int], ...] = ()):
    """attn_mma_kernel<d, mw, stages>; `defines`: attention_mma.cu's switches, for A/Bs."""
    kern = get_kernel("attention_mma", f"attn_mma_kernel<{d}, {mw}, {stages}>", defines=dict(defines),
                      name_expressions=_MMA_EXPRS)
    kern.fn.max_dynamic_shared_size_bytes = mma_smem(d, mw, stages)      # above the default 48 KB
    kern.fn.preferred_shared_memory_carveout = 100                        # two ~110 KB blocks need all of it
    if mw == 1:
        allow_large_clusters(kern.fn)
    return kern


def mma_plan(t: int, n_seqs: int, group: int, max_len: int, units_per_token: int, sms: int = 132,
             force_splits: int | None = None, force_rows: int | None = None, d: int = 128,
             stages: int = MMA_DEPTH) -> tuple[int, int, int, int]:
    """(mw, tokens per block, head chunks, splits) of attn_mma_kernel for a step of t tokens over
    n_seqs sequences: decode-shaped steps (t <= n_seqs) one token a block, split over positions;
    others 64 // group tokens a block (64 rows: measured faster than 128-row blocks, which hold
    one block per SM: T = 2048 276 against 298 µs), one split (a block of tokens from several sequences runs one pass per
    sequence, so the choice never changes the result). force_rows (benchmarks, tests): 16, 64 or
    128 rows a block. Decode splits of an instance (head dim d, `stages` deep) that holds one block an
    SM: one_block_splits."""
    if force_rows:
        if force_rows not in MMA_ROWS:
            raise fail("attention", "force_rows", f"one of {MMA_ROWS}", force_rows)
        mw = force_rows // 16
    elif t <= n_seqs:
        mw = 1
    else:
        mw = 4
    m = 16 * mw
    hpb = min(group, m)
    chunks = -(-group // hpb)
    tpb = 1 if chunks > 1 or mw == 1 else m // hpb
    if force_splits:
        splits = int(force_splits)
    elif mw == 1 and mma_blocks_per_sm(d, mw, stages) < 2:
        splits = one_block_splits(t * units_per_token * chunks, max_len, sms)
    elif tpb == 1:
        splits = n_splits(t * units_per_token * chunks, max_len, sms, MMA_TILE)
    else:
        splits = 1
    if splits > 1:
        tpb = 1
    return mw, tpb, chunks, splits


@cache
def _counters(device_id: int):
    import cupy
    with cupy.cuda.Device(device_id):
        return cupy.zeros(COUNTERS, dtype=cupy.int32)


def head_chunk(group: int) -> int:
    """Query heads per warp for a GQA group: the smallest chunk size that holds the group, else 8
    (then the group is split over ceil(group / 8) warps that each read the K row)."""
    return next((h for h in HEAD_CHUNKS if h >= group), HEAD_CHUNKS[-1])


def n_splits(units: int, max_len: int, sms: int = 132, tile: int = MIN_SPLIT) -> int:
    """Splits per (token, kv head, head chunk): as many as fill the SMs with one wave of blocks,
    no split shorter than one tile (MIN_SPLIT positions; attn_mma_kernel's are MMA_TILE), at most
    MAX_SPLITS.

    units: tokens x kv heads x head chunks (one block each per split); max_len: the most positions
    one token may see. E.g. on 132 SMs with 8 kv heads: batch 1 at 32k, min(264 // 8, 1024, 256)
    = 33 splits; batch 1 at 1k, 32; batch 8 at 8k, 4; batch 32, 1; 32 positions or fewer, 1."""
    want = BLOCKS_PER_SM * sms // max(units, 1)
    return max(1, min(want, -(-max_len // tile), MAX_SPLITS))


def workspace_size(tokens: int, q_heads: int, head_dim: int, splits: int = MAX_SPLITS) -> int:
    """float32 elements of the split partials (acc, then max and sum) for a step of `tokens`."""
    return splits * tokens * q_heads * (head_dim + 2)


def kv_write_(k_pool, v_pool, k, v, cells):
    """k_pool[cells[t]] = k[t]; v_pool likewise. On the GPU: pools bf16 bits (cells, kv_heads, D),
    k and v float32 (T, kv_heads, D) rounded to nearest even; cells int32 (T,) (one kernel)."""
    if is_host(k_pool):
        return ref.kv_write_(k_pool, v_pool, k, v, cells)
    op = "kv_write_"
    check(k_pool, op, "k_pool", dtypes=(BF16,), ndim=3)
    n_cells, hkv, d = k_pool.shape
    check(v_pool, op, "v_pool", dtypes=(BF16,), shape=(n_cells, hkv, d), like=k_pool)
    check(k, op, "k", dtypes=(F32,), shape=("T", hkv, d), like=k_pool)
    t = k.shape[0]
    check(v, op, "v", dtypes=(F32,), shape=(t, hkv, d), like=k_pool)
    check(cells, op, "cells", dtypes=(I32,), shape=(t,), like=k_pool)
    if (hkv * d) % 8 or not aligned(k_pool, v_pool, k, v):
        raise fail(op, "k_pool", "16-byte aligned arrays with kv_heads * head_dim a multiple of 8",
                   f"kv_heads * head_dim = {hkv * d}")
    if t == 0:
        return
    row8 = hkv * d // 8
    _kernel("kv_write_kernel")(((t * row8 + 255) // 256, 2), (256,),
                               (k_pool, v_pool, k, v, cells, np.int32(t), np.int32(row8)))


def check_args(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, window, softcap, visible,
               op="attention"):
    """The GPU path's checks (raise OpArgumentError, a ValueError). Reads dtype, shape and flags,
    and the values of index arrays only where they are NumPy arrays."""
    check(q, op, "q", dtypes=(F32,), ndim=3, like=None)
    t, hq, d = q.shape
    if d not in HEAD_DIMS:
        raise fail(op, "q", f"head_dim one of {HEAD_DIMS}", f"head_dim {d} (shape {tuple(q.shape)})")
    check(k_pool, op, "k_pool", dtypes=(BF16,), shape=("cells", "kv_heads", d))
    n_cells, hkv, _ = k_pool.shape
    check(v_pool, op, "v_pool", dtypes=(BF16,), shape=(n_cells, hkv, d), like=k_pool)
    if hkv == 0 or hq % hkv:
        raise fail(op, "q", f"q_heads a multiple of kv_heads = {hkv}", f"q_heads = {hq}")
    check(cell_table, op, "cell_table", dtypes=(I32,), shape=("S", "L"), like=None)
    s, width = cell_table.shape
    check(seq_lens, op, "seq_lens", dtypes=(I32,), shape=(s,))
    check(tok_seq, op, "tok_seq", dtypes=(I32,), shape=(t,))
    check(tok_pos, op, "tok_pos", dtypes=(I32,), shape=(t,))
    if visible is not None:
        check(visible, op, "visible", dtypes=(np.uint8, np.bool_), shape=(t, width))
    if int(window) < 0:
        raise fail(op, "window", "0 (off) or a positive number of positions", window)
    if not float(softcap) >= 0.0:
        raise fail(op, "softcap", "0.0 (off) or positive", softcap)
    # values: only where the host has them
    if is_host(seq_lens) and s and int(seq_lens.max()) > width:
        raise fail(op, "seq_lens", f"at most the cell_table width {width}", f"max {int(seq_lens.max())}")
    if is_host(seq_lens) and s and int(seq_lens.min()) < 0:
        raise fail(op, "seq_lens", "non-negative", f"min {int(seq_lens.min())}")
    if is_host(tok_seq) and t and not (0 <= int(tok_seq.min()) and int(tok_seq.max()) < s):
        raise fail(op, "tok_seq", f"indices into the {s} sequences", f"range {int(tok_seq.min())}..{int(tok_seq.max())}")
    if is_host(tok_pos) and t and int(tok_pos.min()) < 0:
        raise fail(op, "tok_pos", "non-negative", f"min {int(tok_pos.min())}")
    if is_host(cell_table) and cell_table.size and not (0 <= int(cell_table.min()) and int(cell_table.max()) < n_cells):
        raise fail(op, "cell_table", f"cells in 0..{n_cells - 1}", f"range {int(cell_table.min())}..{int(cell_table.max())}")
    if t > 65535:                                # grid z
        raise fail(op, "q", "at most 65535 tokens per call", f"{t} tokens")


def attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale: float,
              window: int = 0, softcap: float = 0.0, visible=None, *, out=None, workspace=None,
              force_splits: int | None = None, q8: bool = False, kernel: str = "stream",
              force_stages: int | None = None, force_rows: int | None = None, force_cluster: int | None = None,
              force_early: bool | None = None, force_producer: bool | None = None,
              prefetch: L2Ranges | None = None):
    """q: (T, q_heads, D) -> (T, q_heads, D) float32 over each token's own sequence's cells.

    GPU: q float32, pools bf16 bits (cells, kv_heads, D) with D in HEAD_DIMS, q_heads a multiple
    of kv_heads; cell_table (S, L), seq_lens (S,), tok_seq and tok_pos (T,) int32; visible
    (T, L) uint8 or bool. workspace: a float32 device array of at least workspace_size(T, q_heads,
    D) elements for the split partials; without it they are allocated when the step splits, which
    a captured graph cannot do.
    force_splits (benchmarks only) replaces the split rule's count.
    q8: on the GPU, also make the output's int8 codes (ops/q8.py) for a matmul that reads it, and
    return Q8Rows (reshape it to (T, q_heads * D) for the matmul); the NumPy path ignores it.
    kernel: "stream" (the default: decode-shaped steps on attn_stream_kernel, others on
    attn_wgmma_kernel where wgmma_runs says it serves them, else as "mma"), "wgmma" (the same, and
    attn_wgmma_kernel also at the head dims it is built for but the default does not take it),
    "mma" (attn_mma_kernel for every step: tensor cores, q and the softmax weights rounded to bf16,
    NMSE ~5e-6 against the reference) or "simt" (attn_kernel, CUDA cores, float32).
    force_stages, force_rows (benchmarks and tests, not "simt"): the pipeline depth (MMA_STAGES, or
    WGMMA_VARIANTS'; MMA_DEPTH, wgmma_depth's or STREAM_DEPTH otherwise; the same result at every depth)
    and the rows of a block (MMA_ROWS, or WGMMA_ROW_CHOICES for attn_wgmma_kernel, which 16 rows
    leave for attn_mma_kernel; mma_plan's rule, or wgmma_rows' for attn_wgmma_kernel, otherwise).
    force_cluster (benchmarks and tests, "mma" and "stream" only): blocks per cluster of a split decode step,
    one of CLUSTER_SIZES, at least the split count (mma_cluster's rule otherwise); 1 merges the
    splits through global memory.
    force_early (benchmarks and tests, "mma" and "stream" only): whether K/V rows below the step's lowest new
    position are copied before pdl_wait (stream_early's or mma_early's rule otherwise; no effect outside
    overlapped()).
    force_producer (benchmarks and tests, attn_wgmma_kernel only): whether its K/V copies are issued by
    a producer warpgroup (WGMMA_PRODUCER otherwise; the same result either way).
    prefetch: weights to bring into L2 (ops/prefetch.py: l2_ranges), asked for by the "stream" kernel's
    blocks of a pushed cluster merge but rank 0 as they leave; the other kernels and the NumPy path
    ignore it. It changes no result.
    """
    if kernel not in KERNELS:
        raise fail("attention", "kernel", " or ".join(map(repr, KERNELS)), repr(kernel))
    if prefetch is not None and not isinstance(prefetch, L2Ranges):
        raise fail("attention", "prefetch", "None or ops.prefetch.l2_ranges(...)", type(prefetch).__name__)
    if is_host(q):
        return host_result(ref.attention(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, scale,
                                         window, softcap, visible), out)
    import cupy

    op = "attention"
    check_args(q, k_pool, v_pool, cell_table, seq_lens, tok_seq, tok_pos, window, softcap, visible)
    check(k_pool, op, "k_pool", dtypes=(BF16,), ndim=3, like=q)
    host_len = int(seq_lens.max()) if is_host(seq_lens) and seq_lens.size else None
    # index arrays given on the host were checked above; the kernel reads device copies
    cell_table, seq_lens, tok_seq, tok_pos = (cupy.asarray(a) for a in (cell_table, seq_lens, tok_seq, tok_pos))
    if visible is not None:
        visible = cupy.asarray(visible)
    t, hq, d = q.shape
    hkv = k_pool.shape[1]
    width = cell_table.shape[1]
    if out is None:
        out = cupy.empty((t, hq, d), dtype=cupy.float32)
    check_out(out, op, (t, hq, d), like=q)
    no_overlap(out, q, op, "out", "q")
    if not aligned(q, k_pool, v_pool):
        raise fail(op, "q", "16-byte aligned q, k_pool and v_pool", "an offset view")
    if t == 0:
        return out
    group = hq // hkv
    codes_asked = q8 and wants_q8(t, hq * d, True)   # int8 codes of the output made in the kernels' end
    max_len = width if host_len is None else host_len
    if window and visible is None:
        max_len = min(max_len, int(window))
    mma_stages = int(force_stages) if force_stages else MMA_DEPTH
    if kernel != "simt":
        mw, tpb, chunks, splits = mma_plan(t, cell_table.shape[0], group, max_len, hkv, sm_count(), force_splits,
                                           force_rows, d, mma_stages)
    stream = kernel in ("stream", "wgmma") and mw == 1
    wgmma = (kernel in ("stream", "wgmma") and mw != 1 and force_rows in (None, *WGMMA_ROW_CHOICES)
             and not force_splits and wgmma_runs(d, group, kernel))
    if stream:                                       # decode: one token a block
        stages = int(force_stages) if force_stages else STREAM_DEPTH[d]
        if (d, stages) not in STREAM_VARIANTS:
            raise fail(op, "force_stages", f"one of {[st for dd, st in STREAM_VARIANTS if dd == d]} for head_dim {d}",
                       stages)
        if not force_splits:
            splits = stream_splits(t * hkv * chunks, max_len, sm_count(), d, stages)
        cluster = pick_cluster(d, splits, stream_cluster_cap(d, stages), force_cluster,
                               f"head_dim {d}, {stages} stages")
        fn, block = _stream_kernel(d, stages), (32 * STREAM_WARPS,)
        grid = (cluster if cluster > 1 else splits, hkv * chunks, t)
        smem = stream_smem(d, stages)
    elif wgmma:                                      # prefill: 128-row blocks, one split
        producer = WGMMA_PRODUCER if force_producer is None else bool(force_producer)
        resident = producer and WGMMA_PERSISTENT and not codes_asked
        rows, stages, items = wgmma_plan(t, group, hkv, d, sm_count(), producer, resident, force_rows, force_stages)
        if (d, stages, rows, producer) not in WGMMA_VARIANTS:
            raise fail(op, "force_stages", f"one of {sorted({v[1] for v in WGMMA_VARIANTS})} for the warpgroup kernel",
                       stages)
        chunks, tpb, splits, cluster = 1, rows // group, 1, 1
        fn, block = _wgmma_kernel(d, stages, rows, producer), (2 * rows + 128 * producer,)
        per_sm = 2 if rows == 64 else 1                 # blocks an SM (attention_wgmma.cu's launch bounds)
        grid = (min(items, WGMMA_MAX_BLOCKS or per_sm * sm_count()) if resident else items, 1, 1)
        smem = wgmma_smem(d, stages, rows)
    elif kernel != "simt":
        stages = mma_stages
        if (d, mw, stages) not in MMA_VARIANTS:
            raise fail(op, "force_stages", f"one of {[st for dd, m, st in MMA_VARIANTS if (dd, m) == (d, mw)]} "
                       f"for head_dim {d} and {16 * mw}-row blocks", stages)
        blocks_z = -(-t // tpb)
        if blocks_z > 65535:
            raise fail(op, "q", "at most 65535 token blocks per call", f"{blocks_z} ({t} tokens)")
        cluster = pick_cluster(d, splits, mma_cluster_cap(d, mw, stages), force_cluster,
                               f"head_dim {d}, {16 * mw}-row blocks, {stages} stages")
        fn, block = _mma_kernel(d, mw, stages), (32 * mma_warps(mw),)
        grid = (cluster if cluster > 1 else splits, hkv * chunks, blocks_z)
        smem = mma_smem(d, mw, stages)
    else:
        heads = head_chunk(group)
        chunks = -(-group // heads)
        splits = int(force_splits) if force_splits else n_splits(t * hkv * chunks, max_len, sm_count())
        fn, grid, block, smem = _kernel(f"attn_kernel<{d}, {heads}>"), (splits, hkv * chunks, t), (32 * WARPS,), 0
        cluster = 1
    # the tensor-core kernels' `early` argument: copy old K/V rows before pdl_wait
    early_rule = stream_early if stream else mma_early
    early = () if kernel == "simt" else (np.int32(early_rule(d) if force_early is None else bool(force_early)),)
    if not 1 <= splits <= 65535:
        raise fail(op, "force_splits", "1..65535", splits)
    if splits > 1 and cluster == 1:                  # partials through global memory
        n_acc, need = splits * t * hq * d, workspace_size(t, hq, d, splits)
        if workspace is None:
            workspace = cupy.empty(need, dtype=cupy.float32)
        check(workspace, op, "workspace", dtypes=(F32,), ndim=1, like=q)
        if workspace.size < need:
            raise fail(op, "workspace", f"at least {need} float32 for {splits} splits", workspace.size)
        if not aligned(workspace, to=8):             # the partials are stored in float2
            raise fail(op, "workspace", "an 8-byte aligned array", "an offset view")
        if t * hkv * chunks > COUNTERS:
            raise fail(op, "q", f"at most {COUNTERS} (token, kv head) pairs in a step that splits",
                       f"{t * hkv * chunks} ({t} tokens, {splits} splits)")
        part_acc, part_ml = workspace[:n_acc], workspace[n_acc:need]
    else:
        part_acc = part_ml = out                     # unused: the kernel writes out directly
    q_scale = scale if softcap else scale * LOG2E
    softcap_log2 = softcap * LOG2E if softcap else 0.0
    inv_softcap = 1.0 / softcap if softcap else 0.0
    vis = visible if visible is not None else np.uint64(0)           # a null pointer
    codes = q8_buffers(t, hq * d) if codes_asked else None
    qargs = codes if codes is not None else NO_CODES
    args = (out, part_acc, part_ml, _counters(q.device.id), q, k_pool, v_pool, cell_table, seq_lens, tok_seq,
            tok_pos, vis, np.int32(t), np.int32(hq), np.int32(hkv), np.int32(width), np.int32(chunks),
            np.int32(window), *early, np.float32(q_scale), np.float32(softcap_log2), np.float32(inv_softcap), *qargs,
            *(() if kernel == "simt" else prefetch_args(prefetch)))
    if cluster > 1:
        launch_cluster(fn, grid, block, args, smem, (cluster, 1, 1))
    else:
        fn(grid, block, args, shared_mem=smem)
    return with_codes(out, codes)
