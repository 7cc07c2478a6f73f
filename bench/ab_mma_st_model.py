"""mma_st in a model's own decode step of several sequences at once (batch 9..16 runs the matmuls at
M = batch: Q4_K on mma_dq and Q6_K on mma_kq in the table; glimmer_cupy/benchmarks/model_ab.py).

Arms:
  table         the library's table (mma_st at Q4_K 4..32 and Q6_K 8..32 rows now)
  st q4k        Q4_K at 4..16 rows on mma_st, Q6_K on mma_kq
  st both       Q4_K 4..16 and Q6_K 8..16 on mma_st
  before        the table before mma_st: Q4_K mma_kq 4..8 and mma_dq 9..16, Q6_K mma_kq
  tma           the table with its Q4_K mma_st rows on mma_st_tma_kernel at 64 rows a block and one
                warp a 16 rows (W by tensor-map boxes, a barrier per chunk of two super-blocks)
  tma rule      mma_st_tma_kernel at mma_st_tma_shape's rule (32-row blocks where 64 leave SMs idle)
  bulk          the Q4_K rows on mma_st_kernel (one copy a row, one barrier)
  tma q6k       the Q6_K rows on the tensor-map kernel too
  bulk q6k      the Q6_K rows on mma_st_kernel (the table before its ring)
  wide before   where 64-row blocks outnumber the SMs, (4, 2) with every chunk a stage (the rule
                before MMA_ST_TMA_MANY's short rings)
  old rule      mma_st_tma_shape as before its middle regime (6144 rows: every chunk a stage)
  head many     the LM head at up to 16 rows on MMA_ST_TMA_MANY's shapes, on any device
  head own      the LM head at up to 16 rows on MMA_ST_TMA_HEAD's shapes, on any device
  wide 4x1      33..64 rows of Q6_K on (4, 1, 2) blocks as Q4_K's, not MMA_ST_TMA_WIDE_PAIRED's
  parts of 32   33..64 rows of x as tensor-map launches of 32 rows (the table before its wide launch)
  rule by nt    the shapes and rings of mma_st_tma_shape by x's n-tiles (the table's); "rule at 16" is the
                rule before it, the shapes that M = 16 measured taken at every M
  tma split     the tensor-map kernel's K split as before its ring (the fewest splits whose chunks all
                fit: 4096x12288 in two), for the A/B of the ring
  table 32      the table with mma_st up to 32 rows (to 64 now, in launches of 32), bulk or (tma 32) tensor-map
  tma 32
  tma wk2       tma with two warps to each 16 rows of W (MMA_ST_WK = 2)
  tma 2x2       tma with blocks of 32 rows of W (MMA_ST_RG = 2), two warps (2x4: four) to each 16
  tma 2x4
  no images     the norms make no mma_st images (each mma_st call stages x in a launch of its own)
  tma 2x4 no images
  tma 32 images tma 32 with the norms' and activations' images up to 32 rows
  q6k st 4      the Q6_K rows on mma_st from 4 rows (as Q4_K's), not from 8
  head st       the LM head alone on mma_st (a Q6_K head at one row: 135.9 µs of the 8B step,
                88% of copy, in the thirty-third session's stamps); run it with --batch 1 too

    PYTHONPATH=$PWD python3 bench/ab_mma_st_model.py --synthetic qwen3-8b [--batch 16] [--out FILE]
    PYTHONPATH=$PWD python3 bench/ab_mma_st_model.py --synthetic qwen3-8b --batch 1 --arms "table,head st"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as matmul  # noqa: E402
import glimmer_cupy.ops.norm as norm  # noqa: E402
import glimmer_cupy.ops.q8 as q8  # noqa: E402
from glimmer_cupy import ops  # noqa: E402
from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402
from glimmer_cupy.model.linear import Linear  # noqa: E402
from glimmer_cupy.ops.q8 import plain  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

_linear_call = Linear.__call__


def head_on_mma_st(self, x):
    """Linear.__call__, with the LM head (GGUF tensor "output.weight") of a type mma_st serves on mma_st."""
    p = self.parts[0]
    if (p.name.startswith("output") and len(self.parts) == 1 and self.bias is None
            and p.qtype in matmul.MMA_ST_TYPES and plain(x).shape[0] <= matmul.MMA_ST_ROWS):
        return ops.quant_matmul(plain(x), p, force_bucket="mma_st")
    return _linear_call(self, x)


_config = matmul.mma_st_config


def split_config(m, n, k, qtype=QType.Q4_K, tma=False, rg=4, wk=1):
    """mma_st_config as before the tensor-map kernel's ring: K split until every chunk has a stage."""
    nt, ks = _config(m, n, k, qtype, tma, rg, wk)
    while (tma and ks < matmul.MMA_ST_MAX_SPLITS
           and matmul.mma_st_stages(nt, k, ks, qtype, rg, wk) < matmul.mma_st_chunks(k, ks)):
        ks *= 2
    return nt, ks


_shape = matmul.mma_st_tma_shape


def old_rule(n, rg=None, wk=None, qtype=QType.Q4_K, nt=2):
    """mma_st_tma_shape before its middle regime: (2, 4) with every chunk a stage below 64 SMs' rows."""
    if -(-n // matmul.MMA_ST_BLOCK_ROWS) < matmul.sm_count():
        return rg or 2, wk or 4, None
    return rule_at_16(n, rg, wk, qtype)


def rule_at_16(n, rg=None, wk=None, qtype=QType.Q4_K, nt=2):
    """mma_st_tma_shape before its rule by n-tiles: the shapes M = 16 (2 n-tiles) measured, at every M."""
    return _shape(n, rg, wk, qtype, 2)


def with_rows(kind: str, rows: tuple) -> dict:
    """The table with kind's rows replaced."""
    return {**matmul.BUCKETS, kind: rows}


Q4K = ((3, "gemv_kq"), (16, "mma_st"), (32, "mma_kq"), (None, "mma_wg"))
Q6K = ((7, "gemv_kq"), (16, "mma_st"), (40, "mma_kq"), (None, "dequant_cublas"))
Q4K_32 = ((3, "gemv_kq"), (32, "mma_st"), (None, "mma_wg"))
Q6K_4 = ((3, "gemv_kq"), (16, "mma_st"), (40, "mma_kq"), (None, "dequant_cublas"))
Q6K_32 = ((7, "gemv_kq"), (32, "mma_st"), (40, "mma_kq"), (None, "dequant_cublas"))
Q4K_BEFORE = ((3, "gemv_kq"), (8, "mma_kq"), (16, "mma_dq"), (32, "mma_kq"), (None, "mma_wg"))
Q6K_BEFORE = ((7, "gemv_kq"), (40, "mma_kq"), (None, "dequant_cublas"))
ARMS = {
    "table": {},
    "st q4k": {(matmul, "BUCKETS"): {**with_rows("q4k", Q4K), "q6k": Q6K_BEFORE}},
    "st both": {(matmul, "BUCKETS"): {**with_rows("q4k", Q4K), "q6k": Q6K}},
    "before": {(matmul, "BUCKETS"): {**with_rows("q4k", Q4K_BEFORE), "q6k": Q6K_BEFORE}},
    "tma": {(matmul, "MMA_ST_TMA"): True, (matmul, "MMA_ST_RG"): 4, (matmul, "MMA_ST_WK"): 1},
    "tma rule": {(matmul, "MMA_ST_TMA"): True},
    "bulk": {(matmul, "MMA_ST_TMA"): False},
    "tma q6k": {(matmul, "MMA_ST_TMA_TYPES"): frozenset({QType.Q4_K, QType.Q6_K})},
    "bulk q6k": {(matmul, "MMA_ST_TMA_TYPES"): frozenset({QType.Q4_K})},
    "wide before": {(matmul, "MMA_ST_TMA_MANY"): {QType.Q4_K: (4, 2, None), QType.Q6_K: (4, 2, None)}},
    "old rule": {(matmul, "mma_st_tma_shape"): old_rule},
    "rule by nt": {},
    "head many": {(matmul, "MMA_ST_TMA_HEAD_WAVES"): 1 << 30},
    "head own": {(matmul, "MMA_ST_TMA_HEAD_BW"): 0.0},
    "wide 4x1": {(matmul, "MMA_ST_TMA_WIDE_PAIRED"): matmul.MMA_ST_TMA_WIDE},
    "parts of 32": {(matmul, "MMA_ST_TMA_ROWS"): matmul.MMA_ST_ROWS},
    "rule at 16": {(matmul, "mma_st_tma_shape"): rule_at_16},
    "tma split": {(matmul, "mma_st_config"): split_config},
    "tma wk2": {(matmul, "MMA_ST_TMA"): True, (matmul, "MMA_ST_RG"): 4, (matmul, "MMA_ST_WK"): 2},
    "tma 2x2": {(matmul, "MMA_ST_TMA"): True, (matmul, "MMA_ST_RG"): 2, (matmul, "MMA_ST_WK"): 2},
    "tma 2x4": {(matmul, "MMA_ST_TMA"): True, (matmul, "MMA_ST_RG"): 2, (matmul, "MMA_ST_WK"): 4},
    "no images": {(norm, "wants_staged"): lambda *a: False},
    "tma 2x4 no images": {(matmul, "MMA_ST_TMA"): True, (matmul, "MMA_ST_RG"): 2, (matmul, "MMA_ST_WK"): 4,
                          (norm, "wants_staged"): lambda *a: False},
    "table 32": {(matmul, "BUCKETS"): {"q4k": Q4K_32, "q6k": Q6K_32}},
    "tma 32": {(matmul, "BUCKETS"): {"q4k": Q4K_32, "q6k": Q6K_32}, (matmul, "MMA_ST_TMA"): True},
    "tma 32 images": {(matmul, "BUCKETS"): {"q4k": Q4K_32, "q6k": Q6K_32}, (q8, "ST_ROWS"): range(4, 33)},
    "q6k st 4": {(matmul, "BUCKETS"): with_rows("q6k", Q6K_4)},
    "head st": {(Linear, "__call__"): head_on_mma_st},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS, batch=16, prompt=128, gen=64))
