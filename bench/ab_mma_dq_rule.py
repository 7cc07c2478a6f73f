"""mma_dq's K-split rule (ops/matmul.py: mma_dq_config) against neighbours of it in a model's own
decode step of several sequences at once (batch 9..16 runs the matmuls at M = batch, Q4_K on
mma_dq; glimmer_cupy/benchmarks/model_ab.py).

Arms:
  rule          the library's rule
  one wave      splits double while the launch stays within one wave of two blocks an SM (faster
                alone on 24576x4096, bench/ab_mma_dq_splits.py; slower here at 887ae15)
  short blocks  the rule with at most 2 super-blocks a block instead of 4

    PYTHONPATH=$PWD python3 bench/ab_mma_dq_rule.py --synthetic qwen3-8b [--batch 16] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as matmul  # noqa: E402
from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

WAVE = 2 * 132                      # blocks of one wave at two an SM on an H200


def one_wave(m: int, n: int, k: int) -> tuple[int, int]:
    groups, nsb, ks = -(-n // matmul.MMA_DQ_BLOCK_ROWS), k // 256, 1
    while ks < 8 and 2 * ks <= nsb and groups * 2 * ks <= WAVE:
        ks *= 2
    return -(-m // 8), ks


ARMS = {
    "rule": {},
    "one wave": {(matmul, "mma_dq_config"): one_wave},
    "short blocks": {(matmul, "MMA_DQ_SB_PER_BLOCK"): 2},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS, batch=16, prompt=128, gen=64))
