"""gemv_kq's launch choices at M = 1 (ops/matmul.py), tuned alone, against neighbours of them in a
model's own one-token decode step (glimmer_cupy/benchmarks/model_ab.py).

Arms:
  rule          the library's choices
  ws up         twice the warps a row set where the rule allows it (Qwen3-8B: gate/up and the head 1 -> 2)
  ws down       half the warps a row set where the rule has more than one (q/k, o, down: 4 -> 2)
  occ off       no launch-bound kernel (KQ_OCCUPANCY empty: Q4_K at M = 1 on the plain kernel)
  occ layers    the launch-bound kernel on every matrix of at most 256M weights (the rule before
                2349045: every layer of Qwen3-8B, no head)
  q6k rows 2    Q6_K at 2 rows a warp at M = 1 (KQ_M1_ROWS empty), as Q4_K
  q4k rows 4    Q4_K at 4 rows a warp at M = 1, as Q6_K
  q4k rows 1    Q4_K at 1 row a warp at M = 1 (46 registers: ten blocks an SM instead of nine)
  q6k ws 4      Q6_K matrices at M = 1 without the rule's cap of two warps a row set (KQ_M1_MAX_WS
                empty: 8B's down projection in 1024 blocks, two waves at four an SM, instead of 512)
  no pair       q|k and a v of another type as two launches (KQ_PAIRS empty), not one gemv_kq_pair_kernel
  pair q6k rows 4 / 2 / 1   a large pair launch (KQ_PAIR_ROWS, above KQ_OCC_WEIGHTS) with its Q6_K
                part at 4 / 2 / 1 rows a warp: the kernel needs 128 / 72 / 63 registers (nvcc -Xptxas
                -v), so at 4 its Q4_K blocks are held to four an SM (the rule before df5463c: 4)
  l2 none       gemv_kq's weight loads without the rule's prefetch-size hint .L2::256B (KQ_DEFINES
                empty; GEMV_WEIGHTS_L2_256B, kq_lanes.cuh)
  q6k pairs / gguf   Q6_K matrices uploaded in pair order (runtime/cuda_executor.py Q6K_PAIRS), which
                every Q6_K kernel reads with aligned loads, or in GGUF order

    PYTHONPATH=$PWD python3 bench/ab_gemv_kq_model.py --synthetic qwen3-8b [--arms "rule,ws up"] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as matmul  # noqa: E402
import glimmer_cupy.runtime.cuda_executor as cuda_executor  # noqa: E402
from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402
from glimmer_cupy.weights.quant_tensor import QType  # noqa: E402

RULE = matmul.kq_config


def ws_scaled(factor: float):
    def config(m: int, n: int, k: int, qtype=None) -> tuple[int, int]:
        rows, ws = RULE(m, n, k, qtype)
        if m == 1:
            ws = min(max(matmul.KQ_SPLITS), max(1, int(ws * factor)))
        return rows, ws
    return config


ARMS = {
    "rule": {},
    "ws up": {(matmul, "kq_config"): ws_scaled(2)},
    "ws down": {(matmul, "kq_config"): ws_scaled(0.5)},
    "occ off": {(matmul, "KQ_OCCUPANCY"): {}},
    "occ layers": {(matmul, "KQ_OCC_WEIGHTS"): 1 << 28},
    "q6k rows 2": {(matmul, "KQ_M1_ROWS"): {}},
    "q4k rows 4": {(matmul, "KQ_M1_ROWS"): {QType.Q6_K: 4, QType.Q4_K: 4}},
    "q4k rows 1": {(matmul, "KQ_M1_ROWS"): {QType.Q6_K: 4, QType.Q4_K: 1}},
    "q6k ws 4": {(matmul, "KQ_M1_MAX_WS"): {}},
    "no pair": {(matmul, "KQ_PAIRS"): frozenset()},
    "l2 none": {(matmul, "KQ_DEFINES"): {}},
    **{f"pair q6k rows {r}": {(matmul, "KQ_PAIR_ROWS"): {QType.Q6_K: r}} for r in (4, 2, 1)},
    "q6k pairs": {(cuda_executor, "Q6K_PAIRS"): True},
    "q6k gguf": {(cuda_executor, "Q6K_PAIRS"): False},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS))
