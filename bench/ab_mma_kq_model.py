"""mma_kq's K slices (ops/matmul.py: mma_kq_config, slices double while the launch has fewer warps
than MMA_KQ_TARGET_WARPS), tuned alone, against neighbours of it in a model's own decode step of
several sequences at once (batch 4..8 runs Q4_K at M = batch on mma_kq, Q6_K from 8;
glimmer_cupy/benchmarks/model_ab.py).

Arms:
  rule          the library's target (about two blocks an SM of an H200)
  target x2     slices double up to twice as many warps
  target /2     up to half as many

    PYTHONPATH=$PWD python3 bench/ab_mma_kq_model.py --synthetic qwen3-8b [--batch 8] [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import glimmer_cupy.ops.matmul as matmul  # noqa: E402
from glimmer_cupy.benchmarks.model_ab import main  # noqa: E402

ARMS = {
    "rule": {},
    "target x2": {(matmul, "MMA_KQ_TARGET_WARPS"): 2 * matmul.MMA_KQ_TARGET_WARPS},
    "target /2": {(matmul, "MMA_KQ_TARGET_WARPS"): matmul.MMA_KQ_TARGET_WARPS // 2},
}

if __name__ == "__main__":
    sys.exit(main(__doc__, ARMS, batch=8, prompt=128, gen=64))
