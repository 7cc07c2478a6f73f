"""Quantized matmul y = x @ W^T, W a QuantTensor read as GGUF blocks (kernels: cuda_src/quant_matmul.cu).

Bucketed by M, the rows of x. The table below is the one place the edges live.
"""

import contextlib
import contextvars
from functools import cache

import numpy as np

from ..kernels.build import dram_bytes_per_s, get_kernel, has_arch_specific, sm_count
from ..kernels.launch import launch_driver, tensor_map_2d
from ..kernels.cublas import gemm_bf16_nt
from ..reference import matmul as ref
from ..weights.quant_tensor import PAIR_ORDER, QType, QuantTensor
from ._check import F32, aligned, check, check_out, fail
from ._dispatch import host_result, is_host
from .q8 import Q8Rows, plain, staged_bytes

# QType -> trait struct in quant_blocks.cuh
TRAITS = {q: q.name for q in (QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0,
                               QType.Q5_1, QType.Q8_0, QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K,
                               QType.Q6_K)}
# types with an integer path (quant_dot.cuh): x quantized to int8 per 32 values, dp4a
DOT_TYPES = frozenset({QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K})
# types whose small-M GEMV lays lanes along the 256-value super-blocks (gemv_kq.cu)
KQ_TYPES = frozenset({QType.Q4_K, QType.Q6_K})
ROWS_PER_BLOCK = 4                  # kRowsPerBlock in quant_matmul.cu

# (largest M, bucket) per kind of type; the first row whose edge M fits wins.
#   gemv_dp4a: int8 dot products, each weight byte read once for all M rows of x. Float decoding
#     cannot keep up with the memory (H200, 2026-11-29, bench/results/quant_matmul_v1.md: the float
#     GEMV reached 9-16% of copy bandwidth at M = 1 and grew linearly with M); dp4a does 4 MACs
#     per instruction on the packed codes.
#   gemv: float decoding, for the types without an integer path (F16, BF16, F32, Q2_K, Q3_K, Q5_1).
#   dequant_cublas: decode W to a bf16 scratch, x to bf16, cuBLAS GEMM on tensor cores with
#     fp32 results (bf16, not fp16: Gemma's activations overflow fp16). Replaced a float32
#     scratch + SGEMM that ran at ~42 TFLOP/s, 14-17x cuBLAS fp16 (bench/results/quant_matmul_v3.md).
#   mma (not in the table; force_bucket="mma"): tensor cores in a kernel of ours (quant_mma.cu),
#     W decoded to bf16 tiles in shared memory, K split across blocks. What a CUDA graph captures
#     where the table says dequant_cublas and no kernel of the K-quant family serves (CuPy refuses
#     cuBLAS calls during capture; see graph_safe below). Measured
#     (H200, 2026-11-29, commit 178b26a) slower than dequant_cublas at every M from 17 to 64
#     (Q4_K 4096x4096 M=17: 58.6 vs 39.2 us; 12288x4096: 176 vs 97 us), so eager steps use cuBLAS.
#   gemv_kq: the int8 GEMV for Q4_K and Q6_K with eight lanes per super-block, every weight byte
#     read once in the widest loads the layout allows, R rows of W per warp (KQ_ROWS).
#   mma_kq: int8 tensor cores on Q4_K and Q6_K blocks for up to 32 rows of x (mma_kq.cu: 16 weight
#     rows as A, 8 rows of x per n-tile as B, K split across a block's warps). Measured on the H200
#     (bench/results/quant_matmul_v5.md, Q4_K at 07301a0; quant_matmul_q6k.md, Q6_K at 98a6f7d)
#     against gemv_kq at M = 8 / 16: Q4_K 4096x4096 8.2 / 13.8 vs 18.5 / 28.6 us, head 181.7 /
#     213.1 vs 363.7 / 693.4; Q6_K 4096x4096 12.2 / 15.5 vs 17.4 / 36.8, head 359.1 / 390.3 vs
#     376.0 / 851.0. At M = 17..32 it beats dequant_cublas (Q4_K 4096x4096 14.0-18.1 vs 38.6; Q6_K
#     at 32: 23.0 vs 41.8) and a graph can capture it. The GEMV wins at few rows: Q4_K through
#     M = 3 (at 4 mma_kq wins on every shape), Q6_K at M = 4 on three of four shapes (at 8 mma_kq
#     wins on all; 5..7 not measured, left to the GEMV). Above 32 rows a launch per 32 rows of x
#     (bench/results/quant_matmul_q6k_chunks_49bb99d.md, Q6_K, us, M = 33 / 64): 4096x4096 35.0 /
#     46.2 vs dequant_cublas 43.0 / 40.4, 12288x4096 88.7 / 112.2 vs 108.5 / 110.1, 4096x12288 96.6 /
#     128.0 vs 111.1 / 113.3, head 872 / 1028 vs 1178 / 1188; so Q6_K takes it through M = 40 (33..40
#     are a 32-row launch and one of a single n-tile, as at 33), and graphs through 64, where it
#     beats mma 1.3-2x (quant_matmul_q6k_mma_49bb99d.md: 57.0 / 61.3, 172 / 180, 167 / 175, 1715 / 1761).
#   mma_wg: Hopper's warpgroup multiplies on Q4_K (mma_wg.cu; sm_90 devices, elsewhere the table's
#     mma_wg rows run dequant_cublas, or mma inside graph_safe()), W decoded in registers into the A
#     fragments, no scratch copy of W, and a CUDA graph can capture it. Measured on the H200
#     (bench/results/quant_matmul_mma_wg_400555b.md) against dequant_cublas, Q4_K, us, at M = 64 / 512
#     (128 beside it): 4096x4096 37.9 / 42.0 (38.1) vs 37.7 / 57.8; 12288x4096 60.6 / 118.1 (39.9) vs
#     98.3 / 141.4; 4096x12288 104.4 / 121.2 (101.7) vs 101.8 / 142.8; head 151936x4096 452.5 / 1413.6
#     (370.4) vs 1030.9 / 1559.8. It loses 1-3% on two shapes at M = 64 and wins everywhere else
#     (2.3x on the head at M = 64), so it takes every M above 32. Launches of few tiles split K over
#     a cluster and partial tiles copy zeros past M (mma_wg_splits, mma_wg); with the copies spread
#     over the k-steps (mma_wg.cu) M = 33 / 64 / 512 now take 21.1 / 22.2 / 40.1 us on 4096x4096 and
#     282.5 / 306.4 / 1354.4 on the head (quant_matmul_q6k_chunks_49bb99d.md; 43.5 / 38.7 / 42.5 and
#     572 / 453 / 1388 before, quant_matmul_mma_wg_tiled_d1fdbf8.md).
#   mma_st at 4..64 rows of Q4_K and 8..64 of Q6_K: in synthetic Qwen3-8B's decode step of 16
#     sequences (bench/ab_mma_st_model.py, H100, bench/results/ab_mma_st_model_b16_c2ab0f0_h100.json) 3,998-4,001 µs
#     a step against 5,986-5,988 with mma_dq / mma_kq there (4,608-4,611 with mma_st on Q4_K only);
#     alone at M = 16 1.2-1.6x faster on every shape (ab_mma_st_*_h100.txt). With the tensor-map
#     kernel's ring, 17..32 rows too (before: mma_kq): the step of 32 sequences took 4,095.8-4,100.1 µs
#     against 11,492.2-11,494.0 (ab_mma_st_model_b32_efce00f_h100.txt); alone at M = 24 / 32 on x's
#     images 3-5x faster (4096x12288 12.9 / 15.1 µs against 57.6 / 83.3, ab_mma_st_edges_efce00f_h100.txt).
#     Q6_K at 4..7 rows on mma_st did not move the step of 6 (2,611.6-2,614.6 against 2,613.9-2,625.5).
#     33..64 rows, first as a launch (and its stage) a 32 rows, each reading W, against mma_wg (Q4_K)
#     and mma_kq / dequant_cublas (Q6_K): the step of 64 sequences took 7,900.4-7,901.1 µs against
#     12,181.1-12,335.4, of 48 7,806.7-7,822.7 against 12,137.7-12,189.8 (ab_mma_st_model_b64_1769bfa_h100.txt,
#     _b48_); now one launch where the tensor-map kernel serves W (MMA_ST_TMA_ROWS, below). Above 64
#     the table keeps mma_wg / dequant_cublas (not measured against more launches).
#     On devices without sm_90, and for a Q6_K tensor that does not end at a 16-byte boundary, those
#     rows keep mma_dq / mma_kq (mma_st_serves).
BUCKETS = {
    "q4k": ((3, "gemv_kq"), (64, "mma_st"), (None, "mma_wg")),
    "q6k": ((7, "gemv_kq"), (64, "mma_st"), (None, "dequant_cublas")),
    "dot": ((16, "gemv_dp4a"), (None, "dequant_cublas")),
    "float": ((8, "gemv"), (None, "dequant_cublas")),
}
BUCKET_NAMES = ("gemv_kq", "gemv_dp4a", "gemv", "mma", "dequant_cublas", "mma_kq", "mma_dq", "mma_wg", "mma_st")
INT8_BUCKETS = frozenset({"gemv_kq", "gemv_dp4a", "mma_kq"})    # x quantized to int8 per 32 values (ops/q8.py)
MMA_KQ_ROWS = 32                    # the widest M of an mma_kq launch (four n-tiles of 8 rows of x)
MMA_KQ_CHUNKED_ROWS = 64            # the widest M mma_kq serves, a launch per 32 rows (graph widths)
MMA_KQ_WARPS = 8                    # kMmaWarps in mma_kq.cu: tiles of 16 weight rows x slices of K
# MmaX<QT, 1>::kBytes in mma_kq_frag.cuh: one super-block of one n-tile of x as staged for weights
# of type QT (Q6_K: rows of codes padded by 16 bytes, xd without xs), for each type mma_kq serves
MMA_KQ_STAGE_BYTES = {QType.Q4_K: 2560, QType.Q6_K: 2432}
MMA_KQ_TYPES = frozenset(MMA_KQ_STAGE_BYTES)
MMA_KQ_MAX_SMEM = 80 << 10          # x's two stage buffers at most: two blocks per SM (228 KB), L1 the rest
MMA_KQ_TARGET_WARPS = 132 * 16      # slice K until about two blocks per SM of an H200 are launched
#   mma_dq: bf16 tensor cores on Q4_K for up to 32 rows of x (mma_dq.cu), each weight decoded once
#     in registers with its sub-block scale applied, the mins as one more mma a super-block, K split
#     over the blocks of a cluster. Measured on the H200 (bench/results/quant_matmul_mma_dq_62a0e87.md,
#     --pdl) against mma_kq at M = 9 / 16, µs: 4096x4096 10.7 / 11.1 vs 13.5 / 13.2, 12288x4096 21.2 /
#     22.6 vs 27.8 / 27.3, 4096x12288 28.0 / 29.9 vs 35.1 / 34.5, head 151936x4096 196.4 / 207.9 vs
#     214.0 / 215.4. At M = 4 and 8 it ties or loses (one n-tile costs it as much as two), at M = 32
#     it loses on three shapes (four n-tiles need 157 registers: one block an SM), so it takes 9..16.
MMA_DQ_TYPES = frozenset({QType.Q4_K})
MMA_DQ_ROWS = 32                    # the widest M of mma_dq (four n-tiles of 8 rows of x)
MMA_DQ_BLOCK_ROWS = 256             # kRows in mma_dq.cu: rows of W per block
MMA_DQ_STAGE = 2 * 4352             # kChunk * kStage in mma_dq.cu: shared bytes per n-tile
MMA_DQ_MAX_SPLITS = 8               # cluster size along K (portable limit)
MMA_DQ_SB_PER_BLOCK = 4             # split K until a block has at most this many super-blocks...
MMA_DQ_MIN_BLOCKS = 132             # ...and at least an H200's SMs' worth of blocks are launched
#   mma_st (the table's Q4_K 4..64 and Q6_K 8..64 rows, above): int8 tensor cores on Q4_K and Q6_K
#     for up to 32 rows of x a launch (64 on the tensor-map kernel; mma_st.cu), a block's whole share of W
#     (64 rows by its K slice) asked for at its start by bulk copies into shared memory, so that the
#     bytes in flight are bounded by shared memory and not by registers (mma_kq and mma_dq hold the
#     next super-block in registers); x quantized per 256 values, so a super-block's sub-blocks add
#     up in int32. K split over a cluster of up to 8 blocks (mma_st_config). Needs sm_90 (bulk
#     copies, clusters).
# type -> (the kernel's lanes struct, bytes of a block: mst::St4K / St6K)
MMA_ST_LANES = {QType.Q4_K: ("St4K", 144), QType.Q6_K: ("St6K", 210)}
MMA_ST_TYPES = frozenset(MMA_ST_LANES)
# a Q6_K matrix in pair order (weights/q6k_pairs.py) is read by its own traits: Q6_KP (gemv_kq and
# the dequantizer) and St6P (mma_st); no other bucket reads that order
PAIRS_BUCKETS = ("gemv_kq", "mma_st", "dequant_cublas")
MMA_ST_ROWS = 32                    # the widest M of mma_st_kernel's launch (four n-tiles of 8 rows of x)
MMA_ST_WIDE_ROWS = 64               # quant_matmul's mma_st: up to this M (MMA_ST_TMA_ROWS a launch, or MMA_ST_ROWS)
# mma_st_tma_kernel also takes 33..64 rows of x in one launch, as 8 n-tiles (the rows past M zero), so
# that W is read once for all of them, not once a 32 rows. The step of 64 sequences, µs, one launch
# against launches of 32 (bench/results/ab_mma_st_model_wide_*): 8B on an H200 6,403.5-6,429.6
# against 6,895.5-6,914.6; on an H100 6,553.9-6,657.5 against 7,599.1-7,647.7; 0.6B on an H100
# 2,466.7-2,475.9 against 2,744.7-2,744.8.
MMA_ST_TMA_ROWS = 64
MMA_ST_WIDE_NT = 8                  # its n-tiles there: the instance compiled for them (mma_st.cu)
MMA_ST_BLOCK_ROWS = 64              # kRows in mma_st_lanes.cuh
MMA_ST_X_BYTES = 2208               # XStage<1>::kBytes: a super-block of one n-tile of x
MMA_ST_MAX_SPLITS = 8               # cluster size along K (portable limit)
MMA_ST_STATIC_SMEM = 256            # the kernels' static shared memory (barriers, counts)
MMA_ST_SMEM_CAP = 232448 - MMA_ST_STATIC_SMEM   # an sm_90 block's opt-in shared memory, less the static
# mma_st_tma_kernel: W by tensor-map boxes, a box of a block's rows by MMA_ST_TMA_BOX[type] bytes per
# chunk of MMA_ST_CHUNK_SB super-blocks, each chunk on its own barrier, through a ring of stages (a
# stage refilled as soon as its chunk's warps are done), so the multiplies start on the first chunk
# while the rest land and one block takes any K; its block shape and ring by mma_st_tma_shape. The
# table's mma_st rows run it (MMA_ST_TMA, MMA_ST_TMA_TYPES): on an H100, the 8B step of 16 sequences
# took 3,396.5-3,397.1 µs with Q4_K and Q6_K on it against 3,809-3,821 with Q6_K on mma_st_kernel
# and 3,957-3,965 without the ring (K split instead; bench/results/ab_mma_st_model_b16_ring_9f42645_h100.txt).
MMA_ST_CHUNK_SB = 2                 # kChunkSb in mma_st_lanes.cuh
MMA_ST_MAX_STAGES = 16              # kMaxStages in mma_st.cu: the most chunks a block holds at once (its ring)
MMA_ST_TMA_BOX = {QType.Q4_K: 288, QType.Q6_K: 464}     # box_bytes<T>() in mma_st_lanes.cuh
MMA_ST_TMA_TYPES = frozenset({QType.Q4_K, QType.Q6_K})     # the types the table runs it for
MMA_ST_TMA = True                   # the table's mma_st rows on mma_st_tma_kernel
MMA_ST_RG = None                    # RG: the tensor-map kernel's rows of W a block, in 16s (None: the rule)
MMA_ST_WK = None                    # WK: warps that share each 16 rows of W, taking alternate chunks (None: the rule)
MMA_ST_TMA_SHAPES = frozenset({(4, 1), (4, 2), (2, 2), (2, 4)})    # (RG, WK) compiled (mma_st.cu)
# (RG, WK, the most stages in a block's ring) where 32-row blocks outnumber the SMs more than twice:
# a short ring, so that two or three blocks share an SM and one's loads overlap another's multiplies.
# Measured on an H100 at M = 16 on x's images made before (bench/results/ab_mma_st_stages_
# 318a3d2_h100.txt, µs; M = 1 in brackets; against (4, 2) with every chunk in its ring): Q4_K at (2, 2)
# and 4 stages (three blocks an SM) 12288x4096 11.8 against 16.2 (12.5), the 151936x4096 head 118.5
# against 137.5 (113.6), 24576x4096 22.3 against 27.0 (22.3); Q6_K at (2, 4) and 4 stages (two blocks
# an SM, four warps a row set for its longer decode) 20.9 against 22.3 (16.6), 188.0 against 219.1
# (167.4), 34.1 against 37.4 (29.8). Where the blocks fit the SMs (4096 rows), every chunk a stage
# and (2, 4) stay best (5.7 against 6.8 at 4 stages; Q6_K 7.7 against 9.7). Between (6144 rows, 192
# blocks) (2, 4) with 4 stages, so that all fit at once: at M = 1 (ab_mma_st_m1_c4e5b31_h100.txt) Q4_K
# 6.4 against 6.5 with every chunk and 8.3 at (2, 2); Q6_K 9.2 against 11.6 and 8.9; in the 8B step
# of 16 (the fused q|k|v) 3,088.5-3,091.2 µs against 3,172.3-3,192.1 with every chunk a stage
# (ab_mma_st_model_b16_mid_47acb1f_h100.txt).
MMA_ST_TMA_MANY = {QType.Q4_K: (2, 2, 4), QType.Q6_K: (2, 4, 4)}
# From 4 n-tiles of x (25..32 rows) a chunk's images (17.7 KB) outweigh a 32-row block's W (9.2 KB
# Q4_K, 14.8 KB Q6_K), and the short rings above leave one or two blocks an SM; blocks of 64 rows
# with one warp a 16 rows and 2 stages read x's images once for twice the W, three (Q4_K) or two
# (Q6_K) an SM. Measured on an H100 at M = 32 on x's images (bench/results/ab_mma_st_rings_nt_{q4k,q6k}_
# 78cf106_h100.txt, µs, MMA_ST_TMA_MANY's against (4, 1, 2)): Q4_K 24576x4096 29.1 / 23.7, the head
# 160.7 / 150.5, 12288x4096 16.6 / 16.3; Q6_K 58.0 / 40.3, 320.3 / 224.8, 29.5 / 23.0. At 3 n-tiles
# it is mixed (Q6_K 24576x4096 38.2 / 39.7, the head 226.0 / 207.4), so MMA_ST_TMA_MANY stays there.
# The 8B step (bench/results/ab_mma_st_model_nt_b*_017e98d_h100.json, µs, the rule by n-tiles against
# the M = 16 shapes at every M): 32 sequences 3,817.7-3,824.1 against 4,074.9-4,081.2, 64 (launches
# of 32 rows) 7,536.1-7,548.4 against 7,897.5-7,899.4; 0.6B's step of 32 unchanged (1,573.9-1,586.3
# against 1,574.1-1,577.9).
# Where two such blocks do not fit an SM (Q6_K at 8 n-tiles, 130 KB), 32-row blocks of two warps a 16
# rows and 2 stages (100 KB, two an SM) instead: on an H200 at M = 64 (ab_mma_st_wide_m64_91d9f88_h200.txt,
# µs, (4, 1, 2) against (2, 2, 2)): Q6_K 12288x4096 50.4 / 38.7, 24576x4096 88.5 / 67.0, the head 475.1
# / 386.2; Q4_K at (4, 1, 2) 26.4, 40.9, 230.6 (best or within 1.5%).
MMA_ST_TMA_WIDE = (4, 1, 2)
MMA_ST_TMA_WIDE_PAIRED = (2, 2, 2)
MMA_ST_TMA_WIDE_NT = 4              # n-tiles of x from which the many-block regime takes MMA_ST_TMA_WIDE
# Head-sized matrices (more than MMA_ST_TMA_HEAD_WAVES times the SMs' 32-row blocks: many waves, where
# a block's steady rate is all that counts) at up to 2 n-tiles. Measured on the H200 at M = 16 on x's
# images, three runs (ab_mma_st_m16_heads_x3_91d9f88_h200.txt, µs, M = 1 85.2-85.3 / 132.9-133.5): the
# 151936x4096 Q4_K head 107.9-109.6 at MMA_ST_TMA_MANY's (2, 2, 4), 94.9-98.0 at (4, 1, 2); Q6_K
# 189.4-195.0 at (2, 4, 4), 169.3-172.5 at (2, 2, 2), issue 3's 1.3x of M = 1. On an H100 they lose:
# alone Q6_K even (190.4 against 188.0) and Q4_K 7% slower (126.8 against 118.5, ab_mma_st_stages_
# 318a3d2_h100.txt), and the 8B step of 16 took 3,119.9-3,132.3 µs with them against 3,088.1-3,089.0
# (ab_mma_st_model_head_b16_6f3af6a_h100.json). So they serve devices whose DRAM feeds an SM at least
# MMA_ST_TMA_HEAD_BW bytes a second (the driver's figures: H100 SXM ~25e9, H200 ~31e9). Up to 24576
# rows (5.8 waves) MMA_ST_TMA_MANY stays best on both (ab_mma_st_m16_rings_91d9f88_h200.txt).
MMA_ST_TMA_HEAD = {QType.Q4_K: (4, 1, 2), QType.Q6_K: (2, 2, 2)}
MMA_ST_TMA_HEAD_WAVES = 16
MMA_ST_TMA_HEAD_BW = 28e9
MMA_ST_SM_SMEM = 233472             # shared memory of an sm_90 SM, of which each block reserves 1 KB
MMA_ST_STAGES = None                # the most stages in the tensor-map kernel's ring (None: the rule)
# Below the table's mma_st rows mma_st on x's images made by the op before is faster alone on large
# matrices (H100, M = 1, bench/results/ab_mma_st_m1_c4e5b31_h100.txt, µs, the GEMV / mma_st: Q4_K
# 12288x4096 12.6 / 10.2, 4096x12288 12.9 / 11.3) but slower in the step: the 8B step at one sequence
# took 2,538-2,544 µs with it on every large matrix against 2,361-2,363 with the GEMV
# (ab_mma_st_model_b1_low_47acb1f_h100.txt), so the table keeps gemv_kq there. Arm by arm (branch
# low-rows-ab, ab_mma_st_model_b1_arms_facd362_h100.txt): the images alone (a norm at one row is one
# block) cost 130-143 µs of it; mma_st then loses on each matrix in the step (gate|up +160 µs, q|k|v
# +50, down +24-50; short rings everywhere +210).


def in_pairs(w: QuantTensor) -> bool:
    return w.layout == PAIR_ORDER


def block_trait(w: QuantTensor) -> str:
    """The block trait (quant_blocks.cuh, kq_lanes.cuh) W's bytes are read by."""
    return "Q6_KP" if in_pairs(w) else TRAITS[w.qtype]


def mma_st_lanes(w: QuantTensor) -> str:
    """mma_st's lanes struct for W (mma_st_lanes.cuh)."""
    return "St6P" if in_pairs(w) else MMA_ST_LANES[w.qtype][0]


def mma_st_tma_shape(n: int, rg: int | None = None, wk: int | None = None,
                     qtype: QType = QType.Q4_K, nt: int = 2) -> tuple[int, int, int | None]:
    """(RG, WK, the most stages in its ring or None for all that fit) of the tensor-map kernel for N
    rows of W and nt n-tiles of x (8 rows each): those given, else MMA_ST_RG / MMA_ST_WK /
    MMA_ST_STAGES, else the rule, by 32-row blocks against the SMs:
      - at most one a SM: (2, 4) with every chunk a stage (measured on an H100 at M = 16, bench/results/
        ab_mma_st_tma_rg_8c36f29_h100.txt, µs from float x / on x's images made before: 4096x4096
        6.8 / 5.7 at (2, 4) against 8.0 / 5.7 at (4, 2) and 8.4 at (4, 1)), where its ring holds two
        chunks a warp; else (2, 2) (Q6_K at 4 n-tiles, 7 stages fit, (2, 4) would round them to 4:
        4096x12288 26.5 against 23.8, ab_mma_st_rings_nt_q6k_78cf106_h100.txt);
      - at most two a SM: (2, 4) and 4 stages, where two such blocks fit an SM's shared memory, so
        that all are resident at once; else (4, 2) with every chunk a stage, one wave of 64-row
        blocks (Q6_K 6144x4096 at M = 32 13.6 against 18.2);
      - more: MMA_ST_TMA_MANY's; head-sized at up to 2 n-tiles on a device of MMA_ST_TMA_HEAD_BW,
        MMA_ST_TMA_HEAD's; from MMA_ST_TMA_WIDE_NT n-tiles MMA_ST_TMA_WIDE where two of its blocks
        fit an SM, else MMA_ST_TMA_WIDE_PAIRED."""
    blocks = -(-n // 32)
    if blocks <= sm_count():
        rule = (2, 4, None) if _stages_that_fit(qtype, 2, nt) >= 2 * 4 else (2, 2, None)   # two chunks a warp
    elif blocks <= 2 * sm_count():
        rule = (2, 4, 4) if _two_an_sm(qtype, nt, (2, 4, 4)) else (4, 2, None)
    elif nt >= MMA_ST_TMA_WIDE_NT:
        rule = MMA_ST_TMA_WIDE if _two_an_sm(qtype, nt, MMA_ST_TMA_WIDE) else MMA_ST_TMA_WIDE_PAIRED
    elif (nt <= 2 and blocks > MMA_ST_TMA_HEAD_WAVES * sm_count()
          and dram_bytes_per_s() / sm_count() >= MMA_ST_TMA_HEAD_BW):
        rule = MMA_ST_TMA_HEAD[qtype]
    else:
        rule = MMA_ST_TMA_MANY[qtype]
    wk = wk or MMA_ST_WK or rule[1]
    cap = MMA_ST_STAGES or rule[2]
    return rg or MMA_ST_RG or rule[0], wk, cap if cap is None else max(cap, wk)   # a stage a warp, at least


def mma_st_config(m: int, n: int, k: int, qtype: QType = QType.Q4_K, tma: bool = False, rg: int = 4,
                  wk: int = 1, pairs: bool = False) -> tuple[int, int]:
    """(n-tiles of x, K splits) for mma_st: the fewest splits (a cluster of at most 8 blocks along K)
    whose blocks' rows fit shared memory; the tensor-map kernel, whose ring of chunks fits any K,
    takes one. Measured on an H100 (bench/results/ab_mma_st_*_h100.txt, M = 16, µs): Q4_K 4096x4096
    8.3 / 9.3 / 9.1 at 1 / 2 / 4 splits, 24576x4096 32.1 / 33.0 / 36.6, 12288x4096 19.2 / 18.8 / 21.0;
    Q6_K 4096x4096 11.8 / 12.0 at 2 / 4 (1 does not fit). One shape disagrees: 4096x12288, where 4
    splits fit (one 166 KB block an SM), took 23.3 against 21.9 at 8. `pairs` (W in pair order): only
    splits of whole pairs of super-blocks."""
    nt = mma_st_ntiles(m)
    nsb = k // 256
    ks = 1
    while (ks < MMA_ST_MAX_SPLITS and 2 * ks <= nsb and not mma_st_fits(nt, k, ks, qtype, tma, rg, wk)
           and (not pairs or mma_st_whole_pairs(k, 2 * ks))):
        ks *= 2
    return nt, ks


def mma_st_whole_pairs(k: int, ks: int) -> bool:
    """Whether each of ks splits of K starts and ends at a pair of super-blocks (W in pair order)."""
    return -(-(k // 256) // ks) % 2 == 0


def mma_st_fits(nt: int, k: int, ks: int, qtype: QType, tma: bool, rg: int = 4, wk: int = 1) -> bool:
    """Whether a block's share (K / ks super-blocks) fits shared memory: all of it for mma_st_kernel,
    a ring of at least wk chunks for the tensor-map kernel."""
    if tma:
        return mma_st_stages(nt, k, ks, qtype, rg, wk) > 0
    return mma_st_smem(nt, k, ks, qtype, tma, rg, wk) <= MMA_ST_SMEM_CAP


def mma_st_chunks(k: int, ks: int) -> int:
    """Chunks of MMA_ST_CHUNK_SB super-blocks in a block's slice of K (ks splits)."""
    return -(-(-(-(k // 256) // ks)) // MMA_ST_CHUNK_SB)


def _two_an_sm(qtype: QType, nt: int, shape: tuple[int, int, int]) -> bool:
    """Whether two blocks of shape (RG, WK, stages) fit an SM's shared memory (each with its static
    256 bytes and the 1 KB a block reserves)."""
    rg, _, stages = shape
    return 2 * (stages * _mma_st_stage_bytes(qtype, rg, nt) + MMA_ST_STATIC_SMEM + 1024) <= MMA_ST_SM_SMEM


def _mma_st_stage_bytes(qtype: QType, rg: int, nt: int) -> int:
    """Bytes of a stage of mma_st_tma_kernel's ring: a chunk's box of W's rows and its x images."""
    return 16 * rg * MMA_ST_TMA_BOX[qtype] + MMA_ST_CHUNK_SB * MMA_ST_X_BYTES * nt


def _stages_that_fit(qtype: QType, rg: int, nt: int) -> int:
    """The most stages of mma_st_tma_kernel's ring that a block's shared memory holds (at most kMaxStages)."""
    return min(MMA_ST_MAX_STAGES, MMA_ST_SMEM_CAP // _mma_st_stage_bytes(qtype, rg, nt))


def mma_st_launch_rows(tma: bool) -> int:
    """The most rows of x an mma_st launch takes: MMA_ST_TMA_ROWS on the tensor-map kernel, else MMA_ST_ROWS."""
    return MMA_ST_TMA_ROWS if tma else MMA_ST_ROWS


def mma_st_stages(nt: int, k: int, ks: int, qtype: QType, rg: int = 4, wk: int = 1, cap: int | None = None) -> int:
    """Stages of mma_st_tma_kernel's ring: one a chunk of the block's slice where they all fit, else
    the most that fit (at most `cap`), a multiple of wk (0: not even wk fit)."""
    chunks = mma_st_chunks(k, ks)
    fit = min(cap or MMA_ST_MAX_STAGES, _stages_that_fit(qtype, rg, nt))
    return chunks if chunks <= fit else fit // wk * wk


def mma_st_row_stride(per: int, qtype: QType = QType.Q4_K) -> int:
    """row_stride<T>(per) of mma_st_lanes.cuh: bytes of a weight row's window of `per` super-blocks
    in shared memory, padded so that the lanes' loads of rows 0..7 fall on distinct banks."""
    block = MMA_ST_LANES[qtype][1]
    rs = per * 144 if block == 144 else (14 + per * 210 + 15) // 16 * 16
    while (rs % 128 != 32) if block == 144 else (rs % 32 != 16):
        rs += 16
    return rs


def mma_st_smem(nt: int, k: int, ks: int, qtype: QType = QType.Q4_K, tma: bool = False, rg: int = 4,
                wk: int = 1, stages: int | None = None) -> int:
    """mma_st_kernel's dynamic shared memory: 64 weight rows' windows of the block's K slice, then x's
    images of its super-blocks; or mma_st_tma_kernel's: its ring's stages (mma_st_stages' unless
    given) of 16 rg rows' boxes, then their x images, and at least the slots for the sums of its
    wk - 1 other warps a row set."""
    per = -(-(k // 256) // ks)
    if not tma:
        return MMA_ST_BLOCK_ROWS * mma_st_row_stride(per, qtype) + per * MMA_ST_X_BYTES * nt
    stages = stages or mma_st_stages(nt, k, ks, qtype, rg, wk)
    images = min(per, MMA_ST_CHUNK_SB * stages) * MMA_ST_X_BYTES * nt
    return max(16 * rg * stages * MMA_ST_TMA_BOX[qtype] + images, (wk - 1) * rg * 32 * 4 * nt * 4)


def mma_st_exprs(lanes: str) -> tuple[str, ...]:
    """The name expressions of mma_st.cu's module for one lanes struct (St4K, St6K, St6P; load_module's key)."""
    nts, wide = range(1, MMA_ST_ROWS // 8 + 1), MMA_ST_WIDE_NT
    tma = tuple(f"mma_st_tma_kernel<mst::{lanes}, {i}, {j}, {rg}, {wk}>" for i in nts for j in (1, 2, 4, 8)
                for rg, wk in sorted(MMA_ST_TMA_SHAPES))
    tma_wide = tuple(f"mma_st_tma_kernel<mst::{lanes}, {wide}, 1, {rg}, {wk}>" for rg, wk in sorted(MMA_ST_TMA_SHAPES))
    return (tuple(f"mma_st_kernel<mst::{lanes}, {i}, {j}>" for i in nts for j in (1, 2, 4, 8)) + tma + tma_wide
            + tuple(f"mma_st_stage_x_kernel<{i}>" for i in (*nts, wide)))


def mma_st_ntiles(m: int) -> int:
    """n-tiles of 8 rows of x in an mma_st launch of M rows: ceil(M / 8) to MMA_ST_ROWS, then the
    tensor-map kernel's wide instance (MMA_ST_WIDE_NT), the rows past M zero."""
    nt = -(-m // 8)
    return nt if nt <= MMA_ST_ROWS // 8 else MMA_ST_WIDE_NT


@cache
def _mma_st_module(lanes: str, nt: int, ks: int, tma: bool = False, rg: int = 4, wk: int = 1):
    """The matmul instance and the stage kernel; one module per lanes struct."""
    from cupy_backends.cuda.api import driver
    exprs = mma_st_exprs(lanes)
    name = (f"mma_st_tma_kernel<mst::{lanes}, {nt}, {ks}, {rg}, {wk}>" if tma
            else f"mma_st_kernel<mst::{lanes}, {min(nt, MMA_ST_ROWS // 8)}, {ks}>")   # the stage kernel's, past 4
    kern = get_kernel("mma_st", name, name_expressions=exprs)
    driver.funcSetAttribute(kern.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, MMA_ST_SMEM_CAP)
    return kern, get_kernel("mma_st", f"mma_st_stage_x_kernel<{nt}>", name_expressions=exprs)


def _mma_st_refusal(x, w: QuantTensor):
    """Why mma_st cannot run this matmul, as the error to raise, or None: it needs an sm_90 device,
    x 16-byte aligned, and Q4_K rows 16-byte aligned or a Q6_K tensor ending at a 16-byte boundary
    (Q6_K blocks are copied in 16-byte-aligned windows; a row's ends at the next boundary)."""
    if not has_arch_specific():
        return fail("quant_matmul", "force_bucket", "a bucket this device runs (mma_st needs sm_90)", "mma_st")
    if w.qtype not in MMA_ST_TYPES:
        return fail("mma_st", "w", f"one of {', '.join(q.name for q in MMA_ST_TYPES)}", w.qtype.name)
    if x.data.ptr % 16:
        return fail("quant_matmul", "x", "16-byte aligned for mma_st", f"address {x.data.ptr:#x}")
    if w.qtype == QType.Q4_K and w.data.data.ptr % 16:
        return fail("quant_matmul", "w", "16-byte aligned for mma_st", f"address {w.data.data.ptr:#x}")
    end = w.data.data.ptr + w.data.nbytes
    if w.qtype == QType.Q6_K and end % 16:
        return fail("mma_st", "w", "a Q6_K tensor whose last 16-byte window ends inside it",
                    f"{16 - end % 16} bytes past its end")
    return None


def mma_st_serves(x, w: QuantTensor) -> bool:
    """Whether the table's mma_st rows can run this matmul: nothing to refuse (_mma_st_refusal) and
    stages that fit."""
    if _mma_st_refusal(x, w) is not None:
        return False
    tma = _table_tma(w)
    m, k = min(x.shape[0], mma_st_launch_rows(tma)), x.shape[1]
    rg, wk = mma_st_tma_shape(w.shape[0], qtype=w.qtype, nt=mma_st_ntiles(m))[:2] if tma else (4, 1)
    nt, ks = mma_st_config(m, w.shape[0], k, w.qtype, tma, rg, wk, in_pairs(w))
    return mma_st_fits(nt, k, ks, w.qtype, tma, rg, wk)


def _table_tma(w: QuantTensor) -> bool:
    """Whether the table runs W's mma_st rows on the tensor-map kernel."""
    return MMA_ST_TMA and w.qtype in MMA_ST_TMA_TYPES and mma_st_tma_serves(w)


def mma_st_tma_serves(w: QuantTensor) -> bool:
    """Whether mma_st_tma_kernel can copy W: Q4_K or Q6_K, 16-byte aligned, with rows of a multiple
    of 16 bytes (a tensor map's row stride; every Q4_K row, a Q6_K row of a multiple of 8 super-blocks)."""
    n = w.shape[0]
    return (w.qtype in MMA_ST_TMA_BOX and w.data.data.ptr % 16 == 0 and n > 0
            and w.data.nbytes // n % 16 == 0)


@cache
def _mma_st_map(ptr: int, n: int, row_bytes: int, rows: int, box: int):
    """The tensor map of a weight's rows for mma_st_tma_kernel (u16 elements; boxes of `rows` rows by
    `box` bytes), made once per weight."""
    return tensor_map_2d(ptr, (row_bytes // 2, n), row_bytes, (box // 2, rows))


def mma_st_stage(x):
    """x (M, K) float32 as mma_st_stage_x_kernel's images, one a super-block (uint8)."""
    import cupy
    m, k = x.shape
    nt, nsb = mma_st_ntiles(m), k // 256
    xst = cupy.empty(nsb * MMA_ST_X_BYTES * nt, dtype=cupy.uint8)
    _mma_st_module("St4K", nt, 1)[1]((-(-nsb * 8 * nt // 4),), (128,), (xst, x, np.int32(m), np.int32(k)))
    return xst


def mma_st(out, x, w: QuantTensor, splits: int | None = None, xst=None, tma: bool | None = None,
           wk: int | None = None, rg: int | None = None, stages: int | None = None) -> None:
    """out (M, N) = x (M, K) @ W^T on mma_st.cu for M up to MMA_ST_ROWS (MMA_ST_TMA_ROWS on the
    tensor-map kernel, in one split): x staged per super-block (int8 codes per 256
    values; or `xst`, x's images made before, mma_st_stage), then the matmul, its K split over a
    cluster of `splits` blocks (mma_st_config's by default). Needs an sm_90 device; x 16-byte
    aligned, Q4_K rows 16-byte aligned, and a Q6_K tensor that ends at a 16-byte boundary
    (N * K / 256 a multiple of 8 does). `tma`: W copied by tensor-map boxes in chunks
    (mma_st_tma_kernel; rows of a multiple of 16 bytes); None: MMA_ST_TMA for MMA_ST_TMA_TYPES.
    `wk`, `rg`: the tensor-map kernel's warps per 16 rows of W and rows of W a block in 16s, a pair
    of MMA_ST_TMA_SHAPES (None: mma_st_tma_shape's). `stages`: at most this many chunks in the
    tensor-map kernel's ring (None: mma_st_tma_shape's; all that fit, mma_st_stages, where it has none)."""
    import cupy

    m, k = x.shape
    n = w.shape[0]
    refusal = _mma_st_refusal(x, w)
    if refusal is not None:
        raise refusal
    row_bytes = w.data.nbytes // n
    if tma is None:
        tma = _table_tma(w)
    elif tma and not mma_st_tma_serves(w):
        raise fail("mma_st", "w", "a 16-byte aligned Q4_K or Q6_K tensor with rows of a multiple of 16 bytes "
                   "for the tensor-map kernel", f"{w.qtype.name} at {w.data.data.ptr:#x}, "
                   f"{w.data.nbytes // max(n, 1)} bytes a row")
    if m > mma_st_launch_rows(tma):
        raise fail("mma_st", "x", f"at most {MMA_ST_ROWS} rows, {MMA_ST_TMA_ROWS} on the tensor-map kernel "
                   "(quant_matmul launches wider x in parts)", m)
    rg, wk, cap = mma_st_tma_shape(n, rg, wk, w.qtype, mma_st_ntiles(m))
    if tma and stages is None:
        stages = cap
    if tma and (rg, wk) not in MMA_ST_TMA_SHAPES:
        raise fail("mma_st", "(rg, wk)", f"one of {sorted(MMA_ST_TMA_SHAPES)}", (rg, wk))
    rg, wk = (rg, wk) if tma else (4, 1)
    nt, ks = mma_st_config(m, n, k, w.qtype, tma, rg, wk, in_pairs(w))
    if nt > MMA_ST_ROWS // 8 and ks != 1:
        raise fail("mma_st", "(rg, wk)", f"a block shape whose ring fits one split at {m} rows of x", (rg, wk))
    if splits is not None:
        if splits not in ((1, 2, 4, 8) if m <= MMA_ST_ROWS else (1,)):
            raise fail("mma_st", "splits", f"1, 2, 4 or 8 (1 above {MMA_ST_ROWS} rows of x)", splits)
        if in_pairs(w) and not mma_st_whole_pairs(k, splits):
            raise fail("mma_st", "splits", f"splits of whole pairs of super-blocks for a matrix in pair order "
                       f"(K = {k})", splits)
        ks = splits
    if stages is not None and not (tma and wk <= stages <= MMA_ST_MAX_STAGES):
        raise fail("mma_st", "stages", f"the tensor-map kernel's, {wk}..{MMA_ST_MAX_STAGES}", stages)
    nsb = k // 256
    ring = mma_st_stages(nt, k, ks, w.qtype, rg, wk, stages) if tma else 0
    smem = mma_st_smem(nt, k, ks, w.qtype, tma, rg, wk, ring)
    if not mma_st_fits(nt, k, ks, w.qtype, tma, rg, wk):
        raise fail("mma_st", "K", f"a split whose rows fit shared memory ({ks} splits: {smem} bytes of at most "
                   f"{MMA_ST_SMEM_CAP})", k)
    matmul, stage = _mma_st_module(mma_st_lanes(w), nt, ks, tma, rg, wk)
    if xst is None:
        xst = cupy.empty(nsb * MMA_ST_X_BYTES * nt, dtype=cupy.uint8)
        stage((-(-nsb * 8 * nt // 4),), (128,), (xst, x, np.int32(m), np.int32(k)))
    if tma:
        wmap = _mma_st_map(w.data.data.ptr, n, row_bytes, 16 * rg, MMA_ST_TMA_BOX[w.qtype])
        launch_driver(matmul, (-(-n // (16 * rg)), ks), (32 * rg * wk,),
                      (out, xst, wmap, np.int32(m), np.int32(n), np.int32(k), np.int32(ring)), smem)
        return
    grid = (-(-n // MMA_ST_BLOCK_ROWS), ks)
    matmul(grid, (128,), (out, xst, w.data, np.int32(m), np.int32(n), np.int32(k), np.int64(row_bytes)),
           shared_mem=smem)


MMA_WG_TYPES = frozenset({QType.Q4_K})
MMA_WG_TILE = 128                   # kRowsX, kRowsW in mma_wg.cu: rows of x and of W per block
MMA_WG_STAGE = 5 * 128 * 128               # kStage in mma_wg.cu: bytes of a stage (x's 256 values, the sums)
MMA_WG_SMEM = 2 * MMA_WG_STAGE + 1024      # kStages * kStage + the 1024-byte alignment
MMA_WG_SPLITS = (1, 2, 4, 8)               # KS: blocks of a cluster along K
MMA_WG_SB_PER_SPLIT = (4, 6)               # super-blocks a split must keep for 2 and for 8 splits
MMA_TILES = (16, 32, 64)            # mma_kernel<QT, BM> instances: rows of x per block
DP4A_WIDTHS = tuple(range(1, 17))
GEMV_WIDTHS = tuple(range(1, 9))
# gemv_kq: rows of W per warp, by (largest M, rows); more rows share each load of x's codes,
# fewer keep registers (and so resident warps) for wide M. Measured on the H200 (a519f47, Qwen3-8B
# shapes, bench/results/NOTES.md): 2 rows best or within noise at M <= 4; at M = 8, 4 rows are
# 10-25% faster on Q6_K; at M = 16, 2 rows are 1.3-1.7x faster than 1 (4 rows spill there, and
# for Q6_K at M = 6, so 4 rows start at 7).
KQ_ROWS = ((6, 2), (8, 4), (16, 2))
KQ_WARPS = 4                        # kWarps in gemv_kq.cu
KQ_SPLITS = (1, 2, 4)               # warps that share a set of rows, splitting its super-blocks
KQ_TARGET_WARPS = 132 * 64          # split until about a full H200's worth of warps is launched
# (type, M) -> B: the 2-row gemv_kq of a matrix of at most KQ_OCC_WEIGHTS weights runs
# gemv_kq_occ_kernel, compiled for B blocks per SM (gemv_kq.cu). Measured on the H200 alone (a16079f,
# bench_quant_matmul --pdl --kq-occupancy 0/4/5/6, bench/results/quant_matmul_occ_a16079f.md), µs at
# M = 1 for 4096x4096, 24576x4096, 4096x12288 and the 151936x4096 head: Q4_K 4.7 / 18.2 / 10.9 /
# 91.0 plain, 4.9 / 17.5 / 9.9 / 99.2 at B = 5; at M = 2 no bound helped. (Q6_K took B = 5 too,
# until 4 rows a warp beat it.) In the models' own steps (bench/ab_gemv_kq_model.py,
# bench/results/ab_gemv_kq_model_*_ff7da93.json, GPU step µs, alternated) the bound loses on
# Qwen3-8B's matrices and wins on 0.6B's: 8B 2182.5-2187.6 with it, 2150.4-2166.8 without; 0.6B
# 642.0-643.6 with it, 656.3-659.8 without. So it serves matrices of up to 0.6B's sizes (gate/up
# 6144x1024, 6.3M weights) and not 8B's (4096x4096, 16.8M, and up) nor heads.
KQ_OCCUPANCY = {(QType.Q4_K, 1): 5}
KQ_OCC_WEIGHTS = 8 << 20            # weights: 0.6B's matrices (6.3M at most) take the bound, 8B's not
# type -> rows per warp at M = 1 on every matrix: a warp's x codes serve all its rows, and on Q6_K
# L1 traffic, not DRAM, is what binds (ncu on the head, bench/results/NOTES.md: L1/TEX 94% at 69%
# of DRAM with 2 rows). Measured on the H200 (PDL graph, one session each, bench_quant_matmul
# --kq-rows): the 151936x4096 head, Q6_K 148.5 us with 2 rows, 134.4 with 4; Q4_K 87.4 with 2, 92.9
# with 4 (head_rows_d0b2f69.txt). The layer shapes (quant_matmul_m1_1088d70.md and NOTES, 4 rows
# plain against 2 rows at B = 5), 4096x4096 / 6144x4096 / 24576x4096 / 4096x12288: Q6_K 6.6 / 8.8 /
# 25.2 / 13.6 us against 6.8 / 9.2 / 26.7 / 14.8; Q4_K 5.4 / 7.1 / 18.8 / 13.1 against 4.9 / 6.4 /
# 17.5 / 9.9. So Q6_K takes 4 rows everywhere at M = 1 and Q4_K keeps the table's.
KQ_M1_ROWS = {QType.Q6_K: 4}
# type -> the most warps a row set at M = 1. Q6_K (4 rows a warp, four blocks an SM): 2, so Qwen3-8B's
# down projection (4096x12288) runs 512 blocks, one wave, instead of 1024, and the Q6_K v of its
# q|k + v pairs (1024x4096) half the warps a set. In pair order, as the executor uploads Q6_K, the 8B
# step measured 2019.0 / 2027.0 / 2022.8 us with the cap against 2033.2 / 2036.3 / 2031.1 without
# (H200, alternated; bench/ab_gemv_kq_model.py "q6k ws 4", bench/results/ab_gemv_kq_ws2_6707fe5_h200.json).
# Qwen3-0.6B's Q6_K matrices take 2 and 1 already (its down at 1 cost +5.6 us in the same call).
# In GGUF order the cap was a wash at 8B (thirty-third session).
KQ_M1_MAX_WS = {QType.Q6_K: 2}
# -D switches gemv_kq.cu's module is compiled with (both its kernels), swapped whole for A/Bs in one
# process. GEMV_WEIGHTS_L2_256B (kq_lanes.cuh): the weights' loads ask L2 for 256-byte segments. The
# 8B step on an H100, the two builds alternated (bench/ab_gemv_kq_model.py; the arm "l2 none" now):
# six rounds, with it 2,318-2,347 us against 2,352-2,384 without, median -26 us, every round faster
# (bench/results/ab_gemv_l2_256b_8b_r6_2667f49_h100.json); an earlier call's three: -1, -29, 0
# (ab_gemv_l2_256b_8b_2667f49_h100.json); a third call's three: -36, +2, +21, level by the medians
# (ab_gemv_l2_none_8b_ed4bfb5_h100.json). The same bits (tests/test_quant_matmul.py). Not yet
# measured on an H200.
KQ_DEFINES: dict = {"GEMV_WEIGHTS_L2_256B": 1}


# gemv_dp4a's bucket on the small-block types: gemv_staged_kernel (gemv_staged.cu), each warp's R rows
# copied into shared memory by coalesced 16-byte cp.async first, then gemv_dp4a's arithmetic (the same
# bits), for these types up to STAGED_MAX_M rows of x; empty: every such matmul runs gemv_dp4a_kernel.
# Q8_0 at M = 1 (bench/results/quant_matmul_staged_8d72a75.md): 262144x640 (Gemma 3's head) 51.3 us
# against 81.5, 49152x576 (SmolLM2's) 14.5 against 16.9. Q4_0 / Q4_1 / Q5_0 staged made both real
# models' steps slower (SmolLM2 +165 us, ab_gemv_staged_smollm2_8d72a75.json), so they stay off.
STAGED_TYPES: frozenset[QType] = frozenset({QType.Q8_0})
STAGED_KERNEL_TYPES = (QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q8_0)   # instances in gemv_staged.cu
STAGED_MAX_M = 4
STAGED_KERNEL_ROWS = (8, 4, 2, 1)   # R instances in gemv_staged.cu
STAGED_ROWS = STAGED_KERNEL_ROWS    # R: rows a warp, the most whose bytes fit STAGED_WARP_BYTES
STAGED_WARP_BYTES = 5120
STAGED_WARPS = 4                    # kWarps in gemv_staged.cu


def staged_rows(row_bytes: int) -> int:
    """R for rows of row_bytes, or 0 where one row does not fit (gemv_dp4a_kernel serves them)."""
    return next((r for r in STAGED_ROWS if r * row_bytes <= STAGED_WARP_BYTES), 0)


def staged_smem(rows: int, row_bytes: int) -> int:
    """gemv_staged_kernel's dynamic shared memory: staged_bytes a warp (gemv_staged.cu)."""
    return STAGED_WARPS * ((rows * row_bytes + 16 + 15) // 16 * 16)


@cache
def _staged_kernel(trait: str, m: int, rows: int):
    exprs = tuple(f"gemv_staged_kernel<gguf::{trait}, {i}, {r}>" for i in range(1, STAGED_MAX_M + 1)
                  for r in STAGED_KERNEL_ROWS)
    return get_kernel("gemv_staged", f"gemv_staged_kernel<gguf::{trait}, {m}, {rows}>", name_expressions=exprs)


def kq_rows(m: int, qtype: QType | None = None) -> int:
    if m == 1 and qtype in KQ_M1_ROWS:
        return KQ_M1_ROWS[qtype]
    return next(r for edge, r in KQ_ROWS if m <= edge)


def kq_occupancy(qtype: QType, m: int, n: int, k: int, rows: int) -> int:
    """B of the gemv_kq_occ_kernel that serves this (n, k) matrix and M, or 0 for the plain kernel."""
    return KQ_OCCUPANCY.get((qtype, m), 0) if rows == 2 and n * k <= KQ_OCC_WEIGHTS else 0


def kq_config(m: int, n: int, k: int, qtype: QType | None = None) -> tuple[int, int]:
    """(rows per warp set, warps per set) for gemv_kq: the fewest warps per set that fill the chip,
    never more than a row has groups of four super-blocks nor, at M = 1, KQ_M1_MAX_WS's."""
    rows = kq_rows(m, qtype)
    sets = -(-n // rows)
    most = max(1, -(-(k // 256) // 4))           # groups of four super-blocks in a row
    if m == 1:
        most = min(most, KQ_M1_MAX_WS.get(qtype, most))
    ws = next((s for s in KQ_SPLITS if sets * s >= KQ_TARGET_WARPS), KQ_SPLITS[-1])
    return rows, max(s for s in KQ_SPLITS if s <= min(ws, most))


def mma_kq_config(m: int, n: int, k: int, qtype: QType = QType.Q4_K) -> tuple[int, int]:
    """(n-tiles of x, log2 of K slices) for mma_kq: slices double while the launch has fewer warps
    than the target, each slice still has a super-block, and the stage buffers fit the cap."""
    nt = -(-m // 8)
    tiles = -(-n // 16)
    bits = 0
    while (bits < 3 and (tiles << bits) < MMA_KQ_TARGET_WARPS and (2 << bits) <= k // 256
           and 2 * MMA_KQ_STAGE_BYTES[qtype] * nt * (2 << bits) <= MMA_KQ_MAX_SMEM):
        bits += 1
    return nt, bits


def mma_dq_config(m: int, n: int, k: int) -> tuple[int, int]:
    """(n-tiles of x, K splits) for mma_dq: splits double (a cluster of at most 8 blocks along K)
    while a block holds more than MMA_DQ_SB_PER_BLOCK super-blocks or the launch has fewer blocks
    than MMA_DQ_MIN_BLOCKS, as long as each split keeps a super-block.
    Alone, other splits time faster on some shapes (bench/ab_mma_dq_splits.py, M = 16, PDL graph,
    bench/results/ab_mma_dq_splits_7046730.json: 24576x4096 36.6 us at 2 splits against 40.6 at
    this rule's 4; clusters of 16 blocks 25.3 against 26.7 on 4096x12288), but in the model's own
    step they do not: Qwen3-8B decoding 16 sequences took 6,006-6,016 us a step with 24576x4096 at
    2 splits and 5,780-5,782 at 8, against 5,635-5,657 with this rule (two calls; bench/ab_mma_dq_rule.py,
    bench/results/ab_mma_dq_rule_887ae15.json, ab_mma_dq_rule_short_1708d8c.json), so the rule stays."""
    nt = -(-m // 8)
    groups = -(-n // MMA_DQ_BLOCK_ROWS)
    nsb = k // 256
    ks = 1
    while (ks < MMA_DQ_MAX_SPLITS and 2 * ks <= nsb
           and (-(-nsb // ks) > MMA_DQ_SB_PER_BLOCK or groups * ks < MMA_DQ_MIN_BLOCKS)):
        ks *= 2
    return nt, ks


@cache
def _mma_dq_kernel(nt: int, ks: int):
    return get_kernel("mma_dq", f"mma_dq_kernel<{nt}, {ks}>",
                      name_expressions=tuple(f"mma_dq_kernel<{i}, {j}>" for i in range(1, MMA_DQ_ROWS // 8 + 1)
                                             for j in (1, 2, 4, 8)))


MMA_WG_PROBES = (1, 2, 3, 7)               # measurement-only instances (bench/ab_mma_wg.py --probes)


def mma_wg_instances() -> tuple[str, ...]:
    return tuple(f"mma_wg_kernel<{ks}, {z}>" for z in ("false", "true") for ks in MMA_WG_SPLITS) + \
        tuple(f"mma_wg_kernel<1, false, {p}>" for p in MMA_WG_PROBES)


def mma_wg_splits(m: int, n: int, k: int, sms: int = 132) -> int:
    """K splits (blocks of a cluster) for mma_wg on a device of `sms` SMs, by measurement on the
    H200 (bench/results/ab_mma_wg_splits_3a85381.txt, Q4_K, us at M = 33..128): a launch of at most
    half the SMs' blocks splits in 2 (4096x4096: 24-26 against 39-46 unsplit), one of at most a
    quarter with 48 super-blocks or more in 8 (4096x12288: 56-58 against 62-64 in 2 and 104-120
    unsplit). Clusters of 4 were slower than of 2 and of 8 on every shape (26.8-29.3 at 4096x4096),
    and a launch of more blocks than SMs (12288x4096, the head) gains nothing from splits."""
    blocks = -(-m // MMA_WG_TILE) * -(-n // MMA_WG_TILE)
    nsb = k // 256
    if 4 * blocks <= sms and nsb >= 8 * MMA_WG_SB_PER_SPLIT[1]:
        return 8
    if 2 * blocks <= sms and nsb >= 2 * MMA_WG_SB_PER_SPLIT[0]:
        return 2
    return 1


@cache
def _mma_wg_kernel(name: str):
    from cupy_backends.cuda.api import driver
    if name.startswith("mma_wg_kernel<"):
        kern = get_kernel("mma_wg", name, name_expressions=mma_wg_instances())
        driver.funcSetAttribute(kern.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, MMA_WG_SMEM)
        return kern
    return get_kernel("mma_wg", name)


def check_aligned16(x, w: QuantTensor, b: str) -> None:
    """Bucket b's kernels load x's rows and W's blocks 16 bytes at a time (a Q4_K row is 144 bytes a
    super-block): both must start 16-byte aligned."""
    for name, ptr in (("x", x.data.ptr), ("w", w.data.data.ptr)):
        if ptr % 16:
            raise fail("quant_matmul", name, f"16-byte aligned for {b}", f"address {ptr:#x}")


def mma_wg(out, x, w: QuantTensor, splits: int | None = None, zero: bool | None = None, probe: int = 0) -> None:
    """out (M, N) = x (M, K) @ W^T on mma_wg.cu: x laid out for the lanes (xp and xs), then the
    warpgroup kernel, its K split over a cluster of `splits` blocks (mma_wg_splits' by default),
    with `zero` rows of x past M copied as zeros (else clamped to row M - 1; by default zeros
    where the last tile of 128 rows is partial: bench/results/ab_mma_wg_splits_3a85381.txt, head at
    M = 33: 334 against 504 us clamped, while full tiles are 2-7% slower with the zeros' test);
    `probe` (MMA_WG_PROBES, one split, rows clamped) a measurement-only instance with wrong
    results: 1 without W's loads and decode, 2 without x's copies, 3 without either, 7 without
    either nor the per-super-block hand-over (copy wait, barrier, drain); -1 the stage kernel
    alone. Needs an sm_90 device; x and W 16-byte aligned."""
    import cupy

    m, k = x.shape
    n = w.shape[0]
    check_aligned16(x, w, "mma_wg")
    if probe:
        ks, zero = 1, False
    else:
        ks = mma_wg_splits(m, n, k, sm_count()) if splits is None else splits
        zero = m % MMA_WG_TILE != 0 if zero is None else zero
    xp = cupy.empty((m, k), dtype=cupy.uint16)
    xs = cupy.empty((m, k // 16), dtype=cupy.uint16)
    slots = m * k // 16
    _mma_wg_kernel("wg_stage_q4k_kernel")(((slots + 255) // 256,), (256,), (xp, xs, x, np.int32(m), np.int32(k)))
    if probe < 0:
        return
    name = f"mma_wg_kernel<{ks}, {'true' if zero else 'false'}" + (f", {probe}>" if probe else ">")
    _mma_wg_kernel(name)(
        (-(-m // MMA_WG_TILE), -(-n // MMA_WG_TILE), ks), (256,),
        (out, xp, xs, w.data, np.int32(m), np.int32(n), np.int32(k), np.int64(w.data.nbytes // n)),
        shared_mem=MMA_WG_SMEM)


@cache
def _mma_kq_kernel(trait: str, nt: int):
    """One module per weight type, its four n-tile counts."""
    kern = get_kernel("mma_kq", f"mma_kq_kernel<gguf::{trait}, {nt}>",
                      name_expressions=tuple(f"mma_kq_kernel<gguf::{trait}, {i}>"
                                             for i in range(1, MMA_KQ_ROWS // 8 + 1)))
    kern.fn.max_dynamic_shared_size_bytes = MMA_KQ_MAX_SMEM          # above the default 48 KB
    return kern


def kq_kernel_name(trait: str, m: int, rows: int, ws: int, occ: int = 0) -> str:
    """gemv_kq_kernel's instance, or gemv_kq_occ_kernel's for `occ` blocks per SM."""
    if occ:
        return f"gemv_kq_occ_kernel<gguf::{trait}, {m}, {rows}, {ws}, {occ}>"
    return f"gemv_kq_kernel<gguf::{trait}, {m}, {rows}, {ws}>"


def _kq_kernel(trait: str, m: int, rows: int, ws: int, occ: int = 0):
    return _kq_kernel_built(trait, m, rows, ws, occ, tuple(sorted(KQ_DEFINES.items())))


@cache
def _kq_kernel_built(trait: str, m: int, rows: int, ws: int, occ: int, defines: tuple):
    exprs = tuple(kq_kernel_name(trait, m, rows, s, occ) for s in KQ_SPLITS)
    return get_kernel("gemv_kq", kq_kernel_name(trait, m, rows, ws, occ), dict(defines), name_expressions=exprs)


# Inside graph_safe(), the tensor-core rows of the table run the mma bucket instead of
# dequant_cublas (Q4_K and Q6_K up to MMA_KQ_CHUNKED_ROWS: mma_kq, a launch per 32 rows of x): CuPy
# refuses cuBLAS calls during stream capture, and a step that a graph may capture must run the same
# kernels eagerly, so that graph replay and eager steps agree bit for bit.
_GRAPH_SAFE = contextvars.ContextVar("glimmer_graph_safe", default=False)


@contextlib.contextmanager
def graph_safe():
    """Within the block, quant_matmul picks only buckets a CUDA graph can capture."""
    token = _GRAPH_SAFE.set(True)
    try:
        yield
    finally:
        _GRAPH_SAFE.reset(token)


@cache
def _kernel(trait: str, expr: str):
    """One module per quant type, so a model compiles only the types it holds."""
    exprs = tuple(f"gemv_kernel<gguf::{trait}, {m}>" for m in GEMV_WIDTHS) + \
        (f"dequant_kernel<gguf::{trait}, float>", f"dequant_kernel<gguf::{trait}, unsigned short>")
    if QType[trait] in DOT_TYPES:
        exprs += tuple(f"gemv_dp4a_kernel<gguf::{trait}, {m}>" for m in DP4A_WIDTHS)
    return get_kernel("quant_matmul", expr, name_expressions=exprs + ("quantize_x_kernel", "to_bf16_kernel"))


MMA_STEP = 64                       # kBK in quant_mma.cu: values of K per step
MMA_TARGET_BLOCKS = 4 * 132         # split K until about 4 blocks per SM of an H200 are busy
MMA_SCRATCH_BYTES = 64 << 20        # cap on the partial sums of the splits


@cache
def _mma_kernel(trait: str, expr: str):
    exprs = tuple(f"mma_kernel<gguf::{trait}, {b}>" for b in MMA_TILES) + ("reduce_splits_kernel",)
    return get_kernel("quant_mma", expr, name_expressions=exprs)


def mma_splits(m: int, n: int, k: int, bm: int) -> int:
    """K splits for the mma bucket: enough blocks for the chip, partial sums within the cap."""
    tiles = -(-n // 64) * -(-m // bm)
    steps = -(-k // MMA_STEP)
    want = max(1, -(-MMA_TARGET_BLOCKS // tiles))
    cap = max(1, MMA_SCRATCH_BYTES // (4 * m * n))
    return max(1, min(want, steps, cap))


def serves(b: str, qtype: QType, m: int) -> bool:
    """Whether bucket b has a kernel for weights of qtype and M = m rows of x."""
    if b == "gemv_dp4a":
        return qtype in DOT_TYPES and m <= DP4A_WIDTHS[-1]
    if b == "gemv_kq":
        return qtype in KQ_TYPES and m <= DP4A_WIDTHS[-1]
    if b == "mma_kq":
        return qtype in MMA_KQ_TYPES and m <= MMA_KQ_CHUNKED_ROWS
    if b == "mma_dq":
        return qtype in MMA_DQ_TYPES and m <= MMA_DQ_ROWS
    if b == "gemv":
        return m <= GEMV_WIDTHS[-1]
    if b == "mma_wg":
        return qtype in MMA_WG_TYPES
    if b == "mma_st":
        return qtype in MMA_ST_TYPES and m <= MMA_ST_WIDE_ROWS
    return b in BUCKET_NAMES


def bucket(m: int, qtype: QType, graph_safe: bool = False) -> str:
    """The table's bucket for M rows of x; with graph_safe, a kernel of ours where the table says
    dequant_cublas (mma_kq where it serves, else mma)."""
    kind = {QType.Q4_K: "q4k", QType.Q6_K: "q6k"}.get(qtype) or ("dot" if qtype in DOT_TYPES else "float")
    for edge, name in BUCKETS[kind]:
        if edge is None or m <= edge:
            if graph_safe and name == "dequant_cublas":
                return "mma_kq" if serves("mma_kq", qtype, m) else "mma"
            return name
    raise AssertionError("unreachable")


def _beside_mma_st(m: int, qtype: QType, graph_safe: bool, pairs: bool = False) -> str:
    """The bucket for the table's mma_st rows where mma_st cannot run (no sm_90 device, x or W not
    aligned as it needs): the table's before them, mma_dq / mma_kq to 32 rows, then mma_wg (Q4_K),
    mma_kq to 40 and dequant_cublas (Q6_K; inside graphs mma_kq); for a matrix in pair order
    dequant_cublas (inside graphs mma_kq, which quant_matmul then refuses)."""
    if pairs:
        return "mma_kq" if graph_safe else "dequant_cublas"
    if m <= MMA_ST_ROWS:
        return "mma_dq" if qtype == QType.Q4_K and m > 8 else "mma_kq"
    if qtype == QType.Q4_K:
        return "mma_wg"
    return "mma_kq" if m <= 40 or graph_safe else "dequant_cublas"


def quantize_x(x, trait: str):
    """x (M, K) float32 -> (xq int8 as int32 words (M, K/4), xd (M, K/32), xs (M, K/32))."""
    import cupy

    m, k = x.shape
    nblocks = m * k // 32
    xq = cupy.empty((m, k // 4), dtype=cupy.int32)
    xd = cupy.empty((m, k // 32), dtype=cupy.float32)
    xs = cupy.empty((m, k // 32), dtype=cupy.float32)
    _kernel(trait, "quantize_x_kernel")(((nblocks + 255) // 256,), (256,), (xq, xd, xs, x, np.int64(nblocks)))
    return xq, xd, xs


def check_codes(codes: Q8Rows, op: str, m: int, k: int, like) -> None:
    """The int8 codes of M rows of K values (ops/q8.py), on like's device."""
    check(codes.q, op, "x.q", dtypes=(np.int32,), shape=(m, k // 4), like=like)
    check(codes.d, op, "x.d", dtypes=(F32,), shape=(m, k // 32), like=like)
    check(codes.s, op, "x.s", dtypes=(F32,), shape=(m, k // 32), like=like)


def quant_matmul(x, w: QuantTensor, *, out=None, force_bucket: str | None = None):
    """x: (M, K) float32, or Q8Rows (x with its int8 codes, ops/q8.py), w: QuantTensor (N, K) ->
    (M, N) float32.

    force_bucket (benchmarks only) runs a given bucket instead of the table's choice.
    """
    n, k = w.shape
    codes = None
    if isinstance(x, Q8Rows):
        x, codes = x.x, x
    if is_host(x):
        check(x, "quant_matmul", "x", dtypes=(F32, np.float64), shape=("M", k), contiguous=False)
        return host_result(ref.quant_matmul(x, w), out)
    import cupy

    check(x, "quant_matmul", "x", dtypes=(F32,), shape=("M", k))
    if w.qtype not in TRAITS:
        raise fail("quant_matmul", "w", f"one of {', '.join(t.name for t in TRAITS)}", w.qtype.name)
    if not w.on_device:
        raise fail("quant_matmul", "w", "a QuantTensor on the device (w.to_device())", "host bytes")
    if k % 32:
        raise fail("quant_matmul", "w", "K a multiple of 32", k)
    m = x.shape[0]
    if out is None:
        out = cupy.empty((m, n), dtype=cupy.float32)
    check_out(out, "quant_matmul", (m, n), like=x)
    if m == 0:
        return out
    row_bytes = np.int64(w.data.nbytes // n)
    t = TRAITS[w.qtype]
    b = force_bucket or bucket(m, w.qtype, _GRAPH_SAFE.get())
    if b == "mma_st" and not force_bucket and not mma_st_serves(x, w):
        b = _beside_mma_st(m, w.qtype, _GRAPH_SAFE.get(), in_pairs(w))
    if in_pairs(w) and b not in PAIRS_BUCKETS:
        raise fail("quant_matmul", "w", f"GGUF block order for bucket {b} at M = {m} (a Q6_K matrix in pair order "
                   f"runs on {', '.join(PAIRS_BUCKETS)}; inside a CUDA graph, on mma_st)", PAIR_ORDER)
    if b == "mma_wg" and not force_bucket and not has_arch_specific():
        b = "mma" if _GRAPH_SAFE.get() else "dequant_cublas"
    if not serves(b, w.qtype, m):
        raise fail("quant_matmul", "force_bucket", f"a bucket that serves {w.qtype.name} at M = {m}", b)
    if b in INT8_BUCKETS:
        if codes is not None:
            check_codes(codes, "quant_matmul", m, k, x)
            xq, xd, xs = codes.q, codes.d, codes.s
        else:
            xq, xd, xs = quantize_x(x, t)
        if b == "mma_kq":
            # a block: 8 >> bits tiles of 16 weight rows, 1 << bits slices of K each; x's stage
            # buffers in dynamic shared memory. Above MMA_KQ_ROWS, one launch per 32 rows of x.
            tiles = (n + 15) // 16
            for r0 in range(0, m, MMA_KQ_ROWS):
                r1 = min(m, r0 + MMA_KQ_ROWS)
                nt, bits = mma_kq_config(r1 - r0, n, k, w.qtype)
                blocks = -(-tiles // (MMA_KQ_WARPS >> bits))
                _mma_kq_kernel(t, nt)((blocks,), (32 * MMA_KQ_WARPS,),
                                      (out[r0:r1], xq[r0:r1], xd[r0:r1], xs[r0:r1], w.data, np.int32(r1 - r0),
                                       np.int32(n), np.int32(k), row_bytes, np.int32(bits)),
                                      shared_mem=2 * MMA_KQ_STAGE_BYTES[w.qtype] * nt * (1 << bits))
            return out
        if b == "gemv_kq":
            rows, ws = kq_config(m, n, k, w.qtype)
            per_block = rows * KQ_WARPS // ws
            _kq_kernel(block_trait(w), m, rows, ws, kq_occupancy(w.qtype, m, n, k, rows))(
                ((n + per_block - 1) // per_block,), (32 * KQ_WARPS,),
                (out, xq, xd, xs, w.data, np.int32(n), np.int32(k), row_bytes))
            return out
        rows = staged_rows(int(row_bytes)) if w.qtype in STAGED_TYPES and m <= STAGED_MAX_M else 0
        if rows:
            per_block = rows * STAGED_WARPS
            _staged_kernel(t, m, rows)(((n + per_block - 1) // per_block,), (32 * STAGED_WARPS,),
                                       (out, xq, xd, xs, w.data, np.int32(n), np.int32(k), row_bytes),
                                       shared_mem=staged_smem(rows, int(row_bytes)))
            return out
        _kernel(t, f"gemv_dp4a_kernel<gguf::{t}, {m}>")(
            ((n + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK,), (32, ROWS_PER_BLOCK),
            (out, xq, xd, xs, w.data, np.int32(n), np.int32(k), row_bytes))
        return out
    if b == "gemv":
        _kernel(t, f"gemv_kernel<gguf::{t}, {m}>")(
            ((n + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK,), (32, ROWS_PER_BLOCK),
            (out, x, w.data, np.int32(n), np.int32(k), row_bytes))
        return out
    if b == "mma_wg":
        if not has_arch_specific():
            raise fail("quant_matmul", "force_bucket", f"a bucket this device runs ({b} needs sm_90)", b)
        mma_wg(out, x, w)
        return out
    if b == "mma_st":
        xst = codes.st if codes is not None else None
        if xst is not None:
            check(xst, "quant_matmul", "x.st", dtypes=(np.uint8,), shape=(staged_bytes(m, k),), like=x)
        if m <= mma_st_launch_rows(_table_tma(w)):
            mma_st(out, x, w, xst=xst)
            return out
        for r0 in range(0, m, MMA_ST_ROWS):         # wider: a launch (and its own stage) a 32 rows
            mma_st(out[r0:r0 + MMA_ST_ROWS], x[r0:r0 + MMA_ST_ROWS], w)
        return out
    if b == "mma_dq":
        check_aligned16(x, w, "mma_dq")
        nt, ks = mma_dq_config(m, n, k)
        _mma_dq_kernel(nt, ks)((-(-n // MMA_DQ_BLOCK_ROWS), ks), (256,),
                               (out, x, w.data, np.int32(m), np.int32(n), np.int32(k), row_bytes),
                               shared_mem=MMA_DQ_STAGE * nt)
        return out
    x16 = cupy.empty((m, k), dtype=cupy.uint16)
    n8 = m * k // 8
    _kernel(t, "to_bf16_kernel")(((n8 + 255) // 256,), (256,), (x16, x, np.int64(n8)))
    if b == "mma":
        bm = next((tile for tile in MMA_TILES if m <= tile), MMA_TILES[-1])
        splits = mma_splits(m, n, k, bm)
        steps = -(-(-(-k // MMA_STEP)) // splits)
        dst = out if splits == 1 else cupy.empty((splits, m, n), dtype=cupy.float32)
        _mma_kernel(t, f"mma_kernel<gguf::{t}, {bm}>")(
            ((n + 63) // 64, (m + bm - 1) // bm, splits), (128,),
            (dst, x16, w.data, np.int32(m), np.int32(n), np.int32(k), row_bytes, np.int32(steps)))
        if splits > 1:
            count = m * n
            _mma_kernel(t, "reduce_splits_kernel")(((count + 255) // 256,), (256,),
                                                   (out, dst, np.int64(count), np.int32(splits)))
        return out
    gemm_bf16_nt(out, x16, dequantize(w, bf16=True))
    return out


# (type A, type B) of the matrix pairs one gemv_kq_pair_kernel launch serves (gemv_kq.cu); the rows
# and warps each part takes: kq_pair_config
KQ_PAIRS = frozenset({(QType.Q4_K, QType.Q6_K), (QType.Q6_K, QType.Q4_K)})
# type -> rows per warp of its part inside a pair launch of more than KQ_OCC_WEIGHTS weights (kq_rows's
# otherwise; each part keeps the warps a row set its own launch would have, so its sums, and bits,
# are the same). One kernel holds both parts' code and so takes the larger register count for both:
# Q6_K at 4 rows needs 128 (four blocks an SM) where Q4_K at 2 rows needs 55 and Q6_K at 1 row 63
# (nvcc -Xptxas -v). Timed in the models' own steps (bench/ab_gemv_kq_model.py, GPU step µs,
# alternated, bench/results/ab_gemv_kq_pair_df5463c.json): synthetic Qwen3-8B (q|k 5120x4096 beside a
# Q6_K v on 18 layers) 2121.0-2142.9 with the pair at 4 Q6_K rows, 2105.7-2122.5 at 2, 2098.0-2102.1 at
# 1, 2113.9-2122.4 as two launches; Qwen3-0.6B (a 4M-weight pair) 612.1-615.5 at 4, 617.0-619.0 at 2
# and 1, 628.2-630.1 as two launches. So 1 row where the pair is 8B's size and 4 below.
KQ_PAIR_ROWS: dict[QType, int] = {QType.Q6_K: 1}


def kq_pair_config(qa: QType, qb: QType, n_a: int, n_b: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows per warp, warps per row set) of each part of a pair launch at M = 1: the warps its own
    launch would take, the rows KQ_PAIR_ROWS gives its type where the pair is large."""
    big = (n_a + n_b) * k > KQ_OCC_WEIGHTS

    def part(qtype: QType, n: int) -> tuple[int, int]:
        rows, ws = kq_config(1, n, k, qtype)
        return (KQ_PAIR_ROWS.get(qtype, rows) if big else rows), ws

    return part(qa, n_a), part(qb, n_b)


def _kq_pair_kernel(a: QuantTensor, b: QuantTensor, n_a: int, n_b: int, k: int):
    """The pair kernel's instance and the blocks of A and of B, at M = 1."""
    (ra, wsa), (rb, wsb) = kq_pair_config(a.qtype, b.qtype, n_a, n_b, k)
    ta, tb = block_trait(a), block_trait(b)
    name = f"gemv_kq_pair_kernel<gguf::{ta}, {ra}, {wsa}, gguf::{tb}, {rb}, {wsb}>"
    exprs = tuple(f"gemv_kq_pair_kernel<gguf::{ta}, {ra}, {i}, gguf::{tb}, {rb}, {j}>"
                  for i in KQ_SPLITS for j in KQ_SPLITS)
    kern = get_kernel("gemv_kq", name, KQ_DEFINES, name_expressions=exprs)
    return kern, -(-n_a // (ra * KQ_WARPS // wsa)), -(-n_b // (rb * KQ_WARPS // wsb))


def quant_matmul_rows(x, parts, *, out=None):
    """x · [W_0; W_1; ...]ᵀ for matrices that read the same x: (M, sum of their N), part i's columns
    after those of the parts before it. On the GPU a single row of x with its int8 codes (Q8Rows)
    and two parts that gemv_kq serves in a KQ_PAIRS pair of types run one launch
    (gemv_kq_pair_kernel, the same bits as a launch each); everything else a quant_matmul a part."""
    n = sum(p.shape[0] for p in parts)
    plain_x = plain(x)
    m = plain_x.shape[0]
    if is_host(plain_x):
        return host_result(np.concatenate([quant_matmul(plain_x, p) for p in parts], axis=-1), out)
    import cupy

    if m > 1:                                       # a launch a part, joined
        y = cupy.concatenate([quant_matmul(x, p) for p in parts], axis=-1)
        if out is None:
            return y
        check_out(out, "quant_matmul_rows", (m, n), like=plain_x)
        out[...] = y
        return out
    if out is None:
        out = cupy.empty((m, n), dtype=cupy.float32)
    check_out(out, "quant_matmul_rows", (m, n), like=plain_x)
    a, b = (list(parts) + [None])[:2]
    graph_safe = _GRAPH_SAFE.get()
    if (m == 1 and len(parts) == 2 and isinstance(x, Q8Rows) and (a.qtype, b.qtype) in KQ_PAIRS
            and a.shape[1] == b.shape[1] and bucket(1, a.qtype, graph_safe) == "gemv_kq"
            and bucket(1, b.qtype, graph_safe) == "gemv_kq" and a.on_device and b.on_device):
        k = a.shape[1]
        check(plain_x, "quant_matmul_rows", "x", dtypes=(F32,), shape=(1, k))
        check_codes(x, "quant_matmul_rows", 1, k, plain_x)
        n_a, n_b = a.shape[0], b.shape[0]
        kern, blocks_a, blocks_b = _kq_pair_kernel(a, b, n_a, n_b, k)
        kern((blocks_a + blocks_b,), (32 * KQ_WARPS,),
             (out, x.q, x.d, x.s, a.data, np.int32(n_a), np.int64(a.data.nbytes // n_a), np.int32(blocks_a),
              b.data, np.int32(n_b), np.int64(b.data.nbytes // n_b), np.int32(k)))
        return out
    at = 0                                          # a column slice of one row is contiguous
    for p in parts:
        quant_matmul(x, p, out=out[:, at:at + p.shape[0]])
        at += p.shape[0]
    return out


# Types dequantize decodes eight lanes a super-block (quant_matmul.cu dequant_lanes_kernel: gemv_kq's
# loads and decode), where dequant_kernel's thread reads a 32-value sub-block a byte at a time; empty:
# dequant_kernel for every type, for the A/B (bench/probe_dequant.py)
DEQUANT_LANES_TYPES = frozenset({QType.Q6_K})


def dequantize(w: QuantTensor, *, bf16: bool = False, out=None):
    """(N, K) values of a device QuantTensor, decoded by the same block traits: float32, or
    bfloat16 bits (uint16, round to nearest even) when bf16."""
    import cupy

    if not w.on_device or w.qtype not in TRAITS:
        raise fail("dequantize", "w", "a device QuantTensor of a type with a kernel", f"{w.qtype.name} "
                   f"{'on the device' if w.on_device else 'on the host'}")
    n, k = w.shape
    dtype = np.uint16 if bf16 else np.float32
    if out is None:
        out = cupy.empty((n, k), dtype=dtype)
    check_out(out, "dequantize", (n, k), dtype=dtype)
    if not aligned(out):                       # both kernels store 16-byte runs
        raise fail("dequantize", "out", "16-byte aligned", f"an array at {out.data.ptr % 16} bytes past a 16-byte boundary")
    t = block_trait(w)
    args = (out, w.data, np.int32(n), np.int32(k), np.int64(w.data.nbytes // n))
    if w.qtype in DEQUANT_LANES_TYPES:
        exprs = tuple(f"dequant_lanes_kernel<gguf::{lt}, {o}>" for lt in ("Q6_K", "Q6_KP")
                      for o in ("float", "unsigned short"))
        kern = get_kernel("quant_matmul", exprs[2 * in_pairs(w) + bf16], name_expressions=exprs)
        kern((-(-n * (k // 256) * 8 // 256),), (256,), args)
        return out
    exprs = (f"dequant_kernel<gguf::{t}, float>", f"dequant_kernel<gguf::{t}, unsigned short>")
    kern = (get_kernel("quant_matmul", exprs[bf16], name_expressions=exprs) if in_pairs(w)
            else _kernel(t, exprs[bf16]))
    kern(((n * (k // 32) + 255) // 256,), (256,), args)
    return out
